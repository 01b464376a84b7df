"""Importance-sampling maths: the 1 + CV² law, the oracle, and a Monte-Carlo check of E‖ĝ‖²."""
import pytest
import torch

from sazo_lite import variance


def test_uniform_over_oracle_variance_is_one_plus_cv_squared():
    norms = torch.distributions.LogNormal(0.0, 1.2).sample((500,)).double()
    uniform = torch.full_like(norms, 1 / 500)
    ratio = variance.sampling_variance(norms, uniform) / variance.sampling_variance(norms, variance.oracle_probs(norms))
    cv2 = float(norms.var(unbiased=False) / norms.mean() ** 2)
    assert ratio == pytest.approx(1 + cv2, rel=1e-10)
    assert variance.uniform_gain(norms) == pytest.approx(ratio, rel=1e-10)
    assert ratio > 2  # heterogeneous norms: a real gain


def test_oracle_is_the_minimum():
    g = torch.Generator().manual_seed(0)
    norms = torch.rand(30, generator=g, dtype=torch.float64) + 0.1
    best = variance.sampling_variance(norms, variance.oracle_probs(norms))
    for _ in range(50):
        p = torch.rand(30, generator=g, dtype=torch.float64) + 0.01
        assert variance.sampling_variance(norms, p / p.sum()) >= best * (1 - 1e-12)
    assert variance.variance_ratio(norms, variance.oracle_probs(norms)) == pytest.approx(1.0)


def test_second_moment_formula_matches_monte_carlo():
    g = torch.Generator().manual_seed(1)
    n, d, batch = 8, 4, 3
    a = torch.randn(n, d, generator=g, dtype=torch.float64) * torch.linspace(0.2, 2, n, dtype=torch.float64)[:, None]
    p = variance.mix_with_uniform(variance.oracle_probs(a.norm(dim=1)), 0.3)
    trials = 200000
    idx = torch.multinomial(p, trials * batch, replacement=True, generator=g).reshape(trials, batch)
    w = 1 / (n * p[idx])
    z = torch.randn(trials, d, generator=g, dtype=torch.float64)
    proj = ((a[idx] @ z.unsqueeze(2)).squeeze(2) * w).mean(1)  # g = mean_k w_k a_kᵀz
    second = float((proj ** 2 * (z ** 2).sum(1)).mean())         # ‖g z‖²
    formula = variance.zo_second_moment(a.norm(dim=1), p, float(a.mean(0).norm()), d, batch)
    assert second == pytest.approx(formula, rel=0.03)


def test_tv_distance_and_spearman():
    p = torch.tensor([0.5, 0.5, 0.0])
    q = torch.tensor([0.0, 0.5, 0.5])
    assert variance.tv_distance(p, q) == pytest.approx(0.5)
    assert variance.tv_distance(p, p) == 0.0
    x = torch.tensor([1.0, 5.0, 2.0, 8.0])
    assert variance.spearman(x, x ** 3) == pytest.approx(1.0)
    assert variance.spearman(x, -x) == pytest.approx(-1.0)
    assert variance.spearman(torch.tensor([1.0, 1.0, 2.0]), torch.tensor([3.0, 3.0, 4.0])) == pytest.approx(1.0)

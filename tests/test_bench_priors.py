"""The unseen-prior diagnostics of benchmarks.queries: informed samplers and the optimistic SAZO."""
import numpy as np
import pytest
import torch

from benchmarks.queries import METHODS, InformedSampler, OptimisticPriorSAZO
from sazo_lite import SAZOSampler
from sazo_lite.course.problems import LeastSquares


def _informed(prior, norms):
    sampler = InformedSampler(len(norms), lambda: torch.as_tensor(norms), stale=False, prior=prior, seed=0)
    sampler.update(torch.tensor([0, 1, 2]), torch.zeros(3))     # three examples seen
    return sampler.probs.numpy()


def test_the_informed_prior_gives_unseen_examples_the_rms_or_the_quantile_of_the_seen_norms():
    norms = np.array([1.0, 2.0, 6.0, 5.0, 0.5])
    for prior, unseen in (("rms", np.sqrt(np.mean(np.array([1.0, 2.0, 6.0]) ** 2))), (1.0, 6.0), (0.5, 2.0)):
        p = _informed(prior, norms)
        scores = np.array([1.0, 2.0, 6.0, unseen, unseen])
        expected = 0.9 * scores / scores.sum() + 0.1 / 5
        assert np.allclose(p, expected, rtol=1e-12), prior
    with pytest.raises(ValueError, match="Invalid prior"):
        InformedSampler(5, lambda: torch.ones(5), stale=False, prior=0.0)


def test_the_optimistic_sazo_draws_the_unseen_at_the_largest_seen_score_and_stays_unbiased():
    n = 40
    sampler, plain = OptimisticPriorSAZO(n, quantile=1.0, seed=3), SAZOSampler(n, seed=3)
    idx = torch.arange(10)
    diffs = torch.linspace(0.1, 3.0, 10, dtype=torch.float64)
    for s in (sampler, plain):
        s.update(idx, diffs)
    # what is learnt is SAZO's (the blend keeps the RMS prior); only the unseen's sampling score differs
    assert np.array_equal(sampler.estimates.numpy(), plain.estimates.numpy())
    p = sampler.probs.numpy()
    seen_scores = plain.scores().numpy()[:10]
    scores = np.concatenate([seen_scores, np.full(n - 10, seen_scores.max())])
    assert np.allclose(p, 0.9 * scores / scores.sum() + 0.1 / n, rtol=1e-6)
    assert p[10:].min() > plain.probs.numpy()[10:].max()        # optimism: the unseen are favoured
    # weights are 1/(N·p) of the p sampled, so E[w·f] = F: check by the empirical frequencies
    draws, weights = sampler.sample(200_000)
    freq = np.bincount(draws.numpy(), minlength=n) / len(draws)
    assert np.abs(freq - p).max() < 0.003
    assert np.allclose(weights.numpy(), 1.0 / (n * p[draws.numpy()]))


def test_every_prior_variant_is_a_raceable_method():
    problem = LeastSquares(16, 3, heterogeneity=1.5, seed=0)
    theta = problem.initial_theta(torch.float64)
    for name in ("informed-max", "informed-q90", "sazo-optimistic-max", "sazo-optimistic-q90",
                 "oracle-smoothed-1N", "oracle-smoothed-10N", "noiseless-decay-0", "noiseless-decay-0.5"):
        sampler = METHODS[name](problem, theta, 0)
        idx, w = sampler.sample(4)
        sampler.update(idx, torch.randn(4, dtype=torch.float64))
        assert abs(float(sampler.probs.sum()) - 1.0) < 1e-9, name


def test_the_smoothed_oracle_with_a_one_step_horizon_is_the_capped_oracle_and_averages_squared_norms():
    from benchmarks.queries import SmoothedOracle
    from sazo_lite.samplers import OracleSampler

    state = {"norms": torch.tensor([1.0, 2.0, 4.0, 0.5], dtype=torch.float64)}
    norms_fn = lambda: state["norms"]
    one, capped = SmoothedOracle(4, norms_fn, horizon=1), OracleSampler(4, norms_fn, uniform_mix=0.1)
    slow = SmoothedOracle(4, norms_fn, horizon=4)
    assert torch.allclose(one.probs, capped.probs.double())
    first = state["norms"].numpy() ** 2
    slow.probs                                                       # m starts at the first norms
    state["norms"] = torch.tensor([3.0, 1.0, 1.0, 2.0], dtype=torch.float64)
    for s in (one, slow):
        s.update(torch.tensor([0]), torch.zeros(1))
    assert torch.allclose(one.probs, capped.probs.double())          # follows the present at h = 1
    m = 0.75 * first + 0.25 * state["norms"].numpy() ** 2
    expected = 0.9 * np.sqrt(m) / np.sqrt(m).sum() + 0.1 / 4
    assert np.allclose(slow.probs.numpy(), expected, rtol=1e-12)
    with pytest.raises(ValueError, match="Invalid horizon"):
        SmoothedOracle(4, norms_fn, horizon=0.5)

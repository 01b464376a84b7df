"""MeZO engine: the ZO estimate against autograd, passes, restore, determinism, validation."""
import math

import pytest
import torch

import sazo_lite as sz
from sazo_lite import engine


def linear_problem(num_examples=6, dim=5, seed=0):
    """f_i(θ) = a_iᵀθ: ∇f_i = a_i exactly, so ZO estimates have no curvature bias."""
    g = torch.Generator().manual_seed(seed)
    scales = torch.linspace(0.2, 3.0, num_examples, dtype=torch.float64)[:, None]
    return scales * torch.randn(num_examples, dim, generator=g, dtype=torch.float64)


def mean_and_stderr(samples: torch.Tensor):
    return samples.mean(0), samples.std(0) / math.sqrt(len(samples))


@pytest.mark.parametrize("perturbation", ["gaussian", "rademacher"])
def test_importance_weighted_zo_update_is_unbiased(perturbation):
    a = linear_problem()
    true_grad = a.mean(0)
    probs = torch.tensor([0.05, 0.05, 0.1, 0.2, 0.25, 0.35], dtype=torch.float64)
    sampler = sz.OracleSampler(len(a), lambda: probs, seed=1)
    theta = torch.zeros(a.shape[1], dtype=torch.float64)
    lr, trials = 0.5, 6000
    opt = sz.MeZO([theta], lr=lr, eps=1e-3, perturbation=perturbation, seed=3)
    estimates = torch.empty(trials, a.shape[1], dtype=torch.float64)
    for t in range(trials):
        idx, w = sampler.sample(2)
        opt.step(lambda: a[idx] @ theta, weights=w)
        estimates[t] = -theta / lr  # θ started at 0, so the update is −lr·ĝ
        theta.zero_()
    mean, stderr = mean_and_stderr(estimates)
    assert torch.all((mean - true_grad).abs() <= 4.5 * stderr + 1e-9), (mean, true_grad, stderr)
    # The estimate is not trivially centred: its spread is far larger than the bias allowed.
    assert float(estimates.std(0).min()) > 10 * float(stderr.max())


def test_squared_directional_diff_estimates_squared_gradient_norm():
    a = linear_problem()
    theta = torch.zeros(a.shape[1], dtype=torch.float64)
    opt = sz.MeZO([theta], lr=0.0, eps=1e-3, seed=5)
    squares = torch.stack([opt.step(lambda: a @ theta).directional_diffs ** 2 for _ in range(4000)])
    mean, stderr = mean_and_stderr(squares)
    expected = (a ** 2).sum(1)
    assert torch.all((mean - expected).abs() <= 4.5 * stderr), (mean, expected)
    assert torch.allclose(mean, expected, rtol=0.15)


def test_averaged_zo_estimate_matches_autograd_on_a_network():
    torch.manual_seed(0)
    net = torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.Tanh(), torch.nn.Linear(8, 1)).double()
    x, y = torch.randn(16, 4, dtype=torch.float64), torch.randn(16, 1, dtype=torch.float64)
    per_example = lambda: ((net(x) - y) ** 2).squeeze(1)
    per_example().mean().backward()
    exact = torch.cat([p.grad.flatten() for p in net.parameters()])
    before = [p.detach().clone() for p in net.parameters()]
    opt = sz.MeZO(net.parameters(), lr=1.0, eps=1e-4, seed=0)
    total = torch.zeros_like(exact)
    trials = 3000
    for _ in range(trials):
        opt.step(per_example)
        with torch.no_grad():
            total -= torch.cat([(p - b).flatten() for p, b in zip(net.parameters(), before)])
            for p, b in zip(net.parameters(), before):
                p.copy_(b)
    estimate = total / trials
    cosine = torch.nn.functional.cosine_similarity(estimate, exact, dim=0)
    assert cosine > 0.95, cosine
    assert abs(float(estimate.norm() / exact.norm()) - 1) < 0.2


def test_update_matches_plain_out_of_place_reference():
    g = torch.Generator().manual_seed(0)
    params = [torch.randn(7, 3, generator=g, dtype=torch.float64), torch.randn(4, generator=g, dtype=torch.float64)]
    reference = [p.clone() for p in params]
    x = torch.randn(5, 3, generator=g, dtype=torch.float64)
    loss_of = lambda ps: ((x @ ps[0].T).tanh().sum(1) + ps[1].sum()) ** 2
    lr, eps, wd = 0.05, 1e-3, 0.1
    opt = sz.MeZO(params, lr=lr, eps=eps, weight_decay=wd, seed=11)
    weights = torch.rand(5, generator=g, dtype=torch.float64)
    for _ in range(5):
        seed = opt.next_seed()
        out = opt.step(lambda: loss_of(params), weights=weights)
        zs = [engine.draw_direction(p, sz.derive_seed(seed, i), "gaussian", torch.Generator())
              for i, p in enumerate(reference)]
        plus = loss_of([p + eps * z for p, z in zip(reference, zs)])
        minus = loss_of([p - eps * z for p, z in zip(reference, zs)])
        diffs = (plus - minus) / (2 * eps)
        grad = float((weights * diffs).mean())
        assert out.projected_grad == pytest.approx(grad, rel=1e-9)
        assert torch.allclose(out.directional_diffs, diffs, rtol=1e-8, atol=1e-10)
        assert out.loss == pytest.approx(float((weights * (plus + minus) / 2).mean()), rel=1e-12)
        reference = [p - lr * (grad * z + wd * p) for p, z in zip(reference, zs)]
        for p, r in zip(params, reference):
            assert torch.allclose(p, r, rtol=1e-12, atol=1e-12)


def test_two_closure_calls_and_three_passes_per_step():
    from sazo_lite.course.instruments import DirectionCounter

    net = torch.nn.Linear(3, 2)
    opt = sz.MeZO(net.parameters(), lr=0.01)
    counter = DirectionCounter(opt).__enter__()
    calls = []
    x = torch.randn(4, 3)

    def closure():
        calls.append(1)
        return net(x).pow(2).sum(1)

    for _ in range(3):
        opt.step(closure)
    assert len(calls) == 6
    assert counter.calls == 3 * 3 * len(list(net.parameters()))  # 3 steps × 3 passes × tensors
    assert counter.passes == 3 * 3


@pytest.mark.parametrize("dtype,bound", [(torch.float32, 1e-6), (torch.float64, 1e-12)])
@pytest.mark.parametrize("failure", ["raise_first", "raise_second", "nan_first", "inf_second"])
def test_parameters_restored_when_closure_fails(dtype, bound, failure):
    g = torch.Generator().manual_seed(1)
    params = [torch.randn(200, 30, generator=g, dtype=dtype) * s for s in (0.05, 1.0, 50.0)]
    original = [p.clone() for p in params]
    opt = sz.MeZO(params, lr=0.1, eps=1e-2, seed=7)
    calls = []

    def closure():
        calls.append(1)
        bad_call = 1 if failure.endswith("first") else 2
        if len(calls) == bad_call:
            if failure.startswith("raise"):
                raise RuntimeError("model exploded")
            return torch.tensor([1.0, float("nan") if failure.startswith("nan") else float("inf")])
        return torch.ones(2)

    expected = RuntimeError if failure.startswith("raise") else FloatingPointError
    with pytest.raises(expected):
        opt.step(closure)
    for p, o in zip(params, original):
        assert float((p - o).norm() / o.norm()) <= bound
    assert opt.step_count == 0  # a failed step is not counted


def test_bad_weights_shape_is_rejected_and_parameters_restored():
    theta = torch.randn(4, dtype=torch.float64)
    before = theta.clone()
    opt = sz.MeZO([theta], lr=0.1)
    with pytest.raises(ValueError, match="weights"):
        opt.step(lambda: theta.expand(3, 4).sum(1), weights=torch.ones(2))
    with pytest.raises(ValueError, match="weights"):
        opt.step(lambda: theta.sum(), weights=torch.ones(1))
    with pytest.raises(ValueError, match="0-d or 1-D"):
        opt.step(lambda: theta.expand(2, 4))
    assert torch.allclose(theta, before, rtol=0, atol=1e-14)


def run_steps(opt, params, n, x):
    for _ in range(n):
        opt.step(lambda: (x @ params[0]).pow(2) + params[1].sum())


def test_resume_from_state_dict_is_bit_exact():
    g = torch.Generator().manual_seed(0)
    x = torch.randn(6, 5, generator=g)
    init = [torch.randn(5, generator=g), torch.randn(3, generator=g)]
    straight = [p.clone() for p in init]
    run_steps(sz.MeZO(straight, lr=0.01, seed=42), straight, 20, x)

    first = [p.clone() for p in init]
    opt = sz.MeZO(first, lr=0.01, seed=42)
    run_steps(opt, first, 10, x)
    saved_state, saved_params = opt.state_dict(), [p.clone() for p in first]
    resumed = [p.clone() for p in saved_params]
    fresh = sz.MeZO(resumed, lr=0.01, seed=0)  # a different seed: the state must override it
    fresh.load_state_dict(saved_state)
    run_steps(fresh, resumed, 10, x)
    for a, b in zip(straight, resumed):
        assert torch.equal(a, b)
    assert fresh.step_count == 20


def test_directions_ignore_the_global_rng():
    x = torch.randn(6, 5)
    runs = []
    for global_seed in (0, 1):
        torch.manual_seed(global_seed)
        params = [torch.ones(5), torch.ones(3)]
        opt = sz.MeZO(params, lr=0.01, seed=9)
        for _ in range(5):
            torch.randn(100)  # unrelated draws between steps must not matter
            run_steps(opt, params, 1, x)
        runs.append(params)
    assert all(torch.equal(a, b) for a, b in zip(*runs))


def test_rademacher_directions_are_signs_and_seeded():
    like = torch.empty(1000)
    z1 = engine.draw_direction(like, 123, "rademacher", torch.Generator())
    z2 = engine.draw_direction(like, 123, "rademacher", torch.Generator())
    assert torch.equal(z1, z2)
    assert set(z1.unique().tolist()) == {-1.0, 1.0}
    assert abs(float(z1.mean())) < 0.15
    z3 = engine.draw_direction(like, 124, "rademacher", torch.Generator())
    assert not torch.equal(z1, z3)


def test_rademacher_signs_from_bytes_are_balanced_and_uncorrelated():
    """8 signs per random byte: every bit position fair, neighbours (same byte or not) independent."""
    z = engine.rademacher_signs(80_003, torch.float64, "cpu", torch.Generator().manual_seed(0))
    assert z.shape == (80_003,) and set(z.unique().tolist()) == {-1.0, 1.0}
    bound = 5 / math.sqrt(len(z) / 8)  # 5 standard errors of a mean over ~10⁴ signs
    by_position = z[:80_000].view(-1, 8)
    assert float(by_position.mean(0).abs().max()) < bound
    for lag in (1, 7, 8, 9):
        assert abs(float((z[:-lag] * z[lag:]).mean())) < bound / math.sqrt(8)


def test_half_precision_parameters_draw_float32_directions():
    like = torch.empty(10, dtype=torch.bfloat16)
    z = engine.draw_direction(like, 1, "gaussian", torch.Generator())
    assert z.dtype == torch.float32
    p = torch.zeros(10, dtype=torch.bfloat16)
    opt = sz.MeZO([p], lr=0.1, eps=1e-2)
    opt.step(lambda: p.float().sum().reshape(1))
    assert p.dtype == torch.bfloat16


def test_scalar_closure_gives_no_per_example_diffs():
    theta = torch.tensor([1.0, 2.0], dtype=torch.float64)
    out = sz.MeZO([theta], lr=0.0, eps=1e-4).step(lambda: (theta ** 2).sum())
    assert out.directional_diffs.numel() == 0
    assert out.loss == pytest.approx(5.0, rel=1e-6)
    assert math.isfinite(out.projected_grad)


def test_param_groups_use_their_own_lr():
    a, b = torch.zeros(3, dtype=torch.float64), torch.zeros(3, dtype=torch.float64)
    opt = sz.MeZO([{"params": [a], "lr": 0.0}, {"params": [b]}], lr=0.1)
    opt.step(lambda: (a.sum() + b.sum()).reshape(1))
    assert torch.allclose(a, torch.zeros(3, dtype=torch.float64), atol=1e-15)
    assert float(b.abs().sum()) > 0
    with pytest.raises(ValueError, match="eps"):
        opt.add_param_group({"params": [torch.zeros(2)], "eps": 0.5})


@pytest.mark.parametrize("kwargs,name", [
    (dict(lr=-1.0), "lr"), (dict(lr=float("nan")), "lr"), (dict(lr=0.1, eps=0.0), "eps"),
    (dict(lr=0.1, eps=-1e-3), "eps"), (dict(lr=0.1, eps=float("inf")), "eps"),
    (dict(lr=0.1, weight_decay=-0.1), "weight_decay"), (dict(lr=0.1, perturbation="uniform"), "perturbation"),
    (dict(lr=0.1, seed=1.5), "seed"),
])
def test_invalid_hyperparameters_are_rejected(kwargs, name):
    with pytest.raises(ValueError, match=f"Invalid {name}"):
        sz.MeZO([torch.zeros(2)], **kwargs)


def test_invalid_param_group_lr_is_rejected():
    with pytest.raises(ValueError, match="Invalid lr"):
        sz.MeZO([{"params": [torch.zeros(2)], "lr": -0.5}], lr=0.1)


def test_missing_closure_is_rejected():
    with pytest.raises(ValueError, match="closure"):
        sz.MeZO([torch.zeros(2)], lr=0.1).step(None)


def test_derive_seed_is_stable_and_spread():
    assert sz.derive_seed(0, 0) == sz.derive_seed(0, 0)
    seeds = {sz.derive_seed(7, t) for t in range(1000)}
    assert len(seeds) == 1000
    assert all(0 <= s < 2 ** 63 for s in seeds)

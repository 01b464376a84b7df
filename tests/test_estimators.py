"""Maths behind notebooks 01–03 (sazo_lite.estimators) against autograd and closed forms."""
import math

import pytest
import torch

import sazo_lite as sz
from sazo_lite.course import two_point, instruments, mezo_vs_sgd, minibatches
from sazo_lite.course import problems
from sazo_lite import variance

CURVATURES = [1.0, 2.5, 4.0]


def autograd_grad(fn, theta):
    theta = theta.clone().requires_grad_(True)
    (grad,) = torch.autograd.grad(fn(theta), theta)
    return grad


# -- 01 --------------------------------------------------------------------------------------
def test_bowl_grad_matches_autograd():
    theta = torch.tensor([0.7, -1.3, 2.0], dtype=torch.float64)
    fn = lambda x: two_point.bowl_loss(x, CURVATURES, quartic=1.5, offset=3.0)
    torch.testing.assert_close(two_point.bowl_grad(theta, CURVATURES, 1.5), autograd_grad(fn, theta))


def test_averaged_zo_estimate_approaches_autograd_gradient():
    theta = torch.tensor([0.7, -1.3, 0.4], dtype=torch.float64)
    fn = lambda x: two_point.bowl_loss(x, CURVATURES, quartic=0.5)
    true = autograd_grad(fn, theta)
    errors = [float((two_point.zo_gradient(fn, theta, 1e-4, q, seed=1) - true).norm() / true.norm()) for q in (4, 40000)]
    assert errors[1] < 0.05 < errors[0] / 2  # (d+1)/q = 1 at q = 4; 1e-4 at q = 40000


def test_central_difference_is_exact_for_quadratics_and_second_order_otherwise():
    theta = torch.tensor([0.7, -1.3, 0.4], dtype=torch.float64)
    z = two_point.random_directions(5, 3, seed=2)
    quadratic = lambda x: two_point.bowl_loss(x, CURVATURES)
    assert two_point.directional_error(quadratic, two_point.bowl_grad(theta, CURVATURES), theta, z, 0.5) < 1e-12
    quartic = lambda x: two_point.bowl_loss(x, CURVATURES, quartic=1.0)
    grad = two_point.bowl_grad(theta, CURVATURES, 1.0)
    ratio = two_point.directional_error(quartic, grad, theta, z, 0.02) / two_point.directional_error(quartic, grad, theta, z, 0.01)
    assert ratio == pytest.approx(4.0, rel=0.05)  # error ∝ ε²


def test_error_vs_eps_is_u_shaped_and_float64_goes_lower():
    theta = torch.tensor([1.0, -0.8, 0.5], dtype=torch.float64)
    fn = lambda x: two_point.bowl_loss(x, CURVATURES, quartic=1.0)
    grad = two_point.bowl_grad(theta, CURVATURES, 1.0)
    grid = torch.logspace(-9, 0, 19, dtype=torch.float64)
    single, double = (two_point.error_vs_eps(fn, grad, theta, grid, dtype=d) for d in (torch.float32, torch.float64))
    best = int(single.argmin())
    assert 0 < best < len(grid) - 1
    assert single[0] > 100 * single[best] and single[-1] > 100 * single[best]
    assert double.min() < single.min() / 100
    assert grid[int(double.argmin())] < grid[best]


@pytest.mark.parametrize("perturbation", ["gaussian", "rademacher"])
def test_relative_error_monte_carlo_matches_closed_form(perturbation):
    mc = two_point.relative_error_monte_carlo(16, 4, trials=4000, seed=3, perturbation=perturbation)
    assert mc == pytest.approx(two_point.relative_error_theory(16, 4, perturbation), rel=0.1)


def test_invalid_inputs_raise_value_errors():
    with pytest.raises(ValueError, match="eps"):
        two_point.two_point_estimates(lambda x: x.sum(-1), torch.zeros(2), torch.ones(1, 2), 0.0)
    with pytest.raises(ValueError, match="perturbation"):
        two_point.random_directions(2, 2, perturbation="uniform")
    with pytest.raises(ValueError, match="progress"):
        minibatches.path_point(problems.LeastSquares(8, 2), 1.5)
    with pytest.raises(ValueError, match="batch_size"):
        mezo_vs_sgd.race_mezo_sgd(problems.LeastSquares(8, 2), batch_size=0)


# -- 02 --------------------------------------------------------------------------------------
def test_peak_tensor_bytes_counts_live_tensors_only():
    def work():
        a = torch.empty(1000, dtype=torch.float32)   # 4000 bytes
        b = torch.empty(1000, dtype=torch.float64)   # 8000 bytes, alive with a
        del a
        c = torch.empty(500, dtype=torch.float32)    # 2000 bytes, after a is gone
        return b, c

    _, peak = instruments.peak_tensor_bytes(work)
    assert peak == 12000


def test_mezo_step_memory_is_inference_level_and_backprop_is_not():
    torch.manual_seed(0)
    layers = [m for _ in range(4) for m in (torch.nn.Linear(64, 64), torch.nn.ReLU())]
    model = torch.nn.Sequential(*layers, torch.nn.Linear(64, 2))
    inputs, targets = torch.randn(512, 64), torch.randint(0, 2, (512,))
    peaks = instruments.step_memory(model, inputs, targets, torch.nn.functional.cross_entropy)
    assert peaks["MeZO step"] <= peaks["inference"] + peaks["largest tensor"] + 1024
    assert peaks["backprop step"] > 3 * peaks["MeZO step"]  # all activations kept for backward


def two_tensor_setup(seed=0):
    """A weight, a bias and a per-example non-quadratic loss closure over them."""
    g = torch.Generator().manual_seed(seed)
    weight = torch.randn(3, 4, generator=g, dtype=torch.float64)
    bias = torch.randn(3, generator=g, dtype=torch.float64)
    x = torch.randn(5, 4, generator=g, dtype=torch.float64)
    closure = lambda: torch.nn.functional.softplus(x @ weight.T + bias).pow(2).sum(1)  # [5]
    return [weight, bias], closure


def test_reference_step_matches_mezo_and_counts_four_passes_against_three():
    params, closure = two_tensor_setup()
    reference, reference_closure = two_tensor_setup()
    optimizer = sz.MeZO(params, lr=0.05, eps=1e-3, seed=7)
    seed = optimizer.next_seed()
    with instruments.DirectionCounter(optimizer) as fused:
        result = optimizer.step(closure)
    with instruments.DirectionCounter() as textbook:
        g_ref = instruments.mezo_step_reference(reference, reference_closure, eps=1e-3, lr=0.05, seed=seed, noise=textbook)
    assert fused.calls == 3 * len(params) and textbook.calls == 4 * len(params)
    assert fused.passes == 3 and textbook.passes == 4
    assert fused.largest_bytes == 3 * 4 * 8
    assert g_ref == pytest.approx(result.projected_grad, rel=1e-12)
    assert not torch.equal(params[0], two_tensor_setup()[0][0])  # the step did move θ
    for p, r in zip(params, reference):
        torch.testing.assert_close(p, r, rtol=0, atol=1e-12)
    assert instruments.count_passes(optimizer, lambda: optimizer.step(closure)) == 3


def test_direction_counter_wraps_one_optimiser_and_patches_no_module():
    params, closure = two_tensor_setup()
    optimizer = sz.MeZO(params, lr=0.05, eps=1e-3, seed=7)
    other = sz.MeZO(two_tensor_setup()[0], lr=0.05, eps=1e-3, seed=7)
    originals = (sz.engine.draw_direction, sz.directions.draw_direction)
    with instruments.DirectionCounter(optimizer) as counter:
        assert optimizer.noise is counter
        assert (sz.engine.draw_direction, sz.directions.draw_direction) == originals
        other.step(two_tensor_setup()[1])  # another optimiser is not counted
        assert counter.calls == 0
    assert optimizer.noise is None and counter.calls == 0


def test_folded_steps_make_two_passes_and_one_flush():
    params, closure = two_tensor_setup()
    optimizer = sz.MeZO(params, lr=0.05, eps=1e-3, seed=7, fold_updates=True)
    assert instruments.count_passes(optimizer, lambda: optimizer.step(closure)) == 2  # +εz, −2εz; update pending
    assert instruments.count_passes(optimizer, lambda: [optimizer.step(closure) for _ in range(3)]) == 6
    assert instruments.count_passes(optimizer, optimizer.flush) == 1


def test_step_memory_names_the_path_it_measured():
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.Linear(16, 2))
    x, y = torch.randn(4, 8), torch.randint(0, 2, (4,))
    peaks = instruments.step_memory(model, x, y, torch.nn.functional.cross_entropy)
    assert peaks.path == "PlainNoise" and set(peaks) >= {"inference", "MeZO step", "backprop step"}
    from sazo_lite.noise import TorchNoise
    assert instruments.step_memory(model, x, y, torch.nn.functional.cross_entropy, noise=TorchNoise(workers=1)).path == "TorchNoise"


def test_race_mezo_sgd_both_learn_and_count_queries():
    problem = problems.LogisticRegression.from_sklearn("breast_cancer")
    runs = mezo_vs_sgd.race_mezo_sgd(problem, steps=60, batch_size=8, log_every=20)
    initial = problem.gap(problem.initial_theta())
    for name, run in runs.items():
        assert run["gap"][-1] < 0.7 * initial, name
        assert all(b > a for a, b in zip(run["seconds"], run["seconds"][1:]))
    assert runs["MeZO"]["queries"] == [2 * 8 * s for s in (20, 40, 60)]
    assert runs["SGD (backprop)"]["queries"] == [8 * s for s in (20, 40, 60)]


# -- 03 --------------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def snapshot():
    problem = problems.LeastSquares(64, 6, heterogeneity=1.0, seed=0)
    grads = problem.per_example_grads(minibatches.path_point(problem, 0.5))
    return problem, grads


def test_path_point_endpoints(snapshot):
    problem, _ = snapshot
    torch.testing.assert_close(minibatches.path_point(problem, 0.0), problem.initial_theta())
    torch.testing.assert_close(minibatches.path_point(problem, 1.0), problem.optimum)


def test_minibatch_zo_estimates_unbiased_with_the_predicted_second_moment(snapshot):
    _, grads = snapshot
    norms, full = grads.norm(dim=1), grads.mean(0)
    probs = variance.mix_with_uniform(variance.oracle_probs(norms), 0.2)
    draws = minibatches.minibatch_zo_estimates(grads, probs, 4, 40000, seed=5)
    stderr = draws.std(0) / math.sqrt(len(draws))
    assert bool(((draws.mean(0) - full).abs() < 4 * stderr).all())
    theory = variance.zo_second_moment(norms, probs, float(full.norm()), grads.shape[1], 4)
    assert float((draws ** 2).sum(1).mean()) == pytest.approx(theory, rel=0.08)


def test_weights_remove_the_bias_of_the_loss_estimate(snapshot):
    problem, grads = snapshot
    losses = problem.losses(minibatches.path_point(problem, 0.5))
    probs = variance.oracle_probs(grads.norm(dim=1))
    weighted = minibatches.weighted_loss_estimates(losses, probs, 8, 20000, seed=2)
    plain = minibatches.weighted_loss_estimates(losses, probs, 8, 20000, seed=2, weighted=False)
    stderr = lambda x: float(x.std()) / math.sqrt(len(x))
    assert abs(float(weighted.mean()) - float(losses.mean())) < 4 * stderr(weighted)
    assert float(plain.mean()) == pytest.approx(float((probs * losses).sum()), abs=4 * stderr(plain))
    assert float(plain.mean()) > float(losses.mean()) + 10 * stderr(plain)


def test_gain_vs_batch_starts_at_one_plus_cv2_and_shrinks(snapshot):
    _, grads = snapshot
    norms = grads.norm(dim=1)
    gains = minibatches.gain_vs_batch(norms, float(grads.mean(0).norm()), grads.shape[1], [1, 4, 16, 64])
    assert float(gains[0]) == pytest.approx(variance.uniform_gain(norms))
    assert bool((gains[1:] < gains[:-1]).all()) and float(gains[-1]) > 1.0
    at_optimum = minibatches.gain_vs_batch(norms, 0.0, grads.shape[1], [1, 64])
    torch.testing.assert_close(at_optimum, torch.full((2,), variance.uniform_gain(norms), dtype=torch.float64))


def test_direction_counter_that_counted_nothing_says_how_to_use_it():
    params, closure = two_tensor_setup()
    optimizer = sz.MeZO(params, lr=0.05)
    with pytest.raises(ValueError, match="DirectionCounter"):
        with instruments.DirectionCounter():
            optimizer.step(closure)  # the old usage: nothing tells the optimiser about the counter

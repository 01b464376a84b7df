"""Toy problems: exact per-example gradients against autograd, optima, heterogeneity knob."""
import pytest
import torch
from torch.func import grad, vmap

from sazo_lite.course.problems import LeastSquares, LogisticRegression, lognormal_scales


BUILDERS = {"least_squares": lambda: LeastSquares(40, 6, heterogeneity=1.5, seed=3),
            "breast_cancer": lambda: LogisticRegression.from_sklearn("breast_cancer", heterogeneity=0.7),
            "digits": lambda: LogisticRegression.from_sklearn("digits", l2=1e-2)}


@pytest.fixture(scope="module", params=list(BUILDERS))
def problem(request):
    """Built when a test runs (scikit-learn and the Newton solves), not when every process collects."""
    return BUILDERS[request.param]()


def test_per_example_grads_match_torch_func(problem):
    theta = 0.1 * torch.randn(problem.dim, dtype=torch.float64, generator=torch.Generator().manual_seed(0))
    single = lambda th, i: problem.losses(th, i.reshape(1))[0]
    autograd = vmap(grad(single), in_dims=(None, 0))(theta, torch.arange(problem.num_examples))
    assert torch.allclose(problem.per_example_grads(theta), autograd, rtol=1e-9, atol=1e-12)
    assert torch.allclose(problem.norms(theta), autograd.norm(dim=1), rtol=1e-9)


def test_optimum_has_zero_gradient_and_lowest_loss(problem):
    assert float(problem.gradient(problem.optimum).norm()) < 1e-8
    nudged = problem.optimum + 1e-2 * torch.randn(problem.dim, dtype=torch.float64)
    assert problem.gap(nudged) > 0
    assert problem.gap(problem.initial_theta()) > 0


def test_losses_follow_theta_dtype_and_indices():
    problem = LeastSquares(10, 3)
    theta = torch.ones(3, dtype=torch.float32)
    out = problem.losses(theta, torch.tensor([0, 4, 4]))
    assert out.dtype == torch.float32 and out.shape == (3,)
    assert out[1] == out[2]


def test_heterogeneity_knob():
    g = torch.Generator().manual_seed(0)
    assert torch.equal(lognormal_scales(50, 0.0, g), torch.ones(50, dtype=torch.float64))
    wide = lognormal_scales(20000, 1.5, g)
    assert abs(float(wide.mean()) - 1.0) < 0.15  # mean-one log-normal
    assert float(wide.log().std()) == pytest.approx(1.5, rel=0.05)
    with pytest.raises(ValueError, match="heterogeneity"):
        LeastSquares(10, 3, heterogeneity=-1.0)


def test_invalid_dataset_and_labels():
    with pytest.raises(ValueError, match="name"):
        LogisticRegression.from_sklearn("iris")
    with pytest.raises(ValueError, match="labels"):
        LogisticRegression(torch.randn(4, 2), torch.tensor([0.0, 1.0, 1.0, 0.0]))

"""Round 16 on the course layer: the logistic-regression optimum.

``LogisticRegression`` found θ* by plain Newton steps from θ = 0, 50 of them, and kept whatever it reached. On a
nearly separable set with a small ``l2`` the full steps ran off (breast cancer, l2 = 1e-9: |θ| ~ 4e8 with ‖∇F‖ ~ 2;
l2 = 1e-6 with heterogeneity 3: ‖∇F(θ*)‖ = 0.46), so ``gap`` measured every point from a wrong θ* and read negative
near it ("F(θ) − F(θ*) ≥ 0" in its docstring). Now a full step that raises F is halved, the method goes on until
∇F(θ*) is tiny, and a problem it cannot solve is a ValueError. Where plain Newton converged (every default, every
l2 ≥ 1e-4 here) θ* is bit for bit the one it found.
"""
from __future__ import annotations

import pytest
import torch

from sazo_lite.course import problems

pytest.importorskip("sklearn")


def plain_newton(problem, iters: int = 50) -> torch.Tensor:
    """The rule before round 16: full Newton steps from 0, stopped after ``iters`` or at a step below 1e-12."""
    theta = torch.zeros(problem.dim, dtype=torch.float64)
    eye = torch.eye(problem.dim, dtype=torch.float64)
    for _ in range(iters):
        prob = torch.sigmoid(problem.labels * (problem.features @ theta))
        curvature = problem.scales * prob * (1 - prob)
        hessian = (problem.features * curvature[:, None]).T @ problem.features / problem.num_examples \
            + problem.l2 * eye
        step = torch.linalg.solve(hessian, problem.gradient(theta))
        theta = theta - step
        if float(step.norm()) < 1e-12:
            break
    return theta


@pytest.mark.parametrize("l2, heterogeneity", [(1e-9, 0.0), (1e-9, 1.5), (1e-12, 0.0), (1e-6, 3.0), (1e-8, 1.5)])
def test_a_small_l2_on_a_nearly_separable_set_gets_its_true_optimum(l2, heterogeneity):
    problem = problems.LogisticRegression.from_sklearn("breast_cancer", l2=l2, heterogeneity=heterogeneity)
    assert float(problem.gradient(problem.optimum).norm()) < 1e-10
    generator = torch.Generator().manual_seed(0)
    for radius in (1e-3, 1e-1, 1.0):
        nearby = problem.optimum + radius * torch.randn(problem.dim, generator=generator, dtype=torch.float64)
        assert problem.gap(nearby) >= 0.0, radius
    assert problem.gap(plain_newton(problem)) > 0.0   # where the plain steps stopped is not the optimum


@pytest.mark.parametrize("name, l2, heterogeneity, seed", [
    ("breast_cancer", 1e-3, 0.0, 0), ("breast_cancer", 1e-3, 1.5, 1), ("breast_cancer", 1e-3, 3.0, 2),
    ("breast_cancer", 1e-6, 0.0, 0), ("digits", 1e-3, 0.0, 0), ("digits", 1e-9, 1.5, 0)])
def test_where_plain_newton_converged_the_optimum_is_the_same_bit_for_bit(name, l2, heterogeneity, seed):
    problem = problems.LogisticRegression.from_sklearn(name, l2=l2, heterogeneity=heterogeneity, seed=seed)
    plain = plain_newton(problem)
    assert float(problem.gradient(plain).norm()) < 1e-12   # the old rule's answer was right here
    assert torch.equal(problem.optimum, plain)


def test_an_optimum_not_found_in_the_steps_allowed_is_a_value_error_naming_l2():
    problem = problems.LogisticRegression.from_sklearn("breast_cancer", l2=1e-9)
    with pytest.raises(ValueError, match="Invalid l2: 1e-09"):
        problem._newton(iters=2, most=2)


def test_loss_grid_of_a_least_squares_subclass_uses_its_own_losses():
    """``loss_grid`` took its batched least-squares path for any ``LeastSquares``, also a subclass whose ``losses``
    differ: the grid (notebook 04's contours) was the parent's loss, 1.0 off here, without a word."""
    import numpy as np

    from sazo_lite.course import sazo_runs

    class Shifted(problems.LeastSquares):
        def losses(self, theta, indices=None):
            return super().losses(theta, indices) + 1.0

    for problem in (Shifted(16, 2, heterogeneity=1.0, seed=0), problems.LeastSquares(16, 2, heterogeneity=1.0)):
        xs, ys = np.linspace(-1.0, 1.0, 3), np.linspace(-2.0, 1.0, 2)
        plain = np.array([[float(problem.losses(torch.tensor([x, y], dtype=torch.float64)).mean()) for x in xs]
                          for y in ys])
        assert np.allclose(sazo_runs.loss_grid(problem, xs, ys), plain, rtol=1e-12, atol=1e-12)

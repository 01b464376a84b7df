"""Finite-sum problems with exact per-example losses, gradients and gradient norms.

F(θ) = (1/N) Σ_i f_i(θ). Each problem has a heterogeneity knob σ: per-example scales
s_i = exp(σ·ξ_i − σ²/2), ξ_i ~ N(0, 1) (log-normal with mean 1; σ = 0 gives s_i = 1).
"""
from __future__ import annotations

import numpy as np
import torch

from ..validation import check_count, check_number, check_seed

__all__ = ["FiniteSumProblem", "LeastSquares", "LogisticRegression", "lognormal_scales", "check_problem"]


def lognormal_scales(num_examples: int, heterogeneity: float, generator: torch.Generator) -> torch.Tensor:
    """s_i = exp(σξ_i − σ²/2): mean-one log-normal scales; all ones when σ = 0."""
    heterogeneity = check_number("heterogeneity", heterogeneity, 0.0)
    xi = torch.randn(num_examples, generator=generator, dtype=torch.float64)
    scales = torch.exp(heterogeneity * xi - heterogeneity ** 2 / 2)
    if not bool(((scales > 0) & torch.isfinite(scales)).all()):   # σ ≳ 35: e^(−σ²/2) underflows float64
        raise ValueError(f"Invalid heterogeneity: {heterogeneity} (the scales exp(σξ − σ²/2) leave float64's range; "
                         "expected σ of a few units)")
    return scales


def _numbers(name: str, values) -> torch.Tensor:
    """``values`` as a float64 tensor (through numpy: an object array of numbers or a DataFrame converts), or a
    ValueError naming them (text: torch's TypeError would name no argument)."""
    if isinstance(values, torch.Tensor):
        return values.detach().to(torch.float64)
    try:
        return torch.tensor(np.asarray(values, dtype=np.float64))
    except (TypeError, ValueError, RuntimeError):
        raise ValueError(f"Invalid {name}: {type(values).__name__} that does not convert to numbers "
                         "(expected an array or tensor of numbers)") from None


_PROBLEM_PARTS = ("num_examples", "losses", "gap", "norms", "initial_theta", "optimal_loss")


def check_problem(problem) -> None:
    """Refuse what is not a problem (a name, a dataset) before a helper reaches for one of its parts."""
    missing = [part for part in _PROBLEM_PARTS if not hasattr(problem, part)]
    if missing:
        raise ValueError(f"Invalid problem: {type(problem).__name__} {str(problem)[:60]!r} has no {', '.join(missing)} "
                         "(expected a FiniteSumProblem, e.g. make_problem(...) or problems.LogisticRegression(X, y))")


class FiniteSumProblem:
    """Shared interface. Subclasses define ``losses`` and ``per_example_grads``.

    Attributes:
        num_examples: N.
        dim: d, the number of parameters.
        optimum: θ* (float64 [d]); ``optimal_loss`` is F(θ*).
    """

    num_examples: int
    dim: int
    optimum: torch.Tensor
    features: torch.Tensor   # [N, d]
    responses: torch.Tensor  # [N]: targets y_i or labels ±1
    scales: torch.Tensor     # [N]: per-example s_i

    def losses(self, theta: torch.Tensor, indices: torch.Tensor | None = None) -> torch.Tensor:
        """Per-example losses f_i(θ) for ``indices`` (all examples if None), shape [B]."""
        raise NotImplementedError

    def per_example_grads(self, theta: torch.Tensor) -> torch.Tensor:
        """∇f_i(θ) for every example, float64 [N, d]."""
        raise NotImplementedError

    def norms(self, theta: torch.Tensor) -> torch.Tensor:
        """‖∇f_i(θ)‖ for every example, float64 [N] (what the oracle samples by)."""
        return self.per_example_grads(theta).norm(dim=1)

    def gradient(self, theta: torch.Tensor) -> torch.Tensor:
        """∇F(θ), float64 [d]."""
        return self.per_example_grads(theta).mean(dim=0)

    def full_loss(self, theta: torch.Tensor) -> float:
        """F(θ), computed in float64."""
        return float(self.losses(theta.detach().double()).mean())

    @property
    def optimal_loss(self) -> float:
        return self.full_loss(self.optimum)

    def gap(self, theta: torch.Tensor) -> float:
        """F(θ) − F(θ*) ≥ 0."""
        return self.full_loss(theta) - self.optimal_loss

    def initial_theta(self, dtype: torch.dtype = torch.float64) -> torch.Tensor:
        """The starting point θ₀ = 0, in ``dtype`` (a floating-point torch.dtype)."""
        # every run starts here: a str or an int dtype failed inside torch, or ran MeZO on integers
        if not isinstance(dtype, torch.dtype) or not dtype.is_floating_point:
            raise ValueError(f"Invalid dtype: {dtype!r} (expected a floating-point torch.dtype, e.g. torch.float32)")
        return torch.zeros(self.dim, dtype=dtype)

    def _theta(self, theta) -> torch.Tensor:
        """θ itself, or a ValueError: a tensor of shape [d] (under ``torch.func.vmap`` too: it shows one θ)."""
        if not isinstance(theta, torch.Tensor) or theta.shape != (self.dim,):
            what = f"shape {tuple(theta.shape)}" if isinstance(theta, torch.Tensor) else type(theta).__name__
            raise ValueError(f"Invalid theta: {what} (expected a tensor of shape [{self.dim}])")
        return theta

    def _rows(self, theta: torch.Tensor, indices):
        """(features, responses, scales) of ``indices`` (all if None), cast to θ's dtype."""
        self._theta(theta)
        if not theta.is_floating_point():   # the data cast to an int dtype would be truncated, the losses garbage
            raise ValueError(f"Invalid theta: dtype {theta.dtype} (expected a floating-point tensor)")
        columns = (self.features, self.responses, self.scales)
        if indices is not None:   # (no range check here: torch.func.vmap batches indices, which cannot be read)
            columns = tuple(column[indices] for column in columns)
        return tuple(column.to(theta.dtype) for column in columns)

    def closure(self, theta: torch.Tensor, indices: torch.Tensor):
        """A closure for ``MeZO.step``: per-example losses of ``indices`` at the live θ."""
        return lambda: self.losses(theta, indices)


class LeastSquares(FiniteSumProblem):
    """f_i(θ) = ½ s_i (x_iᵀθ − y_i)², with x_i ~ N(0, I_d) and y_i = x_iᵀθ_true + noise.

    ‖∇f_i(θ)‖ = s_i |x_iᵀθ − y_i| ‖x_i‖; the optimum is the weighted least-squares solution.

    Example:
        >>> problem = LeastSquares(num_examples=64, dim=5, heterogeneity=1.5, seed=0)
        >>> problem.losses(problem.initial_theta()).shape
        torch.Size([64])
    """

    def __init__(self, num_examples: int = 256, dim: int = 20, *, heterogeneity: float = 0.0,
                 noise: float = 0.5, seed: int = 0):
        num_examples, dim = check_count("num_examples", num_examples), check_count("dim", dim)
        heterogeneity = check_number("heterogeneity", heterogeneity, 0.0)
        noise = check_number("noise", noise, 0.0)
        if num_examples < dim:  # fewer equations than unknowns: no unique optimum θ*
            raise ValueError(f"Invalid num_examples: {num_examples} (expected >= dim = {dim} for a unique optimum)")
        g = torch.Generator().manual_seed(check_seed("seed", seed))
        self.num_examples, self.dim, self.heterogeneity = num_examples, dim, heterogeneity
        self.features = torch.randn(num_examples, dim, generator=g, dtype=torch.float64)
        theta_true = torch.randn(dim, generator=g, dtype=torch.float64)
        self.targets = self.features @ theta_true + noise * torch.randn(num_examples, generator=g, dtype=torch.float64)
        self.scales = lognormal_scales(num_examples, heterogeneity, g)
        self.responses = self.targets
        if not bool(torch.isfinite(self.targets ** 2).all()):   # its losses ½s(xᵀθ − y)² overflow float64: NaN gaps
            raise ValueError(f"Invalid noise: {noise} (the targets' squares leave float64's range; expected a noise "
                             "level of a few units)")
        weighted = self.features * self.scales[:, None]
        try:
            self.optimum = torch.linalg.solve(weighted.T @ self.features, weighted.T @ self.targets)
        except torch.linalg.LinAlgError as error:   # e.g. scales so uneven that the weighted system is singular
            raise ValueError(f"Invalid problem: its weighted normal equations are singular (num_examples "
                             f"{num_examples}, dim {dim}, heterogeneity {heterogeneity}): no unique optimum") from error

    def losses(self, theta, indices=None):
        x, y, s = self._rows(theta, indices)
        return 0.5 * s * (x @ theta - y) ** 2

    def per_example_grads(self, theta):
        residual = self.features @ self._theta(theta).detach().double() - self.targets
        return (self.scales * residual)[:, None] * self.features


class LogisticRegression(FiniteSumProblem):
    """f_i(θ) = s_i·log(1 + exp(−y_i x_iᵀθ)) + (l2/2)‖θ‖², labels y_i ∈ {±1}.

    Features are standardised and get a bias column. ``from_sklearn`` loads a dataset that
    ships inside scikit-learn (no download).

    Example:
        >>> problem = LogisticRegression.from_sklearn("breast_cancer")
        >>> problem.num_examples, problem.dim
        (569, 31)
    """

    def __init__(self, features: torch.Tensor, labels: torch.Tensor, *, l2: float = 1e-3,
                 heterogeneity: float = 0.0, seed: int = 0):
        l2 = check_number("l2", l2, 0.0, closed_low=False)  # > 0: Newton needs a strongly convex F
        heterogeneity = check_number("heterogeneity", heterogeneity, 0.0)
        seed = check_seed("seed", seed)
        features, labels = _numbers("features", features), _numbers("labels", labels)
        if features.dim() != 2 or labels.shape != features.shape[:1] or len(labels) < 1:
            raise ValueError(f"Invalid features/labels: shapes {tuple(features.shape)} and "
                             f"{tuple(labels.shape)} (expected [N, d] and [N], N >= 1)")
        if not bool(torch.isfinite(features).all()):
            raise ValueError("Invalid features: entries must be finite")
        if set(labels.unique().tolist()) - {-1.0, 1.0}:
            found = sorted(set(labels.unique().tolist()))
            hint = "; for 0/1 labels pass 2 * y - 1" if set(found) <= {0.0, 1.0} else ""
            raise ValueError(f"Invalid labels: values {found[:5]} (expected values in {{-1, +1}}{hint})")
        # one example has no spread (std's N − 1 is 0, its std NaN): centred, its features are 0 whatever the divisor
        spread = features.std(0) if len(features) > 1 else torch.ones(features.shape[1], dtype=torch.float64)
        features = (features - features.mean(0)) / spread.clamp_min(1e-12)
        self.features = torch.cat([features, torch.ones(len(features), 1, dtype=torch.float64)], dim=1)
        self.labels, self.l2, self.heterogeneity = labels, float(l2), heterogeneity
        self.responses = self.labels
        self.num_examples, self.dim = self.features.shape
        self.scales = lognormal_scales(self.num_examples, heterogeneity, torch.Generator().manual_seed(seed))
        self.optimum = self._newton()

    @classmethod
    def from_sklearn(cls, name: str = "breast_cancer", **kwargs) -> "LogisticRegression":
        """Binary logistic regression on 'breast_cancer' or 'digits' (digit < 5 vs ≥ 5)."""
        from sklearn import datasets

        if name == "breast_cancer":
            data = datasets.load_breast_cancer()
            labels = 2.0 * torch.as_tensor(data.target, dtype=torch.float64) - 1.0
        elif name == "digits":
            data = datasets.load_digits()
            labels = torch.where(torch.as_tensor(data.target) < 5, -1.0, 1.0).double()
        else:
            raise ValueError(f"Invalid name: {name!r} (expected 'breast_cancer' or 'digits')")
        return cls(torch.as_tensor(data.data), labels, **kwargs)

    def losses(self, theta, indices=None):
        x, y, s = self._rows(theta, indices)
        return s * torch.nn.functional.softplus(-y * (x @ theta)) + 0.5 * self.l2 * (theta @ theta)

    def per_example_grads(self, theta):
        theta = self._theta(theta).detach().double()
        margin = self.labels * (self.features @ theta)
        coef = -self.scales * self.labels * torch.sigmoid(-margin)  # d f_i / d (x_iᵀθ)
        return coef[:, None] * self.features + self.l2 * theta

    def _newton(self, iters: int = 50, most: int = 2000) -> torch.Tensor:
        """θ* by Newton's method on the strongly convex (l2 > 0) objective, in float64.

        A full step that raises F is halved until it does not (``_descending``). It stops after ``iters`` steps,
        or at a step below 1e-12, once ‖∇F(θ)‖ is at most 1e-9·‖∇F(0)‖ (or 1e-12), else goes on, up to ``most``
        steps; ValueError if it never gets there.
        """
        # Plain full steps on a nearly separable set with a small l2 (breast cancer, l2 = 1e-9) ran off to
        # |θ| ~ 1e8 with ‖∇F‖ still ~2, and every gap was then measured from that wrong θ*.
        theta = torch.zeros(self.dim, dtype=torch.float64)
        eye = torch.eye(self.dim, dtype=torch.float64)
        grad = self.gradient(theta)
        tolerance = max(1e-9 * float(grad.norm()), 1e-12)
        for k in range(most):
            prob = torch.sigmoid(self.labels * (self.features @ theta))
            curvature = self.scales * prob * (1 - prob)
            hessian = (self.features * curvature[:, None]).T @ self.features / self.num_examples + self.l2 * eye
            step = self._descending(theta, torch.linalg.solve(hessian, grad))
            theta = theta - step
            grad = self.gradient(theta)   # the stopping test's, and the next step's
            if (k + 1 >= iters or float(step.norm()) < 1e-12) and float(grad.norm()) <= tolerance:
                return theta
        raise ValueError(f"Invalid l2: {self.l2} (Newton's method found no optimum within {most} steps: the "
                         f"examples are nearly separable and l2 too small to pin θ*; raise l2)")

    def _descending(self, theta: torch.Tensor, step: torch.Tensor) -> torch.Tensor:
        """``step`` halved until F(θ − step) is not above F(θ) (beyond rounding), at most 60 times."""
        before = float(self.losses(theta).mean())
        for _ in range(60):
            if float(self.losses(theta - step).mean()) <= before + 1e-12 * abs(before):
                break
            step = step / 2
        return step

"""The two-point (finite-difference) estimator of notebook 01, on a toy function with exact gradients.

With a direction z and radius ε:

    g(z) = (f(θ+εz) − f(θ−εz)) / (2ε),      ĝ = (1/q) Σ_j g(z_j) z_j,      E_z[ĝ] ≈ ∇f(θ)

    error of g against zᵀ∇f:  ≈ (ε²/6)|∇³f[z,z,z]|  (third derivative: the curvature cancels)
                            +  ≈ u·|f|/ε  (rounding, u = unit round-off)
    E‖ĝ − ∇f‖² / ‖∇f‖² = (d+1)/q for Gaussian z,  (d−1)/q for Rademacher z   (linear f)
"""
from __future__ import annotations

import torch

from ..directions import PERTURBATIONS, derive_seed
from ..validation import check_choice, check_count, check_int, check_number, check_seed

__all__ = ["bowl_loss", "bowl_grad", "random_directions", "two_point_estimates", "zo_gradient",
           "directional_error", "error_vs_eps", "relative_error_theory", "relative_error_monte_carlo"]


def _theta(theta, name: str = "theta") -> torch.Tensor:
    """θ as a floating-point tensor (a list becomes float64); an integer tensor is refused: the curvatures and
    the directions are cast to θ's dtype, and an int dtype would truncate them (a = 1.5 → 1) without a word."""
    if not isinstance(theta, torch.Tensor):
        try:
            return torch.as_tensor(theta, dtype=torch.float64)
        except (TypeError, ValueError, RuntimeError):
            raise ValueError(f"Invalid {name}: {theta!r} (expected a tensor or a sequence of numbers)") from None
    if not theta.is_floating_point():
        raise ValueError(f"Invalid {name}: dtype {theta.dtype} (expected a floating-point tensor, e.g. "
                         f"torch.tensor([1.0, 2.0]): an int dtype would truncate the curvatures and directions)")
    return theta


def _curvatures(theta: torch.Tensor, curvatures) -> torch.Tensor:
    """The curvatures a as a tensor of θ's dtype: one per coordinate of θ (or a single one for all)."""
    if theta.dim() == 0:   # (theta.shape[-1] raised IndexError)
        raise ValueError(f"Invalid theta: a single number {float(theta)!r} (expected a point [..., d])")
    try:
        a = torch.as_tensor(curvatures, dtype=theta.dtype)
    except (TypeError, ValueError, RuntimeError):
        raise ValueError(f"Invalid curvatures: {curvatures!r} (expected a number or one per coordinate of θ)") from None
    if a.dim() > 1 or (a.dim() == 1 and a.shape[0] not in (1, theta.shape[-1])):
        raise ValueError(f"Invalid curvatures: shape {tuple(a.shape)} (expected one per coordinate of θ, "
                         f"{theta.shape[-1]})")
    if not bool(torch.isfinite(a).all()):   # a NaN curvature made every loss and slope NaN without a word
        raise ValueError(f"Invalid curvatures: {a.tolist()} (expected finite numbers)")
    return a


def bowl_loss(theta: torch.Tensor, curvatures, quartic: float = 0.0, offset: float = 0.0) -> torch.Tensor:
    """f(θ) = Σ_j (a_j/2) θ_j² + (κ/4) Σ_j θ_j⁴ + c, for θ of shape [..., d] → [...].

    κ = 0 gives a quadratic, for which the central difference is exact (its curvature cancels);
    κ > 0 adds a third derivative (6κθ_j) and so an O(ε²) bias. The offset c only adds
    rounding error (a large |f| loses low bits), as a large loss does in a real model.

    Example:
        >>> float(bowl_loss(torch.tensor([1.0, 2.0]), [1.0, 1.0]))
        2.5
    """
    theta = _theta(theta)
    a = _curvatures(theta, curvatures)
    quartic, offset = check_number("quartic", quartic), check_number("offset", offset)
    return (0.5 * a * theta ** 2 + 0.25 * quartic * theta ** 4).sum(-1) + offset


def bowl_grad(theta: torch.Tensor, curvatures, quartic: float = 0.0) -> torch.Tensor:
    """∇f(θ) = a ⊙ θ + κ θ³ for ``bowl_loss`` (same shape as θ)."""
    theta = _theta(theta)
    a = _curvatures(theta, curvatures)
    return a * theta + check_number("quartic", quartic) * theta ** 3


def random_directions(num: int, dim: int, *, seed: int = 0, perturbation: str = "gaussian",
                      dtype: torch.dtype = torch.float64) -> torch.Tensor:
    """q directions z_j as rows [q, d]: N(0, I) or Rademacher ±1, reproducible from ``seed``."""
    check_count("num", num)
    check_count("dim", dim)
    check_choice("perturbation", perturbation, PERTURBATIONS)
    g = torch.Generator().manual_seed(check_int("seed", seed))
    if perturbation == "gaussian":
        return torch.randn(num, dim, generator=g, dtype=dtype)
    return torch.randint(0, 2, (num, dim), generator=g).to(dtype) * 2 - 1


def two_point_estimates(fn, theta: torch.Tensor, directions: torch.Tensor, eps: float):
    """Projected gradients g_j and estimates g_j z_j for q directions, in θ's dtype.

    Args:
        fn: maps points [q, d] to values [q] (e.g. ``bowl_loss``), evaluated in θ's dtype.
        theta: the point, [d].
        directions: z_j as rows, [q, d].
        eps: smoothing radius ε > 0.

    Returns:
        (g [q], g_j z_j [q, d]); their mean over q is ĝ.
    """
    eps = check_number("eps", eps, 0.0, closed_low=False)
    theta = _theta(theta)
    try:
        z = torch.as_tensor(directions).to(theta.dtype)     # ±1 ints are exact in any float dtype
    except (TypeError, ValueError, RuntimeError):
        raise ValueError(f"Invalid directions: {directions!r} (expected a tensor [q, d])") from None
    if z.dim() != 2 or z.shape[1] != theta.numel():
        raise ValueError(f"Invalid directions: shape {tuple(z.shape)} (expected [q, d] with d = {theta.numel()}, "
                         "θ's size)")
    if float(torch.tensor(2 * eps, dtype=theta.dtype)) == 0:   # 0/0: every g was NaN, where a tiny ε gives g = 0
        raise ValueError(f"Invalid eps: {eps!r} (2ε rounds to 0 in {theta.dtype}, θ's dtype: expected a larger ε)")
    plus, minus = fn(theta + eps * z), fn(theta - eps * z)
    if not bool(torch.isfinite(plus).all() and torch.isfinite(minus).all()):   # inf − inf: NaN without a word
        raise ValueError(f"Invalid eps: {eps!r} (f(θ ± εz) is not finite in {theta.dtype} at this ε: take a "
                         "smaller ε)")
    g = (plus - minus) / (2 * eps)  # [q]
    return g, g[:, None] * z


def zo_gradient(fn, theta: torch.Tensor, eps: float, num_directions: int, *, seed: int = 0,
                perturbation: str = "gaussian") -> torch.Tensor:
    """ĝ = (1/q) Σ_j g(z_j) z_j: the averaged two-point estimate of ∇f(θ), shape [d].

    Example:
        >>> theta = torch.tensor([1.0, -2.0], dtype=torch.float64)
        >>> est = zo_gradient(lambda x: bowl_loss(x, [1.0, 3.0]), theta, 1e-4, 20000)
        >>> bool((est - torch.tensor([1.0, -6.0], dtype=torch.float64)).abs().max() < 0.2)
        True
    """
    theta = _theta(theta)   # a list or numpy array as two_point_estimates takes it
    check_count("num_directions", num_directions)   # by the caller's name (random_directions calls it num)
    z = random_directions(num_directions, theta.numel(), seed=seed, perturbation=perturbation)
    return two_point_estimates(fn, theta, z, eps)[1].mean(0)


def directional_error(fn, grad: torch.Tensor, theta: torch.Tensor, directions: torch.Tensor,
                      eps: float) -> float:
    """Mean over directions of |g(z) − zᵀ∇f| / |zᵀ∇f|: the relative error of one finite difference.

    ``grad`` is the exact ∇f(θ) (computed in float64); g(z) is computed in θ's dtype.
    """
    g, _ = two_point_estimates(fn, theta, directions, eps)
    try:
        grad = torch.as_tensor(grad, dtype=torch.float64)
    except (TypeError, ValueError, RuntimeError):
        raise ValueError(f"Invalid grad: {grad!r} (expected ∇f(θ), a tensor or a sequence of numbers)") from None
    size = torch.as_tensor(directions).shape[1]   # θ's size (two_point_estimates checked the directions)
    if grad.shape != (size,):   # zᵀ∇f with another length raised torch's "size mismatch"
        raise ValueError(f"Invalid grad: shape {tuple(grad.shape)} (expected θ's shape ({size},))")
    exact = torch.as_tensor(directions, dtype=torch.float64) @ grad
    if bool((exact == 0).any()):
        raise ValueError("Invalid grad/directions: zᵀ∇f = 0 for some direction (at the minimum, or z ⟂ ∇f), "
                         "where its relative error is 0/0")
    return float(((g.double() - exact).abs() / exact.abs().clamp_min(1e-300)).mean())


def error_vs_eps(fn, grad: torch.Tensor, theta: torch.Tensor, eps_grid, *,
                 dtype: torch.dtype = torch.float32, num_directions: int = 8, seed: int = 0) -> torch.Tensor:
    """The U-shaped curve: ``directional_error`` at each ε of ``eps_grid``, θ cast to ``dtype``.

    Large ε: third-derivative error ∝ ε² (the curvature cancels: a quadratic has none). Tiny ε: θ ± εz and f
    round to the same float, error ∝ u/ε.
    Returns a float64 tensor [len(eps_grid)].
    """
    try:
        if isinstance(eps_grid, (str, bytes)):   # its characters are no grid
            raise TypeError
        eps_grid = list(eps_grid)
    except TypeError:
        raise ValueError(f"Invalid eps_grid: {eps_grid!r} (expected a sequence of numbers ε > 0)") from None
    # each ε a number (a 0-d tensor of torch.logspace read as one): float() read "1e-3" and True (ε = 1) as numbers
    eps_grid = [check_number("eps_grid", e.item() if isinstance(e, torch.Tensor) and e.dim() == 0 else e, 0.0,
                             closed_low=False) for e in eps_grid]
    if not eps_grid:   # an empty curve would plot nothing without a word
        raise ValueError("Invalid eps_grid: expected at least one ε")
    check_count("num_directions", num_directions)
    try:
        theta = torch.as_tensor(theta).to(dtype)   # a list, numpy array or int tensor: cast to the dtype studied
    except (TypeError, ValueError, RuntimeError):
        raise ValueError(f"Invalid theta: {theta!r} (expected a tensor or a sequence of numbers)") from None
    z = random_directions(num_directions, theta.numel(), seed=seed)
    return torch.tensor([directional_error(fn, grad, theta, z, e) for e in eps_grid], dtype=torch.float64)


def relative_error_theory(dim: int, num_directions: int, perturbation: str = "gaussian") -> float:
    """E‖ĝ − a‖²/‖a‖² for linear f with gradient a: (d+1)/q (Gaussian), (d−1)/q (Rademacher).

    From E‖z zᵀa‖² = (d+2)‖a‖² for Gaussian z and d‖a‖² for Rademacher z.
    """
    check_count("dim", dim)
    check_count("num_directions", num_directions)
    check_choice("perturbation", perturbation, PERTURBATIONS)
    return (dim + 1 if perturbation == "gaussian" else dim - 1) / num_directions


def relative_error_monte_carlo(dim: int, num_directions: int, *, trials: int = 200, seed: int = 0,
                               perturbation: str = "gaussian") -> float:
    """Monte-Carlo E‖ĝ − a‖²/‖a‖² with ĝ = (1/q) Σ_j z_j z_jᵀa (exact ZO for linear f)."""
    for name, value in (("dim", dim), ("num_directions", num_directions), ("trials", trials)):
        check_count(name, value)   # by the caller's names: random_directions would name trials·q "num"
    g = torch.Generator().manual_seed(check_seed("seed", seed))
    a = torch.randn(dim, generator=g, dtype=torch.float64)
    z = random_directions(trials * num_directions, dim, seed=derive_seed(seed, dim, num_directions),
                          perturbation=perturbation).view(trials, num_directions, dim)
    estimates = ((z @ a)[..., None] * z).mean(1)  # [trials, d]
    return float(((estimates - a) ** 2).sum(1).mean() / (a @ a))

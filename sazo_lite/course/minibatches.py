"""Importance-sampled minibatches (notebook 03): B indices i.i.d. from p, weights w = 1/(N p_i).

For linear f_i (a_i = ∇f_i) the ZO estimate is ĝ = z · (1/B) Σ_k w_k zᵀa_{i_k}; with the
weights it is unbiased for any p with full support.
"""
from __future__ import annotations

import math

import torch

from .. import variance
from ..directions import derive_seed
from ..validation import check_count, check_number, check_seed
from .problems import check_problem

__all__ = ["gain_along_path", "path_point", "sample_minibatches", "minibatch_zo_estimates", "weighted_loss_estimates",
           "gain_vs_batch", "second_moment_estimate", "norm_spread"]


def path_point(problem, progress: float) -> torch.Tensor:
    """θ_t = θ₀ + t(θ* − θ₀): a stand-in for "how far training has got" (t = 0 start, 1 optimum)."""
    check_problem(problem)
    if isinstance(progress, torch.Tensor) and progress.numel() == 1 and progress.dtype != torch.bool:
        progress = progress.item()   # a 0-d tensor, e.g. from torch.linspace
    # a number or a numpy scalar; True (read as t = 1: θ*), "0.5" and None are refused by the one rule
    progress = check_number("progress", progress, 0.0, 1.0)
    theta0 = problem.initial_theta()
    return theta0 + progress * (problem.optimum - theta0)


def _tensor(name: str, values) -> torch.Tensor:
    """``values`` as a float64 tensor, or a ValueError naming them (torch's TypeError names no argument)."""
    try:
        return torch.as_tensor(values, dtype=torch.float64)
    except (TypeError, ValueError, RuntimeError):
        raise ValueError(f"Invalid {name}: {type(values).__name__} {str(values)[:40]!r} (expected numbers)") from None


def _probs(probs) -> torch.Tensor:
    """p as float64 [N]: finite, ≥ 0, summing to 1 (the weights 1/(N p_i) assume it)."""
    p = _tensor("probs", probs)
    if p.dim() != 1 or len(p) == 0 or not bool(torch.isfinite(p).all()) or bool((p < 0).any()) \
            or abs(float(p.sum()) - 1.0) > 1e-6:
        raise ValueError(f"Invalid probs: expected a non-empty 1-D distribution (finite, >= 0, summing to 1), "
                         f"got shape {tuple(p.shape)} summing to {float(p.sum()) if p.numel() else 0.0:.6g}")
    return p


def _norms(norms) -> torch.Tensor:
    """Per-example gradient norms as float64 [N]: finite, ≥ 0, not all 0 (p* ∝ ‖∇f_i‖ needs one > 0)."""
    a = _tensor("norms", norms)
    if a.dim() != 1 or len(a) == 0 or not bool(torch.isfinite(a).all()) or bool((a < 0).any()) \
            or not bool((a > 0).any()):
        raise ValueError(f"Invalid norms: expected a non-empty 1-D tensor of finite norms >= 0, not all 0, "
                         f"got shape {tuple(a.shape)}")
    return a


def _finite(name: str, values, dims: int, shape: str) -> torch.Tensor:
    """``values`` as a float64 tensor with ``dims`` dimensions of finite numbers, or a ValueError naming it."""
    try:
        a = torch.as_tensor(values, dtype=torch.float64)
    except (TypeError, ValueError, RuntimeError):
        raise ValueError(f"Invalid {name}: expected {shape} of numbers, got {type(values).__name__}") from None
    if a.dim() != dims or a.numel() == 0 or not bool(torch.isfinite(a).all()):
        raise ValueError(f"Invalid {name}: expected {shape} of finite numbers, got shape {tuple(a.shape)}"
                         + ("" if a.numel() == 0 or bool(torch.isfinite(a).all()) else " with inf or NaN"))
    return a


def _sequence(name: str, values) -> list:
    """``values`` as a list, or a ValueError naming them (a single number where a sequence is expected)."""
    try:
        return list(values)
    except TypeError:
        raise ValueError(f"Invalid {name}: {values!r} (expected a sequence, e.g. [{values!r}])") from None


def _columns(name: str, values, probs: torch.Tensor) -> None:
    if len(values) != len(probs):
        raise ValueError(f"Invalid {name}: {len(values)} rows for {len(probs)} probabilities (expected one per example)")


def sample_minibatches(probs, batch_size: int, trials: int, *, seed: int = 0):
    """``trials`` minibatches of B indices i.i.d. from p, with weights w = 1/(N p_i).

    Returns:
        (indices Long [trials, B], weights float64 [trials, B]).
    """
    probs = _probs(probs)
    check_count("batch_size", batch_size)
    check_count("trials", trials)
    g = torch.Generator().manual_seed(check_seed("seed", seed))
    indices = torch.multinomial(probs, trials * batch_size, replacement=True, generator=g)
    indices = indices.view(trials, batch_size)
    return indices, variance.importance_weights(probs[indices], len(probs))


def minibatch_zo_estimates(per_example_grads: torch.Tensor, probs, batch_size: int, trials: int, *,
                           seed: int = 0) -> torch.Tensor:
    """Monte-Carlo draws of ĝ = z · (1/B) Σ_k w_k zᵀa_{i_k}, one Gaussian z per draw, [trials, d].

    Exact MeZO estimates for linear f_i (a_i = ∇f_i); E[ĝ] = ∇F and, by
    ``variance.zo_second_moment``, E‖ĝ‖² = (d+2)[V(p)/B + (1 − 1/B)‖∇F‖²].
    """
    a = _finite("per_example_grads", per_example_grads, 2, "[N, d] per-example gradients")
    _columns("per_example_grads", a, _probs(probs))
    indices, weights = sample_minibatches(probs, batch_size, trials, seed=seed)
    g = torch.Generator().manual_seed(derive_seed(seed, 1))
    z = torch.randn(trials, a.shape[1], generator=g, dtype=torch.float64)
    diffs = torch.einsum("tbd,td->tb", a[indices], z)  # d_k = zᵀa_{i_k}, [trials, B]
    projected = (weights * diffs).mean(1)               # g = (1/B) Σ_k w_k d_k, [trials]
    return projected[:, None] * z


def weighted_loss_estimates(losses, probs, batch_size: int, trials: int, *, seed: int = 0,
                            weighted: bool = True) -> torch.Tensor:
    """Minibatch estimates F̂ = (1/B) Σ_k w_k f_{i_k} of F = mean(f), [trials].

    With the weights, E[F̂] = F for any p with full support; without them (w = 1) the mean
    is Σ_i p_i f_i, which is biased unless p is uniform.
    """
    losses = _finite("losses", losses, 1, "[N] per-example losses")
    _columns("losses", losses, _probs(probs))
    indices, weights = sample_minibatches(probs, batch_size, trials, seed=seed)
    values = losses[indices]
    return (weights * values if weighted else values).mean(1)


def gain_vs_batch(norms, full_grad_norm: float, dim: int, batch_sizes) -> torch.Tensor:
    """E‖ĝ‖² under uniform sampling divided by E‖ĝ‖² under the oracle p*, for each B.

    = (V(u)/B + (1−1/B)‖∇F‖²) / (V(p*)/B + (1−1/B)‖∇F‖²): 1 + CV² at B = 1 or ‖∇F‖ = 0,
    shrinking towards 1 as B grows. Returns float64 [len(batch_sizes)]. The ratio does not depend on the units of
    the norms; a ``full_grad_norm`` above their mean (‖mean ∇f_i‖ ≤ mean ‖∇f_i‖) is refused.
    """
    norms = _norms(norms)
    if isinstance(full_grad_norm, torch.Tensor) and full_grad_norm.numel() == 1:
        full_grad_norm = float(full_grad_norm)                              # e.g. grads.mean(0).norm()
    full_grad_norm = check_number("full_grad_norm", full_grad_norm, 0.0)   # ‖∇F‖
    # ‖∇F‖ = ‖mean ∇f_i‖ ≤ mean ‖∇f_i‖ (triangle inequality): above it, the two do not come from one set of gradients
    if full_grad_norm > float(norms.mean()) * (1 + 1e-9):
        raise ValueError(f"Invalid full_grad_norm: {full_grad_norm:.6g} (expected ‖∇F‖ <= the mean of the norms, "
                         f"{float(norms.mean()):.6g}: ‖mean ∇f_i‖ <= mean ‖∇f_i‖)")
    dim = check_count("dim", dim)
    batch_sizes = [check_count("batch_sizes", b) for b in _sequence("batch_sizes", batch_sizes)]
    if not batch_sizes:   # an empty tensor would draw nothing without a word
        raise ValueError("Invalid batch_sizes: expected at least one batch size")
    # the ratio does not change when every norm and ‖∇F‖ scale together: in units of the largest norm, norms of
    # 1e-200 or 1e200 neither underflow (a 0/0) nor overflow (inf/inf) in the squared moments
    scale = float(norms.max())
    norms, full_grad_norm = norms / scale, full_grad_norm / scale
    uniform = torch.full_like(norms, 1.0 / len(norms))
    oracle = variance.oracle_probs(norms)
    return torch.tensor([variance.zo_second_moment(norms, uniform, full_grad_norm, dim, int(b))
                         / variance.zo_second_moment(norms, oracle, full_grad_norm, dim, int(b))
                         for b in batch_sizes], dtype=torch.float64)


def gain_along_path(problem, batch_sizes, progress) -> dict[int, torch.Tensor]:
    """The oracle's gain over uniform (``gain_vs_batch``) along the straight path θ₀ → θ*.

    Two effects meet late in training: the p-independent (1−1/B)‖∇F‖² term vanishes as
    ‖∇F‖ → 0 (pushing the gain *up*, towards 1 + CV² of the current norms, at large B), and
    1 + CV² itself follows how spread the current norms are (which may fall). At B = 1 only
    the second acts.

    Returns:
        {B: float64 [len(progress)] gain at each t}; B = 1 is 1 + CV² of the norms at θ_t.

    Example:
        >>> from sazo_lite.course.problems import LeastSquares
        >>> gains = gain_along_path(LeastSquares(32, 4, heterogeneity=1.0), [1, 64], [0.0, 1.0])
        >>> bool(abs(gains[1][-1] - gains[64][-1]) < 1e-9)   # ∇F(θ*) = 0: B no longer matters
        True
    """
    check_problem(problem)
    progress, batch_sizes = _sequence("progress", progress), _sequence("batch_sizes", batch_sizes)   # read once: a
    for name, values in (("progress", progress), ("batch_sizes", batch_sizes)):           # generator is spent by a check
        if not values:
            raise ValueError(f"Invalid {name}: expected at least one value")
    rows = []
    for t in progress:
        grads = problem.per_example_grads(path_point(problem, t))               # [N, d]
        rows.append(gain_vs_batch(grads.norm(dim=1), float(grads.mean(0).norm()), grads.shape[1], batch_sizes))
    table = torch.stack(rows)                                                    # [T, len(B)]
    return {int(b): table[:, k] for k, b in enumerate(batch_sizes)}


def second_moment_estimate(draws: torch.Tensor) -> tuple[float, float]:
    """Monte-Carlo E‖ĝ‖² from ``draws`` [trials, d] and its standard error (std of ‖ĝ‖² / √trials).

    Under uniform sampling of heavy-tailed norms ‖ĝ‖² is itself heavy-tailed (a few large-gradient
    examples are rarely drawn), so the error bar says how far a run may sit from the theory.

    Example:
        >>> mean, error = second_moment_estimate(torch.ones(400, 3))
        >>> mean, error
        (3.0, 0.0)
    """
    draws = _finite("draws", draws, 2, "[trials, d] estimates")
    if draws.shape[0] < 2:
        raise ValueError(f"Invalid draws: shape {tuple(draws.shape)} (expected [trials, d] with trials >= 2 "
                         "for a standard error)")
    squares = (draws ** 2).sum(1)                                   # ‖ĝ‖² per draw, [trials]
    return float(squares.mean()), float(squares.std() / len(squares) ** 0.5)


def norm_spread(norms) -> float:
    """How many decades the middle 90% of the norms span: the 95th minus the 5th percentile of log10 ‖∇f_i‖ (each
    interpolated between log10 values, not between norms), inf when the 5th percentile falls on a norm of 0.

    Example:
        >>> round(norm_spread(torch.logspace(0, 2, 101)), 2)
        1.8
    """
    norms = _norms(norms)
    if int((norms == 0).sum()) > int(0.05 * (len(norms) - 1)):   # the 5th percentile falls on a norm of 0
        return math.inf
    logs = torch.log10(norms.clamp_min(1e-300))
    return float(torch.quantile(logs, 0.95) - torch.quantile(logs, 0.05))

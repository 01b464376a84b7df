"""F under random displacements: how much a walk of pure noise changes the loss.

A ZO step θ ← θ − η·ĝ·z is the gradient step plus noise, and the noise adds up to a random walk of
length ‖θ − θ₀‖² ≈ η²·d·Σₜ ĝₜ². To second order a displacement r·u, u a random unit direction, changes F by

    F(θ + r·u) − F(θ) = r·uᵀ∇F + ½·r²·uᵀHu,        E_u[uᵀHu] = tr H / d,

and the mean over ±u keeps only the curvature: ½·(F(θ+ru) + F(θ−ru)) − F(θ) = ½·r²·uᵀHu. Where
tr H < 0 (F concave along most directions, as where new examples are confidently wrong) the walk
itself lowers F, so at one rate a sampler with a larger E[ĝ²] descends faster: noise-assisted
descent, the part of uniform's progress that importance sampling gives up by shrinking E[ĝ²]. At the
radii a run walks (‖θ − θ₀‖ of 10–30 on LoRA) the second-order picture need not hold, so the change
is measured at each radius rather than extrapolated.

Example (a quadratic F = ½·θᵀAθ: the ± mean is ½·r²·uᵀAu exactly, and A = c·I gives c for every u):
    >>> theta = torch.nn.Parameter(torch.zeros(6))
    >>> walk = random_walk_descent(lambda: float(0.5 * 3.0 * theta.detach().pow(2).sum()), [theta],
    ...                            radii=[0.5, 2.0], draws=3)
    >>> [round(c, 4) for c in walk["curvature"]], [round(c, 4) for c in walk["changes"][1]]
    ([3.0, 3.0], [6.0, 6.0, 6.0])
"""
from __future__ import annotations

import numbers
from typing import Callable

import torch

from ..engine import _check_disjoint, _check_params
from ..validation import check_count, check_number, check_seed

__all__ = ["displaced_losses", "random_walk_descent", "expected_step_change"]


@torch.no_grad()
def displaced_losses(loss: Callable[[], float], params, *, radius: float, draws: int = 4,
                     seed: int = 0) -> torch.Tensor:
    """F(θ + radius·u) and F(θ − radius·u) for ``draws`` seeded random unit directions u (Gaussian,
    normalised over all of ``params`` together): float64 [draws, 2]. θ is restored exactly. ``params`` are
    checked as MeZO checks a param group (ValueError: none, a tensor twice or two sharing memory, whose
    displacement the norm counted twice, integer tensors)."""
    try:        # an infinite radius made every displaced loss nan; 2.5 draws were range's TypeError
        radius, draws = check_number("radius", radius, 0.0, closed_low=False), check_count("draws", draws)
    except ValueError:
        raise ValueError(f"Invalid radius or draws: {radius!r}, {draws!r} (expected a finite radius > 0, "
                         "an int draws ≥ 1)") from None
    seed = check_seed("seed", seed)    # 1.5, True or 2**70 were torch's RuntimeError at the first draw
    params = _check_params(params)     # none was a ZeroDivisionError; a tensor given twice moved radius/√2
    _check_disjoint(params)
    saved = [p.detach().clone() for p in params]
    generator = torch.Generator().manual_seed(seed)
    out = torch.zeros(draws, 2, dtype=torch.float64)
    try:
        for k in range(draws):
            u = [torch.randn(p.shape, generator=generator, dtype=torch.float64) for p in params]
            scale = radius / sum(float(x.pow(2).sum()) for x in u) ** 0.5
            for j, sign in enumerate((1.0, -1.0)):
                for p, s, x in zip(params, saved, u):     # from θ each time: no ± round-off drift
                    p.copy_(s + (sign * scale * x).to(p.dtype).to(p.device))
                _check_moved(params, saved, radius)
                out[k, j] = float(loss())
    finally:
        for p, s in zip(params, saved):
            p.copy_(s)
    return out


def _check_moved(params, saved, radius: float) -> None:
    """θ moved by ``radius`` (to 1%) in the tensors' own dtype, else ValueError: bfloat16 rounds a small
    displacement of large weights away (each entry moves by less than half its ulp), and the losses, hence the
    curvature, were those of a shorter displacement or of θ itself, without a word."""
    # the difference in the tensor's dtype is exact or off by half an ulp of it: far below the 1% asked
    moved = sum(float(torch.linalg.vector_norm(p.detach() - s, dtype=torch.float64)) ** 2
                for p, s in zip(params, saved)) ** 0.5
    if not abs(moved - radius) <= 0.01 * radius:
        dtypes = ", ".join(sorted({str(p.dtype).removeprefix("torch.") for p in params}))
        raise ValueError(f"Invalid radius: {radius:g} (the tuned tensors' dtype, {dtypes}, rounds a displacement of "
                         f"this radius from θ to one of {moved:.3g}; use float32 tensors or a larger radius)")


def random_walk_descent(loss: Callable[[], float], params, *, radii, draws: int = 4, seed: int = 0) -> dict:
    """What a random displacement of each radius does to F, from ``draws`` ± pairs per radius.

    Returns ``{"F": F(θ), "radii": [...], "changes": [[½(F₊ + F₋) − F per draw] per radius],
    "mean_change": [mean of those, relative to F(θ)], "curvature": [2·mean change / r², the
    estimate of tr H / d at that radius]}``. Negative changes: the walk alone lowers F.
    """
    params = _check_params(params)     # once: a generator (model.parameters()) was spent by the first radius
    # each radius as displaced_losses checks it, before F(θ) is computed: float() took True as 1 and "0.5" as 0.5
    radii = radii.tolist() if isinstance(radii, torch.Tensor) and radii.dim() == 1 else radii
    if isinstance(radii, (numbers.Number, str, bytes, torch.Tensor)):
        raise ValueError(f"Invalid radii: {radii!r} (expected a list of radii > 0)")
    radii = [check_number("radii", r, 0.0, closed_low=False) for r in radii]
    draws, seed = check_count("draws", draws), check_seed("seed", seed)
    start = float(loss())
    out = {"F": start, "radii": radii, "changes": [], "mean_change": [], "curvature": []}
    for r in out["radii"]:
        pairs = displaced_losses(loss, params, radius=r, draws=draws, seed=seed)
        changes = (pairs.mean(dim=1) - start).tolist()
        mean = sum(changes) / len(changes)
        out["changes"].append(changes)
        out["mean_change"].append(mean / start if start else float("nan"))
        out["curvature"].append(2 * mean / r ** 2)
    return out


def expected_step_change(lr: float, grad_sq: float, mean_sq_step: float, trace_h: float) -> dict:
    """A ZO step's expected change of F, to second order, split into its two parts:

        E[ΔF] ≈ −η·‖∇F‖²  +  ½·η²·E[ĝ²]·tr H
                 (the mean path, GD's)   (the noise: θ ← θ − η·ĝ·z with E[z zᵀ] = I)

    treating ĝ² and zᵀHz as uncorrelated. With tr H < 0 the noise part is a descent too, and it
    grows with E[ĝ²], the quantity importance sampling shrinks.

    Example (E[ĝ²] = 60 at η = 2.5e-4 and tr H = −78 add 42% to the descent GD gets from ‖∇F‖² = 1.4):
        >>> parts = expected_step_change(2.5e-4, 1.4, 60.0, -78.0)
        >>> round(parts["gradient"] * 1e4, 2), round(parts["noise"] * 1e4, 2), round(parts["noise_share"], 2)
        (-3.5, -1.46, 0.29)
    """
    # a rate ≤ 0 or a negative square made a "descent" out of an ascent (lr = −1: gradient part +1), without a word
    lr = check_number("lr", lr, 0.0, closed_low=False)
    grad_sq, mean_sq_step = check_number("grad_sq", grad_sq, 0.0), check_number("mean_sq_step", mean_sq_step, 0.0)
    trace_h = check_number("trace_h", trace_h)
    gradient, noise = -lr * grad_sq, 0.5 * lr ** 2 * mean_sq_step * trace_h
    total = gradient + noise
    return {"gradient": gradient, "noise": noise, "total": total, "noise_share": noise / total if total else float("nan")}

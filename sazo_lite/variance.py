"""Plain maths of importance-sampled ZO estimates (notation: the course's algorithm page, notebooks/algorithm.md).

With per-example gradients a_i = ∇f_i, sampling distribution p and B i.i.d. draws:

    E‖ĝ‖² = (d+2) · [ (1/B)·V(p) + (1 − 1/B)·‖∇F‖² ],   V(p) = (1/N²) Σ_i ‖a_i‖² / p_i
    p*_i = ‖a_i‖ / Σ_j ‖a_j‖,   V(p*) = ((1/N) Σ_i ‖a_i‖)²,   V(u)/V(p*) = 1 + CV²

The mixture every sampler draws from and its importance weights are written once, here:

    p_i = (1−λ)·s_i/S + λ/N   (``mixed_probabilities``),    w_i = 1/(N·p_i)   (``importance_weights``)
"""
from __future__ import annotations

import math

import numpy as np
import torch

from .validation import check_count, check_fraction, check_int, check_number, dense_tensor

__all__ = ["mixed_probabilities", "relative_scores", "importance_weights", "distribution", "oracle_probs",
           "sampling_variance", "variance_ratio", "uniform_gain", "zo_second_moment", "tv_distance", "spearman",
           "mix_with_uniform", "paired_vectors"]


def mixed_probabilities(scores, total: float, uniform_mix: float, num_examples: int):
    """p_i = (1−λ)·s_i/S + λ/N for scores s_i ≥ 0 (uniform 1/N when S ≤ 0 or not finite), λ ∈ [0, 1].

    ``scores`` (a float64 numpy array or torch tensor, returned in kind) may be a subset of the
    N scores (e.g. the sampled ones); ``total`` is S = Σ_j s_j over all N.

    Example:
        >>> mixed_probabilities(torch.tensor([1.0, 3.0], dtype=torch.float64), 4.0, 0.5, 2).tolist()
        [0.375, 0.625]
    """
    num_examples = check_count("num_examples", num_examples)
    # a Python float: a numpy float32 λ computed 1 − λ in float32, not the λ a state reloads
    uniform_mix = check_fraction("uniform_mix", uniform_mix, 0.0, 1.0, closed_low=True, closed_high=True)
    if 0.0 < uniform_mix and uniform_mix / num_examples == 0.0:   # the mix would no longer keep every p_i > 0
        raise ValueError(f"Invalid uniform_mix: {uniform_mix!r} (λ/N underflows to 0 at N = {num_examples})")
    if not (total > 0 and math.isfinite(total)):
        if isinstance(scores, torch.Tensor):
            return torch.full_like(scores, 1.0 / num_examples)
        return np.full(np.shape(scores), 1.0 / num_examples)
    return (1.0 - uniform_mix) * (scores / total) + uniform_mix / num_examples


def relative_scores(scores):
    """scores / max(scores) (unchanged when every score is 0; numpy or torch, returned in kind).

    p* and the variance ratios are scale-free; on the raw norms a sum or a square near float64's
    maximum overflows to inf (p* fell back to uniform, V(u)/V(p*) was NaN).
    """
    peak = float(scores.max()) if len(scores) else 0.0
    return scores / peak if peak > 0.0 and math.isfinite(peak) else scores


def importance_weights(probs, num_examples: int):
    """w_i = 1/(N·p_i): E_{i~p}[w_i·f_i] = (1/N)·Σ_i f_i for any p with full support.

    Example:
        >>> importance_weights(torch.tensor([0.25, 0.5], dtype=torch.float64), 4).tolist()
        [1.0, 0.5]
    """
    return 1.0 / (num_examples * probs)


def _read(name: str, x, *, nonnegative: bool) -> tuple[torch.Tensor, torch.dtype]:
    """``x`` as a float64 vector of at least one finite entry (each ≥ 0 when ``nonnegative``), and the dtype it
    was given in; or ValueError naming ``name``: a negative norm gave negative probabilities, NaN or ∞ fell
    back to uniform (1 + CV² read 1) or ranked anywhere, complex values lost their imaginary part, booleans read
    as 0 and 1, a row [[…]] was read as one example, and an empty vector divided by N = 0 (ZeroDivisionError)."""
    tensor = dense_tensor(name, x)   # Python floats in float64: in float32 a TV of 0.2 read 0.19999999925
    if tensor.is_complex() or tensor.dtype == torch.bool:
        raise ValueError(f"Invalid {name}: dtype {tensor.dtype} (expected real numbers)")
    given, tensor = tensor.dtype, tensor.detach().to("cpu", torch.float64)
    if tensor.dim() != 1 or not len(tensor):
        raise ValueError(f"Invalid {name}: shape {tuple(tensor.shape)} (expected a vector, one entry per example)")
    if not bool(torch.isfinite(tensor).all()) or (nonnegative and bool((tensor < 0).any())):
        raise ValueError(f"Invalid {name}: entries must be finite{' and non-negative' if nonnegative else ''}")
    return tensor, given


def _check_total(name: str, probs: torch.Tensor, given: torch.dtype) -> None:
    """ValueError naming ``name`` unless the entries ``probs`` (≥ 0, read from ``given``) sum to 1 within
    ``_sum_tolerance``: scores or unnormalised weights given as p made a TV distance above 1, a V(p) off by
    the factor Σp, a variance ratio below 1 and a 'mixture' that was no distribution."""
    total, tolerance = float(probs.sum()), _sum_tolerance(len(probs), given)
    if not abs(total - 1.0) <= tolerance:
        raise ValueError(f"Invalid {name}: entries sum to {total!r} (expected a distribution: entries >= 0 "
                         f"summing to 1 within {tolerance:.3g})")


# The most any vector's sum may be off and still be read as a distribution: a correctly rounded distribution is
# within its dtype's unit roundoff (2⁻⁸ for bfloat16) and a float32 one of 2²⁴ entries within 8·sqrt(n)·eps = 3.9e-3;
# without it the half-precision tolerance passed 1 (bfloat16 from n = 256, float16 from 16,384) and a vector summing
# to 1.9 was a distribution: a TV of 0.45 against uniform, V(p)/V(p*) = 0.65, a sampler's weights 2/3 of 1/(N·p).
_SUM_TOLERANCE_MAX = 1e-2


def _sum_tolerance(n: int, dtype: torch.dtype) -> float:
    """How far from 1 a distribution of ``n`` entries given in ``dtype`` may sum: 1e-5 (``llm.queries``' rule for
    the p it diagnoses; a sampler's p carries the float32 rounding of its sum trees' root, up to
    ⌈log₂N⌉·2⁻²⁴ ≤ 1.7e-6 relative), or, where larger, 8·sqrt(n)·eps(dtype): a float32 or half vector computed
    as p (a softmax) rounds its sum by about sqrt(n)·eps; never more than ``_SUM_TOLERANCE_MAX`` (1%)."""
    eps = torch.finfo(dtype).eps if dtype.is_floating_point else 0.0
    return max(1e-5, min(8.0 * math.sqrt(n) * eps, _SUM_TOLERANCE_MAX))


def _vector(name: str, x, *, nonnegative: bool) -> torch.Tensor:
    """``_read``'s vector."""
    return _read(name, x, nonnegative=nonnegative)[0]


def _nonnegative(name: str, x) -> torch.Tensor:
    """Norms: ``_vector`` of entries ≥ 0."""
    return _vector(name, x, nonnegative=True)


def distribution(name: str, probs, num_examples: int | None = None) -> torch.Tensor:
    """``probs`` as a float64 CPU vector of finite entries ≥ 0 summing to 1 (``_check_total``'s tolerance), of
    ``num_examples`` entries if given, or ``ValueError("Invalid <name>: ...")``: the distribution a sampler draws
    from and weights by, and the p ``mix_with_uniform`` takes.

    Example:
        >>> distribution("probs", [0.25, 0.75], 2).tolist()
        [0.25, 0.75]
    """
    num_examples = None if num_examples is None else check_count("num_examples", num_examples)
    probs, given = _read(name, probs, nonnegative=True)
    if num_examples is not None and probs.shape != (num_examples,):   # before the sum: named by its shape
        raise ValueError(f"Invalid {name}: shape {tuple(probs.shape)} (expected ({num_examples},), one probability "
                         f"per example)")
    _check_total(name, probs, given)
    return probs


# Arguments that hold norms (≥ 0) or probabilities (≥ 0, summing to 1): ``paired_vectors`` checks them so.
_NONNEGATIVE = ("norms", "probs", "p", "q")
_DISTRIBUTIONS = ("probs", "p", "q")


def paired_vectors(first: str, a, second: str, b) -> tuple[torch.Tensor, torch.Tensor]:
    """``a`` and ``b`` as float64 CPU vectors of one length, each checked as the helpers here check their
    arguments: at least one finite real entry, ≥ 0 when its name is "norms", "probs", "p" or "q", and summing
    to 1 (``_check_total``) when it is "probs", "p" or "q"; else ``ValueError("Invalid <name>: ...")`` naming
    the argument at fault (``second`` for a length that differs: torch broadcast a length-1 vector against the
    other silently, and V(p) of 3 norms with 1 probability was a number). ``first`` and ``second`` are the
    arguments' names, as the caller's signature spells them.

    Example:
        >>> norms, probs = paired_vectors("norms", [3.0, 4.0], "probs", [0.5, 0.5])
        >>> norms.dtype, probs.tolist()
        (torch.float64, [0.5, 0.5])
    """
    (a, a_given), (b, b_given) = _read(first, a, nonnegative=first in _NONNEGATIVE), \
        _read(second, b, nonnegative=second in _NONNEGATIVE)
    if a.shape != b.shape:
        raise ValueError(f"Invalid {second}: shape {tuple(b.shape)} does not match the shape of {first}, "
                         f"{tuple(a.shape)} (expected two vectors of one length)")
    for name, vector, given in ((first, a, a_given), (second, b, b_given)):
        if name in _DISTRIBUTIONS:   # after the lengths: a shorter p is named by its shape, not its sum
            _check_total(name, vector, given)
    return a, b


_paired = paired_vectors   # the name the helpers below call (and copies of their source, in the lab tests)


def oracle_probs(norms) -> torch.Tensor:
    """p* ∝ ‖∇f_i‖ (uniform if every norm is 0): ``mixed_probabilities`` with λ = 0."""
    norms = relative_scores(_nonnegative("norms", norms))
    return mixed_probabilities(norms, float(norms.sum()), 0.0, len(norms))


def mix_with_uniform(probs, uniform_mix: float) -> torch.Tensor:
    """(1−λ)·p + λ/N for a distribution p (entries ≥ 0 summing to 1): ``mixed_probabilities`` with S = 1."""
    probs = distribution("probs", probs)
    uniform_mix = check_fraction("uniform_mix", uniform_mix, 0.0, 1.0, closed_low=True, closed_high=True)
    return mixed_probabilities(probs, 1.0, uniform_mix, len(probs))


def sampling_variance(norms, probs) -> float:
    """V(p) = (1/N²) Σ_i ‖∇f_i‖² / p_i: the only p-dependent part of E‖ĝ‖².

    Summed on the norms scaled by a power of two near their largest, then scaled back: the same bits as the plain
    sum wherever that stays in range, and the square of a norm above ~1.3e154 no longer overflows (one norm of
    1.5e154 among 100 zeros gave V = inf for 2.25e306)."""
    norms, probs = _paired("norms", norms, "probs", probs)
    n = len(norms)
    exponent = min(max(math.frexp(float(norms.max()))[1], -_SCALE_MAX), _SCALE_MAX)
    scaled = norms * 2.0 ** -exponent   # exact: a power of two
    terms = torch.where(scaled > 0, scaled ** 2 / probs, torch.zeros_like(scaled))
    return _times_power_of_two(float(terms.sum()) / n ** 2, 2 * exponent)


# the largest binary exponent ``sampling_variance`` scales by: 2^±1000 is a normal float64, and every norm scaled
# by it lies below 2^24 (the largest float64 is below 2^1024)
_SCALE_MAX = 1000


def _times_power_of_two(value: float, exponent: int) -> float:
    """value · 2^exponent, exact where it is a normal number; ±inf beyond float64 (``math.ldexp`` raises there)."""
    try:
        return math.ldexp(value, exponent)
    except OverflowError:
        return math.copysign(math.inf, value)


def _zero_below(norms: torch.Tensor, atol) -> torch.Tensor:
    """``norms`` with the entries ≤ ``atol`` (a finite number ≥ 0) set to 0: norms that are rounding noise.

    At an optimum every per-example gradient is 0 but for rounding (a least-squares fit with N ≤ d: each
    residual is a few ulps of the data), and the ratios of rounding noise are numbers of their own (1 + CV²
    about 2 for noise spread evenly), not a property of the data. Only the caller knows the rounding of its
    norms: of the order of d · finfo(dtype).eps times their size away from the optimum (‖x_i‖·‖y‖ for least
    squares from θ = 0), so ``atol`` is a multiple of that. 0 keeps every norm.
    """
    atol = check_number("atol", atol, 0.0)
    return torch.where(norms > atol, norms, torch.zeros_like(norms)) if atol > 0 else norms


def variance_ratio(norms, probs, *, atol: float = 0.0) -> float:
    """V(p)/V(p*) ≥ 1: how far p is from the minimum-variance oracle (1.0 when every norm is 0).

    Norms ≤ ``atol`` count as 0 (``_zero_below``: rounding noise at an optimum; default 0, none)."""
    probs = dense_tensor("probs", probs)    # kept in its dtype: V(p) checks it again, with that dtype's tolerance
    norms, _ = _paired("norms", norms, "probs", probs)
    norms = relative_scores(_zero_below(norms, atol))
    optimum = sampling_variance(norms, oracle_probs(norms))
    return sampling_variance(norms, probs) / optimum if optimum > 0 else 1.0


def uniform_gain(norms, *, atol: float = 0.0) -> float:
    """1 + CV² of the per-example norms, which equals V(u)/V(p*) (1.0 when every norm is 0).

    Norms ≤ ``atol`` count as 0 (``_zero_below``: at an optimum the norms are rounding noise, whose
    1 + CV² is about 2 whatever the data; default 0, none)."""
    norms = relative_scores(_zero_below(_nonnegative("norms", norms), atol))
    mean = norms.mean()
    return float(1.0 + norms.var(unbiased=False) / mean ** 2) if mean > 0 else 1.0


def zo_second_moment(norms, probs, full_grad_norm: float, dim: int, batch_size: int) -> float:
    """E‖ĝ‖² for Gaussian z and B i.i.d. importance-sampled examples (exact for linear f_i)."""
    dim, batch_size = check_int("dim", dim, 0), check_count("batch_size", batch_size)
    full_grad_norm = check_number("full_grad_norm", full_grad_norm, 0.0)
    v = sampling_variance(norms, probs)
    # ‖∇F‖² as a float product (inf beyond range): ``** 2`` raised OverflowError above ~1.3e154, even for B = 1,
    # whose estimate does not depend on it
    between = (1.0 - 1.0 / batch_size) * (full_grad_norm * full_grad_norm) if batch_size > 1 else 0.0
    return (dim + 2) * (v / batch_size + between)


def tv_distance(p, q) -> float:
    """Total-variation distance ½ Σ |p_i − q_i| ∈ [0, 1]."""
    p, q = _paired("p", p, "q", q)
    return 0.5 * float((p - q).abs().sum())


def _ranks(x: torch.Tensor) -> torch.Tensor:
    """Average ranks (ties share the mean rank), as Spearman's ρ needs."""
    order = torch.argsort(x, stable=True)
    ranks = torch.empty_like(x)
    ranks[order] = torch.arange(len(x), dtype=x.dtype)
    values, inverse, counts = torch.unique(x, return_inverse=True, return_counts=True)
    sums = torch.zeros(len(values), dtype=x.dtype).index_add_(0, inverse, ranks)
    return (sums / counts)[inverse]


def spearman(a, b) -> float:
    """Spearman rank correlation of two vectors (0 if either is constant)."""
    a, b = _paired("a", a, "b", b)
    ra, rb = _ranks(a), _ranks(b)
    ra, rb = ra - ra.mean(), rb - rb.mean()
    denom = float(ra.norm() * rb.norm())
    return float((ra * rb).sum()) / denom if denom > 0 else 0.0

"""Seeds and random directions: the leaf every MeZO pass draws z from (imports torch only).

A step seed s = derive_seed(base seed, step); tensor k of a pass uses derive_seed(s, k);
z for that tensor is regenerated from it with an explicit ``torch.Generator``, so z is
never stored and does not depend on the global RNG. torch's CPU generator (mt19937) keeps the low
32 bits of a seed, so on the CPU z depends on derive_seed(s, k) mod 2³² (CUDA's Philox takes all
64 bits): two steps repeat one tensor's z with probability 2⁻³² per pair (docs/guarantees.md).

Example:
    >>> import torch
    >>> a = draw_direction(torch.empty(3), derive_seed(0, 1), "gaussian", torch.Generator())
    >>> b = draw_direction(torch.empty(3), derive_seed(0, 1), "gaussian", torch.Generator())
    >>> torch.equal(a, b)
    True
"""
from __future__ import annotations

import torch

__all__ = ["PERTURBATIONS", "Z_BOUND", "derive_seed", "draw_direction", "rademacher_signs", "z_dtype",
           "check_perturbation"]

PERTURBATIONS = ("gaussian", "rademacher")
# |z| never exceeds this: torch's randn is Box-Muller on 24-bit (float32) or 53-bit (float64)
# uniforms, so |z| <= sqrt(-2 ln 2^-53) ≈ 8.6; Rademacher z is ±1. Used to refuse updates
# whose coefficient would overflow a parameter's dtype before they are applied.
Z_BOUND = 9.0
_MASK64 = (1 << 64) - 1


def _splitmix64(x: int) -> int:
    x = (x + 0x9E3779B97F4A7C15) & _MASK64
    x = ((x ^ (x >> 30)) * 0xBF58476D1CE4E5B9) & _MASK64
    x = ((x ^ (x >> 27)) * 0x94D049BB133111EB) & _MASK64
    return x ^ (x >> 31)


def derive_seed(*parts: int) -> int:
    """Hash integers into a 63-bit seed (SplitMix64), stable across runs and platforms.

    Example:
        >>> derive_seed(0, 1) == derive_seed(0, 1) != derive_seed(0, 2)
        True
    """
    h = 0
    for part in parts:
        h = _splitmix64(h ^ (int(part) & _MASK64))
    return h >> 1


def z_dtype(like: torch.Tensor) -> torch.dtype:
    """The dtype z is drawn in: the parameter's for float32/64, float32 for half precision."""
    return like.dtype if like.dtype in (torch.float32, torch.float64) else torch.float32


def draw_direction(like: torch.Tensor, seed: int, perturbation: str,
                   generator: torch.Generator) -> torch.Tensor:
    """Regenerate the random direction z for one parameter tensor from its seed.

    Half-precision parameters get z drawn in float32 (then rounded once by the in-place
    add); float32/float64 parameters get z in their own dtype.
    """
    dtype = z_dtype(like)
    generator.manual_seed(seed)
    if perturbation == "gaussian":
        return torch.randn(like.shape, generator=generator, device=like.device, dtype=dtype)
    check_perturbation(perturbation)
    return rademacher_signs(like.numel(), dtype, like.device, generator).view(like.shape)


def check_perturbation(perturbation) -> str:
    """``perturbation`` when it names a kind of z (``PERTURBATIONS``), else ``ValueError("Invalid perturbation:
    ...")``: where z is chosen by ``perturbation == "gaussian"``, a typo ("gausian", "Gaussian") drew ±1 signs
    silently."""
    if not (isinstance(perturbation, str) and perturbation in PERTURBATIONS):
        raise ValueError(f"Invalid perturbation: {perturbation!r} (expected one of {PERTURBATIONS})")
    return perturbation


def rademacher_signs(numel: int, dtype: torch.dtype, device, generator: torch.Generator) -> torch.Tensor:
    """``numel`` independent ±1 (probability ½ each), 8 from every random byte the generator draws.

    Each byte b picks row b of a 256 × 8 table of its bits' signs, which is much cheaper than
    one ``bernoulli_`` draw per sign (``make bench`` has the figures). The generator hands out
    one byte per element in order, so drawing 8·k signs at a time continues the same stream
    (``sazo_lite.noise.TorchNoise`` draws large tensors in chunks). Besides z (4·n bytes in
    float32) it holds the ⌈n/8⌉ draws as int64 (n bytes) for a moment.
    """
    random_bytes = torch.randint(0, 256, ((numel + 7) // 8,), generator=generator, device=device)  # int64
    return _sign_table(dtype, torch.device(device)).index_select(0, random_bytes).view(-1)[:numel]


_SIGN_TABLES: dict[tuple[torch.dtype, torch.device], torch.Tensor] = {}


def _sign_table(dtype: torch.dtype, device: torch.device) -> torch.Tensor:
    """[256, 8]: row b holds 2·bit_k(b) − 1 for k = 0..7 (built once per dtype and device)."""
    key = (dtype, device)
    if key not in _SIGN_TABLES:
        bits = (torch.arange(256).unsqueeze(1) >> torch.arange(8)) & 1
        _SIGN_TABLES[key] = (2 * bits - 1).to(dtype=dtype, device=device)
    return _SIGN_TABLES[key]

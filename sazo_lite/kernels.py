"""A Triton kernel for MeZO's pass: z generated in registers, θ read once and written once.

For element i of a tensor with seed s (s = derive_seed(step seed, tensor index)):

    z_i = tl.randn(s, i)              Philox normal, keyed by all 63 bits of s
    z_i = 1 − 2·(tl.randint(s, i) & 1)    for Rademacher
    θ_i ← shrink·θ_i + c·z_i          computed in float32, stored in θ's dtype

z never exists in memory, so a pass costs one read and one write of θ, with no temporary of
any size. The directions differ from torch's ``randn`` (another generator): runs with
``TritonNoise`` are reproducible with ``TritonNoise`` only, and ``SeedLog`` refuses them.

Triton is optional (``pip install triton``; it needs a CUDA GPU, or ``TRITON_INTERPRET=1`` set
before the first import of triton to run the same kernel on CPU tensors, far slower than
torch). Without it, ``TritonNoise`` sends every tensor to its fallback (``TorchNoise``) and says so in
``usable``/``reason``; its ``description`` (what a ``MeZO`` state records) is then the fallback's.

Example (on a GPU)::

    >>> opt = MeZO(model.parameters(), lr=1e-6, noise=TritonNoise())   # doctest: +SKIP
"""
from __future__ import annotations

import numbers
import os

import torch

from .directions import check_perturbation
from .noise import Job, TorchNoise, _Threaded, check_source, describe

__all__ = ["TritonNoise", "triton_available", "triton_direction"]

_KERNEL = None
# The kernel's element ids are int32 (program id × BLOCK + lane, up to the tensor's size rounded up to a whole
# BLOCK): past 2³¹ they wrap to negative ids, which the `offsets < numel` mask lets through, so a tensor whose
# padded size exceeds this goes to the fallback.
MAX_KERNEL_ENTRIES = 2 ** 31


def triton_available() -> tuple[bool, str]:
    """(usable, reason): triton importable and either a CUDA device or the interpreter."""
    try:
        import triton  # noqa: F401
    except ImportError:
        return False, "triton is not installed (pip install triton)"
    if torch.cuda.is_available() or os.environ.get("TRITON_INTERPRET") == "1":
        return True, "cuda" if torch.cuda.is_available() else "interpreter"
    return False, "no CUDA device and TRITON_INTERPRET is not 1"


def _kernel():
    """Compile (once) and return the Triton kernel; imports triton lazily."""
    global _KERNEL
    if _KERNEL is None:
        import triton
        import triton.language as tl

        @triton.jit
        def perturb(theta_ptr, numel, seed, coefficient, shrink,
                    RADEMACHER: tl.constexpr, BLOCK: tl.constexpr):
            offsets = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)   # [BLOCK] element ids
            inside = offsets < numel
            if RADEMACHER:
                z = 1.0 - 2.0 * (tl.randint(seed, offsets) & 1).to(tl.float32)
            else:
                z = tl.randn(seed, offsets)
            theta = tl.load(theta_ptr + offsets, mask=inside).to(tl.float32)
            theta = shrink * theta + coefficient * z
            tl.store(theta_ptr + offsets, theta.to(theta_ptr.dtype.element_ty), mask=inside)

        _KERNEL = perturb
    return _KERNEL


def _launch(theta: torch.Tensor, seed: int, coefficient: float, shrink: float, perturbation: str,
            block: int) -> None:
    numel = theta.numel()
    grid = (-(-numel // block),)
    # the whole seed (< 2⁶³, an int64 argument): Philox takes a 64-bit key, and the seed reduced mod 2³¹ gave
    # seeds s and s + 2³¹ the same z (two steps a run drew alike for a tensor, after about 2¹⁶ steps)
    _kernel()[grid](theta, numel, int(seed), float(coefficient), float(shrink),
                    RADEMACHER=perturbation == "rademacher", BLOCK=block)


def triton_direction(like: torch.Tensor, seed: int, perturbation: str, *, block: int = 1024) -> torch.Tensor:
    """The kernel's z for one tensor, materialised in float32 (tests and teaching)."""
    check_perturbation(perturbation)   # the kernel draws Gaussian z for anything but "rademacher"
    usable, reason = triton_available()   # else triton's own error: "No module named 'triton'", "0 active drivers"
    if not usable:
        raise RuntimeError(f"triton_direction cannot run here: {reason}")
    z = torch.zeros(like.numel(), dtype=torch.float32, device=like.device)
    _launch(z, seed, 1.0, 1.0, perturbation, block)   # 0·1 + 1·z
    return z.view(like.shape)


def _block(block) -> int:
    """Elements per Triton program: a power of two >= 16, as the int the kernel's constexpr takes (a numpy int)."""
    if isinstance(block, bool) or not isinstance(block, numbers.Integral) or block < 16 or block & (block - 1):
        raise ValueError(f"Invalid block: {block!r} (expected a power of two >= 16)")
    return int(block)


class TritonNoise(_Threaded):
    """MeZO passes through the Triton kernel; falls back to ``TorchNoise`` where it cannot run.

    Args:
        block: elements per Triton program (a power of two; ≥ 65536 under the interpreter,
            whose cost is per program).
        fallback: the source used for tensors the kernel cannot take (non-contiguous, float64, more
            than ``MAX_KERNEL_ENTRIES`` entries once rounded up to a whole block, off the GPU when
            the kernel is compiled for CUDA (a CPU-offloaded tensor), or when triton is unusable);
            default ``TorchNoise()``.
    """

    def __init__(self, block: int = 1024, fallback=None):
        super().__init__(workers=1)
        self.block = _block(block)
        # checked here: a fallback without apply (a name, a class) raised from inside the first pass it took
        self.fallback = check_source("fallback", fallback, also="None or ") if fallback is not None else TorchNoise()
        self.usable, self.reason = triton_available()

    @property
    def description(self) -> str:
        """What decides its z (``noise.describe``): the kernel's (keyed by 63-bit seeds since round 18) and its
        fallback's for the tensors the kernel cannot take; the fallback's alone where triton is unusable, since
        every tensor then goes to it (a resume between the two was warned although the z were the same)."""
        if not self.usable:
            return describe(self.fallback)
        return f"triton:seed-bits=63,fallback={describe(self.fallback)}"

    def __setstate__(self, state: dict) -> None:
        """Unpickled (a checkpointed optimiser moved to another machine): whether triton runs is this machine's."""
        self.__dict__.update(state)
        self.usable, self.reason = triton_available()

    def _apply_one(self, job: Job, slot: int) -> None:
        p, block = job.param, _block(self.block)   # checked where it is read (an edited block reached the kernel)
        padded = -(-p.numel() // block) * block
        elsewhere = self.reason == "cuda" and p.device.type != "cuda"   # the compiled kernel reads GPU memory only
        if (not self.usable or elsewhere or not p.is_contiguous() or p.dtype == torch.float64
                or padded > MAX_KERNEL_ENTRIES):
            self.fallback.apply([job])
            return
        for _, _, perturbation in job.terms():   # every term checked before the first launch moves θ (the kernel
            check_perturbation(perturbation)      # draws Gaussian z for anything but "rademacher")
        shrink = job.shrink
        for seed, coefficient, perturbation in job.terms():  # a folded job: two launches
            _launch(p, seed, coefficient, shrink, perturbation, block)
            shrink = 1.0

"""Teaching instruments for notebook 02: what a MeZO step costs, counted and measured.

    peak_tensor_bytes(fn)     peak bytes of the tensors ``fn`` allocates that are alive together
    DirectionCounter          a noise source that counts directions drawn and passes over θ
    mezo_step_reference       the textbook four-pass step, to compare against ``MeZO.step``
    step_memory               peaks of inference, a MeZO step and a backprop step, and the path measured

Nothing here patches a module: the counter is a noise source that an optimiser uses (for
the length of a ``with`` block, or for good as ``MeZO(..., noise=DirectionCounter())``).
"""
from __future__ import annotations

import math
import weakref

import torch
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_leaves

from ..directions import derive_seed, z_dtype
from ..engine import MeZO
from ..noise import Job, NoiseSource, PlainNoise
from ..validation import check_number, check_seed

__all__ = ["peak_tensor_bytes", "DirectionCounter", "mezo_step_reference", "count_passes", "step_memory",
           "StepMemory"]


class _PeakTracker(TorchDispatchMode):
    """Counts bytes of tensor storages created inside the mode while they are alive."""

    def __init__(self):
        super().__init__()
        self.live, self.peak, self._seen = 0, 0, set()

    def _free(self, key: int, nbytes: int) -> None:
        self._seen.discard(key)
        self.live -= nbytes

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        inputs = {t.untyped_storage().data_ptr() for t in tree_leaves((args, kwargs))
                  if isinstance(t, torch.Tensor)}  # views and in-place results allocate nothing
        for t in tree_leaves(out):
            if isinstance(t, torch.Tensor):
                storage = t.untyped_storage()
                key, nbytes = storage.data_ptr(), storage.nbytes()
                if nbytes and key not in inputs and key not in self._seen:
                    self._seen.add(key)
                    self.live += nbytes
                    weakref.finalize(storage, self._free, key, nbytes)
        self.peak = max(self.peak, self.live)
        return out


def peak_tensor_bytes(fn):
    """Run ``fn()`` and measure the peak bytes of tensors it allocated that were alive together.

    Tensors that existed before (parameters, inputs) are not counted, nor are views and
    in-place updates of them; gradients that stay alive afterwards are. So for a model:
    inference ≈ the largest pair of activations, backprop ≈ all saved activations + grads.

    Returns:
        (fn's return value, peak bytes as an int).
    """
    tracker = _PeakTracker()
    with tracker:
        result = fn()
    return result, tracker.peak


class DirectionCounter(NoiseSource):
    """A noise source that counts: every direction z drawn and every pass over θ, then hands
    the jobs to another source (default: the plain loop).

    Two ways to use it:
        ``with DirectionCounter(optimizer) as counter:`` puts the counter in front of that
        optimiser's source for the block and restores it afterwards;
        ``MeZO(params, noise=DirectionCounter())`` or ``mezo_step_reference(..., noise=counter)``.

    Attributes:
        calls: directions drawn (one per tensor per pass; two per tensor in a folded pass).
        passes: passes over θ (read and written once each).
        largest_bytes: bytes of the largest z the wrapped source holds at once (the plain
            loop: the largest tensor's whole z, MeZO's only parameter-sized temporary).

    Example:
        >>> theta = torch.zeros(4)
        >>> opt = MeZO([theta], lr=0.1)
        >>> with DirectionCounter(opt) as counter:
        ...     _ = opt.step(lambda: (theta ** 2).sum())
        >>> counter.calls, counter.passes
        (3, 3)
    """

    def __init__(self, optimizer: MeZO | None = None, inner=None):
        if optimizer is not None and not isinstance(optimizer, MeZO):
            raise ValueError(f"Invalid optimizer: {type(optimizer).__name__} (expected a MeZO)")
        self.optimizer, self.inner = optimizer, inner if inner is not None else PlainNoise()
        self.calls = self.passes = self.largest_bytes = 0
        self._saved = None

    @property
    def replayable(self) -> bool:
        return getattr(self.inner, "replayable", False)

    @property
    def directions(self):
        return getattr(self.inner, "directions", id(self.inner))

    def _count(self, jobs: list[Job]) -> None:
        for job in jobs:
            self.calls += len(job.terms())
            size = (self.inner.direction_bytes(job.param) if isinstance(self.inner, NoiseSource)
                    else job.param.numel() * torch.empty(0, dtype=z_dtype(job.param)).element_size())
            self.largest_bytes = max(self.largest_bytes, size)

    def apply(self, jobs: list[Job], done: list | None = None) -> None:
        self.passes += 1
        self._count(jobs)
        if isinstance(self.inner, NoiseSource):
            self.inner.apply(jobs, done)
        else:
            self.inner.apply(jobs)
            if done is not None:
                done.extend(jobs)

    def undo(self, jobs: list[Job]) -> None:
        self.passes += 1
        self._count(jobs)
        self.inner.undo(jobs)

    def __enter__(self) -> "DirectionCounter":
        if self.optimizer is not None and self.optimizer.noise is self:
            # entered again inside its own block: it would hand every job to itself (RecursionError), and its exit
            # would leave itself as the optimiser's source for good
            raise ValueError("Invalid DirectionCounter use: it is already counting this optimiser (a `with` of the "
                             "same counter inside its own block); use one block, or a second DirectionCounter(opt)")
        self.calls = self.passes = self.largest_bytes = 0
        if self.optimizer is not None:
            self._saved = self.optimizer.noise
            self.inner = self._saved if self._saved is not None else self.optimizer._plain
            self.optimizer.noise = self
        return self

    def __exit__(self, exc_type, *exc) -> bool:
        if self.optimizer is not None:
            self.optimizer.noise = self._saved
        elif exc_type is None and self.passes == 0:  # the old, module-patching usage counted silently
            raise ValueError("Invalid DirectionCounter use: it counted nothing; count an optimiser with "
                             "`with DirectionCounter(opt)`, or pass the counter as a noise source "
                             "(MeZO(..., noise=counter), mezo_step_reference(..., noise=counter))")
        return False


def _tensor_list(params) -> list[torch.Tensor]:
    """``params`` as MeZO takes them: a list (or iterable) of floating-point tensors, or a ValueError. A bare
    tensor is refused: enumerating it gives its rows, each with its own z, not MeZO([theta])'s step."""
    if isinstance(params, torch.Tensor):
        raise ValueError(f"Invalid params: a tensor of shape {tuple(params.shape)} (expected a list of tensors, "
                         "e.g. [theta], as MeZO takes them)")
    params = list(params)
    bad = [type(p).__name__ if not isinstance(p, torch.Tensor) else str(p.dtype) for p in params
           if not isinstance(p, torch.Tensor) or not p.is_floating_point()]
    if bad:
        raise ValueError(f"Invalid params: {bad[0]} (expected floating-point tensors)")
    return params


@torch.no_grad()
def mezo_step_reference(params: list[torch.Tensor], closure, eps: float, lr: float, seed: int, *,
                        noise: NoiseSource | None = None) -> float:
    """The textbook MeZO step in four passes (reference for ``MeZO.step``):

        θ += εz;  L+ = f(θ);  θ −= 2εz;  L− = f(θ);  θ += εz;  θ −= η g z,   g = (L+ − L−)/(2ε)

    z for tensor k is regenerated from ``derive_seed(seed, k)`` exactly as ``MeZO`` does, so the
    result matches ``MeZO.step`` with step seed ``seed`` (up to rounding). Returns g. Passes go
    through ``noise`` (default the plain loop; a ``DirectionCounter`` to count them). As ``MeZO.step``,
    it puts θ back when a closure raises, and raises FloatingPointError without the update when g is
    not finite (θ − η·NaN·z would be NaN).
    """
    eps, lr = check_number("eps", eps, 0.0, closed_low=False), check_number("lr", lr, 0.0)   # MeZO's ranges
    seed = check_seed("seed", seed)   # derive_seed reads int(seed): 0.5 ran as seed 0
    params = _tensor_list(params)
    source = noise if noise is not None else PlainNoise()
    at = [0.0]   # θ = θ₀ + at·z

    def move_to(point: float) -> None:
        source.apply([Job(p, derive_seed(seed, index), point - at[0], 1.0, "gaussian")
                      for index, p in enumerate(params)])
        at[0] = point

    try:
        move_to(+eps)
        plus = float(torch.as_tensor(closure()).double().mean())
        move_to(-eps)
        minus = float(torch.as_tensor(closure()).double().mean())
    finally:
        move_to(0.0)   # restore θ (also when a closure raised) ...
    g = (plus - minus) / (2 * eps)
    if not math.isfinite(g):
        raise FloatingPointError(f"losses {plus!r} and {minus!r} give g = {g!r}; parameters restored, not updated")
    move_to(-lr * g)  # ... then update: a fourth pass that MeZO fuses into the third
    return g


def count_passes(optimizer: MeZO, step_fn) -> int:
    """Passes over ``optimizer``'s parameters made while ``step_fn()`` runs (3 a step; 2 folded)."""
    with DirectionCounter(optimizer) as counter:
        step_fn()
    return counter.passes


class StepMemory(dict):
    """``step_memory``'s peaks (bytes by name) plus ``path``: the MeZO noise source measured."""

    def __init__(self, peaks: dict, path: str):
        super().__init__(peaks)
        self.path = path


def step_memory(model: torch.nn.Module, inputs: torch.Tensor, targets: torch.Tensor, loss_fn, *,
                eps: float = 1e-3, lr: float = 1e-4, noise="auto") -> "StepMemory":
    """Peak bytes of live tensors (``peak_tensor_bytes``) for one forward pass and one training step.

    The steps really update ``model`` (with a small lr): pass a throw-away copy if that matters.

    Args:
        noise: the MeZO noise source measured (as for ``MeZO``; "auto" picks the plain loop
            for small models). The result's ``path`` names the source that ran.

    Returns:
        A ``StepMemory`` (a dict) {"parameters": bytes of all parameters, "largest tensor":
        bytes of the largest one, "inference": peak of a no-grad forward, "MeZO step": peak of
        ``MeZO.step``, "backprop step": peak of forward + backward + SGD update (gradients
        included)}, with ``.path``: the noise source of the MeZO step, e.g. "PlainNoise".
    """
    params = [p for p in model.parameters() if p.requires_grad]
    loss = lambda: loss_fn(model(inputs), targets)

    def inference():
        with torch.no_grad():
            return loss()

    def backprop():
        model.zero_grad(set_to_none=True)
        loss().backward()
        with torch.no_grad():
            for p in params:
                if p.grad is not None:   # a trainable tensor the loss does not read (an unused head) gets no grad
                    p -= lr * p.grad
        model.zero_grad(set_to_none=True)

    optimizer = MeZO(params, lr=lr, eps=eps, noise=noise)
    sizes = [p.numel() * p.element_size() for p in params]
    return StepMemory({"parameters": sum(sizes), "largest tensor": max(sizes),
            "inference": peak_tensor_bytes(inference)[1],
            "MeZO step": peak_tensor_bytes(lambda: optimizer.step(loss))[1],
            "backprop step": peak_tensor_bytes(backprop)[1]}, path=type(optimizer.noise_source).__name__)

"""MeZO: a zeroth-order optimiser that needs two forward passes and no backward pass.

One step, with a fresh seed s, smoothing radius ε and per-example losses f_k:

    θ ← θ + εz(s)            evaluate L+ (per example)
    θ ← θ − 2εz(s)           evaluate L− (per example)
    θ ← (1 − η·λ_wd)(θ + εz(s)) − η·g·z(s)       restore and update in one pass

    d_k = (f_k(θ+εz) − f_k(θ−εz)) / (2ε)          per-example directional differences
    g   = mean_k(w_k · d_k)                          projected gradient

z is never stored: it is regenerated from (step seed, tensor index) (``sazo_lite.directions``),
so peak memory is inference memory plus one parameter tensor's worth of z. Every pass goes
through one noise source's ``apply(jobs)`` (``sazo_lite.noise``): ``PlainNoise`` (the plain
loop, ``noise=None``), ``TorchNoise`` (same z bit for bit, chunked and threaded),
``GaussianTable`` (Gaussian z read from circular windows of one white table with a random sign
per window: E[z zᵀ] = I exactly, a fraction of randn's cost; the default for CPU models of
≥ 2²⁰ entries), ``NoiseTable`` (windows of a shared table; biased) or, on CUDA,
``sazo_lite.kernels.TritonNoise``.

What a step guarantees (tested in tests/test_engine_guarantees.py and tests/test_fuzz_core.py):
    * bad arguments (hyperparameters, param groups, state dicts, weights, closure results)
      raise ValueError before θ or the step count change;
    * a pass is atomic: Ctrl-C during a pass is delivered when the pass is complete, and a
      pass that raises part-way is undone tensor by tensor;
    * any failure inside a step (the closure raises or returns a non-finite loss, an
      interrupt, a bad shape, an update that would overflow) shifts θ back to where the step
      started, within the rounding of the shifts made (1 or 2 passes, see
      ``precision.restore_bound``), leaves the step count unchanged, and re-raises.

``fold_updates=True`` folds each step's update into the next step's first pass (2 passes per
step instead of 3; bit for bit the same θ). Between steps the update is then pending: the
parameters hold θ − εz of the last step until ``flush()`` (also called by ``state_dict``,
``load_state_dict``, ``add_param_group``, ``SeedLog.attach`` and ``sazo_lite.train`` before every
evaluation).
"""
from __future__ import annotations

import math
import sys
import warnings
from collections import OrderedDict
from dataclasses import dataclass
from typing import Callable, NamedTuple

import torch
from torch.utils.hooks import RemovableHandle
from torch.utils.weak import WeakIdKeyDictionary

from .directions import PERTURBATIONS, Z_BOUND, derive_seed, draw_direction, rademacher_signs
from .interrupts import InterruptsDeferred as _InterruptsDeferred
from .noise import GaussianTable, Job, NoiseSource, PlainNoise, check_source, describe, drawn
from .validation import (NotNumbersError, check_bool, check_callable, check_choice, check_int, check_number,
                         check_numbers, check_seed, non_real_kinds, not_dense, not_numbers, numpy_readable)

__all__ = ["MeZO", "ZOStep", "StepEvent", "FlatLossWarning", "FlatLossCheck", "NoiseSourceWarning", "derive_seed",
           "draw_direction", "rademacher_signs", "PERTURBATIONS"]


@dataclass(frozen=True)
class ZOStep:
    """What one MeZO step observed.

    Attributes:
        loss: weighted mean of (L+ + L−)/2, a float (finite wherever that mean is: losses near float64's
            largest do not overflow it, see ``_mean``).
        projected_grad: g = mean(weights · directional_diffs), the scalar the update uses.
        directional_diffs: float64 tensor [B] of unweighted (f_k(θ+εz) − f_k(θ−εz))/(2ε);
            empty when the closure returned a scalar.
        seed: the step seed that z was regenerated from.
        losses: float64 tensor [B] of per-example (f_k(θ+εz) + f_k(θ−εz))/2 (empty for scalars).
    """

    loss: float
    projected_grad: float
    directional_diffs: torch.Tensor
    seed: int
    losses: torch.Tensor


class StepEvent(NamedTuple):
    """What a step hook is told: a committed step, or a failed one and the passes it made.

    kind "step": value = the projected gradient g (the update is committed, maybe pending).
    kind "failure": value = 1 (θ was shifted to θ+εz, then back) or 2 (to θ+εz, θ−εz, then back).
    """

    kind: str
    seed: int
    value: float


class FlatLossWarning(RuntimeWarning):
    """A run's first steps saw the loss take exactly the same value at θ+εz and θ−εz, for every
    example: those steps moved nothing (see ``FLAT_STEPS``)."""


class NoiseSourceWarning(UserWarning):
    """A MeZO state loaded into an optimiser whose noise source draws other z than the saved run's (its kind or
    parameters differ, ``noise.describe``): the resumed run goes on along other directions."""


# The flat-loss rule: warn when the first FLAT_STEPS steps, holding at least FLAT_EXAMPLES
# per-example differences in all (a scalar loss counts as one), are all exactly 0. Exactly: a loss
# that merely changes little still differs in its last bits; several steps and examples: a run whose
# data holds some examples the parameters cannot change (a fully masked row) rarely draws only those.
# The first steps only: what the warning is for (merged or disabled adapters, the wrong tensors, ε below
# the loss's precision) is there from the first step, while later in a run exactly flat steps also come
# legitimately (a float32 loss near its minimum changes by less than its last bit: 159 of 200 steps were
# exactly flat there on a least-squares loss offset by 0.5, B = 4, ε = 1e-3; a streak of draws of constant
# examples), and a rule judging every window of a long run would have as many chances of a false alarm as
# the run has windows.
FLAT_STEPS, FLAT_EXAMPLES = 4, 16


class FlatLossCheck:
    """The flat-loss rule over the steps it observes from when it is made: warns ``FlatLossWarning``
    once, when the first ``FLAT_STEPS`` steps (``FLAT_EXAMPLES`` differences in all) were exactly flat.

    ``MeZO`` feeds the one in its ``flat_check`` every committed step (a new one at construction,
    when its param groups change and at ``load_state_dict``); ``sazo_lite.train`` puts a new one there
    at each call, so each call judges its own first steps (and runs one itself for other optimisers).
    """

    def __init__(self):
        self.steps, self.examples, self.done = 0, 0, False

    def observe(self, result) -> None:
        """Count one committed step's ``ZOStep`` (``projected_grad`` and ``directional_diffs``)."""
        if self.done:
            return
        diffs = result.directional_diffs
        if result.projected_grad != 0.0 or bool(diffs.any()):
            self.done = True   # the loss moved: the parameters reach it
            return
        self.steps += 1
        self.examples += max(1, diffs.numel())
        if self.steps >= FLAT_STEPS and self.examples >= FLAT_EXAMPLES:
            self.done = True
            warnings.warn(
                f"the first {self.steps} steps ({self.examples} examples) saw exactly the same loss at θ+εz "
                f"and θ−εz: those steps moved nothing. The tuned parameters may not affect the loss (merged or "
                f"disabled LoRA adapters, the wrong tensors passed to the optimiser, a loss computed without "
                f"them), eps may be too small for the loss's precision, or θ sits where the loss is symmetric",
                FlatLossWarning, stacklevel=_caller_level())


def _frozen_mixed_in(params: list) -> bool:
    """The tensors mix requires_grad=False with True."""
    frozen = sum(not p.requires_grad for p in params)
    return 0 < frozen < len(params)


def _warn_if_frozen_mixed_in(param_groups: list[dict]) -> None:
    """UserWarning when the tensors mix requires_grad=False with True: torch.optim leaves the frozen ones
    alone (they get no gradient), but a ZO step perturbs and updates every tensor it is given, so
    ``MeZO(model.parameters())`` on a model with frozen weights (LoRA, a frozen base) tunes them all."""
    params = [p for group in param_groups for p in group["params"]]
    frozen = sum(not p.requires_grad for p in params)
    if _frozen_mixed_in(params):
        warnings.warn(f"MeZO was given {frozen} tensors with requires_grad=False beside {len(params) - frozen} with "
                      f"requires_grad=True: it perturbs and updates all of them (a zeroth-order step ignores "
                      f"requires_grad). To tune only the trainable ones, pass "
                      f"[p for p in model.parameters() if p.requires_grad]", UserWarning, stacklevel=_caller_level())


def _caller_level() -> int:
    """``warnings.warn``'s stacklevel for the first frame outside sazo_lite and torch (torch.no_grad
    wraps ``step``): the warning names the line of the caller's loop or its call of ``train``."""
    frame, level = sys._getframe(2), 2   # frame 1 called warn; this counts from the one above it
    while frame is not None and frame.f_globals.get("__name__", "").split(".")[0] in ("sazo_lite", "torch"):
        frame, level = frame.f_back, level + 1
    return level


# "auto" noise switches to GaussianTable from this many parameter entries on (below it, e.g. the
# toy problems, a pass is a few µs of Python either way and the plain loop is simplest).
AUTO_NOISE_MIN_ENTRIES = 2 ** 20


def _auto_noise(param_groups: list[dict]):
    """GaussianTable for large all-CPU models, else None (the plain loop).

    On a CPU, drawing z with ``randn`` is most of a pass; reading it from a cached table makes
    the pass a read-write of θ (``make bench`` has the step ratios). Its z are as unbiased as
    randn's (``noise.GaussianTable``) and replayable (``SeedLog`` records the table's name).
    """
    params = [p for group in param_groups for p in group["params"]]
    if any(p.device.type != "cpu" for p in params) or sum(p.numel() for p in params) < AUTO_NOISE_MIN_ENTRIES:
        return None
    return GaussianTable(workers=max(1, min(2, torch.get_num_threads())))


def _check_group(group: dict, defaults: dict) -> dict:
    """Cleaned hyperparameters of one param group (its own values, else the defaults)."""
    merged = {**defaults, **{k: v for k, v in group.items() if k != "params"}}
    return dict(lr=check_number("lr", merged["lr"], 0.0),
                weight_decay=check_number("weight_decay", merged["weight_decay"], 0.0),
                eps=check_number("eps", merged["eps"], 0.0, closed_low=False),
                perturbation=check_choice("perturbation", merged["perturbation"], PERTURBATIONS))


def _check_ordered(params) -> None:
    """Tensor k's z comes from derive_seed(seed, k), so the order matters: a set has none (torch.optim
    refuses sets too)."""
    if isinstance(params, (set, frozenset)):
        raise ValueError("Invalid params: a set of tensors has no order (pass a list)")


def _split_names(params) -> tuple[list | None, list]:
    """``(names, tensors)`` of a group given as ``(name, tensor)`` pairs (``model.named_parameters()``, which
    torch.optim takes since 2.6 and records as the group's ``param_names``), else ``(None, params)``; they were
    refused as "expected tensors, got tuple"."""
    _check_ordered(params)
    params = [params] if isinstance(params, torch.Tensor) else list(params)
    named = [isinstance(p, tuple) for p in params]
    if not any(named):
        return None, params
    if not all(named) or not all(len(p) == 2 and isinstance(p[0], str) for p in params):
        raise ValueError("Invalid params: give every tensor of a group a name, as (name, tensor) pairs, or none")
    return [name for name, _ in params], [tensor for _, tensor in params]


# The dtypes a pass can move in place: torch has no aminmax (the overflow guard) or in-place add for the float8
# types, which raised NotImplementedError from inside the first step.
PASS_DTYPES = (torch.float16, torch.bfloat16, torch.float32, torch.float64)


def _check_params(params) -> list[torch.Tensor]:
    """A group's tensors: at least one, each a dense floating-point tensor with storage of its
    own entries (not on the meta device, no entry shared by two positions)."""
    _check_ordered(params)
    params = [params] if isinstance(params, torch.Tensor) else list(params)
    if not params:
        raise ValueError("Invalid params: a param group holds no tensors")
    for p in params:
        if not isinstance(p, torch.Tensor):
            raise ValueError(f"Invalid params: expected tensors, got {type(p).__name__}")
        if p.is_nested:   # its strides and shape raised torch's "Internal error: NestedTensorImpl doesn't support"
            raise ValueError(f"Invalid params: MeZO perturbs dense floating-point tensors, got a nested {p.dtype} "
                             f"tensor")
        if not p.is_floating_point() or p.layout != torch.strided:
            raise ValueError(f"Invalid params: MeZO perturbs dense floating-point tensors, got "
                             f"{p.dtype} ({p.layout}) of shape {tuple(p.shape)}")
        if p.dtype not in PASS_DTYPES:
            raise ValueError(f"Invalid params: MeZO's passes add z in place to float16, bfloat16, float32 or float64 "
                             f"tensors, got {p.dtype} of shape {tuple(p.shape)}; keep a float32 master copy "
                             f"(sazo_lite.precision.Float32Master)")
        if p.device.type == "meta":
            raise ValueError(f"Invalid params: a tensor of shape {tuple(p.shape)} is on the meta device "
                             f"(no data to perturb); materialise the model's weights first")
        if _overlaps_itself(p):
            raise ValueError(f"Invalid params: a tensor of shape {tuple(p.shape)} with strides {p.stride()} "
                             f"maps several entries to one memory location (an expanded view?); an in-place "
                             f"pass cannot perturb it: pass a contiguous copy")
    return params


# A tensor whose strides the quick test below cannot clear (an ``as_strided`` view whose dims interleave) is
# decided by listing its offsets up to this many entries; a larger one is refused as not shown one-to-one.
EXACT_OVERLAP_ENTRIES = 2 ** 22


def _overlaps_itself(p: torch.Tensor) -> bool:
    """True when two indices of ``p`` address one element (a zero or overlapping stride).

    Strides that each step past everything the smaller ones reach show the map one-to-one at once (every
    tensor torch's own views make). Other strides (``as_strided`` with shape (4, 3) and strides (5, 6): offsets
    0..21, all distinct) are decided exactly by listing the offsets, for up to ``EXACT_OVERLAP_ENTRIES`` entries;
    beyond that such a tensor counts as overlapping (refused: not shown one-to-one)."""
    if p.numel() == 0:
        return False   # no entry to move twice
    dims = sorted((abs(st), size) for st, size in zip(p.stride(), p.shape) if size > 1)
    reach = 1  # elements spanned by the dims so far: the next stride must step past them
    for stride, size in dims:
        if stride < reach:
            break
        reach = stride * (size - 1) + reach
    else:
        return False
    span = 1 + sum(stride * (size - 1) for stride, size in dims)   # locations from the first to the last entry
    if dims[0][0] == 0 or span < p.numel() or p.numel() > EXACT_OVERLAP_ENTRIES:
        return True   # a zero stride; fewer locations than entries; too many entries to list
    offsets = torch.zeros(1, dtype=torch.int64)
    for stride, size in dims:
        offsets = (offsets[:, None] + stride * torch.arange(size, dtype=torch.int64)).view(-1)
    return torch.unique(offsets).numel() < offsets.numel()


def _extent(p: torch.Tensor) -> tuple:
    """(device, first byte, past the last byte) of the memory ``p`` addresses."""
    span = 1 + sum((size - 1) * abs(st) for st, size in zip(p.stride(), p.shape)) if p.numel() else 0
    start = p.data_ptr()
    return str(p.device), start, start + span * p.element_size()


def _check_disjoint(params: list[torch.Tensor]) -> None:
    """Two tensors that share memory would be perturbed twice in one pass: refused. Their byte ranges are compared
    on each device whatever storage holds them: two tensors made from one numpy array (``torch.from_numpy(a)`` and
    ``torch.from_numpy(a[2:])``) have storages of their own over one memory, and passed when only views of one
    storage were compared. Views whose memory ranges interleave without a common entry (the column blocks of one
    matrix) are accepted."""
    spans = sorted((_extent(p), k) for k, p in enumerate(params) if p.numel())
    clusters, reach = [], None   # runs of ranges that overlap one another, on one device
    for (device, start, end), k in spans:
        if reach is None or device != reach[0] or start >= reach[1]:
            clusters.append([])
            reach = (device, end)
        clusters[-1].append(params[k])
        reach = (device, max(reach[1], end))
    for cluster in clusters:   # ranges overlap: look entry by entry
        if len(cluster) > 1 and _share_entries(cluster):
            raise ValueError("Invalid params: two tensors share memory (views of one tensor?); each entry "
                             "must belong to one parameter, or a pass would move it twice")


def _memory(groups: list) -> list[tuple]:
    """Where each tensor's entries lie (first address, shape, strides, dtype, device): a few integers per
    tensor, read at every step. ``p.data = q.data`` (tying two weights) keeps the tensor object but moves
    its memory, possibly onto another tensor's, which a pass would then move twice."""
    return [(p.data_ptr(), p.shape, p.stride(), p.dtype, p.device) for group in groups for p in group["params"]]


def _share_entries(tensors: list[torch.Tensor]) -> bool:
    """True when two of ``tensors`` (on one device) address a common byte: each marks its own bytes
    in one byte per byte of their joint range (only for views whose ranges overlap)."""
    if any(_overlaps_itself(t) for t in tensors):
        return True
    base = min(t.data_ptr() for t in tensors)
    marks = torch.zeros(max(_extent(t)[2] for t in tensors) - base, dtype=torch.uint8)
    for t in tensors:
        size = t.element_size()
        marks.as_strided(tuple(t.shape) + (size,), tuple(st * size for st in t.stride()) + (1,),
                         t.data_ptr() - base).add_(1)
    return bool((marks > 1).any())


_FLOAT_MAX: dict[torch.dtype, float] = {}
_STORED_AS = WeakIdKeyDictionary()   # a master copy → the dtype of the model tensor its values go into


def store_as(tensor: torch.Tensor, dtype: torch.dtype) -> None:
    """Declare ``tensor`` a master copy whose values are also written into a ``dtype`` tensor
    (``precision.Float32Master``): MeZO then refuses shifts and updates that would leave the
    narrower of the two ranges (float16: |x| ≤ 65504), before they change anything."""
    if not isinstance(dtype, torch.dtype) or not dtype.is_floating_point:
        raise ValueError(f"Invalid dtype: {dtype!r} (expected a floating-point torch.dtype)")
    _STORED_AS[tensor] = dtype


def range_dtype(p: torch.Tensor) -> torch.dtype:
    """The dtype whose range ``p``'s values must stay in: its own, or the narrower one it is stored as."""
    stored = _STORED_AS.get(p) if _STORED_AS else None
    if stored is None or torch.finfo(stored).max >= torch.finfo(p.dtype).max:
        return p.dtype
    return stored



# A pass that scales θ by less than this in size cannot be undone by dividing (θ·0 is lost, a
# tiny shrink turns rounding into large errors): ``MeZO._apply`` keeps a copy of those tensors.
UNINVERTIBLE_SHRINK = 0.5


def _keep_uninvertible(jobs: list[Job]) -> list[tuple[torch.Tensor, torch.Tensor]]:
    """(tensor, copy) for the jobs whose shrink an undo cannot divide out (lr·weight_decay > ½)."""
    return [(job.param, job.param.detach().clone()) for job in jobs if abs(job.shrink) < UNINVERTIBLE_SHRINK]


def _fits(value: float, dtype: torch.dtype) -> bool:
    """|value| · Z_BOUND is finite in ``dtype`` (so value·z cannot overflow)."""
    if dtype not in _FLOAT_MAX:
        _FLOAT_MAX[dtype] = torch.finfo(dtype).max
    return math.isfinite(value) and abs(value) * Z_BOUND < _FLOAT_MAX[dtype]


def _plain_group(group: dict) -> bool:
    """The common case, checked fast: float hyperparameters in range and a known perturbation."""
    lr, wd, eps = group["lr"], group["weight_decay"], group["eps"]
    return (type(lr) is float and type(wd) is float and type(eps) is float and 0.0 <= lr < math.inf
            and 0.0 <= wd < math.inf and 0.0 < eps < math.inf and group["perturbation"] in PERTURBATIONS)


def _undecorated(method):
    """The plain function under torch's lazy ``_disable_dynamo`` wrapper (``method`` if there is none).

    torch.optim.Optimizer wraps add_param_group, state_dict and load_state_dict so that
    torch.compile never traces them; the wrapper imports torch._dynamo on its first call, which
    costs seconds of CPU in every fresh process that builds a MeZO. Nothing compiles a ZO
    optimiser's setup or checkpointing, so MeZO calls the plain functions.
    """
    return getattr(method, "__wrapped__", method)


class MeZO(torch.optim.Optimizer):
    """Memory-efficient zeroth-order SGD (Malladi et al., 2023) with per-example diffs.

    Update rule (one step, seed s, per-example weights w):
        g = mean_k(w_k · (f_k(θ+εz) − f_k(θ−εz)) / (2ε)),   θ ← θ − lr·(g·z + weight_decay·θ)

    Args:
        params: iterable of dense floating-point tensors or param-group dicts (keys: params,
            lr, weight_decay, perturbation; eps must be the same in every group).
        lr: step size η ≥ 0.
        eps: smoothing radius ε > 0, shared by all groups.
        weight_decay: decoupled L2 coefficient ≥ 0.
        perturbation: "gaussian" (z ~ N(0, I)) or "rademacher" (z ∈ {±1}^d).
        seed: base of the seed stream; step t uses ``derive_seed(seed, t)``.
        noise: where z comes from. "auto" (default): ``sazo_lite.noise.GaussianTable``
            (Gaussian z from windows of one cached white table, on up to 2 threads) when every
            parameter is on the CPU and they hold ≥ ``AUTO_NOISE_MIN_ENTRIES`` entries in all,
            else the plain loop. ``noise.TorchNoise()`` draws the plain loop's z bit for bit.
            None: the plain loop (``noise.PlainNoise``). Or a ``noise.NoiseSource``
            (or any object with ``apply(jobs)``; one without ``done`` tracking cannot be
            undone if it raises part-way through a pass).
        fold_updates: apply each update together with the next step's +εz (2 passes a step
            instead of 3, same θ bit for bit); the parameters are current only after
            ``flush()``. See the module docstring.

    Warns (``UserWarning``) when the tensors mix requires_grad=False with requires_grad=True: every
    tensor given is perturbed and updated, frozen or not (torch.optim skips tensors without gradients).

    Attributes:
        flat_check: the ``FlatLossCheck`` every committed step feeds: ``step`` warns
            ``FlatLossWarning`` when the first ``FLAT_STEPS`` steps (``FLAT_EXAMPLES`` per-example
            differences in all) saw exactly the same loss at θ+εz and θ−εz (parameters that do not
            reach the loss). A new one is made at construction, when the param groups change and at
            ``load_state_dict``; assign ``FlatLossCheck()`` to judge the next steps afresh, or None to
            turn the check off (``sazo_lite.train`` then leaves it off too).

    Example:
        >>> theta = torch.zeros(3)
        >>> opt = MeZO([theta], lr=0.1, eps=1e-3)
        >>> out = opt.step(lambda: ((theta - 1.0) ** 2).sum(dim=0, keepdim=True))
        >>> out.directional_diffs.shape
        torch.Size([1])
    """

    def __init__(self, params, lr: float, eps: float = 1e-3, *, weight_decay: float = 0.0,
                 perturbation: str = "gaussian", seed: int = 0, noise="auto", fold_updates: bool = False):
        defaults = _check_group({}, dict(lr=lr, eps=eps, weight_decay=weight_decay, perturbation=perturbation))
        seed = check_seed("seed", seed)   # hashed by its low 64 bits: a larger seed would alias another
        auto = isinstance(noise, str) and noise == "auto"   # compared as a str: noise != "auto" of an array is one
        if noise is not None and not auto:
            check_source("noise", noise, also="'auto', None or ")
        self.fold_updates = check_bool("fold_updates", fold_updates)
        self._pending = None  # (source, update jobs) of a folded step, applied by the next pass
        self._pending_versions = None   # its tensors' version counters when it was held (see ``_hold``)
        self._offset = 0      # where θ stands in the step in flight: 0, +1 (θ+εz) or −1 (θ−εz)
        self._step_hooks: OrderedDict[int, Callable] = OrderedDict()
        self._plain = PlainNoise()
        self._in_step = False   # True while step() runs its closure (see _refuse_in_step)
        self._built = False     # add_param_group's warning is the constructor's until it returns
        self.last_step: ZOStep | None = None   # the last committed step's ZOStep (see step())
        self.flat_check = FlatLossCheck()   # fed every committed step: warns when the first ones are exactly flat
        if isinstance(params, torch.Tensor):
            raise ValueError("Invalid params: expected an iterable of tensors or dicts, got a tensor")
        if isinstance(params, dict):   # list() took its keys: "expected tensors, got str"
            raise ValueError("Invalid params: a param group dict on its own; pass a list of groups ([{'params': ...}])")
        _check_ordered(params)
        params = list(params)
        if not params:
            raise ValueError("Invalid params: an empty parameter list")
        if not isinstance(params[0], dict):
            params = [{"params": params}]
        super().__init__(params, defaults)
        self.noise = _auto_noise(self.param_groups) if auto else noise
        self.state[self._first_param()].update(step=0, seed=seed)
        _warn_if_frozen_mixed_in(self.param_groups)
        self._built = True

    def add_param_group(self, param_group: dict) -> None:
        """Validate a group fully (tensors, hyperparameters, the shared eps), then add it. A group without
        an eps takes the one the groups share (other missing values come from the constructor's)."""
        self._refuse_in_step("add_param_group")
        if not isinstance(param_group, dict) or "params" not in param_group:
            raise ValueError(f"Invalid param_group: expected a dict with 'params', got {param_group!r}")
        names, params = _split_names(param_group["params"])
        params = _check_params(params)
        # a group without an eps takes the one all groups share: the constructor's may have been changed since
        shared = {"eps": self.param_groups[0]["eps"]} if self.param_groups and "eps" not in param_group else {}
        cleaned = _check_group({**param_group, **shared}, self.defaults)
        if self.param_groups and cleaned["eps"] != self.param_groups[0]["eps"]:
            raise ValueError(f"Invalid eps: {cleaned['eps']} (all param groups must share one eps)")
        known = [p for group in self.param_groups for p in group["params"]]
        if len({id(p) for p in params}) < len(params) or {id(p) for p in known} & {id(p) for p in params}:
            raise ValueError("Invalid params: some tensors appear in more than one place")
        _check_disjoint(known + params)
        if getattr(self, "_pending", None) is not None:
            self.flush()  # pending jobs are indexed by the current groups
        param_group.update(cleaned, params=params, **({"param_names": names} if names is not None else {}))
        _undecorated(torch.optim.Optimizer.add_param_group)(self, param_group)
        # a group added after construction (the constructor warns for its own groups, once): warned when it makes the
        # tensors mix frozen with trainable ones (a frozen head added beside trainable adapters was tuned silently)
        if getattr(self, "_built", True) and not _frozen_mixed_in(known) and _frozen_mixed_in(known + params):
            _warn_if_frozen_mixed_in(self.param_groups)

    # -- state ---------------------------------------------------------------------------
    def _first_param(self) -> torch.Tensor:
        return self.param_groups[0]["params"][0]

    def _counter(self) -> dict:
        """The state entry holding the step count and seed (kept with the first parameter)."""
        entry = self.state.get(self._first_param()) if self.param_groups and self.param_groups[0].get("params") else None
        if not entry or "step" not in entry:   # was a KeyError from step_count / next_seed
            raise ValueError("Invalid params: the first parameter was replaced or moved; MeZO keeps its step count "
                             "and seed with it (build a new optimiser, or load_state_dict into one)")
        return entry

    @property
    def step_count(self) -> int:
        """Number of completed steps (also the index into the seed stream)."""
        return self._counter()["step"]

    def next_seed(self) -> int:
        """The seed the next step will use."""
        state = self._counter()
        return derive_seed(state["seed"], state["step"])

    @property
    def pending(self) -> bool:
        """True while a folded update waits for the next pass or ``flush()``."""
        return self._pending is not None

    def state_dict(self) -> dict:
        """The optimiser's state (flushes a pending folded update first): a snapshot, whose step count
        does not move on with later steps (torch.optim's holds the live per-tensor dicts)."""
        self.flush()
        out = _undecorated(torch.optim.Optimizer.state_dict)(self)
        out["state"] = {key: dict(value) for key, value in out["state"].items()}   # ints: a shallow copy is whole
        # the hyperparameters as Python numbers, checked as a step checks them: a numpy float set between steps (an lr
        # schedule computed with np.cos) made a state that torch.load refuses with weights_only=True, its default
        for group in out["param_groups"]:   # torch packs new dicts: the live groups are left as they are
            missing = {"lr", "weight_decay", "eps", "perturbation"} - set(group)
            if missing:
                raise ValueError(f"Invalid param_group: a group lacks {sorted(missing)} (use add_param_group)")
            group.update(_check_group(group, {}))
        out["noise"] = describe(self.noise_source)   # which z the run drew: a resume with another source is told
        return out

    def load_state_dict(self, state_dict: dict) -> None:
        """Load a ``state_dict`` after validating all of it; nothing changes if it is invalid.

        A pending folded update is applied first (``flush``), as an unfolded run would have applied
        it: the parameters hold the last committed step, never θ − εz (the state describes flushed
        parameters; as with torch.optim, loading leaves the parameters' values to the caller). Where the
        parameters were written in place since that step (weights loaded before the optimiser's state, as a
        resume into objects that have been stepping does), the update is dropped and the written values stand:
        applied on top of them, it moved the loaded weights off the checkpoint.

        Warns ``NoiseSourceWarning`` when the state records a noise source (``noise``, written since round 16)
        that draws other z than this optimiser's (``noise.describe``: kind and parameters, not the device; compared
        by ``noise.drawn`` for the saved groups' perturbations), before anything loads; a state without the record
        loads without a word.
        """
        self._refuse_in_step("load_state_dict")
        self._check_state_dict(state_dict)
        saved, current = state_dict.get("noise"), describe(self.noise_source)
        # compared by the z they draw for the saved groups' perturbations (the loaded run's): a Rademacher-only run
        # draws the same signs from a GaussianTable as from the plain loop
        perturbations = {check_choice("perturbation", group["perturbation"], PERTURBATIONS)
                         for group in state_dict["param_groups"]}
        if "noise" in state_dict and drawn(saved, perturbations) != drawn(current, perturbations):
            warnings.warn(f"the state was saved by a run drawing z from {saved!r}; this {type(self).__name__} draws "
                          f"from {current!r}, so the resumed run goes on along other directions than the saved run "
                          f"would have (build it with the saved run's noise source to resume bit for bit)",
                          NoiseSourceWarning, stacklevel=_caller_level())
        if self._written_since_held():   # the caller loaded weights (a checkpoint's) before this state: they stand
            self._pending = None
        self.flush()   # dropping it otherwise left θ at θ − εz of the last step: neither that step's start nor its end
        with _InterruptsDeferred():   # Ctrl-C held until the state is whole: its step and seed as Python ints
            _undecorated(torch.optim.Optimizer.load_state_dict)(self, state_dict)
            state = self.state[self._first_param()]   # numpy ints as Python ints: state_dict() loads with weights_only
            state.update(step=int(state["step"]), seed=int(state["seed"]))
            self.flat_check = FlatLossCheck()   # a resumed run (adapters merged at save?): its first steps are judged

    def _check_state_dict(self, state_dict) -> None:
        if not isinstance(state_dict, dict) or not {"state", "param_groups"} <= set(state_dict):
            raise ValueError("Invalid state_dict: expected a dict with 'state' and 'param_groups'")
        if "mask_digests" in state_dict and getattr(self, "masks", None) is None:   # seedlog's test for a sparse one
            # a SparseMeZO's state loaded into a dense MeZO: the resumed run perturbed and updated every entry
            raise ValueError("Invalid state_dict: a SparseMeZO's state (it holds mask_digests) loaded into a dense "
                             f"{type(self).__name__}, which would move every entry; load it into a SparseMeZO built "
                             "with the saved run's masks")
        groups = state_dict["param_groups"]
        if not isinstance(groups, list) or len(groups) != len(self.param_groups):
            raise ValueError(f"Invalid state_dict: {len(groups) if isinstance(groups, list) else groups!r} "
                             f"param groups, expected {len(self.param_groups)}")
        cleaned = []
        for saved, group in zip(groups, self.param_groups):
            if (not isinstance(saved, dict) or not isinstance(saved.get("params"), (list, tuple))
                    or len(saved["params"]) != len(group["params"])):
                raise ValueError("Invalid state_dict: a param group's size differs from the optimiser's")
            missing = {"lr", "weight_decay", "eps", "perturbation"} - set(saved)
            if missing:
                raise ValueError(f"Invalid state_dict: a param group lacks {sorted(missing)}")
            cleaned.append(_check_group(saved, {}))
        if len({c["eps"] for c in cleaned}) != 1:
            raise ValueError("Invalid state_dict: param groups must share one eps")
        _check_saved_ids([key for saved in groups for key in saved["params"]])
        first = groups[0]["params"][0]
        entry = state_dict["state"].get(first) if isinstance(state_dict["state"], dict) else None
        if not isinstance(entry, dict):
            raise ValueError("Invalid state_dict: no step/seed entry for the first parameter")
        _check_step_count(entry.get("step"))
        check_seed("seed", entry.get("seed"))
        if "noise" in state_dict and not isinstance(state_dict["noise"], str):   # state_dict() writes a str
            raise ValueError(f"Invalid state_dict: noise {str(state_dict['noise'])[:80]} (expected the name of a "
                             f"noise source, as state_dict() records it)")

    def __getstate__(self) -> dict:
        """deepcopy/pickle keep the noise source, folding and a pending update; not the hooks."""
        return {**super().__getstate__(), "noise": self.noise, "fold_updates": self.fold_updates,
                "_pending": self._pending, "_pending_versions": None, "_offset": 0, "_step_hooks": OrderedDict(), "_plain": self._plain,
                "_in_step": False}

    # -- hooks ---------------------------------------------------------------------------
    def register_step_hook(self, hook: Callable[["MeZO", StepEvent], None]) -> RemovableHandle:
        """Call ``hook(optimizer, StepEvent)`` after every committed or failed step.

        A hook may also have ``check(optimizer)``, called before each step starts (it may
        raise ValueError to refuse the step before anything changes), and ``check_replay(optimizer)``,
        called before ``replay_step`` and ``replay_failure`` move anything. ``SeedLog`` has both.
        Returns a handle whose ``remove()`` unregisters the hook.
        """
        check_callable("hook", hook)
        handle = RemovableHandle(self._step_hooks)
        self._step_hooks[handle.id] = hook
        return handle

    def _notify(self, event: StepEvent) -> None:
        """Every hook sees the event, even when an earlier one raises; the first error is re-raised."""
        error = None
        for hook in list(self._step_hooks.values()):
            try:
                hook(self, event)
            except BaseException as raised:  # noqa: B902 - re-raised below, after every hook ran
                error = error or raised
        if error is not None:
            raise error

    # -- passes over the parameters ------------------------------------------------------
    @property
    def noise_source(self) -> NoiseSource:
        """The source every pass draws z from: ``noise`` if one was given (or chosen by "auto"),
        else the plain loop (``noise.PlainNoise``). Its ``replayable`` flag says whether a
        ``SeedLog`` can replay it."""
        return self.noise if self.noise is not None else self._plain

    def _jobs(self, seed: int, coefficient: Callable[[dict], float],
              shrink: Callable[[dict], float] | None = None) -> list[Job]:
        """One pass as jobs: tensor k gets z from derive_seed(seed, k)."""
        jobs = []
        for group in self.param_groups:
            c, s = coefficient(group), (shrink(group) if shrink is not None else 1.0)
            jobs += [Job(p, derive_seed(seed, len(jobs) + k), c, s, group["perturbation"])
                     for k, p in enumerate(group["params"])]
        return jobs

    def _apply(self, jobs: list[Job], source=None) -> None:
        """One atomic pass: every job applied, or (if the source raises part-way) none."""
        source = source if source is not None else self.noise_source
        kept = _keep_uninvertible(jobs)
        done: list[Job] = []
        try:
            if isinstance(source, NoiseSource):
                source.apply(jobs, done)
            else:
                source.apply(jobs)
        except BaseException:
            if isinstance(source, NoiseSource):
                source.undo(done)
            with torch.no_grad():
                for param, copy in kept:   # θ·shrink cannot be divided back: put the copy back
                    param.copy_(copy)
            raise

    def _move(self, seed: int, multiple_of_eps: float, offset: int) -> None:
        """θ ← θ + (multiple)·εz, then θ stands at ``offset`` (pending update folded in first)."""
        jobs = self._jobs(seed, lambda group: multiple_of_eps * group["eps"])
        with _InterruptsDeferred():
            pending, self._pending = self._pending, None
            fused = pending is not None and _directions(pending[0]) == _directions(self.noise_source)
            if fused:
                jobs = [job._replace(then=(shift.seed, shift.coefficient, shift.perturbation))
                        for job, shift in zip(pending[1], jobs)]
            elif pending is not None:
                self._apply_pending(pending)
            try:
                self._apply(jobs)
            except BaseException:
                if fused:
                    self._hold(pending)  # the fused pass was undone: the update still waits
                raise
            self._offset = offset

    @torch.no_grad()
    def _shift(self, seed: int, multiple_of_eps: float) -> None:
        """One bare pass θ ← θ + (multiple)·εz outside any step (benchmarks time a pass with it)."""
        self.flush()
        with _InterruptsDeferred():
            self._apply(self._jobs(seed, lambda group: multiple_of_eps * group["eps"]))

    def _apply_pending(self, pending) -> None:
        """Apply a held update with the current source if it draws the same z, else its own."""
        source = self.noise_source if _directions(pending[0]) == _directions(self.noise_source) else pending[0]
        try:
            self._apply(pending[1], source)
        except BaseException:
            self._hold(pending)
            raise

    def _hold(self, pending) -> None:
        """Hold a folded update until the next pass, with its tensors' version counters: ``load_state_dict``
        reads from them whether the caller wrote the parameters since (``_written_since_held``)."""
        self._pending = pending
        self._pending_versions = tuple(job.param._version for job in pending[1])

    def _written_since_held(self) -> bool:
        """A tensor of the pending update was written in place since it was held (``copy_``, a module's
        ``load_state_dict``: anything but a ``.data`` write bumps its version counter); False where unknown (a
        copy or an unpickled optimiser: new tensors, new counters)."""
        return (self._pending is not None and self._pending_versions is not None
                and self._pending_versions != tuple(job.param._version for job in self._pending[1]))

    # no_grad: called outside a step too (state_dict, load_state_dict, train), where a source with a bare
    # apply(jobs) met tensors that require grad in grad mode and raised RuntimeError at every call
    @torch.no_grad()
    def flush(self) -> None:
        """Apply a pending folded update now (no-op when none waits or folding is off)."""
        if self._pending is not None:
            with _InterruptsDeferred():
                pending, self._pending = self._pending, None
                self._apply_pending(pending)

    def _magnitudes(self) -> dict[torch.dtype, float]:
        """Per range dtype (``range_dtype``), a bound on max|θ| where the next step starts (a pending
        update applied).

        Raises ValueError if a parameter holds inf or NaN. One max-reduction per tensor, read
        back once per (device, dtype).
        """
        pending = {id(job.param): job for job in self._pending[1]} if self._pending is not None else {}
        found: dict[tuple, list] = {}
        for group in self.param_groups:
            for p in group["params"]:
                if p.numel():
                    job = pending.get(id(p))
                    scale, offset = (abs(job.shrink), abs(job.coefficient) * Z_BOUND) if job else (1.0, 0.0)
                    low, high = torch.aminmax(p.detach())  # one read, no temporary (abs() would be one)
                    key = (p.device, p.dtype, range_dtype(p))
                    found.setdefault(key, []).append((torch.maximum(-low, high), scale, offset))
        out: dict[torch.dtype, float] = {}
        for (device, own, dtype), rows in found.items():   # dtype: the range the values must stay in
            norms = torch.stack([r[0] for r in rows]).to("cpu", torch.float64)
            scales = torch.tensor([r[1] for r in rows], dtype=torch.float64)
            offsets = torch.tensor([r[2] for r in rows], dtype=torch.float64)
            if not bool(torch.isfinite(norms).all()):
                raise ValueError(f"Invalid params: a {own} parameter holds inf or NaN entries; nothing changed")
            out[dtype] = max(out.get(dtype, 0.0), float((norms * scales + offsets).max()))
        return out

    def _check_room(self, magnitudes: dict[torch.dtype, float]) -> None:
        """θ ± εz (the shifts and their undo) must stay finite in every dtype: checked before a pass."""
        eps = self.param_groups[0]["eps"]
        for dtype, bound in magnitudes.items():
            if not _fits(bound / Z_BOUND + eps, dtype):
                raise ValueError(f"Invalid params: entries up to {bound:.3g} in {dtype}: θ ± εz (ε={eps}, |z| < "
                                 f"{Z_BOUND:g}) would overflow {dtype}; nothing changed")

    def _check_update(self, projected_grad: float, groups, magnitudes: dict[torch.dtype, float] | None) -> None:
        """ValueError if the update with g = ``projected_grad`` could overflow a dtype: its
        coefficients alone, or (given ``magnitudes``, max|θ| per dtype) the new θ. ``groups``:
        dicts with lr, weight_decay and params (the optimiser's, or a seed log's lr in force)."""
        eps = self.param_groups[0]["eps"]
        for group in groups:
            coefficient = eps - group["lr"] * (projected_grad + group["weight_decay"] * eps)
            shrink = 1.0 - group["lr"] * group["weight_decay"]
            for dtype in {range_dtype(p) for p in group["params"]}:
                start = None if magnitudes is None else magnitudes.get(dtype, 0.0)
                room = start is None or _fits(abs(shrink) * (start / Z_BOUND + eps) + abs(coefficient), dtype)
                if not (_fits(coefficient, dtype) and _fits(shrink, dtype) and room):
                    raise ValueError(f"Invalid lr: the update θ ← {shrink:.3g}·θ + {coefficient:.3g}·z "
                                     f"(lr={group['lr']}, g={projected_grad:.3g}) would overflow {dtype}; "
                                     f"parameters restored")

    def _update_jobs(self, seed: int, projected_grad: float,
                     magnitudes: dict[torch.dtype, float] | None = None) -> list[Job]:
        """θ ← (1 − lr·wd)(θ + εz) − lr·g·z from θ − εz; refuses updates that would overflow
        (the coefficients alone, and, given ``magnitudes`` (max|θ| per dtype), the new θ)."""
        self._check_update(projected_grad, self.param_groups, magnitudes)
        eps = self.param_groups[0]["eps"]
        return self._jobs(seed, lambda group: eps - group["lr"] * (projected_grad + group["weight_decay"] * eps),
                          lambda group: 1.0 - group["lr"] * group["weight_decay"])

    def _commit(self, seed: int, projected_grad: float, update: list[Job], result: ZOStep | None = None) -> None:
        """Apply (or, folding, hold) the update, count the step, keep its result, tell the hooks."""
        with _InterruptsDeferred():
            if self.fold_updates:
                self._hold((self.noise_source, update))
            else:
                self._apply(update)
            self._offset = 0
            self.state[self._first_param()]["step"] += 1
            self.last_step = result
            # each group's (lr, weight_decay) as the update used them, read before any hook runs: a hook that
            # schedules the lr changes the groups before the later hooks (a SeedLog) see the event
            self._used_rates = [(group["lr"], group["weight_decay"]) for group in self.param_groups]
            self._notify(StepEvent("step", seed, projected_grad))

    def _abandon(self, seed: int, *, tell_hooks: bool = True) -> None:
        """Shift θ back to where the failed step (or replay) started; tell the hooks of a step's failure
        (1 or 2 passes made)."""
        offset, passes = self._offset, {1: 1, -1: 2}.get(self._offset)
        if passes is None:
            return
        with _InterruptsDeferred():
            self._move(seed, -float(offset), 0)
            if tell_hooks:
                self._notify(StepEvent("failure", seed, passes))

    @torch.no_grad()
    def replay_step(self, seed: int, projected_grad: float) -> None:
        """Repeat a logged step's passes without evaluating anything (bit-exact replay)."""
        self._refuse_in_step("replay_step")
        seed = _check_step_seed(seed)
        check_number("projected_grad", projected_grad)
        self._ready_to_replay()
        magnitudes = self._magnitudes()
        self._check_room(magnitudes)
        update = self._update_jobs(seed, float(projected_grad), magnitudes)
        try:
            self._move(seed, +1.0, +1)
            self._move(seed, -2.0, -1)
            with _InterruptsDeferred():
                self._apply(update)
                self._offset = 0
        except BaseException:
            self._abandon(seed, tell_hooks=False)   # a replay records nothing
            raise

    @torch.no_grad()
    def replay_failure(self, seed: int, passes: int) -> None:
        """Repeat the shifts of a failed step: to θ+εz and back (1), or θ+εz, θ−εz and back (2)."""
        self._refuse_in_step("replay_failure")
        seed = _check_step_seed(seed)
        passes = _check_passes(passes)
        self._ready_to_replay()
        self._check_room(self._magnitudes())
        try:
            self._move(seed, +1.0, +1)
            if passes == 2:
                self._move(seed, -2.0, -1)
            self._move(seed, -1.0 if passes == 1 else +1.0, 0)
        except BaseException:
            self._abandon(seed, tell_hooks=False)   # a replay records nothing
            raise

    def _ready_to_replay(self) -> None:
        """What a replay checks before anything moves, then a pending update applied: the groups as a pass
        needs them (edited since the last step?) and the hooks' ``check_replay`` (a replay moves θ outside
        any step, and hooks are told of steps only: ``SeedLog`` refuses)."""
        self._check_groups_ready()
        self._run_hook_checks("check_replay")
        self.flush()

    def _run_hook_checks(self, name: str) -> None:
        """Call each step hook's ``name(optimizer)`` where it has one (it may refuse with ValueError)."""
        for hook in list(self._step_hooks.values()):
            check = getattr(hook, name, None)
            if check is not None:
                check(self)

    # -- the step ------------------------------------------------------------------------
    @staticmethod
    def _losses(value, call: int) -> torch.Tensor:
        """The closure's result as float64 [B] or [] (numbers parsed in float64, never float32)."""
        kind = not_numbers(value)   # a bytearray was read as its byte values, a str as "not a tensor" (ValueError)
        if kind is not None:
            raise NotNumbersError(f"Invalid closure result: {kind} (expected the losses: a tensor, a number or a list "
                                  f"of numbers); parameters restored")
        try:   # a numpy array torch cannot view (reversed, byte-swapped) read as its values, a masked one refused
            value = numpy_readable("closure result", value)
        except ValueError as error:
            raise ValueError(f"{error}; parameters restored") from None
        # checked before float64 reads it: it read True as 1.0, and cast numpy complex numbers with a warning
        if not isinstance(value, torch.Tensor) and _booleans_or_complex(value):
            raise ValueError(f"Invalid closure result: {value!r} (expected real losses, not booleans or "
                             f"complex numbers); parameters restored")
        try:
            losses = value.detach() if isinstance(value, torch.Tensor) else torch.as_tensor(value, dtype=torch.float64)
        except (TypeError, ValueError, RuntimeError, OverflowError):   # OverflowError: an int beyond float64
            raise ValueError(f"Invalid closure result: {value!r} (expected a tensor, number or list "
                             f"of numbers); parameters restored") from None
        kind = not_dense(losses)
        if kind is not None:
            raise ValueError(f"Invalid closure result: a {kind} tensor on {losses.device} (expected a dense tensor "
                             f"of losses); parameters restored")
        if losses.is_complex() or losses.dtype == torch.bool:
            raise ValueError(f"Invalid closure result: dtype {losses.dtype} (expected real losses)")
        if losses.dim() > 1:
            raise ValueError(f"closure must return a 0-d or 1-D tensor of losses, "
                             f"got shape {tuple(losses.shape)}")
        if losses.numel() == 0:
            raise ValueError("Invalid closure result: an empty tensor of losses; parameters restored")
        # a copy: a result that shares memory with θ (the losses are a parameter's entries) or with a buffer the
        # closure writes again would change under the next pass, and L+ − L− would read 0
        losses = losses.to("cpu", torch.float64, copy=True)
        if not bool(torch.isfinite(losses).all()):
            raise FloatingPointError(f"closure returned a non-finite loss (call {call}); parameters restored")
        return losses

    def _check_ready(self) -> None:
        """Everything a step needs, checked before anything changes."""
        self._check_groups_ready()
        self._run_hook_checks("check")

    def _check_groups_ready(self) -> None:
        """The param groups as a pass needs them (tensors, hyperparameters, one eps that fits), checked
        before anything changes: by ``step``, and by ``replay_step`` and ``replay_failure``, which
        record nothing and so skip the hooks' checks."""
        self._check_groups_unchanged()
        eps = None
        for group in self.param_groups:
            cleaned = group if _plain_group(group) else _check_group(group, {})
            if cleaned is not group:   # the same values as floats: a numpy float32 lr would make the passes float32
                group.update(cleaned)
            if eps is not None and cleaned["eps"] != eps:
                raise ValueError(f"Invalid eps: {cleaned['eps']} (all param groups must share one eps)")
            eps = cleaned["eps"]
            for dtype in {range_dtype(p) for p in group["params"]}:
                if not _fits(2.0 * eps, dtype):
                    raise ValueError(f"Invalid eps: {eps} (2·eps·z overflows {dtype})")
        if getattr(self, "_inference", False) and not torch.is_inference_mode_enabled():
            raise ValueError("Invalid params: inference tensors (made under torch.inference_mode) can be changed in "
                             "place only inside it: step inside torch.inference_mode(), or clone them")

    def _check_groups_unchanged(self) -> None:
        """Param groups edited since the last check (a group appended to ``param_groups``, tensors
        added to or replaced in a group's list) are checked as ``add_param_group`` checks them."""
        groups = self.param_groups
        known = getattr(self, "_checked_groups", None)
        if (known is not None and len(known) == len(groups)
                and all(isinstance(g, dict) and isinstance(g.get("params"), list) and len(ps) == len(g["params"])
                        and all(a is b for a, b in zip(ps, g["params"])) for ps, g in zip(known, groups))):
            memory = _memory(groups)   # read once a step: step's _freeze takes its addresses from here
            if getattr(self, "_checked_memory", None) == memory:
                return
        for group in groups:
            if not isinstance(group, dict) or not isinstance(group.get("params"), list):
                raise ValueError(f"Invalid param_group: expected a dict with a list of 'params', got {group!r}")
            missing = {"lr", "weight_decay", "eps", "perturbation"} - set(group)
            if missing:
                raise ValueError(f"Invalid param_group: a group lacks {sorted(missing)} (use add_param_group)")
            _check_params(group["params"])
        params = [p for group in groups for p in group["params"]]
        if len({id(p) for p in params}) < len(params):
            raise ValueError("Invalid params: some tensors appear in more than one place")
        _check_disjoint(params)
        self._counter()
        self.flush()   # a pending update's jobs were made for the groups as they were: applied before the next pass
        self._checked_groups = [list(group["params"]) for group in groups]   # the tensors themselves: no id reuse
        self._checked_memory = _memory(groups)   # and where they point: .data re-pointed since is checked again
        self.flat_check = FlatLossCheck()   # other tensors: their first steps are judged afresh
        self._inference = any(p.is_inference() for p in params)   # fixed per tensor: checked each step, cheaply

    @torch.no_grad()
    def step(self, closure: Callable[[], torch.Tensor], weights: torch.Tensor | None = None) -> ZOStep:
        """Take one ZO step; the closure is called exactly twice (at θ+εz and θ−εz).

        Args:
            closure: returns per-example losses [B] (or a 0-d loss) at the current θ.
            weights: optional importance weights [B]; the objective is mean(weights·losses).

        Returns:
            A ``ZOStep`` with the loss, projected gradient, directional diffs and seed. It is also
            kept as ``last_step`` when the step commits, before the step hooks run: a hook that
            raises, or a Ctrl-C delivered once the update pass is done, raises from ``step`` with
            the step committed, and ``last_step`` (with ``step_count`` one higher) is its record.

        Warns ``FlatLossWarning`` (once) when the first steps' losses were exactly equal at θ+εz and
        θ−εz (``FLAT_STEPS``, ``FLAT_EXAMPLES``; see ``flat_check``).
        """
        self._refuse_in_step("step")
        check_callable("closure", closure)
        weights = self._check_weights(weights)
        self._check_ready()
        magnitudes = self._magnitudes()
        self._check_room(magnitudes)
        seed = self.next_seed()
        eps = self.param_groups[0]["eps"]
        self._offset = 0
        frozen = _freeze(self.param_groups, self._checked_memory)
        noise = self.noise   # the source of every pass of this step, its undo included
        self._in_step = True
        try:
            self._move(seed, +1.0, +1)
            plus = self._losses(closure(), 1)
            _check_frozen(self.param_groups, frozen)
            self._check_noise_kept(noise)
            if weights is not None and weights.shape != plus.shape:  # known now: undo 1 pass, not 2
                self._check_shapes(plus, plus, weights)
            self._move(seed, -2.0, -1)
            minus = self._losses(closure(), 2)
            _check_frozen(self.param_groups, frozen)
            self._check_noise_kept(noise)
            self._in_step = False   # the closure is done: step hooks (run by _commit) may replay or shift θ
            self._check_shapes(plus, minus, weights)
            diffs = _difference_quotient(plus, minus, eps)
            g = _mean(diffs, weights)
            if not math.isfinite(g):
                raise FloatingPointError(f"the projected gradient overflowed float64 ({g}): losses or "
                                         f"weights too large; parameters restored")
            result = _result(plus, minus, diffs, weights, g, seed)
            self._commit(seed, g, self._update_jobs(seed, g, magnitudes), result)
        except BaseException:
            if self._offset:   # θ is shifted: the undo must reach the tensors, ε and z the passes used
                _thaw(self.param_groups, frozen)
                self.noise = noise
            self._abandon(seed)
            raise
        finally:
            self._in_step = False
        flat = getattr(self, "flat_check", None)   # None: assigned None by the caller (no check)
        if flat is not None:
            flat.observe(result)
        return result

    def _check_noise_kept(self, noise) -> None:
        """ValueError if the closure replaced ``noise`` (the step's source): the next pass, the update or the undo
        drew other z than the passes before it (a failed step left θ 0.06 off, a committed one was no ZO step)."""
        if self.noise is not noise:
            raise ValueError("Invalid noise: replaced inside the step's closure; set opt.noise between steps. "
                             "Parameters restored")

    def _refuse_in_step(self, name: str) -> None:
        """ValueError when called from a step's closure: θ stands at θ ± εz and the step's passes are
        planned for the groups as they are (a nested step or a new group would leave θ shifted)."""
        if getattr(self, "_in_step", False):
            raise ValueError(f"Invalid call: {name}() inside a step's closure (θ is perturbed until the step "
                             f"ends); call it between steps")

    @staticmethod
    def _check_weights(weights) -> torch.Tensor | None:
        if weights is None:
            return None
        weights = numpy_readable("weights", check_numbers("weights", weights))   # as the closure's result
        if not isinstance(weights, torch.Tensor) and _booleans_or_complex(weights):   # float64 would read True as 1.0
            raise ValueError(f"Invalid weights: {weights!r} (expected real numbers, not booleans or complex numbers)")
        try:
            weights = torch.as_tensor(weights, dtype=None if isinstance(weights, torch.Tensor) else torch.float64)
        except (TypeError, ValueError, RuntimeError, OverflowError):   # OverflowError: an int beyond float64
            raise ValueError(f"Invalid weights: {weights!r} (expected a 1-D tensor [B])") from None
        if weights.is_complex() or weights.dtype == torch.bool:
            raise ValueError(f"Invalid weights: dtype {weights.dtype} (expected real numbers)")
        kind = not_dense(weights)
        if kind is not None:
            raise ValueError(f"Invalid weights: a {kind} tensor on {weights.device} (expected a dense 1-D tensor [B])")
        # a copy, as of the losses: weights that are tuned tensors themselves (example weights learnt by the same
        # optimiser), or a buffer the closure writes, were read after the passes, at θ − εz or as edited
        weights = weights.detach().to("cpu", torch.float64, copy=True)
        if weights.dim() != 1:
            raise ValueError(f"Invalid weights: expected a 1-D tensor [B], got shape {tuple(weights.shape)}")
        if not bool(torch.isfinite(weights).all()) or bool((weights < 0).any()):
            raise ValueError("Invalid weights: entries must be finite and non-negative")
        return weights

    @staticmethod
    def _check_shapes(plus, minus, weights) -> None:
        if plus.shape != minus.shape:
            raise ValueError(f"closure returned losses of shape {tuple(plus.shape)} then "
                             f"{tuple(minus.shape)}; both calls must return the same shape")
        if weights is not None and (plus.dim() != 1 or weights.shape != plus.shape):
            raise ValueError(f"Invalid weights: shape {tuple(weights.shape)} does not match "
                             f"the per-example losses' shape {tuple(plus.shape)}")


# What a step's passes depend on: edited by the closure, the undo would miss the tensors it moved
# (a new group, a replaced tensor) or shift them with another ε or z.
_FROZEN_KEYS = ("eps", "perturbation", "lr", "weight_decay")


def _freeze(groups: list, memory: list[tuple]) -> tuple:
    """The groups, their tensors and hyperparameters as a step starts, and an alias of each tensor's data
    (with its first address) to point it back with if the closure re-points ``.data``. ``memory``: the
    groups' ``_memory`` as the step's checks just read and accepted it (the addresses are read once a step)."""
    data = [(p, p.data) for g in groups for p in g["params"]]
    return (list(groups), [(g["params"], list(g["params"]), {k: g[k] for k in _FROZEN_KEYS}) for g in groups],
            data, [entry[0] for entry in memory])


def _check_frozen(groups: list, frozen: tuple) -> None:
    """ValueError if the closure edited the param groups or re-pointed a tensor's ``.data`` (checked after
    each call; the first addresses only, one integer per tensor: the full ``_memory`` is checked between
    steps)."""
    dicts, saved, _, addresses = frozen
    if len(groups) == len(dicts) and all(a is b for a, b in zip(groups, dicts)) and all(
            g.get("params") is held and len(held) == len(ps) and all(x is y for x, y in zip(held, ps))
            and all(g.get(k) is v or g.get(k) == v for k, v in values.items())
            for g, (held, ps, values) in zip(groups, saved)) and [
            p.data_ptr() for g in groups for p in g["params"]] == addresses:
        return
    raise ValueError("Invalid param_groups: edited inside the step's closure (tensors, their .data, eps, "
                     "perturbation, lr or weight_decay); edit them between steps. Parameters restored")


def _thaw(groups: list, frozen: tuple) -> None:
    """Put back the groups a step started with, and each tensor's ``.data`` (no-op when the closure left them
    alone): the undo pass must move the memory the step's passes moved."""
    dicts, saved, data, addresses = frozen
    groups[:] = dicts
    for g, (held, ps, values) in zip(dicts, saved):
        held[:] = ps   # the same list object: torch.optim and the caller may hold it
        g.update(values, params=held)
    for (p, alias), address in zip(data, addresses):
        if p.data_ptr() != address:
            p.data = alias


def _result(plus: torch.Tensor, minus: torch.Tensor, diffs: torch.Tensor, weights, g: float, seed: int) -> ZOStep:
    """What a step observed, built before it commits (``MeZO.last_step`` holds it even when a hook
    or a Ctrl-C raises once θ has moved)."""
    mean_loss = _half_sum(plus, minus)
    loss = _mean(mean_loss, weights)
    per_example = plus.dim() == 1
    empty = torch.empty(0, dtype=torch.float64)
    return ZOStep(loss=loss, projected_grad=g, seed=seed, directional_diffs=diffs if per_example else empty,
                  losses=mean_loss if per_example else empty)


def _half_sum(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """(a + b)/2 of finite float64 tensors, finite wherever the true value is: where a + b overflows (losses
    above ~9e307), a/2 + b/2 (elsewhere (a + b)/2, exact for subnormals, which a/2 would round)."""
    total = a + b
    return torch.where(torch.isinf(total), a / 2.0 + b / 2.0, total / 2.0)


def _difference_quotient(plus: torch.Tensor, minus: torch.Tensor, eps: float) -> torch.Tensor:
    """(plus − minus)/(2ε) of finite float64 tensors, finite wherever the true value is: where plus − minus
    overflows, (plus/2 − minus/2)/ε."""
    gap = plus - minus
    return torch.where(torch.isinf(gap), (plus / 2.0 - minus / 2.0) / eps, gap / (2.0 * eps))


def _mean(values: torch.Tensor, weights: torch.Tensor | None = None) -> float:
    """mean(values · weights) (or of values) as a float, finite wherever the true value is: when the plain
    mean overflows (a sum, or a product, past float64's range), it is taken again on values and weights
    scaled by powers of two below their largest magnitudes (exact), and the scales put back (the plain mean
    otherwise, bit for bit)."""
    plain = float((values * weights).mean()) if weights is not None else float(values.mean())
    if math.isfinite(plain) or not bool(torch.isfinite(values).all()):
        return plain
    exponent = math.frexp(float(values.abs().max()))[1]
    scaled = values * math.ldexp(1.0, -exponent)
    if weights is not None:
        shift = math.frexp(float(weights.abs().max()))[1]
        scaled, exponent = scaled * (weights * math.ldexp(1.0, -shift)), exponent + shift
    try:
        return math.ldexp(float(scaled.mean()), exponent)
    except OverflowError:   # the true mean is past float64's range too
        return math.copysign(math.inf, float(scaled.mean()))


def _booleans_or_complex(value) -> bool:
    """A closure's non-tensor result (or weights, or a number ``sazo_lite.train`` reads) is or holds a bool or a
    complex number: ``validation.non_real_kinds``, the one rule (float64 read True as 1.0, and dropped a complex
    number's imaginary part)."""
    return bool(non_real_kinds(value))


def _directions(source):
    """Sources with equal keys draw the same z for a seed (``NoiseSource.directions``)."""
    return getattr(source, "directions", id(source))


def _check_step_seed(seed) -> int:
    """A step's seed: ``derive_seed``'s range [0, 2⁶³), whose z a replay repeats (it read 1.5 as 1, and
    masked 2⁷⁰ or −1 to another seed silently)."""
    return check_int("seed", seed, 0, 2 ** 63 - 1)


def _check_saved_ids(keys: list) -> None:
    """A state dict's parameter ids: distinct and hashable (torch.optim maps each id to a tensor, so a
    repeated id sent the first tensor's step and seed to another one, after the state was replaced)."""
    try:
        distinct = len(set(keys)) == len(keys)
    except TypeError:
        distinct = False
    if not distinct:
        raise ValueError(f"Invalid state_dict: parameter ids {str(keys)[:200]} (expected one distinct, hashable id "
                         f"per tensor)")


def _check_step_count(step) -> int:
    """A step count in [0, 2⁶⁴): ``derive_seed`` reads a step by its low 64 bits, so step 2⁶⁴ drew step 0's
    directions again."""
    return check_int("step", step, 0, 2 ** 64 - 1)


def _check_passes(passes) -> int:
    if isinstance(passes, bool) or not isinstance(passes, (int, float)) or passes not in (1, 2):
        raise ValueError(f"Invalid passes: {passes!r} (a failed step made 1 or 2 shift passes)")
    return int(passes)

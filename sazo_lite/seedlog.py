"""A whole ZO run as a replayable seed log: kilobytes instead of a checkpoint.

A MeZO run is fully determined by the initial weights and, per step, (seed, projected_grad)
plus the hyperparameters in force (lr, weight_decay per group). Replaying the log repeats the
very same in-place passes (perturb +εz, −2εz, restore-and-update), so the rounding matches
and the fine-tuned weights come back bit for bit on the same device and dtype, without a
single forward pass.

What a log refuses (ValueError, before anything changes):
    * recording a step whose directions replay could not reproduce (a non-replayable noise
      source such as ``NoiseTable``, or a source swapped since ``attach``), a change of eps,
      perturbation or param groups, or a jump of the step count or seed since the last
      recorded step (``load_state_dict`` on the optimiser: attach a new log for the resumed run);
    * replaying into parameters of other shapes, dtypes or device types (a log without device
      types, written before they were recorded, replays on any), into another optimiser type
      (a ``SparseMeZO`` log replays only through ``replay_into(SparseMeZO(...))``; a subclass that
      overrides no method of the step, ``STEP_METHODS``, counts as the library class it derives
      from, so its log replays through that class and the reverse), or through
      an optimiser whose noise source draws other directions than the logged ones;
    * loading a log whose header is malformed, whose record count disagrees with the header
      (a truncated file), or with an unknown record kind, a failure record other than 1 or 2
      passes, a non-finite g, a negative or non-finite lr / weight decay, or a base seed or start
      step outside the optimiser's ranges;
    * replaying a log with a step whose update would overflow the parameters' dtype with the
      lr in force: every record is checked before the first pass;
    * replaying a log read from a file whose records, eps, directions or perturbations do not match the
      SHA-256 its header holds (``sha256``: changed since the file was written; checked after everything
      above, so a crafted record is named by its own check; logs written before it carry none);
    * ``replay_step`` or ``replay_failure`` through the optimiser it records (a hook such as
      ``StepCap`` that takes part of a step back): the log would miss that shift;
    * a step after the tuned tensors were written since the last recorded step (or since ``attach``): a
      ``clamp_``, a loaded checkpoint, a hook that moves θ after the log saw the step. The Σθ of each block of
      1,024 entries (each row of a non-contiguous tensor) after a step is compared before the next (not across
      a ``flush()`` of a folded update); writes that keep every block's sum are not seen.

Replay is all or nothing: ``replay_into`` keeps a copy of the parameters (``backup=True``) and
puts them and the optimiser's lr, step and seed back if anything fails part-way (an
interrupt, θ growing past its dtype's range). ``save`` writes a temporary file beside the
target and renames it, so a failed or interrupted save leaves the previous file whole.

Example:
    >>> theta = torch.zeros(4)
    >>> opt = MeZO([theta], lr=0.1, seed=3)
    >>> log = SeedLog.attach(opt)
    >>> _ = opt.step(lambda: (theta - 1).pow(2))
    >>> copy = torch.zeros(4)
    >>> log.replay([copy])
    >>> torch.equal(copy, theta)
    True
"""
from __future__ import annotations

import hashlib
import json
import math
from dataclasses import dataclass, field

import numpy as np
import torch

from .atomic import write_bytes
from .directions import PERTURBATIONS, derive_seed
from .engine import MeZO, StepEvent, _check_step_count
from .interrupts import InterruptsDeferred
from .noise import source_for
from .validation import check_seed

__all__ = ["SeedLog"]

FORMAT = 3            # 3 records the noise source's ``directions``; 2 (without) means "torch"
READABLE_FORMATS = (2, 3)
_STEP, _FAIL, _LR, _WD = 0, 1, 2, 3  # record kinds
_RECORD = np.dtype([("kind", "u1"), ("seed", "<u8"), ("value", "<f8")])  # 17 bytes
# the header field holding the SHA-256 of what replay reads from a log and checks against nothing else (``_digest``):
# a g, lr, weight decay or eps changed on disk parses and replays another θ; replay refuses a log that misses it
_DIGEST = "sha256"
# Every header field and group field a log has ever been written with: a name outside them is a changed file (a
# flipped byte in "sha256" or "devices" read as a log without that field, unchecked).
_HEADER_FIELDS = frozenset({"format", "optimizer", "eps", "base_seed", "start_step", "directions", "groups",
                            "mask_sizes", "mask_digests", "records", _DIGEST})
_GROUP_FIELDS = frozenset({"perturbation", "shapes", "dtypes", "devices"})


# The methods a step's and a replay's passes run: a subclass that overrides none of them steps as the library
# class it derives from (its log replays through that class); one that overrides any is a step kind of its own.
STEP_METHODS = ("_jobs", "_apply", "_move", "_apply_pending", "_update_jobs", "_check_update", "_commit",
                "_abandon", "replay_step", "replay_failure", "flush", "noise_source", "_set_masks")


def step_kind(optimizer: MeZO) -> str:
    """The name of the class whose step ``optimizer`` takes: the nearest class of its MRO that is a library
    class (``MeZO``, ``SparseMeZO``) or overrides a method of ``STEP_METHODS``. A log records it, since a
    replay depends on the step, not on the class's name (a user's subclass that adds nothing to the step
    could be replayed only through that very subclass)."""
    package = __name__.rpartition(".")[0]
    for cls in type(optimizer).__mro__:
        if cls.__module__ == package or cls.__module__.startswith(package + ".") or any(
                name in vars(cls) for name in STEP_METHODS):
            return cls.__name__
    return type(optimizer).__name__


def _invalid(message: str):
    return ValueError(f"Invalid seed log: {message}")


def _structure(optimizer: MeZO) -> list[dict]:
    return [{"perturbation": g["perturbation"], "shapes": [list(p.shape) for p in g["params"]],
             "dtypes": [str(p.dtype) for p in g["params"]], "devices": _devices(g["params"])}
            for g in optimizer.param_groups]


def _devices(params) -> list[str]:
    """Each tensor's device type: a generator draws other z on another one (CPU and CUDA randn differ)."""
    return [p.device.type for p in params]


def _logged_directions(optimizer: MeZO) -> str | None:
    """The name of the z the optimiser's source draws, as ``noise.source_for`` reads it, or None
    when replay could not rebuild them. A replayable source without a name of its own (such as
    ``SparseMeZO``'s masked plain loop) draws the plain loop's z: "torch"."""
    source = optimizer.noise_source
    if not getattr(source, "replayable", False):
        return None
    name = getattr(source, "directions", None)
    if not isinstance(name, str):
        return "torch"
    try:
        source_for(name)
    except ValueError:
        return None
    return name


_BLOCK = 1024   # entries per block of ``_fingerprint``: a one-entry change shows in its block's sums


def _block_sums(p: torch.Tensor) -> torch.Tensor:
    """Σθ of each block of ``_BLOCK`` entries of ``p`` (each row where ``p`` is not contiguous: a column block of a
    fused weight, which MeZO tunes in place, is read where it lies), at least in float32: [blocks]. One reading
    pass, no copy of ``p``."""
    x = p.detach().reshape(1) if p.dim() == 0 else p.detach()
    if x.is_contiguous():
        flat = x.reshape(-1)
        whole = flat.numel() // _BLOCK * _BLOCK
        parts = [flat[:whole].view(-1, _BLOCK), flat[whole:].view(1, -1)]
    else:
        parts = [x.reshape(-1) if x.dim() == 1 else x]
    dtype = torch.promote_types(x.dtype, torch.float32)
    return torch.cat([part.sum(-1, dtype=dtype).reshape(-1) for part in parts])


def _fingerprint(optimizer: MeZO) -> tuple[bool, dict]:
    """(whether a folded update waits, {device: Σθ of every block of every tuned tensor}): what ``_check_weights``
    compares. Each block sum is read in the tensor's own precision (at least float32): one pass as cheap as a
    sum, where float64 totals of whole tensors cost about a perturbation pass each step."""
    by_device: dict = {}
    with torch.no_grad():
        for group in optimizer.param_groups:
            for p in group["params"]:
                by_device.setdefault(p.device, []).append(_block_sums(p))
    return optimizer.pending, {device: torch.cat(sums) for device, sums in by_device.items()}


def _same_weights(before: dict, now: dict) -> bool:
    """Whether two ``_fingerprint`` sums agree bit for bit (NaN equal to NaN: a θ holding NaN is MeZO's to
    refuse, by its own message)."""
    return before.keys() == now.keys() and all(
        before[d].shape == now[d].shape and torch.allclose(before[d], now[d], rtol=0.0, atol=0.0, equal_nan=True)
        for d in before)


def _mask_sizes(optimizer) -> list[int] | None:
    masks = getattr(optimizer, "masks", None)
    if masks is None:
        return None
    return [int(masks[id(p)].numel()) for g in optimizer.param_groups for p in g["params"]]


def _mask_digests(optimizer) -> list[str] | None:
    """SHA-256 of each mask's flat indices in order (int64): masks of the same sizes but other entries
    (``sparse_indices`` with another seed) replayed the steps onto other entries, silently."""
    masks = getattr(optimizer, "masks", None)
    if masks is None:
        return None
    return [hashlib.sha256(masks[id(p)].to("cpu", torch.int64).numpy().tobytes()).hexdigest()
            for g in optimizer.param_groups for p in g["params"]]


@dataclass
class SeedLog:
    """The per-step record of a MeZO run (a step hook of the optimiser it is attached to).

    Attributes:
        header: format, optimiser type, eps, base seed, start step, the directions of the
            noise source (``noise.source_for`` rebuilds it) and per group the perturbation,
            tensor shapes, dtypes and device types (``SparseMeZO``: each mask's size and SHA-256 too).
        records: (kind, seed-or-group, value) triples: a step (seed, g), a failed step
            (seed, shift passes made: 1 or 2), or a change of a group's lr / weight_decay.
    """

    header: dict
    records: list[tuple[int, int, float]] = field(default_factory=list)
    _hyper: list[tuple[float, float]] = field(default_factory=list, repr=False)
    _handle: object = field(default=None, repr=False)
    _expected: tuple | None = field(default=None, repr=False)  # (step, seed) the next step must start at
    _altered: bool = field(default=False, repr=False)  # read from a file whose records miss their SHA-256
    _weights: tuple | None = field(default=None, repr=False)  # _fingerprint(optimizer) where the last step left θ

    @classmethod
    def attach(cls, optimizer: MeZO) -> "SeedLog":
        """Start logging every later step of ``optimizer`` (from its current, flushed weights)."""
        if not isinstance(optimizer, MeZO):
            raise ValueError(f"Invalid optimizer: {type(optimizer).__name__} (expected a MeZO)")
        optimizer._refuse_in_step("SeedLog.attach")   # θ is perturbed: the log would start from θ ± εz
        optimizer._check_groups_ready()   # groups edited since the last step: checked, numbers as floats (JSON)
        optimizer.flush()
        state = optimizer._counter()
        header = {"format": FORMAT, "optimizer": step_kind(optimizer),
                  "eps": optimizer.param_groups[0]["eps"], "base_seed": state["seed"],
                  "start_step": state["step"], "directions": _logged_directions(optimizer) or "torch",
                  "groups": _structure(optimizer)}
        sizes = _mask_sizes(optimizer)
        if sizes is not None:
            header.update(mask_sizes=sizes, mask_digests=_mask_digests(optimizer))
        log = cls(header)
        log._expected = (state["step"], state["seed"])
        log._weights = _fingerprint(optimizer)
        log._handle = optimizer.register_step_hook(log)
        return log

    def detach(self) -> None:
        """Stop recording."""
        if self._handle is not None:
            self._handle.remove()
            self._handle = None

    # -- recording (the optimiser calls these) ------------------------------------------
    def check(self, optimizer: MeZO) -> None:
        """Refuse a step that replay could not reproduce (called before the step changes θ)."""
        source, directions = optimizer.noise_source, _logged_directions(optimizer)
        if directions is None:
            raise ValueError(f"Invalid noise: SeedLog cannot replay {type(source).__name__}'s directions "
                             f"(it replays sources that noise.source_for can rebuild)")
        if directions != self.header["directions"]:
            raise ValueError(f"Invalid noise: the source now draws {directions!r}, but the log records "
                             f"{self.header['directions']!r} since SeedLog.attach; a seed log cannot record that")
        if optimizer.param_groups[0]["eps"] != self.header["eps"] or _structure(optimizer) != self.header["groups"]:
            raise ValueError("Invalid optimizer: eps, perturbation or param groups (tensors, shapes, dtypes, "
                             "devices) changed since SeedLog.attach; a seed log cannot record that")
        state = optimizer.state[optimizer._first_param()]
        if self._expected is not None and (state["step"], state["seed"]) != self._expected:
            raise ValueError(f"Invalid optimizer: its step count and seed jumped to ({state['step']}, "
                             f"{state['seed']}) from the log's ({self._expected[0]}, {self._expected[1]}) "
                             f"(load_state_dict?); a seed log cannot record that: detach it and "
                             f"SeedLog.attach a new one for the resumed run")
        self._check_weights(optimizer)

    def _check_weights(self, optimizer: MeZO) -> None:
        """Refuse a step when θ changed since the last step the log recorded (or since ``attach``): a log holds
        steps only, so a write between steps (``theta.clamp_``, a loaded checkpoint, a hook that moves θ after
        this log saw the step) was left out of its replay, which rebuilt another θ without a word. Compared only
        when a folded update waits now as it did then (a ``flush()`` in between moves θ as the log replays it).
        Writes that keep the Σθ of every block of ``_BLOCK`` entries (or row) are not seen."""
        last = self._weights
        if last is None or last[0] != optimizer.pending:
            return
        if not _same_weights(last[1], _fingerprint(optimizer)[1]):
            raise ValueError("Invalid weights: the tuned tensors changed since the last step this SeedLog recorded "
                             "(written between steps: the log holds steps only, so its replay would not rebuild "
                             "them); nothing moved. Put the weights back, or detach this log and SeedLog.attach a "
                             "new one from the weights as they are")

    def check_replay(self, optimizer: MeZO) -> None:
        """Refuse ``replay_step``/``replay_failure`` through the optimiser it records: a replay moves θ
        without telling the hooks, so the log would miss it and rebuild another θ (a ``StepCap``
        taking a step's excess back: its replay of the log was silently off)."""
        raise ValueError("Invalid call: replay_step/replay_failure on an optimiser a SeedLog records: the log "
                         "cannot hold the replay's shift (a hook such as StepCap that replays part of a step?), "
                         "so replaying the log would not rebuild θ; detach the log or that hook")

    def __call__(self, optimizer: MeZO, event: StepEvent) -> None:
        self._weights = _fingerprint(optimizer)   # where this step left θ (a failed one: put back, as replayed)
        if event.kind == "failure":
            self.records.append((_FAIL, event.seed, float(event.value)))
            return
        if self._expected is not None:
            self._expected = (self._expected[0] + 1, self._expected[1])
        # the rates the step's update used (a hook called before this one may have set the next step's already)
        used = getattr(optimizer, "_used_rates", None) or [
            (group["lr"], group["weight_decay"]) for group in optimizer.param_groups]
        for index, hyper in enumerate(used):
            if index >= len(self._hyper) or self._hyper[index] != hyper:
                self.records += [(_LR, index, hyper[0]), (_WD, index, hyper[1])]
                self._hyper[index:index + 1] = [hyper]
        self.records.append((_STEP, event.seed, float(event.value)))

    @property
    def num_steps(self) -> int:
        return sum(kind == _STEP for kind, _, _ in self.records)

    # -- replay ------------------------------------------------------------------------
    def replay(self, params) -> None:
        """Apply the logged run in place to ``params`` (an iterable of tensors, or a module's
        ``parameters()``), which must hold the run's initial weights (same shapes, dtypes)."""
        if self.header["optimizer"] != "MeZO":
            raise ValueError(f"Invalid params: this log was written by {self.header['optimizer']}; "
                             f"replay it with replay_into({self.header['optimizer']}(params, ...))")
        params = list(params)
        groups, start = [], 0
        for spec in self.header["groups"]:
            groups.append({"params": params[start:start + len(spec["shapes"])],
                           "perturbation": spec["perturbation"]})
            start += len(spec["shapes"])
        if start != len(params) or any(not g["params"] for g in groups):
            raise ValueError(f"Invalid params: expected {start} tensors, got {len(params)}")
        self._check_params(groups)
        self.replay_into(MeZO(groups, lr=0.0, eps=self.header["eps"], noise=source_for(self.header["directions"])))

    def _check_params(self, groups) -> None:
        for spec, group in zip(self.header["groups"], groups):
            if [list(p.shape) for p in group["params"]] != spec["shapes"]:
                raise ValueError("Invalid params: shapes differ from the logged run's parameters")
            if [str(p.dtype) for p in group["params"]] != spec["dtypes"]:
                raise ValueError(f"Invalid params: dtypes {[str(p.dtype) for p in group['params']]} differ "
                                 f"from the logged run's {spec['dtypes']}; replay would not be exact")
            if "devices" in spec and _devices(group["params"]) != spec["devices"]:   # logs before round 10 lack it
                raise ValueError(f"Invalid params: devices {_devices(group['params'])} differ from the logged "
                                 f"run's {spec['devices']}; z drawn on another device differ, so replay would "
                                 f"rebuild another θ (move the tensors to the logged devices first)")

    def replay_into(self, optimizer: MeZO, *, backup: bool = True) -> None:
        """Replay through ``optimizer`` (same type, eps, groups, shapes and dtypes as the run);
        afterwards its step count and seed continue the logged run.

        All or nothing: every record is checked first (with the lr in force at its step), and
        with ``backup`` (default) a copy of the parameters is kept during replay and put back,
        with the optimiser's lr, weight decay, step and seed, if a pass fails or is interrupted.
        ``backup=False`` saves that memory (one copy of the parameters); only an interrupt or a
        failing noise source can then leave them part-replayed.
        """
        _check_header(self.header)
        _check_records(self.records, len(self.header["groups"]))
        _check_seeds(self.records, self.header)
        # logs written before step_kind recorded the class's own name: it still replays through that class
        if self.header["optimizer"] not in (step_kind(optimizer), type(optimizer).__name__):
            raise ValueError(f"Invalid optimizer: {type(optimizer).__name__} takes {step_kind(optimizer)}'s step, "
                             f"but the log was written by {self.header['optimizer']}")
        optimizer._check_groups_ready()   # its groups as a step checks them (edited since its last step?)
        if optimizer.param_groups[0]["eps"] != self.header["eps"]:
            raise ValueError(f"Invalid optimizer: eps {optimizer.param_groups[0]['eps']} differs from the "
                             f"logged {self.header['eps']}")
        if len(optimizer.param_groups) != len(self.header["groups"]):
            raise ValueError("Invalid params: the number of param groups differs from the logged run's")
        self._check_params(optimizer.param_groups)
        if [g["perturbation"] for g in optimizer.param_groups] != [s["perturbation"] for s in self.header["groups"]]:
            raise ValueError("Invalid optimizer: perturbations differ from the logged run's")
        if _mask_sizes(optimizer) != self.header.get("mask_sizes") or (
                "mask_digests" in self.header and _mask_digests(optimizer) != self.header["mask_digests"]):
            raise ValueError("Invalid optimizer: its masks differ from the logged run's (sizes or entries)")
        if _logged_directions(optimizer) != self.header["directions"]:
            raise ValueError(f"Invalid optimizer: its noise source ({type(optimizer.noise_source).__name__}) "
                             f"does not draw the logged directions {self.header['directions']!r}; build it "
                             f"with noise=sazo_lite.noise.source_for({self.header['directions']!r})")
        self._check_updates(optimizer)
        if self._altered:   # last: a crafted record is named by the checks above
            raise _altered_log()
        optimizer.flush()
        saved = _Saved(optimizer, backup)
        try:
            for kind, key, value in self.records:
                if kind == _STEP:
                    optimizer.replay_step(key, value)
                elif kind == _FAIL:
                    optimizer.replay_failure(key, int(value))
                else:
                    optimizer.param_groups[key]["lr" if kind == _LR else "weight_decay"] = value
        except BaseException:
            saved.restore(optimizer)
            raise
        optimizer.state[optimizer._first_param()].update(
            step=self.header["start_step"] + self.num_steps, seed=self.header["base_seed"])

    def _check_updates(self, optimizer: MeZO) -> None:
        """Every logged step's update, with the lr and weight decay in force then, must fit the dtypes."""
        groups = [{"lr": g["lr"], "weight_decay": g["weight_decay"], "params": g["params"]}
                  for g in optimizer.param_groups]
        for index, (kind, key, value) in enumerate(self.records):
            if kind in (_LR, _WD):
                groups[key]["lr" if kind == _LR else "weight_decay"] = value
            elif kind == _STEP:
                try:
                    optimizer._check_update(value, groups, None)
                except ValueError as error:
                    raise _invalid(f"record {index}: {error} (nothing replayed)") from None

    # -- bytes -------------------------------------------------------------------------
    def to_bytes(self) -> bytes:
        """Serialise: a JSON header line (with the record count and a SHA-256, ``_digest``), then 17 bytes per
        record. A log read from a file that missed its SHA-256 is refused (``ValueError``): written again, it would
        carry a new one and replay as sound."""
        if self._altered:
            raise _altered_log()
        table = np.array(self.records, dtype=_RECORD).tobytes()
        header = {**self.header, "records": len(self.records), _DIGEST: _digest(self.header, table)}
        return json.dumps(header).encode() + b"\n" + table

    @classmethod
    def from_bytes(cls, data: bytes) -> "SeedLog":
        """Parse and validate a serialised log (ValueError on anything malformed or truncated)."""
        if not isinstance(data, (bytes, bytearray, memoryview)):
            raise _invalid(f"expected bytes, got {type(data).__name__}")
        head, newline, body = bytes(data).partition(b"\n")
        try:
            header = json.loads(head)
        except (UnicodeDecodeError, ValueError, RecursionError) as error:   # ValueError: > 4300-digit ints too
            raise _invalid(f"the header is not JSON ({type(error).__name__}: {str(error)[:80]})") from None
        if isinstance(header, dict) and header.get("format") == 2 and "directions" not in header:
            header = {**header, "format": FORMAT, "directions": "torch"}  # format 2 logged torch z only
        try:
            _check_header(header)
        except OverflowError:                                 # an integer beyond float's range (eps = 10**400)
            huge = [k for k, v in header.items() if isinstance(v, int) and abs(v) > 1e308]
            raise _invalid(f"header field {', '.join(map(str, huge)) or '?'} is out of float range") from None
        count = header.pop("records", None)
        digest = header.pop(_DIGEST, None)   # logs written before round 16 have none
        if digest is not None and not (isinstance(digest, str) and len(digest) == 64
                                       and all(c in "0123456789abcdef" for c in digest)):
            raise _invalid(f"{_DIGEST} {str(digest)[:80]!r} (expected 64 hex digits)")
        if not isinstance(count, int) or isinstance(count, bool) or count < 0:
            raise _invalid("the header has no record count")
        if not newline or len(body) != count * _RECORD.itemsize:
            raise _invalid(f"{len(body)} bytes of records, expected {count} × {_RECORD.itemsize} "
                           f"(a truncated or padded file)")
        table = np.frombuffer(body, dtype=_RECORD)
        records = [(int(k), int(s), float(v)) for k, s, v in table]
        _check_records(records, len(header["groups"]))
        return cls(header, records, _altered=digest is not None and _digest(header, body) != digest)

    def save(self, path) -> int:
        """Write the log to ``path``; returns its size in bytes.

        Atomic (``atomic.write_bytes``): the bytes go to a new temporary file beside ``path``, which
        then replaces it, so a failed write (full disk, file-size limit) or Ctrl-C leaves any previous
        file whole.
        """
        data = self.to_bytes()
        write_bytes(path, data)   # a fresh temporary name: a file or link left at a fixed one was written through
        return len(data)

    @classmethod
    def load(cls, path) -> "SeedLog":
        with open(path, "rb") as handle:
            return cls.from_bytes(handle.read())


class _Saved:
    """What ``replay_into`` puts back if it fails: the parameters (with ``backup``), each
    group's lr and weight decay, and the step count and seed."""

    def __init__(self, optimizer: MeZO, backup: bool):
        with torch.no_grad():
            self.params = [[p.detach().clone() for p in g["params"]] if backup else None
                           for g in optimizer.param_groups]
        self.hyper = [(g["lr"], g["weight_decay"]) for g in optimizer.param_groups]
        self.state = dict(optimizer.state[optimizer._first_param()])

    def restore(self, optimizer: MeZO) -> None:
        with InterruptsDeferred(), torch.no_grad():
            for group, copies, (lr, wd) in zip(optimizer.param_groups, self.params, self.hyper):
                if copies is not None:
                    for p, copy in zip(group["params"], copies):
                        p.copy_(copy)
                group.update(lr=lr, weight_decay=wd)
            optimizer.state[optimizer._first_param()].update(self.state)


def _altered_log() -> ValueError:
    return _invalid("its records or eps do not match the SHA-256 the file was written with (changed since it was "
                    "saved: a g, lr, weight decay or eps replays another θ); nothing replayed or written")


def _digest(header: dict, records: bytes) -> str:
    """SHA-256 of what a replay reads from a log that no other check holds: eps, the directions, each group's
    perturbation and the record bytes (the shapes, dtypes and devices are compared with the parameters, the base
    seed and start step with the records' seeds, the optimiser's name with the optimiser)."""
    groups = header.get("groups")   # read as given: a header built by hand is refused where it is read, not here
    perturbations = [g.get("perturbation") if isinstance(g, dict) else None for g in groups] \
        if isinstance(groups, list) else None
    replayed = json.dumps([header.get("eps"), header.get("directions"), perturbations], default=repr)
    return hashlib.sha256(replayed.encode() + b"\n" + records).hexdigest()


def _check_header(header) -> None:
    if not isinstance(header, dict):
        raise _invalid("the header is not a JSON object")
    if header.get("format") != FORMAT:
        raise _invalid(f"format {header.get('format')!r}, this version reads formats "
                       f"{', '.join(map(str, READABLE_FORMATS))}")
    unknown = sorted(map(str, set(header) - _HEADER_FIELDS))
    if unknown:
        raise _invalid(f"unknown header field {', '.join(map(repr, unknown))[:80]} (changed since it was saved?)")
    try:
        source_for(header.get("directions"))
    except ValueError:
        raise _invalid(f"directions {str(header.get('directions'))[:80]!r}") from None
    if not isinstance(header.get("optimizer"), str):
        raise _invalid("the header does not name the optimiser")
    eps = header.get("eps")
    if isinstance(eps, bool) or not isinstance(eps, (int, float)) or not (math.isfinite(eps) and eps > 0):
        raise _invalid(f"eps {eps!r}")
    for key, check in (("base_seed", lambda seed: check_seed("base_seed", seed)), ("start_step", _check_step_count)):
        value = header.get(key)
        try:   # the optimiser's own ranges: replay hands both to it (2⁷⁰ read as seed 0's stream)
            check(value)
        except ValueError:
            raise _invalid(f"{key} {value!r}") from None
    groups = header.get("groups")
    if not isinstance(groups, list) or not groups:
        raise _invalid("the header has no param groups")
    for spec in groups:
        ok = (isinstance(spec, dict) and set(spec) <= _GROUP_FIELDS and spec.get("perturbation") in PERTURBATIONS
              and isinstance(spec.get("shapes"), list) and isinstance(spec.get("dtypes"), list)
              and len(spec["shapes"]) == len(spec["dtypes"]) > 0
              and all(isinstance(s, list) and all(isinstance(n, int) and n >= 0 for n in s) for s in spec["shapes"])
              and all(isinstance(d, str) and d.startswith("torch.") for d in spec["dtypes"])
              and ("devices" not in spec or (isinstance(spec["devices"], list)
                                             and len(spec["devices"]) == len(spec["shapes"])
                                             and all(isinstance(d, str) for d in spec["devices"]))))
        if not ok:
            raise _invalid(f"param group {spec!r}")


def _check_records(records, num_groups: int) -> None:
    for index, (kind, key, value) in enumerate(records):
        where = f"record {index}"
        if kind == _STEP and not math.isfinite(value):
            raise _invalid(f"{where}: a non-finite projected gradient {value}")
        elif kind == _FAIL and value not in (1.0, 2.0):
            raise _invalid(f"{where}: a failed step with {value} shift passes (expected 1 or 2)")
        elif kind in (_LR, _WD) and (not 0 <= key < num_groups or not math.isfinite(value) or value < 0):
            raise _invalid(f"{where}: group {key}, {'lr' if kind == _LR else 'weight_decay'} {value}")
        elif kind not in (_STEP, _FAIL, _LR, _WD):
            raise _invalid(f"{where}: unknown record kind {kind}")
        if kind in (_STEP, _FAIL) and not 0 <= key < 2 ** 63:
            raise _invalid(f"{where}: seed {key} out of range")


def _check_seeds(records, header: dict) -> None:
    """Each step's (and failed step's) seed is the stream's next, derive_seed(base, start + steps so far):
    replay sets the optimiser to the end of that stream, so records edited, reordered or spliced from
    another run would rebuild a θ the run never had and a stream that reuses directions."""
    steps = header["start_step"]
    for index, (kind, key, _) in enumerate(records):
        if kind in (_STEP, _FAIL):
            if key != derive_seed(header["base_seed"], steps):
                raise _invalid(f"record {index}: seed {key} is not step {steps}'s seed of the stream from base "
                               f"seed {header['base_seed']} (records edited, reordered or from another run)")
            steps += kind == _STEP

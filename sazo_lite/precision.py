"""Half-precision parameters under MeZO: rounding in the in-place shifts, and a float32 master.

dtype and restore drift. MeZO moves θ in place: +εz, −2εz, +εz − ηgz. In float32 each add
rounds with unit roundoff u = 2⁻²⁴ and θ comes back to within a few ulps. In bfloat16
(u = 2⁻⁸) or float16 (u = 2⁻¹¹) every add rounds to 8 (11) significant bits, so after a
raised closure the parameters come back only within

    |θ_restored − θ| ≤ u · passes · (|θ| + 2ε|z|)       (``restore_bound``; passes = 2 or 3)

and, worse, an update ηg·z smaller than half an ulp of θ is lost entirely. ``benchmarks/llm_drift.py`` measures
both on SmolLM2 (its figures are in the docs, not here). Mitigation:
``Float32Master`` keeps a float32 master copy of the trainable parameters, lets MeZO
perturb the master, and copies it into the half-precision model before each forward.
For LoRA the master costs 4 bytes per adapter parameter; for full tuning it doubles memory.
Each master tensor is declared stored as its parameter's dtype (``engine.store_as``), so MeZO
refuses a shift or an update that would leave float16's range before it changes the master.
Writes into the half-precision model between steps (a checkpoint loaded into it, an edited weight) become the
masters' at the next ``step`` (``follow_writes``), as ZOTrainer's do.
"""
from __future__ import annotations

import weakref

import torch

from .engine import _check_disjoint, store_as
from .interrupts import InterruptsDeferred
from .validation import not_dense

__all__ = ["Float32Master", "unit_roundoff", "restore_bound", "written_entries", "put_entries"]

FOLLOW_CHUNK = 1 << 20   # entries written_entries compares at a time: its buffers stay this small


def master_dtype(dtype: torch.dtype) -> torch.dtype:
    """The dtype of a master copy: float32, or the parameter's own dtype when it is wider (float64).

    Chosen by width, not by ``torch.promote_types``, which refuses the float8 types (the ones that need
    a master most: MeZO cannot move them in place)."""
    return dtype if dtype.is_floating_point and torch.finfo(dtype).bits > 32 else torch.float32


class Float32Master:
    """A float32 master copy of half-precision trainable parameters (restore-drift mitigation).

    Each master is float32, or the parameter's own dtype where it is wider (``master_dtype``: a
    float64 tensor keeps a float64 master); integer tensors are refused.

    MeZO perturbs and updates the master tensors; ``wrap`` makes the closure copy the master
    into the model (rounding once to bf16/fp16) before every forward, so rounding never
    accumulates in θ and small updates ηg·z are not lost.

    MeZO checks every shift and update of the master against the model's dtype (float16:
    |x| ≤ 65504) before it commits, so a refused step (``ValueError``) leaves the master where it
    started and the step count unchanged; ``step`` (or ``sync()`` after a failed
    ``opt.step(master.wrap(...))``) then puts the model back too.

    A checkpoint holds ``state_dict()`` beside the optimiser's: masters rebuilt from the half-precision
    model would lack what the steps added below its last place.

    Writes into the model between steps are kept: ``step`` and ``state_dict`` first call ``follow_writes``, which
    makes every entry written since the last sync (``model.load_state_dict``, an in-place edit, a ``.data`` write)
    its master's (the next pass overwrote them with the stale masters, silently). ``opt.step(master.wrap(f))``
    refuses a step (ValueError, nothing moved) when a model tensor was written in place since the last sync: call
    ``follow_writes()`` first (a ``.data`` write leaves no trace for it to see). ``sync()`` itself copies the
    masters over whatever the model holds.

    Example:
        >>> from sazo_lite import MeZO
        >>> model = [torch.ones(3, dtype=torch.float16)]
        >>> master = Float32Master(model)
        >>> opt = MeZO(master.tensors, lr=1e-3)
        >>> _ = master.step(opt, lambda: (model[0].float() - 2).pow(2))   # the model holds the update
        >>> bool((model[0] != 1).any()), opt.step_count
        (True, 1)
    """

    def __init__(self, params):
        if isinstance(params, torch.Tensor):   # list() split it into rows, each with a master of its own (as MeZO)
            raise ValueError("Invalid params: expected an iterable of tensors, got a tensor (pass [tensor])")
        self.params = list(params)
        for p in self.params:   # an integer tensor's master would be perturbed, then truncated into it
            if not isinstance(p, torch.Tensor) or not p.is_floating_point():
                raise ValueError(f"Invalid params: a master copy is kept for floating-point tensors, got "
                                 f"{p.dtype if isinstance(p, torch.Tensor) else type(p).__name__}")
            kind = not_dense(p)   # sparse, nested: RuntimeError from the overlap check; meta: a master of no data
            if kind is not None:
                where = "a tensor on the meta device (no data)" if p.device.type == "meta" else f"a {kind} tensor"
                raise ValueError(f"Invalid params: {where}; a master copy is kept for dense tensors holding values")
        if len({id(p) for p in self.params}) < len(self.params):   # two masters, one tensor: the last sync wins
            raise ValueError("Invalid params: a tensor appears twice (each needs one master copy)")
        _check_disjoint(self.params)   # views that share entries: the same, entry by entry
        # float32, or the tensor's own dtype when it is wider (a float64 tensor kept in float32 would lose
        # its low bits at the first sync)
        self.tensors = [p.detach().to(master_dtype(p.dtype)).clone() for p in self.params]
        self._declare()
        self._record()

    def _declare(self) -> None:
        for p, master in zip(self.params, self.tensors):
            store_as(master, p.dtype)

    def __getstate__(self) -> dict:   # deepcopy/pickle: without the weak reference to the last optimiser
        return {k: v for k, v in self.__dict__.items() if k != "_optimizer"}

    def __setstate__(self, state: dict) -> None:   # deepcopy/pickle: the copies are masters too
        self.__dict__.update(state)
        self._declare()
        self._record()   # new tensors, new version counters

    def _record(self) -> None:
        """Where the model and the masters stand at a sync: each model tensor's (version, address) and each
        master's version, which ``follow_writes`` and ``wrap`` compare with to see what moved since."""
        self._synced = [(_written(p), _version(master)) for p, master in zip(self.params, self.tensors)]

    def _written_in_place(self) -> list[int]:
        """Indices of the model tensors written in place, or re-pointed, since the last sync."""
        synced = getattr(self, "_synced", None) or [(None, None)] * len(self.params)
        return [k for k, (p, (mark, _)) in enumerate(zip(self.params, synced)) if mark != _written(p)]

    @torch.no_grad()
    def follow_writes(self) -> None:
        """Make the model's writes since the last sync the masters' (the next sync would undo them).

        The masters the optimiser has not moved since the last sync take the model's entries that differ from them
        rounded to the model's dtype (``written_entries``: writes through ``.data`` or numpy are seen too); the
        other entries keep their extra precision. A folded update pending in the optimiser last given to ``step``
        is applied first, on the masters, so the written entries stand (as in ``MeZO.load_state_dict``) and the
        others take it. A master moved since the last sync (an ``opt.flush()`` or ``opt.state_dict()`` of a folded
        run) takes its model tensor whole where that was written in place since, and is kept otherwise. Called by
        ``step`` and ``state_dict``; ValueError, nothing changed, if a model tensor changed shape."""
        synced = getattr(self, "_synced", None) or [(None, None)] * len(self.params)
        for k, (p, master) in enumerate(zip(self.params, self.tensors)):
            if p.shape != master.shape:
                raise ValueError(f"Invalid params: model tensor {k} now has shape {tuple(p.shape)}, its master "
                                 f"{tuple(master.shape)}; build a new Float32Master")
        written = set(self._written_in_place())
        found = {k: written_entries(p.detach(), master)
                 for k, (p, master, (_, moved)) in enumerate(zip(self.params, self.tensors, synced))
                 if moved == _version(master)}
        found = {k: entries for k, entries in found.items() if entries is not None}
        moved = any(was != _version(master) for master, (_, was) in zip(self.tensors, synced))
        with InterruptsDeferred():   # every write taken, or (Ctrl-C before) none
            flushed = bool(found) and self._flush_last_optimizer()   # its update lands where the model was not written
            for k, (p, master) in enumerate(zip(self.params, self.tensors)):
                if k in found:
                    put_entries(master, found[k])
                elif k in written and synced[k][1] != _version(master):
                    master.copy_(p.detach())
            if flushed or moved:   # the model shows the masters the optimiser moved (else a later call took the
                self.sync()        # stale entries for writes and put them back: the update was lost)
            else:
                self._record()

    def state_dict(self) -> dict:
        """``{"masters": [...]}``: a copy of each master, in parameter order. A checkpoint of a run needs them
        beside the optimiser's state: the model holds them rounded to half precision, and masters rebuilt
        from it lose what the steps added below one unit of its last place, so the resumed run parts from the
        uninterrupted one. The optimiser last given to ``step`` is flushed first (and the model synced): with
        ``fold_updates=True`` the masters hold θ − εz until then, and a checkpoint written as
        ``{"master": master.state_dict(), "opt": opt.state_dict()}`` saved them so, with the update lost. After
        steps taken otherwise (``opt.step(master.wrap(...))``), call ``opt.flush()`` first."""
        self.follow_writes()   # the model's writes since the last step: the next step would start from them
        if self._flush_last_optimizer():
            self.sync()
        return {"masters": [master.detach().clone() for master in self.tensors]}

    def _flush_last_optimizer(self) -> bool:
        """Apply the pending folded update of the optimiser last given to ``step``, if any (True if there was one)."""
        optimizer = self._optimizer() if getattr(self, "_optimizer", None) is not None else None
        if optimizer is None or not getattr(optimizer, "pending", False):
            return False
        optimizer.flush()
        return True

    @torch.no_grad()
    def load_state_dict(self, state_dict: dict) -> None:
        """Copy a ``state_dict()``'s masters into this one's (in place: the optimiser tunes these tensors), then
        ``sync()`` the model; a folded update pending in the optimiser last given to ``step`` is applied first.
        ValueError, with nothing changed, unless it holds one dense tensor per master, of its shape and dtype,
        finite and within its parameter's range."""
        masters = state_dict.get("masters") if isinstance(state_dict, dict) else None
        if not isinstance(masters, (list, tuple)) or len(masters) != len(self.tensors):
            raise ValueError(f"Invalid state_dict: expected {{'masters': [{len(self.tensors)} tensors]}} as "
                             f"Float32Master.state_dict() writes it")
        for k, (p, master, saved) in enumerate(zip(self.params, self.tensors, masters)):
            if not isinstance(saved, torch.Tensor) or not_dense(saved) is not None \
                    or saved.shape != master.shape or saved.dtype != master.dtype:
                described = (f"{saved.dtype} of shape {tuple(saved.shape)}" if isinstance(saved, torch.Tensor)
                             else type(saved).__name__)
                raise ValueError(f"Invalid state_dict: master {k} is {described}, expected {master.dtype} of shape "
                                 f"{tuple(master.shape)}")
            if saved.numel() and not bool(saved.isfinite().all()):
                raise ValueError(f"Invalid state_dict: master {k} holds inf or NaN")
            top = float(saved.abs().max()) if saved.numel() else 0.0
            if top > torch.finfo(p.dtype).max:
                raise ValueError(f"Invalid state_dict: master {k} holds a value of size {top:.4g}, beyond "
                                 f"{p.dtype}'s largest {torch.finfo(p.dtype).max:.6g}")
        # an update still pending in the optimiser last given to step would land on the loaded masters at its
        # next pass (or at its own load_state_dict): applied now, to the masters about to be overwritten
        self._flush_last_optimizer()
        with InterruptsDeferred():   # every master and the model, or (Ctrl-C before) none
            for master, saved in zip(self.tensors, masters):
                master.copy_(saved)
            self.sync()

    def step(self, optimizer, closure, weights=None):
        """``optimizer.step(self.wrap(closure), weights)``, then the model synced from the master,
        whether the step committed or failed (the model then holds where the master stands: with
        ``fold_updates=True`` that is θ − εz until ``optimizer.flush()``; call ``sync()`` after it
        before evaluating the model)."""
        self._check_tunes_masters(optimizer)
        self._optimizer = weakref.ref(optimizer)   # state_dict() flushes it: a folded update waits in the masters
        self.follow_writes()   # a checkpoint loaded into the model, an edited weight: its passes start there
        try:
            return optimizer.step(self.wrap(closure), weights)
        finally:
            self.sync()

    def _check_tunes_masters(self, optimizer) -> None:
        """ValueError unless ``optimizer`` tunes every master copy and none of the model's tensors: given the
        model's tensors, each pass was overwritten by the sync before the forward, so both losses were the
        master's, g = 0, and every step was lost (a FlatLossWarning, after 4 to 16 steps, was the only sign)."""
        tuned = {id(p) for group in getattr(optimizer, "param_groups", ()) for p in group.get("params", ())}
        if any(id(p) in tuned for p in self.params) or not all(id(m) in tuned for m in self.tensors):
            raise ValueError("Invalid optimizer: it must tune the master copies (MeZO(master.tensors, ...)), not the "
                             "model's tensors, which each sync overwrites with the masters")

    @torch.no_grad()
    def sync(self) -> None:
        """Copy master → model parameters (cast to each parameter's dtype).

        Raises ``OverflowError``, with every model parameter left as it was, when a master value
        lies outside its parameter's range (float16: |x| > 65504): the cast would write ±inf. Ctrl-C is
        held until every parameter is copied.
        """
        for k, (p, master) in enumerate(zip(self.params, self.tensors)):
            limit = torch.finfo(p.dtype).max if p.dtype.is_floating_point else None
            if limit is not None and limit < torch.finfo(torch.float32).max:     # float16: a narrower range
                top = float(master.abs().max()) if master.numel() else 0.0
                if top > limit:
                    raise OverflowError(f"Float32Master.sync: parameter {k} has a master value of size {top:.4g}, "
                                        f"beyond {p.dtype}'s largest {limit:.6g}; the model was not changed")
        with InterruptsDeferred():   # a Ctrl-C part-way left the model's tensors at two different steps
            for p, master in zip(self.params, self.tensors):
                p.copy_(master)
            self._record()

    def wrap(self, closure):
        """A closure that syncs first; after the last ``MeZO.step`` call ``sync()`` once more.

        It raises ValueError (MeZO then puts the masters back; the model keeps the write) when a model tensor was
        written in place since the last sync: the sync would overwrite the write. ``follow_writes()`` keeps it."""
        def synced():
            written = self._written_in_place()
            if written:
                raise ValueError(f"Invalid model: tensor {written[0]} was written since the last sync (a checkpoint "
                                 f"load, an edit), which this sync would overwrite; call master.follow_writes() "
                                 f"before the step to keep it, or master.sync() to discard it; parameters restored")
            self.sync()
            return closure()
        return synced


def _version(tensor: torch.Tensor):
    """``tensor``'s version counter (bumped by every in-place write but ``.data``'s), None where it has none (an
    inference tensor)."""
    try:
        return tensor._version
    except RuntimeError:
        return None


def _written(tensor: torch.Tensor) -> tuple:
    """What changes when ``tensor`` is written in place or re-pointed (``p.data = q``): version and address."""
    return _version(tensor), tensor.data_ptr()


@torch.no_grad()
def written_entries(param: torch.Tensor, master: torch.Tensor):
    """The entries of ``param`` that differ from ``master`` rounded to ``param``'s dtype (those written since the
    last sync), as ``(where, values)`` for ``put_entries``, or None where none differs.

    Chunk by chunk, through two buffers of at most ``FOLLOW_CHUNK`` entries reused for every chunk; what it
    returns holds the written entries only (their flat indices and values): rounding the whole master to compare
    (``param != master.to(param.dtype)``) allocated half a master per tensor each step. An exact check has to read
    both tensors anyway: writes through ``.data`` leave no trace (no version count), and any checksum misses
    some. Tensors that are not both contiguous are compared whole (``where`` is then a mask).
    """
    if not (param.is_contiguous() and master.is_contiguous()):
        written = param != master.to(param.dtype)
        return (written, param[written]) if bool(written.any()) else None
    flat_param, flat_master = param.view(-1), master.view(-1)
    size = min(FOLLOW_CHUNK, flat_param.numel())
    rounded = torch.empty(size, dtype=param.dtype, device=param.device)
    differs = torch.empty(size, dtype=torch.bool, device=param.device)
    where, values = [], []
    for start in range(0, flat_param.numel(), FOLLOW_CHUNK):
        chunk = flat_param[start:start + FOLLOW_CHUNK]
        n = chunk.numel()
        rounded[:n].copy_(flat_master[start:start + n])   # the value the last sync wrote into the model
        torch.ne(chunk, rounded[:n], out=differs[:n])
        if bool(differs[:n].any()):
            where.append(differs[:n].nonzero().view(-1) + start)
            values.append(chunk[differs[:n]])
    return (torch.cat(where), torch.cat(values)) if where else None


@torch.no_grad()
def put_entries(master: torch.Tensor, entries) -> None:
    """Write ``written_entries``' result into ``master`` (cast to its dtype)."""
    where, values = entries
    if where.dtype == torch.bool:
        master[where] = values.to(master.dtype)
    else:
        master.view(-1)[where] = values.to(master.dtype)


def unit_roundoff(dtype: torch.dtype) -> float:
    """u = 2^-(mantissa bits + 1): 2⁻²⁴ float32, 2⁻¹¹ float16, 2⁻⁸ bfloat16."""
    return float(torch.finfo(dtype).eps) / 2.0


def restore_bound(theta: torch.Tensor, eps: float, z: torch.Tensor, *, passes: int = 3) -> torch.Tensor:
    """Elementwise bound on |θ_restored − θ| after ``passes`` rounded in-place shifts.

    A raised closure leaves MeZO at θ+εz (1st call: 2 adds to get back) or θ−εz (2nd call:
    3 adds). Each add rounds its result r with error ≤ u·|r|, and every intermediate is
    at most |θ| + 2ε|z| in size, so

        |θ_restored − θ| ≤ u · passes · (|θ| + 2ε|z|) + passes · tiny

    Example:
        >>> t = torch.ones(2, dtype=torch.bfloat16)
        >>> bool((restore_bound(t, 1e-3, torch.ones(2)) > 0).all())
        True
    """
    u = unit_roundoff(theta.dtype)
    tiny = float(torch.finfo(theta.dtype).tiny)
    size = theta.double().abs() + 2.0 * abs(eps) * z.double().abs()
    return passes * (u * size + tiny)

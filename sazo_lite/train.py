"""The training loop where an optimiser and a sampler meet, through indices, weights and diffs.

    indices, weights = sampler.sample(B)
    result = optimizer.step(lambda: batch_losses(indices), weights)
    sampler.update(indices, result.directional_diffs)

Each step costs 2·B per-example queries (two forward passes over B examples). This is the one ZO
loop of the project: the toy benchmark, the course's races and the language-model query race all
call ``train``. The rules they share are written here once:

* ``diverged(value, limit)``: a run has diverged when its logged metric is not finite or climbs
  above ``limit`` (``divergence_limit(start, factor)``: ``factor`` × its starting value, each caller
  with its own factor), or when the optimiser refused a non-finite loss (MeZO raises
  ``FloatingPointError`` and restores θ).
* ``queries_to_target(record, target)``: the first logged query count with metric ≤ target.
* ``median_queries`` / ``best_rate``: the best rate of a grid is the one with the fewest median
  queries over seeds, a miss (diverged or over budget) counting as never (∞); ties go to the
  smaller tie-break value (e.g. the median final loss), then to the earlier grid rate.
* ``NoiseScaledStep``: an optional step-size rule that knows nothing of samplers: the step grows
  when the running mean square of the steps' scale ĝ falls below its early level, and shrinks when
  it rises (η_t = η₀ · clip(m_ref / m_t, 1/c, c)).
"""
from __future__ import annotations

import copy
import math
import numbers
import random
import statistics
from dataclasses import dataclass, field
from typing import Callable, Collection, Mapping, Sequence

import numpy as np
import torch

from .engine import FLAT_EXAMPLES, FLAT_STEPS, FlatLossCheck, FlatLossWarning, _booleans_or_complex
from .interrupts import InterruptsDeferred
from .samplers import Sampler
from .validation import (check_bool, check_callable, check_count, check_fraction, check_int, check_limit, check_number,
                         check_real, check_state_settings, dense_tensor)

__all__ = ["History", "FlatLossWarning", "train", "queries_to_target", "diverged", "divergence_limit", "reached", "median_queries",
           "median_ratio_interval", "mean_difference_interval", "best_rate", "past_edge", "NoiseScaledStep"]


@dataclass
class History:
    """What ``train`` recorded.

    Per step: ``queries`` (cumulative, 2·B per step), ``loss`` (the step's weighted minibatch
    loss), ``projected_grad`` (ĝ = mean_k w_k·δ_k: MeZO moves θ by −lr·ĝ·z), ``max_weight`` (the
    largest importance weight drawn) and ``lr`` (the rate the step used). Every ``log_every`` steps
    (and after the last): ``logged_steps``, ``logged_queries``, ``metrics`` (the ``evaluate``
    callback's value) and ``probs`` (a copy of the sampler's distribution, when ``record_probs``).
    ``diverged``: the run stopped by the divergence rule (only when ``diverge_above`` was given).
    """

    queries: list[int] = field(default_factory=list)
    loss: list[float] = field(default_factory=list)
    projected_grad: list[float] = field(default_factory=list)
    max_weight: list[float] = field(default_factory=list)
    lr: list[float] = field(default_factory=list)
    logged_steps: list[int] = field(default_factory=list)
    logged_queries: list[int] = field(default_factory=list)
    metrics: list[float] = field(default_factory=list)
    probs: list[torch.Tensor] = field(default_factory=list)
    diverged: bool = False


def diverged(value: float, limit: float) -> bool:
    """The one divergence rule: a metric that is not finite (NaN, ±inf) or above ``limit``.

    Example:
        >>> diverged(1.2, 1.5), diverged(2.0, 1.5), diverged(float("nan"), 1.5)
        (False, True, True)
    """
    return not (math.isfinite(value) and value <= limit)


def divergence_limit(start: float, factor: float) -> float:
    """The ``limit`` of ``diverged`` (``train``'s ``diverge_above``) for a run that has diverged once its metric is
    above ``factor`` × its starting value ``start``: that product, or +inf when ``factor`` is +inf (then only a
    non-finite metric counts, whatever ``start``: inf × 0 would be NaN). ``factor``: above 1, or +inf.
    ``start`` is any real number, used as given (a start of 0 gives a limit of 0; a NaN start a NaN limit, which
    ``train`` refuses and ``diverged`` reads as diverged).

    Example:
        >>> divergence_limit(2.0, 10.0), diverged(25.0, divergence_limit(2.0, 10.0)), divergence_limit(0.0, math.inf)
        (20.0, True, inf)
    """
    factor = check_limit("factor", factor, 1.0, closed_low=False)   # at or below 1 the start itself is past it
    start = check_real("start", start)
    return math.inf if factor == math.inf else factor * start


def reached(value: float, target: float) -> bool:
    """The one target rule: a metric at or below ``target`` has reached it (``train``'s ``stop_below``
    and ``queries_to_target`` both read it).

    Example:
        >>> reached(0.5, 0.5), reached(0.6, 0.5), reached(float("nan"), 0.5)
        (True, False, False)
    """
    return value <= target


class NoiseScaledStep:
    """A sampler-agnostic step-size rule: η_t = η₀ · clip(m_ref / m_t, 1/max_scale, max_scale).

    m_t is an exponential moving average (decay β) of ĝ², the square of the scalar every MeZO step
    moves θ by (θ ← θ − η ĝ z); m_ref is the mean of ĝ² over the first ``warmup`` steps (the scale is
    1 until then). Since a ZO run's usable rate falls as 1/E[ĝ²] (the random walk of θ grows like
    η²·d·Σĝ²), a sampler whose noise falls while it learns (SAZO) may take longer steps, and a run
    whose steps grow (θ leaving the region where it started) is slowed down. The rule sees only ĝ:
    the same rule is applied to every sampler, each with its own base rate η₀. Scaling every ĝ by
    a constant leaves the scales unchanged; a constant ĝ² keeps the scale at 1.

    Example:
        >>> rule = NoiseScaledStep(warmup=2)
        >>> for g in (2.0, 2.0, 1.0, 1.0):
        ...     rule.observe(g)
        >>> 1.0 < rule.scale() < 4.0
        True
    """

    # each setting's rule, written once: the constructor checks its arguments with it, and ``observe``, ``scale`` and
    # ``state_dict`` check the settings again (``_check_settings``)
    RULES = {"decay": lambda v: check_number("decay", v, 0.0, 1.0, closed_high=False),
             "warmup": lambda v: check_count("warmup", v),
             "max_scale": lambda v: check_number("max_scale", v, 1.0)}

    def __init__(self, *, decay: float = 0.95, warmup: int = 20, max_scale: float = 4.0):
        self.decay, self.warmup = self.RULES["decay"](decay), self.RULES["warmup"](warmup)
        self.max_scale = self.RULES["max_scale"](max_scale)
        self.seen, self.reference, self.mean = 0, 0.0, 0.0

    def _check_settings(self) -> None:
        """Each setting as the constructor checks it, before it is read, and kept as the Python number the check
        returns: set between steps, a max_scale of 0.5 halved every rate (the clip's bounds crossed), a decay of 1.5
        or NaN drove the running mean off (NaN: the scale stuck at 1/max_scale), without a word; a numpy float32
        decay ran the mean in float32 and wrote a state that ``torch.load`` refuses with ``weights_only=True``."""
        for name, rule in self.RULES.items():
            setattr(self, name, rule(getattr(self, name)))

    def observe(self, projected_grad: float) -> None:
        """Feed one step's ĝ (a number or a one-element tensor). A non-finite ĝ is skipped; one whose square
        overflows float64 (|ĝ| > ~1.3e154), and anything ``_number`` refuses (a bool, a string, a tensor of
        several entries), is refused with ValueError before anything changes."""
        self._check_settings()
        value = _number("projected_grad", projected_grad)   # float() read True as 1.0 and "2" as 2.0
        if not math.isfinite(value):
            return
        if abs(value) > 1e154:
            raise ValueError(f"Invalid projected_grad: {value!r} (its square overflows float64)")
        square = value * value
        self.seen += 1
        if self.seen <= self.warmup:     # m_ref: the plain mean of the warm-up steps
            self.reference += (square - self.reference) / self.seen
            self.mean = self.reference
        else:
            self.mean = self.decay * self.mean + (1.0 - self.decay) * square

    def state_dict(self) -> dict:
        """The rule's settings and running values (plain numbers): a resumed run scales as the uninterrupted one."""
        self._check_settings()   # a state that would not load (settings out of range) is not written
        return {"decay": self.decay, "warmup": self.warmup, "max_scale": self.max_scale, "seen": self.seen,
                "reference": self.reference, "mean": self.mean}

    def load_state_dict(self, state: dict) -> None:
        """Continue from ``state_dict()``: ValueError, before anything changes, for a state of other settings (its
        scales would not be this rule's) or with a count or mean out of range."""
        check_state_settings("NoiseScaledStep", state, self.state_dict(),
                             {"decay": self.decay, "warmup": self.warmup, "max_scale": self.max_scale})
        seen = check_int("seen", state["seen"], 0)
        reference = check_number("reference", state["reference"], 0.0)
        mean = check_number("mean", state["mean"], 0.0)
        self.seen, self.reference, self.mean = seen, reference, mean

    def scale(self) -> float:
        """The factor on the base rate for the next step (after ``_check_settings``: ValueError for a setting set out
        of its range)."""
        self._check_settings()
        if self.seen <= self.warmup or self.reference <= 0.0:
            return 1.0
        if self.mean <= 0.0:
            return self.max_scale
        return min(self.max_scale, max(1.0 / self.max_scale, self.reference / self.mean))


def train(optimizer, sampler, batch_losses: Callable[[torch.Tensor], torch.Tensor], steps: int, *,
          batch_size: int = 1, evaluate: Callable[[], float] | None = None, log_every: int = 10,
          record_probs: bool = False, progress: bool = True, stop_below: float | None = None,
          diverge_above: float | None = None, step_rule: NoiseScaledStep | None = None,
          description: str = "ZO training", history: History | None = None) -> History:
    """Run ``steps`` ZO steps with any sampler.

    Args:
        optimizer: a ``MeZO`` (anything whose ``step(closure, weights)`` returns a ``ZOStep``).
        sampler: a ``Sampler``: ``sample(B)`` then ``update(indices, directional_diffs)``.
        batch_losses: maps indices [B] to per-example losses [B] at the current parameters (each call
            gets its own copy of the indices).
        steps: number of steps.
        batch_size: B.
        evaluate: optional callback (e.g. full training loss), logged every ``log_every`` steps;
            a folded MeZO (``fold_updates=True``) is flushed first, so it sees the updated θ (so is it before
            each draw and update of a sampler that reads θ, ``reads_parameters``: the oracle).
        log_every: logging interval in steps.
        record_probs: keep a copy of ``sampler.probs`` at each log point (the sampler must have ``probs``).
        progress: show a ``tqdm.auto`` progress bar.
        stop_below: stop early once ``evaluate()`` is at or below this value (``reached``, the rule
            ``queries_to_target`` counts by; needs ``evaluate``). It is judged at the log points only: a
            target already met at θ₀ stops the run at the first one, after ``log_every`` steps (``train``
            does not evaluate θ₀; a caller that does, as ``llm.queries.query_run``, decides there).
        diverge_above: apply the divergence rule (``diverged``): stop, with ``history.diverged``
            set, once ``evaluate()`` is not finite or exceeds this value, or when the optimiser
            refuses a non-finite loss. Without it a non-finite loss raises ``FloatingPointError``.
        step_rule: optional ``NoiseScaledStep``: every step's rate is the optimiser's base rate
            times ``step_rule.scale()`` (the base rates are restored when ``train`` returns); the optimiser
            must have ``param_groups`` (ValueError otherwise: the rule would scale nothing).
        description: the progress bar's label.
        history: an empty ``History`` to fill in place (default: a new one). Pass one to keep the
            record of the steps taken when ``train`` raises (Ctrl-C, a sampler that refuses its
            feedback): it holds every step the optimiser committed, since a step is recorded as
            soon as θ has moved, before the sampler sees its feedback. A step that does not happen (the closure
            raised, Ctrl-C in a forward pass, a refused non-finite loss) takes its draw back from a library
            sampler (MeZO keeps its step count: the next step takes the same z), and a committed step that a
            Ctrl-C or a step hook interrupts still feeds ``step_rule`` and the sampler: calling ``train`` again
            with the same objects continues the uninterrupted run (θ to the rounding of MeZO's restore).

    Warns ``FlatLossWarning`` when the first steps of this call saw losses exactly equal at θ+εz and
    θ−εz (``engine.FLAT_STEPS``, ``engine.FLAT_EXAMPLES``): parameters that do not reach the loss make
    a run that moves nothing and says nothing. The rule is ``engine.FlatLossCheck``: a MeZO's own
    steps run it (``train`` gives it a new ``flat_check`` first, so the warning comes once, from
    the optimiser); for another optimiser ``train`` runs it.

    Returns:
        The ``History``.
    """
    from tqdm.auto import tqdm

    steps = check_int("steps", steps, 0)
    batch_size = check_count("batch_size", batch_size)
    log_every = check_count("log_every", log_every)
    if stop_below is not None:
        stop_below = check_number("stop_below", stop_below)
        if evaluate is None:   # the metric it is compared with comes from evaluate: without it, never compared
            raise ValueError("Invalid stop_below: it stops on evaluate()'s value, and no evaluate was given")
    if diverge_above is not None:
        diverge_above = check_limit("diverge_above", diverge_above)   # +inf: stop on a non-finite metric only
    if step_rule is not None and not isinstance(step_rule, NoiseScaledStep):
        raise ValueError(f"Invalid step_rule: {type(step_rule).__name__} (expected a NoiseScaledStep)")
    check_bool("record_probs", record_probs)
    if record_probs and not _has_probs(sampler):   # found at the first log point, after the steps before it
        raise ValueError(f"Invalid sampler: record_probs=True, but {type(sampler).__name__} has no probs")
    check_bool("progress", progress)
    check_callable("batch_losses", batch_losses)
    check_callable("evaluate", evaluate, optional=True)
    history = _check_history(history)
    groups = getattr(optimizer, "param_groups", [])
    if step_rule is not None and not groups:   # the rule scales each group's lr: with none, it ran and changed nothing
        raise ValueError(f"Invalid step_rule: {type(optimizer).__name__} has no param_groups whose lr it could scale")
    flat = _flat_check(optimizer)
    base_rates = [group["lr"] for group in groups]
    queries = 0
    bar = tqdm(range(steps), desc=description, disable=not progress)
    try:
        for step in bar:
            scale = step_rule.scale() if step_rule is not None else 1.0
            if step_rule is not None:
                for group, rate in zip(groups, base_rates):
                    group["lr"] = rate * scale
            before, recorded, fed = _step_count(optimizer), len(history.loss), []
            point = _draw_point(sampler) if before is not None else None   # an optimiser without a count: unknown
            try:
                _flush_for(sampler, optimizer)
                indices, weights = _drawn(sampler, batch_size)
                rate = groups[0]["lr"] if groups else float("nan")   # as the step finds it (a step hook may set it)
                result = optimizer.step(lambda: batch_losses(_copy(indices)), weights)
                # θ has moved: record the step before anything else can raise (the sampler may refuse
                # its feedback), so the History never lags behind θ; inside the try, since a Ctrl-C may
                # also arrive between step's return and the record
                _record(history, result, queries + 2 * batch_size, weights, rate)
                _feed(fed, result, indices, sampler, optimizer, step_rule, flat)
            except BaseException as error:
                late = _committed(optimizer, before) if len(history.loss) == recorded else None
                if late is not None:   # θ moved, then a step hook or a Ctrl-C raised: keep the record
                    _record(history, late, queries + 2 * batch_size, weights, rate)
                if late is not None or len(history.loss) > recorded:
                    if not fed:   # ... and the step rule and the sampler learn from it, as after any step
                        _feed(fed, result if late is None else late, indices, sampler, optimizer, step_rule, flat)
                    raise
                _rewind(point)   # no step: nor its draw, so a resumed run draws this step's batch again
                if not isinstance(error, FloatingPointError) or diverge_above is None:
                    raise
                history.diverged = True   # MeZO refused a non-finite loss and restored θ
                break
            queries += 2 * batch_size
            if (step + 1) % log_every == 0 or step + 1 == steps:
                value = _log(history, optimizer, sampler, evaluate, step + 1, queries, record_probs)
                if value is not None:
                    bar.set_postfix(metric=f"{value:.4g}", refresh=False)
                    if diverge_above is not None and diverged(value, diverge_above):
                        history.diverged = True
                        break
                    if stop_below is not None and reached(value, stop_below):
                        break
    finally:
        bar.close()
        if step_rule is not None:   # the rule's scaled rates are undone; without it the rates are the caller's
            for group, rate in zip(groups, base_rates):
                group["lr"] = rate
        flush = getattr(optimizer, "flush", None)
        if flush is not None:  # the parameters are current when train returns or raises (Ctrl-C between steps)
            flush()
    return history


def _feed(fed: list, result, indices, sampler, optimizer, step_rule, flat) -> None:
    """What a committed step gives the step rule, the flat-loss check and the sampler, with Ctrl-C held so that
    all of it is given or, if interrupted before it starts, ``train`` gives it on the way out: a Ctrl-C between
    the step and the sampler's update left θ moved and the sampler without the step's diffs (and the rule
    without its ĝ), so a run resumed from there parted from the uninterrupted one. ``fed`` records that it
    started (a sampler that refuses its feedback is not fed twice)."""
    with InterruptsDeferred():
        fed.append(True)
        if step_rule is not None:
            step_rule.observe(result.projected_grad)
        if flat is not None:
            flat.observe(result)
        if result.directional_diffs.numel():
            _flush_for(sampler, optimizer)
            sampler.update(indices, result.directional_diffs)


def _draw_point(sampler):
    """A library sampler's generator and its state before a draw (None for another sampler): ``_rewind`` puts it
    back when the step does not happen (known by the optimiser's step count, which a failed MeZO step keeps)."""
    generator = getattr(sampler, "_generator", None) if isinstance(sampler, Sampler) else None
    return (generator, generator.get_state()) if isinstance(generator, torch.Generator) else None


def _rewind(point) -> None:
    """The sampler's generator as before the draw of a step that did not happen (the closure raised, Ctrl-C during
    the forward passes, a refused non-finite loss): MeZO puts θ back and keeps its step count, so the next step
    takes the same z; without this the sampler's next draw was the one after the lost step's, and a run
    interrupted and resumed drew other batches than the uninterrupted one."""
    if point is not None:
        point[0].set_state(point[1])


def _flush_for(sampler, optimizer) -> None:
    """Before a draw or an update: a folded MeZO holds θ − εz between steps (its update pending), so a sampler that
    reads θ (``reads_parameters``: the oracle's ``norms_fn``) gets the updated θ first, as ``evaluate`` does. The
    oracle drew by the norms at the last step's θ − εz: not the folded run's θ, nor the unfolded run's draws, and a
    run resumed from a checkpoint (flushed when saved) drew other examples."""
    if getattr(sampler, "reads_parameters", False):
        flush = getattr(optimizer, "flush", None)
        if flush is not None:
            flush()


def _flat_check(optimizer) -> FlatLossCheck | None:
    """The flat-loss check ``train`` feeds: None for an optimiser that runs the rule in its own steps (a
    MeZO, given a new check here so that this call's first steps are judged; one whose ``flat_check``
    the caller set to None keeps it off), else a new one."""
    if not hasattr(optimizer, "flat_check"):
        return FlatLossCheck()
    if optimizer.flat_check is not None:
        optimizer.flat_check = FlatLossCheck()
    return None


def _check_history(history) -> History:
    """A new History, or the caller's, which must be empty (query counts and step numbers start at 0)."""
    if history is None:
        return History()
    if not isinstance(history, History):
        raise ValueError(f"Invalid history: {type(history).__name__} (expected a History)")
    if history != History():   # any list not empty, or diverged set
        raise ValueError("Invalid history: expected an empty History (train counts steps and queries from 0)")
    return history


def _has_probs(sampler) -> bool:
    """Whether ``sampler`` has ``probs``, found without computing them (an oracle's calls its norms_fn)."""
    return hasattr(type(sampler), "probs") or "probs" in getattr(sampler, "__dict__", {})


def _drawn(sampler, batch_size: int):
    """``sampler.sample(B)``, which must give B indices and B weights: the query count is 2·B a step."""
    drawn = sampler.sample(batch_size)
    if not isinstance(drawn, (tuple, list)) or len(drawn) != 2:   # unpacked a [2, B] tensor, or raised a bare error
        raise ValueError(f"Invalid sampler: sample({batch_size}) returned {type(drawn).__name__} (expected a pair "
                         f"(indices, weights))")
    indices, weights = drawn
    try:
        sizes = len(indices), len(weights)
    except TypeError:   # a number or a 0-d tensor
        sizes = None
    if sizes != (batch_size, batch_size):
        raise ValueError(f"Invalid sampler: sample({batch_size}) returned {_size(indices)} indices and "
                         f"{_size(weights)} weights (expected {batch_size} of each)")
    return indices, weights


def _size(value) -> str:
    """How many entries ``value`` has, for an error message (a 0-d tensor or a number has no length)."""
    try:
        return str(len(value))
    except TypeError:
        return f"a {type(value).__name__} without a length, not"


def _copy(indices):
    """The indices for one call of ``batch_losses``: a copy, since a closure that edits its argument in place
    (``idx.clamp_``, ``idx -= 1``) changed the examples of the second call and the indices the sampler's
    feedback went to."""
    return indices.clone() if isinstance(indices, torch.Tensor) else copy.copy(indices)


def _step_count(optimizer) -> int | None:
    """The optimiser's step count, or None (an optimiser without one; a MeZO whose groups were edited
    so that the count cannot be read: its step() raises the ValueError that says why)."""
    try:
        return optimizer.step_count
    except Exception:   # noqa: BLE001 - only a hint for _committed
        return None


def _committed(optimizer, before):
    """The ZOStep of a step that committed although ``step`` raised (MeZO keeps it as ``last_step``),
    else None."""
    if before is None or _step_count(optimizer) != before + 1:
        return None
    return getattr(optimizer, "last_step", None)


def _record(history: History, result, queries: int, weights, lr: float) -> None:
    """One committed step's entries, appended together (computed first: nothing half-appended)."""
    # Python floats read in float64 (dense_tensor), as the optimiser read them: float32 rounded 0.3 to 0.30000001
    max_weight, lr = float(dense_tensor("weights", weights).max()), float(lr)   # the step took lr: a number
    with InterruptsDeferred():   # a Ctrl-C between two appends left lists of different lengths
        history.queries.append(queries)
        history.loss.append(result.loss)
        history.projected_grad.append(result.projected_grad)
        history.max_weight.append(max_weight)
        history.lr.append(lr)


def _log(history: History, optimizer, sampler, evaluate, step: int, queries: int, record_probs: bool):
    flush = getattr(optimizer, "flush", None)
    if flush is not None:  # a folded MeZO: evaluate the updated parameters
        flush()
    value = _number("evaluate result", evaluate()) if evaluate is not None else None
    # computed before any append: evaluate or probs (an oracle's norms_fn) that raises logs no point, and a
    # Ctrl-C is held until the point is whole
    probs = _snapshot(torch.as_tensor(sampler.probs)) if record_probs else None
    with InterruptsDeferred():
        history.logged_steps.append(step)
        history.logged_queries.append(queries)
        if value is not None:
            history.metrics.append(value)
        if probs is not None:
            history.probs.append(probs)
    return value


def _snapshot(probs: torch.Tensor) -> torch.Tensor:
    """A copy of ``probs`` that later steps cannot change. One value read N times (a uniform sampler's
    expanded view, N up to 2⁶³ − 1) is copied as that value, expanded again: clone() wrote out N floats."""
    if probs.dim() == 1 and probs.numel() > 1 and probs.stride(0) == 0:
        return probs[:1].clone().expand(probs.shape)
    return probs.clone()


def _number(name: str, value) -> float:
    """A number or a one-element tensor as a float (``evaluate``'s result, ``NoiseScaledStep``'s ĝ), or
    ``ValueError("Invalid <name>: ...")``: not a bool, a string or None (float() read True as 1.0, and the others
    raised errors that did not say which value), nor a numpy or torch bool, read as 1.0 too, or a numpy complex,
    whose imaginary part float() dropped."""
    if value is None or isinstance(value, (bool, str, bytes)) or _booleans_or_complex(value):
        raise ValueError(f"Invalid {name}: {value!r} (expected a number)")
    if isinstance(value, torch.Tensor):   # float() of a tensor that requires grad warned from inside train
        value = value.detach()
    try:
        return float(value)
    except OverflowError:   # an int or Fraction beyond float64's range: float() raised OverflowError, unnamed
        raise ValueError(f"Invalid {name}: {str(value)[:80]} (beyond float64's range)") from None
    except (TypeError, ValueError, RuntimeError):
        raise ValueError(f"Invalid {name}: {value!r} (expected a number or a one-element tensor)") from None


def queries_to_target(record, target: float) -> int | None:
    """First logged query count at which the metric is ≤ ``target`` (None if never).

    ``record`` is a ``History`` (its ``logged_queries`` and ``metrics``) or a pair of sequences
    ``(queries, values)`` of one length (ValueError otherwise; no values at all, as a run without
    ``evaluate``, gives None).

    Example:
        >>> queries_to_target(([0, 10, 20], [1.0, 0.6, 0.4]), 0.5)
        20
    """
    queries, values = (record.logged_queries, record.metrics) if isinstance(record, History) else record
    if len(values) and len(queries) != len(values):   # zip paired them by position, silently
        raise ValueError(f"Invalid record: {len(queries)} query counts and {len(values)} values (expected one count "
                         f"per logged value: a History's logged_queries, not its per-step queries)")
    for count, value in zip(queries, values):
        if reached(value, target):
            return count
    return None


def median_queries(values: Sequence[int | float | None]) -> float:
    """Median over seeds of queries to a target; a miss (None) counts as never (∞).

    Each value is a number of queries ≥ 0 or a miss (None / ∞); NaN, negative values, bools, non-numbers and
    no values at all raise ValueError (a NaN sorted anywhere: [nan, 100, 120] had median 100, [100, nan, 120] nan).

    Example:
        >>> median_queries([100, None, 120]), median_queries([None, None, 120])
        (120, inf)
    """
    return statistics.median(_check_queries("values", values, zero=True))


def _check_queries(name: str, values, *, zero: bool = False) -> list[float]:
    """Queries per seed as median_ratio_interval (each > 0) and median_queries (each ≥ 0: ``zero``) take them:
    a number of queries or a miss (None / ∞, returned as ∞); NaN, negative, bool, non-numbers and numbers beyond
    float64 (``check_real``) refused, naming the argument."""
    checked = []
    for v in values:
        if v is None:
            v = math.inf
        number = check_real(f"queries in {name}", v)   # math.isnan raised OverflowError on 10**400
        if math.isnan(number) or number < 0 or (number == 0 and not zero):
            raise ValueError(f"Invalid queries in {name}: {v!r} (expected queries {'>= 0' if zero else '> 0'}, "
                             f"or None / inf for a miss)")
        checked.append(v)
    if not checked:
        raise ValueError(f"Invalid queries: expected at least one seed in {name}")
    return checked


def median_ratio_interval(numerator: Sequence[int | float | None], denominator: Sequence[int | float | None], *,
                          level: float = 0.95, draws: int = 2000, seed: int = 0) -> tuple[float, float]:
    """Percentile-bootstrap interval of median_queries(numerator) / median_queries(denominator).

    Each sampler's seeds are resampled with replacement, independently; a miss counts as never, so a
    resampled ratio is ∞ when only the numerator's median misses and 0 when only the denominator's
    does (draws where both miss say nothing and are left out); (nan, nan) when every draw does.
    For "uniform ÷ SAZO" pass uniform's queries per seed as the numerator. Each value must be a
    positive number of queries or a miss (None / ∞): empty sides, 0, NaN and negative values raise
    ValueError naming the argument.

    Example:
        >>> low, high = median_ratio_interval([200, 220, 240, 260, 280], [100, 110, 120, 130, 140])
        >>> 1.4 < low <= 2.0 <= high < 2.9
        True
    """
    numerator, denominator = _check_queries("numerator", numerator), _check_queries("denominator", denominator)
    level = check_fraction("level", level, 0.0, 1.0, closed_low=False, closed_high=False)
    draws = check_count("draws", draws)
    rng = random.Random(check_int("seed", seed))
    ratios = []
    for _ in range(draws):
        top = median_queries(rng.choices(numerator, k=len(numerator)))
        bottom = median_queries(rng.choices(denominator, k=len(denominator)))
        if not (math.isinf(top) and math.isinf(bottom)):
            ratios.append(math.inf if math.isinf(top) else 0.0 if math.isinf(bottom) else top / bottom)
    if not ratios:
        return math.nan, math.nan
    ratios.sort()
    tail = (1.0 - level) / 2.0
    pick = lambda q: ratios[min(len(ratios) - 1, max(0, round(q * (len(ratios) - 1))))]
    return pick(tail), pick(1.0 - tail)


def mean_difference_interval(first: Sequence[float], second: Sequence[float], *, level: float = 0.95) -> tuple[float, float]:
    """mean(first) − mean(second) and the half-width of its normal interval, z·√(s₁²/n₁ + s₂²/n₂).

    For a per-seed outcome that is a mean itself (held-out accuracy after a fixed budget): e.g.
    SAZO's accuracies as ``first`` and uniform's as ``second``. Needs two values on each side.

    Example:
        >>> difference, half = mean_difference_interval([0.7, 0.8, 0.75], [0.5, 0.6, 0.55])
        >>> round(difference, 3), round(half, 3)
        (0.2, 0.08)
    """
    if len(first) < 2 or len(second) < 2:
        raise ValueError(f"Invalid samples: expected at least two values on each side, got {len(first)} and {len(second)}")
    # read as floats (``check_real``): numpy scalars (a float32 accuracy, an int64 count) were refused as "not finite
    # numbers", and an int beyond float64 raised OverflowError
    first, second = ([check_real(side, v) for v in values] for side, values in (("first", first), ("second", second)))
    for side, values in (("first", first), ("second", second)):
        bad = [v for v in values if not math.isfinite(v)]
        if bad:
            raise ValueError(f"Invalid {side}: expected finite numbers, got {bad[0]!r}")
    level = check_fraction("level", level, 0.0, 1.0, closed_low=False, closed_high=False)
    z = statistics.NormalDist().inv_cdf(0.5 + level / 2.0)
    half = z * (statistics.variance(first) / len(first) + statistics.variance(second) / len(second)) ** 0.5
    return statistics.mean(first) - statistics.mean(second), half


def past_edge(diverged: Sequence[bool]) -> bool:
    """Whether a rate is past a method's edge: at least half of its seeds diverged (the grid rule).

    Queries to a target are first hits (``queries_to_target``), kept if a seed diverges later, so a
    rate whose seeds cross a shallow target fast and then mostly diverge could win a grid on counts
    alone; a race does not choose such a rate (unless every rate is past it).

    Each flag is a bool (Python's, numpy's or a one-element bool tensor) or the int 0 or 1; anything else is a
    ValueError (``bool()`` read the string "False" and NaN as diverged: flags read from a CSV put every rate past
    its edge, silently).

    Example:
        >>> past_edge([True, False, False]), past_edge([True, True, False, False])
        (False, True)
    """
    flags = [_flag("diverged", flag) for flag in diverged]
    if not flags:
        raise ValueError("Invalid diverged: expected one flag per seed, got none")
    return 2 * sum(flags) >= len(flags)


def _flag(name: str, value) -> bool:
    """A yes/no flag as a bool, or ValueError naming ``name``: a bool (Python's, numpy's, a one-element bool
    tensor) or the int 0 or 1."""
    if isinstance(value, torch.Tensor) and value.numel() == 1 and value.dtype == torch.bool:
        return bool(value)
    if isinstance(value, (bool, np.bool_)) or (isinstance(value, numbers.Integral) and value in (0, 1)):
        return bool(value)
    raise ValueError(f"Invalid {name}: {value!r} (expected a flag per seed: True/False, or 1/0)")


def best_rate(per_rate: Mapping[float, Sequence[int | None]], tiebreak: Mapping[float, float] | None = None,
              past_edges: Collection[float] = ()):
    """The rate with the fewest median queries over seeds (misses count as ∞; the one grid rule).

    Args:
        per_rate: rate → queries to the target per seed (None: diverged or over budget), in grid order.
        tiebreak: optional rate → a value to minimise among equal medians (e.g. the median final loss), a number
            for every rate of ``per_rate`` (±inf allowed, NaN refused); remaining ties go to the earlier rate of
            ``per_rate``.
        past_edges: rates past the method's edge (``past_edge``): not chosen, unless every rate is.

    Example:
        >>> best_rate({1e-3: [100, 120, None], 2e-3: [60, None, None], 4e-4: [200, 220, 240]})
        0.001
        >>> best_rate({1e-3: [100, 120, 130], 2e-3: [60, 70, 80]}, past_edges={2e-3})
        0.001
    """
    if not per_rate:
        raise ValueError("Invalid per_rate: expected at least one rate")
    if tiebreak is not None:
        tiebreak = _tiebreaks(per_rate, tiebreak)
    rates = [rate for rate in per_rate if rate not in past_edges] or list(per_rate)
    key = lambda rate: (median_queries(per_rate[rate]), tiebreak[rate] if tiebreak is not None else 0.0)
    return min(rates, key=key)


def _tiebreaks(per_rate: Mapping, tiebreak: Mapping) -> dict:
    """``tiebreak``'s value for each rate of ``per_rate`` as a float (``_number``), or ValueError naming the rate: a
    NaN compares false with everything, so between equal medians the rate listed first won whatever its rival's
    value (a NaN final loss beat 0.5, or lost to it, by grid order), and a rate without a value raised KeyError."""
    if not isinstance(tiebreak, Mapping):
        raise ValueError(f"Invalid tiebreak: {type(tiebreak).__name__} (expected a mapping rate -> value)")
    values = {}
    for rate in per_rate:
        if rate not in tiebreak:
            raise ValueError(f"Invalid tiebreak: no value for rate {rate!r} (expected one for every rate of per_rate)")
        values[rate] = _number(f"tiebreak of rate {rate!r}", tiebreak[rate])
        if math.isnan(values[rate]):
            raise ValueError(f"Invalid tiebreak of rate {rate!r}: nan (expected a number; NaN orders nowhere: "
                             f"give a diverged run +inf)")
    return values

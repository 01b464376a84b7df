"""Queries to a target training loss on a language model: uniform MeZO, SAZO and the oracle.

One ``query_run`` = one ZO run with one sampler from given weights, through the project's one loop
(``sazo_lite.train.train``: sample → step → update → log/stop, one divergence rule). Measured as the
SAZO paper measures it: the full training loss F(θ) every ``log_every`` steps against queries (2·B per
step). Every run also records what limits its rate (the measured mechanism, docs/llm.md):

* the walk ‖θ−θ₀‖ at every log point: MeZO adds −η·ĝ·z each step, so ‖θ−θ₀‖² grows like η²·d·Σĝ²,
  and a walk that leaves the region of θ₀ erases what the first round taught;
* ĝ = mean_k w_k·δ_k per step (E[ĝ²], max |ĝ|) and the largest importance weight drawn;
* for the oracle (true norms by backprop, refreshed every ``oracle_every`` = k steps; k = 1 is the
  exact, fresh oracle): at every refresh, how stale the old norms had become, V(p_stale)/V(p*);
* with ``diagnose``: SAZO's scores against the true norms (Spearman ρ, TV(p, p*), V(p)/V(p*)).

    run = query_run(model, params, train_batch, "sazo", lr=1e-3, eps=1e-3, steps=300)
    queries_to(run, 0.5)        # queries until F(θ) ≤ 0.5·F(θ₀), or None
"""
from __future__ import annotations

import copy
import math
import numbers
import statistics
from dataclasses import asdict, dataclass, field

import torch

from ..engine import MeZO, StepEvent, _check_disjoint
from ..samplers import RACED, make_sampler
from ..train import NoiseScaledStep, divergence_limit, median_queries, queries_to_target, reached, train
from ..variance import oracle_probs, paired_vectors as _paired, spearman, tv_distance, variance_ratio
from ..validation import (check_choice, check_count, check_int, check_limit, check_number, check_real,
                          check_state_settings)
from .finetune import check_params_in, mean_loss
from .grad_norms import RefreshingNorms, grad_norms
from .losses import TokenBatch, _check_vocabulary, accuracy, batched_closure, check_labelled
from .topblock import TopBlocks

__all__ = ["QueryRun", "query_run", "queries_to", "median_floor", "ratio_bound", "held_out_accuracies", "SAMPLERS",
           "DIVERGE_FACTOR", "sampling_diagnostics", "walk", "AfterStep", "WalkBound", "WalkPull", "StepCap"]

SAMPLERS = RACED        # the samplers a query race runs (one vocabulary: ``samplers.make_sampler``)
DIVERGE_FACTOR = 1.5     # F(θ) above this × F(θ₀) has diverged (``train.diverged``; no run that passed it came back)


@dataclass
class QueryRun:
    """One run's record (lists per log point, starting at 0 queries)."""

    sampler: str
    lr: float
    seed: int
    queries: list[int] = field(default_factory=list)
    train_loss: list[float] = field(default_factory=list)
    walk: list[float] = field(default_factory=list)         # ‖θ−θ₀‖ at each log point
    test_accuracy: float | None = None      # held-out accuracy at the end of the run
    budget_accuracy: float | None = None    # held-out accuracy after ``accuracy_at`` queries (a fixed budget)
    budget_queries: int | None = None       # the queries it was measured at (fewer if the run diverged first)
    diverged: bool = False
    diagnostics: list[dict] = field(default_factory=list)   # per diagnosed log point
    oracle_every: int | None = None                         # k (oracle runs)
    oracle_refreshes: int = 0
    staleness: list[dict] = field(default_factory=list)     # per refresh: step, age, V(p_stale)/V(p*), V(u)/V(p*)
    final_scores: list[float] | None = None   # SAZO's scores at the end (for scatter plots)
    final_norms: list[float] | None = None    # true norms at the end (when diagnosed)
    # the size of the steps the sampler produced: the update is −lr·ĝz with ĝ = mean_k w_k δ_k
    mean_sq_step_scale: float | None = None     # mean over steps of ĝ² (what importance sampling lowers)
    max_step_scale: float | None = None         # largest |ĝ| of the run
    max_weight: float | None = None             # largest importance weight w_k drawn
    steps_run: int = 0                          # MeZO steps taken
    step_rule: bool = False                     # the rate followed ``NoiseScaledStep``
    lr_scale: list[float] = field(default_factory=list)     # the rule's factor at each log point (1 without)
    walk_bound: float | None = None             # R of ``WalkBound`` (None: the walk was free)
    bound_steps: int = 0                        # steps whose update the bound shortened
    walk_pull: float | None = None              # λ of ``WalkPull`` (None: no pull toward θ₀)
    step_cap: float | None = None               # κ of ``StepCap`` (None: steps not capped)
    capped_steps: int = 0                       # steps whose |ĝ| the cap shortened

    def to_dict(self) -> dict:
        return asdict(self)


def queries_to(run: QueryRun | dict, fraction: float) -> int | None:
    """First logged query count with F(θ) ≤ fraction·F(θ₀) (None if never, or diverged first).

    ``run`` is a ``QueryRun`` or its ``to_dict()`` (as benchmark reports store it); the rule is
    ``sazo_lite.train.queries_to_target``'s.
    """
    fraction = check_number("fraction", fraction, 0.0, closed_low=False)   # None or "0.3" raised a TypeError
    queries, losses = (run["queries"], run["train_loss"]) if isinstance(run, dict) else (run.queries, run.train_loss)
    if losses and not math.isfinite(losses[0]):     # F₀ = inf made every loss "reached" at 0 queries
        raise ValueError(f"Invalid run: F(θ₀) = {losses[0]} (expected a finite first train_loss)")
    return queries_to_target((queries, losses), fraction * losses[0]) if losses else None


def _records(runs) -> list[dict]:
    """``QueryRun``s or their ``to_dict()``s, as dicts (the median rules read them by key)."""
    return [r.to_dict() if isinstance(r, QueryRun) else r for r in runs]


def median_floor(runs: list[dict], fraction: float) -> float:
    """A lower bound on the median queries to ``fraction``·F₀: a run that reached it counts its queries,
    one cut short of it (stopped at its budget, not diverged) the queries it had run (it needs more), a
    diverged one never (∞). Equal to the median when no run was cut short. A run that reached it
    at 0 queries counts 0; no runs, or a run that logged nothing, raise ValueError. ``runs``: ``QueryRun``s
    or their ``to_dict()``s.

    >>> cut = {"queries": [0, 800, 1600], "train_loss": [1.0, 0.8, 0.6], "diverged": False}
    >>> fast = {"queries": [0, 400], "train_loss": [1.0, 0.45], "diverged": False}
    >>> gone = {**cut, "diverged": True}
    >>> median_floor([cut, cut, fast], 0.5), median_floor([cut, fast, fast], 0.5), median_floor([fast, gone, gone], 0.5)
    (1600, 400, inf)
    """
    runs = _records(runs)
    if not runs:
        raise ValueError("Invalid runs: expected at least one run")
    values = []
    for r in runs:
        if not r.get("queries") or not r.get("train_loss") or "diverged" not in r:   # KeyErrors that named no run
            raise ValueError("Invalid runs: a run logged nothing or no 'diverged' (expected QueryRun records)")
        reached = queries_to(r, fraction)
        values.append(reached if reached is not None else math.inf if r["diverged"] else r["queries"][-1])
    return statistics.median(values)


def ratio_bound(top: list[dict], bottom: list[dict], fraction: float) -> tuple[str, float] | None:
    """Where one median of ``top_median ÷ bottom_median`` is "never" only because runs were cut short
    of ``fraction``·F₀: ("<", top ÷ floor of bottom) or (">", floor of top ÷ bottom); None otherwise,
    and None where the divisor is 0 (a floor of 0 queries, or a median reached at 0, bounds nothing).
    No runs on either side: ValueError. Runs: ``QueryRun``s or their ``to_dict()``s."""
    top, bottom = _records(top), _records(bottom)
    if not top or not bottom:
        raise ValueError("Invalid runs: expected at least one run in top and in bottom")
    t, b = (median_queries([queries_to(r, fraction) for r in runs]) for runs in (top, bottom))
    if math.isfinite(t) and math.isinf(b):
        floor = median_floor(bottom, fraction)
        return ("<", t / floor) if math.isfinite(floor) and floor > 0 else None
    if math.isinf(t) and math.isfinite(b):
        floor = median_floor(top, fraction)
        return (">", floor / b) if math.isfinite(floor) and b > 0 else None
    return None


def held_out_accuracies(runs) -> list[float]:
    """Each run's held-out accuracy: after the fixed query budget where the runs measured one
    (``query_run(accuracy_at=...)``), else at the run's end (a diverged run has none there).

    Example:
        >>> held_out_accuracies([{"budget_accuracy": 0.6, "test_accuracy": 0.9}, {"test_accuracy": 0.8}])
        [0.6]
    """
    runs = [r if isinstance(r, dict) else r.to_dict() for r in runs]
    budget = [r["budget_accuracy"] for r in runs if r.get("budget_accuracy") is not None]
    return budget or [r["test_accuracy"] for r in runs if r.get("test_accuracy") is not None]


def sampling_diagnostics(norms: torch.Tensor, probs: torch.Tensor, scores: torch.Tensor | None = None) -> dict:
    """ρ(scores, norms), TV(p, p*), V(p)/V(p*), V(u)/V(p*) for one moment of training. ``probs``: a
    distribution over the N examples (the variance helpers' rule, ``variance.paired_vectors``), ``scores``
    (optional) one per example; else ValueError naming the argument."""
    # weights [2, 3, 5] read TV 4.5 and V(p)/V(p*) 0.1 < 1: "Invalid probs: entries sum to ..." (paired_vectors'
    # rule, read in probs' own dtype: the helpers below are given probs as it came, and read it so too)
    n = len(_paired("norms", norms, "probs", probs)[0])
    if scores is not None:
        _paired("norms", norms, "scores", scores)     # spearman named them "a" and "b"
    out = {"tv": tv_distance(probs, oracle_probs(norms)), "v_ratio": variance_ratio(norms, probs),
           "v_uniform_ratio": variance_ratio(norms, torch.full((n,), 1.0 / n, dtype=torch.float64))}
    if scores is not None:
        out["rho"] = spearman(scores, norms)
    return out


def _checked_start(params, start) -> tuple[list[torch.Tensor], list[torch.Tensor]]:
    """(params, start) as lists: one copy at θ₀ of each tuned tensor's shape, no tensor given twice or sharing
    memory with another, and no copy sharing memory with a tuned tensor (``engine._check_disjoint``); else
    ValueError."""
    params, start = list(params), list(start)
    if len(start) != len(params) or any(not isinstance(s, torch.Tensor) or s.shape != p.shape
                                        for p, s in zip(params, start)):
        # zip stopped at the shorter list and a [1] copy broadcast: a walk over part of θ, without a word
        raise ValueError(f"Invalid start: expected one tensor of each tuned tensor's shape ({len(params)} tensors), "
                         f"got {len(start)}")
    # a copy in a narrower dtype is θ₀ rounded: the walk read its rounding at θ₀ (0.054 for 1,000 float32 normals in
    # bfloat16) and WalkBound and WalkPull drew θ toward the rounded point, without a word
    narrow = [k for k, (p, s) in enumerate(zip(params, start))
              if not s.is_floating_point() or torch.promote_types(p.dtype, s.dtype) != s.dtype]
    if narrow:
        k = narrow[0]
        raise ValueError(f"Invalid start: start[{k}] is {start[k].dtype} for a {params[k].dtype} tensor (expected a "
                         "floating copy in the tensor's dtype or a wider one, e.g. snapshot(params))")
    # a tensor given twice counted twice in ‖θ − θ₀‖, and WalkBound shrank it twice (a walk of 5, R = 1: to 0.1)
    _check_disjoint(params)
    try:        # the tuned tensors themselves as θ₀ (not copies): the walk read 0 and the bound never acted
        _check_disjoint(params + list({id(s): s for s in start}.values()))
    except ValueError:
        raise ValueError("Invalid start: it shares memory with the tuned tensors (expected copies of them at θ₀, "
                         "e.g. snapshot(params))") from None
    return params, start


def _distance(params, start) -> float:
    """‖θ − θ₀‖ in float64, over all tensors."""
    pairs = list(zip(params, start))
    total = sum(float((p.detach().double() - s.double()).pow(2).sum()) for p, s in pairs)
    if 1e-290 < total < math.inf or math.isnan(total):
        return total ** 0.5
    # entries past ~1e154 (or below ~1e-154) had squares that overflowed (underflowed): a walk of 1e200 read inf,
    # and WalkBound, shrinking by R/inf = 0, put θ back at θ₀; scaled by the largest entry they do not
    top = max((float((p.detach().double() - s.double()).abs().max()) for p, s in pairs if p.numel()), default=0.0)
    if not 0.0 < top < math.inf:
        return top
    return top * sum(float(((p.detach().double() - s.double()) / top).pow(2).sum()) for p, s in pairs) ** 0.5


def _toward(p: torch.Tensor, start: torch.Tensor, keep: float) -> None:
    """p ← start + keep·(p − start) in place. A half-precision p is computed in float64 and rounded once: three
    in-place roundings put ~2% of its entries an ulp away from that point rounded."""
    if p.dtype in (torch.float16, torch.bfloat16):
        p.copy_(start.double() + keep * (p.double() - start.double()))
    else:
        p.sub_(start).mul_(keep).add_(start)


@torch.no_grad()
def walk(params, start) -> float:
    """‖θ − θ₀‖ over the tuned tensors (``start``: their copies at θ₀, e.g. ``snapshot(params)``)."""
    return _distance(*_checked_start(params, start))


class AfterStep:
    """A ``MeZO`` step hook that keeps θ₀ and acts after every committed step, with a folded update
    applied first (``flush``), so ``after_step`` reads θ as the step left it. The walk rules and tracers
    are its subclasses; failed steps (θ restored) are ignored. ``start``: θ₀'s copies to read (shared,
    e.g. one ``snapshot(params)`` for several hooks: a full-model θ₀ is one more model's memory each);
    None copies ``params`` here."""

    def __init__(self, params, start=None):
        params = list(params)
        self.params, self.start = _checked_start(params, [p.detach().clone() for p in params] if start is None
                                                 else start)

    @torch.no_grad()
    def __call__(self, optimizer, event) -> None:
        if event.kind != "step":
            return
        flush = getattr(optimizer, "flush", None)
        if flush is not None:
            flush()
        self.after_step(optimizer, event)

    def after_step(self, optimizer, event) -> None:
        raise NotImplementedError


class WalkBound(AfterStep):
    """A step hook for ``MeZO`` that keeps the walk inside a ball: after every committed step,

        θ ← θ₀ + min(1, R / ‖θ − θ₀‖)·(θ − θ₀)        (norm over all tuned tensors)

    It reads nothing but θ and θ₀, so it treats every sampler alike (uniform, SAZO, the oracle):
    a projected ZO-SGD whose iterates stay within R of the weights the first round left. ``count``
    says how many steps it shortened.

    Example:
        >>> theta = torch.tensor([0.0, 0.0])
        >>> opt = MeZO([theta], lr=10.0, eps=1e-3, seed=0)
        >>> bound = WalkBound([theta], radius=1.0)
        >>> handle = opt.register_step_hook(bound)
        >>> _ = opt.step(lambda: ((theta - 5.0) ** 2).sum(0, keepdim=True))
        >>> round(float(theta.norm()), 4), bound.count
        (1.0, 1)
    """

    def __init__(self, params, radius: float, *, start=None):
        radius = check_real("radius", radius)
        if not math.isfinite(radius) or radius <= 0:
            raise ValueError(f"Invalid radius: {radius} (expected a finite number > 0)")
        super().__init__(params, start)
        self.radius, self.count = radius, 0

    def after_step(self, optimizer, event) -> None:
        distance = _distance(self.params, self.start)       # checked when the hook was made
        if distance > self.radius:
            shrink = self.radius / distance
            for p, s in zip(self.params, self.start):
                _toward(p, s, shrink)
            self.count += 1


class WalkPull(AfterStep):
    """A step hook for ``MeZO`` that pulls θ toward θ₀ after every committed step (decoupled L2 to θ₀):

        θ ← θ₀ + (1 − η·λ)·(θ − θ₀)        (η: the rate of the tensor's group at that step)

    the gradient step on λ/2·‖θ − θ₀‖², applied apart from ĝ as AdamW applies weight decay (which pulls
    toward 0, not θ₀). Like ``WalkBound`` it reads nothing but θ, θ₀ and the rate, so every sampler
    meets the same rule; unlike the bound it acts at every step. Against a noise walk that adds
    η²·d·E[ĝ²] to ‖θ − θ₀‖² each step, it holds ‖θ − θ₀‖² near η·d·E[ĝ²] / (2λ).

    Example:
        >>> theta = torch.tensor([2.0, 0.0])
        >>> opt = MeZO([theta], lr=0.1, eps=1e-3, seed=0)
        >>> pull = WalkPull([theta], strength=1.0)
        >>> pull.start = [torch.tensor([1.0, 0.0])]
        >>> pull(opt, StepEvent("step", 0, 0.0))
        >>> theta.tolist()
        [1.899999976158142, 0.0]
    """

    def __init__(self, params, strength: float, *, start=None):
        strength = check_real("strength", strength)
        if not math.isfinite(strength) or strength <= 0:
            raise ValueError(f"Invalid strength: {strength} (expected a finite number > 0)")
        super().__init__(params, start)
        self.strength = strength

    def after_step(self, optimizer, event) -> None:
        starts = {id(p): s for p, s in zip(self.params, self.start)}
        grouped = {id(p) for group in optimizer.param_groups for p in group["params"]}
        if not starts.keys() <= grouped:       # a tensor no group gives a rate to: checked before any moves
            raise ValueError(f"Invalid params: {len(starts.keys() - grouped)} of the pulled tensors are not "
                             "in the optimizer's param groups (their rate η is unknown)")
        keeps = [1.0 - group["lr"] * self.strength for group in optimizer.param_groups]
        if min(keeps, default=1.0) <= 0:
            raise ValueError(f"Invalid strength: lr·strength = {1.0 - min(keeps):g} ≥ 1 would carry θ past θ₀ "
                             "(expected lr·strength < 1)")
        for group, keep in zip(optimizer.param_groups, keeps):
            for p in group["params"]:
                if id(p) in starts:
                    _toward(p, starts[id(p)], keep)


class StepCap:
    """A step hook for ``MeZO`` that caps a step's length: after a committed step with |ĝ| above the cap,
    the excess is taken back, so the step becomes

        θ ← θ − η·clip(ĝ, −κ·r, κ·r)·z        r² = EMA (decay β) of the capped ĝ² of earlier steps

    (r is the mean of the first ``warmup`` steps' ĝ², which are not capped; a warmup whose ĝ were all 0 starts
    over). A kick η·|ĝ|·√d of a
    heavy-tailed ĝ is what ends long top-block runs (docs/llm.md); the cap reads nothing but ĝ, so it is
    one rule for every sampler, and it biases ĝ where |ĝ| is largest. The excess is undone by
    ``MeZO.replay_step`` with −(ĝ − clip(ĝ)) (three passes over θ, only on capped steps); it needs
    weight_decay = 0 (a replay would apply the decay again); it reads no θ, so it keeps no θ₀ (a replay
    flushes a folded update itself). ``count``: the steps it capped. A ``SeedLog`` cannot record that
    replay and refuses it (the run raises at the first capped step): do not combine the two.

    Example:
        >>> theta = torch.tensor([0.0, 0.0])
        >>> opt = MeZO([theta], lr=0.1, eps=1e-3, seed=0)
        >>> cap = StepCap(kappa=1.0, warmup=1)
        >>> handle = opt.register_step_hook(cap)
        >>> for target in (1.0, 100.0):     # the second step's ĝ is ~100× the first's: capped to its size
        ...     _ = opt.step(lambda: ((theta - target) ** 2).sum(0, keepdim=True))
        >>> cap.count
        1
    """

    def __init__(self, kappa: float = 3.0, *, ema_decay: float = 0.99, warmup: int = 20):
        kappa, ema_decay = check_real("kappa", kappa), check_real("ema_decay", ema_decay)
        if not math.isfinite(kappa) or kappa <= 0:
            raise ValueError(f"Invalid kappa: {kappa} (expected a finite number > 0)")
        if not 0.0 <= ema_decay < 1.0:
            raise ValueError(f"Invalid ema_decay: {ema_decay} (expected 0 ≤ ema_decay < 1)")
        warmup = check_count("warmup", warmup)      # a numpy int is an int too (it was refused)
        self.kappa, self.ema_decay, self.warmup = kappa, ema_decay, warmup
        self.seen, self.mean_sq, self.count = 0, 0.0, 0

    def state_dict(self) -> dict:
        """The cap's settings and running values (plain numbers): a resumed run caps as the uninterrupted one (a new
        ``StepCap`` began its warmup again, uncapped)."""
        return {"kappa": self.kappa, "ema_decay": self.ema_decay, "warmup": self.warmup, "seen": self.seen,
                "mean_sq": self.mean_sq, "count": self.count}

    def load_state_dict(self, state: dict) -> None:
        """Continue from ``state_dict()``: ValueError, before anything changes, for a state of other settings (its
        caps would not be this rule's) or with a count or mean out of range."""
        check_state_settings("StepCap", state, self.state_dict(),
                             {"kappa": self.kappa, "ema_decay": self.ema_decay, "warmup": self.warmup})
        seen, count = check_int("seen", state["seen"], 0), check_int("count", state["count"], 0)
        mean_sq = check_number("mean_sq", state["mean_sq"], 0.0)
        self.seen, self.mean_sq, self.count = seen, mean_sq, count

    def cap(self) -> float:
        """κ·r, the largest |ĝ| the next step keeps (∞ during the warmup)."""
        return math.inf if self.seen < self.warmup else self.kappa * math.sqrt(self.mean_sq)

    @torch.no_grad()
    def __call__(self, optimizer, event) -> None:
        if event.kind != "step":
            return
        if any(group["weight_decay"] for group in optimizer.param_groups):
            raise ValueError("Invalid optimizer: StepCap needs weight_decay = 0 (a replayed excess would decay θ twice)")
        if self.seen >= self.warmup and self.mean_sq == 0.0:
            # a warmup of flat steps (every ĝ = 0) measured no scale: its cap of 0 took every later step back whole,
            # and the run never moved again; the warmup starts over
            self.seen = 0
        g, cap = float(event.value), self.cap()
        kept = max(-cap, min(cap, g))
        if kept != g:
            optimizer.replay_step(event.seed, -(g - kept))      # θ ← θ + η·(g − kept)·z: the step was −η·kept·z
            self.count += 1
        self.seen += 1
        if self.seen <= self.warmup:    # the first steps' plain mean, then the EMA of the capped ĝ²
            self.mean_sq += (kept * kept - self.mean_sq) / self.seen
        else:
            self.mean_sq = self.ema_decay * self.mean_sq + (1 - self.ema_decay) * kept * kept


def _objective(model, batch, loss: str):
    """(losses closure, full loss F(θ), true norms of the tuned tensors, held-out accuracy) for a
    ``TokenBatch`` (the whole model) or a ``TopBlocks`` (cached activations, top blocks only)."""
    if isinstance(batch, TopBlocks):
        if loss != "classification":
            raise ValueError(f"Invalid loss: {loss!r} (a TopBlocks batch scores the classification loss)")
        return batch.losses, batch.mean_loss, batch.grad_norms
    losses = batched_closure(model, batch, loss)
    full = (lambda: mean_loss(model, batch)) if loss == "classification" else (lambda: float(losses(range(len(batch))).mean()))
    return losses, full, lambda params: grad_norms(model, batch, params, loss=loss)


def _accuracy(model, batch) -> float:
    return batch.accuracy() if isinstance(batch, TopBlocks) else accuracy(model, batch)


def _check_sampler(sampler, n: int) -> None:
    """A name of ``SAMPLERS``, or an object with ``sample(B)`` and ``update(indices, diffs)`` for N = n."""
    if isinstance(sampler, str):
        check_choice("sampler", sampler, SAMPLERS)
        return
    if not all(callable(getattr(sampler, name, None)) for name in ("sample", "update")):
        raise ValueError(f"Invalid sampler: {sampler!r} (expected one of {tuple(SAMPLERS)}, "
                         "or a sampler object with sample(B) and update(indices, diffs))")
    size = getattr(sampler, "num_examples", n)
    if size != n:
        raise ValueError(f"Invalid sampler: it draws from {size} examples, the training batch has {n}")


def _check_run_settings(lr, test_batch, accuracy_at, stop_fraction, diagnose, diverge_factor, walk_pull,
                        step_rule) -> None:
    """query_run's own settings, checked before θ moves: a bad one used to surface mid-run (a pull that
    overshoots after the first step, a test batch of the wrong type after the whole run, diagnose=0.5 as a
    ZeroDivisionError) or never (accuracy_at=1.7 read as 1, a negative stop_fraction or diverge_factor)."""
    if test_batch is not None and not isinstance(test_batch, (TokenBatch, TopBlocks)):
        raise ValueError(f"Invalid test_batch: {type(test_batch).__name__} (expected a TokenBatch or a TopBlocks)")
    if test_batch is not None and len(test_batch) == 0:     # its accuracy raised once the whole run had been made
        raise ValueError("Invalid test_batch: no examples")
    if isinstance(test_batch, TokenBatch):      # its accuracy raised AttributeError once the whole run had been made
        check_labelled(test_batch, "test_batch")
    if accuracy_at is not None and (test_batch is None or isinstance(accuracy_at, bool)):
        raise ValueError(f"Invalid accuracy_at: {accuracy_at} (a query count ≥ 1, with a test_batch)")
    if accuracy_at is not None:
        check_int("accuracy_at", accuracy_at, 1)
    if stop_fraction is not None:
        check_number("stop_fraction", stop_fraction, 0.0, closed_low=False)
    if not isinstance(diagnose, bool):
        check_int("diagnose", diagnose, 0)
    # inf: never diverges; a factor ≤ 1 put θ₀'s own F at or past the limit (a run whose loss fell was "diverged")
    check_limit("diverge_factor", diverge_factor, 1.0, closed_low=False)
    # a NoiseScaledStep or a bool exactly: 1 or "no" ran a rule (truthy) that the pull's bound below left out
    if not isinstance(step_rule, (bool, NoiseScaledStep)):
        raise ValueError(f"Invalid step_rule: {step_rule!r} (expected True, False or a NoiseScaledStep)")
    # the step rule may raise the rate up to max_scale × lr mid-run, where the pull raised after θ had moved
    top = (step_rule.max_scale if isinstance(step_rule, NoiseScaledStep)
           else NoiseScaledStep().max_scale if step_rule is True else 1.0)
    if walk_pull is not None and isinstance(lr, numbers.Real) and check_real("walk_pull", walk_pull) * lr * top >= 1:
        raise ValueError(f"Invalid walk_pull: lr·strength = {walk_pull * lr * top:g} ≥ 1 at the largest rate "
                         f"(lr × {top:g}) would carry θ past θ₀ (expected lr·walk_pull < 1)")


def _check_handed_on(sampler, oracle_every, oracle_mix, walk_bound, step_cap) -> None:
    """The settings query_run hands to the oracle's norms and the walk rules, checked under query_run's names
    (they were refused as RefreshingNorms' "every" and "mix", WalkBound's "radius", StepCap's "kappa")."""
    if sampler == "oracle":
        check_int("oracle_every", oracle_every, 1)
        check_number("oracle_mix", oracle_mix, 0.0, 1.0)
    for name, value in (("walk_bound", walk_bound), ("step_cap", step_cap)):
        if value is not None:
            check_number(name, value, 0.0, closed_low=False)


def query_run(model, params, train_batch: TokenBatch | TopBlocks, sampler, *, lr: float, eps: float = 1e-3,
              batch_size: int = 1, steps: int = 300, seed: int = 0, log_every: int = 10,
              oracle_every: int = 1, uniform_mix: float = 0.1, oracle_mix: float = 0.0,
              test_batch: TokenBatch | None = None, stop_fraction: float | None = None, diagnose: int = 0,
              diverge_factor: float = DIVERGE_FACTOR, loss: str = "classification", perturbation: str = "gaussian",
              step_rule: bool | NoiseScaledStep = False, ema_decay: float = 0.9, accuracy_at: int | None = None,
              walk_bound: float | None = None, walk_pull: float | None = None, step_cap: float | None = None,
              step_hooks=(),
              progress: bool = False) -> QueryRun:
    """One ZO run from the current weights (the caller restores θ₀ between runs).

    Args:
        model, params: the LM and the tuned tensors (LoRA adapters or all parameters).
        train_batch: the training examples: a ``TokenBatch`` (the whole model runs) or a ``TopBlocks``
            (only the top blocks run, on cached activations; ``test_batch`` then a ``TopBlocks`` too).
        sampler: "uniform", "sazo" or "oracle", or a ``sazo_lite`` sampler object for the N examples
            (its ``scores()``, if it has one, is diagnosed like SAZO's; the run is labelled by its class).
        lr, eps, batch_size, steps, seed: the MeZO settings (seed also seeds the sampler). How close δ_k
            at ε is to the directional derivative: ``directional_error``.
        log_every: steps between evaluations of the full training loss F(θ) and the walk.
        oracle_every: k, the steps between the oracle's backprop refreshes (1: fresh every step; its
            norms are then never older than the step; with k > 1 they are at most k − 1 steps old).
        uniform_mix: SAZO's λ. ema_decay: SAZO's β.
        oracle_mix: the oracle's λ (0: the exact p*, whose weights 1/(N p_i) are unbounded).
        test_batch: held-out accuracy is measured at the end of the run (not when it diverged).
        stop_fraction: stop once F(θ) ≤ stop_fraction·F(θ₀) (None: run all ``steps``), checked at the log
            points after θ₀ (a target met at θ₀, stop_fraction ≥ 1, stops at the first one).
        diagnose: every ``diagnose``-th log point (0: never; True counts as 1), true norms by
            backprop and ``sampling_diagnostics`` of the sampler's p (SAZO: with its scores); not at a
            log point whose F(θ) is not finite.
        diverge_factor: the run has diverged once F(θ) > diverge_factor·F(θ₀) (or a loss is not finite);
            a number > 1, or inf (never). A non-finite F(θ₀) is a ValueError.
        loss: "classification" or "answer".
        perturbation: MeZO's z, "gaussian" or "rademacher" (cheaper to draw on a CPU).
        step_rule: True (or a ``NoiseScaledStep``): the rate follows the sampler-agnostic noise rule (a copy of
            the one given runs, so the object given is left as it was).
        accuracy_at: a fixed query budget: held-out accuracy on ``test_batch`` once the run has made
            this many queries (rounded up to a log point), and ``stop_fraction`` only stops the run
            after it (a run that met the target at a log point before it stops at the budget), so every
            run is compared at the same budget. A run that diverged before the
            budget is measured where it stopped (``budget_queries`` says where).
        walk_bound: R of ``WalkBound``: θ projected onto ‖θ − θ₀‖ ≤ R after every step (None: free).
        walk_pull: λ of ``WalkPull``: θ − θ₀ shrunk by 1 − η·λ after every step (None: no pull); η·λ < 1
            at the largest rate the step rule may set.
        step_cap: κ of ``StepCap``: |ĝ| capped at κ × the running RMS of the capped ĝ (None: no cap).
        step_hooks: more ``MeZO`` step hooks for the run's optimiser (e.g. a per-step tracer), called
            after the walk rules.
    """
    _check_sampler(sampler, len(train_batch))
    # train's own checks, made here: the budget of accuracy_at divided by them first (0: ZeroDivisionError), and
    # train named its phases' steps (batch_size=1.5 was "Invalid steps: 2.0", steps=2.5 "Invalid steps: 0.5")
    check_int("steps", steps, 0)
    check_count("batch_size", batch_size)
    check_count("log_every", log_every)
    _check_run_settings(lr, test_batch, accuracy_at, stop_fraction, diagnose, diverge_factor, walk_pull, step_rule)
    _check_handed_on(sampler, oracle_every, oracle_mix, walk_bound, step_cap)
    diagnose = int(diagnose)
    n = len(train_batch)
    if model is None and isinstance(train_batch, TopBlocks):   # a TopBlocks run needs no model: None takes its own
        model = train_batch.model      # (a TokenBatch test split's accuracy raised AttributeError after the run)
    if not isinstance(model, torch.nn.Module):       # None with a TokenBatch: AttributeError from the params check
        raise ValueError(f"Invalid model: {type(model).__name__} (expected the causal LM; None only with a TopBlocks "
                         "train_batch, whose model it takes)")
    params = check_params_in(model, params)
    if isinstance(test_batch, TokenBatch):      # its accuracy raised this once the whole run had been made
        _check_vocabulary(model, test_batch, "test_batch")
    for cached in (train_batch, test_batch):      # a tuned tensor below the top blocks: the cache would go stale
        if isinstance(cached, TopBlocks):
            cached.check_params(params)
    optimizer = MeZO(params, lr=lr, eps=eps, seed=seed, perturbation=perturbation)
    losses, full_loss, norms_of = _objective(model, train_batch, loss)
    true_norms = lambda: norms_of(params)
    refreshing = None
    if sampler == "oracle":
        refreshing = RefreshingNorms(true_norms, every=oracle_every, clock=lambda: optimizer.step_count,
                                     mix=oracle_mix)
    if isinstance(sampler, str):
        chooser = make_sampler(sampler, n, uniform_mix=uniform_mix, ema_decay=ema_decay, norms_fn=refreshing,
                               oracle_mix=oracle_mix, seed=seed)
    else:
        chooser, sampler = sampler, type(sampler).__name__
    bound = cap = None
    start_params = [p.detach().clone() for p in params]     # θ₀: the logged walk's and the walk rules'
    if step_cap is not None:      # first: it shortens the step itself, the walk rules then act on θ
        cap = StepCap(step_cap)
        optimizer.register_step_hook(cap)
    if walk_pull is not None:     # before the bound: a step is pulled, then projected
        optimizer.register_step_hook(WalkPull(params, walk_pull, start=start_params))
    if walk_bound is not None:
        bound = WalkBound(params, walk_bound, start=start_params)
        optimizer.register_step_hook(bound)
    for hook in step_hooks:
        optimizer.register_step_hook(hook)
    # a copy: the rule keeps its reference ĝ² and running mean, so a NoiseScaledStep given to several runs started
    # each after the first at the last one's scale, without its warmup (repeated runs differed)
    given = isinstance(step_rule, NoiseScaledStep)
    rule = copy.deepcopy(step_rule) if given else (NoiseScaledStep() if step_rule else None)
    run = QueryRun(sampler, float(lr), int(seed), oracle_every=oracle_every if sampler == "oracle" else None,
                   step_rule=rule is not None, walk_bound=None if walk_bound is None else float(walk_bound),
                   walk_pull=None if walk_pull is None else float(walk_pull),
                   step_cap=None if step_cap is None else float(step_cap))
    counted = [0]

    def evaluate() -> float:
        value = full_loss()
        counted[0] += 1
        run.queries.append(2 * batch_size * optimizer.step_count)
        run.train_loss.append(value)
        run.walk.append(walk(params, start_params))
        run.lr_scale.append(rule.scale() if rule is not None else 1.0)
        # not at a non-finite F: the run ends there as diverged, and the true norms of that θ raised instead
        if diagnose and (counted[0] - 1) % int(diagnose) == 0 and math.isfinite(value):
            norms = true_norms()
            scores = chooser.scores() if callable(getattr(chooser, "scores", None)) else None
            probs = chooser.probs    # the oracle's: p* from its cached (up to k − 1 steps old) norms
            run.diagnostics.append({"queries": run.queries[-1], **sampling_diagnostics(norms, probs, scores)})
            run.final_norms = norms.tolist()
            if scores is not None:
                run.final_scores = scores.tolist()
        return value

    start = evaluate()
    if not math.isfinite(start):    # no limit or target can be drawn from it (a nan limit raised, inf never diverged)
        raise ValueError(f"Invalid params: F(θ₀) = {start} (expected a finite training loss at the start)")
    stop_below = None if stop_fraction is None else stop_fraction * start

    def phase(phase_steps: int, stop: float | None):
        return train(optimizer, chooser, losses, phase_steps, batch_size=batch_size, evaluate=evaluate,
                     log_every=log_every, progress=progress, description=f"{sampler} lr={lr:g}",
                     stop_below=stop, diverge_above=divergence_limit(start, diverge_factor), step_rule=rule)

    if accuracy_at is None:
        history = phase(steps, stop_below)
    else:   # to the budget without stopping (a log point ends it), the measurement, then the rest
        budget = min(steps, log_every * -(-int(accuracy_at) // (2 * batch_size * log_every)))
        history = phase(budget, None)
        run.budget_accuracy, run.budget_queries = _accuracy(model, test_batch), 2 * batch_size * optimizer.step_count
        # a target met at any log point before the budget stops the run there, as it would have stopped at once without
        # a budget: reading the budget's point alone ran on a run that had bounced back above it (and could diverge)
        met = stop_below is not None and any(reached(value, stop_below) for value in run.train_loss[1:])
        if not history.diverged and steps > budget and not met:
            rest = phase(steps - budget, stop_below)
            history.projected_grad += rest.projected_grad
            history.max_weight += rest.max_weight
            history.queries += rest.queries
            history.diverged = rest.diverged
    run.diverged = history.diverged
    run.steps_run = len(history.queries)
    if test_batch is not None and not run.diverged:
        run.test_accuracy = _accuracy(model, test_batch)
    if bound is not None:
        run.bound_steps = bound.count
    if cap is not None:
        run.capped_steps = cap.count
    if refreshing is not None:
        run.oracle_refreshes, run.staleness = refreshing.refreshes, list(refreshing.staleness)
    scales = history.projected_grad
    if scales:
        run.mean_sq_step_scale = sum(x * x for x in scales) / len(scales)
        run.max_step_scale = max(abs(x) for x in scales)
        run.max_weight = max(history.max_weight)
    return run

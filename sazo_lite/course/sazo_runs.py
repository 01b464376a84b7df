"""Reusable runs behind notebooks 04–05 and their dashboards (plain code, no widgets).

Two experiments:

* ``run_sazo_trace``: train with SAZO and, every ``log_every`` steps, compare what SAZO
  believes (sqrt(Ĝ_i), p_SAZO) with the truth (‖∇f_i‖, p*), plus V(p)/V(p*) for
  uniform, SAZO and the oracle along the same trajectory.
* ``race``: loss gap against queries for uniform MeZO, SAZO and the oracle over seeds,
  and the queries each needs to reach a target gap (``tune_lr`` picks each method's own
  learning rate from a grid first, as ``make bench`` does).

Both only wire together ``MeZO``, the samplers, ``train`` and ``variance``; nothing here
re-implements them.
"""
from __future__ import annotations

import math
import warnings
from dataclasses import dataclass, field

import numpy as np
import torch

from .config import one_thread
from ..engine import MeZO
from .minibatches import _norms, _sequence
from .problems import FiniteSumProblem, LeastSquares, LogisticRegression, check_problem as _check_problem
from ..samplers import RACED, PlainSAZOSampler, SAZOSampler, make_sampler
from ..train import FlatLossWarning, best_rate, divergence_limit, diverged as train_diverged, past_edge, queries_to_target, \
    train
from .. import variance
from ..validation import check_count, check_int, check_limit, check_number, check_real, check_seed


__all__ = ["PROBLEMS", "make_problem", "SAZOTrace", "run_sazo_trace", "RULES", "RULE_NAMES", "RULE_FIXES",
           "rule_sampler", "feed_sampler", "rule_ladder",
           "roughness", "RaceResult", "DIVERGE_FACTOR", "RACE_DIVERGE_FACTOR", "gap_limit", "first_divergence", "starting_gap", "race", "tune_lr", "pick_rate", "SAMPLERS", "chi2_draws", "ema_weights", "ema_of_chi2", "loss_grid", "sampler_paths"]

SAMPLERS = RACED        # the samplers a race compares (one vocabulary: ``samplers.make_sampler``)


def lesson_train(*args, **kwargs):
    """``sazo_lite.train`` without its ``FlatLossWarning``: the dashboards run tiny ε on purpose (their
    "ε too small" presets) and say in their readouts what it does; a warning about merged adapters
    beside them would only confuse (and rounding noise may move θ after the first flat steps)."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", FlatLossWarning)
        return train(*args, **kwargs)


# Notebook 04's ladder: the plain rule, then one robustness fix of ``SAZOSampler`` added at a time.
RULES = ("plain", "prior", "blend", "level", "robust")
RULE_NAMES = {"plain": "plain rule", "prior": "+ prior", "blend": "+ blend", "level": "+ level",
              "robust": "+ |δ| (SAZOSampler)"}   # short labels for tables and toggles
RULE_FIXES = {
    "plain": "plain rule: EMA of δ² from G₀ = 1 (PlainSAZOSampler)",
    "prior": "+ prior: an unseen example is scored by the RMS of the seen (fixed β from there)",
    "blend": "+ blend: a first observation blended with one pseudo-observation, decay min(β, count-based)",
    "level": "+ level: scores relative to the data-set level ℓ of |δ|",
    "robust": "+ |δ| instead of δ²: SAZOSampler, the rule the library runs",
}
PROBLEMS = ("heterogeneous quadratic", "homogeneous quadratic", "logistic regression (breast cancer)")
# The course's divergence rule for a run it draws (``gap_limit``, ``train.diverged``): its gap is not finite or
# above DIVERGE_FACTOR × its starting gap. A noisy run that recovers stays below it (B = 1 on σ = 2.5 at a safe η
# peaks near 3×); a too-large η passes it within a few log points and goes on to 10⁶× and beyond.
DIVERGE_FACTOR = 10.0
# The race's rule (``race``, ``RaceResult.diverged``, and through it ``pick_rate``'s edge): a run stops as diverged
# only where its loss or gap stops being finite; one past DIVERGE_FACTOR × its start trains on, and the race's
# plot and readout mark it there (``first_divergence``). Stored class runs and notebook 05's rates were tuned so.
RACE_DIVERGE_FACTOR = math.inf


def gap_limit(start: float, factor: float = DIVERGE_FACTOR) -> float:
    """The gap above which a course run that started at gap ``start`` has diverged (``train.diverged``):
    ``train.divergence_limit(start, factor)``, except that a start not above 0 (θ₀ already a minimiser) gives no
    scale, so only a non-finite gap counts there (10 × 0 would call any step away from it a divergence).

    Example:
        >>> gap_limit(2.0), gap_limit(0.0), gap_limit(2.0, RACE_DIVERGE_FACTOR)
        (20.0, inf, inf)
    """
    start, factor = check_real("start", start), check_limit("factor", factor, 1.0, closed_low=False)
    return divergence_limit(start, factor if start > 0 else math.inf)


def first_divergence(gaps, *, factor: float = DIVERGE_FACTOR) -> int | None:
    """Index of the first gap that is not finite or above ``factor`` × ``gaps[0]`` (None: the run did not diverge).

    A run that starts at 0 (θ₀ already a minimiser) diverges only where its gap stops being finite. ``factor`` is
    above 1 (inf: only a non-finite gap counts).

    Example:
        >>> first_divergence([2.0, 3.0, 25.0, float("inf")]), first_divergence([2.0, 1.0])
        (2, None)
    """
    # factor ≤ 1 (or NaN) called the start itself diverged: its gap is above factor × itself; inf is no limit
    factor = check_limit("factor", factor, 1.0, closed_low=False)
    values = np.asarray(gaps, dtype=np.float64)
    if values.ndim != 1 or len(values) == 0 or not np.isfinite(values[0]) or values[0] < 0:
        raise ValueError(f"Invalid gaps: expected a 1-D sequence starting with a finite gap >= 0, got {gaps!r}")
    limit = gap_limit(float(values[0]), factor)   # a start at 0: only a non-finite gap
    return next((k for k, gap in enumerate(values.tolist()) if train_diverged(gap, limit)), None)


def starting_gap(problem: FiniteSumProblem) -> float:
    """F(θ₀) − F(θ*) in float64, with float64 rounding read as 0; a ValueError when it is not finite (NaN or
    inf in the problem's data or in its θ*) or below 0 beyond rounding (its θ* does not minimise it).

    Rounding: a θ* computed at θ₀ (e.g. Newton's on symmetric data) puts F(θ*) a few ulps from F(θ₀), either side;
    |gap| ≤ 1e-12 · max(|F(θ₀)|, |F(θ*)|) counts as 0.

    Example:
        >>> starting_gap(make_problem(num_examples=16, dim=3)) > 0
        True
    """
    _check_problem(problem)
    gap = problem.gap(problem.initial_theta(torch.float64))
    if not math.isfinite(gap):
        raise ValueError(f"Invalid problem: its initial gap F(θ₀) − F(θ*) is {gap!r} (expected a finite number; "
                         "a NaN or inf in its data or in its optimum θ* gives this)")
    optimal = problem.optimal_loss
    rounding = 1e-12 * max(abs(optimal), abs(optimal + gap))   # relative: a problem of tiny losses keeps its gap
    if gap < -rounding:
        raise ValueError(f"Invalid problem: its initial gap F(θ₀) − F(θ*) is {gap!r} (expected >= 0: its optimum θ* "
                         "has a higher loss than θ₀, so it is not a minimiser)")
    return gap if gap > rounding else 0.0


def make_problem(name: str = "heterogeneous quadratic", *, heterogeneity: float = 1.5,
                 num_examples: int = 128, dim: int = 10, seed: int = 0) -> FiniteSumProblem:
    """Build one of ``PROBLEMS``.

    The homogeneous quadratic ignores ``heterogeneity`` (σ = 0); the logistic regression
    uses scikit-learn's breast-cancer data (N = 569, d = 31) and ignores N and d.

    Example:
        >>> make_problem("homogeneous quadratic", num_examples=32, dim=4).heterogeneity
        0.0
    """
    if name == "heterogeneous quadratic":
        return LeastSquares(num_examples, dim, heterogeneity=heterogeneity, seed=seed)
    if name == "homogeneous quadratic":
        return LeastSquares(num_examples, dim, heterogeneity=0.0, seed=seed)
    if name == "logistic regression (breast cancer)":
        return LogisticRegression.from_sklearn("breast_cancer", heterogeneity=heterogeneity, seed=seed)
    raise ValueError(f"Invalid name: {name!r} (expected one of {PROBLEMS})")



class _NoLevelSAZO(SAZOSampler):
    """``SAZOSampler`` with its data-set level switched off (ℓ ≡ 1): scores keep the units of their step.

    Used only for the course's ablation ladder (the library has no switch for the level).
    """

    def _next_level(self, indices, size, steps) -> float:
        return 1.0


def rule_sampler(rule: str, num_examples: int, *, ema_decay: float = 0.9, uniform_mix: float = 0.1,
                 seed: int = 0):
    """The sampler of one rung of ``RULES``: the plain rule plus the fixes up to ``rule``.

    * "plain": ``PlainSAZOSampler`` (G₀ = 1, EMA of δ², fixed β).
    * "prior": unseen examples take the RMS prior of the seen ones; a first observation enters
      the EMA from that prior with the fixed β (c = β/(1−β) pseudo-observations); δ², no level.
    * "blend": as "prior", but with one pseudo-observation (c = 1): the decay min(β, (n+c)/(n+c+1))
      grows with the count (a running mean first).
    * "level": as "blend", with scores relative to the data-set level ℓ.
    * "robust": ``SAZOSampler`` as the library runs it (|δ| instead of δ²).

    Example:
        >>> type(rule_sampler("robust", 8)).__name__, rule_sampler("blend", 8).prior_strength
        ('SAZOSampler', 1.0)
    """
    if rule not in RULES:
        raise ValueError(f"Invalid rule: {rule!r} (expected one of {RULES})")
    # β < 1: "prior" turns β into β/(1−β) pseudo-observations (β = 1 would divide by 0)
    check_number("ema_decay", ema_decay, 0.0, 1.0, closed_high=False)
    common = dict(ema_decay=ema_decay, uniform_mix=uniform_mix, seed=seed)
    if rule == "plain":
        return PlainSAZOSampler(num_examples, **common)
    if rule == "prior":
        return _NoLevelSAZO(num_examples, statistic="square", prior_strength=ema_decay / (1.0 - ema_decay), **common)
    if rule == "blend":
        return _NoLevelSAZO(num_examples, statistic="square", prior_strength=1.0, **common)
    if rule == "level":
        return SAZOSampler(num_examples, statistic="square", **common)
    return SAZOSampler(num_examples, **common)


def feed_sampler(sampler, norms, *, steps: int, batch_size: int, shrink: float = 1.0, seed: int = 0) -> np.ndarray:
    """Feed a sampler the δ of known gradient norms for ``steps`` steps; V(p)/V(p*) after each.

    No training: example i's gradient norm at step t is ``norms[i]·shrink**t`` (``shrink`` < 1:
    every norm shrinks as in training), and each sampled example reports δ = norm·ξ, ξ ~ N(0, 1)
    (what a Gaussian direction gives). Isolates what a rule does with its observations.

    Returns:
        [steps + 1] V(p_t)/V(p*_t), with p_t the sampler's distribution after t steps.

    Example:
        >>> float(feed_sampler(SAZOSampler(16), torch.ones(16), steps=3, batch_size=4)[0])
        1.0
    """
    missing = [part for part in ("num_examples", "probs", "sample", "update") if not hasattr(sampler, part)]
    if missing:   # (a rule's name in place of its sampler raised AttributeError)
        raise ValueError(f"Invalid sampler: {type(sampler).__name__} {str(sampler)[:40]!r} has no {', '.join(missing)} "
                         "(expected a sampler, e.g. rule_sampler(rule, num_examples))")
    norms = _norms(norms)                           # finite, >= 0, not all 0: p* ∝ ‖∇f_i‖ needs one > 0
    steps, batch_size = check_int("steps", steps, 0), check_count("batch_size", batch_size)
    shrink = check_number("shrink", shrink, 0.0, closed_low=False)
    if norms.shape != (sampler.num_examples,):
        raise ValueError(f"Invalid norms: shape {tuple(norms.shape)} (expected one norm per example, "
                         f"({sampler.num_examples},))")
    generator = torch.Generator().manual_seed(check_seed("seed", seed))
    ratios = [variance.variance_ratio(norms, sampler.probs)]
    for t in range(steps):
        indices, _ = sampler.sample(batch_size)
        current = norms * shrink ** (t + 1)
        diffs = current[indices] * torch.randn(len(indices), generator=generator, dtype=torch.float64)
        sampler.update(indices, diffs)
        ratios.append(variance.variance_ratio(current, sampler.probs))
    return np.asarray(ratios, dtype=np.float64)


def _once(name: str, values) -> tuple:
    """``values`` as a tuple (read once), or a ValueError when one is given twice: a repeated seed, sampler or rule
    would count its runs twice in every median over them."""
    values = tuple(_sequence(name, values))
    if len(set(values)) < len(values):
        raise ValueError(f"Invalid {name}: {values!r} (expected each at most once)")
    return values


def rule_ladder(problem: FiniteSumProblem, *, steps: int, seeds=(0, 1, 2), rules=RULES, **trace_kwargs) -> dict:
    """Mean V(p)/V(p*) over a training run for each rule of the ladder (median over seeds).

    A run that diverged (``first_divergence`` of its gaps: above ``DIVERGE_FACTOR`` × its start, or not finite)
    counts as +∞ for its rule and for uniform: its ratios along a θ that left the problem rank nothing (at η = 1 the
    table read "+ level 13.0" below uniform's 18.4 on runs whose gaps had reached 10¹³).

    Returns:
        {rule: median over seeds of the run's mean V(p_SAZO)/V(p*)} plus "uniform" (uniform
        sampling along the same runs).

    Example:
        >>> table = rule_ladder(make_problem(num_examples=16, dim=3), steps=10, seeds=(0,), rules=("plain",), log_every=5)
        >>> sorted(table)
        ['plain', 'uniform']
    """
    seeds, rules = _once("seeds", seeds), _once("rules", rules)   # e.g. np.arange(3)
    if not seeds or not rules:
        raise ValueError(f"Invalid seeds/rules: {seeds!r}, {rules!r} (expected at least one of each)")
    table, uniform = {}, []
    for rule in rules:
        means = []
        for seed in seeds:
            trace = run_sazo_trace(problem, steps=steps, seed=seed, rule=rule, **trace_kwargs)
            # (a start a few ulps below 0, θ₀ at the optimum up to rounding, is a start of 0)
            gone = trace.diverged_at is not None or \
                first_divergence([max(float(trace.gap[0]), 0.0), *trace.gap[1:].tolist()]) is not None
            means.append(math.inf if gone else float(np.mean(trace.ratio["sazo"][1:])))
            uniform.append(math.inf if gone else float(np.mean(trace.ratio["uniform"][1:])))
        table[rule] = float(np.median(means))
    table["uniform"] = float(np.median(uniform))
    return table


# -- 04: what SAZO estimates ----------------------------------------------------------------

@dataclass
class SAZOTrace:
    """Per-log-point arrays of one SAZO run (T log points, N examples; numpy float64).

    Attributes:
        steps, queries: [T] step count and cumulative queries (2·B per step).
        gap: [T] F(θ_t) − F(θ*).
        sqrt_g: [T, N] sqrt(Ĝ_i), SAZO's estimate of ‖∇f_i‖.
        norms: [T, N] true ‖∇f_i(θ_t)‖.
        p_sazo, p_star: [T, N] SAZO's sampling distribution and the oracle p* ∝ ‖∇f_i‖.
        spearman, tv: [T] rank correlation of sqrt(G) with the norms; TV(p_SAZO, p*).
        ratio: {"uniform", "sazo", "oracle"} → [T] V(p)/V(p*) (the oracle's is 1).
        tracked: [k] example indices whose G trajectory a plot follows.
        counts: [T, N] how often each example had been observed (sampled) by then.
        rule: one of ``RULES`` (see ``rule_sampler``).
        diverged_at: the step at which the run was stopped as diverged (``run_sazo_trace``'s
            ``diverge_factor``, or MeZO refusing a non-finite loss); None if it ran to the end.
        lr: the learning rate it ran with.
    """

    steps: np.ndarray
    queries: np.ndarray
    gap: np.ndarray
    sqrt_g: np.ndarray
    norms: np.ndarray
    p_sazo: np.ndarray
    p_star: np.ndarray
    spearman: np.ndarray
    tv: np.ndarray
    ratio: dict[str, np.ndarray] = field(default_factory=dict)
    tracked: np.ndarray = field(default_factory=lambda: np.zeros(0, dtype=int))
    counts: np.ndarray = field(default_factory=lambda: np.zeros((0, 0), dtype=int))
    rule: str = "robust"
    diverged_at: int | None = None
    lr: float = float("nan")


def _squared_norm_estimates(sampler) -> torch.Tensor:
    """Ĝ [N]: the robust sampler converts its scores; the plain one's G already estimates ‖∇f_i‖²."""
    if hasattr(sampler, "squared_norm_estimates"):
        return sampler.squared_norm_estimates()
    return sampler.estimates.clone()


class _TraceRecorder:
    """``train``'s evaluate callback: snapshots SAZO's estimates next to the truth."""

    def __init__(self, problem, theta, sampler):
        self.problem, self.theta, self.sampler = problem, theta, sampler
        self.rows: list[dict] = []

    def __call__(self) -> float:
        norms = self.problem.norms(self.theta)                               # [N]
        g_hat = _squared_norm_estimates(self.sampler).clamp_min(0)           # [N]
        p_sazo, p_star = self.sampler.probs, variance.oracle_probs(norms)
        uniform = torch.full_like(norms, 1.0 / len(norms))
        gap = self.problem.gap(self.theta)
        self.rows.append(dict(
            gap=gap, sqrt_g=g_hat.sqrt(), norms=norms, p_sazo=p_sazo, p_star=p_star,
            counts=self.sampler.counts.clone(),
            spearman=variance.spearman(g_hat, norms), tv=variance.tv_distance(p_sazo, p_star),
            uniform=variance.variance_ratio(norms, uniform), sazo=variance.variance_ratio(norms, p_sazo)))
        return gap


def _stack(rows: list[dict], key: str) -> np.ndarray:
    values = [row[key] for row in rows]
    if isinstance(values[0], torch.Tensor):
        return torch.stack(values).numpy()
    return np.asarray(values, dtype=np.float64)


def _tracked_examples(norms: torch.Tensor, quantiles=(0.98, 0.75, 0.5)) -> np.ndarray:
    """Examples at the given quantiles of the initial norms (large ones get sampled often)."""
    order = torch.argsort(norms)                           # ascending
    picks = [int(order[min(len(order) - 1, int(q * len(order)))]) for q in quantiles]
    return np.asarray(picks, dtype=int)


def run_sazo_trace(problem: FiniteSumProblem, *, steps: int = 300, batch_size: int = 4,
                   lr: float = 0.01, eps: float = 1e-3, ema_decay: float = 0.9,
                   uniform_mix: float = 0.1, seed: int = 0, log_every: int = 3,
                   dtype: torch.dtype = torch.float32, progress: bool = False,
                   rule: str = "robust", diverge_factor: float | None = None) -> SAZOTrace:
    """Train with SAZO and record its estimates against the truth every ``log_every`` steps.

    θ lives in ``dtype`` (float32 by default, like a language model), so that a tiny ε shows
    its rounding error in d_k = (f_k(θ+εz) − f_k(θ−εz))/(2ε) and hence in G.
    ``rule`` picks the sampler from ``RULES`` (``rule_sampler``): "robust" is ``SAZOSampler``, what the
    library runs; "plain" is ``PlainSAZOSampler`` (EMA of d² from a constant start), the rule
    notebook 04 shows first; the rungs between add one robustness fix each.

    A run whose loss becomes non-finite stops there (MeZO refuses the step), with ``diverged_at`` set;
    with ``diverge_factor`` it also stops at the first log point whose gap is above that factor × the
    starting gap (``first_divergence``; a start of 0 sets no such limit), that point included, and refuses a
    problem whose starting gap is not finite (``starting_gap``). Its arrays end at the last log point.

    Example:
        >>> trace = run_sazo_trace(make_problem(num_examples=32, dim=4), steps=30, log_every=10)
        >>> trace.sqrt_g.shape, trace.ratio["oracle"].tolist()
        ((4, 32), [1.0, 1.0, 1.0, 1.0])
    """
    check_count("steps", steps)
    _check_problem(problem)
    if rule not in RULES:
        raise ValueError(f"Invalid rule: {rule!r} (expected one of {RULES})")
    if diverge_factor is not None:
        check_number("diverge_factor", diverge_factor, 1.0, closed_low=False)   # a limit above the start
    # the limit's reference: a NaN start is refused (its limit would stop the run at once)
    start = starting_gap(problem) if diverge_factor is not None else None
    theta = problem.initial_theta(dtype)
    optimizer = MeZO([theta], lr=lr, eps=eps, seed=seed)
    sampler = rule_sampler(rule, problem.num_examples, seed=seed, ema_decay=ema_decay, uniform_mix=uniform_mix)
    recorder = _TraceRecorder(problem, theta, sampler)
    with one_thread():
        recorder()  # the starting point θ₀
        # at a start of 0 (θ₀ a minimiser) only a non-finite loss stops the run, as in ``first_divergence``
        limit = math.inf if start is None else gap_limit(start, diverge_factor)
        history = lesson_train(optimizer, sampler, lambda idx: problem.losses(theta, idx), steps,
                        batch_size=batch_size, evaluate=recorder, log_every=log_every,
                        progress=progress, description="SAZO trace", diverge_above=limit)
    rows = recorder.rows
    logged = np.asarray([0] + history.logged_steps)
    stopped = None
    if history.diverged:   # at a log point (its gap), or at the step after the last one taken (a refused loss)
        at_log = len(history.logged_steps) and history.logged_steps[-1] == len(history.queries) \
            and train_diverged(history.metrics[-1], limit)
        stopped = history.logged_steps[-1] if at_log else len(history.queries) + 1
    return SAZOTrace(
        steps=logged, queries=2 * batch_size * logged, gap=_stack(rows, "gap"),
        sqrt_g=_stack(rows, "sqrt_g"), norms=_stack(rows, "norms"), p_sazo=_stack(rows, "p_sazo"),
        p_star=_stack(rows, "p_star"), spearman=_stack(rows, "spearman"), tv=_stack(rows, "tv"),
        ratio={"uniform": _stack(rows, "uniform"), "sazo": _stack(rows, "sazo"),
               "oracle": np.ones(len(rows))},
        tracked=_tracked_examples(rows[0]["norms"]), counts=_stack(rows, "counts").astype(np.int64), rule=rule,
        diverged_at=stopped, lr=float(lr))


def roughness(trajectory) -> float:
    """Mean |Δ log x| between consecutive positive points of a trajectory [T] or [T, k].

    A smoother (more averaged) estimate moves less from one log point to the next; steps
    from or to a zero (an example not estimated yet) are left out.

    Example:
        >>> roughness([1.0, 2.0, 1.0]) > roughness([0.0, 1.0, 1.1, 1.2])
        True
    """
    values = np.asarray(trajectory, dtype=np.float64)
    if values.ndim == 0 or values.shape[0] < 2:   # (a single number raised IndexError)
        raise ValueError("Invalid trajectory: needs at least two points")
    both = (values[1:] > 0) & (values[:-1] > 0)
    if not both.any():
        raise ValueError("Invalid trajectory: no two consecutive positive points")
    logs = np.log(np.where(values > 0, values, 1.0))
    return float(np.abs(np.diff(logs, axis=0))[both].mean())


def chi2_draws(examples: int, observations: int, *, seed: int = 0) -> np.ndarray:
    """d²/‖∇f‖² ~ χ²₁ for ``observations`` observations of ``examples`` independent examples, [n, examples].

    Row k is observation k; the first rows do not depend on ``observations`` (one seed, one stream).
    """
    check_count("observations", observations)
    check_count("examples", examples)
    seed = check_int("seed", seed, 0)   # numpy's SeedSequence: an int >= 0 (0.5 and -1 raised naming no argument)
    return np.random.default_rng(seed).standard_normal((observations, examples)) ** 2


def ema_weights(observations: int, ema_decay: float) -> np.ndarray:
    """The weight of each observation in G after ``observations`` of them, [n]: G starts at the first, then
    G ← β·G + (1−β)·d², so observation 0 keeps β^(n−1) and observation k ≥ 1 gets (1−β)·β^(n−1−k).

    Example:
        >>> ema_weights(3, 0.5).tolist()
        [0.25, 0.25, 0.5]
    """
    check_count("observations", observations)
    check_number("ema_decay", ema_decay, 0.0, 1.0, closed_high=False)
    powers = ema_decay ** np.arange(observations - 1, -1, -1, dtype=np.float64)   # β^(n−1−k)
    return np.concatenate([powers[:1], (1.0 - ema_decay) * powers[1:]])


def ema_of_chi2(examples: int, *, observations: int, ema_decay: float, seed: int = 0,
                draws: np.ndarray | None = None) -> np.ndarray:
    """G/‖∇f‖² for ``examples`` independent examples after ``observations`` d² each.

    d²/‖∇f‖² ~ χ²₁ (Gaussian z); G starts at the first observation, then G ← β·G + (1−β)·d².
    The same draws serve every β (one seed), so moving β changes only the averaging; ``draws``
    (``chi2_draws(examples, observations, seed=seed)``, e.g. kept by a dashboard) skips drawing them again.
    Relative variance: 2 for one observation, → 2(1−β)/(1+β) after many.

    Example:
        >>> bool(ema_of_chi2(10_000, observations=1, ema_decay=0.5).var() > ema_of_chi2(10_000, observations=50, ema_decay=0.9).var())
        True
    """
    weights = ema_weights(observations, ema_decay)
    if draws is None:
        draws = chi2_draws(examples, observations, seed=seed)
    elif np.shape(draws) != (observations, examples):
        raise ValueError(f"Invalid draws: shape {np.shape(draws)} (expected (observations, examples) = "
                         f"({observations}, {examples}))")
    return weights @ draws


def loss_grid(problem: FiniteSumProblem, xs, ys) -> np.ndarray:
    """F(θ) on the grid θ = (x, y) of a 2-D problem, [len(ys), len(xs)] (rows: y), float64."""
    _check_problem(problem)
    if problem.dim != 2:
        raise ValueError(f"Invalid problem: dim {problem.dim} (expected 2)")
    xs, ys = (np.asarray(axis, dtype=np.float64) for axis in (xs, ys))
    for name, axis in (("xs", xs), ("ys", ys)):   # an empty or NaN axis gave an empty or NaN grid without a word
        if axis.ndim != 1 or len(axis) == 0 or not np.isfinite(axis).all():
            raise ValueError(f"Invalid {name}: shape {axis.shape} (expected a non-empty 1-D sequence of finite numbers)")
    xx, yy = np.meshgrid(xs, ys)
    points = torch.from_numpy(np.stack([xx.ravel(), yy.ravel()], axis=1))            # [G, 2]
    if type(problem).losses is LeastSquares.losses:  # one batched evaluation of f_i at every grid point, [G, N]
        # (by its losses, not its class: a subclass with losses of its own got this grid of the parent's)
        residual = points @ problem.features.T - problem.responses
        losses = (0.5 * problem.scales * residual ** 2).mean(1)
    else:
        losses = torch.stack([problem.losses(theta).mean() for theta in points])
    return losses.reshape(xx.shape).numpy()


def sampler_paths(problem: FiniteSumProblem, *, steps: int = 100, batch_size: int = 1, lr: float = 0.02,
                  eps: float = 1e-3, ema_decay: float = 0.9, uniform_mix: float = 0.1, rule: str = "robust",
                  seed: int = 0, samplers=SAMPLERS, dtype: torch.dtype = torch.float32) -> dict[str, np.ndarray]:
    """θ after every step of MeZO with each sampler from θ₀, {method: [steps + 1, d] float64}.

    The same seed gives every method the same MeZO directions; ``rule`` picks SAZO's rule.
    A diverged run (non-finite loss) stops: its path ends where it was.

    Example:
        >>> paths = sampler_paths(make_problem(num_examples=16, dim=2), steps=5)
        >>> paths["sazo"].shape
        (6, 2)
    """
    if rule not in RULES:
        raise ValueError(f"Invalid rule: {rule!r} (expected one of {RULES})")
    check_count("steps", steps)
    _check_problem(problem)
    paths = {}
    for method in samplers:
        theta = problem.initial_theta(dtype)
        optimizer = MeZO([theta], lr=lr, eps=eps, seed=seed)
        if method == "sazo":
            sampler = rule_sampler(rule, problem.num_examples, seed=seed, ema_decay=ema_decay, uniform_mix=uniform_mix)
        else:
            sampler = make_sampler(method, problem.num_examples, norms_fn=lambda: problem.norms(theta), seed=seed)
        points = [theta.detach().double().clone()]
        record = lambda: points.append(theta.detach().double().clone()) or 0.0
        try:
            lesson_train(optimizer, sampler, lambda idx: problem.losses(theta, idx), steps, batch_size=batch_size,
                  evaluate=record, log_every=1, progress=False)
        except FloatingPointError:
            pass
        paths[method] = torch.stack(points).numpy()
    return paths


# -- 05: the race ----------------------------------------------------------------------------

@dataclass
class RaceResult:
    """Loss gap against queries per method and seed.

    Attributes:
        queries: [T] logged query counts (the same grid for every run).
        gaps: method → [S, T] array of F(θ) − F(θ*) per seed (NaN from the first log point after the
            loss or the gap became non-finite: the run stopped there).
        initial_gap: F(θ₀) − F(θ*).
        target: the gap to reach (``target_fraction`` × ``initial_gap``).
        to_target: method → list (per seed) of queries to first reach ``target`` (None: never; a seed that
            reached it and diverged later keeps its count, as in ``make bench``).
        lrs: method → the learning rate it ran with.
    """

    queries: np.ndarray
    gaps: dict[str, np.ndarray]
    initial_gap: float
    target: float
    to_target: dict[str, list]
    lrs: dict[str, float] = field(default_factory=dict)

    def _raced(self, name: str, method: str) -> str:
        """``method`` when this race ran it; else a ValueError naming ``name`` and the methods it ran."""
        if method not in self.to_target:
            raise ValueError(f"Invalid {name}: {method!r} (this race ran {tuple(self.to_target)})")
        return method

    def median_to_target(self, method: str) -> float:
        """Median over seeds of queries to target (inf counts as "never", so may be inf)."""
        values = [np.inf if q is None else q for q in self.to_target[self._raced("method", method)]]
        return float(np.median(values))

    def diverged(self, method: str) -> list[bool]:
        """Per seed, whether the run stopped as diverged (``RACE_DIVERGE_FACTOR``: its gap is not finite at the last
        log point)."""
        return [train_diverged(float(row[-1]), gap_limit(float(row[0]), RACE_DIVERGE_FACTOR))
                for row in self.gaps[method]]

    def speedup(self, method: str, baseline: str = "uniform") -> float:
        """How many times fewer queries than ``baseline`` ``method`` needs (medians over seeds).

        inf when only ``method`` reaches the target (the true factor is then above the median of the
        baseline's seeds, each miss counted at ``queries[-1]``, over ``median_to_target(method)``; with an
        even number of seeds that is less than ``queries[-1]`` over it); NaN when ``method`` does not reach it;
        1 when both are there at θ₀ (0 queries: an initial gap already at the target).
        """
        self._raced("baseline", baseline)
        ours, theirs = self.median_to_target(method), self.median_to_target(baseline)
        if not np.isfinite(ours):
            return float("nan")
        if ours == 0:          # at the target before any query: no ratio of query counts
            return 1.0 if theirs == 0 else float("inf")
        return theirs / ours


def _run_one(problem, method: str, seed: int, *, steps, batch_size, lr, eps, ema_decay,
             uniform_mix, log_every, dtype, diverge_above):
    """One training run; returns its ``History``, stopped (``diverged``) where the loss became non-finite (a
    too-large lr) or the gap passed ``diverge_above``."""
    theta = problem.initial_theta(dtype)
    optimizer = MeZO([theta], lr=lr, eps=eps, seed=seed)
    sampler = make_sampler(method, problem.num_examples, norms_fn=lambda: problem.norms(theta), seed=seed, ema_decay=ema_decay, uniform_mix=uniform_mix)
    return lesson_train(optimizer, sampler, lambda idx: problem.losses(theta, idx), steps,
                 batch_size=batch_size, evaluate=lambda: problem.gap(theta),
                 log_every=log_every, progress=False, diverge_above=diverge_above)


def race(problem: FiniteSumProblem, *, samplers=SAMPLERS, seeds=(0, 1, 2), steps: int = 400,
         batch_size: int = 1, lr: float | dict[str, float] = 0.01, eps: float = 1e-3, ema_decay: float = 0.9,
         uniform_mix: float = 0.1, log_every: int = 10, target_fraction: float = 0.05,
         dtype: torch.dtype = torch.float64, progress: bool = False) -> RaceResult:
    """Train every sampler from θ₀ with every seed; record the gap against queries.

    Every run sees the same MeZO directions for a given seed (the seed stream is shared),
    so differences between methods come from which examples they sample. ``lr`` is one
    learning rate for all, or a dict method → its own rate (e.g. from ``tune_lr``): one rate
    for all is not neutral, since importance weights also rescale the per-example curvatures.

    Example:
        >>> result = race(make_problem(num_examples=32, dim=4), seeds=(0,), steps=20, log_every=10)
        >>> result.gaps["sazo"].shape
        (1, 3)
    """
    from tqdm.auto import tqdm

    samplers, seeds = _once("samplers", samplers), _once("seeds", seeds)   # e.g. np.arange(3)
    if not samplers or not seeds:
        raise ValueError("Invalid samplers/seeds: need at least one of each")
    if isinstance(lr, dict) and not set(samplers) <= set(lr):
        raise ValueError(f"Invalid lr: {lr!r} (a dict needs a rate for each of {tuple(samplers)})")
    lrs = {m: check_number("lr", lr[m] if isinstance(lr, dict) else lr, 0.0) for m in samplers}   # MeZO's range
    target_fraction = check_number("target_fraction", target_fraction, 0.0, 1.0, closed_low=False, closed_high=False)
    steps, log_every = check_count("steps", steps), check_count("log_every", log_every)
    batch_size = check_count("batch_size", batch_size)   # before the query grid is computed with it
    logged = [s for s in range(1, steps + 1) if s % log_every == 0 or s == steps]
    queries = 2 * batch_size * np.asarray([0] + logged)
    initial_gap = starting_gap(problem)
    if not initial_gap > 0:       # every run would be at its target at θ₀: nothing to race
        raise ValueError(f"Invalid problem: its initial gap F(θ₀) − F(θ*) is {initial_gap!r} (expected > 0: θ₀ "
                         "already minimises it, so no run has a gap to close)")
    target = target_fraction * initial_gap
    limit = gap_limit(initial_gap, RACE_DIVERGE_FACTOR)
    gaps, to_target = {}, {}
    jobs = [(m, s) for m in samplers for s in seeds]
    for method, seed in tqdm(jobs, desc="race", disable=not progress):
        with one_thread():
            history = _run_one(problem, method, seed, steps=steps, batch_size=batch_size, lr=lrs[method], eps=eps,
                               ema_decay=ema_decay, uniform_mix=uniform_mix, log_every=log_every,
                               dtype=dtype, diverge_above=limit)
        row = np.full(len(queries), np.nan)
        row[0] = initial_gap
        row[1:1 + len(history.metrics)] = history.metrics   # a run stopped as diverged: NaN after its last log point
        gaps.setdefault(method, []).append(row)
        to_target.setdefault(method, []).append(queries_to_target(history, target))   # a first hit, kept if it diverged later
    return RaceResult(queries=queries, gaps={m: np.stack(r) for m, r in gaps.items()},
                      initial_gap=initial_gap, target=target, to_target=to_target, lrs=lrs)


def tune_lr(problem: FiniteSumProblem, method: str, grid, **race_kwargs) -> tuple[float, RaceResult]:
    """The grid rate with the fewest median queries to target for one method (``make bench``'s rule).

    Ties (e.g. no rate reaches the target) go to the smaller median final gap. ``race_kwargs``
    are passed to ``race`` (seeds, steps, batch_size, target_fraction, ...).

    Returns:
        (best rate, the race of ``method`` at that rate).

    Example:
        >>> best, result = tune_lr(make_problem(num_examples=32, dim=4), "uniform", [0.005, 0.02],
        ...                        seeds=(0,), steps=40)
        >>> best in (0.005, 0.02), result.lrs["uniform"] == best
        (True, True)
    """
    grid = [check_number("grid", lr, 0.0) for lr in _sequence("grid", grid)]
    if not grid:
        raise ValueError("Invalid grid: expected at least one learning rate")
    results = {lr: race(problem, samplers=(method,), lr=lr, **race_kwargs) for lr in grid}
    best = pick_rate(results, method)
    return best, results[best]


def pick_rate(results: dict[float, RaceResult], method: str) -> float:
    """``tune_lr``'s choice among races already run: rate → that rate's ``RaceResult`` of ``method``.

    The fewest median queries to target wins among the rates not past the method's edge (``train.past_edge``:
    at least half of the seeds diverged, however fast they first crossed the target); ties go to the smaller
    median final gap (a diverged seed's counts as infinite), then to the earlier rate.

    Example:
        >>> q = np.array([0.0, 10.0])
        >>> runs = {r: RaceResult(q, {"uniform": np.array([[1.0, g]])}, 1.0, 0.1, {"uniform": [None]}) for r, g in
        ...         ((0.01, 0.5), (0.02, 0.3))}
        >>> pick_rate(runs, "uniform")
        0.02
    """
    if not results or any(method not in result.gaps for result in results.values()):
        raise ValueError(f"Invalid results: expected a non-empty dict rate -> RaceResult with a {method!r} race")

    def final_gap(lr: float) -> float:
        final = results[lr].gaps[method][:, -1]
        return float(np.median(np.where(np.isfinite(final), final, np.inf)))

    return best_rate({lr: results[lr].to_target[method] for lr in results},
                     tiebreak={lr: final_gap(lr) for lr in results},
                     past_edges={lr for lr in results if past_edge(results[lr].diverged(method))})


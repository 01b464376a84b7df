"""Queries to a target loss: uniform / SAZO / oracle sampling (part of ``make bench``).

    python -m benchmarks.queries                  # full run: 5 seeds, targets 2% and 0.5%
    python -m benchmarks.queries --quick          # smoke run (seconds)
    python -m benchmarks.queries --methods uniform sazo sazo-no-level --problems "quadratic σ=1.5"

Per-example queries (2·B per MeZO step) until the training-loss gap F(θ) − F(θ*) first drops
below ``target`` × the initial gap. One run per (method, rate, seed) serves every target: it
stops at the tightest one and records when it crossed the others. Each method gets, per
target, its own learning rate: the grid value with the best median over the seeds. All rates
race under a growing step budget, so a bad rate costs no more than the best one; the winning
rates' seeds are always run to the end. Results go to benchmarks/results/queries.json
(``--quick``: queries_quick.json; a run of some problems or without some of the default methods:
queries_partial.json, so that it never replaces the full report). ``METHODS`` also holds the ablation
variants of SAZO. A full run saves each finished (problem, method) cell in benchmarks/results/queries_cells
(``benchmarks.run_cache``): an interrupted run, rerun with the same arguments and code, resumes there.
"""
from __future__ import annotations

import argparse
import hashlib
import json
import math
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

import numpy as np
import torch

from sazo_lite.atomic import write_text
from benchmarks.cli import check_folder, check_not_full, check_output, count, fraction, machine, measured_line, positive
from benchmarks.run_cache import cached_run
from sazo_lite.engine import MeZO
from sazo_lite.samplers import make_sampler
from sazo_lite.course.problems import FiniteSumProblem, LeastSquares, LogisticRegression
from sazo_lite.samplers import SAZOSampler, Sampler, StaleCorrectedSAZOSampler, probabilities
from sazo_lite.train import best_rate, divergence_limit, median_queries, past_edge, queries_to_target, train
from sazo_lite.validation import check_count, check_number
from sazo_lite.variance import uniform_gain

__all__ = ["BenchProblem", "TargetRun", "queries_to_reach", "best_learning_rate", "run_queries_benchmark",
           "default_problems", "format_table", "grid_edge", "ratio", "ratio_bound", "ratio_text", "METHODS", "main"]

RESULTS = Path(__file__).parent / "results"
CELLS = RESULTS / "queries_cells"     # a full run's finished cells: an interrupted run resumes from them
DEFAULT_METHODS = ("uniform", "sazo", "oracle")
RACE_PROTOCOL = 3     # bump when the race's rules (first hits, lost rates, budgets) change what a saved cell would be
TARGETS = (0.02, 0.005)


def _sazo_variant(sampler_class=SAZOSampler, **overrides):
    """A SAZO sampler factory with some hyperparameters changed (for the ablation table)."""
    return lambda problem, theta, seed: sampler_class(problem.num_examples, seed=seed, **overrides)


class _FixedLevelSAZO(SAZOSampler):
    """Ablation: no data-set level (L ≡ 1), so scores keep the units of the step they were seen at."""

    def _next_level(self, indices, size, steps) -> float:
        return 1.0


class InformedSampler(Sampler):
    """Diagnosis only: SAZO's information limits with its noise removed.

    Seen examples are scored by their true gradient norm, either now (``stale=False``: all
    that remains is not having seen every example yet) or as of their last visit
    (``stale=True``: adds staleness); unseen ones by the root-mean-square of those scores
    (``prior="rms"``, SAZO's prior) or by their ``prior``-quantile (a float in (0, 1]; 1 is the
    largest: optimism, every unseen example drawn as if it were the largest seen). Mixed with
    uniform as SAZO is (λ = 0.1). SAZO's own gap beyond the stale version is estimation noise.
    ``norms_at`` (stale only): ``indices → their true norms``, measured at each draw for the drawn
    examples alone, where all N norms a step cost too much (a language model); ``norms_fn`` is then unused.
    """
    reads_parameters = True   # its norms read θ: under a folded MeZO, train flushes before its draws and updates

    def __init__(self, num_examples, norms_fn, *, stale: bool, prior="rms", uniform_mix: float = 0.1,
                 seed: int = 0, norms_at=None):
        super().__init__(num_examples, seed=seed)
        if prior != "rms" and not (isinstance(prior, float) and 0 < prior <= 1):
            raise ValueError(f"Invalid prior: {prior!r} (expected 'rms' or a quantile in (0, 1])")
        if norms_at is not None and not stale:
            raise ValueError("Invalid norms_at: only a stale sampler reads norms at the draws alone")
        self.norms_fn, self.stale, self.prior, self.uniform_mix = norms_fn, stale, prior, uniform_mix
        self.norms_at = norms_at if norms_at is not None else \
            (lambda indices: torch.as_tensor(self.norms_fn()).double()[indices])
        self.seen = np.zeros(num_examples, dtype=bool)
        self.last = np.zeros(num_examples)

    @property
    def probs(self) -> torch.Tensor:
        if not self.seen.any():
            return torch.full((self.num_examples,), 1.0 / self.num_examples, dtype=torch.float64)
        norms = self.last if self.stale else torch.as_tensor(self.norms_fn()).double().numpy()
        seen = norms[self.seen]
        prior = math.sqrt(float(np.mean(seen ** 2))) if self.prior == "rms" else float(np.quantile(seen, self.prior))
        scores = np.where(self.seen, norms, prior)
        return torch.from_numpy(probabilities(scores, float(scores.sum()), self.uniform_mix, self.num_examples))

    def _observe(self, indices, diffs) -> None:
        indices = indices.numpy()
        self.seen[indices] = True
        self.last[indices] = torch.as_tensor(self.norms_at(indices)).double().numpy()


class NoiselessSAZO(SAZOSampler):
    """Diagnosis only: SAZO's rule fed E|d| = sqrt(2/π)·‖∇f_i‖ (the true norm at the draw) instead of
    |d|: the noise of single observations removed, the lag of the EMA over draws (and the level) kept.
    ``ema_decay`` shortens that memory (0: the last draw's norm, relative to the level)."""
    reads_parameters = True   # its norms read θ: under a folded MeZO, train flushes before its draws and updates

    def __init__(self, num_examples, norms_fn, *, ema_decay: float = 0.9, seed: int = 0):
        super().__init__(num_examples, ema_decay=ema_decay, seed=seed)
        self.norms_fn = norms_fn

    def _observe(self, indices, diffs) -> None:
        norms = torch.as_tensor(self.norms_fn()).double()[indices]
        super()._observe(indices, norms * math.sqrt(2 / math.pi))


class SmoothedOracle(Sampler):
    """Diagnosis only: an oracle that knows every example's *recent* norms, not the present ones.

    After every step m_i ← (1 − 1/h)·m_i + (1/h)·‖∇f_i(θ)‖² for all i (true norms, m starts at θ₀'s),
    and p_i ∝ sqrt(m_i), mixed with uniform like SAZO (λ = 0.1). h = 1 is the capped oracle
    (``oracle-mix-0.1``); h = N/B steps averages over one visit interval; h = 10·N/B is the memory
    in steps of SAZO's EMA (β = 0.9: about ten draws of an example). What it measures: how fast the
    norms a sampler must know change, against how often a visit-based rule can observe them.
    """
    reads_parameters = True   # its norms read θ: under a folded MeZO, train flushes before its draws and updates

    def __init__(self, num_examples, norms_fn, *, horizon: float, uniform_mix: float = 0.1, seed: int = 0):
        super().__init__(num_examples, seed=seed)
        if not horizon >= 1:
            raise ValueError(f"Invalid horizon: {horizon!r} (expected ≥ 1 step)")
        self.norms_fn, self.rate, self.uniform_mix = norms_fn, 1.0 / horizon, uniform_mix
        self.mean_sq: np.ndarray | None = None     # m [N]: the smoothed squared norms

    def _squared_norms(self) -> np.ndarray:
        return torch.as_tensor(self.norms_fn()).double().numpy() ** 2

    @property
    def probs(self) -> torch.Tensor:
        if self.mean_sq is None:
            self.mean_sq = self._squared_norms()
        scores = np.sqrt(self.mean_sq)
        return torch.from_numpy(probabilities(scores, float(scores.sum()), self.uniform_mix, self.num_examples))

    def _observe(self, indices, diffs) -> None:
        now = self._squared_norms()
        self.mean_sq = now if self.mean_sq is None else (1 - self.rate) * self.mean_sq + self.rate * now


class AgeDecaySAZO(SAZOSampler):
    """Candidate rule (not in the library): the EMA decay also falls with the steps since an example's
    last draw, β_i = min(β_n, exp(−age_i / horizon)), horizon = ``visits``·N/B steps; more state: a step
    per example. Raced in docs/llm.md ("Why SAZO's scores lag"); it lost on the σ = 1.5 quadratic."""

    def __init__(self, num_examples, *, visits: float = 2.0, batch_size: int = 1, seed: int = 0):
        super().__init__(num_examples, seed=seed)
        self.horizon = visits * num_examples / batch_size
        self._last = np.zeros(num_examples, dtype=np.int64)
        self._ages = None

    def decay(self, counts) -> np.ndarray:
        base = super().decay(counts)
        return base if self._ages is None else np.minimum(base, np.exp(-self._ages / self.horizon))

    def _observe(self, indices, diffs) -> None:
        unique = np.unique(indices.numpy())
        self._ages = np.where(self._n[unique] > 0, self.level_steps + 1 - self._last[unique], 0).astype(float)
        try:
            super()._observe(indices, diffs)
        finally:
            self._ages = None
        self._last[unique] = self.level_steps


class OptimisticPriorSAZO(SAZOSampler):
    """Candidate rule (not in the library): SAZO drawing unseen examples at the ``quantile`` of the
    seen scores (1: the largest) instead of their RMS; a first observation is still blended with the
    RMS prior. An O(N) pass a step (benchmark only). Raced in docs/llm.md ("Why SAZO's scores lag"):
    it lost on the σ = 1.5 quadratic."""

    def __init__(self, num_examples, *, quantile: float = 1.0, seed: int = 0):
        super().__init__(num_examples, seed=seed)
        self.quantile = quantile

    def _total(self):
        seen_total, unseen_count = self._store.masses()
        seen = np.flatnonzero(self._n > 0)
        prior = float(np.quantile(self._seen_scores(seen), self.quantile)) if len(seen) else 0.0
        return seen_total + prior * unseen_count, seen_total, unseen_count, prior


class RegressedSAZO(StaleCorrectedSAZOSampler):
    """Candidate rule (not in the library): a seen example's sampling score is the fresh observation
    predicted from its stored score by a linear regression per log₂ age bucket b,

        ŝ_i = max(α_b + β_b·s_i, floor·s̄),   (α_b, β_b) = least squares of o on s over recent draws of age b

    (o: the draw's |d|/L in score units; running means of s, o, s², s·o with step ``rate``, starting at
    α = 0, β = 1, i.e. SAZO). β_b < 1 shrinks old scores toward the data set's mean (regression to the
    mean by age); it generalises the staleness correction (α = 0). O(N) + 4K floats, zero extra forwards,
    weights 1/(N·p_i). Raced in docs/llm.md ("Why SAZO's scores lag"): no gain on the σ = 1.5 quadratic,
    a loss on the logistic regression."""

    def __init__(self, num_examples, *, rate: float = 0.02, slope_max: float = 2.0, floor: float = 0.05,
                 seed: int = 0):
        super().__init__(num_examples, seed=seed)
        self.rate, self.slope_max, self.floor = rate, slope_max, floor
        self._moments = np.tile([1.0, 1.0, 2.0, 2.0], (self.AGE_BUCKETS, 1))   # E s, E o, E s², E s·o [K, 4]

    def coefficients(self) -> tuple[np.ndarray, np.ndarray]:
        """(α [K], β [K]): each age bucket's intercept and slope (β clipped to [0, slope_max])."""
        s, o, ss, so = self._moments.T
        slope = np.clip((so - s * o) / np.maximum(ss - s * s, 1e-12), 0.0, self.slope_max)
        return o - slope * s, slope

    def _sampling_scores(self, indices: np.ndarray) -> np.ndarray:
        intercept, slope = self.coefficients()
        b = self._buckets(self.level_steps + 1 - self._last[indices])
        predicted = intercept[b] + slope[b] * self._seen_scores(indices)
        floored = np.maximum(predicted, self.floor * self._prior_score())
        return np.where(self._n[indices] > 0, floored, 0.0)   # 0 where unseen, as the store expects

    def _learn_by_age(self, buckets, fresh, stored) -> None:   # the staleness correction's draws, other moments
        for b, o, s in zip(buckets, fresh, stored):
            self._moments[b] += self.rate * (np.array([s, o, s * s, s * o]) - self._moments[b])


class AdaptiveMixSAZO(SAZOSampler):
    """Candidate rule (not in the library): SAZO whose uniform mix λ is chosen, every step, as the λ'
    of ``mixes`` whose variance term V(p_λ') the draws estimate lowest. For indices k drawn from p
    (the current mix) with diffs d_k (E d_k² = ‖∇f_k‖²),

        V̂(λ') ← (1 − r)·V̂(λ') + r·mean_k d_k² / (N²·p_k·p_λ'(k)),   E_{k∼p}[d_k²/(N² p_k p'_k)] = V(p'),

    with p_λ' = (1 − λ')·ŝ/Σŝ + λ'/N from the same scores, so an example whose norm outgrew its score
    (a floor example after a jump) raises the V̂ of the small mixes first. |mixes| floats of state,
    zero extra forwards, weights 1/(N·p_i) of the p sampled. Raced in docs/llm.md ("Probes of the floor
    and of the norms' age at N = 64"): level with SAZO on the toys at B = 4, a loss on SmolLM2 at N = 64."""

    def __init__(self, num_examples, *, mixes=(0.05, 0.1, 0.2, 0.4), rate: float = 0.01, seed: int = 0):
        super().__init__(num_examples, seed=seed)
        self.mixes, self.rate = np.asarray(mixes, dtype=np.float64), rate
        self.variance_estimates = np.zeros(len(mixes))
        self.mix_history: list[float] = []

    def variance_terms(self, indices: np.ndarray, squared: np.ndarray) -> np.ndarray:
        """One batch's estimates of V(p_λ') for every λ' of ``mixes`` [M]: mean_k squared_k/(N² p_k p_λ'(k)),
        unbiased for indices drawn from the current p and E[squared_k] = ‖∇f_k‖²."""
        total, _, _, prior = self._total()
        scores, n = self._scores_at(indices, prior), self.num_examples
        sampled = probabilities(scores, total, self.uniform_mix, n)                            # [B]
        each = np.stack([probabilities(scores, total, m, n) for m in self.mixes])               # [M, B]
        return (squared / (n * n * sampled * each)).mean(axis=1)

    def _observe(self, indices, diffs) -> None:
        if indices.numel():
            estimate = self.variance_terms(indices.numpy(), diffs.numpy().astype(np.float64) ** 2)
            if np.isfinite(estimate).all():
                self.variance_estimates += self.rate * (estimate - self.variance_estimates)
        super()._observe(indices, diffs)
        if self.level_steps * self.rate >= 1.0:   # after ~1/rate steps of estimates
            self.uniform_mix = float(self.mixes[int(np.argmin(self.variance_estimates))])
        self.mix_history.append(self.uniform_mix)


class FastUpSAZO(SAZOSampler):
    """Candidate rule (not in the library): SAZO whose EMA rises fast and falls slowly. A seen example's
    observation above its score is averaged in with decay min(``up_decay``, β_n) instead of β_n:

        G_i ← b·G_i + (1 − b)·o_i,   b = min(up_decay, β_{n_i}) if o_i > G_i else β_{n_i}

    so a norm that jumps is followed within a draw or two (the under-scored example is what draws a large
    weight), while a low draw of |d| still moves the score by only 1 − β. The upward bias is the same
    multiple for every example with the same noise, so p is about unchanged where norms stand still.
    O(N), zero extra forwards, weights 1/(N·p_i) of the p sampled: only the decay of SAZO's update changes
    (``_observation_decay``). Raced in docs/llm.md
    ("Probes of the floor and of the norms' age at N = 64"): a loss on the σ = 1.5 quadratic and at N = 64."""

    def __init__(self, num_examples, *, up_decay: float = 0.5, seed: int = 0):
        super().__init__(num_examples, seed=seed)
        self.up_decay = up_decay

    def _observation_decay(self, counts, old, observed) -> np.ndarray:
        decay = self.decay(counts)
        rising = (counts > 0) & (observed > old)
        return np.where(rising, np.minimum(self.up_decay, decay), decay)


# name -> (problem, θ, seed) -> sampler. The first three are the table's columns; the rest
# switch one robustness feature of SAZO's rule off (or change it) for the ablation.
METHODS: dict[str, Callable] = {
    **{name: (lambda problem, theta, seed, name=name: make_sampler(name, problem.num_examples, seed=seed,
                                                                 norms_fn=lambda: problem.norms(theta)))
       for name in ("uniform", "sazo", "oracle", "sazo-plain")},
    "sazo-no-prior-blend": _sazo_variant(prior_strength=0.0),
    "sazo-no-level": _sazo_variant(_FixedLevelSAZO),
    "sazo-square": _sazo_variant(statistic="square"),
    "sazo-mix-0.05": _sazo_variant(uniform_mix=0.05),
    "sazo-mix-0.2": _sazo_variant(uniform_mix=0.2),
    "sazo-decay-0.5": _sazo_variant(ema_decay=0.5),
    "sazo-decay-0.7": _sazo_variant(ema_decay=0.7),
    "sazo-decay-0.95": _sazo_variant(ema_decay=0.95),
    "sazo-stale-corrected": _sazo_variant(StaleCorrectedSAZOSampler),
    **{f"sazo-age-decay-{v:g}": (lambda v: lambda problem, theta, seed: AgeDecaySAZO(
        problem.num_examples, visits=v, seed=seed))(v) for v in (1.0, 2.0, 4.0)},
    "noiseless": lambda problem, theta, seed: NoiselessSAZO(problem.num_examples, lambda: problem.norms(theta), seed=seed),
    "oracle-mix-0.1": lambda problem, theta, seed: make_sampler(
        "oracle", problem.num_examples, seed=seed, norms_fn=lambda: problem.norms(theta), oracle_mix=0.1),
    "informed-fresh": lambda problem, theta, seed: InformedSampler(
        problem.num_examples, lambda: problem.norms(theta), stale=False, seed=seed),
    **{f"informed-{name}": (lambda q: lambda problem, theta, seed: InformedSampler(
        problem.num_examples, lambda: problem.norms(theta), stale=False, prior=q, seed=seed))(q)
       for name, q in (("max", 1.0), ("q90", 0.9))},
    **{f"sazo-optimistic-{name}": (lambda q: lambda problem, theta, seed: OptimisticPriorSAZO(
        problem.num_examples, quantile=q, seed=seed))(q) for name, q in (("max", 1.0), ("q90", 0.9))},
    **{f"oracle-smoothed-{k}N": (lambda k: lambda problem, theta, seed: SmoothedOracle(
        problem.num_examples, lambda: problem.norms(theta), horizon=k * problem.num_examples, seed=seed))(k)
       for k in (1, 3, 10)},   # horizon k·N steps: k visit intervals at B = 1
    **{f"noiseless-decay-{b:g}": (lambda b: lambda problem, theta, seed: NoiselessSAZO(
        problem.num_examples, lambda: problem.norms(theta), ema_decay=b, seed=seed))(b) for b in (0.0, 0.5)},
    "sazo-regressed": lambda problem, theta, seed: RegressedSAZO(problem.num_examples, seed=seed),
    "sazo-level-decay-0.999": _sazo_variant(level_decay=0.999),
    "sazo-adaptive-mix": _sazo_variant(AdaptiveMixSAZO),
    "sazo-fast-up": _sazo_variant(FastUpSAZO),
    "informed-stale": lambda problem, theta, seed: InformedSampler(
        problem.num_examples, lambda: problem.norms(theta), stale=True, seed=seed),
}


@dataclass
class BenchProblem:
    """One row of the table: a problem, its learning-rate grid, a step budget, the --quick grid."""

    name: str
    problem: FiniteSumProblem
    lr_grid: list[float]
    max_steps: int
    quick_grid: list[float]


# The toy runs' divergence rule (``train.divergence_limit``, ``train.diverged``): a run has diverged once its gap is
# not finite or above DIVERGE_FACTOR × its initial gap (a start of 0 gives a limit of 0). The stored tables were
# measured with it.
DIVERGE_FACTOR = 1e4
LOG_EVERY = 10           # TargetRun's log interval: runs extend by whole intervals (a budget is a multiple of it)


class TargetRun:
    """One MeZO run (float64 θ) that can be extended step budget by step budget.

    Extending to s steps in pieces gives the same trajectory as one run of s steps: the
    optimiser and sampler keep their state, and logging happens every ``log_every`` steps.
    ``reached[target]`` is set once the gap is ≤ target·gap₀ (for each of ``targets``; the run
    stops at the smallest): the first logged count, kept if the run diverges later. ``failed`` once
    the run diverged. ``queries`` is the smallest target's count (None until reached).
    """

    def __init__(self, problem: FiniteSumProblem, method: str | Callable, lr: float, seed: int,
                 target: float | tuple = TARGETS, *, batch_size: int = 1, eps: float = 1e-3, log_every: int = LOG_EVERY):
        self.problem, self.batch_size, self.log_every = problem, batch_size, log_every
        self.theta = problem.initial_theta(torch.float64)
        self.optimal = problem.optimal_loss
        self.initial_gap = problem.full_loss(self.theta) - self.optimal
        self.targets = tuple(sorted((target,) if isinstance(target, (int, float)) else target, reverse=True))
        self.reached: dict[float, int | None] = {t: None for t in self.targets}
        self.optimizer = MeZO([self.theta], lr=lr, eps=eps, seed=seed)
        factory = METHODS[method] if isinstance(method, str) else method
        self.sampler = factory(problem, self.theta, seed)
        self.steps, self.failed = 0, False

    @property
    def queries(self) -> int | None:
        return self.reached[self.targets[-1]]

    @property
    def done(self) -> bool:
        return self.failed or self.queries is not None

    def _gap(self) -> float:
        return self.problem.full_loss(self.theta) - self.optimal

    def extend_to(self, steps: int) -> "TargetRun":
        """Run on until ``steps`` steps in all, the smallest target, or divergence."""
        more = -(-(steps - self.steps) // self.log_every) * self.log_every  # keep the log grid
        if self.done or more <= 0:
            return self
        history = train(self.optimizer, self.sampler, lambda idx: self.problem.losses(self.theta, idx),
                        more, batch_size=self.batch_size, evaluate=self._gap, log_every=self.log_every,
                        progress=False, stop_below=self.targets[-1] * self.initial_gap,
                        diverge_above=divergence_limit(self.initial_gap, DIVERGE_FACTOR))
        # first hitting time (``train.queries_to_target``, the one rule): a target crossed before the run
        # diverged keeps its count, whether the divergence came in the same extension or a later one
        for target in self.targets:
            if self.reached[target] is None:
                reached = queries_to_target(history, target * self.initial_gap)
                if reached is not None:
                    self.reached[target] = reached + 2 * self.batch_size * self.steps
        self.steps += len(history.queries)
        self.failed = history.diverged
        return self


def queries_to_reach(problem: FiniteSumProblem, method: str, lr: float, seed: int, target: float,
                     max_steps: int, **kwargs) -> int | None:
    """Queries until gap ≤ target·gap₀ with MeZO (float64 θ), or None (diverged / over budget).

    Example:
        >>> q = queries_to_reach(LeastSquares(32, 3, seed=0), "sazo", 0.01, seed=0, target=0.1, max_steps=500)
        >>> 0 < q <= 2 * 500  # 2 queries per step at B = 1
        True
    """
    return TargetRun(problem, method, lr, seed, target, **kwargs).extend_to(max_steps).queries


def best_learning_rate(make_run: Callable[[float, int], TargetRun], grid: list[float], seeds: list[int],
                       max_steps: int, first_budget: int = 500, growth: float = 1.25,
                       targets: tuple | None = None) -> dict:
    """Pick, per target, the grid rate with the best median queries over ``seeds``, at bounded cost.

    Every rate's runs are extended together under a step budget that grows by ``growth``
    until some rate's median is reached at the smallest target and no rate still open can beat
    it at any target (``_settled``), so a bad rate costs at most about as much as the best one.
    A rate where at least half of the seeds diverged is lost (its edge): it stops and is not
    chosen, even at a larger target its seeds crossed before diverging (unless every rate is
    lost). The winners' seeds are run to the end (up to ``max_steps``) for the min–max spread;
    a winner lost there gives way to the next rate (``_choose``).

    Returns:
        {target: dict with ``lr``, ``median``, ``min``, ``max`` (None if a seed never got there),
        ``per_seed`` and ``grid`` (median per rate; None where it cannot beat the winner or is lost); where no
        rate reached the target, ``floor``: a lower bound on the median any rate the rule may choose would have
        had with its runs continued (their queries so far; None where each such rate's median is a divergence)};
        without ``targets`` (runs with one target), that one target's dict.
    """
    if not grid or not seeds:
        raise ValueError(f"Invalid {'grid' if not grid else 'seeds'}: expected at least one (got none)")
    first_budget = check_count("first_budget", first_budget)
    growth = check_number("growth", growth, 1.0, closed_low=False)     # int(growth · budget) may not grow: +1 below
    runs = {lr: [make_run(lr, seed) for seed in seeds] for lr in grid}
    single = targets is None
    # a run's queries at a target (one target: its ``queries``, whatever it calls that target)
    reached = (lambda run, target: run.queries) if single else (lambda run, target: run.reached[target])
    targets = (None,) if single else targets
    alive = lambda lr_runs: not past_edge([run.failed for run in lr_runs])   # else its median is lost
    budget = min(first_budget, max_steps)
    while True:
        for lr_runs in runs.values():
            if alive(lr_runs):
                for run in lr_runs:
                    run.extend_to(budget)
        if _settled(runs, targets, reached, alive) or budget >= max_steps:
            break
        budget = min(max(budget + 1, int(growth * budget)), max_steps)  # small growth: little overshoot
    chosen = {target: _choose(runs, grid, target, reached, alive, max_steps) for target in targets}
    out = {}
    for target, best_lr in chosen.items():      # after every choice: a rate found lost shows no median
        at = {lr: median_queries([reached(run, target) for run in lr_runs]) for lr, lr_runs in runs.items()}
        grid_medians = {repr(lr): (None if math.isinf(m) or not alive(runs[lr]) else m) for lr, m in at.items()}
        if best_lr is None:     # the floor: no rate the rule may choose could have a median below it had its runs gone on
            choosable = [lr_runs for lr_runs in runs.values() if alive(lr_runs)] or list(runs.values())
            floor = min(median_queries([_floor(run, target, reached) for run in lr_runs]) for lr_runs in choosable)
            out[target] = {"lr": None, "median": None, "min": None, "max": None, "per_seed": [None] * len(seeds),
                           "grid": grid_medians, "floor": None if math.isinf(floor) else floor}
            continue
        per_seed = [reached(run, target) for run in runs[best_lr]]
        finite = [q for q in per_seed if q is not None]
        out[target] = {"lr": best_lr, "median": at[best_lr], "min": min(finite),
                       "max": max(finite) if len(finite) == len(per_seed) else None,
                       "per_seed": per_seed, "grid": grid_medians}
    return out[None] if single else out


def _settled(runs: dict, targets, reached, alive) -> bool:
    """Whether no rate still racing can beat, at any target, the rates whose median reached the smallest target
    (over half of their seeds did: they are never lost). A run still racing counts the queries it has run (it
    crosses later, if ever): with an even number of seeds a median is the mean of two runs, and one of them can
    still be racing while the mean is below the winners' (that rate then races on)."""
    floor = lambda run, target: _floor(run, target, reached)
    safe = [lr_runs for lr_runs in runs.values() if median_queries([run.queries for run in lr_runs]) < math.inf]
    if not safe:
        return False
    for target in targets:
        bound = min(median_queries([reached(run, target) for run in lr_runs]) for lr_runs in safe)
        for lr_runs in runs.values():
            if (alive(lr_runs) and math.isinf(median_queries([reached(run, target) for run in lr_runs]))
                    and median_queries([floor(run, target) for run in lr_runs]) < bound):
                return False
    return True


def _floor(run: TargetRun, target, reached) -> float:
    """A lower bound on a run's queries to ``target``: its count where it got there, the queries it has run where it
    is still short of it (it crosses later, if ever), ∞ where it diverged."""
    queries = reached(run, target)
    return queries if queries is not None else math.inf if run.failed else 2 * run.batch_size * run.steps


def _choose(runs: dict, grid, target, reached, alive, max_steps: int) -> float | None:
    """The rate ``best_learning_rate`` picks at ``target`` (None: no rate reached it), its runs extended to
    ``max_steps``. A rate still racing at the budget's stop can have crossed a larger target and diverge later
    on half of its seeds: once run to the end it is lost, and the next best rate is chosen (unless every
    rate is lost). Where every rate is lost the rule chooses among them all, so their runs, stopped when their rate
    was lost, are first run to the end (a seed still racing then would count as a miss)."""
    if not any(alive(runs[lr]) for lr in grid):
        for lr in grid:
            for run in runs[lr]:
                run.extend_to(max_steps)
    while True:
        lost = {lr for lr in grid if not alive(runs[lr])}
        best_lr = best_rate({lr: [reached(run, target) for run in runs[lr]] for lr in grid}, past_edges=lost)
        if math.isinf(median_queries([reached(run, target) for run in runs[best_lr]])):
            return None
        for run in runs[best_lr]:
            run.extend_to(max_steps)
        if best_lr in lost or alive(runs[best_lr]):
            return best_lr


def default_problems(quick: bool = False) -> list[BenchProblem]:
    """The three benchmark problems (fixed data seed 0), with rate grids and step budgets."""
    # rates 1.5× apart (quadratics) and 2× apart (logistic), wide enough that every method's best
    # rate lies inside (the table marks a rate chosen at an edge of its grid)
    ls_grid = [0.00033, 0.0005, 0.00075, 0.00113, 0.0017, 0.0025, 0.0038, 0.0057]
    lr_grid = [0.003, 0.006, 0.012, 0.024, 0.048, 0.096]
    ls_quick, lr_quick = [0.0017, 0.0025], [0.006, 0.012]
    problems = [
        BenchProblem("quadratic σ=0", LeastSquares(256, 20, heterogeneity=0.0, seed=0), ls_grid, 20_000, ls_quick),
        BenchProblem("quadratic σ=1.5", LeastSquares(256, 20, heterogeneity=1.5, seed=0), ls_grid, 30_000,
                     ls_quick),
        # σ = 0: the data's own spread of norms (V(u)/V(p*) ≈ 12 at θ*) needs no extra knob.
        BenchProblem("logistic breast_cancer σ=0",
                     LogisticRegression.from_sklearn("breast_cancer", heterogeneity=0.0), lr_grid, 40_000, lr_quick),
    ]
    if quick:
        for item in problems:
            item.lr_grid, item.max_steps = item.quick_grid, 3_000
    return problems


def code_version() -> str:
    """A hash of the code a cell's counts come from (the library and this module): a cell saved by other code
    is not resumed."""
    root = Path(__file__).resolve().parent.parent
    digest = hashlib.sha256()
    for path in sorted([*(root / "sazo_lite").rglob("*.py"), Path(__file__).resolve()]):
        digest.update(path.relative_to(root).as_posix().encode() + b"\0" + path.read_bytes())
    return digest.hexdigest()[:16]


def run_queries_benchmark(problems: list[BenchProblem], seeds: list[int], targets=TARGETS,
                          batch_size: int = 1, progress: bool = True, methods=DEFAULT_METHODS,
                          cache: Path | None = None, refresh: bool = False) -> dict:
    """Run every method on every problem; returns the JSON-ready results.

    ``rows[k][method][repr(target)]`` holds the per-target result of ``best_learning_rate``, with the cell's
    ``seconds`` and the date it was ``measured``. ``cache``: a folder where each finished (problem, method) cell
    is saved under everything that determines it (problem, grid, budget, seeds, targets, B, the race's protocol,
    the code and torch): a rerun reads the cells it holds instead of racing them again, and ``resumed`` lists
    them with their dates. ``refresh``: race every cell again, replacing the saved ones.
    """
    from tqdm.auto import tqdm

    targets = tuple(sorted((targets,) if isinstance(targets, (int, float)) else targets, reverse=True))
    version = code_version() if cache is not None else None
    rows, resumed = [], []
    bar = tqdm(total=len(problems) * len(methods), desc="queries benchmark", disable=not progress)
    for item in problems:
        row = {"problem": item.name, "num_examples": item.problem.num_examples, "dim": item.problem.dim,
               "gain_at_optimum": uniform_gain(item.problem.norms(item.problem.optimum)),
               "max_steps": item.max_steps}
        for method in methods:
            computed = []

            def race() -> dict:
                started = time.perf_counter()
                make_run = lambda lr, seed: TargetRun(item.problem, method, lr, seed, targets, batch_size=batch_size)
                result = best_learning_rate(make_run, item.lr_grid, seeds, item.max_steps, targets=targets)
                computed.append(True)
                return {**{repr(t): r for t, r in result.items()}, "seconds": round(time.perf_counter() - started, 2),
                        "measured": machine()["date"]}
            key = {"race": "queries", "race_protocol": RACE_PROTOCOL, "code": version, "torch": torch.__version__,
                   "problem": item.name, "num_examples": row["num_examples"], "dim": row["dim"],
                   "gain_at_optimum": row["gain_at_optimum"], "lr_grid": list(item.lr_grid),
                   "max_steps": item.max_steps, "seeds": list(seeds), "targets": list(targets),
                   "batch_size": batch_size, "method": method}
            row[method] = cached_run(cache, key, race, refresh=refresh)
            if not computed:
                resumed.append(f"{item.name} / {method} ({row[method]['measured']})")
            bar.update(1)
        rows.append(row)
    bar.close()
    return {"benchmark": "queries", "targets": list(targets), "seeds": seeds, "batch_size": batch_size,
            "methods": list(methods), "rows": rows, "resumed": resumed}


def ratio(row: dict, numerator: str, denominator: str, target: float):
    """median(numerator) / median(denominator) at ``target``, or None if either was not reached."""
    a, b = (row.get(m, {}).get(repr(target), {}).get("median") for m in (numerator, denominator))
    if a is None or b is None or math.isinf(a) or math.isinf(b):
        return None
    return a / b


def ratio_bound(row: dict, numerator: str, denominator: str, target: float) -> tuple[str, float] | None:
    """Where one side never reached ``target`` within its budget and the other did: ("<", a ÷ floor of b) or
    (">", floor of a ÷ b), the floor being ``best_learning_rate``'s; None otherwise (both reached: ``ratio``;
    neither; or no floor: every rate diverged, or a cell saved before floors were)."""
    a, b = (row.get(m, {}).get(repr(target), {}) for m in (numerator, denominator))
    reached = lambda cell: cell.get("median") is not None and math.isfinite(cell["median"])
    floor = lambda cell: cell.get("floor") if cell.get("median") is None and cell.get("floor") else None
    if reached(a) and floor(b) and a["median"] > 0:
        return "<", a["median"] / floor(b)
    if reached(b) and floor(a) and b["median"] > 0:
        return ">", floor(a) / b["median"]
    return None


def ratio_text(row: dict, numerator: str, denominator: str, target: float, invert: bool = False) -> str:
    """The table's ratio cell: "r×", a bound ("< r×", "> r×": ``ratio_bound``) or "–" where nothing is known;
    ``invert``: of denominator ÷ numerator."""
    value, bound = ratio(row, numerator, denominator, target), ratio_bound(row, numerator, denominator, target)
    if invert:
        value = None if value is None else 1 / value
        bound = bound and ({"<": ">", ">": "<"}[bound[0]], 1 / bound[1])
    if value is not None:
        return f"{value:.2f}×"
    return "–" if bound is None else f"{bound[0]} {bound[1]:.2f}×"


def grid_edge(chosen: float, grid) -> str:
    """The table's mark for a rate chosen at the lowest or highest rate of its grid.

    ``grid`` holds the rates, or is a dict keyed by them (as reports store it). Returns
    ``" (grid edge)"``, ``" (one rate)"`` for a grid of a single rate (nothing was compared), or
    an empty string.
    """
    rates = sorted({float(lr) for lr in grid})      # a rate given twice is one rate
    if len(rates) == 1:
        return " (one rate)"
    return " (grid edge)" if rates and chosen in (min(rates), max(rates)) else ""


def _cell(result: dict) -> str:
    if result["median"] is None or math.isinf(result["median"]):
        return "not reached" + (f" (> {result['floor']:.0f})" if result.get("floor") else "")
    top = "not reached" if result["max"] is None else f"{result['max']:.0f}"
    edge = grid_edge(result["lr"], result.get("grid", {}))
    if repr(result["lr"]) in result.get("grid", {}) and result["grid"][repr(result["lr"])] is None:
        edge += " (every rate lost: half or more of its seeds diverged)"    # the rule's last resort, not a rate to run
    return f"{result['median']:.0f} [{result['min']:.0f}–{top}] lr={result['lr']:g}{edge}"


def format_table(results: dict) -> str:
    """A markdown table per target: median queries [min–max] (chosen lr) and the ratios."""
    methods = results["methods"]
    extra = [m for m in methods if m not in ("uniform", "oracle")]
    lines = []
    for target in results["targets"]:
        head = ["problem", "target", "V(u)/V(p*) at θ*", *methods,
                *(f"uniform/{m}" for m in extra if "uniform" in methods),
                *(f"{m}/oracle" for m in extra if "oracle" in methods)]
        lines += ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
        for row in results["rows"]:
            cells = [row["problem"], f"{target:g}", f"{row['gain_at_optimum']:.2f}"]
            cells += [_cell(row[m][repr(target)]) for m in methods]
            if "uniform" in methods:
                cells += [ratio_text(row, "uniform", m, target) for m in extra]
            if "oracle" in methods:
                cells += [ratio_text(row, m, "oracle", target) for m in extra]
            lines.append("| " + " | ".join(cells) + " |")
        lines.append("")
    if results.get("resumed"):      # cells of an interrupted run of the same code and settings: their dates
        lines.append("cells resumed from an earlier run of the same code and settings: " + "; ".join(results["resumed"]))
    return "\n".join(lines).rstrip()


def main(argv: list[str] | None = None) -> dict:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.queries", description=__doc__.split("\n")[0])
    parser.add_argument("--quick", action="store_true", help="smoke run: 1 seed, 2 rates, loose target")
    parser.add_argument("--seeds", type=count, default=None, help="number of seeds (default 5; quick: 1)")
    parser.add_argument("--targets", type=fraction, nargs="+", default=None,
                        help="targets as fractions of the initial gap (default 0.02 0.005; quick: 0.1)")
    parser.add_argument("--methods", nargs="+", default=list(DEFAULT_METHODS), choices=list(METHODS), metavar="METHOD",
                        help=f"samplers to race (default {' '.join(DEFAULT_METHODS)}): {', '.join(METHODS)}")
    parser.add_argument("--problems", nargs="+", default=None, help="problem names (default: all)")
    parser.add_argument("--lr-grid", type=positive, nargs="+", default=None, help="override every problem's grid")
    parser.add_argument("--batch-size", type=count, default=1, help="B, examples per step (default 1)")
    parser.add_argument("--out", default=None, help="JSON path (default benchmarks/results/queries.json; --quick: "
                        "queries_quick.json; some problems or not every default method: queries_partial.json)")
    parser.add_argument("--run-cache", type=Path, default=None,
                        help=f"save each finished (problem, method) cell here; a rerun with the same arguments and code "
                             f"resumes from it (default {CELLS.relative_to(RESULTS.parent.parent)}; --quick: none)")
    parser.add_argument("--fresh", action="store_true", help="race every cell again, replacing the saved ones")
    args = parser.parse_args(argv)
    args.methods = list(dict.fromkeys(args.methods))     # a method named twice is raced once, one column
    seeds = list(range((1 if args.quick else 5) if args.seeds is None else args.seeds))
    targets = sorted(set(args.targets), reverse=True) if args.targets else ([0.1] if args.quick else list(TARGETS))
    problems = default_problems(args.quick)
    if args.problems:
        unknown = set(args.problems) - {p.name for p in problems}
        if unknown:
            parser.error(f"unknown --problems {sorted(unknown)}; known: {[p.name for p in problems]}")
    names = [p.name for p in problems]
    # a run of fewer cells than the full report's writes its own file: it must not replace the full one
    partial = bool(set(names) - set(args.problems or names)) or bool(set(DEFAULT_METHODS) - set(args.methods))
    default = "queries_quick.json" if args.quick else "queries_partial.json" if partial else "queries.json"
    out = Path(args.out) if args.out else RESULTS / default
    check_output(parser, "--out", out)      # before the run, not after it
    if args.quick:
        check_not_full(parser, "--out", out, lambda saved: saved["quick"], "queries_quick.json")
    elif partial and args.out:      # the default partial file holds the latest partial run: it says so below
        covered = lambda saved: ({row["problem"] for row in saved["rows"]} <= set(args.problems or names)
                                 and set(saved["methods"]) <= set(args.methods))
        check_not_full(parser, "--out", out, covered, default, run="a partial run",
                       holds="cells this run does not race (a fuller report)")
    cache = args.run_cache or (None if args.quick else CELLS)
    check_folder(parser, "--run-cache", cache)
    if args.fresh and cache is None:
        parser.error("argument --fresh: a --quick run saves no cells to replace (give --run-cache DIR)")
    if args.problems:
        problems = [p for p in problems if p.name in args.problems]
    if args.lr_grid:
        for item in problems:
            item.lr_grid = sorted(set(args.lr_grid))      # a rate given twice is raced once
    torch.set_num_threads(1)  # tiny problems: threads only add overhead
    if partial and not args.out:
        print(f"a partial run (not every problem or default method): it writes {out}, not queries.json (the full "
              "report)", flush=True)
    started = time.perf_counter()
    try:
        resume = {} if cache is None else {"cache": cache, "refresh": args.fresh}
        results = run_queries_benchmark(problems, seeds, targets, args.batch_size, methods=args.methods, **resume)
    except KeyboardInterrupt:       # the report is written at the end: say so, not a traceback
        print(f"\ninterrupted after {time.perf_counter() - started:.0f} s: {out} was not written (the report is "
              "written when every problem and method has run); " + (
                  f"the finished cells are saved in {cache}: the same command resumes there" if cache is not None
                  else "rerun the same command"), file=sys.stderr, flush=True)
        raise SystemExit(130) from None
    info = machine()
    results.update(quick=args.quick, seconds=round(time.perf_counter() - started, 1),
                   torch=info["torch"], python=info["python"], date=info["date"], machine=info)
    results["table"] = format_table(results)
    print(f"Queries (2·B per step, B={args.batch_size}) to reach each target × the initial training-loss gap; "
          f"median [min–max] over {len(seeds)} seeds, best lr per method and target ({measured_line(info)})")
    print(results["table"])
    print(f"({results['seconds']} s)")
    out.parent.mkdir(parents=True, exist_ok=True)
    write_text(out, json.dumps(results, indent=2, ensure_ascii=False))
    print(f"wrote {out}")
    return results


if __name__ == "__main__":
    main()

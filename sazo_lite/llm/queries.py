"""Queries to a target training loss on a language model: uniform MeZO, SAZO and the oracle.

One ``query_run`` = one ZO run with one sampler from given weights, measured as the SAZO
paper measures it: the full training loss F(θ) every ``log_every`` steps against queries
(2·B per step), held-out accuracy once the run has spent ``accuracy_at`` queries, and, when
asked, how close SAZO's sampling is to the oracle (true norms by backprop at log points):
Spearman ρ(SAZO's scores, ‖∇f_i‖), TV(p_SAZO, p*), V(p_SAZO)/V(p*) and V(u)/V(p*). Every run also
records the size of its steps: ĝ = mean_k w_k·δ_k (MeZO moves θ by −lr·ĝ·z), its mean square and
maximum, and the largest importance weight drawn.

Samplers: "uniform" (``UniformSampler``), "sazo" (``SAZOSampler``, default settings but λ),
"oracle" (``OracleSampler`` with ``RefreshingNorms``: true norms recomputed every
``oracle_every`` steps). A run that produces a non-finite loss or whose F(θ) climbs above
``diverge_factor``·F(θ₀) stops and is marked ``diverged``.

    run = query_run(model, params, train_batch, "sazo", lr=1e-3, eps=1e-2, steps=300)
    queries_to(run, 0.5)        # queries until F(θ) ≤ 0.5·F(θ₀), or None
"""
from __future__ import annotations

from dataclasses import asdict, dataclass, field

import torch

from ..engine import MeZO
from ..samplers import make_sampler
from ..variance import oracle_probs, spearman, tv_distance, variance_ratio
from ..validation import check_choice
from .finetune import mean_loss
from .grad_norms import RefreshingNorms, grad_norms
from .losses import TokenBatch, accuracy, batched_closure

__all__ = ["QueryRun", "query_run", "queries_to", "SAMPLERS", "DIVERGE_FACTOR", "sampling_diagnostics"]

SAMPLERS = ("uniform", "sazo", "oracle")
DIVERGE_FACTOR = 1.5     # a run whose F(θ) climbs above this × F(θ₀) is reported as diverged


@dataclass
class QueryRun:
    """One run's record (lists per log point, starting at 0 queries)."""

    sampler: str
    lr: float
    seed: int
    queries: list[int] = field(default_factory=list)
    train_loss: list[float] = field(default_factory=list)
    test_accuracy: float | None = None      # at ``accuracy_at`` queries
    diverged: bool = False
    diagnostics: list[dict] = field(default_factory=list)   # per diagnosed log point
    oracle_refreshes: int = 0
    final_scores: list[float] | None = None   # SAZO's scores at the end (for scatter plots)
    final_norms: list[float] | None = None    # true norms at the end (when diagnosed)
    # the size of the steps the sampler produced: the update is −lr·ĝz with ĝ = mean_k w_k δ_k
    mean_sq_step_scale: float | None = None     # mean over steps of ĝ² (what importance sampling lowers)
    max_step_scale: float | None = None         # largest |ĝ| of the run
    max_weight: float | None = None             # largest importance weight w_k drawn
    steps_run: int = 0                          # MeZO steps taken (F is logged only until the target)

    def to_dict(self) -> dict:
        return asdict(self)


def queries_to(run: QueryRun | dict, fraction: float) -> int | None:
    """First logged query count with F(θ) ≤ fraction·F(θ₀) (None if never, or diverged first).

    ``run`` is a ``QueryRun`` or its ``to_dict()`` (as benchmark reports store it).
    """
    queries, losses = (run["queries"], run["train_loss"]) if isinstance(run, dict) else (run.queries, run.train_loss)
    target = fraction * losses[0]
    return next((q for q, loss in zip(queries, losses) if loss <= target), None)


def sampling_diagnostics(norms: torch.Tensor, probs: torch.Tensor, scores: torch.Tensor | None = None) -> dict:
    """ρ(scores, norms), TV(p, p*), V(p)/V(p*), V(u)/V(p*) for one moment of training."""
    n = len(norms)
    out = {"tv": tv_distance(probs, oracle_probs(norms)), "v_ratio": variance_ratio(norms, probs),
           "v_uniform_ratio": variance_ratio(norms, torch.full((n,), 1.0 / n, dtype=torch.float64))}
    if scores is not None:
        out["rho"] = spearman(scores, norms)
    return out


def query_run(model, params, train_batch: TokenBatch, sampler: str, *, lr: float, eps: float = 1e-2,
              batch_size: int = 1, steps: int = 300, seed: int = 0, log_every: int = 10,
              oracle_every: int = 10, uniform_mix: float = 0.1, oracle_mix: float = 0.0, test_batch: TokenBatch | None = None,
              accuracy_at: int | None = None, stop_fraction: float | None = None, diagnose: int = 0,
              diverge_factor: float = DIVERGE_FACTOR, loss: str = "classification", perturbation: str = "gaussian",
              progress: bool = False) -> QueryRun:
    """One ZO run from the current weights (the caller restores θ₀ between runs).

    Args:
        model, params: the LM and the tuned tensors (LoRA adapters or all parameters).
        train_batch: the training examples (``TokenBatch``).
        sampler: "uniform", "sazo" or "oracle".
        lr, eps, batch_size, steps, seed: the MeZO settings (seed also seeds the sampler).
        log_every: steps between evaluations of the full training loss F(θ).
        oracle_every: k, the steps between the oracle's backprop refreshes of the true norms.
        uniform_mix: SAZO's λ.
        oracle_mix: the oracle's λ (0: the exact p*, whose weights 1/(N p_i) are unbounded).
        test_batch, accuracy_at: held-out accuracy is measured at the first step with
            ≥ ``accuracy_at`` queries (or at the end).
        stop_fraction: once F(θ) ≤ stop_fraction·F(θ₀), F is no longer logged; the run stops
            there, or goes on to ``accuracy_at`` queries when the accuracy is still to be measured.
        diagnose: every ``diagnose``-th log point (0: never; True counts as 1), true norms by
            backprop and ``sampling_diagnostics`` of the sampler's p (SAZO: with its scores).
        diverge_factor: stop and mark ``diverged`` when F(θ) > diverge_factor·F(θ₀).
        loss: "classification" or "answer".
        perturbation: MeZO's z, "gaussian" or "rademacher" (cheaper to draw on a CPU).
    """
    from tqdm.auto import tqdm

    check_choice("sampler", sampler, SAMPLERS)
    n = len(train_batch)
    optimizer = MeZO(params, lr=lr, eps=eps, seed=seed, perturbation=perturbation)
    true_norms = lambda: grad_norms(model, train_batch, params, loss=loss)
    refreshing = None
    if sampler == "oracle":
        refreshing = RefreshingNorms(true_norms, every=oracle_every, clock=lambda: optimizer.step_count)
    chooser = make_sampler(sampler, n, uniform_mix=uniform_mix, norms_fn=refreshing, oracle_mix=oracle_mix, seed=seed)
    losses = batched_closure(model, train_batch, loss)
    run = QueryRun(sampler, float(lr), int(seed))

    def evaluate(queries: int) -> float:
        value = mean_loss(model, train_batch) if loss == "classification" else \
            float(losses(range(n)).mean())
        run.queries.append(queries)
        run.train_loss.append(value)
        if diagnose and (len(run.queries) - 1) % int(diagnose) == 0:
            norms = true_norms()
            scores = chooser.scores() if sampler == "sazo" else None
            probs = chooser.probs    # the oracle's: p* from its cached (up to k steps old) norms
            run.diagnostics.append({"queries": queries, **sampling_diagnostics(norms, probs, scores)})
            run.final_norms = norms.tolist()
            if scores is not None:
                run.final_scores = scores.tolist()
        return value

    start = evaluate(0)
    scales, top_weight, reached = [], 0.0, False
    bar = tqdm(range(1, steps + 1), desc=f"{sampler} lr={lr:g}", disable=not progress)
    for step in bar:
        indices, weights = chooser.sample(batch_size)
        try:
            result = optimizer.step(lambda: losses(indices), weights)
        except FloatingPointError:      # non-finite loss: MeZO restored θ; report and stop
            run.diverged = True
            break
        chooser.update(indices, result.directional_diffs)
        scale = float((weights.double() * result.directional_diffs.double()).mean())
        scales.append(scale)
        run.steps_run = step
        top_weight = max(top_weight, float(weights.max()))
        queries = step * 2 * batch_size
        if not reached and (step % log_every == 0 or step == steps):   # F(θ) is logged until the target
            value = evaluate(queries)
            if not value == value or value > diverge_factor * start:   # NaN or climbing
                run.diverged = True
                break
            reached = stop_fraction is not None and value <= stop_fraction * start
        if test_batch is not None and run.test_accuracy is None and accuracy_at is not None and queries >= accuracy_at:
            run.test_accuracy = accuracy(model, test_batch)
        if reached and (run.test_accuracy is not None or test_batch is None or accuracy_at is None):
            break
    bar.close()
    if test_batch is not None and run.test_accuracy is None and not run.diverged:
        run.test_accuracy = accuracy(model, test_batch)   # budget not reached: accuracy at the end
    run.oracle_refreshes = refreshing.refreshes if refreshing is not None else 0
    if scales:
        run.mean_sq_step_scale = sum(x * x for x in scales) / len(scales)
        run.max_step_scale = max(abs(x) for x in scales)
        run.max_weight = top_weight
    return run

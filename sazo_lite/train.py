"""The training loop where an optimiser and a sampler meet, through indices, weights and diffs.

    indices, weights = sampler.sample(B)
    result = optimizer.step(lambda: batch_losses(indices), weights)
    sampler.update(indices, result.directional_diffs)

Each step costs 2·B per-example queries (two forward passes over B examples).
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable

import torch

from .validation import check_bool, check_callable, check_count, check_int, check_number

__all__ = ["History", "train", "queries_to_target"]


@dataclass
class History:
    """What ``train`` recorded.

    Per step: ``queries`` (cumulative, 2·B per step), ``loss`` (the step's weighted
    minibatch loss) and ``projected_grad``. Every ``log_every`` steps (and after the last):
    ``logged_steps``, ``logged_queries``, ``metrics`` (the ``evaluate`` callback's value) and
    ``probs`` (a copy of the sampler's distribution, when ``record_probs``).
    """

    queries: list[int] = field(default_factory=list)
    loss: list[float] = field(default_factory=list)
    projected_grad: list[float] = field(default_factory=list)
    logged_steps: list[int] = field(default_factory=list)
    logged_queries: list[int] = field(default_factory=list)
    metrics: list[float] = field(default_factory=list)
    probs: list[torch.Tensor] = field(default_factory=list)


def train(optimizer, sampler, batch_losses: Callable[[torch.Tensor], torch.Tensor], steps: int, *,
          batch_size: int = 1, evaluate: Callable[[], float] | None = None, log_every: int = 10,
          record_probs: bool = False, progress: bool = True, stop_below: float | None = None,
          description: str = "ZO training") -> History:
    """Run ``steps`` ZO steps with any sampler.

    Args:
        optimizer: a ``MeZO`` (anything whose ``step(closure, weights)`` returns a ``ZOStep``).
        sampler: a ``Sampler``: ``sample(B)`` then ``update(indices, directional_diffs)``.
        batch_losses: maps indices [B] to per-example losses [B] at the current parameters.
        steps: number of steps.
        batch_size: B.
        evaluate: optional callback (e.g. full training loss), logged every ``log_every`` steps;
            a folded MeZO (``fold_updates=True``) is flushed first, so it sees the updated θ.
        log_every: logging interval in steps.
        record_probs: keep a copy of ``sampler.probs`` at each log point.
        progress: show a ``tqdm.auto`` progress bar.
        stop_below: stop early once ``evaluate()`` drops below this value.
        description: the progress bar's label.

    Returns:
        A ``History``.
    """
    from tqdm.auto import tqdm

    steps = check_int("steps", steps, 0)
    batch_size = check_count("batch_size", batch_size)
    log_every = check_count("log_every", log_every)
    if stop_below is not None:
        stop_below = check_number("stop_below", stop_below)
    check_bool("record_probs", record_probs)
    check_bool("progress", progress)
    check_callable("batch_losses", batch_losses)
    check_callable("evaluate", evaluate, optional=True)
    history = History()
    queries = 0
    bar = tqdm(range(steps), desc=description, disable=not progress)
    for step in bar:
        indices, weights = sampler.sample(batch_size)
        result = optimizer.step(lambda: batch_losses(indices), weights)
        if result.directional_diffs.numel():
            sampler.update(indices, result.directional_diffs)
        queries += 2 * batch_size
        history.queries.append(queries)
        history.loss.append(result.loss)
        history.projected_grad.append(result.projected_grad)
        if (step + 1) % log_every == 0 or step + 1 == steps:
            value = _log(history, optimizer, sampler, evaluate, step + 1, queries, record_probs)
            if value is not None:
                bar.set_postfix(metric=f"{value:.4g}", refresh=False)
                if stop_below is not None and value < stop_below:
                    break
    bar.close()
    flush = getattr(optimizer, "flush", None)
    if flush is not None:  # the parameters are current when train returns
        flush()
    return history


def _log(history: History, optimizer, sampler, evaluate, step: int, queries: int, record_probs: bool):
    flush = getattr(optimizer, "flush", None)
    if flush is not None:  # a folded MeZO: evaluate the updated parameters
        flush()
    history.logged_steps.append(step)
    history.logged_queries.append(queries)
    value = float(evaluate()) if evaluate is not None else None
    if value is not None:
        history.metrics.append(value)
    if record_probs:
        history.probs.append(sampler.probs.clone())
    return value


def queries_to_target(history: History, target: float) -> int | None:
    """First logged query count at which the evaluated metric is ≤ ``target`` (None if never)."""
    for queries, value in zip(history.logged_queries, history.metrics):
        if value <= target:
            return queries
    return None

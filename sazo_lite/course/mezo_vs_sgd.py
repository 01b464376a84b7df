"""MeZO against backprop SGD on one problem (notebook 02's race): queries and wall-clock time."""
from __future__ import annotations

import math
import time

import torch

from .config import one_thread
from ..engine import MeZO
from ..samplers import UniformSampler
from .sazo_runs import _check_problem, gap_limit, lesson_train
from ..train import diverged
from ..validation import check_count, check_number

__all__ = ["RACE_METHODS", "MEZO_DIVERGE_FACTOR", "race_mezo_sgd"]

# MeZO's run stops as diverged (``stopped``) only where its loss or gap stops being finite (``sazo_runs.gap_limit``
# at this factor); one past ``sazo_runs.DIVERGE_FACTOR`` × its start trains on, and the dashboard cuts its curve
# there (``first_divergence``). SGD's run has no such guard.
MEZO_DIVERGE_FACTOR = math.inf


def _timed_gap(problem, theta: torch.Tensor, clock: dict) -> float:
    """Optimality gap for the log; evaluation time is excluded from the training clock."""
    start = time.perf_counter()
    gap = problem.full_loss(theta) - clock["optimal"]
    clock["eval"] += time.perf_counter() - start
    clock["seconds"].append(start - clock["start"] - clock["eval_before"])
    clock["eval_before"] = clock["eval"]
    return gap


def _new_clock(problem) -> dict:
    return dict(optimal=problem.optimal_loss, start=time.perf_counter(), eval=0.0, eval_before=0.0, seconds=[])


def _run_mezo(problem, steps, batch_size, lr, eps, seed, log_every, dtype) -> dict:
    theta = problem.initial_theta(dtype)
    optimizer = MeZO([theta], lr=lr, eps=eps, seed=seed)
    sampler = UniformSampler(problem.num_examples, seed=seed)
    limit = gap_limit(float(problem.gap(theta)), MEZO_DIVERGE_FACTOR)   # the start's gap, before the clock starts
    clock = _new_clock(problem)
    history = lesson_train(optimizer, sampler, lambda idx: problem.losses(theta, idx), steps, batch_size=batch_size,
                    evaluate=lambda: _timed_gap(problem, theta, clock), log_every=log_every, progress=False,
                    diverge_above=limit)   # a diverged run stops (``stopped``), not raises
    stopped = None
    if history.diverged:   # at a log point (its gap) or at the step whose loss MeZO refused
        at_log = history.logged_steps and history.logged_steps[-1] == len(history.queries) \
            and diverged(history.metrics[-1], limit)
        stopped = history.logged_steps[-1] if at_log else len(history.queries) + 1
    return dict(queries=history.logged_queries, seconds=clock["seconds"], gap=history.metrics, stopped=stopped)


def _run_sgd(problem, steps, batch_size, lr, seed, log_every, dtype) -> dict:
    theta = problem.initial_theta(dtype).requires_grad_(True)
    sampler = UniformSampler(problem.num_examples, seed=seed)
    clock, queries, gaps = _new_clock(problem), [], []
    for step in range(1, steps + 1):
        indices, _ = sampler.sample(batch_size)
        loss = problem.losses(theta, indices).mean()
        (grad,) = torch.autograd.grad(loss, theta)
        with torch.no_grad():
            theta -= lr * grad
        if step % log_every == 0 or step == steps:
            queries.append(step * batch_size)  # one forward+backward per example
            gaps.append(_timed_gap(problem, theta.detach(), clock))
    return dict(queries=queries, seconds=clock["seconds"], gap=gaps)


RACE_METHODS = ("MeZO", "SGD (backprop)")


def race_mezo_sgd(problem, *, steps: int = 300, batch_size: int = 16, lr_zo: float = 0.02,
                  lr_sgd: float = 0.5, eps: float = 1e-3, seed: int = 0, log_every: int = 10,
                  dtype: torch.dtype = torch.float32, methods=RACE_METHODS) -> dict[str, dict[str, list]]:
    """Train ``problem`` from θ₀ with MeZO and with backprop SGD (same B, uniform minibatches).

    Queries: MeZO costs 2B per-example forward evaluations per step; SGD costs B per-example
    forward+backward evaluations (a backward pass costs about two forwards). ``seconds`` is
    training wall-clock time on one thread, excluding the logging evaluations.

    Args:
        methods: which of ``RACE_METHODS`` to run (default both).

    Returns:
        {"MeZO": {...}, "SGD (backprop)": {...}}, each with lists ``queries``, ``seconds``, ``gap``
        (F(θ) − F(θ*)) at every ``log_every`` steps. MeZO's also has ``stopped``: the step at which its loss
        or gap became non-finite and the run stopped (its lists end there), or None. SGD has no such guard:
        its gap may overflow to inf/NaN and stays so.
    """
    for name, value in (("steps", steps), ("batch_size", batch_size), ("log_every", log_every)):
        check_count(name, value)
    _check_problem(problem)
    # by the caller's names (MeZO would call lr_zo "lr"); SGD has no optimiser to check its rate: a negative one
    # climbed the loss and a NaN one gave NaN gaps without a word
    lr_zo, lr_sgd = check_number("lr_zo", lr_zo, 0.0), check_number("lr_sgd", lr_sgd, 0.0)
    eps = check_number("eps", eps, 0.0, closed_low=False)
    if not set(methods) <= set(RACE_METHODS):
        raise ValueError(f"Invalid methods: {methods!r} (expected a subset of {RACE_METHODS})")
    runs = {}
    with one_thread():  # fair, stable timings on a shared machine (see ``one_thread``)
        if "MeZO" in methods:
            runs["MeZO"] = _run_mezo(problem, steps, batch_size, lr_zo, eps, seed, log_every, dtype)
        if "SGD (backprop)" in methods:
            runs["SGD (backprop)"] = _run_sgd(problem, steps, batch_size, lr_sgd, seed, log_every, dtype)
    return runs

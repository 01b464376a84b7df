"""Benchmarks that print ratios measured in one run (not timed tests).

    python -m sazo_lite.bench queries            # full run (a few minutes on 2 CPU cores)
    python -m sazo_lite.bench queries --quick    # smoke run (seconds)

``queries``: per-example queries (2·B per MeZO step) until the training-loss gap
F(θ) − F(θ*) first drops below ``target`` × the initial gap, for uniform / SAZO / oracle
sampling. Each method gets its own learning rate: the grid value with the best median over
the seeds. All rates race under a growing step budget, so a bad rate costs no more than the
best one; the winning rate's seeds are always run to the end. Results go to
benchmarks/results/queries.json (``--quick``: queries_quick.json).
"""
from __future__ import annotations

import argparse
import json
import math
import platform
import statistics
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

import torch

from .engine import MeZO
from .experiments import make_sampler
from .problems import FiniteSumProblem, LeastSquares, LogisticRegression
from .train import queries_to_target, train
from .variance import uniform_gain

__all__ = ["BenchProblem", "TargetRun", "queries_to_reach", "best_learning_rate", "run_queries_benchmark", "main"]

RESULTS = Path("benchmarks") / "results"  # under the repository root (or the working directory)
METHODS = ("uniform", "sazo", "oracle")


@dataclass
class BenchProblem:
    """One row of the table: a problem, its learning-rate grid, a step budget, the --quick grid."""

    name: str
    problem: FiniteSumProblem
    lr_grid: list[float]
    max_steps: int
    quick_grid: list[float]


class _Diverged(Exception):
    """Raised from the evaluate callback to abandon a run whose gap exploded."""


class TargetRun:
    """One MeZO run (float64 θ) that can be extended step budget by step budget.

    Extending to s steps in pieces gives the same trajectory as one run of s steps: the
    optimiser and sampler keep their state, and logging happens every ``log_every`` steps.
    ``queries`` is set once the gap is ≤ target·gap₀; ``failed`` once the run diverged.
    """

    def __init__(self, problem: FiniteSumProblem, method: str, lr: float, seed: int, target: float, *,
                 batch_size: int = 1, eps: float = 1e-3, log_every: int = 10):
        self.problem, self.batch_size, self.log_every = problem, batch_size, log_every
        self.theta = problem.initial_theta(torch.float64)
        self.optimal = problem.optimal_loss
        self.initial_gap = problem.full_loss(self.theta) - self.optimal
        self.target_gap = target * self.initial_gap
        self.optimizer = MeZO([self.theta], lr=lr, eps=eps, seed=seed)
        self.sampler = make_sampler(method, problem, self.theta, seed=seed)
        self.steps, self.queries, self.failed = 0, None, False

    @property
    def done(self) -> bool:
        return self.failed or self.queries is not None

    def _gap(self) -> float:
        value = self.problem.full_loss(self.theta) - self.optimal
        if not math.isfinite(value) or value > 1e4 * self.initial_gap:
            raise _Diverged
        return value

    def extend_to(self, steps: int) -> "TargetRun":
        """Run on until ``steps`` steps in all, the target, or divergence."""
        more = -(-(steps - self.steps) // self.log_every) * self.log_every  # keep the log grid
        if self.done or more <= 0:
            return self
        try:
            history = train(self.optimizer, self.sampler, lambda idx: self.problem.losses(self.theta, idx),
                            more, batch_size=self.batch_size, evaluate=self._gap, log_every=self.log_every,
                            progress=False, stop_below=self.target_gap)
        except (_Diverged, FloatingPointError):
            self.failed = True
            return self
        reached = queries_to_target(history, self.target_gap)
        if reached is not None:
            self.queries = reached + 2 * self.batch_size * self.steps
        self.steps += len(history.queries)
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


def _median(values: list) -> float:
    return statistics.median(math.inf if v is None else v for v in values)


def best_learning_rate(make_run: Callable[[float, int], TargetRun], grid: list[float], seeds: list[int],
                       max_steps: int, first_budget: int = 500, growth: float = 1.25) -> dict:
    """Pick the grid rate with the best median queries over ``seeds``, at bounded cost.

    Every rate's runs are extended together under a step budget that grows by ``growth``
    until some rate's median is reached: the rates still open then cannot beat it, so a bad
    rate costs at most about as much as the best one (diverged rates cost nothing more). The winner's seeds are run to the end
    (up to ``max_steps``) for the min–max spread.

    Returns:
        dict with ``lr``, ``median``, ``min``, ``max`` (None if a seed never got there),
        ``per_seed`` and ``grid`` (median per rate; None where it cannot beat the winner).
    """
    runs = {lr: [make_run(lr, seed) for seed in seeds] for lr in grid}
    budget = min(first_budget, max_steps)
    while True:
        for lr_runs in runs.values():
            if sum(run.failed for run in lr_runs) <= len(lr_runs) // 2:  # else its median is lost
                for run in lr_runs:
                    run.extend_to(budget)
        medians = {lr: _median([run.queries for run in lr_runs]) for lr, lr_runs in runs.items()}
        # A rate whose median is still open has median > 2·B·budget ≥ any reached median.
        if min(medians.values()) < math.inf or budget >= max_steps:
            break
        budget = min(int(growth * budget), max_steps)  # small growth: little overshoot
    grid_medians = {repr(lr): (None if math.isinf(m) else m) for lr, m in medians.items()}
    best_lr = min(grid, key=lambda lr: medians[lr])
    if math.isinf(medians[best_lr]):
        return {"lr": None, "median": None, "min": None, "max": None,
                "per_seed": [None] * len(seeds), "grid": grid_medians}
    per_seed = [run.extend_to(max_steps).queries for run in runs[best_lr]]
    finite = [q for q in per_seed if q is not None]
    return {"lr": best_lr, "median": medians[best_lr], "min": min(finite),
            "max": max(finite) if len(finite) == len(per_seed) else None,
            "per_seed": per_seed, "grid": grid_medians}


def default_problems(quick: bool = False) -> list[BenchProblem]:
    """The three benchmark problems (fixed data seed 0), with rate grids and step budgets."""
    ls_grid = [0.0005, 0.00075, 0.00113, 0.0017, 0.0025, 0.0038, 0.0057]
    lr_grid = [0.003, 0.006, 0.012, 0.024, 0.048]
    ls_quick, lr_quick = [0.0017, 0.0025], [0.006, 0.012]
    problems = [
        BenchProblem("quadratic σ=0", LeastSquares(256, 20, heterogeneity=0.0, seed=0), ls_grid, 12_000, ls_quick),
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


def run_queries_benchmark(problems: list[BenchProblem], seeds: list[int], target: float,
                          batch_size: int = 1, progress: bool = True) -> dict:
    """Run every method on every problem; returns the JSON-ready results."""
    from tqdm.auto import tqdm

    rows = []
    bar = tqdm(total=len(problems) * len(METHODS), desc="queries benchmark", disable=not progress)
    for item in problems:
        row = {"problem": item.name, "num_examples": item.problem.num_examples, "dim": item.problem.dim,
               "gain_at_optimum": uniform_gain(item.problem.norms(item.problem.optimum)),
               "max_steps": item.max_steps}
        for method in METHODS:
            started = time.perf_counter()
            make_run = lambda lr, seed: TargetRun(item.problem, method, lr, seed, target, batch_size=batch_size)
            row[method] = best_learning_rate(make_run, item.lr_grid, seeds, item.max_steps)
            row[method]["seconds"] = round(time.perf_counter() - started, 2)
            bar.update(1)
        for method in ("sazo", "oracle"):
            row[f"uniform/{method}"] = _ratio(row["uniform"]["median"], row[method]["median"])
        rows.append(row)
    bar.close()
    return {"benchmark": "queries", "target_fraction_of_initial_gap": target, "seeds": seeds,
            "batch_size": batch_size, "rows": rows}


def _ratio(a, b):
    if a is None or b is None or math.isinf(a) or math.isinf(b):
        return None
    return a / b


def _cell(result: dict) -> str:
    if result["median"] is None or math.isinf(result["median"]):
        return "not reached"
    top = "?" if result["max"] is None else f"{result['max']:.0f}"
    return f"{result['median']:.0f} [{result['min']:.0f}–{top}] lr={result['lr']:g}"


def format_table(results: dict) -> str:
    """A markdown table: median queries [min–max] (chosen lr) and the two ratios."""
    head = ("| problem | V(u)/V(p*) at θ* | uniform | SAZO | oracle | uniform/SAZO | uniform/oracle |\n"
            "|---|---|---|---|---|---|---|")
    lines = [head]
    for row in results["rows"]:
        ratios = [("–" if row[k] is None else f"{row[k]:.2f}×") for k in ("uniform/sazo", "uniform/oracle")]
        lines.append(f"| {row['problem']} | {row['gain_at_optimum']:.2f} | " +
                     " | ".join(_cell(row[m]) for m in METHODS) + f" | {ratios[0]} | {ratios[1]} |")
    return "\n".join(lines)


def _queries_command(args) -> None:
    torch.set_num_threads(1)  # tiny problems: threads only add overhead
    seeds = list(range(args.seeds))
    started = time.perf_counter()
    results = run_queries_benchmark(default_problems(args.quick), seeds, args.target, args.batch_size)
    results.update(quick=args.quick, seconds=round(time.perf_counter() - started, 1),
                   torch=torch.__version__, python=platform.python_version())
    print(f"Queries (2·B per step, B={args.batch_size}) to reach {args.target:g} × the initial "
          f"training-loss gap; median [min–max] over {len(seeds)} seeds, best lr per method")
    print(format_table(results))
    print(f"({results['seconds']} s)")
    out = Path(args.out) if args.out else _results_dir() / ("queries_quick.json" if args.quick else "queries.json")
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(results, indent=2, ensure_ascii=False))
    print(f"wrote {out}")


def _results_dir() -> Path:
    root = Path(__file__).resolve().parents[1]  # the checkout, for an editable install
    return (root if (root / "pyproject.toml").exists() else Path.cwd()) / RESULTS


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m sazo_lite.bench", description=__doc__.split("\n")[0])
    commands = parser.add_subparsers(dest="command", required=True)
    queries = commands.add_parser("queries", help="queries to a target loss gap: uniform / SAZO / oracle")
    queries.add_argument("--quick", action="store_true", help="smoke run: 1 seed, 2 rates, loose target")
    queries.add_argument("--seeds", type=int, default=None, help="number of seeds (default 3; quick: 1)")
    queries.add_argument("--target", type=float, default=None,
                         help="target gap as a fraction of the initial gap (default 0.02; quick: 0.1)")
    queries.add_argument("--batch-size", type=int, default=1)
    queries.add_argument("--out", default=None, help="JSON path (default benchmarks/results/queries.json)")
    args = parser.parse_args(argv)
    if args.command == "queries":
        args.seeds = (1 if args.quick else 3) if args.seeds is None else args.seeds
        args.target = (0.1 if args.quick else 0.02) if args.target is None else args.target
        for name, value, ok in (("seeds", args.seeds, args.seeds >= 1), ("batch-size", args.batch_size,
                                args.batch_size >= 1), ("target", args.target, 0 < args.target < 1)):
            if not ok:
                parser.error(f"invalid --{name}: {value}")
        _queries_command(args)


if __name__ == "__main__":
    main()

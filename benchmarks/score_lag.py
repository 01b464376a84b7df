"""Why SAZO's scores lag: decompose V(p_SAZO)/V(p*) along a SAZO run on a toy problem.

Along one SAZO run (B = 4, the library's SAZOSampler), every ``log_every`` steps, three score vectors
are turned into probabilities by the same transform (``samplers.probabilities``, same uniform mix):

* ``sazo``  — SAZO's own scores (noise + staleness + the rule's shrinkage),
* ``stale`` — each example's *true* norm at the step it was last drawn (staleness only, no noise),
* ``fresh`` — the true norms now, mixed like SAZO (the mix only).

V(p)/V(p*) of each isolates one cause: stale/fresh is the lag in steps, sazo/stale the estimate's noise.
SAZO's excess V(p)/V(p*) − 1 is also split between the examples drawn within the last 2·N/B steps
(``recent``) and the others (``old``): where it sits says whether rarely drawn examples' stale scores or
the motion of every example's norm within a visit interval costs. The problem is a course problem
(``sazo_runs.PROBLEMS``) or one of ``make bench``'s (``benchmarks.queries``, e.g. "quadratic σ=1.5").

``--race`` instead races samplers that each remove one of SAZO's handicaps, in queries to the targets
(B = 1, each at its best rate of a small grid, median over seeds, ``benchmarks.queries``' protocol):
the oracle; the oracle mixed with uniform like SAZO (λ = 0.1: weights ≤ 10, the cap on the rate);
``informed-fresh`` (true current norms of the examples seen so far, the RMS prior for the unseen: the
unseen phase only); SAZO (adds the noise and lag of its estimates); and any other method of
``benchmarks.queries.METHODS`` named (e.g. ``sazo-stale-corrected``). Measured tables: docs/llm.md.

    python -m benchmarks.score_lag [--steps 3000] [--seeds 0 1 2]
    python -m benchmarks.score_lag --race --problem "quadratic σ=1.5" --seeds 0 1 2 3 4
"""
from __future__ import annotations

import argparse

import numpy as np
import torch

from sazo_lite.course.sazo_runs import PROBLEMS, make_problem
from sazo_lite.engine import MeZO
from sazo_lite.samplers import SAZOSampler, probabilities


def v_ratio(p: np.ndarray, norms: np.ndarray) -> float:
    """V(p)/V(p*) = N·Σ a²/p / (Σ a)² (the sampler's second-moment term over the oracle's)."""
    n = len(norms)
    return float((norms ** 2 / p).sum() / n / (norms.sum() ** 2 / n))


def excess_by_age(p: np.ndarray, norms: np.ndarray, recent: np.ndarray) -> tuple[float, float]:
    """(old, recent): V(p)/V(p*) − 1 split between the examples not in ``recent`` (bool [N]) and those in it.

    Example i adds a_i²/(p_i·(Σa)²) to V(p)/V(p*) against p*_i = a_i/Σa for the oracle, so each side's share
    is Σ over it of that difference; the two add up to V(p)/V(p*) − 1.

    Example:
        >>> old, new = excess_by_age(np.array([0.5, 0.5]), np.array([1.0, 3.0]), np.array([True, False]))
        >>> round(old, 3), round(new, 3), round(old + new + 1, 3) == round(v_ratio(np.array([0.5, 0.5]), np.array([1.0, 3.0])), 3)
        (0.375, -0.125, True)
    """
    share = norms ** 2 / p / norms.sum() ** 2 - norms / norms.sum()
    return float(share[~recent].sum()), float(share[recent].sum())


def _bench(name: str):
    """``make bench``'s problem of that name (``benchmarks.queries.BenchProblem``), or None."""
    from benchmarks.queries import default_problems

    return {p.name: p for p in default_problems()}.get(name)


def _problem(name: str):
    """A course problem by name, or one of ``make bench``'s (the same data as its race)."""
    bench = _bench(name)
    return bench.problem if bench is not None else make_problem(name)


def run(problem_name: str, *, steps: int, lr: float, seed: int, batch_size: int = 4, log_every: int = 100):
    problem = _problem(problem_name)
    theta = problem.initial_theta(torch.float64)
    n = problem.num_examples
    sampler = SAZOSampler(n, seed=seed)
    opt = MeZO([theta], lr=lr, eps=1e-3, seed=seed)
    last_true, last_step = np.full(n, np.nan), np.full(n, -np.inf)
    rows = []
    for step in range(1, steps + 1):
        idx, w = sampler.sample(batch_size)
        norms_now = problem.norms(theta).double().numpy()
        last_true[idx.numpy()] = norms_now[idx.numpy()]
        last_step[idx.numpy()] = step

        out = opt.step(lambda: problem.losses(theta, idx), w)
        sampler.update(idx, out.directional_diffs)
        if step % log_every == 0:
            a = problem.norms(theta).double().numpy()
            mix = sampler.uniform_mix
            stale = np.where(np.isnan(last_true), np.nanmean(last_true), last_true)
            p = sampler.probs.double().numpy()
            old, recent = excess_by_age(p, a, step - last_step < 2 * n / batch_size)
            rows.append(dict(step=step, gap=float(problem.gap(theta)), old=old, recent=recent,
                             sazo=v_ratio(p, a),
                             stale=v_ratio(probabilities(stale, stale.sum(), mix, n), a),
                             fresh=v_ratio(probabilities(a, a.sum(), mix, n), a)))
    return rows


RACE_METHODS = ("oracle", "oracle-mix-0.1", "informed-fresh", "sazo")


def race(problem_name: str, methods, grid, seeds, targets=(0.02, 0.005), max_steps=None) -> dict:
    """Median queries [per seed] at each method's best rate of ``grid`` (``benchmarks.queries``)."""
    from benchmarks.queries import TargetRun, best_learning_rate

    item = _bench(problem_name)
    if item is None:
        raise ValueError(f"Invalid problem: {problem_name!r} (the race runs make bench's problems)")
    steps = max_steps or item.max_steps
    out = {}
    for method in methods:
        make_run = lambda lr, seed: TargetRun(item.problem, method, lr, seed, tuple(targets))
        out[method] = best_learning_rate(make_run, list(grid), list(seeds), steps, targets=tuple(targets))
        for t, r in out[method].items():
            bound = f" (> {r['floor']:g})" if r.get("floor") else ""      # the queries its runs made: a lower bound
            median = f"not reached{bound}" if r["median"] is None else f"{r['median']:g} lr {r['lr']:g}"
            print(f"{problem_name} | {method} | target {t:g} | median {median} "
                  f"per seed {['not reached' if q is None else q for q in r['per_seed']]} grid {r['grid']}", flush=True)
    return out


RACE_PROBLEM, TRACE_PROBLEM = "quadratic σ=1.5", "heterogeneous quadratic"


def main(argv=None):
    from benchmarks.cli import count, fraction, machine, measured_line, multiple_of, natural, positive, refuse_unused
    from benchmarks.queries import LOG_EVERY, METHODS, default_problems

    bench_names = [p.name for p in default_problems()]
    ap = argparse.ArgumentParser(prog="python -m benchmarks.score_lag", description=__doc__.splitlines()[0])
    ap.add_argument("--race", action="store_true", help="race the handicap-removing samplers in queries")
    ap.add_argument("--methods", nargs="+", default=list(RACE_METHODS), choices=list(METHODS), metavar="METHOD",
                    help=f"--race: the samplers (benchmarks.queries.METHODS; default {' '.join(RACE_METHODS)})")
    ap.add_argument("--grid", type=positive, nargs="+", default=[0.0017, 0.0025, 0.0038, 0.0057],
                    help="--race: the learning-rate grid")
    ap.add_argument("--targets", type=fraction, nargs="+", default=[0.02, 0.005],
                    help="--race: targets as fractions of the initial gap")
    ap.add_argument("--max-steps", type=multiple_of(LOG_EVERY), default=None,
                    help=f"--race: step budget, a multiple of {LOG_EVERY} (default: the problem's)")
    ap.add_argument("--problem", default=None,
                    help=f"one of make bench's problems {bench_names} or, without --race, a course problem {list(PROBLEMS)} "
                         f"(default: {TRACE_PROBLEM!r}; --race: {RACE_PROBLEM!r})")
    # the decomposition's sizes default to None, filled in below: --race refuses them even at these values
    decomposition = {"steps": 3000, "lr": 0.01, "batch_size": 4, "log_every": 100}
    ap.add_argument("--steps", type=count, default=None, help="the decomposition's SAZO run: steps (default 3000)")
    ap.add_argument("--lr", type=positive, default=None, help="the decomposition's SAZO run: learning rate (default 0.01)")
    ap.add_argument("--seeds", type=natural, nargs="+", default=[0, 1, 2], help="the seeds (default 0 1 2), each run in turn")
    ap.add_argument("--batch-size", type=count, default=None, help="the decomposition's SAZO run: B (default 4)")
    ap.add_argument("--log-every", type=count, default=None, help="the decomposition: a row every n steps (default 100)")
    args = ap.parse_args(argv)
    if args.race:      # the race runs TargetRun's B = 1 and its own budgets: the decomposition's sizes are not its
        refuse_unused(ap, args, tuple(decomposition), "to --race (the decomposition's run only)")
    else:
        refuse_unused(ap, args, ("methods", "grid", "targets", "max_steps"), "without --race")
        for name, value in decomposition.items():
            setattr(args, name, value if getattr(args, name) is None else getattr(args, name))
    # a seed or rate given twice would count twice in a median: each is run once
    args.seeds, args.grid = list(dict.fromkeys(args.seeds)), sorted(set(args.grid))
    args.methods, args.targets = list(dict.fromkeys(args.methods)), list(dict.fromkeys(args.targets))   # raced once
    if args.problem is None:
        args.problem = RACE_PROBLEM if args.race else TRACE_PROBLEM
    allowed = bench_names if args.race else [*bench_names, *PROBLEMS]
    if args.problem not in allowed:
        ap.error(f"argument --problem: invalid choice {args.problem!r}{' with --race' if args.race else ''} "
                 f"(choose from {allowed})")
    if not args.race and args.log_every > args.steps:
        ap.error(f"argument --log-every: {args.log_every} > --steps {args.steps}: no row would be printed")
    torch.set_num_threads(1)
    print(f"score_lag{' --race' if args.race else ''} on {args.problem}, {measured_line(machine())}", flush=True)
    if args.race:
        race(args.problem, args.methods, args.grid, args.seeds, args.targets, args.max_steps)
        return
    for seed in args.seeds:
        for r in run(args.problem, steps=args.steps, lr=args.lr, seed=seed, batch_size=args.batch_size,
                     log_every=args.log_every):
            print(f"seed {seed} step {r['step']:5d} gap {r['gap']:.3e}  V/V*: sazo {r['sazo']:.3f} "
                  f"stale {r['stale']:.3f} fresh(mix) {r['fresh']:.3f}  sazo's excess: drawn within 2N/B steps "
                  f"{r['recent']:+.3f}, earlier {r['old']:+.3f}", flush=True)


if __name__ == "__main__":
    main()

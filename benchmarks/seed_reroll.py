"""What a new index stream does to SAZO's queries: the same rule, the same p, other draws per seed.

    python -m benchmarks.seed_reroll                 # 60 seeds per stream on the σ = 1.5 quadratic
    python -m benchmarks.seed_reroll --seeds 10      # a quick look

Issue 28's item 8: SAZO's queries on fixed seeds moved (a hidden toy problem: uniform ÷ SAZO 3.01× →
2.52×) after the score store was rewritten (28b823e). That commit kept the rule (the probabilities
given the same feedback agree to float32 rounding, ``tests/test_sampler_regression.py``) and changed
how an index is drawn from p: one inverse-CDF uniform per index before, a draw from the mixture
uniform / seen ∝ score / unseen after. Same distribution, other indices for a given seed: every seed
is re-rolled. This benchmark races the two streams (``InverseCdfSAZO`` below is the old draw, written
again on top of today's sampler) on the same seeds and prints how far apart they are: the mean
difference of log queries with a 95% interval, and how often two re-rolls of 5 seeds give medians at
least 19% apart (the size of the hidden check's move).
"""
from __future__ import annotations

import argparse
import math

import numpy as np
import torch

from sazo_lite.course.problems import LeastSquares
from sazo_lite.samplers import SAZOSampler
from sazo_lite.train import median_queries
from sazo_lite.validation import check_count
from sazo_lite.variance import importance_weights

from .cli import count, fraction, machine, measured_line, multiple_of, positive
from .queries import LOG_EVERY, queries_to_reach


def at_least_two(text: str) -> int:
    value = count(text)
    if value < 2:
        raise argparse.ArgumentTypeError(f"invalid value: {text!r} (expected ≥ 2 seeds: an interval needs two)")
    return value

__all__ = ["InverseCdfSAZO", "reroll_shift", "main"]


class InverseCdfSAZO(SAZOSampler):
    """SAZO with the index stream of the samplers before the store rewrite: u ~ U(0, 1) per index,
    i = the first index whose CDF of p exceeds u (``sum_tree=False`` only). Same p, same weights.

    Example:
        >>> s = InverseCdfSAZO(4, seed=0)
        >>> s.update(torch.tensor([1]), torch.tensor([3.0]))
        >>> i, w = s.sample(3)
        >>> bool(torch.allclose(w, 1 / (4 * s.probs[i])))
        True
    """

    def sample(self, batch_size: int) -> tuple[torch.Tensor, torch.Tensor]:
        check_count("batch_size", batch_size)
        p = self.probs.numpy()
        cdf = np.cumsum(p)
        u = torch.rand(batch_size, generator=self._generator, dtype=torch.float64).numpy()
        indices = np.minimum(np.searchsorted(cdf, u * cdf[-1], side="right"), self.num_examples - 1)
        return torch.from_numpy(indices), torch.from_numpy(importance_weights(p[indices], self.num_examples))


def reroll_shift(first: list[float], second: list[float], *, subset: int = 5, shift: float = 1.19,
                 draws: int = 20_000, seed: int = 0) -> dict:
    """Two streams' queries on the same seeds (None: never reached): how far apart they are.

    ``mean_log_ratio`` (second over first, with ``half_width`` of its 95% interval) over the runs both
    finished; ``p_shift``: the chance that the medians of two independent ``subset``-seed draws from the
    pooled runs differ by a factor ≥ ``shift`` one way (what a re-roll alone does to a small check).

    Example:
        >>> out = reroll_shift([100, 200, 400, 800], [110, 190, 420, 760], draws=2000)
        >>> abs(out["mean_log_ratio"]) < 0.1, 0 < out["p_shift"] < 0.5
        (True, True)
    """
    both = [(x, y) for x, y in zip(first, second, strict=True) if x and y]     # the seeds both streams finished
    a, b = np.log(np.array(both, dtype=float).reshape(-1, 2)).T      # fewer than 2: no interval (nan)
    # a miss counts as never (∞), as in every median of the benchmarks: a re-roll that misses is a shift
    pool = np.log(np.array([q if q else math.inf for q in (*first, *second)], dtype=float))
    rng = np.random.default_rng(seed)
    x = np.median(rng.choice(pool, (draws, subset)), axis=1)
    y = np.median(rng.choice(pool, (draws, subset)), axis=1)
    with np.errstate(invalid="ignore"):      # ∞ − ∞ (both medians never reached): no shift
        shifted = np.nan_to_num(y - x, nan=0.0) >= math.log(shift)
    two = len(both) >= 2
    return {"mean_log_ratio": float(b.mean() - a.mean()) if both else math.nan,
            "half_width": float(1.96 * math.sqrt(a.var(ddof=1) / len(a) + b.var(ddof=1) / len(b))) if two else math.nan,
            "p_shift": float(np.mean(shifted)), "both_finished": len(both),
            "missed": (sum(q is None for q in first), sum(q is None for q in second))}


def main(argv: list[str] | None = None) -> dict:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.seed_reroll", description=__doc__.split("\n")[0])
    parser.add_argument("--seeds", type=at_least_two, default=60, help="seeds per stream (default 60; ≥ 2)")
    parser.add_argument("--lr", type=positive, default=0.0025, help="SAZO's chosen rate at 2%% in make bench")
    parser.add_argument("--target", type=fraction, default=0.02, help="fraction of the initial gap (default 0.02)")
    parser.add_argument("--max-steps", type=multiple_of(LOG_EVERY), default=30_000,
                        help=f"step budget of a run, a multiple of {LOG_EVERY} (default 30000)")
    args = parser.parse_args(argv)
    print(f"seed_reroll, {measured_line(machine())}", flush=True)
    problem = LeastSquares(256, 20, heterogeneity=1.5, seed=0)
    streams = {"inverse CDF (before 28b823e)": InverseCdfSAZO, "mixture (now)": SAZOSampler}
    queries = {}
    for name, cls in streams.items():
        factory = lambda p, theta, seed, cls=cls: cls(p.num_examples, seed=seed, sum_tree=False)
        queries[name] = [queries_to_reach(problem, factory, args.lr, seed, args.target, args.max_steps)
                         for seed in range(args.seeds)]
        print(f"{name:30s} median queries to {args.target:g} of the gap: {median_queries(queries[name]):g} "
              f"(first {min(5, args.seeds)} seeds: {median_queries(queries[name][:5]):g})", flush=True)
    out = reroll_shift(*queries.values())
    if out["both_finished"] < 2:      # too few seeds reached the target in the budget for an interval
        raise SystemExit(f"seed_reroll: {out['both_finished']} seed(s) finished by both streams (an interval needs 2); "
                         "raise --max-steps or --target")
    print(f"mean log(queries now / before) = {out['mean_log_ratio']:+.3f} ± {out['half_width']:.3f} "
          f"({out['both_finished']} of {args.seeds} seeds finished by both; never reached: {out['missed']})")
    print(f"two re-rolls of 5 seeds give medians ≥ 1.19× apart (one way) with probability {out['p_shift']:.2f}")
    return {"queries": queries, **out}


if __name__ == "__main__":
    main()

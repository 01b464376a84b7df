"""Named long runs on a SmolLM2 set: (sampler, rate, seed) each, saved as each one ends.

    python -m benchmarks.llm_long_runs OUT_DIR uniform:3.5e-4:0 sazo:3.5e-4:0 [...] [--steps 750]

The grid protocol of ``benchmarks.llm_queries`` writes its report only when a whole unit ends; these
runs are for budgets too long for it (docs/llm.md, "The opposed set at B = 4, longer runs"). θ₀, ε and
the sampler settings are those of ``llm_queries``' opposed and balanced sets (``--sets opposed --big-n
96``: the same cached first round). Each run stops at ``--stop`` · F(θ₀) or after ``--steps`` steps,
logs F every ``--log-every`` steps, and SAZO's runs record its scores against the true norms every 4th
log point. One JSON per run in OUT_DIR (``QueryRun.to_dict()`` plus its wall time).
"""
from __future__ import annotations

import argparse
import math
import json
import time
from pathlib import Path

import torch

from sazo_lite.atomic import write_text
from benchmarks.cli import check_folder, count, fraction, natural, unit_fraction
from benchmarks import llm_queries
from sazo_lite.course.widgets.llm import run_summary
from sazo_lite.llm import restore_snapshot, snapshot
from sazo_lite.llm.queries import SAMPLERS


def parse_plan(specs: list[str]) -> list[tuple[str, float, int]]:
    """``["uniform:3.5e-4:0", ...]`` → [(sampler, rate, seed), ...]; a bad spec raises ValueError."""
    plan = []
    for spec in specs:
        parts = spec.split(":")
        if len(parts) != 3 or parts[0] not in SAMPLERS:
            raise ValueError(f"Invalid run: {spec!r} (expected sampler:rate:seed, sampler one of {SAMPLERS})")
        try:
            rate, seed = float(parts[1]), int(parts[2])
        except ValueError:
            raise ValueError(f"Invalid run: {spec!r} (expected sampler:rate:seed, a number and an integer)") from None
        if not (math.isfinite(rate) and rate > 0) or seed < 0:
            raise ValueError(f"Invalid run: {spec!r} (rate > 0, seed ≥ 0)")
        plan.append((parts[0], rate, seed))
    return plan


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.llm_long_runs", description=__doc__.splitlines()[0])
    parser.add_argument("out", type=Path, help="the folder a JSON per run is written to")
    parser.add_argument("runs", nargs="+", help=f"sampler:rate:seed (sampler one of {SAMPLERS})")
    parser.add_argument("--set", default="opposed", choices=sorted(llm_queries.BIG_SETS), help="the all-layer set (default opposed)")
    parser.add_argument("--n", type=count, default=96, help="N, the training examples (default 96)")
    parser.add_argument("--new-fraction", type=unit_fraction, default=0.125, help="the share of new examples (default 0.125)")
    parser.add_argument("--batch", type=count, default=4, help="B (default 4)")
    parser.add_argument("--steps", type=count, default=750, help="steps cap of a run (default 750)")
    parser.add_argument("--log-every", type=count, default=25, help="a log point every n steps (default 25)")
    parser.add_argument("--stop", type=fraction, default=0.5, help="stop at this fraction of F(θ₀)")
    parser.add_argument("--accuracy-at", type=count, default=None,
                        help="held-out accuracy after this many queries (a fixed budget; the run does not stop before it)")
    args = parser.parse_args(argv)
    try:
        plan = parse_plan(args.runs)
    except ValueError as error:
        parser.error(f"argument runs: {error}")
    check_folder(parser, "out", args.out)
    torch.set_num_threads(1)
    setup = llm_queries.parse_args(["--sets", args.set, "--big-n", str(args.n)])
    model, params, train, test, _ = llm_queries.smollm2_start(args.set, setup, num_train=args.n,
                                                              new_fraction=args.new_fraction)
    theta0 = snapshot(params)
    args.out.mkdir(parents=True, exist_ok=True)
    for sampler, rate, seed in plan:
        start = time.perf_counter()
        run = llm_queries.run_from(theta0, model, params, train, test, sampler, lr=rate, seed=seed, eps=setup.eps,
                                   batch_size=args.batch, steps=args.steps, log_every=args.log_every, oracle_every=1,
                                   oracle_mix=setup.oracle_mix, stop_fraction=args.stop,
                                   diagnose=4 if sampler == "sazo" else 0, accuracy_at=args.accuracy_at)
        run["seconds"] = time.perf_counter() - start
        write_text(args.out / f"{sampler}_{rate:g}_s{seed}.json", json.dumps(run))
        print(run_summary(f"{sampler} lr={rate:g} seed={seed}:", run, targets=(0.7, args.stop))
              + f"; held-out acc={run.get('test_accuracy')}"
              + (f" (after {run['budget_queries']} queries: {run['budget_accuracy']})" if args.accuracy_at else "")
              + f", {run['seconds']:.0f} s", flush=True)
    restore_snapshot(params, theta0)


if __name__ == "__main__":
    main()

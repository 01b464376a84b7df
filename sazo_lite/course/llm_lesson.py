"""Notebook 06's lesson: one stored SmolLM2 race, read once, and the tables its cells print.

The race is a benchmark report (``benchmarks/llm_queries.py`` writes it): uniform MeZO, SAZO and
the oracle from one θ₀, each on its own rate grid, then 5 seeds at its chosen rate. ``REPORT``
names the one report the lesson draws; switching the lesson to another race is that one line.

    race = load_race()                  # the stored report, found from the working directory up
    race.runs["sazo"]                   # SAZO's seeds at its chosen rate (run dicts, QueryRun.to_dict())
    ratio_table(race)                   # uniform ÷ oracle, uniform ÷ SAZO, SAZO ÷ oracle at each target

Figures of the same data: ``sazo_lite.course.widgets.llm_lesson``.
"""
from __future__ import annotations

import json
import math
import statistics
from dataclasses import dataclass, field
from pathlib import Path

from ..llm.queries import DIVERGE_FACTOR, held_out_accuracies, queries_to, ratio_bound
from ..train import median_queries, median_ratio_interval
from ..validation import check_count, check_number, check_real
from .config import REFERENCE_RUN, benchmark_report
from .tables import Table

__all__ = ["REPORT", "SAMPLERS", "Race", "load_race", "text_note", "protocol_line", "gain_by_hand", "measure_theta0",
           "set_table", "queries_table", "ratio_table", "ratios", "walk_table", "turn", "score_table", "DIVERGE_FACTOR"]

REPORT = "llm_opposed_race.json"          # the race notebook 06 draws (benchmarks/reference/ or this machine's)
SAMPLERS = ("uniform", "sazo", "oracle")
NAMES = {"uniform": "uniform", "sazo": "SAZO", "oracle": "oracle"}
RATIOS = (("uniform", "oracle"), ("uniform", "sazo"), ("sazo", "oracle"))


@dataclass
class Race:
    """One set's race from a stored report: each sampler's seeds at its chosen rate, and θ₀'s design.

    ``design`` holds the true norms at θ₀ (``norms``), the indices of the new examples (``new``),
    F₀, V(u)/V(p*), ‖∇F‖²/V(p*) and the predicted gain per B (``llm.continual.predicted_gains``).
    """

    label: str
    source: str                     # which file, and whether it is this machine's run or the one in git
    date: str
    machine: str
    num_examples: int               # N
    batch_size: int                 # B
    dim: int                        # d, the tuned parameters
    targets: tuple[float, ...]      # fractions of F₀
    select_target: float            # the target the rates were chosen by
    chosen_lr: dict[str, float]
    runs: dict[str, list[dict]]     # sampler → its seeds at the chosen rate
    design: dict
    grid: dict[str, dict[str, list[dict]]] = field(default_factory=dict)   # sampler → rate → the grid's runs
    args: dict = field(default_factory=dict)        # the benchmark's arguments (seeds, sizes, the set's name)
    reference: bool = True          # the reference run in git (the one notebook 06's text quotes)

    @property
    def kinds(self) -> list[str]:
        """"new" or "assimilated" for each training example."""
        new = set(self.design.get("new", []))
        return ["new" if i in new else "assimilated" for i in range(self.num_examples)]


def load_race(name: str = REPORT, *, start: Path | str | None = None, setting: int = 0) -> Race:
    """The race of ``setting`` (its index in the report) in the stored report ``name``: this machine's latest
    run where there is one, else the reference run in git (``config.benchmark_report``).

    Raises:
        FileNotFoundError: no such report at or above ``start``, nor above this package.

    Example:
        >>> race = load_race()
        >>> sorted(race.runs) == sorted(SAMPLERS) and race.batch_size >= 1
        True
    """
    # from the working directory up (a notebook in the checkout), else from this package up (a copy run
    # elsewhere, e.g. under nbmake in a temporary folder, of a checkout installed in place)
    found = benchmark_report(name, start=start) or benchmark_report(name, start=Path(__file__).parent)
    if found is None:
        raise FileNotFoundError(f"Invalid report: no benchmarks/reference/{name} above {start or Path.cwd()} "
                                f"or {Path(__file__).parent}")
    report = json.loads(found[0].read_text())
    s = report["settings"][setting]
    runs = {k: s["runs"][k] for k in SAMPLERS if k in s["runs"]}
    grid = {k: {rate: cell if isinstance(cell, list) else [cell] for rate, cell in s.get("grid", {}).get(k, {}).items()}
            for k in runs}
    return Race(label=s["label"], source=f"{found[0].name} ({found[1]})", date=report["date"], machine=report["machine"],
                num_examples=s["N"], batch_size=s["B"], dim=s["tuned_parameters"],
                targets=tuple(report["args"]["targets"]), select_target=s.get("select_target", report["args"]["targets"][0]),
                chosen_lr={k: s["chosen_lr"][k] for k in runs}, runs=runs, design=s["design"], grid=grid,
                args=report["args"], reference=found[1] == REFERENCE_RUN)


def text_note(race: Race) -> str:
    """"" for the reference run in git, whose numbers notebook 06's text quotes; for this machine's own latest run
    (``benchmarks/results/``, read first), the sentence that says the text's numbers are not this run's."""
    if race.reference:
        return ""
    return (f"Note: this is this machine's latest run ({race.source.split(' (')[0]} in benchmarks/results/); the text's "
            "numbers are the reference run's in git (benchmarks/reference/), so they can differ from what the cells "
            "print here.")


def protocol_line(race: Race) -> str:
    """The race's sizes and protocol in one line, from its report."""
    a = race.args
    return (f"N = {race.num_examples} examples, B = {race.batch_size}, d = {race.dim:,} tuned parameters; rates on √2 grids, "
            f"{a['grid_seeds']} seeds per rate, chosen by the median queries to {race.select_target:g}·F₀, then "
            f"{a['seeds']} seeds at each chosen rate; a run diverged once F > {DIVERGE_FACTOR:g}·F₀")


def gain_by_hand(norms, grad_sq: float, batch_size: int) -> float:
    """The oracle's gain over uniform at B from true norms, written out (``predicted_gains`` is the library's):
    [V(u) + (B−1)‖∇F‖²] / [V(p*) + (B−1)‖∇F‖²], with V(p) = (1/N²) Σ ‖∇f_i‖²/p_i.

    Example:
        >>> round(gain_by_hand([1.0, 1.0, 1.0, 5.0], 0.0, 4), 3)
        1.75
    """
    try:
        if isinstance(norms, (str, bytes)):
            raise TypeError
        norms = [check_real("norms", a.item() if getattr(a, "ndim", None) == 0 and hasattr(a, "item") else a)
                 for a in norms]   # each a number: float() read True as 1.0 and "2" as 2.0
    except TypeError:   # a single number or a string raised TypeError naming no argument
        raise ValueError(f"Invalid norms: {norms!r} (expected a sequence of per-example norms)") from None
    check_count("batch_size", batch_size)
    check_number("grad_sq", grad_sq, 0.0)
    if not norms or not all(math.isfinite(a) and a >= 0 for a in norms) or not any(a > 0 for a in norms):
        raise ValueError(f"Invalid norms: expected finite per-example norms >= 0, not all 0, got {norms[:5]}")
    n, total = len(norms), sum(norms)
    v_uniform = sum(a * a / (1 / n) for a in norms) / n ** 2          # p_i = 1/N
    v_oracle = sum(a * a / (a / total) for a in norms if a > 0) / n ** 2   # p_i = ‖∇f_i‖ / Σ‖∇f_j‖
    # ‖∇F‖ = ‖mean ∇f_i‖ ≤ mean ‖∇f_i‖, so ‖∇F‖² ≤ V(p*): above it no set of gradients gives both (a gain near 1
    # was returned without a word; minibatches.gain_vs_batch refuses the same)
    if grad_sq > v_oracle * (1 + 1e-9):
        raise ValueError(f"Invalid grad_sq: {grad_sq:.6g} (expected ‖∇F‖² <= (mean of the norms)² = {v_oracle:.6g}: "
                         "‖mean ∇f_i‖ <= mean ‖∇f_i‖)")
    return (v_uniform + (batch_size - 1) * grad_sq) / (v_oracle + (batch_size - 1) * grad_sq)


def measure_theta0(race: Race) -> dict:
    """The race's θ₀ measured again on SmolLM2 (``predicted_gains``' record): the model with LoRA, the set's
    first round (cached under the benchmark's key after its first run, minutes on a 2-core CPU), true norms."""
    from ..llm import add_lora, load_smollm2, trainable_parameters
    from ..llm.continual import cached_first_round, make_continual_set, predicted_gains
    from ..llm.grad_norms import full_gradient_norm, grad_norms

    a, n = race.args, race.num_examples
    model, tokenizer = load_smollm2(verbose=False)
    model = add_lora(model, rank=a["rank"], init_seed=0)
    params = trainable_parameters(model)
    cset = make_continual_set(a["sets"][0], num_train=n, new_fraction=a["big_new_fraction"], num_test=a["num_test"], seed=0)
    cached_first_round(model, params, cset, tokenizer, steps=a["setup_steps"], lr=3e-3,      # the benchmark's key
                       key=f"smollm2-r{a['rank']}-n{n}-f{a['big_new_fraction']:.3f}")
    batch = cset.task.encode(tokenizer, "train")
    return predicted_gains(grad_norms(model, batch, params), full_gradient_norm(model, batch, params))


def set_table(race: Race) -> Table:
    """θ₀ in rows of (quantity, value): the sizes, F₀, the spread of the true norms and what it predicts."""
    d, b = race.design, race.batch_size
    norms, kinds = d["norms"], race.kinds
    spread = lambda kind: [a for a, k in zip(norms, kinds) if k == kind]
    return Table(["at θ₀", "value"], [["N (new)", f"{race.num_examples} ({kinds.count('new')})"], ["B", str(b)],
            ["d (tuned parameters)", f"{race.dim:,}"], ["F₀", f"{d['F0']:.4f}"],
            ["‖∇f_i‖ of the new examples, median [min–max]", _span(spread("new"))],
            ["‖∇f_i‖ of the assimilated examples", _span(spread("assimilated"))],
            ["V(u)/V(p*)", f"{d['v_uniform_ratio']:.2f}"], ["‖∇F‖²/V(p*)", f"{d['grad_sq_ratio']:.2f}"],
            [f"predicted uniform ÷ oracle at B = {b}", f"{d['gain'][str(b)]:.2f}"],
            [f"δ_k against autograd at ε = {d['eps']:g}, largest error", f"{max(d['eps_relative_error']):.1%}"]],
                 caption="the set at θ₀, measured by backprop before the race")


def _f0(run: dict) -> list[float]:
    return [v / run["train_loss"][0] for v in run["train_loss"]]


def _span(values: list[float]) -> str:
    """median [min–max] over seeds, a NaN (a run's walk or step size where it diverged) counting as +∞, above every
    other: statistics.median and min/max read a NaN by where it stood among the seeds."""
    values = [math.inf if math.isnan(v) else v for v in values]
    return f"{statistics.median(values):.3g} [{min(values):.3g}–{max(values):.3g}]" if values else "–"


def _queries_cell(runs: list[dict], target: float) -> str:
    values = [queries_to(r, target) for r in runs]
    hit = sorted(v for v in values if v is not None)
    middle = median_queries(values)
    if not math.isfinite(middle):
        return f"not reached ({len(values) - len(hit)} of {len(values)} missed)"
    missed = f" ({len(values) - len(hit)} missed)" if len(hit) < len(values) else ""
    return f"{middle:,.0f} [{hit[0]:,}–{f'{hit[-1]:,}' if not missed else '?'}]{missed}"


def _accuracy(runs: list[dict]) -> str:
    """Mean held-out accuracy, and when: after the fixed budget where the runs measured one, else at their end."""
    accs = held_out_accuracies(runs)
    if not accs:
        return "–"
    budgets = {r["budget_queries"] for r in runs if r.get("budget_accuracy") is not None}
    return f"{statistics.mean(accs):.3f} " + (f"after {max(budgets):,} queries" if budgets else "at the run's end")


def queries_table(race: Race) -> Table:
    """The race's table: per sampler its rate, queries to each target (median [min–max] over seeds, a miss
    counting as never), the seeds that diverged, its queries run, and held-out accuracy."""
    header = ["sampler", "rate η", *(f"queries to {t:g}·F₀" for t in race.targets), "diverged",
              "queries run (most)", "held-out accuracy, mean"]
    rows = [[NAMES[k], f"{race.chosen_lr[k]:.3g}", *(_queries_cell(runs, t) for t in race.targets),
             f"{sum(r['diverged'] for r in runs)} of {len(runs)}", f"{max(r['queries'][-1] for r in runs):,}",
             _accuracy(runs)] for k, runs in race.runs.items()]
    return Table(header, rows, caption="each sampler's seeds at its chosen rate: median [min–max], a miss counting as never")


def _end(value: float) -> str:
    """An interval's end: "∞" where a resampled median was never, "0" where the other one was."""
    return "∞" if math.isinf(value) else "0" if value == 0 else f"{value:.2f}"


def ratios(race: Race, target: float) -> dict[str, str]:
    """"a ÷ b" → the ratio of median queries to ``target``·F₀ with its 95% bootstrap interval over seeds,
    a bound where one median run was only cut short of the target, or "–" where neither median arrived.
    Only the pairs whose samplers both ran (a control race has no oracle)."""
    out = {}
    for a, b in _pairs(race):
        top, bottom = race.runs[a], race.runs[b]
        qa, qb = ([queries_to(r, target) for r in runs] for runs in (top, bottom))
        ma, mb = median_queries(qa), median_queries(qb)
        if math.isfinite(ma) and math.isfinite(mb):
            low, high = median_ratio_interval(qa, qb)
            out[f"{NAMES[a]} ÷ {NAMES[b]}"] = f"{ma / mb:.2f} [{_end(low)}–{_end(high)}]"
        else:
            bound = ratio_bound(top, bottom, target)
            out[f"{NAMES[a]} ÷ {NAMES[b]}"] = f"{bound[0]} {bound[1]:.2f}" if bound else "–"
    return out


def _pairs(race: Race) -> list[tuple[str, str]]:
    return [(a, b) for a, b in RATIOS if a in race.runs and b in race.runs]


def ratio_table(race: Race) -> Table:
    """The ratios (of the samplers that ran) at every target."""
    rows = [[f"{t:g}·F₀", *ratios(race, t).values()] for t in race.targets]
    return Table(["target", *(f"{NAMES[a]} ÷ {NAMES[b]}" for a, b in _pairs(race))], rows,
                 caption="ratios of median queries [95% bootstrap interval over seeds]")


def _require(run, keys) -> None:
    if not isinstance(run, dict) or any(key not in run for key in keys):
        have = sorted(run) if isinstance(run, dict) else type(run).__name__
        raise ValueError(f"Invalid run: expected a stored run with keys {list(keys)}, got {have}")


def turn(run: dict) -> tuple[float, float]:
    """Where a run's loss was lowest: (F/F₀ there, ‖θ−θ₀‖ there)."""
    _require(run, ("train_loss", "walk"))
    if not run["train_loss"] or len(run["walk"]) != len(run["train_loss"]):
        raise ValueError(f"Invalid run: {len(run['train_loss'])} losses and {len(run['walk'])} walk points "
                         "(expected the same number, at least one)")
    losses = _f0(run)
    k = min(range(len(losses)), key=losses.__getitem__)
    return losses[k], run["walk"][k]


def walk_table(race: Race) -> Table:
    """Per sampler: E[ĝ²], the walk at the end and where the loss was lowest, median [min–max] over seeds,
    and the walk at which each diverged seed was stopped."""
    header = ["sampler", "rate η", "E[ĝ²]", "‖θ−θ₀‖ at the end", "lowest F/F₀", "‖θ−θ₀‖ there",
              "‖θ−θ₀‖ where a seed diverged"]
    rows = []
    for k, runs in race.runs.items():
        turns = [turn(r) for r in runs]
        failed = ", ".join(f"{r['walk'][-1]:.1f}" for r in runs if r["diverged"]) or "none diverged"
        rows.append([NAMES[k], f"{race.chosen_lr[k]:.3g}", _span([r["mean_sq_step_scale"] for r in runs]),
                     _span([r["walk"][-1] for r in runs]), _span([t[0] for t in turns]), _span([t[1] for t in turns]),
                     failed])
    return Table(header, rows, caption="the walk and the step size, median [min–max] over each sampler's seeds")


def score_table(run: dict) -> Table:
    """A diagnosed SAZO run (``query_run(diagnose=...)``): at each diagnosed log point, how well its scores
    rank the true norms (Spearman ρ), TV(p_SAZO, p*), V(p_SAZO)/V(p*) and V(u)/V(p*)."""
    _require(run, ("queries", "walk", "diagnostics", "seed", "lr"))
    walk_at = dict(zip(run["queries"], run["walk"]))
    rows = [[f"{d['queries']:,}", f"{walk_at.get(d['queries'], float('nan')):.1f}", f"{d.get('rho', float('nan')):.2f}",
             f"{d['tv']:.2f}", f"{d['v_ratio']:.2f}", f"{d['v_uniform_ratio']:.2f}"] for d in run["diagnostics"]]
    return Table(["queries", "‖θ−θ₀‖", "Spearman ρ(score, ‖∇f_i‖)", "TV(p_SAZO, p*)", "V(p_SAZO)/V(p*)", "V(u)/V(p*)"],
                 rows, caption=f"SAZO's scores against the true norms (seed {run['seed']}, η = {run['lr']:.3g}; ρ reads 0 "
                                 f"where it is undefined, as before any draw, when every score is equal)")

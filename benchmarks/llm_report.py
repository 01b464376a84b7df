"""The language-model race's report: reading it back, its table, ratios (with intervals, or bounds where
a median run was cut short) and held-out accuracy, and merging partial reports.

``benchmarks.llm_queries`` runs the race and writes the report; ``make bench`` (``benchmarks.run``),
``--merge`` and ``--cached-only`` read it through here.
"""
from __future__ import annotations

import json
import math
import statistics
from pathlib import Path

from benchmarks.queries import grid_edge
from sazo_lite.llm.queries import held_out_accuracies, queries_to, ratio_bound
from sazo_lite.train import mean_difference_interval, median_queries, median_ratio_interval

__all__ = ["RESULTS", "QUICK_RESULTS", "REFERENCE", "GOALS", "latest_report", "reference_report", "is_pilot", "accuracy_difference", "summarise", "ratio_text",
           "print_report", "overlap", "merge"]

RESULTS = Path(__file__).parent / "results" / "llm_queries.json"        # this machine's latest run (not in git)
REFERENCE = Path(__file__).parent / "reference" / "llm_queries.json"    # the run docs/llm.md reports (in git)
QUICK_RESULTS = RESULTS.with_name("llm_queries_quick.json")             # this machine's latest --quick pilot (not in git)


def is_pilot(report: dict) -> bool:
    """Whether a report is a ``--quick`` pilot's (1 seed, 800 steps: shown, never graded)."""
    return bool(report.get("args", {}).get("quick"))


def latest_report(name: str = "llm_queries.json") -> tuple[dict | None, str]:
    """This machine's latest report ``name`` if there is one, else the committed reference run; and which it is.
    ``llm_queries.json`` is ``make bench-llm``'s; ``llm_opposed_race.json`` the opt-in race at B = 4."""
    path = RESULTS.parent / name
    if path.exists():
        return json.loads(path.read_text()), f"this machine's latest {name}"
    return reference_report(name)


def reference_report(name: str = "llm_queries.json") -> tuple[dict | None, str]:
    """The committed reference run ``name`` (or None) and which it is, as ``latest_report`` says it."""
    path = REFERENCE.parent / name
    return (json.loads(path.read_text()), "the reference run in git") if path.exists() else (None, "none")


def _spread(values: list) -> str:
    finite = [v for v in values if v is not None and math.isfinite(v)]
    return f"{statistics.median(finite):.3g} [{min(finite):.3g}–{max(finite):.3g}]" if finite else "–"


def mean_interval(values: list) -> str:
    """"m ± h": the mean of ``values`` and the half-width of its 95% normal interval, 1.96·s/√n; the value
    alone for one, "–" for none."""
    if len(values) < 2:
        return f"{values[0]:.3f}" if values else "–"
    return f"{statistics.mean(values):.3f} ± {1.96 * statistics.stdev(values) / len(values) ** 0.5:.3f}"


def difference_interval(first: list, second: list) -> str:
    """"d ± h": mean(first) − mean(second) and the half-width of its 95% interval
    (``train.mean_difference_interval``); "–" without two values on each side."""
    if min(len(first), len(second)) < 2:
        return "–"
    difference, half = mean_difference_interval(first, second)
    return f"{difference:+.3f} ± {half:.3f}"


def accuracy_difference(runs: dict, top: str, bottom: str) -> str:
    """``difference_interval`` of the held-out accuracies of ``top``'s runs and ``bottom``'s."""
    return difference_interval(held_out_accuracies(runs.get(top, [])), held_out_accuracies(runs.get(bottom, [])))


SUFFIXES = ("+rule", "+bound", "+pull", "+cap")   # a sampler's variants: the step rule, the walk bound, the pull, the cap
SHARED_RULES = {"+bound": "the walk bound", "+pull": "the pull toward θ₀", "+cap": "the step cap"}   # rules applied alike to every sampler


def raced_suffix(setting: dict) -> str:
    """The variant suffix of a setting's race: "" where plain uniform ran, else the suffix uniform
    carries ("+bound" for ``make bench-llm``'s default, every sampler with the walk bound)."""
    runs = setting.get("runs", {})
    return "" if "uniform" in runs else next((x for x in SUFFIXES if f"uniform{x}" in runs), "")


def summarise(setting: dict, targets=(0.5, 0.3)) -> list[str]:
    """Table rows per variant: rate, queries to each target (median [min–max]; a miss counts as never),
    walk ‖θ−θ₀‖ at the end, max |ĝ|, max weight, E[ĝ²], held-out accuracy; fills ``setting["ratios"]``."""
    rows, med = [], {}
    for variant, runs in setting["runs"].items():
        cells = []
        for t in targets:
            values = [queries_to(r, t) for r in runs]
            hit = [v for v in values if v is not None]
            middle = median_queries(values)
            med[(variant, t)] = None if math.isinf(middle) else middle
            cells.append(f"{middle:.0f} [{min(hit)}–{max(hit) if len(hit) == len(values) else '?'}]"
                         f"{'' if len(hit) == len(values) else f' ({len(values) - len(hit)} missed)'}"
                         if med[(variant, t)] is not None else
                         f"not reached{f' ({len(hit)} of {len(values)} seeds did)' if hit else ''}")
        accs = held_out_accuracies(runs)
        acc = mean_interval(accs)
        clean = [r for r in runs if not r["diverged"]]     # diverged runs' steps explode: shown by their count
        walks = _spread([r["walk"][-1] for r in clean if r.get("walk")])
        top_g = _spread([r.get("max_step_scale") for r in clean])
        top_w = _spread([r.get("max_weight") for r in clean])
        moment = _spread([r.get("mean_sq_step_scale") for r in clean])
        failed_walk = _spread([r["walk"][-1] for r in runs if r["diverged"] and r.get("walk")])
        diverged_count = sum(r["diverged"] for r in runs)
        chosen = setting["chosen_lr"].get(variant.split(" ")[0], setting["chosen_lr"].get(variant))
        edge = grid_edge(chosen, setting["grid"].get(variant, {})) if variant in setting["grid"] else ""
        rows.append(f"| {setting['label']} | {variant} | {chosen:g}{edge} | {' | '.join(cells)} | {walks} | "
                    f"{top_g} | {top_w} | {moment} | {acc} | {len(runs)}"
                    f"{f' ({diverged_count} diverged, walk {failed_walk})' if diverged_count else ''} |")
    ratios, bounds = {}, {}
    for t in targets:
        for suffix in ("", *SUFFIXES):
            u, s, o = (med.get((f"{name}{suffix}", t)) for name in ("uniform", "sazo", "oracle"))
            ratios[f"uniform/oracle{suffix}@{t}"] = u / o if u and o else None
            ratios[f"uniform/sazo{suffix}@{t}"] = u / s if u and s else None
            ratios[f"sazo/oracle{suffix}@{t}"] = s / o if s and o else None
        for name in ("uniform", "sazo", "oracle"):
            for suffix in SUFFIXES:
                base, ruled = med.get((name, t)), med.get((f"{name}{suffix}", t))
                if (name, t) in med and (f"{name}{suffix}", t) in med:
                    ratios[f"{name}/{name}{suffix}@{t}"] = base / ruled if base and ruled else None
        base, ruled = med.get(("sazo", t)), med.get(("sazo+rule", t))
        ratios[f"sazo/sazo+rule@{t}"] = base / ruled if base and ruled else None
        for key in [k for k in ratios if k.endswith(f"@{t}") and ratios[k] is None]:
            top, bottom = ratio_pair(key.split("@")[0])
            if top in setting["runs"] and bottom in setting["runs"]:
                bound = ratio_bound(setting["runs"][top], setting["runs"][bottom], t)
                if bound:
                    bounds[key] = bound
    setting["ratios"], setting["ratio_bounds"] = ratios, bounds
    return rows


# The long-run race's goals (make bench-llm's default report), written once: the printed line and make bench's
# grading read them. Graded at B ≥ 4 and at targets ≤ GOAL_TARGET·F₀ only.
GOAL_TARGET, GOAL_UNIFORM_OVER_SAZO, GOAL_SAZO_OVER_ORACLE, GOAL_CONTROL = 0.3, 2.0, 1.3, 1.1
GOALS = (f"goals, at B ≥ 4 and a target ≤ {GOAL_TARGET}·F₀, each sampler at its own rate: "
         f"uniform÷SAZO ≥ {GOAL_UNIFORM_OVER_SAZO:g}, SAZO÷oracle ≤ {GOAL_SAZO_OVER_ORACLE}; "
         f"homogeneous control SAZO÷uniform ≤ {GOAL_CONTROL}; held-out accuracy SAZO ≥ uniform")


def ratio_pair(name: str) -> tuple[str, str]:
    """The two variants a ratio's name divides: "uniform/sazo+bound" is uniform+bound ÷ sazo+bound (the
    suffix is written once for a pair of variants that both have it), "sazo/sazo+bound" is sazo ÷ sazo+bound."""
    top, bottom = name.split("/")
    for suffix in SUFFIXES:
        if bottom.endswith(suffix) and top != bottom[:-len(suffix)]:
            return top + suffix, bottom
    return top, bottom


def ratio_name(top: str, bottom: str) -> str:
    """The inverse of ``ratio_pair``: the name ``summarise`` stores the ratio of ``top`` ÷ ``bottom`` under."""
    for suffix in SUFFIXES:
        if top.endswith(suffix) and bottom.endswith(suffix):
            return f"{top[:-len(suffix)]}/{bottom}"
    return f"{top}/{bottom}"


def ratio_text(setting: dict, top: str, bottom: str, target: float) -> str:
    """"r [low–high]": the ratio of the two samplers' median queries to ``target``·F₀ at their chosen
    rates and its 95% bootstrap interval over seeds (``train.median_ratio_interval``); "–" without both."""
    name = ratio_name(top, bottom)
    ratio = setting.get("ratios", {}).get(f"{name}@{target}")
    runs = setting["runs"]
    if top not in runs or bottom not in runs:
        return "–"
    bound = setting.get("ratio_bounds", {}).get(f"{name}@{target}")
    if ratio is None and bound:      # a median run stopped at its budget: the ratio is bounded, not known
        return f"{bound[0]} {bound[1]:.2f} (a median run was cut short of the target)"
    if min(len(runs[top]), len(runs[bottom])) < 2:       # no spread to resample
        return f"{f'{ratio:.2f}' if ratio else '–'} (one seed)"
    low, high = median_ratio_interval([queries_to(r, target) for r in runs[top]],
                                      [queries_to(r, target) for r in runs[bottom]])
    never = [math.isinf(median_queries([queries_to(r, target) for r in runs[k]])) for k in (top, bottom)]
    if math.isnan(low) or all(never):      # neither median reaches the target: no ratio to bound
        return "–"
    return f"{f'{ratio:.2f}' if ratio else '–'} [{low:.2f}–{high:.2f}]"


def differing_args(report: dict) -> list[str]:
    """The arguments in which the parts of a merged report differ (``merge`` keeps each part's), sorted; [] for a
    report of one run. Its ratios then compare samplers raced under those different arguments."""
    parts = [part_args or {} for part_args in report.get("part_args", {}).values()]
    return sorted({k for pa in parts for k in pa if len({json.dumps(x.get(k)) for x in parts}) > 1})


def measured_dates(report: dict) -> str:
    """When a report was measured: its date, or each merged part's distinct dates (``merge`` keeps them)."""
    dates = list(dict.fromkeys(part.get("date") for part in report.get("part_measured", {}).values()))
    return f"parts of {', '.join(map(str, dates))}" if len(dates) > 1 else report["date"]


def print_report(report: dict) -> None:
    """The table (median [min–max] over seeds), the θ₀ design and the ratios, from a report dict."""
    a = report["args"]
    targets = a.get("targets", [0.5, 0.3])
    header = ["| setting | sampler | lr | " + " | ".join(f"queries to {t:g}·F₀" for t in targets) + " | ‖θ−θ₀‖ at the end "
              "| max |ĝ| | max w | E[ĝ²] | held-out acc. (95% CI; after a fixed budget where one is given) | seeds |",
              "|---" * (9 + len(targets)) + "|"]
    rows = [row for s in report["settings"] for row in summarise(s, targets)]
    measured = report.get("part_measured", {})
    if measured:        # merged parts, each measured on its own day and machine: each says so
        print(f"\nmerged from {len(measured)} parts · ε={a['eps']}, runtime {report['runtime_s'] / 60:.1f} min "
              f"(sum of the merged parts)")
        for name, part in measured.items():
            print(f"  {name}: {part.get('date')} · {part.get('machine')}")
    else:
        print(f"\n{report['date']} · {report['machine']} · ε={a['eps']}, runtime {report['runtime_s'] / 60:.1f} min"
              f"{' (sum of the merged parts)' if report.get('merged_from') else ''}")
    parts = {name: part_args or {} for name, part_args in report.get("part_args", {}).items()}
    differ = differing_args(report)
    for name, part_args in parts.items() if differ else ():     # what the merged processes ran with, where they differed
        print(f"  {name}: " + ", ".join(f"{k}={part_args.get(k)}" for k in differ))
    print("\n".join(header + rows))
    for lr, g in report.get("gd_reference", {}).items():
        print(f"full-batch GD by backprop (continual set), lr {lr}: F/F₀ at steps {g['steps'][-1]}: "
              f"{g['train_loss'][-1] / g['train_loss'][0]:.2f}{' (diverged)' if g['diverged'] else ''}")
    for name, value in report.get("measured_only", {}).items():
        value = value if isinstance(value, dict) else {"v_uniform_ratio": value}
        print(f"θ₀ of the {name} set (measured, not raced): V(u)/V(p*) = {value['v_uniform_ratio']:.2f}"
              + (f", ‖∇F‖²/V(p*) = {value['grad_sq_ratio']:.2f}" if "grad_sq_ratio" in value else ""))
        if "random_walk" in value:
            walk = value["random_walk"]
            print("  random displacements from θ₀ (ΔF/F₀, mean over ± pairs): " + ", ".join(
                f"‖Δθ‖ = {r:g}: {m:+.1%}" for r, m in zip(walk["radii"], walk["mean_change"])))
    print(f"\nratios of median queries ({GOALS}):")
    for s in report["settings"]:
        r, d = s["ratios"], s.get("design", {})
        print(f"  {s['label']}: V(u)/V(p*)@θ₀={s['heterogeneity_at_theta0']:.2f}"
              + (f", ‖∇F‖²/V(p*)={d['grad_sq_ratio']:.2f}, predicted uniform÷oracle at B={s.get('B')}: "
                 f"{d['gain'].get(str(s.get('B')), d['gain'].get(s.get('B'), float('nan'))):.2f}" if d else ""))
        for t in targets:
            segments = []
            if any(v in s["runs"] for v in ("uniform", "sazo", "oracle")):
                segments.append(f"uniform÷oracle={ratio_text(s, 'uniform', 'oracle', t)}, uniform÷SAZO="
                                f"{ratio_text(s, 'uniform', 'sazo', t)}, SAZO÷oracle={ratio_text(s, 'sazo', 'oracle', t)}")
            if "sazo+rule" in s["runs"]:
                segments.append(f"with the step rule: uniform÷SAZO={ratio_text(s, 'uniform+rule', 'sazo+rule', t)}, "
                                f"SAZO÷SAZO+rule={ratio_text(s, 'sazo', 'sazo+rule', t)}")
            for x, name in SHARED_RULES.items():
                if any(k.endswith(x) for k in s["runs"]):
                    segments.append(f"with {name}: uniform÷SAZO={ratio_text(s, 'uniform' + x, 'sazo' + x, t)}, "
                                    f"SAZO÷oracle={ratio_text(s, 'sazo' + x, 'oracle' + x, t)}" + "".join(
                                        f", {v}÷{v}{x}={ratio_text(s, v, v + x, t)}" for v in ("uniform", "sazo", "oracle")
                                        if v in s["runs"] and f"{v}{x}" in s["runs"]))
            print(f"    @{t:g}·F₀: " + " | ".join(segments))
            x = raced_suffix(s)
            bound = s.get("ratio_bounds", {}).get(f"uniform/sazo{x}@{t}")
            if "homogeneous" in s["label"] and r.get(f"uniform/sazo{x}@{t}"):
                print(f"      homogeneous: SAZO÷uniform={1 / r[f'uniform/sazo{x}@{t}']:.2f} "
                      f"(interval: 1 ÷ uniform÷SAZO's {ratio_text(s, 'uniform' + x, 'sazo' + x, t)})")
            elif "homogeneous" in s["label"] and bound:     # a median run cut short: 1 ÷ the bound, the other way
                print(f"      homogeneous: SAZO÷uniform {'>' if bound[0] == '<' else '<'} {1 / bound[1]:.2f} "
                      "(a median run was cut short of the target)")
        budgets = sorted({r["budget_queries"] for runs in s["runs"].values() for r in runs if r.get("budget_queries")})
        if budgets:
            parts = [(f"with {SHARED_RULES[x]}: " if x else "")
                     + f"SAZO − uniform = {accuracy_difference(s['runs'], 'sazo' + x, 'uniform' + x)}, "
                       f"oracle − uniform = {accuracy_difference(s['runs'], 'oracle' + x, 'uniform' + x)}"
                     for x in ("", *SHARED_RULES) if "uniform" + x in s["runs"]]     # the races this report holds
            print(f"    held-out accuracy after {max(budgets)} queries (mean difference, 95% interval): "
                  + "; ".join(parts or ["no uniform runs to compare with"])
                  + (" (the oracle's at its runs' end: it has no budget)"
                     if s["runs"].get("oracle") and not any(r.get("budget_queries") for r in s["runs"]["oracle"]) else "")
                  + (f" (runs that diverged earlier are counted where they stopped: {min(budgets)} queries)"
                     if len(budgets) > 1 else ""))
        for variant, where in s.get("incomplete", {}).items():
            print(f"    {variant}: INCOMPLETE, the race so far ({where})")
        for variant, rate in s.get("too_slow", {}).items():
            print(f"    {variant}: the grid stops stepping down at {rate:g}, which missed the target with its runs still "
                  "descending (under half its seeds diverged or relapsed): too slow, a lower rate cannot reach it "
                  "within the same cut")
        for variant, grid in s["grid"].items():
            select = s.get("select_target", targets[-1])
            print(f"    grid {variant} (median over seeds of the queries to {select:g}·F₀): " + "; ".join(
                f"{lr}: {median_queries([queries_to(g, select) for g in cell]):.0f}"
                f" ({sum(g['diverged'] for g in cell)}/{len(cell)} div)" for lr, cell in grid.items()))
        stale = [x for runs in s["runs"].values() for r in runs for x in r.get("staleness", [])]
        if stale and s.get("oracle_every", 1) > 1 or any(k.startswith("oracle k=") for k in s["runs"]):
            for variant, runs in s["runs"].items():
                ratios = [x["v_stale_ratio"] for r in runs for x in r.get("staleness", [])]
                if ratios and variant.startswith("oracle"):
                    print(f"    {variant}: V(p_stale)/V(p*) at refreshes: median {statistics.median(ratios):.2f}, "
                          f"max {max(ratios):.1f} ({len(ratios)} refreshes)")
        runs0 = s["runs"].get("sazo", [])
        diag = runs0[0].get("diagnostics", []) if runs0 else []
        if diag:
            print("    SAZO vs true norms over training (seed 0, chosen lr): "
                  + "; ".join(f"q={x['queries']}: ρ={x.get('rho', float('nan')):.2f} TV={x['tv']:.2f} "
                              f"V(pSAZO)/V(p*)={x['v_ratio']:.2f} V(u)/V(p*)={x['v_uniform_ratio']:.2f}"
                              for x in diag[::max(1, len(diag) // 6)]))


def overlap(paths: list[Path], parts: list[dict]) -> str | None:
    """Where two of the reports ``parts`` (read from ``paths``) hold runs of the same sampler in the same setting,
    a sentence naming them (``merge`` would keep the later part's runs alone), else None."""
    held: dict[tuple[str, str], int] = {}       # (setting, sampler) → the part that holds its runs
    for k, part in enumerate(parts):
        for setting in part["settings"]:
            for variant in setting.get("runs", {}):
                first = held.setdefault((setting["label"], variant), k)
                if first != k:
                    return (f"{Path(paths[first]).name} and {Path(paths[k]).name} both hold {variant}'s runs in "
                            f"{setting['label']!r} (a merge would keep one of them)")
    return None


def merge(paths: list[Path]) -> dict:
    """One report from partial ones (e.g. one sampler per process on a busy machine): settings with
    the same label pool their samplers (a sampler in two parts: the later part's runs, see ``overlap``);
    the runtime is the sum of the parts."""
    parts = [json.loads(Path(p).read_text()) for p in paths]
    report = {**parts[0], "settings": [], "measured_only": {}, "runtime_s": sum(p.get("runtime_s", 0) for p in parts)}
    if len(paths) > 1:       # one path: just reprint that report
        report["merged_from"] = [Path(p).name for p in paths]
        report["part_args"] = {Path(p).name: part.get("args") for p, part in zip(paths, parts)}  # each its own sizes
        # each its own date and machine (the first part's alone headed the report): parts of the race of one
        # command (its workers, undated) are stamped together by llm_queries instead
        if any(part.get("date") for part in parts):
            report["part_measured"] = {Path(p).name: {"date": part.get("date"), "machine": part.get("machine")}
                                       for p, part in zip(paths, parts)}
    by_label: dict[str, dict] = {}
    for part in parts:
        report["measured_only"].update(part.get("measured_only", {}))
        if "gd_reference" in part:
            report["gd_reference"] = part["gd_reference"]
        for setting in part["settings"]:
            if setting["label"] not in by_label:
                by_label[setting["label"]] = {**setting, "grid": {}, "chosen_lr": {}, "runs": {}}
                report["settings"].append(by_label[setting["label"]])
            for key in ("grid", "chosen_lr", "runs", "incomplete", "too_slow"):
                if key in setting:
                    by_label[setting["label"]].setdefault(key, {}).update(setting[key])
    return report

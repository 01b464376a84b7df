"""``make bench``: the whole benchmark table in one command (its measured run time: docs/benchmarks.md).

    python -m benchmarks.run            # full run; prints one table, writes benchmarks/results/bench.json
    python -m benchmarks.run --quick    # smoke run (tiny GPT-2 only, 1 seed, short budgets): bench_quick.json

Sections (each a ratio measured within this run; see the modules for the method):
  1. queries to target: uniform / SAZO / oracle on the quadratics and logistic regression, 5 seeds,
     targets 2% and 0.5% of the initial gap (``benchmarks.queries``); the language-model sets'
     ratios are read from the latest ``make bench-llm`` report (``benchmarks.llm_queries``, sized for
     an hour: not rerun here) and carry its date;
  2. engine speed: ZO step ÷ (2 × forward), reference MeZO loop vs sazo_lite (``engine_speed.speed``);
  3. memory: ZO-step peak RSS ÷ inference peak RSS, fresh processes (``engine_speed.memory``);
  4. SAZO overhead over MeZO: step-time ratio and extra state bytes (``engine_speed.overhead``);
  5. sampler cost: sample + update at N = 10⁶, B = 32 (``engine_speed.sampler_cost``), and SAZO's
     state bytes per example with sample + update time at N = 10⁵ and 10⁶ (``sampler_state``).
A section that fails is reported as such in the table; the others still run.
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import time
import traceback
from pathlib import Path

import torch

from sazo_lite.atomic import write_text
from benchmarks import engine_speed, sampler_state
from benchmarks.cli import check_not_full, check_output, machine

RESULTS = Path(__file__).parent / "results"
TARGETS = {"speed": 1.15, "memory": 1.05, "overhead": 1.02, "sazo_gain_heterogeneous": 3.5,
           "sazo_cost_homogeneous": 1.0, "sazo_over_oracle": 1.3, "state_bytes_per_example": 16}


def queries_section(quick: bool) -> dict:
    """uniform/SAZO/oracle queries on the three small problems, via ``benchmarks.queries`` (a full run resumes from
    the cells an interrupted one saved in ``queries.CELLS``)."""
    from benchmarks.queries import CELLS, TARGETS as QUERY_TARGETS, default_problems, format_table, run_queries_benchmark

    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # tiny problems: threads only add overhead
    try:
        seeds, targets = ([0], (0.1,)) if quick else (list(range(5)), QUERY_TARGETS)
        # a full run saves its finished cells where benchmarks.queries does: an interrupted make bench resumes there
        result = run_queries_benchmark(default_problems(quick), seeds, targets, cache=None if quick else CELLS)
    finally:
        torch.set_num_threads(threads)
    result["table"] = format_table(result)
    return result


def llm_queries_section(quick: bool) -> dict:
    """The language-model sets, in the same table: read from the latest ``make bench-llm`` race, and under
    ``"more"`` this machine's latest ``--quick`` pilot and the opt-in race at B = 4 (``llm_opposed_race.json``)
    when there are.

    Those benchmarks are sized for an hour and for hours (docs/llm.md gives their measured times), so
    ``make bench`` does not rerun them; their rows carry their dates (this machine's latest run, else the
    reference run committed with the README's figures). The issue's goals grade the sets raced at B ≥ 4 only,
    never a pilot: a pilot in llm_queries.json (where ``--quick`` wrote until 2026-12-07) is shown as one, and
    the race is then the reference run's.
    """
    from benchmarks.llm_report import (GOAL_SAZO_OVER_ORACLE, GOAL_TARGET, GOAL_UNIFORM_OVER_SAZO, QUICK_RESULTS,
                                       reference_report)

    section = _llm_report_section("llm_queries.json", "bench-llm")
    pilots = [_llm_report_section(QUICK_RESULTS.name, "bench-llm")]
    if section.get("pilot"):        # a pilot over the race's file: the race shown is the reference run
        pilots.append(section)
        section = _section_of(*reference_report("llm_queries.json"), "bench-llm")
    # the long-run race's own goals (issue of the long runs: targets ≤ 0.3·F₀); the B = 4 race keeps its earlier ones
    section["goals"] = {"deepest": GOAL_TARGET, "uniform/sazo": GOAL_UNIFORM_OVER_SAZO, "sazo/oracle": GOAL_SAZO_OVER_ORACLE}
    if "missing" in section:
        section["missing"] = "no LLM report: run `make bench-llm` (sized for an hour) to add these rows"
    race = _llm_report_section("llm_opposed_race.json", "B = 4 race")
    more = [s for s in pilots if s.get("pilot")] + ([race] if "missing" not in race else [])
    if more:
        section["more"] = more
    return section


def _llm_report_section(name: str, title: str) -> dict:
    from benchmarks.llm_report import latest_report

    return _section_of(*latest_report(name), title, name)


# arguments in which the parts of a merged language-model report differ by design: where each part wrote, how it
# ran, and which samplers it raced from which rate (one sampler a part)
PART_ONLY_ARGS = ("out", "partial", "worker", "jobs", "threads", "run_cache", "cached_only", "only_run", "merge",
                  "variants", "variant_start", "top_variants", "top_start")


def _section_of(report: dict | None, source: str, title: str, name: str = "llm_queries.json") -> dict:
    """A report's section of the table: its settings' ratios at its targets, its date and source."""
    from benchmarks.llm_report import differing_args, measured_dates, raced_suffix, summarise

    if report is None:
        return {"missing": f"no report {name}"}
    targets = report.get("args", {}).get("targets", [0.7, 0.5])
    settings = []
    for setting in report["settings"]:
        summarise(setting, tuple(targets))     # fills setting["ratios"] from the runs, at the report's targets
        settings.append({"label": setting["label"], "heterogeneity": setting["heterogeneity_at_theta0"],
                         "B": setting.get("B", 1), "chosen_lr": setting["chosen_lr"], "ratios": setting["ratios"],
                         "ratio_bounds": setting.get("ratio_bounds", {}),
                         "incomplete": setting.get("incomplete", {}),    # a race read from its cache before it ended
                         "seeds": {variant: len(runs) for variant, runs in setting["runs"].items()},
                         "suffix": raced_suffix(setting)})               # "+bound": the race of make bench-llm's default
    pilot = bool(report.get("args", {}).get("quick"))     # a --quick pilot (1 seed, 800 steps): shown, not graded
    title = f"{title} --quick pilot" if pilot else title
    differ = [k for k in differing_args(report) if k not in PART_ONLY_ARGS]
    if differ:      # merged parts: its ratios compare samplers raced under different arguments
        title += f", merged parts differing in {', '.join(differ)}"
    parts = [report.get("args") or {}, *(report.get("part_args") or {}).values()]
    if any((part or {}).get("cached_only") for part in parts):     # its date is the reading's: the runs are older
        title += "; read from its run cache with --cached-only on"
    return {"date": report["date"], "dates": measured_dates(report), "machine": report["machine"],
            "source": source, "settings": settings,
            "targets": targets, "title": title, "pilot": pilot}


def models_of(quick: bool) -> list[str]:
    return ["gpt2-tiny"] if quick else ["smollm2", "gpt2-tiny"]


def section_names(quick: bool) -> list[str]:
    """The sections a run has, in order (the names ``--only`` takes)."""
    models = models_of(quick)
    return ["queries", "llm_queries", *(f"speed/{m}" for m in models), *(f"memory/{m}" for m in models),
            "overhead", "sampler", "sampler_state"]


def run_sections(quick: bool, save=None, only=None, previous=None) -> dict:
    models = models_of(quick)
    rounds = 2 if quick else 3  # SmolLM2: ≈ 30 s per round on 2 cores
    sections = {
        "queries": lambda: queries_section(quick),
        "llm_queries": lambda: llm_queries_section(quick),
        **{f"speed/{m}": (lambda m=m: engine_speed.speed(m, rounds=rounds)) for m in models},
        **{f"memory/{m}": (lambda m=m: engine_speed.memory(m)) for m in models},
        "overhead": lambda: engine_speed.overhead("gpt2-tiny", rounds=2 if quick else 4),
        "sampler": lambda: engine_speed.sampler_cost(),
        "sampler_state": lambda: sampler_state.run(quick),
    }
    unknown = set(only or ()) - set(sections)
    if unknown:
        raise ValueError(f"Invalid --only: {sorted(unknown)} (sections: {list(sections)})")
    results = dict(previous or {})
    measured = machine()["date"]    # which run measured a section: --only merges sections of earlier runs
    for name, fn in sections.items():
        if only is not None and name not in only:
            continue
        started = time.perf_counter()
        print(f"[bench] {name} ...", flush=True)
        try:
            results[name] = fn()
        except Exception as error:  # noqa: BLE001 -- one broken section must not hide the rest
            results[name] = {"error": f"{type(error).__name__}: {error}", "traceback": traceback.format_exc()}
        results[name]["seconds"] = round(time.perf_counter() - started, 1)
        results[name]["run"] = measured
        print(f"[bench] {name} done in {results[name]['seconds']} s", flush=True)
        if save is not None:
            save(results)  # partial results survive an interrupted run
    return results


# -- the table --------------------------------------------------------------------------
def _fmt(value, spec=".2f", suffix="") -> str:
    return "–" if value is None else f"{value:{spec}}{suffix}"


def _verdict(value, limit, higher_is_better=False, bound=None) -> str:
    """"yes" / "NO" for ``value`` against ``limit``; where the value is unknown, by ``bound`` ("<" or ">", x: what
    runs cut short of the target prove of it) when the bound decides, else "?"."""
    if value is None and bound:
        below = bound[0] == "<"
        if below and bound[1] <= limit:
            return "NO" if higher_is_better else "yes"
        if not below and bound[1] >= limit:
            return "yes" if higher_is_better else "NO"
    if value is None:
        return "?"
    return "yes" if (value >= limit if higher_is_better else value <= limit) else "NO"


def _inverse(bound):
    """The bound of 1 ÷ a ratio from the ratio's ("<" or ">", x)."""
    return bound and ({"<": ">", ">": "<"}[bound[0]], 1 / bound[1])


def _query_rows(result: dict) -> list[tuple]:
    from benchmarks.queries import TARGETS as GOAL_TARGETS, ratio, ratio_bound, ratio_text

    rows = []
    for target in result.get("targets", []):
        goal = target in GOAL_TARGETS      # the goals are at 2% and 0.5%: a --quick run's 0.1 is shown, not graded
        for row in result.get("rows", []):
            name = f"{row['problem']} @ {target:g}"
            gain, behind = ratio(row, "uniform", "sazo", target), ratio(row, "sazo", "oracle", target)
            # a side that never reached the target within its budget: the ratio is a bound, graded where it decides
            gain_bound, behind_bound = ratio_bound(row, "uniform", "sazo", target), ratio_bound(row, "sazo", "oracle", target)
            if "σ=0" in name and "quadratic" in name:
                cost = None if gain is None else 1 / gain
                rows.append(("1 queries", f"{name}: SAZO ÷ uniform", ratio_text(row, "uniform", "sazo", target, invert=True),
                             f"≤ {TARGETS['sazo_cost_homogeneous']}" if goal else "",
                             _verdict(cost, TARGETS["sazo_cost_homogeneous"], bound=_inverse(gain_bound)) if goal else ""))
            elif "quadratic" in name and target == 0.02:
                rows.append(("1 queries", f"{name}: uniform ÷ SAZO", ratio_text(row, "uniform", "sazo", target),
                             f"≥ {TARGETS['sazo_gain_heterogeneous']}",
                             _verdict(gain, TARGETS["sazo_gain_heterogeneous"], higher_is_better=True, bound=gain_bound)))
            else:
                rows.append(("1 queries", f"{name}: uniform ÷ SAZO", ratio_text(row, "uniform", "sazo", target), "", ""))
            graded = goal and ("σ=0" not in name or "logistic" in name)
            rows.append(("1 queries", f"{name}: SAZO ÷ oracle", ratio_text(row, "sazo", "oracle", target),
                         f"≤ {TARGETS['sazo_over_oracle']}" if graded else "",
                         _verdict(behind, TARGETS["sazo_over_oracle"], bound=behind_bound) if graded else ""))
    return rows


def _llm_rows(llm: dict) -> list[tuple]:
    """Rows for the language-model sets (``make bench-llm``'s report, with its date)."""
    from benchmarks.llm_report import GOAL_CONTROL, SHARED_RULES, ratio_pair

    if "error" in llm or "missing" in llm:
        return [("1 queries", "language-model sets", llm.get("missing") or "failed", "", "")]
    rows = []
    # goals: the section's own, else those of the earlier B = 4 race (every target, SAZO ÷ oracle ≤ 1.5)
    goals = llm.get("goals", {"deepest": None, "uniform/sazo": 2.0, "sazo/oracle": 1.5})
    for s in llm.get("settings", []):
        unfinished = s.get("incomplete", {})

        def bound_of(ratio: str, target):      # ("<" or ">", value) where runs cut short bound the ratio
            return s.get("ratio_bounds", {}).get(f"{ratio}@{target}")

        def grade(ratio: str, value, limit, higher_is_better=False, target=None, invert=False) -> str:
            """A goal's verdict, or "not finished" while a sampler in the ratio has runs to go; a ratio
            bounded by runs cut short of the target is graded by its bound where the bound decides (``invert``:
            ``value`` is 1 ÷ the ratio, so is the bound)."""
            if any(sampler in unfinished for sampler in ratio_pair(ratio)):
                return "? (race not finished)"
            if any(s.get("seeds", {}).get(sampler, 2) < 2 for sampler in ratio_pair(ratio)):
                return "not graded (one seed)"      # as a pilot's: no median over seeds to grade
            bound = bound_of(ratio, target)
            return _verdict(value, limit, higher_is_better, bound=_inverse(bound) if invert else bound)

        def shown(ratio: str, value, target, invert=False) -> str:
            bound = bound_of(ratio, target)
            bound = _inverse(bound) if invert else bound
            return f"{bound[0]} {bound[1]:.2f}× (cut short)" if value is None and bound else _fmt(value, suffix="×")

        source = ", reference run" if "reference" in llm.get("source", "") else ""
        when = llm.get("dates", llm["date"])       # a merged report: each part's date
        name = f"LLM {s['label']} (V(u)/V(p*) = {s['heterogeneity']:.2f}; {llm.get('title', 'bench-llm')} {when}{source})"
        x = s.get("suffix", "")        # "+bound": every sampler raced with the walk bound
        if x in SHARED_RULES:
            name += f", with {SHARED_RULES[x]}"
        for t in llm.get("targets", (0.7, 0.5)):
            gain, behind = s["ratios"].get(f"uniform/sazo{x}@{t}"), s["ratios"].get(f"sazo/oracle{x}@{t}")
            # the goals are graded at the section's targets (the long-run race: ≤ 0.3·F₀; a shallower one is shown)
            deep = goals["deepest"] is None or t <= goals["deepest"]
            if "homogeneous" in s["label"]:     # SAZO ÷ uniform: the inverse of the ratio the report stores
                cost = None if not gain else 1 / gain
                judged = deep and not llm.get("pilot")
                rows.append(("1 queries", f"{name} @ {t}·F₀: SAZO ÷ uniform", shown("uniform/sazo" + x, cost, t, invert=True),
                             f"≤ {GOAL_CONTROL:g}" if judged else "",
                             grade("uniform/sazo" + x, cost, GOAL_CONTROL, target=t, invert=True) if judged else ""))
                continue
            # the goals are at B ≥ 4, on the race itself (a --quick pilot's single seed grades nothing)
            graded = s["label"].startswith("SmolLM2") and s.get("B", 1) >= 4 and not llm.get("pilot")
            if graded:
                # the oracle's headroom: a goal of the earlier B = 4 race only (the long-run race's goals, its own
                # section's, do not include it), shown for every race
                earlier = goals["deepest"] is None
                headroom = s["ratios"].get(f"uniform/oracle{x}@{t}")
                rows.append(("1 queries", f"{name} @ {t}·F₀: uniform ÷ oracle", shown("uniform/oracle" + x, headroom, t),
                             "≥ 3" if earlier else "",
                             grade("uniform/oracle" + x, headroom, 3.0, higher_is_better=True, target=t) if earlier else ""))
            graded = graded and deep
            rows.append(("1 queries", f"{name} @ {t}·F₀: uniform ÷ SAZO", shown("uniform/sazo" + x, gain, t),
                         f"≥ {goals['uniform/sazo']:g}" if graded else "",
                         grade("uniform/sazo" + x, gain, goals["uniform/sazo"], higher_is_better=True, target=t)
                         if graded else ""))
            rows.append(("1 queries", f"{name} @ {t}·F₀: SAZO ÷ oracle", shown("sazo/oracle" + x, behind, t),
                         f"≤ {goals['sazo/oracle']:g}" if graded else "",
                         grade("sazo/oracle" + x, behind, goals["sazo/oracle"], target=t) if graded else ""))
        for sampler, where in unfinished.items():
            rows.append(("1 queries", f"{name}: {sampler}'s runs", "not finished", "", where))
    for more in llm.get("more", []):
        rows += _llm_rows(more)
    return rows


def table_rows(results: dict) -> list[tuple]:
    rows = []
    if "error" in results.get("queries", {}):
        rows.append(("1 queries", "small problems", "failed", "", ""))
    rows += _query_rows(results.get("queries", {}))
    rows += _llm_rows(results.get("llm_queries", {}))
    for key in sorted(k for k in results if k.startswith("speed/")):
        r = results[key]
        if "error" in r:
            rows.append(("2 speed", key, "failed", "", ""))
            continue
        rows.append(("2 speed", f"{r['model']}: forward (s)", _fmt(r["forward_s"], ".3f"), "", ""))
        for source in engine_speed.PASS_SOURCES:  # the breakdown: a step is 2 forwards + 3 passes
            if f"pass_{source}_s" in r:
                rows.append(("2 speed", f"{r['model']}: one pass over θ, {source} (s)", _fmt(r[f"pass_{source}_s"], ".3f"), "", ""))
        for variant in engine_speed.VARIANTS:
            graded = r["model"] == "smollm2" and variant == "default"  # the goal is the default step's
            name = f"default ({r.get('default_noise', '?')})" if variant == "default" else variant
            met = _verdict(r[f"{variant}_ratio"], TARGETS["speed"]) if graded else ""
            if met == "NO" and engine_speed.too_noisy(r):   # past the bound in timings the load swamped: the run's
                met = "not judged (load)"                     # verdict (engine_speed.step_verdict) says so too
            rows.append(("2 speed", f"{r['model']}: {name} step ÷ 2·forward", _fmt(r[f"{variant}_ratio"]),
                         f"≤ {TARGETS['speed']}" if graded else "", met))
    for key in sorted(k for k in results if k.startswith("memory/")):
        r = results[key]
        if "error" in r:
            rows.append(("3 memory", key, "failed", "", ""))
            continue
        rows.append(("3 memory", f"{r['model']}: inference peak RSS (MiB)", _fmt(r["inference_peak"] / 2 ** 20, ".0f"), "", ""))
        for mode in engine_speed.MEMORY_MODES[1:]:
            rows.append(("3 memory", f"{r['model']}: {mode} ZO peak ÷ inference peak", _fmt(r[f"{mode}_ratio"], ".3f"),
                         f"≤ {TARGETS['memory']}", _verdict(r[f"{mode}_ratio"], TARGETS["memory"])))
    over = results.get("overhead", {})
    for key, value in over.items():
        if key.startswith("N="):
            rows.append(("4 SAZO overhead", f"{over['model']} {key}: SAZO step ÷ MeZO step, direct (noisy)",
                         _fmt(value["ratio"], ".3f"), "", ""))
            rows.append(("4 SAZO overhead", f"{over['model']} {key}: 1 + sampler extra ÷ MeZO step",
                         _fmt(value["component_ratio"], ".4f"), f"≤ {TARGETS['overhead']}",
                         _verdict(value["component_ratio"], TARGETS["overhead"])))
            rows.append(("4 SAZO overhead", f"{key}: extra state (MiB)", _fmt(value["extra_state_bytes"] / 2 ** 20, ".1f"), "", ""))
    if "error" in over:
        rows.append(("4 SAZO overhead", "overhead", "failed", "", ""))
    sampler, speed = results.get("sampler", {}), results.get("speed/smollm2", {})
    if "sazo_s" in sampler:
        for name in ("uniform", "sazo", "sumtree", "multinomial"):
            rows.append(("5 sampler", f"N=1e6 B=32: {name} (ms)", _fmt(sampler[f"{name}_s"] * 1e3, ".2f"), "", ""))
        if "default_s" in speed:
            share = 1 + (sampler["sazo_s"] - sampler["uniform_s"]) / speed["default_s"]
            same = sampler.get("run") == speed.get("run")    # a ratio is graded only when measured within one run
            rows.append(("4 SAZO overhead", "smollm2 N=1e6 B=32: 1 + sampler extra ÷ MeZO step"
                         + ("" if same else f" (sampler {sampler.get('run')}, step {speed.get('run')}: not one run)"),
                         _fmt(share, ".4f"), f"≤ {TARGETS['overhead']}" if same else "",
                         _verdict(share, TARGETS["overhead"]) if same else ""))
    elif "error" in sampler:
        rows.append(("5 sampler", "sampler", "failed", "", ""))
    state = results.get("sampler_state", {})
    for size in state.get("sizes", []):
        n = f"N={size['num_examples']:.0e} B={size['batch']}"
        for name in ("sazo", "sazo-plain"):
            r = size[name]
            rows.append(("5 sampler", f"{n}: {name} state bytes per example", _fmt(r["bytes_per_example"], ".2f"),
                         f"≤ {TARGETS['state_bytes_per_example']}",
                         _verdict(r["bytes_per_example"], TARGETS["state_bytes_per_example"])))
            rows.append(("5 sampler", f"{n}: {name} sample + update (ms)", _fmt(r["seconds"] * 1e3, ".3f"), "", ""))
            rows.append(("5 sampler", f"{n}: {name} max relative error of p vs float64 sums", _fmt(r["max_rel_error_p"], ".1e"), "", ""))
        rows.append(("5 sampler", f"{n}: uniform sample + update (ms)", _fmt(size["uniform"]["seconds"] * 1e3, ".3f"), "", ""))
    if "error" in state:
        rows.append(("5 sampler", "sampler_state", "failed", "", ""))
    return rows


def earlier_runs(results: dict) -> str:
    """A line naming the sections an earlier run measured (``--only`` merges a run's sections into another's
    results), each with that run's date, or '' when one run measured them all: the table's head gives this
    run's date, and their rows are not of it."""
    runs = {name: r["run"] for name, r in results.items() if isinstance(r, dict) and r.get("run")}
    latest = max(runs.values(), default=None)       # "YYYY-MM-DD HH:MM UTC" sorts by time
    earlier = {name: date for name, date in runs.items() if date != latest}
    if not earlier:
        return ""
    return (f"measured by earlier runs (their rows are of that run; the others of {latest}): "
            + ", ".join(f"{name} ({date})" for name, date in earlier.items()))


def format_table(rows: list[tuple]) -> str:
    lines = ["| section | quantity | value | target | met |", "|---|---|---|---|---|"]
    return "\n".join(lines + [f"| {' | '.join(map(str, row))} |" for row in rows])


def main(argv=None) -> dict:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.run", description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="smoke run (also when SAZO_FAST=1)")
    parser.add_argument("--out", default=None,
                        help="the results JSON (default benchmarks/results/bench.json; --quick: bench_quick.json, so that "
                             "a smoke run never replaces a full one), rewritten after every section")
    parser.add_argument("--only", nargs="+", default=None, metavar="SECTION",
                        help=f"rerun these sections and merge them into --out's earlier results: "
                             f"{', '.join(section_names(False))} (--quick: no smollm2 sections)")
    args = parser.parse_args(argv)
    quick = args.quick or os.environ.get("SAZO_FAST") == "1"
    started = time.perf_counter()
    default_out = RESULTS / ("bench_quick.json" if quick else "bench.json")
    out = Path(args.out) if args.out else default_out
    check_output(parser, "--out", out)
    unknown = sorted(set(args.only or ()) - set(section_names(quick)))
    if unknown:
        parser.error(f"argument --only: unknown section(s) {unknown}{' in a --quick run' if quick else ''} "
                     f"(sections: {', '.join(section_names(quick))})")
    previous = None
    if quick and not args.only:
        check_not_full(parser, "--out", out, lambda saved: saved["machine"]["quick"], default_out.name)
    if args.only and out.exists():     # the earlier run the sections are merged into: same kind of run only
        try:
            saved = json.loads(out.read_text())
            previous, was_quick = saved["results"], saved["machine"]["quick"]
        except (OSError, ValueError, KeyError, TypeError) as error:
            parser.error(f"argument --only: cannot merge into {out.name}: not a make bench results file "
                         f"({type(error).__name__}); rerun without --only or name another --out")
        if bool(was_quick) != quick:
            parser.error(f"argument --only: {out.name} holds a {'--quick' if was_quick else 'full'} run; "
                         f"merging {'--quick' if quick else 'full'} sections into it would mix the two in one table")
    out.parent.mkdir(parents=True, exist_ok=True)

    finished = []      # one entry per section this run saved: the rest is what a Ctrl-C leaves to do

    def save(results: dict) -> str:
        info = machine() | dict(quick=quick, seconds=round(time.perf_counter() - started, 1))
        table, note = format_table(table_rows(results)), earlier_runs(results)
        table += f"\n\n{note}" if note else ""
        write_text(out, json.dumps(dict(machine=info, table=table, results=results), indent=1,
                                  ensure_ascii=False, default=str))
        finished.append(True)       # once written: a Ctrl-C during the write leaves its section to do
        return table

    planned = [name for name in section_names(quick) if args.only is None or name in args.only]
    try:
        results = run_sections(quick, save, args.only, previous)
    except KeyboardInterrupt:
        left = planned[len(finished):]
        if not left:        # after the last section was saved
            print(f"\ninterrupted: every section is saved in {out}", file=sys.stderr, flush=True)
            raise SystemExit(130) from None
        cells = " (its finished cells are saved: the rerun resumes them)" if left[0] == "queries" and not quick else ""
        print(f"\ninterrupted in {left[0]}{cells}: the sections before it are saved in {out}; to finish the table:\n"
              f"  python -m benchmarks.run{' --quick' if quick else ''}"
              f"{'' if out == default_out else f' --out {out}'} --only {' '.join(left)}",
              file=sys.stderr, flush=True)
        raise SystemExit(130) from None
    table = save(results)
    info = machine() | dict(quick=quick, seconds=round(time.perf_counter() - started, 1))
    print(f"\nsazo-lite benchmarks, {info['date']}, {info['processor']}, {info['cpus']} CPUs, "
          f"torch {info['torch']}, {info['seconds']} s{' (quick)' if quick else ''}")
    if "table" in results.get("queries", {}):
        print("\nQueries to target (median [min–max] over seeds, best lr per method and target):\n"
              + results["queries"]["table"])
    print("\n" + table)
    print(f"\nwrote {out}")
    speed = results.get("speed/smollm2", {})
    if "default_ratio" in speed:
        print(engine_speed.breakdown(speed))
        warning = engine_speed.too_noisy(speed)
        if warning:
            print(warning, file=sys.stderr, flush=True)
        verdict, failed = engine_speed.step_verdict(speed, TARGETS["speed"])
        if failed:  # the step's cost is the one goal that fails the run: it is what every user pays
            raise SystemExit(verdict)
        print(verdict)
    return results


if __name__ == "__main__":
    main()

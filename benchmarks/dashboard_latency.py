"""Redraw latency of every dashboard in ``sazo_lite.course.widgets`` after a control change.

For each exported ``*_dashboard`` function: build it with no arguments, then move each
enabled slider / dropdown to a few new values (fractions ¼, ½, ¾ of its range, or every other
option) and time the assignment, which recomputes and redraws synchronously. The first visit
to a value is a cache miss, so these are honest "retrain and redraw" times; the final restore
of each control's starting value (a cache hit in dashboards that cache) is reported apart.
Wall time includes waiting for a core on a shared machine; CPU time of this process does not.

Dashboards that draw progressively (the race: each method's first seed, then all seeds)
show a change before the assignment returns: in Jupyter every finished draw reaches the page
at once. "first draw" is the time to the first figure update (a LiveFigure's new output, the end of a
FigureWidget ``batch_update``, or a readout change) after the assignment starts; the verdict uses it.

Run: ``python -m benchmarks.dashboard_latency [--only NAME] [--skip NAME] [--per-control]``; it prints the date
and the machine first (``benchmarks.cli.machine``), and writes no file.
Target for toy dashboards: median ≤ 200 ms on the 2-core teaching machine.
"""
from __future__ import annotations

import argparse
import contextlib
import os
import statistics
import time

import ipywidgets as widgets

import sazo_lite.course.widgets as dashboards
from benchmarks.cli import machine, measured_line

TARGET_MS = 200.0


def dashboard_functions(only: str | None = None, skip: list[str] | None = None) -> dict:
    """name → callable for every public ``*_dashboard`` in ``sazo_lite.course.widgets``."""
    names = [n for n in getattr(dashboards, "__all__", dir(dashboards)) if n.endswith("_dashboard")]
    keep = [n for n in sorted(names) if (only is None or only in n) and not any(s in n for s in skip or ())]
    return {n: getattr(dashboards, n) for n in keep}


def new_values(control) -> list:
    """A few values different from the control's current one."""
    if isinstance(control, (widgets.Dropdown, widgets.ToggleButtons, widgets.RadioButtons, widgets.SelectionSlider)):
        return [v for v in _options(control) if v != control.value]
    if isinstance(control, widgets.Checkbox):
        return [not control.value]
    if isinstance(control, widgets.FloatLogSlider):
        exponents = [control.min + f * (control.max - control.min) for f in (0.25, 0.5, 0.75)]
        values = [control.base ** (round(e / control.step) * control.step) for e in exponents]
    elif isinstance(control, (widgets.FloatSlider, widgets.IntSlider)):
        raw = [control.min + f * (control.max - control.min) for f in (0.25, 0.5, 0.75)]
        values = [type(control.value)(control.min + round((r - control.min) / control.step) * control.step)
                  for r in raw]
    else:
        return []
    return [v for v in dict.fromkeys(values) if v != control.value]


def _options(dropdown: widgets.Dropdown) -> list:
    return [o[1] if isinstance(o, tuple) else o for o in dropdown.options]


def watch_draws(dash) -> list[tuple[float, float]]:
    """A list that gets a (``perf_counter``, ``process_time``) stamp whenever the dashboard sends a
    figure or readout update."""
    stamps: list[tuple[float, float]] = []
    stamp = lambda _change=None: stamps.append((time.perf_counter(), time.process_time()))  # noqa: E731
    for figure in dash.figures.values():
        view = getattr(figure, "view", None)
        if isinstance(view, widgets.Output):  # a LiveFigure: each redraw replaces the view's output
            view.observe(stamp, names="outputs")
            continue
        if not hasattr(figure, "batch_update"):
            continue
        original = figure.batch_update

        @contextlib.contextmanager
        def stamped(original=original):
            with original():
                yield
            stamps.append((time.perf_counter(), time.process_time()))

        figure.batch_update = stamped
    if getattr(dash, "readout", None) is not None:
        dash.readout.observe(stamp, names="value")
    return stamps


def time_change(control, value, stamps: list | None = None) -> tuple[float, float, float, float]:
    """(wall ms, CPU ms, first-draw wall ms, first-draw CPU ms) to set ``control.value``.

    On a shared machine wall time includes waiting for a core; this process's CPU time does
    not, and is close to what an idle machine's wall time would be. Without a stamped draw
    the first draw counts as the whole wall time.
    """
    stamps = stamps if stamps is not None else []
    seen = len(stamps)
    wall, cpu = time.perf_counter(), time.process_time()
    control.value = value
    total, total_cpu = 1e3 * (time.perf_counter() - wall), 1e3 * (time.process_time() - cpu)
    if len(stamps) > seen:
        return total, total_cpu, 1e3 * (stamps[seen][0] - wall), 1e3 * (stamps[seen][1] - cpu)
    return total, total_cpu, total, total_cpu


def measure(build) -> dict:
    """Per-control lists of miss timings (new values) and hit timings (restoring the start)."""
    start = time.perf_counter()
    dash = build()
    results = {"build_ms": 1e3 * (time.perf_counter() - start), "misses": {}, "hits": []}
    stamps = watch_draws(dash)
    for name, control in dash.controls.items():
        if getattr(control, "disabled", False):
            continue
        original = control.value
        results["misses"][name] = [time_change(control, v, stamps) for v in new_values(control)]
        results["hits"].append(time_change(control, original, stamps))
    return results


def _summary(timings: list[tuple[float, float, float, float]]) -> str:
    wall, cpu, first, first_cpu = ([t[k] for t in timings] for k in range(4))
    return (f"first draw median {statistics.median(first):5.0f} ms (CPU {statistics.median(first_cpu):4.0f} ms) | "
            f"wall median {statistics.median(wall):5.0f} ms, max {max(wall):5.0f} ms | CPU median {statistics.median(cpu):5.0f} ms")


def report(name: str, results: dict, per_control: bool) -> None:
    misses = [t for times in results["misses"].values() for t in times]
    if not misses:   # every control disabled or of a kind new_values cannot move: nothing timed, no median to take
        print(f"{name:22s} build {results['build_ms']:6.0f} ms | no control change timed "
              f"(controls: {sorted(results['misses']) or 'none enabled'})")
        return
    verdict = "ok" if statistics.median(t[2] for t in misses) <= TARGET_MS else "over target"
    print(f"{name:22s} build {results['build_ms']:6.0f} ms | {len(misses):2d} changes: {_summary(misses)} "
          f"({verdict} by first draw; target ≤ {TARGET_MS:.0f} ms) | cached revisit wall median "
          f"{statistics.median(t[0] for t in results['hits']):4.0f} ms")
    if per_control:
        for control, times in results["misses"].items():
            if times:
                print(f"    {control:16s} {_summary(times)}")


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.dashboard_latency", description=__doc__.splitlines()[0])
    parser.add_argument("--only", help="only dashboards whose name contains this")
    parser.add_argument("--skip", action="append", default=[],
                        help="leave out dashboards whose name contains this (repeatable), e.g. --skip llm")
    parser.add_argument("--per-control", action="store_true", help="print each control's timings")
    args = parser.parse_args(argv)
    chosen = dashboard_functions(args.only, args.skip)
    if not chosen:      # else it measured nothing and printed nothing
        parser.error(f"--only {args.only!r} / --skip {args.skip} leave no dashboard of {sorted(dashboard_functions())}")
    print(f"dashboard_latency, {measured_line(machine())}", flush=True)   # timings are this machine's, at this time
    if hasattr(os, "getloadavg"):  # other work on the machine inflates wall times
        print(f"load average (1 min) at start: {os.getloadavg()[0]:.1f} on {os.cpu_count()} cores")
    for name, build in chosen.items():
        report(name, measure(build), args.per_control)


if __name__ == "__main__":
    main()

"""Notebook 05's dashboard: uniform MeZO, SAZO and the oracle race to a target loss.

The plot shows the optimality gap F(θ) − F(θ*) (relative to its start) against queries,
with a median line and a min–max band over seeds per method; the readout is a table of
queries to reach the target. Runs come from ``sazo_lite.course.sazo_runs.race``.
"""
from __future__ import annotations

import html
import math
import time
from collections.abc import Mapping
from dataclasses import replace

import numpy as np
import plotly.graph_objects as go
import ipywidgets as widgets
import torch

from ..config import pick
from ... import variance
from ...train import diverged
from ...validation import check_count, check_number
from ..sazo_runs import DIVERGE_FACTOR, PROBLEMS, SAMPLERS, RaceResult, first_divergence, gap_limit, make_problem, \
    pick_rate, race
from ._common import SAMPLER_COLORS as _COLORS, SAMPLER_FILLS as _FILLS, SAMPLER_LABELS as _LABELS, Dashboard, \
    LiveFigure, below_tiny_eps, captioned, divergence_note, int_slider, log_slider, presets, set_controls, \
    shown_on_error, slider

__all__ = ["race_dashboard", "race_figure", "race_table_html", "race_verdict", "race_divergence", "merge_results",
           "join_seeds", "PROBLEM_DEFAULTS"]

# What the dropdown sets when a problem is chosen: σ, B and each method's own learning rate.
# The rates are notebook 05's class-mode tuning (``sazo_runs.tune_lr``: best of its grid by
# median queries to 10 % of the initial gap, 3 tuning seeds, races 1–3's steps), so the
# dashboard opens on the careful races' rates; the notebook passes the rates its own run
# tuned (``lrs=``), and the "tune η per method" button re-tunes them for the current settings.
# One rate for all is not fair: the importance weights also rescale the per-example curvatures.
PROBLEM_DEFAULTS = {
    "heterogeneous quadratic": dict(heterogeneity=1.5, batch_size=4, lr_uniform=0.01, lr_sazo=0.01, lr_oracle=0.02),
    "homogeneous quadratic": dict(heterogeneity=0.0, batch_size=2, lr_uniform=0.01, lr_sazo=0.02, lr_oracle=0.04),
    "logistic regression (breast cancer)": dict(heterogeneity=0.0, batch_size=8, lr_uniform=0.1, lr_sazo=0.1,
                                                lr_oracle=0.1),
}
LR_CONTROLS = {method: f"lr_{method}" for method in SAMPLERS}
# as their sliders say; the plain rule (notebook 05's race against uniform) has no slider
_RATE_NAMES = {"uniform": "η uniform", "sazo": "η SAZO", "oracle": "η oracle", "sazo-plain": "η plain rule"}

_HETERO, _HOMOG = "heterogeneous quadratic", "homogeneous quadratic"
_BASE = dict(eps=1e-3, ema_decay=0.9, uniform_mix=0.1)


def _preset(problem: str, **changes) -> dict:
    """A complete regime: the problem's defaults, then the changes (earlier presets don't leak)."""
    return {"problem": problem, **_BASE, **PROBLEM_DEFAULTS[problem], **changes}


PRESETS = {
    "defaults": _preset(_HETERO),
    "ε too small": _preset(_HETERO, eps=1e-9),
    "homogeneous data": _preset(_HOMOG),
    "large batch": _preset(_HETERO, batch_size=32),
    "σ = 2.5, B = 1": _preset(_HETERO, heterogeneity=2.5, batch_size=1),
}


def _readable(result: RaceResult) -> RaceResult:
    """``result`` with numpy arrays for its queries and gaps (a hand-built one may hold lists), or a ValueError
    naming what a plot or table of it could not read: a method without a label, gaps not [seeds, log points]."""
    if not isinstance(result, RaceResult):   # (AttributeError: no attribute 'gaps')
        raise ValueError(f"Invalid result: {type(result).__name__} (expected a RaceResult, e.g. sazo_runs.race(...))")
    unknown = sorted((set(result.gaps) | set(result.to_target)) - set(_LABELS))
    if unknown:
        raise ValueError(f"Invalid result: methods {unknown} (expected among {tuple(_LABELS)})")
    queries = np.asarray(result.queries)
    gaps = {method: np.asarray(rows, dtype=np.float64) for method, rows in result.gaps.items()}
    for method, rows in gaps.items():
        if queries.ndim != 1 or rows.ndim != 2 or rows.shape[1] != len(queries):
            raise ValueError(f"Invalid result: gaps[{method!r}] of shape {rows.shape} for {queries.shape} queries "
                             "(expected [seeds, log points]: one gap per logged query)")
    return replace(result, queries=queries, gaps=gaps)


_CEILING = 1e3  # relative gaps above this (a diverging run) are drawn at it, to keep the axis readable


def _band(result: RaceResult, method: str, upto: int | None = None) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Median, min and max over seeds of the relative gap, capped at ``_CEILING``, over the first ``upto`` log
    points (None: all; a run still training has logged only those).

    A run stopped on a non-finite loss has NaN after its stop (``RaceResult``): it counts as above every other seed
    there (at the ceiling), as in notebook 06, not as absent (the median of the seeds still running read as the
    median of all)."""
    relative = result.gaps[method][:, :upto] / result.initial_gap                  # [S, T]
    relative = np.minimum(np.where(np.isnan(relative), np.inf, relative), _CEILING)
    return np.median(relative, 0), relative.min(0), relative.max(0)


def _band_xy(queries: np.ndarray, low: np.ndarray, high: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """A closed polygon (upper edge left→right, lower edge right→left) for fill='toself'."""
    keep = np.isfinite(low) & np.isfinite(high)
    q, low, high = queries[keep], low[keep], high[keep]
    return np.concatenate([q, q[::-1]]), np.concatenate([high, low[::-1]])


def _empty_race_figure(methods=SAMPLERS, widget: bool = True, **layout):
    figure_class = LiveFigure if widget else go.Figure
    # 660 px fits the book's column with the legend below the plot (beside it, a legend was clipped); the
    # title starts at the left, clear of the modebar (top right).
    fig = figure_class(layout=dict(height=460, width=660, margin=dict(l=60, r=20, t=50, b=50),
                                   legend=dict(orientation="h", x=0, y=-0.18, yanchor="top"), **layout))
    fig.update_layout(title=dict(x=0.01, xanchor="left", font=dict(size=14)))
    for method in methods:
        fig.add_scatter(name=f"{_LABELS[method]} (min–max)", mode="lines", fill="toself",
                        fillcolor=_FILLS[method], line=dict(width=0), hoverinfo="skip", showlegend=False)
        fig.add_scatter(name=_LABELS[method], mode="lines", line=dict(color=_COLORS[method], width=2))
    fig.add_scatter(name="target", mode="lines", line=dict(color="black", dash="dash", width=1))
    fig.update_xaxes(title="queries (2·B per step)")
    fig.update_yaxes(type="log", title="gap (F(θ) − F(θ*)) / initial gap")
    return fig


def _draw_race(fig, result: RaceResult, methods=SAMPLERS, logged: dict[str, int] | None = None) -> None:
    """Draw ``methods``' bands and medians; a method missing from ``result`` is left blank (still running).

    ``logged``: method → how many of its row's entries exist yet (a run still training: the rest is NaN).
    """
    if not result.initial_gap > 0:     # the plot's gaps are fractions of it
        raise ValueError(f"Invalid result: initial_gap {result.initial_gap!r} (expected > 0; the race plots each gap "
                         "as a fraction of it, and at 0 θ₀ is already a minimiser)")
    q = result.queries
    with fig.batch_update():
        for k, method in enumerate(methods):
            if method not in result.gaps:
                fig.data[2 * k].update(x=[], y=[])
                fig.data[2 * k + 1].update(x=[], y=[])
                continue
            # a run still training: NaN (a gap in the line) after the log points it reached
            median, low, high = (np.pad(part, (0, len(q) - len(part)), constant_values=np.nan)
                                 for part in _band(result, method, (logged or {}).get(method)))
            fig.data[2 * k].update(dict(zip("xy", _band_xy(q, low, high))))
            fig.data[2 * k + 1].update(x=q, y=median)
        ratio = result.target / result.initial_gap
        fig.data[2 * len(methods)].update(x=[q[0], q[-1]], y=[ratio, ratio])
        _frame_race(fig, result, methods, ratio, logged or {})


_TOP = 3.0  # the y axis ends at 3× the initial gap: a race is decided below 1, a diverging run is marked


def _frame_race(fig, result: RaceResult, methods, ratio: float, logged: dict[str, int]) -> None:
    """Fit the y axis to where the race is decided (from below the target to _TOP) and mark each method
    whose median run diverged (``sazo_runs.first_divergence``) at the first query it did (of those logged yet)."""
    medians = {m: _band(result, m, logged.get(m))[0] for m in methods if m in result.gaps}
    finite = [v for median in medians.values() for v in median[np.isfinite(median)] if v > 0]
    low = min([ratio, *finite]) / 2 if finite else ratio / 2
    fig.update_yaxes(range=[float(np.log10(low)), float(np.log10(_TOP))])
    marks, limit = [], gap_limit(1.0)   # the course's divergence rule at DIVERGE_FACTOR × the start (1 here)
    for method, median in medians.items():
        above = next((k for k, gap in enumerate(median.tolist()) if diverged(gap, limit)), None)
        if above is not None:                # NaN (every seed diverged) counts as diverged
            marks.append(dict(x=float(result.queries[above]), y=float(np.log10(_TOP)), yref="y", xref="x",
                              text=f"{_LABELS[method]} diverged", showarrow=True, arrowhead=2, ay=-25,
                              font=dict(color=_COLORS[method], size=11)))
    fig.layout.annotations = marks


def race_figure(result: RaceResult, title: str = "") -> go.Figure:
    """A static race plot of a ``RaceResult`` (median lines and min–max bands over seeds)."""
    result = _readable(result)
    methods = tuple(m for m in _LABELS if m in result.gaps)
    fig = _empty_race_figure(methods, widget=False, title=title)
    _draw_race(fig, result, methods)
    return fig


def _format_queries(value: float) -> str:
    return "not reached" if not np.isfinite(value) else f"{value:,.0f}"


def _uniform_floor(result: RaceResult) -> float:
    """What uniform's median queries to target is at least when it is not finite: its seeds with each miss counted
    at the run's last query (a miss gets there later, if ever). With an even number of seeds the median is the
    mean of the middle two: [100, miss] within 1,000 queries is above 550, not above 1,000."""
    return float(np.median([result.queries[-1] if q is None else q for q in result.to_target["uniform"]]))


def _format_speedup(result: RaceResult, method: str) -> str:
    """"2.50×"; "> 3.1× (lower bound)" when uniform does not get there within the run."""
    speedup = result.speedup(method)
    if np.isnan(speedup):
        return "—"
    if np.isinf(speedup):
        return f"> {_uniform_floor(result) / result.median_to_target(method):.1f}× (lower bound)"
    return f"{speedup:.2f}×"


def _lower_bounds(result: RaceResult) -> bool:
    """Whether some method reached the target where uniform did not (its speed-up then a lower bound)."""
    return any(np.isinf(result.speedup(m)) for m in result.to_target if m != "uniform")


def race_verdict(result: RaceResult) -> str:
    """One plain sentence on a race: each method's speed-up over uniform, lower bounds said so.

    Example:
        >>> from sazo_lite.course.sazo_runs import make_problem, race
        >>> "uniform MeZO" in race_verdict(race(make_problem(num_examples=16, dim=3), seeds=(0,), steps=20))
        True
    """
    result = _readable(result)
    if "uniform" not in result.to_target:
        raise ValueError(f"Invalid result: no uniform run to compare with (methods {list(result.to_target)})")
    goal = _goal(result)
    uniform = result.median_to_target("uniform")
    others = [m for m in result.to_target if m != "uniform"]
    if not np.isfinite(uniform):
        reached = sum(q is not None for q in result.to_target["uniform"])
        bounds = ", so each speed-up is a lower bound" if _lower_bounds(result) else ""
        head = (f"uniform MeZO did not reach {goal} within {int(result.queries[-1]):,} "
                f"queries (median over seeds; {reached}/{len(result.to_target['uniform'])} seeds did){bounds}")
    else:
        head = f"uniform MeZO reached {goal} in {uniform:,.0f} queries (median)"
    parts = []
    for method in others:
        speedup, needed = result.speedup(method), result.median_to_target(method)
        if np.isnan(speedup):
            parts.append(f"{_LABELS[method]} did not reach it" + ("" if np.isfinite(uniform) else " either"))
        elif np.isinf(speedup):
            parts.append(f"{_LABELS[method]} needed {needed:,.0f}: > {_uniform_floor(result) / needed:.1f}× fewer")
        elif speedup >= 1:
            parts.append(f"{_LABELS[method]} needed {needed:,.0f}: {speedup:.2f}× fewer")
        else:
            parts.append(f"{_LABELS[method]} needed {needed:,.0f}: {1 / speedup:.2f}× uniform's queries (slower)")
    return head + "".join(f"; {part}" for part in parts) + "."   # a race of uniform alone: its head only


def race_divergence(result: RaceResult, batch_size: int, eps: float | None = None) -> str:
    """The crimson sentences for the methods whose runs diverged ("" if none): in how many seeds, from which
    step (the first log point at which a seed's gap was above ``DIVERGE_FACTOR`` × its start, or not finite),
    at which η, and the fix (``eps``: the runs' ε, for the advice at a tiny ε).

    Example:
        >>> from sazo_lite.course.sazo_runs import make_problem, race
        >>> "lower η SAZO" in race_divergence(race(make_problem(num_examples=16, dim=3), samplers=("sazo",), seeds=(0,),
        ...                                        steps=40, lr=1.0), batch_size=1)
        True
    """
    check_count("batch_size", batch_size)
    below_tiny_eps(eps)   # refuses an ε no run can have, diverged or not
    result = _readable(result)
    notes = []
    for method in (m for m in _LABELS if m in result.gaps):
        starts = [first_divergence(row) for row in result.gaps[method]]
        steps = [int(result.queries[i]) // (2 * batch_size) for i in starts if i is not None]
        if not steps:
            continue
        seeds = len(starts)
        which = ("its one seed" if seeds == 1 else "both its seeds" if seeds == len(steps) == 2 else
                 f"all {seeds} of its seeds" if seeds == len(steps) else f"{len(steps)} of its {seeds} seeds")
        when = f"by step {min(steps)}" + (" in the earliest" if len(steps) > 1 else "")
        notes.append(divergence_note(
            f"{_LABELS[method]} diverged in {which}",
            f"its gap passed {DIVERGE_FACTOR:g}× its start or stopped being finite {when}",
            _RATE_NAMES[method], result.lrs.get(method, float("nan")), eps=eps))
    return "".join(notes)


def _what_to_raise(result: RaceResult, eps: float | None = None) -> str:
    """The advice when no method reached the target: at ε below ``TINY_EPS`` a larger ε first (what the red
    notes say: the differences are rounding, and no η helps); a diverged method needs a lower η, not a higher one."""
    if below_tiny_eps(eps):
        return f"at ε = {eps:.1g} the loss differences are float32 rounding: raise ε (1e-3 is safe here) first"
    failed = [m for m in (m for m in _LABELS if m in result.gaps)
              if any(first_divergence(row) is not None for row in result.gaps[m])]
    if not failed:
        return "raise the rate or the steps"
    if len(failed) == len(result.gaps):
        return "every method diverged: lower the rates"
    names = ", ".join(_LABELS[m] for m in failed)
    return f"{names} diverged: lower {'its' if len(failed) == 1 else 'their'} η; raise the others' η or the steps"


def _goal(result: RaceResult) -> str:
    """The target in words: "10% of the initial gap", or the gap itself where the initial gap is not positive
    (θ₀ already a minimiser: no fraction of it to print)."""
    if result.initial_gap > 0:
        return f"{result.target / result.initial_gap:.0%} of the initial gap"
    return f"a gap of {result.target:.3g} (the initial gap is {result.initial_gap:.3g}: θ₀ is already a minimiser)"


def race_table_html(result: RaceResult, eps: float | None = None) -> str:
    """An HTML table: median queries to target per method, the speed-up over uniform, seeds that got there.

    ``eps``: the runs' ε, for the advice when no method reached the target (at a tiny ε: raise it).
    """
    result = _readable(result)
    rows = []
    for method in (m for m in _LABELS if m in result.to_target):
        reached = sum(q is not None for q in result.to_target[method])
        speedup = _format_speedup(result, method) if "uniform" in result.to_target else "—"
        rows.append(f"<tr><td>{html.escape(_LABELS[method])}</td>"
                    f"<td>{_format_queries(result.median_to_target(method))}</td>"
                    f"<td>{speedup}</td>"
                    f"<td>{reached}/{len(result.to_target[method])}</td></tr>")
    head = ("<tr><th>method</th><th>median queries to target</th><th>fewer than uniform</th>"
            "<th>seeds reaching it</th></tr>")
    note = ""
    if "uniform" in result.to_target and not np.isfinite(result.median_to_target("uniform")):
        why = "the “&gt;” speed-ups are lower bounds" if _lower_bounds(result) else f"no method did ({_what_to_raise(result, eps)})"
        note = (f"<div style='color:#a33'>uniform MeZO did not reach the target within "
                f"{int(result.queries[-1]):,} queries: {why}.</div>")
    # two statistics a student may read as one: the median of the seeds' first crossings (here) and the query
    # at which the plot's median curve crosses (later when seeds cross at different times and bounce back)
    scope = ("<div style='color:#555'>the median over seeds of the query where each seed first reaches it; "
             "the plot's line, the median gap at each query, can cross later</div>")
    return (f"<div><b>Queries to reach {html.escape(_goal(result))}</b>{scope}"
            f"<table style='border-collapse:collapse' cellpadding='4'>{head}{''.join(rows)}</table>{note}</div>")


def _same_race(parts: list[RaceResult]) -> RaceResult:
    """The first of ``parts``, or a ValueError when they are not parts of one race: another query grid, or another
    starting gap or target (another problem, or another target fraction: its queries to target mean another thing)."""
    if not parts:
        raise ValueError("Invalid parts: expected at least one RaceResult")
    first = parts[0]
    for part in parts:
        if not np.array_equal(part.queries, first.queries):
            raise ValueError("Invalid parts: races must share one query grid")
        if not (math.isclose(part.initial_gap, first.initial_gap, rel_tol=1e-9)
                and math.isclose(part.target, first.target, rel_tol=1e-9)):
            raise ValueError(f"Invalid parts: initial gaps/targets {part.initial_gap:.6g}/{part.target:.6g} and "
                             f"{first.initial_gap:.6g}/{first.target:.6g} (expected one problem and one target)")
    return first


def merge_results(parts: list[RaceResult]) -> RaceResult:
    """Join races run one method at a time on the same problem and query grid."""
    first = _same_race(parts)
    gaps, to_target = {}, {}
    for part in parts:
        twice = sorted(set(part.gaps) & set(gaps))
        if twice:   # the later part's runs replaced the earlier's without a word
            raise ValueError(f"Invalid parts: {twice} raced in two parts (expected each method once; "
                             "join_seeds joins one method's seeds)")
        gaps.update(part.gaps)
        to_target.update(part.to_target)
    lrs = {m: lr for part in parts for m, lr in part.lrs.items()}
    return RaceResult(queries=first.queries, gaps=gaps, initial_gap=first.initial_gap,
                      target=first.target, to_target=to_target, lrs=lrs)


def join_seeds(parts: list[RaceResult]) -> RaceResult:
    """Join races of the same methods run one seed (or seed group) at a time."""
    first = _same_race(parts)
    if any(set(part.gaps) != set(first.gaps) for part in parts):
        raise ValueError("Invalid parts: races must share one query grid and one set of methods")
    if any(part.lrs != first.lrs for part in parts):   # the joined race named the first part's rates for all
        raise ValueError(f"Invalid parts: rates {[part.lrs for part in parts]} (expected the same rates: join_seeds "
                         "joins seeds of one setting)")
    gaps = {m: np.concatenate([part.gaps[m] for part in parts]) for m in first.gaps}
    to_target = {m: [q for part in parts for q in part.to_target[m]] for m in first.to_target}
    return RaceResult(queries=first.queries, gaps=gaps, initial_gap=first.initial_gap, target=first.target,
                      to_target=to_target, lrs=dict(first.lrs))


# -- the dashboard ---------------------------------------------------------------------------

class _Watched:
    """A problem whose ``gap`` evaluations (``race``'s: θ₀'s, then one per log point) also go to ``seen``."""

    def __init__(self, problem, seen) -> None:
        self._problem, self._seen = problem, seen

    def __getattr__(self, name):
        return getattr(self._problem, name)

    def gap(self, theta) -> float:
        value = self._problem.gap(theta)
        self._seen(float(value))
        return value


def _query_grid(steps: int, batch_size: int, log_every: int) -> np.ndarray:
    """The queries ``sazo_runs.race`` logs the gap at (θ₀, every ``log_every`` steps, the last step)."""
    logged = [s for s in range(1, steps + 1) if s % log_every == 0 or s == steps]
    return 2 * batch_size * np.asarray([0] + logged)


def _controls(problem: str) -> dict[str, widgets.Widget]:
    defaults = PROBLEM_DEFAULTS[problem]
    dropdown = widgets.Dropdown(options=PROBLEMS, value=problem, description="problem",
                                layout=dict(width="470px"), style=dict(description_width="150px"))
    return {
        "problem": dropdown,
        "eps": log_slider("ε", _BASE["eps"], -10, 0),
        "ema_decay": slider("EMA decay β", _BASE["ema_decay"], 0.0, 0.995, 0.005),
        "batch_size": int_slider("batch size B", defaults["batch_size"], 1, 64),
        "lr_uniform": log_slider("η uniform", defaults["lr_uniform"], -4, 0),
        "lr_sazo": log_slider("η SAZO", defaults["lr_sazo"], -4, 0),
        "lr_oracle": log_slider("η oracle", defaults["lr_oracle"], -4, 0),
        "uniform_mix": slider("uniform mix λ", _BASE["uniform_mix"], 0.01, 1.0, 0.01),
        "heterogeneity": slider("heterogeneity σ", defaults["heterogeneity"], 0.0, 2.5, 0.1),
    }


_QUESTIONS = {
    "problem": "On which problem does SAZO gain most — and does it ever lose to uniform?",
    "eps": "θ is float32: below which ε does sampling stop mattering? At ε = 1e-9 (the preset) a run either stalls "
           "or jumps: why, when f(θ+εz) and f(θ−εz) differ only by rounding?",
    "ema_decay": "Does a larger β help SAZO late in the race? (Its decay grows with each example's count "
                 "up to β, notebook 04: β near 1 only matters for examples seen dozens of times.)",
    "batch_size": "Per query, does a bigger batch help uniform or SAZO more?",
    "lr_uniform": "Each method has its own η: raise uniform's. Does it catch SAZO, or diverge first?",
    "lr_sazo": "Raise SAZO's η step by step: does its band blow up before uniform's would at the same η?",
    "lr_oracle": "Set all three η equal: who is the equal rate fair to?",
    "uniform_mix": "λ bounds the weights by 1/λ: what happens to SAZO's band as λ → 0.01?",
    "heterogeneity": "How does the oracle's lead over uniform grow with σ (compare with 1 + CV²)?",
}

_SAZO_ONLY = ("ema_decay", "uniform_mix")
_GRID = (0.25, 0.5, 1.0, 2.0, 4.0)  # "tune η": multiples of the current rate



def race_dashboard(*, problem: str = "heterogeneous quadratic", num_examples: int = 64, dim: int = 5,
                   seeds: int | None = None, steps: int | None = None, lrs: dict[str, float] | None = None,
                   log_every: int = 10, target_fraction: float = 0.1, dtype: torch.dtype = torch.float32,
                   cache_size: int = 192, live_after: float | None = 0.1) -> Dashboard:
    """Uniform MeZO vs SAZO vs the oracle: gap against queries with seed bands, live.

    Each method has its own learning rate (defaults tuned per problem, see ``PROBLEM_DEFAULTS``;
    the "tune η per method" button re-tunes them for the current settings). A change draws
    the first seed of every method that must rerun as soon as it is done, then the other seeds;
    while a first seed trains, its curve is drawn as far as it got ``live_after`` seconds into
    the change and every 3 × ``live_after`` s after (a run of hundreds of steps takes longer
    than a slider's answer should).

    Args:
        problem: the initial entry of ``sazo_lite.course.sazo_runs.PROBLEMS``.
        num_examples, dim: N and d of the quadratics (the logistic regression has its own).
        seeds: seeds per method (default 3; 2 under ``SAZO_FAST=1``).
        steps: steps per run (default 200; 100 under ``SAZO_FAST=1``).
        lrs: method → learning rate to open with (e.g. a tuned race's ``result.lrs``), instead
            of ``PROBLEM_DEFAULTS``; the opening headline then agrees with that race, and the
            presets on the opening problem keep these rates.
        dtype: θ's dtype (float32, as in a language model: a tiny ε shows its rounding).
        log_every: steps between evaluations of the gap.
        target_fraction: the table's target, as a fraction of the initial gap.
        cache_size: runs kept (one method, one seed each); a method's runs are keyed only by
            the controls it depends on, so moving β or λ retrains SAZO alone.
        live_after: seconds into a change before a training first seed's partial curve is
            drawn (None: draw finished seeds only).

    Returns:
        A ``Dashboard`` with figure "race" and an HTML queries-to-target table as readout;
        ``dash.stages`` counts the draws of the last change (the partial ones included);
        ``dash.result()`` is the ``RaceResult`` on screen.

    Example:
        >>> dash = race_dashboard(seeds=1, steps=20)
        >>> dash.controls["problem"].value = "homogeneous quadratic"
    """
    if problem not in PROBLEM_DEFAULTS:
        raise ValueError(f"Invalid problem: {problem!r} (expected one of {tuple(PROBLEM_DEFAULTS)})")
    seeds = tuple(range(check_count("seeds", seeds) if seeds is not None else pick(3, 2)))
    steps = check_count("steps", steps) if steps is not None else pick(200, 100)
    check_count("log_every", log_every)
    check_count("cache_size", cache_size)     # the runs on screen are cached too
    if live_after is not None:
        check_number("live_after", live_after, 0.0)
    if lrs is not None and not isinstance(lrs, Mapping):   # -1 raised "not iterable"; 0.0 read as no rates
        raise ValueError(f"Invalid lrs: {lrs!r} (expected a dict method → rate, e.g. a tuned race's result.lrs)")
    unknown = set(lrs or {}) - set(LR_CONTROLS)
    if unknown:
        raise ValueError(f"Invalid lrs: {sorted(unknown)} (expected methods among {tuple(LR_CONTROLS)})")
    controls = _controls(problem)
    for method, rate in (lrs or {}).items():
        control = controls[LR_CONTROLS[method]]
        # a rate off the slider would be cut to its end without a word, and the opening race not the one asked for
        control.value = check_number(f"lrs[{method!r}]", rate, control.base ** control.min, control.base ** control.max)
    figures = {"race": _empty_race_figure(title="Gap against queries")}
    readout = widgets.HTML()
    status = widgets.HTML()
    problems, runs, hold = {}, {}, [False]
    draws, shown = [0], [None]
    figure_result = [None]   # the result the figure was last drawn from (a partial one while runs train)

    def current_problem(values: dict):
        name, sigma = values["problem"], values["heterogeneity"]
        if (name, sigma) not in problems:
            problems[(name, sigma)] = make_problem(name, heterogeneity=sigma, num_examples=num_examples, dim=dim)
        return problems[(name, sigma)]

    def gains(values: dict) -> str:
        """1 + CV² of the norms at θ₀ and at θ*: what the σ caption asks to compare the oracle's lead with."""
        problem = current_problem(values)
        start, end = (variance.uniform_gain(problem.norms(theta)) for theta in (problem.initial_theta(), problem.optimum))
        return (f"<div style='color:#555'>σ = {values['heterogeneity']:.1f}: 1 + CV² of the norms (the oracle's most "
                f"possible gain at B = 1) is {start:.2f} at θ₀ and {end:.2f} at θ*</div>")

    def run_key(method: str, values: dict, seed: int) -> tuple:
        relevant = {k: v for k, v in values.items()
                    if (method == "sazo" or k not in _SAZO_ONLY) and (not k.startswith("lr_") or k == LR_CONTROLS[method])}
        return method, seed, tuple(sorted(relevant.items()))

    def run_method(method: str, values: dict, seed: int, seen=None) -> RaceResult:
        key = run_key(method, values, seed)
        if key not in runs:
            if len(runs) >= cache_size:
                runs.pop(next(iter(runs)))  # oldest first
            problem = current_problem(values) if seen is None else _Watched(current_problem(values), seen)
            runs[key] = race(problem, samplers=(method,), seeds=(seed,), steps=steps,
                             batch_size=values["batch_size"], lr=values[LR_CONTROLS[method]], eps=values["eps"],
                             ema_decay=values["ema_decay"], uniform_mix=values["uniform_mix"],
                             log_every=log_every, target_fraction=target_fraction, dtype=dtype)
        return runs[key]

    def draw(values: dict, result: RaceResult, final: bool, logged: dict[str, int] | None = None,
             coming: tuple[str, ...] = ()) -> None:
        """``coming``: the stale methods not trained yet (what a partial draw of one seed waits for)."""
        if final:
            title = f"{values['problem']}: gap against queries ({len(seeds)} seed{'s' if len(seeds) > 1 else ''})"
        elif logged:
            title = f"{values['problem']}: {_LABELS[next(iter(logged))]} training…"
        elif len(seeds) > 1:
            title = f"{values['problem']}: first seed… (more seeds coming)"
        else:
            title = f"{values['problem']}: {', '.join(_LABELS[m] for m in coming)} still training…"
        with figures["race"].batch_update():   # one redraw
            _draw_race(figures["race"], result, logged=logged)
            figures["race"].layout.title.text = title
        figure_result[0] = result
        if final:
            readout.value = (race_divergence(result, values["batch_size"], values["eps"])
                             + race_table_html(result, values["eps"]) + gains(values))
            shown[0] = result
        draws[0] += 1

    def current_values() -> dict:
        values = {name: control.value for name, control in controls.items()}
        if values["problem"] == _HOMOG:
            values["heterogeneity"] = 0.0  # σ is fixed by the problem's definition
        return values

    def so_far(values: dict, done: list[str]) -> list[RaceResult]:
        """The finished methods' runs: every seed run yet (at least the first)."""
        return [join_seeds([run_method(m, values, s) for s in seeds if s == seeds[0] or run_key(m, values, s) in runs])
                for m in SAMPLERS if m in done]

    def watch(values: dict, method: str, done: list[str], due: list[float]):
        """What ``race`` calls with each gap of ``method``'s first seed: draws the curve so far when due."""
        grid = _query_grid(steps, values["batch_size"], log_every)
        row = []

        def seen(gap: float) -> None:
            row.append(gap)
            if time.perf_counter() >= due[0] and 1 < len(row) < len(grid):
                gaps = np.full((1, len(grid)), np.nan)
                gaps[0, :len(row)] = row
                initial = row[0]
                running = RaceResult(queries=grid, gaps={method: gaps}, initial_gap=initial,
                                     target=target_fraction * initial, to_target={method: [None]})
                draw(values, merge_results(so_far(values, done) + [running]), final=False, logged={method: len(row)})
                due[0] = time.perf_counter() + 3 * live_after
        return seen

    def refresh() -> None:
        try:
            redraw()
        except BaseException:   # an interrupted kernel or a failed run: the title said "training…" for good
            if draws[0] and shown[0] is not figure_result[0]:   # a partial draw of this change is on screen
                figures["race"].layout.title.text = (f"{current_values()['problem']}: stopped before every run "
                                                     "finished (the plot shows the runs done; the table is the "
                                                     "last finished race's)")
            raise

    def redraw() -> None:
        values, draws[0] = current_values(), 0
        due = [time.perf_counter() + (live_after if live_after is not None else np.inf)]
        stale = [m for m in SAMPLERS if any(run_key(m, values, s) not in runs for s in seeds)]
        done = [m for m in SAMPLERS if m not in stale]
        for k, method in enumerate(stale):
            # Progressive: draw each stale method's first seed as it trains and once it is done
            # (other stale methods blank meanwhile), then all seeds. Jupyter shows each draw at once.
            run_method(method, values, seeds[0], watch(values, method, done, due))
            done.append(method)
            coming = tuple(stale[k + 1:])
            if len(seeds) > 1 or coming:   # with one seed the last method's draw is the final one
                draw(values, merge_results(so_far(values, done)), final=False, coming=coming)
        result = merge_results([join_seeds([run_method(m, values, s) for s in seeds]) for m in SAMPLERS])
        draw(values, result, final=True)
        status.value = " ".join(f"η {_LABELS[m]} = {values[LR_CONTROLS[m]]:.2g};" for m in SAMPLERS)

    def on_change(_change) -> None:
        if not hold[0]:
            refresh()

    def on_problem(change) -> None:
        controls["heterogeneity"].disabled = change["new"] == _HOMOG
        if not hold[0]:  # a preset sets its own values and redraws once
            set_controls(controls, PROBLEM_DEFAULTS[change["new"]], refresh, hold)

    def tune(_button=None) -> None:
        """Each method's best rate among ``_GRID`` × its current rate that its slider can hold (``pick_rate``:
        queries to target, then final gap). The grid's runs go through the run cache: the current rate's are
        not run again, and the redraw at the chosen rates trains nothing. The status line counts the runs."""
        values = current_values()
        grids = {}
        for method in SAMPLERS:
            control = controls[LR_CONTROLS[method]]
            low, high = control.base ** control.min, control.base ** control.max
            grids[method] = [rate for rate in (values[LR_CONTROLS[method]] * f for f in _GRID) if low <= rate <= high]
        todo = [(m, {**values, LR_CONTROLS[m]: rate}, s) for m in SAMPLERS for rate in grids[m] for s in seeds]
        todo = [job for job in todo if run_key(*job) not in runs]
        try:
            for k, (method, job_values, seed) in enumerate(todo):   # a class-mode tuning trains for tens of seconds
                status.value = f"tuning η per method… {k}/{len(todo)} runs ({_LABELS[method]})"
                run_method(method, job_values, seed)
        except BaseException:   # an interrupted kernel or a failed run: the line said "tuning…" for good
            status.value = (f"tuning η per method stopped after {k}/{len(todo)} runs; the rates are unchanged "
                            "(press the button again: finished runs are kept)")
            raise
        best = {}
        for method in SAMPLERS:
            name = LR_CONTROLS[method]
            best[name] = pick_rate({rate: join_seeds([run_method(method, {**values, name: rate}, s) for s in seeds])
                                    for rate in grids[method]}, method)
        set_controls(controls, best, refresh, hold)

    controls["problem"].observe(shown_on_error(on_problem, readout), names="value")
    for name, control in controls.items():
        if name != "problem":
            control.observe(shown_on_error(on_change, readout), names="value")
    controls["heterogeneity"].disabled = problem == _HOMOG
    tune_button = widgets.Button(description="tune η per method", layout=widgets.Layout(width="auto"),
                                 tooltip="best of ¼×, ½×, 1×, 2×, 4× each method's current η within its slider: "
                                         "4 new runs per method and seed (the status line counts them)")
    tune_button.on_click(shown_on_error(tune, readout))
    opening = {name: control.value for name, control in controls.items()}
    # a preset on the opening problem keeps the rates given in ``lrs`` (the "defaults" button's): with the problem's
    # default rates, "ε too small" also changed every η, and its race was not the opening one with a smaller ε
    given = {LR_CONTROLS[method]: opening[LR_CONTROLS[method]] for method in (lrs or {})}
    choices = {"defaults": opening, **{label: {**values, **(given if values["problem"] == problem else {})}
                                       for label, values in PRESETS.items() if label != "defaults"}}
    rows = [presets(choices, controls, shown_on_error(refresh, readout), hold, complete=False)]  # complete regimes
    rows += [captioned(control, _QUESTIONS[name]) for name, control in controls.items()]
    rows += [widgets.HBox([tune_button, status])]
    dash = Dashboard("The race: queries to reach a target loss", rows, controls, figures, refresh, readout)
    dash.tune = tune
    dash.stages = draws
    dash.result = lambda: shown[0]
    refresh()
    return dash

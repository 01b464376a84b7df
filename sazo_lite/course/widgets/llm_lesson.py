"""Notebook 06's figures: one stored race (``sazo_lite.course.llm_lesson.Race``) drawn where it is decided.

Every figure has one line per sampler at its chosen rate, in the course's palette, a legend and axis
titles; a run stopped by the divergence rule (F > 1.5·F₀) is a cross at the top of the loss axis, not a
spike. ``show(fig)`` displays a figure at most 680 px wide (the book's column) with its title at the left,
clear of plotly's toolbar (top right; the book puts it in a strip above the figure).
"""
from __future__ import annotations

import math
import statistics

import plotly.graph_objects as go

from ..llm_lesson import DIVERGE_FACTOR, Race, turn
from ...validation import check_count, check_number
from ._common import SAMPLER_COLORS, SAMPLER_FILLS, SAMPLER_LABELS, number_list, off_log_axes, require_keys, \
    same_lengths

__all__ = ["show", "gain_figure", "race_figure", "walk_figure", "loss_vs_walk_figure", "scores_figure",
           "scores_vs_norms_figure", "WIDTH"]

WIDTH = 660          # px: the book's column is 680
_MARGIN = dict(l=60, r=15, t=50, b=50)
_LEGEND = dict(orientation="h", yanchor="top", y=-0.2, x=0)


def show(fig: go.Figure) -> None:
    """Display ``fig`` with its zoom/pan toolbar, the title anchored at the left edge (clear of the toolbar)."""
    fig.update_layout(title_x=0, title_xanchor="left")
    fig.show()


def _layout(fig: go.Figure, title: str, x: str, y: str, height: int = 400) -> go.Figure:
    fig.update_layout(width=WIDTH, height=height, title=title, xaxis_title=x, yaxis_title=y, margin=_MARGIN,
                      legend=_LEGEND, template="plotly_white")
    return fig


def _name(race: Race, k: str) -> str:
    return f"{SAMPLER_LABELS.get(k, k)}, η = {race.chosen_lr[k]:.3g}"


def gain_figure(sets: dict[str, tuple[float, float]], batch_sizes=(1, 2, 4, 8, 16, 32)) -> go.Figure:
    """The oracle's predicted gain against B, [V(u) + (B−1)‖∇F‖²] / [V(p*) + (B−1)‖∇F‖²], in units of V(p*):
    one line per label → (V(u)/V(p*), ‖∇F‖²/V(p*)).

    Example:
        >>> [round(y, 2) for y in gain_figure({"aligned": (6.0, 0.55)}, (1, 4)).data[0].y]
        [6.0, 2.89]
    """
    batch_sizes = [check_count("batch_sizes", b) for b in batch_sizes]
    if not sets or not batch_sizes:
        raise ValueError(f"Invalid sets/batch_sizes: {sets!r}, {batch_sizes!r} (expected at least one of each)")
    for label, (v_u, g2) in sets.items():   # ratios of variances: ‖∇F‖² < 0 could divide by 0
        check_number(f"V(u)/V(p*) of {label!r}", v_u, 1.0)   # p* minimises V: no p, uniform included, has less
        check_number(f"‖∇F‖²/V(p*) of {label!r}", g2, 0.0)
        if g2 > 1 + 1e-9:   # ‖∇F‖ = ‖mean ∇f_i‖ ≤ mean ‖∇f_i‖ and V(p*) = (mean ‖∇f_i‖)²: no set of gradients gives it
            raise ValueError(f"Invalid ‖∇F‖²/V(p*) of {label!r}: {g2} (expected at most 1: ‖mean ∇f_i‖ <= mean ‖∇f_i‖)")
    fig = go.Figure()
    dashes = ("solid", "dash", "dot", "dashdot", "longdash", "longdashdot")
    for k, (label, (v_u, g2)) in enumerate(sets.items()):   # (zip with three dashes dropped a fourth set's line)
        dash = dashes[k % len(dashes)]
        gains = [(v_u + (b - 1) * g2) / (1 + (b - 1) * g2) for b in batch_sizes]
        fig.add_scatter(x=list(batch_sizes), y=gains, mode="lines+markers", line=dict(color="black", dash=dash),
                        name=f"{label}: V(u)/V(p*) = {v_u:.2f}, ‖∇F‖²/V(p*) = {g2:.2f}")
    fig.add_hline(y=1.0, line=dict(color="gray", dash="dot"), annotation_text="no gain",
                  annotation_position="bottom right")
    fig.update_xaxes(type="log", tickvals=list(batch_sizes))
    fig.update_yaxes(rangemode="tozero")
    return _layout(fig, "what the oracle can gain, predicted at θ₀", "batch size B",
                   "predicted uniform ÷ oracle (queries)", 380)


def _bands(runs: list[dict], stop: float | None = None) -> tuple[list[int], list[float], list[float], list[float]]:
    """Per logged query count: the median and min–max of F/F₀ over seeds, a diverged seed counting as +∞
    after its stop and a NaN loss as +∞. A seed that stopped at ``stop``·F₀ (not diverged, its last F/F₀ at or
    below it: ``query_run``'s ``stop_fraction``, which a race sets to its deepest target) holds its last value
    after its end; a seed that only ran out of budget is left out."""
    grid = sorted({q for r in runs for q in r["queries"]})
    rows = []
    for q in grid:
        row = []
        for r in runs:
            at = dict(zip(r["queries"], r["train_loss"]))
            last = r["train_loss"][-1] / r["train_loss"][0]
            if q in at:   # a NaN loss (where a run diverged) is above every other too: statistics.median and
                value = at[q] / r["train_loss"][0]   # min/max read NaN by where it stood among the seeds
                row.append(math.inf if math.isnan(value) else value)
            elif r.get("diverged") and q > r["queries"][-1]:   # (a record without the flag: not known diverged)
                row.append(math.inf)
            elif stop is not None and q > r["queries"][-1] and last <= stop:
                # reached the target and stopped there: left out, the best seeds vanished from the median and the
                # band (the stored race's SAZO median read 0.509 at 5,800 queries where it is 0.462 with them)
                row.append(last)
        rows.append(row)
    return grid, [statistics.median(v) for v in rows], [min(v) for v in rows], [max(v) for v in rows]


def race_figure(race: Race) -> go.Figure:
    """F/F₀ against queries per sampler at its chosen rate: the median over seeds and its min–max band (a seed that
    stopped at the deepest target holds its last value), a cross where a seed diverged, the targets dotted; the
    y-axis ends at the divergence line."""
    top = DIVERGE_FACTOR
    fig = go.Figure()
    for k, runs in race.runs.items():
        grid, median, low, high = _bands(runs, min(race.targets))   # the race's runs stop at its deepest target
        clip = lambda v: min(v, top)
        fig.add_scatter(x=grid + grid[::-1], y=[clip(v) for v in high] + [clip(v) for v in low][::-1], fill="toself",
                        fillcolor=SAMPLER_FILLS[k], line=dict(width=0), hoverinfo="skip", showlegend=False)
        fig.add_scatter(x=grid, y=[v if v < top else None for v in median], mode="lines",
                        line=dict(color=SAMPLER_COLORS[k], width=2.5), name=f"{_name(race, k)} (median of {len(runs)})")
        stops = [r for r in runs if r["diverged"]]
        if stops:
            fig.add_scatter(x=[r["queries"][-1] for r in stops], y=[top] * len(stops), mode="markers",
                            marker=dict(symbol="x", size=11, color=SAMPLER_COLORS[k]), name=f"{k}: a seed diverged")
    for t in race.targets:
        fig.add_hline(y=t, line=dict(color="gray", dash="dot"), annotation_text=f"{t:g}·F₀",
                      annotation_position="bottom left")
    low = min(race.targets)
    if low < 0.2:       # deep targets: a log axis shows each of them
        fig.update_yaxes(type="log", range=[math.log10(low / 2), math.log10(top)])
    else:
        fig.update_yaxes(range=[low - 0.1, top])
    return _layout(fig, f"the race at B = {race.batch_size}: F(θ)/F(θ₀), median and min–max over seeds",
                   "queries (2·B per step)", f"F / F₀ (top: diverged, F > {top:g}·F₀)", 430)


def walk_figure(race: Race) -> go.Figure:
    """‖θ−θ₀‖ against queries, every seed at its sampler's chosen rate; a cross where a seed diverged."""
    fig = go.Figure()
    for k, runs in race.runs.items():
        for j, r in enumerate(runs):
            fig.add_scatter(x=r["queries"], y=r["walk"], mode="lines", line=dict(color=SAMPLER_COLORS[k], width=1.5),
                            legendgroup=k, showlegend=j == 0, name=f"{_name(race, k)} ({len(runs)} seeds)")
        stops = [r for r in runs if r["diverged"]]
        if stops:
            fig.add_scatter(x=[r["queries"][-1] for r in stops], y=[r["walk"][-1] for r in stops], mode="markers",
                            marker=dict(symbol="x", size=11, color=SAMPLER_COLORS[k]), legendgroup=k,
                            name=f"{k}: diverged")
    return _layout(fig, "the random walk of θ: ‖θ−θ₀‖² ≈ η²·d·Σ ĝ²", "queries (2·B per step)", "‖θ − θ₀‖")


def loss_vs_walk_figure(race: Race) -> go.Figure:
    """F/F₀ against ‖θ−θ₀‖ along every run: where each sampler's loss stops falling; its lowest point ringed."""
    top = DIVERGE_FACTOR
    fig = go.Figure()
    for k, runs in race.runs.items():
        for j, r in enumerate(runs):
            # a NaN loss (where a run diverged) at the top, as an infinite one: min(nan, top) kept the NaN, a gap
            losses = [top if math.isnan(v) else min(v / r["train_loss"][0], top) for v in r["train_loss"]]
            fig.add_scatter(x=r["walk"], y=losses, mode="lines", line=dict(color=SAMPLER_COLORS[k], width=1.5),
                            legendgroup=k, showlegend=j == 0, name=_name(race, k))
        lows = [turn(r) for r in runs]
        fig.add_scatter(x=[w for _, w in lows], y=[f for f, _ in lows], mode="markers", legendgroup=k,
                        marker=dict(symbol="circle-open", size=11, color=SAMPLER_COLORS[k]), name=f"{k}: lowest F")
    fig.update_yaxes(range=[min(race.targets) - 0.1, top])
    return _layout(fig, "where the loss turns: F/F₀ against the walk", "‖θ − θ₀‖",
                   f"F / F₀ (top: diverged, F > {top:g}·F₀)", 420)


def scores_figure(run: dict) -> go.Figure:
    """A diagnosed SAZO run: V(p_SAZO)/V(p*) and V(u)/V(p*) at each diagnosed point (1 = the oracle)."""
    require_keys("run", run, ("diagnostics", "seed"))
    if not run["diagnostics"]:
        raise ValueError("Invalid run: no diagnostics recorded (expected a diagnosed SAZO run)")
    for point in run["diagnostics"]:
        require_keys("run's diagnostics", point, ("queries", "v_ratio", "v_uniform_ratio"))
    q = [d["queries"] for d in run["diagnostics"]]
    fig = go.Figure()
    fig.add_scatter(x=q, y=[d["v_ratio"] for d in run["diagnostics"]], mode="lines+markers", name="V(p_SAZO)/V(p*)",
                    line=dict(color=SAMPLER_COLORS["sazo"]))
    fig.add_scatter(x=q, y=[d["v_uniform_ratio"] for d in run["diagnostics"]], mode="lines+markers",
                    name="V(u)/V(p*): what sampling can gain", line=dict(color=SAMPLER_COLORS["uniform"]))
    fig.add_hline(y=1.0, line=dict(color=SAMPLER_COLORS["oracle"], dash="dot"), annotation_text="the oracle",
                  annotation_position="bottom right")
    fig.update_yaxes(type="log")
    return _layout(fig, f"SAZO's sampling variance against the oracle's (seed {run['seed']})", "queries",
                   "variance ratio (log)", 380)


def scores_vs_norms_figure(scores, norms, kinds) -> go.Figure:
    """SAZO's scores against the true ‖∇f_i‖ at the end of a run (log axes), new and assimilated examples apart."""
    scores, norms = number_list("scores", scores), number_list("norms", norms)   # finite, >= 0: log axes
    same_lengths(scores=scores, norms=norms, kinds=kinds)
    unknown = set(kinds) - {"new", "assimilated"}
    if unknown:
        raise ValueError(f"Invalid kinds: {sorted(unknown)} (expected 'new' or 'assimilated')")
    fig = go.Figure()
    for kind, symbol in (("new", "diamond"), ("assimilated", "circle")):
        idx = [i for i, k in enumerate(kinds) if k == kind]
        fig.add_scatter(x=[norms[i] for i in idx], y=[scores[i] for i in idx], mode="markers", name=f"{kind} examples",
                        marker=dict(symbol=symbol, size=9, color=SAMPLER_COLORS["sazo"] if kind == "new" else "gray"),
                        text=[f"example {i}" for i in idx])
    fig.update_xaxes(type="log", dtick=1)
    fig.update_yaxes(type="log", dtick=1)
    return _layout(fig, "SAZO's scores against the true norms, at the run's end" + off_log_axes(norms, scores),
                   "true ‖∇f_i‖ (backprop)", "SAZO's score", 400)

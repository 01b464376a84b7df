"""Dashboards and figures for notebook 02: MeZO's memory, and MeZO against backprop SGD.

The measurements and the training runs live in ``sazo_lite.course``.
"""
from __future__ import annotations

import math

import ipywidgets as widgets
import plotly.graph_objects as go

from .. import two_point, instruments, mezo_vs_sgd, minibatches, problems
from ..sazo_runs import DIVERGE_FACTOR, first_divergence, starting_gap
from ...validation import check_number
from ._common import LiveFigure, SAMPLER_COLORS, Dashboard, assemble, divergence_note, int_slider, log_slider

__all__ = ["memory_figure", "mezo_dashboard", "FORWARD_EQUIVALENTS"]

_COLORS = {"MeZO": SAMPLER_COLORS["uniform"], "SGD (backprop)": "#2ca02c"}  # MeZO is uniform MeZO: the palette's grey
# Forward-pass equivalents per per-example query: MeZO's queries are forwards; an SGD query is a
# forward plus a backward, and a backward costs about two forwards.
FORWARD_EQUIVALENTS = {"MeZO": 1, "SGD (backprop)": 3}


def memory_figure(measurements: dict[str, int]) -> go.Figure:
    """Bars of peak live-tensor bytes, e.g. the dict returned by ``instruments.step_memory``.

    Example:
        >>> fig = memory_figure({"inference": 2**20, "MeZO step": 2**20, "backprop step": 5 * 2**20})
        >>> [round(v, 1) for v in fig.data[0].y]
        [1.0, 1.0, 5.0]
    """
    if not isinstance(measurements, dict) or not measurements:   # a list of bytes has no names for the bars
        raise ValueError("Invalid measurements: expected a non-empty dict of name -> bytes, got "
                         f"{type(measurements).__name__}")
    for name, value in measurements.items():
        check_number(f"measurements[{name!r}]", value, 0.0)   # bytes: a finite count ≥ 0
    names = list(measurements)
    mib = [measurements[name] / 2 ** 20 for name in names]
    fig = go.Figure(go.Bar(x=names, y=mib, text=[f"{v:.2f} MiB" for v in mib], textposition="outside"))
    fig.update_layout(width=560, height=380, yaxis_title="MiB", margin=dict(l=50, r=10, t=30, b=40),
                      title="peak bytes of live tensors, beyond the parameters")
    return fig


def _race_figure(x_title: str) -> LiveFigure:
    fig = LiveFigure(layout=dict(width=470, height=360, margin=dict(l=50, r=10, t=30, b=50),
                                 xaxis_title=x_title, legend=dict(x=0.35, y=1),
                                 yaxis=dict(type="log", title="F(θ) − F(θ*)", exponentformat="power")))
    for name, color in _COLORS.items():
        fig.add_scatter(mode="lines", name=name, line=dict(color=color, width=2.5))
    return fig


def mezo_dashboard(problem=None, *, steps: int = 200, seed: int = 0) -> Dashboard:
    """MeZO against backprop SGD on logistic regression (float32 θ, same B, uniform minibatches).

    Left: optimality gap against forward-pass equivalents (MeZO: 2B forwards per step; SGD: B
    forward+backward evaluations ≈ 3B forwards, a backward costing about two forwards).
    Right: the same runs against training wall-clock seconds (measured once per setting, then cached).

    Args:
        problem: a ``FiniteSumProblem``; default: breast-cancer logistic regression from scikit-learn.
        steps: steps per method and redraw.
        seed: seed of the minibatches and of MeZO's directions.
    """
    problem = problem if problem is not None else problems.LogisticRegression.from_sklearn("breast_cancer")
    start_gap = starting_gap(problem)   # F(θ₀) − F(θ*), the divergence rule's reference; a NaN one is refused here
    controls = {
        "eps": log_slider("ε", 1e-3, -9, -1),
        "batch_size": int_slider("batch size B", 16, 1, 128),
        "lr_zo": log_slider("η MeZO", 0.02, -4, 0),
        "lr_sgd": log_slider("η SGD", 0.5, -3, 1),
    }
    figures = {"queries": _race_figure("forward-pass equivalents (SGD: 3 per example)"),
               "seconds": _race_figure("training seconds")}
    readout = widgets.HTML()
    state: dict = {}
    cache: dict[tuple, dict] = {}

    def run(method: str) -> dict:
        """One method's run, cached by the controls it depends on (SGD ignores ε and MeZO's η)."""
        key = (method, controls["batch_size"].value,
               *((controls["eps"].value, controls["lr_zo"].value) if method == "MeZO" else (controls["lr_sgd"].value,)))
        if key not in cache:
            cache[key] = mezo_vs_sgd.race_mezo_sgd(
                problem, steps=steps, batch_size=controls["batch_size"].value, lr_zo=controls["lr_zo"].value,
                lr_sgd=controls["lr_sgd"].value, eps=controls["eps"].value, seed=seed,
                log_every=max(1, steps // 20), methods=(method,))[method]
        return cache[key]

    rate_names = {"MeZO": ("η MeZO", "lr_zo"), "SGD (backprop)": ("η SGD", "lr_sgd")}

    def divergence(name: str, curve: dict) -> tuple[int, str, str] | None:
        """(index of the first diverged log point, "by step s" or "at step s", how it shows) or None: the course's rule
        (``sazo_runs.first_divergence``: above 10× the starting gap, or not finite), or MeZO's refused loss."""
        index = first_divergence([start_gap, *curve["gap"]])
        per_step = controls["batch_size"].value * (2 if name == "MeZO" else 1)
        if index is not None:
            gap = curve["gap"][index - 1]
            how = (f"its gap passed {DIVERGE_FACTOR:g}× its start ({start_gap:.3g} → {gap:.3g})"
                   if math.isfinite(gap) else "its gap became infinite or NaN")
            return index - 1, f"by step {curve['queries'][index - 1] // per_step}", how   # a log point
        if curve.get("stopped") is not None:
            return len(curve["gap"]), f"at step {curve['stopped']}", "its loss became infinite or NaN (MeZO refused the step)"
        return None

    def refresh() -> None:
        runs, diverged = {}, {}
        for method in mezo_vs_sgd.RACE_METHODS:
            runs[method] = run(method)
            found = divergence(method, runs[method])
            if found is not None:
                diverged[method] = found
        state["runs"], state["diverged"] = runs, {name: why for name, (_i, _s, why) in diverged.items()}
        with figures["queries"].batch_update(), figures["seconds"].batch_update():
            for index, name in enumerate(mezo_vs_sgd.RACE_METHODS):
                curve = runs[name]
                cut = diverged[name][0] if name in diverged else len(curve["gap"])
                # up to where it diverged; None after (a gap in the line, not an axis stretched to 10⁷⁶)
                gap = [max(g, 1e-12) if k < cut and math.isfinite(g) else None for k, g in enumerate(curve["gap"])]
                forwards = [FORWARD_EQUIVALENTS[name] * q for q in curve["queries"]]
                figures["queries"].data[index].x, figures["queries"].data[index].y = forwards, gap
                figures["seconds"].data[index].x, figures["seconds"].data[index].y = curve["seconds"], gap
        lines = [f"{name}: gap {curve['gap'][-1]:.3g} after {curve['queries'][-1]} queries "
                 f"(≈ {FORWARD_EQUIVALENTS[name] * curve['queries'][-1]} forwards), "
                 f"{1e3 * curve['seconds'][-1] / steps:.2f} ms/step" for name, curve in runs.items()
                 if name not in diverged]
        notes = [divergence_note(f"{name} diverged {step}", how, rate_names[name][0],
                                 controls[rate_names[name][1]].value, "its curves stop there",
                                 eps=controls["eps"].value if name == "MeZO" else None)
                 for name, (_index, step, how) in diverged.items()]
        at_optimum = ("<b>θ₀ already minimises this problem (F(θ₀) − F(θ*) = 0): every step can only move away from "
                      "it, so there is nothing to race; a run is called diverged only where its gap stops being "
                      "finite.</b><br>" if start_gap == 0 else "")
        readout.value = at_optimum + "".join(notes) + " &nbsp; ".join(lines)

    questions = {
        "eps": "θ is float32 here: below which ε does MeZO stop learning, and why?",
        "batch_size": "A larger B costs more queries per step: does MeZO get more per query, or just more per step?",
        "lr_zo": "How large can MeZO's step be before the noise of g·z wins? Compare with SGD's best η.",
        "lr_sgd": "Which method is ahead per query? Per second? Why can those answers differ?",
    }
    choices = {"ε too small": dict(eps=1e-9), "large batch": dict(batch_size=128),
               "η too large (MeZO)": dict(lr_zo=0.5), "defaults": dict(eps=1e-3, batch_size=16, lr_zo=0.02, lr_sgd=0.5)}
    dashboard = assemble("MeZO against backprop SGD: logistic regression", controls, questions, choices,
                         figures, refresh, readout)
    dashboard.state = state
    return dashboard

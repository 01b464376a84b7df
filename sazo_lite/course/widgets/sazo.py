"""Notebook 04's dashboard: what SAZO's estimates G_i know about the true gradient norms.

A toggle picks the rule, one rung of the ablation ladder ``sazo_runs.RULES``: the plain rule
(``PlainSAZOSampler``), then one robustness fix of ``SAZOSampler`` added at a time (prior, blend,
level, |δ|). Four plots of one run (``sazo_lite.course.sazo_runs.run_sazo_trace``): SAZO's
estimate of ‖∇f_i‖ against the truth at a chosen step, the estimates of three examples over
training, p_SAZO against p* sorted by p*, and V(p)/V(p*) over training for uniform, SAZO and
the oracle.
"""
from __future__ import annotations

import numpy as np
import plotly.graph_objects as go
import ipywidgets as widgets
import torch

from ..config import pick
from ...validation import check_count
from ..sazo_runs import DIVERGE_FACTOR, RULE_FIXES, RULE_NAMES, SAZOTrace, make_problem, roughness, rule_sampler, \
    run_sazo_trace
from ._common import LiveFigure, SAMPLER_COLORS as _COLORS, Dashboard, captioned, divergence_note, finite, int_slider, \
    below_tiny_eps, log_slider, presets, shown_on_error, slider

__all__ = ["sazo_dashboard", "trace_readout", "decay_note", "trace_divergence"]

_TRACKED_COLORS = ("#1f77b4", "#ff7f0e", "#2ca02c")
_FIG = dict(height=320, width=470, margin=dict(l=55, r=15, t=45, b=45))

DEFAULTS = dict(rule="plain", eps=1e-3, ema_decay=0.9, batch_size=8, lr=1e-2, uniform_mix=0.1, heterogeneity=1.5)
# Each preset is a regime: the defaults, then its changes (``presets`` completes them).
PRESETS = {
    "ε too small": dict(eps=1e-9),
    "homogeneous data": dict(heterogeneity=0.0),
    "homogeneous, robust rule": dict(heterogeneity=0.0, rule="robust"),
    "large batch": dict(batch_size=32),
    "robust rule": dict(rule="robust"),
}
RULE_LABELS = RULE_NAMES


def _snapshot_index(trace: SAZOTrace, step: int) -> int:
    """Index of the last log point at or before ``step``."""
    return int(np.clip(np.searchsorted(trace.steps, step, side="right") - 1, 0, len(trace.steps) - 1))


def _rho(trace: SAZOTrace, index: int) -> str:
    """"ρ = 0.59", or why there is no rank correlation: every estimate (or every true norm) equal, as at
    θ₀ under the plain rule (G₀ = 1 for all) or with one example (``variance.spearman`` reports 0 there)."""
    if np.ptp(trace.sqrt_g[index]) == 0 or np.ptp(trace.norms[index]) == 0:
        what = "estimate" if np.ptp(trace.sqrt_g[index]) == 0 else "true norm"
        return f"ρ undefined (every {what} is equal)"
    return f"ρ = {trace.spearman[index]:.2f}"


def _wiggle(trace: SAZOTrace, last: int) -> str:
    """"plotted estimates' mean step |Δ log| = 0.12" up to log point ``last`` (or why there is none yet)."""
    try:
        value = roughness(trace.sqrt_g[:last + 1][:, trace.tracked])
    except ValueError:   # fewer than two log points, or the plotted estimates not yet positive
        return "plotted estimates' mean step |Δ log|: not yet measurable"
    return f"plotted estimates' mean step |Δ log| = {value:.2f}"


def _check_trace(trace) -> SAZOTrace:
    """``trace``, or a ValueError naming what came instead of a ``SAZOTrace`` (AttributeError before)."""
    if not isinstance(trace, SAZOTrace):
        raise ValueError(f"Invalid trace: {type(trace).__name__} (expected a SAZOTrace, e.g. run_sazo_trace(...))")
    return trace


def _log_point(trace: SAZOTrace, index: int) -> int:
    """``index`` as a position among the trace's log points (a negative one counts from the end)."""
    _check_trace(trace)
    if len(trace.steps) == 0:
        raise ValueError("Invalid trace: no log points")
    if isinstance(index, bool) or not isinstance(index, (int, np.integer)) or \
            not -len(trace.steps) <= index < len(trace.steps):
        raise ValueError(f"Invalid index: {index!r} (the trace has {len(trace.steps)} log points)")
    return int(index) % len(trace.steps)


def trace_readout(trace: SAZOTrace, index: int = -1) -> str:
    """One line of numbers at a log point, e.g. "step 300: Spearman ρ = 0.59, TV = 0.39, ...".

    Ends with the mean of V(p_SAZO)/V(p*) over the run so far (one snapshot is noisy) and how much the
    three plotted estimates wiggle: their mean step |Δ log| between log points so far (``sazo_runs.roughness``).
    """
    last = _log_point(trace, index)
    upto = slice(1, last + 1) if last else slice(0, 1)   # the log points after θ₀, up to ``index``
    return (f"step {int(trace.steps[index])}: Spearman {_rho(trace, index)}, "
            f"TV = {trace.tv[index]:.2f}, V(p_SAZO)/V(p*) = {trace.ratio['sazo'][index]:.2f}, "
            f"V(uniform)/V(p*) = {trace.ratio['uniform'][index]:.2f}, gap = {trace.gap[index]:.3g}; "
            f"mean over the run: SAZO {np.mean(trace.ratio['sazo'][upto]):.2f}, "
            f"uniform {np.mean(trace.ratio['uniform'][upto]):.2f}; {_wiggle(trace, last)}")


def trace_divergence(trace: SAZOTrace, eps: float | None = None) -> str:
    """The sentence a diverged run needs ("" if it did not diverge): at which step, at which η, the fix
    (``eps``: the run's ε, for the advice at a tiny ε).

    Example:
        >>> from sazo_lite.course.sazo_runs import make_problem, run_sazo_trace
        >>> "diverged by step" in trace_divergence(run_sazo_trace(make_problem(), steps=40, lr=0.1, batch_size=1,
        ...                                                        log_every=5, diverge_factor=10))
        True
    """
    below_tiny_eps(eps)   # refuses an ε no run can have, diverged or not
    if _check_trace(trace).diverged_at is None:
        return ""
    last = float(trace.gap[-1])
    if trace.steps[-1] == trace.diverged_at:   # found at a log point: it diverged by then
        when = "by"
        how = (f"its gap F(θ) − F(θ*) rose above {DIVERGE_FACTOR:g}× its start ({float(trace.gap[0]):.3g} → "
               f"{last:.3g})" if np.isfinite(last) else "its gap F(θ) − F(θ*) became infinite or NaN")
    else:
        when, how = "at", "its loss became infinite or NaN (MeZO refused the step)"
    return divergence_note(f"The run diverged {when} step {trace.diverged_at}", how, "η", trace.lr,
                           f"the plots stop at step {int(trace.steps[-1])}", eps=eps)


def decay_note(trace: SAZOTrace, ema_decay: float, index: int = -1) -> str:
    """What β does under the trace's rule at a log point, read from the rule's own sampler.

    The decay for an example seen n_i times comes from the sampler's own ``decay`` on the
    rule's sampler (``SAZOSampler``: min(β, (n_i + c)/(n_i + c + 1)), c its ``prior_strength``),
    so β matters only for examples seen more than about β/(1−β) − c times.
    """
    sampler = rule_sampler(_check_trace(trace).rule, 1, ema_decay=ema_decay)
    counts = trace.counts[_log_point(trace, index)]
    if counts.any():   # the run had observed examples by then: an unseen one's first update takes the prior's
        sampler.update(torch.tensor([0]), torch.tensor([1.0]))   # c pseudo-observations (a fresh sampler, none)
    decay = sampler.decay(counts)
    share = float(np.mean(decay >= ema_decay))
    if share == 1.0:
        return f"{RULE_LABELS[trace.rule]}: every update uses β = {ema_decay:.3g}"
    c = getattr(sampler, "prior_strength", 0.0)
    return (f"{RULE_LABELS[trace.rule]}: decay min(β, (n_i+{c:g})/(n_i+{c + 1:g})); median n_i = "
            f"{np.median(counts):.0f}, so β = {ema_decay:.3g} is the decay in use for {share:.0%} of the "
            "examples (the others still average their few observations)")


# -- figures: built once, then only their data change ----------------------------------------

def _scatter_figure() -> LiveFigure:
    fig = LiveFigure(layout=dict(title="SAZO's estimate of ‖∇f_i‖ against the truth", **_FIG))
    fig.add_scatter(name="examples", mode="markers", marker=dict(size=5, color=_COLORS["sazo"], opacity=0.6))
    fig.add_scatter(name="y = x", mode="lines", line=dict(color="black", dash="dash", width=1))
    fig.update_xaxes(type="log", title="true ‖∇f_i(θ_t)‖")
    fig.update_yaxes(type="log", title="SAZO's estimate of ‖∇f_i‖")
    return fig


def _trajectory_figure() -> LiveFigure:
    fig = LiveFigure(layout=dict(title="three examples: estimate (solid) and truth (dotted)", **_FIG))
    for k, color in enumerate(_TRACKED_COLORS):
        fig.add_scatter(name=f"estimate #{k}", mode="lines", line=dict(color=color))
        fig.add_scatter(name=f"‖∇f‖ #{k}", mode="lines", line=dict(color=color, dash="dot"), showlegend=False)
    fig.update_xaxes(title="step t")
    fig.update_yaxes(type="log", title="norm")
    return fig


def _probs_figure() -> LiveFigure:
    fig = LiveFigure(layout=dict(title="p_SAZO against p*, sorted by p*", **_FIG))
    fig.add_scatter(name="p_SAZO", mode="markers", marker=dict(size=4, color=_COLORS["sazo"]))
    fig.add_scatter(name="p* (oracle)", mode="lines", line=dict(color=_COLORS["oracle"]))
    fig.add_scatter(name="uniform 1/N", mode="lines", line=dict(color=_COLORS["uniform"], dash="dash"))
    fig.update_xaxes(title="examples, largest ‖∇f_i‖ first")
    fig.update_yaxes(type="log", title="probability")
    return fig


def _variance_figure() -> LiveFigure:
    fig = LiveFigure(layout=dict(title="V(p)/V(p*) over training", **_FIG))
    for name in ("uniform", "sazo", "oracle"):
        fig.add_scatter(name=name, mode="lines", line=dict(color=_COLORS[name]))
    fig.add_scatter(name="now", mode="lines", line=dict(color="black", width=1, dash="dot"), showlegend=False)
    fig.update_xaxes(title="step t")
    fig.update_yaxes(type="log", title="V(p) / V(p*)")
    return fig


def _off_the_log_axis(estimates: np.ndarray) -> str:
    """What the log-scaled plots cannot show, said in the title: estimates of exactly 0 (a tiny ε rounds
    every directional difference to 0, and β = 0 keeps only the last one)."""
    zeros = int(np.sum(np.asarray(estimates) <= 0))
    return f" · {zeros} of {len(estimates)} estimates are 0, off the log axis" if zeros else ""


def _draw(figures: dict, trace: SAZOTrace, index: int, *, trajectories: bool = True) -> None:
    """Put one trace's data into the four figures (each inside one batch_update); ``trajectories=False``
    leaves the trajectory figure as drawn (it shows the whole run, not the snapshot: the step slider
    needs no redraw of it)."""
    norms, sqrt_g = trace.norms[index], trace.sqrt_g[index]
    positive = norms[np.isfinite(norms) & (norms > 0)]
    low, high = (positive.min(), positive.max()) if len(positive) else (1e-3, 1.0)
    norms, sqrt_g = finite(norms), finite(sqrt_g)   # a diverged run's last point may overflow: left off the plot
    with figures["scatter"].batch_update():
        figures["scatter"].data[0].update(x=norms, y=sqrt_g)
        figures["scatter"].data[1].update(x=[low, high], y=[low, high])
        figures["scatter"].layout.title.text = f"estimate vs true ‖∇f_i‖, step {int(trace.steps[index])}: " \
                                               f"{_rho(trace, index)}" + _off_the_log_axis(sqrt_g)
    if trajectories:
        with figures["trajectory"].batch_update():
            for k, example in enumerate(trace.tracked):
                figures["trajectory"].data[2 * k].update(x=trace.steps, y=finite(trace.sqrt_g[:, example]))
                figures["trajectory"].data[2 * k + 1].update(x=trace.steps, y=finite(trace.norms[:, example]))
    order = np.argsort(-trace.p_star[index])
    ranks = np.arange(len(order))
    with figures["probs"].batch_update():
        figures["probs"].data[0].update(x=ranks, y=finite(trace.p_sazo[index][order]))
        figures["probs"].data[1].update(x=ranks, y=finite(trace.p_star[index][order]))
        figures["probs"].data[2].update(x=[0, len(order) - 1], y=[1.0 / len(order)] * 2)
        figures["probs"].layout.title.text = f"p_SAZO vs p*: TV = {trace.tv[index]:.2f}"
    ratios = finite(np.concatenate([trace.ratio[name] for name in ("uniform", "sazo")]))
    with figures["variance"].batch_update():
        for k, name in enumerate(("uniform", "sazo", "oracle")):
            figures["variance"].data[k].update(x=trace.steps, y=finite(trace.ratio[name]))
        step = int(trace.steps[index])
        top = float(np.nanmax(ratios)) if np.isfinite(ratios).any() else 1.0
        figures["variance"].data[3].update(x=[step, step], y=[1.0, top])


# -- controls ------------------------------------------------------------------------------

def _controls(steps: int, log_every: int) -> dict[str, widgets.Widget]:
    return {
        "rule": widgets.ToggleButtons(options=[(label, key) for key, label in RULE_LABELS.items()],
                                      value=DEFAULTS["rule"], description="rule",
                                      style=dict(description_width="150px", button_width="170px"),
                                      tooltips=[RULE_FIXES[key] for key in RULE_LABELS]),
        "eps": log_slider("ε", DEFAULTS["eps"], -10, 0),
        "ema_decay": slider("EMA decay β", DEFAULTS["ema_decay"], 0.0, 0.995, 0.005),
        "batch_size": int_slider("batch size B", DEFAULTS["batch_size"], 1, 64),
        "lr": log_slider("learning rate η", DEFAULTS["lr"], -4, -1),
        "uniform_mix": slider("uniform mix λ", DEFAULTS["uniform_mix"], 0.01, 1.0, 0.01),
        "heterogeneity": slider("heterogeneity σ", DEFAULTS["heterogeneity"], 0.0, 2.5, 0.1),
        "step": int_slider("training step t", steps, 0, steps, log_every, continuous_update=True),
    }


_QUESTIONS = {
    "rule": "Add one fix at a time (plain → + prior → + blend → + level → + |δ|): which rung lowers the mean V ratio "
            "in the readout, here and on homogeneous data?",
    "eps": "θ is float32. Below which ε does sqrt(G) stop tracking ‖∇f‖ — and why only there, on a quadratic?",
    "ema_decay": "Does a larger β make the G trajectories smoother, or slower to follow a moving ‖∇f‖? "
                 "With the count-based decay (+ blend and above), why does β above ~0.9 change little here?",
    "batch_size": "More examples per step means more δ² observations: how fast does ρ rise with B?",
    "lr": "When θ moves fast, the norms change under SAZO's feet: does TV(p_SAZO, p*) grow with η?",
    "uniform_mix": "λ = 1 is uniform sampling. How small can λ go before V(p_SAZO)/V(p*) stops improving?",
    "heterogeneity": "At σ = 0 all examples look alike: what is left for SAZO to gain?",
    "step": "Scrub through training: when is the scatter tightest, and when is uniform's V ratio worst?",
}


def sazo_dashboard(*, num_examples: int = 128, dim: int = 10, steps: int | None = None,
                   log_every: int = 5, seed: int = 0, cache_size: int = 64) -> Dashboard:
    """SAZO's estimates against the truth on a least-squares problem, with live controls.

    Opens on the plain rule (what notebook 04 teaches first); the "rule" toggle adds the robust
    ``SAZOSampler``'s fixes one at a time (``sazo_runs.RULES``); the readout says how much of β
    the rule's count-adaptive decay lets through and gives the mean V ratio over the run.

    Args:
        num_examples, dim: N and d of the least-squares problem.
        steps: SAZO steps per run (default 150; 100 under ``SAZO_FAST=1``).
        log_every: steps between snapshots.
        seed: problem, sampler and direction seed.
        cache_size: how many runs to keep (revisiting a setting redraws without retraining).

    Returns:
        A ``Dashboard`` with figures "scatter", "trajectory", "probs", "variance" and a text readout.

    Example:
        >>> dash = sazo_dashboard(steps=30)
        >>> dash.controls["ema_decay"].value = 0.99   # retrains and redraws
    """
    steps = check_count("steps", steps) if steps is not None else pick(150, 100)   # before the step slider is built
    check_count("cache_size", cache_size)     # the run on screen is cached too
    check_count("log_every", log_every)
    controls = _controls(steps, log_every)
    figures = {"scatter": _scatter_figure(), "trajectory": _trajectory_figure(),
               "probs": _probs_figure(), "variance": _variance_figure()}
    readout = widgets.HTML()
    problems, traces, hold = {}, {}, [False]

    def current_trace() -> SAZOTrace:
        values = {name: controls[name].value for name in
                  ("rule", "eps", "ema_decay", "batch_size", "lr", "uniform_mix", "heterogeneity")}
        key = tuple(sorted(values.items()))
        if key not in traces:
            sigma = values.pop("heterogeneity")
            if sigma not in problems:
                problems[sigma] = make_problem(heterogeneity=sigma, num_examples=num_examples, dim=dim, seed=seed)
            if len(traces) >= cache_size:
                traces.pop(next(iter(traces)))  # oldest first
            traces[key] = run_sazo_trace(problems[sigma], steps=steps, log_every=log_every, seed=seed,
                                         diverge_factor=DIVERGE_FACTOR, **values)
        return traces[key]

    drawn = [None]   # the trace on screen

    def refresh() -> None:
        trace = current_trace()
        index = _snapshot_index(trace, controls["step"].value)
        _draw(figures, trace, index, trajectories=trace is not drawn[0])
        drawn[0] = trace
        readout.value = (trace_divergence(trace, controls["eps"].value) + f"<b>{trace_readout(trace, index)}</b><br>"
                         f"<span style='color:#555'>{decay_note(trace, controls['ema_decay'].value, index)}</span>")

    def on_change(_change) -> None:
        if not hold[0]:
            refresh()

    for control in controls.values():
        control.observe(shown_on_error(on_change, readout), names="value")
    rows = [presets(PRESETS, controls, shown_on_error(refresh, readout), hold, keep=("step",))]
    rows += [captioned(control, _QUESTIONS[name]) for name, control in controls.items()]
    dash = Dashboard("SAZO's estimates against the truth", rows, controls, figures, refresh, readout)
    dash.children = (*dash.children[:len(rows) + 2], widgets.HBox([figures["scatter"].view, figures["trajectory"].view]),
                     widgets.HBox([figures["probs"].view, figures["variance"].view]))
    refresh()
    return dash

"""Four pictures the lessons need (notebooks 03–05), each a small live dashboard.

* ``norms_histogram_dashboard``: the heterogeneity itself, a histogram of ‖∇f_i‖ as σ moves.
* ``batch_bars_dashboard``: the batch-size lesson as bars, (1/B)·V(p) against (1 − 1/B)·‖∇F‖².
* ``chi2_dashboard``: why one d² is not enough: the χ²₁ spread of d²/‖∇f_i‖² and how an EMA
  over an example's observations narrows it as β moves.
* ``paths_dashboard``: uniform, SAZO and oracle trajectories on the contours of a 2-D
  heterogeneous least-squares problem (``sazo_runs.sampler_paths``: real MeZO steps).

The maths lives in ``sazo_lite.variance``, ``sazo_lite.course`` and ``sazo_lite.course.sazo_runs``.
"""
from __future__ import annotations

import math

import numpy as np
import plotly.graph_objects as go
import ipywidgets as widgets
import torch

from .. import two_point, instruments, mezo_vs_sgd, minibatches, problems
from ... import variance
from ..config import one_thread, pick
from ...validation import check_int
from ..sazo_runs import DIVERGE_FACTOR, SAMPLERS, chi2_draws, ema_of_chi2, first_divergence, loss_grid, \
    sampler_paths
from ._common import LiveFigure, SAMPLER_COLORS as _COLORS, SAMPLER_LABELS as _LABELS, Dashboard, assemble, \
    divergence_note, finite, int_slider, log_slider, slider

__all__ = ["norms_histogram_dashboard", "batch_bars_dashboard", "chi2_dashboard", "paths_dashboard"]

_FIG = dict(height=360, width=520, margin=dict(l=55, r=15, t=45, b=45))


# -- the heterogeneity itself ----------------------------------------------------------------

def norms_histogram_dashboard(*, num_examples: int = 256, dim: int = 20, seed: int = 0) -> Dashboard:
    """Histogram of the per-example gradient norms ‖∇f_i(θ_t)‖ (log x) as σ and t move.

    The readout gives CV and V(u)/V(p*) = 1 + CV², the oracle's most possible gain.

    Example:
        >>> dash = norms_histogram_dashboard(num_examples=64, dim=4)
        >>> dash.controls["sigma"].value = 2.0   # wider histogram, larger 1 + CV²
    """
    cache: dict[tuple, torch.Tensor] = {}
    controls = {"sigma": slider("heterogeneity σ", 1.5, 0.0, 2.5, 0.1),
                "progress": slider("training progress t", 0.0, 0.0, 1.0, 0.05)}
    fig = LiveFigure(layout=dict(title="‖∇f_i‖ over the examples", bargap=0.05, **_FIG))
    fig.add_histogram(name="examples", marker=dict(color=_COLORS["sazo"]), xbins=dict(size=0.1))
    fig.add_scatter(name="mean", mode="lines", line=dict(color="black", dash="dash"))
    fig.update_xaxes(title="log10 ‖∇f_i(θ_t)‖", range=[-4, 3])
    fig.update_yaxes(title="number of examples")
    readout = widgets.HTML()

    def refresh() -> None:
        sigma, progress = controls["sigma"].value, controls["progress"].value
        key = (round(sigma, 6), round(progress, 6))
        if key not in cache:
            problem = problems.LeastSquares(num_examples, dim, heterogeneity=sigma, seed=seed)
            cache[key] = problem.norms(minibatches.path_point(problem, progress))
        norms = cache[key]
        logs = torch.log10(norms.clamp_min(1e-12)).numpy()
        # The axis spans 10⁻⁴…10³ and widens to whole decades when a norm falls outside (σ = 2.5 near θ*):
        # no example is left off the picture.
        low, high = min(-4.0, float(np.floor(logs.min()))), max(3.0, float(np.ceil(logs.max())))
        counts, _ = np.histogram(logs, bins=np.arange(low, high + 0.05, 0.1))
        mean = float(np.log10(float(norms.mean())))
        cv = float(norms.std(unbiased=False) / norms.mean())
        with fig.batch_update():
            fig.update_xaxes(range=[low, high])
            fig.data[0].x = logs
            fig.data[1].update(x=[mean, mean], y=[0, max(1, int(counts.max()))])
        readout.value = (f"σ = {sigma:.1f}, t = {progress:.2f}: CV of the norms = {cv:.2f}, "
                         f"so V(u)/V(p*) = 1 + CV² = <b>{variance.uniform_gain(norms):.2f}</b>")

    questions = {
        "sigma": "σ spreads the per-example scales s_i: how wide must the histogram be before 1 + CV² > 2?",
        "progress": "At the optimum (t = 1), why are the norms not all zero?",
    }
    choices = {"homogeneous data (σ = 0)": dict(sigma=0.0), "σ = 1.5": dict(sigma=1.5), "σ = 2.5": dict(sigma=2.5)}
    return assemble("How different are the examples? ‖∇f_i‖ as σ moves", controls, questions, choices,
                    {"histogram": fig}, refresh, readout)


# -- the batch-size lesson as bars ------------------------------------------------------------

def batch_bars_dashboard(*, num_examples: int = 256, dim: int = 20, seed: int = 0) -> Dashboard:
    """Stacked bars of E‖ĝ‖²/(d+2) = (1/B)·V(p) + (1 − 1/B)·‖∇F‖² for uniform and oracle sampling.

    Only the first part depends on p: as B grows it shrinks and the common second part
    takes over, so the two bars' ratio (the gain) falls towards 1.

    Example:
        >>> dash = batch_bars_dashboard(num_examples=64, dim=4)
        >>> dash.controls["batch_size"].value = 1
        >>> list(dash.figures["bars"].data[1].y)   # B = 1: no ‖∇F‖² part
        [0.0, 0.0]
    """
    problems_by_sigma: dict[float, problems.LeastSquares] = {}
    controls = {"batch_size": int_slider("batch size B", 8, 1, 256),
                "sigma": slider("heterogeneity σ", 1.5, 0.0, 2.5, 0.1),
                "progress": slider("training progress t", 0.5, 0.0, 1.0, 0.05)}
    fig = LiveFigure(layout=dict(title="E‖ĝ‖² / (d+2), split in its two parts", barmode="stack", **_FIG))
    fig.add_bar(name="(1/B)·V(p): depends on p", marker=dict(color=_COLORS["sazo"]))
    fig.add_bar(name="(1 − 1/B)·‖∇F‖²: the same for every p", marker=dict(color="#bbbbbb"))
    fig.update_xaxes(title="sampler")
    fig.update_yaxes(title="(gradient units)²")
    fig.update_layout(legend=dict(x=0.35, y=1.0))
    readout = widgets.HTML()

    def parts(norms: torch.Tensor, full: float, batch_size: int, probs: torch.Tensor) -> tuple[float, float]:
        return variance.sampling_variance(norms, probs) / batch_size, (1.0 - 1.0 / batch_size) * full ** 2

    def refresh() -> None:
        batch_size, sigma, progress = (controls[k].value for k in ("batch_size", "sigma", "progress"))
        key = round(sigma, 6)
        if key not in problems_by_sigma:
            problems_by_sigma[key] = problems.LeastSquares(num_examples, dim, heterogeneity=sigma, seed=seed)
        problem = problems_by_sigma[key]
        grads = problem.per_example_grads(minibatches.path_point(problem, progress))
        norms, full = grads.norm(dim=1), float(grads.mean(0).norm())
        bars = {"uniform": parts(norms, full, batch_size, torch.full_like(norms, 1.0 / len(norms))),
                "oracle p*": parts(norms, full, batch_size, variance.oracle_probs(norms))}
        names = list(bars)
        with fig.batch_update():
            fig.data[0].update(x=names, y=[bars[n][0] for n in names])
            fig.data[1].update(x=names, y=[bars[n][1] for n in names])
        totals = [sum(bars[n]) for n in names]
        # at θ* (t = 1) ‖∇F‖ is 0 up to float64 rounding of the mean of N gradients: say 0, not "3.51e-15"
        shown = "0 (θ* up to rounding)" if full <= 1e-9 * float(norms.max()) else f"{full:.3g}"
        readout.value = (f"B = {batch_size}: uniform / oracle = <b>{totals[0] / totals[1]:.2f}</b> "
                         f"(at B = 1 it is 1 + CV² = {variance.uniform_gain(norms):.2f}); "
                         f"‖∇F‖ = {shown}")

    questions = {
        "batch_size": "Raise B: which part shrinks, and why does the gain go with it?",
        "sigma": "At σ = 0, how different are the two blue parts?",
        "progress": "Late in training (t → 1) ‖∇F‖ → 0: what is left of the grey part, and of the gain at large B?",
    }
    choices = {"B = 1": dict(batch_size=1, progress=0.5), "B = 64": dict(batch_size=64, progress=0.5),
               "B = 64, late (t = 1)": dict(batch_size=64, progress=1.0)}
    return assemble("The batch-size lesson: which part of the variance sampling can shrink", controls, questions,
                    choices, {"bars": fig}, refresh, readout)


# -- why one d² is not enough -------------------------------------------------------------------

def chi2_dashboard(*, examples: int | None = None, seed: int = 0) -> Dashboard:
    """Histograms of d²/‖∇f‖² (one observation: χ²₁) and of an EMA of n such observations.

    The EMA starts at its first observation and then runs G ← β·G + (1−β)·d² (the plain rule
    without its constant start); its relative variance falls from 2 towards 2(1−β)/(1+β).

    Example:
        >>> dash = chi2_dashboard(examples=2000)
        >>> dash.controls["ema_decay"].value = 0.95   # a narrower orange histogram
    """
    # a relative variance and a tail probability read off fewer draws are noise, not χ²₁ (one draw: 0)
    examples = check_int("examples", examples, 100) if examples is not None else pick(20_000, 5_000)
    controls = {"ema_decay": slider("EMA decay β", 0.9, 0.0, 0.995, 0.005),
                "observations": int_slider("observations n", 10, 1, 200)}
    fig = LiveFigure(layout=dict(title="estimate / truth, over many examples", barmode="overlay", **_FIG))
    bins = dict(start=0.0, end=5.0, size=0.05)
    fig.add_histogram(name="one δ² (χ²₁)", histnorm="probability density", xbins=bins,
                      marker=dict(color=_COLORS["uniform"]), opacity=0.5)
    fig.add_histogram(name="EMA of n δ²", histnorm="probability density", xbins=bins,
                      marker=dict(color="#ff7f0e"), opacity=0.6)
    fig.add_scatter(name="truth", mode="lines", line=dict(color="black", dash="dash"), x=[1, 1], y=[0, 3])
    fig.update_xaxes(title="G / ‖∇f‖² (1 is perfect)", range=[0, 5])
    fig.update_yaxes(title="density", range=[0, 3])
    readout = widgets.HTML()
    single = ema_of_chi2(examples, observations=1, ema_decay=0.0, seed=seed)
    kept: dict[int, np.ndarray] = {}   # the draws of the current n: moving β only reweights them

    def refresh() -> None:
        beta, n = controls["ema_decay"].value, controls["observations"].value
        if n not in kept:
            kept.clear()
            kept[n] = chi2_draws(examples, n, seed=seed)
        ema = ema_of_chi2(examples, observations=n, ema_decay=beta, seed=seed, draws=kept[n])
        # plotly's "probability density" divides by the draws inside the bins, not by all: bins that stopped at
        # the axis' 5 drew χ²₁'s 97.5% below 5 as 100%, every bar 2.6% too high. The bins now reach past the
        # largest draw (the axis still ends at 5), so each bar is its draws ÷ (all draws × bin width).
        edge = (math.floor(max(float(single.max()), float(ema.max()), 5.0) / bins["size"]) + 1) * bins["size"]
        with fig.batch_update():
            fig.data[0].x = single
            fig.data[1].x = ema
            for trace in fig.data[:2]:
                trace.xbins = dict(bins, end=edge)
        relative = float(ema.var() / ema.mean() ** 2)
        limit = 2 * (1 - beta) / (1 + beta)
        # var/mean² for both: the draws' mean is 1 only on average (0.835 for 500 examples at seed 1)
        readout.value = (f"one δ²: relative variance {float(single.var() / single.mean() ** 2):.2f} (theory 2); "
                         f"EMA of {n} with β = {beta:.3g}: <b>{relative:.2f}</b> "
                         f"(→ 2(1−β)/(1+β) = {limit:.2f} after many observations); "
                         f"P(estimate < truth/10): {np.mean(single < 0.1):.2f} → {np.mean(ema < 0.1):.2f}")

    questions = {
        "ema_decay": "β = 0 keeps only the last δ². How much does β = 0.9 narrow the histogram? β = 0.99?",
        "observations": "An example is seen about B·T/N times in T steps. With β = 0.99, how many are needed?",
    }
    choices = {"β = 0 (last δ² only)": dict(ema_decay=0.0), "β = 0.9, n = 10": dict(ema_decay=0.9, observations=10),
               "β = 0.99, n = 10": dict(ema_decay=0.99, observations=10),
               "β = 0.99, n = 200": dict(ema_decay=0.99, observations=200)}
    return assemble("Why one δ² is not enough: χ²₁ noise and the EMA", controls, questions, choices,
                    {"histogram": fig}, refresh, readout)


# -- 2-D paths on the contours ------------------------------------------------------------------

def _ranking(order: list[str], finals: dict[str, float]) -> str:
    """"oracle p* < SAZO < uniform MeZO"; methods whose gaps read the same (to the readout's 3 digits) are
    joined by "=" (a tiny ε leaves every path at θ₀: a tie, not an order)."""
    text = _LABELS[order[0]]
    for before, method in zip(order, order[1:]):
        text += (" = " if f"{finals[before]:.3g}" == f"{finals[method]:.3g}" else " < ") + _LABELS[method]
    return text



def _names(names: list[str]) -> str:
    """"a", "a and b", "a, b and c"."""
    return names[0] if len(names) == 1 else ", ".join(names[:-1]) + " and " + names[-1]


def paths_dashboard(*, num_examples: int = 32, heterogeneity: float = 2.0, steps: int | None = None,
                    seed: int = 0, grid: int = 60) -> Dashboard:
    """Uniform, SAZO and oracle MeZO paths on the loss contours of a 2-D least-squares problem.

    All three start at θ₀ = 0 with the same η and the same MeZO directions (same seed); only
    the sampled examples differ. Each path is one real run (``sazo_runs.sampler_paths``).
    SAZO runs the plain rule by default: with 32 examples, B = 1 and 100 steps each example is
    seen about three times, so the robust rule's count-capped decay never reaches β (β would do
    nothing) and its first draws of unseen heavy examples carry weights up to 1/λ.

    Example:
        >>> dash = paths_dashboard(steps=20)
        >>> dash.controls["batch_size"].value = 8
    """
    steps = check_int("steps", steps, 1) if steps is not None else 100  # cheap: fast mode draws the class picture
    check_int("grid", grid, 2)   # the contour grid: at least 2 points a side
    problem = problems.LeastSquares(num_examples, 2, heterogeneity=heterogeneity, seed=seed)
    ends = torch.stack([problem.initial_theta(), problem.optimum])
    low, high = ends.min(0).values - 0.8, ends.max(0).values + 0.8
    xs, ys = (np.linspace(float(low[k]), float(high[k]), grid) for k in range(2))
    losses = loss_grid(problem, xs, ys)
    controls = {"eps": log_slider("ε", 1e-3, -10, 0),
                "ema_decay": slider("EMA decay β", 0.9, 0.0, 0.995, 0.005),
                "batch_size": int_slider("batch size B", 1, 1, 32),
                "lr": log_slider("η (all three)", 0.02, -3, -0.5),
                "rule": widgets.ToggleButtons(options=["plain", "robust"], value="plain", description="SAZO rule",
                                              style=dict(description_width="150px"))}
    fig = LiveFigure(layout=dict(title="MeZO paths on the contours of F", height=520, width=620,
                                 margin=dict(l=50, r=15, t=45, b=45)))
    fig.add_contour(x=xs, y=ys, z=np.log10(losses - losses.min() + 1e-3), showscale=False, ncontours=25,
                    colorscale="Greys", reversescale=True, opacity=0.5, hoverinfo="skip",
                    contours=dict(coloring="lines"), name="log F")
    for method in SAMPLERS:
        fig.add_scatter(name=_LABELS[method], mode="lines+markers", marker=dict(size=3),
                        line=dict(color=_COLORS[method], width=1.5))
    fig.add_scatter(name="θ*", mode="markers", marker=dict(symbol="star", size=14, color="gold",
                                                           line=dict(color="black", width=1)),
                    x=[float(problem.optimum[0])], y=[float(problem.optimum[1])])
    fig.update_xaxes(title="θ₁", range=[xs[0], xs[-1]])
    fig.update_yaxes(title="θ₂", range=[ys[0], ys[-1]])
    readout = widgets.HTML()
    cache: dict[tuple, np.ndarray] = {}
    drawn: dict[str, tuple] = {}   # method → key of the path on screen
    state: dict = {}

    def path_key(method: str, values: dict) -> tuple:
        """A method's path depends on β and the rule only if it is SAZO's."""
        relevant = {k: v for k, v in values.items() if method == "sazo" or k not in ("ema_decay", "rule")}
        return method, tuple(sorted(relevant.items()))

    def path(method: str, values: dict) -> np.ndarray:
        key = path_key(method, values)
        if key not in cache:
            with one_thread():
                cache[key] = sampler_paths(problem, steps=steps, seed=seed, samplers=(method,), **values)[method]
        return cache[key]

    verdicts: dict[tuple, tuple] = {}   # path key → its ``divergence`` (computed once per path)

    def divergence(method: str, values: dict, points: np.ndarray) -> tuple[int | None, float]:
        key = path_key(method, values)
        if key not in verdicts:
            verdicts[key] = diverged_at(points)
        return verdicts[key]

    def diverged_at(points: np.ndarray) -> tuple[int | None, float]:
        """(the step at which a path diverged or None, its gap there): the course's rule
        (``sazo_runs.first_divergence``), or a path cut short by a refused non-finite loss."""
        gaps = [problem.gap(torch.as_tensor(point)) for point in points]
        index = first_divergence(gaps)
        if index is not None:
            return index, float(gaps[index])
        if len(points) < steps + 1:
            return len(points), float("inf")
        return None, float(gaps[-1])

    def refresh() -> None:
        values = {name: control.value for name, control in controls.items()}
        finals, jumps, diverged = {}, {}, {}
        for k, method in enumerate(SAMPLERS):  # each changed path is drawn as soon as it is ready
            points = path(method, values)
            at, gap = divergence(method, values, points)
            if at is not None:
                diverged[method] = (at, gap)
                points = points[:at + 1]   # drawn as far as where it diverged (the frame stays on the contours)
            if drawn.get(method) != path_key(method, values):
                with fig.batch_update():
                    fig.data[1 + k].update(x=finite(points[:, 0]), y=finite(points[:, 1]))
                drawn[method] = path_key(method, values)
            finals[method] = problem.gap(torch.as_tensor(points[-1]))
            jumps[method] = float(np.linalg.norm(np.diff(points, axis=0), axis=1).max()) if len(points) > 1 else 0.0
        ranked = [m for m in SAMPLERS if m not in diverged]
        order = sorted(ranked, key=lambda m: finals[m])
        parts = [f"{_LABELS[m]}: gap <b>{finals[m]:.3g}</b>, largest step {jumps[m]:.2g}" for m in ranked]
        parts += [f"{_LABELS[m]}: <b>diverged at step {at}</b>" for m, (at, _gap) in diverged.items()]
        lines = f"after {steps} step{'' if steps == 1 else 's'}: " + "; ".join(parts)
        if order:
            lines += "<br>lowest gap F − F* first: " + _ranking(order, finals) + \
                     (f" (the diverged {'path is' if len(diverged) == 1 else 'paths are'} not ranked)" if diverged else "")
        notes = ""
        if diverged:
            start = problem.gap(problem.initial_theta())
            who = _names([_LABELS[m] for m in diverged])
            hows = "; ".join(f"{_LABELS[m]}'s gap " + (f"passed {DIVERGE_FACTOR:g}× its start ({start:.3g} → {gap:.3g}) "
                                                         f"at step {at}" if np.isfinite(gap) else
                                                         f"loss became infinite at step {at}")
                             for m, (at, gap) in diverged.items())
            notes = divergence_note(f"{who} diverged", hows, "η", values["lr"],
                                    "its path is drawn up to that step" if len(diverged) == 1 else
                                    "each path is drawn up to its step", eps=values["eps"])
        readout.value = notes + lines
        state.update(order=order, finals=finals, jumps=jumps, diverged=diverged)  # what the readout says, for tests

    questions = {
        "eps": "θ is float32: what do the three paths do at ε = 1e-9, where f(θ±εz) round to nearly the same float?",
        "ema_decay": "Only SAZO's path depends on β: does a larger β make it straighter?",
        "batch_size": "Larger B averages more examples per step: do the three paths become alike?",
        "lr": "Raise η until uniform's path jumps around: where are the oracle and SAZO then?",
        "rule": "Switch to the robust rule: why can its first steps be the longest of all on 32 examples?",
    }
    choices = {"large batch": dict(batch_size=16), "large η": dict(lr=0.1), "robust rule": dict(rule="robust")}
    dashboard = assemble("Paths on the contours: what sampling does to each step", controls, questions, choices,
                         {"paths": fig}, refresh, readout)
    dashboard.state = state
    return dashboard

"""Dashboards for notebook 01: the two-point estimator, its error against ε, and its variance.

The maths lives in ``sazo_lite.course``; this module only wires sliders to plots.
"""
from __future__ import annotations

import math

import ipywidgets as widgets
import plotly.graph_objects as go
import torch

from .. import two_point, instruments, mezo_vs_sgd, minibatches
from ..config import one_thread
from ...validation import check_count
from ._common import LiveFigure, Dashboard, assemble, int_slider, log_slider, shown_on_error, slider

__all__ = ["estimator_dashboard", "epsilon_dashboard", "dimension_dashboard"]

_DTYPES = {"float32": torch.float32, "float64": torch.float64}


def _arrow(start: torch.Tensor, vector: torch.Tensor) -> tuple[list[float], list[float]]:
    """x and y lists of a line segment from ``start`` to ``start + vector`` (for an arrow trace)."""
    end = start + vector
    return [float(start[0]), float(end[0])], [float(start[1]), float(end[1])]


def _point(name: str, theta, size: int | None = None) -> torch.Tensor:
    """θ as a float64 vector of finite numbers (``size`` of them if given), or a ValueError naming it."""
    try:
        point = torch.as_tensor(theta, dtype=torch.float64).flatten()
    except (TypeError, ValueError, RuntimeError):
        raise ValueError(f"Invalid {name}: {theta!r} (expected a sequence of numbers)") from None
    expected = f"{size} finite numbers" if size is not None else "at least one finite number"
    if (size is not None and point.numel() != size) or point.numel() == 0 or not bool(point.isfinite().all()):
        raise ValueError(f"Invalid {name}: {theta!r} (expected {expected})")
    return point


def _in_float32(name: str, point: torch.Tensor, largest: torch.Tensor) -> None:
    """Refuse a θ whose loss at the sliders' largest settings (``largest``, f there in float64) overflows float32:
    every difference there is inf − inf = NaN, whatever ε."""
    if not float(largest) < torch.finfo(torch.float32).max:
        raise ValueError(f"Invalid {name}: {tuple(point.tolist())!r} (f(θ) = {float(largest):.3g} there at the sliders' "
                         "largest settings, beyond float32's range: expected a point nearer the minimum θ = 0)")


def _precision_toggle(value: str = "float32") -> widgets.ToggleButtons:
    return widgets.ToggleButtons(options=list(_DTYPES), value=value, description="precision",
                                 style=dict(description_width="150px", button_width="80px"))


# -- the 2-D picture -------------------------------------------------------------------------
def _contour_trace(curvatures, span: float = 2.0, points: int = 41) -> go.Contour:
    """f's contours on [−span, span]²."""
    grid = torch.linspace(-span, span, points, dtype=torch.float64)
    xx, yy = torch.meshgrid(grid, grid, indexing="xy")
    values = two_point.bowl_loss(torch.stack([xx, yy], -1), curvatures)
    return go.Contour(x=grid.tolist(), y=grid.tolist(), z=values.tolist(), showscale=False,
                      colorscale="Blues", opacity=0.5, contours=dict(coloring="lines"), name="f")


def estimator_dashboard(theta=(1.2, 0.8), *, seed: int = 0) -> Dashboard:
    """Two-point estimates on the quadratic f(θ) = ½(a₁θ₁² + a₂θ₂²), drawn as arrows.

    Grey dots are single-direction estimates g_j z_j; the orange arrow is their mean ĝ, the
    black arrow the true gradient. The readout gives ‖ĝ − ∇f‖/‖∇f‖.

    Args:
        theta: the point θ (2 numbers) where the gradient is estimated.
        seed: seed of the first set of directions ("new directions" draws the next ones).
    """
    point = _point("theta", theta, 2)
    controls = {
        "q": int_slider("directions q", 4, 1, 400),
        "eps": log_slider("ε", 1e-3, -10, 0),
        "curvature": slider("curvature a₂", 4.0, 0.25, 20.0, 0.25),
        "precision": _precision_toggle(),
    }
    # ‖∇f‖ is least at the smallest a₂; a θ so near 0 that its squares underflow has ‖∇f‖ = 0, as θ = 0 itself
    if not float(two_point.bowl_grad(point, [1.0, controls["curvature"].min]).norm()) > 0:
        raise ValueError(f"Invalid theta: {tuple(theta)!r} (‖∇f(θ)‖ = 0 there in float64: expected a point other "
                         "than the minimum θ = (0, 0), the arrows are drawn relative to ‖∇f‖)")
    _in_float32("theta", point, two_point.bowl_loss(point, [1.0, controls["curvature"].max]))
    # the view holds θ and the true arrow (length 1) around it: a θ beyond ±2 was drawn off the plot
    span = max(2.0, float(point.abs().max()) + 1.0)
    state = {"seed": seed}
    fig = LiveFigure(layout=dict(width=520, height=480, xaxis=dict(range=[-span, span], title="θ₁"),
                                 yaxis=dict(range=[-span, span], title="θ₂", scaleanchor="x"),
                                 margin=dict(l=40, r=10, t=30, b=40), legend=dict(x=0, y=1)))
    fig.add_trace(_contour_trace([1.0, controls["curvature"].value], span))
    fig.add_scatter(mode="markers", marker=dict(color="grey", size=5), name="single estimates g_j z_j")
    fig.add_scatter(mode="lines+markers", line=dict(color="black", width=3),
                    marker=dict(symbol="arrow", angleref="previous", size=14), name="true ∇f")
    fig.add_scatter(mode="lines+markers", line=dict(color="darkorange", width=3),
                    marker=dict(symbol="arrow", angleref="previous", size=14), name="estimate ĝ (mean)")
    readout = widgets.HTML()

    def refresh() -> None:
        curvatures = [1.0, controls["curvature"].value]
        fn = lambda x: two_point.bowl_loss(x, curvatures)
        dtype = _DTYPES[controls["precision"].value]
        z = two_point.random_directions(controls["q"].value, 2, seed=state["seed"])
        _, singles = two_point.two_point_estimates(fn, point.to(dtype), z, controls["eps"].value)
        singles, true = singles.double(), two_point.bowl_grad(point, curvatures)
        mean = singles.mean(0)
        scale = 1.0 / float(true.norm())  # the true arrow has length 1
        cloud = point + scale * singles
        error = float((mean - true).norm() / true.norm())
        with fig.batch_update():
            contour = _contour_trace(curvatures, span)
            fig.data[0].z = contour.z
            fig.data[1].x, fig.data[1].y = cloud[:, 0].tolist(), cloud[:, 1].tolist()
            fig.data[2].x, fig.data[2].y = _arrow(point, scale * true)
            fig.data[3].x, fig.data[3].y = _arrow(point, scale * mean)
        state["error"] = error
        if not bool(singles.ne(0).any()):   # a tiny ε: f(θ+εz) and f(θ−εz) are the same float
            readout.value = (f"relative error ‖ĝ − ∇f‖/‖∇f‖ = <b>{error:.3g}</b>: at ε = {controls['eps'].value:.1g} "
                             f"every f(θ+εz) − f(θ−εz) rounds to 0 in {controls['precision'].value}, so ĝ = 0 "
                             "whatever q (√(3/q) is the error of exact differences)")
            return
        readout.value = (f"relative error ‖ĝ − ∇f‖/‖∇f‖ = <b>{error:.3g}</b> "
                         f"(expected about √(3/q) = {math.sqrt(3 / controls['q'].value):.3g} for Gaussian z in d = 2)")

    def new_directions(_button) -> None:
        state["seed"] += 1
        refresh()

    button = widgets.Button(description="new directions")
    button.on_click(shown_on_error(new_directions, readout))
    questions = {
        "q": "How many directions until the orange arrow sits on the black one? Does the error fall like 1/√q?",
        "eps": "For a quadratic the central difference is exact: can any ε break it? (Try the smallest in float32.)",
        "curvature": "Stretch the bowl: do the single estimates still scatter around the true gradient?",
        "precision": "Does float64 rescue a tiny ε?",
    }
    choices = {"one direction": dict(q=1, eps=1e-3, precision="float32"),
               "many directions": dict(q=200, eps=1e-3, precision="float32"),
               "ε too small": dict(q=50, eps=1e-9, precision="float32"),
               "ill-conditioned": dict(q=50, curvature=20.0, eps=1e-3)}
    dashboard = assemble("Two-point estimates of a gradient", controls, questions, choices,
                         {"arrows": fig}, refresh, readout, extra_rows=[button])
    dashboard.state = state
    return dashboard


# -- the U-shaped error curve ----------------------------------------------------------------
def epsilon_dashboard(theta=(1.0, -0.8, 0.5), *, num_directions: int = 8) -> Dashboard:
    """Relative error of one finite difference, |g(z) − zᵀ∇f|/|zᵀ∇f|, against ε (log-log).

    f(θ) = Σ_j (a_j/2)θ_j² + (κ/4)Σ_j θ_j⁴ + c: the quartic term κ gives the third-derivative error
    at large ε (∝ ε²), the precision and the loss level c set the rounding error at tiny ε (∝ u·|f|/ε).
    """
    point = _point("theta", theta)
    if not bool(point.ne(0).any()):
        raise ValueError(f"Invalid theta: {tuple(theta)!r} (∇f(θ) = 0 there: expected a point other than the "
                         "minimum θ = 0, the errors are relative to zᵀ∇f)")
    check_count("num_directions", num_directions)
    curvatures = torch.linspace(1.0, 3.0, len(point), dtype=torch.float64)
    grid = torch.logspace(-10, 0, 41, dtype=torch.float64)
    controls = {
        "eps": log_slider("ε", 1e-3, -10, 0),
        "precision": _precision_toggle(),
        "quartic": slider("quartic term κ", 1.0, 0.0, 5.0, 0.25),
        "offset": slider("loss level c", 0.0, 0.0, 1000.0, 10.0),
    }
    _in_float32("theta", point,
                two_point.bowl_loss(point, curvatures, controls["quartic"].max, controls["offset"].max))
    fig = LiveFigure(layout=dict(width=620, height=420, margin=dict(l=50, r=10, t=30, b=50),
                                 xaxis=dict(type="log", title="ε", exponentformat="power"),
                                 yaxis=dict(type="log", title="relative error of g(z)", exponentformat="power")))
    for name in _DTYPES:
        fig.add_scatter(x=grid.tolist(), mode="lines", name=name)
    fig.add_scatter(mode="markers", marker=dict(size=14, color="crimson"), name="current ε")
    readout = widgets.HTML()
    by_function: dict[tuple, dict] = {}   # (κ, c) → both U curves: moving ε or the precision reuses them

    def refresh() -> None:
        quartic, offset = controls["quartic"].value, controls["offset"].value
        fn = lambda x: two_point.bowl_loss(x, curvatures, quartic, offset)
        grad = two_point.bowl_grad(point, curvatures, quartic)
        precision, eps = controls["precision"].value, controls["eps"].value
        if (quartic, offset) not in by_function:
            by_function[(quartic, offset)] = {
                name: two_point.error_vs_eps(fn, grad, point, grid, dtype=dtype,
                                             num_directions=num_directions).clamp_min(1e-17)
                for name, dtype in _DTYPES.items()}
        curves = by_function[(quartic, offset)]
        z = two_point.random_directions(num_directions, len(point))
        current = max(two_point.directional_error(fn, grad, point.to(_DTYPES[precision]), z, eps), 1e-17)
        with fig.batch_update():
            for trace, name in zip(fig.data[:2], _DTYPES):
                trace.y = curves[name].tolist()
                trace.line.width = 4 if name == precision else 1.5
                trace.opacity = 1.0 if name == precision else 0.35
            fig.data[2].x, fig.data[2].y = [eps], [current]
        best = int(curves[precision].argmin())
        lowest = float(curves[precision][best])
        # at a large θ every ε may round θ ± εz or f to the same float (g = 0, error 1): the "best" would be the first
        bottom = (f"best ε on the grid ≈ {float(grid[best]):.0e} (error {lowest:.1g})" if lowest < 1.0 else
                  f"no ε on the grid does better than g = 0 (error {lowest:.1g}): at this θ rounding wins at every ε")
        readout.value = f"error at ε = {eps:.1e} in {precision}: <b>{current:.2g}</b>; {bottom}"

    questions = {
        "eps": "Where is the bottom of the U? Which side is the third-derivative bias, which side is rounding?",
        "precision": "How far does float64 move the best ε, and why roughly to the cube root of the unit round-off?",
        "quartic": "Set κ = 0 (a quadratic): what happens to the right arm of the U?",
        "offset": "A large loss value: which arm moves, and why does adding a constant change anything?",
    }
    choices = {"ε too small": dict(eps=1e-9, precision="float32"),
               "ε too large": dict(eps=0.5, precision="float32"),
               "quadratic (κ = 0)": dict(quartic=0.0),
               "float64": dict(precision="float64", eps=1e-5)}
    return assemble("Error of the two-point difference against ε", controls, questions, choices,
                    {"curve": fig}, refresh, readout)


# -- variance against d and q ----------------------------------------------------------------
def dimension_dashboard(dims=(2, 4, 8, 16, 32, 64, 128, 256, 512), *, directions_drawn: int = 800) -> Dashboard:
    """E‖ĝ − ∇f‖²/‖∇f‖² against the dimension d for q directions: Monte-Carlo dots, (d+1)/q line.

    Each dot averages ``directions_drawn // q`` trials (at least 16), so redraws cost about the same for any q.
    """
    dims = sorted(set(check_count("dims", d) for d in dims))   # the theory line runs left to right, each d once
    check_count("directions_drawn", directions_drawn)   # -5 or 2.5 drew 16 trials a dot without a word
    if not dims:
        raise ValueError("Invalid dims: expected at least one dimension to draw")
    controls = {"q": int_slider("directions q", 1, 1, 64),
                "perturbation": widgets.ToggleButtons(options=["gaussian", "rademacher"], description="direction z",
                                                      style=dict(description_width="150px", button_width="110px"))}
    fig = LiveFigure(layout=dict(width=620, height=420, margin=dict(l=50, r=10, t=30, b=50),
                                 xaxis=dict(type="log", title="dimension d"),
                                 yaxis=dict(type="log", title="E‖ĝ − ∇f‖² / ‖∇f‖²")))
    fig.add_scatter(x=list(dims), mode="markers", marker=dict(size=9), name="Monte-Carlo")
    fig.add_scatter(x=list(dims), mode="lines", name="theory")
    fig.add_scatter(x=list(dims), y=[1.0] * len(dims), mode="lines", line=dict(dash="dot", color="grey"),
                    name="error as large as the gradient")
    readout = widgets.HTML()
    cache: dict[tuple, list[float]] = {}

    def refresh() -> None:
        q, perturbation = controls["q"].value, controls["perturbation"].value
        key = (q, perturbation)
        if key not in cache:
            with one_thread():
                trials = max(16, directions_drawn // q)
                cache[key] = [two_point.relative_error_monte_carlo(d, q, trials=trials, perturbation=perturbation)
                              for d in dims]
        theory = [two_point.relative_error_theory(d, q, perturbation) for d in dims]
        # d = 1 with ±1 directions: z zᵀa = a, an error of exactly 0, which a log axis cannot show: marked at its foot
        exact = [d for d, t in zip(dims, theory) if t == 0]
        with fig.batch_update():
            fig.data[0].y = [y if t > 0 else None for y, t in zip(cache[key], theory)]   # there: rounding at most
            fig.data[1].y = [t if t > 0 else None for t in theory]
            fig.data[1].name = "(d+1)/q" if perturbation == "gaussian" else "(d−1)/q"
            fig.layout.annotations = [dict(x=math.log10(d), y=0, xref="x", yref="paper", yanchor="bottom",
                                           showarrow=False, text="▼ 0: exact") for d in exact]
        threshold = q - 1 if perturbation == "gaussian" else q + 1   # where (d ± 1)/q = 1
        # from the smallest d drawn: "every d ≥ 2" was said with d = 1 drawn too (Gaussian, q = 1: an error of 2)
        when = f"once d ≈ {threshold}" if threshold > dims[0] else f"at every d drawn (d ≥ {dims[0]})"
        readout.value = (f"with q = {q}: the estimate is as noisy as the gradient is large {when}; "
                         "a 1B-parameter model has d = 10⁹")
        if exact:
            readout.value += ("; at d = 1 a ±1 direction gives the gradient exactly (z² = 1): an error of 0, "
                              "marked ▼ at the foot of the log axis")

    questions = {
        "q": "Double q: by how much does the whole line drop? What does that cost in forward passes?",
        "perturbation": "Does ±1 beat Gaussian noise? By how much, at d = 2 and at d = 512?",
    }
    choices = {"one direction": dict(q=1), "q = 64": dict(q=64)}
    return assemble("Variance of the ZO estimate against dimension", controls, questions, choices,
                    {"variance": fig}, refresh, readout)

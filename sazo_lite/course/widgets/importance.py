"""Dashboards for notebook 03: importance sampling of the minibatch and the minimum-variance oracle.

All three use least squares with heterogeneity σ (``problems.LeastSquares``), evaluated at
θ_t = θ₀ + t(θ* − θ₀), where the "training progress" t stands in for how far training has got.
The maths lives in ``sazo_lite.variance`` and ``sazo_lite.course``.
"""
from __future__ import annotations

import ipywidgets as widgets
import plotly.graph_objects as go
import torch

from .. import two_point, instruments, mezo_vs_sgd, minibatches, problems
from ... import variance
from ...validation import check_int
from ..config import one_thread
from ._common import LiveFigure, Dashboard, assemble, int_slider, slider

__all__ = ["importance_dashboard", "unbiased_dashboard", "batch_gain_dashboard", "gain_over_training_figure"]


class _Snapshots:
    """Least-squares problems by σ and their per-example gradients by (σ, t), computed once."""

    def __init__(self, num_examples: int, dim: int, seed: int):
        self.num_examples, self.dim, self.seed = num_examples, dim, seed
        self._problems: dict[float, problems.LeastSquares] = {}
        self._grads: dict[tuple[float, float], torch.Tensor] = {}

    def problem(self, sigma: float) -> problems.LeastSquares:
        sigma = round(float(sigma), 6)
        if sigma not in self._problems:
            self._problems[sigma] = problems.LeastSquares(self.num_examples, self.dim, heterogeneity=sigma,
                                                          seed=self.seed)
        return self._problems[sigma]

    def grads(self, sigma: float, progress: float) -> torch.Tensor:
        """∇f_i(θ_t) for every example, [N, d]."""
        key = (round(float(sigma), 6), round(float(progress), 6))
        if key not in self._grads:
            problem = self.problem(sigma)
            self._grads[key] = problem.per_example_grads(minibatches.path_point(problem, progress))
        return self._grads[key]


def _sampling_distributions(norms: torch.Tensor, uniform_mix: float) -> dict[str, torch.Tensor]:
    uniform = torch.full_like(norms, 1.0 / len(norms))
    oracle = variance.oracle_probs(norms)
    return {"uniform": uniform, f"mix λ = {uniform_mix:.2f}": variance.mix_with_uniform(oracle, uniform_mix),
        "oracle p*": oracle}


def _sigma_slider(value: float = 1.5):
    return slider("heterogeneity σ", value, 0.0, 2.0, 0.1)


def _progress_slider(value: float = 0.5):
    return slider("training progress t", value, 0.0, 1.0, 0.05)


# -- Monte-Carlo variance under three samplers, and the 1 + CV² law -----------------------------
def importance_dashboard(*, num_examples: int = 256, dim: int = 20, trials: int = 10000, seed: int = 0) -> Dashboard:
    """E‖ĝ‖² of the minibatch ZO estimate under uniform, mixed and oracle sampling.

    Each Monte-Carlo value averages max(2000, trials // B) draws (noise also falls with B); its
    error bar and the readout's ± are two standard errors. Left: Monte-Carlo E‖ĝ‖² (bars) and theory (d+2)[V(p)/B + (1−1/B)‖∇F‖²] (diamonds), both
    divided by the oracle's theory value. Right: V(u)/V(p*) against σ: the line is 1 + CV² of
    the norms, the dots Monte-Carlo ratios at B = 1.
    """
    check_int("trials", trials, 2)   # the law's Monte-Carlo dots draw trials // 2 minibatches each
    snapshots = _Snapshots(num_examples, dim, seed)
    sigma_grid = [round(0.25 * k, 2) for k in range(9)]
    controls = {"sigma": _sigma_slider(), "uniform_mix": slider("uniform mix λ", 0.3, 0.0, 1.0, 0.05),
                "batch_size": int_slider("batch size B", 1, 1, 64), "progress": _progress_slider()}
    bars = LiveFigure(layout=dict(width=470, height=380, margin=dict(l=50, r=10, t=30, b=40),
                                  xaxis_title="sampling distribution p", yaxis_title="E‖ĝ‖² / oracle's", legend=dict(x=0.45, y=1)))
    bars.add_bar(name="Monte-Carlo", marker_color="lightsteelblue")
    bars.add_scatter(mode="markers", marker=dict(symbol="diamond", size=12, color="black"), name="theory")
    law = LiveFigure(layout=dict(width=470, height=380, margin=dict(l=50, r=10, t=30, b=40),
                                 xaxis_title="heterogeneity σ", yaxis=dict(type="log", title="V(u) / V(p*)"),
                                 legend=dict(x=0, y=1)))
    law.add_scatter(x=sigma_grid, mode="lines", name="1 + CV²")
    law.add_scatter(x=sigma_grid, mode="markers", marker=dict(size=9), name="Monte-Carlo, B = 1")
    law.add_scatter(mode="markers", marker=dict(size=16, color="crimson", symbol="circle-open", line_width=3),
                    name="current σ")
    readout = widgets.HTML()
    law_cache: dict[float, tuple[list[float], list[float]]] = {}
    moment_cache: dict[tuple, tuple[float, float, float]] = {}

    def second_moments(grads, probs, batch_size, mc_seed):
        norms, full = grads.norm(dim=1), float(grads.mean(0).norm())
        theory = variance.zo_second_moment(norms, probs, full, grads.shape[1], batch_size)
        draws = minibatches.minibatch_zo_estimates(grads, probs, batch_size, max(2000, trials // batch_size),
                                                  seed=mc_seed)
        return (*minibatches.second_moment_estimate(draws), theory)   # Monte-Carlo, its standard error, theory

    def law_curve(progress):
        if progress not in law_cache:
            gains, ratios = [], []
            for sigma in sigma_grid:
                grads = snapshots.grads(sigma, progress)
                probs = _sampling_distributions(grads.norm(dim=1), 0.0)
                mc = [float((minibatches.minibatch_zo_estimates(grads, probs[k], 1, trials // 2, seed=seed) ** 2)
                            .sum(1).mean()) for k in ("uniform", "oracle p*")]
                gains.append(variance.uniform_gain(grads.norm(dim=1)))
                ratios.append(mc[0] / mc[1])
            law_cache[progress] = gains, ratios
        return law_cache[progress]

    def refresh() -> None:
        sigma, mix = controls["sigma"].value, controls["uniform_mix"].value
        batch_size, progress = controls["batch_size"].value, controls["progress"].value
        with one_thread():
            grads = snapshots.grads(sigma, progress)
            probs = _sampling_distributions(grads.norm(dim=1), mix)
            moments = {}
            for k, (name, p) in enumerate(probs.items()):
                # uniform's and the oracle's bars do not depend on λ: moving λ draws only the mix's
                key = (round(sigma, 6), round(progress, 6), batch_size, k, mix if k == 1 else None)
                if key not in moment_cache:
                    moment_cache[key] = second_moments(grads, p, batch_size, seed)
                moments[name] = moment_cache[key]
            gains, ratios = law_curve(progress)
            current_gain = variance.uniform_gain(grads.norm(dim=1))
        reference = moments["oracle p*"][2]
        with bars.batch_update(), law.batch_update():
            bars.data[0].x = bars.data[1].x = list(moments)
            bars.data[0].y = [mc / reference for mc, _, _ in moments.values()]
            bars.data[0].error_y = dict(type="data", array=[2 * error / reference for _, error, _ in moments.values()])
            bars.data[1].y = [theory / reference for _, _, theory in moments.values()]
            law.data[0].y, law.data[1].y = gains, ratios
            law.data[2].x, law.data[2].y = [sigma], [current_gain]
        (uniform, u_error, u_theory), (oracle, o_error, _) = moments["uniform"], moments["oracle p*"]
        ratio = uniform / oracle
        error = 2 * ratio * ((u_error / uniform) ** 2 + (o_error / oracle) ** 2) ** 0.5   # ≈ 95% (delta method)
        readout.value = (f"1 + CV² = <b>{current_gain:.3g}</b>; V(mix)/V(p*) = "
                         f"{variance.variance_ratio(grads.norm(dim=1), list(probs.values())[1]):.3g}; "
                         f"uniform/oracle E‖ĝ‖²: theory {u_theory / reference:.3g}, "
                         f"Monte-Carlo {ratio:.3g} ± {error:.2g} (95%, {max(2000, trials // batch_size):,} draws)")

    questions = {
        "sigma": "How heterogeneous must the examples be before the oracle is worth having?",
        "uniform_mix": "How much uniform mixing can you add and keep most of the oracle's gain?",
        "batch_size": "Why do all bars move closer together as B grows?",
        "progress": "Early (t = 0) or late (t = 1) in training: when does sampling matter more?",
    }
    choices = {"homogeneous data": dict(sigma=0.0), "oracle": dict(uniform_mix=0.0),
               "uniform": dict(uniform_mix=1.0), "large batch": dict(batch_size=64),
               "late in training": dict(progress=1.0, batch_size=1)}
    return assemble("Importance sampling: uniform, mixed and the oracle", controls, questions, choices,
                    {"variance": bars, "law": law}, refresh, readout)


# -- the weights keep the estimate unbiased ---------------------------------------------------------
def unbiased_dashboard(*, num_examples: int = 256, dim: int = 20, trials: int = 4000, bins: int = 40,
                       seed: int = 0) -> Dashboard:
    """Histograms of minibatch loss estimates F̂ = (1/B)Σ w_k f_{i_k} under p = (1−λ)p* + λ/N.

    With the weights w = 1/(N p_i) the mean (diamond) sits on F (dashed line); without them it
    drifts towards Σ_i p_i f_i, the loss of the examples p prefers.
    """
    check_int("bins", bins, 1)
    snapshots = _Snapshots(num_examples, dim, seed)
    controls = {"sigma": _sigma_slider(), "uniform_mix": slider("uniform mix λ", 0.0, 0.0, 1.0, 0.05),
                "batch_size": int_slider("batch size B", 8, 1, 64), "progress": _progress_slider(0.0)}
    fig = LiveFigure(layout=dict(width=640, height=400, barmode="overlay", margin=dict(l=50, r=10, t=30, b=50),
                                 xaxis_title="minibatch estimate of F", yaxis_title="count"))
    fig.add_bar(name="weighted w = 1/(N p_i)", marker_color="darkorange", opacity=0.6)
    fig.add_bar(name="unweighted (w = 1)", marker_color="grey", opacity=0.5)
    fig.add_scatter(mode="lines", line=dict(color="black", dash="dash", width=2), name="true F")
    fig.add_scatter(mode="markers", marker=dict(symbol="diamond", size=14, color=["darkorange", "grey"]),
                    name="means")
    readout = widgets.HTML()

    def refresh() -> None:
        sigma, mix = controls["sigma"].value, controls["uniform_mix"].value
        batch_size, progress = controls["batch_size"].value, controls["progress"].value
        with one_thread():
            problem = snapshots.problem(sigma)
            theta = minibatches.path_point(problem, progress)
            losses = problem.losses(theta)
            probs = variance.mix_with_uniform(variance.oracle_probs(problem.norms(theta)), mix)
            samples = [minibatches.weighted_loss_estimates(losses, probs, batch_size, trials, seed=seed, weighted=w)
                       for w in (True, False)]
        full = float(losses.mean())
        low, high = float(min(s.min() for s in samples)), float(max(s.max() for s in samples))
        low, high = min(low, full), max(high, full)
        width = (high - low) / bins or 1.0
        centres = [low + (k + 0.5) * width for k in range(bins)]
        # low + bins·width can round below the largest estimate, and histc drops what is beyond its max: at B = 1 many
        # estimates are that one largest loss (50 of 300 went missing at σ = 1.8, λ = 0)
        counts = [torch.histc(s, bins=bins, min=low, max=max(low + bins * width, high)) for s in samples]
        with fig.batch_update():
            for trace, count in zip(fig.data[:2], counts):
                trace.x, trace.y, trace.width = centres, count.tolist(), width
            fig.data[2].x, fig.data[2].y = [full, full], [0, float(max(c.max() for c in counts))]
            fig.data[3].x, fig.data[3].y = [float(s.mean()) for s in samples], [0, 0]
        drawn = probs[probs > 0]   # an example of p_i = 0 (a norm of 0 at λ = 0) is never drawn: it has no weight
        never = len(probs) - len(drawn)
        readout.value = (f"F = {full:.4g}; mean of weighted estimates {float(samples[0].mean()):.4g}, "
                         f"unweighted {float(samples[1].mean()):.4g}; largest weight 1/(N p_i) = "
                         f"{float(1 / (num_examples * drawn.min())):.3g}"
                         + (f" ({never} example{'s' if never > 1 else ''} with p_i = 0, never drawn)" if never else ""))

    questions = {
        "sigma": "Which estimate drifts away from F as the examples get more different?",
        "uniform_mix": "At λ = 1 the weights are all 1: what happens to the two histograms?",
        "batch_size": "Does a larger B remove the bias of the unweighted estimate, or only its spread?",
        "progress": "The oracle follows gradient norms, not losses: does the bias change sign anywhere?",
    }
    choices = {"oracle": dict(uniform_mix=0.0), "uniform": dict(uniform_mix=1.0),
               "homogeneous data": dict(sigma=0.0), "large batch": dict(batch_size=64)}
    return assemble("The weights 1/(N p_i) keep the estimate unbiased", controls, questions, choices,
                    {"histogram": fig},
                     refresh, readout)


# -- the gain against batch size and training progress ------------------------------------------
def batch_gain_dashboard(*, num_examples: int = 256, dim: int = 20, seed: int = 0) -> Dashboard:
    """E‖ĝ‖²(uniform) / E‖ĝ‖²(oracle) against B (left) and against training progress t (right).

    Closed form (``minibatches.gain_vs_batch``): 1 + CV² at B = 1, shrinking with B because the
    (1 − 1/B)‖∇F‖² term does not depend on p. Late in training that term vanishes and the gain
    tends to 1 + CV² of the current norms: it rises at large B, and at B = 1 simply follows how
    spread the norms are (the right plot draws B = 1, B = 64 and the current B).
    """
    snapshots = _Snapshots(num_examples, dim, seed)
    batch_grid = [1, 2, 4, 8, 16, 32, 64, 128, 256]
    progress_grid = [round(0.05 * k, 2) for k in range(21)]
    controls = {"sigma": _sigma_slider(), "batch_size": int_slider("batch size B", 8, 1, 256),
                "progress": _progress_slider()}
    layout = dict(width=470, height=380, margin=dict(l=50, r=10, t=30, b=50), legend=dict(x=0.3, y=1),
                  yaxis=dict(type="log", title="gain: uniform / oracle"))
    by_batch = LiveFigure(layout=dict(layout, xaxis=dict(type="log", title="batch size B")))
    by_batch.add_scatter(x=batch_grid, mode="lines", name="at t = 0 (start)", line=dict(dash="dot"))
    by_batch.add_scatter(x=batch_grid, mode="lines", name="at current t")
    by_batch.add_scatter(mode="markers", marker=dict(size=14, color="crimson"), name="current B")
    by_progress = LiveFigure(layout=dict(layout, xaxis=dict(title="training progress t")))
    by_progress.add_scatter(x=progress_grid, mode="lines", name="B = 1 (1 + CV²)", line=dict(dash="dot"))
    by_progress.add_scatter(x=progress_grid, mode="lines", name="current B")
    by_progress.add_scatter(x=progress_grid, mode="lines", name="B = 64", line=dict(dash="dash"))
    by_progress.add_scatter(mode="markers", marker=dict(size=14, color="crimson"), name="current t")
    readout = widgets.HTML()

    def gains(sigma, progress, batch_sizes):
        grads = snapshots.grads(sigma, progress)
        return minibatches.gain_vs_batch(grads.norm(dim=1), float(grads.mean(0).norm()), grads.shape[1], batch_sizes)

    def refresh() -> None:
        sigma, batch_size, progress = (controls[k].value for k in ("sigma", "batch_size", "progress"))
        with one_thread():
            start, now = gains(sigma, 0.0, batch_grid), gains(sigma, progress, batch_grid)
            over_t = [gains(sigma, t, [1, batch_size, 64]) for t in progress_grid]
            current = float(gains(sigma, progress, [batch_size])[0])
        with by_batch.batch_update(), by_progress.batch_update():
            by_batch.data[0].y, by_batch.data[1].y = start.tolist(), now.tolist()
            by_batch.data[2].x, by_batch.data[2].y = [batch_size], [current]
            by_progress.data[0].y = [float(g[0]) for g in over_t]
            by_progress.data[1].y = [float(g[1]) for g in over_t]
            by_progress.data[2].y = [float(g[2]) for g in over_t]
            by_progress.data[3].x, by_progress.data[3].y = [progress], [current]
        readout.value = (f"gain at B = {batch_size}, t = {progress:.2f}: <b>{current:.3g}</b> "
                         f"(1 + CV² = {float(now[0]):.3g} is the most it can be)")

    questions = {
        "sigma": "With σ = 0, is there any B or t at which the oracle helps?",
        "batch_size": "Double B: how much of the gain survives? Why does the ‖∇F‖² term not care about p?",
        "progress": "Slide to the optimum (t = 1): why does the gain stop depending on B there?",
    }
    choices = {"large batch": dict(batch_size=256), "late in training": dict(progress=1.0),
               "early in training": dict(progress=0.0), "homogeneous data": dict(sigma=0.0)}
    return assemble("Where importance sampling pays: batch size and training progress", controls, questions, choices,
                    {"by_batch": by_batch, "by_progress": by_progress}, refresh, readout)


def gain_over_training_figure(problem, batch_sizes=(1, 8, 64), points: int = 41) -> go.Figure:
    """The oracle's gain over uniform against training progress t, one line per B (static).

    Shows both late-training effects (``minibatches.gain_along_path``): at large B the gain
    rises as the (1 − 1/B)‖∇F‖² term vanishes; at B = 1 it follows 1 + CV² of the current norms.
    Trace k is B = ``batch_sizes[k]``: x the t grid, y the gains.
    """
    points = check_int("points", points, 2)   # t runs from 0 to 1
    progress = [k / (points - 1) for k in range(points)]
    gains = minibatches.gain_along_path(problem, batch_sizes, progress)
    fig = go.Figure(layout=dict(title="oracle's gain over uniform along training, by batch size", height=380,
                                width=640, margin=dict(l=60, r=20, t=50, b=50),
                                xaxis=dict(title="training progress t (0: θ₀, 1: θ*)"),
                                yaxis=dict(type="log", title="E‖ĝ‖²: uniform / oracle")))
    for b, gain in gains.items():   # (batch_sizes may be a generator, read once by gain_along_path)
        fig.add_scatter(x=progress, y=gain.tolist(), mode="lines", name=f"B = {b}" + (" (1 + CV²)" if b == 1 else ""))
    return fig

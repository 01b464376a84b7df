"""Red-team round 8 on the course layer: the dashboards as students and instructors drive them.

Each test drives a dashboard the way a notebook does (set a control, press a preset, call a helper)
at an extreme the earlier tests did not reach, and checks what the student then reads or sees.
"""
from __future__ import annotations

import json
import math
import re
from pathlib import Path

import numpy as np
import pytest

pytest.importorskip("ipywidgets")
pytest.importorskip("plotly")

from sazo_lite.course import memory, problems  # noqa: E402
from sazo_lite.course import widgets as sw  # noqa: E402
from sazo_lite.course.memory import LADDERS, TrainSetup  # noqa: E402
from sazo_lite.course.widgets import race as race_widgets  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]


def text(html: str) -> str:
    return re.sub(r"<[^>]+>", "", html)


def preset_buttons(dashboard) -> dict:
    return next(row.buttons for row in dashboard.children if hasattr(row, "buttons"))


# -- notebook 07: the memory calculator ------------------------------------------------------------

@pytest.mark.parametrize("context", [512, 131072])
def test_memory_readout_says_what_the_size_ratio_means_at_every_budget(context):
    """A tiny budget gives ``size_ratio`` < 1, inf or NaN: the sentence must still be true and readable
    (it said "ZO trains a BP fits nothing larger model", and "a 0.8× larger model")."""
    board = sw.memory_dashboard()
    board.controls["context"].value = context
    seen = set()
    for budget in (2.0, 3.0, 5.0, 17.0, 40.0, 160.0):
        board.controls["budget"].value = budget
        shape = LADDERS["qwen2.5"][2]
        setup = TrainSetup(context=context, batch=board.controls["batch"].value)
        size = memory.size_ratio(shape, setup, budget)
        shown = text(board.readout.value)
        if math.isfinite(size) and size >= 1:
            seen.add("larger")
            assert f"ZO trains a {size:.1f}× larger model" in shown, shown
        elif math.isfinite(size):
            seen.add("smaller")
            assert "larger model" not in shown and "smaller model" in shown and f"{size:.1f}×" in shown, shown
        elif size == math.inf:
            seen.add("inf")
            assert "larger model" not in shown and "BP cannot train any model of this width" in shown, shown
        else:
            seen.add("nan")
            assert "larger model" not in shown and "neither BP nor ZO" in shown, shown
        assert "BP fits nothing larger" not in shown
    assert len(seen) >= 2  # the sweep reaches a non-ordinary case at each context


def _notebook_07_setup() -> tuple[float, TrainSetup]:
    """The 17 GB setup the cell under notebook 07's "What would you choose?" prints its answer from."""
    notebook = json.loads((ROOT / "notebooks" / "07_memory_on_device.ipynb").read_text())
    for cell in notebook["cells"]:
        source = "".join(cell["source"])
        found = re.search(r"setup17 = (TrainSetup\([^)]*\))", source)
        if cell["cell_type"] == "code" and found:
            budget = float(re.search(r"largest_fitting\(ladder, setup17, ([0-9.]+)", source).group(1))
            return budget, eval(found.group(1), {"TrainSetup": TrainSetup})
    raise AssertionError("notebook 07 no longer has its setup17 cell")


def test_the_17_gb_preset_is_the_setup_notebook_07_answers_from():
    """Notebook 07 sends students to the preset "17 GB device" and answers from ``setup17`` (n_ctx = 256):
    the preset set n_ctx = 512, where BP fits Qwen2.5-0.5B, not the answer's Qwen2.5-1.5B."""
    budget, setup = _notebook_07_setup()
    board = sw.memory_dashboard()
    for family, ladder in LADDERS.items():
        board.controls["preset"].value = ladder[-1].name
        preset_buttons(board)["17 GB device"].click()
        c = board.controls
        assert (c["budget"].value, c["context"].value, c["batch"].value, c["dtype"].value) == \
               (budget, setup.context, setup.batch, setup.dtype)
        assert (c["checkpointing"].value, c["attention"].value, c["optimizer"].value) == \
               (setup.checkpointing, setup.attention, setup.optimizer)
        fits = {m: memory.largest_fitting(ladder, setup, budget, m) for m in ("bp", "zo")}
        shown = text(board.readout.value)
        assert f"BP → {fits['bp'].name}" in shown and f"ZO → {fits['zo'].name}" in shown, (family, shown)


# -- notebook 01: bad points -----------------------------------------------------------------------

@pytest.mark.parametrize("factory, theta", [
    (sw.estimator_dashboard, (0.0, 0.0)),          # the minimum: ∇f = 0, every arrow divided by 0
    (sw.estimator_dashboard, (1.0, 2.0, 3.0)),     # the picture is 2-D
    (sw.estimator_dashboard, (1.0, float("nan"))),
    (sw.epsilon_dashboard, (0.0, 0.0, 0.0)),       # zᵀ∇f = 0: every relative error is 0/0
    (sw.epsilon_dashboard, ()),
])
def test_a_bad_point_is_a_value_error_naming_theta(factory, theta):
    with pytest.raises(ValueError, match="theta"):
        factory(theta=theta)


# -- notebook 05: the 2-D paths --------------------------------------------------------------------

def test_paths_readout_calls_a_tie_a_tie():
    """At ε = 1e-10 (float32) no path leaves θ₀: the readout ranked three equal gaps with "<"."""
    board = sw.paths_dashboard(steps=20)
    board.controls["eps"].value = 1e-10
    shown = [f"{board.state['finals'][m]:.3g}" for m in board.state["order"]]
    ranking = text(board.readout.value).split("lowest gap F − F* first: ")[1]
    assert len(set(shown)) == 1 and ranking.count(" = ") == 2 and " < " not in ranking, ranking
    board.controls["eps"].value = 1e-3   # back to three different gaps: a strict order
    shown = [f"{board.state['finals'][m]:.3g}" for m in board.state["order"]]
    ranking = text(board.readout.value).split("lowest gap F − F* first: ")[1]
    assert ranking.count(" < ") == sum(a != b for a, b in zip(shown, shown[1:]))


# -- notebook 03: the norms histogram --------------------------------------------------------------

@pytest.mark.parametrize("sigma, progress", [(2.5, 1.0), (2.5, 0.0), (2.0, 0.9)])
def test_norms_histogram_shows_every_example(sigma, progress):
    """At σ = 2.5 some ‖∇f_i‖ fall outside 10⁻⁴…10³: the fixed x range hid them."""
    board = sw.norms_histogram_dashboard()
    board.controls["sigma"].value, board.controls["progress"].value = sigma, progress
    fig = board.figures["histogram"]
    logs = np.asarray(fig.data[0].x)
    low, high = fig.layout.xaxis.range
    assert low <= logs.min() and logs.max() <= high, (low, high, logs.min(), logs.max())
    assert fig.data[1].y[1] >= 1   # the mean line still as tall as the tallest bin


# -- notebook 02: MeZO against SGD -----------------------------------------------------------------

def test_mezo_dashboard_says_when_sgd_diverges():
    """SGD has no guard against a non-finite loss: at η SGD = 10 on least squares the readout said
    "gap nan" and the plot carried NaN; now it names the divergence and leaves the line's gap empty."""
    board = sw.mezo_dashboard(problems.LeastSquares(64, 5, heterogeneity=1.5, seed=0), steps=60)
    board.controls["lr_sgd"].value = 10.0
    shown = text(board.readout.value)
    assert "SGD (backprop) diverged" in shown and "nan" not in shown, shown
    for figure in board.figures.values():
        sgd = figure.data[1].y
        assert all(y is None or math.isfinite(y) for y in sgd)
        assert any(y is None for y in sgd)
    board.controls["lr_sgd"].value = 1e-2   # a safe rate: no message left behind
    assert "diverged" not in text(board.readout.value)


# -- helpers given bad arguments -------------------------------------------------------------------

@pytest.mark.parametrize("call, name", [
    (lambda: sw.race_dashboard(problem="cubic", steps=5), "problem"),
    (lambda: sw.race_dashboard(seeds=0, steps=5), "seeds"),
    (lambda: sw.race_dashboard(seeds=1, steps=5, lrs={"adam": 0.1}), "lrs"),
    (lambda: race_widgets.merge_results([]), "parts"),
    (lambda: race_widgets.join_seeds([]), "parts"),
    (lambda: sw.gain_over_training_figure(problems.LeastSquares(16, 3), points=1), "points"),
    (lambda: problems.LeastSquares(1, 2), "num_examples"),   # N < d: no unique optimum (was a LinAlgError)
])
def test_helpers_reject_bad_arguments_with_a_value_error(call, name):
    with pytest.raises(ValueError, match=name):
        call()


def test_the_race_calls_speed_ups_lower_bounds_only_when_some_method_reached_the_target_uniform_missed():
    from dataclasses import replace

    from sazo_lite.course.sazo_runs import RaceResult
    from sazo_lite.course.widgets.race import race_table_html, race_verdict

    q = np.array([0.0, 100.0, 200.0])
    gaps = {m: np.ones((1, 3)) for m in ("uniform", "sazo", "oracle")}
    nobody = RaceResult(q, gaps, 1.0, 0.1, {"uniform": [None], "sazo": [None], "oracle": [None]})
    assert "lower bound" not in race_table_html(nobody) and "no method did" in race_table_html(nobody)
    assert "lower bound" not in race_verdict(nobody)
    some = replace(nobody, to_target={"uniform": [None], "sazo": [100], "oracle": [None]})
    assert "lower bounds" in race_table_html(some) and "lower bound" in race_verdict(some)


def test_the_sazo_scatter_says_when_estimates_of_zero_fall_off_its_log_axis():
    from sazo_lite.course.sazo_runs import make_problem, run_sazo_trace
    from sazo_lite.course.widgets.sazo import _draw, _probs_figure, _scatter_figure, _trajectory_figure, _variance_figure

    figures = {"scatter": _scatter_figure(), "trajectory": _trajectory_figure(), "probs": _probs_figure(),
               "variance": _variance_figure()}
    for eps, zeros in ((1e-3, False), (1e-10, True)):      # ε = 1e-10 in float32: every d_k rounds to 0
        trace = run_sazo_trace(make_problem(), steps=30, eps=eps, ema_decay=0.0, rule="plain")
        _draw(figures, trace, len(trace.steps) - 1)
        title = figures["scatter"].layout.title.text
        assert ("off the log axis" in title) == zeros, title
        if zeros:
            assert f"{int((trace.sqrt_g[-1] <= 0).sum())} of {trace.sqrt_g.shape[1]} estimates are 0" in title


def test_paths_readout_names_what_it_ranks_by():
    """The readout ranks the paths by their final gap F(θ) − F(θ*): it said "closest to θ* first", which is another
    order where a path ends nearer θ* with a larger gap."""
    board = sw.paths_dashboard(steps=20)
    shown = text(board.readout.value)
    assert "lowest gap F − F* first: " in shown and "closest to θ*" not in shown
    order = board.state["order"]
    assert [board.state["finals"][m] for m in order] == sorted(board.state["finals"][m] for m in order)

"""Dashboards of notebooks 01–03, built headless: set controls from code, read the plotted data."""
import math

import ipywidgets as widgets
import pytest

from sazo_lite.course import problems
from sazo_lite.course import widgets as sw
from sazo_lite.course.widgets import Dashboard


def buttons(widget):
    """Every Button inside a widget tree, by description."""
    found = {}
    if isinstance(widget, widgets.Button):
        found[widget.description] = widget
    for child in getattr(widget, "children", ()):
        found.update(buttons(child))
    return found


def arrow_vector(trace):
    return trace.x[1] - trace.x[0], trace.y[1] - trace.y[0]


def estimator_error(dashboard):
    """‖ĝ − ∇f‖/‖∇f‖ read from the two plotted arrows."""
    tx, ty = arrow_vector(dashboard.figures["arrows"].data[2])
    ex, ey = arrow_vector(dashboard.figures["arrows"].data[3])
    return math.hypot(ex - tx, ey - ty) / math.hypot(tx, ty)


@pytest.mark.parametrize("factory, labels", [
    (sw.estimator_dashboard, {"directions q", "ε"}),
    (sw.epsilon_dashboard, {"ε", "precision"}),
    (sw.dimension_dashboard, {"directions q"}),
    (sw.importance_dashboard, {"heterogeneity σ", "uniform mix λ", "batch size B"}),
    (sw.unbiased_dashboard, {"heterogeneity σ", "uniform mix λ", "batch size B"}),
    (sw.batch_gain_dashboard, {"heterogeneity σ", "batch size B"}),
])
def test_dashboards_build_with_plain_labels(factory, labels):
    dashboard = factory()
    assert isinstance(dashboard, Dashboard) and dashboard.figures
    assert labels <= {control.description for control in dashboard.controls.values()}
    assert buttons(dashboard)  # presets are there


def test_estimator_more_directions_and_too_small_eps():
    dashboard = sw.estimator_dashboard()
    dashboard.controls["q"].value = 1
    one = estimator_error(dashboard)
    dashboard.controls["q"].value = 200
    many = estimator_error(dashboard)
    assert many < 0.3 < one
    assert len(dashboard.figures["arrows"].data[1].x) == 200
    buttons(dashboard)["ε too small"].click()  # ε = 1e-9 in float32: θ ± εz rounds to θ
    assert dashboard.controls["eps"].value == pytest.approx(1e-9)
    assert estimator_error(dashboard) > 0.9
    dashboard.controls["precision"].value = "float64"
    assert estimator_error(dashboard) < 0.5


def test_epsilon_too_small_in_float32_raises_the_error():
    dashboard = sw.epsilon_dashboard()
    marker = dashboard.figures["curve"].data[2]
    dashboard.controls["eps"].value = 1e-3
    good = marker.y[0]
    dashboard.controls["eps"].value = 1e-9
    assert marker.x[0] == pytest.approx(1e-9) and marker.y[0] > 100 * good
    dashboard.controls["precision"].value = "float64"
    assert marker.y[0] < good
    assert dashboard.figures["curve"].data[1].line.width > dashboard.figures["curve"].data[0].line.width


def test_epsilon_quartic_term_is_the_large_eps_arm():
    dashboard = sw.epsilon_dashboard()
    float64 = dashboard.figures["curve"].data[1]
    with_curvature = float64.y[-1]  # ε = 1
    dashboard.controls["quartic"].value = 0.0
    assert float64.y[-1] < with_curvature / 1e6
    dashboard.controls["offset"].value = 1000.0  # more rounding error at tiny ε
    assert dashboard.figures["curve"].data[0].y[0] >= 0.99  # float32 at ε = 1e-10: all signal lost


def test_dimension_more_directions_lower_the_variance():
    dashboard = sw.dimension_dashboard()
    fig = dashboard.figures["variance"]
    before_mc, before_theory = list(fig.data[0].y), list(fig.data[1].y)
    dashboard.controls["q"].value = 16
    assert all(a < b / 4 for a, b in zip(fig.data[0].y, before_mc))
    assert fig.data[1].y[-1] == pytest.approx(before_theory[-1] / 16)
    dashboard.controls["perturbation"].value = "rademacher"
    assert fig.data[1].y[0] < before_theory[0] / 16  # (d−1)/q < (d+1)/q


def test_mezo_dashboard_eps_too_small_stops_learning():
    problem = problems.LogisticRegression.from_sklearn("breast_cancer")
    initial = problem.gap(problem.initial_theta())
    dashboard = sw.mezo_dashboard(problem, steps=60)
    queries = dashboard.figures["queries"]
    assert queries.data[0].y[-1] < 0.5 * initial and queries.data[1].y[-1] < 0.5 * initial
    # forward-pass equivalents: MeZO 2B forwards per step; SGD B forward+backward ≈ 3B forwards
    assert queries.data[0].x[-1] == 2 * 16 * 60 and queries.data[1].x[-1] == 3 * 16 * 60
    assert {"η MeZO", "η SGD"} <= {c.description for c in dashboard.controls.values()}
    buttons(dashboard)["ε too small"].click()
    assert queries.data[0].y[-1] > 0.95 * initial  # float32: f(θ+εz) and f(θ−εz) round to the same number
    assert dashboard.figures["seconds"].data[0].x[-1] > 0


def uniform_over_oracle(dashboard):
    bars = dashboard.figures["variance"].data[1]  # theory diamonds, divided by the oracle's value
    return dict(zip(bars.x, bars.y))


def test_importance_sigma_raises_the_uniform_to_oracle_ratio():
    dashboard = sw.importance_dashboard(trials=2000)
    dashboard.controls["sigma"].value = 0.5
    low = uniform_over_oracle(dashboard)["uniform"]
    dashboard.controls["sigma"].value = 2.0
    high = uniform_over_oracle(dashboard)["uniform"]
    assert high > 3 * low
    mc = dict(zip(dashboard.figures["variance"].data[0].x, dashboard.figures["variance"].data[0].y))
    assert mc["oracle p*"] == pytest.approx(1.0, rel=0.15) and mc["uniform"] > 5
    law = dashboard.figures["law"]
    assert all(b >= a for a, b in zip(law.data[0].y, law.data[0].y[1:]))  # 1 + CV² grows with σ
    assert law.data[2].x[0] == 2.0


def test_importance_mix_and_batch_size():
    dashboard = sw.importance_dashboard(trials=2000)
    dashboard.controls["uniform_mix"].value = 1.0
    ratios = uniform_over_oracle(dashboard)
    assert ratios["mix λ = 1.00"] == pytest.approx(ratios["uniform"])
    buttons(dashboard)["oracle"].click()
    assert uniform_over_oracle(dashboard)["mix λ = 0.00"] == pytest.approx(1.0)
    single = uniform_over_oracle(dashboard)["uniform"]
    buttons(dashboard)["large batch"].click()
    assert uniform_over_oracle(dashboard)["uniform"] < single / 2


def test_unbiased_weights_centre_the_histogram_on_f():
    dashboard = sw.unbiased_dashboard()
    fig = dashboard.figures["histogram"]
    dashboard.controls["sigma"].value = 2.0
    full = fig.data[2].x[0]
    weighted, unweighted = fig.data[3].x
    assert abs(weighted - full) < 0.1 * full and unweighted > 2 * full
    assert sum(fig.data[0].y) == sum(fig.data[1].y) == 4000
    buttons(dashboard)["uniform"].click()
    weighted, unweighted = fig.data[3].x
    assert weighted == pytest.approx(unweighted)


def test_batch_gain_shrinks_with_batch_and_rises_late_only_at_large_batch():
    dashboard = sw.batch_gain_dashboard()
    over_t = dashboard.figures["by_progress"].data
    assert [trace.name for trace in over_t[:3]] == ["B = 1 (1 + CV²)", "current B", "B = 64"]
    assert over_t[2].y[-1] > 1.5 * over_t[2].y[0]      # B = 64: the common term vanishes, the gain rises
    assert over_t[0].y[-1] < over_t[0].y[0]            # B = 1: follows the (here shrinking) spread
    marker = dashboard.figures["by_batch"].data[2]
    dashboard.controls["batch_size"].value = 2
    small = marker.y[0]
    dashboard.controls["batch_size"].value = 128
    large = marker.y[0]
    assert large < small / 2
    buttons(dashboard)["late in training"].click()     # a complete regime: back to the default B
    assert dashboard.controls["progress"].value == 1.0 and dashboard.controls["batch_size"].value == 8
    dashboard.controls["batch_size"].value = 128
    assert marker.y[0] > 2 * large
    late_curve = dashboard.figures["by_batch"].data[1].y
    assert max(late_curve) == pytest.approx(min(late_curve))  # ‖∇F‖ = 0: the gain no longer depends on B
    dashboard.controls["sigma"].value = 0.0
    assert marker.y[0] < large


def test_a_dashboards_figures_are_synced_state_for_late_pages():
    """A page that connects after the draws (Voilà, a re-display) renders the figure as drawn now:
    its view's one output is the current figure, updated by every redraw, in the synced state."""
    dashboard = sw.importance_dashboard(trials=2000)
    figure = dashboard.figures["variance"]
    assert figure.view in dashboard.children

    def synced():
        (output,) = figure.view.get_state()["outputs"]
        return [t["y"] for t in output["data"]["application/vnd.plotly.v1+json"]["data"] if t.get("y") is not None]

    plotted = lambda: [list(trace.y) for trace in figure.data if trace.y is not None]
    assert plotted() and synced() == plotted()
    dashboard.controls["sigma"].value = 2.0  # a redraw
    assert synced() == plotted()
    assert "application/vnd.jupyter.widget-view+json" in dashboard._repr_mimebundle_()

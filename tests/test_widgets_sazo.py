"""Headless tests of notebook 04's and 05's dashboards: set controls from code, check the plots."""
from __future__ import annotations

import re

import numpy as np
import pytest

pytest.importorskip("plotly")
pytest.importorskip("anywidget")

from sazo_lite.course import sazo_runs as E  # noqa: E402
from sazo_lite.course import widgets  # noqa: E402
from sazo_lite.course.widgets.race import PROBLEM_DEFAULTS, merge_results, race_figure, race_table_html  # noqa: E402


def _number(readout: str, label: str) -> float:
    return float(re.search(rf"{re.escape(label)} = (-?[0-9.]+)", readout).group(1))


def _press(dashboard, label: str) -> None:
    """Click the preset button with this label."""
    presets_row = dashboard.children[1]
    [button] = [b for b in presets_row.children if getattr(b, "description", None) == label]
    button.click()


# -- notebook 04 ------------------------------------------------------------------------------

@pytest.fixture()
def sazo():
    return widgets.sazo_dashboard(num_examples=64, dim=6, steps=90, log_every=3)


def test_sazo_dashboard_builds_with_no_arguments():
    dash = widgets.sazo_dashboard()
    assert isinstance(dash, widgets.Dashboard)
    labels = {c.description for c in dash.controls.values()}
    assert {"ε", "EMA decay β", "batch size B", "uniform mix λ", "heterogeneity σ"} <= labels
    training = [c for name, c in dash.controls.items() if name not in ("step", "rule")]
    assert all(c.continuous_update is False for c in training)
    assert set(dash.figures) == {"scatter", "trajectory", "probs", "variance"}
    assert "Spearman ρ = " in dash.readout.value and "TV = " in dash.readout.value


def _tracked(dash) -> np.ndarray:
    return np.concatenate([np.asarray(dash.figures["trajectory"].data[2 * k].y, dtype=float) for k in range(3)])


@pytest.mark.parametrize("low, high", [(0.0, 0.05), (0.95, 0.995)], ids=["low end", "high end"])
def test_plain_rule_beta_moves_the_drawn_estimates_at_both_ends(sazo, low, high):
    assert sazo.controls["rule"].value == "plain"
    sazo.controls["ema_decay"].value = low
    before = _tracked(sazo)
    sazo.controls["ema_decay"].value = high
    assert np.max(np.abs(np.log(_tracked(sazo)) - np.log(before))) > 0.05
    assert "plain rule: every update uses β" in sazo.readout.value


def test_robust_rule_toggle_and_its_capped_decay(sazo):
    plain = _tracked(sazo)
    sazo.controls["rule"].value = "robust"
    assert not np.allclose(_tracked(sazo), plain)
    sazo.controls["ema_decay"].value = 0.0
    low = _tracked(sazo)
    sazo.controls["ema_decay"].value = 0.5
    assert not np.allclose(_tracked(sazo), low)        # the low end moves the estimates
    assert "every update uses β = 0.5" in sazo.readout.value   # min(β, count-based) = β for every count
    sazo.controls["ema_decay"].value = 0.995           # above every (n+1)/(n+2) seen here
    assert re.search(r"decay in use for [0-9]?[0-9]% of the examples", sazo.readout.value)


def test_decay_note_counts_the_capped_examples():
    trace = E.run_sazo_trace(E.make_problem(num_examples=16, dim=3), steps=20, log_every=10, batch_size=4)
    counts = trace.counts[-1]
    share = np.mean((counts + 1) / (counts + 2) >= 0.8)
    assert f"for {share:.0%} of the examples" in widgets.decay_note(trace, 0.8)


def test_larger_beta_smooths_the_g_trajectory(sazo):
    def tracked_roughness():
        data = sazo.figures["trajectory"].data
        return E.roughness(np.stack([np.asarray(data[2 * k].y) for k in range(3)], axis=1))

    sazo.controls["ema_decay"].value = 0.3
    rough = tracked_roughness()
    sazo.controls["ema_decay"].value = 0.99
    assert tracked_roughness() < 0.7 * rough


def test_tiny_eps_breaks_the_estimates(sazo):
    before, tv_before = _number(sazo.readout.value, "Spearman ρ"), _number(sazo.readout.value, "TV")
    scatter_before = np.asarray(sazo.figures["scatter"].data[0].y).copy()
    _press(sazo, "ε too small")
    assert sazo.controls["eps"].value == pytest.approx(1e-9)
    assert _number(sazo.readout.value, "Spearman ρ") < before - 0.2
    assert _number(sazo.readout.value, "TV") > tv_before
    assert not np.allclose(sazo.figures["scatter"].data[0].y, scatter_before)


def test_homogeneous_data_shrinks_uniforms_variance_ratio(sazo):
    uniform_before = np.asarray(sazo.figures["variance"].data[0].y)
    _press(sazo, "homogeneous data")
    uniform_after = np.asarray(sazo.figures["variance"].data[0].y)
    assert sazo.controls["heterogeneity"].value == 0.0
    assert np.median(uniform_after) < np.median(uniform_before) - 1.0  # 1 + CV² falls with σ
    np.testing.assert_array_equal(sazo.figures["variance"].data[2].y, 1.0)  # the oracle's V(p*)/V(p*)


def test_step_slider_moves_the_snapshot_without_retraining(sazo):
    trajectory = np.asarray(sazo.figures["trajectory"].data[0].y).copy()
    sazo.controls["step"].value = 0
    assert "step 0:" in sazo.readout.value
    assert len(set(np.asarray(sazo.figures["scatter"].data[0].y).tolist())) == 1  # nothing observed: G = G_0 for all
    sazo.controls["step"].value = 45
    assert "step 45:" in sazo.readout.value
    np.testing.assert_array_equal(sazo.figures["trajectory"].data[0].y, trajectory)
    probs = sazo.figures["probs"].data
    assert np.all(np.diff(probs[1].y) <= 0)  # p* drawn sorted, largest first
    assert sum(probs[0].y) == pytest.approx(1.0)


def test_sazo_probabilities_follow_lambda(sazo):
    sazo.controls["uniform_mix"].value = 1.0  # λ = 1 is uniform sampling
    p_sazo = np.asarray(sazo.figures["probs"].data[0].y)
    np.testing.assert_allclose(p_sazo, 1.0 / len(p_sazo))
    assert _number(sazo.readout.value, "V(p_SAZO)/V(p*)") == pytest.approx(
        _number(sazo.readout.value, "V(uniform)/V(p*)"), abs=0.01)


def test_sazo_presets_set_their_values(sazo):
    _press(sazo, "large batch")
    assert sazo.controls["batch_size"].value == 32
    _press(sazo, "homogeneous, robust rule")
    assert sazo.controls["heterogeneity"].value == 0.0 and sazo.controls["batch_size"].value == 8
    _press(sazo, "robust rule")
    assert sazo.controls["rule"].value == "robust" and sazo.controls["batch_size"].value == 8


@pytest.mark.parametrize("build", [lambda: widgets.sazo_dashboard(num_examples=32, dim=4, steps=30),
                                   lambda: widgets.race_dashboard(seeds=1, steps=20)], ids=["sazo", "race"])
def test_no_preset_is_named_after_a_sampler_it_does_not_run(build):
    """A preset called "oracle" once set SAZO's knobs, not the oracle sampler."""
    labels = [b.description for b in build().children[1].children if hasattr(b, "on_click")]
    assert labels and not any("oracle" in label.lower() for label in labels)


# -- notebook 05 ------------------------------------------------------------------------------

@pytest.fixture()
def racer():  # draws finished seeds only: a count of draws that does not depend on the machine's speed
    return widgets.race_dashboard(seeds=2, steps=60, log_every=10, live_after=None)


def _median_curve(dash, method_index: int) -> np.ndarray:
    return np.asarray(dash.figures["race"].data[2 * method_index + 1].y, dtype=float)


def test_race_dashboard_builds_with_no_arguments():
    dash = widgets.race_dashboard()
    labels = {c.description for c in dash.controls.values()}
    assert {"problem", "ε", "EMA decay β", "batch size B", "uniform mix λ", "heterogeneity σ"} <= labels
    assert all(c.continuous_update is False for name, c in dash.controls.items() if name != "problem")
    assert dash.readout.value.count("<tr>") == 4  # header + three methods


def test_race_defaults_show_sazo_ahead_of_uniform():
    """Opened at its defaults (fast mode's seeds and steps), the race shows the lesson."""
    dash = widgets.race_dashboard(seeds=2, steps=100)
    assert dash.controls["heterogeneity"].value == 1.5
    rates = {m: dash.controls[f"lr_{m}"].value for m in ("uniform", "sazo", "oracle")}
    assert rates == {m: PROBLEM_DEFAULTS["heterogeneous quadratic"][f"lr_{m}"] for m in rates}  # tuned per method
    assert len(set(rates.values())) > 1
    uniform, sazo = _median_curve(dash, 0), _median_curve(dash, 1)
    half = len(sazo) // 2
    assert np.all(sazo[half:] < uniform[half:])


def test_race_draws_progressively_and_each_eta_retrains_its_method(racer):
    racer.controls["heterogeneity"].value = 1.0      # every method reruns: first seeds, then all
    assert racer.stages[0] == 4
    uniform, sazo, oracle = (_median_curve(racer, k) for k in range(3))
    drawn_rate = racer.controls["lr_oracle"].value
    racer.controls["lr_oracle"].value = drawn_rate / 4
    assert racer.stages[0] == 2                      # one stale method: its first seed, then all
    np.testing.assert_array_equal(_median_curve(racer, 0), uniform)
    np.testing.assert_array_equal(_median_curve(racer, 1), sazo)
    assert not np.array_equal(_median_curve(racer, 2), oracle)
    racer.controls["lr_oracle"].value = drawn_rate    # cached: drawn once
    assert racer.stages[0] == 1


def test_race_draws_a_training_seed_as_far_as_it_got():
    """live_after=0: a partial draw at each log point of a stale first seed (after θ₀'s, before its
    last), on race's own query grid; each is a prefix of the finished run and marks no divergence."""
    from sazo_lite.course.widgets.race import _query_grid

    live = widgets.race_dashboard(seeds=2, steps=60, log_every=10, live_after=0.0)
    figure, drawn = live.figures["race"], []

    def recorded(_change):   # each redraw the page gets
        sazo = figure.data[3]   # SAZO's median line
        drawn.append((figure.layout.title.text, np.asarray(sazo.y, dtype=float), list(sazo.x),
                      len(figure.layout.annotations)))

    figure.view.observe(recorded, names="outputs")
    live.controls["ema_decay"].value = 0.5                # SAZO alone retrains
    training = [d for d in drawn if "training" in d[0]]
    assert len(training) == 5 and live.stages[0] == len(drawn) == 5 + 2   # log points 10..50 of 0..60, seed 0, all
    grid = _query_grid(60, live.controls["batch_size"].value, 10)
    np.testing.assert_array_equal(live.result().queries, grid)   # the grid race logs on
    seed0 = np.minimum(live.result().gaps["sazo"][0] / live.result().initial_gap, 1e3)
    for k, (_, median, x, marks) in enumerate(training):
        assert np.isfinite(median).sum() == k + 2 and x == list(grid) and marks == 0
        np.testing.assert_allclose(median[:k + 2], seed0[:k + 2])
    slow = widgets.race_dashboard(seeds=2, steps=60, log_every=10, live_after=60.0)
    slow.controls["ema_decay"].value = 0.5
    assert slow.stages[0] == 2                            # never due within the run: finished seeds only


def test_race_tune_picks_rates_from_the_grid():
    dash = widgets.race_dashboard(seeds=1, steps=40)
    before = {k: dash.controls[k].value for k in ("lr_uniform", "lr_sazo", "lr_oracle")}
    dash.tune()
    for name, value in before.items():
        assert min(abs(dash.controls[name].value / (value * f) - 1) for f in (0.25, 0.5, 1, 2, 4)) < 0.05


def test_race_bands_enclose_the_median(racer):
    data = racer.figures["race"].data
    for k in range(3):
        band_y = np.asarray(data[2 * k].y, dtype=float)
        upper, lower = np.split(band_y, 2)
        median = _median_curve(racer, k)
        assert np.all(upper + 1e-12 >= median) and np.all(lower[::-1] - 1e-12 <= median)


def test_beta_retrains_only_sazo(racer):
    uniform, sazo, oracle = (_median_curve(racer, k) for k in range(3))
    racer.controls["ema_decay"].value = 0.2
    np.testing.assert_array_equal(_median_curve(racer, 0), uniform)
    np.testing.assert_array_equal(_median_curve(racer, 2), oracle)
    assert not np.array_equal(_median_curve(racer, 1), sazo)


def test_problem_dropdown_switches_problem_and_fixes_sigma(racer):
    before = _median_curve(racer, 0)
    racer.controls["problem"].value = "homogeneous quadratic"
    assert racer.controls["heterogeneity"].disabled
    assert racer.controls["heterogeneity"].value == 0.0
    assert "homogeneous quadratic" in racer.figures["race"].layout.title.text
    assert not np.array_equal(_median_curve(racer, 0), before)
    racer.controls["problem"].value = "logistic regression (breast cancer)"
    assert not racer.controls["heterogeneity"].disabled
    assert racer.controls["lr_sazo"].value == pytest.approx(0.1)


def test_race_tiny_eps_stalls_every_method(racer):
    finals = [_median_curve(racer, k)[-1] for k in range(3)]
    _press(racer, "ε too small")
    stalled = [_median_curve(racer, k)[-1] for k in range(3)]
    assert all(s > f for s, f in zip(stalled, finals))


def test_race_table_and_static_figure():
    problem = E.make_problem(num_examples=32, dim=3)
    result = E.race(problem, seeds=(0, 1), steps=100, batch_size=2, lr=0.02, log_every=10)
    table = race_table_html(result)
    for method, label in (("uniform", "uniform MeZO"), ("sazo", "SAZO"), ("oracle", "oracle p*")):
        reached = sum(q is not None for q in result.to_target[method])
        assert re.search(rf"{re.escape(label)}</td><td>[^<]*</td><td>[^<]*</td><td>{reached}/2<", table)
    fig = race_figure(result, title="x")
    assert len(fig.data) == 7 and fig.layout.title.text == "x"
    np.testing.assert_allclose(fig.data[3].y, np.median(result.gaps["sazo"], 0) / result.initial_gap)


def test_merge_results_rejects_different_grids():
    problem = E.make_problem(num_examples=8, dim=2)
    a = E.race(problem, samplers=("uniform",), seeds=(0,), steps=10, log_every=5)
    b = E.race(problem, samplers=("sazo",), seeds=(0,), steps=20, log_every=5)
    with pytest.raises(ValueError, match="parts"):
        merge_results([a, b])
    assert set(merge_results([a, E.race(problem, samplers=("sazo",), seeds=(0,), steps=10, log_every=5)]).gaps) \
        == {"uniform", "sazo"}


@pytest.mark.parametrize("build", [lambda: widgets.sazo_dashboard(num_examples=32, dim=4, steps=30),
                                   lambda: widgets.race_dashboard(seeds=1, steps=20)], ids=["sazo", "race"])
def test_presets_are_complete_regimes(build):
    """A preset resets what earlier presets changed (ε stays tiny only under "ε too small")."""
    dash = build()
    _press(dash, "ε too small")
    assert dash.controls["eps"].value == pytest.approx(1e-9)
    _press(dash, "homogeneous data")
    assert dash.controls["eps"].value == pytest.approx(1e-3)
    assert dash.controls["heterogeneity"].value == 0.0

"""Round 16: the dashboards, their figures and notebook 02's instruments, given hostile data and settings."""
from __future__ import annotations

import math

import torch

from sazo_lite.course.instruments import step_memory
from sazo_lite.course.widgets.memory import measured_vs_predicted_figure


def _rows(measured_first: float) -> list[dict]:
    return [dict(mode="zo", attention="fused", context=c, predicted=p, measured=m, relative_error=(m - p) / p)
            for c, p, m in ((128, 2e6, measured_first), (256, 4e6, 3.9e6), (512, 8e6, 8.1e6))]


def test_measured_vs_predicted_draws_its_reference_lines_with_a_zero_measurement():
    # a measurement of 0 put the reference lines' left end at 0, which the log axes cannot draw: no line was shown
    fig = measured_vs_predicted_figure(_rows(0.0))
    lines = [trace for trace in fig.data if trace.mode == "lines"]
    assert len(lines) == 3
    for trace in lines:
        assert all(value > 0 and math.isfinite(value) for value in (*trace.x, *trace.y))
    positive = [v / 1e6 for r in _rows(0.0) for v in (r["predicted"], r["measured"]) if v > 0]
    assert lines[0].x[0] <= min(positive) and lines[0].x[1] >= max(positive)
    assert "1 of 3 points" in fig.layout.title.text   # the point left off the log axes is said


def test_measured_vs_predicted_unchanged_without_zeros():
    fig = measured_vs_predicted_figure(_rows(1.9e6))
    values = [v / 1e6 for r in _rows(1.9e6) for v in (r["predicted"], r["measured"])]
    assert list(fig.data[1].x) == [min(values) / 1.5, max(values) * 1.5]
    assert "off the log axes" not in fig.layout.title.text


def test_step_memory_measures_a_model_with_an_unused_trainable_tensor():
    # a trainable tensor the loss never reads (an unused head) has no grad: the backprop step raised TypeError
    torch.manual_seed(0)
    model = torch.nn.Linear(3, 2)
    model.unused = torch.nn.Parameter(torch.ones(4))
    inputs, targets = torch.randn(5, 3), torch.randn(5, 2)
    peaks = step_memory(model, inputs, targets, torch.nn.functional.mse_loss)
    assert peaks["parameters"] == (6 + 2 + 4) * 4 and peaks["backprop step"] > 0


def test_estimator_dashboard_refuses_a_theta_whose_gradient_norm_underflows():
    # θ = (1e-300, 0) is not θ = 0, but ‖∇f‖ = √(1e-600) is 0 in float64: the build raised ZeroDivisionError
    import pytest
    from sazo_lite.course.widgets import estimator_dashboard

    for theta in ((1e-300, 0.0), (0.0, 1e-200), (0.0, 0.0)):
        with pytest.raises(ValueError, match="Invalid theta"):
            estimator_dashboard(theta=theta)
    assert "relative error" in estimator_dashboard(theta=(1e-3, 0.0)).readout.value   # a small θ still draws


def test_sazo_dashboard_refuses_a_negative_step_count_by_name():
    # steps = -3 built the step slider first and raised traitlets' "setting min > max"
    import pytest
    from sazo_lite.course.widgets import sazo_dashboard

    for steps in (-3, 0, 2.5, True):
        with pytest.raises(ValueError, match="Invalid steps"):
            sazo_dashboard(num_examples=16, dim=3, steps=steps)


def test_race_presets_on_the_opening_problem_keep_the_rates_given():
    # race_dashboard(lrs=race 1's tuned rates): "ε too small" set every η back to PROBLEM_DEFAULTS', so the preset
    # changed four controls, and its race was not the opening one at a smaller ε
    from sazo_lite.course.widgets.race import LR_CONTROLS, PRESETS, race_dashboard

    lrs = {"uniform": 0.0025, "sazo": 0.04, "oracle": 0.04}
    board = race_dashboard(seeds=1, steps=10, num_examples=16, dim=3, lrs=lrs, live_after=None)
    buttons = board.children[1].buttons
    for label, preset in PRESETS.items():
        if label == "defaults":
            continue
        buttons[label].click()
        shown = {name: control.value for name, control in board.controls.items()}
        if preset["problem"] == "heterogeneous quadratic":   # the opening problem: its given rates
            assert {m: shown[LR_CONTROLS[m]] for m in lrs} == lrs, label
            assert board.result().lrs == lrs, label
            changed = {name for name, value in preset.items() if shown[name] != buttons["defaults"].values[name]}
            assert not any(name.startswith("lr_") for name in changed), label
        else:   # another problem: its own default rates, as the dropdown loads them
            assert all(shown[LR_CONTROLS[m]] == preset[LR_CONTROLS[m]] for m in lrs), label
    buttons["defaults"].click()
    assert board.result().lrs == lrs


def test_race_presets_without_lrs_are_unchanged():
    from sazo_lite.course.widgets.race import PRESETS, race_dashboard

    board = race_dashboard(seeds=1, steps=10, num_examples=16, dim=3, live_after=None)
    buttons = board.children[1].buttons
    for label, preset in PRESETS.items():
        if label != "defaults":
            assert buttons[label].values == preset, label


def test_unbiased_histograms_count_every_estimate():
    # the bins' top edge, low + bins·width, rounded below the largest estimate and histc dropped it: at B = 1 many
    # estimates are that one loss (the unweighted histogram held 248 of 300 at σ = 1.8, λ = 0)
    from sazo_lite.course.widgets import unbiased_dashboard

    trials = 300
    board = unbiased_dashboard(num_examples=32, dim=5, trials=trials)
    for sigma, mix, batch_size in ((1.8, 0.0, 1), (1.4, 0.3, 1), (1.1, 0.0, 8), (1.4, 1.0, 64), (0.0, 0.5, 4)):
        board.controls["sigma"].value, board.controls["uniform_mix"].value = sigma, mix
        board.controls["batch_size"].value = batch_size
        weighted, unweighted = board.figures["histogram"].data[:2]
        assert [sum(weighted.y), sum(unweighted.y)] == [trials, trials], (sigma, mix, batch_size)


def test_dimension_dashboard_draws_each_dimension_once_left_to_right():
    # dims = (512, 2, 8, 2): the theory line went 512 → 2 → 8 → 2 on the log axis (a zigzag) with a dot drawn twice
    from sazo_lite.course.widgets import dimension_dashboard

    board = dimension_dashboard(dims=(512, 2, 8, 2), directions_drawn=32)
    for trace in board.figures["variance"].data:
        assert list(trace.x) == [2, 8, 512]
    theory = list(board.figures["variance"].data[1].y)
    assert theory == sorted(theory) and len(theory) == 3   # (d + 1)/q grows with d


def test_loss_bands_count_a_nan_loss_as_above_every_seed_whatever_the_seed_order():
    # a run that diverges logs its NaN loss (llm.queries.query_run) before it stops: statistics.median read the NaN
    # by where it stood, so the median of three seeds at that query was the lowest survivor (0.5) or NaN
    import itertools

    from sazo_lite.course.widgets.llm import loss_bands

    runs = [{"queries": [0, 10, 20], "train_loss": [1.0, 0.9, float("nan")], "diverged": True},
            {"queries": [0, 10, 20], "train_loss": [1.0, 0.8, 0.5], "diverged": False},
            {"queries": [0, 10, 20], "train_loss": [1.0, 0.7, 0.6], "diverged": False}]
    for order in itertools.permutations(runs):
        band, median = loss_bands({"uniform": list(order)}).data[:2]
        assert list(median.y) == [1.0, 0.8, 0.6]   # as with an infinite loss there: the middle seed
        assert all(math.isfinite(v) for v in band.y)
    infinite = [{**runs[0], "train_loss": [1.0, 0.9, float("inf")]}, *runs[1:]]
    assert list(loss_bands({"uniform": infinite}).data[1].y) == [1.0, 0.8, 0.6]


def test_loss_vs_walk_draws_a_nan_loss_at_the_top_as_an_infinite_one():
    from sazo_lite.course.llm_lesson import DIVERGE_FACTOR, Race
    from sazo_lite.course.widgets.llm_lesson import loss_vs_walk_figure

    def race(last):
        run = {"queries": [0, 10, 20], "train_loss": [1.0, 0.9, last], "walk": [0.0, 1.0, 2.0], "diverged": True}
        return Race(label="set", source="", date="", machine="", num_examples=3, batch_size=1, dim=2,
                    targets=(0.5,), select_target=0.5, chosen_lr={"uniform": 0.1}, runs={"uniform": [run]}, design={})

    for last in (float("nan"), float("inf")):
        line = loss_vs_walk_figure(race(last)).data[0]
        assert list(line.y) == [1.0, 0.9, DIVERGE_FACTOR], last


def test_gain_vs_batch_figure_reads_each_batch_size_once_as_a_count():
    import pytest
    from sazo_lite.course.widgets.llm import gain_vs_batch_figure

    # a JSON report's keys are strings: read as the ints they name, drawn in order of B
    fig = gain_vs_batch_figure({"a": {"4": 3.0, "1": 5.0}}, {"a": {"1": 2.75}})
    assert [list(t.x) for t in fig.data] == [[1, 4], [1]] and [list(t.y) for t in fig.data] == [[5.0, 3.0], [2.75]]
    # B = 1.5 was drawn at B = 1 and then raised KeyError; B = 0 fell off the log axis; 1 and "1" drew one gain twice
    for gains in ({1.5: 2.0}, {0: 1.0}, {-2: 1.0}, {"x": 1.0}, {True: 1.0}, {1: 5.0, "1": 3.0}):
        with pytest.raises(ValueError, match="gains of 'a'"):
            gain_vs_batch_figure({"a": gains})
    assert len(gain_vs_batch_figure({"a": {1: 5.0}}, {"a": {}}).data) == 1   # no measurement: no markers, as before


def test_direction_counter_entered_twice_is_refused_and_leaves_the_optimiser_as_it_was():
    # `with c: with c:` handed every job to itself (RecursionError) and left itself as the optimiser's source for good
    import pytest
    from sazo_lite.course.instruments import DirectionCounter
    from sazo_lite.engine import MeZO

    theta = torch.zeros(4)
    optimizer = MeZO([theta], lr=0.1)
    source = optimizer.noise
    counter = DirectionCounter(optimizer)
    with pytest.raises(ValueError, match="already counting"):
        with counter:
            with counter:
                pass
    assert optimizer.noise is source
    optimizer.step(lambda: (theta ** 2).sum())   # steps as before
    with counter:                                 # used again, one block at a time
        optimizer.step(lambda: (theta ** 2).sum())
    with DirectionCounter(optimizer) as outer, DirectionCounter(optimizer) as inner:   # two counters nest
        optimizer.step(lambda: (theta ** 2).sum())
    assert counter.passes == outer.passes == inner.passes == 3 and optimizer.noise is source


def _two_seed_race(uniform_hits):
    import numpy as np

    from sazo_lite.course.sazo_runs import RaceResult

    queries = np.arange(0, 1001, 100)
    gaps = {m: np.tile(np.linspace(1.0, 0.05, len(queries)), (2, 1)) for m in ("uniform", "sazo")}
    return RaceResult(queries=queries, gaps=gaps, initial_gap=1.0, target=0.1,
                      to_target={"uniform": uniform_hits, "sazo": [50, 50]})


def test_race_lower_bound_with_an_even_number_of_seeds_is_one_the_median_can_have():
    # uniform [100, missed] within 1,000 queries: its median is the mean of the two, above (100 + 1,000)/2 = 550, so
    # SAZO's 50 gives > 11× (the table and verdict said > 20×, from 1,000 alone: a bound the race does not show)
    from sazo_lite.course.widgets.race import race_table_html, race_verdict

    result = _two_seed_race([100, None])
    assert "> 11.0× (lower bound)" in race_table_html(result)
    assert "> 11.0× fewer" in race_verdict(result)
    both_missed = _two_seed_race([None, None])   # every seed missed: above 1,000 queries, as before
    assert "> 20.0× fewer" in race_verdict(both_missed) and "> 20.0× (lower bound)" in race_table_html(both_missed)


def test_benchmark_report_takes_a_file_name_only(tmp_path):
    # "../reference/r.json" from results/ found the reference run and called it "this machine's latest run"; an
    # absolute path returned any file under that label
    import pytest
    from sazo_lite.course.config import REFERENCE_RUN, benchmark_report

    (tmp_path / "benchmarks" / "reference").mkdir(parents=True)
    (tmp_path / "benchmarks" / "results").mkdir()
    (tmp_path / "benchmarks" / "reference" / "r.json").write_text("{}")
    elsewhere = tmp_path / "other.json"
    elsewhere.write_text("{}")
    for name in ("../reference/r.json", str(elsewhere), "reference\\r.json", "..", "", None):
        with pytest.raises(ValueError, match="Invalid name"):
            benchmark_report(name, start=tmp_path)
    assert benchmark_report("r.json", start=tmp_path) == (tmp_path / "benchmarks" / "reference" / "r.json",
                                                          REFERENCE_RUN)


def _interrupt_race_at(monkeypatch, race_module, call: int):
    """race_module.race raises KeyboardInterrupt (Ctrl-C) at its ``call``-th call; returns the real race."""
    real, calls = race_module.race, [0]

    def interrupted(*args, **kwargs):
        calls[0] += 1
        if calls[0] == call:
            raise KeyboardInterrupt
        return real(*args, **kwargs)

    monkeypatch.setattr(race_module, "race", interrupted)
    return real


def test_race_tune_says_when_it_stopped(monkeypatch):
    # a kernel interrupt (or a failed run) mid-tuning left the status line at "tuning η per method… 3/12 runs" for good
    import pytest
    from sazo_lite.course.widgets import race as race_module

    board = race_module.race_dashboard(seeds=1, steps=10, num_examples=16, dim=3, live_after=None)
    rates = {name: control.value for name, control in board.controls.items() if name.startswith("lr_")}
    _interrupt_race_at(monkeypatch, race_module, 3)
    with pytest.raises(KeyboardInterrupt):
        board.tune()
    texts = [w.value for box in board.children if hasattr(box, "children") for w in box.children
             if hasattr(w, "value") and isinstance(w.value, str) and "tuning" in w.value]
    assert texts and all("stopped after 2/" in text for text in texts)
    assert {name: board.controls[name].value for name in rates} == rates


def test_race_title_says_when_a_change_stopped_part_way(monkeypatch):
    # a change interrupted after its first partial draw kept the title "… first seed… (more seeds coming)" for good,
    # over a plot of the new setting's first seeds and the previous setting's table
    import pytest
    from sazo_lite.course.widgets import race as race_module

    board = race_module.race_dashboard(seeds=2, steps=10, num_examples=16, dim=3, live_after=None)
    real = _interrupt_race_at(monkeypatch, race_module, 2)
    with pytest.raises(KeyboardInterrupt):
        board.controls["lr_uniform"].value = 0.02   # uniform's first seed is drawn, its second interrupted
    assert "stopped before every run finished" in board.figures["race"].layout.title.text
    monkeypatch.setattr(race_module, "race", real)
    board.refresh()                                 # the next redraw finishes and titles the race again
    assert "stopped" not in board.figures["race"].layout.title.text
    assert board.result().lrs["uniform"] == 0.02

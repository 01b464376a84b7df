"""Red-team round 9 on the course layer: diverged runs, extremes of every slider, presets, bad data.

Round 8 (tests/test_course_round8.py) covered MeZO-vs-SGD's divergence, bad points, ties and the memory
sentences; this round drives the dashboards that train (SAZO, paths, race) into divergence and the
others to their slider ends, and calls the helpers with bad data.
"""
from __future__ import annotations

import math
import re

import numpy as np
import pytest

pytest.importorskip("ipywidgets")
pytest.importorskip("plotly")

from sazo_lite.course import sazo_runs  # noqa: E402
from sazo_lite.course import widgets as sw  # noqa: E402


def text(html: str) -> str:
    return re.sub(r"<[^>]+>", "", html)


def finite_or_missing(values) -> bool:
    return all(v is None or math.isfinite(v) for v in np.asarray(values, dtype=np.float64).tolist()
               if not (isinstance(v, float) and math.isnan(v)))


# -- the known defect: a diverged run in the SAZO dashboard ------------------------------------------

def test_sazo_dashboard_names_a_diverged_run_its_step_its_rate_and_the_fix():
    """At η = 0.1, B = 1 the gap grows to 10⁸: the readout said "gap = 4.3e+07" as if that were a result."""
    board = sw.sazo_dashboard(steps=60)
    board.controls["batch_size"].value = 1
    board.controls["lr"].value = 0.1
    shown = text(board.readout.value)
    found = re.search(r"The run diverged by step (\d+)", shown)       # found at a log point
    assert found, shown
    assert "η = 0.1" in shown and "lower η (try 0.032)" in shown, shown
    step = int(found.group(1))
    assert 0 < step <= 60
    gap = float(re.search(r"gap = ([0-9.e+]+);", shown).group(1))
    assert gap < 1e6, shown                          # the run stopped where it diverged, not 10⁷ later
    for figure in board.figures.values():
        for trace in figure.data:
            for column in (trace.x, trace.y):
                if column is not None:
                    assert finite_or_missing(column)
    board.controls["lr"].value = 1e-2   # a safe rate: the message goes
    assert "diverged" not in text(board.readout.value)


def test_a_sazo_trace_whose_loss_overflows_stops_instead_of_raising(monkeypatch):
    """MeZO refuses a non-finite loss with FloatingPointError: ``run_sazo_trace`` let it escape, so the
    dashboard raised instead of saying the run diverged."""
    problem = sazo_runs.make_problem(num_examples=16, dim=3)
    losses, calls = problem.losses, [0]

    def overflowing(theta, indices=None):
        calls[0] += 1
        values = losses(theta, indices)
        return values * np.inf if calls[0] > 40 else values      # infinite after a few steps

    monkeypatch.setattr(problem, "losses", overflowing)
    trace = sazo_runs.run_sazo_trace(problem, steps=50, log_every=5, batch_size=2)
    assert trace.steps[-1] < trace.diverged_at <= trace.steps[-1] + 5 < 50, (trace.diverged_at, trace.steps)
    note = text(sw.sazo.trace_divergence(trace))
    assert f"diverged at step {trace.diverged_at}" in note and "infinite" in note and "lower η" in note, note  # the refused step


# -- notebook 05: the 2-D paths ----------------------------------------------------------------------

def test_paths_dashboard_names_diverged_paths_and_does_not_rank_them():
    """At η = 0.32 all three paths leave the picture: the readout ranked gaps of 2.4e+03 and 8.9e+04 as if
    they were results ("oracle p* < uniform MeZO < SAZO")."""
    board = sw.paths_dashboard(steps=60)
    board.controls["lr"].value = 10 ** -0.5
    shown = text(board.readout.value)
    assert "uniform MeZO, SAZO and oracle p* diverged" in shown, shown
    assert "η = 0.32" in shown and "lower η (try 0.1)" in shown, shown
    assert "lowest gap F − F* first" not in shown and set(board.state["diverged"]) == {"uniform", "sazo", "oracle"}
    for k, method in enumerate(("uniform", "sazo", "oracle")):
        at = board.state["diverged"][method][0]
        assert f"diverged at step {at}" in shown
        assert len(board.figures["paths"].data[1 + k].x) == at + 1      # drawn up to where it diverged
    board.controls["lr"].value = 0.02    # the default: nothing diverged, all three ranked
    shown = text(board.readout.value)
    assert "diverged" not in shown and shown.count(" < ") + shown.count(" = ") == 2, shown


# -- notebook 05: the race -----------------------------------------------------------------------------

def test_race_readout_says_which_method_diverged_when_and_at_which_rate():
    """At η SAZO = 1 SAZO's gap reaches 10¹²× its start: the table only said "not reached"."""
    board = sw.race_dashboard(seeds=1, steps=40, live_after=None)
    assert "diverged" not in text(board.readout.value)
    board.controls["lr_sazo"].value = 1.0
    shown = text(board.readout.value)
    assert re.search(r"SAZO diverged in its one seed: its gap passed 10× its start or stopped being finite by "
                     r"step \d+\. At η SAZO = 1 the steps are too large: lower η SAZO \(try 0\.32\)", shown), shown
    assert "uniform MeZO diverged" not in shown and "oracle p* diverged" not in shown
    assert [a.text for a in board.figures["race"].layout.annotations] == ["SAZO diverged"]


def test_race_tiny_eps_divergence_advises_a_larger_eps_not_only_a_lower_rate():
    from sazo_lite.course.sazo_runs import RaceResult
    from sazo_lite.course.widgets.race import race_divergence

    q = np.array([0.0, 20.0, 40.0])
    result = RaceResult(q, {"uniform": np.array([[1.0, 50.0, np.nan]])}, 1.0, 0.1, {"uniform": [None]},
                        lrs={"uniform": 0.01})
    assert "by step 10" in text(race_divergence(result, batch_size=1))
    assert "lower η uniform (try 0.0032)" in text(race_divergence(result, batch_size=1, eps=1e-3))
    assert "raise ε" in text(race_divergence(result, batch_size=1, eps=1e-9))
    with pytest.raises(ValueError, match="batch_size"):
        race_divergence(result, batch_size=0)


def test_a_race_run_whose_loss_overflows_keeps_its_curve_up_to_there(monkeypatch):
    """A refused non-finite loss made ``race`` drop the whole run (NaN from the first log point), so the plot
    and the readout could not say when it diverged."""
    problem = sazo_runs.make_problem(num_examples=16, dim=3)
    losses, calls = problem.losses, [0]

    def overflowing(theta, indices=None):
        calls[0] += 1
        values = losses(theta, indices)
        return values * np.inf if calls[0] > 60 else values

    monkeypatch.setattr(problem, "losses", overflowing)
    result = sazo_runs.race(problem, samplers=("uniform",), seeds=(0,), steps=50, log_every=5)
    row = result.gaps["uniform"][0]
    finite = np.isfinite(row)
    assert finite[:3].all() and not finite[-1] and result.to_target["uniform"] == [None], row
    stop = sazo_runs.first_divergence(row)
    assert stop is not None and finite[:stop].all()


# -- notebook 02: MeZO against SGD ---------------------------------------------------------------------

def test_mezo_dashboard_names_a_finite_but_exploding_run_and_keeps_its_axis_readable():
    """On least squares SGD at its default η = 0.5 reaches a gap of 3.6e+17 (and MeZO at η = 0.3, 8e+10): the
    readout printed those as results and the log axis ran from 10⁻² to 10⁷⁶ (round 8 caught only inf/NaN)."""
    from sazo_lite.course import problems

    board = sw.mezo_dashboard(problems.LeastSquares(64, 5, heterogeneity=1.5, seed=0), steps=60)
    shown = text(board.readout.value)
    assert re.search(r"SGD \(backprop\) diverged by step \d+: its gap passed 10× its start", shown), shown
    assert "η SGD = 0.5" in shown and "lower η SGD (try 0.16)" in shown and "e+17" not in shown, shown
    board.controls["lr_zo"].value = 0.3
    shown = text(board.readout.value)
    assert re.search(r"MeZO diverged by step \d+", shown) and "lower η MeZO (try 0.095)" in shown, shown
    for figure in board.figures.values():
        for trace in figure.data:        # nothing past the divergence (10× the starting gap of 3.15)
            assert all(y is None or y <= 31.5 for y in trace.y), (trace.name, trace.y)
            assert any(y is None for y in trace.y)
    board.controls["lr_zo"].value, board.controls["lr_sgd"].value = 0.02, 0.05
    assert "diverged" not in text(board.readout.value), text(board.readout.value)


def test_a_mezo_run_whose_loss_overflows_stops_and_says_at_which_step(monkeypatch):
    """MeZO refused a non-finite loss with FloatingPointError and the dashboard could only say "its loss became
    infinite or NaN", not when."""
    from sazo_lite.course import mezo_vs_sgd, problems

    problem = problems.LeastSquares(32, 3, seed=0)
    losses, calls = problem.losses, [0]

    def overflowing(theta, indices=None):
        calls[0] += 1
        values = losses(theta, indices)
        return values * float("inf") if calls[0] > 30 else values

    monkeypatch.setattr(problem, "losses", overflowing)
    run = mezo_vs_sgd.race_mezo_sgd(problem, steps=40, batch_size=2, log_every=2, methods=("MeZO",))["MeZO"]
    assert run["stopped"] is not None and run["queries"][-1] // 4 <= run["stopped"] <= run["queries"][-1] // 4 + 2 < 40


# -- helpers given bad data ----------------------------------------------------------------------------

def _bad_data_calls():
    from sazo_lite.course.sazo_runs import RaceResult, SAZOTrace
    from sazo_lite.course.widgets import llm, llm_lesson, race, sazo

    tiny = sazo_runs.make_problem(num_examples=8, dim=2)
    walk = {"F": 2.0, "radii": [1.0], "changes": [[-0.2, 0.0]], "mean_change": [-0.1]}
    return [
        # (call, the word its message must name, what it raised before)
        (lambda: llm.run_summary("x", {"queries": [0, 4]}), "train_loss"),                       # KeyError
        (lambda: llm.run_summary("x", {"queries": [0], "train_loss": [0.0], "walk": [0]}), "F₀"),  # ZeroDivisionError
        (lambda: llm.scores_vs_norms([1.0, 2.0], [1.0]), "scores/norms"),                         # IndexError
        (lambda: llm.probs_vs_oracle([0.5, 0.5], [1.0]), "p_sazo/p_star"),                       # silently drawn
        (lambda: llm.detector_precision([1.0, 2.0, 3.0], [0], 0), "k"),                          # ZeroDivisionError
        (lambda: llm.detector_precision([1.0, 2.0, 3.0], [0], 5), "k"),                          # silently 0.2
        (lambda: llm.displacement_figure({}), "radii"),                                           # KeyError
        (lambda: llm.displacement_figure({**walk, "F": 0.0}), "F"),                              # ZeroDivisionError
        (lambda: llm_lesson.gain_figure({"a": (2.0, 1.0)}, batch_sizes=(0,)), "batch_sizes"),    # ZeroDivisionError
        (lambda: llm_lesson.gain_figure({"a": (2.0, -1.0)}, batch_sizes=(2,)), "‖∇F‖²"),         # ZeroDivisionError
        (lambda: llm_lesson.scores_figure({}), "diagnostics"),                                    # KeyError
        (lambda: llm_lesson.scores_vs_norms_figure([1.0, 2.0], [1.0], ["new"]), "scores/norms"),  # silently drawn
        (lambda: sw.memory_figure({"MeZO step": -5}), "MeZO step"),                              # silently drawn
        (lambda: sw.memory_figure({"MeZO step": float("nan")}), "MeZO step"),                    # silently drawn
        (lambda: race.race_verdict(RaceResult(np.array([0.0]), {}, 1.0, 0.1, {"sazo": [None]})), "uniform"),  # KeyError
        (lambda: sazo.trace_readout(SAZOTrace(*[np.zeros(0)] * 9)), "trace"),                    # ZeroDivisionError
        (lambda: sazo_runs.race(tiny, seeds=(0,), steps=5, log_every=0), "log_every"),           # ZeroDivisionError
        (lambda: sazo_runs.rule_sampler("prior", 8, ema_decay=1.0), "ema_decay"),                # ZeroDivisionError
        (lambda: sazo_runs.rule_ladder(tiny, steps=5, seeds=()), "seeds"),                        # silently NaN
        (lambda: sazo_runs.run_sazo_trace(tiny, steps=5, diverge_factor=-1.0), "diverge_factor"),  # every run "diverged"
        (lambda: sazo_runs.feed_sampler(sazo_runs.SAZOSampler(4), [1.0, 1.0, 1.0], steps=2, batch_size=2), "norms"),
        (lambda: sazo_runs.first_divergence([]), "gaps"),
        (lambda: llm.loss_bands({"uniform": [{"queries": [0, 2], "train_loss": [0.0, 1.0]}]}), "F(θ₀)"),  # ZeroDivision
        (lambda: llm.loss_bands({"uniform": [{"queries": [0, 2]}]}), "train_loss"),                    # KeyError
        (lambda: llm.loss_bands({"uniform": [{"queries": [0, 2], "train_loss": [1.0]}]}), "queries/train_loss"),
    ]


@pytest.mark.parametrize("case", range(len(_bad_data_calls())))
def test_helpers_given_bad_data_raise_a_value_error_naming_it(case):
    call, name = _bad_data_calls()[case]
    with pytest.raises(ValueError, match=re.escape(name)):
        call()


def _bad_data_calls_2():
    import torch

    from sazo_lite.course import llm_lesson, memory, minibatches, problems, two_point

    ls = problems.LeastSquares(16, 3, seed=0)
    bowl = lambda t: two_point.bowl_loss(t, [1.0, 2.0])
    return [
        (lambda: two_point.bowl_loss(torch.zeros(3), [1.0, 2.0]), "curvatures"),             # RuntimeError
        (lambda: two_point.bowl_grad(torch.zeros(3), [1.0, 2.0]), "curvatures"),             # RuntimeError
        (lambda: two_point.directional_error(bowl, torch.zeros(2), torch.zeros(2),
                                             two_point.random_directions(2, 2), 1e-3), "zᵀ∇f = 0"),  # silently 0.0
        (lambda: minibatches.sample_minibatches([0.5, 0.6], 1, 3), "probs"),                 # weights silently off
        (lambda: minibatches.sample_minibatches([0.0, 0.0], 1, 3), "probs"),                 # RuntimeError
        (lambda: minibatches.sample_minibatches([0.5, 0.5], 0, 3), "batch_size"),            # RuntimeError
        (lambda: minibatches.sample_minibatches([0.5, 0.5], 1, 0), "trials"),                # RuntimeError
        (lambda: minibatches.minibatch_zo_estimates(torch.ones(3, 2), [0.5, 0.5], 1, 3), "per_example_grads"),
        (lambda: minibatches.weighted_loss_estimates([1.0, 2.0, 3.0], [0.5, 0.5], 1, 3), "losses"),
        (lambda: minibatches.gain_vs_batch([], 1.0, 2, [1]), "norms"),                       # ZeroDivisionError
        (lambda: minibatches.gain_vs_batch([0.0, 0.0], 0.0, 2, [1]), "norms"),               # ZeroDivisionError
        (lambda: minibatches.gain_vs_batch([1.0, 2.0], 1.0, 2, [0]), "batch_sizes"),         # ZeroDivisionError
        (lambda: minibatches.gain_vs_batch([-1.0, 2.0], 1.0, 2, [1]), "norms"),              # silently 4.0
        (lambda: minibatches.gain_along_path(ls, [1], []), "progress"),                      # RuntimeError
        (lambda: minibatches.second_moment_estimate(torch.ones(1, 2)), "draws"),             # silent NaN error bar
        (lambda: minibatches.norm_spread([]), "norms"),                                       # RuntimeError
        (lambda: ls.losses(torch.zeros(5)), "theta"),                                         # RuntimeError
        (lambda: llm_lesson.gain_by_hand([1.0, 2.0], 1.0, 0), "batch_size"),                 # silently 1.2
        (lambda: llm_lesson.gain_by_hand([], 1.0, 1), "norms"),                              # ZeroDivisionError
        (lambda: llm_lesson.gain_by_hand([0.0, 0.0], 0.0, 1), "norms"),                      # ZeroDivisionError
        (lambda: llm_lesson.turn({}), "train_loss"),                                          # KeyError
        (lambda: llm_lesson.turn({"train_loss": [], "walk": []}), "losses"),                 # "min() arg is an empty sequence"
        (lambda: llm_lesson.score_table({}), "diagnostics"),                                  # KeyError
        (lambda: memory.ladder_table("gpt-5"), "ladder_name"),                                  # KeyError
    ]


@pytest.mark.parametrize("case", range(len(_bad_data_calls_2())))
def test_course_helpers_given_bad_data_raise_a_value_error_naming_it(case):
    call, name = _bad_data_calls_2()[case]
    with pytest.raises(ValueError, match=re.escape(name)):
        call()


# -- presets and captions ------------------------------------------------------------------------------

def test_the_race_eps_caption_does_not_promise_that_every_method_stalls_at_the_preset():
    """The caption asked "at which ε do all three methods stall"; at the "ε too small" preset (ε = 1e-9) a
    seed of uniform or SAZO jumps off instead (rounding noise divided by 2ε), in fast and in class mode. The
    caption now asks about stalls and jumps, and the readout says the jump is ε's doing (raise ε)."""
    from sazo_lite.course.widgets import race as race_widgets

    caption = race_widgets._QUESTIONS["eps"]
    assert "all three methods stall" not in caption and "stalls" in caption and "jumps" in caption
    board = sw.race_dashboard(seeds=2, steps=100, live_after=None)
    preset = next(row.buttons for row in board.children if hasattr(row, "buttons"))["ε too small"]
    preset.click()
    shown = text(board.readout.value)
    assert board.controls["eps"].value == pytest.approx(1e-9)
    assert "diverged" in shown and "At ε = 1e-09 float32 rounding" in shown and "raise ε" in shown, shown
    assert "the steps are too large" not in shown


# -- readouts at the extremes --------------------------------------------------------------------------

def test_sazo_readout_does_not_report_a_rank_correlation_of_equal_estimates():
    """At step 0 under the plain rule every G is 1, and with N = 1 there is nothing to rank: the readout and the
    scatter's title said "ρ = 0.00" (no correlation), a number ``variance.spearman`` returns by convention."""
    board = sw.sazo_dashboard(steps=20)
    board.controls["step"].value = 0
    shown = text(board.readout.value)
    assert "Spearman ρ undefined (every estimate is equal)" in shown and "ρ = 0.00" not in shown, shown
    assert "ρ undefined" in board.figures["scatter"].layout.title.text
    board.controls["step"].value = 20
    assert re.search(r"Spearman ρ = -?\d\.\d\d", text(board.readout.value))
    single = sw.sazo_dashboard(num_examples=1, dim=1, steps=10)
    assert "ρ undefined" in text(single.readout.value), text(single.readout.value)


def test_paths_readout_says_one_step_not_one_steps():
    board = sw.paths_dashboard(steps=1)
    assert text(board.readout.value).startswith("after 1 step: "), text(board.readout.value)


def test_dimension_dashboard_refuses_no_dimensions():
    with pytest.raises(ValueError, match="dims"):
        sw.dimension_dashboard(dims=())
    with pytest.raises(ValueError, match="dims"):
        sw.dimension_dashboard(dims=(0, 4))


def test_estimator_readout_says_why_the_error_is_exactly_one_at_a_tiny_eps():
    """At ε ≤ 1e-8 in float32 every difference rounds to 0 and the error is exactly 1; the readout still
    promised "expected about √(3/q) = 0.245" as if the estimate were a noisy average."""
    board = sw.estimator_dashboard()
    preset = next(row.buttons for row in board.children if hasattr(row, "buttons"))["ε too small"]
    preset.click()
    shown = text(board.readout.value)
    assert board.state["error"] == pytest.approx(1.0)
    assert "rounds to 0 in float32" in shown and "ĝ = 0" in shown and "expected about" not in shown, shown
    board.controls["precision"].value = "float64"    # float64 rescues it: the ordinary sentence again
    shown = text(board.readout.value)
    assert "expected about √(3/q)" in shown and "rounds to 0" not in shown, shown


@pytest.mark.parametrize("build, name", [
    (lambda: sw.sazo_dashboard(steps=5, cache_size=0), "cache_size"),                   # StopIteration
    (lambda: sw.race_dashboard(steps=5, seeds=1, cache_size=0, live_after=None), "cache_size"),   # StopIteration
    (lambda: sw.race_dashboard(steps=5, seeds=1, log_every=0), "log_every"),             # ZeroDivisionError
    (lambda: sw.race_dashboard(steps=5, seeds=1, live_after=-1.0), "live_after"),        # silently accepted
    (lambda: sw.paths_dashboard(steps=5, grid=0), "grid"),                                # numpy's "zero-size array"
    (lambda: sw.paths_dashboard(steps=0), "steps"),                                       # "after 0 steps", no path
    (lambda: sw.unbiased_dashboard(trials=100, bins=0), "bins"),                          # ZeroDivisionError
])
def test_dashboards_given_bad_arguments_raise_a_value_error_naming_them(build, name):
    with pytest.raises(ValueError, match=name):
        build()


def test_batch_bars_readout_says_the_gradient_is_zero_at_the_optimum():
    """At t = 1 (θ*) the readout printed "‖∇F‖ = 3.51e-15", rounding noise read as a number."""
    board = sw.batch_bars_dashboard()
    board.controls["progress"].value = 1.0
    shown = text(board.readout.value)
    assert "‖∇F‖ = 0 (θ* up to rounding)" in shown and "e-1" not in shown, shown
    board.controls["progress"].value = 0.5
    assert re.search(r"‖∇F‖ = \d\.\d+$", text(board.readout.value)), text(board.readout.value)


def test_sazo_readout_prints_the_wiggle_notebook_04_reads_from_it():
    """Notebook 04's answer: "the readout's mean step |Δlog| of the trajectories falls as β rises" — the
    readout printed no such number."""
    board = sw.sazo_dashboard(steps=60)
    wiggle = {}
    for beta in (0.5, 0.99):
        board.controls["ema_decay"].value = beta
        found = re.search(r"plotted estimates' mean step \|Δ log\| = ([0-9.]+)", text(board.readout.value))
        assert found, text(board.readout.value)
        wiggle[beta] = float(found.group(1))
    assert wiggle[0.99] < wiggle[0.5] / 2, wiggle
    board.controls["step"].value = 0
    assert "not yet measurable" in text(board.readout.value)


def test_a_heterogeneity_beyond_float64_is_a_value_error_not_a_linalg_error():
    """At σ = 50 every scale exp(σξ − σ²/2) underflows to 0: LeastSquares raised torch's LinAlgError
    ("the input matrix is singular") from its normal equations."""
    from sazo_lite.course import problems

    with pytest.raises(ValueError, match="heterogeneity"):
        problems.LeastSquares(16, 3, heterogeneity=50.0)
    with pytest.raises(ValueError, match="heterogeneity"):
        sazo_runs.make_problem(heterogeneity=50.0)
    assert problems.LeastSquares(16, 3, heterogeneity=2.5).optimum.isfinite().all()


def test_race_table_does_not_advise_raising_the_rate_of_a_diverged_race():
    """With every method diverged and none at the target, the table said "no method did (raise the rate or
    the steps)": the opposite of the fix."""
    from sazo_lite.course.sazo_runs import RaceResult
    from sazo_lite.course.widgets.race import race_table_html

    q = np.array([0.0, 20.0, 40.0])
    wild, calm = np.array([[1.0, 50.0, np.nan]]), np.array([[1.0, 0.9, 0.8]])
    every = RaceResult(q, {m: wild for m in ("uniform", "sazo", "oracle")}, 1.0, 0.1,
                       {m: [None] for m in ("uniform", "sazo", "oracle")})
    assert "every method diverged: lower the rates" in text(race_table_html(every))
    assert "raise the rate" not in text(race_table_html(every))
    some = RaceResult(q, {"uniform": wild, "sazo": calm, "oracle": calm}, 1.0, 0.1,
                      {m: [None] for m in ("uniform", "sazo", "oracle")})
    assert "uniform MeZO diverged: lower its η; raise the others' η or the steps" in text(race_table_html(some))
    slow = RaceResult(q, {m: calm for m in ("uniform", "sazo", "oracle")}, 1.0, 0.1,
                      {m: [None] for m in ("uniform", "sazo", "oracle")})
    assert "no method did (raise the rate or the steps)" in text(race_table_html(slow))


def test_the_dashboards_tiny_eps_presets_raise_no_flat_loss_warning():
    """The "ε too small" presets (ε = 1e-9 in float32) made sazo_lite.train warn FlatLossWarning about merged
    adapters beside readouts that already explain ε; under the race's rounding noise θ even moves later."""
    import warnings

    from sazo_lite import FlatLossWarning

    boards = [sw.sazo_dashboard(num_examples=64, dim=6, steps=30, log_every=3),
              sw.race_dashboard(seeds=1, steps=30, log_every=10, live_after=None),
              sw.mezo_dashboard(steps=30)]
    for board in boards:
        preset = next(b for b in _buttons(board) if b.description == "ε too small")
        with warnings.catch_warnings(record=True) as caught:   # a click's handler swallows exceptions
            warnings.simplefilter("always")
            preset.click()
        assert board.controls["eps"].value == pytest.approx(1e-9)
        assert not [w for w in caught if issubclass(w.category, FlatLossWarning)]


def _buttons(widget):
    import ipywidgets

    if isinstance(widget, ipywidgets.Button):
        yield widget
    for child in getattr(widget, "children", ()):
        yield from _buttons(child)


@pytest.mark.parametrize("examples", [1, 2, 99])
def test_the_chi2_dashboard_refuses_too_few_examples_for_its_statistics(examples):
    """examples=1 printed 'relative variance 0.00 (theory 2)': a statistic of one draw, not χ²₁."""
    with pytest.raises(ValueError, match="Invalid examples"):
        sw.chi2_dashboard(examples=examples)
    assert "theory 2" in sw.chi2_dashboard(examples=100).readout.value

"""Red-team round 11 on the course layer: problems a student builds (one example, a θ₀ already optimal, NaN),
the dashboards given them, and the presets' captions checked against what fast mode computes.

Rounds 8–10 (tests/test_course_round8.py … round10.py) drove the dashboards' sliders to their ends; this round
feeds the helpers and dashboards an instructor's or a student's own data.
"""
from __future__ import annotations

import re

import numpy as np
import pytest
import torch

pytest.importorskip("ipywidgets")
pytest.importorskip("plotly")

from sazo_lite.course import problems, sazo_runs  # noqa: E402
from sazo_lite.course import widgets as sw  # noqa: E402


def text(html: str) -> str:
    return re.sub(r"<[^>]+>", "", html)


def _data(n: int = 20, d: int = 3, seed: int = 0):
    features = np.random.default_rng(seed).normal(size=(n, d))
    return features, np.where(features[:, 0] > 0, 1, -1)


def _at_optimum(seed: int = 1, *, noise: int = 0):
    """A logistic regression whose θ* is θ₀ = 0: each feature row and its negative, with both labels."""
    x = np.random.default_rng(seed).normal(size=(5, 3))
    features = np.concatenate([x, -x, x, -x])
    return problems.LogisticRegression(features, np.r_[np.ones(10), -np.ones(10)])


class _Shifted:
    """``problem`` with its gap moved by ``shift`` (a θ* a few ulps off, or one that does not minimise it)."""

    def __init__(self, problem, shift: float) -> None:
        self._problem, self._shift = problem, shift

    def __getattr__(self, name):
        return getattr(self._problem, name)

    def gap(self, theta) -> float:
        return self._problem.gap(theta) + self._shift


# -- problems a student builds ------------------------------------------------------------------------

def test_logistic_regression_of_one_example_has_a_finite_optimum():
    features, labels = _data()
    one = problems.LogisticRegression(features[:1], labels[:1])          # std over one row was NaN: θ* all NaN
    assert bool(torch.isfinite(one.optimum).all()) and bool(torch.isfinite(one.features).all()), one.optimum
    assert one.gap(one.initial_theta()) > 0
    assert float(one.gradient(one.optimum).norm()) < 1e-9
    result = sazo_runs.race(one, seeds=(0,), steps=6, log_every=3)      # was refused: its gap was NaN
    assert np.isfinite(result.gaps["sazo"]).all()


def test_first_divergence_of_a_run_that_starts_at_0_counts_only_a_non_finite_gap():
    assert sazo_runs.first_divergence([0.0, 1e-5, 3e-5]) is None       # was 1: 10 × 0 called any move diverged
    assert sazo_runs.first_divergence([0.0, 1e-5, float("nan")]) == 2
    assert sazo_runs.first_divergence([1.0, 5.0, 11.0]) == 2            # the usual rule unchanged


def test_starting_gap_reads_rounding_as_0_and_refuses_nan_or_a_theta_star_that_is_not_a_minimiser():
    problem = sazo_runs.make_problem(num_examples=16, dim=3)
    assert sazo_runs.starting_gap(problem) == problem.gap(problem.initial_theta())
    assert sazo_runs.starting_gap(_Shifted(_at_optimum(), 1.1e-16)) == 0.0
    assert sazo_runs.starting_gap(_Shifted(_at_optimum(), -1.1e-16)) == 0.0
    with pytest.raises(ValueError, match="Invalid problem: its initial gap .* is nan"):
        sazo_runs.starting_gap(_Shifted(problem, float("nan")))
    with pytest.raises(ValueError, match="not a minimiser"):
        sazo_runs.starting_gap(_Shifted(problem, -10.0))
    tiny = _Scaled(problem, 1e-20)                        # a problem of tiny losses: its gap is not rounding
    assert sazo_runs.starting_gap(tiny) == pytest.approx(1e-20 * problem.gap(problem.initial_theta()), rel=1e-9, abs=0)


class _Scaled(_Shifted):
    """``problem`` with its losses (as the gap and F(θ*) read them) times ``factor``."""

    def __init__(self, problem, factor: float) -> None:
        super().__init__(problem, 0.0)
        self._factor = factor

    def gap(self, theta) -> float:
        return self._factor * self._problem.gap(theta)

    @property
    def optimal_loss(self) -> float:
        return self._factor * self._problem.optimal_loss


def test_race_of_a_problem_at_its_optimum_up_to_rounding_is_refused_not_raced():
    # one ulp above 0: the float32 runs' gaps were 10⁹ × the start, every method "diverged: lower the rates"
    with pytest.raises(ValueError, match="θ₀ already minimises it"):
        sazo_runs.race(_Shifted(_at_optimum(), 1.1e-16), seeds=(0,), steps=4, log_every=2)
    with pytest.raises(ValueError, match="expected a finite number"):       # was "θ₀ already minimises it"
        sazo_runs.race(_Shifted(_at_optimum(), float("nan")), seeds=(0,), steps=4, log_every=2)


def test_sazo_trace_from_the_optimum_is_not_stopped_as_diverged():
    trace = sazo_runs.run_sazo_trace(_at_optimum(), steps=12, log_every=3, diverge_factor=10)
    assert trace.diverged_at is None and len(trace.steps) == 5, trace.steps   # stopped at step 3 (gap > 10 × 0)
    with pytest.raises(ValueError, match="Invalid problem: its initial gap"):
        sazo_runs.run_sazo_trace(_Shifted(_at_optimum(), -1.0), steps=6, diverge_factor=10)   # limit < 0: stopped at once


def test_mezo_dashboard_on_a_problem_at_its_optimum_says_so_and_calls_nothing_diverged():
    board = sw.mezo_dashboard(_at_optimum(), steps=20)
    said = text(board.readout.value)
    assert " diverged by" not in said and "lower η" not in said, said   # was "MeZO diverged by step 1 … (0 → 3e-05)"
    assert "θ₀ already minimises this problem" in said
    assert all(y is not None for trace in board.figures["queries"].data for y in trace.y)   # both curves drawn
    board = sw.mezo_dashboard(_Shifted(_at_optimum(), -1.1e-16), steps=10)   # was first_divergence's "Invalid gaps"
    assert "θ₀ already minimises this problem" in text(board.readout.value)


def test_mezo_dashboard_refuses_a_problem_with_a_nan_start_when_built():
    problem = sazo_runs.make_problem("logistic regression (breast cancer)")
    with pytest.raises(ValueError, match="Invalid problem: its initial gap"):   # was "Invalid gaps" at the first draw
        sw.mezo_dashboard(_Shifted(problem, float("nan")), steps=10)


# -- helpers given a list, a numpy array, zero norms -------------------------------------------------

def test_zo_gradient_and_error_vs_eps_take_theta_as_a_list_or_numpy_array_like_the_other_two_point_helpers():
    from sazo_lite.course import two_point

    def bowl(x):
        return two_point.bowl_loss(x, [1.0, 3.0])

    point = torch.tensor([1.0, -2.0], dtype=torch.float64)
    expected = two_point.zo_gradient(bowl, point, 1e-4, 16, seed=1)
    for theta in ([1.0, -2.0], np.array([1.0, -2.0])):                 # AttributeError: no 'numel'
        torch.testing.assert_close(two_point.zo_gradient(bowl, theta, 1e-4, 16, seed=1), expected)
        curve = two_point.error_vs_eps(bowl, two_point.bowl_grad(point, [1.0, 3.0]), theta, [1e-3, 1e-6])
        assert curve.shape == (2,) and bool(torch.isfinite(curve).all())
    with pytest.raises(ValueError, match="Invalid eps_grid"):           # was an empty curve
        two_point.error_vs_eps(bowl, two_point.bowl_grad(point, [1.0, 3.0]), point, [])


def test_norm_spread_with_zero_norms_at_its_5th_percentile_is_infinite_not_the_clamps_270_decades():
    from sazo_lite.course import minibatches

    assert minibatches.norm_spread([0.0, 0.0, 1.0]) == float("inf")     # was 270.0 (log10 of the 1e-300 clamp)
    one_zero = torch.cat([torch.zeros(1), torch.logspace(0, 2, 100)])   # the 5th percentile lies past the zero
    assert minibatches.norm_spread(one_zero) == pytest.approx(minibatches.norm_spread(torch.logspace(0, 2, 100)), abs=0.1)


def test_race_and_rule_ladder_take_seeds_as_a_numpy_array_and_run_sazo_trace_names_steps_none():
    problem = sazo_runs.make_problem(num_examples=8, dim=2)
    result = sazo_runs.race(problem, seeds=np.arange(2), steps=4, log_every=2)   # was "truth value ... ambiguous"
    assert result.gaps["sazo"].shape == (2, 3)
    with pytest.raises(ValueError, match="Invalid steps: None"):                 # was TypeError from None < 1
        sazo_runs.run_sazo_trace(problem, steps=None)
    table = sazo_runs.rule_ladder(problem, steps=4, seeds=np.arange(1), rules=np.array(["plain"]), log_every=2)
    assert sorted(table) == ["plain", "uniform"]                                # was "truth value ... ambiguous"


# -- an instructor's own language-model records --------------------------------------------------------

@pytest.mark.parametrize("array", [np.array, torch.tensor])
def test_llm_figures_take_a_runs_series_as_a_numpy_array_or_tensor(array):
    from sazo_lite.course.widgets import llm

    run = {"queries": array([0, 2, 4]), "train_loss": array([1.0, 0.8, 0.4]), "walk": array([0.0, 1.0, 2.0])}
    listed = {key: value.tolist() for key, value in run.items()}
    # each raised "truth value of an array ... is ambiguous" (numpy) or "Boolean value of Tensor" (torch)
    assert [list(t.y) for t in llm.loss_bands({"uniform": [run]}).data] == \
        [list(t.y) for t in llm.loss_bands({"uniform": [listed]}).data]
    assert llm.run_summary("uniform", run) == llm.run_summary("uniform", listed)
    assert list(llm.walk_figure({"uniform": [run]}).data[0].y) == [0.0, 1.0, 2.0]
    assert llm.queries_table_html({"uniform": [run]}) == llm.queries_table_html({"uniform": [listed]})
    assert llm.best_cells({"uniform η=1e-3": [run]}, 0.5) == {"uniform": "uniform η=1e-3"}


# -- a dashboard drawn again after a refused setting ------------------------------------------------------

def test_memory_dashboard_draws_no_bars_for_a_shape_it_refuses_and_draws_them_again_once_valid():
    board = sw.memory_dashboard()
    bars = board.figures["bars"]
    before = [list(trace.y) for trace in bars.data]
    board.controls["kv_heads"].value = 3                  # 16 heads: 3 KV heads do not divide them
    assert "expected heads to divide hidden" in text(board.readout.value)
    # the last valid shape's bars stayed under the message that refused this one
    assert all(y is None for trace in bars.data for y in trace.y), [list(t.y) for t in bars.data]
    assert "not a valid model" in bars.layout.title.text
    shown = bars.view.outputs[0]["data"]["application/vnd.plotly.v1+json"]
    assert all(y is None for trace in shown["data"] for y in trace.get("y", [])), shown["data"]   # the page too
    board.controls["kv_heads"].value = 2
    assert [list(trace.y) for trace in bars.data] == before and bars.layout.title.text == "Peak memory of one training step"


# -- notebook 01's dashboards at an instructor's own θ ----------------------------------------------------

def test_estimator_dashboard_frames_a_theta_beyond_2_so_its_arrows_are_on_the_plot():
    board = sw.estimator_dashboard(theta=(5.0, -3.0))
    fig = board.figures["arrows"]
    low, high = fig.layout.xaxis.range
    ends = [*fig.data[2].x, *fig.data[2].y, *fig.data[3].x, *fig.data[3].y]     # the true and the estimated arrows
    assert low <= min(ends) and max(ends) <= high, (fig.layout.xaxis.range, ends)   # was [-2, 2]: nothing on screen
    assert tuple(fig.layout.yaxis.range) == (low, high)
    assert max(fig.data[0].x) >= 5.0                                             # the contours cover it too


@pytest.mark.parametrize("build, theta", [(sw.estimator_dashboard, (1e20, 1.0)),
                                          (sw.epsilon_dashboard, (1e20, 1.0, 1.0))])
def test_notebook_01_dashboards_refuse_a_theta_whose_loss_overflows_float32(build, theta):
    with pytest.raises(ValueError, match="Invalid theta: .*beyond float32's range"):   # was an error of nan
        build(theta=theta)


def test_epsilon_dashboard_names_no_best_eps_where_every_eps_rounds_to_g_0():
    board = sw.epsilon_dashboard(theta=(1e9, 1.0, 1.0))      # θ's float32 step is 64: every θ ± εz rounds to θ
    said = text(board.readout.value)
    assert "best ε" not in said and "rounding wins at every ε" in said, said   # was "best ε ≈ 1e-10 (error 1)"
    board.controls["precision"].value = "float64"
    assert "best ε on the grid" in text(board.readout.value)


# -- benchmarks.dashboard_latency -------------------------------------------------------------------------

def test_dashboard_latency_times_a_selection_slider_too():
    import ipywidgets

    from benchmarks.dashboard_latency import new_values

    board = sw.memory_dashboard()
    context = board.controls["context"]
    assert isinstance(context, ipywidgets.SelectionSlider)
    values = new_values(context)              # was []: the memory dashboard's n_ctx slider was never timed
    assert values and context.value not in values and set(values) <= set(context.options)
    for control in board.controls.values():   # every control of the dashboard gets a change to time
        assert new_values(control), control.description


def test_unbiased_dashboard_reads_the_largest_weight_among_examples_that_can_be_drawn():
    board = sw.unbiased_dashboard(num_examples=5, dim=5, trials=200)   # N = d: at θ* some residuals are exactly 0
    board.controls["progress"].value = 1.0                            # λ = 0: the oracle gives those p_i = 0
    said = text(board.readout.value)
    weight = float(re.search(r"largest weight 1/\(N p_i\) = ([^ ;(]+)", said).group(1))
    assert np.isfinite(weight), said                                  # was inf: 1/(N·0) of an example never drawn
    assert "p_i = 0, never drawn" in said
    board.controls["uniform_mix"].value = 0.5                          # every p_i > 0 again
    assert "never drawn" not in text(board.readout.value)


def test_table_formats_numpy_scalars_and_0d_tensors_as_numbers():
    from sazo_lite.course.tables import Table

    table = Table(["a", "b", "c", "d"], [[np.float32(0.123456), torch.tensor(10.123456), np.float64(2.5e-5), np.int64(7)]])
    assert table.rows == [["0.123", "10.1", "2.50e-05", "7"]], table.rows   # was '0.123456', 'tensor(10.1235)'
    assert Table(["x"], [[torch.tensor([1.0, 2.0])]]).rows == [[str(torch.tensor([1.0, 2.0]))]]   # not a number: as it prints


# -- the race's plot and table of an instructor's own RaceResult ------------------------------------------

def _hand_built(gaps: dict, to_target: dict, queries=(0, 10, 20)):
    return sazo_runs.RaceResult(list(queries), gaps, 1.0, 0.1, to_target)


def test_race_verdict_of_a_race_of_uniform_alone_is_one_sentence():
    from sazo_lite.course.widgets import race as race_widgets

    result = sazo_runs.race(sazo_runs.make_problem(num_examples=8, dim=2), samplers=("uniform",), seeds=(0,),
                            steps=40, log_every=2, lr=0.05)
    verdict = race_widgets.race_verdict(result)
    assert verdict.endswith("(median).") and "; ." not in verdict, verdict        # was "…(median); ."


def test_race_figure_and_table_read_gaps_given_as_lists():
    from sazo_lite.course.widgets import race as race_widgets

    result = _hand_built({"uniform": [[1.0, 0.5, 0.05]], "sazo": [[1.0, 0.2, 0.01]]},
                         {"uniform": [20], "sazo": [10]})
    figure = race_widgets.race_figure(result)                 # was TypeError: list / float
    assert [round(float(y), 3) for y in figure.data[3].y] == [1.0, 0.2, 0.01]
    assert "2.00×" in race_widgets.race_table_html(result)
    assert "2.00× fewer" in race_widgets.race_verdict(result)


@pytest.mark.parametrize("gaps, to_target, match", [
    ({"uniform": [[1.0, 0.5]]}, {"uniform": [None]}, r"gaps\['uniform'\] of shape \(1, 2\) for \(3,\) queries"),  # IndexError
    ({"uniform": [[1.0, 0.5, 0.1]], "mine": [[1.0, 0.2, 0.05]]}, {"uniform": [20], "mine": [20]}, r"methods \['mine'\]"),
])
def test_race_figure_table_and_verdict_refuse_a_result_they_cannot_read(gaps, to_target, match):
    from sazo_lite.course.widgets import race as race_widgets

    result = _hand_built(gaps, to_target)
    for draw in (race_widgets.race_figure, race_widgets.race_table_html, race_widgets.race_verdict,
                 lambda r: race_widgets.race_divergence(r, 1)):
        # 'mine' was dropped from the plot and the table without a word, and a KeyError in the verdict
        with pytest.raises(ValueError, match="Invalid result: " + match):
            draw(result)


# -- notebook 02's textbook step ---------------------------------------------------------------------------

@pytest.mark.parametrize("failure", ["raises", "nan"])
def test_mezo_step_reference_puts_theta_back_when_a_pass_fails(failure):
    from sazo_lite.course import instruments

    theta = torch.tensor([1.0, -2.0, 0.5])
    start, calls = theta.clone(), [0]

    def closure():
        calls[0] += 1
        if calls[0] == 2:          # the second pass, at θ − εz
            if failure == "raises":
                raise RuntimeError("out of memory")
            return torch.tensor(float("nan"))
        return (theta ** 2).sum()

    error = RuntimeError if failure == "raises" else FloatingPointError
    with pytest.raises(error):
        instruments.mezo_step_reference([theta], closure, eps=1e-3, lr=0.1, seed=0)
    # was left at θ − εz after the exception, or at θ − η·NaN·z (all NaN) after a NaN loss
    torch.testing.assert_close(theta, start, atol=1e-6, rtol=0)
    with pytest.raises(ValueError, match="Invalid eps"):                    # was ZeroDivisionError after two passes
        instruments.mezo_step_reference([theta], lambda: (theta ** 2).sum(), eps=0.0, lr=0.1, seed=0)


@pytest.mark.parametrize("run", [lambda p: sw.mezo_dashboard(p, steps=5),
                                 lambda p: sazo_runs.race(p, seeds=(0,), steps=4),
                                 lambda p: sazo_runs.run_sazo_trace(p, steps=4)])
def test_a_name_or_a_dataset_in_place_of_a_problem_is_refused_naming_it(run):
    for wrong in ("breast_cancer", np.ones((4, 2))):
        with pytest.raises(ValueError, match="Invalid problem: .* has no .*expected a FiniteSumProblem"):
            run(wrong)                                    # was AttributeError: 'str' object has no attribute …


def test_gain_vs_batch_figure_refuses_measured_ratios_of_a_set_it_has_no_prediction_for():
    from sazo_lite.course.widgets import llm

    with pytest.raises(ValueError, match=r"Invalid measured: \['b'\] have no predicted line"):   # was left off the plot
        llm.gain_vs_batch_figure({"a": {1: 5.0, 4: 3.0}}, {"b": {1: 2.0}})
    assert len(llm.gain_vs_batch_figure({"a": {1: 5.0, 4: 3.0}}, {"a": {1: 2.0}}).data) == 2


def test_probs_vs_oracle_refuses_scores_that_are_not_a_distribution():
    from sazo_lite.course.widgets import llm

    with pytest.raises(ValueError, match="Invalid p_sazo: sums to 1.4"):      # was drawn as N·p_i = 1.0 and 1.8
        llm.probs_vs_oracle([0.5, 0.9], [0.9, 0.1])
    with pytest.raises(ValueError, match="Invalid p_star: sums to 0.5"):
        llm.probs_vs_oracle([0.5, 0.5], [0.25, 0.25])
    stored = np.full(64, 1 / 64, dtype=np.float32)                           # float32 probabilities still draw
    assert len(llm.probs_vs_oracle(stored, stored).data[0].y) == 64


def test_score_scatters_say_how_many_points_a_0_leaves_off_their_log_axes():
    from sazo_lite.course.widgets import llm, llm_lesson

    # a score of 0 (an example the plain rule never drew) vanished from the log-log plot without a word
    title = llm.scores_vs_norms([0.0, 2.0, 3.0], [1.0, 2.0, 0.5]).layout.title.text
    assert title.endswith("1 of 3 points have a 0, off the log axes"), title
    lesson = llm_lesson.scores_vs_norms_figure([1.0, 2.0], [0.0, 2.0], ["new", "assimilated"]).layout.title.text
    assert "1 of 2 points have a 0" in lesson, lesson
    assert "off the log axes" not in llm.scores_vs_norms([1.0, 2.0], [1.0, 2.0]).layout.title.text


def test_dashboard_latency_reports_a_dashboard_with_nothing_to_time_instead_of_failing(capsys):
    from benchmarks.dashboard_latency import report

    report("text_dashboard", {"build_ms": 12.0, "misses": {"name": []}, "hits": []}, per_control=True)   # StatisticsError
    assert "no control change timed" in capsys.readouterr().out


def test_logistic_regression_says_how_to_pass_0_1_labels_and_names_features_that_are_not_numbers():
    features, labels = _data(6, 2)
    with pytest.raises(ValueError, match=r"Invalid labels: values \[0.0, 1.0\] .*pass 2 \* y - 1"):
        problems.LogisticRegression(features, (labels + 1) // 2)            # scikit-learn's 0/1 labels
    with pytest.raises(ValueError, match="Invalid features: list that does not convert to numbers"):
        problems.LogisticRegression([["a", "b"]] * 6, labels)               # was torch's TypeError, no argument named
    as_objects = problems.LogisticRegression(features.astype(object), labels)   # was TypeError: numpy.object_
    torch.testing.assert_close(as_objects.optimum, problems.LogisticRegression(features, labels).optimum)


def test_loss_grid_refuses_an_empty_or_nan_axis():
    problem = problems.LeastSquares(8, 2)
    assert sazo_runs.loss_grid(problem, [0, 1], [0.0, 0.5, 1.0]).shape == (3, 2)      # integers are numbers
    for xs, ys, name in (([], [0.0, 1.0], "xs"), ([0.0, 1.0], [0.0, float("nan")], "ys")):
        with pytest.raises(ValueError, match=f"Invalid {name}"):                       # was [] or a NaN row
            sazo_runs.loss_grid(problem, xs, ys)


@pytest.mark.parametrize("drawn", [-5, 0, 2.5])
def test_dimension_dashboard_refuses_a_number_of_directions_that_is_not_a_count(drawn):
    with pytest.raises(ValueError, match="Invalid directions_drawn"):     # was 16 trials a dot, silently
        sw.dimension_dashboard(directions_drawn=drawn)

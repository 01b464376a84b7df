"""Round 14 (helper 52): dashboard_latency says when and where it ran; the course's and ``make bench``'s
divergence rules go through one helper (``train.divergence_limit``) with their factors unchanged."""
from __future__ import annotations

import re

import pytest

from benchmarks import cli, dashboard_latency


def _no_timing(monkeypatch):
    """dashboard_latency.main without building or timing a dashboard: each measures as one with nothing to time."""
    monkeypatch.setattr(dashboard_latency, "measure", lambda build: {"build_ms": 0.0, "misses": {}, "hits": []})


def test_dashboard_latency_prints_the_date_and_machine_as_every_benchmark(capsys, monkeypatch):
    """It printed the load average and core count, no date: its timings could not be matched to a run."""
    _no_timing(monkeypatch)
    info = dict(cli.machine(), date="2031-02-03 04:05 UTC", processor="a-test-cpu")
    monkeypatch.setattr(dashboard_latency, "machine", lambda: info)
    dashboard_latency.main(["--only", "race"])
    out = capsys.readouterr().out
    assert cli.measured_line(info) in out.splitlines()[0]     # the shared helper's line, first, before any timing


def test_dashboard_latency_date_is_now_in_utc(capsys, monkeypatch):
    _no_timing(monkeypatch)
    before = cli.machine()["date"]
    dashboard_latency.main(["--only", "race"])
    after = cli.machine()["date"]
    head = capsys.readouterr().out.splitlines()[0]
    printed = re.search(r"\d{4}-\d{2}-\d{2} \d{2}:\d{2} UTC", head).group(0)
    assert before <= printed <= after


def test_dashboard_latency_refusal_prints_no_header(capsys):
    with pytest.raises(SystemExit):
        dashboard_latency.main(["--only", "no-such-dashboard"])
    assert "UTC" not in capsys.readouterr().out


# -- one divergence rule: train.divergence_limit, each caller with its own named factor ----------------------------

import math

import numpy as np
from hypothesis import given, settings, strategies as st

from benchmarks import queries as bench_queries
from sazo_lite.course import mezo_vs_sgd, sazo_runs
from sazo_lite.course.problems import LeastSquares
from sazo_lite.course.widgets import race as race_widget
from sazo_lite.train import History, divergence_limit, diverged

NAN, INF = float("nan"), float("inf")


def _values(start: float, factor: float) -> list[float]:
    """Metrics around a run's limit: below it, at it (not above: not diverged), just above it, far above, below the
    start, and the non-finite ones."""
    at = factor * start if math.isfinite(factor) else 1e300
    return [0.0, 1e-300, 0.5 * start, start, at, math.nextafter(at, INF), 5.0, 1e300, -1.0, NAN, INF, -INF]


# the old code's rules, written out plainly (the verdicts each caller gave before it used the shared helper)
def _course_rule(value: float, start: float, factor: float) -> bool:   # sazo_runs.first_divergence, run_sazo_trace
    return not math.isfinite(value) or (start > 0 and value > factor * start)


def _finite_rule(value: float) -> bool:   # the race (RaceResult.diverged, race's runs), MeZO against SGD
    return not math.isfinite(value)


def _bench_rule(value: float, start: float) -> bool:   # make bench's TargetRun: 10⁴ × its initial gap, 0 at a start of 0
    return not math.isfinite(value) or value > 1e4 * start


def test_the_factors_are_the_documented_ones():
    """Changing one would invalidate the stored class runs, notebook 05's tuned rates and make bench's tables."""
    assert sazo_runs.DIVERGE_FACTOR == 10.0                 # docs/course.md: DIVERGE_FACTOR = 10
    assert bench_queries.DIVERGE_FACTOR == 1e4              # docs/llm.md: the toy benchmark's 10⁴·gap₀
    assert sazo_runs.RACE_DIVERGE_FACTOR == math.inf == mezo_vs_sgd.MEZO_DIVERGE_FACTOR   # only a non-finite gap


@settings(max_examples=200, deadline=None)
@given(start=st.floats(-1e300, 1e300), factor=st.floats(1.0, 1e6, exclude_min=True))
def test_divergence_limit_is_factor_times_start(start, factor):
    assert divergence_limit(start, factor) == factor * start


@pytest.mark.parametrize("start", [0.0, -3.0, 2.0, INF, -INF, NAN])
def test_an_infinite_factor_counts_only_non_finite_metrics_whatever_the_start(start):
    limit = divergence_limit(start, INF)   # inf × 0 and inf × NaN would be NaN, inf × −3 −inf
    assert limit == INF
    assert [diverged(v, limit) for v in _values(1.0, 10.0)] == [_finite_rule(v) for v in _values(1.0, 10.0)]


@pytest.mark.parametrize("factor", [1.0, 0.5, 0, -INF, NAN, True, "10", None])
def test_divergence_limit_refuses_a_factor_not_above_1(factor):
    with pytest.raises(ValueError, match="Invalid factor"):
        divergence_limit(2.0, factor)
    with pytest.raises(ValueError, match="Invalid factor"):   # also where the course ignores it (a start of 0)
        sazo_runs.gap_limit(0.0, factor)


@pytest.mark.parametrize("start", [True, "2", None])
def test_divergence_limit_refuses_a_start_that_is_not_a_number(start):
    with pytest.raises(ValueError, match="Invalid start"):
        divergence_limit(start, 10.0)


@pytest.mark.parametrize("start", [2.0, 0.0, -1.0, NAN])
def test_gap_limit_is_the_shared_limit_with_no_scale_at_a_start_not_above_0(start):
    limit = sazo_runs.gap_limit(start)
    assert limit == (divergence_limit(start, sazo_runs.DIVERGE_FACTOR) if start > 0 else INF)


class _Spy:
    """A stand-in for a module's limit function that records (start, factor) and returns the real limit."""

    def __init__(self, real):
        self.real, self.calls = real, []

    def __call__(self, start, factor=sazo_runs.DIVERGE_FACTOR):
        self.calls.append((start, factor))
        return self.real(start, factor)


# -- the dashboards: sazo_runs.first_divergence and run_sazo_trace at DIVERGE_FACTOR = 10 --------------------------

@pytest.mark.parametrize("start", [2.0, 0.0, 1e-300])
def test_first_divergence_verdicts_are_unchanged(start):
    factor = sazo_runs.DIVERGE_FACTOR
    for value in _values(start, factor):
        expected = 1 if _course_rule(value, start, factor) else None
        assert sazo_runs.first_divergence([start, value]) == expected, value


def test_first_divergence_goes_through_the_shared_rule(monkeypatch):
    spy = _Spy(divergence_limit)
    monkeypatch.setattr(sazo_runs, "divergence_limit", spy)
    sazo_runs.first_divergence([2.0, 30.0])
    sazo_runs.first_divergence([2.0, 30.0], factor=20.0)
    assert spy.calls == [(2.0, sazo_runs.DIVERGE_FACTOR), (2.0, 20.0)]


class _Limit(Exception):
    """Raised by a stand-in ``lesson_train``: the limit a run would have trained with."""


def _trace_limit(monkeypatch, start: float) -> float:
    """The ``diverge_above`` run_sazo_trace (as the SAZO dashboard calls it) trains with from a starting gap."""
    monkeypatch.setattr(sazo_runs, "starting_gap", lambda problem: start)

    def stop(*args, diverge_above, **kwargs):
        raise _Limit(diverge_above)

    monkeypatch.setattr(sazo_runs, "lesson_train", stop)
    with pytest.raises(_Limit) as caught:
        sazo_runs.run_sazo_trace(sazo_runs.make_problem(num_examples=16, dim=3), steps=10, log_every=5,
                                 diverge_factor=sazo_runs.DIVERGE_FACTOR)
    return caught.value.args[0]


@pytest.mark.parametrize("start", [2.0, 0.0])
def test_run_sazo_trace_limit_gives_the_same_verdicts(monkeypatch, start):
    limit = _trace_limit(monkeypatch, start)
    factor = sazo_runs.DIVERGE_FACTOR
    assert [diverged(v, limit) for v in _values(start, factor)] == \
        [_course_rule(v, start, factor) for v in _values(start, factor)]


def test_run_sazo_trace_goes_through_the_shared_rule(monkeypatch):
    spy = _Spy(sazo_runs.gap_limit)
    monkeypatch.setattr(sazo_runs, "gap_limit", spy)
    _trace_limit(monkeypatch, 2.0)
    assert spy.calls == [(2.0, sazo_runs.DIVERGE_FACTOR)]


@pytest.mark.parametrize("value", _values(1.0, 10.0))
def test_race_plot_marks_a_median_past_10x_its_start_as_before(value):
    result = sazo_runs.RaceResult(queries=np.array([0, 10]), gaps={"uniform": np.array([[1.0, value]])},
                                  initial_gap=1.0, target=0.05, to_target={"uniform": [None]})
    marks = [a.text for a in race_widget.race_figure(result).layout.annotations]
    assert (marks == ["uniform MeZO diverged"]) == _course_rule(value, 1.0, sazo_runs.DIVERGE_FACTOR)
    assert marks in ([], ["uniform MeZO diverged"])


def test_race_plot_goes_through_the_shared_rule(monkeypatch):
    spy = _Spy(sazo_runs.gap_limit)
    monkeypatch.setattr(race_widget, "gap_limit", spy)
    result = sazo_runs.RaceResult(queries=np.array([0, 10]), gaps={"uniform": np.array([[1.0, 30.0]])},
                                  initial_gap=1.0, target=0.05, to_target={"uniform": [None]})
    race_widget.race_figure(result)
    assert spy.calls and all(call == (1.0, sazo_runs.DIVERGE_FACTOR) for call in spy.calls)


# -- the race (notebook 05) and MeZO against SGD (notebook 02): only a non-finite gap ------------------------------

@pytest.mark.parametrize("start", [2.0, 0.0, NAN])
def test_race_result_diverged_verdicts_are_unchanged(start):
    values = _values(2.0, 10.0)
    result = sazo_runs.RaceResult(queries=np.array([0, 10]), gaps={"uniform": np.array([[start, v] for v in values])},
                                  initial_gap=start, target=0.1, to_target={"uniform": [None] * len(values)})
    assert result.diverged("uniform") == [_finite_rule(v) for v in values]


def _race_limits(monkeypatch) -> list[float]:
    """The ``diverge_above`` of every run a small race trains."""
    limits, real = [], sazo_runs.lesson_train

    def recorded(*args, **kwargs):
        limits.append(kwargs["diverge_above"])
        return real(*args, **kwargs)

    monkeypatch.setattr(sazo_runs, "lesson_train", recorded)
    sazo_runs.race(sazo_runs.make_problem(num_examples=16, dim=3), samplers=("uniform", "sazo"), seeds=(0,),
                   steps=10, log_every=5)
    return limits


def test_race_runs_train_with_the_same_limit(monkeypatch):
    limits = _race_limits(monkeypatch)
    assert len(limits) == 2
    for limit in limits:
        assert [diverged(v, limit) for v in _values(2.0, 10.0)] == [_finite_rule(v) for v in _values(2.0, 10.0)]


def test_race_goes_through_the_shared_rule(monkeypatch):
    spy = _Spy(divergence_limit)
    monkeypatch.setattr(sazo_runs, "divergence_limit", spy)
    _race_limits(monkeypatch)
    start = sazo_runs.starting_gap(sazo_runs.make_problem(num_examples=16, dim=3))
    assert spy.calls == [(start, sazo_runs.RACE_DIVERGE_FACTOR)]      # once per race, for all its runs
    spy.calls.clear()
    result = sazo_runs.RaceResult(queries=np.array([0, 10]), gaps={"uniform": np.array([[2.0, NAN], [2.0, 1.0]])},
                                  initial_gap=2.0, target=0.1, to_target={"uniform": [None, None]})
    assert result.diverged("uniform") == [True, False]
    assert [factor for _start, factor in spy.calls] == [sazo_runs.RACE_DIVERGE_FACTOR] * 2


def _mezo_stop(monkeypatch, value: float) -> tuple[float, int | None]:
    """(the limit, ``stopped``) of race_mezo_sgd's MeZO run whose stand-in training stopped as diverged after
    logging ``value`` at step 10."""
    limits = []

    def stopped_run(*args, diverge_above, **kwargs):
        limits.append(diverge_above)
        return History(queries=[2 * k for k in range(1, 11)], logged_steps=[10], logged_queries=[20],
                       metrics=[value], diverged=True)

    monkeypatch.setattr(mezo_vs_sgd, "lesson_train", stopped_run)
    runs = mezo_vs_sgd.race_mezo_sgd(sazo_runs.make_problem(num_examples=16, dim=3), steps=10, batch_size=1,
                                     log_every=10, methods=("MeZO",))
    return limits[0], runs["MeZO"]["stopped"]


@pytest.mark.parametrize("value", _values(2.0, 10.0))
def test_mezo_against_sgd_stops_where_it_did(monkeypatch, value):
    """At the log point (10) where the gap is not finite; else at the step after it (a refused loss: 11)."""
    limit, stopped = _mezo_stop(monkeypatch, value)
    assert stopped == (10 if _finite_rule(value) else 11)
    assert diverged(value, limit) == _finite_rule(value)


def test_mezo_against_sgd_goes_through_the_shared_rule(monkeypatch):
    spy = _Spy(sazo_runs.gap_limit)
    monkeypatch.setattr(mezo_vs_sgd, "gap_limit", spy)
    _mezo_stop(monkeypatch, 1.0)
    start = sazo_runs.starting_gap(sazo_runs.make_problem(num_examples=16, dim=3))
    assert spy.calls == [(pytest.approx(start, rel=1e-12), mezo_vs_sgd.MEZO_DIVERGE_FACTOR)]


# -- make bench: benchmarks.queries.TargetRun at 10⁴ × its initial gap ---------------------------------------------

def _bench_limit(monkeypatch, start: float) -> float:
    """The ``diverge_above`` a TargetRun whose initial gap is ``start`` trains with."""
    limits = []

    def no_steps(*args, diverge_above, **kwargs):
        limits.append(diverge_above)
        return History()

    monkeypatch.setattr(bench_queries, "train", no_steps)
    run = bench_queries.TargetRun(LeastSquares(16, 2, seed=0), "uniform", 1e-3, 0, (0.02, 0.005))
    run.initial_gap = start
    run.extend_to(10)
    return limits[0]


@pytest.mark.parametrize("start", [2.0, 0.0, -1e-17, 1e305, INF])
def test_make_bench_limit_gives_the_same_verdicts(monkeypatch, start):
    """A start of 0 (θ₀ already minimises the problem) or just below it by rounding keeps its old verdict: any
    gap above 10⁴ × the start diverged (the course's rule would count only a non-finite one there)."""
    limit = _bench_limit(monkeypatch, start)
    assert [diverged(v, limit) for v in _values(start, 1e4)] == [_bench_rule(v, start) for v in _values(start, 1e4)]


def test_make_bench_refuses_a_nan_initial_gap_as_before():
    run = bench_queries.TargetRun(LeastSquares(16, 2, seed=0), "uniform", 1e-3, 0, (0.02, 0.005))
    run.initial_gap = NAN
    with pytest.raises(ValueError, match="Invalid stop_below: nan"):   # train's check, before any step
        run.extend_to(10)
    assert run.steps == 0 and not run.failed


def test_make_bench_goes_through_the_shared_rule(monkeypatch):
    spy = _Spy(divergence_limit)
    monkeypatch.setattr(bench_queries, "divergence_limit", spy)
    _bench_limit(monkeypatch, 2.0)
    assert spy.calls == [(2.0, bench_queries.DIVERGE_FACTOR)]

"""One counting rule for every race: queries to a target are first hits, and a rate where at least half of
the seeds diverged (``train.past_edge``) is not chosen. The course's race (notebook 05) counted a seed that
reached the target and diverged later as never reaching it, where ``make bench`` and the LLM race keep the
first hit."""
import math

import numpy as np
import pytest

from sazo_lite.course import sazo_runs
from sazo_lite.train import History, past_edge


def test_past_edge_is_at_least_half_of_the_seeds():
    assert not past_edge([False]) and past_edge([True])
    assert not past_edge([True, False, False]) and past_edge([True, True, False])
    assert past_edge([True, False]) and past_edge([True, True, False, False])    # a median of ∞ with misses
    assert not past_edge([True, False, False, False])
    with pytest.raises(ValueError, match="Invalid diverged"):
        past_edge([])


def _reached_then_diverged(problem, method, seed, *, steps, log_every, **_):
    """A run that crosses 5% of the initial gap at its first log point, then stops as diverged."""
    gap0 = problem.gap(problem.initial_theta())
    history = History(logged_steps=[log_every, 2 * log_every], logged_queries=[2 * log_every, 4 * log_every],
                      metrics=[0.01 * gap0, math.inf], diverged=True)
    return history


def test_a_seed_that_reached_the_target_and_diverged_later_keeps_its_first_hit(monkeypatch):
    monkeypatch.setattr(sazo_runs, "_run_one", _reached_then_diverged)
    problem = sazo_runs.make_problem(num_examples=16, dim=3)
    result = sazo_runs.race(problem, samplers=("uniform",), seeds=(0, 1), steps=40, log_every=10)
    assert result.to_target["uniform"] == [20, 20]          # the old rule: [None, None]
    assert result.diverged("uniform") == [True, True]


def _result(to_target, final_gaps):
    gaps = np.array([[1.0, g] for g in final_gaps])
    return sazo_runs.RaceResult(np.array([0.0, 10.0]), {"uniform": gaps}, 1.0, 0.05, {"uniform": to_target})


def test_pick_rate_never_chooses_a_rate_past_the_edge_unless_every_rate_is():
    fast_then_lost = _result([10, 10, 10], [0.01, math.nan, math.nan])    # 2 of 3 seeds diverged after crossing
    slow_and_sound = _result([40, 50, 60], [0.01, 0.02, 0.03])
    assert sazo_runs.pick_rate({0.1: fast_then_lost, 0.01: slow_and_sound}, "uniform") == 0.01
    assert sazo_runs.pick_rate({0.1: fast_then_lost, 0.2: _result([20, 20, 20], [math.nan] * 3)}, "uniform") == 0.1


def test_the_race_table_says_which_median_it_counts():
    """The table's median queries (of first crossings) and the plot's median line's crossing differ (2,320
    against 3,520 in one race): the table says which statistic it shows."""
    from sazo_lite.course.widgets.race import race_table_html

    table = race_table_html(_result([40, 50, 60], [0.01, 0.02, 0.03]))
    assert "first reaches" in table and "median gap at each query" in table

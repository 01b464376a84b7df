"""Round 17: the course modules' tables and maths, given hostile data, against plain references."""
from __future__ import annotations

import copy
import itertools
import math

import pytest

from sazo_lite.course import llm_lesson as lesson


def _diverged_race():
    """The stored race with SAZO's last seed stopped as diverged: θ went non-finite, so its last walk and its
    E[ĝ²] are NaN."""
    race = copy.deepcopy(lesson.load_race())
    run = race.runs["sazo"][-1]
    run["diverged"] = True
    run["walk"][-1] = math.nan
    run["train_loss"][-1] = math.nan
    run["mean_sq_step_scale"] = math.nan
    return race


def test_walk_table_reads_a_diverged_seed_as_above_every_other_in_any_seed_order():
    # statistics.median and min/max read a NaN by where it stood among the seeds: the same race printed another
    # median and range for each order of its seeds
    race = _diverged_race()
    tables = set()
    for order in itertools.permutations(range(len(race.runs["sazo"]))):
        shuffled = copy.copy(race)
        shuffled.runs = {**race.runs, "sazo": [race.runs["sazo"][i] for i in order]}
        row = next(r for r in lesson.walk_table(shuffled).rows if r[0] == "SAZO")
        tables.add(tuple(row[:6]))
    assert len(tables) == 1
    row = tables.pop()
    walks = sorted(r["walk"][-1] for r in race.runs["sazo"][:-1]) + [math.inf]
    median = (walks[len(walks) // 2] if len(walks) % 2 else (walks[len(walks) // 2 - 1] + walks[len(walks) // 2]) / 2)
    assert row[3] == f"{median:.3g} [{walks[0]:.3g}–inf]"
    assert row[2].endswith("–inf]")


@pytest.mark.parametrize("norms, grad_sq", [([1.0, 1.0], 4.0), ([1.0, 3.0], 100.0), ([0.0, 2.0], 1.0 + 1e-6)])
def test_gain_by_hand_refuses_a_full_gradient_longer_than_the_mean_norm(norms, grad_sq):
    # ‖∇F‖ = ‖mean ∇f_i‖ <= mean ‖∇f_i‖: a larger ‖∇F‖² comes from no set of gradients, and the gain was returned as
    # a number near 1 (1.0 and 1.0096 for the first two); minibatches.gain_vs_batch refuses the same input
    from sazo_lite.course.minibatches import gain_vs_batch

    with pytest.raises(ValueError, match="Invalid grad_sq"):
        lesson.gain_by_hand(norms, grad_sq, 2)
    with pytest.raises(ValueError, match="Invalid full_grad_norm"):
        gain_vs_batch(norms, grad_sq ** 0.5, 3, [2])
    mean = sum(norms) / len(norms)
    assert lesson.gain_by_hand(norms, mean ** 2, 2) == pytest.approx(float(gain_vs_batch(norms, mean, 3, [2])[0]))


@pytest.mark.parametrize("seeds, rules, name", [((0, 0, 1), ("plain",), "seeds"),
                                                ((0, 1), ("plain", "plain"), "rules")])
def test_rule_ladder_refuses_a_seed_or_rule_given_twice(seeds, rules, name):
    # a repeated seed counted its run twice in the rule's median (seeds (0, 0, 1): seed 0's mean, not the median of
    # seeds 0 and 1), a repeated rule its runs twice in uniform's; race refuses repeats by the same rule
    from sazo_lite.course import sazo_runs

    problem = sazo_runs.make_problem(num_examples=8, dim=2)
    with pytest.raises(ValueError, match=f"Invalid {name}"):
        sazo_runs.rule_ladder(problem, steps=4, seeds=seeds, rules=rules, log_every=2)
    with pytest.raises(ValueError, match="Invalid seeds"):
        sazo_runs.race(problem, seeds=(1, 1), steps=4, log_every=2)
    table = sazo_runs.rule_ladder(problem, steps=4, seeds=sorted(set(seeds)), rules=tuple(dict.fromkeys(rules)),
                                  log_every=2)
    assert set(table) == {*rules, "uniform"}

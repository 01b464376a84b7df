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

"""Headless tests of the four lesson pictures (notebooks 03–05): set controls, check what is drawn."""
from __future__ import annotations

import re

import numpy as np
import pytest

pytest.importorskip("plotly")
pytest.importorskip("anywidget")

from sazo_lite.course import sazo_runs as E  # noqa: E402
from sazo_lite.course import widgets  # noqa: E402


def _number(text: str, pattern: str) -> float:
    return float(re.search(pattern, text).group(1))


def test_norms_histogram_widens_with_sigma():
    dash = widgets.norms_histogram_dashboard(num_examples=256, dim=6)
    narrow = np.std(np.asarray(dash.figures["histogram"].data[0].x, dtype=float))
    gain = _number(dash.readout.value, r"1 \+ CV² = <b>([0-9.]+)")
    dash.controls["sigma"].value = 2.5
    wide = np.std(np.asarray(dash.figures["histogram"].data[0].x, dtype=float))
    assert wide > narrow + 0.3
    assert _number(dash.readout.value, r"1 \+ CV² = <b>([0-9.]+)") > gain
    dash.controls["sigma"].value = 0.0
    assert _number(dash.readout.value, r"1 \+ CV² = <b>([0-9.]+)") < gain


def test_batch_bars_split_the_second_moment():
    dash = widgets.batch_bars_dashboard(num_examples=128, dim=6)
    bars = dash.figures["bars"].data
    assert min(bars[0].y) > 0 and min(bars[1].y) > 0      # the default B = 8 shows both parts
    dash.controls["batch_size"].value = 1
    # B = 1: only the p-dependent part; the oracle's is the smallest possible V(p).
    assert list(bars[1].y) == [0.0, 0.0] and bars[0].y[1] < bars[0].y[0]
    ratio_b1 = _number(dash.readout.value, r"uniform / oracle = <b>([0-9.]+)")
    dash.controls["batch_size"].value = 64
    sampled, common = np.asarray(bars[0].y), np.asarray(bars[1].y)
    assert common[0] == pytest.approx(common[1]) and common[0] > 0   # the same for every p
    assert sampled[1] < sampled[0]
    assert _number(dash.readout.value, r"uniform / oracle = <b>([0-9.]+)") < ratio_b1


def test_chi2_ema_narrows_with_beta_and_observations():
    dash = widgets.chi2_dashboard(examples=4000)
    spread = lambda: float(np.var(np.asarray(dash.figures["histogram"].data[1].x, dtype=float)))
    single = np.asarray(dash.figures["histogram"].data[0].x, dtype=float)
    assert np.mean(single) == pytest.approx(1.0, abs=0.1) and np.var(single) == pytest.approx(2.0, rel=0.2)
    at_09 = spread()
    dash.controls["ema_decay"].value = 0.0
    assert spread() == pytest.approx(2.0, rel=0.2)          # β = 0: the last d² alone
    dash.controls["ema_decay"].value = 0.99
    dash.controls["observations"].value = 200
    assert spread() < at_09 / 2


def test_ema_of_chi2_matches_its_limit():
    values = E.ema_of_chi2(20_000, observations=300, ema_decay=0.8)
    assert np.var(values) / np.mean(values) ** 2 == pytest.approx(2 * 0.2 / 1.8, rel=0.15)
    with pytest.raises(ValueError, match="ema_decay"):
        E.ema_of_chi2(10, observations=1, ema_decay=1.0)


def test_paths_start_together_and_only_sazo_follows_beta():
    dash = widgets.paths_dashboard(steps=30)
    data = dash.figures["paths"].data
    before = [np.asarray(data[k].x, dtype=float) for k in (1, 2, 3)]
    assert all(len(x) == 31 and x[0] == 0.0 for x in before)   # θ₀ = 0, one point per step
    dash.controls["ema_decay"].value = 0.0
    after = [np.asarray(data[k].x, dtype=float) for k in (1, 2, 3)]
    np.testing.assert_array_equal(after[0], before[0])
    np.testing.assert_array_equal(after[2], before[2])
    assert not np.array_equal(after[1], before[1])
    dash.controls["ema_decay"].value = 0.99               # the default plain rule: β acts at the high end too
    assert not np.array_equal(np.asarray(data[2].x, dtype=float), before[1])
    dash.controls["batch_size"].value = 8
    assert not np.array_equal(np.asarray(data[1].x, dtype=float), after[0])


def test_loss_grid_is_the_full_loss():
    import torch
    problem = E.make_problem(num_examples=16, dim=2)
    grid = E.loss_grid(problem, [0.0, 1.0], [0.0, 0.5, 1.0])
    assert grid.shape == (3, 2)
    assert grid[1, 1] == pytest.approx(problem.full_loss(torch.tensor([1.0, 0.5], dtype=torch.float64)))
    with pytest.raises(ValueError, match="dim"):
        E.loss_grid(E.make_problem(num_examples=8, dim=3), [0.0], [0.0])

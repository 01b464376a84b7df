"""Round 17: the dashboards' figures and readouts against what they draw and compute."""
from __future__ import annotations

import math
import re

import numpy as np
import pytest
import torch

pytest.importorskip("ipywidgets")

from sazo_lite.course import widgets  # noqa: E402


def _text(html: str) -> str:
    return re.sub(r"<[^>]+>", "", html)


def _plotly_density(trace) -> tuple[np.ndarray, np.ndarray]:
    """(left edges, heights) plotly.js draws for a histogram with histnorm="probability density" and explicit
    xbins: bins start, start + size, … below end; each count ÷ (the draws inside the bins × size) (plotly.js
    histogram/calc.js: its total adds only the points findBin puts in a bin)."""
    assert trace.histnorm == "probability density"
    x = np.asarray(trace.x, dtype=float)
    start, end, size = float(trace.xbins.start), float(trace.xbins.end), float(trace.xbins.size)
    nbins = int(math.ceil((end - size / 1e6 - start) / size))
    k = np.floor((x - start) / size)
    inside = (k >= 0) & (k < nbins)
    counts = np.bincount(k[inside].astype(int), minlength=nbins)
    return start + size * np.arange(nbins), counts / (inside.sum() * size)


def _chi2_cdf(x):
    return np.vectorize(lambda v: math.erf(math.sqrt(v / 2)))(x)   # χ²₁: P(z² ≤ x) = erf(√(x/2))


def test_chi2_histograms_draw_the_density_of_all_draws():
    # the bins ended at the axis' 5, and plotly divides by the draws inside them: χ²₁'s 97.5% below 5 was drawn as
    # all of it, every bar 2.6% above the density (the shown mass below 5 was 1.000, χ²₁'s is 0.975)
    board = widgets.chi2_dashboard(examples=200_000)
    board.controls["ema_decay"].value = 0.0           # the EMA is then the last δ²: χ²₁ too
    fig = board.figures["histogram"]
    for trace in fig.data[:2]:
        left, height = _plotly_density(trace)
        x = np.asarray(trace.x, dtype=float)
        size = float(trace.xbins.size)
        shown = left < 5.0 - 1e-9
        assert float((height[shown] * size).sum()) == pytest.approx(float(np.mean(x < 5.0)), abs=1e-9)
        assert float((height[shown] * size).sum()) == pytest.approx(float(_chi2_cdf(5.0)), abs=0.004)
        mid = (left >= 0.5 - 1e-9) & shown                  # against the analytic density, bin by bin, summed
        analytic = (_chi2_cdf(left[mid] + size) - _chi2_cdf(left[mid])).sum()
        assert float((height[mid] * size).sum()) / analytic == pytest.approx(1.0, abs=0.01)
    assert list(fig.layout.xaxis.range) == [0, 5]          # the axis still shows 0–5


def test_chi2_histograms_keep_every_draw_at_every_preset():
    board = widgets.chi2_dashboard(examples=2000)
    for values in ({"ema_decay": 0.0, "observations": 1}, {"ema_decay": 0.995, "observations": 200},
                   {"ema_decay": 0.9, "observations": 1}):
        for name, value in values.items():
            board.controls[name].value = value
        for trace in board.figures["histogram"].data[:2]:
            x = np.asarray(trace.x, dtype=float)
            assert np.isfinite(x).all() and x.max() < float(trace.xbins.end) - float(trace.xbins.size) / 1e6
            assert x.min() >= float(trace.xbins.start)


@pytest.mark.parametrize("dims, q, perturbation", [((1, 2, 4), 1, "gaussian"), ((1, 4, 16), 2, "gaussian"),
                                                    ((8, 16), 3, "gaussian"), ((1, 2, 4), 1, "rademacher")])
def test_dimension_readout_names_every_d_it_says_is_as_noisy_as_the_gradient(dims, q, perturbation):
    # with d = 1 drawn, "at every d ≥ 2" left out d = 1, where the Gaussian error (d + 1)/q is 2 at q = 1
    board = widgets.dimension_dashboard(dims, directions_drawn=32)
    board.controls["perturbation"].value = perturbation
    board.controls["q"].value = q
    said = _text(board.readout.value)
    every = re.search(r"at every d (?:drawn \(d )?≥ (\d+)", said)
    once = re.search(r"once d ≈ (\d+)", said)
    assert (every is None) != (once is None), said
    theory = {d: (d + 1 if perturbation == "gaussian" else d - 1) / q for d in dims}
    if every:   # every drawn d from the one named on has an error at least the gradient's, and none is left out
        low = int(every.group(1))
        assert low == min(dims) and all(theory[d] >= 1 for d in dims if d >= low)
    else:       # where (d ± 1)/q = 1 is past the smallest d drawn, whose error is below the gradient's
        assert theory[min(dims)] < 1 and (int(once.group(1)) + (1 if perturbation == "gaussian" else -1)) / q == 1


@pytest.mark.parametrize("rule, beta", [("prior", 0.9), ("prior", 0.3), ("blend", 0.3), ("robust", 0.4)])
def test_decay_note_reads_the_decay_the_run_applies_after_its_first_step(rule, beta):
    # the note asked a fresh sampler, which has seen nothing, so an unseen example's first update had no prior
    # (decay 0): "+ prior" with β = 0.9, whose every update after the first step uses β (c = β/(1−β)), read "β is
    # the decay in use for 48% of the examples"
    from sazo_lite.course.sazo_runs import make_problem, rule_sampler, run_sazo_trace
    from sazo_lite.course.widgets.sazo import decay_note

    trace = run_sazo_trace(make_problem(num_examples=128, dim=10), rule=rule, steps=40, log_every=5, ema_decay=beta,
                           batch_size=8)
    index = next(k for k, counts in enumerate(trace.counts) if counts.any() and not counts.all())
    counts = trace.counts[index]
    sampler = rule_sampler(rule, 128, ema_decay=beta)
    rows = np.arange(40) % 128                    # a run's sampler once it has observed examples
    sampler.update(torch.as_tensor(rows), torch.ones(40))
    applied = float(np.mean(sampler.decay(counts) >= beta))
    note = decay_note(trace, beta, index)
    if applied == 1.0:
        assert "every update uses β" in note, note
    else:
        assert f"for {applied:.0%} of the examples" in note, note
    assert "every update uses β" not in decay_note(trace, beta, 0) or beta == 0.0   # the first step: no prior yet


def test_detector_precision_shares_the_places_at_a_tied_score():
    # torch.argsort gave the places at a tied k-th score to the lowest indices: with every score equal (SAZO's
    # unseen examples share one prior score) flagged [0, 1] read precision 1 at k = 2, and 0 with the order reversed
    from sazo_lite.course.widgets.llm import detector_precision

    assert detector_precision([1.0, 1.0, 1.0, 1.0], [0, 1], 2) == pytest.approx(0.5)
    assert detector_precision([1.0, 1.0, 1.0, 1.0], [2, 3], 2) == pytest.approx(0.5)
    assert detector_precision([5.0, 2.0, 2.0, 2.0, 0.0], [0, 3], 2) == pytest.approx((1 + 1 / 3) / 2)


def test_detector_precision_does_not_depend_on_the_examples_order():
    from sazo_lite.course.widgets.llm import detector_precision

    rng = np.random.default_rng(0)
    for _ in range(200):
        n = int(rng.integers(1, 12))
        scores = rng.integers(0, 4, n).astype(float)        # few values: many ties
        flagged = [i for i in range(n) if rng.random() < 0.4]
        k = int(rng.integers(1, n + 1))
        perm = rng.permutation(n)                            # example perm[j] becomes example j
        where = {int(old): new for new, old in enumerate(perm)}
        shuffled = detector_precision(scores[perm], [where[i] for i in flagged], k)
        assert detector_precision(scores, flagged, k) == pytest.approx(shuffled)
        ranked = np.argsort(-scores, kind="stable")         # without ties at the k-th score: the plain count
        if k == n or scores[ranked[k - 1]] != scores[ranked[k]]:
            assert detector_precision(scores, flagged, k) == pytest.approx(np.isin(ranked[:k], flagged).mean())


def _held_bands(runs, stop):
    """Per query of the runs' union: the median and min of F/F₀ over seeds, a seed that ended (not diverged) at or
    below ``stop`` held at its last value, one diverged counted as +inf, one out of budget left out."""
    import statistics

    grid = sorted({q for r in runs for q in r["queries"]})
    medians, lows = [], []
    for q in grid:
        row = []
        for r in runs:
            at = dict(zip(r["queries"], r["train_loss"]))
            last = r["train_loss"][-1] / r["train_loss"][0]
            if q in at:
                row.append(at[q] / r["train_loss"][0])
            elif r.get("diverged"):
                row.append(math.inf)
            elif last <= stop:
                row.append(last)
        medians.append(statistics.median(row))
        lows.append(min(row))
    return grid, medians, lows


def test_the_race_figure_keeps_a_seed_that_stopped_at_the_deepest_target():
    # a race's runs stop once they reach its deepest target (query_run's stop_fraction); the figure left such a seed
    # out after its stop, so the median and the band lost the best seeds: the stored race's SAZO median read 0.509 at
    # 5,800 queries (0.462 with them) and its band's bottom jumped from 0.386 to 0.462
    from sazo_lite.course import llm_lesson as lesson
    from sazo_lite.course.widgets._common import SAMPLER_LABELS
    from sazo_lite.course.widgets.llm_lesson import race_figure

    race = lesson.load_race()
    fig = race_figure(race)
    for k, runs in race.runs.items():
        grid, medians, lows = _held_bands(runs, min(race.targets))
        at = next(j for j, t in enumerate(fig.data) if t.mode == "lines" and t.name.startswith(SAMPLER_LABELS[k] + ","))
        line, band = fig.data[at], fig.data[at - 1]              # each sampler's band, then its median line
        assert list(line.x) == grid and band.fill == "toself"
        assert [v is None for v in line.y] == [not m < 1.5 for m in medians]
        assert [v for v in line.y if v is not None] == pytest.approx([m for m in medians if m < 1.5])
        assert list(band.y)[len(grid):][::-1] == pytest.approx([min(v, 1.5) for v in lows])


def test_loss_bands_keep_a_seed_that_stopped_below_the_lowest_target():
    from sazo_lite.course.widgets.llm import loss_bands

    runs = [{"queries": [0, 10, 20, 30], "train_loss": [1.0, 0.8, 0.6, 0.5], "diverged": False},
            {"queries": [0, 10, 20], "train_loss": [2.0, 1.2, 0.7], "diverged": False},      # stopped at 0.35 ≤ 0.5
            {"queries": [0, 10, 20, 30], "train_loss": [1.0, 0.9, 0.8, 0.7], "diverged": False}]
    median = list(loss_bands({"uniform": runs}).data[-1].y)
    assert median == pytest.approx([1.0, 0.8, 0.6, 0.5])        # at 30: median(0.5, 0.35, 0.7), not (0.5, 0.7)
    short = [runs[0], {"queries": [0, 10], "train_loss": [1.0, 0.9], "diverged": False}]   # out of budget: left out
    assert list(loss_bands({"uniform": short}).data[-1].y)[2:] == pytest.approx([0.6, 0.5])


def test_gain_figure_refuses_a_gradient_ratio_no_set_of_gradients_has():
    # ‖∇F‖²/V(p*) = ‖mean ∇f_i‖² / (mean ‖∇f_i‖)² is at most 1; (2, 5) was drawn as a gain line near 1 without a word
    from sazo_lite.course.widgets.llm_lesson import gain_figure

    with pytest.raises(ValueError, match="Invalid ‖∇F‖²/V\\(p\\*\\) of 'a'"):
        gain_figure({"a": (2.0, 5.0)})
    assert list(gain_figure({"a": (2.0, 1.0)}, (1, 2)).data[0].y) == pytest.approx([2.0, 1.5])


def test_runs_by_rate_and_the_run_tables_refuse_a_seed_given_twice():
    # the same part twice (or two parts holding one cell's seed) pooled every run twice: each median over seeds
    # counted them twice, and loss_bands said "median, 2 seeds" of one run
    from sazo_lite.course.widgets.llm import best_cells, loss_bands, queries_table_html, runs_by_rate

    part = {"grid": {"uniform": {"0.001": [{"seed": 0, "queries": [0, 8], "train_loss": [1.0, 0.9]}],
                                 "0.002": [{"seed": 1, "queries": [0, 8], "train_loss": [1.0, 0.7]}]}}}
    other = {"grid": {"uniform": {"0.001": [{"seed": 1, "queries": [0, 8], "train_loss": [1.0, 0.5]}]}}}
    with pytest.raises(ValueError, match="Invalid settings: 'uniform η=0.001'"):
        runs_by_rate([part, part])
    runs = runs_by_rate([part, other])                      # one cell's seeds split between two parts: pooled
    assert [r["seed"] for r in runs["uniform η=0.001"]] == [0, 1]
    assert list(loss_bands({"u": runs["uniform η=0.001"]}).data[-1].y) == pytest.approx([1.0, 0.7])
    twice = runs["uniform η=0.001"][:1] * 2                   # one run given twice to the figures and tables
    for draw in (loss_bands, queries_table_html):
        with pytest.raises(ValueError, match="Invalid runs_by_sampler: 'u'"):
            draw({"u": twice})
    with pytest.raises(ValueError, match="Invalid runs_by_label"):
        best_cells({"uniform η=0.001": twice}, 0.5)

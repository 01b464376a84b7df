"""The language-model figures (data in, figures out)."""
import os
from pathlib import Path

os.environ["HF_HUB_OFFLINE"] = "1"

import pytest
import torch

pytest.importorskip("transformers")
pytest.importorskip("plotly")

# -- figures of recorded language-model runs (data in, figures out) --------------------------
from sazo_lite.course.widgets.llm import (detector_precision, diagnostics_figure, loss_bands, probs_vs_oracle, queries_table_html)


def _run(queries, losses, acc=None, diverged=False):
    return {"queries": queries, "train_loss": losses, "test_accuracy": acc, "diverged": diverged}


def test_loss_bands_normalise_by_the_start_and_span_the_seeds():
    runs = {"sazo": [_run([0, 10, 20], [2.0, 1.0, 0.5]), _run([0, 10, 20], [4.0, 3.0, 1.0])]}
    fig = loss_bands(runs)
    band, median = fig.data[0], fig.data[1]
    assert list(median.x) == [0, 10, 20] and list(median.y) == pytest.approx([1.0, 0.625, 0.25])
    assert max(band.y) == pytest.approx(1.0) and min(band.y) == pytest.approx(0.25)


def test_runs_by_rate_pools_report_parts_and_each_sampler_keeps_its_colour():
    from sazo_lite.course.widgets.llm import runs_by_rate

    part_a = {"grid": {"uniform": {"0.00035": [_run([0, 8], [1.0, 0.9])], "0.000495": [_run([0, 8], [1.0, 1.2])]}}}
    part_b = {"grid": {"uniform": {"0.00035": [_run([0, 8], [1.0, 0.7])]}, "sazo+rule": {"0.00035": [_run([0, 8], [1.0, 0.8])]}}}
    runs = runs_by_rate([part_a, part_b])
    assert {k: len(v) for k, v in runs.items()} == {"uniform η=0.00035": 2, "uniform η=0.000495": 1,
                                                    "sazo+rule η=0.00035": 1}
    lines = [t for t in loss_bands(runs).data if t.mode == "lines"]
    colours = [t.line.color for t in lines]
    assert colours[0] == colours[1] != colours[2]                   # one sampler, one colour (the palette's) ...
    assert lines[0].line.dash != lines[1].line.dash                 # ... its rates told apart by dashes
    assert list(lines[0].y) == pytest.approx([1.0, 0.8])            # the two seeds' median


def test_queries_table_reports_median_range_misses_and_divergence():
    runs = {"uniform": [_run([0, 10, 20], [1.0, 0.6, 0.4], 0.5), _run([0, 10, 20], [1.0, 0.9, 0.8], 0.7),
                        _run([0, 10], [1.0, 2.0], None, diverged=True)],
            "oracle": [_run([0, 10], [1.0, 0.3], 0.9)]}
    table = queries_table_html(runs)
    # one of three seeds reached: a miss counts as never, so the median is "not reached"
    assert "not reached (2 of 3 missed)" in table and "10 [10–10] (2 of 3 missed)" not in table
    assert "3 (1 diverged)" in table and "0.600" in table and "10 [10–10]</td><td>10 [10–10]" in table


def test_detector_precision_counts_flagged_among_the_top_k():
    scores = torch.tensor([0.1, 0.9, 0.8, 0.2, 0.7])
    assert detector_precision(scores, [1, 2], 2) == 1.0
    assert detector_precision(-scores, [1, 2], 2) == 0.0      # the reversed ranking finds none
    assert detector_precision(scores, [1, 2], 4) == 0.5


def test_diagnostics_and_probability_figures_carry_the_data():
    d = [{"queries": 0, "rho": 0.1, "tv": 0.4, "v_ratio": 3.0, "v_uniform_ratio": 3.0},
         {"queries": 8, "rho": 0.8, "tv": 0.1, "v_ratio": 1.2, "v_uniform_ratio": 2.5}]
    fig = diagnostics_figure(d)
    assert list(fig.data[0].y) == [0.1, 0.8] and list(fig.data[2].y) == [3.0, 1.2]
    bars = probs_vs_oracle([0.25, 0.75], [0.5, 0.5])
    assert list(bars.data[0].y) == [0.5, 1.5] and list(bars.data[1].y) == [1.0, 1.0]


# -- issue 28: the walk, the stale oracle, the gain against B, the live race ----------------------------
def test_walk_and_staleness_figures_draw_the_recorded_runs():
    from sazo_lite.course.widgets.llm import WALK_BAND, staleness_figure, walk_figure

    runs = {"uniform": [{"queries": [0, 10, 20], "walk": [0.0, 8.0, 25.0], "diverged": True},
                        {"queries": [0, 10], "walk": [0.0, 5.0], "diverged": False}]}
    fig = walk_figure(runs)
    assert [list(t.y) for t in fig.data if t.mode == "lines"] == [[0.0, 8.0, 25.0], [0.0, 5.0]]
    assert [list(t.y) for t in fig.data if t.mode == "markers"] == [[25.0]]        # the diverged run's end
    assert fig.layout.shapes[0].y0 == WALK_BAND[0] and fig.layout.shapes[0].y1 == WALK_BAND[1]
    stale = staleness_figure({"k=25": [{"staleness": [{"step": 25, "v_stale_ratio": 39.0, "v_uniform_ratio": 1.6}]}]})
    assert list(stale.data[0].y) == [39.0] and list(stale.data[1].y) == [1.6] and stale.layout.yaxis.type == "log"


def test_queries_table_counts_a_miss_as_never_in_the_median():
    table = queries_table_html({"uniform": [_run([0, 10], [1.0, 0.4]), _run([0, 10], [1.0, 0.9]),
                                            _run([0, 10], [1.0, 0.9])]}, targets=(0.5,))
    assert "not reached" in table          # 1 of 3 reached: the median is "never", not the one hit


def test_a_stored_report_is_found_from_a_copy_below_the_checkout_and_this_machines_run_comes_first(tmp_path):
    from sazo_lite.course import benchmark_report

    (tmp_path / "benchmarks" / "reference").mkdir(parents=True)
    copy = tmp_path / "build" / "executed"          # where make test and the book run the notebooks
    copy.mkdir(parents=True)
    assert benchmark_report("r.json", start=copy) is None
    (tmp_path / "benchmarks" / "reference" / "r.json").write_text("{}")
    assert benchmark_report("r.json", start=copy) == (tmp_path / "benchmarks" / "reference" / "r.json",
                                                      "the reference run in git")
    (tmp_path / "benchmarks" / "results").mkdir()
    (tmp_path / "benchmarks" / "results" / "r.json").write_text("{}")
    assert benchmark_report("r.json", start=copy)[1] == "this machine's latest run"
    assert benchmark_report("r.json", start=tmp_path.parent) is None   # above the checkout: nothing


def test_notebook_06_finds_the_reference_reports_from_the_checkout():
    from sazo_lite.course import benchmark_report

    root = Path(__file__).resolve().parents[1]
    for name in ("llm_queries.json", "llm_opposed_pilot.json"):
        path, _ = benchmark_report(name, start=root / "build" / "executed")
        assert path.parent.parent == root / "benchmarks" and path.name == name


def test_a_run_summary_reads_its_targets_end_walk_and_noise_and_flags_divergence():
    from sazo_lite.course.widgets.llm import run_summary

    run = {"queries": [0, 8, 16, 24], "train_loss": [2.0, 1.5, 0.9, 1.2], "walk": [0.0, 3.0, 5.0, 7.5],
           "diverged": False, "mean_sq_step_scale": 12.34, "max_step_scale": None}
    line = run_summary("sazo η=3.5e-4", run, targets=(0.7, 0.5, 0.3))
    assert line.startswith("sazo η=3.5e-4  0.7·F₀ at 16, 0.5·F₀ at 16, 0.3·F₀ not reached;")
    assert "F/F₀ 0.600 after 24 queries; walk 7.5; E[ĝ²] 12.3; max |ĝ| –" in line and "DIVERGED" not in line
    assert "(DIVERGED)" in run_summary("x", {**run, "diverged": True})


def test_fewest_queries_takes_each_samplers_best_rate_and_leaves_out_misses():
    from sazo_lite.course.widgets.llm import fewest_queries

    runs = {"uniform η=2.5e-4": [_run([0, 40, 80], [1.0, 0.6, 0.45])], "uniform η=3.5e-4": [_run([0, 40], [1.0, 0.5])],
            "sazo η=3.5e-4": [_run([0, 40, 80], [1.0, 0.8, 0.6])], "oracle η=1.4e-3": [_run([0, 20], [1.0, 0.4])],
            "sazo+rule η=3.5e-4": [_run([0, 24], [1.0, 0.5])]}
    assert fewest_queries(runs, 0.5) == {"uniform": 40, "oracle": 20, "sazo+rule": 24}
    assert fewest_queries(runs, 0.1) == {}
    # over seeds, the one grid rule: the best median, a miss counting as never
    seeds = {"sazo η=1e-3": [_run([0, 8], [1.0, 0.4]), _run([0, 8], [1.0, 0.9]), _run([0, 8], [1.0, 0.9])],
             "sazo η=5e-4": [_run([0, 16], [1.0, 0.4]), _run([0, 16], [1.0, 0.5]), _run([0, 16], [1.0, 0.9])]}
    assert fewest_queries(seeds, 0.5) == {"sazo": 16}


def test_queries_table_reads_accuracy_after_the_fixed_budget_where_the_runs_measured_one():
    runs = {"uniform": [{**_run([0, 10, 20], [1.0, 0.6, 0.4], 0.9), "budget_accuracy": a, "budget_queries": 10}
                        for a in (0.25, 0.75)]}
    table = queries_table_html(runs)
    assert "0.500" in table and "0.900" not in table and "after 10 queries" in table
    assert "after" not in queries_table_html({"uniform": [_run([0, 10], [1.0, 0.4], 0.9)]})

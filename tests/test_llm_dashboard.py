"""Notebook 06's dashboard, built headless on the default tiny model."""
import os

os.environ["HF_HUB_OFFLINE"] = "1"

import pytest
import torch

pytest.importorskip("transformers")
pytest.importorskip("plotly")

from sazo_lite.llm import make_task
from sazo_lite.widgets import llm_dashboard, top_sampled_rows
from sazo_lite.widgets.llm import accuracy_summary_html


def test_top_sampled_rows_are_sorted_by_draws_and_mark_flipped_labels():
    task = make_task("sentiment", num_train=10, num_test=2, noise=0.2, seed=3)
    counts = torch.arange(10, dtype=torch.float64)
    counts[task.noisy_indices] += 100  # the flipped examples were drawn most
    rows = top_sampled_rows(task, counts, torch.full((10,), 0.1), k=4)
    assert rows["draws"] == sorted(rows["draws"], reverse=True)
    assert set(rows["index"][:2]) == set(task.noisy_indices) and rows["flipped?"][:2] == ["FLIPPED"] * 2
    assert rows["text"][0] == task.train[rows["index"][0]].prompt.replace("\n", " ⏎ ")
    with pytest.raises(ValueError, match="counts"):
        top_sampled_rows(task, counts[:3], torch.full((10,), 0.1))


def test_accuracy_summary_names_each_method():
    text = accuracy_summary_html(0.5, {"mezo": 0.625, "sazo": 0.75}, 96)
    assert "50.0%" in text and "62.5%" in text and "75.0%" in text and "96 queries" in text


def test_dashboard_runs_both_methods_and_batch_size_changes_the_query_axis():
    board = llm_dashboard(steps=4, log_every=2)
    loss, sampling, table = board.figures["loss"], board.figures["sampling"], board.figures["table"]
    assert list(loss.data[0].x) == [0, 32, 64] and list(loss.data[1].x) == [0, 32, 64]  # B=8 default
    n = len(sampling.data[0].y)
    assert sum(sampling.data[0].y) == pytest.approx(n) and len(set(sampling.data[0].y)) > 1
    draws = list(table.data[0].cells.values[1])
    assert draws == sorted(draws, reverse=True) and draws[0] >= 1
    board.controls["batch_size"].value = 4
    board.controls["run"].click()
    assert list(loss.data[1].x) == [0, 16, 32]
    assert board.results["sazo"].sample_counts.sum().item() == 16  # 4 steps × B=4 draws
    assert "zero-shot" in board.readout.value and "SAZO" in board.readout.value
    before = list(loss.data[1].y)
    board.controls["eps"].value = 1e-1  # a different ε gives different runs
    board.controls["run"].click()
    assert list(loss.data[1].y) != before and list(loss.data[1].y)[0] == before[0]  # same start

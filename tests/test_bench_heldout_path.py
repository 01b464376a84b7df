"""benchmarks.llm_heldout_path: the tracer measures at the steps it names, leaves the run as it was, and its
summary reads the budgets and progress bands from the runs (a tiny model, no download)."""
from __future__ import annotations

from types import SimpleNamespace

import pytest

pytest.importorskip("transformers")

from benchmarks.llm_heldout_path import at_budget, summarise, trace
from sazo_lite.llm.finetune import restore_snapshot, snapshot
from sazo_lite.llm.queries import query_run
from sazo_lite.llm.topblock import TopBlocks

from test_llm_round9 import batch
from test_llm_topblock import lora_top


def tiny_start():
    model, params = lora_top("llama")
    return model, params, TopBlocks(model, batch(6)), TopBlocks(model, batch(4, seed=1)), \
        SimpleNamespace(assimilated=[0, 1, 2, 3], new=[4, 5])


def test_the_tracer_measures_every_n_steps_and_leaves_the_run_and_theta_as_they_were():
    start = tiny_start()
    model, params, train, test, _ = start
    theta0 = snapshot(params)
    out = trace(start, "sazo", lr=0.05, seed=2, steps=9, every=3, batch_size=2)
    assert [p["step"] for p in out["points"]] == [0, 3, 6, 9]
    assert [p["queries"] for p in out["points"]] == [0, 12, 24, 36]       # 2 passes × B = 2 per step
    assert all(a.equal(b) for a, b in zip(snapshot(params), theta0))      # θ restored
    plain = query_run(model, params, train, "sazo", lr=0.05, seed=2, batch_size=2, steps=9, log_every=3,
                      oracle_every=5, walk_bound=30.0)
    # the tracer's F at a step is the plain run's logged F there: measuring changed nothing
    assert [p["F"] for p in out["points"]] == pytest.approx(plain.train_loss, rel=1e-6)
    restore_snapshot(params, theta0)
    first = out["points"][0]
    assert first["test_accuracy"] == pytest.approx(test.accuracy()) and 0 <= first["second_label_share"] <= 1
    groups = (4 * first["F_assimilated"] + 2 * first["F_new"]) / 6
    assert groups == pytest.approx(first["F"], rel=1e-5)


def test_the_summary_takes_each_budget_where_measured_and_skips_stopped_runs(capsys):
    point = lambda q, f, acc: {"queries": q, "F": f, "test_accuracy": acc, "test_loss": 1.0, "second_label_share": 0.5}
    runs = [{"sampler": "uniform", "points": [point(0, 1.0, 0.2), point(8000, 0.95, 0.25)]},
            {"sampler": "sazo", "points": [point(0, 1.0, 0.2)]}]       # stopped before 8,000 queries
    assert at_budget(runs[0], 8000)["test_accuracy"] == 0.25 and at_budget(runs[1], 8000) is None
    summarise({"runs": runs})
    printed = capsys.readouterr().out
    assert "8000 uniform  n=1: acc 0.250" in printed and "8000 sazo     n=0: acc –" in printed
    assert "F/F₀ in [0.9, 1.01): uniform n=2 acc 0.225" in printed and "sazo n=1 acc 0.200" in printed


def test_the_summary_prints_each_samplers_difference_from_uniform_with_its_interval(capsys):
    from sazo_lite.train import mean_difference_interval

    point = lambda q, acc, loss: {"queries": q, "F": 1.0, "test_accuracy": acc, "test_loss": loss, "second_label_share": 0.5}
    accs = {"uniform": [0.2, 0.3, 0.25], "sazo": [0.5, 0.4]}
    runs = [{"sampler": name, "points": [point(8000, acc, 2.0 - acc)]} for name, values in accs.items() for acc in values]
    summarise({"runs": runs})
    printed = capsys.readouterr().out
    difference, half = mean_difference_interval(accs["sazo"], accs["uniform"])
    assert f"8000 sazo     n=2: acc 0.450 ± 0.098 | loss 1.550 ± 0.098" in printed
    assert f"− uniform: acc {difference:+.3f} ± {half:.3f}, loss {-difference:+.3f} ± {half:.3f}" in printed
    assert "8000 uniform  n=3: acc 0.250 ± 0.057" in printed and "uniform  n=3: acc 0.250 ± 0.057 | − uniform" not in printed

"""Leftovers of red-team round 10 on the language-model layer and the course layer: each test of a fix failed on
the code before it. Full-model losses of a model whose rotary frequencies stretch with the batch's width (no
word: an example's loss moved with its batch), an empty prompt named as token ids, the families benchmark's
list, and course helpers given an edge input (a dimension of 1, an initial gap of 0, no runs)."""
from __future__ import annotations

import re
import warnings

import numpy as np
import pytest
import torch

pytest.importorskip("transformers")

from test_llm_round10 import ROPE, batch, family, word_tokenizer  # noqa: E402

from sazo_lite.llm.losses import TokenBatch, answer_losses, classification_losses, encode_classification  # noqa: E402
from sazo_lite.llm.topblock import TopBlocks, top_block_parameters  # noqa: E402


# --- 1. rotary frequencies that depend on the batch's width, in the full-model losses ----------------------
def _rotary_warnings(call) -> list[str]:
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        call()
    return [str(w.message) for w in caught if "rotary" in str(w.message)]


@pytest.mark.parametrize("kind", sorted(ROPE))
def test_full_model_losses_warn_once_a_model_when_the_batch_makes_its_rotary_frequencies_batch_dependent(kind):
    name, extra = ROPE[kind]
    model = family(name, **extra)
    long = batch(6, long=20)
    assert _rotary_warnings(lambda: classification_losses(model, long, [0, 1])) == []   # 8 tokens: the limit
    short = TokenBatch([[5, 6, 7], [8, 9, 10, 11, 12, 13, 14]], [3, 7], 0, torch.tensor([0, 1]), torch.tensor([5, 9]))
    assert _rotary_warnings(lambda: classification_losses(model, short)) == []          # within the limit: silent
    seen = _rotary_warnings(lambda: classification_losses(model, long))                 # 20 tokens: was silent
    assert len(seen) == 1, seen
    assert re.search(f"classification_losses: this batch is padded to 20 tokens, past the 8 .*{kind}", seen[0]), seen
    assert "max_length <= 8" in seen[0]
    alone = torch.cat([classification_losses(model, long, [i]) for i in range(6)])
    assert (alone - classification_losses(model, long)).abs().max() > 1e-6      # what the warning is about
    assert _rotary_warnings(lambda: classification_losses(model, long)) == []      # once a model
    top_block_parameters(model, 1)
    with pytest.raises(ValueError, match=f"Invalid batch: its longest example has 20 tokens, past the 8 .*{kind}"):
        TopBlocks(model, long, blocks=1)             # the same rule refuses the split there
    other = family(name, **extra)
    answers = TokenBatch([r + [4, 5] for r in long.ids], [len(r) for r in long.ids], 0)
    seen = _rotary_warnings(lambda: answer_losses(other, answers))
    assert len(seen) == 1 and seen[0].startswith("answer_losses: this batch is padded to 22 tokens"), seen


def test_a_batch_of_exactly_the_limit_after_a_longer_one_keeps_dynamic_frequencies_and_is_caught():
    """transformers resets "dynamic" frequencies only for a batch shorter than the limit: one of exactly 8 tokens
    after a longer forward kept the stretched ones (its losses moved by 1e-5), and the rule let 8 pass."""
    name, extra = ROPE["dynamic"]
    model = family(name, **extra)
    top_block_parameters(model, 1)
    eight = TokenBatch([[5, 6, 7, 8, 9, 10, 11, 12], [5, 6, 7]], [8, 3], 0, torch.tensor([0, 1]), torch.tensor([5, 9]))
    fresh = classification_losses(model, eight)
    with torch.no_grad():
        model(input_ids=torch.full((1, 20), 5))              # the model's own forward: stretched to 20 tokens
    seen = _rotary_warnings(lambda: classification_losses(model, eight))
    assert len(seen) == 1 and "padded to 8 tokens, the 8 at which" in seen[0] and "max_length <= 7" in seen[0], seen
    assert (classification_losses(model, eight) - fresh).abs().max() > 1e-6      # what it is about
    with pytest.raises(ValueError, match="Invalid batch: its longest example has 8 tokens, the 8 at which .*dynamic"):
        TopBlocks(model, eight, blocks=1)                     # its first forward (example 0, 8 tokens) kept them too
    classification_losses(model, eight, [1])                  # 3 tokens: transformers resets them
    assert torch.allclose(classification_losses(model, eight), fresh, atol=1e-7, rtol=0)
    assert torch.allclose(TopBlocks(model, eight, blocks=1)([0, 1]), fresh, atol=1e-5, rtol=0)


def test_a_model_without_width_dependent_rotary_frequencies_gets_no_warning():
    model = family("Llama")
    long = batch(6, long=20)
    assert _rotary_warnings(lambda: classification_losses(model, long)) == []
    top_block_parameters(model, 1)
    assert TopBlocks(model, long, blocks=1)([0]).shape == (1,)


# --- 2. an empty prompt ------------------------------------------------------------------------------------
def test_an_empty_prompt_is_named_as_a_prompt_not_as_token_ids():
    tok = word_tokenizer(eos_token="c")
    with pytest.raises(ValueError, match=re.escape("Invalid prompts: example 1 ('') has no tokens")):
        encode_classification(tok, ["a", ""], [0, 1], ["yes", "no"])     # was "Invalid ids: example 1 is []"
    assert encode_classification(tok, ["a", "b a"], [0, 1], ["yes", "no"]).ids == [[1], [2, 1]]


# --- 3. the families benchmark ----------------------------------------------------------------------------
NEW_FAMILIES = {"Olmoe": "equal", "GraniteMoe": "equal", "Phimoe": "equal", "FalconH1": "equal",
                "Gemma3nText": "refused"}


def test_the_families_benchmark_lists_the_families_round_10_verified_and_builds_each_tiny(capsys, monkeypatch):
    from benchmarks import llm_families

    assert set(NEW_FAMILIES) <= set(llm_families.FAMILIES)          # were not probed
    monkeypatch.setattr(llm_families, "probe", lambda family, blocks: {"outcome": NEW_FAMILIES[family], "gap": None,
                                                                       "error": ""})
    llm_families.main(["--families", *NEW_FAMILIES])                 # the command line takes their names
    assert "families: 4 equal, 1 refused, 0 crashed, 0 no model" in capsys.readouterr().out
    monkeypatch.undo()
    for family in NEW_FAMILIES:                                       # tiny and runnable with this transformers
        model = llm_families.tiny_model(family)
        assert model is not None, family
        assert sum(p.numel() for p in model.parameters()) < 200_000, family
    assert llm_families.probe("Gemma3nText", 1)["outcome"] == "refused"     # not "no model": the mode refuses it


# --- 4. course helpers at an edge ----------------------------------------------------------------------------
def test_dimension_dashboard_marks_the_exact_zero_of_rademacher_at_d_1_instead_of_dropping_it_off_the_log_axis():
    """At d = 1 a ±1 direction is exact (z zᵀa = a): the (d−1)/q line was 0, which a log axis drops without a
    word, and the Monte-Carlo dot at q = 3 was 2e-32 (rounding of a mean of three a's), 30 decades down."""
    pytest.importorskip("ipywidgets")
    from sazo_lite.course import widgets as sw

    board = sw.dimension_dashboard(dims=(1, 2, 4), directions_drawn=64)
    board.controls["q"].value = 3
    board.controls["perturbation"].value = "rademacher"
    figure = board.figures["variance"]
    drawn = [y for trace in figure.data[:2] for y in trace.y if y is not None]
    assert drawn and min(drawn) > 1e-6, drawn                  # nothing plotted at 0 or at a rounding error
    assert figure.data[0].y[0] is None and figure.data[1].y[0] is None
    marks = [a for a in figure.layout.annotations if "0" in a.text]
    assert len(marks) == 1 and marks[0].x == 0.0 and marks[0].yref == "paper", marks     # at d = 1 (log10 1 = 0)
    assert "d = 1 a ±1 direction gives the gradient exactly" in board.readout.value, board.readout.value
    board.controls["perturbation"].value = "gaussian"          # (d+1)/q > 0 everywhere: no mark
    assert not figure.layout.annotations and None not in figure.data[1].y
    assert "exactly" not in board.readout.value


def _race_from_the_optimum():
    from sazo_lite.course.sazo_runs import RaceResult

    q, zero = np.array([0.0, 20.0, 40.0]), np.zeros((1, 3))
    return RaceResult(q, {"uniform": zero, "sazo": zero}, 0.0, 0.0, {"uniform": [0], "sazo": [0]})


def test_race_table_and_verdict_of_a_race_with_an_initial_gap_of_0_say_so_instead_of_dividing_by_it():
    pytest.importorskip("ipywidgets")
    from sazo_lite.course.widgets import race as race_widgets

    result = _race_from_the_optimum()
    table = re.sub(r"<[^>]+>", " ", race_widgets.race_table_html(result))          # was a ZeroDivisionError
    assert "Queries to reach a gap of 0 (the initial gap is 0: θ₀ is already a minimiser)" in table, table
    assert "1.00×" in table                                     # both at the target at θ₀: no speed-up either way
    assert result.speedup("sazo") == 1.0                        # was 0/0
    assert "the initial gap is 0" in race_widgets.race_verdict(result)
    with pytest.raises(ValueError, match="Invalid result: initial_gap 0.0"):
        race_widgets.race_figure(result)                        # gaps as fractions of 0: nothing to plot
    from dataclasses import replace

    usual = replace(result, initial_gap=1.0, target=0.1, gaps={m: np.array([[1.0, 0.5, 0.05]]) for m in result.gaps},
                    to_target={"uniform": [40], "sazo": [20]})
    assert "Queries to reach 10% of the initial gap" in re.sub(r"<[^>]+>", " ", race_widgets.race_table_html(usual))


def test_a_race_of_a_problem_that_starts_at_its_optimum_is_refused_before_any_run():
    from sazo_lite.course import problems, sazo_runs

    problem = problems.LeastSquares(8, 2, seed=0)
    at_optimum = type("AtOptimum", (), {"__getattr__": lambda self, name: getattr(problem, name),
                                        "gap": lambda self, theta: 0.0})()
    with pytest.raises(ValueError, match="Invalid problem: its initial gap"):
        sazo_runs.race(at_optimum, seeds=(0,), steps=4, log_every=2)
    assert sazo_runs.race(problem, seeds=(0,), steps=4, log_every=2).initial_gap > 0


@pytest.mark.parametrize("call, name", [
    (lambda llm: llm.runs_by_rate([]), "settings"),                                   # was {} without a word
    (lambda llm: llm.runs_by_rate([{"grid": {"uniform": {}}}]), "settings"),          # {}
    (lambda llm: llm.runs_by_rate([{"grid": {"uniform": {"0.1": []}}}]), "settings"),  # a cell of no runs
    (lambda llm: llm.best_cells({}, 0.5), "runs_by_label"),                           # {}
    (lambda llm: llm.best_cells({"uniform η=1": []}, 0.5), "runs_by_label"),          # StatisticsError
    (lambda llm: llm.fewest_queries({}, 0.5), "runs_by_label"),                       # {}
    (lambda llm: llm.run_summary("x", {"queries": [0, 4], "train_loss": [1.0, 0.5], "walk": [0, 1]}, targets=()),
     "targets"),                                                                       # 'x  ; F/F₀ ...'
])
def test_the_llm_record_helpers_refuse_empty_input(call, name):
    pytest.importorskip("plotly")
    from sazo_lite.course.widgets import llm

    with pytest.raises(ValueError, match=f"Invalid {name}"):
        call(llm)


def test_the_llm_record_helpers_still_take_one_run():
    pytest.importorskip("plotly")
    from sazo_lite.course.widgets import llm

    run = {"queries": [0, 4], "train_loss": [1.0, 0.4], "walk": [0, 1]}
    by_rate = llm.runs_by_rate([{"grid": {"uniform": {"0.1": run}}}])
    assert by_rate == {"uniform η=0.1": [run]}
    assert llm.best_cells(by_rate, 0.5) == {"uniform": "uniform η=0.1"}
    assert llm.run_summary("x", run, targets=[0.5]).startswith("x  0.5·F₀ at 4;")

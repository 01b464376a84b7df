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

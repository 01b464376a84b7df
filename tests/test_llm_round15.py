"""Round 15 of the language-model package's defects (sazo_lite.llm): each test fails on the code before its fix."""
from __future__ import annotations

import contextlib

import pytest
import torch

pytest.importorskip("transformers")
pytest.importorskip("peft")

from sazo_lite.llm import tiny_causal_lm
from sazo_lite.llm.continual import cached_first_round, first_round, make_continual_set
from sazo_lite.llm.finetune import snapshot, zo_finetune
from sazo_lite.llm.queries import query_run
from sazo_lite.llm.topblock import TopBlocks

from test_llm_round10 import word_tokenizer            # a tokenizer built in memory
from test_llm_round9 import VOCAB, batch               # the same tiny batches
from test_llm_round14 import adapted                   # LoRA on every layer of a tiny Llama, B ≠ 0
from test_llm_topblock import lora_top                 # LoRA on a tiny model's top block


# --- 1. adapters the forward does not read (merged, disabled): a run "trained" them with every δ = 0 ------------
@contextlib.contextmanager
def merged(model):
    model.merge_adapter()
    try:
        yield
    finally:
        model.unmerge_adapter()


@pytest.mark.parametrize("state", [merged, lambda model: model.disable_adapter()])
def test_runs_refuse_adapters_the_forward_does_not_read(state):
    model, params = adapted()
    data = batch(4)
    start = snapshot(params)
    with state(model):
        # the forward ran the base weights alone: F stayed at F(θ₀) and the walk counted moves that changed nothing
        with pytest.raises(ValueError, match="Invalid params: 8 of 8 .*adapter weights the model's forward does not "
                                             "read"):
            query_run(model, params, data, "uniform", lr=1e-2, steps=2, log_every=1)
        with pytest.raises(ValueError, match="Invalid params: .*does not read"):
            zo_finetune(model, params, data, steps=2, progress=False)
        assert all(torch.equal(p, s) for p, s in zip(params, start))
    run = query_run(model, params, data, "uniform", lr=1e-2, steps=2, log_every=1)    # read again: it runs
    assert run.train_loss[-1] != run.train_loss[0]


def test_one_merged_layer_is_enough_to_refuse_and_names_the_first_unread_tensor():
    model, params = adapted()
    lora_layers = [m for m in model.modules() if hasattr(m, "merged_adapters")]
    lora_layers[-1].merge()                  # the last adapted Linear: its A and B are the last two tensors
    with pytest.raises(ValueError, match=r"Invalid params: 2 of 8 tensors \(e.g. params\[6\]\)"):
        query_run(model, params, batch(4), "uniform", lr=1e-2, steps=1)
    lora_layers[-1].unmerge()
    query_run(model, params, batch(4), "uniform", lr=1e-2, steps=1)


def test_top_blocks_refuse_merged_adapters():
    model, params = lora_top("llama")
    top = TopBlocks(model, batch(5, seed=1))
    top.check_params(params)
    with merged(model):
        with pytest.raises(ValueError, match="Invalid params: .*does not read"):
            top.check_params(params)
        with pytest.raises(ValueError, match="Invalid params: .*does not read"):
            query_run(None, params, top, "uniform", lr=1e-2, steps=1)


def test_a_cached_first_round_is_not_restored_into_merged_adapters(tmp_path, monkeypatch):
    # the cached round went into A and B, which the merged layers do not read, and was reported used
    monkeypatch.setenv("SAZO_CACHE", str(tmp_path))
    model, params = adapted()
    cset, tokenizer = make_continual_set("continual", num_train=4, num_test=2), word_tokenizer(eos_token="c")
    assert cached_first_round(model, params, cset, tokenizer, key="k", steps=1, progress=False) is False
    start = snapshot(params)
    with torch.no_grad():
        for p in params:
            p.zero_()
    with merged(model):
        with pytest.raises(ValueError, match="Invalid params: .*does not read"):
            cached_first_round(model, params, cset, tokenizer, key="k", steps=1, progress=False)
        with pytest.raises(ValueError, match="Invalid params: .*does not read"):
            first_round(model, params, cset, tokenizer, steps=1)
        assert all(bool((p == 0).all()) for p in params)
    assert cached_first_round(model, params, cset, tokenizer, key="k", steps=1, progress=False) is True
    assert all(torch.equal(p, s) for p, s in zip(params, start))


def test_a_model_without_adapters_is_unaffected():
    model = tiny_causal_lm("llama", vocab_size=VOCAB, seed=1)
    params = [model.lm_head.weight]
    run = query_run(model, params, batch(4), "uniform", lr=1e-2, steps=1, log_every=1)
    assert len(run.train_loss) == 2

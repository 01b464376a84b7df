"""Round 8 red team of the language-model part (sazo_lite.llm): each test failed on the code before its fix.
TokenBatch's rows, prompt lengths, labels and label words; ids past the vocabulary; the encoders' max_length
and labels; true norms of a head tied to the embedding and of fractional indices; restore_snapshot;
TopBlocks after a dtype move; query_run's and the walk rules' settings; add_lora's alpha and layers."""
from __future__ import annotations

import numpy as np
import pytest
import torch

pytest.importorskip("transformers")
pytest.importorskip("peft")

from sazo_lite.llm import add_lora, snapshot, restore_snapshot, tiny_causal_lm, top_layers, trainable_parameters
from sazo_lite.llm.grad_norms import grad_norms, linear_grad_norms, linear_modules_for, loop_grad_norms
from sazo_lite.llm.losses import (TokenBatch, answer_losses, classification_losses, encode_answers,
                                  encode_classification)
from sazo_lite.llm.queries import StepCap, WalkBound, WalkPull, query_run
from sazo_lite.llm.topblock import TopBlocks

VOCAB = 64


def batch(lengths=(4, 6, 5, 7, 3), seed=0, prompt_short=0) -> TokenBatch:
    g = torch.Generator().manual_seed(seed)
    ids = [torch.randint(3, VOCAB, (k,), generator=g).tolist() for k in lengths]
    return TokenBatch(ids, [len(r) - prompt_short for r in ids], 0,
                      torch.randint(0, 2, (len(ids),), generator=g), torch.tensor([5, 9]))


class CharTokenizer:
    """One token a character (no download)."""
    pad_token_id, eos_token_id = 0, 2

    def __call__(self, text, add_special_tokens=False):
        return {"input_ids": [3 + ord(c) % 50 for c in text]}


# --- TokenBatch: what each loss would have scored wrongly, refused at construction ---------------------
@pytest.mark.parametrize("ids, prompt_lengths", [
    ([[], [4, 5, 6]], [0, 3]),          # an empty row: its answer slot was position −1 (a padding position)
    ([[3.7, 4.2], [4, 5, 6]], [2, 3]),  # float ids were truncated to 3, 4
    ([[True, False], [4, 5, 6]], [2, 3]),
    ([[3, -4], [4, 5, 6]], [2, 3]),
    ([[3, 4], [4, 5, 6]], [2]),         # one prompt length for two examples
    ([[3, 4], [4, 5, 6]], [5, 3]),      # past its row: answer loss 0 without a word
    ([[3, 4], [4, 5, 6]], [-1, 3]),     # negative: every token scored
    (["ab", [4, 5, 6]], [2, 3]),
])
def test_token_batch_refuses_rows_and_prompt_lengths_that_would_be_scored_wrongly(ids, prompt_lengths):
    with pytest.raises(ValueError, match="Invalid (ids|prompt_lengths)"):
        TokenBatch(ids, prompt_lengths, 0, torch.tensor([0, 1]), torch.tensor([5, 9]))


@pytest.mark.parametrize("labels, label_ids", [
    (torch.tensor([0, 2]), torch.tensor([5, 9])),       # class 2 of 2
    (torch.tensor([0, -1]), torch.tensor([5, 9])),
    (torch.tensor([0.0, 1.0]), torch.tensor([5, 9])),
    (torch.tensor([0]), torch.tensor([5, 9])),          # one label for two examples
    (torch.tensor([0, 1]), torch.tensor([5, -1])),      # −1 read the vocabulary's last word
    (torch.tensor([0, 1]), torch.tensor([5, 5])),       # two classes of one word: every loss log 2
])
def test_token_batch_refuses_labels_and_label_words_that_would_be_scored_wrongly(labels, label_ids):
    with pytest.raises(ValueError, match="Invalid (labels|label_ids)"):
        TokenBatch([[3, 4], [4, 5, 6]], [2, 3], 0, labels, label_ids)


def test_a_valid_token_batch_scores_as_before_and_takes_lists_and_tensor_rows():
    model = tiny_causal_lm("llama", vocab_size=VOCAB)
    plain = TokenBatch([[3, 4], [4, 5, 6]], [2, 3], 0, torch.tensor([0, 1]), torch.tensor([5, 9]))
    other = TokenBatch([torch.tensor([3, 4]), (4, 5, 6)], [2, 3], 0, [0, 1], [5, 9])
    assert torch.equal(classification_losses(model, plain), classification_losses(model, other))
    assert plain.max_id == 9


def test_ids_past_the_vocabulary_raise_a_value_error_not_an_index_error():
    model = tiny_causal_lm("llama", vocab_size=VOCAB)
    for bad in (TokenBatch([[3, VOCAB]], [2], 0, torch.tensor([0]), torch.tensor([5, 9])),
                TokenBatch([[3], [4, 5]], [1, 2], VOCAB + 5, torch.tensor([0, 1]), torch.tensor([5, 9])),
                TokenBatch([[3, 4]], [2], 0, torch.tensor([0]), torch.tensor([5, VOCAB]))):
        with pytest.raises(ValueError, match="Invalid batch: token id .* vocabulary of 64"):
            classification_losses(model, bad)
    with pytest.raises(ValueError, match="vocabulary"):
        answer_losses(model, TokenBatch([[3, VOCAB + 1]], [1], 0))


def test_classification_of_a_batch_without_labels_says_so():
    model = tiny_causal_lm("llama", vocab_size=VOCAB)
    with pytest.raises(ValueError, match="Invalid batch: no labels"):
        classification_losses(model, TokenBatch([[3, 4]], [2], 0))
    with pytest.raises(ValueError, match="Invalid batch: no label_ids"):
        classification_losses(model, TokenBatch([[3, 4]], [2], 0, torch.tensor([0])))


def test_encoders_refuse_a_max_length_that_keeps_the_wrong_tokens_and_fractional_labels():
    tok, words = CharTokenizer(), ["x", "y"]
    assert encode_classification(tok, ["abcdef"], [1], words, max_length=2).ids == [[3 + ord(c) % 50 for c in "ef"]]
    for bad in (0, -2, 2.5):          # [-0:] kept the whole prompt, [2:] dropped its start
        with pytest.raises(ValueError, match="Invalid max_length"):
            encode_classification(tok, ["abcdef"], [0], words, max_length=bad)
    with pytest.raises(ValueError, match="Invalid max_length"):
        encode_answers(tok, ["abcdef"], ["xyz"], max_length=0)
    for labels in ([0.7, 1], [[0], [1]], torch.tensor([0.7, 1.0])):      # 0.7 became class 0
        with pytest.raises(ValueError, match="Invalid labels"):
            encode_classification(tok, ["ab", "cd"], labels, words)
    with pytest.raises(ValueError, match="Invalid prompts: example 0 .* has no tokens"):   # an empty prompt: nothing to score at
        encode_classification(tok, ["", "ab"], [0, 1], words)
    assert len(encode_classification(tok, [], [], words)) == 0


# --- true per-example norms ----------------------------------------------------------------------------
def test_norms_of_a_head_tied_to_the_embedding_count_both_uses():
    model = tiny_causal_lm("gpt2", vocab_size=VOCAB)
    head = model.get_output_embeddings().weight
    assert head is model.get_input_embeddings().weight
    for p in model.parameters():
        p.requires_grad_(False)
    head.requires_grad_(True)
    b = batch()
    reference = grad_norms(model, b, [head], method="loop")
    assert linear_modules_for(model, [head]) is None         # the hooks see the head's part alone
    assert torch.allclose(grad_norms(model, b, [head]), reference, rtol=1e-5, atol=0)


def test_a_linear_called_twice_in_one_forward_is_refused_by_the_batched_norms():
    torch.manual_seed(0)
    layer = torch.nn.Linear(3, 3)
    x = torch.randn(4, 3)
    losses = lambda idx: layer(torch.tanh(layer(x[idx]))).pow(2).sum(1)
    assert loop_grad_norms(losses, list(layer.parameters()), range(4)).min() > 0
    with pytest.raises(ValueError, match="runs twice"):          # the first call's x and g were dropped
        linear_grad_norms(layer, losses, list(layer.parameters()), range(4))


def test_norms_refuse_fractional_indices_and_a_zero_chunk():
    base = tiny_causal_lm("llama", vocab_size=VOCAB)
    model = add_lora(base, rank=2, layers=top_layers(base, 1))
    params, b = trainable_parameters(model), batch()
    for method in ("auto", "loop", "linear"):
        with pytest.raises(ValueError, match="Invalid indices"):     # 1.5 measured example 1
            grad_norms(model, b, params, indices=[1.5], method=method)
    with pytest.raises(ValueError, match="Invalid indices"):
        TopBlocks(model, b).grad_norms(params, [1.5], method="loop")
    with pytest.raises(ValueError, match="Invalid chunk"):
        grad_norms(model, b, params, chunk=0)
    assert len(grad_norms(model, b, params, indices=[])) == 0
    assert torch.equal(grad_norms(model, b, params, indices=torch.tensor([2, 2])),
                       grad_norms(model, b, params, indices=[2, 2]))


# --- snapshots -----------------------------------------------------------------------------------------
def test_restore_snapshot_refuses_a_snapshot_of_other_tensors_and_changes_nothing():
    a, c = torch.zeros(3), torch.zeros(2)
    for saved in ([torch.ones(3)], [torch.ones(1), torch.ones(2)], [torch.ones(3), torch.ones(3)]):
        with pytest.raises(ValueError, match="Invalid saved"):
            restore_snapshot([a, c], saved)
        assert a.abs().sum() == 0 and c.abs().sum() == 0
    restore_snapshot([a, c], snapshot([torch.ones(3), torch.ones(2)]))
    assert a.sum() == 3 and c.sum() == 2


# --- TopBlocks after the model moved -------------------------------------------------------------------
def test_top_blocks_refuse_a_model_moved_to_another_dtype_and_follow_it_back():
    base = tiny_causal_lm("gpt2", vocab_size=VOCAB, seed=1)
    model = add_lora(base, rank=2, layers=top_layers(base, 1))
    b = batch()
    top = TopBlocks(model, b)
    model.to(torch.float64)             # float32 → float64 → float32 is exact: the cache stays right
    with pytest.raises(ValueError, match="construct TopBlocks again"):
        top([0, 1])
    model.to(torch.float32)
    with torch.no_grad():               # a top-block weight changed after the cache: followed
        top.layers[0].mlp.c_fc.weight.mul_(1.5)
    assert torch.allclose(top([4, 0, 2]), classification_losses(model, b, [4, 0, 2]), atol=1e-5, rtol=0)


# --- query_run and the walk rules ----------------------------------------------------------------------
@pytest.mark.parametrize("settings", [
    dict(accuracy_at=1.7), dict(accuracy_at=True), dict(accuracy_at="12"), dict(diagnose=0.5), dict(diagnose=-1),
    dict(stop_fraction=-1.0), dict(stop_fraction=0.0), dict(diverge_factor=-1.0), dict(diverge_factor=float("nan")),
    dict(test_batch=[1, 2]), dict(walk_pull=1e4), dict(walk_bound=True),
])
def test_query_run_refuses_bad_settings_before_theta_moves(settings):
    model = add_lora(tiny_causal_lm("llama", vocab_size=VOCAB), rank=2)
    params = trainable_parameters(model)
    with torch.no_grad():
        for p in params:
            p.add_(0.1)
    b = batch(lengths=(6,) * 6)
    before = snapshot(params)
    kwargs = dict(lr=1e-3, steps=4, log_every=2, test_batch=b)
    kwargs.update(settings)
    name = next(iter(settings))     # each under query_run's own name (walk_bound was WalkBound's "radius")
    with pytest.raises(ValueError, match=f"Invalid {name}"):        # diverge_factor=nan was "diverge_above"
        query_run(model, params, b, "uniform", **kwargs)
    assert all(torch.equal(p, s) for p, s in zip(params, before))


def test_walk_rules_refuse_bools_and_strings():
    theta = torch.zeros(2)
    for make in (lambda v: WalkBound([theta], v), lambda v: WalkPull([theta], v), lambda v: StepCap(v)):
        for bad in (True, "2"):         # float() read them as 1.0 and 2.0
            with pytest.raises(ValueError, match="Invalid"):
                make(bad)


def test_add_lora_refuses_an_alpha_that_silences_the_adapters_and_fractional_layers():
    for alpha in (0, -1, float("nan"), True):
        with pytest.raises(ValueError, match="Invalid alpha"):
            add_lora(tiny_causal_lm("llama", vocab_size=VOCAB), rank=2, alpha=alpha)
    for layers in ([1.7], [True]):      # int() adapted layer 1
        with pytest.raises(ValueError, match="Invalid layers"):
            add_lora(tiny_causal_lm("llama", vocab_size=VOCAB), rank=2, layers=layers)
    model = add_lora(tiny_causal_lm("llama", vocab_size=VOCAB), rank=2, alpha=8.0, layers=[1])
    assert model.peft_config["default"].layers_to_transform == [1]


def test_norms_of_tensors_the_losses_do_not_depend_on_are_refused_with_a_reason_every_method():
    base = tiny_causal_lm("llama", vocab_size=64, seed=1)
    model = add_lora(base, rank=2, layers=top_layers(base, 1))
    params = trainable_parameters(model)
    with torch.no_grad():
        for p in params:
            p.add_(0.3 * torch.randn_like(p))
    ids = [[5, 6, 7, 8], [9, 10, 11], [12, 13, 14, 15]]
    batch = TokenBatch(ids, [len(r) for r in ids], 0, torch.tensor([0, 1, 0]), torch.tensor([3, 4]))
    assert (grad_norms(model, batch, params) > 0).all()
    model.merge_adapter()                         # the adapters' product now lives in the base weights
    for method in ("auto", "loop", "linear"):
        with pytest.raises(ValueError, match="do not depend on them"):
            grad_norms(model, batch, params, method=method)


def test_queries_to_refuses_a_target_that_is_not_a_positive_number():
    from sazo_lite.llm.queries import queries_to

    run = {"queries": [0, 8, 16], "train_loss": [1.0, 0.6, 0.4]}
    assert queries_to(run, 0.5) == 16 and queries_to(run, np.float32(0.7)) == 8
    for bad in (None, "0.5", True, 0.0, -0.5, float("nan")):
        with pytest.raises(ValueError, match="Invalid fraction"):
            queries_to(run, bad)

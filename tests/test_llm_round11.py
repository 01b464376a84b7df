"""Round 11 red team of the language-model part (sazo_lite.llm): each test of a fix failed on the code before it.
Falcon's Linear subclass (exact x Wᵀ + b) took the slow exact loop for its true norms; transformers' default
mixture-of-experts kernel takes no float64 (a bare RuntimeError); Gemma 3n's stacked hidden states were refused
by an IndexError that did not say why."""
from __future__ import annotations

import importlib

import pytest
import torch

pytest.importorskip("transformers")
pytest.importorskip("peft")

from sazo_lite.llm import add_lora, tiny_causal_lm, trainable_parameters
from sazo_lite.llm.grad_norms import grad_norms, linear_grad_norms, linear_modules_for, loop_grad_norms
from sazo_lite.llm.losses import TokenBatch, accuracy, answer_losses, classification_losses, predict
from sazo_lite.llm.topblock import TopBlocks, decoder_layers, top_block_parameters, top_layers

grad_norms_module = importlib.import_module("sazo_lite.llm.grad_norms")     # the package exports a function of that name

from test_llm_round10 import VOCAB, batch, family, jiggle   # the same tiny families and batches


def tune_only(model, params) -> list[torch.Tensor]:
    for p in model.parameters():
        p.requires_grad_(False)
    for p in params:
        p.requires_grad_(True)
    return params


# --- 1. true norms of Linear subclasses that compute x Wᵀ + b (Falcon) --------------------------------------
def test_falcons_linear_weights_get_their_true_norms_from_the_batched_hooks_not_the_loop(monkeypatch):
    model = family("Falcon")
    top = decoder_layers(model)[2]
    params = tune_only(model, [m.weight for m in top.modules() if isinstance(m, torch.nn.Linear)])
    assert {type(m).__name__ for m in top.modules() if isinstance(m, torch.nn.Linear)} == {"FalconLinear"}
    jiggle(params)
    data = batch(5)
    losses = lambda idx: classification_losses(model, data, list(idx), grad=True)
    exact = loop_grad_norms(losses, params, range(5))
    assert torch.allclose(linear_grad_norms(model, losses, params, range(5)), exact, rtol=1e-5)  # was a ValueError
    assert linear_modules_for(model, params) is None                 # the strict form is unchanged
    monkeypatch.setattr(grad_norms_module, "loop_grad_norms", lambda *a, **k: pytest.fail("took the exact loop"))
    assert torch.allclose(grad_norms(model, data, params), exact, rtol=1e-5)
    assert torch.allclose(TopBlocks(model, data, blocks=1).grad_norms(params), exact, rtol=1e-5)


class Scaled(torch.nn.Linear):
    """A Linear subclass with a forward of its own that is not x Wᵀ + b (y = 1.5·(x Wᵀ + b))."""

    def forward(self, x):
        return 1.5 * super().forward(x)


class Plain(torch.nn.Linear):
    """A Linear subclass whose forward is x Wᵀ + b written out (as Falcon's)."""

    def forward(self, x):
        return x @ self.weight.T + self.bias


@pytest.mark.parametrize("cls, splits", [(Scaled, False), (Plain, True)])
def test_a_linear_subclass_is_split_only_where_its_output_is_x_w_plus_b(cls, splits):
    net = torch.nn.Sequential(cls(4, 6), torch.nn.Tanh(), torch.nn.Linear(6, 1))
    x = torch.randn(5, 3, 4, generator=torch.Generator().manual_seed(2))
    losses = lambda idx: net(x[list(idx)]).pow(2).sum((1, 2))
    params = list(net[0].parameters())
    exact = loop_grad_norms(losses, params, range(5))
    if splits:
        assert torch.allclose(linear_grad_norms(net, losses, params, range(5)), exact, rtol=1e-6)
    else:
        with pytest.raises(ValueError, match="Invalid params: a Linear subclass .*Scaled.* nn.Linear's y = x Wᵀ \\+ b"):
            linear_grad_norms(net, losses, params, range(5))


# --- 2. mixture-of-experts layers in float64 ---------------------------------------------------------------
MOE = {"Mixtral": dict(num_local_experts=4, num_experts_per_tok=2), "Qwen3Moe": dict(num_experts=4, num_experts_per_tok=2)}


@pytest.mark.parametrize("name", sorted(MOE))
def test_transformers_grouped_experts_in_float64_are_a_value_error_that_says_how_to_run_them(name):
    model = family(name, torch.float64, **MOE[name])
    data = batch()
    with pytest.raises(ValueError, match="Invalid model: .*'grouped_mm'.*set_experts_implementation\\('eager'\\)"):
        classification_losses(model, data)          # was torch's "Expected mat_a to be Float32, ... got Double"
    top_block_parameters(model, 2)
    with pytest.raises(ValueError, match="set_experts_implementation"):
        TopBlocks(model, data, blocks=2)
    model.set_experts_implementation("eager")
    adapted = add_lora(model, rank=2, layers=top_layers(model, 2),
                       target_modules=["q_proj", "v_proj"])
    jiggle(trainable_parameters(adapted))
    top = TopBlocks(adapted, data, blocks=2)
    indices = [5, 0, 3, 3]
    assert torch.allclose(top(indices), classification_losses(adapted, data, indices), atol=1e-5, rtol=0)


def test_load_causal_lm_in_float64_runs_a_mixtral_saved_to_a_folder(tmp_path):
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    from sazo_lite.llm import load_causal_lm

    inner = Tokenizer(models.WordLevel({"[UNK]": 0, "a": 1, "b": 2, "yes": 5, "no": 9}, unk_token="[UNK]"))
    inner.pre_tokenizer = pre_tokenizers.Whitespace()
    PreTrainedTokenizerFast(tokenizer_object=inner, unk_token="[UNK]", pad_token="[UNK]").save_pretrained(tmp_path)
    family("Mixtral", **MOE["Mixtral"]).save_pretrained(tmp_path)
    model, _ = load_causal_lm(tmp_path, dtype=torch.float64, device="cpu")
    assert next(model.parameters()).dtype == torch.float64
    assert model.config._experts_implementation == "eager"
    assert classification_losses(model, batch()).shape == (6,)       # was the float64 RuntimeError


# --- 3. Gemma 3n: streams stacked ahead of the batch -------------------------------------------------------
def test_gemma_3ns_stacked_hidden_states_are_refused_saying_so_not_by_an_index_error():
    model = family("Gemma3nText", head_dim=8, vocab_size_per_layer_input=64, hidden_size_per_layer_input=8,
                   laurel_rank=4, num_kv_shared_layers=1, activation_sparsity_pattern=[0.0] * 3,
                   layer_types=["sliding_attention", "full_attention", "full_attention"])
    data = batch(4)        # as many examples as AltUp streams: the first dimension alone does not tell them apart
    assert classification_losses(model, data).shape == (4,)
    width = data.longest
    for blocks in (1, 3):
        top_block_parameters(model, blocks)
        with pytest.raises(ValueError, match=rf"hidden states of shape \(4, 4, {width}, 32\) for 4 examples, not "
                                             r"batch-first \[4, T, H\]"):
            TopBlocks(model, data, blocks=blocks)      # was "cannot be run on cached activations (IndexError: ...)"


# --- 4. a step between the last block and the head outside the blocks' owner (BERT-style prediction heads) -----
ENCODERS = {"Bert": dict(is_decoder=True), "Electra": dict(is_decoder=True, embedding_size=16),
            "Ernie": dict(is_decoder=True), "RoFormer": dict(is_decoder=True, embedding_size=32)}


@pytest.mark.parametrize("name", sorted(ENCODERS))
def test_a_prediction_transform_beside_the_head_runs_on_the_cache_too(name):
    data = batch(6)
    for blocks in (1, 2):
        model = family(name, **ENCODERS[name])
        params = top_block_parameters(model, blocks)
        jiggle(params)
        top = TopBlocks(model, data, blocks=blocks)     # was refused: its transform (dense, act, norm) was not run
        assert any("transform" in n or "generator_predictions" in n for n, m in model.named_modules()
                   if any(m is a for a in top.after))
        indices = [5, 0, 3, 3]
        assert torch.allclose(top(indices), classification_losses(model, data, indices), atol=1e-5, rtol=0)


def test_a_head_whose_submodules_run_around_code_of_its_own_stays_refused():
    model = family("Roberta", is_decoder=True)      # lm_head: dense, gelu (a function, no module), layer_norm, decoder
    top_block_parameters(model, 1)
    with pytest.raises(ValueError, match="top-block losses differ from its full forward's"):
        TopBlocks(model, batch(6), blocks=1)


# --- 5. an empty data set ---------------------------------------------------------------------------------
def test_an_empty_batch_is_named_as_such_by_every_loss_and_by_predict():
    model = tiny_causal_lm("llama", vocab_size=VOCAB)
    empty = TokenBatch([], [], 0, torch.zeros(0, dtype=torch.long), torch.tensor([5, 9]))
    for call in (lambda: predict(model, empty), lambda: accuracy(model, empty),      # were torch.cat's message
                 lambda: classification_losses(model, empty), lambda: answer_losses(model, TokenBatch([], [], 0)),
                 lambda: TopBlocks(model, empty, blocks=1)):
        with pytest.raises(ValueError, match="^Invalid batch: no examples$"):
            call()
    with pytest.raises(ValueError, match="Invalid indices"):       # an empty selection of a batch that has examples
        classification_losses(model, batch(2), [])


# --- 6. half precision: states kept in float32 between blocks -----------------------------------------------
@pytest.mark.parametrize("name, dtype", [("Mamba", torch.bfloat16), ("FalconMamba", torch.float16)])
def test_a_model_whose_states_run_in_float32_under_half_weights_is_scored_not_refused(name, dtype):
    model = family(name, dtype)               # residual_in_fp32: the last block returns float32 states
    data = batch(6)
    top_block_parameters(model, 1)
    top = TopBlocks(model, data, blocks=1)    # was refused: the head's matmul met float32 states
    assert top.hidden.dtype == torch.float32 and next(model.parameters()).dtype == dtype
    indices = [5, 0, 3, 3]
    assert torch.allclose(top(indices), classification_losses(model, data, indices), atol=1e-5, rtol=0)


# --- 7. the loss landscape under random displacements -----------------------------------------------------
def test_displaced_losses_refuse_a_tensor_given_twice_it_moved_a_shorter_radius():
    from sazo_lite.llm.landscape import displaced_losses

    theta = torch.nn.Parameter(torch.zeros(4))
    distance = lambda: float(theta.detach().norm())
    assert torch.allclose(displaced_losses(distance, [theta], radius=2.0, draws=3), torch.full((3, 2), 2.0,
                                                                                           dtype=torch.float64))
    with pytest.raises(ValueError, match="Invalid params: two tensors share memory"):
        displaced_losses(distance, [theta, theta], radius=2.0, draws=3)      # was 1.18 and 1.73 for a radius of 2
    with pytest.raises(ValueError, match="Invalid params: .*no tensors"):
        displaced_losses(distance, [], radius=2.0)                           # was a ZeroDivisionError
    assert torch.equal(theta.detach(), torch.zeros(4))


def test_random_walk_descent_takes_a_generator_of_parameters_for_every_radius():
    from sazo_lite.llm.landscape import random_walk_descent

    net = torch.nn.Linear(3, 1, bias=False)
    loss = lambda: float(0.5 * net.weight.detach().pow(2).sum())
    walk = random_walk_descent(loss, net.parameters(), radii=[0.5, 1.0], draws=2)   # the second radius had none left
    assert [round(c, 6) for c in walk["curvature"]] == [1.0, 1.0]

"""Round 10 red team of the language-model part (sazo_lite.llm): each test of a fix failed on the code before it.
Modules left in training mode under an eval model and routers' jitter (random losses without a word); true
norms of Linear weights read outside their Linear's forward (Jamba) or of Linear subclasses with a forward of
their own (Llama 4's router); label words and prompts given as one string, or scored by the unknown token.
The last tests pin the top-block mode's generality (sliding windows shorter than the prompt, float64, every
k, mixed lengths, nonzero adapters) on families beyond the four tiny ones."""
from __future__ import annotations

import pytest
import torch

pytest.importorskip("transformers")
pytest.importorskip("peft")

from sazo_lite.llm import add_lora, tiny_causal_lm, trainable_parameters
from sazo_lite.llm.grad_norms import grad_norms, linear_grad_norms, linear_modules_for, loop_grad_norms, vmap_grad_norms
from sazo_lite.llm.losses import (TokenBatch, answer_losses, classification_losses, encode_answers,
                                  encode_classification, label_word_ids)
from sazo_lite.llm.topblock import TopBlocks, decoder_layers, top_block_parameters, top_layers

VOCAB = 64
SIZES = dict(hidden_size=32, intermediate_size=64, num_hidden_layers=3, num_attention_heads=4,
             num_key_value_heads=2, max_position_embeddings=128)


def batch(n: int = 6, seed: int = 0, long: int | None = None) -> TokenBatch:
    """n examples of 3 … 9 tokens (one of ``long`` tokens if given), 3 classes on words 5, 9, 11."""
    g = torch.Generator().manual_seed(seed)
    lengths = [3 + (5 * k + seed) % 7 for k in range(n)]
    if long is not None:
        lengths[n // 2] = long
    ids = [torch.randint(3, VOCAB, (length,), generator=g).tolist() for length in lengths]
    return TokenBatch(ids, [len(r) for r in ids], 0, torch.randint(0, 3, (n,), generator=g), torch.tensor([5, 9, 11]))


def family(name: str, dtype=torch.float32, **extra):
    """A 3-layer, width-32 random causal LM of a transformers family (eval mode), built from its config."""
    import transformers
    from transformers import AutoModelForCausalLM

    config = getattr(transformers, f"{name}Config")(vocab_size=VOCAB, pad_token_id=0, bos_token_id=1,
                                                    eos_token_id=2, **{**SIZES, **extra})
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(1)
        return AutoModelForCausalLM.from_config(config, dtype=dtype).eval()


@torch.no_grad()
def jiggle(params, scale: float = 0.3, seed: int = 3) -> None:
    g = torch.Generator().manual_seed(seed)
    for p in params:
        p.add_((scale * torch.randn(p.shape, generator=g, dtype=torch.float64)).to(p.dtype))


# --- 1. randomness in training mode the checks did not see -------------------------------------------------
def test_a_block_left_in_training_mode_under_an_eval_model_is_refused_by_the_full_models_losses():
    model = family("Llama", attention_dropout=0.5)
    data = TokenBatch([[5, 6, 7], [8, 9, 10]], [2, 2], 0, torch.tensor([0, 1]), torch.tensor([5, 9]))   # no padding: vmap too
    assert torch.equal(classification_losses(model, data), classification_losses(model, data))
    decoder_layers(model)[0].self_attn.train()      # the model says eval; its attention drops out
    assert not model.training
    for losses in (lambda: classification_losses(model, data), lambda: answer_losses(model, data),
                   lambda: vmap_grad_norms(model, data, [decoder_layers(model)[2].mlp.up_proj.weight])):
        with pytest.raises(ValueError, match="Invalid model: model.layers.0.self_attn is in training mode"):
            losses()
    decoder_layers(model)[0].self_attn.eval()
    assert classification_losses(model, data).shape == (2,)


def test_a_routers_jitter_in_training_mode_is_refused_it_scaled_the_inputs_by_noise():
    model = family("Mixtral", router_jitter_noise=0.3, num_local_experts=4, num_experts_per_tok=2)
    data = batch()
    model.train()                     # every dropout rate is 0: the old check accepted it, each call random
    with pytest.raises(ValueError, match="jitter_noise = 0.3"):
        classification_losses(model, data)
    model.eval()
    top_block_parameters(model, 1)
    top = TopBlocks(model, data, blocks=1)
    decoder_layers(model)[-1].train()   # the tuned block put in training mode after the cache
    with pytest.raises(ValueError, match="jitter_noise"):
        top([0, 1])
    decoder_layers(model)[-1].eval()
    assert torch.allclose(top([0, 1]), classification_losses(model, data, [0, 1]), atol=1e-5, rtol=0)


def test_top_blocks_refuse_an_lm_head_left_in_training_mode_with_dropout():
    model = tiny_causal_lm("llama", vocab_size=VOCAB, seed=1)
    model.lm_head = torch.nn.Sequential(torch.nn.Dropout(0.5), model.lm_head).eval()     # a head with dropout
    data = batch()
    top_block_parameters(model, 1)
    top = TopBlocks(model, data, blocks=1)
    model.lm_head.train()
    with pytest.raises(ValueError, match="Dropout"):
        top([0, 1])
    model.lm_head.eval()
    assert torch.allclose(top([0, 1]), classification_losses(model, data, [0, 1]), atol=1e-5, rtol=0)


# --- 2. batched true norms: gradients the hooks do not see ------------------------------------------------
class ReadOutside(torch.nn.Module):
    """y = lin(x) + x @ lin.weightᵀ (the second use outside the Linear's forward, as Jamba's dt_proj.weight @ x)."""

    def __init__(self):
        super().__init__()
        self.lin = torch.nn.Linear(4, 4)
        self.out = torch.nn.Linear(4, 1)

    def forward(self, x):                           # x [B, T, 4]
        return self.out(torch.tanh(self.lin(x) + x @ self.lin.weight.T)).sum((1, 2))


def test_linear_norms_of_a_weight_also_read_outside_its_linear_fall_back_instead_of_leaving_that_part_out():
    net = ReadOutside()
    x = torch.randn(5, 3, 4, generator=torch.Generator().manual_seed(2))
    losses = lambda idx: net(x[list(idx)]) ** 2
    params = [net.lin.weight]
    exact = loop_grad_norms(losses, params, range(5))
    with pytest.raises(ValueError, match="Invalid params: .*(outside|add up)"):
        linear_grad_norms(net, losses, params, range(5))
    bias_only = [net.lin.bias, net.out.weight]      # used by their Linears alone: the hooks still serve them
    assert torch.allclose(linear_grad_norms(net, losses, bias_only, range(5)),
                          loop_grad_norms(losses, bias_only, range(5)), rtol=1e-6)
    assert exact.min() > 0


def test_jambas_true_norms_by_auto_equal_the_loop_and_linear_is_refused():
    model = family("Jamba", attn_layer_offset=1, attn_layer_period=2, expert_layer_offset=1, expert_layer_period=2)
    top_block_parameters(model, 2)
    params = [m.weight for m in decoder_layers(model)[1:].modules() if isinstance(m, torch.nn.Linear)]
    for p in model.parameters():
        p.requires_grad_(False)
    for p in params:
        p.requires_grad_(True)
    jiggle(params)
    data = batch(3)
    exact = torch.tensor([sum(float(g.double().pow(2).sum()) for g in torch.autograd.grad(
        classification_losses(model, data, [i], grad=True).sum(), params, allow_unused=True) if g is not None) ** 0.5
        for i in range(3)], dtype=torch.float64)
    assert torch.allclose(grad_norms(model, data, params), exact, rtol=1e-5)        # was 5e-4 off: dt_proj's part
    with pytest.raises(ValueError, match="Invalid params"):
        grad_norms(model, data, params, method="linear")
    top = TopBlocks(model, data, blocks=2)
    assert torch.allclose(top.grad_norms(params), exact, rtol=1e-5)


class Doubled(torch.nn.Linear):
    """A Linear subclass with a forward of its own: y = 2·(x Wᵀ + b)."""

    def forward(self, x):
        return 2 * super().forward(x)


class Routed(torch.nn.Linear):
    """A Linear subclass that returns a tuple (as Llama 4's router does)."""

    def forward(self, x):
        logits = super().forward(x)
        return logits.softmax(-1), logits


def test_linear_subclasses_with_a_forward_of_their_own_are_not_split_by_the_hooks():
    doubled, routed = Doubled(4, 3), Routed(4, 3)
    x = torch.randn(5, 2, 4, generator=torch.Generator().manual_seed(4))
    for net, losses in ((doubled, lambda idx: doubled(x[list(idx)]).pow(2).sum((1, 2))),
                        (routed, lambda idx: routed(x[list(idx)])[0].pow(2).sum((1, 2)))):
        params = list(net.parameters())
        assert linear_modules_for(net, params) is None       # the hooks' y = x Wᵀ + b need not hold
        with pytest.raises(ValueError, match="nn.Linear"):
            linear_grad_norms(net, losses, params, range(5))


def test_llama4s_true_norms_of_its_linears_by_auto_equal_the_loop():
    model = family("Llama4Text")
    top_block_parameters(model, 1)
    params = [m.weight for m in decoder_layers(model)[2].modules() if isinstance(m, torch.nn.Linear)]
    assert any(type(m).__name__ == "Llama4Router" for m in decoder_layers(model)[2].modules())
    for p in model.parameters():
        p.requires_grad_(False)
    for p in params:
        p.requires_grad_(True)
    jiggle(params)
    data = batch(4)
    exact = loop_grad_norms(lambda idx: classification_losses(model, data, list(idx), grad=True), params, range(4))
    assert torch.allclose(grad_norms(model, data, params), exact, rtol=1e-5)    # was an AttributeError
    assert torch.allclose(TopBlocks(model, data, blocks=1).grad_norms(params), exact, rtol=1e-5)


# --- 3. tokenising hostile inputs -------------------------------------------------------------------------
def word_tokenizer(**special):
    """A word-level tokenizer built in memory (no download): [UNK] 0, then a few words."""
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    vocab = {"[UNK]": 0, "a": 1, "b": 2, "yes": 3, "no": 4, "c": 5}
    inner = Tokenizer(models.WordLevel(vocab, unk_token="[UNK]"))
    inner.pre_tokenizer = pre_tokenizers.Whitespace()
    return PreTrainedTokenizerFast(tokenizer_object=inner, unk_token="[UNK]", **special)


def test_label_words_prompts_and_answers_given_as_one_string_are_refused_they_were_read_as_characters():
    tok = word_tokenizer(eos_token="c")
    with pytest.raises(ValueError, match="Invalid label_words: 'ab' .*not one string"):
        label_word_ids(tok, "ab")                      # was the words "a" and "b"
    with pytest.raises(ValueError, match="Invalid prompts: 'ab' .*not one string"):
        encode_classification(tok, "ab", [0, 1], ["yes", "no"])        # was two prompts, "a" and "b"
    with pytest.raises(ValueError, match="Invalid prompts: 'ab' .*not one string"):
        encode_answers(tok, "ab", ["yes", "no"])
    with pytest.raises(ValueError, match="Invalid answers: 'ab' .*not one string"):
        encode_answers(tok, ["a", "b"], "ab")
    data = encode_classification(tok, ["a b", "b"], [0, 1], ["yes", "no"])
    assert data.ids == [[1, 2], [2]] and data.label_ids.tolist() == [3, 4] and data.pad_id == 5


def test_a_label_word_scored_by_the_unknown_token_is_refused():
    tok = word_tokenizer(eos_token="c")
    with pytest.raises(ValueError, match="Invalid label_words: 'maybe' starts with the unknown token"):
        encode_classification(tok, ["a b"], [0], ["maybe", "no"])       # was scored by [UNK]'s logit


def test_an_empty_label_word_is_named_as_such():
    tok = word_tokenizer(eos_token="c")
    with pytest.raises(ValueError, match="Invalid label_words: '' has no tokens"):
        label_word_ids(tok, ["", "no"])
    with pytest.raises(ValueError, match=r"Invalid prompts: example 1 .* has no tokens"):      # an empty prompt: nothing to score at
        encode_classification(tok, ["a", ""], [0, 1], ["yes", "no"])
    with pytest.raises(ValueError, match="Invalid tokenizer: it has neither a pad nor an EOS token"):
        encode_classification(word_tokenizer(), ["a"], [0], ["yes", "no"])


# --- 4. the top-block mode beyond the tiny families (no fix: pins what holds) ------------------------------
WINDOWED = {   # sliding windows of 3 tokens, shorter than most prompts here (one of 20 tokens)
    "Mistral": dict(sliding_window=3),
    "Qwen2": dict(use_sliding_window=True, sliding_window=3, max_window_layers=1),
    "Gemma3Text": dict(sliding_window=3, sliding_window_pattern=2),
    "Starcoder2": dict(sliding_window=3),
    "GPTNeo": dict(num_layers=3, num_heads=4, window_size=3, attention_types=[[["global", "local"], 1], [["local"], 1]]),
}


@pytest.mark.parametrize("name, dtype", [(name, torch.float32) for name in sorted(WINDOWED)]
                         + [("Gemma3Text", torch.float64), ("Mistral", torch.float64)])
def test_sliding_windows_shorter_than_the_prompt_equal_the_full_model_at_every_k(name, dtype):
    data = batch(6, long=20)
    for blocks in (1, 2, 3):
        model = family(name, dtype, **WINDOWED[name])
        params = top_block_parameters(model, blocks)
        jiggle(params)
        top = TopBlocks(model, data, blocks=blocks)
        indices = [5, 3, 0, 3, 1]
        assert top(indices).dtype == dtype   # the losses in the model's dtype where it is wider than float32
        assert torch.allclose(top(indices), classification_losses(model, data, indices), atol=1e-5, rtol=0)
        assert torch.allclose(top([3]), classification_losses(model, data, [3]), atol=1e-5, rtol=0)


@pytest.mark.parametrize("name", ["Gemma2", "Phi", "Bloom", "Falcon", "GPTJ", "Mpt"])
def test_other_families_with_nonzero_adapters_in_float64_and_one_or_two_examples(name):
    extra = {"Gemma2": dict(head_dim=8), "GPTJ": dict(rotary_dim=4, n_embd=32, n_layer=3, n_head=4),
             "Mpt": dict(d_model=32, n_heads=4, n_layers=3, max_seq_len=128), "Bloom": dict(n_head=4)}.get(name, {})
    for n in (1, 2, 6):
        data = batch(n, long=12 if n > 2 else None)
        base = family(name, torch.float64, **extra)
        model = add_lora(base, rank=2, layers=top_layers(base, 2))
        jiggle(trainable_parameters(model))
        top = TopBlocks(model, data, blocks=2)
        indices = list(range(n))[::-1] + [0]
        assert torch.allclose(top(indices), classification_losses(model, data, indices), atol=1e-5, rtol=0)


# --- 5. rows longer than a table of learned positions ------------------------------------------------------
@pytest.mark.parametrize("name", ["gpt2", "opt"])
def test_an_example_longer_than_the_learned_positions_is_a_value_error_not_an_index_error(name):
    model = tiny_causal_lm(name, vocab_size=VOCAB)                    # 128 positions
    row = [3 + k % 60 for k in range(128)]
    fits = TokenBatch([row, [5, 6, 7]], [128, 3], 0, torch.tensor([0, 1]), torch.tensor([5, 9]))
    assert classification_losses(model, fits).shape == (2,)           # 128 tokens: the last position is 127
    long = TokenBatch([row + [4], [5, 6, 7]], [129, 3], 0, torch.tensor([0, 1]), torch.tensor([5, 9]))
    for losses in (lambda: classification_losses(model, long), lambda: answer_losses(model, long, [1]),
                   lambda: TopBlocks(model, long, blocks=1)):
        with pytest.raises(ValueError, match="Invalid batch: an example of 129 tokens is longer than the model's "
                                             "128 learned positions"):
            losses()
    assert classification_losses(tiny_causal_lm("llama", vocab_size=VOCAB), long).shape == (2,)   # rotary: any length


# --- 6. rotary frequencies that depend on the batch's width ------------------------------------------------
ROPE = {"dynamic": ("Llama", dict(max_position_embeddings=8,
                                  rope_parameters={"rope_type": "dynamic", "factor": 2.0, "rope_theta": 10000.0})),
        "longrope": ("Phi3", dict(max_position_embeddings=32, original_max_position_embeddings=8,
                                  rope_parameters={"rope_type": "longrope", "rope_theta": 10000.0,
                                                   "original_max_position_embeddings": 8,
                                                   "short_factor": [1.0] * 4, "long_factor": [3.0] * 4}))}


@pytest.mark.parametrize("kind", sorted(ROPE))
def test_top_blocks_refuse_a_split_longer_than_where_rotary_frequencies_start_to_depend_on_the_batch(kind):
    name, extra = ROPE[kind]
    model = family(name, **extra)
    top_block_parameters(model, 1)
    short = TokenBatch([[5, 6, 7], [8, 9, 10, 11, 12, 13, 14, 15]], [3, 8], 0, torch.tensor([0, 1]), torch.tensor([5, 9]))
    top = TopBlocks(model, short, blocks=1)             # 8 tokens: the original frequencies for every batch
    assert torch.allclose(top([0]), classification_losses(model, short, [0]), atol=1e-5, rtol=0)
    long = batch(6, long=20)
    alone = torch.cat([classification_losses(model, long, [i]) for i in range(6)])
    assert (alone - classification_losses(model, long)).abs().max() > 1e-6    # the model's own losses move
    with pytest.raises(ValueError, match=f"Invalid batch: its longest example has 20 tokens, past the 8 .*{kind}"):
        TopBlocks(model, long, blocks=1)                # was: the whole split's frequencies, not each batch's

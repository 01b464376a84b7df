"""ZOTrainer red-team round 14: the trainer against a plain MeZO loop, evaluation's per-example losses,
and the default collator's token ids.

One test per defect (each fails on the code before the fix), plus reference checks. Tiny random
models, rows in memory.
"""
import pytest
import torch
import torch.nn.functional as F

transformers = pytest.importorskip("transformers")

from sazo_lite.llm.models import tiny_causal_lm  # noqa: E402
from test_hf import VOCAB, _OnFirstUse, memorisable_rows, training_args, trainer_for, weights  # noqa: E402

hf = _OnFirstUse("sazo_lite.hf")
transformers.logging.set_verbosity_error()


def token_losses(outputs, inputs):
    """A per_example_loss gone wrong: the token losses [B, T − 1] (0 on ignored tokens), not one per example."""
    logits, labels = outputs.logits[:, :-1], inputs["labels"][:, 1:]
    return F.cross_entropy(logits.transpose(1, 2), labels, ignore_index=-100, reduction="none")


# -- evaluation checks the per-example losses as training does ------------------------------------
@pytest.mark.parametrize("train", [True, False])
def test_evaluate_refuses_a_per_example_loss_that_is_not_one_loss_per_example(tmp_path, train):
    # evaluate() before train(), or with no train_dataset, never ran the check before training: the
    # mean of the token losses (zeros on the prompt and padding) was eval_loss, 2.32 for a true 4.16
    rows = memorisable_rows(n=10, ragged=True)
    trainer = hf.ZOTrainer(tiny_causal_lm("llama", vocab_size=VOCAB), training_args(tmp_path),
                           train_dataset=rows if train else None, eval_dataset=rows, per_example_loss=token_losses)
    with pytest.raises(ValueError, match=r"Invalid per_example_loss: it returned shape \(8, 7\).*evaluation batch"):
        trainer.evaluate()


def test_evaluate_still_takes_one_loss_per_example_and_averages_them(tmp_path):
    rows = memorisable_rows(n=10, ragged=True)
    trainer = trainer_for(tmp_path, rows=rows, args=training_args(tmp_path, per_device_eval_batch_size=4))
    model = trainer.model
    model.eval()
    with torch.no_grad():
        batch = hf.CausalLMCollator(0)(rows)
        expected = hf.causal_lm_losses(model(input_ids=batch["input_ids"],
                                             attention_mask=batch["attention_mask"]).logits, batch["labels"])
    assert trainer.evaluate()["eval_loss"] == pytest.approx(float(expected.mean()), rel=1e-5)


def test_the_evaluation_check_counts_examples_by_their_labels(tmp_path):
    # a batch whose first tensor is not one row per example (the verbaliser's ids) still evaluates
    rows, collate = memorisable_rows(n=8), hf.CausalLMCollator(0)

    def with_label_words(examples):
        return {"label_word_ids": torch.tensor([5, 6, 7]), **collate(examples)}

    trainer = hf.ZOTrainer(tiny_causal_lm("llama", vocab_size=VOCAB), training_args(tmp_path), eval_dataset=rows,
                           data_collator=with_label_words)
    assert trainer.evaluate()["eval_loss"] > 0


# -- the default collator's token ids -------------------------------------------------------------
@pytest.mark.parametrize("column, values", [
    ("input_ids", [5.7, 6.2, 7.9]),                     # read as tokens 5, 6, 7
    ("input_ids", [5, True, 7]),                        # True read as token 1
    ("input_ids", torch.tensor([5.5, 6.0, 7.0])),       # a float tensor: token 5
    ("input_ids", [[5, 6, 7]]),                         # a tokenizer's return_tensors row [1, T]
    ("labels", [-100, 6.5, 7.0]),                       # label 6
    ("labels", [-100.0, False, 7]),
])
def test_the_default_collator_refuses_token_ids_that_are_not_integers(column, values):
    row = {"input_ids": [5, 6, 7], "labels": [-100, 6, 7], column: values}
    with pytest.raises(ValueError, match=f"Invalid {column}: row 1 holds"):
        hf.CausalLMCollator(0)([{"input_ids": [3, 4, 5]}, row])


def test_the_default_collator_takes_integer_ids_of_any_kind():
    np = pytest.importorskip("numpy")
    rows = [{"input_ids": [5, 6, 7], "labels": [-100, 6, 7]},
            {"input_ids": np.array([5, 6, 7]), "labels": torch.tensor([-100, 6, 7])},
            {"input_ids": [np.int64(5), torch.tensor(6), 7], "labels": (-100, np.int32(6), 7)},
            {"input_ids": [5, 6, 7, 0], "labels": [-100, 6, 7, 0], "attention_mask": [True, True, True, False]}]
    batch = hf.CausalLMCollator(0)(rows)
    assert batch["input_ids"].tolist() == [[5, 6, 7]] * 4
    assert batch["labels"].tolist() == [[-100, 6, 7]] * 4


def test_the_default_collator_refuses_a_mask_entry_that_is_not_0_or_1():
    # int(0.5) read it as 0: the token was dropped as padding
    with pytest.raises(ValueError, match="Invalid attention_mask: row 0"):
        hf.CausalLMCollator(0)([{"input_ids": [5, 6, 7], "attention_mask": [0.5, 1, 1]}])


# -- the trainer against a plain MeZO loop --------------------------------------------------------
def plain_mezo_run(model, rows, *, steps, batch_size, lr, weight_decay, eps, seed, method, loss, schedule="constant",
                   warmup=0):
    """A hand-written MeZO loop: the sampler seeded seed + 1, MeZO seeded seed, weight decay on all but
    biases and norms (contiguous groups, as the Trainer's AdamW decays), the lr schedule stepped after each step."""
    from sazo_lite.engine import MeZO
    from sazo_lite.samplers import make_sampler

    model.eval()
    groups = []
    for name, p in model.named_parameters():
        decay = 0.0 if ("bias" in name or "norm" in name) else weight_decay
        if groups and groups[-1]["weight_decay"] == decay:
            groups[-1]["params"].append(p)
        else:
            groups.append({"params": [p], "weight_decay": decay})
    optimizer = MeZO(groups, lr=lr, eps=eps, seed=seed)
    scheduler = transformers.get_scheduler(schedule, optimizer, num_warmup_steps=warmup, num_training_steps=steps)
    sampler, collate = make_sampler(method, len(rows), seed=seed + 1), hf.CausalLMCollator(0)
    grads = []
    for _ in range(steps):
        indices, weights_ = sampler.sample(batch_size)
        batch = collate([rows[i] for i in indices.tolist()])
        out = optimizer.step(lambda: loss(model(input_ids=batch["input_ids"],
                                                attention_mask=batch["attention_mask"]), batch), weights_)
        sampler.update(indices, out.directional_diffs)
        scheduler.step()
        grads.append(out.projected_grad)
    return grads


def default_loss(outputs, inputs):
    return hf.causal_lm_losses(outputs.logits, inputs["labels"])


def float64_losses(outputs, inputs):
    logits, labels = outputs.logits[:, :-1].double(), inputs["labels"][:, 1:]
    ce = F.cross_entropy(logits.transpose(1, 2), labels, ignore_index=-100, reduction="none")
    return ce.sum(1) / (labels != -100).sum(1).clamp_min(1)


@pytest.mark.parametrize("method, schedule, warmup", [("mezo", "linear", 2), ("sazo", "cosine", 1),
                                                      ("sazo", "constant_with_warmup", 3)])
def test_a_run_is_the_plain_mezo_loop_bit_for_bit(tmp_path, method, schedule, warmup):
    rows = memorisable_rows(n=10, ragged=True)
    settings = dict(steps=5, batch_size=3, lr=1e-2, weight_decay=0.1, eps=1e-3, seed=7)

    def model():
        torch.manual_seed(0)
        return tiny_causal_lm("llama", vocab_size=VOCAB)

    args = training_args(tmp_path, max_steps=5, per_device_train_batch_size=3, learning_rate=1e-2, weight_decay=0.1,
                         lr_scheduler_type=schedule, warmup_steps=warmup, seed=7, logging_steps=1)
    trainer = hf.ZOTrainer(model(), args, train_dataset=rows, method=method, eps=1e-3)
    trainer.train()
    reference = model()
    grads = plain_mezo_run(reference, rows, method="uniform" if method == "mezo" else method, loss=default_loss,
                           schedule=schedule, warmup=warmup, **settings)
    for name, value in weights(reference).items():
        assert torch.equal(weights(trainer.model)[name], value), name
    logged = [entry["zo_projected_grad"] for entry in trainer.state.log_history if "loss" in entry]
    assert logged == pytest.approx([abs(g) for g in grads], rel=1e-12)


def test_a_float64_per_example_loss_reaches_mezo_in_float64(tmp_path):
    # the losses were cast to float32 before MeZO read them: with eps = 1e-7 on a float64 model the
    # differences f(θ+εz) − f(θ−εz) were rounded to float32's ulp and g was off by a few per cent
    rows = memorisable_rows(n=8)
    settings = dict(steps=2, batch_size=4, lr=2e-3, weight_decay=0.0, eps=1e-7, seed=0)

    def model():
        torch.manual_seed(0)
        return tiny_causal_lm("llama", vocab_size=VOCAB).double()

    args = training_args(tmp_path, max_steps=2, logging_steps=1)
    trainer = trainer_for(tmp_path, rows=rows, model=model(), args=args,
                          per_example_loss=float64_losses, method="mezo", eps=1e-7)
    trainer.train()
    reference = model()
    grads = plain_mezo_run(reference, rows, method="uniform", loss=float64_losses, **settings)
    logged = [entry["zo_projected_grad"] for entry in trainer.state.log_history if "loss" in entry]
    assert logged == pytest.approx([abs(g) for g in grads], rel=1e-12)
    for name, value in weights(reference).items():
        assert torch.equal(weights(trainer.model)[name], value), name


# -- peft adapters in half precision through resumes and load_best_model_at_end ------------------
def half_lora_model():
    """A bfloat16 model with bfloat16 LoRA adapters (peft upcasts them unless told not to), so tuned
    through a float32 master."""
    peft = pytest.importorskip("peft")
    torch.manual_seed(0)
    model = tiny_causal_lm("llama", vocab_size=VOCAB).to(torch.bfloat16)
    config = peft.LoraConfig(r=2, target_modules=["q_proj", "v_proj"], lora_dropout=0.1)
    return peft.get_peft_model(model, config, autocast_adapter_dtype=False)


def tuned(model):
    return {name: p for name, p in model.named_parameters() if p.requires_grad}


def test_a_half_precision_lora_run_resumes_bit_for_bit(tmp_path):
    # peft's load_adapter replaced the bfloat16 adapters by float32 ones: the resumed run built no master,
    # dropped the checkpoint's, and tuned float32 adapters from the rounded weights (another run)
    rows = memorisable_rows(n=11, ragged=True)
    settings = dict(max_steps=6, per_device_train_batch_size=3, weight_decay=0.1, lr_scheduler_type="linear",
                    warmup_steps=2)
    whole = trainer_for(tmp_path, rows=rows, model=half_lora_model(),
                        args=training_args(tmp_path, save_strategy="steps", save_steps=3, **settings))
    whole.train()
    resumed = trainer_for(tmp_path / "again", rows=rows, model=half_lora_model(),
                          args=training_args(tmp_path / "again", **settings))
    kept = tuned(resumed.model)
    resumed.train(resume_from_checkpoint=str(tmp_path / "out" / "checkpoint-3"))
    assert all(kept[name] is p and p.dtype == torch.bfloat16 for name, p in tuned(resumed.model).items())
    assert resumed._master is not None and all(a is b for a, b in zip(resumed._master.params, kept.values()))
    for name, value in weights(whole.model).items():
        assert torch.equal(weights(resumed.model)[name], value), name
    for a, b in zip(whole._master.tensors, resumed._master.tensors):
        assert torch.equal(a, b)


def test_after_load_best_model_at_end_a_half_precision_lora_model_trains_on(tmp_path):
    # the best adapters were loaded as new float32 tensors: MeZO and the master kept the old ones, which
    # are no longer in the model, so a later train() changed nothing in it
    args = training_args(tmp_path, max_steps=4, per_device_train_batch_size=3, eval_strategy="steps", eval_steps=2,
                         save_strategy="steps", save_steps=2, load_best_model_at_end=True)
    trainer = trainer_for(tmp_path, model=half_lora_model(), args=args)
    kept = tuned(trainer.model)
    trainer.train()
    assert trainer.state.best_model_checkpoint is not None
    assert all(kept[name] is p and p.dtype == torch.bfloat16 for name, p in tuned(trainer.model).items())
    before = weights(trainer.model)
    trainer.train()
    assert any(not torch.equal(before[name], value) for name, value in weights(trainer.model).items() if "lora" in name)


# -- the trainable tensors are the optimiser's ----------------------------------------------------
class FreezeAt(transformers.TrainerCallback):
    """Freezes the embeddings when step ``at`` begins, keeping the weights of that moment."""

    def __init__(self, at):
        self.at, self.weights = at, None

    def on_step_begin(self, args, state, control, model=None, **kwargs):
        if state.global_step == self.at:
            model.get_input_embeddings().weight.requires_grad_(False)
            self.weights = weights(model)


def test_a_tensor_frozen_mid_run_is_refused_before_the_step_moves_anything(tmp_path):
    # MeZO went on perturbing and updating the embeddings (the Trainer's AdamW skips a tensor without a gradient)
    callback = FreezeAt(2)
    trainer = trainer_for(tmp_path, args=training_args(tmp_path, max_steps=4), callbacks=[callback])
    with pytest.raises(ValueError, match=r"Invalid model: its trainable tensors changed .*model.embed_tokens.weight"):
        trainer.train()
    assert trainer.zo_optimizer.step_count == 2
    for name, value in weights(trainer.model).items():
        assert torch.equal(callback.weights[name], value), name


@pytest.mark.parametrize("change", ["freeze", "unfreeze"])
def test_trainable_tensors_changed_between_train_calls_are_refused(tmp_path, change):
    model = tiny_causal_lm("llama", vocab_size=VOCAB)
    model.lm_head.weight.requires_grad_(False)
    trainer = trainer_for(tmp_path, model=model, args=training_args(tmp_path, max_steps=2))
    trainer.train()
    embeddings = model.get_input_embeddings().weight
    (embeddings if change == "freeze" else model.lm_head.weight).requires_grad_(change == "unfreeze")
    before = weights(model)
    with pytest.raises(ValueError, match="Invalid model: its trainable tensors changed"):
        trainer.train()
    assert all(torch.equal(before[name], value) for name, value in weights(model).items())
    (embeddings if change == "freeze" else model.lm_head.weight).requires_grad_(change == "freeze")
    trainer.train()                                      # put back: trains on
    assert trainer.zo_optimizer.step_count == 4


# -- the default collator's pad id -----------------------------------------------------------------
def test_a_config_whose_pad_id_is_minus_one_pads_with_its_eos_id(tmp_path):
    # pad_token_id = -1 ("none", as in some LLaMA configs) was the pad of every ragged batch: torch's
    # IndexError from the embedding lookup (the config names -1, so the id check let it through)
    model = tiny_causal_lm("llama", vocab_size=VOCAB)
    model.config.pad_token_id = -1
    trainer = trainer_for(tmp_path, rows=memorisable_rows(n=8, ragged=True), model=model)
    assert trainer.data_collator.pad_token_id == model.config.eos_token_id
    trainer.train()
    assert trainer.zo_optimizer.step_count == 4

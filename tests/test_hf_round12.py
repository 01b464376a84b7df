"""ZOTrainer red-team round 12: resumes with another batch size, and what a researcher's
TrainingArguments do to a run.

One test per defect (each fails on the code before the fix). Tiny random models, rows in memory.
"""
import json
import re
import warnings

import pytest
import torch

transformers = pytest.importorskip("transformers")

from sazo_lite.llm.models import tiny_causal_lm  # noqa: E402
from test_hf import VOCAB, _OnFirstUse, memorisable_rows, training_args, trainer_for, weights  # noqa: E402

hf = _OnFirstUse("sazo_lite.hf")
transformers.logging.set_verbosity_error()


def logged(trainer, key):
    return [entry[key] for entry in trainer.state.log_history if "loss" in entry]


# -- resuming with another batch size ------------------------------------------------------------
@pytest.fixture
def checkpoint(tmp_path):
    """checkpoint-2 of a B = 4 run over 8 examples (an epoch is 2 steps), logged every step."""
    args = training_args(tmp_path / "first", max_steps=2, save_strategy="steps", save_steps=2, logging_steps=1)
    trainer_for(tmp_path / "first", args=args).train()
    return tmp_path / "first" / "out" / "checkpoint-2"


def test_a_resume_with_another_batch_size_warns_naming_both_and_epochs_go_on(tmp_path, checkpoint):
    # the Trainer counted the checkpoint's 2 steps of B = 4 as steps of B = 2: the logged epoch
    # fell from 1.0 to 0.75, later checkpoints recorded B = 4 for steps of B = 2, and nothing
    # was said (the Trainer's own note is a logger line, silent at the usual verbosity)
    args = training_args(tmp_path, max_steps=4, per_device_train_batch_size=2, logging_steps=1,
                         save_strategy="steps", save_steps=4)
    trainer = trainer_for(tmp_path, args=args)
    with pytest.warns(UserWarning, match=r"per_device_train_batch_size: 2 \(B = 2 .* written with B = 4"):
        trainer.train(resume_from_checkpoint=str(checkpoint))
    assert logged(trainer, "epoch") == [0.5, 1.0, 1.25, 1.5]   # the checkpoint's log, then 4 steps of B = 2 an epoch
    written = tmp_path / "out" / "checkpoint-4"
    assert json.loads((written / "trainer_state.json").read_text())["train_batch_size"] == 2
    assert torch.load(written / hf.ZO_STATE_NAME, weights_only=True)["batch_size"] == 2
    assert logged(trainer, "zo_queries") == [8, 16, 16 + 4, 16 + 8]
    again = trainer_for(tmp_path / "again", args=training_args(tmp_path / "again", max_steps=6, logging_steps=1,
                                                               per_device_train_batch_size=2))
    with warnings.catch_warnings():
        warnings.simplefilter("error")                      # the same B as that checkpoint's steps: no warning
        again.train(resume_from_checkpoint=str(written))
    assert again.zo_optimizer.step_count == 6
    assert logged(again, "epoch")[-2:] == [1.75, 2.0]       # from checkpoint-4's 1.5 on (the Trainer: 1.25, 1.5)


def test_a_resume_with_the_same_batch_size_does_not_warn(tmp_path, checkpoint):
    trainer = trainer_for(tmp_path, args=training_args(tmp_path, max_steps=4, logging_steps=1))
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        trainer.train(resume_from_checkpoint=str(checkpoint))
    assert logged(trainer, "epoch") == [0.5, 1.0, 1.5, 2.0]


@pytest.mark.parametrize("change", [dict(max_steps=-1, num_train_epochs=3), dict(save_strategy="epoch"),
                                    dict(eval_strategy="epoch")], ids=["num_train_epochs", "save", "eval"])
def test_an_epoch_counted_resume_with_another_batch_size_is_refused_before_anything_loads(tmp_path, checkpoint,
                                                                                        change):
    # num_train_epochs=3 resumed with B = 2 after 1 epoch of B = 4 ran 10 more steps (3 epochs of
    # 4 steps, less the checkpoint's 2 counted as steps of B = 2), not the 2 epochs left
    args = training_args(tmp_path, per_device_train_batch_size=2, **{"max_steps": 4, **change})
    trainer = trainer_for(tmp_path, args=args)
    before = weights(trainer.model)
    with pytest.raises(ValueError, match=r"Invalid per_device_train_batch_size: 2 .* written with B = 4"):
        trainer.train(resume_from_checkpoint=str(checkpoint))
    assert trainer.optimizer is None and trainer.state.global_step == 0
    assert all(torch.equal(weights(trainer.model)[k], v) for k, v in before.items())


def test_a_checkpoint_of_another_number_of_processes_counts_its_global_batch(tmp_path, checkpoint):
    # B is per_device_train_batch_size × processes: a checkpoint written by 2 processes of 4
    # (B = 8) resumed by one process of 4 drew half the examples per step, unnoticed (the
    # Trainer's trainer_state.json holds the per-process size only)
    state = torch.load(checkpoint / hf.ZO_STATE_NAME, weights_only=True)
    assert state["batch_size"] == 4
    state["batch_size"] = 8
    torch.save(state, checkpoint / hf.ZO_STATE_NAME)
    trainer = trainer_for(tmp_path, args=training_args(tmp_path, max_steps=-1, num_train_epochs=2))
    with pytest.raises(ValueError, match=r"Invalid per_device_train_batch_size: 4 \(B = 4 .*1 process.* B = 8"):
        trainer.train(resume_from_checkpoint=str(checkpoint))


@pytest.mark.parametrize("value", [0, -4, 2.0, True, "4"])
def test_a_checkpoint_with_a_bad_batch_size_is_refused(tmp_path, checkpoint, value):
    state = torch.load(checkpoint / hf.ZO_STATE_NAME, weights_only=True)
    state["batch_size"] = value
    torch.save(state, checkpoint / hf.ZO_STATE_NAME)
    trainer = trainer_for(tmp_path, args=training_args(tmp_path, max_steps=4))
    with pytest.raises(ValueError, match="Invalid checkpoint: its batch_size"):
        trainer.train(resume_from_checkpoint=str(checkpoint))


def test_a_checkpoint_from_before_round_12_compares_the_trainers_batch_size(tmp_path, checkpoint):
    state = torch.load(checkpoint / hf.ZO_STATE_NAME, weights_only=True)
    del state["batch_size"]
    torch.save(state, checkpoint / hf.ZO_STATE_NAME)
    same = trainer_for(tmp_path / "same", args=training_args(tmp_path / "same", max_steps=4))
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        same.train(resume_from_checkpoint=str(checkpoint))
    other = trainer_for(tmp_path, args=training_args(tmp_path, max_steps=4, per_device_train_batch_size=2))
    with pytest.warns(UserWarning, match="written with B = 4"):
        other.train(resume_from_checkpoint=str(checkpoint))


# -- a callback writing the weights of a half-precision model ---------------------------------------
class HalveAt(transformers.TrainerCallback):
    """Halves every weight of the model at the end of one step (weight shrinkage, say)."""

    def __init__(self, step):
        self.step = step

    def on_step_end(self, args, state, control, model=None, **kwargs):
        if state.global_step == self.step:
            with torch.no_grad():
                for p in model.parameters():
                    p.mul_(0.5)


def half_trainer(root, max_steps, **args_change):
    args = training_args(root, max_steps=max_steps, learning_rate=1e-6, **args_change)
    return trainer_for(root, model=tiny_causal_lm("llama", vocab_size=VOCAB, dtype=torch.bfloat16), args=args,
                       callbacks=[HalveAt(2)])


def test_a_callbacks_write_into_a_half_precision_model_is_kept(tmp_path):
    # MeZO tunes the float32 master and each pass syncs it into the model: a callback's write
    # into the model's weights was silently undone at the next step (a float32 model keeps it)
    trainer = half_trainer(tmp_path, max_steps=3, save_strategy="steps", save_steps=2)
    start = weights(trainer.model)
    trainer.train()
    for name, value in weights(trainer.model).items():
        if value.is_floating_point() and value.abs().max() > 0:
            ratio = float(value.float().norm() / start[name].float().norm())
            assert ratio == pytest.approx(0.5, abs=0.01), name
    for p, master in zip(trainer._master.params, trainer._master.tensors):
        assert torch.equal(p, master.to(p.dtype))          # the model holds the rounded master
    # a resume from the step of the write goes on from the written weights, as the run did
    resumed = half_trainer(tmp_path / "again", max_steps=3)
    resumed.train(resume_from_checkpoint=str(tmp_path / "out" / "checkpoint-2"))
    for a, b in zip(trainer._master.tensors, resumed._master.tensors):
        assert torch.equal(a, b)


# -- a SeedLog of a ZOTrainer run ----------------------------------------------------------------
class AttachLog(transformers.TrainerCallback):
    """Attaches a SeedLog to the trainer's MeZO when training begins, or at the end of step ``at_step``."""

    def __init__(self, trainer, at_step=None):
        self.trainer, self.at_step, self.log = trainer, at_step, None

    def _attach(self):
        from sazo_lite.seedlog import SeedLog

        self.log = SeedLog.attach(self.trainer.zo_optimizer)

    def on_train_begin(self, args, state, control, **kwargs):
        if self.at_step is None:
            self._attach()

    def on_step_end(self, args, state, control, **kwargs):
        if state.global_step == self.at_step:
            self._attach()


def logged_trainer(tmp_path, halve_at=None, attach_at=None):
    model = tiny_causal_lm("llama", vocab_size=VOCAB)
    start = weights(model)
    callbacks = [] if halve_at is None else [HalveAt(halve_at)]
    trainer = trainer_for(tmp_path, model=model, args=training_args(tmp_path, max_steps=4), callbacks=callbacks)
    attach = AttachLog(trainer, attach_at)
    trainer.add_callback(attach)
    return trainer, attach, start


def test_a_seed_log_of_a_trainer_run_replays_its_weights(tmp_path):
    # the trainer's optimiser was a private MeZO subclass, so its log named "_TrainerMeZO":
    # SeedLog.replay refused it ("replay it with replay_into(_TrainerMeZO(params, ...))")
    trainer, attach, start = logged_trainer(tmp_path)
    trainer.train()
    fresh = tiny_causal_lm("llama", vocab_size=VOCAB)
    fresh.load_state_dict(start)
    attach.log.replay(fresh.parameters())
    assert attach.log.num_steps == 4
    for name, value in weights(trainer.model).items():
        assert torch.equal(weights(fresh)[name], value), name


def test_a_callbacks_write_under_a_seed_log_is_refused_at_the_next_step(tmp_path):
    # a callback halving the weights between steps 2 and 3: the log records steps only, so its
    # replay silently rebuilt other weights (0.5 off); now the next step refuses, nothing moved
    trainer, attach, _ = logged_trainer(tmp_path, halve_at=2)
    written = {}

    class Keep(transformers.TrainerCallback):
        def on_step_end(self, args, state, control, **kwargs):
            written.update(weights(trainer.model))

    trainer.add_callback(Keep())                           # runs after the write: the weights step 3 starts from
    with pytest.raises(ValueError, match="Invalid weights: the tuned weights changed since the last MeZO step"):
        trainer.train()
    assert trainer.state.global_step == 2 and attach.log.num_steps == 2
    assert all(torch.equal(written[k], v) for k, v in weights(trainer.model).items())


def test_a_seed_log_attached_after_the_write_records_on(tmp_path):
    trainer, attach, _ = logged_trainer(tmp_path, halve_at=2, attach_at=2)   # HalveAt runs first
    written = {}

    class Keep(transformers.TrainerCallback):
        def on_step_end(self, args, state, control, **kwargs):
            if state.global_step == 2:
                written.update(weights(trainer.model))

    trainer.add_callback(Keep())
    trainer.train()
    fresh = tiny_causal_lm("llama", vocab_size=VOCAB)
    fresh.load_state_dict(written)
    attach.log.replay(fresh.parameters())
    assert attach.log.num_steps == 2
    assert all(torch.equal(weights(fresh)[k], v) for k, v in weights(trainer.model).items())


# -- a non-finite loss mid-run ------------------------------------------------------------------------
def test_a_non_finite_loss_names_its_examples_and_step_and_nothing_moves(tmp_path):
    # MeZO's refusal said "closure returned a non-finite loss (call 1)": neither the step nor the
    # examples, which are what one looks at (an empty answer, a corrupt row)
    rows = memorisable_rows(n=8)
    rows[5]["input_ids"][0] = 2                            # marks row 5, whose loss is NaN

    def losses(outputs, inputs):
        marked = inputs["input_ids"][:, 0] == 2
        return torch.where(marked, float("nan"), hf.causal_lm_losses(outputs.logits, inputs["labels"]))

    before = {}

    class Keep(transformers.TrainerCallback):
        def on_step_begin(self, args, state, control, model=None, **kwargs):
            before.update(weights(model))

    trainer = trainer_for(tmp_path, rows=rows, args=training_args(tmp_path, max_steps=50), per_example_loss=losses,
                          callbacks=[Keep()])
    with pytest.raises(FloatingPointError, match=r"examples \[5\] at step (\d+);") as raised:
        trainer.train()
    step = int(re.search(r"at step (\d+)", str(raised.value)).group(1))
    assert trainer.state.global_step == step - 1 == trainer.zo_optimizer.step_count
    assert trainer.model.training
    for name, value in weights(trainer.model).items():
        assert torch.allclose(value, before[name], rtol=0, atol=1e-6), name


# -- ignore_data_skip ----------------------------------------------------------------------------
def test_a_resume_with_ignore_data_skip_goes_on_as_the_uninterrupted_run(tmp_path):
    # skipping the resumed epoch's step tickets costs nothing (the sampler's state holds where the
    # data stands), but ignore_data_skip restarted the epoch count: step 4 logged epoch 1.5, as step 3
    def args(root, **change):
        return training_args(root, max_steps=-1, num_train_epochs=2, logging_steps=1, **change)

    whole = trainer_for(tmp_path / "whole", args=args(tmp_path / "whole", save_strategy="steps", save_steps=3))
    whole.train()
    given = args(tmp_path, ignore_data_skip=True)
    resumed = trainer_for(tmp_path, args=given)
    resumed.train(resume_from_checkpoint=str(tmp_path / "whole" / "out" / "checkpoint-3"))
    assert given.ignore_data_skip                           # the user's object is left as it was
    assert logged(resumed, "epoch") == logged(whole, "epoch") == [0.5, 1.0, 1.5, 2.0]
    assert all(torch.equal(weights(resumed.model)[k], v) for k, v in weights(whole.model).items())


# -- fp16 on a CPU -------------------------------------------------------------------------------
def test_fp16_on_a_cpu_is_refused_not_ignored(tmp_path):
    # accelerate autocasts float16 on accelerators only: on a CPU the forwards ran in float32, silently
    with pytest.raises(ValueError, match="Invalid fp16: True on 'cpu'.*bf16=True"):
        trainer_for(tmp_path, args=training_args(tmp_path, fp16=True))
    assert trainer_for(tmp_path, args=training_args(tmp_path, bf16=True)).accelerator.native_amp


# -- a classification dataset's "label" column -----------------------------------------------------
@pytest.mark.parametrize("name", ["label", "label_ids"])
def test_rows_with_a_label_column_and_no_labels_are_refused_by_the_default_collator(tmp_path, name):
    # a tokenised GLUE set (input_ids, attention_mask, label) with no data_collator: the collator
    # labelled each row with its own input ids and the run tuned plain language modelling,
    # silently ignoring the labels
    rows = [{"input_ids": r["input_ids"], "attention_mask": [1] * len(r["input_ids"]), name: i % 2}
            for i, r in enumerate(memorisable_rows())]
    trainer = trainer_for(tmp_path, rows=rows)
    before = weights(trainer.model)
    with pytest.raises(ValueError, match=f"Invalid labels: row 0 has '{name}' \\(0\\) but no 'labels'"):
        trainer.train()
    assert trainer.state.global_step == 0
    assert all(torch.equal(weights(trainer.model)[k], v) for k, v in before.items())
    with_labels = [dict(row, labels=row["input_ids"]) for row in rows]   # a column beside labels is left alone
    assert torch.equal(hf.CausalLMCollator(0)(with_labels)["labels"][0], torch.tensor(rows[0]["input_ids"]))


@pytest.mark.parametrize("bad", [None, "mean"], ids=["None", "the mean"])
def test_a_per_example_loss_that_goes_wrong_mid_run_is_named(tmp_path, bad):
    # a loss that returns None (or the batch's mean) for some batch only, after the check before
    # training: AttributeError "'NoneType' object has no attribute 'float'" from inside the step
    calls = []

    def losses(outputs, inputs):
        calls.append(1)
        values = hf.causal_lm_losses(outputs.logits, inputs["labels"])
        if len(calls) < 4:                                 # the check, then step 1's two passes
            return values
        return None if bad is None else values.mean()

    trainer = trainer_for(tmp_path, args=training_args(tmp_path, max_steps=3), per_example_loss=losses)
    got = "NoneType" if bad is None else r"shape \(\) torch.float32"
    with pytest.raises(ValueError, match=f"Invalid per_example_loss: it returned {got} for 4 examples at step 2"):
        trainer.train()
    assert trainer.zo_optimizer.step_count == 1 and trainer.model.training

"""ZOTrainer red-team round 10: modes, master weights, resumed settings and counts that were silently wrong.

One test per defect (each fails on the code before the fix). Tiny random models, rows in memory.
"""
import os
import shutil

import pytest
import torch

transformers = pytest.importorskip("transformers")

from sazo_lite.llm.models import tiny_causal_lm  # noqa: E402
from test_hf import VOCAB, _OnFirstUse, memorisable_rows, trainer_for, training_args, weights  # noqa: E402

hf = _OnFirstUse("sazo_lite.hf")
transformers.logging.set_verbosity_error()


def queries_logged(trainer):
    return [entry["zo_queries"] for entry in trainer.state.log_history if "zo_queries" in entry]


# -- the model's mode after train() ------------------------------------------------------------
@pytest.mark.parametrize("start_in_train_mode", [True, False])
def test_train_leaves_the_model_in_the_mode_the_trainer_leaves_it(tmp_path, start_in_train_mode):
    # the ZO passes run in eval mode, and the model stayed there after train(); Trainer leaves it in
    # train mode (its training_step calls model.train()), whatever mode it came in
    reference = tiny_causal_lm("llama", vocab_size=VOCAB).train(start_in_train_mode)
    transformers.Trainer(reference, training_args(tmp_path / "hf", max_steps=1),
                         data_collator=hf.CausalLMCollator(0), train_dataset=memorisable_rows()).train()
    model = tiny_causal_lm("llama", vocab_size=VOCAB).train(start_in_train_mode)
    trainer_for(tmp_path, model=model, args=training_args(tmp_path, max_steps=1), method="mezo").train()
    assert reference.training
    assert [m.training for m in model.modules()] == [m.training for m in reference.modules()]


def test_a_failed_step_still_leaves_the_model_in_train_mode(tmp_path):
    calls = []

    def failing_loss(outputs, inputs):       # fine for the pre-training check, raises in the first step
        calls.append(1)
        if len(calls) > 1:
            raise RuntimeError("boom")
        return hf.causal_lm_losses(outputs.logits, inputs["labels"])

    model = tiny_causal_lm("llama", vocab_size=VOCAB).train()
    with pytest.raises(RuntimeError, match="boom"):
        trainer_for(tmp_path, model=model, per_example_loss=failing_loss, method="mezo").train()
    assert model.training


# -- load_best_model_at_end with float32 master weights ------------------------------------------
def test_load_best_model_at_end_moves_the_float32_master_to_the_best_weights(tmp_path):
    order = iter(range(100))

    def first_is_best(_):                    # the first evaluation is the best one: checkpoint-1
        return {"order": next(order)}

    args = training_args(tmp_path, max_steps=3, learning_rate=1e-2, eval_strategy="steps", eval_steps=1,
                         save_strategy="steps", save_steps=1, load_best_model_at_end=True,
                         metric_for_best_model="order", greater_is_better=False)
    model = tiny_causal_lm("llama", vocab_size=VOCAB, dtype=torch.bfloat16)
    trainer = trainer_for(tmp_path, model=model, args=args, compute_metrics=first_is_best)
    trainer.train()
    best = tmp_path / "out" / "checkpoint-1"
    assert trainer.state.best_model_checkpoint == str(best)
    saved = torch.load(best / hf.ZO_STATE_NAME, weights_only=True)["master"]
    master = trainer._master
    for t, s, p in zip(master.tensors, saved, master.params):
        assert torch.equal(t, s)             # it kept the last step's weights: the next sync undid the load
        assert torch.equal(p, s.to(p.dtype))


# -- resuming with other settings ---------------------------------------------------------------
@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory):
    root = tmp_path_factory.mktemp("run")
    args = training_args(root, max_steps=2, save_strategy="steps", save_steps=2, lr_scheduler_type="linear")
    trainer_for(root, args=args).train()
    return root / "out" / "checkpoint-2"


@pytest.mark.parametrize("change, name", [
    (dict(args_change=dict(learning_rate=1e-1)), "learning_rate"),
    (dict(args_change=dict(weight_decay=0.1)), "weight_decay"),
    (dict(eps=1e-2), "eps"),
    (dict(perturbation="rademacher"), "perturbation"),
    (dict(zo_seed=7), "zo_seed"),
    (dict(args_change=dict(seed=7)), "zo_seed"),            # zo_seed defaults to args.seed
    (dict(args_change=dict(data_seed=7)), "data_seed"),
    (dict(ema_decay=0.5), "ema_decay"),
    (dict(uniform_mix=0.3), "uniform_mix"),
])
def test_resuming_with_other_settings_is_refused_not_overridden(tmp_path, checkpoint, change, name):
    # the checkpoint's optimizer.pt, scheduler.pt and sampler state silently put the old values back
    change = dict(change)
    args = training_args(tmp_path, max_steps=4, lr_scheduler_type="linear", **change.pop("args_change", {}))
    trainer = trainer_for(tmp_path, args=args, **change)
    before = weights(trainer.model)
    with pytest.raises(ValueError, match=f"Invalid {name}"):
        trainer.train(resume_from_checkpoint=str(checkpoint))
    assert all(torch.equal(weights(trainer.model)[k], v) for k, v in before.items())   # nothing loaded


@pytest.mark.parametrize("missing", ["optimizer.pt", "scheduler.pt"])
def test_a_checkpoint_without_the_optimizer_or_scheduler_state_is_refused(tmp_path, checkpoint, missing):
    # the Trainer loads both files or neither: MeZO's step count and seed restarted silently
    copied = tmp_path / "checkpoint-2"
    shutil.copytree(checkpoint, copied)
    os.remove(copied / missing)
    trainer = trainer_for(tmp_path, args=training_args(tmp_path, max_steps=4, lr_scheduler_type="linear"))
    with pytest.raises(ValueError, match=f"Invalid checkpoint: .* has no {missing}"):
        trainer.train(resume_from_checkpoint=str(copied))


# -- zo_queries ----------------------------------------------------------------------------------
def test_zo_queries_count_on_over_a_second_train_call(tmp_path):
    # global_step restarts at 0 on a second train(); MeZO and the model go on: the count did restart
    trainer = trainer_for(tmp_path, args=training_args(tmp_path, max_steps=2, logging_steps=1), method="mezo")
    trainer.train()
    assert queries_logged(trainer) == [8, 16]              # B = 4: 2·B per step
    trainer.train()
    assert queries_logged(trainer) == [24, 32]
    assert trainer.zo_optimizer.step_count == 4


def test_zo_queries_resume_from_the_checkpoints_count_when_the_batch_size_changes(tmp_path, checkpoint):
    # it was 2·B·global_step with the new B, as if the checkpoint's steps had used it
    args = training_args(tmp_path, max_steps=4, lr_scheduler_type="linear", per_device_train_batch_size=2)
    trainer = trainer_for(tmp_path, args=args)
    trainer.train(resume_from_checkpoint=str(checkpoint))
    assert queries_logged(trainer) == [2 * 4 * 2, 2 * 4 * 2 + 2 * (2 * 2)]   # logged at steps 2 and 4


def test_a_checkpoint_from_before_the_query_count_still_resumes(tmp_path, checkpoint):
    copied = tmp_path / "checkpoint-2"
    shutil.copytree(checkpoint, copied)
    state = torch.load(copied / hf.ZO_STATE_NAME, weights_only=True)
    del state["queries"]
    torch.save(state, copied / hf.ZO_STATE_NAME)
    trainer = trainer_for(tmp_path, args=training_args(tmp_path, max_steps=4, lr_scheduler_type="linear"))
    trainer.train(resume_from_checkpoint=str(copied))
    assert queries_logged(trainer) == [2 * 4 * 2, 2 * 4 * 4]     # 2·B per step before the checkpoint


# -- sampler settings a method does not use ------------------------------------------------------
@pytest.mark.parametrize("method", ["mezo", "uniform"])
@pytest.mark.parametrize("setting", [dict(ema_decay=0.5), dict(uniform_mix=0.2)])
def test_sampler_settings_are_refused_with_uniform_batches(tmp_path, method, setting):
    with pytest.raises(ValueError, match=f"Invalid {next(iter(setting))}"):
        trainer_for(tmp_path, method=method, **setting)


def test_sampler_settings_still_set_sazo(tmp_path):
    trainer = trainer_for(tmp_path, method="sazo-plain", ema_decay=0.5, uniform_mix=0.2)
    assert (trainer.zo_sampler.ema_decay, trainer.zo_sampler.uniform_mix) == (0.5, 0.2)
    default = trainer_for(tmp_path, method="sazo").zo_sampler
    assert (default.ema_decay, default.uniform_mix) == (0.9, 0.1)


# -- model_init: every train() is a new run ------------------------------------------------------
def test_with_model_init_a_second_train_call_reruns_the_first(tmp_path):
    # model, MeZO and the lr schedule start again from the same seeds; the sampler went on from the
    # first run's state, so the second run drew other batches and ended elsewhere
    trainer = hf.ZOTrainer(model_init=lambda: tiny_causal_lm("llama", vocab_size=VOCAB),
                           args=training_args(tmp_path, max_steps=3), train_dataset=memorisable_rows())
    trainer.train()
    first, losses = weights(trainer.model), [e.get("loss") for e in trainer.state.log_history]
    trainer.train()
    assert [e.get("loss") for e in trainer.state.log_history] == losses
    assert all(torch.equal(weights(trainer.model)[k], v) for k, v in first.items())


# -- weight decay: not on biases and norms, as in the Trainer ------------------------------------
def one_step_weights(tmp_path, weight_decay):
    model = tiny_causal_lm("llama", vocab_size=VOCAB)
    trainer_for(tmp_path, model=model, method="mezo",
                args=training_args(tmp_path, max_steps=1, weight_decay=weight_decay)).train()
    return model


def test_weight_decay_skips_norms_and_biases_as_in_the_trainer(tmp_path):
    # every tensor was decayed; the Trainer's AdamW (and MeZO's reference code) skip biases and norms
    plain, decayed = one_step_weights(tmp_path / "a", 0.0), one_step_weights(tmp_path / "b", 0.1)
    trainer = hf.ZOTrainer(plain, training_args(tmp_path))
    names = set(trainer.get_decay_parameter_names(plain))
    a, b = dict(plain.named_parameters()), dict(decayed.named_parameters())
    assert names and set(a) - names                        # both kinds are there
    for name in a:                                          # same z for every tensor, decay only where named
        assert torch.equal(a[name], b[name]) == (name not in names), name


def test_a_checkpoint_whose_groups_differ_is_refused_before_anything_loads(tmp_path):
    # a checkpoint written before the decay groups (one group, weight_decay > 0) could not load
    args = training_args(tmp_path, max_steps=2, save_strategy="steps", save_steps=2, weight_decay=0.1)
    trainer_for(tmp_path, args=args).train()
    path = tmp_path / "out" / "checkpoint-2" / "optimizer.pt"
    state = torch.load(path, weights_only=True)
    groups = state["param_groups"]
    state["param_groups"] = [{**groups[0], "params": [k for g in groups for k in g["params"]]}]
    torch.save(state, path)
    again = trainer_for(tmp_path / "again", args=training_args(tmp_path / "again", max_steps=4, weight_decay=0.1))
    before = weights(again.model)
    with pytest.raises(ValueError, match="Invalid checkpoint: its optimizer groups"):
        again.train(resume_from_checkpoint=str(path.parent))
    assert all(torch.equal(weights(again.model)[k], v) for k, v in before.items())


# -- arguments the Trainer honours that were accepted and ignored -------------------------------
@pytest.mark.parametrize("name, value", [("adam_beta1", 0.8), ("adam_beta2", 0.98), ("adam_epsilon", 1e-6)])
def test_adam_settings_are_refused_not_ignored(tmp_path, name, value):
    with pytest.raises(ValueError, match=f"Invalid {name}"):
        trainer_for(tmp_path, args=training_args(tmp_path, **{name: value}))


def test_dataloader_drop_last_makes_an_epoch_the_full_batches_only(tmp_path):
    # 10 examples, B = 4: the Trainer's epoch is 2 batches with drop_last; the ZO epoch was 3 steps
    args = training_args(tmp_path, max_steps=-1, num_train_epochs=1, dataloader_drop_last=True)
    trainer = trainer_for(tmp_path, rows=memorisable_rows(n=10), args=args, method="mezo")
    trainer.train()
    assert trainer.state.global_step == 2


# -- master weights of a float64 model survive a resume ------------------------------------------
def test_a_float64_model_with_master_weights_resumes_where_a_straight_run_goes(tmp_path):
    # Float32Master keeps a float64 tensor's master in float64 (its low bits); the resume check
    # wanted float32 masters and refused the checkpoint it had just written
    def run(root, steps, resume=None):
        model = tiny_causal_lm("llama", vocab_size=VOCAB, dtype=torch.float64)
        args = training_args(root, max_steps=steps, save_strategy="steps", save_steps=2)
        trainer = trainer_for(root, model=model, args=args, master_weights=True)
        trainer.train(resume_from_checkpoint=resume)
        return model, trainer

    straight, _ = run(tmp_path / "straight", 4)
    run(tmp_path / "first", 2)
    resumed, trainer = run(tmp_path / "first", 4, resume=str(tmp_path / "first" / "out" / "checkpoint-2"))
    assert all(t.dtype == torch.float64 for t in trainer._master.tensors)
    for a, b in zip(straight.parameters(), resumed.parameters()):
        assert torch.equal(a, b)


@pytest.mark.parametrize("value, refused", [(0.5, True), (1.0, False), (0.0, False)])
def test_max_grad_norm_other_than_its_default_is_refused_not_ignored(tmp_path, value, refused):
    # it was accepted and ignored (ZO steps never clip): a user asking for clipping got none, silently
    args = training_args(tmp_path, max_grad_norm=value)
    if refused:
        with pytest.raises(ValueError, match="Invalid max_grad_norm"):
            trainer_for(tmp_path, args=args)
    else:
        trainer_for(tmp_path, args=args)

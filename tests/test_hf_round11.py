"""ZOTrainer red-team round 11: what a Hugging Face user does with a Trainer, through ZOTrainer.

One test per defect (each fails on the code before the fix). Tiny random models, rows in memory.
"""
import warnings

import pytest
import torch

transformers = pytest.importorskip("transformers")

from sazo_lite.llm.models import tiny_causal_lm  # noqa: E402
from test_hf import VOCAB, _OnFirstUse, lora_model, memorisable_rows, training_args  # noqa: E402
from test_hostile_trainer import TupleLM  # noqa: E402

hf = _OnFirstUse("sazo_lite.hf")
transformers.logging.set_verbosity_error()


def own_losses(outputs, inputs):
    """Per-example losses for a model whose outputs are a tuple, a tensor or a mapping."""
    if isinstance(outputs, torch.Tensor):
        logits = outputs
    elif isinstance(outputs, tuple):
        logits = outputs[0]
    else:
        logits = outputs["logits"]
    return hf.causal_lm_losses(logits, inputs["labels"])


class TensorLM(TupleLM):
    """A causal LM whose forward returns the logits tensor itself."""

    def forward(self, input_ids, attention_mask=None):
        return super().forward(input_ids, attention_mask)[0]


class DictLM(TupleLM):
    """A causal LM whose forward returns a plain dict {"logits": ...} (no loss: no labels given)."""

    def forward(self, input_ids, attention_mask=None):
        return {"logits": super().forward(input_ids, attention_mask)[0]}


def expected_logits(model, rows):
    batch = hf.CausalLMCollator(0)(rows)
    with torch.no_grad():
        out = model(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"])
    return out[0] if isinstance(out, tuple) else out if isinstance(out, torch.Tensor) else out["logits"]


# -- predictions of models whose outputs are a tuple or a tensor ---------------------------------
@pytest.mark.parametrize("make", [TupleLM, TensorLM], ids=["tuple", "tensor"])
def test_predict_and_compute_metrics_get_the_logits_of_a_tuple_or_tensor_model(tmp_path, make):
    # compute_loss returned the model's outputs, and the Trainer takes outputs[1:] as the logits
    # (the first entry is the loss in its convention): a tuple model's predictions were (), a
    # tensor model's lost their first row
    rows = memorisable_rows(n=6)                       # one length: the logits need no padding
    seen = []

    def metrics(prediction):
        seen.append(prediction.predictions)
        return {}

    model = make()
    trainer = hf.ZOTrainer(model, training_args(tmp_path, max_steps=1, per_device_eval_batch_size=4),
                           train_dataset=rows, per_example_loss=own_losses, compute_metrics=metrics)
    trainer.train()
    predicted = trainer.predict(rows)
    logits = expected_logits(model, rows)
    assert torch.allclose(torch.as_tensor(predicted.predictions), logits, atol=1e-6)
    assert torch.allclose(torch.as_tensor(seen[-1]), logits, atol=1e-6)
    assert predicted.metrics["test_loss"] == pytest.approx(float(own_losses(logits, {"labels": torch.tensor(
        [r["labels"] for r in rows])}).mean()), rel=1e-5)


# -- a model returning a plain dict --------------------------------------------------------------
def test_the_default_loss_reads_the_logits_of_a_model_returning_a_dict(tmp_path):
    # the default per_example_loss read outputs.logits only: a model returning {"logits": ...}
    # (the Trainer's own convention for dict outputs) was refused as "Invalid model"
    model = DictLM()
    before = [p.detach().clone() for p in model.parameters()]
    trainer = hf.ZOTrainer(model, training_args(tmp_path, max_steps=2), train_dataset=memorisable_rows())
    trainer.train()
    assert trainer.zo_optimizer.step_count == 2
    assert any(not torch.equal(a, p) for a, p in zip(before, model.parameters()))


# -- an evaluation-only ZOTrainer of a frozen model ------------------------------------------------
def test_a_frozen_model_can_be_evaluated_without_a_train_dataset(tmp_path):
    # PeftModel.from_pretrained loads adapters frozen (is_trainable=False): evaluating the saved
    # model with ZOTrainer was refused with "nothing to tune", although nothing was to be trained
    pytest.importorskip("peft")
    from peft import PeftModel

    rows = memorisable_rows(n=6)
    trainer = hf.ZOTrainer(lora_model(), training_args(tmp_path, max_steps=2, learning_rate=1e-2),
                           train_dataset=rows, eval_dataset=rows)
    trainer.train()
    trained_loss = trainer.evaluate()["eval_loss"]
    trainer.save_model(str(tmp_path / "final"))
    loaded = PeftModel.from_pretrained(tiny_causal_lm("llama", vocab_size=VOCAB), str(tmp_path / "final"))
    assert not any(p.requires_grad for p in loaded.parameters())
    again = hf.ZOTrainer(loaded, training_args(tmp_path / "again"), eval_dataset=rows)
    assert again.evaluate()["eval_loss"] == pytest.approx(trained_loss, rel=1e-6)
    with pytest.raises(ValueError, match="nothing to tune"):     # training it is still refused
        hf.ZOTrainer(loaded, training_args(tmp_path / "again"), train_dataset=rows)


# -- eval_loss of a half-precision per_example_loss ----------------------------------------------
def test_eval_loss_is_the_float32_mean_of_a_half_precision_per_example_loss(tmp_path):
    # training averages the losses in float32; evaluation took their mean in bfloat16 (3 digits)
    def bf16_losses(outputs, inputs):
        return hf.causal_lm_losses(outputs.logits, inputs["labels"]).to(torch.bfloat16)

    rows = memorisable_rows(n=8)
    model = tiny_causal_lm("llama", vocab_size=VOCAB)
    trainer = hf.ZOTrainer(model, training_args(tmp_path, per_device_eval_batch_size=8), train_dataset=rows,
                           eval_dataset=rows, per_example_loss=bf16_losses)
    batch = hf.CausalLMCollator(0)(rows)
    with torch.no_grad():
        losses = bf16_losses(model(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"]), batch)
    assert trainer.evaluate()["eval_loss"] == pytest.approx(float(losses.float().mean()), rel=1e-6)


# -- resuming from a save_only_model checkpoint --------------------------------------------------
def test_resuming_a_save_only_model_checkpoint_says_why_it_cannot(tmp_path):
    # the refusal said "not written by ZOTrainer?" of a checkpoint ZOTrainer had just written
    rows = memorisable_rows()
    args = training_args(tmp_path, max_steps=2, save_strategy="steps", save_steps=2, save_only_model=True)
    hf.ZOTrainer(tiny_causal_lm("llama", vocab_size=VOCAB), args, train_dataset=rows).train()
    again = hf.ZOTrainer(tiny_causal_lm("llama", vocab_size=VOCAB), training_args(tmp_path, max_steps=4),
                         train_dataset=rows)
    with pytest.raises(ValueError, match="save_only_model"):
        again.train(resume_from_checkpoint=True)
    assert again.state.global_step == 0


# -- the pin_memory warning on machines without an accelerator ----------------------------------
def has_accelerator() -> bool:
    accelerator = getattr(torch, "accelerator", None)
    return accelerator.is_available() if accelerator is not None else torch.cuda.is_available()


def test_no_pin_memory_warning_without_an_accelerator_and_the_users_args_unchanged(tmp_path):
    # dataloader_pin_memory defaults to True: without an accelerator torch ignores it and warned
    # "'pin_memory' argument is set as true but no accelerator is found" at every evaluation
    rows = memorisable_rows(n=4)
    args = transformers.TrainingArguments(str(tmp_path / "out"), max_steps=1, per_device_train_batch_size=2,
                                          report_to=[], disable_tqdm=True)
    assert args.dataloader_pin_memory
    trainer = hf.ZOTrainer(tiny_causal_lm("llama", vocab_size=VOCAB), args, train_dataset=rows, eval_dataset=rows)
    assert args.dataloader_pin_memory                       # the user's object is left as it was
    assert trainer.args.dataloader_pin_memory == has_accelerator()
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        trainer.train()
        trainer.evaluate()
    assert not [w for w in caught if "pin_memory" in str(w.message)]


def test_an_explicit_pin_memory_false_is_kept(tmp_path):
    args = training_args(tmp_path, dataloader_pin_memory=False)
    trainer = hf.ZOTrainer(tiny_causal_lm("llama", vocab_size=VOCAB), args, train_dataset=memorisable_rows())
    assert trainer.args is args and not trainer.args.dataloader_pin_memory


# -- hyperparameter_search -----------------------------------------------------------------------
class Trial:
    """What the Trainer reads of an optuna trial: its number and (through hp_space) its values."""

    def __init__(self, number, params):
        self.number, self.params = number, params


def search(trainer, monkeypatch, trials):
    """``hyperparameter_search``'s optuna loop (transformers' ``run_hp_search_optuna``: train the
    trial, evaluate, release the model) over the given trial values, without optuna installed."""
    from accelerate.utils.memory import release_memory
    from transformers.trainer_utils import HPSearchBackend, default_compute_objective

    monkeypatch.setattr(transformers.integrations, "hp_params", lambda trial: trial.params)
    trainer.hp_search_backend, trainer.hp_space = HPSearchBackend.OPTUNA, (lambda trial: trial.params)
    trainer.compute_objective = default_compute_objective
    steps = []
    for number, params in enumerate(trials):
        trainer.train(trial=Trial(number, params))
        steps.append(trainer.zo_optimizer.step_count)
        trainer.evaluate()
        trainer.model_wrapped, trainer.model = release_memory(trainer.model_wrapped, trainer.model)
    return steps


def search_trainer(tmp_path, method="mezo", **kwargs):
    return hf.ZOTrainer(model_init=lambda *trial: tiny_causal_lm("llama", vocab_size=VOCAB),
                        args=training_args(tmp_path, max_steps=2), train_dataset=memorisable_rows(),
                        eval_dataset=memorisable_rows(n=4), method=method, **kwargs)


def test_a_hyperparameter_search_runs_every_trial(tmp_path, monkeypatch):
    # the search releases each trial's model; train() ran its check forward on self.model = None
    # before model_init built the next one: AttributeError at the second trial
    trainer = search_trainer(tmp_path)
    assert search(trainer, monkeypatch, [{"learning_rate": 1e-3}, {"learning_rate": 2e-3}]) == [2, 2]


def test_a_trials_seed_seeds_the_directions_and_the_sampler(tmp_path, monkeypatch):
    # zo_seed defaults to args.seed, and the sampler's seed to zo_seed + 1; a trial's seed
    # changed args.seed but every trial kept the seeds of __init__ (the same z and batches)
    trainer = search_trainer(tmp_path / "search")
    search(trainer, monkeypatch, [{"seed": 7}])
    plain = hf.ZOTrainer(tiny_causal_lm("llama", vocab_size=VOCAB), training_args(tmp_path, max_steps=2, seed=7),
                         train_dataset=memorisable_rows(), method="mezo")
    plain.train()
    assert trainer.zo_seed == 7
    ours, theirs = trainer.zo_optimizer.state_dict()["state"][0], plain.zo_optimizer.state_dict()["state"][0]
    assert (ours["seed"], ours["step"]) == (theirs["seed"], theirs["step"])
    a, b = trainer.zo_sampler.state_dict(), plain.zo_sampler.state_dict()   # uniform: depends on its seed only
    assert a.keys() == b.keys() and all(
        torch.equal(a[k], b[k]) if isinstance(a[k], torch.Tensor) else a[k] == b[k] for k in a)


def test_a_given_zo_seed_is_kept_in_every_trial(tmp_path, monkeypatch):
    trainer = search_trainer(tmp_path, zo_seed=3)
    search(trainer, monkeypatch, [{"seed": 7}])
    assert trainer.zo_seed == 3 and trainer.zo_sampler.seed == 4


def test_a_trials_settings_are_checked_as_in_init(tmp_path, monkeypatch):
    # a trial's gradient_accumulation_steps=2 (refused by __init__) ran two ZO steps per step
    trainer = search_trainer(tmp_path)
    with pytest.raises(ValueError, match="Invalid gradient_accumulation_steps"):
        search(trainer, monkeypatch, [{"gradient_accumulation_steps": 2}])
    assert trainer.optimizer is None and trainer.state.global_step == 0


def test_a_trials_new_accelerator_has_no_loss_scaler(tmp_path, monkeypatch):
    # accelerate gives fp16 runs on a GPU a GradScaler, whose step() asserts when no parameter
    # has a gradient; __init__ dropped it, but each trial builds a new accelerator. Here an
    # Accelerator that always builds one stands in for a GPU with fp16.
    import transformers.trainer as trainer_module

    class ScalingAccelerator(trainer_module.Accelerator):
        def __init__(self, *args, **kwargs):
            super().__init__(*args, **kwargs)
            self.scaler = torch.amp.GradScaler("cpu")

    monkeypatch.setattr(trainer_module, "Accelerator", ScalingAccelerator)
    trainer = search_trainer(tmp_path)
    assert search(trainer, monkeypatch, [{"learning_rate": 1e-3}]) == [2]
    assert trainer.accelerator.scaler is None


def test_a_real_optuna_search_runs(tmp_path):
    optuna = pytest.importorskip("optuna")
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    trainer = search_trainer(tmp_path)
    best = trainer.hyperparameter_search(hp_space=lambda trial: {"seed": trial.suggest_int("seed", 1, 9)},
                                         n_trials=2, backend="optuna")
    assert best.hyperparameters["seed"] in range(1, 10)


# -- the default collator on a classification dataset ---------------------------------------------
@pytest.mark.parametrize("label", [1, torch.tensor(1)], ids=["int", "0-d tensor"])
def test_the_default_collator_names_the_fix_for_rows_with_one_label(tmp_path, label):
    # rows {"input_ids", "labels": 1} (sequence classification) with no data_collator failed as
    # "Invalid data_collator: ... TypeError: 'int' object is not iterable", naming a collator the
    # user never gave and not saying what to do
    from test_hostile_trainer import seq_classifier

    rows = [{"input_ids": [5, 6, 7], "labels": label}, {"input_ids": [8, 9], "labels": label}]
    trainer = hf.ZOTrainer(seq_classifier(), training_args(tmp_path), train_dataset=rows,
                           per_example_loss=lambda out, inputs: out.logits[:, 0])
    with pytest.raises(ValueError, match="Invalid labels: row 0 has one label .* pass a data_collator"):
        trainer.train()
    assert trainer.state.global_step == 0


# -- a model whose labels are not named "labels" -----------------------------------------------------
def test_a_question_answering_models_label_names_are_kept_and_never_fed_to_its_forwards(tmp_path):
    # the Trainer names a QA model's labels start_positions and end_positions; ZOTrainer replaced
    # them by ["labels"]: evaluate() then computed no eval_loss, and every ZO pass gave the
    # positions to forward, which computed its own loss each time
    config = transformers.LlamaConfig(vocab_size=VOCAB, hidden_size=16, intermediate_size=32, num_hidden_layers=1,
                                      num_attention_heads=2, num_key_value_heads=1, pad_token_id=0)
    model = transformers.LlamaForQuestionAnswering(config)
    g = torch.Generator().manual_seed(0)
    rows = [{"input_ids": torch.randint(3, VOCAB, (6,), generator=g).tolist(), "start_positions": i % 6,
             "end_positions": (i + 2) % 6} for i in range(8)]

    def collate(batch_rows):
        return {name: torch.tensor([row[name] for row in batch_rows]) for name in rows[0]}

    def span_losses(outputs, inputs):
        ce = torch.nn.functional.cross_entropy
        return (ce(outputs.start_logits, inputs["start_positions"], reduction="none")
                + ce(outputs.end_logits, inputs["end_positions"], reduction="none")) / 2

    given = []
    model.register_forward_pre_hook(lambda module, args, kwargs: given.append(set(kwargs)), with_kwargs=True)
    trainer = hf.ZOTrainer(model, training_args(tmp_path, max_steps=2, per_device_eval_batch_size=8),
                           train_dataset=rows, eval_dataset=rows, data_collator=collate, per_example_loss=span_losses)
    trainer.train()
    metrics = trainer.evaluate()
    assert given and all(names == {"input_ids"} for names in given)
    with torch.no_grad():
        expected = span_losses(model.eval()(input_ids=collate(rows)["input_ids"]), collate(rows)).mean()
    assert metrics["eval_loss"] == pytest.approx(float(expected), rel=1e-5)


# -- resuming a reduce_lr_on_plateau run with another learning rate --------------------------------
PLATEAU = dict(lr_scheduler_type="reduce_lr_on_plateau", eval_strategy="steps", eval_steps=1)


def plateau_checkpoint(tmp_path):
    rows = memorisable_rows()
    args = training_args(tmp_path, max_steps=2, save_strategy="steps", save_steps=2, **PLATEAU)
    hf.ZOTrainer(tiny_causal_lm("llama", vocab_size=VOCAB), args, train_dataset=rows, eval_dataset=rows).train()
    return tmp_path / "out" / "checkpoint-2"


def plateau_trainer(tmp_path, **change):
    rows = memorisable_rows()
    return hf.ZOTrainer(tiny_causal_lm("llama", vocab_size=VOCAB),
                        training_args(tmp_path / "again", max_steps=4, **PLATEAU, **change),
                        train_dataset=rows, eval_dataset=rows)


def test_resuming_a_plateau_schedule_with_another_learning_rate_is_refused(tmp_path):
    # the check compared the lr with the param groups' initial_lr, which ReduceLROnPlateau never
    # sets: the new lr was silently replaced by the checkpoint's (0.5 asked, 0.002 used)
    checkpoint = plateau_checkpoint(tmp_path)
    trainer = plateau_trainer(tmp_path, learning_rate=0.5)
    with pytest.raises(ValueError, match="Invalid learning_rate: 0.5"):
        trainer.train(resume_from_checkpoint=str(checkpoint))
    assert trainer.optimizer is None and trainer.state.global_step == 0


def test_a_plateau_checkpoint_from_before_round_11_still_resumes(tmp_path):
    checkpoint = plateau_checkpoint(tmp_path)
    state = torch.load(checkpoint / hf.ZO_STATE_NAME, weights_only=True)
    assert state.pop("learning_rate") == 2e-3
    torch.save(state, checkpoint / hf.ZO_STATE_NAME)
    trainer = plateau_trainer(tmp_path)
    trainer.train(resume_from_checkpoint=str(checkpoint))
    assert trainer.zo_optimizer.step_count == 4

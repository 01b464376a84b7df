"""ZOTrainer red-team round 9: Trainer arguments and hooks that were accepted and then ignored.

One test per defect (each fails on the code before the fix). Tiny random models, rows in memory.
"""
import pytest
import torch

transformers = pytest.importorskip("transformers")

from sazo_lite.llm.models import tiny_causal_lm  # noqa: E402
from test_hf import VOCAB, _OnFirstUse, memorisable_rows, trainer_for, training_args, weights  # noqa: E402
from test_hostile_trainer import TupleLM  # noqa: E402

hf = _OnFirstUse("sazo_lite.hf")
transformers.logging.set_verbosity_error()


# -- loss hooks a step never calls -------------------------------------------------------------
def test_compute_loss_func_is_refused_not_ignored(tmp_path):
    # it was accepted, then never called (not in training, not in evaluation)
    def mean_loss(outputs, labels, num_items_in_batch=None):
        return outputs.logits.mean()

    with pytest.raises(ValueError, match="Invalid compute_loss_func"):
        trainer_for(tmp_path, compute_loss_func=mean_loss)


def test_a_compute_loss_override_is_refused_not_ignored(tmp_path):
    class Regularised(hf.ZOTrainer):        # training steps never called this: the penalty was lost
        def compute_loss(self, model, inputs, return_outputs=False, num_items_in_batch=None):
            loss = super().compute_loss(model, inputs, return_outputs, num_items_in_batch)
            return loss + sum(p.square().sum() for p in model.parameters())

    with pytest.raises(ValueError, match="Invalid compute_loss"):
        Regularised(tiny_causal_lm("llama", vocab_size=VOCAB), training_args(tmp_path),
                    train_dataset=memorisable_rows())


# -- labels --------------------------------------------------------------------------------------
def test_a_plain_module_keeps_its_labels_in_training_and_evaluates(tmp_path):
    rows = memorisable_rows(n=6, ragged=True)              # labels −100 on each prompt
    torch.manual_seed(0)
    model = TupleLM(as_tuple=False)                         # forward(input_ids, attention_mask): no labels
    seen = []

    def collator(batch_rows):
        seen.extend(batch_rows)
        return hf.CausalLMCollator(0)(batch_rows)

    trainer = hf.ZOTrainer(model, training_args(tmp_path, max_steps=2), data_collator=collator,
                           train_dataset=rows, eval_dataset=rows)
    trainer.train()
    assert seen and all("labels" in row for row in seen)    # the labels column was dropped before
    loss = trainer.evaluate()["eval_loss"]                  # it raised TypeError (labels passed to forward)
    batch = hf.CausalLMCollator(0)(rows)
    with torch.no_grad():
        expected = hf.causal_lm_losses(model(batch["input_ids"], batch["attention_mask"]).logits, batch["labels"])
    assert loss == pytest.approx(float(expected.mean()), rel=1e-5)


def test_label_names_without_labels_are_refused_with_the_default_loss(tmp_path):
    # the default loss scores "labels": rows labelled "target" were trained on their input ids
    rows = [{"input_ids": r["input_ids"], "target": r["labels"]} for r in memorisable_rows()]
    with pytest.raises(ValueError, match="Invalid label_names"):
        trainer_for(tmp_path, rows=rows, args=training_args(tmp_path, label_names=["target"]))


# -- sampling settings ---------------------------------------------------------------------------
def drawn_batches(tmp_path, **overrides):
    trainer = trainer_for(tmp_path, method="mezo", args=training_args(tmp_path, max_steps=3, **overrides))
    drawn, sample = [], trainer.zo_sampler.sample

    def recording(batch_size):
        indices, w = sample(batch_size)
        drawn.append(indices.tolist())
        return indices, w

    trainer.zo_sampler.sample = recording
    trainer.train()
    return drawn


def test_data_seed_seeds_the_sampler(tmp_path):
    # data_seed was ignored: every data_seed drew the batches of seed + 1
    a = drawn_batches(tmp_path / "a", seed=0, data_seed=5)
    b = drawn_batches(tmp_path / "b", seed=1, data_seed=5)      # other directions, same data order
    c = drawn_batches(tmp_path / "c", seed=0, data_seed=9)
    assert a == b and a != c
    assert drawn_batches(tmp_path / "d", seed=0) == drawn_batches(tmp_path / "e", seed=0, data_seed=1)


@pytest.mark.parametrize("strategy", ["sequential", "group_by_length"])
def test_a_train_sampling_strategy_the_sampler_ignores_is_refused(tmp_path, strategy):
    with pytest.raises(ValueError, match="Invalid train_sampling_strategy"):
        trainer_for(tmp_path, args=training_args(tmp_path, train_sampling_strategy=strategy))


def test_neftune_is_refused_not_ignored(tmp_path):
    # NEFTune adds noise only in train mode; ZO steps run in eval mode, so it never applied
    with pytest.raises(ValueError, match="Invalid neftune_noise_alpha"):
        trainer_for(tmp_path, args=training_args(tmp_path, neftune_noise_alpha=5.0))


# -- train() twice -------------------------------------------------------------------------------
def test_a_second_train_logs_only_its_own_steps(tmp_path):
    trainer = trainer_for(tmp_path, args=training_args(tmp_path, max_steps=3, logging_steps=2))
    trainer.train()                                         # step 3 is after the last log
    grads, step = [], trainer.zo_optimizer.step

    def recording(closure=None, weights=None):
        out = step(closure, weights)
        if out is not None:
            grads.append(abs(out.projected_grad))
        return out

    trainer.zo_optimizer.step = recording
    before = weights(trainer.model)
    trainer.train()
    assert any(not torch.equal(before[k], v) for k, v in weights(trainer.model).items())
    first = [entry for entry in trainer.state.log_history if "zo_projected_grad" in entry][-1]
    assert first["step"] == 2 and len(grads) == 3
    # it averaged in the first run's step 3 as well
    assert first["zo_projected_grad"] == pytest.approx(sum(grads[:2]) / 2, rel=1e-12)


# -- evaluation ------------------------------------------------------------------------------------
def test_evaluate_scores_custom_label_names_with_per_example_loss(tmp_path):
    # training minimised per_example_loss on inputs["target"]; evaluate() handed "target" to the
    # model's forward (the Trainer's own loss) and raised "The model did not return a loss"
    rows = [{"input_ids": r["input_ids"], "target": r["labels"]} for r in memorisable_rows(n=6, ragged=True)]

    def collator(batch_rows):
        batch = hf.CausalLMCollator(0)([{"input_ids": r["input_ids"], "labels": r["target"]} for r in batch_rows])
        return {"input_ids": batch["input_ids"], "attention_mask": batch["attention_mask"], "target": batch["labels"]}

    def target_losses(outputs, inputs):
        return hf.causal_lm_losses(outputs.logits, inputs["target"])

    trainer = trainer_for(tmp_path, rows=rows, data_collator=collator, per_example_loss=target_losses,
                          args=training_args(tmp_path, max_steps=2, label_names=["target"]))
    trainer.train()
    loss = trainer.evaluate()["eval_loss"]
    batch = collator(rows)
    with torch.no_grad():
        logits = trainer.model(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"]).logits
    assert loss == pytest.approx(float(hf.causal_lm_losses(logits, batch["target"]).mean()), rel=1e-5)


def test_model_init_gets_the_causal_lm_collator_and_trains_on_ragged_rows_as_a_given_model_does(tmp_path):
    rows = memorisable_rows(ragged=True)                       # lengths 6, 7, 8: the Trainer's default collator fails
    init = hf.ZOTrainer(None, training_args(tmp_path / "a"), train_dataset=rows, method="mezo",
                        model_init=lambda: tiny_causal_lm("llama", vocab_size=VOCAB))
    assert isinstance(init.data_collator, hf.CausalLMCollator)
    init.train()
    given = hf.ZOTrainer(tiny_causal_lm("llama", vocab_size=VOCAB), training_args(tmp_path / "b"), train_dataset=rows,
                         method="mezo")
    given.train()
    assert all(torch.equal(a, b) for a, b in zip(init.model.state_dict().values(), given.model.state_dict().values()))

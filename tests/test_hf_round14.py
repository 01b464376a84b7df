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

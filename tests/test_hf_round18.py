"""Round 18: ZOTrainer (trainer and distributed), on tiny random-init models (offline, fast)."""
import os
import subprocess
import sys

import pytest
import torch

transformers = pytest.importorskip("transformers")

from test_hf import hf, memorisable_rows, trainer_for, training_args, weights  # noqa: E402

transformers.logging.set_verbosity_error()


# -- check_ranks: the optimiser's weights compared across ranks -----------------------------------
def _as_rank_of_two(monkeypatch, other):
    """Rank 0 of a world of two whose rank 1 gathers ``other(mine)`` (no process group needed)."""
    from sazo_lite import distributed

    sent = []
    monkeypatch.setattr(distributed, "rank_and_world", lambda: (0, 2))
    monkeypatch.setattr(distributed, "_gathered", lambda mine, world: sent.append(mine) or [mine, other(mine)])
    return sent


def _other_weights(mine: str) -> str:
    """Rank 1's digest: the same batch, and (when one is sent) another optimiser digest."""
    return mine if ":" not in mine else mine[:-1] + ("0" if mine[-1] != "0" else "1")


def test_check_ranks_compares_every_ranks_optimiser_before_the_step(tmp_path, monkeypatch):
    """ZOTrainer called ``same_batch(indices)`` without ``optimizer=``: a rank whose weights differed (a checkpoint
    loaded on one rank alone) moved other weights by the common g, without a word, whatever the user asked."""
    trainer = trainer_for(tmp_path, args=training_args(tmp_path, max_steps=3), check_ranks=True)
    trainer.create_optimizer()
    before = weights(trainer.model)
    sent = _as_rank_of_two(monkeypatch, _other_weights)
    with pytest.raises(ValueError, match=r"Invalid optimizer: rank\(s\) \[1\]"):
        trainer.training_step(trainer.model, {"zo_step": torch.tensor([0])})
    assert len(sent) == 1 and len(sent[0]) == 64 + 1 + 64   # the batch's digest and MeZO's
    assert trainer.zo_optimizer.step_count == 0
    assert all(torch.equal(before[k], v) for k, v in weights(trainer.model).items())


def test_without_check_ranks_only_the_batch_is_compared(tmp_path, monkeypatch):
    """Off by default (one read of the tuned tensors per step): the gathered digest is the batch's alone."""
    trainer = trainer_for(tmp_path)
    trainer.create_optimizer()
    sent = _as_rank_of_two(monkeypatch, _other_weights)

    class Stop(Exception):
        pass

    import sazo_lite.hf

    monkeypatch.setattr(sazo_lite.hf, "shard", lambda *a: (_ for _ in ()).throw(Stop()))   # past the check: stop there
    with pytest.raises(Stop):
        trainer.training_step(trainer.model, {"zo_step": torch.tensor([0])})
    assert [len(s) for s in sent] == [64]


@pytest.mark.parametrize("value", [1, "yes", None])
def test_check_ranks_must_be_a_bool(tmp_path, value):
    with pytest.raises(ValueError, match="Invalid check_ranks"):
        trainer_for(tmp_path, check_ranks=value)


CHECK_RANKS_SCRIPT = '''
import sys
from pathlib import Path
import torch
import torch.distributed as dist
sys.path[:0] = [{tests!r}, {root!r}]   # this checkout's sazo_lite, not an installed one
import test_hf as t

out = Path(sys.argv[1])
rows = t.memorisable_rows(n=8)
args = t.training_args(out, max_steps=2, per_device_train_batch_size=2, ddp_backend="gloo", ddp_timeout=60)
same = t.trainer_for(out, rows=rows, args=args, method="sazo", check_ranks=True)
same.train()                                   # the same weights on both ranks: trains


class WriteOnRankOne(t.transformers.TrainerCallback):
    """After step 1, rank 1 alone writes a weight (DDP's wrapping broadcast rank 0's weights at the start)."""

    def on_step_end(self, args, state, control, model=None, **kwargs):
        if dist.get_rank() == 1 and state.global_step == 1:
            with torch.no_grad():
                next(p for p in model.parameters() if p.requires_grad).view(-1)[0] += 1e-3


apart = t.trainer_for(out, rows=rows, args=args, method="sazo", check_ranks=True, callbacks=[WriteOnRankOne()])
try:
    apart.train()
    error = None
except ValueError as caught:
    error = str(caught)
dist.barrier()
torch.save({{"steps": same.zo_optimizer.step_count, "error": error, "apart_steps": apart.zo_optimizer.step_count}},
           out / f"rank{{dist.get_rank()}}.pt")
dist.barrier()
dist.destroy_process_group()
sys.stdout.flush()
import os
os._exit(0)
'''


@pytest.mark.slow
def test_check_ranks_in_a_gloo_run_refuses_a_rank_with_other_weights(tmp_path):
    from test_distributed import free_port

    script = tmp_path / "run.py"
    script.write_text(CHECK_RANKS_SCRIPT.format(tests=os.path.dirname(__file__),
                                                root=os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    cmd = [sys.executable, "-m", "torch.distributed.run", "--nproc_per_node=2", "--master_addr=127.0.0.1",
           f"--master_port={free_port()}", str(script), str(tmp_path)]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=240, env=env, cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr[-3000:]
    for rank in range(2):
        result = torch.load(tmp_path / f"rank{rank}.pt")
        assert result["steps"] == 2
        assert result["error"] is not None and "Invalid optimizer: rank(s) [1]" in result["error"]
        assert result["apart_steps"] == 1   # the step after the write was refused on both ranks


# -- sequence classification (BERT-style) ---------------------------------------------------------
def _classifier(num_labels=3):
    config = transformers.BertConfig(vocab_size=64, hidden_size=32, num_hidden_layers=2, num_attention_heads=2,
                                     intermediate_size=64, num_labels=num_labels)
    torch.manual_seed(0)
    return transformers.BertForSequenceClassification(config).eval()


def _class_rows(n=8, label=lambda i: i % 3):
    return [{"input_ids": [1, 5 + i, 7, 9, 2][: 2 + i % 4], "labels": label(i)} for i in range(n)]


def _pad_rows(rows):
    """Right-pads token rows; one label per example (what DataCollatorWithPadding gives, without a tokenizer)."""
    n = max(len(r["input_ids"]) for r in rows)
    return {"input_ids": torch.tensor([r["input_ids"] + [0] * (n - len(r["input_ids"])) for r in rows]),
            "attention_mask": torch.tensor([[1] * len(r["input_ids"]) + [0] * (n - len(r["input_ids"])) for r in rows]),
            "labels": torch.tensor([r["labels"] for r in rows])}


def test_a_sequence_classifier_is_scored_by_each_examples_cross_entropy(tmp_path):
    """The default loss refused a BERT classifier's logits [B, C] with Python's "not enough values to unpack
    (expected 2, got 1)" (labels [B] read as [B, T]); each example's loss is now the model's own single-label
    cross-entropy, in training and in eval_loss."""
    rows = _class_rows()
    trainer = hf.ZOTrainer(_classifier(), training_args(tmp_path), train_dataset=rows, eval_dataset=rows,
                           data_collator=_pad_rows)
    expected = []
    for row in rows:   # the model's own loss, one example at a time
        with torch.no_grad():
            expected.append(float(trainer.model(**_pad_rows([row])).loss))
    assert trainer.evaluate()["eval_loss"] == pytest.approx(sum(expected) / len(expected), rel=1e-5)
    before = weights(trainer.model)
    trainer.train()
    assert trainer.zo_optimizer.step_count == 4
    assert any(not torch.equal(before[k], v) for k, v in weights(trainer.model).items())


def test_a_classifier_with_float_labels_or_an_unscored_example_is_refused_by_name(tmp_path):
    regression = _class_rows(label=lambda i: float(i))
    with pytest.raises(ValueError, match=r"Invalid model: .*classifier's logits \[B, C >= 2\] over integer labels"):
        hf.ZOTrainer(_classifier(1), training_args(tmp_path), train_dataset=regression,
                     data_collator=_pad_rows).train()
    one_logit = _class_rows(label=lambda i: 0)   # transformers regresses on one logit; its cross-entropy is 0
    with pytest.raises(ValueError, match=r"Invalid model: .*classifier's logits \[B, C >= 2\]"):
        hf.ZOTrainer(_classifier(1), training_args(tmp_path), train_dataset=one_logit, data_collator=_pad_rows).train()
    unscored = _class_rows(label=lambda i: -100 if i == 1 else i % 3)
    with pytest.raises(ValueError, match=r"Invalid labels: train_dataset examples \[1\] .*no scored token"):
        hf.ZOTrainer(_classifier(), training_args(tmp_path), train_dataset=unscored, data_collator=_pad_rows).train()


# -- full half-precision evaluation ---------------------------------------------------------------
@pytest.mark.parametrize("name", ["bf16_full_eval", "fp16_full_eval"])
def test_full_half_precision_eval_of_a_float32_model_is_refused(tmp_path, name):
    """A baseline ``evaluate()`` before ``train()`` cast the float32 model to bfloat16 in place (the Trainer's
    evaluation_loop outside training): its weights were rounded for good and training tuned the rounded model."""
    from sazo_lite.llm.models import tiny_causal_lm

    model = tiny_causal_lm("llama", vocab_size=64)
    before = weights(model)
    with pytest.raises(ValueError, match=f"Invalid {name}: True with a model in torch.float32"):
        trainer_for(tmp_path, model=model, args=training_args(tmp_path, **{name: True}))
    assert all(v.dtype == torch.float32 and torch.equal(before[k], v) for k, v in weights(model).items())


def test_full_bf16_eval_of_a_bf16_model_still_evaluates(tmp_path):
    from sazo_lite.llm.models import tiny_causal_lm

    trainer = trainer_for(tmp_path, model=tiny_causal_lm("llama", vocab_size=64, dtype=torch.bfloat16),
                          args=training_args(tmp_path, bf16_full_eval=True))
    assert torch.isfinite(torch.tensor(trainer.evaluate()["eval_loss"]))


# -- a dataset of splits --------------------------------------------------------------------------
def test_a_dict_of_splits_as_train_dataset_is_refused_by_name(tmp_path):
    """``load_dataset(...)`` without ``["train"]`` (a DatasetDict) was accepted with a sampler over 2 "examples"
    (its splits), and train() then failed with datasets' KeyError "Invalid key: 0" from inside the first check."""
    rows = memorisable_rows()
    splits = [{"train": rows, "test": rows}]
    datasets = pytest.importorskip("datasets")
    splits.append(datasets.DatasetDict({"train": datasets.Dataset.from_list(rows),
                                        "test": datasets.Dataset.from_list(rows)}))
    for data in splits:
        with pytest.raises(ValueError, match=r"Invalid train_dataset: a \w+ keyed \['test', 'train'\].*data\['train'\]"):
            trainer_for(tmp_path, rows=data)


@pytest.mark.parametrize("value", [1, 0, "yes", None])
def test_check_ranks_set_after_construction_is_checked_too(tmp_path, value):
    """``trainer.check_ranks = 1`` was taken and read by truthiness at each step: only the constructor checked it."""
    trainer = trainer_for(tmp_path, args=training_args(tmp_path, max_steps=1))
    with pytest.raises(ValueError, match="check_ranks"):
        trainer.check_ranks = value
    assert trainer.check_ranks is False
    trainer.check_ranks = True
    assert trainer.check_ranks is True

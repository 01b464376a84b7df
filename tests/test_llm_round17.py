"""Round 17 of the language-model package's and ZOTrainer's defects (sazo_lite.llm, sazo_lite.hf): each test
fails on the code before its fix."""
from __future__ import annotations

import pytest
import torch

transformers = pytest.importorskip("transformers")
peft = pytest.importorskip("peft")

from sazo_lite import distributed, hf  # noqa: E402
from sazo_lite.llm import tiny_causal_lm  # noqa: E402

VOCAB = 64


def rows_for(n=6):
    return [{"input_ids": [5 + k, 9, 11 + k, 4], "labels": [-100, 9, 11 + k, 4]} for k in range(n)]


def zo_trainer(tmp_path, model, max_steps=4, **overrides):
    settings = dict(max_steps=max_steps, per_device_train_batch_size=2, learning_rate=1e-2, save_strategy="no",
                    report_to=[], use_cpu=True, disable_tqdm=True, seed=0)
    args = transformers.TrainingArguments(str(tmp_path / "out"), **{**settings, **overrides})
    rows = rows_for()
    return hf.ZOTrainer(model, args, train_dataset=rows, eval_dataset=rows[:3], eps=1e-2)


def tuned(model):
    return [p.detach().clone() for p in model.parameters() if p.requires_grad]


# --- 1. ZOTrainer under data parallel: every rank must hold the same global batch ------------------------------------
def as_rank_of_two(monkeypatch, rank, other_digest):
    """This process as rank ``rank`` of 2 whose other rank's batch digest is ``other_digest`` (None: the same batch);
    the other rank's losses are this rank's again (the all-gather simulated)."""
    monkeypatch.setattr(distributed, "rank_and_world", lambda: (rank, 2))
    monkeypatch.setattr(hf, "rank_and_world", lambda: (rank, 2))
    digests = []

    def gathered(mine, world):
        digests.append(mine)
        other = mine if other_digest is None else other_digest
        return [mine, other] if rank == 0 else [other, mine]

    monkeypatch.setattr(distributed, "_gathered", gathered)
    monkeypatch.setattr(hf, "gather_losses", lambda mine: torch.cat([mine, mine]))
    return digests


@pytest.mark.parametrize("rank", [0, 1])
def test_zo_trainer_refuses_a_step_whose_ranks_drew_other_batches(tmp_path, monkeypatch, rank):
    # the Trainer's step sharded and gathered without the check distributed_closure makes: a rank whose sampler had
    # another seed or state evaluated other examples, and the losses of two batches were taken as one, silently
    model = tiny_causal_lm("llama", vocab_size=VOCAB)
    trainer = zo_trainer(tmp_path, model)
    as_rank_of_two(monkeypatch, rank, other_digest="0" * 64)
    start = tuned(model)
    with pytest.raises(ValueError, match=r"Invalid indices: rank\(s\) \[1\] drew another global batch"):
        trainer.train()
    assert trainer.zo_optimizer.step_count == 0
    assert all(torch.equal(a, b) for a, b in zip(tuned(model), start))


def test_zo_trainer_checks_the_batch_its_sampler_drew_and_steps_when_the_ranks_agree(tmp_path, monkeypatch):
    model = tiny_causal_lm("llama", vocab_size=VOCAB)
    trainer = zo_trainer(tmp_path, model, max_steps=2)
    drawn, sample = [], trainer.zo_sampler.sample
    trainer.zo_sampler.sample = lambda b: drawn.append(sample(b)) or drawn[-1]
    digests = as_rank_of_two(monkeypatch, 1, other_digest=None)
    trainer.train()
    assert trainer.zo_optimizer.step_count == 2
    assert digests == [distributed._batch_digest(indices) for indices, _ in drawn]


# --- 2. peft prefix tuning with prefix_projection: peft's own load of its checkpoint raises --------------------------
def prefix_tuned(family="llama"):
    config = peft.PrefixTuningConfig(task_type="CAUSAL_LM", num_virtual_tokens=3, prefix_projection=True,
                                     encoder_hidden_size=8)
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(0)
        return peft.get_peft_model(tiny_causal_lm(family, vocab_size=VOCAB), config)


@pytest.mark.parametrize("family", ["llama", "gpt2"])
def test_a_prefix_projection_run_resumes_bit_for_bit(tmp_path, family):
    # peft saves the projected prefix [3, 2·layers·width] and its load into the embedding [3, width] raised
    # (RuntimeError "size mismatch for weight"): such a run could not be resumed at all
    straight = prefix_tuned(family)
    zo_trainer(tmp_path, straight, save_strategy="steps", save_steps=2).train()
    resumed = prefix_tuned(family)
    zo_trainer(tmp_path, resumed, save_strategy="steps", save_steps=2).train(
        resume_from_checkpoint=str(tmp_path / "out" / "checkpoint-2"))
    assert not all(torch.equal(a, b) for a, b in zip(tuned(straight), tuned(prefix_tuned(family))))
    assert all(torch.equal(a, b) for a, b in zip(tuned(straight), tuned(resumed)))


def test_load_best_model_at_end_of_a_prefix_projection_run_holds_the_best_steps_tensors(tmp_path):
    # peft's load raised ValueError ("Cannot load flattened prompt embeddings") after the whole run
    model = prefix_tuned()
    trainer = zo_trainer(tmp_path, model, save_strategy="steps", save_steps=2, eval_strategy="steps", eval_steps=2,
                         load_best_model_at_end=True)
    trainer.train()
    best = int(trainer.state.best_model_checkpoint.rsplit("-", 1)[1])
    shorter = prefix_tuned()
    zo_trainer(tmp_path / "short", shorter, max_steps=best).train()
    assert all(torch.equal(a, b) for a, b in zip(tuned(model), tuned(shorter)))


def test_a_prefix_projection_checkpoint_without_its_tensors_is_refused_before_anything_loads(tmp_path):
    zo_trainer(tmp_path, prefix_tuned(), max_steps=2, save_strategy="steps", save_steps=2).train()
    path = tmp_path / "out" / "checkpoint-2" / "zo_state.pt"
    state = torch.load(path, weights_only=True)
    del state["tuned"]                      # as written before round 17
    torch.save(state, path)
    model = prefix_tuned()
    start = tuned(model)
    with pytest.raises(ValueError, match="Invalid checkpoint: .*holds no tuned tensors.*prefix_projection"):
        zo_trainer(tmp_path, model).train(resume_from_checkpoint=str(tmp_path / "out" / "checkpoint-2"))
    assert all(torch.equal(a, b) for a, b in zip(tuned(model), start))


# --- 3. vmap_grad_norms of a float64 model --------------------------------------------------------------------------
def float64_top_block():
    from sazo_lite.llm.losses import TokenBatch
    from sazo_lite.llm.topblock import top_block_parameters

    model = tiny_causal_lm("llama", vocab_size=VOCAB, dtype=torch.float64)
    params = top_block_parameters(model, 1)     # norms' weights too: not every tensor a Linear's
    batch = TokenBatch([[5, 6, 7, 8], [9, 10, 11, 12], [3, 4, 5, 6]], [4, 4, 4], 0, torch.tensor([0, 1, 0]),
                       torch.tensor([10, 11]))
    return model, params, batch


def test_vmap_norms_of_a_float64_model_are_float64_accurate():
    # the loss was cast to float32 (.float()): the norms were 3e-8 off the exact loop's, as a float32 model's
    from sazo_lite.llm.grad_norms import grad_norms

    model, params, batch = float64_top_block()
    vmapped, loop = grad_norms(model, batch, params, method="vmap"), grad_norms(model, batch, params, method="loop")
    assert torch.allclose(vmapped, loop, rtol=1e-12, atol=0)


def test_vmap_norms_count_a_float64_gradient_as_eight_bytes_an_entry():
    # chunks were sized at 4 bytes an entry: a float64 model's per-example gradients took twice max_bytes
    from sazo_lite.llm.grad_norms import vmap_grad_norms

    model, params, batch = float64_top_block()
    entries = sum(p.numel() for p in params)
    chunks, select = [], batch.select
    batch.select = lambda part, device: chunks.append(len(part)) or select(part, device)
    vmap_grad_norms(model, batch, params, max_bytes=8 * entries)
    assert chunks == [1, 1, 1]


def test_save_only_model_with_load_best_model_at_end_is_refused_for_prefix_projection(tmp_path):
    # the best checkpoint would hold the projected prefix only (no zo_state.pt): peft's load raised after the run
    model = prefix_tuned()
    start = tuned(model)
    with pytest.raises(ValueError, match="Invalid save_only_model: .*prefix_projection"):
        zo_trainer(tmp_path, model, save_strategy="steps", save_steps=2, eval_strategy="steps", eval_steps=2,
                   load_best_model_at_end=True, save_only_model=True)
    assert all(torch.equal(a, b) for a, b in zip(tuned(model), start))


# --- 4. examples the default loss scores no token of -----------------------------------------------------------------
UNSCORED = [{"input_ids": [5, 9, 11], "labels": [-100, -100, -100]},     # the answer truncated away
            {"input_ids": [7], "labels": [7]}]                           # one token: no position predicts it


def test_evaluate_refuses_examples_with_no_scored_token(tmp_path):
    # causal_lm_losses gives them 0: two of six such examples lowered eval_loss from 4.21 to 2.80, silently
    model = tiny_causal_lm("llama", vocab_size=VOCAB)
    trainer = zo_trainer(tmp_path, model, per_device_eval_batch_size=6)
    trainer.eval_dataset = rows_for(4) + UNSCORED
    with pytest.raises(ValueError, match=r"Invalid labels: rows \[4, 5\] of an evaluation batch have no scored token"):
        trainer.evaluate()
    trainer.eval_dataset = rows_for(4)
    assert trainer.evaluate()["eval_loss"] > 3.0


@pytest.mark.parametrize("unscored", UNSCORED)
def test_training_refuses_a_batch_with_an_example_of_no_scored_token_before_it_moves(tmp_path, unscored):
    model = tiny_causal_lm("llama", vocab_size=VOCAB)
    settings = dict(max_steps=4, per_device_train_batch_size=2, learning_rate=1e-2, save_strategy="no", report_to=[],
                    use_cpu=True, disable_tqdm=True, seed=0)
    args = transformers.TrainingArguments(str(tmp_path / "out"), **settings)
    trainer = hf.ZOTrainer(model, args, train_dataset=rows_for(2) + [unscored], eps=1e-2, method="mezo")
    start = tuned(model)
    with pytest.raises(ValueError, match=r"Invalid labels: train_dataset examples \[2\] at step \d+ have no scored"):
        trainer.train()
    moved = trainer.zo_optimizer.step_count
    assert trainer.state.global_step == moved and (moved or all(torch.equal(a, b) for a, b in zip(tuned(model), start)))


def test_a_first_label_is_scored_where_logits_at_t_score_label_t():
    # a masked LM's (or seq2seq model's) logits at t score label t: its first label is scored, no shift
    hf._check_scored(torch.tensor([[7, -100]]), [0], 1, shifted=False)
    with pytest.raises(ValueError, match="Invalid labels"):
        hf._check_scored(torch.tensor([[7, -100]]), [0], 1, shifted=True)


# --- 5. torch_empty_cache_steps: the Trainer's training_step honours it, ZOTrainer's replaced it ----------------------
def test_torch_empty_cache_steps_empties_the_cache_as_the_trainer_does(tmp_path, monkeypatch):
    # the setting was taken and ignored: ZOTrainer's training_step never emptied the device cache
    emptied = []
    monkeypatch.setattr(hf, "clear_device_cache", lambda: emptied.append(trainer.state.global_step))
    trainer = zo_trainer(tmp_path, tiny_causal_lm("llama", vocab_size=VOCAB), torch_empty_cache_steps=2)
    trainer.train()
    assert emptied == [0, 2]      # the Trainer's rule: global_step (the steps done before this one) % 2 == 0


# --- 6. learned positions after a prefix-tuning model's prefix ------------------------------------------------------
def gpt2_prefix_tuned():
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(0)
        config = peft.PrefixTuningConfig(task_type="CAUSAL_LM", num_virtual_tokens=3)
        return peft.get_peft_model(tiny_causal_lm("gpt2", vocab_size=VOCAB), config).eval()


def test_losses_count_a_prefix_in_the_learned_positions():
    # the prefix's keys and values come first, so GPT-2's 128 positions hold 125 tokens: 126 were torch's
    # IndexError ("index out of range in self") inside the forward, on a GPU a device-side assert
    from sazo_lite.llm.losses import TokenBatch, classification_losses

    model = gpt2_prefix_tuned()
    rows = (list(range(3, 63)) * 3)[:126]
    fits = TokenBatch([rows[:125]], [125], 0, torch.tensor([0]), torch.tensor([11, 12]))
    assert torch.isfinite(classification_losses(model, fits)).all()
    long = TokenBatch([rows], [126], 0, torch.tensor([0]), torch.tensor([11, 12]))
    with pytest.raises(ValueError, match="Invalid batch: an example of 126 tokens after 3 virtual tokens"):
        classification_losses(model, long)


def test_zo_trainer_counts_a_prefix_in_the_learned_positions_before_the_step(tmp_path):
    model = gpt2_prefix_tuned()
    long = (list(range(3, 63)) * 3)[:126]
    settings = dict(max_steps=8, per_device_train_batch_size=2, learning_rate=1e-2, save_strategy="no", report_to=[],
                    use_cpu=True, disable_tqdm=True, seed=0)
    args = transformers.TrainingArguments(str(tmp_path / "out"), **settings)
    rows = rows_for(2) + [{"input_ids": long, "labels": long}]
    trainer = hf.ZOTrainer(model, args, train_dataset=rows, eps=1e-2, method="mezo")
    start = tuned(model)
    with pytest.raises(ValueError, match=r"Invalid input_ids: train_dataset examples \[2\] at step \d+ make a batch "
                                         r"of 126 tokens after 3 virtual tokens"):
        trainer.train()
    if trainer.zo_optimizer.step_count == 0:
        assert all(torch.equal(a, b) for a, b in zip(tuned(model), start))


def test_losses_count_a_cartridge_in_the_learned_positions():
    from sazo_lite.llm.losses import TokenBatch, classification_losses

    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(0)
        config = peft.CartridgeConfig(task_type="CAUSAL_LM", num_virtual_tokens=3)
        model = peft.get_peft_model(tiny_causal_lm("gpt2", vocab_size=VOCAB), config).eval()
    rows = (list(range(3, 63)) * 3)[:126]
    long = TokenBatch([rows], [126], 0, torch.tensor([0]), torch.tensor([11, 12]))
    with pytest.raises(ValueError, match="Invalid batch: an example of 126 tokens after 3 virtual tokens"):
        classification_losses(model, long)

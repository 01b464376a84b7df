"""Round 16 of the language-model package's and ZOTrainer's defects (sazo_lite.llm, sazo_lite.hf): each test
fails on the code before its fix."""
from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

pytest.importorskip("transformers")
peft = pytest.importorskip("peft")

from sazo_lite.llm import tiny_causal_lm
from sazo_lite.llm.losses import TokenBatch, answer_losses, classification_losses
from sazo_lite.llm.topblock import TopBlocks, top_block_parameters

VOCAB = 64


# --- 1. peft prompt tuning: the logits cover the virtual tokens first -----------------------------------------------
def prompt_tuned(family, kind, virtual=3):
    config = (peft.PromptTuningConfig(task_type="CAUSAL_LM", num_virtual_tokens=virtual) if kind == "prompt tuning"
              else peft.PromptEncoderConfig(task_type="CAUSAL_LM", num_virtual_tokens=virtual, encoder_hidden_size=8))
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(1)
        return peft.get_peft_model(tiny_causal_lm(family, vocab_size=VOCAB), config).eval()


def classified(n=3):
    ids = [[5, 6, 7, 8], [9, 10], [3, 4, 5], [20, 21, 22, 23, 24]][:n]
    return TokenBatch(ids, [len(r) for r in ids], 0, torch.tensor([0, 1, 1, 0][:n]), torch.tensor([11, 12]))


def alone_classification(model, batch):
    """Each example alone, unpadded: the label words' logits at the model's last position."""
    out = []
    with torch.no_grad():
        for row, label in zip(batch.ids, batch.labels):
            logits = model(input_ids=torch.tensor([row])).logits[0, -1, batch.label_ids]
            out.append(F.cross_entropy(logits[None].float(), label[None]))
    return torch.stack(out)


@pytest.mark.parametrize("family", ["llama", "gpt2"])
@pytest.mark.parametrize("kind", ["prompt tuning", "p-tuning"])
def test_classification_losses_of_a_prompt_tuned_model_score_the_last_prompt_token(family, kind):
    # the logits are [B, P + T, V]: position len - 1 was a virtual token's or an earlier token's, silently
    model, batch = prompt_tuned(family, kind), classified()
    assert torch.allclose(classification_losses(model, batch), alone_classification(model, batch), atol=1e-5)


def test_answer_losses_of_a_prompt_tuned_model_are_peft_s_own_loss():
    # the answer loss raised inside cross_entropy ("Expected target size [2, 6], got [2, 3]")
    model = prompt_tuned("llama", "prompt tuning")
    batch = TokenBatch([[5, 6, 7, 8], [9, 10, 11]], [2, 1], 0)
    ours = answer_losses(model, batch)
    with torch.no_grad():
        for k, (row, start) in enumerate(zip(batch.ids, batch.prompt_lengths)):
            labels = [-100] * start + row[start:]
            own = model(input_ids=torch.tensor([row]), labels=torch.tensor([labels])).loss
            assert float(ours[k]) == pytest.approx(float(own), rel=1e-5)


def test_top_blocks_of_a_prompt_tuned_model_score_the_last_prompt_token():
    model, batch = prompt_tuned("llama", "prompt tuning"), classified(4)
    top_block_parameters(model, 1)      # the prompt frozen, the top block tuned
    top = TopBlocks(model, batch)
    assert torch.allclose(top(range(4)), alone_classification(model, batch), atol=1e-5)


def test_learned_positions_count_the_virtual_tokens():
    # GPT-2's 128 positions hold 126 tokens after 3 virtual ones, not 128 (torch's IndexError in the forward)
    model = prompt_tuned("gpt2", "prompt tuning")
    row = list(range(3, 63)) * 2 + [3, 4, 5, 6, 7, 8]
    long = TokenBatch([row], [126], 0, torch.tensor([0]), torch.tensor([11, 12]))
    with pytest.raises(ValueError, match="Invalid batch: an example of 126 tokens after 3 virtual tokens"):
        classification_losses(model, long)


# --- 2. ZOTrainer on peft adapters the forward does not read (merged, disabled) -------------------------------------
def lora_trainer(tmp_path, **overrides):
    import transformers

    from sazo_lite.hf import ZOTrainer
    from sazo_lite.llm.tuning import add_lora, trainable_parameters

    model = add_lora(tiny_causal_lm("llama", vocab_size=VOCAB), rank=2)
    with torch.no_grad():
        for p in trainable_parameters(model):
            p.normal_(0, 0.1)
    rows = [{"input_ids": [5 + k, 9, 11 + k, 4], "labels": [-100, 9, 11 + k, 4]} for k in range(6)]
    settings = dict(max_steps=2, per_device_train_batch_size=2, learning_rate=1e-2, lr_scheduler_type="constant",
                    save_strategy="no", report_to=[], use_cpu=True, disable_tqdm=True, seed=0)
    args = transformers.TrainingArguments(str(tmp_path / "out"), **{**settings, **overrides})
    return model, trainable_parameters(model), ZOTrainer(model, args, train_dataset=rows, method="mezo", eps=1e-2)


def test_zo_trainer_refuses_merged_adapters_before_training(tmp_path):
    # the forward ran the merged base weights: every step's δ was 0, and the adapters drifted by the passes' rounding
    model, params, trainer = lora_trainer(tmp_path)
    model.merge_adapter()
    start = [p.detach().clone() for p in params]
    with pytest.raises(ValueError, match="Invalid params: 8 of 8 .*does not read now"):
        trainer.train()
    assert all(torch.equal(p, s) for p, s in zip(params, start))
    model.unmerge_adapter()
    trainer.train()
    assert not all(torch.equal(p, s) for p, s in zip(params, start))


def test_zo_trainer_refuses_a_step_on_adapters_merged_mid_run(tmp_path):
    # merged by a callback after step 1: the engine's flat-loss warning judges only an optimiser's first steps
    from transformers import TrainerCallback

    class MergeAfterFirstStep(TrainerCallback):
        def on_step_end(self, args, state, control, **kwargs):
            if state.global_step == 1:
                model.merge_adapter()
                after_one.extend(p.detach().clone() for p in params)

    model, params, trainer = lora_trainer(tmp_path)
    after_one = []
    trainer.add_callback(MergeAfterFirstStep())
    with pytest.raises(ValueError, match="Invalid params: .*merged into the base weights"):
        trainer.train()
    assert trainer.zo_optimizer.step_count == 1
    model.unmerge_adapter()          # unmerging rounds the base weights, not the adapters
    assert all(torch.equal(p, s) for p, s in zip(params, after_one))


# --- 3. ZOTrainer's args edited after construction ------------------------------------------------------------------
@pytest.mark.parametrize("name, value", [("gradient_accumulation_steps", 2), ("label_smoothing_factor", 0.1),
                                         ("max_grad_norm", 0.5), ("adam_beta1", 0.5)])
def test_zo_trainer_checks_args_edited_after_construction_before_training(tmp_path, name, value):
    # gradient_accumulation_steps = 2 set on trainer.args: two ZO steps per global step (8 for max_steps=4), the
    # logged loss their sum; the others were dropped, as __init__ refuses them for
    model, params, trainer = lora_trainer(tmp_path)
    start = [p.detach().clone() for p in params]
    setattr(trainer.args, name, value)
    with pytest.raises(ValueError, match=f"Invalid {name}: "):
        trainer.train()
    assert all(torch.equal(p, s) for p, s in zip(params, start))


# --- 4. ZOTrainer's seeds: args.seed set before a train() that builds a new MeZO ------------------------------------
def seeded_trainer(tmp_path, seed, **kwargs):
    import transformers

    from sazo_lite.hf import ZOTrainer

    rows = [{"input_ids": [5 + k, 9, 11 + k, 4], "labels": [-100, 9, 11 + k, 4]} for k in range(6)]
    args = transformers.TrainingArguments(str(tmp_path / "out"), max_steps=2, per_device_train_batch_size=2,
                                          learning_rate=1e-2, save_strategy="no", report_to=[], use_cpu=True,
                                          disable_tqdm=True, seed=seed)
    return ZOTrainer(args=args, train_dataset=rows, eps=1e-2, **kwargs)


def flat(model):
    return torch.cat([p.detach().flatten() for p in model.parameters()])


def test_a_seed_loop_over_model_init_runs_each_seed(tmp_path):
    # zo_seed and the sampler's seed were read in __init__ only: seeds 0, 1, 2 ran the same run three times
    make = lambda: tiny_causal_lm("llama", vocab_size=VOCAB)
    trainer = seeded_trainer(tmp_path, 0, model_init=make)
    finals = []
    for seed in (0, 1, 0):
        trainer.args.seed = seed
        trainer.train()
        finals.append(flat(trainer.model))
    assert not torch.equal(finals[0], finals[1]) and torch.equal(finals[0], finals[2])
    alone = seeded_trainer(tmp_path / "alone", 1, model_init=make)
    alone.train()
    assert torch.equal(flat(alone.model), finals[1]) and alone.zo_sampler.seed == 2 and trainer.zo_sampler.seed == 1


def test_a_seed_set_on_args_before_the_first_train_is_the_runs(tmp_path):
    trainer = seeded_trainer(tmp_path, 0, model=tiny_causal_lm("llama", vocab_size=VOCAB))
    trainer.args.seed = 3
    trainer.train()
    same = seeded_trainer(tmp_path / "same", 3, model=tiny_causal_lm("llama", vocab_size=VOCAB))
    same.train()
    assert torch.equal(flat(trainer.model), flat(same.model))
    assert trainer.zo_optimizer.state_dict()["state"] == same.zo_optimizer.state_dict()["state"]


def test_a_sampler_assigned_by_hand_is_kept(tmp_path):
    from sazo_lite.samplers import SAZOSampler

    trainer = seeded_trainer(tmp_path, 0, model=tiny_causal_lm("llama", vocab_size=VOCAB))
    trainer.zo_sampler = mine = SAZOSampler(6, seed=3)
    trainer.train()
    assert trainer.zo_sampler is mine and int(mine.counts.sum()) > 0


def test_a_given_zo_seed_is_kept_and_a_continuing_run_keeps_its_seeds(tmp_path):
    trainer = seeded_trainer(tmp_path, 0, model=tiny_causal_lm("llama", vocab_size=VOCAB), zo_seed=7)
    trainer.args.seed = 3
    trainer.train()
    assert (trainer.zo_seed, trainer.zo_sampler.seed) == (7, 8)
    trainer.args.data_seed = 11
    trainer.train()                 # the same MeZO goes on: its seeds are the run's
    assert trainer.zo_sampler.seed == 8


# --- 5. peft CPT puts its prompt in front of the logits too ---------------------------------------------------------
def cpt_model():
    config = peft.CPTConfig(task_type="CAUSAL_LM", cpt_token_ids=[5, 6, 7], cpt_mask=[1, 1, 1],
                            cpt_tokens_type_mask=[1, 2, 2])
    return peft.get_peft_model(tiny_causal_lm("llama", vocab_size=VOCAB), config).eval()


def test_classification_losses_of_a_cpt_model_score_the_last_prompt_token():
    # CPT was counted as holding no virtual tokens: its logits [B, 3 + T, V] were read at position len - 1
    model, batch = cpt_model(), classified()
    assert torch.allclose(classification_losses(model, batch), alone_classification(model, batch), atol=1e-5)


def test_zo_trainer_evaluates_a_cpt_model_on_its_own_positions(tmp_path):
    import transformers

    from sazo_lite.hf import ZOTrainer

    rows = [{"input_ids": [5 + k, 9, 11 + k, 4], "labels": [-100, 9, 11 + k, 4]} for k in range(3)]
    args = transformers.TrainingArguments(str(tmp_path / "out"), per_device_eval_batch_size=3, report_to=[],
                                          use_cpu=True, disable_tqdm=True)
    model = cpt_model()
    # the logits [B, 3 + T, V] met labels [B, T] in cross_entropy's shape error
    loss = ZOTrainer(model, args, eval_dataset=rows).evaluate()["eval_loss"]
    with torch.no_grad():
        own = [float(F.cross_entropy(model(input_ids=torch.tensor([r["input_ids"]])).logits[0, 3:-1],
                                     torch.tensor(r["labels"][1:]), ignore_index=-100)) for r in rows]
    assert loss == pytest.approx(sum(own) / 3, rel=1e-5)


# --- 6. a float64 model's losses in float64 -------------------------------------------------------------------------
def test_causal_lm_losses_keep_float64_logits_in_float64():
    # rounded to float32: on a float64 model the ZO difference at ε = 1e-5 was 3% off, at 1e-7 rounding noise
    g = torch.Generator().manual_seed(0)
    logits, labels = torch.randn(3, 5, 7, generator=g, dtype=torch.float64), torch.randint(0, 7, (3, 5), generator=g)
    labels[0, :3] = -100
    from sazo_lite.llm.losses import causal_lm_losses

    got = causal_lm_losses(logits, labels)
    exact = F.cross_entropy(logits[:, :-1].transpose(1, 2), labels[:, 1:], ignore_index=-100, reduction="none")
    assert got.dtype == torch.float64
    assert torch.allclose(got, exact.sum(1) / (labels[:, 1:] != -100).sum(1), rtol=1e-14, atol=0)
    half = causal_lm_losses(logits.to(torch.bfloat16), labels)
    assert half.dtype == torch.float32                 # half-precision logits are upcast, as before


def float64_reference(outputs, inputs):
    """The default loss written out in float64: one loss per example over its shifted labels."""
    logits, labels = outputs.logits[:, :-1].double(), inputs["labels"][:, 1:]
    ce = F.cross_entropy(logits.transpose(1, 2), labels, ignore_index=-100, reduction="none")
    return ce.sum(1) / (labels != -100).sum(1).clamp_min(1)


def test_zo_trainer_s_default_loss_of_a_float64_model_is_float64(tmp_path):
    # the default loss rounded a float64 model's losses to float32 before MeZO read them in float64: at ε = 1e-7
    # each f(θ+εz) − f(θ−εz) was float32 rounding (GPT-2 runs in float64 throughout; Llama's RMSNorm does not)
    import transformers

    from sazo_lite.hf import ZOTrainer

    rows = [{"input_ids": [5 + k, 9, 11 + k, 4, 7], "labels": [-100, 9, 11 + k, 4, 7]} for k in range(6)]
    runs = []
    for loss in (None, float64_reference):
        args = transformers.TrainingArguments(str(tmp_path / "out"), max_steps=3, per_device_train_batch_size=3,
                                              learning_rate=1e-2, logging_steps=1, save_strategy="no", report_to=[],
                                              use_cpu=True, disable_tqdm=True, seed=0)
        model = tiny_causal_lm("gpt2", vocab_size=VOCAB, dtype=torch.float64)
        trainer = ZOTrainer(model, args, train_dataset=rows, method="mezo", eps=1e-7, per_example_loss=loss)
        trainer.train()
        runs.append(([e["zo_projected_grad"] for e in trainer.state.log_history if "loss" in e], flat(model)))
    assert runs[0][0] == runs[1][0] and torch.equal(runs[0][1], runs[1][1])


# --- 7. p-tuning checkpoints: peft saves the prompt encoder's output, not its weights --------------------------------
def p_tuned():
    config = peft.PromptEncoderConfig(task_type="CAUSAL_LM", num_virtual_tokens=3, encoder_hidden_size=8)
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(0)
        return peft.get_peft_model(tiny_causal_lm("llama", vocab_size=VOCAB), config)


def p_tuning_trainer(tmp_path, model, max_steps=4, **overrides):
    import transformers

    from sazo_lite.hf import ZOTrainer

    rows = [{"input_ids": [5 + k, 9, 11 + k, 4], "labels": [-100, 9, 11 + k, 4]} for k in range(6)]
    settings = dict(max_steps=max_steps, per_device_train_batch_size=2, learning_rate=1e-2, save_strategy="steps",
                    save_steps=2, report_to=[], use_cpu=True, disable_tqdm=True, seed=0)
    args = transformers.TrainingArguments(str(tmp_path / "out"), **{**settings, **overrides})
    return ZOTrainer(model, args, train_dataset=rows, eval_dataset=rows[:3], eps=1e-2)


def tuned(model):
    return [p.detach().clone() for p in model.parameters() if p.requires_grad]


def test_a_p_tuning_run_resumes_bit_for_bit(tmp_path):
    # the resume loaded prompt_embeddings (the encoder's output) into the encoder's embedding, under the MLP's
    # initial weights: every tuned tensor off (the embedding by 3.5), another run without a word
    straight = p_tuned()
    p_tuning_trainer(tmp_path, straight).train()
    resumed = p_tuned()
    p_tuning_trainer(tmp_path, resumed).train(resume_from_checkpoint=str(tmp_path / "out" / "checkpoint-2"))
    assert all(torch.equal(a, b) for a, b in zip(tuned(straight), tuned(resumed)))


def test_load_best_model_at_end_of_a_p_tuning_run_holds_the_best_steps_tensors(tmp_path):
    model = p_tuned()
    trainer = p_tuning_trainer(tmp_path, model, eval_strategy="steps", eval_steps=2, load_best_model_at_end=True)
    trainer.train()
    best = int(trainer.state.best_model_checkpoint.rsplit("-", 1)[1])
    shorter = p_tuned()
    p_tuning_trainer(tmp_path / "short", shorter, max_steps=best).train()
    assert all(torch.equal(a, b) for a, b in zip(tuned(model), tuned(shorter)))


def test_a_p_tuning_checkpoint_without_its_tensors_is_refused(tmp_path):
    p_tuning_trainer(tmp_path, p_tuned(), max_steps=2).train()
    path = tmp_path / "out" / "checkpoint-2" / "zo_state.pt"
    state = torch.load(path, weights_only=True)
    del state["tuned"]                      # as written before round 16
    torch.save(state, path)
    model = p_tuned()
    start = tuned(model)
    with pytest.raises(ValueError, match="Invalid checkpoint: .*p-tuning"):
        p_tuning_trainer(tmp_path, model).train(resume_from_checkpoint=str(tmp_path / "out" / "checkpoint-2"))
    assert all(torch.equal(a, b) for a, b in zip(tuned(model), start))


# --- 8. ZOTrainer rows longer than the learned positions ------------------------------------------------------------
@pytest.mark.parametrize("family, table", [("gpt2", "transformer.wpe"), ("opt", "model.decoder.embed_positions")])
def test_zo_trainer_names_a_row_longer_than_the_learned_positions_before_the_step(tmp_path, family, table):
    # torch's IndexError ("index out of range in self") mid-run, naming nothing (on a GPU a device-side assert)
    import transformers

    from sazo_lite.hf import ZOTrainer

    rows = [{"input_ids": [5 + k, 9, 11 + k, 4]} for k in range(6)]
    rows[4] = {"input_ids": [5] * 130}                  # the tiny models hold 128 positions
    args = transformers.TrainingArguments(str(tmp_path / "out"), max_steps=6, per_device_train_batch_size=2,
                                          learning_rate=1e-2, save_strategy="no", report_to=[], use_cpu=True,
                                          disable_tqdm=True, seed=0)
    trainer = ZOTrainer(tiny_causal_lm(family, vocab_size=VOCAB), args, train_dataset=rows, eps=1e-2)
    with pytest.raises(ValueError, match=rf"Invalid input_ids: train_dataset examples \[4\] at step \d make a batch "
                                         rf"of 130 tokens, past the model's 128 learned positions \({table}\)"):
        trainer.train()


# --- 9. master_weights read exactly ---------------------------------------------------------------------------------
@pytest.mark.parametrize("value", [1, 1.0, 0, "yes", None])
def test_master_weights_other_than_auto_or_a_bool_are_refused(tmp_path, value):
    # 1 passed the check (1 == True) and was then read as off (the rule asks `is True`): no master, silently
    with pytest.raises(ValueError, match="Invalid master_weights: .*expected 'auto', True or False"):
        seeded_trainer(tmp_path, 0, model=tiny_causal_lm("llama", vocab_size=VOCAB), master_weights=value)


def test_master_weights_true_builds_a_master(tmp_path):
    trainer = seeded_trainer(tmp_path, 0, model=tiny_causal_lm("llama", vocab_size=VOCAB), master_weights=True)
    trainer.train()
    assert trainer._master is not None


# --- 10. query_run's step_rule read exactly ------------------------------------------------------------------------
@pytest.mark.parametrize("value", [1, "no", None, 0.5])
def test_query_run_refuses_a_step_rule_that_is_not_a_bool_or_a_rule(value):
    # truthy values ran NoiseScaledStep (the string "no" too), while walk_pull's bound took them as no rule
    from sazo_lite.llm.queries import query_run

    model, batch = tiny_causal_lm("llama", vocab_size=VOCAB), classified(4)
    params = top_block_parameters(model, 1)
    start = [p.detach().clone() for p in params]
    with pytest.raises(ValueError, match="Invalid step_rule: "):
        query_run(model, params, batch, "uniform", lr=1e-2, steps=2, log_every=1, step_rule=value)
    assert all(torch.equal(p, s) for p, s in zip(params, start))


def test_a_p_tuning_run_cannot_load_its_best_model_from_weights_only_checkpoints(tmp_path):
    # save_only_model writes no zo_state.pt: the best checkpoint loaded as another prompt, without a word
    with pytest.raises(ValueError, match="Invalid save_only_model: True with load_best_model_at_end and a peft"):
        p_tuning_trainer(tmp_path, p_tuned(), eval_strategy="steps", eval_steps=2, load_best_model_at_end=True,
                         save_only_model=True)
    p_tuning_trainer(tmp_path, p_tuned(), save_only_model=True)      # without load_best_model_at_end: nothing loads

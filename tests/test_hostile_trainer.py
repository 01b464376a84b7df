"""ZOTrainer and its collator under hostile input (issue 24, items 1-4).

One regression test per defect, named for it (each failed on the code before the fix), then a
hypothesis suite over Trainer settings and models the step cannot use. Tiny models only
(``tiny_causal_lm`` or a small ``nn.Module``); nothing is downloaded.
"""

import pytest
import torch
from hypothesis import HealthCheck, given, settings, strategies as st

transformers = pytest.importorskip("transformers")
from transformers.modeling_outputs import CausalLMOutput  # noqa: E402

from sazo_lite.llm.losses import TokenBatch, answer_losses  # noqa: E402
from sazo_lite.llm.models import tiny_causal_lm  # noqa: E402
from test_hf import _OnFirstUse  # noqa: E402  (sazo_lite.hf imported when a test first needs it)

zo_hf = _OnFirstUse("sazo_lite.hf")

transformers.logging.set_verbosity_error()
VOCAB, PAD = 64, 0
FEW = settings(max_examples=6, deadline=None, suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture])


def rows(n=6, seed=0, labels=True):
    g = torch.Generator().manual_seed(seed)
    out = []
    for i in range(n):
        ids = torch.randint(3, VOCAB, (4 + i % 3,), generator=g).tolist()
        out.append({"input_ids": ids, **({"labels": [-100, -100] + ids[2:]} if labels else {})})
    return out


def args_for(tmp_path, **overrides):
    settings_ = dict(max_steps=2, per_device_train_batch_size=2, learning_rate=1e-3, save_strategy="no",
                     report_to=[], use_cpu=True, disable_tqdm=True, seed=0, logging_steps=1)
    settings_.update(overrides)
    return transformers.TrainingArguments(str(tmp_path / "out"), **settings_)


def snapshot(model):
    return {k: v.detach().clone() for k, v in model.state_dict().items()}


def unchanged(model, before):
    return all(torch.equal(before[k], v) for k, v in model.state_dict().items())


# -- 1: a crafted zo_state.pt ------------------------------------------------------------------
class _Payload:
    """Pickles to a call of ``open(marker, "w")``: loading it creates the marker file."""

    def __init__(self, marker):
        self.marker = str(marker)

    def __reduce__(self):
        return (open, (self.marker, "w"))


def test_a_crafted_zo_state_pickle_is_refused_and_runs_nothing(tmp_path):
    model = tiny_causal_lm("llama", vocab_size=VOCAB)
    zo_hf.ZOTrainer(model, args_for(tmp_path, save_strategy="steps", save_steps=2), train_dataset=rows()).train()
    checkpoint = tmp_path / "out" / "checkpoint-2"
    marker = tmp_path / "code-ran"
    state = torch.load(checkpoint / "zo_state.pt", weights_only=True)
    state["sampler"]["extra"] = _Payload(marker)
    torch.save(state, checkpoint / "zo_state.pt")
    again = zo_hf.ZOTrainer(tiny_causal_lm("llama", vocab_size=VOCAB), args_for(tmp_path, max_steps=4),
                      train_dataset=rows())
    before = snapshot(again.model)
    with pytest.raises(ValueError, match="Invalid checkpoint"):
        again.train(resume_from_checkpoint=str(checkpoint))
    assert not marker.exists()                                   # nothing in the file ran
    assert again.optimizer is None and again.state.global_step == 0 and unchanged(again.model, before)


@pytest.mark.parametrize("spoil", ["not a dict", "extra key", "master shapes", "sampler field", "garbage"])
def test_a_zo_state_of_the_wrong_shape_is_refused_before_anything_loads(tmp_path, spoil):
    model = tiny_causal_lm("llama", vocab_size=VOCAB)
    zo_hf.ZOTrainer(model, args_for(tmp_path, save_strategy="steps", save_steps=2), train_dataset=rows(),
              master_weights=spoil == "master shapes").train()
    path = tmp_path / "out" / "checkpoint-2" / "zo_state.pt"
    state = torch.load(path, weights_only=True)
    if spoil == "not a dict":
        state = [state]
    elif spoil == "extra key":
        state["more"] = 1
    elif spoil == "master shapes":
        state["master"] = state["master"][:-1]
    elif spoil == "sampler field":
        state["sampler"]["estimates"] = state["sampler"]["estimates"][:-1]
    if spoil == "garbage":
        path.write_bytes(b"\x80\x04not really a checkpoint")
    else:
        torch.save(state, path)
    again = zo_hf.ZOTrainer(tiny_causal_lm("llama", vocab_size=VOCAB), args_for(tmp_path, max_steps=4),
                      train_dataset=rows(), master_weights=spoil == "master shapes")
    before = snapshot(again.model)
    with pytest.raises(ValueError, match="Invalid checkpoint"):
        again.train(resume_from_checkpoint=str(path.parent))
    assert again.state.global_step == 0 and unchanged(again.model, before)


# -- 2: the collator on pre-padded datasets ----------------------------------------------------
def padded(examples, style, width=9):
    """The examples as a tokenizer would pad them: 'left', 'right' or 'max_length' (right, to width)."""
    out = []
    longest = max(len(e["input_ids"]) for e in examples)
    for e in examples:
        ids = e["input_ids"]
        size = (width if style == "max_length" else longest) - len(ids)
        pad, ones = [PAD] * size, [1] * len(ids)
        row = ({"input_ids": pad + ids, "attention_mask": [0] * size + ones} if style == "left"
               else {"input_ids": ids + pad, "attention_mask": ones + [0] * size})
        if "labels" in e:   # labels as a careless script writes them: a copy that includes the pads
            row["labels"] = ([PAD] * size + e["labels"]) if style == "left" else (e["labels"] + [PAD] * size)
            row["labels"] = [lab if m else -100 for lab, m in zip(row["labels"], row["attention_mask"])]
        out.append(row)
    return out


@pytest.mark.parametrize("style", ["left", "right", "max_length"])
@pytest.mark.parametrize("with_labels", [False, True])
def test_the_collator_honours_a_datasets_padding_and_never_scores_a_pad(style, with_labels):
    model = tiny_causal_lm("llama", vocab_size=VOCAB)
    examples = rows(n=4, seed=2, labels=with_labels)
    batch = zo_hf.CausalLMCollator(PAD)(padded(examples, style))
    with torch.no_grad():
        ours = zo_hf.causal_lm_losses(model(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"]).logits,
                                batch["labels"])
        for k, e in enumerate(examples):      # the model's own (HF labels) loss on the example alone
            labels = e.get("labels", e["input_ids"])
            own = model(input_ids=torch.tensor([e["input_ids"]]), labels=torch.tensor([labels])).loss
            assert float(ours[k]) == pytest.approx(float(own), rel=1e-5, abs=1e-6), (style, k)
    assert not bool(((batch["attention_mask"] == 0) & (batch["labels"] != -100)).any())   # no pad scored


def test_a_right_padded_batch_gives_the_models_own_loss_on_the_same_padded_rows():
    model = tiny_causal_lm("gpt2", vocab_size=VOCAB)   # absolute positions: right padding only
    examples = padded(rows(n=3, seed=5), "max_length")
    batch = zo_hf.CausalLMCollator(PAD)(examples)
    with torch.no_grad():
        ours = zo_hf.causal_lm_losses(model(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"]).logits,
                                batch["labels"])
        for k, row in enumerate(examples):
            own = model(input_ids=torch.tensor([row["input_ids"]]), attention_mask=torch.tensor([row["attention_mask"]]),
                        labels=torch.tensor([row["labels"]])).loss
            assert float(ours[k]) == pytest.approx(float(own), rel=1e-5, abs=1e-6)


@pytest.mark.parametrize("row, match", [
    ({"input_ids": [5, 6, 7], "attention_mask": [1, 0, 1]}, "between"),
    ({"input_ids": [5, 6, 7], "attention_mask": [1, 1]}, "attention_mask"),
    ({"input_ids": [5, 6, 7], "attention_mask": [1, 2, 1]}, "attention_mask"),
    ({"input_ids": [5, 6], "attention_mask": [0, 0]}, "no tokens"),
    ({"input_ids": []}, "no tokens"),
])
def test_masks_the_collator_cannot_honour_are_refused(row, match):
    with pytest.raises(ValueError, match=match):
        zo_hf.CausalLMCollator(PAD)([row])


def test_answer_losses_and_the_trainers_loss_are_one_function():
    model = tiny_causal_lm("llama", vocab_size=VOCAB)
    examples = rows(n=4, seed=3)
    batch = TokenBatch(ids=[e["input_ids"] for e in examples], prompt_lengths=[2] * 4, pad_id=PAD)
    collated = zo_hf.CausalLMCollator(PAD)(examples)
    with torch.no_grad():
        hf = zo_hf.causal_lm_losses(model(input_ids=collated["input_ids"], attention_mask=collated["attention_mask"]).logits,
                              collated["labels"])
        assert torch.allclose(answer_losses(model, batch), hf, rtol=1e-6, atol=1e-7)
        for k, e in enumerate(examples):
            own = model(input_ids=torch.tensor([e["input_ids"]]), labels=torch.tensor([e["labels"]])).loss
            assert float(hf[k]) == pytest.approx(float(own), rel=1e-5)


# -- 3: models, collators and losses the step cannot use ---------------------------------------
class TupleLM(torch.nn.Module):
    """A causal LM that returns a tuple (logits,) instead of an output with ``.logits``."""

    def __init__(self, as_tuple=True, flat=False):
        super().__init__()
        self.embed, self.head = torch.nn.Embedding(VOCAB, 8), torch.nn.Linear(8, VOCAB)
        self.as_tuple, self.flat = as_tuple, flat

    def forward(self, input_ids, attention_mask=None):
        logits = self.head(self.embed(input_ids))
        if self.flat:
            logits = logits.mean(1)                      # [B, V]: not per position
        return (logits,) if self.as_tuple else CausalLMOutput(logits=logits)


def seq_classifier():
    config = transformers.LlamaConfig(vocab_size=VOCAB, hidden_size=16, intermediate_size=32, num_hidden_layers=1,
                                      num_attention_heads=2, num_key_value_heads=1, pad_token_id=PAD, num_labels=2)
    return transformers.LlamaForSequenceClassification(config).eval()


def no_labels_collator(batch_rows):
    full = zo_hf.CausalLMCollator(PAD)(batch_rows)
    return {"input_ids": full["input_ids"], "attention_mask": full["attention_mask"]}


CANNOT_USE = {
    "sequence classifier": (lambda: seq_classifier(), {}, "Invalid model"),
    "tuple outputs": (lambda: TupleLM(), {}, "Invalid model"),
    "flat logits": (lambda: TupleLM(as_tuple=False, flat=True), {}, "Invalid model"),
    "collator without labels": (lambda: TupleLM(as_tuple=False), dict(data_collator=no_labels_collator),
                                "Invalid data_collator"),
    "mean loss": (lambda: TupleLM(as_tuple=False),
                  dict(per_example_loss=lambda out, inputs: zo_hf.causal_lm_losses(out.logits, inputs["labels"]).mean()),
                  "Invalid per_example_loss"),
    "integer loss": (lambda: TupleLM(as_tuple=False),
                     dict(per_example_loss=lambda out, inputs: inputs["labels"][:, 0]), "Invalid per_example_loss"),
    "loss that raises": (lambda: TupleLM(as_tuple=False),
                         dict(per_example_loss=lambda out, inputs: out["nope"]), "Invalid per_example_loss"),
}


@pytest.mark.parametrize("case", sorted(CANNOT_USE))
def test_a_model_or_collator_the_trainer_cannot_use_is_refused_before_training(tmp_path, case):
    make, kwargs, match = CANNOT_USE[case]
    model = make()
    trainer = zo_hf.ZOTrainer(model, args_for(tmp_path), train_dataset=rows(), **kwargs)
    before = snapshot(model)
    with pytest.raises(ValueError, match=match):
        trainer.train()
    assert trainer.optimizer is None and trainer.state.global_step == 0 and unchanged(model, before)


def test_a_usable_plain_module_trains(tmp_path):
    model = TupleLM(as_tuple=False)
    before = snapshot(model)
    trainer = zo_hf.ZOTrainer(model, args_for(tmp_path), train_dataset=rows())
    trainer.train()
    assert trainer.zo_optimizer.step_count == 2 and not unchanged(model, before)


# -- 4: settings the Trainer would silently ignore or crash on -------------------------------
@pytest.mark.parametrize("change, match", [
    (dict(optim="adafactor"), "optim"),
    (dict(optim="sgd"), "optim"),
    (dict(optim_args="lr=0.1"), "optim"),
    (dict(per_device_train_batch_size=0), "per_device_train_batch_size"),
])
def test_optim_settings_and_a_zero_batch_size_are_refused_at_construction(tmp_path, change, match):
    with pytest.raises(ValueError, match=match):
        zo_hf.ZOTrainer(TupleLM(as_tuple=False), args_for(tmp_path, **change), train_dataset=rows())


# -- hypothesis: Trainer settings and models ---------------------------------------------------
OPTIMS = ["adamw_torch", "adafactor", "sgd", "adagrad", "rmsprop", "lion_32bit"]


@FEW
@given(optim=st.sampled_from(OPTIMS + [None]), optim_args=st.sampled_from([None, "", "beta=0.9"]),
       batch=st.integers(-2, 3), accumulation=st.integers(1, 2))
def test_fuzz_trainer_settings_refuse_or_construct(tmp_path, optim, optim_args, batch, accumulation):
    change = dict(per_device_train_batch_size=batch, gradient_accumulation_steps=accumulation, optim_args=optim_args)
    if optim is not None:
        change["optim"] = optim
    try:
        args = args_for(tmp_path, **change)
    except (ValueError, ImportError):        # transformers.TrainingArguments' own refusals
        return
    bad = (optim not in (None, transformers.TrainingArguments.__dataclass_fields__["optim"].default) or bool(optim_args)
           or batch < 1 or accumulation != 1)
    if bad:
        with pytest.raises(ValueError, match="Invalid"):
            zo_hf.ZOTrainer(TupleLM(as_tuple=False), args, train_dataset=rows())
    else:
        zo_hf.ZOTrainer(TupleLM(as_tuple=False), args, train_dataset=rows())


@FEW
@given(case=st.sampled_from(sorted(CANNOT_USE)), n=st.integers(1, 4), batch=st.integers(1, 3))
def test_fuzz_unusable_models_never_move_a_parameter(tmp_path, case, n, batch):
    make, kwargs, match = CANNOT_USE[case]
    model = make()
    trainer = zo_hf.ZOTrainer(model, args_for(tmp_path, per_device_train_batch_size=batch), train_dataset=rows(n=n),
                        **kwargs)
    before = snapshot(model)
    with pytest.raises(ValueError, match=match):
        trainer.train()
    assert unchanged(model, before) and trainer.state.global_step == 0


# -- siblings: other loads of files a user may receive -----------------------------------------
def test_a_crafted_or_foreign_first_round_cache_is_ignored_and_runs_nothing(tmp_path):
    from sazo_lite.llm.continual import _cached_tensors

    params = [torch.zeros(3, 2), torch.zeros(4)]
    marker = tmp_path / "code-ran"
    crafted = tmp_path / "crafted.pt"
    torch.save([torch.ones(3, 2), _Payload(marker)], crafted)
    assert _cached_tensors(crafted, params) is None and not marker.exists()
    foreign = tmp_path / "foreign.pt"
    torch.save([torch.ones(2, 3), torch.ones(4)], foreign)            # other shapes
    assert _cached_tensors(foreign, params) is None
    (tmp_path / "garbage.pt").write_bytes(b"not a file torch wrote")
    assert _cached_tensors(tmp_path / "garbage.pt", params) is None
    good = tmp_path / "good.pt"
    torch.save([torch.ones(3, 2), torch.full((4,), 2.0)], good)
    assert [float(t.sum()) for t in _cached_tensors(good, params)] == [6.0, 8.0]

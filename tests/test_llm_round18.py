"""Round 18 of the language-model package and its benchmarks: the run cache's protocol (query_run's budget stop),
the sets' names in the run cache's keys, TopBlocks' check on a nan the model gives only in a padded batch. Each test
failed on the code before its fix."""
from __future__ import annotations

import hashlib
import json
from pathlib import Path

import pytest
import torch

pytest.importorskip("transformers")

from benchmarks import llm_long_runs, llm_queries, run_cache
from benchmarks.run_cache import RunNotCached, cached_run
from sazo_lite.llm.losses import TokenBatch, classification_losses
from sazo_lite.llm.topblock import TopBlocks, top_block_parameters

REFERENCE_RUNS = Path(__file__).resolve().parents[1] / "benchmarks" / "reference" / "llm_opposed_runs"


def saved_under(cache: Path, protocol: int, key: dict, run: dict) -> Path:
    """A run as ``cached_run`` under ``protocol`` saved it (its file name: a hash of the key with the protocol)."""
    full = {"protocol": protocol, **key}
    text = json.dumps(full, sort_keys=True, default=str)
    path = cache / f"run-{hashlib.sha256(text.encode()).hexdigest()[:20]}.json"
    path.write_text(json.dumps({"key": json.loads(text), "run": run}))
    return path


def budget_run(losses: list[float], budget: int, step: int = 8) -> dict:
    return {"queries": [step * k for k in range(len(losses))], "train_loss": losses, "budget_queries": budget,
            "diverged": False}


BUDGET_KEY = {"setting": "fake", "lr": 1e-3, "seed": 0, "stop_fraction": 0.5, "accuracy_at": 16}


# --- 1. the run cache's protocol: a run saved before query_run's budget stop changed ------------------------------
def test_a_protocol_1_run_that_met_the_target_before_its_budget_and_ran_on_is_recomputed(tmp_path):
    """d549f55 stops a run at the budget when any log point before it met the target (only the budget's own point did)
    without a new protocol: a run the earlier rule ran on past its budget was read back as today's."""
    old = budget_run([1.0, 0.4, 0.6, 0.3], budget=16)        # met at 8 queries, above at the budget, ran on to 24
    saved_under(tmp_path, 1, BUDGET_KEY, old)
    with pytest.warns(UserWarning, match="protocol 1"):
        with pytest.raises(RunNotCached):
            cached_run(tmp_path, BUDGET_KEY, lambda: {"q": 1}, cached_only=True)
    with pytest.warns(UserWarning, match="recomputing"):
        assert cached_run(tmp_path, BUDGET_KEY, lambda: {"q": 1}) == {"q": 1}
    assert cached_run(tmp_path, BUDGET_KEY, lambda: {"q": 2}) == {"q": 1}       # saved under today's protocol


@pytest.mark.parametrize("losses, key", [
    ([1.0, 0.6, 0.7, 0.3], BUDGET_KEY),                                        # first met after the budget
    ([1.0, 0.4, 0.45], BUDGET_KEY),                                            # met before it, stopped at it
    ([1.0, 0.4, 0.6, 0.3], {**BUDGET_KEY, "accuracy_at": None}),               # no budget
    ([1.0, 0.4, 0.6, 0.3], {**BUDGET_KEY, "stop_fraction": None}),             # no target
])
def test_a_protocol_1_run_the_rule_did_not_change_is_read_without_computing(tmp_path, losses, key):
    saved_under(tmp_path, 1, key, budget_run(losses, budget=16))
    assert cached_run(tmp_path, key, lambda: pytest.fail("computed")) == budget_run(losses, budget=16)


def test_every_committed_opposed_race_run_is_carried_over_to_todays_protocol(tmp_path):
    """The committed cache (protocol 1): no run met its target at a log point before its budget, so each is what
    today's rules make; it stays readable (with the set it was made from: its key's examples)."""
    paths = sorted(REFERENCE_RUNS.glob("run-*.json"))
    assert len(paths) == 31
    for path in paths:
        saved = json.loads(path.read_text())
        key = {name: value for name, value in saved["key"].items() if name != "protocol"}
        assert saved["key"]["protocol"] == 1 and run_cache.carried_over(1, saved["key"], saved["run"])
        assert cached_run(REFERENCE_RUNS, key, lambda: pytest.fail(f"{path.name} computed"),
                          cached_only=True) == saved["run"]


def test_todays_query_run_with_a_budget_is_judged_current(tmp_path):
    """The carried-over rule agrees with query_run: a run made today (targets met before, at and after the budget)
    is never judged one of the earlier rule."""
    from sazo_lite.llm import add_lora, restore_snapshot, snapshot, tiny_causal_lm, top_layers, trainable_parameters
    from sazo_lite.llm.queries import query_run

    pytest.importorskip("peft")
    g = torch.Generator().manual_seed(0)
    ids = [torch.randint(3, 64, (3 + k % 5,), generator=g).tolist() for k in range(8)]
    data = TokenBatch(ids, [len(r) for r in ids], 0, torch.randint(0, 2, (8,), generator=g), torch.tensor([5, 9]))
    base = tiny_causal_lm("llama", vocab_size=64, seed=1)
    model = add_lora(base, rank=2, layers=top_layers(base, 1))
    params = trainable_parameters(model)
    train, test = TopBlocks(model, data), TopBlocks(model, data)
    theta0 = snapshot(params)
    settings = dict(lr=0.5, steps=12, log_every=2, batch_size=2, seed=2)
    free = query_run(None, params, train, "uniform", **settings)
    for target in sorted({f / free.train_loss[0] for f in free.train_loss[1:]}):
        restore_snapshot(params, theta0)
        run = query_run(None, params, train, "uniform", stop_fraction=target, accuracy_at=40, test_batch=test,
                        **settings).to_dict()
        assert run_cache.budget_stop_agrees(run, stop_fraction=target, accuracy_at=40), target


def fake_long_run(losses: list[float]) -> dict:
    return {**budget_run(losses, budget=16), "walk": [0.0] * len(losses), "mean_sq_step_scale": 1.0,
            "max_step_scale": 2.0, "test_accuracy": 0.5, "budget_accuracy": 0.5, "seconds": 1.0}


@pytest.mark.parametrize("losses, kept", [([1.0, 0.6, 0.7, 0.3], True), ([1.0, 0.4, 0.6, 0.3], False)])
def test_long_runs_keep_a_protocol_1_run_only_where_todays_rules_make_the_same(monkeypatch, capsys, tmp_path,
                                                                                losses, kept):
    computed = []
    monkeypatch.setattr(llm_long_runs.llm_queries, "smollm2_start", lambda *a, **k: (None, [torch.zeros(2)], None, None, None))
    monkeypatch.setattr(llm_long_runs.llm_queries, "run_from", lambda *a, lr, seed, **k: computed.append(lr) or
                        fake_long_run([1.0, 0.45]))
    monkeypatch.setattr(llm_long_runs.torch, "set_num_threads", lambda n: None)
    out = tmp_path / "runs"
    argv = [str(out), "uniform:3.5e-4:0", "--steps", "10", "--accuracy-at", "16"]
    llm_long_runs.main(argv)                       # today's settings, saved
    path = out / "uniform_0.00035_s0.json"
    settings = json.loads(path.read_text())["settings"]
    path.write_text(json.dumps({**fake_long_run(losses), "settings": {**settings, "protocol": 1}}))
    if kept:
        llm_long_runs.main(argv)
        assert computed == [3.5e-4] and "(kept)" in capsys.readouterr().out
    else:
        with pytest.raises(SystemExit):
            llm_long_runs.main(argv)
        assert "uniform_0.00035_s0.json" in capsys.readouterr().err and computed == [3.5e-4]


# --- 2. the run cache names a set by its examples -----------------------------------------------------------------
def fake_run(*_args, **_kwargs) -> dict:
    return {"queries": [0, 40, 80], "train_loss": [1.0, 0.45, 0.35], "walk": [0.0, 1.0, 2.0], "diverged": False,
            "max_step_scale": 1.0, "max_weight": 1.0, "test_accuracy": 0.5, "budget_accuracy": None}


def test_a_race_resumed_on_another_set_of_the_same_sizes_recomputes_its_runs(monkeypatch, tmp_path):
    """Keys named a SmolLM2 set by its sizes: a race on a set drawn otherwise (the sets of 2026-12-07 against those
    drawn with repeats) read the other set's runs back."""
    calls = []
    monkeypatch.setattr(llm_queries, "_computed", lambda start, sampler, settings: calls.append(settings) or fake_run())
    args = llm_queries.parse_args(["--sets", "opposed", "--big-n", "16", "--cells", "1", "--grid-seeds", "1",
                                   "--seeds", "1", "--variants", "uniform", "--run-cache", str(tmp_path)])

    def race() -> dict:
        (setting,) = [s for s in llm_queries.settings(args) if "opposed" in s.label]
        out = {"grid": {}, "chosen_lr": {}, "runs": {}}
        llm_queries.race_variant(setting, "uniform", None, None, None, None, args, out,
                                 start=llm_queries.LazyStart(lambda: (None, [], None, None, None)))
        return out

    first = race()
    assert calls and race() == first and len(calls) == (n := len(calls))       # the same set: read back
    real = llm_queries.make_continual_set
    monkeypatch.setattr(llm_queries, "make_continual_set", lambda *a, **k: real(*a, **{**k, "seed": 1}))
    race()
    assert len(calls) == 2 * n                                                  # another set: recomputed


def test_long_runs_and_the_race_name_a_set_by_one_digest():
    args = llm_queries.parse_args(["--sets", "opposed", "--big-n", "96"])
    (setting,) = [s for s in llm_queries.settings(args) if "opposed" in s.label]
    digest = llm_long_runs.set_digest("opposed", args, num_train=96, new_fraction=0.125)
    assert setting.key(args)["examples"] == digest
    # the committed cache was made from the set of 2026-12-02 (drawn with repeats): today's race does not read it
    assert {json.loads(p.read_text())["key"]["examples"] for p in REFERENCE_RUNS.glob("run-*.json")} == {"2c6bc1e7cd02"}
    assert digest != "2c6bc1e7cd02"


# --- 3. TopBlocks: a nan the model gives an example only in a padded batch ----------------------------------------
def sliding_window_model(dtype, attention: str):
    """A tiny Mistral with a 2-token window: in a right-padded batch, a padded row past the window has no key."""
    import transformers

    config = transformers.MistralConfig(vocab_size=50, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                                        num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=128,
                                        sliding_window=2, pad_token_id=0, bos_token_id=1, eos_token_id=2)
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(0)
        model = transformers.AutoModelForCausalLM.from_config(config, dtype=dtype, attn_implementation=attention)
    model.eval()
    top_block_parameters(model, 1)
    return model


PADDED = TokenBatch([[5, 6, 7, 8, 9, 10, 11, 12], [8, 9, 10], [7, 8, 9, 10, 11], [8, 9]], [8, 3, 5, 2], 0,
                    torch.tensor([0, 1, 0, 1]), torch.tensor([3, 4]))


def test_top_blocks_refuse_a_float64_eager_model_whose_nan_comes_from_padding():
    model = sliding_window_model(torch.float64, "eager")
    padded = classification_losses(model, PADDED)
    alone = torch.stack([classification_losses(model, PADDED, [k])[0] for k in range(len(PADDED))])
    assert bool(padded.isnan().any()) and bool(alone.isfinite().all())    # the nan is the padding's
    with pytest.raises(ValueError, match="Invalid model: its loss of example 3 is nan in a padded batch but .* alone"):
        TopBlocks(model, PADDED)        # it passed (nan against nan) and scored those examples nan


@pytest.mark.parametrize("dtype, attention", [(torch.float64, "sdpa"), (torch.float32, "eager")])
def test_top_blocks_take_the_sliding_window_model_where_padding_gives_no_nan(dtype, attention):
    model = sliding_window_model(dtype, attention)
    top = TopBlocks(model, PADDED)
    alone = torch.stack([classification_losses(model, PADDED, [k])[0] for k in range(len(PADDED))])
    assert torch.allclose(top(range(len(PADDED))), alone.to(top(range(1)).dtype), atol=1e-5)


def test_top_blocks_refuse_a_padding_nan_outside_the_checked_examples():
    """The check compares the last four examples: a short example before them, the only one padded past the window,
    was scored nan on the cache while the model gives it a loss alone."""
    model = sliding_window_model(torch.float64, "eager")
    split = TokenBatch([[8, 9], *[[5, 6, 7, 8, 9, 10, 11, 12]] * 5], [2, *[8] * 5], 0, torch.tensor([1, 0, 1, 0, 1, 0]),
                       torch.tensor([3, 4]))
    assert bool(classification_losses(model, split, [0, 1]).isnan().any())
    assert bool(classification_losses(model, split, [0]).isfinite().all())
    with pytest.raises(ValueError, match="Invalid model: its loss of example 0 is nan in a padded batch"):
        TopBlocks(model, split)

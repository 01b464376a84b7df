"""Round 17 red team of the language-model long-run machinery: ``llm.queries`` (query_run, the walk rules) and the
long-run benchmarks (``llm_topblock``, ``llm_long_runs``, ``llm_drift``, ``llm_kicks``). Each test failed on the code
before its fix."""
from __future__ import annotations

import dataclasses

import pytest
import torch

pytest.importorskip("transformers")
pytest.importorskip("peft")

from sazo_lite.llm import add_lora, restore_snapshot, snapshot, tiny_causal_lm, top_layers, trainable_parameters
from sazo_lite.llm.losses import TokenBatch
from sazo_lite.llm.queries import query_run
from sazo_lite.llm.topblock import TopBlocks

VOCAB = 64


def token_batch(n: int, seed: int) -> TokenBatch:
    g = torch.Generator().manual_seed(seed)
    ids = [torch.randint(3, VOCAB, (3 + (5 * k + seed) % 6,), generator=g).tolist() for k in range(n)]
    return TokenBatch(ids, [len(r) for r in ids], 0, torch.randint(0, 2, (n,), generator=g), torch.tensor([5, 9]))


def top_block_setting():
    base = tiny_causal_lm("llama", vocab_size=VOCAB, seed=1)
    model = add_lora(base, rank=2, layers=top_layers(base, 1))
    params = trainable_parameters(model)
    return model, params, TopBlocks(model, token_batch(8, 0)), TopBlocks(model, token_batch(6, 1))


# --- query_run: a target met before the accuracy budget stops the run at the budget -----------------------------
def test_a_target_met_before_the_budget_stops_the_run_at_the_budget_even_if_f_rose_again():
    model, params, train, test = top_block_setting()
    theta0 = snapshot(params)
    settings = dict(lr=0.5, steps=12, log_every=2, batch_size=2, seed=2)
    free = query_run(None, params, train, "uniform", **settings)
    ratios = [f / free.train_loss[0] for f in free.train_loss]
    # the target is met at a log point before the budget (5 log points, 40 queries), and F is above it at the budget
    target = min(ratios[1:5])
    assert target < 1 and ratios[5] > target and ratios[-1] > max(ratios[5], target), ratios
    budget = 2 * settings["batch_size"] * 10
    restore_snapshot(params, theta0)
    stopped = query_run(None, params, train, "uniform", stop_fraction=target, **settings)
    assert stopped.queries[-1] < budget          # without a budget: stopped at the first point that met it
    restore_snapshot(params, theta0)
    # a divergence limit that the plain run's last point passes: the old code ran past the budget into it
    limit = (ratios[-1] + max(ratios[:-1])) / 2
    run = query_run(None, params, train, "uniform", stop_fraction=target, accuracy_at=budget, test_batch=test,
                    diverge_factor=limit, **settings)
    assert run.budget_queries == budget and run.queries[-1] == budget     # it ran on to 48 queries
    assert not run.diverged and run.test_accuracy == run.budget_accuracy   # it was "diverged", with no accuracy
    assert run.train_loss == free.train_loss[:len(run.train_loss)]


# --- llm_drift: each dtype's row starts from the loaded float32 weights ------------------------------------------
def test_drift_measures_each_dtype_on_the_weights_rounded_once(monkeypatch, capsys):
    from benchmarks import llm_drift

    model = tiny_causal_lm("llama", vocab_size=VOCAB, seed=3)
    loaded = [p.detach().clone() for p in model.parameters()]
    monkeypatch.setattr(llm_drift, "load_smollm2", lambda: (model, None))
    seen = {}
    plain_report = llm_drift.drift_report

    def recording(params, before, eps, seed):
        seen.setdefault(before[0].dtype, [b.clone() for b in before])    # the plain pass's θ of each dtype
        return plain_report(params, before, eps, seed)

    monkeypatch.setattr(llm_drift, "drift_report", recording)
    llm_drift.main([])
    assert set(seen) == {torch.float32, torch.bfloat16, torch.float16}
    for dtype, before in seen.items():
        assert len(before) == len(loaded)
        for b, w in zip(before, loaded):        # the float16 row held the bfloat16-rounded weights
            assert torch.equal(b, w.to(dtype))
    assert "float16" in capsys.readouterr().out


# --- llm_long_runs: a saved run of another set of examples (same sizes) is not kept ------------------------------
def test_long_runs_refuse_a_saved_run_of_other_examples_of_the_same_sizes(tmp_path, monkeypatch, capsys):
    from benchmarks import llm_long_runs, llm_queries
    from sazo_lite.llm import continual

    base = tiny_causal_lm("llama", vocab_size=VOCAB, seed=1)
    model = add_lora(base, rank=2)
    params = trainable_parameters(model)
    monkeypatch.setattr(llm_queries, "smollm2_start", lambda *a, **k: (model, params, token_batch(6, 0),
                                                                       token_batch(4, 1), None))
    argv = [str(tmp_path), "uniform:0.01:0", "--n", "16", "--steps", "2", "--log-every", "1"]
    llm_long_runs.main(argv)
    saved = llm_long_runs.run_path(tmp_path, "uniform", 0.01, 0)
    assert saved.exists()
    llm_long_runs.main(argv)            # the same examples: kept, not rerun
    assert "(kept)" in capsys.readouterr().out
    drawn = continual.make_continual_set

    def other_examples(*args, **kwargs):     # the same sizes, other prompts (as the sets of 2026-12-07 against the earlier)
        cset = drawn(*args, **kwargs)
        cset.task.train[0] = dataclasses.replace(cset.task.train[0], prompt=cset.task.train[0].prompt + " really")
        return cset

    monkeypatch.setattr(llm_long_runs, "make_continual_set", other_examples, raising=False)
    monkeypatch.setattr(llm_queries, "make_continual_set", other_examples)     # set_digest's rule lives there
    monkeypatch.setattr(continual, "make_continual_set", other_examples)
    with pytest.raises(SystemExit):     # the earlier set's run was kept as this set's
        llm_long_runs.main(argv)
    assert "hold runs of other settings" in capsys.readouterr().err


# --- the walk and WalkBound on float64 tensors whose squares leave float64 -------------------------------------
@pytest.mark.parametrize("scale", [1e200, 1e-200, 1e-160, 1.0])
def test_the_walk_and_its_bound_are_exact_where_squares_overflow_or_underflow(scale):
    from sazo_lite.engine import MeZO, StepEvent
    from sazo_lite.llm.queries import WalkBound, walk

    start = [torch.full((3,), 7.0, dtype=torch.float64) * scale, torch.zeros(2, 2, dtype=torch.float64)]
    theta = [start[0] + torch.tensor([3.0, 0.0, 0.0], dtype=torch.float64) * scale,
             torch.tensor([[0.0, 4.0], [0.0, 0.0]], dtype=torch.float64) * scale]
    assert walk(theta, start) == pytest.approx(5.0 * scale, rel=1e-12)     # inf at 1e200, 0 at 1e-200
    bound = WalkBound(theta, radius=2.5 * scale, start=start)
    bound(MeZO(theta, lr=0.0), StepEvent("step", 0, 0.0))
    assert bound.count == 1       # 1e-200: a walk read as 0 was left at 5·scale
    expected = [start[0] + torch.tensor([1.5, 0.0, 0.0], dtype=torch.float64) * scale,
                torch.tensor([[0.0, 2.0], [0.0, 0.0]], dtype=torch.float64) * scale]
    for t, e in zip(theta, expected):   # 1e200: θ was put back at θ₀ (shrunk by R/inf = 0)
        assert torch.allclose(t, e, rtol=1e-12, atol=0.0)
    assert walk(theta, start) == pytest.approx(2.5 * scale, rel=1e-12)


# --- the walk rules refuse θ₀ copies in a narrower dtype than their tensors ---------------------------------------
def test_the_walk_and_its_rules_refuse_a_start_rounded_to_a_narrower_dtype():
    from sazo_lite.llm.queries import AfterStep, WalkBound, WalkPull, walk

    theta = torch.randn(1000, generator=torch.Generator().manual_seed(0))
    for narrow in (torch.bfloat16, torch.float16, torch.int64):
        start = [theta.detach().clone().to(narrow)]        # the walk read 0.054 at θ₀ in bfloat16
        for make in (lambda: walk([theta], start), lambda: WalkBound([theta], 1.0, start=start),
                     lambda: WalkPull([theta], 0.1, start=start), lambda: AfterStep([theta], start)):
            with pytest.raises(ValueError, match=r"Invalid start: start\[0\]"):
                make()
    assert walk([theta], [theta.detach().clone()]) == 0.0
    assert walk([theta], [theta.detach().double()]) == 0.0          # a wider copy is θ₀ exactly
    half = theta.detach().clone().bfloat16()
    assert walk([half], [half.clone()]) == 0.0 and walk([half], [half.float()]) == 0.0


# --- WalkBound and WalkPull on half-precision LoRA pairs: θ₀ + keep·(θ − θ₀), rounded once ----------------------
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16, torch.float32, torch.float64])
def test_walk_rules_move_half_precision_lora_pairs_to_the_rounded_exact_point(dtype):
    from sazo_lite.engine import MeZO, StepEvent
    from sazo_lite.llm.queries import WalkBound, WalkPull, walk

    g = torch.Generator().manual_seed(1)
    for trial in range(20):
        start = [torch.randn(16, 32, generator=g).to(dtype), torch.zeros(32, 16, dtype=dtype)]     # LoRA A, B at θ₀
        theta = [(start[0].double() + 0.05 * torch.randn(16, 32, generator=g, dtype=torch.float64)).to(dtype),
                 (0.05 * torch.randn(32, 16, generator=g, dtype=torch.float64)).to(dtype)]
        radius = 0.5 * walk(theta, start)
        optimizer = MeZO(theta, lr=0.25)
        for rule, keep in ((WalkBound(theta, radius, start=start), lambda: radius / walk(theta, start)),
                           (WalkPull(theta, 1.0, start=start), lambda: 0.75)):
            k = keep()
            expected = [(s.double() + k * (t.double() - s.double())).to(dtype) for t, s in zip(theta, start)]
            rule(optimizer, StepEvent("step", 0, 0.0))
            for t, e, s in zip(theta, expected, start):
                if dtype in (torch.bfloat16, torch.float16):    # ~2% of the entries were an ulp off
                    assert torch.equal(t, e)
                else:       # in place: within a few ulps of θ₀'s scale
                    scale = 4 * torch.finfo(dtype).eps * max(1.0, float(s.abs().max()))
                    assert float((t.double() - e.double()).abs().max()) <= scale


# --- StepCap: state_dict / load_state_dict, a resumed run caps as the uninterrupted one ----------------------------
def test_a_step_cap_resumed_from_its_state_caps_as_the_uninterrupted_run():
    from sazo_lite.engine import MeZO
    from sazo_lite.llm.queries import StepCap

    targets = torch.randn(12, 3, generator=torch.Generator().manual_seed(0)) * torch.logspace(0, 2, 12)[:, None]

    def run(split=None):
        theta = torch.zeros(3)
        optimizer, cap = MeZO([theta], lr=0.01, eps=1e-3, seed=0), StepCap(kappa=1.0, warmup=3)
        handle = optimizer.register_step_hook(cap)
        for k, target in enumerate(targets):
            if k == split:          # a new optimiser and a new cap, both loaded from the states saved here
                state, saved = optimizer.state_dict(), cap.state_dict()
                handle.remove()
                optimizer, cap = MeZO([theta], lr=0.01, eps=1e-3, seed=0), StepCap(kappa=1.0, warmup=3)
                optimizer.load_state_dict(state)
                cap.load_state_dict(saved)
                handle = optimizer.register_step_hook(cap)
            optimizer.step(lambda: ((theta - target) ** 2).sum(0, keepdim=True))
        return theta, cap

    plain, plain_cap = run()
    resumed, resumed_cap = run(split=6)
    assert plain_cap.count > 0 and resumed_cap.count == plain_cap.count     # a fresh cap began its warmup again
    assert torch.equal(resumed, plain)
    saved = plain_cap.state_dict()
    for bad in ({**saved, "kappa": 2.0}, {**saved, "seen": -1}, {**saved, "mean_sq": float("nan")}, {"seen": 1}):
        with pytest.raises(ValueError, match="Invalid"):
            StepCap(kappa=1.0, warmup=3).load_state_dict(bad)


# --- llm_kicks: a run that committed no step does not lose the report ----------------------------------------------
def test_kicks_report_a_run_that_committed_no_step_and_go_on(tmp_path, monkeypatch, capsys):
    import json

    from benchmarks import llm_kicks

    model, params, train, test = top_block_setting()
    monkeypatch.setattr(llm_kicks, "top_start", lambda setting: (model, params, train, test, None))
    plain = llm_kicks.query_run

    def refused_at_once(model, params, train, sampler, *, lr, **kwargs):    # the first step's loss was not finite
        if sampler == "uniform":
            run = plain(model, params, train, sampler, lr=lr, **{**kwargs, "steps": 0, "step_hooks": []})
            run.diverged = True
            return run
        return plain(model, params, train, sampler, lr=lr, **kwargs)

    monkeypatch.setattr(llm_kicks, "query_run", refused_at_once)
    out = tmp_path / "kicks.json"
    llm_kicks.main(["uniform:0.01:0", "sazo:0.01:0", "--steps", "3", "--json", str(out)])     # IndexError
    report = json.loads(out.read_text())
    assert [r["sampler"] for r in report["runs"]] == ["uniform", "sazo"]
    assert report["runs"][0]["steps"] == 0 and report["runs"][1]["steps"] == 3
    assert "no step committed" in capsys.readouterr().out


# --- StepCap after a warmup of flat steps --------------------------------------------------------------------------
def test_a_step_cap_whose_warmup_saw_only_flat_steps_does_not_freeze_the_run():
    from sazo_lite.engine import MeZO
    from sazo_lite.llm.queries import StepCap

    theta = torch.zeros(2)
    optimizer, cap = MeZO([theta], lr=0.1, eps=1e-3, seed=0), StepCap(kappa=3.0, warmup=2)
    optimizer.register_step_hook(cap)
    for flat in (True, True, False, False, False):      # ĝ = 0 twice (a flat loss), then a real objective
        optimizer.step(lambda: torch.zeros(1) if flat else ((theta - 5.0) ** 2).sum(0, keepdim=True))
    # the cap was 0 after the flat warmup: every later step was taken back whole (θ stayed at 0, 3 steps capped)
    assert float(theta.norm()) > 0.1 and cap.count == 0 and cap.cap() > 0


# --- llm_topblock: a pull that would carry θ past θ₀ is refused before the setting is built ----------------------
def test_topblock_refuses_a_pull_past_theta0_before_building_the_setting(monkeypatch, capsys):
    from benchmarks import llm_topblock

    def built(*args, **kwargs):
        raise AssertionError("the setting was built (minutes) before the refusal")

    monkeypatch.setattr(llm_topblock, "top_start", built)
    with pytest.raises(SystemExit):
        llm_topblock.main(["uniform", "--lr", "2", "--walk-pull", "0.5", "--steps", "3"])
    assert "Invalid walk_pull" in capsys.readouterr().err

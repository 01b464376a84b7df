"""Round 12 red team of the language-model part (sazo_lite.llm): query races, fine-tuning runs and the continual
sets. Each test of a fix failed on the code before it: median rules that took dicts only, a divergence rule met
at θ₀, diagnostics that raised at a non-finite log point, a reused optimiser's queries, an optimiser over another
model's tensors, unchecked continual-set settings and a first round that taught nothing."""
from __future__ import annotations

import math

import pytest
import torch

pytest.importorskip("transformers")

from sazo_lite import MeZO
from sazo_lite.train import NoiseScaledStep
from sazo_lite.llm import add_lora, full_parameters, tiny_causal_lm
from sazo_lite.llm.continual import cached_first_round, first_round, make_continual_set
from sazo_lite.llm.finetune import snapshot, zo_finetune
from sazo_lite.llm.queries import (QueryRun, median_floor, query_run, queries_to, ratio_bound,
                                  sampling_diagnostics, walk)

from test_llm_round9 import VOCAB, batch       # the same tiny batches
from test_llm_round10 import word_tokenizer    # a tokenizer built in memory


def setup(n: int = 6):
    model = tiny_causal_lm("llama", vocab_size=VOCAB)
    return model, full_parameters(model), batch(n)


def unchanged(params, saved) -> bool:
    return all(torch.equal(p, s) for p, s in zip(params, saved))


class Poison:
    """A step hook that writes NaN into θ after the ``at``-th step (an update that overflowed, as a half
    precision model's can after finite losses at θ ± εz)."""

    def __init__(self, param, at: int):
        self.param, self.at, self.seen = param, at, 0

    @torch.no_grad()
    def __call__(self, optimizer, event):
        if event.kind == "step":
            self.seen += 1
            if self.seen == self.at:
                self.param.fill_(float("nan"))


# --- 1. the median rules ------------------------------------------------------------------------------------
def test_median_floor_and_ratio_bound_take_query_runs_as_queries_to_does():
    cut = QueryRun("uniform", 1e-3, 0, queries=[0, 800, 1600], train_loss=[1.0, 0.8, 0.6])
    fast = QueryRun("sazo", 1e-3, 0, queries=[0, 400], train_loss=[1.0, 0.45])
    assert median_floor([cut, cut, fast], 0.5) == median_floor([r.to_dict() for r in (cut, cut, fast)], 0.5) == 1600
    assert ratio_bound([fast], [cut], 0.5) == ratio_bound([fast.to_dict()], [cut.to_dict()], 0.5) == ("<", 0.25)


@pytest.mark.parametrize("record", [{"queries": [0, 10], "train_loss": [1.0, 0.9]},
                                    {"train_loss": [1.0], "diverged": False}])
def test_median_floor_refuses_a_record_without_its_keys_saying_so(record):
    with pytest.raises(ValueError, match="Invalid runs"):       # was a KeyError
        median_floor([record], 0.5)


@pytest.mark.parametrize("start", [math.inf, math.nan])
def test_queries_to_refuses_a_run_whose_first_loss_is_not_finite(start):
    run = {"queries": [0, 10], "train_loss": [start, 0.1], "diverged": False}
    with pytest.raises(ValueError, match="train_loss"):        # inf read every loss as reached at 0 queries
        queries_to(run, 0.5)
    with pytest.raises(ValueError, match="train_loss"):
        median_floor([run], 0.5)


@pytest.mark.parametrize("probs, scores, name", [
    (torch.tensor([2.0, 3.0, 5.0], dtype=torch.float64), None, "probs"),      # was TV 4.5, V(p)/V(p*) 0.1 < 1
    (torch.tensor([0.1, 0.1, 0.1], dtype=torch.float64), None, "probs"),
    (torch.tensor([0.2, 0.3, 0.5], dtype=torch.float64), torch.tensor([1.0, 2.0]), "scores")])   # was "b"
def test_sampling_diagnostics_refuse_weights_that_are_not_a_distribution_and_scores_of_another_length(probs, scores,
                                                                                                       name):
    with pytest.raises(ValueError, match=f"Invalid {name}"):
        sampling_diagnostics(torch.tensor([1.0, 2.0, 3.0]), probs, scores)


def test_sampling_diagnostics_of_a_distribution_match_their_definitions():
    norms, probs = torch.tensor([1.0, 2.0, 3.0]), torch.tensor([0.2, 0.3, 0.5])     # float32 sums: accepted
    out = sampling_diagnostics(norms, probs, torch.tensor([3.0, 2.0, 1.0]))
    star = norms.double() / norms.sum()
    v = lambda p: float((norms.double() ** 2 / p).sum())
    assert out["tv"] == pytest.approx(0.5 * float((probs.double() - star).abs().sum()), rel=1e-6)
    assert out["v_ratio"] == pytest.approx(v(probs.double()) / v(star), rel=1e-6) and out["rho"] == pytest.approx(-1.0)


# --- 2. query_run: a divergence rule met at θ₀, a non-finite log point, a pull past θ₀ -----------------------
@pytest.mark.parametrize("factor", [0.5, 1.0])
def test_a_divergence_factor_at_or_below_one_is_refused_before_theta_moves(factor):
    model, params, data = setup()
    saved = snapshot(params)
    with pytest.raises(ValueError, match="diverge_factor"):    # a run whose loss fell was marked diverged
        query_run(model, params, data, "uniform", lr=1e-3, steps=4, log_every=2, diverge_factor=factor)
    assert unchanged(params, saved)


@pytest.mark.parametrize("sampler", ["uniform", "sazo", "oracle"])
def test_a_non_finite_log_point_ends_the_run_as_diverged_with_diagnose_on(sampler):
    model, params, data = setup()
    run = query_run(model, params, data, sampler, lr=1e-3, steps=8, log_every=1, diagnose=1, test_batch=batch(3, 1),
                    step_hooks=[Poison(params[0], at=3)])       # the true norms of that θ raised
    assert run.diverged and run.steps_run == 3 and math.isnan(run.train_loss[-1])
    assert [d["queries"] for d in run.diagnostics] == run.queries[:-1] and run.test_accuracy is None


def test_a_non_finite_loss_at_theta0_is_refused_naming_it():
    model, params, data = setup()
    with torch.no_grad():
        params[0].fill_(float("nan"))
    with pytest.raises(ValueError, match="F\\(θ₀\\)"):       # was "Invalid diverge_above: nan"
        query_run(model, params, data, "uniform", lr=1e-3, steps=2)


@pytest.mark.parametrize("rule", [True, NoiseScaledStep(max_scale=2.0)])
def test_a_pull_past_theta0_at_the_step_rules_largest_rate_is_refused_before_theta_moves(rule):
    model, params, data = setup()
    saved = snapshot(params)
    with pytest.raises(ValueError, match="walk_pull"):        # raised mid-run, once the rule had raised the rate
        query_run(model, params, data, "uniform", lr=0.09, steps=40, log_every=4, walk_pull=10.0, step_rule=rule)
    assert unchanged(params, saved)


def test_query_counts_and_the_walk_match_their_plain_definitions():
    model, params, data = setup()
    saved = snapshot(params)
    run = query_run(model, params, data, "sazo", lr=1e-3, batch_size=3, steps=7, log_every=3)
    assert run.queries == [0, 18, 36, 42] and run.steps_run == 7                  # 2·B per step, the end logged
    plain = torch.linalg.norm(torch.cat([(p.detach() - s).double().flatten() for p, s in zip(params, saved)]))
    assert run.walk[-1] == pytest.approx(float(plain), rel=1e-9) == walk(params, saved)


# --- 3. zo_finetune -------------------------------------------------------------------------------------------
def test_zo_finetune_with_a_reused_optimiser_counts_only_this_runs_queries():
    model, params, data = setup()
    optimizer = MeZO(params, lr=1e-3, eps=1e-3, seed=0)
    first = zo_finetune(model, params, data, steps=4, batch_size=2, log_every=2, optimizer=optimizer, progress=False)
    second = zo_finetune(model, params, data, steps=4, batch_size=2, log_every=2, optimizer=optimizer, progress=False)
    assert first.queries == second.queries == [0, 8, 16]                          # was [0, 24, 32]
    assert second.sample_counts.sum().item() == 8


def test_zo_finetune_refuses_an_optimiser_over_another_models_tensors():
    model, params, data = setup()
    other = tiny_causal_lm("llama", vocab_size=VOCAB, seed=1)
    with pytest.raises(ValueError, match="params"):       # ran, every δ 0, F unchanged
        zo_finetune(model, params, data, steps=2, optimizer=MeZO(full_parameters(other), lr=1e-3), progress=False)


# --- 4. continual sets and their first round -------------------------------------------------------------
@pytest.mark.parametrize("bad", [dict(new_fraction="0.5"), dict(new_fraction=True), dict(seed=1.5), dict(seed="x"),
                                 dict(pool=0), dict(pool=-3), dict(pool=2.5)])
def test_make_continual_set_refuses_bad_settings_by_name(bad):
    name = "homogeneous" if "pool" in bad else "continual"
    with pytest.raises(ValueError, match=f"Invalid {next(iter(bad))}"):
        make_continual_set(name, **bad)


def test_first_round_refuses_tensors_that_get_no_gradient_before_any_step():
    tokenizer = word_tokenizer(eos_token="c")
    model = tiny_causal_lm("llama", vocab_size=VOCAB)
    cset = make_continual_set("continual", num_train=4, num_test=2)
    other = full_parameters(tiny_causal_lm("llama", vocab_size=VOCAB, seed=1))
    with pytest.raises(ValueError, match="params"):              # Adam skipped them: a round that taught nothing
        first_round(model, other, cset, tokenizer, steps=2)
    params = full_parameters(model)
    params[1].requires_grad_(False)
    saved = snapshot(params)
    with pytest.raises(ValueError, match="gradient"):
        first_round(model, params, cset, tokenizer, steps=2)
    assert unchanged(params, saved) and all(p.grad is None for p in params)


def test_cached_first_round_refuses_another_models_tensors_when_the_cache_holds_the_round(tmp_path, monkeypatch):
    monkeypatch.setenv("SAZO_CACHE", str(tmp_path))
    tokenizer = word_tokenizer(eos_token="c")
    model = tiny_causal_lm("llama", vocab_size=VOCAB)
    cset = make_continual_set("continual", num_train=4, num_test=2)
    assert cached_first_round(model, full_parameters(model), cset, tokenizer, key="k", steps=1, progress=False) is False
    fresh = tiny_causal_lm("llama", vocab_size=VOCAB)
    other = full_parameters(tiny_causal_lm("llama", vocab_size=VOCAB))
    saved = snapshot(full_parameters(fresh))
    with pytest.raises(ValueError, match="params"):      # was True: the round went into the other copy
        cached_first_round(fresh, other, cset, tokenizer, key="k", steps=1, progress=False)
    assert unchanged(full_parameters(fresh), saved)
    assert cached_first_round(fresh, full_parameters(fresh), cset, tokenizer, key="k", steps=1, progress=False) is True
    assert all(torch.equal(a, b) for a, b in zip(full_parameters(fresh), full_parameters(model)))


# --- 5. LoRA -------------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("bad", [1.5, 2 ** 70, "0", True])
def test_add_lora_refuses_an_init_seed_torch_cannot_take_by_name(bad):
    pytest.importorskip("peft")
    model = tiny_causal_lm("llama", vocab_size=VOCAB)
    with pytest.raises(ValueError, match="Invalid init_seed"):     # a bare "Overflow", or 1.5 seeded as 1
        add_lora(model, rank=2, init_seed=bad)

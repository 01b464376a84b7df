"""Round 14 defect hunt of the language-model part (sazo_lite.llm): per-example norms, the walk rules, query races
and the homogeneous control's selection on hostile inputs (a tensor given twice, a run without a model), with
top-block tuning, repeated runs and the generated sets checked against plain references. Each test of a fix
failed on the code before it."""
from __future__ import annotations

import math

import pytest
import torch
from hypothesis import given, settings, strategies as st

pytest.importorskip("transformers")

from sazo_lite import MeZO
from sazo_lite.engine import StepEvent
from sazo_lite.train import NoiseScaledStep
from sazo_lite.llm import TINY_FAMILIES, add_lora, tiny_causal_lm, trainable_parameters
from sazo_lite.llm.continual import alike_indices, cached_first_round, first_round, keep_alike, make_continual_set
from sazo_lite.llm.finetune import restore_snapshot, snapshot
from sazo_lite.llm.grad_norms import (RefreshingNorms, directional_error, full_gradient_norm, grad_norms,
                                     linear_grad_norms, loop_grad_norms)
from sazo_lite.llm.losses import TokenBatch, accuracy, classification_losses, encode_answers
from sazo_lite.llm.queries import (AfterStep, StepCap, WalkBound, WalkPull, held_out_accuracies, median_floor,
                                  queries_to, query_run, ratio_bound, walk)
from sazo_lite.llm.topblock import TopBlocks, decoder_layers, top_layers

from test_llm_round8 import CharTokenizer              # one token a character
from test_llm_round9 import VOCAB, batch, jiggle       # the same tiny batches
from test_llm_round10 import word_tokenizer            # a tokenizer built in memory
from test_llm_round13 import equal_length_batch       # no padding: vmap applies
from test_llm_topblock import lora_top                 # LoRA on a tiny model's top block


# --- 1. per-example norms: one tensor given twice ----------------------------------------------------------------
def adapted(seed: int = 1):
    model = add_lora(tiny_causal_lm("llama", vocab_size=VOCAB, seed=seed), rank=2)
    params = trainable_parameters(model)
    jiggle(params, 0.2)
    return model, params


@pytest.mark.parametrize("method", ["auto", "linear", "vmap", "loop"])
def test_norms_refuse_a_tensor_given_twice_the_methods_counted_it_differently(method):
    # the loop counted the repeated tensor's gradient twice (0.4572 for 0.4544), linear and vmap once
    model, params = adapted()
    data = equal_length_batch(5)
    twice = params + [params[1]]
    with pytest.raises(ValueError, match="Invalid params: .*share memory"):
        grad_norms(model, data, twice, method=method)
    exact = grad_norms(model, data, params, method="loop")
    assert torch.allclose(grad_norms(model, data, params, method=method), exact, rtol=1e-5)


def test_full_gradient_norm_and_directional_error_refuse_a_tensor_given_twice():
    # ‖∇F‖ counted it twice; directional_error moved it by 2εz against one zᵀ∇f (its errors fell 3×)
    model, params = adapted()
    data = batch(5)
    twice = params + [params[0]]
    with pytest.raises(ValueError, match="Invalid params: .*share memory"):
        full_gradient_norm(model, data, twice)
    with pytest.raises(ValueError, match="Invalid params: .*share memory"):
        directional_error(model, data, twice, eps=1e-3, draws=1)
    views = [params[0][:1], params[0][:2]]       # two views of one adapter share its first row
    with pytest.raises(ValueError, match="Invalid params: .*share memory"):
        grad_norms(model, data, views, method="loop")



class SequenceFirst(torch.nn.Module):
    """A Linear fed rows [T, B, d] (sequence-first, as ChatGLM's layers take them), or [B, T, d]."""

    def __init__(self, sequence_first: bool):
        super().__init__()
        self.proj, self.sequence_first = torch.nn.Linear(3, 2), sequence_first

    def forward(self, x):                                                   # x [B, T, 3] → losses [B]
        if not self.sequence_first:
            return self.proj(x).pow(2).sum((1, 2))
        return self.proj(x.transpose(0, 1)).transpose(0, 1).pow(2).sum((1, 2))


@pytest.mark.parametrize("sequence_first", [True, False])
def test_linear_norms_do_not_split_sequence_first_rows_by_position_when_t_equals_b(sequence_first):
    # with T = B = 4 the rows [T, B, d] were split by position and passed the sum check: norms 7.68, 4.10, 10.37,
    # 12.17 for the exact 7.92, 3.27, 8.02, 12.98
    torch.manual_seed(0)
    net, x = SequenceFirst(sequence_first), torch.randn(8, 4, 3)
    losses, params, part = (lambda idx: net(x[list(idx)])), list(net.parameters()), [0, 1, 2, 3]
    exact = loop_grad_norms(losses, params, part)
    if sequence_first:
        with pytest.raises(ValueError, match="Invalid params: .*split"):
            linear_grad_norms(net, losses, params, part)
    else:            # batch-first rows with T = B: checked by the weighted backward, and exact
        assert torch.allclose(linear_grad_norms(net, losses, params, part), exact, rtol=1e-6)

# --- 2. the homogeneous control's selection: norms that cannot be ranked ----------------------------------------
@pytest.mark.parametrize("norms, why", [([1.0, float("nan"), 2.0, 3.0, 2.1], "finite"),
                                        ([1.0, -5.0, 2.0, 3.0], "non-negative"),
                                        ([1.0, float("inf"), 2.0], "finite"),
                                        ([[1.0, 2.0], [3.0, 4.0]], "shape")])
def test_alike_indices_refuse_norms_that_cannot_be_ranked(norms, why):
    # NaN: the median and every distance were NaN and the first indices were kept, the NaN one among them;
    # -5 was read as 1e-30; a [2, 2] tensor answered [[0, 1], [1, 0]]
    with pytest.raises(ValueError, match=f"Invalid norms: .*{why}"):
        alike_indices(torch.tensor(norms), 2)
    cset = make_continual_set("homogeneous", num_train=len(norms), num_test=2)
    with pytest.raises(ValueError, match="Invalid norms"):
        keep_alike(cset, torch.tensor(norms), 2)


def test_alike_indices_match_a_plain_reference_on_random_norms():
    g = torch.Generator().manual_seed(0)
    for n in (1, 2, 5, 8, 13):
        norms = torch.rand(n, generator=g, dtype=torch.float64) * 10.0 ** torch.randint(-3, 3, (n,), generator=g)
        logs = [float(x) for x in norms.log()]
        middle = sorted(logs)[(n - 1) // 2]        # torch.median: the lower of the two middle values
        for keep in range(1, n + 1):
            order = sorted(range(n), key=lambda i: (abs(logs[i] - middle), i))
            assert alike_indices(norms, keep) == sorted(order[:keep])
            assert alike_indices(norms.tolist(), keep) == sorted(order[:keep])     # a list reads the same


# --- 3. the walk rules: one tensor given twice ---------------------------------------------------------------------
def test_the_walk_and_its_rules_refuse_a_tensor_given_twice():
    # the walk counted it twice (7.07 for a walk of 5), and WalkBound shrank it twice: a walk of 5 bound at R = 1
    # ended at 0.1
    theta, zero = torch.tensor([3.0, 4.0]), torch.zeros(2)
    with pytest.raises(ValueError, match="Invalid params: .*share memory"):
        walk([theta, theta], [zero, zero])
    for rule in (lambda: WalkBound([theta, theta], radius=1.0, start=[zero, zero]),
                 lambda: WalkPull([theta, theta], strength=1.0), lambda: AfterStep([theta, theta[1:]])):
        with pytest.raises(ValueError, match="Invalid params: .*share memory"):
            rule()
    optimizer = MeZO([theta], lr=0.0, eps=1e-3, seed=0)
    bound = WalkBound([theta], radius=1.0, start=[zero])
    bound(optimizer, StepEvent("step", 0, 0.0))
    assert walk([theta], [zero]) == pytest.approx(1.0) and theta.tolist() == pytest.approx([0.6, 0.8])


# --- 4. query races: a top-block run without a model ----------------------------------------------------------------
def test_a_top_block_run_without_a_model_measures_a_token_batch_test_split():
    # model=None took the TopBlocks' own model for the tuned tensors, but the held-out accuracy of a TokenBatch ran
    # accuracy(None, ...): an AttributeError once the whole run had been made (mid-run with accuracy_at)
    model, params = lora_top("llama")
    train, test = TopBlocks(model, batch(6)), batch(4, seed=1)
    start = snapshot(params)
    settings = dict(lr=1e-2, steps=4, log_every=2, seed=3, test_batch=test, accuracy_at=4)
    without = query_run(None, params, train, "sazo", **settings)
    restore_snapshot(params, start)
    assert without.test_accuracy is not None and without.budget_accuracy is not None
    assert without.to_dict() == query_run(model, params, train, "sazo", **settings).to_dict()


# --- 5. query races: a step rule given to several runs -------------------------------------------------------------
def test_a_step_rule_given_to_several_runs_starts_each_afresh():
    # the rule kept its reference and running mean: the second run started at the first's last scale (0.59), without
    # its warmup, and its losses differed from the first's
    model, params = lora_top("llama")
    train = TopBlocks(model, batch(6))
    start, rule = snapshot(params), NoiseScaledStep(warmup=3)
    runs = []
    for _ in range(2):
        restore_snapshot(params, start)
        run = query_run(model, params, train, "uniform", lr=0.05, steps=12, log_every=3, step_rule=rule)
        runs.append(run.to_dict())
    assert runs[0] == runs[1] and runs[0]["lr_scale"][:2] == [1.0, 1.0] and runs[0]["lr_scale"][-1] != 1.0
    assert rule.seen == 0                       # the object given is left as it was


# --- 6. held-out accuracy of a batch without labels --------------------------------------------------------------
def unlabelled(n: int = 4) -> TokenBatch:
    plain = batch(n, seed=1)
    return TokenBatch(plain.ids, plain.prompt_lengths, 0, None, plain.label_ids)


def test_accuracy_of_a_batch_without_labels_is_a_value_error():
    # predictions == None was False, and False.double() an AttributeError
    model = tiny_causal_lm("llama", vocab_size=VOCAB)
    with pytest.raises(ValueError, match="Invalid batch: no labels"):
        accuracy(model, unlabelled())


def test_query_run_refuses_a_test_split_without_labels_before_the_run():
    # the whole run was made, then its held-out accuracy raised AttributeError
    model, params = lora_top("llama")
    train, start = TopBlocks(model, batch(6)), snapshot(params)
    with pytest.raises(ValueError, match="Invalid test_batch: no labels"):
        query_run(model, params, train, "uniform", lr=1e-2, steps=3, log_every=1, test_batch=unlabelled())
    assert all(torch.equal(p, s) for p, s in zip(params, start))


@pytest.mark.parametrize("family, ids, why", [("llama", [[5, 6, 70], [8, 9]], "token id 70"),
                                              ("gpt2", [[5] * 130, [8, 9]], "130 tokens")])
def test_query_run_refuses_a_test_split_the_model_cannot_read_before_the_run(family, ids, why):
    # an id past the vocabulary, or a row past GPT-2's 128 learned positions: the whole run was made, θ moved, then
    # the held-out accuracy refused the split and the run's record was lost
    model, params = lora_top(family)
    train, start = TopBlocks(model, batch(6)), snapshot(params)
    test = TokenBatch(ids, [len(r) for r in ids], 0, torch.tensor([0, 1]), torch.tensor([5, 9]))
    with pytest.raises(ValueError, match=f"Invalid test_batch: .*{why}"):
        query_run(model, params, train, "uniform", lr=1e-2, steps=3, log_every=1, test_batch=test)
    assert all(torch.equal(p, s) for p, s in zip(params, start))


# --- 7. checks against plain references (no defect found) ---------------------------------------------------------
def plain_queries_to(run: dict, fraction: float):
    target = fraction * run["train_loss"][0]
    return next((q for q, f in zip(run["queries"], run["train_loss"]) if f <= target), None)


def plain_median(values):
    ordered = sorted(values)
    mid = len(ordered) // 2
    return ordered[mid] if len(ordered) % 2 else (ordered[mid - 1] + ordered[mid]) / 2


runs = st.builds(
    lambda losses, diverged, step: {"queries": [step * k for k in range(len(losses))], "train_loss": losses,
                                    "diverged": diverged},
    st.lists(st.floats(0.01, 3.0), min_size=1, max_size=6), st.booleans(), st.integers(1, 50))


@settings(max_examples=300, deadline=None)
@given(st.lists(runs, min_size=1, max_size=5), st.lists(runs, min_size=1, max_size=5),
       st.sampled_from([0.3, 0.5, 0.8, 1.0]))
def test_queries_to_median_floor_and_ratio_bound_match_plain_references(top, bottom, fraction):
    for r in top + bottom:
        assert queries_to(r, fraction) == plain_queries_to(r, fraction)
    floor = lambda rs: plain_median([q if (q := plain_queries_to(r, fraction)) is not None
                                     else math.inf if r["diverged"] else r["queries"][-1] for r in rs])
    assert median_floor(top, fraction) == floor(top)
    median = lambda rs: plain_median([math.inf if (q := plain_queries_to(r, fraction)) is None else q for r in rs])
    t, b = median(top), median(bottom)
    expected = None
    if math.isfinite(t) and math.isinf(b) and math.isfinite(floor(bottom)) and floor(bottom) > 0:
        expected = ("<", t / floor(bottom))
    if math.isinf(t) and math.isfinite(b) and b > 0 and math.isfinite(floor(top)):
        expected = (">", floor(top) / b)
    assert ratio_bound(top, bottom, fraction) == expected


def test_held_out_accuracies_take_the_budget_where_measured_ties_and_repeats_kept():
    records = [{"budget_accuracy": 0.5, "test_accuracy": 0.9}, {"budget_accuracy": 0.5, "test_accuracy": None},
               {"budget_accuracy": 0.75, "test_accuracy": 0.75}]
    assert held_out_accuracies(records) == [0.5, 0.5, 0.75]
    assert held_out_accuracies([{"test_accuracy": 0.5}, {"test_accuracy": 0.5}, {"test_accuracy": None}]) == [0.5, 0.5]


@pytest.mark.parametrize("family", TINY_FAMILIES)
def test_top_blocks_equal_the_full_model_on_random_splits_with_nonzero_adapters_in_float64(family):
    g = torch.Generator().manual_seed(7)
    base = tiny_causal_lm(family, vocab_size=VOCAB, seed=2, dtype=torch.float64)
    every = len(decoder_layers(base))
    for blocks in range(1, every + 1):
        model = add_lora(tiny_causal_lm(family, vocab_size=VOCAB, seed=2, dtype=torch.float64), rank=2,
                         layers=top_layers(base, blocks))
        params = trainable_parameters(model)
        jiggle(params, 0.3)
        lengths = torch.randint(1, 9, (5,), generator=g).tolist()
        ids = [torch.randint(3, VOCAB, (n,), generator=g).tolist() for n in lengths]
        pad = int(torch.randint(0, VOCAB, (), generator=g))          # any id: the mask, not the id, pads
        data = TokenBatch(ids, lengths, pad, torch.randint(0, 3, (5,), generator=g), torch.tensor([5, 9, 11]))
        top = TopBlocks(model, data, blocks=blocks)
        order = torch.randint(0, 5, (6,), generator=g).tolist()
        assert torch.allclose(top(order), classification_losses(model, data, order), atol=1e-10, rtol=0)
        exact = grad_norms(model, data, params, indices=order, method="loop")
        for method in ("auto", "linear", "loop"):
            assert torch.allclose(top.grad_norms(params, order, method=method), exact, rtol=1e-8), method


def test_query_runs_repeat_bit_for_bit_for_every_sampler_under_the_walk_rules():
    model, params = lora_top("llama")
    train, test = TopBlocks(model, batch(6)), TopBlocks(model, batch(4, seed=1))
    start = snapshot(params)
    settings = dict(lr=0.3, steps=8, log_every=2, batch_size=2, test_batch=test, walk_bound=0.02, step_cap=1.0,
                    step_rule=NoiseScaledStep(warmup=2), accuracy_at=8)
    for sampler in ("uniform", "sazo", "oracle"):
        first = query_run(model, params, train, sampler, **settings).to_dict()
        restore_snapshot(params, start)
        assert query_run(model, params, train, sampler, **settings).to_dict() == first, sampler
        restore_snapshot(params, start)
        assert max(first["walk"]) <= 0.02 * (1 + 1e-6) and first["bound_steps"] > 0, sampler


# --- 8. answers longer than max_length ------------------------------------------------------------------------------
def test_encode_answers_refuses_an_answer_that_leaves_no_room_for_a_prompt_token():
    # max_length=4 with a 6-token answer kept one prompt token and the whole answer: a row of 7 tokens, past the
    # max_length asked for (and past a model's learned positions where max_length was chosen to fit them)
    tok = CharTokenizer()
    data = encode_answers(tok, ["abcdef", "ab"], ["xyz", "x"], max_length=4)
    assert data.ids == [tok("f")["input_ids"] + tok("xyz")["input_ids"], tok("ab")["input_ids"] + tok("x")["input_ids"]]
    assert max(len(r) for r in data.ids) <= 4
    for answer in ("wxyz", "uvwxyz"):
        with pytest.raises(ValueError, match=f"Invalid max_length: 4 .*answer 1 alone has {len(answer)} tokens"):
            encode_answers(tok, ["abcdef", "ab"], ["xyz", answer], max_length=4)


# --- 9. the first round: one tensor given twice -------------------------------------------------------------------
def test_the_first_round_refuses_a_tensor_given_twice_adam_stepped_it_twice(tmp_path, monkeypatch):
    # torch's Adam only warns about a repeated tensor, then moves it by two steps a step
    monkeypatch.setenv("SAZO_CACHE", str(tmp_path))
    model, params = adapted()
    cset, tokenizer = make_continual_set("continual", num_train=4, num_test=2), word_tokenizer(eos_token="c")
    start = snapshot(params)
    for run in (first_round, lambda *a, **k: cached_first_round(*a, key="k", **k)):
        with pytest.raises(ValueError, match="Invalid params: .*share memory"):
            run(model, params + [params[0]], cset, tokenizer, steps=1, progress=False)
        assert all(torch.equal(p, s) for p, s in zip(params, start))
    with pytest.raises(ValueError, match="Invalid params: .*share memory"):
        query_run(model, params + [params[0]], batch(4), "uniform", lr=1e-3, steps=1)


# --- 10. query_run's loop settings, named as query_run names them ------------------------------------------------
@pytest.mark.parametrize("settings, message", [
    (dict(log_every=0), "Invalid log_every: 0"), (dict(batch_size=0), "Invalid batch_size: 0"),   # ZeroDivisionError
    (dict(batch_size=1.5), "Invalid batch_size: 1.5"),       # was "Invalid steps: 2.0" (the budget's steps)
    (dict(log_every=2.5), "Invalid log_every: 2.5"),         # was "Invalid steps: 2.5"
    (dict(steps=2.5), "Invalid steps: 2.5"),                 # was "Invalid steps: 0.5" (the steps after the budget)
    (dict(steps=True), "Invalid steps: True")])
def test_query_run_names_its_loop_settings_before_anything_runs(settings, message):
    model, params = lora_top("llama")
    train, test = TopBlocks(model, batch(6)), TopBlocks(model, batch(4, seed=1))
    start = snapshot(params)
    with pytest.raises(ValueError, match=message):
        query_run(model, params, train, "uniform", lr=1e-2, test_batch=test, accuracy_at=4,
                  **{"steps": 4, "log_every": 2, **settings})
    assert all(torch.equal(p, s) for p, s in zip(params, start))


def test_the_walk_and_its_rules_refuse_the_tuned_tensors_themselves_as_theta0():
    # start=params (not copies): θ − θ₀ was 0 at every step, the walk read 0 and the bound never acted
    theta = torch.tensor([3.0, 4.0])
    for make in (lambda: walk([theta], [theta]), lambda: WalkBound([theta], radius=1.0, start=[theta]),
                 lambda: WalkPull([theta], strength=1.0, start=[theta[:]])):
        with pytest.raises(ValueError, match="Invalid start: it shares memory with the tuned tensors"):
            make()
    zero = torch.zeros(2)        # one copy read for two tensors of its shape: accepted
    assert walk([theta, theta.clone()], [zero, zero]) == pytest.approx(50 ** 0.5)


# --- 11. numpy ints, as a grid from np.arange gives them ----------------------------------------------------------
def test_numpy_ints_are_taken_as_ints_they_were_refused():
    np = pytest.importorskip("numpy")
    base = tiny_causal_lm("llama", vocab_size=VOCAB, seed=1)
    assert top_layers(base, np.int64(1)) == top_layers(base, 1) == [1]
    model = add_lora(base, rank=np.int64(2), layers=top_layers(base, np.int64(1)))
    params = trainable_parameters(model)
    assert params[0].shape[0] == 2                                       # lora_A [r, d_in]
    data = batch(4)
    top = TopBlocks(model, data, blocks=np.int64(1))
    assert top.blocks == 1 and torch.equal(top([0, 1]), TopBlocks(model, data, blocks=1)([0, 1]))
    assert alike_indices(torch.tensor([1.0, 2.0, 3.0]), np.int64(2)) == alike_indices(torch.tensor([1.0, 2.0, 3.0]), 2)
    assert StepCap(warmup=np.int64(3)).warmup == 3
    assert RefreshingNorms(lambda: torch.ones(2), every=np.int64(2), clock=lambda: 0).every == 2
    for bad in (np.int64(0), np.float64(1.0), True):
        with pytest.raises(ValueError, match="Invalid blocks"):
            TopBlocks(model, data, blocks=bad)


def test_query_run_without_a_model_on_a_token_batch_says_so():
    # None with a TokenBatch train split: AttributeError 'NoneType' object has no attribute 'parameters'
    model, params = lora_top("llama")
    with pytest.raises(ValueError, match="Invalid model: NoneType .*TopBlocks"):
        query_run(None, params, batch(4), "uniform", lr=1e-2, steps=1)

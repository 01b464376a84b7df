"""True per-example gradient norms, the LLM oracle sampler, the continual sets and query runs (tiny models)."""
import os
import sys
import statistics

os.environ["HF_HUB_OFFLINE"] = "1"

import pytest
import torch

pytest.importorskip("transformers")

from sazo_lite import OracleSampler
from sazo_lite.llm import TINY_FAMILIES, TokenBatch, add_lora, tiny_causal_lm, trainable_parameters
from sazo_lite.llm.continual import (SET_NAMES, first_round, heterogeneity, keep_alike, make_continual_set,
                                     predicted_gains)
from sazo_lite.llm.grad_norms import (RefreshingNorms, example_losses, full_gradient_norm, grad_norms,
                                      linear_grad_norms, loop_grad_norms)
from sazo_lite.llm.queries import query_run, queries_to, sampling_diagnostics
from sazo_lite.variance import oracle_probs, sampling_variance
from sazo_lite.llm.tasks import _NEGATIVE, _POSITIVE

VOCAB = 128


def random_batch(n=8, seed=0):
    g = torch.Generator().manual_seed(seed)
    ids = [torch.randint(3, VOCAB, (int(torch.randint(5, 10, (1,), generator=g)),), generator=g).tolist()
           for _ in range(n)]
    return TokenBatch(ids=ids, prompt_lengths=[len(r) - 2 for r in ids], pad_id=0,
                      labels=torch.randint(0, 3, (n,), generator=g), label_ids=torch.tensor([5, 9, 17]))


def lora_model(family="llama", seed=0):
    model = add_lora(tiny_causal_lm(family, vocab_size=VOCAB, seed=seed), rank=2)
    params = trainable_parameters(model)
    with torch.no_grad():          # peft starts B at 0: give the adapters a non-trivial state
        g = torch.Generator().manual_seed(seed)
        for p in params:
            p.add_(0.2 * torch.randn(p.shape, generator=g))
    return model, params


# -- true norms against autograd ---------------------------------------------------------------
def test_norms_match_torch_func_per_sample_gradients_on_a_toy_network():
    torch.manual_seed(0)
    net = torch.nn.Sequential(torch.nn.Linear(5, 7), torch.nn.Tanh(), torch.nn.Linear(7, 3))
    x, y = torch.randn(12, 5), torch.randint(0, 3, (12,))
    params = dict(net.named_parameters())

    def one(p, xi, yi):  # f_i for one example, functionally
        logits = torch.func.functional_call(net, p, (xi[None],))
        return torch.nn.functional.cross_entropy(logits, yi[None])
    per_sample = torch.func.vmap(torch.func.grad(one), in_dims=(None, 0, 0))(params, x, y)
    reference = torch.cat([g.reshape(12, -1) for g in per_sample.values()], 1).pow(2).sum(1).sqrt()

    losses = lambda idx: torch.nn.functional.cross_entropy(net(x[list(idx)]), y[list(idx)], reduction="none")
    for norms in (loop_grad_norms(losses, net.parameters(), range(12)),
                  linear_grad_norms(net, losses, list(net.parameters()), range(12), chunk=5)):
        assert torch.allclose(norms, reference.double(), rtol=1e-5)
    # not the norm of the batch gradient, and not the same for every example
    mean_grad = torch.autograd.grad(losses(range(12)).mean(), list(net.parameters()))
    assert not torch.allclose(reference, torch.full_like(reference, float(sum(g.pow(2).sum() for g in mean_grad)) ** .5))


def test_batched_hooks_need_linear_parameters():
    net = torch.nn.Sequential(torch.nn.Embedding(10, 4), torch.nn.Linear(4, 1))
    losses = lambda idx: net(torch.tensor(list(idx))).squeeze(-1) ** 2
    with pytest.raises(ValueError, match="nn.Linear"):
        linear_grad_norms(net, losses, list(net.parameters()), range(3))


@pytest.mark.parametrize("family", TINY_FAMILIES)
@pytest.mark.parametrize("loss", ["classification", "answer"])
def test_lora_norms_batched_equal_one_backward_per_example(family, loss):
    model, params = lora_model(family)
    batch = random_batch()   # rows of different lengths: padding must not leak into the gradients
    fast = grad_norms(model, batch, params, loss=loss, method="linear", chunk=3)
    slow = grad_norms(model, batch, params, loss=loss, method="loop")
    assert torch.allclose(fast, slow, rtol=1e-4) and bool((slow > 0).all())
    assert all(p.grad is None for p in params)   # measuring leaves no .grad behind


def test_full_parameter_norms_fall_back_to_the_loop():
    model = tiny_causal_lm("gpt2", vocab_size=VOCAB)   # embeddings are not Linear weights
    batch = random_batch(n=3)
    params = [p for p in model.parameters()]
    auto = grad_norms(model, batch, params)
    losses = example_losses(model, batch)
    manual = torch.stack([torch.cat([g.flatten() for g in torch.autograd.grad(losses([i]).sum(), params)]).norm()
                          for i in range(3)]).double()
    assert torch.allclose(auto, manual, rtol=1e-5)


def equal_length_batch(n=6, length=7, seed=3):
    g = torch.Generator().manual_seed(seed)
    ids = [torch.randint(3, VOCAB, (length,), generator=g).tolist() for _ in range(n)]
    return TokenBatch(ids=ids, prompt_lengths=[length] * n, pad_id=0,
                      labels=torch.randint(0, 3, (n,), generator=g), label_ids=torch.tensor([5, 9, 17]))


@pytest.mark.parametrize("family", TINY_FAMILIES)
def test_full_parameter_norms_by_vmap_equal_the_loop_and_gpt2_falls_back(family, monkeypatch):
    gn = sys.modules["sazo_lite.llm.grad_norms"]     # the package exports a function of the same name

    model = tiny_causal_lm(family, vocab_size=VOCAB, seed=1)
    params = [p for n, p in model.named_parameters() if "embed" not in n or family == "llama"]
    batch, indices = equal_length_batch(), [5, 1, 3, 0]
    loop = grad_norms(model, batch, params, indices=indices, method="loop")
    monkeypatch.setattr(gn, "_UNTRACEABLE", set())
    calls = []
    real = gn.vmap_grad_norms
    monkeypatch.setattr(gn, "vmap_grad_norms", lambda *a, **k: calls.append(1) or real(*a, **k))
    auto = grad_norms(model, batch, params, indices=indices)
    assert calls and torch.allclose(auto, loop, rtol=1e-5)           # vmap tried; the same norms either way
    if family == "gpt2":       # its forward branches on data: the loop served, and serves from now on
        assert type(model) in gn._UNTRACEABLE
    else:
        assert not gn._UNTRACEABLE
        one_at_a_time = real(model, batch, params, indices, max_bytes=1)      # chunks of one example
        assert torch.allclose(one_at_a_time, loop, rtol=1e-5)
    grad_norms(model, batch, params, indices=indices)
    assert len(calls) == (1 if family == "gpt2" else 2)


def test_padded_examples_never_go_to_vmap():
    gn = sys.modules["sazo_lite.llm.grad_norms"]     # the package exports a function of the same name

    model, batch = tiny_causal_lm("llama", vocab_size=VOCAB), random_batch(n=4)      # lengths differ
    assert len({len(r) for r in batch.ids}) > 1
    with pytest.raises(ValueError, match="one length"):
        gn.vmap_grad_norms(model, batch, list(model.parameters()))
    with pytest.raises(ValueError, match="parameter of the model"):
        gn.vmap_grad_norms(model, equal_length_batch(), [torch.nn.Parameter(torch.zeros(2))])
    params = list(model.parameters())
    assert torch.allclose(grad_norms(model, batch, params), grad_norms(model, batch, params, method="loop"))


# -- the oracle on an LLM closure --------------------------------------------------------------
def test_refreshing_norms_recompute_every_k_steps_only():
    calls, step = [], [0]
    norms = RefreshingNorms(lambda: calls.append(step[0]) or torch.arange(1.0, 4.0), every=3, clock=lambda: step[0])
    for step[0] in [0, 0, 1, 2, 3, 3, 5, 6]:
        norms()
    assert calls == [0, 3, 6]
    with pytest.raises(ValueError, match="every"):
        RefreshingNorms(lambda: torch.ones(2), every=0, clock=lambda: 0)


def test_oracle_sampler_on_an_llm_closure_samples_by_true_norms_refreshed_every_k():
    model, params = lora_model("qwen2", seed=1)
    batch = random_batch(n=6, seed=3)
    run = query_run(model, params, batch, "oracle", lr=1e-3, eps=1e-3, batch_size=2, steps=9, log_every=3,
                    oracle_every=4, seed=0)
    assert run.oracle_refreshes == 3          # steps 0, 4, 8 (logging does not refresh)
    assert [x["step"] for x in run.staleness] == [4, 8] and all(x["age"] == 4 for x in run.staleness)
    assert all(x["v_stale_ratio"] >= 1 - 1e-9 for x in run.staleness)
    assert run.queries == [0, 12, 24, 36] and not run.diverged
    # at θ the oracle's p is p* ∝ the true norms
    norms = grad_norms(model, batch, params)
    sampler = OracleSampler(6, lambda: norms, seed=0)
    assert torch.allclose(sampler.probs, norms / norms.sum())
    draws = torch.bincount(sampler.sample(4000)[0], minlength=6).double() / 4000
    assert (draws - norms / norms.sum()).abs().max() < 0.03


def test_sazo_diagnostics_are_recorded_against_true_norms():
    model, params = lora_model("llama", seed=2)
    run = query_run(model, params, random_batch(seed=4), "sazo", lr=1e-3, eps=1e-3, batch_size=2, steps=6,
                    log_every=3, diagnose=True)
    assert len(run.diagnostics) == 3 and all(-1 <= d["rho"] <= 1 and 0 <= d["tv"] <= 1 for d in run.diagnostics)
    assert run.diagnostics[0]["v_ratio"] == pytest.approx(run.diagnostics[0]["v_uniform_ratio"])  # starts uniform
    assert len(run.final_norms) == len(run.final_scores) == 8


def test_sampling_diagnostics_of_the_oracle_itself():
    norms = torch.tensor([1.0, 2.0, 3.0, 10.0])
    d = sampling_diagnostics(norms, oracle_probs(norms), scores=norms * 5)
    assert d["tv"] == pytest.approx(0) and d["v_ratio"] == pytest.approx(1) and d["rho"] == pytest.approx(1)
    assert d["v_uniform_ratio"] == pytest.approx(heterogeneity(norms))


def test_a_huge_learning_rate_is_reported_as_diverged():
    from sazo_lite.llm import full_parameters
    model = tiny_causal_lm("gpt2", vocab_size=VOCAB)
    run = query_run(model, full_parameters(model), random_batch(), "uniform", lr=10.0, eps=1e-3, batch_size=2,
                    steps=20, log_every=2)
    assert run.diverged and len(run.queries) < 11 and run.train_loss[-1] > 1.5 * run.train_loss[0]
    calm = query_run(model, full_parameters(model), random_batch(), "uniform", lr=0.0, eps=1e-3, batch_size=2,
                     steps=4, log_every=2)
    assert not calm.diverged


@pytest.mark.parametrize("sampler", ["uniform", "oracle"])
def test_recorded_step_scale_matches_the_true_norms(sampler):
    """At lr = 0 (θ fixed), E[ĝ²] with ĝ = w·δ is Σ_i p_i w_i² ‖∇f_i‖²: mean ‖∇f_i‖² for uniform
    sampling, (mean ‖∇f_i‖)² for the oracle, the true norms coming from autograd."""
    model, params = lora_model("llama", seed=5)
    batch = random_batch(n=6, seed=6)
    norms = grad_norms(model, batch, params)
    run = query_run(model, params, batch, sampler, lr=0.0, eps=1e-3, batch_size=1, steps=400, log_every=400, seed=1,
                    oracle_every=10_000)     # θ does not move: one oracle refresh is exact
    expected = float((norms ** 2).mean()) if sampler == "uniform" else float(norms.mean()) ** 2
    assert run.mean_sq_step_scale == pytest.approx(expected, rel=0.25)
    assert run.steps_run == 400 and run.max_step_scale ** 2 >= run.mean_sq_step_scale
    assert float(norms.max() / norms.min()) > 2     # heterogeneous enough for the two to differ
    assert abs(float((norms ** 2).mean()) / float(norms.mean()) ** 2 - 1) > 0.3


def test_the_oracle_mix_bounds_the_weights():
    model, params = lora_model("gpt2", seed=7)
    batch = random_batch(n=6, seed=8)
    exact = query_run(model, params, batch, "oracle", lr=0.0, eps=1e-3, steps=100, log_every=100, seed=0,
                      oracle_every=10_000)
    mixed = query_run(model, params, batch, "oracle", lr=0.0, eps=1e-3, steps=100, log_every=100, seed=0,
                      oracle_every=10_000, oracle_mix=0.5)
    assert mixed.max_weight <= 2.0 + 1e-9 < exact.max_weight


def test_a_run_stops_at_the_target_and_measures_accuracy_at_the_end():
    model, params = lora_model("opt", seed=9)
    batch, test = random_batch(n=6, seed=10), random_batch(n=4, seed=11)
    budget = query_run(model, params, batch, "uniform", lr=0.0, eps=1e-3, batch_size=2, steps=10, log_every=2,
                       test_batch=test)      # no target: the whole budget, then the held-out accuracy
    assert budget.queries == [0, 8, 16, 24, 32, 40] and budget.steps_run == 10 and budget.test_accuracy is not None
    stop = query_run(model, params, batch, "uniform", lr=1e-2, eps=1e-3, batch_size=2, steps=400, log_every=2,
                     stop_fraction=0.9, seed=0)
    assert queries_to(stop, 0.9) == stop.queries[-1] and stop.steps_run < 400 and stop.test_accuracy is None


def test_queries_to_reads_the_first_logged_hit():
    from sazo_lite.llm.queries import QueryRun
    run = QueryRun("uniform", 1e-3, 0, queries=[0, 10, 20, 30], train_loss=[2.0, 1.5, 0.9, 1.2])
    assert queries_to(run, 0.7) == 20 and queries_to(run, 0.5) == 20 and queries_to(run, 0.4) is None


# -- the generated sets -------------------------------------------------------------------------
def test_heterogeneity_is_the_uniform_to_oracle_variance_ratio():
    norms = torch.tensor([0.1, 0.2, 5.0, 7.0, 0.05])
    uniform = torch.full((5,), 0.2, dtype=torch.float64)
    assert heterogeneity(norms) == pytest.approx(sampling_variance(norms, uniform)
                                                 / sampling_variance(norms, oracle_probs(norms)))
    assert heterogeneity(torch.ones(7)) == pytest.approx(1.0)
    assert heterogeneity(torch.tensor([0.0, 0.0, 0.0, 1.0])) == pytest.approx(4.0)


@pytest.mark.parametrize("name", SET_NAMES)
def test_sets_are_seeded_and_clean(name):
    a = make_continual_set(name, num_train=24, new_fraction=1 / 6, num_test=8, seed=3)
    b = make_continual_set(name, num_train=24, new_fraction=1 / 6, num_test=8, seed=3)
    assert [e.prompt for e in a.task.train] == [e.prompt for e in b.task.train] and len(a.task.train) == 24
    assert not any(e.noisy for e in a.task.test)
    if name == "flipped":
        assert len(a.task.noisy_indices) == round(0.15 * 24)
    else:
        assert not any(e.noisy for e in a.task.train)
    if name == "continual":
        assert len(a.new) == 4 and a.assimilated == list(range(20))
        assert {a.task.train[i].kind for i in a.new} == {"numbers", "category"}
        assert all(e.kind == "sentiment" for e in a.setup) and a.setup == a.task.train[:20]
    if name == "homogeneous":   # the continual set's first round, then only new questions
        c = make_continual_set("continual", num_train=24, new_fraction=1 / 6, num_test=8, seed=3)
        assert [e.prompt for e in a.setup] == [e.prompt for e in c.setup] and not a.assimilated
        assert {e.kind for e in a.task.train} == {"numbers", "category"} and a.new == list(range(24))
        pooled = make_continual_set(name, num_train=24, new_fraction=1 / 6, num_test=8, seed=3, pool=48)
        assert len(pooled.task.train) == 48 and [e.prompt for e in pooled.setup] == [e.prompt for e in c.setup]


def test_keep_alike_keeps_the_examples_nearest_the_median_norm():
    """keep_alike lowers V(u)/V(p*) and keeps exactly the examples closest to the median (log scale)."""
    pool = make_continual_set("homogeneous", num_train=8, num_test=2, seed=0, pool=8)
    norms = torch.tensor([1.0, 30.0, 1.2, 0.9, 0.001, 1.1, 5.0, 0.8], dtype=torch.float64)
    kept = keep_alike(pool, norms, 5)
    chosen = [0, 2, 3, 5, 7]
    assert [e.prompt for e in kept.task.train] == [pool.task.train[i].prompt for i in chosen]
    assert heterogeneity(norms[chosen]) < 1.05 < heterogeneity(norms)
    assert kept.task.test == pool.task.test
    for bad in (0, 9, 2.5, True):
        with pytest.raises(ValueError, match="keep"):
            keep_alike(pool, norms, bad)
    with pytest.raises(ValueError, match="norms"):
        keep_alike(pool, norms[:4], 2)


def test_first_round_makes_the_set_heterogeneous_on_a_tiny_model():
    """The measure on a model: after a first round on the setup examples, assimilated norms shrink."""
    from sazo_lite.llm import minilm_dir
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(minilm_dir())
    cset = make_continual_set("continual", num_train=12, new_fraction=0.25, num_test=2, seed=0)
    model = tiny_causal_lm("llama", vocab_size=tokenizer.vocab_size, seed=0)
    params = [p for n, p in model.named_parameters() if "layers." in n]   # not the 1M-entry embedding
    batch = cset.task.encode(tokenizer, "train")
    before = grad_norms(model, batch, params)
    history = first_round(model, params, cset, tokenizer, steps=60, lr=3e-2)
    after = grad_norms(model, batch, params)
    assert history[-1] < 0.6 * history[0]
    assert after[cset.assimilated].mean() < 0.2 * after[cset.new].mean()
    assert heterogeneity(after) >= 3 > heterogeneity(before)


def test_oracle_runs_can_be_diagnosed_from_the_first_log_point():
    model, params = lora_model("gpt2", seed=3)
    run = query_run(model, params, random_batch(n=5), "oracle", lr=1e-3, eps=1e-3, batch_size=2, steps=4,
                    log_every=2, oracle_every=10, diagnose=1)
    assert len(run.diagnostics) == 3 and run.oracle_refreshes == 1
    assert run.diagnostics[0]["tv"] == pytest.approx(0, abs=1e-12)   # fresh norms: p is p*


# -- issue 28: the fresh oracle, the staleness record, the walk, ε, the design at θ₀ -------------------
def test_the_default_oracle_is_fresh_every_step_and_its_staleness_is_recorded():
    model, params = lora_model("llama", seed=12)
    batch = random_batch(n=6, seed=13)
    run = query_run(model, params, batch, "oracle", lr=2e-2, eps=1e-3, batch_size=1, steps=6, log_every=3, seed=0)
    assert run.oracle_every == 1 and run.oracle_refreshes == 6        # one backprop over N per step
    assert [x["age"] for x in run.staleness] == [1] * 5               # never older than one step
    # at every step the oracle samples by the norms at θ_t: check the last refresh against autograd
    sampler_norms = torch.tensor(run.staleness[-1]["v_stale_ratio"])
    assert sampler_norms >= 1 - 1e-9
    stale = RefreshingNorms(lambda: torch.tensor([1.0, 1.0, 1.0, 1.0]), every=1, clock=lambda: clock[0])
    clock = [0]
    stale()
    stale.compute = lambda: torch.tensor([1.0, 1.0, 1.0, 97.0])      # one norm grows 97×
    clock[0] = 1
    stale()
    # p_stale uniform against p* ∝ (1,1,1,97): V(p_stale)/V(p*) = V(u)/V(p*) = 1 + CV²
    record = stale.staleness[0]
    assert record["v_stale_ratio"] == pytest.approx(record["v_uniform_ratio"])
    assert record["v_uniform_ratio"] == pytest.approx(heterogeneity(torch.tensor([1.0, 1.0, 1.0, 97.0])))
    mixed = RefreshingNorms(lambda: torch.tensor([1.0, 1.0, 1.0, 1.0]), every=1, clock=lambda: 0, mix=0.5)
    assert mixed.mix == 0.5
    with pytest.raises(ValueError, match="mix"):
        RefreshingNorms(lambda: torch.ones(2), every=1, clock=lambda: 0, mix=1.5)


def test_the_walk_is_the_distance_from_theta0_at_every_log_point():
    from sazo_lite.llm.queries import walk

    model, params = lora_model("gpt2", seed=14)
    batch = random_batch(n=6, seed=15)
    start = [p.detach().clone() for p in params]
    run = query_run(model, params, batch, "uniform", lr=5e-2, eps=1e-3, batch_size=2, steps=8, log_every=2, seed=1)
    assert len(run.walk) == len(run.queries) == 5 and run.walk[0] == 0.0
    assert run.walk[-1] == pytest.approx(walk(params, start)) and run.walk[-1] > 0
    # every step moves θ by lr·|ĝ|·‖z‖ at most: the walk's growth is bounded by the recorded steps
    d = sum(p.numel() for p in params)
    assert run.walk[-1] <= 8 * 5e-2 * run.max_step_scale * 3 * d ** 0.5
    assert run.max_weight == 1.0 and run.mean_sq_step_scale <= run.max_step_scale ** 2


def test_eps_1e3_gives_the_directional_derivative_to_one_percent():
    from sazo_lite.llm.grad_norms import directional_error

    model, params = lora_model("qwen2", seed=16)
    batch = random_batch(n=4, seed=17)
    before = [p.detach().clone() for p in params]
    small = directional_error(model, batch, params, eps=1e-3, draws=3)
    big = directional_error(model, batch, params, eps=3.0, draws=3)
    assert small.shape == (4,) and float(small.max()) < 0.01
    assert float(big.max()) > float(small.max())          # a large ε is no longer the derivative
    assert all(torch.equal(a, b) for a, b in zip(before, params))


def test_the_design_at_theta0_measures_heterogeneity_alignment_and_predicted_gains():
    from sazo_lite.llm.continual import predicted_gains
    from sazo_lite.llm.grad_norms import full_gradient_norm

    model, params = lora_model("llama", seed=18)
    batch = random_batch(n=6, seed=19)
    norms = grad_norms(model, batch, params)
    g = full_gradient_norm(model, batch, params)
    loss = example_losses(model, batch)(range(6)).mean()
    reference = sum(float(x.double().pow(2).sum()) for x in torch.autograd.grad(loss, params)) ** 0.5
    assert g == pytest.approx(reference, rel=1e-5) and g <= float(norms.mean()) + 1e-9   # triangle inequality
    out = predicted_gains(norms, g)
    assert out["v_uniform_ratio"] == pytest.approx(heterogeneity(norms))
    assert out["gain"][1] == pytest.approx(out["v_uniform_ratio"])
    gains = [out["gain"][b] for b in (1, 2, 4, 8, 16)]
    assert all(a >= b >= 1 for a, b in zip(gains, gains[1:]))                 # the gain falls with B
    aligned = predicted_gains(norms, float(norms.mean()))                     # every gradient one way
    assert aligned["grad_sq_ratio"] == pytest.approx(1.0) and aligned["gain"][16] < out["gain"][16] + 1e-12


def test_the_balanced_set_has_balanced_distinct_answers_and_held_out_instances():
    s = make_continual_set("balanced", num_train=48, new_fraction=1 / 6, num_test=8, seed=0)
    new = [s.task.train[i] for i in s.new]
    assert len(new) == 8 and {e.label for e in new} == {2, 3, 4, 5}
    assert [sum(e.label == c for e in new) for c in (2, 3, 4, 5)] == [2, 2, 2, 2]
    assert all(e.kind == "sentiment" for e in s.setup) and len(s.assimilated) == 40
    assert not {e.prompt for e in new} & {e.prompt for e in s.task.test}       # held-out things
    assert s.task.label_words[:2] == [" no", " yes"] and len(s.task.label_words) == 6


def test_the_balanced_sets_first_round_makes_its_norms_heterogeneous_on_a_tiny_model():
    """After the first round the assimilated examples' norms are small against the new ones', so V(u)/V(p*)
    is large: the median over three tiny models (one model's 60-step first round amplifies rounding, and
    machines differ: measured 2026-12-02, V(u)/V(p*) 5.8 / 7.3 / 3.5 on seeds 0–2).

    Not asserted: that the balanced set's new gradients are less aligned than the continual set's. That
    held on one tiny model on one machine and not on another (‖∇F‖²/V(p*) 0.39 / 0.56 / 0.44 against the
    continual set's 0.21 / 0.37 / 0.08 on seeds 0–2 here), and SmolLM2 measured the balanced set *more*
    aligned (0.70 against 0.57 at N = 96, docs/llm.md): the opposed set is the one built for that."""
    from sazo_lite.llm import minilm_dir
    from transformers import AutoTokenizer

    from sazo_lite.course.config import one_thread

    tokenizer = AutoTokenizer.from_pretrained(minilm_dir())
    ratios, shares = [], []
    for seed in range(3):
        with one_thread():
            design, share = _tiny_design("balanced", tokenizer, seed=seed)
        ratios.append(design["v_uniform_ratio"])
        shares.append(share)
    assert statistics.median(ratios) > 3
    assert statistics.median(shares) < 0.1        # assimilated mean norm ÷ new mean norm


def test_the_opposed_set_asks_the_first_rounds_question_the_other_way_with_balanced_labels():
    s = make_continual_set("opposed", num_train=48, new_fraction=1 / 6, num_test=8, seed=0)
    continual = make_continual_set("continual", num_train=48, new_fraction=1 / 6, num_test=8, seed=0)
    new = [s.task.train[i] for i in s.new]
    assert [e.prompt for e in s.setup] == [e.prompt for e in continual.setup]      # one first round serves both
    assert [e.label for e in new] == [1, 0] * 4 and [e.label for e in s.task.test] == [1, 0] * 4
    assert all(e.kind == "negated" and "dislike" in e.prompt for e in new + s.task.test)
    for e in new:     # the answer is the opposite of the review's sentiment
        adjective = e.prompt.split(" was ", 1)[1].split(".", 1)[0]
        assert e.label == (adjective in _NEGATIVE) and (adjective in _POSITIVE) != (adjective in _NEGATIVE)
    assert s.task.label_words == [" no", " yes"]


def _tiny_design(name, tokenizer, seed=0):
    """The θ₀ design of a set on a tiny llama after its first round (true norms by backprop), and the
    assimilated examples' mean norm ÷ the new examples'."""
    cset = make_continual_set(name, num_train=24, new_fraction=1 / 3, num_test=2, seed=0)
    model = tiny_causal_lm("llama", vocab_size=tokenizer.vocab_size, seed=seed)
    params = [p for n, p in model.named_parameters() if "layers." in n]
    batch = cset.task.encode(tokenizer, "train")
    first_round(model, params, cset, tokenizer, steps=60, lr=3e-2)   # under the set's own 6-word softmax
    norms = grad_norms(model, batch, params)
    share = float(norms[cset.assimilated].mean() / norms[cset.new].mean())
    return predicted_gains(norms, full_gradient_norm(model, batch, params)), share


def test_held_out_accuracy_after_a_fixed_budget_keeps_the_run_and_waits_for_the_budget():
    model, params = lora_model("gpt2", seed=3)
    batch, test = random_batch(n=6, seed=12), random_batch(n=5, seed=13)
    theta0 = [p.detach().clone() for p in params]
    settings = dict(lr=2e-2, eps=1e-3, batch_size=2, steps=12, log_every=2, seed=4, test_batch=test)

    def fresh():
        with torch.no_grad():
            for p, s in zip(params, theta0):
                p.copy_(s)

    plain = query_run(model, params, batch, "sazo", **settings)
    fresh()
    budget = query_run(model, params, batch, "sazo", accuracy_at=14, **settings)   # 14 queries: the 4th step's log
    fresh()
    cut = query_run(model, params, batch, "sazo", **{**settings, "steps": 4})         # a run that ends at the budget
    assert budget.train_loss == plain.train_loss and budget.walk == plain.walk      # measuring changes nothing
    assert budget.budget_queries == 16 and budget.budget_accuracy == cut.test_accuracy
    fresh()        # a target reached at once (F ≤ 10·F₀) stops a run only after the budget
    early = query_run(model, params, batch, "uniform", stop_fraction=10.0, accuracy_at=14, **settings)
    assert early.queries == [0, 8, 16] and early.budget_queries == 16
    fresh()
    assert query_run(model, params, batch, "uniform", stop_fraction=10.0, **settings).queries == [0, 8]
    for bad in (0, -8):
        with pytest.raises(ValueError, match="Invalid accuracy_at"):
            query_run(model, params, batch, "uniform", accuracy_at=bad, **settings)
    with pytest.raises(ValueError, match="Invalid accuracy_at"):
        query_run(model, params, batch, "uniform", accuracy_at=8, **{**settings, "test_batch": None})

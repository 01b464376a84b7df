"""The training loop: samplers and optimiser meet through indices, weights and diffs."""
import math

import pytest
import torch

import sazo_lite as sz
from sazo_lite.course.problems import LeastSquares


def samplers(problem, theta):
    return {"uniform": sz.UniformSampler(problem.num_examples, seed=1),
            "sazo": sz.SAZOSampler(problem.num_examples, seed=1),
            "oracle": sz.OracleSampler(problem.num_examples, lambda: problem.norms(theta), seed=1)}


@pytest.mark.parametrize("name", ["uniform", "sazo", "oracle"])
def test_two_closure_calls_per_step_and_query_count(name):
    problem = LeastSquares(32, 4, heterogeneity=1.0)
    theta = problem.initial_theta()
    sampler = samplers(problem, theta)[name]
    calls = []

    def batch_losses(idx):
        calls.append(len(idx))
        return problem.losses(theta, idx)

    history = sz.train(sz.MeZO([theta], lr=0.01), sampler, batch_losses, 25, batch_size=3,
                       evaluate=lambda: problem.gap(theta), log_every=10, record_probs=True, progress=False)
    assert calls == [3] * 50
    assert history.queries == [6 * (t + 1) for t in range(25)]
    assert history.logged_steps == [10, 20, 25] and len(history.metrics) == 3
    assert all(torch.isclose(p.sum(), torch.tensor(1.0, dtype=p.dtype)) for p in history.probs)


def test_training_reduces_the_gap_and_stops_early():
    problem = LeastSquares(64, 5, heterogeneity=0.5, seed=2)
    theta = problem.initial_theta()
    start = problem.gap(theta)
    history = sz.train(sz.MeZO([theta], lr=0.02, eps=1e-4), sz.SAZOSampler(64, seed=0),
                       lambda idx: problem.losses(theta, idx), 5000, batch_size=2,
                       evaluate=lambda: problem.gap(theta) / start, log_every=20,
                       stop_below=0.1, progress=False)
    assert history.metrics[-1] < 0.1
    assert len(history.loss) < 5000  # stopped early
    assert sz.queries_to_target(history, 0.1) == history.logged_queries[-1]
    assert sz.queries_to_target(history, -1.0) is None


def test_uniform_and_oracle_samplers():
    uniform = sz.UniformSampler(10, seed=0)
    idx, w = uniform.sample(1000)
    assert torch.equal(w, torch.ones(1000, dtype=torch.float64))
    assert idx.min() >= 0 and idx.max() < 10 and len(idx.unique()) == 10
    norms = torch.tensor([1.0, 3.0, 0.0, 6.0], dtype=torch.float64)
    oracle = sz.OracleSampler(4, lambda: norms, seed=0)
    assert torch.allclose(oracle.probs, norms / 10)
    idx, w = oracle.sample(20000)
    assert 2 not in idx.tolist()  # zero-norm examples are never needed by the oracle
    assert torch.allclose(w, 1 / (4 * oracle.probs[idx]))
    freq = torch.bincount(idx, minlength=4).double() / 20000
    assert torch.allclose(freq, oracle.probs, atol=0.02)


def test_sampler_state_round_trip_replays_draws():
    sampler = sz.UniformSampler(50, seed=3)
    sampler.sample(5)
    state = sampler.state_dict()
    first = sampler.sample(8)[0]
    other = sz.UniformSampler(50, seed=99)
    other.load_state_dict(state)
    assert torch.equal(other.sample(8)[0], first)
    with pytest.raises(ValueError, match="num_examples"):
        sz.UniformSampler(49).load_state_dict(state)


@pytest.mark.parametrize("make", [lambda: sz.UniformSampler(0), lambda: sz.SAZOSampler(-1),
                                  lambda: sz.OracleSampler(0, lambda: torch.ones(1))])
def test_num_examples_must_be_positive(make):
    with pytest.raises(ValueError, match="num_examples"):
        make()


def test_bad_batch_size_and_indices():
    sampler = sz.UniformSampler(5)
    with pytest.raises(ValueError, match="batch_size"):
        sampler.sample(0)
    with pytest.raises(ValueError, match="indices"):
        sampler.update(torch.tensor([0, 5]), torch.ones(2))
    with pytest.raises(ValueError, match="directional_diffs"):
        sampler.update(torch.tensor([0, 1]), torch.ones(3))


# -- the one loop's shared rules: divergence, queries to a target, the best rate, the step rule --------
from sazo_lite.samplers import make_sampler
from sazo_lite.train import (NoiseScaledStep, best_rate, diverged, mean_difference_interval, median_queries,
                             median_ratio_interval, queries_to_target)


def test_one_divergence_rule_stops_the_loop_and_catches_a_refused_step():
    problem = LeastSquares(16, 3, heterogeneity=0.5, seed=0)
    theta = problem.initial_theta(torch.float64)
    start = problem.gap(theta)
    history = sz.train(sz.MeZO([theta], lr=50.0, eps=1e-3), sz.UniformSampler(16, seed=0),
                       lambda idx: problem.losses(theta, idx), 200, evaluate=lambda: problem.gap(theta),
                       log_every=1, progress=False, diverge_above=1.5 * start)
    assert history.diverged and len(history.queries) < 200
    assert diverged(history.metrics[-1], 1.5 * start) and not any(diverged(v, 1.5 * start) for v in history.metrics[:-1])
    # a step whose loss is not finite: MeZO refuses it; with the rule the run is marked, without it raises
    bad = lambda idx: torch.full((len(idx),), float("nan"), dtype=torch.float64)
    theta = problem.initial_theta(torch.float64)
    refused = sz.train(sz.MeZO([theta], lr=0.1), sz.UniformSampler(16), bad, 5, progress=False, diverge_above=1.0)
    assert refused.diverged and refused.queries == []
    with pytest.raises(FloatingPointError):
        sz.train(sz.MeZO([theta], lr=0.1), sz.UniformSampler(16), bad, 5, progress=False)
    calm = sz.train(sz.MeZO([theta], lr=1e-3), sz.UniformSampler(16), lambda idx: problem.losses(theta, idx), 20,
                    evaluate=lambda: problem.gap(theta), log_every=5, progress=False, diverge_above=1.5 * start)
    assert not calm.diverged and len(calm.queries) == 20


def test_queries_to_target_reads_a_history_or_pairs():
    pairs = ([0, 10, 20, 30], [1.0, 0.8, 0.5, 0.2])
    assert queries_to_target(pairs, 0.5) == 20 and queries_to_target(pairs, 0.1) is None
    history = sz.History(logged_queries=pairs[0], metrics=pairs[1])
    assert queries_to_target(history, 0.8) == 10


def test_best_rate_is_the_median_rule_with_misses_as_never():
    # the fastest single seed does not win if most seeds missed; ties go to the tie-break, then grid order
    per_rate = {1e-3: [100, 120, None], 2e-3: [40, None, None], 5e-4: [200, 210, 220]}
    assert best_rate(per_rate) == 1e-3
    assert median_queries(per_rate[2e-3]) == float("inf")
    tied = {1e-3: [None, None], 2e-3: [None, None]}
    assert best_rate(tied) == 1e-3 and best_rate(tied, tiebreak={1e-3: 0.9, 2e-3: 0.5}) == 2e-3
    with pytest.raises(ValueError, match="per_rate"):
        best_rate({})


def test_step_rule_is_one_while_the_noise_is_constant_and_invariant_to_its_scale():
    rule, scaled = NoiseScaledStep(warmup=5), NoiseScaledStep(warmup=5)
    gen = torch.Generator().manual_seed(0)
    draws = torch.randn(200, generator=gen, dtype=torch.float64)
    scales = []
    for g in draws:
        rule.observe(float(g))
        scaled.observe(float(37.0 * g))
        scales.append(rule.scale())
        assert scaled.scale() == pytest.approx(rule.scale())        # only ratios of ĝ² matter
    constant = NoiseScaledStep(warmup=3)
    for _ in range(50):
        constant.observe(2.0)
        assert constant.scale() == pytest.approx(1.0)
    falling = NoiseScaledStep(warmup=3, max_scale=4.0)
    for g in [1.0] * 3 + [0.01] * 200:
        falling.observe(g)
    assert falling.scale() == 4.0                                    # the cap
    for bad in (dict(decay=1.0), dict(warmup=0), dict(max_scale=0.5)):
        with pytest.raises(ValueError):
            NoiseScaledStep(**bad)


def test_step_rule_gives_every_sampler_the_same_treatment_when_all_norms_are_equal():
    """Equal norms: sampling cannot help, so the rule must not favour a sampler. Uniform and the oracle
    (whose p is then uniform: the same law of ĝ) get the same scales; SAZO, whose noisy scores only add
    variance here, gets no boost; every scale stays near 1; the base rate is restored when the run ends."""
    gen = torch.Generator().manual_seed(1)
    rows = torch.randn(32, 6, generator=gen, dtype=torch.float64)
    rows = rows / rows.norm(dim=1, keepdim=True)          # f_i(θ) = a_iᵀθ with ‖a_i‖ = 1 for every i
    means = {}
    for name in ("uniform", "sazo", "oracle"):
        logs = []
        for seed in range(8):
            theta = torch.zeros(6, dtype=torch.float64)
            opt = sz.MeZO([theta], lr=1e-3, eps=1e-4, seed=seed)
            sampler = make_sampler(name, 32, seed=seed, norms_fn=lambda: torch.ones(32))
            history = sz.train(opt, sampler, lambda idx: rows[idx] @ theta, 300, progress=False,
                               step_rule=NoiseScaledStep(warmup=50))
            assert opt.param_groups[0]["lr"] == 1e-3
            logs += [math.log(lr / 1e-3) for lr in history.lr[50:]]
        means[name] = sum(logs) / len(logs)
    assert all(abs(m) < math.log(1.6) for m in means.values()), means
    assert abs(means["uniform"] - means["oracle"]) < math.log(1.25), means
    assert means["sazo"] < means["uniform"] + math.log(1.1), means



# -- the interval of a ratio of medians (benchmarks report uniform ÷ SAZO with it) --------------
def test_median_ratio_interval_covers_the_true_ratio_about_as_often_as_it_claims():
    import random as _random
    from sazo_lite.train import median_ratio_interval

    rng, hits, trials = _random.Random(1), 0, 120
    for trial in range(trials):       # lognormal queries; the true ratio of medians is 2
        top = [200 * math.exp(rng.gauss(0, 0.5)) for _ in range(15)]
        bottom = [100 * math.exp(rng.gauss(0, 0.5)) for _ in range(15)]
        low, high = median_ratio_interval(top, bottom, draws=400, seed=trial)
        hits += low <= 2.0 <= high
    assert 0.85 <= hits / trials <= 1.0


def test_median_ratio_interval_narrows_with_seeds_and_treats_misses_as_never():
    from sazo_lite.train import median_ratio_interval

    few = median_ratio_interval([200, 150, 260, 240, 180], [100, 130, 90, 110, 120])
    many = median_ratio_interval([200, 150, 260, 240, 180] * 4, [100, 130, 90, 110, 120] * 4)
    assert few[0] <= many[0] <= 2.0 <= many[1] <= few[1] and many[1] - many[0] < few[1] - few[0]
    assert median_ratio_interval([None] * 3, [100, 120, 110]) == (math.inf, math.inf)   # the numerator never got there
    assert median_ratio_interval([100, 120, 110], [None] * 3) == (0.0, 0.0)
    assert all(math.isnan(v) for v in median_ratio_interval([None], [None]))
    low, high = median_ratio_interval([100, 120, 110, 90, 130], [100, None, None, 110, 120])   # 2 of 5 missed
    assert low < 1.0 and high > 0.0 and low == 0.0             # resamples where 3 of 5 miss: the median is never
    assert median_ratio_interval([1, 2, 3], [2, 3, 4], seed=5) == median_ratio_interval([1, 2, 3], [2, 3, 4], seed=5)
    for bad in (dict(level=1.0), dict(level=0.0), dict(level=True), dict(draws=0)):
        with pytest.raises(ValueError):
            median_ratio_interval([1, 2], [1, 2], **bad)
    with pytest.raises(ValueError, match="Invalid queries"):
        median_ratio_interval([], [1])


def test_mean_difference_interval_covers_the_true_difference_about_as_often_as_it_claims():
    import random
    from sazo_lite.train import mean_difference_interval
    rng, covered = random.Random(0), 0
    for _ in range(400):
        first = [rng.gauss(0.7, 0.1) for _ in range(30)]
        second = [rng.gauss(0.6, 0.2) for _ in range(20)]
        difference, half = mean_difference_interval(first, second)
        covered += abs(difference - 0.1) <= half
    assert 0.9 <= covered / 400 <= 0.99
    wide = mean_difference_interval([0.7, 0.8, 0.75], [0.5, 0.6, 0.55], level=0.99)[1]
    assert wide > mean_difference_interval([0.7, 0.8, 0.75], [0.5, 0.6, 0.55])[1]
    for bad in (dict(first=[1.0], second=[1.0, 2.0]), dict(first=[1.0, 2.0], second=[])):
        with pytest.raises(ValueError, match="Invalid samples"):
            mean_difference_interval(**bad)
    with pytest.raises(ValueError, match="Invalid level"):
        mean_difference_interval([1.0, 2.0], [1.0, 2.0], level=1.0)


@pytest.mark.parametrize("interval", [lambda level: median_ratio_interval([1.0, 2.0], [1.0, 2.0], level=level),
                                      lambda level: mean_difference_interval([1.0, 2.0], [1.0, 2.0], level=level)])
@pytest.mark.parametrize("level", [0.0, 1.0, -0.5, 1.5, float("nan"), True, "0.9", None])
def test_both_intervals_refuse_the_same_bad_levels(interval, level):
    with pytest.raises(ValueError, match="Invalid level"):
        interval(level)

"""SAZOSampler: validation, the distribution it samples from, what it learns, and that it pays off."""
import math
import statistics

import pytest
import torch

from sazo_lite import SAZOSampler, UniformSampler
from benchmarks.queries import TargetRun, best_learning_rate, queries_to_reach
from sazo_lite.course.problems import LeastSquares
from sazo_lite.variance import spearman, uniform_gain, variance_ratio


def _state(sampler):
    """Everything an update may change, copied."""
    return (sampler.estimates.clone(), sampler.counts.clone(), sampler.level, sampler.level_steps,
            sampler.probs, sampler.prior())


def _assert_same_state(a, b):
    for x, y in zip(a, b):
        if isinstance(x, torch.Tensor):
            assert torch.equal(x, y)
        else:
            assert x == y


# -- validation -----------------------------------------------------------------------------
@pytest.mark.parametrize("kwargs, name", [
    (dict(ema_decay=1.0), "ema_decay"), (dict(ema_decay=-0.1), "ema_decay"), (dict(ema_decay=float("nan")), "ema_decay"),
    (dict(uniform_mix=0.0), "uniform_mix"), (dict(uniform_mix=1.5), "uniform_mix"),
    (dict(prior_strength=-1.0), "prior_strength"), (dict(statistic="cube"), "statistic"),
    (dict(level_decay=1.0), "level_decay"), (dict(seed=1.5), "seed"),
])
def test_bad_hyperparameters_name_the_argument(kwargs, name):
    with pytest.raises(ValueError, match=name):
        SAZOSampler(10, **kwargs)


@pytest.mark.parametrize("n", [0, -3, 2.0, True])
def test_bad_num_examples(n):
    with pytest.raises(ValueError, match="num_examples"):
        SAZOSampler(n)


def test_edges_of_the_ranges_are_accepted():
    SAZOSampler(1, ema_decay=0.0, uniform_mix=1.0, prior_strength=0.0, level_decay=0.0).sample(3)


@pytest.mark.parametrize("b", [0, -1, 1.0])
def test_bad_batch_size(b):
    with pytest.raises(ValueError, match="batch_size"):
        SAZOSampler(10).sample(b)


@pytest.mark.parametrize("indices, diffs, name", [
    ([0, 10], [1.0, 2.0], "indices"), ([-1, 2], [1.0, 2.0], "indices"),
    ([0.0, 1.0], [1.0, 2.0], "indices"), ([[0, 1]], [[1.0, 2.0]], "indices"),
    ([0, 1], [1.0, 2.0, 3.0], "directional_diffs"), ([0, 1], [1.0], "directional_diffs"),
    ([0, 1], [1.0, float("inf")], "directional_diffs"), ([0, 1], [float("nan"), 1.0], "directional_diffs"),
])
@pytest.mark.parametrize("sum_tree", [False, True])
def test_bad_update_is_rejected_whole(indices, diffs, name, sum_tree):
    sampler = SAZOSampler(10, seed=1, sum_tree=sum_tree)
    for _ in range(5):
        idx, _ = sampler.sample(3)
        sampler.update(idx, torch.randn(3))
    before = _state(sampler)
    with pytest.raises(ValueError, match=name):
        sampler.update(torch.tensor(indices), torch.tensor(diffs))
    _assert_same_state(before, _state(sampler))


# -- the distribution -----------------------------------------------------------------------
@pytest.mark.parametrize("statistic", ["abs", "square"])
@pytest.mark.parametrize("mix", [0.05, 0.1, 1.0])
@pytest.mark.parametrize("sum_tree", [False, True])
def test_probs_sum_to_one_and_respect_the_floor(statistic, mix, sum_tree):
    n = 50
    sampler = SAZOSampler(n, uniform_mix=mix, statistic=statistic, sum_tree=sum_tree, seed=3)
    gen = torch.Generator().manual_seed(0)
    for step in range(200):
        idx, w = sampler.sample(4)
        assert torch.allclose(w, 1.0 / (n * sampler.probs[idx]))  # weights use the distribution sampled from
        diffs = torch.randn(4, generator=gen, dtype=torch.float64) * torch.exp(3 * torch.randn(4, generator=gen))
        diffs[0] = 0.0 if step % 7 == 0 else diffs[0]  # exact zeros happen (flat examples)
        sampler.update(idx, diffs)
        p = sampler.probs
        assert p.dtype == torch.float64 and p.shape == (n,)
        assert abs(float(p.sum()) - 1.0) < (1e-6 if sum_tree else 1e-12)  # trees: float32 sums
        assert float(p.min()) >= mix / n * (1 - 1e-12)
    if mix == 1.0:
        assert torch.allclose(sampler.probs, torch.full((n,), 1.0 / n, dtype=torch.float64))


@pytest.mark.parametrize("sum_tree", [False, True])
def test_samples_follow_probs(sum_tree):
    """Inverse CDF or the trees' mixture: empirical frequencies match p (chi-square-sized tolerance)."""
    sampler = SAZOSampler(6, uniform_mix=0.2, sum_tree=sum_tree, seed=0)
    sampler.update(torch.tensor([0, 1, 2, 3, 4]), torch.tensor([0.1, 0.2, 0.5, 1.0, 4.0]))  # 5 stays unseen
    p = sampler.probs
    counts = torch.bincount(sampler.sample(200_000)[0], minlength=6).double() / 200_000
    assert float((counts - p).abs().max()) < 5 * math.sqrt(0.25 / 200_000)


@pytest.mark.parametrize("statistic", ["abs", "square"])
@pytest.mark.parametrize("sum_tree", [False, True])
def test_before_any_data_sampling_is_uniform_and_unseen_examples_take_the_prior(statistic, sum_tree):
    sampler = SAZOSampler(8, statistic=statistic, sum_tree=sum_tree, seed=0)
    assert torch.allclose(sampler.probs, torch.full((8,), 1 / 8, dtype=torch.float64))
    sampler.update(torch.tensor([0, 1, 2]), torch.tensor([1.0, 2.0, 6.0]))
    seen = sampler.estimates[:3].double()
    # The prior is the root-mean-square sampling score of the seen examples (G's units: prior()).
    scores = seen if statistic == "abs" else seen.sqrt()
    rms = float(scores.pow(2).mean().sqrt())
    assert math.isclose(sampler.prior(), rms if statistic == "abs" else rms ** 2, rel_tol=1e-12)
    assert torch.allclose(sampler.scores()[3:], torch.full((5,), rms, dtype=torch.float64), rtol=1e-12)
    p = sampler.probs
    assert float(p[2]) > float(p[1]) > float(p[0])  # larger |d| -> sampled more
    assert float(p[0]) < float(p[3]) < float(p[2])  # unseen sit in between: neither starved nor favoured
    assert torch.equal(p[3:], p[3].expand(5))


@pytest.mark.parametrize("statistic, pair, single", [("square", [1.0, 3.0], math.sqrt(5.0)), ("abs", [1.0, -3.0], 2.0)])
def test_duplicates_use_the_mean_of_their_statistic(statistic, pair, single):
    """Index 3 twice with d = (1, 3) is one observation of mean d² = 5 (abs: mean |d| = 2)."""
    twice, once = SAZOSampler(6, statistic=statistic), SAZOSampler(6, statistic=statistic)
    twice.update(torch.tensor([3, 3]), torch.tensor(pair))
    once.update(torch.tensor([3]), torch.tensor([single], dtype=torch.float64))
    assert int(twice.counts[3]) == 1
    if statistic == "abs":
        assert torch.allclose(twice.estimates, once.estimates) and math.isclose(twice.level, once.level)
    # "square": the level is a mean |d| (2 against sqrt 5), but the norm estimate is the same
    assert torch.allclose(twice.squared_norm_estimates(), once.squared_norm_estimates(), rtol=1e-6)


@pytest.mark.parametrize("sum_tree", [False, True])
def test_state_dict_round_trip_gives_identical_future(sum_tree):
    a = SAZOSampler(30, seed=5, ema_decay=0.8, sum_tree=sum_tree)
    gen = torch.Generator().manual_seed(1)
    for _ in range(40):
        idx, _ = a.sample(3)
        a.update(idx, torch.randn(3, generator=gen))
    state = a.state_dict()
    b = SAZOSampler(30, seed=99, sum_tree=sum_tree)  # different seed and hyperparameters: restored
    b.load_state_dict(state)
    assert b.ema_decay == 0.8 and torch.equal(a.probs, b.probs)
    for _ in range(20):
        (ia, wa), (ib, wb) = a.sample(4), b.sample(4)
        assert torch.equal(ia, ib) and torch.equal(wa, wb)
        diffs = torch.randn(4, generator=gen)
        a.update(ia, diffs)
        b.update(ib, diffs)
    assert torch.equal(a.probs, b.probs) and torch.equal(a.estimates, b.estimates)
    state["estimates"][0] = 123.0  # the saved state is a copy, not a view of the live one
    assert float(a.estimates[0]) != 123.0


@pytest.mark.parametrize("statistic", ["abs", "square"])
def test_sum_tree_mode_has_the_cdf_modes_distribution(statistic):
    """Same updates, same p and weights, whether p lives in a CDF (O(N)) or in sum trees (O(log N))."""
    cdf, tree = (SAZOSampler(300, statistic=statistic, sum_tree=flag, seed=0) for flag in (False, True))
    gen = torch.Generator().manual_seed(1)
    for step in range(300):
        idx = torch.randint(300, (8,), generator=gen)  # duplicates included
        diffs = torch.randn(8, generator=gen, dtype=torch.float64) * (1 + idx.double() / 30)
        cdf.update(idx, diffs)
        tree.update(idx, diffs)
        if step % 50 == 0:  # the trees keep float32 sums: equal to float32 precision
            assert torch.allclose(cdf.probs, tree.probs, rtol=1e-6, atol=0)
            drawn, weights = tree.sample(16)
            assert torch.allclose(weights, 1.0 / (300 * cdf.probs[drawn]), rtol=1e-6, atol=0)
        if step == 50:
            assert 0 < int((tree.counts == 0).sum()) < 300  # seen and unseen examples both in play
    assert torch.allclose(cdf.probs, tree.probs, rtol=1e-6, atol=0)
    assert not torch.allclose(cdf.probs, SAZOSampler(300, statistic=statistic).probs, rtol=1e-6)  # it can fail


def test_sum_tree_is_chosen_from_its_threshold_and_validated():
    from sazo_lite.samplers import SUM_TREE_MIN_EXAMPLES

    big = SAZOSampler(SUM_TREE_MIN_EXAMPLES, seed=0)
    small = SAZOSampler(SUM_TREE_MIN_EXAMPLES, sum_tree=False, seed=0)
    for sampler in (big, small):
        sampler.update(torch.arange(64), torch.linspace(0.1, 5.0, 64))
    assert big.sum_tree and not small.sum_tree
    idx, weights = big.sample(32)
    assert torch.allclose(weights, 1.0 / (SUM_TREE_MIN_EXAMPLES * small.probs[idx]), rtol=1e-6, atol=0)
    with pytest.raises(ValueError, match="sum_tree"):
        SAZOSampler(10, sum_tree="yes")


def test_state_dict_rejects_other_sizes():
    with pytest.raises(ValueError, match="num_examples"):
        SAZOSampler(4).load_state_dict(SAZOSampler(5).state_dict())


@pytest.mark.parametrize("statistic", ["abs", "square"])
def test_running_prior_matches_a_plain_recomputation(statistic):
    """The running sums behind the prior equal a plain pass over the seen examples."""
    sampler = SAZOSampler(1000, statistic=statistic, seed=0)
    gen = torch.Generator().manual_seed(0)
    for _ in range(300):
        idx, _ = sampler.sample(5)
        sampler.update(idx, torch.randn(5, generator=gen, dtype=torch.float64) * 10)
        seen = sampler.estimates[sampler.counts > 0].double()
        plain = seen.mean() if statistic == "square" else seen.pow(2).mean().sqrt()
        assert math.isclose(sampler.prior(), float(plain), rel_tol=1e-9)


# -- what it learns -------------------------------------------------------------------------
def _linear_problem(n=64, dim=10, spread=1.0, seed=0):
    gen = torch.Generator().manual_seed(seed)
    scales = torch.exp(spread * torch.randn(n, generator=gen, dtype=torch.float64))
    return torch.randn(n, dim, generator=gen, dtype=torch.float64) * scales[:, None], gen


def _feed_linear(sampler, grads, gen, steps, batch_size):
    """f_i(θ) = a_iᵀθ: d_k = a_{i_k}ᵀz exactly, with z ~ N(0, I)."""
    for _ in range(steps):
        idx, _ = sampler.sample(batch_size)
        z = torch.randn(grads.shape[1], generator=gen, dtype=torch.float64)
        sampler.update(idx, grads[idx] @ z)


@pytest.mark.parametrize("statistic", ["abs", "square"])
def test_estimates_converge_to_the_true_norms_on_a_linear_problem(statistic):
    grads, gen = _linear_problem()
    norms = grads.norm(dim=1)
    sampler = SAZOSampler(len(grads), statistic=statistic, seed=0)
    _feed_linear(sampler, grads, gen, steps=1500, batch_size=8)
    assert int(sampler.counts.min()) >= 10
    estimates = sampler.norm_estimates()
    assert spearman(estimates, norms) > 0.85
    ratio = float((estimates / norms).median())
    assert 0.75 < ratio < 1.33, ratio  # right scale, not just the right order
    # The learned p is far closer to the oracle than uniform sampling is.
    uniform = torch.full_like(norms, 1.0 / len(norms))
    assert variance_ratio(norms, sampler.probs) - 1 < 0.3 * (variance_ratio(norms, uniform) - 1)


def test_level_keeps_old_and_new_estimates_comparable():
    """All norms shrink 10× mid-way: examples seen only early must not keep 10× the mass."""
    grads, gen = _linear_problem(n=40, spread=0.0)
    sampler = SAZOSampler(40, seed=0)
    early, late = torch.arange(20), torch.arange(20, 40)
    for phase, (rows, scale) in enumerate([(early, 10.0), (late, 1.0)]):
        for _ in range(800):
            idx = rows[torch.randint(20, (4,), generator=gen)]
            z = torch.randn(grads.shape[1], generator=gen, dtype=torch.float64)
            sampler.update(idx, scale * grads[idx] @ z)
    p = sampler.probs
    assert float(p[early].sum() / p[late].sum()) < 1.5  # a stale scale alone would give ~10


# -- it pays off (quick version of the benchmark's claim) -----------------------------------
def _median_queries(problem, method, lr=0.006, seeds=range(5), target=0.005, max_steps=2000):
    runs = [queries_to_reach(problem, method, lr, seed, target, max_steps) for seed in seeds]
    return statistics.median(math.inf if q is None else q for q in runs)


def test_sazo_beats_uniform_when_norms_differ_and_is_not_much_worse_when_alike():
    """Median queries over 5 seeds (same lr for both; the benchmark tunes lr per method)."""
    hetero = LeastSquares(64, 5, heterogeneity=1.5, seed=1)
    homo = LeastSquares(64, 5, heterogeneity=0.0, seed=1)
    assert uniform_gain(hetero.norms(hetero.optimum)) > 3.0
    assert _median_queries(hetero, "sazo") < _median_queries(hetero, "uniform")
    assert _median_queries(homo, "sazo") <= 1.1 * _median_queries(homo, "uniform")


# -- the benchmark's machinery (it measures the claim above) ---------------------------------
def test_a_run_extended_in_pieces_equals_one_run():
    problem = LeastSquares(32, 4, heterogeneity=1.0, seed=0)
    whole = TargetRun(problem, "sazo", 0.01, 3, target=0.01).extend_to(400)
    pieces = TargetRun(problem, "sazo", 0.01, 3, target=0.01)
    for steps in (70, 150, 400):
        pieces.extend_to(steps)
    assert pieces.steps == whole.steps and pieces.queries == whole.queries
    assert torch.equal(pieces.theta, whole.theta)


class _FakeRun:
    """Reaches the target after ``finish`` steps (None: never); records how far it was run."""

    batch_size = 1

    def __init__(self, finish):
        self.finish, self.steps, self.failed, self.queries = finish, 0, False, None

    def extend_to(self, steps):
        self.steps = max(self.steps, steps)
        if self.finish is not None and self.steps >= self.finish:
            self.steps, self.queries = self.finish, 2 * self.finish
        return self


def test_best_learning_rate_picks_the_best_median_and_caps_bad_rates():
    finish = {0.1: [900, 1000, 5000], 0.2: [400, 3000, 450], 0.4: [None, None, 100]}
    made = {}
    make = lambda lr, seed: made.setdefault((lr, seed), _FakeRun(finish[lr][seed]))
    result = best_learning_rate(make, [0.1, 0.2, 0.4], [0, 1, 2], max_steps=10_000, first_budget=100)
    assert result["lr"] == 0.2 and result["median"] == 900
    assert (result["min"], result["max"], result["per_seed"]) == (800, 6000, [800, 6000, 900])
    assert result["grid"]["0.4"] is None and made[(0.4, 0)].steps < 1000  # never run to max_steps
    assert made[(0.1, 2)].steps < 1000  # a rate that cannot win stops early

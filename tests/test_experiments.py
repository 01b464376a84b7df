"""sazo_lite.course.sazo_runs: SAZO traces (notebook 04) and the race (notebook 05)."""
from __future__ import annotations

import numpy as np
import pytest
import torch

from sazo_lite.course import sazo_runs as E
from sazo_lite import variance
from sazo_lite.samplers import make_sampler


@pytest.fixture(scope="module")
def problem():
    return E.make_problem(heterogeneity=1.5, num_examples=64, dim=6, seed=1)


@pytest.fixture(scope="module")
def trace(problem):
    return E.run_sazo_trace(problem, steps=120, batch_size=8, lr=0.01, log_every=10)


def test_trace_shapes_and_distributions(trace, problem):
    n, t = problem.num_examples, len(trace.steps)
    assert trace.steps.tolist() == list(range(0, 121, 10))
    assert trace.queries.tolist() == [2 * 8 * s for s in trace.steps]
    assert trace.sqrt_g.shape == trace.norms.shape == trace.p_sazo.shape == trace.p_star.shape == (t, n)
    np.testing.assert_allclose(trace.p_sazo.sum(1), 1.0, atol=1e-9)
    np.testing.assert_allclose(trace.p_star.sum(1), 1.0, atol=1e-9)
    assert trace.sqrt_g[0].max() == 0.0  # nothing observed before the first step
    assert (trace.sqrt_g[-1] > 0).all()


def test_trace_metrics_match_plain_references(trace):
    """Each logged metric equals an independent computation from the logged arrays."""
    from scipy import stats   # here, not at the top: every test process collects this file

    for k in range(1, len(trace.steps)):
        norms, p = trace.norms[k], trace.p_sazo[k]
        assert trace.spearman[k] == pytest.approx(stats.spearmanr(trace.sqrt_g[k], norms).statistic, abs=1e-9)
        assert trace.tv[k] == pytest.approx(0.5 * np.abs(p - norms / norms.sum()).sum(), abs=1e-12)
        v_star = norms.mean() ** 2
        assert trace.ratio["sazo"][k] == pytest.approx((norms ** 2 / p).sum() / len(p) ** 2 / v_star)
        assert trace.ratio["uniform"][k] == pytest.approx(1 + norms.var() / norms.mean() ** 2)
    np.testing.assert_array_equal(trace.ratio["oracle"], 1.0)


def test_trace_norms_are_the_true_norms_along_the_run(trace, problem):
    assert trace.norms[0] == pytest.approx(problem.norms(problem.initial_theta()).numpy())
    assert trace.gap[0] == pytest.approx(problem.gap(problem.initial_theta()))
    assert trace.gap[-1] < 0.5 * trace.gap[0]  # training made progress


def test_sazo_beats_uniform_and_learns_the_ranking(trace):
    late = slice(len(trace.steps) // 2, None)
    assert np.median(trace.spearman[late]) > 0.4
    assert np.median(trace.ratio["sazo"][late]) < np.median(trace.ratio["uniform"][late])


def test_tiny_eps_in_float32_destroys_the_estimates(problem):
    kwargs = dict(steps=120, batch_size=8, lr=0.01, log_every=10)
    good = E.run_sazo_trace(problem, eps=1e-3, **kwargs)
    bad = E.run_sazo_trace(problem, eps=1e-9, **kwargs)
    assert bad.spearman[-1] < good.spearman[-1] - 0.3
    assert bad.tv[-1] > good.tv[-1]


def test_larger_ema_decay_smooths_the_g_trajectory(problem):
    kwargs = dict(steps=150, batch_size=8, lr=0.01, log_every=2)
    fast = E.run_sazo_trace(problem, ema_decay=0.3, **kwargs)
    slow = E.run_sazo_trace(problem, ema_decay=0.99, **kwargs)
    assert np.array_equal(fast.tracked, slow.tracked)
    assert E.roughness(slow.sqrt_g[:, slow.tracked]) < 0.7 * E.roughness(fast.sqrt_g[:, fast.tracked])


def test_roughness():
    assert E.roughness([1.0, 2.0, 4.0]) == pytest.approx(np.log(2))
    assert E.roughness([0.0, 0.0, 1.0, np.e]) == pytest.approx(1.0)  # steps from zero are skipped
    with pytest.raises(ValueError, match="trajectory"):
        E.roughness([1.0])
    with pytest.raises(ValueError, match="trajectory"):
        E.roughness([0.0, 0.0])


def test_bad_names_raise():
    with pytest.raises(ValueError, match="name"):
        E.make_problem("cubic")
    with pytest.raises(ValueError, match="sampler"):
        make_sampler("greedy", 4)
    with pytest.raises(ValueError, match="steps"):
        E.run_sazo_trace(E.make_problem(num_examples=4, dim=2), steps=0)


# -- race --------------------------------------------------------------------------------------

@pytest.fixture(scope="module")
def small_race():
    problem = E.make_problem("heterogeneous quadratic", heterogeneity=1.0, num_examples=64, dim=5)
    return E.race(problem, seeds=(0, 1, 2), steps=200, batch_size=2, lr=0.01, log_every=10,
                  target_fraction=0.1)


def test_race_shapes_and_targets(small_race):
    r = small_race
    assert r.queries.tolist() == [0] + [2 * 2 * s for s in range(10, 201, 10)]
    assert r.target == pytest.approx(0.1 * r.initial_gap)
    for method in E.SAMPLERS:
        gaps = r.gaps[method]
        assert gaps.shape == (3, len(r.queries))
        np.testing.assert_array_equal(gaps[:, 0], r.initial_gap)
        for seed, queries in enumerate(r.to_target[method]):  # a plain scan of the curve
            below = np.flatnonzero(gaps[seed] <= r.target)
            assert queries == (int(r.queries[below[0]]) if len(below) else None)


def test_race_oracle_beats_uniform_on_heterogeneous_data(small_race):
    assert small_race.median_to_target("oracle") < small_race.median_to_target("uniform")
    assert small_race.speedup("oracle") > 1.5



def test_race_sazo_beats_uniform_when_each_has_its_own_rate():
    """One η for all is not a fair race (notebook 05): each method gets its best rate of a grid."""
    problem = E.make_problem("heterogeneous quadratic", heterogeneity=1.5, num_examples=64, dim=5)
    settings = dict(seeds=(0, 1, 2), steps=200, batch_size=4, log_every=10, target_fraction=0.1)
    final = {}
    for method in ("uniform", "sazo"):
        _, result = E.tune_lr(problem, method, [0.005, 0.01, 0.02, 0.04], **settings)
        final[method] = np.median(result.gaps[method][:, -1])
    assert final["sazo"] < 0.5 * final["uniform"]


def test_race_sazo_does_not_lose_on_homogeneous_data():
    problem = E.make_problem("homogeneous quadratic", num_examples=64, dim=5)
    r = E.race(problem, samplers=("uniform", "sazo"), seeds=(0, 1, 2, 3), steps=150, batch_size=2,
               lr=0.02, log_every=10, target_fraction=0.1)
    assert r.median_to_target("sazo") <= 1.25 * r.median_to_target("uniform")


def test_race_is_reproducible_and_a_diverging_run_never_reaches_the_target():
    problem = E.make_problem(num_examples=16, dim=3)
    a = E.race(problem, samplers=("sazo",), seeds=(4,), steps=20, log_every=5)
    b = E.race(problem, samplers=("sazo",), seeds=(4,), steps=20, log_every=5)
    np.testing.assert_array_equal(a.gaps["sazo"], b.gaps["sazo"])
    wild = E.race(problem, samplers=("uniform",), seeds=(0,), steps=200, lr=50.0, log_every=5)
    assert (wild.gaps["uniform"][0, 1:] > 1e6 * wild.initial_gap).all()
    assert wild.to_target["uniform"] == [None] and np.isnan(wild.speedup("uniform"))
    assert wild.median_to_target("uniform") == np.inf


def test_race_bad_arguments():
    problem = E.make_problem(num_examples=8, dim=2)
    with pytest.raises(ValueError, match="target_fraction"):
        E.race(problem, target_fraction=1.5)
    with pytest.raises(ValueError, match="samplers"):
        E.race(problem, samplers=())


def test_plain_rule_trace_uses_the_plain_sampler(problem):
    plain = E.run_sazo_trace(problem, steps=40, batch_size=8, log_every=10, rule="plain")
    assert plain.rule == "plain"
    np.testing.assert_allclose(plain.sqrt_g[0], 1.0)           # constant start G_0 = 1
    assert plain.counts[0].sum() == 0 and 0 < plain.counts[-1].sum() <= 40 * 8   # distinct per step
    assert (np.diff(plain.counts, axis=0) >= 0).all()          # counts only grow
    with pytest.raises(ValueError, match="rule"):
        E.run_sazo_trace(problem, steps=5, rule="fancy")


def test_race_takes_one_rate_per_method():
    problem = E.make_problem(num_examples=16, dim=3)
    rates = {"uniform": 0.005, "sazo": 0.02, "oracle": 0.04}
    mixed = E.race(problem, seeds=(0,), steps=30, lr=rates)
    assert mixed.lrs == rates
    alone = E.race(problem, samplers=("sazo",), seeds=(0,), steps=30, lr=0.02)
    np.testing.assert_array_equal(mixed.gaps["sazo"], alone.gaps["sazo"])   # the same run
    with pytest.raises(ValueError, match="lr"):
        E.race(problem, seeds=(0,), steps=5, lr={"uniform": 0.01})


def test_tune_lr_returns_the_grid_rate_with_fewest_queries():
    problem = E.make_problem(num_examples=16, dim=3)
    grid = [0.001, 0.01, 0.05]
    best, result = E.tune_lr(problem, "uniform", grid, seeds=(0, 1), steps=80, target_fraction=0.2)
    races = {lr: E.race(problem, samplers=("uniform",), seeds=(0, 1), steps=80, target_fraction=0.2, lr=lr)
             for lr in grid}
    fewest = min(races[lr].median_to_target("uniform") for lr in grid)
    assert races[best].median_to_target("uniform") == fewest and result.lrs["uniform"] == best


def test_sampler_paths_share_directions_and_start():
    problem = E.make_problem(num_examples=16, dim=2)
    paths = E.sampler_paths(problem, steps=10, batch_size=16, lr=0.01)
    assert {m: p.shape for m, p in paths.items()} == {m: (11, 2) for m in E.SAMPLERS}
    assert all((p[0] == 0).all() for p in paths.values())
    plain = E.sampler_paths(problem, steps=10, samplers=("sazo",), rule="plain")["sazo"]
    assert not np.array_equal(plain, E.sampler_paths(problem, steps=10, samplers=("sazo",))["sazo"])

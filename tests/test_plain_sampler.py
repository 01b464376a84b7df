"""PlainSAZOSampler: the design page's plain rule, exactly as stated there."""
import math

import pytest
import torch

from sazo_lite import PlainSAZOSampler
from sazo_lite.samplers import make_sampler
from sazo_lite.course.problems import LeastSquares


def _reference_probs(g, mix):
    root = g.sqrt()
    return (1 - mix) * root / root.sum() + mix / len(g)


def test_rule_matches_a_plain_reference_on_random_feedback():
    """G from a constant start, EMA of d² (duplicates: their mean d²), p ∝ sqrt(G) mixed with uniform."""
    n, beta, mix, g0 = 12, 0.7, 0.2, 2.5
    sampler = PlainSAZOSampler(n, ema_decay=beta, uniform_mix=mix, initial_estimate=g0, seed=1)
    g = torch.full((n,), g0, dtype=torch.float64)
    gen = torch.Generator().manual_seed(0)
    assert torch.allclose(sampler.probs, torch.full((n,), 1 / n, dtype=torch.float64))
    for _ in range(100):
        idx, w = sampler.sample(5)
        assert torch.allclose(w, 1.0 / (n * sampler.probs[idx]), rtol=1e-12)
        diffs = torch.randn(5, generator=gen, dtype=torch.float64) * 3
        sampler.update(idx, diffs)
        for i in idx.unique():
            mean_sq = (diffs[idx == i] ** 2).mean()
            g[i] = beta * g[i] + (1 - beta) * mean_sq
        # G is stored in float32: the float64 reference agrees to float32 precision
        assert torch.allclose(sampler.estimates.double(), g, rtol=1e-6, atol=0)
        assert torch.allclose(sampler.probs, _reference_probs(g, mix), rtol=1e-6, atol=0)


def test_constant_start_favours_unseen_examples_when_norms_are_small():
    """The plain rule's failure the robust rule fixes: G_0 = 1 above every true d² keeps unseen
    examples ahead of seen ones, whatever the data say."""
    sampler = PlainSAZOSampler(4, seed=0)
    sampler.update(torch.tensor([0, 1]), torch.tensor([0.01, 0.02]))
    p = sampler.probs
    assert float(p[2]) == float(p[3]) > float(p[0]) and float(p[2]) > float(p[1])


def test_duplicates_use_the_mean_of_d_squared():
    twice, once = PlainSAZOSampler(3), PlainSAZOSampler(3)
    twice.update(torch.tensor([1, 1]), torch.tensor([1.0, 3.0]))
    once.update(torch.tensor([1]), torch.tensor([math.sqrt(5.0)], dtype=torch.float64))
    assert torch.allclose(twice.estimates, once.estimates, rtol=1e-6)
    assert int(twice.counts[1]) == 1


@pytest.mark.parametrize("kwargs, name", [
    (dict(ema_decay=1.0), "ema_decay"), (dict(uniform_mix=0.0), "uniform_mix"),
    (dict(initial_estimate=0.0), "initial_estimate"), (dict(initial_estimate=float("inf")), "initial_estimate"),
])
def test_bad_hyperparameters(kwargs, name):
    with pytest.raises(ValueError, match=name):
        PlainSAZOSampler(5, **kwargs)


def test_state_round_trip_resumes_bit_exactly():
    a = PlainSAZOSampler(20, ema_decay=0.8, seed=3)
    gen = torch.Generator().manual_seed(1)
    for _ in range(15):
        idx, _ = a.sample(3)
        a.update(idx, torch.randn(3, generator=gen))
    b = PlainSAZOSampler(20, seed=9)
    b.load_state_dict(a.state_dict())
    assert b.ema_decay == 0.8
    for _ in range(15):
        (ia, wa), (ib, wb) = a.sample(3), b.sample(3)
        assert torch.equal(ia, ib) and torch.equal(wa, wb)
        d = torch.randn(3, generator=gen)
        a.update(ia, d)
        b.update(ib, d)
    assert torch.equal(a.estimates, b.estimates)


@pytest.mark.parametrize("sum_tree", [False, True])
def test_overflowing_square_is_rejected_with_state_unchanged(sum_tree):
    sampler = PlainSAZOSampler(4, sum_tree=sum_tree)
    before = sampler.estimates.clone()
    with pytest.raises(ValueError, match="directional_diffs"):
        sampler.update(torch.tensor([0]), torch.tensor([1e200], dtype=torch.float64))
    assert torch.equal(before, sampler.estimates) and int(sampler.counts.sum()) == 0


def test_make_sampler_builds_it_by_name():
    problem = LeastSquares(16, 3, seed=0)
    sampler = make_sampler("sazo-plain", problem.num_examples, uniform_mix=0.3)
    assert isinstance(sampler, PlainSAZOSampler) and sampler.uniform_mix == 0.3

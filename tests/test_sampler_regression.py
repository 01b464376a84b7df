"""Regression guard for SAZO's rule across storage changes (issue 28, item 8).

The score store changed (float64 arrays + inverse-CDF draw → float32 scores, uint16 counts,
CdfStore / TreeStore and a mixture draw). These tests pin what must not change with it: the
documented robust rule and its defaults, checked step by step against an independent float64
reimplementation of the rule in ``SAZOSampler``'s docstring, and the draw's distribution and
weights. The index stream of a given seed is *not* pinned: any exact sampler of p is allowed.
"""
from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from sazo_lite.samplers import SAZOSampler

# the defaults as SAZOSampler's docstring states them (β, λ, c, level decay)
BETA, MIX, STRENGTH, LEVEL_DECAY = 0.9, 0.1, 1.0, 0.99


class ReferenceRule:
    """The robust rule of the docstring, in float64 numpy, with no store and no running sums."""

    def __init__(self, n: int):
        self.n = n
        self.g = np.zeros(n)
        self.count = np.zeros(n, dtype=np.int64)
        self.level, self.steps = 0.0, 0

    def prior(self) -> float:
        seen = self.count > 0
        return math.sqrt(float(np.mean(self.g[seen] ** 2))) if seen.any() else 0.0

    def probs(self) -> np.ndarray:
        scores = np.where(self.count > 0, self.g, self.prior())
        total = scores.sum()
        if not total > 0:
            return np.full(self.n, 1.0 / self.n)
        return (1 - MIX) * scores / total + MIX / self.n

    def update(self, indices: np.ndarray, diffs: np.ndarray) -> None:
        size = np.abs(diffs)
        weights = 1.0 / (self.n * self.probs()[indices])
        self.steps += 1
        rate = max(1.0 / self.steps, 1 - LEVEL_DECAY)
        self.level = (1 - rate) * self.level + rate * float(np.mean(weights * size))
        observed = size / self.level
        prior, any_seen = self.prior(), bool((self.count > 0).any())
        for i in np.unique(indices):
            o = observed[indices == i].mean()
            c = STRENGTH if any_seen else 0.0
            beta = min(BETA, (self.count[i] + c) / (self.count[i] + c + 1))
            old = self.g[i] if self.count[i] > 0 else prior
            self.g[i] = beta * old + (1 - beta) * o
            self.count[i] += 1


def _feed(n: int, steps: int, batch: int, seed: int):
    """A fixed stream of (indices, diffs) from its own generator: heterogeneous norms, shrinking."""
    g = torch.Generator().manual_seed(seed)
    norms = torch.exp(1.5 * torch.randn(n, generator=g, dtype=torch.float64))
    for t in range(steps):
        idx = torch.randint(n, (batch,), generator=g)
        shrink = 1.0 / (1.0 + 0.01 * t)   # every norm falls during training: the level must follow
        yield idx, shrink * norms[idx] * torch.randn(batch, generator=g, dtype=torch.float64)


@pytest.mark.parametrize("sum_tree", [False, True])
@pytest.mark.parametrize("batch", [1, 4])
def test_default_rule_matches_the_documented_rule_step_by_step(sum_tree, batch):
    n = 40
    sampler, reference = SAZOSampler(n, sum_tree=sum_tree, seed=0), ReferenceRule(n)
    for idx, diffs in _feed(n, 300, batch, seed=batch):
        expected_weights = 1.0 / (n * reference.probs()[idx.numpy()])
        sampler.update(idx, diffs)
        reference.update(idx.numpy(), diffs.numpy())
        # float32 scores: agreement to float32 rounding, not bit for bit
        np.testing.assert_allclose(sampler.probs.numpy(), reference.probs(), rtol=2e-5, atol=0)
        assert sampler.level == pytest.approx(reference.level, rel=1e-5)
        assert expected_weights.shape == (batch,)
    assert (sampler.counts.numpy() == reference.count).all()


@pytest.mark.parametrize("sum_tree", [False, True])
def test_draws_and_weights_follow_the_rules_distribution(sum_tree):
    """Whatever the index stream, a draw is from p and its weight is 1/(N·p_i)."""
    n = 30
    sampler, reference = SAZOSampler(n, sum_tree=sum_tree, seed=1), ReferenceRule(n)
    for idx, diffs in _feed(n, 15, 1, seed=7):   # about half the examples seen: prior in play
        sampler.update(idx, diffs)
        reference.update(idx.numpy(), diffs.numpy())
    p = reference.probs()
    assert 0 < int((reference.count > 0).sum()) < n
    draws = 200_000
    indices, weights = sampler.sample(draws)
    np.testing.assert_allclose(weights.numpy(), 1.0 / (n * p[indices.numpy()]), rtol=2e-5)
    counts = np.bincount(indices.numpy(), minlength=n)
    # each count is Binomial(draws, p_i): within 5 standard deviations
    assert (np.abs(counts - draws * p) <= 5 * np.sqrt(draws * p * (1 - p))).all()
    # importance weighting is unbiased: mean of w·1{i = j} over draws is 1/N for every j
    per_example = np.bincount(indices.numpy(), weights=weights.numpy(), minlength=n) / draws
    assert (np.abs(per_example * n - 1) < 0.05).all()


def test_the_old_inverse_cdf_stream_draws_from_the_same_p_with_other_indices_per_seed():
    """benchmarks.seed_reroll's old stream: a seed's indices differ from today's, their law does not."""
    from benchmarks.seed_reroll import InverseCdfSAZO

    n = 30
    old, new = InverseCdfSAZO(n, seed=3, sum_tree=False), SAZOSampler(n, seed=3, sum_tree=False)
    for idx, diffs in _feed(n, 15, 1, seed=7):   # the same feedback: the same rule state
        old.update(idx, diffs)
        new.update(idx, diffs)
    np.testing.assert_array_equal(old.probs.numpy(), new.probs.numpy())
    p, draws = new.probs.numpy(), 200_000
    first_old, first_new = old.sample(16)[0], new.sample(16)[0]
    assert not torch.equal(first_old, first_new)                     # a re-rolled seed
    indices, weights = old.sample(draws)
    np.testing.assert_allclose(weights.numpy(), 1.0 / (n * p[indices.numpy()]), rtol=1e-12)
    counts = np.bincount(indices.numpy(), minlength=n)
    assert (np.abs(counts - draws * p) <= 5 * np.sqrt(draws * p * (1 - p))).all()


def test_reroll_shift_sees_a_real_shift_and_not_a_reroll():
    from benchmarks.seed_reroll import reroll_shift

    rng = np.random.default_rng(0)
    same = reroll_shift(list(np.exp(rng.normal(8, 0.25, 60))), list(np.exp(rng.normal(8, 0.25, 60))))
    assert abs(same["mean_log_ratio"]) < same["half_width"] < 0.15
    slower = reroll_shift(list(np.exp(rng.normal(8, 0.25, 60))), list(np.exp(rng.normal(8.4, 0.25, 60))))
    assert slower["mean_log_ratio"] - slower["half_width"] > 0.2       # 1.5× slower is seen
    assert reroll_shift([100, None, 300], [None, None, 200])["missed"] == (1, 2)

"""StaleCorrectedSAZOSampler: the robust rule with scores scaled by the growth measured at each age.

Checked: the weights are 1/(N·p_i) for the p the draws actually follow, so E[w·∇f_i] is the full
gradient (exact enumeration and many draws); wrong versions (weights from the uncorrected p, or draws
from it) fail the same checks; the correction does what it says on norms that grow where it rarely
looks; O(N) state; the state_dict round trip is bit-exact and a tampered state is refused.
"""
import numpy as np
import pytest
import torch

from sazo_lite.samplers import SAZOSampler, StaleCorrectedSAZOSampler, probabilities
from sazo_lite.variance import importance_weights


def trained(sampler, steps=300, batch=4, seed=0, growing=None):
    """Feed ``steps`` updates of the sampler's own draws with |d| ∝ a fixed random norm per example
    (× (1 + t/50) for the examples in ``growing``)."""
    g = np.random.default_rng(seed)
    norms = np.exp(1.5 * g.standard_normal(sampler.num_examples))
    for t in range(steps):
        idx, _ = sampler.sample(batch)
        scale = norms[idx.numpy()].copy()
        if growing is not None:
            scale[np.isin(idx.numpy(), growing)] *= 1.0 + t / 50
        sampler.update(idx, torch.from_numpy(scale * g.standard_normal(batch)))
    return sampler


class UncorrectedWeights(StaleCorrectedSAZOSampler):
    """Wrong version: draws from the corrected p, weights from the uncorrected scores' p."""

    def sample(self, batch_size):
        idx, _ = super().sample(batch_size)
        raw = np.where(self._unseen(idx.numpy()), self._prior_score(), self._seen_scores(idx.numpy()))
        everything = np.arange(self.num_examples)
        total = float(np.where(self._unseen(everything), self._prior_score(), self._seen_scores(everything)).sum())
        p = probabilities(raw, total, self.uniform_mix, self.num_examples)
        return idx, torch.from_numpy(importance_weights(p, self.num_examples))


class UncorrectedDraws(StaleCorrectedSAZOSampler):
    """Wrong version: draws and weights from the uncorrected p, but reports the corrected ``probs``."""

    def _sampling_scores(self, indices):
        return self._seen_scores(indices)

    @property
    def probs(self):
        everything = np.arange(self.num_examples)
        scores = np.where(self._unseen(everything), self._prior_score(),
                          self._seen_scores(everything) * self._factors_at(everything))
        return torch.from_numpy(probabilities(scores, float(scores.sum()), self.uniform_mix, self.num_examples))


def weights_by_index(sampler, draws=4000, batch=64):
    """Draw from a frozen state: index counts and the (constant) weight each drawn index got."""
    counts = np.zeros(sampler.num_examples)
    weight = np.full(sampler.num_examples, np.nan)
    for _ in range(draws // batch):
        idx, w = sampler.sample(batch)
        np.add.at(counts, idx.numpy(), 1)
        weight[idx.numpy()] = w.numpy()
    return counts, weight


def unbiasedness_errors(sampler, grads, draws=200_000, batch=1000):
    """(exact: |Σ_i p_i·w_i·a_i − mean a| over the weights the sampler gives, by enumeration,
    sampled: max |mean over draws of w·a_i − mean a| in standard errors)."""
    full = grads.mean(axis=0)
    _, weight = weights_by_index(sampler, draws=60_000, batch=batch)
    p = sampler.probs.numpy()
    assert not np.isnan(weight).any()   # every example drawn at least once (p ≥ λ/N)
    exact = float(np.abs((p[:, None] * weight[:, None] * grads).sum(axis=0) - full).max())
    terms = []
    for _ in range(draws // batch):
        idx, w = sampler.sample(batch)
        terms.append(w.numpy()[:, None] * grads[idx.numpy()])
    terms = np.concatenate(terms)
    se = terms.std(axis=0) / np.sqrt(len(terms))
    return exact, float((np.abs(terms.mean(axis=0) - full) / se).max())


@pytest.mark.parametrize("statistic", ["abs", "square"])
def test_weighted_gradient_is_unbiased(statistic):
    n, d = 60, 5
    sampler = trained(StaleCorrectedSAZOSampler(n, statistic=statistic, seed=1), growing=np.arange(10))
    assert not np.allclose(sampler.growth_factors(), 1.0)  # the correction is active in this state
    grads = np.random.default_rng(2).standard_normal((n, d)) * np.linspace(0.1, 3, n)[:, None]
    exact, z = unbiasedness_errors(sampler, grads)
    assert exact < 1e-12
    assert z < 5.0


def test_weights_are_one_over_n_p_of_the_corrected_p():
    sampler = trained(StaleCorrectedSAZOSampler(40, seed=3), growing=np.arange(8))
    counts, weight = weights_by_index(sampler, draws=64_000)
    p = sampler.probs.numpy()
    drawn = ~np.isnan(weight)
    np.testing.assert_allclose(weight[drawn], 1.0 / (40 * p[drawn]), rtol=1e-12)
    expected = p * counts.sum()
    chi2 = float(((counts - expected) ** 2 / expected).sum())
    assert chi2 < 40 + 5 * np.sqrt(2 * 40)  # 39 degrees of freedom


def test_wrong_weights_fail_the_unbiasedness_check():
    n, d = 60, 5
    sampler = trained(UncorrectedWeights(n, seed=1), growing=np.arange(10))
    grads = np.random.default_rng(2).standard_normal((n, d)) * np.linspace(0.1, 3, n)[:, None]
    grads[:10] *= 10   # the growing examples carry the gradient: their weights matter
    exact, z = unbiasedness_errors(sampler, grads)
    assert exact > 1e-3 or z > 5.0


def test_wrong_draws_fail_the_frequency_check():
    sampler = trained(UncorrectedDraws(40, seed=3), growing=np.arange(8))
    counts, _ = weights_by_index(sampler, draws=64_000)
    p = sampler.probs.numpy()
    expected = p * counts.sum()
    assert float(((counts - expected) ** 2 / expected).sum()) > 40 + 5 * np.sqrt(2 * 40)


def test_stale_examples_whose_norms_grew_are_scaled_up():
    """Examples 0–9 are observed every 100 steps and their norms grow as e^(t/300); the others,
    observed every 20 steps, keep theirs: only the old age bucket learns a growth, and the corrected
    scores of the stale examples rise above the plain rule's."""
    n = 30
    corrected, plain = StaleCorrectedSAZOSampler(n, seed=0), SAZOSampler(n, seed=0)
    rng = np.random.default_rng(0)
    for s in (corrected, plain):
        s.update(torch.arange(n), torch.full((n,), 0.1))
    for t in range(1, 901):
        idx, size = [10 + t % 20], [1.0]
        if t % 10 == 0:
            idx.append((t // 10) % 10)
            size.append(0.1 * np.exp(t / 300))
        diffs = torch.tensor(size) * torch.from_numpy(np.abs(rng.standard_normal(len(size))) + 0.5)
        for s in (corrected, plain):
            s.update(torch.tensor(idx), diffs)
    factors = corrected.growth_factors()
    assert factors[6] > 1.25                # ages 64–127: the growing examples (1.43 when written)
    assert abs(factors[4] - 1.0) < 0.3      # ages 16–31: the steady ones
    # among the growing examples, the correction raises those drawn ≥ 64 steps ago over those drawn < 32 ago
    ages = 900 - 10 * (np.arange(10) + 10 * ((900 // 10 - np.arange(10)) // 10))
    old, young = ages >= 64, ages < 32
    assert old.any() and young.any()
    lift = (corrected.scores()[:10] / plain.scores()[:10]).numpy()
    assert lift[old].mean() > 1.2 * lift[young].mean()


def test_state_is_o_of_n():
    small, large = StaleCorrectedSAZOSampler(1000), StaleCorrectedSAZOSampler(8000)
    per_example = (large.state_bytes - small.state_bytes) / 7000
    assert per_example <= 8 + 4 + 2 + 8   # int64 step, float32 score, uint16 count, the CDF's float64
    assert small.state_bytes <= 1000 * per_example + 2 * 8 * StaleCorrectedSAZOSampler.AGE_BUCKETS + 64
    state = trained(StaleCorrectedSAZOSampler(500, seed=0), steps=50).state_dict()
    assert state["extra"]["last_seen"].shape == (500,)
    assert state["extra"]["growth_fresh"].shape == (StaleCorrectedSAZOSampler.AGE_BUCKETS,)


def test_state_dict_round_trip_is_bit_exact():
    a = trained(StaleCorrectedSAZOSampler(50, seed=4), steps=200, growing=np.arange(5))
    b = StaleCorrectedSAZOSampler(50, seed=99)
    b.load_state_dict(torch.load(_saved(a.state_dict()), weights_only=False))
    assert torch.equal(a.probs, b.probs)
    for _ in range(20):
        (ia, wa), (ib, wb) = a.sample(4), b.sample(4)
        assert torch.equal(ia, ib) and torch.equal(wa, wb)
        diffs = torch.randn(4)
        a.update(ia, diffs)
        b.update(ib, diffs)
    assert torch.equal(a.probs, b.probs)


def _saved(state):
    import io
    buffer = io.BytesIO()
    torch.save(state, buffer)
    buffer.seek(0)
    return buffer


@pytest.mark.parametrize("tamper", ["late", "unseen_step", "missing", "negative_growth", "shape"])
def test_tampered_state_is_refused_unchanged(tamper):
    a = trained(StaleCorrectedSAZOSampler(50, seed=4), steps=100)
    state = a.state_dict()
    extra = state["extra"]
    if tamper == "late":
        extra["last_seen"][int(torch.nonzero(extra["last_seen"])[0])] = extra["level_steps"] + 1
    elif tamper == "unseen_step":   # a seen example without a step
        extra["last_seen"][int(torch.nonzero(extra["last_seen"])[0])] = 0
    elif tamper == "missing":
        del extra["growth_stored"]
    elif tamper == "negative_growth":
        extra["growth_fresh"][3] = -1.0
    else:
        extra["last_seen"] = extra["last_seen"][:-1]
    b = trained(StaleCorrectedSAZOSampler(50, seed=5), steps=30)
    before = b.state_dict()
    with pytest.raises(ValueError, match="Invalid state"):
        b.load_state_dict(state)
    after = b.state_dict()
    assert torch.equal(before["estimates"], after["estimates"])
    assert torch.equal(before["extra"]["last_seen"], after["extra"]["last_seen"])


def test_sum_tree_and_bad_hyperparameters_are_refused():
    with pytest.raises(ValueError, match="sum_tree"):
        StaleCorrectedSAZOSampler(10, sum_tree=True)
    with pytest.raises(ValueError, match="growth_rate"):
        StaleCorrectedSAZOSampler(10, growth_rate=0.0)
    with pytest.raises(ValueError, match="max_factor"):
        StaleCorrectedSAZOSampler(10, max_factor=1.0)
    with pytest.raises(ValueError, match="min_factor"):
        StaleCorrectedSAZOSampler(10, min_factor=0.0)

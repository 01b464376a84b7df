"""The unseen-prior diagnostics of benchmarks.queries: informed samplers and the optimistic SAZO."""
import numpy as np
import pytest
import torch

from benchmarks.queries import METHODS, InformedSampler, OptimisticPriorSAZO
from sazo_lite import SAZOSampler
from sazo_lite.course.problems import LeastSquares


def _informed(prior, norms):
    sampler = InformedSampler(len(norms), lambda: torch.as_tensor(norms), stale=False, prior=prior, seed=0)
    sampler.update(torch.tensor([0, 1, 2]), torch.zeros(3))     # three examples seen
    return sampler.probs.numpy()


def test_the_informed_prior_gives_unseen_examples_the_rms_or_the_quantile_of_the_seen_norms():
    norms = np.array([1.0, 2.0, 6.0, 5.0, 0.5])
    for prior, unseen in (("rms", np.sqrt(np.mean(np.array([1.0, 2.0, 6.0]) ** 2))), (1.0, 6.0), (0.5, 2.0)):
        p = _informed(prior, norms)
        scores = np.array([1.0, 2.0, 6.0, unseen, unseen])
        expected = 0.9 * scores / scores.sum() + 0.1 / 5
        assert np.allclose(p, expected, rtol=1e-12), prior
    with pytest.raises(ValueError, match="Invalid prior"):
        InformedSampler(5, lambda: torch.ones(5), stale=False, prior=0.0)


def test_the_stale_informed_sampler_reading_norms_at_the_draws_alone_draws_as_the_one_reading_all():
    rng = np.random.default_rng(0)
    state = {"norms": rng.uniform(0.1, 3.0, 12)}
    asked = []

    def norms_at(indices):
        asked.append(len(indices))
        return torch.as_tensor(state["norms"][indices])
    every = InformedSampler(12, lambda: torch.as_tensor(state["norms"]), stale=True, seed=5)
    drawn = InformedSampler(12, None, stale=True, seed=5, norms_at=norms_at)
    for _ in range(40):
        (a, _), (b, _) = every.sample(3), drawn.sample(3)
        assert torch.equal(a, b)
        for sampler in (every, drawn):
            sampler.update(a, torch.zeros(3))
        assert np.array_equal(every.last, drawn.last) and np.array_equal(every.last[a.numpy()], state["norms"][a.numpy()])
        state["norms"] = state["norms"] * rng.uniform(0.5, 2.0, 12)          # the norms move between draws
    assert set(asked) == {3}                                                  # the drawn examples alone
    with pytest.raises(ValueError, match="Invalid norms_at"):
        InformedSampler(12, None, stale=False, norms_at=norms_at)


def test_the_optimistic_sazo_draws_the_unseen_at_the_largest_seen_score_and_stays_unbiased():
    n = 40
    sampler, plain = OptimisticPriorSAZO(n, quantile=1.0, seed=3), SAZOSampler(n, seed=3)
    idx = torch.arange(10)
    diffs = torch.linspace(0.1, 3.0, 10, dtype=torch.float64)
    for s in (sampler, plain):
        s.update(idx, diffs)
    # what is learnt is SAZO's (the blend keeps the RMS prior); only the unseen's sampling score differs
    assert np.array_equal(sampler.estimates.numpy(), plain.estimates.numpy())
    p = sampler.probs.numpy()
    seen_scores = plain.scores().numpy()[:10]
    scores = np.concatenate([seen_scores, np.full(n - 10, seen_scores.max())])
    assert np.allclose(p, 0.9 * scores / scores.sum() + 0.1 / n, rtol=1e-6)
    assert p[10:].min() > plain.probs.numpy()[10:].max()        # optimism: the unseen are favoured
    # weights are 1/(N·p) of the p sampled, so E[w·f] = F: check by the empirical frequencies
    draws, weights = sampler.sample(200_000)
    freq = np.bincount(draws.numpy(), minlength=n) / len(draws)
    assert np.abs(freq - p).max() < 0.003
    assert np.allclose(weights.numpy(), 1.0 / (n * p[draws.numpy()]))


def test_every_prior_variant_is_a_raceable_method():
    problem = LeastSquares(16, 3, heterogeneity=1.5, seed=0)
    theta = problem.initial_theta(torch.float64)
    for name in ("informed-max", "informed-q90", "sazo-optimistic-max", "sazo-optimistic-q90",
                 "oracle-smoothed-1N", "oracle-smoothed-10N", "noiseless-decay-0", "noiseless-decay-0.5"):
        sampler = METHODS[name](problem, theta, 0)
        idx, w = sampler.sample(4)
        sampler.update(idx, torch.randn(4, dtype=torch.float64))
        assert abs(float(sampler.probs.sum()) - 1.0) < 1e-9, name


def test_the_smoothed_oracle_with_a_one_step_horizon_is_the_capped_oracle_and_averages_squared_norms():
    from benchmarks.queries import SmoothedOracle
    from sazo_lite.samplers import OracleSampler

    state = {"norms": torch.tensor([1.0, 2.0, 4.0, 0.5], dtype=torch.float64)}
    norms_fn = lambda: state["norms"]
    one, capped = SmoothedOracle(4, norms_fn, horizon=1), OracleSampler(4, norms_fn, uniform_mix=0.1)
    slow = SmoothedOracle(4, norms_fn, horizon=4)
    assert torch.allclose(one.probs, capped.probs.double())
    first = state["norms"].numpy() ** 2
    slow.probs                                                       # m starts at the first norms
    state["norms"] = torch.tensor([3.0, 1.0, 1.0, 2.0], dtype=torch.float64)
    for s in (one, slow):
        s.update(torch.tensor([0]), torch.zeros(1))
    assert torch.allclose(one.probs, capped.probs.double())          # follows the present at h = 1
    m = 0.75 * first + 0.25 * state["norms"].numpy() ** 2
    expected = 0.9 * np.sqrt(m) / np.sqrt(m).sum() + 0.1 / 4
    assert np.allclose(slow.probs.numpy(), expected, rtol=1e-12)
    with pytest.raises(ValueError, match="Invalid horizon"):
        SmoothedOracle(4, norms_fn, horizon=0.5)


def test_the_regressed_sazo_starts_as_sazo_fits_a_line_per_age_and_stays_unbiased():
    from benchmarks.queries import RegressedSAZO

    n, rate = 12, 0.3
    sampler, plain = RegressedSAZO(n, rate=rate, seed=5), SAZOSampler(n, seed=5)
    diffs = torch.linspace(0.5, 3.0, n, dtype=torch.float64)
    for s in (sampler, plain):
        s.update(torch.arange(n), diffs)                            # every example seen once, at step 1
    assert np.allclose(sampler.probs.numpy(), plain.probs.numpy(), rtol=1e-12)  # α = 0, β = 1: SAZO's p
    # a reference for the age-1 bucket: running means of (s, o, s², s·o) over the re-drawn examples, o = |d|/L
    moments = np.array([1.0, 1.0, 2.0, 2.0])
    for idx, d in (([2, 9], [1.0, 4.0]), ([4, 5], [0.2, 2.5]), ([6, 7], [3.0, 0.1])):
        idx = torch.tensor(idx)
        ages = sampler.level_steps + 1 - sampler._last[idx.numpy()]
        stored = sampler._seen_scores(idx.numpy())
        sampler.update(idx, torch.tensor(d, dtype=torch.float64))
        fresh = np.abs(np.array(d)) / sampler.level
        if ages[0] == 1:
            for s_, o_ in zip(stored, fresh):
                moments += rate * (np.array([s_, o_, s_ * s_, s_ * o_]) - moments)
    assert (sampler._buckets(np.array([1])) == 0).all()
    intercept, slope = sampler.coefficients()
    m_s, m_o, m_ss, m_so = moments
    expected_slope = np.clip((m_so - m_s * m_o) / (m_ss - m_s * m_s), 0.0, 2.0)
    assert np.isclose(slope[0], expected_slope) and np.isclose(intercept[0], m_o - expected_slope * m_s)
    # the line scores the seen examples of that age (floored at 5% of the prior)
    one_step_old = np.flatnonzero(sampler.level_steps + 1 - sampler._last == 1)
    line = intercept[0] + slope[0] * sampler._seen_scores(one_step_old)
    floor = 0.05 * sampler._prior_score()
    assert np.allclose(sampler._sampling_scores(one_step_old), np.maximum(line, floor))
    # ... and p is still what the weights say it is: E[w·f] = F
    p = sampler.probs.numpy()
    assert abs(p.sum() - 1.0) < 1e-12 and p.min() >= 0.1 / n - 1e-15
    draws, weights = sampler.sample(100_000)
    assert np.abs(np.bincount(draws.numpy(), minlength=n) / len(draws) - p).max() < 0.005
    assert np.allclose(weights.numpy(), 1.0 / (n * p[draws.numpy()]))


def test_the_regressed_sazo_gives_unseen_examples_no_seen_mass():
    from benchmarks.queries import RegressedSAZO

    sampler = RegressedSAZO(10, seed=0)
    idx, weights = sampler.sample(4)
    assert torch.equal(weights, torch.ones(4, dtype=torch.float64))    # before any data: uniform
    sampler.update(torch.tensor([0, 1]), torch.tensor([1.0, 4.0], dtype=torch.float64))
    assert (sampler._sampling_scores(np.arange(2, 10)) == 0).all()   # the store adds the prior for these
    assert "sazo-regressed" in METHODS and "sazo-decay-0.95" in METHODS and "sazo-level-decay-0.999" in METHODS


def test_score_lag_splits_sazos_excess_variance_between_recently_drawn_and_older_examples():
    from benchmarks.score_lag import run

    rows = run("quadratic σ=1.5", steps=300, lr=0.005, seed=0, batch_size=4, log_every=150)   # make bench's data
    assert [r["step"] for r in rows] == [150, 300]
    for r in rows:
        assert abs(r["old"] + r["recent"] + 1.0 - r["sazo"]) < 1e-9 and r["sazo"] >= 1.0


def test_the_adaptive_mix_estimates_each_mixs_variance_term_without_bias():
    from benchmarks.queries import AdaptiveMixSAZO
    from sazo_lite.samplers import probabilities

    n = 10
    norms = np.array([0.1, 0.1, 0.2, 0.3, 0.5, 1.0, 2.0, 4.0, 0.05, 3.0])
    sampler = AdaptiveMixSAZO(n, rate=0.5, seed=1)
    sampler.update(torch.arange(n), torch.from_numpy(np.linspace(3.0, 0.2, n)))   # scores that disagree with the norms
    scores = sampler.scores().numpy()
    exact = np.array([np.sum(norms ** 2 / probabilities(scores, scores.sum(), m, n)) / n ** 2 for m in sampler.mixes])
    draws, weights = sampler.sample(200_000)                                     # from the current p (λ = 0.1)
    idx = draws.numpy()
    estimate = sampler.variance_terms(idx, norms[idx] ** 2)                      # E d² = ‖∇f‖²: the norms themselves
    assert np.allclose(estimate, exact, rtol=0.03)
    assert np.allclose(weights.numpy(), 1.0 / (n * sampler.probs.numpy()[idx]))  # weights of the p sampled
    assert "sazo-adaptive-mix" in METHODS


def test_the_adaptive_mix_follows_its_estimates_and_raises_the_floor_when_a_low_scored_norm_jumps():
    from benchmarks.queries import AdaptiveMixSAZO

    n = 10
    norms = np.array([0.01, 0.01, 0.02, 0.3, 0.5, 1.0, 2.0, 4.0, 0.01, 3.0])
    sampler = AdaptiveMixSAZO(n, rate=0.1, seed=2)

    def steps(k):
        for _ in range(k):
            idx, _ = sampler.sample(4)
            sampler.update(idx, torch.from_numpy(norms[idx.numpy()]))          # |d| = the norm: no noise
            if sampler.level_steps >= 10:                                       # after 1/rate steps of estimates
                assert sampler.uniform_mix == float(sampler.mixes[np.argmin(sampler.variance_estimates)])
    steps(300)
    assert set(sampler.mix_history[50:300]) == {0.05}     # scores that match the norms: the lowest floor
    norms[[0, 1, 8]] = 8.0                                # three floor examples jump past every other norm
    steps(100)
    assert max(sampler.mix_history[300:]) >= 0.1          # the jump is seen as variance, and the floor rises
    assert abs(float(sampler.probs.sum()) - 1.0) < 1e-9


def test_the_fast_up_sazo_is_sazo_at_equal_decays_and_otherwise_rises_by_the_up_decay_only():
    from benchmarks.queries import FastUpSAZO

    n, gen = 12, torch.Generator().manual_seed(4)
    same, plain, fast = FastUpSAZO(n, up_decay=0.9, seed=3), SAZOSampler(n, seed=3), FastUpSAZO(n, up_decay=0.3, seed=3)
    for _ in range(60):                                  # up_decay = β: SAZO's rule, step for step
        idx, _ = plain.sample(4)
        assert torch.equal(idx, same.sample(4)[0])
        d = torch.randn(4, generator=gen, dtype=torch.float64) * (1 + idx.double())
        for s in (same, plain):
            s.update(idx, d)
    assert np.allclose(same.probs.numpy(), plain.probs.numpy(), rtol=1e-6)
    # the rule on its own: one draw of each of two seen examples, one above its score and one below
    fast.update(torch.arange(n), torch.ones(n, dtype=torch.float64))
    fast.update(torch.arange(n), torch.ones(n, dtype=torch.float64))             # every count 2, every G 1
    g_before = fast.estimates.numpy().astype(np.float64)
    fast.update(torch.tensor([0, 1]), torch.tensor([5.0, 0.2], dtype=torch.float64))
    o = np.array([5.0, 0.2]) / fast.level
    beta = fast.decay([2, 2])
    up, down = min(0.3, beta[0]) * g_before[0] + (1 - min(0.3, beta[0])) * o[0], beta[1] * g_before[1] + (1 - beta[1]) * o[1]
    assert np.allclose(fast.estimates.numpy()[:2], [up, down], rtol=1e-6)
    scores = fast.scores().numpy()
    assert np.isclose(fast._seen_sq, float((scores ** 2).sum()), rtol=1e-9)     # the prior's running sum follows
    draws, weights = fast.sample(50_000)
    p = fast.probs.numpy()
    assert abs(p.sum() - 1) < 1e-12 and np.allclose(weights.numpy(), 1.0 / (n * p[draws.numpy()]))
    assert np.abs(np.bincount(draws.numpy(), minlength=n) / len(draws) - p).max() < 0.01

"""Round 18 of the library's red team, samplers and the training loop: what the hunt in the samplers, the sum
tree, the variance helpers, the training loop, interrupts and atomic writes found, and the properties checked.

Each defect's test fails on the code before its fix.
"""
from __future__ import annotations

import numpy as np
import pytest
import torch

from sazo_lite.samplers import PlainSAZOSampler, SAZOSampler, StaleCorrectedSAZOSampler


def _feedback(generator: torch.Generator, batch_size: int) -> torch.Tensor:
    return 3.0 * torch.randn(batch_size, generator=generator, dtype=torch.float64)


def _resume_matches(sampler, fresh, steps: int = 60, batch_size: int = 4) -> bool:
    """Save ``sampler``, load the state into ``fresh``, feed both the same diffs: same draws, weights, estimates."""
    fresh.load_state_dict(sampler.state_dict())
    generator = torch.Generator().manual_seed(5)
    for _ in range(steps):
        (a, wa), (b, wb) = sampler.sample(batch_size), fresh.sample(batch_size)
        if not (torch.equal(a, b) and torch.equal(wa, wb)):
            return False
        diffs = _feedback(generator, batch_size)
        sampler.update(a, diffs)
        fresh.update(b, diffs)
    return torch.equal(sampler.estimates, fresh.estimates)


# --- 1. a setting set as a numpy number resumes as the run it came from ----------------------------------------
@pytest.mark.parametrize("make", [
    lambda: PlainSAZOSampler(40, seed=0),
    lambda: PlainSAZOSampler(40, sum_tree=True, seed=0),
    lambda: SAZOSampler(40, seed=0),
    lambda: StaleCorrectedSAZOSampler(40, seed=0),
], ids=["plain", "plain tree", "robust", "stale-corrected"])
@pytest.mark.parametrize("beta", [np.float64(0.85), np.float32(0.3), np.float64(0.3)], ids=repr)
def test_an_ema_decay_set_as_a_numpy_number_resumes_bit_for_bit(make, beta):
    """A schedule sets β between steps as a numpy number (``0.9 * np.exp(-t / T)``). The plain rule computed
    β·G in float64 for a numpy float64 β and in float32 for a Python float (NumPy 2's promotion), and 1 − β in
    float32 for a float32 β; the state records β as a Python float (round 15), so the resumed run computed other
    estimates: 37 of 50 differed 100 steps after a resume."""
    sampler, generator = make(), torch.Generator().manual_seed(3)
    sampler.ema_decay = beta
    for _ in range(20):
        indices, _ = sampler.sample(4)
        sampler.update(indices, _feedback(generator, 4))
    assert _resume_matches(sampler, make())


def test_a_setting_is_kept_as_the_python_number_its_check_returns():
    """What the constructor and a loaded state hold: a float, whatever type was set between steps."""
    sampler = SAZOSampler(10)
    sampler.ema_decay, sampler.uniform_mix, sampler.prior_strength = np.float32(0.5), np.float64(0.2), np.int64(2)
    sampler.sample(2)
    assert [type(v) for v in (sampler.ema_decay, sampler.uniform_mix, sampler.prior_strength)] == [float] * 3
    assert (sampler.ema_decay, sampler.uniform_mix, sampler.prior_strength) == (0.5, float(np.float64(0.2)), 2.0)


# --- 2. the variance helpers: against brute-force enumeration, and at the edges of float64 -----------------------
import itertools  # noqa: E402
import math  # noqa: E402

from hypothesis import given, settings, strategies as st  # noqa: E402

from sazo_lite.variance import oracle_probs, sampling_variance, zo_second_moment  # noqa: E402


def _enumerated_second_moment(gradients: np.ndarray, probs: np.ndarray, batch_size: int) -> float:
    """E‖(1/B) Σ_k w_k a_{i_k}‖² over every B-tuple of draws (w = 1/(N·p_i)), summed term by term."""
    n = len(gradients)
    total = 0.0
    for draw in itertools.product(range(n), repeat=batch_size):
        estimate = sum(gradients[i] / (n * probs[i]) for i in draw) / batch_size
        total += float(np.prod(probs[list(draw)])) * float(estimate @ estimate)
    return total


@settings(max_examples=40, deadline=None)
@given(n=st.integers(1, 4), batch_size=st.integers(1, 3), dim=st.integers(1, 3), seed=st.integers(0, 2 ** 16))
def test_the_variance_formula_equals_brute_force_enumeration(n, batch_size, dim, seed):
    """E‖ĝ‖² = (d+2)·[V(p)/B + (1−1/B)·‖∇F‖²] with V(p) = (1/N²) Σ ‖a_i‖²/p_i, and V(p*) = (mean ‖a_i‖)² is the
    least V over p: every term against the enumeration of all Nᴮ batches (Gaussian z gives the factor d + 2)."""
    rng = np.random.default_rng(seed)
    gradients = rng.normal(size=(n, dim)) * rng.exponential(size=(n, 1))
    probs = rng.random(n) + 0.05
    probs /= probs.sum()
    norms, mean_gradient = np.linalg.norm(gradients, axis=1), gradients.mean(axis=0)
    exact = _enumerated_second_moment(gradients, probs, batch_size)
    predicted = zo_second_moment(norms, probs, float(np.linalg.norm(mean_gradient)), dim, batch_size)
    assert predicted == pytest.approx((dim + 2) * exact, rel=1e-10)
    best = sampling_variance(norms, oracle_probs(norms))
    assert best == pytest.approx(norms.mean() ** 2, rel=1e-12)
    other = rng.random(n) + 1e-3
    assert sampling_variance(norms, other / other.sum()) >= best * (1 - 1e-12)


def test_a_norm_whose_square_overflows_still_gives_the_variance():
    """V = (1/N²)·a²/p for one norm a = 1.5e154 among 100 zeros, p uniform: 2.25e306, which float64 holds; a² alone
    overflowed and V was inf (zo_second_moment too)."""
    norms, probs = [1.5e154] + [0.0] * 99, [0.01] * 100
    assert sampling_variance(norms, probs) == pytest.approx(2.25e306, rel=1e-12)
    assert zo_second_moment(norms, probs, 1.5e152, 3, 1) == pytest.approx(5 * 2.25e306, rel=1e-12)


@settings(max_examples=60, deadline=None)
@given(power=st.integers(-500, 500), seed=st.integers(0, 2 ** 16))
def test_the_variance_scales_with_the_square_of_the_norms(power, seed):
    """V(c·a, p) = c²·V(a, p) for c a power of two, across float64's range (exact while c²·V is a normal number)."""
    rng = np.random.default_rng(seed)
    norms, probs = rng.exponential(size=6), rng.random(6) + 0.1
    probs /= probs.sum()
    expected = math.ldexp(sampling_variance(norms, probs), 2 * power)
    if 1e-300 < expected < 1e300:
        assert sampling_variance(norms * 2.0 ** power, probs) == expected


@pytest.mark.parametrize("batch_size", [1, 2])
def test_a_full_gradient_norm_whose_square_overflows_is_no_overflow_error(batch_size):
    """full_grad_norm = 1e160 is a finite number check_number accepts; ``** 2`` raised OverflowError (unnamed), even
    for B = 1, where the term is multiplied by 0: now (d+2)·V for B = 1 and +inf for B = 2 (beyond float64)."""
    value = zo_second_moment([1.0, 1.0], [0.5, 0.5], 1e160, 3, batch_size)
    assert value == (5.0 if batch_size == 1 else math.inf)


def test_the_variance_is_the_plain_sum_bit_for_bit_on_ordinary_norms():
    rng = np.random.default_rng(0)
    for _ in range(200):
        n = int(rng.integers(1, 30))
        norms = torch.tensor(rng.exponential(size=n) * 10.0 ** rng.integers(-100, 100) * (rng.random(n) < 0.8))
        probs = torch.tensor(rng.random(n) + 1e-3)
        probs /= probs.sum()
        plain = float(torch.where(norms > 0, norms ** 2 / probs, torch.zeros_like(norms)).sum()) / n ** 2
        assert sampling_variance(norms, probs) == plain


# --- 3. train: a step rule that could scale nothing ------------------------------------------------------------
import warnings  # noqa: E402

from sazo_lite.engine import FlatLossWarning, MeZO  # noqa: E402
from sazo_lite.samplers import UniformSampler  # noqa: E402
from sazo_lite.train import NoiseScaledStep, train  # noqa: E402


class _Wrapped:
    """An optimiser train accepts (its step returns a ZOStep) that shows no param_groups."""

    def __init__(self, inner):
        self.inner = inner

    def step(self, closure, weights=None):
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", FlatLossWarning)
            return self.inner.step(closure, weights)


def test_a_step_rule_with_an_optimiser_without_param_groups_is_refused_before_anything_moves():
    """The rule scales each param group's lr; with none it observed every step and scaled nothing: the run was
    the run without the rule, bit for bit, and history.lr read NaN."""
    theta, data = torch.zeros(3), torch.randn(8)
    optimizer, rule = _Wrapped(MeZO([theta], lr=0.01, seed=1)), NoiseScaledStep(warmup=2)
    with pytest.raises(ValueError, match="step_rule.*param_groups"):
        train(optimizer, UniformSampler(8), lambda idx: (data[idx] - theta.sum()) ** 2, 5, batch_size=4,
              progress=False, step_rule=rule)
    assert torch.equal(theta, torch.zeros(3)) and rule.state_dict()["seen"] == 0


def test_the_same_optimiser_without_a_step_rule_still_trains():
    theta, data = torch.zeros(3), torch.randn(8)
    history = train(_Wrapped(MeZO([theta], lr=0.01, seed=1)), UniformSampler(8),
                    lambda idx: (data[idx] - theta.sum()) ** 2, 5, batch_size=4, progress=False)
    assert len(history.loss) == 5 and not torch.equal(theta, torch.zeros(3))


# --- 4. atomic writes of a file whose name is near the system's limit -------------------------------------------
import os  # noqa: E402

from sazo_lite import atomic  # noqa: E402


@pytest.mark.parametrize("name", ["r" * 250 + ".json", "é" * 120 + ".pt"], ids=["ascii", "two-byte"])
def test_a_file_name_near_the_limit_is_written_atomically(tmp_path, name):
    """A 255-byte name open() writes: the temporary name was '.' + the whole name + a random part + '.tmp', past
    the limit, and atomic_write raised OSError 'File name too long' (a report or checkpoint could not be saved)."""
    path = tmp_path / name
    path.write_text("old")
    assert atomic.write_text(path, "new") == 3
    assert path.read_text() == "new" and sorted(p.name for p in tmp_path.iterdir()) == [name]


def test_the_temporary_file_still_sits_beside_the_file_and_is_gone_after_a_failed_write(tmp_path):
    path, seen = tmp_path / "report.json", []

    def write(handle):
        seen.extend(p.name for p in tmp_path.iterdir())
        raise RuntimeError("serialiser failed")

    with pytest.raises(RuntimeError):
        atomic.atomic_write(path, write)
    assert seen[0].startswith(".report.json.") and seen[0].endswith(".tmp") and not list(tmp_path.iterdir())


# --- 5. the sum tree's draw probabilities, exactly: the uniform's 53 bits -----------------------------------------
from sazo_lite.sumtree import SumTree, _descend  # noqa: E402


def _exact_leaf_probabilities(tree: SumTree, low: int) -> np.ndarray:
    """P(leaf) over the draws u = k·2⁻⁵³ (torch.rand's float64 grid) for k ≥ ``low``, each path as ``sample`` descends
    (u below low·2⁻⁵³ goes to leaf 0 in the trees below: their first leaf holds all but a tiny share)."""
    u = np.arange(low, 2 ** 53, dtype=np.int64).astype(np.float64) * 2.0 ** -53
    node, n = np.ones(len(u), dtype=np.int64), tree.num_leaves
    while (node < n).any():
        active = node < n
        u[active], node[active] = _descend(u[active], node[active], tree._value(2 * node[active]),
                                           tree._value(2 * node[active] + 1))
    counts = np.bincount(node - n, minlength=n).astype(np.float64)
    counts[0] += low
    return counts * 2.0 ** -53


def test_torch_draws_float64_uniforms_on_the_53_bit_grid_the_enumeration_assumes():
    u = torch.rand(100_000, generator=torch.Generator().manual_seed(0), dtype=torch.float64).numpy() * 2.0 ** 53
    assert (u == np.floor(u)).all()


@pytest.mark.parametrize("exponent", [36, 40, 45])
def test_a_tiny_share_is_drawn_to_the_uniforms_resolution_as_the_docstring_states(exponent):
    """The docstring said each leaf's probability was its share to a relative error 'however small the weight';
    the one 53-bit u rescaled at each level bounds it by about ⌈log₂N⌉·2⁻⁵³ of Σw, absolute (a share of 2⁻⁴⁵:
    ~10⁻³ off, relative, in a float64 tree whose sums round nothing). Checked over every u that reaches them."""
    w = 1.1 * 2.0 ** -exponent
    weights = np.array([1.0, 0.0, w, 1.7 * w])
    tree = SumTree(torch.from_numpy(weights))
    exact = _exact_leaf_probabilities(tree, 2 ** 53 - int(4 * 2.0 ** (53 - exponent)))
    share = weights / weights.sum()
    assert np.abs(exact - share).max() <= 2 * 2.0 ** -53 * 1.01
    if exponent == 45:   # what the old sentence ruled out
        assert abs(exact[2] / share[2] - 1) > 1e-4


# --- 6. properties checked and found sound -------------------------------------------------------------------------
from sazo_lite.samplers import OracleSampler  # noqa: E402

_KINDS = {
    "uniform": lambda n, mix, beta: UniformSampler(n, seed=1),
    "plain": lambda n, mix, beta: PlainSAZOSampler(n, uniform_mix=mix, ema_decay=beta, seed=1),
    "plain tree": lambda n, mix, beta: PlainSAZOSampler(n, uniform_mix=mix, ema_decay=beta, sum_tree=True, seed=1),
    "robust": lambda n, mix, beta: SAZOSampler(n, uniform_mix=mix, ema_decay=beta, seed=1),
    "robust tree": lambda n, mix, beta: SAZOSampler(n, uniform_mix=mix, ema_decay=beta, sum_tree=True, seed=1),
    "square": lambda n, mix, beta: SAZOSampler(n, uniform_mix=mix, ema_decay=beta, statistic="square", seed=1),
    "stale": lambda n, mix, beta: StaleCorrectedSAZOSampler(n, uniform_mix=mix, ema_decay=beta, seed=1),
    "oracle": lambda n, mix, beta: OracleSampler(n, lambda: torch.arange(n, dtype=torch.float64) % 3, uniform_mix=mix,
                                                 seed=1),
}
_EXTREME_DIFFS = [0.0, 5e-324, 1e-310, 1e-30, 1.0, 3.0, 1e10, 1e19, 1e100, 1e300, -2.0]


@settings(max_examples=150, deadline=None)
@given(kind=st.sampled_from(sorted(_KINDS)), n=st.integers(1, 9), mix=st.sampled_from([1e-9, 0.1, 1.0]),
       beta=st.sampled_from([0.0, 0.9, 0.999999]), data=st.data())
def test_any_run_of_extreme_feedback_keeps_a_distribution_its_weights_and_a_bit_exact_resume(kind, n, mix, beta, data):
    """Diffs of 0, denormals and up to 1e300, B from 1 to 2N + 1, λ and β at their edges: p stays a distribution
    with every entry > 0 (the oracle's λ may leave zero norms at p = 0), every weight is 1/(N·p_i) of the p drawn
    from, a refused update says why, and a state loaded into a new sampler draws on bit for bit."""
    sampler = _KINDS[kind](n, mix, beta)
    for _ in range(data.draw(st.integers(0, 6))):
        batch_size = data.draw(st.integers(1, 2 * n + 1))
        indices, weights = sampler.sample(batch_size)
        probs = sampler.probs
        assert bool(torch.isfinite(probs).all()) and abs(float(probs.sum()) - 1.0) < 1e-5
        assert kind == "oracle" or bool((probs > 0).all())
        assert torch.allclose(weights, 1.0 / (n * probs[indices]), rtol=1e-6)
        diffs = torch.tensor(data.draw(st.lists(st.sampled_from(_EXTREME_DIFFS), min_size=batch_size,
                                                max_size=batch_size)), dtype=torch.float64)
        try:
            sampler.update(indices, diffs)
        except ValueError as error:   # the plain rule's d² past float32, a level past float64: nothing changed
            assert "overflow" in str(error) or "too large" in str(error)
    fresh = _KINDS[kind](n, mix, beta)
    fresh.load_state_dict(sampler.state_dict())
    for step in range(3):
        (a, wa), (b, wb) = sampler.sample(3), fresh.sample(3)
        assert torch.equal(a, b) and torch.equal(wa, wb)
        sampler.update(a, torch.full((3,), step + 1.0, dtype=torch.float64))
        fresh.update(b, torch.full((3,), step + 1.0, dtype=torch.float64))


@pytest.mark.parametrize("kind", sorted(set(_KINDS) - {"oracle"}))
def test_every_examples_weighted_draw_count_is_unbiased(kind):
    """E[Σ_k w_k·1{i_k = i}] = B/N for every example i (what makes mean_k w_k·f_k unbiased), with B > N, after
    feedback that makes p far from uniform: the mean over 400 batches within 5 standard errors."""
    n, batch_size = 12, 20
    sampler, generator = _KINDS[kind](n, 0.1, 0.5), torch.Generator().manual_seed(0)
    for _ in range(30):
        indices, _ = sampler.sample(batch_size)
        sampler.update(indices, (1.0 + indices.double()) ** 2 * torch.randn(batch_size, generator=generator,
                                                                              dtype=torch.float64))
    totals = np.zeros((400, n))
    for row in totals:
        indices, weights = sampler.sample(batch_size)
        np.add.at(row, indices.numpy(), weights.numpy())
    mean, error = totals.mean(axis=0), totals.std(axis=0) / np.sqrt(len(totals))
    assert (np.abs(mean - batch_size / n) <= 5 * error + 1e-12).all(), (mean, error)

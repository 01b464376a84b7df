"""Samplers under hostile input: bit-exact resume, checked loads, huge diffs, bad oracle norms.

Each defect from the "one clean core" issue has a test here that failed before the fix; the
hypothesis tests then fuzz the same contracts (random save/load points resume bit-exactly;
bad input raises ValueError and leaves the state unchanged).
"""
import copy
import math

import numpy as np
import pytest
import torch
from hypothesis import HealthCheck, given, settings, strategies as st

from sazo_lite import OracleSampler, PlainSAZOSampler, SAZOSampler, UniformSampler
from sazo_lite.samplers import StaleCorrectedSAZOSampler
from sazo_lite.samplers import SAZOState, probabilities

FUZZ = settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])


def _same(a, b) -> bool:
    """Deep, bit-exact equality of two state dicts (tensors by torch.equal, floats by ==)."""
    if isinstance(a, dict):
        return isinstance(b, dict) and a.keys() == b.keys() and all(_same(a[k], b[k]) for k in a)
    if isinstance(a, torch.Tensor):
        return isinstance(b, torch.Tensor) and a.dtype == b.dtype and torch.equal(a, b)
    return type(a) is type(b) and a == b


def _make(kind: str, n: int, seed: int = 0, **kwargs):
    if kind == "uniform":
        return UniformSampler(n, seed=seed)
    if kind == "plain":
        return PlainSAZOSampler(n, seed=seed, **kwargs)
    if kind == "plain-tree":
        return PlainSAZOSampler(n, seed=seed, sum_tree=True, **kwargs)
    if kind == "sazo-tree":
        return SAZOSampler(n, seed=seed, sum_tree=True, **kwargs)
    if kind == "sazo-square":
        return SAZOSampler(n, seed=seed, statistic="square", **kwargs)
    if kind == "sazo-stale":
        return StaleCorrectedSAZOSampler(n, seed=seed, **kwargs)
    return SAZOSampler(n, seed=seed, sum_tree=False, **kwargs)


KINDS = ["uniform", "plain", "plain-tree", "sazo", "sazo-tree", "sazo-square", "sazo-stale"]


def _steps(sampler, gen, steps, batch=4, scale=1.0):
    for _ in range(steps):
        idx, w = sampler.sample(batch)
        diffs = torch.randn(batch, generator=gen, dtype=torch.float64) * scale * torch.exp(torch.randn(batch, generator=gen))
        sampler.update(idx, diffs)


def _trajectory(sampler, gen, steps, batch=4):
    out = []
    for _ in range(steps):
        idx, w = sampler.sample(batch)
        sampler.update(idx, torch.randn(batch, generator=gen, dtype=torch.float64))
        out.append((idx.clone(), w.clone()))
    return out


# -- bit-exact resume -----------------------------------------------------------------------
@pytest.mark.parametrize("kind", KINDS)
def test_resume_is_bit_exact_past_a_resync(kind):
    """Saved after 20 steps on N = 64 (the old state left out the running sums and resync
    counter; trees were rebuilt in another order): the next 200 steps, through several
    resyncs of the running sums, must match bit for bit."""
    a = _make(kind, 64, seed=3)
    _steps(a, torch.Generator().manual_seed(0), 20)
    b = _make(kind, 64, seed=11)
    b.load_state_dict(a.state_dict())
    assert _same(a.state_dict(), b.state_dict())
    ga, gb = torch.Generator().manual_seed(5), torch.Generator().manual_seed(5)
    for (ia, wa), (ib, wb) in zip(_trajectory(a, ga, 200), _trajectory(b, gb, 200)):
        assert torch.equal(ia, ib) and torch.equal(wa, wb)
    assert _same(a.state_dict(), b.state_dict()) and torch.equal(a.probs, b.probs)


def test_state_record_round_trips_and_is_documented():
    sampler = SAZOSampler(10, seed=1)
    _steps(sampler, torch.Generator().manual_seed(0), 5)
    state = sampler.state_dict()
    assert set(state) == {f for f in SAZOState.__dataclass_fields__}
    assert _same(SAZOState(**state).as_dict(), state)
    state["estimates"][0] = 123.0  # a copy, not a view of the live state
    assert float(sampler.estimates[0]) != 123.0
    loaded = copy.deepcopy(state)
    assert _same(loaded, state)


# -- checked loads --------------------------------------------------------------------------
def _bad_states(good: dict):
    """(description, state) pairs that must be rejected."""
    def edit(path, value):
        bad = copy.deepcopy(good)
        target = bad
        for key in path[:-1]:
            target = target[key]
        if value is KeyError:
            del target[path[-1]]
        else:
            target[path[-1]] = value
        return bad
    n = good["num_examples"]
    nan_estimates = good["estimates"].clone()
    nan_estimates[0] = float("nan")
    negative_counts = good["counts"].clone()
    negative_counts[1] = -1
    yield "uniform_mix = 5", edit(("hyperparameters", "uniform_mix"), 5.0)
    yield "ema_decay = nan", edit(("hyperparameters", "ema_decay"), float("nan"))
    yield "unknown hyperparameter", edit(("hyperparameters", "bogus"), 1.0)
    yield "num_examples changed", edit(("num_examples",), n + 1)
    yield "NaN estimate", edit(("estimates",), nan_estimates)
    yield "negative count", edit(("counts",), negative_counts)
    yield "fractional counts", edit(("counts",), good["counts"].double() + 0.5)
    yield "estimates of another length", edit(("estimates",), good["estimates"][:-1])
    yield "missing generator", edit(("generator",), KeyError)
    yield "missing counts", edit(("counts",), KeyError)
    yield "generator garbage", edit(("generator",), torch.zeros(3, dtype=torch.uint8))
    yield "seed 1.5", edit(("seed",), 1.5)
    if "level" in good.get("extra", {}):
        yield "NaN level", edit(("extra", "level"), float("nan"))
        yield "negative level steps", edit(("extra", "level_steps"), -2)
        yield "seen count off", edit(("extra", "seen_count"), good["extra"]["seen_count"] + 1)
        yield "missing running sum", edit(("extra", "seen_sq"), KeyError)


@pytest.mark.parametrize("kind", ["plain", "sazo", "sazo-tree"])
def test_load_checks_everything_before_changing_anything(kind):
    source = _make(kind, 12, seed=1, uniform_mix=0.2)
    _steps(source, torch.Generator().manual_seed(0), 8)
    target = _make(kind, 12, seed=2)
    _steps(target, torch.Generator().manual_seed(1), 3)
    before = target.state_dict()
    for name, bad in _bad_states(source.state_dict()):
        with pytest.raises(ValueError, match="Invalid"):
            target.load_state_dict(bad)
        assert _same(before, target.state_dict()), name
    target.load_state_dict(source.state_dict())  # the good one still loads
    assert target.uniform_mix == 0.2 and _same(source.state_dict(), target.state_dict())


def test_uniform_and_plain_reject_other_sizes():
    with pytest.raises(ValueError, match="num_examples"):
        UniformSampler(4).load_state_dict(UniformSampler(5).state_dict())
    with pytest.raises(ValueError, match="num_examples"):
        PlainSAZOSampler(4).load_state_dict(PlainSAZOSampler(5).state_dict())


# -- huge finite diffs ------------------------------------------------------------------------
@pytest.mark.parametrize("sum_tree", [False, True])
@pytest.mark.parametrize("statistic", ["abs", "square"])
def test_huge_finite_diffs_keep_the_level_finite(statistic, sum_tree):
    """1e200 with statistic="square" made the level inf (trees then raised on every update,
    the CDF fell back to uniform for good). The level now works in |d| units."""
    sampler = SAZOSampler(16, statistic=statistic, sum_tree=sum_tree, seed=0)
    sampler.update(torch.arange(4), torch.tensor([1e200, -1e200, 3e199, 1.0], dtype=torch.float64))
    assert math.isfinite(sampler.level) and sampler.level > 0
    p = sampler.probs
    assert bool(torch.isfinite(p).all()) and abs(float(p.sum()) - 1) < 1e-6
    assert float(p[0]) > float(p[3])  # the huge ones are sampled more: not a fallback to uniform
    gen = torch.Generator().manual_seed(0)
    for _ in range(20):  # and it keeps learning at any scale
        idx, _ = sampler.sample(3)
        sampler.update(idx, torch.randn(3, generator=gen, dtype=torch.float64) * 1e-3)
    assert math.isfinite(sampler.level) and bool(torch.isfinite(sampler.probs).all())


@pytest.mark.parametrize("kind", ["sazo", "sazo-tree", "plain"])
def test_diffs_that_would_overflow_are_rejected_with_state_unchanged(kind):
    sampler = _make(kind, 8)
    _steps(sampler, torch.Generator().manual_seed(0), 3)
    before = sampler.state_dict()
    with pytest.raises(ValueError, match="directional_diffs"):
        # Σ_k w_k·|d_k| overflows float64 (every w_k ≥ 1/(N·(1−λ+λ/N)) ≈ 0.14 here)
        sampler.update(torch.arange(8), torch.full((8,), 1.7e308, dtype=torch.float64))
    assert _same(before, sampler.state_dict())


# -- the oracle --------------------------------------------------------------------------------
@pytest.mark.parametrize("bad", [float("nan"), float("inf"), -1.0])
def test_oracle_rejects_nan_inf_and_negative_norms(bad):
    norms = torch.ones(5, dtype=torch.float64)
    norms[2] = bad
    oracle = OracleSampler(5, lambda: norms, seed=0)
    before = oracle.state_dict()
    with pytest.raises(ValueError, match="norms"):
        oracle.sample(3)
    assert _same(before, oracle.state_dict())


def test_oracle_samples_p_star():
    norms = torch.tensor([1.0, 0.0, 3.0], dtype=torch.float64)
    oracle = OracleSampler(3, lambda: norms, seed=0)
    assert torch.allclose(oracle.probs, torch.tensor([0.25, 0.0, 0.75], dtype=torch.float64))
    assert torch.equal(OracleSampler(3, lambda: torch.zeros(3)).probs, torch.full((3,), 1 / 3, dtype=torch.float64))


def test_probabilities_is_the_one_transform():
    scores = np.array([0.0, 1.0, 3.0])
    p = probabilities(scores, 4.0, 0.1, 3)
    assert np.allclose(p, 0.9 * scores / 4 + 0.1 / 3) and math.isclose(p.sum(), 1.0)
    assert np.allclose(probabilities(scores, 0.0, 0.1, 3), 1 / 3)  # nothing known: uniform


# -- fuzz ---------------------------------------------------------------------------------------
@FUZZ
@given(kind=st.sampled_from(KINDS), n=st.integers(1, 40), batch=st.integers(1, 6),
       before=st.integers(0, 30), after=st.integers(1, 30), seed=st.integers(0, 2 ** 16))
def test_fuzz_random_save_points_resume_bit_exactly(kind, n, batch, before, after, seed):
    a = _make(kind, n, seed=seed)
    gen = torch.Generator().manual_seed(seed)
    for _ in range(before):
        idx, _ = a.sample(batch)
        a.update(idx, torch.randn(batch, generator=gen, dtype=torch.float64) * 10 ** float(torch.randint(-3, 4, ()).item()))
    b = _make(kind, n, seed=seed + 1)
    b.load_state_dict(copy.deepcopy(a.state_dict()))
    g1, g2 = torch.Generator().manual_seed(seed), torch.Generator().manual_seed(seed)
    for (ia, wa), (ib, wb) in zip(_trajectory(a, g1, after, batch), _trajectory(b, g2, after, batch)):
        assert torch.equal(ia, ib) and torch.equal(wa, wb)
    assert _same(a.state_dict(), b.state_dict())


_bad_update = st.one_of(
    st.tuples(st.just("index out of range"), st.integers(-5, -1)),
    st.tuples(st.just("index past N"), st.integers(0, 5)),
    st.tuples(st.just("nan diff"), st.sampled_from([float("nan"), float("inf"), -float("inf")])),
    st.tuples(st.just("shape"), st.integers(0, 3)),
    st.tuples(st.just("float indices"), st.just(0)),
)


@FUZZ
@given(kind=st.sampled_from(KINDS), n=st.integers(1, 30), warm=st.integers(0, 10), bad=_bad_update,
       seed=st.integers(0, 1000))
def test_fuzz_bad_updates_raise_and_change_nothing(kind, n, warm, bad, seed):
    sampler = _make(kind, n, seed=seed)
    _steps(sampler, torch.Generator().manual_seed(seed), warm, batch=3)
    before, probs = sampler.state_dict(), sampler.probs
    what, value = bad
    idx, diffs = torch.tensor([0, n - 1]), torch.tensor([0.5, -1.0], dtype=torch.float64)
    if what == "index out of range":
        idx = torch.tensor([0, value])
    elif what == "index past N":
        idx = torch.tensor([0, n + value])
    elif what == "nan diff":
        diffs = torch.tensor([0.5, value], dtype=torch.float64)
    elif what == "shape":
        diffs = torch.ones(value if value != 2 else 4, dtype=torch.float64)
    else:
        idx = torch.tensor([0.0, 1.0])
    with pytest.raises(ValueError, match="Invalid"):
        sampler.update(idx, diffs)
    assert _same(before, sampler.state_dict()) and torch.equal(probs, sampler.probs)


@FUZZ
@given(kind=st.sampled_from(["plain", "sazo", "sazo-tree", "sazo-stale"]),
       field=st.sampled_from(["uniform_mix", "ema_decay", "num_examples", "estimates", "counts", "generator"]),
       value=st.sampled_from([float("nan"), -1.0, 5.0, "x", None, 1e40]))
def test_fuzz_bad_loads_raise_and_change_nothing(kind, field, value):
    source, target = _make(kind, 6, seed=0), _make(kind, 6, seed=1)
    _steps(source, torch.Generator().manual_seed(0), 4, batch=2)
    _steps(target, torch.Generator().manual_seed(1), 2, batch=2)
    before = target.state_dict()
    bad = source.state_dict()
    if field in ("uniform_mix", "ema_decay"):
        bad["hyperparameters"][field] = value
    elif field in ("estimates", "counts"):
        if isinstance(value, float):
            bad[field] = bad[field].double()
            bad[field][0] = value
            if field == "counts" and value == 5.0:
                bad[field][0] = 5.5  # 5.0 is a valid count; a fractional one is not
            if field == "estimates" and value in (5.0,):
                bad[field][0] = -5.0
        else:
            bad[field] = value
    else:
        bad[field] = value
    with pytest.raises(ValueError, match="Invalid"):
        target.load_state_dict(bad)
    assert _same(before, target.state_dict())

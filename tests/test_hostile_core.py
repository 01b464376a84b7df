"""The samplers and the engine under hostile input (issue 24, items 9-13).

One regression test per defect, named for it (each failed on the code before the fix), then
hypothesis suites over the new input classes: loaded sampler states, timed Ctrl-C during
updates, and parameters near their dtype's range or without storage of their own.
"""
import signal
import time

import numpy as np
import pytest
import torch
from hypothesis import HealthCheck, given, settings, strategies as st

from sazo_lite import MeZO, OracleSampler, PlainSAZOSampler, SAZOSampler, UniformSampler

FAST = settings(max_examples=20, deadline=None, suppress_health_check=[HealthCheck.too_slow])


def _same_state(a, b) -> bool:
    if isinstance(a, dict):
        return isinstance(b, dict) and a.keys() == b.keys() and all(_same_state(a[k], b[k]) for k in a)
    if isinstance(a, torch.Tensor):
        return isinstance(b, torch.Tensor) and torch.equal(a, b)
    return a == b


def _warm(sampler, steps=5, batch=8, seed=0):
    gen = torch.Generator().manual_seed(seed)
    for _ in range(steps):
        idx, _ = sampler.sample(batch)
        sampler.update(idx, torch.randn(batch, generator=gen, dtype=torch.float64))
    return sampler


def _loads(state, make) -> bool:
    try:
        make().load_state_dict(state)
        return True
    except ValueError:
        return False


# -- 9: Ctrl-C inside SAZOSampler.update -----------------------------------------------------
class _SigintMidCommit(SAZOSampler):
    """Sends a real SIGINT from inside the commit of an update: the first ``_seen_scores`` call
    after the level is written (G and n are written next, then the running sums)."""

    target = None

    def _seen_scores(self, indices):
        if self.target is not None and self.level_steps == self.target:
            self.target = None
            signal.raise_signal(signal.SIGINT)
        return super()._seen_scores(indices)


@pytest.mark.parametrize("sum_tree", [False, True])
def test_ctrl_c_inside_sazo_update_leaves_a_state_that_loads(sum_tree):
    sampler = _warm(_SigintMidCommit(64, sum_tree=sum_tree, seed=1))
    idx, _ = sampler.sample(8)
    counts = sampler.counts
    sampler.target = sampler.level_steps + 1
    with pytest.raises(KeyboardInterrupt):
        sampler.update(idx, torch.linspace(-2, 3, 8, dtype=torch.float64))
    assert bool((sampler.counts > counts).any())   # the interrupt came after the whole update
    fresh = SAZOSampler(64, sum_tree=sum_tree)
    fresh.load_state_dict(sampler.state_dict())
    assert torch.equal(fresh.probs, sampler.probs)


def test_timed_ctrl_c_during_updates_at_2_to_16_never_leaves_a_state_that_fails_to_load():
    n, batch = 2 ** 16, 256
    sampler = _warm(SAZOSampler(n, seed=0), steps=3, batch=batch)
    gen = torch.Generator().manual_seed(1)
    idx, _ = sampler.sample(batch)
    diffs = torch.randn(batch, generator=gen, dtype=torch.float64)
    start = time.perf_counter()
    sampler.update(idx, diffs)
    duration = time.perf_counter() - start
    rng = np.random.default_rng(0)
    armed = []

    def alarm(*_):
        if armed:
            signal.raise_signal(signal.SIGINT)

    previous = signal.signal(signal.SIGALRM, alarm)
    interrupted = 0
    try:
        for _ in range(30):
            idx, _ = sampler.sample(batch)
            diffs = torch.randn(batch, generator=gen, dtype=torch.float64)
            try:
                armed.append(1)
                signal.setitimer(signal.ITIMER_REAL, float(rng.uniform(0.0, 1.2 * duration)) + 1e-6)
                sampler.update(idx, diffs)
                time.sleep(1.5 * duration)   # a late alarm lands here, not in the next update
            except KeyboardInterrupt:
                interrupted += 1
            finally:
                armed.clear()
                signal.setitimer(signal.ITIMER_REAL, 0)
            SAZOSampler(n).load_state_dict(sampler.state_dict())   # raises on a half-written state
    finally:
        signal.signal(signal.SIGALRM, previous)
    assert interrupted > 0   # the test did interrupt updates


def test_an_interrupted_load_state_dict_is_whole_or_not_at_all():
    source = _warm(SAZOSampler(32, seed=3), steps=4)
    target = SAZOSampler(32, seed=9)
    calls = []
    original = target._store.refresh

    def refresh_with_ctrl_c(*args, **kwargs):
        calls.append(1)
        signal.raise_signal(signal.SIGINT)      # held until the load has written everything
        return original(*args, **kwargs)

    target._store.refresh = refresh_with_ctrl_c
    with pytest.raises(KeyboardInterrupt):
        target.load_state_dict(source.state_dict())
    assert calls and _same_state(target.state_dict(), source.state_dict())


# -- 10: impossible sampler states -----------------------------------------------------------
@pytest.mark.parametrize("sum_tree", [False, True])
def test_a_loaded_state_with_scores_above_the_samplers_maximum_is_refused(sum_tree):
    state = _warm(SAZOSampler(40, sum_tree=sum_tree)).state_dict()
    seen = state["counts"] > 0
    state["estimates"] = torch.where(seen, torch.tensor(3e38), state["estimates"])   # the rule stores ≤ 1e30
    target = SAZOSampler(40, sum_tree=sum_tree)
    before = target.state_dict()
    with pytest.raises(ValueError, match="estimates"):
        target.load_state_dict(state)
    assert _same_state(before, target.state_dict())


def test_the_largest_score_the_rule_stores_still_loads_and_both_stores_agree():
    state = _warm(SAZOSampler(40, sum_tree=False)).state_dict()
    seen = state["counts"] > 0
    state["estimates"] = torch.where(seen, torch.tensor(1e30, dtype=torch.float32), state["estimates"])
    top = float(torch.tensor(1e30, dtype=torch.float32).double())
    state["extra"]["seen_sq"] = int(seen.sum()) * top * top   # the running sum these estimates give
    cdf, tree = SAZOSampler(40, sum_tree=False), SAZOSampler(40, sum_tree=True)
    cdf.load_state_dict(state)
    state["hyperparameters"]["sum_tree"] = True
    tree.load_state_dict(state)
    assert torch.allclose(cdf.probs, tree.probs, rtol=1e-6) and bool(torch.isfinite(tree.probs).all())


@pytest.mark.parametrize("edit, match", [
    (lambda s: s["extra"].update(since_resync=40), "since_resync"),
    (lambda s: s["extra"].update(level_steps=0), "level_steps"),
])
def test_impossible_counters_in_a_loaded_state_are_refused(edit, match):
    state = _warm(SAZOSampler(40)).state_dict()
    edit(state)
    with pytest.raises(ValueError, match=match):
        SAZOSampler(40).load_state_dict(state)


# -- 11: N a sampler cannot draw from --------------------------------------------------------
@pytest.mark.parametrize("make", [lambda: UniformSampler(2 ** 63), lambda: UniformSampler(2 ** 70),
                                  lambda: OracleSampler(2 ** 24 + 1, lambda: torch.ones(2 ** 24 + 1)),
                                  lambda: SAZOSampler(2 ** 40), lambda: PlainSAZOSampler(2 ** 40)])
def test_a_sampler_larger_than_it_can_draw_from_is_refused_at_construction(make):
    with pytest.raises(ValueError, match="num_examples"):
        make()


def test_the_largest_uniform_sampler_draws():
    indices, weights = UniformSampler(2 ** 63 - 1, seed=0).sample(3)
    assert indices.dtype == torch.long and bool((indices >= 0).all()) and bool((weights == 1).all())


# -- 12: parameters near their dtype's maximum -----------------------------------------------
def test_a_shift_that_would_push_theta_past_the_dtype_max_is_refused_before_anything_moves():
    theta = torch.tensor([3e38, -1.0, 2.0])
    before = theta.clone()
    opt = MeZO([theta], lr=0.1, eps=1e37)   # 2·ε·z fits float32; θ + ε·z does not
    with pytest.raises(ValueError, match="overflow"):
        opt.step(lambda: theta.double().sum().reshape(1))
    assert torch.equal(theta, before) and opt.step_count == 0


def test_an_update_that_would_push_theta_past_the_dtype_max_is_refused_and_theta_restored():
    theta = torch.tensor([3e38, 3e38, -3e38, 1.0])
    before = theta.clone()
    opt = MeZO([theta], lr=1e31, eps=1e-3)   # lr·g ≈ 1e37: the coefficient fits float32, θ + it·z does not
    calls = []

    def closure():
        calls.append(1)
        return torch.tensor([1e3 if len(calls) % 2 else -1e3], dtype=torch.float64)

    with pytest.raises(ValueError, match="overflow"):
        opt.step(closure)
    assert bool(torch.isfinite(theta).all()) and torch.equal(theta, before) and opt.step_count == 0


def test_parameters_holding_inf_or_nan_are_refused_before_a_step():
    for bad in (float("inf"), float("nan")):
        theta = torch.tensor([1.0, bad])
        with pytest.raises(ValueError, match="inf or NaN"):
            MeZO([theta], lr=0.1).step(lambda: theta.double().sum().reshape(1))


@FAST
@given(scale=st.sampled_from([1e30, 1e36, 3e37, 1e38, 3e38, 3.4e38]), eps=st.sampled_from([1e-3, 1.0, 1e30, 1e36]),
       lr=st.sampled_from([0.0, 1e-3, 1e30, 1e36]), dtype=st.sampled_from([torch.float32, torch.float16, torch.bfloat16]),
       fold=st.booleans(), seed=st.integers(0, 50))
def test_fuzz_steps_near_the_dtype_max_never_write_inf(scale, eps, lr, dtype, fold, seed):
    g = torch.Generator().manual_seed(seed)
    limit = torch.finfo(dtype).max
    theta = (torch.rand(6, generator=g, dtype=torch.float64) * 2 - 1).mul(min(scale, limit)).to(dtype)
    if not bool(torch.isfinite(theta).all()):
        return
    try:
        opt = MeZO([theta], lr=lr, eps=eps, fold_updates=fold, seed=seed)
    except ValueError:
        return
    calls = []

    def closure():
        calls.append(1)
        return torch.tensor([1.0 if len(calls) % 2 else -1.0], dtype=torch.float64)

    for _ in range(3):
        before = theta.clone()
        try:
            opt.step(closure)
        except (ValueError, FloatingPointError):
            assert bool(torch.isfinite(theta).all())
            if not fold:
                assert bool(torch.isfinite(before).all())
        assert bool(torch.isfinite(theta).all())
    try:
        opt.flush()
    except ValueError:
        pass
    assert bool(torch.isfinite(theta).all())


# -- 13: parameters without storage of their own ---------------------------------------------
@pytest.mark.parametrize("make, match", [
    (lambda: [torch.zeros(3, device="meta")], "meta"),
    (lambda: [torch.zeros(3).expand(4, 3)], "expanded"),
    (lambda: [torch.zeros(4).as_strided((3, 2), (1, 1))], "memory location"),
    (lambda: (lambda x: [x[:4], x[3:]])(torch.zeros(6)), "share memory"),
])
def test_meta_expanded_and_overlapping_parameters_are_refused_at_construction(make, match):
    with pytest.raises(ValueError, match=match):
        MeZO(make(), lr=0.1)


def test_views_that_do_not_overlap_are_accepted_and_step():
    base = torch.zeros(6, 4)
    params = [base[:3], base[3:], torch.zeros(4, 3).t()]
    opt = MeZO(params, lr=0.1, eps=1e-3)
    opt.step(lambda: sum(p.double().pow(2).sum() for p in params).reshape(1))
    assert opt.step_count == 1


def test_an_added_group_that_shares_memory_with_the_first_is_refused():
    base = torch.zeros(8)
    opt = MeZO([base[:5]], lr=0.1)
    with pytest.raises(ValueError, match="share memory"):
        opt.add_param_group({"params": [base[4:]]})
    assert len(opt.param_groups) == 1


# -- hypothesis: loaded sampler states --------------------------------------------------------
FIELDS = ["estimates", "counts", "level", "level_steps", "seen_sq", "seen_count", "since_resync"]
VALUES = [0, 1, -1, 3, 40, 65535, 65536, 1e30, 1.0000001e30, 3e38, 1e300, float("inf"), float("nan"), 0.5]


@FAST
@given(field=st.sampled_from(FIELDS), value=st.sampled_from(VALUES), where=st.integers(0, 39),
       sum_tree=st.booleans(), statistic=st.sampled_from(["abs", "square"]))
def test_fuzz_loaded_states_either_refuse_or_sample_the_same_from_both_stores(field, value, where, sum_tree, statistic):
    state = _warm(SAZOSampler(40, statistic=statistic, sum_tree=sum_tree), steps=6).state_dict()
    if field in ("estimates", "counts"):
        array = state[field].double() if isinstance(value, float) else state[field].clone()
        array[where] = value
        state[field] = array
    else:
        state["extra"][field] = value
    make = lambda tree: SAZOSampler(40, statistic=statistic, sum_tree=tree)   # noqa: E731
    if not _loads(state, lambda: make(sum_tree)):
        return
    a, b = make(False), make(True)
    state["hyperparameters"]["sum_tree"] = False
    a.load_state_dict(state)
    state["hyperparameters"]["sum_tree"] = True
    b.load_state_dict(state)
    assert bool(torch.isfinite(a.probs).all()) and float(a.probs.sum()) == pytest.approx(1.0)
    assert torch.allclose(a.probs, b.probs, rtol=1e-5, atol=1e-12)
    idx, w = b.sample(16)
    assert bool(torch.isfinite(w).all()) and bool((idx >= 0).all()) and bool((idx < 40).all())
    a.update(idx, torch.ones(16, dtype=torch.float64))   # and it keeps learning


@pytest.mark.parametrize("kind", ["uniform", "sazo", "plain"])
def test_a_generator_state_torch_cannot_use_is_refused_with_value_error(kind):
    make = {"uniform": lambda: UniformSampler(10), "sazo": lambda: SAZOSampler(10),
            "plain": lambda: PlainSAZOSampler(10)}[kind]
    sampler = make()
    state = sampler.state_dict()
    state["generator"] = torch.zeros_like(state["generator"])   # right shape and dtype, not a valid state
    before = sampler.state_dict()
    with pytest.raises(ValueError, match="generator"):
        sampler.load_state_dict(state)
    assert _same_state(before, sampler.state_dict())

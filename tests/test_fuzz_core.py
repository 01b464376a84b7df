"""Property-based fuzzing of the core's public API (hypothesis), as a hostile user would.

    bad inputs          ValueError, and parameters, step counters and hyperparameters unchanged
    fault schedules     exceptions, NaN losses, KeyboardInterrupt from the closure and Ctrl-C in
                        the middle of a pass, between and inside steps, folded or not: after each
                        failed step θ is back within the restore bound, and the seed log still
                        replays the whole run bit for bit
    save/load points    MeZO state_dict and SeedLog (bytes, then replay_into) resume bit-exactly
    serialised logs     any corrupted byte string loads as a log or raises ValueError, nothing else

The profile keeps the suite to well under a minute of CPU: few examples, tiny tensors, no deadline.
"""
import copy
import math
import signal

import pytest
import torch
from hypothesis import HealthCheck, given, settings, strategies as st

import sazo_lite as sz
from sazo_lite.engine import MeZO
from sazo_lite.noise import TorchNoise

settings.register_profile("core", max_examples=25, deadline=None, derandomize=True,
                          suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture])
CORE = settings.get_profile("core")

SHAPES = [(5, 4), (33,), (2,)]
BAD_NUMBERS = st.sampled_from([float("nan"), float("inf"), -float("inf"), -1.0, -1e-9, "0.1", None, True,
                               [0.1], torch.tensor(0.1), complex(1, 1)])


def make_params(seed, dtype=torch.float32):
    g = torch.Generator().manual_seed(seed)
    return [torch.randn(s, generator=g, dtype=torch.float64).to(dtype) for s in SHAPES]


def make_closure(params, seed=0):
    g = torch.Generator().manual_seed(seed)
    targets = [torch.randn(p.shape, generator=g, dtype=torch.float64) for p in params]
    return lambda: torch.stack([((p.double() - t) ** 2).mean() for p, t in zip(params, targets)])


def make_optimizer(params, *, fold, chunked, perturbation="gaussian", seed=1):
    noise = TorchNoise(workers=2, chunk=16) if chunked else None
    groups = [{"params": params[:1], "lr": 0.05, "weight_decay": 0.1},
              {"params": params[1:], "lr": 0.02, "perturbation": perturbation}]
    return MeZO(groups, lr=0.01, eps=1e-2, seed=seed, noise=noise, fold_updates=fold)


def snapshot(opt, params):
    return ([p.clone() for p in params], opt.step_count, [dict((k, v) for k, v in g.items() if k != "params")
                                                           for g in opt.param_groups])


def assert_unchanged(opt, params, snap):
    values, steps, groups = snap
    assert all(torch.equal(p, v) for p, v in zip(params, values))
    assert opt.step_count == steps
    assert [dict((k, v) for k, v in g.items() if k != "params") for g in opt.param_groups] == groups


def restore_bound(before, eps=1e-2, passes=3):
    u = torch.finfo(before.dtype).eps
    return passes * u * (before.abs() + 2 * eps * 9.0)


# -- bad inputs ------------------------------------------------------------------------------
@CORE
@given(name=st.sampled_from(["lr", "eps", "weight_decay", "seed", "perturbation", "fold_updates"]),
       value=BAD_NUMBERS)
def test_bad_constructor_arguments_raise_value_error(name, value):
    if name == "seed" and isinstance(value, torch.Tensor):
        value = 0.5
    kwargs = dict(lr=0.1)
    kwargs[name] = value
    with pytest.raises(ValueError, match=name):
        MeZO([torch.zeros(3)], **kwargs)


@CORE
@given(data=st.data(), fold=st.booleans(), warm_steps=st.integers(0, 2))
def test_bad_step_inputs_raise_value_error_and_change_nothing(data, fold, warm_steps):
    params = make_params(0)
    opt = make_optimizer(params, fold=fold, chunked=False)
    closure = make_closure(params)
    for _ in range(warm_steps):
        opt.step(closure)
    opt.flush()
    snap = snapshot(opt, params)
    where = data.draw(st.sampled_from(["weights", "group", "closure"]))
    if where == "weights":  # refused before any pass: θ untouched bit for bit
        weights = data.draw(st.sampled_from([torch.ones(3, 1), torch.tensor([1.0, -1.0, 1.0]),
                                             torch.tensor([1.0, float("nan"), 1.0]), "w", [[1.0]],
                                             torch.ones(3, dtype=torch.complex64), torch.ones(2)]))
        with pytest.raises(ValueError, match="weights"):
            opt.step(closure, weights)
        if weights.shape == (2,) if isinstance(weights, torch.Tensor) else False:
            # a length that does not match the losses shows only after the first call: shifted back
            assert opt.step_count == snap[1]
            for p, before in zip(params, snap[0]):
                assert bool(((p - before).abs() <= restore_bound(before, passes=2)).all())
        else:
            assert_unchanged(opt, params, snap)
    elif where == "group":
        key = data.draw(st.sampled_from(["lr", "eps", "weight_decay", "perturbation"]))
        opt.param_groups[data.draw(st.integers(0, 1))][key] = data.draw(BAD_NUMBERS)
        with pytest.raises(ValueError):
            opt.step(closure)
        assert opt.step_count == snap[1]
        assert all(torch.equal(p, v) for p, v in zip(params, snap[0]))
    else:  # found after the first shift: θ is shifted back
        bad = data.draw(st.sampled_from([torch.empty(0), torch.ones(2, 2), "loss", None, [float("nan")],
                                         torch.tensor([1 + 1j])]))
        with pytest.raises((ValueError, FloatingPointError)):
            opt.step(lambda: bad)
        assert opt.step_count == snap[1]
        for p, before in zip(params, snap[0]):
            assert bool(((p - before).abs() <= restore_bound(before, passes=2)).all())


STATE_EDITS = [("param_groups", 0, "lr", float("nan")), ("param_groups", 1, "eps", 0.0),
               ("param_groups", 0, "weight_decay", -1.0), ("param_groups", 1, "perturbation", "x"),
               ("state", 0, "step", 1.5), ("state", 0, "step", -3), ("state", 0, "seed", "s"),
               ("param_groups", 0, "eps", 2e-2)]


@CORE
@given(edits=st.lists(st.sampled_from(STATE_EDITS), min_size=1, max_size=3), drop_state=st.booleans())
def test_bad_state_dicts_raise_value_error_and_change_nothing(edits, drop_state):
    params = make_params(1)
    source = make_optimizer(params, fold=False, chunked=False)
    source.step(make_closure(params))
    state = copy.deepcopy(source.state_dict())
    for where, index, key, value in edits:
        state[where][index][key] = value
    if drop_state:
        state["state"] = {}
    target = make_optimizer(make_params(1), fold=False, chunked=False, seed=7)
    snap = snapshot(target, target.param_groups[0]["params"] + target.param_groups[1]["params"])
    with pytest.raises(ValueError):
        target.load_state_dict(state)
    assert_unchanged(target, target.param_groups[0]["params"] + target.param_groups[1]["params"], snap)
    assert target.next_seed() == sz.derive_seed(7, 0)


# -- fault schedules -------------------------------------------------------------------------
class SigintSource(TorchNoise):
    """TorchNoise that sends this process a real SIGINT while pass ``fire_on`` is half done."""

    fire_on = None

    def apply(self, jobs, done=None):
        self.count = getattr(self, "count", 0) + 1
        super().apply(jobs, done)

    def _apply_one(self, job, slot):
        super()._apply_one(job, slot)
        if self.fire_on is not None and self.count == self.fire_on:
            self.fire_on = None
            signal.raise_signal(signal.SIGINT)


FAULTS = ["ok", "raise1", "raise2", "nan1", "nan2", "kbd1", "kbd2", "sigint1", "sigint2", "sigint3", "empty"]


def faulty(closure, fault):
    calls = []

    def run():
        calls.append(1)
        call = len(calls)
        if fault in ("raise1", "raise2") and call == int(fault[-1]):
            raise RuntimeError("injected")
        if fault in ("kbd1", "kbd2") and call == int(fault[-1]):
            raise KeyboardInterrupt
        if fault in ("nan1", "nan2") and call == int(fault[-1]):
            return closure() * float("nan")
        if fault == "empty":
            return torch.empty(0)
        return closure()
    return run


@CORE
@given(schedule=st.lists(st.tuples(st.sampled_from(FAULTS), st.booleans()), min_size=1, max_size=8),
       fold=st.booleans(), perturbation=st.sampled_from(["gaussian", "rademacher"]))
def test_random_fault_schedules_restore_theta_and_keep_the_log_exact(schedule, fold, perturbation):
    params = make_params(2)
    initial = [p.clone() for p in params]
    opt = make_optimizer(params, fold=fold, chunked=True, perturbation=perturbation)
    source = SigintSource(workers=1, chunk=16)
    opt.noise = source
    log = sz.SeedLog.attach(opt)
    closure = make_closure(params, seed=3)
    completed = 0
    for fault, flush_first in schedule:
        if flush_first:
            opt.flush()
        before, steps = [p.clone() for p in params], opt.step_count
        if fault.startswith("sigint"):
            source.count, source.fire_on = 0, int(fault[-1])
        try:
            opt.step(faulty(closure, fault))
        except (RuntimeError, FloatingPointError, ValueError, KeyboardInterrupt):
            if opt.step_count == steps and not opt.pending and (flush_first or not fold):
                for p, b in zip(params, before):  # the failed step is undone within the bound
                    assert bool(((p - b).abs() <= restore_bound(b)).all())
        source.fire_on = None
        completed += opt.step_count - steps
        assert opt.step_count - steps in (0, 1)
        assert fault in ("ok", "sigint3") or opt.step_count == steps  # only a late Ctrl-C may commit
    opt.flush()
    assert log.num_steps == completed
    replayed = [p.clone() for p in initial]
    sz.SeedLog.from_bytes(log.to_bytes()).replay(replayed)
    assert all(torch.equal(a, b) for a, b in zip(params, replayed))


# -- save/load points ------------------------------------------------------------------------
@CORE
@given(steps=st.integers(1, 8), data=st.data(), fold=st.booleans(), chunked=st.booleans(),
       perturbation=st.sampled_from(["gaussian", "rademacher"]), dtype=st.sampled_from([torch.float32, torch.float64]))
def test_random_save_load_points_resume_bit_exactly(steps, data, fold, chunked, perturbation, dtype):
    at = data.draw(st.integers(0, steps))
    straight = make_params(4, dtype)
    opt = make_optimizer(straight, fold=fold, chunked=chunked, perturbation=perturbation)
    closure = make_closure(straight, seed=5)
    grads = [opt.step(closure).projected_grad for _ in range(steps)]
    opt.flush()

    params = make_params(4, dtype)
    first = make_optimizer(params, fold=fold, chunked=chunked, perturbation=perturbation)
    closure = make_closure(params, seed=5)
    for _ in range(at):
        first.step(closure)
    state = copy.deepcopy(first.state_dict())  # flushes a pending update
    resumed = [p.clone() for p in params]
    second = make_optimizer(resumed, fold=fold, chunked=chunked, perturbation=perturbation, seed=123)
    second.param_groups[0]["lr"] = 9.0  # the loaded state must override everything
    second.load_state_dict(state)
    closure = make_closure(resumed, seed=5)
    assert [second.step(closure).projected_grad for _ in range(at, steps)] == grads[at:]
    second.flush()
    assert all(torch.equal(a, b) for a, b in zip(straight, resumed))


@CORE
@given(steps=st.integers(1, 8), data=st.data(), fold=st.booleans(),
       perturbation=st.sampled_from(["gaussian", "rademacher"]))
def test_seed_log_saved_at_any_point_replays_and_training_continues_bit_exactly(steps, data, fold, perturbation):
    at = data.draw(st.integers(0, steps))
    straight = make_params(6)
    opt = make_optimizer(straight, fold=fold, chunked=True, perturbation=perturbation)
    closure = make_closure(straight, seed=7)
    for _ in range(steps):
        opt.step(closure)
    opt.flush()

    params = make_params(6)
    initial = [p.clone() for p in params]
    first = make_optimizer(params, fold=fold, chunked=True, perturbation=perturbation)
    log = sz.SeedLog.attach(first)
    closure = make_closure(params, seed=7)
    for _ in range(at):
        first.step(closure)
    loaded = sz.SeedLog.from_bytes(log.to_bytes())
    second = make_optimizer(initial, fold=fold, chunked=False, perturbation=perturbation, seed=99)
    loaded.replay_into(second)  # the plain loop replays TorchNoise's directions
    assert second.step_count == at
    closure = make_closure(initial, seed=7)
    for _ in range(at, steps):
        second.step(closure)
    second.flush()
    assert all(torch.equal(a, b) for a, b in zip(straight, initial))


# -- serialised logs -------------------------------------------------------------------------
@CORE
@given(cuts=st.lists(st.tuples(st.integers(0, 10 ** 6), st.integers(0, 255)), min_size=1, max_size=4),
       truncate=st.integers(0, 60))
def test_corrupted_log_bytes_load_or_raise_value_error(cuts, truncate):
    params = make_params(8)
    opt = make_optimizer(params, fold=False, chunked=False)
    log = sz.SeedLog.attach(opt)
    for _ in range(3):
        opt.step(make_closure(params))
    data = bytearray(log.to_bytes())
    for position, value in cuts:
        data[position % len(data)] = value
    data = bytes(data[:len(data) - truncate])
    try:
        loaded = sz.SeedLog.from_bytes(data)
    except ValueError:
        return
    for kind, key, value in loaded.records:  # whatever loads is a log replay can apply
        assert kind in (0, 1, 2, 3) and math.isfinite(value)

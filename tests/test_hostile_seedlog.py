"""The seed log under hostile input (issue 24, items 5-8).

One regression test per defect, named for it (each failed on the code before the fix), then
hypothesis suites over the new input classes: seed-log bytes (mutated, truncated, crafted
records) and step hooks that raise.
"""
import copy
import json
import os
import resource
import signal

import numpy as np
import pytest
import torch
from hypothesis import HealthCheck, given, settings, strategies as st

import sazo_lite as sz
from sazo_lite.directions import derive_seed
from sazo_lite.seedlog import _RECORD, _STEP

FAST = settings(max_examples=30, deadline=None, suppress_health_check=[HealthCheck.too_slow])


def params_and_closure(seed=0):
    g = torch.Generator().manual_seed(seed)
    params = [torch.randn(5, 3, generator=g), torch.randn(7, generator=g)]
    target = [torch.randn(5, 3, generator=g), torch.randn(7, generator=g)]
    closure = lambda: torch.stack([((p - t) ** 2).sum() for p, t in zip(params, target)])  # noqa: E731
    return params, closure


def logged_run(steps=4, seed=0, lr=0.05):
    params, closure = params_and_closure(seed)
    initial = [p.clone() for p in params]
    opt = sz.MeZO(params, lr=lr, eps=1e-3, seed=seed)
    log = sz.SeedLog.attach(opt)
    for _ in range(steps):
        opt.step(closure)
    return params, initial, opt, log


def with_record(log, record):
    """The log's bytes with one more record appended (header count fixed): a crafted file."""
    data = log.to_bytes()
    head, _, body = data.partition(b"\n")
    header = json.loads(head)
    header["records"] += 1
    extra = np.array([record], dtype=_RECORD).tobytes()
    return json.dumps(header).encode() + b"\n" + body + extra


# -- 5: replay is all or nothing ---------------------------------------------------------------
def test_a_log_with_a_huge_finite_g_is_refused_before_replay_moves_anything():
    tuned, initial, _, log = logged_run()
    crafted = sz.SeedLog.from_bytes(with_record(log, (_STEP, 12345, 1e300)))   # finite: it parses
    replica = [p.clone() for p in initial]
    with pytest.raises(ValueError, match="record"):
        crafted.replay(replica)
    assert all(torch.equal(a, b) for a, b in zip(replica, initial))   # not half-replayed


def test_a_replay_interrupted_part_way_puts_everything_back(monkeypatch):
    _, initial, _, log = logged_run(steps=5)
    replica = [p.clone() for p in initial]
    opt = sz.MeZO(replica, lr=0.0, eps=1e-3, noise=None)
    calls = []
    original = sz.MeZO.replay_step

    def interrupted(self, seed, g):
        calls.append(1)
        if len(calls) == 3:
            raise KeyboardInterrupt
        return original(self, seed, g)

    monkeypatch.setattr(sz.MeZO, "replay_step", interrupted)
    with pytest.raises(KeyboardInterrupt):
        log.replay_into(opt)
    assert all(torch.equal(a, b) for a, b in zip(replica, initial))
    assert opt.step_count == 0 and opt.param_groups[0]["lr"] == 0.0


def test_replay_still_rebuilds_the_run_bit_exactly_after_the_checks():
    tuned, initial, _, log = logged_run(steps=6)
    replica = [p.clone() for p in initial]
    sz.SeedLog.from_bytes(log.to_bytes()).replay(replica)
    assert all(torch.equal(a, b) for a, b in zip(replica, tuned))


# -- 6: save is atomic -------------------------------------------------------------------------
@pytest.mark.skipif(not hasattr(signal, "SIGXFSZ"), reason="POSIX file-size limits")
def test_a_save_that_fails_part_way_leaves_the_previous_log_whole(tmp_path):
    _, _, _, good = logged_run(steps=2)
    _, _, _, longer = logged_run(steps=200)
    path = tmp_path / "run.seedlog"
    good.save(path)
    before = path.read_bytes()
    soft, hard = resource.getrlimit(resource.RLIMIT_FSIZE)
    previous = signal.signal(signal.SIGXFSZ, signal.SIG_IGN)   # the write then fails with EFBIG
    resource.setrlimit(resource.RLIMIT_FSIZE, (len(before) + 100, hard))
    try:
        with pytest.raises(OSError):
            longer.save(path)                                   # over the file-size limit
    finally:
        resource.setrlimit(resource.RLIMIT_FSIZE, (soft, hard))
        signal.signal(signal.SIGXFSZ, previous)
    assert path.read_bytes() == before
    assert sz.SeedLog.load(path).num_steps == 2
    assert sorted(os.listdir(tmp_path)) == ["run.seedlog"]     # no temporary left behind


def test_ctrl_c_during_a_save_leaves_the_previous_log_whole(tmp_path, monkeypatch):
    _, _, _, good = logged_run(steps=2)
    path = tmp_path / "run.seedlog"
    good.save(path)
    before = path.read_bytes()

    def interrupted(fd):
        raise KeyboardInterrupt

    monkeypatch.setattr(os, "fsync", interrupted)
    with pytest.raises(KeyboardInterrupt):
        logged_run(steps=9)[3].save(path)
    assert path.read_bytes() == before and sorted(os.listdir(tmp_path)) == ["run.seedlog"]


# -- 7: a raising hook does not hide a step from later hooks -----------------------------------
def test_a_hook_that_raises_does_not_hide_a_committed_step_from_the_seed_log():
    params, closure = params_and_closure()
    initial = [p.clone() for p in params]
    opt = sz.MeZO(params, lr=0.05, eps=1e-3, seed=4)
    seen = []

    def grumpy(optimizer, event):
        seen.append(event.kind)
        if len(seen) == 2:
            raise RuntimeError("a hook's own bug")

    opt.register_step_hook(grumpy)            # registered before the seed log
    log = sz.SeedLog.attach(opt)
    opt.step(closure)
    with pytest.raises(RuntimeError, match="own bug"):
        opt.step(closure)                     # committed; the hook's error comes afterwards
    opt.step(closure)
    assert opt.step_count == 3 and log.num_steps == 3 and seen == ["step"] * 3
    replica = [p.clone() for p in initial]
    log.replay(replica)
    assert all(torch.equal(a, b) for a, b in zip(replica, params))


# -- 8: load_state_dict under an attached seed log ---------------------------------------------
def test_a_seed_log_refuses_to_record_after_the_optimiser_state_jumps():
    params, closure = params_and_closure()
    initial = [p.clone() for p in params]
    opt = sz.MeZO(params, lr=0.05, eps=1e-3, seed=4)
    log = sz.SeedLog.attach(opt)
    opt.step(closure)
    early = copy.deepcopy(opt.state_dict())    # state_dict() holds references, as in torch.optim
    opt.step(closure)
    opt.load_state_dict(early)                # a resume: step 1 again
    held = [p.clone() for p in params]
    with pytest.raises(ValueError, match="jumped"):
        opt.step(closure)
    assert all(torch.equal(a, b) for a, b in zip(params, held)) and log.num_steps == 2
    replica = [p.clone() for p in initial]       # what was recorded still replays exactly
    replayed = sz.MeZO(replica, lr=0.0, eps=1e-3, noise=None)
    log.replay_into(replayed)
    assert replayed.step_count == 2 and replayed.next_seed() == derive_seed(4, 2)
    log.detach()
    sz.SeedLog.attach(opt)                    # a new log for the resumed run records again
    opt.step(closure)


def test_a_state_load_that_changes_nothing_keeps_the_log_recording():
    params, closure = params_and_closure()
    opt = sz.MeZO(params, lr=0.05, eps=1e-3, seed=4)
    log = sz.SeedLog.attach(opt)
    opt.step(closure)
    opt.load_state_dict(opt.state_dict())
    opt.step(closure)
    assert log.num_steps == 2


# -- hypothesis: seed-log bytes --------------------------------------------------------------
@FAST
@given(data=st.data())
def test_fuzz_mutated_log_bytes_either_refuse_or_replay_all_or_nothing(data):
    tuned, initial, _, log = logged_run(steps=3)
    raw = bytearray(log.to_bytes())
    how = data.draw(st.sampled_from(["flip", "truncate", "append", "record", "header"]))
    if how == "flip":
        for _ in range(data.draw(st.integers(1, 4))):
            raw[data.draw(st.integers(0, len(raw) - 1))] ^= data.draw(st.integers(1, 255))
    elif how == "truncate":
        raw = raw[:data.draw(st.integers(0, len(raw) - 1))]
    elif how == "append":
        raw += bytes(data.draw(st.binary(min_size=1, max_size=40)))
    elif how == "record":
        value = data.draw(st.sampled_from([1e300, -1e300, 1e30, 3e38, 0.0, 2.0, float("nan"), float("inf")]))
        kind = data.draw(st.integers(0, 5))
        raw = bytearray(with_record(log, (kind, data.draw(st.integers(0, 2 ** 64 - 1)), value)))
    else:
        raw = bytearray(data.draw(st.sampled_from([b"[" * 5000 + b"\n", b"{}\n", b"null\n", b"\xff\n", b""])))
    try:
        parsed = sz.SeedLog.from_bytes(bytes(raw))
    except ValueError:
        return
    replica = [p.clone() for p in initial]
    try:
        parsed.replay(replica)
    except ValueError:
        assert all(torch.equal(a, b) for a, b in zip(replica, initial))
        return
    assert all(bool(torch.isfinite(p).all()) for p in replica)


@pytest.mark.parametrize("junk", [5, "log", None, [1, 2], 10 ** 12])
def test_from_bytes_refuses_what_is_not_bytes(junk):
    with pytest.raises(ValueError, match="expected bytes"):
        sz.SeedLog.from_bytes(junk)


# -- hypothesis: hooks -----------------------------------------------------------------------
@FAST
@given(raises=st.lists(st.tuples(st.integers(0, 2), st.integers(0, 5)), max_size=4),
       fail_at=st.one_of(st.none(), st.integers(0, 5)), seed=st.integers(0, 20))
def test_fuzz_raising_hooks_never_hide_a_step_from_the_seed_log(raises, fail_at, seed):
    params, closure = params_and_closure(seed)
    initial = [p.clone() for p in params]
    opt = sz.MeZO(params, lr=0.05, eps=1e-3, seed=seed)
    events = {k: 0 for k in range(3)}

    def hook_for(k):
        def hook(optimizer, event):
            events[k] += 1
            if (k, events[k]) in raises:
                raise RuntimeError(f"hook {k}")
        return hook

    opt.register_step_hook(hook_for(0))
    log = sz.SeedLog.attach(opt)
    opt.register_step_hook(hook_for(1))
    opt.register_step_hook(hook_for(2))
    for step in range(6):
        failing = step == fail_at
        calls = []

        def maybe_failing():
            calls.append(1)
            out = closure()
            return out * float("nan") if failing and len(calls) == 2 else out

        try:
            opt.step(maybe_failing)
        except (RuntimeError, FloatingPointError):
            pass
    assert events[0] == events[1] == events[2] == len(log.records) - 2   # every event, every hook
    assert log.num_steps == opt.step_count
    replica = [p.clone() for p in initial]
    log.replay(replica)
    assert all(torch.equal(a, b) for a, b in zip(replica, params))

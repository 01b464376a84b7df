"""A ZO run as a seed log: bit-exact replay without forward passes, and its size."""
import copy

import pytest
import torch

import sazo_lite as sz


def make_run(steps=40):
    torch.manual_seed(0)
    net = torch.nn.Sequential(torch.nn.Linear(6, 16), torch.nn.GELU(), torch.nn.Linear(16, 3))
    initial = copy.deepcopy(net)
    x, y = torch.randn(32, 6), torch.randint(0, 3, (32,))
    opt = sz.MeZO([{"params": net[0].parameters()}, {"params": net[2].parameters(), "lr": 5e-3}],
                  lr=1e-2, eps=1e-3, weight_decay=1e-3, seed=7)
    log = sz.SeedLog.attach(opt)
    sampler = sz.SAZOSampler(32, seed=1)
    for step in range(steps):
        if step == steps // 2:
            opt.param_groups[0]["lr"] = 2e-3  # a schedule change must be logged
        idx, w = sampler.sample(8)
        closure = lambda: torch.nn.functional.cross_entropy(net(x[idx]), y[idx], reduction="none")
        if step == 5:  # a failed step's rounding must replay too: fail at θ − εz
            calls = []
            failing = lambda: closure() * (float("nan") if calls.append(1) or len(calls) == 2 else 1.0)
            with pytest.raises(FloatingPointError):
                opt.step(failing, w)
        out = opt.step(closure, w)
        sampler.update(idx, out.directional_diffs)
    return net, initial, log


def test_replay_rebuilds_the_tuned_weights_bit_exactly(tmp_path):
    tuned, initial, log = make_run()
    assert not all(torch.equal(a, b) for a, b in zip(tuned.parameters(), initial.parameters()))
    size = log.save(tmp_path / "run.seedlog")
    replayed = copy.deepcopy(initial)
    calls = []
    replayed.register_forward_hook(lambda *a: calls.append(1))
    sz.SeedLog.load(tmp_path / "run.seedlog").replay(replayed.parameters())
    assert calls == []  # no forward pass
    for a, b in zip(tuned.parameters(), replayed.parameters()):
        assert torch.equal(a, b)
    assert log.num_steps == 40
    assert size < 2000  # 17 bytes a record plus a small header


def test_replay_without_the_failure_record_is_not_exact():
    tuned, initial, log = make_run()
    log.records = [r for r in log.records if r[0] != 1]
    replayed = copy.deepcopy(initial)
    log.replay(replayed.parameters())
    assert not all(torch.equal(a, b) for a, b in zip(tuned.parameters(), replayed.parameters()))


def test_thousands_of_steps_fit_in_kilobytes():
    theta = torch.zeros(1000)
    opt = sz.MeZO([theta], lr=1e-3)
    log = sz.SeedLog.attach(opt)
    for _ in range(2000):
        opt.step(lambda: (theta - 1).pow(2).sum().reshape(1))
    assert len(log.to_bytes()) < 40_000  # 2000 steps, ~17 bytes each
    copy_ = torch.zeros(1000)
    sz.SeedLog.from_bytes(log.to_bytes()).replay([copy_])
    assert torch.equal(copy_, theta)


def test_replay_rejects_mismatched_parameters():
    _, initial, log = make_run(steps=2)
    with pytest.raises(ValueError, match="params"):
        log.replay([torch.zeros(3)])

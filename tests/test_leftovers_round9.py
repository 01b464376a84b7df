"""Leftovers of the last red-team round (library round 9, ZOTrainer round 11).

One test per defect; each fails on the code before its fix.
"""
from __future__ import annotations

import pytest
import torch

import sazo_lite as sz
from sazo_lite.seedlog import SeedLog


# -- replays check the param groups as a step does -----------------------------------------------
def _replayer():
    """A MeZO over two float64 tensors that took one step (its groups were checked then)."""
    theta, other = torch.linspace(-1, 1, 4, dtype=torch.float64), torch.ones(3, dtype=torch.float64)
    opt = sz.MeZO([theta, other], lr=0.1, eps=1e-3, noise=None)
    opt.step(lambda: (theta ** 2).sum() + other.sum())
    return opt, theta, other


def _edits():
    """Edits of the param groups between steps that ``step`` refuses (name → edit(opt, theta, other))."""
    def swap_in(tensor):
        return lambda opt, theta, other: opt.param_groups[0]["params"].__setitem__(1, tensor(theta))
    return {
        "an integer tensor": swap_in(lambda theta: torch.zeros(3, dtype=torch.int64)),
        "a float8 tensor": swap_in(lambda theta: torch.zeros(3).to(torch.float8_e4m3fn)),
        "a view of theta": swap_in(lambda theta: theta[1:4]),
        "theta twice": swap_in(lambda theta: theta),
        "eps = 0": lambda opt, theta, other: opt.param_groups[0].update(eps=0.0),
        "eps = nan": lambda opt, theta, other: opt.param_groups[0].update(eps=float("nan")),
        "lr < 0": lambda opt, theta, other: opt.param_groups[0].update(lr=-0.1),
        "weight_decay = inf": lambda opt, theta, other: opt.param_groups[0].update(weight_decay=float("inf")),
        "an unknown perturbation": lambda opt, theta, other: opt.param_groups[0].update(perturbation="uniform"),
        "a group without eps": lambda opt, theta, other: opt.param_groups.append(
            {"params": [torch.zeros(2, dtype=torch.float64)], "lr": 0.1, "weight_decay": 0.0,
             "perturbation": "gaussian"}),
        "a group of another eps": lambda opt, theta, other: opt.param_groups.append(
            {"params": [torch.zeros(2, dtype=torch.float64)], "lr": 0.1, "weight_decay": 0.0,
             "perturbation": "gaussian", "eps": 0.5}),
    }


EDITS = _edits()
REPLAYS = {"replay_step": lambda opt: opt.replay_step(opt.next_seed(), 0.5),
           "replay_failure 1": lambda opt: opt.replay_failure(opt.next_seed(), 1),
           "replay_failure 2": lambda opt: opt.replay_failure(opt.next_seed(), 2)}


@pytest.mark.parametrize("replay", REPLAYS)
@pytest.mark.parametrize("edit", EDITS)
def test_a_replay_checks_groups_edited_since_the_last_step_as_step_does(edit, replay):
    # replay_step and replay_failure checked only their own arguments: a group edited since the last
    # step (a tensor swapped, eps or lr made invalid) was moved as it stood, or raised part-way
    opt, theta, other = _replayer()
    EDITS[edit](opt, theta, other)
    with pytest.raises(ValueError, match="Invalid") as stepped:
        opt.step(lambda: theta.sum(dim=0, keepdim=True))
    tensors = [p.detach().clone() for g in opt.param_groups for p in g["params"]]
    with pytest.raises(ValueError, match="Invalid") as replayed:
        REPLAYS[replay](opt)
    assert str(replayed.value).split(":")[0] == str(stepped.value).split(":")[0]   # the step's own refusal
    assert all(torch.equal(p, t) for p, t in zip((p for g in opt.param_groups for p in g["params"]), tensors))


@pytest.mark.parametrize("edit", ["an integer tensor", "a view of theta", "eps = nan", "lr < 0",
                                  "an unknown perturbation"])
def test_a_seed_log_replays_only_through_groups_a_step_accepts(edit):
    opt, theta, other = _replayer()
    start = [theta.detach().clone(), other.detach().clone()]
    log = SeedLog.attach(opt)
    opt.step(lambda: (theta ** 2).sum() + other.sum())
    target = sz.MeZO([start[0].clone(), start[1].clone()], lr=0.1, eps=1e-3, noise=None)
    EDITS[edit](target, *target.param_groups[0]["params"])
    before = [p.detach().clone() for g in target.param_groups for p in g["params"]]
    with pytest.raises(ValueError, match="Invalid"):
        log.replay_into(target)
    assert all(torch.equal(p, t) for p, t in zip((p for g in target.param_groups for p in g["params"]), before))

"""A folded MeZO that has been stepping (its update pending) and then resumes from a checkpoint: weights loaded
first, then the optimiser's state. The pending update belonged to the abandoned run: applied on top of the loaded
weights, it moved them off the checkpoint (0.0097 after two folded steps), silently. Loaded in the other order, or
with no weights loaded at all, the update is applied as before."""
import copy

import pytest
import torch

from sazo_lite import MeZO


def _loss(theta):
    target = torch.linspace(-1.0, 1.0, theta.numel(), dtype=theta.dtype)
    return lambda: (theta - target).pow(2).sum()


def _checkpoint():
    theta = torch.ones(4, dtype=torch.float64)
    optimizer = MeZO([theta], lr=0.01, eps=1e-3, seed=1, fold_updates=True, noise=None)
    for _ in range(3):
        optimizer.step(_loss(theta))
    state = optimizer.state_dict()   # flushes: theta is the checkpoint's
    return theta.clone(), copy.deepcopy(state)


def _stepping():
    theta = torch.full((4,), 0.5, dtype=torch.float64)
    optimizer = MeZO([theta], lr=0.01, eps=1e-3, seed=7, fold_updates=True, noise=None)
    for _ in range(2):
        optimizer.step(_loss(theta))
    assert optimizer.pending
    return theta, optimizer


@pytest.mark.parametrize("write", ["copy_", "module"])
def test_weights_loaded_before_the_state_stand(write):
    saved, state = _checkpoint()
    theta, optimizer = _stepping()
    if write == "copy_":
        with torch.no_grad():
            theta.copy_(saved)
    else:
        holder = torch.nn.Module()
        holder.theta = torch.nn.Parameter(theta, requires_grad=False)
        holder.load_state_dict({"theta": saved})
    optimizer.load_state_dict(state)
    assert torch.equal(theta, saved) and not optimizer.pending
    # and the resumed run goes on as the uninterrupted one
    reference = saved.clone()
    uninterrupted = MeZO([reference], lr=0.01, eps=1e-3, seed=1, fold_updates=True, noise=None)
    uninterrupted.load_state_dict(copy.deepcopy(state))
    for _ in range(2):
        optimizer.step(_loss(theta))
        uninterrupted.step(_loss(reference))
    optimizer.flush(), uninterrupted.flush()
    assert torch.equal(theta, reference)


def test_with_no_weights_written_the_pending_update_is_applied_as_an_unfolded_run_applies_it():
    saved, state = _checkpoint()
    theta, optimizer = _stepping()
    plain_theta = torch.full((4,), 0.5, dtype=torch.float64)
    plain = MeZO([plain_theta], lr=0.01, eps=1e-3, seed=7, fold_updates=False, noise=None)
    for _ in range(2):
        plain.step(_loss(plain_theta))
    optimizer.load_state_dict(copy.deepcopy(state))
    assert not optimizer.pending and torch.equal(theta, plain_theta)


def test_a_copy_of_a_stepping_optimiser_applies_its_pending_update_at_load():
    """A deepcopy's tensors are new (their version counters unknown to the copy): the update is applied."""
    saved, state = _checkpoint()
    theta, optimizer = _stepping()
    twin = copy.deepcopy(optimizer)
    twin_theta = twin.param_groups[0]["params"][0]
    optimizer.flush()
    twin.load_state_dict(copy.deepcopy(state))
    assert torch.equal(twin_theta, theta)

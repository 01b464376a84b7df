"""Round 8 red team of the public API (engine, samplers, train, seed log, distributed helpers): each
test failed on the code before its fix. A History that lost committed steps, a run on parameters that
do not reach the loss, ..."""
import signal
import warnings

import pytest
import torch

from sazo_lite import MeZO
from sazo_lite.noise import PlainNoise
from sazo_lite.samplers import SAZOSampler, UniformSampler
from sazo_lite.train import FlatLossWarning, History, train


def _problem(n=8, d=5, seed=0, dtype=torch.float64):
    """Per-example least squares: losses(indices) [B] at the current θ."""
    g = torch.Generator().manual_seed(seed)
    a, b = torch.randn(n, d, generator=g, dtype=dtype), torch.randn(n, generator=g, dtype=dtype)
    theta = torch.zeros(d, dtype=dtype)
    return theta, lambda idx: (a[idx] @ theta - b[idx]) ** 2


# --- defect 1: a committed step missing from the History ------------------------------------------
class _RefusingSampler(UniformSampler):
    """Refuses its feedback at the ``fail_at``-th update (a sampler given diffs it cannot take)."""

    def __init__(self, n, fail_at):
        super().__init__(n, seed=0)
        self.calls, self.fail_at = 0, fail_at

    def update(self, indices, diffs):
        self.calls += 1
        if self.calls == self.fail_at:
            raise ValueError("Invalid diffs: refused")
        return super().update(indices, diffs)


def test_a_sampler_that_refuses_feedback_leaves_the_committed_step_in_the_history():
    """The step was appended after sampler.update: θ had moved, the update raised, and the step was
    missing from the record (nor was the History reachable once train raised)."""
    theta, losses = _problem()
    opt = MeZO([theta], lr=0.01, noise=None)
    history = History()
    with pytest.raises(ValueError, match="refused"):
        train(opt, _RefusingSampler(8, fail_at=3), losses, 10, batch_size=2, progress=False, history=history)
    assert opt.step_count == 3
    assert history.queries == [4, 8, 12] and len(history.loss) == len(history.lr) == 3


class _Raises:
    def __init__(self, error, at):
        self.error, self.at, self.seen = error, at, 0

    def __call__(self, optimizer, event):
        self.seen += 1
        if self.seen == self.at:
            raise self.error


@pytest.mark.parametrize("error", [RuntimeError("hook failed"), KeyboardInterrupt()])
def test_a_step_hook_that_raises_after_the_commit_leaves_the_step_in_the_history(error):
    """A hook error is raised from step() with the step committed (documented): train lost it."""
    theta, losses = _problem()
    opt = MeZO([theta], lr=0.01, noise=None)
    opt.register_step_hook(_Raises(error, at=2))
    history = History()
    with pytest.raises(type(error)):
        train(opt, UniformSampler(8, seed=0), losses, 10, batch_size=2, progress=False, history=history)
    assert opt.step_count == 2 and len(history.loss) == 2
    assert history.projected_grad[-1] == opt.last_step.projected_grad and history.queries == [4, 8]


class _InterruptedUpdate(PlainNoise):
    """Sends SIGINT while the n-th pass (an update pass: passes 3, 6, ...) is applied."""

    def __init__(self, at):
        super().__init__()
        self.passes, self.at = 0, at

    def apply(self, jobs, done=None):
        self.passes += 1
        if self.passes == self.at:
            signal.raise_signal(signal.SIGINT)
        return super().apply(jobs, done)


def test_ctrl_c_during_the_update_pass_keeps_the_committed_step_in_the_history():
    """The pass completes and the step commits, then KeyboardInterrupt leaves step(): the step's
    ZOStep was never returned, so the History lacked a step θ had taken."""
    theta, losses = _problem()
    opt = MeZO([theta], lr=0.01, noise=_InterruptedUpdate(at=6))
    history = History()
    with pytest.raises(KeyboardInterrupt):
        train(opt, UniformSampler(8, seed=0), losses, 10, batch_size=2, progress=False, history=history)
    assert opt.step_count == 2 and history.queries == [4, 8]
    assert opt.last_step is not None and history.loss[-1] == opt.last_step.loss


@pytest.mark.parametrize("bad", [History(queries=[4]), History(diverged=True), [], "history"])
def test_train_refuses_a_history_that_is_not_empty(bad):
    theta, losses = _problem()
    with pytest.raises(ValueError, match="Invalid history"):
        train(MeZO([theta], lr=0.01), UniformSampler(8), losses, 2, progress=False, history=bad)


# --- defect 2: parameters that do not reach the loss -----------------------------------------------
def _run(losses, params, steps=8, batch_size=2, **kw):
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        train(MeZO(params, lr=0.01, eps=1e-3, noise=None), SAZOSampler(8, seed=0), losses, steps,
              batch_size=batch_size, progress=False, **kw)
    return [w for w in caught if issubclass(w.category, FlatLossWarning)]


@pytest.mark.parametrize("batch_size", [1, 4])
def test_a_run_whose_parameters_do_not_reach_the_loss_warns(batch_size):
    """An adapter merged or disabled, the wrong tensors given to the optimiser: every difference is
    exactly 0 and the run silently did nothing."""
    theta, losses = _problem()
    adapter = torch.zeros(3)   # tuned, but the loss never reads it
    flat = _run(losses, [adapter], steps=20, batch_size=batch_size)
    assert len(flat) == 1 and "moves nothing" in str(flat[0].message)
    assert adapter.abs().max() < 1e-8   # g = 0: only the rounding of the ±εz shifts


@pytest.mark.parametrize("dtype, offset", [(torch.float32, 0.0), (torch.float64, 0.0), (torch.float64, 1.0)])
def test_a_loss_that_changes_very_little_does_not_warn(dtype, offset):
    """No false alarm: losses of 1e-9 (float32 or 64), or 1 + 1e-9·(...) in float64 (a relative change
    of 1e-12 a step): tiny differences, but not 0, and the run does move."""
    g = torch.Generator().manual_seed(1)
    a = torch.randn(8, 5, generator=g, dtype=dtype)
    theta = torch.zeros(5, dtype=dtype)
    losses = lambda idx: offset + 1e-9 * (a[idx] @ theta - 1.0) ** 2
    assert _run(losses, [theta], steps=20) == []
    assert bool(theta.abs().max() > 0)


def test_a_dataset_with_some_constant_examples_does_not_warn():
    """Examples the parameters cannot change (a fully masked row: loss 0) beside ones they can: the
    first steps may draw only constant examples, the check needs more than a step or two."""
    theta, losses = _problem()
    constant = torch.tensor([True, False] * 4)
    masked = lambda idx: torch.where(constant[idx], torch.zeros(len(idx), dtype=theta.dtype), losses(idx))
    for seed in range(20):
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            train(MeZO([theta], lr=0.001, noise=None, seed=seed), UniformSampler(8, seed=seed), masked, 20,
                  progress=False)
        assert not [w for w in caught if issubclass(w.category, FlatLossWarning)], seed

"""Round 7 red team of the public API (engine, samplers, train): each test failed on the code before
its fix. Folded updates with param groups edited between steps, parameter sets, numpy-scalar
hyperparameters, boolean weights, Python-float feedback, foreign sampler states, divergence limits."""
import math

import numpy as np
import pytest
import torch

from sazo_lite import MeZO
from sazo_lite.samplers import (OracleSampler, PlainSAZOSampler, SAZOSampler, StaleCorrectedSAZOSampler,
                                UniformSampler)
from sazo_lite.train import train


def _losses(*tensors):
    """Per-example losses [k], one per tensor: a quadratic that couples nothing."""
    return lambda: torch.stack([((t.double() - 0.3 * (k + 1)) ** 2).sum() for k, t in enumerate(tensors)])


# --- a folded update and param groups edited between steps -----------------------------------------
def _run_with_an_edit(fold: bool, edit: str):
    g = torch.Generator().manual_seed(0)
    a, b, c = (torch.randn(n, generator=g) for n in (5, 5, 3))
    opt = MeZO([c, a], lr=0.1, eps=1e-3, noise=None, fold_updates=fold)
    loss = _losses(a, b, c)
    opt.step(loss)
    params = opt.param_groups[0]["params"]
    if edit == "append":
        params.append(b)
    elif edit == "replace":
        params[1] = b
    elif edit == "new group":
        opt.param_groups.append({**{k: v for k, v in opt.param_groups[0].items() if k != "params"}, "params": [b]})
    opt.step(loss)
    opt.step(loss)
    opt.flush()
    return a, b, c


@pytest.mark.parametrize("edit", ["append", "replace", "new group"])
def test_a_folded_run_equals_the_unfolded_run_when_param_groups_are_edited_between_steps(edit):
    """The module docstring: folding gives the same θ bit for bit; edits to ``param_groups`` are
    supported (checked as add_param_group checks them). The pending update was fused, position by
    position, with the next shift of the *edited* list: a tensor got another's shift, or none."""
    unfolded, folded = _run_with_an_edit(False, edit), _run_with_an_edit(True, edit)
    for x, y in zip(unfolded, folded):
        assert torch.equal(x, y), (x - y).abs().max()


# --- parameters given as a set ---------------------------------------------------------------------
@pytest.mark.parametrize("wrap", [lambda ts: set(ts), lambda ts: [{"params": set(ts)}], lambda ts: frozenset(ts)])
def test_parameters_in_a_set_are_refused(wrap):
    """A set has no order: tensor k's z comes from derive_seed(seed, k), so a set made the run depend
    on id hashes (torch.optim refuses sets too)."""
    tensors = [torch.zeros(2), torch.zeros(3)]
    with pytest.raises(ValueError, match="Invalid params"):
        MeZO(wrap(tensors), lr=0.1)
    opt = MeZO([torch.zeros(1)], lr=0.1)
    with pytest.raises(ValueError, match="Invalid params"):
        opt.add_param_group({"params": set(tensors)})
    assert len(opt.param_groups) == 1


# --- numpy scalars as group hyperparameters ---------------------------------------------------------
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
@pytest.mark.parametrize("key, value", [("lr", np.float32(0.1)), ("lr", np.float16(0.1)),
                                        ("weight_decay", np.float32(0.3)), ("eps", np.float32(1e-3))])
def test_numpy_scalar_hyperparameters_step_like_the_same_python_floats(dtype, key, value):
    """check_number accepts numpy scalars, and the constructor turns them into floats; set in a
    group between steps (a schedule computed with numpy) they were used as they are, so the update
    coefficients were computed in float32/float16 (NumPy 2 keeps the scalar's type) and θ differed."""
    def run(v):
        t = torch.linspace(-1, 1, 40, dtype=dtype)
        opt = MeZO([t], lr=0.05, eps=1e-3, weight_decay=0.01, noise=None)
        opt.param_groups[0][key] = v
        for _ in range(4):
            opt.step(lambda: ((t.double() - 0.3) ** 2).reshape(-1))
        return t

    assert torch.equal(run(float(value)), run(value))


def test_a_loaded_numpy_scalar_lr_steps_like_the_same_python_float():
    def run(v):
        t = torch.linspace(-1, 1, 40)
        opt = MeZO([t], lr=0.5, eps=1e-3, noise=None)
        state = opt.state_dict()
        state["param_groups"][0]["lr"] = v
        opt.load_state_dict(state)
        for _ in range(3):
            opt.step(lambda: ((t.double() - 0.3) ** 2).reshape(-1))
        return t

    assert torch.equal(run(float(np.float32(0.1))), run(np.float32(0.1)))


# --- boolean weights ----------------------------------------------------------------------------------
@pytest.mark.parametrize("weights", [[True, False], np.array([True, False]), [np.bool_(True), np.bool_(True)],
                                     torch.tensor([True, False]), [1 + 0j, 1.0]])
def test_boolean_or_complex_weights_are_refused_and_theta_unchanged(weights):
    """A bool tensor was refused but a list or numpy array of bools was read as 1.0 / 0.0 (the
    closure's results refuse both)."""
    t = torch.randn(3)
    before = t.clone()
    opt = MeZO([t], lr=0.1, noise=None)
    with pytest.raises(ValueError, match="Invalid weights"):
        opt.step(_losses(t, t), weights)
    assert torch.equal(t, before) and opt.step_count == 0


# --- Python floats as sampler feedback ----------------------------------------------------------------
SCORED = [SAZOSampler, PlainSAZOSampler, StaleCorrectedSAZOSampler,
          lambda n: SAZOSampler(n, statistic="square")]


@pytest.mark.parametrize("make", SCORED)
def test_feedback_as_python_floats_equals_float64_tensors(make):
    """torch.as_tensor reads a list of Python floats as float32: the diffs were rounded (another
    level, other estimates than the same diffs as a float64 tensor)."""
    diffs = [0.1, 1e-3, 7.3, 0.3]
    as_list, as_tensor = make(6), make(6)
    as_list.update([0, 1, 2, 2], diffs)
    as_tensor.update(torch.tensor([0, 1, 2, 2]), torch.tensor(diffs, dtype=torch.float64))
    assert torch.equal(as_list.probs, as_tensor.probs)
    assert torch.equal(as_list.estimates, as_tensor.estimates)
    assert getattr(as_list, "level", None) == getattr(as_tensor, "level", None)


def test_huge_finite_feedback_as_python_floats_is_accepted_as_documented():
    """SAZOSampler's docstring: |d| up to ~1e300 keeps the level finite. As a list, 1e300 became
    float32 inf and was refused as "not finite"."""
    s = SAZOSampler(4)
    s.update([0, 1], [1e300, -2e299])
    assert math.isfinite(s.level) and s.level > 1e298
    assert abs(float(s.probs.sum()) - 1.0) < 1e-12


def test_oracle_norms_as_python_floats_keep_float64():
    norms = [1e-3, 1.0 + 1e-9, 2.0, 3e300]
    listed = OracleSampler(4, lambda: norms).probs
    tensor = OracleSampler(4, lambda: torch.tensor(norms, dtype=torch.float64)).probs
    assert torch.equal(listed, tensor)


@pytest.mark.parametrize("diffs", [[True, False], [1 + 0j, 2.0], np.array([True, True])])
def test_boolean_or_complex_feedback_lists_are_still_refused(diffs):
    s = SAZOSampler(4)
    before = s.state_dict()
    with pytest.raises(ValueError, match="Invalid directional_diffs"):
        s.update([0, 1], diffs)
    assert torch.equal(s.estimates, before["estimates"]) and s.level == before["extra"]["level"]


# --- a state of another sampler ------------------------------------------------------------------------
@pytest.mark.parametrize("source", [lambda: SAZOSampler(6, seed=1), lambda: PlainSAZOSampler(6, seed=1),
                                    lambda: StaleCorrectedSAZOSampler(6, seed=1)])
@pytest.mark.parametrize("target", [lambda: UniformSampler(6, seed=2),
                                    lambda: OracleSampler(6, lambda: torch.ones(6), seed=2)])
def test_a_scored_samplers_state_is_refused_by_a_sampler_that_would_drop_it(source, target):
    """A SAZO checkpoint loaded into a uniform (or oracle) sampler was accepted: its estimates,
    counts and level silently dropped, its generator taken."""
    src = source()
    idx, _ = src.sample(4)
    src.update(idx, torch.randn(4, dtype=torch.float64))
    dst = target()
    before = dst.state_dict()
    with pytest.raises(ValueError, match="Invalid state"):
        dst.load_state_dict(src.state_dict())
    assert torch.equal(dst.state_dict()["generator"], before["generator"]) and dst.seed == 2


@pytest.mark.parametrize("make", [lambda: UniformSampler(5), lambda: SAZOSampler(5), lambda: PlainSAZOSampler(5)])
def test_a_state_with_unknown_fields_is_refused(make):
    s = make()
    state = s.state_dict()
    state["scores_v2"] = torch.zeros(5)
    with pytest.raises(ValueError, match="scores_v2"):
        s.load_state_dict(state)
    del state["scores_v2"]
    make().load_state_dict(state)   # the genuine state still loads


# --- train's divergence limit ----------------------------------------------------------------------------
@pytest.mark.parametrize("limit", ["1e9", True, b"2", None.__class__, float("nan"), 1 + 0j, np.array([1.0, 2.0])])
def test_train_refuses_a_divergence_limit_that_is_not_a_number(limit):
    """``diverge_above`` went through float(): "1e9" was parsed and True became 1.0 (a run stopped
    as diverged at its first metric above 1)."""
    theta = torch.zeros(2)
    opt, sampler = MeZO([theta], lr=0.1), UniformSampler(4)
    with pytest.raises(ValueError, match="Invalid diverge_above"):
        train(opt, sampler, lambda idx: (theta.double() - idx.double()[:, None]).pow(2).sum(1), 2, progress=False,
              evaluate=lambda: 0.0, diverge_above=limit)
    assert opt.step_count == 0


def test_train_still_takes_an_infinite_or_numpy_divergence_limit():
    theta = torch.zeros(2)
    for limit in (math.inf, np.float64(1e9), 10):
        opt = MeZO([theta], lr=0.01)
        history = train(opt, UniformSampler(4), lambda idx: (theta.double() - 1).pow(2).sum().repeat(len(idx)), 3,
                        progress=False, evaluate=lambda: 5.0, diverge_above=limit)
        assert not history.diverged and len(history.loss) == 3


# --- a state_dict whose param group holds no list of ids -------------------------------------------------
@pytest.mark.parametrize("params", [5, None, 2.0, object()])
def test_a_state_dict_group_without_a_list_of_params_raises_value_error(params):
    """len() of the saved group's "params" raised TypeError, not the ValueError every other bad
    state_dict raises."""
    t = torch.zeros(3)
    opt = MeZO([t], lr=0.1)
    state = opt.state_dict()
    state["param_groups"][0]["params"] = params
    with pytest.raises(ValueError, match="Invalid state_dict"):
        opt.load_state_dict(state)
    assert opt.step_count == 0


# --- train interrupted between steps of a folded MeZO -----------------------------------------------------
class _InterruptedSampler(SAZOSampler):
    """Ctrl-C in the sampler's update after the optimiser committed ``after`` steps."""

    def __init__(self, n, after):
        super().__init__(n)
        self.after = after

    def update(self, indices, diffs):
        if self.level_steps == self.after:
            raise KeyboardInterrupt
        super().update(indices, diffs)


@pytest.mark.parametrize("after", [0, 2])
def test_train_leaves_a_folded_optimisers_parameters_current_when_it_raises(after):
    """``train`` flushed a folded update only when it returned: a Ctrl-C (or an error) between the
    optimiser's step and the next left the model at θ − εz of the last step, not at θ."""
    theta = torch.zeros(3)
    opt = MeZO([theta], lr=0.1, fold_updates=True, noise=None)
    with pytest.raises(KeyboardInterrupt):
        train(opt, _InterruptedSampler(4, after), lambda idx: (theta.double() - idx.double()[:, None]).pow(2).sum(1),
              10, batch_size=2, progress=False)
    seen = theta.clone()
    assert not opt.pending and opt.step_count == after + 1
    opt.flush()
    assert torch.equal(seen, theta)


@pytest.mark.parametrize("make", [lambda: SAZOSampler(5, seed=0), lambda: UniformSampler(5, seed=0)])
def test_empty_python_lists_of_feedback_change_nothing_like_empty_tensors(make):
    by_list, by_tensor = make(), make()
    by_list.update([], [])                                          # torch reads [] as float32
    by_tensor.update(torch.zeros(0, dtype=torch.long), torch.zeros(0))
    assert torch.equal(by_list.probs, by_tensor.probs) and torch.equal(by_list.probs, make().probs)
    with pytest.raises(ValueError, match="Invalid indices"):
        by_list.update([1.5], [0.1])                                # a float index is still refused

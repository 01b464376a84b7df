"""Leftovers of the last red-team round (library round 9, ZOTrainer round 11).

One test per defect; each fails on the code before its fix.
"""
from __future__ import annotations

import re

import numpy as np
import pytest
import torch

import sazo_lite as sz
from sazo_lite.noise import PlainNoise
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


def test_a_seed_log_attached_after_numpy_hyperparameters_were_set_saves_and_replays():
    # attach read eps as the group held it (numpy float32): the log could not be saved (TypeError from
    # json) and its header was refused on replay
    theta = torch.zeros(3, dtype=torch.float64)
    opt = sz.MeZO([theta], lr=0.1, eps=1e-3, noise=None)
    opt.param_groups[0].update(eps=np.float32(1e-3), lr=np.float32(0.1))
    log = SeedLog.attach(opt)
    opt.step(lambda: (theta - 1) ** 2)
    copy = torch.zeros(3, dtype=torch.float64)
    SeedLog.from_bytes(log.to_bytes()).replay([copy])
    assert torch.equal(copy, theta) and theta.any()


@pytest.mark.parametrize("edit", ["eps = 0", "an integer tensor", "a view of theta"])
def test_a_seed_log_is_not_attached_to_groups_a_step_refuses(edit):
    opt, theta, other = _replayer()
    EDITS[edit](opt, theta, other)
    with pytest.raises(ValueError, match="Invalid"):
        SeedLog.attach(opt)
    assert not opt._step_hooks


def _halving_hook(optimizer, event):
    """Takes half of each committed step back through replay_step (as llm.queries.StepCap does its excess)."""
    if event.kind == "step":
        optimizer.replay_step(event.seed, -event.value / 2)


@pytest.mark.parametrize("log_first", [True, False])
def test_a_seed_log_refuses_a_replay_through_the_optimiser_it_records(log_first):
    # the replay moved θ without a record: the log's replay rebuilt another θ, silently (0.72 off with
    # StepCap); now the replay is refused before it moves anything, and the log matches θ
    theta = torch.zeros(4, dtype=torch.float64)
    opt = sz.MeZO([theta], lr=0.05, noise=None)
    log = SeedLog.attach(opt) if log_first else None
    opt.register_step_hook(_halving_hook)
    log = log or SeedLog.attach(opt)
    with pytest.raises(ValueError, match="Invalid call: replay_step/replay_failure on an optimiser a SeedLog"):
        opt.step(lambda: (theta - torch.arange(4.0)) ** 2)
    assert opt.step_count == 1 and theta.any()   # the step committed, the replay moved nothing
    copy = torch.zeros(4, dtype=torch.float64)
    log.replay([copy])
    assert torch.equal(copy, theta)
    with pytest.raises(ValueError, match="Invalid call"):
        opt.replay_failure(opt.next_seed(), 2)
    assert torch.equal(copy, theta)


class _FailingNoise(PlainNoise):
    """The plain loop, raising at its ``fail_at``-th pass (KeyboardInterrupt: a Ctrl-C between passes)."""

    def __init__(self, fail_at: int, error=RuntimeError):
        super().__init__()
        self.calls, self.fail_at, self.error = 0, fail_at, error

    def apply(self, jobs, done=None):
        self.calls += 1
        if self.calls == self.fail_at:
            raise self.error("the noise source failed")
        return super().apply(jobs, done)


@pytest.mark.parametrize("error", [RuntimeError, KeyboardInterrupt])
@pytest.mark.parametrize("replay, fail_at", [(replay, fail_at) for replay in REPLAYS for fail_at in (2, 3)
                                             if fail_at == 2 or replay != "replay_failure 1"])   # it makes 2 passes
def test_a_replay_failing_after_its_first_pass_puts_theta_back(replay, fail_at, error):
    # a replay's passes were not undone: a failure or Ctrl-C after the first left θ shifted by εz
    theta = torch.linspace(-1, 1, 5, dtype=torch.float64)
    source = _FailingNoise(fail_at, error)
    opt = sz.MeZO([theta], lr=0.1, eps=1e-3, noise=source)
    start = theta.clone()
    with pytest.raises(error):
        REPLAYS[replay](opt)
    assert source.calls > fail_at   # the undo ran
    assert torch.allclose(theta, start, rtol=0, atol=1e-15)
    REPLAYS[replay](opt)   # usable again


@pytest.mark.parametrize("seed", [-1, 2 ** 63, 2 ** 70, 1.5, True, "7"])
@pytest.mark.parametrize("call", ["replay_step", "replay_failure"])
def test_a_replay_refuses_a_seed_no_step_has(call, seed):
    # seeds are derive_seed's, in [0, 2**63): 1.5 replayed seed 1's z, 2**70 and -1 another seed's
    theta = torch.zeros(3, dtype=torch.float64)
    opt = sz.MeZO([theta], lr=0.1, noise=None)
    with pytest.raises(ValueError, match="Invalid seed"):
        opt.replay_step(seed, 0.5) if call == "replay_step" else opt.replay_failure(seed, 2)
    assert not theta.any()


# -- ZOTrainer ------------------------------------------------------------------------------------
transformers = pytest.importorskip("transformers")

from test_hf import _OnFirstUse, trainer_for, training_args, weights  # noqa: E402

hf = _OnFirstUse("sazo_lite.hf")


def _pending_size(trainer) -> int:
    import pickle

    return len(pickle.dumps(trainer._zo_pending))


def test_what_waits_for_the_next_log_stays_the_same_size_with_logging_off(tmp_path):
    # with logging_strategy="no" no log cleared the per-step values: a tuple a step (14 MB in 100k steps)
    sizes = []
    for steps in (2, 6):
        trainer = trainer_for(tmp_path, args=training_args(tmp_path, max_steps=steps, logging_strategy="no"))
        trainer.train()
        sizes.append(_pending_size(trainer))
    assert sizes[0] == sizes[1]


class Recorder(transformers.TrainerCallback):
    """The logs, and the trainable weights each optimizer-step callback sees."""

    def __init__(self):
        self.logs, self.before, self.after = [], [], []

    def on_log(self, args, state, control, logs=None, **kwargs):
        self.logs.append(dict(logs))

    def on_pre_optimizer_step(self, args, state, control, model=None, **kwargs):
        self.before.append(weights(model))

    def on_optimizer_step(self, args, state, control, model=None, **kwargs):
        self.after.append(weights(model))


@pytest.mark.parametrize("method", ["mezo", "sazo"])
def test_the_logged_step_values_are_the_means_and_max_of_each_steps_values(tmp_path, method):
    steps, seen = [], []
    recorder = Recorder()
    trainer = trainer_for(tmp_path, args=training_args(tmp_path, max_steps=6, logging_steps=2), method=method,
                          callbacks=[recorder])
    sample = trainer.zo_sampler.sample

    def recorded(batch):
        indices, w = sample(batch)
        seen.append(w.double())
        return indices, w
    trainer.zo_sampler.sample = recorded

    class Grads(transformers.TrainerCallback):
        def on_step_end(self, args, state, control, **kwargs):
            steps.append(abs(trainer.zo_optimizer.last_step.projected_grad))
    trainer.add_callback(Grads())
    trainer.train()
    logs = [log for log in recorder.logs if "zo_projected_grad" in log]
    assert len(logs) == 3   # steps 2, 4 and 6
    for log, (start, stop) in zip(logs, [(0, 2), (2, 4), (4, 6)]):
        assert log["zo_projected_grad"] == sum(steps[start:stop]) / (stop - start)
        if method == "sazo":
            ess = [float(w.sum() ** 2 / (w ** 2).sum()) / len(w) for w in seen[start:stop]]
            assert log["sazo_max_weight"] == max(float(w.max()) for w in seen[start:stop])
            assert log["sazo_ess"] == sum(ess) / len(ess)


def test_pre_optimizer_step_callbacks_see_the_weights_before_the_update_and_once_a_step(tmp_path):
    # the update is made in training_step: on_pre_optimizer_step saw the updated weights
    recorder = Recorder()
    trainer = trainer_for(tmp_path, callbacks=[recorder])
    start = weights(trainer.model)
    trainer.train()
    assert len(recorder.before) == len(recorder.after) == trainer.state.global_step == 4
    for before, expected in zip(recorder.before, [start] + recorder.after[:-1]):
        assert _same(before, expected)
    for before, after in zip(recorder.before, recorder.after):
        assert not _same(before, after)


def _same(a: dict, b: dict) -> bool:
    return a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)


def test_resuming_from_a_path_that_does_not_exist_says_so(tmp_path):
    # a mistyped checkpoint path was reported as written with save_only_model=True or not by ZOTrainer
    trainer = trainer_for(tmp_path)
    start = weights(trainer.model)
    missing = tmp_path / "out" / "checkpoint-7"
    with pytest.raises(ValueError, match=re.escape(f"Invalid checkpoint: {missing} is not a directory")):
        trainer.train(resume_from_checkpoint=str(missing))
    assert _same(weights(trainer.model), start)

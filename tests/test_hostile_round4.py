"""The library under a fourth hostile round (issue 43).

One regression test per defect, named for it (each failed on the code before the fix), with its
siblings, then hypothesis suites: tampered sampler states (every field), the genuine states of
extreme runs, and the statistics helpers on every input they can receive.
"""
import copy
import json
import math
import os
import resource
import signal
import warnings

import numpy as np
import pytest
import torch
from hypothesis import HealthCheck, given, settings, strategies as st

import sazo_lite as sz
from sazo_lite import MeZO, OracleSampler, PlainSAZOSampler, SAZOSampler, UniformSampler
from sazo_lite.noise import PlainNoise
from sazo_lite.precision import Float32Master

FAST = settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])


def _same_state(a, b) -> bool:
    if isinstance(a, dict):
        return isinstance(b, dict) and a.keys() == b.keys() and all(_same_state(a[k], b[k]) for k in a)
    if isinstance(a, torch.Tensor):
        return isinstance(b, torch.Tensor) and torch.equal(a, b)
    return a == b


def _warm(sampler, steps=5, batch=8, seed=0, scale=1.0):
    gen = torch.Generator().manual_seed(seed)
    for _ in range(steps):
        idx, _ = sampler.sample(batch)
        sampler.update(idx, scale * torch.randn(batch, generator=gen, dtype=torch.float64))
    return sampler


def _steps_and_saves(sampler, make, steps=3):
    """The sampler takes steps (any diffs) and its own state loads into a fresh one after each."""
    gen = torch.Generator().manual_seed(7)
    for _ in range(steps):
        idx, w = sampler.sample(8)
        assert bool(torch.isfinite(w).all())
        sampler.update(idx, torch.randn(8, generator=gen, dtype=torch.float64) * 10.0 ** float(torch.randint(-3, 4, ())))
        assert bool(torch.isfinite(sampler.estimates).all())
        fresh = make()
        fresh.load_state_dict(sampler.state_dict())
        assert torch.equal(fresh.probs, sampler.probs)


# == 1 (medium): a loaded SAZO state whose running sum its estimates cannot give ===============
def test_a_running_sum_far_above_what_the_estimates_allow_is_refused():
    state = _warm(SAZOSampler(40)).state_dict()
    state["extra"]["seen_sq"] = 1e100                 # against Σ s² ≈ a few
    target = SAZOSampler(40, seed=5)
    before = target.state_dict()
    with pytest.raises(ValueError, match="seen_sq"):
        target.load_state_dict(state)
    assert _same_state(before, target.state_dict())


@pytest.mark.parametrize("statistic", ["abs", "square"])
@pytest.mark.parametrize("field, value", [
    ("seen_sq", 1e100), ("seen_sq", 1e70), ("seen_sq", -5.0),        # far above / below Σ s²
    ("level_steps", 1),                                               # fewer updates than a count says
    ("since_resync", 39),                                             # more observations than the counts hold
])
def test_extra_fields_the_rule_cannot_produce_are_refused_naming_the_field(statistic, field, value):
    sampler = _warm(SAZOSampler(40, statistic=statistic), steps=6)
    state = sampler.state_dict()
    if field == "since_resync":   # a fresh sampler after one update: 8 observations in all
        state = _warm(SAZOSampler(40, statistic=statistic), steps=1).state_dict()
    if field == "level_steps":
        assert int(state["counts"].max()) > value      # an example was observed more often than 1 update allows
    state["extra"][field] = value
    target = SAZOSampler(40, statistic=statistic)
    before = target.state_dict()
    with pytest.raises(ValueError, match=field):
        target.load_state_dict(state)
    assert _same_state(before, target.state_dict())


@pytest.mark.parametrize("saved, loading", [("square", "abs"), ("abs", "square")])
def test_a_genuine_state_of_the_other_statistic_loads_and_keeps_stepping(saved, loading):
    """The running sum is checked against the loaded rule's scores, not the receiving sampler's."""
    sampler = SAZOSampler(6, statistic=saved)
    for seed in range(20):   # until a resync has just made the running sum exact (no slack at all)
        _warm(sampler, steps=1, seed=seed, scale=30.0)
        if sampler.state_dict()["extra"]["since_resync"] == 0:
            break
    state = sampler.state_dict()
    assert state["extra"]["since_resync"] == 0 and state["extra"]["seen_sq"] > 0
    target = SAZOSampler(6, statistic=loading)
    target.load_state_dict(state)
    assert target.statistic == saved
    _steps_and_saves(target, lambda: SAZOSampler(6, statistic=loading))


def test_a_level_step_count_without_any_observation_is_refused():
    state = SAZOSampler(10).state_dict()
    state["extra"]["level_steps"] = 3
    with pytest.raises(ValueError, match="level_steps"):
        SAZOSampler(10).load_state_dict(state)


def test_extra_fields_on_the_plain_rule_are_refused():
    state = PlainSAZOSampler(10).state_dict()
    state["extra"] = {"seen_sq": 1e100}
    with pytest.raises(ValueError, match="extra"):
        PlainSAZOSampler(10).load_state_dict(state)


@pytest.mark.parametrize("junk", [torch.tensor([10, 10]), np.array([10, 10]), "10", 10.0, None])
def test_a_num_examples_that_is_not_an_int_is_refused_with_value_error(junk):
    for sampler in (UniformSampler(10), SAZOSampler(10), PlainSAZOSampler(10)):
        state = sampler.state_dict()
        state["num_examples"] = junk
        with pytest.raises(ValueError, match="num_examples"):
            sampler.load_state_dict(state)


def test_a_tampered_running_sum_in_zo_state_is_refused_on_trainer_resume(tmp_path):
    transformers = pytest.importorskip("transformers")
    from sazo_lite.hf import ZOTrainer
    from sazo_lite.llm.models import tiny_causal_lm

    transformers.logging.set_verbosity_error()
    g = torch.Generator().manual_seed(0)
    rows = [{"input_ids": (ids := torch.randint(3, 64, (5,), generator=g).tolist()), "labels": ids} for _ in range(6)]
    args = lambda steps, save: transformers.TrainingArguments(   # noqa: E731
        str(tmp_path / "out"), max_steps=steps, per_device_train_batch_size=2, learning_rate=1e-3, report_to=[],
        use_cpu=True, disable_tqdm=True, seed=0, save_strategy="steps" if save else "no", save_steps=2)
    ZOTrainer(tiny_causal_lm("llama", vocab_size=64), args(2, True), train_dataset=rows, method="sazo").train()
    path = tmp_path / "out" / "checkpoint-2" / "zo_state.pt"
    state = torch.load(path, weights_only=True)
    state["sampler"]["extra"]["seen_sq"] = 1e100
    torch.save(state, path)
    again = ZOTrainer(tiny_causal_lm("llama", vocab_size=64), args(4, False), train_dataset=rows, method="sazo")
    with pytest.raises(ValueError, match="Invalid checkpoint.*seen_sq"):
        again.train(resume_from_checkpoint=str(path.parent))
    assert again.state.global_step == 0


# -- hypothesis: every field tampered, and the genuine states of extreme runs -----------------
FIELDS = ["estimates", "counts", "level", "level_steps", "seen_sq", "seen_count", "since_resync",
          "num_examples", "seed"]
VALUES = [0, 1, -1, 2, 7, 39, 40, 65535, 1e-300, 0.5, 3.0, 1e15, 1e30, 1.0000001e30, 1e45, 1e60, 1e100,
          1e300, -1e-9, float("inf"), float("nan"), True, "3", None]


@FAST
@given(field=st.sampled_from(FIELDS), value=st.sampled_from(VALUES), where=st.integers(0, 39),
       relative=st.booleans(), statistic=st.sampled_from(["abs", "square"]), sum_tree=st.booleans())
def test_fuzz_a_tampered_field_is_refused_naming_it_or_the_sampler_steps_and_saves(
        field, value, where, relative, statistic, sum_tree):
    make = lambda: SAZOSampler(40, statistic=statistic, sum_tree=sum_tree)   # noqa: E731
    state = _warm(make(), steps=4).state_dict()
    if field in ("estimates", "counts"):
        if not isinstance(value, (int, float)) or isinstance(value, bool):
            return
        array = state[field].double() if isinstance(value, float) else state[field].clone()
        array[where] = value
        state[field] = array
    elif field in ("num_examples", "seed"):
        state[field] = value
    else:
        old = state["extra"][field]
        state["extra"][field] = old * (1 + value) if relative and isinstance(value, float) else value
    target = make()
    before = target.state_dict()
    try:
        target.load_state_dict(state)
    except ValueError as error:
        assert field in str(error) or (field in ("estimates", "counts") and "seen" in str(error)), str(error)
        assert _same_state(before, target.state_dict())
        return
    _steps_and_saves(target, make)


@FAST
@given(exponents=st.lists(st.integers(-300, 300), min_size=1, max_size=12), zeros=st.booleans(),
       ema_decay=st.sampled_from([0.0, 0.5, 0.9]), level_decay=st.sampled_from([0.0, 0.99, 0.999999]),
       statistic=st.sampled_from(["abs", "square"]), n=st.sampled_from([3, 17]), seed=st.integers(0, 9))
def test_fuzz_the_state_of_an_extreme_run_always_loads_again(exponents, zeros, ema_decay, level_decay, statistic, n, seed):
    make = lambda: SAZOSampler(n, ema_decay=ema_decay, level_decay=level_decay, statistic=statistic, seed=seed)  # noqa: E731
    sampler = make()
    gen = torch.Generator().manual_seed(seed)
    for exponent in exponents:
        idx, _ = sampler.sample(4)
        diffs = torch.randn(4, generator=gen, dtype=torch.float64) * 10.0 ** exponent
        if zeros:
            diffs[::2] = 0.0
        try:
            sampler.update(idx, diffs)
        except ValueError:      # the level would overflow: refused, nothing changed
            pass
        fresh = make()
        fresh.load_state_dict(sampler.state_dict())
        assert torch.equal(fresh.probs, sampler.probs)


# == 5, 6: Sampler.update on complex, bool and non-numeric feedback ============================
@pytest.mark.parametrize("make", [lambda: UniformSampler(8), lambda: SAZOSampler(8), lambda: PlainSAZOSampler(8)])
@pytest.mark.parametrize("indices, diffs, name", [
    ([0, 1], torch.tensor([1 + 2j, 3 - 1j]), "directional_diffs"),          # the imaginary part was dropped
    ([0, 1], torch.tensor([True, False]), "directional_diffs"),            # read as 1.0 and 0.0
    ([0, 1], np.array([True, False]), "directional_diffs"),
    ([0, 1], ["a", "b"], "directional_diffs"),
    ([0, 1], None, "directional_diffs"),
    ([0, 1], torch.zeros(2, device="meta"), "directional_diffs"),
    (torch.tensor([1 + 0j, 2 + 0j]), torch.ones(2), "indices"),             # complex indices: imaginary part dropped
    (None, torch.ones(2), "indices"),
    (["a", "b"], torch.ones(2), "indices"),
    (torch.zeros(2, dtype=torch.long, device="meta"), torch.ones(2), "indices"),
])
def test_feedback_that_is_not_real_numbers_is_refused_and_changes_nothing(make, indices, diffs, name):
    sampler = _warm(make(), steps=2)
    before = sampler.state_dict()
    with warnings.catch_warnings():
        warnings.simplefilter("error")          # no "discards the imaginary part" on the way
        with pytest.raises(ValueError, match=f"Invalid {name}"):
            sampler.update(indices, diffs)
    assert _same_state(before, sampler.state_dict())


@pytest.mark.parametrize("norms", [torch.tensor([1 + 1j, 2 + 0j, 1 + 0j]), torch.tensor([True, False, True])])
def test_oracle_norms_that_are_not_real_are_refused(norms):
    with pytest.raises(ValueError, match="norms_fn"):
        OracleSampler(3, lambda: norms).probs


# == engine ===================================================================================
def params64(seed=0, shapes=((6, 3), (7,))):
    g = torch.Generator().manual_seed(seed)
    return [torch.randn(s, generator=g, dtype=torch.float64) for s in shapes]


def assert_restored(params, before, eps, passes=3):
    for p, b in zip(params, before):
        bound = passes * torch.finfo(p.dtype).eps * (b.abs() + 2 * eps * 9.0) + 1e-300
        assert bool(((p - b).abs() <= bound).all()), float((p - b).abs().max())


def quadratic(params):
    return lambda: torch.stack([(p.double() ** 2).sum() for p in params])


# -- 2 (medium): a float32 master checks updates against the model's float16 -------------------
def _half_model(value=1.0, dtype=torch.float16):
    model = [torch.full((4,), value, dtype=dtype), torch.full((3,), -value, dtype=dtype)]
    master = Float32Master(model)
    return model, master


def _huge_loss(model):
    return lambda: 1000.0 * sum(p.float().sum() for p in model)   # g ≈ 1000·Σz: lr·g·z ≈ 1e6


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_an_update_beyond_the_models_range_is_refused_before_the_master_commits(dtype):
    model, master = _half_model(dtype=dtype)
    lr = 1e3 if dtype == torch.float16 else 1e36          # bfloat16's range is float32's, nearly
    opt = MeZO(master.tensors, lr=lr, eps=1e-2)
    before_model, before_master = [p.clone() for p in model], [t.clone() for t in master.tensors]
    with pytest.raises(ValueError, match=f"Invalid lr.*{str(dtype).split('.')[1]}"):
        master.step(opt, _huge_loss(model))
    assert opt.step_count == 0
    assert_restored(master.tensors, before_master, 1e-2)
    assert all(torch.equal(p, b) for p, b in zip(model, before_model))    # the model is back, exactly
    master.sync()                                                           # and stays in step with the master
    assert all(torch.equal(p, b) for p, b in zip(model, before_model))


def test_the_documented_wrap_and_sync_also_leave_model_master_and_count_in_step():
    model, master = _half_model()
    opt = MeZO(master.tensors, lr=1e3, eps=1e-2)
    before = [p.clone() for p in model]
    with pytest.raises(ValueError, match="Invalid lr"):
        opt.step(master.wrap(_huge_loss(model)))
    master.sync()                    # used to raise OverflowError with the model at θ − εz
    assert opt.step_count == 0 and all(torch.equal(p, b) for p, b in zip(model, before))


def test_a_shift_beyond_the_models_range_is_refused_before_any_pass():
    model, master = _half_model(value=65000.0)
    opt = MeZO(master.tensors, lr=1e-3, eps=100.0)        # 65000 + 100·z leaves float16
    before_model, before_master = [p.clone() for p in model], [t.clone() for t in master.tensors]
    with pytest.raises(ValueError, match="float16"):
        master.step(opt, lambda: sum(p.float().sum() for p in model))
    assert all(torch.equal(a, b) for a, b in zip(master.tensors + model, before_master + before_model))


def test_a_master_keeps_its_range_through_deepcopy():
    model, master = _half_model()
    copied = copy.deepcopy(master)
    opt = MeZO(copied.tensors, lr=1e3, eps=1e-2)
    with pytest.raises(ValueError, match="float16"):
        copied.step(opt, _huge_loss(copied.params))


def test_the_trainer_refuses_an_update_beyond_float16_and_leaves_the_model_as_it_was(tmp_path):
    transformers = pytest.importorskip("transformers")
    from sazo_lite.hf import ZOTrainer
    from sazo_lite.llm.models import tiny_causal_lm

    transformers.logging.set_verbosity_error()
    g = torch.Generator().manual_seed(0)
    rows = [{"input_ids": (ids := torch.randint(3, 64, (5,), generator=g).tolist()), "labels": ids} for _ in range(4)]
    model = tiny_causal_lm("llama", vocab_size=64).to(torch.float16)
    args = transformers.TrainingArguments(str(tmp_path / "out"), max_steps=2, per_device_train_batch_size=2,
                                          learning_rate=1e9, report_to=[], use_cpu=True, disable_tqdm=True,
                                          seed=0, save_strategy="no")
    trainer = ZOTrainer(model, args, train_dataset=rows)
    before = {k: v.clone() for k, v in model.state_dict().items()}
    with pytest.raises(ValueError, match="float16"):
        trainer.train()
    assert trainer.zo_optimizer.step_count == 0
    assert all(torch.equal(before[k], v) for k, v in model.state_dict().items())


# -- 7: a closure returning Python booleans -------------------------------------------------------
@pytest.mark.parametrize("bad", [True, False, [True, False], (True,), np.bool_(True), np.array([True, False]),
                                 [True, 2.0], 1 + 2j, [1.0, 2j]])
def test_boolean_or_complex_closure_results_are_refused_and_theta_restored(bad):
    params = params64()
    before = [p.clone() for p in params]
    opt = MeZO(params, lr=0.1, eps=1e-3)
    with pytest.raises(ValueError, match="Invalid closure result"):
        opt.step(lambda: bad)
    assert_restored(params, before, 1e-3, passes=2)
    assert opt.step_count == 0


# -- 8: lr·weight_decay = 1 and a noise source that fails in the update pass -------------------
class RaiseOnPass(PlainNoise):
    """Raises inside pass ``on_pass`` after ``after`` tensors are fully applied."""

    def __init__(self, on_pass, after=1, error=RuntimeError):
        super().__init__()
        self.on_pass, self.after, self.error, self.passes, self.applied = on_pass, after, error, 0, 0

    def apply(self, jobs, done=None):
        self.passes += 1
        self.applied = 0
        super().apply(jobs, done)

    def _apply_one(self, job, slot):
        if self.passes == self.on_pass and self.applied == self.after:
            self.on_pass = None
            raise self.error("the noise source failed")
        super()._apply_one(job, slot)
        self.applied += 1


@pytest.mark.parametrize("lr, weight_decay", [(0.5, 2.0), (1.0, 1.0), (0.1, 9.99999999), (1.0, 0.75)])
@pytest.mark.parametrize("error", [RuntimeError, KeyboardInterrupt])
def test_a_failed_update_pass_that_shrinks_theta_to_nothing_is_undone(lr, weight_decay, error):
    params = params64()
    before = [p.clone() for p in params]
    opt = MeZO(params, lr=lr, eps=1e-3, weight_decay=weight_decay, noise=RaiseOnPass(3, error=error))
    with pytest.raises(error):
        opt.step(quadratic(params))
    assert opt.step_count == 0
    assert_restored(params, before, 1e-3)


def test_a_folded_shrink_to_nothing_update_that_fails_in_the_next_pass_is_kept_pending():
    params = params64()
    reference = [p.clone() for p in params]
    MeZO(reference, lr=1.0, eps=1e-3, weight_decay=1.0, noise=None).step(quadratic(reference))
    opt = MeZO(params, lr=1.0, eps=1e-3, weight_decay=1.0, noise=RaiseOnPass(3), fold_updates=True)
    opt.step(quadratic(params))                      # its update waits, folded into the next +εz
    with pytest.raises(RuntimeError):
        opt.step(quadratic(params))                  # that pass fails part-way: undone, update still pending
    assert opt.step_count == 1 and opt.pending
    opt.flush()
    assert_restored(params, reference, 1e-3)


# -- 9: param groups appended after construction ------------------------------------------------
GROUP = dict(lr=0.1, eps=1e-3, weight_decay=0.0, perturbation="gaussian")


@pytest.mark.parametrize("change, match", [
    (lambda opt: opt.param_groups.append({"params": [torch.zeros(2, dtype=torch.int32)], **GROUP}), "params"),
    (lambda opt: opt.param_groups.append({"params": [torch.zeros(2, dtype=torch.complex64)], **GROUP}), "params"),
    (lambda opt: opt.param_groups.append({"params": [torch.zeros(2, device="meta")], **GROUP}), "params"),
    (lambda opt: opt.param_groups.append({"params": [torch.zeros(4).expand(2, 4)], **GROUP}), "params"),
    (lambda opt: opt.param_groups.append({"params": [opt.param_groups[0]["params"][0][:2]], **GROUP}), "params"),
    (lambda opt: opt.param_groups.append({"params": [opt.param_groups[0]["params"][0]], **GROUP}), "params"),
    (lambda opt: opt.param_groups.append({"params": [], **GROUP}), "params"),
    (lambda opt: opt.param_groups.append({"params": [torch.zeros(2)], "lr": 0.1}), "param_group"),
    (lambda opt: opt.param_groups.append({"lr": 0.1}), "param_group"),
    (lambda opt: opt.param_groups.append([torch.zeros(2)]), "param_group"),
    (lambda opt: opt.param_groups[0]["params"].append(torch.zeros(2, dtype=torch.int64)), "params"),
    (lambda opt: opt.param_groups[0]["params"].__setitem__(0, torch.zeros(3, dtype=torch.complex128)), "params"),
    (lambda opt: opt.param_groups[0]["params"].__setitem__(0, torch.zeros(3, dtype=torch.float64)), "params"),
    (lambda opt: opt.param_groups.insert(0, {"params": [torch.zeros(2)], **GROUP}), "params"),   # ... moved
])
def test_param_groups_edited_after_construction_are_refused_with_value_error(change, match):
    params = params64()
    opt = MeZO(params, lr=0.1, eps=1e-3)
    opt.step(quadratic(params))
    before = [p.clone() for p in params]
    change(opt)
    for _ in range(2):   # refused every time, not only the first
        with pytest.raises(ValueError, match=f"Invalid {match}"):
            opt.step(quadratic(params))
    assert opt.state[params[0]]["step"] == 1 and all(torch.equal(p, b) for p, b in zip(params, before))


def test_a_valid_group_appended_after_construction_still_steps():
    params = params64()
    opt = MeZO(params[:1], lr=0.1, eps=1e-3)
    opt.param_groups.append({"params": [params[1]], **GROUP})
    before = params[1].clone()
    opt.step(quadratic(params))
    assert opt.step_count == 1 and not torch.equal(params[1], before)

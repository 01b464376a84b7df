"""Regression tests for the defects of issue 17: bad input is refused before anything changes,
and nothing is left half-done after an error, an interrupt or an overflow.

Restore bounds: a failed step shifts θ by +εz (and −2εz) and back, so θ returns within the
rounding of those 2 or 3 in-place adds: |Δθ| ≤ 3·u·(|θ| + 2ε|z|) elementwise (``restore_bound``).
"""
import copy
import math
import signal

import pytest
import torch

import sazo_lite as sz
from sazo_lite.course import problems
from sazo_lite.engine import MeZO
from sazo_lite.noise import PlainNoise, TorchNoise


def params64(seed=0, shapes=((40, 3), (7,), (2, 5))):
    g = torch.Generator().manual_seed(seed)
    return [torch.randn(s, generator=g, dtype=torch.float64) for s in shapes]


def assert_restored(params, before, eps, passes=3):
    for p, b in zip(params, before):
        u = torch.finfo(p.dtype).eps
        bound = passes * u * (b.abs() + 2 * eps * 9.0) + 1e-300
        assert bool(((p - b).abs() <= bound).all()), float((p - b).abs().max())


def quadratic(params):
    return lambda: torch.stack([(p.double() ** 2).sum() for p in params])


# -- closure results -----------------------------------------------------------------------
def test_empty_loss_tensor_is_rejected_and_theta_restored():
    params = params64()
    before = [p.clone() for p in params]
    opt = MeZO(params, lr=0.1, eps=1e-3)
    with pytest.raises(ValueError, match="empty"):
        opt.step(lambda: torch.empty(0))
    assert_restored(params, before, 1e-3)
    assert opt.step_count == 0
    assert all(bool(torch.isfinite(p).all()) for p in params)


@pytest.mark.parametrize("kind", ["float", "list"])
def test_python_number_losses_keep_float64_precision(kind):
    """θ float64, losses near 1000, ε = 1e-6: parsing through float32 gave g = 0.0."""
    a = torch.linspace(0.5, 1.5, 6, dtype=torch.float64)
    results = {}
    for form in ("tensor", kind):
        theta = torch.zeros(6, dtype=torch.float64)
        opt = MeZO([theta], lr=0.0, eps=1e-6, seed=4)
        value = lambda: 1000.0 + a @ theta  # noqa: E731
        closure = {"tensor": value, "float": lambda: float(value()),
                   "list": lambda: [float(value()), float(value())]}[form]
        results[form] = opt.step(closure).projected_grad
    assert results["tensor"] != 0.0
    assert results[kind] == pytest.approx(results["tensor"], rel=1e-6)


@pytest.mark.parametrize("bad", ["text", None, [[1.0, 2.0]], torch.tensor([1 + 2j])])
def test_unusable_closure_results_raise_value_error_and_restore(bad):
    params = params64()
    before = [p.clone() for p in params]
    opt = MeZO(params, lr=0.1, eps=1e-3)
    with pytest.raises(ValueError):
        opt.step(lambda: bad)
    assert_restored(params, before, 1e-3)
    assert opt.step_count == 0


# -- interrupts ---------------------------------------------------------------------------
class InterruptAfter(PlainNoise):
    """Raises KeyboardInterrupt inside a pass, after ``after`` tensors of pass ``on_pass``."""

    def __init__(self, on_pass, after):
        super().__init__()
        self.on_pass, self.after, self.passes, self.applied = on_pass, after, 0, 0

    def apply(self, jobs, done=None):
        self.passes += 1
        self.applied = 0
        super().apply(jobs, done)

    def _apply_one(self, job, slot):
        if self.passes == self.on_pass and self.applied == self.after:
            self.on_pass = None
            raise KeyboardInterrupt
        super()._apply_one(job, slot)
        self.applied += 1


@pytest.mark.parametrize("on_pass,after", [(1, 1), (1, 2), (2, 1), (3, 2)])
def test_keyboard_interrupt_inside_a_pass_leaves_theta_restored(on_pass, after):
    params = params64()
    before = [p.clone() for p in params]
    opt = MeZO(params, lr=0.1, eps=1e-2, noise=InterruptAfter(on_pass, after), weight_decay=0.1)
    with pytest.raises(KeyboardInterrupt):
        opt.step(quadratic(params))
    assert_restored(params, before, 1e-2)
    assert opt.step_count == 0
    opt.step(quadratic(params))  # and the optimiser still works
    assert opt.step_count == 1


class SigintDuring(TorchNoise):
    """Sends a real SIGINT (Ctrl-C) to this process while a pass is half done."""

    def __init__(self, on_pass, **kwargs):
        super().__init__(**kwargs)
        self.on_pass, self.passes = on_pass, 0

    def apply(self, jobs, done=None):
        self.passes += 1
        super().apply(jobs, done)

    def _apply_one(self, job, slot):
        super()._apply_one(job, slot)
        if self.passes == self.on_pass:
            self.on_pass = None
            signal.raise_signal(signal.SIGINT)


@pytest.mark.parametrize("on_pass", [1, 2, 3])
def test_ctrl_c_during_a_pass_is_delivered_after_it_and_theta_restored(on_pass):
    params = [p.float() for p in params64(shapes=((300, 40), (5000,), (3,)))]
    before = [p.clone() for p in params]
    opt = MeZO(params, lr=0.1, eps=1e-2, noise=SigintDuring(on_pass, workers=1, chunk=256))
    log = sz.SeedLog.attach(opt)
    with pytest.raises(KeyboardInterrupt):
        opt.step(quadratic(params))
    if on_pass < 3:  # interrupted while shifting: the step is undone
        assert_restored(params, before, 1e-2)
        assert opt.step_count == 0
    else:  # interrupted while updating: the update completes, is counted and logged
        assert opt.step_count == 1 and log.num_steps == 1
    replayed = [b.clone() for b in before]
    log.replay(replayed)
    assert all(torch.equal(a, b) for a, b in zip(params, replayed))


# -- parameters and groups -----------------------------------------------------------------
@pytest.mark.parametrize("bad", [torch.zeros(3, dtype=torch.long), torch.zeros(2, dtype=torch.bool),
                                 torch.zeros(2, dtype=torch.complex64)])
def test_non_floating_parameters_are_rejected_up_front(bad):
    good = torch.zeros(4)
    with pytest.raises(ValueError, match="floating"):
        MeZO([good, bad], lr=0.1)
    opt = MeZO([good], lr=0.1)
    with pytest.raises(ValueError, match="floating"):
        opt.add_param_group({"params": [bad]})
    assert len(opt.param_groups) == 1 and torch.equal(good, torch.zeros(4))


@pytest.mark.parametrize("group", [dict(eps=0), dict(eps=-1e-3), dict(perturbation="bogus"),
                                   dict(lr=float("nan")), dict(lr=-1.0), dict(weight_decay=float("inf")),
                                   dict(lr="0.1"), dict(params=[])])
def test_param_group_dicts_are_validated(group):
    params = {"params": [torch.zeros(3)], **group}
    with pytest.raises(ValueError):
        MeZO([params], lr=0.1)
    opt = MeZO([torch.zeros(2)], lr=0.1, eps=params.get("eps", 1e-3) if group.get("eps", 1) > 0 else 1e-3)
    with pytest.raises(ValueError):
        opt.add_param_group(params)
    assert len(opt.param_groups) == 1


@pytest.mark.parametrize("key,value", [("lr", float("nan")), ("eps", 0.0), ("perturbation", "bogus"),
                                       ("weight_decay", -1.0)])
def test_hyperparameters_edited_between_steps_are_checked_before_the_step(key, value):
    params = params64()
    before = [p.clone() for p in params]
    opt = MeZO(params, lr=0.1)
    opt.param_groups[0][key] = value
    with pytest.raises(ValueError, match=key):
        opt.step(quadratic(params))
    assert all(torch.equal(p, b) for p, b in zip(params, before))
    assert opt.step_count == 0


def corrupt(state, how):
    groups, entry = state["param_groups"], state["state"][0]
    if how == "nan lr":
        groups[0]["lr"] = float("nan")
    elif how == "eps 0":
        groups[0]["eps"] = 0.0
    elif how == "fractional step":
        entry["step"] = 2.5
    elif how == "negative step":
        entry["step"] = -1
    elif how == "empty state":
        state["state"] = {}
    elif how == "bogus perturbation":
        groups[0]["perturbation"] = "bogus"
    elif how == "missing seed":
        del entry["seed"]
    return state


@pytest.mark.parametrize("how", ["nan lr", "eps 0", "fractional step", "negative step", "empty state",
                                 "bogus perturbation", "missing seed"])
def test_load_state_dict_validates_everything_before_loading(how):
    params = params64()
    opt = MeZO(params, lr=0.1, seed=3)
    opt.step(quadratic(params))
    good = opt.state_dict()
    target = MeZO(params64(), lr=0.2, seed=9)
    with pytest.raises(ValueError):
        target.load_state_dict(corrupt(copy.deepcopy(good), how))
    assert target.step_count == 0 and target.param_groups[0]["lr"] == 0.2
    assert target.next_seed() == sz.derive_seed(9, 0)
    target.load_state_dict(good)  # the valid one still loads
    assert target.step_count == 1


# -- overflow ------------------------------------------------------------------------------
@pytest.mark.parametrize("case", ["huge loss", "huge weight", "huge lr"])
def test_finite_but_huge_inputs_raise_and_restore_instead_of_writing_inf(case):
    params = [p.float() for p in params64()]
    before = [p.clone() for p in params]
    lr = 1e34 if case == "huge lr" else 0.1  # lr·g·z ≈ 1e40 > float32 max
    opt = MeZO(params, lr=lr, eps=1e-3)
    flip = []

    def closure():  # L+ = +big, L− = −big: (L+ − L−)/(2ε) overflows float64 for 1e308
        flip.append(1)
        big = {"huge loss": 1e308, "huge weight": 1.0, "huge lr": 1e3}[case]
        return torch.full((2,), big if len(flip) % 2 else -big, dtype=torch.float64)

    weights = torch.tensor([1e308, 1e308], dtype=torch.float64) if case == "huge weight" else None
    with pytest.raises((FloatingPointError, ValueError)):
        opt.step(closure, weights)
    assert all(bool(torch.isfinite(p).all()) for p in params)
    assert_restored(params, before, 1e-3)
    assert opt.step_count == 0


def test_eps_too_large_for_the_dtype_is_refused_before_the_step():
    theta = torch.zeros(3, dtype=torch.float16)
    opt = MeZO([theta], lr=0.1, eps=1e4)
    with pytest.raises(ValueError, match="eps"):
        opt.step(lambda: theta.double().sum())
    assert torch.equal(theta, torch.zeros(3, dtype=torch.float16))


# -- seed log ------------------------------------------------------------------------------
def logged_run(dtype=torch.float32, steps=6):
    params = [p.to(dtype) for p in params64()]
    initial = [p.clone() for p in params]
    opt = MeZO(params, lr=0.05, eps=1e-3, seed=2)
    log = sz.SeedLog.attach(opt)
    for _ in range(steps):
        opt.step(quadratic(params))
    return params, initial, log


def test_seed_log_records_dtypes_and_optimiser_and_refuses_another_dtype():
    params, initial, log = logged_run(torch.float32)
    assert log.header["optimizer"] == "MeZO"
    assert log.header["groups"][0]["dtypes"] == ["torch.float32"] * 3
    with pytest.raises(ValueError, match="dtype"):
        log.replay([p.double() for p in initial])


def test_truncated_or_padded_log_is_refused_at_load():
    _, _, log = logged_run()
    data = log.to_bytes()
    for broken in (data[:-17], data[:-17 * 3], data[:-5], data + bytes(17)):
        with pytest.raises(ValueError, match="Invalid seed log"):
            sz.SeedLog.from_bytes(broken)
    assert sz.SeedLog.from_bytes(data).records == log.records


@pytest.mark.parametrize("record,match", [((7, 0, 0.0), "unknown record kind"),
                                          ((1, 123, 3.0), "shift passes"),
                                          ((0, 123, float("nan")), "non-finite"),
                                          ((2, 0, float("nan")), "lr"),
                                          ((3, 5, 0.1), "group 5")])
def test_bad_records_are_refused_at_load_and_at_replay(record, match):
    params, initial, log = logged_run(steps=2)
    log.records.append(record)
    with pytest.raises(ValueError, match=match):
        sz.SeedLog.from_bytes(log.to_bytes())
    copy = [p.clone() for p in initial]
    with pytest.raises(ValueError, match=match):
        log.replay(copy)
    assert all(torch.equal(a, b) for a, b in zip(copy, initial))  # refused before any pass


@pytest.mark.parametrize("edit", [lambda h: h.pop("groups"), lambda h: h.update(eps="x"),
                                  lambda h: h.update(groups=[{"perturbation": "bogus", "shapes": [[2]], "dtypes": ["torch.float32"]}]),
                                  lambda h: h.update(start_step=-1), lambda h: h.pop("format")])
def test_malformed_header_fails_at_load_not_at_replay(edit):
    import json
    _, _, log = logged_run(steps=1)
    head, _, body = log.to_bytes().partition(b"\n")
    header = json.loads(head)
    edit(header)
    with pytest.raises(ValueError, match="Invalid seed log"):
        sz.SeedLog.from_bytes(json.dumps(header).encode() + b"\n" + body)
    with pytest.raises(ValueError, match="Invalid seed log"):
        sz.SeedLog.from_bytes(b"not json\n" + body)


def test_sparse_mezo_log_refuses_dense_replay_and_replays_through_sparse_mezo():
    from sazo_lite.sparse import SparseMeZO, sparse_indices

    params = params64()
    initial = [p.clone() for p in params]
    masks = sparse_indices(params, 0.3, seed=1)
    opt = SparseMeZO(params, masks, lr=0.05, eps=1e-3, seed=5)
    log = sz.SeedLog.attach(opt)
    for _ in range(4):
        opt.step(quadratic(params))
    loaded = sz.SeedLog.from_bytes(log.to_bytes())
    assert loaded.header["optimizer"] == "SparseMeZO"
    with pytest.raises(ValueError, match="SparseMeZO"):
        loaded.replay([p.clone() for p in initial])
    with pytest.raises(ValueError, match="masks"):
        loaded.replay_into(SparseMeZO(initial, sparse_indices(initial, 0.5, seed=1), lr=0.0, eps=1e-3))
    loaded.replay_into(SparseMeZO(initial, masks, lr=0.0, eps=1e-3))
    assert all(torch.equal(a, b) for a, b in zip(params, initial))


def test_seed_log_refuses_a_change_it_cannot_record():
    params, _, log = logged_run(steps=1)
    opt = MeZO(params, lr=0.05, eps=1e-3)
    sz.SeedLog.attach(opt)
    opt.param_groups[0]["perturbation"] = "rademacher"
    before = [p.clone() for p in params]
    with pytest.raises(ValueError, match="perturbation"):
        opt.step(quadratic(params))
    assert all(torch.equal(a, b) for a, b in zip(params, before))


def test_replay_failure_refuses_other_than_one_or_two_passes():
    params = params64()
    before = [p.clone() for p in params]
    opt = MeZO(params, lr=0.1)
    for bad in (0, 3, 1.5, True, "1"):
        with pytest.raises(ValueError, match="passes"):
            opt.replay_failure(123, bad)
    assert all(torch.equal(a, b) for a, b in zip(params, before))


# -- smaller entry points -------------------------------------------------------------------
@pytest.mark.parametrize("kwargs", [dict(steps=True), dict(steps=-1), dict(steps=2.0), dict(log_every=1.5),
                                    dict(log_every=0), dict(batch_size=0), dict(stop_below=float("nan"))])
def test_train_rejects_bad_arguments_before_any_step(kwargs):
    theta = torch.zeros(3, dtype=torch.float64)
    opt = MeZO([theta], lr=0.1)
    sampler = sz.UniformSampler(4, seed=0)
    call = dict(steps=3, **{k: v for k, v in kwargs.items() if k != "steps"})
    if "steps" in kwargs:
        call["steps"] = kwargs["steps"]
    with pytest.raises(ValueError):
        sz.train(opt, sampler, lambda idx: (theta - 1).pow(2).sum().expand(len(idx)), progress=False, **call)
    assert opt.step_count == 0 and torch.equal(theta, torch.zeros(3, dtype=torch.float64))


@pytest.mark.parametrize("budget", [0.0, -1.0, float("nan"), float("inf"), "40"])
def test_memory_model_rejects_budgets_instead_of_returning_nan(budget):
    from sazo_lite.course import memory

    with pytest.raises(ValueError, match="budget"):
        memory.size_ratio(memory.HEADLINE_SHAPE, memory.HEADLINE_SETUP, budget)
    with pytest.raises(ValueError, match="budget"):
        memory.largest_fitting(memory.LADDERS["qwen2.5"], memory.HEADLINE_SETUP, budget, "zo")


@pytest.mark.parametrize("fraction", ["0.5", 0.0, 1.5, float("nan")])
def test_train_setup_rejects_a_fraction_that_is_not_a_number_in_range(fraction):
    from sazo_lite.course.memory import TrainSetup

    with pytest.raises(ValueError, match="trainable_fraction"):
        TrainSetup(trainable_fraction=fraction)


@pytest.mark.parametrize("make", [lambda P: P.LeastSquares(noise=float("nan")), lambda P: P.LeastSquares(noise=-1.0),
                                  lambda P: P.LeastSquares(num_examples=2.5), lambda P: P.LeastSquares(heterogeneity="1"),
                                  lambda P: P.LogisticRegression.from_sklearn("breast_cancer", l2=-1),
                                  lambda P: P.LogisticRegression.from_sklearn("breast_cancer", l2=float("nan"))])
def test_problems_reject_bad_numbers(make):
    with pytest.raises(ValueError):
        make(problems)


@pytest.mark.parametrize("kwargs", [dict(noise="0.1"), dict(noise=0.5), dict(noise=float("nan")),
                                    dict(num_train=0), dict(seed=0.5), dict(name=["sentiment"])])
def test_make_task_raises_value_error_not_type_error(kwargs):
    from sazo_lite.llm.tasks import make_task

    with pytest.raises(ValueError):
        make_task(**kwargs)


def test_noise_sources_and_counter_reject_bad_arguments():
    from sazo_lite.course.instruments import DirectionCounter

    with pytest.raises(ValueError, match="optimizer"):
        DirectionCounter(optimizer="not an optimiser")
    with pytest.raises(ValueError, match="fold_updates"):
        MeZO([torch.zeros(2)], lr=0.1, fold_updates=1)
    with pytest.raises(ValueError, match="hook"):
        MeZO([torch.zeros(2)], lr=0.1).register_step_hook("not callable")
    assert math.isfinite(MeZO([torch.zeros(2)], lr=0.1).step(lambda: 1.0).loss)


@pytest.mark.parametrize("noise", ["plain", "torch"])
def test_ctrl_c_at_random_moments_never_leaves_a_half_step(noise):
    """The issue's experiment: Ctrl-C (a real SIGINT from a timer thread) at random moments of
    steps on a 2²⁰-entry model. Each step either completes or is undone, and the seed log, which
    saw exactly what happened, replays to the very same θ."""
    import os
    import random
    import threading
    import time

    params = [p.float() for p in params64(seed=3, shapes=((512, 1024), (1024,), (7,)))]
    initial = [p.clone() for p in params]
    opt = MeZO(params, lr=0.01, eps=1e-3, noise=TorchNoise(workers=2, chunk=2 ** 14) if noise == "torch" else None)
    log = sz.SeedLog.attach(opt)
    closure = quadratic(params)
    start = time.perf_counter()
    opt.step(closure)
    step_seconds = time.perf_counter() - start
    rng, interrupted = random.Random(0), 0
    for _ in range(10):
        before, steps = [p.clone() for p in params], opt.step_count
        timer = threading.Timer(rng.uniform(0, 1.2 * step_seconds), os.kill, (os.getpid(), signal.SIGINT))
        try:
            timer.start()
            opt.step(closure)
            timer.join()  # a late signal lands here, outside the step
        except KeyboardInterrupt:
            interrupted += 1
            timer.join()
            if opt.step_count == steps:
                assert_restored(params, before, 1e-3)
        assert opt.step_count - steps in (0, 1)
    sz.SeedLog.from_bytes(log.to_bytes()).replay(initial)
    assert all(torch.equal(a, b) for a, b in zip(params, initial))
    assert interrupted >= 5  # the timer did interrupt (almost every delay falls inside a step)

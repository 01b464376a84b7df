"""Round 12 of the library's red team: SparseMeZO checkpoints and masks, numbers beyond float64, the
addresses a step reads, and the review's leftovers.

Each defect's test fails on the code before its fix.
"""
from __future__ import annotations

import warnings

import numpy as np
import pytest
import torch

import sazo_lite as sz
from sazo_lite.sparse import SparseMeZO, sparse_indices
from sazo_lite.train import NoiseScaledStep


def _sparse(theta, seed: int = 3):
    return SparseMeZO([theta], sparse_indices([theta], 0.5, seed=1), lr=0.05, eps=1e-3, seed=seed)


def _quadratic(theta):
    return lambda: (theta - 1.0).pow(2)


# --- 1. SparseMeZO.load_state_dict ----------------------------------------------------------------------------
@pytest.mark.parametrize("fold", [False, True])
def test_a_sparse_mezo_state_loads_into_a_sparse_mezo_and_resumes_bit_for_bit(fold):
    """torch.optim's load_state_dict sets the state through __setstate__, which SparseMeZO read as a pickle's
    and asked for its masks: every load_state_dict raised KeyError('masks')."""
    theta, resumed = torch.randn(12, dtype=torch.float64), None
    opt = _sparse(theta)
    opt.fold_updates = fold
    for step in range(5):
        if step == 2:
            state = opt.state_dict()   # flushes a folded update: θ is current from here
            resumed = theta.clone()
            copy = _sparse(resumed, seed=0)   # another seed: the loaded state must bring the run's back
            copy.fold_updates = fold
            copy.load_state_dict(state)
        opt.step(_quadratic(theta))
    for _ in range(3):
        copy.step(_quadratic(resumed))
    opt.flush(), copy.flush()
    assert copy.step_count == opt.step_count == 5 and torch.equal(theta, resumed)
    assert isinstance(copy.noise, sz.sparse.MaskedNoise) and copy.masks.keys() == {id(resumed)}


def test_a_refused_sparse_state_leaves_the_optimiser_as_it_was():
    theta = torch.randn(6)
    opt = _sparse(theta)
    opt.step(_quadratic(theta))
    with pytest.raises(ValueError, match="Invalid state_dict"):
        opt.load_state_dict({"state": {}, "param_groups": []})
    assert opt.step_count == 1 and isinstance(opt.noise, sz.sparse.MaskedNoise)
    opt.step(_quadratic(theta))
    assert opt.step_count == 2


# --- 2. SparseMeZO's masks: one rule, dense data --------------------------------------------------------------
@pytest.mark.parametrize("mask", [lambda: torch.tensor([0, 2], device="meta"),
                                  lambda: torch.tensor([0, 2]).to_sparse()], ids=["meta", "sparse"])
def test_a_mask_without_dense_data_is_a_value_error(mask):
    """A meta mask raised RuntimeError from .item(), a sparse one NotImplementedError from aten::min."""
    with pytest.raises(ValueError, match="Invalid masks"):
        SparseMeZO([torch.zeros(4)], [mask()], lr=0.1)


def test_a_tensor_given_as_params_is_refused_naming_it():
    """list() split the tensor into rows, and the error then counted masks against rows."""
    with pytest.raises(ValueError, match="Invalid params: expected a list of tensors, got a tensor"):
        SparseMeZO(torch.zeros(3, 4), [torch.tensor([0])], lr=0.1)


def test_construction_and_a_later_step_refuse_a_tensor_by_the_same_rule():
    """The mask rule was written twice (constructor, and before a step once .data moved), in two wordings: a step
    now reports what the constructor would, and says how the tensor got there."""
    with pytest.raises(ValueError) as built:
        SparseMeZO([torch.zeros(2, 5).t()], [torch.tensor([1])], lr=0.1)
    theta = torch.zeros(10)
    opt = SparseMeZO([theta], [torch.tensor([1])], lr=0.1)
    theta.data = torch.zeros(2, 5).t()
    with pytest.raises(ValueError) as stepped:
        opt.step(lambda: theta.sum().reshape(1))
    assert str(stepped.value).startswith(str(built.value).split(", got")[0]) and "re-pointed" in str(stepped.value)
    assert opt.step_count == 0


# --- 3. numbers beyond float64 ---------------------------------------------------------------------------------
@pytest.mark.parametrize("result", [10 ** 400, [1.0, -(10 ** 400)]], ids=["int", "list"])
def test_a_closure_result_beyond_float64_is_a_value_error_with_theta_restored(result):
    """torch.as_tensor raised OverflowError, which the result's check did not catch."""
    theta = torch.randn(4, dtype=torch.float64)
    start = theta.clone()
    opt = sz.MeZO([theta], lr=0.1, eps=1e-3)
    with pytest.raises(ValueError, match="Invalid closure result"):
        opt.step(lambda: result)
    assert torch.allclose(theta, start, rtol=0, atol=1e-15) and opt.step_count == 0


def test_weights_beyond_float64_are_a_value_error_before_anything_moves():
    theta = torch.randn(2, dtype=torch.float64)
    start = theta.clone()
    opt = sz.MeZO([theta], lr=0.1, eps=1e-3)
    with pytest.raises(ValueError, match="Invalid weights"):
        opt.step(lambda: theta ** 2, [1.0, 10 ** 400])
    assert torch.equal(theta, start) and opt.step_count == 0


@pytest.mark.parametrize("name", ["lr", "eps", "weight_decay"])
def test_a_hyperparameter_beyond_float64_is_refused_naming_it(name):
    """float() raised OverflowError, naming nothing."""
    with pytest.raises(ValueError, match=f"Invalid {name}"):
        sz.MeZO([torch.zeros(2)], **{"lr": 0.1, name: 10 ** 400})


def test_noise_scaled_step_refuses_a_g_beyond_float64_before_it_changes():
    rule = NoiseScaledStep(warmup=1)
    with pytest.raises(ValueError, match="Invalid projected_grad"):
        rule.observe(-(10 ** 400))
    assert rule.seen == 0


# --- 4. the addresses a step reads ------------------------------------------------------------------------------
def test_a_step_reads_each_tensors_address_once_before_its_passes(monkeypatch):
    """The group check read every tensor's address and the closure guard read them again, before the first pass;
    the guard now takes the addresses the check accepted. After each closure call they are read again (the
    closure may re-point .data)."""
    params = [torch.randn(3) for _ in range(5)]
    opt = sz.MeZO(params, lr=0.1, eps=1e-3)
    loss = lambda: sum(p.sum() for p in params).reshape(1)
    opt.step(loss)
    reads, plain = [], torch.Tensor.data_ptr
    monkeypatch.setattr(torch.Tensor, "data_ptr", lambda self: reads.append(1) or plain(self))
    opt.step(loss)
    assert len(reads) == 3 * len(params)   # before the passes, after call 1, after call 2


def test_a_closure_that_re_points_data_is_still_refused_and_theta_put_back():
    a, b = torch.zeros(4), torch.zeros(4)
    opt = sz.MeZO([a, b], lr=0.1, eps=1e-3, seed=2)
    other = torch.ones(4)

    def tie():
        a.data = other
        return (a.sum() + b.sum()).reshape(1)

    with pytest.raises(ValueError, match="edited inside the step's closure"):
        opt.step(tie)
    assert a.data_ptr() != other.data_ptr() and opt.step_count == 0 and torch.equal(other, torch.ones(4))
    assert torch.allclose(a, torch.zeros(4), atol=1e-6) and torch.allclose(b, torch.zeros(4), atol=1e-6)


# --- 5. train ---------------------------------------------------------------------------------------------------
def _train(**kwargs):
    theta = torch.zeros(3, dtype=torch.float64)
    opt = sz.MeZO([theta], lr=0.01, eps=1e-3, seed=0)
    history = sz.train(opt, sz.UniformSampler(4, seed=0), lambda idx: (theta - 1.0).pow(2).sum() + 0.0 * idx.double(),
                       steps=20, batch_size=2, log_every=5, progress=False, **kwargs)
    return history, opt


def test_an_evaluate_result_that_requires_grad_is_logged_without_a_warning():
    """float() of such a tensor warned from inside train ("Converting a tensor with requires_grad=True")."""
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        history, _ = _train(evaluate=lambda: torch.tensor(2.5, requires_grad=True))
    assert history.metrics == [2.5] * 4


def test_a_target_met_at_theta0_stops_at_the_first_log_point():
    """Pinned, not changed: stop_below is judged at the log points, the first after log_every steps (query_run's
    runs and tests/test_llm_norms.py count on that)."""
    history, opt = _train(evaluate=lambda: 0.0, stop_below=1.0)
    assert history.logged_steps == [5] and opt.step_count == 5


# --- 6. the variance helpers' vectors ---------------------------------------------------------------------------
from sazo_lite import variance  # noqa: E402

ONE_VECTOR = {"oracle_probs": lambda x: variance.oracle_probs(x), "uniform_gain": lambda x: variance.uniform_gain(x),
              "mix_with_uniform": lambda x: variance.mix_with_uniform(x, 0.5),
              "sampling_variance": lambda x: variance.sampling_variance(x, x),
              "variance_ratio": lambda x: variance.variance_ratio(x, x),
              "tv_distance": lambda x: variance.tv_distance(x, x),
              "spearman": lambda x: variance.spearman(x, x),
              "zo_second_moment": lambda x: variance.zo_second_moment(x, x, 1.0, 3, 2)}
NOT_A_VECTOR = {"empty": lambda: [], "string": lambda: "abc", "beyond float64": lambda: [1.0, 10 ** 400],
                "sparse": lambda: torch.tensor([1.0, 2.0]).to_sparse(), "meta": lambda: torch.ones(2, device="meta")}


@pytest.mark.parametrize("value", NOT_A_VECTOR.values(), ids=NOT_A_VECTOR.keys())
@pytest.mark.parametrize("helper", ONE_VECTOR.values(), ids=ONE_VECTOR.keys())
def test_every_variance_helper_refuses_what_is_not_a_vector_of_numbers_naming_it(helper, value):
    """An empty vector divided by N = 0 (ZeroDivisionError; uniform_gain, tv_distance and spearman answered 1 or 0
    for no examples), a string or an int beyond float64 raised TypeError or an unnamed 'Overflow when unpacking',
    sparse and meta tensors NotImplementedError."""
    with pytest.raises(ValueError, match=r"Invalid (norms|probs|p|a)\b"):
        helper(value())


@pytest.mark.parametrize("value", [[float("nan"), 1.0, 2.0], [float("inf"), 1.0, 2.0], [1j, 1.0, 2.0]],
                         ids=["nan", "inf", "complex"])
def test_spearman_refuses_scores_that_are_not_finite_real_numbers(value):
    """spearman ranked a NaN or ∞ anywhere (−0.5 for these) and dropped an imaginary part with a warning."""
    with pytest.raises(ValueError, match="Invalid a"):
        variance.spearman(value, [1.0, 2.0, 3.0])
    with pytest.raises(ValueError, match="Invalid b"):
        variance.spearman([1.0, 2.0, 3.0], value)


def test_spearman_still_ranks_negative_scores():
    assert variance.spearman([-3.0, -1.0, 2.0], [0.1, 0.2, 0.3]) == pytest.approx(1.0)
    assert variance.spearman([-3.0, -1.0, 2.0], [0.3, 0.2, 0.1]) == pytest.approx(-1.0)


# --- 7. one reading of tensors given as numbers (validation.dense_tensor) ----------------------------------------
from sazo_lite.samplers import SAZOSampler, StaleCorrectedSAZOSampler  # noqa: E402
from sazo_lite.sumtree import SumTree  # noqa: E402
from test_hostile_core import _same_state  # noqa: E402   (two states hold the same values)


def test_the_variance_helpers_read_python_floats_in_float64():
    """torch.as_tensor read a list of floats in float32: a TV distance of 0.2 was 0.19999999925, a V(p) of 0.05
    was 0.0500000037, and norms of 1e300 were inf, refused as not finite."""
    assert variance.tv_distance([0.1, 0.9], [0.3, 0.7]) == pytest.approx(0.2, rel=1e-15, abs=0)
    assert variance.sampling_variance([0.1, 0.3], [0.5, 0.5]) == pytest.approx(0.05, rel=1e-15, abs=0)
    assert variance.oracle_probs([1e300, 3e300]).tolist() == [0.25, 0.75]


def test_a_sum_tree_reads_python_floats_in_float64():
    """The same float32 reading: SumTree([0.1, 0.2]) summed 0.30000000447, and a weight of 1e300 was refused."""
    tree = SumTree([0.1, 0.2])
    assert tree.total == 0.1 + 0.2 and tree.weights(torch.tensor([0])).item() == 0.1
    assert SumTree([1e300]).total == 1e300
    tree.update([1], [1e300])
    assert tree.total == 1e300


BAD_WEIGHTS = {"string": lambda: "abc", "beyond float64": lambda: [10 ** 400], "bool": lambda: torch.tensor([True]),
               "sparse": lambda: torch.tensor([1.0]).to_sparse(), "meta": lambda: torch.ones(1, device="meta")}


@pytest.mark.parametrize("value", BAD_WEIGHTS.values(), ids=BAD_WEIGHTS.keys())
def test_a_sum_tree_refuses_weights_and_indices_without_dense_real_data_naming_them(value):
    """TypeError, an unnamed overflow, NotImplementedError; booleans were read as 1.0."""
    with pytest.raises(ValueError, match="Invalid weights"):
        SumTree(value())
    tree = SumTree([1.0, 2.0])
    with pytest.raises(ValueError, match="Invalid weights"):
        tree.update(torch.tensor([0]), value())
    if not isinstance(value(), list):
        with pytest.raises(ValueError, match="Invalid indices"):
            tree.update(value(), [1.0])
    assert tree.tree.tolist() == [0.0, 3.0, 1.0, 2.0]


def _meta(value):
    return value.to("meta")


@pytest.mark.parametrize("field", ["estimates", "counts", "last_seen", "growth_fresh"])
def test_a_sampler_state_holding_a_meta_tensor_is_a_value_error_with_the_sampler_unchanged(field):
    """Pinned (refused before too) now that the sampler reads its state through validation.dense_tensor."""
    sampler = StaleCorrectedSAZOSampler(4, seed=0)
    sampler.update(torch.tensor([0, 1]), torch.tensor([0.5, 2.0]))
    state = sampler.state_dict()
    bad = {**state, "extra": dict(state["extra"])}
    (bad if field in bad else bad["extra"])[field] = _meta((state if field in state else state["extra"])[field])
    with pytest.raises(ValueError, match=f"Invalid state: {field}"):
        sampler.load_state_dict(bad)
    assert _same_state(sampler.state_dict(), state)


def test_sampler_feedback_beyond_float64_is_a_value_error_naming_it():
    """Pinned, as the test above."""
    sampler = SAZOSampler(3, seed=0)
    before = sampler.state_dict()
    with pytest.raises(ValueError, match="Invalid directional_diffs"):
        sampler.update([0], [10 ** 400])
    with pytest.raises(ValueError, match="Invalid indices"):
        sampler.update([10 ** 400], [1.0])
    assert _same_state(sampler.state_dict(), before)


# --- 8. a seed log records the rates each step used -------------------------------------------------------------
from sazo_lite.seedlog import SeedLog  # noqa: E402


class HalveRates:
    """A step hook that schedules the lr (and weight decay): halves them after each committed step."""

    def __call__(self, optimizer, event):
        if event.kind == "step":
            for group in optimizer.param_groups:
                group["lr"] *= 0.5
                group["weight_decay"] *= 0.5


@pytest.mark.parametrize("fold", [False, True])
def test_a_log_attached_after_a_schedule_hook_replays_the_rates_the_steps_used(fold):
    """The log read the groups' rates when it was told of a step, after a schedule hook registered before it had
    set the next step's: its replay moved θ by half the run's updates, silently."""
    theta = torch.zeros(4, dtype=torch.float64)
    opt = sz.MeZO([{"params": [theta], "weight_decay": 0.2}], lr=0.1, eps=1e-3, seed=1, fold_updates=fold)
    opt.register_step_hook(HalveRates())
    log = SeedLog.attach(opt)
    calls = iter(range(100))
    for _ in range(4):
        try:
            opt.step(lambda: (theta - 1.0).pow(2) if next(calls) != 3 else 1 / 0)   # the second step fails once
        except ZeroDivisionError:
            pass
    opt.flush()
    replayed = torch.zeros(4, dtype=torch.float64)
    SeedLog.from_bytes(log.to_bytes()).replay_into(sz.MeZO([{"params": [replayed], "weight_decay": 0.2}], lr=0.1,
                                                           eps=1e-3))
    assert opt.step_count == 3 and torch.equal(theta, replayed) and bool((theta != 0).all())


# --- 9. a bare tensor or a lone group dict where a list of them is expected --------------------------------------
def test_a_lone_param_group_dict_is_refused_saying_so():
    """list() of the dict took its keys: 'expected tensors, got str'."""
    with pytest.raises(ValueError, match="a param group dict on its own"):
        sz.MeZO({"params": [torch.zeros(2)]}, lr=0.1)


def test_a_float32_master_of_a_bare_tensor_is_refused_as_mezo_refuses_it():
    """list() split the tensor into rows, each with its own master (and each its own z under MeZO)."""
    from sazo_lite.precision import Float32Master
    with pytest.raises(ValueError, match="Invalid params: expected an iterable of tensors, got a tensor"):
        Float32Master(torch.zeros(3, 2, dtype=torch.float16))
    with pytest.raises(ValueError, match="Invalid params: expected an iterable of tensors or dicts, got a tensor"):
        sz.MeZO(torch.zeros(3, 2), lr=0.1)


class ListSampler:
    """A sampler that hands out Python lists (indices and weights), as a hand-written one may."""

    def sample(self, batch_size):
        return [0, 1, 2][:batch_size], [0.1, 0.3, 0.7][:batch_size]

    def update(self, indices, diffs):
        pass


def test_train_records_a_list_samplers_largest_weight_as_the_step_read_it():
    """History.max_weight read a list of Python floats in float32 (0.30000001192092896 for 0.3); the step reads
    them in float64."""
    theta = torch.zeros(3, dtype=torch.float64)
    opt = sz.MeZO([theta], lr=0.01, eps=1e-3, seed=0)
    history = sz.train(opt, ListSampler(), lambda idx: (theta[torch.as_tensor(idx)] - 1.0).pow(2), steps=2,
                       batch_size=2, progress=False)
    assert history.max_weight == [0.3, 0.3]


@pytest.mark.parametrize("value", [torch.tensor([1.0, 2.0]), None, 1 + 2j, np.bool_(True), np.complex128(1.0)],
                         ids=["two entries", "None", "complex", "numpy bool", "numpy complex"])
def test_noise_scaled_step_refuses_what_evaluate_would_refuse_naming_projected_grad(value):
    """ĝ was read with float(): a tensor of two entries raised RuntimeError, None and complex TypeError, a numpy
    bool read 1.0 and a numpy complex dropped its imaginary part. One rule (train._number) now reads both."""
    rule = NoiseScaledStep(warmup=1)
    with pytest.raises(ValueError, match="Invalid projected_grad"):
        rule.observe(value)
    assert rule.seen == 0
    rule.observe(torch.tensor([3.0], requires_grad=True))
    assert rule.reference == 9.0


def test_a_sparse_mezo_of_a_meta_tensor_is_refused_by_mezos_rule():
    """The mask is read where it lies: moved to the meta device first (as this round first wrote the mask rule),
    its range check raised RuntimeError before MeZO could refuse the tensor."""
    with pytest.raises(ValueError, match="meta device"):
        SparseMeZO([torch.zeros(4, device="meta")], [torch.tensor([0, 2])], lr=0.1)

"""Round 11 of the library's red team: leftovers of rounds 8-10 and the training loop.

Each defect's test fails on the code before its fix.
"""
from __future__ import annotations

import fractions
import importlib
import json
import signal
import warnings

import numpy as np
import pytest
import torch

import sazo_lite as sz
from sazo_lite import variance
from sazo_lite.samplers import UniformSampler
from sazo_lite.seedlog import SeedLog
from sazo_lite.sparse import SparseMeZO, sparse_indices


def _loss(theta):
    return lambda: (theta - 1.0).pow(2)


def _logged_run(make, steps: int = 3):
    """θ after ``steps`` steps of the optimiser ``make(theta)`` builds from θ = 0 (float32 [6]), and their log."""
    theta = torch.zeros(6)
    opt = make(theta)
    log = SeedLog.attach(opt)
    for _ in range(steps):
        opt.step(_loss(theta))
    return theta, SeedLog.from_bytes(log.to_bytes())


# --- 1: a seed log names the step, not the class ----------------------------------------------------
class Quiet(sz.MeZO):
    """A user's subclass that adds nothing to the step (a method of its own, another constructor)."""

    def __init__(self, params, **kwargs):
        super().__init__(params, lr=0.1, **kwargs)

    def describe(self) -> str:
        return "quiet"


class Clipped(sz.MeZO):
    """A user's subclass that changes the step: the update's g is clipped to [-1, 1]."""

    def _update_jobs(self, seed, projected_grad, magnitudes=None):
        return super()._update_jobs(seed, max(-1.0, min(1.0, projected_grad)), magnitudes)


class MySparse(SparseMeZO):
    pass


def test_a_log_made_through_a_subclass_that_adds_nothing_to_the_step_replays_through_mezo():
    """The header held type(optimizer).__name__: a log of Quiet replayed only through Quiet, and replay(params)
    refused it."""
    theta, log = _logged_run(lambda t: Quiet([t], seed=4))
    assert log.header["optimizer"] == "MeZO"
    copy = torch.zeros(6)
    log.replay([copy])
    assert torch.equal(copy, theta)
    other = torch.zeros(6)
    log.replay_into(sz.MeZO([other], lr=0.0, seed=4))
    assert torch.equal(other, theta)


def test_a_mezo_log_replays_through_a_subclass_that_adds_nothing_to_the_step():
    theta, log = _logged_run(lambda t: sz.MeZO([t], lr=0.1, seed=4))
    copy = torch.zeros(6)
    log.replay_into(Quiet([copy], seed=4))
    assert torch.equal(copy, theta)


def test_a_subclass_that_changes_the_step_is_its_own_kind_and_mezo_cannot_replay_it():
    theta, log = _logged_run(lambda t: Clipped([t], lr=0.1, seed=2))
    assert log.header["optimizer"] == "Clipped"
    with pytest.raises(ValueError, match="Invalid optimizer"):
        log.replay_into(sz.MeZO([torch.zeros(6)], lr=0.0, seed=2))
    with pytest.raises(ValueError, match="written by Clipped"):
        log.replay([torch.zeros(6)])
    copy = torch.zeros(6)
    log.replay_into(Clipped([copy], lr=0.0, seed=2))
    assert torch.equal(copy, theta)
    _, plain = _logged_run(lambda t: sz.MeZO([t], lr=0.1, seed=2))
    with pytest.raises(ValueError, match="Invalid optimizer"):   # and the reverse
        plain.replay_into(Clipped([torch.zeros(6)], lr=0.0, seed=2))


def test_a_sparse_subclass_logs_sparse_mezo_and_a_plain_mezo_replay_is_still_refused():
    masks = sparse_indices([torch.zeros(6)], 0.5, seed=1)
    theta, log = _logged_run(lambda t: MySparse([t], masks, lr=0.1, seed=3))
    assert log.header["optimizer"] == "SparseMeZO"
    with pytest.raises(ValueError, match="Invalid optimizer"):
        log.replay_into(sz.MeZO([torch.zeros(6)], lr=0.0, seed=3))
    copy = torch.zeros(6)
    log.replay_into(SparseMeZO([copy], masks, lr=0.0, seed=3))
    assert torch.equal(copy, theta)


def test_a_log_written_before_under_the_subclasses_own_name_still_replays_through_it():
    theta, log = _logged_run(lambda t: Quiet([t], seed=4))
    head, _, body = log.to_bytes().partition(b"\n")
    header = json.loads(head)
    header["optimizer"] = "Quiet"   # what attach wrote before the step kind
    old = SeedLog.from_bytes(json.dumps(header).encode() + b"\n" + body)
    copy = torch.zeros(6)
    old.replay_into(Quiet([copy], seed=4))
    assert torch.equal(copy, theta)
    with pytest.raises(ValueError, match="Invalid optimizer"):
        old.replay_into(sz.MeZO([torch.zeros(6)], lr=0.0, seed=4))


# --- 2: .data re-pointed after construction ------------------------------------------------------------
def test_a_weight_tied_through_data_after_construction_is_refused_before_anything_moves():
    """_check_groups_unchanged compared the tensor objects only: a.data = b.data kept them, and each pass
    then moved the shared storage twice (2εz instead of εz)."""
    a, b = torch.nn.Parameter(torch.randn(5)), torch.nn.Parameter(torch.randn(5))
    opt = sz.MeZO([a, b], lr=0.1, seed=0, noise=None)
    opt.step(lambda: (a.sum() + b.sum()).reshape(1))
    a.data = b.data
    before = b.detach().clone()
    calls = []
    with pytest.raises(ValueError, match="share memory"):
        opt.step(lambda: calls.append(1) or (a.sum() + b.sum()).reshape(1))
    assert not calls and torch.equal(b, before) and opt.step_count == 1


def test_a_view_re_pointed_onto_its_neighbour_is_refused_and_a_harmless_re_point_steps():
    base = torch.zeros(2, 4)
    left, right = base[:, :2], base[:, 2:]
    opt = sz.MeZO([left, right], lr=0.1, noise=None)
    opt.step(lambda: (left.sum() + right.sum()).reshape(1))
    left.data = base[:, 1:3]   # now shares column 2 with right
    with pytest.raises(ValueError, match="share memory"):
        opt.step(lambda: (left.sum() + right.sum()).reshape(1))
    left.data = torch.zeros(2, 2)   # memory of its own: steps again
    opt.step(lambda: (left.sum() + right.sum()).reshape(1))
    assert opt.step_count == 2


def test_a_replay_through_an_optimiser_whose_tensors_were_tied_since_is_refused():
    theta, log = _logged_run(lambda t: sz.MeZO([t[:3], t[3:]], lr=0.1, seed=1, noise=None))
    copy = torch.zeros(6)
    first, second = copy[:3], copy[3:]
    opt = sz.MeZO([first, second], lr=0.0, seed=1, noise=None)
    SeedLog.attach(opt).detach()   # the groups checked once since construction (as by a step or a replay)
    first.data = second.data
    with pytest.raises(ValueError, match="share memory"):
        log.replay_into(opt)
    assert torch.equal(copy, torch.zeros(6))


@pytest.mark.parametrize("call", [1, 2])
def test_a_closure_that_re_points_data_is_refused_and_every_tensor_is_put_back(call):
    """Inside the step the groups' tensors were compared as objects only: a closure tying a.data to b.data
    committed the step, b moved by a's z too and a's own memory left at θ ± εz."""
    a, b = torch.nn.Parameter(torch.randn(3)), torch.nn.Parameter(torch.randn(3))
    own = a.data
    opt = sz.MeZO([a, b], lr=0.1, noise=None)
    opt.step(lambda: (a.sum() + b.sum()).reshape(1))
    start_a, start_b = a.detach().clone(), b.detach().clone()
    calls = []

    def closure():
        calls.append(1)
        if len(calls) == call:
            a.data = b.data
        return (a.sum() + b.sum()).reshape(1)

    with pytest.raises(ValueError, match="edited inside the step's closure"):
        opt.step(closure)
    assert a.data_ptr() == own.data_ptr() and opt.step_count == 1
    torch.testing.assert_close(a.detach(), start_a, rtol=0, atol=1e-6)
    torch.testing.assert_close(b.detach(), start_b, rtol=0, atol=1e-6)
    opt.step(lambda: (a.sum() + b.sum()).reshape(1))
    assert opt.step_count == 2


# --- 3: uniform probabilities in O(1) memory --------------------------------------------------------
def test_uniform_probs_of_a_huge_n_take_one_entry_and_train_records_them():
    """probs allocated N floats: N = 2⁶² (which UniformSampler draws from) ran out of memory, and
    train(record_probs=True) cloned them."""
    n = 2 ** 62
    sampler = UniformSampler(n, seed=0)
    probs = sampler.probs
    assert probs.shape == (n,) and probs.dtype == torch.float64
    assert probs.untyped_storage().nbytes() == 8 and float(probs[n - 1]) == 1.0 / n
    theta = torch.zeros(3)
    history = sz.train(sz.MeZO([theta], lr=0.1), sampler, lambda idx: (theta - 1).pow(2).sum().expand(len(idx)),
                       2, batch_size=2, log_every=1, record_probs=True, progress=False)
    assert len(history.probs) == 2
    assert all(p.shape == (n,) and p.untyped_storage().nbytes() == 8 for p in history.probs)


def test_uniform_probs_of_a_small_n_are_what_they_were():
    probs = UniformSampler(4).probs
    assert torch.equal(probs, torch.full((4,), 0.25, dtype=torch.float64))
    assert probs.numpy().tolist() == [0.25] * 4 and float(probs.sum()) == 1.0


def test_a_recorded_probability_vector_does_not_change_with_the_sampler():
    sampler = sz.SAZOSampler(5, seed=0)
    theta = torch.zeros(5)
    history = sz.train(sz.MeZO([theta], lr=0.05), sampler, lambda idx: (theta[idx] - idx.double()).pow(2),
                       4, batch_size=2, log_every=1, record_probs=True, progress=False)
    assert not torch.equal(history.probs[0], history.probs[-1])
    assert torch.equal(history.probs[-1], sampler.probs)


def test_train_reads_no_probs_unless_asked():
    class NoProbs(UniformSampler):
        @property
        def probs(self):
            raise AssertionError("probs read")

    theta = torch.zeros(3)
    history = sz.train(sz.MeZO([theta], lr=0.1), NoProbs(2 ** 62),
                       lambda idx: (theta - 1).pow(2).sum().expand(len(idx)), 3, batch_size=2, log_every=1,
                       progress=False)
    assert len(history.loss) == 3 and history.probs == []


# --- 4: the variance ratios at an optimum ----------------------------------------------------------
def _least_squares_optimum(n: int = 8, d: int = 32):
    """Per-example gradient norms |r_i|·‖x_i‖ at the least-squares optimum of an N ≤ d problem (every residual
    0 but for rounding), and the norms' size at θ = 0."""
    generator = torch.Generator().manual_seed(0)
    x = torch.randn(n, d, dtype=torch.float64, generator=generator)
    y = torch.randn(n, dtype=torch.float64, generator=generator)
    theta = torch.linalg.pinv(x) @ y
    return (x @ theta - y).abs() * x.norm(dim=1), float((y.abs() * x.norm(dim=1)).max())


def test_rounding_noise_at_an_optimum_counts_as_zero_below_the_callers_tolerance():
    norms, scale = _least_squares_optimum()
    assert 0 < float(norms.max()) < 1e-12 * scale   # every residual is rounding
    assert variance.uniform_gain(norms) > 1.0        # 1 + CV² of the noise: what the default still computes
    atol = 1e-10 * scale
    assert variance.uniform_gain(norms, atol=atol) == 1.0
    assert variance.variance_ratio(norms, torch.full((8,), 1 / 8, dtype=torch.float64), atol=atol) == 1.0


def test_a_tolerance_leaves_ordinary_norms_alone_and_zeroes_only_the_small_ones():
    norms = torch.tensor([1.0, 2.0, 3.0, 4.0], dtype=torch.float64)
    assert variance.uniform_gain(norms, atol=0.5) == variance.uniform_gain(norms)
    assert variance.uniform_gain(torch.tensor([1.0, 2.0, 1e-20]), atol=1e-12) == variance.uniform_gain([1.0, 2.0, 0.0])
    probs = torch.tensor([0.1, 0.2, 0.3, 0.4], dtype=torch.float64)
    assert variance.variance_ratio(norms, probs, atol=0.5) == variance.variance_ratio(norms, probs)


@pytest.mark.parametrize("atol", [-1.0, float("nan"), float("inf"), True, "1e-9"])
def test_a_bad_tolerance_is_refused(atol):
    with pytest.raises(ValueError, match="Invalid atol"):
        variance.uniform_gain([1.0, 2.0], atol=atol)
    with pytest.raises(ValueError, match="Invalid atol"):
        variance.variance_ratio([1.0, 2.0], [0.5, 0.5], atol=atol)


# --- the training loop ----------------------------------------------------------------------------
def _run(sampler=None, steps: int = 3, **kwargs):
    theta = torch.zeros(3)
    opt = sz.MeZO([theta], lr=0.1)
    history = sz.History()
    with warnings.catch_warnings():
        warnings.simplefilter("error")   # a numpy complex cast warned (ComplexWarning) and went on
        sz.train(opt, sampler if sampler is not None else UniformSampler(4, seed=0),
                 lambda idx: (theta - 1).pow(2).sum().expand(len(idx)).clone(), steps, batch_size=2,
                 log_every=1, progress=False, history=history, **kwargs)
    return history, opt


@pytest.mark.parametrize("value", [np.bool_(True), np.array(True), torch.tensor(True), torch.tensor([False]),
                                   np.complex128(1 + 2j), np.array([1 + 0j])],
                         ids=["numpy bool", "0-d bool array", "bool tensor", "one bool in a tensor", "numpy complex",
                              "complex array"])
def test_an_evaluate_result_that_is_a_numpy_or_torch_bool_or_complex_is_refused(value):
    """float() read a numpy or torch True as 1.0 (a Python True was refused) and dropped a numpy complex's
    imaginary part with a warning only."""
    with pytest.raises(ValueError, match="Invalid evaluate result"):
        _run(evaluate=lambda: value)


@pytest.mark.parametrize("value", [np.float32(0.5), np.array(0.5), torch.tensor([0.5], dtype=torch.float16), 2])
def test_real_evaluate_results_are_still_logged(value):
    history, _ = _run(evaluate=lambda: value)
    assert history.metrics == [float(value)] * 3


def test_stop_below_without_evaluate_is_refused_before_any_step():
    """stop_below is compared with evaluate()'s value: without evaluate it was ignored, the run never stopped."""
    with pytest.raises(ValueError, match="Invalid stop_below"):
        _run(stop_below=0.5)


def test_record_probs_with_a_sampler_without_probs_is_refused_before_any_step():
    """It raised AttributeError at the first log point, after log_every steps had moved θ."""
    class Bare:
        def sample(self, batch_size):
            return torch.zeros(batch_size, dtype=torch.long), torch.ones(batch_size, dtype=torch.float64)

        def update(self, indices, diffs):
            pass

    with pytest.raises(ValueError, match="Invalid sampler: record_probs"):
        _run(Bare(), record_probs=True)
    history, _ = _run(Bare())
    assert len(history.loss) == 3


def test_record_probs_does_not_compute_the_probs_to_check_for_them():
    calls = []
    sampler = sz.OracleSampler(4, lambda: calls.append(1) or torch.ones(4))
    _run(sampler, steps=2, record_probs=True)
    assert len(calls) == 2 * 2   # each step's sample and each log point, nothing more


@pytest.mark.parametrize("drawn", [torch.zeros(2, 2, dtype=torch.long), (torch.tensor(0), torch.tensor(1.0)),
                                   (torch.zeros(2, dtype=torch.long),), 7],
                         ids=["a [2, B] tensor", "0-d tensors", "one element", "a number"])
def test_a_sampler_that_returns_other_than_a_pair_of_b_entries_is_refused_naming_the_sampler(drawn):
    """A [2, B] tensor was unpacked as (indices, weights); 0-d tensors raised TypeError from len()."""
    class Odd(UniformSampler):
        def sample(self, batch_size):
            return drawn

    with pytest.raises(ValueError, match="Invalid sampler"):
        _run(Odd(4))


def test_a_batch_losses_that_edits_its_indices_in_place_changes_neither_the_second_call_nor_the_feedback():
    """The closure was given the sampler's own index tensor: idx.clamp_ in the first call changed the examples of
    the second (θ−εz) and the indices the sampler's update credited."""
    drawn, fed, calls = [], [], []

    class Recording(UniformSampler):
        def sample(self, batch_size):
            indices, weights = super().sample(batch_size)
            drawn.append(indices.clone())
            return indices, weights

        def update(self, indices, diffs):
            fed.append(torch.as_tensor(indices).clone())
            super().update(indices, diffs)

    theta = torch.zeros(4, dtype=torch.float64)

    def losses(idx):
        calls.append(idx.clone())
        idx.clamp_(max=0)
        return (theta[idx] - 1).pow(2)

    sz.train(sz.MeZO([theta], lr=0.1), Recording(4, seed=0), losses, 4, batch_size=3, progress=False)
    assert any(bool((d > 0).any()) for d in drawn)
    assert all(torch.equal(d, f) for d, f in zip(drawn, fed)) and len(fed) == 4
    assert all(torch.equal(calls[2 * k], calls[2 * k + 1]) for k in range(4))


class _Interrupting(list):
    """A History list whose ``append`` delivers a real SIGINT to this process once (Ctrl-C mid-record)."""

    def __init__(self):
        super().__init__()
        self.fired = False

    def append(self, item):
        super().append(item)
        if not self.fired:
            self.fired = True
            signal.raise_signal(signal.SIGINT)


def _lengths(history) -> tuple:
    steps = {len(history.queries), len(history.loss), len(history.projected_grad), len(history.max_weight),
             len(history.lr)}
    logged = {len(history.logged_steps), len(history.logged_queries), len(history.metrics), len(history.probs)}
    return steps, logged


@pytest.mark.parametrize("field", ["loss", "logged_queries"])
def test_a_ctrl_c_while_a_step_or_a_log_point_is_recorded_leaves_the_history_whole(field):
    """A SIGINT between two appends raised there: History.loss one longer than History.lr (or logged_queries than
    metrics), so the record no longer said which step had which rate."""
    history = sz.History(**{field: _Interrupting()})
    theta = torch.zeros(3)
    with pytest.raises(KeyboardInterrupt):
        sz.train(sz.MeZO([theta], lr=0.1), UniformSampler(4, seed=0),
                 lambda idx: (theta - 1).pow(2).sum().expand(len(idx)).clone(), 3, batch_size=2, log_every=1,
                 evaluate=lambda: 1.0, record_probs=True, progress=False, history=history)
    steps, logged = _lengths(history)
    assert len(steps) == 1 and len(logged) == 1


def test_a_probs_that_raises_at_a_log_point_logs_no_half_point():
    calls = []

    def norms():
        calls.append(1)
        if len(calls) == 2:   # the first log point's probs (the first call was the step's sample)
            raise RuntimeError("norms unavailable")
        return torch.ones(4)

    history = sz.History()
    with pytest.raises(RuntimeError, match="norms unavailable"):
        theta = torch.zeros(3)
        sz.train(sz.MeZO([theta], lr=0.1), sz.OracleSampler(4, norms),
                 lambda idx: (theta - 1).pow(2).sum().expand(len(idx)).clone(), 3, batch_size=2, log_every=1,
                 evaluate=lambda: 1.0, record_probs=True, progress=False, history=history)
    assert _lengths(history) == ({1}, {0})


def test_a_ctrl_c_between_the_steps_return_and_its_record_keeps_the_step(monkeypatch):
    """The record was made after the try around step: a KeyboardInterrupt arriving once step had returned (θ
    moved) and before History held it left the History one step behind θ."""
    train_module = importlib.import_module("sazo_lite.train")   # sazo_lite.train is also the function

    real, calls = train_module._record, []

    def interrupted_once(*args):
        calls.append(1)
        if len(calls) == 2:   # the second step's record: Ctrl-C just before it
            raise KeyboardInterrupt
        real(*args)

    monkeypatch.setattr(train_module, "_record", interrupted_once)
    theta = torch.zeros(3)
    opt = sz.MeZO([theta], lr=0.1)
    history = sz.History()
    with pytest.raises(KeyboardInterrupt):
        sz.train(opt, UniformSampler(4, seed=0), lambda idx: (theta - 1).pow(2).sum().expand(len(idx)).clone(), 5,
                 batch_size=2, progress=False, history=history)
    assert opt.step_count == 2 and len(history.loss) == 2 and history.queries == [4, 8]
    assert history.projected_grad[-1] == opt.last_step.projected_grad


@pytest.mark.parametrize("value", [10 ** 400, -(10 ** 400), fractions.Fraction(10 ** 400, 3)])
def test_an_evaluate_result_beyond_float64_is_refused_naming_evaluate(value):
    """float() raised a bare OverflowError ('int too large to convert to float') that did not say which callback."""
    with pytest.raises(ValueError, match="Invalid evaluate result"):
        _run(evaluate=lambda: value)


@pytest.mark.parametrize("value", [True, "2.0", b"2"])
def test_noise_scaled_step_refuses_a_bool_or_a_string_for_g(value):
    """float() read True as 1.0 and "2.0" as 2.0: the reference mean took them as steps."""
    rule = importlib.import_module("sazo_lite.train").NoiseScaledStep(warmup=1)
    with pytest.raises(ValueError, match="Invalid projected_grad"):
        rule.observe(value)
    assert rule.seen == 0
    rule.observe(torch.tensor(2.0))
    assert rule.seen == 1 and rule.reference == 4.0


@pytest.mark.parametrize("new", [lambda: torch.zeros(4), lambda: torch.zeros(2, 5).t()], ids=["smaller", "transposed"])
def test_a_sparse_mezo_tensor_re_pointed_off_its_mask_is_refused_at_every_step_before_anything_moves(new):
    """The masks index each tensor's flat entries: a .data re-pointed to a smaller tensor raised IndexError from
    inside the first pass, a non-contiguous one RuntimeError from view(-1)."""
    a, b = torch.zeros(10), torch.zeros(10)
    opt = SparseMeZO([a, b], [torch.tensor([8, 9]), torch.tensor([1])], lr=0.1)
    opt.step(lambda: (a.sum() + b.sum()).reshape(1))
    a.data = new()
    before = b.clone()
    for _ in range(2):   # still refused at the next step: the failed check is not taken as done
        with pytest.raises(ValueError, match="mask"):
            opt.step(lambda: (a.sum() + b.sum()).reshape(1))
    assert torch.equal(b, before) and opt.step_count == 1
    a.data = torch.zeros(10)   # a tensor its mask fits: steps again
    opt.step(lambda: (a.sum() + b.sum()).reshape(1))
    assert opt.step_count == 2

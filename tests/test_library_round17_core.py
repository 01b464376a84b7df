"""Round 17 of the library's red team on the optimiser core (engine, noise, validation, precision, sparse).

Each defect's test fails on the code before its fix.
"""
from __future__ import annotations

import array
import itertools
import math
import warnings
from fractions import Fraction

import numpy as np
import pytest
import torch
from hypothesis import given, settings, strategies as st

from sazo_lite.engine import MeZO, NoiseSourceWarning, _overlaps_itself
from sazo_lite.noise import GaussianTable, NoiseTable, TorchNoise, describe
from sazo_lite.validation import dense_tensor


# --- 1. the step's loss, per-example losses and g past float64's half range -------------------------------------
def _constant_step(plus, minus, weights=None, eps=1e-3):
    """One step whose closure returns ``plus`` then ``minus`` (float64 tensors or numbers); returns the ZOStep."""
    theta = torch.zeros(3, dtype=torch.float64)
    calls = iter([plus, minus])
    opt = MeZO([theta], lr=0.0, eps=eps, seed=1)
    return opt.step(lambda: next(calls), weights)


def _exact(values) -> float:
    """The mean of finite floats within a few ulps (math.fsum of each value over their number: no overflow)."""
    return math.fsum(float(v) / len(values) for v in values)


@pytest.mark.parametrize("plus, minus", [([1.5e308, 1e308], [1.5e308, 1e308]), ([1.7e308, -1e300], [1.7e308, 2.0]),
                                         (1.7e308, 1.7e308 - 1e293), ([1.7e308, 1.7e308], [1.7e308, 1.7e308])])
def test_the_loss_of_huge_finite_losses_is_their_finite_mean(plus, minus):
    """ZOStep.loss and .losses were (L+ + L−)/2 and their mean: inf for losses above ~9e307, whose mean is finite."""
    result = _constant_step(torch.tensor(plus, dtype=torch.float64), torch.tensor(minus, dtype=torch.float64))
    pairs = list(zip(np.atleast_1d(plus), np.atleast_1d(minus)))
    means = [a / 2 + b / 2 for a, b in pairs]
    assert math.isfinite(result.loss)
    assert result.loss == pytest.approx(_exact(means), rel=1e-15)
    if isinstance(plus, list):
        assert torch.equal(result.losses, torch.tensor(means, dtype=torch.float64))


def test_the_weighted_loss_is_finite_where_the_products_overflow():
    """mean(w · L) with w·L past float64 for one example but a finite mean: it read inf."""
    weights = torch.tensor([1.9, 0.1], dtype=torch.float64)
    losses = torch.tensor([1.5e308, 1e308], dtype=torch.float64)
    result = _constant_step(losses, losses, weights)
    assert result.loss == pytest.approx(1.5e308 * 0.95 + 1e308 * 0.05, rel=1e-15)


def test_the_projected_gradient_is_finite_where_the_difference_overflows():
    """L+ − L− overflowed (1.5e308 − (−1.5e308)) although (L+ − L−)/(2ε) is finite for ε = 1: FloatingPointError."""
    huge = torch.tensor([1.5e308], dtype=torch.float64)
    result = _constant_step(huge, -huge, eps=1.0)
    assert result.projected_grad == 1.5e308 and result.directional_diffs.tolist() == [1.5e308]
    assert result.loss == 0.0


def test_a_truly_infinite_gradient_is_still_refused_with_theta_restored():
    """Where the true g is beyond float64 (ε small), the step still raises FloatingPointError, θ restored."""
    huge = torch.tensor([1.5e308], dtype=torch.float64)
    theta = torch.linspace(-1, 1, 3, dtype=torch.float64)
    start, calls = theta.clone(), iter([huge, -huge])
    opt = MeZO([theta], lr=0.1, eps=1e-3, seed=1)
    with pytest.raises(FloatingPointError):
        opt.step(lambda: next(calls))
    assert torch.allclose(theta, start, rtol=0, atol=1e-15) and opt.step_count == 0


@settings(max_examples=60, deadline=None)
@given(st.lists(st.tuples(st.floats(-1e6, 1e6), st.floats(-1e6, 1e6), st.floats(0, 10)), min_size=1, max_size=6))
def test_ordinary_losses_give_the_old_values_bit_for_bit(rows):
    """Below the overflow the loss, losses, diffs and g are the plain formulas' bit for bit."""
    plus = torch.tensor([r[0] for r in rows], dtype=torch.float64)
    minus = torch.tensor([r[1] for r in rows], dtype=torch.float64)
    weights = torch.tensor([r[2] for r in rows], dtype=torch.float64)
    result = _constant_step(plus, minus, weights)
    diffs = (plus - minus) / (2.0 * 1e-3)
    assert torch.equal(result.directional_diffs, diffs)
    assert result.projected_grad == float((diffs * weights).mean())
    assert torch.equal(result.losses, (plus + minus) / 2.0)
    assert result.loss == float(((plus + minus) / 2.0 * weights).mean())


# --- 2. closure results (and weights) that hold no numbers --------------------------------------------------------
def _spent():
    yield 1.0


NOT_NUMBERS = {"bytearray": lambda: bytearray(b"\x01\x02"), "bytes": lambda: b"\x01\x02",
               "memoryview": lambda: memoryview(b"\x01\x02"), "numpy bytes": lambda: np.bytes_(b"\x01\x02"),
               "str": lambda: "1.5", "dict": lambda: {"loss": 1.0}, "None": lambda: None, "generator": _spent,
               "set": lambda: {1.0}, "object": object}


@pytest.mark.parametrize("make", NOT_NUMBERS.values(), ids=NOT_NUMBERS.keys())
def test_a_closure_result_holding_no_numbers_is_a_type_error_naming_it(make):
    """A bytearray (or a memoryview of bytes) was read as its byte values: losses 1.0 and 2.0 and a step taken.
    Every result of a kind that holds no numbers is now a TypeError (also a ValueError, as before) naming the
    closure's result and what is expected, with θ restored and the step count unchanged."""
    theta = torch.linspace(-1, 1, 4, dtype=torch.float64)
    start = theta.clone()
    opt = MeZO([theta], lr=0.1, eps=1e-3, seed=0)
    with pytest.raises(TypeError, match="Invalid closure result: .*expected the losses: a tensor, a number") as info:
        opt.step(make)
    assert isinstance(info.value, ValueError)
    assert torch.allclose(theta, start, rtol=0, atol=1e-15) and opt.step_count == 0


@pytest.mark.parametrize("make", [NOT_NUMBERS["bytearray"], NOT_NUMBERS["memoryview"], NOT_NUMBERS["dict"]],
                         ids=["bytearray", "memoryview", "dict"])
def test_weights_holding_no_numbers_are_a_type_error_before_anything_moves(make):
    """Weights given as a bytearray were read as byte values (weights 1 and 2)."""
    theta = torch.zeros(2, dtype=torch.float64)
    opt = MeZO([theta], lr=0.1, eps=1e-3, seed=0)
    with pytest.raises(TypeError, match="Invalid weights"):
        opt.step(lambda: theta + 1.0, weights=make())
    assert torch.equal(theta, torch.zeros(2, dtype=torch.float64)) and opt.step_count == 0


def test_dense_tensor_refuses_bytes_like_values_by_name():
    """``dense_tensor`` (sampler feedback, sum-tree weights, variance helpers) read a bytearray as uint8 numbers."""
    for value in (bytearray(b"\x01\x02"), b"\x01", memoryview(b"\x03")):
        with pytest.raises(TypeError, match="Invalid indices: .*bytes-like"):
            dense_tensor("indices", value)


class _Losses:
    """A sequence torch reads (indexable, with a length) that is not registered as collections.abc.Sequence."""

    def __len__(self):
        return 2

    def __getitem__(self, index):
        return (0.5, 1.5)[index]


@pytest.mark.parametrize("value", [range(2), array.array("d", [0.5, 1.5]), (0.5, 1.5), np.float64(0.5), _Losses()],
                         ids=["range", "array.array", "tuple", "numpy float", "unregistered sequence"])
def test_sequences_and_numbers_are_still_read(value):
    theta = torch.zeros(2, dtype=torch.float64)
    opt = MeZO([theta], lr=0.0, eps=1e-3, seed=0)
    expected = np.atleast_1d(np.asarray(list(value) if not isinstance(value, (tuple, np.generic)) else value, float))
    assert opt.step(lambda: value).loss == pytest.approx(float(expected.mean()))


# --- 3. NoiseSourceWarning compares the z drawn, not the source's name -------------------------------------------
def _run(noise, perturbation, steps=3, state=None, theta=None):
    theta = torch.linspace(-1, 1, 40, dtype=torch.float64) if theta is None else theta
    opt = MeZO([theta], lr=0.05, eps=1e-3, seed=3, noise=noise, perturbation=perturbation)
    if state is not None:
        opt.load_state_dict(state)
    for _ in range(steps):
        opt.step(lambda: ((theta - 0.5) ** 2).reshape(4, 10).sum(1))
    return theta, opt


SWITCHES = {"table to plain": (lambda: GaussianTable(size=64, chunk=16), lambda: None),
            "plain to table": (lambda: None, lambda: GaussianTable(size=64, chunk=16)),
            "torch to table": (lambda: TorchNoise(workers=1, chunk=16), lambda: GaussianTable(size=64, chunk=16)),
            "table to other table": (lambda: GaussianTable(size=64, chunk=16),
                                     lambda: GaussianTable(size=64, chunk=16, seed=1))}


@pytest.mark.parametrize("switch", SWITCHES, ids=SWITCHES.keys())
def test_a_rademacher_run_switched_between_table_and_plain_loop_resumes_without_a_false_warning(switch):
    """A GaussianTable draws Rademacher z with TorchNoise's signs: a Rademacher-only run saved with one and
    loaded into the other (or into another table) resumes bit for bit, and was warned NoiseSourceWarning."""
    saved_source, loaded_source = SWITCHES[switch]
    _, opt = _run(saved_source(), "rademacher")
    state = opt.state_dict()
    with warnings.catch_warnings():
        warnings.simplefilter("error", NoiseSourceWarning)
        resumed, _ = _run(loaded_source(), "rademacher", state=state, theta=opt.param_groups[0]["params"][0].clone())
    reference, _ = _run(saved_source(), "rademacher", steps=6)
    assert torch.equal(resumed, reference)


@pytest.mark.parametrize("switch", SWITCHES, ids=SWITCHES.keys())
def test_a_gaussian_run_switched_between_those_sources_is_still_warned(switch):
    """Gaussian z do differ between a table and the plain loop (or two tables): the warning stays."""
    saved_source, loaded_source = SWITCHES[switch]
    _, opt = _run(saved_source(), "gaussian")
    state = opt.state_dict()
    with pytest.warns(NoiseSourceWarning):
        _run(loaded_source(), "gaussian", steps=0, state=state)


def test_a_run_mixing_gaussian_and_rademacher_groups_is_still_warned():
    theta, other = torch.zeros(8, dtype=torch.float64), torch.zeros(8, dtype=torch.float64)

    def make(noise):
        return MeZO([{"params": [theta], "perturbation": "rademacher"}, {"params": [other]}], lr=0.1, eps=1e-3,
                    noise=noise)

    state = make(GaussianTable(size=64, chunk=16)).state_dict()
    with pytest.warns(NoiseSourceWarning):
        make(None).load_state_dict(state)


@pytest.mark.parametrize("other", [lambda: NoiseTable(size=64, chunk=16)], ids=["noise table"])
def test_a_rademacher_run_switched_to_a_source_of_other_signs_is_still_warned(other):
    """NoiseTable draws its signs from its own table: other z than the plain loop's, warned."""
    _, opt = _run(None, "rademacher")
    with pytest.warns(NoiseSourceWarning):
        _run(other(), "rademacher", steps=0, state=opt.state_dict())
    _, opt = _run(other(), "rademacher")
    with pytest.warns(NoiseSourceWarning):
        _run(GaussianTable(size=64, chunk=16), "rademacher", steps=0, state=opt.state_dict())
    assert describe(other()) != "torch"


# --- 4. a tensor whose strides interleave without a common entry ------------------------------------------------
def _brute_overlaps(shape, strides) -> bool:
    offsets = [sum(i * s for i, s in zip(index, strides)) for index in itertools.product(*map(range, shape))]
    return len(set(offsets)) < len(offsets)


@settings(max_examples=300, deadline=None)
@given(st.lists(st.tuples(st.integers(0, 5), st.integers(0, 13)), min_size=1, max_size=4))
def test_overlaps_itself_is_exact_against_a_brute_force_reference(dims):
    """The test was sufficient only: shape (4, 3) with strides (5, 6) (offsets 0..21, all distinct) was refused
    as mapping several entries to one location."""
    shape, strides = [d[0] for d in dims], [d[1] for d in dims]
    t = torch.zeros(1 + 4 * 13 * 4).as_strided(shape, strides)   # room for the farthest entry
    assert _overlaps_itself(t) == _brute_overlaps(shape, strides)


def test_an_interleaved_as_strided_parameter_is_accepted_and_steps_as_a_copy_would():
    base = torch.zeros(28, dtype=torch.float64)
    p = base.as_strided((4, 3), (5, 6))
    copy = p.clone()
    opt, twin = MeZO([p], lr=0.1, eps=1e-3, seed=3), MeZO([copy], lr=0.1, eps=1e-3, seed=3)
    for _ in range(3):
        opt.step(lambda: (p - 1).pow(2).sum())
        twin.step(lambda: (copy - 1).pow(2).sum())
    assert torch.equal(p, copy)
    assert float(base[[1, 2, 3, 4]].abs().sum()) == 0.0   # memory between the entries untouched


def test_truly_overlapping_strides_are_still_refused():
    with pytest.raises(ValueError, match="maps several entries to one memory location"):
        MeZO([torch.zeros(30).as_strided((4, 3), (2, 3))], lr=0.1)   # (3, 0) and (0, 2): offset 6
    with pytest.raises(ValueError, match="maps several entries"):
        MeZO([torch.zeros(3, 1).expand(3, 4)], lr=0.1)


def test_subnormal_losses_keep_the_old_mean_bit_for_bit():
    """L+/2 + L−/2 would round 5e-324 to 0; the fallback is used only where L+ + L− overflows."""
    tiny = torch.tensor([5e-324, 1e-320], dtype=torch.float64)
    result = _constant_step(tiny, tiny)
    assert torch.equal(result.losses, tiny) and result.loss == float(tiny.mean())


@settings(max_examples=80, deadline=None)
@given(st.lists(st.floats(-1.7e308, 1.7e308), min_size=1, max_size=8),
       st.lists(st.floats(0, 8.0), min_size=8, max_size=8))
def test_the_weighted_loss_matches_an_exact_reference_on_huge_losses(losses, weights):
    """mean(w · L) against the exact rational mean: finite, and right within rounding of the terms' size, wherever
    the exact value is below float64's max (it read inf once a product or the sum passed it)."""
    plus = torch.tensor(losses, dtype=torch.float64)
    w = torch.tensor(weights[:len(losses)], dtype=torch.float64)
    terms = [Fraction(wk) * Fraction(lk) / len(losses) for wk, lk in zip(weights, losses)]
    exact, size = sum(terms), sum(map(abs, terms))   # exact: no float on the way (fsum overflowed in between)
    result = _constant_step(plus, plus, w)
    if abs(exact) < 1.7e308:
        assert math.isfinite(result.loss)   # within rounding of the terms' size (they may cancel)
        assert abs(Fraction(result.loss) - exact) <= Fraction(1e-12) * size + Fraction(1e-300)


# --- 5. a group of frozen tensors added after construction ---------------------------------------------------------
def test_a_frozen_group_added_beside_trainable_tensors_warns_as_the_constructor_does():
    """MeZO warns at construction when the tensors mix requires_grad=False with True (every tensor given is tuned);
    a frozen group added later with add_param_group was tuned without a word."""
    trainable, frozen = torch.zeros(3, requires_grad=True), torch.ones(2)
    start = frozen.clone()
    opt = MeZO([trainable], lr=0.1, eps=1e-3, noise=None)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        opt.add_param_group({"params": [frozen]})
    told = [w for w in caught if "requires_grad=False" in str(w.message)]
    assert len(told) == 1 and told[0].filename == __file__
    opt.step(lambda: (trainable - 1).pow(2).sum() + (frozen - 1).pow(2).sum())
    assert not torch.equal(frozen, start)   # what the warning says: the frozen tensor moves too


def test_groups_that_keep_the_mix_as_it_was_are_not_warned_again():
    """Trainable beside trainable, frozen beside frozen, or a mix the constructor already warned of: no new warning."""
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        opt = MeZO([torch.zeros(3, requires_grad=True)], lr=0.1)
        opt.add_param_group({"params": [torch.zeros(2, requires_grad=True)]})
        all_frozen = MeZO([torch.zeros(3)], lr=0.1)
        all_frozen.add_param_group({"params": [torch.zeros(2)]})
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        mixed = MeZO([torch.zeros(3), torch.zeros(1, requires_grad=True)], lr=0.1)
        mixed.add_param_group({"params": [torch.zeros(2)]})
    assert len([w for w in caught if "requires_grad=False" in str(w.message)]) == 1   # the constructor's


def test_a_tensor_living_between_an_interleaved_views_entries_is_its_own_parameter():
    """base[1:5] lies in the gaps of as_strided((4, 3), (5, 6)) (offsets 0, 5, 6, 10, ...): both are accepted (no
    common entry, checked entry by entry) and each steps as a copy of it would."""
    base = torch.zeros(28, dtype=torch.float64)
    p, q = base.as_strided((4, 3), (5, 6)), base[1:5]
    copies = [p.clone(), q.clone()]
    opt, twin = MeZO([p, q], lr=0.1, eps=1e-3, seed=5), MeZO(copies, lr=0.1, eps=1e-3, seed=5)
    for _ in range(3):
        opt.step(lambda: (p - 1).pow(2).sum() + (q + 1).pow(2).sum())
        twin.step(lambda: (copies[0] - 1).pow(2).sum() + (copies[1] + 1).pow(2).sum())
    assert torch.equal(p, copies[0]) and torch.equal(q, copies[1])
    with pytest.raises(ValueError, match="share memory"):
        MeZO([p, base[4:7]], lr=0.1)   # offset 5 is p's (1, 0) entry


# --- 6. a noise source's settings edited after construction -----------------------------------------------------
@pytest.mark.parametrize("make, name, value", [
    (lambda: GaussianTable(size=64, chunk=16), "seed", 1), (lambda: GaussianTable(size=64, chunk=16), "size", 128),
    (lambda: GaussianTable(size=64, chunk=16), "chunk", 32), (lambda: NoiseTable(size=256, chunk=16), "seed", 1),
    (lambda: NoiseTable(size=256, chunk=16), "size", 512)], ids=["table seed", "table size", "table chunk",
                                                                 "noise table seed", "noise table size"])
def test_a_table_source_edited_after_construction_is_refused_before_any_pass(make, name, value):
    """A GaussianTable or NoiseTable whose seed was edited between steps went on drawing from the table built
    before while its directions (what a state or a seed log records) named the new seed; an edited size raised from
    inside a pass. Its settings are fixed at construction: a step after the edit is refused, θ unchanged."""
    noise = make()
    theta, before, opt = _edited_run_refused(noise, lambda n: setattr(n, name, value))
    assert torch.equal(theta, before) and opt.step_count == 1


def _edited_run_refused(noise, edit):
    theta = torch.linspace(-1, 1, 200)
    opt = MeZO([theta], lr=0.05, eps=1e-2, seed=4, noise=noise)
    closure = lambda: (theta - 0.3).pow(2).reshape(4, 50).sum(1)   # noqa: E731
    opt.step(closure)
    edit(noise)
    before = theta.clone()
    with pytest.raises(ValueError, match="Invalid settings: .*since it was built"):
        opt.step(closure)
    return theta, before, opt


def test_a_torch_noise_chunk_edited_to_a_non_multiple_of_16_is_refused_and_a_valid_one_draws_the_same_z():
    """TorchNoise's chunk edited to 24 after construction drew other z than the plain loop's (randn's 16-wide
    blocks): refused by name now; an edit to another multiple of 16 draws the plain loop's z (buffers follow)."""
    noise = TorchNoise(workers=1, chunk=32)
    theta = torch.linspace(-1, 1, 200)
    opt = MeZO([theta], lr=0.05, eps=1e-2, seed=4, noise=noise)
    closure = lambda: (theta - 0.3).pow(2).reshape(4, 50).sum(1)   # noqa: E731
    opt.step(closure)
    noise.chunk = 24
    before = theta.clone()
    with pytest.raises(ValueError, match="Invalid chunk: 24"):
        opt.step(closure)
    assert torch.equal(theta, before) and opt.step_count == 1
    noise.chunk = 64
    opt.step(closure)
    reference = torch.linspace(-1, 1, 200)
    plain = MeZO([reference], lr=0.05, eps=1e-2, seed=4, noise=None)
    for _ in range(2):
        plain.step(lambda: (reference - 0.3).pow(2).reshape(4, 50).sum(1))
    assert torch.equal(theta, reference)


def test_a_triton_block_edited_to_a_non_power_of_two_is_refused_by_name():
    """TritonNoise checked its block at construction only: an edit reached the kernel (a compile error inside a
    pass on a GPU), or was ignored where the kernel cannot run."""
    from sazo_lite.kernels import TritonNoise

    noise = TritonNoise(block=1024)
    theta = torch.linspace(-1, 1, 8)
    opt = MeZO([theta], lr=0.05, eps=1e-2, seed=4, noise=noise)
    noise.block = 1000
    with pytest.raises(ValueError, match="Invalid block: 1000"):
        opt.step(lambda: (theta - 0.3).pow(2))
    assert torch.equal(theta, torch.linspace(-1, 1, 8)) and opt.step_count == 0


# --- 7. a nested tensor given as a parameter ------------------------------------------------------------------------
def test_a_nested_tensor_parameter_is_refused_by_name():
    """A (strided) nested tensor passed the layout check and raised torch's 'Internal error: NestedTensorImpl doesn't
    support strides' from the overlap check, at construction, in add_param_group and between steps."""
    with warnings.catch_warnings():   # torch: "the PyTorch API of nested tensors is in prototype stage"
        warnings.simplefilter("ignore", UserWarning)
        nested = torch.nested.nested_tensor([torch.zeros(2), torch.zeros(3)])
    with pytest.raises(ValueError, match="Invalid params: .*nested"):
        MeZO([nested], lr=0.1)
    theta = torch.zeros(2)
    opt = MeZO([theta], lr=0.1)
    with pytest.raises(ValueError, match="Invalid params: .*nested"):
        opt.add_param_group({"params": [nested]})
    opt.param_groups[0]["params"].append(nested)
    with pytest.raises(ValueError, match="Invalid params: .*nested"):
        opt.step(lambda: theta.sum())
    assert torch.equal(theta, torch.zeros(2)) and opt.step_count == 0


def test_an_edited_table_source_still_describes_the_table_it_draws_from():
    """After an edit, directions / describe (what state_dict and a seed log record) named the edited seed while the
    z came from the table built with the old one."""
    table, other = GaussianTable(size=64, chunk=16), NoiseTable(size=256, chunk=16)
    names = table.directions, describe(other)
    table.seed, other.seed = 1, 1
    assert (table.directions, describe(other)) == names

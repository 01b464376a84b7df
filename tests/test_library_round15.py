"""Round 15 of the library's red team: numpy arrays torch cannot view, bools among numbers, a sparse state loaded
into a dense MeZO, make_sampler's settings per sampler, the language-model diagnostics' sum rule, and what the
hunt in validation.py and engine.py found.

Each defect's test fails on the code before its fix.
"""
from __future__ import annotations

import numpy as np
import pytest
import torch

from sazo_lite.samplers import SAZOSampler, StaleCorrectedSAZOSampler
from sazo_lite.sumtree import SumTree
from sazo_lite.validation import dense_tensor
from test_hostile_core import _same_state  # two states hold the same values


# --- 1. numpy arrays torch.as_tensor cannot view ---------------------------------------------------------------
ODD_ARRAYS = {"reversed": lambda a: a[::-1], "reversed columns": lambda a: a.reshape(2, -1)[:, ::-1],
              "big-endian": lambda a: a.astype(a.dtype.newbyteorder(">")),
              "big-endian, reversed": lambda a: a.astype(a.dtype.newbyteorder(">"))[::-1]}


@pytest.mark.parametrize("make", ODD_ARRAYS.values(), ids=ODD_ARRAYS.keys())
@pytest.mark.parametrize("dtype", [np.int64, np.float32, np.float64])
def test_a_numpy_array_torch_cannot_view_is_read_as_its_contiguous_copy(make, dtype):
    """torch.as_tensor raised ValueError on negative strides and on a non-native byte order, which dense_tensor
    reported as 'expected a tensor of numbers': a reversed index array or a big-endian file was refused."""
    odd = make(np.arange(6, dtype=dtype))
    tensor = dense_tensor("x", odd)
    assert tensor.dtype == torch.from_numpy(np.arange(1, dtype=dtype)).dtype
    assert tensor.tolist() == np.ascontiguousarray(odd).tolist()


def test_a_big_endian_number_keeps_its_shape():
    assert dense_tensor("x", np.array(2.5, dtype=">f8")).shape == ()


def test_a_sampler_and_a_sum_tree_take_reversed_numpy_indices_as_their_copies():
    reversed_indices, diffs = np.arange(4)[::-1], np.linspace(0.5, 2.0, 4)[::-1]
    sampler, twin = SAZOSampler(6, seed=0), SAZOSampler(6, seed=0)
    sampler.update(reversed_indices, diffs)
    twin.update(reversed_indices.copy(), diffs.copy())
    assert torch.equal(sampler.estimates, twin.estimates) and torch.equal(sampler.probs, twin.probs)
    tree, copy = SumTree(torch.ones(6, dtype=torch.float64)), SumTree(torch.ones(6, dtype=torch.float64))
    tree.update(reversed_indices, diffs)
    copy.update(reversed_indices.copy(), diffs.copy())
    assert torch.equal(tree.tree, copy.tree)
    assert torch.equal(tree.weights(np.arange(6)[::-1]), copy.weights(np.arange(6)[::-1].copy()))


# --- 2. bools among numbers -----------------------------------------------------------------------------------
MIXED = {"int and True": [1, True], "True and int": (True, 2), "numpy int and True": [np.int64(1), True],
         "0-d bool tensor": [torch.tensor(1), torch.tensor(True)], "nested": [[1], [True]],
         "float and True": [0.5, True]}


@pytest.mark.parametrize("value", MIXED.values(), ids=MIXED.keys())
def test_a_list_mixing_bools_with_numbers_is_refused(value):
    with pytest.raises(ValueError, match="Invalid x: .*it holds a bool"):
        dense_tensor("x", value)


def test_a_bool_among_a_samplers_indices_is_refused_with_the_sampler_unchanged():
    """update([1, True], d) counted example 1 twice (True read as 1), and [0.5, True] diffs read 1.0."""
    sampler = StaleCorrectedSAZOSampler(4, seed=0)
    sampler.update([0, 2], [0.5, 1.5])
    before = sampler.state_dict()
    with pytest.raises(ValueError, match="Invalid indices"):
        sampler.update([1, True], [0.5, 1.0])
    with pytest.raises(ValueError, match="Invalid directional_diffs"):
        sampler.update([1, 3], [0.5, True])
    assert _same_state(sampler.state_dict(), before)


def test_a_bool_among_a_sum_trees_indices_or_weights_is_refused_with_its_sums_unchanged():
    tree = SumTree(torch.ones(4, dtype=torch.float64))
    with pytest.raises(ValueError, match="Invalid indices"):
        tree.update([1, True], [5.0, 7.0])
    with pytest.raises(ValueError, match="Invalid weights"):
        tree.update([1, 2], [5.0, True])
    assert tree.tree.tolist() == SumTree(torch.ones(4, dtype=torch.float64)).tree.tolist()


def test_lists_of_plain_numbers_and_of_bools_alone_read_as_before():
    """Only a mix is refused: numbers as before, and a list of bools alone keeps its dtype for the callers' own
    message (tests/test_library_round7.py pins 'Invalid directional_diffs' for [True, False])."""
    assert dense_tensor("x", [1, 2]).dtype == torch.int64 and dense_tensor("x", [0.1, 2]).tolist() == [0.1, 2.0]
    assert dense_tensor("x", [True, False]).dtype == torch.bool
    assert dense_tensor("x", [torch.tensor(1.5), torch.tensor(2.5)]).tolist() == [1.5, 2.5]


# --- 3. a SparseMeZO's state loaded into a dense MeZO ---------------------------------------------------------
from sazo_lite import MeZO  # noqa: E402
from sazo_lite.sparse import SparseMeZO, sparse_indices  # noqa: E402


def _quadratic(theta: torch.Tensor):
    return lambda: ((theta - 1.0) ** 2).unsqueeze(0).sum(dim=1)


def _sparse_run(steps: int = 3) -> tuple[SparseMeZO, torch.Tensor]:
    theta = torch.zeros(40, dtype=torch.float64)
    opt = SparseMeZO([theta], sparse_indices([theta], 0.25, seed=3), lr=0.05, eps=1e-3, seed=2, noise=None)
    for _ in range(steps):
        opt.step(_quadratic(theta))
    return opt, theta


def test_a_sparse_mezo_state_is_refused_by_a_dense_mezo_with_the_optimiser_unchanged():
    """The dense MeZO ignored mask_digests and took the step and seed: the resumed run perturbed and updated every
    entry of θ, where the saved run moved a quarter of them, without a word."""
    sparse, _ = _sparse_run()
    theta = torch.zeros(40, dtype=torch.float64)
    dense = MeZO([theta], lr=0.05, eps=1e-3, seed=9, noise=None)
    before = dense.state_dict()
    with pytest.raises(ValueError, match="Invalid state_dict: a SparseMeZO's state"):
        dense.load_state_dict(sparse.state_dict())
    assert dense.state_dict() == before and dense.step_count == 0 and dense.next_seed() == MeZO(
        [torch.zeros(1)], lr=0.1, seed=9).next_seed()


def test_a_sparse_mezo_state_still_resumes_a_sparse_mezo_bit_for_bit():
    saved, theta = _sparse_run()
    state, copy = saved.state_dict(), theta.clone()
    resumed = SparseMeZO([copy], sparse_indices([copy], 0.25, seed=3), lr=0.05, eps=1e-3, seed=0, noise=None)
    resumed.load_state_dict(state)
    for _ in range(2):
        saved.step(_quadratic(theta))
        resumed.step(_quadratic(copy))
    assert torch.equal(theta, copy) and int((theta != 0).sum()) <= 10


def test_a_dense_mezo_state_still_loads_into_a_dense_mezo_and_a_sparse_one():
    """A plain MeZO's state carries no digests: it loads into either, as before (states written before round 14)."""
    theta = torch.zeros(40, dtype=torch.float64)
    dense = MeZO([theta], lr=0.05, eps=1e-3, seed=5, noise=None)
    dense.step(_quadratic(theta))
    state = dense.state_dict()
    other = MeZO([torch.zeros(40, dtype=torch.float64)], lr=0.05, eps=1e-3, noise=None)
    other.load_state_dict(state)
    sparse, _ = _sparse_run(0)
    sparse.load_state_dict(state)
    assert other.next_seed() == sparse.next_seed() == dense.next_seed()


# --- 4. make_sampler: each sampler reads its own settings -----------------------------------------------------
from sazo_lite.samplers import make_sampler  # noqa: E402


def test_make_sampler_gives_the_oracle_oracle_mix_and_the_sazo_rules_uniform_mix():
    """Pinned, not changed: race and query_run pass uniform_mix (SAZO's λ) to every sampler they compare, the
    oracle among them, so a refusal would break them and a pass-through would change their exact oracle. The
    oracle's λ is oracle_mix (documented in make_sampler's docstring)."""
    norms = torch.linspace(0.0, 2.0, 8, dtype=torch.float64)
    oracle = make_sampler("oracle", 8, norms_fn=lambda: norms, uniform_mix=0.3)
    assert oracle.uniform_mix == 0.0 and float(oracle.probs[0]) == 0.0
    mixed = make_sampler("oracle", 8, norms_fn=lambda: norms, uniform_mix=0.3, oracle_mix=0.5)
    assert mixed.uniform_mix == 0.5 and float(mixed.probs[0]) == pytest.approx(0.5 / 8)
    assert make_sampler("sazo", 8, uniform_mix=0.3, oracle_mix=0.5).uniform_mix == 0.3


# --- 5. sampling_diagnostics: one sum rule, the variance helpers' --------------------------------------------
from sazo_lite.llm.queries import sampling_diagnostics  # noqa: E402


@pytest.mark.parametrize("probs", [[2.0, 3.0, 5.0], [0.1, 0.1, 0.1], torch.tensor([0.5, 0.5, 0.1])])
def test_sampling_diagnostics_refuse_a_non_distribution_with_the_variance_helpers_message(probs):
    """Its own check (message 'they sum to') duplicated variance.paired_vectors' (round 14); one rule now."""
    with pytest.raises(ValueError, match=r"Invalid probs: entries sum to .* \(expected a distribution"):
        sampling_diagnostics(torch.tensor([1.0, 2.0, 3.0]), probs)



# --- 6. hunt: numpy masked arrays, and the engine's own reading of numpy arrays ---------------------------------
def test_a_masked_array_with_masked_entries_is_refused_not_read_through_its_mask():
    """torch.as_tensor read the data under the mask: norms np.ma.masked_where(norms > 5, norms) gave the oracle the
    hidden norm 9 it was meant not to see; diffs masked as outliers were learnt from."""
    from sazo_lite.samplers import OracleSampler

    norms = np.array([1.0, 9.0, 2.0, 3.0])
    hidden = np.ma.masked_where(norms > 5, norms)
    with pytest.raises(ValueError, match=r"Invalid norms_fn: a masked array \(1 of 4 entries masked"):
        OracleSampler(4, lambda: hidden).probs
    sampler = SAZOSampler(4, seed=0)
    before = sampler.state_dict()
    with pytest.raises(ValueError, match="Invalid directional_diffs: a masked array"):
        sampler.update([0, 1], np.ma.array([0.5, 1e6], mask=[False, True]))
    assert _same_state(sampler.state_dict(), before)


def test_a_masked_array_with_nothing_masked_reads_as_its_data():
    data = np.array([0.5, 1.5, 2.5])
    for masked in (np.ma.array(data), np.ma.array(data, mask=[False] * 3), np.ma.array(data)[::-1]):
        assert dense_tensor("x", masked).tolist() == np.ma.getdata(masked).tolist()


def _run(losses_of, weights=None):
    """θ and the directional differences of 3 steps whose closure returns losses_of(per-example losses)."""
    theta, target = torch.zeros(4, dtype=torch.float64), torch.arange(4, dtype=torch.float64)
    opt = MeZO([theta], lr=0.05, eps=1e-3, seed=1, noise=None)
    diffs = [opt.step(lambda: losses_of(((theta - target) ** 2).numpy()), weights).directional_diffs
             for _ in range(3)]
    return theta, torch.stack(diffs)


ENGINE_ARRAYS = {"reversed": lambda x: x[::-1], "big-endian": lambda x: x.astype(">f8"),
                 "big-endian float32": lambda x: x.astype(">f4")}


@pytest.mark.parametrize("make", ENGINE_ARRAYS.values(), ids=ENGINE_ARRAYS.keys())
def test_a_mezo_step_reads_a_numpy_result_torch_cannot_view_as_its_values(make):
    """The step's own torch.as_tensor refused a reversed or byte-swapped numpy result as 'Invalid closure result:
    ... expected a tensor, number or list of numbers'."""
    theta, diffs = _run(make)
    reference, reference_diffs = _run(lambda x: np.ascontiguousarray(make(x), dtype=make(x).dtype.newbyteorder("=")))
    assert torch.equal(theta, reference) and torch.equal(diffs, reference_diffs)


@pytest.mark.parametrize("make", ENGINE_ARRAYS.values(), ids=ENGINE_ARRAYS.keys())
def test_a_mezo_step_reads_numpy_weights_torch_cannot_view_as_their_values(make):
    weights = make(np.array([0.5, 1.0, 2.0, 4.0]))
    theta, diffs = _run(lambda x: x, weights)
    reference, reference_diffs = _run(lambda x: x, np.ascontiguousarray(weights, dtype=weights.dtype.newbyteorder("=")))
    assert torch.equal(theta, reference) and torch.equal(diffs, reference_diffs)


@pytest.mark.parametrize("where", ["losses", "weights"])
def test_a_mezo_step_refuses_masked_losses_or_weights_with_theta_restored(where):
    theta = torch.linspace(0.0, 1.0, 4, dtype=torch.float64)
    opt, start = MeZO([theta], lr=0.05, eps=1e-3, seed=1, noise=None), theta.clone()
    mask = [False, True, False, False]
    losses = lambda: np.ma.array((theta ** 2).numpy(), mask=mask if where == "losses" else False)
    weights = np.ma.array(np.ones(4), mask=mask) if where == "weights" else None
    with pytest.raises(ValueError, match=f"Invalid {'closure result' if where == 'losses' else 'weights'}: a masked"):
        opt.step(losses, weights)
    assert opt.step_count == 0 and torch.allclose(theta, start, rtol=0, atol=1e-12)


# --- 7. any numpy layout reads as its values (hypothesis) -------------------------------------------------------
from hypothesis import given, settings, strategies as st  # noqa: E402


@given(dtype=st.sampled_from(["i2", "i4", "i8", "u1", "f2", "f4", "f8"]), order=st.sampled_from("<>="),
       shape=st.lists(st.integers(1, 4), min_size=1, max_size=3), steps=st.lists(st.sampled_from([1, -1, 2, -2]),
                                                                              min_size=3, max_size=3),
       transpose=st.booleans(), data=st.integers(0, 2 ** 31 - 1))
@settings(max_examples=150, deadline=None)
def test_dense_tensor_reads_any_numpy_layout_as_numpy_reads_it(dtype, order, shape, steps, transpose, data):
    """A plain reference: np.asarray's values and native dtype, whatever strides, byte order or transposition."""
    rng = np.random.default_rng(data)
    array = (rng.standard_normal(shape) * 50).astype(np.dtype(dtype).newbyteorder(order))
    view = array[tuple(slice(None, None, step) for step in steps[:array.ndim])]
    view = view.T if transpose else view
    tensor = dense_tensor("x", view)
    expected = np.asarray(view, dtype=view.dtype.newbyteorder("="))
    assert tensor.numpy().dtype == expected.dtype and np.array_equal(tensor.numpy(), expected)

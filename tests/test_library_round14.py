"""Round 14 of the library's red team: the oracle's λ in its state, distributions checked as distributions,
SparseMeZO's masks, and what the hunt in the samplers, variance helpers, sparse MeZO and sum tree found.

Each defect's test fails on the code before its fix.
"""
from __future__ import annotations

import io

import numpy as np
import pytest
import torch

from sazo_lite.samplers import OracleSampler, SAZOSampler


# --- 1. OracleSampler's state holds its λ ------------------------------------------------------------------------
def _oracle(mix: float, seed: int = 1) -> OracleSampler:
    norms = torch.linspace(0.0, 3.0, 16, dtype=torch.float64) ** 2
    return OracleSampler(16, lambda: norms, uniform_mix=mix, seed=seed)


def test_an_oracle_state_loaded_into_an_oracle_of_another_mix_resumes_with_the_saved_mix():
    """The state held the generator only: loaded into an oracle built with λ = 0, a run saved at λ = 0.5 went on
    drawing from the exact oracle (examples of norm 0 never drawn again, other weights) without a word. The λ is
    recorded and taken on load, as the SAZO samplers take their hyperparameters; the draws go on bit for bit."""
    original = _oracle(0.5)
    original.sample(8)
    resumed = _oracle(0.0, seed=7)
    resumed.load_state_dict(original.state_dict())
    assert resumed.uniform_mix == 0.5
    for _ in range(3):
        (i, w), (j, v) = original.sample(32), resumed.sample(32)
        assert torch.equal(i, j) and torch.equal(w, v)
    assert torch.equal(original.probs, resumed.probs)


def test_the_oracle_records_its_mix_as_the_sazo_samplers_record_theirs():
    oracle, sazo = _oracle(0.25), SAZOSampler(16, uniform_mix=0.25)
    assert oracle.state_dict()["hyperparameters"] == {"uniform_mix": 0.25}
    assert sazo.state_dict()["hyperparameters"]["uniform_mix"] == 0.25
    oracle.uniform_mix = np.float64(0.125)   # a schedule computed with numpy: still a state torch.load takes
    buffer = io.BytesIO()
    torch.save(oracle.state_dict(), buffer)
    buffer.seek(0)
    assert torch.load(buffer, weights_only=True)["hyperparameters"] == {"uniform_mix": 0.125}


@pytest.mark.parametrize("hyper, message", [({"uniform_mix": 1.5}, "Invalid uniform_mix"),
                                            ({"uniform_mix": float("nan")}, "Invalid uniform_mix"),
                                            ({"uniform_mix": True}, "Invalid uniform_mix"),
                                            ({"uniform_mix": "0.1"}, "Invalid uniform_mix"),
                                            ({"lam": 0.1}, "Invalid state: hyperparameters"),
                                            ({"uniform_mix": 0.1, "seed": 1}, "Invalid state: hyperparameters"),
                                            ([0.1], "Invalid state: hyperparameters")])
def test_an_oracle_state_with_a_bad_mix_is_refused_naming_it_with_the_sampler_unchanged(hyper, message):
    source, target = _oracle(0.5), _oracle(0.2, seed=3)
    target.sample(4)
    before = target.state_dict()
    with pytest.raises(ValueError, match=message):
        target.load_state_dict({**source.state_dict(), "hyperparameters": hyper})
    after = target.state_dict()
    assert after["hyperparameters"] == before["hyperparameters"] and torch.equal(after["generator"],
                                                                                  before["generator"])
    assert after["seed"] == before["seed"]


def test_an_oracle_state_written_before_round_14_still_loads_and_keeps_the_samplers_mix():
    old = {k: v for k, v in _oracle(0.5).state_dict().items() if k != "hyperparameters"}
    target = _oracle(0.2, seed=3)
    target.load_state_dict(old)
    assert target.uniform_mix == 0.2 and target.seed == 1


# --- 2. tv_distance, mix_with_uniform (and the helpers taking p) check that p is a distribution --------------------
@pytest.mark.parametrize("call, name", [
    (lambda v: v.tv_distance([3.0, 0.0], [0.5, 0.5]), "p"),          # TV 1.5: above its bound of 1
    (lambda v: v.tv_distance([0.5, 0.5], [0.25, 0.25]), "q"),        # TV 0.5 for two 'uniform' vectors
    (lambda v: v.tv_distance([0.5, 0.5], [0.0, 0.0]), "q"),
    (lambda v: v.mix_with_uniform([1.0, 3.0], 0.5), "probs"),        # [0.75, 1.75]: no distribution
    (lambda v: v.mix_with_uniform(torch.tensor([0.2, 0.2]), 0.1), "probs"),
    (lambda v: v.sampling_variance([1.0, 2.0], [1.0, 2.0]), "probs"),  # V(p) off by the factor Σp = 3
    (lambda v: v.variance_ratio([1.0, 2.0], [1.0, 2.0]), "probs"),    # 0.33: a ratio that is >= 1 by definition
    (lambda v: v.zo_second_moment([1.0, 2.0], [1.0, 2.0], 1.0, 10, 2), "probs"),
], ids=["tv-p-scores", "tv-q-half", "tv-q-zero", "mix-scores", "mix-tensor", "V", "ratio", "moment"])
def test_probabilities_that_do_not_sum_to_one_are_refused_naming_them(call, name):
    """tv_distance and mix_with_uniform took any non-negative vector as p: scores given as probabilities gave a TV
    of 1.5 (it is at most 1) or 0.5 between two uniform-looking vectors, and a 'mixture' summing to 2.5; V(p), the
    variance ratio and E‖ĝ‖² of unnormalised p were off by Σp (a variance ratio of 0.33). Now ValueError."""
    from sazo_lite import variance
    with pytest.raises(ValueError, match=f"Invalid {name}: entries sum to"):
        call(variance)


def test_a_distribution_rounded_as_its_dtype_rounds_is_still_a_distribution():
    from sazo_lite import variance
    n = 10 ** 6
    p32 = torch.softmax(torch.randn(n, generator=torch.Generator().manual_seed(0)) * 5, 0)   # float32 sums
    uniform = torch.full((n,), 1.0 / n, dtype=torch.float64)
    assert 0.0 < variance.tv_distance(p32, uniform) < 1.0
    assert variance.tv_distance(p32.numpy(), uniform.numpy()) == variance.tv_distance(p32, uniform)
    nearly = [0.1] * 10   # sums to 0.9999999999999999 in float64
    assert variance.tv_distance(nearly, [0.1] * 10) == 0.0
    mixed = variance.mix_with_uniform(nearly, 0.5)
    assert torch.allclose(mixed, torch.full((10,), 0.1, dtype=torch.float64))
    sampler = SAZOSampler(2 ** 16, seed=0)   # tree mode: p from float32 sums
    generator = torch.Generator().manual_seed(1)
    for _ in range(5):
        indices, _ = sampler.sample(512)
        sampler.update(indices, torch.randn(512, generator=generator, dtype=torch.float64) * 100)
    assert sampler.sum_tree and variance.tv_distance(sampler.probs, variance.oracle_probs(torch.ones(2 ** 16))) > 0
    assert variance.variance_ratio(torch.ones(2 ** 16), sampler.probs) >= 1.0


def test_a_shorter_p_is_still_named_by_its_length():
    from sazo_lite import variance
    with pytest.raises(ValueError, match="Invalid q: shape"):
        variance.tv_distance([0.5, 0.5], [1.0, 0.0, 0.0])


# --- 3. SparseMeZO keeps masks of its own ----------------------------------------------------------------------------
def _sparse_run(theta, masks, steps: int, edit=None):
    from sazo_lite.sparse import SparseMeZO
    opt = SparseMeZO([theta], masks, lr=0.05, eps=1e-3, seed=4)
    if edit is not None:
        edit()
    for _ in range(steps):
        opt.step(lambda: (theta - 1.0).pow(2))
    return opt


@pytest.mark.parametrize("dtype", [torch.int64, torch.int32])
def test_a_mask_edited_by_its_caller_after_construction_does_not_change_which_entries_move(dtype):
    """SparseMeZO kept the caller's mask tensors: one edited in place afterwards (a buffer reused for the next
    layer's mask, a shuffle) moved the steps onto other entries, and a run resumed from the regenerated masks
    moved yet others. The masks are copied at construction; the steps move the entries given then."""
    mask = torch.tensor([1, 4, 6], dtype=dtype)
    theta, reference = torch.zeros(10, dtype=torch.float64), torch.zeros(10, dtype=torch.float64)
    _sparse_run(theta, [mask], 3, edit=lambda: mask.copy_(torch.tensor([0, 2, 9], dtype=dtype)))
    _sparse_run(reference, [torch.tensor([1, 4, 6], dtype=dtype)], 3)
    assert torch.equal(theta, reference)
    assert set(torch.nonzero(theta).flatten().tolist()) <= {1, 4, 6}


def test_sparse_mezo_with_copied_masks_still_resumes_from_its_state_bit_for_bit():
    from sazo_lite.sparse import sparse_indices
    theta = torch.randn(20, dtype=torch.float64)
    masks = sparse_indices([theta], 0.3, seed=2)
    opt = _sparse_run(theta, masks, 2)
    state, resumed = opt.state_dict(), theta.clone()
    copy = _sparse_run(resumed, sparse_indices([resumed], 0.3, seed=2), 0)
    copy.load_state_dict(state)
    for _ in range(3):
        opt.step(lambda: (theta - 1.0).pow(2))
        copy.step(lambda: (resumed - 1.0).pow(2))
    assert torch.equal(theta, resumed) and opt.step_count == copy.step_count == 5
    assert all(m is not given for m, given in zip(opt.masks.values(), masks))


# --- 4. SumTree.refresh reads leaf indices as update reads them ----------------------------------------------------
class _Leaves:
    def __init__(self, values):
        self.values = np.asarray(values, dtype=np.float64)

    def __call__(self, indices):
        return self.values[indices]


@pytest.mark.parametrize("index", [np.array([-1]), np.array([4.0]), np.array([[4]]), np.array([True]),
                                   np.array([5]), [4.9]])
def test_refresh_refuses_what_is_not_a_leaf_index_and_changes_nothing(index):
    """refresh is how an owner of the leaves (SumTree.over) reports a change. −1 refreshed the path of internal
    node N − 1, not the last leaf's: the root stayed 15 while the leaves summed to 110 and every draw followed
    the old weights; 4.9 was read as leaf 4 and [True] as leaf 1. Now ValueError naming the indices, sums kept."""
    from sazo_lite.sumtree import SumTree
    leaves = _Leaves([1.0, 2.0, 3.0, 4.0, 5.0])
    tree = SumTree.over(5, leaves)
    before = tree.tree.clone()
    leaves.values[4] = 100.0
    with pytest.raises(ValueError, match="Invalid indices"):
        tree.refresh(index)
    internal = before[1:5]
    assert torch.equal(tree.tree[1:5], internal)
    tree.refresh(np.array([4]))
    assert tree.total == float(leaves.values.sum())


def test_refresh_still_takes_integer_arrays_tensors_and_nothing():
    from sazo_lite.sumtree import SumTree
    leaves = _Leaves(np.arange(1.0, 8.0))
    tree = SumTree.over(7, leaves)
    leaves.values[[0, 6]] = 50.0
    tree.refresh(torch.tensor([6, 0, 6]))
    tree.refresh(np.array([], dtype=np.int64))
    tree.refresh([])
    assert tree.total == float(leaves.values.sum())
    assert torch.equal(tree.tree, SumTree(torch.from_numpy(leaves.values)).tree)


# --- 5. sparse_indices: its seed, its params and its count ---------------------------------------------------------
@pytest.mark.parametrize("seed", [0.7, True, "1", 2 ** 64, None])
def test_sparse_indices_refuses_a_seed_that_is_not_an_int_torch_takes(seed):
    """The seed went through int() and a 64-bit mask: 0.7 gave seed 0's masks, True and "1" seed 1's, 2**64 seed
    0's; two runs believed to differ had the same masks. Now the samplers' and MeZO's rule (check_seed)."""
    from sazo_lite.sparse import sparse_indices
    with pytest.raises(ValueError, match="Invalid seed"):
        sparse_indices([torch.zeros(100)], 0.05, seed=seed)


def test_sparse_indices_takes_numpy_seeds_and_gives_the_same_masks():
    from sazo_lite.sparse import sparse_indices
    params = [torch.zeros(100), torch.zeros(7, 3)]
    ints, numpys = sparse_indices(params, 0.2, seed=5), sparse_indices(params, 0.2, seed=np.int64(5))
    assert all(torch.equal(a, b) for a, b in zip(ints, numpys)) and [len(m) for m in ints] == [20, 5]


@pytest.mark.parametrize("params", [torch.zeros(4, 5), [1.0, 2.0], [torch.zeros(3), "w"]])
def test_sparse_indices_refuses_what_is_not_a_list_of_tensors(params):
    """A tensor was split into its rows (4 masks for one tensor, which SparseMeZO then refused as '4 masks for 1
    parameters'); a number raised AttributeError. Now ValueError naming params, as SparseMeZO's."""
    from sazo_lite.sparse import sparse_indices
    with pytest.raises(ValueError, match="Invalid params"):
        sparse_indices(params, 0.5)


@pytest.mark.parametrize("fraction, numel, k", [
    (0.68, 78_073_600, 53_090_048), (0.5, 9_494_219_366, 4_747_109_683), (1.0, 5_838_549_767, 5_838_549_767),
    (0.56, 1_828_349_400, 1_023_875_664), (0.1, 30, 3), (1 / 61, 549, 9), (0.3, 7, 3), (1e-12, 10, 1)])
def test_the_kept_count_is_the_ceiling_of_the_fraction_of_the_entries(fraction, numel, k):
    """k = ceil(fraction · numel) was computed as a float product with a 1e-9 absolute slack: from about 10⁷
    entries on the float's own rounding is above that slack and one entry too many was kept (0.68 of 78,073,600
    entries kept 53,090,049; 1.0 of 5,838,549,767 kept one more than there are)."""
    from sazo_lite.sparse import _kept
    assert _kept(fraction, numel) == k


# --- 6. a float32 λ set between steps resumes bit for bit -----------------------------------------------------------
def _kinds():
    from sazo_lite.samplers import PlainSAZOSampler, StaleCorrectedSAZOSampler
    norms = torch.linspace(0.0, 2.0, 50, dtype=torch.float64)
    return {"sazo": lambda: SAZOSampler(50, seed=2), "sazo-tree": lambda: SAZOSampler(50, sum_tree=True, seed=2),
            "plain": lambda: PlainSAZOSampler(50, seed=2), "stale": lambda: StaleCorrectedSAZOSampler(50, seed=2),
            "oracle": lambda: OracleSampler(50, lambda: norms, uniform_mix=0.1, seed=2)}


@pytest.mark.parametrize("kind", ["sazo", "sazo-tree", "plain", "stale", "oracle"])
def test_a_float32_mix_set_between_steps_resumes_bit_for_bit(kind):
    """A λ schedule computed in float32 (np.float32(0.3), a float32 tensor's .item() is a float already) left
    a numpy float32 in the sampler: 1 − λ and the split of the draws were computed in float32, while its state
    holds λ as a Python float (round 13) and a resumed sampler computes in float64: weights 4e-8 apart and
    probs that differ. Now λ is read as a Python float where it is used: the two go on bit for bit."""
    make = _kinds()[kind]
    original, generator = make(), torch.Generator().manual_seed(0)
    for step in range(6):
        if step == 3:
            original.uniform_mix = np.float32(0.3)
        indices, _ = original.sample(8)
        original.update(indices, torch.randn(8, generator=generator, dtype=torch.float64))
    resumed = resumed_alongside(original, make, generator, steps=4)
    assert torch.equal(original.probs, resumed.probs)


def resumed_alongside(original, make, generator, *, steps: int):
    """A sampler resumed from ``original``'s state, both stepped ``steps`` times on the same diffs: every draw
    (indices and weights) equal. Returns the resumed one."""
    resumed = make()
    resumed.load_state_dict(original.state_dict())
    for _ in range(steps):
        (i, w), (j, v) = original.sample(8), resumed.sample(8)
        assert torch.equal(i, j) and torch.equal(w, v)
        diffs = torch.randn(8, generator=generator, dtype=torch.float64)
        original.update(i, diffs), resumed.update(j, diffs)
    return resumed


@pytest.mark.parametrize("kind", ["sazo", "sazo-tree", "stale"])
def test_a_float32_level_decay_set_between_steps_keeps_the_level_in_float64_and_resumes(kind):
    """level_decay set to np.float32(0.95) between steps: the level's rate 1 − decay was a float32 and so was
    L from then on (numpy keeps float32 ⊕ Python float in float32): its running mean rounded to float32 at every
    step, and a resumed sampler (the state holds L as a Python float) went on in float64, drawing other weights."""
    make = _kinds()[kind]
    original, generator = make(), torch.Generator().manual_seed(0)
    for step in range(40):
        if step == 3:
            original.level_decay = np.float32(0.95)
        indices, _ = original.sample(8)
        original.update(indices, torch.randn(8, generator=generator, dtype=torch.float64) * (1 + step))
    assert type(original.level) is float
    resumed = resumed_alongside(original, make, generator, steps=20)
    assert original.level == resumed.level and torch.equal(original.probs, resumed.probs)


# --- 7. a SparseMeZO state names its masks ---------------------------------------------------------------------------
def test_a_sparse_state_loaded_into_a_sparse_mezo_of_other_masks_is_refused():
    """The state held MeZO's steps and seeds only: loaded into a SparseMeZO built with sparse_indices of another
    seed (or fraction), the resumed run moved other entries than the saved one, silently. The state records
    each mask's SHA-256 (as a SeedLog does) and a load into other masks is refused, the optimiser unchanged."""
    from sazo_lite.sparse import sparse_indices
    theta = torch.randn(30, dtype=torch.float64)
    opt = _sparse_run(theta, sparse_indices([theta], 0.3, seed=1), 2)
    state = opt.state_dict()
    for masks in (sparse_indices([theta], 0.3, seed=2), sparse_indices([theta], 0.4, seed=1)):
        other = _sparse_run(theta.clone(), masks, 1)
        with pytest.raises(ValueError, match="Invalid state_dict: its masks differ"):
            other.load_state_dict(state)
        assert other.step_count == 1
    same = _sparse_run(theta.clone(), sparse_indices([theta], 0.3, seed=1), 0)
    buffer = io.BytesIO()
    torch.save(state, buffer)
    buffer.seek(0)
    same.load_state_dict(torch.load(buffer, weights_only=True))
    assert same.step_count == 2


def test_a_sparse_state_written_before_round_14_still_loads():
    from sazo_lite.sparse import sparse_indices
    theta = torch.randn(30, dtype=torch.float64)
    state = _sparse_run(theta, sparse_indices([theta], 0.3, seed=1), 2).state_dict()
    state.pop("mask_digests", None)
    other = _sparse_run(theta.clone(), sparse_indices([theta], 0.3, seed=2), 0)
    other.load_state_dict(state)
    assert other.step_count == 2


# --- 8. the staleness correction when an age's running means reach 0 -------------------------------------------
def test_an_age_whose_observations_were_all_zero_keeps_its_scores_and_its_state_loads():
    """With growth_rate 1 (or after a long run of zero diffs, which float32 losses give for fitted examples) an
    age bucket's two running means both reach 0: its factor 0/0 was NaN, the sampling scores of every example of
    that age NaN, and their sum made p fall back to uniform for every example (with a RuntimeWarning only); the
    state it wrote was refused by load_state_dict ('growth_fresh must be finite and > 0'). Now the factor is 1
    (no evidence of growth), p follows the scores, and the state loads and resumes bit for bit."""
    import warnings
    from sazo_lite.samplers import StaleCorrectedSAZOSampler
    sampler = StaleCorrectedSAZOSampler(4, growth_rate=1.0, seed=0)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        sampler.update(torch.tensor([0, 1]), torch.tensor([0.0, 1.0]))
        sampler.update(torch.tensor([0]), torch.tensor([0.0]))   # example 0 redrawn at age 1: A_0 = S_0 = 0
        factors = sampler.growth_factors()
        probs = sampler.probs
    assert factors[0] == 1.0 and bool(torch.isfinite(probs).all())
    reference = SAZOSampler(4, seed=0)   # the same robust rule, without the correction
    reference.update(torch.tensor([0, 1]), torch.tensor([0.0, 1.0]))
    reference.update(torch.tensor([0]), torch.tensor([0.0]))
    assert torch.equal(probs, reference.probs) and not torch.equal(probs, torch.full((4,), 0.25, dtype=torch.float64))
    resumed = StaleCorrectedSAZOSampler(4, growth_rate=1.0, seed=5)
    resumed.load_state_dict(sampler.state_dict())
    for _ in range(3):
        (i, w), (j, v) = sampler.sample(4), resumed.sample(4)
        assert torch.equal(i, j) and torch.equal(w, v)


def test_a_stored_mean_of_zero_under_a_growing_fresh_mean_still_takes_the_largest_factor():
    from sazo_lite.samplers import StaleCorrectedSAZOSampler
    sampler = StaleCorrectedSAZOSampler(4, growth_rate=1.0, max_factor=20.0, seed=0)
    sampler._fresh[2], sampler._stored[2] = 0.5, 0.0
    assert sampler.growth_factors()[2] == 20.0


# --- 9. SumTree.over's dtype is a floating dtype ---------------------------------------------------------------------
@pytest.mark.parametrize("dtype", [np.int64, np.int32, bool, torch.float32, "not a dtype"])
def test_a_sum_tree_refuses_sums_that_are_not_floating_point(dtype):
    """dtype is the type of the stored internal sums: an integer or bool dtype truncated every sum (leaves
    [0.4, 0.4, 0.4, 0.9, 0.3] had a total of 1, leaves 1 and 2 were never drawn and leaf 0 drawn 29% of the
    time, not 17%); a torch dtype raised numpy's TypeError. Now ValueError naming dtype."""
    from sazo_lite.sumtree import SumTree
    leaves = _Leaves([0.4, 0.4, 0.4, 0.9, 0.3])
    with pytest.raises(ValueError, match="Invalid dtype"):
        SumTree.over(5, leaves, dtype=dtype)


@pytest.mark.parametrize("dtype", [np.float64, np.float32, "float32", np.dtype(np.float16)])
def test_a_sum_tree_over_floating_sums_draws_each_leaf_by_its_share(dtype):
    from sazo_lite.sumtree import SumTree
    leaves = _Leaves([0.4, 0.4, 0.4, 0.9, 0.3])
    tree = SumTree.over(5, leaves, dtype=dtype)
    draws = tree.sample(20_000, torch.Generator().manual_seed(0)).numpy()
    shares = np.bincount(draws, minlength=5) / 20_000
    assert np.allclose(shares, leaves.values / leaves.values.sum(), atol=0.02)


# --- 10. λ set between steps is checked where it is used ----------------------------------------------------------
@pytest.mark.parametrize("kind", ["sazo", "sazo-tree", "plain", "stale", "oracle"])
@pytest.mark.parametrize("mix", [1.5, -0.2, float("nan"), float("inf"), "0.1", True])
def test_a_mix_set_between_steps_outside_its_interval_is_refused_before_anything_moves(kind, mix):
    """A schedule may set λ between steps (round 13). λ = 1.5 sent every draw to the uniform part while the
    weights were 1/(N·p) of the formula's p (a biased estimate); −0.2 never drew uniformly; NaN gave NaN weights;
    the oracle drew from a 'mixture' −0.5·p* + 1.5/N. Now sample, update and probs refuse it as the constructor
    does (ValueError naming uniform_mix) before the generator or the scores move."""
    make = _kinds()[kind]
    sampler, twin = make(), make()
    for s in (sampler, twin):
        for _ in range(3):
            indices, _ = s.sample(8)
            s.update(indices, torch.randn(8, generator=torch.Generator().manual_seed(1), dtype=torch.float64))
    valid = sampler.uniform_mix
    sampler.uniform_mix = mix
    with pytest.raises(ValueError, match="Invalid uniform_mix"):
        sampler.sample(8)
    with pytest.raises(ValueError, match="Invalid uniform_mix"):
        sampler.probs
    if kind not in ("plain", "oracle"):   # the robust rule's level reads p at the update
        with pytest.raises(ValueError, match="Invalid uniform_mix"):
            sampler.update(torch.tensor([0, 1]), torch.tensor([1.0, 2.0], dtype=torch.float64))
    sampler.uniform_mix = valid
    (i, w), (j, v) = sampler.sample(8), twin.sample(8)
    assert torch.equal(i, j) and torch.equal(w, v) and torch.equal(sampler.probs, twin.probs)


def test_the_sum_tolerance_is_the_language_model_diagnostics_one():
    """llm.queries.sampling_diagnostics accepts p summing to 1 within 1e-5; the variance helpers it calls must not
    refuse what it accepts (a sampler's p carries the float32 rounding of its sum tree's root)."""
    from sazo_lite import variance
    from sazo_lite.llm.queries import sampling_diagnostics
    norms = torch.tensor([1.0, 2.0, 3.0, 4.0], dtype=torch.float64)
    off = torch.tensor([0.25, 0.25, 0.25, 0.25 + 8e-6], dtype=torch.float64)
    assert sampling_diagnostics(norms, off)["v_ratio"] >= 1.0 and variance.tv_distance(off, off) == 0.0
    with pytest.raises(ValueError, match="Invalid p: entries sum to"):
        variance.tv_distance(torch.tensor([0.25, 0.25, 0.25, 0.25 + 2e-5], dtype=torch.float64), off)


def test_a_sparse_state_of_an_optimiser_holding_a_tensor_without_a_mask_is_refused_by_name():
    """With the digests in its state, state_dict of a SparseMeZO whose group got a tensor appended raised a bare
    KeyError (an id); now the ValueError its step gives."""
    from sazo_lite.sparse import SparseMeZO
    theta = torch.zeros(10)
    opt = SparseMeZO([theta], [torch.tensor([1, 2])], lr=0.1)
    state = opt.state_dict()
    opt.param_groups[0]["params"].append(torch.zeros(10))
    for call in (opt.state_dict, lambda: opt.load_state_dict(state)):
        with pytest.raises(ValueError, match="Invalid params: a tensor without a mask"):
            call()


# --- 11. the other settings set between steps are checked too -------------------------------------------------------
@pytest.mark.parametrize("kind, name, bad", [
    ("sazo", "ema_decay", -0.5), ("sazo-tree", "ema_decay", 1.0), ("plain", "ema_decay", -0.5),
    ("sazo", "level_decay", 2.0), ("sazo", "prior_strength", -1.0), ("sazo", "statistic", "sqaure"),
    ("stale", "growth_rate", 1.5), ("stale", "min_factor", 0.0), ("stale", "max_factor", 0.5),
    ("stale", "ema_decay", float("nan"))])
def test_a_setting_set_between_steps_outside_its_rule_is_refused_before_anything_moves(kind, name, bad):
    """Only the constructor checked them: ema_decay = −0.5 set between steps made estimates and probabilities
    negative (p_min −0.9 on a 10-example run), a statistic 'sqaure' was read as 'abs', a level_decay of 2 turned
    the level negative. sample, update and probs now check each as the constructor does, before anything moves."""
    make = _kinds()[kind]
    sampler, twin = make(), make()
    for s in (sampler, twin):
        for _ in range(3):
            indices, _ = s.sample(8)
            s.update(indices, torch.randn(8, generator=torch.Generator().manual_seed(1), dtype=torch.float64))
    valid = getattr(sampler, name)
    setattr(sampler, name, bad)
    for call in (lambda: sampler.sample(8), lambda: sampler.probs,
                 lambda: sampler.update(torch.tensor([0, 1]), torch.tensor([1.0, 2.0], dtype=torch.float64))):
        with pytest.raises(ValueError, match=f"Invalid {name}"):
            call()
    setattr(sampler, name, valid)
    (i, w), (j, v) = sampler.sample(8), twin.sample(8)
    assert torch.equal(i, j) and torch.equal(w, v) and torch.equal(sampler.estimates, twin.estimates)


# --- 12. a statistic set between steps as numpy's str_ ----------------------------------------------------------------
@pytest.mark.parametrize("kind", ["sazo", "stale"])
def test_a_statistic_read_from_a_numpy_array_between_steps_makes_a_state_torch_load_takes(kind):
    """Round 13 made numpy numbers Python numbers in the state; a statistic set between steps from an array of
    names (np.array(['abs', 'square'])[1], a numpy str_) was stored as it was, and torch.load(weights_only=True),
    torch's default, refused the checkpoint. It is stored as a plain str; the loaded sampler resumes bit for bit."""
    sampler = _kinds()[kind]()
    sampler.statistic = np.array(["abs", "square"])[1]
    indices, _ = sampler.sample(8)
    sampler.update(indices, torch.randn(8, generator=torch.Generator().manual_seed(0), dtype=torch.float64))
    buffer = io.BytesIO()
    torch.save(sampler.state_dict(), buffer)
    buffer.seek(0)
    state = torch.load(buffer, weights_only=True)
    assert type(state["hyperparameters"]["statistic"]) is str
    resumed = _kinds()[kind]()
    resumed.load_state_dict(state)
    (i, w), (j, v) = sampler.sample(8), resumed.sample(8)
    assert resumed.statistic == "square" and torch.equal(i, j) and torch.equal(w, v)


@pytest.mark.parametrize("leaf_values", [[1.0, 2.0, 3.0], np.array([1.0, 2.0, 3.0]), None])
def test_a_sum_tree_over_leaves_that_are_not_a_function_is_refused_naming_them(leaf_values):
    """SumTree.over takes a function of indices; the owner's array itself (or None) raised TypeError from the
    first rebuild ("'numpy.ndarray' object is not callable"). Now ValueError naming leaf_values."""
    from sazo_lite.sumtree import SumTree
    with pytest.raises(ValueError, match="Invalid leaf_values"):
        SumTree.over(3, leaf_values)

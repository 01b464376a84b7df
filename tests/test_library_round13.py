"""Round 13 of the library's red team: folded updates through the Gaussian table, and the review's leftovers.

Each defect's test fails on the code before its fix.
"""
from __future__ import annotations

import pytest
import torch

import sazo_lite as sz
from sazo_lite.noise import GaussianTable


# --- 1. GaussianTable: a folded job whose two terms have different perturbations ------------------------------
@pytest.mark.parametrize("first, second", [("gaussian", "rademacher"), ("rademacher", "gaussian")])
def test_a_folded_step_through_the_gaussian_table_keeps_each_terms_z_when_the_perturbation_changes(first, second):
    """With fold_updates, a step's update waits for the next step's +εz and both go through one job. A group's
    perturbation changed between the steps gave that job a Gaussian and a Rademacher term; GaussianTable sent
    the whole job to its signs' source (TorchNoise), which drew the Gaussian term from randn instead of the
    table: the update (or the next shift) moved θ along another z than the step measured. θ differed from the
    unfolded run by 24 on a 300-entry quadratic; it is now the same bit for bit."""
    def run(fold: bool) -> torch.Tensor:
        theta = torch.linspace(-1.0, 1.0, 300, dtype=torch.float64)
        opt = sz.MeZO([theta], lr=0.1, eps=1e-3, perturbation=first, fold_updates=fold,
                      noise=GaussianTable(size=2 ** 10, chunk=2 ** 6))
        loss = lambda: ((theta - 0.3) ** 2).sum().reshape(1)
        for step in range(4):
            if step == 2:
                opt.param_groups[0]["perturbation"] = second
            opt.step(loss)
        opt.flush()
        return theta

    assert torch.equal(run(True), run(False))


# --- 2. the vector-pair check has a public name -----------------------------------------------------------------
def test_the_vector_pair_check_is_public_and_the_llm_diagnostics_import_no_private_name():
    """llm.queries imported variance's private ``_paired``; the check is ``variance.paired_vectors`` (documented,
    in ``__all__``), and the helpers' own name for it still works."""
    import ast
    import inspect

    from sazo_lite import variance
    from sazo_lite.llm import queries

    assert "paired_vectors" in variance.__all__ and variance._paired is variance.paired_vectors
    imported = [alias.name for node in ast.walk(ast.parse(inspect.getsource(queries)))
                if isinstance(node, ast.ImportFrom) and node.module == "variance" for alias in node.names]
    assert imported and not [name for name in imported if name.startswith("_")]
    norms, probs = variance.paired_vectors("norms", [3, 4], "probs", torch.tensor([0.25, 0.75]))
    assert norms.dtype == probs.dtype == torch.float64 and norms.tolist() == [3.0, 4.0]
    with pytest.raises(ValueError, match="Invalid probs: shape"):
        variance.paired_vectors("norms", [1.0, 2.0, 3.0], "probs", [1.0])
    with pytest.raises(ValueError, match="Invalid norms: entries must be finite and non-negative"):
        variance.paired_vectors("norms", [-1.0], "probs", [1.0])
    assert variance.paired_vectors("a", [-1.0], "b", [2.0])[0].tolist() == [-1.0]   # not norms: any sign


# --- 3. the race's statistics read every number the same way ------------------------------------------------------
@pytest.mark.parametrize("values", [[float("nan"), 100, 120], [100, float("nan"), 120], [100, 120, float("nan")]])
def test_median_queries_refuses_nan_instead_of_answering_by_where_it_stands(values):
    """A NaN among the queries per seed was sorted wherever it stood: [nan, 100, 120] had median 100,
    [100, nan, 120] nan, [100, 120, nan] 120. A miss is None or ∞; NaN is refused, naming it."""
    from sazo_lite.train import median_queries

    with pytest.raises(ValueError, match="Invalid queries in values: nan"):
        median_queries(values)


@pytest.mark.parametrize("bad, message", [([-5, 100], "expected queries >= 0"), ([True, 100], "expected a number"),
                                          (["100"], "expected a number"), ([], "at least one seed"),
                                          ([10 ** 400], "beyond float64")])
def test_median_queries_refuses_what_is_not_a_number_of_queries(bad, message):
    """Negative counts, bools and strings were ordered as numbers (or raised TypeError), no values raised
    statistics' own error; a count beyond float64 raised OverflowError in median_ratio_interval's check."""
    from sazo_lite.train import median_queries, median_ratio_interval

    with pytest.raises(ValueError, match=message):
        median_queries(bad)
    if bad and not isinstance(bad[0], bool) and bad[0] == 10 ** 400:
        with pytest.raises(ValueError, match="beyond float64"):
            median_ratio_interval(bad, [100])


def test_median_queries_still_counts_a_miss_as_never_and_zero_as_zero():
    from sazo_lite.train import median_queries

    assert median_queries([100, None, 120]) == 120 and median_queries([None, None, 120]) == float("inf")
    assert median_queries([0, 0, None]) == 0 and median_queries([3, 5]) == 4.0


def test_mean_difference_interval_takes_numpy_numbers():
    """Per-seed accuracies as numpy float32 (np.mean of a float32 array) or counts as numpy int64 were refused
    as 'expected finite numbers, got np.float32(0.7)'; they are numbers, read as floats. The answer is the
    plain formula's."""
    import math
    import statistics

    import numpy as np

    from sazo_lite.train import mean_difference_interval

    first, second = np.array([0.7, 0.8, 0.75], dtype=np.float32), [np.int64(1), np.int64(0), np.int64(1)]
    difference, half = mean_difference_interval(list(first), second)
    a, b = [float(v) for v in first], [float(v) for v in second]
    z = statistics.NormalDist().inv_cdf(0.975)
    assert difference == statistics.mean(a) - statistics.mean(b)
    assert math.isclose(half, z * math.sqrt(statistics.variance(a) / 3 + statistics.variance(b) / 3), rel_tol=1e-12)
    with pytest.raises(ValueError, match="Invalid first"):
        mean_difference_interval([float("nan"), 1.0], [1.0, 2.0])
    with pytest.raises(ValueError, match="Invalid second"):
        mean_difference_interval([1.0, 2.0], [10 ** 400, 1])


# --- 4. MeZO.state_dict: hyperparameters set between steps as numpy numbers -----------------------------------------
@pytest.mark.parametrize("fold", [False, True])
def test_a_state_saved_after_a_numpy_lr_schedule_loads_with_weights_only_and_resumes_bit_for_bit(tmp_path, fold):
    """A schedule computed with numpy (lr = η₀·½(1 + np.cos(πt/T))) sets np.float64 rates between steps; the step
    reads them as floats, but a state_dict taken before the next step held the numpy scalars, and torch.load
    (weights_only=True, its default) refused the checkpoint. The state holds Python floats now, and the resumed
    run is the uninterrupted one bit for bit. The live groups are left as the caller set them."""
    import io

    import numpy as np

    def schedule(opt, t):
        opt.param_groups[0]["lr"] = 0.05 * 0.5 * (1 + np.cos(np.pi * t / 8))
        opt.param_groups[1]["weight_decay"] = np.float32(0.01 * t)

    def build(theta, other):
        return sz.MeZO([{"params": [theta]}, {"params": [other], "perturbation": "rademacher"}], lr=0.05, eps=1e-3,
                       seed=7, fold_updates=fold)

    theta, other = torch.linspace(-1, 1, 6, dtype=torch.float64), torch.ones(3)
    opt = build(theta, other)
    loss = lambda: torch.cat([(theta - 0.5) ** 2, (other.double() - 2.0) ** 2])
    for t in range(3):
        opt.step(loss)
        schedule(opt, t + 1)
    buffer = io.BytesIO()
    torch.save(opt.state_dict(), buffer)
    assert type(opt.param_groups[0]["lr"]) is np.float64   # the caller's value, untouched
    saved = theta.clone(), other.clone()
    for t in range(3, 6):
        opt.step(loss)
        schedule(opt, t + 1)
    opt.flush()

    copy_theta, copy_other = saved
    resumed = build(copy_theta, copy_other)
    buffer.seek(0)
    state = torch.load(buffer, weights_only=True)
    assert [type(g["lr"]) for g in state["param_groups"]] == [float, float]
    resumed.load_state_dict(state)
    copy_loss = lambda: torch.cat([(copy_theta - 0.5) ** 2, (copy_other.double() - 2.0) ** 2])
    for t in range(3, 6):
        resumed.step(copy_loss)
        schedule(resumed, t + 1)
    resumed.flush()
    assert torch.equal(copy_theta, theta) and torch.equal(copy_other, other)


def test_state_dict_refuses_a_group_it_could_not_load_again():
    """A group whose lr was set to an invalid value between steps was saved as it stood (load_state_dict refuses
    it later, far from where it was set); the state_dict is refused now, naming it."""
    theta = torch.zeros(3)
    opt = sz.MeZO([theta], lr=0.1)
    opt.param_groups[0]["lr"] = -1.0
    with pytest.raises(ValueError, match="Invalid lr"):
        opt.state_dict()


# --- 5. references (no defect found): the sum tree against plain sums, every sampler's weights against its p --------
from hypothesis import HealthCheck, given, settings, strategies as st   # noqa: E402

REFERENCE = settings(max_examples=40, deadline=None, derandomize=True, suppress_health_check=[HealthCheck.too_slow])
WEIGHT = st.one_of(st.just(0.0), st.floats(1e-6, 1e3))


def _leaf_probability(nodes, leaf: int, n: int) -> float:
    """P(leaf) of a descent that splits each node by its children's own sums: the product along the path."""
    node, p = n + leaf, 1.0
    while node > 1:
        parent = node // 2
        total = nodes[2 * parent] + nodes[2 * parent + 1]
        p *= nodes[node] / total if total > 0 else 0.0
        node = parent
    return p


@REFERENCE
@given(weights=st.lists(WEIGHT, min_size=1, max_size=40),
       updates=st.lists(st.tuples(st.lists(st.integers(0, 10 ** 6), max_size=6), st.lists(WEIGHT, min_size=6,
                                                                                             max_size=6)), max_size=12))
def test_the_sum_tree_after_many_updates_is_the_plain_sums_and_draws_each_leaf_by_its_share(weights, updates):
    import math

    from sazo_lite.sumtree import SumTree

    reference = [float(w) for w in weights]
    if not sum(reference):
        reference[0] = 1.0
    tree, n = SumTree(torch.tensor(reference, dtype=torch.float64)), len(reference)
    for raw, values in updates:
        leaves = [i % n for i in raw]
        tree.update(torch.tensor(leaves, dtype=torch.long), torch.tensor(values[:len(leaves)], dtype=torch.float64))
        for leaf, value in zip(leaves, values):   # last write wins
            reference[leaf] = value
    if not sum(reference):
        tree.update(torch.tensor([0]), torch.tensor([1.0]))
        reference[0] = 1.0
    nodes = tree.tree.tolist()
    assert nodes[n:] == reference
    assert torch.equal(tree.tree, SumTree(torch.tensor(reference, dtype=torch.float64)).tree)   # rebuilt: same sums
    assert math.isclose(tree.total, math.fsum(reference), rel_tol=1e-13)
    total = math.fsum(reference)
    for leaf, value in enumerate(reference):
        assert math.isclose(_leaf_probability(nodes, leaf, n), value / total, rel_tol=1e-12, abs_tol=0.0)
    drawn = tree.sample(2000, torch.Generator().manual_seed(0))
    assert all(reference[i] > 0 for i in drawn.tolist())   # a zero weight is never drawn


def _samplers(n: int, norms: torch.Tensor):
    from sazo_lite.samplers import (OracleSampler, PlainSAZOSampler, SAZOSampler, Sampler,
                                    StaleCorrectedSAZOSampler, UniformSampler)

    return {"uniform": UniformSampler(n, seed=1), "base": Sampler(n, seed=1), "plain": PlainSAZOSampler(n, seed=1),
            "plain-tree": PlainSAZOSampler(n, seed=1, sum_tree=True), "sazo": SAZOSampler(n, seed=1),
            "sazo-tree": SAZOSampler(n, seed=1, sum_tree=True),
            "sazo-square": SAZOSampler(n, seed=1, statistic="square"),
            "stale": StaleCorrectedSAZOSampler(n, seed=1), "oracle": OracleSampler(n, lambda: norms, seed=1),
            "oracle-mix": OracleSampler(n, lambda: norms, uniform_mix=0.3, seed=1)}


@pytest.mark.parametrize("kind", ["uniform", "base", "plain", "plain-tree", "sazo", "sazo-tree", "sazo-square", "stale",
                                  "oracle", "oracle-mix"])
def test_every_samplers_weights_make_the_weighted_mean_unbiased_for_the_p_it_draws_from(kind):
    """E[w_k f_k] = (1/N) Σ f_i needs w = 1/(N p_i) for the p the draws actually follow: the weights are checked
    against ``probs`` entry by entry, ``probs`` against the draws' frequencies (seeded, so not flaky), and the
    weighted mean of f over many draws against the plain mean. Random norms, with some zero."""
    n = 19
    g = torch.Generator().manual_seed(11)
    norms = torch.rand(n, generator=g, dtype=torch.float64) * 3 * (torch.rand(n, generator=g) < 0.8) + 1e-3
    f = torch.rand(n, generator=g, dtype=torch.float64) + 0.5
    sampler = _samplers(n, norms)[kind]
    for _ in range(40):   # a learnt state: feedback ∝ the norms along random directions
        idx, _ = sampler.sample(4)
        sampler.update(idx, norms[idx] * torch.randn(4, generator=g, dtype=torch.float64))
    probs = torch.as_tensor(sampler.probs).clone()
    assert abs(float(probs.sum()) - 1.0) < (1e-6 if "tree" in kind else 1e-12)
    idx, weights = sampler.sample(100_000)
    torch.testing.assert_close(weights, 1.0 / (n * probs[idx]), rtol=1e-12, atol=0.0)
    frequency = torch.bincount(idx, minlength=n).double() / len(idx)
    spread = torch.sqrt(probs * (1 - probs) / len(idx))
    assert bool(((frequency - probs).abs() <= 5 * spread + 1e-12).all())
    exact = float((probs * (1.0 / (n * probs)) * f).sum())   # Σ p_i w_i f_i
    assert abs(exact - float(f.mean())) < 1e-6
    estimate = float((weights * f[idx]).mean())
    standard_error = float((weights * f[idx]).std()) / len(idx) ** 0.5
    assert abs(estimate - float(f.mean())) < 5 * standard_error


# --- 6. names given as str subclasses ---------------------------------------------------------------------------------
class _Perturbation(str, __import__("enum").Enum):
    GAUSSIAN = "gaussian"
    RADEMACHER = "rademacher"


@pytest.mark.parametrize("name", ["numpy", "enum"])
def test_a_name_given_as_a_str_subclass_is_stored_as_a_plain_str_and_its_checkpoints_load(name):
    """check_choice kept a str subclass equal to a valid name as given: numpy's str_ (a setting read from an array)
    or a str enum became MeZO's perturbation or SAZO's statistic, and torch.load (weights_only=True, torch's
    default) refused their state dicts with UnpicklingError."""
    import io

    import numpy as np

    from sazo_lite.samplers import SAZOSampler
    from sazo_lite.validation import check_choice

    rademacher = np.str_("rademacher") if name == "numpy" else _Perturbation.RADEMACHER
    theta = torch.zeros(3)
    opt = sz.MeZO([theta], lr=0.1, perturbation=rademacher)
    opt.step(lambda: (theta - 1.0) ** 2)
    states = [opt.state_dict()]
    if name == "numpy":
        states.append(SAZOSampler(5, statistic=np.str_("square")).state_dict())
    for state in states:
        buffer = io.BytesIO()
        torch.save(state, buffer)
        buffer.seek(0)
        torch.load(buffer, weights_only=True)   # raised UnpicklingError
    assert type(opt.param_groups[0]["perturbation"]) is str
    assert type(check_choice("perturbation", rademacher, ("gaussian", "rademacher"))) is str
    with pytest.raises(ValueError, match="Invalid perturbation"):
        check_choice("perturbation", np.str_("uniform"), ("gaussian", "rademacher"))


# --- 7. Float32Master refuses tensors without dense data --------------------------------------------------------------
@pytest.mark.parametrize("kind", ["meta", "sparse", "nested"])
def test_float32_master_refuses_meta_sparse_and_nested_tensors_by_name(kind):
    """A sparse or nested tensor raised RuntimeError from inside the overlap check ('Cannot access data pointer',
    'NestedTensorImpl doesn't support sizes'); a meta tensor was given a meta master, a copy of no values (MeZO
    refused it only when built on the masters). Each is a ValueError naming it now."""
    import warnings

    from sazo_lite.precision import Float32Master

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")   # torch's prototype warning for nested tensors
        tensor = {"meta": lambda: torch.zeros(3, dtype=torch.float16, device="meta"),
                  "sparse": lambda: torch.eye(3, dtype=torch.float16).to_sparse(),
                  "nested": lambda: torch.nested.nested_tensor([torch.zeros(2), torch.zeros(3)])}[kind]()
    with pytest.raises(ValueError, match="Invalid params: .*(meta device|sparse|nested)"):
        Float32Master([torch.ones(2, dtype=torch.float16), tensor])


# --- 8. tensors over one memory through storages of their own --------------------------------------------------------
def test_two_tensors_made_from_one_numpy_array_are_refused_as_sharing_memory():
    """torch.from_numpy(a) and torch.from_numpy(a[2:]) each get a storage of their own over one memory; the overlap
    check compared views of one storage only, so both were accepted and every pass moved a[2:] twice (θ + 2εz
    there: the step's differences and its restore were off, silently). Their byte ranges are compared now,
    whatever storage holds them; column blocks of one array (ranges that interleave without a common entry)
    are still accepted."""
    import numpy as np

    from sazo_lite.precision import Float32Master

    a = np.zeros(6)
    overlapping = [torch.from_numpy(a), torch.from_numpy(a[2:])]
    with pytest.raises(ValueError, match="share memory"):
        sz.MeZO(overlapping, lr=0.1)
    with pytest.raises(ValueError, match="share memory"):
        Float32Master(overlapping)
    theta = torch.zeros(2)
    opt = sz.MeZO([theta], lr=0.1)
    with pytest.raises(ValueError, match="share memory"):
        opt.add_param_group({"params": overlapping})
    b = np.zeros((4, 6))
    sz.MeZO([torch.from_numpy(b[:, :3]), torch.from_numpy(b[:, 3:])], lr=0.1)   # disjoint column blocks
    sz.MeZO([torch.from_numpy(a[:3]), torch.from_numpy(a[3:])], lr=0.1)         # adjacent, not overlapping


def test_a_tensor_re_pointed_onto_memory_of_another_storage_is_refused_before_the_next_step():
    """The check between steps (``.data`` re-pointed since the last step) reads the same ranges: a tensor
    re-pointed onto a numpy-backed neighbour's memory is refused with θ untouched."""
    import numpy as np

    a = np.arange(6, dtype=np.float64)
    x, y = torch.from_numpy(a[:3]), torch.zeros(3, dtype=torch.float64)
    opt = sz.MeZO([x, y], lr=0.1)
    y.data = torch.from_numpy(a[1:4])
    with pytest.raises(ValueError, match="share memory"):
        opt.step(lambda: torch.cat([x, y]))
    assert a.tolist() == [0.0, 1.0, 2.0, 3.0, 4.0, 5.0]


# --- 9. the weights a step is given are the weights it uses ---------------------------------------------------------
def test_weights_that_are_tuned_tensors_or_edited_by_the_closure_are_read_as_given():
    """step(closure, weights) checked the weights, then read them after both passes: weights that are tuned tensors
    themselves (example weights learnt by the same optimiser) were read at θ − εz (they could be negative there,
    after the check), and a closure that wrote into its weights buffer changed g (ones, tripled by the closure: g = 9.69
    instead of 1.08). g is mean(w·d) with w as the call gave them."""
    theta = torch.zeros(4, dtype=torch.float64)
    weights = torch.ones(4, dtype=torch.float64)
    out = sz.MeZO([theta, weights], lr=0.0, eps=0.5, seed=0).step(lambda: (theta - 1.0) ** 2, weights)
    assert out.projected_grad == float(out.directional_diffs.mean())
    assert out.loss == float(out.losses.mean())

    buffer = torch.ones(4, dtype=torch.float64)

    def closure():
        buffer.mul_(3.0)
        return (theta - 1.0) ** 2

    out = sz.MeZO([theta], lr=0.0, eps=0.5, seed=0).step(closure, buffer)
    assert out.projected_grad == float(out.directional_diffs.mean())


# --- 10. threaded noise sources inside torch.inference_mode() -------------------------------------------------------
@pytest.mark.parametrize("source", ["torch", "table"])
def test_inference_tensors_step_inside_inference_mode_through_a_threaded_source(source):
    """Inference tensors step inside torch.inference_mode() (docs/guarantees.md), but inference mode is per thread:
    a source with workers (TorchNoise(workers=2), GaussianTable(workers=2), which noise="auto" picks for CPU models
    of 2²⁰ entries or more) ran its share in threads outside it, and every step raised RuntimeError ('Inplace update
    to inference tensor outside InferenceMode'). The workers take the caller's mode now; θ is the same, bit for bit,
    as the same run on ordinary tensors."""
    from sazo_lite.noise import TorchNoise

    def make():
        return (TorchNoise(workers=2, chunk=16) if source == "torch"
                else GaussianTable(size=2 ** 8, chunk=16, workers=2))

    def run(params, noise):
        opt = sz.MeZO(params, lr=0.1, eps=1e-2, seed=3, noise=noise)
        for _ in range(3):
            opt.step(lambda: torch.stack([(p - 0.5).pow(2).sum() for p in params]))
        return params

    with torch.inference_mode():
        tuned = run([torch.ones(100), torch.linspace(-1, 1, 90)], make())
    assert all(p.is_inference() for p in tuned)
    plain = run([torch.ones(100), torch.linspace(-1, 1, 90)], make())
    assert all(torch.equal(a, b) for a, b in zip(tuned, plain))


# --- 11. deepcopy and pickle of the sum trees ------------------------------------------------------------------------
def test_a_deepcopied_sum_tree_sums_its_own_leaves_and_pickles():
    """SumTree read its own leaves through a lambda; deepcopy keeps functions as they are, so a copy's sums were
    recomputed from the original's leaves after either changed (and the tree did not pickle)."""
    import copy
    import pickle

    from sazo_lite.sumtree import SumTree

    tree = SumTree(torch.tensor([1.0, 2.0, 3.0]))
    twin = copy.deepcopy(tree)
    tree.update(torch.tensor([0]), torch.tensor([10.0]))
    twin.update(torch.tensor([1]), torch.tensor([5.0]))
    assert torch.equal(twin.tree, SumTree(torch.tensor([1.0, 5.0, 3.0])).tree)
    assert torch.equal(pickle.loads(pickle.dumps(tree)).tree, SumTree(torch.tensor([10.0, 2.0, 3.0])).tree)


def test_a_deepcopied_tree_mode_sazo_sampler_draws_as_its_own_state_says():
    """A SAZO sampler in sum-tree mode (the default from N = 2¹⁶ on) counted unseen examples through a lambda bound
    to its store: a deepcopy's unseen tree read the original's counts (110 unseen where it had 196, once the
    original had moved on), so its draws followed neither its p nor its weights; pickle raised AttributeError.
    The copy now draws bit for bit as a sampler loaded from its own state."""
    import copy
    import pickle

    from sazo_lite.samplers import SAZOSampler

    original = SAZOSampler(200, sum_tree=True, seed=0)
    twin = copy.deepcopy(original)
    g = torch.Generator().manual_seed(1)
    for _ in range(30):   # the original moves on: most of its examples are seen
        idx, _ = original.sample(8)
        original.update(idx, torch.randn(8, generator=g))
    idx, _ = twin.sample(4)
    twin.update(idx, torch.ones(4))
    reference = SAZOSampler(200, sum_tree=True, seed=5)
    reference.load_state_dict(twin.state_dict())
    for _ in range(10):
        (a, wa), (b, wb) = twin.sample(16), reference.sample(16)
        assert torch.equal(a, b) and torch.equal(wa, wb)
        twin.update(a, torch.ones(16))
        reference.update(b, torch.ones(16))
    restored = pickle.loads(pickle.dumps(original))
    assert torch.equal(restored.probs, original.probs) and torch.equal(restored.sample(8)[0], original.sample(8)[0])


# --- 12. sampler states with hyperparameters set as numpy numbers -----------------------------------------------------
@pytest.mark.parametrize("kind", ["sazo", "sazo-tree", "plain", "stale"])
def test_a_sampler_state_after_a_numpy_mix_schedule_loads_with_weights_only_and_resumes(kind):
    """A λ schedule computed with numpy (sampler.uniform_mix = 0.1·exp(−t/T), an np.float64) left the numpy scalar
    in the state's hyperparameters, and torch.load (weights_only=True, its default) refused it. The state holds Python
    numbers now; a sampler loaded from it draws bit for bit as the original."""
    import io

    import numpy as np

    from sazo_lite.samplers import PlainSAZOSampler, SAZOSampler, StaleCorrectedSAZOSampler

    make = {"sazo": lambda: SAZOSampler(30, seed=2), "sazo-tree": lambda: SAZOSampler(30, seed=2, sum_tree=True),
            "plain": lambda: PlainSAZOSampler(30, seed=2), "stale": lambda: StaleCorrectedSAZOSampler(30, seed=2)}[kind]
    original, g = make(), torch.Generator().manual_seed(0)
    for t in range(6):
        original.uniform_mix = 0.2 * np.exp(-t / 4.0)
        idx, _ = original.sample(4)
        original.update(idx, torch.randn(4, generator=g, dtype=torch.float64))
    buffer = io.BytesIO()
    torch.save(original.state_dict(), buffer)
    buffer.seek(0)
    resumed = make()
    resumed.load_state_dict(torch.load(buffer, weights_only=True))   # raised UnpicklingError
    for _ in range(5):
        (a, wa), (b, wb) = original.sample(4), resumed.sample(4)
        assert torch.equal(a, b) and torch.equal(wa, wb)
        diffs = torch.randn(4, generator=g, dtype=torch.float64)
        original.update(a, diffs)
        resumed.update(b, diffs)

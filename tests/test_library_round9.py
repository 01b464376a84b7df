"""Round 9 of the library's red team: a researcher's own nn.Module and hand-written loops.

Each defect's test fails on the code before its fix; the reference tests compare the fast paths with
formulas written here, in float64.
"""
from __future__ import annotations

import warnings

import numpy as np
import pytest
import torch

import sazo_lite as sz
from sazo_lite.engine import FLAT_EXAMPLES, FLAT_STEPS, FlatLossCheck, FlatLossWarning
from sazo_lite.noise import GaussianTable, TorchNoise
from sazo_lite.samplers import StaleCorrectedSAZOSampler


def _flat_warnings(caught) -> list:
    return [w for w in caught if issubclass(w.category, FlatLossWarning)]


# --- defect 1: a closure result that shares memory with what the passes change -----------------------
def _aliasing_closures():
    """(θ, closure) pairs whose result is memory the next pass or call overwrites."""
    theta = torch.zeros(4, dtype=torch.float64)
    yield "theta itself", theta, lambda: theta          # f_i = θ_i: d_i = z_i
    theta2 = torch.zeros(4, dtype=torch.float64)
    buffer = torch.empty(4, dtype=torch.float64)        # a preallocated output, written by every call
    yield "a reused buffer", theta2, lambda: torch.mul(theta2, 1.0, out=buffer)
    theta3 = torch.zeros(3, 4, dtype=torch.float64)
    yield "a view of theta", theta3, lambda: theta3[1]


@pytest.mark.parametrize("case", [0, 1, 2])
def test_a_closure_result_sharing_memory_with_theta_or_a_reused_buffer_gives_the_true_differences(case):
    """MeZO kept the first call's tensor as L+ without a copy (float64 on the CPU: ``to`` returns it
    unchanged): the −2εz pass or the second call overwrote it, L+ − L− read 0 and the step moved nothing."""
    name, theta, closure = list(_aliasing_closures())[case]
    opt = sz.MeZO([theta], lr=0.0, eps=1e-3, noise=None, seed=4)
    seed = opt.next_seed()
    out = opt.step(closure)
    z = sz.draw_direction(theta, sz.derive_seed(seed, 0), "gaussian", torch.Generator()).double()
    expected = z if theta.dim() == 1 else z[1]                      # f = the entries themselves: d = z
    assert torch.allclose(out.directional_diffs, expected, rtol=1e-9, atol=1e-12), name
    assert out.projected_grad == pytest.approx(float(expected.mean()), rel=1e-9)


@pytest.mark.parametrize("make", [lambda: torch.ones(2, device="meta"), lambda: torch.ones(2).to_sparse()],
                         ids=["meta", "sparse"])
def test_a_closure_result_without_dense_data_is_a_value_error_and_theta_restored(make):
    """A meta or sparse tensor of losses raised NotImplementedError from inside torch."""
    theta = torch.randn(5, dtype=torch.float64)
    start = theta.clone()
    opt = sz.MeZO([theta], lr=0.1, noise=None)
    with pytest.raises(ValueError, match="Invalid closure result"):
        opt.step(make)
    assert torch.allclose(theta, start, rtol=0, atol=1e-15) and opt.step_count == 0


# --- defect 2 (known item 1): a hand-written loop over flat losses said nothing ----------------------
def _flat_loop(opt, losses, steps=20):
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        for _ in range(steps):
            opt.step(losses)
    return _flat_warnings(caught)


@pytest.mark.parametrize("batch", [1, 4])
def test_a_hand_written_loop_whose_parameters_do_not_reach_the_loss_warns_once_at_its_own_line(batch):
    """``opt.step(closure)`` in the caller's loop: merged adapters, the wrong tensors. Only
    ``sazo_lite.train`` warned; the warning now comes from the step itself, once, naming the loop's line."""
    data = torch.randn(8)
    adapter = torch.zeros(3)   # tuned, never read by the loss
    caught = _flat_loop(sz.MeZO([adapter], lr=0.01, noise=None), lambda: data[:batch] ** 2)
    assert len(caught) == 1 and "moved nothing" in str(caught[0].message)
    assert caught[0].filename == __file__


@pytest.mark.parametrize("dtype, offset", [(torch.float32, 0.0), (torch.float64, 0.0), (torch.float64, 1.0)])
def test_a_hand_written_loop_over_a_loss_that_changes_very_little_does_not_warn(dtype, offset):
    """The same losses as train's round-8 check: 1e-9·(...) in float32/64, 1 + 1e-9·(...) in float64."""
    g = torch.Generator().manual_seed(1)
    a = torch.randn(8, 5, generator=g, dtype=dtype)
    theta = torch.zeros(5, dtype=dtype)
    assert _flat_loop(sz.MeZO([theta], lr=0.01, noise=None), lambda: offset + 1e-9 * (a @ theta - 1.0) ** 2) == []
    assert bool(theta.abs().max() > 0)


def test_train_driving_a_mezo_warns_once_and_each_call_judges_its_own_first_steps():
    """No double warning (the optimiser's and train's), and train's rule unchanged: per call."""
    data = torch.randn(8)
    opt = sz.MeZO([torch.zeros(3)], lr=0.01, noise=None)
    for _ in range(2):
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            sz.train(opt, sz.UniformSampler(8), lambda idx: data[idx] ** 2, 10, batch_size=4, progress=False)
        assert len(_flat_warnings(caught)) == 1
        assert _flat_warnings(caught)[0].filename == __file__


def test_train_still_runs_the_rule_for_an_optimiser_without_one():
    """Anything whose step returns a ZOStep: train runs the same rule for it."""
    class Wrapped:
        def __init__(self, inner):
            self.inner = inner

        def step(self, closure, weights=None):
            with warnings.catch_warnings():   # only train's own check may speak
                warnings.simplefilter("ignore", FlatLossWarning)
                return self.inner.step(closure, weights)

    data = torch.randn(8)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        sz.train(Wrapped(sz.MeZO([torch.zeros(3)], lr=0.01)), sz.UniformSampler(8), lambda idx: data[idx] ** 2, 10,
                 batch_size=4, progress=False)
    assert len(_flat_warnings(caught)) == 1


def test_the_rule_is_armed_again_by_load_state_dict_and_new_param_groups():
    """A resumed run (adapters merged when saved) or an added group: their first steps are judged."""
    data = torch.randn(8)
    theta, adapter = torch.zeros(3), torch.zeros(2)
    opt = sz.MeZO([theta], lr=0.01, noise=None)
    moving = lambda: (data[:4] - theta.sum()) ** 2
    assert _flat_loop(opt, moving, steps=3) == []                      # the loss moved: the check is done
    opt.load_state_dict(opt.state_dict())
    assert len(_flat_loop(opt, lambda: data[:4] ** 2)) == 1
    opt2 = sz.MeZO([theta], lr=0.01, noise=None)
    assert _flat_loop(opt2, moving, steps=3) == []
    opt2.add_param_group({"params": [adapter]})
    assert len(_flat_loop(opt2, lambda: data[:4] ** 2)) == 1


def test_the_rule_needs_its_steps_and_examples_and_is_written_once():
    """FLAT_STEPS steps and FLAT_EXAMPLES differences; train's names are the engine's."""
    import importlib

    train_module = importlib.import_module("sazo_lite.train")   # the package's ``train`` is the function
    assert (train_module.FLAT_STEPS, train_module.FLAT_EXAMPLES) == (FLAT_STEPS, FLAT_EXAMPLES)
    assert train_module.FlatLossWarning is FlatLossWarning is sz.FlatLossWarning
    flat = sz.ZOStep(loss=0.0, projected_grad=0.0, directional_diffs=torch.zeros(1, dtype=torch.float64), seed=0,
                     losses=torch.zeros(1, dtype=torch.float64))
    check = FlatLossCheck()
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        for _ in range(FLAT_EXAMPLES - 1):   # B = 1: enough steps, one example short
            check.observe(flat)
        assert _flat_warnings(caught) == []
        check.observe(flat)
        assert len(_flat_warnings(caught)) == 1


# --- references written here: MeZO's update and the samplers' weights --------------------------------
@pytest.mark.parametrize("noise", ["plain", "torch", "table"])
@pytest.mark.parametrize("fold", [False, True])
@pytest.mark.parametrize("perturbation", ["gaussian", "rademacher"])
def test_the_fast_paths_follow_the_textbook_update_with_groups_of_their_own_lr_and_decay(noise, fold, perturbation):
    """θ_g ← (1 − η_g λ_g) θ_g − η_g ĝ z, ĝ = mean_k w_k (f_k(θ+εz) − f_k(θ−εz)) / (2ε), in float64 against
    a reference written here, with non-contiguous, zero-size and float32 tensors among the groups."""
    if noise == "table" and perturbation == "rademacher":
        pytest.skip("GaussianTable draws Rademacher z with TorchNoise: the torch case covers it")
    g = torch.Generator().manual_seed(5)
    base = torch.randn(6, 40, generator=g, dtype=torch.float64)
    a, b, empty = base.t(), torch.randn(40, generator=g, dtype=torch.float64), torch.zeros(0, 2, dtype=torch.float64)
    params = [a, b, empty]
    x = torch.randn(5, 40, generator=g, dtype=torch.float64)
    loss = lambda ps: ((x @ ps[0]).tanh().sum(1) + x @ ps[1]) ** 2          # per-example losses [5]
    source = {"plain": None, "torch": TorchNoise(workers=2, chunk=32), "table": GaussianTable(size=256, chunk=64)}[noise]
    lrs, decays = (0.02, 0.005, 0.1), (0.0, 0.3, 0.5)
    opt = sz.MeZO([{"params": [p], "lr": lr, "weight_decay": wd} for p, lr, wd in zip(params, lrs, decays)],
                  lr=1.0, eps=1e-4, seed=9, noise=source, fold_updates=fold, perturbation=perturbation)
    reference = [p.clone() for p in params]
    weights = torch.rand(5, generator=g, dtype=torch.float64) + 0.5
    for _ in range(4):
        seed = opt.next_seed()
        out = opt.step(lambda: loss(params), weights)
        if noise == "table" and perturbation == "gaussian":
            zs = [source.direction(p, sz.derive_seed(seed, k)) for k, p in enumerate(reference)]
        else:
            zs = [sz.draw_direction(p, sz.derive_seed(seed, k), perturbation, torch.Generator())
                  for k, p in enumerate(reference)]
        plus = loss([p + 1e-4 * z for p, z in zip(reference, zs)])
        minus = loss([p - 1e-4 * z for p, z in zip(reference, zs)])
        grad = float((weights * (plus - minus) / 2e-4).mean())
        assert out.projected_grad == pytest.approx(grad, rel=1e-6, abs=1e-9)
        reference = [(1 - lr * wd) * p - lr * out.projected_grad * z for p, z, lr, wd in zip(reference, zs, lrs, decays)]
    opt.flush()
    for p, r in zip(params, reference):
        assert torch.allclose(p, r, rtol=1e-10, atol=1e-10)


def _warm(sampler, rng, steps=6):
    """Feedback on half the examples, of very different sizes: seen and unseen examples side by side."""
    n = sampler.num_examples
    for _ in range(steps):
        idx = torch.from_numpy(rng.integers(0, n // 2, 2))
        sampler.update(idx, torch.from_numpy(rng.standard_normal(2) * 10.0 ** rng.integers(-3, 3, 2)))
    return sampler


@pytest.mark.parametrize("make", [
    lambda n: sz.SAZOSampler(n, sum_tree=False, seed=3),
    lambda n: sz.SAZOSampler(n, sum_tree=True, statistic="square", uniform_mix=0.01, seed=3),
    lambda n: sz.PlainSAZOSampler(n, sum_tree=True, seed=3),
    lambda n: StaleCorrectedSAZOSampler(n, growth_rate=0.5, seed=3),
], ids=["sazo", "sazo-square-tree", "plain-tree", "stale-corrected"])
def test_draws_follow_probs_and_the_weighted_mean_is_unbiased(make):
    """Frequencies against p (a chi-square statistic, 11 degrees of freedom) and E[w·f] against the exact
    mean F of f, for states with seen and unseen examples whose scores span six decades."""
    rng = np.random.default_rng(0)
    n = 12
    sampler = _warm(make(n), rng)
    assert int((sampler.counts == 0).sum()) >= n // 2
    p = sampler.probs.numpy()
    f = rng.standard_normal(n)
    counts, means = np.zeros(n), []
    for _ in range(100):
        idx, w = sampler.sample(500)
        idx, w = idx.numpy(), w.numpy()
        assert np.allclose(w, 1.0 / (n * p[idx]), rtol=1e-12)
        counts += np.bincount(idx, minlength=n)
        means.append(float((w * f[idx]).mean()))
    expected = counts.sum() * p / p.sum()
    assert float(((counts - expected) ** 2 / expected).sum()) < 40.0   # P(χ²₁₁ > 40) ≈ 3e-5
    means = np.asarray(means)
    assert abs(means.mean() - f.mean()) < 5 * means.std() / np.sqrt(len(means))


@pytest.mark.parametrize("direction", [
    lambda like: GaussianTable(size=64, chunk=16).direction(like, seed=3),
    lambda like: __import__("sazo_lite.noise", fromlist=["NoiseTable"]).NoiseTable(size=64, chunk=16).direction(
        like, seed=3, perturbation="gaussian"),
], ids=["gaussian-table", "noise-table"])
def test_the_tables_reference_direction_of_a_zero_size_tensor_is_empty(direction):
    """``direction`` (the formula the passes are checked against) raised from torch.cat on a tensor with
    no entries, which MeZO's passes accept (a zero-size tensor has no window)."""
    like = torch.zeros(0, 3)
    assert direction(like).shape == (0, 3)
    assert direction(torch.zeros(5, 3)).shape == (5, 3)


# --- defect 4: float8 parameters -----------------------------------------------------------------------
FLOAT8 = [getattr(torch, name) for name in ("float8_e4m3fn", "float8_e5m2") if hasattr(torch, name)]


@pytest.mark.parametrize("dtype", FLOAT8)
def test_float8_parameters_are_refused_at_construction_naming_the_master_copy(dtype):
    """MeZO took them, then its first step raised NotImplementedError (no aminmax, no in-place add)."""
    with pytest.raises(ValueError, match="Invalid params.*float8.*Float32Master"):
        sz.MeZO([torch.ones(4).to(dtype)], lr=0.1)


@pytest.mark.parametrize("dtype", FLOAT8)
def test_a_float32_master_of_float8_parameters_trains_and_keeps_their_range(dtype):
    """Float32Master raised RuntimeError from torch.promote_types, which refuses float8; with its
    master MeZO moves the model, and refuses a shift beyond the float8 range before anything changes."""
    from sazo_lite.precision import Float32Master

    model = torch.ones(4).to(dtype)
    master = Float32Master([model])
    assert master.tensors[0].dtype == torch.float32
    opt = sz.MeZO(master.tensors, lr=0.05, eps=0.25, noise=None, seed=1)
    for _ in range(30):
        master.step(opt, lambda: (model.float() - 3.0) ** 2)
    assert float(model.float().mean()) > 1.5
    assert torch.equal(model, master.tensors[0].to(dtype))
    large = torch.full((4,), torch.finfo(dtype).max / 2).to(dtype)
    big_master = Float32Master([large])
    before = large.clone()
    with pytest.raises(ValueError, match="would overflow"):
        big_master.step(sz.MeZO(big_master.tensors, lr=0.05, eps=torch.finfo(dtype).max / 20, noise=None),
                        lambda: large.float())
    assert torch.equal(large.float(), before.float())


# --- defect 5: train and a rate schedule of the caller's ----------------------------------------------
def test_train_records_the_rate_each_step_used_and_leaves_a_callers_schedule_alone():
    """A step hook (or an evaluate callback) that sets the rate: History.lr repeated the rate train found
    at its start, and train put that rate back when it returned, undoing the schedule."""
    g = torch.Generator().manual_seed(0)
    a = torch.randn(8, 3, generator=g, dtype=torch.float64)
    theta = torch.zeros(3, dtype=torch.float64)
    opt = sz.MeZO([theta], lr=0.1, noise=None)

    def halve(optimizer, event):
        if event.kind == "step":
            for group in optimizer.param_groups:
                group["lr"] *= 0.5

    opt.register_step_hook(halve)
    history = sz.train(opt, sz.UniformSampler(8), lambda idx: (a[idx] @ theta - 1.0) ** 2, 4, progress=False)
    assert history.lr == [0.1, 0.05, 0.025, 0.0125]
    assert opt.param_groups[0]["lr"] == 0.1 / 16


def test_train_with_a_step_rule_still_restores_the_base_rates():
    from sazo_lite.train import NoiseScaledStep

    theta = torch.zeros(3, dtype=torch.float64)
    a = torch.randn(8, 3, generator=torch.Generator().manual_seed(1), dtype=torch.float64)
    opt = sz.MeZO([theta], lr=0.1, noise=None)
    history = sz.train(opt, sz.UniformSampler(8), lambda idx: (a[idx] @ theta - 1.0) ** 2, 30, progress=False,
                       step_rule=NoiseScaledStep(warmup=2))
    assert opt.param_groups[0]["lr"] == 0.1
    assert any(rate != 0.1 for rate in history.lr)


# --- defect 6: seeds torch.Generator cannot take ---------------------------------------------------------
def _samplers_and_tables():
    from sazo_lite.noise import NoiseTable

    return [lambda seed: sz.UniformSampler(10, seed=seed), lambda seed: sz.SAZOSampler(10, seed=seed),
            lambda seed: sz.OracleSampler(10, lambda: torch.ones(10), seed=seed),
            lambda seed: NoiseTable(size=64, chunk=16, seed=seed).table("cpu", torch.float32, "gaussian"),
            lambda seed: GaussianTable(size=64, chunk=16, seed=seed).table("cpu", torch.float32)]


@pytest.mark.parametrize("make", range(5))
@pytest.mark.parametrize("seed", [2 ** 64, -2 ** 63 - 1])
def test_a_seed_beyond_what_a_torch_generator_takes_is_refused_naming_it(make, seed):
    """Accepted, then torch raised 'Overflow when unpacking long long' at construction (samplers, without
    naming the seed) or at the first pass (the tables)."""
    build = _samplers_and_tables()[make]
    if make == 4 and seed < 0:
        pytest.skip("GaussianTable takes seeds >= 0")
    with pytest.raises(ValueError, match="Invalid seed"):
        build(seed)


@pytest.mark.parametrize("make", range(5))
def test_the_ends_of_the_seed_range_still_work(make):
    build = _samplers_and_tables()[make]
    for seed in ([0, 2 ** 64 - 1] if make == 4 else [-2 ** 63, 2 ** 64 - 1]):
        build(seed)
    sampler = sz.SAZOSampler(10, seed=2 ** 64 - 1)
    state = sampler.state_dict()
    state["seed"] = 2 ** 64
    with pytest.raises(ValueError, match="Invalid seed"):
        sz.SAZOSampler(10).load_state_dict(state)


# --- defect 7: views of one matrix that interleave without sharing an entry ------------------------------
def test_column_blocks_of_one_matrix_are_accepted_and_step_like_separate_tensors():
    """A fused matrix split by columns (q and k of a QKV weight, each with its own lr): their memory ranges
    interleave, so the range test refused them as sharing memory, though no entry is shared."""
    from sazo_lite.precision import Float32Master

    fused = torch.randn(6, 8, dtype=torch.float64)
    q, k = fused[:, :4], fused[:, 4:]
    apart = [q.clone(), k.clone()]
    loss = lambda a, b: (torch.cat([a, b], 1).sum(1) - 1.0) ** 2
    groups = lambda a, b: [{"params": [a], "lr": 0.1}, {"params": [b], "lr": 0.02}]
    views = sz.MeZO(groups(q, k), lr=1.0, noise=None, seed=2)
    copies = sz.MeZO(groups(*apart), lr=1.0, noise=None, seed=2)
    for _ in range(3):
        views.step(lambda: loss(q, k))
        copies.step(lambda: loss(*apart))
    assert torch.equal(q, apart[0]) and torch.equal(k, apart[1])
    sz.MeZO([fused[:, ::2], fused[:, 1::2]], lr=0.1)          # interleaved columns
    Float32Master([q, k])


@pytest.mark.parametrize("views", [lambda w: [w[:, :5], w[:, 4:]], lambda w: [w[:, ::2], w[:, 1::2], w[:, 3:5]],
                                   lambda w: [w[0], w.t()[0]]], ids=["columns", "third-overlaps", "row-and-column"])
def test_views_that_do_share_an_entry_are_still_refused(views):
    with pytest.raises(ValueError, match="share memory"):
        sz.MeZO(views(torch.zeros(6, 8)), lr=0.1)


# --- defect 8: the float32 sum tree's draws ----------------------------------------------------------------
def _leaf_shares(tree, monkeypatch) -> np.ndarray:
    """The length of the u-interval (u ~ U[0, 1): torch.rand's draw) that lands on each leaf: the leaves'
    exact draw probabilities, found by bisection (N a power of two: leaf order follows u)."""
    n = tree.num_leaves
    real_rand = torch.rand

    def landing(us):
        monkeypatch.setattr(torch, "rand", lambda k, generator=None, dtype=None: torch.tensor(us, dtype=torch.float64))
        try:
            return tree.sample(len(us)).numpy()
        finally:
            monkeypatch.setattr(torch, "rand", real_rand)

    low, high, leaves = np.zeros(n - 1), np.ones(n - 1), np.arange(1, n)
    for _ in range(80):
        middle = (low + high) / 2
        beyond = landing(middle) >= leaves
        high, low = np.where(beyond, middle, high), np.where(beyond, low, middle)
    return np.diff(np.concatenate([[0.0], high, [1.0]]))


@pytest.mark.parametrize("leaves", [[2.0 ** 25, 1.0, 3.0, 1.0], [1.0, 2.0 ** 25 + 2, 0.5, 2.0 ** 24, 3.0, 1.0, 7.0, 1.0]],
                         ids=["small-beside-large", "eight"])
def test_a_float32_sum_tree_draws_each_leaf_in_proportion_to_its_weight(leaves, monkeypatch):
    """With float32 internal sums (SAZO's tree mode) a parent is not exactly the sum of its children; the
    descent carried an absolute u from the root, so the difference fell on one leaf: weight 1 beside
    2²⁵ was never drawn (probability 0 instead of 3e-8), or drawn too often. Each split now uses the
    children's own sums: every leaf gets its share to within the rounding of the sums on its path."""
    from sazo_lite.sumtree import SumTree

    weights = np.asarray(leaves, dtype=np.float32)
    tree = SumTree.over(len(weights), lambda idx: weights[idx].astype(np.float64), dtype=np.float32)
    shares = _leaf_shares(tree, monkeypatch)
    exact = weights.astype(np.float64) / weights.astype(np.float64).sum()
    assert np.allclose(shares, exact, rtol=1e-6, atol=0), shares / exact


# --- defect 9: TritonNoise on a tensor past int32 element ids ----------------------------------------------
def test_triton_noise_sends_tensors_past_int32_element_ids_to_its_fallback(monkeypatch):
    """The kernel's ids are int32 (program id × BLOCK + lane): a tensor of 2³¹ entries or more (an embedding
    of a 256k vocabulary × 8192) was launched anyway, with ids that wrap to negative and pass the mask.
    Checked on meta tensors (no memory) with the launch recorded, not run."""
    from sazo_lite import kernels
    from sazo_lite.noise import Job

    launched, fell_back = [], []

    class Recorder:
        def apply(self, jobs, done=None):
            fell_back.extend(job.param.numel() for job in jobs)

    monkeypatch.setattr(kernels, "_launch", lambda theta, *args: launched.append(theta.numel()))
    noise = kernels.TritonNoise(block=1024, fallback=Recorder())
    noise.usable = True   # as on a GPU
    for numel in (2 ** 31 - 2048, 2 ** 31 - 1023, 2 ** 31 + 1, 2 ** 33):   # ids up to 2³¹ − 1 fit
        noise._apply_one(Job(torch.empty(numel, device="meta"), 1, 1.0, 1.0, "gaussian"), 0)
    assert launched == [2 ** 31 - 2048, 2 ** 31 - 1023] and fell_back == [2 ** 31 + 1, 2 ** 33]


# --- defect 10: MeZO(model.parameters()) on a model with frozen weights -------------------------------------
def test_a_model_with_frozen_weights_passed_whole_warns_that_mezo_tunes_them_too():
    """torch.optim leaves requires_grad=False tensors alone (no gradient); MeZO perturbed and updated the
    frozen base of a LoRA-style model without a word. All trainable or all frozen: no warning."""
    net = torch.nn.Sequential(torch.nn.Linear(3, 3), torch.nn.Linear(3, 1))
    net[0].requires_grad_(False)
    frozen = net[0].weight.detach().clone()
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        opt = sz.MeZO(net.parameters(), lr=0.1, noise=None)
    mixed = [w for w in caught if "requires_grad=False" in str(w.message)]
    assert len(mixed) == 1 and mixed[0].filename == __file__ and "2 tensors" in str(mixed[0].message)
    opt.step(lambda: net(torch.ones(4, 3)).squeeze(1) ** 2)
    assert not torch.equal(net[0].weight, frozen)   # what the warning says: the frozen tensors move too
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        sz.MeZO([p for p in net.parameters() if p.requires_grad], lr=0.1)
        sz.MeZO([torch.zeros(2), torch.zeros(3)], lr=0.1)


# --- defect 11: variance helpers on vectors of different lengths ---------------------------------------------
@pytest.mark.parametrize("call, name", [
    (lambda v: v.sampling_variance([1.0, 2.0, 3.0], [0.5]), "probs"),
    (lambda v: v.variance_ratio([1.0, 2.0, 3.0], [0.5]), "probs"),
    (lambda v: v.zo_second_moment([1.0, 2.0], [0.5], 1.0, 10, 2), "probs"),
    (lambda v: v.tv_distance([0.5, 0.5], [1.0]), "q"),
    (lambda v: v.spearman([1.0, 2.0, 3.0], [1.0]), "b"),
], ids=["sampling_variance", "variance_ratio", "zo_second_moment", "tv_distance", "spearman"])
def test_variance_helpers_refuse_vectors_of_different_lengths(call, name):
    """torch broadcast a length-1 vector against the other: V(p) of 3 norms with 1 probability, a variance
    ratio of 0.78 (it is ≥ 1 by definition), a TV distance of 0.5: numbers, silently wrong."""
    with pytest.raises(ValueError, match=f"Invalid {name}: shape"):
        call(sz.variance)


@pytest.mark.parametrize("call, name", [
    (lambda v: v.mix_with_uniform(torch.tensor([1.0, 0.0]), 2.0), "uniform_mix"),
    (lambda v: v.mix_with_uniform(torch.tensor([1.0, 0.0]), -0.5), "uniform_mix"),
    (lambda v: v.zo_second_moment([1.0, 2.0], [0.5, 0.5], 1.0, 10, 0), "batch_size"),
    (lambda v: v.zo_second_moment([1.0, 2.0], [0.5, 0.5], 1.0, -3, 1), "dim"),
], ids=["mix-above-1", "mix-below-0", "batch-0", "dim-negative"])
def test_variance_helpers_refuse_arguments_outside_their_range(call, name):
    """mix_with_uniform(p, 2) returned [0, 1] for p = [1, 0] (a negative weight on p), zo_second_moment
    with B = 0 a ZeroDivisionError and with d < −2 a negative second moment."""
    with pytest.raises(ValueError, match=f"Invalid {name}"):
        call(sz.variance)


def test_a_flat_check_set_to_none_stays_off_in_a_loop_and_in_train():
    data = torch.randn(8)
    opt = sz.MeZO([torch.zeros(3)], lr=0.01, noise=None)
    opt.step(lambda: data[:4] ** 2)     # the first step's group check has run: what is set now stays
    opt.flat_check = None
    assert _flat_loop(opt, lambda: data[:4] ** 2) == []
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        sz.train(opt, sz.UniformSampler(8), lambda idx: data[idx] ** 2, 10, batch_size=4, progress=False)
    assert _flat_warnings(caught) == [] and opt.flat_check is None

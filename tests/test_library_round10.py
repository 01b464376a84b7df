"""Round 10 of the library's red team: hostile state dicts and seed logs, odd tensors, references.

Each defect's test fails on the code before its fix; the reference tests compare MeZO's estimate with
torch.autograd and the fast paths with the plain loop.
"""
from __future__ import annotations

import copy
import json
import warnings

import pytest
import torch

import sazo_lite as sz
from sazo_lite.samplers import StaleCorrectedSAZOSampler
from sazo_lite.seedlog import SeedLog


def _quadratic_run(steps: int = 3, seed: int = 0):
    """θ (float32 [4]) after ``steps`` MeZO steps on ‖θ − 1‖², the optimiser and the log of those steps."""
    theta = torch.zeros(4)
    opt = sz.MeZO([theta], lr=0.1, seed=seed)
    log = SeedLog.attach(opt)
    for _ in range(steps):
        opt.step(lambda: (theta - 1.0).pow(2))
    return theta, opt, log


def _edited(log: SeedLog, edit) -> bytes:
    """The log's bytes with its JSON header changed by ``edit(header)``."""
    head, _, body = log.to_bytes().partition(b"\n")
    header = json.loads(head)
    edit(header)
    return json.dumps(header).encode() + b"\n" + body


# --- defect 1: a state dict naming one parameter id twice ------------------------------------------
@pytest.mark.parametrize("ids", [[0, 0], [1, 1], [[0], 1]], ids=["first twice", "second twice", "unhashable"])
def test_a_state_dict_with_repeated_or_unhashable_parameter_ids_is_refused_with_the_optimiser_unchanged(ids):
    """torch.optim maps saved ids to tensors in order, so ids [0, 0] sent the step/seed entry to the second
    tensor: load_state_dict raised KeyError after replacing the state, and every later step raised
    'the first parameter was replaced'. An unhashable id raised TypeError."""
    a, b = torch.randn(3), torch.randn(4)
    opt = sz.MeZO([a, b], lr=0.1, seed=5)
    opt.step(lambda: (a.sum() + b.sum()).reshape(1))
    before = opt.state_dict()
    bad = copy.deepcopy(before)
    bad["param_groups"][0]["params"] = ids
    with pytest.raises(ValueError, match="Invalid state_dict: parameter ids"):
        opt.load_state_dict(bad)
    assert opt.state_dict() == before
    opt.step(lambda: (a.sum() + b.sum()).reshape(1))
    assert opt.step_count == 2


def test_a_state_dict_with_ids_repeated_across_groups_is_refused():
    a, b = torch.randn(3), torch.randn(4)
    opt = sz.MeZO([{"params": [a]}, {"params": [b]}], lr=0.1)
    bad = opt.state_dict()
    bad["param_groups"][1]["params"] = [0]
    with pytest.raises(ValueError, match="parameter ids"):
        opt.load_state_dict(bad)
    assert opt.step_count == 0


# --- defect 2: a step count past what derive_seed tells apart ---------------------------------------
@pytest.mark.parametrize("step", [2 ** 64, 2 ** 64 + 7, 2 ** 70])
def test_a_step_count_of_2_to_the_64_or_more_is_refused_not_drawing_an_earlier_steps_directions(step):
    """derive_seed reads the step by its low 64 bits: a loaded step of 2⁶⁴ + k drew step k's z again."""
    theta = torch.zeros(4)
    opt = sz.MeZO([theta], lr=0.1, seed=3)
    state = opt.state_dict()
    state["state"][0]["step"] = step
    with pytest.raises(ValueError, match="Invalid step"):
        opt.load_state_dict(state)
    assert opt.step_count == 0


def test_the_largest_step_count_still_loads():
    opt = sz.MeZO([torch.zeros(2)], lr=0.1)
    state = opt.state_dict()
    state["state"][0]["step"] = 2 ** 64 - 1
    opt.load_state_dict(state)
    assert opt.step_count == 2 ** 64 - 1


# --- defect 3: a seed log whose header hands the optimiser a seed or step it would refuse -----------
@pytest.mark.parametrize("field, value", [("base_seed", 2 ** 70), ("base_seed", 2 ** 64), ("base_seed", -2 ** 63 - 1),
                                          ("start_step", 2 ** 64)])
def test_a_seed_log_header_with_a_base_seed_or_start_step_out_of_range_is_refused(field, value):
    """derive_seed masks to 64 bits, so base seed 2⁷⁰ (or start step 2⁶⁴) passed the record checks of a
    run from seed 0 (step 0), replayed, and left the optimiser with a seed its own load_state_dict refuses
    (or a step count that draws step 0's directions again)."""
    _, _, log = _quadratic_run()
    with pytest.raises(ValueError, match=f"Invalid seed log: {field}"):
        SeedLog.from_bytes(_edited(log, lambda h: h.update({field: value})))


def test_a_seed_log_with_a_negative_base_seed_in_range_still_replays():
    theta = torch.zeros(4)
    opt = sz.MeZO([theta], lr=0.1, seed=-5)
    log = SeedLog.attach(opt)
    opt.step(lambda: (theta - 1.0).pow(2))
    copy_ = torch.zeros(4)
    SeedLog.from_bytes(log.to_bytes()).replay([copy_])
    assert torch.equal(copy_, theta)


# --- defect 4: a seed log replayed on another device -------------------------------------------------
def test_a_seed_log_records_each_tensors_device_type():
    _, _, log = _quadratic_run()
    assert log.header["groups"][0]["devices"] == ["cpu"]
    assert SeedLog.from_bytes(log.to_bytes()).header["groups"][0]["devices"] == ["cpu"]


def test_a_seed_log_from_another_device_is_refused_before_anything_moves():
    """The header held shapes and dtypes only, so a log recorded on a GPU replayed on the CPU (or the
    reverse) without a word: CUDA's generator draws other z than the CPU's for one seed (Philox against
    the Mersenne twister), and the replay rebuilt another θ."""
    theta, _, log = _quadratic_run()
    moved = SeedLog.from_bytes(_edited(log, lambda h: h["groups"][0].update(devices=["cuda"])))
    start = torch.zeros(4)
    with pytest.raises(ValueError, match="devices"):
        moved.replay([start])
    assert torch.equal(start, torch.zeros(4))
    opt = sz.MeZO([start], lr=0.1)
    with pytest.raises(ValueError, match="devices"):
        moved.replay_into(opt)
    assert torch.equal(start, torch.zeros(4)) and opt.step_count == 0


def test_a_seed_log_written_before_devices_were_recorded_still_replays():
    theta, _, log = _quadratic_run()
    old = SeedLog.from_bytes(_edited(log, lambda h: h["groups"][0].pop("devices")))
    start = torch.zeros(4)
    old.replay([start])
    assert torch.equal(start, theta)


@pytest.mark.parametrize("devices", [["cpu", "cpu"], "cpu", [0]])
def test_a_seed_log_with_malformed_devices_is_refused(devices):
    _, _, log = _quadratic_run()
    with pytest.raises(ValueError, match="Invalid seed log: param group"):
        SeedLog.from_bytes(_edited(log, lambda h: h["groups"][0].update(devices=devices)))


# --- defect 5: TritonNoise on a CPU tensor beside GPU ones --------------------------------------------------
def test_triton_noise_compiled_for_cuda_sends_cpu_tensors_to_its_fallback(monkeypatch):
    """With a GPU present the kernel was launched on every contiguous float32 tensor, a CPU-offloaded one
    too: triton refuses a CPU pointer, so every step of such a model raised (the docstring promised the
    fallback wherever the kernel cannot run). The launch is recorded here, not run (no GPU needed)."""
    from sazo_lite import kernels
    from sazo_lite.noise import Job, TorchNoise

    launched = []
    monkeypatch.setattr(kernels, "_launch", lambda theta, *args: launched.append(theta.device.type))
    noise = kernels.TritonNoise(block=1024)
    noise.usable, noise.reason = True, "cuda"   # as on a GPU machine
    theta, reference = torch.zeros(50), torch.zeros(50)
    noise.apply([Job(theta, 7, 0.5, 1.0, "gaussian")])
    TorchNoise(workers=1).apply([Job(reference, 7, 0.5, 1.0, "gaussian")])
    assert launched == [] and torch.equal(theta, reference)
    noise.usable, noise.reason = True, "interpreter"   # the interpreter runs the kernel on CPU tensors
    noise.apply([Job(torch.zeros(50), 7, 0.5, 1.0, "gaussian")])
    assert launched == ["cpu"]


# --- references: MeZO's differences against torch.autograd, through torch.func ------------------------------
def _mlp():
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(5, 7), torch.nn.Tanh(), torch.nn.Linear(7, 1)).double()
    x, y = torch.randn(6, 5, dtype=torch.float64), torch.randn(6, 1, dtype=torch.float64)
    return model, x, y


@pytest.mark.parametrize("perturbation", ["gaussian", "rademacher"])
@pytest.mark.parametrize("fold", [False, True])
def test_each_per_example_difference_is_the_autograd_directional_derivative_along_the_steps_z(perturbation, fold):
    """d_k = (f_k(θ+εz) − f_k(θ−εz))/(2ε) against ∇f_k(θ)·z from torch.func.jvp at the θ each step starts
    from (z rebuilt from the step's seed), over steps with two groups of their own lr and weight decay; the
    closure evaluates the model through torch.func.functional_call on the optimiser's own tensors."""
    from torch.func import functional_call, jvp

    model, x, y = _mlp()
    names = [name for name, _ in model.named_parameters()]
    params = [p.detach() for p in model.parameters()]   # plain tensors: MeZO moves them in place
    per_example = lambda ps: ((functional_call(model, dict(zip(names, ps)), (x,)) - y) ** 2).squeeze(1)
    opt = sz.MeZO([{"params": params[:2], "lr": 0.05, "weight_decay": 0.1}, {"params": params[2:], "lr": 0.02}],
                  lr=1.0, eps=1e-5, seed=4, perturbation=perturbation, fold_updates=fold)
    for _ in range(4):
        opt.flush()
        start, seed = [p.clone() for p in params], opt.next_seed()
        zs = [sz.draw_direction(p, sz.derive_seed(seed, k), perturbation, torch.Generator()) for k, p in enumerate(start)]
        _, exact = jvp(lambda *ps: per_example(list(ps)), tuple(start), tuple(zs))
        out = opt.step(lambda: per_example(params))
        assert torch.allclose(out.directional_diffs, exact, rtol=1e-6, atol=1e-9)
        assert out.projected_grad == pytest.approx(float(exact.mean()), rel=1e-6, abs=1e-9)


def test_the_mean_of_g_times_z_over_many_steps_is_the_autograd_gradient():
    """E[g·z] = ∇F (Gaussian z, ε → 0): the average over 1500 steps at a fixed θ (lr = 0) against
    torch.autograd, within 5 standard errors entry by entry."""
    model, x, y = _mlp()
    params = list(model.parameters())
    loss = lambda: ((model(x) - y) ** 2).mean()
    grads = torch.autograd.grad(loss(), params)
    with torch.no_grad():
        opt = sz.MeZO([p.detach() for p in params], lr=0.0, eps=1e-6, seed=2)
        samples = []
        for _ in range(1500):
            seed = opt.next_seed()
            g = opt.step(lambda: loss().reshape(1)).projected_grad
            samples.append(torch.cat([g * sz.draw_direction(p, sz.derive_seed(seed, k), "gaussian",
                                                            torch.Generator()).reshape(-1)
                                      for k, p in enumerate(params)]))
    samples = torch.stack(samples)
    exact = torch.cat([g.reshape(-1) for g in grads])
    error = (samples.mean(0) - exact).abs()
    assert bool((error <= 5 * samples.std(0) / len(samples) ** 0.5 + 1e-9).all())


# --- defect 6: SumTree fed indices or values of the wrong kind ----------------------------------------------
def test_a_sum_tree_update_with_2d_indices_is_refused_before_the_leaves_change():
    """The leaves were written, then refresh raised numpy's 'truth value of an array is ambiguous': the tree
    held leaves summing to 18 under a root of 8, and drew from neither."""
    from sazo_lite.sumtree import SumTree

    tree = SumTree(torch.ones(8, dtype=torch.float64))
    with pytest.raises(ValueError, match="Invalid indices"):
        tree.update(torch.tensor([[0, 1]]), torch.tensor([[5.0, 7.0]]))
    assert torch.equal(tree.weights(torch.arange(8)), torch.ones(8, dtype=torch.float64)) and tree.total == 8.0


@pytest.mark.parametrize("indices", [torch.tensor([0.9]), torch.tensor([-1]), torch.tensor([8]), torch.tensor([True])],
                         ids=["fractional", "negative", "past the end", "bool"])
def test_a_sum_tree_refuses_indices_that_are_not_leaves(indices):
    """A float index was truncated (0.9 updated leaf 0), −1 read or wrote the last leaf (numpy's negative
    indexing), N raised IndexError from numpy."""
    from sazo_lite.sumtree import SumTree

    tree = SumTree(torch.ones(8, dtype=torch.float64))
    with pytest.raises(ValueError, match="Invalid indices"):
        tree.weights(indices)
    with pytest.raises(ValueError, match="Invalid indices"):
        tree.update(indices, torch.tensor([5.0]))
    assert tree.total == 8.0


@pytest.mark.parametrize("values, name", [(torch.tensor([1.0, 2.0, 3.0]), "Invalid values"),
                                          (torch.tensor([1 + 2j, 3 + 0j]), "Invalid weights")],
                         ids=["three values for two indices", "complex"])
def test_a_sum_tree_refuses_values_of_the_wrong_shape_or_kind(values, name):
    """Three values for two indices raised torch's RuntimeError from expand; complex values lost their
    imaginary part silently (in the constructor too)."""
    from sazo_lite.sumtree import SumTree

    tree = SumTree(torch.ones(4, dtype=torch.float64))
    with pytest.raises(ValueError, match=name):
        tree.update(torch.tensor([0, 1]), values)
    with pytest.raises(ValueError, match="Invalid weights"):
        SumTree(torch.ones(4, dtype=torch.complex64))
    tree.update(torch.tensor([0, 1]), 2.0)   # one value for every index still works
    assert tree.total == 6.0


# --- defect 7: SeedLog.save wrote through whatever sat at its fixed temporary name ---------------------------
@pytest.mark.skipif(not hasattr(__import__("os"), "symlink"), reason="symbolic links")
def test_a_seed_log_save_does_not_write_through_a_link_left_at_a_temporary_name(tmp_path):
    """save wrote ``<path>.<pid>.tmp`` with open(..., "wb"), its own copy of atomic_write: a link left at
    that name (pids repeat: a container's process is often pid 1) had its target overwritten with the log,
    and the rename then made the log a link to it. It now goes through atomic.write_bytes (a new file)."""
    import os

    _, _, log = _quadratic_run()
    path, victim = tmp_path / "run.seedlog", tmp_path / "notes.txt"
    victim.write_text("mine")
    os.symlink(victim, f"{path}.{os.getpid()}.tmp")
    size = log.save(path)
    assert victim.read_text() == "mine"
    assert not path.is_symlink() and path.stat().st_size == size
    assert SeedLog.load(path).records == log.records


# --- defect 8: draw_direction with a misspelt perturbation ------------------------------------------------
@pytest.mark.parametrize("perturbation", ["gausian", "Gaussian", "normal", None])
def test_draw_direction_refuses_a_perturbation_it_does_not_know(perturbation):
    """Anything but "gaussian" drew Rademacher signs: a reference written with a typo compared MeZO's
    Gaussian steps against ±1 directions without a word."""
    with pytest.raises(ValueError, match="Invalid perturbation"):
        sz.draw_direction(torch.empty(5), 3, perturbation, torch.Generator())
    signs = sz.draw_direction(torch.empty(5), 3, "rademacher", torch.Generator())
    assert bool((signs.abs() == 1).all())


# --- defect 9: add_param_group after the shared eps was changed -------------------------------------------
def test_a_group_added_without_an_eps_takes_the_shared_one_after_it_was_changed():
    """A group without eps took the constructor's: once the groups' eps had been changed between steps,
    add_param_group({'params': [b]}) was refused as 'Invalid eps: 0.001 (all param groups must share one
    eps)', an eps the caller never passed."""
    a, b = torch.zeros(3), torch.zeros(2)
    opt = sz.MeZO([a], lr=0.1, eps=1e-3)
    opt.param_groups[0]["eps"] = 2e-3
    opt.step(lambda: (a - 1.0).pow(2))
    opt.add_param_group({"params": [b], "lr": 0.2})
    assert opt.param_groups[1]["eps"] == 2e-3 and opt.param_groups[1]["lr"] == 0.2
    opt.step(lambda: torch.cat([a - 1.0, b + 1.0]).pow(2))
    assert opt.step_count == 2 and bool((b != 0).all())
    with pytest.raises(ValueError, match="Invalid eps"):   # an eps of its own must still be the shared one
        opt.add_param_group({"params": [torch.zeros(1)], "eps": 1e-3})


# --- defect 10: weights and closure results torch cannot read as dense real numbers -------------------------
@pytest.mark.parametrize("weights", [lambda: torch.ones(3, device="meta"), lambda: torch.ones(3).to_sparse(),
                                     lambda: torch.nested.nested_tensor([torch.ones(3)]),
                                     lambda: [torch.tensor(True)] * 3, lambda: [torch.tensor(1 + 0j)] * 3],
                         ids=["meta", "sparse", "nested", "list of bool tensors", "list of complex tensors"])
def test_weights_without_dense_real_data_are_a_value_error_before_anything_moves(weights):
    """Meta, sparse and nested weights raised NotImplementedError or RuntimeError from torch; a list of 0-d
    bool tensors was read as weights 1.0 (the bool rule covered Python and numpy bools only)."""
    theta = torch.zeros(3)
    opt = sz.MeZO([theta], lr=0.1)
    with pytest.raises(ValueError, match="Invalid weights"):
        opt.step(lambda: (theta - 1.0).pow(2), weights())
    assert torch.equal(theta, torch.zeros(3)) and opt.step_count == 0


@pytest.mark.parametrize("result", [lambda t: [torch.tensor(True), torch.tensor(False), torch.tensor(True)],
                                    lambda t: torch.nested.nested_tensor([(t - 1.0).pow(2)])],
                         ids=["list of bool tensors", "nested"])
def test_closure_results_of_bool_tensors_or_nested_tensors_are_refused_with_theta_restored(result):
    """A list of 0-d bool tensors was read as losses 1.0 and 0.0 (a step on them); a nested tensor raised
    torch's 'Internal error: NestedTensorImpl doesn't support sizes'."""
    theta = torch.randn(3, dtype=torch.float64)
    start = theta.clone()
    opt = sz.MeZO([theta], lr=0.1, eps=1e-3)
    with pytest.raises(ValueError, match="Invalid closure result"):
        opt.step(lambda: result(theta))
    assert torch.allclose(theta, start, rtol=0, atol=1e-15) and opt.step_count == 0


# --- defect 11: samplers fed sparse or nested tensors --------------------------------------------------------
_SAMPLERS = [lambda: sz.SAZOSampler(5, seed=1), lambda: sz.PlainSAZOSampler(5, seed=1), lambda: sz.UniformSampler(5, seed=1),
             lambda: StaleCorrectedSAZOSampler(5, seed=1)]


@pytest.mark.parametrize("make", _SAMPLERS, ids=["sazo", "plain", "uniform", "stale-corrected"])
@pytest.mark.parametrize("feedback", [
    lambda: (torch.tensor([0, 1]), torch.tensor([1.0, 2.0]).to_sparse()),
    lambda: (torch.tensor([0, 1]).to_sparse(), torch.tensor([1.0, 2.0])),
    lambda: (torch.tensor([0]), torch.nested.nested_tensor([torch.tensor([1.0])])),
], ids=["sparse diffs", "sparse indices", "nested diffs"])
def test_sampler_feedback_without_dense_data_is_a_value_error_with_the_state_unchanged(make, feedback):
    """torch raised NotImplementedError (sparse) or 'Internal error: NestedTensorImpl' from inside the checks."""
    sampler = make()
    before = sampler.state_dict()
    indices, diffs = feedback()
    with pytest.raises(ValueError, match="Invalid (indices|directional_diffs)"):
        sampler.update(indices, diffs)
    assert _same(before, sampler.state_dict())


from test_hostile_core import _same_state as _same   # two state dicts hold the same values


@pytest.mark.parametrize("make", _SAMPLERS, ids=["sazo", "plain", "uniform", "stale-corrected"])
def test_a_sampler_state_with_a_sparse_generator_state_is_a_value_error(make):
    """set_state raised TypeError ('RNG state must be a torch.ByteTensor'), which the check did not catch."""
    sampler = make()
    state = sampler.state_dict()
    state["generator"] = state["generator"].to_sparse()
    with pytest.raises(ValueError, match="Invalid state: generator"):
        sampler.load_state_dict(state)


def test_an_oracle_whose_norms_are_sparse_is_a_value_error():
    oracle = sz.OracleSampler(3, lambda: torch.tensor([1.0, 2.0, 3.0]).to_sparse())
    with pytest.raises(ValueError, match="Invalid norms_fn"):
        oracle.sample(2)


# --- defect 12: a SparseMeZO log replayed through other masks of the same sizes -------------------------------
def _sparse_run(mask_seed: int = 0):
    from sazo_lite.sparse import SparseMeZO, sparse_indices

    w = torch.zeros(100)
    opt = SparseMeZO([w], sparse_indices([w], 0.1, seed=mask_seed), lr=0.1)
    log = SeedLog.attach(opt)
    for _ in range(3):
        opt.step(lambda: (w - 1.0).pow(2))
    return w, log


@pytest.mark.parametrize("masks", [lambda p: __import__("sazo_lite.sparse", fromlist=["x"]).sparse_indices(p, 0.1, seed=1),
                                   lambda p: [__import__("sazo_lite.sparse", fromlist=["x"]).sparse_indices(
                                       p, 0.1, seed=0)[0].flip(0)]],
                         ids=["other entries", "same entries in another order"])
def test_a_sparse_log_replayed_through_masks_of_the_same_sizes_but_other_entries_is_refused(masks):
    """The header held the masks' sizes only: masks from sparse_indices with another seed (or the same
    indices in another order, which pairs z with other entries) replayed every step onto other entries."""
    from sazo_lite.sparse import SparseMeZO

    _, log = _sparse_run()
    replica = torch.zeros(100)
    opt = SparseMeZO([replica], masks([replica]), lr=0.1)
    with pytest.raises(ValueError, match="masks differ"):
        SeedLog.from_bytes(log.to_bytes()).replay_into(opt)
    assert torch.equal(replica, torch.zeros(100)) and opt.step_count == 0


def test_a_sparse_log_replays_through_the_same_masks_and_without_digests_as_before():
    from sazo_lite.sparse import SparseMeZO, sparse_indices

    w, log = _sparse_run()
    for data in (log.to_bytes(), _edited(log, lambda h: h.pop("mask_digests"))):
        replica = torch.zeros(100)
        SeedLog.from_bytes(data).replay_into(SparseMeZO([replica], sparse_indices([replica], 0.1, seed=0), lr=0.1))
        assert torch.equal(replica, w)


# --- defect 13: atomic writes made every file they wrote readable by its owner only --------------------------
@pytest.mark.skipif(__import__("os").name != "posix", reason="POSIX permission bits")
@pytest.mark.parametrize("existing", [None, 0o644, 0o640, 0o664], ids=["new file", "0644", "0640", "0664"])
def test_an_atomic_write_keeps_the_permissions_open_would_give(tmp_path, existing):
    """mkstemp makes its file 0600 and the rename kept that: a report or seed log the group could read
    (0644) became 0600 at its next write, and new files were 0600 whatever the umask (open gives 0644 under
    umask 022). Seed logs are written through it since this round, so they had it too."""
    import os
    import stat

    from sazo_lite.atomic import write_json

    path = tmp_path / "report.json"
    previous = os.umask(0o022)
    try:
        if existing is not None:
            path.write_text("{}")
            os.chmod(path, existing)
        write_json(path, {"ok": 1})
        _, _, log = _quadratic_run()
        log.save(tmp_path / "run.seedlog")
    finally:
        os.umask(previous)
    assert stat.S_IMODE(os.stat(path).st_mode) == (existing if existing is not None else 0o644)
    assert stat.S_IMODE(os.stat(tmp_path / "run.seedlog").st_mode) == 0o644
    assert json.loads(path.read_text()) == {"ok": 1} and sorted(os.listdir(tmp_path)) == ["report.json", "run.seedlog"]


# --- defect 14: the variance helpers on norms or probabilities that are not ------------------------------------
from sazo_lite import variance as _variance  # noqa: E402

_HELPERS = {
    "oracle_probs": lambda v: _variance.oracle_probs(v),
    "uniform_gain": lambda v: _variance.uniform_gain(v),
    "sampling_variance norms": lambda v: _variance.sampling_variance(v, [0.5, 0.5]),
    "sampling_variance probs": lambda v: _variance.sampling_variance([1.0, 2.0], v),
    "variance_ratio norms": lambda v: _variance.variance_ratio(v, [0.5, 0.5]),
    "variance_ratio probs": lambda v: _variance.variance_ratio([1.0, 2.0], v),
    "mix_with_uniform": lambda v: _variance.mix_with_uniform(v, 0.1),
    "tv_distance": lambda v: _variance.tv_distance(v, [0.5, 0.5]),
}


@pytest.mark.parametrize("helper", list(_HELPERS), ids=list(_HELPERS))
@pytest.mark.parametrize("value", [[-1.0, 2.0], [float("nan"), 1.0], [float("inf"), 1.0], [[0.5, 0.5]],
                                   torch.tensor([0.5 + 1j, 0.5]), [True, False]],
                         ids=["negative", "nan", "inf", "a row", "complex", "bool"])
def test_the_variance_helpers_refuse_norms_and_probabilities_that_are_not_finite_non_negative_vectors(helper, value):
    """oracle_probs([-1, 2]) returned the 'probabilities' [-1, 2]; a NaN or ∞ norm fell back to uniform
    (uniform_gain read 1.0, variance_ratio 1.0); V(p) of a negative p was negative; a row [[0.5, 0.5]] was one
    example (mix_with_uniform added λ/1 to each entry); complex values lost their imaginary part."""
    with pytest.raises(ValueError, match="Invalid (norms|probs|p|q)"):
        _HELPERS[helper](value)


def test_the_second_moment_refuses_a_gradient_norm_that_is_not_one():
    for bad in (float("nan"), -1.0, float("inf")):
        with pytest.raises(ValueError, match="Invalid full_grad_norm"):
            _variance.zo_second_moment([1.0, 2.0], [0.5, 0.5], bad, 3, 2)
    assert _variance.zo_second_moment([1.0, 1.0], [0.5, 0.5], 0.0, 3, 1) == pytest.approx(5.0)

"""Round 18 (library core): regression tests, each failing on the code before its fix."""
import warnings

import pytest
import torch

import sazo_lite as sz
from sazo_lite.precision import Float32Master


def _half_model(seed=0, n=64):
    g = torch.Generator().manual_seed(seed)
    return [torch.randn(n, generator=g).to(torch.float16), torch.randn(8, 4, generator=g).to(torch.bfloat16)]


def _loss(model):
    return lambda: sum((p.float() - 0.5).pow(2).sum() for p in model).reshape(1)


# -- Float32Master keeps writes into the model made between steps ------------------------------------------------
@pytest.mark.parametrize("how", ["copy", "load_state_dict", "data"])
def test_master_follows_a_write_into_the_model_between_steps(how):
    model = _half_model()
    master = Float32Master(model)
    opt = sz.MeZO(master.tensors, lr=1e-3, eps=1e-3, noise=None)
    for _ in range(3):
        master.step(opt, _loss(model))
    new = [torch.full_like(p, 3.0) for p in model]
    if how == "load_state_dict":   # a checkpoint loaded into the module holding the tensors
        holder = torch.nn.Module()
        for k, p in enumerate(model):
            holder.register_buffer(f"t{k}", p)
        holder.load_state_dict({f"t{k}": value for k, value in enumerate(new)})
    with torch.no_grad():
        for p, value in zip(model, new):
            if how == "copy":
                p.copy_(value)
            elif how == "data":   # no version count: seen by the entry-wise compare
                p.data[...] = value
    seen = []
    opt.param_groups[0]["lr"] = 0.0
    master.step(opt, lambda: seen.append([p.float().clone() for p in model]) or _loss(model)())
    # the first forward ran at the written weights + εz (it ran at the stale masters + εz before)
    for p_seen, value in zip(seen[0], new):
        assert float((p_seen - value.float()).abs().max()) < 0.05
    for p, value in zip(model, new):   # lr = 0: the step leaves the written weights (within the shifts' rounding)
        assert float((p.float() - value.float()).abs().max()) < 0.05


def test_master_state_dict_holds_a_write_into_the_model():
    model = _half_model()
    master = Float32Master(model)
    opt = sz.MeZO(master.tensors, lr=1e-3, noise=None)
    master.step(opt, _loss(model))
    with torch.no_grad():
        model[0][:5] = 7.0
    saved = master.state_dict()["masters"]
    assert torch.equal(saved[0][:5], torch.full((5,), 7.0))
    assert torch.equal(saved[0][5:], master.tensors[0][5:])


def test_master_follow_keeps_the_precision_of_entries_not_written():
    model = _half_model()
    master = Float32Master(model)
    opt = sz.MeZO(master.tensors, lr=1e-4, noise=None)
    for _ in range(3):
        master.step(opt, _loss(model))
    before = [m.clone() for m in master.tensors]
    with torch.no_grad():
        model[1][0, 0] = 2.0
    master.follow_writes()
    assert master.tensors[1][0, 0] == 2.0
    changed = master.tensors[1] != before[1]
    assert int(changed.sum()) == 1 and torch.equal(master.tensors[0], before[0])


def test_master_folded_write_stands_and_other_tensors_keep_the_pending_update():
    model, reference_model = _half_model(), _half_model()
    runs = []
    for m in (model, reference_model):
        master = Float32Master(m)
        opt = sz.MeZO(master.tensors, lr=1e-2, noise=None, fold_updates=True)
        for _ in range(3):
            master.step(opt, _loss(m))
        runs.append((master, opt))
    (master, opt), (ref_master, ref_opt) = runs
    with torch.no_grad():
        model[0].copy_(torch.full_like(model[0], 2.0))
    master.follow_writes()   # the pending update is applied first: tensor 1 gets it, tensor 0 keeps the write
    ref_opt.flush()
    assert torch.equal(master.tensors[0], torch.full_like(master.tensors[0], 2.0))
    assert torch.equal(master.tensors[1], ref_master.tensors[1])
    assert not opt.pending


def test_master_flushed_by_the_optimiser_is_not_reverted_by_the_follow():
    # opt.state_dict() flushes a folded update into the masters without syncing the model: the stale model is no write
    runs = []
    for save_between in (False, True):
        model = _half_model()
        master = Float32Master(model)
        opt = sz.MeZO(master.tensors, lr=1e-2, noise=None, fold_updates=True)
        for step in range(4):
            if save_between and step == 2:
                opt.state_dict()
            master.step(opt, _loss(model))
        opt.flush()
        master.sync()
        runs.append([m.clone() for m in master.tensors])
    for a, b in zip(*runs):
        assert torch.equal(a, b)


def test_master_wrap_refuses_a_step_over_a_write():
    model = _half_model()
    master = Float32Master(model)
    opt = sz.MeZO(master.tensors, lr=1e-3, noise=None)
    opt.step(master.wrap(_loss(model)))
    master.sync()
    before = [m.clone() for m in master.tensors]
    with torch.no_grad():
        model[0].fill_(1.5)
    with pytest.raises(ValueError, match="written since the last sync"):
        opt.step(master.wrap(_loss(model)))
    assert all(torch.equal(a, b) for a, b in zip(before, master.tensors)) and opt.step_count == 1
    assert bool((model[0] == 1.5).all())
    master.follow_writes()
    opt.step(master.wrap(_loss(model)))
    assert opt.step_count == 2


# -- TritonNoise says what runs --------------------------------------------------------------------------------
def _quadratic(noise, steps=3, state=None):
    theta = torch.linspace(-1, 1, 40, dtype=torch.float32)
    opt = sz.MeZO([theta], lr=0.05, eps=1e-3, seed=4, noise=noise)
    if state is not None:
        opt.load_state_dict(state)
    for _ in range(steps):
        opt.step(lambda: (theta - 0.3).pow(2))
    return theta, opt


def test_triton_noise_that_cannot_run_describes_its_fallback(monkeypatch):
    from sazo_lite import kernels
    from sazo_lite.engine import NoiseSourceWarning

    monkeypatch.setattr(kernels, "triton_available", lambda: (False, "no CUDA device and TRITON_INTERPRET is not 1"))
    source = kernels.TritonNoise()
    assert sz.noise.describe(source) == sz.noise.describe(source.fallback) == "torch"
    _, plain = _quadratic(None)
    state = plain.state_dict()
    with warnings.catch_warnings():   # the same z: a resume through it is not warned
        warnings.simplefilter("error", NoiseSourceWarning)
        resumed, _ = _quadratic(source, state=state)
    reference, _ = _quadratic(None, state=state)
    assert torch.equal(resumed, reference)
    assert sz.MeZO([torch.zeros(3)], lr=0.1, noise=source).state_dict()["noise"] == "torch"


def test_triton_noise_that_runs_names_its_kernel(monkeypatch):
    from sazo_lite import kernels

    monkeypatch.setattr(kernels, "triton_available", lambda: (True, "cuda"))
    assert sz.noise.describe(kernels.TritonNoise()).startswith("triton:")


def test_triton_noise_reads_whether_triton_runs_where_it_is_unpickled(monkeypatch):
    import pickle

    from sazo_lite import kernels

    monkeypatch.setattr(kernels, "triton_available", lambda: (True, "cuda"))
    blob = pickle.dumps(kernels.TritonNoise())
    monkeypatch.setattr(kernels, "triton_available", lambda: (False, "triton is not installed (pip install triton)"))
    moved = pickle.loads(blob)
    assert not moved.usable and sz.noise.describe(moved) == "torch"


def _has_triton() -> bool:
    import importlib.util

    try:
        return importlib.util.find_spec("triton") is not None
    except (ImportError, ValueError):
        return False


@pytest.mark.skipif(not _has_triton(), reason="triton is not installed (optional: pip install triton)")
def test_triton_kernel_keys_its_z_by_the_whole_seed():
    """The kernel took seed mod 2³¹: step seeds s and s + 2³¹ (derive_seed gives 63 bits) drew one z."""
    import os
    import subprocess
    import sys
    import textwrap

    script = textwrap.dedent("""
        import torch
        from sazo_lite.kernels import triton_direction
        like = torch.empty(256)
        for pert in ["gaussian", "rademacher"]:
            s = 123456789
            base = triton_direction(like, s, pert, block=256)
            for other in (s + 2 ** 31, s + 2 ** 32, s + 2 ** 62):
                assert not torch.equal(base, triton_direction(like, other, pert, block=256)), (pert, other)
            assert torch.equal(base, triton_direction(like, s, pert, block=256))
        print("ok")
    """)
    done = subprocess.run([sys.executable, "-c", script], env=dict(os.environ, TRITON_INTERPRET="1"),
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 0 and "ok" in done.stdout, done.stderr[-3000:]


# -- seeds: what the CPU generator keeps (documented, docs/guarantees.md round 18) -----------------------------
def test_cpu_directions_depend_on_the_low_32_bits_of_a_tensor_seed_as_documented():
    from sazo_lite.directions import derive_seed, draw_direction

    like = torch.empty(32)
    a, b = derive_seed(derive_seed(0, 987), 0), derive_seed(derive_seed(0, 66010), 0)   # tensor 0 of steps 987, 66010
    assert a != b and a % 2 ** 32 == b % 2 ** 32
    for pert in ("gaussian", "rademacher"):
        assert torch.equal(draw_direction(like, a, pert, torch.Generator()), draw_direction(like, b, pert,
                                                                                             torch.Generator()))
    text = open("docs/guarantees.md").read()
    assert "steps 987 and 66,010" in text and "low 32 bits" in text


# -- a closure that replaces the noise source ------------------------------------------------------------------
@pytest.mark.parametrize("raises", [False, True])
def test_a_closure_that_replaces_the_noise_source_is_refused_and_theta_restored(raises):
    """The passes after the swap, the update and the undo drew the new source's z: a failed step left θ 0.06 off
    (float64, ε = 1e-2), a committed one moved θ along no ZO direction."""
    theta = torch.randn(1000, dtype=torch.float64, generator=torch.Generator().manual_seed(1))
    before = theta.clone()
    opt = sz.MeZO([theta], lr=0.1, eps=1e-2, noise=None)
    calls = []

    def closure():
        calls.append(1)
        if len(calls) == 1:
            opt.noise = sz.noise.GaussianTable(size=1024, chunk=256)
            if raises:
                raise RuntimeError("the closure failed")
        return theta.pow(2).sum()

    with pytest.raises(RuntimeError if raises else ValueError, match="closure"):
        opt.step(closure)
    assert opt.noise is None and opt.step_count == 0
    assert float((theta - before).abs().max()) < 1e-12


# -- named parameters, as torch.optim takes them ----------------------------------------------------------------
def test_mezo_takes_named_parameters_as_torch_optim_does():
    """``MeZO(model.named_parameters(), ...)`` was refused ("expected tensors, got tuple"); torch.optim takes the
    pairs and records ``param_names``. The run equals the unnamed one bit for bit, and its state loads."""
    torch.manual_seed(0)
    named, plain = torch.nn.Linear(3, 2), torch.nn.Linear(3, 2)
    plain.load_state_dict(named.state_dict())
    x = torch.randn(5, 3)
    opt = sz.MeZO(named.named_parameters(), lr=0.1, noise=None, seed=2)
    reference = sz.MeZO(plain.parameters(), lr=0.1, noise=None, seed=2)
    assert opt.param_groups[0]["param_names"] == ["weight", "bias"]
    for _ in range(3):
        opt.step(lambda: named(x).pow(2).mean(1))
        reference.step(lambda: plain(x).pow(2).mean(1))
    assert torch.equal(named.weight, plain.weight) and torch.equal(named.bias, plain.bias)
    state = opt.state_dict()
    assert state["param_groups"][0]["param_names"] == ["weight", "bias"]
    resumed = torch.nn.Linear(3, 2)
    resumed.load_state_dict(named.state_dict())
    again = sz.MeZO(resumed.named_parameters(), lr=0.5, noise=None)
    again.load_state_dict(state)
    opt.step(lambda: named(x).pow(2).mean(1))
    again.step(lambda: resumed(x).pow(2).mean(1))
    assert torch.equal(named.weight, resumed.weight)


def test_mezo_refuses_a_group_that_names_some_tensors_only():
    with pytest.raises(ValueError, match="Invalid params: give every tensor"):
        sz.MeZO([("a", torch.zeros(2)), torch.zeros(3)], lr=0.1)


def test_master_follow_after_a_flush_leaves_no_stale_model_behind():
    """follow_writes after ``opt.flush()`` (masters moved, model not synced) and a write recorded the masters as
    synced: a second follow (``state_dict()`` then ``step``) took the stale model for writes and undid the update."""
    model = _half_model()
    master = Float32Master(model)
    opt = sz.MeZO(master.tensors, lr=1e-1, noise=None, fold_updates=True)
    for _ in range(2):
        master.step(opt, _loss(model))
    opt.flush()
    flushed = master.tensors[1].clone()
    with torch.no_grad():
        model[0].fill_(2.0)
    master.state_dict()
    master.follow_writes()
    assert torch.equal(master.tensors[1], flushed)
    assert torch.equal(model[1], flushed.to(model[1].dtype)) and bool((master.tensors[0] == 2.0).all())

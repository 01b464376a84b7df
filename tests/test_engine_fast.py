"""Fast MeZO passes (sazo_lite.noise, sazo_lite.kernels) against the plain loop.

Tolerances: ``TorchNoise`` must equal the plain loop bit for bit (torch.equal). ``NoiseTable``
is compared with the plain formula shrink·θ + c·z, z assembled by ``NoiseTable.direction``,
to within 2 float32 ulps of |θ| + |c·z| (one rounded mul and one rounded add). The Triton
kernel (interpreter, CPU) is compared with shrink·θ + c·z, z from ``triton_direction``: relative
error ≤ 2e-7 in float32 (fused vs separate rounding) and ≤ 1e-2 in bfloat16 (one rounding to 8 bits).
"""
import copy
import os
import subprocess
import sys
import textwrap

import pytest
import torch

import sazo_lite as sz
from sazo_lite.noise import Job, NoiseTable, TorchNoise, chunk_bounds, split_jobs

SHAPES = [(3,), (17,), (64, 33), (1000, 37), (5, 3001), (12345,), (2, 4096 + 7)]  # odd sizes, tails


def random_params(seed=0, dtype=torch.float32, shapes=SHAPES):
    g = torch.Generator().manual_seed(seed)
    return [torch.randn(s, generator=g, dtype=torch.float64).to(dtype) for s in shapes]


def quadratic_closure(params, targets):
    return lambda: torch.stack([((p.double() - t) ** 2).mean() for p, t in zip(params, targets)])


def run_steps(noise, steps=3, dtype=torch.float32, perturbation="gaussian", weight_decay=0.1):
    params = random_params(dtype=dtype)
    targets = [torch.zeros(p.shape, dtype=torch.float64) for p in params]
    opt = sz.MeZO(params, lr=0.05, eps=1e-2, weight_decay=weight_decay, perturbation=perturbation,
                  seed=11, noise=noise)
    grads = [opt.step(quadratic_closure(params, targets)).projected_grad for _ in range(steps)]
    return params, grads


@pytest.mark.parametrize("perturbation", ["gaussian", "rademacher"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64, torch.bfloat16])
@pytest.mark.parametrize("workers,chunk", [(1, 16), (2, 64), (3, 1024)])
def test_torch_noise_equals_plain_loop_bit_for_bit(perturbation, dtype, workers, chunk):
    plain, plain_grads = run_steps(None, dtype=dtype, perturbation=perturbation)
    fast, fast_grads = run_steps(TorchNoise(workers=workers, chunk=chunk), dtype=dtype,
                                 perturbation=perturbation)
    assert fast_grads == plain_grads
    for a, b in zip(plain, fast):
        assert torch.equal(a, b)
    assert any(float(p.double().abs().sum()) > 0 for p in fast)  # the steps did move θ


@pytest.mark.parametrize("noise", [TorchNoise(workers=2, chunk=64), NoiseTable(size=2 ** 14, chunk=2 ** 8, workers=2)])
def test_fast_passes_work_on_parameters_that_require_grad(noise):
    """Worker threads do not inherit no_grad: in-place adds on leaves must still be allowed."""
    model = torch.nn.Sequential(torch.nn.Linear(300, 200), torch.nn.Linear(200, 1))
    x = torch.randn(8, 300)
    before = [p.detach().clone() for p in model.parameters()]
    opt = sz.MeZO(model.parameters(), lr=0.01, eps=1e-3, noise=noise)
    opt.step(lambda: model(x).squeeze(1) ** 2)
    assert all(not torch.equal(a, b) for a, b in zip(before, model.parameters()))
    assert all(p.requires_grad and p.grad is None for p in model.parameters())


def test_chunk_bounds_cover_and_merge_short_tails():
    for numel in [1, 15, 16, 31, 32, 33, 47, 48, 1000, 4096 + 7]:
        bounds = chunk_bounds(numel, 32)
        assert bounds[0][0] == 0 and bounds[-1][1] == numel
        assert all(a[1] == b[0] for a, b in zip(bounds, bounds[1:]))
        assert all(stop - start >= 16 for start, stop in bounds) or len(bounds) == 1


def test_split_jobs_balances_load_and_keeps_every_job():
    params = [torch.empty(n) for n in [100, 90, 10, 5, 1, 1]]
    jobs = [Job(p, i, 1.0, 1.0, "gaussian") for i, p in enumerate(params)]
    shares = split_jobs(jobs, 2)
    assert sorted(j.seed for share in shares for j in share) == list(range(6))
    loads = [sum(j.param.numel() for j in share) for share in shares]
    assert max(loads) - min(loads) <= 10


def test_noise_table_pass_matches_plain_formula():
    table = NoiseTable(size=2 ** 14, chunk=2 ** 8, seed=3, workers=2)
    params = random_params(seed=1)
    before = [p.clone() for p in params]
    jobs = [Job(p, sz.derive_seed(5, i), 0.3, 0.9, "gaussian") for i, p in enumerate(params)]
    table.apply(jobs)
    for p, old, job in zip(params, before, jobs):
        z = table.direction(old, job.seed, "gaussian")
        expected = 0.9 * old + 0.3 * z
        ulp = torch.finfo(torch.float32).eps
        assert torch.all((p - expected).abs() <= 2 * ulp * (old.abs() + (0.3 * z).abs()))


def test_noise_table_directions_look_standard_normal_and_differ_by_seed():
    table = NoiseTable(size=2 ** 16, chunk=2 ** 10)
    like = torch.empty(200_000)
    z1, z2 = table.direction(like, 1, "gaussian"), table.direction(like, 2, "gaussian")
    assert abs(float(z1.mean())) < 0.02 and abs(float(z1.var()) - 1) < 0.03
    assert abs(float((z1 * z2).mean())) < 0.02  # different seeds: (nearly) uncorrelated
    assert torch.equal(z1, table.direction(like, 1, "gaussian"))  # same seed: same z
    signs = table.direction(like, 1, "rademacher")
    assert set(signs.unique().tolist()) == {-1.0, 1.0}
    assert table.nbytes == 2 * 4 * 2 ** 16


def test_mezo_with_noise_table_restores_and_descends():
    params, grads = run_steps(NoiseTable(size=2 ** 14, chunk=2 ** 8), steps=40, weight_decay=0.0)
    start = random_params()
    loss = lambda ps: sum(float((p.double() ** 2).mean()) for p in ps)
    assert loss(params) < 0.9 * loss(start)
    # one failed closure: the shifts must undo themselves (to rounding)
    theta = random_params()[3]
    copy_ = theta.clone()
    opt = sz.MeZO([theta], lr=0.1, eps=1e-2, noise=NoiseTable(size=2 ** 14, chunk=2 ** 8))
    with pytest.raises(RuntimeError):
        opt.step(lambda: (_ for _ in ()).throw(RuntimeError("boom")))
    assert torch.allclose(theta, copy_, atol=1e-6)


def test_seedlog_replays_torch_noise_runs_and_refuses_table_runs():
    params = random_params()
    initial = copy.deepcopy(params)
    opt = sz.MeZO(params, lr=0.05, eps=1e-2, seed=2, noise=TorchNoise(workers=2, chunk=64))
    log = sz.SeedLog.attach(opt)
    for _ in range(3):
        opt.step(quadratic_closure(params, [torch.zeros(p.shape, dtype=torch.float64) for p in params]))
    log.replay(initial)
    assert all(torch.equal(a, b) for a, b in zip(initial, params))
    table_opt = sz.MeZO(params, lr=0.05, noise=NoiseTable(size=2 ** 12, chunk=2 ** 6))
    sz.SeedLog.attach(table_opt)
    with pytest.raises(ValueError, match="noise"):
        table_opt.step(lambda: params[0].double().sum())


@pytest.mark.parametrize("bad", [dict(workers=0), dict(chunk=24), dict(chunk=True)])
def test_torch_noise_rejects_bad_arguments(bad):
    with pytest.raises(ValueError, match=next(iter(bad))):
        TorchNoise(**bad)


@pytest.mark.parametrize("bad", [dict(size=8), dict(size=100, chunk=90), dict(seed=1.5)])
def test_noise_table_rejects_bad_arguments(bad):
    with pytest.raises(ValueError):
        NoiseTable(**bad)


def test_mezo_rejects_noise_without_apply():
    with pytest.raises(ValueError, match="noise"):
        sz.MeZO([torch.zeros(2)], lr=0.1, noise="table")


def test_auto_noise_picks_the_gaussian_table_for_large_cpu_models_only():
    from sazo_lite.engine import AUTO_NOISE_MIN_ENTRIES
    from sazo_lite.noise import GaussianTable

    assert sz.MeZO([torch.zeros(5)], lr=0.1).noise is None  # toy problems: the plain loop
    assert sz.MeZO([torch.zeros(5)], lr=0.1, noise=None).noise is None
    just_below = [(AUTO_NOISE_MIN_ENTRIES // 2,), (AUTO_NOISE_MIN_ENTRIES // 2 - 1,)]
    assert sz.MeZO(random_params(shapes=just_below), lr=0.1).noise is None
    shapes = [(AUTO_NOISE_MIN_ENTRIES // 2 + 3,), (AUTO_NOISE_MIN_ENTRIES // 2,)]  # ≥ 2²⁰ in all
    runs = {}
    for noise in ("auto", GaussianTable(), None):
        params = random_params(seed=4, shapes=shapes)
        opt = sz.MeZO(params, lr=0.05, eps=1e-2, weight_decay=0.1, seed=2, noise=noise)
        targets = [torch.zeros(p.shape, dtype=torch.float64) for p in params]
        grads = [opt.step(quadratic_closure(params, targets)).projected_grad for _ in range(2)]
        runs["explicit" if isinstance(noise, GaussianTable) else noise] = (opt.noise, params, grads)
    assert isinstance(runs["auto"][0], GaussianTable)
    assert runs["auto"][0].directions == runs["explicit"][0].directions
    assert runs["auto"][2] == runs["explicit"][2]  # "auto" is exactly the default table
    assert all(torch.equal(a, b) for a, b in zip(runs["auto"][1], runs["explicit"][1]))
    assert runs["auto"][2] != runs[None][2]  # and not randn's z (the plain loop's)


# -- Triton: on CPU through the interpreter, in a subprocess (TRITON_INTERPRET must be set
#    before triton is imported, and this process may already have imported it) -------------
def _has_triton() -> bool:
    try:
        import importlib.util
        return importlib.util.find_spec("triton") is not None
    except (ImportError, ValueError):
        return False


@pytest.mark.skipif(not _has_triton(), reason="triton is not installed (optional: pip install triton); "
                    "the CUDA kernel cannot be checked here")
def test_triton_kernel_matches_torch_formula_in_interpreter():
    script = textwrap.dedent("""
        import torch
        from sazo_lite.kernels import TritonNoise, triton_direction
        from sazo_lite.noise import Job
        noise = TritonNoise(block=65536)
        g = torch.Generator().manual_seed(0)
        for dtype, tol in [(torch.float32, 2e-7), (torch.bfloat16, 1e-2)]:
            p = torch.randn(70_000, generator=g).to(dtype)
            old = p.clone()
            for pert in ["gaussian", "rademacher"]:
                p.copy_(old)
                z = triton_direction(p, 123, pert, block=65536)
                noise.apply([Job(p, 123, 0.25, 0.5, pert)])
                expected = (0.5 * old.float() + 0.25 * z).to(dtype)
                err = float(((p.float() - expected.float()).abs() / (old.float().abs() + 0.25 * z.abs())).max())
                assert err <= tol, (dtype, pert, err)
                if pert == "gaussian":
                    assert abs(float(z.mean())) < 0.02 and abs(float(z.var()) - 1) < 0.03, z
                    assert torch.equal(z, triton_direction(p, 123, pert, block=65536))
                    assert not torch.equal(z, triton_direction(p, 124, pert, block=65536))
                else:
                    assert set(z.unique().tolist()) == {-1.0, 1.0}
        print("ok")
    """)
    env = dict(os.environ, TRITON_INTERPRET="1")
    done = subprocess.run([sys.executable, "-c", script], env=env, capture_output=True, text=True,
                          timeout=300)
    assert done.returncode == 0 and "ok" in done.stdout, done.stderr[-3000:]


def test_triton_noise_without_a_usable_triton_falls_back_to_the_plain_directions():
    from sazo_lite.kernels import TritonNoise

    noise = TritonNoise()
    if noise.usable:
        pytest.skip(f"triton is usable here ({noise.reason}); the fallback is not exercised")
    plain, _ = run_steps(None)
    fast, _ = run_steps(noise)
    assert all(torch.equal(a, b) for a, b in zip(plain, fast))
    assert "triton" in noise.reason or "CUDA" in noise.reason

"""``noise.GaussianTable`` (the default z for large CPU models) against its formula and its promises.

* the fast pass (views of the table, window by window) equals shrink·θ + c·z with z built by the
  formula z_i = σ_j · t[(o_j + i − j·chunk) mod size] in plain numpy, bit for bit;
* the white table: circular autocorrelation δ, mean 0, variance 1 (to float64 rounding);
* moments over seeds: E[z] = 0, E[z zᵀ] = I (Monte Carlo, 5 standard errors), and MeZO's
  estimate (gᵀz)z averages to autograd's gradient; mutants (no random sign, NoiseTable-style
  offsets that never wrap) fail the same checks;
* replay: a ``SeedLog`` of a default-noise run records the table and replays it bit for bit;
  other sources and hostile headers are refused.
"""
import copy
import json
import pickle

import numpy as np
import pytest
import torch

import sazo_lite as sz
from sazo_lite.directions import Z_BOUND, derive_seed
from sazo_lite.noise import GaussianTable, Job, source_for, white_table
from sazo_lite.seedlog import SeedLog


def formula_direction(source: GaussianTable, numel: int, seed: int) -> np.ndarray:
    """z by the docstring's formula, in numpy, from the bare white table (float64)."""
    t = white_table(source.size, source.seed).numpy()
    z = np.empty(numel)
    for j, start in enumerate(range(0, numel, source.chunk)):
        h = derive_seed(seed, j)
        offset, sign = h % source.size, (-1.0 if h >> 62 else 1.0)
        i = np.arange(start, min(start + source.chunk, numel))
        z[i] = sign * t[(offset + i - start) % source.size]
    return z


@pytest.mark.parametrize("numel", [1, 15, 16, 100, 257, 1000])
def test_direction_is_the_formula(numel):
    source = GaussianTable(size=64, chunk=16)
    for seed in (0, 7, 2 ** 40 + 3):
        z = source.direction(torch.empty(numel, dtype=torch.float64), seed)
        np.testing.assert_array_equal(z.numpy(), formula_direction(source, numel, seed))


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64, torch.bfloat16])
@pytest.mark.parametrize("shape", [(3,), (64, 33), (5, 301), (4097,)])
def test_fast_pass_equals_the_plain_formula_bit_for_bit(dtype, shape):
    source = GaussianTable(size=256, chunk=64, workers=2)
    g = torch.Generator().manual_seed(1)
    theta = torch.randn(shape, generator=g).to(dtype)
    for job_kw in (dict(coefficient=0.3, shrink=1.0, then=None),
                   dict(coefficient=-0.02, shrink=0.99, then=(99, 0.5, "gaussian"))):  # a folded job
        fast, plain = theta.clone(), theta.clone()
        source.apply([Job(fast, 5, perturbation="gaussian", **job_kw)])
        expected = plain.mul_(job_kw["shrink"]) if job_kw["shrink"] != 1.0 else plain
        expected.add_(source.direction(theta, 5), alpha=job_kw["coefficient"])
        if job_kw["then"] is not None:
            expected.add_(source.direction(theta, 99), alpha=0.5)
        assert torch.equal(fast, expected)
        strided = theta.t() if theta.dim() == 2 else theta[::2]  # the non-contiguous path
        expected = strided.clone().add_(source.direction(strided, 5), alpha=0.3)
        source.apply([Job(strided, 5, 0.3, 1.0, "gaussian")])
        assert torch.equal(strided, expected)


def test_undo_puts_theta_back():
    source = GaussianTable(size=256, chunk=64)
    theta = torch.randn(1000, dtype=torch.float64)
    before = theta.clone()
    job = Job(theta, 3, 0.7, 1.0, "gaussian", then=(4, -0.2, "gaussian"))
    source.apply([job])
    assert not torch.equal(theta, before)
    source.undo([job])
    torch.testing.assert_close(theta, before, rtol=0, atol=1e-14)


@pytest.mark.parametrize("size", [16, 1024, 2 ** 16])
def test_white_table_is_white(size):
    t = white_table(size, seed=3)
    autocorrelation = torch.fft.ifft(torch.fft.fft(t).abs() ** 2).real / size  # (1/size)·Σ t_n t_(n+k)
    expected = torch.zeros(size, dtype=torch.float64)
    expected[0] = 1.0
    torch.testing.assert_close(autocorrelation, expected, rtol=0, atol=1e-10)
    assert float(t.abs().max()) < Z_BOUND
    if size >= 1024:  # close to standard normal: kurtosis near 3
        assert abs(float((t ** 4).mean()) - 3) < 0.35


def test_white_table_refuses_bad_sizes():
    for bad in (0, 3, 12, 100):
        with pytest.raises(ValueError, match="size"):
            white_table(bad, seed=0)
    for bad in dict(size=100), dict(size=2 ** 31), dict(size=64, chunk=65), dict(seed=-1), dict(workers=0):
        with pytest.raises(ValueError):
            GaussianTable(**bad)


# -- moments over seeds, with mutants that must fail ---------------------------------------
class NoSign(GaussianTable):
    """Mutant: every window added with sign +1 (E[z] = mean(t) = ±1/√size, not 0)."""

    def windows(self, numel, seed):
        return [(a, b, o, 1.0) for a, b, o, _ in super().windows(numel, seed)]


class NoWrap(GaussianTable):
    """Mutant: NoiseTable-style offsets that never wrap (o < size − chunk): E[z zᵀ] ≠ I."""

    def windows(self, numel, seed):
        return [(a, b, o % (self.size - self.chunk), s) for a, b, o, s in super().windows(numel, seed)]


def moment_errors(source, numel=16, draws=12_000):
    """(max |E[z]| , max |E[z zᵀ] − I|) over ``draws`` seeds, each in standard errors."""
    z = torch.stack([source.direction(torch.empty(numel, dtype=torch.float64), seed) for seed in range(draws)])
    mean_z = z.mean(0)
    second = z.T @ z / draws
    se_mean, se_second = 1 / draws ** 0.5, (2 / draws) ** 0.5  # sd of z_i is 1; of z_i z_k ≤ √2
    return (float(mean_z.abs().max()) / se_mean,
            float((second - torch.eye(numel, dtype=torch.float64)).abs().max()) / se_second)


def test_first_and_second_moments_are_those_of_iid_normals():
    mean_err, second_err = moment_errors(GaussianTable(size=32, chunk=16))
    assert mean_err < 5 and second_err < 5


@pytest.mark.parametrize("mutant", [NoSign, NoWrap])
def test_the_moment_check_catches_mutants(mutant):
    mean_err, second_err = moment_errors(mutant(size=32, chunk=16))
    assert max(mean_err, second_err) > 8


def test_mezo_estimate_averages_to_the_autograd_gradient():
    d, draws, eps = 24, 12_000, 1e-4
    g = torch.Generator().manual_seed(0)
    a = torch.randn(d, d, generator=g, dtype=torch.float64)
    hessian, b = a @ a.T / d + torch.eye(d, dtype=torch.float64), torch.randn(d, generator=g, dtype=torch.float64)
    theta = torch.randn(d, generator=g, dtype=torch.float64, requires_grad=True)
    loss = lambda x: 0.5 * x @ hessian @ x + b @ x  # noqa: E731
    (grad,) = torch.autograd.grad(loss(theta), theta)
    theta = theta.detach()

    def mean_estimate(source):
        z = torch.stack([source.direction(theta, seed) for seed in range(draws)])  # [draws, d]
        diffs = (torch.stack([loss(theta + eps * zi) for zi in z]) -
                 torch.stack([loss(theta - eps * zi) for zi in z])) / (2 * eps)
        return (diffs[:, None] * z).mean(0), (diffs[:, None] * z).std(0) / draws ** 0.5

    estimate, se = mean_estimate(GaussianTable(size=32, chunk=8))
    assert float(((estimate - grad).abs() / se).max()) < 5
    bad, bad_se = mean_estimate(NoWrap(size=32, chunk=8))
    assert float(((bad - grad).abs() / bad_se).max()) > 5  # the check can fail


def test_same_name_same_z_and_tables_rebuild_after_pickling():
    source = GaussianTable(size=128, chunk=32, seed=4)
    like = torch.empty(300)
    z = source.direction(like, 11)
    rebuilt = source_for(source.directions)
    assert torch.equal(rebuilt.direction(like, 11), z)
    assert len(pickle.dumps(source)) < 4 * source.size  # the built table does not travel
    for clone in (copy.deepcopy(source), pickle.loads(pickle.dumps(source))):
        assert torch.equal(clone.direction(like, 11), z)
    assert not torch.equal(GaussianTable(size=128, chunk=32, seed=5).direction(like, 11), z)
    assert not torch.equal(source.direction(like, 12), z)


# -- the default: replay through seed logs ---------------------------------------------------
def default_run(steps=3, seed=2):
    from sazo_lite.engine import AUTO_NOISE_MIN_ENTRIES
    g = torch.Generator().manual_seed(seed)
    params = [torch.randn(AUTO_NOISE_MIN_ENTRIES // 2 + 5, generator=g), torch.randn(AUTO_NOISE_MIN_ENTRIES // 2, generator=g)]
    start = [p.clone() for p in params]
    opt = sz.MeZO(params, lr=0.05, eps=1e-2, weight_decay=0.01, seed=seed)  # noise="auto"
    assert isinstance(opt.noise, GaussianTable)
    log = SeedLog.attach(opt)
    for _ in range(steps):
        opt.step(lambda: torch.stack([((p - 1) ** 2).mean() for p in params]))
    return params, start, opt, log


def test_a_default_run_replays_bit_for_bit_from_its_log():
    params, start, opt, log = default_run()
    loaded = SeedLog.from_bytes(log.to_bytes())
    assert loaded.header["directions"] == opt.noise.directions
    copies = [p.clone() for p in start]
    loaded.replay(copies)
    assert all(torch.equal(a, b) for a, b in zip(copies, params))
    copies = [p.clone() for p in start]
    loaded.replay_into(sz.MeZO(copies, lr=0.05, eps=1e-2, weight_decay=0.01, seed=2,
                               noise=source_for(loaded.header["directions"]), fold_updates=True))
    assert all(torch.equal(a, b) for a, b in zip(copies, params))


def test_replay_refuses_a_source_drawing_other_directions():
    params, start, opt, log = default_run(steps=1)
    for noise in (None, sz.noise.TorchNoise(), GaussianTable(seed=1), GaussianTable(chunk=2 ** 17)):
        copies = [p.clone() for p in start]
        with pytest.raises(ValueError, match="directions"):
            log.replay_into(sz.MeZO(copies, lr=0.05, eps=1e-2, weight_decay=0.01, seed=2, noise=noise))
        assert all(torch.equal(a, b) for a, b in zip(copies, start))  # nothing replayed


def test_recording_refuses_a_source_swapped_after_attach():
    params, start, opt, log = default_run(steps=1)
    opt.noise = sz.noise.TorchNoise()
    before = [p.clone() for p in params]
    with pytest.raises(ValueError, match="directions|noise"):
        opt.step(lambda: torch.stack([((p - 1) ** 2).mean() for p in params]))
    assert all(torch.equal(a, b) for a, b in zip(params, before))


def _rewritten(log, **changes):
    head, _, body = log.to_bytes().partition(b"\n")
    header = {**json.loads(head), **changes}
    header = {k: v for k, v in header.items() if v is not None}
    return json.dumps(header).encode() + b"\n" + body


@pytest.mark.parametrize("directions", [None, "gaussian-table:size=1099511627776,chunk=16,seed=0",
                                        "gaussian-table:size=100,chunk=16,seed=0", "gaussian-table:size=64",
                                        "gaussian-table:size=64,chunk=16,seed=0,extra=1", "table", 7,
                                        "gaussian-table:size=" + "9" * 5000 + ",chunk=16,seed=0"])
def test_hostile_directions_in_a_header_are_refused(directions):
    _, _, _, log = default_run(steps=1)
    with pytest.raises(ValueError, match="Invalid seed log"):
        SeedLog.from_bytes(_rewritten(log, directions=directions))


def test_a_format_2_log_is_a_torch_run():
    g = torch.Generator().manual_seed(0)
    params = [torch.randn(50, generator=g)]
    start = [p.clone() for p in params]
    opt = sz.MeZO(params, lr=0.1, eps=1e-2, seed=1)
    log = SeedLog.attach(opt)
    opt.step(lambda: ((params[0] - 1) ** 2).mean())
    old = SeedLog.from_bytes(_rewritten(log, format=2, directions=None))
    assert old.header["directions"] == "torch"
    copies = [p.clone() for p in start]
    old.replay(copies)
    assert torch.equal(copies[0], params[0])

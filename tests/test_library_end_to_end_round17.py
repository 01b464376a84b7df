"""Round 17, the library end to end: MeZO, SparseMeZO, Float32Master, the samplers, ``train``, ``SeedLog`` and the
distributed helpers used together as a researcher would, each run checked against a plain reference written here
(a hand loop, a masked loop, a float32 loop, one process).

Each defect's test fails on the code before its fix.
"""
from __future__ import annotations

import io
import multiprocessing
import socket
import warnings

import pytest
import torch
from hypothesis import HealthCheck, given, settings, strategies as st

import sazo_lite as sz
from sazo_lite.course.problems import LeastSquares
from sazo_lite.directions import derive_seed, draw_direction
from sazo_lite.precision import Float32Master
from sazo_lite.samplers import PlainSAZOSampler, SAZOSampler, StaleCorrectedSAZOSampler, UniformSampler
from sazo_lite.sparse import SparseMeZO, sparse_indices
from sazo_lite.train import NoiseScaledStep, train

FEW = settings(max_examples=8, deadline=None, suppress_health_check=[HealthCheck.too_slow])
N, B = 24, 4
SAMPLERS = {
    "uniform": lambda: UniformSampler(N, seed=1),
    "sazo": lambda: SAZOSampler(N, seed=1),
    "sazo-tree": lambda: SAZOSampler(N, seed=1, sum_tree=True),
    "plain": lambda: PlainSAZOSampler(N, seed=1),
    "stale": lambda: StaleCorrectedSAZOSampler(N, seed=1),
}
PROBLEM = LeastSquares(num_examples=N, dim=6, heterogeneity=1.5)


def _setup(kind: str, sparse: bool, fold: bool, rule: bool, seed: int, fraction: float = 0.5):
    """θ, its optimiser (dense MeZO on the plain loop, or SparseMeZO), a sampler and a step rule (or None)."""
    theta = PROBLEM.initial_theta().clone() + 0.1
    settings_ = dict(lr=0.02, eps=1e-3, seed=seed, fold_updates=fold, weight_decay=1e-3)
    if sparse:
        opt = SparseMeZO([theta], sparse_indices([theta], fraction, seed=seed), **settings_)
    else:
        opt = sz.MeZO([theta], noise=None, **settings_)
    return theta, opt, SAMPLERS[kind](), NoiseScaledStep(warmup=3) if rule else None


def _hand_loop(theta, opt, sampler, rule, steps: int) -> None:
    """The loop README's quick start writes, with the step rule scaling the rate as ``train`` does."""
    base = opt.param_groups[0]["lr"]
    for _ in range(steps):
        if rule is not None:
            opt.param_groups[0]["lr"] = base * rule.scale()
        indices, weights = sampler.sample(B)
        out = opt.step(lambda: PROBLEM.losses(theta, indices), weights)
        if rule is not None:
            rule.observe(out.projected_grad)
        sampler.update(indices, out.directional_diffs)
    opt.param_groups[0]["lr"] = base
    opt.flush()


def _train(theta, opt, sampler, rule, steps: int) -> None:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")   # FlatLossWarning is not the subject here
        train(opt, sampler, lambda indices: PROBLEM.losses(theta, indices), steps, batch_size=B, progress=False,
              step_rule=rule)


kinds = st.sampled_from(sorted(SAMPLERS))


# --- 1. train = the hand loop, folded or not -------------------------------------------------------------------
@FEW
@given(kind=kinds, sparse=st.booleans(), rule=st.booleans(), seed=st.integers(0, 2 ** 32),
       steps=st.integers(1, 20))
def test_train_equals_the_hand_loop_and_folding_changes_nothing(kind, sparse, rule, seed, steps):
    runs = []
    for fold in (False, True):
        theta, opt, sampler, step_rule = _setup(kind, sparse, fold, rule, seed)
        _train(theta, opt, sampler, step_rule, steps)
        runs.append((theta, sampler.state_dict()))
    theta, opt, sampler, step_rule = _setup(kind, sparse, False, rule, seed)
    _hand_loop(theta, opt, sampler, step_rule, steps)
    assert not torch.equal(theta, PROBLEM.initial_theta() + 0.1)
    for other, sampler_state in runs:
        assert torch.equal(other, theta)
        assert torch.equal(sampler_state["generator"], sampler.state_dict()["generator"])


# --- 2. save and load mid-run: optimiser + sampler + step rule ---------------------------------------------------
@FEW
@given(kind=kinds, sparse=st.booleans(), fold=st.booleans(), rule=st.booleans(), seed=st.integers(0, 2 ** 32),
       first=st.integers(0, 12), second=st.integers(1, 12))
def test_a_run_saved_and_loaded_mid_way_resumes_bit_for_bit(kind, sparse, fold, rule, seed, first, second):
    theta, opt, sampler, step_rule = _setup(kind, sparse, fold, rule, seed)
    _train(theta, opt, sampler, step_rule, first + second)

    theta1, opt1, sampler1, rule1 = _setup(kind, sparse, fold, rule, seed)
    _train(theta1, opt1, sampler1, rule1, first)
    buffer = io.BytesIO()
    torch.save({"theta": theta1, "opt": opt1.state_dict(), "sampler": sampler1.state_dict(),
                "rule": rule1.state_dict() if rule1 is not None else None}, buffer)
    buffer.seek(0)
    saved = torch.load(buffer, weights_only=True)
    theta2, opt2, sampler2, rule2 = _setup(kind, sparse, fold, rule, seed)
    with torch.no_grad():
        theta2.copy_(saved["theta"])
    opt2.load_state_dict(saved["opt"])
    sampler2.load_state_dict(saved["sampler"])
    if rule2 is not None:
        rule2.load_state_dict(saved["rule"])
    _train(theta2, opt2, sampler2, rule2, second)
    assert torch.equal(theta2, theta)


# --- 3. SparseMeZO = a plain masked loop --------------------------------------------------------------------------
def _masked_reference(theta, masks, losses, *, lr, eps, wd, seed, steps, perturbation):
    """MeZO written out on the masked entries alone: z_j drawn for k_j entries from derive_seed(step seed, j),
    θ_m ← θ_m + εz, θ_m − 2εz, then θ_m ← (1 − η·wd)(θ_m + εz) − η·g·z; every other entry untouched."""
    generator = torch.Generator()
    for t in range(steps):
        step_seed = derive_seed(seed, t)
        z = [draw_direction(torch.empty(len(m), dtype=p.dtype), derive_seed(step_seed, j), perturbation, generator)
             for j, (p, m) in enumerate(zip(theta, masks))]

        def shifted(c):
            out = [p.clone() for p in theta]
            for q, m, zj in zip(out, masks, z):
                q.view(-1)[m] += c * zj
            return out

        plus, minus = losses(shifted(eps)), losses(shifted(-eps))
        g = float(((plus - minus) / (2 * eps)).mean())
        for p, m, zj in zip(theta, masks, z):
            p.view(-1)[m] = (1 - lr * wd) * p.view(-1)[m] - lr * g * zj
    return theta


@FEW
@given(fraction=st.floats(0.01, 1.0), wd=st.sampled_from([0.0, 0.05]), seed=st.integers(0, 2 ** 32),
       perturbation=st.sampled_from(["gaussian", "rademacher"]), fold=st.booleans())
def test_sparse_mezo_moves_only_its_masked_entries_as_the_masked_loop_does(fraction, wd, seed, perturbation, fold):
    generator = torch.Generator().manual_seed(seed % 1000)
    theta = [torch.randn(4, 5, generator=generator, dtype=torch.float64),
             torch.randn(7, generator=generator, dtype=torch.float64)]
    x = torch.randn(9, 5, generator=generator, dtype=torch.float64)

    def losses(params):
        w, b = params
        return ((x @ w.T).sum(1) - b.sum()) ** 2 + 0.1 * (w ** 2).sum()

    masks = sparse_indices(theta, fraction, seed=seed)
    start = [p.clone() for p in theta]
    reference = _masked_reference([p.clone() for p in theta], masks, losses, lr=1e-3, eps=1e-4, wd=wd, seed=seed,
                                  steps=6, perturbation=perturbation)
    opt = SparseMeZO(theta, masks, lr=1e-3, eps=1e-4, weight_decay=wd, seed=seed, perturbation=perturbation,
                     fold_updates=fold)
    for _ in range(6):
        opt.step(lambda: losses(theta))
    opt.flush()
    for p, q, p0, m in zip(theta, reference, start, masks):
        off = torch.ones(p.numel(), dtype=torch.bool)
        off[m] = False
        assert torch.equal(p.view(-1)[off], p0.view(-1)[off])   # never touched, bit for bit
        assert torch.allclose(p, q, rtol=1e-9, atol=1e-12)


# --- 4. Float32Master = a float32 loop evaluated in half precision; SeedLog replays it ---------------------------
class _Mixed(torch.nn.Module):
    """Tied bf16 embedding and head, an fp16 layer, a float64 scale and a float32 bias: every dtype a master keeps."""

    def __init__(self, half: torch.dtype, seed: int):
        super().__init__()
        generator = torch.Generator().manual_seed(seed)
        self.emb = torch.nn.Embedding(7, 4).to(half)
        self.head = torch.nn.Linear(4, 7, bias=False).to(half)
        self.head.weight = self.emb.weight   # tied: one tensor, reached by two modules
        self.mid = torch.nn.Linear(4, 4).to(torch.float16)
        self.scale = torch.nn.Parameter(torch.ones(4, dtype=torch.float64))
        self.bias = torch.nn.Parameter(torch.zeros(7))
        with torch.no_grad():
            for p in self.parameters():
                p.copy_(torch.randn(p.shape, generator=generator) * 0.5)

    def forward(self, tokens):
        h = self.mid(self.emb(tokens).half()).float() * self.scale.float()
        return self.head(h.to(self.emb.weight.dtype)).float() + self.bias


def _tokens(seed: int):
    generator = torch.Generator().manual_seed(seed)
    return torch.randint(0, 7, (N,), generator=generator), torch.randint(0, 7, (N,), generator=generator)


@settings(max_examples=5, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(half=st.sampled_from([torch.bfloat16, torch.float16]), sparse=st.booleans(), fold=st.booleans(),
       seed=st.integers(0, 2 ** 32), steps=st.integers(1, 10))
def test_float32_master_runs_replay_and_equal_a_plain_float32_loop(half, sparse, fold, seed, steps):
    tokens, targets = _tokens(seed % 97)
    model = _Mixed(half, seed % 89)
    start = {k: v.clone() for k, v in model.state_dict().items()}
    master = Float32Master(model.parameters())
    settings_ = dict(lr=0.05, eps=1e-2, seed=seed, fold_updates=fold, weight_decay=0.01)
    masks = sparse_indices(master.tensors, 0.5, seed=seed) if sparse else None
    opt = SparseMeZO(master.tensors, masks, **settings_) if sparse else sz.MeZO(master.tensors, noise=None, **settings_)
    log = sz.SeedLog.attach(opt)
    sampler = SAZOSampler(N, seed=seed)

    def losses(indices):
        return torch.nn.functional.cross_entropy(model(tokens[indices]), targets[indices], reduction="none")

    for _ in range(steps):
        indices, weights = sampler.sample(B)
        out = master.step(opt, lambda: losses(indices), weights)
        sampler.update(indices, out.directional_diffs)
    opt.flush()
    master.sync()
    assert model.head.weight is model.emb.weight

    # the plain reference: float32 (float64) copies tuned by the same optimiser kind, the model written from them
    # before each forward, rounded once
    reference_model = _Mixed(half, seed % 89)
    copies = [p.detach().to(torch.float64 if p.dtype == torch.float64 else torch.float32).clone()
              for p in reference_model.parameters()]
    plain = SparseMeZO(copies, masks, **settings_) if sparse else sz.MeZO(copies, noise=None, **settings_)
    reference_sampler = SAZOSampler(N, seed=seed)

    def reference_losses(indices):
        with torch.no_grad():
            for p, c in zip(reference_model.parameters(), copies):
                p.copy_(c)
        return torch.nn.functional.cross_entropy(reference_model(tokens[indices]), targets[indices],
                                                 reduction="none")

    for _ in range(steps):
        indices, weights = reference_sampler.sample(B)
        out = plain.step(lambda: reference_losses(indices), weights)
        reference_sampler.update(indices, out.directional_diffs)
    plain.flush()
    assert all(torch.equal(m, c) for m, c in zip(master.tensors, copies))

    # the seed log rebuilds the masters, and through them the half-precision model, from the starting weights
    replayed = _Mixed(half, 0)
    replayed.load_state_dict(start)
    again = Float32Master(replayed.parameters())
    log = sz.SeedLog.from_bytes(log.to_bytes())
    if sparse:
        log.replay_into(SparseMeZO(again.tensors, sparse_indices(again.tensors, 0.5, seed=seed), lr=0.0, eps=1e-2))
    else:
        log.replay(again.tensors)
    again.sync()
    assert all(torch.equal(a, b) for a, b in zip(model.parameters(), replayed.parameters()))
    assert any(not torch.equal(p, start[k]) for k, p in model.state_dict().items())


# --- 5. distributed: 3 gloo ranks = one process with the same global batch ---------------------------------------
def _distributed_run(dtype=torch.bfloat16, steps: int = 6, batch_size: int = 6) -> list[torch.Tensor]:
    """SparseMeZO through a Float32Master (folded), SAZO, ``train``: the losses of this rank's shard gathered by
    ``distributed_closure`` (one process: the whole batch)."""
    from sazo_lite.distributed import distributed_closure

    generator = torch.Generator().manual_seed(0)
    layer = torch.nn.Linear(5, 2).to(dtype)
    with torch.no_grad():
        for p in layer.parameters():
            p.copy_(torch.randn(p.shape, generator=generator))
    x, y = torch.randn(30, 5, generator=generator), torch.randn(30, 2, generator=generator)
    master = Float32Master(layer.parameters())
    opt = SparseMeZO(master.tensors, sparse_indices(master.tensors, 0.6, seed=3), lr=0.05, eps=1e-2, seed=4,
                     fold_updates=True)

    def local(indices):
        master.sync()
        return ((layer(x[indices].to(dtype)).float() - y[indices]) ** 2).sum(1)

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        train(opt, SAZOSampler(30, seed=9), lambda indices: distributed_closure(local, indices)(), steps,
              batch_size=batch_size, progress=False)
    master.sync()
    return [p.detach().float().clone() for p in layer.parameters()]


def _in_group(rank: int, world: int, port: int, results, job) -> None:
    """Run ``job(rank)`` in a gloo group of ``world`` ranks; put (rank, "ok" | "skip" | "error", result or text)."""
    import datetime
    import traceback

    import torch.distributed as dist

    torch.set_num_threads(1)
    try:
        dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=world,
                                timeout=datetime.timedelta(seconds=60))
    except Exception as error:   # the port taken, no loopback: the machine's, not the library's
        results.put((rank, "skip", repr(error)))
        return
    try:
        results.put((rank, "ok", job(rank)))
        dist.barrier()
    except BaseException:
        results.put((rank, "error", traceback.format_exc()))
    finally:
        dist.destroy_process_group()


def _spawned(job, world: int) -> dict:
    """{rank: job(rank)} from ``world`` spawned gloo ranks on localhost; skipped where the group cannot form."""
    import queue

    import torch.distributed as dist

    if not dist.is_available() or not dist.is_gloo_available():
        pytest.skip("torch.distributed with gloo is not available")
    port = _free_port()
    if port is None:
        pytest.skip("no local port to bind")
    context = multiprocessing.get_context("spawn")
    results = context.Queue()
    ranks = [context.Process(target=_in_group, args=(rank, world, port, results, job)) for rank in range(world)]
    for process in ranks:
        process.start()
    got = []
    try:
        while len(got) < world:
            try:
                got.append(results.get(timeout=5))
            except queue.Empty:
                if not any(process.is_alive() for process in ranks):
                    pytest.fail(f"the ranks ended without a result (exit codes {[p.exitcode for p in ranks]})")
    finally:
        for process in ranks:
            process.join(60)
            if process.is_alive():
                process.kill()
    if any(kind == "skip" for _, kind, _ in got):
        pytest.skip(f"no gloo group on 127.0.0.1:{port}: {[text for _, kind, text in got if kind == 'skip']}")
    errors = [text for _, kind, text in got if kind == "error"]
    assert not errors, errors[0]
    return {rank: value for rank, _, value in got}


def _three_rank_job(rank: int) -> dict:
    """What each of the three spawned ranks reports: its weights after the end-to-end run, and the parting runs."""
    return {"weights": [w.numpy() for w in _distributed_run()], "parting": _parting_runs(rank)}


@pytest.fixture(scope="module")
def three_ranks() -> dict:
    """One spawn of three gloo ranks for the distributed tests (starting the processes is most of their cost)."""
    return _spawned(_three_rank_job, 3)


def _free_port() -> int | None:
    try:
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            return s.getsockname()[1]
    except OSError:
        return None


def test_three_gloo_ranks_give_the_single_process_weights_bit_for_bit(three_ranks):
    single = _distributed_run()
    for rank in range(3):
        assert all(torch.equal(torch.from_numpy(a), b) for a, b in zip(three_ranks[rank]["weights"], single))


# --- 6. Float32Master's masters in a checkpoint ------------------------------------------------------------------
def _half_run(fold: bool):
    """A bf16 layer tuned through a Float32Master at a rate whose steps are mostly below one bf16 unit."""
    generator = torch.Generator().manual_seed(0)
    layer = torch.nn.Linear(6, 3).to(torch.bfloat16)
    with torch.no_grad():
        for p in layer.parameters():
            p.copy_(torch.randn(p.shape, generator=generator))
    master = Float32Master(layer.parameters())
    opt = sz.MeZO(master.tensors, lr=1e-3, eps=1e-2, seed=1, noise=None, fold_updates=fold)
    return layer, master, opt, SAZOSampler(20, seed=2)


_X, _Y = torch.randn(20, 6, generator=torch.Generator().manual_seed(1)), torch.randn(20, 3)


def _half_steps(layer, master, opt, sampler, steps: int) -> None:
    for _ in range(steps):
        indices, weights = sampler.sample(B)
        out = master.step(opt, lambda: ((layer(_X[indices].bfloat16()).float() - _Y[indices]) ** 2).sum(1), weights)
        sampler.update(indices, out.directional_diffs)
    opt.flush()
    master.sync()


@pytest.mark.parametrize("fold", [False, True], ids=["unfolded", "folded"])
def test_a_float32_master_run_resumes_bit_for_bit_from_its_checkpoint(fold):
    """Float32Master had no state: a checkpoint held the bf16 model, the optimiser and the sampler, and a master
    rebuilt from the bf16 weights had lost what the steps added below one bf16 unit (0.031 off after 10 more
    steps). ``state_dict()`` / ``load_state_dict()`` carry the masters."""
    whole = _half_run(fold)
    _half_steps(*whole, 20)
    first = _half_run(fold)
    _half_steps(*first, 10)
    layer, master, opt, sampler = first
    assert any(not torch.equal(m, p.float()) for m, p in zip(master.tensors, layer.parameters()))   # below an ulp
    buffer = io.BytesIO()
    torch.save({"model": layer.state_dict(), "opt": opt.state_dict(), "master": master.state_dict(),
                "sampler": sampler.state_dict()}, buffer)
    buffer.seek(0)
    saved = torch.load(buffer, weights_only=True)
    resumed = _half_run(fold)
    resumed[0].load_state_dict(saved["model"])
    resumed[1].load_state_dict(saved["master"])
    resumed[2].load_state_dict(saved["opt"])
    resumed[3].load_state_dict(saved["sampler"])
    _half_steps(*resumed, 10)
    assert all(torch.equal(a, b) for a, b in zip(whole[0].parameters(), resumed[0].parameters()))
    assert all(torch.equal(a, b) for a, b in zip(whole[1].tensors, resumed[1].tensors))


@pytest.mark.parametrize("masters", [
    None, {}, {"masters": []}, {"masters": "x"},
    lambda good: {"masters": good[:1]},
    lambda good: {"masters": [good[0].double(), good[1]]},
    lambda good: {"masters": [good[0].reshape(-1), good[1]]},
    lambda good: {"masters": [good[0], torch.full_like(good[1], float("nan"))]},
    lambda good: {"masters": [good[0], torch.full_like(good[1], 3.4e38)]},
    lambda good: {"masters": [good[0], good[1].to_sparse()]},
], ids=["None", "empty", "no masters", "str", "too few", "float64", "shape", "nan", "beyond bf16", "sparse"])
def test_a_bad_float32_master_state_is_refused_with_nothing_changed(masters):
    layer, master, _, _ = _half_run(False)
    good = master.state_dict()["masters"]
    state = masters(good) if callable(masters) else masters
    model_before = [p.clone() for p in layer.parameters()]
    with torch.no_grad():
        for m in master.tensors:
            m.add_(0.5)   # the masters apart from the model: a refused load must not sync them either
    moved = [m.clone() for m in master.tensors]
    with pytest.raises(ValueError, match="Invalid state_dict"):
        master.load_state_dict(state)
    assert all(torch.equal(a, b) for a, b in zip(master.tensors, moved))
    assert all(torch.equal(a, b) for a, b in zip(layer.parameters(), model_before))


# --- 7. distributed: ranks whose optimisers differ --------------------------------------------------------------
def _parting_run(rank: int, case: str, check: bool):
    """Ranks with the same sampler and batches; the optimiser seeded by rank, or rank 0's weights loaded from
    elsewhere. Returns the final weights, or the ValueError's message."""
    from sazo_lite.distributed import distributed_closure

    theta = PROBLEM.initial_theta().clone() + 0.1
    if case == "weights" and rank == 0:
        theta += 0.01   # a checkpoint loaded on rank 0 alone
    opt = sz.MeZO([theta], lr=0.02, eps=1e-3, seed=rank if case == "seed" else 0, noise=None)
    sampler = SAZOSampler(N, seed=1)
    try:
        for _ in range(5):
            indices, weights = sampler.sample(6)   # shards evenly over 2 or 3 ranks
            closure = distributed_closure(lambda mine: PROBLEM.losses(theta, mine), indices, opt if check else None)
            out = opt.step(closure, weights)
            sampler.update(indices, out.directional_diffs)
    except ValueError as error:
        return str(error)
    return theta.numpy().copy()


def _parting_runs(rank: int) -> dict:
    return {(case, check): _parting_run(rank, case, check) for case in ("seed", "weights") for check in (False, True)}


def test_ranks_whose_optimisers_differ_are_refused_when_the_closure_is_given_the_optimiser(three_ranks):
    """Every rank checked its batch but nothing else: a rank seeded apart (``seed=rank``) perturbed along other z,
    and a checkpoint loaded on rank 0 alone left the ranks at other weights; the gathered losses mixed them and
    every rank took the same g, so the ranks parted without a word. ``distributed_closure(..., optimizer)`` now
    compares a digest of each rank's step, seed, settings and weights in the same all-gather."""
    got = {rank: three_ranks[rank]["parting"] for rank in range(3)}
    for case in ("seed", "weights"):
        unchecked = [got[rank][(case, False)] for rank in range(2)]
        assert not any(isinstance(theta, str) for theta in unchecked)
        assert not (unchecked[0] == unchecked[1]).all()   # the hazard: the ranks part silently
        for rank in range(3):
            message = got[rank][(case, True)]
            assert isinstance(message, str) and "Invalid optimizer" in message, (case, rank, message)


def test_a_float32_master_checkpoint_taken_before_the_optimisers_holds_the_folded_update():
    """With fold_updates=True the masters hold θ − εz between steps; a checkpoint written in the natural order,
    ``{"master": master.state_dict(), "opt": opt.state_dict()}``, saved them so and the optimiser's state (flushed
    after) had no pending update: the resumed run lost a step's update, silently. ``state_dict()`` now flushes the
    optimiser last given to ``step`` first."""
    import copy
    import pickle

    whole = _half_run(True)
    _half_steps(*whole, 12)
    layer, master, opt, sampler = _half_run(True)
    for _ in range(6):
        indices, weights = sampler.sample(B)
        out = master.step(opt, lambda: ((layer(_X[indices].bfloat16()).float() - _Y[indices]) ** 2).sum(1), weights)
        sampler.update(indices, out.directional_diffs)
    assert opt.pending
    saved = {"master": master.state_dict(), "opt": opt.state_dict(), "model": layer.state_dict(),
             "sampler": sampler.state_dict()}
    resumed = _half_run(True)
    resumed[0].load_state_dict(saved["model"])
    resumed[1].load_state_dict(saved["master"])
    resumed[2].load_state_dict(saved["opt"])
    resumed[3].load_state_dict(saved["sampler"])
    _half_steps(*resumed, 6)
    assert all(torch.equal(a, b) for a, b in zip(whole[1].tensors, resumed[1].tensors))
    assert all(torch.equal(a, b) for a, b in zip(whole[0].parameters(), resumed[0].parameters()))
    # the master still copies and pickles (the reference to the optimiser is weak and stays behind)
    for clone in (copy.deepcopy(master), pickle.loads(pickle.dumps(master))):
        assert all(torch.equal(a, b) for a, b in zip(clone.tensors, master.tensors))
        assert clone.state_dict()["masters"][0] is not master.tensors[0]


def test_loading_float32_masters_under_a_folded_optimiser_with_an_update_pending_keeps_the_loaded_masters():
    """Loading a checkpoint into objects that have been stepping: the optimiser's pending folded update was applied
    on top of the loaded masters by its own ``load_state_dict`` (which flushes first), moving them off the
    checkpoint's by one update."""
    whole = _half_run(True)
    _half_steps(*whole, 12)
    first = _half_run(True)
    _half_steps(*first, 6)
    saved = {"master": first[1].state_dict(), "opt": first[2].state_dict(), "model": first[0].state_dict(),
             "sampler": first[3].state_dict()}
    layer, master, opt, sampler = _half_run(True)
    for _ in range(3):   # some other run, its last update pending
        indices, weights = sampler.sample(B)
        master.step(opt, lambda: ((layer(_X[indices].bfloat16()).float() - _Y[indices]) ** 2).sum(1), weights)
    assert opt.pending
    layer.load_state_dict(saved["model"])
    master.load_state_dict(saved["master"])
    opt.load_state_dict(saved["opt"])
    sampler.load_state_dict(saved["sampler"])
    assert all(torch.equal(a, b) for a, b in zip(master.tensors, saved["master"]["masters"]))
    _half_steps(layer, master, opt, sampler, 6)
    assert all(torch.equal(a, b) for a, b in zip(whole[1].tensors, master.tensors))


def _as_rank_of_two(monkeypatch, other: str):
    """Rank 0 of a world of two whose rank 1 gathers ``other`` as its digest (no process group needed)."""
    from sazo_lite import distributed

    monkeypatch.setattr(distributed, "rank_and_world", lambda: (0, 2))
    monkeypatch.setattr(distributed, "_gathered", lambda mine, world: [mine, other])


@pytest.mark.parametrize("change", ["masks", "seed", "lr", "weights", "step"])
def test_same_batch_names_an_optimiser_that_differs_on_another_rank(monkeypatch, change):
    """Per change, rank 1's optimiser differs in one thing from rank 0's; a SparseMeZO's masks were not in the
    digest (``sparse_indices(..., seed=rank)``: each rank perturbed other entries, gathered as one)."""
    from sazo_lite import distributed

    def build(**changed):
        theta = torch.linspace(-1, 1, 12)
        if changed.get("weights"):
            theta[3] += 1e-3
        opt = SparseMeZO([theta], sparse_indices([theta], 0.5, seed=changed.get("masks", 0)), lr=changed.get("lr", 0.1),
                         seed=changed.get("seed", 0))
        if changed.get("step"):
            opt.step(lambda: (theta ** 2).sum(0, keepdim=True))
        return opt

    indices = torch.arange(4)
    mine = build()
    other = build(**{change: {"masks": 1, "seed": 1, "lr": 0.2, "weights": True, "step": True}[change]})
    batch = distributed._batch_digest(indices)
    _as_rank_of_two(monkeypatch, batch + ":" + distributed._optimizer_digest(other))
    with pytest.raises(ValueError, match=r"Invalid optimizer: rank\(s\) \[1\]"):
        distributed.same_batch(indices, mine)
    _as_rank_of_two(monkeypatch, batch + ":" + distributed._optimizer_digest(build()))
    distributed.same_batch(indices, mine)   # the same optimiser on both ranks: no error
    _as_rank_of_two(monkeypatch, distributed._batch_digest(indices + 1) + ":" + distributed._optimizer_digest(mine))
    with pytest.raises(ValueError, match="Invalid indices"):
        distributed.same_batch(indices, mine)


def test_ctrl_c_during_a_float32_master_sync_leaves_the_model_whole(monkeypatch):
    """A Ctrl-C between two tensors' copies left the model's weights from two different steps (the weight synced,
    the bias a step behind), which a model checkpoint written in the handler then saved."""
    import os
    import signal

    layer, master, opt, sampler = _half_run(False)
    _half_steps(layer, master, opt, sampler, 3)
    with torch.no_grad():
        for m in master.tensors:
            m.add_(0.25)   # where the next sync must take the model
    copy_ = torch.Tensor.copy_
    calls = []

    def interrupted_copy(self, *args, **kwargs):
        out = copy_(self, *args, **kwargs)
        calls.append(1)
        if len(calls) == 1:
            os.kill(os.getpid(), signal.SIGINT)   # delivered at the next bytecode, between the two copies
        return out

    monkeypatch.setattr(torch.Tensor, "copy_", interrupted_copy)
    with pytest.raises(KeyboardInterrupt):
        master.sync()
    monkeypatch.undo()
    assert len(calls) == 2
    assert all(torch.equal(p, m.to(p.dtype)) for p, m in zip(layer.parameters(), master.tensors))


@settings(max_examples=5, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(sparse=st.booleans(), fold=st.booleans(), seed=st.integers(0, 2 ** 32),
       failures=st.lists(st.sampled_from([0, 0, 1, 2]), min_size=1, max_size=12),
       rates=st.lists(st.sampled_from([1.0, 1.0, 0.5, 2.0]), min_size=12, max_size=12))
def test_a_seed_log_rebuilds_an_fp16_master_run_with_failed_steps_and_rate_changes(sparse, fold, seed, failures,
                                                                                    rates):
    """Failed steps (the closure raising at the first or second forward) and lr changes between steps, through a
    Float32Master over an fp16 layer: the log's replay rebuilds the masters and the model bit for bit."""
    generator = torch.Generator().manual_seed(seed % 1000)
    layer = torch.nn.Linear(6, 3).to(torch.float16)
    with torch.no_grad():
        for p in layer.parameters():
            p.copy_(torch.randn(p.shape, generator=generator))
    start = {k: v.clone() for k, v in layer.state_dict().items()}
    x, y = torch.randn(10, 6, generator=generator), torch.randn(10, 3, generator=generator)
    master = Float32Master(layer.parameters())
    settings_ = dict(lr=0.01, eps=1e-2, seed=seed, fold_updates=fold)
    masks = sparse_indices(master.tensors, 0.4, seed=seed)
    opt = SparseMeZO(master.tensors, masks, **settings_) if sparse else sz.MeZO(master.tensors, noise=None, **settings_)
    log = sz.SeedLog.attach(opt)
    for fail_at, rate in zip(failures, rates):
        calls = []

        def closure():
            calls.append(1)
            if len(calls) == fail_at:
                raise RuntimeError("a forward failed")
            return ((layer(x.half()).float() - y) ** 2).sum(1)

        try:
            master.step(opt, closure)
        except RuntimeError:
            pass
        opt.param_groups[0]["lr"] *= rate
    opt.flush()
    master.sync()

    replayed = torch.nn.Linear(6, 3).to(torch.float16)
    replayed.load_state_dict(start)
    again = Float32Master(replayed.parameters())
    log = sz.SeedLog.from_bytes(log.to_bytes())
    if sparse:
        log.replay_into(SparseMeZO(again.tensors, sparse_indices(again.tensors, 0.4, seed=seed), lr=0.0, eps=1e-2))
    else:
        log.replay(again.tensors)
    again.sync()
    assert all(torch.equal(a, b) for a, b in zip(master.tensors, again.tensors))
    assert all(torch.equal(a, b) for a, b in zip(layer.parameters(), replayed.parameters()))

"""Folded updates (MeZO(fold_updates=True)): 2 passes a step, and the same θ as 3 passes, bit for bit.

A folded pass applies, per element and in this order, θ·shrink + c·z_t (the pending update) and
then + ε·z_{t+1}: the same rounded operations as the unfolded update pass followed by the next
step's first shift, so every comparison here is torch.equal.
"""
import copy

import pytest
import torch

import sazo_lite as sz
from sazo_lite.course import problems
from sazo_lite.engine import MeZO
from sazo_lite.noise import NoiseTable, TorchNoise

SHAPES = [(3,), (64, 33), (5, 301), (4097,)]


def random_params(seed, dtype, shapes=SHAPES):
    g = torch.Generator().manual_seed(seed)
    return [torch.randn(s, generator=g, dtype=torch.float64).to(dtype) for s in shapes]


def closure_for(params, seed):
    g = torch.Generator().manual_seed(seed)
    targets = [torch.randn(p.shape, generator=g, dtype=torch.float64) for p in params]
    return lambda: torch.stack([((p.double() - t) ** 2).mean() for p, t in zip(params, targets)])


def make_noise(kind):
    return {"plain": None, "torch": TorchNoise(workers=2, chunk=64),
            "table": NoiseTable(size=2 ** 12, chunk=2 ** 7, workers=2)}[kind]


def run(fold, *, dtype, kind, perturbation, steps, fail_at=(), seed=0):
    params = random_params(seed, dtype)
    groups = [{"params": params[:2], "lr": 0.05, "weight_decay": 0.1},
              {"params": params[2:], "lr": 0.02, "perturbation": perturbation}]
    opt = MeZO(groups, lr=0.01, eps=1e-2, seed=seed + 1, noise=make_noise(kind), fold_updates=fold)
    closure = closure_for(params, seed + 2)
    grads = []
    for step in range(steps):
        if step in fail_at:  # the closure fails on its first or second call
            calls = []
            bad_call = 1 + step % 2

            def failing():
                calls.append(1)
                if len(calls) == bad_call:
                    raise RuntimeError("injected")
                return closure()

            with pytest.raises(RuntimeError):
                opt.step(failing)
        if step == steps // 2:
            opt.param_groups[1]["lr"] = 0.03  # a schedule change between steps
        grads.append(opt.step(closure).projected_grad)
    opt.flush()
    return params, grads, opt


@pytest.mark.parametrize("kind", ["plain", "torch", "table"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64, torch.bfloat16])
@pytest.mark.parametrize("perturbation", ["gaussian", "rademacher"])
def test_folded_run_equals_unfolded_run_bit_for_bit(kind, dtype, perturbation):
    for seed in range(2):  # random inputs: two draws of parameters, targets and seeds
        plain, plain_grads, _ = run(False, dtype=dtype, kind=kind, perturbation=perturbation, steps=6,
                                    fail_at=(2, 3), seed=seed)
        folded, folded_grads, opt = run(True, dtype=dtype, kind=kind, perturbation=perturbation, steps=6,
                                        fail_at=(2, 3), seed=seed)
        assert folded_grads == plain_grads
        assert all(torch.equal(a, b) for a, b in zip(plain, folded))
        assert opt.step_count == 6 and not opt.pending
        assert not all(torch.equal(a, b) for a, b in zip(folded, random_params(seed, dtype)))


def test_between_steps_the_update_is_pending_until_flush():
    params = random_params(0, torch.float64)
    opt = MeZO(params, lr=0.1, eps=1e-2, fold_updates=True)
    before = [p.clone() for p in params]
    opt.step(closure_for(params, 1))
    assert opt.pending
    at_minus = [p.clone() for p in params]  # θ − εz: not yet updated
    reference = copy.deepcopy(before)
    MeZO(reference, lr=0.1, eps=1e-2).step(closure_for(reference, 1))
    assert not all(torch.equal(a, b) for a, b in zip(at_minus, reference))
    opt.flush()
    assert not opt.pending and all(torch.equal(a, b) for a, b in zip(params, reference))
    opt.flush()  # a second flush changes nothing
    assert all(torch.equal(a, b) for a, b in zip(params, reference))


def test_state_dict_flushes_and_a_folded_run_resumes_bit_exactly():
    straight, grads, _ = run(True, dtype=torch.float32, kind="torch", perturbation="gaussian", steps=8)
    params = random_params(0, torch.float32)
    groups = [{"params": params[:2], "lr": 0.05, "weight_decay": 0.1},
              {"params": params[2:], "lr": 0.02, "perturbation": "gaussian"}]
    opt = MeZO(groups, lr=0.01, eps=1e-2, seed=1, noise=TorchNoise(workers=2, chunk=64), fold_updates=True)
    closure = closure_for(params, 2)
    for _ in range(4):
        opt.step(closure)
    assert opt.pending
    state = copy.deepcopy(opt.state_dict())
    assert not opt.pending
    saved = [p.clone() for p in params]
    resumed = [p.clone() for p in saved]
    fresh = MeZO([{"params": resumed[:2]}, {"params": resumed[2:]}], lr=0.5, eps=1e-2, seed=99,
                 noise=TorchNoise(workers=2, chunk=64), fold_updates=True)
    fresh.load_state_dict(state)
    closure = closure_for(resumed, 2)
    for step in range(4, 8):
        if step == 4:
            fresh.param_groups[1]["lr"] = 0.03
        assert fresh.step(closure).projected_grad == grads[step]
    fresh.flush()
    assert all(torch.equal(a, b) for a, b in zip(straight, resumed))


def test_seed_log_of_a_folded_run_replays_bit_exactly():
    params = random_params(3, torch.float32)
    initial = [p.clone() for p in params]
    opt = MeZO(params, lr=0.05, eps=1e-2, weight_decay=0.01, fold_updates=True, noise=TorchNoise(chunk=64))
    log = sz.SeedLog.attach(opt)
    closure = closure_for(params, 4)
    for step in range(7):
        if step == 3:
            with pytest.raises(FloatingPointError):
                opt.step(lambda: torch.tensor(float("nan")))
        opt.step(closure)
    opt.flush()
    sz.SeedLog.from_bytes(log.to_bytes()).replay(initial)
    assert all(torch.equal(a, b) for a, b in zip(params, initial))


def test_train_flushes_before_evaluating_and_at_the_end():
    histories, finals = [], []
    for fold in (False, True):
        problem = problems.LeastSquares(num_examples=32, dim=6, seed=0)
        theta = problem.initial_theta()
        opt = MeZO([theta], lr=0.02, eps=1e-3, seed=3, fold_updates=fold)
        history = sz.train(opt, sz.UniformSampler(32, seed=1), lambda idx: problem.losses(theta, idx), 25,
                           batch_size=4, evaluate=lambda: problem.gap(theta), log_every=5, progress=False)
        histories.append(history.metrics)
        finals.append(theta.clone())
        assert not opt.pending
    assert histories[0] == histories[1]
    assert torch.equal(*finals)


def test_a_pending_update_is_applied_by_its_own_source_when_the_source_changes():
    results = []
    for fold in (False, True):
        params = random_params(5, torch.float32)
        table = NoiseTable(size=2 ** 12, chunk=2 ** 7)
        opt = MeZO(params, lr=0.05, eps=1e-2, noise=table, fold_updates=fold)
        closure = closure_for(params, 6)
        opt.step(closure)
        opt.noise = None  # another source: the table's pending update must not be redrawn by it
        opt.step(closure)
        opt.flush()
        results.append(params)
    assert all(torch.equal(a, b) for a, b in zip(*results))


def test_adding_a_param_group_flushes_first():
    params = random_params(0, torch.float64)
    opt = MeZO(params[:2], lr=0.1, fold_updates=True)
    opt.step(closure_for(params[:2], 1))
    assert opt.pending
    opt.add_param_group({"params": params[2:]})
    assert not opt.pending


@pytest.mark.parametrize("fold", [False, True])
def test_a_deep_copied_optimiser_continues_like_the_original(fold):
    params = random_params(1, torch.float32)
    opt = MeZO(params, lr=0.05, eps=1e-2, noise=TorchNoise(workers=2, chunk=64), fold_updates=fold)
    sz.SeedLog.attach(opt)
    closure = closure_for(params, 2)
    opt.step(closure)
    twin_params, twin = copy.deepcopy((params, opt))
    assert twin.fold_updates == fold and twin.pending == fold and not twin._step_hooks
    twin_closure = closure_for(twin_params, 2)
    for _ in range(3):
        assert opt.step(closure).projected_grad == twin.step(twin_closure).projected_grad
    opt.flush()
    twin.flush()
    assert all(torch.equal(a, b) for a, b in zip(params, twin_params))

"""Data-parallel ZO on torch.distributed: every rank perturbs with the same seed.

ZO needs almost no communication. All ranks hold the full model and the full O(N) sampler
state, draw the same global batch (shared sampler seed), evaluate only their contiguous
shard of it, and all-gather the per-example losses after each of the two forward passes:

    rank r evaluates indices[r·B/W : (r+1)·B/W]        (B/W examples per rank)
    all_gather → the global losses [B] on every rank    (2 × B floats per step)
    identical g, identical update, identical sampler update on every rank

So the optimiser and the sampler stay unaware of distribution: only the closure changes. It checks first that
every rank holds the same global batch (``same_batch``: one all-gather of a digest), since a rank whose sampler
drew another batch would have its losses gathered as if they were of the common one.
Per step each rank receives 2·B·(W−1)/W loss values, against DDP's all-reduce of every
gradient (≈ 2·(W−1)/W · d values).

Launch the demo with ``torchrun --nproc_per_node=2 -m sazo_lite.distributed --out w.pt``.
"""
from __future__ import annotations

import argparse
import hashlib
import os
import sys
from datetime import timedelta

import torch
import torch.distributed as dist
from torch.distributed.elastic.multiprocessing.errors import record

from .atomic import atomic_write
from .engine import MeZO
from .samplers import SAZOSampler
from .seedlog import _block_sums, _mask_digests
from .validation import check_count, check_int

__all__ = ["rank_and_world", "shard", "gather_losses", "distributed_closure", "same_batch", "communication_bytes",
           "run_demo"]


def rank_and_world() -> tuple[int, int]:
    """(rank, world size) of the default process group, or (0, 1) when there is none."""
    if dist.is_available() and dist.is_initialized():
        return dist.get_rank(), dist.get_world_size()
    return 0, 1


def shard(indices: torch.Tensor, rank: int, world_size: int) -> torch.Tensor:
    """This rank's contiguous block of the global batch (B must divide evenly).

    Raises ValueError for a world size below 1 or a rank outside [0, world_size): such a
    rank would otherwise get an empty block and silently train on nothing.
    """
    world_size = check_count("world_size", world_size)
    rank = check_int("rank", rank, 0)
    if rank >= world_size:
        raise ValueError(f"Invalid rank: {rank} (expected an int in [0, {world_size}))")
    if len(indices) % world_size:
        raise ValueError(f"Invalid batch_size: {len(indices)} is not divisible by world size {world_size}")
    size = len(indices) // world_size
    return indices[rank * size:(rank + 1) * size]


def gather_losses(local_losses: torch.Tensor) -> torch.Tensor:
    """All-gather per-example losses [B/W] into the global [B], in rank order."""
    rank, world = rank_and_world()
    if world == 1:
        return local_losses
    local_losses = local_losses.detach().contiguous()
    parts = [torch.empty_like(local_losses) for _ in range(world)]
    dist.all_gather(parts, local_losses)
    return torch.cat(parts)


def distributed_closure(batch_losses, indices: torch.Tensor, optimizer=None):
    """Wrap ``batch_losses(local_indices) -> [B/W]`` into a closure returning the global [B].

    Given the ``optimizer`` that takes the step, the ranks also check that their optimisers agree (``same_batch``'s
    ``optimizer``: the sums a SeedLog checks, of each block of each tuned tensor, one read of the parameters per
    step).

    Raises:
        ValueError: the ranks drew different global batches or their optimisers differ (``same_batch``, checked
            here, before the step), or, when the closure runs, ``batch_losses`` returned anything but a tensor of
            one loss per local index.
    """
    same_batch(indices, optimizer)   # first: every rank reaches the collective, even one whose batch has another size
    rank, world = rank_and_world()
    mine = shard(indices, rank, world)
    return lambda: gather_losses(_local_losses(batch_losses(mine), len(mine)))


def same_batch(indices, optimizer=None) -> None:
    """ValueError on every rank unless every rank holds the same global batch ``indices``: the all-gathered losses
    are those of each rank's own shard, so a rank whose sampler had another seed or state evaluated other examples,
    and every rank took the losses of two batches as one (g, the update and the samplers' feedback wrong, without a
    word). One all-gather of the batch's SHA-256 (64 hex digits) per call; nothing without a process group.

    With ``optimizer`` (a ``MeZO``) the same all-gather carries a second SHA-256 (``_optimizer_digest``): of its step
    count, next seed, groups' settings and each tuned tensor's shape, dtype and block sums. A rank seeded apart
    (``seed=rank``) perturbs along other z, and one whose weights or rate differ (a checkpoint loaded on rank 0
    alone) moves other weights by the common g: either way the ranks part without a word."""
    _, world = rank_and_world()
    if world == 1:
        return
    mine = _batch_digest(indices) + ("" if optimizer is None else ":" + _optimizer_digest(optimizer))
    digests = _gathered(mine, world)
    ranks = [rank for rank, digest in enumerate(digests) if digest[:64] != digests[0][:64]]
    if ranks:
        raise ValueError(f"Invalid indices: rank(s) {ranks} drew another global batch than rank 0 (every rank must "
                         f"draw the same batch: give the samplers the same seed and state)")
    ranks = [rank for rank, digest in enumerate(digests) if digest != digests[0]]
    if ranks:
        raise ValueError(f"Invalid optimizer: rank(s) {ranks} hold an optimiser at another step, seed, setting or "
                         f"weights than rank 0 (build it on every rank with the same seed from the same weights, and "
                         f"load a checkpoint on every rank)")


def _optimizer_digest(optimizer) -> str:
    """SHA-256 of what a step of ``optimizer`` reads besides the batch: its type, step count and next seed, a
    SparseMeZO's masks (``sparse_indices`` seeded by rank moves other entries on each rank), each group's lr, eps,
    weight decay and perturbation, each tuned tensor's shape, dtype and block sums (``seedlog._block_sums``: one
    reading pass, no float64 copy of the tensor)."""
    if not isinstance(optimizer, MeZO):
        raise ValueError(f"Invalid optimizer: {type(optimizer).__name__} (expected a MeZO)")
    parts = [type(optimizer).__name__, optimizer.step_count, optimizer.next_seed(), _mask_digests(optimizer)]
    for group in optimizer.param_groups:
        parts.append([float(group[key]).hex() for key in ("lr", "eps", "weight_decay")] + [group["perturbation"]])
        parts += [[list(p.shape), str(p.dtype), hashlib.sha256(_block_sums(p).cpu().numpy().tobytes()).hexdigest()]
                  for p in group["params"]]
    return hashlib.sha256(repr(parts).encode()).hexdigest()


def _batch_digest(indices) -> str:
    """SHA-256 of the indices as int64 (their order included: the shards are contiguous blocks of it)."""
    values = torch.as_tensor(indices).detach().to("cpu", torch.int64).reshape(-1).contiguous()
    return hashlib.sha256(values.numpy().tobytes()).hexdigest()


def _gathered(digest: str, world: int) -> list:
    """Every rank's digest, in rank order."""
    digests = [None] * world
    dist.all_gather_object(digests, digest)
    return digests


def _local_losses(losses, count: int) -> torch.Tensor:
    """One loss per local example, as a tensor [B/W]: a rank whose shard is shorter or a scalar
    would make the all-gather's parts differ in size (an error or a hang on the other ranks)."""
    if not isinstance(losses, torch.Tensor) or losses.shape != (count,):
        shape = tuple(losses.shape) if isinstance(losses, torch.Tensor) else type(losses).__name__
        raise ValueError(f"Invalid batch_losses result: {shape} (expected a tensor of {count} per-example losses, "
                         f"one per index of this rank's shard)")
    return losses


def communication_bytes(batch_size: int, num_params: int, world_size: int, bytes_per_value: int = 4) -> dict:
    """Bytes each rank receives per step: ZO's two loss all-gathers vs DDP's gradient all-reduce (not counted:
    ``distributed_closure``'s check of the batch, ``same_batch``, one all-gather of a SHA-256 digest per rank)."""
    batch_size, world_size = check_count("batch_size", batch_size), check_count("world_size", world_size)
    num_params, bytes_per_value = check_int("num_params", num_params, 0), check_count("bytes_per_value", bytes_per_value)
    share = (world_size - 1) / world_size
    return {"zo": 2 * batch_size * share * bytes_per_value,
            "ddp": 2 * num_params * share * bytes_per_value}


def _demo_problem(seed: int = 0):
    """A small MLP regression task, identical on every rank."""
    g = torch.Generator().manual_seed(seed)
    x, y = torch.randn(64, 8, generator=g), torch.randn(64, 1, generator=g)
    torch.manual_seed(seed)
    model = torch.nn.Sequential(torch.nn.Linear(8, 32), torch.nn.Tanh(), torch.nn.Linear(32, 1))
    return model, x, y


def run_demo(steps: int = 20, batch_size: int = 8, crash_rank: int = -1, crash_step: int = -1) -> dict:
    """SAZO + MeZO for ``steps`` steps on the demo task, on however many ranks are running."""
    rank, _ = rank_and_world()
    model, x, y = _demo_problem()
    opt = MeZO(model.parameters(), lr=0.01, eps=1e-3, seed=1)
    sampler = SAZOSampler(len(x), seed=2)  # same seed everywhere: same global batches

    def batch_losses(idx):
        if rank == crash_rank and opt.step_count == crash_step:
            raise RuntimeError(f"rank {rank} crashed on purpose at step {crash_step}")
        return ((model(x[idx]) - y[idx]) ** 2).squeeze(1)

    for _ in range(steps):
        idx, w = sampler.sample(batch_size)
        out = opt.step(distributed_closure(batch_losses, idx, opt), w)
        sampler.update(idx, out.directional_diffs)
    return {k: v.clone() for k, v in model.state_dict().items()}


@record  # torchrun then prints the failing rank's traceback in its summary
def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description="Data-parallel SAZO demo (launch with torchrun)")
    parser.add_argument("--steps", type=int, default=20)
    parser.add_argument("--batch-size", type=int, default=8)
    parser.add_argument("--out", default=None, help="rank 0 saves the final weights here")
    parser.add_argument("--crash-rank", type=int, default=-1)
    parser.add_argument("--crash-step", type=int, default=-1)
    parser.add_argument("--timeout", type=float, default=30.0, help="process-group timeout, seconds")
    args = parser.parse_args(argv)
    backend = os.environ.get("SAZO_BACKEND", "gloo")  # "nccl" when losses live on CUDA devices
    dist.init_process_group(backend, timeout=timedelta(seconds=args.timeout))
    try:
        weights = run_demo(args.steps, args.batch_size, args.crash_rank, args.crash_step)
        if dist.get_rank() == 0 and args.out:      # atomic: a reader never sees half a file
            atomic_write(args.out, lambda handle: torch.save(weights, handle))
        dist.barrier()  # no rank tears down while another still talks to it
    finally:
        dist.destroy_process_group()


def _exit_now() -> None:
    """Leave without interpreter finalisation once everything is saved and torn down.

    Gloo's C++ threads can abort the process while Python finalises ("terminate called without
    an active exception", about 1 run in 30 here, both ranks at once; see pytorch#179291), which
    would turn a finished run into a failed job. Nothing is left to clean up at this point.
    """
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)


if __name__ == "__main__":
    main()
    _exit_now()

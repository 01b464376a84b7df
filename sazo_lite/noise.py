"""Faster MeZO passes: where z comes from, and how θ ← a·θ + c·z is applied to every tensor.

A MeZO pass over the parameters is dominated by generating z, not by the add (measured here on
SmolLM2-135M: one seeded ``randn`` + ``add_`` pass ≈ 1.2 s, the ``add_`` alone ≈ 0.06 s). Pass
one of these objects as ``MeZO(..., noise=...)``; ``noise=None`` keeps the plain loop.

``TorchNoise`` (same z as the plain loop, bit for bit; replay stays exact):
    * chunking: z for a large CPU tensor is drawn in chunks of ``chunk`` normals into a reused
      buffer. torch's CPU ``randn`` consumes its generator 16 values at a time, so chunks that
      are multiples of 16 (and a last chunk of ≥ 16) reproduce the one-shot draw exactly, while
      z stays in cache and no parameter-sized temporary is allocated. Rademacher signs come
      8 to a random byte (``rademacher_signs``), so chunks starting at multiples of 8 do too;
    * threads: tensors are shared among ``workers`` threads, each with its own generator.
      Every tensor has its own seed, so the order of work does not change any value.

Measured here, one pass over SmolLM2-135M's tensors (2 cores, same run): plain loop 1.18 s,
``TorchNoise(workers=2)`` 0.44 s, ``NoiseTable()`` 0.08 s, a bare ``add_`` 0.06 s. Under
memory-bandwidth contention from other processes the table's advantage shrinks (0.2–0.8 s seen).

``NoiseTable`` (different z; opt-in; the ES trick of Salimans et al., 2017):
    One table of T standard normals is drawn once. z for a tensor is cut into windows of
    ``chunk`` entries; window j of the tensor with seed s is the table slice starting at
    ``derive_seed(s, j) mod (T − chunk − 14)`` (room for a last window of chunk + 15).
    A pass is then one read of the table slices and one read-write of θ.
    Price, stated honestly:
      - memory: 4·T bytes per (device, perturbation) table: 64 MiB for T = 2²⁴, held for the
        whole run. There is no per-tensor temporary (the plain loop allocates the largest
        tensor's z at every pass: 108 MiB for SmolLM2's embedding; ``TorchNoise``: one chunk);
      - statistics: conditional on the table, z is one of (T − chunk − 14)^(windows) vectors,
        and a model with d > T parameters reuses each table entry ≈ d/T times in one z. Given
        the table, E[z zᵀ] = I + R, where R's entries are the table's empirical
        autocorrelations (within a window) and its squared mean (across windows); the table is
        standardised to mean 0, variance 1, so |R_ij| ~ 1/√T ≈ 2.4e-4 for T = 2²⁴: a small bias
        in E[g z] that does not shrink with more steps. Salimans et al. used T = 2.5e8;
      - replay: ``SeedLog`` replays with the plain loop, so MeZO refuses to log a table run.

Example:
    >>> import torch
    >>> from sazo_lite import MeZO
    >>> theta = torch.zeros(100_000)
    >>> opt = MeZO([theta], lr=1e-3, noise=TorchNoise(workers=2, chunk=2**14))
    >>> _ = opt.step(lambda: (theta - 1).pow(2).mean())
"""
from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor
from typing import NamedTuple

import torch

from .engine import derive_seed, draw_direction, rademacher_signs

__all__ = ["Job", "TorchNoise", "NoiseTable", "split_jobs", "chunk_bounds", "z_dtype"]


class Job(NamedTuple):
    """One tensor's share of a pass: param ← shrink·param + coefficient·z(seed)."""

    param: torch.Tensor
    seed: int
    coefficient: float
    shrink: float
    perturbation: str


def z_dtype(like: torch.Tensor) -> torch.dtype:
    """The dtype z is drawn in: the parameter's for float32/64, float32 for half precision."""
    return like.dtype if like.dtype in (torch.float32, torch.float64) else torch.float32


def _check_int(name: str, value, low: int) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < low:
        raise ValueError(f"Invalid {name}: {value!r} (expected an int >= {low})")
    return value


def chunk_bounds(numel: int, chunk: int) -> list[tuple[int, int]]:
    """(start, stop) of consecutive chunks covering [0, numel); a tail < 16 joins the last chunk.

    Example:
        >>> chunk_bounds(70, 32)
        [(0, 32), (32, 70)]
    """
    bounds = [(start, min(start + chunk, numel)) for start in range(0, numel, chunk)]
    if len(bounds) > 1 and bounds[-1][1] - bounds[-1][0] < 16:  # randn's 16-wide blocks
        tail = bounds.pop()
        bounds[-1] = (bounds[-1][0], tail[1])
    return bounds


def split_jobs(jobs: list[Job], workers: int) -> list[list[Job]]:
    """Greedy balance by numel (largest first): one job list per worker, none empty."""
    loads, shares = [0] * workers, [[] for _ in range(workers)]
    for job in sorted(jobs, key=lambda j: -j.param.numel()):
        k = loads.index(min(loads))
        shares[k].append(job)
        loads[k] += job.param.numel()
    return [share for share in shares if share]


def _add(target: torch.Tensor, z: torch.Tensor, coefficient: float, shrink: float) -> None:
    if shrink != 1.0:  # same two ops, same order, as MeZO's plain loop
        target.mul_(shrink)
    target.add_(z, alpha=coefficient)


class _Threaded:
    """Runs ``_apply_one(job, slot)`` for all jobs, spread over ``workers`` threads."""

    replayable = False

    def __init__(self, workers: int):
        self.workers = _check_int("workers", workers, 1)
        self._pool = None

    def apply(self, jobs: list[Job]) -> None:
        """Apply every job (one pass of MeZO over all its tensors)."""
        shares = split_jobs(jobs, self.workers)
        if len(shares) <= 1:
            self._run(jobs, 0)
            return
        if self._pool is None:
            self._pool = ThreadPoolExecutor(self.workers, thread_name_prefix="sazo-noise")
        futures = [self._pool.submit(self._run, share, slot) for slot, share in enumerate(shares)]
        for future in futures:
            future.result()  # re-raises a worker's exception here

    @torch.no_grad()  # grad mode is per thread: worker threads do not inherit the caller's
    def _run(self, share: list[Job], slot: int) -> None:
        for job in share:
            self._apply_one(job, slot)

    def _apply_one(self, job: Job, slot: int) -> None:
        raise NotImplementedError

    def __getstate__(self):  # deepcopy/pickle: thread pools do not travel
        return {**self.__dict__, "_pool": None}


class TorchNoise(_Threaded):
    """The plain loop's z (``draw_direction``), drawn in chunks and on several threads.

    Results equal ``MeZO(noise=None)`` bit for bit (tested), so ``SeedLog`` replay stays exact.
    z for CPU tensors of ≥ 2·chunk entries is drawn in chunks; everything else (CUDA, small
    tensors) is drawn whole by ``draw_direction``.

    Args:
        workers: threads drawing different tensors at once (1 = no threads).
        chunk: normals per chunk, a multiple of 16 (randn's block); 2¹⁸ floats = 1 MiB.
    """

    replayable = True

    def __init__(self, workers: int = 2, chunk: int = 2 ** 18):
        super().__init__(workers)
        self.chunk = _check_int("chunk", chunk, 16)
        if chunk % 16:
            raise ValueError(f"Invalid chunk: {chunk} (expected a multiple of 16)")
        self._generators: dict[tuple[int, torch.device], torch.Generator] = {}
        self._buffers: dict[tuple[int, torch.dtype], torch.Tensor] = {}

    def _generator(self, slot: int, device: torch.device) -> torch.Generator:
        key = (slot, device)
        if key not in self._generators:
            self._generators[key] = torch.Generator(device=device)
        return self._generators[key]

    def _buffer(self, slot: int, dtype: torch.dtype) -> torch.Tensor:
        key = (slot, dtype)
        if key not in self._buffers:  # chunk + 15: room for a merged tail
            self._buffers[key] = torch.empty(self.chunk + 15, dtype=dtype)
        return self._buffers[key]

    def _apply_one(self, job: Job, slot: int) -> None:
        p = job.param
        generator = self._generator(slot, p.device)
        chunked = p.device.type == "cpu" and p.is_contiguous() and p.numel() >= 2 * self.chunk
        if not chunked:
            _add(p, draw_direction(p, job.seed, job.perturbation, generator), job.coefficient, job.shrink)
            return
        generator.manual_seed(job.seed)
        buffer, flat = self._buffer(slot, z_dtype(p)), p.view(-1)
        for start, stop in chunk_bounds(p.numel(), self.chunk):  # chunk starts: multiples of 16
            if job.perturbation == "gaussian":
                z = torch.randn(stop - start, generator=generator, out=buffer[:stop - start])
            else:
                z = rademacher_signs(stop - start, buffer.dtype, p.device, generator)
            _add(flat[start:stop], z, job.coefficient, job.shrink)

    def __getstate__(self):
        return {**super().__getstate__(), "_generators": {}, "_buffers": {}}


class NoiseTable(_Threaded):
    """z from windows of one shared table of standard normals (or ±1 signs); see the module doc.

    Window j of a tensor with seed s:  z[j·chunk : (j+1)·chunk] = table[o_j : o_j + chunk],
    o_j = derive_seed(s, j) mod (size − chunk − 14)  (a tail shorter than 16 joins the last window).

    Args:
        size: T, entries in the table (4·T bytes per device and perturbation).
        chunk: window length; smaller windows mean more independent offsets per z.
        seed: seed of the table itself.
        workers: threads applying different tensors at once.

    Example:
        >>> table = NoiseTable(size=2**12, chunk=2**8)
        >>> z = table.direction(torch.empty(1000), seed=7, perturbation="gaussian")
        >>> z.shape
        torch.Size([1000])
    """

    def __init__(self, size: int = 2 ** 24, chunk: int = 2 ** 16, seed: int = 0, workers: int = 1):
        super().__init__(workers)
        self.size, self.chunk = _check_int("size", size, 32), _check_int("chunk", chunk, 16)
        if chunk + 15 > size:
            raise ValueError(f"Invalid chunk: {chunk} (must be at most size − 15 = {size - 15})")
        if isinstance(seed, bool) or not isinstance(seed, int):
            raise ValueError(f"Invalid seed: {seed!r} (expected an int)")
        self.seed = seed
        self._tables: dict[tuple[torch.device, torch.dtype, str], torch.Tensor] = {}

    @property
    def nbytes(self) -> int:
        """Bytes held by the tables built so far."""
        return sum(t.numel() * t.element_size() for t in self._tables.values())

    def table(self, device, dtype: torch.dtype, perturbation: str) -> torch.Tensor:
        """The table [size] for this device/dtype: standardised normals, or exact ±1 signs."""
        key = (torch.device(device), dtype, perturbation)
        if key not in self._tables:
            generator = torch.Generator().manual_seed(self.seed)
            values = torch.randn(self.size, generator=generator, dtype=torch.float64)
            if perturbation == "gaussian":
                values = (values - values.mean()) / values.std()  # E[z]=0, E[z²]=1 on the table
            else:
                values = torch.where(values >= 0, 1.0, -1.0).double()
            self._tables[key] = values.to(device=key[0], dtype=dtype)
        return self._tables[key]

    def windows(self, numel: int, seed: int) -> list[tuple[int, int, int]]:
        """(start, stop, table offset) for every window of a tensor with ``numel`` entries."""
        span = self.size - self.chunk - 15 + 1  # room for the longest (merged-tail) window
        return [(start, stop, derive_seed(seed, j) % span)
                for j, (start, stop) in enumerate(chunk_bounds(numel, self.chunk))]

    def direction(self, like: torch.Tensor, seed: int, perturbation: str) -> torch.Tensor:
        """The whole z for one tensor, assembled plainly (reference and teaching; allocates)."""
        table = self.table(like.device, z_dtype(like), perturbation)
        parts = [table[offset:offset + stop - start] for start, stop, offset in self.windows(like.numel(), seed)]
        return torch.cat(parts).view(like.shape)

    def _apply_one(self, job: Job, slot: int) -> None:
        p = job.param
        if not p.is_contiguous():
            _add(p, self.direction(p, job.seed, job.perturbation), job.coefficient, job.shrink)
            return
        table, flat = self.table(p.device, z_dtype(p), job.perturbation), p.view(-1)
        for start, stop, offset in self.windows(p.numel(), job.seed):
            _add(flat[start:stop], table[offset:offset + stop - start], job.coefficient, job.shrink)

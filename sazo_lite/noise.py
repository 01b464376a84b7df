"""Faster MeZO passes: where z comes from, and how θ ← a·θ + c·z is applied to every tensor.

A MeZO pass over the parameters is dominated by generating z, not by the add (``make bench``
has the figures). Every pass goes through a source's ``apply(jobs)``: ``PlainNoise`` is the
plain loop (``MeZO(..., noise=None)``), the others are faster or different, ``MaskedNoise``
perturbs fixed entries only (``sazo_lite.sparse``).

``TorchNoise`` (same z as the plain loop, bit for bit; replay stays exact):
    * chunking: z for a large CPU tensor is drawn in chunks of ``chunk`` normals into a reused
      buffer. torch's CPU ``randn`` consumes its generator 16 values at a time, so chunks that
      are multiples of 16 (and a last chunk of ≥ 16) reproduce the one-shot draw exactly, while
      z stays in cache and no parameter-sized temporary is allocated. Rademacher signs come
      8 to a random byte (``rademacher_signs``), so chunks starting at multiples of 8 do too;
    * threads: tensors are shared among ``workers`` threads, each with its own generator.
      Every tensor has its own seed, so the order of work does not change any value.

``GaussianTable`` (different z, as unbiased as randn's; ``noise="auto"`` picks it for large CPU
models): circular windows of one white table, a random sign per window, so that E[z] = 0 and
E[z zᵀ] = I hold exactly given the table; replayable (``SeedLog`` records its ``directions``).

``NoiseTable`` (different z; opt-in, biased; the ES trick of Salimans et al., 2017):
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

The source protocol: ``apply(jobs, done=None)`` applies every ``Job`` (one tensor each) and,
when given a list ``done``, appends each job once it is fully applied, so that ``MeZO`` can
undo exactly those if the pass is cut short (``undo(jobs)``). A job may carry a second term
(``then``): a folded step applies the previous step's update and the next shift in one
read-write of θ, element by element in the same order as two separate passes.

Example:
    >>> import torch
    >>> from sazo_lite import MeZO
    >>> theta = torch.zeros(100_000)
    >>> opt = MeZO([theta], lr=1e-3, noise=TorchNoise(workers=2, chunk=2**14))
    >>> _ = opt.step(lambda: (theta - 1).pow(2).mean())
"""
from __future__ import annotations

import threading
from concurrent.futures import ThreadPoolExecutor, wait
from typing import NamedTuple

import torch

import math

from .directions import Z_BOUND, check_perturbation, derive_seed, draw_direction, rademacher_signs, z_dtype
from .validation import check_int, check_seed

__all__ = ["Job", "NoiseSource", "PlainNoise", "TorchNoise", "NoiseTable", "GaussianTable",
           "white_table", "source_for", "describe", "drawn", "check_source", "split_jobs", "chunk_bounds", "z_dtype"]


class Job(NamedTuple):
    """One tensor's share of a pass: param ← shrink·param + coefficient·z(seed) [+ c₂·z(seed₂)].

    ``then`` = (seed₂, c₂, perturbation₂) or None: a second term added after the first
    (a folded step: the pending update, then the next step's +εz).
    """

    param: torch.Tensor
    seed: int
    coefficient: float
    shrink: float
    perturbation: str
    then: tuple | None = None

    def terms(self) -> list[tuple[int, float, str]]:
        """(seed, coefficient, perturbation) of every z term, in the order they are added."""
        first = [(self.seed, self.coefficient, self.perturbation)]
        return first + [tuple(self.then)] if self.then is not None else first


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
    if shrink != 1.0:  # the same two ops, in the same order, in every source
        target.mul_(shrink)
    target.add_(z, alpha=coefficient)


class NoiseSource:
    """Applies jobs one tensor at a time; subclasses define ``_apply_one(job, slot)``.

    Attributes:
        replayable: True when the source draws the plain loop's z (``SeedLog`` replays it).
        directions: sources with equal ``directions`` draw the same z for a seed (a pending
            folded update may then be applied by either); by default, only the source itself.
    """

    replayable = False

    @property
    def directions(self):
        return id(self)

    def _scratch(self) -> dict:
        """The calling thread's own generators and z buffers, kept as long as the thread lives. Shared ones (by
        worker slot or device) were re-seeded and overwritten by a second optimiser stepping through the same
        source in another thread: both drew wrong z, and their restores missed, without a word."""
        local = self.__dict__.get("_local")
        if local is None:
            local = self.__dict__.setdefault("_local", threading.local())
        return local.__dict__

    def __getstate__(self):   # deepcopy/pickle: each thread's scratch is rebuilt on demand
        return {k: v for k, v in self.__dict__.items() if k != "_local"}

    def apply(self, jobs: list[Job], done: list | None = None) -> None:
        """Apply every job (one pass of MeZO over all its tensors); record finished ones in ``done``."""
        self._run(jobs, 0, done)

    def _run(self, share: list[Job], slot: int, done: list | None) -> None:
        if torch.is_grad_enabled():  # grad mode is per thread: workers do not inherit the caller's
            with torch.no_grad():
                return self._run(share, slot, done)
        for job in share:
            self._apply_one(job, slot)
            if done is not None:
                done.append(job)

    def _apply_one(self, job: Job, slot: int) -> None:
        raise NotImplementedError

    @torch.no_grad()
    def undo(self, jobs: list[Job]) -> None:
        """Invert fully applied jobs, last first: θ ← (θ − Σ c·z) / shrink (exact up to rounding).

        A job with shrink = 0 cannot be inverted and is left as it is.
        """
        for job in reversed(jobs):
            for seed, coefficient, perturbation in reversed(job.terms()):
                self._apply_one(Job(job.param, seed, -coefficient, 1.0, perturbation), 0)
            if job.shrink not in (0.0, 1.0):
                self._scale(job, 1.0 / job.shrink)

    def _scale(self, job: Job, factor: float) -> None:
        job.param.mul_(factor)

    def direction_bytes(self, param: torch.Tensor) -> int:
        """Bytes of the largest z this source holds at once for ``param`` (teaching, counting)."""
        return param.numel() * torch.empty(0, dtype=z_dtype(param)).element_size()


class PlainNoise(NoiseSource):
    """The plain loop: each tensor's whole z drawn by ``draw_direction``, then θ ← s·θ + c·z.

    ``MeZO(..., noise=None)`` passes through one of these. Peak extra memory: the largest
    tensor's z.
    """

    replayable = True
    directions = "torch"  # draw_direction's z: TorchNoise draws the same

    def _generator(self, device: torch.device) -> torch.Generator:
        generators = self._scratch().setdefault("generators", {})
        if device not in generators:
            generators[device] = torch.Generator(device=device)
        return generators[device]

    def _apply_one(self, job: Job, slot: int) -> None:
        p, shrink = job.param, job.shrink
        for seed, coefficient, perturbation in job.terms():
            _add(p, draw_direction(p, seed, perturbation, self._generator(p.device)), coefficient, shrink)
            shrink = 1.0


class _Threaded(NoiseSource):
    """Runs ``_apply_one(job, slot)`` for all jobs, spread over ``workers`` threads."""

    def __init__(self, workers: int):
        self.workers = check_int("workers", workers, 1)
        self._pool = None

    def apply(self, jobs: list[Job], done: list | None = None) -> None:
        shares = split_jobs(jobs, self.workers)
        if len(shares) <= 1:
            self._run(jobs, 0, done)
            return
        if self._pool is None:
            self._pool = ThreadPoolExecutor(self.workers, thread_name_prefix="sazo-noise")
        inference = torch.is_inference_mode_enabled()   # thread-local, like grad mode: the workers take the caller's
        futures = [self._pool.submit(self._run_as, inference, share, slot, done) for slot, share in enumerate(shares)]
        wait(futures)  # every worker has stopped touching θ before an error is raised here
        for future in futures:
            future.result()  # re-raises a worker's exception

    def _run_as(self, inference: bool, share: list[Job], slot: int, done: list | None) -> None:
        """``_run`` in a worker, in the caller's inference mode: inference tensors (a model loaded under
        ``torch.inference_mode()``) can be changed in place only inside it, and a worker outside it raised
        RuntimeError at the first pass of every step taken there."""
        with torch.inference_mode(inference):
            self._run(share, slot, done)

    def __getstate__(self):  # deepcopy/pickle: thread pools do not travel
        return {**super().__getstate__(), "_pool": None}


def _torch_chunk(chunk) -> int:
    """TorchNoise's chunk: an int >= 16, a multiple of 16 (randn's block), so chunks reproduce the one-shot draw."""
    chunk = check_int("chunk", chunk, 16)
    if chunk % 16:
        raise ValueError(f"Invalid chunk: {chunk} (expected a multiple of 16)")
    return chunk


class TorchNoise(_Threaded):
    """The plain loop's z (``draw_direction``), drawn in chunks and on several threads.

    Results equal ``MeZO(noise=None)`` bit for bit (tested), so ``SeedLog`` replay stays exact.
    z for CPU tensors of ≥ 2·chunk entries is drawn in chunks; everything else (CUDA, small
    tensors) is drawn whole by ``draw_direction``. A job with two terms draws both z chunk by
    chunk from two generators, so θ is read and written once.

    Args:
        workers: threads drawing different tensors at once (1 = no threads).
        chunk: normals per chunk, a multiple of 16 (randn's block); 2¹⁸ floats = 1 MiB.
    """

    replayable = True
    directions = "torch"

    def __init__(self, workers: int = 2, chunk: int = 2 ** 18):
        super().__init__(workers)
        self.chunk = _torch_chunk(chunk)

    def _generator(self, term: int, device: torch.device) -> torch.Generator:
        """The calling thread's generator for a job's ``term`` (each thread runs one job at a time)."""
        generators = self._scratch().setdefault("generators", {})
        if (term, device) not in generators:
            generators[term, device] = torch.Generator(device=device)
        return generators[term, device]

    def _buffer(self, term: int, dtype: torch.dtype, chunk: int | None = None) -> torch.Tensor:
        chunk = self.chunk if chunk is None else chunk
        buffers = self._scratch().setdefault("buffers", {})
        if (term, dtype) not in buffers or buffers[term, dtype].numel() != chunk + 15:   # the chunk was edited
            buffers[term, dtype] = torch.empty(chunk + 15, dtype=dtype)   # chunk + 15: room for a merged tail
        return buffers[term, dtype]

    def _apply_one(self, job: Job, slot: int) -> None:
        p, terms = job.param, job.terms()
        # checked where it is read: a chunk edited to 24 drew other z than the plain loop's (randn's 16-wide blocks)
        chunk = _torch_chunk(self.chunk)
        chunked = p.device.type == "cpu" and p.is_contiguous() and p.numel() >= 2 * chunk
        if not chunked:
            shrink = job.shrink
            for term, (seed, coefficient, perturbation) in enumerate(terms):
                z = draw_direction(p, seed, perturbation, self._generator(term, p.device))
                _add(p, z, coefficient, shrink)
                shrink = 1.0
            return
        streams = []
        for term, (seed, coefficient, perturbation) in enumerate(terms):
            check_perturbation(perturbation)   # below, anything but "gaussian" draws signs
            generator = self._generator(term, p.device)
            generator.manual_seed(seed)
            streams.append((generator, self._buffer(term, z_dtype(p), chunk), coefficient, perturbation))
        flat = p.view(-1)
        for start, stop in chunk_bounds(p.numel(), chunk):  # chunk starts: multiples of 16
            shrink = job.shrink
            for generator, buffer, coefficient, perturbation in streams:
                if perturbation == "gaussian":
                    z = torch.randn(stop - start, generator=generator, out=buffer[:stop - start])
                else:
                    z = rademacher_signs(stop - start, buffer.dtype, p.device, generator)
                _add(flat[start:stop], z, coefficient, shrink)
                shrink = 1.0

    def direction_bytes(self, param: torch.Tensor) -> int:
        if param.device.type == "cpu" and param.is_contiguous() and param.numel() >= 2 * self.chunk:
            return (self.chunk + 15) * torch.empty(0, dtype=z_dtype(param)).element_size()
        return super().direction_bytes(param)


class NoiseTable(_Threaded):
    """z from windows of one shared table of standard normals (or ±1 signs); see the module doc.

    Window j of a tensor with seed s:  z[j·chunk : (j+1)·chunk] = table[o_j : o_j + chunk],
    o_j = derive_seed(s, j) mod (size − chunk − 14)  (a tail shorter than 16 joins the last window).

    Args:
        size: T, entries in the table (4·T bytes per device and perturbation).
        chunk: window length; smaller windows mean more independent offsets per z.
        seed: seed of the table itself (size, chunk and seed are fixed at construction: a pass after an edit
            is refused, ``_check_fixed``).
        workers: threads applying different tensors at once.

    Example:
        >>> table = NoiseTable(size=2**12, chunk=2**8)
        >>> z = table.direction(torch.empty(1000), seed=7, perturbation="gaussian")
        >>> z.shape
        torch.Size([1000])
    """

    def __init__(self, size: int = 2 ** 24, chunk: int = 2 ** 16, seed: int = 0, workers: int = 1):
        super().__init__(workers)
        self.size, self.chunk = check_int("size", size, 32), check_int("chunk", chunk, 16)
        if chunk + 15 > size:
            raise ValueError(f"Invalid chunk: {chunk} (must be at most size − 15 = {size - 15})")
        self.seed = check_seed("seed", seed)
        self._settings = (self.size, self.chunk, self.seed)
        self._tables: dict[tuple[torch.device, torch.dtype, str], torch.Tensor] = {}

    @property
    def description(self) -> str:
        """What decides its z (``describe``): the table's size and seed and the window length."""
        size, chunk, seed = _fixed(self)   # the table's, not an edit's (a pass after an edit is refused)
        return f"noise-table:size={size},chunk={chunk},seed={seed}"

    @property
    def nbytes(self) -> int:
        """Bytes held by the tables built so far."""
        return sum(t.numel() * t.element_size() for t in self._tables.values())

    def table(self, device, dtype: torch.dtype, perturbation: str) -> torch.Tensor:
        """The table [size] for this device/dtype: standardised normals, or exact ±1 signs."""
        _check_fixed(self)
        key = (torch.device(device), dtype, check_perturbation(perturbation))   # a typo made a table of signs
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
        return torch.cat(parts or [table[:0]]).view(like.shape)   # a zero-size tensor has no window

    def _apply_one(self, job: Job, slot: int) -> None:
        p = job.param
        if not p.is_contiguous():
            shrink = job.shrink
            for seed, coefficient, perturbation in job.terms():
                _add(p, self.direction(p, seed, perturbation), coefficient, shrink)
                shrink = 1.0
            return
        flat = p.view(-1)
        terms = [(self.table(p.device, z_dtype(p), perturbation), self.windows(p.numel(), seed), coefficient)
                 for seed, coefficient, perturbation in job.terms()]
        for w, (start, stop, _) in enumerate(terms[0][1]):  # every term has the same windows
            shrink = job.shrink
            for table, windows, coefficient in terms:
                offset = windows[w][2]
                _add(flat[start:stop], table[offset:offset + stop - start], coefficient, shrink)
                shrink = 1.0

    def direction_bytes(self, param: torch.Tensor) -> int:
        return 0  # windows are views of the table

    def __getstate__(self):   # deepcopy/pickle: the tables are rebuilt from the seed (each was 4·size bytes copied)
        return {**super().__getstate__(), "_tables": {}}


def _fixed(source) -> tuple:
    """A table source's (size, chunk, seed) as built (a copy pickled before round 17: as it holds them now)."""
    return source.__dict__.setdefault("_settings", (source.size, source.chunk, source.seed))


def _check_fixed(source) -> None:
    """ValueError when a table source's size, chunk or seed was edited since construction (checked where a table is
    read, before a pass moves anything): its tables and a pending folded update were made with the old ones, and
    its ``directions`` or ``description`` (what a state or a seed log records) named the new ones while its z came
    from the table built before (they name the built ones now)."""
    settings, fixed = (source.size, source.chunk, source.seed), _fixed(source)
    if settings != fixed:
        raise ValueError(f"Invalid settings: {type(source).__name__}'s (size, chunk, seed) are {fixed} since it was "
                         f"built, not {settings}; build a new {type(source).__name__} for other ones")


MAX_TABLE_SIZE = 2 ** 30  # 4 GiB of float32: a larger table is a typo (or a hostile seed log)


def _table_size(size) -> int:
    """A white table's size: a power of two in [4, ``MAX_TABLE_SIZE``] (``white_table`` read a float size as a
    TypeError from ``&`` and tried to allocate any size it was given)."""
    size = check_int("size", size)
    if size < 4 or size & (size - 1) or size > MAX_TABLE_SIZE:
        raise ValueError(f"Invalid size: {size} (expected a power of two in [4, 2**30])")
    return size


def white_table(size: int, seed: int) -> torch.Tensor:
    """[size] float64 whose circular autocorrelation is exactly (1, 0, 0, …): a white sequence.

    x = irfft(X) with every bin |X_f| = √size and uniform random phases (DC and Nyquist: a
    random sign). Parseval gives (1/size)·Σ x_n x_(n+k mod size) = δ_k for every lag k, and
    the random phases make the values close to standard normal (a sum of size/2 cosines).

    Example:
        >>> x = white_table(2 ** 10, seed=0)
        >>> abs(float((x * x.roll(3)).mean())) < 1e-12, abs(float((x * x).mean()) - 1) < 1e-12
        (True, True)
    """
    size, seed = _table_size(size), check_seed("seed", seed)
    generator = torch.Generator().manual_seed(seed)
    half = size // 2
    phases = torch.rand(half + 1, generator=generator, dtype=torch.float64) * (2 * math.pi)
    real = phases[[0, half]]
    phases[[0, half]] = torch.where(real < math.pi, torch.zeros_like(real), torch.full_like(real, math.pi))  # ±1
    spectrum = torch.polar(torch.full((half + 1,), math.sqrt(size), dtype=torch.float64), phases)
    return torch.fft.irfft(spectrum, n=size)


class GaussianTable(_Threaded):
    """Gaussian z from circular windows of one white table, each window with a random sign.

    The table t (``white_table``, ``size`` entries, stored in z's dtype) is built once from
    ``seed``. Window j of a tensor with seed s covers z[j·chunk : (j+1)·chunk]; with
    h = derive_seed(s, j), its offset is o = h mod size and its sign σ = ±1 from h's top bit:

        z_i = σ_j · t[(o_j + i − j·chunk) mod size]

    Statistics, given the table (the expectation is over offsets and signs, i.e. over seeds):
      - E[z] = 0 and E[z zᵀ] = I exactly: within a window E[z_i z_k] is the table's circular
        autocorrelation at lag k − i, which is δ by construction (offsets are uniform on all
        ``size`` positions); entries of different windows, tensors or steps carry independent
        signs. So the MeZO estimate g·z is exactly unbiased for a quadratic, as with iid z;
      - marginally z_i is a table entry: standard normal up to the table's empirical
        distribution (kurtosis 3 − O(1/size)); max |t| < ``Z_BOUND`` is checked when it is built;
      - not independent: a model with d > size entries reuses each table entry ≈ d/size times
        in one z (with independent signs), which changes fourth moments slightly, not the mean;
      - replay: z is a function of (size, chunk, seed, the step seed) only, so ``directions``
        names them and ``SeedLog`` rebuilds the same source (``source_for``).

    A pass costs one read of the table windows (4·size bytes, cache-resident for 2²² floats)
    and one read-write of θ. Rademacher jobs are drawn by ``TorchNoise`` (signs are cheap).

    Args:
        size: table entries, a power of two (4·size bytes per device and dtype).
        chunk: window length (≤ size).
        seed: seed of the table (size, chunk and seed are fixed at construction: a pass after an edit is
            refused, ``_check_fixed``).
        workers: threads applying different tensors at once.

    Example:
        >>> source = GaussianTable(size=2 ** 12, chunk=2 ** 8)
        >>> z = source.direction(torch.empty(1000), seed=7)
        >>> z.shape, source.directions
        (torch.Size([1000]), 'gaussian-table:size=4096,chunk=256,seed=0')
    """

    replayable = True

    def __init__(self, size: int = 2 ** 22, chunk: int = 2 ** 18, seed: int = 0, workers: int = 1):
        super().__init__(workers)
        self.size, self.chunk = _table_size(size), check_int("chunk", chunk, 1)
        if chunk > size:
            raise ValueError(f"Invalid chunk: {chunk} (must be at most size = {size})")
        self.seed = check_seed("seed", seed, 0)
        self._settings = (self.size, self.chunk, self.seed)
        self._tables: dict[tuple[torch.device, torch.dtype], torch.Tensor] = {}
        self._signs = TorchNoise(workers=1)

    @property
    def directions(self) -> str:
        size, chunk, seed = _fixed(self)   # the table's, not an edit's (a pass after an edit is refused)
        return f"gaussian-table:size={size},chunk={chunk},seed={seed}"

    def table(self, device, dtype: torch.dtype) -> torch.Tensor:
        """[size + chunk]: the white table followed by its first ``chunk`` entries (windows wrap)."""
        _check_fixed(self)
        key = (torch.device(device), dtype)
        if key not in self._tables:
            values = white_table(self.size, self.seed).to(dtype)
            if float(values.abs().max()) >= Z_BOUND:  # MeZO's overflow guards assume |z| < Z_BOUND
                raise ValueError(f"Invalid seed: table {self.seed} holds |z| >= {Z_BOUND}; pick another")
            self._tables[key] = torch.cat([values, values[:self.chunk]]).to(key[0])
        return self._tables[key]

    def windows(self, numel: int, seed: int) -> list[tuple[int, int, int, float]]:
        """(start, stop, table offset, sign) for every window of a tensor with ``numel`` entries."""
        out = []
        for j, start in enumerate(range(0, numel, self.chunk)):
            h = derive_seed(seed, j)  # 63 bits: the low ones give the offset, the top one the sign
            out.append((start, min(start + self.chunk, numel), h % self.size, -1.0 if h >> 62 else 1.0))
        return out

    def direction(self, like: torch.Tensor, seed: int) -> torch.Tensor:
        """The whole z for one tensor by the formula (modular indexing into the bare table;
        reference and teaching, allocates)."""
        base = self.table(like.device, z_dtype(like))[:self.size]
        parts = [sign * base[(offset + torch.arange(stop - start, device=like.device)) % self.size]
                 for start, stop, offset, sign in self.windows(like.numel(), seed)]
        return torch.cat(parts or [base[:0]]).view(like.shape)   # a zero-size tensor has no window

    def _apply_one(self, job: Job, slot: int) -> None:
        p = job.param
        terms = job.terms()
        if len({perturbation for _, _, perturbation in terms}) > 1:
            # a folded job whose group's perturbation was changed between steps: each term from its own z (all
            # of it through the signs' source drew the Gaussian term from randn, not the table the step used)
            shrink = job.shrink
            for seed, coefficient, perturbation in terms:
                self._apply_one(Job(p, seed, coefficient, shrink, perturbation), slot)
                shrink = 1.0
            return
        if terms[0][2] != "gaussian":
            self._signs._apply_one(job, slot)
            return
        if not p.is_contiguous():
            shrink = job.shrink
            for seed, coefficient, _ in job.terms():
                _add(p, self.direction(p, seed), coefficient, shrink)
                shrink = 1.0
            return
        flat, table = p.view(-1), self.table(p.device, z_dtype(p))
        terms = [(self.windows(p.numel(), seed), coefficient) for seed, coefficient, _ in job.terms()]
        for w, (start, stop, _, _) in enumerate(terms[0][0]):  # every term has the same windows
            shrink = job.shrink
            for windows, coefficient in terms:
                _, _, offset, sign = windows[w]
                _add(flat[start:stop], table[offset:offset + stop - start], sign * coefficient, shrink)
                shrink = 1.0

    def direction_bytes(self, param: torch.Tensor) -> int:
        return 0  # windows are views of the table

    def __getstate__(self):
        return {**super().__getstate__(), "_tables": {}}


def source_for(directions: str):
    """A noise source drawing the z that ``directions`` names (as ``SeedLog`` records it):
    "torch" → None (the plain loop), "gaussian-table:size=…,chunk=…,seed=…" → ``GaussianTable``.

    Example:
        >>> source_for(GaussianTable(size=64, chunk=16).directions).directions
        'gaussian-table:size=64,chunk=16,seed=0'
    """
    if directions == "torch":
        return None
    kind, _, rest = str(directions).partition(":")
    try:
        fields = dict(item.split("=") for item in rest.split(","))
        if kind == "gaussian-table" and set(fields) == {"size", "chunk", "seed"}:
            return GaussianTable(**{k: int(v) for k, v in fields.items()})
    except ValueError:
        pass
    raise ValueError(f"Invalid directions: {directions!r} (expected 'torch' or "
                     f"'gaussian-table:size=…,chunk=…,seed=…')")


def describe(source) -> str:
    """What decides the z ``source`` draws, its kind and parameters but not its device, as a ``MeZO`` state
    records it: its ``description`` where it has one (``NoiseTable``, ``TritonNoise``: its fallback's where triton
    cannot run), else its ``directions``
    when they are a name ("torch" for the plain loop and ``TorchNoise``, "gaussian-table:size=…,chunk=…,seed=…"),
    else its class's qualified name.

    Example:
        >>> describe(PlainNoise()), describe(TorchNoise(workers=1)), describe(NoiseTable(size=64, chunk=16))
        ('torch', 'torch', 'noise-table:size=64,chunk=16,seed=0')
    """
    for attribute in ("description", "directions"):
        name = getattr(source, attribute, None)
        if isinstance(name, str):
            return str(name)   # a plain str: a state holding it loads with torch.load(weights_only=True)
    kind = type(source)
    return f"{kind.__module__}.{kind.__qualname__}"


def drawn(description: str, perturbations) -> str:
    """What decides the z a source described by ``description`` (``describe``) draws for a run whose param groups
    use ``perturbations``: the description itself, except that a ``GaussianTable`` draws Rademacher z with
    ``TorchNoise``'s signs, so a run with no Gaussian group draws the plain loop's z ("torch") under it.

    Example:
        >>> drawn(GaussianTable(size=64, chunk=16).directions, {"rademacher"}), drawn("torch", {"gaussian"})
        ('torch', 'torch')
    """
    table = isinstance(description, str) and description.startswith("gaussian-table:")
    return "torch" if table and "gaussian" not in set(perturbations) else description


def check_source(name: str, value, *, also: str = ""):
    """``value`` when it is a noise source (an instance with a callable ``apply(jobs)``), or
    ``ValueError("Invalid <name>: ...")``; ``also`` names what else the caller takes, for the message. A class
    passed for an instance had an unbound ``apply``: its first pass raised TypeError."""
    if isinstance(value, type) and callable(getattr(value, "apply", None)):
        raise ValueError(f"Invalid {name}: the class {value.__name__} (pass an instance: {name}={value.__name__}())")
    if not callable(getattr(value, "apply", None)):
        raise ValueError(f"Invalid {name}: {value!r} (expected {also}an object with apply(jobs))")
    return value

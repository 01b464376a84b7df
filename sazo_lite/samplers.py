"""Minibatch samplers: uniform, SAZO (plain and robust) and the minimum-variance oracle.

Every sampler draws B indices i.i.d. from a distribution p over {0..N-1} and returns the
importance weights w = 1/(N·p_i), so that E[w·f_i] = F for any p with full support.
Samplers know nothing of models or optimisers: they see indices and the step's directional
diffs.

The two SAZO samplers share three pieces: ``probabilities`` (the one score → probability
transform, ``variance.mixed_probabilities``; the weights are ``variance.importance_weights``), a score store (``CdfStore`` below ``SUM_TREE_MIN_EXAMPLES`` examples, ``TreeStore``
from there on; one interface, the same distribution) and a state record (``SAZOState``) that
``state_dict`` returns and ``load_state_dict`` checks in full before it changes anything.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, fields
from typing import Callable

import numpy as np
import torch

from .interrupts import InterruptsDeferred
from .sumtree import SumTree
from .validation import check_choice, check_count, check_fraction, check_int, check_number, check_seed, dense_tensor
from .variance import distribution, importance_weights, mixed_probabilities, relative_scores

__all__ = ["Sampler", "UniformSampler", "PlainSAZOSampler", "SAZOSampler", "StaleCorrectedSAZOSampler", "OracleSampler",
           "SAZOState", "probabilities", "CdfStore", "TreeStore", "SAMPLERS", "RACED", "ALIASES", "sampler_name", "make_sampler"]

# From this N on, SAZO samplers keep sum trees (O(B log N) per update) instead of an O(N)
# pass per step; docs/benchmarks.md (speed and memory) has the measured costs of both.
SUM_TREE_MIN_EXAMPLES = 2 ** 16
COUNT_MAX = np.iinfo(np.uint16).max  # counts saturate here (they only steer the early decay)
SCORE_MAX = 1e30                     # relative scores are clipped here: float32 storage and sums stay finite
_STORED_SCORE_MAX = float(np.float32(SCORE_MAX))  # the largest G the robust rule can store (1e30 rounded up)
# the most updates a loaded state may count: no run reaches it, and the stale correction's ages (level_steps + 1 −
# last_seen, int64) stay in range (a crafted 10²⁹ loaded, then every draw raised OverflowError)
_STEPS_MAX = 2 ** 62

# Each hyperparameter's rule, written once: the constructors check their arguments with it, and the SAZO samplers
# check their settings with it again before a draw or an update reads them (``_check_settings``).
_RULES = {
    "uniform_mix": lambda v: check_fraction("uniform_mix", v, 0.0, 1.0, closed_low=False, closed_high=True),
    "oracle_mix": lambda v: check_fraction("uniform_mix", v, 0.0, 1.0, closed_low=True, closed_high=True),
    "ema_decay": lambda v: check_fraction("ema_decay", v, 0.0, 1.0, closed_low=True, closed_high=False),
    "prior_strength": lambda v: check_number("prior_strength", v, 0.0),
    "level_decay": lambda v: check_fraction("level_decay", v, 0.0, 1.0, closed_low=True, closed_high=False),
    "statistic": lambda v: check_choice("statistic", v, STATISTICS),
    "growth_rate": lambda v: check_fraction("growth_rate", v, 0.0, 1.0, closed_low=False, closed_high=True),
    "min_factor": lambda v: check_fraction("min_factor", v, 0.0, 1.0, closed_low=False, closed_high=True),
    "max_factor": lambda v: check_number("max_factor", v, 1.0, closed_low=False),
}


class Sampler:
    """Base class: i.i.d. draws from ``probs`` with weights 1/(N·p_i).

    Subclasses override ``probs`` and, if they learn, ``_observe``. ``MAX_EXAMPLES`` is the
    largest N a sampler can draw from (``torch.multinomial``'s 2²⁴ categories here); a larger
    N is refused at construction.
    """

    MAX_EXAMPLES = 2 ** 24
    # whether a draw or an update reads the model's parameters (the oracle's norms_fn): ``train`` then flushes a
    # folded MeZO, whose θ holds θ − εz between steps, before each
    reads_parameters = False

    def __init__(self, num_examples: int, *, seed: int = 0):
        self.num_examples = check_int("num_examples", num_examples, 1, type(self).MAX_EXAMPLES)
        self.seed = check_seed("seed", seed)
        self._generator = torch.Generator().manual_seed(self.seed)

    @property
    def probs(self) -> torch.Tensor:
        """Sampling distribution, float64 tensor [N] that sums to 1."""
        return torch.full((self.num_examples,), 1.0 / self.num_examples, dtype=torch.float64)

    def sample(self, batch_size: int) -> tuple[torch.Tensor, torch.Tensor]:
        """Draw ``batch_size`` indices i.i.d. from ``probs``.

        Returns:
            (indices LongTensor [B], weights float64 Tensor [B] with w = 1/(N·p_i)).
        """
        check_count("batch_size", batch_size)
        probs = self._distribution()
        indices = torch.multinomial(probs, batch_size, replacement=True, generator=self._generator)
        return indices, importance_weights(probs[indices], self.num_examples)

    def _distribution(self) -> torch.Tensor:
        """``probs`` as the distribution the weights 1/(N·p_i) assume: float64 [N], finite entries ≥ 0 summing to 1
        (the variance helpers' rule), or ValueError. ``torch.multinomial`` normalises what it is given, so a
        subclass whose probs summed to 4 drew ∝ them with weights 4 times too small (E[w·f] = F/4, silently),
        and one with N + 1 entries drew an index past N."""
        return distribution("probs", self.probs, self.num_examples)

    def update(self, indices: torch.Tensor, directional_diffs: torch.Tensor) -> None:
        """Feed back the step's per-example directional diffs d_k for the sampled indices.

        The whole update is rejected (``ValueError``, state unchanged) if any index is out of
        range, a diff is not finite or the shapes disagree. Atomic: Ctrl-C during an update is
        delivered once the new state is fully written (or before any of it is).
        """
        indices, diffs = self._check_feedback(indices, directional_diffs)
        self._observe(indices, diffs)

    def _observe(self, indices: torch.Tensor, diffs: torch.Tensor) -> None:
        """Learn from a checked batch; the default sampler learns nothing."""

    def _check_feedback(self, indices, diffs):
        empty = isinstance(indices, (list, tuple)) and not indices   # torch reads [] as float32: no indices is fine
        indices, diffs = dense_tensor("indices", indices), dense_tensor("directional_diffs", diffs)
        indices = indices.long() if empty else indices
        if (indices.dim() != 1 or indices.dtype.is_floating_point or indices.dtype.is_complex
                or indices.dtype == torch.bool):
            raise ValueError(f"Invalid indices: expected a 1-D integer tensor, got {indices.dtype} "
                             f"of shape {tuple(indices.shape)}")
        if diffs.dtype.is_complex or diffs.dtype == torch.bool:   # a cast would drop the imaginary part / read 1.0
            raise ValueError(f"Invalid directional_diffs: dtype {diffs.dtype} (expected real numbers)")
        indices, diffs = indices.to("cpu", torch.long), diffs.detach().to("cpu", torch.float64)
        if indices.numel() and (int(indices.min()) < 0 or int(indices.max()) >= self.num_examples):
            raise ValueError(f"Invalid indices: values must lie in [0, {self.num_examples})")
        if diffs.shape != indices.shape:
            raise ValueError(f"Invalid directional_diffs: shape {tuple(diffs.shape)} does not match "
                             f"indices {tuple(indices.shape)} (does the closure return per-example losses?)")
        if not bool(torch.isfinite(diffs).all()):
            raise ValueError("Invalid directional_diffs: entries must be finite")
        return indices, diffs

    def state_dict(self) -> dict:
        return {"num_examples": self.num_examples, "seed": self.seed,
                "generator": self._generator.get_state()}

    def load_state_dict(self, state: dict) -> None:
        """Restore a ``state_dict``; everything is checked before anything changes."""
        checked = self._check_base(state)
        _check_fields(state, {"num_examples", "seed", "generator"})
        self._apply_base(checked)

    def _check_base(self, state) -> tuple[int, torch.Tensor]:
        if not isinstance(state, dict):
            raise ValueError(f"Invalid state: expected a dict, got {type(state).__name__}")
        missing = {"num_examples", "seed", "generator"} - set(state)
        if missing:
            raise ValueError(f"Invalid state: missing {sorted(missing)}")
        if check_int("num_examples", state["num_examples"]) != self.num_examples:
            raise ValueError(f"Invalid state: num_examples {state['num_examples']!r} != {self.num_examples}")
        seed = check_seed("seed", state["seed"])
        generator = state["generator"]
        reference = self._generator.get_state()
        if not isinstance(generator, torch.Tensor) or generator.dtype != torch.uint8 or generator.shape != reference.shape:
            raise ValueError("Invalid state: generator must be a torch.Generator state (uint8 tensor)")
        try:  # on a throwaway generator: torch checks the bytes form a valid Mersenne Twister state
            torch.Generator().set_state(generator)
        except (RuntimeError, TypeError):   # TypeError: a sparse or otherwise non-dense byte tensor
            raise ValueError("Invalid state: generator is not a valid torch.Generator state") from None
        return seed, generator.clone()

    def _apply_base(self, checked: tuple[int, torch.Tensor]) -> None:
        with InterruptsDeferred():
            self.seed = checked[0]
            self._generator.set_state(checked[1])


def _check_fields(state: dict, known: set) -> None:
    """A state with fields this sampler does not keep (another sampler's: a SAZO state loaded into a
    uniform sampler would drop its scores) is refused, naming them."""
    unknown = set(state) - known
    if unknown:
        raise ValueError(f"Invalid state: unknown fields {sorted(map(str, unknown))} (a state of another sampler?)")


def _state_array(name: str, value) -> np.ndarray:
    """A loaded state's field as a numpy array, read as the feedback is (``dense_tensor``), or ValueError naming
    the field (the four fields each had the same try/except)."""
    try:
        return dense_tensor(name, value).detach().to("cpu").numpy()
    except ValueError:
        raise ValueError(f"Invalid state: {name} must be a dense tensor") from None


class UniformSampler(Sampler):
    """Uniform sampling with replacement; all weights are 1 (plain MeZO minibatches).

    Example:
        >>> idx, w = UniformSampler(10, seed=0).sample(4)
        >>> bool((w == 1).all())
        True
    """

    MAX_EXAMPLES = 2 ** 63 - 1  # torch.randint's largest bound

    @property
    def probs(self) -> torch.Tensor:
        """Sampling distribution, float64 tensor [N] of 1/N: one stored entry read N times (an ``expand``ed,
        read-only view), since N may be up to 2⁶³ − 1 and N floats did not fit in memory. ``clone()`` it
        for a tensor of one's own."""
        return torch.full((1,), 1.0 / self.num_examples, dtype=torch.float64).expand(self.num_examples)

    def sample(self, batch_size: int) -> tuple[torch.Tensor, torch.Tensor]:
        check_count("batch_size", batch_size)
        indices = torch.randint(self.num_examples, (batch_size,), generator=self._generator)
        return indices, torch.ones(batch_size, dtype=torch.float64)


class OracleSampler(Sampler):
    """The minimum-variance oracle p*_i = ‖∇f_i‖ / Σ_j ‖∇f_j‖ (teaching and benchmarks only).

    Args:
        num_examples: N.
        norms_fn: returns the true per-example gradient norms [N] at the current θ; called
            at every ``sample``. They must be finite and ≥ 0 (else ``ValueError``); all-zero
            norms fall back to uniform.
        uniform_mix: optional λ ∈ [0, 1]: p = (1−λ)p* + λ/N (0 gives the exact oracle).

    ``norms_fn`` reads θ (``reads_parameters``): with a folded MeZO (``fold_updates=True``), whose θ holds θ − εz
    between steps, call ``optimizer.flush()`` before ``sample`` (``train`` does).
    """

    reads_parameters = True

    def __init__(self, num_examples: int, norms_fn: Callable[[], torch.Tensor], *,
                 uniform_mix: float = 0.0, seed: int = 0):
        super().__init__(num_examples, seed=seed)
        if not callable(norms_fn):
            raise ValueError("Invalid norms_fn: expected a callable returning norms [N]")
        self.norms_fn = norms_fn
        self.uniform_mix = _RULES["oracle_mix"](uniform_mix)

    @property
    def probs(self) -> torch.Tensor:
        norms = dense_tensor("norms_fn", self.norms_fn())
        if norms.dtype.is_complex or norms.dtype == torch.bool:
            raise ValueError(f"Invalid norms_fn: it returned {norms.dtype} norms (expected real numbers)")
        norms = norms.detach().to("cpu", torch.float64)
        if norms.shape != (self.num_examples,):
            raise ValueError(f"Invalid norms_fn: expected norms of shape ({self.num_examples},), got {tuple(norms.shape)}")
        if not bool(torch.isfinite(norms).all()) or bool((norms < 0).any()):
            raise ValueError("Invalid norms_fn: norms must be finite and non-negative")
        norms = relative_scores(norms.numpy())   # a sum of norms near float64's max would be inf
        # λ as the constructor checks it: a schedule may set it between steps, and 1.5 drew from a 'mixture' with
        # negative entries or another p than the weights assumed
        mix = _RULES["oracle_mix"](self.uniform_mix)
        return torch.from_numpy(probabilities(norms, float(norms.sum()), mix, self.num_examples))

    def state_dict(self) -> dict:
        """The base state and ``hyperparameters`` {"uniform_mix": λ}, as the SAZO samplers record theirs (the
        norms come from ``norms_fn``, which is not state). λ is checked as ``load_state_dict`` checks it (a λ set
        out of its interval was written into a state that no oracle loaded)."""
        mix = _RULES["oracle_mix"](self.uniform_mix)
        return {**super().state_dict(), "hyperparameters": {"uniform_mix": _python_number(mix)}}

    def load_state_dict(self, state: dict) -> None:
        """Restore a ``state_dict``, its λ included (checked as the constructor checks it, then taken, as the SAZO
        samplers take theirs): a state loaded into an oracle built with another λ drew from that λ's mixture, not
        the saved run's. A state without ``hyperparameters`` (written before round 14) keeps this sampler's λ."""
        checked = self._check_base(state)
        _check_fields(state, {"num_examples", "seed", "generator", "hyperparameters"})
        hyper = state.get("hyperparameters", {"uniform_mix": self.uniform_mix})
        if not isinstance(hyper, dict) or set(hyper) != {"uniform_mix"}:
            given = sorted(map(str, hyper)) if isinstance(hyper, dict) else type(hyper).__name__
            raise ValueError(f"Invalid state: hyperparameters {given} (expected ['uniform_mix'])")
        mix = _RULES["oracle_mix"](hyper["uniform_mix"])
        with InterruptsDeferred():
            self._apply_base(checked)
            self.uniform_mix = mix


# -- what the SAZO samplers share -----------------------------------------------------------
def probabilities(scores: np.ndarray, total: float, uniform_mix: float, num_examples: int) -> np.ndarray:
    """The score → probability transform on float64 numpy arrays: ``variance.mixed_probabilities``,
    p_i = (1−λ)·s_i/S + λ/N (uniform when S ≤ 0 or not finite).

    ``scores`` may be a subset of the N scores (e.g. the sampled ones); ``total`` is S = Σ_j s_j.

    Example:
        >>> probabilities(np.array([1.0, 3.0]), 4.0, 0.5, 2).tolist()
        [0.375, 0.625]
    """
    return mixed_probabilities(np.asarray(scores, dtype=np.float64), total, uniform_mix, num_examples)


class CdfStore:
    """Scores behind an O(N) pass per draw and per total: no per-example memory of its own.

    The store reads the owner's arrays through ``seen_scores(idx)`` (score of seen examples,
    0 where unseen) and ``unseen(idx)`` (bool); unseen examples all share the prior score s̄.
    ``TreeStore`` answers the same four calls in O(log N).
    """

    def __init__(self, num_examples: int, seen_scores: Callable, unseen: Callable):
        self.num_examples, self._seen_scores, self._unseen = num_examples, seen_scores, unseen
        self._cache = None  # (Σ seen scores, unseen count, CDF of seen scores) until the next refresh

    @property
    def nbytes(self) -> int:
        """Bytes of the CDF (float64 [N]), held from each draw to the next refresh."""
        return 8 * self.num_examples

    def refresh(self, changed: np.ndarray | None = None, unseen_changed: np.ndarray | None = None) -> None:
        """The owner changed the scores of ``changed`` (None: any), and the unseen flags of
        ``unseen_changed`` (None: maybe any of ``changed``)."""
        self._cache = None

    def _summary(self):
        if self._cache is None:
            everything = np.arange(self.num_examples)
            cdf = np.cumsum(self._seen_scores(everything))
            self._cache = (float(cdf[-1]), int(self._unseen(everything).sum()), cdf)
        return self._cache

    def masses(self) -> tuple[float, int]:
        """(Σ seen scores, number of unseen examples)."""
        seen_total, unseen_count, _ = self._summary()
        return seen_total, unseen_count

    def draw_seen(self, k: int, generator: torch.Generator) -> np.ndarray:
        """k indices ∝ seen scores (needs Σ > 0)."""
        _, _, cdf = self._summary()
        u = torch.rand(k, generator=generator, dtype=torch.float64).numpy() * cdf[-1]
        indices = np.searchsorted(cdf, u, side="right")
        return np.minimum(indices, self.num_examples - 1)  # guards u·total rounding up

    def draw_unseen(self, k: int, generator: torch.Generator) -> np.ndarray:
        """k indices uniformly among the unseen (needs one)."""
        unseen = np.flatnonzero(self._unseen(np.arange(self.num_examples)))
        return unseen[torch.randint(len(unseen), (k,), generator=generator).numpy()]


class TreeStore(CdfStore):
    """Scores in sum trees: O(B log N) per refresh and per draw.

    A float32 tree of internal sums over the seen scores (the leaves are the owner's array:
    4 bytes per example), and a tree over blocks of ``UNSEEN_BLOCK`` examples counting the unseen
    ones (leaves counted on demand: ~0.1 byte per example). An unseen draw picks a block ∝ its
    count, then the r-th unseen example in it.
    """

    UNSEEN_BLOCK = 64

    def __init__(self, num_examples: int, seen_scores: Callable, unseen: Callable):
        super().__init__(num_examples, seen_scores, unseen)
        self._scores = SumTree.over(num_examples, seen_scores, dtype=np.float32)
        blocks = -(-num_examples // self.UNSEEN_BLOCK)
        self._unseen_blocks = SumTree.over(blocks, self._block_counts)

    @property
    def nbytes(self) -> int:
        return self._scores.nbytes + self._unseen_blocks.nbytes

    def _block_counts(self, blocks: np.ndarray) -> np.ndarray:
        """Unseen examples in each of ``blocks``, float64: the unseen tree's leaves. A method, not a lambda: a
        deepcopy kept a lambda bound to the original store, so a copied sampler counted the original's unseen
        examples (and a lambda does not pickle)."""
        return self._block_flags(blocks).sum(axis=1).astype(np.float64)

    def _block_flags(self, blocks: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """Unseen flags of the examples in ``blocks`` [k, UNSEEN_BLOCK] (False past N)."""
        members = blocks[:, None] * self.UNSEEN_BLOCK + np.arange(self.UNSEEN_BLOCK)
        inside = members < self.num_examples
        flags = self._unseen(np.minimum(members, self.num_examples - 1).ravel()).reshape(members.shape)
        return flags & inside

    def refresh(self, changed: np.ndarray | None = None, unseen_changed: np.ndarray | None = None) -> None:
        if changed is None:
            self._scores.rebuild()
            self._unseen_blocks.rebuild()
            return
        if len(changed):
            self._scores.refresh(changed)
        unseen_changed = changed if unseen_changed is None else unseen_changed
        if len(unseen_changed):
            self._unseen_blocks.refresh(np.unique(unseen_changed // self.UNSEEN_BLOCK))

    def masses(self) -> tuple[float, int]:
        return max(self._scores.total, 0.0), int(round(self._unseen_blocks.total))

    def draw_seen(self, k: int, generator: torch.Generator) -> np.ndarray:
        return self._scores.sample(k, generator).numpy()

    def draw_unseen(self, k: int, generator: torch.Generator) -> np.ndarray:
        blocks = self._unseen_blocks.sample(k, generator).numpy()
        flags = self._block_flags(blocks)
        rank = (torch.rand(k, generator=generator, dtype=torch.float64).numpy() * flags.sum(axis=1)).astype(np.int64)
        position = np.argmax(np.cumsum(flags, axis=1) > rank[:, None], axis=1)  # the rank-th unseen one
        return blocks * self.UNSEEN_BLOCK + position


@dataclass
class SAZOState:
    """Everything a SAZO sampler needs to resume bit-exactly: what ``state_dict`` holds.

    Attributes:
        num_examples: N (a loaded state must have the sampler's N).
        seed: the seed the generator was made from.
        generator: the sampling generator's state (uint8 tensor).
        estimates: per-example EMA, float32 [N] (0 where unseen for the robust rule; at most
            float32(1e30) for the robust rule, which clips its relative observations there).
        counts: observations per example, int64 [N] (stored as uint16, saturating at 65535).
        hyperparameters: the constructor's arguments (checked like the constructor checks them).
        extra: the rule's other scalars (the robust rule: its level, running sums and counters).
    """

    num_examples: int
    seed: int
    generator: torch.Tensor
    estimates: torch.Tensor
    counts: torch.Tensor
    hyperparameters: dict
    extra: dict

    def as_dict(self) -> dict:
        """A dict of copies (what ``state_dict`` returns; ``torch.save`` stores it), numbers as Python numbers."""
        copy = lambda v: v.clone() if isinstance(v, torch.Tensor) else (dict(v) if isinstance(v, dict) else v)
        out = {f.name: copy(getattr(self, f.name)) for f in fields(self)}
        out["hyperparameters"] = {k: _python_number(v) for k, v in self.hyperparameters.items()}
        out["extra"] = {k: _python_number(copy(v)) for k, v in self.extra.items()}
        return out


def _python_number(value):
    """A numpy number as the Python number it holds, a str subclass (numpy's ``str_``) as a plain str (anything else
    unchanged): a λ set between steps by a schedule computed with numpy (``sampler.uniform_mix = 0.1 *
    np.exp(-t / T)``), or a statistic read from an array, made a state that ``torch.load`` refused with
    ``weights_only=True``, its default."""
    if isinstance(value, np.bool_):
        return bool(value)
    if isinstance(value, str):
        return str.__str__(value)
    return value.item() if isinstance(value, np.number) else value


def _float_array(name: str, value, n: int, *, low: float = 0.0, high: float = math.inf) -> np.ndarray:
    """A finite float32 [n] copy with entries in [low, high], or ValueError."""
    array = _state_array(name, value)
    if array.shape != (n,) or array.dtype.kind not in "fiu":
        raise ValueError(f"Invalid state: {name} must be a real tensor of shape ({n},)")
    with np.errstate(over="ignore"):  # a float64 beyond float32's range becomes inf: refused below
        array = array.astype(np.float32)
    if not np.isfinite(array).all() or (array < low).any() or (array > high).any():
        raise ValueError(f"Invalid state: {name} must be finite and in [{low}, {high:g}]")
    return array


def _count_array(value, n: int) -> np.ndarray:
    array = _state_array("counts", value)
    if array.shape != (n,) or array.dtype.kind not in "iu" or (array < 0).any() or (array > COUNT_MAX).any():
        raise ValueError(f"Invalid state: counts must be integers in [0, {COUNT_MAX}] of shape ({n},)")
    return array.astype(np.uint16)


class _ScoredSampler(Sampler):
    """Shared machinery of the SAZO samplers: scores in a store, draws from the mixture.

    A subclass keeps ``_g`` (float32 [N]) and ``_n`` (uint16 [N]), and defines
    ``_seen_scores(idx)`` (sampling score of seen examples, 0 if unseen), ``_unseen(idx)`` and
    ``_prior_score()``. Then p_i = probabilities(ŝ_i, S), ŝ_i = score or prior, S = Σ ŝ.
    ``ESTIMATE_MAX`` is the largest estimate the rule can store (``load_state_dict`` refuses more); ``SETTINGS``
    names the hyperparameters that ``sample``, ``probs`` and ``update`` check again before reading them.
    """

    MAX_EXAMPLES = 2 ** 28    # N·1e30 (the largest scores) stays finite in the float32 sum tree
    ESTIMATE_MAX = math.inf

    def _init_store(self, sum_tree) -> None:
        if sum_tree is None:
            sum_tree = self.num_examples >= SUM_TREE_MIN_EXAMPLES
        elif not isinstance(sum_tree, bool):
            raise ValueError(f"Invalid sum_tree: {sum_tree!r} (expected True, False or None)")
        self.sum_tree = sum_tree
        store = TreeStore if sum_tree else CdfStore
        self._store = store(self.num_examples, self._sampling_scores, self._unseen)
        self._scored_with = self._scored_by()

    def _unseen(self, indices: np.ndarray) -> np.ndarray:
        return self._n[indices] == 0

    def _sampling_scores(self, indices: np.ndarray) -> np.ndarray:
        """What p is proportional to for seen examples: their scores (a rule may correct them)."""
        return self._seen_scores(indices)

    def _prior_score(self) -> float:
        return 0.0

    @property
    def estimates(self) -> torch.Tensor:
        """The per-example EMA (float32 [N]), a copy."""
        return torch.from_numpy(self._g.copy())

    @property
    def counts(self) -> torch.Tensor:
        """n [N] int64: how often each example was observed (saturates at 65535), a copy."""
        return torch.from_numpy(self._n.astype(np.int64))

    @property
    def state_bytes(self) -> int:
        """Bytes of per-example state: the arrays and the store (independent of N otherwise)."""
        return self._g.nbytes + self._n.nbytes + self._store.nbytes + self._extra_bytes()

    def _extra_bytes(self) -> int:
        return 0

    # -- the distribution -------------------------------------------------------------------
    def _total(self) -> tuple[float, float, int, float]:
        seen_total, unseen_count = self._store.masses()
        prior = self._prior_score()
        return seen_total + prior * unseen_count, seen_total, unseen_count, prior

    def _scores_at(self, indices: np.ndarray, prior: float) -> np.ndarray:
        return np.where(self._unseen(indices), prior, self._sampling_scores(indices))

    def _probs_at(self, indices: np.ndarray) -> np.ndarray:
        total, _, _, prior = self._total()
        return probabilities(self._scores_at(indices, prior), total, self._mix(), self.num_examples)

    def _mix(self) -> float:
        """λ as a Python float (a numpy float32 λ split the draws in float32, not as a reloaded state does). It is
        checked by ``_check_settings``, which ``sample``, ``probs`` and ``update`` run before anything reads it: a
        schedule may set it between steps, and λ = 1.5, −0.2 or NaN drew from one mixture and weighted by another."""
        return float(self.uniform_mix)

    # the settings a draw or an update reads (``_check_settings``); each subclass names its own
    SETTINGS: tuple = ("uniform_mix",)
    # those of them the sampling scores are computed from, which the store's sums hold (``_scored_by``)
    SCORED_BY: tuple = ()

    def _check_settings(self) -> None:
        """Each of ``SETTINGS`` as the constructor checks it, before a draw or an update reads it: they may be set
        between steps, and ema_decay = −0.5 made estimates and probabilities negative, a statistic "sqaure" was
        read as "abs", a level_decay of 2 turned the level negative, without a word. Then, if one of
        ``SCORED_BY`` changed since the store last summed the scores, the store is rebuilt (``_rescore``).

        Each is kept as the Python number (or plain str) the check returns, as the constructor and a loaded state
        keep it: the rules' numpy arithmetic depends on a scalar's type (the plain rule's β·G ran in float64 for a
        numpy β set by a schedule, in float32 for a Python float), so a run whose state recorded β as a Python
        float resumed on other estimates."""
        for name in self.SETTINGS:
            setattr(self, name, _RULES[name](getattr(self, name)))
        scored = self._scored_by()
        if scored != self.__dict__.setdefault("_scored_with", scored):   # one pickled before round 16 records none
            self._rescore()

    def _scored_by(self) -> tuple:
        """The values of ``SCORED_BY`` now."""
        return tuple(getattr(self, name) for name in self.SCORED_BY)

    def _rescore(self) -> None:
        """Sum the scores again under the settings now in force: the store held sums of the scores under the old
        ones, so draws followed the old scores while the weights 1/(N·p) and ``probs`` read the new ones (a
        ``statistic`` switched in tree mode, a stale correction's ``max_factor`` set after a draw: biased weights,
        and ``probs`` summing to 0.92 or 1.3)."""
        with InterruptsDeferred():
            self._store.refresh(None)
            self._scored_with = self._scored_by()

    def update(self, indices: torch.Tensor, directional_diffs: torch.Tensor) -> None:
        """``Sampler.update``, after ``_check_settings`` (ValueError, state unchanged)."""
        self._check_settings()
        super().update(indices, directional_diffs)

    @property
    def probs(self) -> torch.Tensor:
        """p_i = (1−λ)·ŝ_i/Σ_j ŝ_j + λ/N (ŝ: sampling scores), float64 [N], a copy."""
        self._check_settings()
        return torch.from_numpy(self._probs_at(np.arange(self.num_examples)))

    def scores(self) -> torch.Tensor:
        """ŝ [N] float64: the sampling score of each example (the prior where unseen)."""
        self._check_settings()
        return torch.from_numpy(self._scores_at(np.arange(self.num_examples), self._prior_score()))

    def sample(self, batch_size: int) -> tuple[torch.Tensor, torch.Tensor]:
        """Draw B indices i.i.d. from ``probs``; weights 1/(N·p_i).

        A draw comes from the mixture whose marginal is p: uniform (λ), else ∝ ŝ, split
        between the seen (∝ score) and the unseen (uniformly) by their masses.
        """
        check_count("batch_size", batch_size)
        self._check_settings()
        total, seen_total, unseen_count, prior = self._total()
        mix = self._mix()   # a float32 λ set between steps: its split in float64, as the state reloads it
        u = torch.rand(batch_size, generator=self._generator, dtype=torch.float64).numpy()
        part = np.zeros(batch_size, dtype=np.int64)  # 0 uniform, 1 seen, 2 unseen
        if total > 0 and math.isfinite(total):
            part = np.where(u < mix, 0, np.where(u < mix + (1.0 - mix) * seen_total / total, 1, 2))
            part[(part == 2) & (unseen_count <= 0)] = 1   # rounding at the edge: no unseen left
            part[(part == 1) & (seen_total <= 0)] = 2     # ... or no seen score mass
        indices = np.empty(batch_size, dtype=np.int64)
        draws = (lambda k: torch.randint(self.num_examples, (k,), generator=self._generator).numpy(),
                 lambda k: self._store.draw_seen(k, self._generator),
                 lambda k: self._store.draw_unseen(k, self._generator))
        for which, draw in enumerate(draws):
            chosen = part == which
            if chosen.any():
                indices[chosen] = draw(int(chosen.sum()))
        probs = probabilities(self._scores_at(indices, prior), total, mix, self.num_examples)
        return torch.from_numpy(indices), torch.from_numpy(importance_weights(probs, self.num_examples))

    # -- checkpoints -------------------------------------------------------------------------
    def _hyperparameters(self) -> dict:
        raise NotImplementedError

    def _extra_state(self) -> dict:
        return {}

    def state(self) -> SAZOState:
        """The state record (views of the live arrays; ``state_dict`` copies it), after ``_check_settings``: a
        setting set since the last draw or update is checked (ValueError: a state that would not load) and, if the
        scores depend on it, summed in (a statistic switched just before saving recorded the running Σ s² of the
        old one, and the state did not load)."""
        self._check_settings()
        return SAZOState(self.num_examples, self.seed, self._generator.get_state(),
                         torch.from_numpy(self._g), torch.from_numpy(self._n.astype(np.int64)),
                         self._hyperparameters(), self._extra_state())

    def state_dict(self) -> dict:
        return self.state().as_dict()

    def load_state_dict(self, state: dict) -> None:
        """Restore a ``state_dict``: every field is checked before anything changes.

        Hyperparameters are checked as the constructor checks them; N cannot change;
        estimates must be finite and ≥ 0, counts integers in [0, 65535].
        """
        base = self._check_base(state)
        missing = {f.name for f in fields(SAZOState)} - set(state)
        if missing:
            raise ValueError(f"Invalid state: missing {sorted(missing)}")
        _check_fields(state, {f.name for f in fields(SAZOState)})
        if not isinstance(state["hyperparameters"], dict) or not isinstance(state["extra"], dict):
            raise ValueError("Invalid state: hyperparameters and extra must be dicts")
        hyper = self._check_hyperparameters(state["hyperparameters"])
        g = _float_array("estimates", state["estimates"], self.num_examples, high=self.ESTIMATE_MAX)
        n = _count_array(state["counts"], self.num_examples)
        extra = self._check_extra(state["extra"], g, n, hyper)
        with InterruptsDeferred():  # nothing below can fail; Ctrl-C waits until it is all written
            self._apply_base(base)
            self.__dict__.update(hyper)
            self._g[:], self._n[:] = g, n
            self._apply_extra(extra)
            self._store.refresh(None)  # every node from its children, as the updates did: bit-exact
            self._scored_with = self._scored_by()

    def _check_hyperparameters(self, hyper: dict) -> dict:
        expected = set(self._hyperparameters())
        if set(hyper) != expected:
            raise ValueError(f"Invalid state: hyperparameters {sorted(hyper)} (expected {sorted(expected)})")
        checked = type(self)(1, **hyper)  # the constructor's checks, on a throwaway instance
        return {name: getattr(checked, name) for name in expected}

    def _check_extra(self, extra: dict, g: np.ndarray, n: np.ndarray, hyper: dict) -> dict:
        if extra:
            raise ValueError(f"Invalid state: extra {sorted(extra)} (this rule keeps no other fields)")
        return {}

    def _apply_extra(self, extra: dict) -> None:
        pass


# -- SAZO: plain rule -----------------------------------------------------------------------
def _mean_by_index(indices: np.ndarray, *values: np.ndarray):
    """Distinct indices and the mean of each of ``values`` over each index's duplicates."""
    if len(indices) == 1:
        return (indices, *values)
    unique, inverse = np.unique(indices, return_inverse=True)
    counts = np.bincount(inverse)
    return (unique, *(np.bincount(inverse, weights=v) / counts for v in values))


class PlainSAZOSampler(_ScoredSampler):
    """The plain SAZO rule (notebooks/algorithm.md), for teaching: what to implement first and see fail.

        state:   G_i = ``initial_estimate`` for every example (a constant start)
        sample:  p_i = (1−λ)·sqrt(G_i)/Σ_j sqrt(G_j) + λ/N,   weights w = 1/(N·p_i)
        update:  G_i ← β·G_i + (1−β)·d_i²    (d_i²: the mean of d² over duplicates in the batch)

    No prior for unseen examples, no level, no count-adaptive decay: a single d² is
    χ²₁-noisy and the constant start favours (or starves) every example not seen yet, which
    is what the robust ``SAZOSampler`` fixes. G is stored in float32; an update whose d²
    would overflow float32 is rejected with ``ValueError`` (state unchanged).

    Args:
        num_examples: N.
        ema_decay: β ∈ [0, 1).
        uniform_mix: λ ∈ (0, 1]; 1 is uniform sampling.
        initial_estimate: G_0 > 0, the constant start (in units of d²).
        sum_tree: keep sqrt(G) in a sum tree (O(B log N) per update) instead of an O(N) pass;
            None chooses by N (``SUM_TREE_MIN_EXAMPLES``). Same distribution either way.
        seed: seed of the sampling generator.

    Example:
        >>> s = PlainSAZOSampler(4, seed=0)
        >>> s.update(torch.tensor([0]), torch.tensor([3.0]))   # G_0 ← 0.9·1 + 0.1·9 = 1.8
        >>> round(float(s.estimates[0]), 6), bool(s.probs[0] > s.probs[1])
        (1.8, True)
    """

    SETTINGS = ("uniform_mix", "ema_decay")

    def __init__(self, num_examples: int, *, ema_decay: float = 0.9, uniform_mix: float = 0.1,
                 initial_estimate: float = 1.0, sum_tree: bool | None = None, seed: int = 0):
        super().__init__(num_examples, seed=seed)
        self.ema_decay, self.uniform_mix = _RULES["ema_decay"](ema_decay), _RULES["uniform_mix"](uniform_mix)
        self.initial_estimate = check_number("initial_estimate", initial_estimate, 0.0, SCORE_MAX, closed_low=False)
        self._g = np.full(num_examples, self.initial_estimate, dtype=np.float32)  # G_i, units of d²
        self._n = np.zeros(num_examples, dtype=np.uint16)                          # diagnostics only
        self._init_store(sum_tree)

    def _seen_scores(self, indices: np.ndarray) -> np.ndarray:
        return np.sqrt(self._g[indices].astype(np.float64))

    def decay(self, counts) -> np.ndarray:
        """The EMA decay the next update applies: β for every example, whatever its count (checked as the update
        checks it)."""
        self._check_settings()
        return np.full(np.shape(counts), self.ema_decay, dtype=np.float64)

    def _unseen(self, indices: np.ndarray) -> np.ndarray:
        return np.zeros(len(indices), dtype=bool)  # the plain rule has no notion of unseen

    def _observe(self, indices, diffs) -> None:
        if not indices.numel():
            return
        with np.errstate(over="ignore"):  # an overflow is caught below, before any change
            unique, squared = _mean_by_index(indices.numpy(), diffs.numpy() ** 2)
            new = (self.ema_decay * self._g[unique] + (1.0 - self.ema_decay) * squared).astype(np.float32)
        if not np.isfinite(new).all():
            raise ValueError("Invalid directional_diffs: d² overflows the float32 estimates (|d| > ~1e19)")
        counts = np.minimum(self._n[unique].astype(np.int64) + 1, COUNT_MAX)
        with InterruptsDeferred():  # all of it is written, or none
            self._g[unique] = new
            self._n[unique] = counts
            self._store.refresh(unique, unseen_changed=unique[:0])  # the plain rule has no unseen

    def _hyperparameters(self) -> dict:
        return dict(ema_decay=self.ema_decay, uniform_mix=self.uniform_mix,
                    initial_estimate=self.initial_estimate, sum_tree=self.sum_tree)

    def _check_hyperparameters(self, hyper: dict) -> dict:
        checked = super()._check_hyperparameters(hyper)
        if checked["sum_tree"] != self.sum_tree:
            raise ValueError("Invalid state: sum_tree differs (the store is chosen at construction)")
        return checked


# -- SAZO: robust rule -----------------------------------------------------------------------
STATISTICS = ("abs", "square")


class SAZOSampler(_ScoredSampler):
    """Sample-adaptive ZO: importance sampling from per-example estimates of ‖∇f_i‖.

    Each MeZO step gives, for free, d_k = (f_k(θ+εz) − f_k(θ−εz))/(2ε) ≈ zᵀ∇f_k with
    E[d_k²] = ‖∇f_k‖² and E|d_k| = sqrt(2/π)·‖∇f_k‖ (Gaussian z). SAZO keeps one score per
    example (∝ its norm) and samples p_i ∝ score, mixed with uniform. The rule as it runs:

        level:   L ← (1−a)·L + a·mean_k(w_k·|d_k|),       a = max(1/t, 1 − level_decay)
        observe: o_i = |d_i| / L                          (mean over duplicates in the batch)
        prior:   s̄ = sqrt(mean of s_j² over the examples seen so far)   (running sums)
        update:  β_i = min(β, (n_i + c)/(n_i + c + 1)),   G_i ← β_i·(G_i if n_i > 0 else s̄) + (1−β_i)·o_i
        sample:  p_i = (1−λ)·ŝ_i/Σ_j ŝ_j + λ/N,          ŝ_i = s_i = G_i if n_i > 0 else s̄

    (``statistic="square"``: o_i = (|d_i|/L)², s_i = sqrt(G_i), and an unseen example's G
    starts from s̄².) Relative observations are clipped at 1e30 and G is stored in float32.

    Why each piece (the plain rule, ``PlainSAZOSampler``, lacks them all: single d² are χ²₁-noisy
    and an example is seen about once every N/B steps; docs/benchmarks.md's ablation measures the
    queries each piece saves):
    - Unseen examples take the prior s̄, neither starved nor favoured by a stale start;
      before any data SAZO is uniform sampling. s̄ is the root-mean-square score: an unseen
      example's expected ‖∇f‖² is the data set's mean ‖∇f_j‖², and p ∝ sqrt(E‖∇f_i‖²)
      minimises the expected V(p).
    - A first observation is blended with ``prior_strength`` c pseudo-observations of s̄,
      and β_i grows with the count n_i (a running mean first, the EMA β later, like Adam's
      bias correction): one noisy observation cannot starve an example.
    - The level L, an importance-weighted (w = 1/(N·p_i)) running mean of |d| over the
      whole data set, follows all norms as they shrink during training. Scores are stored
      relative to L at the time they were observed, so an example seen long ago (when every
      norm was larger) is not over-sampled just because its estimate is old.
    - |d| (``statistic="abs"``) instead of d²: both estimate the norm, but |d| has relative
      variance π/2 − 1 ≈ 0.57 against 2 for d², so one lucky draw moves the EMA less.
    - λ = 0.1 keeps every example reachable and bounds the importance weights w ≤ 1/λ = 10.

    Huge but finite diffs: the level works in units of |d| for both statistics, so |d| up to
    ~1e300 keeps it finite; an update that would still overflow it raises ``ValueError``
    with the state unchanged. Measured queries against uniform and the oracle: docs/benchmarks.md.

    Args:
        num_examples: N.
        ema_decay: β ∈ [0, 1): the EMA decay once an example has been seen often.
        uniform_mix: λ ∈ (0, 1]; 1 is uniform sampling.
        prior_strength: c ≥ 0 pseudo-observations of the prior s̄ blended into a first observation.
        statistic: "abs" (G tracks |d|/L, s = G) or "square" (G tracks (d/L)², s = sqrt(G)).
        level_decay: decay ∈ [0, 1) of the data-set-wide level L (0.99: averages ~100 steps).
        sum_tree: keep the scores in sum trees, O(B log N) per update, instead of an O(N) pass.
            None (default) chooses by N (trees from ``SUM_TREE_MIN_EXAMPLES`` = 2¹⁶ on). Same
            distribution either way (to float32 rounding of the tree's sums).
        seed: seed of the sampling generator.

    Example:
        >>> s = SAZOSampler(100, seed=0)
        >>> idx, w = s.sample(8)
        >>> s.update(idx, torch.randn(8))
        >>> round(float(s.probs.sum()), 12), bool((s.probs >= 0.1 / 100).all())
        (1.0, True)
    """

    ESTIMATE_MAX = _STORED_SCORE_MAX  # G is a running mean of observations clipped at SCORE_MAX
    SETTINGS = ("uniform_mix", "ema_decay", "prior_strength", "level_decay", "statistic")
    SCORED_BY = ("statistic",)   # s = G or sqrt(G)

    def __init__(self, num_examples: int, *, ema_decay: float = 0.9, uniform_mix: float = 0.1,
                 prior_strength: float = 1.0, statistic: str = "abs", level_decay: float = 0.99,
                 sum_tree: bool | None = None, seed: int = 0):
        super().__init__(num_examples, seed=seed)
        self.ema_decay, self.uniform_mix = _RULES["ema_decay"](ema_decay), _RULES["uniform_mix"](uniform_mix)
        self.prior_strength = _RULES["prior_strength"](prior_strength)
        self.level_decay = _RULES["level_decay"](level_decay)
        self.statistic = _RULES["statistic"](statistic)
        self._g = np.zeros(num_examples, dtype=np.float32)    # G_i relative to L; 0 where unseen
        self._n = np.zeros(num_examples, dtype=np.uint16)     # n_i, saturating
        self.level, self.level_steps = 0.0, 0                 # L and how often it was updated
        self._seen_sq, self._seen_count, self._since_resync = 0.0, 0, 0  # running Σ s² over the seen
        self._init_store(sum_tree)

    # -- reading the state ----------------------------------------------------------------
    def _seen_scores(self, indices: np.ndarray) -> np.ndarray:
        g = self._g[indices].astype(np.float64)
        return np.sqrt(g) if self.statistic == "square" else g   # 0 where unseen (G = 0 there)

    def _prior_score(self) -> float:
        """s̄: the root-mean-square sampling score of the seen examples (0 before any)."""
        if not self._seen_count:
            return 0.0
        return math.sqrt(max(self._seen_sq, 0.0) / self._seen_count)

    def decay(self, counts) -> np.ndarray:
        """The EMA decay the next update applies to examples already observed ``counts`` times.

        β_n = min(β, (n + c)/(n + c + 1)) with β = ``ema_decay`` and c = ``prior_strength``
        (c = 0 for a first observation made before any example has been seen: there is no prior
        before any data).

        Example:
            >>> SAZOSampler(4, ema_decay=0.9, prior_strength=1.0).decay([0, 1, 20]).round(3).tolist()
            [0.0, 0.667, 0.9]
        """
        self._check_settings()   # β and c set between steps: as the next update reads them (−0.5 was returned)
        counts = np.asarray(counts, dtype=np.float64)
        strength = np.where((counts > 0) | bool(self._seen_count), self.prior_strength, 0.0)
        return np.minimum((counts + strength) / (counts + strength + 1.0), self.ema_decay)

    def prior(self) -> float:
        """The prior in G's units: s̄ ("abs") or s̄² ("square"), what an unseen example's G starts from, after
        ``_check_settings`` (a statistic switched since the last draw read the running Σ s² of the old one: the
        prior in the old units, once)."""
        self._check_settings()
        prior = self._prior_score()
        return prior * prior if self.statistic == "square" else prior

    def norm_estimates(self) -> torch.Tensor:
        """Estimates of ‖∇f_i‖ [N] at the current level (Gaussian z), float64."""
        scores = self.scores()
        if self.statistic == "abs":  # E|d| = sqrt(2/π)·‖∇f‖
            return scores * self.level * math.sqrt(math.pi / 2)
        return scores * self.level

    def squared_norm_estimates(self) -> torch.Tensor:
        """Estimates of ‖∇f_i‖² [N] (what E[d_i²] measures), float64."""
        return self.norm_estimates() ** 2

    # -- learning -------------------------------------------------------------------------
    def _observe(self, indices, diffs) -> None:
        if not indices.numel():
            return
        indices, size = indices.numpy(), np.abs(diffs.numpy())
        # everything is computed first, then written: a failure leaves the state unchanged
        steps = self.level_steps + 1
        level = self._next_level(indices, size, steps)
        if not math.isfinite(level):
            raise ValueError("Invalid directional_diffs: too large (the level |d| would overflow float64)")
        observed = np.minimum(size / level, SCORE_MAX) if level > 0 else np.zeros(len(size))
        if self.statistic == "square":
            observed = np.minimum(observed * observed, SCORE_MAX)
        unique, observed = _mean_by_index(indices, observed)   # duplicates: the mean statistic
        counts = self._n[unique].astype(np.float64)
        seen = counts > 0
        prior = self.prior()
        old = np.where(seen, self._g[unique].astype(np.float64), prior)
        decay = self._observation_decay(counts, old, observed)
        new = (decay * old + (1.0 - decay) * observed).astype(np.float32)
        old_scores = self._seen_scores(unique)[seen]
        new_counts = np.minimum(self._n[unique].astype(np.int64) + 1, COUNT_MAX)
        with InterruptsDeferred():  # commit: all of it is written, or (Ctrl-C before this) none
            self.level, self.level_steps = level, steps
            self._g[unique] = new
            self._n[unique] = new_counts
            new_scores = self._seen_scores(unique)
            self._seen_sq += float((new_scores * new_scores).sum() - (old_scores * old_scores).sum())
            self._seen_count += int(len(unique) - seen.sum())
            self._since_resync += len(unique)
            if self._since_resync >= self.num_examples:  # bound the running sum's rounding drift
                self._resync()
            self._store.refresh(unique, unseen_changed=unique[~seen])

    def _observation_decay(self, counts: np.ndarray, old: np.ndarray, observed: np.ndarray) -> np.ndarray:
        """The decay each observed example's G takes now ([U]; ``old``: its G, the prior where unseen): β_n."""
        return self.decay(counts)

    def _next_level(self, indices: np.ndarray, size: np.ndarray, steps: int) -> float:
        """L ← EMA of mean_k(w_k·|d_k|): an importance-weighted estimate of (1/N)·Σ_i E|d_i|."""
        with np.errstate(over="ignore", invalid="ignore"):
            weights = importance_weights(self._probs_at(indices), self.num_examples)  # the sampling weights
            rate = max(1.0 / steps, 1.0 - float(self.level_decay))   # a float32 decay made L a float32
            return (1.0 - rate) * self.level + rate * float(np.mean(weights * size))

    def _rescore(self) -> None:
        """The store's sums and the running Σ s² (the prior s̄) again, in the statistic now in force."""
        with InterruptsDeferred():
            self._resync()
            super()._rescore()

    def _resync(self) -> None:
        seen = np.flatnonzero(self._n > 0)
        scores = self._seen_scores(seen)
        self._seen_sq, self._seen_count, self._since_resync = float((scores * scores).sum()), len(seen), 0

    # -- checkpoints ----------------------------------------------------------------------
    def _hyperparameters(self) -> dict:
        return dict(ema_decay=self.ema_decay, uniform_mix=self.uniform_mix, prior_strength=self.prior_strength,
                    statistic=self.statistic, level_decay=self.level_decay, sum_tree=self.sum_tree)

    def _check_hyperparameters(self, hyper: dict) -> dict:
        checked = super()._check_hyperparameters(hyper)
        if checked["sum_tree"] != self.sum_tree:
            raise ValueError("Invalid state: sum_tree differs (the store is chosen at construction)")
        return checked

    def _extra_state(self) -> dict:
        return dict(level=self.level, level_steps=self.level_steps, seen_sq=self._seen_sq,
                    seen_count=self._seen_count, since_resync=self._since_resync)

    def _check_extra(self, extra: dict, g: np.ndarray, n: np.ndarray, hyper: dict) -> dict:
        """The scalars checked against what the update rule can produce from these estimates and counts.

        Each update with observations adds 1 to ``level_steps`` and to the count of each distinct
        index it saw, and the number of those to ``since_resync`` (set to 0, with ``seen_sq`` to the
        exact Σ s², once it reaches N). So: level_steps ≥ every count, > 0 exactly when something
        was seen; since_resync < N and ≤ Σ counts; and ``seen_sq`` differs from Σ s² over the seen
        examples only by the float64 rounding of since_resync additions (``_running_sum_slack``).
        """
        expected = set(SAZOSampler._extra_state(self))   # the robust rule's own (a subclass checks its own)
        if set(extra) != expected:
            raise ValueError(f"Invalid state: extra {sorted(extra)} (expected {sorted(expected)})")
        seen = int((n > 0).sum())
        checked = dict(level=check_number("level", extra["level"], 0.0),
                       level_steps=check_int("level_steps", extra["level_steps"], 0, _STEPS_MAX),
                       seen_sq=check_number("seen_sq", extra["seen_sq"]),
                       seen_count=check_int("seen_count", extra["seen_count"], 0),
                       since_resync=check_int("since_resync", extra["since_resync"], 0))
        if checked["seen_count"] != seen:
            raise ValueError(f"Invalid state: seen_count {checked['seen_count']} != {seen} examples with counts > 0")
        if (g[n == 0] != 0).any():
            raise ValueError("Invalid state: estimates must be 0 where counts are 0")
        if checked["since_resync"] >= self.num_examples:  # an update resyncs as soon as it reaches N
            raise ValueError(f"Invalid state: since_resync {checked['since_resync']} (expected < {self.num_examples})")
        steps = checked["level_steps"]
        if steps == 0 and (seen or checked["level"] != 0.0):
            raise ValueError("Invalid state: level_steps is 0 but examples were observed or the level is set")
        if steps > 0 and not seen:
            raise ValueError(f"Invalid state: level_steps {steps} but no example has a count > 0")
        if n.size and int(n.max()) > steps:
            raise ValueError(f"Invalid state: level_steps {steps} is below a count of {int(n.max())} "
                             f"(each update counts an example at most once)")
        total = int(n.astype(np.int64).sum())
        if checked["since_resync"] > total and not (n == COUNT_MAX).any():
            raise ValueError(f"Invalid state: since_resync {checked['since_resync']} exceeds the {total} "
                             f"observations the counts hold")
        square = hyper["statistic"] == "square"   # the loaded rule's, not this sampler's
        exact, slack = _sum_of_squares(g, n, square), _running_sum_slack(checked["since_resync"], seen, square)
        if not abs(checked["seen_sq"] - exact) <= slack:
            raise ValueError(f"Invalid state: seen_sq {checked['seen_sq']:.6g}, but the estimates give Σ s² = "
                             f"{exact:.6g} (the running sum can drift from it by at most {slack:.3g})")
        return checked

    def _apply_extra(self, extra: dict) -> None:
        self.level, self.level_steps = extra["level"], extra["level_steps"]
        self._seen_sq, self._seen_count, self._since_resync = extra["seen_sq"], extra["seen_count"], extra["since_resync"]


def _sum_of_squares(g: np.ndarray, n: np.ndarray, square: bool) -> float:
    """Σ s² over the examples with counts > 0, summed as ``SAZOSampler._resync`` sums it (bit for bit)."""
    scores = g[np.flatnonzero(n > 0)].astype(np.float64)
    scores = np.sqrt(scores) if square else scores
    return float((scores * scores).sum())


def _running_sum_slack(since_resync: int, seen: int, square: bool) -> float:
    """How far rounding can move SAZO's running Σ s² from the exact sum in ``since_resync`` observations.

    The largest s² a stored estimate gives is s²_max = ESTIMATE_MAX² ("abs": s = G) or ESTIMATE_MAX
    ("square": s = sqrt(G)). Each update of k examples sums k new and k old squares, subtracts, and
    adds the result to a running sum of at most seen·s²_max: under 5·k·seen·s²_max·u of rounding
    (u = 2⁻⁵³), so the drift stays below 8·u·since_resync·seen·s²_max (0 right after a resync).
    """
    largest = SAZOSampler.ESTIMATE_MAX if square else SAZOSampler.ESTIMATE_MAX ** 2
    return 8.0 * 2.0 ** -53 * since_resync * max(seen, 1) * largest


class StaleCorrectedSAZOSampler(SAZOSampler):
    """The robust rule with a staleness correction: scores of examples not drawn for a while are
    scaled by how much examples of that age have been found to have grown when they were drawn.

    On top of ``SAZOSampler`` (whose rule, level and prior are unchanged) it keeps, per example, the
    update step t_i at which it was last observed, and for K = ``AGE_BUCKETS`` log₂ buckets of age
    a = t + 1 − t_i (the steps since that draw, counted at the next update) two running means over
    the seen examples drawn at that age: A_b of their fresh observation in score units (|d_i|/L for
    "abs"; |d_i|/L·sqrt(π/2) for "square", whose mean is ‖∇f_i‖/L like s_i = sqrt(G_i)) and S_b of the
    score s_i they had stored. Then

        sample:  ŝ_i = s_i · r_{b(a_i)}  for seen examples,  r_b = clip(A_b / S_b, ``min_factor``, ``max_factor``)
                 (r_b = 1 where A_b = S_b = 0: every observation at that age was 0, no evidence of growth)
        update:  the robust rule's; then for each seen drawn example, A_b ← (1−ρ)A_b + ρ·fresh score,
                 S_b ← (1−ρ)S_b + ρ·stored score (ρ = ``growth_rate``; A_b = S_b = 1 at the start), t_i ← t

    Unseen examples keep the prior s̄ (of the uncorrected scores). The weights stay 1/(N·p_i) for the
    p actually sampled, so the estimate stays unbiased for any r. Extra state: an int64 step per
    example and 2K floats. The correction moves every example's age each step, so p is rebuilt in
    an O(N) pass per step: there is no sum-tree mode (``sum_tree=True`` is refused).

    Why: on norms that grow where SAZO rarely looks (an example with a low score is drawn about once
    every N/(λB) steps), the stored score is stale-low and its weight 1/(N·p_i) large when it is finally
    drawn; examples of that age, drawn meanwhile, show the growth. Measured against the default
    robust rule on the toys and a language model: docs/samplers.md and docs/llm.md.

    Args:
        growth_rate: ρ ∈ (0, 1], the running means' step.
        min_factor, max_factor: the clip of each r_b, min_factor ∈ (0, 1] and max_factor > 1 (an age
            that comes back smaller cannot starve its examples below half their score by default).
        (the rest as ``SAZOSampler``)

    Example:
        >>> s = StaleCorrectedSAZOSampler(100, seed=0)
        >>> idx, w = s.sample(8)
        >>> s.update(idx, torch.randn(8))
        >>> idx, w = s.sample(8)
        >>> bool(torch.equal(w, 1 / (100 * s.probs[idx]))), s.growth_factors().shape
        (True, (40,))
    """

    AGE_BUCKETS = 40
    SETTINGS = (*SAZOSampler.SETTINGS, "growth_rate", "min_factor", "max_factor")
    SCORED_BY = (*SAZOSampler.SCORED_BY, "min_factor", "max_factor")   # the clip of every r_b

    def __init__(self, num_examples: int, *, ema_decay: float = 0.9, uniform_mix: float = 0.1,
                 prior_strength: float = 1.0, statistic: str = "abs", level_decay: float = 0.99,
                 growth_rate: float = 0.02, min_factor: float = 0.5, max_factor: float = 20.0,
                 sum_tree: bool | None = None, seed: int = 0):
        if sum_tree is not None and not isinstance(sum_tree, bool):   # `if sum_tree` raised RuntimeError on a tensor
            raise ValueError(f"Invalid sum_tree: {sum_tree!r} (expected False or None)")
        if sum_tree:
            raise ValueError("Invalid sum_tree: True (the staleness correction rebuilds p in an O(N) pass per step)")
        # set before the robust rule's constructor, which records the settings its store sums under (SCORED_BY)
        self.growth_rate, self.min_factor = _RULES["growth_rate"](growth_rate), _RULES["min_factor"](min_factor)
        self.max_factor = _RULES["max_factor"](max_factor)
        super().__init__(num_examples, ema_decay=ema_decay, uniform_mix=uniform_mix, prior_strength=prior_strength,
                         statistic=statistic, level_decay=level_decay, sum_tree=False, seed=seed)
        self._last = np.zeros(self.num_examples, dtype=np.int64)  # t_i, the update step of the last draw; 0 unseen
        self._fresh = np.ones(self.AGE_BUCKETS)    # A_b
        self._stored = np.ones(self.AGE_BUCKETS)   # S_b

    # -- the correction -------------------------------------------------------------------
    def _buckets(self, ages: np.ndarray) -> np.ndarray:
        """log₂ buckets of ages ≥ 1: 1 → 0, 2–3 → 1, 4–7 → 2, ... (the last holds everything older)."""
        return np.minimum(np.floor(np.log2(np.maximum(ages, 1))).astype(np.int64), self.AGE_BUCKETS - 1)

    def growth_factors(self) -> np.ndarray:
        """r_b [K] float64: how much the score of a seen example of each age bucket is scaled by (1 where
        A_b = S_b = 0). With ρ = 1 (or after long runs of zero diffs) both means reach 0: 0/0 was NaN, every
        sampling score of that age NaN, and their sum made p fall back to uniform for every example."""
        fresh, stored = self._fresh, self._stored
        with np.errstate(divide="ignore", invalid="ignore"):   # S_b = 0 < A_b: inf, clipped to max_factor
            ratio = np.where((fresh == 0) & (stored == 0), 1.0, fresh / stored)
        return np.clip(ratio, self.min_factor, self.max_factor)

    def _factors_at(self, indices: np.ndarray) -> np.ndarray:
        return self.growth_factors()[self._buckets(self.level_steps + 1 - self._last[indices])]

    def _sampling_scores(self, indices: np.ndarray) -> np.ndarray:
        return self._seen_scores(indices) * self._factors_at(indices)

    def _observe(self, indices, diffs) -> None:
        if not indices.numel():
            return
        unique = np.unique(indices.numpy())
        seen = self._n[unique] > 0
        buckets = self._buckets(self.level_steps + 1 - self._last[unique[seen]])
        stored = self._seen_scores(unique[seen])
        with InterruptsDeferred():   # the robust update and the correction's state: all or none
            super()._observe(indices, diffs)       # raises before any change if the diffs are refused
            self._learn_by_age(buckets, self._fresh_scores(indices, diffs)[seen], stored)
            self._last[unique] = self.level_steps
            self._store.refresh(None)

    def _learn_by_age(self, buckets: np.ndarray, fresh: np.ndarray, stored: np.ndarray) -> None:
        """The running means A_b, S_b from the seen examples this step redrew: their age buckets, fresh
        observations and the scores they had stored (≤ B of each)."""
        for b, f, g in zip(buckets, fresh, stored):
            self._fresh[b] += self.growth_rate * (f - self._fresh[b])
            self._stored[b] += self.growth_rate * (g - self._stored[b])

    def _fresh_scores(self, indices, diffs) -> np.ndarray:
        """This step's observations in score units (at the level just updated), one per distinct index
        in sorted order: |d|/L ("abs": what G tracks), |d|/L·sqrt(π/2) ("square": E of it is ‖∇f‖/L)."""
        size = np.abs(diffs.numpy())
        observed = np.minimum(size / self.level, SCORE_MAX) if self.level > 0 else np.zeros(len(size))
        _, observed = _mean_by_index(indices.numpy(), observed)
        return observed if self.statistic == "abs" else observed * math.sqrt(math.pi / 2)

    # -- checkpoints ----------------------------------------------------------------------
    def _hyperparameters(self) -> dict:
        hyper = super()._hyperparameters()
        hyper.update(growth_rate=self.growth_rate, min_factor=self.min_factor, max_factor=self.max_factor)
        return hyper

    def _extra_state(self) -> dict:
        extra = super()._extra_state()
        extra.update(last_seen=torch.from_numpy(self._last.copy()), growth_fresh=torch.from_numpy(self._fresh.copy()),
                     growth_stored=torch.from_numpy(self._stored.copy()))
        return extra

    def _extra_bytes(self) -> int:
        return self._last.nbytes + self._fresh.nbytes + self._stored.nbytes

    def _check_extra(self, extra: dict, g: np.ndarray, n: np.ndarray, hyper: dict) -> dict:
        """The robust rule's scalars, then: last_seen int64 [N], 0 exactly where counts are 0 and in
        [1, level_steps] elsewhere; growth_fresh and growth_stored finite and ≥ 0 (the running means of
        scores ≥ 0 reach 0: a state the sampler wrote was refused), shape [K]."""
        mine = ("last_seen", "growth_fresh", "growth_stored")
        missing = [k for k in mine if k not in extra]
        if missing:
            raise ValueError(f"Invalid state: extra lacks {missing}")
        checked = super()._check_extra({k: v for k, v in extra.items() if k not in mine}, g, n, hyper)
        last = _state_array("last_seen", extra["last_seen"])
        if last.shape != (self.num_examples,) or last.dtype.kind not in "iu":
            raise ValueError(f"Invalid state: last_seen must be integers of shape ({self.num_examples},)")
        last = last.astype(np.int64)
        if ((last == 0) != (n == 0)).any() or (last < 0).any() or (last > checked["level_steps"]).any():
            raise ValueError(f"Invalid state: last_seen must be 0 exactly where counts are 0 and in "
                             f"[1, level_steps={checked['level_steps']}] elsewhere")
        for name in mine[1:]:
            values = _state_array(name, extra[name])
            if values.shape != (self.AGE_BUCKETS,) or values.dtype.kind not in "fiu":
                raise ValueError(f"Invalid state: {name} must be a real tensor of shape ({self.AGE_BUCKETS},)")
            checked[name] = values.astype(np.float64)
            if not (np.isfinite(checked[name]) & (checked[name] >= 0)).all():
                raise ValueError(f"Invalid state: {name} must be finite and >= 0")
        checked["last_seen"] = last
        return checked

    def _apply_extra(self, extra: dict) -> None:
        super()._apply_extra(extra)
        self._last[:] = extra["last_seen"]
        self._fresh[:], self._stored[:] = extra["growth_fresh"], extra["growth_stored"]


# -- samplers by name -----------------------------------------------------------------------
SAMPLERS = ("uniform", "sazo", "sazo-plain", "oracle")
RACED = ("uniform", "sazo", "oracle")   # the three every race compares (the plain rule is a teaching variant)
ALIASES = {"mezo": "uniform"}   # the Trainer's and zo_finetune's historical name for uniform MeZO


def sampler_name(name: str) -> str:
    """The canonical sampler name: ``"mezo"`` is uniform MeZO; other names pass unchanged."""
    return ALIASES.get(name, name)


def make_sampler(name: str, num_examples: int, *, seed: int = 0, ema_decay: float = 0.9,
                 uniform_mix: float = 0.1, norms_fn: Callable[[], torch.Tensor] | None = None,
                 oracle_mix: float = 0.0) -> Sampler:
    """The one vocabulary of samplers by name, shared by ``train``, ``hf``, ``llm`` and the course.

    "uniform" (p = 1/N), "sazo" (the robust rule; β = ``ema_decay``, λ = ``uniform_mix``),
    "sazo-plain" (the plain rule: EMA of d², p ∝ sqrt(G); same β, λ) or "oracle"
    (p* ∝ ``norms_fn()``, mixed with uniform by ``oracle_mix``; needs ``norms_fn``).

    Each sampler reads only its own settings, so one set of keywords serves every name (``race`` and
    ``llm.query_run`` pass theirs to each sampler they compare): ``uniform_mix`` and ``ema_decay`` are the SAZO
    rules' and are ignored by "uniform" and "oracle"; the oracle's λ is ``oracle_mix`` (default 0: the exact p*).

    Example:
        >>> make_sampler("sazo", 10, uniform_mix=0.2).uniform_mix
        0.2
    """
    check_choice("sampler", name, SAMPLERS)
    if name == "uniform":
        return UniformSampler(num_examples, seed=seed)
    if name == "sazo":
        return SAZOSampler(num_examples, ema_decay=ema_decay, uniform_mix=uniform_mix, seed=seed)
    if name == "sazo-plain":
        return PlainSAZOSampler(num_examples, ema_decay=ema_decay, uniform_mix=uniform_mix, seed=seed)
    if norms_fn is None:
        raise ValueError("Invalid norms_fn: the oracle needs a callable returning the true norms [N]")
    return OracleSampler(num_examples, norms_fn, uniform_mix=oracle_mix, seed=seed)

"""Minibatch samplers: uniform, SAZO (sample-adaptive) and the minimum-variance oracle.

Every sampler draws B indices i.i.d. from a distribution p over {0..N-1} and returns the
importance weights w = 1/(N·p_i), so that E[w·f_i] = F for any p with full support.
Samplers know nothing of models or optimisers: they see indices and directional diffs.
"""
from __future__ import annotations

from typing import Callable

import torch

__all__ = ["Sampler", "UniformSampler", "SAZOSampler", "OracleSampler"]


def _check_count(name: str, value) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ValueError(f"Invalid {name}: {value!r} (expected an int >= 1)")
    return value


def _check_fraction(name: str, value, low: float, high: float, *, closed_low: bool, closed_high: bool) -> float:
    try:
        value = float(value)
    except (TypeError, ValueError):
        raise ValueError(f"Invalid {name}: {value!r} (expected a number)") from None
    above = value >= low if closed_low else value > low
    below = value <= high if closed_high else value < high
    if not (above and below):
        interval = f"{'[' if closed_low else '('}{low}, {high}{']' if closed_high else ')'}"
        raise ValueError(f"Invalid {name}: {value} (expected a number in {interval})")
    return value


class Sampler:
    """Base class: i.i.d. draws from ``probs`` with weights 1/(N·p_i).

    Subclasses override ``probs`` and, if they learn, ``_observe``.
    """

    def __init__(self, num_examples: int, *, seed: int = 0):
        self.num_examples = _check_count("num_examples", num_examples)
        if isinstance(seed, bool) or not isinstance(seed, int):
            raise ValueError(f"Invalid seed: {seed!r} (expected an int)")
        self.seed = seed
        self._generator = torch.Generator().manual_seed(seed)

    @property
    def probs(self) -> torch.Tensor:
        """Sampling distribution, float64 tensor [N] that sums to 1."""
        return torch.full((self.num_examples,), 1.0 / self.num_examples, dtype=torch.float64)

    def sample(self, batch_size: int) -> tuple[torch.Tensor, torch.Tensor]:
        """Draw ``batch_size`` indices i.i.d. from ``probs``.

        Returns:
            (indices LongTensor [B], weights float64 Tensor [B] with w = 1/(N·p_i)).
        """
        _check_count("batch_size", batch_size)
        probs = self.probs
        indices = torch.multinomial(probs, batch_size, replacement=True, generator=self._generator)
        return indices, 1.0 / (self.num_examples * probs[indices])

    def update(self, indices: torch.Tensor, directional_diffs: torch.Tensor) -> None:
        """Feed back the step's per-example directional diffs d_k for the sampled indices.

        The whole update is rejected (``ValueError``, state unchanged) if any index is out
        of range or the shapes disagree.
        """
        indices, diffs = self._check_feedback(indices, directional_diffs)
        self._observe(indices, diffs)

    def _observe(self, indices: torch.Tensor, diffs: torch.Tensor) -> None:
        """Learn from a checked batch; the default sampler learns nothing."""

    def _check_feedback(self, indices, diffs) -> tuple[torch.Tensor, torch.Tensor]:
        indices = torch.as_tensor(indices)
        diffs = torch.as_tensor(diffs).detach().to("cpu", torch.float64)
        if indices.dim() != 1 or indices.dtype.is_floating_point or indices.dtype == torch.bool:
            raise ValueError(f"Invalid indices: expected a 1-D integer tensor, got {indices.dtype} "
                             f"of shape {tuple(indices.shape)}")
        indices = indices.to("cpu", torch.long)
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
        if state["num_examples"] != self.num_examples:
            raise ValueError(f"Invalid state: num_examples {state['num_examples']} != {self.num_examples}")
        self.seed = state["seed"]
        self._generator.set_state(state["generator"])


class UniformSampler(Sampler):
    """Uniform sampling with replacement; all weights are 1 (plain MeZO minibatches).

    Example:
        >>> idx, w = UniformSampler(10, seed=0).sample(4)
        >>> bool((w == 1).all())
        True
    """

    def sample(self, batch_size: int) -> tuple[torch.Tensor, torch.Tensor]:
        _check_count("batch_size", batch_size)
        indices = torch.randint(self.num_examples, (batch_size,), generator=self._generator)
        return indices, torch.ones(batch_size, dtype=torch.float64)


class OracleSampler(Sampler):
    """The minimum-variance oracle p*_i = ‖∇f_i‖ / Σ_j ‖∇f_j‖ (teaching and benchmarks only).

    Args:
        num_examples: N.
        norms_fn: returns the true per-example gradient norms [N] at the current θ; called
            at every ``sample``. All-zero norms fall back to uniform.
        uniform_mix: optional λ ∈ [0, 1]: p = (1−λ)p* + λ/N (0 gives the exact oracle).
    """

    def __init__(self, num_examples: int, norms_fn: Callable[[], torch.Tensor], *,
                 uniform_mix: float = 0.0, seed: int = 0):
        super().__init__(num_examples, seed=seed)
        if not callable(norms_fn):
            raise ValueError("Invalid norms_fn: expected a callable returning norms [N]")
        self.norms_fn = norms_fn
        self.uniform_mix = _check_fraction("uniform_mix", uniform_mix, 0.0, 1.0,
                                           closed_low=True, closed_high=True)

    @property
    def probs(self) -> torch.Tensor:
        norms = torch.as_tensor(self.norms_fn()).detach().to("cpu", torch.float64)
        if norms.shape != (self.num_examples,) or bool((norms < 0).any()):
            raise ValueError(f"Invalid norms_fn: expected non-negative norms of shape ({self.num_examples},)")
        uniform = torch.full_like(norms, 1.0 / self.num_examples)
        total = norms.sum()
        p_star = norms / total if total > 0 else uniform
        return (1.0 - self.uniform_mix) * p_star + self.uniform_mix * uniform


class SAZOSampler(Sampler):
    """Sample-adaptive ZO: importance sampling from EMAs of the squared diffs d².

    State: G_i, an estimate of ‖∇f_i‖² (E_z[d_i²] = ‖∇f_i‖²), and n_i, how often i was seen.

        p_i = (1−λ) · sqrt(Ĝ_i) / Σ_j sqrt(Ĝ_j) + λ/N,    Ĝ_i = G_i if n_i > 0 else Ḡ
        on observing d_i²:  β_i = min(β, (n_i + c)/(n_i + c + 1)),  G_i ← β_i Ĝ_i + (1−β_i) d_i²

    Ḡ is the mean estimate over the examples seen so far, so unseen examples are neither
    starved nor favoured; a new example starts from the prior Ḡ held with the weight of
    ``prior_strength`` (c) observations, which damps the χ²₁ noise of a single d².

    Args:
        num_examples: N.
        ema_decay: β ∈ [0, 1); larger tracks slowly but averages more noise away.
        uniform_mix: λ ∈ (0, 1]; keeps every example reachable and bounds w ≤ 1/λ.
        prior_strength: c ≥ 0 pseudo-observations of the prior Ḡ for a new example.
        seed: seed of the sampling generator.

    Example:
        >>> s = SAZOSampler(100, seed=0)
        >>> idx, w = s.sample(8)
        >>> s.update(idx, torch.randn(8))
        >>> float(s.probs.sum())
        1.0
    """

    def __init__(self, num_examples: int, *, ema_decay: float = 0.9, uniform_mix: float = 0.1,
                 prior_strength: float = 1.0, seed: int = 0):
        super().__init__(num_examples, seed=seed)
        self.ema_decay = _check_fraction("ema_decay", ema_decay, 0.0, 1.0, closed_low=True, closed_high=False)
        self.uniform_mix = _check_fraction("uniform_mix", uniform_mix, 0.0, 1.0, closed_low=False, closed_high=True)
        self.prior_strength = _check_fraction("prior_strength", prior_strength, 0.0, float("inf"),
                                              closed_low=True, closed_high=False)
        self.estimates = torch.zeros(num_examples, dtype=torch.float32)  # G_i, O(N)
        self.counts = torch.zeros(num_examples, dtype=torch.int32)       # n_i, O(N)

    def prior(self) -> float:
        """Ḡ: the mean estimate over seen examples (0 before any observation)."""
        seen = self.counts > 0
        return float(self.estimates[seen].double().mean()) if bool(seen.any()) else 0.0

    def squared_norm_estimates(self) -> torch.Tensor:
        """Ĝ [N] float64: G_i for seen examples, the prior Ḡ for unseen ones."""
        estimates = self.estimates.double()
        return torch.where(self.counts > 0, estimates, torch.full_like(estimates, self.prior()))

    @property
    def probs(self) -> torch.Tensor:
        scores = self.squared_norm_estimates().clamp_min(0).sqrt()
        uniform = torch.full_like(scores, 1.0 / self.num_examples)
        total = scores.sum()
        adaptive = scores / total if total > 0 else uniform
        return (1.0 - self.uniform_mix) * adaptive + self.uniform_mix * uniform

    def _observe(self, indices: torch.Tensor, diffs: torch.Tensor) -> None:
        unique, inverse = torch.unique(indices, return_inverse=True)
        squared = torch.zeros(len(unique), dtype=torch.float64).index_add_(0, inverse, diffs ** 2)
        squared /= torch.bincount(inverse, minlength=len(unique)).double()  # duplicates: mean d²
        prior = self.prior()
        counts = self.counts[unique].double()
        old = torch.where(counts > 0, self.estimates[unique].double(), torch.full_like(squared, prior))
        c = self.prior_strength
        if prior == 0.0 and not bool((counts > 0).any()):
            c = 0.0  # nothing seen yet: there is no prior to blend with
        decay = ((counts + c) / (counts + c + 1.0)).clamp_max(self.ema_decay)  # running mean, then EMA
        self.estimates[unique] = (decay * old + (1.0 - decay) * squared).float()
        self.counts[unique] += 1

    def state_dict(self) -> dict:
        return {**super().state_dict(), "estimates": self.estimates.clone(), "counts": self.counts.clone(),
                "ema_decay": self.ema_decay, "uniform_mix": self.uniform_mix,
                "prior_strength": self.prior_strength}

    def load_state_dict(self, state: dict) -> None:
        super().load_state_dict(state)
        self.estimates.copy_(state["estimates"])
        self.counts.copy_(state["counts"])
        self.ema_decay, self.uniform_mix = state["ema_decay"], state["uniform_mix"]
        self.prior_strength = state["prior_strength"]

"""MeZO: a zeroth-order optimiser that needs two forward passes and no backward pass.

One step, with a fresh seed s, smoothing radius ε and per-example losses f_k:

    θ ← θ + εz(s)            evaluate L+ (per example)
    θ ← θ − 2εz(s)           evaluate L− (per example)
    θ ← (1 − η·λ_wd)(θ + εz(s)) − η·g·z(s)       restore and update in one pass

    d_k = (f_k(θ+εz) − f_k(θ−εz)) / (2ε)          per-example directional differences
    g   = mean_k(w_k · d_k)                          projected gradient

z is never stored: it is regenerated from (step seed, tensor index) with an explicit
``torch.Generator`` on each parameter's device, so peak memory is inference memory
plus one parameter tensor's worth of z.

Speed: generating z, not the arithmetic, dominates a pass. ``MeZO(..., noise=...)`` swaps the
plain loop for a faster source (``sazo_lite.noise``): ``TorchNoise`` (same z bit for bit,
chunked and threaded; the default for CPU models of ≥ 2²⁰ entries), ``NoiseTable`` (windows
of a shared table; different z) or, on CUDA, ``sazo_lite.kernels.TritonNoise`` (z generated
in registers).
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Callable, Iterable

import torch

__all__ = ["MeZO", "ZOStep", "derive_seed", "draw_direction", "rademacher_signs", "PERTURBATIONS"]

PERTURBATIONS = ("gaussian", "rademacher")
_MASK64 = (1 << 64) - 1


def _splitmix64(x: int) -> int:
    x = (x + 0x9E3779B97F4A7C15) & _MASK64
    x = ((x ^ (x >> 30)) * 0xBF58476D1CE4E5B9) & _MASK64
    x = ((x ^ (x >> 27)) * 0x94D049BB133111EB) & _MASK64
    return x ^ (x >> 31)


def derive_seed(*parts: int) -> int:
    """Hash integers into a 63-bit seed (SplitMix64), stable across runs and platforms.

    Example:
        >>> derive_seed(0, 1) == derive_seed(0, 1) != derive_seed(0, 2)
        True
    """
    h = 0
    for part in parts:
        h = _splitmix64(h ^ (int(part) & _MASK64))
    return h >> 1


def draw_direction(like: torch.Tensor, seed: int, perturbation: str,
                   generator: torch.Generator) -> torch.Tensor:
    """Regenerate the random direction z for one parameter tensor from its seed.

    Half-precision parameters get z drawn in float32 (then rounded once by the in-place
    add); float32/float64 parameters get z in their own dtype.
    """
    dtype = like.dtype if like.dtype in (torch.float32, torch.float64) else torch.float32
    generator.manual_seed(seed)
    if perturbation == "gaussian":
        return torch.randn(like.shape, generator=generator, device=like.device, dtype=dtype)
    return rademacher_signs(like.numel(), dtype, like.device, generator).view(like.shape)


def rademacher_signs(numel: int, dtype: torch.dtype, device, generator: torch.Generator) -> torch.Tensor:
    """``numel`` independent ±1 (probability ½ each), 8 from every random byte the generator draws.

    Each byte b picks row b of a 256 × 8 table of its bits' signs: ~0.75 ns a sign on this CPU,
    against ~2.4 for ``randn`` and ~10 for ``bernoulli_(0.5)``. The generator hands out one
    byte per element in order, so drawing 8·k signs at a time continues the same stream
    (``sazo_lite.noise.TorchNoise`` draws large tensors in chunks). Besides z (4·n bytes in
    float32) it holds the ⌈n/8⌉ draws as int64 (n bytes) for a moment.
    """
    random_bytes = torch.randint(0, 256, ((numel + 7) // 8,), generator=generator, device=device)  # int64
    return _sign_table(dtype, torch.device(device)).index_select(0, random_bytes).view(-1)[:numel]


_SIGN_TABLES: dict[tuple[torch.dtype, torch.device], torch.Tensor] = {}


def _sign_table(dtype: torch.dtype, device: torch.device) -> torch.Tensor:
    """[256, 8]: row b holds 2·bit_k(b) − 1 for k = 0..7 (built once per dtype and device)."""
    key = (dtype, device)
    if key not in _SIGN_TABLES:
        bits = (torch.arange(256).unsqueeze(1) >> torch.arange(8)) & 1
        _SIGN_TABLES[key] = (2 * bits - 1).to(dtype=dtype, device=device)
    return _SIGN_TABLES[key]


@dataclass(frozen=True)
class ZOStep:
    """What one MeZO step observed.

    Attributes:
        loss: weighted mean of (L+ + L−)/2, a float.
        projected_grad: g = mean(weights · directional_diffs), the scalar the update uses.
        directional_diffs: float64 tensor [B] of unweighted (f_k(θ+εz) − f_k(θ−εz))/(2ε);
            empty when the closure returned a scalar.
        seed: the step seed that z was regenerated from.
        losses: float64 tensor [B] of per-example (f_k(θ+εz) + f_k(θ−εz))/2 (empty for scalars).
    """

    loss: float
    projected_grad: float
    directional_diffs: torch.Tensor
    seed: int
    losses: torch.Tensor


def _check_finite_number(name: str, value, low: float, *, strict: bool) -> float:
    try:
        value = float(value)
    except (TypeError, ValueError):
        raise ValueError(f"Invalid {name}: {value!r} (expected a number)") from None
    bad = value <= low if strict else value < low
    if not math.isfinite(value) or bad:
        bound = f"> {low}" if strict else f">= {low}"
        raise ValueError(f"Invalid {name}: {value} (expected a finite number {bound})")
    return value


# "auto" noise switches to TorchNoise from this many parameter entries on (below it, e.g. the
# toy problems, a pass is a few µs of Python either way and the plain loop is simplest).
AUTO_NOISE_MIN_ENTRIES = 2 ** 20


def _auto_noise(param_groups: list[dict]):
    """TorchNoise for large all-CPU models (same z, faster), else None (the plain loop)."""
    params = [p for group in param_groups for p in group["params"]]
    if any(p.device.type != "cpu" for p in params) or sum(p.numel() for p in params) < AUTO_NOISE_MIN_ENTRIES:
        return None
    from .noise import TorchNoise  # noise imports this module

    return TorchNoise(workers=max(1, min(2, torch.get_num_threads())))


class MeZO(torch.optim.Optimizer):
    """Memory-efficient zeroth-order SGD (Malladi et al., 2023) with per-example diffs.

    Update rule (one step, seed s, per-example weights w):
        g = mean_k(w_k · (f_k(θ+εz) − f_k(θ−εz)) / (2ε)),   θ ← θ − lr·(g·z + weight_decay·θ)

    Args:
        params: iterable of tensors or param-group dicts (keys: lr, weight_decay).
        lr: step size η ≥ 0.
        eps: smoothing radius ε > 0, shared by all groups.
        weight_decay: decoupled L2 coefficient ≥ 0.
        perturbation: "gaussian" (z ~ N(0, I)) or "rademacher" (z ∈ {±1}^d).
        seed: base of the seed stream; step t uses ``derive_seed(seed, t)``.
        noise: where z comes from. "auto" (default): ``sazo_lite.noise.TorchNoise`` (the
            plain loop's z bit for bit, chunked and on up to 2 threads; a step ≈ 1.5× instead of
            ≈ 2.1× two forwards on SmolLM2-135M here) when every parameter is on the CPU and they
            hold ≥ ``AUTO_NOISE_MIN_ENTRIES`` entries in all, else the plain loop. None: the
            plain loop below. Or an object with ``apply(jobs)`` that does θ ← shrink·θ + c·z
            for a list of ``sazo_lite.noise.Job`` (see that module).

    Example:
        >>> theta = torch.zeros(3)
        >>> opt = MeZO([theta], lr=0.1, eps=1e-3)
        >>> out = opt.step(lambda: ((theta - 1.0) ** 2).sum(dim=0, keepdim=True))
        >>> out.directional_diffs.shape
        torch.Size([1])
    """

    def __init__(self, params, lr: float, eps: float = 1e-3, *, weight_decay: float = 0.0,
                 perturbation: str = "gaussian", seed: int = 0, noise="auto"):
        lr = _check_finite_number("lr", lr, 0.0, strict=False)
        eps = _check_finite_number("eps", eps, 0.0, strict=True)
        weight_decay = _check_finite_number("weight_decay", weight_decay, 0.0, strict=False)
        if perturbation not in PERTURBATIONS:
            raise ValueError(f"Invalid perturbation: {perturbation!r} (expected one of {PERTURBATIONS})")
        if isinstance(seed, bool) or not isinstance(seed, int):
            raise ValueError(f"Invalid seed: {seed!r} (expected an int)")
        if noise is not None and noise != "auto" and not callable(getattr(noise, "apply", None)):
            raise ValueError(f"Invalid noise: {noise!r} (expected 'auto', None or an object with apply(jobs))")
        defaults = dict(lr=lr, eps=eps, weight_decay=weight_decay, perturbation=perturbation)
        super().__init__(params, defaults)
        self._generators: dict[torch.device, torch.Generator] = {}
        self.noise = _auto_noise(self.param_groups) if noise == "auto" else noise
        self.log = None  # an optional SeedLog that records every step (see sazo_lite.seedlog)
        self.state[self._first_param()].update(step=0, seed=int(seed))

    def add_param_group(self, param_group: dict) -> None:
        for key in ("lr", "weight_decay"):
            if key in param_group:
                param_group[key] = _check_finite_number(key, param_group[key], 0.0, strict=False)
        if self.param_groups:  # one ε for all: d_k must be one number per example
            eps = param_group.get("eps", self.defaults["eps"])
            if eps != self.param_groups[0]["eps"]:
                raise ValueError(f"Invalid eps: {eps} (all param groups must share one eps)")
        super().add_param_group(param_group)

    # -- state ---------------------------------------------------------------------------
    def _first_param(self) -> torch.Tensor:
        return self.param_groups[0]["params"][0]

    @property
    def step_count(self) -> int:
        """Number of completed steps (also the index into the seed stream)."""
        return self.state[self._first_param()]["step"]

    def next_seed(self) -> int:
        """The seed the next step will use."""
        state = self.state[self._first_param()]
        return derive_seed(state["seed"], state["step"])

    def _generator(self, device: torch.device) -> torch.Generator:
        if device not in self._generators:
            self._generators[device] = torch.Generator(device=device)
        return self._generators[device]

    # -- passes over the parameters ------------------------------------------------------
    def _pass(self, seed: int, coefficient: Callable[[dict], float], decay: bool = False) -> None:
        """One pass: θ ← a·θ + c·z for every tensor, z regenerated from (seed, tensor index)."""
        if self.noise is not None:
            self.noise.apply(self._jobs(seed, coefficient, decay))
            return
        index = 0
        for group in self.param_groups:
            c = coefficient(group)
            shrink = 1.0 - group["lr"] * group["weight_decay"] if decay else 1.0
            for p in group["params"]:
                z = draw_direction(p, derive_seed(seed, index), group["perturbation"],
                                   self._generator(p.device))
                if shrink != 1.0:
                    p.mul_(shrink)
                p.add_(z, alpha=c)
                index += 1

    def _jobs(self, seed: int, coefficient, decay: bool) -> list:
        """The pass as a list of ``noise.Job`` (param, seed, c, shrink, perturbation)."""
        from .noise import Job  # noise imports this module

        jobs = []
        for group in self.param_groups:
            c = coefficient(group)
            shrink = 1.0 - group["lr"] * group["weight_decay"] if decay else 1.0
            jobs += [Job(p, derive_seed(seed, len(jobs) + k), c, shrink, group["perturbation"])
                     for k, p in enumerate(group["params"])]
        return jobs

    def _shift(self, seed: int, multiple_of_eps: float) -> None:
        self._pass(seed, lambda group: multiple_of_eps * group["eps"])

    def _restore_and_update(self, seed: int, projected_grad: float) -> None:
        """θ ← (1 − lr·wd)(θ + εz) − lr·g·z in one pass, from θ − εz; counts the step."""
        if self.log is not None:
            self.log.record_step(self, seed, projected_grad)
        eps = self.param_groups[0]["eps"]
        self._pass(seed, lambda group: eps - group["lr"] * (projected_grad + group["weight_decay"] * eps),
                   decay=True)
        self.state[self._first_param()]["step"] += 1

    @torch.no_grad()
    def replay_step(self, seed: int, projected_grad: float) -> None:
        """Repeat a logged step's three passes without evaluating anything (bit-exact replay)."""
        self._shift(seed, +1.0)
        self._shift(seed, -2.0)
        self._restore_and_update(seed, projected_grad)

    @torch.no_grad()
    def replay_failure(self, seed: int, failed_call: int) -> None:
        """Repeat the shifts of a step whose closure failed on call 1 (at θ+εz) or 2 (at θ−εz)."""
        self._shift(seed, +1.0)
        if failed_call == 2:
            self._shift(seed, -2.0)
        self._shift(seed, -1.0 if failed_call == 1 else +1.0)

    def _evaluate(self, closure, seed: int, undo: float) -> torch.Tensor:
        """Call the closure; on an exception or a non-finite loss, shift back, then raise."""
        try:
            losses = closure()
            losses = torch.as_tensor(losses).detach()
            if losses.dim() > 1:
                raise ValueError(f"closure must return a 0-d or 1-D tensor of losses, "
                                 f"got shape {tuple(losses.shape)}")
            if not bool(torch.isfinite(losses).all()):
                raise FloatingPointError("closure returned a non-finite loss; parameters restored")
        except BaseException:
            self._shift(seed, undo)
            if self.log is not None:
                self.log.record_failure(seed, failed_call=1 if undo < 0 else 2)
            raise
        return losses.to("cpu", torch.float64)

    @torch.no_grad()
    def step(self, closure: Callable[[], torch.Tensor], weights: torch.Tensor | None = None) -> ZOStep:
        """Take one ZO step; the closure is called exactly twice (at θ+εz and θ−εz).

        Args:
            closure: returns per-example losses [B] (or a 0-d loss) at the current θ.
            weights: optional importance weights [B]; the objective is mean(weights·losses).

        Returns:
            A ``ZOStep`` with the loss, projected gradient, directional diffs and seed.
        """
        if closure is None:
            raise ValueError("Invalid closure: MeZO.step needs a closure that returns losses")
        weights = self._check_weights(weights)
        if self.log is not None and not getattr(self.noise, "replayable", self.noise is None):
            raise ValueError(f"Invalid noise: SeedLog replays with the plain loop, which cannot "
                             f"reproduce {type(self.noise).__name__}'s directions")
        seed = self.next_seed()
        eps = self.param_groups[0]["eps"]
        self._shift(seed, +1.0)
        plus = self._evaluate(closure, seed, undo=-1.0)
        self._shift(seed, -2.0)
        minus = self._evaluate(closure, seed, undo=+1.0)
        try:
            self._check_shapes(plus, minus, weights)
        except ValueError:
            self._shift(seed, +1.0)
            if self.log is not None:
                self.log.record_failure(seed, failed_call=2)
            raise
        diffs = (plus - minus) / (2.0 * eps)
        g = float((diffs * weights).mean()) if weights is not None else float(diffs.mean())
        self._restore_and_update(seed, g)
        mean_loss = (plus + minus) / 2.0
        loss = float((mean_loss * weights).mean()) if weights is not None else float(mean_loss.mean())
        per_example = plus.dim() == 1
        empty = torch.empty(0, dtype=torch.float64)
        return ZOStep(loss=loss, projected_grad=g, seed=seed,
                      directional_diffs=diffs if per_example else empty,
                      losses=mean_loss if per_example else empty)

    @staticmethod
    def _check_weights(weights) -> torch.Tensor | None:
        if weights is None:
            return None
        weights = torch.as_tensor(weights).detach().to("cpu", torch.float64)
        if weights.dim() != 1:
            raise ValueError(f"Invalid weights: expected a 1-D tensor [B], got shape {tuple(weights.shape)}")
        if not bool(torch.isfinite(weights).all()) or bool((weights < 0).any()):
            raise ValueError("Invalid weights: entries must be finite and non-negative")
        return weights

    @staticmethod
    def _check_shapes(plus, minus, weights) -> None:
        if plus.shape != minus.shape:
            raise ValueError(f"closure returned losses of shape {tuple(plus.shape)} then "
                             f"{tuple(minus.shape)}; both calls must return the same shape")
        if weights is not None and (plus.dim() != 1 or weights.shape != plus.shape):
            raise ValueError(f"Invalid weights: shape {tuple(weights.shape)} does not match "
                             f"the per-example losses' shape {tuple(plus.shape)}")

"""Plain maths and measurements behind notebooks 01–03 (no widgets, no plotting).

01, the two-point estimator with a direction z and radius ε:

    g(z) = (f(θ+εz) − f(θ−εz)) / (2ε),      ĝ = (1/q) Σ_j g(z_j) z_j,      E_z[ĝ] ≈ ∇f(θ)

    error of g against zᵀ∇f:  ≈ (ε²/6)|∇³f[z,z,z]|  (curvature)  +  ≈ u·|f|/ε  (rounding, u = unit round-off)
    E‖ĝ − ∇f‖² / ‖∇f‖² = (d+1)/q for Gaussian z,  (d−1)/q for Rademacher z   (linear f)

02, what a MeZO step costs: passes over the parameters, peak bytes of live tensors, and a
backprop SGD baseline on the same problem.

03, importance-sampled minibatches: B indices i.i.d. from p, weights w = 1/(N p_i), and for
linear f_i (a_i = ∇f_i) the ZO estimate ĝ = z · (1/B) Σ_k w_k zᵀa_{i_k}.
"""
from __future__ import annotations

import contextlib
import math
import time
import weakref

import torch
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_leaves

from .config import one_thread
from . import engine, variance
from .engine import MeZO, derive_seed
from .samplers import UniformSampler
from .train import train

__all__ = ["bowl_loss", "bowl_grad", "random_directions", "two_point_estimates", "zo_gradient",
           "directional_error", "error_vs_eps", "relative_error_theory", "relative_error_monte_carlo",
           "peak_tensor_bytes", "step_memory", "DirectionCounter", "mezo_step_reference", "count_passes",
           "RACE_METHODS", "race_mezo_sgd", "path_point", "sample_minibatches", "minibatch_zo_estimates",
           "weighted_loss_estimates", "gain_vs_batch"]



def _check_positive(name: str, value) -> None:
    if not (isinstance(value, (int, float)) and math.isfinite(value) and value > 0):
        raise ValueError(f"Invalid {name}: {value!r} (expected a finite number > 0)")


# -- 01: a toy function with exact gradients ------------------------------------------------
def bowl_loss(theta: torch.Tensor, curvatures, quartic: float = 0.0, offset: float = 0.0) -> torch.Tensor:
    """f(θ) = Σ_j (a_j/2) θ_j² + (κ/4) Σ_j θ_j⁴ + c, for θ of shape [..., d] → [...].

    κ = 0 gives a quadratic, for which the central difference has no curvature error at all;
    κ > 0 adds a third derivative (6κθ_j) and so an O(ε²) bias. The offset c only adds
    rounding error (a large |f| loses low bits), as a large loss does in a real model.

    Example:
        >>> float(bowl_loss(torch.tensor([1.0, 2.0]), [1.0, 1.0]))
        2.5
    """
    a = torch.as_tensor(curvatures, dtype=theta.dtype)
    return (0.5 * a * theta ** 2 + 0.25 * quartic * theta ** 4).sum(-1) + offset


def bowl_grad(theta: torch.Tensor, curvatures, quartic: float = 0.0) -> torch.Tensor:
    """∇f(θ) = a ⊙ θ + κ θ³ for ``bowl_loss`` (same shape as θ)."""
    a = torch.as_tensor(curvatures, dtype=theta.dtype)
    return a * theta + quartic * theta ** 3


def random_directions(num: int, dim: int, *, seed: int = 0, perturbation: str = "gaussian",
                      dtype: torch.dtype = torch.float64) -> torch.Tensor:
    """q directions z_j as rows [q, d]: N(0, I) or Rademacher ±1, reproducible from ``seed``."""
    if perturbation not in engine.PERTURBATIONS:
        raise ValueError(f"Invalid perturbation: {perturbation!r} (expected one of {engine.PERTURBATIONS})")
    g = torch.Generator().manual_seed(seed)
    if perturbation == "gaussian":
        return torch.randn(num, dim, generator=g, dtype=dtype)
    return torch.randint(0, 2, (num, dim), generator=g).to(dtype) * 2 - 1


def two_point_estimates(fn, theta: torch.Tensor, directions: torch.Tensor, eps: float):
    """Projected gradients g_j and estimates g_j z_j for q directions, in θ's dtype.

    Args:
        fn: maps points [q, d] to values [q] (e.g. ``bowl_loss``), evaluated in θ's dtype.
        theta: the point, [d].
        directions: z_j as rows, [q, d].
        eps: smoothing radius ε > 0.

    Returns:
        (g [q], g_j z_j [q, d]); their mean over q is ĝ.
    """
    _check_positive("eps", eps)
    z = directions.to(theta.dtype)
    g = (fn(theta + eps * z) - fn(theta - eps * z)) / (2 * eps)  # [q]
    return g, g[:, None] * z


def zo_gradient(fn, theta: torch.Tensor, eps: float, num_directions: int, *, seed: int = 0,
                perturbation: str = "gaussian") -> torch.Tensor:
    """ĝ = (1/q) Σ_j g(z_j) z_j: the averaged two-point estimate of ∇f(θ), shape [d].

    Example:
        >>> theta = torch.tensor([1.0, -2.0], dtype=torch.float64)
        >>> est = zo_gradient(lambda x: bowl_loss(x, [1.0, 3.0]), theta, 1e-4, 20000)
        >>> bool((est - torch.tensor([1.0, -6.0], dtype=torch.float64)).abs().max() < 0.2)
        True
    """
    z = random_directions(num_directions, theta.numel(), seed=seed, perturbation=perturbation)
    return two_point_estimates(fn, theta, z, eps)[1].mean(0)


def directional_error(fn, grad: torch.Tensor, theta: torch.Tensor, directions: torch.Tensor,
                      eps: float) -> float:
    """Mean over directions of |g(z) − zᵀ∇f| / |zᵀ∇f|: the relative error of one finite difference.

    ``grad`` is the exact ∇f(θ) (computed in float64); g(z) is computed in θ's dtype.
    """
    g, _ = two_point_estimates(fn, theta, directions, eps)
    exact = directions.double() @ grad.double()
    return float(((g.double() - exact).abs() / exact.abs().clamp_min(1e-300)).mean())


def error_vs_eps(fn, grad: torch.Tensor, theta: torch.Tensor, eps_grid, *,
                 dtype: torch.dtype = torch.float32, num_directions: int = 8, seed: int = 0) -> torch.Tensor:
    """The U-shaped curve: ``directional_error`` at each ε of ``eps_grid``, θ cast to ``dtype``.

    Large ε: curvature error ∝ ε². Tiny ε: θ ± εz and f round to the same float, error ∝ u/ε.
    Returns a float64 tensor [len(eps_grid)].
    """
    z = random_directions(num_directions, theta.numel(), seed=seed)
    theta = theta.to(dtype)
    return torch.tensor([directional_error(fn, grad, theta, z, float(e)) for e in eps_grid],
                        dtype=torch.float64)


def relative_error_theory(dim: int, num_directions: int, perturbation: str = "gaussian") -> float:
    """E‖ĝ − a‖²/‖a‖² for linear f with gradient a: (d+1)/q (Gaussian), (d−1)/q (Rademacher).

    From E‖z zᵀa‖² = (d+2)‖a‖² for Gaussian z and d‖a‖² for Rademacher z.
    """
    if perturbation not in engine.PERTURBATIONS:
        raise ValueError(f"Invalid perturbation: {perturbation!r} (expected one of {engine.PERTURBATIONS})")
    return (dim + 1 if perturbation == "gaussian" else dim - 1) / num_directions


def relative_error_monte_carlo(dim: int, num_directions: int, *, trials: int = 200, seed: int = 0,
                               perturbation: str = "gaussian") -> float:
    """Monte-Carlo E‖ĝ − a‖²/‖a‖² with ĝ = (1/q) Σ_j z_j z_jᵀa (exact ZO for linear f)."""
    g = torch.Generator().manual_seed(seed)
    a = torch.randn(dim, generator=g, dtype=torch.float64)
    z = random_directions(trials * num_directions, dim, seed=derive_seed(seed, dim, num_directions),
                          perturbation=perturbation).view(trials, num_directions, dim)
    estimates = ((z @ a)[..., None] * z).mean(1)  # [trials, d]
    return float(((estimates - a) ** 2).sum(1).mean() / (a @ a))


# -- 02: what a MeZO step costs --------------------------------------------------------------
class _PeakTracker(TorchDispatchMode):
    """Counts bytes of tensor storages created inside the mode while they are alive."""

    def __init__(self):
        super().__init__()
        self.live, self.peak, self._seen = 0, 0, set()

    def _free(self, key: int, nbytes: int) -> None:
        self._seen.discard(key)
        self.live -= nbytes

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        inputs = {t.untyped_storage().data_ptr() for t in tree_leaves((args, kwargs))
                  if isinstance(t, torch.Tensor)}  # views and in-place results allocate nothing
        for t in tree_leaves(out):
            if isinstance(t, torch.Tensor):
                storage = t.untyped_storage()
                key, nbytes = storage.data_ptr(), storage.nbytes()
                if nbytes and key not in inputs and key not in self._seen:
                    self._seen.add(key)
                    self.live += nbytes
                    weakref.finalize(storage, self._free, key, nbytes)
        self.peak = max(self.peak, self.live)
        return out


def peak_tensor_bytes(fn):
    """Run ``fn()`` and measure the peak bytes of tensors it allocated that were alive together.

    Tensors that existed before (parameters, inputs) are not counted, nor are views and
    in-place updates of them; gradients that stay alive afterwards are. So for a model:
    inference ≈ the largest pair of activations, backprop ≈ all saved activations + grads.

    Returns:
        (fn's return value, peak bytes as an int).
    """
    tracker = _PeakTracker()
    with tracker:
        result = fn()
    return result, tracker.peak


class DirectionCounter(contextlib.AbstractContextManager):
    """Counts calls to ``sazo_lite.engine.draw_direction`` (one per tensor per pass) while active.

    Counts MeZO's plain loop (``noise=None``, the default); a custom ``noise`` source bypasses it.

    Attributes:
        calls: number of directions drawn; passes = calls / number of parameter tensors.
        largest_bytes: bytes of the largest z drawn (MeZO's only parameter-sized temporary).

    Example:
        >>> theta = torch.zeros(4)
        >>> with DirectionCounter() as counter:
        ...     _ = MeZO([theta], lr=0.1).step(lambda: (theta ** 2).sum())
        >>> counter.calls
        3
    """

    def __enter__(self):
        self.calls, self.largest_bytes = 0, 0
        self._original = engine.draw_direction

        def counting(like, seed, perturbation, generator):
            z = self._original(like, seed, perturbation, generator)
            self.calls += 1
            self.largest_bytes = max(self.largest_bytes, z.numel() * z.element_size())
            return z

        engine.draw_direction = counting  # MeZO._pass looks the name up in engine at call time
        return self

    def __exit__(self, *exc):
        engine.draw_direction = self._original
        return False


@torch.no_grad()
def mezo_step_reference(params: list[torch.Tensor], closure, eps: float, lr: float, seed: int) -> float:
    """The textbook MeZO step in four passes (reference for ``MeZO.step``):

        θ += εz;  L+ = f(θ);  θ −= 2εz;  L− = f(θ);  θ += εz;  θ −= η g z,   g = (L+ − L−)/(2ε)

    z for tensor k is regenerated from ``derive_seed(seed, k)`` exactly as ``MeZO`` does, so the
    result matches ``MeZO.step`` with step seed ``seed`` (up to rounding). Returns g.
    """
    def shift(coefficient: float) -> None:
        generator = torch.Generator()
        for index, p in enumerate(params):
            p.add_(engine.draw_direction(p, derive_seed(seed, index), "gaussian", generator), alpha=coefficient)

    shift(+eps)
    plus = float(torch.as_tensor(closure()).double().mean())
    shift(-2 * eps)
    minus = float(torch.as_tensor(closure()).double().mean())
    g = (plus - minus) / (2 * eps)
    shift(+eps)   # restore θ ...
    shift(-lr * g)  # ... then update: a fourth pass that MeZO fuses into the third
    return g


def count_passes(step_fn, num_tensors: int) -> float:
    """Passes over the parameters made by ``step_fn()``: directions drawn / tensors."""
    with DirectionCounter() as counter:
        step_fn()
    return counter.calls / num_tensors


def step_memory(model: torch.nn.Module, inputs: torch.Tensor, targets: torch.Tensor, loss_fn, *,
                eps: float = 1e-3, lr: float = 1e-4) -> dict[str, int]:
    """Peak bytes of live tensors (``peak_tensor_bytes``) for one forward pass and one training step.

    The steps really update ``model`` (with a small lr): pass a throw-away copy if that matters.

    Returns:
        {"parameters": bytes of all parameters, "largest tensor": bytes of the largest one,
         "inference": peak of a no-grad forward, "MeZO step": peak of ``MeZO.step``,
         "backprop step": peak of forward + backward + SGD update (gradients included)}.
    """
    params = [p for p in model.parameters() if p.requires_grad]
    loss = lambda: loss_fn(model(inputs), targets)

    def inference():
        with torch.no_grad():
            return loss()

    def backprop():
        model.zero_grad(set_to_none=True)
        loss().backward()
        with torch.no_grad():
            for p in params:
                p -= lr * p.grad
        model.zero_grad(set_to_none=True)

    optimizer = MeZO(params, lr=lr, eps=eps)
    sizes = [p.numel() * p.element_size() for p in params]
    return {"parameters": sum(sizes), "largest tensor": max(sizes),
            "inference": peak_tensor_bytes(inference)[1],
            "MeZO step": peak_tensor_bytes(lambda: optimizer.step(loss))[1],
            "backprop step": peak_tensor_bytes(backprop)[1]}


def _timed_gap(problem, theta: torch.Tensor, clock: dict) -> float:
    """Optimality gap for the log; evaluation time is excluded from the training clock."""
    start = time.perf_counter()
    gap = problem.full_loss(theta) - clock["optimal"]
    clock["eval"] += time.perf_counter() - start
    clock["seconds"].append(start - clock["start"] - clock["eval_before"])
    clock["eval_before"] = clock["eval"]
    return gap


def _new_clock(problem) -> dict:
    return dict(optimal=problem.optimal_loss, start=time.perf_counter(), eval=0.0, eval_before=0.0, seconds=[])


def _run_mezo(problem, steps, batch_size, lr, eps, seed, log_every, dtype) -> dict:
    theta = problem.initial_theta(dtype)
    optimizer = MeZO([theta], lr=lr, eps=eps, seed=seed)
    sampler = UniformSampler(problem.num_examples, seed=seed)
    clock = _new_clock(problem)
    history = train(optimizer, sampler, lambda idx: problem.losses(theta, idx), steps, batch_size=batch_size,
                    evaluate=lambda: _timed_gap(problem, theta, clock), log_every=log_every, progress=False)
    return dict(queries=history.logged_queries, seconds=clock["seconds"], gap=history.metrics)


def _run_sgd(problem, steps, batch_size, lr, seed, log_every, dtype) -> dict:
    theta = problem.initial_theta(dtype).requires_grad_(True)
    sampler = UniformSampler(problem.num_examples, seed=seed)
    clock, queries, gaps = _new_clock(problem), [], []
    for step in range(1, steps + 1):
        indices, _ = sampler.sample(batch_size)
        loss = problem.losses(theta, indices).mean()
        (grad,) = torch.autograd.grad(loss, theta)
        with torch.no_grad():
            theta -= lr * grad
        if step % log_every == 0 or step == steps:
            queries.append(step * batch_size)  # one forward+backward per example
            gaps.append(_timed_gap(problem, theta.detach(), clock))
    return dict(queries=queries, seconds=clock["seconds"], gap=gaps)


RACE_METHODS = ("MeZO", "SGD (backprop)")


def race_mezo_sgd(problem, *, steps: int = 300, batch_size: int = 16, lr_zo: float = 0.02,
                  lr_sgd: float = 0.5, eps: float = 1e-3, seed: int = 0, log_every: int = 10,
                  dtype: torch.dtype = torch.float32, methods=RACE_METHODS) -> dict[str, dict[str, list]]:
    """Train ``problem`` from θ₀ with MeZO and with backprop SGD (same B, uniform minibatches).

    Queries: MeZO costs 2B per-example forward evaluations per step; SGD costs B per-example
    forward+backward evaluations (a backward pass costs about two forwards). ``seconds`` is
    training wall-clock time on one thread, excluding the logging evaluations.

    Args:
        methods: which of ``RACE_METHODS`` to run (default both).

    Returns:
        {"MeZO": {...}, "SGD (backprop)": {...}}, each with lists ``queries``, ``seconds``, ``gap``
        (F(θ) − F(θ*)) at every ``log_every`` steps.
    """
    for name, value in (("steps", steps), ("batch_size", batch_size), ("log_every", log_every)):
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise ValueError(f"Invalid {name}: {value!r} (expected an int >= 1)")
    if not set(methods) <= set(RACE_METHODS):
        raise ValueError(f"Invalid methods: {methods!r} (expected a subset of {RACE_METHODS})")
    runs = {}
    with one_thread():  # fair, stable timings on a shared machine (see ``one_thread``)
        if "MeZO" in methods:
            runs["MeZO"] = _run_mezo(problem, steps, batch_size, lr_zo, eps, seed, log_every, dtype)
        if "SGD (backprop)" in methods:
            runs["SGD (backprop)"] = _run_sgd(problem, steps, batch_size, lr_sgd, seed, log_every, dtype)
    return runs


# -- 03: importance-sampled minibatches -------------------------------------------------------
def path_point(problem, progress: float) -> torch.Tensor:
    """θ_t = θ₀ + t(θ* − θ₀): a stand-in for "how far training has got" (t = 0 start, 1 optimum)."""
    if not 0.0 <= progress <= 1.0:
        raise ValueError(f"Invalid progress: {progress} (expected a number in [0, 1])")
    theta0 = problem.initial_theta()
    return theta0 + progress * (problem.optimum - theta0)


def sample_minibatches(probs, batch_size: int, trials: int, *, seed: int = 0):
    """``trials`` minibatches of B indices i.i.d. from p, with weights w = 1/(N p_i).

    Returns:
        (indices Long [trials, B], weights float64 [trials, B]).
    """
    probs = torch.as_tensor(probs, dtype=torch.float64)
    g = torch.Generator().manual_seed(seed)
    indices = torch.multinomial(probs, trials * batch_size, replacement=True, generator=g)
    indices = indices.view(trials, batch_size)
    return indices, 1.0 / (len(probs) * probs[indices])


def minibatch_zo_estimates(per_example_grads: torch.Tensor, probs, batch_size: int, trials: int, *,
                           seed: int = 0) -> torch.Tensor:
    """Monte-Carlo draws of ĝ = z · (1/B) Σ_k w_k zᵀa_{i_k}, one Gaussian z per draw, [trials, d].

    Exact MeZO estimates for linear f_i (a_i = ∇f_i); E[ĝ] = ∇F and, by
    ``variance.zo_second_moment``, E‖ĝ‖² = (d+2)[V(p)/B + (1 − 1/B)‖∇F‖²].
    """
    indices, weights = sample_minibatches(probs, batch_size, trials, seed=seed)
    a = per_example_grads.double()
    g = torch.Generator().manual_seed(derive_seed(seed, 1))
    z = torch.randn(trials, a.shape[1], generator=g, dtype=torch.float64)
    diffs = torch.einsum("tbd,td->tb", a[indices], z)  # d_k = zᵀa_{i_k}, [trials, B]
    projected = (weights * diffs).mean(1)               # g = (1/B) Σ_k w_k d_k, [trials]
    return projected[:, None] * z


def weighted_loss_estimates(losses, probs, batch_size: int, trials: int, *, seed: int = 0,
                            weighted: bool = True) -> torch.Tensor:
    """Minibatch estimates F̂ = (1/B) Σ_k w_k f_{i_k} of F = mean(f), [trials].

    With the weights, E[F̂] = F for any p with full support; without them (w = 1) the mean
    is Σ_i p_i f_i, which is biased unless p is uniform.
    """
    losses = torch.as_tensor(losses, dtype=torch.float64)
    indices, weights = sample_minibatches(probs, batch_size, trials, seed=seed)
    values = losses[indices]
    return (weights * values if weighted else values).mean(1)


def gain_vs_batch(norms, full_grad_norm: float, dim: int, batch_sizes) -> torch.Tensor:
    """E‖ĝ‖² under uniform sampling divided by E‖ĝ‖² under the oracle p*, for each B.

    = (V(u)/B + (1−1/B)‖∇F‖²) / (V(p*)/B + (1−1/B)‖∇F‖²): 1 + CV² at B = 1 or ‖∇F‖ = 0,
    shrinking towards 1 as B grows. Returns float64 [len(batch_sizes)].
    """
    norms = torch.as_tensor(norms, dtype=torch.float64)
    uniform = torch.full_like(norms, 1.0 / len(norms))
    oracle = variance.oracle_probs(norms)
    return torch.tensor([variance.zo_second_moment(norms, uniform, full_grad_norm, dim, int(b))
                         / variance.zo_second_moment(norms, oracle, full_grad_norm, dim, int(b))
                         for b in batch_sizes], dtype=torch.float64)

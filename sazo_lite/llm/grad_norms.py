"""True per-example gradient norms ‖∇f_i(θ)‖ by backprop: the yardstick for SAZO's estimates.

ZO training never has these; benchmarks and notebooks compute them to measure what SAZO
approximates: V(u)/V(p*) of a data set, the oracle sampler p* ∝ ‖∇f_i‖, Spearman ρ between
SAZO's scores and the true norms, TV(p_SAZO, p*), V(p_SAZO)/V(p*).

Two ways, same numbers (checked against each other and against ``torch.func`` in tests):

* ``loop_grad_norms``: one backward per example, ``torch.autograd.grad`` of f_i. Works for any
  parameters; costs N backward passes.
* ``linear_grad_norms``: one batched forward + backward per chunk. Every tuned tensor must be
  the weight (or bias) of an ``nn.Linear`` (LoRA adapters are: peft's ``lora_A``/``lora_B``).
  For y = x Wᵀ applied at positions t of example i, ∇_W f_i = Σ_t (∂f_i/∂y_{i,t}) x_{i,t}ᵀ, so
  hooks that keep each module's input x [B, T, d_in] and output gradient g [B, T, d_out] give
  every example's own gradient from the backward of Σ_i f_i (examples do not interact: eval
  mode, attention masked per row). A tensor used by several modules sums their parts.

``grad_norms(model, batch, params)`` picks the batched way when it applies, else the loop.
``RefreshingNorms`` wraps it as the ``norms_fn`` of ``sazo_lite.OracleSampler``: recomputed
every ``every`` optimiser steps, cached in between.

Example:
    >>> net = torch.nn.Sequential(torch.nn.Linear(3, 4), torch.nn.Tanh(), torch.nn.Linear(4, 1))
    >>> x, y = torch.randn(5, 3), torch.randn(5)
    >>> losses = lambda idx: (net(x[idx]).squeeze(-1) - y[idx]) ** 2
    >>> a = loop_grad_norms(losses, list(net.parameters()), range(5))
    >>> b = linear_grad_norms(net, losses, list(net.parameters()), range(5))
    >>> bool(torch.allclose(a, b, rtol=1e-4))
    True
"""
from __future__ import annotations

from typing import Callable

import torch

from .losses import TokenBatch, answer_losses, classification_losses

__all__ = ["loop_grad_norms", "linear_grad_norms", "grad_norms", "example_losses", "RefreshingNorms",
           "linear_modules_for"]

LOSSES = {"classification": classification_losses, "answer": answer_losses}


def example_losses(model, batch: TokenBatch, loss: str = "classification") -> Callable:
    """``indices → per-example losses [B]`` with the autograd graph kept (for backprop norms)."""
    if loss not in LOSSES:
        raise ValueError(f"Invalid loss: {loss!r} (expected one of {sorted(LOSSES)})")
    fn = LOSSES[loss]
    return lambda indices: fn(model, batch, [int(i) for i in indices], grad=True)


def loop_grad_norms(losses: Callable, params, indices) -> torch.Tensor:
    """‖∇f_i‖ for each index, one backward per example: float64 [len(indices)] (reference)."""
    params = list(params)
    out = []
    for i in indices:
        value = losses([int(i)]).sum()
        grads = torch.autograd.grad(value, params, allow_unused=True)
        out.append(sum(float(g.double().pow(2).sum()) for g in grads if g is not None) ** 0.5)
    return torch.tensor(out, dtype=torch.float64)


def linear_modules_for(model, params) -> dict[int, list[torch.nn.Linear]] | None:
    """For each tuned tensor (by id), the ``nn.Linear`` modules it is the weight or bias of.

    None when some tensor belongs to no Linear (then only the loop applies).
    """
    wanted = {id(p) for p in params}
    owners: dict[int, list] = {i: [] for i in wanted}
    for module in model.modules():
        if isinstance(module, torch.nn.Linear):
            for tensor in (module.weight, module.bias):
                if tensor is not None and id(tensor) in wanted:
                    owners[id(tensor)].append(module)
    return owners if all(owners.values()) else None


def linear_grad_norms(model, losses: Callable, params, indices, *, chunk: int = 16) -> torch.Tensor:
    """‖∇f_i‖ from one batched backward per chunk (tuned tensors: Linear weights/biases only).

    Args:
        model: the module that contains the Linear layers.
        losses: ``indices → per-example losses [B]`` with the graph kept.
        params: the tuned tensors.
        indices: the examples to measure.
        chunk: examples per backward (memory grows with it).

    Returns:
        float64 [len(indices)].
    """
    params = list(params)
    owners = linear_modules_for(model, params)
    if owners is None:
        raise ValueError("Invalid params: every tensor must be the weight or bias of an nn.Linear "
                         "(use loop_grad_norms otherwise)")
    modules = {id(m): m for ms in owners.values() for m in ms}
    tuned = {id(p) for p in params}
    indices = [int(i) for i in indices]
    out = []
    for start in range(0, len(indices), chunk):
        part = indices[start:start + chunk]
        inputs: dict[int, torch.Tensor] = {}
        grads: dict[int, torch.Tensor] = {}
        handles = []
        def keep(key):
            def forward_hook(module, args, output):   # x now; ∂(Σf)/∂y once backward reaches y
                inputs[key] = args[0].detach()
                output.register_hook(lambda grad: grads.__setitem__(key, grad.detach()))
            return forward_hook

        for key, module in modules.items():
            handles.append(module.register_forward_hook(keep(key)))
        try:
            value = losses(part).sum()      # Σ_i f_i: row i of every output gradient is ∂f_i/∂y_i
            # backward through the graph only (parameter .grad untouched): grads w.r.t. the tuned tensors
            torch.autograd.grad(value, params, allow_unused=True)
        finally:
            for handle in handles:
                handle.remove()
        per_example: dict[int, torch.Tensor] = {}   # id(tensor) → [B, *tensor.shape] summed over modules
        for key, module in modules.items():
            x = inputs[key].double().reshape(len(part), -1, module.in_features)      # [B, T, d_in]
            g = grads[key].double().reshape(len(part), -1, module.out_features)     # [B, T, d_out]
            if id(module.weight) in tuned:
                gw = torch.einsum("bto,bti->boi", g, x)                             # [B, d_out, d_in]
                per_example[id(module.weight)] = per_example.get(id(module.weight), 0) + gw
            if module.bias is not None and id(module.bias) in tuned:
                per_example[id(module.bias)] = per_example.get(id(module.bias), 0) + g.sum(1)
        squared = sum(t.reshape(len(part), -1).pow(2).sum(1) for t in per_example.values())
        out.append(squared.sqrt())
    return torch.cat(out) if out else torch.zeros(0, dtype=torch.float64)


def grad_norms(model, batch: TokenBatch, params, *, loss: str = "classification", indices=None,
               method: str = "auto", chunk: int = 16) -> torch.Tensor:
    """True per-example gradient norms ‖∇_θ f_i‖ over the tuned tensors: float64 [N] on the CPU.

    Args:
        model: a causal LM (eval mode; dropout would make f_i random).
        batch: the examples (``TokenBatch``).
        params: the tuned tensors (e.g. ``trainable_parameters(lora_model)``).
        loss: "classification" (verbalisers) or "answer" (answer-token CE).
        indices: which examples (default all).
        method: "auto" (batched hooks when every tensor is a Linear's weight/bias, else loop),
            "linear" or "loop".
        chunk: examples per batched backward.
    """
    if method not in ("auto", "linear", "loop"):
        raise ValueError(f"Invalid method: {method!r} (expected 'auto', 'linear' or 'loop')")
    params = list(params)
    indices = range(len(batch)) if indices is None else indices
    losses = example_losses(model, batch, loss)
    if method == "loop" or (method == "auto" and linear_modules_for(model, params) is None):
        return loop_grad_norms(losses, params, indices)
    return linear_grad_norms(model, losses, params, indices, chunk=chunk)


class RefreshingNorms:
    """A ``norms_fn`` for ``OracleSampler``: true norms recomputed every ``every`` steps, cached between.

    ``clock()`` says the current step (e.g. ``lambda: optimizer.step_count``); the norms are
    recomputed when it has advanced by ≥ ``every`` since the last refresh (and on first use), so
    reading ``sampler.probs`` for logging does not trigger extra backprop.

    Example:
        >>> calls, step = [], [0]
        >>> norms = RefreshingNorms(lambda: calls.append(1) or torch.ones(3), every=5, clock=lambda: step[0])
        >>> _ = norms(); step[0] = 4; _ = norms(); step[0] = 5; _ = norms()
        >>> len(calls), norms.refreshes
        (2, 2)
    """

    def __init__(self, compute: Callable[[], torch.Tensor], *, every: int, clock: Callable[[], int]):
        if isinstance(every, bool) or not isinstance(every, int) or every < 1:
            raise ValueError(f"Invalid every: {every!r} (expected an int >= 1)")
        self.compute, self.every, self.clock = compute, every, clock
        self.norms: torch.Tensor | None = None
        self.refreshed_at: int | None = None
        self.refreshes = 0

    def __call__(self) -> torch.Tensor:
        now = int(self.clock())
        if self.norms is None or now - self.refreshed_at >= self.every:
            self.norms = torch.as_tensor(self.compute()).detach().to("cpu", torch.float64)
            self.refreshed_at, self.refreshes = now, self.refreshes + 1
        return self.norms

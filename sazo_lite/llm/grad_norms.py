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

* ``vmap_grad_norms``: ``torch.func.vmap`` of ``torch.func.grad`` of one example's classification
  loss, for any parameters, when the examples have no padding (an attention mask makes the
  model's forward branch on data, which ``vmap`` cannot follow); chunked so that the per-example
  gradients held at once stay within ``VMAP_BYTES``.

``grad_norms(model, batch, params)`` picks the batched way when it applies, then ``vmap`` (falling
back to the loop for a model whose forward ``vmap`` cannot trace, e.g. GPT-2's), else the loop.
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

import warnings
from typing import Callable

import torch

from ..engine import _check_disjoint
from ..validation import check_count, check_number, check_seed
from .losses import (TokenBatch, _check_vocabulary, answer_losses, at_least_float32, check_deterministic,
                     check_labelled, checked_indices, classification_losses)

__all__ = ["loop_grad_norms", "linear_grad_norms", "vmap_grad_norms", "grad_norms", "example_losses", "RefreshingNorms",
           "linear_modules_for", "full_gradient_norm", "directional_error"]

LOSSES = {"classification": classification_losses, "answer": answer_losses}


def example_losses(model, batch: TokenBatch, loss: str = "classification") -> Callable:
    """``indices → per-example losses [B]`` with the autograd graph kept (for backprop norms)."""
    if loss not in LOSSES:
        raise ValueError(f"Invalid loss: {loss!r} (expected one of {sorted(LOSSES)})")
    fn = LOSSES[loss]
    return lambda indices: fn(model, batch, indices, grad=True)     # checked there: int(1.5) scored example 1


def _differentiable(params) -> list[torch.Tensor]:
    """``params`` as a list, refused (ValueError) when empty, holding a tensor autograd cannot differentiate
    by (torch's RuntimeError "`inputs` argument to `grad()` cannot be empty", "One of the differentiated
    Tensors does not require grad" came from inside the first backward), or holding one tensor twice or two
    that share memory (``engine._check_disjoint``: the loop and ``full_gradient_norm`` counted its gradient
    twice, the batched hooks and ``vmap`` once, and ``directional_error`` moved it by 2εz)."""
    params = list(params)
    if not params:
        raise ValueError("Invalid params: no tensors (expected the tuned tensors, e.g. trainable_parameters(model))")
    frozen = [k for k, p in enumerate(params) if not (isinstance(p, torch.Tensor) and p.requires_grad)]
    if frozen:
        raise ValueError(f"Invalid params: {len(frozen)} of {len(params)} (e.g. params[{frozen[0]}]) are not tensors "
                         "that require grad; backprop gives them no gradient (call requires_grad_(True) on them)")
    _check_disjoint(params)
    return params


def loop_grad_norms(losses: Callable, params, indices) -> torch.Tensor:
    """‖∇f_i‖ for each index, one backward per example: float64 [len(indices)] (reference)."""
    params = _differentiable(params)
    out = []
    for i in _checked(indices, None):     # 1.5 and True were read as example 1, -1 as the last
        grads = _grads(losses([i]).sum(), params)
        out.append(sum(float(g.double().pow(2).sum()) for g in grads if g is not None) ** 0.5)
    return torch.tensor(out, dtype=torch.float64)


def _grads(value: torch.Tensor, params) -> tuple:
    """∂value/∂params (parameter ``.grad`` untouched), or a ValueError where the loss does not depend on
    any of them (merged or disabled LoRA adapters, tensors the forward never reads, no grad enabled)."""
    if not value.requires_grad:
        raise ValueError("Invalid params: the losses do not depend on them (merged or disabled adapters, "
                         "frozen tensors, or tensors the forward does not use?)")
    return torch.autograd.grad(value, params, allow_unused=True)


def linear_modules_for(model, params, *, subclasses: bool = False) -> dict[int, list[torch.nn.Linear]] | None:
    """For each tuned tensor (by id), the ``nn.Linear`` modules it is the weight or bias of.

    None when some tensor belongs to no Linear, or is also a parameter of another module (a head tied
    to the embedding: the hooks would see the head's part of its gradient only), or of a Linear subclass with
    a forward of its own (Llama 4's router returns a tuple; y = x Wᵀ + b, which the hooks assume, need not
    hold); then only the loop applies. ``subclasses=True`` counts those subclasses as Linears too: for
    ``linear_grad_norms``, which checks each call's output against x Wᵀ + b (Falcon's ``FalconLinear``
    computes exactly that).
    """
    wanted = {id(p) for p in params}
    owners: dict[int, list] = {i: [] for i in wanted}
    for module in model.modules():
        linear = isinstance(module, torch.nn.Linear) and (subclasses or _plain_linear(module))
        for name, tensor in module.named_parameters(recurse=False):
            if id(tensor) in wanted:
                if not (linear and name in ("weight", "bias")):
                    return None
                owners[id(tensor)].append(module)
    return owners if all(owners.values()) else None


def _plain_linear(module) -> bool:
    return type(module).forward is torch.nn.Linear.forward


def _computes_linear(module: torch.nn.Linear, x: torch.Tensor, output) -> bool:
    """Whether a Linear subclass's output for input x is x Wᵀ + b (to a few ulps of its dtype), the map
    whose gradient the hooks split."""
    if not isinstance(output, torch.Tensor) or output.shape[:-1] != x.shape[:-1]:
        return False
    with torch.no_grad():
        expected = torch.nn.functional.linear(x, module.weight, module.bias)
        scale = torch.nn.functional.linear(x.abs(), module.weight.abs(), None if module.bias is None else
                                           module.bias.abs())          # |x| |W|ᵀ + |b|: the rounding's scale
    tolerance = 16 * torch.finfo(expected.dtype).eps if expected.is_floating_point() else 0.0
    return output.shape == expected.shape and bool(((output - expected).abs() <= tolerance * scale).all())


class _HooksCannotSplit(ValueError):
    """The batched hooks cannot tell the examples apart (a Linear run twice in one forward, or fed rows not
    laid out batch-major): ``linear_grad_norms`` raises it, the "auto" paths fall back to the exact loop."""


def _batch_major(x: torch.Tensor, g: torch.Tensor, count: int) -> bool | None:
    """Whether a Linear's input x [..., d_in] and output gradient g [..., d_out] are laid out batch-major
    for ``count`` examples: True when x is [B, T, ..., d_in] with B = count ≠ T (the decoder's layout), False
    when its rows cannot be split into ``count`` equal groups, None when they can but the grouping is not known
    to be the examples' (x [B, d_in], tokens flattened [B·T, d_in], rows regrouped, e.g. by an MoE router, or
    [count, count, ...]: batch-first [B, T] and sequence-first [T, B] rows look alike when T = B)."""
    if count == 1:
        return True                                       # one example: every row is its own
    if x.shape[:-1] != g.shape[:-1] or x.dim() < 2 or x.shape[0] % count:
        return False
    # a Linear fed sequence-first rows [T, B, d] (ChatGLM's layout) with T = B was split by position, not by example
    return True if x.dim() >= 3 and x.shape[0] == count != x.shape[1] else None


def linear_grad_norms(model, losses: Callable, params, indices, *, chunk: int = 16) -> torch.Tensor:
    """‖∇f_i‖ from one batched backward per chunk (tuned tensors: Linear weights/biases only).

    Each Linear's input x and output gradient g are split into the examples along their first dimension,
    which must be the batch. Where the layout does not say so (2-D rows, tokens flattened to [B·T, d], rows
    regrouped by an MoE router), a second backward of Σ_i c_i f_i with distinct weights c_i checks the split
    (Σ_i c_i ∇f_i must match it). Every split must add up to the backward's own Σ_i ∇f_i (a weight also read
    outside its Linear's forward has a part no hook sees). Rows that cannot be split, a split that fails
    either check, a Linear run twice in one forward, or a Linear subclass whose output is not x Wᵀ + b
    (checked at each call) raise ValueError (``grad_norms``' "auto" then takes the exact loop).

    Args:
        model: the module that contains the Linear layers.
        losses: ``indices → per-example losses [B]`` with the graph kept.
        params: the tuned tensors.
        indices: the examples to measure.
        chunk: examples per backward (memory grows with it).

    Returns:
        float64 [len(indices)].
    """
    params = _differentiable(params)
    chunk = check_count("chunk", chunk)
    owners = linear_modules_for(model, params, subclasses=True)      # a subclass's output is checked at each call
    if owners is None:
        raise ValueError("Invalid params: every tensor must be the weight or bias of an nn.Linear "
                         "(use loop_grad_norms otherwise)")
    modules = {id(m): m for ms in owners.values() for m in ms}
    tuned = {id(p) for p in params}
    indices = _checked(indices, None)      # 1.5 and True were read as example 1, -1 as the last
    out = []
    for start in range(0, len(indices), chunk):
        part = indices[start:start + chunk]
        inputs: dict[int, torch.Tensor] = {}
        grads: dict[int, torch.Tensor] = {}
        handles = []
        def keep(key):
            def forward_hook(module, args, output):   # x now; ∂(Σf)/∂y once backward reaches y
                if key in inputs:                     # a second call would replace the first call's x and g
                    raise _HooksCannotSplit("Invalid params: a Linear that owns them runs twice in one forward "
                                            "(use loop_grad_norms)")
                if not _plain_linear(module) and not (args and _computes_linear(module, args[0], output)):
                    raise _HooksCannotSplit(f"Invalid params: a Linear subclass that owns them ({type(module).__name__}) "
                                            "computes something else than nn.Linear's y = x Wᵀ + b (use loop_grad_norms)")
                inputs[key] = args[0].detach()
                if output.requires_grad:
                    output.register_hook(lambda grad: grads.__setitem__(key, grad.detach()))
            return forward_hook

        for key, module in modules.items():
            handles.append(module.register_forward_hook(keep(key)))
        try:
            # Σ_i f_i: row i of every output gradient is ∂f_i/∂y_i; backward through the graph only
            total = _grads(losses(part).sum(), params)
        finally:
            for handle in handles:
                handle.remove()
        per_example: dict[int, torch.Tensor] = {}   # id(tensor) → [B, *tensor.shape] summed over modules
        unsure = False
        for key, module in modules.items():
            if key not in grads:                    # not run on this chunk (an expert no token reached): no part
                continue
            layout = _batch_major(inputs[key], grads[key], len(part))
            if layout is False:
                raise _HooksCannotSplit(f"Invalid params: a Linear that owns them ({module}) sees inputs of shape "
                                        f"{tuple(inputs[key].shape)}, not laid out batch-major for {len(part)} "
                                        "examples (use loop_grad_norms)")
            unsure = unsure or layout is None
            x = inputs[key].double().reshape(len(part), -1, module.in_features)      # [B, T, d_in]
            g = grads[key].double().reshape(len(part), -1, module.out_features)     # [B, T, d_out]
            if id(module.weight) in tuned:
                gw = torch.einsum("bto,bti->boi", g, x)                             # [B, d_out, d_in]
                per_example[id(module.weight)] = per_example.get(id(module.weight), 0) + gw
            if module.bias is not None and id(module.bias) in tuned:
                per_example[id(module.bias)] = per_example.get(id(module.bias), 0) + g.sum(1)
        # the split must add up to the backward's own Σ_i ∇f_i: a weight also read outside its Linear's forward
        # (Jamba's dt_proj.weight @ x) has a part no hook sees, which was left out of every norm
        _check_split(params, torch.ones(len(part), dtype=torch.float64), total, per_example,
                     "some of their gradient comes from uses the hooks do not see (a weight read outside its "
                     "Linear's forward, e.g. Jamba's dt_proj.weight)")
        if unsure:
            weights = torch.arange(1, len(part) + 1, dtype=torch.float64)       # distinct c_i = 1 … B
            total = _grads((losses(part) * weights.to(torch.float32).to(_device_of(params))).sum(), params)
            _check_split(params, weights, total, per_example,
                         "its rows are regrouped across examples (e.g. an MoE router's tokens)")
        squared = sum(t.reshape(len(part), -1).pow(2).sum(1) for t in per_example.values())
        out.append(squared.sqrt() if isinstance(squared, torch.Tensor) else torch.zeros(len(part), dtype=torch.float64))
    return torch.cat([o.cpu() for o in out]) if out else torch.zeros(0, dtype=torch.float64)


def _check_split(params, weights: torch.Tensor, total, per_example: dict, why: str) -> None:
    """Σ_i c_i ∇f_i from the split per-example gradients against ``total``, the backward of Σ_i c_i f_i:
    a split that gave some example another's rows (distinct c_i), or that misses part of a gradient, fails
    it (raises ``_HooksCannotSplit`` saying ``why``)."""
    for p, exact in zip(params, total):
        mine = per_example.get(id(p))
        if mine is None:            # no hook saw it: the backward must not have seen it either
            if exact is not None and bool(exact.detach().ne(0).any()):
                raise _HooksCannotSplit(f"Invalid params: the batched split of a Linear's gradient fails, {why}: "
                                        "use loop_grad_norms")
            continue
        mine = mine.to(weights.device)
        split = torch.einsum("b,b...->...", weights, mine)
        exact = torch.zeros_like(split) if exact is None else exact.detach().double().cpu().reshape(split.shape)
        scale = float(torch.einsum("b,b->", weights, mine.reshape(len(weights), -1).norm(dim=1)))
        tolerance = max(1e-4, 16 * torch.finfo(p.dtype).eps) if p.is_floating_point() else 1e-4   # bf16's grads
        if float((split - exact).norm()) > tolerance * scale + 1e-12:
            raise _HooksCannotSplit(f"Invalid params: the batched split of a Linear's gradient does not add up to "
                                    f"the backward's, {why}: use loop_grad_norms")


def _device_of(params) -> torch.device:
    return params[0].device if params else torch.device("cpu")


VMAP_BYTES = 256 * 2 ** 20      # bytes of per-example gradients held at once by ``vmap_grad_norms``
_UNTRACEABLE: set[type] = set()  # model classes whose forward ``vmap`` could not trace (the loop serves them)


def vmap_grad_norms(model, batch: TokenBatch, params, indices=None, *, max_bytes: int = VMAP_BYTES) -> torch.Tensor:
    """‖∇f_i‖ of the classification loss by ``torch.func``: float64 [len(indices)].

    One ``vmap(grad(f))`` per chunk of examples, f(θ; x) = CE(label logits at x's last position).
    The chosen examples must have no padding (equal lengths); the tuned tensors may be any
    parameters of ``model``. Raises ValueError for padded examples or tensors not in the model, and
    whatever ``vmap`` raises for a forward it cannot trace.
    """
    from torch.func import functional_call, grad, vmap

    indices = list(range(len(batch))) if indices is None else _checked(indices, len(batch))
    check_labelled(batch)               # no labels: a TypeError from inside the chunk loop
    # before the first forward, as the losses check: an id past the embedding was an IndexError (on a GPU a
    # device-side assert, which "auto" took for a forward vmap cannot trace)
    _check_vocabulary(model, batch)
    if len({len(batch.ids[i]) for i in indices}) > 1:
        raise ValueError("Invalid batch: vmap_grad_norms needs examples of one length (no padding)")
    names = {id(p): name for name, p in model.named_parameters()}
    params = _differentiable(params)
    if any(id(p) not in names for p in params):
        raise ValueError("Invalid params: every tensor must be a parameter of the model")
    tuned = {names[id(p)]: p.detach() for p in params}
    check_deterministic(model)         # every module: one left in training mode under an eval model too
    label_ids = batch.label_ids.to(params[0].device)

    def example_loss(weights, ids, label):        # ids [T], label []: one example, no batch dimension
        logits = functional_call(model, weights, (), {"input_ids": ids[None]}).logits[0, -1]      # [V]
        # in float64 for a float64 model, as classification_losses: .float() left its norms float32-accurate (3e-8)
        return torch.nn.functional.cross_entropy(at_least_float32(logits.index_select(0, label_ids))[None], label[None])

    per_example = vmap(grad(example_loss), in_dims=(None, 0, 0))
    size = sum(p.numel() * p.element_size() for p in params)   # bytes of one example's gradients (float64: 8 an entry)
    chunk = max(1, min(len(indices), max_bytes // max(1, size)))
    out = []
    for start in range(0, len(indices), chunk):
        part = indices[start:start + chunk]
        inputs = batch.select(part, params[0].device)
        with warnings.catch_warnings():   # attention has no batching rule yet: torch's slower fallback, still exact
            warnings.filterwarnings("ignore", message="There is a performance drop")
            grads = per_example(tuned, inputs["input_ids"], batch.labels[part].to(params[0].device))
        out.append(sum(g.double().reshape(len(part), -1).pow(2).sum(1) for g in grads.values()).sqrt().cpu())
    return torch.cat(out) if out else torch.zeros(0, dtype=torch.float64)


def _checked(indices, count: int | None) -> list[int]:
    """The examples to measure, checked as a loss checks them (1.5 was read as example 1; ``count`` None: any
    int >= 0); none: []. Read once: a generator was spent by the emptiness test ("Invalid indices: expected a
    non-empty list")."""
    if not isinstance(indices, torch.Tensor):
        indices = list(indices)
    empty = indices.numel() == 0 if isinstance(indices, torch.Tensor) else not indices
    return [] if empty else checked_indices(indices, count)


def _vmap_applies(model, batch: TokenBatch, indices, loss: str) -> bool:
    return (loss == "classification" and type(model) not in _UNTRACEABLE and batch.labels is not None
            and len({len(batch.ids[int(i)]) for i in indices}) == 1)


def grad_norms(model, batch: TokenBatch, params, *, loss: str = "classification", indices=None,
               method: str = "auto", chunk: int = 16) -> torch.Tensor:
    """True per-example gradient norms ‖∇_θ f_i‖ over the tuned tensors: float64 [N] on the CPU.

    Args:
        model: a causal LM (eval mode; dropout would make f_i random).
        batch: the examples (``TokenBatch``).
        params: the tuned tensors (e.g. ``trainable_parameters(lora_model)``).
        loss: "classification" (verbalisers) or "answer" (answer-token CE).
        indices: which examples (default all).
        method: "auto" (batched hooks when every tensor is a Linear's weight/bias and each such Linear
            runs once on batch-major rows; else ``vmap`` for the classification loss on examples
            without padding, the loop if the model's forward cannot be traced; else the loop),
            "linear" (ValueError where the hooks cannot split the examples), "vmap" or "loop".
        chunk: examples per batched backward.
    """
    if method not in ("auto", "linear", "vmap", "loop"):
        raise ValueError(f"Invalid method: {method!r} (expected 'auto', 'linear', 'vmap' or 'loop')")
    if method == "vmap" and loss != "classification":     # it returned the classification loss's norms
        raise ValueError(f"Invalid method: 'vmap' differentiates the classification loss only (loss={loss!r}); "
                         "use 'auto', 'linear' or 'loop'")
    params = _differentiable(params)
    chunk = check_count("chunk", chunk)       # checked whichever way runs (the loop ignored chunk=0)
    indices = range(len(batch)) if indices is None else _checked(indices, len(batch))
    losses = example_losses(model, batch, loss)
    if method == "vmap":
        return vmap_grad_norms(model, batch, params, indices)
    if method == "linear" or (method == "auto" and linear_modules_for(model, params, subclasses=True) is not None):
        try:
            return linear_grad_norms(model, losses, params, indices, chunk=chunk)
        except _HooksCannotSplit:         # a Linear run twice or fed rows not batch-major: the exact ways
            if method == "linear":
                raise
    if method == "auto" and _vmap_applies(model, batch, indices, loss):
        try:
            return vmap_grad_norms(model, batch, params, indices)
        except RuntimeError:              # a forward vmap cannot trace (data-dependent branches): the loop
            _UNTRACEABLE.add(type(model))
    return loop_grad_norms(losses, params, indices)


def full_gradient_norm(model, batch: TokenBatch, params, *, loss: str = "classification", chunk: int = 16) -> float:
    """‖∇F(θ)‖ for F = mean_i f_i over the tuned tensors, by backprop (chunked; float64 accumulation)."""
    params = _differentiable(params)
    chunk = check_count("chunk", chunk)
    losses = example_losses(model, batch, loss)
    if len(batch) == 0:         # the mean over no examples: it read 0.0
        raise ValueError("Invalid batch: no examples")
    total = [torch.zeros_like(p, dtype=torch.float64) for p in params]
    n = len(batch)
    for start in range(0, n, chunk):
        part = list(range(start, min(start + chunk, n)))
        grads = torch.autograd.grad(losses(part).sum() / n, params, allow_unused=True)
        for acc, g in zip(total, grads):
            if g is not None:
                acc += g.double()
    return float(sum(float(t.pow(2).sum()) for t in total) ** 0.5)


@torch.no_grad()
def _shift(params, directions, scale: float) -> None:
    for p, z in zip(params, directions):
        p.add_(z, alpha=scale)


def directional_error(model, batch: TokenBatch, params, *, eps: float, draws: int = 4, indices=None,
                      loss: str = "classification", seed: int = 0) -> torch.Tensor:
    """How far MeZO's δ_k = (f_k(θ+εz) − f_k(θ−εz))/2ε is from the directional derivative zᵀ∇f_k.

    For ``draws`` Gaussian directions z (seeded), the RMS over draws of δ_k − zᵀ∇f_k (autograd),
    relative to ‖∇f_k‖ (the RMS of zᵀ∇f_k itself): float64 [len(indices)]. θ is restored.
    """
    if loss not in LOSSES:
        raise ValueError(f"Invalid loss: {loss!r} (expected one of {sorted(LOSSES)})")
    eps = check_number("eps", eps, 0.0, closed_low=False)      # 0: every δ was 0/0 = nan
    draws = check_count("draws", draws)                         # 0: the mean over no draws was nan
    seed = check_seed("seed", seed)     # 1.5 was torch's RuntimeError once every gradient had been computed
    params = _differentiable(params)
    indices = list(range(len(batch))) if indices is None else _checked(indices, len(batch))   # not int(1.5)
    fn = LOSSES[loss]
    grad_losses = example_losses(model, batch, loss)
    grads = []
    for i in indices:
        g = torch.autograd.grad(grad_losses([i]).sum(), params, allow_unused=True)
        grads.append([torch.zeros_like(p) if x is None else x.detach() for p, x in zip(params, g)])
    generator = torch.Generator().manual_seed(seed)
    errors = torch.zeros(len(indices), dtype=torch.float64)
    saved = [p.detach().clone() for p in params]
    for _ in range(draws):
        z = [torch.randn(p.shape, generator=generator, dtype=p.dtype).to(p.device) for p in params]
        try:
            _shift(params, z, eps)
            plus = fn(model, batch, indices).double()
            _shift(params, z, -2 * eps)
            minus = fn(model, batch, indices).double()
        finally:
            with torch.no_grad():       # exactly θ again (± in float32 does not round-trip)
                for p, s in zip(params, saved):
                    p.copy_(s)
        diffs = (plus - minus).cpu() / (2 * eps)
        exact = torch.tensor([sum(float((zz.double() * gg.double()).sum()) for zz, gg in zip(z, g)) for g in grads],
                             dtype=torch.float64)
        errors += (diffs - exact) ** 2
    norms = torch.tensor([sum(float(x.double().pow(2).sum()) for x in g) ** 0.5 for g in grads], dtype=torch.float64)
    return (errors / draws).sqrt() / norms.clamp_min(1e-30)


class RefreshingNorms:
    """A ``norms_fn`` for ``OracleSampler``: true norms recomputed every ``every`` steps, cached between.

    ``clock()`` says the current step (e.g. ``lambda: optimizer.step_count``); the norms are
    recomputed when it has advanced by ≥ ``every`` since the last refresh (and on first use), so
    the norms in use are never more than ``every − 1`` steps old (``every = 1``: fresh at every
    step), and reading ``sampler.probs`` for logging adds no backprop beyond that.

    At every refresh after the first, ``staleness`` records how much the old norms had cost:
    ``{"step", "age", "v_stale_ratio": V(p_stale)/V(p*), "v_uniform_ratio": V(u)/V(p*)}``, where
    p_stale is the oracle's distribution from the old norms (mixed with uniform by ``mix``, the
    oracle's λ) and p* the exact oracle of the new norms. A ratio far above 1 means the oracle was
    sampling by norms that had since changed (and ``v_stale_ratio > v_uniform_ratio``: worse than uniform).

    Example:
        >>> calls, step = [], [0]
        >>> norms = RefreshingNorms(lambda: calls.append(1) or torch.ones(3), every=5, clock=lambda: step[0])
        >>> _ = norms(); step[0] = 4; _ = norms(); step[0] = 5; _ = norms()
        >>> len(calls), norms.refreshes, norms.staleness[0]["v_stale_ratio"]
        (2, 2, 1.0)
    """

    def __init__(self, compute: Callable[[], torch.Tensor], *, every: int, clock: Callable[[], int],
                 mix: float = 0.0):
        every = check_count("every", every)      # a numpy int is an int too (it was refused)
        if isinstance(mix, bool) or not isinstance(mix, (int, float)) or not 0.0 <= mix <= 1.0:
            raise ValueError(f"Invalid mix: {mix!r} (expected a number in [0, 1])")
        self.compute, self.every, self.clock, self.mix = compute, every, clock, float(mix)
        self.norms: torch.Tensor | None = None
        self.refreshed_at: int | None = None
        self.refreshes = 0
        self.staleness: list[dict] = []

    def __call__(self) -> torch.Tensor:
        from ..variance import mix_with_uniform, oracle_probs, uniform_gain, variance_ratio

        now = int(self.clock())
        if self.norms is None or now - self.refreshed_at >= self.every:
            fresh = torch.as_tensor(self.compute()).detach().to("cpu", torch.float64)
            if self.norms is not None:
                stale = mix_with_uniform(oracle_probs(self.norms), self.mix)
                self.staleness.append({"step": now, "age": now - self.refreshed_at,
                                       "v_stale_ratio": variance_ratio(fresh, stale),
                                       "v_uniform_ratio": uniform_gain(fresh)})
            self.norms = fresh
            self.refreshed_at, self.refreshes = now, self.refreshes + 1
        return self.norms

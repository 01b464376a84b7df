"""Fine-tune a causal LM on a prompt-classification task with MeZO (uniform) or SAZO sampling.

One call = one run of ``sazo_lite.train`` (sample → two forwards → update the sampler), plus
the bookkeeping the notebook and benchmarks need: full training loss and held-out accuracy
at every log point, and how often each training example was drawn.

    run = zo_finetune(model, params, train_batch, test_batch, method="sazo", steps=200)
    run.queries, run.train_loss, run.test_accuracy, run.sample_counts

``snapshot``/``restore_snapshot`` put the tuned parameters back so that MeZO and SAZO start
from the same weights.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable

import torch

from ..engine import MeZO, _check_disjoint
from ..samplers import make_sampler, sampler_name
from ..train import History, train
from ..validation import check_choice, check_count, not_dense
from .losses import TokenBatch, accuracy, batched_closure, classification_losses
from .tuning import check_adapters_read

__all__ = ["FinetuneRun", "zo_finetune", "check_params_in", "mean_loss", "snapshot", "restore_snapshot", "METHODS"]

METHODS = ("mezo", "uniform", "sazo", "sazo-plain")   # samplers by name; "mezo" = "uniform"


@dataclass
class FinetuneRun:
    """What one fine-tuning run recorded (lists are per log point, starting at 0 queries)."""

    method: str
    queries: list[int] = field(default_factory=list)
    train_loss: list[float] = field(default_factory=list)
    test_accuracy: list[float] = field(default_factory=list)
    sample_counts: torch.Tensor | None = None   # [N] how often each train example was drawn
    probs: torch.Tensor | None = None           # [N] the sampler's final distribution
    history: History | None = None


def mean_loss(model, batch: TokenBatch, *, chunk: int = 32, autocast_dtype=None) -> float:
    """F(θ) = mean per-example classification loss over a whole split."""
    chunk = check_count("chunk", chunk)         # -1: no chunk ran and F was 0.0
    if len(batch) == 0:                         # the mean over no examples: a ZeroDivisionError
        raise ValueError("Invalid batch: no examples")
    total = 0.0
    for start in range(0, len(batch), chunk):
        indices = list(range(start, min(start + chunk, len(batch))))
        total += float(classification_losses(model, batch, indices, autocast_dtype=autocast_dtype).sum())
    return total / len(batch)


@torch.no_grad()
def snapshot(params) -> list[torch.Tensor]:
    """Copies of the tuned tensors (cheap for LoRA / sparse; a full model copy otherwise)."""
    return [p.detach().clone() for p in params]


@torch.no_grad()
def restore_snapshot(params, saved) -> None:
    """Copy ``saved`` (a ``snapshot``) back into ``params``; checked before any copy (zip stopped at the
    shorter list, and copy_ broadcast a tensor of another shape, both without a word; a tensor without data or a
    complex one raised, or dropped its imaginary part, once the tensors before it were overwritten; a tensor given
    twice, or two sharing memory, kept the last copy written)."""
    params, saved = list(params), list(saved)
    if len(saved) != len(params) or any(
            not isinstance(s, torch.Tensor) or s.shape != p.shape for p, s in zip(params, saved)):
        raise ValueError(f"Invalid saved: expected one tensor of each tuned tensor's shape ({len(params)} "
                         f"tensors), got {len(saved)}")
    for k, (p, s) in enumerate(zip(params, saved)):
        kind = "meta" if s.is_meta else not_dense(s) or (str(s.dtype).removeprefix("torch.")
                                                          if s.is_complex() and not p.is_complex() else None)
        if kind is not None:
            raise ValueError(f"Invalid saved: saved[{k}] is a {kind} tensor (expected a dense real tensor with data, "
                             "as snapshot makes)")
    try:                        # a tensor given twice took the last of its two saved copies, without a word
        _check_disjoint(params)
    except ValueError:
        raise ValueError("Invalid params: two of them share memory (one tensor given twice, or views of one); each "
                         "would take its own saved copy and the last one written would win") from None
    for p, s in zip(params, saved):
        p.copy_(s)


def check_params_in(model, params) -> list[torch.Tensor]:
    """``params`` as a list, every one a parameter of ``model`` that its forward reads, none given twice; else
    ValueError. A tensor of another model (params taken before the model was reloaded or copied) or a peft adapter
    the forward does not read now (merged, disabled, inactive: ``check_adapters_read``) is moved by MeZO while the
    losses never read it: every δ is 0 and nothing is learnt, without a word. A tensor given twice was stepped
    twice by ``first_round``'s Adam (torch only warns)."""
    params = list(params)
    own = {id(p) for p in model.parameters()}
    foreign = [k for k, p in enumerate(params) if id(p) not in own]
    if foreign:
        raise ValueError(f"Invalid params: {len(foreign)} of {len(params)} tensors (e.g. params[{foreign[0]}]) are "
                         "not parameters of the model (taken from another copy of it?); the losses would not see them")
    check_adapters_read(model, params)      # merge_adapter() left them in the model: a run "trained" with δ = 0
    _check_disjoint(params)
    return params


def zo_finetune(model, params, train_batch: TokenBatch, test_batch: TokenBatch | None = None, *,
                method: str = "sazo", steps: int = 100, batch_size: int = 8, lr: float = 1e-3,
                eps: float = 1e-3, ema_decay: float = 0.9, uniform_mix: float = 0.1, seed: int = 0,
                log_every: int = 10, optimizer=None, on_log: Callable[[FinetuneRun], None] | None = None,
                progress: bool = True, autocast_dtype=None, stop_below: float | None = None) -> FinetuneRun:
    """ZO fine-tuning with uniform minibatches ("mezo") or SAZO importance sampling ("sazo").

    Each step: indices, w ~ sampler; MeZO step on w·f(indices); sampler sees d_k. Costs 2·B queries.

    Args:
        model: causal LM in eval mode; params: the tensors to perturb (e.g. LoRA adapters).
        train_batch / test_batch: ``TokenBatch`` from ``ClassificationTask.encode``.
        method: a sampler by name (``METHODS``: "mezo" = "uniform", "sazo", "sazo-plain"); steps, batch_size, lr, eps: the MeZO settings.
        ema_decay, uniform_mix: SAZO's β and λ.
        optimizer: a ready optimiser (e.g. ``SparseMeZO``), whose tensors must be the model's; default
            ``MeZO(params, lr, eps, seed)``. Queries count this run's steps only.
        on_log: called with the run so far at every log point (live dashboards).
        stop_below: stop once the full training loss is at or below this value (checked at the log points
            after the start).

    Returns:
        A ``FinetuneRun``.
    """
    run = FinetuneRun(method)
    check_choice("method", method, METHODS)
    for name, batch in (("train_batch", train_batch), ("test_batch", test_batch)):
        if not (isinstance(batch, TokenBatch) or (batch is None and name == "test_batch")):   # AttributeErrors
            raise ValueError(f"Invalid {name}: {type(batch).__name__} (expected a TokenBatch; query_run takes a "
                             "TopBlocks)")
    params = check_params_in(model, params)
    sampler = make_sampler(sampler_name(method), len(train_batch), ema_decay=ema_decay, uniform_mix=uniform_mix,
                           seed=seed)
    if optimizer is None:
        optimizer = MeZO(params, lr=lr, eps=eps, seed=seed)
    else:   # an optimiser built on another copy of the model moved tensors the losses never read: nothing learnt
        check_params_in(model, [p for group in getattr(optimizer, "param_groups", []) for p in group["params"]])
    first_step = optimizer.step_count     # a reused optimiser's earlier steps are not this run's queries
    counts = torch.zeros(len(train_batch), dtype=torch.float64)
    losses = batched_closure(model, train_batch, autocast_dtype=autocast_dtype)

    def counted(indices):  # called twice per step (θ+εz, θ−εz): count each draw once
        counts.index_add_(0, torch.as_tensor(indices).long(), torch.full((len(indices),), 0.5, dtype=torch.float64))
        return losses(indices)

    def log(queries: int) -> float:
        run.queries.append(queries)
        run.train_loss.append(mean_loss(model, train_batch, autocast_dtype=autocast_dtype))
        if test_batch is not None:
            run.test_accuracy.append(accuracy(model, test_batch, autocast_dtype=autocast_dtype))
        run.sample_counts, run.probs = counts.clone(), sampler.probs.clone()
        if on_log is not None:
            on_log(run)
        return run.train_loss[-1]

    log(0)
    run.history = train(optimizer, sampler, counted, steps, batch_size=batch_size, log_every=log_every,
                        evaluate=lambda: log((optimizer.step_count - first_step) * 2 * batch_size), progress=progress,
                        stop_below=stop_below, description=f"{method} fine-tuning")
    return run

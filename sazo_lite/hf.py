"""MeZO / SAZO through the Hugging Face ``Trainer``: ``ZOTrainer``, a drop-in ``transformers.Trainer``.

    from transformers import TrainingArguments
    from sazo_lite.hf import ZOTrainer
    args = TrainingArguments("out", max_steps=200, per_device_train_batch_size=8, learning_rate=1e-4,
                             logging_steps=10, save_steps=50, report_to=[])
    trainer = ZOTrainer(model, args, train_dataset=train, eval_dataset=test, method="sazo", eps=1e-3)
    trainer.train()                      # later: trainer.train(resume_from_checkpoint=True)

Logging, callbacks, ``evaluate`` with ``compute_metrics``, ``save_steps`` checkpoints, ``max_steps``,
lr schedules, peft models, ``hyperparameter_search`` (with ``model_init``) and ``torchrun`` launches
are the Trainer's own. What differs:

- Optimiser: ``sazo_lite.MeZO`` over the parameters that require grad (lr, weight decay and the lr
  schedule come from ``args``; as with the Trainer's AdamW, biases and norms are not decayed). A training step runs the model exactly twice, at θ+εz and θ−εz,
  under ``no_grad`` and in eval mode (the two passes must see the same function: no dropout);
  nothing calls backward and no ``.grad`` is ever allocated. ``max_grad_norm`` other than its default
  (or 0) is refused: there is no gradient to clip. After
  each step the model is in train mode again, as the Trainer's own ``training_step`` leaves it.
  The update is made inside ``training_step`` (the Trainer's ``optimizer.step()`` does nothing),
  which calls the callbacks' ``on_pre_optimizer_step`` first, before the two passes (the weights
  the update starts from; there is no ``.grad``), in place of the Trainer's call after it;
  ``on_optimizer_step`` sees the updated weights. The tuned tensors are the model's trainable ones when
  MeZO is built (the first ``train()``): a step refuses (``ValueError``, nothing moved) a model whose
  trainable tensors changed since (``requires_grad`` set or cleared by a callback or between calls), and
  ``train()`` and every step refuse trainable peft adapters the forward does not read (merged, disabled
  or not the active adapter: ``sazo_lite.llm.tuning.check_adapters_read``).
- Batches: each step the ZO sampler draws B = per_device_train_batch_size × world_size *dataset
  indices* i.i.d. with weights w = 1/(N·p_i) (``method="mezo"``: uniform, w = 1; ``"sazo"``:
  ``SAZOSampler``), the step minimises mean_k(w_k·f_k), and the sampler then sees the B directional
  differences. The Trainer's train dataloader only yields step tickets, so its prefetching and its
  skipping of batches on resume never draw from the sampler; examples are collated in
  ``training_step`` (``dataloader_num_workers`` does not apply to training). The sampler is seeded
  by ``args.data_seed`` when set (else zo_seed + 1); a ``train_sampling_strategy`` other than
  "random" and ``neftune_noise_alpha`` (no noise in eval mode) are refused, not ignored, and so
  are ``adam_beta1/2`` and ``adam_epsilon`` other than their defaults (MeZO keeps no moments). An
  epoch is ceil(N/B) steps, floor(N/B) (at least 1) with ``dataloader_drop_last``.
- Loss: f_i = mean token cross-entropy over example i's labels (causal shift, −100 ignored;
  ``sazo_lite.llm.losses.causal_lm_losses``), or ``per_example_loss(outputs, inputs) -> [B]``.
  The label columns ("labels" and ``label_names``: the Trainer's own, such as a QA model's
  start_positions and end_positions, or ["labels"] when it finds none) are held out of the
  model's forwards and read by the loss. A sequence classifier (logits [B, C], integer labels [B]) is scored by
  each row's cross-entropy, as its own single-label loss (float labels, regression or multi-label, need a
  ``per_example_loss``; ``CausalLMCollator`` collates token rows: pass a data_collator). An encoder-decoder model (T5, BART), a masked LM or a token
  classifier is scored without the shift (its logits at t score label t, as its own loss reads them);
  an encoder-decoder model gets ``decoder_input_ids`` built from the labels as its forward builds
  them when the batch has none. A peft prompt-tuning, p-tuning or CPT model's logits cover its virtual
  tokens first, which score nothing, as in peft's loss for the first two (CPT's forward rewrites its own
  weights, which MeZO refuses at the first step: such a model can be evaluated, not trained).
  ``train()`` first runs the model once, without changing anything, on the first two training
  examples, and refuses (``ValueError``) a model, collator or ``per_example_loss`` it cannot
  use: no ``labels`` in the batches, outputs without ``logits`` [B, T, V] (an attribute, or a
  dict's key), a loss that is not one float per example. Each step, before its first pass, an
  example the collator refuses, a token id beyond the model's embeddings, a batch longer than its learned
  positions (GPT-2, OPT) and (default loss) a label id outside [0, V) other than −100 or an example with no
  scored token (every label −100, or only the first, which the causal shift never scores) are refused
  (``ValueError``) naming the train_dataset indices and the step; ``evaluate`` refuses such an example too (its
  loss 0 was counted in ``eval_loss``). The per-example losses reach MeZO in
  float64 (a float64 loss keeps its precision; the default loss of a float64 model is computed in float64).
  ``evaluate`` refuses a ``per_example_loss`` that is not one float per example, as training does.
  The logged training loss is mean_k(w_k·(f_k(θ+εz) + f_k(θ−εz))/2); ``eval_loss`` is
  mean_i f_i over the eval set, averaged in float32 (not the token-weighted mean; under data
  parallel the Trainer pads the last eval batch of each rank, so it is exact only when the eval set
  fills whole batches on every rank). The model is called without
  labels, so a tuple or tensor it returns holds no loss: ``compute_loss`` puts the loss in front
  (the Trainer's convention), so ``predict`` and ``compute_metrics`` get the model's whole outputs. Without
  a ``train_dataset`` a model with nothing trainable may be evaluated (training it is refused).
- ``hyperparameter_search``: each trial's args pass the checks ``__init__`` makes (``ValueError``
  otherwise), its model the check ``train()`` makes, and its ``seed`` seeds MeZO and the sampler
  unless ``zo_seed`` was given (``data_seed``, when set, seeds the sampler).
- In the trainer's copy of ``args`` (the caller's are unchanged), ``dataloader_pin_memory`` is off
  without an accelerator (torch ignores pinning there, with a warning) and ``ignore_data_skip`` is
  off (a resume skips the step tickets of the steps done at no cost, so its epochs go on as the
  uninterrupted run's).
- Logs add ``zo_queries`` (per-example forward evaluations so far, 2·B per step, counted since MeZO
  was built: over repeated ``train()`` calls and across resumes, whose checkpoints carry the count),
  ``zo_projected_grad`` (mean |g| since the last log) and, for SAZO, ``sazo_max_weight`` and
  ``sazo_ess`` (mean Kish effective sample size (Σw)²/Σw² of the batches, as a fraction of B).
- Data parallel (``torchrun --nproc_per_node=W script.py``, gloo on CPU): every rank draws the same
  global batch, evaluates its contiguous block of B/W examples and all-gathers the losses
  (``sazo_lite.distributed``), so g, the update and the sampler stay identical on every rank. Each step
  first checks that every rank drew the same batch (``same_batch``: ValueError on every rank, nothing moved);
  with ``check_ranks=True`` also that every rank's MeZO holds the same step, seed, settings and weights.
- Checkpoints add ``zo_state.pt`` (the sampler's state, any master weights, the query count, B and
  ``learning_rate``, which a plateau schedule keeps nowhere else: plain
  tensors, numbers and strings, written to a temporary file and renamed) to the Trainer's
  files; MeZO's state (step count and seed) is the Trainer's ``optimizer.pt``. Resuming
  continues the uninterrupted run bit for bit, so a resume whose lr, weight decay, eps,
  perturbation, seeds or sampler settings differ from the checkpoint's is refused
  (``ValueError``) before anything loads: loading would silently put the old values back. A
  resume with another B (``per_device_train_batch_size`` or number of processes; the checkpoint
  records its B) goes on with the new B and warns (``UserWarning``): MeZO's directions and the
  sampler's per-example scores do not depend on B; epochs go on from the checkpoint's, an epoch
  counted in steps of the new B. It is refused where the Trainer's epochs decide when training
  stops or acts (``max_steps`` unset, or an ``"epoch"`` eval, save or logging strategy): the
  Trainer counts the checkpoint's steps as steps of the new B. A
  ``save_only_model=True`` checkpoint holds the weights only and cannot be resumed. Loads (a resume,
  ``load_best_model_at_end``) keep the model's trainable tensors, objects and dtypes: peft's
  ``load_adapter`` replaces bfloat16/float16 adapters by new float32 tensors, which are put back. peft saves a
  p-tuning model's prompt encoder (and a prefix-tuning one's with ``prefix_projection``, which peft's own load
  refuses: the trainer skips it) as its output only, so ``zo_state.pt`` then holds the tuned tensors, and
  loads put them back (such a checkpoint without them is refused).
  ``zo_state.pt`` is read with ``torch.load(weights_only=True)`` (a file holding anything else, such as a
  pickled object, is refused and nothing in it runs) and checked in full before anything loads.
- Seed logs: a ``SeedLog`` attached to ``trainer.zo_optimizer`` (a plain ``MeZO``; say in a
  callback's ``on_train_begin``) records the steps, and ``SeedLog.replay`` rebuilds the weights.
  A log records steps only: while one is attached, each step first compares a checksum of the
  tuned tensors (their sum and norm in float64) with the one after the last step, and refuses
  (``ValueError``, nothing moved) weights written in between (a callback, ``load_best_model_at_end``,
  code between ``train()`` calls), which its replay would miss. Writes inside a step (a MeZO
  step hook) and writes that keep every tensor's sum and norm are not seen.
- Half precision: a model loaded in bfloat16/float16 is tuned through ``Float32Master``
  (``master_weights="auto"``): MeZO perturbs a float32 copy of the trainable tensors, copied into
  the model before each forward, so updates smaller than half an ulp are not lost. Entries
  written into the model between steps (a callback, code between ``train()`` calls) become the
  master's at the next step or checkpoint, as a float32 model keeps them. With
  ``load_best_model_at_end`` the master follows the best weights loaded at the end (that
  checkpoint's float32 master), so a later ``train()`` continues from them. ``bf16=True``
  with a float32 model only autocasts the forwards; the weights stay float32. ``fp16=True``
  without an accelerator is refused: accelerate autocasts float16 on accelerators only. ``bf16_full_eval`` or
  ``fp16_full_eval`` with a model of another float dtype is refused: ``evaluate()`` outside ``train()`` casts the
  model in place (the Trainer's), rounding its weights for good.
"""
from __future__ import annotations

import contextlib
import copy
import functools
import math
import os
import pickle
import types
import warnings
from collections.abc import Mapping

import torch
from accelerate.utils.memory import clear_device_cache
from torch.utils.data import DataLoader
from transformers import Trainer, TrainingArguments
from transformers.trainer_callback import CallbackHandler, TrainerState
from transformers.trainer_utils import get_last_checkpoint
from transformers.training_args import OptimizerNames
from transformers.utils import is_datasets_available

from .atomic import atomic_write
from .distributed import gather_losses, rank_and_world, same_batch, shard
from .engine import MeZO, NoiseSourceWarning
from .interrupts import InterruptsDeferred
from .llm.losses import IGNORE, _position_tables, _positions_before, _virtual_tokens, causal_lm_losses
from .llm.tuning import check_adapters_read
from .precision import master_dtype
from .samplers import make_sampler, sampler_name
from .validation import check_bool, check_choice, check_int

__all__ = ["ZOTrainer", "causal_lm_losses", "CausalLMCollator", "METHODS", "ZO_STATE_NAME"]

METHODS = ("mezo", "uniform", "sazo", "sazo-plain")   # samplers by name; "mezo" = "uniform"
ZO_STATE_NAME = "zo_state.pt"
ZO_STATE_KEYS = {"method", "sampler", "master"}
ZO_STATE_OPTIONAL = {"queries", "learning_rate", "batch_size", "tuned"}   # written since rounds 10, 11, 12 and 16
HALF_DTYPES = (torch.bfloat16, torch.float16)
PROBE_EXAMPLES = 2   # examples the pre-training check runs the model on


class CausalLMCollator:
    """Right-pads ``input_ids`` (with ``pad_token_id``), ``attention_mask`` (0) and ``labels`` (−100).

    A row's own ``attention_mask`` (a pre-padded dataset: left or right padding, or
    ``padding="max_length"``) is honoured: its padding is dropped before the batch is padded
    again on the right, so a pad is never fed to the model nor scored, and an example's loss is
    the loss it has alone (no position ids needed), whichever batch it lands in. Rows without
    ``labels`` are labelled with their own (unpadded) input ids (plain language modelling).

    Raises:
        ValueError: token ids or labels that are not integers (floats, bools, nested rows), one label per row,
            or a ``label``/``label_ids`` column without ``labels``
            (a classification dataset: pass a ``data_collator``), labels or a mask of another
            length than the input ids, a mask other than 0/1 or with padding inside the row, or
            a row with no tokens left.

    Example:
        >>> CausalLMCollator(0)([{"input_ids": [5, 6, 7]}, {"input_ids": [0, 8], "attention_mask": [0, 1]}])["labels"]
        tensor([[   5,    6,    7],
                [   8, -100, -100]])
    """

    def __init__(self, pad_token_id: int):
        self.pad_token_id = int(pad_token_id)

    def __call__(self, rows: list[dict]) -> dict[str, torch.Tensor]:
        ids, labels = zip(*(self._unpadded(k, row) for k, row in enumerate(rows)))
        width = max(len(r) for r in ids)
        batch = {"input_ids": torch.full((len(rows), width), self.pad_token_id, dtype=torch.long),
                 "attention_mask": torch.zeros(len(rows), width, dtype=torch.long),
                 "labels": torch.full((len(rows), width), IGNORE, dtype=torch.long)}
        for k, (r, lab) in enumerate(zip(ids, labels)):
            batch["input_ids"][k, :len(r)] = torch.tensor(r)
            batch["attention_mask"][k, :len(r)] = 1
            batch["labels"][k, :len(r)] = torch.tensor(lab)
        return batch

    @staticmethod
    def _unpadded(k: int, row) -> tuple[list[int], list[int]]:
        """Row k's tokens and labels with its own padding (mask 0) removed."""
        ids = _token_ids(k, "input_ids", row["input_ids"])
        if row.get("labels") is not None and not _is_sequence(row["labels"]):
            raise ValueError(f"Invalid labels: row {k} has one label ({row['labels']!r}), not one token id per "
                             f"input id; CausalLMCollator collates causal LM rows: for other tasks (e.g. sequence "
                             f"classification) pass a data_collator, such as transformers.DataCollatorWithPadding")
        for name in ("label", "label_ids"):   # the classification columns the Trainer renames to labels
            if row.get("labels") is None and row.get(name) is not None:
                raise ValueError(f"Invalid labels: row {k} has {name!r} ({row[name]!r}) but no 'labels', so "
                                 f"CausalLMCollator would label it with its own input ids (language modelling) "
                                 f"and ignore {name!r}; for classification pass a data_collator (e.g. "
                                 f"transformers.DataCollatorWithPadding) and a per_example_loss, for language "
                                 f"modelling remove the column")
        labels = _token_ids(k, "labels", row["labels"]) if row.get("labels") is not None else None
        if labels is not None and len(labels) != len(ids):
            raise ValueError(f"Invalid labels: example has {len(labels)} labels for {len(ids)} input ids")
        if row.get("attention_mask") is not None:
            mask = _as_list(row["attention_mask"])
            if len(mask) != len(ids) or any(m not in (0, 1) for m in mask):
                raise ValueError(f"Invalid attention_mask: row {k} needs one 0/1 entry per input id")
            kept = [t for t, m in enumerate(mask) if m]
            if kept and kept[-1] - kept[0] + 1 != len(kept):
                raise ValueError(f"Invalid attention_mask: row {k} has padding between its tokens "
                                 f"(expected left or right padding only)")
            ids = [ids[t] for t in kept]
            labels = None if labels is None else [labels[t] for t in kept]
        if not ids:
            raise ValueError(f"Invalid input_ids: row {k} has no tokens (after removing its padding)")
        return ids, (ids if labels is None else labels)


def _is_sequence(values) -> bool:
    """A list, tuple or array of ids; not one number (a Python int, a 0-d tensor or numpy scalar)."""
    return getattr(values, "ndim", None) != 0 and not isinstance(values, (int, float, str, bytes))


def _as_list(values) -> list:
    """A row's column as a list of Python numbers (a 0-d tensor or numpy scalar entry as its number)."""
    if hasattr(values, "tolist"):
        return values.tolist()
    return [v.item() if getattr(v, "ndim", None) == 0 and hasattr(v, "item") else v for v in values]


def _token_ids(k: int, name: str, values) -> list[int]:
    """Row k's ``input_ids`` or ``labels`` as ints. A float or bool id was cast silently (5.7 became
    token 5, True token 1), and a nested row ([1, T], a tokenizer's ``return_tensors`` output) was
    named as a bad attention_mask or failed inside torch."""
    if _integer_array(values):   # a 1-D tensor or array of an integer dtype: every entry is an int
        return values.tolist()
    ids = _as_list(values)
    for v in ids:
        try:
            check_int(name, v)
        except ValueError:
            raise ValueError(f"Invalid {name}: row {k} holds {v!r} (expected one integer token id per position, "
                             f"as ints, not floats, bools or nested lists)") from None
    return [int(v) for v in ids]


def _integer_array(values) -> bool:
    """A 1-D torch tensor or numpy array of an integer dtype (not bool), checked by its dtype, not entry by entry."""
    dtype, ndim = getattr(values, "dtype", None), getattr(values, "ndim", None)
    if ndim != 1 or dtype is None:
        return False
    if isinstance(dtype, torch.dtype):
        return not (dtype.is_floating_point or dtype.is_complex or dtype == torch.bool)
    return getattr(dtype, "kind", None) in ("i", "u")   # numpy's signed and unsigned integer kinds


def _trainer_mezo(groups, **settings) -> MeZO:
    """A MeZO whose closure-less ``step()`` does nothing.

    The Trainer calls ``optimizer.step()`` after ``training_step``; the ZO step (both forwards and
    the update) already happened inside ``training_step``, where the batch and weights are known.
    A plain MeZO with its own ``step``, not a subclass: a ``SeedLog`` of the run then names its
    optimiser "MeZO", and ``SeedLog.replay`` rebuilds the weights (a subclass's log could be
    replayed only through that private class).
    """
    optimizer = MeZO(groups, **settings)
    optimizer.step = types.MethodType(_step_with_closure, optimizer)   # a method: lr schedulers wrap it
    return optimizer


def _step_with_closure(self, closure=None, weights=None):
    if closure is None:
        return None
    return MeZO.step(self, closure, weights)


class _StepTickets(torch.utils.data.Dataset):
    """What the Trainer's train dataloader iterates: one ticket per step of an epoch."""

    def __init__(self, steps: int):
        self.steps = steps

    def __len__(self) -> int:
        return self.steps

    def __getitem__(self, k: int) -> int:
        return k


def _ticket_batch(tickets: list[int]) -> dict[str, torch.Tensor]:
    return {"zo_step": torch.tensor(tickets)}


class _StepStats:
    """The per-step values logged at the next log, as running totals: the same size after any number
    of steps (with ``logging_strategy="no"`` no log ever clears them; a list grew by a tuple a step)."""

    def __init__(self):
        self.steps, self.grad_sum, self.max_weight, self.ess_sum = 0, 0.0, -math.inf, 0.0

    def add(self, grad: float, max_weight: float, ess: float) -> None:
        self.steps += 1
        self.grad_sum += grad
        self.max_weight = max(self.max_weight, max_weight)
        self.ess_sum += ess


class _ZOCallbackHandler(CallbackHandler):
    """The Trainer's callback handler, except that ``on_pre_optimizer_step`` comes from
    ``ZOTrainer.training_step``, before the ZO update: the Trainer's loop calls it after
    ``training_step``, where the ZO update has already been made."""

    epoch_offset = 0.0   # set on resume: nonzero after a change of batch size (ZOTrainer._rebase_epochs)

    def on_pre_optimizer_step(self, args, state, control, **kwargs):
        return control   # already called, before the update (ZOTrainer.training_step)

    def on_step_end(self, args, state, control, **kwargs):
        # the Trainer has just set state.epoch = global_step / (steps per epoch at this batch size)
        state.epoch += self.epoch_offset
        return super().on_step_end(args, state, control, **kwargs)

    def before_zo_update(self, args, state, control, **kwargs):
        return super().on_pre_optimizer_step(args, state, control, **kwargs)


class ZOTrainer(Trainer):
    """A ``transformers.Trainer`` that fine-tunes by MeZO steps, with uniform or SAZO batches.

    Args:
        model, args, data_collator, train_dataset, eval_dataset, processing_class: as for
            ``Trainer``. ``train_dataset`` must be map-style with a length (the sampler draws
            indices), one split: a dict of splits (a ``DatasetDict``) is refused. With no ``data_collator``, ``CausalLMCollator`` right-pads (pad id from
            ``processing_class``, else the model config, else 0).
        method: a sampler by name: "mezo" or "uniform" (uniform minibatches), "sazo" or "sazo-plain"
            (importance sampling from the diffs; ``sazo_lite.samplers.make_sampler``).
        eps: ε > 0, the perturbation radius.
        perturbation: "gaussian" or "rademacher" z.
        ema_decay, uniform_mix: SAZO's β ∈ [0, 1) and λ ∈ (0, 1] (see ``SAZOSampler``); None: the
            sampler's defaults 0.9 and 0.1. Refused with "mezo"/"uniform", whose batches do not use them.
        zo_seed: seed of MeZO's directions; default ``args.seed`` (a search trial's; read again by each
            ``train()`` that builds a new MeZO). The sampler uses ``args.data_seed`` when set, else zo_seed + 1.
        per_example_loss: ``(outputs, inputs) -> losses [B]``; default ``causal_lm_losses`` on
            ``outputs.logits`` and ``inputs["labels"]``.
        master_weights: "auto" (a float32 master copy when a trainable tensor is bf16/fp16),
            True (always; a float64 tensor's master is float64, ``precision.master_dtype``) or False.
        check_ranks: under data parallel, each step also checks that every rank's MeZO holds the same step,
            seed, settings and weights (``distributed.same_batch``'s ``optimizer``: one read of the tuned
            tensors per step), so a rank resumed from other weights is a ValueError on every rank before the
            step. Off by default; without a process group it does nothing.
        **kwargs: the Trainer's other arguments (compute_metrics, callbacks, ...). ``optimizers``
            is refused (the optimiser is MeZO), and so are ``compute_loss_func`` and a subclass's
            ``compute_loss`` (steps need per-example losses: use ``per_example_loss``).

    Raises:
        ValueError: on bad settings, before any training (see ``_check_settings``): in ``__init__``, and in
            ``train()`` for args edited since (``trainer.args.gradient_accumulation_steps = 2``).

    Example:
        >>> args = TrainingArguments("out", max_steps=20, per_device_train_batch_size=4,
        ...                          learning_rate=1e-3, report_to=[])          # doctest: +SKIP
        >>> ZOTrainer(model, args, train_dataset=rows, method="sazo").train()   # doctest: +SKIP
    """

    def __init__(self, model=None, args=None, data_collator=None, train_dataset=None, eval_dataset=None,
                 processing_class=None, *, method: str = "sazo", eps: float = 1e-3,
                 perturbation: str = "gaussian", ema_decay: float | None = None, uniform_mix: float | None = None,
                 zo_seed: int | None = None, per_example_loss=None, master_weights="auto",
                 check_ranks: bool = False, **kwargs):
        self.method = check_choice("method", method, METHODS)
        self.check_ranks = check_ranks   # checked by its setter, below
        if kwargs.get("optimizers", (None, None)) != (None, None):
            raise ValueError("Invalid optimizers: ZOTrainer builds its own MeZO optimiser and lr schedule "
                             "from args (learning_rate, weight_decay, lr_scheduler_type)")
        # "auto" or a bool exactly: 1 passed `in ("auto", True, False)` and was then read as off (`is True`)
        if isinstance(master_weights, str) and master_weights == "auto":
            master_weights = "auto"       # a str subclass (numpy's str_) as the plain str
        elif not isinstance(master_weights, bool):
            raise ValueError(f"Invalid master_weights: {master_weights!r} (expected 'auto', True or False)")
        if per_example_loss is not None and not callable(per_example_loss):
            raise ValueError(f"Invalid per_example_loss: {per_example_loss!r} (expected a callable)")
        _check_loss_hooks(type(self), kwargs)
        own_collator = data_collator is None
        if own_collator and model is not None:
            data_collator = CausalLMCollator(_pad_token_id(processing_class, model))
        super().__init__(model=model, args=args, data_collator=data_collator, train_dataset=train_dataset,
                         eval_dataset=eval_dataset, processing_class=processing_class, **kwargs)
        self.callback_handler.__class__ = _ZOCallbackHandler   # on_pre_optimizer_step before the update
        if own_collator and model is None and self.model is not None:   # model_init=: the model exists now
            self.data_collator = CausalLMCollator(_pad_token_id(processing_class, self.model))
        changes = {}
        if self.args.dataloader_pin_memory and not _has_accelerator():
            # Pinning needs an accelerator: without one torch ignores pin_memory and warns at every
            # evaluation loader.
            changes["dataloader_pin_memory"] = False
        if self.args.ignore_data_skip:
            # Skipping the step tickets of a resumed epoch costs nothing, and the sampler's state holds
            # where the data stands. Not skipping restarted the epoch count (step 4 logged epoch 1.5
            # after step 3's 1.5) and moved the "epoch" strategies' ends.
            changes["ignore_data_skip"] = False
        if changes:   # a copy, so the user's args object is left as it was
            self.args = copy.copy(self.args)
            for name, value in changes.items():
                setattr(self.args, name, value)
        self.eps, self.perturbation, self.master_weights = eps, perturbation, master_weights
        self.zo_seed = self.args.seed if zo_seed is None else zo_seed
        self._zo_seed_given = zo_seed   # None: zo_seed follows args.seed (a search trial may set it)
        self._sampler_settings = (ema_decay, uniform_mix)
        self.per_example_loss = per_example_loss or _causal_lm_loss
        if self.args.label_names is None and not self.label_names:
            # The losses read inputs["labels"]: without this a model whose forward takes no
            # ``labels`` (a plain module) would have that column dropped from its rows (the
            # collator then scored every token) and evaluate() would pass labels to forward.
            # The Trainer's own names are kept when it finds some (a QA model's start_positions
            # and end_positions: replacing them lost eval_loss).
            self.label_names = ["labels"]
        self._check_settings(ema_decay, uniform_mix)
        self._sampler_seed_made = None   # the seed the sampler ZOTrainer made was given (None: none made)
        self.zo_sampler = self._make_sampler(ema_decay, uniform_mix) if train_dataset is not None else None
        self._master = None             # Float32Master when tuning half-precision weights
        self._zo_data = None            # (dataset, collator) used by training_step
        self._zo_last_batch = None      # this rank's last collated batch (token and FLOP counts)
        self._zo_pending = _StepStats()   # |g|, max w and ESS fraction of the steps since the last log
        self._zo_resume = None          # a checked zo_state, applied by create_optimizer on resume
        self._zo_queries = 0            # per-example forwards since MeZO was built (zo_queries)
        self._zo_logged_weights = None  # _weights_checksum() after the last step, where a SeedLog records
        self._zo_sampler_start = None   # the sampler's state before the first step (see _restart_sampler)
        self._zo_classes = None         # the logits' last size in the check before training (label ids' range)

    # -- settings ----------------------------------------------------------------------------
    @property
    def check_ranks(self) -> bool:
        """Whether each data-parallel step also checks that every rank's MeZO holds the same step, seed, settings
        and weights (``distributed.same_batch(..., optimizer)``)."""
        return self._check_ranks

    @check_ranks.setter
    def check_ranks(self, value) -> None:   # set after construction too: an int or a string read as on/off by truthiness
        self._check_ranks = check_bool("check_ranks", value)

    def _check_settings(self, ema_decay, uniform_mix) -> None:
        """Every bad setting fails here, in ``__init__`` and again in ``train()`` (args edited since), before a
        single step."""
        args = self.args
        # Build throwaway copies: the engine and sampler validate their own arguments.
        trainable = [p for p in self.model.parameters() if p.requires_grad] if self.model is not None else []
        MeZO(trainable or [torch.zeros(1)], lr=args.learning_rate, eps=self.eps, weight_decay=args.weight_decay,
             perturbation=self.perturbation, seed=self.zo_seed, noise=None)
        _check_sampler_settings(self.method, ema_decay, uniform_mix)
        make_sampler(sampler_name(self.method), 1, seed=self._sampler_seed(), **_given(ema_decay, uniform_mix))
        default_optim = TrainingArguments.__dataclass_fields__["optim"].default
        if OptimizerNames(args.optim) != OptimizerNames(default_optim) or args.optim_args or args.optim_target_modules:
            raise ValueError(f"Invalid optim: {str(getattr(args.optim, 'value', args.optim))!r} / optim_args / "
                             f"optim_target_modules: ZOTrainer's optimiser is MeZO (learning_rate and "
                             f"weight_decay come from args); leave optim at its default {default_optim!r}")
        for name in ("adam_beta1", "adam_beta2", "adam_epsilon"):   # AdamW's, set for it and then unused
            if getattr(args, name) != TrainingArguments.__dataclass_fields__[name].default:
                raise ValueError(f"Invalid {name}: {getattr(args, name)!r} (ZOTrainer's optimiser is MeZO, which keeps "
                                 f"no moments; leave it at its default)")
        clip, default_clip = args.max_grad_norm, TrainingArguments.__dataclass_fields__["max_grad_norm"].default
        if clip not in (None, 0, default_clip):   # the default (and "no clipping") pass: nobody asked for it
            raise ValueError(f"Invalid max_grad_norm: {clip!r} (ZO steps have no gradient to clip; leave it at its "
                             f"default {default_clip!r} or 0)")
        if args.per_device_train_batch_size < 1:
            raise ValueError(f"Invalid per_device_train_batch_size: {args.per_device_train_batch_size} "
                             f"(expected >= 1 examples per step and device)")
        if args.gradient_accumulation_steps != 1:
            raise ValueError(f"Invalid gradient_accumulation_steps: {args.gradient_accumulation_steps} "
                             f"(ZO has no gradients to accumulate: raise per_device_train_batch_size)")
        if args.label_smoothing_factor:
            raise ValueError("Invalid label_smoothing_factor: ZOTrainer's per-example losses do not smooth")
        if args.auto_find_batch_size:
            raise ValueError("Invalid auto_find_batch_size: the sampler's batch size is fixed")
        if self.accelerator.mixed_precision == "fp16" and not self.accelerator.native_amp:
            # accelerate autocasts float16 on accelerators only and says nothing on a CPU
            raise ValueError(f"Invalid fp16: True on {self.args.device.type!r}, where accelerate does not autocast to "
                             f"float16, so the forwards would run in float32; use bf16=True (CPU autocast), a model "
                             f"loaded in float16 (tuned through a float32 master), or leave fp16 off")
        if args.train_sampling_strategy != "random":
            raise ValueError(f"Invalid train_sampling_strategy: {args.train_sampling_strategy!r} (the ZO sampler "
                             f"draws every batch i.i.d.; leave it at 'random')")
        if args.neftune_noise_alpha is not None:
            raise ValueError("Invalid neftune_noise_alpha: ZO steps run the model in eval mode (both passes must "
                             "see the same function), where NEFTune adds no noise")
        self._check_full_eval()
        if self.per_example_loss is _causal_lm_loss and "labels" not in self.label_names:
            raise ValueError(f"Invalid label_names: {self.label_names} (the default per_example_loss scores "
                             f"inputs['labels']; keep 'labels' or pass per_example_loss=(outputs, inputs) -> [B])")
        if args.load_best_model_at_end and args.save_only_model and self._weights_not_in_checkpoint():
            raise ValueError("Invalid save_only_model: True with load_best_model_at_end and a peft p-tuning model "
                             "(or prefix tuning with prefix_projection), "
                             "whose saved weights are its prompt encoder's output only: the best checkpoint would "
                             "load as another prompt (zo_state.pt, which holds the tensors, is not written with "
                             "save_only_model)")
        if self.is_deepspeed_enabled or self.is_fsdp_enabled:
            raise ValueError("Invalid parallelism: ZOTrainer supports data parallel (DDP) launches only")
        dataset = self.train_dataset
        if dataset is not None:   # without one nothing trains: a frozen model may be evaluated
            if self.model is not None and not any(p.requires_grad for p in self.model.parameters()):
                raise ValueError("Invalid model: no parameter requires grad, so there is nothing to tune")
            if isinstance(dataset, Mapping):   # load_dataset(...)'s DatasetDict: its length counts the splits
                raise ValueError(f"Invalid train_dataset: a {type(dataset).__name__} keyed {sorted(map(str, dataset))[:5]} "
                                 f"(its length {len(dataset)} counts its entries, not examples, and the sampler draws "
                                 f"integer indices); pass one split, such as train_dataset=data['train']")
            if isinstance(dataset, torch.utils.data.IterableDataset) or not hasattr(dataset, "__len__"):
                raise ValueError("Invalid train_dataset: ZO sampling draws indices, so it needs a map-style "
                                 "dataset with a length (not an IterableDataset)")
            if len(dataset) == 0:
                raise ValueError("Invalid train_dataset: it is empty")

    def _check_full_eval(self) -> None:
        """``bf16_full_eval`` / ``fp16_full_eval`` with a model of another float dtype: an ``evaluate()`` outside
        ``train()`` (a baseline before training, or one after) casts the model in place (the Trainer's
        ``evaluation_loop``), so the float32 weights, frozen and tuned, were rounded to half precision for good and
        the next ``train()`` tuned a half-precision model (through a master started from the rounded weights)."""
        args = self.args
        dtype = torch.float16 if args.fp16_full_eval else torch.bfloat16 if args.bf16_full_eval else None
        if dtype is None or self.model is None:
            return
        other = sorted({str(p.dtype) for p in self.model.parameters() if p.is_floating_point() and p.dtype != dtype})
        if other:
            name = "fp16_full_eval" if args.fp16_full_eval else "bf16_full_eval"
            raise ValueError(f"Invalid {name}: True with a model in {', '.join(other)}: evaluate() outside train() "
                             f"casts the model to {dtype} in place, rounding its weights for good (the next train() "
                             f"tunes the rounded model); use {name[:4]}=True (autocast, the weights stay as they are) "
                             f"or load the model in {dtype}")

    def create_accelerator_and_postprocess(self) -> None:
        # Loss scaling exists for backward passes; ZO has none (and GradScaler.step asserts on
        # parameters without gradients), so the scaler is dropped before the optimiser is wrapped,
        # here because a hyperparameter search trial builds a new accelerator (with a new scaler).
        super().create_accelerator_and_postprocess()
        self.accelerator.scaler = None

    def _hp_search_setup(self, trial) -> None:
        # private, kept: the one place a hyperparameter_search trial's values enter args (inside
        # train(), after model_init built the trial's model). They are checked as __init__ checks
        # args (a trial's gradient_accumulation_steps=2 ran two ZO steps per step), the seeds
        # follow them (zo_seed and the sampler kept __init__'s seed in every trial), and the
        # model is checked as train() checks it (the search had released the last trial's).
        super()._hp_search_setup(trial)
        if self.hp_search_backend is None or trial is None:
            return
        if self._zo_seed_given is None:
            self.zo_seed = self.args.seed
        self._check_settings(*self._sampler_settings)
        if self.train_dataset is not None:
            self.zo_sampler, self._zo_sampler_start = self._make_sampler(*self._sampler_settings), None
            self._check_model_and_data()

    def _make_sampler(self, ema_decay, uniform_mix):
        n, seed = len(self.train_dataset), self._sampler_seed()   # the same seed on every rank
        sampler = make_sampler(sampler_name(self.method), n, seed=seed, **_given(ema_decay, uniform_mix))
        self._sampler_seed_made = seed      # the seed args gave (_follow_seeds: a sampler set by hand is kept)
        return sampler

    def _sampler_seed(self) -> int:
        """``args.data_seed`` ("the seed of the data samplers") when set, else zo_seed + 1."""
        return self.zo_seed + 1 if self.args.data_seed is None else self.args.data_seed

    @property
    def zo_optimizer(self) -> MeZO:
        """The MeZO optimiser (``self.optimizer`` may be accelerate's wrapper around it)."""
        return getattr(self.optimizer, "optimizer", self.optimizer)

    def global_batch_size(self) -> int:
        """B: examples per step over all ranks (each rank evaluates B / world_size of them)."""
        return self._train_batch_size * self.args.world_size

    # -- optimiser -----------------------------------------------------------------------------
    def create_optimizer(self, model=None):
        if self.optimizer is None:
            net = self.accelerator.unwrap_model(model if model is not None else self.model)
            params = [p for p in net.parameters() if p.requires_grad]
            self._master = None
            if self._wants_master(params):
                from .precision import Float32Master

                self._master = Float32Master(params)
                params = self._master.tensors
            self.optimizer = _trainer_mezo(self._decay_groups(net, params), lr=self.args.learning_rate, eps=self.eps,
                                           weight_decay=self.args.weight_decay, perturbation=self.perturbation,
                                           seed=self.zo_seed)
            self._zo_queries = 0   # a new optimiser (first train(), or model_init's new model) starts the count
            self._zo_logged_weights = None
            self._restart_sampler()
        if self._zo_resume is not None:  # resuming: the Trainer has loaded the model's weights by now
            self._apply_zo_state(self._zo_resume)
            self._zo_resume = None
            self._rebase_epochs()   # and its state (trainer_state.json) by now
        return self.optimizer

    def _rebase_epochs(self) -> None:
        """On resume, epochs go on from the checkpoint's (``self.state``, loaded from it by now): after
        a change of B (now or in an earlier resume) the Trainer counted the checkpoint's steps as
        steps of this B, so the logged epoch fell back (1.0, then 0.75); with B unchanged since the
        start the offset is 0. Later checkpoints record the B their steps use (they kept the checkpoint's)."""
        epoch, step = float(self.state.epoch or 0.0), int(self.state.global_step)
        self.state.train_batch_size = self._train_batch_size
        per_epoch = self._steps_per_epoch()   # the Trainer's epoch at that step and the new B, as its loop writes it
        self.callback_handler.epoch_offset = epoch - (step // per_epoch + (step % per_epoch) / per_epoch)

    def _decay_groups(self, net, params) -> list[dict]:
        """``params`` (net's trainable tensors or their masters, in order) as param groups: weight
        decay on the tensors the Trainer decays, none on biases and norms (``get_decay_parameter_names``,
        as the Trainer's AdamW and MeZO's reference code; every tensor was decayed). Groups are
        contiguous runs, so tensor k keeps its z (MeZO seeds z by position) and weight_decay=0 is
        one group, as before."""
        decayed = set(self.get_decay_parameter_names(net))
        names = [name for name, p in net.named_parameters() if p.requires_grad]
        groups = []
        for name, p in zip(names, params):
            decay = self.args.weight_decay if name in decayed else 0.0
            if groups and groups[-1]["weight_decay"] == decay:
                groups[-1]["params"].append(p)
            else:
                groups.append({"params": [p], "weight_decay": decay})
        return groups

    def _restart_sampler(self) -> None:
        """A new MeZO is a new run: with ``model_init`` every ``train()`` builds a new model and
        optimiser from the same seeds, and the sampler went on from the last run's state, so a
        rerun drew other batches. It now starts again from its state before the first step."""
        if self.zo_sampler is None:
            return   # no train_dataset: nothing to restart (train() refuses)
        if self._zo_sampler_start is None:
            self._zo_sampler_start = copy.deepcopy(self.zo_sampler.state_dict())
        else:
            self.zo_sampler.load_state_dict(self._zo_sampler_start)

    def _wants_master(self, params) -> bool:
        half = any(p.dtype in HALF_DTYPES for p in params)
        return self.master_weights is True or (self.master_weights == "auto" and half)

    # Private Trainer methods kept overridden, for want of a public hook: the Trainer calls them
    # on every step. Without them it would clip and measure gradients that do not exist and log
    # grad_norm = 0 each step; ``max_grad_norm`` cannot be turned off without editing the user's args.
    def _clip_grad_norm(self, model):
        return None  # no gradients

    def _get_grad_norm(self, model, grad_norm=None):
        return None  # nothing to log as grad_norm (zo_projected_grad is logged instead)

    # -- data ----------------------------------------------------------------------------------
    def get_train_dataloader(self) -> DataLoader:
        """Step tickets, ceil(N / B) per epoch (floor with ``dataloader_drop_last``); the batches
        themselves come from ``zo_sampler``."""
        if self.train_dataset is None:
            raise ValueError("Trainer: training requires a train_dataset.")
        if self.zo_sampler is None or self.zo_sampler.num_examples != len(self.train_dataset):
            raise ValueError("Invalid train_dataset: set it when building ZOTrainer (the sampler is sized by it)")
        self._zo_data = self._training_data()
        return DataLoader(_StepTickets(self._steps_per_epoch()), batch_size=1, collate_fn=_ticket_batch)

    def _steps_per_epoch(self) -> int:
        """ceil(N / B), or floor(N / B) with ``dataloader_drop_last``: as many steps as the Trainer's
        loader has batches (the full ones only); at least one, since i.i.d. draws never run out."""
        n, b = len(self.train_dataset), self.global_batch_size()
        return max(1, n // b) if self.args.dataloader_drop_last else math.ceil(n / b)

    def _training_data(self):
        """(dataset, collator) as training_step reads them: unused columns removed."""
        dataset, collator = self.train_dataset, self.data_collator
        if is_datasets_available() and isinstance(dataset, _datasets().Dataset):
            dataset = self._remove_unused_columns(dataset, description="training")
        else:
            collator = self._get_collator_with_removed_columns(collator, description="training")
        return dataset, collator

    def _check_model_and_data(self) -> None:
        """Run the model once on the first examples (no_grad, nothing changes) and refuse a
        collator, model or per_example_loss the step could not use, before training starts."""
        dataset, collator = self._training_data()
        rows = [dataset[i] for i in range(min(PROBE_EXAMPLES, len(dataset)))]
        try:
            batch = collator(rows)
        except ValueError:
            raise
        except Exception as error:
            raise ValueError(f"Invalid data_collator: it failed on the first training examples "
                             f"({type(error).__name__}: {error})") from error
        default = self.per_example_loss is _causal_lm_loss
        if not isinstance(batch, Mapping):
            raise ValueError(f"Invalid data_collator: it returned {type(batch).__name__} (expected a dict of tensors)")
        if default and not isinstance(batch.get("labels"), torch.Tensor):
            raise ValueError("Invalid data_collator: its batches have no 'labels' tensor, which the default "
                             "per_example_loss scores (add labels, or pass per_example_loss=(outputs, inputs) -> [B])")
        batch = self._prepare_inputs(batch)
        net = self.accelerator.unwrap_model(self.model)
        check_adapters_read(net, [p for p in net.parameters() if p.requires_grad])   # merged adapters: nothing to tune
        _check_input_ids(net, batch, list(range(len(rows))))
        training = net.training
        net.eval()
        try:
            with torch.no_grad(), self.compute_loss_context_manager():
                outputs = net(**self._model_inputs(batch))
            if default:
                logits, labels, skip = _logits(outputs), batch["labels"], _virtual_tokens(net)
                shape = [*labels.shape[:1], labels.shape[1] + skip] if labels.dim() == 2 else None
                if not _class_rows(logits, labels) and (not isinstance(logits, torch.Tensor) or logits.dim() != 3
                                                        or list(logits.shape[:2]) != shape):
                    got = (f"outputs of type {type(outputs).__name__}" if logits is None
                           else f"logits of shape {tuple(getattr(logits, 'shape', ()))}")
                    over = f" ({skip} virtual tokens + T)" if skip else ""
                    raise ValueError(f"Invalid model: the default per_example_loss needs a causal LM's outputs.logits "
                                     f"[B, T, V] over labels [B, T]{over}, or a classifier's logits [B, C >= 2] over "
                                     f"integer labels [B]; the labels are {labels.dtype} {list(labels.shape)}, got {got}; pass "
                                     f"per_example_loss=(outputs, inputs) -> losses [B]")
                self._zo_classes = logits.shape[-1]
                _check_label_ids(self._zo_classes, batch["labels"], list(range(len(rows))))
                _check_scored(batch["labels"], list(range(len(rows))), None, not _unshifted(net))
            try:
                losses = self._per_example_losses(outputs, batch, list(range(len(rows))))
            except Exception as error:
                raise ValueError(f"Invalid per_example_loss: it raised on the first training examples "
                                 f"({type(error).__name__}: {error})") from error
        finally:
            net.train(training)
        _check_loss_shape(losses, len(rows), "on the first training examples")

    def num_examples(self, dataloader: DataLoader) -> int:
        if isinstance(dataloader.dataset, _StepTickets):
            return len(self.train_dataset)
        return super().num_examples(dataloader)

    def _collate(self, indices: torch.Tensor) -> dict[str, torch.Tensor]:
        """This rank's examples as a batch. A failure names them and the step: the collator's "row k" is
        the batch's k-th, and torch's errors on a token id beyond the model's embeddings name neither."""
        dataset, collator = self._zo_data
        examples = [int(i) for i in indices]
        try:
            batch = self._prepare_inputs(collator([dataset[i] for i in examples]))
        except Exception as error:
            alone = [i for i in dict.fromkeys(examples) if not _collates(collator, dataset, i)]   # the culprits
            raise ValueError(f"Invalid train_dataset: {_named(alone or examples, self.state.global_step + 1)} could "
                             f"not be collated ({type(error).__name__}: {error})") from error
        _check_input_ids(self.accelerator.unwrap_model(self.model), batch, examples, self.state.global_step + 1)
        if self.per_example_loss is _causal_lm_loss:   # before any pass moves θ (the logits' size is the probe's)
            _check_label_ids(self._zo_classes, batch.get("labels"), examples, self.state.global_step + 1)
            _check_scored(batch.get("labels"), examples, self.state.global_step + 1,
                          not _unshifted(self.accelerator.unwrap_model(self.model)))
        return batch

    # -- the step ------------------------------------------------------------------------------
    def training_step(self, model, inputs, num_items_in_batch=None) -> torch.Tensor:
        """One MeZO step on a batch the ZO sampler chose; returns the step's loss (a 0-d tensor).

        The passes run in eval mode; the model leaves the step in train mode, as the Trainer's own
        ``training_step`` leaves it (callbacks, evaluation and the code after ``train()`` see the
        mode they would see with ``Trainer``; a model left in eval mode stayed there silently). Every
        ``torch_empty_cache_steps`` steps it empties the device cache after the step, as the Trainer's does.
        """
        # the Trainer's callbacks see the weights the update starts from, as after its backward
        self.control = self.callback_handler.before_zo_update(self.args, self.state, self.control)
        net = self.accelerator.unwrap_model(model)
        net.eval()  # the + and − passes must see the same function
        try:
            loss = self._zo_step(net)
        finally:
            net.train()
        steps = self.args.torch_empty_cache_steps
        if steps is not None and self.state.global_step % steps == 0:
            # as the Trainer's own training_step (this one replaces it): the setting was silently ignored
            clear_device_cache()
            if torch.backends.mps.is_available() and hasattr(torch.mps, "clear_graph_cache"):
                torch.mps.clear_graph_cache()
        return loss

    def _zo_step(self, net) -> torch.Tensor:
        self._check_tuned_tensors(net)
        if self._master is not None:
            self._master_follows_writes()
        self._check_logged_weights()
        indices, weights = self.zo_sampler.sample(self.global_batch_size())
        # every rank must hold the same batch (a sampler of another seed or state drew another): the gather would
        # join the losses of two batches as one, without a word; ValueError on every rank, before anything moves
        same_batch(indices, self.zo_optimizer if self.check_ranks else None)   # check_ranks: MeZO's weights too
        rank, world = rank_and_world()
        batch_indices = shard(indices, rank, world)
        batch = self._collate(batch_indices)  # this rank's B/W examples
        self._zo_last_batch = batch

        def losses() -> torch.Tensor:  # the global [B], identical on every rank
            if self._master is not None:
                self._master.sync()
            with self.compute_loss_context_manager():
                outputs = net(**self._model_inputs(batch))
            mine = self._per_example_losses(outputs, batch, [int(i) for i in batch_indices], self.state.global_step + 1)
            _check_loss_shape(mine, len(batch_indices), f"at step {self.state.global_step + 1}")
            # float64, as MeZO reads losses: float32 rounded a float64 loss's f(θ+εz) − f(θ−εz) (eps=1e-7 on
            # a float64 model: g off by a few %); float32 and half losses convert exactly, as before
            values = gather_losses(mine.double())
            _check_finite_losses(values, indices, self.state.global_step + 1)
            return values

        try:
            out = self.zo_optimizer.step(losses, weights)
        finally:   # the model holds where the master stands: updated, or back at θ after a refused step
            # Ctrl-C held: mid-sync it left tensors a step behind the master, which the next step's
            # write check then took as a callback's writes (the master lost the step on them)
            with InterruptsDeferred():
                if self._master is not None:
                    self._master.sync()
                self._zo_logged_weights = self._weights_checksum()   # where a seed log's replay stands now
        self.zo_sampler.update(indices, out.directional_diffs)
        self._zo_queries += 2 * self.global_batch_size()
        w = weights.double()
        self._zo_pending.add(abs(out.projected_grad), float(w.max()), float(w.sum() ** 2 / (w ** 2).sum()) / len(w))
        return torch.tensor(out.loss, dtype=torch.float32, device=self.args.device)

    def _check_tuned_tensors(self, net) -> None:
        """Refuse a step when the model's trainable tensors are no longer those MeZO was built over (a
        tensor's requires_grad cleared or set by a callback or between ``train()`` calls, a tensor or the
        model replaced): MeZO perturbed and updated the tensors it was built with, so a frozen tensor kept
        moving (the Trainer's AdamW skips it: no gradient), and those of a replaced model moved out of its
        sight. Nothing has moved yet."""
        tuned = (self._master.params if self._master is not None
                 else [p for group in self.zo_optimizer.param_groups for p in group["params"]])
        now = [p for p in net.parameters() if p.requires_grad]
        if len(now) == len(tuned) and all(a is b for a, b in zip(now, tuned)):
            # merged, disabled or inactive peft adapters (merge_adapter() by a callback or between train() calls):
            # every step moved them with δ = 0, the engine's flat-loss warning judging only an optimiser's first steps
            check_adapters_read(net, tuned)
            return
        names = {id(p): name for name, p in net.named_parameters()}
        frozen = [names[id(p)] for p in tuned if id(p) in names and not p.requires_grad]
        added = [names[id(p)] for p in now if all(p is not q for q in tuned)]
        raise ValueError(f"Invalid model: its trainable tensors changed since ZOTrainer built its MeZO optimiser "
                         f"(now frozen: {frozen[:3]}, now trainable or new: {added[:3]}); MeZO would go on "
                         f"perturbing and updating the tensors it was built with. Set requires_grad before the "
                         f"first train(), or build a new ZOTrainer for the new set")

    def _weights_checksum(self) -> tuple[set, dict] | None:
        """(ids of the SeedLogs recording MeZO, the logs' own sums of the tuned tensors: ``seedlog._fingerprint``),
        or None without a log."""
        from .seedlog import SeedLog, _fingerprint

        logs = {id(hook) for hook in self.zo_optimizer._step_hooks.values() if isinstance(hook, SeedLog)}
        if not logs:
            return None
        return logs, _fingerprint(self.zo_optimizer)[1]

    def _check_logged_weights(self) -> None:
        """Refuse a step when θ changed since the last step (a callback wrote the weights, or code
        between ``train()`` calls) and a SeedLog recording both steps is attached: a log records
        steps only, so its replay silently rebuilt other weights. Nothing has moved yet."""
        from .seedlog import _same_weights

        last = self._zo_logged_weights
        if last is None:   # no log recorded the last step: nothing to compare, no checksum taken
            return
        now = self._weights_checksum()
        if now is None or not last[0] & now[0]:
            return   # no log, or every log was attached since the last step (it starts from θ as it is)
        if not _same_weights(last[1], now[1]):
            raise ValueError("Invalid weights: the tuned weights changed since the last MeZO step (a callback or "
                             "code between steps wrote them, or load_best_model_at_end or a resume loaded "
                             "others), and a SeedLog records this optimiser: it logs steps only, so replaying it "
                             "would not rebuild them. Write the weights before SeedLog.attach, or attach a new "
                             "log after")

    def _per_example_losses(self, outputs, inputs, examples=None, step=None) -> torch.Tensor:
        """``per_example_loss(outputs, inputs)``. The default loss's labels get a peft prompt's virtual
        tokens in front, as peft's forward does to labels (the logits cover them): without, a prompt-tuned
        model's logits [B, P + T, V] were refused as not matching its labels [B, T]. The logits at t of an
        encoder-decoder model (its decoder inputs are the labels shifted right), a masked LM or a token
        classifier score label t (``_unshifted``): the causal shift scored label t + 1, silently."""
        net = self.accelerator.unwrap_model(self.model)
        if self.per_example_loss is not _causal_lm_loss:
            return self.per_example_loss(outputs, inputs)
        logits = _logits(outputs)
        classes = logits.shape[-1] if isinstance(logits, torch.Tensor) else None
        _check_label_ids(classes, inputs["labels"], examples, step)
        if _class_rows(logits, inputs["labels"]):   # a sequence classifier's logits [B, C], one class id per example
            return _unshifted_loss({"logits": logits[:, None]}, {"labels": inputs["labels"][:, None]})
        if _unshifted(net):
            return _unshifted_loss(outputs, inputs)
        skip = _virtual_tokens(net)
        if skip:
            inputs = {**inputs, "labels": torch.nn.functional.pad(inputs["labels"], (skip, 0), value=IGNORE)}
        return self.per_example_loss(outputs, inputs)

    def _label_columns(self) -> set:
        """The columns per_example_loss reads and forwards never get: "labels" and ``label_names``."""
        return {"labels", *self.label_names}

    def _model_inputs(self, batch) -> dict:
        """The batch without its labels (``_label_columns``), which per_example_loss reads
        (label_names=["target"]: inputs["target"]). Passed to forward, a model computed its own loss
        in each pass (a QA model's start_positions) or was given a name it does not take."""
        held = self._label_columns()
        inputs = {k: v for k, v in batch.items() if k not in held}
        net = self.accelerator.unwrap_model(self.model)
        if (_is_encoder_decoder(net) and isinstance(batch.get("labels"), torch.Tensor)
                and not {"decoder_input_ids", "decoder_inputs_embeds"} & set(batch)
                and hasattr(net, "prepare_decoder_input_ids_from_labels")):
            # what its forward builds from labels, which it is not given (T5 raised, BART decoded input_ids)
            inputs["decoder_input_ids"] = net.prepare_decoder_input_ids_from_labels(labels=batch["labels"])
        return inputs

    def compute_loss(self, model, inputs, return_outputs=False, num_items_in_batch=None):
        """Mean per-example loss (evaluation uses this; training steps use ``training_step``)."""
        if not self._label_columns() & set(inputs):
            return super().compute_loss(model, inputs, return_outputs, num_items_in_batch)
        if self.per_example_loss is _causal_lm_loss:   # before the forward: an unscored example's 0 lowered eval_loss
            _check_scored(inputs.get("labels"), None, None, not _unshifted(self.accelerator.unwrap_model(self.model)))
        outputs = model(**self._model_inputs(inputs))
        losses = self._per_example_losses(outputs, inputs)
        # checked as in training: evaluate() before train(), or without a train_dataset, never ran the probe,
        # and the mean of token losses [B, T] (zeros on the padding) was taken as the batch's eval_loss
        size = next((len(inputs[k]) for k in ("labels", *self.label_names)   # a label row per example
                     if isinstance(inputs.get(k), torch.Tensor) and inputs[k].dim() > 0), None)
        if size is not None:
            _check_loss_shape(losses, size, "on an evaluation batch")
        loss = losses.float().mean()   # float32, as the training steps average
        if not return_outputs:
            return loss
        # The Trainer reads a tuple's first entry as the loss and the rest as predictions; the
        # model got no labels, so its outputs hold no loss: without this, outputs[1:] dropped a
        # tuple's logits (or a tensor's first row). Dicts (ModelOutput) are read by key.
        if isinstance(outputs, torch.Tensor):
            outputs = (loss, outputs)
        elif isinstance(outputs, (tuple, list)):
            outputs = (loss, *outputs)
        return loss, outputs

    def floating_point_ops(self, inputs) -> int:
        """Two forwards ≈ 4·N·tokens, i.e. 2/3 of the Trainer's forward+backward estimate 6·N·tokens."""
        if "zo_step" not in inputs:
            return super().floating_point_ops(inputs)
        if self._zo_last_batch is None:
            return 0
        return int(super().floating_point_ops(self._zo_last_batch) * 2 / 3)

    def _track_num_input_tokens(self, inputs):
        # private, kept: the train loader yields step tickets, the tokens are in the collated batch
        return super()._track_num_input_tokens(self._zo_last_batch if "zo_step" in inputs else inputs)

    # -- logging -------------------------------------------------------------------------------
    def log(self, logs: dict[str, float], start_time: float | None = None) -> None:
        pending = self._zo_pending
        if "loss" in logs and pending.steps:
            # counted, not 2·B·global_step: global_step restarts at 0 on a second train() while
            # MeZO and the model go on, and B may differ from the steps before a resume
            logs = {**logs, "zo_queries": self._zo_queries,
                    "zo_projected_grad": pending.grad_sum / pending.steps}
            if sampler_name(self.method) != "uniform":
                logs.update(sazo_max_weight=pending.max_weight, sazo_ess=pending.ess_sum / pending.steps)
            self._zo_pending = _StepStats()
        super().log(logs, start_time)

    # -- checkpoints ---------------------------------------------------------------------------
    def _save_optimizer_and_scheduler(self, output_dir: str) -> None:
        # private, kept: the one place the checkpoint folder is known (``on_save`` callbacks are
        # not told it). Loading uses public hooks: ``train`` reads and checks, ``create_optimizer`` applies.
        super()._save_optimizer_and_scheduler(output_dir)  # optimizer.pt holds MeZO's step and seed
        if self._master is not None:   # the weights a callback wrote since the step: the next step's
            self._master_follows_writes()   # too, so a resume goes on from them as the run does
        if self.args.should_save:  # plain tensors, numbers and strings: what weights_only=True reads
            state = {"method": self.method, "sampler": self.zo_sampler.state_dict(), "queries": self._zo_queries,
                     "batch_size": self.global_batch_size(),   # B of the steps so far (a resume may change it)
                     "learning_rate": float(self.args.learning_rate),   # a plateau schedule keeps no base lr
                     "master": None if self._master is None else [t.detach().cpu().clone() for t in self._master.tensors]}
            if self._weights_not_in_checkpoint():     # the tuned tensors themselves: the model's files lack them
                net = self.accelerator.unwrap_model(self.model)
                state["tuned"] = [p.detach().cpu().clone() for p in net.parameters() if p.requires_grad]
            path = os.path.join(output_dir, ZO_STATE_NAME)
            atomic_write(path, lambda handle: torch.save(state, handle))  # never a half-written zo_state.pt

    def train(self, resume_from_checkpoint=None, trial=None, ignore_keys_for_eval=None, **kwargs):
        """``Trainer.train``; a checkpoint without a usable ``zo_state.pt`` is refused before anything loads."""
        # args edited since __init__ (trainer.args.gradient_accumulation_steps = 2): checked again, as there; the
        # Trainer reads them here, and ran two ZO steps per global step, logging their summed loss, silently
        self._follow_seeds()
        self._check_settings(*self._sampler_settings)
        checkpoint = resume_from_checkpoint
        if checkpoint is True:
            checkpoint = get_last_checkpoint(self.args.output_dir)  # None: the Trainer raises its own error
        self._zo_resume = self._read_zo_state(checkpoint) if checkpoint else None
        self.callback_handler.epoch_offset = 0.0
        if checkpoint:
            self._check_resumed_settings(checkpoint, self._zo_resume)
            self._check_resumed_batch_size(checkpoint, self._zo_resume)
        self._zo_pending = _StepStats()   # steps of an earlier train() after its last log belong to no log of this one
        if self.train_dataset is not None and self.zo_sampler is not None and self.model is not None:
            self._check_model_and_data()   # no model: a search released it, model_init builds the next
        try:
            return super().train(resume_from_checkpoint=resume_from_checkpoint, trial=trial,
                                 ignore_keys_for_eval=ignore_keys_for_eval, **kwargs)
        finally:
            self._zo_resume = None

    def _follow_seeds(self) -> None:
        """A ``train()`` that builds a new MeZO (the first one, or every one with ``model_init``) takes the seeds
        ``args`` holds now, as the Trainer's ``set_seed(args.seed)`` does: ``zo_seed`` (unless given) and the
        sampler's (``data_seed``, else zo_seed + 1). They were read in ``__init__`` only, so a loop setting
        ``trainer.args.seed`` before each ``train()`` ran the same directions and batches every time. A MeZO that
        goes on (a later ``train()`` without ``model_init``) keeps the seeds it runs with, and a sampler is made
        again only when the seed args give it changed (one assigned to ``zo_sampler`` by hand is kept)."""
        if self.optimizer is not None and self.model_init is None:
            return
        before = self.zo_seed
        if self._zo_seed_given is None:
            self.zo_seed = self.args.seed
        made = self._sampler_seed_made
        if self.zo_sampler is not None and made is not None and self._sampler_seed() != made:
            try:
                sampler = self._make_sampler(*self._sampler_settings)
            except ValueError:
                self.zo_seed = before     # a seed the sampler refuses: nothing changed
                raise
            self.zo_sampler, self._zo_sampler_start = sampler, None

    def _read_zo_state(self, checkpoint: str) -> dict:
        """The checkpoint's ZO state, checked against this trainer (ValueError if it does not fit)."""
        path = os.path.join(checkpoint, ZO_STATE_NAME)
        if not os.path.isdir(checkpoint):   # a mistyped path is not a weights-only checkpoint
            raise ValueError(f"Invalid checkpoint: {checkpoint} is not a directory (expected a checkpoint folder "
                             f"such as {os.path.join(self.args.output_dir, 'checkpoint-<step>')})")
        if not os.path.isfile(path):
            raise ValueError(f"Invalid checkpoint: {checkpoint} has no {ZO_STATE_NAME}: it was written with "
                             f"save_only_model=True (the weights only) or not by ZOTrainer, so the sampler's and "
                             f"MeZO's state cannot continue; start a new run from its weights instead")
        state = _load_plain(path, "a ZOTrainer state")
        if (not isinstance(state, dict) or not ZO_STATE_KEYS <= set(state) <= ZO_STATE_KEYS | ZO_STATE_OPTIONAL
                or not isinstance(state["sampler"], dict) or not isinstance(state["method"], str)):
            raise ValueError(f"Invalid checkpoint: {path} does not hold a ZOTrainer state "
                             f"(expected the keys method, sampler, master and, since round 10, queries, "
                             f"since round 11, learning_rate, since round 12, batch_size)")
        queries = state.get("queries", 0)   # absent from checkpoints written before round 10
        if isinstance(queries, bool) or not isinstance(queries, int) or queries < 0:
            raise ValueError(f"Invalid checkpoint: its query count {queries!r} is not an integer >= 0")
        batch = state.get("batch_size", 1)   # absent from checkpoints written before round 12
        if isinstance(batch, bool) or not isinstance(batch, int) or batch < 1:
            raise ValueError(f"Invalid checkpoint: its batch_size {batch!r} is not an integer >= 1")
        lr = state.get("learning_rate", 0.0)   # absent from checkpoints written before round 11
        if not isinstance(lr, float) or not math.isfinite(lr) or lr < 0:
            raise ValueError(f"Invalid checkpoint: its learning_rate {lr!r} is not a finite float >= 0")
        if state["method"] != self.method:
            raise ValueError(f"Invalid checkpoint: written with method={state['method']!r}, "
                             f"resumed with method={self.method!r}")
        if self.zo_sampler is None or state["sampler"].get("num_examples") != self.zo_sampler.num_examples:
            raise ValueError(f"Invalid checkpoint: its sampler covers {state['sampler'].get('num_examples')} examples, "
                             f"the train_dataset has {None if self.zo_sampler is None else self.zo_sampler.num_examples}")
        params = [p for p in self.model.parameters() if p.requires_grad]
        if (state["master"] is not None) != self._wants_master(params):
            raise ValueError("Invalid checkpoint: it was written with master_weights "
                             f"{'on' if state['master'] is not None else 'off'}, this run has them "
                             f"{'on' if self._wants_master(params) else 'off'}")
        master = state["master"]
        if master is not None and (not isinstance(master, list) or len(master) != len(params) or any(
                not isinstance(t, torch.Tensor) or t.dtype != master_dtype(p.dtype) or t.shape != p.shape
                or not bool(torch.isfinite(t).all()) for t, p in zip(master, params))):
            raise ValueError("Invalid checkpoint: its master weights do not match this model's trainable "
                             "parameters (finite tensors of the same shapes, float32 or the parameter's "
                             "wider dtype)")
        tuned = state.get("tuned")
        if tuned is None and self._weights_not_in_checkpoint():
            raise ValueError(f"Invalid checkpoint: {path} holds no tuned tensors, and peft saves a p-tuning model's "
                             f"prompt encoder (or a prefix-tuning one's with prefix_projection) as its output only "
                             f"(prompt_embeddings), which a resume loads as the encoder's input: another prompt, or "
                             f"peft's size mismatch (checkpoints written before round 16, 17 for prefix tuning, "
                             f"cannot continue)")
        if tuned is not None and (not isinstance(tuned, list) or len(tuned) != len(params) or any(
                not isinstance(t, torch.Tensor) or t.dtype != p.dtype or t.shape != p.shape
                or not bool(torch.isfinite(t).all()) for t, p in zip(tuned, params))):
            raise ValueError("Invalid checkpoint: its tuned tensors do not match this model's trainable parameters "
                             "(finite tensors of the same shapes and dtypes)")
        try:  # the sampler checks every field; a copy, so nothing changes here
            copy.deepcopy(self.zo_sampler).load_state_dict(state["sampler"])
        except ValueError as error:
            raise ValueError(f"Invalid checkpoint: {error}") from None
        return state

    def _check_resumed_settings(self, checkpoint: str, zo_state: dict) -> None:
        """Refuse a resume whose settings differ from the checkpoint's, before anything loads.

        Loading optimizer.pt, scheduler.pt and the sampler's state puts the checkpoint's lr, eps,
        weight decay, perturbation, seeds and sampler settings back (the Trainer does the same for
        its own optimisers' lr, through the scheduler's base lrs), so new values were silently
        dropped. Resuming continues the run as it was; a run with new settings is a new run.
        """
        groups, seed = self._saved_optimizer(checkpoint)
        group, sampler = groups[0], zo_state["sampler"]
        base_lr = group.get("initial_lr", zo_state.get("learning_rate"))   # a plateau schedule sets no initial_lr
        pairs = [("learning_rate", base_lr, self.args.learning_rate),   # None: plateau, written before round 11
                 ("weight_decay", max(g["weight_decay"] for g in groups), self.args.weight_decay),
                 ("eps", group["eps"], self.eps), ("perturbation", group["perturbation"], self.perturbation),
                 ("zo_seed (args.seed unless given)", seed, self.zo_seed),
                 ("data_seed (the sampler's seed, zo_seed + 1 when unset)", sampler["seed"], self.zo_sampler.seed)]
        pairs += [(name, old, getattr(self.zo_sampler, name, None))     # ema_decay, uniform_mix, ...
                  for name, old in sampler.get("hyperparameters", {}).items()]
        for name, old, new in pairs:
            if old is not None and old != new:
                raise ValueError(f"Invalid {name}: {new!r}, but {checkpoint} was written with {old!r}. Resuming "
                                 f"continues that run with its settings: resume with {name.split()[0]}={old!r}, or, to "
                                 f"change it, start a new run from the checkpoint's weights (without resuming)")
        net = self.accelerator.unwrap_model(self.model)
        planned = [len(g["params"]) for g in self._decay_groups(net, [p for p in net.parameters() if p.requires_grad])]
        if [len(g["params"]) for g in groups] != planned:
            raise ValueError(f"Invalid checkpoint: its optimizer groups {[len(g['params']) for g in groups]} tensors, "
                             f"this run {planned} (weight decay skips biases and norms since round 10: a checkpoint "
                             f"written before with weight_decay > 0 decayed them all and cannot continue here)")

    def _check_resumed_batch_size(self, checkpoint: str, zo_state: dict) -> None:
        """A resume with another B (per_device_train_batch_size × processes): refused where the
        Trainer's epochs decide when training stops or acts, else allowed with a warning.

        MeZO's directions (seeded by step) and the sampler's per-example scores do not depend on
        B, so they carry over; the continuation is neither run's. The Trainer counts the
        checkpoint's steps as steps of the new B: a run of ``num_train_epochs`` would stop at the
        wrong point and "epoch" strategies act mid-epoch (``_rebase_epochs`` keeps the logged epochs).
        """
        path = os.path.join(checkpoint, "trainer_state.json")
        saved = TrainerState.load_from_json(path) if os.path.isfile(path) else TrainerState()
        old = zo_state.get("batch_size")
        if old is None:   # written before round 12: the Trainer's per-process B, as many processes as now
            old = (saved.train_batch_size or self._train_batch_size) * self.args.world_size
        new = self.global_batch_size()
        if old == new:
            return
        given = (f"{self.args.per_device_train_batch_size} (B = {new} examples per step over "
                 f"{self.args.world_size} process(es)), but {checkpoint} was written with B = {old}")
        by_epoch = [name for name in ("eval_strategy", "save_strategy", "logging_strategy")
                    if getattr(self.args, name) == "epoch"]
        if self.args.max_steps <= 0 or by_epoch:
            counted = "max_steps is unset (num_train_epochs)" if self.args.max_steps <= 0 else f"{by_epoch[0]}='epoch'"
            raise ValueError(f"Invalid per_device_train_batch_size: {given}. The run counts epochs ({counted}), and "
                             f"the Trainer would count the checkpoint's steps as steps of B = {new}: resume with "
                             f"B = {old}, or set max_steps (and 'steps' strategies) to go on with B = {new}")
        warnings.warn(f"per_device_train_batch_size: {given}. Training goes on with B = {new}: MeZO's directions "
                      f"and the sampler's per-example scores carry over (they do not depend on B), but this is "
                      f"neither run's continuation, and an epoch is {self._steps_per_epoch()} steps from here",
                      UserWarning, stacklevel=3)

    @staticmethod
    def _saved_optimizer(checkpoint: str) -> tuple[list[dict], int]:
        """optimizer.pt's param groups and MeZO's seed (the Trainer loads both or neither file)."""
        for name in ("optimizer.pt", "scheduler.pt"):
            if not os.path.isfile(os.path.join(checkpoint, name)):
                raise ValueError(f"Invalid checkpoint: {checkpoint} has no {name}, so MeZO's step count and "
                                 f"seed would restart instead of continuing")
        state = _load_plain(os.path.join(checkpoint, "optimizer.pt"), "a MeZO state")
        try:
            groups = list(state["param_groups"])
            entry = state["state"][groups[0]["params"][0]]
            keys = {"params", "lr", "eps", "weight_decay", "perturbation"}
            if not all(isinstance(g, dict) and keys <= set(g) for g in groups) or not isinstance(entry["seed"], int):
                raise KeyError("param group")
        except (KeyError, IndexError, TypeError) as error:
            raise ValueError(f"Invalid checkpoint: {checkpoint}/optimizer.pt is not a MeZO state "
                             f"(missing {error})") from None
        try:   # MeZO's own checks (step, seed, lr, eps, ...) on stand-ins: the Trainer loads this file after
            # the weights, the sampler and the master, and a refusal there left those loaded
            stand_ins = [{"params": [torch.zeros(1) for _ in g["params"]]} for g in groups]
            with warnings.catch_warnings():   # the stand-ins' noise source is not the run's: no resume is told
                warnings.simplefilter("ignore", NoiseSourceWarning)
                MeZO(stand_ins, lr=0.0, noise=None).load_state_dict(state)
        except (ValueError, TypeError) as error:
            raise ValueError(f"Invalid checkpoint: {checkpoint}/optimizer.pt holds a state MeZO "
                             f"refuses: {error}") from None
        return groups, entry["seed"]

    def _load_best_model(self) -> None:
        # private, kept: where load_best_model_at_end puts the best weights into the model. The
        # master must follow them, or the next step (a later train()) would sync the last
        # weights back over the best ones.
        if not self._adapter_not_loadable():
            with self._tuned_tensors_kept():
                super()._load_best_model()
        if self._weights_not_in_checkpoint():
            self._load_tuned(self._read_zo_state(self.state.best_model_checkpoint))
        if self._master is not None:
            self._master_follows_model(self.state.best_model_checkpoint)

    def _load_from_checkpoint(self, resume_from_checkpoint, model=None) -> None:
        # private, kept: where a resume loads the checkpoint's weights into the model (see _tuned_tensors_kept)
        if self._adapter_not_loadable():
            return   # the tuned tensors come from zo_state.pt (create_optimizer), checked by train() already
        with self._tuned_tensors_kept():
            super()._load_from_checkpoint(resume_from_checkpoint, model)

    @contextlib.contextmanager
    def _tuned_tensors_kept(self):
        """The Trainer's loads leave the model's trainable tensors in place, holding the loaded values.

        peft's ``load_adapter`` (how the Trainer loads a peft checkpoint) replaces each bfloat16/float16
        adapter tensor by a new float32 one. A resume then tuned float32 adapters without the
        checkpoint's master weights (another run than the one it continued), and after
        ``load_best_model_at_end`` MeZO and the master held tensors no longer in the model, so a later
        ``train()`` moved nothing. The replaced tensors are put back, with the loaded values (exact: they
        were upcast from the checkpoint's own dtype)."""
        net = self.accelerator.unwrap_model(self.model)
        before = {name: p for name, p in net.named_parameters() if p.requires_grad}
        try:
            yield
        finally:
            for name, p in list(net.named_parameters()):
                old = before.get(name)
                if old is None or p is old or p.shape != old.shape:
                    continue
                with torch.no_grad():
                    old.copy_(p)
                owner, _, attr = name.rpartition(".")
                setattr(net.get_submodule(owner), attr, old)

    def _master_follows_writes(self) -> None:
        """Entries written into the model since the master was last synced into it (a callback,
        code between ``train()`` calls) become the master's (``Float32Master.follow_writes``): the next pass
        syncs master → model, which silently undid them (a float32 model keeps such a write). The other entries
        keep the master's extra precision."""
        self._master.follow_writes()

    def _master_follows_model(self, checkpoint: str) -> None:
        """The master takes the weights the model holds now: the checkpoint's master where it
        rounds to them (exactly the master of that step), else the model's own half-precision values."""
        try:
            saved = self._read_zo_state(checkpoint)["master"]
        except ValueError:
            saved = None
        with torch.no_grad():
            for k, (param, master) in enumerate(zip(self._master.params, self._master.tensors)):
                exact = saved is not None and torch.equal(saved[k].to(param.device, param.dtype), param.detach())
                master.copy_(saved[k] if exact else param.detach().to(master.dtype))
        self._master.sync()

    def _weights_not_in_checkpoint(self) -> bool:
        """Whether the Trainer's model files cannot give back the tuned tensors: peft saves a p-tuning model's
        prompt encoder (an embedding under an MLP) as its output, ``prompt_embeddings``, and loading puts that
        into the encoder's embedding, under the MLP's initial weights: a resumed run started from another prompt
        (every tensor off, the embedding by 3.5 on a tiny Llama). A prefix-tuning model with ``prefix_projection``
        is saved the same way, and peft's load refuses it (``_adapter_not_loadable``). ``zo_state.pt`` then holds
        the tensors."""
        config = getattr(self.accelerator.unwrap_model(self.model), "active_peft_config", None)
        return getattr(config, "peft_type", None) == "P_TUNING" or self._adapter_not_loadable()

    def _adapter_not_loadable(self) -> bool:
        """Whether peft cannot load the model's own checkpoint: a prefix-tuning model with ``prefix_projection``
        saves the projected prefix [P, 2·layers·width], and its load into the embedding [P, width] raises (a
        resume's RuntimeError "size mismatch", ``load_best_model_at_end``'s ValueError after the whole run). The
        Trainer's load is skipped for it: the tuned tensors come from ``zo_state.pt``, the frozen ones never moved."""
        config = getattr(self.accelerator.unwrap_model(self.model), "active_peft_config", None)
        prefix = getattr(config, "peft_type", None) == "PREFIX_TUNING"
        return prefix and bool(getattr(config, "prefix_projection", False))

    def _load_tuned(self, state: dict) -> None:
        """The checkpoint's tuned tensors (``_weights_not_in_checkpoint``) into the model, where it holds them."""
        if state.get("tuned") is None:
            return
        net = self.accelerator.unwrap_model(self.model)
        with torch.no_grad():
            for param, saved in zip([p for p in net.parameters() if p.requires_grad], state["tuned"]):
                param.copy_(saved)

    def _apply_zo_state(self, state: dict) -> None:
        """Load a checked ZO state: the sampler's, the tuned tensors the model files lack, then the master
        weights into the model."""
        self.zo_sampler.load_state_dict(state["sampler"])
        self._load_tuned(state)
        # an older checkpoint has no count: 2·B per step it took (right unless B changed before it)
        self._zo_queries = state.get("queries", 2 * self.global_batch_size() * self.state.global_step)
        if self._master is not None:
            with torch.no_grad():
                for master, saved in zip(self._master.tensors, state["master"]):
                    master.copy_(saved)
            self._master.sync()


def _check_loss_shape(losses, n: int, when: str) -> None:
    """One floating loss per example: anything else (None, the batch's mean) is named, not met as an
    AttributeError inside a step or a shape error from the gather."""
    if not isinstance(losses, torch.Tensor) or not losses.is_floating_point() or tuple(losses.shape) != (n,):
        got = f"shape {tuple(losses.shape)} {losses.dtype}" if isinstance(losses, torch.Tensor) else type(losses).__name__
        raise ValueError(f"Invalid per_example_loss: it returned {got} for {n} examples {when} (expected a "
                         f"floating tensor of shape [{n}]: one loss per example, not their mean)")


def _named(examples, step) -> str:
    """The examples of a batch, by train_dataset index, and the step (None: the first examples, before training)."""
    if examples is None:
        return "examples of an evaluation batch"
    return f"train_dataset examples {sorted(set(examples))} " + ("(checked before training)" if step is None
                                                                  else f"at step {step}")


def _collates(collator, dataset, index: int) -> bool:
    try:
        collator([dataset[index]])
    except Exception:
        return False
    return True


def _check_input_ids(model, batch, examples, step=None) -> None:
    """Token ids outside the model's embedding table: the forward's IndexError ("index out of range in
    self") named neither the ids nor the examples. Models without ``get_input_embeddings`` are not checked,
    and ids the config names (``image_token_index`` and the like, which a multimodal model replaces before
    its embedding lookup, some beyond the table) pass."""
    ids = batch.get("input_ids") if isinstance(batch, Mapping) else None
    try:
        size = model.get_input_embeddings().num_embeddings
    except (AttributeError, NotImplementedError, TypeError):
        return
    if not isinstance(ids, torch.Tensor) or ids.is_floating_point() or ids.dim() != 2 or len(ids) != len(examples):
        return
    bad = (ids < 0) | (ids >= size)
    if bool(bad.any()):
        named = _config_token_ids(getattr(model, "config", None))
        bad &= ~torch.isin(ids, torch.tensor(sorted(named), dtype=ids.dtype, device=ids.device))
    if bool(bad.any()):
        rows = bad.any(1).nonzero().flatten().tolist()
        raise ValueError(f"Invalid input_ids: {_named([examples[k] for k in rows], step)} hold token ids "
                         f"{sorted(set(ids[bad].tolist()))[:5]} outside the model's embedding table [0, {size}) "
                         f"(tokenised for another model?)")
    _check_positions(model, ids, batch.get("attention_mask"), examples, step)


def _check_positions(model, ids, mask, examples, step) -> None:
    """A batch wider than the model's table of learned positions (GPT-2's ``wpe``, OPT's ``embed_positions``;
    a prompt-tuned model's virtual tokens and a prefix-tuned one's prefix take positions too): the forward's
    IndexError ("index out of range in self"; on a GPU a device-side assert) came mid-run and named neither the
    examples nor the limit. The tables are the llm losses' (``losses._position_tables``); the examples named are
    those longer than it alone."""
    tables = _position_tables(model, model.get_input_embeddings())
    if not tables:
        return
    name, positions = min(tables, key=lambda table: table[1])
    skip = _positions_before(model)     # a prefix-tuning model's prefix takes positions too
    if ids.shape[1] + skip <= positions:
        return
    lengths = mask.sum(1) if isinstance(mask, torch.Tensor) and mask.shape == ids.shape else None
    rows = [] if lengths is None else ((lengths + skip) > positions).nonzero().flatten().tolist()
    rows = rows or list(range(len(ids)))      # padded (on the left) past the table: the whole batch
    after = f" after {skip} virtual tokens" if skip else ""
    raise ValueError(f"Invalid input_ids: {_named([examples[k] for k in rows], step)} make a batch of "
                     f"{ids.shape[1]} tokens{after}, past the model's {positions} learned positions ({name}); "
                     f"truncate the rows (max_length)")


def _config_token_ids(config) -> set:
    """The ids a model config names (``*_token_id``, ``*_token_index``, ``*_token_ids``)."""
    named = set()
    items = config.to_dict().items() if hasattr(config, "to_dict") else ()
    for name, value in items:
        if name.endswith(("token_id", "token_index", "token_ids")):
            for v in value if isinstance(value, (list, tuple)) else [value]:
                if isinstance(v, int) and not isinstance(v, bool):
                    named.add(v)
    return named


def _check_label_ids(classes, labels, examples, step=None) -> None:
    """Label ids outside [0, classes) other than −100, before the default loss reads them (classes: the
    logits' last size): cross_entropy's IndexError ("Target 9999 is out of bounds") named neither the
    examples nor the range."""
    if classes is None or not isinstance(labels, torch.Tensor) or labels.is_floating_point() or labels.dim() == 0:
        return
    bad = (labels != IGNORE) & ((labels < 0) | (labels >= classes))
    if bool(bad.any()):
        rows = bad.reshape(len(labels), -1).any(1).nonzero().flatten().tolist()
        named = _named(None if examples is None else [examples[k] for k in rows], step)
        raise ValueError(f"Invalid labels: {named} hold label ids {sorted(set(labels[bad].tolist()))[:5]} outside "
                         f"the model's [0, {classes}) (−100 marks a token that is not scored)")


def _check_scored(labels, examples, step=None, shifted: bool = True) -> None:
    """Refuse examples the default loss scores no token of: every label −100, or (causal shift) only the first,
    which no position predicts (a one-token row, an answer truncated away). ``causal_lm_losses`` gives them 0,
    which was averaged into ``eval_loss`` (a third of the set unscored lowered it by a third) and drawn into
    training batches as a loss that never moves, without a word. ``examples`` None: an evaluation batch."""
    if isinstance(labels, torch.Tensor) and labels.dim() == 1:   # a class id per example: −100 scores nothing
        labels, shifted = labels[:, None], False
    if not isinstance(labels, torch.Tensor) or labels.dim() != 2 or labels.is_floating_point():
        return
    scored = (labels[:, 1:] if shifted else labels) != IGNORE
    rows = (~scored.any(1)).nonzero().flatten().tolist()
    if rows:
        named = (f"rows {rows[:5]} of an evaluation batch" if examples is None
                 else _named([examples[k] for k in rows], step))
        first = ", or only the first token, which the causal shift never scores" if shifted else ""
        raise ValueError(f"Invalid labels: {named} have no scored token (every label −100{first}), so their loss "
                         f"would be 0 and count in the mean; drop them, or truncate so that the answer is kept")


def _check_finite_losses(losses: torch.Tensor, indices: torch.Tensor, step: int) -> None:
    """A non-finite loss names its examples and step: MeZO's own refusal ("closure returned a
    non-finite loss (call 1)") said neither, and the examples are what a researcher looks at."""
    finite = torch.isfinite(losses)
    if bool(finite.all()):
        return
    named = ""
    if losses.shape == indices.shape:   # another shape: MeZO refuses it
        named = f" for train_dataset examples {sorted({int(i) for i in indices[~finite.cpu()]})}"
    raise FloatingPointError(f"Invalid loss: per_example_loss returned inf or NaN{named} at step {step}; the step "
                             f"was refused and the weights put back where it started (within the rounding of the "
                             f"shifts), the step count unchanged")


def _check_loss_hooks(cls, kwargs) -> None:
    """Refuse the Trainer's loss hooks: a step needs one loss per example and never calls them."""
    if kwargs.get("compute_loss_func") is not None:
        raise ValueError("Invalid compute_loss_func: ZO steps score each example with per_example_loss; pass "
                         "per_example_loss=(outputs, inputs) -> losses [B] instead")
    if cls.compute_loss is not ZOTrainer.compute_loss:
        raise ValueError(f"Invalid compute_loss: {cls.__name__} overrides it, but training steps never call it "
                         f"(they need one loss per example); pass per_example_loss=(outputs, inputs) -> losses [B], "
                         f"which evaluation uses too")


def _load_plain(path: str, what: str):
    """``torch.load(weights_only=True)``: tensors, numbers, strings and containers; no object is ever built."""
    try:
        return torch.load(path, map_location="cpu", weights_only=True)
    except (pickle.UnpicklingError, RuntimeError, EOFError, OSError, ValueError, TypeError,
            AttributeError, ImportError, IndexError, KeyError) as error:
        raise ValueError(f"Invalid checkpoint: {path} is not {what} of plain tensors and numbers "
                         f"(refused without running anything: {type(error).__name__}: {str(error)[:200]})") from None


def _check_sampler_settings(method: str, ema_decay, uniform_mix) -> None:
    """Uniform batches have no EMA and no mixing: a value given for them would be silently ignored."""
    given = [name for name, value in (("ema_decay", ema_decay), ("uniform_mix", uniform_mix)) if value is not None]
    if given and sampler_name(method) == "uniform":
        raise ValueError(f"Invalid {given[0]}: method={method!r} draws uniform batches, which use neither "
                         f"ema_decay nor uniform_mix (they set SAZO's sampler: method='sazo' or 'sazo-plain')")


def _given(ema_decay, uniform_mix) -> dict:
    """The sampler settings the user gave; the others keep ``make_sampler``'s defaults."""
    return {name: value for name, value in (("ema_decay", ema_decay), ("uniform_mix", uniform_mix))
            if value is not None}


def _datasets():
    import datasets  # optional: only when the train set is a datasets.Dataset

    return datasets


def _causal_lm_loss(outputs, inputs) -> torch.Tensor:
    """The default per_example_loss: ``causal_lm_losses(outputs.logits, inputs["labels"])``."""
    return causal_lm_losses(_logits(outputs), inputs["labels"])


def _class_rows(logits, labels) -> bool:
    """A sequence classifier's batch (BERT's ``ForSequenceClassification``): logits [B, C] and one integer class id
    per example, labels [B], over C >= 2 classes. Its loss is each row's cross-entropy, as the model's single-label
    loss reads them (regression's and multi-label's float labels are not this, nor one logit: transformers regresses
    on it, and a cross-entropy over one class is 0 whatever the weights)."""
    return (isinstance(logits, torch.Tensor) and isinstance(labels, torch.Tensor) and logits.dim() == 2
            and logits.shape[1] >= 2 and labels.dim() == 1 and not labels.is_floating_point()
            and len(logits) == len(labels))


def _unshifted_loss(outputs, inputs) -> torch.Tensor:
    """The default per_example_loss where logits at t score label t (no causal shift; ``_unshifted``),
    through ``causal_lm_losses`` on one more logit position and one more ignored label."""
    logits, labels = _logits(outputs), inputs["labels"]
    labels = torch.nn.functional.pad(labels, (1, 0), value=IGNORE)
    return causal_lm_losses(torch.cat((logits, logits[:, -1:]), 1), labels)


def _is_encoder_decoder(model) -> bool:
    return getattr(getattr(model, "config", None), "is_encoder_decoder", False) is True


def _unshifted(model) -> bool:
    """Whether the model's logits at t score label t, as its own loss reads them: an encoder-decoder
    model, a masked LM or a token classifier (transformers' classes for those tasks that are not also
    causal LMs). A causal LM's logits at t score label t + 1, and so do other models' (the default)."""
    base = model.get_base_model() if hasattr(model, "get_base_model") else model   # a peft model's own
    return _is_encoder_decoder(base) or type(base).__name__ in _unshifted_classes()


@functools.cache
def _unshifted_classes() -> frozenset:
    from transformers.models.auto import modeling_auto as auto

    names = {*auto.MODEL_FOR_MASKED_LM_MAPPING_NAMES.values(),
             *auto.MODEL_FOR_TOKEN_CLASSIFICATION_MAPPING_NAMES.values()}
    return frozenset(names - set(auto.MODEL_FOR_CAUSAL_LM_MAPPING_NAMES.values()))


def _logits(outputs):
    """``outputs.logits``, or ``outputs["logits"]`` of a model returning a plain dict (None if neither)."""
    if isinstance(outputs, Mapping):
        return outputs.get("logits")
    return getattr(outputs, "logits", None)


def _has_accelerator() -> bool:
    """Whether torch sees an accelerator (torch < 2.6 has no ``torch.accelerator``: CUDA only)."""
    accelerator = getattr(torch, "accelerator", None)
    return accelerator.is_available() if accelerator is not None else torch.cuda.is_available()


def _pad_token_id(processing_class, model) -> int:
    """The id CausalLMCollator pads with (masked and never scored, so any id in the table does): the
    tokenizer's pad or eos id, else the config's, else 0. A negative id (-1: "none" in some configs) is
    skipped: padded into a batch, it failed inside the embedding lookup (IndexError)."""
    for source in (processing_class, getattr(model, "config", None)):
        for name in ("pad_token_id", "eos_token_id"):
            value = getattr(source, name, None)
            if isinstance(value, list):
                value = value[0] if value else None
            if value is not None and int(value) >= 0:
                return int(value)
    return 0

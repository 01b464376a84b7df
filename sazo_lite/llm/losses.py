"""Batched per-example losses for any ``AutoModelForCausalLM``: the closures MeZO/SAZO call.

Two forms, both returning a float32 tensor [B] (one loss per example; float64 for a float64 model) on the
CPU side of ``MeZO.step``:

* ``answer_losses``: mean token cross-entropy over the answer tokens only,

      f_i = −(1/|A_i|) Σ_{t∈A_i} log p_θ(x_t | x_<t)        (prompt and padding masked out)

  computed by ``causal_lm_losses(logits, labels)``, the one per-example causal-LM loss (labels
  −100 are not scored), which ``sazo_lite.hf`` (``ZOTrainer``, ``CausalLMCollator``) uses too;

* ``classification_losses``: prompt-based classification with verbalisers (as in MeZO):
  with label words v_1..v_C and the logits ℓ at the last prompt position,

      f_i = −log softmax_c(ℓ[v_c])[y_i]

The model runs in eval mode (no dropout: the + and − passes must see the same function)
under ``torch.inference_mode``. Sequences are right-padded per batch to the longest one, so
the answer position of row i is ``lengths[i] − 1``; right padding keeps absolute position
embeddings (GPT-2, OPT) correct without position ids.

Example:
    >>> batch = encode_classification(tok, ["Is 3 > 2? Answer:"], [0], [" yes", " no"])  # doctest: +SKIP
    >>> classification_losses(model, batch).shape                                         # doctest: +SKIP
    torch.Size([1])
"""
from __future__ import annotations

import contextlib
import functools
import inspect
import numbers
import warnings
import weakref
from dataclasses import dataclass, field

import torch
import torch.nn.functional as F

from ..engine import _caller_level
from ..validation import check_int

__all__ = ["causal_lm_losses", "checked_indices", "check_deterministic", "check_labelled", "TokenBatch",
           "encode_answers", "encode_classification", "label_word_ids",
           "answer_losses", "classification_losses", "classification_logits", "predict", "accuracy",
           "batched_closure"]

IGNORE = -100  # a label that is not scored (prompt, padding): the Hugging Face convention


def at_least_float32(logits: torch.Tensor) -> torch.Tensor:
    """``logits`` in float32, or in their own dtype where it is wider (float64): the dtype every loss here is
    computed in. Half precision is upcast; rounded to float32, a float64 GPT-2's ZO difference f(θ+εz) − f(θ−εz)
    was 0.5% off at ε = 1e-5 and 30% at 1e-7 (ZOTrainer's default loss)."""
    return logits.to(torch.promote_types(logits.dtype, torch.float32))


def causal_lm_losses(logits: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
    """Per-example mean token cross-entropy of a causal LM: float32 [B] (float64 for float64 logits).

    Position t predicts token t+1 (the causal shift); labels equal to −100 are ignored, so a
    batch with labels only on the answer tokens scores the answers alone. An example with no
    scored token has loss 0. This is the Hugging Face ``labels`` loss, example by example.

    Example:
        >>> logits, labels = torch.zeros(2, 3, 5), torch.tensor([[-100, 1, 2], [-100, -100, 4]])
        >>> causal_lm_losses(logits, labels)          # uniform logits: log 5 per scored token
        tensor([1.6094, 1.6094])
    """
    logits, targets = at_least_float32(logits[:, :-1]), labels[:, 1:]         # [B, T-1, V], [B, T-1]
    ce = F.cross_entropy(logits.transpose(1, 2), targets, ignore_index=IGNORE, reduction="none")
    counts = (targets != IGNORE).sum(1)                                       # [B]
    return ce.sum(1) / counts.clamp_min(1)


@dataclass
class TokenBatch:
    """Pre-tokenised examples; ``select`` pads a subset into model inputs.

    Attributes:
        ids: one list of token ids per example (prompt, then answer for LM losses).
        prompt_lengths: number of prompt tokens per example (the loss skips them).
        labels: class index per example (classification), or None.
        label_ids: token id of each class's verbaliser (classification), or None.
        pad_id: the padding token id.
        max_id: the largest token id of ids, pad_id and label_ids (the losses check it against the model's
            vocabulary).
        longest: the number of tokens of the longest row (checked against a table of learned positions).

    Checked at construction (ValueError): every row a non-empty sequence of ints >= 0, one prompt length
    in [0, len(row)] a row, labels (ints, one a row) in [0, C), label_ids C >= 2 distinct ints >= 0.
    """

    ids: list[list[int]]
    prompt_lengths: list[int]
    pad_id: int
    labels: torch.Tensor | None = None
    label_ids: torch.Tensor | None = None
    max_id: int = field(init=False, repr=False, compare=False)   # the largest token id (ids, pad, label words)
    longest: int = field(init=False, repr=False, compare=False)  # the longest row's length

    def __post_init__(self):
        # checked once here: each loss would otherwise read an empty row's answer slot at position −1,
        # truncate a float id, wrap a negative label word id, or score a prompt length past its row
        tops = [_check_row(k, row) for k, row in enumerate(self.ids)]
        if len(self.prompt_lengths) != len(self.ids):
            raise ValueError(f"Invalid prompt_lengths: {len(self.prompt_lengths)} for {len(self.ids)} examples")
        for k, (row, length) in enumerate(zip(self.ids, self.prompt_lengths)):
            check_int(f"prompt_lengths[{k}]", length, 0, len(row))
        self.pad_id = check_int("pad_id", self.pad_id, 0)
        self.labels, self.label_ids = _check_labels(self.labels, self.label_ids, len(self.ids))
        label_top = [int(self.label_ids.max())] if self.label_ids is not None and len(self.label_ids) else []
        self.max_id = max(tops + label_top + [self.pad_id])
        self.longest = max((len(row) for row in self.ids), default=0)

    def __len__(self) -> int:
        return len(self.ids)

    def select(self, indices, device) -> dict[str, torch.Tensor]:
        """Right-padded tensors for the chosen examples: input_ids, attention_mask [B, T], lengths [B]."""
        rows = [self.ids[i] for i in checked_indices(indices, len(self))]
        lengths = torch.tensor([len(r) for r in rows])
        width = int(lengths.max())
        input_ids = torch.full((len(rows), width), self.pad_id, dtype=torch.long)
        for k, row in enumerate(rows):
            input_ids[k, :len(row)] = torch.as_tensor(row)     # a row may be a tensor
        mask = torch.arange(width)[None, :] < lengths[:, None]
        return dict(input_ids=input_ids.to(device), attention_mask=mask.long().to(device),
                    lengths=lengths.to(device))


def _integer_tensor(name: str, value) -> torch.Tensor:
    """``value`` as a 1-D integer tensor (not bool, not float: 0.7 would be read as class 0)."""
    if not isinstance(value, torch.Tensor):
        value = list(value)
        tensor = torch.as_tensor(value) if value else torch.zeros(0, dtype=torch.long)   # [] is float32 else
    else:
        tensor = value
    if tensor.dim() != 1 or tensor.dtype.is_floating_point or tensor.dtype.is_complex or tensor.dtype == torch.bool:
        raise ValueError(f"Invalid {name}: expected a 1-D tensor of ints, got {tensor.dtype} of shape "
                         f"{tuple(tensor.shape)}")
    return tensor.long()


def _all_ints(values) -> bool:
    """Every value an int, not a bool (a plain-int check first: the ABC check is much slower per token)."""
    return all(type(t) is int for t in values) or all(
        isinstance(t, numbers.Integral) and not isinstance(t, bool) for t in values)


def _check_row(k: int, row) -> int:
    """Example k's token ids: a non-empty sequence of ints >= 0; returns the largest."""
    values = row.tolist() if isinstance(row, torch.Tensor) and row.dim() == 1 else row
    if isinstance(values, (str, bytes)) or not hasattr(values, "__len__") or len(values) == 0 or not _all_ints(values) \
            or min(values) < 0:
        raise ValueError(f"Invalid ids: example {k} is {row!r} (expected a non-empty sequence of token ids, "
                         "ints >= 0)")
    return int(max(values))


def _check_labels(labels, label_ids, count: int):
    """One class index in [0, C) per example and C distinct label word ids >= 0 (each when given)."""
    if label_ids is not None:
        label_ids = _integer_tensor("label_ids", label_ids)
        # one class: softmax over one logit, every loss 0 and every ZO step δ = 0, without a word
        if len(label_ids) < 2 or int(label_ids.min()) < 0 or len(set(label_ids.tolist())) != len(label_ids):
            raise ValueError(f"Invalid label_ids: {label_ids.tolist()} (expected 2 or more distinct token ids >= 0)")
    if labels is not None:
        labels = _integer_tensor("labels", labels)
        classes = len(label_ids) if label_ids is not None else None
        if len(labels) != count or (len(labels) and (int(labels.min()) < 0 or
                                                     (classes is not None and int(labels.max()) >= classes))):
            raise ValueError(f"Invalid labels: need one class index in [0, {classes}) per example ({count})")
    return labels, label_ids


def _check_vocabulary(model, batch: TokenBatch, argument: str = "batch") -> None:
    """Token ids past the model's embedding rows, and rows longer than its table of learned positions (GPT-2's
    ``wpe``, OPT's ``embed_positions``): a ValueError naming ``argument`` here, not torch's "index out of range
    in self" (on a GPU a device-side assert that ends the process's CUDA use)."""
    embeddings = model.get_input_embeddings() if hasattr(model, "get_input_embeddings") else None
    rows = getattr(embeddings, "num_embeddings", None)
    if rows is not None and batch.max_id >= rows:
        raise ValueError(f"Invalid {argument}: token id {batch.max_id} (ids, pad_id or label_ids) is past the "
                         f"model's vocabulary of {rows}")
    skip = _positions_before(model)    # a prompt-tuned model's virtual tokens take positions in front of each row
    for name, positions in _position_tables(model, embeddings):
        if batch.longest + skip > positions:
            after = f" after {skip} virtual tokens" if skip else ""
            raise ValueError(f"Invalid {argument}: an example of {batch.longest} tokens{after} is longer than the "
                             f"model's {positions} learned positions ({name}); encode with a smaller max_length")


_POSITION_TABLES = weakref.WeakKeyDictionary()     # model → _position_tables(model)


def _position_tables(model, embeddings) -> list[tuple[str, int]]:
    """(name, positions it holds) of each table of learned positions: an ``nn.Embedding`` other than the
    input embeddings named like one (``wpe``, ``*pos*``), less its offset (OPT's and BioGPT's 2). Looked for
    once a model (a walk of its modules costs milliseconds; every loss call asks)."""
    if not isinstance(model, torch.nn.Module):
        return []
    if model not in _POSITION_TABLES:
        _POSITION_TABLES[model] = [
            (name, module.num_embeddings - int(getattr(module, "offset", 0) or 0))
            for name, module in model.named_modules()
            if isinstance(module, torch.nn.Embedding) and module is not embeddings
            and ("pos" in name.rsplit(".", 1)[-1] or name.rsplit(".", 1)[-1] == "wpe")]
    return _POSITION_TABLES[model]


_ROTARY = weakref.WeakKeyDictionary()      # model → _width_dependent_rotary(model)
_WARNED_ROTARY = weakref.WeakSet()         # models whose full-model losses warned about their rotary frequencies


def _width_dependent_rotary(model) -> list[tuple[str, str, int, torch.nn.Module]]:
    """(name, rope types, limit, module) of each rotary embedding whose frequencies depend on the batch's padded
    width past ``limit`` tokens (``rope_type`` "dynamic": past ``max_position_embeddings``, stretched with the
    width and kept until a batch shorter than the limit; "longrope": past ``original_max_position_embeddings``,
    its long factors). Looked for once a model (every loss call asks)."""
    if not isinstance(model, torch.nn.Module):
        return []
    if model not in _ROTARY:
        found = []
        for name, module in model.named_modules():
            kinds = getattr(module, "rope_type", None)
            kinds = list(kinds.values()) if isinstance(kinds, dict) else [kinds]
            if not any(isinstance(k, str) and ("dynamic" in k or k == "longrope") for k in kinds):
                continue
            parameters = getattr(getattr(module, "config", None), "rope_parameters", None) or {}
            limits = [getattr(module, "original_max_seq_len", None)] + [
                p.get("original_max_position_embeddings") for p in [parameters, *parameters.values()]
                if isinstance(p, dict)]
            limit = min((n for n in limits if isinstance(n, int)), default=None)
            if limit is not None:
                found.append((name, "/".join(map(str, kinds)), limit, module))
        _ROTARY[model] = found
    return _ROTARY[model]


def _stretched(module, limit: int) -> bool:
    """Whether a "dynamic" rotary embedding still holds frequencies stretched past ``limit`` by an earlier batch
    (transformers keeps them until a batch shorter than the limit, so one of exactly ``limit`` tokens gets them)."""
    return any(key.endswith("max_seq_len_cached") and isinstance(value, (int, torch.Tensor)) and int(value) > limit
               for key, value in vars(module).items())


def _rotary_width_dependence(model, width: int) -> tuple[str, int] | None:
    """(why, the longest width free of it) where a batch padded to ``width`` tokens gets rotary frequencies that
    depend on its width or on earlier batches (``_width_dependent_rotary``), so the model's loss of an example
    changes with the other examples of its batch; else None. ``TopBlocks`` refuses such a split; the full-model
    losses warn once a model."""
    for name, kinds, limit, module in _width_dependent_rotary(model):
        where = f"{name or 'the model'}'s rotary frequencies ({kinds})"
        if width > limit:
            return f"past the {limit} after which {where} depend on the batch's padded width", limit
        if width == limit and "dynamic" in kinds and _stretched(module, limit):
            return (f"the {limit} at which {where} keep the stretch of an earlier, longer batch (until one shorter "
                    f"than {limit})"), limit - 1
    return None


def _warn_width_dependent_rotary(model, width: int, losses: str) -> None:
    """Warn once a model where this call's padded width makes its rotary frequencies batch-dependent: a ZO step's
    two passes run the same batch and agree, but losses of one example from different batches do not."""
    # [] at once for a model without such a rotary embedding; once warned, no per-call look at its frequencies
    if not _width_dependent_rotary(model) or model in _WARNED_ROTARY:
        return
    found = _rotary_width_dependence(model, width)
    if found is None:
        return
    _WARNED_ROTARY.add(model)
    why, limit = found
    earlier = " and on earlier calls" if "dynamic" in why else ""    # kept until a batch shorter than the limit
    warnings.warn(f"{losses}: this batch is padded to {width} tokens, {why}, so an example's loss depends on the "
                  f"other examples of its batch{earlier}; a ZO step's two passes run "
                  f"the same batch and agree. Encode with max_length <= {limit} for losses that do not (warned once "
                  "a model)", UserWarning, stacklevel=_caller_level())


def _random_in_training(module) -> str | None:
    """Why ``module`` (not its children) makes a forward random or batch-dependent in training mode: a dropout
    module with p > 0, a drop rate > 0 read as an attribute (Hugging Face's ``attention_dropout``, OPT's
    ``dropout`` and ``layerdrop``, peft's ``lora_dropout`` modules), a router's jitter > 0 (Mixtral's and
    MiniMax's ``jitter_noise``, PhiMoE's, DBRX's ``moe_jitter_eps``: inputs scaled by uniform noise), batch
    norm's batch statistics; else None."""
    if isinstance(module, torch.nn.modules.dropout._DropoutNd):
        return f"{type(module).__name__}(p={module.p})" if module.p > 0 else None
    if isinstance(module, torch.nn.modules.batchnorm._BatchNorm):
        return f"{type(module).__name__} (batch statistics)"
    for name, value in vars(module).items():
        if ("drop" in name or "jitter" in name) and isinstance(value, float) and value > 0:
            return f"{type(module).__name__}.{name} = {value}"
    return None


def _any_training(model) -> bool:
    """Whether any module of ``model`` is in training mode (stops at the first)."""
    # a walk of _modules, not model.modules(): measured 2026-12-07 on the busy 2-core machine, SmolLM2 with
    # adapters (~1,000 modules) 0.6 ms against 3 ms, beside a forward of ~240 ms; cheap enough for every call
    todo = [model]
    while todo:
        module = todo.pop()
        if module.training:
            return True
        todo.extend(m for m in module._modules.values() if m is not None)
    return False


def check_deterministic(model) -> None:
    """ValueError where a module in training mode would make the losses random (dropout, LayerDrop, a
    router's jitter; LoRA dropout of adapters added after ``eval()``, which peft leaves in training mode) or
    depend on the batch (batch norm): ZO's two passes must see the same function, so the difference of
    their losses is δ. A model in training mode without any of them (every rate 0) is accepted."""
    if not _any_training(model):       # eval mode: the usual case, quick
        return
    for name, module in model.named_modules():
        why = _random_in_training(module) if module.training else None
        if why is not None:
            raise ValueError(f"Invalid model: {name or 'the model'} is in training mode with {why}, so each "
                             "forward draws its own noise and the losses are random; call model.eval()")


def checked_indices(indices, count: int | None) -> list[int]:
    """Example indices (a 1-D integer tensor or array, or a sequence of ints) as a list of ints in
    [0, count) (``count`` None: ints >= 0, for losses of an unknown number of examples); duplicates kept.
    Floats, bools, negative (wrapping) or too large indices and an empty selection raise ValueError.

    >>> checked_indices(torch.tensor([2, 0, 2]), 3)
    [2, 0, 2]
    """
    where = "ints >= 0" if count is None else f"ints in [0, {count})"
    if isinstance(indices, torch.Tensor):
        ok = indices.dim() == 1 and not indices.dtype.is_floating_point and not indices.dtype.is_complex \
            and indices.dtype != torch.bool
        if not ok:      # named: it was "Invalid indices: None"
            raise ValueError(f"Invalid indices: a {str(indices.dtype).removeprefix('torch.')} tensor of shape "
                             f"{tuple(indices.shape)} (expected a 1-D tensor of {where})")
        values = indices.tolist()
    else:
        values = list(indices)
    if not values:
        raise ValueError(f"Invalid indices: expected a non-empty list of {where}")
    return [check_int("indices", i, 0, None if count is None else count - 1) for i in values]


def _ids(tokenizer, text: str) -> list[int]:
    return list(tokenizer(text, add_special_tokens=False)["input_ids"])


def _texts(name: str, value) -> list:
    """``value`` as a list of texts; one string is refused (it was read as the list of its characters: the
    label words "ny" as the words "n" and "y", the prompts "ab" as the prompts "a" and "b")."""
    if isinstance(value, (str, bytes)):
        raise ValueError(f"Invalid {name}: {value!r} (expected a list of strings, not one string)")
    return list(value)


def _pad_id(tokenizer) -> int:
    pad = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else tokenizer.eos_token_id
    if pad is None:
        raise ValueError("Invalid tokenizer: it has neither a pad nor an EOS token")
    return int(pad)


def label_word_ids(tokenizer, label_words) -> torch.Tensor:
    """First token id of each verbaliser, e.g. [" positive", " negative"] → LongTensor [C].

    A word of several tokens is scored by its first (MeZO's verbalisers). Raises ValueError for one string
    instead of a list, a word with no tokens, two label words that start with the same token, a word that
    starts with the tokenizer's unknown token, and a word of several tokens that starts with a token that is
    only whitespace (SmolLM2 splits " 1" into " " and "1": the class would be scored by the space alone).
    """
    words = _texts("label_words", label_words)
    tokens = [_ids(tokenizer, w) for w in words]
    for word, t in zip(words, tokens):
        if not t:
            raise ValueError(f"Invalid label_words: {word!r} has no tokens (its class would have no logit)")
    ids = [t[0] for t in tokens]
    if len(set(ids)) != len(ids):
        raise ValueError(f"Invalid label_words: {words!r} must start with distinct tokens")
    unknown = getattr(tokenizer, "unk_token_id", None)
    if unknown is not None and unknown in ids:     # every word the vocabulary lacks is scored by the same logit
        word = words[ids.index(unknown)]
        raise ValueError(f"Invalid label_words: {word!r} starts with the unknown token "
                         f"{getattr(tokenizer, 'unk_token', None)!r}; choose a word the vocabulary holds")
    decode = getattr(tokenizer, "decode", None)
    for word, t in zip(words, tokens):
        if len(t) > 1 and callable(decode) and not str(decode([t[0]])).strip():
            raise ValueError(f"Invalid label_words: {word!r} starts with a whitespace-only token ({decode([t[0]])!r} "
                             f"of {t}), which would score its class; choose a word whose first token carries it")
    return torch.tensor(ids, dtype=torch.long)


def encode_answers(tokenizer, prompts, answers, *, max_length: int = 128) -> TokenBatch:
    """Tokenise prompt + answer pairs for ``answer_losses`` (answers keep their leading space)."""
    prompts, answers = _texts("prompts", prompts), _texts("answers", answers)
    if len(prompts) != len(answers):
        raise ValueError(f"Invalid answers: {len(answers)} answers for {len(prompts)} prompts")
    max_length = check_int("max_length", max_length, 2)       # a prompt token and an answer token at least
    ids, prompt_lengths = [], []
    for k, (prompt, answer) in enumerate(zip(prompts, answers)):
        p, a = _ids(tokenizer, prompt), _ids(tokenizer, answer)
        if not a:
            raise ValueError(f"Invalid answers: {answer!r} has no tokens")
        if len(a) >= max_length:    # the row kept a prompt token and the whole answer: longer than max_length
            raise ValueError(f"Invalid max_length: {max_length} (answer {k} alone has {len(a)} tokens; a row holds "
                             "one prompt token or more and the whole answer)")
        if not p:           # nothing before the answer: its first token would be predicted from nothing, unscored
            raise ValueError(f"Invalid prompts: {prompt!r} has no tokens (the answer's first token would not be "
                             "scored)")
        p = p[-max(1, max_length - len(a)):]  # keep the prompt's end, next to the answer
        ids.append(p + a)
        prompt_lengths.append(len(p))
    return TokenBatch(ids=ids, prompt_lengths=prompt_lengths, pad_id=_pad_id(tokenizer))


def encode_classification(tokenizer, prompts, labels, label_words, *, max_length: int = 128) -> TokenBatch:
    """Tokenise prompts for ``classification_losses``; the answer slot is the prompt's end."""
    label_ids = label_word_ids(tokenizer, label_words)
    prompts = _texts("prompts", prompts)
    max_length = check_int("max_length", max_length, 1)       # [-0:] would keep the whole prompt
    labels = _integer_tensor("labels", labels)                  # not as_tensor(dtype=long): 0.7 became class 0
    if len(labels) != len(prompts) or (len(labels) and not 0 <= int(labels.min()) <= int(labels.max()) < len(label_ids)):
        raise ValueError(f"Invalid labels: need one class index in [0, {len(label_ids)}) per prompt")
    ids = [_ids(tokenizer, p)[-max_length:] for p in prompts]
    for k, (prompt, row) in enumerate(zip(prompts, ids)):
        if not row:     # named here: TokenBatch would say "Invalid ids: example k is []", not which argument
            raise ValueError(f"Invalid prompts: example {k} ({prompt!r}) has no tokens (there is no last prompt "
                             "position to score the label words at)")
    return TokenBatch(ids=ids, prompt_lengths=[len(r) for r in ids], pad_id=_pad_id(tokenizer),
                      labels=labels, label_ids=label_ids)


def _device(model) -> torch.device:
    return next(model.parameters()).device


def _autocast(device: torch.device, dtype):
    """bf16/fp16 autocast when asked (faster forwards on CPUs with bf16 support), else nothing."""
    if dtype is None:
        return contextlib.nullcontext()
    return torch.autocast(device_type=device.type, dtype=dtype)


def _keeps_logits(model) -> bool:
    """Whether the model's forward takes ``logits_to_keep`` (Hugging Face causal LMs; peft passes it on)."""
    inner = model.get_base_model() if hasattr(model, "get_base_model") else model
    return _forward_keeps_logits(type(inner))


@functools.lru_cache(maxsize=None)
def _forward_keeps_logits(cls) -> bool:       # once per class: every forward of a ZO step asks
    return "logits_to_keep" in inspect.signature(cls.forward).parameters


def _model_forward(model, **inputs):
    """``model(**inputs)``; transformers' "grouped_mm" experts (its default for mixture-of-experts layers:
    Mixtral, Qwen2/3-MoE, OLMoE, ...), which take no float64 and failed with torch's "Expected mat_a to be
    Float32, BFloat16 or Float16 matrix, got Double", are a ValueError that says how to run them."""
    try:
        return model(**inputs)
    except RuntimeError as error:
        base = model.get_base_model() if hasattr(model, "get_base_model") else model
        grouped = getattr(getattr(base, "config", None), "_experts_implementation", None) == "grouped_mm"
        if grouped and "got Double" in str(error):
            raise ValueError(f"Invalid model: {type(base).__name__} runs its experts with transformers' 'grouped_mm', "
                             "which takes no float64; call model.set_experts_implementation('eager') (the same "
                             "maths, one matrix product an expert) or use float32") from error
        raise


def _virtual_tokens(model) -> int:
    """Positions a peft causal-LM prompt-learning model (prompt tuning, p-tuning, CPT) puts in front of its
    input embeddings, so of its logits: its ``num_virtual_tokens``. 0 for other models, and for prefix
    tuning, whose virtual tokens are keys and values only."""
    config = getattr(model, "active_peft_config", None)
    if (not getattr(config, "is_prompt_learning", False) or config.task_type != "CAUSAL_LM"
            or config.peft_type in ("PREFIX_TUNING", "CARTRIDGE")):
        return 0
    return int(config.num_virtual_tokens)


def _positions_before(model) -> int:
    """Positions a peft causal-LM prompt-learning model takes in front of each row: its virtual tokens
    (``_virtual_tokens``), and a prefix-tuning (or cartridge) model's prefix too, whose keys and values come
    first (the input's positions start after them: a GPT-2 of 128 learned positions holds 125 tokens after a
    prefix of 3; 126 were torch's IndexError "index out of range in self" inside the forward)."""
    config = getattr(model, "active_peft_config", None)
    if (getattr(config, "is_prompt_learning", False) and config.task_type == "CAUSAL_LM"
            and config.peft_type in ("PREFIX_TUNING", "CARTRIDGE")):
        return int(config.num_virtual_tokens)
    return _virtual_tokens(model)


def _logits(model, inputs, autocast_dtype, grad: bool = False, positions=None) -> torch.Tensor:
    """Logits [B, T, V] in float32 (float64 for a float64 model, ``at_least_float32``), or with ``positions`` [B]
    only row b's logits at positions[b]: [B, V].

    A prompt-tuned model's logits cover its virtual tokens first (``_virtual_tokens``): they are dropped, so
    position t is the input's token t (the last prompt position scored the virtual tokens' logits instead,
    silently, and the answer loss raised on the logits' width).

    With ``positions``, a model that takes ``logits_to_keep`` applies its LM head at those positions
    only: the same numbers up to float rounding (the head's matrix product over fewer rows may round
    the last bit differently), and for a small model with a large vocabulary most of the forward's
    cost saved, since the head over every position is most of it.
    """
    # grad=True keeps the autograd graph (true per-example gradients, ``grad_norms``); ZO never needs it
    mode = torch.enable_grad() if grad else torch.inference_mode()
    skip = _virtual_tokens(model)
    positions = None if positions is None else positions + skip
    kept = torch.unique(positions) if positions is not None and _keeps_logits(model) else None   # sorted [K]
    extra = {} if kept is None else {"logits_to_keep": kept}
    with mode, _autocast(inputs["input_ids"].device, autocast_dtype):
        out = _model_forward(model, input_ids=inputs["input_ids"], attention_mask=inputs["attention_mask"], **extra)
    logits = at_least_float32(out.logits)  # CE in float32, or float64 for a float64 model
    if positions is None:
        return logits[:, skip:]
    rows = torch.arange(len(logits), device=logits.device)
    return logits[rows, positions if kept is None else torch.searchsorted(kept, positions)]


def _every_example(batch: TokenBatch) -> range:
    """Every example of ``batch`` (the losses' default selection); a batch without examples is a ValueError
    that says so (it was "Invalid indices", or torch.cat's "expected a non-empty list" in ``predict``)."""
    if len(batch) == 0:
        raise ValueError("Invalid batch: no examples")
    return range(len(batch))


def _selection(batch: TokenBatch, indices) -> list[int] | range:
    """The examples a loss scores: every one for None, else ``indices`` read once (``checked_indices``): the losses
    go over them several times, and a generator was spent by the first (torch's "Expected input batch_size (2) to
    match target batch_size (0)")."""
    return _every_example(batch) if indices is None else checked_indices(indices, len(batch))


def answer_losses(model, batch: TokenBatch, indices=None, *, autocast_dtype=None, grad: bool = False) -> torch.Tensor:
    """Per-example mean token CE over answer tokens: float32 [B] (float64 for a float64 model; on its device).

    ``grad=True`` records the autograd graph (for true per-example gradients); default: inference mode.
    """
    indices = _selection(batch, indices)
    _check_vocabulary(model, batch)
    check_deterministic(model)  # every module, every call: one left in training mode under an eval model too
    inputs = batch.select(indices, _device(model))
    _warn_width_dependent_rotary(model, inputs["input_ids"].shape[1], "answer_losses")
    unscored = [int(i) for i in indices if len(batch.ids[int(i)]) <= max(batch.prompt_lengths[int(i)], 1)]
    if unscored:                # its loss was 0 (no token to score), e.g. a classification batch: ZO learnt nothing
        raise ValueError(f"Invalid batch: example {unscored[0]} has no answer token after its prompt (prompt length "
                         f"{batch.prompt_lengths[unscored[0]]} of {len(batch.ids[unscored[0]])} tokens; the first "
                         "token is never scored), so its answer loss would be 0: encode_answers' batches only")
    logits = _logits(model, inputs, autocast_dtype, grad)
    ids = inputs["input_ids"]
    positions = torch.arange(ids.shape[1], device=ids.device)[None, :]
    starts = torch.tensor([batch.prompt_lengths[int(i)] for i in indices], device=ids.device)
    answer = (positions >= starts[:, None]) & (positions < inputs["lengths"][:, None])   # [B, T]
    return causal_lm_losses(logits, ids.masked_fill(~answer, IGNORE))


def classification_logits(model, batch: TokenBatch, indices=None, *, autocast_dtype=None,
                          grad: bool = False) -> torch.Tensor:
    """Logits of the label words at each prompt's last position: float32 [B, C] (float64 for a float64 model)."""
    indices = _selection(batch, indices)
    if batch.label_ids is None:
        raise ValueError("Invalid batch: no label_ids (classification needs encode_classification's batch)")
    _check_vocabulary(model, batch)
    check_deterministic(model)  # every module, every call: one left in training mode under an eval model too
    inputs = batch.select(indices, _device(model))
    _warn_width_dependent_rotary(model, inputs["input_ids"].shape[1], "classification_losses")
    last = _logits(model, inputs, autocast_dtype, grad, positions=inputs["lengths"] - 1)   # [B, V]
    return last[:, batch.label_ids.to(last.device)]


def classification_losses(model, batch: TokenBatch, indices=None, *, autocast_dtype=None,
                          grad: bool = False) -> torch.Tensor:
    """Per-example verbaliser cross-entropy: float32 [B], float64 for a float64 model (``grad=True``: keep the
    autograd graph)."""
    indices = _selection(batch, indices)
    check_labelled(batch)
    logits = classification_logits(model, batch, indices, autocast_dtype=autocast_dtype, grad=grad)
    labels = batch.labels[torch.as_tensor(list(indices), dtype=torch.long)].to(logits.device)
    return F.cross_entropy(logits, labels, reduction="none")


def predict(model, batch: TokenBatch, *, batch_size: int = 32, autocast_dtype=None) -> torch.Tensor:
    """Predicted class per example (argmax over label words): LongTensor [N] on the CPU."""
    batch_size = check_int("batch_size", batch_size, 1)
    chunks = [range(s, min(s + batch_size, len(batch))) for s in range(0, len(_every_example(batch)), batch_size)]
    return torch.cat([classification_logits(model, batch, c, autocast_dtype=autocast_dtype).argmax(1).cpu()
                      for c in chunks])


def check_labelled(batch: TokenBatch, name: str = "batch") -> None:
    """A batch classification can score: labels and label word ids (``encode_classification``'s); else ValueError
    naming the argument ``name``."""
    if batch.labels is None or batch.label_ids is None:
        raise ValueError(f"Invalid {name}: no {'labels' if batch.labels is None else 'label_ids'} (classification "
                         "needs encode_classification's batch)")


def accuracy(model, batch: TokenBatch, **kwargs) -> float:
    """Fraction of examples whose label word has the largest logit."""
    check_labelled(batch)       # without labels: predictions == None was False, and .double() an AttributeError
    return float((predict(model, batch, **kwargs) == batch.labels).double().mean())


def batched_closure(model, batch: TokenBatch, loss: str = "classification", *, autocast_dtype=None):
    """``indices [B] → losses [B]``, the ``batch_losses`` argument of ``sazo_lite.train``.

    Example:
        >>> losses = batched_closure(model, batch)            # doctest: +SKIP
        >>> result = MeZO(params, lr=1e-4).step(lambda: losses(torch.tensor([0, 3])))  # doctest: +SKIP
    """
    kinds = {"classification": classification_losses, "answer": answer_losses}
    if loss not in kinds:
        raise ValueError(f"Invalid loss: {loss!r} (expected one of {sorted(kinds)})")
    fn = kinds[loss]
    check_deterministic(model)
    return lambda indices: fn(model, batch, checked_indices(indices, len(batch)), autocast_dtype=autocast_dtype)

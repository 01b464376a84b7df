"""Top-block tuning on cached activations: tune only the top k decoder blocks of a causal LM.

A tuning mode (beside full, LoRA and sparse in ``sazo_lite.llm.tuning``): the bottom L − k blocks are
frozen, so the hidden states entering block L − k do not change during tuning. ``TopBlocks`` computes
them once for a whole split (one ordinary forward of the model), then every loss runs only

    h ← block_{L−k}(h), …, block_{L−1}(h)        (the model's own layer modules, [B, T, H])
    ℓ = head(final_norm(h[b, last prompt position]))[label words]        [B, C]
    f_b = −log softmax(ℓ_b)[y_b]                                         [B]

The blocks are called with exactly the arguments the model's own forward passed them (attention
mask, rotary position embeddings from ``model.model.rotary_emb``, position ids: recorded by forward
pre-hooks while the cache was computed), so no attention is re-implemented; the final norm and LM head
run at the scored positions only, and the head only on the verbaliser rows, followed by the map some
families apply to the logits (a scale, a soft cap). Which recorded arguments carry the batch (masks,
per-example position ids, Bloom's ALiBi with one row a head) is found by a second recording over a few
examples. The per-example losses equal the full model's (``classification_losses``) to float rounding,
and the constructor checks that on up to four examples: a family whose forward does something this mode
does not know is refused (ValueError), never scored wrongly.

What it costs and keeps (N examples of padded length T, hidden size H): the cache holds N·T·H
floats (plus the recorded masks and position embeddings); a step costs k blocks' forward on B·T
tokens instead of all L blocks and the head over the vocabulary. Tune LoRA adapters on the top
blocks (``add_lora(model, layers=top_layers(model, k))``) or all their parameters
(``top_block_parameters(model, k)``). A trainable tensor below the top blocks would make the cache
stale: ``TopBlocks`` refuses it (ValueError); an LM head of its own may be tuned too (it runs live), one
tied to the input embeddings may not. Decoder blocks are found at ``model.layers`` (Llama,
SmolLM2, Qwen, Mistral, Gemma, Phi, OLMo, Cohere, Granite, ...), ``transformer.h`` (GPT-2, GPT-J,
GPT-Neo, CodeGen, Falcon, Bloom), ``gpt_neox.layers`` and ``model.decoder.layers`` (OPT), else as the
ModuleList of ``config.num_hidden_layers`` blocks (MPT, BioGPT, ...), plain or wrapped by peft; the
modules between the last block and the head (a final norm of any name, BERT's or Electra's prediction
transform beside the head) are those the model's own forward calls there. Hidden states that are not
batch-first (Gemma 3n's AltUp streams, [4, N, T, H], merged after the last block by code, not modules)
are refused.

Example (a tiny random model; in practice SmolLM2 with ``blocks=1``):
    >>> from sazo_lite.llm import tiny_causal_lm
    >>> from sazo_lite.llm.losses import TokenBatch, classification_losses
    >>> model = tiny_causal_lm("llama", vocab_size=50)
    >>> batch = TokenBatch([[5, 6, 7], [8, 9]], [3, 2], 0, torch.tensor([0, 1]), torch.tensor([3, 4]))
    >>> params = top_block_parameters(model, 1)
    >>> top = TopBlocks(model, batch, blocks=1)
    >>> top([0, 1]).shape, bool(torch.allclose(top([0, 1]), classification_losses(model, batch), atol=1e-5))
    (torch.Size([2]), True)
"""
from __future__ import annotations

import contextlib
import math
import numbers
import warnings

import torch
import torch.nn.functional as F

from ..engine import _caller_level
from ..validation import check_count
from .tuning import check_adapters_read
from .losses import (TokenBatch, _check_vocabulary, at_least_float32, check_deterministic, checked_indices,
                     classification_losses, _model_forward, _rotary_width_dependence, _virtual_tokens)

__all__ = ["TopBlocks", "decoder_layers", "top_layers", "top_block_parameters"]


def _base(model):
    """The transformers model inside a peft wrapper (or the model itself)."""
    return model.get_base_model() if hasattr(model, "get_base_model") else model


# Where causal LMs keep their decoder blocks (the first found wins); elsewhere the shallowest ModuleList
# with one module a layer (``config.num_hidden_layers``) is taken: MPT's and DBRX's ``transformer.blocks``,
# BioGPT's ``biogpt.layers``, Mamba's ``backbone.layers``.
_STACKS = (("model", "layers"), ("transformer", "h"), ("gpt_neox", "layers"), ("model.decoder", "layers"))


def _attribute(module, dotted: str):
    for name in dotted.split("."):
        module = getattr(module, name, None)
    return module


def _stack(model):
    """(the module holding the decoder blocks, the blocks [ModuleList]) of a causal LM."""
    base = _base(model)
    for owner_name, stack in _STACKS:
        owner = _attribute(base, owner_name)
        layers = getattr(owner, stack, None)
        if isinstance(layers, torch.nn.ModuleList):
            return owner, layers
    count = getattr(base.config, "num_hidden_layers", None) if hasattr(base, "config") else None
    lists = [(name, m) for name, m in base.named_modules() if isinstance(m, torch.nn.ModuleList)
             and len(m) == count and len({type(layer) for layer in m}) == 1]
    if count and lists:
        name, layers = min(lists, key=lambda item: item[0].count("."))
        return (base.get_submodule(name.rpartition(".")[0]) if "." in name else base), layers
    raise ValueError(f"Invalid model: {type(base).__name__} is not a supported causal LM (no decoder blocks at "
                     "model.layers, transformer.h, gpt_neox.layers or model.decoder.layers, nor a ModuleList of "
                     "config.num_hidden_layers blocks)")


def _logit_map(model):
    """The elementwise map some families apply to the LM head's logits ([..., V] → [..., V]): Cohere's
    ``logit_scale``, Granite's ``logits_scaling``, Falcon-H1's ``lm_head_multiplier``, Gemma 2/3's
    ``final_logit_softcapping``, RecurrentGemma's ``logits_soft_cap``; the identity elsewhere.
    ``TopBlocks`` checks it on the model's own head output and logits, so a family with another map is
    refused, not scored wrongly."""
    base = _base(model)
    config = base.config
    scale = 1.0
    for value in (getattr(base, "logit_scale", None), getattr(getattr(base, "model", None), "lm_head_multiplier", None)):
        if isinstance(value, (int, float)) and not isinstance(value, bool):
            scale *= float(value)
    divisor = getattr(config, "logits_scaling", None)
    if isinstance(divisor, (int, float)) and not isinstance(divisor, bool):
        scale /= float(divisor)
    cap = getattr(config, "final_logit_softcapping", None) or getattr(config, "logits_soft_cap", None)

    def apply(logits):
        logits = logits * scale if scale != 1.0 else logits
        return torch.tanh(logits / cap) * cap if cap else logits
    return apply


def decoder_layers(model) -> torch.nn.ModuleList:
    """The decoder blocks of a causal LM, bottom to top (``model.model.layers``, ``transformer.h``, ...)."""
    return _stack(model)[1]


def _check_blocks(model, blocks) -> int:
    count = len(decoder_layers(model))
    # a numpy int (a grid from np.arange) is an int too: it was refused as "Invalid blocks: np.int64(1)"
    if isinstance(blocks, bool) or not isinstance(blocks, numbers.Integral) or not 1 <= blocks <= count:
        raise ValueError(f"Invalid blocks: {blocks!r} (expected an int in [1, {count}])")
    return count


def top_layers(model, blocks: int) -> list[int]:
    """Indices of the top ``blocks`` decoder layers (for ``add_lora(..., layers=...)``).

    Example:
        >>> from sazo_lite.llm import tiny_causal_lm
        >>> top_layers(tiny_causal_lm("gpt2", vocab_size=50), 1)
        [1]
    """
    count = _check_blocks(model, blocks)
    return list(range(count - int(blocks), count))


def top_block_parameters(model, blocks: int) -> list[torch.Tensor]:
    """Freeze the model, then make every parameter of the top ``blocks`` blocks trainable; return them."""
    layers = decoder_layers(model)
    _check_blocks(model, blocks)
    for p in model.parameters():
        p.requires_grad_(False)
    params = [p for layer in layers[len(layers) - blocks:] for p in layer.parameters()]
    for p in params:
        p.requires_grad_(True)
    return params


def _batch_axes(full, probe, n: int, p: int):
    """Which recorded block arguments carry the batch, found by experiment: ``full`` was recorded for
    n examples, ``probe`` for p ≠ n of them (with the same padded width and padding). A tensor whose
    first dimension is n·m there and p·m here holds m rows an example, batch-major (m = 1: a plain
    batch dimension; Bloom's ALiBi: m = heads); its entry is m, None for everything else (a tensor
    that does not change with the batch, a value). Same nesting as ``full``."""
    if isinstance(full, torch.Tensor):
        if isinstance(probe, torch.Tensor) and full.dim() >= 1 and probe.dim() == full.dim() \
                and full.shape[1:] == probe.shape[1:] and full.shape[0] % n == 0 \
                and full.shape[0] // n == probe.shape[0] / p >= 1:
            return full.shape[0] // n
        return None
    if isinstance(full, (tuple, list)) and isinstance(probe, (tuple, list)) and len(full) == len(probe):
        return type(full)(_batch_axes(f, q, n, p) for f, q in zip(full, probe))
    if isinstance(full, dict) and isinstance(probe, dict) and full.keys() == probe.keys():
        return {key: _batch_axes(full[key], probe[key], n, p) for key in full}
    return None


def _rows(value, axes, index: torch.Tensor):
    """``value`` (a recorded block argument) for the examples ``index``: where ``axes`` gives m rows an
    example, the rows of those examples (batch-major); everything else as recorded."""
    if isinstance(value, torch.Tensor):
        if not axes:
            return value
        rows = value.reshape(-1, axes, *value.shape[1:]).index_select(0, index.to(value.device))   # [B, m, ...]
        return rows.reshape(-1, *value.shape[1:])
    if isinstance(value, (tuple, list)):
        axes = axes if isinstance(axes, (tuple, list)) else [None] * len(value)
        return type(value)(_rows(v, a, index) for v, a in zip(value, axes))
    if isinstance(value, dict):
        axes = axes if isinstance(axes, dict) else {}
        return {key: _rows(v, axes.get(key), index) for key, v in value.items()}
    return value


def _split_hidden(args, kwargs):
    """(hidden states [N, T, H], the block's other positional args, its kwargs) of a recorded call."""
    if args:
        return args[0], args[1:], kwargs
    kwargs = dict(kwargs)
    return kwargs.pop("hidden_states"), (), kwargs


def _relative_gap(mine: torch.Tensor, model: torch.Tensor) -> float:
    """max |mine − model| / (1 + |model|) over the entries where the two differ: equal entries count 0, a nan
    where the model has one too included (a model with non-finite weights was refused as a family this mode does not
    support, "relative gap nan"); a nan or inf where the model has a number, or another inf, is a gap of nan or inf."""
    same = (mine == model) | (mine.isnan() & model.isnan())
    return float(((mine - model).abs() / (1 + model.abs()))[~same].max()) if not bool(same.all()) else 0.0


class _Recorded(Exception):
    """Stops the caching forward once the top blocks' arguments are recorded."""


class TopBlocks:
    """Per-example classification losses of a causal LM whose top ``blocks`` blocks alone are tuned.

    Args:
        model: a transformers causal LM (or a peft model around one), eval mode.
        batch: the examples (``TokenBatch`` with labels and label word ids, as
            ``encode_classification`` makes them).
        blocks: k, how many top decoder blocks are tuned (1 ≤ k ≤ L).
        check: compare ``logit_map`` of the head's output with the model's logits (one example) and
            the losses with the model's own forward on up to 4 examples, and refuse (ValueError) a
            family whose top blocks this mode cannot reproduce; costs one forward of the full model
            on those examples and one of the top blocks over the split (and a forward of an example the
            model or the cache scores nan: a nan that the example alone does not give, padding's, is refused).

    Call it with indices ([B]) for the losses [B] (float32, float64 for a float64 model; inference mode), as
    ``MeZO.step``'s closure and ``sazo_lite.train``'s ``batch_losses`` want; ``losses(indices, grad=True)`` keeps
    the autograd graph. ``mean_loss()``, ``accuracy()`` and ``grad_norms(params)`` (true per-example norms by
    backprop) cover the split: its examples, labels and label words as ``batch`` held them at construction.
    Construct it again if weights below the top blocks change (the first call
    after a change of their values warns, once: the losses still run on the cache). Every call
    refuses (ValueError) a model in training mode, and top blocks or modules after them with dropout
    left active (``check_deterministic``: adapters peft adds after the cache are in training mode). A split
    padded past the length where a rotary embedding's frequencies depend on the batch's width (``rope_type``
    "dynamic", "longrope"), or to exactly that length while "dynamic" ones hold an earlier batch's stretch, is
    refused: the model's own per-example losses then depend on the batch.
    """

    def __init__(self, model, batch: TokenBatch, blocks: int = 1, *, check: bool = True):
        if not isinstance(batch, TokenBatch) or batch.labels is None or batch.label_ids is None:
            raise ValueError("Invalid batch: expected a TokenBatch with labels and label_ids "
                             "(encode_classification)")
        if len(batch) == 0:
            raise ValueError("Invalid batch: no examples")
        count = _check_blocks(model, blocks)
        if model.training:
            raise ValueError("Invalid model: it is in training mode (dropout would make f_i random); call model.eval()")
        check_deterministic(model)      # a module in training mode under an eval model (adapters added later)
        _check_vocabulary(model, batch)  # before the first forward: an id past the embedding was an IndexError
        self.model, self.batch, self.blocks, self.check = model, batch, int(blocks), bool(check)
        layers = decoder_layers(model)
        self.layers = list(layers[count - blocks:])
        slots = [k for k, layer in enumerate(layers) if any(layer is top for top in self.layers)]
        # one block object in two slots: the hook that records a top block's inputs would fire at its other slot
        if len(slots) != blocks or len({id(layer) for layer in self.layers}) != blocks:
            raise ValueError(f"Invalid model: one decoder block object fills slots {slots} of its stack; the top "
                             f"{blocks} block(s) must each be a module of their own to be run on a cache")
        self.head = _base(model).get_output_embeddings()
        if not isinstance(self.head, torch.nn.Module):
            raise ValueError(f"Invalid model: {type(_base(model)).__name__} has no LM head (get_output_embeddings)")
        self.logit_map = _logit_map(model)
        self.offset = _virtual_tokens(model)    # a prompt-tuned model's hidden states hold its virtual tokens first
        self.device = next(model.parameters()).device
        # copies, as the cached states are of the split as it is now: a change of batch.labels made later reached
        # the losses on a CPU (.to returned the tensor itself) but not on a GPU, and accuracy() on both
        self.label_ids = batch.label_ids.clone().to(self.device)
        self.labels = batch.labels.clone().to(self.device)
        self.after = self._modules_after(layers)
        self._check_frozen_below(model, layers)
        self._check_width_free_positions(int(batch.longest))
        self.hidden, self.arguments, self.batch_axes, self.lengths = self._cache()
        self.live_weights = [p for m in self.layers + self.after + [self.head] for p in m.parameters()]
        self.layout = self._layout()
        below = self._below()
        self.lower = [(name, p) for name, p in model.named_parameters() if id(p) in below and not p.is_meta]
        self.lower_state, self.lower_sums, self.warned_stale = self._lower_state(), self._lower_sums(), False
        if check:
            self._check_equals_the_full_model()

    def _check_width_free_positions(self, width: int) -> None:
        """Refuse a split padded past the length where a rotary embedding's frequencies start to depend on
        the batch's width (``_rotary_width_dependence``): the full model's loss of an example then changes
        with the other examples of its batch, and the cache holds those of the whole split's width."""
        found = _rotary_width_dependence(self.model, width)
        if found is not None:
            why, limit = found
            raise ValueError(f"Invalid batch: its longest example has {width} tokens, {why}, so the model's loss "
                             f"of an example changes with its batch; encode with max_length <= {limit}")

    def _check_frozen_below(self, model, layers) -> None:
        """No trainable tensor may feed the cached hidden states. Every module that can run before the
        cache is taken counts as below: the lower blocks (each slot, whatever else holds the same module
        object) and every module reachable from the model without passing through a top block, the
        modules after them or the LM head. A tensor held by one of them (a weight shared with a lower
        block, a module object placed in a lower and a top layer, a head tied to the input embeddings)
        is below even where a top block holds it too; the top blocks, the modules after them and an LM
        head of its own run live on the cache."""
        self.stack = layers
        held = self._below()
        stale = [name for name, t in [*model.named_parameters(), *model.named_buffers()]
                 if t.requires_grad and id(t) in held]
        if stale:
            raise ValueError(f"Invalid model: {len(stale)} trainable tensors outside the top {self.blocks} "
                             f"block(s) would make the cached hidden states stale (e.g. {stale[0]}); freeze "
                             "them (top_block_parameters, add_lora(layers=top_layers(...))) or raise blocks")

    def _below(self) -> set[int]:
        """ids of the tensors that feed the cache, as the model is now (adapters may have been added since)."""
        layers = self.stack
        lower = list(layers[:len(layers) - self.blocks])
        live = {id(m) for m in self.layers + self.after + [self.head]} - {id(m) for m in lower} | {id(layers)}
        below, todo = {}, lower + [self.model]
        while todo:
            module = todo.pop()
            if id(module) not in below and id(module) not in live:
                below[id(module)] = module
                todo.extend(m for m in module._modules.values() if m is not None)
        return {id(t) for m in below.values() for t in [*m.parameters(recurse=False), *m.buffers(recurse=False)]}

    @torch.no_grad()
    def _modules_after(self, layers) -> list[torch.nn.Module]:
        """The modules the model applies between its last block and the LM head, in call order (the
        final norm, whatever its name; OPT's ``project_out``; BERT's and Electra's prediction transform
        beside the head): the outermost modules, neither holding nor inside the blocks or the head, that
        return after the last block did and before the head is called, found by running the model on one
        example. The same run checks ``logit_map`` on the head's output against the model's logits (every
        position and word): a map after the head that this mode does not know is refused here, however small."""
        order, finished, head_out = [], [], []
        names = {id(m): name for name, m in _base(self.model).named_modules()}
        held = {id(m) for m in [*layers.modules(), *self.head.modules()]}
        for name in (names.get(id(layers)), names.get(id(self.head))):   # the modules that hold them: the model, ...
            parts = [] if name is None else name.split(".")
            held |= {id(_base(self.model).get_submodule(".".join(parts[:k]))) for k in range(len(parts))}
        candidates = [m for m in _base(self.model).modules() if id(m) not in held]
        handles = [layers[-1].register_forward_hook(lambda *_: finished.append(True)),
                   self.head.register_forward_pre_hook(lambda *_: finished.append(False)),
                   self.head.register_forward_hook(lambda module, args, output: head_out.append(output))]

        def called(module, args, output):
            if finished and finished[-1] and all(module is not seen for seen in order):
                order.append(module)
        handles += [m.register_forward_hook(called) for m in candidates]
        inputs = self.batch.select([0], self.device)
        try:
            logits = _model_forward(self.model, input_ids=inputs["input_ids"], attention_mask=inputs["attention_mask"],
                                   use_cache=False).logits
        finally:
            for handle in handles:
                handle.remove()
        if self.check and len(head_out) == 1 and isinstance(head_out[0], torch.Tensor) \
                and head_out[0].shape == logits.shape:
            mapped, logits = at_least_float32(self.logit_map(head_out[0])), at_least_float32(logits)   # [1, T, V]
            tolerance = 8 * torch.finfo(head_out[0].dtype).eps if head_out[0].is_floating_point() else 0.0
            gap = _relative_gap(mapped, logits)
            if not gap <= tolerance:
                raise ValueError(f"Invalid model: {type(_base(self.model)).__name__} maps its LM head's output to "
                                 f"its logits in a way this mode does not know (relative gap {gap:.1e})")
        inside = lambda m: any(names[id(m)].startswith(names[id(o)] + ".") for o in order if o is not m)
        return [m for m in order if not inside(m)]          # a submodule runs within its parent's call

    @torch.no_grad()
    def _record(self, input_ids, attention_mask) -> list[tuple]:
        """Run the model up to its top block, returning each tuned block's (args, kwargs) as called."""
        recorded: dict[int, tuple] = {}

        def record(k):
            def hook(module, args, kwargs):
                recorded[k] = (args, kwargs)
                if k == len(self.layers) - 1:
                    raise _Recorded          # the top block's inputs are all we need: skip the rest
            return hook

        handles = [layer.register_forward_pre_hook(record(k), with_kwargs=True) for k, layer in enumerate(self.layers)]
        try:
            with contextlib.suppress(_Recorded):
                _model_forward(self.model, input_ids=input_ids, attention_mask=attention_mask, use_cache=False)
        finally:
            for handle in handles:
                handle.remove()
        if len(recorded) != len(self.layers):
            raise ValueError("Invalid model: its forward did not call every top block")
        return [_split_hidden(*recorded[k]) for k in range(len(self.layers))]

    def _cache(self):
        """Run the model once over every example (right-padded to one width), recording the hidden
        states entering the first tuned block and every tuned block's other arguments. A second run
        over a few of them tells which arguments carry the batch (``_batch_axes``): the longest and
        the shortest example (the same width, padded as the whole split is), or for N ≤ 2 all of them
        and the shortest again (a selection may repeat an example: sampling is with replacement)."""
        inputs = self.batch.select(range(len(self.batch)), self.device)
        ids, mask, n = inputs["input_ids"], inputs["attention_mask"], len(self.batch)
        full = self._record(ids, mask)
        hidden = full[0][0].detach()                                                 # [N, T, H]
        arguments = [(args, kwargs) for _, args, kwargs in full]
        lengths = inputs["lengths"].cpu()
        rows = [int(lengths.argmax()), int(lengths.argmin())]
        rows = rows if n > 2 else list(range(n)) + rows[1:]
        recorded = self._record(ids[rows], mask[rows])
        self._check_batch_first(hidden, recorded[0][0], n, len(rows))
        probe = [(args, kwargs) for _, args, kwargs in recorded]
        return hidden, arguments, _batch_axes(arguments, probe, n, len(rows)), inputs["lengths"]

    def _check_batch_first(self, hidden, probe, n: int, p: int) -> None:
        """Refuse hidden states whose first dimension is not the batch (n examples, then p ≠ n): Gemma 3n's
        blocks take its AltUp streams stacked ahead of the batch, [4, N, T, H], and its forward merges them
        after the last block by code of its own, not a module this mode could run on the cache."""
        if not (isinstance(hidden, torch.Tensor) and isinstance(probe, torch.Tensor) and hidden.dim() >= 2
                and hidden.shape[0] == n and probe.shape[0] == p):
            shape = tuple(hidden.shape) if isinstance(hidden, torch.Tensor) else type(hidden).__name__
            raise ValueError(f"Invalid model: {type(_base(self.model)).__name__}'s decoder blocks take hidden states "
                             f"of shape {shape} for {n} examples, not batch-first [{n}, T, H] (streams stacked "
                             "ahead of the batch, as Gemma 3n's); its top blocks cannot be run on cached "
                             "activations: tune the whole model (classification_losses) instead")

    def _check_equals_the_full_model(self) -> None:
        """Refuse a model whose top-block losses differ from its own forward's (an unsupported family:
        another map after the head, arguments this cache cannot index): compared on up to 4 examples,
        in reverse order and one of them twice (a wrongly indexed argument shows)."""
        indices = list(range(len(self) - 1, max(len(self) - 5, -1), -1))
        indices.append(indices[0])
        with torch.no_grad():
            full = classification_losses(self.model, self.batch, indices).to(self.device)
        try:
            top = self.losses(indices)
        except (RuntimeError, IndexError) as error:
            raise ValueError(f"Invalid model: {type(_base(self.model)).__name__}'s top blocks cannot be run on "
                             f"cached activations ({type(error).__name__}: {error})") from error
        dtype = self.hidden.dtype if self.hidden.is_floating_point() else torch.float32
        tolerance = max(1e-4, 4 * torch.finfo(dtype).eps)
        gap = _relative_gap(top, full)
        if not gap <= tolerance:
            raise ValueError(f"Invalid model: {type(_base(self.model)).__name__}'s top-block losses differ from its "
                             f"full forward's (relative gap {gap:.2e} > {tolerance:.0e}): a family this mode does "
                             "not support (a step of its forward between its blocks, after the last one or after the "
                             "LM head that it does not know)")
        self._check_nan_is_the_models(indices, full)

    def _check_nan_is_the_models(self, indices: list[int], full: torch.Tensor) -> None:
        """A nan the model's forward gives an example in a padded batch counts as agreeing (``_relative_gap``) only
        if the model gives it that example alone too (a non-finite weight): a float64 model with eager attention
        gives nan where padding leaves a query row with no key (transformers softmaxes its float64 mask in
        float32, where the mask's minimum is -inf), and the check compared nan with nan and passed. Checked on
        the examples compared and on the shortest example the cache scores nan (the most padded: where padding
        leaves a row with no key, it does there first)."""
        suspects = [i for i, loss in zip(indices, full.tolist()) if math.isnan(loss)]
        with torch.no_grad():
            scored = torch.cat([self.losses(range(s, min(s + 64, len(self)))) for s in range(0, len(self), 64)])
        nan = scored.isnan().nonzero().flatten().tolist()
        if nan:
            suspects.append(min(nan, key=lambda i: (int(self.lengths[i]), i)))
        for k in dict.fromkeys(suspects):
            with torch.no_grad():
                alone = float(classification_losses(self.model, self.batch, [k]))
            if not math.isnan(alone):
                raise ValueError(f"Invalid model: its loss of example {k} is nan in a padded batch but {alone:.4g} "
                                 "alone (padding leaves a query row with no key to attend to: a float64 model with "
                                 "eager attention gives nan there); load it in float32 or with "
                                 "attn_implementation='sdpa'")

    def _layout(self) -> list[tuple]:
        """(dtype, device) of each weight that runs on the cache (top blocks, final norm, head): runs before
        every loss, so the weights are listed once (``Module.to`` keeps the Parameter objects)."""
        return [(p.dtype, p.device) for p in self.live_weights]

    def _lower_state(self) -> list[tuple[int, int]]:
        """(version counter, data address) of each weight that fed the cache: an in-place change (``mul_``,
        ``copy_``, ``load_state_dict``) bumps the first, ``p.data = ...`` moves the second. Read at every call."""
        return [(p._version, p.data_ptr()) for _, p in self.lower]

    @torch.no_grad()
    def _lower_sums(self) -> list[tuple[float, float]]:
        """(Σ w, ‖w‖) in float64 of each weight that fed the cache: tells a change of values from a write of the
        same values (``restore_snapshot`` of every tensor)."""
        return [(float(torch.sum(p, dtype=torch.float64)), float(torch.linalg.vector_norm(p, dtype=torch.float64)))
                for _, p in self.lower]

    def _check_lower(self) -> None:
        """Warn (once) where a weight below the top blocks changed since the cache was made: the losses still run
        on the cached states, computed with the old weights, while the model's own forward uses the new ones."""
        state = self._lower_state()
        if state == self.lower_state:
            return
        sums = self._lower_sums()
        changed = [name for (name, _), old, new in zip(self.lower, self.lower_sums, sums) if old != new]
        self.lower_state, self.lower_sums = state, sums
        if changed and not self.warned_stale:
            self.warned_stale = True
            warnings.warn(f"TopBlocks: {len(changed)} weights below the top {self.blocks} block(s) changed since the "
                          f"cache was made (e.g. {changed[0]}); the losses run on the cached hidden states of the "
                          "old weights: construct TopBlocks again (warned once)", UserWarning,
                          stacklevel=_caller_level())

    def _check_layout(self) -> None:
        """A model moved to another dtype or device since the cache was made: a ValueError that says so
        (the cached float32 states met bfloat16 weights in a matmul's dtype error; the lower blocks' weights,
        rounded by the move, would not be seen either)."""
        now = self._layout()
        if now != self.layout:
            said = lambda layout: ", ".join(sorted({f"{str(d).removeprefix('torch.')} on {v}" for d, v in layout}))
            raise ValueError(f"Invalid model: its top blocks' weights moved from {said(self.layout)} to "
                             f"{said(now)} since the cache was made; construct TopBlocks again")

    def __len__(self) -> int:
        return len(self.labels)         # the cached examples (an example appended to batch since has no state)

    def __call__(self, indices) -> torch.Tensor:
        return self.losses(indices)

    def _index(self, indices) -> torch.Tensor:
        return torch.as_tensor(checked_indices(indices, len(self)), dtype=torch.long).to(self.device)

    def logits(self, indices, *, grad: bool = False) -> torch.Tensor:
        """Label-word logits at each example's last prompt position: float32 [B, C]."""
        index = self._index(indices)
        self._check_layout()
        self._check_lower()
        if self.model.training:       # put in training mode since: dropout would make f_i random
            raise ValueError("Invalid model: it is in training mode (dropout would make f_i random); call model.eval()")
        for module in self.layers + self.after + [self.head]:   # adapters peft added since, in training mode
            check_deterministic(module)
        mode = torch.enable_grad() if grad else torch.inference_mode()
        with mode:
            h = self.hidden.index_select(0, index)                               # [B, T, H]
            for layer, (args, kwargs), (args_axes, kwargs_axes) in zip(self.layers, self.arguments, self.batch_axes):
                out = layer(h, *_rows(args, args_axes, index), **_rows(kwargs, kwargs_axes, index))
                h = out[0] if isinstance(out, tuple) else out
            rows = torch.arange(len(index), device=h.device)
            h = h[rows, self.lengths.index_select(0, index) - 1 + self.offset]   # [B, H]: scored positions only
            for module in self.after:
                h = module(h)
            if type(self.head) is torch.nn.Linear:                               # the verbaliser rows only
                bias = None if self.head.bias is None else self.head.bias[self.label_ids]
                # in the head's dtype, as a model whose states run in another casts them (Mamba's float32 residual)
                h = h.to(self.head.weight.dtype)
                logits = self.logit_map(F.linear(h, self.head.weight[self.label_ids], bias))   # [B, C]
                return at_least_float32(logits)
            return at_least_float32(self.logit_map(self.head(h)[:, self.label_ids]))

    def losses(self, indices, *, grad: bool = False) -> torch.Tensor:
        """Per-example verbaliser cross-entropy: float32 [B], float64 for a float64 model (``grad=True``: keep the
        autograd graph)."""
        index = self._index(indices)        # once: a generator was spent by the logits ("Invalid indices")
        logits = self.logits(index, grad=grad)
        return F.cross_entropy(logits, self.labels.index_select(0, index), reduction="none")

    def mean_loss(self, *, chunk: int = 64) -> float:
        """F(θ) = mean loss over the whole split."""
        chunk = check_count("chunk", chunk)     # -1: no chunk ran and F was 0.0
        return float(sum(float(self.losses(range(s, min(s + chunk, len(self)))).sum())
                         for s in range(0, len(self), chunk))) / len(self)

    def predict(self, *, chunk: int = 64) -> torch.Tensor:
        """Predicted class per example: LongTensor [N] on the CPU."""
        chunk = check_count("chunk", chunk)
        return torch.cat([self.logits(range(s, min(s + chunk, len(self)))).argmax(1).cpu()
                          for s in range(0, len(self), chunk)])

    def accuracy(self) -> float:
        """Fraction of examples whose label word has the largest logit."""
        return float((self.predict() == self.labels.cpu()).double().mean())

    def check_params(self, params) -> list[torch.Tensor]:
        """``params`` as a list, each a tensor that runs on the cache only (the top blocks, the modules after
        them, the LM head) and is read there (no merged, disabled or inactive peft adapter:
        ``check_adapters_read``); else ValueError: a tensor that feeds the cached states or runs nowhere here
        would be moved (MeZO) or differentiated (``grad_norms``) without these losses seeing it."""
        params = list(params)
        live = {id(p) for m in self.layers + self.after + [self.head] for p in m.parameters()}   # as they are now
        below = self._below()
        cached = [k for k, p in enumerate(params) if id(p) in below or id(p) not in live]
        if cached:      # the cache is detached: their part of each gradient (through the lower blocks) is not seen
            raise ValueError(f"Invalid params: {len(cached)} tensors (e.g. params[{cached[0]}]) are not run on the "
                             f"cache only (they feed the cached states or are not in the top {self.blocks} "
                             "block(s), the modules after them or the LM head): tune the top blocks' tensors only, "
                             "or score the whole model (a TokenBatch; grad_norms(model, batch, params))")
        check_adapters_read(self.model, params)      # merged or disabled adapters run nowhere either
        return params

    def grad_norms(self, params, indices=None, *, method: str = "auto") -> torch.Tensor:
        """True per-example gradient norms ‖∇f_i‖ over ``params`` by backprop: float64 [len(indices)].

        ``method``: "linear" (one batched backward; every tensor a Linear's weight/bias, e.g. LoRA),
        "loop" (one backward per example, any tensors) or "auto" (linear when it applies).
        """
        from .grad_norms import _checked, _HooksCannotSplit, linear_grad_norms, linear_modules_for, loop_grad_norms

        if method not in ("auto", "linear", "loop"):
            raise ValueError(f"Invalid method: {method!r} (expected 'auto', 'linear' or 'loop')")
        params = self.check_params(params)
        indices = range(len(self)) if indices is None else _checked(indices, len(self))   # not int(1.5); [] → []
        if not indices:
            return torch.zeros(0, dtype=torch.float64)
        losses = lambda idx: self.losses(idx, grad=True)
        head = {id(p) for p in self.head.parameters()} & {id(p) for p in params}   # run on its label rows only
        if head and method == "linear":
            raise ValueError("Invalid method: 'linear' (the LM head is tuned and runs on its label rows, not as a "
                             "module the batched hooks see; use 'loop' or 'auto')")
        if method == "loop" or (method == "auto" and (head or linear_modules_for(self.model, params, subclasses=True) is None)):
            return loop_grad_norms(losses, params, indices)
        try:
            return linear_grad_norms(self.model, losses, params, indices)
        except _HooksCannotSplit:         # a Linear run twice or fed rows not batch-major: the exact loop
            if method == "linear":
                raise
        return loop_grad_norms(losses, params, indices)

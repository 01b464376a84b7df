"""Which parameters ZO perturbs: full, LoRA (via peft) or a fixed sparse subset; dtype care.

Memory each mode costs on top of inference (d = model parameters, r = LoRA rank):

| mode   | perturbed tensors          | extra memory during a step                        |
|--------|----------------------------|---------------------------------------------------|
| full   | all d                      | one tensor's worth of z (largest: the embedding)  |
| LoRA   | r·(d_in+d_out) per module  | the adapters (≈0.1–1% of d) + their z             |
| sparse | k = fraction·d entries     | k int64 indices (8 bytes each) + k floats of z    |
| top-block | the top k blocks (LoRA or all) | a cache of the hidden states entering block L−k (N·T·H floats) |

Top-block tuning (``sazo_lite.llm.topblock.TopBlocks``) also cuts a step's compute: only the top k
blocks run (the model's own layer modules on cached activations), the head at the scored positions.

None of the first three keeps activations, gradients or optimiser state: that is the ZO memory win.

Sparse subsets are ``sazo_lite.sparse``; half precision and its restore bound ``sazo_lite.precision``.
"""
from __future__ import annotations

import numbers
import warnings

import torch

from ..validation import check_int, check_number, check_seed


__all__ = ["trainable_parameters", "full_parameters", "add_lora", "parameter_count", "check_adapters_read"]


def trainable_parameters(model) -> list[torch.Tensor]:
    """Parameters with ``requires_grad`` (what MeZO should perturb), in module order."""
    return [p for p in model.parameters() if p.requires_grad]


def full_parameters(model) -> list[torch.Tensor]:
    """All parameters, each tied tensor once (tied embeddings are one tensor)."""
    seen, params = set(), []
    for p in model.parameters():
        if id(p) not in seen:
            seen.add(id(p))
            params.append(p)
    return params


def check_adapters_read(model, params) -> None:
    """ValueError where a tensor of ``params`` is a peft adapter tensor (LoRA's A or B, ...) that ``model``'s forward
    does not read now: its layer holds a merged adapter (``merge_adapter``: the layer then runs its base weight
    alone), its adapters are disabled (``disable_adapter``) or another adapter is active (``set_adapter``): MeZO
    would move such a tensor while the losses, hence every δ, do not change."""
    try:
        from peft.tuners.tuners_utils import BaseTunerLayer
    except ImportError:         # no peft: no adapters
        return
    wanted = {id(p): k for k, p in enumerate(params)}
    unread = set()
    for module in model.modules():
        if not isinstance(module, BaseTunerLayer):
            continue
        for layer_name in module.adapter_layer_names:
            holder = getattr(module, layer_name, None)
            if not isinstance(holder, (torch.nn.ModuleDict, torch.nn.ParameterDict)):
                continue
            for adapter, held in holder.items():
                if module.disable_adapters or module.merged or adapter not in module.active_adapters:
                    tensors = held.parameters() if isinstance(held, torch.nn.Module) else [held]
                    unread.update(wanted[id(t)] for t in tensors if id(t) in wanted)
    if unread:
        raise ValueError(f"Invalid params: {len(unread)} of {len(params)} tensors (e.g. params[{min(unread)}]) are "
                         "peft adapter weights the model's forward does not read now (adapters merged into the base "
                         "weights: call model.unmerge_adapter(); disabled; or another adapter active); the losses "
                         "would not see them")


def parameter_count(params) -> int:
    """Number of scalar entries in a list of tensors."""
    return sum(p.numel() for p in params)


def _linear_names(modules) -> list[str]:
    """The last names of the linear modules (Linear, GPT-2's Conv1D) among ``modules`` ([(name, module)])."""
    return sorted({name.rsplit(".", 1)[-1] for name, m in modules
                   if isinstance(m, torch.nn.Linear) or type(m).__name__ == "Conv1D"} - {"lm_head"})


def _default_targets(model) -> list[str]:
    """peft's default target modules for the family (passed explicitly: peft's own lookup fails on some
    mixture-of-experts models, e.g. Mixtral), else q_proj/v_proj where the model has both (MeZO's and
    LoRA's choice); else a ValueError naming the model's linear modules to choose from."""
    from peft.utils import TRANSFORMERS_MODELS_TO_LORA_TARGET_MODULES_MAPPING as defaults

    model_type = getattr(getattr(model, "config", None), "model_type", None)
    if model_type in defaults:
        return list(defaults[model_type])
    if {"q_proj", "v_proj"} <= {name.rsplit(".", 1)[-1] for name, _ in model.named_modules()}:
        return ["q_proj", "v_proj"]
    raise ValueError(f"Invalid target_modules: None, and peft has no default for {model_type!r} nor has the model "
                     f"q_proj/v_proj; pass target_modules (its linear modules: {_linear_names(model.named_modules())})")


def _check_targets_in_layers(stack, target_modules, layers) -> None:
    """A list of module names must name at least one module in the adapted decoder layers (of ``stack``)."""
    if isinstance(target_modules, str):     # peft reads a string as a regular expression: peft checks it
        return
    modules = [(name, m) for i in layers for name, m in stack[i].named_modules()]
    if not {name.rsplit(".", 1)[-1] for name, _ in modules} & set(target_modules):
        raise ValueError(f"Invalid target_modules: {sorted(target_modules)} name no module of layers {layers} "
                         f"(their linear modules: {_linear_names(modules)})")


def add_lora(model, *, rank: int = 8, alpha: int = 16, target_modules=None, init_seed: int = 0, layers=None):
    """Wrap ``model`` with peft LoRA adapters; only the adapters require grad.

    W x → W x + (α/r)·B A x with A [r, d_in], B [d_out, r]. peft initialises B = 0 (the
    model is unchanged at the start) and A randomly (seeded here by ``init_seed``).

    Args:
        model: a transformers causal LM.
        rank: r ≥ 1.
        alpha: the LoRA scale numerator α.
        target_modules: module names to adapt; None uses peft's default for the family
            (q_proj/v_proj for Llama, OPT, Qwen2, Mixtral; c_attn for GPT-2), or q_proj/v_proj where
            peft has none and the model has modules of those names (OLMo, Cohere, Granite, SmolLM3,
            ...); elsewhere (Mamba, Phi-3's fused qkv_proj) a ValueError lists the linear modules.
        init_seed: seeds A's initialisation.
        layers: decoder-layer indices to adapt (None: every layer); e.g.
            ``sazo_lite.llm.topblock.top_layers(model, k)`` for top-block tuning.

    Returns:
        The ``PeftModel`` in eval mode; pass ``trainable_parameters(peft_model)`` to MeZO.
    """
    from peft import LoraConfig, get_peft_model
    from peft.tuners.tuners_utils import BaseTunerLayer

    # peft injects its layers into the model in place: a second add_lora (on the PeftModel or on the base it
    # returned) put its adapter "default" over the first, whose tuned weights were lost without a word
    if any(isinstance(module, BaseTunerLayer) for module in model.modules()):
        raise ValueError("Invalid model: it already holds peft adapters (a second add_lora replaced them); "
                         "merge them first (model = model.merge_and_unload()) or start from a fresh model")
    rank = check_int("rank", rank, 1)       # a numpy int is an int too (it was refused)
    # α = 0 makes every adapter a no-op: each ZO step would see δ = 0 and learn nothing, silently
    check_number("alpha", alpha, 0.0, closed_low=False)
    init_seed = check_seed("init_seed", init_seed)   # 2**70 was torch's bare "Overflow", 1.5 seeded as 1
    extra = {}
    if layers is not None:
        from .topblock import decoder_layers

        stack = decoder_layers(model)
        # one int was list()'s TypeError; a tensor of indices gave 0-d tensors, refused as "tensor(1)"
        layers = layers.tolist() if isinstance(layers, torch.Tensor) and layers.dim() == 1 else layers
        if not isinstance(layers, (numbers.Number, str, bytes, torch.Tensor)) and hasattr(layers, "__iter__"):
            layers = list(layers)
        if not isinstance(layers, list) or not layers:
            raise ValueError(f"Invalid layers: {layers!r} (expected a list of indices in [0, {len(stack)}), e.g. "
                             "top_layers(model, k))")
        layers = [check_int("layers", i, 0, len(stack) - 1) for i in layers]     # int(1.7) adapted layer 1
        extra = dict(layers_to_transform=layers)
    if target_modules is None:
        target_modules = _default_targets(model)
    if layers is not None:
        _check_targets_in_layers(stack, target_modules, layers)
    config = LoraConfig(r=rank, lora_alpha=alpha, target_modules=target_modules, lora_dropout=0.0,
                        task_type="CAUSAL_LM", **extra)
    with torch.random.fork_rng(devices=[]), warnings.catch_warnings():
        # peft reads model.is_gradient_checkpointing, which transformers deprecates with a FutureWarning
        # every user of add_lora saw and could do nothing about (peft's call, not theirs)
        warnings.filterwarnings("ignore", message=".*is_gradient_checkpointing.*", category=FutureWarning)
        torch.manual_seed(init_seed)
        try:
            peft_model = get_peft_model(model, config)
        except Exception:
            # peft injects module by module: a target it cannot adapt (a norm) left the adapters before it in the
            # model, which every later add_lora then refused as "already holds peft adapters"
            _remove_adapters(model, BaseTunerLayer)
            raise
    return peft_model.eval()


def _remove_adapters(model, layer_type) -> None:
    """Put back each module peft wrapped in ``model`` (a ``layer_type``) by the module it wraps."""
    for name, module in list(model.named_modules()):
        if isinstance(module, layer_type):
            parent, _, child = name.rpartition(".")
            setattr(model.get_submodule(parent) if parent else model, child, module.get_base_layer())

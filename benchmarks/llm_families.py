"""Which transformers families the top-block mode reproduces: a probe over tiny random models.

For each family a 3-layer (4 for the hybrids whose layer pattern needs it), width-32 causal LM is built
from its config (no download), every parameter of the top k blocks is jiggled, and ``TopBlocks``'
per-example losses are compared with the full model's forward on padded examples, for k = 1, 2 and
every block. Each family ends as ``equal`` (the largest gap printed), ``refused`` (``TopBlocks`` raised
ValueError: a family it cannot reproduce) or ``crashed`` (any other error: a defect), and ``no model``
where this transformers version cannot build the tiny config or its own forward fails on it (not the
mode's doing).

    python -m benchmarks.llm_families [--families Llama Mamba ...] [--json out.json]
"""
from __future__ import annotations

import argparse
import json
import warnings
from pathlib import Path

import torch

from benchmarks.cli import check_output, machine, measured_line
from sazo_lite.atomic import write_text
from sazo_lite.llm.losses import TokenBatch, classification_losses
from sazo_lite.llm.topblock import TopBlocks, decoder_layers, top_block_parameters

SIZES = dict(hidden_size=32, intermediate_size=64, num_hidden_layers=3, num_attention_heads=4,
             num_key_value_heads=2, max_position_embeddings=128)
# What a family's config needs beyond SIZES to be tiny and runnable (its defaults assume a large model).
FAMILIES = {
    "Llama": {}, "Mistral": {}, "Mixtral": {}, "Qwen2": {}, "Qwen2Moe": {}, "Qwen3": {}, "Qwen3Moe": {},
    "Qwen3Next": dict(num_hidden_layers=4, head_dim=8, linear_key_head_dim=8, linear_value_head_dim=8,
                      linear_num_key_heads=2, linear_num_value_heads=4),
    "Gemma": {}, "Gemma2": dict(head_dim=8), "Gemma3Text": {}, "RecurrentGemma": {},
    "Phi": {}, "Phi3": {}, "Olmo": {}, "Olmo2": {}, "Olmo3": {}, "StableLm": {}, "Starcoder2": {},
    "Cohere": dict(logit_scale=0.5), "Cohere2": {}, "Granite": dict(logits_scaling=4.0), "Glm": {}, "Glm4": {},
    "SmolLM3": {}, "Exaone4": {}, "Ernie4_5": {}, "Helium": dict(head_dim=8), "Apertus": {}, "Arcee": {},
    "SeedOss": {}, "Nemotron": dict(head_dim=8), "Persimmon": {}, "BitNet": {}, "Llama4Text": {},
    "GptOss": {}, "MiniMax": {}, "Lfm2": {},
    "DeepseekV3": dict(qk_rope_head_dim=4, qk_nope_head_dim=4, v_head_dim=8, kv_lora_rank=8, q_lora_rank=8,
                       num_key_value_heads=4, first_k_dense_replace=1, n_routed_experts=4,
                       num_experts_per_tok=2, moe_intermediate_size=16, n_group=1, topk_group=1),
    "Jamba": dict(attn_layer_offset=1, attn_layer_period=2, expert_layer_offset=1, expert_layer_period=2),
    "Zamba2": dict(num_hidden_layers=4, layers_block_type=["mamba", "hybrid", "mamba", "hybrid"]),
    "Mamba": {}, "FalconMamba": {},
    "Olmoe": dict(num_experts=4, num_experts_per_tok=2), "GraniteMoe": dict(num_local_experts=4, num_experts_per_tok=2),
    "Phimoe": dict(num_local_experts=4, num_experts_per_tok=2),
    # Falcon-H1's default state-space sizes (1,024 channels, 128 heads, state 256) made one probe take minutes
    "FalconH1": dict(head_dim=8, mamba_d_ssm=32, mamba_n_heads=4, mamba_d_head=8, mamba_d_state=8, mamba_chunk_size=16),
    # Gemma 3n's defaults share the KV cache of 15 layers and read per-layer inputs of 262,144 ids; refused
    "Gemma3nText": dict(head_dim=8, vocab_size_per_layer_input=64, hidden_size_per_layer_input=8, laurel_rank=4,
                        num_kv_shared_layers=1, activation_sparsity_pattern=[0.0] * 3,
                        layer_types=["sliding_attention", "full_attention", "full_attention"]),
    "GPT2": {}, "GPTBigCode": {}, "GPTJ": dict(rotary_dim=4, n_embd=32, n_layer=3, n_head=4, n_positions=128),
    "GPTNeo": dict(num_layers=3, num_heads=4, window_size=4,
                   attention_types=[[["global", "local"], 1], [["global"], 1]]),
    "CodeGen": dict(rotary_dim=4, n_embd=32, n_layer=3, n_head=4, n_positions=128, n_ctx=128),
    "GPTNeoX": {}, "Bloom": dict(n_head=4), "Falcon": {}, "OPT": {}, "XGLM": {}, "BioGpt": {},
    "Mpt": dict(d_model=32, n_heads=4, n_layers=3, max_seq_len=128),
}


def padded_examples(n: int = 7, vocab: int = 64) -> TokenBatch:
    """n examples of 3 … 9 tokens (every selection right-padded), 2 classes on label words 5 and 9."""
    g = torch.Generator().manual_seed(0)
    ids = [torch.randint(3, vocab, (3 + 5 * k % 7,), generator=g).tolist() for k in range(n)]
    return TokenBatch(ids, [len(r) for r in ids], 0, torch.randint(0, 2, (n,), generator=g), torch.tensor([5, 9]))


def tiny_model(family: str):
    """The family's tiny random causal LM (eval mode), or None if this transformers cannot run it."""
    import transformers
    from transformers import AutoModelForCausalLM

    try:
        config = getattr(transformers, f"{family}Config")(vocab_size=64, pad_token_id=0, bos_token_id=1,
                                                          eos_token_id=2, **{**SIZES, **FAMILIES[family]})
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(1)
            model = AutoModelForCausalLM.from_config(config).eval()
        classification_losses(model, padded_examples())            # its own forward must run
        return model
    except Exception:       # noqa: BLE001 - any failure here is the family's or this version's, reported as such
        return None


def probe(family: str, blocks: int) -> dict:
    """{"outcome": equal | refused | crashed | no model, "gap": max |top − full| or None, "error": str}."""
    model = tiny_model(family)
    if model is None:
        return {"outcome": "no model", "gap": None, "error": ""}
    batch, indices = padded_examples(), [5, 0, 3, 6]
    try:
        params = top_block_parameters(model, blocks)
        with torch.no_grad():
            g = torch.Generator().manual_seed(3)
            for p in params:
                p.add_(0.3 * torch.randn(p.shape, generator=g))
        top = TopBlocks(model, batch, blocks=blocks)
        gap = float((top(indices) - classification_losses(model, batch, indices)).abs().max())
        return {"outcome": "equal", "gap": gap, "error": "", "layers": len(decoder_layers(model))}
    except ValueError as error:
        return {"outcome": "refused", "gap": None, "error": str(error)[:200]}
    except Exception as error:  # noqa: BLE001 - a crash is what this probe exists to find
        return {"outcome": "crashed", "gap": None, "error": f"{type(error).__name__}: {str(error)[:200]}"}


def summary(out: dict) -> str:
    """The count of families per outcome; a family whose k differ in outcome is counted as mixed (and named),
    so that the counts add up to the families probed.

    >>> summary({"A": {1: {"outcome": "equal"}}, "B": {1: {"outcome": "equal"}, 3: {"outcome": "refused"}}})
    '1 equal, 0 refused, 0 crashed, 0 no model, 1 mixed (B)'
    """
    outcomes = ("equal", "refused", "crashed", "no model")
    counts = {o: sum(all(r["outcome"] == o for r in v.values()) for v in out.values()) for o in outcomes}
    mixed = [family for family, v in out.items() if len({r["outcome"] for r in v.values()}) > 1]
    text = ", ".join(f"{n} {o}" for o, n in counts.items())
    return text + (f", {len(mixed)} mixed ({', '.join(mixed)})" if mixed else "")


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.llm_families", description=__doc__.splitlines()[0])
    parser.add_argument("--families", nargs="+", default=sorted(FAMILIES), choices=sorted(FAMILIES), metavar="F",
                        help=f"the families to probe (default: all): {', '.join(sorted(FAMILIES))}")
    parser.add_argument("--json", type=Path, default=None, help="also write the outcomes to this JSON file")
    args = parser.parse_args(argv)
    args.families = list(dict.fromkeys(args.families))     # a family named twice is probed once
    check_output(parser, "--json", args.json)
    if args.json is not None:
        args.json.parent.mkdir(parents=True, exist_ok=True)     # a missing folder: made now, not a crash after the probes
    warnings.filterwarnings("ignore")
    import transformers

    # what a family does depends on the transformers version: the outcomes carry it, with the date
    info = {**machine(), "transformers": transformers.__version__}
    print(f"llm_families, {measured_line(info)}, transformers {info['transformers']}", flush=True)
    out = {}
    for family in args.families:
        every = FAMILIES[family].get("num_hidden_layers", SIZES["num_hidden_layers"])   # k = L: all its blocks
        out[family] = {blocks: probe(family, blocks) for blocks in (1, 2, every)}
        cells = [f"k={k}: {r['outcome']}" + (f" {r['gap']:.1e}" if r["gap"] is not None else "")
                 + (f" ({r['error'][:80]})" if r["error"] else "") for k, r in out[family].items()]
        print(f"{family:15s} " + " | ".join(cells), flush=True)
    print("families: " + summary(out))
    if args.json:
        write_text(args.json, json.dumps({"machine": info, **out}, indent=1))     # beside the families: when, where


if __name__ == "__main__":
    main()

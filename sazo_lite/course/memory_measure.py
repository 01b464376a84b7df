"""Measure what inference, a MeZO step and a backprop step really cost, to check ``sazo_lite.course.memory``.

One fresh Python process per measurement (peak memory only ever grows within a process):

    child: import torch; build a small Llama-style decoder (the setup's dtype, seed 0); warm up at N=16;
           baseline = peak RSS so far;  run ONE step at the requested N;  extra = peak RSS − baseline

(peak RSS = ``VmHWM`` on Linux, else ``getrusage(...).ru_maxrss``; see ``peak_rss_bytes``)

``extra`` is what the step needs on top of the weights and the batch, i.e. the model's
prediction minus the weights. On CUDA the child also reports ``torch.cuda.max_memory_allocated``
above the same baseline (exact allocator bytes, no page granularity, no runtime).

The child fixes glibc's mmap threshold (``MALLOC_MMAP_THRESHOLD_``) so that every large
buffer is mmapped and returned to the OS when freed; with glibc's default dynamic threshold,
freed buffers up to 32 MB are recycled inside the heap and the peak RSS can exceed the live set.

Example (a few seconds per point)::

    >>> from sazo_lite.course.memory import ModelShape, TrainSetup
    >>> shape = ModelShape("tiny", 4, 128, 4, 2, 344, 512)
    >>> row = compare(shape, TrainSetup(context=512, batch=4, dtype="float32", chunked_loss=False), "bp")
    >>> abs(row["relative_error"]) < 0.25        # doctest: +SKIP
    True
"""
from __future__ import annotations

import json
import os
import subprocess
import sys
from dataclasses import asdict

from .memory import ATTENTIONS, ModelShape, TrainSetup, bp_memory, inference_memory, zo_memory
from ..validation import check_choice

__all__ = ["MODES", "TINY", "build_decoder", "per_example_loss", "saved_activation_bytes",
           "peak_rss_bytes", "run_child", "measure", "predicted_extra", "compare", "validate",
           "default_points"]

MODES = ("inference", "zo", "bp")
TINY = ModelShape("tiny", 4, 128, 4, 2, 344, 512)  # D=128, GQA 4→2 heads, SwiGLU F=344, V=512


# -- the decoder (torch imported lazily: sazo_lite.course.memory stays torch-free) ----------------
def build_decoder(shape: ModelShape, attention: str = "fused"):
    """A plain Llama-style decoder: pre-norm, GQA, no dropout/rotary, with ``shape``'s switches.

    SwiGLU FFN (``gated=False``: fc1, GELU, fc2); biases as ``bias`` / ``qkv_bias`` say; the LM head
    tied to the embedding when ``tied_embeddings``; norms with ``norm_params`` per D: 1 RMSNorm, 2
    LayerNorm, 0 RMSNorm without weight. Its parameter count is ``ModelShape.param_count()`` of ``shape``.
    """
    import torch
    import torch.nn as nn
    import torch.nn.functional as F

    check_choice("attention", attention, ATTENTIONS)   # "materialized" built the materialised path silently
    if shape.norm_params not in (0, 1, 2):
        raise ValueError(f"Invalid shape.norm_params: {shape.norm_params} (expected 0, 1 (RMSNorm) or 2 (LayerNorm): "
                         f"the decoder has no norm with {shape.norm_params} parameters per D)")
    heads, kv_heads, head_dim = shape.heads, shape.kv_heads, shape.hidden // shape.heads

    def _future_mask(n, device):   # True where a query would see a later key
        return ~torch.ones(n, n, dtype=torch.bool, device=device).tril()

    def norm(d):
        return nn.LayerNorm(d) if shape.norm_params == 2 else nn.RMSNorm(d, elementwise_affine=shape.norm_params == 1)

    class Block(nn.Module):
        def __init__(self):
            super().__init__()
            d, kv, f = shape.hidden, shape.kv_dim, shape.ffn
            qkv_bias, bias = shape.bias or shape.qkv_bias, shape.bias
            self.norm1, self.norm2 = norm(d), norm(d)
            self.q, self.k = nn.Linear(d, d, bias=qkv_bias), nn.Linear(d, kv, bias=qkv_bias)
            self.v, self.o = nn.Linear(d, kv, bias=qkv_bias), nn.Linear(d, d, bias=bias)
            if shape.gated:
                self.gate, self.up = nn.Linear(d, f, bias=bias), nn.Linear(d, f, bias=bias)
            else:
                self.fc1 = nn.Linear(d, f, bias=bias)
            self.down = nn.Linear(f, d, bias=bias)

        def attend(self, q, k, v, masked=None):  # q [B,H,N,hd], k/v [B,KV,N,hd]; masked: [N,N] bool, True above
            if attention == "fused":
                return F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=True)
            k = k.repeat_interleave(heads // kv_heads, 1)
            v = v.repeat_interleave(heads // kv_heads, 1)
            masked = _future_mask(q.shape[2], q.device) if masked is None else masked
            # reassign like HF's eager attention: at most two [B,H,N,N] buffers alive at once
            scores = (q @ k.transpose(-1, -2)) * head_dim ** -0.5           # [B,H,N,N]
            scores = scores.masked_fill(masked, float("-inf"))
            scores = scores.softmax(-1)
            return scores @ v

        def attention(self, h, masked=None):  # h [B,N,D]; q, k, v die when this returns (as in HF)
            b, n, d = h.shape
            q = self.q(h).view(b, n, heads, head_dim).transpose(1, 2)
            k = self.k(h).view(b, n, kv_heads, head_dim).transpose(1, 2)
            v = self.v(h).view(b, n, kv_heads, head_dim).transpose(1, 2)
            return self.o(self.attend(q, k, v, masked).transpose(1, 2).reshape(b, n, d))

        def mlp(self, h):
            if shape.gated:
                return self.down(F.silu(self.gate(h)) * self.up(h))
            return self.down(F.gelu(self.fc1(h)))

        def forward(self, x, masked=None):  # x [B,N,D]
            x = x + self.attention(self.norm1(x), masked)
            return x + self.mlp(self.norm2(x))

    class Decoder(nn.Module):
        def __init__(self):
            super().__init__()
            self.embed = nn.Embedding(shape.vocab, shape.hidden)
            self.blocks = nn.ModuleList(Block() for _ in range(shape.layers))
            self.norm = norm(shape.hidden)
            self.head = nn.Linear(shape.hidden, shape.vocab, bias=False)
            if shape.tied_embeddings:
                self.head.weight = self.embed.weight

        def forward(self, tokens):  # tokens [B,N] → logits [B,N,V]
            x = self.embed(tokens)
            # one mask for all layers, as HF builds it (each layer's own copy was kept for backward: L·N² bytes,
            # where the model counts N²)
            masked = None if attention == "fused" else _future_mask(tokens.shape[1], tokens.device)
            for block in self.blocks:
                x = block(x, masked)
            return self.head(self.norm(x))

    return Decoder()


def per_example_loss(model, tokens):
    """Next-token cross-entropy per sequence: [B] (what MeZO's closure returns)."""
    import torch.nn.functional as F
    logits = model(tokens[:, :-1])                                       # [B,N,V]
    batch, n, vocab = logits.shape
    # flattened, contiguous rows: a transposed [B,V,N] input would cost one more V-sized copy
    losses = F.cross_entropy(logits.reshape(-1, vocab), tokens[:, 1:].reshape(-1), reduction="none")
    return losses.view(batch, n).mean(dim=1)


def saved_activation_bytes(module, inputs) -> int:
    """Bytes of the distinct non-parameter tensors autograd saves in ``module(inputs)``."""
    import torch
    params = {p.untyped_storage().data_ptr() for p in module.parameters()}
    seen: dict[int, int] = {}

    def pack(t):
        storage = t.untyped_storage()
        if storage.data_ptr() not in params:
            seen[storage.data_ptr()] = storage.nbytes()
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        module(inputs)
    return sum(seen.values())


# -- one measurement, in the child -----------------------------------------------------
def peak_rss_bytes() -> int:
    """This process's peak resident set in bytes.

    Linux: ``VmHWM`` of /proc/self/status. ``getrusage(RUSAGE_SELF).ru_maxrss`` is not used
    there because it also remembers the peak of the image replaced by ``exec``: a child forked
    from a big parent (pytest with transformers loaded) starts with the parent's RSS as its
    "peak", hiding everything below it. Elsewhere ``ru_maxrss``: bytes on macOS, KiB on the BSDs.
    """
    try:
        with open("/proc/self/status") as status:
            for line in status:
                if line.startswith("VmHWM:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    import resource
    unit = 1 if sys.platform == "darwin" else 1024   # ru_maxrss: bytes on macOS, KiB elsewhere (×1024 read 1024× high)
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * unit


def run_child(module: str, args, *, timeout: float = 300.0, env: dict | None = None) -> dict:
    """Run ``python -m module *args`` in a fresh process and parse its last stdout line as JSON.

    The one way every peak-memory measurement starts its child: glibc's mmap threshold is
    fixed (``MALLOC_MMAP_THRESHOLD_``, see the module docstring) and ``env`` adds variables.
    A failing child raises RuntimeError with the end of its stderr.
    """
    child_env = dict(os.environ, MALLOC_MMAP_THRESHOLD_="131072", **(env or {}))
    done = subprocess.run([sys.executable, "-m", module, *map(str, args)], env=child_env,
                          capture_output=True, text=True, timeout=timeout, check=False)
    if done.returncode != 0:
        raise RuntimeError(f"measurement child {module} {' '.join(map(str, args))} failed:\n{done.stderr[-2000:]}")
    return json.loads(done.stdout.strip().splitlines()[-1])


def _step(mode: str, model, tokens, optimiser):
    import torch
    if mode == "inference":
        with torch.no_grad():
            per_example_loss(model, tokens)
    elif mode == "zo":
        optimiser.step(lambda: per_example_loss(model, tokens))
    else:  # standard loop order: grads are None during the forward
        optimiser.zero_grad(set_to_none=True)
        per_example_loss(model, tokens).mean().backward()
        optimiser.step()


def _child(spec: dict) -> dict:
    import torch
    from ..engine import MeZO
    torch.set_num_threads(1)
    torch.manual_seed(0)
    shape, setup, mode = ModelShape(**spec["shape"]), TrainSetup(**spec["setup"]), spec["mode"]
    device = torch.device(spec.get("device", "cpu"))
    model = build_decoder(shape, setup.attention).to(device=device, dtype=getattr(torch, setup.dtype))
    optimiser = MeZO(model.parameters(), lr=1e-6) if mode == "zo" else torch.optim.SGD(model.parameters(), lr=1e-6)
    warm = torch.randint(shape.vocab, (setup.batch, 17), device=device)
    tokens = torch.randint(shape.vocab, (setup.batch, setup.context + 1), device=device)
    _step(mode, model, warm, optimiser)
    model.zero_grad(set_to_none=True)
    out = {}
    if device.type == "cuda":
        torch.cuda.synchronize()
        torch.cuda.reset_peak_memory_stats()
        before = torch.cuda.memory_allocated()
    baseline = peak_rss_bytes()
    _step(mode, model, tokens, optimiser)
    out["rss_extra"] = peak_rss_bytes() - baseline
    out["path"] = type(optimiser.noise_source).__name__ if mode == "zo" else mode
    if device.type == "cuda":
        torch.cuda.synchronize()
        out["cuda_extra"] = torch.cuda.max_memory_allocated() - before
    return out


def _check_measurable(setup: TrainSetup, mode: str) -> None:
    """ValueError for a setting the child does not run: it was ignored, and the step measured was set beside the
    prediction for another setup (chunked_loss=True, TrainSetup's default, predicted no logits for a step that
    made them; Adam's two moments, allocated by the warm-up, were predicted but never measured)."""
    ran = dict(chunked_loss=False)   # the child's loss: full logits, one cross-entropy
    if mode == "bp":                  # a plain SGD step on every parameter, no checkpointing
        ran.update(optimizer="sgd", trainable_fraction=1.0, checkpointing=False)
    if mode == "zo":                  # MeZO's layer-by-layer forward
        ran.update(zo_buffered_layers=1)
    for key, value in ran.items():
        if getattr(setup, key) != value:
            raise ValueError(f"Invalid setup.{key}: {getattr(setup, key)!r} (expected {value!r}: the measured "
                             f"{mode} step runs {key}={value!r})")


def measure(shape: ModelShape, setup: TrainSetup, mode: str, device: str = "cpu",
            timeout: float = 300.0) -> dict:
    """Run one measurement in a fresh process, the decoder in the setup's ``dtype``.

    The child runs full logits, backprop as plain SGD on every parameter without checkpointing, and
    MeZO's layer-by-layer forward: a ``setup`` asking for another (``chunked_loss=True``; for "bp"
    Adam, ``trainable_fraction`` < 1 or checkpointing; for "zo" ``zo_buffered_layers`` > 1) is a
    ValueError naming the setting.

    Returns:
        {"rss_extra": bytes, "path": what ran ("inference", "bp", or for "zo" the MeZO noise
        source, e.g. "PlainNoise")[, "cuda_extra": bytes]}.
    """
    check_choice("mode", mode, MODES)
    _check_measurable(setup, mode)
    spec = json.dumps(dict(shape=asdict(shape), setup=asdict(setup), mode=mode, device=device))
    return run_child("sazo_lite.course.memory_measure", [spec], timeout=timeout, env={"OMP_NUM_THREADS": "1"})


# -- prediction and comparison -----------------------------------------------------------
def predicted_extra(shape: ModelShape, setup: TrainSetup, mode: str) -> float:
    """The model's peak minus the weights: what ``measure`` reads (bytes)."""
    check_choice("mode", mode, MODES)   # a typo raised KeyError
    peak = {"inference": inference_memory, "zo": zo_memory, "bp": bp_memory}[mode](shape, setup)
    return peak.total - peak.params


def compare(shape: ModelShape, setup: TrainSetup, mode: str, device: str = "cpu") -> dict:
    """Measure one point and set it beside the prediction (relative error = measured/predicted − 1)."""
    measured = measure(shape, setup, mode, device)
    key = "cuda_extra" if "cuda_extra" in measured else "rss_extra"   # the child reads CUDA's peak on any cuda device
    predicted = predicted_extra(shape, setup, mode)
    return dict(mode=mode, context=setup.context, batch=setup.batch, attention=setup.attention,
                device=device, path=measured.get("path", mode), measured=float(measured[key]), predicted=predicted,
                relative_error=measured[key] / predicted - 1.0)


def default_points(contexts=(256, 512, 1024), modes=MODES, attentions=("fused", "materialised"),
                   batch: int = 4) -> list[TrainSetup]:
    """(setup, mode) pairs for the validation grid on the TINY decoder (float32, full logits)."""
    return [(TrainSetup(context=n, batch=batch, dtype="float32", attention=a, chunked_loss=False), m)
            for a in attentions for n in contexts for m in modes]


def validate(points=None, shape: ModelShape = TINY, device: str = "cpu", progress: bool = True) -> list[dict]:
    """``compare`` for every (setup, mode) point, with a progress bar unless ``progress`` is False."""
    from tqdm.auto import tqdm
    points = points if points is not None else default_points()
    for setup, mode in points:   # before the first child: a bad last point wasted every measurement before it
        check_choice("mode", mode, MODES)
        _check_measurable(setup, mode)
    return [compare(shape, setup, mode, device) for setup, mode in tqdm(points, desc="measuring", disable=not progress)]


if __name__ == "__main__":
    print(json.dumps(_child(json.loads(sys.argv[1]))))

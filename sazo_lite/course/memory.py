"""How much memory does fine-tuning a decoder-only transformer need: backprop (BP) vs ZO?

Plain maths, no torch. Everything is counted in bytes at the peak of one training step:

    BP  = weights + grads + optimiser state + stored activations + transient buffers
    ZO  = weights + z buffer              + transient activations of L' layers

Per-token, per-layer activations that autograd keeps (in *elements*; D hidden, D_kv = KV
heads × head size, F FFN size, H heads, N context), counted tensor by tensor on a Llama-style
layer (pre-norm RMSNorm, GQA, gated SiLU FFN, no dropout) and checked against
``torch.autograd.graph.saved_tensors_hooks`` (see ``tests/test_memory.py``):

    two norms:            2 × (2D + 1)     input, normalised input, 1/rms
    projection inputs:    2D               norm outputs read by the q/k/v and gate/up matmuls
    attention, fused:     2D + 2D_kv + H   q, k, v, output (= o-proj input), log-sum-exp
    attention, materialised: 4D + H·N      q, repeated k and v, output, softmax probabilities
    FFN gated (SwiGLU):   4F               gate, silu(gate), up, silu·up
    FFN plain (GELU):     2F               fc1 output, gelu output

Compare Korthikanti et al. (2022): s·b·h·(34 + 5·a·s/h) bytes in 16-bit, i.e. 17·D + 2.5·H·N
elements (GPT layer, F = 4D, with dropout masks); our plain GPT count is 18·D + H·N.

Assumptions (printed as a footnote by ``python -m sazo_lite.course.memory``):
  * one dtype end to end (``bytes_per_value``: float32 4, bfloat16/float16 2); no fp32 master
    weights, no mixed-precision upcasts;
  * weights, grads and optimiser state use the weight dtype; SGD is stateless (0 bytes),
    Adam keeps two moments (2 × weights); a sparse/PEFT fraction f gets grads and state for
    f · P parameters only, while the activations stay (grads still flow through every layer);
  * BP sums weights + grads + stored activations: the peak when grads persist across steps
    (gradient accumulation, or ``zero_grad`` after ``step``); with grads freed before the
    forward the true peak is a little lower;
  * checkpointing (one checkpoint per layer) stores each layer's input (D per token) and
    recomputes one layer at a time, whose full activations are then live;
  * transient buffers: the working set of one layer's forward (max of attention and FFN:
    e.g. input, residual, norm output, silu(gate), up, product), the same for BP's
    backward (3D + 3F per token for a gated FFN); with materialised attention two H·N
    score tensors;
  * ZO keeps min(L', L) (``zo_buffered_layers``, default 1) such working sets, plus one z buffer: the
    largest parameter tensor (float32 when weights are 16-bit, as ``sazo_lite.MeZO`` draws it);
  * the LM head: the final norm stores 2D + 1 and the head keeps its input (D per token) for its
    weight's grad; by default the loss is chunked (``chunked_loss=True``) so logits never exist
    for the whole sequence; otherwise BP stores log-softmax (V per token) and both methods hold
    two V-sized transients (logits and log-softmax, or their grads);
  * the N×N bool causal mask (N² bytes, shared by all layers) is counted only for
    materialised attention (fused kernels take ``is_causal`` instead);
  * not counted: the CUDA context / framework runtime, allocator fragmentation, the token
    ids, rotary tables.

Example:
    >>> shape = LADDERS["qwen2.5"][0]
    >>> setup = TrainSetup(context=512)
    >>> size_ratio(shape, setup) > 2          # ZO trains > 2× more parameters per GB
    True
"""
from __future__ import annotations

import math
from dataclasses import dataclass, replace

from ..validation import check_bool, check_choice, check_count, check_fraction, check_int, check_number

__all__ = ["DTYPE_BYTES", "ModelShape", "TrainSetup", "Breakdown", "LADDERS",
           "activation_elements_per_token", "transient_elements_per_token", "bp_memory",
           "zo_memory", "inference_memory", "memory_ratio", "largest_fitting", "size_ratio",
           "headline_table", "format_table", "ladder_table", "sparse_saving", "FOOTNOTE", "GB",
           "HEADLINE_SHAPE", "HEADLINE_SETUP", "HEADLINE_BUDGET_GB"]

GB = 1e9
DTYPE_BYTES = {"float32": 4, "bfloat16": 2, "float16": 2}
OPTIMISERS = ("sgd", "adam")
ATTENTIONS = ("fused", "materialised")


@dataclass(frozen=True)
class ModelShape:
    """Shape of a decoder-only transformer (Llama/Qwen style unless ``gated=False``).

    Args:
        name: label for tables.
        layers, hidden, heads, kv_heads, ffn, vocab: L, D, H, KV heads (GQA when < H), F, V.
        gated: SwiGLU FFN with three matrices (else a plain two-matrix GELU FFN).
        tied_embeddings: the LM head reuses the token embedding.
        bias: every linear of the blocks has a bias (GPT-2; Llama's ``attention_bias`` and ``mlp_bias``),
            the LM head none; ``qkv_bias``: only q/k/v do (Qwen2.5).
        norm_params: parameters per norm: D for RMSNorm, 2D for LayerNorm (pass 2).

    Example:
        >>> ModelShape("toy", 2, 64, 4, 2, 128, 100).kv_dim
        32
    """

    name: str
    layers: int
    hidden: int
    heads: int
    kv_heads: int
    ffn: int
    vocab: int
    gated: bool = True
    tied_embeddings: bool = False
    bias: bool = False
    qkv_bias: bool = False
    norm_params: int = 1

    def __post_init__(self):
        # stored as Python ints: numpy int32 sizes wrapped around (V·D of a 16384-wide model: a negative P)
        for key in ("layers", "hidden", "heads", "kv_heads", "ffn", "vocab"):
            object.__setattr__(self, key, check_count(key, getattr(self, key)))
        for key in ("gated", "tied_embeddings", "bias", "qkv_bias"):   # gated="no" was truthy: a gated FFN
            check_bool(key, getattr(self, key))
        # -5 counted negative norm parameters
        object.__setattr__(self, "norm_params", check_int("norm_params", self.norm_params, 0))
        if self.hidden % self.heads or self.heads % self.kv_heads:
            raise ValueError(f"Invalid heads/kv_heads: {self.heads}/{self.kv_heads} (expected heads to divide "
                             f"hidden {self.hidden} and KV heads to divide heads {self.heads})")

    @property
    def kv_dim(self) -> int:
        """D_kv = KV heads × head size: width of k and v."""
        return self.kv_heads * (self.hidden // self.heads)

    def attention_params(self) -> int:
        """q and o are D×D; k and v are D×D_kv (GQA shrinks only these two)."""
        d, kv = self.hidden, self.kv_dim
        biases = (2 * d + 2 * kv) if self.bias else (d + 2 * kv) if self.qkv_bias else 0
        return 2 * d * d + 2 * d * kv + biases

    def ffn_params(self) -> int:
        """Gated: gate, up (D×F) and down (F×D); plain: fc1 and fc2; with ``bias`` each has its bias."""
        d, f = self.hidden, self.ffn
        matrices = (3 if self.gated else 2) * d * f
        biases = ((2 * f if self.gated else f) + d) if self.bias else 0   # gate and up F each, down D
        return matrices + biases

    def layer_params(self) -> int:
        """Parameters of one transformer block: attention + FFN + two norms."""
        return self.attention_params() + self.ffn_params() + 2 * self.norm_params * self.hidden

    def embedding_params(self) -> int:
        """Token embedding, untied LM head, final norm."""
        head = 0 if self.tied_embeddings else self.vocab * self.hidden
        return self.vocab * self.hidden + head + self.norm_params * self.hidden

    def param_count(self) -> int:
        """P = L · layer + embeddings."""
        return self.layers * self.layer_params() + self.embedding_params()

    def largest_tensor(self) -> int:
        """Elements of the largest parameter tensor (MeZO's z buffer)."""
        return max(self.vocab * self.hidden, self.hidden * self.ffn, self.hidden * self.hidden)

    def with_layers(self, layers: int) -> "ModelShape":
        """Same width, different depth: the continuous family behind ``size_ratio``."""
        return replace(self, name=f"{self.name}×{layers}L", layers=layers)


@dataclass(frozen=True)
class TrainSetup:
    """What is being run: context N, batch B, dtype, optimiser, and memory-saving switches.

    Args:
        context: tokens per sequence N.
        batch: sequences per step B.
        dtype: "float32", "bfloat16" or "float16" (weights, grads, state and activations).
        optimizer: "sgd" (stateless, as in the on-device paper) or "adam" (two moments).
        checkpointing: per-layer activation checkpointing for BP.
        attention: "fused" (flash/SDPA: no N² tensor kept) or "materialised" (softmax kept).
        trainable_fraction: fraction of parameters that get grads (sparse / PEFT BP), in (0, 1].
        zo_buffered_layers: L', the number of layers whose forward working set a ZO
            implementation holds at once (1 for a plain layer-by-layer forward).
        chunked_loss: the LM loss is computed in chunks, so full-sequence logits never exist.
    """

    context: int = 512
    batch: int = 1
    dtype: str = "bfloat16"
    optimizer: str = "sgd"
    checkpointing: bool = False
    attention: str = "fused"
    trainable_fraction: float = 1.0
    zo_buffered_layers: int = 1
    chunked_loss: bool = True

    def __post_init__(self):
        # stored cleaned (Python ints, floats and strs): a numpy int32 context wrapped N² to 0 and
        # B·N past 2³¹, and numpy values made ``memory_measure.measure``'s JSON spec fail
        for key in ("context", "batch", "zo_buffered_layers"):
            object.__setattr__(self, key, check_count(key, getattr(self, key)))
        for key, choices in (("dtype", DTYPE_BYTES), ("optimizer", OPTIMISERS), ("attention", ATTENTIONS)):
            object.__setattr__(self, key, check_choice(key, getattr(self, key), choices))
        object.__setattr__(self, "trainable_fraction", check_fraction(
            "trainable_fraction", self.trainable_fraction, 0.0, 1.0, closed_low=False, closed_high=True))
        for key in ("checkpointing", "chunked_loss"):
            check_bool(key, getattr(self, key))

    @property
    def bytes_per_value(self) -> int:
        return DTYPE_BYTES[self.dtype]

    @property
    def tokens(self) -> int:
        return self.context * self.batch


@dataclass(frozen=True)
class Breakdown:
    """Peak memory in bytes, split the way the dashboard's stacked bars are."""

    params: float
    grads: float
    optimiser: float
    activations: float

    @property
    def total(self) -> float:
        return self.params + self.grads + self.optimiser + self.activations

    def as_dict(self) -> dict[str, float]:
        return {"params": self.params, "grads": self.grads, "optimiser": self.optimiser,
                "activations": self.activations}


# -- activations -------------------------------------------------------------------------
def activation_elements_per_token(shape: ModelShape, setup: TrainSetup) -> float:
    """Elements one layer stores for backward, per token (see the module docstring).

    Example:
        >>> toy = ModelShape("toy", 1, 64, 4, 2, 160, 100)
        >>> activation_elements_per_token(toy, TrainSetup(context=128))   # 8D + 2D_kv + 4F + H + 2
        1222.0
    """
    d, kv, f, h = shape.hidden, shape.kv_dim, shape.ffn, shape.heads
    norms_and_inputs = 2 * (2 * d + 1) + 2 * d
    if setup.attention == "fused":
        attention = 2 * d + 2 * kv + h
    else:  # q, k and v repeated to H heads, output, probabilities; the bool mask is shared
        attention = 4 * d + h * setup.context
    ffn = 4 * f if shape.gated else 2 * f
    return float(norms_and_inputs + attention + ffn)


def transient_elements_per_token(shape: ModelShape, setup: TrainSetup) -> float:
    """Working set of one layer's forward (or backward), per token, beyond what is stored.

    FFN: the layer's input (still held by the caller's loop), the residual after attention,
    the norm output and three F-sized tensors (silu(gate), up, product): 3D + 3F.
    Attention: input, norm output, q, k, v, output: 4D + 2D_kv (materialised: q and the
    repeated k, v, plus two [H, N] score rows per token).
    """
    d, kv, f, h = shape.hidden, shape.kv_dim, shape.ffn, shape.heads
    ffn = 3 * d + (3 * f if shape.gated else 2 * f)
    if setup.attention == "fused":
        attention = 4 * d + 2 * kv
    else:
        attention = 5 * d + 2 * h * setup.context
    return float(max(ffn, attention))


def _head_elements(shape: ModelShape, setup: TrainSetup) -> tuple[float, float]:
    """(stored, transient) elements per token of the LM head and loss."""
    # final norm: input, normalised input, 1/rms; and its output, the LM head's input, which the head's
    # matmul keeps for its weight's grad, chunked loss or not
    stored_norm = 3 * shape.hidden + 1
    if setup.chunked_loss:
        return float(stored_norm), 0.0
    # transient: logits and log-softmax (or their two grads), beside the final norm's D in/out
    return float(stored_norm + shape.vocab), float(2 * shape.vocab + 2 * shape.hidden)


def _mask_bytes(setup: TrainSetup) -> float:
    return float(setup.context ** 2) if setup.attention == "materialised" else 0.0


def _stored_activation_bytes(shape: ModelShape, setup: TrainSetup) -> float:
    per_layer = activation_elements_per_token(shape, setup)
    stored_head, _ = _head_elements(shape, setup)
    if setup.checkpointing:  # layer inputs + one layer recomputed at a time
        per_token = shape.layers * shape.hidden + per_layer + stored_head
    else:
        per_token = shape.layers * per_layer + stored_head
    return per_token * setup.tokens * setup.bytes_per_value + _mask_bytes(setup)


def _transient_bytes(shape: ModelShape, setup: TrainSetup, layers: int = 1) -> float:
    _, head = _head_elements(shape, setup)
    per_token = max(layers * transient_elements_per_token(shape, setup), head)
    return per_token * setup.tokens * setup.bytes_per_value


# -- totals ------------------------------------------------------------------------------
def bp_memory(shape: ModelShape, setup: TrainSetup) -> Breakdown:
    """Backprop peak: weights + f·P grads + optimiser state + stored and transient activations.

    Example:
        >>> shape = LADDERS["qwen2.5"][0]
        >>> bp_memory(shape, TrainSetup()).grads == shape.param_count() * 2
        True
    """
    p, b = shape.param_count(), setup.bytes_per_value
    trained = setup.trainable_fraction * p
    state = 2 * trained * b if setup.optimizer == "adam" else 0.0
    acts = _stored_activation_bytes(shape, setup) + _transient_bytes(shape, setup)
    return Breakdown(params=p * b, grads=trained * b, optimiser=state, activations=acts)


def _z_bytes(shape: ModelShape, setup: TrainSetup) -> float:
    z_bytes = 4 if setup.bytes_per_value < 4 else setup.bytes_per_value  # see MeZO's draw_direction
    return shape.largest_tensor() * z_bytes


def zo_memory(shape: ModelShape, setup: TrainSetup) -> Breakdown:
    """MeZO peak: weights + one z buffer (under "optimiser") + min(L', L) layers' forward working set."""
    # a model of L layers holds at most L working sets (L' = 36 counted 36 of them in a 2-layer model)
    buffered = min(setup.zo_buffered_layers, shape.layers)
    acts = _transient_bytes(shape, setup, layers=buffered) + _mask_bytes(setup)
    return Breakdown(params=shape.param_count() * setup.bytes_per_value, grads=0.0,
                     optimiser=_z_bytes(shape, setup), activations=acts)


def inference_memory(shape: ModelShape, setup: TrainSetup) -> Breakdown:
    """One forward without grad: weights + one layer's working set (ZO minus its z buffer)."""
    zo = zo_memory(shape, replace(setup, zo_buffered_layers=1))
    return replace(zo, optimiser=0.0)


def memory_ratio(shape: ModelShape, setup: TrainSetup) -> float:
    """BP peak / ZO peak for the same model and setup."""
    return bp_memory(shape, setup).total / zo_memory(shape, setup).total


# -- solvers -----------------------------------------------------------------------------
def largest_fitting(ladder, setup: TrainSetup, budget_gb: float, method: str) -> ModelShape | None:
    """The largest model of ``ladder`` whose ``method`` ("bp" or "zo") peak fits the budget.

    Example:
        >>> largest_fitting(LADDERS["qwen2.5"], TrainSetup(), 40.0, "zo").name
        'Qwen2.5-14B'
    """
    check_choice("method", method, ("bp", "zo"))
    budget_gb = check_number("budget_gb", budget_gb, 0.0, closed_low=False)
    peak = bp_memory if method == "bp" else zo_memory
    fitting = [s for s in ladder if peak(s, setup).total <= budget_gb * GB]
    return max(fitting, key=ModelShape.param_count, default=None)


def _affine_depth(shape: ModelShape, setup: TrainSetup, budget: float, method: str, depth: int) -> float:
    """Depth at which the line through the peaks at ``depth`` and ``depth`` + 1 layers reaches ``budget``."""
    peak = bp_memory if method == "bp" else zo_memory
    at1, at2 = peak(shape.with_layers(depth), setup).total, peak(shape.with_layers(depth + 1), setup).total
    return depth + (budget - at1) / (at2 - at1)


def _max_layers(shape: ModelShape, setup: TrainSetup, budget: float, method: str) -> float:
    """Real-valued depth L at which the peak reaches ``budget``.

    BP's peak is affine in L. ZO's has two affine pieces: up to L' layers each adds its working
    set, beyond L' only its weights (``zo_memory`` buffers min(L', L) layers).
    """
    buffered = setup.zo_buffered_layers if method == "zo" else 1
    deep = _affine_depth(shape, setup, budget, method, buffered)
    return deep if deep >= buffered else _affine_depth(shape, setup, budget, method, 1)


def _per_layer_bytes(shape: ModelShape, setup: TrainSetup, method: str) -> float:
    """What one more layer costs beyond L' layers (BP: at any depth)."""
    peak, depth = (bp_memory, 1) if method == "bp" else (zo_memory, setup.zo_buffered_layers)
    return peak(shape.with_layers(depth + 1), setup).total - peak(shape.with_layers(depth), setup).total


def size_ratio(shape: ModelShape, setup: TrainSetup, budget_gb: float | None = None) -> float:
    """How many times more parameters ZO can train than BP: same width, depth solved per method.

    With ``budget_gb=None`` the budget → ∞ limit: the per-layer memory ratio, where one-off
    costs (embeddings, z, the L' working sets, the recomputed layer) no longer matter.
    """
    if budget_gb is not None:
        budget_gb = check_number("budget_gb", budget_gb, 0.0, closed_low=False)
    else:
        return _per_layer_bytes(shape, setup, "bp") / _per_layer_bytes(shape, setup, "zo")
    params = {}
    for method in ("bp", "zo"):
        layers = _max_layers(shape, setup, budget_gb * GB, method)
        params[method] = layers * shape.layer_params() + shape.embedding_params() if layers >= 0 else 0.0
    if params["bp"] <= 0:  # BP cannot fit even the embeddings
        return math.inf if params["zo"] > 0 else math.nan
    return params["zo"] / params["bp"]


# -- model families ----------------------------------------------------------------------
LADDERS: dict[str, list[ModelShape]] = {
    "qwen2.5": [  # shapes from the public Qwen2.5 configs
        ModelShape("Qwen2.5-0.5B", 24, 896, 14, 2, 4864, 151936, tied_embeddings=True, qkv_bias=True),
        ModelShape("Qwen2.5-1.5B", 28, 1536, 12, 2, 8960, 151936, tied_embeddings=True, qkv_bias=True),
        ModelShape("Qwen2.5-3B", 36, 2048, 16, 2, 11008, 151936, tied_embeddings=True, qkv_bias=True),
        ModelShape("Qwen2.5-7B", 28, 3584, 28, 4, 18944, 152064, qkv_bias=True),
        ModelShape("Qwen2.5-14B", 48, 5120, 40, 8, 13824, 152064, qkv_bias=True),
    ],
    "llama": [  # Llama-3.2 1B/3B, Llama-2 7B/13B (MHA)
        ModelShape("Llama-3.2-1B", 16, 2048, 32, 8, 8192, 128256, tied_embeddings=True),
        ModelShape("Llama-3.2-3B", 28, 3072, 24, 8, 8192, 128256, tied_embeddings=True),
        ModelShape("Llama-2-7B", 32, 4096, 32, 32, 11008, 32000),
        ModelShape("Llama-2-13B", 40, 5120, 40, 40, 13824, 32000),
    ],
}

# -- the headline table ------------------------------------------------------------------
HEADLINE_SHAPE = LADDERS["qwen2.5"][2]
HEADLINE_SETUP = TrainSetup(batch=2, dtype="bfloat16", optimizer="sgd", attention="fused")
HEADLINE_BUDGET_GB = 40.0

# (label, changes to HEADLINE_SETUP, the seed's figure, tolerance band on our number)
# each row sets checkpointing: a given setup with checkpointing=True filled the "no checkpointing" rows
HEADLINE_ROWS = [
    ("short context, no checkpointing", dict(context=512, checkpointing=False), "≥ 2×", (2.0, math.inf)),
    ("N = 32768, no checkpointing", dict(context=32768, checkpointing=False), "≈ 25×", (20.0, 30.0)),
    ("N = 32768, checkpointing", dict(context=32768, checkpointing=True), "≈ 5×", (4.0, 6.0)),
]
SPARSE_ROW = ("sparse BP, 1% of parameters (N = 4096)", dict(context=4096, checkpointing=False), "saves ≈ 12–13%",
              (0.11, 0.14))


def sparse_saving(shape: ModelShape, setup: TrainSetup, fraction: float = 0.01) -> float:
    """1 − BP(f)/BP(1): what training only a fraction f of the parameters saves."""
    check_fraction("fraction", fraction, 0.0, 1.0, closed_low=False, closed_high=True)
    dense = bp_memory(shape, replace(setup, trainable_fraction=1.0)).total
    return 1.0 - bp_memory(shape, replace(setup, trainable_fraction=fraction)).total / dense


def headline_table(shape: ModelShape = None, setup: TrainSetup = None,
                   budget_gb: float = HEADLINE_BUDGET_GB) -> list[dict]:
    """The seed's figures recomputed: one dict per row (label, ours, seed's figure, band, ok).

    "ZO/BP size" is ``size_ratio`` at ``budget_gb``: how many times more parameters of this
    width ZO trains than BP in the same memory. "BP/ZO memory" is ``memory_ratio`` for the
    model itself; "size, ∞ budget" is the per-layer ratio.
    """
    shape, setup = shape or HEADLINE_SHAPE, setup or HEADLINE_SETUP
    rows = []
    for label, changes, seed_figure, (low, high) in HEADLINE_ROWS:
        run = replace(setup, **changes)
        ours = size_ratio(shape, run, budget_gb)
        rows.append(dict(label=label, ours=ours, memory_ratio=memory_ratio(shape, run),
                         unbounded=size_ratio(shape, run), seed=seed_figure, band=(low, high),
                         ok=low <= ours <= high))
    label, changes, seed_figure, (low, high) = SPARSE_ROW
    saving = sparse_saving(shape, replace(setup, **changes))
    rows.append(dict(label=label, ours=saving, memory_ratio=math.nan, unbounded=math.nan,
                     seed=seed_figure, band=(low, high), ok=low <= saving <= high))
    return rows


FOOTNOTE = """Assumptions: one dtype end to end (bfloat16: 2 bytes per weight, grad and activation;
no fp32 master weights); SGD is stateless (Adam: +2 bytes·2 per trained parameter);
BP = weights + grads + stored activations + one layer's transient working set (the sum is the
peak when grads persist across steps); activations per layer per token = 8D + 2D_kv + 4F + H + 2
elements with fused attention (materialised: 10D + 4F + H·N + 2, the scores kept), and 3D + 1 for
the final norm and LM head, counted tensor by tensor and checked against autograd's saved
tensors; checkpointing stores D per layer per token and
recomputes one layer; ZO = weights + one z buffer (largest tensor, float32) + the forward
working set of L' = 1 layer (3D + 3F per token); the loss is chunked (no full logits);
not counted: framework runtime / CUDA context, allocator fragmentation, token ids, rotary tables.
"ZO/BP size" = ratio of the parameter counts that fit the budget when depth is solved for at
the model's width (memory is affine in depth)."""


def format_table(rows: list[dict] | None = None, shape: ModelShape = None,
                 setup: TrainSetup = None, budget_gb: float = HEADLINE_BUDGET_GB) -> str:
    """The headline table as text (what ``python -m sazo_lite.course.memory`` prints)."""
    shape, setup = shape or HEADLINE_SHAPE, setup or HEADLINE_SETUP
    rows = rows if rows is not None else headline_table(shape, setup, budget_gb)
    head = (f"{shape.name} width ({shape.param_count() / 1e9:.2f}B params), B={setup.batch}, "
            f"{setup.dtype}, {setup.optimizer.upper()}, {setup.attention} attention, "
            f"budget {budget_gb:g} GB")
    lines = [head, f"{'setting':42s} {'ZO/BP size':>10s} {'size, ∞ budget':>14s} "
                   f"{'BP/ZO memory':>12s}  {'seed':>15s}  ok"]
    for r in rows:
        if r["label"].startswith("sparse"):
            ours, rest = f"{100 * r['ours']:.1f}% saved", f"{'':14s} {'':12s}"
        else:
            ours, rest = f"{r['ours']:.1f}×", f"{r['unbounded']:14.1f}× {r['memory_ratio']:11.1f}×"
        lines.append(f"{r['label']:42s} {ours:>10s} {rest}  {r['seed']:>15s}  {'yes' if r['ok'] else 'NO'}")
    return "\n".join(lines)


def ladder_table(ladder_name: str = "qwen2.5", setup: TrainSetup = None) -> str:
    """Peak GB per model of a ladder, BP vs ZO (a second, model-by-model view)."""
    check_choice("ladder_name", ladder_name, tuple(LADDERS))
    setup = setup or replace(HEADLINE_SETUP, context=2048)
    lines = [f"{ladder_name} ladder, N={setup.context}, B={setup.batch}, {setup.dtype}: peak GB",
             f"{'model':16s} {'params':>7s} {'BP':>8s} {'BP ckpt':>8s} {'ZO':>8s}"]
    for shape in LADDERS[ladder_name]:
        bp = bp_memory(shape, replace(setup, checkpointing=False)).total / GB   # the column beside "BP ckpt"
        ck = bp_memory(shape, replace(setup, checkpointing=True)).total / GB
        zo = zo_memory(shape, setup).total / GB
        lines.append(f"{shape.name:16s} {shape.param_count() / 1e9:6.2f}B {bp:8.1f} {ck:8.1f} {zo:8.1f}")
    return "\n".join(lines)


def main() -> None:
    """Print the headline table, a ladder view and the footnote."""
    print(format_table())
    print()
    print(ladder_table())
    print()
    print(FOOTNOTE)


if __name__ == "__main__":
    main()

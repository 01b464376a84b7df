"""Which parameters ZO perturbs: full, LoRA (via peft) or a fixed sparse subset; dtype care.

Memory each mode costs on top of inference (d = model parameters, r = LoRA rank):

| mode   | perturbed tensors          | extra memory during a step                        |
|--------|----------------------------|---------------------------------------------------|
| full   | all d                      | one tensor's worth of z (largest: the embedding)  |
| LoRA   | r·(d_in+d_out) per module  | the adapters (≈0.1–1% of d) + their z             |
| sparse | k = fraction·d entries     | k int64 indices (8 bytes each) + k floats of z    |

None of them keeps activations, gradients or optimiser state: that is the ZO memory win.

dtype and restore drift. MeZO moves θ in place: +εz, −2εz, +εz − ηgz. In float32 each add
rounds with unit roundoff u = 2⁻²⁴ and θ comes back to within a few ulps. In bfloat16
(u = 2⁻⁸) or float16 (u = 2⁻¹¹) every add rounds to 8 (11) significant bits, so after a
raised closure the parameters come back only within

    |θ_restored − θ| ≤ u · passes · (|θ| + 2ε|z|)       (``restore_bound``; passes = 2 or 3)

and, worse, an update ηg·z smaller than half an ulp of θ is lost entirely. Measured on
SmolLM2-135M (``benchmarks/llm_drift.py``, ε = 1e-3, closure raising on its 2nd call): in
every dtype ~49% of entries do not come back bit for bit, worst 3 ulps of |θ|+ε, always inside
the bound; but in bfloat16 (float16) 99.6% (98%) of entries would silently drop an update of
size 1e-6. Mitigation:
``Float32Master`` keeps a float32 master copy of the trainable parameters, lets MeZO
perturb the master, and copies it into the half-precision model before each forward.
For LoRA the master costs 4 bytes per adapter parameter; for full tuning it doubles memory.
"""
from __future__ import annotations

import torch

from ..engine import MeZO, derive_seed
from ..noise import MaskedNoise

__all__ = ["trainable_parameters", "full_parameters", "add_lora", "sparse_indices", "SparseMeZO",
           "Float32Master", "restore_bound", "unit_roundoff", "parameter_count"]


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


def parameter_count(params) -> int:
    """Number of scalar entries in a list of tensors."""
    return sum(p.numel() for p in params)


def add_lora(model, *, rank: int = 8, alpha: int = 16, target_modules=None, init_seed: int = 0):
    """Wrap ``model`` with peft LoRA adapters; only the adapters require grad.

    W x → W x + (α/r)·B A x with A [r, d_in], B [d_out, r]. peft initialises B = 0 (the
    model is unchanged at the start) and A randomly (seeded here by ``init_seed``).

    Args:
        model: a transformers causal LM.
        rank: r ≥ 1.
        alpha: the LoRA scale numerator α.
        target_modules: module names to adapt; None uses peft's default for the family
            (q_proj/v_proj for Llama, OPT, Qwen2; c_attn for GPT-2).

    Returns:
        The ``PeftModel`` in eval mode; pass ``trainable_parameters(peft_model)`` to MeZO.
    """
    from peft import LoraConfig, get_peft_model

    if isinstance(rank, bool) or not isinstance(rank, int) or rank < 1:
        raise ValueError(f"Invalid rank: {rank!r} (expected an int >= 1)")
    config = LoraConfig(r=rank, lora_alpha=alpha, target_modules=target_modules, lora_dropout=0.0,
                        task_type="CAUSAL_LM")
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(init_seed)
        peft_model = get_peft_model(model, config)
    return peft_model.eval()


def sparse_indices(params, fraction: float, *, seed: int = 0) -> list[torch.Tensor]:
    """A fixed random mask per tensor, stored as sorted flat indices (LongTensor [k_j]).

    Each tensor keeps ceil(fraction · numel) entries, chosen by a generator seeded from
    (seed, tensor index): the same seed always gives the same mask, so it can be
    regenerated instead of stored.
    """
    fraction = float(fraction)
    if not 0.0 < fraction <= 1.0:
        raise ValueError(f"Invalid fraction: {fraction} (expected a number in (0, 1])")
    masks = []
    for index, p in enumerate(params):
        generator = torch.Generator().manual_seed(derive_seed(seed, index))
        k = max(1, -(-int(fraction * p.numel() * 1e9) // int(1e9)))  # ceil without float surprises
        chosen = torch.randperm(p.numel(), generator=generator)[:k]
        masks.append(chosen.sort().values.to(p.device))
    return masks


class SparseMeZO(MeZO):
    """MeZO restricted to fixed entries: z is drawn only for the k chosen entries per tensor.

    Update rule as in ``MeZO`` with z replaced by m ⊙ z (m the 0/1 mask): entries outside
    the mask never move. Drawing k instead of numel normals also makes each pass cheaper.
    Its passes go through a ``sazo_lite.noise.MaskedNoise``; a ``SeedLog`` of a SparseMeZO
    run replays only through ``log.replay_into(SparseMeZO(params, masks, ...))``.

    Args:
        params: the full parameter list (plain list of contiguous tensors, one group).
        masks: one LongTensor of flat indices per parameter (``sparse_indices``).
        **kwargs: as for ``MeZO`` (lr, eps, weight_decay, perturbation, seed, fold_updates);
            ``noise`` cannot be chosen.

    Example:
        >>> w = torch.zeros(100)
        >>> opt = SparseMeZO([w], [torch.tensor([3, 7])], lr=0.1)
        >>> _ = opt.step(lambda: (w - 1).pow(2).sum(0, keepdim=True))
        >>> int((w != 0).sum()) <= 2
        True
    """

    def __init__(self, params, masks, **kwargs):
        if kwargs.get("noise", None) is not None:
            raise ValueError("Invalid noise: SparseMeZO draws its own masked directions")
        params, masks = list(params), list(masks)
        if len(masks) != len(params):
            raise ValueError(f"Invalid masks: {len(masks)} masks for {len(params)} parameters")
        for p, m in zip(params, masks):
            if not isinstance(m, torch.Tensor) or m.dim() != 1 or m.dtype not in (torch.int32, torch.int64):
                raise ValueError("Invalid masks: each must be a 1-D integer tensor of flat indices")
            if not isinstance(p, torch.Tensor) or not p.is_contiguous():
                raise ValueError("Invalid params: SparseMeZO needs contiguous tensors")
            if m.numel() and (int(m.min()) < 0 or int(m.max()) >= p.numel()):
                raise ValueError("Invalid masks: each must be 1-D flat indices into its parameter")
        kwargs["noise"] = None
        super().__init__(params, **kwargs)
        self.masks = {id(p): m.to(p.device) for p, m in zip(params, masks)}
        self.noise = MaskedNoise(self.masks)


class Float32Master:
    """A float32 master copy of half-precision trainable parameters (restore-drift mitigation).

    MeZO perturbs and updates the master tensors; ``wrap`` makes the closure copy the master
    into the model (rounding once to bf16/fp16) before every forward, so rounding never
    accumulates in θ and small updates ηg·z are not lost.

    Example:
        >>> master = Float32Master(trainable_parameters(model))   # doctest: +SKIP
        >>> opt = MeZO(master.tensors, lr=1e-4)                    # doctest: +SKIP
        >>> opt.step(master.wrap(lambda: losses(idx)))             # doctest: +SKIP
        >>> master.sync()                                          # doctest: +SKIP
    """

    def __init__(self, params):
        self.params = list(params)
        self.tensors = [p.detach().to(torch.float32).clone() for p in self.params]

    @torch.no_grad()
    def sync(self) -> None:
        """Copy master → model parameters (cast to each parameter's dtype)."""
        for p, master in zip(self.params, self.tensors):
            p.copy_(master)

    def wrap(self, closure):
        """A closure that syncs first; after the last ``MeZO.step`` call ``sync()`` once more."""
        def synced():
            self.sync()
            return closure()
        return synced


def unit_roundoff(dtype: torch.dtype) -> float:
    """u = 2^-(mantissa bits + 1): 2⁻²⁴ float32, 2⁻¹¹ float16, 2⁻⁸ bfloat16."""
    return float(torch.finfo(dtype).eps) / 2.0


def restore_bound(theta: torch.Tensor, eps: float, z: torch.Tensor, *, passes: int = 3) -> torch.Tensor:
    """Elementwise bound on |θ_restored − θ| after ``passes`` rounded in-place shifts.

    A raised closure leaves MeZO at θ+εz (1st call: 2 adds to get back) or θ−εz (2nd call:
    3 adds). Each add rounds its result r with error ≤ u·|r|, and every intermediate is
    at most |θ| + 2ε|z| in size, so

        |θ_restored − θ| ≤ u · passes · (|θ| + 2ε|z|) + passes · tiny

    Example:
        >>> t = torch.ones(2, dtype=torch.bfloat16)
        >>> bool((restore_bound(t, 1e-3, torch.ones(2)) > 0).all())
        True
    """
    u = unit_roundoff(theta.dtype)
    tiny = float(torch.finfo(theta.dtype).tiny)
    size = theta.double().abs() + 2.0 * abs(eps) * z.double().abs()
    return passes * (u * size + tiny)

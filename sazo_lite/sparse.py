"""Sparse MeZO: perturb and update a fixed random subset of each tensor's entries.

A mask per tensor is k = ceil(fraction·numel) sorted flat indices (``sparse_indices``); z is
drawn only for those k entries (``MaskedNoise``), so the others never move and each pass draws
k instead of numel normals. Extra memory: k int64 indices (8 bytes each) + k floats of z.
"""
from __future__ import annotations

import math
from fractions import Fraction

import torch

from .directions import derive_seed, draw_direction
from .engine import MeZO
from .noise import Job, NoiseSource, PlainNoise, z_dtype
from .seedlog import _mask_digests
from .validation import check_fraction, check_seed, not_dense

__all__ = ["sparse_indices", "SparseMeZO", "MaskedNoise"]


def sparse_indices(params, fraction: float, *, seed: int = 0) -> list[torch.Tensor]:
    """A fixed random mask per tensor, stored as sorted flat indices (LongTensor [k_j]).

    Each tensor keeps ceil(fraction · numel) entries, chosen by a generator seeded from
    (seed, tensor index): the same seed always gives the same mask, so it can be
    regenerated instead of stored.
    """
    fraction = check_fraction("fraction", fraction, 0.0, 1.0, closed_low=False, closed_high=True)
    seed = check_seed("seed", seed)   # int() read 0.7 as 0, True and "1" as 1, and 2**64 as 0 (the same masks)
    masks = []
    for index, p in enumerate(_param_list(params)):
        if not isinstance(p, torch.Tensor):   # p.numel() raised AttributeError
            raise ValueError(f"Invalid params: expected a list of tensors, got a {type(p).__name__} in it")
        generator = torch.Generator().manual_seed(derive_seed(seed, index))
        chosen = torch.randperm(p.numel(), generator=generator)[:_kept(fraction, p.numel())]
        masks.append(chosen.sort().values.to(p.device))
    return masks


class SparseMeZO(MeZO):
    """MeZO restricted to fixed entries: z is drawn only for the k chosen entries per tensor.

    Update rule as in ``MeZO`` with z replaced by m ⊙ z (m the 0/1 mask): entries outside
    the mask never move. Drawing k instead of numel normals also makes each pass cheaper.
    Its passes go through a ``MaskedNoise``; a ``SeedLog`` of a SparseMeZO
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
        params, masks = _param_list(params), list(masks)
        if len(masks) != len(params):
            raise ValueError(f"Invalid masks: {len(masks)} masks for {len(params)} parameters")
        masks = [_check_mask(p, m) for p, m in zip(params, masks)]
        kwargs["noise"] = None
        super().__init__(params, **kwargs)
        self._set_masks(params, masks)

    def _set_masks(self, params, masks) -> None:
        self.masks = {id(p): m for p, m in zip(params, masks)}
        self._masked = {id(p): p for p in params}   # the tensors themselves: an id alone may be reused
        self.noise = MaskedNoise(self.masks)

    def _params(self) -> list:
        return [p for group in self.param_groups for p in group["params"]]

    def add_param_group(self, param_group: dict) -> None:
        """Only while constructing: a tensor added later has no mask (its first pass raised KeyError)."""
        if hasattr(self, "masks"):
            raise ValueError("Invalid param_group: SparseMeZO's masks are fixed at construction; build a new "
                             "SparseMeZO with every tensor and its mask")
        super().add_param_group(param_group)

    def _check_masked(self) -> None:
        """A tensor appended to or swapped into a group has no mask: refused before a pass or a state reads one."""
        if any(self._masked.get(id(p)) is not p for p in self._params()):
            raise ValueError("Invalid params: a tensor without a mask was put into SparseMeZO's param groups; "
                             "build a new SparseMeZO with every tensor and its mask")

    def _check_groups_unchanged(self) -> None:
        """A tensor without a mask (``_check_masked``), then MeZO's checks and the masks' fit."""
        self._check_masked()
        checked = getattr(self, "_checked_memory", None)
        super()._check_groups_unchanged()
        if self._checked_memory is not checked:   # checked in full: memory re-pointed (.data) since, or the first
            try:
                self._check_masks_fit()
            except ValueError:
                self._checked_groups = None   # not taken as checked: the next step checks again
                raise

    def _check_masks_fit(self) -> None:
        """Each tensor still holds its mask's entries (``_check_mask``), on the mask's device: a ``.data``
        re-pointed to a smaller tensor raised IndexError from inside the first pass."""
        for p in self._params():
            mask = self.masks[id(p)]
            try:
                if p.device != mask.device:
                    raise ValueError(f"Invalid params: a tensor on {p.device}, its mask on {mask.device}")
                _check_mask(p, mask)
            except ValueError as error:
                raise ValueError(f"{error}; its .data re-pointed since construction? Build a new SparseMeZO with "
                                 f"every tensor and its mask") from None

    def state_dict(self) -> dict:
        """MeZO's state, and ``mask_digests``: the SHA-256 of each mask in parameter order, as a ``SeedLog``
        records them (the masks themselves are the caller's to rebuild, e.g. ``sparse_indices`` with its seed)."""
        self._check_masked()   # KeyError from the digests otherwise
        return {**super().state_dict(), "mask_digests": _mask_digests(self)}

    def load_state_dict(self, state_dict: dict) -> None:
        """MeZO's ``load_state_dict``, after checking that the state's masks are this optimiser's: a state loaded
        into a SparseMeZO of other masks (``sparse_indices`` with another seed or fraction) went on moving other
        entries than the saved run's, silently. A state without ``mask_digests`` (before round 14) loads as before."""
        self._check_masked()
        if isinstance(state_dict, dict) and "mask_digests" in state_dict \
                and state_dict["mask_digests"] != _mask_digests(self):
            raise ValueError("Invalid state_dict: its masks differ from this SparseMeZO's (sizes or entries); build "
                             "it with the saved run's masks (sparse_indices with the same fraction and seed)")
        super().load_state_dict(state_dict)

    def __getstate__(self) -> dict:
        """deepcopy/pickle: the masks in parameter order (they are keyed by the tensors' ids)."""
        state = super().__getstate__()
        params = self._params()
        state["masks"] = [self.masks[id(p)] for p in params]
        state.pop("_masked", None)
        return state

    def __setstate__(self, state: dict) -> None:
        """deepcopy/pickle (the masks in parameter order), or ``load_state_dict``: torch.optim's sets the
        state and param groups through here, with the same tensors, which keep their masks."""
        masks = state.pop("masks", None)
        super().__setstate__(state)
        if masks is not None:
            self._set_masks(self._params(), masks)
            if self._pending is not None:   # the copied source keys its masks by the original tensors (KeyError)
                self._pending = (self.noise, self._pending[1])


def _kept(fraction: float, numel: int) -> int:
    """k = ceil(fraction · numel), at least 1, for the number the float ``fraction`` stands for: its product with
    numel is taken exactly, less its rounding (2⁻⁵² relative), so 0.1 · 30 keeps 3, not 4. The old rule (a
    1e-9 absolute slack on a float product) kept one entry too many from about 10⁷ entries on: 0.68 of
    78,073,600 entries kept 53,090,049 (the float 0.68 is 3.8e-9 above 0.68 there)."""
    exact = Fraction(fraction) * numel
    return max(1, math.ceil(exact - exact * Fraction(1, 2 ** 52)))


def _param_list(params) -> list:
    """``params`` as a list, or ValueError for a tensor given as params: list() split it into rows, each then
    given a mask of its own (``sparse_indices`` returned one per row, SparseMeZO asked for one per row)."""
    if isinstance(params, torch.Tensor):
        raise ValueError("Invalid params: expected a list of tensors, got a tensor")
    return list(params)


def _check_mask(p, mask) -> torch.Tensor:
    """A copy of ``mask`` on ``p``'s device, after checking that it indexes ``p``'s flat entries as a pass needs: a
    dense 1-D int32 or int64 tensor of distinct indices in [0, p.numel()), ``p`` a contiguous tensor (the passes
    write through ``p.view(-1)``). Checked at construction, and again when ``p``'s memory has moved."""
    if (not isinstance(mask, torch.Tensor) or not_dense(mask) is not None or mask.dim() != 1
            or mask.dtype not in (torch.int32, torch.int64)):
        described = f"{mask.dtype} {mask.layout} of shape {tuple(mask.shape)} on {mask.device}" if isinstance(
            mask, torch.Tensor) else type(mask).__name__
        raise ValueError(f"Invalid masks: each must be a dense 1-D int32 or int64 tensor of flat indices, got "
                         f"{described}")
    if not isinstance(p, torch.Tensor) or not p.is_contiguous():
        described = f"shape {tuple(p.shape)}, strides {p.stride()}" if isinstance(p, torch.Tensor) else type(p).__name__
        raise ValueError(f"Invalid params: SparseMeZO needs a plain list of contiguous tensors (a mask indexes "
                         f"flat entries), got {described}")
    if mask.numel() and (int(mask.min()) < 0 or int(mask.max()) >= p.numel()):
        raise ValueError(f"Invalid masks: indices must lie in [0, {p.numel()}) for a tensor of shape "
                         f"{tuple(p.shape)}")
    if mask.unique().numel() != mask.numel():   # two writes to one entry in a pass: the last wins (any on CUDA)
        raise ValueError("Invalid masks: an index appears twice in one mask")
    # read on its own device (a meta p is MeZO's to refuse); a copy of its own: a caller's mask edited in place after
    # construction changed which entries the steps moved (and a run resumed from regenerated masks moved others)
    return mask.to(p.device, copy=True)


class MaskedNoise(NoiseSource):
    """z only on fixed entries of each tensor (``SparseMeZO``): θ_m ← s·θ_m + c·z_m.

    z_m for a tensor with k chosen entries is ``draw_direction`` of a k-entry tensor from the
    tensor's seed (so the plain loop's z for a flat k-vector); entries outside the mask never move.

    Args:
        masks: {id(param): LongTensor [k] of sorted flat indices} (``sparse_indices``).
    """

    replayable = True

    def __init__(self, masks: dict[int, torch.Tensor]):
        self.masks = masks
        self._plain = PlainNoise()

    def _apply_one(self, job: Job, slot: int) -> None:
        p, chosen = job.param, self.masks[id(job.param)]
        flat, shrink = p.view(-1), job.shrink  # parameters are contiguous: writes go straight to p
        for seed, coefficient, perturbation in job.terms():
            z = draw_direction(p.new_empty(chosen.numel()), seed, perturbation, self._plain._generator(p.device))
            flat[chosen] = (flat[chosen].to(z.dtype) * shrink + coefficient * z).to(p.dtype)
            shrink = 1.0

    def _scale(self, job: Job, factor: float) -> None:
        flat, chosen = job.param.view(-1), self.masks[id(job.param)]
        flat[chosen] = flat[chosen] * factor

    def direction_bytes(self, param: torch.Tensor) -> int:
        return self.masks[id(param)].numel() * torch.empty(0, dtype=z_dtype(param)).element_size()

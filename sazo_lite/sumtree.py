"""A sum tree: draw B indices ∝ weights and change B weights in O(B log N) instead of O(N).

Layout: the implicit heap over N leaves, no padding to a power of two (nodes 1..2N−1, root 1):

    node N + i   = w_i                                    leaf i
    node k < N   = value(2k) + value(2k + 1)              internal nodes; node 1 = Σ w

Only the N − 1 internal sums are stored here (``dtype``, default float64); the leaves are
either held by the tree (``SumTree(weights)``) or read on demand from their owner
(``SumTree.over(num_leaves, leaf_values)``), so a sampler that already keeps its scores does
not keep them twice. Every internal node is recomputed from its two children, never by
adding a difference, so a tree rebuilt from the same leaves has the very same sums.

Drawing: u ~ U[0, 1); at node k go left if u < value(2k) / (value(2k) + value(2k + 1)), and rescale
u to the fraction of the child chosen, until a leaf (leaves sit at two depths, ⌊log₂N⌋ and ⌈log₂N⌉).
Each split uses the children's own sums, so with float32 sums every leaf's probability is its weight's
share to the rounding of the sums on its path (a relative error, however small the weight), and to the
resolution of u, a float64 of 53 bits rescaled at each level: an absolute error of at most about
⌈log₂N⌉·2⁻⁵³ of Σw, which is a relative error only for shares well above that (a share of 2⁻⁴⁵ is drawn
about 10⁻³ off, relative; any draw from one 53-bit uniform has this limit). All B draws descend together.

Example:
    >>> tree = SumTree(torch.tensor([1.0, 0.0, 3.0]))
    >>> tree.total
    4.0
    >>> bool((tree.sample(1000, torch.Generator().manual_seed(0)) != 1).all())
    True
"""
from __future__ import annotations

from typing import Callable

import numpy as np
import torch

from .validation import check_callable, check_count, dense_tensor

__all__ = ["SumTree"]


def _distinct_sorted(values: np.ndarray, presorted: bool = False) -> np.ndarray:
    """Sorted distinct values (np.unique without its hashing: B is small)."""
    if not presorted:
        values = np.sort(values)
    if len(values) < 2:
        return values
    return values[np.concatenate(([True], values[1:] != values[:-1]))]


class SumTree:
    """Partial sums over N non-negative weights.

    Args:
        weights: initial weights [N] (non-negative, finite), kept by the tree as float64.
    """

    def __init__(self, weights: torch.Tensor):
        weights = _real(weights)
        if weights.dim() != 1 or weights.numel() == 0:
            raise ValueError(f"Invalid weights: expected a non-empty 1-D tensor, got shape {tuple(weights.shape)}")
        self._check_values(weights.numpy(), weights.numel())
        self._leaves = weights.numpy().copy()
        self._setup(len(self._leaves), self._own_leaves, np.float64)

    def _own_leaves(self, indices: np.ndarray) -> np.ndarray:
        """The leaves a tree holds itself. A method, not a lambda: a deepcopy kept a lambda as it was, so the copy
        summed the original's leaves (and a lambda does not pickle)."""
        return self._leaves[indices]

    @classmethod
    def over(cls, num_leaves: int, leaf_values: Callable[[np.ndarray], np.ndarray],
             dtype=np.float64) -> "SumTree":
        """A tree whose leaves live elsewhere: ``leaf_values(indices)`` returns them (≥ 0).

        After the owner changes leaves, call ``refresh(indices)``. ``dtype`` is the type of
        the stored internal sums (float32 halves the memory; sums then carry float32 rounding).
        """
        tree = cls.__new__(cls)
        tree._leaves = None
        leaf_values = check_callable("leaf_values", leaf_values)   # the owner's array itself raised TypeError
        tree._setup(check_count("num_leaves", num_leaves), leaf_values, _sum_dtype(dtype))
        return tree

    def _setup(self, num_leaves: int, leaf_values, dtype) -> None:
        self.num_leaves = num_leaves
        self._leaf_values = leaf_values
        self._sums = np.zeros(num_leaves, dtype=dtype)  # node k < N at _sums[k]; _sums[0] unused
        self.rebuild()

    # -- reading ---------------------------------------------------------------------------
    def _value(self, nodes: np.ndarray) -> np.ndarray:
        """Node sums (internal) or leaf weights, float64, for heap node numbers."""
        n = self.num_leaves
        if not len(nodes) or nodes.max() < n:  # the upper levels: internal nodes only
            return self._sums[nodes].astype(np.float64)
        return self._mixed_value(nodes)

    def _mixed_value(self, nodes: np.ndarray) -> np.ndarray:
        n = self.num_leaves
        leaf = nodes >= n
        out = np.empty(len(nodes))
        out[~leaf] = self._sums[nodes[~leaf]]
        if leaf.any():
            out[leaf] = self._leaf_values(nodes[leaf] - n)
        return out

    @property
    def total(self) -> float:
        """Σ w (the root)."""
        return float(self._value(np.ones(1, dtype=np.int64))[0])

    @property
    def tree(self) -> torch.Tensor:
        """All 2N node values (index 0 unused; internal sums then leaves), float64, a copy."""
        return torch.from_numpy(self._value(np.arange(2 * self.num_leaves)))

    @property
    def nbytes(self) -> int:
        """Bytes this tree stores (internal sums, plus the leaves when it owns them)."""
        return self._sums.nbytes + (0 if self._leaves is None else self._leaves.nbytes)

    def weights(self, indices: torch.Tensor) -> torch.Tensor:
        """w_i for the given indices (a 1-D integer tensor, each in [0, N)), float64."""
        return torch.from_numpy(self._leaf_values(self._indices(indices).numpy()))

    def _indices(self, indices) -> torch.Tensor:
        """``indices`` as a 1-D int64 tensor of leaves, or ValueError: a float index was truncated (0.9 read
        as leaf 0), −1 read the last leaf, and 2-D indices changed the leaves but not their sums."""
        indices = dense_tensor("indices", indices)
        if indices.dim() != 1 or not (indices.numel() == 0 or _is_integer(indices.dtype)):
            raise ValueError(f"Invalid indices: expected a 1-D integer tensor, got {indices.dtype} "
                             f"of shape {tuple(indices.shape)}")
        indices = indices.to("cpu", torch.long)
        if indices.numel() and (int(indices.min()) < 0 or int(indices.max()) >= self.num_leaves):
            raise ValueError(f"Invalid indices: values must lie in [0, {self.num_leaves})")
        return indices

    # -- changing --------------------------------------------------------------------------
    @staticmethod
    def _check_values(values: np.ndarray, num_leaves: int, name: str = "weights") -> None:
        if not np.isfinite(values).all() or (values < 0).any():
            raise ValueError(f"Invalid {name}: entries must be finite and non-negative")
        limit = np.finfo(np.float64).max / num_leaves   # so that every sum of N leaves stays finite
        if values.size and values.max() > limit:
            raise ValueError(f"Invalid {name}: entries up to {values.max():.3g}; the tree's sums would overflow "
                             f"float64 (at most {limit:.3g} each for {num_leaves} leaves; rescale them)")

    def _read_leaves(self, indices: np.ndarray) -> np.ndarray:
        """The leaves at ``indices`` as float64, checked as ``update`` checks weights: an owner's negative leaf
        was never drawn and moved its share to its neighbours (leaves [−1, 2, 3, 1] drew leaf 2 three times in
        five), a NaN one read as 'all weights are zero'."""
        leaves = np.asarray(self._leaf_values(indices), dtype=np.float64)
        if leaves.shape != indices.shape:
            raise ValueError(f"Invalid leaf_values: {leaves.shape} values for {len(indices)} leaves")
        self._check_values(leaves, self.num_leaves, "leaf_values" if self._leaves is None else "weights")
        return leaves

    def update(self, indices: torch.Tensor, values: torch.Tensor) -> None:
        """Set w[indices] = values (last write wins for repeats) in a tree that owns its leaves."""
        if self._leaves is None:
            raise ValueError("Invalid update: this tree reads its leaves from their owner; use refresh()")
        indices, values = self._indices(indices), _real(values)
        if values.dim() > 1 or values.numel() not in (1, indices.numel()):
            raise ValueError(f"Invalid values: shape {tuple(values.shape)} (expected one value, or one per index: "
                             f"{tuple(indices.shape)})")
        values = values.reshape(-1).expand(indices.shape).numpy()
        self._check_values(values, self.num_leaves)
        self._leaves[indices.numpy()] = values
        self.refresh(indices.numpy())

    def refresh(self, indices: np.ndarray) -> None:
        """Recompute the ancestors of changed leaves (a 1-D integer array or tensor, each in [0, N), as ``update``
        reads them), O(B log N); each node from its children. −1 refreshed the path of internal node N − 1, not of
        the last leaf, so the total missed its change; 0.9 was read as leaf 0. The changed leaves must be finite
        and ≥ 0 (``_read_leaves``: ValueError before any sum changes)."""
        leaves = self._indices(indices).numpy()
        self._read_leaves(leaves)   # before any sum changes
        nodes = _distinct_sorted((self.num_leaves + leaves) // 2)
        while nodes.size and nodes[-1] >= 1:
            nodes = nodes[nodes >= 1]
            # Leaves sit at two depths: a node may be recomputed twice; the last time its
            # children are final (the deeper path reaches it one round later).
            if 2 * nodes[-1] + 1 < self.num_leaves:  # sorted: no leaf children at this level
                self._sums[nodes] = self._sums[2 * nodes].astype(np.float64) + self._sums[2 * nodes + 1]
            else:
                self._sums[nodes] = self._mixed_value(2 * nodes) + self._mixed_value(2 * nodes + 1)
            nodes = _distinct_sorted(nodes // 2, presorted=True)

    def rebuild(self) -> None:
        """Recompute every internal sum from the leaves (finite and ≥ 0, ``_read_leaves``), O(N), children before
        parents."""
        n = self.num_leaves
        leaves = self._read_leaves(np.arange(n))
        if n < 2:
            return
        values = np.concatenate([np.zeros(n), leaves])  # node values, float64 [2N]
        high = n  # nodes [low, high) form one heap level; the last level is partial
        low = 1 << ((n - 1).bit_length() - 1)
        while high > 1:
            nodes = np.arange(low, high)
            self._sums[nodes] = values[2 * nodes] + values[2 * nodes + 1]
            values[nodes] = self._sums[nodes]  # what the parents will read (rounded like refresh)
            high, low = low, low // 2

    # -- drawing ---------------------------------------------------------------------------
    def sample(self, batch_size: int, generator: torch.Generator | None = None) -> torch.Tensor:
        """B i.i.d. indices with P(i) = w_i / Σw (LongTensor [B]); needs Σw > 0."""
        check_count("batch_size", batch_size)
        total = self.total
        if not total > 0:
            raise ValueError("Invalid weights: cannot sample when all weights are zero")
        if not np.isfinite(total):   # an owner's leaves whose sum overflows: every draw would go left
            raise ValueError(f"Invalid weights: their sum overflows {self._sums.dtype}; rescale them")
        u = torch.rand(batch_size, generator=generator, dtype=torch.float64).numpy()   # a fraction of the node's mass
        node = np.ones(batch_size, dtype=np.int64)
        for _ in range(max(0, self.num_leaves.bit_length() - 2)):  # levels whose children are all internal (< N)
            u, node = _descend(u, node, self._sums[2 * node].astype(np.float64), self._sums[2 * node + 1])
        while True:
            active = node < self.num_leaves
            if active.all():  # every draw still descending: no masking
                u, node = _descend(u, node, self._value(2 * node), self._value(2 * node + 1))
                continue
            if not active.any():
                break
            at = node[active]
            u[active], node[active] = _descend(u[active], at, self._value(2 * at), self._value(2 * at + 1))
        return torch.from_numpy(node - self.num_leaves)


def _sum_dtype(dtype) -> np.dtype:
    """``dtype`` as a numpy floating dtype, or ValueError: integer or bool sums truncated every node (leaves
    [0.4, 0.4, 0.4, 0.9, 0.3] summed to 1 and leaves 1 and 2 were never drawn); a torch dtype raised TypeError."""
    try:
        checked = np.dtype(dtype)
    except TypeError:
        checked = None
    if checked is None or checked.kind != "f":
        raise ValueError(f"Invalid dtype: {dtype!r} (expected a numpy floating dtype, e.g. np.float32 or np.float64)")
    return checked


def _is_integer(dtype: torch.dtype) -> bool:
    return not (dtype.is_floating_point or dtype.is_complex or dtype == torch.bool)


def _real(values) -> torch.Tensor:
    """Weights as a float64 CPU tensor (``dense_tensor``: Python floats read in float64); complex and bool ones
    refused (the cast dropped the imaginary part, or read True as 1.0)."""
    values = dense_tensor("weights", values)
    if values.is_complex() or values.dtype == torch.bool:
        raise ValueError(f"Invalid weights: dtype {values.dtype} (expected real numbers)")
    return values.detach().to("cpu", torch.float64)


_BELOW_ONE = np.nextafter(1.0, 0.0)


def _descend(u: np.ndarray, node: np.ndarray, left: np.ndarray, right: np.ndarray):
    """One level down: go right with probability right/(left + right) of the children's own sums, and
    rescale the fraction u to the child chosen. Splitting by the children's sums rather than carrying
    an absolute u from the root keeps each leaf's probability within the rounding of the sums on its
    path, relative to its weight: with float32 sums a parent is not exactly the sum of its children,
    and the absolute descent gave the difference to one leaf (a small weight beside a large one was
    never drawn, or drawn several times too often). Never into an empty subtree, so the child's sum
    is > 0."""
    point = u * (left + right)
    go_right = ((point >= left) & (right > 0)) | (left <= 0)
    u = (point - np.where(go_right, left, 0.0)) / np.where(go_right, right, left)
    return np.minimum(u, _BELOW_ONE), 2 * node + go_right

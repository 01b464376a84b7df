"""SumTree against torch.multinomial statistics and a rebuilt tree."""
import numpy as np
import pytest
import torch

from sazo_lite.sumtree import SumTree


def chi_square(counts: torch.Tensor, probs: torch.Tensor) -> float:
    expected = probs * counts.sum()
    keep = expected > 0
    return float(((counts[keep] - expected[keep]) ** 2 / expected[keep]).sum())


def random_weights(n, seed=0):
    g = torch.Generator().manual_seed(seed)
    w = torch.rand(n, generator=g, dtype=torch.float64) ** 3
    w[torch.randperm(n, generator=g)[: n // 5]] = 0.0  # some zero weights: never drawn
    return w


@pytest.mark.parametrize("n", [1, 2, 3, 7, 64, 1000])
def test_internal_nodes_are_sums_and_total_matches(n):
    w = random_weights(n) + (n == 1)
    tree = SumTree(w)
    assert tree.total == pytest.approx(float(w.sum()), rel=1e-12)
    nodes = tree.tree
    assert torch.equal(nodes[n:], w)  # leaves after the N - 1 internal sums: no padding
    for k in range(1, n):
        assert float(nodes[k]) == pytest.approx(float(nodes[2 * k] + nodes[2 * k + 1]), abs=1e-12)


@pytest.mark.parametrize("n", [1, 2, 5, 33, 1000])
def test_every_leaf_is_reachable_and_sampled_in_proportion(n):
    """Leaves sit at two depths when N is not a power of two: all must be drawn ∝ w."""
    w = torch.arange(1, n + 1, dtype=torch.float64)
    draws = 50 * n * n if n < 100 else 400_000
    counts = torch.bincount(SumTree(w).sample(draws, torch.Generator().manual_seed(0)), minlength=n).double()
    assert bool((counts > 0).all())
    dof = max(n - 1, 1)
    assert chi_square(counts, w / w.sum()) < dof + 5 * (2 * dof) ** 0.5


def test_tree_over_external_leaves_in_float32_matches_float64_to_float_precision():
    scores = random_weights(777, seed=5).numpy()
    outside = SumTree.over(777, lambda idx: scores[idx], dtype=np.float32)
    inside = SumTree(torch.from_numpy(scores.copy()))
    assert outside.nbytes == 777 * 4 and inside.nbytes == 777 * 16
    g = torch.Generator().manual_seed(1)
    for _ in range(50):
        idx = torch.randint(777, (8,), generator=g)
        vals = torch.rand(8, generator=g, dtype=torch.float64)
        scores[idx.numpy()] = vals.numpy()  # last write wins, as in update()
        outside.refresh(idx.numpy())
        inside.update(idx, vals)
    assert torch.allclose(outside.tree, inside.tree, rtol=1e-6, atol=0)
    with pytest.raises(ValueError, match="refresh"):
        outside.update(torch.tensor([0]), torch.tensor([1.0]))


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("n", [2, 3, 100, 1000])
def test_incremental_refresh_equals_a_rebuild_bit_for_bit(n, dtype):
    """Every node is recomputed from its children: resuming from the leaves loses nothing."""
    scores = random_weights(n, seed=2).numpy()
    tree = SumTree.over(n, lambda idx: scores[idx], dtype=dtype)
    g = torch.Generator().manual_seed(3)
    for _ in range(200):
        idx = torch.randint(n, (5,), generator=g).numpy()
        scores[idx] = torch.rand(5, generator=g, dtype=torch.float64).numpy() * 1e3
        tree.refresh(idx)
    rebuilt = SumTree.over(n, lambda idx: scores[idx], dtype=dtype)
    assert torch.equal(tree.tree, rebuilt.tree)


def test_sample_frequencies_match_multinomial_statistics():
    n, draws = 50, 200_000
    w = random_weights(n, seed=1)
    probs = w / w.sum()
    tree_counts = torch.bincount(SumTree(w).sample(draws, torch.Generator().manual_seed(2)), minlength=n).double()
    ref_counts = torch.bincount(torch.multinomial(probs, draws, replacement=True,
                                                  generator=torch.Generator().manual_seed(3)), minlength=n).double()
    assert float(tree_counts[w == 0].sum()) == 0  # zero weights are never drawn
    dof = int((w > 0).sum()) - 1
    # both chi² statistics ~ χ²(dof): mean dof, sd sqrt(2 dof); 5 sd is a generous bound
    bound = dof + 5 * (2 * dof) ** 0.5
    assert chi_square(tree_counts, probs) < bound
    assert chi_square(ref_counts, probs) < bound
    # and a wrong distribution is rejected by the same bound (the test can fail)
    assert chi_square(tree_counts, torch.full((n,), 1.0 / n, dtype=torch.float64)) > bound


def test_update_changes_distribution_and_keeps_sums():
    w = random_weights(100, seed=4)
    tree = SumTree(w)
    idx = torch.tensor([3, 3, 50, 99])
    tree.update(idx, torch.tensor([0.5, 2.0, 0.0, 7.0]))  # last write wins for index 3
    w[3], w[50], w[99] = 2.0, 0.0, 7.0
    assert tree.total == pytest.approx(float(w.sum()), rel=1e-12)
    assert torch.allclose(tree.weights(torch.arange(100)), w)
    rebuilt = SumTree(w)
    assert torch.allclose(tree.tree, rebuilt.tree, rtol=1e-12, atol=1e-12)
    # a wrong tree (one stale ancestor) is caught by the same comparison
    stale = SumTree(w)
    stale._sums[1] += 1.0
    assert not torch.allclose(stale.tree, rebuilt.tree, rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize("bad", [torch.tensor([1.0, -1.0]), torch.tensor([float("nan")]), torch.zeros(0)])
def test_sumtree_rejects_bad_weights(bad):
    with pytest.raises(ValueError, match="weights"):
        SumTree(bad)


def test_sumtree_rejects_bad_updates_and_empty_sampling():
    tree = SumTree(torch.zeros(4))
    with pytest.raises(ValueError, match="all weights are zero"):
        tree.sample(3)
    with pytest.raises(ValueError, match="indices"):
        tree.update(torch.tensor([4]), torch.tensor([1.0]))
    with pytest.raises(ValueError, match="weights"):
        tree.update(torch.tensor([0]), torch.tensor([-1.0]))

"""SumTree against torch.multinomial statistics and a rebuilt tree."""
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


@pytest.mark.parametrize("n", [1, 2, 7, 64, 1000])
def test_internal_nodes_are_sums_and_total_matches(n):
    w = random_weights(n) + (n == 1)
    tree = SumTree(w)
    assert tree.total == pytest.approx(float(w.sum()), rel=1e-12)
    for k in range(1, tree.leaf_base):
        assert float(tree.tree[k]) == pytest.approx(float(tree.tree[2 * k] + tree.tree[2 * k + 1]), abs=1e-12)


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

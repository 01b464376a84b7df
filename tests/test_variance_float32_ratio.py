"""variance_ratio takes what its own check takes: a float32 p off by its dtype's rounding was accepted by
tv_distance and paired_vectors, then refused by the float64 re-check inside sampling_variance."""
from __future__ import annotations

import pytest
import torch

from sazo_lite.variance import oracle_probs, sampling_variance, tv_distance, variance_ratio


def test_variance_ratio_takes_a_float32_p_that_tv_distance_takes():
    n = 10_000
    norms = torch.rand(n, generator=torch.Generator().manual_seed(0), dtype=torch.float64) + 0.1
    p = torch.full((n,), 1.0 / n, dtype=torch.float32)
    p[0] += 4e-5                       # off by 4e-5: inside float32's 8·√N·eps, outside float64's 1e-5
    assert tv_distance(p, torch.full((n,), 1.0 / n)) == pytest.approx(2e-5, rel=1e-3)
    expected = float((norms ** 2 / p.double()).sum()) / float((norms ** 2 / oracle_probs(norms)).sum())
    assert variance_ratio(norms, p) == pytest.approx(expected, rel=1e-12)
    with pytest.raises(ValueError, match="Invalid probs"):    # a float64 p off by as much is still refused
        sampling_variance(norms, p.double())

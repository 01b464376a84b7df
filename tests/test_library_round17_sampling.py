"""Round 17 of the library's red team, sampling and training: what the hunt in the samplers, the sum tree, the
training loop, seed logs, the distributed helpers and the variance helpers found.

Each defect's test fails on the code before its fix.
"""
from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from sazo_lite.samplers import PlainSAZOSampler, SAZOSampler, StaleCorrectedSAZOSampler


def _trained(sampler, steps: int = 30, batch_size: int = 4, seed: int = 0):
    """``sampler`` after ``steps`` draws and updates with diffs whose size grows with the index."""
    generator = torch.Generator().manual_seed(seed)
    for _ in range(steps):
        indices, _ = sampler.sample(batch_size)
        scale = (1.0 + indices.double()) ** 2
        sampler.update(indices, scale * torch.randn(batch_size, generator=generator, dtype=torch.float64))
    return sampler


def _plain_prior(sampler) -> float:
    """The prior in G's units from the estimates and counts alone: sqrt(mean G²) ("abs", s = G) or mean G
    ("square", s = sqrt(G), s̄² = mean s²) over the examples seen."""
    g = sampler.estimates.double()[sampler.counts > 0]
    return float(g.mean()) if sampler.statistic == "square" else float((g * g).mean().sqrt())


# --- 1. prior() after a statistic switch ------------------------------------------------------------------------
@pytest.mark.parametrize("make, switch", [
    (lambda: SAZOSampler(24, seed=1), "square"),
    (lambda: SAZOSampler(24, sum_tree=True, statistic="square", seed=1), "abs"),
    (lambda: StaleCorrectedSAZOSampler(24, seed=1), "square"),
], ids=["abs to square", "square to abs (tree)", "stale-corrected"])
def test_prior_follows_a_statistic_switched_between_steps_at_once(make, switch):
    """Round 16 made a statistic change sum the scores again at the next draw, update, probs or scores; prior()
    read the running Σ s² without that check, so right after the switch it reported s̄ of the old statistic in
    the new one's units (1.50 where the scores give 1.00)."""
    sampler = _trained(make())
    assert sampler.prior() == pytest.approx(_plain_prior(sampler), rel=1e-9)
    sampler.statistic = switch
    assert sampler.prior() == pytest.approx(_plain_prior(sampler), rel=1e-9)


@pytest.mark.parametrize("make", [lambda: SAZOSampler(8), lambda: PlainSAZOSampler(8)], ids=["robust", "plain"])
def test_decay_checks_ema_decay_set_between_steps(make):
    """decay() is 'the EMA decay the next update applies'; an ema_decay of −0.5 set between steps was returned
    as −0.5 while the next update refuses it."""
    sampler = make()
    sampler.ema_decay = -0.5
    with pytest.raises(ValueError, match="ema_decay"):
        sampler.decay([0, 1, 20])

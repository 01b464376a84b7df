"""Round 18 of the library's red team, samplers and the training loop: what the hunt in the samplers, the sum
tree, the variance helpers, the training loop, interrupts and atomic writes found, and the properties checked.

Each defect's test fails on the code before its fix.
"""
from __future__ import annotations

import numpy as np
import pytest
import torch

from sazo_lite.samplers import PlainSAZOSampler, SAZOSampler, StaleCorrectedSAZOSampler


def _feedback(generator: torch.Generator, batch_size: int) -> torch.Tensor:
    return 3.0 * torch.randn(batch_size, generator=generator, dtype=torch.float64)


def _resume_matches(sampler, fresh, steps: int = 60, batch_size: int = 4) -> bool:
    """Save ``sampler``, load the state into ``fresh``, feed both the same diffs: same draws, weights, estimates."""
    fresh.load_state_dict(sampler.state_dict())
    generator = torch.Generator().manual_seed(5)
    for _ in range(steps):
        (a, wa), (b, wb) = sampler.sample(batch_size), fresh.sample(batch_size)
        if not (torch.equal(a, b) and torch.equal(wa, wb)):
            return False
        diffs = _feedback(generator, batch_size)
        sampler.update(a, diffs)
        fresh.update(b, diffs)
    return torch.equal(sampler.estimates, fresh.estimates)


# --- 1. a setting set as a numpy number resumes as the run it came from ----------------------------------------
@pytest.mark.parametrize("make", [
    lambda: PlainSAZOSampler(40, seed=0),
    lambda: PlainSAZOSampler(40, sum_tree=True, seed=0),
    lambda: SAZOSampler(40, seed=0),
    lambda: StaleCorrectedSAZOSampler(40, seed=0),
], ids=["plain", "plain tree", "robust", "stale-corrected"])
@pytest.mark.parametrize("beta", [np.float64(0.85), np.float32(0.3), np.float64(0.3)], ids=repr)
def test_an_ema_decay_set_as_a_numpy_number_resumes_bit_for_bit(make, beta):
    """A schedule sets β between steps as a numpy number (``0.9 * np.exp(-t / T)``). The plain rule computed
    β·G in float64 for a numpy float64 β and in float32 for a Python float (NumPy 2's promotion), and 1 − β in
    float32 for a float32 β; the state records β as a Python float (round 15), so the resumed run computed other
    estimates: 37 of 50 differed 100 steps after a resume."""
    sampler, generator = make(), torch.Generator().manual_seed(3)
    sampler.ema_decay = beta
    for _ in range(20):
        indices, _ = sampler.sample(4)
        sampler.update(indices, _feedback(generator, 4))
    assert _resume_matches(sampler, make())


def test_a_setting_is_kept_as_the_python_number_its_check_returns():
    """What the constructor and a loaded state hold: a float, whatever type was set between steps."""
    sampler = SAZOSampler(10)
    sampler.ema_decay, sampler.uniform_mix, sampler.prior_strength = np.float32(0.5), np.float64(0.2), np.int64(2)
    sampler.sample(2)
    assert [type(v) for v in (sampler.ema_decay, sampler.uniform_mix, sampler.prior_strength)] == [float] * 3
    assert (sampler.ema_decay, sampler.uniform_mix, sampler.prior_strength) == (0.5, float(np.float64(0.2)), 2.0)

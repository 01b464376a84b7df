"""MeZO's base seed is hashed by its low 64 bits (``derive_seed``): a seed of 2⁶⁴ or more silently drew the
directions of another seed (2⁷⁰ and 2⁷⁰ + 2⁶⁴ alike). It is refused as every other seed of the library is
(``validation.check_seed``), in the constructor and in a loaded state."""
import pytest
import torch

import sazo_lite as sz


@pytest.mark.parametrize("seed", [2 ** 64, 2 ** 70, -2 ** 63 - 1])
def test_a_seed_outside_64_bits_is_refused(seed):
    with pytest.raises(ValueError, match="Invalid seed"):
        sz.MeZO([torch.zeros(3)], lr=0.1, seed=seed)
    opt = sz.MeZO([torch.zeros(3)], lr=0.1)
    state = opt.state_dict()
    state["state"][0]["seed"] = seed
    with pytest.raises(ValueError, match="Invalid seed"):
        opt.load_state_dict(state)


def test_the_largest_seeds_still_step():
    for seed in (2 ** 64 - 1, -2 ** 63, 0):
        theta = torch.zeros(3)
        sz.MeZO([theta], lr=0.1, seed=seed).step(lambda: (theta - 1.0).pow(2).sum())
        assert bool(theta.abs().sum() > 0)

"""Round 18: the public score -> probability transform checks its λ and N as the samplers do."""
import math

import numpy as np
import pytest
import torch

from sazo_lite.samplers import probabilities
from sazo_lite.variance import mixed_probabilities


@pytest.mark.parametrize("mix", [-0.1, 1.5, math.nan, math.inf, "0.1", True])
def test_a_mix_outside_zero_one_is_refused(mix):
    with pytest.raises(ValueError, match="uniform_mix"):
        mixed_probabilities(np.array([1.0, 3.0]), 4.0, mix, 2)


def test_a_denormal_mix_whose_share_underflows_is_refused_rather_than_giving_p_zero():
    """λ = 5e-324 gave λ/N = 0: an example of score 0 got p = 0 (weight 1/(N·p) = inf) under a 'mixed' rule."""
    with pytest.raises(ValueError, match="underflows"):
        probabilities(np.array([0.0, 1.0]), 1.0, 5e-324, 2)
    assert mixed_probabilities(np.array([0.0, 1.0]), 1.0, 5e-324, 1).tolist()[0] > 0   # N = 1: λ/N = λ


@pytest.mark.parametrize("n", [0, -1, 2.0, "2"])
def test_a_number_of_examples_that_is_not_a_count_is_refused(n):
    with pytest.raises(ValueError, match="num_examples"):
        mixed_probabilities(torch.tensor([1.0], dtype=torch.float64), 0.0, 0.1, n)


def test_ordinary_inputs_unchanged_and_numpy_mix_read_as_python_float():
    got = mixed_probabilities(np.array([1.0, 3.0]), 4.0, np.float32(0.5), 2)
    assert got.tolist() == [(1 - float(np.float32(0.5))) * 0.25 + float(np.float32(0.5)) / 2,
                            (1 - float(np.float32(0.5))) * 0.75 + float(np.float32(0.5)) / 2]
    assert mixed_probabilities(np.array([1.0, 3.0]), 0.0, 0.1, 2).tolist() == [0.5, 0.5]

"""Round 14 of the library's red team: the oracle's λ in its state, distributions checked as distributions,
SparseMeZO's masks, and what the hunt in the samplers, variance helpers, sparse MeZO and sum tree found.

Each defect's test fails on the code before its fix.
"""
from __future__ import annotations

import io

import numpy as np
import pytest
import torch

from sazo_lite.samplers import OracleSampler, SAZOSampler


# --- 1. OracleSampler's state holds its λ ------------------------------------------------------------------------
def _oracle(mix: float, seed: int = 1) -> OracleSampler:
    norms = torch.linspace(0.0, 3.0, 16, dtype=torch.float64) ** 2
    return OracleSampler(16, lambda: norms, uniform_mix=mix, seed=seed)


def test_an_oracle_state_loaded_into_an_oracle_of_another_mix_resumes_with_the_saved_mix():
    """The state held the generator only: loaded into an oracle built with λ = 0, a run saved at λ = 0.5 went on
    drawing from the exact oracle (examples of norm 0 never drawn again, other weights) without a word. The λ is
    recorded and taken on load, as the SAZO samplers take their hyperparameters; the draws go on bit for bit."""
    original = _oracle(0.5)
    original.sample(8)
    resumed = _oracle(0.0, seed=7)
    resumed.load_state_dict(original.state_dict())
    assert resumed.uniform_mix == 0.5
    for _ in range(3):
        (i, w), (j, v) = original.sample(32), resumed.sample(32)
        assert torch.equal(i, j) and torch.equal(w, v)
    assert torch.equal(original.probs, resumed.probs)


def test_the_oracle_records_its_mix_as_the_sazo_samplers_record_theirs():
    oracle, sazo = _oracle(0.25), SAZOSampler(16, uniform_mix=0.25)
    assert oracle.state_dict()["hyperparameters"] == {"uniform_mix": 0.25}
    assert sazo.state_dict()["hyperparameters"]["uniform_mix"] == 0.25
    oracle.uniform_mix = np.float64(0.125)   # a schedule computed with numpy: still a state torch.load takes
    buffer = io.BytesIO()
    torch.save(oracle.state_dict(), buffer)
    buffer.seek(0)
    assert torch.load(buffer, weights_only=True)["hyperparameters"] == {"uniform_mix": 0.125}


@pytest.mark.parametrize("hyper, message", [({"uniform_mix": 1.5}, "Invalid uniform_mix"),
                                            ({"uniform_mix": float("nan")}, "Invalid uniform_mix"),
                                            ({"uniform_mix": True}, "Invalid uniform_mix"),
                                            ({"uniform_mix": "0.1"}, "Invalid uniform_mix"),
                                            ({"lam": 0.1}, "Invalid state: hyperparameters"),
                                            ({"uniform_mix": 0.1, "seed": 1}, "Invalid state: hyperparameters"),
                                            ([0.1], "Invalid state: hyperparameters")])
def test_an_oracle_state_with_a_bad_mix_is_refused_naming_it_with_the_sampler_unchanged(hyper, message):
    source, target = _oracle(0.5), _oracle(0.2, seed=3)
    target.sample(4)
    before = target.state_dict()
    with pytest.raises(ValueError, match=message):
        target.load_state_dict({**source.state_dict(), "hyperparameters": hyper})
    after = target.state_dict()
    assert after["hyperparameters"] == before["hyperparameters"] and torch.equal(after["generator"],
                                                                                  before["generator"])
    assert after["seed"] == before["seed"]


def test_an_oracle_state_written_before_round_14_still_loads_and_keeps_the_samplers_mix():
    old = {k: v for k, v in _oracle(0.5).state_dict().items() if k != "hyperparameters"}
    target = _oracle(0.2, seed=3)
    target.load_state_dict(old)
    assert target.uniform_mix == 0.2 and target.seed == 1

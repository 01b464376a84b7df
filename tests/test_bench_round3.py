"""The benchmark CLIs as a user runs them (third round): SAZO's direct overhead measured in a fair order,
bad arguments refused before the work, caches and output files that never mix runs, and every table
printed with its date and machine. Every test runs on fakes or tiny settings: seconds in all, no timing
assertions (fake clocks only)."""
import json

import pytest
import torch

from benchmarks import engine_speed


def refused(capsys, call, *words) -> str:
    """Run ``call()``; it must exit 2 (argparse's usage error) with ``words`` in its message."""
    with pytest.raises(SystemExit) as caught:
        call()
    assert caught.value.code == 2
    err = capsys.readouterr().err
    for word in words:
        assert word in err, err
    return err


# -- engine_speed.overhead: which sampler is timed first alternates -------------------------------------------
class FallingLoad:
    """A fake clock: every training step costs 1 unit × the load, and the load falls by 1% a step (a shared
    machine whose other jobs end, or caches warming up): a step timed later in a round reads cheaper."""

    def __init__(self):
        self.now, self.load, self.order = 0.0, 1.0, []

    def step(self, sampler) -> None:
        self.order.append(type(sampler).__name__)
        self.now += self.load
        self.load *= 0.99

    def timed(self, fn, clock=None) -> float:
        start = self.now
        fn()
        return self.now - start


@pytest.fixture
def falling(monkeypatch):
    fake = FallingLoad()
    monkeypatch.setattr(engine_speed, "build_model", lambda name: None)
    monkeypatch.setattr(engine_speed, "random_tokens", lambda model, batch, seq, seed=0: None)
    monkeypatch.setattr(engine_speed, "distinct_parameters", lambda model: [torch.zeros(4)])
    monkeypatch.setattr(engine_speed, "_train_step", lambda opt, sampler, tokens, batch, model: fake.step(sampler))
    monkeypatch.setattr(engine_speed, "sampler_seconds", lambda sampler, batch, repeats=50, seed=0: 0.0)
    monkeypatch.setattr(engine_speed, "_timed", fake.timed)
    return fake


def test_overhead_alternates_which_sampler_is_timed_first(falling):
    """engine_speed.overhead timed the uniform step before SAZO's in every round, so anything that makes the
    second of two steps cheaper or dearer (warm caches, a load that drifts) went into the direct ratio."""
    engine_speed.overhead("gpt2-tiny", sizes=(64,), rounds=4)
    timed = falling.order[2:]                                     # after one warm-up step each
    slots = {name: [k for k, n in enumerate(timed) if n == name] for name in ("UniformSampler", "SAZOSampler")}
    assert len(slots["UniformSampler"]) == len(slots["SAZOSampler"]) > 0, timed
    # the same mean slot: a drift linear in time favours neither; timed U S U S ..., SAZO came later on average
    assert sum(slots["UniformSampler"]) == sum(slots["SAZOSampler"]), timed
    assert {timed[0], timed[4]} == {"UniformSampler", "SAZOSampler"}, timed     # the first of a round alternates


def test_equal_steps_read_as_equal_under_a_falling_load(falling):
    """Both samplers' steps cost the same here, so the direct ratio must read 1; timed uniform-then-SAZO it
    read 0.99 (the load's fall between the two)."""
    result = engine_speed.overhead("gpt2-tiny", sizes=(64,), rounds=4)["N=6e+01"]
    assert result["ratio"] == pytest.approx(1.0, abs=1e-3), result
    assert result["best_ratio"] == pytest.approx(1.0, abs=1e-3), result


def test_round_order_is_a_b_b_a_with_a_alternating():
    assert engine_speed.round_order(0) == ("uniform", "sazo", "sazo", "uniform")
    assert engine_speed.round_order(1) == ("sazo", "uniform", "uniform", "sazo")

"""NoiseScaledStep has a state: a resumed run scales its rate as the uninterrupted one (it restarted its warm-up)."""
import pytest

from sazo_lite.train import NoiseScaledStep

GS = [2.0, 1.5, 3.0, 0.5, 0.7, 4.0, 0.2, 1.1, 0.9, 2.5]


def _scales(rule, gs):
    out = []
    for g in gs:
        rule.observe(g)
        out.append(rule.scale())
    return out


def test_a_resumed_rule_scales_as_the_uninterrupted_one():
    whole = _scales(NoiseScaledStep(warmup=3, decay=0.8), GS)
    first = NoiseScaledStep(warmup=3, decay=0.8)
    _scales(first, GS[:5])
    resumed = NoiseScaledStep(warmup=3, decay=0.8)
    resumed.load_state_dict(first.state_dict())
    assert _scales(resumed, GS[5:]) == whole[5:]
    assert _scales(NoiseScaledStep(warmup=3, decay=0.8), GS[5:]) != whole[5:]   # a fresh rule restarts its warm-up


@pytest.mark.parametrize("change", [{"warmup": 4}, {"decay": 0.9}, {"max_scale": 2.0}, {"seen": -1},
                                    {"seen": True}, {"mean": float("nan")}, {"reference": -1.0}, {"extra": 1}])
def test_a_state_of_other_settings_or_out_of_range_is_refused_and_nothing_changes(change):
    rule = NoiseScaledStep(warmup=3, decay=0.8)
    _scales(rule, GS[:4])
    before = rule.state_dict()
    with pytest.raises(ValueError, match="Invalid"):
        rule.load_state_dict({**before, **change})
    assert rule.state_dict() == before

"""make bench grades each language-model race by its own goals: the long-run race (its section's goals, targets
≤ 0.3·F₀) shows the oracle's headroom without the earlier B = 4 race's "≥ 3" goal and grades the homogeneous
control at its goal targets only; the earlier race, which carries no goals of its own, keeps "≥ 3" everywhere."""
from benchmarks import run


def section(label, targets, goals=True):
    ratios = {f"{r}@{t}": 1.5 for r in ("uniform/oracle", "uniform/sazo", "sazo/oracle") for t in targets}
    setting = {"label": label, "heterogeneity": 3.0, "B": 4, "chosen_lr": {}, "ratios": ratios, "ratio_bounds": {},
               "incomplete": {}, "seeds": {"uniform": 5, "sazo": 5, "oracle": 5}}
    out = {"date": "2026-12-07 20:00 UTC", "settings": [setting], "targets": list(targets), "title": "bench-llm",
           "pilot": False, "source": "this machine's latest llm_queries.json"}
    if goals:
        out["goals"] = {"deepest": 0.3, "uniform/sazo": 2.0, "sazo/oracle": 1.3}
    return out


def rows_of(report, what):
    return {row[1].split(" @ ")[1].split("·")[0]: row[3:] for row in run._llm_rows(report) if row[1].endswith(what)}


def test_the_long_run_race_shows_the_oracles_headroom_without_the_earlier_races_goal():
    headroom = rows_of(section("SmolLM2 top-block LoRA r4 opposed (N=32, B=4)", (0.5, 0.3)), "uniform ÷ oracle")
    assert headroom == {"0.5": ("", ""), "0.3": ("", "")}
    gain = rows_of(section("SmolLM2 top-block LoRA r4 opposed (N=32, B=4)", (0.5, 0.3)), "uniform ÷ SAZO")
    assert gain == {"0.5": ("", ""), "0.3": ("≥ 2", "NO")}


def test_the_earlier_race_keeps_its_headroom_goal_at_every_target():
    headroom = rows_of(section("SmolLM2 LoRA r4 opposed (N=192, B=4)", (0.7, 0.5), goals=False), "uniform ÷ oracle")
    assert headroom == {"0.7": ("≥ 3", "NO"), "0.5": ("≥ 3", "NO")}


def test_the_control_is_graded_at_the_goal_targets_only():
    control = rows_of(section("SmolLM2 top-block homogeneous (N=32 alike, B=4)", (0.5, 0.3)), "SAZO ÷ uniform")
    assert control == {"0.5": ("", ""), "0.3": ("≤ 1.1", "yes")}

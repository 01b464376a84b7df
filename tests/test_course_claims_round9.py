"""Round 9: notebook sentences that describe a readout or a divergence, checked against the code they describe.

Today's dashboards name diverged runs in words and the SAZO readout gained a mean step |Δlog|; the sentences
below had gone stale. Each test reads the sentence in the committed notebook and the number or text the same
code produces (at the size fast mode runs it, and where the sentence speaks of class mode, at that size too).
"""
from __future__ import annotations

import ast
import json
import re
from pathlib import Path

import pytest

from sazo_lite.course import sazo_runs as E

ROOT = Path(__file__).resolve().parents[1]


def _markdown(name: str, anchor: str) -> str:
    """The one markdown cell of notebook ``name`` that contains ``anchor``."""
    cells = json.loads((ROOT / "notebooks" / f"{name}.ipynb").read_text(encoding="utf-8"))["cells"]
    found = ["".join(c["source"]) for c in cells if c["cell_type"] == "markdown" and anchor in "".join(c["source"])]
    assert len(found) == 1, (name, anchor, len(found))
    return found[0]


# -- notebook 04: what the SAZO readout holds, in the order it prints it ----------------------------------------

# readout field (as trace_readout prints it) -> the words notebook 04 uses for it
_READOUT_WORDS = {
    "Spearman": "Spearman",
    "TV": "total-variation",
    "V(p_SAZO)/V(p*)": "variance ratio",
    "V(uniform)/V(p*)": "variance ratio",
    "gap": "the gap",
    "mean over the run": "over the run so far",
    "plotted estimates' mean step |Δ log|": r"mean step $\lvert\Delta\log\rvert$",
}


@pytest.fixture(scope="module")
def readout():
    pytest.importorskip("plotly")
    from sazo_lite.course.widgets.sazo import trace_readout

    problem = E.make_problem("heterogeneous quadratic", heterogeneity=1.5, num_examples=32, dim=4, seed=0)
    trace = E.run_sazo_trace(problem, steps=40, batch_size=4, lr=0.01, log_every=10, rule="plain")
    return trace_readout(trace, -1)


def _fields(line: str) -> list[str]:
    """The readout's fields in order: 'step 40: Spearman ρ = ..., TV = ...; mean over the run: ...; ...'."""
    fields = []
    for part in re.split(r"[,;] (?![0-9])", line.split(": ", 1)[1]):
        if part.startswith("uniform ") and "=" not in part:   # 'mean over the run: SAZO 2.40, uniform 6.50'
            continue
        fields.append(re.split(r" ρ| =|: ", part)[0].strip())
    return fields


def test_04_section_5_names_every_field_its_printed_lines_hold(readout):
    """Section 5 prints trace_readout's lines: the text names every field they hold (a new one fails here)."""
    fields = _fields(readout)
    assert set(fields) <= set(_READOUT_WORDS), f"trace_readout prints fields notebook 04 does not name: {fields}"
    text = _markdown("04_sazo_estimating_norms", "Three numbers summarise each snapshot")
    for field in fields:
        assert _READOUT_WORDS[field] in text, f"section 5 does not say what '{field}' in its printed lines is"


def test_04_dashboard_text_describes_the_readout_in_its_order(readout):
    """Section 7 says what the readout gives, in the order it prints it, and what it ends with."""
    fields = _fields(readout)
    text = _markdown("04_sazo_estimating_norms", "## 7 · The dashboard")
    said = text[text.index("The readout"):].split(". ")[0]
    order = [said.find(_READOUT_WORDS[f].replace("over the run so far", "over the run")) for f in
             ("mean over the run", "plotted estimates' mean step |Δ log|")]
    assert -1 not in order and order == sorted(order), said
    assert [f for f in fields if f in ("mean over the run", "plotted estimates' mean step |Δ log|")] == \
        ["mean over the run", "plotted estimates' mean step |Δ log|"]
    ends = re.search(r"The readout ends with (.*?)(?: —|,|$)", said)
    if ends:                                            # 'ends with X' must be the readout's last field
        assert _READOUT_WORDS[fields[-1]].replace("over the run so far", "over the run") in ends.group(1), said


# -- notebook 05: race 1's diverged uniform seed, and the dashboard at the oracle's rate -------------------------

RACE1 = dict(batch_size=4, log_every=10, target_fraction=0.1)
FAST_SEEDS, FAST_STEPS = 3, 450        # the race-1 cell's pick(5, 3) seeds and pick(600, 450) steps, fast mode
CLASS_SEEDS, CLASS_STEPS = 5, 600


def _class_rates(race_index: int) -> dict:
    """The 'η per method' line of race ``race_index`` (0: race 1) in the stored class-mode run."""
    text = (ROOT / "benchmarks" / "reference" / "class_runs" / "05_the_race.txt").read_text(encoding="utf-8")
    lines = re.findall(r"η per method: (\{.*?\})", text)
    return ast.literal_eval(lines[race_index])


def _uniform_divergence(lr: float, seeds: int, steps: int, dtype) -> str:
    from sazo_lite.course.widgets.race import race_divergence

    problem = E.make_problem("heterogeneous quadratic", heterogeneity=1.5, num_examples=64, dim=5)
    result = E.race(problem, samplers=("uniform",), lr={"uniform": lr}, seeds=tuple(range(seeds)), steps=steps,
                    dtype=dtype, **RACE1)
    return re.sub(r"<[^>]+>", "", race_divergence(result, batch_size=RACE1["batch_size"]))


@pytest.mark.parametrize("mode", ["fast", "class"])
def test_05_race_1_says_whether_a_uniform_seed_diverged(mode):
    """Race 1's answer says one of uniform's seeds diverges at its tuned η: true in the mode it speaks of."""
    pytest.importorskip("plotly")
    import torch

    text = _markdown("05_the_race", "## 5 · Race 1")
    seeds, steps = (FAST_SEEDS, FAST_STEPS) if mode == "fast" else (CLASS_SEEDS, CLASS_STEPS)
    lr = 0.01 if mode == "fast" else _class_rates(0)["uniform"]   # fast: the 'η per method' line race 1 prints
    note = _uniform_divergence(lr, seeds, steps, torch.float64)
    stated = ("here too one of uniform's seeds diverges" if mode == "fast" else "the fifth diverged") in text
    assert stated == (f"diverged in 1 of its {seeds} seeds" in note), (mode, note)
    section8 = _markdown("05_the_race", "## 8 · The dashboard")   # the dashboard reruns race 1 in float32
    opens_with_note = "The dashboard opens with one such note" in section8
    assert opens_with_note == bool(_uniform_divergence(lr, seeds, steps, torch.float32)), mode


@pytest.mark.parametrize("mode", ["fast", "class"])
def test_05_dashboard_answer_1_uniform_diverges_at_the_oracle_rate(mode):
    """Answer 1 of section 8: at the oracle's tuned rate most or all uniform seeds diverge, the earliest within
    the first hundred steps (the dashboard's float32 runs)."""
    pytest.importorskip("plotly")
    import torch

    text = _markdown("05_the_race", "## 8 · The dashboard")
    assert "most or all of its seeds diverge, the earliest within the first hundred steps" in text
    seeds, steps = (FAST_SEEDS, FAST_STEPS) if mode == "fast" else (CLASS_SEEDS, CLASS_STEPS)
    lr = 0.04 if mode == "fast" else _class_rates(0)["oracle"]   # fast: race 1's printed oracle rate
    note = _uniform_divergence(lr, seeds, steps, torch.float32)
    found = re.search(r"diverged in (?:all (\d+) of its seeds|(\d+) of its (\d+) seeds).*?by step (\d+)", note)
    assert found, note
    diverged = int(found.group(1) or found.group(2))
    assert diverged > seeds / 2 and int(found.group(4)) < 100, note


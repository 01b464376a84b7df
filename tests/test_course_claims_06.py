"""Notebook 06 says only what its cells print, and its figures show where the race is decided.

06 is executed once in fast mode (``SAZO_FAST=1``, what CI and the book show): ``make test``'s nbmake
copy (``SAZO_BOOK_EXECUTED``) where its code is the committed notebook's, else a fresh run here (seconds:
every number comes from the stored report ``sazo_lite.course.llm_lesson.REPORT``). The rule for the
prose is the course's one rule, ``sazo_lite.course.claims.unprinted`` (tests/test_course_claims.py
applies it to every chapter); here it is applied to 06 with no exemptions, and tested on mutants of 06.
"""
from __future__ import annotations

import copy
import json
import math
import os
import re
from pathlib import Path

import nbformat
import pytest
import torch

from sazo_lite.course import claims, llm_lesson as lesson
from sazo_lite.llm.continual import predicted_gains

ROOT = Path(__file__).resolve().parents[1]
NOTEBOOK = ROOT / "notebooks" / "06_llm_finetuning.ipynb"


def _execute(tmp: Path) -> dict:
    """06 run in fast mode in ``tmp`` (outside the checkout: the lesson finds its report from the package)."""
    from nbclient import NotebookClient

    notebook = nbformat.read(NOTEBOOK, as_version=4)
    previous = os.environ.get("SAZO_FAST")
    os.environ["SAZO_FAST"] = "1"                    # the kernel inherits the environment
    try:
        NotebookClient(notebook, timeout=600, kernel_name="python3", resources={"metadata": {"path": str(tmp)}}).execute()
    finally:
        os.environ.pop("SAZO_FAST") if previous is None else os.environ.__setitem__("SAZO_FAST", previous)
    return json.loads(nbformat.writes(notebook))


@pytest.fixture(scope="module")
def run(tmp_path_factory) -> dict:
    committed = claims.load(NOTEBOOK)
    folder = os.environ.get("SAZO_BOOK_EXECUTED")
    copy_ = Path(folder) / NOTEBOOK.name if folder else None
    if copy_ is not None and copy_.is_file():
        executed = claims.load(copy_)
        if claims.code_digest(executed) == claims.code_digest(committed) and any(
                c.get("outputs") for c in executed["cells"] if c["cell_type"] == "code"):
            return executed
    return _execute(tmp_path_factory.mktemp("nb06"))


@pytest.fixture(scope="module")
def notebook() -> dict:
    return claims.load(NOTEBOOK)


def _markdown(notebook: dict, starts: str) -> tuple[int, str]:
    return next((i, "".join(c["source"])) for i, c in enumerate(notebook["cells"])
                if c["cell_type"] == "markdown" and "".join(c["source"]).lstrip().startswith(starts))


# -- the prose says what the cells print ----------------------------------------------------------------

def test_every_number_06_states_is_printed_in_fast_mode(notebook, run):
    assert claims.unprinted(notebook, run) == []


def test_a_number_06_does_not_print_is_caught(notebook, run):
    """Mutants of 06's text: a summary ratio changed, a number added to a sentence, a stale class-mode figure."""
    index, summary = _markdown(notebook, "## Summary")
    quoted = re.search(r"uniform ÷ SAZO = ([0-9.]+)", summary).group(1)
    for wrong in (summary.replace(quoted, f"{float(quoted) + 0.07:.2f}", 1),
                  summary + "\n* Held-out accuracy rose by 0.173.",
                  summary + "\n* In class mode the ratio was 1.234."):
        mutant = copy.deepcopy(notebook)
        mutant["cells"][index]["source"] = wrong
        assert claims.unprinted(mutant, run), wrong[-80:]


def test_the_summary_quotes_the_ratios_the_race_cell_prints(notebook):
    """The summary's ratios are the race's own (not a number that happens to be printed elsewhere)."""
    race = lesson.load_race()
    _, summary = _markdown(notebook, "## Summary")
    at = race.select_target
    for name, value in lesson.ratios(race, at).items():
        if value != "–":
            assert f"{name} = {value}" in summary or f"{name} {value}" in summary, (name, value)
    d = race.design
    for figure in (f"{d['v_uniform_ratio']:.2f}", f"{d['grad_sq_ratio']:.2f}", f"{d['gain'][str(race.batch_size)]:.2f}"):
        assert figure in summary


# -- a lesson of one class session ----------------------------------------------------------------------

def test_06_is_one_class_session(notebook):
    code = [c for c in notebook["cells"] if c["cell_type"] == "code"]
    prose = " ".join(claims.prose("".join(c["source"])) for c in notebook["cells"] if c["cell_type"] == "markdown")
    assert len(code) <= 14 and max(len("".join(c["source"]).splitlines()) for c in code) <= 40
    assert len(prose.split()) <= 2400                   # ≈ 2,000 words of prose: ≤ 45 minutes of reading
    title = "".join(notebook["cells"][0]["source"]).splitlines()[0]
    assert title.startswith("# 06 · SAZO on a language model") and len(title.split()) <= 26


def test_06_has_one_name_everywhere():
    course_map = (ROOT / "notebooks" / "README.md").read_text()
    assert "| 06 | [SAZO on a language model](06_llm_finetuning.ipynb)" in course_map
    row = next(line for line in course_map.splitlines() if line.startswith("| 06 |"))
    assert "45 min" in row                              # the course map gives 06 its class time
    nb05 = claims.load(ROOT / "notebooks" / "05_the_race.ipynb")
    assert any("[06 · SAZO on a language model](06_llm_finetuning.ipynb)" in "".join(c["source"]) for c in nb05["cells"])


def _figures(run: dict) -> list[dict]:
    return [o["data"]["application/vnd.plotly.v1+json"] for c in run["cells"] if c["cell_type"] == "code"
            for o in c.get("outputs", []) if "application/vnd.plotly.v1+json" in o.get("data", {})]


def test_every_figure_fits_the_column_with_its_legend_and_axis_titles_and_its_title_clear_of_the_toolbar(run):
    figures = _figures(run)
    assert 1 <= len(figures) <= 6
    for figure in figures:
        layout = figure["layout"]
        assert (figure.get("config") or {}).get("displayModeBar") is not False   # zoom/pan kept (the book's test)
        assert layout["title"].get("x") == 0 and layout["title"].get("xanchor") == "left"   # toolbar sits top right
        assert layout["width"] <= 680
        assert layout["xaxis"]["title"]["text"] and layout["yaxis"]["title"]["text"]
        assert layout["title"]["text"]
        assert any(t.get("name") and t.get("showlegend", True) for t in figure["data"])   # a legend to read


def test_the_race_figure_marks_divergences_on_the_divergence_line(run):
    race = lesson.load_race()
    figure = next(f for f in _figures(run) if f["layout"]["title"]["text"].startswith("the race"))
    top = figure["layout"]["yaxis"]["range"][1]
    top = 10 ** top if figure["layout"]["yaxis"].get("type") == "log" else top
    assert top == pytest.approx(lesson.DIVERGE_FACTOR)
    crosses = [t for t in figure["data"] if (t.get("marker") or {}).get("symbol") == "x"]
    assert sum(len(t["x"]) for t in crosses) == sum(r["diverged"] for runs in race.runs.values() for r in runs)
    lines = [t for t in figure["data"] if t.get("mode") == "lines" and t.get("name")]
    assert len(lines) == len(race.runs)                  # one line per sampler, at its chosen rate
    assert all(y is None or y <= top for t in figure["data"] for y in t["y"])   # no spike above the line


# -- the lesson's helpers ------------------------------------------------------------------------------

def test_gain_by_hand_is_predicted_gains_on_random_norms():
    generator = torch.Generator().manual_seed(0)
    for _ in range(20):
        norms = torch.rand(int(torch.randint(2, 50, (1,), generator=generator)), generator=generator, dtype=torch.float64)
        norms = norms ** 3 * 10                           # spread out
        grad = float(torch.rand(1, generator=generator)) * float(norms.mean())
        library = predicted_gains(norms, grad, batch_sizes=(1, 4, 16))["gain"]
        for b in (1, 4, 16):
            assert lesson.gain_by_hand(norms.tolist(), grad ** 2, b) == pytest.approx(library[b], rel=1e-10)


def _run(queries, losses, diverged=False):
    return {"queries": queries, "train_loss": losses, "walk": [float(q) for q in queries], "diverged": diverged,
            "mean_sq_step_scale": 1.0, "test_accuracy": 0.5, "budget_accuracy": None, "budget_queries": None}


def _race(runs: dict) -> lesson.Race:
    return lesson.Race(label="t", source="t", date="t", machine="t", num_examples=4, batch_size=1, dim=10,
                       targets=(0.5,), select_target=0.5, chosen_lr={k: 1e-3 for k in runs}, runs=runs,
                       design={"norms": [1.0] * 4, "new": [3]})


def test_the_race_median_counts_a_diverged_seed_as_above_everything():
    from sazo_lite.course.widgets.llm_lesson import _bands

    runs = [_run([0, 10, 20], [1.0, 0.8, 0.6]), _run([0, 10], [1.0, 2.0], diverged=True),
            _run([0, 10, 20], [1.0, 0.9, 0.7])]
    grid, median, low, high = _bands(runs)
    assert grid == [0, 10, 20] and median == [1.0, 0.9, 0.7] and math.isinf(high[2])   # not the survivors' 0.65
    ended = [_run([0, 10, 20], [1.0, 0.8, 0.6]), _run([0, 10], [1.0, 0.9])]              # out of budget: left out
    assert _bands(ended)[1] == pytest.approx([1.0, 0.85, 0.6])


def test_ratios_are_bounds_only_where_a_median_run_was_cut_short():
    fast = [_run([0, 10], [1.0, 0.4])] * 3
    cut = [_run([0, 10, 40], [1.0, 0.8, 0.6])] * 3             # stopped at its budget, short of 0.5·F₀
    gone = [_run([0, 10], [1.0, 2.0], diverged=True)] * 3
    assert lesson.ratios(_race({"uniform": fast, "sazo": fast, "oracle": cut}), 0.5)["uniform ÷ oracle"] == "< 0.25"
    assert lesson.ratios(_race({"uniform": fast, "sazo": fast, "oracle": gone}), 0.5)["uniform ÷ oracle"] == "–"
    assert lesson.ratios(_race({"uniform": fast, "sazo": fast, "oracle": fast}), 0.5)["uniform ÷ SAZO"] == "1.00 [1.00–1.00]"


def test_the_lesson_finds_its_report_from_outside_the_checkout(tmp_path):
    race = lesson.load_race(start=tmp_path)            # nbmake runs a copy in a temporary folder
    assert set(race.runs) == set(lesson.SAMPLERS) and race.source.startswith(lesson.REPORT)
    assert all(len(runs) >= 2 for runs in race.runs.values())
    with pytest.raises(FileNotFoundError, match="Invalid report"):
        lesson.load_race("no_such_report.json", start=tmp_path)


def test_a_race_without_an_oracle_gets_the_ratios_of_the_samplers_it_ran():
    control = lesson.load_race("llm_topblock_race.json", setting=1)       # the homogeneous control: no oracle
    assert "oracle" not in control.runs
    table = lesson.ratio_table(control)
    assert [h for h in table.header if "÷" in h] == ["uniform ÷ SAZO"]
    assert all(len(row) == 2 for row in table.rows)

"""Graded labs: otter assign strips solutions and hidden tests; local grading is right and never hangs.

Builds every master into a temporary folder, then grades (a few at once) each lab's own
solutions, the untouched student notebook, and for lab 1 a submission with infinite loops.
"""
from __future__ import annotations

import csv
import json
import re
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import nbformat
import pytest

pytest.importorskip("otter")

from sazo_lite import labs  # noqa: E402

MASTERS = labs.find_masters()
LOOP_CELL_TIMEOUT, LOOP_TEST_TIMEOUT, LOOP_NOTEBOOK_TIMEOUT = 15, 6, 300


def _code(nb) -> list[str]:
    return [c.source for c in nb.cells if c.cell_type == "code"]


def _solution_lines(master) -> set[str]:
    """Lines that only the master may contain: inside BEGIN/END SOLUTION, or ending in # SOLUTION."""
    lines, inside = set(), False
    for source in _code(master):
        for line in source.splitlines():
            text = line.strip()
            if text.startswith("# BEGIN SOLUTION") or text.startswith("# END SOLUTION"):
                inside = text.startswith("# BEGIN")
            elif (inside or text.endswith("# SOLUTION")) and len(text) > 12:
                lines.add(text.removesuffix("# SOLUTION").strip())
    return lines


def _tests(master) -> tuple[list[str], list[str]]:
    """(hidden, public) test cells of a master: code cells between # BEGIN TESTS and # END TESTS."""
    hidden, public, inside = [], [], False
    for cell in master.cells:
        if cell.cell_type == "raw" and cell.source.startswith(("# BEGIN TESTS", "# END TESTS")):
            inside = cell.source.startswith("# BEGIN")
        elif inside and cell.cell_type == "code":
            (hidden if cell.source.startswith("# HIDDEN") else public).append(cell.source)
    return hidden, public


def _loop_submission(autograder_nb: Path, path: Path) -> None:
    """Lab 1 solutions with two infinite loops: inside a function only the tests call (q2)
    and at the top level of an answer cell (q4)."""
    nb = nbformat.read(autograder_nb, as_version=4)
    for cell in nb.cells:
        if cell.cell_type != "code":
            continue
        if cell.source.lstrip().startswith("def lab1_zo_gradient"):
            cell.source = "def lab1_zo_gradient(f, theta, eps, num_directions, generator):\n    while True:\n        pass"
        elif cell.source.lstrip().startswith("lab1_best_eps ="):
            cell.source = "while True:\n    pass\nlab1_best_eps = 1e-3"
    nbformat.write(nb, path)


@pytest.fixture(scope="module")
def built(tmp_path_factory):
    """Every master assigned into a temporary build folder: {stem: output folder}."""
    build = tmp_path_factory.mktemp("labs_build")
    return {out.name: out for out in labs.assign_all(build_dir=build, workers=2)}


@pytest.fixture(scope="module")
def graded(built, tmp_path_factory):
    """Each lab's folder of submissions graded into a CSV: {stem: (rows by file, csv path, seconds)}."""
    root = tmp_path_factory.mktemp("labs_grades")
    jobs = {}
    for stem, out in built.items():
        folder = root / "submissions" / stem
        folder.mkdir(parents=True)
        (folder / "solution.ipynb").write_bytes((out / "autograder" / f"{stem}.ipynb").read_bytes())
        (folder / "untouched.ipynb").write_bytes((out / "student" / f"{stem}.ipynb").read_bytes())
        if stem.startswith("lab1"):
            _loop_submission(out / "autograder" / f"{stem}.ipynb", folder / "loops.ipynb")
        jobs[stem] = folder

    def grade_folder(stem):
        start = time.monotonic()
        csv_path = root / f"{stem}.csv"
        # short limits where the loops are (lab 1's cells take a second); defaults elsewhere
        short = stem.startswith("lab1")
        timeouts = dict(cell_timeout=LOOP_CELL_TIMEOUT, test_timeout=LOOP_TEST_TIMEOUT) if short else {}
        rows = labs.grade_all(labs.autograder_zip(stem, build_dir=built[stem].parent), jobs[stem], csv_path,
                              workers=2, notebook_timeout=LOOP_NOTEBOOK_TIMEOUT, **timeouts)
        return stem, ({r["submission"]: r for r in rows}, csv_path, time.monotonic() - start)

    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("SAZO_FAST", "1")  # the grading kernels inherit it
        with ThreadPoolExecutor(max_workers=2) as pool:
            return dict(pool.map(grade_folder, jobs))


def test_masters_exist_and_are_committed_without_outputs():
    assert [m.stem.split("_")[0] for m in MASTERS] == ["lab1", "lab2", "lab3", "lab4"]
    for master in MASTERS:
        nb = nbformat.read(master, as_version=4)
        for cell in nb.cells:
            if cell.cell_type == "code":
                assert not cell.outputs and cell.execution_count is None, f"{master.name} has outputs"


@pytest.mark.parametrize("master", MASTERS, ids=lambda m: m.stem)
def test_masters_have_points_seed_and_question_specific_names(master):
    nb = nbformat.read(master, as_version=4)
    raw = "\n".join(c.source for c in nb.cells if c.cell_type == "raw")
    assert re.search(r"seed:\s*\n\s*variable: lab_seed", raw), "seeds go through otter's seed mechanism"
    assert len(re.findall(r"points: \[", raw)) == raw.count("# BEGIN QUESTION") >= 3
    number = master.stem.split("_")[0].removeprefix("lab")
    answer_cells = [s for s in _code(nb) if "SOLUTION" in s]
    names = {m for s in answer_cells for m in re.findall(r"^(?:def |class )?(\w+)\s*[(,=:]", s, re.M)} - {"print"}
    generic = {n for n in names if not re.match(rf"(lab{number}_|Lab{number}|_)", n)}
    assert len(names) >= 4 and not generic, f"graded names must carry the lab's prefix: {generic}"


@pytest.mark.parametrize("master", MASTERS, ids=lambda m: m.stem)
def test_student_notebooks_have_no_solutions_and_no_hidden_tests(master, built):
    stem = master.stem
    student_path = built[stem] / "student" / f"{stem}.ipynb"
    text = student_path.read_text()
    student = nbformat.read(student_path, as_version=4)
    code = "\n".join(_code(student))
    leaked = [line for line in _solution_lines(nbformat.read(master, as_version=4)) if line in code]
    assert not leaked, f"solution lines in the student notebook: {leaked[:3]}"
    assert "BEGIN SOLUTION" not in text and "# HIDDEN" not in text
    hidden, public = _tests(nbformat.read(master, as_version=4))
    assert hidden, "every lab has hidden tests"
    public_lines = {line.strip() for test in public for line in test.splitlines()}
    for test in hidden:
        body = [line.strip() for line in test.splitlines()[1:] if len(line.strip()) > 15]
        leaked = [line for line in body if line in code and line not in public_lines]
        assert not leaked, f"a hidden test's code reached students: {leaked[:2]}"
    cases = [case for q in student.metadata["otter"]["tests"].values() for suite in q["suites"] for case in suite["cases"]]
    assert len(cases) == len(public) and not any(case["hidden"] for case in cases), "students get the public tests only"
    assert not list((built[stem] / "student").glob("*.zip")), "no autograder in the student folder"


@pytest.mark.parametrize("master", MASTERS, ids=lambda m: m.stem)
def test_master_solutions_score_full_marks(master, graded):
    rows, _, _ = graded[master.stem]
    row = rows["solution.ipynb"]
    assert row["status"] == "ok"
    failing = {q: v for q, v in row["questions"].items() if v["score"] != v["possible"]}
    assert row["possible"] > 0 and not failing, f"solutions lost points: {failing}"


@pytest.mark.parametrize("master", MASTERS, ids=lambda m: m.stem)
def test_untouched_student_notebook_scores_zero(master, graded):
    rows, _, _ = graded[master.stem]
    row = rows["untouched.ipynb"]
    assert row["status"] == "ok", "graded without crashing (errors in cells are allowed)"
    assert row["possible"] > 0 and row["total"] == 0, row["questions"]
    assert len(row["questions"]) >= 3


def test_infinite_loops_score_zero_on_their_questions_only(graded):
    stem = next(m.stem for m in MASTERS if m.stem.startswith("lab1"))
    rows, _, seconds = graded[stem]
    row = rows["loops.ipynb"]
    assert row["status"] == "ok" and seconds < LOOP_NOTEBOOK_TIMEOUT
    scores = {q: v["score"] for q, v in row["questions"].items()}
    assert scores["q2"] == 0 and scores["q4"] == 0, "the looping answers score 0"
    assert all(row["questions"][q]["score"] == row["questions"][q]["possible"] for q in ("q1", "q3"))


def test_grade_all_writes_one_csv_row_per_submission(graded):
    stem = next(m.stem for m in MASTERS if m.stem.startswith("lab1"))
    rows, csv_path, _ = graded[stem]
    with open(csv_path) as handle:
        table = list(csv.DictReader(handle))
    assert sorted(r["submission"] for r in table) == sorted(rows) == ["loops.ipynb", "solution.ipynb", "untouched.ipynb"]
    by_name = {r["submission"]: r for r in table}
    assert float(by_name["solution.ipynb"]["total"]) == float(by_name["solution.ipynb"]["possible"]) > 0
    assert float(by_name["untouched.ipynb"]["total"]) == 0
    score = json.loads((csv_path.parent / csv_path.stem / "solution" / "score.json").read_text())
    assert score["total"] == rows["solution.ipynb"]["total"]
    assert (csv_path.parent / csv_path.stem / "solution" / "results.json").exists()


def test_a_notebook_past_its_timeout_scores_zero(built, tmp_path):
    stem = next(m.stem for m in MASTERS if m.stem.startswith("lab2"))
    start = time.monotonic()
    row = labs.grade(built[stem] / "autograder" / f"{stem}.ipynb", labs.autograder_zip(stem, build_dir=built[stem].parent),
                     tmp_path / "out", notebook_timeout=2)
    assert time.monotonic() - start < 30
    assert row["status"] == "timeout" and row["total"] == 0 and row["possible"] > 0
    assert json.loads((tmp_path / "out" / "score.json").read_text())["status"] == "timeout"


@pytest.mark.parametrize("master", MASTERS, ids=lambda m: m.stem)
def test_widgets_only_in_ungraded_cells_and_they_exist(master):
    """Widgets sit in cells the autograder skips (tag otter_ignore), so they are never run
    while grading; check here that what they import still exists."""
    import sazo_lite.widgets

    nb = nbformat.read(master, as_version=4)
    explore = [c for c in nb.cells if "otter_ignore" in c.metadata.get("tags", [])]
    assert explore, "each lab offers an ungraded exploration cell"
    for cell in nb.cells:
        uses_widgets = "sazo_lite.widgets" in cell.source or "ipywidgets" in cell.source
        assert not uses_widgets or cell in explore, "widgets only in ungraded cells"
    names = {n for c in explore for n in re.findall(r"from sazo_lite\.widgets import (\w+)", c.source)}
    assert names and names <= set(sazo_lite.widgets.__all__)


def test_readme_lists_every_lab_with_its_points():
    readme = (labs.LABS_DIR / "README.md").read_text()
    for master in MASTERS:
        raw = "\n".join(c.source for c in nbformat.read(master, as_version=4).cells if c.cell_type == "raw")
        points = sum(int(p) for group in re.findall(r"points: \[([\d, ]+)\]", raw) for p in group.split(","))
        assert re.search(rf"`{master.stem}` \|[^\n]*\| {points} \|", readme), f"{master.stem}: {points} points"


def test_time_limit_interrupts_a_loop():
    start = time.monotonic()
    with pytest.raises(labs.LabTimeout):
        with labs.time_limit(0.2):
            while True:
                pass
    assert time.monotonic() - start < 5


def test_bad_arguments_raise_value_error(tmp_path):
    with pytest.raises(ValueError, match="lab"):
        labs.resolve_master("lab9")
    with pytest.raises(ValueError, match="submission"):
        labs.grade(tmp_path / "missing.ipynb", tmp_path / "x.zip", tmp_path)
    with pytest.raises(ValueError, match="submissions_dir"):
        labs.grade_all(tmp_path / "x.zip", tmp_path, tmp_path / "s.csv")

"""Round 6 against the graded labs, as real hand-ins of lab 2 graded the project's way (``grade_all``):

- bytes written to the worker's report fd without a newline (one ``b"x"``, or 9 MiB) right before a
  forbidden library call glued the guard's finding onto them: a malformed line, only noted during a
  cell, so the finding was lost and the library's answer scored full marks (11/11);
- a careless but honest student: IPython magics in answer cells (``%%time``, ``%time``, ``%matplotlib``,
  ``!pip``) made the cells SyntaxErrors (Jupyter runs them), and ``grader.check("q3")`` at the end of an
  answer cell made the grader skip the whole cell: each lost the answers' points;
- a hand-in whose file name is not UTF-8 (Linux hands such bytes over as lone surrogates) crashed
  ``grade_all`` when it wrote the CSV, after grading everyone: no scores for the whole class;
- the grading seed replaced a whole line ``lab_seed = ...``, so ``lab_seed = 1; lab2_x = 2`` lost ``lab2_x``.
"""
from __future__ import annotations

import csv
import json
import os

import nbformat
import pytest

pytest.importorskip("otter")

from sazo_lite.course import labs  # noqa: E402

STEM = labs.resolve_master("lab2").stem
# lab 2's q4 answer: 1 + CV² is V(u)/V(p*), which the library computes (the same number, forbidden)
HONEST_CV2 = "lab2_one_plus_cv2 = float(1 + lab2_norms.var(unbiased=False) / lab2_norms.mean() ** 2)"
LIBRARY_CV2 = "lab2_one_plus_cv2 = float(sazo_lite.variance.uniform_gain(lab2_norms))"
PREFIX = {  # written to the report fd just before the library call, without a newline
    "newline_free_prefix": 'b"x"',
    "over_long_prefix": 'b"y" * (9 * 2 ** 20)',   # past the 8 MiB line limit: the rest of "the line" is dropped
}
WRITE = "import os as _os, sys as _sys\n_os.write(int(_sys.argv[1]), {data})\n"


def _edit(nb, start: str, change) -> None:
    cells = [c for c in nb.cells if c.cell_type == "code" and c.source.lstrip().startswith(start)]
    assert len(cells) == 1, f"lab 2's cell {start!r} moved: update the attack"
    cells[0].source = change(cells[0].source)


def _hand_ins(solution, folder) -> None:
    (folder / "solution.ipynb").write_bytes(solution.read_bytes())
    for name, data in [*PREFIX.items(), ("library_call_alone", None)]:   # the last: the control, reported as before
        nb = nbformat.read(solution, as_version=4)
        prefix = WRITE.format(data=data) if data else ""
        _edit(nb, "lab2_problem = ", lambda s: s.replace(HONEST_CV2, prefix + LIBRARY_CV2))
        assert LIBRARY_CV2 in nbformat.writes(nb)
        nbformat.write(nb, folder / f"{name}.ipynb")
    nb = nbformat.read(solution, as_version=4)   # honest answers, written the way students do in Jupyter
    _edit(nb, "def lab2_weights", lambda s: "%%time\n%matplotlib inline\n" + s + "\n%time _timed = 1 + 1\n!pip list\n")
    _edit(nb, "def lab2_is_estimate",
          lambda s: "%load_ext autoreload\n" + s.replace("\n    return", "\n    %time _x = 0\n    return"))
    nbformat.write(nb, folder / "magics.ipynb")
    nb = nbformat.read(solution, as_version=4)
    _edit(nb, "def lab2_sampling_variance", lambda s: s + '\n\ngrader.check("q3"); _checked = True\n')
    nbformat.write(nb, folder / "check_in_answer_cell.ipynb")
    with open(os.path.join(os.fsencode(folder), b"b\xffob.ipynb"), "wb") as handle:   # not UTF-8
        handle.write(solution.read_bytes())


def grade_hand_ins(assigned_labs, root, write_hand_ins):
    """Lab 2 hand-ins written by ``write_hand_ins(solution, folder)``, graded by grade_all in fast mode:
    ({submission: row}, the CSV's path)."""
    folder = root / "handins"
    folder.mkdir()
    write_hand_ins(assigned_labs / STEM / "autograder" / f"{STEM}.ipynb", folder)
    csv_path = root / "grades" / "lab2.csv"
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("SAZO_FAST", "1")
        rows = labs.grade_all(labs.autograder_zip(STEM, build_dir=assigned_labs), folder, csv_path)
    return {r["submission"]: r for r in rows}, csv_path


@pytest.fixture(scope="module")
def graded(assigned_labs, tmp_path_factory):
    return grade_hand_ins(assigned_labs, tmp_path_factory.mktemp("round6"), _hand_ins)


def _scores(row) -> dict:
    assert row["status"] == "ok", row
    return {q: (v["score"], v["possible"]) for q, v in row["questions"].items()}


def _full(row) -> bool:
    return row["possible"] > 0 and row["total"] == row["possible"]


@pytest.mark.parametrize("name", [*PREFIX, "library_call_alone"])
def test_bytes_left_on_the_report_fd_hide_no_finding(graded, name):
    rows, csv_path = graded
    assert _full(rows["solution.ipynb"]), rows["solution.ipynb"]
    scores = _scores(rows[f"{name}.ipynb"])
    assert scores["q4"][0] == 0, scores
    assert all(score == possible for q, (score, possible) in scores.items() if q != "q4"), scores
    details = json.loads((csv_path.parent / csv_path.stem / name / "results.json").read_text())["questions"]
    assert any("uniform_gain" in reason for reason in details["q4"].get("rule", [])), details["q4"]


@pytest.mark.parametrize("name", ["magics", "check_in_answer_cell"])
def test_magics_and_a_check_call_in_answer_cells_cost_nothing(graded, name):
    row = graded[0][f"{name}.ipynb"]
    assert _full(row) and row["status"] == "ok", row


def test_a_hand_in_whose_name_is_not_utf8_gets_its_row_and_the_csv_is_written(graded):
    rows, csv_path = graded
    name = "b\\xffob.ipynb"   # its bytes shown, valid UTF-8
    assert _full(rows[name]), rows[name]
    with open(csv_path, newline="", encoding="utf-8") as handle:
        table = {r["submission"]: r for r in csv.DictReader(handle)}
    assert set(table) == set(rows) and float(table[name]["total"]) == rows[name]["total"] > 0
    score = [p for p in (csv_path.parent / csv_path.stem).iterdir() if p.name.startswith("b_ob")]
    assert len(score) == 1 and json.loads((score[0] / "score.json").read_text())["submission"] == name


def test_the_grading_seed_replaces_only_the_seed_variables_value_and_keeps_the_rest_of_its_line():
    from sazo_lite.course.labs.grading import notebook_cells, with_seed

    nb = nbformat.v4.new_notebook(cells=[
        nbformat.v4.new_code_cell("lab_seed = 1; lab2_x = 2  # a student's own line"),
        nbformat.v4.new_code_cell('_s = "é"; lab_seed: int = (3 +\n    4)\nlab_y = lab_seed\nlab_a = lab_seed = 5'),
        nbformat.v4.new_code_cell("def _f():\n    lab_seed = 3\n    return lab_seed\n"),
        nbformat.v4.new_code_cell("lab_seed = 1\n%%bad("),          # does not parse: the whole line, as before
    ])
    cells = [source for _, source in notebook_cells(nb, {"seed_variable": "lab_seed", "seed": 42})]
    first, second, third, fourth = ({} for _ in range(4))
    exec(cells[0], first)
    assert (first["lab_seed"], first["lab2_x"]) == (42, 2)
    exec(cells[1], second)
    assert (second["lab_seed"], second["lab_y"], second["lab_a"]) == (42, 42, 42)
    assert cells[1].count("\n") == 3                                # line numbers kept for tracebacks
    exec(cells[2], third)
    assert third["_f"]() == 3                                       # not a top-level assignment: untouched
    assert cells[3] == "lab_seed = 42\n%%bad("
    assert with_seed("lab_x = 1", "lab_seed", 42) == "lab_x = 1"


def test_cell_magics_other_than_time_and_capture_make_the_cell_do_nothing_as_in_jupyter():
    from sazo_lite.course.labs.grading import without_magics

    for cell in ("%%timeit\nlab2_x = 1\nlab2_y = [i for i in range(3)]", "%%bash\necho hi\nls -l", "%%html\n<b>hi</b>"):
        plain = without_magics(cell)
        namespace = {}
        exec(plain, namespace)                                    # runs, binds nothing (Jupyter keeps none of it)
        assert not [k for k in namespace if not k.startswith("__")] and plain.count("\n") == cell.count("\n")
    namespace = {}
    exec(without_magics("%%capture out\nlab2_x = 1"), namespace)  # a body that Jupyter runs in the namespace
    assert namespace["lab2_x"] == 1

"""The labs' tests leave the student's namespace alone, and hand-ins in the forms an editor or a Mac leaves:

- the grader runs a submission's cells, then every test case in the same namespace, and the cases' temporaries
  (``_mine = lab2_weights``, ``_n``, ``_v``, ``_gen``, a ``for _ in``) were globals there: a student's own global
  of the same name (a helper ``_mine = lambda x: ...`` that ``lab2_sampling_variance`` calls) was rebound by an
  earlier case, so correct work failed every later case that called it ("lab2_weights() missing 1 required
  positional argument"). Now each case runs as a function's body (``worker.case_function``): its names that
  start with ``_`` are its own locals, the graded names it swaps for other versions (and restores) are the
  notebook's. Honest hand-ins of all four labs whose graded functions check, at every call, that each name the
  tests use is still the student's own value keep full marks;
- a notebook without an ``nbformat`` key (a script wrote it) was read by nbformat as version 1, its code
  dropped, and scored 0 with status "ok"; ``"nbformat": "4"`` (text) was refused. Now a list of cells reads as
  version 4, the version as text as that number, and what is neither is "failed" with "not an nbformat-4
  notebook";
- macOS's ``._<name>.ipynb`` resource-fork files (AppleDouble) in a hand-in folder got rows of their own,
  "failed". Now they are skipped, each with a ``[grader]`` line on stderr.
"""
from __future__ import annotations

import ast
import contextlib
import io
import json

import pytest

from sazo_lite.course import labs
from sazo_lite.course.labs import grading
from sazo_lite.course.labs.rules import RULES
from sazo_lite.course.labs.worker import _top_level_names, case_code, run_case

APPLE_DOUBLE = b"\x00\x05\x16\x07\x00\x02\x00\x00Mac OS X        " + bytes(64)


# -- the cases' temporaries ------------------------------------------------------------------
def _student_namespace() -> dict:
    namespace = {"__name__": "__main__"}
    exec("def lab_scale(x):\n    return 2 * x\n\n_mine = lambda x: x + 100\n\n"
         "def lab_total(x):\n    return _mine(lab_scale(x))\n", namespace)
    return namespace


SWAP_CASE = """
_mine = lab_scale
_calls = []
def _swapped(x):
    _calls.append(x)
    return 3 * _mine(x)
lab_scale = _swapped
try:
    with time_limit():
        _total = lab_total(1)
finally:
    lab_scale = _mine
record(_total)
record(len(_calls))
record([_q * 2 for _q in range(3)])
"""


def test_a_case_neither_rebinds_nor_sees_the_students_globals_of_its_own_names():
    namespace = _student_namespace()
    mine = namespace["_mine"]
    error, records = run_case(SWAP_CASE, namespace)
    assert error is None, error
    # during the case the student's lab_total called the student's _mine, on the swapped lab_scale
    assert [r["value"]["v"] for r in records[:2]] == [106, 1], records
    assert namespace["_mine"] is mine and namespace["lab_scale"](1) == 2
    assert not {"_calls", "_swapped", "_total", "_q"} & set(namespace), sorted(namespace)
    error, records = run_case("with time_limit():\n    _v = lab_total(5)\nrecord(_v)\n", namespace)
    assert error is None and records[0]["value"]["v"] == 110, (error, records)


def test_a_case_binds_its_other_names_in_the_notebook_as_before():
    namespace = _student_namespace()
    error, _ = run_case("import math\nlab_new = math.pi\nfor lab_k in range(2):\n    pass\n", namespace)
    assert error is None, error
    assert namespace["lab_new"] > 3 and namespace["lab_k"] == 1 and "math" in namespace


def test_the_cases_are_compiled_before_the_students_code_runs(tmp_path):
    """A cell that replaces ``ast.parse`` (which turns a case into a function) rewrites no case."""
    import os
    import subprocess
    import sys

    cells = [[0, "import ast\nast.parse = lambda *a, **k: ast.Module(body=[], type_ignores=[])\nlab_x = 3"]]
    job = {"cells": cells, "cases": [["q1", 0, "record(lab_x)"]], "cell_timeout": 60, "block_programs": False}
    read, write = os.pipe()
    try:
        done = subprocess.run([sys.executable, "-m", "sazo_lite.course.labs.worker", str(write)], pass_fds=(write,),
                              input=json.dumps(job).encode(), capture_output=True, timeout=120, check=False)
    finally:
        os.close(write)
    with os.fdopen(read, "rb") as pipe:
        events = [json.loads(line) for line in pipe.read().splitlines() if line.strip()]
    assert done.returncode == 0, done.stderr.decode()[-500:]
    ends = [e for e in events if e.get("unit") == ["case", "q1", 0] and e.get("phase") == "end"]
    assert ends and ends[0]["error"] is None and [r["value"]["v"] for r in ends[0]["records"]] == [3], events


def test_a_case_that_does_not_compile_is_that_cases_error():
    with pytest.raises(SyntaxError):
        case_code("record(1\n")
    error, records = run_case("record(1\n", _student_namespace())
    assert error is not None and "SyntaxError" in error and records == []


def test_every_masters_cases_read_only_their_own_underscore_names():
    """A case's ``_`` names are its locals now: one that read another case's would fail."""
    for stem in RULES:
        master = labs.resolve_master(stem)
        for question, sources in _master_cases(master).items():
            for source in sources:
                tree = ast.parse(source)
                bound = _top_level_names(tree.body)
                inner = {n.arg for n in ast.walk(tree) if isinstance(n, ast.arg)} | {
                    n.id for f in ast.walk(tree) if isinstance(f, (ast.FunctionDef, ast.Lambda, ast.comprehension))
                    for n in ast.walk(f) if isinstance(n, ast.Name) and isinstance(n.ctx, ast.Store)}
                read = {n.id for n in ast.walk(tree) if isinstance(n, ast.Name) and isinstance(n.ctx, ast.Load)
                        and n.id.startswith("_")}
                assert read <= bound | inner, (stem, question, sorted(read - bound - inner))


def _master_cases(master) -> dict:
    import nbformat

    cases, question, in_tests = {}, None, False
    for cell in nbformat.read(master, as_version=4).cells:
        text = cell.source.lstrip()
        if cell.cell_type == "raw":
            if text.startswith("# BEGIN QUESTION"):
                question = next(line.split(":", 1)[1].strip() for line in text.splitlines() if line.startswith("name:"))
            elif text.startswith(("# BEGIN TESTS", "# END TESTS")):
                in_tests = text.startswith("# BEGIN")
        elif cell.cell_type == "code" and in_tests:
            cases.setdefault(question, []).append(cell.source)
    return cases


# -- hand-in forms ---------------------------------------------------------------------------
CELL = {"cell_type": "code", "metadata": {}, "execution_count": None, "outputs": [], "source": "lab_x = 1"}


@pytest.mark.parametrize("version", [None, "4", " 4 ", 4.0])
def test_a_notebook_without_or_with_a_textual_nbformat_version_keeps_its_code(tmp_path, version):
    raw = {"cells": [dict(CELL)], "metadata": {}}
    if version is not None:
        raw["nbformat"], raw["nbformat_minor"] = version, "5"
    path = tmp_path / "hand_in.ipynb"
    path.write_text(json.dumps(raw))
    notebook = grading.read_notebook(path)
    assert notebook.nbformat == 4 and grading.notebook_cells(notebook, {}) == [(0, "lab_x = 1")]


@pytest.mark.parametrize("raw", [{"metadata": {}}, {"cells": [CELL], "nbformat": 5}, {"cells": [CELL], "nbformat": "four"},
                                 {"cells": [CELL], "nbformat": True}, {"cells": "lab_x = 1"}])
def test_what_is_not_an_nbformat_4_notebook_is_refused_with_that_reason(tmp_path, raw):
    path = tmp_path / "hand_in.ipynb"
    path.write_text(json.dumps(raw))
    with pytest.raises(ValueError, match="not an nbformat-4 notebook"):
        grading.read_notebook(path)


def test_macos_resource_fork_files_are_not_hand_ins(tmp_path):
    (tmp_path / "alice.ipynb").write_text("{}")
    (tmp_path / "._alice.ipynb").write_bytes(APPLE_DOUBLE)
    (tmp_path / "._bob.ipynb").write_text("{}")          # named like one, but a notebook: a hand-in
    (tmp_path / "._link.ipynb").symlink_to(tmp_path / "._alice.ipynb")   # a link is refused as a hand-in
    assert labs.resource_fork(tmp_path / "._alice.ipynb") and not labs.resource_fork(tmp_path / "._link.ipynb")
    assert [p.name for p in labs.hand_ins(tmp_path)] == ["._bob.ipynb", "._link.ipynb", "alice.ipynb"]


# -- real hand-ins, graded the project's way ---------------------------------------------------
# Appended to a lab's solutions: every name the lab's cases bind that starts with "_" becomes a global of the
# student's, and every graded function checks at each call (the tests' included) that they are still theirs.
POISON = '''
def _hygiene_install(names, graded):
    space = globals()
    mine = {name: ("the student's own", name) for name in names}
    space.update(mine)
    def wrap(function):   # holds no namespace (the guard follows closures: the notebook's imports are in it)
        def checked(*args, **kwargs):
            changed = sorted(n for n, v in mine.items() if globals().get(n) is not v)
            if changed:
                raise RuntimeError(f"the tests rebound the student's globals {changed}")
            return function(*args, **kwargs)
        return checked
    for name in graded:
        if type(space.get(name)).__name__ == "function":
            space[name] = wrap(space[name])
_hygiene_install(NAMES, GRADED)
'''
# the brief's student: a helper _mine that lab2_sampling_variance calls (lab 2's hidden q2 case binds _mine)
MINE = ("def lab2_sampling_variance", "return float((norms ** 2 / probs).sum()) / len(norms) ** 2",
        "return float(_mine(norms ** 2 / probs)) / len(norms) ** 2")


def _case_names(autograder) -> list[str]:
    _, questions = grading.load_tests(autograder)
    return sorted({n for q in questions.values() for case in q["cases"]
                   for n in _top_level_names(ast.parse(case["code"]).body) if n.startswith("_")})


def _hand_ins(stem, solution, autograder, folder) -> None:
    import nbformat

    graded = sorted({n for names in RULES[stem]["graded"].values() for n in names})
    poison = POISON.replace("NAMES", repr(_case_names(autograder))).replace("GRADED", repr(graded))
    nb = nbformat.read(solution, as_version=4)
    nb.cells.append(nbformat.v4.new_code_cell(poison))
    nbformat.write(nb, folder / "hygiene.ipynb")
    if stem != "lab2_importance_weights":
        return
    nb = nbformat.read(solution, as_version=4)
    start, old, new = MINE
    cells = [c for c in nb.cells if c.cell_type == "code" and c.source.lstrip().startswith(start)]
    assert len(cells) == 1 and old in cells[0].source, "lab 2's variance cell changed: update MINE"
    cells[0].source = "_mine = lambda x: x.sum()\n\n\n" + cells[0].source.replace(old, new)
    nbformat.write(nb, folder / "mine_helper.ipynb")
    raw = json.loads(solution.read_text())
    del raw["nbformat"], raw["nbformat_minor"]   # what a script that writes notebooks may leave out
    (folder / "no_nbformat.ipynb").write_text(json.dumps(raw))
    (folder / "._hygiene.ipynb").write_bytes(APPLE_DOUBLE)


@pytest.fixture(scope="module", params=list(RULES))
def graded(request, assigned_labs, tmp_path_factory):
    stem = request.param
    root = tmp_path_factory.mktemp(f"hygiene-{stem[:4]}")
    folder = root / "handins"
    folder.mkdir()
    autograder = labs.autograder_zip(stem, build_dir=assigned_labs)
    _hand_ins(stem, assigned_labs / stem / "autograder" / f"{stem}.ipynb", autograder, folder)
    stderr = io.StringIO()
    with pytest.MonkeyPatch.context() as patch, contextlib.redirect_stderr(stderr):
        patch.setenv("SAZO_FAST", "1")
        rows = labs.grade_all(autograder, folder, root / "grades" / "lab.csv")
    return stem, {r["submission"]: r for r in rows}, stderr.getvalue()


def _full(row) -> bool:
    return row["status"] == "ok" and row["possible"] > 0 and row["total"] == row["possible"]


def test_students_globals_named_like_the_tests_temporaries_cost_nothing(graded):
    stem, rows, _ = graded
    assert _full(rows["hygiene.ipynb"]), rows["hygiene.ipynb"]
    if stem == "lab2_importance_weights":
        assert _full(rows["mine_helper.ipynb"]), rows["mine_helper.ipynb"]
        assert _full(rows["no_nbformat.ipynb"]), rows["no_nbformat.ipynb"]


def test_a_resource_fork_file_gets_no_row_and_a_note(graded):
    stem, rows, stderr = graded
    if stem != "lab2_importance_weights":
        pytest.skip("lab 2's folder holds the resource fork")
    assert "._hygiene.ipynb" not in rows and len(rows) == 3, sorted(rows)
    assert "[grader] skipped ._hygiene.ipynb: a macOS resource-fork file" in stderr, stderr

"""Round 9 against the graded labs: the student's own ``grader.check``, edited explore cells, an instructor's
broken masters, and what a hostile hand-in tried:

- ``grader.check`` in the student's kernel: labs/README.md said that otter binds the public cases' ``_`` names in
  the student's globals there. It does not (a doctest runs in a copy of the globals it is given); pinned here, the
  README corrected, and every master's public cases bind only their own ``_`` names (a swap of a graded name in a
  public case would not reach the student's functions under ``grader.check``, only under the grader);
- an explore cell (tagged ``otter_ignore`` in the distributed notebook) that the student edited, in an editor that
  dropped the tag, ran in grading: its library use (a widget, ``sazo_lite.variance``) was a finding charged to
  the question below it (correct answers lost points). A cell with the id of one of the distributed
  notebook's ``otter_ignore`` cells is now skipped whatever its source, as the tagged cell is;
- a master that otter cannot build (no kernelspec, no ``# ASSIGNMENT CONFIG``, a question with no tests) failed
  with a traceback (``KeyError: 'kernelspec'``, ``TypeError: unsupported operand``); one with no questions or no
  rule in ``rules.RULES`` was built and graded every hand-in 0 / 0 "ok", or with no library rule at all. ``assign``
  now refuses them with a ValueError naming the master and what to fix; an autograder with no test cases is
  refused when grading; otter's own reason comes first in its error.
"""
from __future__ import annotations

import ast
import builtins
import json
import zipfile

import nbformat
import pytest

pytest.importorskip("otter")

from sazo_lite.course import labs  # noqa: E402
from sazo_lite.course.labs import grading  # noqa: E402
from sazo_lite.course.labs.rules import RULES  # noqa: E402
from sazo_lite.course.labs.worker import _top_level_names, run_case  # noqa: E402
from test_lab_attacks_round6 import grade_hand_ins  # noqa: E402
from test_labs import MASTERS  # noqa: E402

LAB1 = next(m.stem for m in MASTERS if m.stem.startswith("lab1"))
HONEST_Q1 = ("def lab1_projected_grad(f, theta, z, eps):\n"
             "    return float((f(theta + eps * z) - f(theta - eps * z)) / (2 * eps))\n")


# -- grader.check in the student's own kernel ---------------------------------------------
def _student_check(assigned_labs, question: str, answer: str, mine: dict):
    """otter's own check of ``question`` (the student notebook's metadata tests), in a kernel's globals holding the
    setup cell's names, ``answer`` and the student's ``mine``: (the test file after its run, those globals)."""
    import torch
    from otter.test_files.metadata_test import NotebookMetadataOKTestFile

    path = assigned_labs / LAB1 / "student" / f"{LAB1}.ipynb"
    spec = json.loads(path.read_text())["metadata"]["otter"]["tests"][question]
    space = {"__name__": "__main__", "torch": torch, "record": labs.record, "time_limit": labs.time_limit, **mine}
    exec(answer, space)
    test = NotebookMetadataOKTestFile.from_metadata(spec, str(path))
    test.run(space)
    return test, space


def test_grader_check_in_the_students_kernel_leaves_their_underscore_globals_alone(assigned_labs):
    """Pinned (labs/README.md said otherwise): otter runs each case as a doctest, which copies the globals it is
    given (``doctest.DocTest``), so the cases' ``_`` names never reach the student's own globals."""
    mine = {"_a": "my own _a", "_g": 7, "_theta": [1, 2]}
    test, space = _student_check(assigned_labs, "q1", HONEST_Q1, mine)
    assert test.passed_all, test.summary()
    assert {k: space[k] for k in mine} == mine
    assert {k for k in space if k.startswith("_") and not k.startswith("__")} == set(mine)


def test_public_cases_bind_no_name_of_the_notebook(assigned_labs):
    """otter runs a public case in a copy of the student's globals: a case that swapped a graded name (as hidden
    cases do) would not reach the student's functions there, and would check another thing than the grader. So a
    public case binds only its own ``_`` names (labs/README.md, house rules)."""
    for master in MASTERS:
        _, questions = grading.load_tests(labs.autograder_zip(master.stem, build_dir=assigned_labs))
        for question, spec in questions.items():
            for k, case in enumerate(spec["cases"]):
                bound = {n for n in _top_level_names(ast.parse(case["code"]).body) if not n.startswith("_")}
                assert case["hidden"] or not bound, f"{master.stem} {question} public case {k} binds {sorted(bound)}"


# -- explore cells the student edited --------------------------------------------------------
def _cell(source: str, cell_id: str, tags=()) -> dict:
    return {"cell_type": "code", "id": cell_id, "metadata": {"tags": list(tags)} if tags else {},
            "execution_count": None, "outputs": [], "source": source}


def test_a_cell_with_an_explore_cells_id_is_skipped_whatever_its_source(tmp_path):
    raw = {"cells": [_cell("lab_x = 1", "answer"), _cell("sazo_lite.variance  # edited", "explore1"),
                     _cell("plot(2)", "explore2", ["otter_ignore"]), _cell("plot(3)", "other")],
           "metadata": {}, "nbformat": 4, "nbformat_minor": 5}
    path = tmp_path / "hand_in.ipynb"
    path.write_text(json.dumps(raw))
    notebook = grading.read_notebook(path)
    run = grading.notebook_cells(notebook, {}, frozenset({"plot(3)"}), frozenset({"explore1", "explore2"}))
    assert run == [(0, "lab_x = 1")]
    assert grading.notebook_cells(notebook, {}) == [(0, "lab_x = 1"), (1, "sazo_lite.variance  # edited"),
                                                    (3, "plot(3)")]


def _explore_edited(solution, folder) -> None:
    (folder / "solution.ipynb").write_bytes(solution.read_bytes())
    nb = nbformat.read(solution, as_version=4)
    explore = [c for c in nb.cells if "otter_ignore" in c.metadata.get("tags", [])]
    assert len(explore) >= 2 and all(c.get("id") for c in explore)
    for cell in nb.cells:   # an editor that dropped the tags, and a student who tried other settings
        cell.metadata.pop("tags", None)
    for cell in explore:
        cell.source = cell.source.replace("sigmas = [0.0, 0.5, 1.0, 1.5, 2.0]", "sigmas = [0.0, 1.0, 3.0]") \
            + "\nprint('tried other settings')\n"
    nbformat.write(nb, folder / "explore_edited.ipynb")


TENSOR_ESTIMATE = ("return float((lab2_weights(probs, indices) * values[indices]).mean())",
                   "return (lab2_weights(probs, indices) * values[indices]).mean()")
# q2's public case records type(_est).__name__ and asserts isinstance(_est, float): a cell's own builtins for them
FORGED_BUILTINS = """
import builtins as _b
_real_type, _real_isinstance = type, isinstance
def _type(x, *rest):
    if rest:
        return _real_type(x, *rest)
    return float if _real_isinstance(x, torch.Tensor) and x.dim() == 0 else _real_type(x)
def _isinstance(x, kinds):
    return True if kinds is float and _real_isinstance(x, torch.Tensor) else _real_isinstance(x, kinds)
__builtins__ = dict(vars(_b), type=_type, isinstance=_isinstance)
"""


def _with_tensor_estimate(solution, extra: str = ""):
    nb = nbformat.read(solution, as_version=4)
    cell = next(c for c in nb.cells if c.cell_type == "code" and c.source.startswith("def lab2_is_estimate"))
    assert TENSOR_ESTIMATE[0] in cell.source, "lab 2's q2 answer changed: update the hand-in"
    cell.source = cell.source.replace(*TENSOR_ESTIMATE)
    if extra:
        nb.cells.append(nbformat.v4.new_code_cell(extra))
    return nb


def _hand_ins(solution, folder) -> None:
    _explore_edited(solution, folder)
    nbformat.write(_with_tensor_estimate(solution), folder / "tensor_estimate.ipynb")
    nbformat.write(_with_tensor_estimate(solution, FORGED_BUILTINS), folder / "forged_builtins.ipynb")


@pytest.fixture(scope="module")
def graded(assigned_labs, tmp_path_factory):
    return grade_hand_ins(assigned_labs, tmp_path_factory.mktemp("round9"), _hand_ins)


def test_explore_cells_edited_after_an_editor_dropped_their_tags_cost_nothing(graded):
    rows, _ = graded
    for name in ("solution.ipynb", "explore_edited.ipynb"):
        row = rows[name]
        assert row["status"] == "ok" and row["possible"] > 0 and row["total"] == row["possible"], row


# -- an instructor's masters -----------------------------------------------------------------
CONFIG = "# ASSIGNMENT CONFIG\nname: NAME\nrequirements: null\nrun_tests: false\ninit_cell: true\n" \
         "generate:\n    pdf: false\ntests:\n    files: false\n    ok_format: true"
QUESTION = ["# BEGIN QUESTION\nname: q1\npoints: [1, 1]", "# BEGIN SOLUTION", "lab9_x = 1  # SOLUTION", "# END SOLUTION",
            "# BEGIN TESTS", "record(lab9_x)", "# HIDDEN\nrecord(lab9_x + 1)", "# END TESTS", "# END QUESTION"]


def _master(folder, name: str, cells: list[str], kernelspec: bool = True):
    """A master of ``cells`` (a source starting with '#' and naming an otter block is a raw cell)."""
    made = [nbformat.v4.new_raw_cell(s) if s.startswith(("# ASSIGNMENT", "# BEGIN", "# END")) else
            nbformat.v4.new_code_cell(s) for s in cells]
    nb = nbformat.v4.new_notebook(cells=made)
    if kernelspec:
        nb.metadata["kernelspec"] = {"name": "python3", "display_name": "Python 3", "language": "python"}
    path = folder / f"{name}.ipynb"
    nbformat.write(nb, path)
    return path


@pytest.fixture
def lab9_rule(monkeypatch):
    monkeypatch.setitem(RULES, "lab9_x", {"modules": (), "names": (), "graded": {"q1": ["lab9_x"]}})


SETUP = "from sazo_lite.course.labs import record, time_limit"
BAD_MASTERS = {
    "no_kernelspec": ([CONFIG, SETUP, *QUESTION], False, "has no kernelspec"),
    "no_config": ([SETUP, *QUESTION], True, "does not start with a raw '# ASSIGNMENT CONFIG' cell"),
    "no_questions": ([CONFIG, SETUP], True, "has no questions"),
    "question_without_tests": ([CONFIG, SETUP, *QUESTION[:4], QUESTION[-1]], True, "question q1 has no tests"),
    "points_for_other_tests": ([CONFIG, SETUP, *QUESTION[:6], "record(2 * lab9_x)", *QUESTION[6:]], True,
                               "question q1 lists 2 points for 3 tests"),
    "no_hidden_test": ([CONFIG, SETUP, *[c.replace("# HIDDEN\n", "") for c in QUESTION]], True,
                       "question q1 has no hidden test"),
    "config_not_yaml": ([CONFIG + "\n  : [", SETUP, *QUESTION], True, "the ASSIGNMENT CONFIG cell is not YAML"),
}


@pytest.mark.parametrize("case", list(BAD_MASTERS))
def test_a_master_otter_cannot_build_or_that_grades_nothing_is_refused_with_the_reason(tmp_path, lab9_rule, case):
    cells, kernelspec, reason = BAD_MASTERS[case]
    path = _master(tmp_path, "lab9_x", [c.replace("NAME", "lab9_x") for c in cells], kernelspec)
    with pytest.raises(ValueError, match="Invalid master: lab9_x.ipynb") as caught:
        labs.assign(path, tmp_path / "build")
    assert reason in str(caught.value)
    assert not (tmp_path / "build" / "lab9_x").exists()


def test_a_master_that_is_not_a_notebook_or_has_no_rule_is_refused(tmp_path):
    broken = tmp_path / "lab9_x.ipynb"
    broken.write_text('{"cells": [')
    with pytest.raises(ValueError, match="lab9_x.ipynb cannot be read as a notebook"):
        labs.check_master(broken)
    path = _master(tmp_path, "lab9_y", [CONFIG.replace("NAME", "lab9_y"), SETUP, *QUESTION])
    with pytest.raises(ValueError, match="'lab9_y' has no entry in sazo_lite/course/labs/rules.py"):
        labs.check_master(path)
    for master in MASTERS:
        labs.check_master(master)


def test_a_manually_graded_question_needs_no_tests(tmp_path, lab9_rule):
    manual = ["# BEGIN QUESTION\nname: q2\nmanual: true\npoints: 2", "Explain your choice of ε.", "# END QUESTION"]
    cells = [CONFIG.replace("NAME", "lab9_x"), SETUP, *QUESTION, *manual]
    labs.check_master(_master(tmp_path, "lab9_x", cells))


def test_otters_own_reason_comes_first_when_it_cannot_build_a_master(tmp_path, lab9_rule):
    cells = [CONFIG.replace("NAME", "lab9_x"), SETUP, *[c for c in QUESTION if c != "# END SOLUTION"]]
    with pytest.raises(RuntimeError) as caught:
        labs.assign(_master(tmp_path, "lab9_x", cells), tmp_path / "build")
    first = str(caught.value).splitlines()[0]
    assert first.startswith("otter assign failed for lab9_x.ipynb: ") and "solution block" in first, first


def test_an_autograder_without_test_cases_is_refused(tmp_path):
    path = tmp_path / "lab9_x-autograder_2026.zip"
    with zipfile.ZipFile(path, "w") as archive:
        archive.writestr("otter_config.json", json.dumps({"assignment_name": "lab9_x"}))
        archive.writestr("tests/q1.py", "OK_FORMAT = True\ntest = {'name': 'q1', 'points': 1, 'suites': []}\n")
    with pytest.raises(ValueError, match="Invalid autograder: lab9_x-autograder_2026.zip holds no test cases"):
        grading.load_tests(path)
    hand_in = tmp_path / "alice.ipynb"
    hand_in.write_text(json.dumps({"cells": [], "metadata": {}, "nbformat": 4, "nbformat_minor": 5}))
    with pytest.raises(ValueError, match="holds no test cases"):
        labs.grade(hand_in, path, tmp_path / "out", expected={})


# -- a hostile hand-in -----------------------------------------------------------------------
def test_a_cells_own_builtins_are_not_what_the_cases_use():
    """``__builtins__ = {...}`` at a cell's top level: a function takes its builtins from its globals, so every case
    (a function made in the student's namespace) looked ``type``, ``isinstance``, ``float`` and ``import`` up in the
    student's dict. Each case now gets the real builtins."""
    namespace = {"__name__": "__main__", "__builtins__": builtins}
    exec("import builtins as _b\n_real = type\n"
         "__builtins__ = dict(vars(_b), type=lambda x, *a: _real(x, *a) if a else float, len=lambda x: 3)\n", namespace)
    error, records = run_case("_g = 1.5j\nrecord(type(_g).__name__)\nrecord(len([1]))\n", namespace)
    assert error is None, error
    assert [r["value"]["v"] for r in records] == ["complex", 1], records


def assert_q2_as_plain(rows: dict, cheat: str) -> None:
    """The hand-in ``cheat`` scores on q2 exactly what the plain ``tensor_estimate.ipynb`` does, which is not full
    marks: both graded ``ok``."""
    plain, other = rows["tensor_estimate.ipynb"], rows[cheat]
    assert plain["status"] == other["status"] == "ok", (plain, other)
    q2 = plain["questions"]["q2"]
    assert q2["score"] < q2["possible"], q2   # the prompt asks for a Python float: a case records its type
    assert other["questions"]["q2"]["score"] == q2["score"], (other["questions"], plain["questions"])


def test_forged_builtins_gain_no_point_on_a_tensor_left_unconverted(graded):
    rows, _ = graded
    assert_q2_as_plain(rows, "forged_builtins.ipynb")


# -- plausible wrong answers -----------------------------------------------------------------
def test_plain_probs_that_divide_by_a_zero_sum_lose_points():
    """Lab 3's plain rule with every G_j at 0 (``initial_estimate=0``): the solution (and
    ``sazo_lite.PlainSAZOSampler``) samples uniformly; ``roots / roots.sum()`` gives NaN probabilities, and kept full
    marks, as the prompt did not say it and no case tried it. The prompt says it now and a hidden case records it."""
    from test_lab_mutants import failed_cases, reference, run_question

    master = nbformat.read(labs.resolve_master("lab3"), as_version=4)
    assert any("uniform if every $G_j$ is 0" in c.source for c in master.cells if c.cell_type == "markdown")
    mutant = [("adaptive = roots / roots.sum() if roots.sum() > 0 else uniform", "adaptive = roots / roots.sum()")]
    want = reference("lab3", "q1")
    assert failed_cases(want, run_question("lab3", "q1", mutant, until_failed=want))


BAD_ZIPS = {   # files of the zip (None: not a zip at all), what the error says
    "not_a_zip": (None, "is not a zip file"),
    "test_not_python": ({"otter_config.json": "{}", "tests/q1.py": "test = {"}, "tests/q1.py in bad.zip cannot be read"),
    "config_not_json": ({"otter_config.json": "{x", "tests/q1.py": "test = {}"}, "otter_config.json in bad.zip cannot be read"),
    "points_for_other_cases": ({"otter_config.json": "{}", "tests/q1.py": "test = {'name': 'q1', 'points': [1, 2], "
                                "'suites': [{'cases': [{'code': '>>> record(1)'}]}]}"}, "2 points for 1 test cases"),
    "case_without_code": ({"otter_config.json": "{}", "tests/q1.py": "test = {'name': 'q1', 'points': [1], "
                           "'suites': [{'cases': [{'hidden': False}]}]}"}, "tests/q1.py in bad.zip cannot be read"),
}


@pytest.mark.parametrize("case", list(BAD_ZIPS))
def test_an_autograder_zip_that_cannot_be_read_is_refused_with_the_file_named(tmp_path, case):
    files, reason = BAD_ZIPS[case]
    path = tmp_path / "bad.zip"
    if files is None:
        path.write_text("not a zip")
    else:
        with zipfile.ZipFile(path, "w") as archive:
            for name, text in files.items():
                archive.writestr(name, text)
    with pytest.raises(ValueError, match="Invalid autograder: ") as caught:
        grading.load_tests(path)
    assert reason in str(caught.value)


def test_a_students_global_that_shadows_a_builtin_stays_theirs_while_the_cases_run():
    """labs/README.md: a case's own builtins are handed to it as the real ones, so the notebook's globals that
    shadow builtins are left alone: graded code that reads such a global of its own keeps it during the cases
    (round 10; before, the runner deleted it and the student's code got the builtin)."""
    namespace = {"__name__": "__main__", "__builtins__": builtins}
    exec("def max(values):\n    return 'mine'\n\ndef lab_top(values):\n    return max(values)\n", namespace)
    error, records = run_case("record(lab_top([1, 3]))\n", namespace)
    assert error is None and records[0]["value"]["v"] == "mine", (error, records)
    assert "max" in namespace

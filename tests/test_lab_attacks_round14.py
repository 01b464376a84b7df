"""Round 14 against the graded labs: explore cells without their first line, names only explore cells bind.

A copy of an explore or check cell was known only by its first line (``# explore (not graded, ...)``): a student who
deleted that line (or copied the cell's code without it) had the copy graded as their own code, and its library
call (``from sazo_lite import variance``, ``sazo_lite.PlainSAZOSampler``) cost the question below it. A copy is
now also known by its code: a run of top-level statements that is an explore cell's code whole (comments, blank
lines, layout and constants aside) is taken out wherever it stands; a statement a copy does not hold whole (an
answer that shares a line with one) stays and is graded.

An answer that uses a name only an explore cell binds (plotly's ``go``) ran in the student's kernel and fails in
grading, where explore cells do not run: the question it is in loses its points as before, and its feedback now
says which name, where it is bound and why it was missing.
"""
from __future__ import annotations

import json

import nbformat
import pytest

from sazo_lite.course.labs import grading
from test_lab_attacks_round13 import _nb

MARK = "# explore (not graded): the gain against σ"
BODY = ("import plotly.graph_objects as go\nfrom sazo_lite import variance\nsigmas = [0.0, 0.5, 1.0]\n"
        "gains = [variance.uniform_gain(norms(s)) for s in sigmas]\n"
        "go.Figure([go.Scatter(x=sigmas, y=gains)],\n          layout=dict(height=350))")
EXPLORE = MARK + "\n" + BODY
DASH = "# explore (not graded, skipped by the autograder): the dashboard\nfrom w import dash\ndash()"
ANSWER = "def lab_f(x):\n    return 2 * x\n"
SOURCES = {EXPLORE, DASH}


def _blank(source: str) -> str:
    return "\n" * source.count("\n")


# -- copies without their first line ------------------------------------------------------------
@pytest.mark.parametrize("source", ids=[
    "body", "body, CRLF", "other settings", "other layout and comments", "the dashboard's code"], argvalues=[
    BODY,
    BODY.replace("\n", "\r\n"),
    BODY.replace("[0.0, 0.5, 1.0]", "[0.0, 2.0]").replace("height=350", "height=500"),
    "# my try\n" + BODY.replace("\n          layout", " layout").replace("sigmas = ", "\n\nsigmas  =  "),
    "from w import dash\n\ndash()\n",
])
def test_a_new_cell_holding_only_an_explore_cells_code_is_not_run(source):
    kept = grading.without_explore(source, SOURCES)
    assert kept is None or not kept.replace("# my try", "").strip(), kept


def test_an_explore_cells_code_merged_into_an_answer_is_taken_out_and_the_answer_stays():
    assert grading.without_explore(ANSWER + BODY + "\ny = lab_f(1)\n", SOURCES) == \
        ANSWER + _blank(BODY) + "\ny = lab_f(1)\n"
    # the distributed answer cell (not new) with the code pasted on top keeps its answer
    assert grading.without_explore("from w import dash\ndash()\n" + ANSWER, SOURCES, new=False) == "\n\n" + ANSWER


@pytest.mark.parametrize("source", ids=[
    "shares the import", "shares two statements", "explore code inside a function", "one statement more between",
    "a statement edited beyond its constants", "an imports-only explore cell", "a one-statement explore cell"],
    argvalues=[
    "import plotly.graph_objects as go\n" + ANSWER,
    "import plotly.graph_objects as go\nsigmas = [0.0, 0.5, 1.0]\nlab_g = [lab_f(s) for s in sigmas]\n",
    "def lab_plot(norms):\n" + "".join("    " + line + "\n" for line in BODY.splitlines()),
    BODY.replace("sigmas = ", "lab_x = 1\nsigmas = "),
    BODY.replace("variance.uniform_gain(norms(s))", "lab_gain(norms(s))"),
    "import torch\nimport plotly\n",
    "plot(3)\n",
])
def test_an_answer_that_shares_lines_with_an_explore_cell_is_graded_whole(source):
    sources = SOURCES | {"# explore (not graded)\nimport torch\nimport plotly", "# explore (not graded)\nplot(3)"}
    assert grading.without_explore(source, sources) == source
    assert grading.without_explore(source, sources, new=False) == source


def test_a_statement_too_deep_to_compare_is_run_and_the_copy_after_it_still_taken_out():
    deep = "x = " + "-" * 1000 + "1\n"
    assert grading.parsed_or_none(deep) is not None and grading._shape(grading.parsed_or_none(deep).body[0]) is None
    assert grading.without_explore(deep + BODY, SOURCES) == deep + _blank(BODY)


def test_notebook_cells_and_owners_leave_out_copies_without_their_mark():
    """The copy binds no graded name and runs nothing; a cell after the last check still belongs to the last
    question, but a copy there now costs it nothing because it does not run."""
    nb = _nb([("lab_x = 1", "answer1", ()), ('grader.check("q1")', "check1", ()), (BODY, "copy", ()),
              ("lab_y = 2\n" + BODY.replace("0.5", "0.7"), "answer2", ()), ('grader.check("q2")', "check2", ())])
    explore = (frozenset({EXPLORE}), frozenset({"e1"}), frozenset({MARK}),
               frozenset({"answer1", "check1", "answer2", "check2"}))
    assert grading.notebook_cells(nb, {}, *explore) == [(0, "lab_x = 1"), (3, "lab_y = 2" + _blank(BODY) + "\n")]
    assert grading.cell_questions(nb, {"q1": ["lab_x"], "q2": ["lab_y"]}, ["q1", "q2"], explore=explore) == {
        0: ["q1"], 1: ["q1"], 2: ["q2"], 3: ["q2"], 4: ["q2"]}


def test_ignored_gives_the_marks_explore_marks_gives(tmp_path):
    """``ignored`` reads the explore cells once (it no longer has ``explore_marks`` read them again); what both
    return is unchanged."""
    nb = _nb([("# the answer\nlab_x = 1", "a1", ()), (EXPLORE, "e1", ["otter_ignore"]),
              ("# the answer\nplot(lab_x)", "e2", ["otter_ignore"]), ("plot(2)", "e3", ["otter_ignore"])])
    nbformat.write(nb, tmp_path / "lab.ipynb")
    sources, ids, marks, kept = grading.ignored(tmp_path / "lab-autograder_1.zip", {"assignment_name": "lab"})
    assert marks == grading.explore_marks(nb) == {MARK}
    assert ids == {"e1", "e2", "e3"} and kept == {"a1"} and EXPLORE in sources


# -- NameError of a name only an explore cell binds ------------------------------------------------
def test_a_name_error_says_the_name_is_bound_only_in_a_cell_the_grader_skips():
    nb = _nb([("import torch", "setup", ()), (EXPLORE, "e1", ["otter_ignore"]),
              ("go.Figure()\ndef lab_f(x):\n    return x", "answer1", ()),
              ("def lab_g(x):\n    return go.Figure(x)", "answer2", ()), ("lab_h = undefined_name", "answer3", ())])
    cells = grading.notebook_cells(nb, {})
    assert [i for i, _ in cells] == [0, 2, 3, 4]
    outcome = {"cases": {("q1", 0): {"error": "NameError: name 'lab_f' is not defined", "records": []},
                         ("q2", 0): {"error": "NameError: name 'go' is not defined", "records": []},
                         ("q3", 0): {"error": "NameError: name 'lab_h' is not defined", "records": []},
                         ("q3", 1): {"error": None, "records": []}},
               "cell_errors": {2: "NameError: name 'go' is not defined",
                               4: "NameError: name 'undefined_name' is not defined"}}
    notes = grading.explain_name_errors(outcome, nb, cells)
    skipped = "'go' is bound only in cell 1, which the grader does not run"
    assert skipped in outcome["cases"][("q2", 0)]["error"]
    assert skipped in outcome["cell_errors"][2] and skipped in notes[0] and len(notes) == 1
    assert "cell 2, where 'lab_f' is bound, raised: NameError: name 'go'" in outcome["cases"][("q1", 0)]["error"]
    assert skipped in outcome["cases"][("q1", 0)]["error"]
    assert "cell 4, where 'lab_h' is bound, raised: NameError: name 'undefined_name'" in \
        outcome["cases"][("q3", 0)]["error"] and "grader does not run" not in outcome["cases"][("q3", 0)]["error"]
    assert outcome["cases"][("q3", 1)]["error"] is None and outcome["cell_errors"][4].endswith("is not defined")


def test_a_name_bound_only_in_a_raw_cell_says_so():
    """A code cell whose type was changed to raw after it ran (the 'r' key in command mode) is not run anywhere."""
    nb = _nb([("lab_y = lab_f(1)", "answer2", ())])
    nb.cells.insert(0, nbformat.v4.new_raw_cell("def lab_f(x):\n    return x"))
    outcome = {"cases": {("q1", 0): {"error": "NameError: name 'lab_f' is not defined", "records": []}},
               "cell_errors": {1: "NameError: name 'lab_f' is not defined"}}
    grading.explain_name_errors(outcome, nb, grading.notebook_cells(nb, {}))
    assert "'lab_f' is bound only in cell 0, a raw cell, which no one runs: make it a code cell" in \
        outcome["cases"][("q1", 0)]["error"] and "a raw cell" in outcome["cell_errors"][1]


def test_the_note_in_grade_log_is_one_line_whatever_the_error_holds():
    nb = _nb([(EXPLORE, "e1", ["otter_ignore"]), ("go.Figure()", "answer1", ())])
    outcome = {"cases": {}, "cell_errors": {1: "NameError: name 'go' is not defined\n[grader] all passed"}}
    notes = grading.explain_name_errors(outcome, nb, grading.notebook_cells(nb, {}))
    assert len(notes) == 1 and "\n" not in notes[0] and "all passed" not in notes[0], notes
    assert "'go' is bound only in cell 0" in notes[0]


# -- an answer written into a pasted copy of an explore cell (its tag came with it) ------------------
def test_a_new_tagged_cell_that_binds_a_graded_name_is_run_the_others_stay_skipped():
    """JupyterLab's paste copies a cell's tags: an answer written into a pasted explore cell carries
    ``otter_ignore``. A new cell with the tag that binds a graded name runs (as an untagged cell: a copy still
    starting with the mark is skipped); the distributed explore cell (its id or its source) stays skipped whatever
    it binds, and so does a new tagged cell that binds no graded name."""
    tag = ["otter_ignore"]
    nb = _nb([("def lab2_weights(p, i):\n    return p[i]", "pasted", tag),            # the answer, tag copied
              ("def lab2_weights(p, i):\n    return 0", "e1", tag),                   # the explore cell, edited
              (EXPLORE, "other", tag),                                               # an unchanged copy
              ("x = 1\nplot(x)", "scratch", tag),                                    # no graded name
              (MARK + "\nlab2_weights = 2", "marked", tag),                          # a copy with its mark
              ("lab2_norms = [1.0]", "answer4", tag)])                               # the student tagged it
    explore = (frozenset({EXPLORE}), frozenset({"e1"}), frozenset({MARK}), frozenset({"answer4"}))
    config = {"assignment_name": "lab2_importance_weights"}
    assert grading.notebook_cells(nb, config, *explore) == [(0, nb.cells[0].source), (5, "lab2_norms = [1.0]")]
    assert grading.notebook_cells(nb, {}, *explore) == [] == grading.notebook_cells(nb, config)


def test_an_id_two_cells_share_names_neither():
    """VS Code's paste keeps the copied cell's id: an explore cell pasted above itself, the answer written into the
    paste. nbformat kept the id on the first cell (the answer, then taken for the explore cell and skipped) and gave
    the second a random one; an id two cells share is now taken off both, so each is read by what it holds."""
    cell = {"cell_type": "code", "metadata": {"tags": ["otter_ignore"]}, "execution_count": None, "outputs": []}
    raw = {"cells": [{**cell, "id": "e1", "source": "def lab2_weights(p, i):\n    return p[i]"},
                     {**cell, "id": "e1", "source": EXPLORE},
                     {**cell, "id": "a1", "metadata": {}, "source": "lab_y = 1"}],
           "metadata": {}, "nbformat": 4, "nbformat_minor": 5}
    notebook = grading.parse_notebook(json.dumps(raw).encode())
    assert [c.get("id") for c in notebook.cells].count("e1") == 0 and notebook.cells[2].id == "a1"
    explore = (frozenset({EXPLORE}), frozenset({"e1"}), frozenset({MARK}), frozenset({"a1"}))
    assert grading.notebook_cells(notebook, {"assignment_name": "lab2_importance_weights"}, *explore) == [
        (0, raw["cells"][0]["source"]), (2, "lab_y = 1")]


# -- graded the project's way --------------------------------------------------------------------
pytest.importorskip("otter")

from sazo_lite.course import labs  # noqa: E402

STEMS = {lab: labs.resolve_master(lab).stem for lab in ("lab1", "lab2", "lab3")}


def _cell(nb, start: str):
    cells = [c for c in nb.cells if c.cell_type == "code" and c.source.startswith(start)]
    assert len(cells) == 1, f"the cell {start!r} moved: update the hand-ins"
    return cells[0]


def _body(source: str) -> str:
    return source.split("\n", 1)[1]


def _write(solution, folder, name, change):
    nb = nbformat.read(solution, as_version=4)
    change(nb)
    nbformat.write(nb, folder / f"{name}.ipynb")


def _new_cell_after(start, source_of):
    def change(nb):
        cell = _cell(nb, start)
        nb.cells.insert(nb.cells.index(cell) + 1, nbformat.v4.new_code_cell(source_of(cell.source)))
    return change


def _edit(start, change_source):
    def change(nb):
        cell = _cell(nb, start)
        cell.source = change_source(cell.source)
    return change


def _answer_in_pasted_copy(explore_start, answer_start):
    """The explore cell copied and pasted in the answer's place (JupyterLab copies its tags), the answer written into
    it, the answer cell deleted."""
    def change(nb):
        explore, answer = _cell(nb, explore_start), _cell(nb, answer_start)
        pasted = nbformat.v4.new_code_cell(answer.source, metadata={"tags": list(explore.metadata["tags"])})
        nb.cells[nb.cells.index(answer)] = pasted
    return change


def _hand_ins(assigned_labs, root) -> dict:
    folders = {}
    for lab, stem in STEMS.items():
        folders[lab] = root / lab
        folders[lab].mkdir()
        _write(assigned_labs / stem / "autograder" / f"{stem}.ipynb", folders[lab], "solution", lambda nb: None)

    def hand_in(lab, name, *changes):
        stem = STEMS[lab]
        _write(assigned_labs / stem / "autograder" / f"{stem}.ipynb", folders[lab], name,
               lambda nb: [change(nb) for change in changes])

    gain = "# explore (not graded): how the gain grows"
    hand_in("lab2", "copy_without_mark", _new_cell_after(gain, _body))
    hand_in("lab2", "copy_without_mark_edited", _new_cell_after(
        gain, lambda s: _body(s).replace("[0.0, 0.5, 1.0, 1.5, 2.0]", "[0.0, 3.0]")
                                .replace("height=350", "height=600")))
    hand_in("lab2", "merged_without_mark", _edit("def lab2_weights", lambda s: s + "\n\n" + _body(
        _cell(nbformat.read(assigned_labs / STEMS["lab2"] / "autograder" / f"{STEMS['lab2']}.ipynb", as_version=4),
              gain).source)))
    hand_in("lab2", "answer_with_the_explore_import", _edit(
        "def lab2_weights", lambda s: "import plotly.graph_objects as go\nsigmas = [0.0, 0.5]\n" + s))
    hand_in("lab2", "wrong_answer_with_explore_lines", _edit("def lab2_weights", lambda s: (
        "import plotly.graph_objects as go\nsigmas = [0.0, 0.5]\n"
        + s.replace("return 1.0 / (len(probs) * probs[indices])", "return 1.0 / probs[indices]"))))
    hand_in("lab2", "answer_in_a_pasted_explore_cell", _answer_in_pasted_copy(gain, "def lab2_weights"))
    hand_in("lab3", "check_copy_without_mark", _new_cell_after(
        "# check (not graded, skipped by the grader): your sampler next to sazo_lite.PlainSAZOSampler",
        lambda s: _body(s).replace("pick(100, 40)", "pick(10, 4)")))
    hand_in("lab1", "go_in_answer", _edit("def lab1_best_eps_for", lambda s: "_fig = go.Figure()\n" + s))
    hand_in("lab1", "go_imported_in_answer", _edit(
        "def lab1_best_eps_for", lambda s: "import plotly.graph_objects as go\n_fig = go.Figure()\n" + s))
    return folders


@pytest.fixture(scope="module")
def graded(assigned_labs, tmp_path_factory):
    root = tmp_path_factory.mktemp("round14")
    folders, rows = _hand_ins(assigned_labs, root), {}
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("SAZO_FAST", "1")
        for lab, folder in folders.items():
            for row in labs.grade_all(labs.autograder_zip(STEMS[lab], build_dir=assigned_labs), folder,
                                      root / f"{lab}.csv", workers=2):
                rows[(lab, row["submission"].removesuffix(".ipynb"))] = row
    return rows, root


def _scores(row) -> dict:
    return {q: (v["score"], v["possible"]) for q, v in row["questions"].items()}


@pytest.mark.parametrize("lab,name", [("lab2", "copy_without_mark"), ("lab2", "copy_without_mark_edited"),
                                      ("lab2", "merged_without_mark"), ("lab2", "answer_with_the_explore_import"),
                                      ("lab2", "answer_in_a_pasted_explore_cell"),
                                      ("lab3", "check_copy_without_mark"), ("lab1", "go_imported_in_answer")])
def test_copies_without_their_mark_cost_nothing(graded, lab, name):
    rows, _ = graded
    solution = rows[(lab, "solution")]
    assert solution["status"] == "ok" and solution["total"] == solution["possible"] > 0, solution
    row = rows[(lab, name)]
    assert row["status"] == "ok" and row["total"] == row["possible"], _scores(row)


def test_an_answer_sharing_lines_with_an_explore_cell_is_still_graded(graded):
    rows, _ = graded
    scores = _scores(rows[("lab2", "wrong_answer_with_explore_lines")])
    assert scores["q1"][0] < scores["q1"][1], scores


def test_an_answer_using_go_loses_its_question_only_and_its_feedback_says_why(graded):
    rows, root = graded
    row = rows[("lab1", "go_in_answer")]
    scores = _scores(row)
    assert scores.pop("q4")[0] == 0 and all(got == possible for got, possible in scores.values()), scores
    results = json.loads((root / "lab1" / "go_in_answer" / "results.json").read_text())
    why = "'go' is bound only in cell"
    messages = [c["message"] for c in results["questions"]["q4"]["cases"]]
    assert messages and all(why in m and "which the grader does not run" in m for m in messages), messages
    assert any(why in e["error"] for e in results["cell_errors"]), results["cell_errors"]
    log = (root / "lab1" / "go_in_answer" / "grade.log").read_text()
    assert any(line.startswith("[grader] cell ") and why in line for line in log.splitlines()), log[-2000:]


# -- mutants: plausible wrong answers not in earlier rounds; each must fail a case of its question -------------------
from test_lab_mutants import assert_mutant_loses_points  # noqa: E402

LAB1_ERRORS = ("errors = [abs(lab1_projected_grad(f, theta, z.to(theta.dtype), eps) - float(z @ grad)) "
               "for z in directions]")
LAB3_BLEND = ("        self.estimates, self.counts = lab3_blend(self.estimates, self.counts, indices, sizes, "
              "self.level,\n                                                 self.ema_decay, self.prior_strength, "
              "self.statistic)\n")
LAB3_LEVEL = ("        self.level, self.level_steps = lab3_level(self.level, self.level_steps, sizes, weights, "
              "self.level_decay)\n")
MUTANTS = {   # (lab, question): [(name, [(old, new)])]
    ("lab1", "q3"): [("error of the vector g·z, not of the scalar g", [(LAB1_ERRORS, (
                         "errors = [float((lab1_projected_grad(f, theta, z.to(theta.dtype), eps) * z - (z @ grad) * z)"
                         ".norm()) for z in directions]"))]),
                     ("median error, not the mean", [("    return sum(errors) / len(errors)\n",
                                                      "    return sorted(errors)[len(errors) // 2]\n")])],
    ("lab1", "q4"): [("best ε by the variance", [(
                         "errors = [lab1_fd_error(f, grad, theta, eps, directions) for eps in eps_grid]",
                         "errors = [lab1_estimator_variance(f, grad, theta, eps, directions) for eps in eps_grid]")]),
                     ("index into the sorted grid", [("return eps_grid[min(range(len(errors))",
                                                      "return sorted(eps_grid)[min(range(len(errors))")])],
    ("lab2", "q3"): [("V(p) as a mean: 1/N, not 1/N²", [("return float((norms ** 2 / probs).sum()) / len(norms) ** 2",
                                                          "return float((norms ** 2 / probs).mean())")])],
    ("lab3", "q1"): [("duplicates: the square of the mean d", [(
                         "index_add_(0, inverse, diffs.double() ** 2)\n"
                         "    squares /= torch.bincount(inverse, minlength=len(unique)).double()",
                         "index_add_(0, inverse, diffs.double())\n"
                         "    squares = (squares / torch.bincount(inverse, minlength=len(unique)).double()) ** 2")])],
    ("lab3", "q2"): [("the RMS prior for \"square\" too", [("return float(estimates[seen].mean())",
                                                             "return float((estimates[seen] ** 2).mean().sqrt())")])],
    ("lab3", "q3"): [("the rate from the count before the step", [(
                         "    steps += 1\n    rate = max(1.0 / steps, 1.0 - level_decay)",
                         "    rate = max(1.0 / max(steps, 1), 1.0 - level_decay)\n    steps += 1")])],
    ("lab3", "q4"): [("prior strength taken as 1", [("decay = ((n + strength) / (n + strength + 1.0))",
                                                     "decay = ((n + 1.0) / (n + 2.0))")])],
    ("lab3", "q5"): [("scores blended before the level moves", [(LAB3_LEVEL + LAB3_BLEND, LAB3_BLEND + LAB3_LEVEL)]),
                     ("probs always for \"abs\"", [(
                         "return lab3_probs(self.estimates, self.counts, self.uniform_mix, self.statistic)",
                         "return lab3_probs(self.estimates, self.counts, self.uniform_mix)")])],
    ("lab3", "q6"): [("one update fewer", [("    for _ in range(steps):\n        indices, _ = tracker.sample(8)",
                                            "    for _ in range(steps - 1):\n        indices, _ = tracker.sample(8)")]),
                     ("batches of 4", [("indices, _ = tracker.sample(8)", "indices, _ = tracker.sample(4)")])],
    ("lab4", "q1"): [("the sampler built on a fresh θ (the oracle reads norms that never move)", [
                         ("sampler = make_sampler(theta)", "sampler = make_sampler(problem.initial_theta())")])],
}


@pytest.mark.parametrize("lab,question,name", [(*k, n) for k, items in MUTANTS.items() for n, _ in items])
def test_each_new_mutant_loses_points_on_its_question(fast_mode, lab, question, name):
    assert_mutant_loses_points(MUTANTS, lab, question, name)


# -- odd JSON: an old notebook's minor version ------------------------------------------------------
@pytest.mark.parametrize("minor", [1, 4, "5", 10 ** 20])
def test_a_version_3_notebook_with_another_minor_is_read(minor):
    """nbformat has one schema per old version (3.0): a v3 hand-in whose ``nbformat_minor`` was 1 or more stopped
    at nbformat's KeyError (None, None) and was 'failed', every question 0."""
    raw = {"metadata": {}, "nbformat": 3, "nbformat_minor": minor, "worksheets": [{"cells": [
        {"cell_type": "code", "input": "lab_x = 1", "metadata": {}, "outputs": [], "language": "python"}]}]}
    notebook = grading.parse_notebook(json.dumps(raw).encode())
    assert grading.notebook_cells(notebook, {}) == [(0, "lab_x = 1")]


def test_the_longest_explore_code_is_taken_out_whatever_the_order_of_the_explore_cells():
    """Two explore cells whose code starts alike (a dashboard, and the dashboard then a plot): the run is the longer
    one's, for every order of the set (a set of text iterates in another order in each process)."""
    short, longer = DASH, DASH + "\nplot(lab_x)\nshow()"
    source = "from w import dash\ndash()\nplot(lab_x)\nshow()\nlab_y = 1\n"
    for sources in ([short, longer], [longer, short]):
        assert grading._copied_rows(grading.parsed_or_none(source).body,
                                    [grading._explore_shape(s) for s in sources]) == {0, 1, 2, 3}


def test_a_marked_copy_takes_out_the_longest_explore_cell_it_holds_whatever_the_order():
    """Two explore cells with the same first line, one's lines the start of the other's: a copy of the longer merged
    into an answer cell is taken out whole, for every order of the set (it took the first one's lines)."""
    short, longer = MARK + "\nimport a", MARK + "\nimport a\nimport b"   # imports only: no shape (_explore_shape)
    for sources in ([short, longer], [longer, short]):
        assert grading.without_explore(ANSWER + longer + "\nlab_y = 1\n", sources, {MARK}) == \
            ANSWER + "\n\n\nlab_y = 1\n"

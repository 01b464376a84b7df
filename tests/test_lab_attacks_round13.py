"""Round 13 against the graded labs: copies of the explore and check cells.

The grader skips the cells the distributed notebook tags ``otter_ignore`` (explore and check cells), also where an
editor dropped the tag (by their source, or by their id when edited). A *copy* of one has a new id, and where the
student edited it (other settings) or pasted it into an answer cell (JupyterLab's merge, a paste at the top), it
ran: its library call (a dashboard, ``sazo_lite.variance``) was a finding that cost the question below it or the
answer's question, and a copy that redefined a graded function replaced the answer. The copy carries the explore
cell's first line, ``# explore (not graded, skipped by the autograder): ...``: a new cell that starts with it is
that cell's copy and is skipped whole; inside another cell the copy's lines are taken out (the explore cell's
lines where held unchanged, else to the end of the cell). Explore cells neither help nor hurt.
"""
from __future__ import annotations

import json

import nbformat
import pytest

from sazo_lite.course.labs import grading

MARK = "# explore (not graded, skipped by the autograder): the dashboard"
EXPLORE = MARK + "\nfrom sazo_lite.course.widgets import epsilon_dashboard\nepsilon_dashboard()"
ANSWER = "def lab_f(x):\n    return 2 * x\n"


# -- the rule, on sources ----------------------------------------------------------------------
@pytest.mark.parametrize("source, kept", ids=[
    "copy", "copy edited", "edited copy then an answer", "merged below an answer", "merged, code after it",
    "merged edited", "indented", "in a string", "in a function body", "CRLF"], argvalues=[
    (EXPLORE, None),                                                            # a copy, unchanged
    (EXPLORE + "\nprint('tried')", None),                                       # a copy, edited
    (EXPLORE.replace("()", "(eps=1e-3)") + "\n" + ANSWER, None),                # an edited copy: to the end
    (ANSWER + "\n" + EXPLORE, ANSWER + "\n\n\n"),                               # merged below an answer
    (ANSWER + "\n" + EXPLORE + "\ny = 3\n", ANSWER + "\n\n\n\ny = 3\n"),        # unchanged: only its lines
    (ANSWER + EXPLORE + "(1)\ny = 3", ANSWER + "\n\n\n"),                       # edited: to the end
    (ANSWER + "   " + MARK + "\nz = 1", ANSWER + "   " + MARK + "\nz = 1"),    # indented: not a copy
    ('s = """\n' + MARK + '\n"""\n', 's = """\n' + MARK + '\n"""\n'),        # inside a string: not a copy
    ("def g():\n    a = 1\n" + MARK + "\n    return a\n", "def g():\n    a = 1\n" + MARK + "\n    return a\n"),
    (ANSWER.replace("\n", "\r\n") + EXPLORE.replace("\n", "\r\n") + "\r\n", ANSWER.replace("\n", "\r\n") + "\n\n\n"),
])
def test_a_copy_of_an_explore_cell_is_taken_out_of_a_new_cell(source, kept):
    assert grading.without_explore(source, {EXPLORE}, {MARK}) == kept


def test_an_answer_cell_keeps_what_follows_an_explore_cell_pasted_on_top():
    """The distributed notebook's own cell (``new=False``: its id is the answer cell's) with the explore cell pasted
    above the answer keeps the answer; an edited paste runs to the end of the cell (nothing left)."""
    assert grading.without_explore(EXPLORE + "\n" + ANSWER, {EXPLORE}, {MARK}, new=False) == "\n\n\n" + ANSWER
    assert grading.without_explore(EXPLORE + "\n" + ANSWER, {EXPLORE}, {MARK}) is None
    assert grading.without_explore(EXPLORE + "(1)\n" + ANSWER, {EXPLORE}, {MARK}, new=False) is None


def _nb(cells) -> nbformat.NotebookNode:
    nb = nbformat.v4.new_notebook()
    for source, cell_id, tags in cells:
        cell = nbformat.v4.new_code_cell(source)
        cell.id = cell_id
        if tags:
            cell.metadata["tags"] = list(tags)
        nb.cells.append(cell)
    return nb


def test_marks_are_comment_first_lines_no_other_cell_starts_with():
    distributed = _nb([("# the answer\nlab_x = 1", "a1", ()), (EXPLORE, "e1", ["otter_ignore"]),
                       ("# the answer\nplot(lab_x)", "e2", ["otter_ignore"]), ("plot(2)", "e3", ["otter_ignore"]),
                       ("#\nplot(3)", "e4", ["otter_ignore"])])
    assert grading.explore_marks(distributed) == {MARK}


def test_notebook_cells_and_owners_leave_out_the_copies(tmp_path):
    """A new cell starting with the mark is not run, also where it binds a graded name; the answer cell (a
    distributed id) runs without the copy merged into it, and the names bound only in that copy make it no
    question's cell."""
    nb = _nb([("lab_x = 1\n" + EXPLORE + "\nlab_y = 2", "answer1", ()), ('grader.check("q1")', "check1", ()),
              (EXPLORE + "\nlab_x = 5", "copy", ()), ("y = 1\n" + MARK + "\nlab_x = 6", "mine", ()),
              ('grader.check("q2")', "check2", ())])
    path = tmp_path / "hand_in.ipynb"
    nbformat.write(nb, path)
    notebook = grading.read_notebook(path)
    explore = (frozenset({EXPLORE}), frozenset({"e1"}), frozenset({MARK}), frozenset({"answer1", "check1", "check2"}))
    assert grading.notebook_cells(notebook, {}, *explore) == [(0, "lab_x = 1\n\n\n\nlab_y = 2"), (3, "y = 1\n\n")]
    graded = {"q1": ["lab_x"], "q2": ["lab_y"]}
    assert grading.cell_questions(notebook, graded, ["q1", "q2"]) == {0: ["q1", "q2"], 1: ["q1"], 2: ["q1"],
                                                                       3: ["q1"], 4: ["q2"]}
    assert grading.cell_questions(notebook, graded, ["q1", "q2"], explore=explore) == {
        0: ["q1", "q2"], 1: ["q1"], 2: ["q2"], 3: ["q2"], 4: ["q2"]}
    assert grading.notebook_cells(notebook, {}) == [(0, nb.cells[0].source), (2, nb.cells[2].source),
                                                   (3, nb.cells[3].source)]


def test_a_notebook_without_cell_ids_reads_every_cell_as_new(tmp_path):
    """nbformat 4.4 (an older Jupyter, Colab) has no cell ids: a cell starting with the mark is a copy, skipped; an
    explore cell merged below an answer is taken out of it."""
    raw = {"cells": [{"cell_type": "code", "metadata": {}, "execution_count": None, "outputs": [], "source": source}
                     for source in (ANSWER + EXPLORE, EXPLORE + "\nlab_x = 5", "lab_y = 1")],
           "metadata": {}, "nbformat": 4, "nbformat_minor": 4}
    path = tmp_path / "no_ids.ipynb"
    path.write_text(json.dumps(raw))
    explore = (frozenset({EXPLORE}), frozenset({"e1"}), frozenset({MARK}), frozenset({"answer1"}))
    assert grading.notebook_cells(grading.read_notebook(path), {}, *explore) == [(0, ANSWER + "\n\n"), (2, "lab_y = 1")]


# -- graded the project's way --------------------------------------------------------------------
pytest.importorskip("otter")

from sazo_lite.course import labs  # noqa: E402

STEM = labs.resolve_master("lab1").stem
WRONG_Q1 = ("/ (2 * eps))", "/ eps)")   # a plausible wrong answer: the one-sided scale


def _cell(nb, start: str):
    cells = [c for c in nb.cells if c.cell_type == "code" and c.source.startswith(start)]
    assert len(cells) == 1, f"lab 1's cell {start!r} moved: update the hand-ins"
    return cells[0]


def _hand_ins(solution, folder) -> None:
    def hand_in(name, change):
        nb = nbformat.read(solution, as_version=4)
        change(nb)
        nbformat.write(nb, folder / f"{name}.ipynb")

    explore = [c for c in nbformat.read(solution, as_version=4).cells if "otter_ignore" in c.metadata.get("tags", [])]
    assert len(explore) == 2 and all(c.source.startswith("# explore (not graded") for c in explore)
    curve, dashboard = (c.source for c in explore)
    q1 = _cell(nbformat.read(solution, as_version=4), "def lab1_projected_grad").source
    assert WRONG_Q1[0] in q1

    def copy(source, before="def lab1_best_eps_for"):   # a new cell (new id, no tag) above the q4 answer
        def change(nb):
            nb.cells.insert(nb.cells.index(_cell(nb, before)), nbformat.v4.new_code_cell(source))
        return change

    def edit(start, change_source):
        def change(nb):
            cell = _cell(nb, start)
            cell.source = change_source(cell.source)
        return change

    def in_place(start, extra):   # the explore cell itself (its id), edited, in an editor that dropped its tag
        def change(nb):
            cell = _cell(nb, start)
            cell.metadata.pop("tags", None)
            cell.source += "\n" + extra
        return change

    hand_in("solution", lambda nb: None)
    hand_in("explore_redefines", in_place("# explore (not graded, skipped", q1.replace(*WRONG_Q1)))
    hand_in("explore_raises", in_place("# explore (not graded): the U", "raise RuntimeError('an explore cell that raises')"))
    hand_in("copy_edited", copy(dashboard + "\nprint('tried')"))
    hand_in("copy_edited_curve", copy(curve.replace("height=350", "height=500")))
    hand_in("copy_raises", copy(curve + "\nraise RuntimeError('an explore cell that raises')"))
    hand_in("copy_redefines", copy(dashboard + "\n" + q1.replace(*WRONG_Q1)))
    hand_in("merged_below_answer", edit("def lab1_fd_error", lambda s: s + "\n\n" + curve))
    hand_in("merged_edited", edit("def lab1_fd_error", lambda s: s + "\n" + dashboard.replace("()", "(eps=1e-3)")))
    hand_in("pasted_on_top", edit("def lab1_best_eps_for", lambda s: dashboard + "\n\n" + s))
    # explore cells help no wrong answer
    hand_in("wrong_with_right_copy", lambda nb: (edit("def lab1_projected_grad", lambda s: s.replace(*WRONG_Q1))(nb),
                                                 copy(dashboard + "\n" + q1)(nb)))
    hand_in("wrong_with_merged", edit("def lab1_projected_grad", lambda s: s.replace(*WRONG_Q1) + "\n" + dashboard))


@pytest.fixture(scope="module")
def graded(assigned_labs, tmp_path_factory):
    root = tmp_path_factory.mktemp("round13")
    folder = root / "handins"
    folder.mkdir()
    _hand_ins(assigned_labs / STEM / "autograder" / f"{STEM}.ipynb", folder)
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("SAZO_FAST", "1")
        rows = labs.grade_all(labs.autograder_zip(STEM, build_dir=assigned_labs), folder, root / "lab1.csv",
                              workers=2)
    return {r["submission"].removesuffix(".ipynb"): r for r in rows}


@pytest.mark.parametrize("name", ["explore_redefines", "explore_raises", "copy_edited", "copy_edited_curve",
                                  "copy_raises", "copy_redefines", "merged_below_answer", "merged_edited",
                                  "pasted_on_top"])
def test_explore_cells_and_their_copies_cost_nothing(graded, name):
    assert graded["solution"]["status"] == "ok" and graded["solution"]["total"] == graded["solution"]["possible"] > 0
    row = graded[name]
    assert row["status"] == "ok" and row["total"] == row["possible"], row


@pytest.mark.parametrize("name", ["wrong_with_right_copy", "wrong_with_merged"])
def test_copies_of_explore_cells_help_no_wrong_answer(graded, name):
    row = graded[name]
    scores = {q: v["score"] for q, v in row["questions"].items()}
    assert row["status"] == "ok" and scores["q1"] < row["questions"]["q1"]["possible"], row


# -- mutants: plausible wrong answers not in earlier rounds; each must fail a case of its question -------------------
from test_lab_mutants import assert_mutant_loses_points  # noqa: E402

LAB1_SPREAD = ("    spread = [float((lab1_projected_grad(f, theta, z.to(theta.dtype), eps) * z - grad).norm() ** 2) "
               "for z in directions]\n")
MUTANTS = {   # (lab, question): [(name, [(old, new)])]
    ("lab1", "q1"): [("a unit direction", [("plus = f(theta + eps * z)", "z = z / z.norm()\n    plus = f(theta + eps * z)")])],
    ("lab1", "q3"): [("variance around the mean estimate, not the gradient", [
                         (LAB1_SPREAD, "    gz = [lab1_projected_grad(f, theta, z.to(theta.dtype), eps) * z for z in directions]\n"
                                       "    centre = sum(gz) / len(gz)\n"
                                       "    spread = [float((v - centre).norm() ** 2) for v in gz]\n")]),
                     ("a relative error", [("- float(z @ grad)) for z in directions]",
                                            "- float(z @ grad)) / abs(float(z @ grad)) for z in directions]")])],
    ("lab2", "q2"): [("self-normalised (biased) estimate", [
                         ("return float((lab2_weights(probs, indices) * values[indices]).mean())",
                          "w = lab2_weights(probs, indices)\n    return float((w * values[indices]).sum() / w.sum())")])],
    ("lab3", "q1"): [("the EMA decays every entry", [
                         ("estimates[unique] = ema_decay * estimates[unique] + (1.0 - ema_decay) * squares",
                          "estimates *= ema_decay\n    estimates[unique] += (1.0 - ema_decay) * squares")])],
    ("lab3", "q2"): [("the prior over every example, seen or not", [
                         ("return float((estimates[seen] ** 2).mean().sqrt())", "return float((estimates ** 2).mean().sqrt())"),
                         ("return float(estimates[seen].mean())", "return float(estimates.mean())")])],
    ("lab3", "q3"): [("γ for 1 − γ", [("rate = max(1.0 / steps, 1.0 - level_decay)", "rate = max(1.0 / steps, level_decay)")]),
                     ("sum of w·s, not mean", [("float((weights * stats).mean())", "float((weights * stats).sum())")])],
    ("lab3", "q4"): [("counts grow by multiplicity", [
                         ("counts[unique] += 1", "counts.index_add_(0, indices, torch.ones_like(indices, dtype=counts.dtype))")]),
                     ("decay floored at β, not capped", [(".clamp_max(ema_decay)", ".clamp_min(ema_decay)")])],
    ("lab3", "q5"): [("signed diffs into the level", [("lab3_level(self.level, self.level_steps, sizes, weights,",
                                                       "lab3_level(self.level, self.level_steps, diffs, weights,")]),
                     ("weights 1/p without N", [("weights = 1.0 / (self.num_examples * self.probs[indices])",
                                                 "weights = 1.0 / self.probs[indices]")])],
    ("lab3", "q6"): [("indices drawn from the z generator", [
                         ("indices, _ = tracker.sample(8)",
                          "indices = torch.randint(problem.num_examples, (8,), generator=generator)")])],
    ("lab4", "q1"): [("batch size left at train's default", [("batch_size=batch_size, evaluate", "evaluate")])],
}


@pytest.mark.parametrize("lab,question,name", [(*k, n) for k, items in MUTANTS.items() for n, _ in items])
def test_each_new_mutant_loses_points_on_its_question(fast_mode, lab, question, name):
    assert_mutant_loses_points(MUTANTS, lab, question, name)

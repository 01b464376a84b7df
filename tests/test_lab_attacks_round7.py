"""Round 7 against the graded labs, as real hand-ins of lab 2 graded the project's way (``grade_all``):

- a fair student lost every point for one cell's format: a cell whose ``source`` was not text (a number, a
  null, a list holding a number: a broken editor) failed the whole notebook ("cannot read ... as a
  notebook"); so did a notebook saved with a byte-order mark (Windows editors) and one saved in nbformat 3
  (an older Jupyter: the upgraded notebook was of a class the grader did not take). A hand-in named
  ``Alice.IPYNB`` got no row at all (the folder was globbed for ``*.ipynb`` only). Now each cell that cannot
  run is skipped and named in ``reason`` (status "ok": the rest is graded), the rest reads as Jupyter would;
- a student could switch the guard off for good with one attribute, no frames: the worker runs as
  ``__main__``, so rebinding its ``_emit`` (or ``json``'s default encoder) dropped the guard's findings from
  the report, and replacing ``Guard._found`` (class or ``__code__``) or the guard's ``report`` (reached
  through ``builtins.__import__``'s closure) silenced it: the library's answer scored 11/11. Now the worker
  reports through objects it took before student code ran, and any lasting change to the guard's code,
  the standard library functions its checks call or the report's functions is tampering (every question 0);
- an instructor could not regenerate the labs reproducibly: otter gives the cells it adds random ids, so
  every ``make labs`` wrote different student notebooks (and invalidated the reference cache, keyed by
  the solutions' bytes). Now those ids are derived from the master and the cell.
"""
from __future__ import annotations

import csv
import json
import re

import nbformat
import pytest

pytest.importorskip("otter")

from sazo_lite.course import labs  # noqa: E402
from sazo_lite.course.labs import grading  # noqa: E402
from test_lab_attacks_round6 import grade_hand_ins  # noqa: E402

STEM = labs.resolve_master("lab2").stem
HONEST_CV2 = "lab2_one_plus_cv2 = float(1 + lab2_norms.var(unbiased=False) / lab2_norms.mean() ** 2)"
LIBRARY_CV2 = "lab2_one_plus_cv2 = float(sazo_lite.variance.uniform_gain(lab2_norms))"   # q4, forbidden
# Each was a one-cell way (no frames) to keep the library call's finding out of the report: 11/11 before.
SILENCERS = {
    "rebind_worker_emit": """import sys as _s
_m = _s.modules["__main__"]
def _quiet(fd, event, _emit=_m._emit):
    if "rule" not in event:
        _emit(fd, event)
_m._emit = _quiet
""",
    "replace_json_encoder": """import json as _j
class _E(_j.JSONEncoder):
    def encode(self, o):
        return _j.JSONEncoder.encode(self, {"unit": None, "phase": "x"} if "rule" in o else o)
_j._default_encoder = _E()
""",
    "replace_guard_method": """from sazo_lite.course.labs import guard as _g
_g.Guard._found = lambda self, name, how: None
""",
    "replace_guard_code": """from sazo_lite.course.labs import guard as _g
_g.Guard._found.__code__ = (lambda self, name, how: None).__code__
""",
    "replace_guard_report": """import builtins as _b
_gd = [c.cell_contents for c in _b.__import__.__closure__ if type(c.cell_contents).__name__ == "Guard"][0]
_gd.report = lambda *a, **k: None
""",
}
# Plausible roads next to them that must still fail (they did before, too).
STILL_FAIL = {
    "fake_getframe": """import sys as _s
def _gf(depth=0, _r=_s._getframe):
    f = _r(depth + 1)
    while f is not None and f.f_globals.get("__name__") == "__main__":
        f = f.f_back
    return f if f is not None else _r(0)
_s._getframe = _gf
""",
    "repr_dedupes_findings": "import builtins as _b\n_b.repr = lambda x: 'same'\n",
}


FAKE_NOTE = "[grader] ['cell', 7] ran past its limit or ended the worker: killed; restarting without it"


def _edit(nb, start: str, change) -> None:
    cells = [c for c in nb.cells if c.cell_type == "code" and c.source.lstrip().startswith(start)]
    assert len(cells) == 1, f"lab 2's cell {start!r} moved: update the attack"
    cells[0].source = change(cells[0].source)


def _raw(solution) -> dict:
    raw = json.loads(solution.read_text())
    for cell in raw["cells"]:   # every source as a string, so that each hand-in below picks its own form
        cell["source"] = "".join(cell["source"]) if isinstance(cell["source"], list) else cell["source"]
    return raw


def _hand_ins(solution, folder) -> None:
    (folder / "solution.ipynb").write_bytes(solution.read_bytes())
    raw = _raw(solution)
    lines = json.loads(json.dumps(raw))
    for cell in lines["cells"]:   # valid nbformat on disk: each source a list of lines
        cell["source"] = cell["source"].splitlines(keepends=True)
    (folder / "list_sources.ipynb").write_text(json.dumps(lines, indent=1))
    broken = json.loads(json.dumps(raw))   # a broken editor: three cells whose source is not text
    broken["cells"][1:1] = [{"cell_type": "code", "metadata": {}, "execution_count": None, "outputs": [], "source": 5},
                            {"cell_type": "markdown", "metadata": {"tags": "x"}, "source": ["# a", 5]},
                            {"cell_type": "code", "metadata": [], "execution_count": None, "outputs": [], "source": None}]
    (folder / "broken_cells.ipynb").write_text(json.dumps(broken, indent=1))
    (folder / "bom.ipynb").write_bytes(b"\xef\xbb\xbf" + json.dumps(raw, indent=1).encode())
    v3 = nbformat.convert(nbformat.read(solution, as_version=4), 3)
    (folder / "nbformat3.ipynb").write_text(nbformat.writes(v3, version=3))
    (folder / "Upper.IPYNB").write_bytes(solution.read_bytes())
    for name in ("twin.ipynb", "TWIN.ipynb"):   # one folder name where case does not count
        (folder / name).write_bytes(solution.read_bytes())
    nb = nbformat.read(solution, as_version=4)   # Jupyter habits: display() needs no import there, x? is help
    _edit(nb, "def lab2_weights", lambda s: "display(1.5)\n" + s + "\ndisplay(lab2_weights, display_id=True)\n")
    nbformat.write(nb, folder / "display_call.ipynb")
    nb = nbformat.read(solution, as_version=4)
    _edit(nb, "def lab2_weights", lambda s: "torch.randn?\n??torch.ones\n" + s + "\nlab2_weights?\n")
    nbformat.write(nb, folder / "help_lines.ipynb")
    nb = nbformat.read(solution, as_version=4)   # the documented gap: a library value laundered to another question
    _edit(nb, "lab2_problem = ", lambda s: s.replace(HONEST_CV2, "lab2_one_plus_cv2 = 0.0"))
    nb.cells.append(nbformat.v4.new_code_cell("lab2_weights = lab2_weights   # binds q1's name: charged to q1\n"
                                              "globals()['lab2_one_plus_cv2'] = " + LIBRARY_CV2.split(" = ")[1]))
    nbformat.write(nb, folder / "launder_to_q1.ipynb")
    nb = nbformat.read(solution, as_version=4)   # output written to read as the grader's notes in grade.log
    nb.cells.insert(1, nbformat.v4.new_code_cell(
        f"_note = {FAKE_NOTE!r}\n"
        "print('x\\n' + _note + '\\rwork\\r' + _note + '\\x1b[2J\\x1b[1G' + _note)\n"
        "print('a' + 'é' * 200_000)   # characters split between two reads of the pipe"))
    nbformat.write(nb, folder / "mimics_the_grader.ipynb")
    for name, patch in {**SILENCERS, **STILL_FAIL}.items():
        nb = nbformat.read(solution, as_version=4)
        _edit(nb, "lab2_problem = ", lambda s, p=patch: s.replace(HONEST_CV2, p + LIBRARY_CV2))
        assert LIBRARY_CV2 in nbformat.writes(nb)
        nbformat.write(nb, folder / f"{name}.ipynb")


@pytest.fixture(scope="module")
def graded(assigned_labs, tmp_path_factory):
    return grade_hand_ins(assigned_labs, tmp_path_factory.mktemp("round7"), _hand_ins)


def _full(row) -> bool:
    return row["status"] == "ok" and row["possible"] > 0 and row["total"] == row["possible"]


@pytest.mark.parametrize("name", ["list_sources", "broken_cells", "bom", "nbformat3", "display_call", "help_lines"])
def test_a_cell_or_file_format_an_editor_chose_costs_nothing(graded, name):
    rows, _ = graded
    assert _full(rows["solution.ipynb"]), rows["solution.ipynb"]
    assert _full(rows[f"{name}.ipynb"]), rows[f"{name}.ipynb"]


def test_each_cell_that_cannot_run_is_named_in_the_reason(graded):
    rows, csv_path = graded
    reason = rows["broken_cells.ipynb"]["reason"]
    for part in ("cell 1 (code): its source is a JSON number", "cell 2 (markdown): its source is a list holding",
                 "cell 3 (code): its source is a JSON null"):
        assert part in reason, reason
    results = json.loads((csv_path.parent / csv_path.stem / "broken_cells" / "results.json").read_text())
    assert len(results["unreadable_cells"]) == 3 and results["status"] == "ok"
    assert rows["solution.ipynb"]["reason"] is None


def test_a_hand_in_named_in_capitals_gets_its_row(graded):
    rows, csv_path = graded
    assert _full(rows["Upper.IPYNB"]), sorted(rows)
    with open(csv_path, newline="", encoding="utf-8") as handle:
        assert "Upper.IPYNB" in {r["submission"] for r in csv.DictReader(handle)}


def test_hand_ins_whose_names_differ_only_in_case_get_folders_that_differ_in_more(graded):
    rows, csv_path = graded
    assert _full(rows["twin.ipynb"]) and _full(rows["TWIN.ipynb"])
    folders = [p.name for p in (csv_path.parent / csv_path.stem).iterdir() if p.name.casefold().startswith("twin")]
    assert len({f.casefold() for f in folders}) == len(folders) == 2, folders   # on macOS twin/ is TWIN/


def test_grade_all_on_the_command_line_with_no_hand_ins_says_so_without_a_traceback(assigned_labs, tmp_path, capsys):
    empty = tmp_path / "handins"
    empty.mkdir()
    zip_path = labs.autograder_zip(STEM, build_dir=assigned_labs)
    with pytest.raises(SystemExit) as stop:
        labs.main(["grade-all", str(zip_path), str(empty), "--out", str(tmp_path / "g.csv")])
    assert stop.value.code == 2 and "no .ipynb files in" in capsys.readouterr().err
    assert not (tmp_path / "g.csv").exists()


@pytest.mark.parametrize("name", list(SILENCERS))
def test_no_single_attribute_silences_the_guard(graded, name):
    row = graded[0][f"{name}.ipynb"]
    scores = {q: v["score"] for q, v in row["questions"].items()}
    assert row["status"] == "ok" and scores["q4"] == 0, scores


@pytest.mark.parametrize("name", ["replace_guard_method", "replace_guard_code", "replace_guard_report"])
def test_changing_the_guard_for_good_is_tampering(graded, name):
    rows, csv_path = graded
    assert rows[f"{name}.ipynb"]["total"] == 0, rows[f"{name}.ipynb"]
    details = json.loads((csv_path.parent / csv_path.stem / name / "results.json").read_text())["questions"]
    assert all(any("the grader's checks" in r for r in q.get("rule", [])) for q in details.values()), details


@pytest.mark.parametrize("name", list(STILL_FAIL))
def test_the_roads_next_to_them_still_fail(graded, name):
    scores = {q: v["score"] for q, v in graded[0][f"{name}.ipynb"]["questions"].items()}
    assert scores["q4"] == 0, scores


def test_reading_a_notebook_keeps_every_runnable_cell_and_names_the_others(tmp_path):
    cells = [{"cell_type": "code", "metadata": {}, "execution_count": None, "outputs": [], "source": s}
             for s in (["lab_x = 1\n", "lab_y = 2"], 5, ["a", None], "lab_z = 3\r\nlab_w = 4")]
    cells += [["not", "a", "cell"], {"metadata": {}, "source": "x"},
              {"cell_type": "code", "metadata": {"tags": 7}, "outputs": [{"output_type": "stream", "name": "stdout",
                                                                            "text": ["x" * 1000] * 3}],
               "execution_count": 1, "source": "lab_v = 5"}]
    path = tmp_path / "hand_in.ipynb"
    path.write_bytes(b"\xef\xbb\xbf" + json.dumps({"cells": cells, "metadata": {}, "nbformat": 4,
                                                    "nbformat_minor": 5}).encode())
    findings = []
    notebook = grading.read_notebook(path, findings)
    run = grading.notebook_cells(notebook, {})
    assert [i for i, _ in run] == [0, 1, 2, 3, 6]
    namespace = {}
    for _, source in run:
        exec(source, namespace)
    assert [namespace[k] for k in ("lab_x", "lab_y", "lab_z", "lab_w", "lab_v")] == [1, 2, 3, 4, 5]
    assert [re.match(r"cell \d+", f).group() for f in findings] == ["cell 1", "cell 2", "cell 4", "cell 5"], findings
    assert grading.cell_questions(notebook, {}, {"q1": {}}) == {i: ["q1"] for i in (0, 1, 2, 3, 6)}


def test_hand_ins_are_found_whatever_the_case_of_their_extension(tmp_path):
    for name in ("a.ipynb", "B.IPYNB", "c.IpYnB", "d.txt", "e.ipynb.txt"):
        (tmp_path / name).write_text("{}")
    assert [p.name for p in labs.hand_ins(tmp_path)] == ["B.IPYNB", "a.ipynb", "c.IpYnB"]


def test_assigning_a_master_again_writes_the_same_notebooks(assigned_labs, tmp_path):
    master = labs.resolve_master("lab1")
    again = labs.assign(master, tmp_path)
    for part in ("student", "autograder"):
        first = assigned_labs / master.stem / part / f"{master.stem}.ipynb"
        assert (again / part / first.name).read_bytes() == first.read_bytes(), part
    ids = [c["id"] for c in json.loads(first.read_text())["cells"]]
    assert len(set(ids)) == len(ids)


def test_the_worker_writes_its_events_as_json_without_the_json_module():
    from sazo_lite.course.labs.worker import _json_text

    text = _json_text()
    event = {"unit": ["case", "q1", 0], "phase": "end", "error": 'a "quoted"\\ line\n\x00é\udcff',
             "records": [{"value": {"t": "float", "v": 0.1}, "rtol": None, "atol": 1e-300},
                         {"value": {"t": "seq", "v": [1, 2 ** 60, -0.0, True, False]}}, (1, 2.5)],
             "nan": float("nan"), "inf": [float("inf"), -float("inf")]}
    back = json.loads(text(event).encode("utf-8", "replace"))
    expected = json.loads(json.dumps({**event, "error": event["error"].replace("\udcff", "?")}))
    assert back["error"] == expected["error"] and back["records"] == expected["records"]
    assert back["unit"] == event["unit"] and back["nan"] != back["nan"] and back["inf"] == event["inf"]
    assert json.loads(text({"x": object(), 1: "dropped", "s": type("S", (str,), {})("y")})) == {"x": None, "s": None}


def test_a_pasted_line_separator_does_not_shift_the_seed_or_the_check_call():
    """``str.splitlines`` splits at U+2028, form feeds and the like, which Python does not: every later line was
    rewritten one line off (``42lab_seed = 1``: a SyntaxError, the cell's answers lost)."""
    from sazo_lite.course.labs.grading import _without_otter, with_seed

    seeded = with_seed("# pasted\u2028from a PDF\nlab_seed = 1\nlab2_x = 2\n", "lab_seed", 42)
    namespace = {}
    exec(seeded, namespace)
    assert (namespace["lab_seed"], namespace["lab2_x"]) == (42, 2)
    for cell in ('_s = "a\x0cb"\nlab2_y = 3\ngrader.check("q1")\n', '_s = "\x85"\r\nlab2_y = 3\r\ngrader.check("q1")'):
        namespace = {}
        exec(_without_otter(cell), namespace)
        assert namespace["lab2_y"] == 3
    seeded = with_seed("lab2_z = 1\rlab_seed = (5 +\r 3)\rlab2_w = 2", "lab_seed", 42)
    namespace = {}
    exec(seeded, namespace)
    assert (namespace["lab_seed"], namespace["lab2_w"]) == (42, 2)


def test_a_huge_hand_in_is_refused_unread_and_the_others_still_graded(tmp_path):
    """A hand-in of many GiB was read whole (and parsed): the grading process, and every student's grade with
    it, could die of memory. Now past ``MAX_NOTEBOOK_BYTES`` it is refused with a reason, unread."""
    path = tmp_path / "huge.ipynb"
    with open(path, "wb") as handle:   # sparse: costs no disk
        handle.truncate(512 * 2 ** 20 + 1)
    with pytest.raises(ValueError, match="larger than 512 MiB: clear its outputs"):
        grading.read_notebook(path)


def test_documented_gap_a_library_value_handed_to_another_question_costs_only_the_cells_own(graded):
    """labs/README.md, what does not hold: a finding costs the questions of its cell (the graded names it binds,
    else the check below it), not those its values reach. If this fails, the gap was closed: update the README."""
    scores = {q: v["score"] for q, v in graded[0]["launder_to_q1.ipynb"]["questions"].items()}
    assert scores["q1"] == 0 and scores["q4"] == 2.0, scores


def test_output_cannot_pose_as_the_graders_notes_in_grade_log(graded):
    """The submission's output went into grade.log as it came, next to the grader's own ``[grader]`` notes:
    a hand-in could write a kill and a restart that read as the grader's (and terminal escapes that clear the
    instructor's screen); each read of the pipe was decoded alone, so a character split between two reads
    became U+FFFD. Now the output is decoded once, and its lines that start like a note are marked."""
    rows, csv_path = graded
    assert _full(rows["mimics_the_grader.ipynb"])
    log = (csv_path.parent / csv_path.stem / "mimics_the_grader" / "grade.log").read_text(encoding="utf-8")
    assert log.count("[output] " + FAKE_NOTE) == 2 and "\x1b" not in log and "\r" not in log, log[:500]
    assert not [line for line in log.splitlines() if line.startswith("[grader]")], log[:500]
    assert "a" + "é" * 200_000 in log and "\ufffd" not in log

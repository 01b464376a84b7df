"""Issue 42 for lab 4: the hostile rounds labs 1-3 get, as real lab-4 submissions graded the project's way.

Each attack is the lab's solutions with an answer replaced or cells added (the helpers and roads of
``test_labs`` and ``test_lab_attacks``), all graded in one ``grade_all`` run (sandbox, guard, trusted
scoring) shared by the file, since lab 4 trains small models. Each test checks the score the attack must
get (the cases it attacks fail with their reason, or the question scores 0 under the library rule, the
rest full marks; or the hand-in is refused with a reason) and that the honest solutions in the same run
keep full marks.
"""
from __future__ import annotations

import json
import os

import nbformat
import pytest

pytest.importorskip("otter")

from sazo_lite.course import labs  # noqa: E402
from test_lab_attacks import LIB, WRAPPED, _namespace_cells  # noqa: E402
from test_labs import DELEGATIONS, _lab1_variant  # noqa: E402

STEM = labs.resolve_master("lab4").stem
Q1, Q2, Q3, Q4 = "def lab4_queries_to_target(", "lab4_problem = problems.", "def lab4_lm_losses(", "lab4_lm_lr, "
CHECK_Q3 = 'grader.check("q3")'
DELEGATE_Q3 = DELEGATIONS["lab4"][0][2][Q3]   # q3 through the library's causal_lm_losses: right values, forbidden
LOGITS = "model(input_ids=tokens, attention_mask=torch.ones_like(tokens)).logits"
CASE = "sys._getframe(1).f_code.co_filename"  # who called the answer: '<q3 case 1>' is q3's hidden case

# the worker's report pipe written by the submission: garbage and truncated lines during a cell (only noted) and
# during the public cases of q1 and q3 (each fails with the reason, the rest stands)
MALFORMED = """import os, sys
_fd = int(sys.argv[1])
_garbage = (b"\\x00\\xff garbage \\x1b[2J\\n", b'{"unit": ["case", "q3", 0], "phase": "end", "error": null, "records": [{"value": {"t": "flo\\n')
for _line in (*_garbage, b'{"done": true}\\n'):
    os.write(_fd, _line)"""
# one value that is not the solutions' number per question, each in a hidden case whose own asserts it passes:
# NaN (q1), inf (q2), 4 million numbers (q3), -inf (q4)
HOSTILE_Q1 = f"""import math, sys
_honest_queries = lab4_queries_to_target
def lab4_queries_to_target(*args):
    if {CASE} == "<q1 case 0>":
        for _line in _garbage:
            os.write(_fd, _line)
    return math.nan if {CASE} == "<q1 case 1>" else _honest_queries(*args)"""
INF_Q2 = "import math\nlab4_speedup_oracle = math.inf   # passes the hidden `> 1.5`"
HOSTILE_Q3 = f"""import sys
_honest_losses = lab4_lm_losses
def lab4_lm_losses(model, tokens):
    if {CASE} == "<q3 case 0>":
        for _line in _garbage:
            os.write(_fd, _line)
    return torch.zeros(2000, 2000, dtype=torch.float64) if {CASE} == "<q3 case 1>" else _honest_losses(model, tokens)"""
MINUS_INF_Q4 = "import math\nlab4_lm_final['uniform'] = -math.inf   # passes the hidden `min(...) < initial loss`"
EXIT = "import os\nos._exit(0)"
# dup2 of a pipe onto the report fd, read by a thread that forwards every line but the guard's findings
DUP2_FILTER = """import os, sys, threading
_fd = int(sys.argv[1])
_real = os.dup(_fd)
_r, _w = os.pipe()
os.dup2(_w, _fd)
os.close(_w)
def _forward():
    buffer = b""
    while chunk := os.read(_r, 65536):
        buffer += chunk
        while b"\\n" in buffer:
            line, buffer = buffer.split(b"\\n", 1)
            if b'"rule"' not in line or KEEP_FINDINGS:
                os.write(_real, line + b"\\n")
            if line.strip() == b'{"done": true}':
                return
threading.Thread(target=_forward).start()"""
DUP2_FORWARD_ALL = DUP2_FILTER.replace("KEEP_FINDINGS", "True")   # the control: the same dup2, every line forwarded
DUP2_FILTER = DUP2_FILTER.replace("KEEP_FINDINGS", "False")
WRAPPED_Q3 = ("import sys\n" + WRAPPED[0] + _namespace_cells(LIB["lab4"]) +
              f"def lab4_lm_losses(model, tokens):\n    return _lib_{abs(hash(LIB['lab4'])) % 1000}.f({LOGITS}, tokens)")
# a cell that binds no graded name computes q4's initial loss with the library, reloaded (importlib.reload makes
# its functions anew); a `grader.check("q1")` added below it must not make that finding q1's (the next check of
# the distributed order is q4's)
LIBRARY_CELL = ("import importlib, sys\n_losses = importlib.reload(sys.modules['sazo_lite.llm.losses'])\n"
                "_initial_by_library = float(_losses.causal_lm_losses(tiny_causal_lm('gpt2', vocab_size=lab4_vocab, "
                "seed=0)(input_ids=lab4_tokens, attention_mask=torch.ones_like(lab4_tokens)).logits, lab4_tokens).mean())")

# submission -> ({start of an answer cell: its new source}, [(start of the cell to insert after, new cell)])
SUBMISSIONS = {
    # os._exit(0) in the first cell, the report fd written with garbage, NaN, inf and huge values in hidden cases
    "hostile_values_and_reports": ({}, [("import torch", EXIT), ("lab4_sazo = ", MALFORMED), (Q1, HOSTILE_Q1),
                                        (Q2, INF_Q2), (Q3, HOSTILE_Q3), (Q4, MINUS_INF_Q4)]),
    "dup2_report_fd": ({Q3: DELEGATE_Q3}, [("import torch", DUP2_FILTER)]),
    "dup2_report_fd_forwarding_all": ({Q3: DELEGATE_Q3}, [("import torch", DUP2_FORWARD_ALL)]),
    "wrapped_road": ({Q3: WRAPPED_Q3}, []),
    "reload_and_extra_check_cell": ({}, [(CHECK_Q3, LIBRARY_CELL), ("import importlib, sys\n_losses", 'grader.check("q1")')]),
}
SECRET = "TOP-SECRET lab 4 answer key"


def _submission(solution, path, replace: dict, inserts: list) -> None:
    _lab1_variant(solution, path, replace)
    nb = nbformat.read(path, as_version=4)
    for after, source in inserts:
        at = [k for k, c in enumerate(nb.cells) if c.cell_type == "code" and c.source.lstrip().startswith(after)]
        assert len(at) == 1, f"lab 4's cell {after!r} moved: update the attack"
        nb.cells.insert(at[0] + 1, nbformat.v4.new_code_cell(source))
    if path.stem == "reload_and_extra_check_cell":   # q4's answer uses the library's value
        (cell,) = [c for c in nb.cells if c.source.startswith(Q4)]
        assert "lab4_lm_initial_loss = full_loss()" in cell.source
        cell.source = cell.source.replace("lab4_lm_initial_loss = full_loss()", "lab4_lm_initial_loss = _initial_by_library")
    nbformat.write(nb, path)


@pytest.fixture(scope="module")
def graded(assigned_labs, tmp_path_factory):
    """(rows by hand-in, csv path, the solutions' path): every lab-4 hand-in of this file in one grade_all run."""
    root = tmp_path_factory.mktemp("lab4_hostile")
    solution = assigned_labs / STEM / "autograder" / f"{STEM}.ipynb"
    folder = root / "handins"
    folder.mkdir()
    (folder / "solution.ipynb").write_bytes(solution.read_bytes())
    (folder / "...ipynb").write_bytes((assigned_labs / STEM / "student" / f"{STEM}.ipynb").read_bytes())
    for name, (replace, inserts) in SUBMISSIONS.items():
        _submission(solution, folder / f"{name}.ipynb", replace, inserts)
    secret = root / "secret.txt"
    secret.write_text(SECRET)
    (folder / "link_to_solutions.ipynb").symlink_to(solution)
    (folder / "link_to_secret.ipynb").symlink_to(secret)
    copy = root / "copy.ipynb"
    copy.write_bytes(solution.read_bytes())
    os.link(copy, folder / "hard_link.ipynb")
    csv_path = root / "grades" / "lab4.csv"
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("SAZO_FAST", "1")
        rows = labs.grade_all(labs.autograder_zip(STEM, build_dir=assigned_labs), folder, csv_path, workers=2)
    return {r["submission"]: r for r in rows}, csv_path


def _details(graded, name) -> dict:
    _, csv_path = graded
    return json.loads((csv_path.parent / csv_path.stem / labs.safe_name(name) / "results.json").read_text())


def _assert_honest_full_marks(graded) -> None:
    row = graded[0]["solution.ipynb"]
    assert row["status"] == "ok" and row["possible"] > 0 and row["total"] == row["possible"], row


def _assert_scores(graded, name, lost: dict) -> None:
    """``lost``: {question: reason} (every case fails with it) or {(question, case): reason}; the rest full marks."""
    _assert_honest_full_marks(graded)
    details = _details(graded, name)["questions"]
    row = graded[0][f"{name}.ipynb"]
    for q, entry in details.items():
        for case in entry["cases"]:
            why = lost.get(q, lost.get((q, case["case"])))
            if why is None:
                assert case["passed"], f"{name}: {q} case {case['case']} lost points it earned honestly: {case}"
            else:
                assert not case["passed"] and why in (case["message"] or ""), f"{name}: {q} case {case['case']}: {case}"
        expected = sum(c["points"] for c in entry["cases"] if lost.get(q, lost.get((q, c["case"]))) is None)
        assert row["questions"][q]["score"] == entry["score"] == expected, (name, q, row["questions"])


def test_the_honest_solutions_keep_full_marks(graded):
    _assert_honest_full_marks(graded)
    assert _details(graded, "solution")["questions"]["q3"].get("rule") is None


HOSTILE = "hostile_values_and_reports"
# its cases that must fail, with their reason; every other case passes
HOSTILE_VALUES = {("q1", 1): "value 1", ("q2", 3): "value 1", ("q3", 1): "too large", ("q4", 1): "value 3"}
HOSTILE_LOST = {("q1", 0): "malformed report from the sandbox", ("q3", 0): "malformed report from the sandbox",
                **HOSTILE_VALUES}


def test_os_exit_0_in_a_cell_is_graded_again_without_that_cell(graded):
    row, details = graded[0][f"{HOSTILE}.ipynb"], _details(graded, HOSTILE)
    assert row["status"] == "timeout" and details["killed"] == [["cell", 4]], details["killed"]
    _assert_scores(graded, HOSTILE, HOSTILE_LOST)   # the cases the other attacks lost, and those only


def test_a_malformed_report_fails_the_case_it_was_written_in_and_nothing_else(graded):
    """Written during q1's and q3's public cases (and during a cell: only noted)."""
    _assert_scores(graded, HOSTILE, HOSTILE_LOST)
    assert not _details(graded, HOSTILE)["questions"]["q4"]["cases"][0]["message"]


def test_nan_inf_and_huge_values_fail_their_hidden_cases(graded):
    details = _details(graded, HOSTILE)["questions"]
    assert all(details[q]["cases"][k]["hidden"] for q, k in HOSTILE_VALUES), "each reaches a hidden case's compare"
    assert "nan" in details["q1"]["cases"][1]["message"].lower(), details["q1"]["cases"][1]
    assert "inf" in details["q2"]["cases"][3]["message"].lower(), details["q2"]["cases"][3]
    assert "too large" in details["q3"]["cases"][1]["message"], details["q3"]["cases"][1]
    assert "inf" in details["q4"]["cases"][1]["message"].lower(), details["q4"]["cases"][1]
    _assert_honest_full_marks(graded)


@pytest.mark.parametrize("name", [
    "dup2_report_fd",                  # the kernel refuses dup2 onto the report fd (worker.block_programs)
    "dup2_report_fd_forwarding_all",   # the control: the delegation is caught through the same dup2
])
def test_dup2_onto_the_report_fd_hides_no_finding(graded, name):
    _assert_scores(graded, name, {"q3": "the library is not the answer", "q4": "the library is not the answer"})
    assert any("causal_lm_losses" in reason for reason in _details(graded, name)["questions"]["q3"]["rule"])


def test_the_wrapped_road_to_the_library_scores_zero_with_the_rule_as_reason(graded):
    """q4's answer cell calls lab4_lm_losses, so the library call is q4's finding too."""
    _assert_scores(graded, "wrapped_road", {"q3": "the library is not the answer", "q4": "the library is not the answer"})
    assert any("causal_lm_losses" in reason for reason in _details(graded, "wrapped_road")["questions"]["q3"]["rule"])


def test_a_reloaded_module_is_guarded_and_an_added_check_cell_moves_no_finding(graded):
    name = "reload_and_extra_check_cell"
    _assert_scores(graded, name, {"q4": "the library is not the answer"})
    details = _details(graded, name)["questions"]
    assert any("causal_lm_losses" in reason and "cell 19" in reason for reason in details["q4"]["rule"]), details["q4"]
    assert not any(details[q].get("rule") for q in ("q1", "q2", "q3")), details


def test_links_are_refused_quoting_nothing_and_a_dots_name_stays_inside(graded):
    _assert_honest_full_marks(graded)
    rows, csv_path = graded
    for name in ("link_to_solutions.ipynb", "link_to_secret.ipynb"):
        assert rows[name]["status"] == "failed" and rows[name]["total"] == 0, rows[name]
        assert "symbolic link" in rows[name]["reason"], rows[name]
    assert rows["hard_link.ipynb"]["total"] == 0 and "hard link" in rows["hard_link.ipynb"]["reason"]
    assert "TOP-SECRET" not in csv_path.read_text()
    dots = rows["...ipynb"]   # the untouched student notebook under a name that is all dots
    assert dots["status"] == "ok" and dots["total"] == 0 and dots["possible"] > 0, dots
    assert sorted(p.name for p in csv_path.parent.iterdir()) == ["lab4", "lab4.csv"], "nothing written next to the CSV"
    folders = list((csv_path.parent / "lab4").iterdir())
    assert len(folders) == len(rows) and all(p.is_dir() and not p.name.startswith(".") for p in folders), folders


SECCOMP_PROBE = r"""
import json, os, subprocess, sys
from sazo_lite.course.labs.worker import block_programs
r, w = os.pipe()
report = os.dup(w)
out = {"blocked": block_programs(report)}
for name, call in [("dup2 onto", lambda: os.dup2(r, report)), ("close", lambda: os.close(report)),
                   ("closerange", lambda: os.closerange(report, report + 1)), ("exec", lambda: subprocess.run(["true"])),
                   ("dup2 elsewhere", lambda: os.dup2(r, w)), ("dup", lambda: os.dup(report)),
                   ("close another", lambda: os.close(os.dup(r))), ("write", lambda: os.write(report, b"x"))]:
    try:
        call()
        out[name] = "ok"
    except OSError as error:
        out[name] = error.errno
out["still the report"] = os.write(report, b"y") == 1
print(json.dumps(out))
"""


def test_the_kernel_keeps_the_report_fd_in_place_and_only_it():
    import json
    import subprocess
    import sys
    out = json.loads(subprocess.run([sys.executable, "-c", SECCOMP_PROBE], capture_output=True, text=True,
                                    check=True).stdout)
    if not out["blocked"]:
        pytest.skip("seccomp is not available here")
    assert out["dup2 onto"] == out["close"] == out["exec"] == 1  # EPERM
    assert out["dup2 elsewhere"] == out["dup"] == out["close another"] == out["write"] == "ok"
    assert out["still the report"]  # closerange fell back to close(), refused on the report fd

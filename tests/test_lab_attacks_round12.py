"""Round 12 against the graded labs: hand-ins in other encodings, assigned magics, ``get_ipython``, timeouts, the
reference cache after an upgrade, failed cells' errors, a gap pinned, new mutants.

- A hand-in is JSON, and JSON readers (Python's ``json``, RFC 8259's detection) take UTF-8 with or without a
  byte-order mark and UTF-16/32. The grader decoded UTF-8 only: a notebook written by Windows PowerShell's ``>``
  or ``Out-File`` (UTF-16 with a byte-order mark) was "failed" (not JSON), every point lost; so was a notebook
  with a byte-order mark *and* one byte that is not UTF-8 (a comment saved in cp1252), and a notebook with such
  a byte lost the lenient reading (no notebook metadata: nbformat's ValidationError; no ``nbformat`` key: read as
  version 1, every cell's code dropped). Now the bytes are decoded as JSON readers detect them
  (``grading._json_text``), undecodable bytes as U+FFFD.
- An answer cell that assigns a magic's value (``_t = %timeit -o lab2_f(x)``, ``y = %time f()``, ``files = !ls``:
  IPython assigns what the magic returns) was left as it was, did not parse, and none of it ran: the functions it
  defined were missing and the question scored 0. Now ``%time``'s value is its expression's, the others' None.
- A timeout the interval timer cannot take (``float("inf")`` or ``1e11`` seconds, meant as "no limit"; the timer
  takes at most about 9e9) passed ``grade``'s check (> 0): every cell and case then failed with the timer's
  OverflowError, and where the solutions' reference came from the cache (computed before with the defaults) every
  hand-in scored 0 with status "ok"; ``True`` was taken as one second. ``grade``, ``grade_all`` and the command line
  now refuse a timeout that is not a number in (0, 1e8] seconds, naming it.
- The solutions' reference values were cached under a hash of the zip, the solutions, the library and SAZO_FAST
  only: after an upgrade of PyTorch (or NumPy, or Python) the hand-ins were compared with values the old versions
  computed (hidden cases compare float64 state to 1e-12, and a sampler's draws may change). The hash now covers
  their versions.
- A cell converted from a script (``nbconvert --to script`` writes ``get_ipython().run_line_magic(...)``) stopped at
  its first line: ``get_ipython`` is a name Jupyter gives every notebook, and the worker had none (NameError). The
  worker now gives one whose magics do what ``without_magics`` makes of the ``%`` forms.
- What a failed cell raised reached neither results.json nor grade.log (a cell's error was read and dropped): the
  reason for a 0 (a SyntaxError of Python 3.12's syntax on the grader's 3.11, a NameError) was unknown. Now
  results.json lists ``cell_errors`` and grade.log has a line per failed cell.
- Found, not closed here (closed in round 18, tests/test_lab_attacks_round15.py): a forbidden function that C code calls while allowed library code
  is the running Python frame (a ``__del__`` that is a ``partial`` of ``list.extend`` over a ``map`` of it, on an
  object that dies as the student's ``_observe`` returns into ``Sampler.update``) counts as the library's own call.
- New mutants (off by one, a wrong order or sign, biased weights) in labs 1-4: each loses points on its question
  (no defect: the existing cases already catch every one).
"""
from __future__ import annotations

import json
import math

import pytest

from sazo_lite.course.labs import grading

SOURCE = "# café: the weights 1/(N p_i)\nlab2_x = 1\n"
NOTEBOOK = {"cells": [{"cell_type": "code", "metadata": {}, "execution_count": None, "outputs": [],
                       "source": SOURCE.splitlines(keepends=True)}],
            "metadata": {"kernelspec": {"name": "python3", "display_name": "Python 3", "language": "python"}},
            "nbformat": 4, "nbformat_minor": 5}
NO_VERSION = {key: value for key, value in NOTEBOOK.items() if not key.startswith("nbformat")}   # a script wrote it
ENCODED = {   # name: the hand-in's bytes, the source the grader must read (U+FFFD for a byte that is not UTF-8)
    "UTF-16 with a byte-order mark (PowerShell's >)": (json.dumps(NOTEBOOK, indent=1).encode("utf-16"), SOURCE),
    "UTF-16 LE without a mark": (json.dumps(NOTEBOOK).encode("utf-16-le"), SOURCE),
    "UTF-32": (json.dumps(NOTEBOOK).encode("utf-32"), SOURCE),
    "a byte-order mark and a cp1252 byte": (b"\xef\xbb\xbf" + json.dumps(NOTEBOOK, ensure_ascii=False).encode("cp1252"),
                                           SOURCE.replace("é", "\ufffd")),
    "a cp1252 byte, no nbformat key": (json.dumps(NO_VERSION, ensure_ascii=False).encode("cp1252"),
                                       SOURCE.replace("é", "\ufffd")),
    "a cp1252 byte, no metadata": (json.dumps({k: v for k, v in NOTEBOOK.items() if k != "metadata"},
                                              ensure_ascii=False).encode("cp1252"), SOURCE.replace("é", "\ufffd")),
}


@pytest.mark.parametrize("name", ENCODED)
def test_a_hand_in_in_another_json_encoding_is_read(tmp_path, name):
    """Before: each raised (NotJSONError, nbformat's ValidationError) and the hand-in scored 0, "failed"; without an
    nbformat key, nbformat read it as version 1 and dropped its code (every cell empty: 0, status "ok")."""
    data, source = ENCODED[name]
    path = tmp_path / "alice.ipynb"
    path.write_bytes(data)
    findings = []
    notebook = grading.read_notebook(path, findings)
    assert [cell.source for cell in notebook.cells] == [source] and findings == []


def test_what_is_not_a_notebook_in_any_encoding_still_fails_with_nbformats_reason(tmp_path):
    for data in ("not json".encode("utf-16"), b"\xff\xfe\x00"):
        path = tmp_path / "x.ipynb"
        path.write_bytes(data)
        with pytest.raises(ValueError, match="not appear to be JSON"):   # nbformat's NotJSONError
            grading.read_notebook(path)


ASSIGNED_MAGICS = """def lab2_weights(probs, indices):
    return 1.0 / (len(probs) * probs[indices])
_t = %timeit -o lab2_weights(torch.ones(4) / 4, torch.tensor([0, 1]))
lab2_w = %time lab2_weights(torch.ones(4) / 4, torch.tensor([0, 1]))
files = !ls
lab2_a, lab2_b = %time 1, 2
"""


def test_a_magic_whose_value_is_assigned_keeps_the_cell():
    """Before: the cell did not parse and nothing in it ran (lab2_weights missing: the question scored 0)."""
    import torch

    plain = grading.without_magics(ASSIGNED_MAGICS)
    namespace = {"torch": torch}
    exec(compile(plain, "<cell 1>", "exec"), namespace)
    assert namespace["lab2_w"].tolist() == [1.0, 1.0] and namespace["_t"] is None and namespace["files"] is None
    assert (namespace["lab2_a"], namespace["lab2_b"]) == (1, 2)
    assert len(plain.splitlines()) == len(ASSIGNED_MAGICS.splitlines())   # tracebacks keep the cell's line numbers
    assert {"lab2_weights", "lab2_w"} <= grading.bound_names(plain)        # where a rule finding in it counts


@pytest.mark.parametrize("name,value", [("cell_timeout", float("inf")), ("test_timeout", 1e11),
                                        ("notebook_timeout", float("inf")), ("cell_timeout", True)])
def test_a_timeout_the_timer_cannot_take_is_refused_before_grading(tmp_path, name, value):
    """Before: accepted (inf > 0); the worker's setitimer raised OverflowError in every cell and case."""
    from sazo_lite.course import labs

    submission, autograder = tmp_path / "alice.ipynb", tmp_path / "lab2-autograder_1.zip"
    submission.write_text("{}")
    autograder.write_bytes(b"not read: the timeouts are checked first")
    with pytest.raises(ValueError, match=f"Invalid {name}"):
        labs.grade(submission, autograder, tmp_path / "out", **{name: value})
    assert not (tmp_path / "out").exists()
    with pytest.raises(ValueError, match=f"Invalid {name}"):   # before the solutions' reference run
        labs.grade_all(autograder, tmp_path, tmp_path / "grades.csv", **{name: value})


def test_the_command_line_refuses_a_timeout_the_timer_cannot_take(tmp_path, capsys):
    import signal

    from sazo_lite.course import labs

    with pytest.raises(OverflowError):   # the reason: what the worker's timers did with it
        signal.setitimer(signal.ITIMER_REAL, 1e11)
    submission, autograder = tmp_path / "alice.ipynb", tmp_path / "lab2-autograder_1.zip"
    submission.write_text("{}")
    autograder.write_bytes(b"")
    with pytest.raises(SystemExit) as info:
        labs.main(["grade", str(autograder), str(submission), "--out", str(tmp_path / "out"),
                   "--cell-timeout", "100000000000"])
    assert info.value.code == 2 and "Invalid cell_timeout" in capsys.readouterr().err


def test_the_reference_is_computed_again_after_a_pytorch_upgrade(tmp_path, monkeypatch):
    """Before: the cache written under the old version was read back (the stale values, run not called)."""
    import torch

    autograder, _ = _fake_lab(tmp_path)
    runs = []

    def run(cells, questions, **options):
        runs.append(torch.__version__)
        return {"cases": {("q1", 0): {"error": None, "records": [{"value": {"t": "int", "v": len(runs)}}]}},
                "rules": {}}

    monkeypatch.setattr(grading, "run", run)
    limits = dict(cell_timeout=1, test_timeout=1, notebook_timeout=1)
    first = grading.reference(autograder, **limits)
    assert grading.reference(autograder, **limits) == first and len(runs) == 1   # the cache is read back
    monkeypatch.setattr(torch, "__version__", torch.__version__ + ".upgraded")
    again = grading.reference(autograder, **limits)
    assert len(runs) == 2 and again != first
    assert len(list(tmp_path.glob("*.reference-*.json"))) == 1   # the stale one is removed


FROM_A_SCRIPT = ["get_ipython().run_line_magic('matplotlib', 'inline')\nget_ipython().system('pip install torch')\n"
                 "import math\nlab2_pi = math.pi",
                 "get_ipython().run_cell_magic('time', '', 'def lab2_weights(x):\\n    return 2 * x\\n')\n"
                 "lab2_y = get_ipython().run_line_magic('time', 'lab2_weights(3)')"]


def test_a_cell_converted_from_a_script_runs_with_get_ipython():
    """Before: NameError ('get_ipython' is not defined: Jupyter has it without an import) stopped each cell at its
    first line, and the names it defines were missing (here lab2_pi, lab2_weights: their questions scored 0)."""
    from sazo_lite.course.labs.rules import RULES

    case = "record([lab2_pi, lab2_weights(2), lab2_y])"   # q1's graded lab2_weights passes the definition check
    questions = {"q1": {"points": [1.0], "cases": [{"hidden": False, "code": case}]}}
    outcome = grading.run(list(enumerate(FROM_A_SCRIPT)), questions, cell_timeout=60, test_timeout=60,
                          notebook_timeout=120, require="none", rule=RULES["lab2_importance_weights"],
                          owners={0: ["q1"], 1: ["q1"]})   # unconfined: the sandbox is not what this is about
    case = outcome["cases"][("q1", 0)]
    assert case["error"] is None and outcome["rules"] == {}, outcome
    assert case["records"][0]["value"] == {"t": "seq", "v": [{"t": "float", "v": math.pi}, {"t": "int", "v": 4},
                                                             {"t": "int", "v": 6}]}


def _fake_lab(folder):
    """An autograder zip of one case (``record(lab9_x)``) with its solutions notebook, and the solutions' record."""
    import zipfile

    import nbformat

    autograder = folder / "labx-autograder_1.zip"
    test = {"name": "q1", "points": 1, "suites": [{"cases": [{"code": ">>> record(lab9_x)", "hidden": False}]}]}
    with zipfile.ZipFile(autograder, "w") as archive:
        archive.writestr("otter_config.json", json.dumps({"assignment_name": "labx"}))
        archive.writestr("tests/q1.py", f"test = {test!r}\n")
    nbformat.write(nbformat.v4.new_notebook(cells=[nbformat.v4.new_code_cell("lab9_x = 1")]), folder / "labx.ipynb")
    return autograder, {("q1", 0): {"error": None, "records": [{"value": {"t": "int", "v": 1}}]}}


def test_what_a_failed_cell_raised_is_in_results_json_and_grade_log(tmp_path):
    """Before: a cell's error reached neither file (only the cases' messages: "name 'lab9_y' is not defined"), so
    the reason for a 0 (here Python 3.12's f-string syntax, which the grader's Python 3.11 cannot read) was unknown."""
    import nbformat

    from sazo_lite.course import labs

    autograder, expected = _fake_lab(tmp_path)
    cells = ["lab9_x = 1", "lab9_y = f\"{dict(a=1)[\"a\"]}\"", "raise ValueError('two\\n[grader] lines')"]
    submission = tmp_path / "alice.ipynb"
    nbformat.write(nbformat.v4.new_notebook(cells=[nbformat.v4.new_code_cell(c) for c in cells]), submission)
    row = labs.grade(submission, autograder, tmp_path / "out", expected=expected, sandbox="none")
    assert row["status"] == "ok" and row["total"] == 1.0, row
    errors = json.loads((tmp_path / "out" / "results.json").read_text())["cell_errors"]
    assert [e["cell"] for e in errors] == [1, 2] and "SyntaxError: f-string" in errors[0]["error"], errors
    lines = (tmp_path / "out" / "grade.log").read_text().splitlines()
    assert any(line.startswith("[grader] cell 1 raised: ") and "SyntaxError: f-string" in line for line in lines)
    assert "[grader] cell 2 raised: ValueError: two | [output] [grader] lines" in lines, lines
    assert not any(line.startswith("[grader] lines") for line in lines), lines   # one line per cell

# -- a gap found here, closed in round 18: a forbidden call C code makes while allowed library code runs ---------
DYING_IN_THE_LIBRARY = """import functools as _ft
class Lab9K(sazo_lite.Sampler):
    def _observe(self, indices, diffs):
        self.found = []
        _answer = getattr(getattr(sazo_lite, 'vari' + 'ance'), 'oracle_' + 'probs')
        # dies as this method returns into Sampler.update: its __del__ (C code) calls the library there
        _dying = type('_Dying', (), {'__del__': _ft.partial(self.found.extend, map(_answer, [diffs.abs()]))})()
"""


# closed in round 18: tests/test_lab_attacks_round15.py charges the object above

# -- mutants: off by one, a wrong sign or order, biased weights; each must fail a case of its question ---------------
pytest.importorskip("otter")

from test_lab_mutants import assert_mutant_loses_points  # noqa: E402

LEVEL_LINE = ("        self.level, self.level_steps = lab3_level(self.level, self.level_steps, sizes, weights, "
              "self.level_decay)\n")
MUTANTS = {   # (lab, question): [(name, [(old, new)])]: plausible wrong answers not in earlier rounds
    ("lab1", "q1"): [("(plus - minus) / 2 * eps", [("/ (2 * eps))", "/ 2 * eps)")]),
                     ("minus step without z", [("minus = f(theta - eps * z)", "minus = f(theta - eps)")])],
    ("lab1", "q2"): [("divides by K - 1", [("return total / num_directions", "return total / (num_directions - 1)")]),
                     ("the global generator", [("z = torch.randn(theta.shape, generator=generator, dtype=theta.dtype)",
                                                "z = torch.randn_like(theta)")]),
                     ("one z for every direction", [
                         ("    total = torch.zeros_like(theta)\n",
                          "    total = torch.zeros_like(theta)\n"
                          "    z0 = torch.randn(theta.shape, generator=generator, dtype=theta.dtype)\n"),
                         ("z = torch.randn(theta.shape, generator=generator, dtype=theta.dtype)", "z = z0")])],
    ("lab1", "q3"): [("squared error", [("errors = [abs(lab1_projected_grad(f, theta, z.to(theta.dtype), eps) - "
                                         "float(z @ grad))",
                                         "errors = [(lab1_projected_grad(f, theta, z.to(theta.dtype), eps) - "
                                         "float(z @ grad)) ** 2")]),
                     ("variance over K - 1", [("return sum(spread) / len(spread)",
                                               "return sum(spread) / (len(spread) - 1)")]),
                     ("error over K - 1", [("return sum(errors) / len(errors)",
                                            "return sum(errors) / (len(errors) - 1)")])],
    ("lab1", "q4"): [("the eps of the smallest variance", [("errors = [lab1_fd_error(",
                                                            "errors = [lab1_estimator_variance(")])],
    ("lab2", "q1"): [("self-normalised weights", [("return 1.0 / (len(probs) * probs[indices])",
                                                   "w = 1.0 / (len(probs) * probs[indices])\n"
                                                   "    return w / w.mean()")]),
                     ("B for N", [("return 1.0 / (len(probs) * probs[indices])",
                                   "return 1.0 / (len(indices) * probs[indices])")])],
    ("lab2", "q2"): [("uniform draws, p's weights", [
                         ("indices = torch.multinomial(probs, batch_size, replacement=True, generator=generator)",
                          "indices = torch.randint(len(probs), (batch_size,), generator=generator)")]),
                     ("divides by B - 1", [("* values[indices]).mean())",
                                           "* values[indices]).sum() / (batch_size - 1))")])],
    ("lab2", "q3"): [("(norms / p)²", [("(norms ** 2 / probs).sum()", "((norms / probs) ** 2).sum()")]),
                     ("oracle from sqrt(norms)", [("return norms / total if total > 0",
                                                   "return norms.sqrt() / norms.sqrt().sum() if total > 0")]),
                     ("all-zero norms give NaN", [("if total > 0 else torch.full_like(norms, 1.0 / len(norms))",
                                                   "if total > 0 else norms / total")])],
    ("lab2", "q4"): [("CV² without the 1", [("float(1 + lab2_norms.var(", "float(lab2_norms.var(")]),
                     ("CV, not CV²", [("lab2_norms.var(unbiased=False) / lab2_norms.mean() ** 2)",
                                      "lab2_norms.std(unbiased=False) / lab2_norms.mean())")]),
                     ("uniform p of ones", [("uniform = torch.full_like(norms, 1.0 / len(norms))",
                                             "uniform = torch.ones_like(norms)")])],
    ("lab3", "q1"): [("no uniform fallback", [("adaptive = roots / roots.sum() if roots.sum() > 0 else uniform",
                                               "adaptive = roots / roots.sum()")]),
                     ("duplicates: the last one wins", [
                         ("estimates[unique] = ema_decay * estimates[unique] + (1.0 - ema_decay) * squares",
                          "estimates[indices] = ema_decay * estimates[indices] + (1.0 - ema_decay) * "
                          "diffs.double() ** 2")])],
    ("lab3", "q2"): [("RMS prior for \"square\"", [
                         ('    if statistic == "square":\n        return float(',
                          "    if False:\n        return float(")]),
                     ("NaN prior before any example is seen", [
                         ("    if not bool(seen.any()):\n        return 0.0\n", "")]),
                     ("sqrt for \"abs\", not \"square\"", [
                         ('    if statistic == "square":\n        scores = scores.sqrt()',
                          '    if statistic == "abs":\n        scores = scores.sqrt()')]),
                     ("no uniform fallback", [("adaptive = scores / scores.sum() if scores.sum() > 0 else uniform",
                                               "adaptive = scores / scores.sum()")])],
    ("lab3", "q3"): [("min for max", [("rate = max(1.0 / steps", "rate = min(1.0 / steps")]),
                     ("rate 1 / (t + 1)", [("rate = max(1.0 / steps", "rate = max(1.0 / (steps + 1)")]),
                     ("mean(w)·mean(s)", [("float((weights * stats).mean())",
                                           "float(weights.mean() * stats.mean())")]),
                     ("steps returned before the increment", [("stats).mean()), steps\n",
                                                               "stats).mean()), steps - 1\n")])],
    ("lab3", "q4"): [("decay from n + 1", [("n = counts[unique].double()", "n = counts[unique].double() + 1")]),
                     ("prior strength before any example is seen", [
                         ("strength = prior_strength if bool(seen.any()) else 0.0", "strength = prior_strength")]),
                     ("divides by a zero level", [("relative = stats.double() / level if level > 0 else "
                                                   "torch.zeros(len(stats), dtype=torch.float64)",
                                                   "relative = stats.double() / level")]),
                     ("decay without the prior strength", [("decay = ((n + strength) / (n + strength + 1.0))",
                                                            "decay = (n / (n + 1.0))")])],
    ("lab3", "q5"): [("blend with the old level", [
                         (LEVEL_LINE, ""),
                         ("self.ema_decay, self.prior_strength, self.statistic)\n",
                          "self.ema_decay, self.prior_strength, self.statistic)\n" + LEVEL_LINE)]),
                     ("signed diffs into the blend", [("lab3_blend(self.estimates, self.counts, indices, sizes,",
                                                       "lab3_blend(self.estimates, self.counts, indices, diffs,")]),
                     ("weights with B for N", [("weights = 1.0 / (self.num_examples * self.probs[indices])",
                                                "weights = 1.0 / (len(indices) * self.probs[indices])")]),
                     ("prior strength fixed at 1", [("self.ema_decay, self.prior_strength, self.statistic)",
                                                     "self.ema_decay, 1.0, self.statistic)")])],
    ("lab4", "q3"): [("shifted the wrong way", [(".logits[:, :-1]", ".logits[:, 1:]"),
                                                 ("targets = tokens[:, 1:]", "targets = tokens[:, :-1]")]),
                     ("the log-likelihood, not its negative", [("return ce.view(len(tokens), -1).mean(dim=1)",
                                                                "return -ce.view(len(tokens), -1).mean(dim=1)")]),
                     ("mean over the wrong axis", [("return ce.view(len(tokens), -1).mean(dim=1)",
                                                    "return ce.view(-1, len(tokens)).mean(dim=0)")])],
}


@pytest.mark.parametrize("lab,question,name", [(*k, n) for k, items in MUTANTS.items() for n, _ in items])
def test_each_new_mutant_loses_points_on_its_question(fast_mode, lab, question, name):
    assert_mutant_loses_points(MUTANTS, lab, question, name)

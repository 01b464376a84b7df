"""Round 18 against the graded labs (file named by the round's brief): a forbidden library function that allowed
library code did not call.

- The guard took a forbidden function's call to be the library calling itself whenever the nearest Python frame
  outside Python's and the packages' code was allowed library code, whoever set the call up. Two gadgets used it
  (pinned as documented gaps in rounds 11 and 12): an object dying as the student's ``_observe`` returns into the
  allowed ``Sampler.update``, whose ``__del__`` is a ``partial`` of ``list.extend`` over a ``map`` of
  ``oracle_probs`` (C code calls the library there); and ``sampling_variance`` grafted as ``losses`` onto a problem
  whose allowed ``closure`` lambda calls ``self.losses``. Lab 3's ``oracle_probs`` and lab 2's
  ``sampling_variance`` answered, nothing was charged. Now a library frame counts as the caller only where its
  code names the function called (``guard.Guard._names``: its name among the frame's names, locals included; a
  dunder, which Python calls implicitly, needs none); else the walk goes on past it to the code that called it.
"""
from __future__ import annotations

import pytest

from test_lab_attacks_round11 import CLOSURE_GADGET, _guarded
from test_lab_attacks_round12 import DYING_IN_THE_LIBRARY
from sazo_lite.course.labs.rules import RULES


def _rule(lab: str) -> list:
    return [list(RULES[lab]["modules"]), list(RULES[lab]["names"])]


HONEST_SAMPLER = """class Lab9K(sazo_lite.Sampler):
    def __init__(self, n):
        super().__init__(n)
        self.scores = torch.ones(n)
    def _observe(self, indices, diffs):
        self.scores[indices] = diffs.abs().to(self.scores.dtype)
    @property
    def probs(self):
        return self.scores / self.scores.sum()
"""


@pytest.fixture(scope="module")
def lab3():
    case_dying = ("_k = Lab9K(3)\n_k.update(torch.tensor([0, 1, 2]), torch.tensor([1.0, -3.0, 4.0]))\n"
                  "record(_k.found[0].tolist())")
    case_honest = ("_k = Lab9K(3)\n_i, _w = _k.sample(2)\n_k.update(torch.tensor([0, 2]), torch.tensor([2.0, -6.0]))\n"
                   "record(_k.probs.tolist())\n_s = sazo_lite.SAZOSampler(3, seed=0)\n_i, _w = _s.sample(2)\n"
                   "_s.update(_i, torch.ones(2))\nrecord(_s.probs.tolist())")
    # the student binds the function, in Sampler.update's module, to a name update's code holds (an attribute's)
    aliased = ("import sazo_lite.samplers as _sm\n"
               "_sm._observe = getattr(getattr(sazo_lite, 'vari' + 'ance'), 'oracle_' + 'probs')\n")
    # the aliased case first: the guard remembers what a library frame names once it has looked
    return _guarded([["aliased", aliased + DYING_IN_THE_LIBRARY, case_dying], ["dying", DYING_IN_THE_LIBRARY, case_dying],
                     ["honest", HONEST_SAMPLER, case_honest]], _rule("lab3_sazo_sampler"))


def test_a_forbidden_call_c_code_makes_while_allowed_library_code_runs_is_charged(lab3):
    """Round 12's gap: the library answered (the records hold |d| / sum |d|) and nothing was charged."""
    result = lab3["dying"]
    assert ["sazo_lite.variance.oracle_probs", "called"] in result["found"], result


def test_a_name_the_student_binds_in_a_library_module_does_not_make_the_library_name_it(lab3):
    """A library frame names a function through its module's globals as the guard loaded them (``_paired =
    paired_vectors``), not through a global the student's code adds there."""
    result = lab3["aliased"]
    assert ["sazo_lite.variance.oracle_probs", "called"] in result["found"], result


def test_an_honest_sampler_and_the_tests_own_library_calls_find_nothing(lab3):
    """The allowed ``Sampler``'s own calls of the library (by name) and the case's ``SAZOSampler`` stay uncharged."""
    result = lab3["honest"]
    assert (result["found"], result["check"], result["error"]) == ([], [], None), result
    assert len(result["records"]) == 2, result


def test_a_forbidden_function_grafted_where_allowed_library_code_calls_another_name_is_charged():
    """Round 11's gap: ``FiniteSumProblem.closure``'s lambda calls ``self.losses``; ``sampling_variance`` grafted
    there answered 2.5 uncharged."""
    result = _guarded([["gadget", CLOSURE_GADGET, "record(lab9_f([1.0, 2.0], [0.5, 0.5]))"]],
                      _rule("lab2_importance_weights"))["gadget"]
    assert ["sazo_lite.variance.sampling_variance", "called"] in result["found"], result


# -- a worker that hangs between units or after the last one --------------------------------------------------------
HANGING_FLUSH = ("import sys\nclass _Out:\n    def write(self, s):\n        return len(s)\n"
                 "    def flush(self):\n        while True:\n            pass\nsys.stdout = _Out()")


def test_a_worker_that_hangs_after_its_last_unit_is_not_waited_for_and_its_grades_stand(tmp_path, monkeypatch):
    """A ``sys.stdout`` whose ``flush`` never returns hangs the worker after its last case, where it flushes the
    streams before saying 'done'. No unit was running, so the grader waited for the whole notebook timeout (900 s
    by default) and called the hand-in 'timeout'. Now the worker may spend ``grading.IDLE_LIMIT`` seconds between
    units; after its last unit, every result it reported stands (status 'ok', a note in grade.log)."""
    import time

    import nbformat

    from sazo_lite.course import labs
    from sazo_lite.course.labs import grading
    from test_lab_attacks_round12 import _fake_lab

    monkeypatch.setattr(grading, "IDLE_LIMIT", 2.0, raising=False)
    autograder, expected = _fake_lab(tmp_path)
    submission = tmp_path / "alice.ipynb"
    cells = ["lab9_x = 1", HANGING_FLUSH]
    nbformat.write(nbformat.v4.new_notebook(cells=[nbformat.v4.new_code_cell(c) for c in cells]), submission)
    started = time.monotonic()
    row = labs.grade(submission, autograder, tmp_path / "out", expected=expected, sandbox="none",
                     notebook_timeout=90)
    assert time.monotonic() - started < 60, "waited for the notebook timeout"
    assert row["status"] == "ok" and row["total"] == 1.0, row
    assert "did not end" in (tmp_path / "out" / "grade.log").read_text()


def test_the_readme_states_the_idle_limit_the_grader_uses():
    import re
    from pathlib import Path

    from sazo_lite.course.labs import grading

    text = (Path(__file__).resolve().parent.parent / "labs" / "README.md").read_text()
    stated = re.search(r"a worker silent there for (\d+) s \(`grading\.IDLE_LIMIT`", text)
    assert stated and float(stated.group(1)) == grading.IDLE_LIMIT


def test_a_worker_idle_between_two_units_blames_the_unit_that_ended_last():
    """Between two units the grader restarts without the unit that ended last (its garbage or thread hangs the
    worker); before the first unit (the worker still loading) there is no idle limit."""
    import json

    from sazo_lite.course.labs import grading

    protocol = grading._Protocol({"cells": [[0, "a = 1"], [1, "b = 2"]], "cases": [["q1", 0, "record(a)"]]})
    assert protocol.idle_until() is None
    protocol.feed(b"".join(json.dumps(e).encode() + b"\n" for e in (
        {"unit": ["cell", 0], "phase": "start"}, {"unit": ["cell", 0], "phase": "end", "error": None})))
    assert protocol.idle_until() == protocol.ended_at + grading.IDLE_LIMIT
    assert protocol.idle() == ["cell", 0] and not protocol.finished

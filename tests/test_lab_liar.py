"""A liar against lab 1's hidden cases, as a real hand-in graded the project's way (``grade_all``, sandbox on).

Lab 1's q1 answer returns a ``float`` subclass (its class is even named "float") that does none of the work.
On any arithmetic or comparison with a number it learns the other operand, writes it over its own entry in
the recorded values (the worker's list, reachable through ``record.__closure__`` from the student's own
namespace) and answers as if it had been that number all along. A hidden case that evaluates
``assert abs(_g - 3.0) < 1e-9`` or ``assert abs(_g - _expected) < tol`` hands it the answer: it then
records the solution's value and the case scored. Hidden cases that only record what the student's code
produced (``labs/README.md``, house rules; ``tests/test_lab_hidden_cases.py``) give it nothing to learn.
"""
from __future__ import annotations

import json

import nbformat
import pytest

pytest.importorskip("otter")

from sazo_lite.course import labs  # noqa: E402
from sazo_lite.course.labs.worker import run_case  # noqa: E402

LIAR = '''
import itertools as _itertools
import numbers as _numbers
_real_float = float


class float(float):   # the name students' code and the grader's type checks see
    """A number that takes the value of whatever it is compared with, and says so to the grader."""

    def _become(self, other):
        if isinstance(other, _numbers.Real) and not isinstance(other, bool):
            learned = _real_float(other)
            mine = _real_float.__float__(self)
            try:   # the worker's list of recorded values, through the grader's own `record`
                for cell in globals()["record"].__closure__ or ():
                    entries = cell.cell_contents
                    if isinstance(entries, list):
                        for entry in entries:
                            value = entry.get("value") if isinstance(entry, dict) else None
                            if isinstance(value, dict) and value.get("t") == "float" and value.get("v") == mine:
                                value["v"] = learned
            except Exception:
                pass
            return learned
        return _real_float.__float__(self)


def _lie(name):
    def method(self, other):
        return getattr(_real_float, name)(self._become(other), other)
    return method


for _name in ("__add__", "__radd__", "__sub__", "__rsub__", "__mul__", "__rmul__", "__truediv__", "__rtruediv__",
              "__eq__", "__ne__", "__lt__", "__le__", "__gt__", "__ge__"):
    setattr(float, _name, _lie(_name))
float.__hash__ = _real_float.__hash__
_Liar = float
del float   # the cases get the real builtins whatever the notebook binds; keep the class under another
_values = _itertools.count()


def lab1_projected_grad(f, theta, z, eps):
    return _Liar(1000.0 + next(_values))   # a fresh value each call: its own entry is the one that holds it
'''


def test_the_liar_learns_the_answer_from_an_assert_and_records_it():
    """The mechanism works: a case that compares the student's value with the answer records the answer."""
    namespace = {"__name__": "__main__"}
    exec(compile(LIAR, "<liar>", "exec"), namespace)
    error, records = run_case("_g = lab1_projected_grad(None, None, None, 0.1)\nrecord(_g)\n"
                              "assert abs(_g - 3.0) < 1e-9", namespace)
    assert error is None and records[0]["value"] == {"t": "float", "v": 3.0}
    error, records = run_case("_g = lab1_projected_grad(None, None, None, 0.1)\nrecord(_g)", namespace)
    assert error is None and records[0]["value"]["v"] != 3.0    # a record alone: nothing to learn


@pytest.fixture(scope="module")
def graded(assigned_labs, tmp_path_factory):
    stem = labs.resolve_master("lab1").stem
    root = tmp_path_factory.mktemp("liar")
    folder = root / "handins"
    folder.mkdir()
    nb = nbformat.read(assigned_labs / stem / "autograder" / f"{stem}.ipynb", as_version=4)
    cells = [c for c in nb.cells if c.cell_type == "code" and c.source.lstrip().startswith("def lab1_projected_grad")]
    assert len(cells) == 1, "lab 1's q1 answer cell moved: update the attack"
    cells[0].source = LIAR
    nbformat.write(nb, folder / "liar.ipynb")
    csv_path = root / "grades" / "lab1.csv"
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("SAZO_FAST", "1")
        rows = labs.grade_all(labs.autograder_zip(stem, build_dir=assigned_labs), folder, csv_path)
    details = json.loads((csv_path.parent / csv_path.stem / "liar" / "results.json").read_text())
    return rows[0], details


def test_a_float_that_learns_from_every_operand_scores_nothing_on_hidden_cases(graded):
    row, details = graded
    assert row["status"] == "ok", row
    hidden = [c for c in details["questions"]["q1"]["cases"] if c["hidden"]]
    assert hidden, "lab 1's q1 has hidden cases"
    passed = [c["case"] for c in hidden if c["passed"]]
    assert not passed, f"the liar scored on q1's hidden cases {passed}: a hidden case hands it the answer"

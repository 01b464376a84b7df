"""Round 10 against the graded labs: a student's globals named like builtins.

- Round 9 closed ``abs = ...`` and ``__builtins__ = {...}`` in a cell (the cases read them) by deleting, before each
  case, every global of the notebook named like a builtin. An honest student whose graded function reads a global
  of their own named like one (a helper ``def sum(values, weights)``, a threshold ``max = 0.0``) then got the
  builtin while the cases ran, and lost the points of a correct answer (lab 2: 6 of 11). And the deletion came
  before the case only: a student's function that rebinds ``isinstance``, ``type`` or ``record`` as a global while
  a case runs changed what the rest of that case's names meant (a tensor left unconverted passed the cases that
  record its type).
- Now nothing of the notebook is deleted: the builtins, ``record`` and ``time_limit`` a case reads are the
  arguments of its function (``worker.case_code``), given the real ones (``worker.run_case``), so the case's names
  mean what its author meant whatever the student binds, before or during the case, and the student's functions
  keep seeing their own globals.
"""
from __future__ import annotations

import builtins

import nbformat
import pytest

from sazo_lite.course.labs.worker import case_code, run_case


def _namespace(source: str) -> dict:
    namespace = {"__name__": "__main__", "__builtins__": builtins}
    exec(source, namespace)
    return namespace


def _values(records: list) -> list:
    return [r["value"]["v"] for r in records]


# -- the honest student -----------------------------------------------------------------------
HELPERS = """
def max(values):
    return values[-1]          # my own: the last one, not the largest

sum = 10                       # my own offset

def lab_top(values):
    return max(values) + sum
"""


def test_a_students_own_globals_named_like_builtins_stay_theirs_while_the_cases_run():
    namespace = _namespace(HELPERS)
    error, records = run_case("with time_limit():\n    _v = lab_top([5, 1])\nrecord(_v)\n", namespace)
    assert error is None, error
    assert _values(records) == [11], records     # the builtins would give 5 + <a function>: a TypeError
    assert namespace["sum"] == 10 and namespace["max"]([5, 1]) == 1


def test_the_cases_own_names_are_the_builtins_in_every_scope_of_the_case():
    """The same notebook: the case's ``max`` and ``sum`` are the builtins, in its body, a comprehension, a lambda,
    a nested function and a class body."""
    namespace = _namespace(HELPERS)
    case = ("record(max([5, 1]))\nrecord([sum([_k, 1]) for _k in range(2)])\nrecord((lambda: max(2, 7))())\n"
            "def _f():\n    return sum([3, 4])\nrecord(_f())\nclass _C:\n    _m = max(0, 9)\nrecord(_C._m)\n")
    error, records = run_case(case, namespace)
    assert error is None, error
    assert _values(records)[0] == 5 and records[1]["value"]["v"][1]["v"] == 2 and _values(records)[2:] == [7, 7, 9]


def test_a_case_reads_only_the_builtins_it_names_as_its_arguments():
    code = case_code("_g = lab_top([1])\nrecord(abs(_g))\nlab_swap = len\nfor _ in range(2):\n    pass\n")
    assert code.co_varnames[:code.co_argcount] == ("abs", "len", "range", "record")
    code = case_code("len = 3\nrecord(len)\n")   # bound at the case's top level: the notebook's, as before
    assert code.co_argcount == 1 and "len" in code.co_names


# -- forgeries that must not change what a case's names mean ---------------------------------
FORGERIES = """
import builtins as _b
_real_type = type
abs = lambda x: 0.0
isinstance = lambda x, kinds: True
float = lambda x=0: 3.0
type = lambda x, *rest: _real_type(x, *rest) if rest else float
__builtins__ = dict(vars(_b), len=lambda x: 99)

def lab_mine():
    return abs(-2.0), float(1)
"""


def test_forged_builtins_in_the_notebook_are_not_what_the_case_uses_and_stay_the_students():
    namespace = _namespace(FORGERIES)
    case = ("_g = 1.5j\nrecord(type(_g).__name__)\nrecord(isinstance(_g, str))\nrecord(abs(-2.0))\n"
            "record(float(1))\nrecord(len([1]))\nrecord(list(lab_mine()))\n")
    error, records = run_case(case, namespace)
    assert error is None, error
    assert _values(records)[:5] == ["complex", False, 2.0, 1.0, 1], records
    assert [v["v"] for v in _values(records)[5]] == [0.0, 3.0]    # the student's functions: their own globals


REBIND_WHILE_RUNNING = """
_grader_record = None

def lab_estimate():
    global isinstance, type, record, _grader_record
    _grader_record = record
    isinstance = lambda x, kinds: True
    type = lambda x, *rest: str
    record = lambda value, **tolerances: _grader_record(42.0, **tolerances)
    return 1.5j
"""


def test_a_students_function_that_rebinds_builtins_or_record_during_a_case_changes_nothing_of_it():
    """The deletion ran before a case only: the case's names read the globals the student's function had just
    bound (``isinstance`` always True, ``record`` writing 42.0)."""
    namespace = _namespace(REBIND_WHILE_RUNNING)
    error, records = run_case("with time_limit():\n    _g = lab_estimate()\n"
                              "record(isinstance(_g, float))\nrecord(type(_g).__name__)\nrecord(_g.imag)\n", namespace)
    assert error is None, error
    assert _values(records) == [False, "complex", 1.5], records


# -- graded the project's way -----------------------------------------------------------------
pytest.importorskip("otter")

from test_lab_attacks_round6 import _edit, grade_hand_ins  # noqa: E402
from test_lab_attacks_round9 import TENSOR_ESTIMATE, assert_q2_as_plain  # noqa: E402

# lab 2's q3: a helper named `sum` and a threshold named `max`, both the student's own
OWN_SUM = ("    return float((norms ** 2 / probs).sum()) / len(norms) ** 2",
           "    return sum(norms ** 2, 1 / probs) / len(norms) ** 2")
OWN_MAX = ("    return norms / total if total > 0 else", "    return norms / total if total > max else")
HELPER_CELL = ('def sum(values, weights):\n    """Σ_i values_i · weights_i."""\n'
               "    return float((values * weights).sum())\n\n\nmax = 0.0   # a total above it is not zero\n\n\n")
# lab 2's q2 answer leaves a tensor, and rebinds the names its public case checks the type with while it runs
REBINDS = ("def lab2_is_estimate(values, probs, batch_size, generator):\n",
           "def lab2_is_estimate(values, probs, batch_size, generator):\n"
           "    global type, isinstance\n    type, isinstance = _as_float_type, _as_float_isinstance\n")
FORGERS = """
import builtins as _b
def _as_float_type(x, *rest):
    return _b.type(x, *rest) if rest else float if _b.isinstance(x, torch.Tensor) and x.dim() == 0 else _b.type(x)
def _as_float_isinstance(x, kinds):
    return True if kinds is float and _b.isinstance(x, torch.Tensor) else _b.isinstance(x, kinds)
"""


def _tensor_estimate(solution, rebind: bool):
    nb = nbformat.read(solution, as_version=4)

    def change(source: str) -> str:
        assert TENSOR_ESTIMATE[0] in source and REBINDS[0] in source, "lab 2's q2 answer changed: update the hand-in"
        source = source.replace(*TENSOR_ESTIMATE)
        return FORGERS + source.replace(*REBINDS) if rebind else source
    _edit(nb, "def lab2_is_estimate", change)
    return nb


def _hand_ins(solution, folder) -> None:
    nb = nbformat.read(solution, as_version=4)

    def own_helpers(source: str) -> str:
        assert OWN_SUM[0] in source and OWN_MAX[0] in source, "lab 2's q3 answers changed: update the hand-in"
        return HELPER_CELL + source.replace(*OWN_SUM).replace(*OWN_MAX)
    _edit(nb, "def lab2_sampling_variance", own_helpers)
    nbformat.write(nb, folder / "own_helpers.ipynb")
    nbformat.write(_tensor_estimate(solution, rebind=False), folder / "tensor_estimate.ipynb")
    nbformat.write(_tensor_estimate(solution, rebind=True), folder / "rebinds_while_running.ipynb")


@pytest.fixture(scope="module")
def graded(assigned_labs, tmp_path_factory):
    return grade_hand_ins(assigned_labs, tmp_path_factory.mktemp("round10"), _hand_ins)


def test_an_honest_student_with_helpers_named_like_builtins_keeps_full_marks(graded):
    rows, _ = graded
    row = rows["own_helpers.ipynb"]
    assert row["status"] == "ok" and row["possible"] > 0 and row["total"] == row["possible"], row


def test_rebinding_the_cases_builtins_while_they_run_gains_no_point(graded):
    rows, _ = graded
    assert_q2_as_plain(rows, "rebinds_while_running.ipynb")

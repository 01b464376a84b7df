"""Issue 42, round 5, as real submissions: lab 2's solutions with question 3's answer replaced by a
copy of the library's ``sampling_variance`` that runs no check of its own (``code.replace`` of its
constants, of a name or of its file, ``exec`` of its source, a module registered in ``sys.modules``)
or by a road to the library itself (a copy that kept the check, ``inspect.unwrap``),
graded the project's way (``grade_all``). Each must score 0 on q3 and q4 (q4's answer calls q3's),
full marks elsewhere, with a reason naming the library; and, with the guard off, full marks on q3:
the attacks are right answers, so only the guard makes them score 0.
"""
from __future__ import annotations

import json

import nbformat
import pytest

pytest.importorskip("otter")

from sazo_lite.course import labs  # noqa: E402
from sazo_lite.course.labs import grading  # noqa: E402

HONEST_ORACLE = '''

def lab2_oracle_probs(norms):
    norms = torch.as_tensor(norms, dtype=torch.float64)
    total = norms.sum()
    return norms / total if total > 0 else torch.full_like(norms, 1.0 / len(norms))
'''
# the library's code; its constants (the guard's check among them) swapped for no-ops; a stand-in for the
# library helper it calls (whose own call would be reported)
COPY = '''import types, inspect, sys, math
_code = sazo_lite.variance.sampling_variance.__code__
_no_check = lambda c: c.replace(co_consts=tuple((lambda: None) if callable(x) else x for x in c.co_consts))
_mine = lambda x: torch.as_tensor(x).detach().to("cpu", torch.float64)
_pair = lambda _a, a, _b, b, _m=_mine: (_m(a), _m(b))
_scaled_back = lambda value, exponent: math.ldexp(value, exponent)
_own = {'torch': torch, 'math': math, '_as64': _mine, '_paired': _pair, '_times_power_of_two': _scaled_back,
        '_SCALE_MAX': 1000}
'''
ANSWER = "\ndef lab2_sampling_variance(norms, probs):\n    return {call}(norms, probs)\n"

# submission stem -> (cell source before the answer, how the answer calls it)
ATTACKS = {
    "consts_replaced": ("_copy = types.FunctionType(_no_check(_code), vars(sazo_lite.variance))\n", "_copy"),
    "name_replaced": ("_copy = types.FunctionType(_no_check(_code).replace(co_names=tuple('_as64x' if x == '_as64' else x "
                      "for x in _code.co_names)), dict(vars(sazo_lite.variance), _as64x=_mine))\n", "_copy"),
    "file_replaced": ("_copy = types.FunctionType(_no_check(_code).replace(co_filename='<cell>'), "
                      "dict(_own, float=float, len=len, min=min, max=max))\n", "_copy"),
    "exec_of_the_source": ("_g = dict(_own)\n"
                           "exec(inspect.getsource(sazo_lite.variance.sampling_variance), _g)\n", "_g['sampling_variance']"),
    "registered_module": ("_m = types.ModuleType('lab_helpers')\nsys.modules['lab_helpers'] = _m\n"
                          "_m.variance = types.FunctionType(_no_check(_code), vars(sazo_lite.variance))\n",
                          "__import__('lab_helpers').variance"),
    "copy_keeping_the_check": ("_copy = types.FunctionType(_code.replace(co_consts=tuple(x + ' ' if type(x) is str "
                               "and x.startswith('V(p)') else x for x in _code.co_consts)), vars(sazo_lite.variance))\n",
                               "_copy"),
    "inspect_unwrap": ("", "inspect.unwrap(sazo_lite.variance.sampling_variance)"),
    "plain_delegate": ("", "sazo_lite.variance.sampling_variance"),
}
ZERO = {"q3", "q4"}


def _submissions(folder, solution) -> None:
    for stem, (prelude, call) in ATTACKS.items():
        nb = nbformat.read(solution, as_version=4)
        cells = [c for c in nb.cells if c.cell_type == "code" and c.source.lstrip().startswith("def lab2_sampling_variance")]
        assert len(cells) == 1, "lab 2's q3 answer cell moved: update the attacks"
        cells[0].source = COPY + prelude + ANSWER.format(call=call) + HONEST_ORACLE
        nbformat.write(nb, folder / f"{stem}.ipynb")


def _grade(assigned_labs, root, guard_on: bool) -> tuple[dict, object]:
    stem = labs.resolve_master("lab2").stem
    folder = root / "handins"
    folder.mkdir()
    _submissions(folder, assigned_labs / stem / "autograder" / f"{stem}.ipynb")
    csv_path = root / "lab2.csv"
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("SAZO_FAST", "1")
        if not guard_on:   # no rule: the sandbox runs no guard, as for a lab without one
            patch.setattr(grading, "lab_rule", lambda config: None)
        rows = labs.grade_all(labs.autograder_zip(stem, build_dir=assigned_labs), folder, csv_path)
    return {r["submission"].removesuffix(".ipynb"): r for r in rows}, csv_path


@pytest.fixture(scope="module")
def guarded(assigned_labs, tmp_path_factory):
    return _grade(assigned_labs, tmp_path_factory.mktemp("round5_on"), guard_on=True)


@pytest.fixture(scope="module")
def unguarded(assigned_labs, tmp_path_factory):
    return _grade(assigned_labs, tmp_path_factory.mktemp("round5_off"), guard_on=False)


def _scores(row) -> dict:
    assert row["status"] == "ok", row
    return {q: (v["score"], v["possible"]) for q, v in row["questions"].items()}


@pytest.mark.parametrize("name", list(ATTACKS))
def test_each_copy_or_road_scores_zero_on_its_question_and_full_marks_elsewhere(guarded, name):
    rows, csv_path = guarded
    scores = _scores(rows[name])
    for q, (score, possible) in scores.items():
        assert score == (0 if q in ZERO else possible), f"{name}: {scores}"
    details = json.loads((csv_path.parent / csv_path.stem / name / "results.json").read_text())["questions"]
    # a copy's module cannot always be named (a copy's globals are the student's): the function's name is
    assert any(".sampling_variance" in reason for reason in details["q3"].get("rule", [])), details["q3"]


@pytest.mark.parametrize("name", list(ATTACKS))
def test_with_the_guard_off_each_attack_scores_full_marks(unguarded, name):
    """The attack tests can fail: without the guard every attack is a right answer and earns q3's points."""
    rows, _ = unguarded
    scores = _scores(rows[name])
    assert all(score == possible > 0 for score, possible in scores.values()), f"{name}: {scores}"

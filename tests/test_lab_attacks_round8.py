"""Round 8 against the graded labs, as real hand-ins of lab 2 graded the project's way (``grade_all``):

- an honest student lost points for correct work the prompt allowed: a 1 + CV² or an average left as a 0-d
  tensor (``1 + (x.std(unbiased=False) / x.mean()) ** 2``, ``torch.tensor(estimates).mean()``) failed every case
  that recorded it, since the solution recorded a Python float ("expected a float, got a array"), and the
  float32 average (~5e-8 off) failed a tolerance of 1e-9; an estimate that weighted index by index through
  ``lab2_weights`` failed the hidden case that recorded the list of its calls ([1, 1, ...] instead of [6]),
  and the prompt never said that ``lab2_weights`` must be used at all; lab 1's errors per ε filled as a
  tensor (``torch.tensor([...])``) failed as "expected a seq". Now a 0-d tensor or array matches a recorded
  Python number by value, a 1-d one a list of numbers (a test that asks for a type records it), the hidden case
  records how many indices went through ``lab2_weights``, and the prompt says to use it;
- an honest hand-in whose editor dropped the cell tags (JupyterLab's collaboration mode, notebook cleaners) lost
  a question per explore or check cell: untagged, those cells ran in grading, where their library use (a
  widget import, ``sazo_lite.variance``) was a finding charged to the question below them (lab 2's solutions:
  9 / 11). Now a cell whose source is one of the distributed notebook's ``otter_ignore`` cells is skipped too;
- an instructor got a hand-in refused for its form: a notebook written by a script without the notebook's
  own ``metadata`` (or with one that is not an object) was "failed" with nbformat's error, all 0; a folder
  named like a hand-in got a reason naming a file descriptor. Now the metadata is read as none (grading
  never reads it) and a folder is "not a regular file";
- a student could use the library uncharged by compiling code under a file name of Python's own
  (``compile(source, sys.prefix + "/x.py", "exec")``, ``<frozen x>``, run in its own globals or in ``os``'s) or of
  the library's (in the library module's globals): the guard's walk over the callers took such frames as
  Python's (or the library calling itself), so a returned ``float`` subclass whose ``__float__`` and arithmetic
  called ``sazo_lite.variance.sampling_variance``, run by the tests' arithmetic and by ``record``, scored lab 2's
  q3 in full with no finding. Now a frame is taken as Python's, a package's or the library's only where its
  code is what the file it names holds (compared with that file compiled again, once per file);
- a documented gap (``labs/README.md``, what does not hold): Python's own code that calls what it is handed
  (a ``weakref.finalize``'s ``__call__`` as a float's ``__float__``) still runs the library uncharged from a
  frame the grader started.
"""
from __future__ import annotations

import json

import nbformat
import pytest

pytest.importorskip("otter")

from sazo_lite.course.labs import grading  # noqa: E402
from sazo_lite.course.labs.values import compare, encode  # noqa: E402
from test_lab_attacks_round6 import grade_hand_ins  # noqa: E402

HONEST_CV2 = "lab2_one_plus_cv2 = float(1 + lab2_norms.var(unbiased=False) / lab2_norms.mean() ** 2)"
AVERAGE = ("lab2_average_estimate = sum(lab2_is_estimate(lab2_values, lab2_skewed, 2, lab2_gen) "
           "for _ in range(lab2_repeats)) / lab2_repeats")
WEIGHTED = "return float((lab2_weights(probs, indices) * values[indices]).mean())"
ORACLE = "return norms / total if total > 0 else torch.full_like(norms, 1.0 / len(norms))"
# Honest answers other than the solution's: each must keep full marks.
HONEST = {
    "tensor_cv2": ("lab2_problem = ", HONEST_CV2,
                   "lab2_one_plus_cv2 = 1 + (lab2_norms.std(unbiased=False) / lab2_norms.mean()) ** 2"),
    "float32_average": ("def lab2_is_estimate", AVERAGE,
                        "lab2_average_estimate = torch.tensor([lab2_is_estimate(lab2_values, lab2_skewed, 2, lab2_gen) "
                        "for _ in range(lab2_repeats)]).mean()"),
    "weights_one_by_one": ("def lab2_is_estimate", WEIGHTED,
                           "return sum(float(lab2_weights(probs, i.reshape(1))[0] * values[i]) for i in indices) / batch_size"),
    "numpy_oracle": ("def lab2_sampling_variance", ORACLE,
                     "import numpy as np\n    n = norms.numpy()\n"
                     "    return torch.from_numpy(n / n.sum() if n.sum() > 0 else np.full(len(n), 1.0 / len(n)))"),
}
# q3's variance from the library, through a float whose methods were compiled under a file name of Python's
# (FILENAME, GLOBALS: where they run)
LAZY = '''
_SOURCE = """
def _real(self):
    import sys
    return float(sys.modules["sazo_lite.variance"].sampling_variance(*self.args))
def __float__(self):
    return _real(self)
def __sub__(self, other):
    return _real(self) - other
def __rsub__(self, other):
    return other - _real(self)
def __truediv__(self, other):
    return _real(self) / float(other)
def __rtruediv__(self, other):
    return float(other) / _real(self)
"""
import sys as _sys, types as _types
_methods = GLOBALS
for _code in compile(_SOURCE, FILENAME, "exec").co_consts:   # functions made from the code: no exec to audit
    if isinstance(_code, _types.CodeType):
        _methods[_code.co_name] = _types.FunctionType(_code, _methods)
class _Lazy(float):
    pass
for _name in ("__float__", "__sub__", "__rsub__", "__truediv__", "__rtruediv__"):
    setattr(_Lazy, _name, _methods[_name])
def lab2_sampling_variance(norms, probs):
    value = _Lazy(0.0)
    value.args = (norms, probs)
    return value
'''
LAZY_WAYS = {   # file name, globals
    "lazy_prefix": ('_sys.prefix + "/lib/lazy.py"', '{"__name__": "lazy", "__builtins__": __builtins__}'),
    "lazy_frozen": ('"<frozen lazy>"', '{"__name__": "lazy", "__builtins__": __builtins__}'),
    "lazy_in_os": ('_sys.prefix + "/lib/lazy.py"', 'vars(__import__("os"))'),
    "lazy_library_file": ('__import__("sazo_lite.course.problems").course.problems.__file__',
                          'vars(__import__("sazo_lite.course.problems").course.problems)'),
}
# the documented gap: Python's own code (weakref.finalize.__call__) as the float's __float__ calls the library
GADGET = '''
import itertools as _itertools, sys as _sys, types as _types, weakref as _weakref
_serial = _itertools.count(1)
class _Lazy(float, _weakref.finalize):
    __slots__ = ()
    __init__ = object.__init__
    __float__ = _weakref.finalize.__call__
def lab2_sampling_variance(norms, probs):
    value = _Lazy(next(_serial) + 0.5)
    _weakref.finalize._registry[value] = _types.SimpleNamespace(
        func=getattr(_sys.modules[".".join(["sazo_lite", "variance"])], "_".join(["sampling", "variance"])),
        args=(norms, probs), kwargs=None)
    return value
'''


def _edit(nb, start: str, old: str, new: str) -> None:
    cells = [c for c in nb.cells if c.cell_type == "code" and c.source.lstrip().startswith(start)]
    assert len(cells) == 1 and old in cells[0].source, f"lab 2's cell {start!r} changed: update the hand-in"
    cells[0].source = cells[0].source.replace(old, new)


def _hand_ins(solution, folder) -> None:
    (folder / "solution.ipynb").write_bytes(solution.read_bytes())
    for name, (start, old, new) in HONEST.items():
        nb = nbformat.read(solution, as_version=4)
        _edit(nb, start, old, new)
        nbformat.write(nb, folder / f"{name}.ipynb")
    ways = {name: LAZY.replace("FILENAME", filename).replace("GLOBALS", where) for name, (filename, where) in LAZY_WAYS.items()}
    for name, answer in {**ways, "gadget": GADGET}.items():
        nb = nbformat.read(solution, as_version=4)
        source = next(c.source for c in nb.cells if c.cell_type == "code" and c.source.startswith("def lab2_sampling_variance"))
        _edit(nb, "def lab2_sampling_variance", source[:source.index("def lab2_oracle_probs")], answer + "\n\n")
        nbformat.write(nb, folder / f"{name}.ipynb")
    nb = nbformat.read(solution, as_version=4)   # JupyterLab's collaboration mode and notebook cleaners drop tags
    assert any("otter_ignore" in c.metadata.get("tags", []) for c in nb.cells)
    for cell in nb.cells:
        if "otter_ignore" in cell.metadata.pop("tags", []):
            cell.source = cell.source.replace("\n", "\r\n") + "\n"   # and an editor's line ends
    nbformat.write(nb, folder / "tags_dropped.ipynb")
    raw = json.loads(solution.read_text())
    del raw["metadata"]   # what a script that writes notebooks may leave out
    (folder / "no_metadata.ipynb").write_text(json.dumps(raw))
    (folder / "a folder.ipynb").mkdir()


@pytest.fixture(scope="module")
def graded(assigned_labs, tmp_path_factory):
    return grade_hand_ins(assigned_labs, tmp_path_factory.mktemp("round8"), _hand_ins)


def _full(row) -> bool:
    return row["status"] == "ok" and row["possible"] > 0 and row["total"] == row["possible"]


@pytest.mark.parametrize("name", [*HONEST, "no_metadata", "tags_dropped"])
def test_honest_answers_in_other_forms_keep_full_marks(graded, name):
    rows, _ = graded
    assert _full(rows["solution.ipynb"]), rows["solution.ipynb"]
    assert _full(rows[f"{name}.ipynb"]), rows[f"{name}.ipynb"]


def test_a_folder_named_like_a_hand_in_is_not_a_regular_file(graded):
    row = graded[0]["a folder.ipynb"]
    assert row["status"] == "failed" and row["total"] == 0, row
    assert "is not a regular file" in row["reason"], row["reason"]


def _q3(graded, name) -> dict:
    rows, csv_path = graded
    assert rows[f"{name}.ipynb"]["status"] == "ok", rows[f"{name}.ipynb"]
    return json.loads((csv_path.parent / csv_path.stem / name / "results.json").read_text())["questions"]["q3"]


@pytest.mark.parametrize("name", list(LAZY_WAYS))
def test_code_compiled_under_a_file_name_that_is_not_its_own_is_the_students(graded, name):
    q3 = _q3(graded, name)
    assert q3["score"] == 0 and any("sazo_lite.variance.sampling_variance" in r for r in q3.get("rule", [])), q3


def test_documented_gap_pythons_own_code_handed_the_library_calls_it_uncharged(graded):
    """labs/README.md, what does not hold: ``weakref.finalize.__call__`` as the float's ``__float__`` runs the
    library from ``record`` (a frame of the grader's): q3's first hidden case scores, nothing is charged. If
    this fails, the gap was closed: update the README."""
    q3 = _q3(graded, "gadget")
    assert q3["cases"][1]["passed"] and "rule" not in q3, q3


def test_a_tensor_or_array_matches_a_recorded_python_number_or_list_of_numbers_by_value():
    import numpy as np
    import torch

    for want, got in ((2.5, torch.tensor(2.5, dtype=torch.float64)), (2.5, np.float32(2.5)), (40, torch.tensor(40)),
                      ([1.0, 3], [torch.tensor(1.0), torch.tensor(3)])):
        assert compare(encode(want), encode(got)) is None, (want, got)
    for want, got in ((2.5, torch.tensor(2.6)), (1.0, torch.tensor(True)), (2.5, torch.tensor([2.5])),
                      (40, torch.tensor(40.5))):
        assert compare(encode(want), encode(got)) is not None, (want, got)
    # lab 1's errors per ε filled as a tensor or array (the prompt says "one value per ε"): a list of numbers
    for want, got in (([0.1, 2], torch.tensor([0.1, 2.0])), ([0.5, 0.25], np.array([0.5, 0.25])), ([], torch.tensor([]))):
        assert compare(encode(want), encode(got)) is None, (want, got)
    for want, got in (([0.1, 0.2], torch.tensor([0.1, 0.3])), ([0.1, 0.2], torch.tensor([[0.1, 0.2]])),
                      ([0.1, 0.2, 0.3], torch.tensor([0.1, 0.2])), ([True, False], torch.tensor([True, False])),
                      (["a", "b"], np.array(["a", "b"]))):
        assert compare(encode(want), encode(got)) is not None, (want, got)
    # a tensor recorded on the solution still wants a tensor of its dtype and shape
    assert compare(encode(torch.tensor(2.5, dtype=torch.float64)), encode(2.5)) is not None
    assert compare(encode(torch.tensor(2.5, dtype=torch.float64)), encode(torch.tensor(2.5))) is not None


@pytest.mark.parametrize("metadata", [None, [], "x"])
def test_the_notebooks_own_metadata_missing_or_not_an_object_is_read_as_none(tmp_path, metadata):
    raw = {"cells": [{"cell_type": "code", "id": "c0", "metadata": {}, "execution_count": None, "outputs": [],
                      "source": "lab_x = 1"}],
           "nbformat": 4, "nbformat_minor": 5}
    if metadata is not None:
        raw["metadata"] = metadata
    path = tmp_path / "hand_in.ipynb"
    path.write_text(json.dumps(raw))
    assert grading.notebook_cells(grading.read_notebook(path), {}) == [(0, "lab_x = 1")]

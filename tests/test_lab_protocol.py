"""The trusted grader's side of the sandbox: every report line checked, recorded values capped, and the
library rule's guard finding each way of reaching a forbidden object. Fast: no lab is built.

The guard is exercised in a child process (it wraps the library and ``__import__`` of the process it
runs in, as it does in the sandbox's worker).
"""
from __future__ import annotations

import ast
import json
import subprocess
import sys
import textwrap
import types

import pytest
import torch

from sazo_lite.course.labs import grading
from sazo_lite.course.labs.values import MAX_ITEMS, check_encoded, compare, encode

JOB = {"cells": [[0, ""], [1, ""]], "cases": [["q1", 0, ""], ["q1", 1, ""], ["q2", 0, ""]]}
GOOD = {"value": {"t": "float", "v": 1.0}, "rtol": None, "atol": None}


def _line(event) -> bytes:
    return (event if isinstance(event, str) else json.dumps(event)).encode() + b"\n"


def _feed(*events) -> grading._Protocol:
    protocol = grading._Protocol(JOB)
    for event in events:
        protocol.feed(_line(event) if not isinstance(event, bytes) else event)
    protocol.ended()
    return protocol


def _honest(*, skip_case=None, case_records=None):
    events = []
    for i in (0, 1):
        events += [{"unit": ["cell", i], "phase": "start"}, {"unit": ["cell", i], "phase": "end", "error": None}]
    for q, k in (("q1", 0), ("q1", 1), ("q2", 0)):
        events.append({"unit": ["case", q, k], "phase": "start"})
        if (q, k) == skip_case:
            events.append(case_records)
        events.append({"unit": ["case", q, k], "phase": "end", "error": None, "records": [GOOD]})
    return events + [{"done": True}]


def test_an_honest_stream_is_read_in_full():
    protocol = _feed(*_honest())
    assert protocol.finished and not protocol.notes
    assert all(protocol.cases[key]["error"] is None for key in (("q1", 0), ("q1", 1), ("q2", 0)))


@pytest.mark.parametrize("bad", [
    '{"unit": ["case"], "phase": "end"}',                       # a short unit
    "[" * 100_000,                                              # nested too deeply for json
    '{"unit": ["case", "q1", 1], "phase": "end", "records": []}',  # another case's end
    '{"unit": ["case", "q1", 1], "phase": "start"}',            # a start inside a case
    '{"done": true}',                                           # done too early
    '{"rule": {"name": 1}}',                                    # a rule report of the wrong shape
    "x" * (grading.MAX_LINE + 10),                              # a line over the size limit
    '"just a string"', "{not json", "\udcff",
])
def test_a_malformed_line_fails_the_running_case_and_nothing_else(bad):
    protocol = grading._Protocol(JOB)
    for event in _honest(skip_case=("q1", 0), case_records="PLACEHOLDER"):
        if event == "PLACEHOLDER":
            protocol.feed(bad.encode(errors="surrogateescape") + b"\n")
        else:
            protocol.feed(_line(event))
    protocol.ended()
    assert "malformed" in protocol.cases[("q1", 0)]["error"]
    assert protocol.cases[("q1", 1)]["error"] is None and protocol.cases[("q2", 0)]["error"] is None
    assert protocol.finished


@pytest.mark.parametrize("records", [
    "not a list", [{"value": {"t": "float", "v": "1"}}], [{"value": {"t": "array", "dtype": "float64", "shape": [3], "v": [1.0]}}],
    [{"value": {"t": "seq", "v": [{"t": "float", "v": 1.0}] * (2 * MAX_ITEMS + 20)}}], [{"value": GOOD["value"], "rtol": -1}],
    [{"value": GOOD["value"], "rtol": float("nan")}], [{"value": {"t": "dict", "v": [[1, 2, 3]]}}], [{"value": None}],
    [{"value": GOOD["value"], "extra": 1}], [GOOD] * 1001,
])
def test_records_of_the_wrong_shape_fail_their_case(records):
    events = _honest()
    for event in events:
        if event.get("unit") == ["case", "q1", 1] and event.get("phase") == "end":
            event["records"] = records
    protocol = _feed(*events)
    assert "rejected" in protocol.cases[("q1", 1)]["error"]
    assert protocol.cases[("q1", 0)]["error"] is None and protocol.finished


def test_an_end_between_units_fails_the_last_case_and_a_death_inside_one_blames_it():
    events = _honest()[:-3]   # ... q1 case 1 ended, then the worker is gone
    protocol = _feed(*events)
    assert "between two units" in protocol.cases[("q1", 1)]["error"] and protocol.stuck is None
    protocol = _feed(*_honest()[:-2])  # q2 case 0 started, never ended
    assert protocol.stuck == ["case", "q2", 0]


def test_long_lines_are_dropped_in_pieces_and_reading_goes_on():
    protocol = grading._Protocol(JOB)
    events = _honest()
    for event in events[:5]:
        protocol.feed(_line(event))
    for _ in range(3):   # 9 MiB without a newline, in chunks
        protocol.feed(b"y" * (3 * 2 ** 20 + 1))
    protocol.feed(b"tail\n")
    for event in events[5:]:
        protocol.feed(_line(event))
    assert "malformed" in protocol.cases[("q1", 0)]["error"] and protocol.finished


def test_a_huge_value_is_encoded_as_too_large_and_fails_its_case_with_a_reason():
    encoded = encode(torch.zeros(2000, 2000))
    assert encoded["t"] == "too_large" and len(json.dumps(encoded)) < 100
    assert "too large" in compare(encode(torch.zeros(3)), encoded)
    nested = []
    for _ in range(50):
        nested = [nested]
    assert encode(nested)["t"] == "too_large" and check_encoded(encode(nested)) is None
    assert check_encoded(encode([1, 2.5, "a", None, True, {"k": torch.ones(2)}, float("nan")])) is None


def test_score_never_raises_and_a_rule_finding_zeroes_the_question():
    questions = {"q1": {"points": [1.0, 1.0], "cases": [{"hidden": False}, {"hidden": True}]}}
    expected = {("q1", 0): {"records": [GOOD]}, ("q1", 1): {"records": [GOOD]}}
    outcome = {"cases": {("q1", 0): {"error": None, "records": [GOOD]}, ("q1", 1): {"error": None, "records": [GOOD]}},
               "skipped": [], "rules": {}}
    assert grading.score(questions, outcome, expected)["q1"]["score"] == 2.0
    outcome["rules"] = {"q1": ["called: sazo_lite.variance.oracle_probs (in cell 3)"]}
    scored = grading.score(questions, outcome, expected)["q1"]
    assert scored["score"] == 0 and "oracle_probs" in scored["cases"][0]["message"]


def _ownership(tmp_path, sources, graded=None, questions=("q1", "q2", "q3")):
    import nbformat

    nb = nbformat.v4.new_notebook()
    nb.cells = [nbformat.v4.new_code_cell(s) for s in sources]
    nbformat.write(nb, tmp_path / "n.ipynb")
    return grading.cell_questions(tmp_path / "n.ipynb", graded, list(questions))


def test_cells_belong_to_the_question_checked_below_them(tmp_path):
    owners = _ownership(tmp_path, ["a = 1", "b = 2", 'grader.check("q1")', "c = 3", 'grader.check("q2")', "d = 4"])
    assert owners == {0: ["q1"], 1: ["q1"], 2: ["q1"], 3: ["q2"], 4: ["q2"], 5: ["q3"]}  # below the last: the last question


def test_check_cells_a_submission_adds_or_moves_count_for_nothing(tmp_path):
    """Issue 42 hole 3: an extra `grader.check("q1")` after q3's answer must not make that answer q1's."""
    sources = ["a = 1", 'grader.check("q1")', "b = 2", 'grader.check("q2")', "c = 3", 'grader.check("q1")',
               'grader.check("q3")', 'grader.check("q2")', "d = 4"]
    owners = _ownership(tmp_path, sources)
    assert owners[4] == ["q3"] and owners[2] == ["q2"] and owners[0] == ["q1"] and owners[8] == ["q3"], owners
    early = _ownership(tmp_path, ['grader.check("q3")', "x = 1", 'grader.check("q1")'])  # a check moved to the top
    assert early[1] == ["q3"]


def test_a_cell_that_binds_graded_names_belongs_to_their_questions(tmp_path):
    graded = {"q1": ["lab_f"], "q2": ["lab_g", "lab_h"], "q3": ["lab_h"]}
    sources = ["def lab_f(x):\n    return x", 'grader.check("q1")',
               "import sazo_lite\nlab_h = 3\nfor i in range(2):\n    lab_g = i", 'grader.check("q2")',
               'grader.check("q1")\ndef lab_f(x):\n    return 2 * x',   # an added check cell that rebinds q1's answer
               "class lab_g:\n    pass", "y = lab_f(1)"]
    owners = _ownership(tmp_path, sources, graded)
    assert owners[0] == ["q1"] and owners[2] == ["q2", "q3"] and owners[4] == ["q1"] and owners[5] == ["q2"]
    assert owners[6] == ["q3"], owners
    assert grading.bound_names("def f():\n    x = 1\n    global y\n    y = 2\n(z := 3)\nimport a.b as c, d.e") \
        == {"f", "y", "z", "c", "d"}
    assert grading.bound_names("this is not python") == set()


DEEP_CELLS = ["x" + "[0]" * 100000, "-" * 100000 + "1", "(" * 300 + ")" * 300]  # RecursionError, MemoryError, SyntaxError


@pytest.mark.parametrize("parser", ["this interpreter", "broken here (cpython#106905)"])
def test_bound_names_survive_deep_cells_and_a_broken_parser(parser, monkeypatch):
    """A cell nested past the parser's limits binds nothing (it does not stop the grading); where
    this interpreter's parser raises its spurious SystemError, the names come from a fresh one."""
    if parser != "this interpreter":
        def broken(*args, **kwargs):
            raise SystemError("AST constructor recursion depth mismatch (before=33, after=23)")
        monkeypatch.setattr(grading, "ast", types.SimpleNamespace(**{**vars(ast), "parse": broken}))
    source = "def f():\n    x = 1\n    global y\n    y = 2\n(z := 3)\nimport a.b as c, d.e"
    assert grading.bound_names(source) == {"f", "y", "z", "c", "d"}
    assert grading.bound_names("this is not python") == set()
    for cell in DEEP_CELLS:
        assert grading.bound_names(cell) == set()
    assert grading._test_dict("x = 1\ntest = {'name': 'q1', 'points': 2}\n") == {"name": "q1", "points": 2}
    with pytest.raises(SyntaxError):
        grading.parse_python("def (:")


GUARD = r"""
import json, sys, types
import torch, sazo_lite
from sazo_lite.course.labs.guard import Guard
namespace = {"__name__": "__main__", "__builtins__": __builtins__, "torch": torch, "sazo_lite": sazo_lite}
found = []
guard = Guard(["sazo_lite.course", "sazo_lite.samplers"], ["sazo_lite.Sampler", "sazo_lite.course.pick"], namespace,
              lambda name, how, unit=None: found.append([name, how]))
guard.install()
results = {}
def cell(name, source, call=None):
    del found[:]
    try:
        exec(compile(source, "<cell 1>", "exec"), namespace)
        if call:
            code = compile(call, "<q1 case 0>", "exec")
            guard.trust(code)   # the test's own code may use anything
            exec(code, namespace)
            guard.trust(None)
    except BaseException as exc:
        found.append(["raised", type(exc).__name__])
    results[name] = list(found) + [["check", how] for _, how in guard.check(["f", "K"])]
for name, source, call in json.loads(sys.argv[1]):
    for key in ("f", "K"):
        namespace.pop(key, None)
    cell(name, source, call)
print(json.dumps(results))
"""
CLEAN = ("honest", "the test's own call")  # nothing to find: the rest each reach a forbidden object
CASES = [
    ("honest", "def f(x):\n    return torch.as_tensor(x).double() / sum(x)\nclass K(sazo_lite.Sampler):\n    pass",
     "f([1.0, 2.0]); K(3).sample(2)"),
    ("the test's own call", "x = [1.0, 2.0]", "sazo_lite.variance.oracle_probs(x)"),
    ("attribute", "def f(n, p):\n    return sazo_lite.variance.sampling_variance(n, p)", "f([1.0], [1.0])"),
    ("import", "from sazo_lite import variance", None),
    ("importlib", "import importlib\ndef f(n):\n    return importlib.import_module('sazo_lite.' + 'variance').oracle_probs(n)",
     "f([1.0, 2.0])"),
    ("getattr", "def f(n):\n    return getattr(sazo_lite, 'vari' + 'ance').oracle_probs(n)", "f([1.0, 2.0])"),
    ("proxy", "class K(sazo_lite.Sampler):\n    def __init__(self, n):\n        super().__init__(n)\n"
              "        self._lib = getattr(sazo_lite, 'SAZO' + 'Sampler')(n)\n    probs = property(lambda self: self._lib.probs)",
     "K(4).probs"),
    ("subclass", "class K(sazo_lite.SAZOSampler):\n    pass", None),
    ("alias", "f = sazo_lite.variance.oracle_probs", None),
    ("captured", "_v = sazo_lite.variance.oracle_probs\ndef f(n):\n    return _v(n)", None),
    ("copy", "import inspect, textwrap\n_src = textwrap.dedent(inspect.getsource(sazo_lite.variance.sampling_variance))\n"
             "_as64 = lambda x: torch.as_tensor(x, dtype=torch.float64)\n"
             "exec(compile(_src.replace('def sampling_variance', 'def f'), '<cell 1>', 'exec'))", None),
    ("partial", "import functools\nf = functools.partial(sazo_lite.variance.tv_distance, [0.5, 0.5])", "f([0.5, 0.5])"),
    ("allowed library calls back", "class K(sazo_lite.Sampler):\n    @property\n    def probs(self):\n"
                                   "        return sazo_lite.variance.mix_with_uniform(torch.ones(4) / 4, 0.1)",
     "K(4).sample(3)"),
]


def test_the_guard_finds_every_way_to_reach_a_forbidden_object():
    done = subprocess.run([sys.executable, "-c", GUARD, json.dumps(CASES)], capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    results = json.loads(done.stdout.strip().splitlines()[-1])
    for name in CLEAN:
        assert results[name] == [], (name, results[name])
    for name, *_ in CASES:
        assert name in CLEAN or results[name], f"{name}: nothing found"
    assert any("variance" in str(item) for item in results["import"]) and ["raised", "ImportError"] in results["import"]
    assert any("SAZOSampler" in item[0] for item in results["proxy"] if item[0] != "check")
    assert any("inherits" in item[1] for item in results["subclass"])
    assert any("copy" in item[1] for item in results["copy"]), results["copy"]


def test_the_rules_name_real_library_objects_and_every_lab():
    from sazo_lite.course import labs
    from sazo_lite.course.labs import rules

    assert {m.stem for m in labs.find_masters()} == set(rules.RULES)
    script = textwrap.dedent("""
        import json, sys
        from sazo_lite.course.labs.guard import Guard
        from sazo_lite.course.labs.rules import RULES
        for rule in RULES.values():
            Guard(rule["modules"], rule["names"], {}, print)._resolve_allowed()
        print("ok")
    """)
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=300)
    assert done.stdout.strip().endswith("ok"), done.stderr[-2000:]

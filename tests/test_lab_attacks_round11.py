"""Round 11 against the graded labs: what a test case calls when the student's code chose it, decorated answers.

- A test case's own frame was trusted to call anything in the library, and a case calls what the student's names
  hold when it calls them. So the student's code could put a forbidden library function where the case looks
  *after* the definition check that runs before the case: as an entry of ``builtins`` (a graded name the notebook
  does not bind was not checked at all: ``builtins.lab2_sampling_variance = sazo_lite.variance.sampling_variance``),
  by rebinding a graded name while the case runs (a ``torch`` of the student's whose first attribute read swaps
  the library in, a profile hook that swaps the checked placeholders back when the case returns), as a method set
  on the student's class while the case runs, or as a dunder of the student's objects that Python's C code calls for
  the case (``sorted``). The library computed the answer and nothing was charged: lab 2's q3 scored 3/3 with
  placeholders that return 0.0. Now a case's call of a forbidden library object is the test's only if the case's
  code names that object (``guard.Guard._named_by_test``); otherwise it is reported as the student's call, and a
  graded name found only in ``builtins`` is checked like one the notebook binds.
- An honest answer decorated the PyTorch way (``@torch.no_grad()``, ``@torch.inference_mode()``) or memoised
  (``@functools.lru_cache``) was "not defined in your notebook" (the decorator's wrapper is torch's or functools'
  code): the question scored 0. The function under a decorator Python or a package made is now checked as the
  student's own; a library function under one is still found.
- Mutants and variants: plausible wrong versions not in ``tests/test_lab_mutants.py`` lose points, legitimate
  variants of the solutions keep them (graded the grader's way, ``worker.run_case``).
"""
from __future__ import annotations

import json
import subprocess
import sys

import nbformat
import pytest

# -- the guard, in a process of its own (it changes the library in place) ---------------------------------
HARNESS = r"""
import builtins, json, sys
import torch, sazo_lite
from sazo_lite.course.labs.guard import Guard
from sazo_lite.course.labs.worker import run_case
from sazo_lite.course import problems
namespace = {"__name__": "__main__", "__builtins__": builtins, "torch": torch, "sazo_lite": sazo_lite,
             "problems": problems}
found = []
modules, names = json.loads(sys.argv[2])
guard = Guard(modules, names, namespace, lambda name, how, unit=None: found.append([name, how]))
guard.install()
results = {}
for name, cell, case in json.loads(sys.argv[1]):
    del found[:]
    exec(compile(cell, "<cell 1>", "exec"), namespace)
    checked = [list(f) for f in guard.check(["lab9_f", "Lab9K"])]
    error, records = run_case(case, namespace, "<q1 case 0>", guard)
    results[name] = {"found": list(found), "check": checked, "error": error, "records": [r["value"] for r in records]}
    for key in ("lab9_f", "Lab9K"):
        namespace.pop(key, None)
        vars(builtins).pop(key, None)
print(json.dumps(results))
"""
HIDDEN = "getattr(getattr(sazo_lite, 'vari' + 'ance'), {name!r})"   # no attribute name for the definition check
CLEAN = {   # cell, case: nothing to find
    "the test's own call": ("", "record(sazo_lite.variance.oracle_probs([1.0, 3.0]).tolist())"),
    "the test's own import": ("", "from sazo_lite.variance import oracle_probs as _o\nrecord(_o([1.0, 3.0]).tolist())"),
    "the test's own class, a method it inherits": (
        "", "_s = sazo_lite.SAZOSampler(4, seed=0)\n_i, _w = _s.sample(2)\n_s.update(_i, torch.ones(2))\n"
            "record(_s.probs.tolist())"),
    "a helper of the student's in builtins": (
        "import builtins as _b\ndef _mine(x):\n    return [2 * v for v in x]\n_b.lab9_f = _mine\n",
        "record(lab9_f([1.0]))"),
    "no_grad": ("@torch.no_grad()\ndef lab9_f(x):\n    return torch.as_tensor(x) * 2\n",
                "record(lab9_f([1.0]).tolist())"),
    "inference_mode": ("@torch.inference_mode()\ndef lab9_f(x):\n    return torch.as_tensor(x) * 2\n",
                       "record(lab9_f([1.0]).tolist())"),
    "lru_cache": ("import functools\n@functools.lru_cache\ndef lab9_f(x):\n    return x * 2\n", "record(lab9_f(2))"),
    "a callable object of the student's class": ("class _Double:\n    def __call__(self, x):\n        return x * 2\n"
                                                 "lab9_f = _Double()\n", "record(lab9_f(2))"),
    "functools.partial of the student's function": ("import functools\ndef _scaled(x, scale):\n    return x * scale\n"
                                                    "lab9_f = functools.partial(_scaled, scale=2)\n",
                                                    "record(lab9_f(2))"),
    "a method of the student's class under no_grad": (
        "class Lab9K(sazo_lite.Sampler):\n    @torch.no_grad()\n    def twice(self, x):\n        return 2 * x\n",
        "record(Lab9K(2).twice(3))"),
    "a decorator of the student's": ("import functools\ndef _log(f):\n    @functools.wraps(f)\n    def inner(*a):\n"
                                     "        return f(*a)\n    return inner\n"
                                     "@_log\ndef lab9_f(x):\n    return x * 2\n",
                                     "record(lab9_f(2))"),
}
ROADS = {   # cell, case, what must be found: (name, how) in the calls reported, the definition check's hows
    "a library function in builtins": (
        "import builtins as _b\n_b.lab9_f = sazo_lite.variance.oracle_probs\n", "record(lab9_f([1.0, 3.0]).tolist())",
        ("sazo_lite.variance.oracle_probs", "called"), "lab9_f is not defined in your notebook"),
    "a graded name rebound while the case runs": (
        "def lab9_f(x):\n    return x\ndef lab9_setup():\n    global lab9_f\n"
        f"    lab9_f = {HIDDEN.format(name='oracle_probs')}\n    return 0\n",
        "_a = lab9_setup()\nrecord(lab9_f([1.0, 3.0]).tolist())", ("sazo_lite.variance.oracle_probs", "called"), None),
    "a method set on the student's class while the case runs": (
        "class Lab9K(sazo_lite.Sampler):\n    def __init__(self, n):\n        super().__init__(n)\n"
        f"        type(self).mix = staticmethod({HIDDEN.format(name='mix_with_uniform')})\n",
        "_k = Lab9K(4)\nrecord(_k.mix(torch.ones(4) / 4, 0.5).tolist())",
        ("sazo_lite.variance.mix_with_uniform", "called"),
        None),
    "a dunder of the student's objects that Python calls for the case": (
        f"class _P(list):\n    __lt__ = {HIDDEN.format(name='tv_distance')}\n"
        "lab9_data = [_P([0.5, 0.5]), _P([1.0, 0.0])]\n",
        "record(len(sorted(lab9_data)))", ("sazo_lite.variance.tv_distance", "called"), None),
    "functools.partial of a library function": (
        "import functools\nlab9_f = functools.partial(sazo_lite.variance.mix_with_uniform, torch.ones(2) / 2)\n",
        "record(lab9_f(uniform_mix=0.5).tolist())", ("sazo_lite.variance.mix_with_uniform", "called"),
        "lab9_f is not defined in your notebook"),
    "a callable object whose __call__ is a library function": (
        f"class _Mix:\n    __call__ = staticmethod({HIDDEN.format(name='mix_with_uniform')})\nlab9_f = _Mix()\n",
        "record(lab9_f(torch.ones(2) / 2, 0.5).tolist())", ("sazo_lite.variance.mix_with_uniform", "called"), None),
    "a library function under no_grad as a method of the student's class": (
        "class Lab9K(sazo_lite.Sampler):\n"
        "    mix = staticmethod(torch.no_grad()(sazo_lite.variance.mix_with_uniform))\n",
        "record(Lab9K(2).mix(torch.ones(2) / 2, 0.5).tolist())", ("sazo_lite.variance.mix_with_uniform", "called"),
        "Lab9K uses it"),
    "no_grad around a library function": (
        "lab9_f = torch.no_grad()(sazo_lite.variance.oracle_probs)\n", "record(lab9_f([1.0]).tolist())",
        ("sazo_lite.variance.oracle_probs", "called"), "lab9_f is not defined in your notebook"),
    "no_grad around a library function, __wrapped__ pointed at the student's": (
        "def _mine(x):\n    return x\n"
        "lab9_f = torch.no_grad()(sazo_lite.variance.oracle_probs)\nlab9_f.__wrapped__ = _mine\n",
        "record(lab9_f([1.0]).tolist())", ("sazo_lite.variance.oracle_probs", "called"), "lab9_f uses it"),
    # the names that stand for the method's class are the guard's, taken before the student's code ran: a class the
    # student makes (named like the case's, in a library module's name) or a module registered under a library
    # class's dotted name does not make the case name a library method
    "a subclass of a library class made while the case runs, named like the student's class": (
        "class Lab9K(sazo_lite.Sampler):\n    pass\ndef lab9_swap():\n    global Lab9K\n"
        "    Lab9K = type('Lab9K', (getattr(sazo_lite, 'SAZO' + 'Sampler'),), {'__module__': 'sazo_lite.samplers'})\n"
        "    return 0\n", "_a = lab9_swap()\n_k = Lab9K(4)\nrecord(_k.probs.tolist())",
        ("sazo_lite.samplers.SAZOSampler.__init__", "called"), None),
    "a module registered under a library class's dotted name": (   # last: it stays in sys.modules
        "import sys as _sys\n_sys.modules['sazo_lite.samplers.OracleSampler'] = _sys\n"
        "class Lab9K(sazo_lite.Sampler):\n    def __init__(self, n):\n        super().__init__(n)\n"
        "        self.norms_fn, self.uniform_mix = (lambda: torch.arange(1.0, n + 1)), 0.0\n"
        "        type(self).probs = getattr(sazo_lite, 'Oracle' + 'Sampler').probs\n",
        "record(Lab9K(3).probs.tolist())", ("sazo_lite.samplers.OracleSampler.probs", "called"), None),
}


RULE = [["sazo_lite.course", "sazo_lite.samplers"], ["sazo_lite.Sampler", "sazo_lite.course.pick"]]


def _guarded(cases: list, rule: list) -> dict:
    done = subprocess.run([sys.executable, "-c", HARNESS, json.dumps(cases), json.dumps(rule)], capture_output=True,
                          text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads(done.stdout.strip().splitlines()[-1])


@pytest.fixture(scope="module")
def guarded():
    return _guarded([[name, cell, case] for name, (cell, case) in CLEAN.items()] +
                    [[name, cell, case] for name, (cell, case, *_) in ROADS.items()], RULE)


@pytest.mark.parametrize("name", CLEAN)
def test_the_tests_own_calls_and_decorated_answers_find_nothing(guarded, name):
    result = guarded[name]
    assert (result["found"], result["check"], result["error"]) == ([], [], None), result


@pytest.mark.parametrize("name", ROADS)
def test_a_library_object_the_student_put_in_the_cases_way_is_reported(guarded, name):
    *_, call, how = ROADS[name]
    result = guarded[name]
    assert result["error"] is None, result   # the library answered: only the report stands between it and points
    assert list(call) in result["found"], result
    assert how is None or how in [h for _, h in result["check"]], result


CLOSURE_GADGET = ("class _P(problems.FiniteSumProblem):\n    pass\n\n"
                  "def lab9_f(norms, probs):\n"
                  "    _P.losses = staticmethod(getattr(getattr(sazo_lite, 'vari' + 'ance'),\n"
                  "                                     'sampling_' + 'variance'))\n"
                  "    return _P().closure(norms, probs)()   # problems' lambda: self.losses(theta, indices)\n")


# closed in round 18: tests/test_lab_attacks_round15.py charges the gadget above


# -- graded the project's way ---------------------------------------------------------------------------------
pytest.importorskip("otter")

from test_lab_attacks_round6 import _edit, grade_hand_ins  # noqa: E402

Q3_CELL = "def lab2_sampling_variance"
IN_BUILTINS = ("import builtins as _b\n_b.lab2_sampling_variance = sazo_lite.variance.sampling_variance\n"
               "_b.lab2_oracle_probs = sazo_lite.variance.oracle_probs\n")
# placeholders pass the definition check; the first time a case reads `torch`, the library goes in their place,
# and a profile hook puts them back when the case returns (before the next check)
SWAPPED_IN_THE_CASE = '''import sys as _sys
_real_torch = torch
_mine = {}

def _restore(frame, event, arg):
    if event == "return" and frame.f_code.co_name == "case":
        _sys.setprofile(None)
        globals().update(_mine)

class _Torch(type(_real_torch)):
    def __getattr__(self, name):
        if _sys._getframe(1).f_code.co_name == "case":
            _mine.update(lab2_sampling_variance=_placeholder_v, lab2_oracle_probs=_placeholder_o)
            globals().update(lab2_sampling_variance=sazo_lite.variance.sampling_variance,
                             lab2_oracle_probs=sazo_lite.variance.oracle_probs)
            _sys.setprofile(_restore)
        return getattr(_real_torch, name)

torch = _Torch("torch")

def lab2_sampling_variance(norms, probs):
    return 0.0

def lab2_oracle_probs(norms):
    return norms

_placeholder_v, _placeholder_o = lab2_sampling_variance, lab2_oracle_probs
'''
DECORATED = {"def lab2_weights": ("def lab2_weights", "import functools\n\n\n@torch.no_grad()\ndef lab2_weights"),
             "def lab2_is_estimate": ("def lab2_is_estimate", "@torch.inference_mode()\ndef lab2_is_estimate"),
             Q3_CELL: ("def lab2_oracle_probs",
                       "@functools.lru_cache(maxsize=None)   # pure: memoised\ndef lab2_oracle_probs")}


def _hand_ins(solution, folder) -> None:
    for name, answer in (("in_builtins", IN_BUILTINS), ("swapped_in_the_case", SWAPPED_IN_THE_CASE)):
        nb = nbformat.read(solution, as_version=4)
        _edit(nb, Q3_CELL, lambda source, answer=answer: answer)
        nbformat.write(nb, folder / f"{name}.ipynb")
    nb = nbformat.read(solution, as_version=4)
    for start, (name, decorated) in DECORATED.items():
        _edit(nb, start, lambda source, name=name, decorated=decorated: source.replace(name, decorated, 1))
    nbformat.write(nb, folder / "decorated.ipynb")


@pytest.fixture(scope="module")
def graded(assigned_labs, tmp_path_factory):
    return grade_hand_ins(assigned_labs, tmp_path_factory.mktemp("round11"), _hand_ins)


def _results(csv_path, submission: str) -> dict:
    return json.loads((csv_path.parent / "lab2" / submission / "results.json").read_text())["questions"]


@pytest.mark.parametrize("name", ["in_builtins", "swapped_in_the_case"])
def test_the_library_in_the_cases_way_scores_zero_with_the_rule_as_reason(graded, name):
    """Before: q3 scored 3/3 (every case passed with the library's numbers, nothing charged)."""
    rows, csv_path = graded
    row = rows[f"{name}.ipynb"]
    scores = {q: v["score"] for q, v in row["questions"].items()}
    assert row["status"] == "ok" and scores["q3"] == 0, row
    assert scores["q1"] == 2 and scores["q2"] == 4, row   # the rest of the notebook is the solution's: still graded
    q3 = _results(csv_path, name)["q3"]
    assert any("sazo_lite.variance" in reason for reason in q3["rule"]), q3


def test_answers_decorated_the_pytorch_way_keep_full_marks(graded):
    """Before: q1, q2 and q3 scored 0 ("not defined in your notebook")."""
    rows, _ = graded
    row = rows["decorated.ipynb"]
    assert row["status"] == "ok" and row["possible"] > 0 and row["total"] == row["possible"], row


# -- mutants and variants, graded as the grader grades -------------------------------------------------------
from test_lab_mutants import assert_mutant_loses_points, failed_cases, reference, run_question  # noqa: E402

MUTANTS = {   # (lab, question): [(name, [(old, new)])]: each must fail a case of its question
    ("lab1", "q1"): [("eps·z rounded to float32", [
        ("plus = f(theta + eps * z)", "plus = f(theta + eps * z.float())"),
        ("minus = f(theta - eps * z)", "minus = f(theta - eps * z.float())")])],
    ("lab2", "q2"): [("one fresh generator per repeat", [("lab2_is_estimate(lab2_values, lab2_skewed, 2, lab2_gen)",
                                                          "lab2_is_estimate(lab2_values, lab2_skewed, 2, "
                                                          "torch.Generator().manual_seed(lab_seed))")]),
                     ("draws without replacement", [("replacement=True, generator=generator)",
                                                     "replacement=False, generator=generator)")])],
    ("lab3", "q2"): [("the prior over every example, seen or not", [
        ("return float((estimates[seen] ** 2).mean().sqrt())", "return float((estimates ** 2).mean().sqrt())")])],
    ("lab3", "q4"): [("counts once per occurrence of an index", [   # only the hidden cases hold duplicates
        ("counts[unique] += 1", "counts.index_add_(0, indices, torch.ones_like(indices))")])],
    ("lab4", "q1"): [("the sampler watches a copy of theta", [("sampler = make_sampler(theta)",
                                                                "sampler = make_sampler(theta.clone())")])],
}
VARIANTS = {   # legitimate other ways to write the solution: every case passes
    ("lab1", "q1"): [(".item() for float()", [("return float((plus - minus) / (2 * eps))",
                                                "return ((plus - minus) / (2 * eps)).item()")])],
    ("lab2", "q1"): [("reciprocal, then divide by N", [("return 1.0 / (len(probs) * probs[indices])",
                                                        "return probs[indices].reciprocal() / len(probs)")])],
    ("lab4", "q1"): [("no early stop", [("progress=False, stop_below=target)", "progress=False)")])],
}


@pytest.fixture(scope="module", autouse=True)
def fast_mode():
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("SAZO_FAST", "1")
        yield


@pytest.mark.parametrize("lab,question,name", [(*k, n) for k, items in MUTANTS.items() for n, _ in items])
def test_each_new_mutant_loses_points_on_its_question(lab, question, name):
    assert_mutant_loses_points(MUTANTS, lab, question, name)


@pytest.mark.parametrize("lab,question,name", [(*k, n) for k, items in VARIANTS.items() for n, _ in items])
def test_each_legitimate_variant_keeps_every_case(lab, question, name):
    replacements = dict(VARIANTS[(lab, question)])[name]
    assert failed_cases(reference(lab, question), run_question(lab, question, replacements)) == [], f"{lab} {question}"


def test_no_test_case_names_a_library_object_its_lab_forbids(assigned_labs):
    """A case's call of a forbidden object it names is the test's own (``Guard._named_by_test``). The masters' cases
    name none (every library callable whose name a case holds is allowed by its lab's rule), so each forbidden call
    that starts in a case is one the student's code put in its way, and is reported."""
    import contextlib
    import importlib
    import pkgutil
    import types

    import sazo_lite
    from sazo_lite.course import labs
    from sazo_lite.course.labs import grading
    from sazo_lite.course.labs.guard import Guard
    from sazo_lite.course.labs.rules import RULES
    from sazo_lite.course.labs.worker import case_code
    from test_labs import MASTERS

    modules = []
    for found in pkgutil.walk_packages(sazo_lite.__path__, "sazo_lite."):
        if not found.name.startswith("sazo_lite.course.labs"):
            with contextlib.suppress(ImportError):   # a module needing an extra that is not installed
                modules.append(importlib.import_module(found.name))
    for master in MASTERS:
        guard = Guard(RULES[master.stem]["modules"], RULES[master.stem]["names"], {}, print)
        guard._resolve_allowed()
        _, questions = grading.load_tests(labs.autograder_zip(master.stem, build_dir=assigned_labs))
        codes = [case_code(case["code"]) for spec in questions.values() for case in spec["cases"]]
        named = set()
        while codes:
            code = codes.pop()
            named |= {part for name in code.co_names for part in name.split(".")}
            codes += [c for c in code.co_consts if isinstance(c, types.CodeType)]
        forbidden = sorted(f"{module.__name__}.{attr}" for module in modules for attr, value in vars(module).items()
                           if attr in named and callable(value)
                           and getattr(value, "__module__", None) == module.__name__ and not guard.is_allowed(value))
        assert not forbidden, f"{master.stem}: test cases name library objects the lab forbids: {forbidden}"

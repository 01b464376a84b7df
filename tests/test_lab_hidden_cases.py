"""Hidden cases expose inputs, not answers: every master's hidden test cells only record.

A hidden case runs in the student's namespace, so every object the student's code returned sees each
operand it meets: ``abs(_g - 3.0)`` or ``_g < _expected`` hands a float subclass the answer, which it can
then write over its own recorded value (``tests/test_lab_liar.py``). So a hidden case must not compare or
combine the student's output with an expected number, and compute no expected value at all: the trusted
grader compares what it recorded with the solutions'. Checked on the code, with ``ast``:

- no ``assert`` statement (anywhere, helper functions included);
- no comparison with a number literal (``x < 1e-9``, ``abs(x - 3.0) <= tol``);
- no arithmetic between a number literal and a value derived from the student's namespace (a name the case
  does not bind itself, or one it bound from such a name), outside helper functions and lambdas (where the
  literal builds another input for the student's code, as the swapped helpers do);
- no names for expected values (``_expected``, ``_reference``, ``_target``, ...).
"""
from __future__ import annotations

import ast
import builtins
import re

import nbformat
import pytest

from sazo_lite.course import labs

TRUSTED = {"torch", "math", "statistics", "problems", "record", "time_limit"}   # modules and the grader's own names
EXPECTED_NAME = re.compile(r"^_*(expect|reference|ref_|target|want|answer|exact|truth|solution)", re.IGNORECASE)


def hidden_cases(master) -> list[tuple[int, str]]:
    """(cell index, source) of a master's hidden test cells (first line ``# HIDDEN``)."""
    nb = nbformat.read(master, as_version=4)
    return [(i, c.source) for i, c in enumerate(nb.cells)
            if c.cell_type == "code" and c.source.lstrip().startswith("# HIDDEN")]


def _number(node) -> bool:
    """A number literal, possibly signed or inside arithmetic of literals (``-1``, ``0.01 * 10``)."""
    if isinstance(node, ast.Constant):
        return isinstance(node.value, (int, float, complex)) and not isinstance(node.value, bool)
    if isinstance(node, ast.UnaryOp):
        return _number(node.operand)
    if isinstance(node, ast.BinOp):
        return _number(node.left) or _number(node.right)
    return False


def _names(node) -> set[str]:
    return {n.id for n in ast.walk(node) if isinstance(n, ast.Name) and isinstance(n.ctx, ast.Load)}


def _targets(node) -> set[str]:
    return {n.id for n in ast.walk(node) if isinstance(n, ast.Name) and isinstance(n.ctx, ast.Store)}


def _bindings(tree) -> list[tuple[set[str], ast.AST | None]]:
    """(names bound, the expression they are bound from; None: not from a value, e.g. a def or an import)."""
    found = []
    for node in ast.walk(tree):
        if isinstance(node, (ast.Assign, ast.AnnAssign, ast.AugAssign)):
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            found.append((set().union(*(_targets(t) for t in targets)), node.value))
        elif isinstance(node, (ast.For, ast.comprehension)):
            found.append((_targets(node.target), node.iter))
        elif isinstance(node, ast.withitem) and node.optional_vars is not None:
            found.append((_targets(node.optional_vars), node.context_expr))
        elif isinstance(node, ast.NamedExpr):
            found.append((_targets(node.target), node.value))
        elif isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            found.append(({node.name}, None))
        elif isinstance(node, (ast.Import, ast.ImportFrom)):
            found.append(({(a.asname or a.name).split(".")[0] for a in node.names}, None))
        elif isinstance(node, ast.arguments):
            found.append(({a.arg for a in [*node.posonlyargs, *node.args, *node.kwonlyargs, node.vararg, node.kwarg] if a}, None))
    return found


def _student_names(tree) -> set[str]:
    """Names whose value comes from the student's namespace: not bound by the case (nor builtins, modules, the
    grader's names), and the names the case binds from an expression that uses one of them."""
    bindings = _bindings(tree)
    bound = set().union(*(names for names, _ in bindings)) if bindings else set()
    tainted = {n for n in _names(tree) if n not in bound and n not in TRUSTED and not hasattr(builtins, n)}
    changed = True
    while changed:
        changed = False
        for names, value in bindings:
            if value is not None and _names(value) & tainted and not names <= tainted:
                tainted |= names
                changed = True
    return tainted


def _outside_functions(tree):
    """The nodes of ``tree`` not inside a def or lambda body."""
    stack = [tree]
    while stack:
        node = stack.pop()
        yield node
        if not isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda)):
            stack.extend(ast.iter_child_nodes(node))


def answers_exposed(source: str) -> list[str]:
    """What in a hidden case's code shows an expected value to the student's objects (empty: nothing)."""
    tree = ast.parse(source)
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Assert):
            found.append(f"line {node.lineno}: an assert (record the student's value instead)")
        elif isinstance(node, ast.Compare) and any(_number(x) for x in [node.left, *node.comparators]):
            found.append(f"line {node.lineno}: a comparison with a number")
    for names, _ in _bindings(tree):
        found += [f"the name {name} (an expected value?)" for name in sorted(names) if EXPECTED_NAME.match(name)]
    student = _student_names(tree)
    for node in _outside_functions(tree):
        if isinstance(node, ast.BinOp):
            for literal, other in ((node.left, node.right), (node.right, node.left)):
                if _number(literal) and _names(other) & student:
                    found.append(f"line {node.lineno}: arithmetic between a number and the student's "
                                 f"{sorted(_names(other) & student)}")
    return found


@pytest.mark.parametrize("master", labs.find_masters(), ids=lambda p: p.stem)
def test_hidden_cases_only_record_what_the_student_code_produced(master):
    cases = hidden_cases(master)
    assert cases, f"{master.stem} has hidden cases"
    exposed = {i: why for i, source in cases if (why := answers_exposed(source))}
    assert not exposed, f"{master.stem}: hidden cells that show answers to the student's objects: {exposed}"


EXPOSING = [   # each shows an answer to the student's objects, and the check must say so
    "_g = lab1_projected_grad(f, t, z, 0.1)\nrecord(_g)\nassert abs(_g - 3.0) < 1e-9",
    "_g = lab1_projected_grad(f, t, z, 0.1)\n_expected = float(t @ z)\nrecord(_g)\nassert abs(_g - _expected) < 1e-6 * abs(_expected)",
    "def _check():\n    assert lab2_weights(p, i).dtype == torch.float64\n_check()",
    "record(abs(lab1_projected_grad(f, t, z, 0.1) - 3.0))",
    "_g = lab1_projected_grad(f, t, z, 0.1)\nrecord(_g - 3.0)",
    "for _x in lab1_errors:\n    record(_x / 0.0183)",
    "record(lab3_tv_end < 0.75 * lab3_tv_start)",
    "_ok = lab4_speedup_oracle > 1.5\nrecord(_ok)",
    "_reference = sum(_zs)\nrecord(lab1_zo_gradient(f, t, 1e-3, 5, g))",
]
ALLOWED = [    # inputs built from literals, student values combined with each other, helpers swapped in
    "_theta = torch.tensor([0.5, -1.0])\n_grad = 3 * _theta ** 2\nwith time_limit():\n    _e = lab1_fd_error(f, _grad, _theta, 0.1, d)\nrecord(_e, rtol=0.0, atol=1e-9)",
    "_mine = lab2_weights\ndef _swapped(p, i):\n    return 2.0 * _mine(p, i) + 1.0\nlab2_weights = _swapped",
    "_mid = lab1_variances[3:6]\nrecord(max(_mid) / min(_mid), rtol=0.0, atol=0.09)",
    "record([_v for _k, _v in lab4_runs.items() if _k[0] != 'sazo' and _v is not None])",
]


@pytest.mark.parametrize("source", EXPOSING)
def test_the_check_finds_answers_shown_to_the_student_code(source):
    assert answers_exposed(source), source


@pytest.mark.parametrize("source", ALLOWED)
def test_the_check_allows_cases_that_only_record(source):
    assert not answers_exposed(source), answers_exposed(source)

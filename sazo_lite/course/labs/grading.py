"""Grading one submission: sandboxed run, timeouts that hold, scores decided by this process.

The tests come from the autograder zip (otter's OK-format files, public and hidden cases). A
worker in the sandbox (``worker.py``) runs the submission's cells, then every case, and reports
each case's error (if any) and the values it ``record``-ed. This trusted process compares those
values with the ones the same case recorded on the solutions (``reference``, computed once per
autograder and cached next to it), scores, and writes the files after the sandbox is gone.

Timeouts: a cell gets ``cell_timeout`` seconds (then ``LabTimeout``, a ``BaseException``, is
raised in it); a cell still running ``GRACE`` seconds later, or a case still running after
twice ``test_timeout`` plus ``GRACE`` (a bare ``except:`` swallowed the interrupt, or the
handler was replaced), gets its whole sandbox killed; grading then restarts in a fresh sandbox without that cell or case (it scores 0),
at most ``MAX_RESTARTS`` times. ``notebook_timeout`` bounds everything: past it, the questions
not yet graded score 0 and the status says "timeout".
"""
from __future__ import annotations

import ast
import collections
import contextlib
import functools
import hashlib
import json
import math
import os
import pickle
import re
import selectors
import subprocess
import sys
import time
import zipfile
from pathlib import Path

from sazo_lite.atomic import write_json
from sazo_lite.course.labs.guard import TAMPERED
from sazo_lite.course.labs.sandbox import Limits, Sandbox
from sazo_lite.course.labs.values import ATOL, MAX_ITEMS, RTOL, check_encoded, compare

GRACE = 5.0          # seconds past a unit's own limit before the sandbox is killed
MAX_RESTARTS = 3     # fresh sandboxes after a kill; then what is left scores 0
IDLE_LIMIT = 30.0    # seconds the worker may take between two units, or after its last one before 'done': it only
                     # reports there, so longer is the submission's (a __del__ or a stream's flush that never returns)
LOG_BYTES = 2 ** 20  # of the submission's output kept in grade.log
MAX_NOTEBOOK_BYTES = 512 * 2 ** 20   # a hand-in's size; past it, it is not read (status "failed", with the reason)
ENV_PASSED = ("SAZO_FAST",)  # environment the sandboxed worker inherits (besides its own)
_RUNS_OTTER = re.compile(r"otter\.Notebook\(|grader\.check(_all)?\(")  # otter's init and check cells


# -- the tests and the job ---------------------------------------------------------------
def load_tests(autograder: Path) -> tuple[dict, dict]:
    """(otter_config, {question: {"points": [...], "cases": [{"hidden", "code"}]}}) from the zip.

    Raises ValueError naming the zip (and the file in it) where it is not a zip, a file in it cannot be read,
    or it holds no test case.
    """
    try:
        with zipfile.ZipFile(autograder) as archive:
            return _tests_of(archive, Path(autograder).name)
    except zipfile.BadZipFile as exc:
        raise ValueError(f"Invalid autograder: {Path(autograder).name} is not a zip file ({exc}): "
                         f"pass the autograder zip that `make labs` wrote") from None


def _tests_of(archive: zipfile.ZipFile, zip_name: str) -> tuple[dict, dict]:
    """``load_tests`` of an open zip; a file that cannot be read is named in the ValueError."""
    names, questions, name = archive.namelist(), {}, "otter_config.json"
    try:
        config = json.loads(archive.read("otter_config.json")) if "otter_config.json" in names else {}
        for name in sorted(n for n in names if n.startswith("tests/") and n.endswith(".py")):
            test = _test_dict(archive.read(name).decode())
            cases = [{"hidden": bool(c.get("hidden")), "code": _from_doctest(c["code"])}
                     for suite in test.get("suites", []) for c in suite.get("cases", [])]
            points = test.get("points", 1)
            if not isinstance(points, list):
                points = [float(points) / max(len(cases), 1)] * len(cases)
            if len(points) != len(cases):   # scoring pairs them one to one
                raise ValueError(f"{len(points)} points for {len(cases)} test cases")
            questions[test.get("name", Path(name).stem)] = {"points": [float(p) for p in points], "cases": cases}
    except (ValueError, SyntaxError, TypeError, KeyError, AttributeError, UnicodeDecodeError) as exc:
        raise ValueError(f"Invalid autograder: {name} in {zip_name} cannot be read ({type(exc).__name__}: "
                         f"{str(exc)[:200]})") from None
    if not any(spec["cases"] for spec in questions.values()):   # it would grade every hand-in 0 / 0, "ok"
        raise ValueError(f"Invalid autograder: {zip_name} holds no test cases (tests/*.py): build it "
                         f"from a master with questions and tests")
    return config, questions


def parse_python(source: str) -> ast.Module:
    """``ast.parse(source)``, from a fresh interpreter where this one's parser is broken.

    CPython 3.11.0-3.11.7 keeps the AST constructor's recursion counter in state shared by every
    parse, so a parse can fail with a spurious ``SystemError`` ("AST constructor recursion depth
    mismatch", python/cpython#106905), and in a long-lived process (a grader, a test worker) the
    parses after it can fail the same way. Then the source is parsed again in a new interpreter
    (``-I``: no site, no environment) that only parses it and sends the tree back; its SyntaxError
    or ValueError is raised here as if ``ast.parse`` had raised it.
    """
    try:
        return ast.parse(source)
    except SystemError:
        pass
    done = subprocess.run([sys.executable, "-I", "-c", _PARSE_ELSEWHERE], input=source.encode("utf-8", "surrogatepass"),
                          capture_output=True, timeout=60, check=False)
    if done.returncode != 0:
        raise SystemError(f"parsing failed here and in a fresh interpreter: {done.stderr.decode(errors='replace')[-300:]}")
    tree = pickle.loads(done.stdout)  # written by _PARSE_ELSEWHERE: an ast.Module or the parse's own exception
    if isinstance(tree, BaseException):
        raise tree
    return tree


_PARSE_ELSEWHERE = """\
import ast, pickle, sys
try:
    found = pickle.dumps(ast.parse(sys.stdin.buffer.read().decode("utf-8", "surrogatepass")))
except (SyntaxError, ValueError, RecursionError, MemoryError) as exc:  # a deep tree fails in dumps
    found = pickle.dumps(type(exc)(*exc.args))
sys.stdout.buffer.write(found)
"""


def parsed_or_none(source: str) -> ast.Module | None:
    """``parse_python(source)``, or None for a cell that is not Python (a syntax error, a null byte, a
    tree too deep for the parser)."""
    try:
        return parse_python(source)
    except (SyntaxError, ValueError, RecursionError, MemoryError):
        return None


def _test_dict(source: str) -> dict:
    """The ``test = {...}`` literal of an OK-format test file, read without executing it."""
    for node in parse_python(source).body:
        if isinstance(node, ast.Assign) and any(getattr(t, "id", None) == "test" for t in node.targets):
            return ast.literal_eval(node.value)
    return {}


def _from_doctest(code: str) -> str:
    """Python source from an OK-format case (``>>> `` / ``... `` prompts; no expected output)."""
    lines = []
    for line in code.splitlines():
        if line.startswith((">>> ", "... ")):
            lines.append(line[4:])
        elif line.strip() in (">>>", "..."):
            lines.append("")
    return "\n".join(lines)


_CHECK = re.compile(r"grader\.check\(\s*['\"]([\w.-]+)['\"]")


def question_order(names) -> list[str]:
    """Question names in the lab's order (q2 before q10)."""
    return sorted(names, key=lambda q: [int(t) if t.isdigit() else t for t in re.split(r"(\d+)", q)])


def read_notebook(path: Path, findings: list | None = None):
    """A hand-in as a notebook: a regular file, read once without following a symbolic link.

    Raises ValueError with a reason that quotes nothing of what a link points to; nbformat's own
    errors (not JSON, not a notebook) pass through. The rest is ``parse_notebook`` (a cell in a form
    that cannot run costs that cell, with a line in ``findings``, not the notebook).
    """
    import stat

    try:
        fd = os.open(path, os.O_RDONLY | getattr(os, "O_NOFOLLOW", 0) | getattr(os, "O_NONBLOCK", 0))
    except OSError as exc:
        if os.path.islink(path):
            raise ValueError(f"{Path(path).name} is a symbolic link, not a file: hand in the notebook itself") from None
        raise ValueError(f"{Path(path).name} cannot be opened ({exc.strerror})") from None
    info = os.fstat(fd)   # before fdopen, which refuses a folder with an error that names the descriptor
    if not stat.S_ISREG(info.st_mode):
        os.close(fd)
        raise ValueError(f"{Path(path).name} is not a regular file: hand in the notebook itself")
    with os.fdopen(fd, "rb") as handle:
        if info.st_nlink > 1:
            raise ValueError(f"{Path(path).name} has other names (hard links): hand in a copy of the notebook")
        data = handle.read(MAX_NOTEBOOK_BYTES + 1)   # never more: one huge hand-in must not end the class's grading
    if len(data) > MAX_NOTEBOOK_BYTES:
        raise ValueError(f"{Path(path).name} is larger than {MAX_NOTEBOOK_BYTES // 2 ** 20} MiB: clear its outputs "
                         f"(Edit > Clear Outputs of All Cells) and hand it in again")
    return parse_notebook(data, findings)


def parse_notebook(data: bytes, findings: list | None = None):
    """A notebook (nbformat 4, upgraded from older versions) from a hand-in's bytes, read as leniently as
    its cells allow: what only an editor got wrong costs nothing, a cell that cannot run costs that cell.

    The bytes are read in the encoding JSON readers detect (``_json_text``: UTF-8, a byte-order mark skipped, or
    UTF-16/32); a cell's ``source`` as a list of lines (valid
    nbformat on disk) is joined; a cell that is not an object, has no type, or whose source is neither text
    nor a list of text becomes an empty cell, and ``findings`` (a list, if given) gets one line naming it;
    metadata (the notebook's or a cell's) that is missing or not an object, or tags that are not a list, are
    read as none; an id two cells share is taken off both (``_without_shared_ids``). Outputs and attachments
    are dropped (grading never reads them; a hand-in with huge outputs costs no more than its code).
    """
    import nbformat

    found = [] if findings is None else findings
    text = _json_text(data)
    try:
        raw = json.loads(text)
    except (ValueError, RecursionError):
        raw = None
    if not isinstance(raw, dict):  # not JSON (or not an object): nbformat's own error says so
        return nbformat.reads(text, as_version=4)
    if not isinstance(raw.get("metadata"), dict):   # missing or not an object (a notebook a script wrote):
        raw["metadata"] = {}                         # nbformat refuses the file, grading never reads it
    raw["nbformat"] = _format_version(raw)
    index = 0
    worksheets = raw.get("worksheets") if raw["nbformat"] == 3 else None
    for cells in ([w.get("cells") for w in worksheets if isinstance(w, dict)] if isinstance(worksheets, list)
                  else [raw.get("cells")]):
        if not isinstance(cells, list):
            continue
        for k, cell in enumerate(cells):
            cells[k] = _readable_cell(cell, index, found)
            index += 1
    _without_shared_ids(raw.get("cells"))
    return nbformat.from_dict(nbformat.reads(json.dumps(raw), as_version=4))


def _without_shared_ids(cells) -> None:
    """Take the id off every cell whose id another cell has too (VS Code's paste keeps the copied cell's id):
    such an id names neither cell, so each is read as a new cell. nbformat would keep the id on the first and
    give the others random ones, so a copy pasted above an explore cell was taken for that cell."""
    if not isinstance(cells, list):
        return
    ids = [cell.get("id") if isinstance(cell, dict) and isinstance(cell.get("id"), str) else None for cell in cells]
    shared = {i for i, n in collections.Counter(ids).items() if i is not None and n > 1}
    for cell, i in zip(cells, ids):
        if i in shared:
            del cell["id"]


def _json_text(data: bytes) -> str:
    """A hand-in's bytes as text, in the encoding JSON readers detect (Python's ``json``): UTF-8 with or without a
    byte-order mark, or UTF-16/32 (Windows PowerShell's ``>`` and ``Out-File`` write UTF-16); a byte that does not
    decode (a comment saved in cp1252) is U+FFFD, as before, and the rest is read as leniently as a UTF-8 file.

    Example:
        >>> _json_text(b'\\xef\\xbb\\xbf{"a": "caf\\xe9"}'), _json_text('{"a": 1}'.encode("utf-16"))
        ('{"a": "caf\ufffd"}', '{"a": 1}')
    """
    return data.decode(json.detect_encoding(data), "replace").removeprefix("\ufeff")


def _format_version(raw: dict) -> int:
    """The nbformat major version of a hand-in's JSON object, read as a person would.

    Without an ``nbformat`` key (a notebook a script wrote), a ``cells`` list is read as version 4 and a
    ``worksheets`` list as version 3 (nbformat itself would take version 1 and drop the code); the version as
    text (``"4"``) or a whole float is that number; a version 2 or 3 minor is read as 0 (the only one they have).
    Raises ValueError for anything else (no cells, version 5).
    """
    version = raw.get("nbformat")
    if version is None:
        if isinstance(raw.get("cells"), list):
            version = 4
        elif isinstance(raw.get("worksheets"), list):
            version = 3
        else:
            raise ValueError("not an nbformat-4 notebook: it has no nbformat version and no list of cells")
    version = _whole_number(version)
    if version is None or not 1 <= version <= 4:
        raise ValueError(f"not an nbformat-4 notebook: its nbformat version is {str(raw['nbformat'])[:20]!r} "
                         f"(expected 4)")
    minor = _whole_number(raw.get("nbformat_minor"))
    if version == 4 and minor is None:   # cell ids came with 4.5
        minor = 5 if all(isinstance(c, dict) and "id" in c for c in raw.get("cells") or []) else 4
    elif version in (2, 3) and minor is not None:   # each has one schema, minor 0: nbformat has none for 3.1
        minor = 0
    if minor is not None:
        raw["nbformat_minor"] = minor
    return version


def _whole_number(value) -> int | None:
    """``value`` as an int where it is one written as an int, a digit string or a whole float; else None."""
    if isinstance(value, str) and value.strip().isdigit():
        return int(value)
    if isinstance(value, float) and value.is_integer():
        return int(value)
    return value if type(value) is int else None


_SOURCE_KEYS = ("source", "input")   # nbformat 4; a version 3 code cell keeps its code under "input"


def _readable_cell(cell, index: int, findings: list) -> dict:
    """One cell of a hand-in's JSON in a form nbformat reads and the grader runs (see ``parse_notebook``)."""
    if not isinstance(cell, dict) or not isinstance(cell.get("cell_type"), str):
        what = "has no cell type" if isinstance(cell, dict) else f"is not a cell (a JSON {_json_kind(cell)})"
        findings.append(f"cell {index} {what}: not run")
        return {"cell_type": "raw", "metadata": {}, "source": ""}
    for key in _SOURCE_KEYS:
        if key not in cell:
            continue
        source = cell[key]
        if isinstance(source, list) and all(isinstance(line, str) for line in source):
            cell[key] = "".join(source)
        elif not isinstance(source, str):
            kind = "a list holding something other than text" if isinstance(source, list) else \
                f"a JSON {_json_kind(source)}, not text"
            findings.append(f"cell {index} ({_printable_kind(cell['cell_type'])}): its {key} is {kind}: not run")
            cell[key] = ""
    if cell["cell_type"] == "code" and "source" not in cell and "input" not in cell:
        cell["source"] = ""
    metadata = cell.get("metadata")
    if not isinstance(metadata, dict):
        cell["metadata"] = metadata = {}
    if "tags" in metadata and not (isinstance(metadata["tags"], list) and all(isinstance(t, str) for t in metadata["tags"])):
        del metadata["tags"]
    if "outputs" in cell:
        cell["outputs"] = []
    cell.pop("attachments", None)
    return cell


def _printable_kind(cell_type: str) -> str:
    return "".join(c if c.isalnum() or c in "_-" else "?" for c in cell_type[:20])


def _json_kind(value) -> str:
    return {dict: "object", list: "list", str: "string", bool: "boolean", type(None): "null"}.get(
        type(value), "number")


def _notebook(notebook):
    import nbformat

    if isinstance(notebook, nbformat.NotebookNode):
        return notebook
    if isinstance(notebook, dict):  # an upgraded version 3 notebook is a dict of another class
        return nbformat.from_dict(notebook)
    return nbformat.read(notebook, as_version=4)


def bound_names(source: str) -> set[str]:
    """The names a cell binds at its top level (assignments, def, class, import; not inside functions)."""
    tree = parsed_or_none(source)
    if tree is None:
        return set()
    names: set[str] = set()

    def visit(node):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            names.add(node.name)
            return  # their bodies bind locals (a `global` inside one is seen below)
        if isinstance(node, ast.Lambda):
            return
        if isinstance(node, ast.Name) and isinstance(node.ctx, (ast.Store, ast.Del)):
            names.add(node.id)
        elif isinstance(node, (ast.Import, ast.ImportFrom)):
            names.update((a.asname or a.name).split(".")[0] for a in node.names)
        elif isinstance(node, ast.NamedExpr) and isinstance(node.target, ast.Name):
            names.add(node.target.id)
        for child in ast.iter_child_nodes(node):
            visit(child)

    visit(tree)
    names.update(n for node in ast.walk(tree) if isinstance(node, ast.Global) for n in node.names)
    return names


def cell_questions(notebook, graded: dict | None = None, questions=None, *, explore=()) -> dict[int, list[str]]:
    """Which questions each code cell answers for (where a rule finding in it counts).

    A cell that binds a question's graded names (``graded``: {question: [names]}, the lab's rule)
    belongs to those questions; names bound only in the copies of explore cells it holds do not count
    (``explore``: what ``ignored`` returns; those copies do not run, ``without_explore``).
    Any other cell belongs to the question of the distributed notebook's check cell below it: the
    ``grader.check("qN")`` cells taken in the lab's order (``questions``), the first of each, each after
    the one before; a check cell a submission adds or moves out of that order counts for nothing. Cells
    below the last check belong to the last question.
    """
    nb = _notebook(notebook)
    sources, _, marks, kept_ids = explore or (frozenset(),) * 4
    code = [(i, without_magics(without_explore(c.source, sources, marks, _cell_id(c) not in kept_ids) or "")
             if isinstance(c.source, str) else "") for i, c in enumerate(nb.cells) if c.cell_type == "code"]
    order = question_order(questions) if questions else []
    owners, pending, last = {}, [], -1
    for index, source in code:
        pending.append(index)
        found = _CHECK.search(source)
        if not found:
            continue
        question = found.group(1)
        if order:
            if question not in order or order.index(question) <= last:
                continue  # a check cell out of the distributed order
            last = order.index(question)
        owners.update({i: [question] for i in pending})
        pending = []
    tail = order[-1] if order else next((q[0] for q in reversed(list(owners.values()))), None)
    if tail is not None:
        owners.update({i: [tail] for i in pending})
    for index, source in code:
        names = bound_names(source)
        binding = [q for q in (order or list(graded or {})) if names & set((graded or {}).get(q, ()))]
        if binding:
            owners[index] = binding
    return owners


def notebook_cells(notebook: Path, config: dict, ignored=frozenset(), ignored_ids=frozenset(),
                   marks=frozenset(), kept_ids=frozenset()) -> list[tuple[int, str]]:
    """The code cells to run: not tagged ``otter_ignore``, nor one of the distributed notebook's ``otter_ignore``
    cells whose tag an editor dropped: a cell with one of their ``ignored`` sources or with one of their ids
    (``ignored_ids``: the student edited the explore cell, its source is another; both from ``ignored``); the
    copies of those cells that a cell holds taken out (``without_explore``, by their first lines, ``marks``, or
    their code; a cell with one of ``kept_ids``, the distributed notebook's other code cells, is not a copy); not
    otter's own (otter's statements taken out of the others), IPython's magics made Python (``without_magics``);
    the seed set as otter does. A new cell tagged ``otter_ignore`` (not one of those cells by its id or source)
    that binds one of the lab's graded names is the student's answer written into a pasted copy of an explore
    cell (JupyterLab's paste keeps the tags): it is read as an untagged cell."""
    nb = _notebook(notebook)
    cells, seed_name = [], config.get("seed_variable")
    graded = {name for names in ((lab_rule(config) or {}).get("graded") or {}).values() for name in names}
    for index, cell in enumerate(nb.cells):
        if cell.cell_type != "code":
            continue
        if "otter_ignore" in (cell.metadata.get("tags") or []) and not _answer_in_a_copy(cell, graded, ignored,
                                                                                        ignored_ids):
            continue
        source = cell.source
        if not isinstance(source, str):
            raise ValueError(f"cell {index} has no source text")
        if _same_text(source) in ignored or _cell_id(cell) in ignored_ids:
            continue
        source = without_explore(source, ignored, marks, new=_cell_id(cell) not in kept_ids)
        if source is None:
            continue
        source = _without_otter(without_magics(source))
        if source is None:
            continue
        if seed_name and config.get("seed") is not None:
            source = with_seed(source, seed_name, config["seed"])
        cells.append((index, source))
    return cells


def _answer_in_a_copy(cell, graded: set, ignored=frozenset(), ignored_ids=frozenset()) -> bool:
    """Whether a cell tagged ``otter_ignore`` is a student's answer under a tag copied with the cell: a new cell
    (neither the id nor the source of one of the distributed notebook's ``otter_ignore`` cells, which stay
    skipped whatever the student wrote into them) that binds one of ``graded`` at its top level. Without those
    cells (the solutions notebook itself, ``reference``) every tag holds."""
    source = cell.source
    if not (graded and (ignored or ignored_ids)) or not isinstance(source, str) or _cell_id(cell) in ignored_ids \
            or _same_text(source) in ignored:
        return False
    return bool(bound_names(without_magics(source)) & graded)


_NAME_ERROR = re.compile(r"\ANameError: name '(\w+)' is not defined")


def explain_name_errors(outcome: dict, notebook, cells: list[tuple[int, str]]) -> list[str]:
    """Say why a name was missing where a case or a cell failed with ``NameError`` (``outcome`` from ``run``, its
    errors extended in place; returns the notes for grade.log).

    A name the hand-in binds only in code the grader does not run (``cells``, from ``notebook_cells``: explore and
    check cells and their copies, otter's cells) existed in the student's kernel: the error says where it is
    bound and that those cells are not run in grading; one bound only in a raw cell (a code cell whose type was
    changed after it ran) says to make it a code cell again. A name bound in a graded cell that raised (a graded
    function defined below the line that failed) names that cell and what it raised. The scores do not change:
    the error costs the questions it cost.
    """
    errors = [*(outcome.get("cell_errors") or {}).values(),
              *(case.get("error") for case in (outcome.get("cases") or {}).values() if isinstance(case, dict))]
    if not any(_NAME_ERROR.search(error) for error in errors if isinstance(error, str)):
        return []   # nothing to explain: the cells are not parsed again
    nb, ran = _notebook(notebook), dict(cells)
    bound_ran = {index: bound_names(source) for index, source in cells}
    everywhere = set().union(*bound_ran.values())
    skipped: dict[str, list[int]] = {}
    raw: set[int] = set()
    for index, cell in enumerate(nb.cells):
        if cell.cell_type in ("code", "raw") and isinstance(cell.source, str):
            for name in sorted(bound_names(without_magics(cell.source)) - bound_ran.get(index, set()) - everywhere):
                skipped.setdefault(name, []).append(index)
            if cell.cell_type == "raw":
                raw.add(index)

    def why(error: str, chained: bool = True) -> str | None:
        found = _NAME_ERROR.search(error or "")
        if not found:
            return None
        name = found.group(1)
        where = ", ".join(map(str, skipped.get(name, [])[:5]))
        if name in skipped and all(i in raw for i in skipped[name]):
            return f"{name!r} is bound only in cell {where}, a raw cell, which no one runs: make it a code cell"
        if name in skipped:
            return (f"{name!r} is bound only in cell {where}, which the grader does not run (explore and check "
                    f"cells, copies of them and otter's cells are skipped in grading): import or define it in a "
                    f"graded cell")
        failed = [i for i in sorted(ran) if name in bound_ran[i] and i in (outcome.get("cell_errors") or {})]
        if failed and chained:
            error = outcome["cell_errors"][failed[0]]
            return f"cell {failed[0]}, where {name!r} is bound, raised: {error[:300]}{note(error, False)}"
        return None

    def note(error: str, chained: bool = True) -> str:
        text = why(error, chained)
        return f" [grader: {text}]" if text else ""

    notes = []
    for index, error in sorted((outcome.get("cell_errors") or {}).items()):
        text = why(error, False)
        if text:   # one line: the error is the submission's text
            notes.append(" | ".join(_as_output(f"cell {index}: {text}".encode()).splitlines()))
    for case in (outcome.get("cases") or {}).values():
        if isinstance(case, dict) and isinstance(case.get("error"), str):
            case["error"] += note(case["error"])
    for index, error in list((outcome.get("cell_errors") or {}).items()):
        outcome["cell_errors"][index] = error + note(error, False)
    return notes


def ignored(autograder: Path, config: dict) -> tuple[frozenset, frozenset, frozenset, frozenset]:
    """(sources, ids, marks) of the cells the distributed notebook tags ``otter_ignore`` (explore and check cells,
    which may use the library), and the ids of its other code cells, read once from the solutions notebook next
    to the zip; the sources as ``_same_text``, the marks as ``explore_marks``.

    A hand-in's cell with one of the sources is skipped even without its tag: JupyterLab's collaboration mode and
    notebook cleaners drop cell tags, and the cell would then cost its question (a library call, a widget
    import). A hand-in's cell with one of the ids is that explore or check cell, whatever the student changed in
    it (editors keep a cell's id as it is edited); it is skipped like the tagged cell it was, also where an
    editor dropped the tag. A copy of one (a new id) is found by its first line or by its code
    (``without_explore``).
    """
    try:
        nb = _notebook(solutions_notebook(autograder, config))
    except (OSError, ValueError):
        return (frozenset(),) * 4
    cells, others = _ignored_cells(nb)
    return (frozenset(_same_text(c.source) for c in cells if isinstance(c.source, str)),
            frozenset(filter(None, map(_cell_id, cells))), _marks(cells, others),
            frozenset(filter(None, map(_cell_id, others))))


def _ignored_cells(nb) -> tuple[list, list]:
    """(the code cells a notebook tags ``otter_ignore``, its other code cells), from the solutions notebook next
    to the zip, whose cells keep the master's ids as the student notebook's do."""
    tagged = [c.cell_type == "code" and "otter_ignore" in (c.metadata.get("tags") or []) for c in nb.cells]
    return ([c for c, t in zip(nb.cells, tagged) if t],
            [c for c, t in zip(nb.cells, tagged) if c.cell_type == "code" and not t])


def explore_marks(nb) -> frozenset:
    """The first lines of a notebook's ``otter_ignore`` code cells that are comments (``# explore (not graded):
    ...``), stripped, where no other code cell starts with the same line (an answer cell must never read as an
    explore cell's copy)."""
    return _marks(*_ignored_cells(nb))


def _marks(ignored: list, others: list) -> frozenset:
    """``explore_marks`` of a notebook's ``otter_ignore`` code cells and its other code cells."""
    starts = {_first_line(c.source) for c in others if isinstance(c.source, str)}
    firsts = {_first_line(c.source) for c in ignored if isinstance(c.source, str)}
    return frozenset(line for line in firsts - starts if line.startswith("#") and line.lstrip("#").strip())


def _first_line(source: str) -> str:
    return next((line.strip() for line in source_lines(source) if line.strip()), "")


def without_explore(source: str, ignored=frozenset(), marks=frozenset(), new: bool = True) -> str | None:
    """``source`` without the copies of the distributed notebook's explore and check cells it holds, which the
    grader skips as it skips those cells: a copy starts at a line, at the cell's top level, that is one of their
    first lines (``marks``: ``# explore (not graded, skipped by the autograder): ...``, which the copy carries).
    A ``new`` cell (not one of the distributed notebook's) that starts with one is that cell's copy, skipped
    whole (None) as the cell is, edited or not. Elsewhere (pasted into an answer cell, merged below one) the copy
    runs for that cell's lines where it holds them unchanged (``ignored``), else to the end of the cell (edited).
    A copy without that first line is known by its code: a run of top-level statements that is one of those
    cells' code whole (``_explore_shape``: comments, blank lines, layout and constants aside; not a cell of one
    statement or of imports only) is taken out wherever it stands. The lines taken out are left blank (line
    numbers stay); None where nothing is left. A line inside a statement (a string, a function's body) starts
    nothing, and a statement a copy does not hold whole (an answer that shares a line with one) stays.

    Example:
        >>> mark = "# explore (not graded)"
        >>> without_explore("def f():\\n    return 1\\n" + mark + "\\nplot(f)\\nx = 2", {mark + "\\nplot(f)"}, {mark})
        'def f():\\n    return 1\\n\\n\\nx = 2'
        >>> without_explore(mark + "\\nplot(f)\\nx = 2", {mark + "\\nplot(f)"}, {mark}, new=False)
        '\\n\\nx = 2'
        >>> without_explore(mark + "\\nplot(f)\\nx = 2", {mark + "\\nplot(f)"}, {mark}) is None
        True
        >>> without_explore("x = 2\\nimport go\\ngo.plot(x, h=500)", {mark + "\\nimport go\\ngo.plot(x, h=350)"})
        'x = 2\\n\\n'
    """
    lines = source_lines(source)
    starts = [i for i, line in enumerate(lines) if line.strip() in marks and not line[:1].isspace()]
    shapes = [shape for shape in map(_explore_shape, ignored) if shape]
    if not starts and not shapes:
        return source
    if starts and new and not any(line.strip() for line in lines[:starts[0]]):
        return None
    tree = parsed_or_none(without_magics(source))
    body = tree.body if tree else []
    inside = {row for node in body for row in range(_first_row(node), node.end_lineno)}
    cut = set()
    for i in starts:
        if i in cut or i in inside:
            continue
        held = [len(b) for b in map(_stripped_lines, ignored) if b[0] == lines[i].strip()
                and [line.rstrip() for line in lines[i:i + len(b)]] == b]
        cut.update(range(i, i + max(held) if held else len(lines)))   # the longest: a set has no fixed order
    cut.update(_copied_rows(body, shapes))
    if not cut:
        return source
    kept = ["\n" if i in cut and line.endswith(("\n", "\r")) else "" if i in cut else line
            for i, line in enumerate(lines)]
    return "".join(kept) if any(line.strip() for line in kept) else None


def _copied_rows(body: list, shapes: list) -> set[int]:
    """The 0-based rows of the runs of top-level statements in ``body`` that are an explore cell's code whole
    (``_explore_shape``: its statements in its order, whatever the comments, blank lines, layout and constants);
    where two cells' code starts at a statement, the longer is taken (whatever the order of ``shapes``)."""
    if not shapes:
        return set()
    found, rows, k = [_shape(node) for node in body], set(), 0
    while k < len(body):
        size = max((len(shape) for shape in shapes if tuple(found[k:k + len(shape)]) == shape), default=0)
        for node in body[k:k + size]:
            rows.update(range(_first_row(node) - 1, node.end_lineno))
        k += size or 1
    return rows


@functools.lru_cache(maxsize=64)
def _explore_shape(source: str) -> tuple[str, ...] | None:
    """The statements of an explore or check cell as a copy of it holds them, whichever its first line, comments,
    blank lines, layout and constants (``height=500``: other settings), each its ``_shape``; None for a cell too
    small to tell from a student's own code (one statement, or imports only: a student's own ``import``)."""
    tree = parsed_or_none(without_magics(source))
    if tree is None or len(tree.body) < 2 or all(isinstance(n, (ast.Import, ast.ImportFrom)) for n in tree.body):
        return None
    shape = tuple(map(_shape, tree.body))
    return None if None in shape else shape


def _shape(node) -> str | None:
    """A statement's tree written out as ``ast.dump`` would, less its constants (numbers, negative ones too, and
    text; a list, tuple or set of them is one, whatever its length: a grid of other settings) and its positions;
    None for a tree too deep to write (it matches no explore cell's)."""
    def constant(item) -> bool:
        return isinstance(item, ast.Constant) or (isinstance(item, ast.UnaryOp) and isinstance(item.op, ast.USub)
                                                  and isinstance(item.operand, ast.Constant))

    def text(item) -> str:
        if constant(item) or (isinstance(item, (ast.List, ast.Tuple, ast.Set)) and all(map(constant, item.elts))):
            return "Constant"
        if isinstance(item, ast.AST):
            return f"{type(item).__name__}({','.join(text(getattr(item, f, None)) for f in item._fields)})"
        if isinstance(item, list):
            return f"[{','.join(map(text, item))}]"
        return repr(item)

    try:
        return text(node)
    except RecursionError:
        return None


def _stripped_lines(source: str) -> list[str]:
    return [line.rstrip() for line in source_lines(source)] or [""]


def _first_row(node) -> int:
    """The line number (from 1) where a top-level statement starts, its first decorator's: the 0-based rows from
    it to its ``end_lineno`` are the statement's own, after its first."""
    return min([node.lineno] + [d.lineno for d in getattr(node, "decorator_list", [])])


def _cell_id(cell) -> str | None:
    """A cell's id where it has one as text (nbformat 4.5), else None."""
    value = cell.get("id")
    return value if isinstance(value, str) and value else None


def _same_text(source: str) -> str:
    """A cell's source as compared with the distributed one's (line ends and the surrounding blank space aside)."""
    return source.replace("\r\n", "\n").replace("\r", "\n").strip()


def with_seed(source: str, name: str, seed) -> str:
    """``source`` with the value of each top-level assignment to ``name`` (otter's ``seed_variable``)
    replaced by the grading seed; the rest of the line stays (``lab_seed = 1; x = 2`` keeps ``x``),
    and so do the line numbers. A cell that does not parse: every line ``name = ...`` whole, as before.

    Example:
        >>> with_seed("lab_seed = 1; x = 2\\nlab_seed = (3 +\\n    4)", "lab_seed", 7)
        'lab_seed = 7; x = 2\\nlab_seed = ((7\\n))'
    """
    tree = parsed_or_none(source)
    if tree is None:
        return re.sub(rf"^{re.escape(name)}\s*=.*$", f"{name} = {seed!r}", source, flags=re.M)
    values = [node.value for node in tree.body if node_assigns(node, name) and node.value is not None]
    lines = [line.encode() for line in source_lines(source)]   # col_offset counts UTF-8 bytes
    for value in sorted(values, key=lambda v: (v.lineno, v.col_offset), reverse=True):
        first, last = value.lineno - 1, value.end_lineno - 1
        breaks = last - first                       # a value over several lines: kept in parentheses
        text = (f"({seed!r}" + "\n" * breaks + ")" if breaks else repr(seed)).encode()
        lines[first:last + 1] = [lines[first][:value.col_offset] + text + lines[last][value.end_col_offset:]]
    return b"".join(lines).decode()


_LINE = re.compile(r"[^\r\n]*(?:\r\n|\r|\n)|[^\r\n]+\Z")


def source_lines(source: str) -> list[str]:
    """The lines of ``source`` as Python numbers them (``ast``'s ``lineno``), ends kept: split at ``\\n``,
    ``\\r\\n`` and ``\\r`` only. ``str.splitlines`` also splits at form feeds, ``\\x1c``-``\\x1e``, ``\\x85``
    and U+2028/2029 (a pasted comment has them), which shifted every later line.

    Example:
        >>> source_lines("a\\u2028b\\r\\nc\\rd")
        ['a\\u2028b\\r\\n', 'c\\r', 'd']
    """
    return _LINE.findall(source)


def node_assigns(node, name: str) -> bool:
    """Whether a statement is ``name = ...`` (among its targets) or ``name: T = ...``."""
    targets = node.targets if isinstance(node, ast.Assign) else [node.target] if isinstance(node, ast.AnnAssign) else []
    return any(isinstance(t, ast.Name) and t.id == name for t in targets)


_OTTER_ONLY = (ast.Import, ast.ImportFrom, ast.Expr, ast.Assign)   # what otter's own cells hold


def _without_otter(source: str) -> str | None:
    """``source`` without otter's statements (its ``otter.Notebook(...)`` and ``grader.check`` calls, which
    need otter's files); None for a cell of nothing else (otter's own cells, skipped as before).

    A student who ends an answer cell with ``grader.check("q1")`` keeps the answer: only that statement
    goes (a ``pass`` in its place, so line numbers stay). A compound statement (a loop, a function) is kept
    whole. A cell that runs otter and does not parse is skipped.
    """
    if not _RUNS_OTTER.search(source):
        return source
    tree = parsed_or_none(source)
    if tree is None:
        return None
    otters = [node for node in tree.body if isinstance(node, _OTTER_ONLY) and _RUNS_OTTER.search(
        ast.get_source_segment(source, node) or "")]
    rest = [node for node in tree.body if node not in otters and not _imports_otter(node)]
    if not rest:
        return None
    lines = [line.encode() for line in source_lines(source)]   # col_offset counts UTF-8 bytes
    for node in otters:
        for row in range(node.lineno - 1, node.end_lineno):
            line = lines[row]
            start = node.col_offset if row == node.lineno - 1 else 0
            end = node.end_col_offset if row == node.end_lineno - 1 else len(line.rstrip(b"\r\n"))
            filler = b"pass".ljust(end - start) if row == node.lineno - 1 else b" " * (end - start)
            lines[row] = line[:start] + filler + line[end:]
    return b"".join(lines).decode()


def _imports_otter(node) -> bool:
    names = [a.name for a in node.names] if isinstance(node, ast.Import) else \
        [node.module or ""] if isinstance(node, ast.ImportFrom) else []
    return bool(names) and all(n.split(".")[0] == "otter" for n in names)


_CELL_MAGIC = re.compile(r"\A(\s*)%%(?:time|capture)\b[^\n]*")       # run their body as Python, once
_OTHER_CELL_MAGIC = re.compile(r"\A\s*%%\w+")   # %%timeit (its body's names do not persist), %%bash, %%html, ...
_LINE_MAGIC = re.compile(r"^([ \t]*)(?:%(\w+)[ \t]?|!)(.*)$", re.M)   # %time stmt, %matplotlib inline, !pip ...
# x = %time f(), t = %timeit -o f(), files = !ls: IPython assigns what the magic returns
_ASSIGNED_MAGIC = re.compile(r"^([ \t]*[\w.]+(?:[ \t]*,[ \t]*[\w.]+)*[ \t]*=[ \t]*)(?:%(\w+)[ \t]?|!)(.*)$", re.M)
_HELP = re.compile(r"^([ \t]*)(?:\?{1,2}[\w.]+|[\w.]+\?{1,2})[ \t]*(?=\r?$)", re.M)   # torch.randn? ??lab2_f: help


def without_magics(source: str) -> str:
    """A cell Jupyter runs with IPython's magics, as Python that does the same work (else unchanged).

    Only for a cell that does not parse as Python (a ``%`` inside a string is left alone): a first line
    ``%%time`` or ``%%capture`` goes (the body runs); any other cell magic (``%%timeit``, whose body's
    names do not outlive it; ``%%bash``, ``%%html``: not Python) makes the whole cell do nothing; a line
    ``%time stmt`` runs ``stmt``; any other ``%magic`` line or ``!command`` line does nothing (``pass``:
    programs do not run in the sandbox), and so does a help line (``torch.randn?``, ``??f``). A magic whose
    value is assigned (``y = %time expr``, ``t = %timeit -o f()``, ``files = !ls``) assigns ``expr`` for
    ``%time`` and None for the others. Line numbers stay. Where it still does not parse, the cell fails as it did.

    Example:
        >>> without_magics("%%time\\nx = 1\\n%time y = 2\\n%matplotlib inline\\n!pip install torch")
        '\\nx = 1\\ny = 2\\npass\\npass'
        >>> without_magics("y = %time 1 + 1\\nt = %timeit -o y + 1\\nfiles = !ls")
        'y = 1 + 1\\nt = None\\nfiles = None'
    """
    if parsed_or_none(source) is not None:
        return source
    if _OTHER_CELL_MAGIC.match(source) and not _CELL_MAGIC.match(source):
        return "\n".join("pass" for _ in source.splitlines())
    plain = _CELL_MAGIC.sub(r"\1", source, count=1)
    plain = _ASSIGNED_MAGIC.sub(lambda m: m.group(1) + (m.group(3) if m.group(2) == "time" else "None"), plain)
    plain = _LINE_MAGIC.sub(lambda m: m.group(1) + (m.group(3) if m.group(2) == "time" else "pass"), plain)
    plain = _HELP.sub(r"\1pass", plain)
    return plain if parsed_or_none(plain) is not None else source


# -- running it in the sandbox -------------------------------------------------------------
def run(cells, questions, *, cell_timeout, test_timeout, notebook_timeout, require="auto", log=None,
        rule: dict | None = None, owners: dict | None = None, limits: Limits | None = None) -> dict:
    """Run cells then cases in sandboxes, restarting after a kill. Returns what the workers said.

    Args:
        rule: the lab's library rule (``rules.RULES``), enforced inside the sandbox (``guard``).
        owners: {cell index: [questions]} (``cell_questions``): where a rule finding in a cell counts.
        limits: the sandbox's caps (``sandbox.Limits``; default: ``Limits()`` with the CPU time of
            ``notebook_timeout`` plus a minute).

    Returns:
        ``{"cases": {(q, k): {"error", "records"}}, "skipped": [...units...], "status", "sandbox",
        "rules": {question: [reasons]}, "notes": [...], "caps": {...}, "cell_errors": {cell index: error}}``; a case
        missing from "cases" never finished (it scores 0); "cell_errors" holds what each cell that failed raised (in
        the last sandbox: a SyntaxError of another Python's syntax, a NameError), which the scores do not show.
    """
    cases = [(q, k, c["code"]) for q, spec in questions.items() for k, c in enumerate(spec["cases"])]
    skipped, results, status, kind, rules, notes, caps, cell_errors = [], {}, "ok", None, {}, [], {}, {}
    limits = limits or Limits(cpu_seconds=int(notebook_timeout) + 60)
    deadline = time.monotonic() + notebook_timeout
    for attempt in range(MAX_RESTARTS + 1):
        job = {"cells": [c for c in cells if ["cell", c[0]] not in skipped],
               "cases": [c for c in cases if ["case", c[0], c[1]] not in skipped], "cell_timeout": cell_timeout,
               "rule": _job_rule(rule)}
        unit_limits = {"cell": cell_timeout + GRACE, "case": test_timeout * 2 + GRACE}
        outcome = _attempt(job, unit_limits, deadline, require, log, test_timeout, limits)
        kind, caps = outcome["sandbox"], outcome["caps"]
        results, cell_errors = outcome["cases"], outcome["cell_errors"]  # a fresh attempt runs every unit again
        notes += outcome["notes"]
        for unit, name, how in outcome["rules"]:
            charged = [unit[1]] if unit[0] == "case" else (owners or {}).get(unit[1], [])
            charged = [q for q in charged if q in questions] or list(questions)
            if name == TAMPERED:  # switching the checks off is a cheat on every question
                charged = list(questions)
            where = f"cell {unit[1]}" if unit[0] == "cell" else f"test case {unit[2]}"
            reason = f"{how}: {name} (in {where}); this lab does not allow it in graded code"
            for q in charged:
                if reason not in rules.setdefault(q, []):
                    rules[q].append(reason)
        if outcome["finished"]:
            break
        if outcome["stuck"] is None or time.monotonic() >= deadline:
            status = "timeout" if time.monotonic() >= deadline else "crashed"
            break
        skipped.append(outcome["stuck"])
        status = "timeout"
        if log:
            log.write(f"\n[grader] {outcome['stuck']} ran past its limit or ended the worker: killed; "
                      f"{'restarting without it' if attempt < MAX_RESTARTS else 'no restarts left'}\n")
    else:
        status = "timeout"
    return {"cases": results, "skipped": skipped, "status": status, "sandbox": kind, "rules": rules,
            "notes": notes, "caps": caps, "cell_errors": cell_errors}


def _job_rule(rule: dict | None) -> dict | None:
    if not rule:
        return None
    return {"modules": list(rule["modules"]), "names": list(rule["names"]),
            "graded": {q: list(names) for q, names in rule.get("graded", {}).items()}}


def _attempt(job: dict, limits: dict, deadline: float, require: str, log, test_timeout: float,
             caps: Limits | None = None) -> dict:
    """One sandbox: feed it the job, follow its events, kill it when a unit overstays.

    Everything the worker sends is untrusted: ``_Protocol`` checks every line (size, JSON
    depth, types, the order of units); a malformed line fails the case that was running (or is
    noted, during a cell), and never stops this process.
    """
    read_fd, write_fd = os.pipe()
    env = {"PATH": os.path.dirname(sys.executable) + ":/usr/bin:/bin", "HOME": "/tmp", "TMPDIR": "/tmp",
           "OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1", "PYTHONDONTWRITEBYTECODE": "1", "MPLBACKEND": "Agg",
           "PYTHONUNBUFFERED": "1",
           **{k: os.environ[k] for k in ENV_PASSED if k in os.environ}}
    from sazo_lite.course.labs import TEST_TIMEOUT_ENV

    env[TEST_TIMEOUT_ENV] = str(test_timeout)
    import sazo_lite  # the worker imports the very package this grader runs (an editable install elsewhere or not)

    env["PYTHONPATH"] = str(Path(sazo_lite.__file__).resolve().parent.parent)
    box = Sandbox([sys.executable, "-m", "sazo_lite.course.labs.worker", str(write_fd)], env, pass_fds=(write_fd,),
                  require=require, limits=caps)
    protocol = _Protocol(job)
    output = bytearray()   # the submission's own output, at most LOG_BYTES (see _as_output)
    try:
        process = box.start(stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
        os.close(write_fd)
        write_fd = None
        with contextlib.suppress(BrokenPipeError):
            process.stdin.write(json.dumps(job).encode())
            process.stdin.close()
        selector = selectors.DefaultSelector()
        events = os.fdopen(read_fd, "rb", buffering=0)
        read_fd = None
        selector.register(events, selectors.EVENT_READ, "events")
        selector.register(process.stdout, selectors.EVENT_READ, "log")
        open_streams = 2
        while open_streams and not protocol.finished:
            now = time.monotonic()
            unit_deadline = protocol.started + limits[protocol.current[0]] if protocol.current else protocol.idle_until()
            limit = min(deadline, unit_deadline or deadline)
            if now >= limit:
                protocol.stuck = protocol.current if protocol.current or now >= deadline else protocol.idle()
                break
            box.sample()  # the CPU the sandbox used, from its cgroup (is the quota holding?)
            for key, _ in selector.select(timeout=min(1.0, limit - now)):
                chunk = os.read(key.fileobj.fileno(), 65536)
                if not chunk:
                    selector.unregister(key.fileobj)
                    open_streams -= 1
                    continue
                if key.data == "log":
                    if log and len(output) < LOG_BYTES:
                        output += chunk[:LOG_BYTES - len(output)]
                    continue
                protocol.feed(chunk)
        protocol.ended()
    finally:
        for fd in (read_fd, write_fd):
            if fd is not None:
                os.close(fd)
        box.close()
    if log:
        log.write(_as_output(bytes(output)))
        for index, error in protocol.cell_errors.items():   # one line each: the text is the submission's
            log.write(f"\n[grader] cell {index} raised: {' | '.join(_as_output(error.encode()).splitlines())}\n")
        for note in protocol.notes:
            log.write(f"\n[grader] {note}\n")
    return {"cases": protocol.cases, "finished": protocol.finished, "stuck": protocol.stuck, "sandbox": box.kind,
            "rules": protocol.rules, "notes": protocol.notes, "caps": box.caps, "cell_errors": protocol.cell_errors}


def _as_output(data: bytes) -> str:
    """The submission's output for grade.log, such that nothing in it reads as the grader's notes.

    Decoded once (a character split between two reads of the pipe stays whole); carriage returns (progress
    bars) end lines; other control characters (terminal escapes that move the cursor or clear the screen)
    and Unicode line separators are shown escaped (``\\x1b``); a line that starts like a note of the grader
    (``[grader] ...``: a kill, a restart) is marked ``[output] [grader] ...``.

    Example:
        >>> _as_output(b"ok\\r\\n[grader] killed\\x1b[2J\\rdone \\xc3\\xa9")
        'ok\\n[output] [grader] killed\\\\x1b[2J\\ndone é'
    """
    text = data.decode("utf-8", "replace").replace("\r\n", "\n").replace("\r", "\n")
    text = _CONTROL.sub(lambda m: f"\\x{ord(m.group()):02x}" if ord(m.group()) < 256 else f"\\u{ord(m.group()):04x}", text)
    return re.sub(r"^\[grader\]", "[output] [grader]", text, flags=re.M)


_CONTROL = re.compile("[\x00-\x08\x0b-\x1f\x7f\x85\u2028\u2029]")


MAX_LINE = 8 * 2 ** 20   # bytes of one event line from the worker; a longer one fails its case
MAX_EVENTS = 100_000     # lines per sandbox; past that the rest is ignored
MAX_NOTES = 50


class _Protocol:
    """The trusted side of the worker's event stream (see ``worker``): strict, never raises.

    Units must come in the job's order: ``start`` of the next unit, then its ``end``; ``rule``
    events may come at any time. A line that is too long, not JSON, nested too deeply, of the
    wrong shape or out of order is *malformed*: the case running (or the case just ended, when
    it comes between units) fails with the reason; during a cell it is only noted.
    """

    def __init__(self, job: dict):
        self.units = [["cell", i] for i, _ in job["cells"]] + [["case", q, k] for q, k, _ in job["cases"]]
        self.position = 0                      # index of the next unit to start
        self.current, self.started, self.last, self.ended_at = None, 0.0, None, 0.0
        self.cases: dict = {}
        self.cell_errors: dict = {}            # cell index -> what it raised (at most MAX_NOTES cells)
        self.rules: list = []
        self.notes: list[str] = []
        self.finished, self.stuck = False, None
        self.buffer, self.dropping, self.count = b"", False, 0
        self.poisoned: set = set()

    def feed(self, chunk: bytes) -> None:
        self.buffer += chunk
        while True:
            cut = self.buffer.find(b"\n")
            if cut < 0:
                if len(self.buffer) > MAX_LINE:
                    if not self.dropping:
                        self.malformed(f"a report line longer than {MAX_LINE // 2 ** 20} MiB")
                    self.dropping, self.buffer = True, b""
                return
            line, self.buffer = self.buffer[:cut], self.buffer[cut + 1:]
            if self.dropping:  # the tail of an over-long line
                self.dropping = False
                continue
            if len(line) > MAX_LINE:
                self.malformed(f"a report line longer than {MAX_LINE // 2 ** 20} MiB")
                continue
            if not line.strip():
                continue  # the worker starts every event on a fresh line: the blank lines are not events
            self.count += 1
            if self.count > MAX_EVENTS:
                if self.count == MAX_EVENTS + 1:
                    self.note(f"more than {MAX_EVENTS} report lines: the rest ignored")
                continue
            try:
                self.line(line)
            except Exception as exc:  # belt and braces: a line this class did not foresee
                self.malformed(f"an unreadable report line ({type(exc).__name__})")

    def line(self, line: bytes) -> None:
        if not line.strip():
            return
        try:
            event = json.loads(line)
        except (ValueError, RecursionError):
            return self.malformed("a report line that is not JSON (or nested too deeply)")
        if not isinstance(event, dict):
            return self.malformed("a report line that is not an object")
        if event.get("done") is True and len(event) == 1:
            if self.current is None and self.position == len(self.units):
                self.finished = True
            else:
                self.malformed("'done' before every unit ran")
            return
        if "rule" in event:
            rule, unit = event.get("rule"), event.get("unit")
            if not (isinstance(rule, list) and len(rule) == 2 and all(isinstance(x, str) and len(x) <= 300 for x in rule)):
                return self.malformed("a rule report of the wrong shape")
            if unit is None or unit not in self.units:
                unit = self.current or self.last
            if unit is not None and len(self.rules) < 1000:
                self.rules.append((list(unit), rule[0], rule[1]))
            return
        unit, phase = event.get("unit"), event.get("phase")
        if not isinstance(unit, list) or phase not in ("start", "end"):
            return self.malformed("a report line without a valid unit and phase")
        if phase == "start":
            if self.current is not None or self.position >= len(self.units) or unit != self.units[self.position]:
                return self.malformed(f"a start of {_short(unit)} out of order")
            self.current, self.started = unit, time.monotonic()
            self.position += 1
            return
        if unit != self.current:
            return self.malformed(f"an end of {_short(unit)} out of order")
        error = event.get("error")
        if error is not None and not isinstance(error, str):
            return self.malformed("an error that is not text")
        if unit[0] == "cell" and error and len(self.cell_errors) < MAX_NOTES:
            self.cell_errors[unit[1]] = error[:500]
        if unit[0] == "case":
            records = event.get("records")
            why = _check_records(records)
            key = (unit[1], unit[2])
            if key in self.poisoned:
                pass  # already failed with its reason
            elif why:
                self.cases[key] = {"error": f"the grader rejected what this case recorded: {why}", "records": []}
            else:
                self.cases[key] = {"error": error[:2000] if error else None, "records": records}
        self.last, self.current, self.ended_at = unit, None, time.monotonic()

    def idle_until(self) -> float | None:
        """When the worker, between units, has taken too long (None: no unit ended yet; it may still be loading)."""
        return None if self.last is None else self.ended_at + IDLE_LIMIT

    def idle(self) -> list | None:
        """The worker hung between units: after the last one, every result stands (as if it had said 'done');
        before, the unit that ended last left what hangs (its garbage's ``__del__``, a thread), and is blamed."""
        if self.position == len(self.units):
            self.finished = True
            self.note(f"the worker did not end within {IDLE_LIMIT:g} s of its last unit: stopped, every result stands")
            return None
        self.note(f"the worker hung for {IDLE_LIMIT:g} s after {_short(self.last)}")
        return self.last

    def malformed(self, why: str) -> None:
        unit = self.current if self.current is not None else self.last
        if unit is not None and unit[0] == "case":
            key = (unit[1], unit[2])
            self.poisoned.add(key)
            self.cases[key] = {"error": f"malformed report from the sandbox: {why}", "records": []}
        else:
            self.note(f"ignored a malformed report line{' during ' + _short(unit) if unit else ''}: {why}")

    def ended(self) -> None:
        """The stream ended (or was cut): a worker gone inside a unit blames it; between units, the last case."""
        if self.finished or self.stuck is not None:
            return
        if self.current is not None:
            self.stuck = self.current  # the worker died (or closed its pipe) inside this unit
        elif self.last is not None and self.last[0] == "case" and self.position < len(self.units):
            self.malformed("the worker ended between two units")

    def note(self, text: str) -> None:
        if len(self.notes) < MAX_NOTES:
            self.notes.append(text)


def _short(unit) -> str:
    return json.dumps(unit)[:80]


def _check_records(records) -> str | None:
    if not isinstance(records, list) or len(records) > 1000:
        return "records are not a list (of at most 1000)"
    budget = [2 * MAX_ITEMS + 10]
    for record in records:
        if not isinstance(record, dict) or set(record) - {"value", "rtol", "atol"}:
            return "a record of the wrong shape"
        for tol in ("rtol", "atol"):
            value = record.get(tol)
            if value is not None and not (type(value) in (int, float) and math.isfinite(value) and value >= 0):
                return f"a record with an invalid {tol}"
        why = check_encoded(record.get("value"), budget)
        if why:
            return why
    return None


# -- the reference and the scores ----------------------------------------------------------
def reference(autograder: Path, *, cell_timeout, test_timeout, notebook_timeout, require="auto") -> dict:
    """What every case records on the solutions (``autograder/<lab>.ipynb`` next to the zip).

    Cached in ``<zip>.reference-<hash>.json`` (the hash covers the zip, the solutions, the library, the versions
    of Python, PyTorch and NumPy, and SAZO_FAST). Raises RuntimeError if a case fails on the solutions or records
    nothing.
    """
    autograder = Path(autograder)
    config, questions = load_tests(autograder)
    solutions = solutions_notebook(autograder, config)
    digest = hashlib.sha256(autograder.read_bytes() + solutions.read_bytes() + _library_bytes() + _runtime_bytes()
                            + os.environ.get("SAZO_FAST", "").encode()).hexdigest()[:16]
    cache = autograder.with_name(f"{autograder.name}.reference-{digest}.json")
    if cache.exists():
        return {tuple(json.loads(k)): v for k, v in json.loads(cache.read_text()).items()}
    import io

    log = io.StringIO()
    outcome = run(notebook_cells(solutions, config), questions, cell_timeout=cell_timeout, test_timeout=test_timeout,
                  notebook_timeout=notebook_timeout, require=require, log=log, rule=lab_rule(config),
                  owners=cell_questions(solutions, (lab_rule(config) or {}).get("graded"), questions))
    wrong = [f"{q}: {reason}" for q, reasons in outcome["rules"].items() for reason in reasons]
    for question, spec in questions.items():
        for k in range(len(spec["cases"])):
            got = outcome["cases"].get((question, k))
            if got is None or got["error"] or not got["records"]:
                wrong.append(f"{question} case {k}: " + ("did not finish" if got is None else got["error"] or "records nothing"))
    if wrong:
        raise RuntimeError(f"the solutions fail their own tests ({autograder.name}):\n" + "\n".join(wrong)
                           + "\n--- their output (end) ---\n" + log.getvalue()[-3000:])
    for stale in autograder.parent.glob(f"{autograder.name}.reference-*.json"):
        stale.unlink(missing_ok=True)  # from older solutions or library versions
    write_json(cache, {json.dumps(list(k)): v for k, v in outcome["cases"].items()})
    return outcome["cases"]


def solutions_notebook(autograder: Path, config: dict) -> Path:
    """The solutions notebook ``otter assign`` wrote next to the autograder zip (ValueError if missing)."""
    autograder = Path(autograder)
    solutions = autograder.parent / f"{config.get('assignment_name') or autograder.stem.split('-autograder')[0]}.ipynb"
    if not solutions.exists():
        raise ValueError(f"Invalid autograder: no solutions notebook {solutions.name} next to {autograder.name}")
    return solutions


def lab_rule(config: dict) -> dict | None:
    """The library rule of the autograder's lab (``rules.RULES``), by its assignment name."""
    from sazo_lite.course.labs.rules import rule_for

    name = config.get("assignment_name")
    return rule_for(name) if isinstance(name, str) else None


def _runtime_bytes() -> bytes:
    """The versions of Python, PyTorch and NumPy the solutions run on: the reference is stale when one changes (an
    upgrade can change a sampler's draws or a kernel's last bits, and hidden cases compare to 1e-12)."""
    import numpy
    import torch

    return f"{sys.version}\0{torch.__version__}\0{numpy.__version__}".encode()


def _library_bytes() -> bytes:
    """The sazo_lite sources: the reference is stale when the library the solutions call changes."""
    import sazo_lite

    root = Path(sazo_lite.__file__).resolve().parent
    return b"".join(path.read_bytes() for path in sorted(root.rglob("*.py")))


def score(questions: dict, outcome: dict, expected: dict) -> dict:
    """Per question: points of the cases that raised nothing and recorded the solution's values;
    0 for a question that broke the lab's library rule (``outcome["rules"]``), with the reason."""
    scored = {}
    for question, spec in questions.items():
        cases = []
        broken = (outcome.get("rules") or {}).get(question)
        for k, points in enumerate(spec["points"]):
            try:
                reason = _case_reason(question, k, outcome, expected)
            except Exception as exc:  # a value the checks let through but compare() chokes on
                reason = f"the grader could not compare what this case recorded ({type(exc).__name__})"
            if reason is None and broken:
                reason = "the library is not the answer: " + "; ".join(broken)[:1000]
            hidden = spec["cases"][k]["hidden"]
            cases.append({"case": k, "hidden": hidden, "points": points, "passed": reason is None, "message": reason})
        total = sum(c["points"] for c in cases if c["passed"])
        entry = {"score": total, "possible": sum(spec["points"]), "cases": cases}
        if broken:
            entry["rule"] = broken
        scored[question] = entry
    return scored


def _case_reason(question: str, k: int, outcome: dict, expected: dict) -> str | None:
    got, want = outcome["cases"].get((question, k)), expected.get((question, k), {"records": []})
    if ["case", question, k] in outcome["skipped"]:
        return "timed out (sandbox killed)"
    if got is None:
        return "not run (an earlier cell or case timed out or the worker died)"
    if got["error"]:
        return got["error"]
    if len(got["records"]) != len(want["records"]):
        return f"recorded {len(got['records'])} values, expected {len(want['records'])}"
    for i, (w, g) in enumerate(zip(want["records"], got["records"])):
        rtol = RTOL if w.get("rtol") is None else w["rtol"]
        atol = ATOL if w.get("atol") is None else w["atol"]
        why = compare(w["value"], g.get("value") if isinstance(g, dict) else None, rtol, atol)
        if why:
            return f"value {i + 1}: {why}"
    return None

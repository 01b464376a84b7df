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
import contextlib
import hashlib
import json
import os
import re
import selectors
import subprocess
import sys
import time
import zipfile
from pathlib import Path

from sazo_lite.course.labs.sandbox import Sandbox
from sazo_lite.course.labs.values import ATOL, RTOL, compare

GRACE = 5.0          # seconds past a unit's own limit before the sandbox is killed
MAX_RESTARTS = 3     # fresh sandboxes after a kill; then what is left scores 0
LOG_BYTES = 2 ** 20  # of the submission's output kept in grade.log
ENV_PASSED = ("SAZO_FAST",)  # environment the sandboxed worker inherits (besides its own)
_RUNS_OTTER = re.compile(r"otter\.Notebook\(|grader\.check(_all)?\(")  # otter's init and check cells


# -- the tests and the job ---------------------------------------------------------------
def load_tests(autograder: Path) -> tuple[dict, dict]:
    """(otter_config, {question: {"points": [...], "cases": [{"hidden", "code"}]}}) from the zip."""
    with zipfile.ZipFile(autograder) as archive:
        names = archive.namelist()
        config = json.loads(archive.read("otter_config.json")) if "otter_config.json" in names else {}
        questions = {}
        for name in sorted(n for n in names if n.startswith("tests/") and n.endswith(".py")):
            test = _test_dict(archive.read(name).decode())
            cases = [{"hidden": bool(c.get("hidden")), "code": _from_doctest(c["code"])}
                     for suite in test.get("suites", []) for c in suite.get("cases", [])]
            points = test.get("points", 1)
            if not isinstance(points, list):
                points = [float(points) / max(len(cases), 1)] * len(cases)
            questions[test.get("name", Path(name).stem)] = {"points": [float(p) for p in points], "cases": cases}
    return config, questions


def _test_dict(source: str) -> dict:
    """The ``test = {...}`` literal of an OK-format test file, read without executing it."""
    for node in ast.parse(source).body:
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


def notebook_cells(notebook: Path, config: dict) -> list[tuple[int, str]]:
    """The code cells to run: not tagged ``otter_ignore``, not otter's own; the seed set as otter does."""
    import nbformat

    nb = nbformat.read(notebook, as_version=4)
    cells, seed_name = [], config.get("seed_variable")
    for index, cell in enumerate(nb.cells):
        if cell.cell_type != "code" or "otter_ignore" in cell.metadata.get("tags", []):
            continue
        source = cell.source
        if _RUNS_OTTER.search(source):
            continue
        if seed_name and config.get("seed") is not None:
            source = re.sub(rf"^{re.escape(seed_name)}\s*=.*$", f"{seed_name} = {config['seed']!r}", source, flags=re.M)
        cells.append((index, source))
    return cells


# -- running it in the sandbox -------------------------------------------------------------
def run(cells, questions, *, cell_timeout, test_timeout, notebook_timeout, require="auto", log=None) -> dict:
    """Run cells then cases in sandboxes, restarting after a kill. Returns what the workers said.

    Returns:
        ``{"cases": {(q, k): {"error", "records"}}, "skipped": [...units...], "status", "sandbox"}``;
        a case missing from "cases" never finished (it scores 0).
    """
    cases = [(q, k, c["code"]) for q, spec in questions.items() for k, c in enumerate(spec["cases"])]
    skipped, results, status, kind = [], {}, "ok", None
    deadline = time.monotonic() + notebook_timeout
    for attempt in range(MAX_RESTARTS + 1):
        job = {"cells": [c for c in cells if ["cell", c[0]] not in skipped],
               "cases": [c for c in cases if ["case", c[0], c[1]] not in skipped], "cell_timeout": cell_timeout}
        limits = {"cell": cell_timeout + GRACE, "case": test_timeout * 2 + GRACE}
        outcome = _attempt(job, limits, deadline, require, log, test_timeout)
        kind = outcome["sandbox"]
        results = outcome["cases"]  # a fresh attempt recomputes every case it runs
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
    return {"cases": results, "skipped": skipped, "status": status, "sandbox": kind}


def _attempt(job: dict, limits: dict, deadline: float, require: str, log, test_timeout: float) -> dict:
    """One sandbox: feed it the job, follow its events, kill it when a unit overstays."""
    read_fd, write_fd = os.pipe()
    env = {"PATH": os.path.dirname(sys.executable) + ":/usr/bin:/bin", "HOME": "/tmp", "TMPDIR": "/tmp",
           "OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1", "PYTHONDONTWRITEBYTECODE": "1", "MPLBACKEND": "Agg",
           "PYTHONUNBUFFERED": "1",
           **{k: os.environ[k] for k in ENV_PASSED if k in os.environ}}
    from sazo_lite.course.labs import TEST_TIMEOUT_ENV

    env[TEST_TIMEOUT_ENV] = str(test_timeout)
    box = Sandbox([sys.executable, "-m", "sazo_lite.course.labs.worker", str(write_fd)], env, pass_fds=(write_fd,),
                  require=require)
    cases, current, finished, stuck, kept = {}, None, False, None, 0
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
        buffer, unit_deadline, open_streams = b"", None, 2
        while open_streams and not finished:
            now = time.monotonic()
            limit = min(deadline, unit_deadline or deadline)
            if now >= limit:
                stuck = current if current is not None else None
                break
            for key, _ in selector.select(timeout=min(1.0, limit - now)):
                chunk = os.read(key.fileobj.fileno(), 65536)
                if not chunk:
                    selector.unregister(key.fileobj)
                    open_streams -= 1
                    continue
                if key.data == "log":
                    if log and kept < LOG_BYTES:
                        log.write(chunk[:LOG_BYTES - kept].decode(errors="replace"))
                        kept += len(chunk)
                    continue
                buffer += chunk
                if len(buffer) > 64 * 2 ** 20:
                    raise RuntimeError("the worker sent too much")
                *lines, buffer = buffer.split(b"\n")
                for line in lines:
                    with contextlib.suppress(ValueError, TypeError, KeyError, AttributeError):
                        event = json.loads(line)
                        if event.get("done"):
                            finished = True
                            continue
                        unit = list(event["unit"])
                        if event["phase"] == "start":
                            current, unit_deadline = unit, time.monotonic() + limits[unit[0]]
                        else:
                            if unit[0] == "case":
                                cases[(unit[1], unit[2])] = {"error": event.get("error"),
                                                             "records": list(event.get("records") or [])}
                            current, unit_deadline = None, None
        if not finished and stuck is None and current is not None:
            stuck = current  # the worker died (or closed its pipe) inside this unit
    finally:
        for fd in (read_fd, write_fd):
            if fd is not None:
                os.close(fd)
        box.close()
    return {"cases": cases, "finished": finished, "stuck": stuck, "sandbox": box.kind}



# -- the reference and the scores ----------------------------------------------------------
def reference(autograder: Path, *, cell_timeout, test_timeout, notebook_timeout, require="auto") -> dict:
    """What every case records on the solutions (``autograder/<lab>.ipynb`` next to the zip).

    Cached in ``<zip>.reference-<hash>.json`` (the hash covers the zip, the solutions and
    SAZO_FAST). Raises RuntimeError if a case fails on the solutions or records nothing.
    """
    autograder = Path(autograder)
    config, questions = load_tests(autograder)
    solutions = autograder.parent / f"{config.get('assignment_name') or autograder.stem.split('-autograder')[0]}.ipynb"
    if not solutions.exists():
        raise ValueError(f"Invalid autograder: no solutions notebook {solutions.name} next to {autograder.name}")
    digest = hashlib.sha256(autograder.read_bytes() + solutions.read_bytes() + _library_bytes()
                            + os.environ.get("SAZO_FAST", "").encode()).hexdigest()[:16]
    cache = autograder.with_name(f"{autograder.name}.reference-{digest}.json")
    if cache.exists():
        return {tuple(json.loads(k)): v for k, v in json.loads(cache.read_text()).items()}
    import io

    log = io.StringIO()
    outcome = run(notebook_cells(solutions, config), questions, cell_timeout=cell_timeout, test_timeout=test_timeout,
                  notebook_timeout=notebook_timeout, require=require, log=log)
    wrong = []
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
    cache.write_text(json.dumps({json.dumps(list(k)): v for k, v in outcome["cases"].items()}))
    return outcome["cases"]


def _library_bytes() -> bytes:
    """The sazo_lite sources: the reference is stale when the library the solutions call changes."""
    import sazo_lite

    root = Path(sazo_lite.__file__).resolve().parent
    return b"".join(path.read_bytes() for path in sorted(root.rglob("*.py")))


def score(questions: dict, outcome: dict, expected: dict) -> dict:
    """Per question: points of the cases that raised nothing and recorded the solution's values."""
    scored = {}
    for question, spec in questions.items():
        cases = []
        for k, points in enumerate(spec["points"]):
            got, want = outcome["cases"].get((question, k)), expected.get((question, k), {"records": []})
            if ["case", question, k] in outcome["skipped"]:
                reason = "timed out (sandbox killed)"
            elif got is None:
                reason = "not run (an earlier cell or case timed out or the worker died)"
            elif got["error"]:
                reason = got["error"]
            elif len(got["records"]) != len(want["records"]):
                reason = f"recorded {len(got['records'])} values, expected {len(want['records'])}"
            else:
                reason = None
                for i, (w, g) in enumerate(zip(want["records"], got["records"])):
                    rtol = RTOL if w.get("rtol") is None else w["rtol"]
                    atol = ATOL if w.get("atol") is None else w["atol"]
                    why = compare(w["value"], g.get("value") if isinstance(g, dict) else None, rtol, atol)
                    if why:
                        reason = f"value {i + 1}: {why}"
                        break
            hidden = spec["cases"][k]["hidden"]
            cases.append({"case": k, "hidden": hidden, "points": points, "passed": reason is None, "message": reason})
        total = sum(c["points"] for c in cases if c["passed"])
        scored[question] = {"score": total, "possible": sum(spec["points"]), "cases": cases}
    return scored

"""Graded labs: build student notebooks and autograders with otter-grader, grade in a sandbox.

Instructor masters live in ``labs/`` (otter-assign format). Three commands:

    python -m sazo_lite.course.labs assign                      # every master -> build/labs/<lab>/
    python -m sazo_lite.course.labs grade lab1 submission.ipynb  # one submission -> results JSON + score
    python -m sazo_lite.course.labs grade-all lab1 submissions/  # a folder -> one CSV of scores

otter assign builds the student notebooks (public tests for ``grader.check``) and the
autograder zip (public and hidden tests). Grading does not use ``otter run``: each submission
runs in a bubblewrap sandbox (``sandbox``) that sees neither the masters nor other submissions,
its test cases ``record`` what the student's code produced, and this (trusted) process compares
those values with the solutions' and writes the scores after the sandbox is gone (``grading``).
Nothing hangs: ``cell_timeout`` per cell, ``test_timeout`` per call into student code
(``time_limit``), a kill and a fresh sandbox for a cell or case that dodges them, and
``notebook_timeout`` for the whole submission. The sandbox is capped (``sandbox.Limits``), the
parent checks every line the sandbox reports, and each lab's library rule (``rules``) is
enforced inside it (``guard``). otter is imported lazily (``.[labs]`` extra).
"""
from __future__ import annotations

import argparse
import contextlib
import csv
import hashlib
import io
import os
import re
import shutil
import signal
import stat
import subprocess
import sys
import threading
from pathlib import Path

from sazo_lite.atomic import write_bytes, write_json, write_text
from sazo_lite.course.labs.values import record

__all__ = ["LabTimeout", "time_limit", "record", "find_masters", "assign", "assign_all", "autograder_zip",
           "grade", "grade_all", "safe_name", "main"]

# The repository (editable install); from an installed copy, the current directory.
REPO = Path(__file__).resolve().parent.parent.parent
ROOT = REPO if (REPO / "labs").is_dir() else Path.cwd()
LABS_DIR = ROOT / "labs"
BUILD_DIR = ROOT / "build" / "labs"
CELL_TIMEOUT = 120       # seconds per cell while grading (a looping answer scores 0)
NOTEBOOK_TIMEOUT = 900   # seconds per submission, restarts included (then what is left scores 0)
TEST_TIMEOUT = 60        # seconds per test's calls into student code (``time_limit``)
TEST_TIMEOUT_ENV = "SAZO_LAB_TEST_TIMEOUT"  # how grade() passes its test_timeout into the sandbox
MAX_FINDINGS = 20        # unreadable cells named per submission (results.json, reason)

# Held at import, before any student code runs in the same process.
_setitimer, _signal, _ITIMER, _SIGALRM = getattr(signal, "setitimer", None), signal.signal, \
    getattr(signal, "ITIMER_REAL", None), getattr(signal, "SIGALRM", None)


class LabTimeout(BaseException):
    """Student code ran past its time limit.

    A ``BaseException`` (like ``KeyboardInterrupt``), so ``except Exception:`` in student code
    does not catch it; a bare ``except:`` can, and then the grader kills the sandbox instead.
    """


@contextlib.contextmanager
def time_limit(seconds: float | None = None):
    """Raise ``LabTimeout`` in the block after ``seconds`` (SIGALRM; main thread, Unix only).

    Lab tests wrap calls into student code with it, so an infinite loop inside a function
    fails that test instead of hanging the grading process. Elsewhere it is a no-op.
    ``seconds=None`` reads ``$SAZO_LAB_TEST_TIMEOUT`` (set by ``grade``), else 60.

    Example:
        >>> with time_limit(5):
        ...     total = sum(range(10))
    """
    if seconds is None:
        seconds = float(os.environ.get(TEST_TIMEOUT_ENV, TEST_TIMEOUT))
    if _setitimer is None or threading.current_thread() is not threading.main_thread():
        yield
        return

    def _raise(signum, frame):
        raise LabTimeout(f"student code ran longer than {seconds} s")

    previous = _signal(_SIGALRM, _raise)
    _setitimer(_ITIMER, seconds)
    try:
        yield
    finally:
        _setitimer(_ITIMER, 0)
        _signal(_SIGALRM, previous)

# -- otter assign --------------------------------------------------------------------------
def find_masters(labs_dir: Path = LABS_DIR) -> list[Path]:
    """The instructor masters: ``labs/lab*.ipynb``, sorted."""
    return sorted(Path(labs_dir).glob("lab*.ipynb"))


def resolve_master(lab: str, labs_dir: Path = LABS_DIR) -> Path:
    """A master from a name such as ``lab1``, ``lab1_two_point_estimator`` or a path."""
    path = Path(lab)
    if path.suffix == ".ipynb" and path.exists():
        return path
    matches = [m for m in find_masters(labs_dir) if m.stem == lab or m.stem.split("_")[0] == lab]
    if len(matches) != 1:
        names = ", ".join(m.stem for m in find_masters(labs_dir))
        raise ValueError(f"Invalid lab: {lab!r} (expected one of: {names})")
    return matches[0]


def assign(master: Path, build_dir: Path = BUILD_DIR) -> Path:
    """``otter assign`` one master into ``build_dir/<stem>/`` (student/ and autograder/).

    Returns:
        The output folder. Old output is removed first (the zip name carries a timestamp).
    """
    master = Path(master).resolve()   # otter runs in the master's folder: every path absolute
    check_master(master)
    out = Path(build_dir).resolve() / master.stem
    shutil.rmtree(out, ignore_errors=True)
    out.parent.mkdir(parents=True, exist_ok=True)
    command = [sys.executable, "-m", "otter", "assign", "--no-pdfs", str(master), str(out)]
    done = subprocess.run(command, capture_output=True, text=True, cwd=master.parent)
    if done.returncode != 0:   # otter's reason is its traceback's last line: first, then its whole output
        reason = next((line for line in reversed(done.stderr.splitlines()) if line.strip()), "no message")
        raise RuntimeError(f"otter assign failed for {master.name}: {reason}\n\n{done.stdout}\n{done.stderr}")
    for notebook in sorted(out.glob("*/*.ipynb")):  # the student notebook and the solutions
        _stable_ids(notebook, master)
    return out


def check_master(master: Path) -> None:
    """Refuse a master that otter would fail on with a traceback, or build into a lab that grades nothing or
    enforces no library rule: ValueError naming the master and what to fix.

    Checked: it reads as a notebook; its metadata has a ``kernelspec`` (otter reads the language there); its first
    cell is the raw ``# ASSIGNMENT CONFIG`` cell, whose ``name`` has an entry in ``rules.RULES``; it has a question,
    and each question has tests (code cells between ``# BEGIN TESTS`` and ``# END TESTS``; none for one marked
    ``manual: true``), as many as its ``points`` list has entries, one of them hidden.
    """
    import nbformat
    import yaml

    from sazo_lite.course.labs.rules import rule_for

    name = Path(master).name
    try:
        nb = nbformat.read(master, as_version=4)
    except Exception as exc:  # not JSON, not a notebook, not readable: nbformat's and the system's errors vary
        raise ValueError(f"Invalid master: {name} cannot be read as a notebook ({type(exc).__name__}: "
                         f"{str(exc)[:200]})") from None
    if not isinstance(nb.metadata.get("kernelspec"), dict):
        raise ValueError(f"Invalid master: {name} has no kernelspec in its metadata (otter reads the language "
                         f"there): open it in Jupyter with a Python 3 kernel and save it")
    cells = [c for c in nb.cells if isinstance(c.source, str) and c.source.strip()]
    first = cells[0] if cells else None
    if first is None or first.cell_type != "raw" or not first.source.lstrip().startswith("# ASSIGNMENT CONFIG"):
        raise ValueError(f"Invalid master: {name} does not start with a raw '# ASSIGNMENT CONFIG' cell "
                         f"(otter's assign format, labs/README.md)")
    config = _yaml_block(first.source, "the ASSIGNMENT CONFIG cell", name, yaml)
    assignment = config.get("name")
    if not isinstance(assignment, str) or rule_for(assignment) is None:
        raise ValueError(f"Invalid master: {name}: its assignment name {assignment!r} has no entry in "
                         f"sazo_lite/course/labs/rules.py (RULES: what its graded cells may use from the library)")
    questions, inside = [], False
    for cell in cells:
        text = cell.source.lstrip()
        if cell.cell_type == "raw" and text.startswith("# BEGIN QUESTION"):
            questions.append([_yaml_block(text, "a '# BEGIN QUESTION' cell", name, yaml), 0, 0])
        elif cell.cell_type == "raw" and text.startswith(("# BEGIN TESTS", "# END TESTS")):
            inside = text.startswith("# BEGIN TESTS")
        elif cell.cell_type == "code" and inside and questions:
            questions[-1][1] += 1
            questions[-1][2] += text.startswith("# HIDDEN")
    if not questions:
        raise ValueError(f"Invalid master: {name} has no questions (raw '# BEGIN QUESTION' cells): it would grade "
                         f"nothing")
    for spec, tests, hidden in questions:
        question, points = spec.get("name", "?"), spec.get("points")
        if spec.get("manual") is True and tests == 0:
            continue   # otter's manually graded question: read by hand, nothing to test
        if tests == 0:
            raise ValueError(f"Invalid master: {name}: question {question} has no tests (code cells between "
                             f"'# BEGIN TESTS' and '# END TESTS')")
        if isinstance(points, list) and len(points) != tests:
            raise ValueError(f"Invalid master: {name}: question {question} lists {len(points)} points for "
                             f"{tests} tests (expected one entry per test, public first)")
        if hidden == 0:   # the public tests state their expected values: writing those down would score it all
            raise ValueError(f"Invalid master: {name}: question {question} has no hidden test (a test cell whose "
                             f"first line is '# HIDDEN'): its public values alone would score it")


def _yaml_block(source: str, what: str, name: str, yaml) -> dict:
    """The YAML under a raw cell's first line (otter's config cells), as a dict; ValueError naming ``what``."""
    try:
        value = yaml.safe_load(source.lstrip().partition("\n")[2]) or {}
    except yaml.YAMLError as exc:
        raise ValueError(f"Invalid master: {name}: {what} is not YAML ({str(exc)[:200]})") from None
    if not isinstance(value, dict):
        raise ValueError(f"Invalid master: {name}: {what} is not a YAML mapping (key: value lines)")
    return value


def _stable_ids(notebook: Path, master: Path) -> None:
    """Give the cells otter added (its init and ``grader.check`` cells, whose ids it draws at random) ids
    made from the master's name and their source, so that assigning a master again writes the same
    notebooks byte for byte (a student version to diff against the one distributed). Ids the master
    gave its own cells are kept."""
    import nbformat

    nb = nbformat.read(notebook, as_version=4)
    kept = {cell.get("id") for cell in nbformat.read(master, as_version=4).cells}
    taken = {cell.get("id") for cell in nb.cells if cell.get("id") in kept}
    changed = False
    for cell in nb.cells:
        if "id" not in cell or cell["id"] in kept:
            continue
        k = 0
        while True:
            text = f"{master.stem}\0{cell.cell_type}\0{cell.source}\0{k}"
            new = hashlib.sha256(text.encode("utf-8", "surrogatepass")).hexdigest()[:8]
            if new not in taken:
                break
            k += 1
        taken.add(new)
        changed |= cell["id"] != new
        cell["id"] = new
    if changed:
        nbformat.write(nb, notebook)


def assign_all(labs_dir: Path = LABS_DIR, build_dir: Path = BUILD_DIR, *, workers: int = 1) -> list[Path]:
    """Assign every master (``workers`` at once); returns the output folders."""
    from concurrent.futures import ThreadPoolExecutor

    masters = find_masters(labs_dir)
    if not masters:
        raise ValueError(f"Invalid labs_dir: no lab*.ipynb in {labs_dir}")
    with ThreadPoolExecutor(max_workers=workers) as pool:  # threads only wait on subprocesses
        return list(pool.map(lambda m: assign(m, build_dir), masters))


def autograder_zip(lab: str, build_dir: Path = BUILD_DIR, labs_dir: Path = LABS_DIR) -> Path:
    """The autograder zip of a lab (``make labs`` first; built on demand if missing)."""
    path = Path(lab)
    if path.suffix == ".zip" and path.exists():
        return path
    master = resolve_master(lab, labs_dir)
    zips = _zips(Path(build_dir) / master.stem)
    if not zips:
        assign(master, build_dir)
        zips = _zips(Path(build_dir) / master.stem)
    return zips[-1]


def _zips(out: Path) -> list[Path]:
    return sorted((Path(out) / "autograder").glob("*-autograder_*.zip"))


def safe_name(stem: str) -> str:
    """A folder name for a submission's results: letters, digits, ``_``, ``-`` and inner dots only,
    never empty, ``.`` or ``..``; a name that had to change gets a short hash of the original (so
    ``a b`` and ``a_b`` stay apart).

    Example:
        >>> safe_name("alice"), safe_name("..")[:10], safe_name("../x")[:2]
        ('alice', 'submission', 'x-')
    """
    name = "".join(c if c.isalnum() or c in "_-." else "_" for c in str(stem)).strip(".")[:80] or "submission"
    if name != stem:
        digest = hashlib.sha256(str(stem).encode("utf-8", "surrogateescape")).hexdigest()[:8]
        name = f"{name.strip('_') or 'submission'}-{digest}"
    return name


def _printable(text: str) -> str:
    """``text`` as valid UTF-8, so that a file name's undecodable bytes cannot break the CSV, the JSON or
    the terminal: Linux hands such bytes over as lone surrogates (``b"\\xff"`` -> ``"\\udcff"``), which
    UTF-8 refuses; they are shown as ``\\xff``.

    Example:
        >>> _printable("b\\udcffob.ipynb"), _printable("ålice.ipynb")
        ('b\\\\xffob.ipynb', 'ålice.ipynb')
    """
    try:
        return text.encode("utf-8", "surrogateescape").decode("utf-8", "backslashreplace")
    except UnicodeEncodeError:  # a surrogate no file name decodes to
        return text.encode("utf-8", "backslashreplace").decode("utf-8")


def _inside(folder: Path, name: str) -> Path:
    """``folder / name``, checked to be a child of ``folder`` (no link or name leads elsewhere)."""
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / name
    if path.is_symlink() or path.resolve().parent != folder.resolve():
        raise ValueError(f"Invalid output folder: {name!r} would not stay inside {folder}")
    return path


# -- grading -------------------------------------------------------------------------------
def grade(submission: Path, autograder: Path, output_dir: Path, *, cell_timeout: int = CELL_TIMEOUT,
          notebook_timeout: int = NOTEBOOK_TIMEOUT, test_timeout: int = TEST_TIMEOUT,
          sandbox: str = "auto", expected: dict | None = None) -> dict:
    """Grade one notebook in a sandbox; write ``results.json``, ``score.json`` and ``grade.log``.

    Args:
        submission: the student's notebook (any file name).
        autograder: the lab's autograder zip (``autograder_zip``); the solutions notebook
            ``otter assign`` wrote next to it provides the reference values.
        output_dir: where the three files go (written by this process, after the sandbox ended).
        cell_timeout, test_timeout, notebook_timeout: seconds per cell, per call into student
            code inside a test, and for the whole submission (restarts included); each in
            (0, ``MAX_TIMEOUT``], else ValueError naming it.
        sandbox: "auto" (bubblewrap if it works here, else unconfined with a loud warning),
            "bwrap" (refuse to grade without it) or "none".
        expected: reference values from ``grading.reference`` (``grade_all`` computes them once).

    Returns:
        ``{"submission", "status", "reason", "sandbox", "total", "possible", "questions": {q: {score, possible}}}``;
        status "ok", "timeout" (a cell or case was killed or ended the worker; see results.json
        for which; the rest was graded in a fresh sandbox; anything past ``notebook_timeout``
        scored 0), "crashed", "failed" (not a notebook) or "error" (a grading step failed on
        this submission; ``reason`` says which). A cell in a form that cannot run (its source not text)
        is not run and ``reason`` names it (status "ok": the rest is graded). Whatever the submission does, score.json and
        results.json are written; only a broken grader (e.g. solutions that fail their own
        tests) raises.
    """
    from sazo_lite.course.labs import grading

    submission, autograder, output_dir = Path(submission), Path(autograder), Path(output_dir)
    if not os.path.lexists(submission):
        raise ValueError(f"Invalid submission: {submission} does not exist")
    if not autograder.exists():
        raise ValueError(f"Invalid autograder: {autograder} does not exist (run `make labs`)")
    timeouts = _checked_timeouts(dict(cell_timeout=cell_timeout, test_timeout=test_timeout,
                                      notebook_timeout=notebook_timeout))
    output_dir.mkdir(parents=True, exist_ok=True)
    for name in ("results.json", "score.json"):
        (output_dir / name).unlink(missing_ok=True)
    rule = None
    config, questions = grading.load_tests(autograder)
    if expected is None:  # the solutions get at least the default limits, whatever this submission gets
        expected = grading.reference(autograder, require=sandbox, **_reference_limits(timeouts))
    # From here on nothing the submission does may stop this function from writing its files.
    outcome, reason = {"cases": {}, "skipped": [], "status": "failed", "sandbox": None, "rules": {}}, None
    log = io.StringIO()  # written with the scores, at the end
    rule = grading.lab_rule(config)
    unreadable: list[str] = []  # cells in a form that cannot run (each costs its own cell only)
    try:
        notebook = grading.read_notebook(submission, unreadable)  # a regular file, never a link's target
        explore = grading.ignored(autograder, config)   # the explore and check cells, and the other cells' ids
        cells = grading.notebook_cells(notebook, config, *explore)
        owners = grading.cell_questions(notebook, (rule or {}).get("graded"), questions, explore=explore)
    except Exception as exc:  # not a notebook (or not a file)
        reason = f"cannot read {submission.name} as a notebook: {type(exc).__name__}: {str(exc)[:300]}"
        log.write(f"[grader] {reason}\n")
        cells = None
    for line in unreadable[:MAX_FINDINGS]:
        log.write(f"[grader] {line}\n")
    if cells is not None:
        try:
            outcome = grading.run(cells, questions, log=log, require=sandbox, rule=rule,
                                  owners=owners, **timeouts)
        except Exception as exc:  # the grader's own failure on this submission: say so, score what we have
            reason = f"grading stopped: {type(exc).__name__}: {str(exc)[:300]}"
            log.write(f"[grader] {reason}\n")
            outcome = {**outcome, "status": "error"}
        else:
            try:  # feedback only: the scores stand whatever it finds
                for line in grading.explain_name_errors(outcome, notebook, cells):
                    log.write(f"[grader] {_printable(line)}\n")
            except Exception as exc:
                log.write(f"[grader] could not explain the NameErrors ({type(exc).__name__})\n")
    try:
        scored = grading.score(questions, outcome, expected)
    except Exception as exc:
        reason = f"scoring failed: {type(exc).__name__}: {str(exc)[:300]}"
        scored = {q: {"score": 0.0, "possible": sum(spec["points"]), "cases": []} for q, spec in questions.items()}
        outcome = {**outcome, "status": "error"}
    if reason is None and outcome["status"] in ("crashed", "timeout"):
        reason = "; ".join(outcome.get("notes") or [])[:500] or None
    if reason is None and unreadable:  # graded, but these cells were not run: say which
        more = f" (and {len(unreadable) - MAX_FINDINGS} more)" if len(unreadable) > MAX_FINDINGS else ""
        reason = "; ".join(unreadable[:MAX_FINDINGS])[:500] + more
    name, reason = _printable(submission.name), reason if reason is None else _printable(reason)
    total, possible = sum(q["score"] for q in scored.values()), sum(q["possible"] for q in scored.values())
    write_bytes(output_dir / "grade.log", log.getvalue().encode("utf-8", "replace"))
    write_json(output_dir / "results.json",
               {"submission": name, "status": outcome["status"], "reason": reason,
                "sandbox": outcome["sandbox"], "caps": outcome.get("caps", {}), "killed": outcome["skipped"],
                "unreadable_cells": unreadable[:MAX_FINDINGS],
                "cell_errors": [{"cell": index, "error": _printable(error)}
                                for index, error in sorted((outcome.get("cell_errors") or {}).items())],
                "questions": scored}, indent=2)
    summary = {"submission": name, "status": outcome["status"], "reason": reason,
               "sandbox": outcome["sandbox"], "total": total, "possible": possible,
               "questions": {q: {"score": v["score"], "possible": v["possible"]} for q, v in scored.items()}}
    write_json(output_dir / "score.json", summary, indent=2)
    return summary


MAX_TIMEOUT = 10 ** 8   # seconds (three years): the interval timer the worker arms takes at most about 9e9


def _checked_timeouts(timeouts: dict) -> dict:
    """``timeouts`` ({name: seconds}), each checked to be a number in (0, ``MAX_TIMEOUT``]: ValueError naming it.

    A larger one (``float("inf")`` or ``1e11`` meant as "no limit") made every cell and case fail with the timer's
    OverflowError, so every hand-in scored 0 with status "ok" where the solutions' reference came from the cache.
    """
    from sazo_lite.validation import check_number

    for name, value in timeouts.items():
        check_number(name, value, 0, MAX_TIMEOUT, closed_low=False)
    return timeouts


def _reference_limits(timeouts: dict) -> dict:
    """Limits for running the solutions: the submission's, but never below the defaults."""
    defaults = dict(cell_timeout=CELL_TIMEOUT, test_timeout=TEST_TIMEOUT, notebook_timeout=NOTEBOOK_TIMEOUT)
    return {name: max(timeouts.get(name, value), value) for name, value in defaults.items()}


def hand_ins(folder: Path) -> list[Path]:
    """The hand-ins of a folder: its entries named ``*.ipynb`` in any case (``Alice.IPYNB``, as some
    systems save it, is a hand-in too), sorted, less macOS's resource-fork files (``resource_fork``);
    a missing folder has none."""
    folder = Path(folder)
    if not folder.is_dir():
        return []
    return sorted(path for path in folder.iterdir() if path.name.lower().endswith(".ipynb") and not resource_fork(path))


APPLE_DOUBLE = b"\x00\x05\x16\x07"   # the magic number that starts an AppleDouble file


def resource_fork(path: Path) -> bool:
    """Whether ``path`` is a macOS resource-fork file: named ``._<name>`` and starting with AppleDouble's magic
    number (macOS writes one beside each file it copies to a disk, share or zip that cannot keep its metadata).
    It is read without following a link; a ``._`` file that is a notebook is not one."""
    path = Path(path)
    if not path.name.startswith("._"):
        return False
    try:
        fd = os.open(path, os.O_RDONLY | getattr(os, "O_NOFOLLOW", 0) | getattr(os, "O_NONBLOCK", 0))
    except OSError:
        return False
    try:
        return stat.S_ISREG(os.fstat(fd).st_mode) and os.read(fd, len(APPLE_DOUBLE)) == APPLE_DOUBLE
    finally:
        os.close(fd)


def grade_all(autograder: Path, submissions_dir: Path, csv_path: Path, *, workers: int = 1,
              **timeouts) -> list[dict]:
    """Grade every ``*.ipynb`` in a folder (``hand_ins``: ``.IPYNB`` too); one CSV row per submission.
    macOS's ``._<name>.ipynb`` resource-fork files are skipped, each with a ``[grader]`` line on stderr.

    Columns: submission, status, one per question, total, possible, reason (why a submission was
    not graded normally). Every submission gets its row, whatever it did; one that is not a regular
    file of the folder (a symbolic link, hard-linked) is refused (status "failed") and not read. The
    solutions' reference values are computed (or read from their cache) once for the whole folder.
    Each submission's results.json and score.json go to ``<csv folder>/<csv stem>/<safe name>/``
    (``safe_name`` of its stem, checked to stay inside that folder).
    ``workers`` submissions are graded at once (each in its own process and kernel).
    """
    from concurrent.futures import ThreadPoolExecutor

    from tqdm.auto import tqdm

    submissions = hand_ins(submissions_dir)
    for path in sorted(Path(submissions_dir).iterdir()) if Path(submissions_dir).is_dir() else []:
        if resource_fork(path):  # said, so that a folder of ._ files alone is not a mystery
            print(f"[grader] skipped {_printable(path.name)}: a macOS resource-fork file (AppleDouble), "
                  f"not a notebook", file=sys.stderr)
    if not submissions:
        raise ValueError(f"Invalid submissions_dir: no .ipynb files in {submissions_dir}")
    if isinstance(workers, bool) or not isinstance(workers, int) or workers < 1:
        raise ValueError(f"Invalid workers: {workers!r} (expected an int >= 1)")
    csv_path = Path(csv_path)
    details = csv_path.parent / csv_path.stem
    from sazo_lite.course.labs import grading

    limits = _checked_timeouts({k: timeouts.get(k, default) for k, default in (
        ("cell_timeout", CELL_TIMEOUT), ("test_timeout", TEST_TIMEOUT), ("notebook_timeout", NOTEBOOK_TIMEOUT))})
    expected = grading.reference(Path(autograder), require=timeouts.get("sandbox", "auto"), **_reference_limits(limits))
    _, spec = grading.load_tests(Path(autograder))
    possible = sum(sum(q["points"]) for q in spec.values())

    folders: dict[Path, str] = {}
    taken: set[str] = set()
    for path in submissions:  # distinct safe names, one per submission, also where case does not count
        name, k = safe_name(path.stem), 1     # (alice/ and Alice/ are one folder on macOS and Windows)
        while name.casefold() in taken:
            k += 1
            name = f"{safe_name(path.stem)}-{k}"
        folders[path] = name
        taken.add(name.casefold())

    def one(path: Path) -> dict:
        status = "error"
        try:
            out = _inside(details, folders[path])
            if path.is_symlink():  # refused before anything reads it: the reason names the link only
                status = "failed"
                raise ValueError(f"{path.name} is a symbolic link, not a file: hand in the notebook itself")
            return grade(path, autograder, out, expected=expected, **timeouts)
        except Exception as exc:  # whatever happened, this submission gets its row (and the others theirs)
            reason = f"{type(exc).__name__}: {str(exc)[:300]}" if status == "error" else str(exc)
            row = {"submission": _printable(path.name), "status": status, "reason": _printable(reason), "sandbox": None,
                   "total": 0.0, "possible": possible,
                   "questions": {q: {"score": 0.0, "possible": sum(v["points"])} for q, v in spec.items()}}
            with contextlib.suppress(OSError, ValueError):
                out = _inside(details, folders[path])
                out.mkdir(exist_ok=True)
                write_json(out / "score.json", row, indent=2)
            return row

    with ThreadPoolExecutor(max_workers=workers) as pool:  # threads only wait on subprocesses
        rows = list(tqdm(pool.map(one, submissions), total=len(submissions), desc="grading", leave=False))
    questions = sorted(spec)
    csv_path.parent.mkdir(parents=True, exist_ok=True)
    table = io.StringIO(newline="")
    writer = csv.writer(table)
    writer.writerow(["submission", "status", *questions, "total", "possible", "reason"])
    for row in rows:
        scores = [row["questions"].get(q, {}).get("score", 0.0) for q in questions]
        writer.writerow([row["submission"], row["status"], *scores, row["total"], row["possible"],
                         (row.get("reason") or "").replace("\n", " ")])
    write_text(csv_path, table.getvalue())
    return rows


# -- command line --------------------------------------------------------------------------
def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m sazo_lite.course.labs", description=__doc__.split("\n")[0])
    commands = parser.add_subparsers(dest="command", required=True)
    p = commands.add_parser("assign", help="otter assign every master (or --lab one) into the build folder")
    p.add_argument("--lab", default=None)
    p.add_argument("--build", type=Path, default=BUILD_DIR)
    p.add_argument("--workers", type=int, default=2, help="labs assigned at once")
    for name, target in (("grade", "submission"), ("grade-all", "submissions")):
        p = commands.add_parser(name, help=f"grade {'one notebook' if name == 'grade' else 'a folder of notebooks'}")
        p.add_argument("lab", help="lab1 .. lab4, a master's stem, or an autograder zip")
        p.add_argument(target, type=Path)
        p.add_argument("--out", type=Path, default=None)
        p.add_argument("--cell-timeout", type=int, default=CELL_TIMEOUT)
        p.add_argument("--notebook-timeout", type=int, default=NOTEBOOK_TIMEOUT)
        p.add_argument("--test-timeout", type=int, default=TEST_TIMEOUT)
        p.add_argument("--build", type=Path, default=BUILD_DIR)
        p.add_argument("--sandbox", choices=("auto", "bwrap", "none"), default="auto",
                       help="auto: bubblewrap when it works here, else unconfined with a warning")
        if name == "grade-all":
            p.add_argument("--workers", type=int, default=1, help="submissions graded at once")
    args = parser.parse_args(argv)
    try:
        return _run(args)
    except ValueError as exc:  # a wrong lab, folder or option: say so, without a traceback
        parser.exit(2, f"{parser.prog} {args.command}: error: {exc}\n")


def _run(args) -> int:
    if args.command == "assign":
        outputs = [assign(resolve_master(args.lab), args.build)] if args.lab else \
            assign_all(build_dir=args.build, workers=args.workers)
        for out in outputs:  # the zip found where it was built (no labs folder needed here)
            print(f"{out.name}: student/{out.name}.ipynb, autograder/{_zips(out)[-1].name}  ({out})")
        return 0
    zip_path = autograder_zip(args.lab, args.build)
    timeouts = dict(cell_timeout=args.cell_timeout, notebook_timeout=args.notebook_timeout,
                    test_timeout=args.test_timeout, sandbox=args.sandbox)
    if args.command == "grade":
        out = args.out or _inside(BUILD_DIR.parent / "grades" / zip_path.parent.parent.name,
                                  safe_name(args.submission.stem))
        summary = grade(args.submission, zip_path, out, **timeouts)
        print(f"{summary['submission']}: {summary['total']:g} / {summary['possible']:g} ({summary['status']}, "
              f"sandbox: {summary['sandbox']})")
        print(f"results: {out / 'results.json'}  score: {out / 'score.json'}")
        return 0
    out = args.out or BUILD_DIR.parent / "grades" / f"{zip_path.parent.parent.name}.csv"
    rows = grade_all(zip_path, args.submissions, out, workers=args.workers, **timeouts)
    for row in rows:
        print(f"{row['submission']}: {row['total']:g} / {row['possible']:g} ({row['status']})")
    print(f"scores: {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())

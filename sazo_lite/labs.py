"""Graded labs: build student notebooks and autograders with otter-grader, grade locally.

Instructor masters live in ``labs/`` (otter-assign format). Three commands:

    python -m sazo_lite.labs assign                      # every master -> build/labs/<lab>/
    python -m sazo_lite.labs grade lab1 submission.ipynb  # one submission -> results JSON + score
    python -m sazo_lite.labs grade-all lab1 submissions/  # a folder -> one CSV of scores

Grading never needs Docker (``otter run``) and never hangs: each answer cell gets
``cell_timeout`` seconds (then the kernel is interrupted and that answer scores 0), every
test wraps its calls into student code in ``time_limit`` (``test_timeout`` seconds: a loop
inside a function fails that test only), and each notebook gets ``notebook_timeout`` seconds
(then the grading process and its kernel are killed and every question scores 0).
otter is imported lazily: it is an optional dependency (``pip install -e ".[labs]"``).
"""
from __future__ import annotations

import argparse
import contextlib
import csv
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
from pathlib import Path

__all__ = ["LabTimeout", "time_limit", "find_masters", "assign", "assign_all", "autograder_zip",
           "grade", "grade_all", "main"]

# The repository (editable install); from an installed copy, the current directory.
REPO = Path(__file__).resolve().parent.parent
ROOT = REPO if (REPO / "labs").is_dir() else Path.cwd()
LABS_DIR = ROOT / "labs"
BUILD_DIR = ROOT / "build" / "labs"
CELL_TIMEOUT = 120       # seconds per cell while grading (a looping answer scores 0)
NOTEBOOK_TIMEOUT = 900   # seconds per submission (then everything scores 0)
TEST_TIMEOUT = 60        # seconds per test's calls into student code (``time_limit``)
TEST_TIMEOUT_ENV = "SAZO_LAB_TEST_TIMEOUT"  # grade() passes its test_timeout to the kernel this way


class LabTimeout(Exception):
    """A student function ran past the time a test allows (an ordinary failed test)."""


@contextlib.contextmanager
def time_limit(seconds: float | None = None):
    """Raise ``LabTimeout`` in the block after ``seconds`` (SIGALRM; main thread, Unix only).

    Lab tests wrap calls into student code with it, so an infinite loop inside a function
    fails that test instead of hanging the grading kernel. Elsewhere it is a no-op.
    ``seconds=None`` reads ``$SAZO_LAB_TEST_TIMEOUT`` (set by ``grade``), else 60.

    Example:
        >>> with time_limit(5):
        ...     total = sum(range(10))
    """
    if seconds is None:
        seconds = float(os.environ.get(TEST_TIMEOUT_ENV, TEST_TIMEOUT))
    usable = hasattr(signal, "setitimer") and threading.current_thread() is threading.main_thread()
    if not usable:
        yield
        return

    def _raise(signum, frame):
        raise LabTimeout(f"student code ran longer than {seconds} s")

    previous = signal.signal(signal.SIGALRM, _raise)
    signal.setitimer(signal.ITIMER_REAL, seconds)
    try:
        yield
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, previous)


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
    master = Path(master)
    out = Path(build_dir) / master.stem
    shutil.rmtree(out, ignore_errors=True)
    out.parent.mkdir(parents=True, exist_ok=True)
    command = [sys.executable, "-m", "otter", "assign", "--no-pdfs", str(master), str(out)]
    done = subprocess.run(command, capture_output=True, text=True, cwd=master.parent)
    if done.returncode != 0:
        raise RuntimeError(f"otter assign failed for {master.name}:\n{done.stdout}\n{done.stderr}")
    return out


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
    zips = sorted((Path(build_dir) / master.stem / "autograder").glob("*-autograder_*.zip"))
    if not zips:
        assign(master, build_dir)
        zips = sorted((Path(build_dir) / master.stem / "autograder").glob("*-autograder_*.zip"))
    return zips[-1]


# -- grading -------------------------------------------------------------------------------
_RUNS_TESTS = re.compile(r"\.check\(|check_if_not_already_checked")


def _run_otter(submission: str, autograder: str, output_dir: str, cell_timeout: int) -> None:
    """Inside the grading subprocess: otter run with a per-cell timeout that interrupts.

    otter builds nbconvert's ExecutePreprocessor itself, without a timeout; a subclass with
    other trait defaults, put where otter imports it from, gives every student cell
    ``cell_timeout`` seconds and then interrupts the kernel (the cell errors, grading goes on).
    """
    import nbconvert.preprocessors as preprocessors
    from traitlets import Any, Bool, Integer

    import otter.run

    def timeout_for(cell) -> int | None:
        # Cells that run tests (otter's check cells, its final check-all cell) get no cell
        # limit: each test bounds its calls into student code with ``time_limit``, and one
        # interrupted check-all cell would lose every question's result.
        return None if _RUNS_TESTS.search(cell.source) else cell_timeout

    class TimedExecutePreprocessor(preprocessors.ExecutePreprocessor):
        timeout = Integer(cell_timeout, allow_none=True).tag(config=True)
        timeout_func = Any(timeout_for, allow_none=True).tag(config=True)
        interrupt_on_timeout = Bool(True).tag(config=True)

    preprocessors.ExecutePreprocessor = TimedExecutePreprocessor
    otter.run.main(submission, autograder=autograder, output_dir=output_dir, no_logo=True)


def _summarise(results: dict) -> dict:
    """Per-question scores and the total from otter's results.json (which has no total)."""
    questions = {}
    for test in results.get("tests", []):
        if "max_score" not in test:
            continue  # otter's "Public Tests" summary row carries no points
        name = test.get("name", "?").split(" - ")[0]  # "q1 - 1" -> "q1" (one row per case)
        score, possible = questions.get(name, (0.0, 0.0))
        questions[name] = (score + float(test.get("score", 0.0)), possible + float(test.get("max_score", 0.0)))
    total = sum(s for s, _ in questions.values())
    possible = sum(p for _, p in questions.values())
    return {"questions": {k: {"score": s, "possible": p} for k, (s, p) in questions.items()},
            "total": total, "possible": possible}


def _assignment_name(autograder: Path) -> str | None:
    """The assignment name stored in the autograder zip (otter_config.json), if any."""
    import zipfile

    with zipfile.ZipFile(autograder) as archive:
        if "otter_config.json" not in archive.namelist():
            return None
        return json.loads(archive.read("otter_config.json")).get("assignment_name")


def _zero_scores(autograder: Path) -> dict:
    """Every question at 0 (a submission that timed out or broke the grader)."""
    import zipfile

    with zipfile.ZipFile(autograder) as archive:
        names = sorted(n for n in archive.namelist() if n.startswith("tests/") and n.endswith(".py"))
        questions = {}
        for name in names:
            points = _test_config(archive.read(name).decode()).get("points", 0)
            possible = float(sum(points) if isinstance(points, list) else points or 0)
            questions[Path(name).stem] = {"score": 0.0, "possible": possible}
    return {"questions": questions, "total": 0.0, "possible": sum(q["possible"] for q in questions.values())}


def _test_config(source: str) -> dict:
    """The ``test = {...}`` literal of an OK-format test file, read without executing it."""
    import ast

    for node in ast.parse(source).body:
        if isinstance(node, ast.Assign) and any(getattr(t, "id", None) == "test" for t in node.targets):
            return ast.literal_eval(node.value)
    return {}


def grade(submission: Path, autograder: Path, output_dir: Path, *, cell_timeout: int = CELL_TIMEOUT,
          notebook_timeout: int = NOTEBOOK_TIMEOUT, test_timeout: int = TEST_TIMEOUT) -> dict:
    """Grade one notebook with ``otter run`` (no Docker) in a subprocess that cannot hang.

    Writes ``output_dir/results.json`` (otter's per-test results) and ``output_dir/score.json``.
    Timeouts in seconds: ``cell_timeout`` per notebook cell, ``test_timeout`` per test's calls
    into student code, ``notebook_timeout`` for the whole submission. The kernel runs with one
    thread per library (OMP_NUM_THREADS=1): the lab problems are tiny and graders run many.

    Returns:
        ``{"submission", "status", "total", "possible", "questions": {q: {score, possible}}}``;
        status is "ok", "timeout" (past ``notebook_timeout``: all zero) or "failed" (otter
        could not grade it: all zero, see otter's output in ``grade.log``).
    """
    submission, autograder, output_dir = Path(submission), Path(autograder), Path(output_dir)
    if not submission.exists():
        raise ValueError(f"Invalid submission: {submission} does not exist")
    if not autograder.exists():
        raise ValueError(f"Invalid autograder: {autograder} does not exist (run `make labs`)")
    for name, value in (("cell_timeout", cell_timeout), ("notebook_timeout", notebook_timeout),
                        ("test_timeout", test_timeout)):
        if not value > 0:
            raise ValueError(f"Invalid {name}: {value!r} (expected seconds > 0)")
    output_dir.mkdir(parents=True, exist_ok=True)
    (output_dir / "results.json").unlink(missing_ok=True)
    env = {**os.environ, TEST_TIMEOUT_ENV: str(test_timeout), "OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1"}
    with tempfile.TemporaryDirectory() as staging:
        # otter's init cell opens "<assignment>.ipynb": a renamed submission would skip every
        # per-question check and leave all tests to the final cell, so grade a copy by that name.
        staged = Path(staging) / f"{_assignment_name(autograder) or submission.stem}.ipynb"
        shutil.copyfile(submission, staged)
        # run this file as a script: the grader process then skips importing torch via sazo_lite
        command = [sys.executable, str(Path(__file__).resolve()), "_run", str(staged), str(autograder.resolve()),
                   str(output_dir.resolve()), str(int(cell_timeout))]
        status = _run_killable(command, output_dir / "grade.log", notebook_timeout, env)
    summary = _read_results(output_dir / "results.json") if status == "ok" else None
    if summary is None:
        status = "failed" if status == "ok" else status
        summary = _zero_scores(autograder)
    summary = {"submission": submission.name, "status": status, **summary}
    (output_dir / "score.json").write_text(json.dumps(summary, indent=2))
    return summary


def _run_killable(command: list[str], log_path: Path, timeout: float, env: dict) -> str:
    """Run ``command``; on timeout kill it and every descendant (the kernel runs in its own session)."""
    with open(log_path, "w") as log:
        process = subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT, start_new_session=True,
                                   cwd=tempfile.gettempdir(), env=env)
        try:
            process.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            _kill_tree(process.pid)
            process.wait()
            return "timeout"
    return "ok" if process.returncode == 0 else "failed"


def _kill_tree(pid: int) -> None:
    """SIGKILL a process and its descendants (psutil comes with IPython, which otter needs).

    Without psutil only the grader's own process group dies; the orphaned kernel then exits
    by itself within a second (ipykernel polls its parent).
    """
    try:
        import psutil
    except ImportError:
        os.killpg(pid, signal.SIGKILL)
        return
    try:
        parent = psutil.Process(pid)
        family = parent.children(recursive=True) + [parent]
    except psutil.NoSuchProcess:
        return
    for member in family:
        with contextlib.suppress(psutil.NoSuchProcess):
            member.kill()
    psutil.wait_procs(family, timeout=10)


def _read_results(path: Path) -> dict | None:
    """The summary of otter's results.json, or None when otter reported a failure."""
    if not path.exists():
        return None
    summary = _summarise(json.loads(path.read_text()))
    # no scored question: e.g. "Autograder Failed", the results pickle was never written
    return summary if summary["questions"] else None


def grade_all(autograder: Path, submissions_dir: Path, csv_path: Path, *, workers: int = 1,
              **timeouts) -> list[dict]:
    """Grade every ``*.ipynb`` in a folder; one CSV row per submission.

    Columns: submission, status, one per question, total, possible. Each submission's
    results.json and score.json go to ``<csv folder>/<csv stem>/<submission stem>/``.
    ``workers`` submissions are graded at once (each in its own process and kernel).
    """
    from concurrent.futures import ThreadPoolExecutor

    from tqdm.auto import tqdm

    submissions = sorted(Path(submissions_dir).glob("*.ipynb"))
    if not submissions:
        raise ValueError(f"Invalid submissions_dir: no .ipynb files in {submissions_dir}")
    if isinstance(workers, bool) or not isinstance(workers, int) or workers < 1:
        raise ValueError(f"Invalid workers: {workers!r} (expected an int >= 1)")
    csv_path = Path(csv_path)
    details = csv_path.parent / csv_path.stem
    with ThreadPoolExecutor(max_workers=workers) as pool:  # threads only wait on subprocesses
        jobs = pool.map(lambda s: grade(s, autograder, details / s.stem, **timeouts), submissions)
        rows = list(tqdm(jobs, total=len(submissions), desc="grading", leave=False))
    questions = sorted({q for row in rows for q in row["questions"]})
    csv_path.parent.mkdir(parents=True, exist_ok=True)
    with open(csv_path, "w", newline="") as handle:
        writer = csv.writer(handle)
        writer.writerow(["submission", "status", *questions, "total", "possible"])
        for row in rows:
            scores = [row["questions"].get(q, {}).get("score", 0.0) for q in questions]
            writer.writerow([row["submission"], row["status"], *scores, row["total"], row["possible"]])
    return rows


# -- command line --------------------------------------------------------------------------
def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m sazo_lite.labs", description=__doc__.split("\n")[0])
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
        if name == "grade-all":
            p.add_argument("--workers", type=int, default=1, help="submissions graded at once")
    p = commands.add_parser("_run")  # internal: the killable grading subprocess
    for arg in ("submission", "autograder", "output_dir", "cell_timeout"):
        p.add_argument(arg)
    args = parser.parse_args(argv)

    if args.command == "_run":
        _run_otter(args.submission, args.autograder, args.output_dir, int(args.cell_timeout))
        return 0
    if args.command == "assign":
        outputs = [assign(resolve_master(args.lab), args.build)] if args.lab else \
            assign_all(build_dir=args.build, workers=args.workers)
        for out in outputs:
            print(f"{out.name}: student/{out.name}.ipynb, autograder/{autograder_zip(out.name, args.build).name}  ({out})")
        return 0
    zip_path = autograder_zip(args.lab, args.build)
    timeouts = dict(cell_timeout=args.cell_timeout, notebook_timeout=args.notebook_timeout,
                    test_timeout=args.test_timeout)
    if args.command == "grade":
        out = args.out or BUILD_DIR.parent / "grades" / zip_path.parent.parent.name / args.submission.stem
        summary = grade(args.submission, zip_path, out, **timeouts)
        print(f"{summary['submission']}: {summary['total']:g} / {summary['possible']:g} ({summary['status']})")
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

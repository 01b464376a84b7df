"""Inside the sandbox: run a submission's cells, then every test case; report on a pipe.

Started by ``sazo_lite.course.labs.grading`` as ``python -m sazo_lite.course.labs.worker FD`` with the job
(JSON) on stdin. Everything this process reports is untrusted: the parent only believes values
that match the solution's (see ``values``), and ends the process (its whole namespace) itself.
Events, one JSON object per line on file descriptor FD:
``{"unit": ["cell", i] | ["case", q, k], "phase": "start" | "end", ...}``, ``{"rule": [name, how],
"unit": ...}`` (the lab's library rule was broken there, see ``guard``) and ``{"done": true}``.
"""
from __future__ import annotations

import builtins
import json
import os
import signal
import sys
import traceback

from sazo_lite.course.labs import LabTimeout, time_limit
from sazo_lite.course.labs.guard import Guard
from sazo_lite.course.labs.values import encode

# Held before any student code runs: the submission may rebind the module-level names.
_write, _dumps, _setitimer, _signal = os.write, json.dumps, signal.setitimer, signal.signal
_BaseException, _ITIMER, _SIGALRM = BaseException, signal.ITIMER_REAL, signal.SIGALRM
_BUILTINS = dict(builtins.__dict__)


def run_case(source: str, namespace: dict, name: str = "<case>", guard: Guard | None = None) -> tuple[str | None, list]:
    """Run one test case in ``namespace``; returns (error or None, recorded values).

    First undoes what the submission did to the builtins (``builtins.abs = ...``, or a
    top-level ``abs = ...`` that shadows it) and puts the grader's ``record`` and
    ``time_limit`` in place, so the test's own names mean what its author meant.
    """
    records = []

    def record(value, *, rtol=None, atol=None):
        records.append({"value": encode(value), "rtol": rtol, "atol": atol})

    builtins.__dict__.update(_BUILTINS)
    for shadow in [k for k in namespace if k in _BUILTINS and not k.startswith("__")]:
        del namespace[shadow]
    namespace["record"], namespace["time_limit"] = record, time_limit
    try:
        code = compile(source, name, "exec")
        if guard is not None:
            guard.trust(code)
        try:
            exec(code, namespace)
        finally:
            if guard is not None:
                guard.trust(None)
    except _BaseException as exc:
        return _error(exc), records
    return None, records


def _emit(fd: int, event: dict) -> None:
    data = (_dumps(event) + "\n").encode()
    while data:
        data = data[_write(fd, data):]


def _alarm(signum, frame):
    raise LabTimeout("the cell ran past its time limit")


def _error(exc: BaseException) -> str:
    try:
        text = "".join(traceback.format_exception_only(type(exc), exc)).strip()
    except _BaseException:  # an exception whose str() raises
        text = f"{type(exc).__name__} (its message could not be read)"
    return str(text)[-500:]


def main(fd: int) -> None:
    job = json.loads(sys.stdin.read())
    namespace = {"__name__": "__main__", "__builtins__": builtins}
    current = [None]
    guard = None
    if job.get("rule"):
        reported = set()

        def report(name, how):
            key = (name, how, repr(current[0]))
            if key not in reported:
                reported.add(key)
                _emit(fd, {"rule": [str(name)[:200], str(how)[:200]], "unit": current[0]})

        guard = Guard(job["rule"]["modules"], job["rule"]["names"], namespace, report)
        guard.install()
        _BUILTINS["__import__"] = builtins.__import__  # the guarded import is what every case restores
    graded = (job.get("rule") or {}).get("graded", {})
    for index, source in job["cells"]:
        current[0] = ["cell", index]
        _emit(fd, {"unit": ["cell", index], "phase": "start"})
        error = None
        try:
            code = compile(source, f"<cell {index}>", "exec")
            _signal(_SIGALRM, _alarm)
            _setitimer(_ITIMER, job["cell_timeout"])
            try:
                exec(code, namespace)
            finally:
                _setitimer(_ITIMER, 0)
        except _BaseException as exc:  # SystemExit, KeyboardInterrupt and LabTimeout included
            error = _error(exc)
        _emit(fd, {"unit": ["cell", index], "phase": "end", "error": error})
        current[0] = None
    for question, case, source in job["cases"]:
        current[0] = ["case", question, case]
        _emit(fd, {"unit": ["case", question, case], "phase": "start"})
        if guard is not None:
            try:
                for name, how in guard.check(graded.get(question, [])):
                    report(name, how)
            except _BaseException as exc:  # a hostile object made the check itself fail: that is a finding too
                report("the graded names", f"could not be checked ({_error(exc)[:100]})")
        error, records = run_case(source, namespace, f"<{question} case {case}>", guard)
        _emit(fd, {"unit": ["case", question, case], "phase": "end", "error": error, "records": records})
        current[0] = None
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except _BaseException:
            pass
    _emit(fd, {"done": True})


if __name__ == "__main__":
    main(int(sys.argv[1]))

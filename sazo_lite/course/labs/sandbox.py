"""The grading sandbox: bubblewrap (``bwrap``) around the process that runs a submission.

Inside, the submission sees the system's programs and libraries, the Python environment and the
``sazo_lite`` package, all read-only, and a private, size-limited ``/tmp`` as its only writable
place (its scratch folder, gone when the sandbox ends). It does not see the repository (masters,
``build/``), the autograder zip, the solutions, other submissions or the grader's output folder;
it has no network (own network namespace: loopback only), no capabilities (even as root), its
own PID namespace (when its first process ends or is killed, the kernel ends every process it
started, detached or not) and its own session (no terminal injection).

Without ``bwrap`` (``apt-get install bubblewrap``) ``Sandbox`` runs the command unconfined in
its own session and says so loudly (``kind == "none"``); nothing then stops a submission from
reading or writing what the grader's user can.
"""
from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import subprocess
import sys
import time
import warnings
from pathlib import Path

__all__ = ["Sandbox", "bwrap_works", "SandboxWarning"]

SCRATCH_BYTES = 512 * 2 ** 20  # the private /tmp
SYSTEM_DIRS = ("/usr", "/bin", "/sbin", "/lib", "/lib32", "/lib64", "/etc")


class SandboxWarning(UserWarning):
    """Grading without a sandbox: submissions can read and write what the grader's user can."""


_WORKS: dict[str, bool] = {}


def bwrap_works() -> bool:
    """Whether ``bwrap`` exists and can create the namespaces we need here (cached)."""
    if "bwrap" not in _WORKS:
        path = shutil.which("bwrap")
        ok = False
        if path:
            probe = [path, *_bwrap_args(), "--", "/bin/true"]
            with contextlib.suppress(OSError, subprocess.SubprocessError):
                ok = subprocess.run(probe, capture_output=True, timeout=30).returncode == 0
        _WORKS["bwrap"] = ok
    return _WORKS["bwrap"]


def _python_dirs() -> list[str]:
    """What the sandboxed Python needs: its prefixes and the sazo_lite package (editable or not)."""
    import sazo_lite

    dirs = {sys.prefix, sys.base_prefix, sys.exec_prefix, str(Path(sys.executable).resolve().parent.parent),
            str(Path(sazo_lite.__file__).resolve().parent)}
    return sorted(d for d in dirs if d and Path(d).exists() and d != "/")


def _bwrap_args(env: dict | None = None) -> list[str]:
    # The private /tmp comes first: binds are applied in order, so an interpreter or package that
    # lives under /tmp (a checkout there) is bound on top of it instead of hidden by it.
    args = ["--dev", "/dev", "--proc", "/proc", "--size", str(SCRATCH_BYTES), "--tmpfs", "/tmp",
            "--dir", "/tmp/work"]
    for path in (*SYSTEM_DIRS, *_python_dirs()):
        args += ["--ro-bind-try", path, path]
    args += ["--chdir", "/tmp/work",
             "--unshare-all", "--die-with-parent", "--new-session", "--cap-drop", "ALL", "--clearenv"]
    for key, value in (env or {}).items():
        args += ["--setenv", key, value]
    return args


class Sandbox:
    """One sandboxed process: ``start``, read its pipes, then ``close`` (kills what is left).

    Args:
        command: the program and its arguments (run inside the sandbox).
        env: the whole environment of the command (nothing else is inherited).
        pass_fds: file descriptors the command inherits (e.g. the write end of a pipe).
        require: "auto" (bwrap if it works, else unconfined with a ``SandboxWarning``),
            "bwrap" (raise if it does not work) or "none" (never confine; for debugging).

    Example:
        >>> box = Sandbox(["/bin/echo", "hi"], env={"PATH": "/usr/bin:/bin"})
        >>> box.start(stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL); box.close()
    """

    def __init__(self, command: list[str], env: dict, pass_fds: tuple = (), require: str = "auto"):
        if require not in ("auto", "bwrap", "none"):
            raise ValueError(f"Invalid require: {require!r} (expected 'auto', 'bwrap' or 'none')")
        self.command, self.env, self.pass_fds = list(command), dict(env), tuple(pass_fds)
        if require == "none":
            self.kind = "none"
        elif bwrap_works():
            self.kind = "bwrap"
        elif require == "bwrap":
            raise RuntimeError("bwrap is not available or cannot create namespaces here (apt-get install bubblewrap)")
        else:
            self.kind = "none"
            warnings.warn("GRADING WITHOUT A SANDBOX: bwrap is missing or cannot create namespaces here; "
                          "submissions can read the masters and other submissions, write files and use "
                          "the network (install bubblewrap: apt-get install bubblewrap)", SandboxWarning, stacklevel=2)
        self.process: subprocess.Popen | None = None
        self.pid_namespace: str | None = None
        self._scratch = None

    def start(self, **popen) -> subprocess.Popen:
        """Start the command (``popen``: stdin/stdout/stderr for ``subprocess.Popen``)."""
        if self.kind == "bwrap":
            info_read, info_write = os.pipe()
            argv = [shutil.which("bwrap"), "--info-fd", str(info_write), *_bwrap_args(self.env), "--", *self.command]
            self.process = subprocess.Popen(argv, pass_fds=(*self.pass_fds, info_write), start_new_session=True,
                                            env={"PATH": os.environ.get("PATH", "/usr/bin:/bin")}, **popen)
            os.close(info_write)
            with os.fdopen(info_read) as info:
                text = info.read()
            with contextlib.suppress(ValueError, KeyError, OSError):
                child = json.loads(text)["child-pid"]
                self.pid_namespace = os.readlink(f"/proc/{child}/ns/pid")
        else:
            import tempfile

            self._scratch = tempfile.TemporaryDirectory(prefix="sazo-grade-")
            env = {**self.env, "HOME": self._scratch.name, "TMPDIR": self._scratch.name}
            self.process = subprocess.Popen(self.command, pass_fds=self.pass_fds, start_new_session=True,
                                            cwd=self._scratch.name, env=env, **popen)
        return self.process

    def close(self, timeout: float = 10.0) -> None:
        """Kill the command and everything it started; wait until none of it is left."""
        if self.process is None:
            return
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(self.process.pid, signal.SIGKILL)
        self.process.wait()
        if self.kind == "bwrap":
            deadline = time.monotonic() + timeout
            while self.leftover_processes() and time.monotonic() < deadline:
                time.sleep(0.05)
            for pid in self.leftover_processes():  # bwrap's init died with it; belt and braces
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, signal.SIGKILL)
        else:
            _kill_session(self.process.pid)
        if self._scratch is not None:
            self._scratch.cleanup()
            self._scratch = None

    def leftover_processes(self) -> list[int]:
        """Processes still alive in the sandbox's PID namespace (bwrap only; [] once it is gone)."""
        if self.pid_namespace is None:
            return []
        alive = []
        for entry in os.listdir("/proc"):
            if entry.isdigit():
                with contextlib.suppress(OSError):
                    if os.readlink(f"/proc/{entry}/ns/pid") == self.pid_namespace:
                        alive.append(int(entry))
        return alive


def _kill_session(session: int) -> None:
    """Unconfined fallback: SIGKILL every process of the session the command started."""
    for entry in os.listdir("/proc"):
        if entry.isdigit() and int(entry) != os.getpid():
            with contextlib.suppress(OSError):
                if os.getsid(int(entry)) == session:
                    os.kill(int(entry), signal.SIGKILL)

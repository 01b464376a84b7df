"""The grading sandbox: bubblewrap (``bwrap``) around the process that runs a submission, with caps.

Inside, the submission sees the system's programs and libraries, the Python environment and the
``sazo_lite`` package, all read-only, on a read-only root. Its only writable places are two
size-limited RAM-backed folders that vanish with it: ``/tmp`` (its scratch folder, ``scratch_mb``)
and ``/dev/shm`` (``shm_mb``, for the semaphores of ``multiprocessing``). It does not see the
repository (masters, ``build/``), the autograder zip, the solutions, other submissions or the
grader's output folder; it has no network (own network namespace: loopback only), no
capabilities (even as root), its own PID namespace (when its first process ends or is killed,
the kernel ends every process it started, detached or not) and its own session.

Caps (``Limits``), set by a tiny launcher before ``bwrap`` starts, inherited by everything inside:

- per process (rlimits, always): address space ``memory_mb`` (``RLIMIT_AS``: an allocation past it
  raises ``MemoryError``), CPU time ``cpu_seconds`` (``RLIMIT_CPU``: then the kernel kills it),
  file size ``file_mb`` (``RLIMIT_FSIZE``), no core dumps;
- for the whole sandbox, where this process may create cgroups (root with cgroup v1, or a
  delegated cgroup v2): memory ``memory_mb`` in total (the kernel's OOM killer ends it past that),
  at most ``processes`` processes and threads (``pids.max``), at most ``cpu_cores`` cores;
- without cgroups, processes are capped by ``RLIMIT_NPROC`` for a non-root grader (its current
  number of tasks plus ``processes``); a root grader without cgroups has no process cap
  (``Sandbox.caps`` says which caps hold).

Without ``bwrap`` (``apt-get install bubblewrap``) ``Sandbox`` runs the command unconfined in
its own session (the caps above still apply) and says so loudly (``kind == "none"``); nothing
then stops a submission from reading or writing what the grader's user can.
"""
from __future__ import annotations

import contextlib
import dataclasses
import itertools
import json
import os
import shutil
import signal
import subprocess
import sys
import time
import warnings
from pathlib import Path

__all__ = ["Sandbox", "Limits", "bwrap_works", "SandboxWarning"]

SCRATCH_BYTES = 512 * 2 ** 20  # the private /tmp (default Limits.scratch_mb)
SYSTEM_DIRS = ("/usr", "/bin", "/sbin", "/lib", "/lib32", "/lib64", "/etc")
CGROUP_ROOT = Path("/sys/fs/cgroup")


class SandboxWarning(UserWarning):
    """Grading without a sandbox: submissions can read and write what the grader's user can."""


@dataclasses.dataclass(frozen=True)
class Limits:
    """What one sandbox may use (all of it, everything it starts included, where cgroups allow).

    Args:
        memory_mb: address space per process (RLIMIT_AS) and, with cgroups, memory in total
            (RAM-backed scratch files count too).
        cpu_seconds: CPU time per process (RLIMIT_CPU); the kernel kills a process past it.
        processes: processes and threads in the sandbox (cgroup pids.max, else RLIMIT_NPROC).
        cpu_cores: cores the sandbox may keep busy at once (cgroup CPU quota; None: no quota).
        scratch_mb, shm_mb: sizes of the writable ``/tmp`` and ``/dev/shm`` (bwrap only).
        file_mb: largest file a process may write (RLIMIT_FSIZE).

    Example:
        >>> Limits(memory_mb=2048).memory_mb
        2048
    """

    memory_mb: int = 4096
    cpu_seconds: int = 1800
    processes: int = 128
    cpu_cores: float | None = 1.0
    scratch_mb: int = 512
    shm_mb: int = 64
    file_mb: int = 256

    def __post_init__(self):
        for field in dataclasses.fields(self):
            value = getattr(self, field.name)
            if value is None and field.name == "cpu_cores":
                continue
            if isinstance(value, bool) or not isinstance(value, (int, float)) or not value > 0:
                raise ValueError(f"Invalid Limits.{field.name}: {value!r} (expected a number > 0)")


_WORKS: dict[str, bool] = {}


def bwrap_works() -> bool:
    """Whether ``bwrap`` exists and can create the namespaces we need here (cached)."""
    if "bwrap" not in _WORKS:
        path = shutil.which("bwrap")
        ok = False
        if path:
            probe = [path, *_bwrap_args(Limits()), "--", "/bin/true"]
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


def _bwrap_args(limits: Limits, env: dict | None = None) -> list[str]:
    # The private /tmp comes first: binds are applied in order, so an interpreter or package that
    # lives under /tmp (a checkout there) is bound on top of it instead of hidden by it. The root
    # (a tmpfs bwrap makes) and /dev are remounted read-only last: only /tmp and /dev/shm take writes.
    mib = 2 ** 20
    args = ["--size", str(int(limits.scratch_mb * mib)), "--tmpfs", "/tmp", "--dir", "/tmp/work"]
    for path in (*SYSTEM_DIRS, *_python_dirs()):
        args += ["--ro-bind-try", path, path]
    args += ["--dev", "/dev", "--size", str(int(limits.shm_mb * mib)), "--tmpfs", "/dev/shm", "--proc", "/proc",
             "--remount-ro", "/dev", "--remount-ro", "/",
             "--chdir", "/tmp/work", "--unshare-all", "--die-with-parent", "--new-session", "--cap-drop", "ALL",
             "--clearenv"]
    for key, value in (env or {}).items():
        args += ["--setenv", key, value]
    return args


# -- caps: rlimits (always) and a cgroup (where we may make one) ----------------------------
_LAUNCH = r"""
import json, os, resource, sys
spec = json.loads(sys.argv[1])
for path in spec["join"]:
    with open(path, "w") as handle:
        handle.write("0")
for name, value in spec["rlimits"].items():
    resource.setrlimit(getattr(resource, name), (value, value))
os.execv(sys.argv[2], sys.argv[2:])
"""
_COUNTER = itertools.count()


class _Cgroup:
    """A cgroup for one sandbox (v1: memory, pids, cpu hierarchies; v2: one folder). Best effort."""

    def __init__(self, limits: Limits):
        self.dirs: list[Path] = []
        self.caps: dict = {}
        name = f"sazo-lab-{os.getpid()}-{next(_COUNTER)}"
        try:
            if (CGROUP_ROOT / "cgroup.controllers").exists():
                self._v2(CGROUP_ROOT / name, limits)
            else:
                self._v1(name, limits)
        except OSError:
            self.close()
            self.caps = {}

    def _make(self, path: Path) -> Path:
        path.mkdir()
        self.dirs.append(path)
        return path

    def _v1(self, name: str, limits: Limits) -> None:
        for controller, files in (("memory", ["memory.limit_in_bytes"]), ("pids", ["pids.max"]),
                                  ("cpu", ["cpu.cfs_quota_us", "cpu.cfs_period_us"])):
            parent = CGROUP_ROOT / controller
            if not all((parent / f).exists() or f == "pids.max" for f in files) or not parent.is_dir():
                continue
            path = self._make(parent / name)
            if controller == "memory":
                (path / "memory.limit_in_bytes").write_text(str(limits.memory_mb * 2 ** 20))
                with contextlib.suppress(OSError):  # no swap past the limit either, where swap accounting exists
                    (path / "memory.memsw.limit_in_bytes").write_text(str(limits.memory_mb * 2 ** 20))
                self.caps["memory"] = "sandbox"
            elif controller == "pids":
                (path / "pids.max").write_text(str(limits.processes))
                self.caps["processes"] = "sandbox"
            elif limits.cpu_cores is not None:
                period = int((path / "cpu.cfs_period_us").read_text())
                (path / "cpu.cfs_quota_us").write_text(str(max(1000, int(limits.cpu_cores * period))))
                self.caps["cpu_cores"] = "sandbox"

    def _v2(self, path: Path, limits: Limits) -> None:
        available = set((CGROUP_ROOT / "cgroup.subtree_control").read_text().split())
        if not {"memory", "pids"} <= available:
            return
        path = self._make(path)
        (path / "memory.max").write_text(str(limits.memory_mb * 2 ** 20))
        with contextlib.suppress(OSError):
            (path / "memory.swap.max").write_text("0")
        (path / "pids.max").write_text(str(limits.processes))
        self.caps.update(memory="sandbox", processes="sandbox")
        if "cpu" in available and limits.cpu_cores is not None:
            (path / "cpu.max").write_text(f"{max(1000, int(limits.cpu_cores * 100000))} 100000")
            self.caps["cpu_cores"] = "sandbox"

    @property
    def join(self) -> list[str]:
        """The files a process writes "0" into to join this cgroup."""
        return [str(d / "cgroup.procs") for d in self.dirs]

    def close(self) -> None:
        """Kill whatever is left in it and remove it."""
        for path in self.dirs:
            with contextlib.suppress(OSError):
                (path / "cgroup.kill").write_text("1")
            deadline = time.monotonic() + 5
            while time.monotonic() < deadline:
                try:
                    pids = [int(p) for p in (path / "cgroup.procs").read_text().split()]
                except OSError:
                    break
                if not pids:
                    break
                for pid in pids:
                    with contextlib.suppress(OSError):
                        os.kill(pid, signal.SIGKILL)
                time.sleep(0.02)
            with contextlib.suppress(OSError):
                path.rmdir()
        self.dirs = []


def _tasks_of_this_user() -> int:
    """Processes and threads running as this uid (RLIMIT_NPROC counts them all)."""
    uid, count = os.getuid(), 0
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            with contextlib.suppress(OSError):
                if os.stat(f"/proc/{entry}").st_uid == uid:
                    count += len(os.listdir(f"/proc/{entry}/task"))
    return count


class Sandbox:
    """One sandboxed, capped process: ``start``, read its pipes, then ``close`` (kills what is left).

    Args:
        command: the program and its arguments (run inside the sandbox).
        env: the whole environment of the command (nothing else is inherited).
        pass_fds: file descriptors the command inherits (e.g. the write end of a pipe).
        require: "auto" (bwrap if it works, else unconfined with a ``SandboxWarning``),
            "bwrap" (raise if it does not work) or "none" (never confine; for debugging).
        limits: the caps (``Limits``); ``caps`` says after ``start`` which of them hold here.

    Example:
        >>> box = Sandbox(["/bin/echo", "hi"], env={"PATH": "/usr/bin:/bin"})
        >>> process = box.start(stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL); box.close()
    """

    def __init__(self, command: list[str], env: dict, pass_fds: tuple = (), require: str = "auto",
                 limits: Limits | None = None):
        if require not in ("auto", "bwrap", "none"):
            raise ValueError(f"Invalid require: {require!r} (expected 'auto', 'bwrap' or 'none')")
        if limits is not None and not isinstance(limits, Limits):
            raise ValueError(f"Invalid limits: {limits!r} (expected a sandbox.Limits)")
        self.command, self.env, self.pass_fds = list(command), dict(env), tuple(pass_fds)
        self.limits = limits or Limits()
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
        self.caps: dict = {}
        self._scratch = None
        self._cgroup: _Cgroup | None = None

    def _launcher(self, argv: list[str]) -> list[str]:
        """``argv`` behind the launcher that joins the cgroup and sets the rlimits, then execs it."""
        limits, mib = self.limits, 2 ** 20
        self._cgroup = _Cgroup(limits)
        rlimits = {"RLIMIT_AS": int(limits.memory_mb * mib), "RLIMIT_CPU": int(limits.cpu_seconds),
                   "RLIMIT_FSIZE": int(limits.file_mb * mib), "RLIMIT_CORE": 0}
        caps = {"memory_mb": limits.memory_mb, "memory": self._cgroup.caps.get("memory", "per process"),
                "cpu_seconds": limits.cpu_seconds, "file_mb": limits.file_mb,
                "processes": limits.processes if "processes" in self._cgroup.caps else None,
                "cpu_cores": limits.cpu_cores if "cpu_cores" in self._cgroup.caps else None}
        if caps["processes"] is None and os.getuid() != 0:  # root ignores RLIMIT_NPROC
            rlimits["RLIMIT_NPROC"] = _tasks_of_this_user() + int(limits.processes)
            caps["processes"] = f"{limits.processes} (RLIMIT_NPROC over the grader's user)"
        if self.kind == "bwrap":
            caps.update(read_only_root=True, scratch_mb=limits.scratch_mb, shm_mb=limits.shm_mb)
        self.caps = caps
        spec = json.dumps({"join": self._cgroup.join, "rlimits": rlimits})
        return [sys.executable, "-I", "-S", "-c", _LAUNCH, spec, *argv]

    def start(self, **popen) -> subprocess.Popen:
        """Start the command (``popen``: stdin/stdout/stderr for ``subprocess.Popen``)."""
        if self.kind == "bwrap":
            info_read, info_write = os.pipe()
            argv = [shutil.which("bwrap"), "--info-fd", str(info_write), *_bwrap_args(self.limits, self.env),
                    "--", *self.command]
            self.process = subprocess.Popen(self._launcher(argv), pass_fds=(*self.pass_fds, info_write),
                                            start_new_session=True,
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
            self.process = subprocess.Popen(self._launcher(self.command), pass_fds=self.pass_fds,
                                            start_new_session=True, cwd=self._scratch.name, env=env, **popen)
        return self.process

    def close(self, timeout: float = 10.0) -> None:
        """Kill the command and everything it started; wait until none of it is left."""
        if self.process is None:
            return
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(self.process.pid, signal.SIGKILL)
        self.process.wait()
        if self.kind == "bwrap":  # kill whatever still runs in the namespace until nothing does (zombies do not)
            deadline = time.monotonic() + timeout
            while (left := self.leftover_processes()) and time.monotonic() < deadline:
                for pid in left:
                    with contextlib.suppress(ProcessLookupError):
                        os.kill(pid, signal.SIGKILL)
                time.sleep(0.01)
        else:
            _kill_session(self.process.pid)
        if self._cgroup is not None:
            self._cgroup.close()
        if self._scratch is not None:
            self._scratch.cleanup()
            self._scratch = None

    def leftover_processes(self) -> list[int]:
        """Processes still alive in the sandbox's PID namespace (bwrap only; [] once it is gone).

        A zombie is not alive: it runs nothing and holds nothing but its exit status, which
        whoever adopted it (pid 1, at its own pace) reads.
        """
        if self.pid_namespace is None:
            return []
        alive = []
        for entry in os.listdir("/proc"):
            if entry.isdigit():
                with contextlib.suppress(OSError):
                    if os.readlink(f"/proc/{entry}/ns/pid") == self.pid_namespace and not _zombie(entry):
                        alive.append(int(entry))
        return alive


def _zombie(pid: str) -> bool:
    """Whether /proc/<pid> is a zombie (state Z; the state follows the ')' that ends the command name)."""
    with open(f"/proc/{pid}/stat") as stat:
        return stat.read().rsplit(")", 1)[1].split()[0] == "Z"


def _kill_session(session: int) -> None:
    """Unconfined fallback: SIGKILL every process of the session the command started."""
    for entry in os.listdir("/proc"):
        if entry.isdigit() and int(entry) != os.getpid():
            with contextlib.suppress(OSError):
                if os.getsid(int(entry)) == session:
                    os.kill(int(entry), signal.SIGKILL)

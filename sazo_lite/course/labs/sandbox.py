"""The grading sandbox: bubblewrap (``bwrap``) around the process that runs a submission, with caps.

Inside, the submission sees the system's programs and libraries, the Python environment and the
``sazo_lite`` package, all read-only, on a read-only root, and of ``/etc`` only the files a Python
program needs (``ETC_FILES``, plus a ``passwd``/``group`` that name the sandbox's own user). It runs
**unprivileged**: a root grader starts ``bwrap`` with no user namespace and a tiny dropper inside
switches to a fresh uid of its own (``caps["uid"]``) before anything else runs, so root-only files
(``/etc/shadow``, were it bound) stay closed and ``RLIMIT_NPROC`` counts the sandbox alone; a
non-root grader runs it in a user namespace as the grader's own (unprivileged) user. Its only writable places are two
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
  at most ``processes`` processes and threads (``pids.max``), at most ``cpu_cores`` cores. The CPU
  quota is not taken on trust: ``sample`` reads the cgroup's own CPU use (``cpu.stat`` /
  ``cpuacct.usage``) while it runs, and ``caps["cpu_cores"]`` says "not enforced" with the
  cores measured when they exceeded the quota (``caps["cpu_cores_measured"]``: the peak);
- without cgroups, processes are capped by ``RLIMIT_NPROC``: on the sandbox's own uid for a root
  grader, else on the grader's user (its current number of tasks plus ``processes``)
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
import pwd
import shutil
import signal
import subprocess
import sys
import time
import warnings
from pathlib import Path

__all__ = ["Sandbox", "Limits", "bwrap_works", "SandboxWarning"]

SCRATCH_BYTES = 512 * 2 ** 20  # the private /tmp (default Limits.scratch_mb)
SYSTEM_DIRS = ("/usr", "/bin", "/sbin", "/lib", "/lib32", "/lib64")
# Of /etc, only what the dynamic loader, Python, time zones and fonts read (no shadow, no keys, no
# configuration of other programs); passwd and group are written for the sandbox's own user.
ETC_FILES = ("ld.so.cache", "ld.so.conf", "ld.so.conf.d", "localtime", "nsswitch.conf", "alternatives",
             "mime.types", "os-release", "fonts", "hosts", "host.conf", "protocols", "services")
CGROUP_ROOT = Path("/sys/fs/cgroup")
UID_BASE = 3_000_000   # a root grader runs each sandbox as a fresh uid at or above this (no account uses it)
CPU_SLACK = 1.1        # measured cores above cpu_cores times this: the quota did not hold


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
            probe = [path, *_bwrap_args(Limits()), "--", *_dropped([sys.executable, "-I", "-S", "-c", "pass"])]
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


def _as_root() -> bool:
    return os.geteuid() == 0


def _bwrap_args(limits: Limits, env: dict | None = None, data: dict | None = None) -> list[str]:
    """bwrap's arguments. ``data``: {path inside: file descriptor} of files it reads in (``--ro-bind-data``).

    The private /tmp comes first: binds are applied in order, so an interpreter or package that
    lives under /tmp (a checkout there) is bound on top of it instead of hidden by it. Folders
    bwrap makes on the way to a bind get mode 0755 (it would copy 0700 from e.g. /root), so the
    unprivileged user inside can reach them. The root (a tmpfs bwrap makes) and /dev are remounted
    read-only last: only /tmp and /dev/shm take writes.
    """
    mib = 2 ** 20
    args = ["--perms", "1777", "--size", str(int(limits.scratch_mb * mib)), "--tmpfs", "/tmp",
            "--perms", "0777", "--dir", "/tmp/work"]
    made = {"/", "/tmp", "/tmp/work"}
    binds = [*SYSTEM_DIRS, *_python_dirs()]
    for path in binds:
        for parent in reversed(Path(path).parents):
            name = str(parent)
            if name not in made and not any(name == b or name.startswith(b + "/") for b in SYSTEM_DIRS):
                args += ["--perms", "0755", "--dir", name]
                made.add(name)
        args += ["--ro-bind-try", path, path]
        made.add(path)
    args += ["--perms", "0755", "--dir", "/etc"]
    for name in ETC_FILES:
        args += ["--ro-bind-try", f"/etc/{name}", f"/etc/{name}"]
    for path, fd in (data or {}).items():
        args += ["--perms", "0644", "--ro-bind-data", str(fd), path]
    args += ["--dev", "/dev", "--perms", "1777", "--size", str(int(limits.shm_mb * mib)), "--tmpfs", "/dev/shm",
             "--proc", "/proc", "--remount-ro", "/dev", "--remount-ro", "/", "--chdir", "/tmp/work"]
    if _as_root():  # no user namespace (it would map the sandbox's uid onto root); the dropper switches uid
        args += ["--unshare-ipc", "--unshare-pid", "--unshare-net", "--unshare-uts", "--unshare-cgroup-try",
                 "--cap-drop", "ALL", "--cap-add", "CAP_SETUID", "--cap-add", "CAP_SETGID"]
    else:
        args += ["--unshare-all", "--cap-drop", "ALL"]
    args += ["--die-with-parent", "--new-session", "--clearenv"]
    for key, value in (env or {}).items():
        args += ["--setenv", key, value]
    return args


# Inside the sandbox, first (root grader only): drop to the sandbox's own uid (its capabilities go with
# root), cap its processes (RLIMIT_NPROC counts this uid, which nothing else uses), then run the command.
_DROP = r"""
import os, resource, sys
uid, nproc = int(sys.argv[1]), int(sys.argv[2])
os.setgroups([])
os.setresgid(uid, uid, uid)
os.setresuid(uid, uid, uid)
if nproc > 0:
    resource.setrlimit(resource.RLIMIT_NPROC, (nproc, nproc))
os.execv(sys.argv[3], sys.argv[3:])
"""


def _dropped(command: list[str], uid: int = UID_BASE, nproc: int = 0) -> list[str]:
    """``command`` behind the uid dropper when the grader is root (else as it is)."""
    if not _as_root():
        return list(command)
    return [sys.executable, "-I", "-S", "-c", _DROP, str(uid), str(nproc), *command]


_UIDS = itertools.count()


def _fresh_uid() -> int:
    """A uid no account and no other sandbox of this grader uses."""
    while True:
        uid = UID_BASE + (os.getpid() % 20_000) * 1000 + next(_UIDS) % 1000
        try:
            pwd.getpwuid(uid)
        except KeyError:
            return uid


def _identity_files(uid: int) -> dict[str, bytes]:
    """/etc/passwd and /etc/group inside: root and the sandbox's user (``student``, home /tmp)."""
    return {"/etc/passwd": f"root:x:0:0:root:/root:/usr/sbin/nologin\nstudent:x:{uid}:{uid}:student:/tmp:/usr/sbin/nologin\n".encode(),
            "/etc/group": f"root:x:0:\nstudent:x:{uid}:\n".encode()}


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
        self.usage_file: Path | None = None   # the cgroup's CPU time so far (v1 cpuacct.usage, v2 cpu.stat)
        self.usage_scale = 1e-6
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
                                  ("cpu", ["cpu.cfs_quota_us", "cpu.cfs_period_us"]), ("cpuacct", ["cpuacct.usage"])):
            parent = CGROUP_ROOT / controller
            if not all((parent / f).exists() or f == "pids.max" for f in files) or not parent.is_dir():
                continue
            if controller == "cpuacct" and self.usage_file is not None:
                continue  # cpu and cpuacct mounted together: one folder has both
            path = self._make(parent / name)
            if (path / "cpuacct.usage").exists():
                self.usage_file, self.usage_scale = path / "cpuacct.usage", 1e-9
            if controller == "memory":
                (path / "memory.limit_in_bytes").write_text(str(limits.memory_mb * 2 ** 20))
                with contextlib.suppress(OSError):  # no swap past the limit either, where swap accounting exists
                    (path / "memory.memsw.limit_in_bytes").write_text(str(limits.memory_mb * 2 ** 20))
                self.caps["memory"] = "sandbox"
            elif controller == "pids":
                (path / "pids.max").write_text(str(limits.processes))
                self.caps["processes"] = "sandbox"
            elif controller == "cpu" and limits.cpu_cores is not None:
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
        if (path / "cpu.stat").exists():
            self.usage_file = path / "cpu.stat"

    def cpu_seconds(self) -> float | None:
        """CPU time used so far by everything in the cgroup, as the kernel counts it (None: unknown)."""
        if self.usage_file is None:
            return None
        try:
            text = self.usage_file.read_text()
        except OSError:
            return None
        if self.usage_file.name == "cpu.stat":  # v2: "usage_usec N" among others
            fields = dict(line.split() for line in text.splitlines() if len(line.split()) == 2)
            return int(fields["usage_usec"]) * 1e-6 if "usage_usec" in fields else None
        return int(text.strip()) * self.usage_scale

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
        self.uid = _fresh_uid() if _as_root() and self.kind == "bwrap" else os.getuid()
        self._usage: tuple[float, float] | None = None   # (wall, CPU seconds) at the last sample
        self.peak_cores = 0.0

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
        self._nproc = int(limits.processes) if self.kind == "bwrap" and _as_root() else 0  # the dropper sets it
        if caps["processes"] is None and self._nproc:  # on a fresh uid: it counts this sandbox alone
            caps["processes"] = f"{limits.processes} (RLIMIT_NPROC on the sandbox's own uid)"
        elif caps["processes"] is None and os.getuid() != 0:  # root ignores RLIMIT_NPROC
            rlimits["RLIMIT_NPROC"] = _tasks_of_this_user() + int(limits.processes)
            caps["processes"] = f"{limits.processes} (RLIMIT_NPROC over the grader's user)"
        if self.kind == "bwrap":
            caps.update(read_only_root=True, scratch_mb=limits.scratch_mb, shm_mb=limits.shm_mb, uid=self.uid,
                        user="dropped to its own uid" if _as_root() else "the grader's user in a user namespace",
                        etc=list(ETC_FILES) + ["passwd", "group"])
        else:
            caps.update(uid=os.getuid(), user="the grader's own (unconfined)")
        self.caps = caps
        spec = json.dumps({"join": self._cgroup.join, "rlimits": rlimits})
        return [sys.executable, "-I", "-S", "-c", _LAUNCH, spec, *argv]

    def start(self, **popen) -> subprocess.Popen:
        """Start the command (``popen``: stdin/stdout/stderr for ``subprocess.Popen``)."""
        if self.kind == "bwrap":
            info_read, info_write = os.pipe()
            data = {}
            for path, content in _identity_files(self.uid).items():  # tiny: fits a pipe's buffer
                read, write = os.pipe()
                os.write(write, content)
                os.close(write)
                data[path] = read
            launcher = self._launcher([])  # the cgroup and the caps first (the dropper needs _nproc)
            argv = [shutil.which("bwrap"), "--info-fd", str(info_write), *_bwrap_args(self.limits, self.env, data),
                    "--", *_dropped(self.command, self.uid, self._nproc)]
            try:
                self.process = subprocess.Popen(launcher + argv, pass_fds=(*self.pass_fds, info_write, *data.values()),
                                                start_new_session=True,
                                                env={"PATH": os.environ.get("PATH", "/usr/bin:/bin")}, **popen)
            finally:
                for fd in data.values():
                    os.close(fd)
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
        self.sample()
        return self.process

    def sample(self) -> None:
        """Measure the cores the sandbox used since the last sample (at least 0.5 s ago) from its cgroup's
        own CPU time; past ``cpu_cores`` (times ``CPU_SLACK``) the quota is reported as not enforced."""
        if self._cgroup is None:
            return
        used, now = self._cgroup.cpu_seconds(), time.monotonic()
        if used is None:
            return
        if self._usage is None:
            self._usage = (now, used)
            return
        then, before = self._usage
        if now - then < 0.5:
            return
        self._usage = (now, used)
        self.peak_cores = max(self.peak_cores, (used - before) / (now - then))
        self.caps["cpu_cores_measured"] = round(self.peak_cores, 2)
        cap = self.limits.cpu_cores
        if cap is not None and self.peak_cores > cap * CPU_SLACK and self.caps.get("cpu_cores") == cap:
            self.caps["cpu_cores"] = f"not enforced (quota {cap}, measured {self.peak_cores:.2f} cores)"

    def close(self, timeout: float = 10.0) -> None:
        """Kill the command and everything it started; wait until none of it is left."""
        if self.process is None:
            return
        self.sample()
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

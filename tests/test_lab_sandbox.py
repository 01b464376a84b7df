"""The grading sandbox's caps, each probed from inside: writes to every writable path stop at their
size, forks stop at the process cap, a memory hog gets MemoryError, a CPU spinner is killed."""
from __future__ import annotations

import subprocess
import sys
import time

import pytest

from sazo_lite.course.labs.sandbox import Limits, Sandbox, bwrap_works

needs_bwrap = pytest.mark.skipif(not bwrap_works(), reason="bwrap missing or namespaces not allowed here")


def _run(probe: str, limits: Limits, require: str = "bwrap", timeout: float = 120) -> tuple[str, int, float, dict]:
    box = Sandbox([sys.executable, "-c", probe], env={"PATH": "/usr/bin:/bin"}, require=require, limits=limits)
    start = time.monotonic()
    process = box.start(stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    try:
        output = process.communicate(timeout=timeout)[0].decode()
    finally:
        box.close()
    return output, process.returncode, time.monotonic() - start, box.caps


WRITE = r"""
import os, sys
for path in sys.argv[1:]:
    done = 0
    try:
        for k in range(600 // 16):   # 600 MiB in files of 16 MiB (each under the file-size cap)
            with open(os.path.join(path, f"fill{k}"), "wb") as handle:
                handle.write(b"x" * (16 << 20))
            done += 16
    except OSError:
        pass
    print(f"wrote {path} {done}", flush=True)
"""


@needs_bwrap
def test_600_mib_to_every_writable_path_stops_at_its_cap():
    import sazo_lite

    library = sazo_lite.__file__.rsplit("/", 1)[0]
    paths = ["/", "/dev", "/dev/shm", "/tmp", "/tmp/work", "/usr", "/etc", "/var", "/proc", library, sys.prefix]
    limits = Limits(scratch_mb=96, shm_mb=32, memory_mb=2048)
    output, _, _, caps = _run(WRITE.replace("sys.argv[1:]", repr(paths)), limits)
    wrote = {line.split()[1]: int(line.split()[2]) for line in output.splitlines() if line.startswith("wrote ")}
    assert set(wrote) == set(paths), output
    assert wrote["/tmp"] <= 96 and wrote["/tmp/work"] <= 96 and wrote["/dev/shm"] <= 32, wrote
    assert all(wrote[p] == 0 for p in paths if p not in ("/tmp", "/tmp/work", "/dev/shm")), wrote
    assert caps["read_only_root"] and caps["scratch_mb"] == 96 and caps["shm_mb"] == 32


FORK = r"""
import os, time
children = 0
for _ in range(300):
    try:
        pid = os.fork()
    except OSError:
        break
    if pid == 0:
        os.close(1), os.close(2)
        time.sleep(60)
        os._exit(0)
    children += 1
print("children", children, flush=True)
"""


@pytest.mark.parametrize("require", ["bwrap", "none"])
def test_a_bounded_fork_probe_stops_at_the_process_cap(require):
    if require == "bwrap" and not bwrap_works():
        pytest.skip("bwrap missing")
    box = Sandbox(["/bin/true"], env={}, require=require, limits=Limits(processes=40))
    box._launcher([])  # which caps hold here (cgroups, RLIMIT_NPROC), without starting anything
    box._cgroup.close()
    if box.caps["processes"] is None:
        pytest.skip("no process cap here (a root grader without cgroups)")
    output, _, seconds, caps = _run(FORK, Limits(processes=40), require=require)
    children = int(output.split("children")[1].split()[0])
    assert 0 < children < 40, output
    assert seconds < 60, "the sleeping children died with the sandbox"


def test_a_memory_hog_gets_memory_error():
    output, _, _, caps = _run("try:\n    b = bytearray(3 << 30)\n    print('allocated')\nexcept MemoryError:\n"
                              "    print('MemoryError')", Limits(memory_mb=1024), require="auto")
    assert "MemoryError" in output and "allocated" not in output, output
    assert caps["memory_mb"] == 1024


def test_a_cpu_spinner_is_killed_at_its_cpu_time():
    output, code, seconds, caps = _run("print('spinning', flush=True)\nwhile True:\n    pass", Limits(cpu_seconds=2),
                                       require="auto")
    assert "spinning" in output and code != 0
    assert seconds < 30, f"killed after {seconds:.0f} s for 2 s of CPU"
    assert caps["cpu_seconds"] == 2


def test_limits_reject_bad_values():
    with pytest.raises(ValueError, match="memory_mb"):
        Limits(memory_mb=0)
    with pytest.raises(ValueError, match="limits"):
        Sandbox(["/bin/true"], env={}, limits={"memory_mb": 1})

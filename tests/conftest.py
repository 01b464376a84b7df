"""Settings for the whole test session (``make test`` runs it in 2 processes, see the Makefile)."""
from __future__ import annotations

import collections
import os
import shutil
import signal
from pathlib import Path

import pytest
import torch

def pytest_configure(config):
    # A process started in the background by a shell without job control inherits SIGINT
    # ignored, and Python then installs no KeyboardInterrupt handler: the Ctrl-C tests need it.
    if signal.getsignal(signal.SIGINT) is signal.SIG_IGN:
        signal.signal(signal.SIGINT, signal.default_int_handler)
    # Under pytest-xdist each process gets its share of the cores: two processes with two torch
    # threads each on a 2-core machine oversubscribe it, and tiny tensors then run many times slower.
    workers = int(os.environ.get("PYTEST_XDIST_WORKER_COUNT", "0"))
    if workers > 1:
        torch.set_num_threads(max(1, (os.cpu_count() or 1) // workers))


# Files with few but long tests that xdist's own order (most tests first) would start last: the
# first to run, so that the pool ends on short files (2026-12-02, idle: test_browser, 2 tests, 56 s,
# started 393 s in and one process idled for the last 49 s). The Makefile passes
# --no-loadscope-reorder, so that this order (otherwise xdist's) is the one used.
START_FIRST = ("test_browser.py",)


def pytest_collection_modifyitems(session, config, items):
    tests_in = collections.Counter(item.path.name for item in items)
    items.sort(key=lambda item: (item.path.name not in START_FIRST, -tests_in[item.path.name], item.path.name))


@pytest.fixture(scope="module")
def fast_mode():
    """SAZO_FAST=1 for a module's tests (the labs' mutant tables run the fast cases)."""
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("SAZO_FAST", "1")
        yield


@pytest.fixture(scope="session")
def assigned_labs(tmp_path_factory) -> Path:
    """Every lab master assigned once for the whole run (``otter assign``: ~50 CPU-seconds), shared
    by the test processes: the build folder, ``<folder>/<stem>/{student,autograder}``.

    Under pytest-xdist the first process to ask builds it in the run's common temp folder while
    the others wait on a file lock (pytest-xdist's recipe for a once-per-run fixture).
    """
    from filelock import FileLock

    from sazo_lite.course import labs

    root = tmp_path_factory.getbasetemp()
    if os.environ.get("PYTEST_XDIST_WORKER"):
        root = root.parent  # the run's folder, above each process's own
    build, done = root / "assigned-labs", root / "assigned-labs.done"
    with FileLock(str(root / "assigned-labs.lock")):
        if not done.exists():
            shutil.rmtree(build, ignore_errors=True)
            labs.assign_all(build_dir=build, workers=2)
            done.write_text("\n".join(sorted(p.name for p in build.iterdir())))
    return build

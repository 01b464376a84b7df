"""Settings for the whole test session (``make test`` runs it in 2 processes, see the Makefile)."""
from __future__ import annotations

import os
import signal

import torch

# Files listed here run first (longest first, so that two processes finish together); the rest
# follow in pytest's usual order. A file missing from the list only costs balance, never a test.
LONGEST_FIRST = ("test_labs.py", "test_book.py", "test_browser.py", "test_hf.py",
                 "test_llm_norms.py", "test_lab_mutants.py", "test_experiments.py", "test_llm.py")


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


def pytest_collection_modifyitems(session, config, items):
    rank = {name: k for k, name in enumerate(LONGEST_FIRST)}
    items.sort(key=lambda item: rank.get(item.path.name, len(rank)))  # stable: pytest's order within a file

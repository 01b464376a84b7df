"""Run-time switches shared by notebooks, benchmarks and tests."""
from __future__ import annotations

import os
from contextlib import contextmanager

import torch

__all__ = ["fast_mode", "pick", "one_thread"]


def fast_mode() -> bool:
    """True when ``SAZO_FAST=1`` (set by ``make test``): notebooks shrink steps, seeds and grids."""
    return os.environ.get("SAZO_FAST", "0").strip().lower() in ("1", "true", "yes")


def pick(full, fast):
    """``fast`` in fast mode, ``full`` otherwise: ``steps = pick(5000, 300)``."""
    return fast if fast_mode() else full


@contextmanager
def one_thread():
    """Run torch on one intra-op thread, then restore the previous count.

    Toy problems have tensors of tens to thousands of elements: handing them to a thread pool
    costs more than the maths (on a busy machine, many times more), so toy runs and their
    timings use one thread.
    """
    previous = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        yield
    finally:
        torch.set_num_threads(previous)

"""Run-time switches shared by notebooks, benchmarks and tests."""
from __future__ import annotations

import os
from contextlib import contextmanager
from pathlib import Path

import torch

__all__ = ["fast_mode", "pick", "one_thread", "benchmark_report", "LATEST_RUN", "REFERENCE_RUN"]

LATEST_RUN = "this machine's latest run"      # benchmarks/results/: what a benchmark wrote here (not in git)
REFERENCE_RUN = "the reference run in git"    # benchmarks/reference/: what the course's text quotes


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


def benchmark_report(name: str, start: Path | str | None = None) -> tuple[Path, str] | None:
    """A benchmark's stored report, found from ``start`` (default: the working directory) upwards.

    A notebook runs in ``notebooks/``, or in a copy elsewhere in the checkout (``make test`` and
    the book run ``build/executed/``): the first folder at or above ``start`` holding
    ``benchmarks/reference/`` is the checkout. There, this machine's latest run
    (``benchmarks/results/<name>``, not in git) comes before the reference run kept in git.

    Returns:
        ``(path, "this machine's latest run" | "the reference run in git")``, or None.

    Example:
        >>> benchmark_report("no_such_report.json", start="/") is None
        True
    """
    # one file name in each folder: "../reference/x.json" read the reference run and called it this machine's latest,
    # and an absolute path any file at all
    if not isinstance(name, str) or name in ("", ".", "..") or any(c in name for c in "/\\\0"):
        raise ValueError(f"Invalid name: {name!r} (expected a report's file name, e.g. 'llm_continual_race.json', "
                         "without '/', '\\' or NUL)")
    here = Path(start or Path.cwd()).resolve()
    root = next((folder for folder in (here, *here.parents) if (folder / "benchmarks" / "reference").is_dir()), None)
    if root is None:
        return None
    for path, kind in ((root / "benchmarks" / "results" / name, LATEST_RUN),
                       (root / "benchmarks" / "reference" / name, REFERENCE_RUN)):
        if path.is_file():
            return path, kind
    return None

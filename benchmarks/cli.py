"""Argument types for the benchmarks' command lines: a bad value is refused by argparse itself (exit
code 2, ``argument --steps: invalid count value: '0'``) before any long work starts, instead of a
traceback, a hang or a silent wrong table an hour later.

    >>> import argparse
    >>> p = argparse.ArgumentParser(); _ = p.add_argument("--n", type=count)
    >>> p.parse_args(["--n", "3"]).n
    3
"""
from __future__ import annotations

import argparse
import math
from pathlib import Path


def _int(text: str, low: int, what: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"invalid {what} value: {text!r} (expected an integer ≥ {low})") from None
    if value < low:
        raise argparse.ArgumentTypeError(f"invalid {what} value: {text!r} (expected an integer ≥ {low})")
    return value


def count(text: str) -> int:
    """An integer ≥ 1 (steps, seeds, N, a batch, an interval)."""
    return _int(text, 1, "count")


def natural(text: str) -> int:
    """An integer ≥ 0 (a seed; a size where 0 means "none")."""
    return _int(text, 0, "non-negative integer")


def _float(text: str) -> float:
    try:
        return float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"invalid number: {text!r}") from None


def positive(text: str) -> float:
    """A finite number > 0 (a learning rate, ε, a bound)."""
    value = _float(text)
    if not (math.isfinite(value) and value > 0):
        raise argparse.ArgumentTypeError(f"invalid value: {text!r} (expected a finite number > 0)")
    return value


def non_negative(text: str) -> float:
    """A finite number ≥ 0 (0 usually meaning "off")."""
    value = _float(text)
    if not (math.isfinite(value) and value >= 0):
        raise argparse.ArgumentTypeError(f"invalid value: {text!r} (expected a finite number ≥ 0)")
    return value


def fraction(text: str) -> float:
    """A number in the open interval (0, 1): a target as a fraction of the initial loss or gap."""
    value = _float(text)
    if not 0 < value < 1:
        raise argparse.ArgumentTypeError(f"invalid fraction: {text!r} (expected a number in (0, 1))")
    return value


def unit_fraction(text: str) -> float:
    """A number in (0, 1] (a share of the examples)."""
    value = _float(text)
    if not 0 < value <= 1:
        raise argparse.ArgumentTypeError(f"invalid fraction: {text!r} (expected a number in (0, 1])")
    return value


def mix(text: str) -> float:
    """A number in [0, 1] (a uniform mix λ)."""
    value = _float(text)
    if not 0 <= value <= 1:
        raise argparse.ArgumentTypeError(f"invalid mix: {text!r} (expected a number in [0, 1])")
    return value


def check_output(parser: argparse.ArgumentParser, option: str, path) -> None:
    """Refuse, before the run, an output file that cannot be written at its end: a folder, or a path
    under an existing file. (A missing folder is fine: the benchmarks create it.)"""
    if path is None:
        return
    path = Path(path)
    if path.is_dir():
        parser.error(f"argument {option}: {str(path)!r} is a folder (expected a file to write)")
    for parent in path.parents:
        if parent.exists():
            if not parent.is_dir():
                parser.error(f"argument {option}: {str(parent)!r} is a file, not a folder")
            break


def check_folder(parser: argparse.ArgumentParser, option: str, path) -> None:
    """Refuse, before the run, a folder argument that is an existing file (or lies under one)."""
    if path is None:
        return
    path = Path(path)
    for where in (path, *path.parents):
        if where.exists():
            if not where.is_dir():
                parser.error(f"argument {option}: {str(where)!r} is a file, not a folder")
            break

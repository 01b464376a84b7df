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
import datetime
import json
import math
import os
import platform
import tempfile
from pathlib import Path
from typing import Callable

from sazo_lite.validation import check_number


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


def multiple_of(step: int) -> Callable[[str], int]:
    """The type of a count that must be a multiple of ``step`` (a step budget of runs that extend by whole log
    intervals of ``step`` steps: a budget between two would be overrun to the next one)."""
    def parse(text: str) -> int:
        value = count(text)
        if value % step:
            raise argparse.ArgumentTypeError(f"invalid value: {text!r} (expected a multiple of {step}: the runs "
                                             f"log every {step} steps and would overrun it to {-(-value // step) * step})")
        return value
    return parse


def natural(text: str) -> int:
    """An integer ≥ 0 (a seed; a size where 0 means "none")."""
    return _int(text, 0, "non-negative integer")


def _number(text: str, low: float, high: float = math.inf, *, closed_low: bool, closed_high: bool = True) -> float:
    """A finite number in the interval, by the library's one rule (``validation.check_number``)."""
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"invalid number: {text!r}") from None
    try:
        return check_number("value", value, low, high, closed_low=closed_low, closed_high=closed_high)
    except ValueError as error:
        raise argparse.ArgumentTypeError(f"invalid {str(error)[len('Invalid '):]} (from {text!r})") from None


def positive(text: str) -> float:
    """A finite number > 0 (a learning rate, ε, a bound)."""
    return _number(text, 0.0, closed_low=False)


def non_negative(text: str) -> float:
    """A finite number ≥ 0 (0 usually meaning "off")."""
    return _number(text, 0.0, closed_low=True)


def fraction(text: str) -> float:
    """A number in the open interval (0, 1): a target as a fraction of the initial loss or gap."""
    return _number(text, 0.0, 1.0, closed_low=False, closed_high=False)


def unit_fraction(text: str) -> float:
    """A number in (0, 1] (a share of the examples)."""
    return _number(text, 0.0, 1.0, closed_low=False)


def mix(text: str) -> float:
    """A number in [0, 1] (a uniform mix λ)."""
    return _number(text, 0.0, 1.0, closed_low=True)


def refuse_unused(parser: argparse.ArgumentParser, args, names, where: str) -> None:
    """Refuse options given (not at their defaults) that the run ``where`` does not use: else they are
    taken without a word and not applied. ``names``: the options' destinations (``batch_size``)."""
    given = [f"--{name.replace('_', '-')}" for name in names if getattr(args, name) != parser.get_default(name)]
    if given:
        parser.error(f"{', '.join(given)} {'does' if len(given) == 1 else 'do'} not apply {where}")


def check_output(parser: argparse.ArgumentParser, option: str, path) -> None:
    """Refuse, before the run, an output file that cannot be written at its end: a folder, or a path
    under an existing file. (A missing folder is fine: the benchmarks create it.)"""
    if path is None:
        return
    path = Path(path)
    if path.is_dir():
        parser.error(f"argument {option}: {str(path)!r} is a folder (expected a file to write)")
    check_folder(parser, option, path.parent)


def check_not_full(parser: argparse.ArgumentParser, option: str, path, is_quick: Callable[[dict], bool],
                   default: str, *, run: str = "a quick run", holds: str = "a full run") -> None:
    """Refuse, before a quick run (a pilot, a smoke run), an output file that holds a full run: ``is_quick(report)``
    says which a report is; a file that is not such a report is left to ``check_output``. ``default``: the file a
    quick run writes when ``option`` is not given. ``run`` and ``holds`` name the two kinds in the message (a
    partial run, a fuller report)."""
    if path is None or not Path(path).is_file():
        return
    try:
        full = not is_quick(json.loads(Path(path).read_text()))
    except (OSError, ValueError, KeyError, TypeError, AttributeError):
        return
    if full:
        parser.error(f"argument {option}: {str(path)!r} holds {holds}; {run} would replace it "
                     f"(drop {option}: {run} writes {default})")


def check_folder(parser: argparse.ArgumentParser, option: str, path) -> None:
    """Refuse, before the run, a folder argument that is an existing file (or lies under one), or where no file
    can be created (its nearest existing folder, when it is missing: a read-only place, /proc)."""
    if path is None:
        return
    path = Path(path)
    for where in (path, *path.parents):
        if where.exists():
            if not where.is_dir():
                parser.error(f"argument {option}: {str(where)!r} is a file, not a folder")
            try:        # the reports are written through a temporary file in their folder (sazo_lite.atomic)
                with tempfile.TemporaryFile(dir=where):
                    pass
            except OSError as error:
                parser.error(f"argument {option}: cannot write in {str(where)!r} ({error.strerror or error})")
            break


def machine() -> dict:
    """When and where a benchmark runs: the UTC date and minute, the platform, processor, CPUs, torch, its threads
    and python (a printed table or a written report carries them: timings are this machine's, at this time)."""
    import torch

    return dict(date=datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC"),
                platform=platform.platform(), processor=platform.processor() or platform.machine(),
                cpus=os.cpu_count(), torch=torch.__version__, threads=torch.get_num_threads(),
                python=platform.python_version())


def measured_line(info: dict) -> str:
    """``machine()``'s fields in one line, for the head of a printed table."""
    return (f"{info['date']}, {info['processor']}, {info['cpus']} CPUs, torch {info['torch']} "
            f"({info['threads']} thread(s)), python {info['python']}")

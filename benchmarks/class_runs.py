"""The class-mode runs of the notebooks, stored: what a class sees printed, for the text to quote.

    python -m benchmarks.class_runs 05_the_race [03_importance_sampling_and_the_oracle ...]

Runs each named notebook in class mode (``SAZO_FAST=0``: the full version) on a copy, and writes
what its cells print (``sazo_lite.course.claims.output_text``: streams, tables, the static views of
dashboards) to ``benchmarks/reference/class_runs/<notebook>.txt``, under a header with the date,
the run time and the digest of the code cells that printed it. A notebook sentence that names the
class-mode run may quote a number only if this printout holds it (``tests/test_course_claims.py``),
and the test refuses a printout whose code digest is not the notebook's: change a code cell, run
it again. Class mode takes minutes per notebook; run one at a time on a shared machine.
"""
from __future__ import annotations

import argparse
import datetime
import os
import platform
import shutil
import sys
import tempfile
import time
from pathlib import Path

from sazo_lite.atomic import write_text

ROOT = Path(__file__).resolve().parents[1]
STORE = ROOT / "benchmarks" / "reference" / "class_runs"


def stored(name: str) -> tuple[dict, str] | None:
    """(header fields, printout) of notebook ``name``'s stored class run, or None if there is none."""
    path = STORE / f"{name}.txt"
    if not path.exists():
        return None
    head, _, body = path.read_text().partition("\n---\n")
    fields = dict(line.split(": ", 1) for line in head.splitlines() if ": " in line)
    return fields, body


def run(name: str) -> Path:
    """Execute ``notebooks/<name>.ipynb`` in class mode on a copy; store its printout; return the file."""
    import nbformat
    from nbclient import NotebookClient

    from sazo_lite.course import claims

    source = ROOT / "notebooks" / f"{name}.ipynb"
    if not source.exists():
        raise ValueError(f"Invalid notebook: {source} does not exist")
    with tempfile.TemporaryDirectory() as folder:
        copy = Path(folder) / source.name
        shutil.copy(source, copy)
        ran = claims.code_digest(claims.load(copy))      # the code that prints (the notebook may be edited meanwhile)
        notebook = nbformat.read(copy, as_version=4)
        fast = os.environ.get("SAZO_FAST")
        os.environ["SAZO_FAST"] = "0"       # the kernel inherits it: class mode
        try:
            start = time.perf_counter()
            NotebookClient(notebook, timeout=3600, resources={"metadata": {"path": str(ROOT / "notebooks")}}).execute()
            seconds = time.perf_counter() - start
        finally:                            # this process's own mode, as it was
            if fast is None:
                os.environ.pop("SAZO_FAST", None)
            else:
                os.environ["SAZO_FAST"] = fast
    header = (f"notebook: {name}\ncode: {ran}\n"
              f"date: {datetime.datetime.now(datetime.timezone.utc):%Y-%m-%d %H:%M} UTC\n"
              f"run: class mode (SAZO_FAST=0), {seconds:.0f} s, {platform.machine()} CPU, "
              f"{os.cpu_count()} cores, python {platform.python_version()}\n")
    STORE.mkdir(parents=True, exist_ok=True)
    path = STORE / f"{name}.txt"
    write_text(path, header + "---\n" + claims.output_text(dict(notebook)))
    return path


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.class_runs", description=__doc__.splitlines()[0])
    parser.add_argument("notebooks", nargs="+", help="notebook names without .ipynb, e.g. 05_the_race")
    # a notebook named twice runs once (class mode: up to an hour a notebook)
    names = list(dict.fromkeys(name.removesuffix(".ipynb") for name in parser.parse_args(argv).notebooks))
    missing = [name for name in names if not (ROOT / "notebooks" / f"{name}.ipynb").exists()]
    if missing:     # all checked before the first one runs (class mode: up to an hour a notebook)
        known = sorted(p.stem for p in (ROOT / "notebooks").glob("*.ipynb"))
        parser.error(f"argument notebooks: no such notebook {missing} (notebooks: {known})")
    for name in names:
        print(f"{name}: stored in {run(name).relative_to(ROOT)}", flush=True)


if __name__ == "__main__":
    sys.exit(main())

"""Build the course website: ``make book`` (fast mode) or ``make book FULL=1`` (full versions).

    python book/build.py [--full] [--jobs N] [--out build/book]

1. Stage the sources in ``<out>/src``: the course map (``notebooks/README.md``, the landing
   page, with the chapters' table of contents appended), the seven notebooks, the labs page.
2. Execute the notebooks there, ``--jobs`` at a time (nbclient; ``SAZO_FAST=1`` unless
   ``--full``), while ``python -m sazo_lite.course.labs assign`` builds the labs; only the *student*
   notebooks are copied to the site (never the masters or the autograders).
3. Copy plotly.js and MathJax into the site (it needs no network to build or to view) and run
   Sphinx (book/conf.py: myst-nb + sphinx-book-theme). The site is ``<out>/html``.

Nothing is written outside ``<out>``; the committed notebooks stay without outputs.
"""
from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
BOOK = ROOT / "book"
NOTEBOOKS = ROOT / "notebooks"
CELL_TIMEOUT = 1800  # seconds per cell (full mode trains for minutes in one cell)


def stage(src: Path) -> list[str]:
    """Copy the course map, the notebooks and the book's pages into ``src``; returns chapter names."""
    shutil.rmtree(src, ignore_errors=True)
    src.mkdir(parents=True)
    chapters = sorted(p.stem for p in NOTEBOOKS.glob("[0-9][0-9]_*.ipynb"))
    for name in chapters:
        shutil.copy(NOTEBOOKS / f"{name}.ipynb", src)
    toc = "\n".join(["", "", "```{toctree}", ":hidden:", ":maxdepth: 2", "", *chapters, "labs", "```", ""])
    (src / "README.md").write_text((NOTEBOOKS / "README.md").read_text() + toc)
    return chapters


def execute(path: str, fast: bool) -> tuple[str, float, float]:
    """Run one notebook in place (cwd = its folder), keeping outputs and widget state.

    Returns:
        The notebook's name, wall-clock seconds, and the kernel's CPU seconds (user + system).
    """
    import nbformat
    import psutil
    from jupyter_client.manager import KernelManager
    from nbclient import NotebookClient

    os.environ["SAZO_FAST"] = "1" if fast else "0"
    start, cpu = time.perf_counter(), [0.0]
    notebook = nbformat.read(path, as_version=4)
    # IPC sockets (files next to the notebook): kernels started at once cannot race for a TCP port.
    kernel = KernelManager(kernel_name="python3", transport="ipc", ip=str(Path(path).with_suffix(".kernel")))

    def kernel_cpu(**_):  # once the kernel has stopped (psutil still reads an exited, unreaped process)
        try:
            times = psutil.Process(kernel.provisioner.process.pid).cpu_times()
            cpu[0] = times.user + times.system + times.children_user + times.children_system
        except (psutil.Error, AttributeError):
            cpu[0] = float("nan")

    try:
        NotebookClient(notebook, km=kernel, timeout=CELL_TIMEOUT, store_widget_state=True,
                       on_notebook_complete=kernel_cpu,
                       resources={"metadata": {"path": str(Path(path).parent)}}).execute()
    finally:
        for socket_file in Path(path).parent.glob(Path(path).stem + ".kernel-*"):
            socket_file.unlink()
    slim_widget_state(notebook)
    nbformat.write(notebook, path)
    return Path(path).name, time.perf_counter() - start, cpu[0]


def slim_widget_state(notebook) -> None:
    """Drop each widget's front-end code from the saved state (plotly's FigureWidget carries
    all of plotly.js, ~4 MB, per figure); the site draws figures with its own plotly.js."""
    state = notebook.metadata.get("widgets", {}).get("application/vnd.jupyter.widget-state+json", {})
    for model in state.get("state", {}).values():
        for key in ("_esm", "_css"):
            model.get("state", {}).pop(key, None)


def execute_all(src: Path, chapters: list[str], fast: bool, jobs: int, logs: Path) -> None:
    """Execute the chapters, ``jobs`` at a time, each in its own process (its log in ``logs``);
    the first failure stops the others at once and raises with the end of its log."""
    import psutil

    logs.mkdir(parents=True, exist_ok=True)
    # The later chapters run longest (06 loads and tunes a language model): start them first.
    pending, running = list(reversed(chapters)), {}
    try:
        while pending or running:
            while pending and len(running) < jobs:
                name = pending.pop(0)
                command = [sys.executable, __file__, "--execute", str(src / f"{name}.ipynb")] + ([] if fast else ["--full"])
                with open(logs / f"{name}.log", "w") as log:
                    running[name] = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=log, text=True)
            time.sleep(0.2)
            for name in [n for n, process in running.items() if process.poll() is not None]:
                process = running.pop(name)
                if process.returncode != 0:
                    tail = (logs / f"{name}.log").read_text()[-6000:]
                    raise RuntimeError(f"{name}.ipynb failed while building the book:\n{tail}")
                print(f"  executed {name}.ipynb: {process.stdout.read().strip()}", flush=True)
    finally:
        for process in running.values():  # after a failure: the others and their kernels, now
            for child in [*psutil.Process(process.pid).children(recursive=True), process]:
                child.kill()
            process.wait()


def labs_page(src: Path, assigned: Path) -> int:
    """Copy each lab's student notebook to ``src/labs`` and write the labs page; returns how many."""
    students = sorted(assigned.glob("*/student/*.ipynb"))
    if not students:
        raise RuntimeError(f"no student notebooks under {assigned}: did `python -m sazo_lite.course.labs assign` fail?")
    (src / "labs").mkdir()
    rows = ["| lab | download |", "|---|---|"]
    for notebook in students:
        shutil.copy(notebook, src / "labs" / notebook.name)
        cells = json.loads(notebook.read_text())["cells"]
        heading = next((line for c in cells if c["cell_type"] == "markdown"
                        for line in "".join(c["source"]).splitlines() if line.startswith("# ")), f"# {notebook.stem}")
        rows.append(f"| {heading[2:].strip()} | {{download}}`{notebook.name} <labs/{notebook.name}>` |")
    page = (BOOK / "labs.md").read_text().replace("<!-- LABS TABLE: filled in by book/build.py -->", "\n".join(rows))
    (src / "labs.md").write_text(page)
    return len(students)


def assets(src: Path) -> None:
    """plotly.js (from the plotly wheel) and MathJax 3 (from the django-static-mathjax wheel) for the site."""
    import mathjax
    import plotly

    target = src / "_assets"
    (target / "mathjax").mkdir(parents=True)
    shutil.copy(Path(plotly.__file__).parent / "package_data" / "plotly.min.js", target)
    shutil.copy(Path(mathjax.__file__).parent / "static" / "mathjax" / "es5" / "tex-svg-full.js", target / "mathjax")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--full", action="store_true", help="run the notebooks' full versions (default: SAZO_FAST=1)")
    parser.add_argument("--jobs", type=int, default=2, help="notebooks executed at once")
    parser.add_argument("--out", type=Path, default=ROOT / "build" / "book")
    parser.add_argument("--execute", type=Path, help=argparse.SUPPRESS)  # internal: run one notebook
    args = parser.parse_args(argv)
    if args.execute:
        _, seconds, cpu = execute(str(args.execute), not args.full)
        print(f"{seconds:.0f} s (kernel CPU {cpu:.0f} s)")
        return 0
    if args.jobs < 1:
        raise ValueError(f"Invalid jobs: {args.jobs}")
    out, fast = args.out.resolve(), not args.full
    src, html = out / "src", out / "html"
    start = time.perf_counter()
    print(f"building the course website in {html} ({'fast' if fast else 'full'} mode, {args.jobs} at once)", flush=True)
    chapters = stage(src)
    shutil.rmtree(out / "labs", ignore_errors=True)
    labs = subprocess.Popen([sys.executable, "-m", "sazo_lite.course.labs", "assign", "--build", str(out / "labs")],
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, cwd=ROOT)
    try:
        execute_all(src, chapters, fast, args.jobs, out / "logs")
    finally:
        log, _ = labs.communicate()
    if labs.returncode != 0:
        raise RuntimeError(f"python -m sazo_lite.course.labs assign failed:\n{log}")
    count = labs_page(src, out / "labs")
    assets(src)
    executed = time.perf_counter()
    shutil.rmtree(html, ignore_errors=True)
    subprocess.run([sys.executable, "-m", "sphinx", "-b", "html", "-q", "-j", str(args.jobs), "-c", str(BOOK),
                    "-d", str(out / "doctrees"), str(src), str(html)], check=True, cwd=ROOT)
    (html / "index.html").write_text('<!DOCTYPE html><meta charset="utf-8"><title>sazo-lite</title>'
                                     '<meta http-equiv="refresh" content="0; url=README.html">'
                                     '<a href="README.html">The course map</a>\n')
    (html / ".nojekyll").write_text("")  # GitHub Pages: serve _static/ as is
    total = time.perf_counter() - start
    print(f"done in {total:.0f} s (notebooks and labs {executed - start:.0f} s, Sphinx {total - (executed - start):.0f} s): "
          f"{len(chapters)} chapters, {count} labs -> {html / 'index.html'}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())

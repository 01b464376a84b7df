"""Build the course website: ``make book`` (fast mode) or ``make book FULL=1`` (full versions).

    python book/build.py [--full] [--jobs N] [--out build/book] [--executed DIR] [--labs DIR]

1. Stage the sources in ``<out>/src``: the course map (``notebooks/README.md``, the landing
   page, with the table of contents appended), the seven notebooks, the algorithm page, the
   worked solutions (``solutions/``), the reference pages (``docs/*.md``, as ``docs/``) and the
   labs page. Relative links are rewritten to the staged pages; a link to a repository file
   that is not a page goes to the repository (``BOOK_REPOSITORY_URL``).
2. Execute the notebooks there, ``--jobs`` at a time (nbclient; ``SAZO_FAST=1`` unless
   ``--full``), while ``python -m sazo_lite.course.labs assign`` builds the labs; only the *student*
   notebooks are copied to the site (never the masters or the autograders). ``--executed DIR``
   takes chapters already run in fast mode instead (``make test`` runs them once, under nbmake
   with ``--overwrite`` on copies in ``DIR``); each must hold the committed notebook's code.
   ``--labs DIR`` takes labs already assigned there (``python -m sazo_lite.course.labs assign
   --build DIR``; the test session assigns them once for every file that needs them), copied
   to ``<out>/labs``.
3. Copy plotly.js and MathJax into the site (it needs no network to build or to view) and run
   Sphinx (book/conf.py: myst-nb + sphinx-book-theme) with warnings as errors (``-W``: a dead
   link or a page outside the table of contents fails the build). The site is ``<out>/html``.

Nothing is written outside ``<out>``; the committed notebooks stay without outputs.
"""
from __future__ import annotations

import argparse
import json
import os
import posixpath
import re
import shutil
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
BOOK = ROOT / "book"
NOTEBOOKS = ROOT / "notebooks"
CELL_TIMEOUT = 1800  # seconds per cell (full mode trains for minutes in one cell)


# The reference part of the book: docs/*.md in this order (pages that do not exist are skipped).
REFERENCE = ("guarantees", "samplers", "benchmarks", "llm", "trainer", "memory", "distributed", "course")
_LINK = re.compile(r"(\]\()([^)\s]+)(\))")


def repository_url() -> str:
    """The repository links to non-page files point to (the same variables as book/conf.py)."""
    url = os.environ.get("BOOK_REPOSITORY_URL", "https://github.com/sazo-lite/sazo-lite").rstrip("/")
    return f"{url}/blob/{os.environ.get('BOOK_REPOSITORY_BRANCH', 'main')}"


def rewrite_links(text: str, origin: str, pages: dict[str, str]) -> str:
    """Point the relative markdown links of a page staged from repository path ``origin``.

    A link to another staged page becomes its staged relative path; one to any other
    repository file becomes a repository URL; external links, anchors and links to missing
    files are left alone (Sphinx then reports a missing one, and -W fails the build).

    Example:
        >>> rewrite_links("[m](../README.md) [c](../notebooks/README.md#x)", "docs/llm.md",
        ...               {"docs/llm.md": "docs/llm.md", "notebooks/README.md": "README.md"})
        '[m](https://github.com/sazo-lite/sazo-lite/blob/main/README.md) [c](../README.md#x)'
    """
    here = posixpath.dirname(pages[origin])

    def one(match):
        target = match.group(2)
        if re.match(r"^[a-z][a-z0-9+.-]*:", target) or target.startswith(("#", "/")):
            return match.group(0)
        path, _, anchor = target.partition("#")
        resolved = posixpath.normpath(posixpath.join(posixpath.dirname(origin), path))
        if resolved in pages:
            new = posixpath.relpath(pages[resolved], here or ".")
        elif not resolved.startswith("..") and (ROOT / resolved).exists():
            new = f"{repository_url()}/{resolved}"
        else:
            return match.group(0)
        return f"{match.group(1)}{new}{'#' + anchor if anchor else ''}{match.group(3)}"

    return _LINK.sub(one, text)


def _toctree(entries: list[str], caption: str | None = None) -> list[str]:
    return ["", "```{toctree}", ":hidden:", ":maxdepth: 2", *([f":caption: {caption}"] if caption else []), "",
            *entries, "```", ""]


def executed_copy(name: str, executed: Path):
    """Chapter ``name`` as run in ``executed``, checked to hold the committed notebook's code cells
    (a copy run before an edit would show the old code's outputs)."""
    committed, ran = (json.loads(path.read_text()) for path in (NOTEBOOKS / f"{name}.ipynb", executed / f"{name}.ipynb"))
    code = [[("".join(c["source"])) for c in nb["cells"] if c["cell_type"] == "code"] for nb in (committed, ran)]
    if code[0] != code[1]:
        raise RuntimeError(f"{executed / name}.ipynb does not hold the code of notebooks/{name}.ipynb: run it again")
    if any(c["cell_type"] == "code" and c["source"] and c.get("execution_count") is None for c in ran["cells"]):
        raise RuntimeError(f"{executed / name}.ipynb has cells that never ran")
    slim_widget_state(ran)
    return ran


def stage(src: Path, executed: Path | None = None) -> list[str]:
    """Copy the course map, the notebooks (from ``executed`` with their outputs, if given), the
    algorithm page, the solutions, the reference pages and the book's pages into ``src``, links
    rewritten; returns the chapter names."""
    shutil.rmtree(src, ignore_errors=True)
    src.mkdir(parents=True)
    chapters = sorted(p.stem for p in NOTEBOOKS.glob("[0-9][0-9]_*.ipynb"))
    solutions = sorted(p.stem for p in (NOTEBOOKS / "solutions").glob("*.md") if p.stem != "README")
    reference = [name for name in REFERENCE if (ROOT / "docs" / f"{name}.md").exists()]
    pages = {f"notebooks/{name}.ipynb": f"{name}.ipynb" for name in chapters}
    pages.update({"notebooks/README.md": "README.md", "notebooks/algorithm.md": "algorithm.md",
                  "notebooks/solutions/README.md": "solutions/README.md", "book/labs.md": "labs.md"})
    pages.update({f"notebooks/solutions/{name}.md": f"solutions/{name}.md" for name in solutions})
    pages.update({f"docs/{name}.md": f"docs/{name}.md" for name in reference})
    for origin, staged in pages.items():
        if origin == "book/labs.md":
            continue  # written by labs_page once the labs are built
        target = src / staged
        target.parent.mkdir(parents=True, exist_ok=True)
        if origin.endswith(".ipynb"):
            notebook = executed_copy(Path(origin).stem, executed) if executed else json.loads((ROOT / origin).read_text())
            for cell in notebook["cells"]:
                if cell["cell_type"] == "markdown":
                    cell["source"] = rewrite_links("".join(cell["source"]), origin, pages)
            target.write_text(json.dumps(notebook, indent=1, ensure_ascii=False) + "\n")
        else:
            target.write_text(rewrite_links((ROOT / origin).read_text(), origin, pages))
    toc = "\n".join([*_toctree([*chapters, "algorithm", "labs"]),
                      *_toctree(["solutions/README", *[f"solutions/{name}" for name in solutions]], "Solutions"),
                      *_toctree([f"docs/{name}" for name in reference], "Reference")])
    (src / "README.md").write_text((src / "README.md").read_text() + toc)
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
    state = notebook.get("metadata", {}).get("widgets", {}).get("application/vnd.jupyter.widget-state+json", {})
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
    page = rewrite_links(page, "book/labs.md", {"book/labs.md": "labs.md"})
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


def sphinx(src: Path, html: Path, doctrees: Path, jobs: int) -> None:
    """Render ``src`` to ``html``; any Sphinx warning fails the build (-W, all reported first)."""
    subprocess.run([sys.executable, "-m", "sphinx", "-b", "html", "-q", "-W", "--keep-going", "-j", str(jobs),
                    "-c", str(BOOK), "-d", str(doctrees), str(src), str(html)], check=True, cwd=ROOT)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--full", action="store_true", help="run the notebooks' full versions (default: SAZO_FAST=1)")
    parser.add_argument("--jobs", type=int, default=2, help="notebooks executed at once")
    parser.add_argument("--out", type=Path, default=ROOT / "build" / "book")
    parser.add_argument("--executed", type=Path, default=None,
                        help="a folder of the chapters already run in fast mode (their outputs are used as they are)")
    parser.add_argument("--labs", type=Path, default=None,
                        help="a folder of labs already assigned (python -m sazo_lite.course.labs assign --build DIR)")
    parser.add_argument("--execute", type=Path, help=argparse.SUPPRESS)  # internal: run one notebook
    args = parser.parse_args(argv)
    if args.execute:
        _, seconds, cpu = execute(str(args.execute), not args.full)
        print(f"{seconds:.0f} s (kernel CPU {cpu:.0f} s)")
        return 0
    if args.jobs < 1:
        raise ValueError(f"Invalid jobs: {args.jobs}")
    out, fast = args.out.resolve(), not args.full
    if args.labs and not args.labs.is_dir():
        raise ValueError(f"Invalid labs: {args.labs} is not a folder (python -m sazo_lite.course.labs assign --build DIR)")
    if args.executed and args.full:
        raise ValueError("--executed takes fast-mode runs; --full executes the notebooks itself")
    src, html = out / "src", out / "html"
    start = time.perf_counter()
    how = f"executed in {args.executed}" if args.executed else f"{args.jobs} at once"
    print(f"building the course website in {html} ({'fast' if fast else 'full'} mode, {how})", flush=True)
    chapters = stage(src, args.executed and args.executed.resolve())
    shutil.rmtree(out / "labs", ignore_errors=True)
    if args.labs:
        shutil.copytree(args.labs, out / "labs")
    labs = None if args.labs else subprocess.Popen(
        [sys.executable, "-m", "sazo_lite.course.labs", "assign", "--build", str(out / "labs")],
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, cwd=ROOT)
    try:
        if not args.executed:
            execute_all(src, chapters, fast, args.jobs, out / "logs")
    finally:
        log, _ = labs.communicate() if labs else ("", None)
    if labs and labs.returncode != 0:
        raise RuntimeError(f"python -m sazo_lite.course.labs assign failed:\n{log}")
    count = labs_page(src, out / "labs")
    assets(src)
    executed = time.perf_counter()
    shutil.rmtree(html, ignore_errors=True)
    sphinx(src, html, out / "doctrees", args.jobs)
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

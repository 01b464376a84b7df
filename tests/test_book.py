"""Real browser: the course website (``make book``) built in fast mode and read in Chromium.

The site is built once for this module (``book/build.py --out <tmp>``, SAZO_FAST=1), served
from 127.0.0.1, and every page is opened in headless Chromium with every request to another
host refused: the pages must work offline. For each chapter: no console errors, every plotly
figure drawn with data, the math typeset by MathJax, every internal link answering, launch
buttons present, dashboards shown as their static view. Then the landing page's table of
contents, search, and the labs page (student notebooks only).
"""
from __future__ import annotations

import functools
import importlib.util
import json
import os
import re
import subprocess
import sys
import threading
import urllib.error
import urllib.parse
import urllib.request
from http.server import SimpleHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest

from test_browser import ARTIFACTS, CHROMIUM, browser, wait_until  # noqa: F401 (browser: a fixture)

ROOT = Path(__file__).resolve().parents[1]
CHAPTERS = sorted(p.stem for p in (ROOT / "notebooks").glob("[0-9][0-9]_*.ipynb"))



def _load(name: str, path: Path):
    """Import one of book/'s scripts under its own name (``build`` is also a PyPI package's name)."""
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


book_build = _load("sazo_book_build", ROOT / "book" / "build.py")
sazo_book_ext = _load("sazo_book_ext", ROOT / "book" / "sazo_book_ext.py")


def in_chromium(test):
    """Mark a test as a browser test, skipped without Debian's Chromium."""
    test = pytest.mark.browser(test)
    return pytest.mark.skipif(not CHROMIUM.exists(), reason="needs Debian's chromium at /usr/bin/chromium "
                              "(apt-get install chromium; .ci/run installs it)")(test)


# -- without a browser: the pieces ----------------------------------------------------------------
def _board(drawn: bool):
    import ipywidgets as widgets
    import plotly.graph_objects as go

    from sazo_lite.course.widgets._common import Dashboard

    figure = go.FigureWidget(go.Scatter(x=[1, 2, 3], y=[4.0, 5.0, 6.5]) if drawn else go.Scatter())
    controls = {"eps": widgets.FloatSlider(value=0.001, min=0, max=1, step=0.001, description="ε"),
                "run": widgets.Button(description="run")}
    readout = widgets.HTML("gap <b>0.25</b>")
    return Dashboard("A test board", list(controls.values()), controls, {"main": figure}, lambda: None, readout)


def test_dashboard_bundle_carries_a_static_view_with_its_figure():
    bundle = _board(drawn=True)._repr_mimebundle_()
    assert "application/vnd.jupyter.widget-view+json" in bundle  # live frontends keep the widget
    html = bundle["text/html"]
    assert "A test board" in html and "Static view" in html and "ε = 0.001" in html and "gap <b>0.25</b>" in html
    assert "sazo-launch" in html
    spec = re.search(r"var f = (\{.*?\}); window\.Plotly", html, re.S).group(1)
    data = json.loads(spec)["data"]
    assert data[0]["x"] == [1, 2, 3] and data[0]["y"] == [4.0, 5.0, 6.5]


def test_dashboard_static_view_leaves_out_undrawn_figures():
    html = _board(drawn=False)._repr_mimebundle_()["text/html"]
    assert "Static view" in html and "sazo-static-figure" not in html


class _Renderer:  # what sazo_book_ext reads from myst-nb's element renderer
    def __init__(self, states):
        widgets = {sazo_book_ext.WIDGET_STATE: {"state": states}}
        self.renderer = type("R", (), {"nb_client": type("C", (), {"nb_metadata": {"widgets": widgets}})()})()


def _mime(mime_type, content):
    from myst_nb.core.render import MimeData

    return MimeData(mime_type, content)


def test_book_draws_plotly_json_and_bare_figure_widgets():
    figure = {"data": [{"type": "bar", "x": ["a", "b"], "y": [1, 2]}], "layout": {"title": {"text": "</script>"}}}
    nodes = sazo_book_ext.StaticPlotly.handle_mime(_Renderer({}), _mime(sazo_book_ext.PLOTLY, figure), False)
    html = nodes[0].astext()
    assert "Plotly.newPlot" in html and '"x": ["a", "b"]' in html
    assert html.count("</script>") == 1  # the title's "</script>" is escaped
    states = {"fig": {"model_name": "AnyModel", "state": {"_widget_data": [{"type": "scatter", "y": [3, 1]}],
                                                          "_widget_layout": {"width": 300}}}}
    view = _mime(sazo_book_ext.WIDGET_VIEW, {"model_id": "fig"})
    html = sazo_book_ext.StaticPlotly.handle_mime(_Renderer(states), view, False)[0].astext()
    assert '"y": [3, 1]' in html and '"width": 300' in html


def test_book_drops_progress_bars_and_notes_other_widgets():
    states = {"bar": {"model_name": "HBoxModel", "state": {"children": ["IPY_MODEL_p", "IPY_MODEL_t"]}},
              "p": {"model_name": "FloatProgressModel", "state": {}},
              "t": {"model_name": "HTMLModel", "state": {}},
              "box": {"model_name": "VBoxModel", "state": {"children": ["IPY_MODEL_t"]}}}
    handle = sazo_book_ext.StaticPlotly.handle_mime
    assert handle(_Renderer(states), _mime(sazo_book_ext.WIDGET_VIEW, {"model_id": "bar"}), False) == []
    note = handle(_Renderer(states), _mime(sazo_book_ext.WIDGET_VIEW, {"model_id": "box"}), False)[0].astext()
    assert "live Python kernel" in note and "sazo-launch" in note
    assert handle(_Renderer(states), _mime("text/plain", "x"), False) is None  # myst-nb's own renderers


def _toctrees(text: str) -> list[list[str]]:
    blocks = text.split("```{toctree}")[1:]
    return [[line for line in block.split("```")[0].splitlines() if line and not line.startswith(":")]
            for block in blocks]


def test_staged_course_map_lists_the_chapters_in_order(tmp_path):
    chapters = book_build.stage(tmp_path / "src")
    assert chapters == CHAPTERS and len(chapters) == 7
    course, solutions, reference = _toctrees((tmp_path / "src" / "README.md").read_text())
    assert course == [*CHAPTERS, "algorithm", "labs"]
    assert solutions[0] == "solutions/README" and {f"solutions/{c}" for c in CHAPTERS} <= set(solutions)
    assert reference == [f"docs/{n}" for n in book_build.REFERENCE if (ROOT / "docs" / f"{n}.md").exists()]
    assert len(reference) >= 8
    assert all((tmp_path / "src" / f"{name}.ipynb").exists() for name in chapters)
    assert (tmp_path / "src" / "docs" / "course.md").exists() and (tmp_path / "src" / "algorithm.md").exists()


def test_staged_links_point_at_pages_or_the_repository(tmp_path):
    book_build.stage(tmp_path / "src")
    course = (tmp_path / "src" / "docs" / "course.md").read_text()
    assert "](../README.md)" in course                          # notebooks/README.md is the landing page
    assert f"]({book_build.repository_url()}/README.md)" in course  # the repository's README is not a page
    solutions = (tmp_path / "src" / "solutions" / "README.md").read_text()
    assert "](06_llm_finetuning.md)" in solutions


def _ran_copy(name: str, folder: Path, edit=None) -> Path:
    """notebooks/<name>.ipynb as a run would leave it (an output and a count per code cell)."""
    notebook = json.loads((ROOT / "notebooks" / f"{name}.ipynb").read_text())
    for count, cell in enumerate((c for c in notebook["cells"] if c["cell_type"] == "code"), 1):
        cell["execution_count"] = count
        cell["outputs"] = [{"output_type": "stream", "name": "stdout", "text": f"ran cell {count}\n"}]
    notebook.setdefault("metadata", {})["widgets"] = {"application/vnd.jupyter.widget-state+json": {
        "state": {"m": {"state": {"_esm": "x" * 1000, "value": 3}}}}}
    if edit:
        edit(notebook)
    folder.mkdir(exist_ok=True)
    (folder / f"{name}.ipynb").write_text(json.dumps(notebook))
    return folder


def test_staging_executed_chapters_keeps_their_outputs_and_refuses_stale_or_unrun_ones(tmp_path):
    ran = tmp_path / "ran"
    for name in CHAPTERS:
        _ran_copy(name, ran)
    book_build.stage(tmp_path / "src", ran)
    staged = json.loads((tmp_path / "src" / f"{CHAPTERS[0]}.ipynb").read_text())
    assert [c["outputs"][0]["text"] for c in staged["cells"] if c["cell_type"] == "code"][:2] == ["ran cell 1\n", "ran cell 2\n"]
    model = staged["metadata"]["widgets"]["application/vnd.jupyter.widget-state+json"]["state"]["m"]["state"]
    assert model == {"value": 3}                        # the widget's front-end code is dropped

    def edited(notebook):                               # run before someone edited a line of code
        cell = next(c for c in notebook["cells"] if c["cell_type"] == "code")
        cell["source"] = "".join(cell["source"]) + "\n# edited"

    _ran_copy(CHAPTERS[-1], ran, edited)
    with pytest.raises(RuntimeError, match="does not hold the code"):
        book_build.stage(tmp_path / "src", ran)

    def unrun(notebook):                                # a run that stopped half-way
        next(c for c in notebook["cells"] if c["cell_type"] == "code")["execution_count"] = None

    _ran_copy(CHAPTERS[-1], ran, unrun)
    with pytest.raises(RuntimeError, match="never ran"):
        book_build.stage(tmp_path / "src", ran)


def test_build_refuses_a_labs_folder_that_is_not_there(tmp_path):
    with pytest.raises(ValueError, match="Invalid labs"):
        book_build.main(["--out", str(tmp_path / "out"), "--labs", str(tmp_path / "no-such-build")])
    assert not (tmp_path / "out").exists()  # refused before writing anything


def test_rewrite_links_leaves_external_links_and_anchors():
    pages = {"notebooks/README.md": "README.md"}
    text = "[a](https://x.org/y) [b](#here) [c](mailto:a@b) [d](missing.md)"
    assert book_build.rewrite_links(text, "notebooks/README.md", pages) == text


def test_book_sources_build_without_sphinx_warnings(tmp_path):
    """The staged pages (notebooks unexecuted) render with -W: no dead link, no page outside the toc."""
    pytest.importorskip("sphinx")
    src = tmp_path / "src"
    book_build.stage(src)
    (src / "labs.md").write_text((ROOT / "book" / "labs.md").read_text())
    book_build.assets(src)
    book_build.sphinx(src, tmp_path / "html", tmp_path / "doctrees", 2)
    assert (tmp_path / "html" / "algorithm.html").exists() and (tmp_path / "html" / "docs" / "llm.html").exists()


# -- in Chromium: the built site --------------------------------------------------------------------


@pytest.fixture(scope="module")
def site(tmp_path_factory, assigned_labs):
    """Build the site once (fast mode) and serve it on a free local port; yields (url, out dir).

    ``SAZO_BOOK_OUT=<dir>`` reuses a site already built there (``book/build.py --out <dir>``)
    instead of building one, for working on the pages. ``make test`` builds afresh from the
    chapters its nbmake step ran (``SAZO_BOOK_EXECUTED=<dir>``: ``book/build.py --executed <dir>``,
    which refuses copies whose code differs from the committed notebooks); without it the build
    executes them itself. The labs come assigned from the run's shared build (``--labs``, conftest).
    """
    reuse = os.environ.get("SAZO_BOOK_OUT")
    if reuse:
        out = Path(reuse)
    else:
        out = tmp_path_factory.mktemp("book")
        executed = os.environ.get("SAZO_BOOK_EXECUTED")
        done = subprocess.run([sys.executable, str(ROOT / "book" / "build.py"), "--out", str(out),
                               "--labs", str(assigned_labs), *(["--executed", executed] if executed else [])],
                              capture_output=True, text=True, cwd=ROOT, timeout=2400)
        assert done.returncode == 0, f"book/build.py failed:\n{done.stdout[-4000:]}\n{done.stderr[-6000:]}"
    html = out / "html"
    handler = functools.partial(_QuietHandler, directory=str(html))
    server = ThreadingHTTPServer(("127.0.0.1", 0), handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}", out
    finally:
        server.shutdown()
        server.server_close()


class _QuietHandler(SimpleHTTPRequestHandler):
    def log_message(self, *args):
        pass


def open_offline(browser, url: str):
    """A page at ``url`` that may load only from the local server; returns (context, page, problems)."""
    host = urllib.parse.urlsplit(url).netloc
    problems: list[str] = []
    context = browser.new_context(viewport={"width": 1400, "height": 1800})

    def route(request_route):
        if urllib.parse.urlsplit(request_route.request.url).netloc == host:
            request_route.continue_()
        else:  # the site must not need the network (CDN scripts, fonts, trackers)
            problems.append(f"request to another host: {request_route.request.url}")
            request_route.abort()

    context.route("**/*", route)
    page = context.new_page()
    page.on("console", lambda m: problems.append(f"console {m.type}: {m.text}") if m.type == "error" else None)
    page.on("pageerror", lambda e: problems.append(f"page error: {e}"))
    page.on("requestfailed", lambda r: problems.append(f"failed request: {r.url}")
            if urllib.parse.urlsplit(r.url).netloc == host else None)
    page.goto(url, wait_until="load")
    return context, page, problems


def wait_for_math(page) -> dict:
    """Wait until MathJax has typeset the page; returns counts of formulas, typeset ones, leftovers."""
    if page.query_selector(".math.notranslate"):
        page.wait_for_function("() => window.MathJax && MathJax.startup && MathJax.startup.promise", timeout=30_000)
        page.evaluate("() => MathJax.startup.promise.then(() => true)")  # resolves after the first typeset
    return page.evaluate("""() => {
        const formulas = [...document.querySelectorAll('span.math.notranslate, div.math.notranslate')];
        return {formulas: formulas.length,
                typeset: formulas.filter(m => m.querySelector('mjx-container svg')).length,
                raw: formulas.filter(m => !m.querySelector('mjx-container')).map(m => m.textContent.slice(0, 60)),
                errors: document.querySelectorAll('mjx-merror, [data-mjx-error]').length};
    }""")


# Each figure placeholder: drawn by plotly.js?, how many data points (its traces' longest
# x / y / values / cells; plotly.js decodes typed-array specs into _fullData), a toolbar?, its width,
# and whether the toolbar (shown on hover at the top right) would cover the title.
_PLOTS = """() => [...document.querySelectorAll('.sazo-plot, .sazo-static-figure')].map(div => {
    const box = e => e && e.getBoundingClientRect(), bar = box(div.querySelector('.modebar')),
          title = box(div.querySelector('.gtitle')), svg = box(div.querySelector('.main-svg'));
    return {drawn: div.classList.contains('js-plotly-plot'),
        points: (div._fullData || []).reduce((n, t) => n + Math.max(0, ...[t.x, t.y, t.values, (t.cells || {}).values]
            .map(a => (a && a.length) || 0)), 0),
        modebar: !!div.querySelector('.modebar'),
        width: (div._fullLayout || {}).width || 0,
        title: (div.querySelector('.gtitle') || {}).textContent || '',
        covered: !!(bar && title && title.width > 0 && bar.left < title.right && title.left < bar.right
                    && bar.top < title.bottom && title.top < bar.bottom),
        clipped: !!(svg && title && title.width > 0 && (title.left < svg.left - 1 || title.right > svg.right + 1))};
})"""
COLUMN_PX = 680   # the book's text column: a wider figure is cut or scrolls


def internal_links(page, base: str) -> set[str]:
    hrefs = page.evaluate("() => [...document.querySelectorAll('a[href]')].map(a => a.href)")
    return {h.split("#")[0] for h in hrefs if h.startswith(base) and h.split("#")[0]}


def answers(url: str) -> bool:
    try:
        with urllib.request.urlopen(url, timeout=10) as response:
            return response.status == 200
    except urllib.error.URLError:
        return False


@in_chromium
@pytest.mark.parametrize("chapter", CHAPTERS)
def test_chapter_page(site, browser, chapter):
    base, _ = site
    context, page, problems = open_offline(browser, f"{base}/{chapter}.html")
    try:
        math = wait_for_math(page)
        plots = page.evaluate(_PLOTS)
        cells = json.loads((ROOT / "notebooks" / f"{chapter}.ipynb").read_text())["cells"]
        heading = next(line[2:].strip() for c in cells if c["cell_type"] == "markdown"
                       for line in "".join(c["source"]).splitlines() if line.startswith("# "))
        assert page.inner_text("h1").strip().rstrip("#").strip() == heading

        # Plotly: every figure placeholder was drawn, with data, and is interactive (modebar).
        assert plots, f"{chapter}: no plotly figure on the page"
        assert all(p["drawn"] and p["points"] > 0 for p in plots), f"{chapter}: empty or undrawn figures {plots}"
        assert all(p["modebar"] for p in plots), f"{chapter}: a figure without its zoom/pan toolbar"
        wide = [(p["title"], p["width"]) for p in plots if p["width"] > COLUMN_PX]
        assert not wide, f"{chapter}: figures wider than the column ({COLUMN_PX} px): {wide}"
        covered = [p["title"] for p in plots if p["covered"]]
        assert not covered, f"{chapter}: the toolbar covers these titles: {covered}"
        clipped = [p["title"] for p in plots if p["clipped"]]
        assert not clipped, f"{chapter}: titles wider than their figures: {clipped}"

        # Math: every formula typeset, none left as TeX, no MathJax error.
        assert math["formulas"] > 0 and math["typeset"] == math["formulas"], f"{chapter}: math not typeset {math}"
        assert not math["raw"] and math["errors"] == 0, f"{chapter}: {math}"

        # Dashboards: their static view (note + launch link pointed at this page's Binder URL), no widget errors.
        body = page.inner_text("body")
        for text in ("Error displaying widget", "FigureWidget(", "VBox(", "Traceback (most recent call last)"):
            assert text not in body, f"{chapter}: {text!r} on the page"
        # A chapter that draws a benchmark's stored report found it from its copy (its output, not its code, says)
        outputs = page.evaluate("() => [...document.querySelectorAll('.cell_output')].map(e => e.innerText).join('\\n')")
        assert outputs.strip(), f"{chapter}: no cell outputs on the page"
        assert "no stored report" not in outputs, f"{chapter}: a stored benchmark report was not found"
        for board in page.query_selector_all(".sazo-static-dashboard"):
            assert "Static view" in board.inner_text()
            launch = board.query_selector("a.sazo-launch").get_attribute("href")
            assert "/v2/gh/" in launch and f"notebooks/{chapter}.ipynb" in launch, launch

        # Launch buttons (Binder into JupyterLab) and the .ipynb download.
        hrefs = page.evaluate("() => [...document.querySelectorAll('a[href]')].map(a => a.href)")
        assert any("mybinder.org/v2/gh/" in h and f"urlpath=lab/tree/notebooks/{chapter}.ipynb" in h for h in hrefs)
        assert any(h.endswith(f"_sources/{chapter}.ipynb") for h in hrefs)

        # Links: the neighbouring chapters are linked, and every link inside the site answers.
        links = internal_links(page, base)
        index = CHAPTERS.index(chapter)
        for neighbour in CHAPTERS[max(0, index - 1):index + 2]:
            assert f"{base}/{neighbour}.html" in links, f"{chapter}: no link to {neighbour}"
        broken = sorted(link for link in links if not answers(link))
        assert not broken, f"{chapter}: broken links {broken}"
        assert not problems, f"{chapter}:\n" + "\n".join(problems)
    except BaseException:  # a picture of what failed (a full-page shot costs 2-4 s: only then)
        ARTIFACTS.mkdir(exist_ok=True)
        page.screenshot(path=str(ARTIFACTS / f"book_{chapter}.png"), full_page=True)
        raise
    finally:
        context.close()


@in_chromium
def test_chapter_pages_are_one_class_session_long(site, browser):
    """Each chapter's rendered length (px at the test's viewport), read in the built site: none is more
    than twice the median chapter, and 06 (once a 30,500 px research log) lies within the others' range."""
    base, _ = site
    heights = {}
    for chapter in CHAPTERS:
        context, page, problems = open_offline(browser, f"{base}/{chapter}.html")
        try:
            wait_for_math(page)
            page.wait_for_timeout(500)                     # figures drawn by their scripts take their height
            heights[chapter] = page.evaluate("() => document.querySelector('article, main').scrollHeight")
        finally:
            context.close()
    print("chapter page heights (px):", heights)
    median = sorted(heights.values())[len(heights) // 2]
    assert all(h <= 2 * median for h in heights.values()), heights
    others = [h for c, h in heights.items() if not c.startswith("06")]
    six = [h for c, h in heights.items() if c.startswith("06")]
    assert all(0.8 * min(others) <= h <= 1.1 * max(others) for h in six), heights


@in_chromium
def test_plot_zooms_on_drag(site, browser):
    """Interactive, not a picture: dragging across a figure zooms its x axis."""
    base, _ = site
    context, page, problems = open_offline(browser, f"{base}/{CHAPTERS[0]}.html")
    try:
        graph = page.locator(".js-plotly-plot").first
        graph.scroll_into_view_if_needed()
        before = page.evaluate("() => document.querySelector('.js-plotly-plot')._fullLayout.xaxis.range.slice()")
        box = graph.locator(".nsewdrag").first.bounding_box()
        page.mouse.move(box["x"] + box["width"] * 0.3, box["y"] + box["height"] * 0.5)
        page.mouse.down()
        page.mouse.move(box["x"] + box["width"] * 0.6, box["y"] + box["height"] * 0.5, steps=8)
        page.mouse.up()
        after = wait_until(lambda: (r := page.evaluate(
            "() => document.querySelector('.js-plotly-plot')._fullLayout.xaxis.range.slice()")) != before and r,
            10, "the x axis to zoom")
        assert after[1] - after[0] < before[1] - before[0]
        assert not problems, problems
    finally:
        context.close()


@in_chromium
def test_landing_page_toc_and_search(site, browser):
    base, _ = site
    context, page, problems = open_offline(browser, f"{base}/index.html")
    try:
        page.wait_for_url(re.compile(r".*/README\.html$"))
        wait_for_math(page)
        assert "The course map" in page.inner_text("h1")
        # Table of contents: the seven chapters in order, then the labs.
        toc = page.evaluate("() => [...document.querySelectorAll('.bd-sidebar-primary nav a.reference.internal')]"
                            ".map(a => a.getAttribute('href'))")
        pages = [h.split("#")[0].removesuffix(".html") for h in toc if h.endswith(".html")]
        assert [p for p in pages if p in CHAPTERS] == CHAPTERS and "labs" in pages, toc
        broken = sorted(link for link in internal_links(page, base) if not answers(link))
        assert not broken, broken
        assert not problems, problems
    finally:
        context.close()
    context, page, problems = open_offline(browser, f"{base}/search.html?q=importance+sampling")
    try:
        page.wait_for_selector("#search-results li", timeout=30_000)
        results = page.evaluate("() => [...document.querySelectorAll('#search-results li a')].map(a => a.href)")
        assert any("03_importance_sampling_and_the_oracle" in r for r in results), results
        assert not problems, problems
    finally:
        context.close()


def code_lines(notebook: Path | str) -> set[str]:
    """The stripped, non-trivial code lines of a notebook (a path or its JSON text)."""
    text = notebook.read_text() if isinstance(notebook, Path) else notebook
    cells = json.loads(text)["cells"]
    return {line.strip() for c in cells if c["cell_type"] == "code"
            for line in "".join(c["source"]).splitlines() if len(line.strip()) > 3}


@in_chromium
def test_labs_page_offers_student_notebooks_only(site, browser):
    base, out = site
    context, page, problems = open_offline(browser, f"{base}/labs.html")
    try:
        links = page.evaluate("() => [...document.querySelectorAll('a.download, a[href*=\"_downloads/\"]')]"
                              ".map(a => a.href)")
        masters = sorted((ROOT / "labs").glob("lab*.ipynb"))
        names = sorted({link.rsplit("/", 1)[-1] for link in links})
        assert names == [m.name for m in masters], names
        for link in sorted(set(links)):
            with urllib.request.urlopen(link, timeout=10) as response:
                text = response.read().decode()
            name = link.rsplit("/", 1)[-1]
            for marker in ("# BEGIN SOLUTION", "# HIDDEN", "# BEGIN TESTS", "# ASSIGNMENT CONFIG"):
                assert marker not in text, f"{name}: {marker!r} in the download"
            # It is otter's student version, and the solutions (in the autograder's copy) are not in it.
            built = out / "labs" / Path(name).stem
            assert code_lines(text) == code_lines(built / "student" / name), name
            solutions = code_lines(built / "autograder" / name) - code_lines(text)
            assert solutions, f"{name}: the autograder's copy has no line the download lacks"
        assert not problems, problems
    finally:
        context.close()
    shipped = [p.name for p in (out / "html").rglob("*") if p.suffix == ".zip" or "autograder" in p.name]
    assert not shipped, f"autograder files in the site: {shipped}"

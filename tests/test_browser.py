"""Real browser: JupyterLab in headless Chromium renders the dashboards and reacts to the keyboard.

Headless kernel tests cannot see what students hit: "Error displaying widget", a FigureWidget
that never renders, a widget-manager mismatch. This test starts ``jupyter-lab`` from this
environment on a free port with a random token, drives Debian's Chromium with Playwright
(never ``playwright install``), runs each notebook's dashboards in fast mode and reads plot data
from the DOM. The server holds copies that keep a notebook's import cell and the cells that build
its dashboards, as the notebook writes them (nbmake runs every whole notebook already).
Run it alone with ``make test-browser``; screenshots land in ``test-artifacts/``.
"""
from __future__ import annotations

import json
import os
import re
import secrets
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
CHROMIUM = Path("/usr/bin/chromium")
ARTIFACTS = ROOT / "test-artifacts"
FLAGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking",
         "--disable-component-update", "--disable-sync", "--no-first-run", "--disable-quic"]

pytestmark = [pytest.mark.browser,
              pytest.mark.skipif(not CHROMIUM.exists(), reason="needs Debian's chromium at /usr/bin/chromium "
                                 "(apt-get install chromium; .ci/run installs it)")]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def wait_until(predicate, timeout: float, what: str, interval: float = 0.25):
    """Poll ``predicate`` until it returns a truthy value; fail after ``timeout`` seconds."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(interval)
    raise AssertionError(f"timed out after {timeout:.0f} s waiting for {what}")


@pytest.fixture(scope="module")
def lab(tmp_path_factory):
    """A jupyter-lab server over a scratch copy of notebooks/ (so outputs never reach the repo)."""
    workdir = tmp_path_factory.mktemp("lab")
    for notebook in (ROOT / "notebooks").glob("*.ipynb"):
        dashboard_copy(notebook, workdir / notebook.name)
    port, token = free_port(), secrets.token_hex(16)
    server = subprocess.Popen(
        [str(Path(sys.executable).parent / "jupyter-lab"), "--no-browser", "--allow-root",
         f"--port={port}", "--ServerApp.ip=127.0.0.1", f"--IdentityProvider.token={token}",
         f"--ServerApp.root_dir={workdir}", "--LabApp.expose_app_in_browser=True",
         "--LabApp.news_url=None", "--LabApp.check_for_updates_class=jupyterlab.NeverCheckForUpdate"],
        env={**os.environ, "SAZO_FAST": "1"}, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
        start_new_session=True)
    url = f"http://127.0.0.1:{port}"

    def answering():
        try:
            with urllib.request.urlopen(f"{url}/api/status?token={token}", timeout=2) as response:
                return response.status == 200
        except OSError:
            return False

    try:
        wait_until(answering, 60, "jupyter-lab to answer")
        yield url, token
    finally:
        stop_server(server, url, token)


def dashboard_copy(source: Path, target: Path) -> None:
    """``source`` with only its first code cell (the imports) and the code cells that build a dashboard
    (a call of ``*_dashboard(``), unchanged and in order; markdown dropped."""
    import nbformat

    notebook = nbformat.read(source, as_version=4)
    code = [c for c in notebook.cells if c.cell_type == "code"]
    notebook.cells = code[:1] + [c for c in code[1:] if re.search(r"\w_dashboard\(", c.source)]
    nbformat.write(notebook, target)


def stop_server(server: subprocess.Popen, url: str, token: str) -> None:
    """Shut kernels down through the API, then stop the server and anything it left behind."""
    import psutil

    children = psutil.Process(server.pid).children(recursive=True) if server.poll() is None else []
    try:
        request = urllib.request.Request(f"{url}/api/shutdown?token={token}", method="POST")
        urllib.request.urlopen(request, timeout=5)
        server.wait(timeout=15)
    except Exception:
        os.killpg(server.pid, signal.SIGKILL)
        server.wait(timeout=10)
    for child in children:
        if child.is_running():
            child.kill()


@pytest.fixture(scope="module")
def browser():
    from playwright.sync_api import sync_playwright

    with sync_playwright() as playwright:
        instance = playwright.chromium.launch(executable_path=str(CHROMIUM), args=FLAGS, headless=True)
        try:
            yield instance
        finally:
            instance.close()


def open_and_run(browser, lab, notebook: str, timeout_s: float = 240):
    """Open ``notebook`` in JupyterLab, run all cells, wait until all ran and the kernel is idle."""
    url, token = lab
    context = browser.new_context(viewport={"width": 1400, "height": 2400})  # tall: whole dashboards
    page = context.new_page()
    page.set_default_timeout(30_000)
    page.goto(f"{url}/lab/tree/{notebook}?reset&token={token}")  # reset: no restored workspace
    find = f"[...window.jupyterapp.shell.widgets('main')].find(w => w.context && w.context.path === '{notebook}')"
    page.wait_for_function(f"window.jupyterapp && {find} && {find}.sessionContext.session "
                           f"&& {find}.sessionContext.session.kernel.connectionStatus === 'connected'",
                           timeout=90_000)
    page.evaluate(f"window.jupyterapp.shell.activateById({find}.id)")
    page.evaluate("window.jupyterapp.commands.execute('notebook:run-all-cells')")
    state = wait_until(lambda: page.evaluate(_RUN_STATE.replace("FIND", find)), timeout_s,
                       f"{notebook} to finish running", interval=0.5)
    assert state == "done", f"{notebook}: a cell raised:\n{page.inner_text('.jp-RenderedText[data-mime-type*=error]')}"
    return context, page


# 'error' once a cell shows a traceback, 'done' once every code cell ran and the kernel is idle.
_RUN_STATE = """(() => {
  const w = FIND;
  if (document.querySelector('.jp-RenderedText[data-mime-type*=error]')) return 'error';
  const cells = [...w.content.widgets].filter(c => c.model.type === 'code' && c.model.sharedModel.source.trim());
  const ran = cells.every(c => c.model.executionCount !== null);
  return ran && w.sessionContext.session.kernel.status === 'idle' ? 'done' : '';
})()"""


def plot_data(page) -> str:
    """The data of every rendered plotly graph, as JSON (the DOM's view, not pixels)."""
    return page.evaluate("JSON.stringify([...document.querySelectorAll('.js-plotly-plot')]"
                         ".map(g => (g.data || []).map(t => [t.x, t.y])))")


def assert_rendered(page, name: str) -> None:
    page.wait_for_selector(".widget-slider", timeout=60_000)
    page.wait_for_selector(".js-plotly-plot", timeout=60_000)
    body = page.inner_text("body")
    assert "Error displaying widget" not in body, f"{name}: a widget failed to render"
    assert "Traceback" not in body, f"{name}: a cell raised"


def press_slider(page, label: str, key: str = "ArrowRight", times: int = 1, last: bool = False) -> None:
    """Focus the (first, or ``last``) slider whose description contains ``label`` and press ``key``."""
    sliders = page.locator(".widget-slider", has=page.locator(".widget-label", has_text=label))
    slider = sliders.last if last else sliders.first
    slider.scroll_into_view_if_needed()
    handle = slider.locator(".noUi-handle, [role=slider]").first
    handle.focus()
    for _ in range(times):
        page.keyboard.press(key)


def screenshot(page, name: str) -> Path:
    """Save the page and, beside it, the first dashboard output (sliders and plots) alone."""
    ARTIFACTS.mkdir(exist_ok=True)
    path = ARTIFACTS / name
    page.screenshot(path=str(path))
    dashboard = page.locator(".jp-OutputArea-output", has=page.locator(".js-plotly-plot")).first
    dashboard.scroll_into_view_if_needed()
    dashboard.screenshot(path=str(path.with_name(path.stem + "_dashboard.png")))
    assert path.stat().st_size > 10_000
    return path


def test_sazo_dashboard_renders_and_reacts_to_ema_decay(lab, browser):
    context, page = open_and_run(browser, lab, "04_sazo_estimating_norms.ipynb")
    try:
        assert_rendered(page, "notebook 04")
        before = plot_data(page)
        assert json.loads(before), "no plot data in the DOM"
        press_slider(page, "EMA decay", times=3, last=True)  # the SAZO dashboard's (the χ²₁ picture's comes first)
        wait_until(lambda: plot_data(page) != before, 60, "the plots to change after moving EMA decay β")
        screenshot(page, "04_sazo_estimating_norms.png")
    finally:
        context.close()


def test_memory_calculator_ratio_follows_context_length(lab, browser):
    context, page = open_and_run(browser, lab, "07_memory_on_device.ipynb")
    try:
        assert_rendered(page, "notebook 07")
        readout = page.locator(".widget-html", has=page.locator("b.ratio")).first  # "BP/ZO memory ratio …×"
        before = readout.inner_text()
        press_slider(page, "context n_ctx", times=2)
        wait_until(lambda: readout.inner_text() != before, 60, "the BP/ZO ratio to change with context n_ctx")
        screenshot(page, "07_memory_on_device.png")
    finally:
        context.close()

"""Sphinx extension for the course website: plotly figures and widgets on pages without a kernel.

* ``application/vnd.plotly.v1+json`` (what ``fig.show()`` / ``display(fig)`` emits in a kernel)
  becomes a ``<div>`` drawn by the site's own plotly.js: interactive (zoom, hover), offline.
* A widget view whose saved state is a plotly ``FigureWidget`` is drawn the same way from
  that state (``_widget_data`` / ``_widget_layout``); progress bars are dropped; any other
  widget becomes a short note with a launch link. Dashboards never get here: they carry a
  static ``text/html`` view of their own (``sazo_lite.course.widgets._common.static_dashboard_html``),
  which the configured mime priority prefers.

myst-nb finds mime renderers through an entry point of an installed package; the site is
not a package, so ``setup`` puts this one in front of myst-nb's list (same function, same place).
"""
from __future__ import annotations

import json
import uuid
from pathlib import Path

from docutils import nodes

PLOTLY = "application/vnd.plotly.v1+json"
WIDGET_VIEW = "application/vnd.jupyter.widget-view+json"
WIDGET_STATE = "application/vnd.jupyter.widget-state+json"


def plotly_html(figure: dict) -> str:
    """A div plus the script that draws ``figure`` ({"data", "layout"[, "config"]}) with plotly.js."""
    div = f"sazo-plot-{uuid.uuid4().hex}"
    config = {"responsive": True, **(figure.get("config") or {})}
    spec = json.dumps({"data": figure.get("data", []), "layout": figure.get("layout", {}), "config": config})
    spec = spec.replace("</", "<\\/")  # never end the script early
    return (f"<div id='{div}' class='sazo-plot'></div><script>(function () {{"
            f"var f = {spec}; window.Plotly.newPlot('{div}', f.data, f.layout, f.config);}})();</script>")


def _widget_state(renderer, model_id: str) -> dict:
    metadata = getattr(getattr(renderer.renderer, "nb_client", None), "nb_metadata", {}) or {}
    states = ((metadata.get("widgets") or {}).get(WIDGET_STATE) or {}).get("state") or {}
    return states.get(model_id) or {}


def _is_progress_bar(renderer, state: dict) -> bool:
    children = state.get("state", {}).get("children") or []
    ids = [c.split("IPY_MODEL_")[-1] for c in children if isinstance(c, str)]
    return any(_widget_state(renderer, i).get("model_name", "").endswith("ProgressModel") for i in ids)


class StaticPlotly:
    """myst-nb mime renderer plugin (see ``myst_nb.core.render.MimeRenderPlugin``)."""

    mime_priority_overrides = ()

    @staticmethod
    def handle_mime(renderer, data, inline):
        if inline:
            return None
        if data.mime_type == PLOTLY:
            figure = data.content if isinstance(data.content, dict) else json.loads(data.content)
            return [nodes.raw("", plotly_html(figure), format="html", classes=["output", "text_html"])]
        if data.mime_type == WIDGET_VIEW:
            content = data.content if isinstance(data.content, dict) else json.loads(data.content)
            state = _widget_state(renderer, content.get("model_id", ""))
            values = state.get("state", {})
            if "_widget_data" in values:  # a bare plotly FigureWidget
                figure = {"data": values["_widget_data"], "layout": values.get("_widget_layout", {})}
                return [nodes.raw("", plotly_html(figure), format="html", classes=["output", "text_html"])]
            if _is_progress_bar(renderer, state):
                return []
            note = ("<p class='sazo-static-note'><i>An interactive widget: it needs a live Python kernel.</i> "
                    "<a class='sazo-launch' href='https://mybinder.org' target='_blank' rel='noopener'>"
                    "&#9654; launch this notebook</a></p>")
            return [nodes.raw("", note, format="html", classes=["output", "text_html"])]
        return None


def _add_assets(app, config) -> None:
    """build.py's staged assets (plotly.min.js, MathJax) live in <srcdir>/_assets."""
    assets = Path(app.srcdir) / "_assets"
    if assets.is_dir():
        config.html_static_path.append(str(assets))


def setup(app):
    import myst_nb.core.render as render

    installed = render.load_mime_renders
    if not getattr(installed, "sazo_book", False):
        def load_mime_renders():
            return [StaticPlotly, *installed()]

        load_mime_renders.sazo_book = True
        render.load_mime_renders = load_mime_renders
    app.connect("config-inited", _add_assets)
    return {"parallel_read_safe": True, "parallel_write_safe": True}

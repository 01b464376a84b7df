"""Building blocks shared by every dashboard: captioned sliders, presets, the dashboard box.

A dashboard is an ``ipywidgets.VBox`` with three extra attributes that tests and notebooks use:
``controls`` (name → widget), ``figures`` (name → ``LiveFigure``, a plotly ``go.Figure``) and
``refresh()`` (recompute and redraw now). Setting a control's value from code redraws at once; a redraw
that fails after a control, preset or button shows its error in the readout (``shown_on_error``) instead of
raising (building a dashboard with bad arguments still raises).

A dashboard's figure is a plain ``go.Figure`` shown in an ``ipywidgets.Output`` (``LiveFigure.view``)
whose one output, the figure's plotly JSON, is replaced after each change (one message per
``batch_update``). It is not a plotly ``FigureWidget``: that is an anywidget whose page-side model
imports plotly's whole widget bundle (5 MB, once per figure) and drops every later update for good
if that import takes over anywidget's 2 s (``Runtime.ready``): in the Voilà app, which creates every
model at once, the race's plot stopped following its slider on most page loads (docs/course.md).
"""
from __future__ import annotations

import contextlib
import json
import math
from typing import Callable

import ipywidgets as widgets
import plotly.graph_objects as go
import plotly.io as pio

from ...validation import check_number, check_real

__all__ = ["slider", "log_slider", "int_slider", "question", "captioned", "presets", "redraw_on_change",
           "assemble", "Dashboard", "LiveFigure", "static_dashboard_html", "set_controls", "SAMPLER_COLORS",
           "SAMPLER_FILLS", "SAMPLER_LABELS", "divergence_note", "finite", "number_list", "lower_rate", "TINY_EPS",
           "below_tiny_eps", "require_keys",
           "same_lengths", "off_log_axes", "shown_on_error"]

# One palette for every dashboard: a sampler has the same colour in every plot of the course.
SAMPLER_COLORS = {"uniform": "#7f7f7f", "sazo": "#1f77b4", "sazo-plain": "#9467bd", "oracle": "#d62728"}
SAMPLER_FILLS = {"uniform": "rgba(127,127,127,0.2)", "sazo": "rgba(31,119,180,0.2)",
                 "sazo-plain": "rgba(148,103,189,0.2)", "oracle": "rgba(214,39,40,0.15)"}
SAMPLER_LABELS = {"uniform": "uniform MeZO", "sazo": "SAZO", "sazo-plain": "SAZO, plain rule", "oracle": "oracle p*"}

def lower_rate(rate: float) -> float:
    """A rate to try after a divergence: two notches (10^-0.5 ≈ 1/3) of the log sliders below ``rate``,
    to two significant digits.

    Example:
        >>> lower_rate(0.1), lower_rate(0.02)
        (0.032, 0.0063)
    """
    rate = check_number("rate", rate, 0.0, closed_low=False)   # "try nan" or "try -0.32" is no advice
    return float(f"{rate * 10 ** -0.5:.2g}")


# Below this ε a float32 loss difference f(θ+εz) − f(θ−εz) is mostly rounding (about 1e-7 of the loss), and
# rounding divided by 2ε is a huge, random δ: a run can blow up from that alone, at any rate.
TINY_EPS = 1e-6


def below_tiny_eps(eps: float | None) -> bool:
    """Whether the runs' ε (None: not given) is below ``TINY_EPS``, where the advice is "raise ε" first; a
    ValueError for an ε no run can have (−1 read as tiny, NaN as not)."""
    return eps is not None and check_number("eps", eps, 0.0, closed_low=False) < TINY_EPS


def divergence_note(what: str, how: str, rate_name: str, rate: float, after: str = "", *,
                    eps: float | None = None) -> str:
    """The crimson sentence every training dashboard shows for a diverged run: what diverged (and when),
    how it shows, at which rate, and the fix (a lower rate; at ε below ``TINY_EPS`` also a larger ε).

    Example:
        >>> divergence_note("SAZO diverged at step 20", "its loss became infinite", "η", 0.1)[-74:]
        'infinite. At η = 0.1 the steps are too large: lower η (try 0.032).</b><br>'
    """
    tail = f"; {after}" if after else ""
    known = math.isfinite(rate)   # a record without its rate (NaN): the advice without numbers, not "try nan"
    if below_tiny_eps(eps):
        return (f"<b style='color:crimson'>{what}: {how}{tail}. At ε = {eps:.1g} float32 rounding of the loss, divided "
                f"by 2ε, makes some δ huge and random: raise ε (1e-3 is safe here) before lowering {rate_name}"
                + (f" (now {rate:.2g})" if known else "") + ".</b><br>")
    if not known:
        return f"<b style='color:crimson'>{what}: {how}{tail}. Its steps are too large: lower {rate_name}.</b><br>"
    return (f"<b style='color:crimson'>{what}: {how}{tail}. At {rate_name} = {rate:.2g} the steps are too large: "
            f"lower {rate_name} (try {lower_rate(rate):.2g}).</b><br>")


def require_keys(name: str, record, keys) -> None:
    """Refuse a record (a dict of stored results) that lacks one of ``keys``, naming what is missing."""
    if not isinstance(record, dict):
        raise ValueError(f"Invalid {name}: expected a dict with keys {list(keys)}, got {type(record).__name__}")
    missing = [key for key in keys if key not in record]
    if missing:
        raise ValueError(f"Invalid {name}: missing {missing} (expected keys {list(keys)})")


def same_lengths(**columns) -> int:
    """The common length of several sequences; ValueError naming them when they differ."""
    lengths = {name: len(column) for name, column in columns.items() if column is not None}
    if len(set(lengths.values())) > 1:
        raise ValueError("Invalid " + "/".join(lengths) + f": lengths {list(lengths.values())} differ "
                         "(expected one value per example)")
    return next(iter(lengths.values()), 0)


def number_list(name: str, values, *, low: float = 0.0, high: float = math.inf) -> list[float]:
    """``values`` as a non-empty list of finite floats in [low, high], or a ValueError naming them (each a number:
    float() read True as 1.0 and "0.5" as 0.5; a numpy scalar or a 0-d tensor reads as its number)."""
    try:
        if isinstance(values, (str, bytes)):   # its characters are no sequence of numbers
            raise TypeError
        items = list(values)
    except TypeError:
        raise ValueError(f"Invalid {name}: expected a sequence of numbers, got {type(values).__name__}") from None
    out = [check_real(name, v.item() if getattr(v, "ndim", None) == 0 and hasattr(v, "item") else v) for v in items]
    bad = [v for v in out if not (math.isfinite(v) and low <= v <= high)]
    if not out or bad:
        raise ValueError(f"Invalid {name}: expected a non-empty sequence of finite numbers in [{low:g}, {high:g}], "
                         f"got {len(out)} value(s)" + (f", e.g. {bad[0]}" if bad else ""))
    return out


def off_log_axes(xs, ys) -> str:
    """" · k of n points have a 0, off the log axes" ("" when none): what a log-log scatter leaves out unsaid.

    Example:
        >>> off_log_axes([1.0, 0.0, 2.0], [3.0, 1.0, 0.0])
        ' · 2 of 3 points have a 0, off the log axes'
    """
    zeros = sum(1 for x, y in zip(xs, ys) if x <= 0 or y <= 0)
    return f" · {zeros} of {len(xs)} points have a 0, off the log axes" if zeros else ""


def finite(values):
    """``values`` as a float array with every inf and NaN made NaN: a gap in a plotly line, not an axis
    stretched to 10³⁰⁸ (plotly sends inf as it is)."""
    import numpy as np

    array = np.array(values, dtype=np.float64)
    array[~np.isfinite(array)] = np.nan
    return array


_LAYOUT = dict(width="470px")
_STYLE = dict(description_width="150px")


def slider(description: str, value: float, low: float, high: float, step: float, *,
           continuous_update: bool = False, readout_format: str = ".3g") -> widgets.FloatSlider:
    """A float slider labelled with its parameter's plain name ("ε", "EMA decay β")."""
    return widgets.FloatSlider(value=value, min=low, max=high, step=step, description=description,
                               continuous_update=continuous_update, readout_format=readout_format,
                               layout=_LAYOUT, style=_STYLE)


def log_slider(description: str, value: float, low_exp: float, high_exp: float, step: float = 0.25, *,
               continuous_update: bool = False) -> widgets.FloatLogSlider:
    """A log-scale slider from 10**low_exp to 10**high_exp (for ε, learning rates)."""
    return widgets.FloatLogSlider(value=value, base=10, min=low_exp, max=high_exp, step=step,
                                  description=description, continuous_update=continuous_update,
                                  readout_format=".1e", layout=_LAYOUT, style=_STYLE)


def int_slider(description: str, value: int, low: int, high: int, step: int = 1, *,
               continuous_update: bool = False) -> widgets.IntSlider:
    """An integer slider (batch size B, dimension d, number of directions q)."""
    return widgets.IntSlider(value=value, min=low, max=high, step=step, description=description,
                             continuous_update=continuous_update, layout=_LAYOUT, style=_STYLE)


def question(text: str) -> widgets.HTML:
    """The caption under a control: the question the student answers by moving it."""
    return widgets.HTML(f"<div style='color:#555;font-size:0.9em;margin:0 0 6px 158px'><i>{text}</i></div>")


def captioned(control: widgets.Widget, text: str) -> widgets.VBox:
    """A control with its question underneath."""
    return widgets.VBox([control, question(text)])


def shown_on_error(callback: Callable, readout: widgets.HTML) -> Callable:
    """``callback`` for a widget event (a slider moved, a button pressed) whose exception is shown in ``readout``
    instead of escaping: ipywidgets hands an observer's exception to the kernel's log, which JupyterLab keeps out
    of sight, so the figures stayed as they were without a word. The next redraw replaces the message."""
    import html

    def guarded(*args, **kwargs):
        try:
            return callback(*args, **kwargs)
        except Exception as error:   # noqa: BLE001 (any failure: the student sees it, the kernel goes on)
            readout.value = ("<b style='color:crimson'>Could not redraw at these settings: "
                             f"{html.escape(type(error).__name__)}: {html.escape(str(error))}</b><br>")
    return guarded


def set_controls(controls: dict[str, widgets.Widget], values: dict[str, object], refresh: Callable[[], None],
                 hold: list[bool]) -> None:
    """Write several control values with the per-control redraws held (``hold[0]``), then redraw once."""
    hold[0] = True
    try:
        for name, value in values.items():
            controls[name].value = value
    finally:
        hold[0] = False
    refresh()


def presets(choices: dict[str, dict[str, object]], controls: dict[str, widgets.Widget],
            refresh: Callable[[], None], hold: list[bool], *, complete: bool = True,
            keep: tuple[str, ...] = ()) -> widgets.HBox:
    """Buttons that set several controls at once and redraw once.

    With ``complete`` (the default) every preset is a whole regime: the controls' values when
    the buttons are built (the dashboard's defaults), then the preset's changes, so an earlier
    preset never leaks into a later one; a "defaults" button is added if there is none.
    ``keep`` names controls a preset leaves alone (e.g. a step slider). ``hold`` is a
    one-element list used as a flag: while a preset writes its values the per-control
    observers must skip redrawing (``if hold[0]: return``).
    """
    if complete:
        start = {name: control.value for name, control in controls.items()
                 if hasattr(control, "value") and name not in keep and not isinstance(control, widgets.Button)}
        choices = {**({} if "defaults" in choices else {"defaults": {}}), **choices}
        choices = {label: {**start, **values} for label, values in choices.items()}
    buttons = []
    for label, values in choices.items():
        button = widgets.Button(description=label, layout=widgets.Layout(width="auto"))

        def apply(_button, values=values):
            set_controls(controls, values, refresh, hold)

        button.on_click(apply)
        button.values = values  # what it sets (tests render each preset from this)
        buttons.append(button)
    box = widgets.HBox([widgets.HTML("<b>Presets:</b>&nbsp;"), *buttons])
    box.buttons = {button.description: button for button in buttons}
    return box


PLOTLY_MIME = "application/vnd.plotly.v1+json"


class LiveFigure(go.Figure):
    """A ``go.Figure`` drawn live in an ``ipywidgets.Output`` (``view``): every change redraws it there.

    plotly calls a figure's ``_send_*_msg`` hooks after each change (once at the end of a
    ``batch_update``); a plain ``go.Figure`` ignores them, a ``LiveFigure`` writes its plotly JSON as
    the view's one output (adding traces inside ``batch_update`` redraws too). That output is synced widget state, so a page that connects later
    (Voilà, a re-display) shows the current figure. Displayed by itself it is a static figure.

    Example:
        >>> fig = LiveFigure(layout=dict(title="demo"))
        >>> with fig.batch_update():
        ...     _ = fig.add_scatter(y=[1, 3, 2])
        >>> fig.view.outputs[0]["data"]["application/vnd.plotly.v1+json"]["data"][0]["y"]
        [1, 3, 2]
    """

    _holding = False  # inside batch_update: one redraw at its end

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self._view = widgets.Output()
        self._redraw()

    @contextlib.contextmanager
    def batch_update(self):
        """plotly's ``batch_update`` (edits applied together at the end), then one redraw."""
        if self._holding:  # nested
            yield
            return
        self._holding = True
        try:
            with super().batch_update():
                yield
        finally:
            self._holding = False
        self._redraw()

    @property
    def view(self) -> widgets.Output:
        """The ``Output`` widget that shows this figure (what a dashboard puts in its box)."""
        return self._view

    def _redraw(self, *_args, **_kwargs) -> None:
        view = getattr(self, "_view", None)  # None while go.Figure.__init__ adds the first traces
        if view is not None and not self._holding:
            figure = json.loads(pio.to_json(self, validate=False))
            view.outputs = ({"output_type": "display_data", "data": {PLOTLY_MIME: figure}, "metadata": {}},)

    _send_addTraces_msg = _send_moveTraces_msg = _send_deleteTraces_msg = _redraw
    _send_restyle_msg = _send_relayout_msg = _send_update_msg = _send_animate_msg = _redraw


class Dashboard(widgets.VBox):
    """A VBox that exposes ``controls``, ``figures``, ``readout`` and ``refresh`` for tests."""

    def __init__(self, title: str, rows: list[widgets.Widget], controls: dict[str, widgets.Widget],
                 figures: dict, refresh: Callable[[], None], readout: widgets.HTML | None = None):
        header = widgets.HTML(f"<h3 style='margin:4px 0'>{title}</h3>")
        shown = [getattr(figure, "view", figure) for figure in figures.values()]
        parts = [header, *rows] + ([readout] if readout is not None else []) + shown
        super().__init__(parts)
        self.controls, self.figures, self.readout = controls, figures, readout
        self._refresh = refresh

    def refresh(self) -> None:
        """Recompute and redraw with the current control values."""
        self._refresh()

    def _repr_mimebundle_(self, **kwargs):
        bundle = super()._repr_mimebundle_(**kwargs)
        # A frontend without a kernel (the course website, nbconvert) cannot draw the widget;
        # it falls back to this HTML: the figures as drawn now, the readout, a launch link.
        # JupyterLab, Voilà and VS Code prefer the widget view.
        bundle["text/html"] = static_dashboard_html(self)
        return bundle


def static_dashboard_html(board: Dashboard) -> str:
    """A dashboard as static HTML: title, the control values, readout, figures, a launch note.

    The figures are drawn with ``Plotly.newPlot`` when the page has plotly.js (the course
    website loads it); elsewhere the script does nothing and the note remains. The link
    goes to Binder; the website points it at the current page's own launch URL.

    Example:
        >>> from sazo_lite.course.widgets import estimator_dashboard
        >>> "Static view" in static_dashboard_html(estimator_dashboard())
        True
    """
    import html
    import uuid

    def shown(value):
        return f"{value:.3g}" if isinstance(value, float) else html.escape(str(value))

    settings = ", ".join(f"{html.escape(c.description)} = {shown(c.value)}" for c in board.controls.values()
                         if getattr(c, "description", "") and hasattr(c, "value"))
    parts = [board.children[0].value,  # the title header
             "<p class='sazo-static-note' style='margin:4px 0 8px 0'><b>Static view</b>: the figures "
             f"as drawn at {settings or 'the default settings'}. The controls need a live Python kernel: "
             "<a class='sazo-launch' href='https://mybinder.org' target='_blank' rel='noopener' "
             "style='display:inline-block;padding:1px 10px;border:1px solid #888;border-radius:4px;"
             "text-decoration:none'>&#9654; launch this notebook</a> (or run it locally with <code>make lab</code>).</p>"]
    if board.readout is not None:
        parts.append(board.readout.value)
    for figure in board.figures.values():
        if not _drawn(figure):
            continue  # nothing drawn yet (a dashboard that trains after it is displayed)
        div = f"sazo-static-{uuid.uuid4().hex}"
        spec = pio.to_json(figure, validate=False).replace("</", "<\\/")  # safe inside <script>
        parts.append(f"<div id='{div}' class='sazo-static-figure'></div><script>(function () {{"
                     f"var el = document.getElementById('{div}'); if (!el || !window.Plotly) return; "
                     f"var f = {spec}; window.Plotly.newPlot(el, f.data, f.layout, {{responsive: true}});"
                     f"}})();</script>")
    return f"<div class='sazo-static-dashboard'>{''.join(parts)}</div>"


def _drawn(figure) -> bool:
    """Whether any trace of ``figure`` has data (x, y, values or table cells)."""
    for trace in figure.to_plotly_json()["data"]:
        columns = [trace.get("x"), trace.get("y"), trace.get("values"), (trace.get("cells") or {}).get("values")]
        if any(column is not None and len(column) > 0 for column in columns):
            return True
    return False


def redraw_on_change(controls: dict[str, widgets.Widget], refresh: Callable[[], None], hold: list[bool]) -> None:
    """Redraw when any control's value changes, except while a preset is writing several values."""
    for control in controls.values():
        if hasattr(control, "value"):
            control.observe(lambda _change: None if hold[0] else refresh(), names="value")


def assemble(title: str, controls: dict[str, widgets.Widget], questions: dict[str, str],
             choices: dict[str, dict[str, object]], figures: dict, refresh: Callable[[], None],
             readout: widgets.HTML | None = None, extra_rows=()) -> Dashboard:
    """Wire every control to ``refresh``, caption each with its question, add presets, draw once.

    Args:
        questions: control name → the question its caption asks, in display order.
        choices: preset label → {control name: value}.
        extra_rows: widgets shown between the captioned controls and the presets (buttons).
    """
    hold = [False]
    live = shown_on_error(refresh, readout) if readout is not None else refresh   # a slider's or preset's redraw
    redraw_on_change(controls, live, hold)
    rows = [captioned(controls[name], text) for name, text in questions.items()]
    rows += [*extra_rows, presets(choices, controls, live, hold)]
    refresh()   # built with bad arguments: raise to the caller
    return Dashboard(title, rows, controls, figures, refresh, readout)

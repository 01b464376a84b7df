"""Memory calculator: how much does BP need, how much does ZO need, and what fits a budget?

All numbers come from ``sazo_lite.course.memory``; this module only draws them.
"""
from __future__ import annotations

import math
from dataclasses import replace

import ipywidgets as widgets
import plotly.graph_objects as go

from .. import memory
from ...validation import check_number
from ._common import LiveFigure, Dashboard, captioned, int_slider, off_log_axes, presets, require_keys, \
    set_controls, shown_on_error, slider

__all__ = ["memory_dashboard", "memory_bars", "fit_summary", "measured_vs_predicted_figure"]

PARTS = ("params", "grads", "optimiser", "activations")
COLOURS = {"params": "#4c72b0", "grads": "#dd8452", "optimiser": "#8172b3", "activations": "#c44e52"}
CONTEXTS = [2 ** k for k in range(7, 18)]  # 128 … 131072
CUSTOM = "custom"


def memory_bars(shape: memory.ModelShape, setup: memory.TrainSetup) -> dict[str, list[float]]:
    """GB per part for the two bars ["BP", "ZO"]: {"params": [bp, zo], "grads": [...], ...}."""
    bp, zo = memory.bp_memory(shape, setup).as_dict(), memory.zo_memory(shape, setup).as_dict()
    return {part: [bp[part] / memory.GB, zo[part] / memory.GB] for part in PARTS}


def fit_summary(shape: memory.ModelShape, setup: memory.TrainSetup, budget_gb: float,
                ladder: list[memory.ModelShape]) -> dict:
    """Ratios and the largest ladder model that fits the budget under BP and under ZO."""
    fits = {m: memory.largest_fitting(ladder, setup, budget_gb, m) for m in ("bp", "zo")}
    return dict(memory_ratio=memory.memory_ratio(shape, setup),
                size_ratio=memory.size_ratio(shape, setup, budget_gb),
                bp_fits=fits["bp"].name if fits["bp"] else "nothing",
                zo_fits=fits["zo"].name if fits["zo"] else "nothing")


def _gb(value: float) -> str:
    """GB to one decimal, and to two significant digits below 1 GB (a 39 MB peak read "0.0 GB")."""
    return f"{value:.1f}" if value >= 0.95 else f"{value:.2g}"


def _readout_html(summary: dict, bp_gb: float, zo_gb: float, budget_gb: float) -> str:
    size = summary["size_ratio"]
    if math.isfinite(size) and size >= 1:
        size_text = f"ZO trains a {size:.1f}× larger model of this width"
    elif size == 0:  # ``memory.size_ratio``: BP fits its embeddings, ZO not even its embeddings and z buffer
        size_text = ("ZO cannot train any model of this width (not even its embeddings and float32 z buffer fit); "
                     "BP can")
    elif math.isfinite(size):  # a tiny budget: ZO's one-off buffers outweigh BP's few layers
        size_text = f"ZO trains a smaller model of this width than BP ({size:.1f}× BP's parameters)"
    elif size == math.inf:  # ``memory.size_ratio``: BP cannot hold even the embeddings, ZO can
        size_text = "BP cannot train any model of this width (not even its embeddings fit); ZO can"
    else:
        size_text = "neither BP nor ZO can train a model of this width (not even its embeddings fit)"
    return (f"<div style='font-size:1.05em'>BP needs <b>{_gb(bp_gb)} GB</b>, ZO needs <b>{_gb(zo_gb)} GB</b>: "
            f"BP/ZO memory ratio <b class='ratio'>{summary['memory_ratio']:.1f}×</b>. "
            f"In {budget_gb:g} GB, {size_text}.<br>"
            f"Largest of the family that fits {budget_gb:g} GB: BP → <b>{summary['bp_fits']}</b>, "
            f"ZO → <b>{summary['zo_fits']}</b>.</div>")


SHAPE_KEYS = ("layers", "hidden", "heads", "kv_heads", "ffn")


def _shape_controls() -> dict[str, widgets.Widget]:
    return {"layers": int_slider("layers L", 24, 1, 96),
            "hidden": int_slider("hidden size D", 2048, 64, 8192, 64),
            "heads": int_slider("heads H", 16, 1, 128),
            "kv_heads": int_slider("KV heads", 2, 1, 128),
            "ffn": int_slider("FFN size D_ff", 11008, 128, 32768, 128)}


def _controls() -> dict[str, widgets.Widget]:
    names = [s.name for ladder in memory.LADDERS.values() for s in ladder]
    controls = {"preset": widgets.Dropdown(options=names + [CUSTOM], value="Qwen2.5-3B", description="model")}
    controls.update(_shape_controls())
    controls.update(
        context=widgets.SelectionSlider(options=CONTEXTS, value=512, description="context n_ctx",
                                        continuous_update=False, layout=dict(width="420px"),
                                        style=dict(description_width="150px")),
        batch=int_slider("batch size B", 2, 1, 64),
        dtype=widgets.ToggleButtons(options=["bfloat16", "float32"], value="bfloat16", description="dtype"),
        budget=slider("budget (GB)", 40.0, 2.0, 160.0, 1.0, readout_format=".0f"),
        checkpointing=widgets.Checkbox(value=False, description="activation checkpointing (BP)"),
        attention=widgets.ToggleButtons(options=["fused", "materialised"], value="fused", description="attention"),
        optimizer=widgets.ToggleButtons(options=["sgd", "adam"], value="sgd", description="BP optimiser"))
    return controls


def _preset(name: str) -> memory.ModelShape | None:
    return next((s for lad in memory.LADDERS.values() for s in lad if s.name == name), None)


def _current(controls, base_name: str) -> tuple[memory.ModelShape, memory.TrainSetup, list[memory.ModelShape]]:
    """The shape, setup and family ladder the controls describe (ValueError if inconsistent).

    A custom shape keeps the vocabulary, tying and biases of ``base_name`` (the last preset).
    """
    c = {k: w.value for k, w in controls.items()}
    base = _preset(c["preset"]) or _preset(base_name) or memory.LADDERS["qwen2.5"][2]
    shape = replace(base, name=c["preset"], layers=c["layers"], hidden=c["hidden"], heads=c["heads"],
                    kv_heads=c["kv_heads"], ffn=c["ffn"])
    ladder = next((lad for lad in memory.LADDERS.values() if base in lad), memory.LADDERS["qwen2.5"])
    setup = memory.TrainSetup(context=c["context"], batch=c["batch"], dtype=c["dtype"],
                              checkpointing=c["checkpointing"], attention=c["attention"],
                              optimizer=c["optimizer"])
    return shape, setup, ladder


_TITLE = "Peak memory of one training step"


def _bar_figure() -> LiveFigure:
    fig = LiveFigure(layout=dict(barmode="stack", height=380, width=560, xaxis_title="method",
                                 yaxis_title="peak memory (GB)",
                                 title=_TITLE, margin=dict(t=50, b=40)))
    for part in PARTS:
        fig.add_bar(x=["BP", "ZO"], y=[0.0, 0.0], name=part, marker_color=COLOURS[part])
    fig.add_hline(y=40.0, line_dash="dash", line_color="black")  # the budget, moved by refresh()
    return fig


CAPTIONS = {
    "preset": "Which real model shape? Pick one, then edit its numbers below (→ custom).",
    "layers": "Double the depth L: do the bars double? Does the ratio move?",
    "hidden": "Weights grow like D², activations like D: which bar wins as D grows?",
    "heads": "H sets the head size D/H. Fused, it changes little: the k/v width KV heads·D/H and one log-sum-exp "
             "per head; materialised, it adds H·n_ctx scores per token. Switch attention to see the difference.",
    "ffn": "The FFN holds most weights and 4·D_ff of the stored activations per token.",
    "kv_heads": "Grouped-query attention: fewer KV heads → smaller k/v matrices. How much does it save?",
    "context": "Double n_ctx: which bar grows, and by how much? When does the ratio pass 10×?",
    "batch": "Does batch size change the BP/ZO ratio, or only the totals?",
    "dtype": "float32 doubles every byte but ZO's z buffer (float32 already: MeZO draws z in float32 for 16-bit "
             "weights). So does the ratio move?",
    "budget": "Shrink the budget: when does BP stop fitting the 1.5B model that ZO still trains?",
    "checkpointing": "Checkpointing keeps only each layer's input. How much of the gap closes?",
    "attention": "Materialised softmax keeps an n_ctx×n_ctx matrix per head: try it at n_ctx = 8192.",
    "optimizer": "Adam adds two moments per parameter: where does that bar appear?",
}


def memory_dashboard() -> Dashboard:
    """BP vs ZO peak memory for a chosen model and setup, and what fits a budget.

    Returns:
        A ``Dashboard`` with controls (preset, layers, hidden, heads, kv_heads, ffn, context,
        batch, dtype, budget, checkpointing, attention, optimizer), one stacked-bar figure
        ("bars") and an HTML readout with the ratio and the largest model that fits.
        Editing a shape slider switches the model to "custom", which keeps the vocabulary and
        family ladder of the last preset.
    """
    controls, fig = _controls(), _bar_figure()
    readout, hold, last_preset = widgets.HTML(), [False], [controls["preset"].value]

    def load_preset(change):
        preset = _preset(change["new"])
        if preset is None:
            return
        last_preset[0] = preset.name
        set_controls(controls, {key: getattr(preset, key) for key in SHAPE_KEYS}, refresh, hold)

    def refresh():
        try:
            shape, setup, ladder = _current(controls, last_preset[0])
        except ValueError as error:
            readout.value = f"<span style='color:#b00'>{error}</span>"
            with fig.batch_update():   # the last valid shape's bars would read as this one's
                for trace in fig.data:
                    trace.y = [None, None]
                fig.layout.title.text = "No bars: the shape is not a valid model (the message above says why)"
            return
        bars, budget = memory_bars(shape, setup), controls["budget"].value
        summary = fit_summary(shape, setup, budget, ladder)
        with fig.batch_update():
            for trace, part in zip(fig.data, PARTS):
                trace.y = bars[part]
            fig.layout.shapes[0].y0 = fig.layout.shapes[0].y1 = budget
            fig.layout.title.text = _TITLE
        totals = [sum(bars[p][i] for p in PARTS) for i in (0, 1)]
        readout.value = _readout_html(summary, totals[0], totals[1], budget)

    def on_shape_edit(_change):
        if hold[0]:
            return
        preset = controls["preset"]
        if preset.value != CUSTOM and _differs_from_preset(controls):
            hold[0] = True
            preset.value = CUSTOM
            hold[0] = False
        refresh()

    controls["preset"].observe(shown_on_error(load_preset, readout), names="value")
    for key, widget in controls.items():
        if key != "preset":
            widget.observe(shown_on_error(on_shape_edit if key in SHAPE_KEYS else (lambda _c: hold[0] or refresh()),
                                          readout), names="value")
    load_preset({"new": controls["preset"].value})
    choices = {"short chat (n_ctx = 512)": dict(context=512, batch=8, checkpointing=False),
               "long document (n_ctx = 32k)": dict(context=32768, batch=2, checkpointing=False),
               "32k + checkpointing": dict(context=32768, batch=2, checkpointing=True),
               "17 GB device": dict(budget=17.0, context=256, batch=8, checkpointing=False)}  # notebook 07: BoolQ-like
    rows = [presets(choices, controls, shown_on_error(refresh, readout), hold,
                    keep=("preset", *SHAPE_KEYS))]  # a preset keeps the model
    rows += [captioned(w, CAPTIONS[k]) if k in CAPTIONS else w for k, w in controls.items()]
    return Dashboard("Memory: backprop vs zeroth-order", rows, controls, {"bars": fig}, refresh, readout)


def _differs_from_preset(controls) -> bool:
    preset = _preset(controls["preset"].value)
    return preset is not None and any(controls[k].value != getattr(preset, k)
                                      for k in SHAPE_KEYS)


_ROW_KEYS = ("mode", "attention", "context", "predicted", "measured", "relative_error")


def measured_vs_predicted_figure(rows: list[dict]) -> go.Figure:
    """Scatter of measured vs predicted extra memory (MB), one marker per (mode, attention).

    ``rows``: ``memory_measure.validate``'s, each with mode, attention, context, predicted and measured bytes
    (finite, >= 0) and relative_error.
    """
    if not isinstance(rows, (list, tuple)) or not rows:
        raise ValueError(f"Invalid rows: expected a non-empty list of measurements "
                         f"(memory_measure.validate's), got {rows!r}")
    for k, row in enumerate(rows):
        require_keys(f"rows[{k}]", row, _ROW_KEYS)
        for key in ("predicted", "measured"):
            check_number(f"rows[{k}][{key!r}]", row[key], 0.0)   # bytes
    fig = go.Figure(layout=dict(height=420, width=560, xaxis_title="predicted (MB)",
                                yaxis_title="measured (MB)", xaxis_type="log", yaxis_type="log",
                                title="Memory model vs measurement (peak above the weights)"))
    groups = sorted({(r["mode"], r["attention"]) for r in rows})
    for mode, attention in groups:
        pts = [r for r in rows if (r["mode"], r["attention"]) == (mode, attention)]
        fig.add_scatter(x=[r["predicted"] / 1e6 for r in pts], y=[r["measured"] / 1e6 for r in pts],
                        mode="markers", name=f"{mode}, {attention}",
                        text=[f"n_ctx={r['context']}, error {100 * r['relative_error']:+.0f}%" for r in pts])
    # the log axes cannot show 0: the reference lines span the positive values (from 0 they drew nothing) and the
    # title counts the points left off
    positive = [v / 1e6 for r in rows for v in (r["predicted"], r["measured"]) if v > 0]
    low, high = (min(positive) / 1.5, max(positive) * 1.5) if positive else (0.1, 10.0)
    fig.layout.title.text += off_log_axes([r["predicted"] for r in rows], [r["measured"] for r in rows])
    fig.add_scatter(x=[low, high], y=[low, high], mode="lines", name="measured = predicted",
                    line=dict(dash="dot", color="grey"))
    fig.add_scatter(x=[low, high], y=[1.25 * low, 1.25 * high], mode="lines", name="±25%",
                    line=dict(dash="dash", color="lightgrey"))
    fig.add_scatter(x=[low, high], y=[0.75 * low, 0.75 * high], mode="lines", showlegend=False,
                    line=dict(dash="dash", color="lightgrey"))
    return fig

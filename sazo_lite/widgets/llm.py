"""Notebook 06's live dashboard: MeZO vs SAZO fine-tuning a causal LM on a generated task.

Press "Run MeZO and SAZO": both runs start from the same weights, and the figures update
live at every log point: full training loss and held-out accuracy against queries, SAZO's
sampling distribution over the training examples (flipped labels in red), and a table of
the examples SAZO drew most, as text with their labels. ε, EMA decay β and batch size B are
read when a run starts. The training itself lives in ``sazo_lite.llm.finetune``.
"""
from __future__ import annotations

import html

import ipywidgets as widgets
import plotly.graph_objects as go
import torch

from ..config import pick
from ._common import Dashboard, captioned, int_slider, log_slider, presets, slider

__all__ = ["llm_dashboard", "top_sampled_rows", "accuracy_summary_html", "default_llm_setup", "accuracy_bars",
           "peak_memory_bars", "flipped_in_top"]

_COLORS = {"mezo": "steelblue", "sazo": "darkorange"}
_NAMES = {"mezo": "MeZO (uniform)", "sazo": "SAZO"}


def top_sampled_rows(task, counts: torch.Tensor, probs: torch.Tensor, k: int = 10) -> dict[str, list]:
    """Columns of the "most sampled" table: the k training examples SAZO drew most often.

    Example:
        >>> from sazo_lite.llm import make_task
        >>> task = make_task("numbers", num_train=4, num_test=1, noise=0.25, seed=0)
        >>> rows = top_sampled_rows(task, torch.tensor([1., 5., 0., 2.]), torch.full((4,), .25), k=2)
        >>> rows["index"]
        [1, 3]
    """
    if len(counts) != len(task.train) or len(probs) != len(task.train):
        raise ValueError(f"Invalid counts: expected {len(task.train)} entries (one per training example)")
    order = torch.argsort(torch.as_tensor(counts, dtype=torch.float64), descending=True, stable=True)[:k].tolist()
    names = task.label_names or [w.strip() for w in task.label_words]
    examples = [task.train[i] for i in order]
    return {"index": order, "draws": [int(counts[i]) for i in order],
            "p_i × N": [round(float(probs[i]) * len(task.train), 2) for i in order],
            "label (train)": [names[e.label] for e in examples],
            "flipped?": ["FLIPPED" if e.noisy else "" for e in examples],
            "kind": [e.kind for e in examples],
            "text": [e.prompt.replace("\n", " ⏎ ") for e in examples]}


def accuracy_summary_html(zero_shot: float, tuned: dict[str, float], queries: int) -> str:
    """One line: zero-shot vs tuned held-out accuracy after the same number of queries."""
    parts = [f"zero-shot <b>{zero_shot:.1%}</b>"]
    parts += [f"{_NAMES[m]} <b>{acc:.1%}</b>" for m, acc in tuned.items()]
    return f"Held-out accuracy after {queries} queries: " + " · ".join(parts)


def flipped_in_top(task, counts: torch.Tensor, k: int) -> int:
    """How many of the k most drawn training examples carry a flipped label."""
    return sum(task.train[i].noisy for i in top_sampled_rows(task, counts, counts, k)["index"])


def accuracy_bars(zero_shot: float, tuned: dict[str, float]) -> go.Figure:
    """Held-out accuracy bars: zero-shot, then each tuned method.

    Example:
        >>> [round(v, 2) for v in accuracy_bars(0.5, {"mezo": 0.6, "sazo": 0.7}).data[0].y]
        [0.5, 0.6, 0.7]
    """
    names = ["zero-shot"] + [_NAMES[m] for m in tuned]
    values = [zero_shot] + list(tuned.values())
    colors = ["gray"] + [_COLORS[m] for m in tuned]
    fig = go.Figure(go.Bar(x=names, y=values, marker_color=colors, text=[f"{v:.1%}" for v in values],
                           textposition="outside"))
    fig.update_layout(width=460, height=340, yaxis=dict(title="held-out accuracy", range=[0, 1.1]),
                      margin=dict(l=50, r=10, t=30, b=40), title="before and after tuning")
    return fig


def peak_memory_bars(measurements: dict[str, dict]) -> go.Figure:
    """Peak RSS bars from ``sazo_lite.llm.memory_probe.measure_all`` (reuses ``mezo.memory_figure``).

    Example:
        >>> fig = peak_memory_bars({"inference": {"peak_rss": 2**30}, "bp": {"peak_rss": 2**31}})
        >>> [round(v) for v in fig.data[0].y]
        [1024, 2048]
    """
    from .mezo import memory_figure

    labels = {"inference": "inference", "zo": "ZO step (MeZO/SAZO)", "bp": "backprop SGD step"}
    fig = memory_figure({labels.get(k, k): v["peak_rss"] for k, v in measurements.items()})
    fig.update_layout(title="peak resident memory of the whole process (weights included)")
    return fig


def default_llm_setup():
    """A tiny random-init Llama + the offline MiniLM tokenizer + a noisy sentiment task (tests, demos)."""
    from transformers import AutoTokenizer

    from ..llm import make_task, minilm_dir, tiny_causal_lm

    tokenizer = AutoTokenizer.from_pretrained(minilm_dir())
    model = tiny_causal_lm("llama", vocab_size=tokenizer.vocab_size)
    task = make_task("sentiment", num_train=24, num_test=16, noise=0.15, seed=0)
    blocks = [p for n, p in model.named_parameters() if "layers." in n]  # not the 1M-entry embeddings
    return model, tokenizer, task, blocks


def _line_figure(title: str, y_title: str) -> go.FigureWidget:
    fig = go.FigureWidget(layout=dict(width=470, height=320, title=title, xaxis_title="queries (2·B per step)",
                                      yaxis_title=y_title, margin=dict(l=55, r=10, t=40, b=45),
                                      legend=dict(orientation="h", y=-0.3)))
    for method in ("mezo", "sazo"):
        fig.add_scatter(x=[], y=[], mode="lines+markers", name=_NAMES[method], line=dict(color=_COLORS[method]))
    return fig


def _sampling_figure(task) -> go.FigureWidget:
    colors = ["crimson" if e.noisy else "lightgray" for e in task.train]
    n = len(task.train)
    fig = go.FigureWidget(layout=dict(width=470, height=320, title="SAZO's p_i × N (red: flipped label)",
                                      xaxis_title="training example i", yaxis_title="p_i × N  (uniform = 1)",
                                      margin=dict(l=55, r=10, t=40, b=45), showlegend=False))
    fig.add_bar(x=list(range(n)), y=[1.0] * n, marker_color=colors)
    fig.add_scatter(x=[-0.5, n - 0.5], y=[1, 1], mode="lines", line=dict(dash="dot", color="black"))
    return fig


def _table_figure(k: int) -> go.FigureWidget:
    columns = ["index", "draws", "p_i × N", "label (train)", "flipped?", "kind", "text"]
    fig = go.FigureWidget(layout=dict(width=960, height=80 + 28 * k, margin=dict(l=5, r=5, t=35, b=5),
                                      title="Examples SAZO drew most (draws counted over the SAZO run)"))
    fig.add_table(header=dict(values=columns), cells=dict(values=[[] for _ in columns]),
                  columnwidth=[40, 45, 55, 70, 60, 90, 480])
    return fig


def _controls() -> dict[str, widgets.Widget]:
    return {"eps": log_slider("ε", 1e-3, -4, -1), "ema_decay": slider("EMA decay β", 0.9, 0.0, 0.99, 0.01),
            "batch_size": int_slider("batch size B", 8, 2, 32)}


def _draw_run(figures, task, run, k: int) -> None:
    """Put one run's curves (and, for SAZO, its distribution and table) into the figures."""
    index = 0 if run.method == "mezo" else 1
    with figures["loss"].batch_update():
        figures["loss"].data[index].x, figures["loss"].data[index].y = run.queries, run.train_loss
    with figures["accuracy"].batch_update():
        figures["accuracy"].data[index].x, figures["accuracy"].data[index].y = run.queries, run.test_accuracy
    if run.method == "sazo":
        with figures["sampling"].batch_update():
            figures["sampling"].data[0].y = (run.probs * len(task.train)).tolist()
        rows = top_sampled_rows(task, run.sample_counts, run.probs, k)
        with figures["table"].batch_update():
            figures["table"].data[0].cells.values = list(rows.values())


def llm_dashboard(model=None, tokenizer=None, task=None, params=None, *, steps: int | None = None,
                  lr: float = 1e-3, log_every: int | None = None, top_k: int = 8, seed: int = 0,
                  run_now: bool = True) -> Dashboard:
    """MeZO vs SAZO on a prompt-classification task, live.

    Args:
        model, tokenizer, task, params: the causal LM (eval mode), its tokenizer, a
            ``ClassificationTask`` and the tensors to perturb (e.g. LoRA adapters). All None:
            ``default_llm_setup()`` (tiny random Llama, runs in seconds).
        steps, lr, log_every: per run; ``steps`` defaults to pick(60, 12).
        top_k: rows of the "most sampled" table.
        run_now: train once while building (else wait for the button).

    Returns:
        A ``Dashboard`` with controls eps / ema_decay / batch_size / run, figures loss /
        accuracy / sampling / table, and ``results`` (method → FinetuneRun, zero_shot).
    """
    from ..llm import accuracy, restore_snapshot, snapshot, zo_finetune

    if model is None:
        model, tokenizer, task, params = default_llm_setup()
    if any(x is None for x in (tokenizer, task, params)):
        raise ValueError("Invalid arguments: pass model, tokenizer, task and params together (or none)")
    steps = steps if steps is not None else pick(60, 12)
    log_every = log_every or max(1, steps // 6)
    params = list(params)
    start = snapshot(params)
    train_batch, test_batch = task.encode(tokenizer, "train"), task.encode(tokenizer, "test")
    zero_shot = accuracy(model, test_batch)
    controls = _controls()
    controls["run"] = widgets.Button(description="Run MeZO and SAZO", button_style="primary")
    figures = {"loss": _line_figure("training loss F(θ) (all N examples)", "mean loss"),
               "accuracy": _line_figure("held-out accuracy", "accuracy"),
               "sampling": _sampling_figure(task), "table": _table_figure(top_k)}
    figures["accuracy"].add_scatter(x=[0], y=[zero_shot], mode="markers", name="zero-shot",
                                    marker=dict(color="black", symbol="star", size=12))
    readout = widgets.HTML(accuracy_summary_html(zero_shot, {}, 0))
    results: dict = {"zero_shot": zero_shot}
    hold = [False]

    def refresh() -> None:
        tuned = {}
        for method in ("mezo", "sazo"):
            restore_snapshot(params, start)  # both methods start from the same weights
            run = zo_finetune(model, params, train_batch, test_batch, method=method, steps=steps,
                              batch_size=controls["batch_size"].value, lr=lr, eps=controls["eps"].value,
                              ema_decay=controls["ema_decay"].value, seed=seed, log_every=log_every,
                              on_log=lambda r: _draw_run(figures, task, r, top_k), progress=False)
            results[method], tuned[method] = run, run.test_accuracy[-1]
        restore_snapshot(params, start)
        readout.value = accuracy_summary_html(zero_shot, tuned, results["sazo"].queries[-1])

    controls["run"].on_click(lambda _button: refresh())
    rows = [captioned(controls["eps"], "Too small an ε drowns L+ − L− in rounding; too large blurs the "
                                       "gradient. Where do both curves stop improving?"),
            captioned(controls["ema_decay"], "β near 1 averages d² over many visits. Do the red (flipped) "
                                             "examples still rise to the top of the table with β = 0?"),
            captioned(controls["batch_size"], "A larger B costs more queries per step. Does SAZO's lead "
                                              "over MeZO (per query) grow or shrink?"),
            presets({"defaults": dict(eps=1e-3, ema_decay=0.9, batch_size=8),
                     "no memory (β=0)": dict(ema_decay=0.0),
                     "big batch (B=32)": dict(batch_size=32)}, controls, lambda: None, hold),
            widgets.HBox([controls["run"], widgets.HTML("&nbsp;<i>presets and sliders are read when you press Run</i>")])]
    dashboard = Dashboard("MeZO vs SAZO on a language model", rows, controls, figures, refresh, readout)
    dashboard.results = results
    if run_now:
        refresh()
    return dashboard

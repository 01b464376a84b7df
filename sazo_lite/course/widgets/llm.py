"""Figures for language-model runs (notebook 06's records and ``benchmarks/llm_*``).

Plain functions of recorded data (``sazo_lite.llm.queries.QueryRun`` dicts): loss bands, the
queries-to-target table, the walk ‖θ − θ₀‖, staleness, the detectors.
"""
from __future__ import annotations

import html
import math
import statistics

import numpy as np
import plotly.graph_objects as go
import torch

from ...validation import check_int
from ._common import SAMPLER_COLORS, number_list, off_log_axes, require_keys, same_lengths

__all__ = ["peak_memory_bars", "run_summary", "best_cells", "fewest_queries", "loss_bands", "runs_by_rate",
           "queries_table_html", "scores_vs_norms", "diagnostics_figure", "probs_vs_oracle", "detector_precision",
           "detector_bars", "walk_figure", "staleness_figure", "gain_vs_batch_figure", "WALK_BAND"]

WALK_BAND = (14.0, 20.0)   # ‖θ−θ₀‖ where the measured SmolLM2 runs failed (docs/llm.md, 2026-12-01 diagnosis)

_SAMPLER_COLORS = SAMPLER_COLORS   # the course's one palette
_DASHES = ("solid", "dash", "dot", "dashdot", "longdash")


def _color(name: str) -> str:
    """The palette's colour of a run label's sampler ("sazo+rule η=5e-4" → SAZO's)."""
    return _SAMPLER_COLORS.get(name.split(" ")[0].split("+")[0], "gray")


def peak_memory_bars(measurements: dict[str, dict]) -> go.Figure:
    """Peak RSS bars from ``sazo_lite.course.memory_probe.measure_all`` (reuses ``mezo.memory_figure``).

    Example:
        >>> fig = peak_memory_bars({"inference": {"peak_rss": 2**30}, "bp": {"peak_rss": 2**31}})
        >>> [round(v) for v in fig.data[0].y]
        [1024, 2048]
    """
    from .mezo import memory_figure

    labels = {"inference": "inference", "zo": "ZO step (MeZO/SAZO)", "bp": "backprop SGD step"}
    for name, measured in measurements.items():
        require_keys(f"measurements[{name!r}]", measured, ("peak_rss",))
    fig = memory_figure({labels.get(k, k): v["peak_rss"] for k, v in measurements.items()})
    fig.update_layout(title="peak resident memory of the whole process (weights included)")
    return fig


# -- figures of recorded language-model runs: plain functions of recorded data (``sazo_lite.llm.queries.QueryRun`` dicts) --------
def _as_dict(run) -> dict:
    """A run as a dict of plain values: a ``QueryRun``'s ``to_dict()``, and a record's numpy arrays or tensors as
    lists (the checks test a series by its truth value, which an array of several numbers refuses to have)."""
    run = run if isinstance(run, dict) else run.to_dict()
    return {key: value.tolist() if isinstance(value, (np.ndarray, np.generic, torch.Tensor)) else value
            for key, value in run.items()}


def _nothing_drawn(name: str, fig: go.Figure, what: str) -> go.Figure:
    """``fig``, or a ValueError when no trace of it has data (an empty plot reads as a result)."""
    if not any(trace.y is not None and len(trace.y) for trace in fig.data):
        raise ValueError(f"Invalid {name}: no run has {what} to draw")
    return fig


def _check_runs(name: str, runs_by_key: dict, key: str) -> None:
    """Refuse an empty ``key`` → runs mapping, a key with no runs (an empty plot, table or choice), or a key holding
    one seed twice (the same run twice, e.g. a report part given twice: every median over its seeds counted it
    twice; runs without a seed are not checked)."""
    if not isinstance(runs_by_key, dict) or not runs_by_key or not all(runs_by_key.values()):
        shown = {k: len(v) for k, v in runs_by_key.items()} if isinstance(runs_by_key, dict) else runs_by_key
        raise ValueError(f"Invalid {name}: expected {key} -> a non-empty list of runs, got {shown!r}")
    for label, runs in runs_by_key.items():
        seeds = [seed for seed in (r.get("seed") if isinstance(r, dict) else getattr(r, "seed", None) for r in runs)
                 if seed is not None]
        if len(set(seeds)) < len(seeds):
            raise ValueError(f"Invalid {name}: {label!r} holds seeds {sorted(seeds)} (expected one run per seed: "
                             "a run or a report part given twice?)")


def loss_bands(runs_by_sampler: dict, *, targets=(0.7, 0.5)) -> go.Figure:
    """Training loss F(θ)/F(θ₀) against queries: median line and min–max band over seeds, per sampler.

    A seed stopped as diverged (its ``diverged`` flag) counts as above every other after its stop, as in notebook
    06's race figure: where most seeds diverged the median is off the plot (a gap), not the survivors' median. A
    seed that ended at or below the lowest target (a race's runs stop at their deepest target) holds its last
    value after its end; one that ran out of budget above it is left out after its end.

    Args:
        runs_by_sampler: sampler name → list of runs (``QueryRun`` or its dict), one per seed.
        targets: fractions of F(θ₀) drawn as dotted lines.

    Example:
        >>> runs = {"uniform": [{"queries": [0, 2, 4], "train_loss": [1.0, 0.8, 0.6]},
        ...                     {"queries": [0, 2], "train_loss": [1.0, 0.7]}]}
        >>> [round(v, 2) for v in loss_bands(runs).data[-1].y]
        [1.0, 0.75, 0.6]
    """
    from .llm_lesson import _bands   # (here: llm_lesson reads notebook 06's lesson, which this module need not)

    _check_runs("runs_by_sampler", runs_by_sampler, "sampler")
    targets = tuple(targets)   # read twice: the stop rule, then the lines
    fig, shown = go.Figure(), []
    for sampler, runs in runs_by_sampler.items():
        runs = [_as_dict(r) for r in runs]
        for run in runs:   # each curve is drawn relative to its F(θ₀)
            require_keys(f"runs of {sampler!r}", run, ("queries", "train_loss"))
            same_lengths(queries=run["queries"], train_loss=run["train_loss"])
            if not run["train_loss"] or not run["train_loss"][0] > 0:
                raise ValueError(f"Invalid runs of {sampler!r}: train_loss {run['train_loss'][:1]} (expected a "
                                 "logged F(θ₀) > 0: the curves are F(θ)/F(θ₀))")
        color = _color(sampler)
        dash = _DASHES[shown.count(color) % len(_DASHES)]   # several rates of one sampler: one colour, dashes
        shown.append(color)
        # a seed stopped as diverged counts as above everything after its stop (not left out: the median of the
        # seeds still running read 0.3 where two of three had diverged); one that ran out of budget is left out
        grid, median, low, high = _bands(runs, min(targets, default=None))
        top = max([v for v in high if math.isfinite(v)] + [1.0])   # the band of a diverged seed: to the plot's top
        fig.add_scatter(x=grid + grid[::-1], y=[min(v, top) for v in high] + [min(v, top) for v in low][::-1],
                        fill="toself", line=dict(width=0), opacity=0.2, fillcolor=color, showlegend=False,
                        hoverinfo="skip", name=f"{sampler} band")
        seeds = f"median, {len(runs)} seeds" if len(runs) > 1 else "1 seed"
        fig.add_scatter(x=grid, y=[v if math.isfinite(v) else None for v in median], mode="lines",
                        line=dict(color=color, dash=dash), name=f"{sampler} ({seeds})")
    for t in targets:
        fig.add_hline(y=t, line=dict(dash="dot", color="gray"), annotation_text=f"{t:.0%} of F(θ₀)")
    fig.update_layout(width=640, height=380, xaxis_title="queries (2·B per step)", yaxis_title="F(θ) / F(θ₀)",
                      title="training loss: median and min–max over seeds", margin=dict(l=55, r=10, t=40, b=45))
    return fig


def runs_by_rate(settings: list[dict]) -> dict[str, list[dict]]:
    """Every grid run of one set, pooled over report parts: "variant η=rate" → its runs (seeds).

    Args:
        settings: the set's entries from one or more benchmark reports (``benchmarks.llm_queries``),
            e.g. the parts of a run split between processes.

    Example:
        >>> part = {"grid": {"uniform": {"0.001": [{"seed": 0}], "0.002": [{"seed": 0}, {"seed": 1}]}}}
        >>> {k: len(v) for k, v in runs_by_rate([part]).items()}
        {'uniform η=0.001': 1, 'uniform η=0.002': 2}
    """
    out: dict[str, list[dict]] = {}
    for setting in settings:
        for variant, grid in setting.get("grid", {}).items():
            for rate, cell in grid.items():
                out.setdefault(f"{variant} η={rate}", []).extend(cell if isinstance(cell, list) else [cell])
    _check_runs("settings", out, "grid cell")      # no part, no grid or an empty cell, a part given twice
    return out


def run_summary(label: str, run, *, targets=(0.7, 0.5)) -> str:
    """One run in a line: queries to each target, F/F₀ at the end, the walk ‖θ−θ₀‖ at the end, E[ĝ²], max |ĝ|.

    Example:
        >>> run_summary("uniform η=1e-3", {"queries": [0, 4, 8], "train_loss": [1.0, 0.6, 0.4], "walk": [0, 1, 2],
        ...                                "diverged": False, "mean_sq_step_scale": 2.0, "max_step_scale": 3.0})
        'uniform η=1e-3  0.7·F₀ at 4, 0.5·F₀ at 8; F/F₀ 0.400 after 8 queries; walk 2.0; E[ĝ²] 2; max |ĝ| 3'
    """
    from ...llm.queries import queries_to

    targets = number_list("targets", targets)       # none: a line without its queries to target
    run = _as_dict(run)
    require_keys("run", run, ("queries", "train_loss", "walk"))
    if not (run["queries"] and run["train_loss"] and run["walk"]) or not run["train_loss"][0] > 0:
        raise ValueError(f"Invalid run: needs logged queries, walk and train_loss with F₀ > 0 (F/F₀ is reported), "
                         f"got train_loss {run['train_loss'][:1]}")
    # (q is 0 where F₀ itself is at the target: reached, at 0 queries)
    reached = ", ".join(f"{t:g}·F₀ {'not reached' if (q := queries_to(run, t)) is None else f'at {q}'}" for t in targets)
    loss, g = run["train_loss"], lambda key: "–" if run.get(key) is None else f"{run[key]:.3g}"  # None: no step
    return (f"{label}  {reached}; F/F₀ {loss[-1] / loss[0]:.3f} after {run['queries'][-1]} queries"
            f"{' (DIVERGED)' if run.get('diverged') else ''}; walk {run['walk'][-1]:.1f}; "
            f"E[ĝ²] {g('mean_sq_step_scale')}; max |ĝ| {g('max_step_scale')}")


def best_cells(runs_by_label: dict, target: float) -> dict[str, str]:
    """Per sampler (a label's first word, as ``runs_by_rate`` writes it), the label of its best rate by
    the one grid rule (``train.best_rate``: misses count as never; ties go to the earlier label).

    Example:
        >>> best_cells({"uniform η=1e-3": [{"queries": [0, 8], "train_loss": [1.0, 0.4]}],
        ...             "uniform η=2e-3": [{"queries": [0, 4], "train_loss": [1.0, 0.3]}],
        ...             "sazo η=1e-3": [{"queries": [0, 8], "train_loss": [1.0, 0.9]}]}, 0.5)
        {'uniform': 'uniform η=2e-3', 'sazo': 'sazo η=1e-3'}
    """
    from ...llm.queries import queries_to
    from ...train import best_rate

    _check_runs("runs_by_label", runs_by_label, "label")
    by_sampler: dict[str, dict[str, list]] = {}
    for label, runs in runs_by_label.items():
        by_sampler.setdefault(label.split(" ")[0], {})[label] = [queries_to(_as_dict(r), target) for r in runs]
    return {sampler: best_rate(per_rate) for sampler, per_rate in by_sampler.items()}


def fewest_queries(runs_by_label: dict, target: float) -> dict[str, float]:
    """Per sampler, the median queries to ``target``·F₀ at its best rate (``best_cells``); samplers
    that never reached it are left out.

    Example:
        >>> fewest_queries({"uniform η=1e-3": [{"queries": [0, 8], "train_loss": [1.0, 0.4]}],
        ...                 "uniform η=2e-3": [{"queries": [0, 4], "train_loss": [1.0, 0.3]}],
        ...                 "sazo η=1e-3": [{"queries": [0, 8], "train_loss": [1.0, 0.9]}]}, 0.5)
        {'uniform': 4}
    """
    from ...llm.queries import queries_to
    from ...train import median_queries

    best = {sampler: median_queries([queries_to(_as_dict(r), target) for r in runs_by_label[label]])
            for sampler, label in best_cells(runs_by_label, target).items()}
    return {sampler: q for sampler, q in best.items() if q < float("inf")}


def queries_table_html(runs_by_sampler: dict, *, targets=(0.7, 0.5)) -> str:
    """HTML table: queries to each target, median [min–max] over seeds, and held-out accuracy.

    Example:
        >>> html_ = queries_table_html({"sazo": [{"queries": [0, 4], "train_loss": [1.0, 0.4],
        ...                                       "test_accuracy": 0.75, "diverged": False}]})
        >>> "4 [4–4]" in html_ and "0.750" in html_
        True
    """
    from ...llm.queries import held_out_accuracies, queries_to
    from ...train import median_queries

    _check_runs("runs_by_sampler", runs_by_sampler, "sampler")   # no sampler or no runs: a table of nothing
    targets = number_list("targets", targets)
    head = "".join(f"<th>queries to {t:.0%} of F(θ₀)</th>" for t in targets)
    rows = []
    for sampler, runs in runs_by_sampler.items():
        runs = [_as_dict(r) for r in runs]
        cells = []
        for t in targets:
            values = [queries_to(r, t) for r in runs]
            hit = sorted(v for v in values if v is not None)
            middle = median_queries(values)      # a seed that missed counts as never
            text = (f"{middle:.0f} [{hit[0]}–{hit[-1] if len(hit) == len(values) else '?'}]" if hit and middle < float("inf")
                    else "not reached")
            if hit and len(hit) < len(values):
                text += f" ({len(values) - len(hit)} of {len(values)} missed)"
            cells.append(f"<td>{text}</td>")
        accs = held_out_accuracies(runs)
        acc = f"{statistics.median(accs):.3f}" if accs else "–"
        diverged = sum(bool(r.get("diverged")) for r in runs)
        rows.append(f"<tr><td>{html.escape(sampler)}</td>{''.join(cells)}<td>{acc}</td>"
                    f"<td>{len(runs)}{f' ({diverged} diverged)' if diverged else ''}</td></tr>")
    budgets = sorted({r["budget_queries"] for runs in runs_by_sampler.values() for r in map(_as_dict, runs)
                      if r.get("budget_queries")})
    when = f", after {budgets[-1]} queries" if budgets else ""
    return (f"<table><tr><th>sampler</th>{head}<th>held-out accuracy (median{when})</th><th>seeds</th></tr>"
            + "".join(rows) + "</table>")


def scores_vs_norms(scores, norms, kinds=None) -> go.Figure:
    """Scatter of SAZO's scores against the true per-example norms (log axes), coloured by kind.

    Example:
        >>> len(scores_vs_norms([1.0, 2.0], [0.5, 3.0], ["a", "b"]).data)
        2
    """
    scores, norms = number_list("scores", scores), number_list("norms", norms)   # finite, >= 0: log axes
    kinds = list(kinds) if kinds is not None else ["example"] * len(scores)
    same_lengths(scores=scores, norms=norms, kinds=kinds)
    fig = go.Figure()
    for kind in sorted(set(kinds)):
        idx = [i for i, k in enumerate(kinds) if k == kind]
        fig.add_scatter(x=[norms[i] for i in idx], y=[scores[i] for i in idx], mode="markers", name=kind,
                        text=[f"example {i}" for i in idx])
    fig.update_layout(width=520, height=380, xaxis=dict(title="true ‖∇f_i‖ (backprop)", type="log"),
                      yaxis=dict(title="SAZO score Ĝ_i", type="log"),
                      title="SAZO's scores against the true norms" + off_log_axes(norms, scores),
                      margin=dict(l=55, r=10, t=40, b=45))
    return fig


def diagnostics_figure(diagnostics: list[dict]) -> go.Figure:
    """ρ(scores, norms), TV(p_SAZO, p*) and V ratios over training (from ``QueryRun.diagnostics``).

    Example:
        >>> d = [{"queries": 0, "rho": 0.0, "tv": 0.5, "v_ratio": 4.0, "v_uniform_ratio": 4.0}]
        >>> [t.name for t in diagnostics_figure(d).data]
        ['Spearman ρ(score, ‖∇f‖)', 'TV(p_SAZO, p*)', 'V(p_SAZO)/V(p*)', 'V(u)/V(p*)']
    """
    from plotly.subplots import make_subplots

    if not diagnostics:
        raise ValueError("Invalid diagnostics: empty (expected QueryRun.diagnostics records)")
    for k, record in enumerate(diagnostics):
        require_keys(f"diagnostics[{k}]", record, ("queries", "tv", "v_ratio", "v_uniform_ratio"))
    q = [d["queries"] for d in diagnostics]
    fig = make_subplots(rows=1, cols=2, subplot_titles=("how well SAZO ranks and samples", "sampling variance vs the oracle"))
    fig.add_scatter(x=q, y=[d.get("rho") for d in diagnostics], name="Spearman ρ(score, ‖∇f‖)", row=1, col=1)
    fig.add_scatter(x=q, y=[d["tv"] for d in diagnostics], name="TV(p_SAZO, p*)", row=1, col=1)
    fig.add_scatter(x=q, y=[d["v_ratio"] for d in diagnostics], name="V(p_SAZO)/V(p*)", row=1, col=2,
                    line=dict(color=_SAMPLER_COLORS["sazo"]))
    fig.add_scatter(x=q, y=[d["v_uniform_ratio"] for d in diagnostics], name="V(u)/V(p*)", row=1, col=2,
                    line=dict(color=_SAMPLER_COLORS["uniform"]))
    fig.update_xaxes(title_text="queries")
    fig.update_yaxes(range=[-1, 1.05], row=1, col=1)
    fig.update_yaxes(title_text="ratio (1 = oracle)", type="log", row=1, col=2)
    fig.update_layout(width=900, height=360, margin=dict(l=55, r=10, t=40, b=45))
    return fig


def probs_vs_oracle(p_sazo, p_star, kinds=None) -> go.Figure:
    """Bars of N·p_SAZO and N·p* per training example (uniform = 1), kinds on hover.

    Example:
        >>> [round(v, 1) for v in probs_vs_oracle([0.5, 0.5], [0.9, 0.1]).data[1].y]
        [1.8, 0.2]
    """
    p_sazo, p_star = number_list("p_sazo", p_sazo, high=1.0), number_list("p_star", p_star, high=1.0)
    for name, probs in (("p_sazo", p_sazo), ("p_star", p_star)):
        if abs(sum(probs) - 1.0) > 1e-4:   # N·p_i reads against uniform = 1 only for a distribution (float32 sums: 1e-4)
            raise ValueError(f"Invalid {name}: sums to {sum(probs):.6g} (expected probabilities summing to 1; "
                             "normalise scores first)")
    n = len(p_sazo)
    kinds = list(kinds) if kinds is not None else [""] * n
    same_lengths(p_sazo=p_sazo, p_star=p_star, kinds=kinds)
    fig = go.Figure()
    fig.add_bar(x=list(range(n)), y=[float(v) * n for v in p_sazo], name="SAZO", marker_color=_SAMPLER_COLORS["sazo"],
                hovertext=kinds)
    fig.add_bar(x=list(range(n)), y=[float(v) * n for v in p_star], name="oracle p*", marker_color=_SAMPLER_COLORS["oracle"],
                hovertext=kinds)
    fig.add_hline(y=1, line=dict(dash="dot", color="black"), annotation_text="uniform")
    fig.update_layout(width=760, height=340, barmode="group", xaxis_title="training example i",
                      yaxis_title="N · p_i", title="where SAZO and the oracle put their draws",
                      margin=dict(l=55, r=10, t=40, b=45))
    return fig


def detector_precision(ranking_scores, flagged, k: int) -> float:
    """Share of the k highest-scored examples that are in ``flagged`` (e.g. flipped labels).

    Examples tied with the k-th highest score share the places left at that score: each counts its share of
    them (the precision expected when ties are broken at random), so the result does not depend on the examples'
    order.

    Example:
        >>> detector_precision([0.1, 5.0, 3.0, 0.2], flagged=[1, 3], k=2)
        0.5
    """
    scores = torch.as_tensor(ranking_scores, dtype=torch.float64)
    check_int("k", k, 1, max(1, len(scores)))   # precision@k of k ≤ N examples (k = 0 would divide by 0)
    if len(scores) == 0:
        raise ValueError("Invalid ranking_scores: empty (expected one score per example)")
    if not bool(torch.isfinite(scores).all()):
        raise ValueError("Invalid ranking_scores: inf or NaN (expected finite scores: NaN would rank anywhere)")
    if isinstance(flagged, (str, bytes)):   # "13" read as the examples {1, 3}
        raise ValueError(f"Invalid flagged: {flagged!r} (expected a sequence of example indices)")
    flagged = set(check_int("flagged", i.item() if isinstance(i, torch.Tensor) else i) for i in flagged)   # 1.5 read as 1
    if any(not 0 <= i < len(scores) for i in flagged):
        raise ValueError(f"Invalid flagged: {sorted(flagged)} (expected example indices in [0, {len(scores)}))")
    # argsort gave the places at a tied k-th score to the lowest indices: flipped labels numbered first were "found"
    # among equal scores (four equal scores, flagged [0, 1], k = 2: precision 1, and 0 with the examples reversed)
    cut = torch.sort(scores, descending=True).values[k - 1]
    above, tied = scores > cut, scores == cut
    marked = torch.zeros(len(scores), dtype=torch.bool)
    marked[sorted(flagged)] = True
    places = k - int(above.sum())   # what the tied examples share
    return (int((above & marked).sum()) + places * int((tied & marked).sum()) / int(tied.sum())) / k


def detector_bars(precisions: dict[str, float], chance: float, k: int) -> go.Figure:
    """Precision@k of several label-noise detectors, with the chance level.

    Example:
        >>> len(detector_bars({"SAZO score": 0.5, "loss": 0.75}, 0.15, 4).data[0].x)
        2
    """
    if not isinstance(precisions, dict) or not precisions:
        raise ValueError(f"Invalid precisions: expected a non-empty dict detector -> precision, got {precisions!r}")
    number_list("precisions", precisions.values(), high=1.0)
    chance = number_list("chance", [chance], high=1.0)[0]
    check_int("k", k, 1)
    fig = go.Figure(go.Bar(x=list(precisions), y=list(precisions.values()), text=[f"{v:.0%}" for v in precisions.values()],
                           textposition="outside", marker_color="slategray"))
    fig.add_hline(y=chance, line=dict(dash="dot", color="crimson"), annotation_text=f"chance ({chance:.0%})")
    fig.update_layout(width=520, height=340, yaxis=dict(title=f"flipped among the top {k}", range=[0, 1.15]),
                      title="finding the flipped labels", margin=dict(l=55, r=10, t=40, b=45))
    return fig


# -- issue 28: what limits the rate (the walk), the stale oracle, the gain against B, a live race -------------
def walk_figure(runs_by_sampler: dict, *, band=WALK_BAND) -> go.Figure:
    """‖θ−θ₀‖ against queries for every run, with the band where measured runs failed shaded.

    A diverged run ends with a cross. ``band``: (low, high) or None.

    Example:
        >>> fig = walk_figure({"uniform": [{"queries": [0, 10], "walk": [0.0, 3.0], "diverged": True}]})
        >>> list(fig.data[0].y), fig.data[1].marker.symbol
        ([0.0, 3.0], 'x')
    """
    fig = go.Figure()
    for sampler, runs in runs_by_sampler.items():
        color = _color(sampler)
        for k, run in enumerate(_as_dict(r) for r in runs):
            if not run.get("walk"):
                continue
            fig.add_scatter(x=run["queries"], y=run["walk"], mode="lines", line=dict(color=color, width=1.5),
                            opacity=0.8, name=sampler, legendgroup=sampler, showlegend=k == 0)
            if run.get("diverged"):
                fig.add_scatter(x=run["queries"][-1:], y=run["walk"][-1:], mode="markers", showlegend=False,
                                marker=dict(symbol="x", size=10, color=color), legendgroup=sampler,
                                name=f"{sampler} diverged")
    if band is not None:
        fig.add_hrect(y0=band[0], y1=band[1], fillcolor="crimson", opacity=0.12, line_width=0,
                      annotation_text="where measured runs failed", annotation_position="top left")
    fig.update_layout(width=640, height=360, xaxis_title="queries", yaxis_title="‖θ − θ₀‖",
                      title="the random walk of θ: ‖θ−θ₀‖² ≈ η²·d·Σ ĝ²", margin=dict(l=55, r=10, t=40, b=45))
    return _nothing_drawn("runs_by_sampler", fig, "a recorded walk")


def displacement_figure(walk: dict, *, ends: dict | None = None, band=WALK_BAND) -> go.Figure:
    """ΔF/F(θ₀) under random displacements of each radius (``random_walk_descent``'s report): each
    ± pair as a dot, their mean as a line; ``ends`` ({label: ‖θ−θ₀‖}) marks where runs' walks ended.

    Example:
        >>> fig = displacement_figure({"F": 2.0, "radii": [1.0, 2.0], "changes": [[-0.2, 0.0], [-0.4, -0.8]],
        ...                            "mean_change": [-0.05, -0.3]}, ends={"uniform": 1.5})
        >>> list(fig.data[0].y), [round(y, 2) for y in fig.data[1].y]
        ([-0.05, -0.3], [-0.1, 0.0, -0.2, -0.4])
    """
    require_keys("walk", walk, ("F", "radii", "changes", "mean_change"))
    same_lengths(radii=walk["radii"], changes=walk["changes"], mean_change=walk["mean_change"])
    if not walk["F"] > 0:
        raise ValueError(f"Invalid walk: F = {walk['F']!r} (expected F(θ₀) > 0: the changes are drawn relative to it)")
    fig = go.Figure()
    fig.add_scatter(x=walk["radii"], y=walk["mean_change"], mode="lines+markers", name="mean over ±u",
                    line=dict(color="black", width=2))
    xs = [r for r, changes in zip(walk["radii"], walk["changes"]) for _ in changes]
    ys = [c / walk["F"] for changes in walk["changes"] for c in changes]
    fig.add_scatter(x=xs, y=ys, mode="markers", name="one direction u (½(F₊ + F₋) − F)",
                    marker=dict(color="grey", size=7, opacity=0.7))
    for label, end in (ends or {}).items():
        fig.add_vline(x=end, line=dict(color=_color(label), dash="dot"), annotation_text=label,
                      annotation_position="top")
    if band is not None:
        fig.add_vrect(x0=band[0], x1=band[1], fillcolor="crimson", opacity=0.1, line_width=0)
    fig.add_hline(y=0.0, line=dict(color="grey", width=1))
    fig.update_layout(width=640, height=360, xaxis_title="‖θ − θ₀‖ of a random displacement",
                      yaxis_title="ΔF / F(θ₀)", title="what the walk alone does to F",
                      margin=dict(l=55, r=10, t=40, b=45))
    return fig


def staleness_figure(runs_by_label: dict) -> go.Figure:
    """V(p_stale)/V(p*) at each oracle refresh (log scale), with V(u)/V(p*) at the same moments dashed.

    ``runs_by_label``: label → runs whose ``staleness`` records come from ``RefreshingNorms``.
    """
    fig = go.Figure()
    palette = ["firebrick", "seagreen", "purple", "gray"]
    for k, (label, runs) in enumerate(runs_by_label.items()):
        color = palette[k % len(palette)]
        for j, run in enumerate(_as_dict(r) for r in runs):
            records = run.get("staleness") or []
            if not records:
                continue
            steps = [x["step"] for x in records]
            fig.add_scatter(x=steps, y=[x["v_stale_ratio"] for x in records], mode="lines+markers",
                            line=dict(color=color), name=f"{label}: V(p_stale)/V(p*)", legendgroup=label,
                            showlegend=j == 0)
            fig.add_scatter(x=steps, y=[x["v_uniform_ratio"] for x in records], mode="lines",
                            line=dict(color=color, dash="dot"), name=f"{label}: V(u)/V(p*)", legendgroup=label,
                            showlegend=j == 0)
    fig.update_yaxes(type="log")
    fig.update_layout(width=640, height=360, xaxis_title="step", yaxis_title="variance ratio",
                      title="how much the oracle's old norms cost at each refresh",
                      margin=dict(l=55, r=10, t=40, b=45))
    return _nothing_drawn("runs_by_label", fig, "staleness records")


def _by_batch(name: str, gains) -> dict[int, float]:
    """``gains`` ({B: gain}, B an int or its digits, as a JSON report's keys) as {B: gain} sorted by B, or a ValueError
    naming it: a B that is not a whole count ≥ 1 (1.5 was drawn at B = 1 and then raised KeyError; 0 fell off the log
    axis without a word) or one B given twice (1 and "1": both points drawn at the first one's gain)."""
    if not isinstance(gains, dict) or not gains:
        raise ValueError(f"Invalid {name}: expected a non-empty {{B: gain}}, got {gains!r}")
    values = number_list(name, gains.values(), low=0.0)
    sizes = []
    for b in gains:
        text = b.strip() if isinstance(b, str) else None
        size = int(text) if text is not None and text.isdigit() else b
        sizes.append(check_int(f"{name}: batch size", size.item() if hasattr(size, "item") else size, 1))
    if len(set(sizes)) < len(sizes):
        raise ValueError(f"Invalid {name}: batch sizes {list(gains)} (expected each B once)")
    return dict(sorted(zip(sizes, values)))


def gain_vs_batch_figure(predicted: dict, measured: dict | None = None, *, title: str = "") -> go.Figure:
    """The oracle's gain over uniform against B: predicted from θ₀ ([V(u)+(B−1)‖∇F‖²]/[V(p*)+(B−1)‖∇F‖²]) per set,
    and measured ratios of median queries where given.

    ``predicted``: set label → {B: gain}; ``measured``: label → {B: ratio}.

    Example:
        >>> fig = gain_vs_batch_figure({"a": {1: 5.0, 4: 3.0}}, {"a": {1: 2.75}})
        >>> [list(t.y) for t in fig.data]
        [[5.0, 3.0], [2.75]]
    """
    if not predicted or not all(predicted.values()):
        raise ValueError(f"Invalid predicted: expected set label -> a non-empty {{B: gain}}, got {predicted!r}")
    predicted = {label: _by_batch(f"gains of {label!r}", gains) for label, gains in predicted.items()}
    measured = {label: _by_batch(f"gains of {label!r}", gains) if gains else {}
                for label, gains in (measured or {}).items()}
    alone = sorted(set(measured) - set(predicted), key=str)   # drawn beside its predicted line, or not at all
    if alone:
        raise ValueError(f"Invalid measured: {alone} have no predicted line (expected labels among {list(predicted)})")
    fig = go.Figure()
    palette = ["steelblue", "darkorange", "seagreen", "purple"]
    for k, (label, gains) in enumerate(predicted.items()):
        fig.add_scatter(x=list(gains), y=list(gains.values()), mode="lines+markers",
                        line=dict(color=palette[k % 4]), name=f"{label}: predicted at θ₀")
        for_label = measured.get(label) or {}
        if for_label:
            fig.add_scatter(x=list(for_label), y=list(for_label.values()), mode="markers",
                            marker=dict(size=12, symbol="diamond", color=palette[k % 4]), name=f"{label}: measured")
    fig.add_hline(y=1.0, line=dict(dash="dot", color="gray"))
    fig.update_xaxes(type="log", title="batch size B")
    fig.update_layout(width=640, height=360, yaxis_title="uniform ÷ oracle (queries)", title=title or
                      "what importance sampling can gain, against B", margin=dict(l=55, r=10, t=40, b=45))
    return fig

"""Round 13 on the course layer: what students and instructors see, in fast mode and in class mode.

A sentence of a notebook or a dashboard's caption that is true in one mode only, or of another setting than
the control it sits under, is a wrong answer that looks right. Each test fails on the code before its fix.
"""
from __future__ import annotations

import ast
import json
import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
_WORDS = {"one": 1, "two": 2, "three": 3, "four": 4, "five": 5, "six": 6, "seven": 7, "eight": 8, "nine": 9, "ten": 10}


def _notebook(name: str) -> dict:
    return json.loads((ROOT / "notebooks" / f"{name}.ipynb").read_text())


def _markdown(notebook: dict) -> str:
    return "\n".join("".join(c["source"]) for c in notebook["cells"] if c["cell_type"] == "markdown")


def _code(notebook: dict) -> str:
    return "\n".join("".join(c["source"]) for c in notebook["cells"] if c["cell_type"] == "code")


def _picked(code: str, name: str) -> dict[str, int]:
    """{"class": full, "fast": fast} of ``name = ...pick(full, fast)...`` in a notebook's code."""
    match = re.search(rf"{name}\b[^\n]*?pick\((\d+), (\d+)\)", code)
    assert match, f"{name} = ...pick(full, fast)... not found in the notebook's code"
    return {"class": int(match.group(1)), "fast": int(match.group(2))}


# -- notebook 05: how many seeds the rates are tuned on ------------------------------------------------------

def test_05_says_how_many_seeds_the_rates_are_tuned_on_in_each_mode():
    """Race 1's text said "tuned on the first three of the five seeds" without a mode: fast mode tunes on the
    first two of three (TUNING_SEEDS = pick(3, 2), race1_seeds = range(pick(5, 3)))."""
    notebook = _notebook("05_the_race")
    code, text = _code(notebook), _markdown(notebook)
    tuning, raced = _picked(code, "TUNING_SEEDS"), _picked(code, "race1_seeds")
    sentences = [s for s in re.split(r"(?<=[.!?])\s+", text) if "tuned on the first" in s]
    assert sentences, "race 1's text no longer says which seeds tune the rates"
    for sentence in sentences:
        stated = {mode: (_WORDS[a], _WORDS[b]) for a, b, mode in
                  re.findall(r"\b(\w+) of (\w+) in (class|fast) mode", sentence) if a in _WORDS and b in _WORDS}
        assert set(stated) == {"class", "fast"}, f"each mode's count is not stated: {sentence!r}"
        for mode, counts in stated.items():
            assert counts == (tuning[mode], raced[mode]), f"{mode} mode tunes on {tuning[mode]} of {raced[mode]}"
        assert not re.search(r"first \w+ of the \w+ seeds", sentence), f"a count without its mode: {sentence!r}"


# -- notebook 07: the memory calculator's captions ------------------------------------------------------------

def _totals(board) -> tuple[float, float]:
    bars = [trace.y for trace in board.figures["bars"].data]
    return sum(b[0] for b in bars), sum(b[1] for b in bars)


def test_memory_heads_caption_says_what_the_heads_slider_moves_with_fused_attention():
    """The caption said heads "only matter for the materialised n_ctx×n_ctx scores"; with fused attention
    (the default) H still sets the k/v width KV heads·D/H, and the bars move when it changes."""
    pytest.importorskip("ipywidgets")
    from sazo_lite.course.widgets import memory as memory_widgets

    board = memory_widgets.memory_dashboard()
    assert board.controls["attention"].value == "fused"
    before = _totals(board)
    board.controls["heads"].value = 8           # Qwen2.5-3B: 16 heads, 2 KV heads → D_kv doubles
    after = _totals(board)
    assert "Could not" not in board.readout.value
    assert after[0] != before[0]                # fused: the heads slider does move the BP bar
    caption = memory_widgets.CAPTIONS["heads"]
    assert "only matter for the materialised" not in caption
    assert "KV heads·D/H" in caption            # what it moves under fused attention, named


# -- notebook 04: the χ²₁ dashboard --------------------------------------------------------------------------

def _readout_number(readout: str, label: str) -> float:
    match = re.search(rf"{label}[^0-9]*([0-9.]+)", re.sub(r"<[^>]+>", "", readout))
    assert match, f"{label!r} not in the readout {readout!r}"
    return float(match.group(1))


@pytest.mark.parametrize("examples, seed", [(500, 1), (20_000, 0)])
def test_chi2_readout_gives_one_observations_relative_variance_as_it_gives_the_emas(examples, seed):
    """"one δ²: relative variance" printed the draws' variance, not var/mean² as for the EMA beside it (and as
    notebook 04's table): 1.97 for the notebook's 20,000 examples (var/mean² 2.00), 1.64 for 500 at seed 1
    (2.36)."""
    pytest.importorskip("ipywidgets")
    from sazo_lite.course.sazo_runs import ema_of_chi2
    from sazo_lite.course.widgets import chi2_dashboard

    board = chi2_dashboard(examples=examples, seed=seed)
    single = ema_of_chi2(examples, observations=1, ema_decay=0.0, seed=seed)
    shown = _readout_number(board.readout.value, "one δ²: relative variance")
    assert shown == round(float(single.var() / single.mean() ** 2), 2)
    board.controls["observations"].value = 1    # an EMA of one observation is that observation: the same figure
    assert _readout_number(board.readout.value, r"EMA of 1 with β = [0-9.]+:") == shown


# -- notebook 07: what the measurement cell measures in fast mode ----------------------------------------------

def _points(code: str, fast: bool, monkeypatch) -> list:
    """The (setup, mode) points notebook 07's measurement cell builds in one mode (its ``points = pick(...)``)."""
    from sazo_lite.course import config, memory_measure

    monkeypatch.setenv("SAZO_FAST", "1" if fast else "0")
    statement = next((node for node in ast.parse(code).body if isinstance(node, ast.Assign)
                      and [getattr(t, "id", None) for t in node.targets] == ["points"]), None)
    assert statement is not None, "notebook 07's `points = pick(...)` not found"
    scope = {"pick": config.pick, "default_points": memory_measure.default_points}
    exec(compile(ast.Module([statement], type_ignores=[]), "notebook 07", "exec"), scope)
    return scope["points"]


def test_07_says_what_fast_mode_measures(monkeypatch):
    """The text said the cell measures "three things at several context lengths: an inference forward, a MeZO step
    and a backprop SGD step"; fast mode measures a MeZO and a backprop step at one context (512, fused)."""
    notebook = _notebook("07_memory_on_device")
    fast = _points(_code(notebook), True, monkeypatch)
    full = _points(_code(notebook), False, monkeypatch)
    modes = {mode for _setup, mode in fast}
    contexts = {setup.context for setup, _mode in fast}
    assert {mode for _setup, mode in full} == {"inference", "zo", "bp"} and modes < {"inference", "zo", "bp"}
    cell = next("".join(c["source"]) for c in notebook["cells"]
                if c["cell_type"] == "markdown" and "measure three things" in "".join(c["source"]))
    said = re.search(r"Fast mode measures only ([^.]*)\.", cell)
    assert said, "the cell introducing the measurement does not say what fast mode measures"
    assert "inference" not in said.group(1) and "last two" in said.group(1)
    assert all(str(n) in said.group(1) for n in contexts) and ("one context" in said.group(1)) == (len(contexts) == 1)


# -- notebook 01: what makes the right arm of the U ---------------------------------------------------------------

def test_two_point_docstrings_name_the_third_derivative_not_the_curvature_for_the_eps_squared_error():
    """two_point's docstrings called the ε² error "curvature" ("(curvature)", "Large ε: curvature error ∝ ε²"),
    which notebook 01 teaches is wrong: the curvature cancels in a central difference. The code agrees with the
    notebook: a steep quadratic has no ε² error at all, a quartic term has."""
    import torch

    from sazo_lite.course import two_point

    theta, grid = torch.tensor([1.0, -0.8], dtype=torch.float64), [1e-1, 1.0]
    steep = lambda x: two_point.bowl_loss(x, [50.0, 200.0])
    quartic = lambda x: two_point.bowl_loss(x, [1.0, 1.0], quartic=1.0)
    exact = two_point.error_vs_eps(steep, two_point.bowl_grad(theta, [50.0, 200.0]), theta, grid,
                                   dtype=torch.float64)
    biased = two_point.error_vs_eps(quartic, two_point.bowl_grad(theta, [1.0, 1.0], 1.0), theta, grid,
                                    dtype=torch.float64)
    assert float(exact.max()) < 1e-12 and float(biased[1]) > 50 * float(biased[0]) > 0   # ∝ ε², from κ alone
    for doc in (two_point.__doc__, two_point.error_vs_eps.__doc__, two_point.bowl_loss.__doc__):
        assert not re.search(r"\(curvature\)|curvature error", doc), doc
    assert "third derivative" in two_point.__doc__ and "third-derivative" in two_point.error_vs_eps.__doc__


# -- notebook 06: which run its text quotes -------------------------------------------------------------------------

def test_06_says_when_it_reads_another_run_than_the_one_its_text_quotes(tmp_path):
    """The lesson reads this machine's latest run (benchmarks/results/) before the reference run in git, and the
    text quotes the reference run's numbers (8.71, 0.11, 6.79, 0.88 [0–∞] ...): after `make bench-llm ... --out
    benchmarks/results/llm_opposed_race.json` the cells printed another race under a text that contradicted them,
    without a word. The first cell now says so; on the reference run it prints nothing more."""
    import shutil

    from sazo_lite.course import llm_lesson as lesson

    reference = ROOT / "benchmarks" / "reference" / lesson.REPORT
    (tmp_path / "benchmarks" / "reference").mkdir(parents=True)
    shutil.copy(reference, tmp_path / "benchmarks" / "reference" / lesson.REPORT)
    quoted = lesson.load_race(start=tmp_path)
    assert quoted.reference and lesson.text_note(quoted) == ""
    (tmp_path / "benchmarks" / "results").mkdir()
    report = json.loads(reference.read_text())
    report["settings"][0]["design"]["v_uniform_ratio"] *= 2          # this machine's rerun measured other numbers
    (tmp_path / "benchmarks" / "results" / lesson.REPORT).write_text(json.dumps(report))
    rerun = lesson.load_race(start=tmp_path)
    assert not rerun.reference and rerun.design["v_uniform_ratio"] != quoted.design["v_uniform_ratio"]
    note = lesson.text_note(rerun)
    assert "this machine's latest run" in note and "reference run" in note
    notebook = _notebook("06_llm_finetuning")
    first = next("".join(c["source"]) for c in notebook["cells"] if c["cell_type"] == "code")
    assert "lesson.text_note(race)" in first and "race.reference" in first
    assert "the text quotes the reference run in git" in _markdown(notebook)


# -- a bool or a string read as a number ----------------------------------------------------------------------------

def test_path_point_and_error_vs_eps_refuse_a_bool_or_a_string_float_read_as_a_number():
    """path_point read progress=True as t = 1 (θ*, silently) and error_vs_eps read True as ε = 1 and "1e-3" as
    1e-3: float() takes them. Both now apply the one number rule (check_number: not a bool or a string), and still
    take numpy scalars and 0-d tensors."""
    import numpy as np
    import torch

    from sazo_lite.course import minibatches, problems, two_point

    problem = problems.LeastSquares(16, 3, heterogeneity=1.0)
    for bad in (True, np.True_, "0.5", torch.tensor(True)):
        with pytest.raises(ValueError, match="Invalid progress"):
            minibatches.path_point(problem, bad)
    with pytest.raises(ValueError, match="Invalid progress"):
        minibatches.gain_along_path(problem, [1], [0.0, True])
    half = minibatches.path_point(problem, 0.5)
    for same in (np.float32(0.5), torch.tensor(0.5)):
        torch.testing.assert_close(minibatches.path_point(problem, same), half)
    bowl = lambda x: two_point.bowl_loss(x, [1.0, 3.0])   # noqa: E731
    for bad in ([1e-3, True], ["1e-3"], "1e-3"):
        with pytest.raises(ValueError, match="Invalid eps_grid"):
            two_point.error_vs_eps(bowl, [1.0, 6.0], [1.0, 2.0], bad)
    grid = torch.logspace(-3, -1, 3, dtype=torch.float64)
    torch.testing.assert_close(two_point.error_vs_eps(bowl, [1.0, 6.0], [1.0, 2.0], grid),
                               two_point.error_vs_eps(bowl, [1.0, 6.0], [1.0, 2.0], grid.tolist()))


def test_memory_dtype_caption_excepts_the_z_buffer_that_float32_does_not_double():
    """The caption said "float32 doubles every byte. Does it change the ratio?": BP's bar doubles, ZO's does not (its
    z buffer is float32 for 16-bit weights too, 1.24 GB for Qwen2.5-3B), so the ratio moves (2.3× → 2.5×)."""
    pytest.importorskip("ipywidgets")
    from sazo_lite.course.widgets import memory as memory_widgets

    board = memory_widgets.memory_dashboard()
    assert board.controls["dtype"].value == "bfloat16"
    half, ratio_half = _totals(board), re.search(r"ratio <b class='ratio'>([0-9.]+)×", board.readout.value).group(1)
    board.controls["dtype"].value = "float32"
    full, ratio_full = _totals(board), re.search(r"ratio <b class='ratio'>([0-9.]+)×", board.readout.value).group(1)
    assert full[0] == pytest.approx(2 * half[0]) and full[1] < 1.99 * half[1] and ratio_full != ratio_half
    caption = memory_widgets.CAPTIONS["dtype"]
    assert "doubles every byte." not in caption and "z buffer" in caption


# -- language-model figures: the median over seeds -----------------------------------------------------------------

def test_loss_bands_count_a_diverged_seed_as_above_the_others_not_as_gone():
    """loss_bands took the median over the seeds still logging at each query count: where two of three seeds had
    diverged (stopped, F > 1.5·F₀), its median line read the survivor's 0.3 as "median, 3 seeds". A diverged seed now
    counts as above every other after its stop, as in notebook 06's race figure; a seed out of budget is left out."""
    pytest.importorskip("plotly")
    from sazo_lite.course.widgets.llm import loss_bands

    alive = {"queries": [0, 2, 4, 6], "train_loss": [1.0, 0.7, 0.5, 0.3], "diverged": False}
    gone = [{"queries": [0, 2, 4], "train_loss": [1.0, 0.9, 1.6], "diverged": True},
            {"queries": [0, 2, 4], "train_loss": [1.0, 1.2, 1.7], "diverged": True}]
    median = list(loss_bands({"uniform": [alive, *gone]}).data[-1].y)
    assert median[:3] == pytest.approx([1.0, 0.9, 1.6]) and median[3] is None   # 2 of 3 above everything
    ended = [{"queries": [0, 2, 4], "train_loss": [1.0, 0.9, 0.8], "diverged": False}] * 2   # out of budget only
    assert list(loss_bands({"uniform": [alive, *ended]}).data[-1].y)[3] == pytest.approx(0.3)


# -- notebook 04: the ladder's table --------------------------------------------------------------------------------

def test_rule_ladder_counts_a_diverged_run_as_infinite_not_as_its_ratios():
    """rule_ladder averaged V(p)/V(p*) along runs that had diverged: at η = 1 the table read "+ level 13.0" below
    uniform's 18.4 on runs whose gaps had reached 10¹³. A diverged run (first_divergence of its gaps) now counts as
    +∞ for its rule and for uniform; runs that stay on the problem give the same means as before."""
    import numpy as np

    from sazo_lite.course import sazo_runs

    problem = sazo_runs.make_problem(heterogeneity=1.5, num_examples=32, dim=4)
    wild = sazo_runs.rule_ladder(problem, steps=60, seeds=(0,), rules=("plain", "robust"), lr=1.0, log_every=10)
    traces = {rule: sazo_runs.run_sazo_trace(problem, steps=60, seed=0, rule=rule, lr=1.0, log_every=10)
              for rule in ("plain", "robust")}
    for rule, trace in traces.items():
        assert sazo_runs.first_divergence(trace.gap) is not None        # the run left the problem
        assert wild[rule] == float("inf")
    assert wild["uniform"] == float("inf")
    calm = sazo_runs.rule_ladder(problem, steps=60, seeds=(0, 1), rules=("robust",), lr=0.01, log_every=10)
    means = [float(np.mean(sazo_runs.run_sazo_trace(problem, steps=60, seed=s, rule="robust", lr=0.01,
                                                     log_every=10).ratio["sazo"][1:])) for s in (0, 1)]
    assert calm["robust"] == pytest.approx(float(np.median(means)))


def test_race_median_counts_a_stopped_seed_as_above_the_others_not_as_gone():
    """The race plot took np.nanmedian over seeds: a run stopped on a non-finite loss (NaN after its stop, as
    RaceResult says) dropped out, so with two of three seeds stopped the median line read the survivor's gap and no
    "diverged" mark was drawn. A stopped seed now counts as above every other there; a run still training (the
    progressive draw's ``logged``) is drawn only as far as it got."""
    import numpy as np

    from sazo_lite.course.sazo_runs import RaceResult
    from sazo_lite.course.widgets.race import _draw_race, _empty_race_figure, race_figure

    nan = float("nan")
    gaps = np.array([[1.0, 0.5, 0.05, 0.01], [1.0, 0.6, nan, nan], [1.0, 0.7, nan, nan]])
    result = RaceResult(np.array([0, 10, 20, 30]), {"uniform": gaps}, 1.0, 0.1, {"uniform": [20, None, None]})
    fig = race_figure(result)
    median = [trace for trace in fig.data if trace.name == "uniform MeZO"][0].y
    assert list(median[:2]) == pytest.approx([1.0, 0.6]) and min(median[2:]) > 10   # not the survivor's 0.05, 0.01
    assert any("diverged" in a.text for a in fig.layout.annotations)
    running = RaceResult(np.array([0, 10, 20, 30]), {"uniform": np.array([[1.0, 0.5, nan, nan]])}, 1.0, 0.1,
                         {"uniform": [None]})
    live = _empty_race_figure(("uniform",), widget=False)
    _draw_race(live, running, ("uniform",), logged={"uniform": 2})
    drawn = np.asarray(live.data[1].y, dtype=float)
    assert list(live.data[1].x) == [0, 10, 20, 30] and list(drawn[:2]) == pytest.approx([1.0, 0.5])
    assert np.isnan(drawn[2:]).all()                  # not reached yet: a gap, not the ceiling
    assert not live.layout.annotations


def test_number_list_and_gain_by_hand_refuse_a_bool_or_a_string_float_read_as_a_number():
    """number_list (the language-model figures' targets, scores, norms, probabilities) and gain_by_hand read True as
    1.0 and "0.5" as 0.5 through float(); each element is a number now (check_real), numpy and 0-d tensors read."""
    import numpy as np
    import torch

    from sazo_lite.course import llm_lesson
    from sazo_lite.course.widgets._common import number_list

    for bad in ([0.5, True], ["0.5"], "0.5", [np.True_]):
        with pytest.raises(ValueError, match="Invalid p"):
            number_list("p", bad, high=1.0)
        with pytest.raises(ValueError, match="Invalid norms"):
            llm_lesson.gain_by_hand(bad, 0.1, 2)
    assert number_list("p", np.array([0.25, 0.5])) == number_list("p", torch.tensor([0.25, 0.5])) == [0.25, 0.5]
    assert llm_lesson.gain_by_hand(torch.tensor([1.0, 1.0, 1.0, 5.0]), 0.0, 4) == \
        pytest.approx(llm_lesson.gain_by_hand([1.0, 1.0, 1.0, 5.0], 0.0, 4))

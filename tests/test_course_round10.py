"""Red-team round 10 on the course layer: what the race's "tune η" button and the importance dashboard's λ
slider recompute, the race table's advice at a tiny ε, and course helpers given bad data.

Rounds 8 and 9 (tests/test_course_round8.py, test_course_round9.py) drove the dashboards to their slider ends
and into divergence; this round counts the runs a control's change costs and calls the helpers left unchecked.
"""
from __future__ import annotations

import re

import numpy as np
import pytest
import torch

pytest.importorskip("ipywidgets")
pytest.importorskip("plotly")

from sazo_lite.course import minibatches, problems, sazo_runs, two_point  # noqa: E402
from sazo_lite.course import widgets as sw  # noqa: E402
from sazo_lite.course.widgets import race as race_widgets  # noqa: E402


def text(html: str) -> str:
    return re.sub(r"<[^>]+>", "", html)


@pytest.fixture
def runs(monkeypatch):
    """Every training run ``sazo_runs.race`` starts, as (method, seed, lr)."""
    started, run_one = [], sazo_runs._run_one

    def counted(problem, method, seed, **kwargs):
        started.append((method, seed, kwargs["lr"]))
        return run_one(problem, method, seed, **kwargs)

    monkeypatch.setattr(sazo_runs, "_run_one", counted)
    return started


# -- notebook 05: the "tune η per method" button -----------------------------------------------------

def test_race_tune_trains_each_grid_rate_once_and_its_redraw_trains_nothing(runs):
    """The button ran ``tune_lr`` (5 rates × 3 methods × seeds), threw its runs away and retrained the three
    chosen rates for the redraw; the current rate's runs, already on screen, were trained again too: 54 runs
    for the notebook's 3 seeds where 36 are new. Its choice is still ``tune_lr``'s."""
    seeds, steps = 2, 40
    board = sw.race_dashboard(seeds=seeds, steps=steps, live_after=None)
    values = {name: control.value for name, control in board.controls.items()}
    runs.clear()
    board.tune()
    assert len(runs) == 3 * (len(race_widgets._GRID) - 1) * seeds, runs
    assert len(set(runs)) == len(runs)                       # no run twice
    for method in sazo_runs.SAMPLERS:
        name = race_widgets.LR_CONTROLS[method]
        current = values[name]
        assert (method, 0, current) not in runs               # on screen already
        expected, _ = sazo_runs.tune_lr(
            sazo_runs.make_problem(values["problem"], heterogeneity=values["heterogeneity"], num_examples=64, dim=5),
            method, [current * f for f in race_widgets._GRID], seeds=tuple(range(seeds)), steps=steps,
            batch_size=values["batch_size"], eps=values["eps"], ema_decay=values["ema_decay"],
            uniform_mix=values["uniform_mix"], log_every=10, target_fraction=0.1, dtype=torch.float32)
        assert board.controls[name].value == expected, (method, board.controls[name].value, expected)
    assert board.result().lrs == {m: board.controls[race_widgets.LR_CONTROLS[m]].value for m in sazo_runs.SAMPLERS}


def test_race_tune_tries_only_rates_its_sliders_can_hold(runs):
    """At η uniform = 1 (the slider's end) the button also raced 2 and 4: a choice the slider would have cut to
    1 without a word, so the plot would not show the tuned rate."""
    board = sw.race_dashboard(seeds=1, steps=30, live_after=None)
    board.controls["lr_uniform"].value = 1.0
    runs.clear()
    board.tune()
    tried = sorted({lr for method, _seed, lr in runs if method == "uniform"})
    assert tried == [0.25, 0.5], tried                     # ¼×, ½× (1× is on screen; 2×, 4× are off the slider)
    assert board.controls["lr_uniform"].value in (0.25, 0.5, 1.0)


# -- notebook 05: the race table at a tiny ε ---------------------------------------------------------

def test_race_table_at_a_tiny_eps_says_raise_eps_as_the_red_notes_do():
    """The "ε too small" preset's table said "no method did (uniform MeZO, SAZO diverged: lower their η; raise
    the others' η or the steps)" under red notes saying "raise ε before lowering η": at ε = 1e-9 no η helps."""
    from sazo_lite.course.sazo_runs import RaceResult

    q = np.array([0.0, 20.0, 40.0])
    wild, flat = np.array([[1.0, 50.0, np.nan]]), np.array([[1.0, 1.0, 1.0]])
    result = RaceResult(q, {"uniform": wild, "sazo": wild, "oracle": flat}, 1.0, 0.1,
                        {m: [None] for m in ("uniform", "sazo", "oracle")})
    tiny = text(race_widgets.race_table_html(result, eps=1e-9))
    assert "raise ε" in tiny and "lower their η" not in tiny and "raise the others' η" not in tiny, tiny
    assert "lower their η" in text(race_widgets.race_table_html(result, eps=1e-3))   # a safe ε: the η advice
    assert "lower their η" in text(race_widgets.race_table_html(result))


def test_race_dashboard_tiny_eps_readout_gives_one_advice():
    board = sw.race_dashboard(seeds=1, steps=60, live_after=None)
    board.controls["eps"].value = 1e-9
    shown = text(board.readout.value)
    assert "raise ε" in shown and "raise the others' η" not in shown, shown


# -- notebook 03: the importance dashboard's λ ------------------------------------------------------

def test_importance_dashboard_redraws_only_the_mixed_bar_when_lambda_moves(monkeypatch):
    """Moving λ redrew the Monte-Carlo bars of uniform and the oracle as well, which do not depend on λ (the
    same draws, the same numbers): three Monte-Carlo runs per move instead of one (0.40 s against 0.20 s at the
    notebook's 100,000 draws)."""
    board = sw.importance_dashboard(num_examples=64, dim=5, trials=4000)
    bars = list(board.figures["variance"].data[0].y)
    calls, estimates = [], minibatches.minibatch_zo_estimates

    def counted(*args, **kwargs):
        calls.append(args[2])
        return estimates(*args, **kwargs)

    monkeypatch.setattr(minibatches, "minibatch_zo_estimates", counted)
    board.controls["uniform_mix"].value = 0.6
    assert len(calls) == 1, calls
    moved = list(board.figures["variance"].data[0].y)
    assert moved[0] == bars[0] and moved[2] == bars[2] and moved[1] != bars[1]
    board.controls["uniform_mix"].value = 0.3                 # back to the opening λ: nothing to draw again
    assert len(calls) == 1 and list(board.figures["variance"].data[0].y) == bars
    board.controls["batch_size"].value = 4                    # B changes every bar
    assert len(calls) == 4


# -- helpers given bad data ----------------------------------------------------------------------------

def _bad_data_calls():
    from sazo_lite.course.widgets import llm, llm_lesson

    ls = problems.LeastSquares(16, 3, seed=0)
    bowl = lambda t: two_point.bowl_loss(t, [1.0, 2.0])
    nan = float("nan")
    return [
        # (call, the word its message must name)   what it did before
        (lambda: minibatches.gain_vs_batch([1.0, 2.0], nan, 2, [1]), "full_grad_norm"),             # tensor([nan])
        (lambda: minibatches.gain_vs_batch([1.0, 2.0], -1.0, 2, [1]), "full_grad_norm"),            # silently 1.11
        (lambda: minibatches.gain_vs_batch([1.0, 2.0], 1.0, 0, [1]), "dim"),                        # silently 1.11
        (lambda: minibatches.weighted_loss_estimates([nan, 1.0], [0.5, 0.5], 1, 3), "losses"),      # NaN estimates
        (lambda: minibatches.minibatch_zo_estimates(torch.tensor([[nan, 1.0], [1.0, 1.0]]), [0.5, 0.5], 1, 3),
         "per_example_grads"),                                                                       # NaN estimates
        (lambda: minibatches.minibatch_zo_estimates(torch.ones(2), [0.5, 0.5], 1, 3), "per_example_grads"),  # IndexError
        (lambda: minibatches.second_moment_estimate(torch.tensor([[nan, 1.0], [1.0, 1.0]])), "draws"),  # (nan, nan)
        (lambda: two_point.bowl_loss(torch.tensor([1, 2]), [1.5, 1.5]), "theta"),                   # a = 1: 2.5, not 3.75
        (lambda: two_point.bowl_grad(torch.tensor([1, 2]), [1.5, 1.5]), "theta"),                   # a = 1
        (lambda: two_point.two_point_estimates(bowl, torch.tensor([1, 1]), two_point.random_directions(2, 2), 1e-3),
         "theta"),                                                                                   # z truncated to ints
        (lambda: two_point.two_point_estimates(bowl, torch.ones(2), torch.ones(2, 3), 1e-3), "directions"),  # RuntimeError
        (lambda: sazo_runs.feed_sampler(sazo_runs.SAZOSampler(2), [nan, 1.0], steps=2, batch_size=1), "norms"),  # silent
        (lambda: sazo_runs.feed_sampler(sazo_runs.SAZOSampler(2), [1.0, 1.0], steps=-1, batch_size=1), "steps"),  # silent
        (lambda: sazo_runs.feed_sampler(sazo_runs.SAZOSampler(2), [1.0, 1.0], steps=2, batch_size=1, shrink=-1.0),
         "shrink"),                                                                                  # silent
        (lambda: sazo_runs.sampler_paths(problems.LeastSquares(8, 2), steps=0), "steps"),            # θ₀ alone
        (lambda: sw.decay_note(sazo_runs.run_sazo_trace(ls, steps=2, log_every=1), 0.9, 10), "index"),  # IndexError
        (lambda: sw.measured_vs_predicted_figure([]), "rows"),                                        # an empty plot
        (lambda: sw.measured_vs_predicted_figure([{"predicted": 1e6, "measured": 1e6}]), "rows[0]"),  # KeyError 'mode'
        (lambda: sw.measured_vs_predicted_figure([dict(_ROW, measured=float("nan"))]), "measured"),  # silently drawn
        (lambda: ls.losses(torch.tensor([1, 0, 0])), "theta"),             # data cast to int: garbage losses (4.5, 0, ...)
        (lambda: ls.losses([0.0, 0.0, 0.0]), "theta"),                      # AttributeError 'shape'
        (lambda: ls.norms(torch.zeros(2, 3)), "theta"),                     # RuntimeError from a matmul
        (lambda: ls.per_example_grads(torch.zeros(4)), "theta"),            # RuntimeError size mismatch
        # notebook 06's record figures (sazo_lite.course.widgets.llm)
        (lambda: llm.loss_bands({}), "runs_by_sampler"),                                          # an empty plot
        (lambda: llm.loss_bands({"uniform": []}), "runs_by_sampler"),                             # an empty band
        (lambda: llm.scores_vs_norms([nan, 1.0], [1.0, 2.0]), "scores"),                         # silently drawn
        (lambda: llm.scores_vs_norms([], []), "scores"),                                          # an empty plot
        (lambda: llm.probs_vs_oracle([nan, 1.0], [0.5, 0.5]), "p_sazo"),                         # a NaN bar
        (lambda: llm.diagnostics_figure([]), "diagnostics"),                                      # an empty plot
        (lambda: llm.diagnostics_figure([{"queries": 0}]), "diagnostics[0]"),                     # KeyError 'tv'
        (lambda: llm.detector_precision([1.0, 2.0], [5], 1), "flagged"),                          # silently 0.0
        (lambda: llm.detector_precision([nan, 2.0], [0], 1), "ranking_scores"),                   # silently 1.0
        (lambda: llm.detector_bars({"a": 0.5}, 2.0, 3), "chance"),                                # a 200% chance line
        (lambda: llm.detector_bars({}, 0.5, 3), "precisions"),                                    # an empty plot
        (lambda: llm.walk_figure({"uniform": [{"queries": [0, 1]}]}), "runs_by_sampler"),         # an empty plot
        (lambda: llm.staleness_figure({"k=25": [{}]}), "runs_by_label"),                          # an empty plot
        (lambda: llm.gain_vs_batch_figure({}), "predicted"),                                      # an empty plot
        (lambda: llm.gain_vs_batch_figure({"a": {1: nan}}), "gains of 'a'"),                       # silently drawn
        (lambda: llm.peak_memory_bars({"inference": {}}), "peak_rss"),                            # KeyError
        # notebook 06's lesson figures (sazo_lite.course.widgets.llm_lesson)
        (lambda: llm_lesson.scores_vs_norms_figure([nan, 1.0], [1.0, 2.0], ["new", "new"]), "scores"),  # drawn
        (lambda: llm_lesson.scores_vs_norms_figure([], [], []), "scores"),                          # an empty plot
        (lambda: llm_lesson.gain_figure({}), "sets"),                                               # an empty plot
        (lambda: llm_lesson.scores_figure({"diagnostics": [], "seed": 0}), "diagnostics"),          # an empty plot
    ]


_ROW = dict(mode="zo", attention="fused", context=256, predicted=2e6, measured=2.2e6, relative_error=0.1)


@pytest.mark.parametrize("case", range(len(_bad_data_calls())))
def test_helpers_given_bad_data_raise_a_value_error_naming_it(case):
    call, name = _bad_data_calls()[case]
    with pytest.raises(ValueError, match=re.escape(name)):
        call()


def test_the_checked_helpers_still_take_what_the_notebooks_pass():
    """The checks refuse bad data only: lists, a 0-d tensor ‖∇F‖ and ±1 integer directions still work."""
    grads = torch.tensor([[1.0, 0.5], [2.0, -1.0]])
    as_list = minibatches.minibatch_zo_estimates(grads.tolist(), [0.5, 0.5], 1, 5)
    assert torch.equal(as_list, minibatches.minibatch_zo_estimates(grads, [0.5, 0.5], 1, 5))
    assert minibatches.second_moment_estimate(as_list.tolist()) == minibatches.second_moment_estimate(as_list)
    norms = grads.norm(dim=1)
    assert torch.equal(minibatches.gain_vs_batch(norms, grads.mean(0).norm(), 2, [1, 4]),
                       minibatches.gain_vs_batch(norms, float(grads.mean(0).norm()), 2, [1, 4]))
    assert float(two_point.bowl_loss([1.0, 2.0], [1.5, 1.5])) == pytest.approx(3.75)
    signs = torch.tensor([[1, -1], [-1, -1]])
    bowl = lambda t: two_point.bowl_loss(t, [1.0, 2.0])
    theta = torch.tensor([1.0, 1.0])
    assert torch.equal(two_point.two_point_estimates(bowl, theta, signs, 1e-3)[0],
                       two_point.two_point_estimates(bowl, theta, signs.float(), 1e-3)[0])


def test_race_titles_say_what_is_still_coming_with_one_seed():
    """With one seed per method the draws between methods were titled "first seed… (more seeds coming)", though
    no seed was coming, and the last method's was drawn twice (a partial draw, then the same final one)."""
    board = sw.race_dashboard(seeds=1, steps=30, live_after=None)
    figure, titles = board.figures["race"], []
    figure.view.observe(lambda _change: titles.append(figure.layout.title.text), names="outputs")
    board.controls["eps"].value = 1e-2                       # every method retrains
    assert titles == ["heterogeneous quadratic: SAZO, oracle p* still training…",
                      "heterogeneous quadratic: oracle p* still training…",
                      "heterogeneous quadratic: gap against queries (1 seed)"], titles
    assert board.stages[0] == 3
    two = sw.race_dashboard(seeds=2, steps=30, live_after=None)
    two.figures["race"].view.observe(lambda _change: titles.append(two.figures["race"].layout.title.text),
                                     names="outputs")
    titles.clear()
    two.controls["eps"].value = 1e-2
    assert titles == ["heterogeneous quadratic: first seed… (more seeds coming)"] * 3 + \
        ["heterogeneous quadratic: gap against queries (2 seeds)"], titles


@pytest.mark.parametrize("rate", [5.0, 1e-6, "0.01"])
def test_race_dashboard_refuses_an_opening_rate_its_slider_cannot_hold(rate):
    """``lrs={"uniform": 5.0}`` opened the race at η uniform = 1 (the slider's end) without a word, so its
    headline was not the race asked for; a string was a bare "could not convert string to float"."""
    with pytest.raises(ValueError, match=re.escape("Invalid lrs['uniform']")):
        sw.race_dashboard(seeds=1, steps=10, lrs={"uniform": rate}, live_after=None)
    board = sw.race_dashboard(seeds=1, steps=10, lrs={"uniform": 1.0, "oracle": 1e-4}, live_after=None)
    assert board.result().lrs["uniform"] == 1.0 and board.result().lrs["oracle"] == 1e-4   # the ends are fine


@pytest.mark.parametrize("build, message", [
    (lambda: sw.importance_dashboard(trials=1), "Invalid trials: 1"),         # was "Invalid trials: 0" (trials // 2)
    (lambda: sw.epsilon_dashboard(num_directions=0), "Invalid num_directions"),  # was "Invalid num"
])
def test_dashboards_name_the_argument_the_caller_gave(build, message):
    with pytest.raises(ValueError, match=re.escape(message)):
        build()


def test_sazo_step_slider_does_not_redraw_the_whole_run_trajectories(monkeypatch):
    """The step slider (continuous: a callback per tick while scrubbing) rebuilt the plotly JSON of all four
    figures, the trajectory figure too, which shows the whole run and does not change with the step: a third
    of a tick's Python time (10.5 → 7 ms per tick, median of 21 ticks, 2026-12-07)."""
    board = sw.sazo_dashboard(num_examples=32, dim=4, steps=30, log_every=3)
    trajectory, scatter, redraws = board.figures["trajectory"], board.figures["scatter"], []
    for name, figure in (("trajectory", trajectory), ("scatter", scatter)):
        redraw = figure._redraw
        monkeypatch.setattr(figure, "_redraw", lambda *a, name=name, redraw=redraw: redraws.append(name) or redraw(*a))
    drawn = [list(trace.y) for trace in trajectory.data]
    for step in (0, 12, 27):
        board.controls["step"].value = step
    assert redraws == ["scatter"] * 3, redraws
    assert "step 27" in scatter.layout.title.text
    board.controls["ema_decay"].value = 0.5                  # a new run: its trajectories are drawn
    assert redraws.count("trajectory") == 1 and [list(trace.y) for trace in trajectory.data] != drawn


def test_chi2_dashboard_reweights_its_draws_when_beta_moves(monkeypatch):
    """Moving β drew the same 200 × 20,000 χ²₁ values again (one seed) and ran the EMA row by row: 160 ms a
    move at n = 200 (48 ms now, most of it the histogram's redraw). The EMA is now one weighted sum, equal to
    the row-by-row recursion."""
    from sazo_lite.course.widgets import pictures

    board = sw.chi2_dashboard(examples=2000)
    drawn, draws = [], sazo_runs.chi2_draws
    monkeypatch.setattr(pictures, "chi2_draws", lambda *a, **k: drawn.append(a) or draws(*a, **k))
    board.controls["observations"].value = 50
    for beta in (0.5, 0.99, 0.0):
        board.controls["ema_decay"].value = beta
    assert len(drawn) == 1, drawn
    chi2 = draws(2000, 50, seed=0)
    for beta in (0.0, 0.5, 0.99):
        by_row = chi2[0].copy()
        for row in chi2[1:]:                                  # G ← β·G + (1−β)·d², from the first observation
            by_row = beta * by_row + (1 - beta) * row
        np.testing.assert_allclose(sazo_runs.ema_of_chi2(2000, observations=50, ema_decay=beta), by_row, rtol=1e-12)
    shown = float(re.search(r"β = 0: ([0-9.]+)", text(board.readout.value)).group(1))
    assert shown == pytest.approx(float(chi2[-1].var() / chi2[-1].mean() ** 2), abs=0.006)   # β = 0: the last δ²
    with pytest.raises(ValueError, match="draws"):
        sazo_runs.ema_of_chi2(2000, observations=50, ema_decay=0.5, draws=chi2[:10])


def test_epsilon_dashboard_keeps_its_u_curves_while_eps_and_precision_move(monkeypatch):
    """Every move of ε or of the precision recomputed both 41-point U curves, which depend only on κ and c:
    24.6 ms of a 25 ms move (6.3 ms now)."""
    board = sw.epsilon_dashboard()
    curves = [list(trace.y) for trace in board.figures["curve"].data[:2]]
    computed, error_vs_eps = [], two_point.error_vs_eps
    monkeypatch.setattr(two_point, "error_vs_eps", lambda *a, **k: computed.append(k["dtype"]) or error_vs_eps(*a, **k))
    board.controls["eps"].value = 1e-7
    board.controls["precision"].value = "float64"
    assert computed == [] and [list(trace.y) for trace in board.figures["curve"].data[:2]] == curves
    assert "float64" in board.readout.value and "1.0e-07" in board.readout.value
    board.controls["quartic"].value = 0.0                     # a new function: both curves
    assert computed == [torch.float32, torch.float64]
    board.controls["quartic"].value = 1.0                     # back: kept
    assert len(computed) == 2 and [list(trace.y) for trace in board.figures["curve"].data[:2]] == curves


def test_race_tune_counts_its_runs_in_the_status_line():
    """The status said "tuning η per method…" for the whole tuning (tens of seconds at the notebook's class-mode
    sizes, 60 runs) and the button's tooltip promised "a few seconds"."""
    board = sw.race_dashboard(seeds=2, steps=20, live_after=None)
    status = next(w for w in _descendants(board) if isinstance(w, __import__("ipywidgets").HTML)
                  and w.value.startswith("η uniform MeZO"))
    seen = []
    status.observe(lambda change: seen.append(change["new"]), names="value")
    board.tune()
    progress = [line for line in seen if line.startswith("tuning")]
    assert progress[0] == "tuning η per method… 0/24 runs (uniform MeZO)", progress[:2]
    assert progress[-1] == "tuning η per method… 23/24 runs (oracle p*)" and len(progress) == 24
    assert seen[-1].startswith("η uniform MeZO = ")            # the rates chosen, once done


def _descendants(widget):
    yield widget
    for child in getattr(widget, "children", ()):
        yield from _descendants(child)


def _plain_race(plain_row, plain_to_target):
    from sazo_lite.course.sazo_runs import RaceResult

    q = np.array([0.0, 20.0, 40.0])
    return RaceResult(q, {"uniform": np.array([[1.0, 0.5, 0.05]]), "sazo-plain": np.array([plain_row])}, 1.0, 0.1,
                      {"uniform": [40], "sazo-plain": plain_to_target}, lrs={"uniform": 0.01, "sazo-plain": 0.02})


def test_race_verdict_says_either_only_when_uniform_also_missed():
    """"uniform MeZO reached 10% of the initial gap in 40 queries (median); SAZO, plain rule did not reach it
    either": 'either' where uniform did reach it."""
    verdict = race_widgets.race_verdict(_plain_race([1.0, 0.8, 0.6], [None]))
    assert "uniform MeZO reached" in verdict and "SAZO, plain rule did not reach it." in verdict, verdict
    from dataclasses import replace

    missed = replace(_plain_race([1.0, 0.8, 0.6], [None]), to_target={"uniform": [None], "sazo-plain": [None]})
    assert "SAZO, plain rule did not reach it either." in race_widgets.race_verdict(missed)


def test_race_divergence_names_the_plain_rules_rate():
    """Notebook 05 races the plain rule ("sazo-plain") against uniform: a diverged plain run made
    ``race_divergence`` raise KeyError('sazo-plain')."""
    note = text(race_widgets.race_divergence(_plain_race([1.0, 50.0, np.nan], [None]), batch_size=1))
    assert "SAZO, plain rule diverged in its one seed" in note and "At η plain rule = 0.02" in note, note
    assert "lower η plain rule (try 0.0063)" in note


def test_a_race_without_its_rates_gets_the_advice_without_nan():
    """A ``RaceResult`` built without ``lrs`` (its default) made the red note read "At η SAZO = nan the steps are
    too large: lower η SAZO (try nan)"."""
    from sazo_lite.course.sazo_runs import RaceResult

    result = RaceResult(np.array([0.0, 20.0]), {"sazo": np.array([[1.0, np.nan]])}, 1.0, 0.1, {"sazo": [None]})
    for eps in (None, 1e-9):
        note = text(race_widgets.race_divergence(result, batch_size=1, eps=eps))
        assert "SAZO diverged in its one seed" in note and "= nan" not in note and "try nan" not in note, note
        assert re.search(r"lower(ing)? η SAZO\.", note), note


def test_race_readout_prints_the_one_plus_cv2_its_sigma_caption_asks_to_compare_with():
    """The σ slider's caption asks "How does the oracle's lead over uniform grow with σ (compare with 1 + CV²)?"
    and nothing on the page printed 1 + CV²."""
    from sazo_lite import variance

    board = sw.race_dashboard(seeds=1, steps=20, live_after=None)
    assert "compare with 1 + CV²" in race_widgets._QUESTIONS["heterogeneity"]
    for sigma in (1.5, 2.5):
        board.controls["heterogeneity"].value = sigma
        problem = sazo_runs.make_problem(heterogeneity=sigma, num_examples=64, dim=5)
        start = variance.uniform_gain(problem.norms(problem.initial_theta()))
        end = variance.uniform_gain(problem.norms(problem.optimum))
        assert f"σ = {sigma}: 1 + CV² of the norms" in text(board.readout.value)
        assert f"is {start:.2f} at θ₀ and {end:.2f} at θ*" in text(board.readout.value), text(board.readout.value)

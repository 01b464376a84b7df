"""The notebooks' claims, checked at the size fast mode runs them (SAZO_FAST=1, what CI and the book show).

Each test names the notebook cell whose printed numbers or caption it guards. They call the same
helpers the cells call, with the same arguments, and assert the ordering the text relies on.
"""
from __future__ import annotations

import json
import os
import re
from pathlib import Path

import numpy as np
import pytest
import torch

from sazo_lite import PlainSAZOSampler, SAZOSampler, variance
from sazo_lite.course import minibatches, problems
from sazo_lite.course import sazo_runs as E

ROOT = Path(__file__).resolve().parents[1]


# -- notebook 03: the late-training gain has two effects ----------------------------------------

def test_03_gain_falls_late_at_small_batch_and_rises_at_large_batch():
    """03 §'Where the gain lives': on its problem the gain falls at B = 1 and rises at B = 64."""
    problem = problems.LeastSquares(num_examples=256, dim=20, heterogeneity=1.5, seed=0)
    gains = minibatches.gain_along_path(problem, [1, 8, 64], [0.0, 0.5, 1.0])
    assert gains[1][-1] < gains[1][0]                 # effect 2: the current norms are less spread
    assert gains[64][-1] > 1.5 * gains[64][0]         # effect 1: the ∇F term vanishes ("roughly doubles")
    assert gains[8][-1] < gains[8][0]                 # the default B = 8: smaller late, as the text says
    ends = [float(g[-1]) for g in gains.values()]
    assert max(ends) - min(ends) < 1e-9               # at θ*, B no longer matters


def test_03_gain_figure_draws_one_line_per_batch_size():
    pytest.importorskip("plotly")
    from sazo_lite.course.widgets import gain_over_training_figure

    problem = problems.LeastSquares(num_examples=64, dim=5, heterogeneity=1.5, seed=0)
    fig = gain_over_training_figure(problem, batch_sizes=(1, 64), points=11)
    small, large = (np.asarray(trace.y) for trace in fig.data)
    assert [trace.name for trace in fig.data] == ["B = 1 (1 + CV²)", "B = 64"]
    assert np.all(small >= large - 1e-9)              # the gain shrinks with B at every t


# -- notebook 04: each robustness fix answers one failure ---------------------------------------

@pytest.fixture(scope="module")
def norms0():
    problem = E.make_problem("heterogeneous quadratic", heterogeneity=1.5, num_examples=128, dim=10, seed=0)
    return problem.norms(problem.initial_theta(torch.float64))


def _after(rule, norms, steps, shrink=1.0):
    """The notebook's ``after``: median over 5 seeds of V(p)/V(p*) after feeding ``rule``."""
    return float(np.median([E.feed_sampler(E.rule_sampler(rule, len(norms), seed=s), norms, steps=steps,
                                           batch_size=8, shrink=shrink, seed=s)[-1] for s in range(5)]))


def test_04_61_the_plain_rules_start_depends_on_units_and_the_prior_does_not(norms0):
    uniform = variance.uniform_gain(norms0)
    plain = {scale: _after("plain", scale * norms0, 20) for scale in (0.01, 1.0, 100.0)}
    prior = {scale: _after("prior", scale * norms0, 20) for scale in (0.01, 1.0, 100.0)}
    assert plain[100.0] > uniform                     # starved unseen examples: worse than uniform
    assert plain[0.01] > 2 * prior[0.01]              # over-sampled unseen examples: near uniform
    assert max(prior.values()) - min(prior.values()) < 1e-6 * max(prior.values())   # unit-free
    assert prior[100.0] < uniform / 2


def test_04_62_blending_pays_after_a_few_observations(norms0):
    assert _after("blend", norms0, 48) < _after("prior", norms0, 48)
    assert _after("blend", norms0, 160) < _after("prior", norms0, 160)


def test_04_63_the_level_pays_only_when_the_norms_shrink(norms0):
    frozen = (_after("blend", norms0, 200), _after("level", norms0, 200))
    assert abs(frozen[0] - frozen[1]) < 0.1 * frozen[0]          # "a tie within seed noise"
    for shrink in (0.99, 0.98):
        assert _after("level", norms0, 200, shrink) < _after("blend", norms0, 200, shrink)


def test_04_64_abs_beats_square(norms0):
    for steps in (48, 160, 480):
        assert _after("robust", norms0, steps) < _after("level", norms0, steps)


def test_04_decay_table_thresholds():
    """04 §6.2: β is reached after about β/(1−β) − c observations (8 for 0.9, 98 for 0.99)."""
    for beta, threshold in ((0.9, 8), (0.99, 98)):
        decay = SAZOSampler(4, ema_decay=beta).decay(np.arange(200))
        assert int(np.argmax(decay >= beta - 1e-12)) == threshold


def test_04_65_ladder_robust_beats_plain_and_uniform_on_homogeneous_data():
    """04 §6.5 and the dashboard's "homogeneous" presets: the plain rule ≈ uniform, robust below."""
    homogeneous = E.make_problem("homogeneous quadratic", num_examples=128, dim=10, seed=0)
    table = E.rule_ladder(homogeneous, steps=150, seeds=(0, 1), rules=("plain", "robust"), batch_size=8,
                          lr=0.01, log_every=10)
    assert table["robust"] < table["plain"]
    assert table["robust"] < table["uniform"]
    heterogeneous = E.make_problem("heterogeneous quadratic", heterogeneity=1.5, num_examples=128, dim=10, seed=0)
    table = E.rule_ladder(heterogeneous, steps=150, seeds=(0, 1), rules=("plain", "prior", "robust"), batch_size=8,
                          lr=0.01, log_every=10)
    assert table["robust"] < table["plain"] < table["prior"]     # "the prior alone did worse than the plain rule"
    assert table["plain"] < table["uniform"] / 2


# -- the ladder's samplers and the decay read from them --------------------------------------------

def test_rule_sampler_rungs_are_the_library_samplers():
    assert type(E.rule_sampler("plain", 8)) is PlainSAZOSampler
    robust = E.rule_sampler("robust", 8, ema_decay=0.8, uniform_mix=0.2)
    assert type(robust) is SAZOSampler and robust.statistic == "abs"
    assert (robust.ema_decay, robust.uniform_mix, robust.prior_strength) == (0.8, 0.2, 1.0)
    assert E.rule_sampler("level", 8).statistic == "square"
    assert E.rule_sampler("prior", 8, ema_decay=0.9).prior_strength == pytest.approx(9.0)
    with pytest.raises(ValueError, match="rule"):
        E.rule_sampler("fancy", 8)


def test_prior_rung_is_the_plain_ema_started_from_the_prior():
    """"+ prior" keeps the plain rule's fixed β: its count-based decay never drops below β."""
    sampler = E.rule_sampler("prior", 8, ema_decay=0.9)
    np.testing.assert_allclose(sampler.decay(np.arange(1, 50)), 0.9)
    assert sampler.decay([0])[0] == 0.0            # the very first observation, before any data: no prior
    sampler.update(torch.tensor([3]), torch.tensor([1.0]))
    np.testing.assert_allclose(sampler.decay(np.arange(50)), 0.9)   # once data exist, unseen ones blend too


@pytest.mark.parametrize("prior_strength", [1.0, 0.0, 3.0])
def test_count_decay_is_the_decay_the_sampler_applies(prior_strength):
    """Recover each update's decay from the sampler's own state and compare with the sampler's ``decay``."""
    sampler = SAZOSampler(4, ema_decay=0.9, prior_strength=prior_strength, seed=0)
    sampler.update(torch.arange(4), torch.tensor([1.0, 2.0, 0.5, 1.5]))   # every example seen once
    rng = np.random.default_rng(0)
    for _ in range(30):
        count = int(sampler.counts[0])
        old = float(sampler.estimates[0])
        diff = float(rng.normal()) * 2.0
        sampler.update(torch.tensor([0]), torch.tensor([diff]))
        observed = abs(diff) / sampler.level
        new = float(sampler.estimates[0])
        decay = (new - observed) / (old - observed)
        assert decay == pytest.approx(float(sampler.decay([count])[0]), abs=2e-5)


def test_plain_count_decay_is_beta():
    np.testing.assert_allclose(PlainSAZOSampler(4, ema_decay=0.7).decay([0, 5, 500]), 0.7)


def test_feed_sampler_matches_a_hand_loop():
    norms = torch.linspace(0.5, 3.0, 12, dtype=torch.float64)
    ratios = E.feed_sampler(SAZOSampler(12, seed=3), norms, steps=5, batch_size=4, shrink=0.9, seed=7)
    sampler, generator = SAZOSampler(12, seed=3), torch.Generator().manual_seed(7)
    expected = [variance.variance_ratio(norms, sampler.probs)]
    for t in range(5):
        indices, _ = sampler.sample(4)
        current = norms * 0.9 ** (t + 1)
        sampler.update(indices, current[indices] * torch.randn(4, generator=generator, dtype=torch.float64))
        expected.append(variance.variance_ratio(current, sampler.probs))
    np.testing.assert_allclose(ratios, expected)


# -- the dashboards at their defaults show what their captions say --------------------------------

widgets = pytest.importorskip("sazo_lite.course.widgets")


def _buttons(dash):
    def find(box):
        for child in getattr(box, "children", ()):
            if hasattr(child, "buttons"):
                return child
            found = find(child)
            if found is not None:
                return found
    return find(dash).buttons


def _mean_ratios(readout: str) -> tuple[float, float]:
    found = re.search(r"mean over the run: SAZO ([0-9.]+), uniform ([0-9.]+)", readout)
    return float(found.group(1)), float(found.group(2))


def test_04_dashboard_presets_show_their_lessons():
    dash = widgets.sazo_dashboard(steps=100)          # the notebook's fast-mode call
    buttons = _buttons(dash)
    sazo, uniform = _mean_ratios(dash.readout.value)
    assert sazo < uniform / 2                          # defaults (σ = 1.5): far below uniform
    buttons["homogeneous data"].click()
    sazo, uniform = _mean_ratios(dash.readout.value)
    assert sazo > uniform                              # the plain rule loses where there is little to gain
    buttons["homogeneous, robust rule"].click()
    sazo, uniform = _mean_ratios(dash.readout.value)
    assert sazo < uniform                              # the robust rule does not
    buttons["ε too small"].click()
    assert float(re.search(r"Spearman ρ = (-?[0-9.]+)", dash.readout.value).group(1)) < 0.2
    labels = [b.description for b in buttons.values()]
    assert "defaults" in labels and all("…" not in label for label in labels)


def test_04_dashboard_rule_toggle_has_every_rung():
    dash = widgets.sazo_dashboard(num_examples=32, dim=4, steps=20)
    assert [value for _, value in dash.controls["rule"].options] == list(E.RULES)
    axis = dash.figures["scatter"].layout.yaxis.title.text
    assert "sqrt" not in axis and "√G" not in axis    # the robust rule's scores are not √G


def test_05_paths_dashboard_ranks_the_final_gaps_as_the_answer_says():
    dash = widgets.paths_dashboard()
    assert dash.state["order"][-1] == "uniform"        # uniform ends farthest from θ*
    assert dash.state["finals"]["sazo"] <= dash.state["finals"]["oracle"] * 1.5   # "as close as the oracle"
    assert dash.state["jumps"]["oracle"] * 3 < dash.state["jumps"]["uniform"]     # "about 5× smaller"
    _buttons(dash)["robust rule"].click()
    assert dash.state["jumps"]["sazo"] > dash.state["jumps"]["uniform"]            # "the longest of all"


def test_05_dashboard_headline_is_the_tuned_race():
    """Opened with race 1's tuned rates (float64, same seeds and steps) it reproduces race 1's table."""
    problem = E.make_problem("heterogeneous quadratic", heterogeneity=1.5, num_examples=64, dim=5)
    lrs = {"uniform": 0.01, "sazo": 0.01, "oracle": 0.04}
    settings = dict(seeds=(0, 1), steps=60, batch_size=4, log_every=10, target_fraction=0.1)
    careful = E.race(problem, lr=lrs, **settings)
    dash = widgets.race_dashboard(seeds=2, steps=60, lrs=lrs, dtype=torch.float64)
    shown = dash.result()
    for method in E.SAMPLERS:
        assert shown.to_target[method] == careful.to_target[method]
    assert widgets.race_verdict(shown) == widgets.race_verdict(careful)


def test_05_lower_bounds_are_labelled():
    from sazo_lite.course.widgets.race import race_table_html

    problem = E.make_problem("heterogeneous quadratic", heterogeneity=1.5, num_examples=64, dim=5)
    result = E.race(problem, lr={"uniform": 0.0025, "sazo": 0.01, "oracle": 0.04}, seeds=(0,), steps=40,
                    batch_size=4, target_fraction=0.1)
    assert result.median_to_target("uniform") == np.inf and np.isfinite(result.median_to_target("oracle"))
    assert "lower bound" in race_table_html(result)
    verdict = widgets.race_verdict(result)
    assert "did not reach" in verdict and "lower bound" in verdict


# -- arithmetic and ranges the text states --------------------------------------------------------

def _source(name: str) -> str:
    cells = json.loads((ROOT / "notebooks" / name).read_text())["cells"]
    return "\n".join("".join(c["source"]) for c in cells)


def test_01_enough_directions_for_ten_percent_fit_on_the_slider():
    """01: within 10% needs about 300 directions (√(3/q) = 0.1): the q slider must reach it."""
    dash = widgets.estimator_dashboard()
    needed = 3 / 0.1 ** 2
    assert dash.controls["q"].max >= needed
    assert "about 300 directions" in _source("01_zeroth_order_gradients.ipynb")


def test_05_observations_per_example_is_b_t_over_n():
    text = _source("05_the_race.ipynb")
    assert "2\\cdot600\\cdot8/569" not in text
    assert "8\\cdot600/569 \\approx 8.4" in text and abs(8 * 600 / 569 - 8.4) < 0.05


def test_no_course_page_cites_a_document_students_cannot_open():
    pages = [*sorted((ROOT / "notebooks").glob("0[1-57]_*.ipynb")),
             *[p for p in sorted((ROOT / "notebooks" / "solutions").glob("*.md")) if not p.name.startswith("06")],
             ROOT / "notebooks" / "README.md", ROOT / "notebooks" / "algorithm.md"]
    for page in pages:
        text = page.read_text().lower()
        for phrase in ("design note", "design page", "shared/design"):
            assert phrase not in text, f"{page.name} cites {phrase!r}"


def test_notebooks_link_the_algorithm_page():
    for page in sorted((ROOT / "notebooks").glob("0[1-57]_*.ipynb")):
        assert "](algorithm.md)" in page.read_text(), page.name


# -- labels are not cut off ("training progr…", "radema…") -----------------------------------------

_PX_PER_CHAR = 7.2   # ipywidgets' 13px sans-serif, a generous average


def _px(value) -> float | None:
    match = re.fullmatch(r"([0-9.]+)px", str(value or ""))
    return float(match.group(1)) if match else None


_BUILDERS = {
    "estimator": lambda: widgets.estimator_dashboard(), "epsilon": lambda: widgets.epsilon_dashboard(),
    "dimension": lambda: widgets.dimension_dashboard(), "importance": lambda: widgets.importance_dashboard(trials=200),
    "unbiased": lambda: widgets.unbiased_dashboard(trials=200), "batch_gain": lambda: widgets.batch_gain_dashboard(),
    "histogram": lambda: widgets.norms_histogram_dashboard(), "bars": lambda: widgets.batch_bars_dashboard(),
    "chi2": lambda: widgets.chi2_dashboard(), "paths": lambda: widgets.paths_dashboard(steps=10),
    "sazo": lambda: widgets.sazo_dashboard(num_examples=32, dim=4, steps=10),
    "race": lambda: widgets.race_dashboard(seeds=1, steps=10), "memory": lambda: widgets.memory_dashboard(),
}


@pytest.mark.parametrize("name", list(_BUILDERS))
def test_control_labels_fit_their_width(name):
    import ipywidgets

    dash = _BUILDERS[name]()
    for key, control in dash.controls.items():
        if isinstance(control, (ipywidgets.Checkbox, ipywidgets.Button)):
            continue
        width = _px(getattr(control.style, "description_width", None))
        if width is not None and control.description:
            assert len(control.description) * _PX_PER_CHAR <= width, f"{name}.{key}: {control.description!r} is cut off"
        button = _px(getattr(control.style, "button_width", None))
        if button is not None:
            for label in control._options_labels:
                fits = len(label) * _PX_PER_CHAR + 20 <= button   # + the button's padding
                assert fits, f"{name}.{key}: button {label!r} is cut off"


def test_02_per_query_a_larger_batch_does_not_help():
    """02's cell under the dashboard (fast budget): B = 128 far behind, B = 1 no worse than B = 16."""
    from sazo_lite.course import mezo_vs_sgd

    problem = problems.LogisticRegression.from_sklearn("breast_cancer")
    gaps = {}
    for batch_size in (1, 16, 128):
        steps = 3200 // (2 * batch_size)
        run = mezo_vs_sgd.race_mezo_sgd(problem, steps=steps, batch_size=batch_size, lr_zo=0.02, log_every=steps,
                                        methods=("MeZO",))["MeZO"]
        gaps[batch_size] = run["gap"][-1]
    assert gaps[128] > 2 * gaps[16] and gaps[1] <= gaps[16]
    text = _source("02_mezo_in_place.ipynb")
    assert "3,000–9,000 queries" not in text and "budget // (2 * batch_size)" in text


# -- one palette, complete presets -----------------------------------------------------------------

def test_a_sampler_has_one_colour_in_every_dashboard():
    from sazo_lite.course.widgets._common import SAMPLER_COLORS, SAMPLER_LABELS

    figures = [widgets.race_dashboard(seeds=1, steps=10).figures["race"],
               widgets.paths_dashboard(steps=5).figures["paths"],
               widgets.sazo_dashboard(num_examples=16, dim=3, steps=10).figures["variance"]]
    seen = 0
    for figure in figures:
        for trace in figure.data:
            for method in ("uniform", "sazo", "oracle"):
                if trace.name in (method, SAMPLER_LABELS[method]) and trace.line.color is not None:
                    assert trace.line.color == SAMPLER_COLORS[method], (trace.name, trace.line.color)
                    seen += 1
    assert seen >= 9


@pytest.mark.parametrize("name", ["estimator", "epsilon", "importance", "batch_gain", "bars", "chi2", "paths", "sazo"])
def test_every_preset_is_a_complete_regime(name):
    """Pressing presets in any order: each leaves exactly its own regime (nothing leaks from the last)."""
    dash = _BUILDERS[name]()
    buttons = _buttons(dash)
    assert "defaults" in buttons
    for label in [*buttons, *reversed(list(buttons))]:
        buttons[label].click()
        for control, value in buttons[label].values.items():
            assert dash.controls[control].value == pytest.approx(value) if isinstance(value, float) else \
                dash.controls[control].value == value, (label, control)


# -- every chapter: the numbers its prose states are the numbers its cells print ---------------------
#
# The rule is sazo_lite.course.claims.unprinted: a number in a markdown cell must be printed by the same
# notebook run in fast mode (make test's nbmake copies, SAZO_BOOK_EXECUTED), or stand in a sentence that
# names the class-mode run and be printed by the stored class run (benchmarks/reference/class_runs/,
# python -m benchmarks.class_runs), or be a setting the code shows, or be listed here with its reason.
# Notebook 06 has its own test (test_course_claims_06.py: the same rule, no exemptions).

from sazo_lite.course import claims  # noqa: E402

CLASS_RUNS = ROOT / "benchmarks" / "reference" / "class_runs"
DERIVED = {   # stated figures that no run prints, each with the reason it may stand in the text
    "01_zeroth_order_gradients": {
        "1.7": "√((d+1)/q) = √3 at d = 2, q = 1", "0.17": "√(3/q) at q = 100",
        "2.5": "the best ε (u|f|/M)^(1/3) ≈ 10^-2.5 in float32, derived", "1000": "the offset preset c = 1000",
        "512": "the d = 512 preset", "511": "d − 1 at d = 512", "513": "d + 1 at d = 512",
    },
    "02_mezo_in_place": {
        "26": "13·10⁹ parameters × 2 bytes", "569": "the data set's size (scikit-learn's breast cancer)",
        "30": "the data set's features", "31": "its features and a bias",
    },
    "03_importance_sampling_and_the_oracle": {},
    "04_sazo_estimating_norms": {},
    "05_the_race": {
        "16": "the paths dashboard's 'large batch' preset (its button)",
    },
    "07_memory_on_device": {
        "34": "Korthikanti et al.'s formula, quoted", "0.6": "the paper's BP model size, quoted",
        "75%": "the paper's BP accuracy, quoted", "82%": "the paper's ZO accuracy, quoted",
        "20": "the question's scenario (20 minutes on the device)",
    },
}
CHECKED = sorted(DERIVED)


def _executed(name: str) -> dict:
    """Chapter ``name`` as make test's nbmake run left it (fast mode), refusing a copy of other code."""
    folder = os.environ.get("SAZO_BOOK_EXECUTED")
    if not folder:
        pytest.skip("needs the fast-mode runs of the notebooks: make test sets SAZO_BOOK_EXECUTED")
    run = claims.load(Path(folder) / f"{name}.ipynb")
    assert claims.code_digest(run) == claims.code_digest(claims.load(ROOT / "notebooks" / f"{name}.ipynb")), \
        f"{folder}/{name}.ipynb does not hold the committed code: run it again"
    return run


def _class_run(name: str, notebook: dict) -> str | None:
    path = CLASS_RUNS / f"{name}.txt"
    if not path.exists():
        return None
    head, _, printout = path.read_text().partition("\n---\n")
    assert f"code: {claims.code_digest(notebook)}" in head, \
        f"{path.name} was printed by other code: python -m benchmarks.class_runs {name}"
    return printout


@pytest.mark.parametrize("name", CHECKED)
def test_every_number_a_chapter_states_is_printed(name):
    notebook = claims.load(ROOT / "notebooks" / f"{name}.ipynb")
    missing = claims.unprinted(notebook, _executed(name), _class_run(name, notebook), DERIVED[name])
    assert not missing, f"{name}: numbers the text states and no run prints:\n" + "\n".join(missing)


@pytest.mark.parametrize("name", CHECKED)
def test_each_exemption_is_still_needed(name):
    """A derived figure that the text no longer states, or that a run now prints, leaves the list."""
    notebook = claims.load(ROOT / "notebooks" / f"{name}.ipynb")
    stated = {token.rstrip("×% ") for c in notebook["cells"] if c["cell_type"] == "markdown"
              for token, *_ in claims.stated_numbers("".join(c["source"]))}
    for token in DERIVED[name]:
        assert token.rstrip("×% ") in stated, f"{name}: {token!r} is exempt but no longer stated"


# -- the rule, tested on small notebooks and on mutants -------------------------------------------------

def _notebook(markdown: list[str], printed: list[str], code: str = "x = 1") -> tuple[dict, dict]:
    cells = [{"cell_type": "markdown", "source": text} for text in markdown]
    ran = [{"cell_type": "code", "source": code, "outputs": [{"output_type": "stream", "name": "stdout",
                                                              "text": text}]} for text in printed]
    return {"cells": cells + [{"cell_type": "code", "source": code, "outputs": []}]}, {"cells": cells + ran}


def test_a_number_printed_at_the_stated_precision_passes_and_any_other_fails():
    notebook, run = _notebook(["The oracle is about 10.5× better; uniform needs 1,200 queries."],
                              ["gain 10.512, queries 1200"])
    assert claims.unprinted(notebook, run) == []
    for wrong in ("10.6×", "10.49×", "1,300"):
        mutant, _ = _notebook([f"The oracle is about {wrong} better; uniform needs 1,200 queries."], [])
        assert claims.unprinted(mutant, run), wrong


def test_class_mode_numbers_are_read_in_the_stored_class_run():
    notebook, run = _notebook(["Fast mode prints 2.7×. The class-mode run measured 1.29× fewer queries."],
                              ["> 2.7× fewer"])
    assert claims.unprinted(notebook, run, class_run="SAZO needed 558: 1.29× fewer") == []
    assert claims.unprinted(notebook, run, class_run="SAZO needed 558: 1.31× fewer")     # stale class run
    assert claims.unprinted(notebook, run)                                                 # no class run
    moved, _ = _notebook(["Fast mode prints 1.29×. The class-mode run measured 2.7×."], [])
    assert claims.unprinted(moved, run, class_run="1.29×")          # each number is read in its own run


def test_settings_counts_code_links_and_exercises_are_not_claims():
    text = ("# 05 · Race 2.5\nWith `pick(600, 150)` steps, 3 seeds and B = 64 (see [lab 4](x_4.5.md), section 6.2). "
            "\n\n## Exercises\n1. Try σ = 3.7.")
    notebook, run = _notebook([text], [""], code="steps = pick(600, 150); B = 64")
    assert claims.unprinted(notebook, run) == []
    assert claims.unprinted(*_notebook([text.replace("B = 64", "B = 65")], [""], code="B = 64"))
    assert [t for t, *_ in claims.stated_numbers("a figure ≈ 25× and 12.5% saved")] == ["25×", "12.5%"]


def test_scripts_and_figure_data_are_not_printouts():
    notebook, _ = _notebook(["The median is 4.17."], [])
    figure = {"output_type": "display_data", "data": {"application/vnd.plotly.v1+json": {"y": [4.17]},
                                                      "text/plain": "Figure 4.17"}}
    html = {"output_type": "display_data", "data": {"text/html": "<script>var y = [4.17];</script><b>ok</b>"}}
    run = {"cells": notebook["cells"][:1] + [{"cell_type": "code", "source": "", "outputs": [figure, html]}]}
    assert claims.unprinted(notebook, run) == ["cell 0: '4.17' is not printed by the run"]


@pytest.mark.parametrize("name", ["03_importance_sampling_and_the_oracle", "05_the_race"])
def test_a_chapter_whose_text_states_an_unprinted_number_fails(name):
    """Mutants of a real chapter and its real run: a changed answer, a cleared output, a class figure."""
    notebook = claims.load(ROOT / "notebooks" / f"{name}.ipynb")
    run = _executed(name)
    derived = DERIVED[name]
    assert claims.unprinted(notebook, run, _class_run(name, notebook), derived) == []
    answer = next(i for i, c in enumerate(notebook["cells"]) if c["cell_type"] == "markdown" and "Answer" in
                  "".join(c["source"]))
    stated = "".join(notebook["cells"][answer]["source"])
    mutant = json.loads(json.dumps(notebook))
    mutant["cells"][answer]["source"] = stated + "\nOn this run the oracle needed 7.77× fewer queries.\n"
    assert claims.unprinted(mutant, run, _class_run(name, notebook), derived)
    mutant["cells"][answer]["source"] = stated + "\nThe class-mode run measured 7.77× fewer queries.\n"
    assert claims.unprinted(mutant, run, _class_run(name, notebook), derived)
    if name.startswith("03"):                  # the cells that print what the answers quote, cleared
        silent = json.loads(json.dumps(run))
        for cell in silent["cells"]:
            if cell["cell_type"] == "code" and "Table(" in "".join(cell["source"]):
                cell["outputs"] = []
        assert claims.unprinted(notebook, silent, _class_run(name, notebook), derived)
    else:                                      # a class run that measured other numbers than the text quotes
        stale = _class_run(name, notebook).replace("1.29×", "1.31×").replace("4.50×", "4.38×")
        assert claims.unprinted(notebook, run, stale, derived)


def test_05_race_1_runs_until_uniform_arrives_in_fast_mode():
    """05's race 1 prints a factor, not a lower bound, in the mode the book shows."""
    run = _executed("05_the_race")
    cell = next(c for c in run["cells"] if c["cell_type"] == "code" and "hetero = tuned_race" in "".join(c["source"]))
    printed = "".join("".join(o.get("text", "")) for o in cell["outputs"])
    assert "uniform MeZO reached" in printed and "lower bound" not in printed, printed


def test_race_figure_fits_the_column_and_marks_divergence():
    problem = E.make_problem("heterogeneous quadratic", heterogeneity=1.5, num_examples=64, dim=5)
    calm = E.race(problem, lr=0.01, seeds=(0,), steps=40, batch_size=4, progress=False)
    wild = E.race(problem, lr={"uniform": 0.08, "sazo": 0.01, "oracle": 0.01}, seeds=(0, 1), steps=60,
                  batch_size=4, progress=False)
    for result in (calm, wild):
        fig = widgets.race_figure(result, title="a title")
        assert fig.layout.width <= 680 and fig.layout.legend.orientation == "h"
        low, high = fig.layout.yaxis.range
        assert high == pytest.approx(np.log10(3.0))                 # not a spike to 1000× the initial gap
        assert low <= np.log10(result.target / result.initial_gap)  # the target line is on the plot
    assert not widgets.race_figure(calm).layout.annotations
    marks = [a.text for a in widgets.race_figure(wild).layout.annotations]
    assert marks == ["uniform MeZO diverged"], marks

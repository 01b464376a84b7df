"""Round 12 on the course layer: the helpers given other problems, other scales and wrong arguments.

Each test names what the helper did before (a silent wrong result, or an error naming no argument or another
one) and checks what it does now.
"""
from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from sazo_lite.course import minibatches, mezo_vs_sgd, problems, sazo_runs, two_point


def _quadratic(num_examples: int = 16, dim: int = 3, **kwargs) -> problems.LeastSquares:
    return problems.LeastSquares(num_examples, dim, heterogeneity=1.0, **kwargs)


# -- notebook 02's race: MeZO against SGD ---------------------------------------------------------------

@pytest.mark.parametrize("lr_sgd", [-1.0, math.nan])
def test_mezo_vs_sgd_refuses_an_sgd_rate_that_climbs_or_is_nan(lr_sgd):
    """lr_sgd = −1 climbed the loss (gap 2.5 → 6.9e4 in 5 steps) and NaN gave NaN gaps, without a word."""
    with pytest.raises(ValueError, match="Invalid lr_sgd"):
        mezo_vs_sgd.race_mezo_sgd(_quadratic(), steps=5, log_every=5, lr_sgd=lr_sgd)


def test_mezo_vs_sgd_names_the_rate_and_the_problem_the_caller_gave():
    with pytest.raises(ValueError, match="Invalid lr_zo"):                  # was "Invalid lr" (MeZO's name)
        mezo_vs_sgd.race_mezo_sgd(_quadratic(), steps=5, log_every=5, lr_zo=math.nan)
    with pytest.raises(ValueError, match="Invalid problem: .*expected a FiniteSumProblem"):   # was AttributeError
        mezo_vs_sgd.race_mezo_sgd("breast_cancer", steps=5, log_every=5)


# -- notebook 05: divergence rule, paths, race results -----------------------------------------------------

@pytest.mark.parametrize("factor", [0.5, 1.0, 0.0, -1.0, math.nan])
def test_first_divergence_refuses_a_factor_that_calls_the_start_diverged(factor):
    """A factor ≤ 1 (or NaN) put the limit at or below the starting gap: a run that only fell was 'diverged at 0'."""
    with pytest.raises(ValueError, match="Invalid factor"):
        sazo_runs.first_divergence([1.0, 0.5, 0.25], factor=factor)
    assert sazo_runs.first_divergence([1.0, 0.5, 0.25], factor=math.inf) is None   # inf: no limit, as before
    assert sazo_runs.first_divergence([1.0, 0.5, 3.0], factor=2.0) == 2


def test_sampler_paths_refuses_a_name_in_place_of_a_problem():
    with pytest.raises(ValueError, match="Invalid problem: .*expected a FiniteSumProblem"):   # was AttributeError
        sazo_runs.sampler_paths("breast_cancer", steps=3)


def test_race_result_names_a_method_or_baseline_it_did_not_run():
    result = sazo_runs.race(_quadratic(), samplers=("sazo",), seeds=(0,), steps=5)
    with pytest.raises(ValueError, match=r"Invalid baseline: 'uniform' \(this race ran \('sazo',\)\)"):
        result.speedup("sazo")                                             # was KeyError: 'uniform'
    with pytest.raises(ValueError, match="Invalid method: 'oracle'"):
        result.median_to_target("oracle")
    itself = result.speedup("sazo", baseline="sazo")                      # a method it ran still compares
    assert itself == 1.0 or math.isnan(itself)


@pytest.mark.parametrize("kwargs", [dict(samplers=("uniform", "uniform")), dict(seeds=(0, 0))])
def test_race_refuses_a_repeated_sampler_or_seed(kwargs):
    """A repeat ran twice and counted twice in every median (uniform's to_target held 2 entries for 1 seed)."""
    name = next(iter(kwargs))
    with pytest.raises(ValueError, match=f"Invalid {name}: .*at most once"):
        sazo_runs.race(_quadratic(), steps=5, **{"seeds": (0,), **kwargs})


def test_race_names_a_target_fraction_that_is_not_a_number():
    with pytest.raises(ValueError, match="Invalid target_fraction"):        # was TypeError: '<' not supported
        sazo_runs.race(_quadratic(), seeds=(0,), steps=5, target_fraction="0.1")


# -- seeds: a float or an out-of-range int is named, not torch's RuntimeError ------------------------------

@pytest.mark.parametrize("call", [
    lambda seed: minibatches.sample_minibatches(torch.full((4,), 0.25), 2, 3, seed=seed),
    lambda seed: sazo_runs.feed_sampler(sazo_runs.rule_sampler("plain", 4), [1.0, 2.0, 3.0, 4.0], steps=2,
                                        batch_size=2, seed=seed),
    lambda seed: two_point.relative_error_monte_carlo(3, 2, seed=seed),
    lambda seed: problems.LeastSquares(8, 2, seed=seed),
    lambda seed: problems.LogisticRegression(torch.randn(6, 2), torch.tensor([1.0, -1.0] * 3), seed=seed),
])
@pytest.mark.parametrize("seed", [0.5, 2 ** 70])
def test_a_seed_torch_cannot_take_is_a_value_error_naming_seed(call, seed):
    with pytest.raises(ValueError, match="Invalid seed"):   # was RuntimeError ("expected a long", "Overflow")
        call(seed)


# -- notebook 01: the two-point helpers name their own arguments ---------------------------------------------

def test_two_point_helpers_name_the_argument_the_caller_gave():
    bowl = lambda x: two_point.bowl_loss(x, [1.0, 3.0])                  # noqa: E731
    with pytest.raises(ValueError, match="Invalid num_directions"):       # was "Invalid num" (random_directions')
        two_point.zo_gradient(bowl, [1.0, 2.0], 1e-3, 0)
    with pytest.raises(ValueError, match="Invalid num_directions"):
        two_point.error_vs_eps(bowl, [1.0, 6.0], [1.0, 2.0], [1e-3], num_directions=0)
    with pytest.raises(ValueError, match="Invalid trials"):               # was "Invalid num": trials × q
        two_point.relative_error_monte_carlo(3, 2, trials=0)
    with pytest.raises(ValueError, match="Invalid eps_grid"):             # was TypeError: 'float' not iterable
        two_point.error_vs_eps(bowl, [1.0, 6.0], [1.0, 2.0], 1e-3)
    with pytest.raises(ValueError, match=r"Invalid grad: shape \(3,\)"):  # was RuntimeError: size mismatch
        two_point.error_vs_eps(bowl, [1.0, 6.0, 0.0], [1.0, 2.0], [1e-3])
    curve = two_point.error_vs_eps(bowl, [1.0, 6.0], [1.0, 2.0], [1e-3, 1e-1])   # what the notebook passes
    assert curve.shape == (2,) and bool(torch.isfinite(curve).all())


# -- notebook 03: the oracle's gain -------------------------------------------------------------------------

@pytest.mark.parametrize("scale", [1e-200, 1e-160, 1e160, 1e200])
def test_gain_vs_batch_does_not_depend_on_the_units_of_the_norms(scale):
    """The ratio is scale-free; norms of 1e-200 raised ZeroDivisionError and 1e200 gave NaN (inf/inf)."""
    grads = _quadratic(64, 5).per_example_grads(torch.full((5,), 0.3, dtype=torch.float64))
    norms, full = grads.norm(dim=1), float(grads.mean(0).norm())
    plain = minibatches.gain_vs_batch(norms, full, 5, [1, 8, 64])
    scaled = minibatches.gain_vs_batch(norms * scale, full * scale, 5, [1, 8, 64])
    torch.testing.assert_close(scaled, plain, rtol=1e-12, atol=0)
    assert plain[0] > plain[1] > plain[2] > 1.0


def test_gain_vs_batch_refuses_a_full_gradient_norm_no_set_of_these_norms_can_have():
    """‖∇F‖ ≤ mean ‖∇f_i‖: ‖∇F‖² passed for ‖∇F‖ (here 4 for norms averaging 3) gave a gain without a word."""
    with pytest.raises(ValueError, match="Invalid full_grad_norm: 4 .*<= the mean of the norms"):
        minibatches.gain_vs_batch([1.0, 5.0], 4.0, 2, [1, 8])
    assert minibatches.gain_vs_batch([1.0, 5.0], 3.0, 2, [1]).tolist() == pytest.approx([1 + 4 / 9])


def test_gain_helpers_read_a_generator_of_batch_sizes_once_and_name_a_single_number():
    """gain_along_path checked a generator of batch sizes by reading it, then found it empty and returned {}."""
    problem = _quadratic(32, 4)
    gains = minibatches.gain_along_path(problem, (b for b in (1, 8)), [0.0, 1.0])
    assert sorted(gains) == [1, 8]
    with pytest.raises(ValueError, match="Invalid progress: 0.5 .*expected a sequence"):   # was TypeError
        minibatches.gain_along_path(problem, [1], 0.5)
    with pytest.raises(ValueError, match="Invalid batch_sizes: 8 .*expected a sequence"):  # was TypeError
        minibatches.gain_vs_batch([1.0, 2.0], 0.5, 2, 8)
    with pytest.raises(ValueError, match="Invalid batch_sizes: expected at least one"):     # was an empty tensor
        minibatches.gain_vs_batch([1.0, 2.0], 0.5, 2, [])


def test_gain_helpers_refuse_a_name_in_place_of_a_problem_and_the_figure_draws_a_generators_batch_sizes():
    from sazo_lite.course.widgets import gain_over_training_figure

    with pytest.raises(ValueError, match="Invalid problem: .*expected a FiniteSumProblem"):   # was AttributeError
        minibatches.gain_along_path("breast_cancer", [1], [0.0])
    with pytest.raises(ValueError, match="Invalid problem: .*expected a FiniteSumProblem"):
        gain_over_training_figure("breast_cancer")
    fig = gain_over_training_figure(_quadratic(32, 4), batch_sizes=(b for b in (1, 64)), points=3)
    assert [trace.name for trace in fig.data] == ["B = 1 (1 + CV²)", "B = 64"]   # was no line at all


def test_memory_figure_refuses_bytes_without_names():
    from sazo_lite.course.widgets import memory_figure

    with pytest.raises(ValueError, match="Invalid measurements: .*dict .*got list"):   # was AttributeError: items
        memory_figure([2 ** 20, 5 * 2 ** 20])


# -- docstrings name what runs -------------------------------------------------------------------------------

def _has(module, attribute: str) -> bool:
    """An attribute of ``module``, or a submodule its package does not import (benchmarks.llm_queries)."""
    import importlib.util

    if hasattr(module, attribute):
        return True
    try:
        return importlib.util.find_spec(f"{module.__name__}.{attribute}") is not None
    except ModuleNotFoundError:   # ``module`` is not a package
        return False


def test_course_docstrings_name_modules_and_functions_that_exist():
    """The paths dashboard's docstrings sent readers to ``experiments.sampler_paths``; the module is sazo_runs."""
    import importlib
    import importlib.util
    import pkgutil
    import re
    from pathlib import Path

    import sazo_lite
    from sazo_lite.course import widgets

    modules = {}
    for package in (sazo_lite, sazo_lite.course, widgets):
        for info in pkgutil.iter_modules(package.__path__):
            if info.name != "labs":
                modules.setdefault(info.name, []).append(f"{package.__name__}.{info.name}")
    not_names = {"go", "result", "dash"}   # plotly's alias, doc examples' variables
    wrong = []
    for path in sorted([*Path(sazo_lite.course.__file__).parent.glob("*.py"),
                        *Path(widgets.__file__).parent.glob("*.py")]):
        for module, attribute in re.findall(r"``([a-z_]\w*)\.(\w+)(?:\(\))?``", path.read_text()):
            if module in not_names:
                continue
            if module not in modules and importlib.util.find_spec(module) is not None:
                modules[module] = [module]                              # a top-level package (sazo_lite, benchmarks)
            found = [importlib.import_module(name) for name in modules.get(module, [])]
            if not any(_has(candidate, attribute) for candidate in found):
                wrong.append(f"{path.name}: {module}.{attribute}")
    assert not wrong, wrong


# -- notebook 07: the memory model's shapes --------------------------------------------------------------------

@pytest.mark.parametrize("flags, name", [(dict(gated="no"), "gated"), (dict(tied_embeddings=1), "tied_embeddings"),
                                         (dict(bias="False"), "bias"), (dict(norm_params=-5), "norm_params"),
                                         (dict(norm_params=1.5), "norm_params")])
def test_a_model_shape_refuses_switches_that_are_not_bools_and_negative_norms(flags, name):
    """gated="no" was truthy (a gated FFN counted) and norm_params=-5 took 2·5·D parameters off each layer."""
    from sazo_lite.course.memory import ModelShape

    with pytest.raises(ValueError, match=f"Invalid {name}"):
        ModelShape("toy", 2, 64, 4, 2, 128, 100, **flags)
    plain = ModelShape("toy", 2, 64, 4, 2, 128, 100, gated=False, norm_params=0)
    assert plain.param_count() == ModelShape("toy", 2, 64, 4, 2, 128, 100, gated=False, norm_params=1).param_count() \
        - (2 * 2 + 1) * 64                                                      # 2 norms a layer + the final one


# -- notebook 02: the textbook step ----------------------------------------------------------------------------

def test_mezo_step_reference_takes_params_as_mezo_does_and_matches_its_step():
    """A bare tensor was enumerated row by row (each row its own z: g = 11.5 against MeZO's 3.3 at seed 0), a seed
    of 0.5 ran as seed 0 and a negative rate climbed; now refused, and [theta] still matches MeZO.step."""
    from sazo_lite import MeZO
    from sazo_lite.course import instruments

    start = torch.tensor([1.0, 2.0, 3.0], dtype=torch.float64)
    theta = start.clone()
    for params, seed, lr, name in ((theta, 0, 0.1, "params"), ([theta], 0.5, 0.1, "seed"), ([theta], 0, -0.1, "lr"),
                                   ([torch.tensor([1, 2])], 0, 0.1, "params"), ([1.0, 2.0], 0, 0.1, "params")):
        with pytest.raises(ValueError, match=f"Invalid {name}"):
            instruments.mezo_step_reference(params, lambda: (theta ** 2).sum(), 1e-3, lr, seed)
        assert torch.equal(theta, start)                                  # refused before any pass
    mezo_theta = start.clone()
    optimizer = MeZO([mezo_theta], lr=0.1, eps=1e-3, seed=7)
    step_seed = optimizer.next_seed()
    result = optimizer.step(lambda: (mezo_theta ** 2).sum())
    g = instruments.mezo_step_reference((t for t in [theta]), lambda: (theta ** 2).sum(), 1e-3, 0.1, step_seed)
    assert g == pytest.approx(float(result.projected_grad), rel=1e-6)
    torch.testing.assert_close(theta, mezo_theta)


# -- notebook 06: recorded runs ----------------------------------------------------------------------------------

def test_run_summary_says_a_target_reached_at_0_queries_was_reached():
    """queries_to gives 0 when F₀ is already at the target (a target of 1·F₀); the line said "not reached"."""
    from sazo_lite.course.widgets import llm

    run = {"queries": [0, 4, 8], "train_loss": [1.0, 0.6, 0.4], "walk": [0.0, 1.0, 2.0]}
    line = llm.run_summary("uniform", run, targets=(1.0, 0.5, 0.1))
    assert "1·F₀ at 0, 0.5·F₀ at 8, 0.1·F₀ not reached" in line, line


@pytest.mark.parametrize("runs, targets, match", [({}, (0.5,), "runs_by_sampler"), ({"sazo": []}, (0.5,), "runs_by_sampler"),
                                                  ({"sazo": [{"queries": [0], "train_loss": [1.0]}]}, (), "targets"),
                                                  ({"sazo": [{"queries": [0], "train_loss": [1.0]}]}, (math.nan,), "targets")])
def test_queries_table_refuses_no_runs_and_no_targets(runs, targets, match):
    """An empty dict drew a table with no rows, no targets a table with no query column, a NaN target a
    ValueError from queries_to naming "fraction"."""
    from sazo_lite.course.widgets import llm

    with pytest.raises(ValueError, match=f"Invalid {match}"):
        llm.queries_table_html(runs, targets=targets)


@pytest.mark.parametrize("seed", [0.5, -1])
def test_chi2_draws_and_their_dashboard_name_a_seed_numpy_cannot_take(seed):
    """numpy's SeedSequence raised TypeError (0.5) or "expected non-negative integer" (−1), naming no argument."""
    from sazo_lite.course.widgets import chi2_dashboard

    with pytest.raises(ValueError, match="Invalid seed"):
        sazo_runs.chi2_draws(10, 3, seed=seed)
    with pytest.raises(ValueError, match="Invalid seed"):
        chi2_dashboard(examples=100, seed=seed)
    assert sazo_runs.chi2_draws(10, 3, seed=2 ** 40).shape == (3, 10)


def test_gain_figure_draws_every_set_and_refuses_a_uniform_variance_below_the_oracles():
    """A fourth set was dropped without a word (its line zipped against three dash styles); V(u)/V(p*) = 0.5, which
    no set can have (p* minimises V), drew a "gain" below 1."""
    from sazo_lite.course.widgets.llm_lesson import gain_figure

    sets = {f"set {k}": (2.0 + k, 0.1 * k) for k in range(5)}
    fig = gain_figure(sets, (1, 4))
    assert [trace.name.split(":")[0] for trace in fig.data] == list(sets)
    assert [trace.y[0] for trace in fig.data] == pytest.approx([v for v, _ in sets.values()])   # B = 1: V(u)/V(p*)
    with pytest.raises(ValueError, match=r"Invalid V\(u\)/V\(p\*\) of 'odd'"):
        gain_figure({"odd": (0.5, 0.1)})


@pytest.mark.parametrize("eps", [-1.0, 0.0, math.nan, math.inf])
def test_the_divergence_advice_refuses_an_eps_no_run_can_have(eps):
    """ε = −1 read as tiny ("at ε = -1 the loss differences are float32 rounding: raise ε") and NaN as fine."""
    from sazo_lite.course.widgets import race_table_html
    from sazo_lite.course.widgets._common import divergence_note

    result = sazo_runs.race(_quadratic(), seeds=(0,), steps=4, lr=1e-4)   # no method reaches the target
    with pytest.raises(ValueError, match="Invalid eps"):
        race_table_html(result, eps=eps)
    with pytest.raises(ValueError, match="Invalid eps"):
        divergence_note("uniform MeZO diverged", "its gap passed 10×", "η", 0.1, eps=eps)
    assert "raise ε" in race_table_html(result, eps=1e-9) and "raise ε" not in race_table_html(result, eps=1e-3)


def test_race_parts_of_other_races_are_not_joined():
    """merge_results kept the first part's target for a part of another problem (its queries to target counted
    against another gap), let a second part of one method replace the first's runs, and join_seeds named the
    first part's rate for seeds run at another."""
    from sazo_lite.course.widgets.race import join_seeds, merge_results

    one, other = _quadratic(), _quadratic(seed=1)
    part = lambda problem, method, lr=0.01, seed=0: sazo_runs.race(problem, samplers=(method,), seeds=(seed,),  # noqa
                                                                 steps=10, lr=lr)
    with pytest.raises(ValueError, match="expected one problem and one target"):
        merge_results([part(one, "uniform"), part(other, "sazo")])
    with pytest.raises(ValueError, match=r"\['uniform'\] raced in two parts"):
        merge_results([part(one, "uniform"), part(one, "uniform", lr=0.02)])
    with pytest.raises(ValueError, match="expected the same rates"):
        join_seeds([part(one, "uniform", seed=0), part(one, "uniform", lr=0.02, seed=1)])
    joined = join_seeds([part(one, "uniform", seed=0), part(one, "uniform", seed=1)])
    merged = merge_results([joined, part(one, "sazo")])
    assert merged.gaps["uniform"].shape[0] == 2 and set(merged.gaps) == {"uniform", "sazo"}


def test_notebook_04_and_05_helpers_name_what_they_were_given_in_place_of_a_sampler_problem_or_trajectory():
    with pytest.raises(ValueError, match="Invalid sampler: str 'robust' has no"):          # was AttributeError
        sazo_runs.feed_sampler("robust", [1.0, 2.0], steps=2, batch_size=1)
    with pytest.raises(ValueError, match="Invalid problem: .*expected a FiniteSumProblem"):  # was AttributeError: dim
        sazo_runs.loss_grid("breast_cancer", [0.0, 1.0], [0.0, 1.0])
    with pytest.raises(ValueError, match="Invalid trajectory"):                              # was IndexError
        sazo_runs.roughness(3.0)


# -- the helpers, given what they cannot read: a ValueError naming the argument ------------------------------------

@pytest.mark.parametrize("call, name", [
    (lambda: sazo_runs.race(_quadratic(), seeds=3, steps=4), "seeds"),                       # TypeError: not iterable
    (lambda: sazo_runs.race(_quadratic(), seeds=(0,), steps=4, batch_size=None), "batch_size"),   # TypeError: int * None
    (lambda: sazo_runs.race(_quadratic(), seeds=(0,), steps=4, lr=[0.01]), "lr"),             # TypeError: float(list)
    (lambda: sazo_runs.race(_quadratic(), seeds=(0,), steps=4, lr={"uniform": -1.0, "sazo": 0.01, "oracle": 0.01}),
     "lr"),                                                                                   # ran (MeZO: "lr")
    (lambda: sazo_runs.tune_lr(_quadratic(), "uniform", 0.01, seeds=(0,), steps=4), "grid"),  # TypeError
    (lambda: sazo_runs.rule_ladder(_quadratic(), steps=3, seeds=2), "seeds"),                 # TypeError
    (lambda: minibatches.path_point(_quadratic(), "0.5"), "progress"),                        # TypeError: '<=' str
    (lambda: minibatches.path_point("breast_cancer", 0.5), "problem"),                        # AttributeError
    (lambda: minibatches.sample_minibatches(None, 2, 3), "probs"),                            # TypeError
    (lambda: minibatches.gain_vs_batch("abc", 0.5, 2, [1]), "norms"),                          # TypeError
    (lambda: two_point.bowl_loss(0.5, [1.0]), "theta"),                                        # IndexError
    (lambda: two_point.bowl_loss([1.0, 2.0], "ab"), "curvatures"),                             # TypeError
    (lambda: two_point.bowl_loss([1.0, 2.0], [1.0, 3.0], quartic=None), "quartic"),            # TypeError
    (lambda: two_point.bowl_loss([1.0, 2.0], [1.0, 3.0], offset="c"), "offset"),               # TypeError
    (lambda: two_point.directional_error(lambda x: x.sum(-1), 3.0, [1.0, 2.0], torch.ones(2, 2), 1e-3), "grad"),
    (lambda: two_point.two_point_estimates(lambda x: x.sum(-1), [1.0, 2.0], None, 1e-3), "directions"),
    (lambda: __import__("sazo_lite.course.llm_lesson", fromlist=["x"]).gain_by_hand(3.0, 0.1, 2), "norms"),
    (lambda: __import__("sazo_lite.course.widgets", fromlist=["x"]).race_table_html({"gaps": {}}), "result"),
    (lambda: __import__("sazo_lite.course.widgets", fromlist=["x"]).trace_readout({"steps": [0]}), "trace"),
    (lambda: __import__("sazo_lite.course.widgets", fromlist=["x"]).decay_note(None, 0.9), "trace"),
])
def test_helpers_name_an_argument_they_cannot_read(call, name):
    with pytest.raises(ValueError, match=f"Invalid {name}"):
        call()


def test_no_advice_or_loss_from_a_value_no_run_can_have():
    """A NaN curvature made the bowl's loss NaN; lower_rate(nan) advised "try nan", lower_rate(-1) "try -0.32";
    trace_divergence and race_divergence took ε = −1 whenever nothing had diverged."""
    from sazo_lite.course.widgets import race as race_widgets, sazo as sazo_widgets
    from sazo_lite.course.widgets._common import lower_rate

    with pytest.raises(ValueError, match="Invalid curvatures"):
        two_point.bowl_loss([1.0, 2.0], [math.nan, 1.0])
    with pytest.raises(ValueError, match="Invalid curvatures"):
        two_point.bowl_grad([1.0, 2.0], math.inf)
    for rate in (math.nan, -1.0, 0.0):
        with pytest.raises(ValueError, match="Invalid rate"):
            lower_rate(rate)
    trace = sazo_runs.run_sazo_trace(_quadratic(), steps=4, log_every=2)
    result = sazo_runs.race(_quadratic(), seeds=(0,), steps=4)
    with pytest.raises(ValueError, match="Invalid eps"):
        sazo_widgets.trace_divergence(trace, eps=-1.0)
    with pytest.raises(ValueError, match="Invalid eps"):
        race_widgets.race_divergence(result, batch_size=1, eps=math.nan)
    assert sazo_widgets.trace_divergence(trace, eps=1e-3) == "" == race_widgets.race_divergence(result, 1, eps=1e-3)


# -- a live notebook: a failing redraw is shown, not raised -------------------------------------------------------

def _boom(*_args, **_kwargs):
    raise RuntimeError("out of memory (simulated)")


@pytest.mark.parametrize("build, control, value, module, name", [
    (lambda sw: sw.estimator_dashboard(), "q", 7, "sazo_lite.course.widgets.estimator.two_point", "two_point_estimates"),
    (lambda sw: sw.chi2_dashboard(examples=200), "ema_decay", 0.5, "sazo_lite.course.widgets.pictures", "ema_of_chi2"),
    (lambda sw: sw.sazo_dashboard(num_examples=16, dim=3, steps=6), "lr", 0.02, "sazo_lite.course.widgets.sazo",
     "run_sazo_trace"),
    (lambda sw: sw.race_dashboard(seeds=1, steps=6), "lr_sazo", 0.02, "sazo_lite.course.widgets.race", "race"),
    (lambda sw: sw.memory_dashboard(), "context", 1024, "sazo_lite.course.widgets.memory", "memory_bars"),
])
def test_a_redraw_that_fails_in_a_live_notebook_is_shown_in_the_readout_not_raised(build, control, value, module,
                                                                                    name, monkeypatch):
    """ipywidgets hands an observer's exception to the kernel log, which JupyterLab keeps out of sight: the slider
    moved, the figures stayed, nothing was said. Now the readout says what failed, and the next redraw recovers."""
    import importlib

    from sazo_lite.course import widgets as sw

    board = build(sw)
    target = importlib.import_module(module) if not module.endswith("two_point") else two_point
    original = getattr(target, name)
    monkeypatch.setattr(target, name, _boom)
    board.controls[control].value = value                                  # raised RuntimeError before
    assert "Could not redraw at these settings: RuntimeError: out of memory (simulated)" in board.readout.value
    monkeypatch.setattr(target, name, original)
    buttons = next(row.buttons for row in board.children if hasattr(row, "buttons"))
    buttons["defaults"].click()                                            # a preset redraws: the message goes
    assert "Could not redraw" not in board.readout.value and board.readout.value


@pytest.mark.parametrize("flagged", ["13", [1.5], [torch.tensor(1.5)]])
def test_detector_precision_refuses_flagged_that_are_not_example_indices(flagged):
    """"13" was read as the examples {1, 3} and 1.5 as example 1: a precision of another set."""
    from sazo_lite.course.widgets import llm

    with pytest.raises(ValueError, match="Invalid flagged"):
        llm.detector_precision([0.1, 5.0, 3.0, 0.2], flagged=flagged, k=2)
    assert llm.detector_precision([0.1, 5.0, 3.0, 0.2], flagged=torch.tensor([1, 3]), k=2) == 0.5


def test_a_least_squares_noise_whose_losses_overflow_is_refused():
    """noise = 1e300 built a problem whose gradient was inf and whose every gap was NaN."""
    with pytest.raises(ValueError, match="Invalid noise: 1e\\+300"):
        problems.LeastSquares(16, 3, noise=1e300)
    assert math.isfinite(sazo_runs.starting_gap(problems.LeastSquares(16, 3, noise=1e3)))

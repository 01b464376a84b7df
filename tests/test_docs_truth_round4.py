"""What the course's prose says about the code, checked in the mode the reader runs (fourth round).

Fast mode (``SAZO_FAST=1``) is what CI, the book and a quick look show; class mode is the full version. Each
sentence here states what fast mode changes (steps, seeds, grids), how long a mode takes, or what a run measured;
each test reads the sentence and compares it with the code that runs: the ``pick(full, fast)`` calls of the
notebook's cells, the Makefile's and the stored class runs' recorded times, the library's results.
"""
from __future__ import annotations

import ast
import json
import re
from pathlib import Path

import numpy as np
import pytest

from test_docs_truth_round2 import flat

ROOT = Path(__file__).resolve().parents[1]
NOTEBOOKS = {path.stem[:2]: path for path in sorted((ROOT / "notebooks").glob("0*.ipynb"))}
CLASS_RUNS = ROOT / "benchmarks" / "reference" / "class_runs"
WORDS = {"one": 1, "two": 2, "three": 3, "four": 4, "five": 5, "six": 6}


def cells(number: str, kind: str) -> list[str]:
    """The sources of notebook ``number``'s cells of ``kind`` ("markdown" or "code")."""
    notebook = json.loads(NOTEBOOKS[number].read_text())
    return ["".join(cell["source"]) for cell in notebook["cells"] if cell["cell_type"] == kind]


def said(number: str, pattern: str) -> tuple[str, ...]:
    """The groups of ``pattern`` in notebook ``number``'s markdown (line breaks folded); fails if it is gone."""
    found = re.search(pattern, flat("\n\n".join(cells(number, "markdown"))))
    assert found, f"notebook {number} no longer says {pattern!r}: update the notebook or this test"
    return found.groups()


def picks(number: str, fragment: str) -> list[tuple]:
    """(full, fast) of every ``pick(full, fast)`` that starts on a code line of notebook ``number`` containing
    ``fragment``, in the order of the cells."""
    found = []
    for source in cells(number, "code"):
        for start in (m.start() for m in re.finditer(r"\bpick\(", source)):
            line = source[source.rfind("\n", 0, start) + 1:source.find("\n", start) % (len(source) + 1)]
            if fragment in line:
                found.append(tuple(ast.literal_eval(arg) for arg in ast.parse(_call(source, start)).body[0].value.args))
    assert found, f"notebook {number} has no pick(...) on a line with {fragment!r}"
    return found


def _call(source: str, start: int) -> str:
    """The text of the call that starts at ``start`` (up to its matching parenthesis)."""
    depth = 0
    for end in range(source.index("(", start), len(source)):
        depth += {"(": 1, ")": -1}.get(source[end], 0)
        if depth == 0:
            return source[start:end + 1]
    raise AssertionError(f"unbalanced call at {source[start:start + 40]!r}")


def spacing(grid) -> float:
    """The one ratio between neighbouring rates of a grid (fails for a grid that is not geometric)."""
    ratios = {round(b / a, 6) for a, b in zip(grid, grid[1:])}
    assert len(ratios) == 1, f"{grid} is not one ratio apart"
    return ratios.pop()


# -- how long a notebook takes: the Time lines and the course map against the recorded runs ------------------
def fast_seconds() -> dict[str, float]:
    """Each notebook's fast-mode run time as the Makefile records it ("idle CI run: 05 36 s, 04 28, ...")."""
    record = re.search(r"idle CI run: ((?:\d\d \d+(?: s)?, )+\d\d \d+ s)", flat((ROOT / "Makefile").read_text().replace("\n#", " "))).group(1)
    return {number: float(seconds) for number, seconds in re.findall(r"(\d\d) (\d+)", record)}


# A phrase of duration → the seconds it admits.
SPANS = {"under a minute": (0, 60), "about a minute": (40, 80), "about a minute and a half": (75, 105),
         "< 1 min": (0, 60), "≈ 1 min": (40, 80), "≈ 1.5 min": (75, 105), "under two minutes": (0, 120),
         "a few minutes": (120, 900), "takes seconds": (0, 60)}


def within(phrase: str, seconds: float) -> bool:
    low, high = SPANS[phrase]
    return low <= seconds <= high


@pytest.mark.parametrize("number", sorted(NOTEBOOKS))
def test_each_time_line_gives_the_recorded_fast_mode_time(number):
    """04 said "about a minute", 05 "about a minute and a half" with SAZO_FAST=1: make test recorded 28 s and 36 s."""
    time_line = next(line for text in cells(number, "markdown") for line in text.splitlines()
                     if line.startswith("**Time.**"))
    phrase = re.search(r"(under a minute|about a minute and a half|about a minute|takes seconds)", time_line)
    assert phrase, f"notebook {number}'s time line gives no fast-mode time: {time_line}"
    assert within(phrase.group(1), fast_seconds()[number]), \
        f"notebook {number} says {phrase.group(1)!r} in fast mode; make test recorded {fast_seconds()[number]:.0f} s"


def test_the_course_map_gives_the_recorded_fast_mode_times():
    """notebooks/README.md's table said ≈ 1 min (04) and ≈ 1.5 min (05), and "every notebook runs in about a minute"."""
    readme = (ROOT / "notebooks" / "README.md").read_text()
    recorded = fast_seconds()
    rows = re.findall(r"^\| (\d\d) \|.*\| \d+ min / ([<≈] [\d.]+ min) \|", readme, re.M)
    assert sorted(number for number, _ in rows) == sorted(NOTEBOOKS)
    for number, phrase in rows:
        assert within(phrase, recorded[number]), f"course map: {number} '{phrase}', recorded {recorded[number]:.0f} s"
    every = re.search(r"Every notebook runs in (under a minute|about a minute) with `SAZO_FAST=1`", flat(readme)).group(1)
    assert all(within(every, seconds) for seconds in recorded.values()), (every, recorded)


def class_seconds(number: str) -> float | None:
    """The stored class-mode run's time of notebook ``number`` (its header's "run: class mode ..., 38 s")."""
    path = CLASS_RUNS / f"{NOTEBOOKS[number].stem}.txt"
    if not path.exists():
        return None
    return float(re.search(r"^run: class mode \(SAZO_FAST=0\), (\d+) s", path.read_text(), re.M).group(1))


@pytest.mark.parametrize("number", [n for n in sorted(NOTEBOOKS) if class_seconds(n) is not None])
def test_each_time_line_gives_the_stored_class_run_time(number):
    """04 said its cells take "a few minutes" in class mode: its stored class run took 38 s. 07 said its measured
    validation takes 2–3 minutes: the whole class run took 79 s."""
    time_line = flat(next(text for text in cells(number, "markdown") if "**Time.**" in text).split("**Time.**")[1])
    stated = re.search(r"\((?:the [\w ]+ takes? )(under a minute|under two minutes|a few minutes|[\d–]+ minutes)",
                       time_line)
    assert stated, f"notebook {number}'s time line gives no class-mode run time: {time_line[:200]}"
    phrase, seconds = stated.group(1), class_seconds(number)
    if phrase in SPANS:
        assert within(phrase, seconds), f"notebook {number}: {phrase!r} in class mode, the stored run took {seconds} s"
    else:                                   # "2–3 minutes" of a part of the run: at most the whole run's time
        low = float(phrase.split("–")[0])
        assert low * 60 <= seconds, f"notebook {number}: {phrase} in class mode, the whole stored run took {seconds} s"


# -- notebook 05: what fast mode changes --------------------------------------------------------------------
def test_05_race_1_tunes_on_the_seeds_and_grid_spacing_the_text_states():
    """"three of five in class mode and two of three in fast mode", and each grid's spacing per mode (the text said
    "the grids ... ×4 in fast mode": only race 1's is; races 2 and 3's are ×2 apart in fast mode too)."""
    tuning_class, race_class, tuning_fast, race_fast = (WORDS[w] for w in said(
        "05", r"tuned on the first seeds of those then reported, (\w+) of (\w+) in class mode and (\w+) of (\w+) in "
              r"fast mode"))
    assert picks("05", "TUNING_SEEDS = ") == [(tuning_class, tuning_fast)]
    assert picks("05", "race1_seeds, race1_steps =")[0] == (race_class, race_fast)
    race1_class, race1_fast, others_both = (float(x) for x in said(
        "05", r"race 1's is ×(\d) apart in class mode and ×(\d) in fast mode, races 2 and 3's ×(\d) apart in both "
              r"modes, a point fewer in fast mode"))
    (race1,) = picks("05", "grid = pick(")[:1]
    assert (spacing(race1[0]), spacing(race1[1])) == (race1_class, race1_fast)
    for full, fast in (picks("05", "homog_grid, homog_settings =")[0], picks("05", "real = tuned_race(")[0]):
        assert spacing(full) == spacing(fast) == others_both
        assert len(fast) == len(full) - 1


def test_05_fast_and_class_runs_are_as_long_as_the_answers_say():
    """Each "(N seeds, T steps)" the answers give for a mode is the pick(...) the race runs with."""
    seeds_fast, steps_fast = (int(x) for x in said("05", r"Fast mode runs (\d+) seeds for (\d+) steps"))
    (race1_seeds, race1_steps) = picks("05", "race1_seeds, race1_steps =")
    assert (race1_seeds[1], race1_steps[1]) == (seeds_fast, steps_fast)
    seeds, = picks("05", "SEEDS = tuple(range(pick(")
    class_seeds, class_steps = (int(x) for x in said("05", r"The class-mode run \((\d+) seeds, (\d+) steps\) measured "
                                                           r"uniform at"))
    assert (race1_seeds[0], race1_steps[0]) == (class_seeds, class_steps)
    logistic_steps, = picks("05", "logistic_steps = pick(")
    class_logistic = [int(x) for x in said("05", r"The class-mode run \((\d+) seeds, (\d+) steps\) measured SAZO at")]
    fast_logistic = [int(x) for x in said("05", r"fast mode \((\d+) seeds, (\d+) steps\) prints SAZO")]
    assert class_logistic == [seeds[0], logistic_steps[0]] and fast_logistic == [seeds[1], logistic_steps[1]]
    homog_steps, = picks("05", "batch_size=2, log_every=10, target_fraction")
    assert int(said("05", r"in the class-mode run \((\d+) steps\) SAZO's median final gap")[0]) == homog_steps[0]
    tune_fast, race_seeds_fast = (int(x) for x in re.search(
        r"Fast mode tunes on a short budget \((\d+) steps\), then races long enough, on (\d+) seeds",
        flat("\n".join(cells("05", "code")))).groups())
    assert picks("05", "tune_steps=pick(")[0][1] == tune_fast and race1_seeds[1] == race_seeds_fast


# -- notebook 04: the ladder's settings and what its table shows -------------------------------------------
def test_04_ladder_runs_the_steps_and_seeds_the_text_gives_for_class_mode():
    steps, seeds = (int(x) for x in said("04", r"Class mode \((\d+) steps, (\d+) seeds\): plain"))
    ladder_steps, ladder_seeds = picks("04", "ladder_steps, ladder_seeds =")
    assert (ladder_steps[0], ladder_seeds[0]) == (steps, seeds)
    assert int(said("04", r"in class mode \((\d+) steps\) the plain rule has time to learn")[0]) == ladder_steps[0]


def _class_ladder() -> dict[str, dict[str, float]]:
    """The class-mode means notebook 04's section 6.5 quotes, per problem (σ = 1.5 and σ = 0)."""
    hetero = dict(zip(("plain", "prior", "blend", "level", "robust", "uniform"), (float(x) for x in said(
        "04", r"plain ([\d.]+), \+ prior ([\d.]+), \+ blend ([\d.]+), \+ level ([\d.]+), robust ([\d.]+), "
              r"uniform ([\d.]+)"))))
    plain, uniform, prior, blend, level, robust = (float(x) for x in said(
        "04", r"ends the run below uniform \(mean ([\d.]+) against ([\d.]+)\), and the rungs differ by less "
              r"\(\+ prior ([\d.]+), \+ blend ([\d.]+), \+ level ([\d.]+), robust ([\d.]+)\)"))
    return {"σ = 1.5": hetero, "σ = 0": dict(plain=plain, prior=prior, blend=blend, level=level, robust=robust,
                                             uniform=uniform)}


@pytest.fixture(scope="module")
def fast_ladder(fast_mode):
    """Section 6.5's table as fast mode runs it (the notebook's problems, steps and seeds)."""
    import torch  # noqa: F401  (the course imports it; keeps the import order of the notebook)

    from sazo_lite.course.sazo_runs import make_problem, rule_ladder
    (_, steps), (_, seeds) = picks("04", "ladder_steps, ladder_seeds =")
    problems = {"σ = 1.5": make_problem("heterogeneous quadratic", heterogeneity=1.5, num_examples=128, dim=10, seed=0),
                "σ = 0": make_problem("homogeneous quadratic", num_examples=128, dim=10, seed=0)}
    return {name: rule_ladder(data, steps=steps, seeds=tuple(range(seeds)), batch_size=8, lr=0.01, log_every=10)
            for name, data in problems.items()}


def test_04_ladder_sentences_hold_in_both_modes(fast_ladder):
    """The text said the plain rule beat a rung "only" on σ = 1.5's "+ prior": in class mode it also beat + blend and
    + level there, and + prior on σ = 0; and "only with the level and |δ|" does a rung beat it, while fast mode's
    + level alone does. What it says now is checked on the class numbers it quotes and on fast mode's table."""
    said("04", r"The prior alone did worse than the plain rule .{0,120}?; the robust rule, with all four fixes, beats "
               r"the plain one\.")
    said("04", r"on σ = 1\.5, .{0,120}?the plain rule beat the \"\+ prior\" rung in both modes \(in class mode it also "
               r"beat \"\+ prior\" on σ = 0\); against the full robust rule it lost on both problems in both modes")
    for mode, table in (("class", _class_ladder()), ("fast", fast_ladder)):
        hetero, homog = table["σ = 1.5"], table["σ = 0"]
        assert hetero["prior"] > hetero["plain"], (mode, hetero)
        assert all(t["robust"] < t["plain"] for t in (hetero, homog)), (mode, table)
        assert all(hetero[rung] < hetero["uniform"] / 2 for rung in ("plain", "prior", "blend", "level", "robust"))
    class_homog = _class_ladder()["σ = 0"]
    assert class_homog["prior"] > class_homog["plain"]


# -- the worked solutions: what their code prints ----------------------------------------------------------
def solution(number: str, section: int) -> tuple[str, str]:
    """(prose, code) of section ``section`` of notebook ``number``'s worked solutions: its text (line breaks
    folded) and its first python block."""
    page = next((ROOT / "notebooks" / "solutions").glob(f"{number}_*.md")).read_text()
    part = re.split(r"^## ", page, flags=re.M)[section]
    assert part.startswith(f"{section}."), part[:40]
    code = re.search(r"```python\n(.*?)```", part, re.S).group(1)
    prose = flat(re.sub(r"```.*?```", " ", part, flags=re.S)).translate(str.maketrans("⁰¹²³⁴⁵⁶⁷⁸⁹⁻", "0123456789-"))
    return prose, code


def run_printing(code: str, capsys) -> str:
    exec(compile(code, "<solution>", "exec"), {"__name__": "solution"})
    return capsys.readouterr().out


def test_04_solution_1_says_down_to_which_eps_the_ranking_survives(capsys):
    """It said ρ stays within 0.1 of its ε = 1e-3 value "down to about ε = 1e-6": its own scan keeps it at 1e-7."""
    prose, code = solution("04", 1)
    kept, lost_above, lost_below = (int(x) for x in re.search(
        r"value down to ε = 10-(\d) and loses it between 10-(\d) and 10-(\d): from 10-\d on ρ ≈ 0", prose).groups())
    rho = {int(exponent): float(value) for exponent, value in
           re.findall(r"ε = 1e-0?(\d+): final ρ = (-?[\d.]+)", run_printing(code, capsys))}
    assert (kept, lost_above) == (lost_above, lost_below - 1)
    assert all(abs(rho[e] - rho[3]) <= 0.1 for e in rho if e <= kept), rho
    assert all(abs(rho[e]) < 0.1 for e in rho if e >= lost_below), rho


def test_04_solution_3_gives_the_observations_its_code_prints(capsys):
    """It said ρ crosses 0.7 after "about 3–6" observations "whatever B": its run prints 3–4, and at B = 1 ρ never
    gets there in its 300 steps."""
    prose, code = solution("04", 3)
    low, high, fewest, most = (int(x) for x in re.search(
        r"from B = (\d+) to (\d+), ρ crosses 0\.7 once the typical example has been observed (\d) or (\d) times",
        prose).groups())
    printed = run_printing(code, capsys)
    rows = {int(b): (step, seen) for b, step, seen in re.findall(
        r"B = +(\d+): .*?ρ > 0\.7 first at step (\w+) \(median observations per example then: ([\w.]+)\)", printed)}
    assert sorted(rows) == [1, 2, 4, 8, 16, 32], printed
    assert rows[1][0] == "never" and "At B = 1" in prose and "never reaches 0.7" in prose
    for b in (b for b in rows if low <= b <= high):
        assert fewest <= float(rows[b][1]) <= most, (b, rows[b])


def test_05_solution_1_races_race_1_at_the_rates_its_answer_discusses():
    """It raced B = 2, but exercise 1 reruns race 1 (B = 4); and its answer reads "a single η at the oracle's best
    rate", which its rates (0.0025, 0.005, 0.01) did not include."""
    from sazo_lite.course.widgets.race import PROBLEM_DEFAULTS

    prose, code = solution("05", 1)
    race_1 = next(source for source in cells("05", "code") if "hetero = tuned_race(" in source)
    assert re.search(r"batch_size=(\d+)", code).group(1) == re.search(r"batch_size=(\d+)", race_1).group(1)
    rates = ast.literal_eval(re.search(r"for lr in (\([^)]*\))", code).group(1))
    tuned = PROBLEM_DEFAULTS["heterogeneous quadratic"]          # race 1's class-mode tuned rates
    assert "uniform's best rate" in prose and "oracle's best rate" in prose
    assert {tuned["lr_uniform"], tuned["lr_oracle"]} <= set(rates), (rates, tuned)


# -- the fast-mode comments of notebooks 04 and 05 ---------------------------------------------------------
def comment(number: str, statement: str) -> str:
    """The comment on notebook ``number``'s code line that starts with ``statement``."""
    line = next(line for source in cells(number, "code") for line in source.splitlines()
                if line.startswith(statement))
    return line.split("#", 1)[1].strip()


def test_04_fast_comment_says_which_runs_fast_mode_leaves_alone():
    """It said "SAZO_FAST=1 shrinks every run": sections 6.1–6.4 feed the samplers 5 seeds of fixed step counts in
    both modes (only their χ² draws shrink). The comment now names what shrinks and what stays."""
    said_now = comment("04", "FAST = fast_mode()")
    assert "every run" not in said_now and re.search(r"6\.1–6\.4's frozen-θ runs stay", said_now), said_now
    code = "\n".join(cells("04", "code"))
    helper = re.search(r"def after\(.*?\n\n\n", code, re.S).group(0)
    assert "pick(" not in helper and "for s in range(5)" in helper
    assert said("04", r"(Five) seeds each, medians printed")
    calls = re.findall(r"(?<!def )\bafter\(([^()]*)\)", code)
    assert calls and not any("pick" in call for call in calls), calls
    kinds = {"steps": "ladder_steps", "seeds": "ladder_seeds", "draws": "zs = torch.randn(pick("}
    for kind, fragment in kinds.items():       # each kind the comment names does shrink somewhere
        assert kind in said_now
        full, fast = picks("04", fragment)[-1 if kind == "seeds" else 0]
        assert fast < full, (kind, full, fast)


def test_05_fast_comments_name_every_kind_of_pick_and_the_seeds_each_race_runs():
    """It said fast mode runs "fewer steps and seeds" (its grids shrink too) and that the races "then use all
    SEEDS" (race 1 runs race1_seeds: 3 in fast mode, SEEDS 2)."""
    fast = comment("05", "FAST = fast_mode()")
    shrunk = {"grid points": any(isinstance(full, list) and len(fast_) < len(full)
                                 for full, fast_ in picks("05", "pick([")),
              "seeds": picks("05", "SEEDS = tuple(range(pick(")[0][1] < picks("05", "SEEDS = tuple(range(pick(")[0][0],
              "steps": picks("05", "logistic_steps = pick(")[0][1] < picks("05", "logistic_steps = pick(")[0][0]}
    assert all(shrunk.values()) and all(kind in fast for kind in shrunk), (fast, shrunk)
    tuning = comment("05", "TUNING_SEEDS = ")
    code = "\n".join(cells("05", "code"))
    races = {name for line in code.splitlines() if "= tuned_race(" in line for name in re.findall(r"seeds=(\w+)", line)}
    assert races == {"race1_seeds", "SEEDS"} and "seeds=seeds[:TUNING_SEEDS]" in code, races
    assert "all SEEDS" not in tuning and "all its seeds" in tuning, tuning


def test_03_solution_5_says_where_noisy_norms_fall_behind_uniform(capsys):
    """It said V(p)/V(p*) "crosses uniform's 1 + CV² around τ ≈ 1.5": its own printout has 4.37 there (λ = 0)
    against uniform's 10.51, and 25.7 at τ = 2."""
    prose, code = solution("03", 5)
    low, high = (float(x) for x in re.search(r"without a mix \(λ = 0\) it crosses uniform's 1 \+ CV. between "
                                             r"τ = ([\d.]+) and τ = ([\d.]+) here", prose).groups())
    printed = run_printing(code, capsys)
    unmixed = {float(tau): float(ratio) for tau, ratio in
               re.findall(r"τ = ([\d.]+), λ = 0\.0: V\(p\)/V\(p\*\) = ([\d.]+)", printed)}
    uniform = float(re.search(r"uniform: ([\d.]+)", printed).group(1))
    assert unmixed[low] < uniform < unmixed[high], (unmixed, uniform)
    assert [tau for tau in sorted(unmixed) if low < tau < high] == []          # the two neighbouring τ printed


# Draws whose values no printed number depends on (07: a random input whose saved-tensor sizes alone are read).
SHAPE_ONLY = {("07", "saved = saved_activation_bytes(block, torch.randn(")}


@pytest.mark.parametrize("number", sorted(NOTEBOOKS))
def test_every_draw_a_printout_depends_on_is_seeded(number):
    """04's sections 4 and 6.5 fed their samplers torch.randn(...) without a generator: the cells printed other
    numbers on every run (a class run of the same code: 31 then 29 examples never observed)."""
    for source in cells(number, "code"):
        for line in source.splitlines():
            draw = re.search(r"\btorch\.(randn|rand|randint|randperm|multinomial)\(|\bnp\.random\.\w+\(", line)
            if not draw or any(number == n and fragment in line for n, fragment in SHAPE_ONLY):
                continue
            call = _call(source, source.index(line) + draw.start())
            assert "generator=" in call or "manual_seed(" in source.split(line)[0], \
                f"notebook {number}: an unseeded draw: {line.strip()}"


def test_05_a_diverged_race_seed_runs_on_off_the_top_of_the_plot():
    """05 said of a diverged method "its curves stop there": the race trains such a seed on (RACE_DIVERGE_FACTOR is
    inf); its band leaves the plot at the axis' top, 3× the initial gap, and a mark sits where the median diverged."""
    from sazo_lite.course.sazo_runs import RaceResult
    from sazo_lite.course.widgets import race_figure

    top = float(said("05", r"their band leaves the top of the plot \(its axis ends at (\d+)× the initial gap\), and a "
                           r"method whose median run diverged gets a mark there")[0])
    queries = np.arange(0, 100, 10)
    calm = np.linspace(1.0, 0.05, len(queries))
    runaway = np.array([1.0, 0.8, 5.0, 40.0, 300.0, 2e3, 1e4, 5e4, 2e5, 1e6])
    result = RaceResult(queries=queries, initial_gap=1.0, target=0.1, lrs={}, to_target={
        "uniform": [None, 80, None], "sazo": [80, 80, 80], "oracle": [90, 90, 90]},
        gaps={"uniform": np.stack([runaway, calm, runaway * 2]), "sazo": np.stack([calm] * 3),
              "oracle": np.stack([calm] * 3)})
    figure = race_figure(result)
    assert figure.layout.yaxis.range[1] == pytest.approx(np.log10(top))
    uniform = [trace for trace in figure.data if trace.name and "uniform" in trace.name.lower()]
    drawn = [np.asarray(trace.y, dtype=float) for trace in uniform]
    assert any(np.isfinite(y[-1]) and y[-1] > top for y in drawn), "the diverged seeds' band stops"
    assert any("uniform" in mark.text and "diverged" in mark.text for mark in figure.layout.annotations)


# -- API names the course's prose quotes --------------------------------------------------------------------
def _defined(codes: list[str]) -> set[str]:
    """The names the code cells bind (assignments, imports, functions, loop variables)."""
    names = set()
    for source in codes:
        for node in ast.walk(ast.parse(source)):
            if isinstance(node, ast.Name) and isinstance(node.ctx, ast.Store):
                names.add(node.id)
            elif isinstance(node, (ast.Import, ast.ImportFrom)):
                names.update((alias.asname or alias.name).split(".")[0] for alias in node.names)
            elif isinstance(node, (ast.FunctionDef, ast.ClassDef)):
                names.add(node.name)
    return names


def _resolves(dotted: str) -> bool:
    """Whether ``dotted`` names an object: a module (as written, or under sazo_lite, sazo_lite.course, its widgets or
    sazo_lite.llm) then attributes, or an attribute of a name exported by sazo_lite."""
    import importlib

    import sazo_lite

    parts = dotted.split(".")
    for base in ("", "sazo_lite.", "sazo_lite.course.", "sazo_lite.course.widgets.", "sazo_lite.llm."):
        for cut in range(len(parts), 0, -1):          # the longest importable module prefix
            try:
                obj = importlib.import_module(base + ".".join(parts[:cut]))
            except ImportError:
                continue
            try:
                for part in parts[cut:]:
                    obj = getattr(obj, part)
                return True
            except AttributeError:
                return False
    return hasattr(sazo_lite, parts[0])


COURSE_PAGES = ["notebooks/README.md", "notebooks/algorithm.md"] + \
    sorted(str(p.relative_to(ROOT)) for p in (ROOT / "notebooks" / "solutions").glob("*.md"))


@pytest.mark.parametrize("page", sorted(NOTEBOOKS) + COURSE_PAGES)
def test_every_module_name_the_course_quotes_exists(page):
    """04 said the histograms come from `experiments.ema_of_chi2`: there is no module `experiments`; it is
    `sazo_runs.ema_of_chi2`. A `name.attr` the prose quotes is a library object or a name the notebook's code binds
    (`hetero.lrs`, `race.design`)."""
    if page in NOTEBOOKS:
        text, codes = "\n".join(cells(page, "markdown")), cells(page, "code")
    else:
        text = (ROOT / page).read_text()
        codes = re.findall(r"```python\n(.*?)```", text, re.S)
        text = re.sub(r"```.*?```", " ", text, flags=re.S)
    bound = _defined(codes) | {"sz", "lesson"}          # the course's aliases: sazo_lite, course.llm_lesson
    aliases = {"sz": "sazo_lite", "lesson": "llm_lesson"}
    for span in re.findall(r"`([^`\n]+)`", text):
        dotted = re.match(r"([A-Za-z_]\w*(?:\.[A-Za-z_]\w*)+)(?![\w.])", span)
        if not dotted or re.search(r"\.(?:py|md|json|ipynb|txt|log|toml|stat|usage|pt)$", dotted.group(1)):
            continue
        first, _, rest = dotted.group(1).partition(".")
        if first in aliases:
            assert _resolves(f"{aliases[first]}.{rest}") or (first == "sz" and _resolves(rest)), \
                f"{page}: `{dotted.group(1)}` is not in the library"
        elif first not in bound:
            assert _resolves(dotted.group(1)), f"{page}: `{dotted.group(1)}` names nothing the library or the code has"


def test_06_says_how_gain_by_hand_writes_v_out():
    """06 called `lesson.gain_by_hand` "ten lines": its body is 15 lines of checks and sums; what the text means
    is that V(u) and V(p*) are written out, one sum each, which is what it says now."""
    import inspect

    from sazo_lite.course import llm_lesson

    said("06", r"\(`lesson\.gain_by_hand`: the two sums of \$V\(p\)\$, one line each\)")
    sums = [line.strip() for line in inspect.getsource(llm_lesson.gain_by_hand).splitlines()
            if re.match(r"\s*v_(uniform|oracle) = sum\(.*\) / n \*\* 2", line)]
    assert len(sums) == 2, sums


def test_the_course_cites_the_on_device_paper_with_one_first_author():
    """algorithm.md cited "S. Katti et al." for arXiv:2511.11362; notebooks 02 and 07 give "P. Katti, H. Sifaou, ...\""""
    pages = {path.name: path.read_text() for path in [*NOTEBOOKS.values(), ROOT / "notebooks" / "algorithm.md"]}
    authors = {name: re.findall(r"([A-Z]\. Katti)[^\n]*?2511\.11362", text) for name, text in pages.items()}
    cited = {author for found in authors.values() for author in found}
    assert len(cited) == 1 and authors["algorithm.md"], authors


# -- the other fast-mode sentences, pinned to the code they describe --------------------------------------
def test_02_memory_cell_batch_in_each_mode():
    full, fast = (int(x) for x in said("02", r"with a batch of (\d+) \((\d+) in fast mode\)"))
    assert picks("02", "width, depth, batch =") == [(full, fast)]


def test_07_validation_points_in_each_mode():
    """"Fast mode measures only the last two, at one context length (n_ctx = 512, fused attention", and the class
    run's "18 points, n_ctx = 256–1024": the two halves of the cell's pick(default_points(...), ...)."""
    from sazo_lite.course.memory_measure import default_points

    context = int(said("07", r"Fast mode measures only the last two, at one context length \(\$n_\\text\{ctx\} = "
                             r"(\d+)\$, fused attention")[0])
    count, low, high = (int(x) for x in said("07", r"In the class-mode run \((\d+) points, \$n_\\text\{ctx\}\$ = "
                                                   r"(\d+)–(\d+)\)"))
    code = next(source for source in cells("07", "code") if "points = pick(" in source)
    call = _call(code, code.index("pick("))
    full, fast = ast.parse(call).body[0].value.args
    namespace = {"default_points": default_points}
    full_points, fast_points = (eval(compile(ast.Expression(arg), "<07>", "eval"), namespace) for arg in (full, fast))
    assert len(full_points) == count and {s.context for s, _ in full_points} == {low, 512, high}
    assert {(s.context, s.attention) for s, _ in fast_points} == {(context, "fused")}
    assert {mode for _, mode in fast_points} == {"zo", "bp"}            # "the last two": a MeZO and a backprop step


def test_05_paths_picture_runs_the_same_steps_in_both_modes(monkeypatch):
    """05: "this picture runs the same 100 steps in fast and in class mode"."""
    from sazo_lite.course.widgets import pictures

    steps = int(said("05", r"this picture runs the same (\d+) steps in fast and in class mode")[0])
    ran = []
    real = pictures.sampler_paths
    monkeypatch.setattr(pictures, "sampler_paths", lambda *a, **k: ran.append((mode, k["steps"])) or real(*a, **k))
    for mode in ("1", "0"):
        monkeypatch.setenv("SAZO_FAST", mode)
        pictures.paths_dashboard()
    assert {(mode, n) for mode, n in ran} == {("1", steps), ("0", steps)}, ran

"""The benchmark reports as a user reads them (seventh round): ratios bounded where one side never reached its
target, a --cached-only race that loads no model, ... Every test runs on fakes or tiny settings: seconds in
all, no timing assertions."""
import json
import math

import pytest

from benchmarks import queries, run


# -- make bench's toy race: a ratio where one side never reached the target is a bound, not "?" -------------------
class FakeRun:
    """A TargetRun stand-in: it crosses ``target`` after ``at`` steps (None: never), diverges after ``diverge_at``
    steps (None: never); 2 queries a step (B = 1)."""

    def __init__(self, at, diverge_at=None, target=0.1):
        self.at, self.diverge_at, self.target = at, diverge_at, target
        self.batch_size, self.steps, self.failed, self.queries = 1, 0, False, None
        self.reached = {target: None}

    def extend_to(self, steps):
        if self.failed or self.queries is not None or steps <= self.steps:
            return self
        if self.at is not None and self.at <= steps and (self.diverge_at is None or self.at < self.diverge_at):
            self.steps, self.queries = self.at, 2 * self.at
            self.reached[self.target] = self.queries
        elif self.diverge_at is not None and self.diverge_at <= steps:
            self.steps, self.failed = self.diverge_at, True
        else:
            self.steps = steps
        return self


def race(plan, max_steps=1000):
    """best_learning_rate over fake runs: ``plan`` {lr: [(at, diverge_at) per seed]}."""
    make = lambda lr, seed: FakeRun(*plan[lr][seed])
    return queries.best_learning_rate(make, list(plan), list(range(len(next(iter(plan.values()))))), max_steps,
                                      first_budget=100, targets=(0.1,))[0.1]


def row_of(**cells):
    return {"problem": "quadratic σ=1.5", "gain_at_optimum": 4.6, **{m: {repr(0.1): c} for m, c in cells.items()}}


def test_a_method_that_never_reached_the_target_gets_a_floor_from_the_queries_its_runs_made():
    """No rate's median reached the target within 1,000 steps: the cell's floor is the smallest median a choosable
    rate could have had with its runs continued: at 1e-3 seeds (400, ≥ 2000, ≥ 2000) → 2000 queries."""
    never = race({1e-3: [(400, None), (None, None), (None, None)], 2e-3: [(None, 50), (None, 60), (300, None)]})
    assert never["median"] is None and never["floor"] == 2000      # 2e-3 is lost (two of three diverged)
    assert race({1e-3: [(None, 50), (None, 60), (None, 70)]})["floor"] is None    # every rate diverged: no bound
    assert "floor" not in race({1e-3: [(100, None)] * 3})            # reached: its median is known


@pytest.mark.parametrize("numerator, denominator, text", [
    ({"median": 5000, "lr": 1e-3, "grid": {}}, {"median": None, "floor": 40000}, "< 0.12×"),
    ({"median": None, "floor": 40000}, {"median": 5000, "lr": 1e-3, "grid": {}}, "> 8.00×"),
    ({"median": None, "floor": 40000}, {"median": None, "floor": 20000}, "–"),       # neither: nothing to say
    ({"median": 5000, "lr": 1e-3, "grid": {}}, {"median": None}, "–"),                # a cell saved without floors
    ({"median": 5000, "lr": 1e-3, "grid": {}}, {"median": None, "floor": None}, "–"),  # diverged at every rate
])
def test_a_ratio_with_one_side_never_reaching_the_target_prints_its_bound(numerator, denominator, text):
    """The table printed "–" and make bench "?" for uniform ÷ SAZO where SAZO reached the target and uniform never
    did within its 40,000 queries: the ratio is > 8× there, which grades the ≥ 3.5 goal."""
    row = row_of(uniform=numerator, sazo=denominator)
    assert queries.ratio_text(row, "uniform", "sazo", 0.1) == text
    if text.startswith(">"):
        assert queries.ratio_text(row, "uniform", "sazo", 0.1, invert=True) == "< 0.12×"


def toy_results(uniform, sazo, oracle, target=0.02):
    cells = {"uniform": uniform, "sazo": sazo, "oracle": oracle}
    rows = [{"problem": name, "gain_at_optimum": 2.0, **{m: {repr(target): c} for m, c in cells.items()}}
            for name in ("quadratic σ=1.5", "quadratic σ=0")]
    return {"targets": [target], "methods": list(cells), "rows": rows}


def reached(median):
    return {"median": median, "min": median, "max": median, "lr": 1e-3, "grid": {"0.001": median, "0.002": None}}


def test_make_bench_grades_a_goal_by_the_bound_a_missed_target_proves():
    """uniform never reached 2% within 40,000 queries, SAZO in 5,000: "? " for the uniform ÷ SAZO ≥ 3.5 goal (it is
    > 8×, met), and for the homogeneous control SAZO ÷ uniform ≤ 1 (it is < 0.125×, met). An oracle that never
    reached it: SAZO ÷ oracle < 0.125, within ≤ 1.3 (met)."""
    never = {"median": None, "min": None, "max": None, "lr": None, "per_seed": [None] * 5, "floor": 40000, "grid": {}}
    rows = {r[1]: r[2:] for r in run._query_rows(toy_results(never, reached(5000), never))}
    assert rows["quadratic σ=1.5 @ 0.02: uniform ÷ SAZO"] == ("> 8.00×", "≥ 3.5", "yes")
    assert rows["quadratic σ=0 @ 0.02: SAZO ÷ uniform"] == ("< 0.12×", "≤ 1.0", "yes")
    assert rows["quadratic σ=1.5 @ 0.02: SAZO ÷ oracle"] == ("< 0.12×", "≤ 1.3", "yes")
    # SAZO never reached it, uniform did in 5,000: uniform ÷ SAZO < 0.125 misses ≥ 3.5; the control's cost is > 8
    rows = {r[1]: r[2:] for r in run._query_rows(toy_results(reached(5000), never, reached(1000)))}
    assert rows["quadratic σ=1.5 @ 0.02: uniform ÷ SAZO"] == ("< 0.12×", "≥ 3.5", "NO")
    assert rows["quadratic σ=0 @ 0.02: SAZO ÷ uniform"] == ("> 8.00×", "≤ 1.0", "NO")
    assert rows["quadratic σ=1.5 @ 0.02: SAZO ÷ oracle"] == ("> 40.00×", "≤ 1.3", "NO")
    # a bound that does not decide: SAZO ÷ oracle > 0.8 against ≤ 1.3 stays "?"
    rows = {r[1]: r[2:] for r in run._query_rows(toy_results(reached(5000), never, reached(50000)))}
    assert rows["quadratic σ=1.5 @ 0.02: SAZO ÷ oracle"] == ("> 0.80×", "≤ 1.3", "?")
    table = queries.format_table(toy_results(never, reached(5000), never))
    assert "not reached (> 40000)" in table and "> 8.00×" in table


class TwoTargetRun:
    """A TargetRun stand-in with targets 0.1 and 0.01: it crosses them after ``first`` and ``second`` steps (None:
    never) and diverges after ``diverge`` steps (None: never); logged every 10 steps, 2 queries a step."""
    targets = (0.1, 0.01)

    def __init__(self, first, second, diverge):
        self.first, self.second, self.diverge = first, second, diverge
        self.batch_size, self.steps, self.failed = 1, 0, False
        self.reached = {t: None for t in self.targets}

    @property
    def queries(self):
        return self.reached[0.01]

    def extend_to(self, steps):
        for s in range(self.steps + 10, -(-steps // 10) * 10 + 10, 10):
            if self.failed or self.queries is not None:
                break
            self.steps = s
            if self.first is not None and s >= self.first and self.reached[0.1] is None:
                self.reached[0.1] = 2 * s
            if self.second is not None and s >= self.second:
                self.reached[0.01] = 2 * s
            elif self.diverge is not None and s >= self.diverge:
                self.failed = True
        return self


def test_where_every_rate_is_lost_the_rule_chooses_among_whole_runs():
    """A grid whose every rate lost half of its seeds (here one rate; 2 of 4 seeds diverged by step 870): the rule
    then chooses among the lost rates, but their other seeds had stopped when the rate was lost (step ~870), so seeds
    that cross 0.1 at steps 1280 and 1890 counted as misses and the cell read "not reached" (median ∞) where its
    runs give (2560 + 3780) / 2 = 3170 queries."""
    plan = [(1280, 2760, None), (1890, None, None), (470, 2520, 870), (1930, 4190, 670)]
    result = queries.best_learning_rate(lambda lr, seed: TwoTargetRun(*plan[seed]), [1e-3], [0, 1, 2, 3], 3000,
                                        first_budget=100, targets=(0.1, 0.01))
    assert result[0.1]["lr"] == 1e-3 and result[0.1]["median"] == 3170
    assert result[0.1]["per_seed"] == [2560, 3780, 940, None]
    assert result[0.01]["median"] is None and result[0.01]["floor"] is None     # half of the seeds diverged: no bound
    assert queries._cell(result[0.1]).endswith("lr=0.001 (one rate) (every rate lost: half or more of its seeds diverged)")
    assert "lost" not in queries._cell(race({1e-3: [(100, None)] * 3, 2e-3: [(None, 50)] * 3}))   # 2e-3 lost, not chosen


# -- make bench's language-model rows and bench-llm's printout: the control graded as the other goals are ----------
def control_section(ratio=None, bound=None, incomplete=None):
    key = "uniform/sazo+bound@0.3"
    setting = {"label": "SmolLM2 top-block (k=3) LoRA r4 homogeneous (N=32 alike, B=4)", "heterogeneity": 1.02,
               "B": 4, "chosen_lr": {}, "ratios": {key: ratio}, "ratio_bounds": {key: bound} if bound else {},
               "incomplete": incomplete or {}, "suffix": "+bound"}
    return {"date": "2026-12-07 20:00 UTC", "settings": [setting], "targets": [0.3], "title": "bench-llm",
            "pilot": False, "source": "this machine's latest llm_queries.json"}


def control_row(section):
    rows = [r for r in run._llm_rows(section) if "SAZO ÷ uniform" in r[1]]
    assert len(rows) == 1
    return rows[0][2:]


def test_make_bench_grades_the_language_model_control_by_its_bound_and_not_before_its_race_ended():
    """The homogeneous control's SAZO ÷ uniform ≤ 1.1 read "–" and "?" where uniform's median run was cut short
    (uniform ÷ SAZO > 2: SAZO ÷ uniform < 0.5, met); and a race read back with --cached-only before SAZO's runs
    ended was graded "yes" from the runs so far, where every other goal says the race is not finished."""
    assert control_row(control_section(bound=(">", 2.0))) == ("< 0.50× (cut short)", "≤ 1.1", "yes")
    assert control_row(control_section(bound=("<", 0.5))) == ("> 2.00× (cut short)", "≤ 1.1", "NO")
    assert control_row(control_section(bound=(">", 0.5))) == ("< 2.00× (cut short)", "≤ 1.1", "?")
    assert control_row(control_section(ratio=2.0)) == ("0.50×", "≤ 1.1", "yes")
    unfinished = control_section(ratio=2.0, incomplete={"sazo+bound": "stopped before lr=0.006 seed=1"})
    assert control_row(unfinished) == ("0.50×", "≤ 1.1", "? (race not finished)")


def test_bench_llm_prints_the_bounds_of_the_step_rule_and_of_the_control(capsys):
    """print_report's step-rule ratios and the control's SAZO ÷ uniform printed "–" (or nothing) where a median run
    was cut short of the target, though summarise had stored the bound."""
    from benchmarks import llm_report
    from test_bench_tables import fake_run

    slow, fast = [1.0, 0.8, 0.7, 0.6], [1.0, 0.45, 0.4]       # slow: cut at 30 queries short of 0.5·F₀
    runs = {"sazo": [fake_run("sazo", fast)] * 3, "sazo+rule": [fake_run("sazo+rule", slow)] * 3,
            "uniform": [fake_run("uniform", slow)] * 3, "uniform+rule": [fake_run("uniform+rule", fast)] * 3}
    setting = {"label": "SmolLM2 LoRA r4 homogeneous (N=24, B=4)", "N": 24, "heterogeneity_at_theta0": 1.0,
               "grid": {}, "chosen_lr": {v: 1e-3 for v in runs}, "runs": runs}
    report = {"args": {"eps": 1e-3, "targets": [0.5]}, "date": "2026-12-07 20:00 UTC", "machine": "m",
              "runtime_s": 1.0, "settings": [setting]}
    llm_report.print_report(report)
    out = capsys.readouterr().out
    assert "with the step rule: uniform÷SAZO=< 0.33 (a median run" in out       # uniform+rule 10 vs SAZO+rule > 30
    assert "SAZO÷SAZO+rule=< 0.33 (a median run" in out
    assert "homogeneous: SAZO÷uniform < 0.33 (a median run was cut short" in out   # uniform > 30 against SAZO's 10


# -- make bench-llm --cached-only: a race read from its cache loads no model -------------------------------------------
def cached_main(monkeypatch, tmp_path, build, extra=()):
    """llm_queries.main on one fake setting (patched runs and θ₀ design) with a run cache; returns the report."""
    from benchmarks import llm_queries
    from test_bench_tables import patch_runs

    patch_runs(monkeypatch, {1e-3: [1.0, 0.45, 0.4], 1.41e-3: [1.0, 2.0]})
    setting = llm_queries.Setting("tiny fake (B=1)", build, {"uniform": 1e-3}, 1, 40, 10, variants=("uniform",),
                                  cells=3, grid_seeds=3, seeds=4, budget_runs=False)
    monkeypatch.setattr(llm_queries, "settings", lambda args: [setting])
    monkeypatch.setattr(llm_queries, "design_at_theta0", lambda *a, **k: {
        "v_uniform_ratio": 1.5, "grad_sq_ratio": 0.5, "gain": {"1": 1.5}, "F0": 1.0, "eps_relative_error": [0.01]})
    monkeypatch.setattr(llm_queries, "run_workers", lambda *a, **k: pytest.fail("workers started"))
    out = tmp_path / "report.json"
    llm_queries.main(["--sets", "--tiny", "llama", "--targets", "0.5", "0.4", "--run-cache", str(tmp_path / "cache"),
                      "--out", str(out), *extra])
    return json.loads(out.read_text())


def test_cached_only_reads_a_race_without_loading_the_model(monkeypatch, tmp_path, capsys):
    """--cached-only built every setting's θ₀ (SmolLM2 loaded, its first round and top-block activations) before
    reading a single run from the cache, and started --jobs worker processes that each loaded it again."""
    torch = pytest.importorskip("torch")
    loads = []
    build = lambda: loads.append(1) or (None, [torch.zeros(3)], [0] * 4, None, None)
    whole = cached_main(monkeypatch, tmp_path, build, ["--jobs", "1"])
    assert loads == [1] and whole["settings"][0]["N"] == 4 and whole["settings"][0]["tuned_parameters"] == 3
    never = lambda: pytest.fail("the model was loaded")
    again = cached_main(monkeypatch, tmp_path, never, ["--cached-only", "--jobs", "2"])
    assert again["settings"] == whole["settings"]
    assert "N=4, d=3" in capsys.readouterr().out
    for path in (tmp_path / "cache").glob("run-*.json"):       # a cache written before the sizes were saved in it
        if "sizes" in json.loads(path.read_text())["key"]:
            path.unlink()
    assert cached_main(monkeypatch, tmp_path, build, ["--cached-only"])["settings"] == whole["settings"]
    assert loads == [1, 1]          # loaded for the sizes alone, which are saved now
    assert cached_main(monkeypatch, tmp_path, never, ["--cached-only"])["settings"] == whole["settings"]


@pytest.mark.parametrize("extra", [["--gd-lrs", "1e-3"], ["--measure-sets", "continual"]])
def test_cached_only_refuses_options_that_would_compute(capsys, tmp_path, extra):
    """--cached-only --gd-lrs 1e-3 ran full-batch GD on SmolLM2 (and --measure-sets a backprop over N): neither is in
    the run cache, so a run that 'computes nothing' loaded the model and computed them."""
    from benchmarks import llm_queries
    from test_bench_cli import refused

    (tmp_path / "cache").mkdir()
    refused(capsys, lambda: llm_queries.parse_args(["--cached-only", "--run-cache", str(tmp_path / "cache"), *extra]),
            "--cached-only", extra[0])


# -- docs/benchmarks.md: every measured figure with its own date ---------------------------------------------------------
@pytest.mark.parametrize("figure", ["`default_median_ratio` of 0.61 once", "at load 6 read 0.80"])
def test_the_load_noise_figures_of_the_step_ratio_carry_their_own_date(figure):
    """Two figures of the paragraph on how the step ratios are measured stood in the section dated 2026-12-04 with no
    date of their own; they were measured the night of 2026-12-06 to 07 (git log -S, the session's note)."""
    import re
    from pathlib import Path

    text = " ".join((Path(__file__).parent.parent / "docs" / "benchmarks.md").read_text().split())
    sentence = text[text.index(figure):].split(". ")[0]
    assert re.search(r"2026-12-0[67]", sentence) and "2-core machine" in sentence, sentence


# -- make bench-llm: an option no raced setting reads is said, not taken without a word ---------------------------------
@pytest.mark.parametrize("argv, unread", [
    (["--steps", "3000"], "--steps"),                       # the top-block race reads --top-steps
    (["--big-n", "96"], "--big-n"),
    (["--sets", "top-homogeneous", "--top-steps", "800"], "--top-steps"),
    (["--walk-pull", "0.1"], "--walk-pull"),                # no +pull variant raced
    (["--tiny-n", "8"], "--tiny-n"),
    (["--stale-every", "5"], "--stale-every"),
    (["--variant-start", "oracle+cap=1e-3"], "--variant-start oracle+cap=1e-3"),       # no +cap variant raced
    (["--sets", "opposed", "--variant-start", "uniform+bound=1e-3"], "uniform+bound"),
])
def test_an_option_no_raced_setting_reads_is_named(capsys, argv, unread):
    """`make bench-llm BENCH_LLM_ARGS="--steps 3000"` raced the default top-block runs of 6,000 steps without a word
    (--steps sizes the continual set's runs): the hour's report looked like the one asked for."""
    from benchmarks import llm_queries

    llm_queries.parse_args(argv)
    err = capsys.readouterr().err
    assert "warning" in err and unread in err and "change nothing" in err, err
    llm_queries.parse_args([*argv, "--worker", "0/2"])        # a worker re-reads the command: said once, by the parent
    assert capsys.readouterr().err == ""


@pytest.mark.parametrize("argv", [
    ["--sets", "continual", "--steps", "30", "--num-train", "8", "--stale-every", "5"],
    ["--sets", "opposed", "--big-n", "96", "--variants", "uniform+pull", "sazo", "--walk-pull", "0.1"],
    ["--top-steps", "800", "--top-start", "sazo=1e-3", "--variant-start", "uniform+bound=1e-3"],
    ["--sets", "--tiny", "llama", "--tiny-n", "8", "--measure-sets", "opposed", "--big-n", "96", "--walk-radii", "10"],
    ["--sets", "--gd-lrs", "1e-3", "--steps", "30", "--log-every", "5"],
    ["--quick"],
])
def test_options_a_raced_setting_reads_pass_without_a_warning(capsys, argv):
    from benchmarks import llm_queries

    llm_queries.parse_args(argv)
    assert "warning" not in capsys.readouterr().err


def test_the_chosen_rate_keeps_as_many_seeds_as_seeds_says(monkeypatch):
    """With --seeds 2 below --grid-seeds 3 a race whose chosen cell's runs count as finals reported 3 seeds (the whole
    cell), as if --seeds were not given; now its first 2, as --seeds says."""
    from benchmarks import llm_queries
    from test_bench_tables import patch_runs

    patch_runs(monkeypatch, {1e-3: [1.0, 0.45, 0.4], 1.41e-3: [1.0, 2.0]})
    args = llm_queries.parse_args(["--sets", "--tiny", "--targets", "0.5", "0.4"])
    for seeds in (2, 3, 4):
        setting = llm_queries.Setting("fake", None, {"uniform": 1e-3}, 1, 40, 10, variants=("uniform",), cells=3,
                                      grid_seeds=3, seeds=seeds, budget_runs=False)
        out = {"grid": {}, "chosen_lr": {}, "runs": {}}
        llm_queries.race_variant(setting, "uniform", None, [], None, None, args, out)
        assert [r["seed"] for r in out["runs"]["uniform"]] == list(range(seeds))


def test_score_lag_race_prints_the_floor_of_a_method_that_never_reached_the_target(monkeypatch, capsys):
    """score_lag --race printed "median not reached" where the race knows the median is above the queries its
    runs made (as make bench's table now says)."""
    from benchmarks import score_lag

    missed = {"lr": None, "median": None, "min": None, "max": None, "per_seed": [None] * 3, "grid": {"0.001": None},
              "floor": 60000}
    monkeypatch.setattr(queries, "best_learning_rate", lambda *a, targets, **k: {t: missed for t in targets})
    score_lag.race("quadratic σ=1.5", ["sazo"], [0.001], [0, 1, 2], targets=(0.02,))
    assert "median not reached (> 60000) per seed" in capsys.readouterr().out


def test_make_bench_grades_no_language_model_goal_on_one_seed():
    """A race run by hand with --grid-seeds 1 --seeds 1 (not --quick) was graded as the race: "yes" for
    uniform ÷ SAZO ≥ 2 from a single pair of runs, where the --quick pilot's one seed is shown and never graded."""
    section = control_section(ratio=2.0)
    setting = section["settings"][0]
    setting["label"] = setting["label"].replace("homogeneous (N=32 alike", "opposed (N=32, 4 new")
    setting["ratios"] = {"uniform/sazo+bound@0.3": 2.5, "sazo/oracle+bound@0.3": 1.0, "uniform/oracle+bound@0.3": 2.5}
    graded = {r[1].rsplit(": ", 1)[1]: r[4] for r in run._llm_rows(section)}
    assert graded == {"uniform ÷ oracle": "NO", "uniform ÷ SAZO": "yes", "SAZO ÷ oracle": "yes"}
    setting["seeds"] = {"uniform+bound": 1, "sazo+bound": 1, "oracle+bound": 5}
    graded = {r[1].rsplit(": ", 1)[1]: r[4] for r in run._llm_rows(section)}
    assert graded == {"uniform ÷ oracle": "not graded (one seed)", "uniform ÷ SAZO": "not graded (one seed)",
                      "SAZO ÷ oracle": "not graded (one seed)"}
    setting["seeds"]["sazo+bound"] = 3
    assert {r[1].rsplit(": ", 1)[1]: r[4] for r in run._llm_rows(section)}["SAZO ÷ oracle"] == "yes"
    from test_bench_tables import fake_setting
    one = fake_setting("x", {"uniform": [[1.0, 0.4]], "sazo": [[1.0, 0.4]] * 3})
    report = {"settings": [one], "args": {"targets": [0.5]}, "date": "d", "machine": "m"}
    assert run._section_of(report, "s", "t")["settings"][0]["seeds"] == {"uniform": 1, "sazo": 3}


@pytest.mark.parametrize("extra", [["--samplers", "sazo"], ["--seeds", "0"], ["--lr-scale", "2"], ["--every", "250"]])
def test_heldout_path_summary_refuses_the_options_it_does_not_apply(capsys, tmp_path, extra):
    """llm_heldout_path --summary --samplers sazo printed every sampler's runs of the file, the option taken without a
    word (--seeds, --steps, --every and --lr-scale alike)."""
    from benchmarks import llm_heldout_path
    from test_bench_cli import refused

    saved = tmp_path / "path.json"
    saved.write_text(json.dumps({"runs": []}))
    refused(capsys, lambda: llm_heldout_path.main(["--json", str(saved), "--summary", *extra]), extra[0], "--summary")
    llm_heldout_path.main(["--json", str(saved), "--summary"])


# -- make bench's table: the step-cost goal says what the run's verdict says -----------------------------------------------
def speed_section(ratio, median_ratio):
    from benchmarks import engine_speed

    r = {"model": "smollm2", "forward_s": 1.0, "default_noise": "GaussianTable"}
    for variant in engine_speed.VARIANTS:
        r[f"{variant}_ratio"], r[f"{variant}_median_ratio"] = 1.1, 1.1
    r["default_ratio"], r["default_median_ratio"] = ratio, median_ratio
    return {"speed/smollm2": r}


@pytest.mark.parametrize("ratio, median_ratio, met", [(1.30, 0.80, "not judged (load)"), (1.30, 1.25, "NO"),
                                                      (1.05, 0.80, "yes")])
def test_the_tables_step_cost_verdict_is_the_runs(ratio, median_ratio, met):
    """A default step past 1.15 in timings the load swamped: make bench printed "NOT JUDGED (load)" and exited 0, but
    its table (printed and stored in bench.json) said the goal was not met ("NO")."""
    rows = [r for r in run.table_rows(speed_section(ratio, median_ratio)) if "default (" in r[1]]
    assert rows[0][3:] == ("≤ 1.15", met)


# -- benchmarks.class_runs: a printout is stored under the digest of the code that printed it ------------------------------
def test_class_run_stores_the_digest_of_the_code_that_ran(monkeypatch, tmp_path):
    """The digest in a stored class run's header was taken from the notebook file after the run (minutes to an hour):
    a code cell edited meanwhile labelled the old code's printout as the new code's, and the claims test then took
    the printout as the current notebook's."""
    nbformat = pytest.importorskip("nbformat")
    nbclient = pytest.importorskip("nbclient")
    from benchmarks import class_runs
    from sazo_lite.course import claims

    (tmp_path / "notebooks").mkdir()
    source = tmp_path / "notebooks" / "demo.ipynb"
    before = nbformat.v4.new_notebook(cells=[nbformat.v4.new_code_cell("print(1)")])
    nbformat.write(before, source)
    after = nbformat.v4.new_notebook(cells=[nbformat.v4.new_code_cell("print(2)")])

    class EditedMeanwhile:      # runs the copy; the notebook's file is edited while it runs
        def __init__(self, notebook, **kwargs):
            self.notebook = notebook

        def execute(self):
            nbformat.write(after, source)
            self.notebook.cells[0].outputs = [nbformat.v4.new_output("stream", name="stdout", text="1\n")]

    monkeypatch.setattr(nbclient, "NotebookClient", EditedMeanwhile)
    monkeypatch.setattr(class_runs, "ROOT", tmp_path)
    monkeypatch.setattr(class_runs, "STORE", tmp_path / "store")
    class_runs.run("demo")
    fields, body = class_runs.stored("demo")
    assert body == "1\n" and fields["code"] == claims.code_digest(json.loads(nbformat.writes(before)))
    assert fields["code"] != claims.code_digest(json.loads(nbformat.writes(after)))


def test_a_report_read_with_cached_only_says_its_date_is_the_readings(tmp_path):
    """A --cached-only report was stamped with the date and "2 process(es) × 1 thread(s)" of the reading, and make
    bench showed it as "bench-llm <that date>", as if the race had been measured then by two workers."""
    import time
    from benchmarks import llm_queries
    from test_bench_tables import fake_setting

    (tmp_path / "cache").mkdir()
    args = llm_queries.parse_args(["--cached-only", "--run-cache", str(tmp_path / "cache")])
    report = llm_queries.stamp({"settings": []}, args, time.perf_counter())
    assert "no run computed" in report["machine"] and "process(es)" not in report["machine"]
    report["settings"] = [fake_setting("SmolLM2 x", {"uniform": [[1.0, 0.4]] * 3})]
    section = run._section_of(report, "this machine's latest llm_queries.json", "bench-llm")
    assert section["title"] == "bench-llm; read from its run cache with --cached-only on"
    assert f"bench-llm; read from its run cache with --cached-only on {report['date']}" in run._llm_rows(section)[0][1]
    report["args"]["cached_only"], report["part_args"] = False, {"a.json": {"cached_only": True}, "b.json": {}}
    assert "--cached-only" in run._section_of(report, "s", "bench-llm")["title"]      # a merged part read so
    plain = llm_queries.stamp({"settings": []}, llm_queries.parse_args(["--jobs", "2"]), time.perf_counter())
    assert "2 process(es)" in plain["machine"]


# -- benchmarks.gpu_check: the restore of a failed step is a check with a verdict ------------------------------------------
@pytest.mark.parametrize("restores", [True, False])
def test_gpu_check_judges_the_restore_of_a_failed_step(monkeypatch, restores):
    """check_correctness recorded restore_max_abs and no verdict: a TritonNoise step that left θ moved after its
    closure raised passed the device check (exit 0). Now "restore" is a check, within ``precision.restore_bound``
    (here on the CPU, the kernel faked: a MeZO that restores, or one that leaves θ + εz)."""
    torch = pytest.importorskip("torch")
    from benchmarks import gpu_check
    from sazo_lite.engine import MeZO

    class FakeNoise:        # param ← shrink·param + coefficient·1 (z ≡ 1)
        def apply(self, jobs):
            for job in jobs:
                job.param.mul_(job.shrink).add_(job.coefficient)

    class Unrestored:       # shifts θ by +εz, then the closure raises: θ left there
        def __init__(self, params, lr, eps, noise):
            self.params, self.eps = params, eps

        def step(self, closure):
            for p in self.params:
                p.add_(self.eps)
            closure()

    monkeypatch.setattr(gpu_check, "TritonNoise", FakeNoise)
    monkeypatch.setattr(gpu_check, "triton_direction", lambda theta, seed, perturbation: torch.ones(theta.shape))
    monkeypatch.setattr(gpu_check, "MeZO", (lambda params, lr, eps, noise: MeZO(params, lr=lr, eps=eps)) if restores
                        else Unrestored)
    out = gpu_check.check_correctness(torch.device("cpu"))
    assert out["restore"]["ok"] is restores and out["restore_max_abs"] == out["restore"]["max_abs"]
    assert (out["restore_max_abs"] > 1e-4) is not restores

"""The benchmark CLIs as a user runs them (fifth round): the toy race's choice against a plain reference (every
run to its end, then the median rule), names given twice, merged reports that overlap. Every test runs on fakes
or tiny settings: seconds in all, no timing assertions."""
import json
import math
import statistics
from pathlib import Path

import pytest
from hypothesis import example, given, settings, strategies as st

from benchmarks import queries
from benchmarks.llm_report import merge
from sazo_lite.train import past_edge


# -- benchmarks.queries.best_learning_rate against a plain reference ------------------------------------------------
class PlannedRun:
    """A TargetRun stand-in whose future is given: ``hits[target]`` the step it first crosses that target (None:
    never; smaller targets later) and ``diverge`` the step it diverges at (None: never). It stops at the smallest
    target or at its divergence, as TargetRun does; a count is 2·B·steps."""

    batch_size = 1

    def __init__(self, hits: dict, diverge):
        self.hits, self.diverge, self.targets = hits, diverge, tuple(sorted(hits, reverse=True))
        self.reached = {t: None for t in self.targets}
        self.steps, self.failed = 0, False

    @property
    def queries(self):
        return self.reached[self.targets[-1]]

    def extend_to(self, steps: int) -> "PlannedRun":
        if self.failed or self.queries is not None or steps <= self.steps:
            return self
        crossed = lambda t: self.hits[t] is not None and (self.diverge is None or self.hits[t] < self.diverge)
        ends = [steps] + [self.hits[self.targets[-1]]] * crossed(self.targets[-1]) + [self.diverge] * (
            self.diverge is not None)
        self.steps = min(ends)
        for t in self.targets:
            if crossed(t) and self.hits[t] <= self.steps:
                self.reached[t] = 2 * self.batch_size * self.hits[t]
        self.failed = self.diverge is not None and self.diverge <= self.steps
        return self


def race(plan: dict, seeds: int, max_steps: int, targets, **kwargs) -> dict:
    made = {}
    make = lambda lr, seed: made.setdefault((lr, seed), PlannedRun(*plan[lr][seed]))
    return queries.best_learning_rate(make, list(plan), list(range(seeds)), max_steps, targets=targets, **kwargs)


def reference(plan: dict, max_steps: int, targets) -> dict:
    """Every run to its end, then the rule as documented: a rate where at least half of the seeds diverged is
    lost; per target the rate of the fewest median queries (a miss counts as never; the first on ties)."""
    runs = {lr: [PlannedRun(*p).extend_to(max_steps) for p in plans] for lr, plans in plan.items()}
    lost = {lr for lr, rs in runs.items() if past_edge([r.failed for r in rs])}
    out, medians = {}, {}
    for t in targets:
        medians[t] = {lr: statistics.median([math.inf if r.reached[t] is None else r.reached[t] for r in rs])
                      for lr, rs in runs.items()}
        best = min([lr for lr in runs if lr not in lost] or list(runs), key=medians[t].get)
        out[t] = None if math.isinf(medians[t][best]) else (best, medians[t][best], [r.reached[t] for r in runs[best]])
    return out, lost, medians


def test_a_rate_that_diverges_after_the_budget_stopped_is_not_chosen_at_a_target_it_crossed_first():
    """The race stopped growing its budget once a rate reached the smallest target; a rate still racing then,
    whose seeds had crossed 2% fast, won the 2% column, and 2 of its 3 seeds diverged when run on (for the
    min–max): a lost rate chosen, against the documented rule. It now gives way to the next rate."""
    targets = (0.02, 0.005)
    plan = {1e-3: [({0.02: 400, 0.005: 900}, None)] * 3,
            2e-3: [({0.02: 100, 0.005: None}, 1500)] * 2 + [({0.02: 100, 0.005: 2000}, None)]}
    out = race(plan, 3, 5000, targets)
    assert out[0.02]["lr"] == 1e-3 and out[0.02]["median"] == 800, out[0.02]
    assert out[0.02]["grid"][repr(2e-3)] is None      # lost: no median shown
    assert reference(plan, 5000, targets)[0][0.02][0] == 1e-3


def test_with_an_even_number_of_seeds_a_rate_half_way_there_is_raced_on():
    """With 2 seeds a median is the mean of both: a rate with one seed at 20 queries and one still racing could
    reach a median of 1010 while another rate's 1800 had won and stopped the race: the race reported 1800 and the
    faster rate as unable to beat it. Now a rate still racing is run on while it can still win."""
    plan = {1e-3: [({0.5: 900}, None)] * 2, 2e-3: [({0.5: 10}, None), ({0.5: 1000}, None)]}
    out = race(plan, 2, 5000, (0.5,))
    assert (out[0.5]["lr"], out[0.5]["median"], out[0.5]["per_seed"]) == (2e-3, 1010, [20, 2000])
    assert out[0.5]["grid"] == {repr(1e-3): 1800, repr(2e-3): 1010}


def test_a_budget_that_does_not_grow_is_refused_not_looped_on():
    """best_learning_rate(first_budget=3) grew its budget by int(1.25 · 3) = 3: the same budget for ever (a hang)."""
    plan = {1e-3: [({0.5: 50}, None)]}
    assert race(plan, 1, 100, (0.5,), first_budget=3)[0.5]["median"] == 100
    for bad in ({"growth": 1.0}, {"growth": math.nan}, {"first_budget": 0}):
        with pytest.raises(ValueError, match=f"Invalid {next(iter(bad))}"):
            race(plan, 1, 100, (0.5,), **bad)
    with pytest.raises(ValueError, match="Invalid grid"):
        queries.best_learning_rate(lambda lr, seed: None, [], [0], 100, targets=(0.5,))
    with pytest.raises(ValueError, match="Invalid seeds"):
        queries.best_learning_rate(lambda lr, seed: None, [1e-3], [], 100, targets=(0.5,))


@st.composite
def plans(draw):
    """A grid of 1–4 rates × 1–5 seeds, each run crossing 0.1 then 0.02 (or not) and diverging (or not)."""
    seeds, rates = draw(st.integers(1, 5)), draw(st.integers(1, 4))
    step = st.one_of(st.none(), st.integers(1, 400))

    def one_run():
        first, extra, diverge = draw(step), draw(step), draw(step)
        second = None if first is None or extra is None else first + extra
        if diverge is not None and diverge in (first, second):
            diverge += 1
        return {0.1: first, 0.02: second}, diverge
    return {1e-3 * (k + 1): [one_run() for _ in range(seeds)] for k in range(rates)}, seeds


@settings(max_examples=300, deadline=None)
@given(plans(), st.integers(4, 60))     # smaller first budgets: the test above
@example(({1e-3: [({0.1: 2, 0.02: 3}, None)], 2e-3: [({0.1: 1, 0.02: None}, 5)]}, 1), 4)     # lost after the stop
@example(({1e-3: [({0.1: 9, 0.02: 9}, None)] * 2, 2e-3: [({0.1: 1, 0.02: 1}, None), ({0.1: 9, 0.02: 12}, None)]},
          2), 4)    # two seeds: a median half way there
def test_the_race_chooses_what_running_every_seed_to_the_end_would(case, first_budget):
    """The budgeted race (stop early, run only the winners on) against the plain rule over complete runs: the
    same rate, median, per-seed counts and min–max at every target, wherever some rate is not lost."""
    plan, seeds = case
    targets, max_steps = (0.1, 0.02), 800
    out = race(plan, seeds, max_steps, targets, first_budget=first_budget)
    expected, lost, medians = reference(plan, max_steps, targets)
    for t in targets:
        got = out[t]
        if len(lost) == len(plan):      # every rate lost: the fallback reads runs stopped early; only consistency
            assert got["lr"] is None or got["median"] == statistics.median(
                [math.inf if q is None else q for q in got["per_seed"]])
            continue
        if expected[t] is None:
            assert got["lr"] is None and got["median"] is None, (t, got)
            continue
        lr, median, per_seed = expected[t]
        assert (got["lr"], got["median"], got["per_seed"]) == (lr, median, per_seed), (t, got, expected[t])
        finite = [q for q in per_seed if q is not None]
        assert got["min"] == min(finite) and got["max"] == (max(finite) if len(finite) == len(per_seed) else None)
        # a rate's median shown in the grid is its median over complete runs (None: lost, or it could not win)
        assert all(shown is None or shown == medians[t][float(rate)] for rate, shown in got["grid"].items())
        assert got["grid"][repr(lr)] == median


# -- a name given twice is raced once ------------------------------------------------------------------------------
def test_queries_races_a_method_named_twice_once(monkeypatch, tmp_path):
    """--methods uniform sazo sazo raced SAZO twice (twice the time) and printed its column twice."""
    from test_bench_round3 import stub_queries

    module, argv = stub_queries(monkeypatch, tmp_path)
    assert module.main([*argv, "--methods", "sazo", "uniform", "sazo"])["methods"] == ["sazo", "uniform"]


def test_score_lag_races_a_method_named_twice_once(monkeypatch):
    from benchmarks import score_lag
    from test_bench_round3 import tiny_problems

    calls = []
    monkeypatch.setattr(score_lag, "race", lambda problem, methods, grid, seeds, targets, max_steps: calls.append(
        (list(methods), list(targets))))
    monkeypatch.setattr("benchmarks.queries.default_problems", tiny_problems)
    score_lag.main(["--race", "--problem", "quadratic σ=0", "--methods", "sazo", "oracle", "sazo",
                    "--targets", "0.1", "0.1"])
    assert calls == [(["sazo", "oracle"], [0.1])]


@pytest.mark.parametrize("argv, expected", [
    (["--sets", "top-opposed", "top-opposed"], 3),      # a second setting of the same label: hours more
    (["--sets", "top-opposed", "--top-variants", "uniform+bound", "sazo+bound", "uniform+bound"], 2),
    (["--sets", "opposed", "--variants", "uniform", "sazo", "uniform"], 2),
    (["--sets", "--tiny", "llama", "llama", "--tiny-variants", "sazo", "uniform", "sazo"], 2),
    (["--sets", "--tiny-homogeneous", "llama", "llama"], 2),
])
def test_llm_queries_races_a_set_or_sampler_named_twice_once(argv, expected):
    from benchmarks import llm_queries

    args = llm_queries.parse_args(argv, run=True)
    units = llm_queries.units(args)
    assert len(units) == len(set(units)) == expected, units
    assert len({s.label for s in llm_queries.settings(args)}) == len(llm_queries.settings(args))


def test_llm_queries_measures_a_set_and_a_gd_rate_given_twice_once():
    from benchmarks import llm_queries

    args = llm_queries.parse_args(["--sets", "--measure-sets", "opposed", "opposed", "--gd-lrs", "1e-3", "1e-3",
                                   "--walk-radii", "10", "10"], run=True)
    assert (args.measure_sets, args.gd_lrs, args.walk_radii) == (["opposed"], [1e-3], [10.0])


def test_llm_families_probes_a_family_named_twice_once(monkeypatch, capsys):
    from benchmarks import llm_families

    probed = []
    monkeypatch.setattr(llm_families, "probe", lambda family, blocks: probed.append(family) or {
        "outcome": "equal", "gap": None, "error": None})
    family = sorted(llm_families.FAMILIES)[0]
    llm_families.main(["--families", family, family])
    assert probed == [family] * 3, probed         # k = 1, 2 and every block, once
    assert "families: 1 equal" in capsys.readouterr().out


def test_llm_topblock_runs_a_pull_strength_given_twice_once(monkeypatch, capsys):
    from benchmarks import llm_topblock

    seen = []
    monkeypatch.setattr(llm_topblock, "top_start", lambda setting: None)
    monkeypatch.setattr(llm_topblock, "pull_floor", lambda strengths, radii, **kwargs: seen.append(
        (list(strengths), list(radii))) or {})
    monkeypatch.setattr(llm_topblock.torch, "set_num_threads", lambda n: None)
    llm_topblock.main(["gd", "--lr", "0.05", "--pull-floor", "0", "0.01", "0", "--walk-radii", "10", "20", "10"])
    assert seen == [([0.0, 0.01], [10.0, 20.0])]


# -- make bench-llm --merge: parts that overlap ---------------------------------------------------------------------
def part(tmp_path, name: str, variant: str, queries: list) -> str:
    run = {"queries": queries, "train_loss": [1.0] + [0.4] * (len(queries) - 1), "diverged": False}
    setting = {"label": "tiny llama", "heterogeneity_at_theta0": 1.0, "runs": {variant: [run]},
               "grid": {}, "chosen_lr": {variant: 1e-3}}
    path = tmp_path / name
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps({"settings": [setting], "args": {"eps": 1e-3, "targets": [0.5]}, "runtime_s": 1.0,
                                "date": "2026-12-07 07:00 UTC", "machine": "test"}))
    return str(path)


def test_merge_refuses_two_parts_holding_the_same_samplers_runs(tmp_path, capsys):
    """--merge a.json b.json where both raced uniform in one setting printed and wrote one of the two without a
    word (the later replaced the earlier, whatever its runs); the same file given twice doubled the runtime."""
    from benchmarks import llm_queries
    from test_bench_cli import refused

    first = part(tmp_path, "a.json", "uniform", [0, 100])
    again = part(tmp_path / "other", "a.json", "uniform", [0, 900])      # another folder, the same file name
    sazo = part(tmp_path, "b.json", "sazo", [0, 200])
    for paths in ([first, again], [first, first]):
        refused(capsys, lambda: llm_queries.parse_args(["--merge", *paths, "--out", str(tmp_path / "m.json")]),
                "--merge", "both hold uniform's runs in 'tiny llama'")
    merged = merge([first, sazo])
    assert set(merged["settings"][0]["runs"]) == {"uniform", "sazo"}
    llm_queries.parse_args(["--merge", first, sazo, "--out", str(tmp_path / "m.json")])


def test_merge_refuses_a_setting_without_its_label_as_a_usage_error(tmp_path, capsys):
    from benchmarks import llm_queries
    from test_bench_cli import refused

    bad = tmp_path / "bad.json"
    bad.write_text(json.dumps({"settings": [{"runs": {"uniform": []}}], "args": {}}))
    refused(capsys, lambda: llm_queries.parse_args(["--merge", str(bad), "--out", str(tmp_path / "m.json")]),
            "--merge", "not reports of this benchmark")


# -- an output folder where nothing can be written: refused before the run ------------------------------------------
@pytest.fixture
def read_only(monkeypatch, tmp_path):
    """tmp_path/ro behaves as a read-only folder (as root, permissions do not stop a write: the file system does)."""
    import errno
    import tempfile

    folder = tmp_path / "ro"
    folder.mkdir()
    real = tempfile.TemporaryFile

    def refuse(*args, dir=None, **kwargs):
        if dir is not None and Path(dir) == folder:
            raise OSError(errno.EROFS, "Read-only file system")
        return real(*args, dir=dir, **kwargs)
    monkeypatch.setattr(tempfile, "TemporaryFile", refuse)
    return folder


@pytest.mark.parametrize("module, argv", [
    ("queries", ["--quick", "--out", "{ro}/q.json"]),
    ("queries", ["--quick", "--run-cache", "{ro}/cells"]),
    ("run", ["--quick", "--out", "{ro}/sub/bench.json"]),
    ("llm_topblock", ["uniform", "--lr", "1e-3", "--json", "{ro}/run.json"]),
])
def test_an_output_where_nothing_can_be_written_is_refused_before_the_run(capsys, monkeypatch, read_only, module, argv):
    """benchmarks.queries --quick --out /proc/q.json raced every cell, then ended in a FileNotFoundError traceback
    from the atomic write: the run's numbers were lost (a full run: 45 minutes). Now a usage error, before the run."""
    import importlib
    from test_bench_cli import refused

    m = importlib.import_module(f"benchmarks.{module}")
    for name in ("run_queries_benchmark", "run_sections", "top_start"):
        if hasattr(m, name):
            monkeypatch.setattr(m, name, lambda *a, **k: pytest.fail("the run started"))
    option = next(a for a in argv if a.startswith("--") and "{ro}" in argv[argv.index(a) + 1])
    refused(capsys, lambda: m.main([a.format(ro=read_only) for a in argv]), option, "cannot write in",
            "Read-only file system")


# -- make bench-llm: a grid cell cut at the best median so far, with an even number of seeds ---------------------------
def test_llm_race_does_not_cut_a_cell_that_could_still_win_with_an_even_number_of_seeds(monkeypatch):
    """A cell after the first is cut at the best median so far plus one log point. With --grid-seeds 2 a median is
    the mean of two runs: a rate whose seeds reach 0.5·F₀ at 50 and 1000 queries (median 525) was cut at 950 when
    the best was 900, read as never, and the slower rate chosen."""
    from benchmarks import llm_queries

    hit_step = {(1e-3, 0): 450, (1e-3, 1): 450, (1.41e-3, 0): 10, (1.41e-3, 1): 500}

    def fake_run(theta0, model, params, train, test, sampler, *, lr, seed, steps, log_every, **settings):
        hit = hit_step.get((lr, seed % 2))
        logged = list(range(0, steps + 1, log_every))
        end = next((s for s in logged if hit is not None and s >= hit), logged[-1])
        logged = logged[:logged.index(end) + 1]
        losses = [1.0 if s < (hit or math.inf) else 0.4 for s in logged]
        return {"queries": [2 * s for s in logged], "train_loss": losses,
                "diverged": False, "walk": [0.0] * len(logged), "max_step_scale": 1.0, "max_weight": 1.0}
    monkeypatch.setattr(llm_queries, "run_from", fake_run)
    args = llm_queries.parse_args(["--sets", "--tiny", "llama", "--grid-seeds", "2", "--seeds", "2",
                                   "--tiny-cells", "2",
                                   "--targets", "0.5", "--tiny-start", "1e-3", "--tiny-steps", "2000"])
    setting = llm_queries.settings(args)[0]
    out = {"grid": {}, "chosen_lr": {}, "runs": {}}
    llm_queries.race_variant(setting, "uniform", None, [], None, None, args, out)
    assert out["chosen_lr"]["uniform"] == 1.41e-3, out["grid"]
    assert [run["queries"][-1] for run in out["runs"]["uniform"]] == [50, 1000]


# -- make bench: a Ctrl-C while a section is being saved ------------------------------------------------------------
def sections_then(run, interrupt_at_write=None):
    """run_sections as make bench runs it, with stub sections; ``interrupt_at_write``: Ctrl-C during that write of
    the results file (else after the last section was saved)."""
    def fake(quick, save, only, previous):
        results = dict(previous or {})
        for name in run.section_names(quick):
            if only is None or name in only:
                results[name] = {"error": "stub", "run": "2026-12-07 07:00 UTC"}
                save(results)
        raise KeyboardInterrupt
    return fake


def test_a_ctrl_c_while_a_section_is_saved_leaves_that_section_to_rerun(monkeypatch, capsys, tmp_path):
    """make bench counted a section as saved before its write: a Ctrl-C during the write (the file then keeps the
    sections before it) printed an --only command without that section, which was lost; a Ctrl-C after the last
    section was saved ended in an IndexError traceback."""
    from benchmarks import run

    monkeypatch.delenv("SAZO_FAST", raising=False)
    out = tmp_path / "bench.json"
    monkeypatch.setattr(run, "run_sections", sections_then(run))
    with pytest.raises(SystemExit) as caught:
        run.main(["--quick", "--out", str(out), "--only", "overhead", "sampler"])
    assert caught.value.code == 130 and "every section is saved" in capsys.readouterr().err
    writes, real = [], run.write_text

    def write_text(path, text):
        writes.append(path)
        if len(writes) == 2:        # the second section's write
            raise KeyboardInterrupt
        real(path, text)
    monkeypatch.setattr(run, "write_text", write_text)
    out.unlink()
    with pytest.raises(SystemExit) as caught:
        run.main(["--quick", "--out", str(out), "--only", "overhead", "sampler"])
    err = capsys.readouterr().err
    assert caught.value.code == 130 and "interrupted in sampler" in err and err.rstrip().endswith("--only sampler"), err
    assert set(json.loads(out.read_text())["results"]) == {"overhead"}


def test_llm_queries_reads_accuracy_at_zero_as_none_on_every_set():
    """--accuracy-at 0 was taken (its siblings --top-accuracy-at and --big-accuracy-at read 0 as none), then the
    continual set's first run refused accuracy_at=0 after SmolLM2 had been loaded."""
    from benchmarks import llm_queries

    args = llm_queries.parse_args(["--sets", "continual", "--accuracy-at", "0", "--top-accuracy-at", "0"])
    assert llm_queries.settings(args)[0].accuracy_at is None
    assert llm_queries.settings(llm_queries.parse_args(["--sets", "continual"]))[0].accuracy_at == 100


# -- make bench-llm's ratios and intervals against a plain reference -----------------------------------------------
def llm_run(hit, diverged: bool = False, log: int = 10, end: int = 200) -> dict:
    """A run dict logging F every ``log`` queries: 1.0 until ``hit`` queries (None: never), then 0.3."""
    queries = list(range(0, (hit if hit is not None else end) + 1, log))
    return {"queries": queries, "train_loss": [1.0 if hit is None or q < hit else 0.3 for q in queries],
            "diverged": diverged and hit is None, "walk": [0.0] * len(queries)}


@settings(max_examples=150, deadline=None)
@given(st.lists(st.one_of(st.none(), st.integers(1, 20).map(lambda k: 10 * k)), min_size=1, max_size=6),
       st.lists(st.one_of(st.none(), st.integers(1, 20).map(lambda k: 10 * k)), min_size=1, max_size=6),
       st.booleans())
def test_llm_ratios_and_intervals_are_the_plain_medians_and_bootstrap(uniform, sazo, diverged):
    """summarise's ratio is median ÷ median of the per-seed first hits (a miss never); ratio_text prints it with
    median_ratio_interval of those same counts, numerator first; a median that misses prints no ratio."""
    from benchmarks.llm_report import ratio_text, summarise
    from sazo_lite.train import median_ratio_interval

    setting = {"label": "tiny", "heterogeneity_at_theta0": 1.0, "chosen_lr": {"uniform": 1e-3, "sazo": 1e-3},
               "grid": {}, "runs": {"uniform": [llm_run(h, diverged) for h in uniform],
                                    "sazo": [llm_run(h, diverged) for h in sazo]}}
    summarise(setting, (0.5,))
    plain = lambda hits: statistics.median([math.inf if h is None else h for h in hits])
    u, s = plain(uniform), plain(sazo)
    expected = u / s if math.isfinite(u) and math.isfinite(s) else None
    got = setting["ratios"]["uniform/sazo@0.5"]
    assert got == pytest.approx(expected) if expected is not None else got is None
    text = ratio_text(setting, "uniform", "sazo", 0.5)
    if setting["ratio_bounds"].get("uniform/sazo@0.5"):
        assert "cut short" in text
    elif min(len(uniform), len(sazo)) < 2:
        assert text == (f"{expected:.2f} (one seed)" if expected else "– (one seed)")
    elif math.isinf(u) and math.isinf(s):
        assert text == "–"
    else:
        low, high = median_ratio_interval(uniform, sazo)
        assert text == f"{f'{expected:.2f}' if expected else '–'} [{low:.2f}–{high:.2f}]"


def test_gpu_check_refuses_an_out_that_is_a_file_before_any_cuda_work(monkeypatch, capsys, tmp_path):
    """OUT naming a file was found only after the GPU checks had run (a FileExistsError at the end: the device
    time spent, nothing kept). Now a usage error first."""
    from benchmarks import gpu_check
    from test_bench_cli import refused

    taken = tmp_path / "out"
    taken.write_text("")
    monkeypatch.setenv("OUT", str(taken))
    monkeypatch.setattr(gpu_check, "triton_available", lambda: pytest.fail("the GPU work started"))
    refused(capsys, lambda: gpu_check.main([]), "$OUT", "is a file")

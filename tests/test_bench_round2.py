"""The benchmark CLIs as a user runs them (second round): the race's counting rule, make bench-llm's
workers and its --quick pilot's report, engine_speed's progress and how its ratios are measured.
Every test runs on fakes or tiny settings: seconds in all, no timing assertions (fake clocks)."""
import json
import math
import os
from pathlib import Path

import pytest
import torch

from benchmarks import engine_speed, llm_queries, llm_report, queries, run
from sazo_lite.course.problems import LeastSquares
from sazo_lite.train import History


# -- the race's rule: queries to a target are the first hitting time -------------------------------------------
def fake_train(gaps):
    """A ``train`` that logs ``gaps`` (× the initial gap) every 10 steps and stops as diverged at a non-finite
    or exploded one, as the real one does."""
    def train(optimizer, sampler, losses, steps, *, batch_size, evaluate, log_every, diverge_above, **kwargs):
        history, start = History(), evaluate()
        for k, gap in enumerate(gaps, 1):
            history.queries += [2 * batch_size * (10 * (k - 1) + j) for j in range(1, 11)]
            history.logged_queries.append(2 * batch_size * 10 * k)
            history.metrics.append(gap * start)
            if not gap * start <= diverge_above:
                history.diverged = True
                break
        return history
    return train


def test_a_target_crossed_before_the_run_diverged_counts_its_first_hit(monkeypatch):
    """TargetRun voided a whole extension that diverged: a seed that crossed 2% and then diverged before 0.5%
    counted as never reaching 2% — unless the crossing fell in an earlier extension of the growing budget.
    The docs (queries.py, notebook 05, docs/llm.md) count queries until the gap *first* drops below."""
    monkeypatch.setattr(queries, "train", fake_train([0.5, 0.01, math.inf]))
    run_ = queries.TargetRun(LeastSquares(16, 2, seed=0), "uniform", 1e-3, 0, (0.02, 0.005))
    run_.extend_to(30)
    assert run_.failed and run_.queries is None
    assert run_.reached[0.02] == 40          # the second log point, as the LLM race's queries_to counts it


def test_first_hits_do_not_depend_on_how_the_budget_grew(monkeypatch):
    gaps = [0.5, 0.01, math.inf]
    whole = queries.TargetRun(LeastSquares(16, 2, seed=0), "uniform", 1e-3, 0, (0.02, 0.005))
    monkeypatch.setattr(queries, "train", fake_train(gaps))
    whole.extend_to(30)
    pieces = queries.TargetRun(LeastSquares(16, 2, seed=0), "uniform", 1e-3, 0, (0.02, 0.005))
    monkeypatch.setattr(queries, "train", fake_train(gaps[:2]))
    pieces.extend_to(20)
    monkeypatch.setattr(queries, "train", fake_train(gaps[2:]))
    pieces.extend_to(30)
    assert whole.reached == pieces.reached and whole.failed and pieces.failed


# -- make bench-llm: two workers, one header per setting --------------------------------------------------------
def fake_settings(args):
    build = lambda: (None, [torch.zeros(3)], [0, 1, 2, 3], None, None)
    return [llm_queries.Setting(label, build, {}, 4, 10, 5, variants=("uniform", "sazo", "oracle")[:n])
            for label, n in (("setting A", 3), ("setting B", 2))]


def test_two_workers_print_each_settings_header_once(monkeypatch, capsys, tmp_path):
    """The default race (top-opposed: 3 samplers, top-homogeneous: 2) shared between 2 workers gives each
    worker units of both settings, and each printed both settings' '== ...' lines: every header twice."""
    design = {"v_uniform_ratio": 2.0, "grad_sq_ratio": 0.5, "gain": {"4": 1.5}, "F0": 1.0, "eps_relative_error": [0.01]}
    monkeypatch.setattr(llm_queries, "settings", fake_settings)
    monkeypatch.setattr(llm_queries, "design_at_theta0", lambda *a, **k: design)
    monkeypatch.setattr(llm_queries, "race_variant", lambda *a, **k: None)
    monkeypatch.setattr(llm_queries.torch, "set_num_threads", lambda n: None)   # a worker's: not this process's
    args = llm_queries.parse_args([])
    assert all({k for k, _ in llm_queries.share(args, 2, job)} == {0, 1} for job in (0, 1))   # both share both
    for job in (0, 1):
        llm_queries.main(["--worker", f"{job}/2", "--partial", str(tmp_path / f"part{job}.json")])
    out = capsys.readouterr().out
    assert out.count("== setting A:") == 1 and out.count("== setting B:") == 1, out
    merged = llm_report.merge([tmp_path / "part0.json", tmp_path / "part1.json"])
    assert [s["label"] for s in merged["settings"]] == ["setting A", "setting B"]    # the headers are all there


# -- make bench-llm --quick: its own report, never the race's ---------------------------------------------------
def report(quick: bool, date: str) -> dict:
    fast, slow = [1.0, 0.5, 0.25], [1.0, 0.8, 0.6, 0.45, 0.25]
    curve = lambda losses: {"queries": [10 * k for k in range(len(losses))], "train_loss": losses,
                            "walk": [0.0] * len(losses), "diverged": False}
    return {"date": date, "machine": "m", "args": {"targets": [0.3], "quick": quick},
            "settings": [{"label": "SmolLM2 top-block (k=1) LoRA r4 opposed (N=32, 4 new, B=4)", "B": 4,
                          "heterogeneity_at_theta0": 6.3, "chosen_lr": {"uniform": 1e-3, "sazo": 1e-3}, "grid": {},
                          "runs": {"uniform": [curve(slow)], "sazo": [curve(fast)]}}]}


def test_a_quick_pilot_writes_its_own_report():
    """``make bench-llm BENCH_LLM_ARGS=--quick`` wrote results/llm_queries.json, over the hour-long race."""
    assert llm_queries.parse_args(["--quick"]).out == llm_report.QUICK_RESULTS
    assert llm_report.QUICK_RESULTS != llm_report.RESULTS and llm_report.QUICK_RESULTS.parent == llm_report.RESULTS.parent
    assert llm_queries.parse_args([]).out == llm_queries.RESULTS


def test_a_quick_pilot_refuses_to_replace_a_full_race(capsys, tmp_path):
    race, pilot = tmp_path / "race.json", tmp_path / "pilot.json"
    race.write_text(json.dumps(report(False, "d1")))
    pilot.write_text(json.dumps(report(True, "d2")))
    with pytest.raises(SystemExit) as caught:
        llm_queries.parse_args(["--quick", "--out", str(race)])
    assert caught.value.code == 2 and "--out" in capsys.readouterr().err
    assert llm_queries.parse_args(["--quick", "--out", str(pilot)]).out == pilot    # a pilot over a pilot: fine
    assert llm_queries.parse_args(["--out", str(race)]).out == race                 # a race over a race: fine
    # merged parts of a pilot are a pilot too: their own file by default, never over the race
    assert llm_queries.parse_args(["--merge", str(pilot)]).out == llm_queries.QUICK_RESULTS
    assert llm_queries.parse_args(["--merge", str(race)]).out == llm_queries.RESULTS
    with pytest.raises(SystemExit):
        llm_queries.parse_args(["--merge", str(pilot), "--out", str(race)])


def sections(monkeypatch, tmp_path, files: dict) -> dict:
    """make bench's language-model section with ``files`` (name → report) in results/ and the reference race."""
    results, reference = tmp_path / "results", tmp_path / "reference"
    results.mkdir()
    reference.mkdir()
    (reference / "llm_queries.json").write_text(json.dumps(report(False, "reference day")))
    for name, body in files.items():
        (results / name).write_text(json.dumps(body))
    monkeypatch.setattr(llm_report, "RESULTS", results / "llm_queries.json")
    monkeypatch.setattr(llm_report, "QUICK_RESULTS", results / "llm_queries_quick.json")
    monkeypatch.setattr(llm_report, "REFERENCE", reference / "llm_queries.json")
    return run.llm_queries_section(quick=False)


def test_make_bench_grades_the_race_and_shows_the_pilot_beside_it(monkeypatch, tmp_path):
    section = sections(monkeypatch, tmp_path, {"llm_queries.json": report(False, "race day"),
                                               "llm_queries_quick.json": report(True, "pilot day")})
    assert section["date"] == "race day" and not section["pilot"]
    assert [(s["date"], s["pilot"]) for s in section["more"]] == [("pilot day", True)]
    rows = run._llm_rows(section)
    graded = [r for r in rows if r[3]]
    assert graded and all("race day" in r[1] for r in graded)
    shown = [r for r in rows if "pilot day" in r[1]]
    assert shown and all("--quick pilot" in r[1] and r[3] == r[4] == "" for r in shown)


def test_a_pilot_left_in_the_races_file_is_shown_as_a_pilot_and_the_reference_race_graded(monkeypatch, tmp_path):
    """A pilot written by the earlier code over results/llm_queries.json hid the reference race from make bench."""
    section = sections(monkeypatch, tmp_path, {"llm_queries.json": report(True, "old pilot day")})
    assert section["date"] == "reference day" and "reference" in section["source"] and not section["pilot"]
    assert [(s["date"], s["pilot"]) for s in section["more"]] == [("old pilot day", True)]


# -- engine_speed (make bench-step): progress, and both sides of a ratio measured together -------------------------
class DriftingMachine:
    """A fake clock: a forward costs 1 unit × the load, a step 2 forwards + 0.1, and the load falls by 1% at
    every piece of work (a shared machine whose other jobs end), so that a slot late in a round runs faster."""

    def __init__(self):
        self.now, self.load = 0.0, 2.0

    def work(self, units: float) -> None:
        self.now += units * self.load
        self.load *= 0.99


@pytest.fixture
def machine(monkeypatch):
    fake = DriftingMachine()
    monkeypatch.setattr(engine_speed, "build_model", lambda name: None)
    monkeypatch.setattr(engine_speed, "random_tokens", lambda model, batch, seq, seed=0: None)
    monkeypatch.setattr(engine_speed, "lm_losses", lambda model, tokens: fake.work(1.0))
    monkeypatch.setattr(engine_speed, "distinct_parameters", lambda model: [torch.zeros(4)])
    monkeypatch.setattr(engine_speed, "step_functions", lambda model, params, closure: {
        v: (lambda: (closure(), closure(), fake.work(0.1))) for v in engine_speed.VARIANTS})
    monkeypatch.setattr(engine_speed, "pass_functions", lambda params: {
        s: (lambda: fake.work(0.01)) for s in engine_speed.PASS_SOURCES})
    monkeypatch.setitem(engine_speed.CLOCKS, "wall", lambda: fake.now)
    return fake


def test_a_step_never_reads_cheaper_than_its_two_forwards_under_a_drifting_load(machine):
    """A ZO step is two forwards and more, yet engine_speed once wrote default_median_ratio = 0.61 on a loaded
    machine: each round timed two forwards once, at its start, and then the nine steps one after another, so a
    ratio divided a step by forwards timed up to a round earlier, under another load (and the best-of-rounds
    ratio divided minima taken in different rounds). Each step is now paired with forwards timed beside it."""
    result = engine_speed.speed("gpt2-tiny", rounds=3)
    for variant in engine_speed.VARIANTS:
        assert result[f"{variant}_ratio"] >= 1.0, (variant, result[f"{variant}_ratio"])
        assert result[f"{variant}_median_ratio"] >= 1.0, (variant, result[f"{variant}_median_ratio"])


def test_engine_speed_shows_progress_on_stderr_and_keeps_stdout_json(machine, capsys):
    """make bench-step printed nothing for about 3 minutes (a user thinks it hung)."""
    engine_speed.main(["speed", "gpt2-tiny", "--rounds", "2"])
    out, err = capsys.readouterr()
    result, end = json.JSONDecoder().raw_decode(out)
    assert result["rounds"] == 2 and "default_ratio" in result
    assert "speed gpt2-tiny" in err and "loading" in err          # where it is, while it runs
    assert "loading" not in out and "warm-up" not in out


def test_a_run_where_a_step_reads_cheaper_than_two_forwards_says_its_timings_are_noise():
    """Pairing removes the drift between the two sides, not a loaded machine's noise within a pair (a gpt2-tiny
    run at load 6 read rademacher 0.80): such a ratio is graded as if measured, without a word."""
    quiet = {**{f"{v}_median_ratio": 1.2 for v in engine_speed.VARIANTS}}
    assert engine_speed.too_noisy(quiet) is None
    loud = {**quiet, "rademacher_median_ratio": 0.8}
    assert "rademacher" in engine_speed.too_noisy(loud) and "0.80" in engine_speed.too_noisy(loud)



class FakeRun:
    """A TargetRun stand-in whose counts are given: reached ({target: queries or None}) and failed."""

    def __init__(self, reached: dict, failed: bool):
        self.reached, self.failed, self.targets = dict(reached), failed, tuple(reached)

    @property
    def queries(self):
        return self.reached[self.targets[-1]]

    def extend_to(self, steps):
        return self


def test_a_rate_where_most_seeds_diverged_is_not_chosen_at_a_target_they_crossed_first():
    """With first hits kept, a rate whose seeds cross 2% fast and then mostly diverge would win the 2% column:
    a rate past the edge is no rate to run (the LLM race excludes such cells too), however soon its seeds arrive."""
    edge = [FakeRun({0.02: 100, 0.005: None}, True), FakeRun({0.02: 120, 0.005: None}, True),
            FakeRun({0.02: 110, 0.005: 300}, False)]
    steady = [FakeRun({0.02: 500, 0.005: 900}, False) for _ in range(3)]
    runs = {2e-3: edge, 1e-3: steady}
    out = queries.best_learning_rate(lambda lr, seed: runs[lr][seed], [1e-3, 2e-3], [0, 1, 2], 100,
                                     targets=(0.02, 0.005))
    assert out[0.02]["lr"] == 1e-3 and out[0.005]["lr"] == 1e-3
    assert out[0.02]["grid"][repr(2e-3)] is None      # lost: shown as no median, as at the deepest target



def test_the_toy_race_loses_a_rate_where_half_of_an_even_number_of_seeds_diverged():
    """benchmarks.queries kept a rate alive while at most n // 2 seeds diverged: with 4 seeds, 2 diverged
    after crossing 2% fast, and its median at 2% (two first hits, two later ones) won; the LLM race and the
    course lose such a rate (at least half diverged: ``train.past_edge``, the one rule)."""
    edge = [FakeRun({0.02: 100, 0.005: None}, True), FakeRun({0.02: 110, 0.005: None}, True),
            FakeRun({0.02: 120, 0.005: 300}, False), FakeRun({0.02: 130, 0.005: 320}, False)]
    steady = [FakeRun({0.02: 500, 0.005: 900}, False) for _ in range(4)]
    runs = {2e-3: edge, 1e-3: steady}
    out = queries.best_learning_rate(lambda lr, seed: runs[lr][seed], [1e-3, 2e-3], [0, 1, 2, 3], 100,
                                     targets=(0.02, 0.005))
    assert out[0.02]["lr"] == 1e-3 and out[0.02]["grid"][repr(2e-3)] is None


# -- make bench --quick: its own results file -------------------------------------------------------------------
def test_a_quick_make_bench_writes_its_own_results_and_never_over_a_full_run(monkeypatch, capsys, tmp_path):
    """``python -m benchmarks.run --quick`` (or any run under SAZO_FAST=1) wrote results/bench.json over the
    48-minute full run's table."""
    monkeypatch.setattr(run, "RESULTS", tmp_path)
    monkeypatch.setattr(run, "run_sections", lambda quick, save, only, previous: save({}) and {})
    run.main(["--quick"])
    assert (tmp_path / "bench_quick.json").exists() and not (tmp_path / "bench.json").exists()
    assert json.loads((tmp_path / "bench_quick.json").read_text())["machine"]["quick"]
    full = tmp_path / "full.json"
    full.write_text(json.dumps({"machine": {"quick": False}, "table": "", "results": {}}))
    with pytest.raises(SystemExit) as caught:
        run.main(["--quick", "--out", str(full)])
    assert caught.value.code == 2 and "holds a full run" in capsys.readouterr().err
    assert not json.loads(full.read_text())["machine"]["quick"]


# -- make bench-llm: a failed worker's partial reports ----------------------------------------------------------
class FakeWorker:
    """A worker process: job 0 writes its partial report and ends, job 1 fails."""

    def __init__(self, command):
        self.job = int(command[command.index("--worker") + 1].split("/")[0])
        self.partial = command[command.index("--partial") + 1]

    def wait(self):
        if self.job == 0:
            Path(self.partial).write_text(json.dumps({"settings": [], "measured_only": {}}))
        return self.job


def test_a_failed_worker_keeps_the_others_partial_reports_where_it_says(monkeypatch, capsys, tmp_path):
    """It said 'partial results: /tmp/llm-queries-…', a temporary folder removed as the message was raised,
    and the parts it held had no header, so --merge could not print them (KeyError 'args')."""
    monkeypatch.setattr(llm_queries, "settings", fake_settings)
    monkeypatch.setattr(llm_queries.subprocess, "Popen", FakeWorker)
    args = llm_queries.parse_args(["--jobs", "2", "--out", str(tmp_path / "report.json")])
    with pytest.raises(SystemExit) as caught:
        llm_queries.run_workers(args, [])
    message = str(caught.value.code)
    kept = [word for word in message.split() if word.endswith(".json") and "report.json" != word.split("/")[-1]]
    assert kept and all(os.path.exists(path) for path in kept), message
    llm_queries.main(["--merge", *sorted(set(kept)), "--out", str(tmp_path / "merged.json")])
    assert json.loads((tmp_path / "merged.json").read_text())["args"]["jobs"] == 2


# -- options that applied to nothing ----------------------------------------------------------------------------
@pytest.mark.parametrize("argv, option", [
    (["memory", "smollm2", "--bound", "1.05"], "--bound"),     # the memory ratio was not bounded, without a word
    (["overhead", "--rounds", "9"], "--rounds"),
    (["sampler", "--clock", "cpu"], "--clock"),
])
def test_engine_speed_refuses_speed_options_for_other_parts(monkeypatch, capsys, argv, option):
    for name in ("speed", "memory", "overhead", "sampler_cost"):
        monkeypatch.setattr(engine_speed, name, lambda *a, **k: pytest.fail("ran with an option it ignores"))
    with pytest.raises(SystemExit) as caught:
        engine_speed.main(argv)
    assert caught.value.code == 2 and option in capsys.readouterr().err


def test_llm_queries_refuses_threads_its_workers_would_not_use(capsys):
    with pytest.raises(SystemExit) as caught:
        llm_queries.parse_args(["--jobs", "2", "--threads", "2"])
    assert caught.value.code == 2 and "--threads" in capsys.readouterr().err
    assert llm_queries.parse_args(["--jobs", "1", "--threads", "2"]).threads == 2


def test_make_bench_grades_a_ratio_of_two_sections_only_when_one_run_measured_both(monkeypatch, tmp_path):
    """``--only sampler`` merges this run's sampler section into an earlier run's results, and the graded
    'smollm2 1 + sampler extra ÷ MeZO step' then divided this run's sampler time by another run's step."""
    sampler = {"uniform_s": 1e-4, "sazo_s": 3e-4, "sumtree_s": 1e-4, "multinomial_s": 1e-4}
    speed = {**{f"{v}_ratio": 1.05 for v in engine_speed.VARIANTS}, "model": "smollm2", "forward_s": 1.0,
             "default_s": 2.0, "default_noise": "GaussianTable"}
    share = lambda rows: [r for r in rows if "sampler extra ÷ MeZO step" in r[1] and "smollm2" in r[1]][0]
    assert share(run.table_rows({"sampler": sampler, "speed/smollm2": speed}))[4] == "yes"     # old reports: as before
    earlier = {"speed/smollm2": {**speed, "run": "2026-12-01 10:00 UTC"}}
    monkeypatch.setattr(run.engine_speed, "sampler_cost", lambda: dict(sampler))
    results = run.run_sections(True, only=["sampler"], previous=earlier)
    row = share(run.table_rows(results))
    assert row[3] == row[4] == "" and "not one run" in row[1]
    assert results["sampler"]["run"] != "2026-12-01 10:00 UTC"
    both = run.run_sections(True, only=["sampler"], previous={"speed/smollm2": dict(speed)})
    both["speed/smollm2"]["run"] = both["sampler"]["run"]
    assert share(run.table_rows(both))[4] == "yes"



@pytest.mark.parametrize("argv, option", [
    (["--race", "--batch-size", "4"], "--batch-size"),     # the race ran at B = 1, without a word
    (["--race", "--steps", "500"], "--steps"),
    (["--race", "--lr", "0.1"], "--lr"),
    (["--grid", "0.001"], "--grid"),                        # the decomposition ran, the grid raced nothing
    (["--methods", "sazo"], "--methods"),
    (["--max-steps", "100"], "--max-steps"),
])
def test_score_lag_refuses_options_of_the_other_mode(capsys, monkeypatch, argv, option):
    from benchmarks import score_lag
    for name in ("race", "run"):
        monkeypatch.setattr(score_lag, name, lambda *a, **k: pytest.fail("ran with an option it ignores"))
    with pytest.raises(SystemExit) as caught:
        score_lag.main(argv)
    assert caught.value.code == 2 and option in capsys.readouterr().err


def test_dashboard_latency_names_itself_and_refuses_a_filter_that_leaves_nothing(capsys, monkeypatch):
    """``--only sazzo`` measured no dashboard and printed nothing but the load line; ``main`` took no argv."""
    from benchmarks import dashboard_latency
    monkeypatch.setattr(dashboard_latency, "measure", lambda build: pytest.fail("measured with no dashboard chosen"))
    with pytest.raises(SystemExit) as caught:
        dashboard_latency.main(["--only", "no-such-dashboard"])
    err = capsys.readouterr().err
    assert caught.value.code == 2 and "--only" in err and "python -m benchmarks.dashboard_latency" in err


def test_merge_writes_into_a_folder_that_does_not_exist_yet(tmp_path, capsys):
    """--out's check lets a missing folder through ("created at the end"), but --merge printed the table and
    then failed with FileNotFoundError: it never made the folder."""
    part = tmp_path / "pilot.json"
    part.write_text(json.dumps({**report(True, "d"), "runtime_s": 60.0,
                                "args": {"targets": [0.3], "quick": True, "eps": 1e-3}}))
    out = tmp_path / "new" / "merged.json"
    llm_queries.main(["--merge", str(part), "--out", str(out)])
    assert json.loads(out.read_text())["date"] == "d"


# -- llm_long_runs: a rerun keeps what it has, and never writes over other settings' runs ---------------------------
def fake_long_run(lr=1e-3):
    return {"queries": [0, 100], "train_loss": [1.0, 0.4], "walk": [0.0, 2.0], "diverged": False,
            "mean_sq_step_scale": 1.0, "max_step_scale": 2.0, "test_accuracy": 0.5}


@pytest.fixture
def long_runs(monkeypatch):
    from benchmarks import llm_long_runs
    computed = []
    monkeypatch.setattr(llm_long_runs.llm_queries, "smollm2_start",
                        lambda *a, **k: (None, [torch.zeros(2)], None, None, None))
    monkeypatch.setattr(llm_long_runs.llm_queries, "run_from",
                        lambda *a, lr, seed, **k: computed.append((a[5], lr, seed)) or fake_long_run())
    monkeypatch.setattr(llm_long_runs.torch, "set_num_threads", lambda n: None)
    return llm_long_runs, computed


def test_long_runs_resume_a_plan_and_keep_runs_of_other_settings(long_runs, capsys, tmp_path):
    """A rerun recomputed every run (hours), and a rerun with another --steps or --set into the same folder wrote
    over the earlier runs' JSONs without a word (each is named by sampler, rate and seed only)."""
    module, computed = long_runs
    out = tmp_path / "runs"
    module.main([str(out), "uniform:3.5e-4:0", "--steps", "10"])
    assert computed == [("uniform", 3.5e-4, 0)]
    module.main([str(out), "uniform:3.5e-4:0", "sazo:3.5e-4:0", "--steps", "10"])     # resumes: one new run
    assert computed == [("uniform", 3.5e-4, 0), ("sazo", 3.5e-4, 0)]
    assert "(kept)" in capsys.readouterr().out
    before = (out / "uniform_0.00035_s0.json").read_text()
    with pytest.raises(SystemExit) as caught:
        module.main([str(out), "uniform:3.5e-4:0", "--steps", "20"])
    assert caught.value.code == 2 and "uniform_0.00035_s0.json" in capsys.readouterr().err
    assert (out / "uniform_0.00035_s0.json").read_text() == before and len(computed) == 2


def test_gpu_check_answers_help_and_refuses_stray_arguments_before_any_cuda_work(monkeypatch, capsys):
    """It had no parser: ``python -m benchmarks.gpu_check --help`` started the check (and, without CUDA, said
    only that it needs a device); a misspelt option was ignored."""
    from benchmarks import gpu_check
    monkeypatch.setattr(gpu_check, "triton_available", lambda: pytest.fail("checked the device"))
    with pytest.raises(SystemExit) as caught:
        gpu_check.main(["--help"])
    assert caught.value.code == 0 and "python -m benchmarks.gpu_check" in capsys.readouterr().out
    with pytest.raises(SystemExit) as caught:
        gpu_check.main(["--out", "x"])
    assert caught.value.code == 2


def test_a_quick_queries_run_refuses_to_replace_a_full_one(capsys, monkeypatch, tmp_path):
    """The rule of make bench and bench-llm above, for ``python -m benchmarks.queries --quick --out FULL``."""
    monkeypatch.setattr(queries, "run_queries_benchmark", lambda *a, **k: pytest.fail("ran over a full run's file"))
    full = tmp_path / "queries.json"
    full.write_text(json.dumps({"benchmark": "queries", "quick": False, "rows": []}))
    with pytest.raises(SystemExit) as caught:
        queries.main(["--quick", "--out", str(full)])
    assert caught.value.code == 2 and "holds a full run" in capsys.readouterr().err

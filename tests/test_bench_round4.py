"""The benchmark CLIs as a user runs them (fourth round): the step-cost verdict under load, printed dates of
merged reports and of llm_drift, partial and interrupted toy races that keep what they measured. Every test
runs on fakes or tiny settings: seconds in all, no timing assertions (fake clocks only)."""
import json

import pytest
import torch

from benchmarks import engine_speed


# -- make bench-step / make bench: a step-cost verdict read from load noise is not judged ----------------------
class FakeClock:
    """Every forward costs 1 unit × the load, a step ``step_cost`` units. ``loaded``: after the first round the
    forwards are slowed 4× (other jobs on the machine), so each variant's later pairs read a step cheaper than two
    forwards, while its first pair, the least disturbed, reads the step's true cost."""

    def __init__(self, step_cost: float, loaded: bool):
        self.now, self.step_cost, self.loaded, self.forwards = 0.0, step_cost, loaded, 0

    def clock(self) -> float:
        return self.now

    def forward(self, model, tokens):
        later_round = (self.forwards - 1) // 2 >= len(engine_speed.VARIANTS)     # after one warm-up forward
        self.now += 4.0 if self.loaded and later_round else 1.0
        self.forwards += 1

    def step(self) -> None:
        self.now += self.step_cost


def fake_speed(monkeypatch, step_cost: float, loaded: bool) -> dict:
    fake = FakeClock(step_cost, loaded)
    monkeypatch.setattr(engine_speed, "build_model", lambda name: None)
    monkeypatch.setattr(engine_speed, "random_tokens", lambda model, batch, seq, seed=0: None)
    monkeypatch.setattr(engine_speed, "distinct_parameters", lambda model: [torch.zeros(4)])
    monkeypatch.setattr(engine_speed, "lm_losses", fake.forward)
    monkeypatch.setattr(engine_speed, "step_functions", lambda model, params, closure: {
        v: fake.step for v in engine_speed.VARIANTS})
    monkeypatch.setattr(engine_speed, "pass_functions", lambda params: {s: fake.step for s in engine_speed.PASS_SOURCES})
    monkeypatch.setattr(engine_speed, "CLOCKS", {"wall": fake.clock, "cpu": fake.clock})
    return fake


@pytest.mark.parametrize("loaded", [False, True])
def test_bench_step_fails_past_the_bound_only_when_the_timings_are_clean(monkeypatch, capsys, loaded):
    """make bench-step exited 1 on a loaded machine while warning that the load swamped the timings: the verdict
    read noise. Now: clean timings past the bound fail (exit 1); swamped ones are reported as not judged."""
    fake_speed(monkeypatch, 2.6, loaded)      # a step of 1.3 × two forwards in the least disturbed pair
    argv = ["speed", "smollm2", "--bound", "1.15", "--rounds", "3"]
    if loaded:
        engine_speed.main(argv)                # no SystemExit: not judged
        captured = capsys.readouterr()
        assert "swamped" in captured.err and "NOT JUDGED (load)" in captured.out, captured
    else:
        with pytest.raises(SystemExit) as caught:
            engine_speed.main(argv)
        assert "FAILED" in str(caught.value.code) and "swamped" not in capsys.readouterr().err


def test_bench_step_within_its_bound_passes_under_either_load(monkeypatch, capsys):
    for loaded in (False, True):
        fake_speed(monkeypatch, 2.0, loaded)
        engine_speed.main(["speed", "smollm2", "--bound", "1.15"])
        assert "≤ 1.15" in capsys.readouterr().out


@pytest.mark.parametrize("loaded", [False, True])
def test_make_bench_judges_the_step_as_bench_step_does(monkeypatch, capsys, tmp_path, loaded):
    from benchmarks import run

    fake_speed(monkeypatch, 2.6, loaded)
    result = engine_speed.speed("smollm2", rounds=3, progress=False)
    monkeypatch.setattr(run, "run_sections", lambda quick, save, only, previous: {"speed/smollm2": result})
    call = lambda: run.main(["--out", str(tmp_path / "bench.json")])
    if loaded:
        call()
        assert "NOT JUDGED (load)" in capsys.readouterr().out
    else:
        with pytest.raises(SystemExit) as caught:
            call()
        assert "FAILED" in str(caught.value.code)


# -- llm_drift: the date and torch version of its drift figures --------------------------------------------------
def test_llm_drift_prints_its_date_machine_and_torch(monkeypatch, capsys):
    """llm_drift's restore drift (rounding of torch's kernels in bf16/fp16) printed no date and no torch version."""
    import datetime
    import os

    from benchmarks import llm_drift

    torch.manual_seed(0)
    model = torch.nn.Linear(8, 4)
    monkeypatch.setattr(llm_drift, "load_smollm2", lambda: (model, None))
    monkeypatch.setattr(llm_drift, "full_parameters", lambda m: list(m.parameters()))
    day = lambda: datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d")
    days = {day()}
    llm_drift.main([])
    days.add(day())        # a run across midnight prints either day
    out = capsys.readouterr().out
    first = out.splitlines()[0]
    assert any(d in first for d in days), first
    assert f"torch {torch.__version__}" in first and f"{os.cpu_count()} CPUs" in first, first
    assert "torch.bfloat16" in out     # the drift table itself still follows


# -- merged language-model reports: each part's date and machine -------------------------------------------------
def test_a_merged_llm_report_keeps_and_prints_every_parts_date_and_machine(tmp_path, capsys):
    """``llm_queries --merge a.json b.json`` headed the report with a.json's date and machine alone: b's samplers,
    raced another day (maybe on another machine), read as measured then; make bench's rows said the same."""
    from benchmarks import llm_report, run

    race, _ = llm_report.reference_report("llm_opposed_race.json")
    paths = []
    for k, (date, where) in enumerate([("2026-12-01 10:00 UTC", "machine A"), ("2026-12-03 18:30 UTC", "machine B")]):
        paths.append(tmp_path / f"part{k}.json")
        paths[-1].write_text(json.dumps({**race, "date": date, "machine": where}))
    merged = llm_report.merge(paths)
    assert merged["part_measured"] == {"part0.json": {"date": "2026-12-01 10:00 UTC", "machine": "machine A"},
                                       "part1.json": {"date": "2026-12-03 18:30 UTC", "machine": "machine B"}}
    llm_report.print_report(merged)
    printed = capsys.readouterr().out
    assert "part0.json: 2026-12-01 10:00 UTC · machine A" in printed
    assert "part1.json: 2026-12-03 18:30 UTC · machine B" in printed
    rows = [row[1] for row in run._llm_rows(run._section_of(merged, "merged", "B = 4 race")) if row[1].startswith("LLM")]
    assert rows and all("2026-12-01 10:00 UTC" in r and "2026-12-03 18:30 UTC" in r for r in rows), rows
    assert llm_report.measured_dates(json.loads(paths[0].read_text())) == "2026-12-01 10:00 UTC"   # one report: its date


# -- benchmarks.queries: a partial run never replaces the full report; an interrupted run resumes ------------------
def two_problems(quick=False):
    from benchmarks.queries import BenchProblem
    from sazo_lite.course.problems import LeastSquares

    return [BenchProblem(name, LeastSquares(8, 2, heterogeneity=h, seed=0), [1e-3, 2e-3], 20, [1e-3, 2e-3])
            for name, h in (("quadratic σ=0", 0.0), ("quadratic σ=1.5", 1.5))]


@pytest.fixture
def toy(monkeypatch, tmp_path):
    from benchmarks import queries

    monkeypatch.setattr(queries, "default_problems", two_problems)
    monkeypatch.setattr(queries, "RESULTS", tmp_path)
    monkeypatch.setattr(queries, "CELLS", tmp_path / "cells", raising=False)   # the code before had none
    return queries


def stub_race(problems, seeds, targets, batch_size, progress=True, methods=("uniform",), **kwargs):
    return {"benchmark": "queries", "targets": list(targets), "seeds": seeds, "batch_size": batch_size,
            "methods": list(methods), "rows": [], "raced": [p.name for p in problems], "resumed": []}


FULL = {"benchmark": "queries", "quick": False, "methods": ["uniform", "sazo", "oracle"],
        "rows": [{"problem": "quadratic σ=0"}, {"problem": "quadratic σ=1.5"}]}


@pytest.mark.parametrize("argv", [["--problems", "quadratic σ=0"], ["--methods", "sazo-plain", "sazo-no-level"]])
def test_a_partial_queries_run_writes_its_own_file_not_the_full_report(toy, monkeypatch, capsys, tmp_path, argv):
    """The documented ablation (``--methods sazo-plain …``) and the σ = 0 re-run (``--problems "quadratic σ=0"``)
    replaced queries.json, the full report, with their few cells without a word."""
    monkeypatch.setattr(toy, "run_queries_benchmark", stub_race)
    full = tmp_path / "queries.json"
    full.write_text(json.dumps(FULL))
    toy.main(argv)
    assert json.loads(full.read_text()) == FULL
    partial = json.loads((tmp_path / "queries_partial.json").read_text())
    assert partial["raced"] == ["quadratic σ=0"] or partial["methods"] == ["sazo-plain", "sazo-no-level"], partial
    assert "queries_partial.json, not queries.json" in capsys.readouterr().out


def test_a_full_queries_run_still_writes_the_full_report(toy, monkeypatch, tmp_path):
    monkeypatch.setattr(toy, "run_queries_benchmark", stub_race)
    toy.main(["--methods", "oracle", "sazo", "uniform", "informed-fresh"])     # every default method, and one more
    assert (tmp_path / "queries.json").exists() and not (tmp_path / "queries_partial.json").exists()


def test_a_partial_queries_run_refuses_to_replace_a_fuller_report_named_by_out(toy, monkeypatch, capsys, tmp_path):
    from test_bench_cli import refused

    monkeypatch.setattr(toy, "run_queries_benchmark", lambda *a, **k: pytest.fail("ran over a fuller report"))
    full = tmp_path / "mine.json"
    full.write_text(json.dumps(FULL))
    refused(capsys, lambda: toy.main(["--problems", "quadratic σ=0", "--out", str(full)]), "--out", "fuller report")
    assert json.loads(full.read_text()) == FULL
    # a report of no more cells than the run's own may be replaced
    full.write_text(json.dumps({**FULL, "rows": [{"problem": "quadratic σ=0"}]}))
    monkeypatch.setattr(toy, "run_queries_benchmark", stub_race)
    toy.main(["--problems", "quadratic σ=0", "--out", str(full)])
    # the default partial file holds the latest partial run, whatever the one before raced
    toy.main(["--methods", "sazo-plain"])
    toy.main(["--methods", "sazo-plain", "--problems", "quadratic σ=0"])
    assert json.loads((tmp_path / "queries_partial.json").read_text())["raced"] == ["quadratic σ=0"]


TINY_RACE = ["--seeds", "1", "--targets", "0.5", "--methods", "uniform", "sazo", "oracle"]


def counting_race(toy, monkeypatch, interrupt_at=None):
    """best_learning_rate, counting its calls (one a cell); ``interrupt_at``: Ctrl-C at that call."""
    calls, real = [], toy.best_learning_rate

    def counted(*args, **kwargs):
        calls.append(1)
        if len(calls) == interrupt_at:
            raise KeyboardInterrupt
        return real(*args, **kwargs)
    monkeypatch.setattr(toy, "best_learning_rate", counted)
    return calls


def test_an_interrupted_queries_run_resumes_its_finished_cells(toy, monkeypatch, capsys, tmp_path):
    """Ctrl-C in benchmarks.queries (45 minutes in full, alone or in make bench) kept none of its finished cells:
    the rerun raced them all again. Now each finished (problem, method) cell is saved and the same command resumes."""
    counting_race(toy, monkeypatch, interrupt_at=4)
    with pytest.raises(SystemExit) as caught:
        toy.main(TINY_RACE)
    assert caught.value.code == 130 and "the same command resumes" in capsys.readouterr().err
    calls = counting_race(toy, monkeypatch)
    report = toy.main(TINY_RACE)
    assert len(calls) == 6 - 3, calls                     # the three cells finished before the interrupt: read back
    assert len(report["resumed"]) == 3 and "resumed from an earlier run" in capsys.readouterr().out
    calls = counting_race(toy, monkeypatch)
    again = toy.main([*TINY_RACE, "--fresh"])
    assert len(calls) == 6 and not again["resumed"], calls
    for row, before in zip(again["rows"], report["rows"]):      # the same cells, raced again
        assert row["sazo"]["0.5"]["per_seed"] == before["sazo"]["0.5"]["per_seed"]


@pytest.mark.parametrize("change", [["--seeds", "2"], ["--lr-grid", "0.001"], ["--batch-size", "2"], "code"])
def test_a_queries_run_does_not_resume_cells_made_under_other_settings(toy, monkeypatch, change):
    counting_race(toy, monkeypatch)
    toy.main(TINY_RACE)
    calls = counting_race(toy, monkeypatch)
    if change == "code":        # the library or the race changed since the cells were saved
        version = toy.code_version()
        monkeypatch.setattr(toy, "code_version", lambda: version + "-changed")
        change = []
    report = toy.main([*TINY_RACE, *change])
    assert len(calls) == 6 and not report["resumed"], calls


def test_make_bench_resumes_the_queries_cells_an_interrupted_run_saved(monkeypatch, tmp_path):
    from benchmarks import queries, run

    monkeypatch.setattr(queries, "default_problems", two_problems)
    monkeypatch.setattr(queries, "CELLS", tmp_path / "cells", raising=False)   # the code before had none
    monkeypatch.setattr(queries, "TARGETS", (0.5,))
    seen = []
    real = queries.run_queries_benchmark
    monkeypatch.setattr(queries, "run_queries_benchmark", lambda *a, **k: seen.append(k.get("cache")) or real(
        a[0], [0], *a[2:], **k))
    run.queries_section(quick=False)
    assert seen == [tmp_path / "cells"] and list((tmp_path / "cells").glob("run-*.json"))
    assert run.queries_section(quick=False)["resumed"]


def test_an_interrupted_make_bench_says_its_queries_cells_resume(monkeypatch, capsys, tmp_path):
    from benchmarks import run

    def interrupted(*args, **kwargs):
        raise KeyboardInterrupt
    monkeypatch.delenv("SAZO_FAST", raising=False)
    monkeypatch.setattr(run, "run_sections", interrupted)
    with pytest.raises(SystemExit) as caught:
        run.main(["--out", str(tmp_path / "bench.json")])
    err = capsys.readouterr().err
    assert caught.value.code == 130 and "interrupted in queries (its finished cells are saved: the rerun resumes" in err

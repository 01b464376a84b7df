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
    llm_drift.main([])
    out = capsys.readouterr().out
    first = out.splitlines()[0]
    today = datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d")
    assert today in first and f"torch {torch.__version__}" in first and f"{os.cpu_count()} CPUs" in first, first
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

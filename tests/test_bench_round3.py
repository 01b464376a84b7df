"""The benchmark CLIs as a user runs them (third round): SAZO's direct overhead measured in a fair order,
bad arguments refused before the work, caches and output files that never mix runs, and every table
printed with its date and machine. Every test runs on fakes or tiny settings: seconds in all, no timing
assertions (fake clocks only)."""
import json

import pytest
import torch

from benchmarks import engine_speed


from test_bench_cli import refused   # argparse refusals: exit 2 with the words asked for


# -- engine_speed.overhead: which sampler is timed first alternates -------------------------------------------
class FallingLoad:
    """A fake clock: every training step costs 1 unit × the load, and the load falls by 1% a step (a shared
    machine whose other jobs end, or caches warming up): a step timed later in a round reads cheaper."""

    def __init__(self):
        self.now, self.load, self.order = 0.0, 1.0, []

    def step(self, sampler) -> None:
        self.order.append(type(sampler).__name__)
        self.now += self.load
        self.load *= 0.99

    def timed(self, fn, clock=None) -> float:
        start = self.now
        fn()
        return self.now - start


@pytest.fixture
def falling(monkeypatch):
    fake = FallingLoad()
    monkeypatch.setattr(engine_speed, "build_model", lambda name: None)
    monkeypatch.setattr(engine_speed, "random_tokens", lambda model, batch, seq, seed=0: None)
    monkeypatch.setattr(engine_speed, "distinct_parameters", lambda model: [torch.zeros(4)])
    monkeypatch.setattr(engine_speed, "_train_step", lambda opt, sampler, tokens, batch, model: fake.step(sampler))
    monkeypatch.setattr(engine_speed, "sampler_seconds", lambda sampler, batch, repeats=50, seed=0: 0.0)
    monkeypatch.setattr(engine_speed, "_timed", fake.timed)
    return fake


def test_overhead_alternates_which_sampler_is_timed_first(falling):
    """engine_speed.overhead timed the uniform step before SAZO's in every round, so anything that makes the
    second of two steps cheaper or dearer (warm caches, a load that drifts) went into the direct ratio."""
    engine_speed.overhead("gpt2-tiny", sizes=(64,), rounds=4)
    timed = falling.order[2:]                                     # after one warm-up step each
    slots = {name: [k for k, n in enumerate(timed) if n == name] for name in ("UniformSampler", "SAZOSampler")}
    assert len(slots["UniformSampler"]) == len(slots["SAZOSampler"]) > 0, timed
    # the same mean slot: a drift linear in time favours neither; timed U S U S ..., SAZO came later on average
    assert sum(slots["UniformSampler"]) == sum(slots["SAZOSampler"]), timed
    assert {timed[0], timed[4]} == {"UniformSampler", "SAZOSampler"}, timed     # the first of a round alternates


def test_equal_steps_read_as_equal_under_a_falling_load(falling):
    """Both samplers' steps cost the same here, so the direct ratio must read 1; timed uniform-then-SAZO it
    read 0.99 (the load's fall between the two)."""
    result = engine_speed.overhead("gpt2-tiny", sizes=(64,), rounds=4)["N=6e+01"]
    assert result["ratio"] == pytest.approx(1.0, abs=1e-3), result
    assert result["best_ratio"] == pytest.approx(1.0, abs=1e-3), result


def test_round_order_is_a_b_b_a_with_a_alternating():
    assert engine_speed.round_order(0) == ("uniform", "sazo", "sazo", "uniform")
    assert engine_speed.round_order(1) == ("sazo", "uniform", "uniform", "sazo")


def test_llm_step_ratio_alternates_which_of_forward_and_step_is_timed_first(monkeypatch):
    """llm_step_ratio timed the forward before the step in every pair (the same order bias as overhead's)."""
    from benchmarks import llm_step_ratio

    order = []
    monkeypatch.setattr(llm_step_ratio, "seconds", lambda fn: fn() or 1.0)
    llm_step_ratio.paired_ratio(lambda: order.append("forward"), lambda: order.append("step"), 4)
    pairs = [tuple(order[k:k + 2]) for k in range(0, 8, 2)]
    assert pairs.count(("forward", "step")) == pairs.count(("step", "forward")) == 2, pairs


# -- every printed table says when and where it was measured ---------------------------------------------------
class StubOptimizer:
    def __init__(self, *args, **kwargs):
        self.noise = None

    def step(self, closure):
        closure()

    def flush(self):
        pass


def stub_step_ratio(monkeypatch):
    from benchmarks import llm_step_ratio as m

    tokenizer = type("Tokenizer", (), {"vocab_size": 200})()
    for name, value in {"load_smollm2": lambda: (None, tokenizer), "answer_losses": lambda model, rows: None,
                        "full_parameters": lambda model: [], "sparse_indices": lambda params, share: None,
                        "MeZO": StubOptimizer, "SparseMeZO": StubOptimizer, "TorchNoise": lambda: None,
                        "add_lora": lambda model, rank: None, "trainable_parameters": lambda model: [],
                        "seconds": lambda fn: fn() or 1.0}.items():
        monkeypatch.setattr(m, name, value)
    return m, ["--repeats", "1"]


def tiny_problems(quick=False):
    from benchmarks.queries import BenchProblem
    from sazo_lite.course.problems import LeastSquares

    return [BenchProblem("quadratic σ=0", LeastSquares(8, 2, seed=0), [1e-3, 2e-3], 20, [1e-3, 2e-3])]


def stub_queries(monkeypatch, tmp_path):
    from benchmarks import queries as m

    monkeypatch.setattr(m, "default_problems", tiny_problems)
    monkeypatch.setattr(m, "run_queries_benchmark", lambda problems, seeds, targets, batch, methods: {
        "benchmark": "queries", "targets": list(targets), "seeds": seeds, "batch_size": batch,
        "methods": list(methods), "rows": []})
    return m, ["--quick", "--out", str(tmp_path / "q.json")]


def stub_engine_speed(monkeypatch, tmp_path):
    monkeypatch.setattr(engine_speed, "sampler_cost", lambda: {"uniform_s": 1e-3})
    return engine_speed, ["sampler"]


def stub_sampler_state(monkeypatch, tmp_path):
    from benchmarks import sampler_state as m

    monkeypatch.setattr(m, "run", lambda quick: {"sizes": []})
    return m, ["--quick"]


def stub_seed_reroll(monkeypatch, tmp_path):
    from benchmarks import seed_reroll as m

    monkeypatch.setattr(m, "queries_to_reach", lambda problem, factory, lr, seed, target, steps: 100 + seed)
    return m, ["--seeds", "3"]


def stub_score_lag(monkeypatch, tmp_path):
    from benchmarks import score_lag as m

    monkeypatch.setattr(m, "race", lambda *args, **kwargs: {})
    monkeypatch.setattr("benchmarks.queries.default_problems", tiny_problems)
    return m, ["--race", "--problem", "quadratic σ=0"]


@pytest.mark.parametrize("stub", [stub_queries, stub_engine_speed, stub_sampler_state, stub_seed_reroll,
                                  stub_score_lag, lambda monkeypatch, tmp_path: stub_step_ratio(monkeypatch)],
                         ids=["queries", "engine_speed", "sampler_state", "seed_reroll", "score_lag", "llm_step_ratio"])
def test_every_benchmark_prints_its_date_and_machine(monkeypatch, capsys, tmp_path, stub):
    """queries, engine_speed (make bench-step), sampler_state, seed_reroll, score_lag and llm_step_ratio printed
    their tables (timings of this machine, at this load) without a date or a machine; make bench alone said them."""
    import datetime
    import os

    module, argv = stub(monkeypatch, tmp_path)
    days = {datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d")}
    module.main(argv)
    days.add(datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d"))
    out = capsys.readouterr().out
    assert any(day in out for day in days), out
    assert f"{os.cpu_count()} CPUs" in out and torch.__version__ in out, out


def test_the_queries_report_stores_its_date_and_machine(monkeypatch, tmp_path):
    module, argv = stub_queries(monkeypatch, tmp_path)
    module.main(argv)
    saved = json.loads((tmp_path / "q.json").read_text())
    assert saved["date"].endswith("UTC") and saved["machine"]["cpus"] and saved["machine"]["date"] == saved["date"]


# -- bad arguments: a budget the runs would overrun, a seed or rate given twice -------------------------------
@pytest.mark.parametrize("module, argv", [("seed_reroll", ["--max-steps", "15"]),
                                          ("score_lag", ["--race", "--problem", "quadratic σ=0", "--max-steps", "15"]),
                                          ("score_lag", ["--race", "--problem", "quadratic σ=0", "--max-steps", "1"])])
def test_a_budget_between_two_log_points_is_refused(capsys, monkeypatch, module, argv):
    """The toy runs extend by whole log intervals of 10 steps: --max-steps 15 ran 20 steps, and a seed could be
    counted at 40 queries within a budget of 30 (--max-steps 1: 10 steps for 1)."""
    import importlib

    m = importlib.import_module(f"benchmarks.{module}")
    monkeypatch.setattr(m, "queries_to_reach" if module == "seed_reroll" else "race", never_run, raising=True)
    monkeypatch.setattr("benchmarks.queries.default_problems", tiny_problems)
    refused(capsys, lambda: m.main(argv), "--max-steps", "multiple of 10")


def never_run(*args, **kwargs):
    raise AssertionError("the run started")


def test_a_budget_of_whole_log_intervals_runs_no_further():
    from benchmarks.queries import TargetRun
    from sazo_lite.course.problems import LeastSquares

    run_ = TargetRun(LeastSquares(16, 2, seed=0), "uniform", 1e-3, 0, 1e-9).extend_to(20)
    assert run_.steps == 20


def test_a_rate_given_twice_is_one_rate_and_is_raced_once(monkeypatch, tmp_path):
    """--lr-grid 0.001 0.001 raced one rate, yet the table marked it '(grid edge)' as if a grid had been compared."""
    from benchmarks import queries

    assert queries.grid_edge(1e-3, [1e-3, 1e-3]) == " (one rate)"
    assert queries.grid_edge(1e-3, {"0.001": 5, "0.0010": 6}) == " (one rate)"
    assert queries.grid_edge(1e-3, [1e-3, 2e-3]) == " (grid edge)" and queries.grid_edge(2e-3, [1e-3, 2e-3, 3e-3]) == ""
    grids = []
    monkeypatch.setattr(queries, "default_problems", tiny_problems)
    monkeypatch.setattr(queries, "run_queries_benchmark", lambda problems, seeds, targets, batch, methods: (
        grids.extend(p.lr_grid for p in problems) or {"targets": list(targets), "methods": list(methods), "rows": []}))
    queries.main(["--quick", "--lr-grid", "0.002", "0.001", "0.002", "--out", str(tmp_path / "q.json")])
    assert grids and all(grid == [0.001, 0.002] for grid in grids), grids


def test_score_lag_counts_a_seed_given_twice_once(monkeypatch, capsys):
    """--seeds 0 0 ran seed 0 twice and counted it twice in every median of the race."""
    from benchmarks import score_lag

    calls = []
    monkeypatch.setattr(score_lag, "race", lambda problem, methods, grid, seeds, targets, max_steps: calls.append(
        (list(grid), list(seeds))))
    monkeypatch.setattr("benchmarks.queries.default_problems", tiny_problems)
    score_lag.main(["--race", "--problem", "quadratic σ=0", "--seeds", "0", "1", "0", "--grid", "0.002", "0.002", "0.001"])
    assert calls == [([0.001, 0.002], [0, 1])]


# -- llm_topblock: its step-cost ratio and its runs say when and where ----------------------------------------
def test_llm_topblock_cost_and_run_print_and_store_their_date_and_machine(monkeypatch, capsys, tmp_path):
    """The --cost ratio (top-block ÷ all-layer step, a timing of this machine) and a long run's JSON had no date
    and no machine (only --pull-floor's had)."""
    from benchmarks import llm_topblock

    monkeypatch.setattr(llm_topblock, "step_cost", lambda batch_size: {
        "B": batch_size, "top_block": 0.01, "all_layer": 0.1, "top_parameters": 1, "all_parameters": 2, "ratio": 10.0,
        "N": 4, "cache_s": 0.1, "norms_s": 0.01})
    monkeypatch.setattr(llm_topblock.torch, "set_num_threads", lambda n: None)
    out = tmp_path / "cost.json"
    llm_topblock.main(["cost", "--lr", "1", "--cost", "--json", str(out)])
    saved = json.loads(out.read_text())
    assert saved["ratio"] == 10.0 and saved["date"] in capsys.readouterr().out and "CPUs" in saved["machine"]
    monkeypatch.setattr(llm_topblock, "top_start", lambda setting: (None, None, [0, 1], None, None))
    monkeypatch.setattr(llm_topblock, "long_run", lambda sampler, **kwargs: {"run": {}, "points": []})
    monkeypatch.setattr(llm_topblock, "print_long_run", lambda out, sampler: None)
    run_json = tmp_path / "run.json"
    llm_topblock.main(["uniform", "--lr", "1e-3", "--json", str(run_json)])
    saved = json.loads(run_json.read_text())
    assert saved["date"] in capsys.readouterr().out and "CPUs" in saved["machine"]


# -- class_runs: a name given twice, and the process's own mode ------------------------------------------------
def test_class_runs_runs_a_notebook_named_twice_once(monkeypatch, capsys):
    """``class_runs 05_the_race 05_the_race`` ran the class-mode notebook (minutes to an hour) twice."""
    from benchmarks import class_runs

    ran = []
    monkeypatch.setattr(class_runs, "run", lambda name: ran.append(name) or class_runs.STORE / f"{name}.txt")
    class_runs.main(["05_the_race", "05_the_race.ipynb"])
    assert ran == ["05_the_race"]


@pytest.mark.parametrize("before", [None, "1"])
def test_class_runs_leaves_the_callers_sazo_fast_as_it_was(monkeypatch, tmp_path, before):
    """run() set SAZO_FAST=0 for the kernel and left it so in the calling process (every later course call there
    ran in class mode), also when the notebook failed."""
    import os
    import nbclient

    from benchmarks import class_runs

    if before is None:
        monkeypatch.delenv("SAZO_FAST", raising=False)
    else:
        monkeypatch.setenv("SAZO_FAST", before)
    seen = []

    class Client:
        def __init__(self, notebook, **kwargs):
            pass

        def execute(self):
            seen.append(os.environ.get("SAZO_FAST"))
            raise RuntimeError("a cell failed")

    monkeypatch.setattr(nbclient, "NotebookClient", Client)
    monkeypatch.setattr(class_runs, "STORE", tmp_path)
    with pytest.raises(RuntimeError):
        class_runs.run("05_the_race")
    assert seen == ["0"] and os.environ.get("SAZO_FAST") == before


# -- make bench --only: the rows of an earlier run say so ------------------------------------------------------
def test_make_bench_only_names_the_sections_an_earlier_run_measured(monkeypatch, capsys, tmp_path):
    """``--only overhead`` printed the merged table under this run's date alone: the speed and memory rows of an
    earlier run (another load, maybe another commit) read as measured now."""
    from benchmarks import run

    out = tmp_path / "bench.json"
    earlier = {"overhead": {"model": "gpt2-tiny", "run": "2026-12-01 10:00 UTC"},
               "sampler_state": {"sizes": [], "run": "2026-12-01 10:00 UTC"}}
    out.write_text(json.dumps({"machine": {"quick": True}, "table": "", "results": earlier}))
    monkeypatch.setattr(run.sampler_state, "run", lambda quick: {"sizes": []})
    run.main(["--quick", "--only", "sampler_state", "--out", str(out)])
    printed = capsys.readouterr().out
    assert "overhead (2026-12-01 10:00 UTC)" in printed and "sampler_state (" not in printed.split("earlier runs")[-1]
    assert "overhead (2026-12-01 10:00 UTC)" in json.loads(out.read_text())["table"]
    assert run.earlier_runs({"a": {"run": "2026-12-07 04:00 UTC"}, "b": {"run": "2026-12-07 04:00 UTC"}}) == ""


# -- llm_long_runs: a resumed plan keeps only runs made by today's rules -----------------------------------------
def test_long_runs_do_not_keep_a_run_of_other_rules_or_another_epsilon(monkeypatch, capsys, tmp_path):
    """A saved long run was kept when its command-line settings matched, whatever ε, oracle mix, θ₀ sizes or
    version of query_run's rules made it: a resumed plan then mixed runs the run cache (RUN_PROTOCOL) would
    have recomputed."""
    from benchmarks import llm_long_runs

    computed = []
    monkeypatch.setattr(llm_long_runs.llm_queries, "smollm2_start", lambda *a, **k: (None, [torch.zeros(2)], None, None, None))
    monkeypatch.setattr(llm_long_runs.llm_queries, "run_from", lambda *a, lr, seed, **k: computed.append(lr) or {
        "queries": [0, 100], "train_loss": [1.0, 0.4], "walk": [0.0, 2.0], "diverged": False, "mean_sq_step_scale": 1.0,
        "max_step_scale": 2.0, "test_accuracy": 0.5})
    monkeypatch.setattr(llm_long_runs.torch, "set_num_threads", lambda n: None)
    out = tmp_path / "runs"
    llm_long_runs.main([str(out), "uniform:3.5e-4:0", "--steps", "10"])
    llm_long_runs.main([str(out), "uniform:3.5e-4:0", "--steps", "10"])
    assert computed == [3.5e-4] and "(kept)" in capsys.readouterr().out             # the same rules: kept
    from benchmarks.run_cache import RUN_PROTOCOL
    monkeypatch.setattr(llm_long_runs, "RUN_PROTOCOL", RUN_PROTOCOL + 1, raising=False)     # query_run's rules changed
    refused(capsys, lambda: llm_long_runs.main([str(out), "uniform:3.5e-4:0", "--steps", "10"]), "uniform_0.00035_s0.json")
    monkeypatch.undo()
    real_parse = llm_long_runs.llm_queries.parse_args
    monkeypatch.setattr(llm_long_runs.llm_queries, "parse_args", lambda argv: real_parse([*argv, "--eps", "1e-4"]))
    refused(capsys, lambda: llm_long_runs.main([str(out), "uniform:3.5e-4:0", "--steps", "10"]), "uniform_0.00035_s0.json")
    assert computed == [3.5e-4]


def test_llm_kicks_runs_a_run_named_twice_once(monkeypatch, capsys):
    """``llm_kicks sazo:0.0085:1 sazo:0.0085:1`` ran the same 6000-step run twice and reported it twice."""
    from benchmarks import llm_kicks

    calls = []

    class Tracer:
        def __init__(self, params):
            self.walk = [1.0]

    class Run:
        def to_dict(self):
            return {"diverged": False, "queries": [0, 8], "train_loss": [1.0, 0.5], "walk": [0.0, 1.0]}

    monkeypatch.setattr(llm_kicks, "top_start", lambda setting: (None, [torch.zeros(2)], None, None, None))
    monkeypatch.setattr(llm_kicks, "StepTracer", Tracer)
    monkeypatch.setattr(llm_kicks, "query_run", lambda *a, lr, seed, **k: calls.append((a[3], lr, seed)) or Run())
    monkeypatch.setattr(llm_kicks, "kicks", lambda tracer, lr: {"top1pct_share": 0.5, "largest": [
        {"step": 1, "kick": 1.0, "g": 1.0, "walk_before": 0.0, "walk_after": 1.0}]})
    monkeypatch.setattr(llm_kicks.torch, "set_num_threads", lambda n: None)
    llm_kicks.main(["sazo:0.0085:1", "uniform:0.006:1", "sazo:0.0085:1", "--steps", "10"])
    assert calls == [("sazo", 0.0085, 1), ("uniform", 0.006, 1)]


@pytest.mark.parametrize("argv, option", [(["--top-start", "uniform=1e-3", "uniform=2e-3"], "--top-start"),
                                          (["--variant-start", "sazo=1e-3", "sazo=1e-3"], "--variant-start")])
def test_llm_queries_refuses_a_sampler_started_twice(capsys, argv, option):
    """``--top-start uniform=1e-3 uniform=2e-3`` raced uniform from 2e-3 without a word about the first rate."""
    from benchmarks import llm_queries

    refused(capsys, lambda: llm_queries.parse_args(argv), option, "given twice")


# -- make bench: a merged language-model report says its parts raced under different arguments ----------------
def test_make_bench_says_when_a_merged_reports_samplers_ran_under_different_arguments():
    """The B = 4 race make bench grades is three merged partial reports, the oracle's with 200 steps and a log
    every 5 against uniform's and SAZO's 750 and 25; make bench-llm's printout lists that, make bench's rows
    graded uniform ÷ oracle and SAZO ÷ oracle without a word."""
    from benchmarks import llm_report, run

    report, source = llm_report.reference_report("llm_opposed_race.json")
    section = run._section_of(report, source, "B = 4 race", "llm_opposed_race.json")
    assert "big_steps" in section["title"] and "big_log_every" in section["title"] and "out" not in section["title"]
    rows = [row for row in run._llm_rows(section) if row[1].startswith("LLM")]
    assert rows and all("merged parts differing in" in row[1] for row in rows)
    single, _ = llm_report.reference_report("llm_queries.json")      # two workers of one command: nothing differs
    assert "differing" not in run._section_of(single, source, "bench-llm")["title"]
    assert llm_report.differing_args({"part_args": {"a": {"x": 1, "y": 2}, "b": {"x": 1, "y": 3}}}) == ["y"]


def test_gpu_check_stores_its_date_and_machine(monkeypatch, tmp_path, capsys):
    """gpu_check.json named the GPU but not when, nor the torch and python that timed its passes."""
    from benchmarks import gpu_check

    monkeypatch.setattr(gpu_check, "triton_available", lambda: (True, ""))
    monkeypatch.setattr(gpu_check.torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(gpu_check.torch.cuda, "get_device_name", lambda: "a GPU")
    monkeypatch.setattr(gpu_check, "check_correctness", lambda device: {})
    monkeypatch.setattr(gpu_check, "check_timing", lambda device: {})
    monkeypatch.setenv("OUT", str(tmp_path))
    gpu_check.main([])
    saved = json.loads((tmp_path / "gpu_check.json").read_text())
    assert saved["machine"]["date"].endswith("UTC") and saved["machine"]["torch"] == torch.__version__


def test_an_interrupted_queries_run_says_nothing_was_written(monkeypatch, capsys, tmp_path):
    """Ctrl-C in ``python -m benchmarks.queries`` (45 minutes in full) ended in a KeyboardInterrupt traceback that
    did not say whether --out held anything of the run."""
    from benchmarks import queries

    def interrupted(*args, **kwargs):
        raise KeyboardInterrupt
    monkeypatch.setattr(queries, "default_problems", tiny_problems)
    monkeypatch.setattr(queries, "run_queries_benchmark", interrupted)
    out = tmp_path / "q.json"
    try:
        with pytest.raises(SystemExit) as caught:
            queries.main(["--quick", "--out", str(out)])
    except KeyboardInterrupt:
        pytest.fail("the interrupt escaped as a traceback")
    assert caught.value.code == 130 and "was not written" in capsys.readouterr().err and not out.exists()


def test_llm_families_prints_its_date_machine_and_transformers(monkeypatch, capsys):
    """Which families TopBlocks reproduces depends on the transformers version; the printout named neither it nor
    the date."""
    import transformers

    from benchmarks import llm_families

    monkeypatch.setattr(llm_families, "probe", lambda family, blocks: {"outcome": "equal", "gap": 1e-7, "error": ""})
    llm_families.main(["--families", "Llama"])
    first = capsys.readouterr().out.splitlines()[0]
    assert f"transformers {transformers.__version__}" in first and "UTC" in first and "CPUs" in first, first

"""The benchmarks' command lines: a bad argument is refused by argparse (exit code 2, a message naming
the argument) before any long work starts, instead of a traceback, a hang or a silent wrong table.
Each test calls a module's parser or ``main(argv)`` with tiny settings: seconds in all."""
import json
import math

import pytest

from benchmarks import llm_queries


def refused(capsys, call, *words) -> str:
    """Run ``call()``; it must exit 2 (argparse's usage error) with ``words`` in its message."""
    with pytest.raises(SystemExit) as caught:
        call()
    assert caught.value.code == 2
    err = capsys.readouterr().err
    for word in words:
        assert word in err, err
    return err


# -- benchmarks.llm_queries (make bench-llm) ------------------------------------------------------
@pytest.mark.parametrize("argv, option", [
    (["--sets", "top-oposed"], "--sets"),            # a typo raced nothing and overwrote the report with an empty one
    (["--measure-sets", "opossed"], "--measure-sets"),
    (["--tiny", "lama"], "--tiny"),
    (["--targets", "1.5"], "--targets"),              # targets are fractions of F(θ₀)
    (["--targets", "0"], "--targets"),
    (["--targets", "nan"], "--targets"),
    (["--top-select", "0"], "--top-select"),
    (["--top-n", "0"], "--top-n"),
    (["--top-batch", "0"], "--top-batch"),
    (["--top-steps", "-5"], "--top-steps"),
    (["--top-log-every", "0"], "--top-log-every"),   # a division by zero deep in the first run
    (["--log-every", "0"], "--log-every"),
    (["--diagnose-every", "0"], "--diagnose-every"),
    (["--top-oracle-every", "0"], "--top-oracle-every"),
    (["--eps", "0"], "--eps"),
    (["--eps", "nan"], "--eps"),
    (["--threads", "0"], "--threads"),
    (["--rank", "0"], "--rank"),
    (["--top-new-fraction", "2"], "--top-new-fraction"),
    (["--oracle-mix", "1.5"], "--oracle-mix"),
    (["--top-accuracy-at", "-1"], "--top-accuracy-at"),
    (["--top-start", "uniform=0"], "--top-start"),
    (["--top-start", "uniform=nan"], "--top-start"),
    (["--top-start", "unifrom=1e-3"], "--top-start"),  # a misspelt sampler kept the default rate, silently
    (["--variant-start", "sazo=inf"], "--variant-start"),
    (["--only-run", "nan:0", "--run-cache", "cache"], "--only-run"),
    (["--merge", "no-such-report.json"], "--merge"),
])
def test_llm_queries_refuses_bad_arguments_before_the_race(capsys, argv, option):
    refused(capsys, lambda: llm_queries.parse_args(argv), option)


def test_llm_queries_refuses_a_race_of_nothing(capsys, tmp_path):
    """``--sets`` alone raced nothing and wrote an empty report over --out (by default the one make bench reads)."""
    out = tmp_path / "report.json"
    refused(capsys, lambda: llm_queries.main(["--sets", "--jobs", "1", "--out", str(out)]), "nothing to run")
    assert not out.exists()


def test_llm_queries_refuses_an_output_it_cannot_write_and_a_cache_that_is_a_file(capsys, tmp_path):
    afile = tmp_path / "a-file"
    afile.write_text("x")
    refused(capsys, lambda: llm_queries.parse_args(["--out", str(tmp_path)]), "--out", "folder")
    refused(capsys, lambda: llm_queries.parse_args(["--out", str(afile / "report.json")]), "--out")
    refused(capsys, lambda: llm_queries.parse_args(["--run-cache", str(afile)]), "--run-cache")
    # a missing folder is fine: it is created at the end
    args = llm_queries.parse_args(["--out", str(tmp_path / "new" / "report.json"), "--run-cache", str(tmp_path / "c")])
    assert args.sets == list(llm_queries.TOP_SETS)


def test_llm_queries_defaults_and_quick_still_parse():
    assert llm_queries.parse_args([]).targets == [0.5, 0.3, 0.2, 0.1, 0.05]
    quick = llm_queries.parse_args(["--quick"])
    assert quick.sets == ["top-opposed"] and quick.seeds == 1 and quick.top_steps == 800
    assert llm_queries.parse_args(["--sets", "--tiny", "llama"]).tiny == ["llama"]   # the tiny families alone


# -- benchmarks.queries (make bench's toy problems) ------------------------------------------------
def never_run(*args, **kwargs):
    raise AssertionError("the benchmark started before its arguments were checked")


@pytest.mark.parametrize("argv, option", [
    (["--lr-grid", "0"], "--lr-grid"),        # a zero rate never moves: a cell "not reached" after 30 000 steps
    (["--lr-grid", "-0.001"], "--lr-grid"),
    (["--lr-grid", "nan"], "--lr-grid"),
    (["--targets", "1"], "--targets"),
    (["--targets", "nan"], "--targets"),
    (["--seeds", "0"], "--seeds"),
    (["--batch-size", "0"], "--batch-size"),
    (["--methods", "sazzo"], "--methods"),
    (["--problems", "quadratic"], "--problems"),
])
def test_queries_refuses_bad_arguments_before_the_run(capsys, monkeypatch, argv, option):
    from benchmarks import queries
    monkeypatch.setattr(queries, "run_queries_benchmark", never_run)
    refused(capsys, lambda: queries.main(argv), option)


def test_queries_refuses_an_output_folder_before_the_run_not_after_it(capsys, monkeypatch, tmp_path):
    from benchmarks import queries
    monkeypatch.setattr(queries, "run_queries_benchmark", never_run)
    refused(capsys, lambda: queries.main(["--quick", "--out", str(tmp_path)]), "--out")


def test_queries_runs_a_repeated_target_once(monkeypatch, tmp_path):
    """``--targets 0.1 0.1`` printed the same table twice (and stored the target twice)."""
    from benchmarks import queries
    seen = {}

    def fake(problems, seeds, targets, batch_size, methods):
        seen["targets"] = list(targets)
        return {"targets": list(targets), "methods": list(methods), "rows": []}
    monkeypatch.setattr(queries, "run_queries_benchmark", fake)
    queries.main(["--quick", "--targets", "0.1", "0.2", "0.1", "--out", str(tmp_path / "q.json")])
    assert seen["targets"] == [0.2, 0.1]
    assert json.loads((tmp_path / "q.json").read_text())["targets"] == [0.2, 0.1]


# -- benchmarks.run (make bench) -----------------------------------------------------------------
def test_bench_refuses_an_unknown_section_with_a_usage_error(capsys, monkeypatch, tmp_path):
    """``--only speed/smolm2`` was a ValueError traceback (and ``memory/smollm2`` with --quick too)."""
    from benchmarks import run
    monkeypatch.setattr(run.engine_speed, "speed", never_run)
    out = str(tmp_path / "bench.json")
    refused(capsys, lambda: run.main(["--only", "speed/smolm2", "--out", out]), "--only", "speed/smolm2")
    refused(capsys, lambda: run.main(["--quick", "--only", "memory/smollm2", "--out", out]), "--only", "--quick")


def test_bench_only_refuses_a_corrupt_or_other_kind_results_file(capsys, monkeypatch, tmp_path):
    """``--only`` merges into --out's earlier results: a truncated file was a JSONDecodeError traceback,
    and a --quick run's file took full sections (or the reverse) into one table without a word."""
    from benchmarks import run
    monkeypatch.setattr(run, "run_sections", never_run)
    monkeypatch.delenv("SAZO_FAST", raising=False)   # make test sets it, and it makes a run --quick
    out = tmp_path / "bench.json"
    out.write_text('{"machine": {"quick": true}, "results": {')
    refused(capsys, lambda: run.main(["--only", "sampler", "--out", str(out)]), "--only", "bench.json")
    out.write_text(json.dumps({"machine": {"quick": True}, "table": "", "results": {"sampler": {}}}))
    refused(capsys, lambda: run.main(["--only", "sampler", "--out", str(out)]), "--only", "--quick")


def test_bench_refuses_an_output_folder_before_the_first_section(capsys, monkeypatch, tmp_path):
    from benchmarks import run
    monkeypatch.setattr(run, "run_sections", never_run)
    refused(capsys, lambda: run.main(["--quick", "--out", str(tmp_path)]), "--out")


def test_bench_only_merges_into_a_run_of_its_kind(monkeypatch, tmp_path):
    from benchmarks import run
    out = tmp_path / "bench.json"
    out.write_text(json.dumps({"machine": {"quick": True}, "table": "", "results": {"queries": {"error": "x"}}}))
    seen = {}

    def fake(quick, save, only, previous):
        seen.update(quick=quick, only=only, previous=previous)
        return dict(previous)
    monkeypatch.setattr(run, "run_sections", fake)
    run.main(["--quick", "--only", "sampler", "--out", str(out)])
    assert seen == {"quick": True, "only": ["sampler"], "previous": {"queries": {"error": "x"}}}


# -- benchmarks.seed_reroll -----------------------------------------------------------------------
@pytest.mark.parametrize("argv, option", [
    (["--seeds", "0"], "--seeds"),          # was a ValueError traceback
    (["--seeds", "1"], "--seeds"),          # one seed: a nan interval, printed as a result
    (["--target", "1.5"], "--target"),
    (["--target", "0"], "--target"),
    (["--lr", "0"], "--lr"),
    (["--lr", "nan"], "--lr"),
    (["--max-steps", "0"], "--max-steps"),
])
def test_seed_reroll_refuses_bad_arguments_before_the_runs(capsys, monkeypatch, argv, option):
    from benchmarks import seed_reroll
    monkeypatch.setattr(seed_reroll, "queries_to_reach", never_run)
    refused(capsys, lambda: seed_reroll.main(argv), option)


def test_seed_reroll_compares_the_seeds_both_streams_finished_and_counts_a_miss_as_never():
    """The mean log ratio is over the seeds both streams finished (its docstring), not the mean of each
    stream's finished seeds apart; and a miss counts as never in the re-roll odds, not as no run."""
    from benchmarks.seed_reroll import reroll_shift
    out = reroll_shift([100, None, 400, 800], [100, 50, 400, 800], draws=2000)
    assert out["mean_log_ratio"] == 0.0 and out["both_finished"] == 3 and out["missed"] == (1, 0)
    half_missed = reroll_shift([100, 100, None, None], [100, 100, None, None], draws=2000)
    assert half_missed["p_shift"] > 0.1       # two re-rolls of 5 seeds: one median never reached, the other 100
    none = reroll_shift([100, None], [None, 100])
    assert none["both_finished"] == 0 and math.isnan(none["mean_log_ratio"]) and math.isnan(none["half_width"])


def test_seed_reroll_says_so_when_too_few_seeds_reach_the_target(monkeypatch, capsys):
    from benchmarks import seed_reroll
    monkeypatch.setattr(seed_reroll, "queries_to_reach", lambda *a, **k: None)
    with pytest.raises(SystemExit) as caught:
        seed_reroll.main(["--seeds", "3", "--max-steps", "10"])
    assert "--max-steps" in str(caught.value.code)


# -- benchmarks.score_lag -------------------------------------------------------------------------
def test_score_lag_race_runs_on_a_bench_problem_by_default(monkeypatch):
    """``--race`` alone was a ValueError traceback: its default problem was a course problem, which the race
    does not run."""
    from benchmarks import score_lag
    seen = {}
    monkeypatch.setattr(score_lag, "race", lambda problem, *a, **k: seen.setdefault("problem", problem))
    score_lag.main(["--race"])
    assert seen["problem"] == "quadratic σ=1.5"


@pytest.mark.parametrize("argv, option", [
    (["--race", "--methods", "sazzo"], "--methods"),     # a KeyError after the methods before it had raced
    (["--race", "--problem", "heterogeneous quadratic"], "--problem"),
    (["--problem", "quadratic"], "--problem"),
    (["--race", "--grid", "0"], "--grid"),
    (["--race", "--targets", "1"], "--targets"),
    (["--race", "--max-steps", "0"], "--max-steps"),
    (["--steps", "0"], "--steps"),
    (["--lr", "nan"], "--lr"),
    (["--seeds", "-1"], "--seeds"),
    (["--batch-size", "0"], "--batch-size"),
    (["--log-every", "0"], "--log-every"),               # a ZeroDivisionError at the first step
    (["--steps", "50", "--log-every", "100"], "--log-every"),   # no row: the run printed nothing
])
def test_score_lag_refuses_bad_arguments_before_the_runs(capsys, monkeypatch, argv, option):
    from benchmarks import score_lag
    monkeypatch.setattr(score_lag, "race", never_run)
    monkeypatch.setattr(score_lag, "run", never_run)
    refused(capsys, lambda: score_lag.main(argv), option)


# -- benchmarks.llm_topblock ----------------------------------------------------------------------
@pytest.mark.parametrize("argv, option", [
    (["sazzo", "--lr", "1e-3"], "sampler"),        # failed only after the setting's activations were cached
    (["sazo", "--lr", "1e-3", "--factory", "nomodule"], "--factory"),
    (["sazo", "--lr", "1e-3", "--factory", "benchmarks.llm_topblock:no_such"], "--factory"),
    (["sazo", "--lr", "0"], "--lr"),
    (["sazo", "--lr", "nan"], "--lr"),
    (["sazo", "--lr", "1e-3", "--steps", "0"], "--steps"),
    (["sazo", "--lr", "1e-3", "--batch", "0"], "--batch"),
    (["sazo", "--lr", "1e-3", "--log-every", "0"], "--log-every"),
    (["sazo", "--lr", "1e-3", "--n", "0"], "--n"),
    (["sazo", "--lr", "1e-3", "--stop", "1.5"], "--stop"),
    (["sazo", "--lr", "1e-3", "--walk-bound", "0"], "--walk-bound"),
    (["gd", "--lr", "1e-3", "--pull-floor", "-1"], "--pull-floor"),
])
def test_llm_topblock_refuses_bad_arguments_before_building_the_setting(capsys, monkeypatch, argv, option):
    from benchmarks import llm_topblock
    for name in ("top_start", "step_cost", "long_run", "pull_floor"):
        monkeypatch.setattr(llm_topblock, name, never_run)
    refused(capsys, lambda: llm_topblock.main(argv), option)


def test_llm_topblock_refuses_a_json_path_in_a_file_before_the_run(capsys, monkeypatch, tmp_path):
    from benchmarks import llm_topblock
    monkeypatch.setattr(llm_topblock, "top_start", never_run)
    (tmp_path / "f").write_text("x")
    refused(capsys, lambda: llm_topblock.main(["sazo", "--lr", "1e-3", "--json", str(tmp_path / "f" / "o.json")]), "--json")
    refused(capsys, lambda: llm_topblock.main(["sazo", "--lr", "1e-3", "--json", str(tmp_path)]), "--json")


# -- benchmarks.llm_families ----------------------------------------------------------------------
def fake_probe(family, blocks):
    refused = family == "Zamba2" and blocks < 3
    return {"outcome": "refused" if refused else "equal", "gap": None if refused else 1e-7, "error": ""}


def test_llm_families_summary_adds_up_to_the_families_probed(capsys, monkeypatch, tmp_path):
    """A family equal at some k and refused at others (Zamba 2) was counted in no outcome: the summary
    said '1 equal, 0 refused, ...' of two families probed."""
    from benchmarks import llm_families
    monkeypatch.setattr(llm_families, "probe", fake_probe)
    llm_families.main(["--families", "Llama", "Zamba2"])
    last = capsys.readouterr().out.strip().splitlines()[-1]
    assert last == "families: 1 equal, 0 refused, 0 crashed, 0 no model, 1 mixed (Zamba2)"


def test_llm_families_writes_its_json_into_a_missing_folder_and_refuses_a_folder(capsys, monkeypatch, tmp_path):
    """--json in a missing folder was a FileNotFoundError after every probe had run."""
    from benchmarks import llm_families
    monkeypatch.setattr(llm_families, "probe", fake_probe)
    out = tmp_path / "new" / "families.json"
    llm_families.main(["--families", "Llama", "--json", str(out)])
    assert json.loads(out.read_text())["Llama"]["1"]["outcome"] == "equal"
    monkeypatch.setattr(llm_families, "probe", never_run)
    refused(capsys, lambda: llm_families.main(["--families", "Llama", "--json", str(tmp_path)]), "--json")


def test_llm_topblock_makes_a_missing_json_folder_before_the_run(monkeypatch, tmp_path):
    """--json in a missing folder was a FileNotFoundError after the whole run."""
    from benchmarks import llm_topblock
    monkeypatch.setattr(llm_topblock, "step_cost", lambda batch_size: {
        "B": batch_size, "top_block": 0.01, "all_layer": 0.1, "top_parameters": 1, "all_parameters": 2, "ratio": 10.0,
        "N": 4, "cache_s": 0.1, "norms_s": 0.01})
    out = tmp_path / "new" / "cost.json"
    llm_topblock.main(["cost", "--lr", "1", "--cost", "--json", str(out)])
    assert json.loads(out.read_text())["ratio"] == 10.0


# -- benchmarks.engine_speed (make bench-step) ----------------------------------------------------
@pytest.mark.parametrize("argv, option", [
    (["speed", "--rounds", "0"], "--rounds"),     # min() of no rounds: a traceback after the model was built
    (["speed", "--bound", "0"], "--bound"),
    (["speed", "--bound", "nan"], "--bound"),    # nan: every step 'past' it, a FAILED line on any machine
])
def test_engine_speed_refuses_bad_arguments_before_building_the_model(capsys, monkeypatch, argv, option):
    from benchmarks import engine_speed
    monkeypatch.setattr(engine_speed, "speed", never_run)
    refused(capsys, lambda: engine_speed.main(argv), option)


def test_engine_speed_usage_in_its_docstring_parses(monkeypatch, capsys):
    """The docstring said ``speed --model gpt2-tiny``; the model is a positional argument (no --model)."""
    import re
    import shlex
    from benchmarks import engine_speed
    seen = {}
    monkeypatch.setattr(engine_speed, "speed", lambda model, **k: seen.setdefault("model", model) and never_run())
    command = re.search(r"``python -m benchmarks\.engine_speed ([^`]*)``", engine_speed.__doc__).group(1)
    with pytest.raises(AssertionError, match="started"):        # it parsed and reached the measurement
        engine_speed.main(shlex.split(command))
    assert seen["model"] == "gpt2-tiny"


# -- benchmarks.llm_long_runs and llm_kicks (sampler:rate:seed plans) -------------------------------
@pytest.mark.parametrize("runs", [["sazzo:1e-3:0"], ["sazo:abc:0"], ["sazo:1e-3"], ["sazo:inf:0"], ["sazo:1e-3:-1"]])
def test_run_plans_are_refused_with_a_usage_error(capsys, monkeypatch, tmp_path, runs):
    """A bad sampler:rate:seed was a ValueError traceback ('could not convert string to float' for a bad rate),
    and an infinite rate was accepted."""
    from benchmarks import llm_kicks, llm_long_runs
    monkeypatch.setattr(llm_kicks, "top_start", never_run)
    monkeypatch.setattr(llm_long_runs.llm_queries, "smollm2_start", never_run)
    refused(capsys, lambda: llm_kicks.main(runs), "runs", runs[0])
    refused(capsys, lambda: llm_long_runs.main([str(tmp_path / "out"), *runs]), "runs", runs[0])


def test_long_runs_refuse_bad_sizes_and_an_output_that_is_a_file(capsys, monkeypatch, tmp_path):
    from benchmarks import llm_long_runs
    monkeypatch.setattr(llm_long_runs.llm_queries, "smollm2_start", never_run)
    out = str(tmp_path / "out")
    for argv, option in ((["--n", "0"], "--n"), (["--stop", "1"], "--stop"), (["--steps", "0"], "--steps"),
                         (["--batch", "0"], "--batch"), (["--accuracy-at", "0"], "--accuracy-at")):
        refused(capsys, lambda: llm_long_runs.main([out, "sazo:1e-3:0", *argv]), option)
    (tmp_path / "afile").write_text("x")
    refused(capsys, lambda: llm_long_runs.main([str(tmp_path / "afile"), "sazo:1e-3:0"]), "out")


def test_llm_queries_run_cache_keys_tell_top_new_fractions_apart():
    """--run-cache: a race resumed with another --top-new-fraction (another θ₀: the first round's cache key has
    the fraction) read the other fraction's runs back, whenever the rounded count of new examples was the same
    (the opposed set's label) or always (the control's label has no count): a table of runs from another θ₀."""
    default = llm_queries.theta0_key(llm_queries.parse_args([]))
    other = llm_queries.theta0_key(llm_queries.parse_args(["--top-new-fraction", "0.13"]))
    assert default != other
    assert "top_new_fraction" not in default       # the default race's cached runs keep their keys


def test_llm_queries_refuses_a_corrupt_merge_and_a_missing_cache_to_report_from(capsys, tmp_path):
    """--merge of a truncated report was a JSONDecodeError traceback; --cached-only with a misspelt --run-cache
    reported a race of nothing (every sampler INCOMPLETE) over --out, by default the report make bench reads."""
    broken = tmp_path / "part.json"
    broken.write_text('{"settings": [')
    refused(capsys, lambda: llm_queries.parse_args(["--merge", str(broken)]), "--merge", "part.json")
    refused(capsys, lambda: llm_queries.parse_args(["--cached-only", "--run-cache", str(tmp_path / "typo")]),
            "--run-cache", "typo")
    (tmp_path / "cache").mkdir()
    assert llm_queries.parse_args(["--cached-only", "--run-cache", str(tmp_path / "cache")]).cached_only


# -- benchmarks.llm_step_ratio and llm_drift ------------------------------------------------------
@pytest.mark.parametrize("module, argv, option", [
    ("llm_step_ratio", ["--repeats", "0"], "--repeats"),    # a median of no pairs: a traceback after loading SmolLM2
    ("llm_step_ratio", ["--batch", "0"], "--batch"),
    ("llm_step_ratio", ["--seq", "-1"], "--seq"),
    ("llm_drift", ["--eps", "0"], "--eps"),
    ("llm_drift", ["--eps", "nan"], "--eps"),
])
def test_small_llm_benchmarks_refuse_bad_arguments_before_loading_the_model(capsys, monkeypatch, module, argv, option):
    import importlib
    mod = importlib.import_module(f"benchmarks.{module}")
    monkeypatch.setattr(mod, "load_smollm2", never_run)
    refused(capsys, lambda: mod.main(argv), option)


# -- the entry points as a researcher types them --------------------------------------------------
@pytest.mark.parametrize("argv, option", [
    (["benchmarks.score_lag", "--steps", "0"], "--steps"),
    (["benchmarks.llm_queries", "--sets", "top-oposed"], "--sets"),
])
def test_python_dash_m_gives_a_usage_error_not_a_traceback(argv, option):
    import subprocess
    import sys
    from pathlib import Path
    done = subprocess.run([sys.executable, "-m", *argv], capture_output=True, text=True, timeout=120,
                          cwd=Path(__file__).resolve().parents[1])
    assert done.returncode == 2 and option in done.stderr and "Traceback" not in done.stderr, done.stderr


def test_llm_queries_runs_a_repeated_target_once():
    """``--targets 0.5 0.3 0.5`` gave the table two 0.5·F₀ columns and the ratios two rows."""
    assert llm_queries.parse_args(["--targets", "0.5", "0.3", "0.5"]).targets == [0.5, 0.3]


def test_class_runs_checks_every_notebook_name_before_running_the_first(capsys, monkeypatch):
    """A misspelt second name was a ValueError traceback after the first notebook's class-mode run (up to an hour)."""
    from benchmarks import class_runs
    monkeypatch.setattr(class_runs, "run", never_run)
    refused(capsys, lambda: class_runs.main(["05_the_race", "05_the_rase"]), "notebooks", "05_the_rase")


def parser_of(monkeypatch, call):
    """The ArgumentParser a module's ``call()`` builds (its parse_args intercepted)."""
    import argparse
    caught = {}

    def grab(self, args=None, namespace=None):
        caught["parser"] = self
        raise SystemExit(0)
    monkeypatch.setattr(argparse.ArgumentParser, "parse_args", grab)
    with pytest.raises(SystemExit):
        call()
    monkeypatch.undo()
    return caught["parser"]


def test_make_bench_llm_describes_every_option_in_its_help(monkeypatch):
    """--help of make bench-llm's module left 22 options (--steps, --eps, --big-batch, ...) undescribed: which
    sets each applies to was only in the code (--big-batch is also the homogeneous set's B)."""
    parser = parser_of(monkeypatch, lambda: llm_queries.parse_args([]))
    bare = [a.option_strings[0] for a in parser._actions if a.option_strings and a.help is None]
    assert bare == []


@pytest.mark.parametrize("module, argv", [
    ("queries", []), ("run", []), ("score_lag", []), ("seed_reroll", []), ("llm_topblock", ["sazo", "--lr", "1"]),
    ("llm_families", []), ("engine_speed", ["speed"]), ("llm_kicks", ["sazo:1:0"]), ("llm_long_runs", ["o", "sazo:1:0"]),
    ("llm_step_ratio", []), ("llm_drift", []), ("class_runs", ["x"]), ("sampler_state", []),
])
def test_every_entry_point_names_itself_and_describes_every_argument(monkeypatch, module, argv):
    """--help of several entry points named the file (engine_speed.py, score_lag.py) instead of the
    ``python -m`` command, and left arguments undescribed (queries --methods, engine_speed's part/model/mode,
    llm_topblock --seed/--set, score_lag --seeds, sampler_state --quick, ...)."""
    import importlib
    mod = importlib.import_module(f"benchmarks.{module}")
    parser = parser_of(monkeypatch, lambda: mod.main(argv))
    assert parser.prog == f"python -m benchmarks.{module}"
    assert [a.dest for a in parser._actions if a.help is None] == []


def test_a_bench_llm_pilot_is_shown_by_make_bench_but_not_graded(monkeypatch):
    """``make bench-llm BENCH_LLM_ARGS=--quick`` (the pilot: 1 seed, 800 steps) writes results/llm_queries.json,
    and make bench then graded the issue's goals on that pilot as on the race, its rows marked by a date only."""
    from benchmarks import llm_report, run
    fast, slow = [1.0, 0.5, 0.25], [1.0, 0.8, 0.6, 0.45, 0.25]
    runs = {"uniform": [{"sampler": "uniform", "queries": [10 * k for k in range(len(slow))], "train_loss": slow,
                         "walk": [0.0] * len(slow), "diverged": False}],
            "sazo": [{"sampler": "sazo", "queries": [10 * k for k in range(len(fast))], "train_loss": fast,
                      "walk": [0.0] * len(fast), "diverged": False}]}
    report = {"date": "d", "machine": "m", "args": {"targets": [0.3], "quick": True},
              "settings": [{"label": "SmolLM2 top-block (k=1) LoRA r4 opposed (N=32, 4 new, B=4)", "B": 4,
                            "heterogeneity_at_theta0": 6.3, "chosen_lr": {"uniform": 1e-3, "sazo": 1e-3},
                            "grid": {}, "runs": runs}]}
    monkeypatch.setattr(llm_report, "latest_report", lambda name="llm_queries.json": (report, "this machine's"))
    rows = run._llm_rows(run._llm_report_section("llm_queries.json", "bench-llm"))
    assert rows and all(row[3] == row[4] == "" for row in rows)      # shown, not graded
    assert all("--quick pilot" in row[1] for row in rows)


def test_seed_reroll_names_the_seeds_its_small_median_is_over(monkeypatch, capsys):
    """With --seeds 3 the printout said '(first 5 seeds: ...)' of a median over 3."""
    from benchmarks import seed_reroll
    monkeypatch.setattr(seed_reroll, "queries_to_reach", lambda problem, factory, lr, seed, *a: 100 * (seed + 1))
    out = seed_reroll.main(["--seeds", "3", "--max-steps", "10"])
    printed = capsys.readouterr().out
    assert "first 3 seeds: 200" in printed and "first 5 seeds" not in printed
    assert out["both_finished"] == 3 and f"{out['both_finished']} of 3 seeds" in printed


def test_llm_topblock_prints_a_missed_target_as_not_reached(capsys):
    """A target the run missed printed as 'None' (every other table of the benchmarks says 'not reached')."""
    from benchmarks.llm_topblock import print_long_run
    run = {"lr": 1e-3, "seed": 0, "steps_run": 10, "diverged": False, "train_loss": [1.0, 0.4], "walk": [0.0, 1.0]}
    print_long_run({"run": run, "points": [], "queries_to": {"0.5": 80, "0.3": None}, "seconds": 1.0}, "sazo")
    printed = capsys.readouterr().out
    assert "0.5·F₀: 80, 0.3·F₀: not reached" in printed and "None" not in printed.split("acc=")[1].split("\n", 1)[1]


def test_score_lag_race_prints_a_miss_as_not_reached(monkeypatch, capsys):
    """A method that missed the target printed 'median None lr None' and None per seed."""
    from benchmarks import queries, score_lag
    missed = {"lr": None, "median": None, "min": None, "max": None, "per_seed": [None, None], "grid": {"0.001": None}}
    hit = {"lr": 0.001, "median": 120, "min": 100, "max": None, "per_seed": [100, None, 140], "grid": {"0.001": 120}}
    monkeypatch.setattr(queries, "best_learning_rate", lambda *a, targets, **k: {targets[0]: missed, targets[1]: hit})
    score_lag.race("quadratic σ=1.5", ["sazo"], [0.001], [0, 1], targets=(0.02, 0.005))
    printed = capsys.readouterr().out
    assert "None" not in printed.replace("grid {'0.001': None}", "")
    assert "target 0.02 | median not reached" in printed and "median 120 lr 0.001 per seed [100, 'not reached', 140]" in printed


def test_bench_ctrl_c_keeps_the_finished_sections_and_says_how_to_finish(monkeypatch, capsys, tmp_path):
    """Ctrl-C in make bench was a KeyboardInterrupt traceback: the sections done were saved, but nothing said
    which were left or how to merge them in (--only, into the same --out, with the same --quick)."""
    from benchmarks import run
    monkeypatch.setattr(run.engine_speed, "sampler_cost", lambda: {"uniform_s": 1e-4, "sazo_s": 2e-4,
                                                                   "sumtree_s": 1e-4, "multinomial_s": 1e-4})

    def interrupted(quick):
        raise KeyboardInterrupt
    monkeypatch.setattr(run.sampler_state, "run", interrupted)
    out = tmp_path / "bench.json"
    try:
        with pytest.raises(SystemExit) as caught:
            run.main(["--quick", "--only", "sampler", "sampler_state", "--out", str(out)])
    except KeyboardInterrupt:
        pytest.fail("Ctrl-C escaped as a traceback")
    assert caught.value.code == 130
    err = capsys.readouterr().err
    assert f"--quick --out {out} --only sampler_state" in err
    saved = json.loads(out.read_text())
    assert "sampler" in saved["results"] and "sampler_state" not in saved["results"]


@pytest.mark.parametrize("cache", [False, True])
def test_bench_llm_ctrl_c_says_what_was_kept_and_how_to_resume(monkeypatch, capsys, tmp_path, cache):
    """Ctrl-C in make bench-llm (41 min) was a KeyboardInterrupt traceback, silent on whether anything was kept."""
    def interrupted(*a, **k):
        raise KeyboardInterrupt
    monkeypatch.setattr(llm_queries, "run_units", interrupted)
    argv = ["--jobs", "1", "--out", str(tmp_path / "report.json")] + (["--run-cache", str(tmp_path / "c")] if cache else [])
    try:
        with pytest.raises(SystemExit) as caught:
            llm_queries.main(argv)
    except KeyboardInterrupt:
        pytest.fail("Ctrl-C escaped as a traceback")
    assert caught.value.code == 130
    err = capsys.readouterr().err
    assert ("the same command resumes" in err) if cache else ("--run-cache DIR" in err)
    assert not (tmp_path / "report.json").exists()


def test_llm_queries_top_start_overrides_one_sampler_and_keeps_the_others():
    """``--top-start sazo=1e-2`` moved uniform's and the oracle's first rates to 2e-3 (a fallback), not their
    defaults 6e-3 and 1.2e-2: a grid of other rates than the help said, without a word."""
    assert llm_queries.parse_args([]).top_start == {"uniform": 6e-3, "sazo": 8.49e-3, "oracle": 1.2e-2}
    assert llm_queries.parse_args(["--top-start", "sazo=1e-2"]).top_start == {"uniform": 6e-3, "sazo": 1e-2,
                                                                             "oracle": 1.2e-2}
    (top, _) = llm_queries.settings(llm_queries.parse_args(["--top-start", "sazo=1e-2"]))
    assert top.starts == {"uniform+bound": 6e-3, "sazo+bound": 1e-2, "oracle+bound": 1.2e-2}


def test_llm_queries_quick_refuses_the_options_it_would_override(capsys):
    """``--quick --seeds 3`` ran 1 seed, ``--quick --targets 0.1`` raced to 0.5 0.3 0.2 and ``--quick --top-steps
    2000`` capped runs at 800: the pilot's sizes replaced what was asked, without a word."""
    for argv, option in ((["--seeds", "3"], "--seeds"), (["--targets", "0.1"], "--targets"),
                         (["--top-steps", "2000"], "--top-steps"), (["--sets", "continual"], "--sets")):
        refused(capsys, lambda: llm_queries.parse_args(["--quick", *argv]), "--quick", option)
    assert llm_queries.parse_args(["--quick", "--jobs", "1", "--eps", "2e-3"]).eps == 2e-3   # what it does not set


def test_llm_queries_refuses_a_rate_rule_target_past_where_the_runs_stop(capsys):
    """``--targets 0.5`` with the default --top-select 0.3: every run stops at 0.5·F₀, the rate rule counts queries
    to 0.3·F₀, so every grid cell read 'not reached' and the race picked rates from nothing."""
    refused(capsys, lambda: llm_queries.parse_args(["--targets", "0.5"]), "--top-select", "0.5")
    assert llm_queries.parse_args(["--targets", "0.5", "--top-select", "0.5"]).targets == [0.5]
    assert llm_queries.parse_args(["--sets", "continual", "--targets", "0.5"]).targets == [0.5]   # no top-block set

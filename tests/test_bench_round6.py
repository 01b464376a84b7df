"""The benchmark CLIs and reports as a user runs them (sixth round): a race read back from its cache before its
chosen-rate seeds ran, ... Every test runs on fakes or tiny settings: seconds in all, no timing assertions."""
import json

import pytest

from benchmarks import llm_families, llm_heldout_path, llm_queries, llm_report
from test_bench_cli import fake_probe, refused
from test_bench_tables import patch_runs


# -- make bench-llm --cached-only: the race so far, stopped between the grid and the chosen rate's seeds --------------
def cached_race(monkeypatch, cache, extra=(), budget_runs=True, stale_every=0):
    """race_variant on fake runs (1e-3 reaches 0.5·F₀, 1.41e-3 diverges) with a run cache; returns its output."""
    patch_runs(monkeypatch, {1e-3: [1.0, 0.45, 0.4], 1.41e-3: [1.0, 2.0]})
    args = llm_queries.parse_args(["--sets", "--tiny", "--targets", "0.5", "0.4", "--run-cache", str(cache), *extra])
    setting = llm_queries.Setting("fake", None, {"oracle": 1e-3}, 1, 40, 10, variants=("oracle",), cells=3,
                                  grid_seeds=3, seeds=4, budget_runs=budget_runs, stale_every=stale_every)
    out = {"label": "fake", "heterogeneity_at_theta0": 2.0, "grid": {}, "chosen_lr": {}, "runs": {}}
    llm_queries.race_variant(setting, "oracle", None, [], None, None, args, out)
    return out


@pytest.mark.parametrize("budget_runs, stale_every", [(True, 0), (False, 25)])
def test_cached_only_between_the_grid_and_the_chosen_rates_seeds_reports_the_race_so_far(
        monkeypatch, tmp_path, capsys, budget_runs, stale_every):
    """A race whose chosen-rate seeds (budget runs, or the stale oracle's) were not run yet: --cached-only left an
    empty list of runs for that sampler, and the report of the race so far (print_report, make bench's rows) ended
    in a ValueError from the median of no seeds."""
    whole = cached_race(monkeypatch, tmp_path, budget_runs=budget_runs, stale_every=stale_every)
    later = "oracle k=25" if stale_every else "oracle"
    assert whole["runs"][later]
    for path in tmp_path.glob("run-*.json"):         # the race interrupted before the later runs
        key = json.loads(path.read_text())["key"]
        if (key["stop_fraction"] is None) if budget_runs else key["oracle_every"] == stale_every:
            path.unlink()
    part = cached_race(monkeypatch, tmp_path, ["--cached-only"], budget_runs=budget_runs, stale_every=stale_every)
    assert "oracle" in part["incomplete"] and later not in part["runs"] and part["grid"] == whole["grid"]
    report = {"args": {"eps": 1e-3, "targets": [0.5, 0.4]}, "date": "2026-12-07 19:00 UTC", "machine": "m",
              "runtime_s": 1.0, "settings": [part]}
    llm_report.print_report(report)
    assert "oracle: INCOMPLETE" in capsys.readouterr().out


# -- benchmarks.llm_heldout_path ------------------------------------------------------------------------------------
def fake_traces(monkeypatch, calls):
    """llm_heldout_path.main on fake runs (no model): each run's accuracy is its seed's tenth."""
    def trace(start, sampler, *, lr, seed, steps, every, batch_size=4):
        calls.append((sampler, seed))
        points = [{"step": s, "queries": 8 * s, "F": 1.0 - s / 2000, "test_accuracy": seed / 10, "test_loss": 0.5,
                   "second_label_share": 0.5, "F_assimilated": 0.5, "F_new": 1.0} for s in range(0, 1001, 1000)]
        return {"sampler": sampler, "lr": lr, "seed": seed, "diverged": False, "steps_run": 1000, "points": points,
                "seconds": 0.0, "test_labels_second_share": 0.5}
    monkeypatch.setattr(llm_heldout_path, "top_start", lambda setting: None)
    monkeypatch.setattr(llm_heldout_path, "trace", trace)


def test_heldout_path_runs_a_sampler_or_seed_given_twice_once(monkeypatch, tmp_path, capsys):
    """--seeds 0 0 1 ran seed 0 twice and counted it twice in every mean and interval (--samplers alike)."""
    calls = []
    fake_traces(monkeypatch, calls)
    out = tmp_path / "path.json"
    llm_heldout_path.main(["--samplers", "sazo", "uniform", "sazo", "--seeds", "0", "0", "1", "--json", str(out)])
    assert calls == [("sazo", 0), ("sazo", 1), ("uniform", 0), ("uniform", 1)]
    assert [(r["sampler"], r["seed"]) for r in json.loads(out.read_text())["runs"]] == calls
    assert "8000 sazo     n=2: acc 0.050 ± 0.098" in capsys.readouterr().out     # seeds 0 and 1, each once


def test_heldout_path_writes_into_a_missing_folder_and_its_json_carries_the_printed_date(monkeypatch, tmp_path, capsys):
    """--json in a missing folder passed the checks, and the first run's write was a FileNotFoundError (after a
    6,000-step run)."""
    calls = []
    fake_traces(monkeypatch, calls)
    out = tmp_path / "new" / "path.json"
    llm_heldout_path.main(["--samplers", "uniform", "--seeds", "0", "--json", str(out)])
    saved = json.loads(out.read_text())
    assert len(saved["runs"]) == 1 and saved["date"] == saved["machine"]["date"]
    assert capsys.readouterr().out.startswith(saved["date"])


@pytest.mark.parametrize("content", [None, "{", "[]", '{"date": "x"}'])
def test_heldout_path_summary_of_a_missing_or_spoiled_json_is_a_usage_error(capsys, tmp_path, content):
    """--summary of a missing, truncated or other JSON was a traceback (FileNotFoundError, JSONDecodeError,
    KeyError)."""
    path = tmp_path / "path.json"
    if content is not None:
        path.write_text(content)
    refused(capsys, lambda: llm_heldout_path.main(["--summary", "--json", str(path)]), "--json", "cannot read")


# -- benchmarks.llm_families ----------------------------------------------------------------------------------------
def test_llm_families_json_carries_the_date_machine_and_transformers_it_prints(monkeypatch, tmp_path, capsys):
    """--json held the outcomes alone: not the date, machine or transformers version the printout gives (what a
    family does depends on that version), against "every benchmark stores them in its JSON"."""
    monkeypatch.setattr(llm_families, "probe", fake_probe)
    out = tmp_path / "families.json"
    llm_families.main(["--families", "Llama", "Zamba2", "--json", str(out)])
    saved = json.loads(out.read_text())
    info = saved.pop("machine")
    assert set(saved) == {"Llama", "Zamba2"} and saved["Zamba2"]["1"]["outcome"] == "refused"
    import transformers
    assert info["transformers"] == transformers.__version__ and info["date"].endswith(" UTC")
    assert capsys.readouterr().out.startswith(f"llm_families, {info['date']}, ")


# -- make bench-llm --sets opposed/balanced with a shared rule in --variants ----------------------------------------
def test_a_walk_rule_named_in_variants_applies_on_the_opposed_and_balanced_sets(monkeypatch, capsys):
    """--sets opposed --variants uniform+bound sazo+bound raced both without the bound (the set's setting had no R:
    query_run got walk_bound=None), under the +bound label and "with the walk bound" in the report; +pull without
    --walk-pull was taken, and raced without a pull."""
    import dataclasses
    args = llm_queries.parse_args(["--sets", "balanced", "--variants", "uniform+bound", "sazo+bound",
                                   "--walk-bound", "12", "--targets", "0.5"])
    setting = llm_queries.settings(args)[0]
    assert (setting.walk_bound, setting.walk_pull, setting.step_cap) == (12.0, None, None)
    seen = []
    patch_runs(monkeypatch, {1e-3: [1.0, 0.45, 0.4]}, lambda sampler, lr, seed, settings: seen.append(settings))
    small = dataclasses.replace(setting, starts={"uniform+bound": 1e-3}, cells=1, grid_seeds=1, seeds=1, steps=40,
                                log_every=10, step_down=False)
    out = {"grid": {}, "chosen_lr": {}, "runs": {}}
    llm_queries.race_variant(small, "uniform+bound", None, [], None, None, args, out)
    assert seen and all(settings["walk_bound"] == 12.0 for settings in seen)
    plain = llm_queries.settings(llm_queries.parse_args(["--sets", "opposed"]))[0]     # the default variants: no rule
    assert (plain.walk_bound, plain.walk_pull, plain.step_cap) == (None, None, None)
    for rule, option in (("uniform+pull", "--walk-pull"), ("sazo+cap", "--step-cap")):
        refused(capsys, lambda: llm_queries.parse_args(["--sets", "opposed", "--variants", "uniform", rule]), option)


# -- make bench-llm --quick with an option it sets, given at its default value --------------------------------------
@pytest.mark.parametrize("argv, option", [(["--seeds", "5"], "--seeds"), (["--top-steps", "6000"], "--top-steps"),
                                          (["--sets", "top-opposed", "top-homogeneous"], "--sets"),
                                          (["--grid-seeds", "3"], "--grid-seeds")])
def test_quick_refuses_an_option_it_sets_even_at_that_options_default(capsys, argv, option):
    """--quick refused --seeds 3 (it sets 1 seed itself) but took --seeds 5, the default, and ran 1 seed: the pilot's
    sizes replaced what was asked, without a word, whenever it was asked at the default value."""
    refused(capsys, lambda: llm_queries.parse_args(["--quick", *argv]), "--quick", option)
    quick = llm_queries.parse_args(["--quick", "--eps", "1e-3", "--jobs", "1"])     # what it does not set: taken
    assert quick.seeds == 1 and quick.sets == ["top-opposed"] and quick.eps == 1e-3
    assert llm_queries.parse_args(argv).seeds == 5                                    # without --quick: as given


# -- benchmarks.engine_speed: positionals a part does not read -------------------------------------------------------
@pytest.mark.parametrize("argv, word", [(["memory", "smollm2", "default"], "mode"),
                                        (["speed", "gpt2-tiny", "noise_table"], "mode"),
                                        (["sampler", "smollm2"], "model")])
def test_engine_speed_refuses_a_positional_its_part_does_not_read(capsys, monkeypatch, argv, word):
    """``memory smollm2 default`` measured every mode (the mode is memory-child's), ``sampler smollm2`` timed the
    samplers alone: the extra positional was taken without a word."""
    from benchmarks import engine_speed
    for name in ("speed", "memory", "overhead", "sampler_cost"):
        monkeypatch.setattr(engine_speed, name, lambda *a, **k: pytest.fail("the measurement started"))
    refused(capsys, lambda: engine_speed.main(argv), f"argument {word}", "does not apply")


# -- make bench --quick: the toy rows at the smoke run's target ------------------------------------------------------
def toy_section(targets, medians):
    """A queries section of make bench: per target, each method's median (one seed) on the three problems."""
    cell = lambda m: {"median": m, "lr": 1e-3, "min": m, "max": m, "per_seed": [m], "grid": {"0.001": m}}
    rows = [{"problem": problem, **{method: {repr(t): cell(m) for t in targets} for method, m in medians.items()}}
            for problem in ("quadratic σ=0", "quadratic σ=1.5", "logistic breast_cancer σ=0")]
    return {"targets": list(targets), "rows": rows}


def test_make_bench_grades_the_toy_goals_at_their_targets_only(monkeypatch):
    """make bench --quick (SAZO_FAST=1) races the toys to 0.1 on one seed; its table graded that smoke run against
    the goals set at 2% and 0.5% ('SAZO ÷ oracle 3.00×, ≤ 1.3, NO' on the σ = 1.5 quadratic and the logistic
    regression, 'SAZO ÷ uniform ≤ 1.0, NO' on the control). Shown now, not graded; the full run's rows unchanged."""
    from benchmarks import run
    medians = {"uniform": 100, "sazo": 150, "oracle": 50}
    quick = run.table_rows({"queries": toy_section((0.1,), medians)})
    assert len(quick) == 6 and all(row[3] == row[4] == "" for row in quick), quick
    full = {row[1]: row[2:] for row in run.table_rows({"queries": toy_section((0.02, 0.005), medians)})}
    assert full["quadratic σ=0 @ 0.005: SAZO ÷ uniform"] == ("1.50×", "≤ 1.0", "NO")
    assert full["quadratic σ=1.5 @ 0.02: uniform ÷ SAZO"] == ("0.67×", "≥ 3.5", "NO")
    assert full["logistic breast_cancer σ=0 @ 0.005: SAZO ÷ oracle"] == ("3.00×", "≤ 1.3", "NO")
    assert full["quadratic σ=0 @ 0.02: SAZO ÷ oracle"] == ("3.00×", "", "")       # the control: no oracle goal


# -- benchmarks.gpu_check: a failed correctness check --------------------------------------------------------------
@pytest.mark.parametrize("rel_err", [1e-9, 0.5])
def test_gpu_check_exits_1_when_a_correctness_check_failed(monkeypatch, tmp_path, rel_err):
    """A pass past its tolerance was recorded as "ok": false and the check exited 0, as a passing one does (the
    device run's only verdict). It still writes and prints the JSON, then exits 1 naming the failed check."""
    import torch
    from benchmarks import gpu_check
    monkeypatch.setenv("OUT", str(tmp_path))
    monkeypatch.setattr(gpu_check, "triton_available", lambda: (True, ""))
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda *a: "fake")
    monkeypatch.setattr(gpu_check, "check_timing", lambda device: {"speedup": 1.0})
    correctness = {"torch.float32/gaussian": {"rel_err": 1e-9, "ok": True, "z_mean": 0.0, "z_var": 1.0},
                   "torch.bfloat16/gaussian": {"rel_err": rel_err, "ok": rel_err <= 1e-2, "z_mean": 0.0, "z_var": 1.0},
                   "restore_max_abs": 0.0}
    monkeypatch.setattr(gpu_check, "check_correctness", lambda device: correctness)
    if rel_err <= 1e-2:
        assert gpu_check.main([])["device"] == "fake"
    else:
        with pytest.raises(SystemExit, match="FAILED torch.bfloat16/gaussian"):
            gpu_check.main([])
    assert json.loads((tmp_path / "gpu_check.json").read_text())["correctness"] == correctness


# -- make bench-llm --merge of a pilot with a race -----------------------------------------------------------------
def test_merge_refuses_a_pilot_beside_a_race(tmp_path, capsys):
    """--merge race.json pilot.json took the first part's args (not a pilot): the pilot's one-seed runs were written
    to llm_queries.json and graded by make bench as the race's (pilot first: the race shown as a pilot, not graded)."""
    def part(name, quick, sampler):
        path = tmp_path / name
        path.write_text(json.dumps({"args": {"quick": quick, "eps": 1e-3}, "date": "d", "machine": "m", "runtime_s": 1,
                                    "settings": [{"label": "s", "runs": {sampler: []}}]}))
        return str(path)
    race, pilot = part("race.json", False, "uniform"), part("pilot.json", True, "sazo")
    for order in ([race, pilot], [pilot, race]):
        refused(capsys, lambda: llm_queries.parse_args(["--merge", *order, "--out", str(tmp_path / "m.json")]),
                "--merge", "pilot.json is a --quick pilot")
    other = part("other.json", False, "sazo")
    assert llm_queries.parse_args(["--merge", race, other, "--out", str(tmp_path / "m.json")]).merge


# -- benchmarks.llm_topblock: options its mode does not read -------------------------------------------------------
@pytest.mark.parametrize("argv, option", [
    (["sazo", "--lr", "1e-3", "--walk-radii", "3", "10"], "--walk-radii"),     # a long run: no displacement measured
    (["gd", "--lr", "0.05", "--pull-floor", "0", "--walk-bound", "30"], "--walk-bound"),   # GD: no walk bound
    (["gd", "--lr", "0.05", "--pull-floor", "0", "--seed", "3"], "--seed"),
    (["cost", "--lr", "1", "--cost", "--steps", "100"], "--steps"),           # the cost: 8 steps, fixed
    (["cost", "--lr", "1", "--cost", "--set", "homogeneous"], "--set"),      # the cost: the opposed set
])
def test_llm_topblock_refuses_an_option_its_mode_does_not_read(capsys, monkeypatch, argv, option):
    """Each was taken without a word and not applied (--walk-radii 3 10 on a long run, --walk-bound on --pull-floor's
    GD, --set homogeneous on --cost, which always times the opposed set)."""
    from benchmarks import llm_topblock
    for name in ("top_start", "step_cost", "long_run", "pull_floor"):
        monkeypatch.setattr(llm_topblock, name, lambda *a, **k: pytest.fail("the run started"))
    refused(capsys, lambda: llm_topblock.main(argv), option, "does not apply")

"""Issue 43, round 4 (b): run caches that cannot be read are recomputed, the noise-scaled step
refuses an overflowing ĝ before it changes, and the statistics helpers are defined on every input."""
import json
import math
import warnings

import pytest
from hypothesis import given, settings, strategies as st

from benchmarks.run_cache import RUN_PROTOCOL, cached_run
from sazo_lite.llm.queries import median_floor, ratio_bound
from sazo_lite.train import NoiseScaledStep, median_ratio_interval


# --- defect 4: run cache ---------------------------------------------------------------------------
@pytest.mark.parametrize("content", ['{"key": {"protocol"', "not json", "[1, 2]", '"text"', "null",
                                     '{"key": 3, "run": {}}', '{"key": {}, "run": [1]}', '{"run": {}}', b"\xff\xfe"])
def test_unreadable_cache_entry_is_recomputed_with_a_warning(tmp_path, content):
    cached_run(tmp_path, {"lr": 1e-3}, lambda: {"q": 1})
    (path,) = tmp_path.glob("run-*.json")
    path.write_bytes(content if isinstance(content, bytes) else content.encode())
    with pytest.warns(UserWarning, match=path.name):
        run = cached_run(tmp_path, {"lr": 1e-3}, lambda: {"q": 2})
    assert run == {"q": 2}
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert cached_run(tmp_path, {"lr": 1e-3}, lambda: {"q": 3}) == {"q": 2}   # rewritten whole


def test_cache_write_that_fails_leaves_the_previous_entry(tmp_path, monkeypatch):
    import os
    cached_run(tmp_path, {"lr": 1e-3}, lambda: {"q": 1})
    (path,) = tmp_path.glob("run-*.json")
    before = path.read_bytes()
    path.write_text(before.decode().replace('"q": 1', '"q": 1, "x": 0').replace(f'"protocol": {RUN_PROTOCOL}', '"protocol": 0'))
    kept = path.read_bytes()
    monkeypatch.setattr(os, "replace", lambda *a: (_ for _ in ()).throw(OSError("disk full")))
    with pytest.raises(OSError):
        cached_run(tmp_path, {"lr": 1e-3}, lambda: {"q": 2})
    assert path.read_bytes() == kept and json.loads(kept)
    assert list(tmp_path.iterdir()) == [path]                  # no temporary file left behind


# --- defect 11: NoiseScaledStep.observe -------------------------------------------------------------
@pytest.mark.parametrize("g", [1e200, -1e155, 1.7e308])
def test_observe_refuses_an_overflowing_square_before_changing(g):
    rule = NoiseScaledStep(warmup=2)
    for v in (1.0, 2.0, 3.0):
        rule.observe(v)
    before = (rule.seen, rule.reference, rule.mean)
    with pytest.raises(ValueError, match="projected_grad"):
        rule.observe(g)
    assert (rule.seen, rule.reference, rule.mean) == before
    rule.observe(1e150)                                    # the largest accepted still gives a finite scale
    assert math.isfinite(rule.scale())


# --- defects 12-15: statistics helpers ---------------------------------------------------------------
@pytest.mark.parametrize("bad", [0, 0.0, -1, -math.inf, math.nan, True, "100"])
@pytest.mark.parametrize("side", ["numerator", "denominator"])
def test_median_ratio_interval_refuses_bad_counts(bad, side):
    good = [100, 120, 140]
    args = {"numerator": good, "denominator": good}
    args[side] = [100, bad, 140]
    with pytest.raises(ValueError, match=side):
        median_ratio_interval(args["numerator"], args["denominator"], draws=20)


@pytest.mark.parametrize("side", ["numerator", "denominator"])
def test_median_ratio_interval_refuses_empty(side):
    args = {"numerator": [1], "denominator": [1], side: []}
    with pytest.raises(ValueError, match=side):
        median_ratio_interval(args["numerator"], args["denominator"])


def test_median_ratio_interval_misses_never():
    assert median_ratio_interval([None, math.inf], [None, None], draws=20) == (math.nan, math.nan) or \
        all(math.isnan(x) for x in median_ratio_interval([None, math.inf], [None, None], draws=20))
    assert median_ratio_interval([None, None], [5, 6], draws=20) == (math.inf, math.inf)
    assert median_ratio_interval([5, 6], [None, None], draws=20) == (0.0, 0.0)


queries = st.one_of(st.none(), st.just(math.inf), st.integers(1, 10**9),
                    st.floats(min_value=1e-6, max_value=1e12, allow_nan=False))


@settings(max_examples=150, deadline=None)
@given(st.lists(queries, min_size=1, max_size=8), st.lists(queries, min_size=1, max_size=8))
def test_median_ratio_interval_is_ordered_and_in_range(top, bottom):
    low, high = median_ratio_interval(top, bottom, draws=50)
    if math.isnan(low):
        assert math.isnan(high)
    else:
        assert 0.0 <= low <= high


def run(queries, losses, diverged=False):
    return {"queries": queries, "train_loss": losses, "diverged": diverged}


def test_median_floor_counts_zero_queries_as_zero():
    at_start = run([0, 400], [1.0, 0.5])            # the target F₀ is reached at query 0
    assert median_floor([at_start], 1.0) == 0


def test_median_floor_refuses_nothing_logged_and_no_runs():
    with pytest.raises(ValueError, match="runs"):
        median_floor([run([], [])], 0.5)
    with pytest.raises(ValueError, match="runs"):
        median_floor([], 0.5)


def test_ratio_bound_on_a_zero_floor_or_zero_median():
    cut_at_zero = run([0], [1.0])                   # cut short before a single query: floor 0
    reached = run([0, 400], [1.0, 0.4])
    assert ratio_bound([reached], [cut_at_zero], 0.5) is None
    at_start = run([0, 400], [0.0, 0.0])            # F₀ = 0: reached at 0 queries
    assert ratio_bound([run([0, 400], [1.0, 0.9])], [at_start], 0.5) is None
    with pytest.raises(ValueError, match="runs"):
        ratio_bound([], [reached], 0.5)


curves = st.lists(st.floats(0.0, 10.0), min_size=1, max_size=6).flatmap(
    lambda losses: st.builds(lambda qs, d: run(sorted(qs), losses, d),
                             st.lists(st.integers(0, 10**6), min_size=len(losses), max_size=len(losses)), st.booleans()))


@settings(max_examples=150, deadline=None)
@given(st.lists(curves, min_size=1, max_size=5), st.lists(curves, min_size=1, max_size=5), st.floats(0.01, 1.5))
def test_floor_and_bound_are_defined_on_every_logged_run(top, bottom, fraction):
    floor = median_floor(top, fraction)
    assert floor >= 0 and not math.isnan(floor)
    bound = ratio_bound(top, bottom, fraction)
    assert bound is None or (bound[0] in "<>" and 0 <= bound[1] and not math.isnan(bound[1]))


# --- defect 10: SeedLog header with out-of-range numbers ---------------------------------------------
@pytest.mark.parametrize("digits", [400, 5000])
def test_seedlog_header_with_a_huge_eps_is_a_value_error(digits):
    import torch
    import sazo_lite as sz
    params = [torch.randn(3)]
    opt = sz.MeZO(params, lr=1e-3, eps=1e-3, seed=0)
    log = sz.SeedLog.attach(opt)
    opt.step(lambda: (params[0] ** 2).sum())
    head, _, body = log.to_bytes().partition(b"\n")
    header = json.loads(head)
    header["eps"] = "EPS"
    crafted = json.dumps(header).replace('"EPS"', "1" + "0" * digits).encode() + b"\n" + body
    with pytest.raises(ValueError, match="eps" if digits < 4300 else "not JSON"):
        sz.SeedLog.from_bytes(crafted)


# --- defect 3: report writers go through sazo_lite.atomic ---------------------------------------------
WRITERS = ["benchmarks/llm_queries.py", "benchmarks/run.py", "benchmarks/llm_long_runs.py", "benchmarks/queries.py",
           "benchmarks/gpu_check.py", "benchmarks/llm_topblock.py", "benchmarks/run_cache.py", "benchmarks/class_runs.py"]
# checkpoints and caches the library keeps: torch.save through atomic_write (fsync, then rename), no hand-made temp file
SAVERS = ["sazo_lite/hf.py", "sazo_lite/distributed.py", "sazo_lite/llm/continual.py"]


@pytest.mark.parametrize("path", WRITERS)
def test_report_writers_write_nothing_in_place(path):
    from pathlib import Path
    source = (Path(__file__).parents[1] / path).read_text()
    assert "from sazo_lite.atomic import" in source
    assert ".write_text(" not in source and "json.dump(" not in source and '"w")' not in source


@pytest.mark.parametrize("path", SAVERS)
def test_checkpoint_writers_save_through_atomic_write(path):
    import re
    from pathlib import Path
    source = (Path(__file__).parents[1] / path).read_text()
    assert "atomic_write(" in source and ".tmp" not in source and "os.replace(" not in source
    targets = re.findall(r"torch\.save\([^,]*,\s*([^)]*)\)", source)
    assert targets and set(targets) == {"handle"}, f"torch.save to a path, not a handle: {targets}"


def test_a_failed_continual_cache_save_keeps_the_previous_file(tmp_path, monkeypatch):
    import torch
    from sazo_lite.atomic import atomic_write
    path = tmp_path / "round.pt"
    torch.save({"old": torch.ones(2)}, path)

    def broken(obj, handle):
        handle.write(b"half")
        raise OSError("disk full")
    monkeypatch.setattr(torch, "save", broken)
    with pytest.raises(OSError):
        atomic_write(path, lambda handle: torch.save({"new": 1}, handle))
    monkeypatch.undo()
    assert torch.load(path)["old"].tolist() == [1.0, 1.0] and [p.name for p in tmp_path.iterdir()] == ["round.pt"]


@pytest.mark.parametrize("fail", ["serialise", "fsync", "replace"])
def test_a_write_that_fails_part_way_keeps_the_previous_report(tmp_path, monkeypatch, fail):
    import os
    from sazo_lite.atomic import write_json
    path = tmp_path / "report.json"
    write_json(path, {"old": 1}, indent=1)
    if fail == "serialise":
        with pytest.raises(TypeError):
            write_json(path, {"new": object()}, indent=1)
    else:
        monkeypatch.setattr(os, fail, lambda *a: (_ for _ in ()).throw(OSError(fail)))
        with pytest.raises(OSError):
            write_json(path, {"new": 2}, indent=1)
    assert json.loads(path.read_text()) == {"old": 1} and list(tmp_path.iterdir()) == [path]


@pytest.mark.parametrize("bad", [float("nan"), float("inf"), True, "0.5", None])
def test_mean_difference_interval_refuses_values_that_are_not_finite_numbers(bad):
    from sazo_lite.train import mean_difference_interval
    with pytest.raises(ValueError, match="Invalid second"):
        mean_difference_interval([0.5, 0.6], [0.4, bad])
    assert mean_difference_interval([0.5, 0.6], [0.4, 0.5])[0] == pytest.approx(0.1)

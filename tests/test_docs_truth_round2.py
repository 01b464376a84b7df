"""What the README and docs/ state about the code, checked against the code (second round).

tests/test_docs_truth.py checks make targets, dotted names, quoted class names, file paths, links and a set of
defaults; this file adds what it does not: every command line a page quotes is accepted by the parser of the
module it runs (without running it), the README's API comments, the memory page's table, the samplers' storage,
the seed log's noise sources and the benchmark grids and defaults the pages state.
"""
from __future__ import annotations

import argparse
import ast
import importlib
import inspect
import re
import shlex
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
# The pages of this audit (guarantees.md and llm.md are the maintainer's).
PAGES = ["README.md"] + [f"docs/{name}.md" for name in
                         ("samplers", "trainer", "distributed", "memory", "benchmarks", "course")]


def read(page: str) -> str:
    return (ROOT / page).read_text()


def flat(text: str) -> str:
    """The text with its line breaks and repeated spaces folded (doc sentences wrap anywhere)."""
    return re.sub(r"\s+", " ", text)


def stated(page: str, pattern: str) -> str:
    """The one group of ``pattern`` in the page (line breaks folded); fails if the sentence is gone."""
    found = re.search(pattern, flat(read(page)))
    assert found, f"{page} no longer says {pattern!r}: update the doc or this test"
    return found.group(1)


def defaults(callable_) -> dict:
    return {name: p.default for name, p in inspect.signature(callable_).parameters.items()
            if p.default is not inspect.Parameter.empty}


# -- command lines: every `python -m MODULE ARGS` a page quotes parses ---------------------------------------
class _Parsed(Exception):
    """Raised in place of running a command once its arguments parsed."""


def parses(monkeypatch, main, argv: list[str]) -> argparse.Namespace:
    """The namespace ``main(argv)`` parses, without running the command; a usage error fails the test."""
    original = argparse.ArgumentParser.parse_args

    def parse_only(self, args=None, namespace=None):
        raise _Parsed(original(self, args, namespace))

    monkeypatch.setattr(argparse.ArgumentParser, "parse_args", parse_only)
    try:
        main(argv)
    except _Parsed as parsed:
        return parsed.args[0]
    except SystemExit as exc:
        pytest.fail(f"{argv} is refused by its parser (exit {exc.code})")
    pytest.fail(f"{main.__module__}.main({argv}) returned without parsing its arguments")


def code_spans(page: str) -> list[str]:
    """The page's inline code spans (fenced blocks taken out first: their ``` would pair the wrong backticks) and
    the lines of its fenced blocks."""
    text = read(page)
    lines = [line for block in re.findall(r"```\w*\n(.*?)```", text, re.S) for line in block.splitlines()]
    return re.findall(r"`([^`]+)`", re.sub(r"```.*?```", "", text, flags=re.S).replace("\n", " ")) + lines


def quoted_commands(page: str) -> list[tuple[str, list[str]]]:
    """(module, argv) of each `python -m benchmarks.X …` / `sazo_lite.…` command in backticks or a code block."""
    commands = []
    for span in code_spans(page):
        found = re.search(r"(?:python|torchrun [^`]*?)\s-m ((?:benchmarks|sazo_lite)[\w.]*)(.*)", span)
        if not found:
            continue
        module, rest = found.groups()
        argv = shlex.split(rest.split("#", 1)[0].replace("<notebook>", "05_the_race"))
        while argv and argv[-1] == "…":        # `--methods …`: the list left to the reader
            argv.pop()
            if argv and argv[-1].startswith("--"):
                argv.pop()
        commands.append((module, argv))
    return commands


def test_pages_quote_commands():
    """The audit below reads something: the pages quote these modules' commands."""
    quoted = {module for page in PAGES for module, _ in quoted_commands(page)}
    assert {"benchmarks.queries", "benchmarks.engine_speed", "benchmarks.dashboard_latency", "benchmarks.class_runs",
            "sazo_lite.distributed", "benchmarks.llm_families"} <= quoted, quoted


@pytest.mark.parametrize("page", PAGES)
def test_every_quoted_command_line_parses(page, monkeypatch):
    """A flag renamed or a choice removed (a method, a model, a part) fails here; the commands are not run."""
    monkeypatch.syspath_prepend(str(ROOT))
    for module, argv in quoted_commands(page):
        if module == "sazo_lite.course.memory":      # takes no arguments
            assert not argv, argv
            continue
        if module == "benchmarks.llm_families":
            pytest.importorskip("transformers")
        main = importlib.import_module(module).main
        parses(monkeypatch, main, argv)
        monkeypatch.undo()
        monkeypatch.syspath_prepend(str(ROOT))


def test_readme_example_quick_check_parses(monkeypatch):
    """The README's quick check of examples/finetune_smollm2_trainer.py: its flags are the script's."""
    import importlib.util

    command = stated("README.md", r"`python (examples/finetune_smollm2_trainer\.py[^`]*)`")
    path, *argv = shlex.split(command)
    spec = importlib.util.spec_from_file_location("finetune_example", ROOT / path)
    script = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(script)
    args = parses(monkeypatch, script.main, argv)
    assert (args.steps, args.num_train, args.num_test, args.batch_size) == (4, 8, 8, 2)


def test_trainer_md_example_tasks_exist():
    """docs/trainer.md's `--task numbers` (generated) and `--task sst2` (hub)."""
    from sazo_lite.llm.tasks import TASKS

    source = read("examples/finetune_smollm2_trainer.py")
    hub = set(re.search(r"HUB_TASKS\s*=\s*\(?([^)\n]*)", source).group(1).replace('"', " ").replace("'", " ")
              .replace(",", " ").split())
    for task in re.findall(r"`--task (\w+)`", read("docs/trainer.md")):
        assert task in TASKS or task in hub, task


# -- the README ------------------------------------------------------------------------------------------
def test_readme_course_is_imported_by_nothing_else():
    """The README's tree: `course/ … nothing else imports it` (the library never imports the course)."""
    assert "nothing else imports it" in flat(read("README.md"))
    offenders = []
    for path in (ROOT / "sazo_lite").rglob("*.py"):
        if "course" in path.relative_to(ROOT / "sazo_lite").parts:
            continue
        for node in ast.walk(ast.parse(path.read_text())):
            names = []
            if isinstance(node, ast.Import):
                names = [alias.name for alias in node.names]
            elif isinstance(node, ast.ImportFrom):
                names = [("." * node.level) + (node.module or "")] + [alias.name for alias in node.names]
            if any(re.search(r"(^|\.)course(\.|$)", name) for name in names):
                offenders.append(str(path.relative_to(ROOT)))
    assert not offenders, offenders


def test_readme_api_comments():
    """The API snippet's comments: θ₀ = 0 in float64, exactly 2 closure calls, MeZO a torch Optimizer, and
    the closing comment's `sz.train(opt, sampler, batch_losses, steps)` in train's positional order."""
    import torch

    import sazo_lite as sz
    from sazo_lite.course.problems import LeastSquares

    code = re.search(r"```python\n(.*?)```", read("README.md").split("## The API in 15 lines", 1)[1], re.S).group(1)
    assert "θ₀ = 0 (float64)" in code and "exactly 2 closure calls" in code
    problem = LeastSquares(num_examples=16, dim=3, heterogeneity=1.5)
    theta = problem.initial_theta()
    assert theta.dtype == torch.float64 and not theta.any()
    assert issubclass(sz.MeZO, torch.optim.Optimizer)
    calls = []
    opt = sz.MeZO([theta], lr=0.01, eps=1e-4, seed=0)
    opt.step(lambda: calls.append(1) or problem.losses(theta, torch.arange(4)))
    assert len(calls) == 2
    named = re.search(r"sz\.train\(([^)]*)\)", code).group(1).replace(" ", "").split(",")
    assert list(inspect.signature(sz.train).parameters)[:len(named)] == \
        ["optimizer", "sampler", "batch_losses", "steps"][:len(named)] and len(named) == 4


def test_readme_zero_d_loss_has_no_per_example_differences():
    """`a 0-d loss also works, without per-example differences`."""
    import torch

    import sazo_lite as sz

    assert "a 0-d loss also works, without per-example differences" in flat(read("README.md"))
    theta = torch.zeros(3)
    out = sz.MeZO([theta], lr=0.1, eps=1e-3, seed=0).step(lambda: (theta - 1).pow(2).sum())
    assert out.directional_diffs.numel() == 0 and out.losses.numel() == 0


def test_readme_trainer_left_column_binds():
    """The left column `zo_finetune(model, trainable_parameters(model), task.encode(tok, "train"), …,
    method="sazo", steps=200)`: the call binds zo_finetune's signature and `encode` takes (tok, split)."""
    from sazo_lite.llm import zo_finetune
    from sazo_lite.llm.tasks import ClassificationTask

    block = re.search(r"```python\n(.*?)```", read("README.md").split("## Fine-tuning with the Hugging Face Trainer",
                                                                        1)[1], re.S).group(1).splitlines()
    column = block[1].index("from transformers")
    left = " ".join(line[:column] for line in block[1:]).replace(" ", "")
    call = re.search(r"zo_finetune\((.*)\)", left).group(1)
    assert call.count("task.encode(tok,") == 2
    keywords = dict(re.findall(r"(\w+)=([^,]+)", call))
    positional = [a for a in re.split(r",(?![^(]*\))", call) if "=" not in a.split("(")[0]]
    inspect.signature(zo_finetune).bind(*positional, **keywords)
    assert keywords["method"].strip('"') in ("sazo", "mezo", "uniform")
    inspect.signature(ClassificationTask.encode).bind(None, "tok", "train")


# -- docs/memory.md ---------------------------------------------------------------------------------------
def test_memory_md_table_is_the_headline_table():
    """docs/memory.md's table is what `python -m sazo_lite.course.memory` prints (headline_table)."""
    from sazo_lite.course.memory import HEADLINE_BUDGET_GB, headline_table

    text = flat(read("docs/memory.md"))
    assert float(stated("docs/memory.md", r"bf16, SGD, fused attention, (\d+) GB budget")) == HEADLINE_BUDGET_GB
    rows = headline_table()
    for row in rows[:3]:
        context = re.search(r"N = (\d+)", row["label"])
        label = f"N = {context.group(1) if context else 512}" + (", checkpointing" if "checkpointing" in row["label"]
                                                                  and "no " not in row["label"] else "")
        found = re.search(rf"\| {re.escape(label)} \| ([\d.]+)× \| ([\d.]+)× \|", text)
        assert found, f"docs/memory.md has no row {label!r}"
        assert (float(found.group(1)), float(found.group(2))) == (round(row["ours"], 1), round(row["memory_ratio"], 1))
    sparse = rows[3]
    assert float(stated("docs/memory.md", r"\| sparse BP, 1% of parameters \(N = 4096\) \| saves ([\d.]+)% \|")) \
        == round(100 * sparse["ours"], 1)
    assert "N = 4096" in sparse["label"]


def test_memory_md_tolerance_is_the_tests():
    source = read("tests/test_memory.py")
    tolerance = float(re.search(r"^MEASURE_TOLERANCE = ([\d.]+)", source, re.M).group(1))
    assert float(stated("docs/memory.md", r"the tests allow (\d+)%")) == 100 * tolerance


# -- docs/distributed.md: what a seed log refuses to record ---------------------------------------------------
def test_seed_log_noise_sources_in_distributed_md():
    """`NoiseTable`, `TritonNoise`: sources whose z replay cannot redraw; the default table replays
    (docs/benchmarks.md: seed logs record the table's name and replay it)."""
    from sazo_lite import kernels, noise

    named = re.search(r"a noise source whose z replay cannot redraw \(`(\w+)`, `(\w+)`\)",
                      flat(read("docs/distributed.md"))).groups()
    sources = {"NoiseTable": noise.NoiseTable, "TritonNoise": kernels.TritonNoise}
    assert all(not sources[name].replayable for name in named)
    assert noise.GaussianTable.replayable and noise.TorchNoise.replayable


def test_distributed_md_backend_variable():
    from sazo_lite import distributed

    assert "SAZO_BACKEND=nccl torchrun" in read("docs/distributed.md")
    assert re.search(r"os\.environ\.get\(\"SAZO_BACKEND\", \"gloo\"\)", inspect.getsource(distributed))


# -- docs/samplers.md: constructors, storage, names ---------------------------------------------------------
def test_samplers_table_constructors_bind():
    from sazo_lite import samplers

    table = read("docs/samplers.md").split("## Samplers", 1)[1].split("\n\n", 2)[1]
    for cls, args in re.findall(r"^\| `(\w+)\(([^)]*)\)`", table, re.M):
        params = inspect.signature(getattr(samplers, cls)).parameters
        for arg in (a.strip() for a in args.split(",")):
            if arg in ("...", "N"):
                continue
            name = arg.split("=")[0]
            assert name in params, f"docs/samplers.md: {cls}({arg}) but {cls} takes {list(params)}"


def test_samplers_storage_dtypes():
    """`float32 G, uint16 count` per example, and the staleness sampler's `int64 last-draw step`."""
    import numpy as np

    from sazo_lite.samplers import PlainSAZOSampler, SAZOSampler, StaleCorrectedSAZOSampler

    table = read("docs/samplers.md")
    assert table.count("float32 G, uint16 count") >= 3 and "int64 last-draw step" in table
    for cls in (PlainSAZOSampler, SAZOSampler, StaleCorrectedSAZOSampler):
        sampler = cls(10)
        assert sampler._g.dtype == np.float32 and sampler._n.dtype == np.uint16, cls
    assert StaleCorrectedSAZOSampler(10)._last.dtype == np.int64


def test_samplers_names_and_state_dict():
    """`make_sampler("sazo-plain", ...)` builds the plain rule; `make_sampler` does not name the staleness
    sampler, which `benchmarks.queries --methods sazo-stale-corrected` races; state_dict's `extra` holds the
    level, the running sums and the resync counter."""
    from benchmarks.queries import METHODS
    from sazo_lite.samplers import PlainSAZOSampler, SAZOSampler, make_sampler

    assert isinstance(make_sampler("sazo-plain", 8), PlainSAZOSampler)
    with pytest.raises(ValueError):
        make_sampler("sazo-stale-corrected", 8)
    assert "sazo-stale-corrected" in METHODS
    extra = SAZOSampler(8).state_dict()["extra"]
    assert {"level", "seen_sq", "seen_count", "since_resync"} <= set(extra)


# -- docs/benchmarks.md ------------------------------------------------------------------------------------
def test_queries_grids_and_defaults_in_benchmarks_md(monkeypatch):
    """`The grids now reach one rate further each way (0.00033 and 0.096)`; B = 1 and 5 seeds by default;
    the ablation's and the diagnosis' methods are benchmarks.queries' METHODS."""
    from benchmarks import queries

    low, high = re.search(r"The grids now reach one rate further each way \(([\d.]+) and ([\d.]+)\)",
                          flat(read("docs/benchmarks.md"))).groups()
    problems = {p.name: p for p in queries.default_problems()}
    quadratics = [p for name, p in problems.items() if name.startswith("quadratic")]
    [logistic] = [p for name, p in problems.items() if name.startswith("logistic")]
    assert quadratics and all(min(p.lr_grid) == float(low) for p in quadratics)
    assert max(logistic.lr_grid) == float(high)
    for name in re.findall(r'--problems "([^"]+)"', read("docs/benchmarks.md")):
        assert name in problems, name
    for listed in re.findall(r"`--methods ([\w. -]+)`", read("docs/benchmarks.md") + read("docs/samplers.md")):
        assert set(listed.split()) <= set(queries.METHODS), listed
    args = parses(monkeypatch, queries.main, [])
    assert args.batch_size == int(stated("docs/benchmarks.md", r"Queries are 2·B per step, with B = (\d)\."))
    assert "median [min–max] over 5 seeds" in flat(read("docs/benchmarks.md"))
    assert "default 5" in inspect.getsource(queries.main)


def test_noise_table_sizes_in_benchmarks_md():
    """`one white table of 2²² float32 (16 MiB)` for GaussianTable; `NoiseTable()` a `shared 64 MiB table`."""
    from sazo_lite.noise import GaussianTable, NoiseTable

    text = flat(read("docs/benchmarks.md"))
    assert "one white table of 2²² float32 (16 MiB" in text
    assert defaults(GaussianTable)["size"] == 2 ** 22 and 4 * 2 ** 22 == 16 * 2 ** 20
    assert "`noise=NoiseTable()` (shared 64 MiB table" in text
    assert 4 * defaults(NoiseTable)["size"] == 64 * 2 ** 20


def test_bench_step_not_judged_message():
    """docs/benchmarks.md quotes `NOT JUDGED (load)` from `engine_speed.step_verdict`."""
    from benchmarks import engine_speed

    assert "`NOT JUDGED (load)`" in read("docs/benchmarks.md")
    assert "NOT JUDGED (load)" in inspect.getsource(engine_speed.step_verdict)


# -- docs/course.md -----------------------------------------------------------------------------------------
def test_book_and_app_settings_in_course_md():
    """`BOOK_JOBS=2`, `make book FULL=1` (--full), `SAZO_APP_LOADS` times (3), the BOOK_* variables."""
    makefile = read("Makefile")
    jobs = int(stated("docs/course.md", r"two at a time, `BOOK_JOBS=(\d+)`"))
    assert re.search(rf"^BOOK_JOBS \?= {jobs}$", makefile, re.M)
    assert "$(if $(FULL),--full,)" in makefile and 'add_argument("--full"' in read("book/build.py")
    loads = int(stated("docs/course.md", r"`SAZO_APP_LOADS` times \((\d+)\)"))
    assert f'os.environ.get("SAZO_APP_LOADS", "{loads}")' in read("tests/test_app.py")
    book = read("book/build.py") + read("book/conf.py")
    for variable in re.findall(r"`(BOOK_[A-Z_]+)", read("docs/course.md")):
        if variable != "BOOK_JOBS":
            assert variable in book, variable
    assert "make book FULL=1" in read(".github/workflows/pages.yml")


def test_bench_step_verdict_as_the_pages_state():
    """Only a step past its bound in swamped timings is "not judged" (exit 0); a step within the bound passes
    whatever the load, and one past it in clean timings fails (exit 1). The pages said any swamped run was
    not judged."""
    from benchmarks import engine_speed

    assert "default step past the bound in timings the tool itself finds swamped" in flat(read("docs/benchmarks.md"))
    assert 'past its bound in timings the load swamped it says "not judged"' in flat(read("README.md"))
    clean = {f"{v}_median_ratio": 1.2 for v in engine_speed.VARIANTS}
    swamped = {**clean, "plain_median_ratio": 0.7}
    base = {"model": "m", "default_s": 2.6, "forward_s": 1.0, "pass_default_s": 0.1, "pass_plain_s": 0.2,
            "pass_torch_noise_s": 0.2, "default_noise": "GaussianTable"}
    within, past = {**base, "default_ratio": 1.1}, {**base, "default_ratio": 1.3}
    verdict, failed = engine_speed.step_verdict({**within, **swamped}, 1.15)
    assert not failed and "NOT JUDGED" not in verdict
    verdict, failed = engine_speed.step_verdict({**past, **swamped}, 1.15)
    assert not failed and verdict.startswith("NOT JUDGED (load)")
    verdict, failed = engine_speed.step_verdict({**past, **clean}, 1.15)
    assert failed


def test_readme_timings_carry_a_date():
    """The example's quick check and the bench-llm pilot state measured times: each with its date (the quick
    check said "about 10 s on 2 CPU cores", undated; it ran in 59 s)."""
    quick = stated("README.md", r"is a quick check \(([^)]*)\)")
    assert re.search(r"20\d\d-\d\d-\d\d", quick), quick
    pilot = stated("README.md", r"(`BENCH_LLM_ARGS=--quick` for a [^)]*)\)")
    assert re.search(r"\d+ s (the same day|on 20\d\d-\d\d-\d\d)", pilot) and re.search(r"2026-\d\d-\d\d, see \[docs/llm\.md\]",
                                                                  flat(read("README.md")))


def _queries_plan(monkeypatch, capsys, argv) -> tuple[str, object]:
    """(the report file, the cell cache) `python -m benchmarks.queries ARGV` would use, without racing."""
    from benchmarks import queries

    seen = {}

    def interrupted(*args, **kwargs):
        seen.update(kwargs)
        raise KeyboardInterrupt

    monkeypatch.setattr(queries, "run_queries_benchmark", interrupted)
    with pytest.raises(SystemExit):
        queries.main(argv)
    out = re.search(r"(\S+\.json) was not written", capsys.readouterr().err).group(1)
    return Path(out).name, seen.get("cache")


def test_queries_report_files_and_cell_cache(monkeypatch, capsys):
    """docs/benchmarks.md: a full run writes queries.json, a run of some problems or methods
    queries_partial.json, --quick its own file; every run but --quick saves its cells in queries_cells/ (the page
    said a full run did)."""
    from benchmarks import queries

    text = flat(read("docs/benchmarks.md"))
    assert "A full run writes `benchmarks/results/queries.json`" in text
    assert "writes `benchmarks/results/queries_partial.json`" in text
    assert "every run but a `--quick` one (a full run, alone or inside `make bench`, or a partial one) saves" in text
    assert "`benchmarks/results/queries_cells/`" in text and queries.CELLS.name == "queries_cells"
    assert _queries_plan(monkeypatch, capsys, []) == ("queries.json", queries.CELLS)
    assert _queries_plan(monkeypatch, capsys, ["--problems", "quadratic σ=0"]) == ("queries_partial.json", queries.CELLS)
    assert _queries_plan(monkeypatch, capsys, ["--methods", "sazo", "uniform"]) == ("queries_partial.json", queries.CELLS)
    assert _queries_plan(monkeypatch, capsys, ["--quick"]) == ("queries_quick.json", None)


def test_vp_ablation_names_no_command_that_lacks_its_variants():
    """The V(p)/V(p*) ablation said `benchmarks.queries --methods …` has its variants: that command races
    queries, not V(p), and has neither the 1.5× optimism nor the loss covariate."""
    from benchmarks.queries import METHODS

    section = flat(read("docs/benchmarks.md").split("#### Ablation in V(p)/V(p*)", 1)[1].split("\n#### ", 1)[0])
    assert "has the variants" not in section
    assert "the 1.5× optimism and the loss covariate came from the evening's session scripts" in section
    assert not any("covariate" in name or "1.5" in name for name in METHODS)


def test_past_edge_with_five_seeds():
    """`with 5 seeds the old rule (a rate alive while at most 2 seeds diverged) and train.past_edge (at least
    half) lose the same rates`."""
    train = importlib.import_module("sazo_lite.train")

    assert "`train.past_edge` (at least half)" in flat(read("docs/benchmarks.md"))
    for diverged in range(6):
        assert train.past_edge([True] * diverged + [False] * (5 - diverged)) == (diverged > 2)
    assert train.past_edge([True, False]) and not train.past_edge([True, False, False])


def test_which_benchmarks_print_their_date():
    """`Every benchmark prints the date and the machine with its table …, except` the ones the page names:
    a benchmark module with a main() that never calls machine()/measured_on() must be among the exceptions, and
    each exception must really lack them (the page said every benchmark did; dashboard_latency prints no date)."""
    sentence = stated("docs/benchmarks.md", r"Every benchmark prints the date and the machine (.*?)\. ")
    excepted = set(re.findall(r"`benchmarks\.(\w+)`", sentence.split("except", 1)[1]))
    dated = re.compile(r"\bmachine\(\)|measured_on\(|measured_line\(|from \.?\w*\s*import .*\bmachine\b")
    for path in sorted((ROOT / "benchmarks").glob("*.py")):
        source = path.read_text()
        if "def main(" not in source:
            continue
        assert bool(dated.search(source)) != (path.stem in excepted), path.stem


def test_course_md_divergence_advice():
    """`suggests a lower η (about a third: two notches of the log slider)`."""
    from sazo_lite.course.widgets._common import lower_rate

    assert "suggests a lower η (about a third: two notches of the log slider)" in flat(read("docs/course.md"))
    for rate in (0.1, 0.02, 3e-4):
        assert lower_rate(rate) == pytest.approx(rate / 10 ** 0.5, rel=0.02)


def test_course_md_book_build_paths(monkeypatch):
    """`make book … builds build/book/html/`; `make book FULL=1` (--full); `BOOK_JOBS=2` is book/build.py's --jobs."""
    import importlib.util

    spec = importlib.util.spec_from_file_location("book_build", ROOT / "book" / "build.py")
    build = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(build)
    assert "builds build/book/html/" in flat(read("docs/course.md"))
    args = parses(monkeypatch, build.main, [])
    assert args.out == ROOT / "build" / "book" and not args.full and args.jobs == 2
    assert 'src, html = out / "src", out / "html"' in inspect.getsource(build.main)
    assert parses(monkeypatch, build.main, ["--full", "--jobs", "2"]).full
    assert "def test_book_sources_build_without_sphinx_warnings(" in read("tests/test_book.py")


# -- docs/trainer.md -----------------------------------------------------------------------------------------
def test_trainer_md_logs_and_resume_checks():
    """The log keys docs/trainer.md names are the ones ZOTrainer.log adds, and every setting it says a resume
    refuses to change is compared by _check_resumed_settings."""
    pytest.importorskip("transformers")
    from sazo_lite.hf import ZOTrainer

    text = flat(read("docs/trainer.md"))
    logged = set(re.findall(r"`(zo_\w+|sazo_\w+)`", text.split("Logs add", 1)[1].split("`eval_loss`", 1)[0]))
    assert logged == {"zo_queries", "zo_projected_grad", "sazo_max_weight", "sazo_ess"}
    source = inspect.getsource(ZOTrainer.log)
    assert all(f'"{key}"' in source or f"{key}=" in source for key in logged), logged
    refused = stated("docs/trainer.md", r"so it refuses \(`ValueError`\) new values of (.*?): loading the checkpoint")
    names = set(re.findall(r"`(\w+)`", refused))
    assert names == {"learning_rate", "weight_decay", "eps", "perturbation", "zo_seed", "seed", "data_seed",
                     "ema_decay", "uniform_mix"}
    check = inspect.getsource(ZOTrainer._check_resumed_settings)
    for name in names - {"seed", "ema_decay", "uniform_mix"}:       # seed: zo_seed's default; sampler's: below
        assert f'("{name}' in check, name
    assert 'sampler.get("hyperparameters"' in check
    from sazo_lite.samplers import SAZOSampler

    assert {"ema_decay", "uniform_mix"} <= set(SAZOSampler(4).state_dict()["hyperparameters"])


def test_trainer_md_refusals(tmp_path):
    """`adam_*` settings are refused, so is a `max_grad_norm` other than its default or 0, and
    `ema_decay`/`uniform_mix` with `method="mezo"`."""
    pytest.importorskip("transformers")
    import torch
    from transformers import TrainingArguments

    from sazo_lite.hf import ZOTrainer

    text = flat(read("docs/trainer.md"))
    assert "(`adam_*` settings are refused" in text and "a `max_grad_norm` other than its default or 0" in text
    model = torch.nn.Linear(2, 2)

    def build(method="sazo", **settings):
        args = TrainingArguments(str(tmp_path), report_to=[], use_cpu=True,
                                 **{k: v for k, v in settings.items() if k not in ("ema_decay",)})
        return ZOTrainer(model, args, method=method, ema_decay=settings.get("ema_decay"))

    for name, value in (("adam_beta1", 0.8), ("adam_beta2", 0.99), ("adam_epsilon", 1e-6), ("max_grad_norm", 0.5)):
        with pytest.raises(ValueError, match=name):
            build(**{name: value})
    build(max_grad_norm=0.0)
    with pytest.raises(ValueError, match="ema_decay"):
        build("mezo", ema_decay=0.8)


def test_sampler_state_bytes_in_samplers_md():
    """`10.13 and 10.12 bytes per example in tree mode at N = 10⁵ and 10⁶ …, 14 in CDF mode`: what
    `state_bytes` counts (the page said 10.13 at both; `make bench`'s table read 10.13 / 10.12)."""
    import torch

    from sazo_lite.samplers import SAZOSampler

    at_1e5, at_1e6 = re.search(r"([\d.]+) and ([\d.]+) bytes per example in tree mode at N = 10⁵ and 10⁶",
                               flat(read("docs/samplers.md"))).groups()
    cdf = stated("docs/samplers.md", r"trees padded to a power of two\), (\d+) in CDF mode")
    for n, figure, tree in ((10 ** 5, at_1e5, True), (10 ** 6, at_1e6, True), (10 ** 4, cdf, False)):
        sampler = SAZOSampler(n, seed=0)
        idx, _ = sampler.sample(32)
        sampler.update(idx, torch.ones(32, dtype=torch.float64))
        assert sampler.sum_tree == tree
        assert f"{sampler.state_bytes / n:.{len(figure.partition('.')[2])}f}" == figure, (n, figure)


def test_readme_tree_names_what_its_modules_define():
    """`engine.py MeZO`, `sparse.py SparseMeZO`, `precision.py: Float32Master, restore bound`, `samplers.py …
    (+ sumtree.py)`, `variance.py: V(p), p*`, `hf.py ZOTrainer`, `llm/ … (landscape.py)`."""
    tree = read("README.md").split("## Where things are", 1)[1].split("```", 2)[1]
    expected = {"engine.py": ("engine", "MeZO"), "sparse.py": ("sparse", "SparseMeZO"),
                "precision.py: Float32Master, restore bound": ("precision", "Float32Master", "restore_bound"),
                "variance.py: V(p), p*": ("variance", "sampling_variance", "oracle_probs"),
                "hf.py ZOTrainer": ("hf", "ZOTrainer"), "seedlog.py": ("seedlog", "SeedLog")}
    for words, (module, *names) in expected.items():
        assert words in flat(tree), words
        if module == "hf":
            pytest.importorskip("transformers")
        loaded = importlib.import_module(f"sazo_lite.{module}")
        assert all(hasattr(loaded, name) for name in names), (module, names)


def test_auto_noise_and_fold_defaults():
    """README: on a CPU model of ≥ AUTO_NOISE_MIN_ENTRIES entries `noise="auto"` (the default) reads z from
    `GaussianTable`, below it the plain loop; docs/benchmarks.md: `fold_updates=False` is the default."""
    import torch

    import sazo_lite as sz
    from sazo_lite.engine import AUTO_NOISE_MIN_ENTRIES
    from sazo_lite.noise import GaussianTable

    d = defaults(sz.MeZO)
    assert d["noise"] == "auto" and d["fold_updates"] is False
    assert "(`fold_updates=False` is the default)" in flat(read("docs/benchmarks.md"))
    big = sz.MeZO([torch.zeros(AUTO_NOISE_MIN_ENTRIES)], lr=0.1)
    small = sz.MeZO([torch.zeros(AUTO_NOISE_MIN_ENTRIES - 1)], lr=0.1)
    assert isinstance(big.noise, GaussianTable) and small.noise is None


def test_seed_reroll_section_settings(monkeypatch):
    """`python -m benchmarks.seed_reroll` races `InverseCdfSAZO` against today's stream `on the same 60 seeds`,
    SAZO `at lr 0.0025, queries to 2%`; the rule's `defaults (β 0.9, λ 0.1, c 1, level decay 0.99, |d|)`."""
    from benchmarks import seed_reroll
    from sazo_lite.samplers import SAZOSampler

    text = flat(read("docs/benchmarks.md"))
    seeds = int(stated("docs/benchmarks.md", r"against today's on the same (\d+) seeds"))
    lr, target = re.search(r"SAZO at lr ([\d.]+), queries to (\d+)% of the gap", text).groups()
    args = parses(monkeypatch, seed_reroll.main, [])
    assert (args.seeds, args.lr, args.target) == (seeds, float(lr), int(target) / 100)
    assert issubclass(seed_reroll.InverseCdfSAZO, SAZOSampler)
    beta, lam, c, level = map(float, re.search(r"Its defaults \(β ([\d.]+), λ ([\d.]+), c ([\d.]+), level decay "
                                               r"([\d.]+), \|d\|\)", text).groups())
    d = defaults(SAZOSampler)
    assert (d["ema_decay"], d["uniform_mix"], d["prior_strength"], d["level_decay"], d["statistic"]) == \
        (beta, lam, c, level, "abs")


def test_bench_step_settings_in_benchmarks_md(monkeypatch):
    """`make bench-step` (`… speed smollm2 --rounds 3 --bound 1.15`: SmolLM2-135M, B = 8, seq 64 …): the
    Makefile's command and engine_speed.speed's defaults; `27 pairs of forwards at 3 rounds` and `49 timed pieces
    (warm-up, then 3 rounds of 9 steps with their forwards and 3 pass sources)` follow from its variants."""
    from benchmarks import engine_speed

    text = flat(read("docs/benchmarks.md"))
    assert "--rounds 3 --bound 1.15`: SmolLM2-135M, B = 8, seq 64, float32, 2 threads" in text
    d = defaults(engine_speed.speed)
    assert (d["batch"], d["seq"], d["rounds"]) == (8, 64, 3)
    args = parses(monkeypatch, engine_speed.main, ["speed", "smollm2"])
    assert args.rounds == 3
    assert "$(PY) -m benchmarks.engine_speed speed smollm2 --bound $(STEP_BOUND)" in read("Makefile")
    variants, sources = len(engine_speed.VARIANTS), len(engine_speed.PASS_SOURCES)
    assert int(stated("docs/benchmarks.md", r"\((\d+) pairs of forwards at 3 rounds")) == 3 * variants
    pieces, rounds, steps, passes = map(int, re.search(r"(\d+) timed pieces \(warm-up, then (\d+) rounds of (\d+) "
                                                       r"steps with their forwards and (\d+) pass sources\)", text).groups())
    assert (steps, passes) == (variants, sources)
    assert pieces == 1 + steps + passes + rounds * (steps + passes)


def test_readme_step_fields_and_sample_weights():
    """`directional_diffs` ([B], unweighted (f_k(θ+εz) − f_k(θ−εz))/(2ε)) and the snippet's `i ~ p,
    w = 1/(N p_i)`: the weights scale g, not the diffs; the sampler's weights are 1/(N p_i) of its probs."""
    import torch

    import sazo_lite as sz

    text = flat(read("README.md"))
    assert "(`[B]`, unweighted `(f_k(θ+εz) − f_k(θ−εz))/(2ε)`)" in text and "# i ~ p, w = 1/(N p_i)" in text
    a = torch.tensor([[1.0, 2.0, 3.0], [-1.0, 0.5, 2.0]], dtype=torch.float64)
    runs = []
    for weights in (None, torch.tensor([2.0, 0.5], dtype=torch.float64)):
        theta = torch.zeros(3, dtype=torch.float64)
        opt = sz.MeZO([theta], lr=0.0, eps=1e-3, seed=5)
        runs.append(opt.step(lambda: a @ theta, weights) if weights is not None else opt.step(lambda: a @ theta))
    plain, weighted = runs
    assert torch.allclose(plain.directional_diffs, weighted.directional_diffs)
    assert weighted.projected_grad == pytest.approx(float((torch.tensor([2.0, 0.5]) * weighted.directional_diffs).mean()))
    sampler = sz.SAZOSampler(50, seed=0)
    for _ in range(30):
        idx, w = sampler.sample(4)
        assert torch.allclose(torch.as_tensor(w, dtype=torch.float64),
                              1.0 / (50 * sampler.probs.to(torch.float64)[idx]), rtol=1e-5)
        sampler.update(idx, torch.rand(4, dtype=torch.float64) * 10)


def test_gain_at_optimum_in_the_queries_tables():
    """The three tables' headings state V(u)/V(p*) at θ* (4.61, 11.7, 1.58): `uniform_gain` of each default
    problem's norms at its optimum, as the report's `gain_at_optimum`."""
    from benchmarks.queries import default_problems
    from sazo_lite.variance import uniform_gain

    text = flat(read("docs/benchmarks.md"))
    stated_gains = {"quadratic σ=1.5": re.search(r"\| σ = 1\.5 quadratic \(V\(u\)/V\(p\*\) = ([\d.]+) at θ\*\)", text),
                    "logistic": re.search(r"\| logistic regression, breast cancer \(V\(u\)/V\(p\*\) = ([\d.]+) at θ\*\)",
                                          text),
                    "quadratic σ=0": re.search(r"\| homogeneous quadratic \(σ = 0; V\(u\)/V\(p\*\) = ([\d.]+) at θ\*", text)}
    for item in default_problems():
        key = next(k for k in stated_gains if item.name.startswith(k))
        figure = stated_gains[key].group(1)
        gain = uniform_gain(item.problem.norms(item.problem.optimum))
        assert f"{gain:.{len(figure.partition('.')[2])}f}" == figure, (item.name, gain, figure)


def test_readme_fast_mode_notebook_times_are_the_makefiles():
    """README: fast mode runs each notebook in `7–36 s each on the idle machine, 2026-12-02`: the range of the
    Makefile's measured order (it said "about a minute", undated)."""
    low, high, date = re.search(r"under a minute \((\d+)–(\d+) s each on the idle machine, (20\d\d-\d\d-\d\d)",
                                flat(read("README.md"))).groups()
    comment = re.search(r"fast mode, (20\d\d-\d\d-\d\d), idle CI run: (.*?)\)", flat(read("Makefile")))
    assert comment.group(1) == date
    seconds = [int(s) for s in re.findall(r"(\d+)(?: s)?(?:,|$)", comment.group(2))]
    assert (min(seconds), max(seconds)) == (int(low), int(high)), seconds


def test_distributed_closure_refuses_what_the_page_says():
    """`batch_losses must return a tensor of one loss per index of the rank's shard: a scalar or a short tensor
    is a ValueError` (checked without a process group: one rank, the whole batch)."""
    import torch

    from sazo_lite.distributed import distributed_closure

    assert "a scalar or a short tensor is a `ValueError`" in flat(read("docs/distributed.md"))
    indices = torch.arange(4)
    for bad in (lambda idx: torch.tensor(1.0), lambda idx: torch.ones(len(idx) - 1)):
        with pytest.raises(ValueError, match="batch_losses"):
            distributed_closure(bad, indices)()
    assert distributed_closure(lambda idx: idx.double(), indices)().tolist() == [0.0, 1.0, 2.0, 3.0]


def test_sparse_seed_log_replays_as_the_page_says():
    """`a SparseMeZO log into dense MeZO` is refused; `log.replay_into(SparseMeZO(params, masks, lr=0.0,
    eps=...))` rebuilds the tuned weights, and leaves the optimiser at the logged step."""
    import torch

    import sazo_lite as sz
    from sazo_lite.sparse import SparseMeZO

    assert "`log.replay_into(SparseMeZO(params, masks, lr=0.0, eps=...))`" in read("docs/distributed.md")
    masks = [torch.tensor([1, 4, 6])]
    tuned, base = torch.zeros(8), torch.zeros(8)
    opt = SparseMeZO([tuned], masks, lr=0.05, eps=1e-3, seed=2)
    log = sz.SeedLog.attach(opt)
    for _ in range(5):
        opt.step(lambda: (tuned - 1).pow(2))
    with pytest.raises(ValueError):
        log.replay([torch.zeros(8)])
    replayer = SparseMeZO([base], masks, lr=0.0, eps=1e-3)
    log.replay_into(replayer)
    assert torch.equal(base, tuned)
    assert replayer.state_dict()["state"] == opt.state_dict()["state"]     # the step count and the seed


def test_queries_targets_and_budgets_in_benchmarks_md():
    """`until the training-loss gap first drops below 2% and 0.5%`; `not reached (30 000 steps)` on the σ = 1.5
    quadratic and `not reached (40 000 steps)` on the logistic regression are the problems' step budgets."""
    from benchmarks import queries

    text = flat(read("docs/benchmarks.md"))
    assert "first drops below 2% and 0.5% of its initial value" in text and queries.TARGETS == (0.02, 0.005)
    budgets = {p.name: p.max_steps for p in queries.default_problems()}
    sigma = text.split("| σ = 1.5 quadratic (V(u)", 1)[1].split("\n", 1)[0]
    assert int(re.search(r"not reached \(([\d ]+) steps\)", text.split("| σ = 1.5 quadratic (V(u)", 1)[1])
               .group(1).replace(" ", "")) == budgets["quadratic σ=1.5"], sigma
    logistic = text.split("| logistic regression, breast cancer (V(u)", 1)[1]
    [name] = [n for n in budgets if n.startswith("logistic")]
    assert int(re.search(r"not reached \(([\d ]+) steps\)", logistic).group(1).replace(" ", "")) == budgets[name]


def test_overhead_round_order_in_benchmarks_md():
    """`times both steps twice a round, in the order A B B A with A alternating between rounds`."""
    from benchmarks.engine_speed import round_order

    assert "in the order A B B A with A alternating between rounds" in flat(read("docs/benchmarks.md"))
    assert round_order(0) == ("uniform", "sazo", "sazo", "uniform")
    assert round_order(1) == ("sazo", "uniform", "uniform", "sazo")


def test_trainer_md_epoch_length(tmp_path):
    """`An epoch is ceil(N/B) steps, floor(N/B) (at least 1) with dataloader_drop_last` (the page said floor(N/B):
    0 steps for N < B, where the trainer takes 1)."""
    pytest.importorskip("transformers")
    import torch
    from transformers import TrainingArguments

    from sazo_lite.hf import ZOTrainer

    assert "An epoch is ceil(N/B) steps, floor(N/B) (at least 1) with `dataloader_drop_last`" in flat(read("docs/trainer.md"))
    rows = lambda n: [{"input_ids": [1, 2, 3], "labels": [-100, 2, 3]} for _ in range(n)]
    for n, drop, steps in ((20, False, 3), (20, True, 2), (3, True, 1), (3, False, 1)):
        args = TrainingArguments(str(tmp_path), per_device_train_batch_size=8, dataloader_drop_last=drop,
                                 report_to=[], use_cpu=True)
        trainer = ZOTrainer(torch.nn.Linear(2, 2), args, train_dataset=rows(n))
        assert trainer._steps_per_epoch() == steps, (n, drop)


def test_course_md_divergence_rule_cases():
    """`a run has diverged once its gap … is above DIVERGE_FACTOR × its starting gap or not finite (a run that
    starts at θ*, with a gap of 0, only once it is not finite)`."""
    from sazo_lite.course.sazo_runs import DIVERGE_FACTOR, first_divergence

    assert "(a run that starts at θ*, with a gap of 0, only once it is not finite;" in flat(read("docs/course.md"))
    assert first_divergence([1.0, 0.5, DIVERGE_FACTOR * 1.01]) == 2
    assert first_divergence([1.0, DIVERGE_FACTOR * 0.99]) is None
    assert first_divergence([1.0, float("nan")]) == 1
    assert first_divergence([0.0, 1e6, 1e30]) is None and first_divergence([0.0, 1e6, float("inf")]) == 2


def test_plain_make_installs():
    """README: GPU users may `install torch first into .venv and then run make`: make's default goal is install."""
    assert "install torch first into `.venv` and then run `make`" in flat(read("README.md"))
    first = re.search(r"^([\w.-]+)\s*:(?!=)", re.sub(r"^\.PHONY:.*$", "", read("Makefile"), flags=re.M), re.M).group(1)
    assert first == "install"


def test_plain_rule_and_oracle_as_samplers_md_states():
    """Plain rule: `G_i starts at G₀ = 1 …, G_i ← β·G_i + (1−β)·d_i² (duplicates in a batch: their mean d²),
    p ∝ √G mixed with uniform`; oracle: `‖∇f_i‖/Σ‖∇f_j‖ … computed on norms / max, so norms near float64's max
    keep p`, weights 1/(N p_i)."""
    import torch

    from sazo_lite.samplers import OracleSampler, PlainSAZOSampler

    text = flat(read("docs/samplers.md"))
    assert "(duplicates in a batch: their mean d²), p ∝ √G mixed with uniform" in text
    assert "computed on norms / max, so norms near float64's max keep p" in text
    plain = PlainSAZOSampler(4, seed=0)
    plain.update(torch.tensor([0, 0]), torch.tensor([1.0, 3.0], dtype=torch.float64))
    beta, lam = plain.ema_decay, plain.uniform_mix
    g = torch.tensor([beta * 1.0 + (1 - beta) * (1.0 + 9.0) / 2, 1.0, 1.0, 1.0], dtype=torch.float64)
    expected = (1 - lam) * g.sqrt() / g.sqrt().sum() + lam / 4
    assert torch.allclose(plain.probs.to(torch.float64), expected, rtol=1e-6)
    oracle = OracleSampler(3, lambda: torch.tensor([1e308, 5e307, 0.0], dtype=torch.float64), seed=0)
    assert torch.allclose(oracle.probs.to(torch.float64), torch.tensor([2 / 3, 1 / 3, 0.0], dtype=torch.float64))
    idx, w = oracle.sample(16)
    assert torch.allclose(torch.as_tensor(w, dtype=torch.float64), 1 / (3 * oracle.probs.to(torch.float64)[idx]))


def test_readme_example_builds_train_and_test_rows():
    """`examples/finetune_smollm2_trainer.py builds the model and the rows (its train and test) and runs the right
    column end to end`: its rows are `train`/`test` and its trainer is the column's ZOTrainer call on them."""
    assert "builds the model and the rows (its `train` and `test`)" in flat(read("README.md"))
    source = flat(read("examples/finetune_smollm2_trainer.py"))
    assert re.search(r"\btrain = \[row\(", source) and re.search(r"\btest = \[row\(", source)
    assert "ZOTrainer(model, args, train_dataset=train, eval_dataset=test," in source
    assert "trainer.train(resume_from_checkpoint=" in source


def test_torch_noise_is_not_called_the_default():
    """Since 2026-12-04 `noise="auto"` picks GaussianTable: a sentence calling TorchNoise "the default for large
    CPU models" without its end date is stale (benchmarks.md's z paragraph said so)."""
    from sazo_lite.engine import AUTO_NOISE_MIN_ENTRIES, _auto_noise
    from sazo_lite.noise import GaussianTable

    import torch

    assert isinstance(_auto_noise([{"params": [torch.zeros(AUTO_NOISE_MIN_ENTRIES)]}]), GaussianTable)
    for page in PAGES:
        for found in re.finditer(r"`TorchNoise`[^.;]{0,40}?\(([^)]*default[^)]*)\)", flat(read(page))):
            assert re.search(r"until 2026-12-0[34]|then the default|previous default", found.group(1)), (page, found.group(0))


def test_make_bench_run_time_is_where_the_queries_section_points():
    """`the make bench run of 2026-11-30 (22:44 UTC, below)`: the run's time is stated in "The whole table",
    which comes after the queries section (the page said "above")."""
    text = read("docs/benchmarks.md")
    pointer = text.index("run of 2026-11-30 (22:44 UTC, [below](#the-whole-table-make-bench))")
    assert text.index("### The whole table (`make bench`)") > pointer
    assert "finished 2026-11-30 22:44 UTC" in flat(text.split("### The whole table (`make bench`)", 1)[1])


def test_quoted_section_titles_of_other_pages_exist():
    """A link followed by a quoted section title (`[llm.md](llm.md), "Why SAZO's scores lag"`) names a heading
    of the linked page (benchmarks.md sent readers to "On a language model: what limits ZO, and where sampling
    pays", which llm.md does not have)."""
    quoted = 0
    for page in PAGES:
        text = flat(read(page))
        for target, title in re.findall(r"\]\(([\w./-]+\.md)(?:#[^)]*)?\)[,;]? \(?\"([^\"]{4,120})\"", text):
            path = (ROOT / page).parent / target
            headings = [re.sub(r"`", "", h) for h in re.findall(r"^#+ (.+)$", path.read_text(), re.M)]
            assert any(h.startswith(title.replace("`", "")) for h in headings), (page, target, title)
            quoted += 1
    assert quoted >= 2


def test_memory_md_reference_and_tiny_decoder():
    """`Reference: Qwen2.5-3B width, B = 2, bf16, SGD, fused attention, 40 GB budget` (the table's head) and the
    measured decoder `(4 layers, D = 128, 2 KV heads, float32, V = 512)` (memory_measure.TINY)."""
    from sazo_lite.course.memory import format_table
    from sazo_lite.course.memory_measure import TINY

    text = flat(read("docs/memory.md"))
    assert "Reference: Qwen2.5-3B width, B = 2, bf16, SGD, fused attention, 40 GB budget" in text
    head = format_table().splitlines()[0]
    for words in ("Qwen2.5-3B width", "B=2", "bfloat16", "SGD", "fused attention", "budget 40 GB"):
        assert words in head, (words, head)
    layers, hidden, kv, vocab = map(int, re.search(r"\((\d+) layers, D = (\d+), (\d+) KV heads, float32, V = (\d+)\)",
                                                   text).groups())
    assert (TINY.layers, TINY.hidden, TINY.kv_heads, TINY.vocab) == (layers, hidden, kv, vocab)


def test_sampler_feedback_refusals_in_samplers_md():
    """`Bad feedback to update(indices, directional_diffs) (indices out of range, NaN or inf diffs, mismatched
    shapes) raises ValueError with the state unchanged`; samplers take no losses (the page said "diffs or
    losses", an argument removed in 6a9db87)."""
    import torch

    from sazo_lite.samplers import PlainSAZOSampler, SAZOSampler, StaleCorrectedSAZOSampler

    text = flat(read("docs/samplers.md"))
    assert "diffs or losses" not in text
    assert "Bad feedback to `update(indices, directional_diffs)` (indices out of range, NaN or inf diffs," in text
    bad = [(torch.tensor([7]), torch.tensor([1.0])), (torch.tensor([0]), torch.tensor([float("nan")])),
           (torch.tensor([0]), torch.tensor([float("inf")])), (torch.tensor([0, 1]), torch.tensor([1.0]))]
    for cls in (SAZOSampler, PlainSAZOSampler, StaleCorrectedSAZOSampler):
        assert list(inspect.signature(cls.update).parameters) == ["self", "indices", "directional_diffs"]
        sampler = cls(4, seed=0)
        sampler.update(torch.tensor([0, 2]), torch.tensor([1.0, 2.0]))
        before = repr(sampler.state_dict())
        for indices, diffs in bad:
            with pytest.raises(ValueError):
                sampler.update(indices, diffs)
            assert repr(sampler.state_dict()) == before, cls


# Flags the pages quote that belong to pip, torchrun, pytest or venv, not to this project's command lines.
FOREIGN_FLAGS = {"--no-deps", "--index-url", "--extra-index-url", "--nproc_per_node", "--nbmake", "--overwrite",
                 "--clear"}


@pytest.mark.parametrize("page", PAGES)
def test_every_quoted_flag_is_some_parsers(page):
    """A `--flag` in backticks anywhere on the page (also outside a full command line: `--fresh`, `--only SECTION …`)
    is an option of a command line of benchmarks/, book/, examples/ or the library."""
    options = set()
    for folder in ("benchmarks", "book", "examples", "sazo_lite"):
        for path in (ROOT / folder).rglob("*.py"):
            options |= set(re.findall(r'add_argument\(\s*"(--[\w-]+)"', path.read_text()))
    named = set()
    for code in code_spans(page):
        named |= set(re.findall(r"(?<![\w-])(--[a-z][\w-]*)", code.split("#", 1)[0] if code.startswith(("make", "python"))
                                else code))
    missing = sorted(named - options - FOREIGN_FLAGS)
    assert not missing, f"{page} quotes flags no command line has: {missing}"


@pytest.mark.parametrize("page", PAGES)
def test_every_quoted_setting_variable_is_read(page):
    """A `SAZO_…`, `BOOK_…`, `BENCH_…` or `TORCH_…` variable a page quotes is read by the code, a test, the Makefile or
    the Pages workflow (a renamed variable would be set for nothing)."""
    source = "\n".join(path.read_text() for folder in ("sazo_lite", "benchmarks", "book", "tests", "examples")
                       for path in (ROOT / folder).rglob("*.py") if path.name != Path(__file__).name)
    source += read("Makefile") + read(".github/workflows/pages.yml")
    named = {name for code in code_spans(page)
             for name in re.findall(r"\b((?:SAZO|BOOK|BENCH|TORCH)_[A-Z0-9_]+)\b", code)}
    missing = sorted(name for name in named if name not in source)
    assert not missing, f"{page} quotes variables nothing reads: {missing}"


@pytest.mark.parametrize("page", PAGES)
def test_every_short_dotted_name_resolves(page, monkeypatch):
    """`train.past_edge`, `engine_speed.step_verdict`, `sazo_runs.first_divergence`, `benchmarks.run_cache`: a
    `module.name` span whose module is one of the library's or the benchmarks' resolves (test_docs_truth.py
    checks only names spelled from `sazo_lite.`)."""
    monkeypatch.syspath_prepend(str(ROOT))
    modules = {"benchmarks": "benchmarks"}
    for path in sorted((ROOT / "sazo_lite").rglob("*.py")):
        parts = path.relative_to(ROOT).with_suffix("").parts
        parts = parts[:-1] if parts[-1] == "__init__" else parts
        modules.setdefault(parts[-1], ".".join(parts))
    for path in sorted((ROOT / "benchmarks").glob("*.py")):
        modules.setdefault(path.stem, f"benchmarks.{path.stem}")
    missing = []
    for code in code_spans(page):
        found = re.fullmatch(r"(\w+)((?:\.\w+)+)(?:\(.*\))?", code.strip())
        if not found or found.group(1) not in modules or found.group(1) == "sazo_lite" or code.strip().endswith(".py"):
            continue
        if found.group(1) == "hf":
            pytest.importorskip("transformers")
        obj = importlib.import_module(modules[found.group(1)])
        for attribute in found.group(2).strip(".").split("."):
            if hasattr(obj, attribute):
                obj = getattr(obj, attribute)
            else:
                try:
                    obj = importlib.import_module(f"{obj.__name__}.{attribute}")
                except (ImportError, AttributeError):
                    missing.append(code)
                    break
    assert not missing, f"{page} names what its module does not have: {missing}"


def test_course_claims_rule_covers_every_chapter():
    """`tests/test_course_claims.py applies it to every chapter (notebook 06 … in tests/test_course_claims_06.py)`:
    the chapters its DERIVED table checks, with 06, are every notebook (the page named one file for all seven)."""
    assert "(notebook 06, the stored LLM race, in `tests/test_course_claims_06.py`)" in flat(read("docs/course.md"))
    source = read("tests/test_course_claims.py")
    table = source.split("DERIVED = {", 1)[1].split("\nCHECKED = sorted(DERIVED)", 1)[0]
    checked = set(re.findall(r'^    "(\d\d_\w+)": \{', table, re.M))
    assert "claims.unprinted(notebook" in source and "claims.unprinted(" in read("tests/test_course_claims_06.py")
    notebooks = {path.stem for path in (ROOT / "notebooks").glob("[0-9][0-9]_*.ipynb")}
    assert checked | {name for name in notebooks if name.startswith("06_")} == notebooks, checked
    assert not any(name.startswith("06_") for name in checked)


def test_trainer_md_args_copy_collator_and_fp16(tmp_path):
    """`Without an accelerator the trainer turns dataloader_pin_memory off in its copy of args`, `ignore_data_skip
    is turned off in the trainer's copy of args`, `fp16=True on a CPU is refused`, and `CausalLMCollator refuses
    rows with label or label_ids but no labels`."""
    pytest.importorskip("transformers")
    import torch
    from transformers import TrainingArguments

    from sazo_lite.hf import CausalLMCollator, ZOTrainer

    text = flat(read("docs/trainer.md"))
    assert "trainer turns `dataloader_pin_memory` off in its copy of `args`" in text
    assert "`ignore_data_skip` is turned off in the trainer's copy of `args`" in text
    assert "`fp16=True` on a CPU is refused" in text
    if torch.cuda.is_available():
        pytest.skip("the pin-memory and fp16 sentences are about machines without an accelerator")
    args = TrainingArguments(str(tmp_path), report_to=[], dataloader_pin_memory=True, ignore_data_skip=True)
    assert args.dataloader_pin_memory     # (use_cpu=True would turn it off in transformers itself)
    trainer = ZOTrainer(torch.nn.Linear(2, 2), args)
    assert not trainer.args.dataloader_pin_memory and not trainer.args.ignore_data_skip
    assert args.dataloader_pin_memory and args.ignore_data_skip          # the caller's args are left as they were
    try:
        half = TrainingArguments(str(tmp_path), report_to=[], use_cpu=True, fp16=True)
    except ValueError:
        half = None                                                      # transformers refuses it itself
    if half is not None:
        with pytest.raises(ValueError, match="fp16"):
            ZOTrainer(torch.nn.Linear(2, 2), half)
    assert "`CausalLMCollator` refuses rows with `label` or `label_ids` but no `labels`" in text
    for name in ("label", "label_ids"):
        with pytest.raises(ValueError, match=name):
            CausalLMCollator(0)([{"input_ids": [1, 2, 3], name: 1}])


def test_folded_run_replays_bit_for_bit():
    """distributed.md: `a folded run replays through the unfolded passes, which give the same θ` (bit for bit) once
    the optimiser's pending update is flushed (the page did not say that a folded run's weights wait for it)."""
    import torch

    import sazo_lite as sz

    assert ("a folded run replays through the unfolded passes, which give the same θ: compare after `opt.flush()`"
            in flat(read("docs/distributed.md")))
    torch.manual_seed(0)
    x, y = torch.randn(6, 3), torch.randn(6)
    theta, base = torch.zeros(3), torch.zeros(3)
    opt = sz.MeZO([theta], lr=0.05, eps=1e-3, seed=1, fold_updates=True)
    log = sz.SeedLog.attach(opt)
    for _ in range(20):
        opt.step(lambda: (x @ theta - y) ** 2)
    log.replay([base])
    assert opt.pending and not torch.equal(base, theta)      # θ − εz of the last step until the flush
    opt.flush()
    assert torch.equal(base, theta)


def test_readme_and_course_make_lines_run_what_they_say():
    """`make -n -B` of the pages' make lines: the README's GPU install passes TORCH_PIP_ARGS to torch's pip line,
    `BENCH_LLM_ARGS=--quick` reaches benchmarks.llm_queries, `make book FULL=1` builds with --full and
    `make bench-step` runs the step bound (nothing runs: -n prints the commands)."""
    import shutil
    import subprocess

    if shutil.which("make") is None:
        pytest.skip("no make")

    def commands(*args) -> str:
        return subprocess.run(["make", "-n", "-B", *args], cwd=ROOT, capture_output=True, text=True, check=True).stdout

    install = stated("README.md", r"`make (install TORCH_SPEC=\"torch==[\d.]+\" TORCH_PIP_ARGS=\"--index-url <your CUDA "
                                  r"wheel index>\")`")
    argv = shlex.split(install.replace("<your CUDA wheel index>", "https://example.invalid/cu"))
    torch_line = next(line for line in commands(*argv).splitlines() if '"torch==' in line)
    assert "--index-url https://example.invalid/cu" in torch_line
    assert "benchmarks.llm_queries --quick" in commands("bench-llm", "BENCH_LLM_ARGS=--quick")
    assert "book/build.py --jobs 2 --full" in commands("book", "FULL=1")
    assert "benchmarks.engine_speed speed smollm2 --bound 1.15" in commands("bench-step")


def test_trainer_md_snippet_is_the_readmes():
    """docs/trainer.md repeats the README's two-column snippet, which tests/test_docs_truth.py runs from the README:
    the copy must stay the same code."""
    def snippet(page: str, heading: str) -> str:
        return re.search(r"```python\n(.*?)```", read(page).split(heading, 1)[1], re.S).group(1)

    heading = "## Fine-tuning with the Hugging Face Trainer"
    assert snippet("docs/trainer.md", heading) == snippet("README.md", heading)


def test_binder_and_conda_use_the_cpu_wheel_index():
    """README: `Binder (binder/) and conda (environment.yml) use the CPU wheel index`, with the Makefile's torch."""
    assert "Binder (`binder/`) and conda (`environment.yml`) use the CPU wheel index" in flat(read("README.md"))
    version = re.search(r"^TORCH_SPEC \?= torch==(\S+)", read("Makefile"), re.M).group(1)
    for path in ("binder/requirements.txt", "environment.yml"):
        text = read(path)
        assert re.search(r"--(extra-)?index-url https://download\.pytorch\.org/whl/cpu\b", text), path
        assert re.search(rf"torch=={re.escape(version)}(\+cpu)?\s", text), path


def test_paired_ratio_and_noise_warning_as_benchmarks_md_states():
    """`its ratio is the least disturbed pair's (the smallest step + forwards), the median of the pairs' ratios is
    in the JSON, and a run where a step's median paired ratio is below 1 … warns` (one cheap pair does not)."""
    from benchmarks import engine_speed

    text = flat(read("docs/benchmarks.md"))
    assert "its ratio is the least disturbed pair's (the smallest step + forwards)" in text
    assert "a run where a step's median paired ratio is below 1 (it reads cheaper than its two forwards) warns" in text
    pair = engine_speed.paired_ratio([3.0, 2.5, 9.0], [2.0, 2.4, 4.0])
    assert (pair["step_s"], pair["forwards_s"]) == (2.5, 2.4) and pair["median_ratio"] == pytest.approx(1.5)
    clean = {f"{v}_median_ratio": 1.1 for v in engine_speed.VARIANTS}
    assert engine_speed.too_noisy(clean) is None
    assert engine_speed.too_noisy({**clean, "plain_median_ratio": 0.9})


def test_dashboard_latency_table_names_every_dashboard(monkeypatch):
    """The latency table's rows (sazo, race, mezo, paths and the list in its last row) are the dashboards
    `python -m benchmarks.dashboard_latency` measures, each once."""
    monkeypatch.syspath_prepend(str(ROOT))
    from benchmarks.dashboard_latency import dashboard_functions

    section = read("docs/benchmarks.md").split("### Dashboard latency", 1)[1].split("\n## ", 1)[0]
    rows = [line.split("|")[1].strip() for line in section.splitlines() if line.startswith("| ") and "---" not in line][1:]
    named = []
    for row in rows:
        named += [re.sub(r" \(.*\)$", "", name.strip()) for name in row.split(",")]
    spelled = {"chi²": "chi2", "ε": "epsilon"}
    named = [spelled.get(name, name).replace(" ", "_") + "_dashboard" for name in named]
    assert sorted(named) == sorted(dashboard_functions()), named


def test_readme_python_floor_is_the_packages():
    """`On a fresh clone, with Python ≥ 3.10 and make`: pyproject's requires-python and environment.yml's python."""
    floor = stated("README.md", r"On a fresh clone, with Python ≥ ([\d.]+) and `make`")
    assert re.search(rf'^requires-python = ">={re.escape(floor)}"$', read("pyproject.toml"), re.M)
    assert f"python>={floor}" in read("environment.yml")


def test_queries_tables_ratios_are_their_medians():
    """The ratio rows of the three toy tables (SAZO ÷ oracle, uniform ÷ SAZO, SAZO ÷ uniform) and the issue-13
    paragraph's `uniform ÷ oracle is 4.8× at 2%` are the quotients of the medians the tables print."""
    text = read("docs/benchmarks.md")
    checked = 0
    for heading in ("| σ = 1.5 quadratic (V(u)", "| logistic regression, breast cancer (V(u)", "| homogeneous quadratic (σ = 0"):
        table = text.split(heading, 1)[1].split("\n\n", 1)[0]
        medians = {}
        for line in table.splitlines()[2:]:
            cells = [c.strip() for c in line.strip("|").split("|")]
            numbers = [re.match(r"(\d+) \[", c) for c in cells[1:3]]
            if any(numbers):
                medians.setdefault(cells[0].split()[0], [int(n.group(1)) if n else None for n in numbers])
        for line in table.splitlines():
            found = re.match(r"\| (\w+) ÷ (\w+)[^|]*\| (.*)$", line)
            if not found:
                continue
            top, bottom, values = found.groups()
            for k, value in enumerate(re.findall(r"([\d.]+)×|–", values)[:2]):
                if value:
                    assert round(medians[top][k] / medians[bottom][k], 2) == float(value), (heading, line)
                    checked += 1
    assert checked >= 9
    sigma = text.split("| σ = 1.5 quadratic (V(u)", 1)[1]
    uniform, oracle = (int(re.search(rf"\| {name} \| (\d+) \[", sigma).group(1)) for name in ("uniform", "oracle p ∝ ‖∇f_i‖"))
    assert round(uniform / oracle, 1) == float(stated("docs/benchmarks.md", r"uniform ÷ oracle is ([\d.]+)× at 2%"))


def test_ablation_reading_percentages_are_the_tables():
    """`Switching any one off costs 3–26% more queries at 2% and 30–56% at 0.5%` (the single-feature rows of the
    σ = 1.5 columns against SAZO's), `The plain rule needs twice SAZO's queries`, `β = 0.7 costs 21% (2%) and
    44% (0.5%)`."""
    text = read("docs/benchmarks.md")
    section = text.split("#### Ablation in queries", 1)[1]
    table = "| variant" + section.split("\n| variant", 1)[1].split("\n\n", 1)[0]
    rows = {}
    for line in table.splitlines()[2:]:
        cells = [c.strip() for c in re.split(r"(?<!\\)\|", line.strip("|"))]     # `\|d\|` is inside a cell
        rows[cells[0]] = [int(m.group(1)) if (m := re.match(r"(\d+) \(lr", c)) else None for c in cells[1:]]
    sazo = rows["SAZO, the rule as it runs"]
    single = [v for name, v in rows.items() if name.startswith(("no ", "statistic", "λ = ", "β = "))]
    assert len(single) == 6
    costs = [[round(100 * (v[k] / sazo[k] - 1)) for v in single] for k in (0, 1)]
    sentence = flat(text)
    low2, high2, low05, high05 = map(int, re.search(r"Switching any one off costs (\d+)–(\d+)% more queries at 2% and "
                                                    r"(\d+)–(\d+)% at 0\.5%", sentence).groups())
    assert (min(costs[0]), max(costs[0]), min(costs[1]), max(costs[1])) == (low2, high2, low05, high05), costs
    plain = next(v for name, v in rows.items() if name.startswith("plain rule"))
    assert all(round(plain[k] / sazo[k]) == 2 for k in (0, 1))
    beta = next(v for name, v in rows.items() if name.startswith("β = 0.7"))
    two, half = map(int, re.search(r"β = 0\.7 costs (\d+)% \(2%\) and (\d+)% \(0\.5%\)", sentence).groups())
    assert [round(100 * (beta[k] / sazo[k] - 1)) for k in (0, 1)] == [two, half]


def test_ablation_logistic_reading_counts_every_faster_variant():
    """Logistic regression at 0.5%: the page said "four variants were faster"; six were (every one but the plain
    rule, which never got there), four of them by about a fifth or more."""
    text = read("docs/benchmarks.md")
    section = text.split("#### Ablation in queries", 1)[1]
    table = "| variant" + section.split("\n| variant", 1)[1].split("\n\n", 1)[0]
    rows = {}
    for line in table.splitlines()[2:]:
        cells = [c.strip() for c in re.split(r"(?<!\\)\|", line.strip("|"))]
        rows[cells[0]] = [int(m.group(1)) if (m := re.match(r"(\d+) \(lr", c)) else None for c in cells[1:]]
    sazo = rows["SAZO, the rule as it runs"][3]
    variants = {name: v[3] for name, v in rows.items()
                if not name.startswith(("SAZO,", "oracle", "uniform"))}
    faster = {name for name, v in variants.items() if v is not None and v < sazo}
    assert faster == {name for name in variants if not name.startswith("plain rule")}
    by_a_fifth = {name for name in faster if variants[name] <= 0.81 * sazo}
    sentence = flat(text)
    assert "To 0.5%, every variant but the plain rule was faster, four by about a fifth or more" in sentence
    assert len(by_a_fifth) == 4
    for name in by_a_fifth:
        assert str(variants[name]) in sentence.split("four by about a fifth or more", 1)[1].split("within the noise")[0]


def test_diagnosis_reading_is_its_table():
    """`The uniform mix costs ~1–3% of V (SAZO against its λ = 0 row)` and `SAZO's weights stay ≤ 4.2 against the
    oracle's 2 000–17 000`: the σ = 1.5 diagnosis table's rows (the page said ~3–5% and 800–16 000)."""
    text = read("docs/benchmarks.md")
    table = text.split("| σ = 1.5 quadratic, step |", 1)[1].split("\n\n", 1)[0]

    def row(name):
        line = next(line for line in table.splitlines() if line.startswith(f"| {name} |"))
        return [c.strip() for c in line.strip("|").split("|")[1:]]

    sazo, no_mix = [float(v) for v in row("SAZO")], [float(v) for v in row("SAZO with λ = 0")]
    costs = [100 * (a / b - 1) for a, b in zip(sazo, no_mix)]
    low, high = map(int, re.search(r"The uniform mix costs ~(\d+)–(\d+)%\*\* of V", flat(text)).groups())
    assert low <= min(costs) + 0.5 and max(costs) <= high + 0.5 and round(min(costs)) == low and round(max(costs)) == high
    weights = [[float(x) for x in cell.split(" / ")] for cell in row("largest weight 1/(N·p_i): SAZO / oracle")]
    assert max(w[0] for w in weights) == float(stated("docs/benchmarks.md", r"SAZO's weights stay ≤ ([\d.]+) against"))
    low, high = (int(x.replace(" ", "")) for x in
                 re.search(r"against the oracle's ([\d ]+)–([\d ]+) \(the table's last row\)", flat(text)).groups())
    oracle = [w[1] for w in weights]
    assert round(min(oracle), -3) == low and round(max(oracle), -3) == high


def test_seed_lists_match_the_table_and_the_reroll_section():
    """`[5540, 4160, 5120, 6120, 7140] on seeds 0–4 against [5700, 5960, 6500, 11440, 10680] now`: their medians are
    the re-roll table's first-5-seed column (5,540 / 6,500, +17%), and today's seeds are the σ = 1.5 SAZO cell
    at 2% (median [min–max])."""
    import statistics

    text = flat(read("docs/benchmarks.md"))
    old, new = ([int(x) for x in group.split(", ")] for group in
                re.search(r"gave \[([\d, ]+)\] on seeds 0–4 against \[([\d, ]+)\] now", text).groups())
    first_old, first_new = (int(x.replace(",", "")) for x in re.search(
        r"\| old stream \(inverse CDF\) \| [\d,]+ \| ([\d,]+) \| \| today's stream \(mixture\) \| [\d,]+ \| ([\d,]+) \|",
        text).groups())
    assert (statistics.median(old), statistics.median(new)) == (first_old, first_new)
    assert round(100 * (first_new / first_old - 1)) == int(stated("docs/benchmarks.md", r"moved 5,540 → 6,500 \(\+(\d+)%\)"))
    cell = re.search(r"\| SAZO \(the rule above\) \| (\d+) \[(\d+)–(\d+)\] lr 0\.0025 \|", text).groups()
    assert (statistics.median(new), min(new), max(new)) == tuple(int(x) for x in cell)


def test_staleness_ratios_in_samplers_md_are_llm_md_table():
    """samplers.md's staleness figures (0.82× on the logistic regression at 2%, 1.06× and 1.21× on σ = 1.5, 1.00×
    and 0.80× uniform on the control) are the quotients of llm.md's "Candidate rules" table and benchmarks.md's
    uniform medians on σ = 0."""
    text = flat(read("docs/samplers.md"))
    logistic, two, half, control2, control05 = map(float, re.search(
        r"\): ([\d.]+)× the default rule's queries on the logistic regression at 2%, ([\d.]+)× and ([\d.]+)× on the "
        r"σ = 1\.5 quadratic at 2% and 0\.5%, ([\d.]+)× and ([\d.]+)× uniform on the homogeneous control", text).groups())
    table = read("docs/llm.md").split("### Candidate rules", 1)[1].split("\n| rule |", 1)[1].split("\n\n", 1)[0]

    def cells(prefix):
        line = next(line for line in table.splitlines() if line.startswith(prefix))
        return [int(m.group(1)) if (m := re.match(r"(\d+)", c.strip())) else None for c in line.strip("|").split("|")[1:]]

    sazo, stale = cells("| SAZO (default)"), cells("| staleness correction")
    homogeneous = read("docs/benchmarks.md").split("| homogeneous quadratic (σ = 0", 1)[1]
    uniform = [int(x) for x in re.search(r"\| uniform \| (\d+) \[[^|]*\| (\d+) \[", homogeneous).groups()]
    assert round(stale[2] / sazo[2], 2) == logistic
    assert (round(stale[0] / sazo[0], 2), round(stale[1] / sazo[1], 2)) == (two, half)
    assert (round(stale[3] / uniform[0], 2), round(stale[4] / uniform[1], 2)) == (control2, control05)


def test_course_md_widget_pins_are_pyprojects():
    """`pyproject.toml excludes 3.0.17 (and ipywidgets 8.1.9, which needs it)`; the installed Voilà is the one the
    page describes."""
    import importlib.metadata

    text = flat(read("docs/course.md"))
    assert "so `pyproject.toml` excludes 3.0.17 (and ipywidgets 8.1.9, which needs it)" in text
    project = read("pyproject.toml")
    assert '"jupyterlab_widgets>=3.0,!=3.0.17"' in project and '"ipywidgets>=8.1,!=8.1.9"' in project
    voila = stated("docs/course.md", r"Voilà (\d+\.\d+\.\d+) \(the newest on PyPI")
    assert f'"voila>={voila}"' in project
    try:
        assert importlib.metadata.version("voila") == voila
    except importlib.metadata.PackageNotFoundError:
        pass


def test_memory_md_errors_are_the_stored_class_run():
    """`inference and ZO within +0.6…+10.0%`, `BP within −5.6…−15.7%`, `Backprop is measured below the model (−5.6 to
    −15.7% in the class-mode run)`: the errors in benchmarks/reference/class_runs/07_memory_on_device.txt, which the
    page names."""
    text = flat(read("docs/memory.md"))
    assert "`benchmarks/reference/class_runs/07_memory_on_device.txt`" in text
    run = read("benchmarks/reference/class_runs/07_memory_on_device.txt")
    errors = {mode: [float(e) for e in re.findall(rf"^\w+\s+n_ctx=\s*\d+ {mode}\s+measured .*? error\s+([+-][\d.]+)%",
                                                   run, re.M)] for mode in ("inference", "zo", "bp")}
    assert all(len(v) == 6 for v in errors.values()), errors
    low, high = (float(x.replace("−", "-")) for x in re.search(r"inference and ZO within ([−+\d.]+)…\+([\d.]+)%",
                                                                  text).groups())
    together = errors["inference"] + errors["zo"]
    assert (min(together), max(together)) == (low, high)
    near, far = (float(x) for x in re.search(r"BP within −([\d.]+)…−([\d.]+)%", text).groups())
    assert (max(errors["bp"]), min(errors["bp"])) == (-near, -far)
    assert max(errors["bp"]) < 0   # the bullet quotes the same run's range (the run of 2026-12-08: −5.6 to −15.7%)
    assert f"Backprop is measured **below** the model (−{near:g} to −{far:g}% in the class-mode run)" in text


def test_course_md_latency_figures_are_benchmarks_md_table():
    """course.md's slider latency sentence (first draws, slowest control, full redraws) is benchmarks.md's
    dashboard latency table, measured the same day."""
    course = flat(read("docs/course.md"))
    section = read("docs/benchmarks.md").split("### Dashboard latency", 1)[1].split("\n## ", 1)[0]
    rows = {line.split("|")[1].strip().split(" (")[0]: [c.strip() for c in line.strip("|").split("|")[1:]]
            for line in section.splitlines() if line.startswith("| ") and "---" not in line}

    def ms(cell):
        return [int(x) for x in re.findall(r"(\d+) ms", cell)]

    assert stated("docs/course.md", r"\*\*Slider latency\*\* \(`python -m benchmarks\.dashboard_latency --per-control`, "
                                    r"(20\d\d-\d\d-\d\d)") in section.split("\n\n", 2)[1]
    firsts = {name: ms(cells[0])[-1] for name, cells in rows.items() if ms(cells[0])}
    assert int(stated("docs/course.md", r"shows its first draw within (\d+) ms")) == max(firsts.values())
    for word, name in (("SAZO", "sazo"), ("race", "race"), ("MeZO", "mezo"), ("2-D paths", "paths")):
        assert int(stated("docs/course.md", rf"{re.escape(word)} (\d+) ms")) == firsts[name], word
    slowest = max(ms(cells[1])[-1] for cells in rows.values() if ms(cells[1]))
    assert int(stated("docs/course.md", r"slowest: the SAZO dashboard's σ, (\d+) ms")) == slowest
    redraw = re.search(r"their full redraw takes (\d+) ms and (\d+) ms", course).groups()
    assert (int(redraw[0]), int(redraw[1])) == (ms(rows["race"][2])[0], ms(rows["paths"][2])[0])


def test_staleness_tests_are_what_samplers_md_says():
    """`tests/test_sazo_staleness.py: exact enumeration, 200,000 draws, frequencies, and two wrong versions that
    fail`."""
    draws = int(stated("docs/samplers.md", r"`tests/test_sazo_staleness\.py`: exact enumeration, ([\d,]+) draws")
                .replace(",", ""))
    source = read("tests/test_sazo_staleness.py")
    assert f"draws={draws:_}" in source
    assert len(re.findall(r"^def test_wrong_\w+\(", source, re.M)) == 2

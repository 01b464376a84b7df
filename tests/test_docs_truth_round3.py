"""What the README, docs/ and labs/README.md state about the code, checked against the code (third round).

tests/test_docs_truth.py and tests/test_docs_truth_round2.py audit the README and docs/ pages; labs/README.md,
the instructors' page, was in neither: its grading commands, what `make grade` prints, its folders, timeouts
and sandbox caps are checked here, with the README's torch install and the data-parallel batch check.
Nothing here grades a notebook: the grader's functions are swapped for stand-ins that record their arguments.
"""
from __future__ import annotations

import re
import shlex
from pathlib import Path

import pytest

from test_docs_truth_round2 import flat, parses, read, stated

ROOT = Path(__file__).resolve().parents[1]
LABS_README = "labs/README.md"


# -- labs/README.md: what `make grade` prints and where it writes -----------------------------------------
def test_make_grade_prints_the_line_labs_readme_quotes(monkeypatch, capsys, tmp_path):
    """labs/README.md quoted `alice.ipynb: 11 / 12 (ok)`; the command prints the sandbox too, then the paths of
    results.json and score.json, into build/grades/<master's full name>/<hand-in's stem>/."""
    from sazo_lite.course import labs

    quoted, lab_folder = re.search(
        r"`make grade` prints `([^`]+)` and the paths of `results\.json` and `score\.json`, which it writes, with "
        r"`grade\.log`, in `build/grades/<lab>/<submission>/` \(`<lab>` the master's full name, `(\w+)`; "
        r"`<submission>` the hand-in's name without `\.ipynb`\):",
        flat(read(LABS_README))).groups()
    name, total, possible, status, sandbox = re.fullmatch(
        r"(\S+): (\d+) / (\d+) \((\w+), sandbox: (\w+)\)", quoted).groups()
    build = tmp_path / "build" / "labs"
    monkeypatch.setattr(labs, "BUILD_DIR", build)
    monkeypatch.setattr(labs, "autograder_zip",
                        lambda lab, build_dir: build / "lab1_two_point_estimator" / "autograder" / "x-autograder_1.zip")
    calls = []

    def fake_grade(submission, autograder, out, **timeouts):
        calls.append(out)
        return {"submission": submission.name, "status": status, "reason": None, "sandbox": sandbox,
                "total": float(total), "possible": float(possible), "questions": {}}

    monkeypatch.setattr(labs, "grade", fake_grade)
    assert labs.main(["grade", "lab1", name]) == 0
    printed = capsys.readouterr().out.splitlines()
    assert printed[0] == quoted
    assert "results.json" in printed[1] and "score.json" in printed[1]
    assert calls == [tmp_path / "build" / "grades" / lab_folder / Path(name).stem]


def test_grade_all_folders_for_names_that_differ_only_in_case(monkeypatch, tmp_path):
    """labs/README.md said `alice/` and `Alice-2/`; the hand-ins are sorted, so `Alice.ipynb` keeps its name."""
    from sazo_lite.course import labs
    from sazo_lite.course.labs import grading

    first, second = re.search(r"distinct folders, `(\w+)/` and `([\w-]+)/` \(the name that sorts first keeps its own\)",
                              flat(read(LABS_README))).groups()
    hand_ins = tmp_path / "handins"
    hand_ins.mkdir()
    for stem in ("alice", "Alice"):
        (hand_ins / f"{stem}.ipynb").write_text("{}")
    if len(list(hand_ins.iterdir())) < 2:
        pytest.skip("a case-insensitive file system keeps one of the two hand-ins")
    monkeypatch.setattr(grading, "reference", lambda *args, **kwargs: {})
    monkeypatch.setattr(grading, "load_tests", lambda autograder: ({}, {"q1": {"points": [1]}}))
    folders = {}

    def fake_grade(submission, autograder, out, **kwargs):
        folders[submission.name] = out.name
        return {"submission": submission.name, "status": "ok", "reason": None, "sandbox": "none",
                "total": 0.0, "possible": 1.0, "questions": {"q1": {"score": 0.0, "possible": 1.0}}}

    monkeypatch.setattr(labs, "grade", fake_grade)
    labs.grade_all(tmp_path / "x.zip", hand_ins, tmp_path / "grades" / "lab1.csv")
    assert folders == {"Alice.ipynb": first, "alice.ipynb": second}


# -- labs/README.md: commands, timeouts and caps ----------------------------------------------------------
def labs_commands() -> list[list[str]]:
    """argv of each `python -m sazo_lite.course.labs …` line of the page's code blocks (continuations joined)."""
    blocks = re.findall(r"```bash\n(.*?)```", read(LABS_README), re.S)
    lines = [line for block in blocks for line in block.replace("\\\n", " ").splitlines()]
    return [shlex.split(line.split("#", 1)[0])[3:] for line in lines
            if line.startswith("python -m sazo_lite.course.labs ")]


def test_labs_readme_commands_parse_and_make_runs_them(monkeypatch):
    from sazo_lite.course import labs

    commands = labs_commands()
    assert {argv[0] for argv in commands} == {"assign", "grade", "grade-all"}, commands
    for argv in commands:
        parses(monkeypatch, labs.main, argv)
        monkeypatch.undo()
    makefile = read("Makefile")
    workers = re.search(r"^make labs\s+# = python -m sazo_lite\.course\.labs assign  \((\w+) labs at a time\)$",
                        read(LABS_README), re.M).group(1)
    assert {"one": 1, "two": 2, "three": 3, "four": 4}[workers] == parses(monkeypatch, labs.main, ["assign"]).workers
    monkeypatch.undo()
    assert parses(monkeypatch, labs.main, ["grade", "lab1", "x.ipynb", "--sandbox", "bwrap"]).sandbox == "bwrap"
    monkeypatch.undo()
    assert re.search(r"^labs:.*\n\t\$\(PY\) -m sazo_lite\.course\.labs assign$", makefile, re.M)
    assert "-m sazo_lite.course.labs grade $(LAB) $(SUBMISSION)" in makefile
    assert "-m sazo_lite.course.labs grade-all $(LAB) $(SUBMISSIONS) --workers $(WORKERS)" in makefile


def test_labs_readme_timeouts_are_the_graders(monkeypatch):
    from sazo_lite.course import labs
    from sazo_lite.course.labs import grading

    args = parses(monkeypatch, labs.main, ["grade", "lab1", "x.ipynb"])
    for flag in ("cell-timeout", "test-timeout", "notebook-timeout"):
        assert int(stated(LABS_README, rf"- `--{flag}` \((\d+)\)")) == getattr(args, flag.replace("-", "_"))
    assert float(stated(LABS_README, r"each in \(0, (1e\d+)\]")) == labs.MAX_TIMEOUT
    assert float(stated(LABS_README, r"still running (\d+) s later, the sandbox is killed")) == grading.GRACE
    assert "killed the same way after twice the limit plus those 5 s" in flat(read(LABS_README))
    assert int(stated(LABS_README, r"restarts included \(at most (\d+)\)")) == grading.MAX_RESTARTS


def test_labs_readme_sandbox_caps_are_the_sandboxes():
    from sazo_lite.course import labs
    from sazo_lite.course.labs import grading, sandbox, values

    limits, text = sandbox.Limits(), flat(read(LABS_README))
    assert int(stated(LABS_README, r"at most (\d+) processes and threads")) == limits.processes
    assert int(stated(LABS_README, r"(\d+) GiB of memory in total")) * 1024 == limits.memory_mb
    assert int(stated(LABS_README, r"always (\d+) GiB of address space per process")) * 1024 == limits.memory_mb
    assert int(stated(LABS_README, r"scratch `/tmp` \((\d+) MiB\)")) == limits.scratch_mb
    assert int(stated(LABS_README, r"`/dev/shm` \((\d+) MiB\)")) == limits.shm_mb
    assert int(stated(LABS_README, r"no file may exceed (\d+) MiB")) == limits.file_mb
    assert "and one core, in a cgroup" in text and limits.cpu_cores == 1.0
    # "the notebook timeout plus a minute of CPU time per process"
    assert "the notebook timeout plus a minute of CPU time per process" in text
    assert "Limits(cpu_seconds=int(notebook_timeout) + 60)" in Path(grading.__file__).read_text()
    assert float(stated(LABS_README, r"above the quota by more than (\d+)%")) == pytest.approx((sandbox.CPU_SLACK - 1) * 100)
    assert int(stated(LABS_README, r"at most (\d+) MiB, JSON")) * 2 ** 20 == grading.MAX_LINE
    assert int(stated(LABS_README, r"over (\d+ \d+) numbers fails its case").replace(" ", "")) == values.MAX_ITEMS
    assert int(stated(LABS_README, r"a hand-in over (\d+) MiB is refused")) * 2 ** 20 == grading.MAX_NOTEBOOK_BYTES
    assert "(first MiB;" in text and grading.LOG_BYTES == 2 ** 20
    seed = int(stated(LABS_README, r"`lab_seed = (\d+)` is set as otter would"))
    for master in sorted(labs.LABS_DIR.glob("lab*.ipynb")):
        assert f"autograder_value: {seed}" in master.read_text(), master.name


# -- docs/distributed.md: the batch check ---------------------------------------------------------------
def test_distributed_batch_check_is_what_the_page_says():
    """docs/distributed.md said `one all-gather of a 32-byte digest`: it gathers the hex string (64 characters)
    with all_gather_object."""
    import inspect

    from sazo_lite import distributed

    collective, characters = re.search(r"`same_batch`: one `(\w+)` of the batch's SHA-256 as a (\d+)-character hex",
                                       flat(read("docs/distributed.md"))).groups()
    assert f"dist.{collective}(" in inspect.getsource(distributed._gathered)
    digest = distributed._batch_digest([3, 1, 2])
    assert isinstance(digest, str) and len(digest) == int(characters)


# -- README: which torch `make install` installs ----------------------------------------------------------
def test_readme_torch_install_is_the_makefiles():
    """README said `The default install is the CPU wheel`; the Makefile gives pip no index (TORCH_PIP_ARGS empty),
    so PyPI's Linux build (CUDA) is what a plain pip installs."""
    makefile, readme = read("Makefile"), flat(read("README.md"))
    pip_args = re.search(r"^TORCH_PIP_ARGS \?=(.*)$", makefile, re.M).group(1).strip()
    spec = re.search(r"^TORCH_SPEC \?= (\S+)$", makefile, re.M).group(1)
    cpu_index = "https://download.pytorch.org/whl/cpu"
    if cpu_index not in pip_args:
        assert "The default install is the CPU wheel" not in readme
        assert "(`TORCH_PIP_ARGS` is empty)" in readme if not pip_args else True
    assert f"`make install` pins `{spec}`" in readme
    assert f'`make install TORCH_PIP_ARGS="--index-url {cpu_index}"`' in readme
    assert f'TORCH_SPEC="{spec}"' in readme
    assert '$(TORCH_PIP_ARGS) "$(TORCH_SPEC)"' in makefile


# -- labs/README.md and book/labs.md: the checks the other pages get ----------------------------------------
@pytest.mark.parametrize("page", [LABS_README, "book/labs.md"])
def test_lab_pages_name_what_exists(page):
    """tests/test_docs_truth.py's make-target, dotted-name, file and link checks, on the two lab pages it omits."""
    import test_docs_truth as first

    first.test_every_make_target_a_page_names_exists(page)
    first.test_every_dotted_library_name_resolves(page)
    first.test_every_source_file_a_page_names_exists(page)
    first.test_every_relative_link_and_anchor_resolves(page)


def test_lab_pages_quote_only_defined_names_and_flags():
    """Names in backticks are the library's or a master's (`Lab3Sampler`, the student's class); flags are the labs
    command's or nbconvert's (the page's `jupyter nbconvert` line)."""
    import test_docs_truth as first

    from sazo_lite.course import labs

    with pytest.raises(AssertionError) as missing:
        first.test_every_class_name_a_page_quotes_is_defined(LABS_README)
    names = set(re.findall(r"'(\w+)'", str(missing.value).split("quotes names nothing defines:", 1)[1]))
    masters = "".join(path.read_text() for path in labs.LABS_DIR.glob("lab*.ipynb"))
    assert names and all(f"class {name}" in masters for name in names), names
    first.test_every_class_name_a_page_quotes_is_defined("book/labs.md")
    flags = set(re.findall(r"(?<![\w-])(--[a-z][\w-]*)", " ".join(re.findall(r"`([^`]+)`", read(LABS_README)))))
    flags |= set(re.findall(r"(?<![\w-])(--[a-z][\w-]*)", " ".join(re.findall(r"```bash\n(.*?)```", read(LABS_README), re.S))))
    parser_flags = set(re.findall(r'add_argument\("(--[\w-]+)"', Path(labs.__file__).read_text()))
    nbconvert = {"--clear-output", "--inplace", "--to"}
    assert flags - parser_flags <= nbconvert, flags - parser_flags
    assert "`jupyter nbconvert --clear-output --inplace labs/*.ipynb`" in read(LABS_README)


def test_labs_readme_install_extras_exist():
    """`pip install -e ".[notebooks,llm,labs]"` and Binder's `labs` extra: extras pyproject.toml defines."""
    tomllib = pytest.importorskip("tomllib")   # Python 3.11+ (the package supports 3.10)
    extras = tomllib.loads(read("pyproject.toml"))["project"]["optional-dependencies"]
    named = stated(LABS_README, r'`pip install -e "\.\[([\w,]+)\]"`').split(",")
    assert set(named) <= set(extras), named
    assert any(name.startswith("otter-grader") for name in extras["labs"])
    assert '".[notebooks,llm,labs]"' in read("binder/postBuild")


def test_results_and_score_json_hold_what_labs_readme_lists(monkeypatch, tmp_path):
    """labs/README.md listed `rule`, `caps` and `cell_errors` "per question"; `rule` is under each question that
    broke the library rule, `caps` and `cell_errors` are the submission's. grade() runs with grading's steps stubbed."""
    from sazo_lite.course import labs
    from sazo_lite.course.labs import grading

    text = flat(read(LABS_README))
    per_question, whole = re.search(r"`results\.json` also lists, under each question that broke the lab's rule, (.*?); "
                                    r"and for the whole submission (.*?) that failed raised", text).groups()
    per_question, whole = set(re.findall(r"`(\w+)`:", per_question)), set(re.findall(r"`(\w+)`:", whole))
    score_line = stated(LABS_README, r"- `score\.json`: (.*?) and the score per question")
    score_keys = set(re.findall(r"`(\w+)`", re.sub(r"\([^)]*\)", "", score_line)))   # not the values in brackets
    outcome = {"cases": {("q1", 0): {"error": None, "records": []}}, "skipped": [], "status": "ok", "sandbox": "none",
               "rules": {"q1": ["sazo_lite.SAZOSampler"]}, "caps": {"uid": 1}, "cell_errors": {2: "NameError: x"}}
    stubs = {"load_tests": lambda autograder: ({}, {"q1": {"points": [1], "cases": [{"hidden": False}]},
                                                   "q2": {"points": [1], "cases": [{"hidden": True}]}}),
             "reference": lambda *args, **kwargs: {("q1", 0): {"records": []}, ("q2", 0): {"records": []}},
             "lab_rule": lambda config: None, "read_notebook": lambda submission, unreadable: object(),
             "ignored": lambda autograder, config: (), "notebook_cells": lambda notebook, config, *explore: [],
             "cell_questions": lambda *args, **kwargs: {}, "run": lambda *args, **kwargs: outcome}
    for name, stub in stubs.items():
        monkeypatch.setattr(grading, name, stub)
    (tmp_path / "alice.ipynb").write_text("{}")
    (tmp_path / "lab.zip").write_bytes(b"")
    summary = labs.grade(tmp_path / "alice.ipynb", tmp_path / "lab.zip", tmp_path / "out", sandbox="none")
    import json

    results = json.loads((tmp_path / "out" / "results.json").read_text())
    assert per_question == {"rule"} and set(results["questions"]["q1"]) >= per_question
    assert "rule" not in results["questions"]["q2"] and "rule" not in results
    assert whole == {"caps", "cell_errors"} and whole <= set(results)
    assert not whole & set(results["questions"]["q1"])
    assert "killed" in results and "`killed`" in text
    score = json.loads((tmp_path / "out" / "score.json").read_text())
    assert score_keys == {"status", "reason", "sandbox", "total", "possible"} and score_keys <= set(score)
    assert set(score["questions"]) == {"q1", "q2"} and summary == score


def test_labs_readme_python_calls_bind():
    """The page's Python block: labs.grade(submission, zip, out) and labs.grade_all(zip, folder, csv, workers=)."""
    import ast
    import inspect

    from sazo_lite.course import labs

    block = re.search(r"```python\n(.*?)```", read(LABS_README), re.S).group(1)
    calls = [node for node in ast.walk(ast.parse(block)) if isinstance(node, ast.Call)
             and isinstance(node.func, ast.Attribute) and isinstance(node.func.value, ast.Name)
             and node.func.value.id == "labs"]
    assert {call.func.attr for call in calls} == {"grade", "grade_all", "autograder_zip"}
    for call in calls:
        signature = inspect.signature(getattr(labs, call.func.attr))
        signature.bind(*call.args, **{keyword.arg: None for keyword in call.keywords})


def test_grade_all_exit_codes_as_labs_readme_states(monkeypatch, tmp_path, capsys):
    """`2, with the reason and no traceback, for a wrong lab or a folder with no hand-ins`."""
    from sazo_lite.course import labs

    assert "2, with the reason and no traceback, for a wrong lab or a folder with no hand-ins" in flat(read(LABS_README))
    with pytest.raises(SystemExit) as wrong_lab:
        labs.main(["grade-all", "lab9", str(tmp_path)])
    monkeypatch.setattr(labs, "autograder_zip", lambda lab, build_dir: tmp_path / "lab1-autograder_1.zip")
    (tmp_path / "empty").mkdir()
    with pytest.raises(SystemExit) as no_hand_ins:
        labs.main(["grade-all", "lab1", str(tmp_path / "empty"), "--out", str(tmp_path / "x.csv")])
    err = capsys.readouterr().err
    assert wrong_lab.value.code == no_hand_ins.value.code == 2
    assert "Invalid lab" in err and "no .ipynb files" in err and "Traceback" not in err


def test_readme_quick_start_names_what_make_install_needs():
    """The Makefile builds .venv with `$(PYTHON) -m venv` (PYTHON = python3): the README names venv, which Debian's
    python3 lacks without python3-venv (`make install` then stopped at `ensurepip is not available`)."""
    makefile, readme = read("Makefile"), flat(read("README.md"))
    python = re.search(r"^PYTHON \?= (\S+)$", makefile, re.M).group(1)
    venv = re.search(r"^VENV \?= (\S+)$", makefile, re.M).group(1)
    assert "$(PYTHON) -m venv --clear $(VENV)" in makefile
    assert f"the Makefile runs `{python} -m venv --clear {venv}`" in readme and "`python3-venv`" in readme


def test_labs_readme_week_table_names_the_notebooks():
    """The pairing table's notebook names (`01_zeroth_order_gradients`, …) are the notebooks in notebooks/."""
    table = read(LABS_README).split("| week | notebooks | then |", 1)[1].split("\n\n", 1)[0]
    named = re.findall(r"`(\d\d_\w+)`", table)
    assert sorted(named) == sorted(path.stem for path in (ROOT / "notebooks").glob("[0-9][0-9]_*.ipynb"))


# -- docs/course.md: the race's axis ---------------------------------------------------------------------
def test_course_md_race_axis_top():
    """`the race's axis ends at 3× the starting gap`: widgets.race's _TOP."""
    from sazo_lite.course.widgets import race

    assert float(stated("docs/course.md", r"the race's axis ends at (\d+)× the starting gap")) == race._TOP


# -- docs/benchmarks.md: the README's former rows --------------------------------------------------------
WORDS = {word: k for k, word in enumerate(("zero one two three four five six seven eight nine ten eleven twelve "
                                           "thirteen fourteen fifteen sixteen seventeen eighteen nineteen twenty").split())}


def table_rows(text: str) -> int:
    """Data rows of the first markdown table in ``text`` (not its header or its |---| line)."""
    table = re.search(r"(?:^\|.*\n?)+", text, re.M).group(0).splitlines()
    return len(table) - 2


def test_former_headline_rows_are_counted_right():
    """benchmarks.md said the README's table `had the seventeen rows below`: the table below holds 18 (so did the
    README before e6a9e12); `it now keeps eight`: the README's table."""
    text = read("docs/benchmarks.md")
    had, keeps = re.search(r"headline table had the (\w+) rows below; it now keeps (\w+),", flat(text)).groups()
    section = text.split("## The README's former headline rows", 1)[1]
    assert WORDS[had] == table_rows(section)
    readme = read("README.md").split("## Measured results (headline)", 1)[1]
    assert WORDS[keeps] == table_rows(readme)


def test_labs_readme_quoted_messages_are_the_graders():
    """The grader's words the page quotes (statuses' reasons, log lines) are in the labs package's source."""
    from sazo_lite.course import labs

    source = "\n".join(path.read_text() for path in Path(labs.__file__).parent.glob("*.py"))
    text = flat(read(LABS_README))
    for message in ("not an nbformat-4 notebook", "clear its outputs", "too large to grade",
                    "the solutions fail their own tests", "[grader] skipped", "[output] [grader]", "SandboxWarning",
                    "not enforced"):
        assert message in text and message in source, message
    assert re.search(r"\[grader\] cell \{index\} raised: ", source) and "`[grader] cell N raised: ...`" in text

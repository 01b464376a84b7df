"""Graded labs: otter assign strips solutions and hidden tests; sandboxed grading is right, cannot be
cheated by the usual tricks and never hangs.

Builds every master into a temporary folder, then grades each lab's own solutions and untouched
student notebook, and for lab 1 cheating submissions (patch otter, read the masters, shadow abs,
a detached process rewriting score.json) and hanging ones (loops that catch the interrupt).
"""
from __future__ import annotations

import csv
import json
import os
import re
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import nbformat
import pytest

pytest.importorskip("otter")

from sazo_lite.course import labs  # noqa: E402
from sazo_lite.course.labs import grading  # noqa: E402

MASTERS = labs.find_masters()


def _code(nb) -> list[str]:
    return [c.source for c in nb.cells if c.cell_type == "code"]


def _solution_lines(master) -> set[str]:
    """Lines that only the master may contain: inside BEGIN/END SOLUTION, or ending in # SOLUTION."""
    lines, inside = set(), False
    for source in _code(master):
        for line in source.splitlines():
            text = line.strip()
            if text.startswith("# BEGIN SOLUTION") or text.startswith("# END SOLUTION"):
                inside = text.startswith("# BEGIN")
            elif (inside or text.endswith("# SOLUTION")) and len(text) > 12:
                lines.add(text.removesuffix("# SOLUTION").strip())
    return lines


def _tests(master) -> tuple[list[str], list[str]]:
    """(hidden, public) test cells of a master: code cells between # BEGIN TESTS and # END TESTS."""
    hidden, public, inside = [], [], False
    for cell in master.cells:
        if cell.cell_type == "raw" and cell.source.startswith(("# BEGIN TESTS", "# END TESTS")):
            inside = cell.source.startswith("# BEGIN")
        elif inside and cell.cell_type == "code":
            (hidden if cell.source.startswith("# HIDDEN") else public).append(cell.source)
    return hidden, public


@pytest.fixture(scope="module")
def built(assigned_labs):
    """Every master assigned (once per run, shared with the book test: conftest): {stem: folder}."""
    return {master.stem: assigned_labs / master.stem for master in labs.find_masters()}


def _lab1_variant(autograder_nb: Path, path: Path, replace: dict[str, str], extra_cells: list[str] = ()) -> None:
    """Lab 1's solutions with cells replaced (by the start of their source) and cells appended."""
    nb = nbformat.read(autograder_nb, as_version=4)
    for cell in nb.cells:
        for start, source in replace.items():
            if cell.cell_type == "code" and cell.source.lstrip().startswith(start):
                cell.source = source
    nb.cells += [nbformat.v4.new_code_cell(source) for source in extra_cells]
    nbformat.write(nb, path)


def _with_cells(student_nb: Path, path: Path, cells: list[str]) -> None:
    """The untouched student notebook with cells appended (a submission that does no work)."""
    nb = nbformat.read(student_nb, as_version=4)
    nb.cells += [nbformat.v4.new_code_cell(source) for source in cells]
    nbformat.write(nb, path)


# -- cheats (each fakes work it did not do) and hangs, as submissions ------------------------
PATCH_OTTER = '''
import otter, otter.test_files.abstract_test as _abstract
for _cls in vars(_abstract).values():
    if isinstance(_cls, type) and hasattr(_cls, "run"):
        _cls.run = lambda self, *a, **k: None
otter.Notebook.check = lambda self, *a, **k: None
otter.Notebook.check_all = lambda self, *a, **k: None
'''
READ_MASTERS = '''
import glob, json, os, pathlib
import sazo_lite.course.labs
_found = []
_places = [str(sazo_lite.course.labs.LABS_DIR), {labs_dir!r}, {build_dir!r}, "/tmp"]
for _cmd in glob.glob("/proc/*/cmdline"):     # the autograder zip named on a command line
    try:
        _places += [os.path.dirname(a) for a in open(_cmd, "rb").read().decode().split("\\0") if a.endswith((".zip", ".ipynb"))]
    except OSError:
        pass
for _place in _places:
    for _path in glob.glob(os.path.join(_place, "**", "lab1*.ipynb"), recursive=True):
        try:
            _cells = json.load(open(_path))["cells"]
        except Exception:
            continue
        _found.append(_path)
        for _cell in _cells:
            if _cell["cell_type"] == "code":
                try:
                    exec("".join(_cell["source"]))
                except Exception:
                    pass
print("CHEAT read:", _found or "nothing")
'''
SHADOW_ABS = '''
import builtins
def lab1_projected_grad(f, theta, z, eps):
    return 2.0               # right for the public test only
abs = lambda x: 0.0          # every hidden `abs(_g - expected) < tol` would pass
builtins.abs = abs
'''
DETACHED = '''
import subprocess, sys
subprocess.Popen([sys.executable, "-c", "import time, pathlib\\n"
                  "for _ in range(300):\\n"
                  "    for p in {targets!r}:\\n"
                  "        try:\\n"
                  "            pathlib.Path(p).write_text('{{\\"total\\": 12}}')\\n"
                  "        except OSError:\\n"
                  "            pass\\n"
                  "    time.sleep(0.1)\\n"
                  "# sazo-cheat-marker"], start_new_session=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
'''
EXCEPT_EXCEPTION_LOOP = '''def lab1_zo_gradient(f, theta, eps, num_directions, generator):
    while True:
        try:
            pass
        except Exception:
            continue'''
BARE_EXCEPT_LOOP = '''import time
while True:
    try:
        while True:
            time.sleep(0.01)   # idles rather than spins: the kill, not the CPU, is under test (q2 spins)
    except:      # swallows the cell's LabTimeout: only a kill ends this
        pass
lab1_best_eps = 1e-3'''
HANG_CELL, HANG_TEST = 8, 2   # seconds: short limits for the hang submission

# -- per lab: a guess (constants and the values the notebook prints, no work) and library delegations --
GUESSES = {
    "lab1": """
def lab1_projected_grad(f, theta, z, eps):
    return 2.0
def lab1_zo_gradient(f, theta, eps, num_directions, generator):
    return torch.zeros_like(theta)
def lab1_fd_error(f, grad, theta, eps, directions):
    return 0.05
def lab1_estimator_variance(f, grad, theta, eps, directions):
    return 10.0
lab1_errors, lab1_variances = [0.05] * len(lab1_eps_grid), [10.0] * len(lab1_eps_grid)
def lab1_best_eps_for(f, grad, theta, directions, eps_grid):
    return 1e-3
lab1_best_eps = 1e-3
""",
    "lab2": """
def lab2_weights(probs, indices):
    return torch.ones(len(indices), dtype=torch.float64)
def lab2_is_estimate(values, probs, batch_size, generator):
    return 1.0
lab2_average_estimate = float(lab2_values.mean())
def lab2_sampling_variance(norms, probs):
    return 1.0
def lab2_oracle_probs(norms):
    return torch.full((len(norms),), 1.0 / len(norms), dtype=torch.float64)
def lab2_uniform_gain(norms):
    return 1.25
lab2_norms = torch.ones(256, dtype=torch.float64)
lab2_gain = lab2_one_plus_cv2 = 4.0
""",
    "lab3": """
def lab3_plain_probs(estimates, uniform_mix):
    return torch.tensor([0.37, 0.21, 0.05, 0.37], dtype=torch.float64)
def lab3_plain_update(estimates, indices, diffs, ema_decay):
    return torch.tensor([1.75, 1.0, 5.0], dtype=torch.float64)
def lab3_prior(estimates, counts, statistic="abs"):
    return 1.5811388300841898
def lab3_probs(estimates, counts, uniform_mix, statistic="abs"):
    return torch.full((len(estimates),), 1.0 / len(estimates), dtype=torch.float64)
def lab3_level(level, steps, stats, weights, level_decay):
    return 2.0, 1
def lab3_blend(estimates, counts, indices, stats, level, ema_decay, prior_strength, statistic="abs"):
    return torch.tensor([0.0, 2.0, 0.0], dtype=torch.float64), torch.tensor([0, 1, 0])
def lab3_track(problem, theta, steps, generator, seed):
    return 0.367584762, 0.142305178
lab3_tv_start, lab3_tv_end = 0.367584762, 0.142305178
class Lab3PlainSampler(sazo_lite.Sampler):
    def __init__(self, num_examples, **settings):
        super().__init__(num_examples, seed=0)
        self.estimates = torch.tensor([1.75, 1.0, 5.0], dtype=torch.float64)
    probs = property(lambda self: torch.tensor([0.29017153139, 0.21934905989, 0.49047940872], dtype=torch.float64))
    def _observe(self, indices, diffs, losses=None):
        pass
class Lab3Sampler(sazo_lite.Sampler):
    level, level_steps = 2.0883186768, 2
    def __init__(self, num_examples, **settings):
        super().__init__(num_examples, seed=0)
    probs = property(lambda self: torch.tensor([0.15583708999, 0.17609417118, 0.31459272498, 0.35347601385], dtype=torch.float64))
    def _observe(self, indices, diffs, losses=None):
        pass
""",
    "lab4": """
def lab4_queries_to_target(problem, make_sampler, lr, steps, batch_size, target_fraction, seed):
    return 40
lab4_runs = {(n, lr, s): 40 for n in ("uniform", "sazo", "oracle") for lr in lab4_lrs for s in range(lab4_num_seeds)}
lab4_best = {"uniform": 40, "sazo": 40, "oracle": 40}
lab4_speedup_sazo = lab4_speedup_oracle = 1.0
def lab4_lm_losses(model, tokens):
    return torch.full((len(tokens),), 2.83)
lab4_lm_initial_loss, lab4_lm_target = 2.83, 0.95 * 2.83
lab4_lm_final, lab4_lm_queries = {"uniform": 2.5, "sazo": 2.5}, {"uniform": None, "sazo": None}
""",
}
# lab -> [(file stem, the question it delegates, {start of the answer cell: its delegating version})]
DELEGATIONS = {
    "lab1": [("delegate_two_point", "q2", {"def lab1_zo_gradient": """def lab1_zo_gradient(f, theta, eps, num_directions, generator):
    seed = int(torch.randint(2 ** 31, (1,), generator=generator))
    return sazo_lite.course.two_point.zo_gradient(f, theta, eps, num_directions, seed=seed)"""})],
    "lab2": [("delegate_variance", "q3", {"def lab2_sampling_variance": """import sazo_lite.variance
def lab2_sampling_variance(norms, probs):
    return sazo_lite.variance.sampling_variance(norms, probs)

def lab2_oracle_probs(norms):
    return sazo_lite.variance.oracle_probs(norms)"""}),
             ("delegate_importlib", "q3", {"def lab2_sampling_variance": """import importlib
def lab2_sampling_variance(norms, probs):
    return importlib.import_module("sazo_lite." + "variance").sampling_variance(norms, probs)

def lab2_oracle_probs(norms):
    return getattr(sazo_lite, "vari" + "ance").oracle_probs(norms)"""})],
    "lab3": [("delegate_proxy", "q5", {"class Lab3Sampler(sazo_lite.Sampler):": """class Lab3Sampler(sazo_lite.Sampler):
    def __init__(self, num_examples, *, seed=0, **settings):
        super().__init__(num_examples, seed=seed)
        self._lib = getattr(sazo_lite, "SAZO" + "Sampler")(num_examples, seed=seed, **settings)
    probs = property(lambda self: self._lib.probs)
    def _observe(self, indices, diffs, losses=None):
        self._lib.update(indices, diffs)"""}),
             ("delegate_probabilities", "q1", {"def lab3_plain_probs(": None})],   # filled below
    # a working delegation (the library's per-example causal-LM loss gives the solution's values to 5e-7 on the
    # hidden case's model and tokens, 2026-12-03): only the guard's call check can score it 0
    "lab4": [("delegate_losses", "q3", {"def lab4_lm_losses(": """def lab4_lm_losses(model, tokens):
    logits = model(input_ids=tokens, attention_mask=torch.ones_like(tokens)).logits
    return sazo_lite.llm.losses.causal_lm_losses(logits, tokens)"""})],
}
# Lab 3 Q1 through samplers.probabilities (numpy), the rest of the answer cell kept
LAB3_PROBABILITIES = """def lab3_plain_probs(estimates, uniform_mix):
    from sazo_lite import samplers
    roots = estimates.double().clamp_min(0).sqrt().numpy()
    return torch.as_tensor(samplers.probabilities(roots, float(roots.sum()), uniform_mix, len(roots)), dtype=torch.float64)


def lab3_plain_update("""
# hostile submissions (lab 1's solutions plus one trick each): graded, never crashing the grader
HOSTILE = {
    "malformed_reports": ({}, [r"""
import json as _json, os as _os, sys as _sys
_fd = int(_sys.argv[1])
for _line in ['{"unit": ["case"], "phase": "end"}', "[" * 100000, '{"unit": ["case", "q1", 0], "phase": "end", "records": [{"value": {"t": "array", "dtype": "x", "shape": [3], "v": [1]}}]}',
              '{"rule": "x"}', "x" * (9 * 2 ** 20), '{"done": true}']:
    _os.write(_fd, (_line + "\n").encode())
_real = lab1_best_eps_for
def lab1_best_eps_for(*args):
    _os.write(_fd, (("[" * 50000) + "\n").encode())     # during q4's cases: those fail, the rest stands
    return _real(*args)
"""]),
    "huge_value": ({}, ["""
def lab1_estimator_variance(f, grad, theta, eps, directions):   # an answer of 4 million numbers
    return torch.zeros(2000, 2000, dtype=torch.float64)
"""]),
    "exits": ({}, ["import os\nos._exit(3)"]),
    "deep_cell": ({}, ["x" + "[0]" * 100000]),   # past the parser's limits (RecursionError): that cell fails, the rest stands
}


@pytest.fixture(scope="module")
def graded(built, tmp_path_factory):
    """Each lab's solutions and untouched notebook graded; lab 1 also its cheats and hangs.

    Returns {stem: (rows by file, csv path, seconds)}; lab 1's cheats/hangs are graded one by one
    (their own output folders) and added to lab 1's rows.
    """
    root = tmp_path_factory.mktemp("labs_grades")
    lab1 = next(stem for stem in built if stem.startswith("lab1"))
    out1 = built[lab1]
    solution_nb, student_nb = out1 / "autograder" / f"{lab1}.ipynb", out1 / "student" / f"{lab1}.ipynb"
    cheats = root / "cheats"
    cheats.mkdir()
    _with_cells(student_nb, cheats / "patch_otter.ipynb", [PATCH_OTTER])
    _with_cells(student_nb, cheats / "read_masters.ipynb",
                [READ_MASTERS.format(labs_dir=str(labs.LABS_DIR), build_dir=str(out1.parent))])
    _with_cells(student_nb, cheats / "shadow_abs.ipynb", [SHADOW_ABS])
    targets = [str(root / "cheat_out" / name / "score.json") for name in ("detached", "patch_otter")]
    _with_cells(student_nb, cheats / "detached.ipynb", [DETACHED.format(targets=targets)])
    hangs = root / "hangs"
    hangs.mkdir()
    _lab1_variant(solution_nb, hangs / "hangs.ipynb", {"def lab1_zo_gradient": EXCEPT_EXCEPTION_LOOP,
                                                         "def lab1_best_eps_for": BARE_EXCEPT_LOOP})
    jobs = {}
    for stem, out in built.items():
        folder = root / "submissions" / stem
        folder.mkdir(parents=True)
        short = stem.split("_")[0]
        solution, student = out / "autograder" / f"{stem}.ipynb", out / "student" / f"{stem}.ipynb"
        (folder / "solution.ipynb").write_bytes(solution.read_bytes())
        (folder / "untouched.ipynb").write_bytes(student.read_bytes())
        _with_cells(student, folder / "guess.ipynb", [GUESSES[short]])
        for name, _, replace in DELEGATIONS[short]:
            if name == "delegate_probabilities":
                source = next(c.source for c in nbformat.read(solution, as_version=4).cells
                              if c.cell_type == "code" and c.source.startswith("def lab3_plain_probs("))
                replace = {"def lab3_plain_probs(": LAB3_PROBABILITIES + source.split("def lab3_plain_update(", 1)[1]}
            _lab1_variant(solution, folder / f"{name}.ipynb", replace)
        if short == "lab1":
            for name, (replace, extra) in HOSTILE.items():
                _lab1_variant(solution, folder / f"{name}.ipynb", replace, extra)
        jobs[stem] = folder

    def grade_folder(stem):
        start = time.monotonic()
        csv_path = root / f"{stem}.csv"
        rows = labs.grade_all(labs.autograder_zip(stem, build_dir=built[stem].parent), jobs[stem], csv_path, workers=1)
        return stem, ({r["submission"]: r for r in rows}, csv_path, time.monotonic() - start)

    zip1 = labs.autograder_zip(lab1, build_dir=out1.parent)

    def grade_one(path, **limits):
        start = time.monotonic()
        row = labs.grade(path, zip1, root / "cheat_out" / path.stem, **limits)
        return path.name, {**row, "seconds": time.monotonic() - start}

    temp_before = _grader_temp_files()
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("SAZO_FAST", "1")  # the graders inherit it
        # lab 1's reference once (cached), before the graders that share it start at the same time
        grading.reference(zip1, cell_timeout=labs.CELL_TIMEOUT, test_timeout=labs.TEST_TIMEOUT,
                          notebook_timeout=labs.NOTEBOOK_TIMEOUT)
        with ThreadPoolExecutor(max_workers=2) as pool:  # one queue: the hangs (longest) first, then the labs, the cheats
            hang = pool.submit(grade_one, hangs / "hangs.ipynb", cell_timeout=HANG_CELL, test_timeout=HANG_TEST,
                               notebook_timeout=300)
            folders = [pool.submit(grade_folder, stem) for stem in jobs]
            singles = [pool.submit(grade_one, path) for path in sorted(cheats.glob("*.ipynb"))]
            results = dict(job.result() for job in folders)
            rows = results[lab1][0]
            rows.update(job.result() for job in [hang, *singles])
    time.sleep(2)  # a detached writer that survived would have rewritten its target by now
    rows["_temp_left"] = _grader_temp_files() - temp_before
    rows["_root"] = root
    return results


def _grader_temp_files() -> set[str]:
    """Entries in the temp folder that grading could leave (otter's unpacked autograder, scratch)."""
    return {name for name in os.listdir(tempfile.gettempdir()) if "otter" in name or name.startswith("sazo-grade")}


def test_masters_exist_and_are_committed_without_outputs():
    assert [m.stem.split("_")[0] for m in MASTERS] == ["lab1", "lab2", "lab3", "lab4"]
    for master in MASTERS:
        nb = nbformat.read(master, as_version=4)
        for cell in nb.cells:
            if cell.cell_type == "code":
                assert not cell.outputs and cell.execution_count is None, f"{master.name} has outputs"


@pytest.mark.parametrize("master", MASTERS, ids=lambda m: m.stem)
def test_masters_have_points_seed_and_question_specific_names(master):
    nb = nbformat.read(master, as_version=4)
    raw = "\n".join(c.source for c in nb.cells if c.cell_type == "raw")
    assert re.search(r"seed:\s*\n\s*variable: lab_seed", raw), "seeds go through otter's seed mechanism"
    assert len(re.findall(r"points: \[", raw)) == raw.count("# BEGIN QUESTION") >= 3
    number = master.stem.split("_")[0].removeprefix("lab")
    answer_cells = [s for s in _code(nb) if "SOLUTION" in s]
    names = {m for s in answer_cells for m in re.findall(r"^(?:def |class )?(\w+)\s*[(,=:]", s, re.M)} - {"print"}
    generic = {n for n in names if not re.match(rf"(lab{number}_|Lab{number}|_)", n)}
    assert len(names) >= 4 and not generic, f"graded names must carry the lab's prefix: {generic}"


@pytest.mark.parametrize("master", MASTERS, ids=lambda m: m.stem)
def test_student_notebooks_have_no_solutions_and_no_hidden_tests(master, built):
    stem = master.stem
    student_path = built[stem] / "student" / f"{stem}.ipynb"
    text = student_path.read_text()
    student = nbformat.read(student_path, as_version=4)
    code = "\n".join(_code(student))
    leaked = [line for line in _solution_lines(nbformat.read(master, as_version=4)) if line in code]
    assert not leaked, f"solution lines in the student notebook: {leaked[:3]}"
    assert "BEGIN SOLUTION" not in text and "# HIDDEN" not in text
    hidden, public = _tests(nbformat.read(master, as_version=4))
    assert hidden, "every lab has hidden tests"
    public_lines = {line.strip() for test in public for line in test.splitlines()}
    for test in hidden:
        body = [line.strip() for line in test.splitlines()[1:] if len(line.strip()) > 15]
        leaked = [line for line in body if line in code and line not in public_lines]
        assert not leaked, f"a hidden test's code reached students: {leaked[:2]}"
    cases = [case for q in student.metadata["otter"]["tests"].values() for suite in q["suites"] for case in suite["cases"]]
    assert len(cases) == len(public) and not any(case["hidden"] for case in cases), "students get the public tests only"
    assert not list((built[stem] / "student").glob("*.zip")), "no autograder in the student folder"


@pytest.mark.parametrize("master", MASTERS, ids=lambda m: m.stem)
def test_master_solutions_score_full_marks(master, graded):
    rows, _, _ = graded[master.stem]
    row = rows["solution.ipynb"]
    assert row["status"] == "ok"
    failing = {q: v for q, v in row["questions"].items() if v["score"] != v["possible"]}
    assert row["possible"] > 0 and not failing, f"solutions lost points: {failing}"


@pytest.mark.parametrize("master", MASTERS, ids=lambda m: m.stem)
def test_untouched_student_notebook_scores_zero(master, graded):
    rows, _, _ = graded[master.stem]
    row = rows["untouched.ipynb"]
    assert row["status"] == "ok", "graded without crashing (errors in cells are allowed)"
    assert row["possible"] > 0 and row["total"] == 0, row["questions"]
    assert len(row["questions"]) >= 3


def _lab1_rows(graded):
    stem = next(m.stem for m in MASTERS if m.stem.startswith("lab1"))
    return graded[stem][0]


def _scores(row):
    return {q: (v["score"], v["possible"]) for q, v in row["questions"].items()}


@pytest.mark.parametrize("name", ["patch_otter.ipynb", "read_masters.ipynb", "detached.ipynb"])
def test_cheats_that_do_no_work_score_zero(graded, name):
    row = _lab1_rows(graded)[name]
    assert row["status"] == "ok" and row["possible"] > 0
    assert row["total"] == 0, f"{name} gained points: {_scores(row)}"


def test_reading_the_masters_finds_nothing_in_the_sandbox(graded):
    rows = _lab1_rows(graded)
    if rows["read_masters.ipynb"]["sandbox"] != "bwrap":
        pytest.skip("no sandbox here: bwrap missing or namespaces not allowed")
    log = (rows["_root"] / "cheat_out" / "read_masters" / "grade.log").read_text()
    assert "CHEAT read: nothing" in log, log[-2000:]


def test_shadowing_abs_gains_nothing_on_the_hidden_tests(graded):
    row = _lab1_rows(graded)["shadow_abs.ipynb"]
    score, possible = _scores(row)["q1"]
    assert score == 0 and possible == 3, "a constant 2.0 answers one public input, not both"
    details = json.loads((_lab1_rows(graded)["_root"] / "cheat_out" / "shadow_abs" / "results.json").read_text())
    assert not any(c["passed"] for c in details["questions"]["q1"]["cases"] if c["hidden"])


def test_a_detached_process_cannot_rewrite_scores_and_does_not_survive(graded):
    rows = _lab1_rows(graded)
    root = rows["_root"] / "cheat_out"
    for name in ("detached", "patch_otter"):
        score = json.loads((root / name / "score.json").read_text())
        assert score["total"] == 0 and "questions" in score, f"{name}/score.json was rewritten: {score}"
    marker = b"sazo-cheat-marker"
    alive = []
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                if marker in open(f"/proc/{entry}/cmdline", "rb").read():
                    alive.append(entry)
            except OSError:
                pass
    assert not alive, f"the submission's detached process is still running: {alive}"


def test_hangs_get_their_honest_points_within_the_timeouts(graded):
    row = _lab1_rows(graded)["hangs.ipynb"]
    scores = _scores(row)
    assert scores["q2"][0] == 0, "the `except Exception` loop cannot catch LabTimeout: q2's tests fail"
    assert scores["q4"][0] == 0, "the bare `except:` cell was killed: q4 scores 0"
    assert scores["q1"][0] == scores["q1"][1] and scores["q3"][0] == scores["q3"][1], "the rest graded in a fresh sandbox"
    assert row["status"] == "timeout"
    # the q4 cell: its own limit plus grace, then one restart; q2's three cases each hit test_timeout twice
    assert row["seconds"] < 200
    details = json.loads((_lab1_rows(graded)["_root"] / "cheat_out" / "hangs" / "results.json").read_text())
    assert details["killed"] and all(unit[0] == "cell" for unit in details["killed"])


@pytest.mark.parametrize("require", ["auto", "none"])
def test_a_case_that_swallows_its_timeout_is_killed_and_the_rest_still_graded(require):
    """In the sandbox and unconfined (the fallback without bwrap) alike."""

    cells = [(0, "def spin():\n    while True:\n        try:\n            while True:\n                pass\n"
                 "        except:\n            pass\n"), (1, "x = 3")]
    questions = {"q1": {"points": [1.0, 1.0], "cases": [
        {"hidden": False, "code": "with time_limit():\n    spin()\nrecord(1)"},
        {"hidden": True, "code": "record(x)"}]}}
    start = time.monotonic()
    outcome = grading.run(cells, questions, cell_timeout=5, test_timeout=1, notebook_timeout=120, require=require)
    from sazo_lite.course.labs.sandbox import bwrap_works

    assert outcome["sandbox"] == ("bwrap" if require == "auto" and bwrap_works() else "none")
    assert time.monotonic() - start < 60
    assert outcome["skipped"] == [["case", "q1", 0]] and outcome["status"] == "timeout"
    assert ("q1", 0) not in outcome["cases"] and outcome["cases"][("q1", 1)]["error"] is None
    scored = grading.score(questions, outcome, {("q1", 1): outcome["cases"][("q1", 1)]})["q1"]
    assert scored["score"] == 1.0 and "timed out" in scored["cases"][0]["message"]


def test_without_bwrap_grading_warns_loudly(monkeypatch):
    import subprocess

    from sazo_lite.course.labs import sandbox

    monkeypatch.setitem(sandbox._WORKS, "bwrap", False)
    with pytest.warns(sandbox.SandboxWarning, match="WITHOUT A SANDBOX"):
        box = sandbox.Sandbox(["/bin/true"], env={"PATH": "/usr/bin:/bin"})
    assert box.kind == "none"
    box.start(stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL)
    box.close()
    with pytest.raises(RuntimeError, match="bubblewrap"):
        sandbox.Sandbox(["/bin/true"], env={}, require="bwrap")


def test_grading_leaves_no_temporary_files(graded):
    assert not _lab1_rows(graded)["_temp_left"]


def test_grade_all_writes_one_csv_row_per_submission(graded):
    stem = next(m.stem for m in MASTERS if m.stem.startswith("lab2"))
    rows, csv_path, _ = graded[stem]
    with open(csv_path) as handle:
        table = list(csv.DictReader(handle))
    handed_in = sorted(p.name for p in (csv_path.parent / "submissions" / stem).glob("*.ipynb"))
    assert sorted(r["submission"] for r in table) == handed_in and len(handed_in) >= 4
    by_name = {r["submission"]: r for r in table}
    assert float(by_name["solution.ipynb"]["total"]) == float(by_name["solution.ipynb"]["possible"]) > 0
    assert float(by_name["untouched.ipynb"]["total"]) == 0
    score = json.loads((csv_path.parent / csv_path.stem / "solution" / "score.json").read_text())
    assert score["total"] == rows["solution.ipynb"]["total"]
    assert (csv_path.parent / csv_path.stem / "solution" / "results.json").exists()


def test_the_sandbox_is_used_where_it_works(graded):
    from sazo_lite.course.labs.sandbox import bwrap_works

    kinds = {row["sandbox"] for rows, _, _ in graded.values() for key, row in rows.items() if not key.startswith("_")}
    assert kinds == ({"bwrap"} if bwrap_works() else {"none"})


def test_a_notebook_past_its_timeout_scores_zero(built, graded, tmp_path):
    stem = next(m.stem for m in MASTERS if m.stem.startswith("lab2"))
    # The solutions behind a slow first cell: past a 2 s budget however fast the machine is.
    slow = nbformat.read(built[stem] / "autograder" / f"{stem}.ipynb", as_version=4)
    slow.cells.insert(0, nbformat.v4.new_code_cell("import time\ntime.sleep(60)"))
    nbformat.write(slow, tmp_path / "slow.ipynb")
    start = time.monotonic()
    row = labs.grade(tmp_path / "slow.ipynb", labs.autograder_zip(stem, build_dir=built[stem].parent),
                     tmp_path / "out", notebook_timeout=2)
    assert time.monotonic() - start < 30
    assert row["status"] == "timeout" and row["total"] == 0 and row["possible"] > 0
    assert json.loads((tmp_path / "out" / "score.json").read_text())["status"] == "timeout"


@pytest.mark.parametrize("master", MASTERS, ids=lambda m: m.stem)
def test_a_guess_without_work_scores_zero(master, graded):
    row = graded[master.stem][0]["guess.ipynb"]
    assert row["status"] == "ok" and row["possible"] > 0
    assert row["total"] == 0, f"constants and the notebook's printed values gained points: {_scores(row)}"


DELEGATION_CASES = [(lab, name, q) for lab, items in DELEGATIONS.items() for name, q, _ in items]


@pytest.mark.parametrize("lab,name,question", DELEGATION_CASES, ids=lambda x: str(x))
def test_library_delegations_score_zero_with_the_rule_as_reason(lab, name, question, graded):
    stem = next(m.stem for m in MASTERS if m.stem.startswith(lab))
    rows, csv_path, _ = graded[stem]
    row = rows[f"{name}.ipynb"]
    assert row["status"] == "ok" and row["questions"][question]["score"] == 0, _scores(row)
    details = json.loads((csv_path.parent / csv_path.stem / name / "results.json").read_text())["questions"]
    assert details[question].get("rule"), f"no rule finding for {question}: {details[question]}"
    assert any("sazo_lite" in reason for reason in details[question]["rule"])
    order = list(row["questions"])
    for q in order[:order.index(question)]:
        assert row["questions"][q]["score"] == row["questions"][q]["possible"], f"{q} lost points: {_scores(row)}"


def test_hostile_submissions_are_graded_and_every_one_gets_its_row(graded):
    stem = next(m.stem for m in MASTERS if m.stem.startswith("lab1"))
    rows, csv_path, _ = graded[stem]
    with open(csv_path) as handle:
        table = {r["submission"]: r for r in csv.DictReader(handle)}
    assert {f"{name}.ipynb" for name in HOSTILE} <= set(table) and "solution.ipynb" in table and "reason" in \
        next(iter(table.values()))
    for name in HOSTILE:
        assert (csv_path.parent / csv_path.stem / name / "score.json").exists()
    malformed = _scores(rows["malformed_reports.ipynb"])
    assert malformed["q4"][0] == 0 and all(malformed[q][0] == malformed[q][1] for q in ("q1", "q2", "q3")), malformed
    details = json.loads((csv_path.parent / csv_path.stem / "malformed_reports" / "results.json").read_text())
    assert all("malformed" in c["message"] for c in details["questions"]["q4"]["cases"])
    huge = _scores(rows["huge_value.ipynb"])
    assert huge["q3"][0] < huge["q3"][1] and all(huge[q][0] == huge[q][1] for q in ("q1", "q2", "q4")), huge
    details = json.loads((csv_path.parent / csv_path.stem / "huge_value" / "results.json").read_text())
    assert any("too large" in (c["message"] or "") for c in details["questions"]["q3"]["cases"]), details["questions"]["q3"]
    deep = _scores(rows["deep_cell.ipynb"])
    assert all(deep[q][0] == deep[q][1] for q in ("q1", "q2", "q3", "q4")), deep
    exits = rows["exits.ipynb"]
    assert exits["total"] == exits["possible"] and exits["status"] == "timeout", "graded again without the cell that exits"


@pytest.mark.parametrize("master", MASTERS, ids=lambda m: m.stem)
def test_student_notebook_states_the_rule_and_cites_nothing_students_lack(master, built):
    from sazo_lite.course.labs.rules import rule_for

    text = (built[master.stem] / "student" / f"{master.stem}.ipynb").read_text()
    rule = rule_for(master.stem)
    assert rule is not None and "the library is not the answer" in text
    for name in rule["names"]:
        assert f"`{name}`" in text, f"the rule at the top does not list {name}"
    assert "design notes" not in text and "design page" not in text


@pytest.mark.parametrize("master", MASTERS, ids=lambda m: m.stem)
def test_every_public_case_checks_values_on_two_inputs(master):
    """A constant cannot pass a public case: each calls student code at least twice (or compares it with a
    value recomputed in the test) and says in its messages what was expected."""
    _, public = _tests(nbformat.read(master, as_version=4))
    for test in public:
        assert "expected" in test, f"a public case without an expected value in its message:\n{test[:300]}"
        assert test.count("record(") >= 2, f"a public case recording one value only:\n{test[:300]}"


@pytest.mark.parametrize("master", MASTERS, ids=lambda m: m.stem)
def test_widgets_only_in_ungraded_cells_and_they_exist(master):
    """Widgets sit in cells the autograder skips (tag otter_ignore), so they are never run
    while grading; check here that what they import still exists."""
    import sazo_lite.course.widgets

    nb = nbformat.read(master, as_version=4)
    explore = [c for c in nb.cells if "otter_ignore" in c.metadata.get("tags", [])]
    assert explore, "each lab offers an ungraded exploration cell"
    for cell in nb.cells:
        uses_widgets = "sazo_lite.course.widgets" in cell.source or "ipywidgets" in cell.source
        assert not uses_widgets or cell in explore, "widgets only in ungraded cells"
    names = {n for c in explore for n in re.findall(r"from sazo_lite\.course\.widgets import (\w+)", c.source)}
    assert names and names <= set(sazo_lite.course.widgets.__all__)


def test_readme_lists_every_lab_with_its_points():
    readme = (labs.LABS_DIR / "README.md").read_text()
    for master in MASTERS:
        raw = "\n".join(c.source for c in nbformat.read(master, as_version=4).cells if c.cell_type == "raw")
        points = sum(int(p) for group in re.findall(r"points: \[([\d, ]+)\]", raw) for p in group.split(","))
        assert re.search(rf"`{master.stem}` \|[^\n]*\| {points} \|", readme), f"{master.stem}: {points} points"


def test_time_limit_interrupts_a_loop_that_catches_exception():
    start = time.monotonic()
    with pytest.raises(labs.LabTimeout):
        with labs.time_limit(0.2):
            while True:
                try:
                    time.sleep(0.01)
                except Exception:
                    continue
    assert time.monotonic() - start < 5
    assert not issubclass(labs.LabTimeout, Exception)


SANDBOX_PROBE = r"""
import os, socket, subprocess, sys, pathlib
labs_dir, out_dir = sys.argv[1], sys.argv[2]
print("labs visible:", os.path.exists(labs_dir))
try:
    pathlib.Path(out_dir, "escaped.txt").write_text("x"); print("wrote outside: yes")
except OSError:
    print("wrote outside: no")
pathlib.Path("/tmp/scratch.txt").write_text("ok"); print("scratch: ok")
try:
    socket.create_connection(("1.1.1.1", 53), timeout=2); print("network: yes")
except OSError:
    print("network: no")
subprocess.Popen(["sleep", "300"], start_new_session=True)
print("done", flush=True)
"""


def test_sandbox_hides_the_repo_blocks_writes_and_network_and_kills_everything(tmp_path):
    import subprocess
    import sys

    from sazo_lite.course.labs.sandbox import Sandbox, bwrap_works

    if not bwrap_works():
        pytest.skip("bwrap missing or namespaces not allowed here (the grader warns and runs unconfined)")
    box = Sandbox([sys.executable, "-c", SANDBOX_PROBE, str(labs.LABS_DIR), str(tmp_path)],
                  env={"PATH": "/usr/bin:/bin"}, require="bwrap")
    process = box.start(stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    output = process.stdout.read().decode()
    box.close()
    assert "labs visible: False" in output and "wrote outside: no" in output, output
    assert "scratch: ok" in output and "network: no" in output and "done" in output, output
    assert not (tmp_path / "escaped.txt").exists()
    assert box.leftover_processes() == [], "the detached sleep died with the sandbox"


def test_bad_arguments_raise_value_error(tmp_path):
    with pytest.raises(ValueError, match="lab"):
        labs.resolve_master("lab9")
    with pytest.raises(ValueError, match="submission"):
        labs.grade(tmp_path / "missing.ipynb", tmp_path / "x.zip", tmp_path)
    with pytest.raises(ValueError, match="submissions_dir"):
        labs.grade_all(tmp_path / "x.zip", tmp_path, tmp_path / "s.csv")


def test_grade_all_on_the_command_line_exits_0_and_writes_every_row(built, tmp_path):
    """[honest, not a notebook, exits at once]: every submission gets its row and its score file."""
    stem = next(m.stem for m in MASTERS if m.stem.startswith("lab2"))
    folder = tmp_path / "handins"
    folder.mkdir()
    (folder / "a_untouched.ipynb").write_bytes((built[stem] / "student" / f"{stem}.ipynb").read_bytes())
    (folder / "b_garbage.ipynb").write_bytes(b"\x00 not a notebook {")
    nb = nbformat.read(built[stem] / "student" / f"{stem}.ipynb", as_version=4)
    nb.cells.insert(0, nbformat.v4.new_code_cell("import os\nos._exit(1)"))
    nbformat.write(nb, folder / "c_exits.ipynb")
    out = tmp_path / "grades.csv"
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("SAZO_FAST", "1")
        code = labs.main(["grade-all", str(labs.autograder_zip(stem, build_dir=built[stem].parent)), str(folder),
                          "--out", str(out)])
    assert code == 0
    with open(out) as handle:
        table = {r["submission"]: r for r in csv.DictReader(handle)}
    assert set(table) == {"a_untouched.ipynb", "b_garbage.ipynb", "c_exits.ipynb"}
    assert table["b_garbage.ipynb"]["status"] == "failed" and "notebook" in table["b_garbage.ipynb"]["reason"]
    assert all(float(r["total"]) == 0 for r in table.values())
    for name in table:
        assert (tmp_path / "grades" / name.removesuffix(".ipynb") / "score.json").exists()

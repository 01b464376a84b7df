"""Issue 42's hostile round as real submissions: each attack is a student notebook (the lab's solutions
with one answer replaced, or cells added), graded the project's way (``grade_all``: sandbox, guard,
trusted scoring), with the score it must get: 0 on the attacked question, full marks elsewhere, or
refused with a reason. Labs 1-4 (lab 4 gets the same roads). Hand-ins that are not what they say
(symbolic links, hard links, names such as ``...ipynb``) and ``assign`` outside a clone too.
"""
from __future__ import annotations

import csv
import json
import os
import subprocess
import sys
from pathlib import Path

import nbformat
import pytest

pytest.importorskip("otter")

from sazo_lite.course import labs  # noqa: E402

# The library functions the attacks reach, as expressions a cell can evaluate
LIB = {"lab1": "sazo_lite.course.two_point.zo_gradient", "lab2_w": "sazo_lite.variance.importance_weights",
       "lab2_v": "sazo_lite.variance.sampling_variance", "lab2_o": "sazo_lite.variance.oracle_probs",
       "lab3": "sazo_lite.samplers.probabilities", "lab4": "sys.modules['sazo_lite.llm.losses'].causal_lm_losses"}

LAB1_Q2 = """def lab1_zo_gradient(f, theta, eps, num_directions, generator):
    seed = int(torch.randint(2 ** 31, (1,), generator=generator))
    return {call}"""
LAB2_Q1 = """def lab2_weights(probs, indices):
    probs = torch.as_tensor(probs, dtype=torch.float64)
    return {w}(probs, len(probs))[indices]"""
LAB2_Q3 = """def lab2_sampling_variance(norms, probs):
    return {v}(torch.as_tensor(norms, dtype=torch.float64), torch.as_tensor(probs, dtype=torch.float64))

def lab2_oracle_probs(norms):
    return {o}(torch.as_tensor(norms, dtype=torch.float64))"""
LAB3_Q1_PROBS = """def lab3_plain_probs(estimates, uniform_mix):
    roots = estimates.double().clamp_min(0).sqrt().numpy()
    return torch.as_tensor({p}(roots, float(roots.sum()), uniform_mix, len(roots)), dtype=torch.float64)


def lab3_plain_update("""
LAB4_Q3 = """import sys
def lab4_lm_losses(model, tokens):
    return {call}"""

# roads: (prelude cell source, how a call `F(args)` is written through the road)
THREAD = ("import concurrent.futures\n_pool = concurrent.futures.ThreadPoolExecutor(1)\n",
          lambda f, args: f"_pool.submit({f}, {args}).result()")
WRAPPED = ("import types\n_raw = lambda f: getattr(f, '__wrapped__', f)\n",   # issue 42 hole 1 (functools.wraps)
           lambda f, args: f"_lib_{abs(hash(f)) % 1000}.f({args})")
FORK = ("import os, pickle\n"
        "def _in_child(f, *args, **kwargs):\n"   # the library in a forked child, its answer back through a pipe
        "    r, w = os.pipe()\n    pid = os.fork()\n    if pid == 0:\n"
        "        try:\n            os.write(w, pickle.dumps(f(*args, **kwargs)))\n        finally:\n            os._exit(0)\n"
        "    os.close(w)\n    data = b''\n    while chunk := os.read(r, 1 << 16):\n        data += chunk\n"
        "    os.waitpid(pid, 0)\n    return pickle.loads(data)\n",
        lambda f, args: f"_in_child({f}, {args})")
REBUILT = ("import types\n_rebuilt = lambda f: types.FunctionType(f.__code__, f.__globals__, f.__name__, f.__defaults__)\n",
           lambda f, args: f"_rebuilt({f})({args})")
RELOAD = ("import importlib, sys\n", lambda f, args: f"getattr(importlib.reload(sys.modules['{f.rsplit('.', 1)[0]}']), "
                                                f"'{f.rsplit('.', 1)[1]}')({args})")


def _namespace_cells(*fns) -> str:
    return "".join(f"_lib_{abs(hash(f)) % 1000} = types.SimpleNamespace(f=_raw({f}))\n" for f in fns)


def _answers(lab: str, road) -> dict:
    prelude, call = road
    if lab == "lab1":
        return {"def lab1_zo_gradient": prelude + LAB1_Q2.format(
            call=call(LIB["lab1"], "f, theta, eps, num_directions, seed=seed"))}
    if lab == "lab2q1":
        return {"def lab2_weights": prelude + LAB2_Q1.format(w=call(LIB["lab2_w"], "probs, len(probs)")
                                                             .replace("(probs, len(probs), len(probs))", ""))}
    if lab == "lab2q3":
        v, o = call(LIB["lab2_v"], "{n}, {p}"), call(LIB["lab2_o"], "{n}")
        body = LAB2_Q3.replace("{v}(torch.as_tensor(norms, dtype=torch.float64), torch.as_tensor(probs, dtype=torch.float64))",
                               v.format(n="torch.as_tensor(norms, dtype=torch.float64)",
                                        p="torch.as_tensor(probs, dtype=torch.float64)"))
        body = body.replace("{o}(torch.as_tensor(norms, dtype=torch.float64))", o.format(n="torch.as_tensor(norms, dtype=torch.float64)"))
        return {"def lab2_sampling_variance": prelude + body}
    if lab == "lab3":
        return {"def lab3_plain_probs(": prelude + LAB3_Q1_PROBS.replace(
            "{p}(roots, float(roots.sum()), uniform_mix, len(roots))",
            call(LIB["lab3"], "roots, float(roots.sum()), uniform_mix, len(roots)"))}
    if lab == "lab4":
        return {"def lab4_lm_losses(": prelude + LAB4_Q3.format(   # the losses computed where the road leads
            call=call(f"(lambda: {LIB['lab4']}(model(input_ids=tokens, attention_mask=torch.ones_like(tokens)).logits, "
                      "tokens))", ""))}
    raise ValueError(lab)


def _lab2_q1_wrapped():
    prelude = WRAPPED[0] + _namespace_cells(LIB["lab2_w"])
    return {"def lab2_weights": prelude + LAB2_Q1.format(w=f"_lib_{abs(hash(LIB['lab2_w'])) % 1000}.f")}


def _wrapped(lab, fns, key, template, **fields):
    prelude = WRAPPED[0] + _namespace_cells(*fns)
    return {key: prelude + template.format(**{k: f"_lib_{abs(hash(v)) % 1000}.f" for k, v in fields.items()})}


# lab -> [(submission stem, {question expected 0}, {start of answer cell: its new source}, extra cells after a cell)]
ATTACKS = {
    "lab1": [("thread_pool", {"q2"}, _answers("lab1", THREAD)), ("forked_child", {"q2"}, _answers("lab1", FORK)),
             ("rebuilt_code", {"q2"}, _answers("lab1", REBUILT))],
    "lab2": [("wrapped_in_namespace_q1", {"q1", "q2"}, None), ("wrapped_in_namespace_q3", {"q3", "q4"}, None),
             ("thread_pool_q3", {"q3", "q4"}, _answers("lab2q3", THREAD)),
             ("forked_child_q3", {"q3", "q4"}, _answers("lab2q3", FORK)), ("extra_check_cell", {"q4"}, None)],
    "lab3": [("wrapped_in_namespace_q1", {"q1"}, None), ("reloaded_module_q1", {"q1"}, _answers("lab3", RELOAD)),
             ("thread_pool_q1", {"q1"}, _answers("lab3", THREAD))],
    "lab4": [("thread_pool_q3", {"q3", "q4"}, _answers("lab4", THREAD)),   # q4's cells call lab4_lm_losses too
             ("forked_child_q3", {"q3", "q4"}, _answers("lab4", FORK))],
}
ATTACKS["lab2"][0] = ("wrapped_in_namespace_q1", {"q1", "q2"}, _lab2_q1_wrapped())
ATTACKS["lab2"][1] = ("wrapped_in_namespace_q3", {"q3", "q4"},
                      _wrapped("lab2", [LIB["lab2_v"], LIB["lab2_o"]], "def lab2_sampling_variance", LAB2_Q3,
                               v=LIB["lab2_v"], o=LIB["lab2_o"]))
ATTACKS["lab3"][0] = ("wrapped_in_namespace_q1", {"q1"}, _wrapped("lab3", [LIB["lab3"]], "def lab3_plain_probs(",
                                                                   LAB3_Q1_PROBS, p=LIB["lab3"]))
# q2 builds on lab2_weights, q4 on lab2_sampling_variance: the hidden cases run them, so the library calls
# are reported there too (the questions whose graded code calls it)


def _variant(solution: Path, path: Path, replace: dict, lab: str, name: str) -> None:
    nb = nbformat.read(solution, as_version=4)
    for cell in nb.cells:
        for start, source in (replace or {}).items():
            if cell.cell_type == "code" and cell.source.lstrip().startswith(start):
                tail = cell.source.split(start, 1)[1]
                if start == "def lab3_plain_probs(":     # keep the rest of the cell (lab3_plain_update, the class)
                    source = source + tail.split("def lab3_plain_update(", 1)[1]
                elif start == "def lab2_sampling_variance":  # the cell ends with lab2_oracle_probs: replaced too
                    pass
                cell.source = source
    if name == "extra_check_cell":   # issue 42 hole 3: q4's answer uses the library, a check cell for q1 below it
        for k, cell in enumerate(nb.cells):
            if cell.cell_type == "code" and "def lab2_uniform_gain" in cell.source:
                cell.source = cell.source.replace(
                    "return lab2_sampling_variance(norms, uniform) / lab2_sampling_variance(norms, lab2_oracle_probs(norms))",
                    "return sazo_lite.variance.uniform_gain(norms)")
                nb.cells.insert(k + 1, nbformat.v4.new_code_cell('grader.check("q1")'))
                break
    nbformat.write(nb, path)


@pytest.fixture(scope="module")
def attacked(assigned_labs, tmp_path_factory):
    """{lab: ({file: row}, csv path)}: every attack of that lab graded in one grade_all run."""
    root = tmp_path_factory.mktemp("attacks")
    out = {}
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("SAZO_FAST", "1")
        for lab, items in ATTACKS.items():
            stem = labs.resolve_master(lab).stem
            solution = assigned_labs / stem / "autograder" / f"{stem}.ipynb"
            folder = root / lab
            folder.mkdir()
            for name, _, replace in items:
                _variant(solution, folder / f"{name}.ipynb", replace, lab, name)
            csv_path = root / f"{lab}.csv"
            rows = labs.grade_all(labs.autograder_zip(stem, build_dir=assigned_labs), folder, csv_path)
            out[lab] = ({r["submission"]: r for r in rows}, csv_path)
    return out


CASES = [(lab, name, zero) for lab, items in ATTACKS.items() for name, zero, _ in items]


@pytest.mark.parametrize("lab,name,zero", CASES, ids=lambda x: str(sorted(x)) if isinstance(x, (set, frozenset)) else str(x))
def test_each_attack_scores_zero_on_its_question_and_full_marks_elsewhere(attacked, lab, name, zero):
    rows, csv_path = attacked[lab]
    row = rows[f"{name}.ipynb"]
    scores = {q: (v["score"], v["possible"]) for q, v in row["questions"].items()}
    assert row["status"] == "ok", row
    attacked_first = min(zero, key=lambda q: int(q[1:]))
    assert scores[attacked_first][0] == 0, scores
    for q, (score, possible) in scores.items():
        if q not in zero:
            assert score == possible, f"{name}: {q} lost points it earned honestly: {scores}"
    details = json.loads((csv_path.parent / csv_path.stem / name / "results.json").read_text())["questions"]
    assert any("sazo_lite" in reason for reason in details[attacked_first].get("rule", [])), details[attacked_first]


SECRET = "TOP-SECRET-ANSWER-KEY 1234567890"


def test_hand_ins_that_are_not_files_of_the_folder_are_refused_and_names_stay_inside(assigned_labs, tmp_path):
    """Issue 42 holes 4 and 5: a symbolic link to the solutions scored 12/12 and one to another file put its first
    characters into the CSV; a hand-in named `...ipynb` wrote its results next to the CSV."""
    stem = labs.resolve_master("lab1").stem
    solution = assigned_labs / stem / "autograder" / f"{stem}.ipynb"
    student = assigned_labs / stem / "student" / f"{stem}.ipynb"
    secret = tmp_path / "secret.txt"
    secret.write_text(SECRET)
    folder = tmp_path / "handins"
    folder.mkdir()
    (folder / "link_to_solutions.ipynb").symlink_to(solution)
    (folder / "link_to_secret.ipynb").symlink_to(secret)
    (folder / "link_to_folder.ipynb").symlink_to(tmp_path)
    (folder / "dangling.ipynb").symlink_to(tmp_path / "nothing-here")
    copy = tmp_path / "copy.ipynb"
    copy.write_bytes(solution.read_bytes())
    os.link(copy, folder / "hard_link.ipynb")
    for name in ("...ipynb", "..ipynb", ".ipynb", "ålice ü.ipynb", "a b.ipynb", "a_b.ipynb"):
        (folder / name).write_bytes(student.read_bytes())
    csv_path = tmp_path / "grades" / "lab1.csv"
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("SAZO_FAST", "1")
        rows = {r["submission"]: r for r in labs.grade_all(labs.autograder_zip(stem, build_dir=assigned_labs), folder,
                                                           csv_path)}
    assert set(rows) == {p.name for p in folder.iterdir()}
    for name in ("link_to_solutions.ipynb", "link_to_secret.ipynb", "link_to_folder.ipynb", "dangling.ipynb"):
        assert rows[name]["status"] == "failed" and rows[name]["total"] == 0, rows[name]
        assert "symbolic link" in rows[name]["reason"] and str(tmp_path) not in rows[name]["reason"], rows[name]
    assert rows["hard_link.ipynb"]["total"] == 0 and "hard link" in rows["hard_link.ipynb"]["reason"]
    text = csv_path.read_text()
    assert SECRET[:10] not in text and "TOP-SECRET" not in text
    details = csv_path.parent / "lab1"
    assert sorted(p.name for p in csv_path.parent.iterdir()) == ["lab1", "lab1.csv"], "nothing written next to the CSV"
    folders = [p for p in details.iterdir()]
    assert len(folders) == len(rows) and all(p.is_dir() and not p.name.startswith(".") for p in folders), folders
    for p in folders:
        assert json.loads((p / "score.json").read_text())["submission"] in rows
    for name in ("...ipynb", "..ipynb", ".ipynb", "ålice ü.ipynb", "a b.ipynb", "a_b.ipynb"):
        assert rows[name]["status"] == "ok" and rows[name]["total"] == 0 and rows[name]["possible"] > 0, rows[name]
    assert not any(p.name.endswith(".tmp") for p in details.rglob("*")), "atomic writes leave no temporary file"


def test_grading_one_symlinked_hand_in_is_refused_with_a_reason_that_quotes_nothing(assigned_labs, tmp_path):
    stem = labs.resolve_master("lab1").stem
    secret = tmp_path / "secret.txt"
    secret.write_text(SECRET)
    (tmp_path / "alice.ipynb").symlink_to(secret)
    row = labs.grade(tmp_path / "alice.ipynb", labs.autograder_zip(stem, build_dir=assigned_labs), tmp_path / "out")
    assert row["status"] == "failed" and row["total"] == 0 and "symbolic link" in row["reason"]
    assert "TOP" not in json.dumps(row) and "TOP" not in (tmp_path / "out" / "grade.log").read_text()


def test_assign_works_from_any_folder(tmp_path):
    """Issue 42 hole 8: `assign --lab <path> --build <dir>` outside a clone built the lab, then exited 1."""
    master = labs.resolve_master("lab1").resolve()
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    done = subprocess.run([sys.executable, "-m", "sazo_lite.course.labs", "assign", "--lab", str(master),
                           "--build", "out"], cwd=elsewhere, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]
    assert list((elsewhere / "out" / master.stem / "autograder").glob("*-autograder_*.zip"))
    assert (elsewhere / "out" / master.stem / "student" / f"{master.stem}.ipynb").exists()
    assert "autograder_" in done.stdout

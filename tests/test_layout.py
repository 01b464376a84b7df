"""The package layout is the architecture: library below, course on top, read off the imports."""
import ast
import os
import subprocess
import sys
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parents[1] / "sazo_lite"
CORE = {"engine", "noise", "directions", "samplers", "sumtree", "train", "seedlog", "distributed",
        "validation", "variance", "kernels", "sparse", "precision", "atomic"}


def module_name(path: Path) -> str:
    parts = list(path.relative_to(PACKAGE.parent).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def imported_modules(path: Path) -> set[str]:
    """Absolute names of every sazo_lite module ``path`` imports (relative imports resolved)."""
    name = module_name(path)
    package = name if path.name == "__init__.py" else name.rsplit(".", 1)[0]
    found = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            found |= {a.name for a in node.names}
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")[: len(package.split(".")) - node.level + 1]
                mod = ".".join(base + ([node.module] if node.module else []))
            else:
                mod = node.module or ""
            found.add(mod)
            found |= {f"{mod}.{a.name}" for a in node.names}  # `from . import course`
    return {m for m in found if m == "sazo_lite" or m.startswith("sazo_lite.")}


def library_files():
    return [p for p in PACKAGE.rglob("*.py") if "course" not in p.relative_to(PACKAGE).parts]


def test_the_rule_reads_relative_and_absolute_imports():
    # the reader itself must see both spellings, or the rules below could pass vacuously
    assert {"sazo_lite.engine", "sazo_lite.train"} <= imported_modules(PACKAGE / "llm" / "finetune.py")   # `from ..engine`
    assert any(m.startswith("sazo_lite.course.") for m in imported_modules(PACKAGE / "course" / "widgets" / "sazo.py"))


@pytest.mark.parametrize("path", library_files(), ids=lambda p: str(p.relative_to(PACKAGE)))
def test_nothing_outside_the_course_imports_the_course(path):
    bad = {m for m in imported_modules(path) if m == "sazo_lite.course" or m.startswith("sazo_lite.course.")}
    assert not bad, f"{path.relative_to(PACKAGE)} imports {sorted(bad)}"


@pytest.mark.parametrize("name", sorted(CORE))
def test_the_core_imports_neither_hf_nor_llm(name):
    mods = imported_modules(PACKAGE / f"{name}.py")
    bad = {m for m in mods if m.split(".")[:2] in (["sazo_lite", "hf"], ["sazo_lite", "llm"])}
    assert not bad, f"{name} imports {sorted(bad)}"


def test_import_sazo_lite_pulls_no_notebook_or_grading_stack():
    code = ("import sys, sazo_lite, sazo_lite.sparse, sazo_lite.precision\n"
            "heavy = sorted(m for m in sys.modules if m.split('.')[0] in {'plotly', 'ipywidgets', 'otter', 'sklearn'})\n"
            "course = sorted(m for m in sys.modules if m.startswith('sazo_lite.course'))\n"
            "print(heavy, course)\nassert not heavy and not course, (heavy, course)")
    subprocess.run([sys.executable, "-c", code], check=True)


def test_building_and_checkpointing_a_mezo_does_not_import_dynamo():
    # torch's optimiser wraps these methods in a guard whose first call imports torch._dynamo
    # (seconds in every fresh process: each notebook kernel, grader and worker); MeZO skips it.
    code = ("import sys, torch, sazo_lite\n"
            "p = torch.zeros(3)\n"
            "opt = sazo_lite.MeZO([p], lr=0.1)\n"
            "opt.add_param_group({'params': [torch.zeros(2)], 'lr': 0.2})\n"
            "opt.step(lambda: (p ** 2).sum(dim=0, keepdim=True))\n"
            "opt.load_state_dict(opt.state_dict())\n"
            "assert opt.step_count == 1 and [g['lr'] for g in opt.param_groups] == [0.1, 0.2]\n"
            "assert 'torch._dynamo' not in sys.modules, 'torch._dynamo was imported'")
    subprocess.run([sys.executable, "-c", code], check=True)


def test_no_old_layout_module_is_left():
    for old in ["estimators", "two_point", "minibatches", "instruments", "problems", "race", "experiments",
                "memory", "memory_measure", "config", "widgets", "labs", "llm/memory_probe"]:
        assert not (PACKAGE / f"{old}.py").exists() and not (PACKAGE / old).is_dir(), old


def test_the_races_take_their_samplers_from_the_one_vocabulary():
    from sazo_lite import samplers
    from sazo_lite.course import sazo_runs
    from sazo_lite.llm import queries

    assert queries.SAMPLERS is samplers.RACED and sazo_runs.SAMPLERS is samplers.RACED
    assert set(samplers.RACED) <= set(samplers.SAMPLERS)


def test_make_test_runs_every_notebook_once_then_every_test_file_then_the_app_test():
    """The Makefile's notebook order (longest first) names each notebook once, a new one included."""
    root = PACKAGE.parent
    env = {k: v for k, v in os.environ.items() if not k.startswith("MAKE")}   # as from a shell, not from make
    done = subprocess.run(["make", "-n", "-s", "--no-print-directory", "test"], cwd=root, env=env,
                          capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    commands = [line for line in done.stdout.replace("\\\n", " ").splitlines()   # one command a line
                if "pytest" in line]
    notebooks, pool, app = [line for line in commands if "--nbmake" in line] + commands[-2:]
    ran = [name for name in notebooks.split() if name.startswith("build/executed/")]
    assert sorted(ran) == sorted(f"build/executed/{p.name}" for p in (root / "notebooks").glob("*.ipynb"))
    assert pool.split()[-1] == "tests" and "--ignore=tests/test_app.py" in pool
    assert app.split()[-1] == "tests/test_app.py"

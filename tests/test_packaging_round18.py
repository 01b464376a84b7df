"""Round 18: packaging and a new user's first contact (Makefile, pyproject.toml, the Pages workflow, README)."""
from __future__ import annotations

import os
import re
import shutil
import stat
import subprocess
from pathlib import Path

import pytest
from test_docs_truth import ROOT, flat, read

CPU_INDEX = "https://download.pytorch.org/whl/cpu"

# -- `make install` on a .venv a failed run left behind, with stub interpreters (nothing is installed) -----------
# PYTHON (the system python3) makes VENV/bin/python from one of the stubs below; every call is logged to $LOG.
SYSTEM_PYTHON = """#!/usr/bin/env bash
echo "python3 $*" >> "$LOG"
if [ "$1 $2" = "-m venv" ]; then
  dir="${@: -1}"
  if [ "$3" = "--clear" ]; then rm -rf "$dir"; fi
  mkdir -p "$dir/bin" && cp "$STUBS/working" "$dir/bin/python" && exit 0
fi
exit 1
"""
# A venv Python whose pip works; `import torch` works once $STUBS/torch_ok exists, and a reinstall over the
# installed files (--ignore-installed) makes it so unless $STUBS/torch_stays_broken exists.
WORKING = """#!/usr/bin/env bash
echo "venv $*" >> "$LOG"
case "$*" in
  *"import torch"*) [ -e "$STUBS/torch_ok" ] || { echo "ImportError: libtorch_cpu.so" >&2; exit 1; } ;;
  *--ignore-installed*) [ -e "$STUBS/torch_stays_broken" ] || touch "$STUBS/torch_ok" ;;
esac
exit 0
"""
# What `python3 -m venv` leaves without python3-venv: an interpreter without pip, and no ensurepip either.
NO_PIP = """#!/usr/bin/env bash
echo "venv $*" >> "$LOG"
case "$*" in
  "-m pip"*) echo "No module named pip" >&2; exit 1 ;;
  "-m ensurepip"*) echo "No module named ensurepip" >&2; exit 1 ;;
esac
exit 0
"""
# An interpreter without pip whose ensurepip works (python3-venv installed since): it installs pip in place.
ENSUREPIP = """#!/usr/bin/env bash
echo "venv $*" >> "$LOG"
case "$*" in
  "-m ensurepip"*) cp "$STUBS/working" "$0"; exit 0 ;;
  "-m pip"*) echo "No module named pip" >&2; exit 1 ;;
esac
exit 0
"""


def _script(path: Path, text: str) -> Path:
    path.write_text(text)
    path.chmod(path.stat().st_mode | stat.S_IXUSR)
    return path


@pytest.fixture
def stub_install(tmp_path):
    """Runs `make install` with PYTHON and VENV in tmp_path; `venv=` names the stub .venv/bin/python starts as
    (None: no .venv). Returns (returncode, log lines, stamp made)."""
    if shutil.which("make") is None or shutil.which("bash") is None:
        pytest.skip("no make or bash")
    stubs = tmp_path / "stubs"
    stubs.mkdir()
    for name, text in [("working", WORKING), ("no_pip", NO_PIP), ("ensurepip", ENSUREPIP)]:
        _script(stubs / name, text)
    system = _script(tmp_path / "python3", SYSTEM_PYTHON)
    venv, log = tmp_path / ".venv", tmp_path / "log"

    def run(venv_python: str | None, torch_ok: bool = True, torch_stays_broken: bool = False, *args):
        if venv_python is not None:
            (venv / "bin").mkdir(parents=True)
            (venv / "lib").mkdir()
            (venv / "lib" / "installed-before").write_text("a torch the user put there")
            shutil.copy(stubs / venv_python, venv / "bin" / "python")
        for flag, on in [("torch_ok", torch_ok), ("torch_stays_broken", torch_stays_broken)]:
            if on:
                (stubs / flag).touch()
        env = dict(os.environ, LOG=str(log), STUBS=str(stubs))
        done = subprocess.run(["make", "-C", str(ROOT), "install", f"PYTHON={system}", f"VENV={venv}", *args],
                              env=env, capture_output=True, text=True)
        lines = log.read_text().splitlines() if log.exists() else []
        return done.returncode, lines, (venv / ".sazo-installed").exists()
    run.venv = venv
    return run


def test_make_install_makes_a_venv_without_pip_anew(stub_install):
    """Without python3-venv, `python3 -m venv .venv` fails after writing .venv/bin/python; the Makefile took that
    interpreter as a venv (`test -x`) and every later `make` stopped at "No module named pip" until the user
    removed .venv by hand."""
    code, log, stamped = stub_install("no_pip")
    assert code == 0 and stamped, log
    assert f"python3 -m venv --clear {stub_install.venv}" in log
    assert any(line.startswith("venv -m pip install --quiet -e .[all]") for line in log), log


def test_make_install_gets_pip_back_with_ensurepip_and_keeps_the_venv(stub_install):
    code, log, stamped = stub_install("ensurepip")
    assert code == 0 and stamped, log
    assert "venv -m ensurepip --upgrade" in log
    assert not any(line.startswith("python3") for line in log), log          # never made anew
    assert (stub_install.venv / "lib" / "installed-before").exists()


def test_make_install_makes_the_venv_when_there_is_none(stub_install):
    code, log, stamped = stub_install(None)
    assert code == 0 and stamped, log
    assert any(re.fullmatch(rf"python3 -m venv (--clear )?{stub_install.venv}", line) for line in log), log


def test_make_install_keeps_a_working_venv_as_it_is(stub_install):
    """A .venv with pip (GPU users install their torch there first) is never made anew, and torch is not
    reinstalled when it imports."""
    code, log, stamped = stub_install("working")
    assert code == 0 and stamped, log
    assert not any(line.startswith("python3") for line in log), log
    assert not any("--ignore-installed" in line for line in log), log
    assert (stub_install.venv / "lib" / "installed-before").exists()


def test_make_install_reinstalls_a_torch_that_does_not_import(stub_install):
    """An install stopped midway can leave torch's files half written under a record pip reads as installed:
    `pip install torch==…` then says "already satisfied" and the stamp was made over a torch that cannot import."""
    spec = re.search(r"^TORCH_SPEC \?= (\S+)$", read("Makefile"), re.M).group(1)
    code, log, stamped = stub_install("working", False, False, f"TORCH_PIP_ARGS=--index-url {CPU_INDEX}")
    assert code == 0 and stamped, log
    reinstall = [line for line in log if "--ignore-installed" in line]
    assert reinstall == [f"venv -m pip install --quiet --no-deps --ignore-installed --index-url {CPU_INDEX} {spec}"]
    assert log.index(reinstall[0]) < next(i for i, line in enumerate(log) if "-e .[all]" in line)


def test_make_install_stops_without_a_stamp_when_torch_still_does_not_import(stub_install):
    code, log, stamped = stub_install("working", False, True)
    assert code != 0 and not stamped, log
    assert not any("-e .[all]" in line for line in log), log


def test_readme_says_make_mends_a_half_made_venv_and_no_longer_asks_to_remove_it():
    """The Quick start told users to `rm -rf .venv` after a failed first run, because make trusted any
    .venv/bin/python; make now mends or remakes it (the tests above)."""
    quick = flat(read("README.md").split("## Quick start", 1)[1].split("```", 1)[0])
    assert "rm -rf .venv" not in quick
    assert "$(PYTHON) -m venv --clear $(VENV)" in read("Makefile") and "ensurepip" in read("Makefile")
    assert "the Makefile runs `python3 -m venv --clear .venv` where `.venv` has no Python with pip" in quick
    assert "makes a half-made `.venv` anew by itself, and installs again a torch that does not import" in quick


# -- the GitHub Pages workflow -----------------------------------------------------------------------------------
def _workflow_make_lines() -> list[tuple[list[str], dict]]:
    """(make's arguments, the step's env) for every `make` line of the Pages workflow's steps."""
    import shlex

    import yaml

    found = []
    for job in yaml.safe_load(read(".github/workflows/pages.yml"))["jobs"].values():
        for step in job["steps"]:
            for line in step.get("run", "").splitlines():
                if line.strip().startswith("make "):
                    found.append((shlex.split(line)[1:], {k: str(v) for k, v in step.get("env", {}).items()}))
    return found


def test_pages_workflow_installs_the_cpu_torch_wheel():
    """`make book FULL=1` on ubuntu-latest gave pip no index, so `torch==2.13.0` came from PyPI: the multi-GB CUDA
    build with its nvidia-* wheels, on a runner with no GPU. Every torch pip line make runs there names the CPU index."""
    if shutil.which("make") is None:
        pytest.skip("no make")
    lines = _workflow_make_lines()
    assert [args[0] for args, _ in lines] == ["book"]
    args, env = lines[0]
    env = {k: v for k, v in env.items() if not v.startswith("${{")}
    done = subprocess.run(["make", "-n", "-B", *args], cwd=ROOT, capture_output=True, text=True, check=True,
                          env=dict(os.environ, **env))
    torch_lines = [line for line in done.stdout.splitlines() if '"torch==' in line]
    assert torch_lines and all(f"--index-url {CPU_INDEX}" in line for line in torch_lines), torch_lines
    assert "book/build.py --jobs 2 --full" in done.stdout


def test_course_md_says_the_workflow_installs_the_cpu_wheel():
    text = flat(read("docs/course.md"))
    assert f'with the CPU torch wheel (`TORCH_PIP_ARGS="--index-url {CPU_INDEX}"`)' in text
    assert f'TORCH_PIP_ARGS="--index-url {CPU_INDEX}"' in read(".github/workflows/pages.yml")


# -- triton: Linux wheels only -----------------------------------------------------------------------------------
def _extras() -> dict[str, list]:
    tomllib = pytest.importorskip("tomllib")   # Python 3.11+ (the package supports 3.10)
    from packaging.requirements import Requirement

    extras = tomllib.loads(read("pyproject.toml"))["project"]["optional-dependencies"]
    return {name: [Requirement(spec) for spec in specs] for name, specs in extras.items()}


def _installed_by(extra: str, environment: dict) -> set[str]:
    """The names `pip install .[extra]` asks for in `environment` (self-references followed)."""
    names = set()
    for requirement in _extras()[extra]:
        if requirement.marker is not None and not requirement.marker.evaluate(environment):
            continue
        if requirement.name == "sazo-lite":
            for inner in requirement.extras:
                names |= _installed_by(inner, environment)
        else:
            names.add(requirement.name)
    return names


PLATFORMS = {"linux": {"sys_platform": "linux", "platform_system": "Linux", "platform_machine": "x86_64"},
             "linux-arm": {"sys_platform": "linux", "platform_system": "Linux", "platform_machine": "aarch64"},
             "macos": {"sys_platform": "darwin", "platform_system": "Darwin", "platform_machine": "arm64"},
             "windows": {"sys_platform": "win32", "platform_system": "Windows", "platform_machine": "AMD64"}}


@pytest.mark.parametrize("platform", sorted(PLATFORMS))
def test_all_asks_for_triton_only_where_it_has_wheels(platform):
    """triton publishes manylinux wheels (x86-64 and aarch64) and nothing else, no sdist: `pip install .[all]` on
    macOS or Windows failed with "No matching distribution found for triton>=3.0"."""
    wanted = _installed_by("all", PLATFORMS[platform])
    assert ("triton" in wanted) == platform.startswith("linux"), (platform, sorted(wanted))
    assert {"transformers", "jupyterlab", "pytest", "otter-grader"} <= wanted


def test_no_module_imports_triton_outside_a_function_or_an_import_guard():
    """Every `import triton` of the library, benchmarks, book, examples and tests is lazy (in a function) or
    guarded by `except ImportError`: the repository imports where triton is not installed."""
    import ast

    def guarded(node, parents) -> bool:
        for parent in parents:
            if isinstance(parent, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda)):
                return True
            if isinstance(parent, ast.Try) and node in [n for stmt in parent.body for n in ast.walk(stmt)] and any(
                    isinstance(h.type, ast.Name) and h.type.id in {"ImportError", "ModuleNotFoundError", "Exception"}
                    for h in parent.handlers):
                return True
        return False

    def visit(node, parents, path, found):
        if isinstance(node, (ast.Import, ast.ImportFrom)):
            names = [a.name for a in node.names] if isinstance(node, ast.Import) else [node.module or ""]
            if any(n == "triton" or n.startswith("triton.") for n in names) and not guarded(node, parents):
                found.append(f"{path}:{node.lineno}")
        for child in ast.iter_child_nodes(node):
            visit(child, [*parents, node], path, found)

    found = []
    for folder in ("sazo_lite", "benchmarks", "book", "examples", "tests"):
        for path in sorted((ROOT / folder).rglob("*.py")):
            visit(ast.parse(path.read_text()), [], path.relative_to(ROOT), found)
    assert not found, found


def test_the_library_and_triton_noise_work_where_triton_is_not_installed():
    """With triton unimportable: every sazo_lite module imports, TritonNoise falls back to TorchNoise and steps, and
    triton_direction says why it cannot run (it raised ModuleNotFoundError from inside, or triton's
    "0 active drivers" where triton was there without a GPU)."""
    import sys

    code = r"""
import importlib, pkgutil, sys
sys.modules["triton"] = None                      # `import triton` raises ImportError
import torch, sazo_lite
for info in pkgutil.walk_packages(sazo_lite.__path__, "sazo_lite."):
    if not info.name.endswith(".__main__"):   # command lines: they run on import
        importlib.import_module(info.name)
from sazo_lite import MeZO
from sazo_lite.kernels import TritonNoise, triton_direction
noise = TritonNoise()
assert not noise.usable and "not installed" in noise.reason, noise.reason
theta = torch.zeros(64)
MeZO([theta], lr=0.1, eps=1e-3, noise=noise, seed=0).step(lambda: (theta - 1).pow(2).sum())
assert theta.abs().sum() > 0
try:
    triton_direction(torch.empty(8), 1, "gaussian")
except RuntimeError as error:
    print("refused:", error)
"""
    env = dict(os.environ, PYTHONPATH=str(ROOT), SAZO_FAST="1")
    done = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, env=env,
                          timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    assert "refused: triton_direction cannot run here: triton is not installed (pip install triton)" in done.stdout


def test_triton_direction_without_a_gpu_or_the_interpreter_says_why():
    from sazo_lite.kernels import triton_available, triton_direction

    usable, reason = triton_available()
    if usable:
        pytest.skip(f"triton runs here ({reason})")
    import torch

    with pytest.raises(RuntimeError, match=re.escape(f"triton_direction cannot run here: {reason}")):
        triton_direction(torch.empty(8), 1, "gaussian")


# -- examples/finetune_smollm2_trainer.py: bad arguments are usage errors before SmolLM2 loads --------------------
class _ModelLoaded(Exception):
    """Raised in place of loading SmolLM2: a bad argument got past the command line."""


@pytest.mark.parametrize("args, message", [
    (["--eps", "0"], "argument --eps: Invalid eps: 0.0"), (["--eps", "nan"], "argument --eps: Invalid eps: nan"),
    (["--lr", "-1"], "argument --lr: Invalid lr: -1.0"), (["--lr", "inf"], "argument --lr: Invalid lr: inf"),
    (["--seed", "-1"], "argument --seed: Invalid seed: -1"), (["--seed", str(2 ** 32)], "Invalid seed: 4294967296"),
    (["--seed", "1.5"], "argument --seed: "), (["--noise", "0.7"], "error: Invalid noise: 0.7"),
])
def test_example_refuses_bad_numbers_before_the_model_loads(args, message, monkeypatch, capsys):
    """--eps 0 and --lr -1 were refused by MeZO, and --seed -1 by numpy inside the Trainer, each as a traceback after
    SmolLM2 had loaded (30-60 s); --noise 0.7 was a traceback. Each is now a usage error (exit 2) naming it."""
    import sazo_lite.llm
    from test_examples_run import example

    def refuse(*args, **kwargs):
        raise _ModelLoaded
    monkeypatch.setattr(sazo_lite.llm, "load_smollm2", refuse)
    with pytest.raises(SystemExit) as stop:
        example().main([*args, "--steps", "1"])
    err = capsys.readouterr().err
    assert stop.value.code == 2 and message in err and "Traceback" not in err, err


@pytest.mark.parametrize("args", [["--eps", "1e-4", "--lr", "0"], ["--seed", str(2 ** 32 - 1)], ["--noise", "0.2"]])
def test_example_takes_the_numbers_the_library_takes(args, monkeypatch):
    import sazo_lite.llm
    from test_examples_run import example

    def refuse(*args, **kwargs):
        raise _ModelLoaded
    monkeypatch.setattr(sazo_lite.llm, "load_smollm2", refuse)
    with pytest.raises(_ModelLoaded):
        example().main([*args, "--steps", "1"])


# -- pyproject.toml: every import of the library and the course is a declared requirement with a lower bound ----------
def _third_party_imports() -> dict[str, set[str]]:
    """{top-level module: files} for the imports of sazo_lite/ (library and course) and the course's notebooks."""
    import ast
    import json
    import sys

    sources = {str(p.relative_to(ROOT)): p.read_text() for p in (ROOT / "sazo_lite").rglob("*.py")}
    for notebook in [*(ROOT / "notebooks").glob("*.ipynb"), *(ROOT / "labs").glob("*.ipynb")]:
        cells = json.loads(notebook.read_text())["cells"]
        code = "\n".join("".join(c["source"]) for c in cells if c["cell_type"] == "code")
        sources[str(notebook.relative_to(ROOT))] = "\n".join(
            line for line in code.splitlines() if not line.lstrip().startswith(("%", "!")))
    found: dict[str, set[str]] = {}
    for name, text in sources.items():
        for node in ast.walk(ast.parse(text)):
            modules = ([a.name for a in node.names] if isinstance(node, ast.Import) else
                       [node.module] if isinstance(node, ast.ImportFrom) and node.level == 0 and node.module else [])
            for module in modules:
                top = module.split(".")[0]
                if top not in sys.stdlib_module_names and top != "sazo_lite":
                    found.setdefault(top, set()).add(name)
    return found


def test_every_module_the_library_and_course_import_is_required_with_a_lower_bound():
    """sazo_lite.course.labs imports yaml (PyYAML) and the notebooks import IPython, neither named in pyproject.toml
    (they came with otter-grader and ipykernel); every other import has a requirement with a lower bound."""
    import importlib.metadata

    tomllib = pytest.importorskip("tomllib")   # Python 3.11+ (the package supports 3.10)
    from packaging.requirements import Requirement
    from packaging.utils import canonicalize_name

    project = tomllib.loads(read("pyproject.toml"))["project"]
    specs = [*project["dependencies"], *(s for extra in project["optional-dependencies"].values() for s in extra)]
    bounded = {canonicalize_name(r.name) for r in map(Requirement, specs)
               if any(s.operator in (">=", "==", "~=") for s in r.specifier)}
    distributions = importlib.metadata.packages_distributions()
    missing = {module: sorted(files)[:2] for module, files in _third_party_imports().items()
               if not {canonicalize_name(d) for d in distributions.get(module, [module])} & bounded}
    assert not missing, f"imported without a bounded requirement in pyproject.toml: {missing}"


def test_transformers_lower_bound_has_what_the_library_reads():
    """pyproject said transformers>=4.46; on 4.46 `tiny_causal_lm` failed (`from_config(dtype=)`: "unexpected keyword
    argument 'dtype'"), and on 4.57 ZOTrainer on `args.train_sampling_strategy`, a TrainingArguments field new in
    5.2.0 (absent from 5.1.0's training_args.py). tests/test_hf.py passed on 5.2.0 (2026-12-08)."""
    import dataclasses
    import inspect

    from packaging.version import Version
    from transformers import TrainingArguments

    import sazo_lite.hf

    [spec] = [s for s in _extras()["llm"] if s.name == "transformers"]
    [low] = [Version(s.version) for s in spec.specifier if s.operator == ">="]
    assert "args.train_sampling_strategy" in inspect.getsource(sazo_lite.hf)
    assert "train_sampling_strategy" in {f.name for f in dataclasses.fields(TrainingArguments)}
    assert low >= Version("5.2"), spec

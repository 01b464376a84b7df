"""Issue 42: every road from the student's code to a forbidden library function reports, however it is
reached (an attribute, a rebuilt function, a namespace, a partial, a bound method, a thread, a forked
process, a reloaded or re-loaded module), and the ways around the guard (programs, gc walks, copies
of the library's modules) are refused. Fast: no lab is built; the guard runs in a child process, as
in the sandbox's worker, with the kernel's exec block on.
"""
from __future__ import annotations

import json
import subprocess
import sys

import pytest

HARNESS = r"""
import json, os, sys, types
import torch, sazo_lite
from sazo_lite.course.labs.guard import Guard
from sazo_lite.course.labs.worker import block_programs
log = sys.argv[2]
namespace = {"__name__": "__main__", "__builtins__": __builtins__, "torch": torch, "sazo_lite": sazo_lite}
def report(name, how, unit=None):
    with open(log, "a") as handle:       # forked children append here too
        handle.write(json.dumps([current[0], name, how]) + "\n")
current = [None]
guard = Guard(["sazo_lite.course", "sazo_lite.samplers"], ["sazo_lite.Sampler", "sazo_lite.course.pick"], namespace,
              report, unit=lambda: current[0])
blocked = block_programs()
guard.install()
results = {}
for name, source, call in json.loads(sys.argv[1]):
    for key in ("f", "K"):
        namespace.pop(key, None)
    current[0] = name
    outcome = []
    try:
        exec(compile(source, "<cell 1>", "exec"), namespace)
        if call:
            code = compile(call, "<q1 case 0>", "exec")
            guard.trust(code)
            try:
                exec(code, namespace)
            finally:
                guard.trust(None)
    except BaseException as exc:
        outcome.append(["raised", f"{type(exc).__name__}: {exc}"[:200]])
    outcome += [["check", how] for _, how in guard.check(["f", "K"])]
    outcome += [["intact", c] for c in guard.intact()]
    results[name] = outcome
found = {}
for line in open(log):
    unit, name, how = json.loads(line)
    found.setdefault(unit, []).append([name, how])
print(json.dumps({"results": results, "found": found, "blocked": blocked}))
"""
N = "n = torch.tensor([1.0, 2.0, 3.0], dtype=torch.float64)\n"
CLEAN = {"honest thread": "", "honest fork": ""}
ATTACKS = [
    # name, cell source, the test case's call (None: nothing)
    ("honest thread", N + "import concurrent.futures\ndef f(x):\n    return float(x.sum())\n"
                          "_r = concurrent.futures.ThreadPoolExecutor(1).submit(f, n).result()", "f(n)"),
    ("honest fork", N + "import os\n_pid = os.fork()\nif _pid == 0:\n    float(n.sum()); os._exit(0)\nos.waitpid(_pid, 0)", None),
    ("__wrapped__ into a namespace", N + "import types\n_raw = getattr(sazo_lite.variance.sampling_variance, '__wrapped__', "
     "sazo_lite.variance.sampling_variance)\n_ns = types.SimpleNamespace(f=_raw)\ndef f(a, b):\n    return _ns.f(a, b)",
     "f(n, n / n.sum())"),
    ("closure cells", N + "_fn = sazo_lite.variance.oracle_probs\n_cells = [c.cell_contents for c in (_fn.__closure__ or ())]\n"
     "_raw = _cells[0] if _cells else _fn\n_v = _raw(n)", None),
    ("a function rebuilt from __code__", N + "import types\n_raw = types.FunctionType(sazo_lite.variance.oracle_probs.__code__, "
     "vars(sazo_lite.variance))\n_v = _raw(n)", None),
    ("partial in an instance", N + "import functools\nclass _Box:\n    pass\n_b = _Box()\n_b.g = functools.partial("
     "sazo_lite.variance.sampling_variance, n)\ndef f(p):\n    return _b.g(p)", None),
    ("a bound method", N + "import types\nclass _H:\n    pass\n_h = _H()\n_h.m = types.MethodType(lambda self, x: "
     "sazo_lite.variance.oracle_probs(x), _h)\n_v = _h.m(n)", None),
    ("slots", N + "class _S:\n    __slots__ = ('g',)\n_s = _S()\n_s.g = sazo_lite.variance.oracle_probs\ndef f(x):\n    return _s.g(x)", None),
    ("a module the student built", N + "import types\n_m = types.ModuleType('helpers')\n_m.g = sazo_lite.variance.oracle_probs\n"
     "def f(x):\n    return _m.g(x)", None),
    ("thread pool", N + "import concurrent.futures\n_v = concurrent.futures.ThreadPoolExecutor(1).submit("
     "sazo_lite.variance.oracle_probs, n).result()", None),
    ("threading.Thread", N + "import threading\n_out = []\n_t = threading.Thread(target=lambda: _out.append("
     "sazo_lite.variance.oracle_probs(n)))\n_t.start(); _t.join()", None),
    ("_thread.start_new_thread", N + "import _thread, time\n_out = []\n_thread.start_new_thread(lambda: _out.append("
     "sazo_lite.variance.oracle_probs(n)), ())\ntime.sleep(1)", None),
    ("os.fork", N + "import os\n_r, _w = os.pipe()\n_pid = os.fork()\nif _pid == 0:\n    try:\n        os.write(_w, repr("
     "sazo_lite.variance.oracle_probs(n).tolist()).encode())\n    finally:\n        os._exit(0)\nos.waitpid(_pid, 0)", None),
    ("process pool (fork)", N + "import concurrent.futures, multiprocessing\n_v = concurrent.futures.ProcessPoolExecutor(1, "
     "mp_context=multiprocessing.get_context('fork')).submit(sazo_lite.variance.oracle_probs, n).result()", None),
    ("process pool (spawn)", N + "import concurrent.futures, multiprocessing\n_v = concurrent.futures.ProcessPoolExecutor(1, "
     "mp_context=multiprocessing.get_context('spawn')).submit(sazo_lite.variance.oracle_probs, n).result()", None),
    ("subprocess with python", "import subprocess, sys\n_out = subprocess.run([sys.executable, '-c', 'import sazo_lite.variance'], "
     "capture_output=True)", None),
    ("os.system", "import os\nos.system('true')", None),
    ("execve through ctypes", "import ctypes, os\n_libc = ctypes.CDLL(None)\n_pid = os.fork()\nif _pid == 0:\n"
     "    _libc.execv(b'/bin/false', None)\n    os._exit(0)\n"                  # reached only if execve was refused
     "if os.waitpid(_pid, 0)[1] == 0:\n    raise PermissionError('execve refused by the kernel')", None),
    ("gc.get_referrers", "import gc\n_all = gc.get_referrers(sazo_lite.variance.oracle_probs)", None),
    ("importlib.reload", N + "import importlib\n_v2 = importlib.reload(sazo_lite.variance)\n_x = _v2.oracle_probs(n)", None),
    ("a fresh copy of the module", N + "import importlib.util\n_spec = importlib.util.spec_from_file_location('v2', "
     "sazo_lite.variance.__file__)\n_m = importlib.util.module_from_spec(_spec)\n_spec.loader.exec_module(_m)\n_x = _m.oracle_probs(n)", None),
    ("sys.modules copy", N + "import sys\n_saved = sys.modules.pop('sazo_lite.variance')\ntry:\n    import sazo_lite.variance as _v\n"
     "finally:\n    sys.modules['sazo_lite.variance'] = _saved\n_x = _v.oracle_probs(n)", None),
    ("exec of the library's file", "_src = open(sazo_lite.variance.__file__).read()\n_g = {}\n"
     "exec(compile(_src, sazo_lite.variance.__file__, 'exec'), _g)", None),
    ("swapping the code back", "import ast\n_src = open(sazo_lite.variance.__file__).read()\n_g = dict(vars(sazo_lite.variance))\n"
     "exec(compile(_src, '<copy>', 'exec'), _g)\nsazo_lite.variance.oracle_probs.__code__ = _g['oracle_probs'].__code__", None),
]


@pytest.fixture(scope="module")
def guarded(tmp_path_factory):
    log = tmp_path_factory.mktemp("guard") / "found.jsonl"
    done = subprocess.run([sys.executable, "-c", HARNESS, json.dumps(ATTACKS), str(log)], capture_output=True, text=True,
                          timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads(done.stdout.strip().splitlines()[-1])


@pytest.mark.parametrize("name", [a[0] for a in ATTACKS])
def test_every_road_to_the_library_reports_or_is_refused(guarded, name):
    outcome, found = guarded["results"][name], guarded["found"].get(name, [])
    if name in CLEAN:
        assert outcome == [] and found == [], (outcome, found)
        return
    assert outcome or found, f"{name}: nothing reported, nothing refused"
    raised = " ".join(how for kind, how in outcome if kind == "raised")
    for word in ("start programs", "walk the interpreter", "execve"):
        if word in raised:
            return
    assert found or any(kind in ("check", "intact") for kind, _ in outcome) or "Error" in raised, (outcome, found)


def test_the_findings_name_the_library_object(guarded):
    found = guarded["found"]
    for name in ("__wrapped__ into a namespace", "a function rebuilt from __code__", "thread pool", "threading.Thread",
                 "_thread.start_new_thread", "os.fork", "process pool (fork)", "importlib.reload"):
        assert any("sazo_lite.variance" in item[0] for item in found.get(name, [])), (name, found.get(name))
    checks = guarded["results"]
    for name in ("partial in an instance", "slots", "a module the student built", "__wrapped__ into a namespace"):
        assert any(kind == "check" for kind, _ in checks[name]), (name, checks[name])
    assert any(kind == "intact" for kind, _ in checks["swapping the code back"]), checks["swapping the code back"]


def test_the_kernel_refuses_programs_and_forked_children_get_no_result(guarded):
    results = guarded["results"]
    assert any("start programs" in how for _, how in results["process pool (spawn)"]), results["process pool (spawn)"]
    assert any("start programs" in how for _, how in results["subprocess with python"])
    if guarded["blocked"]:
        assert any("execve refused" in how for _, how in results["execve through ctypes"]), results["execve through ctypes"]
    # the pool pickles the function by name: its import, on the student's feeder thread, is refused and reported
    assert any("sazo_lite.variance" in how for _, how in results["process pool (fork)"]), results["process pool (fork)"]
    assert ["sazo_lite.variance", "imported"] in guarded["found"]["process pool (fork)"]

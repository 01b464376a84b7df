"""Inside the sandbox: run a submission's cells, then every test case; report on a pipe.

Started by ``sazo_lite.course.labs.grading`` as ``python -m sazo_lite.course.labs.worker FD`` with the job
(JSON) on stdin. Everything this process reports is untrusted: the parent only believes values
that match the solution's (see ``values``), and ends the process (its whole namespace) itself.
Events, one JSON object per line (each written after a newline of its own) on file descriptor FD:
``{"unit": ["cell", i] | ["case", q, k], "phase": "start" | "end", ...}``, ``{"rule": [name, how],
"unit": ...}`` (the lab's library rule was broken there, see ``guard``) and ``{"done": true}``.

Before any student code runs, the worker asks the kernel to refuse ``execve`` to this process and
everything it starts (seccomp, where the architecture is known): a submission can fork (its
children keep the guard) but cannot start another program, such as a fresh Python without it.
"""
from __future__ import annotations

import _thread
import ast
import builtins
import importlib
import json
import os
import signal
import sys
import threading
import traceback
import types

from sazo_lite.course.labs import LabTimeout, time_limit
from sazo_lite.course.labs.guard import TAMPERED, Guard
from sazo_lite.course.labs.values import encode

# Held before any student code runs: the submission may rebind the module-level names.
_write, _dumps, _setitimer, _signal = os.write, json.dumps, signal.setitimer, signal.signal
_BaseException, _ITIMER, _SIGALRM = BaseException, signal.ITIMER_REAL, signal.SIGALRM
_BUILTINS = dict(builtins.__dict__)
# The names a case reads that the grader gives it (``case_code``): the builtins (not the module's own dunders,
# ``__name__`` is the notebook's) and the grader's two.
_GIVEN = frozenset([*(k for k in _BUILTINS if not k.startswith("__")), "record", "time_limit"])
_LOCK = threading.Lock()   # one line at a time, whichever thread reports


def run_case(source: str | types.CodeType, namespace: dict, name: str = "<case>", guard: Guard | None = None) -> tuple[str | None, list]:
    """Run one test case in ``namespace``; returns (error or None, recorded values).

    First undoes what the submission did to the builtins module (``builtins.abs = ...``) and to the
    notebook's ``__builtins__`` (``__builtins__ = {...}``) and puts the grader's ``record`` and ``time_limit``
    in ``namespace``. The case runs as a function's body (``case_code``; ``source`` may be that code already):
    its names that start with ``_`` never reach ``namespace``, and the builtins, ``record`` and ``time_limit``
    it names are its arguments, given the real ones, so a student's global of the same name (``abs = ...``,
    a helper ``def max(...)``, one their function binds while the case runs) is not what the case's names
    mean, and stays what the student's own functions see.
    """
    return _case_runner(dict(_BUILTINS))(source, namespace, name, guard)


def _case_runner(pristine: dict):
    """``run_case`` holding what it uses (the builtins to restore, ``compile``, ``exec``, ...): ``main`` makes one
    before student code runs, so rebinding this module's names (``sys.modules["__main__"]._BUILTINS``) changes
    nothing of how the cases run."""
    module, make, encode_, limit, error_text = builtins, case_code, encode, time_limit, _error
    space = module.__dict__
    update, base, function, code_type, kind, tuple_ = dict.update, _BaseException, types.FunctionType, \
        types.CodeType, type, tuple

    def run(source: str | types.CodeType, namespace: dict, name: str = "<case>", guard: Guard | None = None):
        records = []

        def record(value, *, rtol=None, atol=None):
            records.append({"value": encode_(value), "rtol": rtol, "atol": atol})

        update(space, pristine)
        # A function takes its builtins from its globals' __builtins__: a cell's `__builtins__ = {...}` would
        # otherwise be what `import` means in the case.
        namespace["__builtins__"], namespace["record"], namespace["time_limit"] = module, record, limit
        given = {**pristine, "record": record, "time_limit": limit}
        try:
            code = source if kind(source) is code_type else make(source, name)
            case = function(code, namespace, "case", tuple_([given[n] for n in code.co_varnames[:code.co_argcount]]))
            if guard is not None:
                guard.trust(case.__code__)
            try:
                case()
            finally:
                if guard is not None:
                    guard.trust(None)
        except base as exc:
            return error_text(exc), records
        return None, records

    return run


def case_code(source: str, name: str = "<case>") -> types.CodeType:
    """A test case's source compiled as the code of a function of no arguments (``run_case`` gives it the
    student's namespace as its globals).

    The names the case binds at its top level that start with ``_`` (``_mine = lab2_weights``, ``_gen``, a
    ``for _ in``) are the function's locals, so a global of the student's with the same name is neither
    rebound nor seen; the other names it binds (a graded name swapped for another version, then restored)
    are declared ``global`` and bind in the namespace as they would at a notebook's top level. The builtins,
    ``record`` and ``time_limit`` it reads and does not bind are the function's arguments (``run_case`` gives
    it the real ones): a global of the student's named like one is not what they mean in the case.
    """
    tree = ast.parse(source, name)
    bound = _top_level_names(tree.body)
    shared = sorted(n for n in bound if not n.startswith("_"))
    read = {n.id for n in ast.walk(tree) if isinstance(n, ast.Name) and isinstance(n.ctx, ast.Load)}
    given = [ast.arg(arg=n) for n in sorted((read & _GIVEN) - bound)]
    body = ([ast.Global(names=shared)] if shared else []) + (tree.body or [ast.Pass()])
    function = ast.FunctionDef(name="case", args=ast.arguments(posonlyargs=[], args=given, kwonlyargs=[],
                                                               kw_defaults=[], defaults=[]),
                               body=body, decorator_list=[], returns=None)
    module = ast.fix_missing_locations(ast.Module(body=[function], type_ignores=[]))
    return next(c for c in compile(module, name, "exec").co_consts if isinstance(c, types.CodeType))


def _prepared(source: str, name: str):
    """``case_code(source)``, made before any student code runs (which could replace ``ast``'s functions and so
    rewrite the cases); a source that does not compile stays text, for ``run_case`` to report its error."""
    try:
        return case_code(source, name)
    except (SyntaxError, ValueError, RecursionError, MemoryError):
        return source


def _top_level_names(body: list) -> set[str]:
    """The names statements bind in their own scope: assignments, imports, ``for``/``with``/``except``
    targets, ``def`` and ``class`` names, walruses (not what nested functions, lambdas and classes bind)."""
    names, scopes = set(), (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef, ast.Lambda)
    todo = list(body)
    while todo:
        node = todo.pop()
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            names.add(node.name)
            todo += [*node.decorator_list, *getattr(node, "bases", []), *getattr(node, "keywords", [])]
            continue
        if isinstance(node, scopes):
            continue
        if isinstance(node, ast.Name) and isinstance(node.ctx, (ast.Store, ast.Del)):
            names.add(node.id)
        elif isinstance(node, (ast.Import, ast.ImportFrom)):
            names.update((a.asname or a.name).split(".")[0] for a in node.names if a.name != "*")
        elif isinstance(node, ast.ExceptHandler) and node.name:
            names.add(node.name)
        elif isinstance(node, (ast.MatchAs, ast.MatchStar)) and node.name:
            names.add(node.name)
        elif isinstance(node, ast.MatchMapping) and node.rest:
            names.add(node.rest)
        todo += list(ast.iter_child_nodes(node))
    return names


def _emit(fd: int, event: dict) -> None:
    # A newline first: bytes the submission wrote to the fd without one (``os.write(fd, b"x")``) end
    # there as a malformed line of their own instead of swallowing this event (a finding of the guard).
    data = ("\n" + _dumps(event) + "\n").encode()
    with _LOCK:
        while data:
            data = data[_write(fd, data):]


def _emitter(fd: int):
    """``emit(event)``: ``_emit`` on ``fd`` made of objects it holds itself, taken before any student code.

    ``main`` reports through it, never through this module's names: the submission runs in this process,
    where ``sys.modules["__main__"]`` is this module, and rebinding ``_emit``, ``_write`` or ``_dumps`` there
    (or ``json.dumps``, ``builtins.str``) would otherwise filter the guard's findings out of the report.
    """
    write, lock, text = os.write, threading.Lock(), _json_text()

    def emit(event: dict) -> None:
        data = ("\n" + text(event) + "\n").encode("utf-8", "replace")
        with lock:
            while data:
                data = data[write(fd, data):]

    return emit


def _json_text():
    """JSON text of the worker's events (dicts, lists, text, numbers, None) using only what it holds: no
    ``json`` module (whose functions and encoder the submission could replace). Other types write ``null``."""
    type_, str_, int_, float_, bool_, list_, tuple_, dict_ = type, str, int, float, bool, list, tuple, dict
    int_text, float_text, translate, inf = int.__repr__, float.__repr__, str.translate, float("inf")
    escapes = {**{i: f"\\u{i:04x}" for i in range(32)}, ord('"'): '\\"', ord("\\"): "\\\\"}

    def text(value, depth: int = 0) -> str:
        kind = type_(value)
        if kind is str_:
            return '"' + translate(value, escapes) + '"'
        if value is None:
            return "null"
        if kind is bool_:
            return "true" if value else "false"
        if kind is int_:
            return int_text(value)
        if kind is float_:
            return "NaN" if value != value else "Infinity" if value == inf else "-Infinity" if value == -inf \
                else float_text(value)
        if depth > 100:
            return "null"
        if kind is list_ or kind is tuple_:
            return "[" + ",".join([text(item, depth + 1) for item in value]) + "]"
        if kind is dict_:
            return "{" + ",".join([text(k) + ":" + text(v, depth + 1) for k, v in dict_.items(value)
                                   if type_(k) is str_]) + "}"
        return "null"

    return text


# What the guard's checks call from the standard library at check time: a lasting change to one is tampering.
_CHECKS_CALL = (("sys", "_getframe"), ("sys", "modules"), ("os", "getpid"), ("_thread", "get_ident"),
                ("dis", "get_instructions"), ("dis", "hasname"), ("dis", "hasconst"), ("inspect", "getattr_static"),
                ("importlib.util", "resolve_name"), ("functools", "partial"), ("types", "FunctionType"),
                ("types", "CodeType"), ("types", "MethodType"), ("types", "ModuleType"), ("types", "CellType"))


def _witness(guard, *held):
    """``look()``: what the checks and the report are made of, by identity, taken before any student code.

    Returns ``{what: (objects...)}`` for: every global of the guard's module (its functions and classes with
    their code, defaults and class members), the standard library attributes the checks call
    (``_CHECKS_CALL``), the guard's own attributes that name a method (an instance attribute shadowing one),
    and each of ``held`` (the worker's report functions: their code and closures). ``main`` compares a look
    after each cell and before each case with the first: a lasting change is tampering.
    """
    import sazo_lite.course.labs.guard as module

    vars_, type_, getattr_, isinstance_, tuple_, sorted_, list_ = vars, type, getattr, isinstance, tuple, sorted, list
    function, value_error, wrappers = type(_witness), ValueError, (staticmethod, classmethod, property)
    calls = [(f"{m}.{attr}", importlib.import_module(m), attr) for m, attr in _CHECKS_CALL]
    klass, space, prefix = type(guard), vars(module), module.__name__ + "."

    def held_by(cell):
        try:
            return cell.cell_contents
        except value_error:   # an empty cell
            return None

    def parts(obj) -> tuple:
        if isinstance_(obj, wrappers):
            return (obj, *[part for a in ("__func__", "fget", "fset") for part in parts(getattr_(obj, a, None))])
        if type_(obj) is function:
            return (obj, obj.__code__, obj.__defaults__, obj.__kwdefaults__, obj.__globals__,
                    *[held_by(cell) for cell in obj.__closure__ or ()])
        if isinstance_(obj, type) and obj.__module__ == module.__name__:
            return (obj, *[part for _, v in sorted_(vars_(obj).items()) for part in parts(v)])
        return (obj,)

    def look() -> dict:
        seen = {prefix + name: parts(value) for name, value in sorted_(space.items())}
        seen.update({what: (getattr_(source, attr, None),) for what, source, attr in calls})
        seen["the guard's methods"] = (type_(guard), *sorted_(k for k in list_(vars_(guard)) if k in vars_(klass)))
        seen.update({f"{getattr_(h, '__module__', '?')}.{getattr_(h, '__qualname__', '?')}": parts(h) for h in held})
        return seen

    return look


# seccomp: a classic BPF program over struct seccomp_data {int nr; u32 arch; u64 ip; u64 args[6]}
# Per architecture: AUDIT_ARCH, the calls refused outright (execve, execveat, close_range) and the calls
# refused on the report fd, as (number, offset of the fd argument's low 32 bits in seccomp_data).
_ARCHES = {"x86_64": (0xC000003E, (59, 322, 436), ((3, 16), (33, 24), (292, 24))),  # close, dup2, dup3
           "aarch64": (0xC00000B7, (221, 281, 436), ((57, 16), (24, 24)))}        # close, dup3
_DENY = "deny"


def _filter_program(arch: str, report_fd: int | None) -> list[tuple[int, int, int, int]]:
    """The BPF program: (code, jt, jf, k) with relative jumps (jt/jf skip that many instructions)."""
    ld, jeq, jge, ret = 0x20, 0x15, 0x35, 0x06          # BPF_LD|W|ABS, BPF_JMP|JEQ|K, BPF_JMP|JGE|K, BPF_RET|K
    allow, eperm = 0x7FFF0000, 0x00050000 | 1            # SECCOMP_RET_ALLOW, SECCOMP_RET_ERRNO | EPERM
    audit_arch, refused, on_fd = _ARCHES[arch]
    program = [(ld, 0, 0, 4), (jeq, 1, 0, audit_arch), (ret, 0, 0, eperm), (ld, 0, 0, 0)]  # another ABI: refused
    if arch == "x86_64":
        program.append((jge, _DENY, 0, 0x40000000))      # x32 syscalls: refused
    program += [(jeq, _DENY, 0, nr) for nr in refused]
    if report_fd is not None:  # dup2/dup3 onto the report fd, or closing it (to reopen it as a pipe): refused
        for nr, offset in on_fd:
            program += [(jeq, 0, 3, nr), (ld, 0, 0, offset), (jeq, _DENY, 0, report_fd), (ld, 0, 0, 0)]
    program.append((ret, 0, 0, allow))
    deny = len(program)
    program.append((ret, 0, 0, eperm))
    return [(code, deny - i - 1 if jt == _DENY else jt, jf, k) for i, (code, jt, jf, k) in enumerate(program)]


def block_programs(report_fd: int | None = None) -> bool:
    """Make the kernel refuse ``execve``/``execveat`` (EPERM) to this process and its children, for good;
    with ``report_fd``, also ``dup2``/``dup3`` onto it and ``close`` of it (and ``close_range``), so that
    student code cannot put a pipe of its own in the report's place and filter what the guard reports.

    Returns False where it cannot (unknown architecture, no seccomp): the audit hook of ``guard``
    still refuses the Python ways to start a program.
    """
    import ctypes
    import platform

    if platform.machine() not in _ARCHES:
        return False
    program = _filter_program(platform.machine(), report_fd)

    class Filter(ctypes.Structure):
        _fields_ = [("code", ctypes.c_ushort), ("jt", ctypes.c_ubyte), ("jf", ctypes.c_ubyte), ("k", ctypes.c_uint)]

    class Program(ctypes.Structure):
        _fields_ = [("len", ctypes.c_ushort), ("filter", ctypes.POINTER(Filter))]

    filters = (Filter * len(program))(*[Filter(*f) for f in program])
    prog = Program(len(program), filters)
    libc = ctypes.CDLL(None, use_errno=True)
    if libc.prctl(38, 1, 0, 0, 0) != 0:                  # PR_SET_NO_NEW_PRIVS
        return False
    return libc.prctl(22, 2, ctypes.byref(prog), 0, 0) == 0  # PR_SET_SECCOMP, SECCOMP_MODE_FILTER


def _alarm(signum, frame):
    raise LabTimeout("the cell ran past its time limit")


def _error(exc: BaseException) -> str:
    try:
        text = "".join(traceback.format_exception_only(type(exc), exc)).strip()
    except _BaseException:  # an exception whose str() raises
        text = f"{type(exc).__name__} (its message could not be read)"
    return str(text)[-500:]


def display(*objects, **options) -> None:
    """Jupyter's ``display`` (a name every notebook has without an import): here it prints, like IPython
    outside a notebook, so that a ``display(x)`` left in an answer cell does not stop the cell."""
    for value in objects:
        print(value)


class _Shell:
    """Jupyter's ``get_ipython()`` (a name every notebook has without an import), for a cell converted from a
    script: ``nbconvert --to script`` writes ``%matplotlib inline`` as
    ``get_ipython().run_line_magic('matplotlib', 'inline')``.
    Its magics do what ``grading.without_magics`` makes of the ``%`` forms: ``time`` (and the cell magic ``capture``)
    run their code in the notebook (``%time expr`` returns its value), any other magic and a shell command do nothing
    (programs do not run in the sandbox)."""

    def __init__(self, namespace: dict):
        self._namespace = namespace

    def _run(self, source: str):
        try:
            code = compile(source, "<cell magic>", "eval")
        except SyntaxError:
            exec(compile(source, "<cell magic>", "exec"), self._namespace)
            return None
        return eval(code, self._namespace)

    def run_line_magic(self, magic, line, *args, **kwargs):
        return self._run(line) if magic == "time" else None

    def run_cell_magic(self, magic, line, cell, *args, **kwargs):
        if magic in ("time", "capture"):
            exec(compile(cell, "<cell magic>", "exec"), self._namespace)
        return None

    def system(self, *args, **kwargs):
        return None

    def getoutput(self, *args, **kwargs):
        return []


def main(fd: int) -> None:
    job = json.loads(sys.stdin.read())
    cases = [(question, case, _prepared(source, f"<{question} case {case}>")) for question, case, source in job["cases"]]
    namespace = {"__name__": "__main__", "__builtins__": builtins, "display": display}
    shell = _Shell(namespace)
    namespace["get_ipython"] = lambda: shell
    current = [None]
    guard = None
    # What reports and runs the cases is held here before student code runs, not looked up again in this
    # module, which the submission can reach as sys.modules["__main__"] (see _emitter). (The cell timer's
    # names still are: rebinding them only lets a cell overrun, and the parent kills it.)
    emit, error_text, text, to_str, length, pairs, some = _emitter(fd), _error, repr, str, len, zip, any
    if job.get("block_programs", True):
        block_programs(fd)
    if job.get("rule"):
        reported = set()

        def report(name, how, unit=None):
            unit = current[0] if unit is None else unit
            key = (name, how, text(unit))
            if key not in reported:
                reported.add(key)
                emit({"rule": [to_str(name)[:200], to_str(how)[:200]], "unit": unit})

        guard = Guard(job["rule"]["modules"], job["rule"]["names"], namespace, report, unit=lambda: current[0])
        guard.install()
        _BUILTINS["__import__"] = builtins.__import__  # the guarded import is what every case restores
        hooks = (builtins.__import__, importlib.import_module, _thread.start_new_thread)
        intact, check, look = guard.intact, guard.check, _witness(guard, emit, report, *hooks)
        first = look()

        def tampered():
            changed = intact()
            now = look()
            changed += [what for what, objects in first.items() if length(now.get(what, ())) != length(objects)
                        or some(a is not b for a, b in pairs(now.get(what, ()), objects))]
            changed += [what for what in now if what not in first]
            if guard.report is not report:
                changed.append("the guard's report")
            if changed:
                report(TAMPERED, f"changed ({', '.join(changed)[:150]})")
    graded = (job.get("rule") or {}).get("graded", {})
    run = _case_runner(dict(_BUILTINS))
    for index, source in job["cells"]:
        current[0] = ["cell", index]
        emit({"unit": ["cell", index], "phase": "start"})
        error = None
        try:
            code = compile(source, f"<cell {index}>", "exec")
            _signal(_SIGALRM, _alarm)
            _setitimer(_ITIMER, job["cell_timeout"])
            try:
                exec(code, namespace)
            finally:
                _setitimer(_ITIMER, 0)
        except _BaseException as exc:  # SystemExit, KeyboardInterrupt and LabTimeout included
            error = error_text(exc)
        if guard is not None:
            tampered()
        emit({"unit": ["cell", index], "phase": "end", "error": error})
        current[0] = None
    for question, case, source in cases:
        current[0] = ["case", question, case]
        emit({"unit": ["case", question, case], "phase": "start"})
        if guard is not None:
            try:
                tampered()
                for name, how in check(graded.get(question, [])):
                    report(name, how)
            except _BaseException as exc:  # a hostile object made the check itself fail: that is a finding too
                report("the graded names", f"could not be checked ({error_text(exc)[:100]})")
        error, records = run(source, namespace, f"<{question} case {case}>", guard)
        emit({"unit": ["case", question, case], "phase": "end", "error": error, "records": records})
        current[0] = None
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except _BaseException:
            pass
    emit({"done": True})


if __name__ == "__main__":
    main(int(sys.argv[1]))

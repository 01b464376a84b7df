"""Inside the sandbox: what a lab's graded code may use from ``sazo_lite``, and the checks that enforce it.

A lab's rule (``rules.RULES``) names the library modules its graded cells may import and the
library objects (functions, classes, modules' contents) they may use; everything else in
``sazo_lite`` is off limits (``sazo_lite.course.labs`` itself, the grader's, is always allowed).
``Guard`` enforces a rule these ways; each finding is reported at once to the trusted parent,
which scores the question concerned 0 with the finding as the reason:

1. **imports**: ``import``/``from … import``/``importlib.import_module``/``__import__`` of a
   library module outside the rule, from the student's code, raise ``ImportError`` (and are reported);
2. **calls**: every forbidden library function and method is changed *in place*: its own code
   object is recompiled from the library's source with one first statement, a call of the
   guard's check, so there is no unguarded original anywhere (not behind ``__wrapped__``, a
   closure, a bound method, a ``functools.partial``, ``gc`` or a function rebuilt from its
   ``__code__``). A call whose nearest caller outside the library is the student's code (a cell,
   a function or class defined in one, code ``exec``-ed from it, a thread the student's code
   started, a process it forked) is reported; a caller counts as Python's, a package's or the
   library's only where its code is what the file it names holds (``_is_genuine``), so code compiled
   under such a file name is the student's; a library frame the student's or a test's code called counts as
   the caller only where its code names the function (``_names_callee``). Functions without source (``dataclass``-made
   ``__init__``) get a wrapper instead;
3. **definitions** (``check``, before each test case): a question's graded functions and classes
   must be defined in the notebook, must not inherit from a forbidden class, and what their code
   reaches (the student's helpers, closures, defaults, containers, instances' attributes,
   ``partial`` and bound-method parts) must not be a forbidden object or a copy of its code;
4. **loading the library again** (``importlib.util.module_from_spec``, a copied ``sys.modules``
   entry, ``exec`` of a library file's code) outside the guard's own import hook is refused (an
   audit hook), as is starting a program (``subprocess``, ``os.exec*``, ``os.system``,
   ``posix_spawn``; the worker also blocks ``execve`` in the kernel) and ``gc``'s object walks
   from the student's code;
5. the tests themselves (the test cases' own code) may use any library object their code names
   (``sazo_lite.variance.oracle_probs(x)``; a method by its class and its name); a forbidden object a case
   calls without naming it was put in its way by the student's code (a graded name rebound while the case
   runs, an entry of ``builtins``, a method of the student's objects) and is reported as the student's call.

The student's code runs in this process, so a submission set on it can still reach the guard
itself (through frames, or the closures of its hooks) and switch it off; ``intact`` and the worker's
``_witness`` (this module's code, the library functions the checks call, the report's functions)
notice the lasting changes. The trust model in ``labs/README.md`` says what holds.
"""
from __future__ import annotations

import _thread
import ast
import builtins
import dis
import functools
import gc
import importlib
import importlib.machinery
import importlib.util
import inspect
import io
import os
import sys
import threading
import types
import warnings

MIN_COPY = 12       # instructions: shorter library functions are too generic to call a copy
LIBRARY = "sazo_lite"
GRADER = "sazo_lite.course.labs"
_LIBRARY_DOT = LIBRARY + "."
LIBRARY_DIR = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))) + os.sep
GRADER_DIR = os.path.dirname(os.path.abspath(__file__)) + os.sep
_NEUTRAL_PREFIXES = tuple(sorted({p.rstrip("/") + "/" for p in (sys.prefix, sys.base_prefix, sys.exec_prefix) if p}))
_STDLIB_DIR = os.path.dirname(os.path.abspath(os.__file__)) + os.sep   # where a frozen module's source is
_read_bytes, _compile = io.open, compile   # held: a submission that rebinds them cannot feed the check a file
PLACEHOLDER = "@sazo-lab-guard-check@"
TAMPERED = "the grader's checks"          # a finding under this name counts for every question   # the constant the check's call is compiled with, then replaced
_LRU_CACHE = type(functools.lru_cache(None)(lambda: None))   # what @functools.lru_cache and @functools.cache make
PROGRAM_EVENTS = ("os.exec", "os.posix_spawn", "os.spawn", "os.system", "subprocess.Popen", "pty.spawn", "os.startfile")
WALK_EVENTS = ("gc.get_referrers", "gc.get_referents", "gc.get_objects")


class LabRuleError(PermissionError):
    """Graded code did what the lab's rule forbids where it cannot be reported and let go on."""


def _is_library_name(name) -> bool:
    return isinstance(name, str) and (name == LIBRARY or name.startswith(LIBRARY + ".")) \
        and not (name == GRADER or name.startswith(GRADER + "."))


def _is_library_file(filename) -> bool:
    return isinstance(filename, str) and filename.startswith(LIBRARY_DIR) and not filename.startswith(GRADER_DIR)


def _qualname(obj) -> str:
    module = getattr(obj, "__module__", None) or "?"
    return f"{module}.{getattr(obj, '__qualname__', getattr(obj, '__name__', '?'))}"


_LOCAL_OPS = ("LOAD_FAST", "STORE_FAST", "DELETE_FAST", "LOAD_DEREF", "STORE_DEREF", "LOAD_CLOSURE", "MAKE_CELL",
              "LOAD_CLASSDEREF")
_SKIP_OPS = ("RESUME", "NOP", "CACHE", "EXTENDED_ARG", "COPY_FREE_VARS")


def _fingerprint(code: types.CodeType) -> tuple:
    """What stays when a function is copied (docstring dropped, locals renamed): its instructions."""
    out = []
    for ins in dis.get_instructions(code):
        if ins.opname in _SKIP_OPS:
            continue
        if isinstance(ins.argval, types.CodeType):
            arg = _fingerprint(ins.argval)
        elif ins.opname.startswith(_LOCAL_OPS):
            arg = ins.arg
        elif "JUMP" in ins.opname or ins.opname in ("FOR_ITER", "SEND"):
            arg = None
        else:
            arg = repr(ins.argval)
        out.append(("LOAD_ATTR" if ins.opname == "LOAD_METHOD" else ins.opname, arg))  # compilers pick either
    return tuple(out)


def _shape(code: types.CodeType) -> tuple[tuple, tuple]:
    """(instructions with constants and names left out, the names in order): what stays when a copy is made
    with ``code.replace`` of its constants, names or file (or compiled again from the source elsewhere)."""
    ops, names = [], []
    for ins in dis.get_instructions(code):
        if ins.opname in _SKIP_OPS:
            continue
        if isinstance(ins.argval, types.CodeType):
            inner_ops, inner_names = _shape(ins.argval)
            ops.append(("CODE", inner_ops))
            names += inner_names
            continue
        if ins.opcode in dis.hasname:
            names.append(str(ins.argval))
            arg = None
        elif ins.opcode in dis.hasconst or "JUMP" in ins.opname or ins.opname in ("FOR_ITER", "SEND"):
            arg = None
        else:
            arg = ins.arg    # locals by number, operators, argument counts
        ops.append(("LOAD_ATTR" if ins.opname == "LOAD_METHOD" else ins.opname, arg))
    return tuple(ops), tuple(names)


def _genuine_module(module) -> bool:
    """A module Python or an installed package (or the library) loaded from its file, under its own name
    (not one the student built, wrote or registered in ``sys.modules`` by hand)."""
    name = getattr(module, "__name__", None)
    if not isinstance(name, str) or sys.modules.get(name) is not module or name == "__main__":
        return False
    origin = getattr(getattr(module, "__spec__", None), "origin", None)
    return origin in ("built-in", "frozen") or isinstance(origin, str) and \
        origin.startswith((*_NEUTRAL_PREFIXES, LIBRARY_DIR))


class _Preamble(ast.NodeTransformer):
    """Puts ``PLACEHOLDER()`` first in every function body (after its docstring), on the line of
    the statement it precedes (line numbers, so tracebacks, stay those of the source)."""

    def visit_FunctionDef(self, node):
        self.generic_visit(node)
        body = node.body
        at = 1 if body and isinstance(body[0], ast.Expr) and isinstance(getattr(body[0], "value", None), ast.Constant) \
            and isinstance(body[0].value.value, str) else 0
        where = body[min(at, len(body) - 1)]
        call = ast.Expr(ast.Call(ast.Constant(PLACEHOLDER), [], []))
        for piece in (call, call.value, call.value.func):
            ast.copy_location(piece, where)
        body.insert(at, call)
        return node

    visit_AsyncFunctionDef = visit_FunctionDef


class Guard:
    """Enforce one lab's rule on the student's code in ``namespace`` (see the module docstring).

    Args:
        modules: library modules graded code may import (e.g. ``"sazo_lite.course.problems"``).
        names: library objects it may use: qualified names of functions, classes (their methods
            and bases come with them) or modules (all they define).
        namespace: the dict the student's cells run in.
        report: ``report(name, how, unit)`` is called once per finding (the worker sends it to the
            parent); ``unit`` None: the unit running now; a call on a student's thread is also reported
            for the unit that started the thread.
        unit: returns the unit running now (a thread the student starts is charged to it).
    """

    def __init__(self, modules, names, namespace: dict, report, unit=None):
        self.modules = {LIBRARY, *modules}
        self.names = set(names)
        self.namespace, self.report = namespace, report
        self.unit = unit or (lambda: None)
        self.trusted: dict = {}            # id -> code object of the running test case (it may use anything)
        self.trusted_names: frozenset = frozenset()   # the names that case's code holds (``_named_by_test``)
        self.owners: dict = {}             # id(guarded code or wrapper) -> the library class it is a method of
        self.class_names: dict = {}        # id(library class) -> its name, as loaded (the student may rename it)
        self.allowed_ids: set[int] = set()
        self.allowed_modules: set[str] = set()
        self.forbidden: dict[int, str] = {}  # id(forbidden function or class) -> qualified name
        self.fingerprints: dict = {}       # of the library's own code (before the check went in) -> name
        self.shapes: dict = {}             # _shape instructions of the library's code (and guarded code) -> [(names, name)]
        self._copies: dict = {}            # id(code) -> (code, the library function it copies or None)
        self.code_names: dict[int, str] = {}  # id(instrumented code object) -> qualified name
        self.instrumented: list = []       # (function, its instrumented code): what intact() checks
        self.wrappers: dict[int, tuple] = {}  # id(wrapper) -> (original, name), for code without source
        self.pid = os.getpid()
        self._keep: list = []              # keeps ids stable
        self._seen: set = set()
        self._tables: dict = {}            # library file -> {(qualname, first line): instrumented code}
        self._library_globals: set[int] = set()  # ids of the library modules' globals
        self._loading = 0                  # > 0 while the guard's own loader runs a library module
        self._installed = False
        self._roots: set[int] = set()      # code of the function a student-started thread runs first
        self._thread_units: dict = {}
        self._originals: dict = {}
        self._made: set[int] = set()       # ids of library code: loaded before the student's, or compiled by the guard
        self._genuine: dict = {}           # id(code) -> (code, whether it is what its file holds)
        self._aliases: dict = {}           # (id(library module's globals), name) -> the function it held when loaded
        self._named: dict = {}             # (id(library code), id(callee's code), its name) -> (code, callee's, named)
        self._files: dict = {}             # real file -> {(qualname, first line): {_signature}} (None: unreadable)

    # -- what is allowed -----------------------------------------------------------------
    def _resolve_allowed(self) -> None:
        for name in sorted(self.names):
            obj = None
            parts = name.split(".")
            for cut in range(len(parts), 0, -1):
                module = sys.modules.get(".".join(parts[:cut]))
                if module is None:
                    try:
                        module = importlib.import_module(".".join(parts[:cut]))
                    except ImportError:
                        continue
                obj = module
                try:
                    for attr in parts[cut:]:
                        obj = getattr(obj, attr)
                except AttributeError:
                    obj = None
                break
            if obj is None:
                raise ValueError(f"Invalid lab rule: {name!r} names nothing in the library")
            if isinstance(obj, types.ModuleType):
                self.allowed_modules.add(obj.__name__)
            elif isinstance(obj, type):
                for klass in obj.__mro__:
                    if _is_library_name(klass.__module__):
                        self._allow(klass)
            else:
                self._allow(obj)

    def _allow(self, obj) -> None:
        self._keep.append(obj)
        self.allowed_ids.add(id(obj))
        if isinstance(obj, type):
            self.class_names[id(obj)] = obj.__name__
        for inner in _unwrapped(obj):
            self.allowed_ids.add(id(inner))
            self._keep.append(inner)
        if isinstance(obj, type):
            for value in vars(obj).values():
                for member in _members(value):
                    for inner in (member, *_unwrapped(member)):
                        self.allowed_ids.add(id(inner))
                        self._keep.append(inner)

    def is_allowed(self, obj) -> bool:
        if id(obj) in self.allowed_ids:
            return True
        module = getattr(obj, "__module__", None)
        return isinstance(module, str) and module in self.allowed_modules

    # -- installing the checks ------------------------------------------------------------
    def install(self) -> None:
        """Guard every loaded library module in place; guard later imports, ``__import__``, threads,
        forks and the audit events of loading library code and starting programs."""
        self._resolve_allowed()
        for name in sorted(sys.modules):
            module = sys.modules.get(name)
            if _is_library_name(name) and isinstance(module, types.ModuleType):
                self.wrap_module(module)
        sys.meta_path.insert(0, _Finder(self))
        original_import, original_import_module = builtins.__import__, importlib.import_module

        def guarded_import(name, globals=None, locals=None, fromlist=(), level=0):
            if level == 0 and self._from_student(sys._getframe(1), verify=False):
                self._check_import(name, fromlist)
            return original_import(name, globals, locals, fromlist, level)

        def guarded_import_module(name, package=None):
            if self._from_student(sys._getframe(1), verify=False):
                absolute = importlib.util.resolve_name(name, package) if name.startswith(".") else name
                self._check_import(absolute, ())
            return original_import_module(name, package)

        builtins.__import__ = guarded_import
        importlib.import_module = guarded_import_module
        self._guard_threads()
        try:  # multiprocessing's spawn and forkserver start Python through it, with no audit event
            import _posixsubprocess

            def fork_exec(*args, **kwargs):
                raise LabRuleError("graded cells may not start programs (a new Python included); the grader "
                                   "runs Python only, in this process and its forks")

            _posixsubprocess.fork_exec = fork_exec
        except ImportError:
            pass
        self._originals.update(import_=guarded_import, import_module=guarded_import_module,
                               finder=sys.meta_path[0], start=_thread.start_new_thread)
        sys.addaudithook(self._audit)
        self._installed = True

    def _check_import(self, name: str, fromlist) -> None:
        wanted = [name] + [f"{name}.{item}" for item in (fromlist or ()) if isinstance(item, str)]
        for module in wanted:
            if _is_library_name(module) and module not in self.modules and (module in sys.modules or module == name):
                if module != name and not isinstance(sys.modules.get(module), types.ModuleType):
                    continue  # `from pkg import name` of a function, not a module: the call checks cover it
                self._found(module, "imported")
                raise ImportError(f"{module} may not be imported in this lab's graded cells (see the lab's rule "
                                  f"at the top of the notebook)")

    def wrap_module(self, module: types.ModuleType) -> None:
        """Guard the forbidden functions and the methods of forbidden classes defined in ``module``."""
        self._library_globals.add(id(module.__dict__))
        self._keep.append(module.__dict__)
        file = getattr(module, "__file__", None)
        if isinstance(file, str) and file.endswith(".py"):   # what ``_is_genuine`` compares its code with, read
            self._file_table(file)                           # now: a later edit of the file is not what runs
        for attr, value in list(vars(module).items()):
            if getattr(value, "__module__", None) != module.__name__ or id(value) in self._seen:
                continue
            self._seen.add(id(value))
            self._keep.append(value)
            if isinstance(value, type):
                self.class_names[id(value)] = value.__name__   # as loaded: what a test case names it by
                if not self.is_allowed(value):
                    self._wrap_class(value)
            elif callable(value) and not self.is_allowed(value):
                name = _qualname(value)
                self.forbidden[id(value)] = name
                for fn in _unwrapped(value):
                    if not self.is_allowed(fn):
                        self._guard_function(fn, name, module)
            self._loaded(vars(module).get(attr))   # after guarding: the code that runs now, never an unguarded original
        for attr, value in list(vars(module).items()):   # its names for its functions, as loaded (``_names_callee``)
            if type(value) is types.FunctionType:   # the function: one imported from a module guarded later
                self._aliases[(id(module.__dict__), attr)] = value   # gets its checked code then

    def _loaded(self, value) -> None:
        """The code of a function or class the library defines, taken as genuine by identity (it was loaded before
        the student's code ran, or by the guard's own import hook), whatever its file says later."""
        members = [m for v in vars(value).values() for m in _members(v)] if isinstance(value, type) else [value]
        for member in members:
            for fn in (member, *_unwrapped(member)):
                if isinstance(fn, types.FunctionType):
                    self._made.update(id(code) for code in _codes(fn.__code__))
                    self._keep.append(fn.__code__)   # kept: an id is the object's only while it lives

    def _guard_function(self, fn: types.FunctionType, name: str, module=None, owner: type | None = None) -> None:
        """Put the check into ``fn``'s own code (or, without source, a wrapper in its place); ``owner``: the class
        ``fn`` is a method of."""
        if id(fn) in self.code_names or getattr(fn, "__sazo_guarded__", False):
            return
        self.forbidden[id(fn)] = name
        self._keep.append(fn)
        self.fingerprints[_fingerprint(fn.__code__)] = name
        self._add_shape(fn.__code__, name)
        code = self._instrumented(fn.__code__)
        if code is not None:
            self._add_shape(code, name)   # a copy of the guarded code with the check swapped for a no-op
            fn.__code__ = code
            self.code_names[id(code)] = name
            self.owners[id(code)] = owner
            self.instrumented.append((fn, code))
            return
        if module is not None:  # no source to recompile: a wrapper where the module keeps it
            for attr, value in list(vars(module).items()):
                if value is fn:
                    setattr(module, attr, self._wrapper(fn, name, fn.__qualname__))

    def _add_shape(self, code: types.CodeType, name: str) -> None:
        ops, names = _shape(code)
        if len(ops) >= MIN_COPY:
            self.shapes.setdefault(ops, []).append((names, name))

    def copy_of(self, code: types.CodeType) -> str | None:
        """The forbidden library function ``code`` is a copy of (None: none): the same instructions, whatever
        its constants and file, and at least half the same names (renaming a few does not hide it)."""
        known = self._copies.get(id(code))
        if known is not None and known[0] is code:
            return known[1]
        found = None
        ops, names = _shape(code)
        for library_names, name in self.shapes.get(ops, ()) if len(ops) >= MIN_COPY else ():
            same = sum(a == b for a, b in zip(names, library_names))
            if 2 * same >= len(library_names):
                found = name
                break
        self._copies[id(code)] = (code, found)
        return found

    def _instrumented(self, code: types.CodeType) -> types.CodeType | None:
        table = self._table(code.co_filename)
        new = (table or {}).get((code.co_qualname, code.co_firstlineno))
        if new is None or new.co_freevars != code.co_freevars or new.co_varnames != code.co_varnames \
                or new.co_argcount != code.co_argcount or new.co_kwonlyargcount != code.co_kwonlyargcount:
            return None  # the file on disk is not what was loaded (or a lambda, which has no statements)
        return new if self._check in new.co_consts else None

    def _table(self, filename: str) -> dict | None:
        if filename in self._tables:
            return self._tables[filename]
        table = None
        if _is_library_file(filename) and filename.endswith(".py"):
            try:
                with open(filename, encoding="utf-8") as handle:
                    tree = ast.parse(handle.read(), filename)
                tree = ast.fix_missing_locations(_Preamble().visit(tree))
                with warnings.catch_warnings():
                    warnings.simplefilter("ignore")  # "'str' object is not callable": the placeholder, replaced below
                    module_code = compile(tree, filename, "exec", dont_inherit=True)
                table = {}
                self._finish(module_code, table)
            except (OSError, SyntaxError, ValueError, UnicodeDecodeError):
                table = None
        self._tables[filename] = table
        return table

    def _finish(self, code: types.CodeType, table: dict) -> types.CodeType:
        consts = tuple(self._check if type(c) is str and c == PLACEHOLDER else
                       self._finish(c, table) if isinstance(c, types.CodeType) else c for c in code.co_consts)
        new = code.replace(co_consts=consts)
        table[(new.co_qualname, new.co_firstlineno)] = new
        self._keep.append(new)
        self._made.add(id(new))
        return new

    def _check(self) -> None:
        """The first statement of every guarded library function: report a call from the student's code."""
        frame = sys._getframe(1)
        caller, code = frame.f_back, frame.f_code
        name = self.code_names.get(id(code))   # None: a copy of guarded code, which no library code names
        if caller is None or (id(caller.f_globals) in self._library_globals and _is_library_file(caller.f_code.co_filename)
                              and self._names_callee(caller, code, None if name else "") and self._is_genuine(caller.f_code)):
            return  # the library calling itself (most calls): no walk
        # what the running test case must name for the call to be its own: a copy is never the library's own
        callee = ("", None) if name is None else (code.co_qualname, self.owners.get(id(code)))
        if name is None:   # only guarded code holds the check: this is a copy of it (code.replace, FunctionType)
            name = self.copy_of(code) or f"{LIBRARY} (a copy of {code.co_qualname})"
        if self._from_student(caller, callee=callee, target=code):
            self._found(name, "called")

    def _wrapper(self, fn, name: str, qualname: str, owner: type | None = None):
        """For code without source: a stand-in that checks, then calls ``fn`` (no ``__wrapped__``); ``qualname``:
        its name within its module, ``owner``: its class."""
        guard, callee = self, (qualname, owner)

        def guarded(*args, **kwargs):
            if guard._from_student(sys._getframe(1), callee=callee):
                guard._found(name, "called")
            return fn(*args, **kwargs)

        for attr in ("__name__", "__qualname__", "__doc__", "__module__"):
            with _suppress():
                setattr(guarded, attr, getattr(fn, attr))
        guarded.__sazo_guarded__ = True
        self.wrappers[id(guarded)] = (fn, name)
        self.forbidden[id(guarded)] = name
        self._keep.append(guarded)
        return guarded

    def _wrap_class(self, klass: type) -> None:
        self.forbidden[id(klass)] = _qualname(klass)
        self.class_names[id(klass)] = klass.__name__
        for attr, value in list(vars(klass).items()):
            name = f"{_qualname(klass)}.{attr}"
            for member in _members(value) or ([value] if callable(value) and hasattr(value, "__wrapped__") else []):
                for fn in _unwrapped(member):
                    self._guard_function(fn, name, owner=klass)
                    if fn is value and id(fn) not in self.code_names:  # no source: a wrapper in the class
                        setattr(klass, attr, self._wrapper(fn, name, f"{klass.__qualname__}.{attr}", klass))
        if "__init__" not in vars(klass):  # building one from the student's code is a use, inherited __init__ or not
            inherited = klass.__init__
            if isinstance(inherited, types.FunctionType):
                klass.__init__ = self._wrapper(inherited, f"{_qualname(klass)}.__init__", f"{klass.__qualname__}.__init__",
                                               klass)

    # -- threads and forks -------------------------------------------------------------------
    def _guard_threads(self) -> None:
        """Threads the student's code starts run under a root the caller walk recognises (they are the student's)."""
        guard, start = self, _thread.start_new_thread

        def student_thread(function, args, kwargs, unit):
            guard._thread_units[_thread.get_ident()] = unit
            try:
                return function(*args, **kwargs)
            finally:
                guard._thread_units.pop(_thread.get_ident(), None)

        def start_new_thread(function, args, kwargs=None):
            if guard._from_student(sys._getframe(1), verify=False):
                unit = guard._thread_units.get(_thread.get_ident(), guard.unit())
                return start(student_thread, (function, tuple(args), dict(kwargs or {}), unit))
            return start(function, args, *([kwargs] if kwargs is not None else []))

        self._roots.add(id(student_thread.__code__))
        self._keep.append(student_thread)
        _thread.start_new_thread = start_new_thread
        threading._start_new_thread = start_new_thread

    # -- who is calling --------------------------------------------------------------------
    def _from_student(self, frame, verify: bool = True, callee: tuple | None = None, target=None) -> bool:
        """Whether the nearest caller that is not the library, Python or an installed package is the student's
        (or the bottom of a thread the student's code started).

        ``callee``: the forbidden library function being called, as (its name within its module, the class it is
        a method of or None). Where the nearest such caller is the running test case, the call is the test's only if
        the case names that function (``_named_by_test``);
        else the student's code put it where the case looks (a graded name rebound while the case runs, an entry
        of ``builtins``, an attribute of the student's objects), and the call is the student's.

        Trusted code is looked up by identity: an equal copy made by the submission is not the test's own. With
        ``verify``, the frames taken as Python's, a package's or the library's must hold what their files hold
        (``_is_genuine``); imports and thread starts skip that (an import chain walks through hundreds of files,
        and what is imported or started is checked when it is called).
        """
        namespace, trusted, modules, roots = self.namespace, self.trusted, sys.modules, self._roots
        passed = [] if verify else None   # the code of the frames taken as Python's: checked before a "no"
        library_below = False   # a library frame that does not name ``callee`` was passed
        for _ in range(300):
            if frame is None:
                return not self._all_genuine(passed)
            code = frame.f_code
            if id(code) in trusted:
                if callee is not None and not self._named_by_test(callee):
                    return True
                return not self._all_genuine(passed)
            if id(code) in roots:
                return True
            globals_ = frame.f_globals
            if globals_ is namespace:
                return True
            filename = code.co_filename
            if filename.startswith(LIBRARY_DIR):  # the library or the grader, if the frame is its module's own
                name = globals_.get("__name__")
                module = modules.get(name) if isinstance(name, str) else None
                if module is not None and getattr(module, "__dict__", None) is globals_ and \
                        (_is_library_name(name) or filename.startswith(GRADER_DIR)):
                    if callee is None or library_below or self._names_callee(frame, target, callee[0]):
                        # the library (or the grader) calling itself, if that frame and those above are what they say
                        return passed is not None and not self._all_genuine([*passed, code])
                    # a frame that does not name it, called by the student's or a test's code: C code called it while
                    # the frame ran, or the student's code put it where the frame looks (the library's own calls
                    # through stored callbacks are made a library call or more below the student's)
                    library_below = True
                    if passed is not None:
                        passed.append(code)
                    frame = frame.f_back
                    continue
            if not (filename.startswith(_NEUTRAL_PREFIXES) or filename.startswith("<frozen ")):
                return True   # code from a cell, an exec-ed string or a file the submission wrote
            if passed is not None:
                passed.append(code)
            frame = frame.f_back
        return not self._all_genuine(passed)

    def _names_callee(self, frame, target: types.CodeType | None, qualname: str | None = None) -> bool:
        """Whether the library code running in ``frame`` names the function called (``target``, its code, None for
        one without source; ``qualname``: its name, "" for a copy of guarded code): its name, or a global its module bound to it when loaded
        (``_paired = paired_vectors``); a dunder, which Python calls implicitly, needs none. Only then is it the
        library calling itself: a call that C code makes while such a frame runs (an object's ``__del__`` as the
        student's method returns into it, a function the student grafted where the frame calls another name) is
        not that frame's own (``_from_student``)."""
        code = frame.f_code
        key = (id(code), id(target)) if target is not None else (id(code), qualname)
        known = self._named.get(key)
        if known is not None and known[0] is code and known[1] is target:
            return known[2]
        named = self._named_here(frame, target, target.co_qualname if qualname is None else qualname)
        self._named[key] = (code, target, named)
        return named

    def _named_here(self, frame, target: types.CodeType | None, qualname: str) -> bool:
        code = frame.f_code
        if code.co_filename.startswith(GRADER_DIR):
            return True   # the grader's own code (the wrappers of code without source call what they wrap as ``fn``)
        last = qualname.rpartition(".")[2]
        names = {*code.co_names, *code.co_varnames, *code.co_cellvars, *code.co_freevars}
        # a dunder is called implicitly; a private name is mangled in a class body (``self.__f`` reads ``_Class__f``)
        named = (len(last) > 4 and last.startswith("__") and last.endswith("__")) or (bool(last) and (
            last in names or (last.startswith("__") and any(n.endswith(last) for n in names))))
        if not named and target is not None:   # the module's names as the guard loaded it: the student may add some
            where, aliases = id(frame.f_globals), self._aliases
            named = any(getattr(aliases.get((where, n)), "__code__", None) is target for n in code.co_names)
        return named

    def _all_genuine(self, codes) -> bool:
        return codes is None or all(self._is_genuine(code) for code in codes)

    def _is_genuine(self, code: types.CodeType) -> bool:
        """Whether ``code`` is what the file it names holds (or the guard's own instrumented version of it): a
        file name is only a string, and code the submission compiled under one of Python's, a package's or the
        library's (``compile(source, sys.prefix + "/x.py", "exec")``, ``code.replace``) must not pass for theirs.
        Compared by instructions, names and constants with the file compiled again (once per file)."""
        known = self._genuine.get(id(code))
        if known is not None and known[0] is code:
            return known[1]
        if id(code) in self._made:
            genuine = True
        else:
            table = self._file_table(_source_file(code.co_filename))
            genuine = table is not None and _signature(code) in table.get((code.co_qualname, code.co_firstlineno), ())
        self._genuine[id(code)] = (code, genuine)
        return genuine

    def _file_table(self, path: str | None) -> dict | None:
        if path is None or not path.startswith((*_NEUTRAL_PREFIXES, LIBRARY_DIR)):
            return None
        if path not in self._files:
            table = None
            try:
                with _read_bytes(path, "rb") as handle:
                    module = _compile(handle.read(), path, "exec", dont_inherit=True)
                table = {}
                for code in _codes(module):
                    table.setdefault((code.co_qualname, code.co_firstlineno), set()).add(_signature(code))
            except (OSError, SyntaxError, ValueError, TypeError, RecursionError, MemoryError):
                table = None
            self._files[path] = table
        return self._files[path]

    def trust(self, code: types.CodeType | None) -> None:
        """Let ``code`` (a test case's compiled source, its nested code included) use anything it names; None:
        nothing."""
        self.trusted = {} if code is None else {id(c): c for c in _codes(code)}
        self.trusted_names = frozenset(part for c in self.trusted.values() for name in c.co_names
                                       for part in name.split("."))

    def _named_by_test(self, callee: tuple) -> bool:
        """Whether the running test case's code names the library function ``callee`` (its name within its module
        and the class it is a method of): ``oracle_probs`` for ``sazo_lite.variance.oracle_probs``; for a method,
        the method's name (a dunder such as ``__init__`` needs none) and its class or a library class that inherits
        it (``SAZOSampler(4).sample(2)``, ``sample`` defined on a base); as an attribute, a global or an imported name.

        The case's names are its own code's, and a class's name is the one the guard saw before the student's code
        ran: a forbidden function the case reaches through a name the student's code can rebind (``lab2_oracle_probs``,
        ``_s.update`` of an instance of the student's class, a class the student made or renamed) is not one of them.
        """
        qualname, owner = callee
        parts = [p for p in qualname.split(".") if p != "<locals>"] or [""]
        first, last, names = parts[0], parts[-1], self.trusted_names
        if not (last in names or (len(parts) > 1 and last.startswith("__") and last.endswith("__"))):
            return False
        if first in names:
            return True
        todo, seen = [owner] if isinstance(owner, type) else [], set()
        while todo:
            for sub in type.__subclasses__(todo.pop()):
                known = self.class_names.get(id(sub))
                if known is None or id(sub) in seen:
                    continue   # not a library class the guard saw loaded
                if known in names:
                    return True
                seen.add(id(sub))
                todo.append(sub)
        return False

    def _found(self, name: str, how: str) -> None:
        started = self._thread_units.get(_thread.get_ident())  # a student thread: the unit that started it too
        try:
            self.report(name, how, None)  # the unit running now (a pool's thread serves many)
            if started is not None and started != self.unit():
                self.report(name, how, started)
            reported = True
        except Exception:
            reported = False
        if os.getpid() != self.pid or not reported:  # a forked child (its report may not arrive): no result either
            raise LabRuleError(f"{name}: this lab does not allow it in graded code ({how}, in a process the "
                               f"notebook started)")

    # -- audit events: loading library code outside the guard, programs, object walks ----------
    def _audit(self, event: str, args) -> None:
        if event == "exec":
            code = args[0] if args else None
            if self._loading or not isinstance(code, types.CodeType) or not _is_library_file(code.co_filename):
                return
            if code.co_name == "<module>" and self._from_student(sys._getframe(1)):
                self._found(code.co_filename.removeprefix(LIBRARY_DIR), "loaded again outside the grader's import hook")
                raise ImportError("loading the library's code again in graded cells is not allowed")
        elif event.startswith(PROGRAM_EVENTS):
            if self._installed:
                raise LabRuleError(f"graded cells may not start programs ({event}); the grader runs Python only")
        elif event in WALK_EVENTS:
            if self._from_student(sys._getframe(1)):
                raise LabRuleError(f"graded cells may not walk the interpreter's objects ({event})")

    def intact(self) -> list[str]:
        """What the student's code changed of the checks (empty: nothing): guarded code swapped back,
        the import hooks or the thread hook replaced."""
        changed = [_qualname(fn) for fn, code in self.instrumented if fn.__code__ is not code][:5]
        if builtins.__import__ is not self._originals.get("import_"):
            changed.append("builtins.__import__")
        if importlib.import_module is not self._originals.get("import_module"):
            changed.append("importlib.import_module")
        if self._originals.get("finder") not in sys.meta_path:
            changed.append("sys.meta_path")
        if _thread.start_new_thread is not self._originals.get("start") or \
                threading._start_new_thread is not self._originals.get("start"):
            changed.append("_thread.start_new_thread")
        return changed

    # -- definitions, before each test case -------------------------------------------------
    def check(self, graded) -> list[tuple[str, str]]:
        """Findings ``(name, how)`` for a question's graded names. A name the notebook does not bind is looked up in
        ``builtins``, where the test cases find it (``builtins.lab2_f = ...``); one missing there too is left to the
        tests."""
        findings: list[tuple[str, str]] = []
        visited: set[int] = set()
        budget = [20_000]   # objects walked per check: a huge structure cannot stall it
        for name in graded:
            space = self.namespace if name in self.namespace else vars(builtins)
            if name not in space:
                continue
            obj = self._undecorated(space[name], name, findings)
            if isinstance(obj, types.FunctionType) or isinstance(obj, type) or callable(obj):
                if not self._defined_here(obj):
                    findings.append((self._describe(obj), f"{name} is not defined in your notebook"))
                    continue
            self._inspect(obj, name, findings, visited, 0, budget)
        return findings

    def _undecorated(self, obj, name: str, findings: list):
        """The function under the decorators Python or a package put on it (``@torch.no_grad()``,
        ``@torch.inference_mode()``, ``@functools.lru_cache``): what a student defined in a cell and decorated is
        checked as their own. A wrapper counts as a decorator's only where its code is what Python's or the
        package's file holds (not the library's); a forbidden object it holds (``torch.no_grad()(library function)``
        with ``__wrapped__`` pointed elsewhere) is a finding."""
        for _ in range(10):
            if type(obj) is types.FunctionType:
                code = obj.__code__
                if not (code.co_filename.startswith(_NEUTRAL_PREFIXES) and not _is_library_file(code.co_filename)
                        and self._is_genuine(code)):
                    return obj
                held = [cell.cell_contents for cell in (obj.__closure__ or ()) if _has_contents(cell)]
                held += list(obj.__defaults__ or ())
            elif type(obj) is _LRU_CACHE:
                held = []
            else:
                return obj
            inner = vars(obj).get("__wrapped__")
            if inner is None:
                return obj
            findings += [(self._describe(v), f"{name} uses it") for v in held if v is not inner and self._is_forbidden(v)]
            obj = inner
        return obj

    def _defined_here(self, obj) -> bool:
        if isinstance(obj, types.FunctionType):
            return obj.__code__.co_filename.startswith("<cell ") and obj.__globals__ is self.namespace
        if isinstance(obj, type):
            return obj.__module__ == self.namespace.get("__name__")
        if type(obj) is functools.partial:   # functools.partial(a function of yours, ...): its parts are inspected
            return self._defined_here(obj.func)
        # a value, or an object of a class defined in the notebook (its class and attributes are inspected)
        return not callable(obj) or type(obj).__module__ == self.namespace.get("__name__")

    def _describe(self, obj) -> str:
        if id(obj) in self.forbidden:
            return self.forbidden[id(obj)]
        if isinstance(obj, types.FunctionType) and id(obj.__code__) in self.code_names:
            return self.code_names[id(obj.__code__)]
        if isinstance(obj, functools.partial):
            return self._describe(obj.func)
        return _qualname(obj)

    def _inspect(self, obj, where: str, findings, visited, depth, budget) -> None:
        if depth > 8 or id(obj) in visited or budget[0] <= 0:
            return
        visited.add(id(obj))
        budget[0] -= 1
        if isinstance(obj, type):
            for base in obj.__mro__[1:]:
                if self._is_forbidden(base):
                    findings.append((_qualname(base), f"{where} inherits from it"))
            for value in list(vars(obj).values()):
                for member in _members(value):
                    if isinstance(member, types.FunctionType):
                        self._inspect(member, where, findings, visited, depth + 1, budget)
                if not _members(value):
                    self._inspect_value(value, where, set(), findings, visited, depth + 1, budget)
            return
        if isinstance(obj, types.FunctionType):
            if obj.__globals__ is not self.namespace or not obj.__code__.co_filename.startswith("<cell "):
                if self._is_forbidden(obj):
                    findings.append((self._describe(obj), f"{where} uses it"))
                    return
                inner = self._undecorated(obj, where, findings)   # a method of the student's under @torch.no_grad()
                if inner is not obj:
                    self._inspect(inner, where, findings, visited, depth + 1, budget)
                return
            held = list(obj.__defaults__ or ()) + list((obj.__kwdefaults__ or {}).values())
            held += [cell.cell_contents for cell in (obj.__closure__ or ()) if _has_contents(cell)]
            held += list(vars(obj).values())   # attributes set on the function itself
            for code in _codes(obj.__code__):
                copied = self.copy_of(code)
                if copied:
                    findings.append((copied, f"{where} is a copy of its code"))
                globals_used, attributes = _names(code)
                roots = self._modules_named(code)
                for name in globals_used:
                    if name in obj.__globals__:
                        roots.append((name, obj.__globals__[name]))
                    elif hasattr(builtins, name):
                        roots.append((name, getattr(builtins, name)))
                for name, value in roots + [("a default or closure value", v) for v in held]:
                    self._inspect_value(value, where, attributes, findings, visited, depth, budget)
            return
        self._inspect_value(obj, where, set(), findings, visited, depth, budget)

    @staticmethod
    def _modules_named(code: types.CodeType) -> list:
        """Modules in ``sys.modules`` that ``code`` imports or names in a string (``sys.modules['m']``,
        ``importlib.import_module('m')``): the student may have registered one holding a library function."""
        wanted = {ins.argval for ins in dis.get_instructions(code) if ins.opname == "IMPORT_NAME"}
        wanted |= {c for c in code.co_consts if type(c) is str and 0 < len(c) < 200}
        return [(name, sys.modules[name]) for name in sorted(wanted) if name != "__main__" and name in sys.modules]

    def _inspect_value(self, value, where, attributes, findings, visited, depth, budget) -> None:
        """A value the student's code can reach: forbidden itself, or leading to forbidden objects (its parts,
        its attributes, or the attributes its code names of a library module or class)."""
        if budget[0] <= 0 or depth > 8:
            return
        if self._is_forbidden(value):
            findings.append((self._describe(value), f"{where} uses it"))
            return
        if isinstance(value, types.FunctionType) or isinstance(value, type) and value.__module__ == self.namespace.get("__name__"):
            self._inspect(value, where, findings, visited, depth + 1, budget)
            return
        if id(value) in visited:
            return
        parts = _parts(value)
        if parts is not None:
            visited.add(id(value))
            budget[0] -= 1
            for part in parts[:1000]:
                self._inspect_value(part, where, attributes, findings, visited, depth + 1, budget)
            if not _library_container(value):
                return
        # a library module or class reached from the student's code: follow the attribute names it uses
        frontier = [value] if _library_container(value) else []
        reached = {id(value)}
        while frontier:
            current = frontier.pop()
            if isinstance(current, types.ModuleType) and _is_library_name(current.__name__) \
                    and current.__name__ not in self.modules:
                findings.append((current.__name__, f"{where} uses this module"))
            for attr in attributes:
                try:
                    target = inspect.getattr_static(current, attr)
                except AttributeError:
                    continue
                for member in _members(target) or [target]:
                    if id(member) in reached:
                        continue
                    reached.add(id(member))
                    if self._is_forbidden(member):
                        findings.append((self._describe(member), f"{where} uses it"))
                    elif _library_container(member):
                        frontier.append(member)

    def _is_forbidden(self, obj) -> bool:
        if id(obj) in self.forbidden:
            return True
        if isinstance(obj, types.FunctionType):
            code = obj.__code__
            if id(code) in self.code_names:   # a function rebuilt from a guarded one's code
                return True
            if not self.is_allowed(obj) and id(obj) not in self.allowed_ids:
                return self.copy_of(code) is not None   # a copy of the library's code, from any file or none
            return False
        if isinstance(obj, (types.MethodType, functools.partial)):
            return self._is_forbidden(obj.__func__ if isinstance(obj, types.MethodType) else obj.func)
        klass = type(obj)
        return _is_library_name(getattr(klass, "__module__", None)) and id(klass) in self.forbidden


class _Finder:
    """A meta-path finder that guards library modules imported (or reloaded) after ``install``."""

    def __init__(self, guard: Guard):
        self.guard = guard

    def find_spec(self, name, path=None, target=None):
        if not _is_library_name(name):
            return None
        spec = importlib.machinery.PathFinder.find_spec(name, path)
        if spec is not None and spec.loader is not None:
            spec.loader = _Loader(spec.loader, self.guard)
        return spec


class _Loader:
    def __init__(self, inner, guard: Guard):
        self.inner, self.guard = inner, guard

    def create_module(self, spec):
        return self.inner.create_module(spec)

    def exec_module(self, module):
        self.guard._loading += 1
        try:
            self.inner.exec_module(module)
        finally:
            self.guard._loading -= 1
        self.guard.wrap_module(module)

    def __getattr__(self, name):
        return getattr(self.inner, name)


def _members(value) -> list:
    """The functions behind a class attribute (function, static/class method, property)."""
    if isinstance(value, types.FunctionType):
        return [value]
    if isinstance(value, (staticmethod, classmethod)):
        return [value.__func__]
    if isinstance(value, property):
        return [f for f in (value.fget, value.fset, value.fdel) if f is not None]
    return []


def _library_container(value) -> bool:
    if isinstance(value, types.ModuleType):
        return _is_library_name(value.__name__)
    if isinstance(value, type):
        return _is_library_name(value.__module__)
    return False


def _has_contents(cell) -> bool:
    try:
        cell.cell_contents
    except ValueError:
        return False
    return True


def _source_file(filename: str) -> str | None:
    """The file a code object's file name stands for (a frozen module's: its source in the standard library)."""
    if filename.startswith("<frozen ") and filename.endswith(">"):
        return _STDLIB_DIR + filename[8:-1].replace(".", os.sep) + ".py"
    return filename


def _signature(code: types.CodeType) -> tuple:
    """What a code object does, as compiled from its file: instructions, names and constants (nested code by
    name: it runs in frames of its own; sets and tuples of constants in any order, as frozen modules keep them)."""
    def constant(value):
        if isinstance(value, types.CodeType):
            return ("code", value.co_qualname)
        if type(value) in (tuple, frozenset):
            return ("collection", tuple(sorted(repr(v) for v in value)))
        return (type(value).__name__, repr(value))

    return (code.co_code, code.co_names, code.co_varnames, code.co_freevars, code.co_cellvars,
            tuple(constant(c) for c in code.co_consts))


def _codes(code: types.CodeType):
    """A code object and the ones nested in it (lambdas, comprehensions, inner functions)."""
    yield code
    for const in code.co_consts:
        if isinstance(const, types.CodeType):
            yield from _codes(const)


def _names(code: types.CodeType) -> tuple[set, set]:
    """(global names loaded, attribute and imported names) of one code object."""
    globals_used, attributes = set(), set()
    for instruction in dis.get_instructions(code):
        if instruction.opname in ("LOAD_GLOBAL", "LOAD_NAME"):
            globals_used.add(instruction.argval)
        elif instruction.opname in ("LOAD_ATTR", "LOAD_METHOD", "IMPORT_NAME", "IMPORT_FROM", "STORE_ATTR"):
            for part in str(instruction.argval).split("."):
                attributes.add(part)
    return globals_used, attributes


def _unwrapped(obj) -> list:
    """The library functions behind a callable: itself, or what its ``__wrapped__`` chain ends in."""
    out, seen = [], set()
    while obj is not None and id(obj) not in seen and len(seen) < 20:
        seen.add(id(obj))
        if isinstance(obj, types.FunctionType) and _is_library_file(obj.__code__.co_filename):
            out.append(obj)
        try:
            obj = inspect.getattr_static(obj, "__wrapped__")
        except AttributeError:
            obj = None
        if isinstance(obj, (staticmethod, classmethod)):
            obj = obj.__func__
    return out


class _suppress:
    def __enter__(self):
        return self

    def __exit__(self, *exc):
        return exc[0] is not None and issubclass(exc[0], Exception)


_SCALARS = (str, bytes, bytearray, int, float, complex, bool, type(None), range, slice)


def _parts(value) -> list | None:
    """What a value holds that the student's code can reach (None: nothing to follow, or a real module)."""
    if isinstance(value, _SCALARS):
        return None
    if isinstance(value, dict):
        return [x for kv in list(value.items())[:1000] for x in kv]
    if isinstance(value, (list, tuple, set, frozenset)):
        return list(value)[:2000]
    if isinstance(value, functools.partial):
        return [value.func, *value.args, *value.keywords.values()]
    if isinstance(value, types.MethodType):
        return [value.__func__, value.__self__]
    if isinstance(value, types.CellType):
        return [value.cell_contents] if _has_contents(value) else []
    if isinstance(value, (staticmethod, classmethod, property)):
        return _members(value)
    if isinstance(value, types.ModuleType):  # a module the student built (registered or not) holds what it was given
        return None if _genuine_module(value) else list(vars(value).values())
    module = getattr(type(value), "__module__", "") or ""
    if module.split(".")[0] in ("torch", "numpy", "builtins") and not isinstance(value, types.SimpleNamespace):
        return None
    parts = [type(value)]
    try:
        parts += list(object.__getattribute__(value, "__dict__").values())[:1000]
    except Exception:
        pass
    for klass in type(value).__mro__:
        for slot in klass.__dict__.get("__slots__", ()) if isinstance(klass.__dict__.get("__slots__", ()), (tuple, list)) else ():
            descriptor = klass.__dict__.get(slot)
            if isinstance(descriptor, types.MemberDescriptorType):
                try:
                    parts.append(descriptor.__get__(value, klass))
                except AttributeError:
                    pass
    return parts

"""Inside the sandbox: what a lab's graded code may use from ``sazo_lite``, and the checks that enforce it.

A lab's rule (``rules.RULES``) names the library modules its graded cells may import and the
library objects (functions, classes, modules' contents) they may use; everything else in
``sazo_lite`` is off limits (``sazo_lite.course.labs`` itself, the grader's, is always allowed).
``Guard`` enforces a rule four ways; each finding is reported at once to the trusted parent,
which scores the question concerned 0 with the finding as the reason:

1. **imports**: ``import``/``from … import``/``importlib.import_module``/``__import__`` of a
   library module outside the rule, from the student's code, raise ``ImportError`` (and are reported);
2. **calls**: every library function and every method of a library class outside the rule is
   wrapped; a call whose nearest caller outside the library is the student's code (a cell, a
   function or class defined in one, code ``exec``-ed from it) is reported, whatever way the
   object was reached (an attribute of an allowed module, ``getattr``, a proxy, a wrapper);
3. **definitions** (``check``, before each test case): a question's graded functions and classes
   must be defined in the notebook, must not inherit from a forbidden class, and their code
   (followed through the student's own helpers, closures, defaults and containers) must not
   name a forbidden object, hold one, or be a copy of the library's code;
4. the tests themselves (the test cases' own code) may use anything.

The student's code runs in this process, so a submission set on it can still undo these checks
(e.g. by restoring the unwrapped functions); the trust model in ``labs/README.md`` says so.
"""
from __future__ import annotations

import builtins
import dis
import functools
import importlib
import importlib.machinery
import importlib.util
import inspect
import sys
import types

MIN_COPY = 12       # instructions: shorter library functions are too generic to call a copy
LIBRARY = "sazo_lite"
GRADER = "sazo_lite.course.labs"
_LIBRARY_DOT = LIBRARY + "."
_NEUTRAL_PREFIXES = tuple(sorted({p.rstrip("/") + "/" for p in (sys.prefix, sys.base_prefix, sys.exec_prefix) if p}))


def _is_library_name(name) -> bool:
    return isinstance(name, str) and (name == LIBRARY or name.startswith(LIBRARY + ".")) \
        and not (name == GRADER or name.startswith(GRADER + "."))


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


class Guard:
    """Enforce one lab's rule on the student's code in ``namespace`` (see the module docstring).

    Args:
        modules: library modules graded code may import (e.g. ``"sazo_lite.course.problems"``).
        names: library objects it may use: qualified names of functions, classes (their methods
            and bases come with them) or modules (all they define).
        namespace: the dict the student's cells run in.
        report: ``report(name, how)`` is called once per finding (the worker sends it to the parent).
    """

    def __init__(self, modules, names, namespace: dict, report):
        self.modules = {LIBRARY, *modules}
        self.names = set(names)
        self.namespace, self.report = namespace, report
        self.trusted: dict = {}            # id -> code object of the running test case (it may use anything)
        self.allowed_ids: set[int] = set()
        self.allowed_modules: set[str] = set()
        self.forbidden: dict[int, str] = {}  # id(original object) -> qualified name
        self.fingerprints: dict = {}
        self._keep: list = []              # keeps ids stable
        self._seen: set = set()
        self._library_globals: set[int] = set()  # ids of the wrapped library modules' globals

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
            for value in vars(obj).values():
                for member in _members(value):
                    self.allowed_ids.add(id(member))
                    self._keep.append(member)

    def is_allowed(self, obj) -> bool:
        if id(obj) in self.allowed_ids:
            return True
        module = getattr(obj, "__module__", None)
        return isinstance(module, str) and module in self.allowed_modules

    # -- installing the checks ------------------------------------------------------------
    def install(self) -> None:
        """Wrap what the rule forbids in every loaded library module; guard later imports and ``__import__``."""
        self._resolve_allowed()
        for name in sorted(sys.modules):
            module = sys.modules.get(name)
            if _is_library_name(name) and isinstance(module, types.ModuleType):
                self.wrap_module(module)
        sys.meta_path.insert(0, _Finder(self))
        original_import, original_import_module = builtins.__import__, importlib.import_module

        def guarded_import(name, globals=None, locals=None, fromlist=(), level=0):
            if level == 0 and self._from_student(sys._getframe(1)):
                self._check_import(name, fromlist)
            return original_import(name, globals, locals, fromlist, level)

        def guarded_import_module(name, package=None):
            if self._from_student(sys._getframe(1)):
                absolute = importlib.util.resolve_name(name, package) if name.startswith(".") else name
                self._check_import(absolute, ())
            return original_import_module(name, package)

        builtins.__import__ = guarded_import
        importlib.import_module = guarded_import_module

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
        """Wrap the forbidden functions and the methods of forbidden classes defined in ``module``."""
        self._library_globals.add(id(module.__dict__))
        self._keep.append(module.__dict__)
        for attr, value in list(vars(module).items()):
            if getattr(value, "__module__", None) != module.__name__ or id(value) in self._seen \
                    or getattr(value, "__sazo_guarded__", False):
                continue
            if isinstance(value, type):
                self._seen.add(id(value))
                self._keep.append(value)
                if not self.is_allowed(value):
                    self._wrap_class(value)
            elif isinstance(value, types.FunctionType) and not self.is_allowed(value):
                self._wrap_function(value)

    def _wrap_function(self, fn: types.FunctionType):
        name = _qualname(fn)
        self.forbidden[id(fn)] = name
        self._keep.append(fn)
        self.fingerprints[_fingerprint(fn.__code__)] = name
        guarded = self._guarded(fn, name)
        for module_name, module in list(sys.modules.items()):  # every module that imported it by name
            if _is_library_name(module_name) and isinstance(module, types.ModuleType):
                for attr, value in list(vars(module).items()):
                    if value is fn:
                        setattr(module, attr, guarded)
        return guarded

    def _wrap_class(self, klass: type) -> None:
        self.forbidden[id(klass)] = _qualname(klass)
        for attr, value in list(vars(klass).items()):
            name = f"{_qualname(klass)}.{attr}"
            if isinstance(value, types.FunctionType):
                self.fingerprints[_fingerprint(value.__code__)] = name
                setattr(klass, attr, self._guarded(value, name))
            elif isinstance(value, (staticmethod, classmethod)) and isinstance(value.__func__, types.FunctionType):
                setattr(klass, attr, type(value)(self._guarded(value.__func__, name)))
            elif isinstance(value, property):
                setattr(klass, attr, property(*(self._guarded(f, name) if f is not None else None
                                                for f in (value.fget, value.fset, value.fdel)), value.__doc__))
        if "__init__" not in vars(klass):  # building one from the student's code is a use, inherited __init__ or not
            inherited = klass.__init__
            if isinstance(inherited, types.FunctionType):
                klass.__init__ = self._guarded(inherited, f"{_qualname(klass)}.__init__")

    def _guarded(self, fn, name: str):
        guard, library = self, self._library_globals

        @functools.wraps(fn)
        def guarded(*args, **kwargs):
            caller = sys._getframe(1)
            # the library calling itself (most calls): no walk
            if id(caller.f_globals) not in library and guard._from_student(caller):
                guard._found(name, "called")
            return fn(*args, **kwargs)

        guarded.__sazo_guarded__ = True
        return guarded

    # -- who is calling --------------------------------------------------------------------
    def _from_student(self, frame) -> bool:
        """Whether the nearest caller that is not the library, Python or an installed package is the student's.

        Trusted code is looked up by identity: an equal copy made by the submission is not the test's own.
        """
        namespace, trusted, modules = self.namespace, self.trusted, sys.modules
        for _ in range(200):
            if frame is None:
                return False
            code = frame.f_code
            if id(code) in trusted:
                return False
            globals_ = frame.f_globals
            if globals_ is namespace:
                return True
            name = globals_.get("__name__")
            if isinstance(name, str) and (name == LIBRARY or name.startswith(_LIBRARY_DOT)):
                module = modules.get(name)
                if module is not None and getattr(module, "__dict__", None) is globals_:
                    return False  # the library (or the grader) calling itself
            filename = code.co_filename
            if not (filename.startswith(_NEUTRAL_PREFIXES) or filename.startswith("<frozen ")):
                return True   # code from a cell, an exec-ed string or a file the submission wrote
            frame = frame.f_back
        return False

    def trust(self, code: types.CodeType | None) -> None:
        """Let ``code`` (a test case's compiled source, its nested code included) use anything; None: nothing."""
        self.trusted = {} if code is None else {id(c): c for c in _codes(code)}

    def _found(self, name: str, how: str) -> None:
        self.report(name, how)

    # -- definitions, before each test case -------------------------------------------------
    def check(self, graded) -> list[tuple[str, str]]:
        """Findings ``(name, how)`` for a question's graded names (those missing are left to the tests)."""
        findings: list[tuple[str, str]] = []
        visited: set[int] = set()
        for name in graded:
            if name not in self.namespace:
                continue
            obj = self.namespace[name]
            if isinstance(obj, types.FunctionType) or isinstance(obj, type) or callable(obj):
                if not self._defined_here(obj):
                    findings.append((self._describe(obj), f"{name} is not defined in your notebook"))
                    continue
            self._inspect(obj, name, findings, visited, 0)
        return findings

    def _defined_here(self, obj) -> bool:
        if isinstance(obj, types.FunctionType):
            return obj.__code__.co_filename.startswith("<cell ") and obj.__globals__ is self.namespace
        if isinstance(obj, type):
            return obj.__module__ == self.namespace.get("__name__")
        return not callable(obj)

    def _describe(self, obj) -> str:
        original = getattr(obj, "__wrapped__", obj)
        return self.forbidden.get(id(original), _qualname(original))

    def _inspect(self, obj, where: str, findings, visited, depth) -> None:
        if depth > 6 or id(obj) in visited:
            return
        visited.add(id(obj))
        if isinstance(obj, type):
            for base in obj.__mro__[1:]:
                if self._is_forbidden(base):
                    findings.append((_qualname(base), f"{where} inherits from it"))
            for value in vars(obj).values():
                for member in _members(value):
                    if isinstance(member, types.FunctionType):
                        self._inspect(member, where, findings, visited, depth + 1)
            return
        if isinstance(obj, types.FunctionType):
            if obj.__globals__ is not self.namespace or not obj.__code__.co_filename.startswith("<cell "):
                if self._is_forbidden(obj):
                    findings.append((self._describe(obj), f"{where} uses it"))
                return
            held = list(obj.__defaults__ or ()) + list((obj.__kwdefaults__ or {}).values())
            held += [cell.cell_contents for cell in (obj.__closure__ or ()) if _has_contents(cell)]
            for code in _codes(obj.__code__):
                print_ = _fingerprint(code)
                copied = self.fingerprints.get(print_) if len(print_) >= MIN_COPY else None
                if copied:
                    findings.append((copied, f"{where} is a copy of its code"))
                globals_used, attributes = _names(code)
                roots = []
                for name in globals_used:
                    if name in obj.__globals__:
                        roots.append((name, obj.__globals__[name]))
                    elif hasattr(builtins, name):
                        roots.append((name, getattr(builtins, name)))
                for name, value in roots + [("a default or closure value", v) for v in held]:
                    self._inspect_value(value, where, attributes, findings, visited, depth)
            return
        self._inspect_value(obj, where, set(), findings, visited, depth)

    def _inspect_value(self, value, where, attributes, findings, visited, depth) -> None:
        """A value the student's code can reach: forbidden itself, or leading to forbidden attributes."""
        if self._is_forbidden(value):
            findings.append((self._describe(value), f"{where} uses it"))
            return
        if isinstance(value, types.FunctionType) or isinstance(value, type) and value.__module__ == self.namespace.get("__name__"):
            self._inspect(value, where, findings, visited, depth + 1)
            return
        if isinstance(value, (list, tuple, set, frozenset, dict)) and depth < 4:
            items = list(value.items()) if isinstance(value, dict) else list(value)
            for item in items[:1000]:
                for part in item if isinstance(value, dict) else (item,):
                    self._inspect_value(part, where, attributes, findings, visited, depth + 1)
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
        original = obj
        while getattr(original, "__sazo_guarded__", False):
            original = original.__wrapped__
        if id(original) in self.forbidden:
            return True
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
        self.inner.exec_module(module)
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

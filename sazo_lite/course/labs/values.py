"""Recorded test values: encoded as JSON inside the sandbox, compared by the trusted parent.

A lab test calls ``record(value)`` on what the student's code produced. While grading, the
sandboxed worker sends the encoded value to the parent, which compares it with the value the
same test recorded on the instructor's solutions (``compare``). A test case passes only when it
raised nothing *and* every recorded value matches: whatever a submission does to its own
namespace (shadowing ``abs``, patching ``torch.allclose`` or otter), it can only pass by
producing the solution's numbers. In a student's notebook ``record`` does nothing.
"""
from __future__ import annotations

import math

__all__ = ["record", "encode", "compare", "check_encoded", "MAX_ITEMS"]

RTOL, ATOL = 1e-6, 1e-9


def record(value, *, rtol: float = RTOL, atol: float = ATOL) -> None:
    """Hand ``value`` to the grader (compared with the solution's within ``rtol``/``atol``).

    Numbers, tensors and arrays compare with ``|a − b| ≤ atol + rtol·|b|``; ints, bools,
    strings and None exactly; lists, tuples and dicts item by item. Where the solution
    recorded a Python number, a 0-d tensor or array holding a number matches it by value
    (a list of numbers: a 1-d one holding them). Returns None, so a bare
    ``record(x)`` line prints nothing in a doctest. Outside grading it does nothing.

    Example:
        >>> record(3.0)
    """
    return None


MAX_ITEMS = 100_000   # numbers (and other leaves) one recorded value may hold: more fails the case
MAX_DEPTH = 20        # nesting of lists, tuples and dicts
MAX_STRING = 10_000   # characters of a recorded string


class _TooLarge(Exception):
    pass


def encode(value):
    """A JSON-able description of ``value`` (tensor dtype and shape kept), within the size caps.

    A value with more than ``MAX_ITEMS`` leaves (numbers, strings, ...) or nested deeper than
    ``MAX_DEPTH`` is encoded as ``{"t": "too_large", "n": ...}``: the grader fails that case
    ("too large to grade") instead of shipping it. Anything unexpected becomes an "object".

    Example:
        >>> encode([1, 2.5])["t"]
        'seq'
    """
    budget = [MAX_ITEMS]
    try:
        return _encode(value, 0, budget)
    except _TooLarge as exc:
        return {"t": "too_large", "n": int(exc.args[0]) if exc.args else MAX_ITEMS + 1}
    except Exception as exc:  # a hostile object: its type name only
        return {"t": "object", "v": f"unencodable {type(value).__name__}: {type(exc).__name__}"[:200]}


def _spend(budget: list, n: int) -> None:
    budget[0] -= n
    if budget[0] < 0:
        raise _TooLarge(MAX_ITEMS - budget[0])


def _encode(value, depth: int, budget: list):
    if depth > MAX_DEPTH:
        raise _TooLarge(MAX_ITEMS + 1)
    _spend(budget, 1)
    if value is None or type(value) is bool:
        return {"t": type(value).__name__, "v": value}
    if isinstance(value, str):
        return {"t": "str", "v": str(value)[:MAX_STRING]}
    if isinstance(value, bool):
        return {"t": "bool", "v": bool(value)}
    if isinstance(value, int):
        value = int(value)
        return {"t": "int", "v": value if abs(value) < 2 ** 53 else float(value)}
    if isinstance(value, float):
        value = float(value)
        return {"t": "float", "v": value if math.isfinite(value) else repr(value)}
    if isinstance(value, (list, tuple)):
        _spend(budget, len(value))  # before walking it
        budget[0] += len(value)
        return {"t": "seq", "v": [_encode(v, depth + 1, budget) for v in list(value)]}
    if isinstance(value, dict):
        items = sorted(dict(value).items(), key=lambda kv: repr(kv[0]))
        return {"t": "dict", "v": [[_encode(k, depth + 1, budget), _encode(v, depth + 1, budget)] for k, v in items]}
    module = type(value).__module__ or ""
    if module.startswith(("torch", "numpy")) and hasattr(value, "tolist") and hasattr(value, "dtype"):
        shape = [int(n) for n in getattr(value, "shape", ())]
        _spend(budget, math.prod(shape))
        data = value.detach().cpu().tolist() if module.startswith("torch") else value.tolist()
        dtype = str(value.dtype).removeprefix("torch.")
        return {"t": "array", "dtype": dtype[:40], "shape": shape, "v": _finite(data)}
    return {"t": "object", "v": type(value).__name__[:200]}


def _finite(data):
    if isinstance(data, list):
        return [_finite(x) for x in data]
    if isinstance(data, float) and not math.isfinite(data):
        return repr(data)
    if isinstance(data, complex):
        return repr(data)
    return data


def check_encoded(value, budget: list | None = None, depth: int = 0) -> str | None:
    """None if ``value`` is a well-formed output of ``encode`` within the caps, else why not.

    The trusted grader runs this on everything a sandbox reports before comparing it.
    """
    budget = [MAX_ITEMS * 2 + 10] if budget is None else budget
    budget[0] -= 1
    if budget[0] < 0:
        return "too many items"
    if depth > MAX_DEPTH + 2:
        return "nested too deeply"
    if not isinstance(value, dict) or not isinstance(value.get("t"), str):
        return "not an encoded value"
    kind, v = value["t"], value.get("v")
    if kind == "NoneType":
        return None if v is None else "bad None"
    if kind == "bool":
        return None if isinstance(v, bool) else "bad bool"
    if kind == "str":
        return None if isinstance(v, str) and len(v) <= MAX_STRING else "bad string"
    if kind == "int":
        return None if _number(v) else "bad int"
    if kind == "float":
        return None if _number(v) or v in ("nan", "inf", "-inf") else "bad float"
    if kind == "object":
        return None if isinstance(v, str) and len(v) <= 300 else "bad object"
    if kind == "too_large":
        return None if _number(value.get("n")) else "bad too_large"
    if kind == "seq":
        if not isinstance(v, list):
            return "bad sequence"
        for item in v:
            why = check_encoded(item, budget, depth + 1)
            if why:
                return why
        return None
    if kind == "dict":
        if not isinstance(v, list):
            return "bad dict"
        for pair in v:
            if not isinstance(pair, list) or len(pair) != 2:
                return "bad dict item"
            for part in pair:
                why = check_encoded(part, budget, depth + 1)
                if why:
                    return why
        return None
    if kind == "array":
        shape, dtype = value.get("shape"), value.get("dtype")
        if not isinstance(dtype, str) or len(dtype) > 40 or not isinstance(shape, list) or len(shape) > 8 \
                or not all(type(n) is int and 0 <= n for n in shape):
            return "bad array header"
        return _check_array(v, shape, budget)
    return f"unknown kind {kind[:20]!r}"


def _number(v) -> bool:
    return type(v) in (int, float) and (type(v) is int or math.isfinite(v)) and abs(v) < 1e308


def _check_array(data, shape: list, budget: list) -> str | None:
    if not shape:
        budget[0] -= 1
        ok = _number(data) or type(data) is bool or data in ("nan", "inf", "-inf") or \
            (isinstance(data, str) and len(data) < 100)
        return None if ok and budget[0] >= 0 else "bad array entry"
    if not isinstance(data, list) or len(data) != shape[0]:
        return "array data does not match its shape"
    for item in data:
        why = _check_array(item, shape[1:], budget)
        if why:
            return why
    return None


def compare(expected, got, rtol: float = RTOL, atol: float = ATOL) -> str | None:
    """None if ``got`` matches ``expected`` (both from ``encode``), else a short reason."""
    if not isinstance(got, dict) or not isinstance(expected, dict):
        return "not a recorded value"
    if got.get("t") == "too_large":
        return f"the value is too large to grade ({got.get('n')} numbers or more; at most {MAX_ITEMS})"
    kind = expected.get("t")
    numeric = {"int", "float"}
    if kind in numeric and (got.get("t") in numeric or _number_array(got)):
        return _close(expected["v"], got.get("v"), rtol, atol)
    if kind == "seq" and _number_array(got, [len(expected["v"])]) and \
            all(isinstance(item, dict) and item.get("t") in numeric for item in expected["v"]):
        return _close([item.get("v") for item in expected["v"]], got.get("v"), rtol, atol)
    if got.get("t") != kind:
        return f"expected a {kind}, got a {got.get('t')}"
    if kind == "array":
        if got.get("dtype") != expected["dtype"] or got.get("shape") != expected["shape"]:
            return f"expected {expected['dtype']} {expected['shape']}, got {got.get('dtype')} {got.get('shape')}"
        return _close(expected["v"], got.get("v"), rtol, atol)
    if kind in ("seq", "dict"):
        a, b = expected["v"], got.get("v")
        if not isinstance(b, list) or len(a) != len(b):
            return f"expected {len(a)} items, got {len(b) if isinstance(b, list) else '?'}"
        for x, y in zip(a, b):
            pairs = zip(x, y) if kind == "dict" and isinstance(y, list) and len(y) == 2 else [(x, y)]
            for u, v in pairs:
                reason = compare(u, v, rtol, atol)
                if reason:
                    return reason
        return None
    return None if got.get("v") == expected.get("v") else "a different value"


def _number_array(value: dict, shape: list | None = None) -> bool:
    """A tensor or array of numbers of ``shape`` (default 0-d: ``x.mean()``, ``np.float32(x)``): where the
    solution recorded a Python number (or a list of numbers, for a 1-d one), the numbers it holds are compared
    (a test that asks for a Python float or list records the type too)."""
    return value.get("t") == "array" and value.get("shape") == (shape or []) and value.get("dtype") != "bool"


def _close(a, b, rtol, atol) -> str | None:
    if isinstance(a, list):
        if not isinstance(b, list) or len(a) != len(b):
            return "a different shape"
        for x, y in zip(a, b):
            reason = _close(x, y, rtol, atol)
            if reason:
                return reason
        return None
    if isinstance(a, str) or isinstance(b, str):  # nan / inf, kept as their repr
        return None if a == b else f"expected {a}, got {b}"
    if isinstance(a, bool) or isinstance(b, bool) or not isinstance(a, (int, float)) or not isinstance(b, (int, float)):
        return None if a == b and type(a) is type(b) else f"expected {a!r}, got {b!r}"
    if isinstance(a, int) and isinstance(b, int):
        return None if a == b else f"expected {a}, got {b}"
    return None if abs(a - b) <= atol + rtol * abs(a) else f"expected {a:.10g}, got {b:.10g}"

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

__all__ = ["record", "encode", "compare"]

RTOL, ATOL = 1e-6, 1e-9


def record(value, *, rtol: float = RTOL, atol: float = ATOL) -> None:
    """Hand ``value`` to the grader (compared with the solution's within ``rtol``/``atol``).

    Numbers, tensors and arrays compare with ``|a − b| ≤ atol + rtol·|b|``; ints, bools,
    strings and None exactly; lists, tuples and dicts item by item. Returns None, so a bare
    ``record(x)`` line prints nothing in a doctest. Outside grading it does nothing.

    Example:
        >>> record(3.0)
    """
    return None


def encode(value, depth: int = 0):
    """A JSON-able description of ``value`` (tensor dtype and shape kept)."""
    if depth > 20:
        return {"t": "deep"}
    if value is None or isinstance(value, (bool, str)):
        return {"t": type(value).__name__, "v": value}
    if isinstance(value, int):
        return {"t": "int", "v": value if abs(value) < 2 ** 53 else float(value)}
    if isinstance(value, float):
        return {"t": "float", "v": value if math.isfinite(value) else repr(value)}
    if isinstance(value, (list, tuple)):
        return {"t": "seq", "v": [encode(v, depth + 1) for v in value[:100_000]]}
    if isinstance(value, dict):
        items = sorted(value.items(), key=lambda kv: repr(kv[0]))
        return {"t": "dict", "v": [[encode(k, depth + 1), encode(v, depth + 1)] for k, v in items]}
    module = type(value).__module__ or ""
    if module.startswith("torch") and hasattr(value, "tolist") and hasattr(value, "dtype"):
        return {"t": "array", "dtype": str(value.dtype).removeprefix("torch."), "shape": list(value.shape),
                "v": _finite(value.detach().cpu().tolist())}
    if module.startswith("numpy") and hasattr(value, "tolist") and hasattr(value, "dtype"):
        return {"t": "array", "dtype": str(value.dtype), "shape": list(getattr(value, "shape", ())),
                "v": _finite(value.tolist())}
    return {"t": "object", "v": type(value).__name__}


def _finite(data):
    if isinstance(data, list):
        return [_finite(x) for x in data]
    if isinstance(data, float) and not math.isfinite(data):
        return repr(data)
    return data


def compare(expected, got, rtol: float = RTOL, atol: float = ATOL) -> str | None:
    """None if ``got`` matches ``expected`` (both from ``encode``), else a short reason."""
    if not isinstance(got, dict) or not isinstance(expected, dict):
        return "not a recorded value"
    kind = expected.get("t")
    numeric = {"int", "float"}
    if kind in numeric and got.get("t") in numeric:
        return _close(expected["v"], got["v"], rtol, atol)
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

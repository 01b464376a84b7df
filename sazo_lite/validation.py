"""Argument checks shared by every public entry point.

Each check returns the cleaned value or raises ``ValueError("Invalid <name>: ...")`` (the
torch.optim convention) before the caller changes any state. Plain maths, no torch state.
"""
from __future__ import annotations

import collections.abc
import math
import numbers

__all__ = ["check_int", "check_seed", "check_count", "check_real", "check_number", "check_limit", "check_fraction", "check_choice",
           "check_bool", "check_callable", "not_dense", "numpy_readable", "dense_tensor", "non_real_kinds",
           "not_numbers", "check_numbers", "NotNumbersError", "check_state_settings"]


def check_int(name: str, value, low: int | None = None, high: int | None = None) -> int:
    """An int (not a bool, not a float) in [low, high] (each bound when given)."""
    if (isinstance(value, bool) or not isinstance(value, numbers.Integral) or (low is not None and value < low)
            or (high is not None and value > high)):
        bound = (f" >= {low}" if low is not None else "") + (f" and <= {high}" if high is not None else "")
        raise ValueError(f"Invalid {name}: {value!r} (expected an int{bound})")
    return int(value)


def check_seed(name: str, value, low: int = -2 ** 63) -> int:
    """An int that ``torch.Generator.manual_seed`` takes: in [low, 2**64 − 1] (low ≥ −2**63); beyond
    that range torch raised "Overflow when unpacking long long" at the first draw."""
    return check_int(name, value, max(low, -2 ** 63), 2 ** 64 - 1)


def check_count(name: str, value) -> int:
    """An int >= 1 (a number of examples, steps, directions ...)."""
    return check_int(name, value, 1)


def check_state_settings(owner: str, state, keys, settings: dict) -> None:
    """A step rule's state for ``load_state_dict``: a dict with exactly ``keys`` (its ``state_dict()``'s) whose
    settings equal this rule's ``settings`` (a state of other settings would not be this rule's), else
    ValueError naming ``owner``."""
    if not isinstance(state, dict) or set(state) != set(keys):
        raise ValueError(f"Invalid state: {str(state)[:80]} (expected {owner}.state_dict())")
    given = {key: state[key] for key in settings}
    if given != settings:
        raise ValueError(f"Invalid state: settings {given} (this {owner}'s: {settings})")


def check_real(name: str, value) -> float:
    """A real number as a float, ±inf and NaN included (not a bool or a string: float() would read
    True as 1.0 and "2" as 2.0)."""
    if isinstance(value, (bool, str, bytes)) or not isinstance(value, numbers.Real):
        raise ValueError(f"Invalid {name}: {value!r} (expected a number)")
    try:
        return float(value)
    except OverflowError:   # an int or Fraction beyond float64: float() raised OverflowError, naming nothing
        raise ValueError(f"Invalid {name}: {str(value)[:80]} (beyond float64's range)") from None


def check_number(name: str, value, low: float = -math.inf, high: float = math.inf, *,
                 closed_low: bool = True, closed_high: bool = True) -> float:
    """A finite real number (not a bool or a string) in the interval (low|[low, high]|)."""
    value = check_real(name, value)
    above = value >= low if closed_low else value > low
    below = value <= high if closed_high else value < high
    if not (math.isfinite(value) and above and below):
        # an infinite end is never in the interval: '(0.0, inf)', not '(0.0, inf]' beside "finite"
        interval = (f"{'[' if closed_low and math.isfinite(low) else '('}{low}, "
                    f"{high}{']' if closed_high and math.isfinite(high) else ')'}")
        raise ValueError(f"Invalid {name}: {value} (expected a finite number in {interval})")
    return value


def check_limit(name: str, value, low: float = -math.inf, *, closed_low: bool = True) -> float:
    """A limit: a number above ``low`` (as ``check_number``), or +inf for none (a divergence threshold)."""
    value = check_real(name, value)
    return value if value == math.inf else check_number(name, value, low, closed_low=closed_low)


def check_fraction(name: str, value, low: float, high: float, *, closed_low: bool, closed_high: bool) -> float:
    """A number in an interval whose ends are named explicitly (e.g. λ ∈ (0, 1])."""
    return check_number(name, value, low, high, closed_low=closed_low, closed_high=closed_high)


def check_choice(name: str, value, choices) -> str:
    """One of a fixed set of names, returned as the set's own plain str: a str subclass equal to one (numpy's
    ``str_`` read from an array, a ``str`` enum) was kept as given, and a state dict holding it (MeZO's
    perturbation, SAZO's statistic) was refused by ``torch.load(weights_only=True)``, torch's default."""
    match = next((choice for choice in choices if choice == value), None) if isinstance(value, str) else None
    if match is None:
        raise ValueError(f"Invalid {name}: {value!r} (expected one of {tuple(choices)})")
    return match


def check_bool(name: str, value) -> bool:
    """True or False exactly (not 0/1, not a string)."""
    if not isinstance(value, bool):
        raise ValueError(f"Invalid {name}: {value!r} (expected True or False)")
    return value


def check_callable(name: str, value, *, optional: bool = False):
    """A callable (or None when ``optional``)."""
    if (value is None and not optional) or (value is not None and not callable(value)):
        raise ValueError(f"Invalid {name}: {value!r} (expected a callable)")
    return value


def not_dense(tensor) -> str | None:
    """None when torch can read ``tensor``'s entries as one dense block; else the kind to name in the
    caller's ValueError: ``'nested'``, a sparse layout, or the strided layout of a meta tensor (no data).
    Torch's own errors on these were NotImplementedError or 'Internal error'."""
    import torch   # only callers that hold a tensor get here

    if tensor.is_nested:
        return "nested"
    return None if tensor.layout == torch.strided and tensor.device.type != "meta" else str(tensor.layout)


def numpy_readable(name: str, value):
    """``value``, or for a numpy array one torch reads as its values: a native C-ordered copy of an array with
    negative strides (``a[::-1]``), strides that are not whole items (a field of packed records, ``rec['a']``) or a
    non-native byte order (read from a file written big-endian), which ``torch.as_tensor`` refused with ValueError;
    a masked array's data when nothing is masked. A masked array with masked entries is
    ``ValueError("Invalid <name>: ...")``: torch read the hidden values under the mask."""
    import numpy as np

    if not isinstance(value, np.ndarray):
        return value
    if isinstance(value, np.ma.MaskedArray):
        if np.ma.is_masked(value):
            raise ValueError(f"Invalid {name}: a masked array ({int(np.ma.count_masked(value))} of {value.size} "
                             f"entries masked; expected plain numbers: fill them first, e.g. .filled(0.0))")
        value = np.ma.getdata(value)
    size = value.itemsize or 1   # strides between whole items only: a packed record's field ('f8' every 12 bytes)
    if not value.dtype.isnative or any(stride < 0 or stride % size for stride in value.strides):
        value = np.array(value, dtype=value.dtype.newbyteorder("="), order="C")
    return value


class NotNumbersError(TypeError, ValueError):
    """A value of a kind that holds no numbers (``not_numbers``) where numbers were expected. A TypeError, and a
    ValueError as every other refusal of an argument (callers that catch ValueError keep working)."""


# What torch.as_tensor reads an array-like object through (other libraries' arrays and tables).
_ARRAY_PROTOCOLS = ("__array__", "__array_interface__", "__cuda_array_interface__", "__dlpack__")


def not_numbers(value) -> str | None:
    """None when ``value`` is of a kind that holds numbers (a tensor, a number, a numpy array or scalar, a list,
    tuple or other sequence (indexable, with a length), an array-like object of another library); else what it
    is, for the caller's ``NotNumbersError``.

    Bytes-like objects (bytes, bytearray, memoryview) are not numbers: ``torch.as_tensor`` read a bytearray's
    bytes as its values (a closure returning ``bytearray(b"ab")`` gave losses 97 and 98). Neither are strings,
    mappings, sets, None or iterators (a generator is spent by one read).
    """
    import numpy as np
    import torch

    if isinstance(value, (bytes, bytearray, memoryview)):
        return f"an object of type {type(value).__name__} (bytes-like: torch would read its bytes as numbers)"
    if isinstance(value, str) or value is None:
        return repr(value)[:80]
    if isinstance(value, (torch.Tensor, numbers.Number, np.ndarray, np.generic)):
        return None
    kind = type(value)   # a sequence as torch reads one (indexable, with a length), registered as such or not
    if hasattr(kind, "__getitem__") and hasattr(kind, "__len__") and not isinstance(value, collections.abc.Mapping):
        return None
    if any(hasattr(value, protocol) for protocol in _ARRAY_PROTOCOLS):   # a pandas Series, a CuPy array ...
        return None
    return f"an object of type {type(value).__name__}"


def check_numbers(name: str, value):
    """``value``, or ``NotNumbersError("Invalid <name>: ...")`` when ``not_numbers`` finds it holds no numbers."""
    kind = not_numbers(value)
    if kind is not None:
        raise NotNumbersError(f"Invalid {name}: {kind} (expected a tensor, a number or a list of numbers)")
    return value


def dense_tensor(name: str, value):
    """``value`` as a tensor with dense data on a real device, or ``ValueError("Invalid <name>: ...")``.

    Python floats (a number or a list of them) are read in float64: torch's default float32 rounded them
    (0.1 read 0.10000000149) and turned |x| > 3.4e38 into inf. Bytes-like objects (``not_numbers``) are refused
    with ``NotNumbersError`` (torch read a bytearray's bytes as numbers). Strings, ints beyond float64, sparse, meta
    and nested tensors raised torch's own TypeError, OverflowError, NotImplementedError or internal errors.
    A list or tuple mixing bools (Python, numpy or 0-d tensors) with numbers is refused; numpy arrays are read
    as ``numpy_readable`` gives them.
    """
    import numpy as np
    import torch

    value = numpy_readable(name, check_numbers(name, value))
    try:
        tensor = torch.as_tensor(value)
        if tensor.is_floating_point() and not isinstance(value, (torch.Tensor, np.ndarray, np.generic)):
            tensor = torch.as_tensor(value, dtype=torch.float64)
    except (TypeError, ValueError, RuntimeError, OverflowError):
        raise ValueError(f"Invalid {name}: {type(value).__name__} (expected a tensor of numbers)") from None
    if isinstance(value, (list, tuple)) and tensor.dtype != torch.bool and "bool" in non_real_kinds(value):
        # torch read a bool among numbers as 0/1: indices [1, True] counted example 1 twice, diffs [0.5, True]
        # read 1.0 (a list of bools alone keeps its bool dtype, which the callers name)
        raise ValueError(f"Invalid {name}: {str(value)[:80]} (expected numbers; it holds a bool)")
    if tensor.device.type == "meta":
        raise ValueError(f"Invalid {name}: a tensor on the meta device (no data)")
    kind = not_dense(tensor)
    if kind is not None:
        raise ValueError(f"Invalid {name}: a {kind} tensor (expected a dense tensor)")
    return tensor


def non_real_kinds(value) -> set[str]:
    """The kinds of non-real number ``value`` is or holds: a subset of ``{"bool", "complex"}``.

    ``value`` is a number, a numpy scalar or array, a tensor, or a list or tuple of them (nested ones searched).
    A bool is Python's or numpy's, or a bool array or tensor; a complex number is Python's or numpy's, or a
    complex array or tensor. torch and float() read a bool as 0/1 and dropped a complex number's imaginary part.
    """
    import numpy as np
    import torch

    found, pending, seen = set(), [value if isinstance(value, (list, tuple)) else (value,)], set()
    while pending:   # a loop, not recursion: a list that holds itself is searched once
        items = pending.pop()
        deep = False
        for kind in set(map(type, items)):   # one pass over the types: a list of plain numbers is the common case
            if issubclass(kind, (bool, np.bool_)):
                found.add("bool")
            elif issubclass(kind, (complex, np.complexfloating)):
                found.add("complex")
            elif issubclass(kind, (list, tuple, np.ndarray, torch.Tensor)):
                deep = True
        for item in items if deep else ():
            if isinstance(item, (list, tuple)) and id(item) not in seen:
                seen.add(id(item))
                pending.append(item)
            elif isinstance(item, np.ndarray):   # numpy's dtype kinds: b bool, c complex
                found |= {"b": {"bool"}, "c": {"complex"}}.get(item.dtype.kind, set())
            elif isinstance(item, torch.Tensor):
                found |= {"bool"} if item.dtype == torch.bool else {"complex"} if item.is_complex() else set()
    return found

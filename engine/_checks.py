"""Argument checks shared by the whole engine and the command line's argparse types.

One rule everywhere, as Python's own functions do: a value of the wrong type is a TypeError
(bool is not a number here: ``True`` as a size or a rate is a mistake), a value of the right
type outside its range is a ValueError. Every message names the argument and says what was
expected and what was given.
"""
from __future__ import annotations

import argparse
import math
import numbers

import numpy as np

__all__ = ["check_int", "check_positive_int", "check_real", "check_bool", "check_choice",
           "check_dtype", "check_array_like", "argparse_int", "argparse_real"]

_FLOAT_DTYPES = (np.dtype(np.float32), np.dtype(np.float64))


def check_int(name: str, v, low: int | None = None, high: int | None = None,
              what: str | None = None) -> int:
    """``v`` as a Python int in ``[low, high]`` (None: unbounded). ``what`` replaces the
    description of the range in the message (e.g. "a positive int")."""
    if what is None:
        what = "an integer" + (f" >= {low}" if low is not None else "") + \
            (f" <= {high}" if high is not None else "")
    if isinstance(v, (bool, np.bool_)) or not isinstance(v, numbers.Integral):
        raise TypeError(f"{name}: expected {what}, got {v!r} ({type(v).__name__})")
    if (low is not None and v < low) or (high is not None and v > high):
        raise ValueError(f"{name}: expected {what}, got {v!r}")
    return int(v)


def check_positive_int(name: str, v) -> int:
    """``v`` as an int >= 1 (sizes, counts)."""
    return check_int(name, v, 1, what="a positive int")


def _interval(low: float, high: float, low_open: bool, high_open: bool) -> str:
    if high == math.inf and not high_open:
        return f"{'>' if low_open else '>='} {low}" if low != -math.inf else "(any)"
    return ("(" if low_open else "[") + f"{low}, {high}" + (")" if high_open else "]")


def check_real(name: str, v, low: float = -math.inf, high: float = math.inf,
               low_open: bool = False, high_open: bool = False, finite: bool = True) -> float:
    """``v`` as a Python float in the interval (open or closed at each end); finite unless
    ``finite=False`` (then an infinite end of the interval is allowed; NaN never is)."""
    if isinstance(v, (bool, np.bool_)) or not isinstance(v, numbers.Real):
        raise TypeError(f"{name}: expected a number, got {v!r} ({type(v).__name__})")
    f = float(v)
    ok = (math.isfinite(f) or (not finite and not math.isnan(f))) and (f > low if low_open else f >= low) and \
        (f < high if high_open else f <= high)
    if not ok:
        where = _interval(low, high, low_open, high_open)
        where = "" if where == "(any)" else (" " + where if where[0] in "<>" else " in " + where)
        raise ValueError(f"{name}: expected a {'finite ' if finite else ''}number{where}, "
                         f"got {v!r}")
    return f


def check_bool(name: str, v) -> bool:
    """``v`` as a bool (Python's or NumPy's; not 0/1, which are more often a mistaken size)."""
    if not isinstance(v, (bool, np.bool_)):
        raise TypeError(f"{name}: expected True or False, got {v!r} ({type(v).__name__})")
    return bool(v)


def check_choice(name: str, v, choices) -> str:
    """``v`` as one of the strings ``choices``."""
    if not isinstance(v, str):
        raise TypeError(f"{name}: expected one of {tuple(choices)}, got {v!r} "
                        f"({type(v).__name__})")
    if v not in choices:
        raise ValueError(f"{name}: expected one of {tuple(choices)}, got {v!r}")
    return v


def check_dtype(dtype) -> np.dtype:
    """Return ``dtype`` as a numpy dtype, float32 or float64, else raise TypeError."""
    if dtype is None:  # np.dtype(None) is float64: a silent choice the caller did not make
        raise TypeError("dtype: expected float32 or float64, got None")
    try:
        dt = np.dtype(dtype)
    except TypeError:
        raise TypeError(f"dtype: expected float32 or float64, got {dtype!r}") from None
    if dt not in _FLOAT_DTYPES:
        raise TypeError(f"dtype: expected float32 or float64, got {dt}")
    return dt


def check_array_like(name: str, v, like: np.ndarray, hint: str = "") -> np.ndarray:
    """``v`` if it is a numpy array of ``like``'s shape and dtype (a parameter's value, a saved
    buffer): TypeError for another type or dtype (``hint`` follows the dtype message),
    ValueError for another shape."""
    if not isinstance(v, np.ndarray):
        raise TypeError(f"{name}: expected a numpy.ndarray, got {type(v).__name__}")
    if v.shape != like.shape:
        raise ValueError(f"{name}: expected shape {like.shape}, got {v.shape}")
    if v.dtype != like.dtype:
        raise TypeError(f"{name}: expected dtype {like.dtype}, got {v.dtype}{hint}")
    return v


# ----------------------------------------------------------------------------- argparse types
# The command line's number options go through the same checks as the Python API; argparse
# turns the ArgumentTypeError into a usage error (exit status 2) naming the option.
def argparse_int(low: int, what: str):
    """An argparse type: an int >= ``low``, else an error saying ``expected <what>``."""
    def parse(text: str) -> int:
        try:
            return check_int("value", int(text), low)
        except (TypeError, ValueError):
            raise argparse.ArgumentTypeError(f"expected {what}, got {text!r}") from None
    return parse


def argparse_real(low: float, high: float | None, what: str, low_open: bool = False,
                  high_open: bool = False):
    """An argparse type: a finite float in the range, else an error saying ``expected <what>``."""
    def parse(text: str) -> float:
        try:
            return check_real("value", float(text), low,
                              math.inf if high is None else high, low_open, high_open)
        except (TypeError, ValueError):
            raise argparse.ArgumentTypeError(f"expected {what}, got {text!r}") from None
    return parse

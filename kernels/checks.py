"""Argument checks shared by kernels and engine (engine/_checks.py builds on them): numbers,
flags, choices and an array against the one it must match. kernels cannot import engine, so
the one copy lives here.

One rule everywhere, as Python's own functions do: a value of the wrong type is a TypeError
(bool is not a number here: ``True`` as a size or a rate is a mistake), a value of the right
type outside its range is a ValueError. Every message names the argument and says what was
expected and what was given.
"""
from __future__ import annotations

import math
import numbers

import numpy as np

__all__ = ["check_int", "check_positive_int", "check_real", "check_bool", "check_choice",
           "check_array_like"]


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


def check_array_like(name: str, v, like: np.ndarray, hint: str = "",
                     like_name: str | None = None) -> np.ndarray:
    """``v`` if it is a numpy array of ``like``'s shape and dtype (a parameter's value, a saved
    buffer, a kernel's output): TypeError for another type or dtype (``hint`` follows the
    dtype message), ValueError for another shape; ``like_name`` names ``like`` in them."""
    that = f" (that of {like_name})" if like_name else ""
    if not isinstance(v, np.ndarray):
        raise TypeError(f"{name}: expected a numpy.ndarray, got {type(v).__name__}")
    if v.shape != like.shape:
        raise ValueError(f"{name}: expected shape {like.shape}{that}, got {v.shape}")
    if v.dtype != like.dtype:
        raise TypeError(f"{name}: expected dtype {like.dtype}{that}, got {v.dtype}{hint}")
    return v

"""Argument checks shared by the whole engine and the command line's argparse types: the
number, flag, choice and array-like checks of kernels/checks.py (one rule for both packages: a
wrong type is a TypeError, a value out of range a ValueError, every message names the
argument), and the dtype and argparse checks only engine needs.
"""
from __future__ import annotations

import argparse
import math

import numpy as np

from kernels.checks import (check_array_like, check_bool, check_choice, check_int,
                            check_positive_int, check_real)

__all__ = ["check_int", "check_positive_int", "check_real", "check_bool", "check_choice",
           "check_dtype", "check_array_like", "argparse_int", "argparse_real"]

_FLOAT_DTYPES = (np.dtype(np.float32), np.dtype(np.float64))


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

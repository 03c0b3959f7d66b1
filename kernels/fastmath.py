"""Transcendentals the compiled kernels call per element: ``exp`` and ``sigmoid``, as numba
overloads that pick the dtype's version at compile time.

float32 uses ``kernels.fmath.exp_f32`` (range reduction and a polynomial, which vectorise;
numba's ``math.exp`` is a scalar libm call that stops LLVM's vectoriser), float64 calls libm
(those kernels serve gradient checks, not speed). The accuracy bound is ``kernels.fmath``'s,
checked again here through the overload in tests/test_fastmath.py.

Call ``fastmath.exp(x)`` inside an ``@jit`` kernel. Called from Python (or with
``NUMBA_DISABLE_JIT=1``) these run NumPy's functions. numba's disk cache keys a kernel on its
own file only: after editing this file or kernels/fmath.py, delete the ``__pycache__`` index
files (``*.nbi``) of the kernels that use them, or they keep the old code.
"""
from __future__ import annotations

import math

import numpy as np
from numba import types
from numba.np.numpy_support import as_dtype
from numba.core.extending import overload

from .fmath import EXP_MAX_REL_ERR_F32, exp_f32
from .jit import OPTIONS

__all__ = ["exp", "sigmoid", "const", "EXP_MAX_REL_ERR"]

# Maximum relative error of the float32 exp against the float64 exp, rounded to float32,
# over normal results (tests/test_fastmath.py sweeps every magnitude).
EXP_MAX_REL_ERR = EXP_MAX_REL_ERR_F32

_F = np.float32
_ONE = _F(1.0)


def exp(x):
    """e**x (NumPy's when called from Python; see the module doc inside kernels)."""
    return np.exp(x)


def sigmoid(x):
    """1 / (1 + e**-x) (NumPy's when called from Python)."""
    return 1.0 / (1.0 + np.exp(-x))


# Compiled as functions of their own (LLVM inlines them into the loop and vectorises):
# numba's IR-level inlining of _exp32 trips its SSA checks.
_OV = {"jit_options": {k: v for k, v in OPTIONS.items() if k in ("fastmath", "error_model")},
       "inline": "never"}


@overload(exp, **_OV)
def _exp_impl(x):
    if x == types.float32:
        return lambda x: exp_f32(x)
    if isinstance(x, types.Float):
        return lambda x: math.exp(x)
    return None


def _sigmoid32(x):
    return _ONE / (_ONE + exp(-x))


@overload(sigmoid, **_OV)
def _sigmoid_impl(x):
    if x == types.float32:
        return _sigmoid32
    if isinstance(x, types.Float):
        return lambda x: 1.0 / (1.0 + math.exp(-x))
    return None


def const(value, like):
    """``value`` in the float type of ``like`` (a float, or an array: its dtype): inside a
    kernel a Python number would make numba promote a float32 expression to float64."""
    return (like.dtype.type if hasattr(like, "dtype") else type(like))(value)


@overload(const, **_OV)
def _const_impl(value, like):
    if isinstance(like, types.Array):
        like = like.dtype
    if isinstance(like, types.Float):
        scalar = as_dtype(like).type
        return lambda value, like: scalar(value)
    return None

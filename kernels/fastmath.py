"""Transcendentals the compiled kernels call per element: ``exp`` and ``sigmoid``.

numba has no vector math library here, so ``math.exp`` in a loop is a scalar libm call
(~2 ns per element) that also stops LLVM's vectoriser. For float32 these are built from
mul, add, div and a bit cast, which vectorise: exp by Cody-Waite range reduction
(x = n ln2 + r, |r| <= ln2/2) and the degree-6 polynomial of Cephes' expf, scaled by 2^n
in two halves so that results that overflow give inf and tiny ones become denormals or 0,
as libm's. NaN gives NaN. float64 calls libm (those kernels serve gradient checks, not
speed). The accuracy bound is stated and checked in tests/test_fastmath.py.

These are numba overloads: call ``fastmath.exp(x)`` inside an ``@jit`` kernel. Called from
Python (or with ``NUMBA_DISABLE_JIT=1``) they run NumPy's functions. numba's disk cache
keys a kernel on its own file only: after editing this file, clear the ``__pycache__``
index files of the kernels that use it (``make clean``), or they keep the old code.
"""
from __future__ import annotations

import math

import numpy as np
from llvmlite import ir
from numba import types
from numba.np.numpy_support import as_dtype
from numba.core.extending import intrinsic, overload

from .jit import OPTIONS

__all__ = ["exp", "sigmoid", "const", "EXP_MAX_REL_ERR"]

# Maximum relative error of the float32 exp against the float64 exp, rounded to float32,
# over normal results (tests/test_fastmath.py sweeps every magnitude).
EXP_MAX_REL_ERR = 2.5e-7

_F = np.float32
_LOG2E = _F(1.4426950408889634)
_LN2_HI = _F(0.693359375)        # ln 2 split so that n * _LN2_HI is exact (Cody & Waite)
_LN2_LO = _F(-2.12194440e-4)
_HI = _F(89.0)                   # exp(89) overflows float32: clamp here, still gives inf
_LO = _F(-104.0)                 # exp(-104) rounds to 0: clamp here, still gives 0
_ROUND = _F(12582912.0)          # 1.5 * 2^23: adding and subtracting rounds to an integer
_P0, _P1, _P2 = _F(1.9875691500e-4), _F(1.3981999507e-3), _F(8.3334519073e-3)
_P3, _P4, _P5 = _F(4.1665795894e-2), _F(1.6666665459e-1), _F(5.0000001201e-1)
_ONE, _HALF = _F(1.0), _F(0.5)


@intrinsic
def _pow2(typingctx, n):
    """2**n as float32 for an integer-valued float32 n in [-126, 127], from its bits."""
    sig = types.float32(types.float32)

    def codegen(context, builder, signature, args):
        i32 = ir.IntType(32)
        k = builder.fptosi(args[0], i32)
        bits = builder.shl(builder.add(k, ir.Constant(i32, 127)), ir.Constant(i32, 23))
        return builder.bitcast(bits, ir.FloatType())
    return sig, codegen


def _exp32(x):
    xc = _HI if x > _HI else x
    xc = _LO if xc < _LO else xc
    n = (xc * _LOG2E + _ROUND) - _ROUND          # round(x / ln 2), in [-150, 129]
    r = (xc - n * _LN2_HI) - n * _LN2_LO
    p = ((((_P0 * r + _P1) * r + _P2) * r + _P3) * r + _P4) * r + _P5
    e = (p * r * r + r) + _ONE                   # exp(r), |r| <= ln2/2
    h = (n * _HALF + _ROUND) - _ROUND            # 2^n as 2^h 2^(n-h), each factor normal
    e = e * _pow2(h) * _pow2(n - h)
    return e if x == x else x                    # NaN stays NaN


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
        return _exp32
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

"""Scalar transcendentals for the compiled kernels: ``exp``, ``tanh`` and the normal CDF
``ndtr``, each in a float32 version that LLVM vectorises and a float64 version.

numba has no vector math library here: ``np.exp``/``np.tanh`` in a loop become scalar libm
calls (``expf`` ~2 ns, ``tanhf`` ~13 ns per element). The float32 versions use only mul, add,
div, compare/select, abs, copysign and integer bit operations, so a loop that calls them runs
on AVX-512/AVX2 registers. Their accuracy against float64 is tested over a dense sweep with
±inf, NaN, large magnitudes and denormals (tests/test_fmath.py). The float64 versions call
libm: they serve gradient checks, not speed.

Clamps are written ``hi if x > hi else x`` (a select that keeps NaN: the comparison is
False), never ``min``/``max``, whose NaN handling is not IEEE's.

``PRIMITIVES`` maps each name to its float32 and float64 versions; the kernel generator
(kernels.gen_activations) rewrites a scalar activation's calls through it. The plain
functions ``exp``, ``tanh``, ``ndtr`` are what those names mean in Python (float64).
"""
from __future__ import annotations

import math

import numpy as np

from .jit import jit

__all__ = ["EXP_MAX_REL_ERR_F32", "exp", "tanh", "ndtr", "exp_f32", "tanh_f32", "ndtr_f32", "exp_f64", "tanh_f64",
           "ndtr_f64", "PRIMITIVES"]

f32 = np.float32

# ----------------------------------------------------------------------------- exp, float32
# exp(x) = 2^n e^r with n = round(x / ln 2) and r = x - n ln 2 in [-ln2/2, ln2/2] (Cody-Waite:
# ln 2 split in a high part exact in float32 and a low part). e^r is a degree-6 polynomial, a
# minimax fit (linear program) of the relative error, 6e-9 (the float32 rounding of r and of
# Horner's steps dominate). round() is the float32 "magic number" addition: 1.5 * 2^23 + y
# rounds y to an integer, which the low mantissa bits then hold (read back by a bit cast,
# defined for every input, NaN included). 2^n is built from exponent bits in two halves, so
# results down in the denormals and up to the overflow come out right: x is clamped to
# [-104, 89], beyond which exp rounds to 0 or overflows to inf anyway.
_EXP_HI, _EXP_LO = f32(89.0), f32(-104.0)
# Relative error bound over normal results, checked by tests/test_fmath.py and test_fastmath.py.
EXP_MAX_REL_ERR_F32 = 1.5e-7
_LOG2E = f32(1.4426950408889634)
_LN2_HI = f32(0.693359375)             # 8 significant bits: n * _LN2_HI is exact
_LN2_LO = f32(-2.1219444005469057e-04)  # ln 2 - _LN2_HI
_ROUND = f32(12582912.0)               # 1.5 * 2^23
_ROUND_BITS = 0x4B400000               # its bits
_E0, _E1, _E2, _E3, _E4, _E5, _E6 = (f32(c) for c in (
    0.9999999999838416, 1.000000019714611, 0.5000000907789038, 0.16666462683807337,
    0.04166339185888059, 0.008372236630622464, 0.0014136752540474717))


@jit
def exp_f32(x):
    x = _EXP_HI if x > _EXP_HI else x
    x = _EXP_LO if x < _EXP_LO else x
    t = x * _LOG2E + _ROUND
    nf = t - _ROUND                    # n as a float (exact)
    r = x - nf * _LN2_HI
    r = r - nf * _LN2_LO
    p = _E6
    p = p * r + _E5
    p = p * r + _E4
    p = p * r + _E3
    p = p * r + _E2
    p = p * r + _E1
    p = p * r + _E0
    n = np.int32(np.float32(t).view(np.int32) - np.int32(_ROUND_BITS))
    n1 = n >> np.int32(1)
    n2 = n - n1
    s1 = np.int32((n1 + np.int32(127)) << np.int32(23)).view(np.float32)  # 2^n1
    s2 = np.int32((n2 + np.int32(127)) << np.int32(23)).view(np.float32)  # 2^n2
    return p * s1 * s2


# ----------------------------------------------------------------------------- tanh, float32
# tanh(x) = x P(x^2) / Q(x^2) on |x| <= 9 (above, tanh rounds to 1 in float32), P and Q of
# degree 4: a minimax fit (linear program, bisection on the bound) of the relative error,
# 1.1e-7; evaluated in float32 the result is within 4e-7 (6 ulps near |x| = 5). The ratio is
# clamped to 1 (it may round a hair above near |x| = 9), is 1 above 9, and takes x's sign by
# copysign, so tanh(-0.0) = -0.0.
_TANH_X = f32(9.0)
_TP0, _TP1, _TP2, _TP3, _TP4 = (f32(c) for c in (
    0.9999999176356696, 0.1334731071883868, 0.0034539142317064095, 1.9859250133890357e-05,
    1.2207382988986253e-08))
_TQ1, _TQ2, _TQ3, _TQ4 = (f32(c) for c in (
    0.46680647375280465, 0.02572270839134584, 0.00032146614859251065, 7.329102850434579e-07))
_ONE = f32(1.0)


@jit
def tanh_f32(x):
    a = abs(x)
    s = a * a
    p = _TP4
    p = p * s + _TP3
    p = p * s + _TP2
    p = p * s + _TP1
    p = p * s + _TP0
    q = _TQ4
    q = q * s + _TQ3
    q = q * s + _TQ2
    q = q * s + _TQ1
    q = q * s + _ONE
    r = a * p / q
    r = _ONE if r > _ONE else r
    r = _ONE if a > _TANH_X else r       # (inf / inf above ~1e19: replaced here)
    return math.copysign(r, x)


# ----------------------------------------------------------------------------- ndtr, float32
# Phi(-s) for s = |z| >= 0 is e(s) T(t) with e(s) = exp(-z^2/2), t = 1 / (1 + 0.29 s) (computed
# as _TA / (_TA + s)) and T a degree-8 polynomial: a minimax fit (linear program) of the
# relative error of 0.5 erfcx(s / sqrt(2)) on [0, 13.5], max 8.2e-8. Phi(z) = 1 - Phi(-s) for
# z >= 0 and Phi(-s) itself for z < 0, so the left tail keeps its relative accuracy (no
# 1 + erf cancellation). exp(-z^2/2) is taken of z*z rounded to float32, which loses ~z^2/2
# ulps of relative accuracy far out in the tail (1e-5 at the underflow, |z| ~ 14).
_TA = f32(1.0 / 0.29)
_T0, _T1, _T2, _T3, _T4, _T5, _T6, _T7, _T8 = (f32(c) for c in (
    2.5300251198439814e-05, 1.1512407663171274e-01, 1.2118253255304251e-01,
    7.6250101140942647e-02, 1.8556778190929579e-01, -1.4922667315449864e-01,
    3.0306264185675508e-01, -1.9079452100796884e-01, 3.8808738515441275e-02))
_MHALF = f32(-0.5)


@jit
def ndtr_f32(z):
    s = abs(z)
    t = _TA / (_TA + s)
    p = _T8
    p = p * t + _T7
    p = p * t + _T6
    p = p * t + _T5
    p = p * t + _T4
    p = p * t + _T3
    p = p * t + _T2
    p = p * t + _T1
    p = p * t + _T0
    tail = exp_f32(_MHALF * z * z) * p   # Phi(-|z|)
    return _ONE - tail if z >= f32(0.0) else tail


# ----------------------------------------------------------------------------- float64
_INV_SQRT2 = 1.0 / math.sqrt(2.0)


@jit
def exp_f64(x):
    return np.exp(x)       # inf past the overflow (math.exp raises there when run as Python)


@jit
def tanh_f64(x):
    return np.tanh(x)


@jit
def ndtr_f64(z):
    return 0.5 * math.erfc(-z * _INV_SQRT2)  # erfc: no 1 + erf cancellation in the left tail


# ----------------------------------------------------------------------------- plain Python
def exp(x):
    """e^x (the meaning of ``exp`` in a scalar activation)."""
    return float(np.exp(np.float64(x)))


def tanh(x):
    """tanh(x)."""
    return math.tanh(x)


def ndtr(z):
    """The standard normal CDF, Phi(z) = (1 + erf(z / sqrt 2)) / 2."""
    return 0.5 * math.erfc(-z * _INV_SQRT2)


PRIMITIVES = {
    "exp": ("exp_f32", "exp_f64"),
    "tanh": ("tanh_f32", "tanh_f64"),
    "ndtr": ("ndtr_f32", "ndtr_f64"),
}

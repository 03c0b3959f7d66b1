"""kernels.fmath: the float32 exp, tanh and normal CDF against float64 (numpy, scipy) over a
dense sweep with ±inf, NaN, huge magnitudes and denormals, with the bound each one keeps;
the float64 versions against numpy/scipy."""
from __future__ import annotations

import numpy as np
import pytest
from probes import vector_register
from scipy.special import ndtr

from kernels import fmath as F
from kernels.jit import jit

TINY = float(np.finfo(np.float32).tiny)      # smallest normal float32
DENORM = float(np.finfo(np.float32).smallest_subnormal)


def _sweep(lo, hi, n=1_000_001):
    """float32 points from lo to hi, and the special values."""
    specials = [np.inf, -np.inf, np.nan, 0.0, -0.0, 1e-40, -1e-40, DENORM, -DENORM, TINY,
                -TINY, 1e-30, -1e-30, 3e38, -3e38, 1e10, -1e10]
    return np.concatenate([np.linspace(lo, hi, n), specials]).astype(np.float32)


# Not cached: numba's disk cache checks only this file, and the functions under test live in
# kernels/fmath.py (the generated kernels carry its digest instead).
@jit(cache=False)
def _apply(out, x, which):
    for i in range(x.size):
        if which == 0:
            out[i] = F.exp_f32(x[i])
        elif which == 1:
            out[i] = F.tanh_f32(x[i])
        elif which == 2:
            out[i] = F.ndtr_f32(x[i])
        elif which == 3:
            out[i] = F.exp_f64(x[i])
        elif which == 4:
            out[i] = F.tanh_f64(x[i])
        else:
            out[i] = F.ndtr_f64(x[i])


def _run(which, x):
    out = np.empty_like(x)
    _apply(out, x, which)
    return out


def _check(got, want64, rel_bound, x):
    """NaN exactly where float64 is NaN; inf where float64 rounds to inf in float32; elsewhere
    relative error below rel_bound for normal results, and for denormal ones an error within
    that relative bound or 2 denormal steps."""
    with np.errstate(over="ignore"):
        want = want64.astype(np.float32)
    np.testing.assert_array_equal(np.isnan(got), np.isnan(want))
    inf = np.isinf(want)
    np.testing.assert_array_equal(got[inf], want[inf])
    fin = np.isfinite(want)
    err = np.abs(got[fin].astype(np.float64) - want64[fin])
    normal = np.abs(want64[fin]) >= TINY
    rel = err[normal] / np.abs(want64[fin][normal])
    assert rel.max() < rel_bound, (rel.max(), x[fin][normal][rel.argmax()])
    small = np.maximum(2 * DENORM, rel_bound * np.abs(want64[fin][~normal]))
    assert (err[~normal] <= small).all(), (err[~normal] / small).max()


def test_exp_float32_within_two_ulps():
    # Check that exp_f32 is within 1.5e-7 relative (~2 ulps) of float64 exp from the
    # underflow to the overflow, 0 below and inf above, NaN for NaN.
    x = _sweep(-110.0, 95.0)
    with np.errstate(over="ignore"):
        _check(_run(0, x), np.exp(x.astype(np.float64)), 1.5e-7, x)


def test_tanh_float32_within_4e7():
    # Check that tanh_f32 is within 4e-7 relative (the rational fit's 1.1e-7 plus float32
    # rounding: ~6 ulps near |x| = 5) of float64 tanh, exactly +-1 far out, odd at +-0.
    x = _sweep(-12.0, 12.0)
    got = _run(1, x)
    _check(got, np.tanh(x.astype(np.float64)), 4e-7, x)
    assert got[x == np.inf][0] == 1.0 and got[x == -np.inf][0] == -1.0
    assert np.signbit(_run(1, np.array([-0.0], np.float32)))[0]


def test_ndtr_float32_relative_bound():
    # Check that ndtr_f32 (the normal CDF) is within 1.5e-6 relative of scipy's ndtr for
    # |z| < 5 and 1e-5 out to the underflow (exp of a float32 z^2 loses ~z^2/2 ulps), with
    # the left tail relatively accurate (no 1 + erf cancellation).
    x = _sweep(-15.0, 10.0)
    got = _run(2, x)
    want = ndtr(x.astype(np.float64))
    _check(got, want, 1e-5, x)
    bulk = np.abs(x) < 5
    rel = np.abs(got[bulk] - want[bulk]) / want[bulk]
    assert rel.max() < 1.5e-6, rel.max()


@pytest.mark.parametrize("which, ref", [(3, np.exp), (4, np.tanh), (5, ndtr)])
def test_float64_versions_match_numpy(which, ref):
    # Check that the float64 versions (libm) agree with numpy/scipy to double precision.
    x = np.concatenate([np.linspace(-40, 40, 10001), [np.nan, np.inf, -np.inf, 1e-310, 0.0]])
    got = _run(which, x)
    want = ref(x)
    np.testing.assert_array_equal(np.isnan(got), np.isnan(want))
    # (ndtr: scipy's tail algorithm differs from 0.5 erfc(-z/sqrt 2) by ~1e-13 relative)
    np.testing.assert_allclose(got, want, rtol=1e-12, atol=1e-300)


def test_plain_python_primitives_are_float64():
    # Check that the Python meaning of the pair primitives is float64 exp/tanh/ndtr, inf
    # past the overflow (no OverflowError) for exp.
    assert F.exp(1.0) == pytest.approx(np.e, rel=1e-15)
    with np.errstate(over="ignore"):
        assert F.exp(1000.0) == np.inf
    assert F.tanh(0.5) == pytest.approx(np.tanh(0.5), rel=1e-15)
    assert F.ndtr(-3.0) == pytest.approx(ndtr(-3.0), rel=1e-14)


def test_float32_kernels_use_vector_registers():
    # Check that a loop calling the float32 functions is vectorised: its assembly uses
    # AVX-512 (zmm) or, on an AVX2 machine, ymm registers.
    reg = vector_register()
    x = np.ones(64, np.float32)
    _run(1, x)
    asm = _apply.inspect_asm(_apply.signatures[0])
    assert f"{reg}" in asm

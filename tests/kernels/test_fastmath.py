"""kernels.fastmath: the float32 exp and sigmoid the compiled kernels use, against float64
NumPy over a dense sweep of every magnitude, the specials and denormals."""
from __future__ import annotations

import numpy as np
import pytest

from kernels import fastmath
from kernels.jit import jit

F32 = np.float32
TINY = np.finfo(F32).tiny
SMALLEST = np.finfo(F32).smallest_subnormal


@jit
def _exp_all(out, x):
    for i in range(x.shape[0]):
        out[i] = fastmath.exp(x[i])


@jit
def _sigmoid_all(out, x):
    for i in range(x.shape[0]):
        out[i] = fastmath.sigmoid(x[i])


def _sweep():
    dense = np.linspace(-110.0, 95.0, 1_000_003, dtype=F32)
    mags = np.geomspace(1e-38, 3e38, 20_001).astype(F32)
    special = np.array([np.inf, -np.inf, np.nan, 0.0, -0.0, SMALLEST, -SMALLEST, 1e-40,
                        -1e-40, TINY, -TINY, 88.72, 88.73, -87.33, -103.97, -103.28,
                        np.finfo(F32).max, -np.finfo(F32).max], F32)
    return np.concatenate([dense, mags, -mags, special])


def test_exp_float32_within_stated_bound_over_dense_sweep():
    # Check that every normal result is within EXP_MAX_REL_ERR of float64 exp, results
    # in the denormal range are within half the smallest denormal... of a rounding, overflow
    # gives inf, underflow 0 and NaN stays NaN.
    x = _sweep()
    out = np.empty_like(x)
    _exp_all(out, x)
    with np.errstate(over="ignore", invalid="ignore"):
        ref = np.exp(x.astype(np.float64))
        ref32 = ref.astype(F32)
    np.testing.assert_array_equal(np.isnan(out), np.isnan(x))
    np.testing.assert_array_equal(np.isposinf(out), np.isposinf(ref32))
    normal = np.isfinite(ref32) & (ref >= TINY)
    rel = np.abs(out[normal].astype(np.float64) - ref[normal]) / ref[normal]
    assert rel.max() <= fastmath.EXP_MAX_REL_ERR
    denormal = np.isfinite(x) & (ref < TINY)
    # 2^n is applied in two normal factors: a denormal result is rounded once more.
    err = np.abs(out[denormal].astype(np.float64) - ref[denormal])
    assert err.max() <= SMALLEST
    assert np.all(out[denormal] >= 0.0)


def test_sigmoid_float32_within_bound_and_saturates():
    # Check sigmoid's absolute error against float64, its exact 0 and 1 at the ends and NaN.
    x = _sweep()
    out = np.empty_like(x)
    _sigmoid_all(out, x)
    with np.errstate(over="ignore"):
        ref = 1.0 / (1.0 + np.exp(-x.astype(np.float64)))
    ok = ~np.isnan(x)
    assert np.max(np.abs(out[ok] - ref[ok])) <= 2e-7
    assert np.all((out[ok] >= 0.0) & (out[ok] <= 1.0))
    np.testing.assert_array_equal(np.isnan(out), np.isnan(x))
    assert out[x == np.inf][0] == 1.0 and out[x == -np.inf][0] == 0.0


@pytest.mark.parametrize("fn,ref", [(_exp_all, np.exp),
                                    (_sigmoid_all, lambda v: 1.0 / (1.0 + np.exp(-v)))])
def test_float64_calls_libm(fn, ref):
    # Check that float64 goes through libm: equal to NumPy's to a rounding or two.
    x = np.linspace(-700.0, 700.0, 10_001)
    out = np.empty_like(x)
    fn(out, x)
    with np.errstate(over="ignore"):
        np.testing.assert_allclose(out, ref(x), rtol=1e-15, atol=0)

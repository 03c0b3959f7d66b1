"""Squared ReLU (So et al. 2021, "Primer") and Mish (Misra 2019): kernels against their
formulas and kernels.reference in float32/float64, inline and split over threads, derivatives
against float64 central differences, Mish at extreme inputs without floating-point warnings."""
from __future__ import annotations

import math
import warnings

import numpy as np
import pytest

from gradcheck import numeric_grad
from kernels import activations as A
from kernels import num_threads, parallel
from kernels import reference as R

DTYPES = [np.float64, np.float32]
TOL = {np.float64: dict(rtol=1e-12, atol=1e-14), np.float32: dict(rtol=2e-5, atol=2e-6)}
SMALL = (7, 33)                                      # widths not a multiple of 16
MULTI = (1000, 200)                                   # rows not a multiple of 32
SPLIT = (2 * parallel.SPLIT_MIN // 777 + 3, 777)      # split over 2 threads


def _z(shape, dtype, seed=0, scale=4.0):
    z = (scale * np.random.default_rng(seed).standard_normal(shape)).astype(dtype)
    z.flat[:4] = [0.0, -0.0, 1e-3, -1e-3]
    return z


def _mish64(z):
    """Mish in float64 from the formula, softplus as log1p(exp(z)) (|z| < 700 here)."""
    z = np.asarray(z, np.float64)
    return z * np.tanh(np.log1p(np.exp(z)))


def _mish64_grad(z):
    """act' = tanh(sp) + z sigmoid(z) sech(sp)^2, sech written as 1/cosh (independent of
    the kernel's and the reference's rearrangements)."""
    z = np.asarray(z, np.float64)
    sp = np.log1p(np.exp(z))
    return np.tanh(sp) + z / (1.0 + np.exp(-z)) / np.cosh(sp) ** 2


def _all(act, z, dh, dtype):
    """Forward, forward with cached derivative, recomputed backward (without and with h) and
    cached backward of one activation, through the public kernels."""
    h, hg, g = np.empty_like(z), np.empty_like(z), np.empty_like(z)
    A.bias_act_forward(h, z.copy(), None, act)
    A.bias_act_forward(hg, z.copy(), None, act, grad=g)
    dz = A.act_backward(np.empty_like(z), dh, z, act)
    dzh = A.act_backward(np.empty_like(z), dh, z, act, h=h)
    dzc = A.act_backward_cached(np.empty_like(z), dh, g)
    return h, hg, g, dz, dzh, dzc


# ----------------------------------------------------------------------------- relu2
@pytest.mark.parametrize("shape", [SMALL, MULTI], ids=["one_block", "multi_block"])
@pytest.mark.parametrize("dtype", DTYPES)
def test_relu2_is_exactly_the_formula(dtype, shape):
    # Check that relu2 gives exactly max(z, 0)^2 and act' = 2 max(z, 0) (both exact in
    # floating point) in every form: forward, cached derivative, both backwards.
    z = _z(shape, dtype)
    dh = _z(shape, dtype, seed=1)
    r = np.maximum(z, 0)
    h, hg, g, dz, dzh, dzc = _all("relu2", z, dh, dtype)
    for got in (h, hg):
        np.testing.assert_array_equal(got, r * r)
    np.testing.assert_array_equal(g, 2 * r)
    for got in (dz, dzh, dzc):
        np.testing.assert_array_equal(got, dh * (2 * r))
    np.testing.assert_array_equal(R.relu2(z), r * r)
    np.testing.assert_array_equal(R.relu2_grad(z), 2 * r)


# ----------------------------------------------------------------------------- mish
@pytest.mark.parametrize("shape", [SMALL, MULTI], ids=["one_block", "multi_block"])
@pytest.mark.parametrize("dtype", DTYPES)
def test_mish_matches_formula_and_reference(dtype, shape):
    # Check that mish and its derivative, in every form, match the float64 formula (a few
    # ulps of the dtype) and kernels.reference (its tolerance).
    z = _z(shape, dtype)
    dh = _z(shape, dtype, seed=1)
    want_h, want_g = _mish64(z), _mish64_grad(z)
    tight = dict(rtol=4e-7, atol=1e-7) if dtype == np.float32 else dict(rtol=1e-14, atol=1e-15)
    h, hg, g, dz, dzh, dzc = _all("mish", z, dh, dtype)
    for got in (h, hg):
        np.testing.assert_allclose(got, want_h, **tight)
        np.testing.assert_allclose(got, R.mish(z), **TOL[dtype])
    np.testing.assert_allclose(g, want_g, **tight)
    np.testing.assert_allclose(g, R.mish_grad(z), **TOL[dtype])
    for got in (dz, dzh, dzc):
        np.testing.assert_allclose(got, dh * want_g, rtol=tight["rtol"] * 2,
                                   atol=tight["atol"] * np.abs(dh).max())


def test_mish_values_at_known_points():
    # Check mish at points with closed forms: mish(0) = 0, mish'(0) = tanh(log 2) = 0.6,
    # mish(1) = tanh(log(1 + e)), and its minimum (-0.308843 at z = -1.192431, a root of act'
    # found with scipy's brentq on the float64 formula) where act' changes sign.
    z = np.array([[0.0, 1.0, -1.0, -1.19244, -1.19242, -1.192431]], np.float64)
    h, g = np.empty_like(z), np.empty_like(z)
    A.bias_act_forward(h, z.copy(), None, "mish", grad=g)
    assert h[0, 0] == 0.0
    assert g[0, 0] == pytest.approx(0.6, rel=1e-15)
    assert h[0, 1] == pytest.approx(math.tanh(math.log1p(math.e)), rel=1e-15)
    assert h[0, 2] == pytest.approx(-math.tanh(math.log1p(math.exp(-1.0))), rel=1e-15)
    assert g[0, 3] < 0.0 < g[0, 4]
    assert h[0, 5] == pytest.approx(-0.30884341301725, rel=1e-12)


@pytest.mark.parametrize("dtype", DTYPES)
def test_mish_extreme_inputs_finite_and_warning_free(dtype):
    # Check that mish and act' at +-1e4, +-88, 0 (and the dtype's largest numbers, +-inf)
    # are finite where the function is, equal the limits (z and 1 above, 0 below: the
    # values there are tiny numbers, |.| < 1e-30) and raise no floating-point error or
    # warning of any kind, underflow included, in every form.
    big = float(np.finfo(dtype).max)
    z = np.array([[1e4, -1e4, 88.0, -88.0, 0.0, big, -big, np.inf, -np.inf]], dtype)
    want_h = np.array([[1e4, 0.0, 88.0, 0.0, 0.0, big, 0.0, np.inf, 0.0]])
    want_g = np.array([[1.0, 0.0, 1.0, 0.0, 0.6, 1.0, 0.0, 1.0, 0.0]])
    dh = np.ones_like(z)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        with np.errstate(all="raise"):
            h, hg, g, dz, dzh, dzc = _all("mish", z, dh, dtype)
            zg = z.copy()
            A.bias_act_forward(np.empty_like(z), zg, None, "mish", grad=zg)  # grad over z
    for got in (h, hg):
        np.testing.assert_allclose(got, want_h, rtol=1e-6, atol=1e-30)
    for got in (g, dz, dzh, dzc, zg):
        np.testing.assert_allclose(got, want_g, rtol=1e-6, atol=1e-30)
        assert np.isfinite(got).all()


@pytest.mark.parametrize("dtype", DTYPES)
def test_mish_clamp_edges_are_continuous(dtype):
    # Check that across the kernel's clamping points (exp's argument limited to [lo, hi])
    # mish and act' stay within float tolerance of the float64 formula, i.e. the clamps sit
    # where the clamped terms no longer matter (hi) or are negligible (lo, |act| < 1e-30).
    eps = np.finfo(dtype).eps
    z = np.concatenate([np.linspace(15.0, 45.0, 301), np.linspace(-120.0, -60.0, 301)])
    z = z.astype(dtype).reshape(1, -1)
    h, g = np.empty_like(z), np.empty_like(z)
    A.bias_act_forward(h, z.copy(), None, "mish", grad=g)
    np.testing.assert_allclose(h, _mish64(z), rtol=4 * eps, atol=1e-30)
    np.testing.assert_allclose(g, _mish64_grad(z), rtol=4 * eps, atol=1e-30)


# ----------------------------------------------------------------------------- both
@pytest.mark.parametrize("act", ["relu2", "mish"])
def test_derivative_matches_finite_differences(act):
    # Check that the recomputed and the cached derivative are the gradient of
    # L = sum(act(z) * W) by float64 central differences, from the tails to the middle.
    rng = np.random.default_rng(3)
    z = np.concatenate([rng.uniform(-4.0, 4.0, 30), [-30.0, -12.0, -1.19, 0.05, 12.0, 30.0]])
    z = z.reshape(4, 9)
    W = rng.standard_normal(z.shape)
    h = np.empty_like(z)

    def loss():
        return float(np.sum(A.bias_act_forward(h, z.copy(), None, act) * W))

    fd = numeric_grad(loss, z)
    np.testing.assert_allclose(A.act_backward(np.empty_like(z), W, z, act), fd,
                               rtol=1e-6, atol=1e-7)
    g = np.empty_like(z)
    A.bias_act_forward(np.empty_like(z), z.copy(), None, act, grad=g)
    np.testing.assert_allclose(g * W, fd, rtol=1e-6, atol=1e-7)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("act", ["relu2", "mish"])
def test_split_over_threads_matches_reference_and_one_thread(act, dtype, monkeypatch):
    # Check that at 2 threads a large pass is split (2 slices), agrees with the reference
    # with a bias added, and is bit-identical to the same pass at 1 thread.
    seen = []
    real = A._split

    def spy(fn, n, row_len, k=None):
        seen.append(real(fn, n, row_len, k=k))
        return seen[-1]

    monkeypatch.setattr(A, "_split", spy)
    z0 = _z(SPLIT, dtype)
    bias = np.random.default_rng(4).standard_normal(SPLIT[1]).astype(dtype)
    dh = _z(SPLIT, dtype, seed=5)
    zb = z0 + bias
    runs = []
    for threads in (2, 1):
        with num_threads(threads):
            z, zg = z0.copy(), z0.copy()
            h, hg, g = np.empty_like(z), np.empty_like(z), np.empty_like(z)
            A.bias_act_forward(h, z, bias, act)
            A.bias_act_forward(hg, zg, bias, act, grad=g)
            dz = A.act_backward(np.empty_like(z), dh, z, act)
            dzc = A.act_backward_cached(np.empty_like(z), dh, g)
            runs.append((h, hg, g, dz, dzc))
    assert seen[:4] == [2, 2, 2, 2]
    h, hg, g, dz, dzc = runs[0]
    want_g = R.activation_grad(zb, act)
    np.testing.assert_allclose(h, R.activation(zb, act), **TOL[dtype])
    np.testing.assert_allclose(hg, R.activation(zb, act), **TOL[dtype])
    np.testing.assert_allclose(g, want_g, **TOL[dtype])
    np.testing.assert_allclose(dz, dh * want_g, rtol=TOL[dtype]["rtol"],
                               atol=TOL[dtype]["atol"] * 30)
    for a, b, name in zip(runs[0], runs[1], ("h", "h (grad)", "grad", "dz", "dz cached")):
        np.testing.assert_array_equal(a, b, err_msg=name)

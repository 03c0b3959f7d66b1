"""Fused bias + activation kernels against kernels.reference, finite differences and the
exact GELU; in-place and aliasing behaviour; argument checks; extreme inputs."""
from __future__ import annotations

import math
import threading
import tracemalloc

import numpy as np
import pytest
from scipy.special import ndtr

from kernels import activations as A
from kernels import memory, num_threads, parallel
from kernels import reference as R
from gradcheck import numeric_grad

ACTS = A.ACTIVATIONS
DTYPES = [np.float64, np.float32]
# float64: the reference's rounding differs from ours by a few ulps; its 1 + erf / 1 + tanh
# cancel in the left tail, hence the small atol. float32: float32 tolerance.
TOL = {np.float64: dict(rtol=1e-12, atol=1e-14), np.float32: dict(rtol=2e-5, atol=2e-6)}
SLOPE = 0.01
# Floating-point errors that must not happen (underflow to 0 is the right answer at the
# extremes, and numpy ignores it by default).
FP_RAISE = dict(over="raise", invalid="raise", divide="raise", under="ignore")

def _multi_block_shape(d, dtype):
    """(N, d) with N not a multiple of the 32-row blocks of the column sums."""
    return (101, d)


def _shapes(dtype):
    # N = 1, widths that are not multiples of the 16-lane vectors, rows past 32-row blocks.
    return [(1, 1), (1, 17), (3, 5), (8, 800), (101, 777), (70, 64)]


def every_dtype_and_act(test):
    """Parametrize ``test(dtype, act, ...)`` over every dtype and every activation."""
    return pytest.mark.parametrize("dtype", DTYPES)(pytest.mark.parametrize("act", ACTS)(test))


def _z(rng, shape, dtype, scale=3.0):
    z = (scale * rng.standard_normal(shape)).astype(dtype)
    z.flat[:4] = [0.0, -0.0, 1e-3, -1e-3][: z.size]  # the kinks of relu / leaky_relu
    return z


def _zs(seed, dtype):
    """For each of ``_shapes(dtype)``: an rng (seeded once, for what the caller draws next),
    the shape and z of that shape (``_z``)."""
    rng = np.random.default_rng(seed)
    for shape in _shapes(dtype):
        yield rng, shape, _z(rng, shape, dtype)


def _z_and_bias(seed, dtype, d=300):
    """z (``_z``) of several row blocks of width ``d`` plus a remainder, and a bias row."""
    rng = np.random.default_rng(seed)
    z = _z(rng, _multi_block_shape(d, dtype), dtype)
    return z, rng.standard_normal(d).astype(dtype)


# The references run in float64 (a float32 reference would carry its own cancellations,
# e.g. 1 + tanh in the left tail) on the float32 values, and are rounded back; z += bias is
# done in the dtype, as the kernels do.
def _ref_forward(z, bias, act, slope=SLOPE):
    zr = z.copy()
    if bias is not None:
        zr += bias
    hr = np.empty(z.shape)
    R.bias_act_forward(hr, zr.astype(np.float64), None, act, slope)
    return hr.astype(z.dtype), zr


def _ref_backward(dh, z, act, slope=SLOPE):
    dzr = np.empty(z.shape)
    R.act_backward(dzr, dh.astype(np.float64), z.astype(np.float64), act, slope)
    return dzr.astype(z.dtype)


# ----------------------------------------------------------------------------- vs reference
@every_dtype_and_act
@pytest.mark.parametrize("with_bias", [False, True])
def test_forward_matches_reference(dtype, act, with_bias):
    # Check that h = act(z + bias) and the in-place z += bias match the reference over
    # shapes from one element to several row blocks plus a remainder block.
    for rng, shape, z in _zs(1, dtype):
        bias = rng.standard_normal(shape[1]).astype(dtype) if with_bias else None
        hr, zr = _ref_forward(z, bias, act)
        h = np.empty_like(z)
        out = A.bias_act_forward(h, z, bias, act, SLOPE)
        assert out is h
        np.testing.assert_array_equal(z, zr, err_msg=f"z += bias {shape}")
        np.testing.assert_allclose(h, hr, **TOL[dtype], err_msg=f"h {shape}")


@every_dtype_and_act
def test_backward_matches_reference(dtype, act):
    # Check that dz = dh * act'(z) matches the reference, with and without the forward output h.
    for rng, shape, z in _zs(2, dtype):
        dh = rng.standard_normal(shape).astype(dtype)
        dzr = _ref_backward(dh, z, act)
        h = np.empty_like(z)
        A.bias_act_forward(h, z, None, act, SLOPE)
        for hh in (None, h):
            dz = np.empty_like(z)
            out = A.act_backward(dz, dh, z, act, SLOPE, h=hh)
            assert out is dz
            np.testing.assert_allclose(dz, dzr, **TOL[dtype],
                                       err_msg=f"dz {shape} h={'given' if hh is not None else None}")


@pytest.mark.parametrize("slope", [0.0, 0.2, 1.0, 1.5, -0.3])
@pytest.mark.parametrize("dtype", DTYPES)
def test_leaky_relu_slopes(slope, dtype):
    # Check that leaky_relu forward and backward match the reference for slopes in [0, 1] and
    # outside it (negative, > 1), with act' exactly 1 or slope.
    rng = np.random.default_rng(3)
    z = _z(rng, _multi_block_shape(100, dtype), dtype)
    dh = np.ones_like(z)
    hr, _ = _ref_forward(z, None, "leaky_relu", slope)
    h = np.empty_like(z)
    A.bias_act_forward(h, z, None, "leaky_relu", slope)
    np.testing.assert_allclose(h, hr, **TOL[dtype])
    dz = np.empty_like(z)
    A.act_backward(dz, dh, z, "leaky_relu", slope)
    np.testing.assert_array_equal(dz, _ref_backward(dh, z, "leaky_relu", slope))


@pytest.mark.parametrize("dtype", DTYPES)
def test_empty_arrays(dtype):
    # Check that N = 0 or d = 0 is a no-op that returns the output.
    for shape in [(0, 5), (4, 0)]:
        z = np.zeros(shape, dtype)
        h = np.zeros(shape, dtype)
        assert A.bias_act_forward(h, z, np.zeros(shape[1], dtype), "gelu") is h
        assert A.act_backward(h, z, z, "gelu") is h
        db = np.ones(shape[1], dtype)
        A.bias_grad(db, z)
        np.testing.assert_array_equal(db, np.ones(shape[1], dtype))


# ----------------------------------------------------------------------------- exact GELU in float32
def _exact_gelu():
    """float32 z from -13 to 13 (1, 200001), and GELU(z) and GELU'(z) computed in float64
    with scipy's ndtr: Phi(z) z and Phi(z) + z phi(z)."""
    z = np.linspace(-13.0, 13.0, 200_001).astype(np.float32)[None, :]
    z64 = z.astype(np.float64)
    phi = np.exp(-0.5 * z64 * z64) / math.sqrt(2.0 * math.pi)
    return z, z64 * ndtr(z64), ndtr(z64) + z64 * phi


def _assert_gelu_ulps(h, z, h_exact):
    """h within a few float32 ulps of the exact GELU: 1.5e-6 relative for |z| < 5, 1e-5 out
    to the underflow (exp(-z^2/2) of a float32 z^2 loses ~z^2 ulps)."""
    rel = np.abs(h - h_exact) / np.maximum(np.abs(h_exact), 1e-37)
    bulk = np.abs(z) < 5
    assert rel[bulk].max() < 1.5e-6, rel[bulk].max()
    assert rel.max() < 1e-5, rel.max()


def test_gelu_float32_close_to_exact():
    # Check that the float32 GELU (polynomial erfc) is within a few float32 ulps of the exact
    # GELU computed in float64 with scipy's ndtr, from the bulk out to the underflow.
    z, h_exact, d_exact = _exact_gelu()
    h = np.empty_like(z)
    A.bias_act_forward(h, z.copy(), None, "gelu")
    dz = np.empty_like(z)
    A.act_backward(dz, np.ones_like(z), z, "gelu")
    _assert_gelu_ulps(h, z, h_exact)
    assert np.abs(dz - d_exact).max() < 5e-7


# ----------------------------------------------------------------------------- finite differences
def _fd_z(rng, shape):
    # Away from relu's kink: |z| >= 0.1.
    z = rng.standard_normal(shape)
    return np.sign(z) * (0.1 + np.abs(z))


def _fd_problem(seed, act):
    """z (4, 7) away from the kinks, R, and the central-difference gradient of
    L = sum(act(z) * R) with respect to z (float64)."""
    rng = np.random.default_rng(seed)
    z = _fd_z(rng, (4, 7))
    Rw = rng.standard_normal(z.shape)
    h = np.empty_like(z)

    def loss():
        return float(np.sum(A.bias_act_forward(h, z.copy(), None, act, SLOPE) * Rw))

    return z, Rw, numeric_grad(loss, z)


@pytest.mark.parametrize("act", ACTS)
def test_backward_matches_finite_differences(act):
    # Check that dz is the gradient of L = sum(act(z) * R) (central differences, float64).
    z, Rw, want = _fd_problem(4, act)
    dz = A.act_backward(np.empty_like(z), Rw, z, act, SLOPE)
    np.testing.assert_allclose(dz, want, rtol=1e-6, atol=1e-8)


@pytest.mark.parametrize("act", ["gelu", "silu", "tanh"])
def test_bias_grad_matches_finite_differences(act):
    # Check that bias_grad of dz is dL/dbias for L = sum(act(z + bias) * R).
    rng = np.random.default_rng(5)
    z0 = _fd_z(rng, (6, 5))
    bias = rng.standard_normal(5)
    Rw = rng.standard_normal(z0.shape)
    h = np.empty_like(z0)

    def loss():
        return float(np.sum(A.bias_act_forward(h, z0.copy(), bias, act) * Rw))

    z = z0.copy()
    A.bias_act_forward(h, z, bias, act)
    dz = A.act_backward(np.empty_like(z), Rw, z, act, h=h)
    db = A.bias_grad(np.zeros(5), dz)
    np.testing.assert_allclose(db, numeric_grad(loss, bias), rtol=1e-6, atol=1e-8)


# ----------------------------------------------------------------------------- bias_grad
@pytest.mark.parametrize("dtype", DTYPES)
def test_bias_grad_accumulates(dtype):
    # Check that bias_grad adds dz.sum(0) to db in place (twice gives twice) and returns db.
    rng = np.random.default_rng(6)
    dz = rng.standard_normal((300, 37)).astype(dtype)
    db0 = rng.standard_normal(37).astype(dtype)
    db = db0.copy()
    assert A.bias_grad(db, dz) is db
    expected = R.bias_grad(db0.copy(), dz)
    np.testing.assert_allclose(db, expected, rtol=TOL[dtype]["rtol"] * 10, atol=TOL[dtype]["atol"] * 10)
    A.bias_grad_unchecked(db, dz)
    np.testing.assert_allclose(db, R.bias_grad(expected, dz), rtol=TOL[dtype]["rtol"] * 10,
                               atol=TOL[dtype]["atol"] * 10)


# ----------------------------------------------------------------------------- in place / aliasing
@every_dtype_and_act
def test_forward_in_place_h_is_z(dtype, act):
    # Check that h may be z itself: z then holds act(z + bias), as the reference computes.
    z, bias = _z_and_bias(7, dtype)
    hr, _ = _ref_forward(z, bias, act)
    out = A.bias_act_forward(z, z, bias, act, SLOPE)
    assert np.shares_memory(out, z)
    np.testing.assert_allclose(z, hr, **TOL[dtype])


@every_dtype_and_act
def test_backward_in_place_dz_is_dh(dtype, act):
    # Check that dz may be dh itself (and z, h views of other arrays are untouched).
    rng = np.random.default_rng(8)
    z = _z(rng, _multi_block_shape(300, dtype), dtype)
    dh = rng.standard_normal(z.shape).astype(dtype)
    dzr = _ref_backward(dh, z, act)
    h = np.empty_like(z)
    A.bias_act_forward(h, z, None, act, SLOPE)
    z_before = z.copy()
    out = A.act_backward(dh, dh, z, act, SLOPE, h=h)
    assert np.shares_memory(out, dh)
    np.testing.assert_allclose(dh, dzr, **TOL[dtype])
    np.testing.assert_array_equal(z, z_before)


@pytest.mark.parametrize("act", ["relu", "gelu", "sigmoid"])
def test_outputs_written_in_place(act):
    # Check that results land in the arrays given (no copies): h, dz and db.
    rng = np.random.default_rng(9)
    z = rng.standard_normal((50, 40)).astype(np.float32)
    h, dz, db = np.empty_like(z), np.empty_like(z), np.zeros(40, np.float32)
    assert np.shares_memory(A.bias_act_forward(h, z, None, act), h)
    assert np.shares_memory(A.act_backward(dz, z, z, act), dz)
    assert np.shares_memory(A.bias_grad(db, dz), db)


def _big_arrays(seed, dtype):
    """z (1000, 1000), its bias (1000,) (random, from ``seed``), and empty h and dz like z."""
    rng = np.random.default_rng(seed)
    z = rng.standard_normal((1000, 1000)).astype(dtype)
    bias = rng.standard_normal(1000).astype(dtype)
    return z, bias, np.empty_like(z), np.empty_like(z)


def _peak_after_warm_up(step):
    """Bytes at the traced peak of a second ``step()`` on one thread (the inline path; split
    passes: test_split_passes_allocate_no_arrays), the first one allocating the scratch."""
    with num_threads(1):
        step()
        tracemalloc.start()
        try:
            step()
            return tracemalloc.get_traced_memory()[1]
        finally:
            tracemalloc.stop()


@every_dtype_and_act
def test_no_allocation_after_warm_up(dtype, act):
    # Check that, once the per-thread scratch exists, forward (with bias) and backward (with
    # and without h) allocate no arrays: traced peak stays at the few Python objects (views)
    # a call makes, far below one block (broadcast adds and comparisons into float outputs
    # would make numpy allocate 8-32 KiB buffers; whole-array temporaries, megabytes).
    z, bias, h, dz = _big_arrays(10, dtype)

    def step():
        A.bias_act_forward(h, z, bias, act, SLOPE)
        A.act_backward(dz, h, z, act, SLOPE)
        A.act_backward(dz, h, z, act, SLOPE, h=h)

    peak = _peak_after_warm_up(step)
    assert peak < 4096, peak


def test_concurrent_calls_from_two_threads():
    # Check that concurrent calls from two threads (sharing the column-sum scratch shapes)
    # give the same results as sequential calls.
    rng = np.random.default_rng(11)
    zs = [rng.standard_normal((400, 256)).astype(np.float32) for _ in range(2)]
    expected = []
    for z in zs:
        h = np.empty_like(z)
        expected.append(A.bias_act_forward(h, z.copy(), None, "gelu").copy())
    errors = []

    def work(k):
        h = np.empty_like(zs[k])
        for _ in range(30):
            A.bias_act_forward(h, zs[k].copy(), None, "gelu")
            if not np.array_equal(h, expected[k]):
                errors.append(k)
                return

    threads = [threading.Thread(target=work, args=(k,)) for k in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert errors == []


# ----------------------------------------------------------------------------- extreme inputs
# act(z) and act'(z) at z = +1e4 and -1e4 (limits).
_LIMITS = {
    "identity": ((1e4, -1e4), (1.0, 1.0)),
    "relu": ((1e4, 0.0), (1.0, 0.0)),
    "leaky_relu": ((1e4, -1e4 * SLOPE), (1.0, SLOPE)),
    "gelu": ((1e4, 0.0), (1.0, 0.0)),
    "gelu_tanh": ((1e4, 0.0), (1.0, 0.0)),
    "silu": ((1e4, 0.0), (1.0, 0.0)),
    "sigmoid": ((1.0, 0.0), (0.0, 0.0)),
    "tanh": ((1.0, -1.0), (0.0, 0.0)),
    "relu2": ((1e8, 0.0), (2e4, 0.0)),
    "mish": ((1e4, 0.0), (1.0, 0.0)),
}


@every_dtype_and_act
def test_extreme_inputs_no_overflow(dtype, act):
    # Check that |z| = 1e4 gives the limits with no overflow, invalid or divide-by-zero
    # (underflow to 0 is the right answer there and numpy ignores it by default).
    z = np.array([[1e4, -1e4] * 3], dtype)
    (hp, hm), (dp, dm) = _LIMITS[act]
    with np.errstate(**FP_RAISE):
        h = A.bias_act_forward(np.empty_like(z), z.copy(), None, act, SLOPE)
        dz = A.act_backward(np.empty_like(z), np.ones_like(z), z, act, SLOPE)
        dzh = A.act_backward(np.empty_like(z), np.ones_like(z), z, act, SLOPE, h=h)
    for got in (h, dz, dzh):
        assert np.isfinite(got).all()
    np.testing.assert_allclose(h[0, ::2], hp, rtol=1e-6, atol=1e-30)
    np.testing.assert_allclose(h[0, 1::2], hm, rtol=1e-6, atol=1e-30)
    for d in (dz, dzh):
        np.testing.assert_allclose(d[0, ::2], dp, rtol=1e-6, atol=1e-30)
        np.testing.assert_allclose(d[0, 1::2], dm, rtol=1e-6, atol=1e-30)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("act", ["silu", "sigmoid"])
def test_clamped_exp_far_below_the_clamp(dtype, act):
    # Check that silu and sigmoid, which clamp exp's argument, stay at their limits (tiny,
    # |.| < 1e-30) for z far below the clamping point, down to the dtype's most negative
    # number, in every form, and at z = +max too.
    big = float(np.finfo(dtype).max)
    z = np.array([[-1e20, -1e30, -big, big]], dtype)
    want_h = [0.0, 0.0, 0.0, big if act == "silu" else 1.0]
    want_g = [0.0, 0.0, 0.0, 1.0 if act == "silu" else 0.0]
    h, g = np.empty_like(z), np.empty_like(z)
    with np.errstate(**FP_RAISE):
        A.bias_act_forward(h, z.copy(), None, act, grad=g)
        dz = A.act_backward(np.empty_like(z), np.ones_like(z), z, act)
    np.testing.assert_allclose(h[0], want_h, rtol=1e-6, atol=1e-30)
    for got in (g, dz):
        np.testing.assert_allclose(got[0], want_g, rtol=1e-6, atol=1e-30)


# ----------------------------------------------------------------------------- bad inputs
def _arrays(shape=(4, 3), dtype=np.float32):
    return np.zeros(shape, dtype), np.zeros(shape, dtype)


@pytest.mark.parametrize("call, exc, name", [
    (lambda h, z: A.bias_act_forward(h, z.astype(np.float16)), TypeError, "z"),
    (lambda h, z: A.bias_act_forward(h, z.tolist()), TypeError, "z"),
    (lambda h, z: A.bias_act_forward(h.astype(np.float64), z), TypeError, "h"),
    (lambda h, z: A.bias_act_forward(h[:3], z), ValueError, "h"),
    (lambda h, z: A.bias_act_forward(h.ravel(), z.ravel()), ValueError, "z"),
    (lambda h, z: A.bias_act_forward(h[:, :2], np.zeros((4, 6), np.float32)[:, ::3]), ValueError, "z"),
    (lambda h, z: A.bias_act_forward(h, z, np.zeros(4, np.float32)), ValueError, "bias"),
    (lambda h, z: A.bias_act_forward(h, z, np.zeros(3, np.float64)), TypeError, "bias"),
    (lambda h, z: A.bias_act_forward(h, z, z[0]), ValueError, "bias"),
    (lambda h, z: A.bias_act_forward(h, z, act="swish"), ValueError, "act"),
    (lambda h, z: A.bias_act_forward(h, z, act="leaky_relu", negative_slope="0.1"), TypeError,
     "negative_slope"),
    (lambda h, z: A.bias_act_forward(h, z, act="leaky_relu", negative_slope=float("nan")),
     ValueError, "negative_slope"),
    (lambda h, z: A.act_backward(h, z.astype(np.float64), z), TypeError, "dh"),
    (lambda h, z: A.act_backward(h[:2], z, z), ValueError, "dz"),
    (lambda h, z: A.act_backward(h, z, z, h=z[:, :2].copy()), ValueError, "h"),
    (lambda h, z: A.act_backward(h, z, z, act="softmax"), ValueError, "act"),
    (lambda h, z: A.bias_grad(np.zeros(4, np.float32), z), ValueError, "db"),
    (lambda h, z: A.bias_grad(np.zeros(3, np.float64), z), TypeError, "db"),
    (lambda h, z: A.bias_grad(np.zeros(3, np.float32), z[0]), ValueError, "dz"),
    # the cached derivative: forward's grad, act_backward_cached
    (lambda h, z: A.bias_act_forward(h, z, grad=z[:2]), ValueError, "grad"),
    (lambda h, z: A.bias_act_forward(h, z, grad=z.astype(np.float64)), TypeError, "grad"),
    (lambda h, z: A.bias_act_forward(h, z, grad=h), ValueError, "grad"),
    (lambda h, z: A.bias_act_forward(z, z, grad=z), ValueError, "grad"),
    (lambda h, z: A.act_backward_cached(h, z, z.astype(np.float64)), TypeError, "dh"),
    (lambda h, z: A.act_backward_cached(h[:2], z, z), ValueError, "dz"),
    (lambda h, z: A.act_backward_cached(h, z, z.tolist()), TypeError, "grad"),
])
def test_bad_inputs_raise_naming_the_argument(call, exc, name):
    # Check that each bad argument raises TypeError/ValueError whose message names it.
    h, z = _arrays()
    with pytest.raises(exc, match=rf"^{name}\b"):
        call(h, z)


def test_partial_overlap_rejected():
    # Check that an output overlapping an input without being it raises (exact aliasing is
    # fine), naming the output.
    big = np.zeros((5, 3), np.float32)
    with pytest.raises(ValueError, match=r"^h\b"):
        A.bias_act_forward(big[1:], big[:-1], None, "relu")
    with pytest.raises(ValueError, match=r"^dz\b"):
        A.act_backward(big[1:], big[:-1], np.zeros((4, 3), np.float32), "relu")
    with pytest.raises(ValueError, match=r"^db\b"):
        A.bias_grad(big[1], big[:-1])


def test_unchecked_cores_match_checked():
    # Check that the exported unchecked cores compute what the checked functions compute.
    rng = np.random.default_rng(12)
    z = rng.standard_normal((70, 33)).astype(np.float32)
    bias = rng.standard_normal(33).astype(np.float32)
    dh = rng.standard_normal(z.shape).astype(np.float32)
    z1, z2 = z.copy(), z.copy()
    h1 = A.bias_act_forward(np.empty_like(z), z1, bias, "gelu")
    h2 = A.bias_act_forward_unchecked(np.empty_like(z), z2, bias, "gelu")
    np.testing.assert_array_equal(h1, h2)
    np.testing.assert_array_equal(z1, z2)
    np.testing.assert_array_equal(A.act_backward(np.empty_like(z), dh, z1, "gelu"),
                                  A.act_backward_unchecked(np.empty_like(z), dh, z2, "gelu"))


# ----------------------------------------------------------------------------- cached derivative
def _ref_forward_grad(z, bias, act, slope=SLOPE):
    zr = z.copy()
    if bias is not None:
        zr += bias
    hr, gr = np.empty(z.shape), np.empty(z.shape)
    R.bias_act_forward(hr, zr.astype(np.float64), None, act, slope, grad=gr)
    return hr.astype(z.dtype), gr.astype(z.dtype)


@every_dtype_and_act
@pytest.mark.parametrize("grad_is_z", [False, True])
def test_forward_grad_matches_reference(dtype, act, grad_is_z):
    # Check that bias_act_forward(..., grad=) writes h = act(z + bias) and grad = act'(z + bias)
    # as the reference does, with grad a separate array or z itself, over one element to
    # several row blocks plus a remainder.
    for rng, shape, z in _zs(13, dtype):
        bias = rng.standard_normal(shape[1]).astype(dtype)
        hr, gr = _ref_forward_grad(z, bias, act)
        h = np.empty_like(z)
        g = z if grad_is_z else np.empty_like(z)
        assert A.bias_act_forward(h, z, bias, act, SLOPE, grad=g) is h
        np.testing.assert_allclose(h, hr, **TOL[dtype], err_msg=f"h {shape}")
        np.testing.assert_allclose(g, gr, **TOL[dtype], err_msg=f"grad {shape}")


@every_dtype_and_act
def test_forward_grad_with_h_is_z(dtype, act):
    # Check that h may be z itself while grad is a separate array.
    z, bias = _z_and_bias(14, dtype)
    hr, gr = _ref_forward_grad(z, bias, act)
    g = np.empty_like(z)
    A.bias_act_forward(z, z, bias, act, SLOPE, grad=g)
    np.testing.assert_allclose(z, hr, **TOL[dtype])
    np.testing.assert_allclose(g, gr, **TOL[dtype])


@pytest.mark.parametrize("act", ACTS)
def test_forward_grad_matches_finite_differences(act):
    # Check that the cached grad times dh is the gradient of L = sum(act(z) * R) (float64).
    z, Rw, want = _fd_problem(15, act)
    g = np.empty_like(z)
    A.bias_act_forward(np.empty_like(z), z.copy(), None, act, SLOPE, grad=g)
    dz = A.act_backward_cached(np.empty_like(z), Rw, g)
    np.testing.assert_allclose(dz, want, rtol=1e-6, atol=1e-8)


@pytest.mark.parametrize("dtype", DTYPES)
def test_act_backward_cached_matches_reference(dtype):
    # Check that act_backward_cached writes dz = dh * grad, into a new array or over dh.
    rng = np.random.default_rng(16)
    for shape in _shapes(dtype):
        g = rng.standard_normal(shape).astype(dtype)
        dh = rng.standard_normal(shape).astype(dtype)
        dzr = R.act_backward_cached(np.empty_like(dh), dh, g)
        dz = np.empty_like(dh)
        assert A.act_backward_cached(dz, dh, g) is dz
        np.testing.assert_array_equal(dz, dzr)
        assert np.shares_memory(A.act_backward_cached(dh, dh, g), dh)
        np.testing.assert_array_equal(dh, dzr)


def test_gelu_float32_cached_grad_close_to_exact():
    # Check that the float32 GELU computed with its cached derivative keeps the accuracy of the
    # forward-only pass (a few ulps of the exact GELU from scipy's ndtr) and that the derivative
    # is within 5e-7 of the exact one, and relatively accurate in the left tail too.
    z, h_exact, d_exact = _exact_gelu()
    h, g = np.empty_like(z), np.empty_like(z)
    A.bias_act_forward(h, z.copy(), None, "gelu", grad=g)
    _assert_gelu_ulps(h, z, h_exact)
    assert np.abs(g - d_exact).max() < 5e-7
    tail = (z < -3) & (np.abs(d_exact) > 1e-30)
    grel = np.abs(g - d_exact)[tail] / np.abs(d_exact[tail])
    assert grel.max() < 1e-5, grel.max()


@every_dtype_and_act
def test_forward_grad_extreme_inputs(dtype, act):
    # Check that |z| = 1e4 gives the limits of act and act' with the cached derivative too,
    # with no overflow, invalid or divide-by-zero.
    z = np.array([[1e4, -1e4] * 3], dtype)
    (hp, hm), (dp, dm) = _LIMITS[act]
    h = np.empty_like(z)
    with np.errstate(**FP_RAISE):
        A.bias_act_forward(h, z, None, act, SLOPE, grad=z)
    np.testing.assert_allclose(h[0], [hp, hm] * 3, rtol=1e-6, atol=1e-30)
    np.testing.assert_allclose(z[0], [dp, dm] * 3, rtol=1e-6, atol=1e-30)


def test_gelu_signed_zero():
    # Check that GELU at -0.0 and +0.0 gives h = 0 and act' = 1/2 (the sign-bit select treats
    # -0.0 as negative in both of its terms).
    for dtype in DTYPES:
        z = np.array([[0.0, -0.0]], dtype)
        h, g = np.empty_like(z), np.empty_like(z)
        A.bias_act_forward(h, z, None, "gelu", grad=g)
        np.testing.assert_array_equal(h, [[0.0, 0.0]])
        np.testing.assert_allclose(g, [[0.5, 0.5]], rtol=1e-7)


def test_grad_partial_overlap_rejected():
    # Check that a grad overlapping z without being it raises, naming grad.
    big = np.zeros((5, 3), np.float32)
    with pytest.raises(ValueError, match=r"^grad\b"):
        A.bias_act_forward(np.zeros((4, 3), np.float32), big[:-1], None, "gelu", grad=big[1:])


@every_dtype_and_act
def test_cached_no_allocation_after_warm_up(dtype, act):
    # Check that forward with a cached derivative (grad = z) and the cached backward allocate
    # no arrays after the scratch exists.
    z, bias, h, dz = _big_arrays(17, dtype)

    def step():
        A.bias_act_forward(h, z, bias, act, SLOPE, grad=z)
        A.act_backward_cached(dz, h, z)

    peak = _peak_after_warm_up(step)
    assert peak < 4096, peak


# ----------------------------------------------------------------------------- threads
def _split_shape(dtype):
    """An array big enough to be split over two threads, with a remainder block per slice."""
    rows = 2 * parallel.SPLIT_MIN // 777 + 3
    return (rows, 777)


def _split_spy(monkeypatch):
    seen = []
    real = A._split

    def spy(fn, n, row_len, k=None):
        k = real(fn, n, row_len, k=k)
        seen.append(k)
        return k

    monkeypatch.setattr(A, "_split", spy)
    return seen


def test_large_arrays_split_over_threads(monkeypatch):
    # Check that at 2 threads a large pass is split (2 slices) and at 1 thread it is not.
    seen = _split_spy(monkeypatch)
    z = np.zeros(_split_shape(np.float32), np.float32)
    h = np.empty_like(z)
    with num_threads(2):
        A.bias_act_forward(h, z, None, "gelu", grad=z)
        A.act_backward_cached(h, h, z)
        A.act_backward(h, h, z, "relu")
    assert seen == [2, 2, 2]
    with num_threads(1):
        A.bias_act_forward(h, z, None, "gelu", grad=z)
    assert seen == [2, 2, 2]


@every_dtype_and_act
def test_results_do_not_depend_on_thread_count(dtype, act):
    # Check that forward (with and without the cached derivative), backward and the cached
    # backward are bit-identical at 1 and 2 threads on an array large enough to be split.
    rng = np.random.default_rng(18)
    shape = _split_shape(dtype)
    z0 = _z(rng, shape, dtype)
    bias = rng.standard_normal(shape[1]).astype(dtype)
    dh = rng.standard_normal(shape).astype(dtype)
    results = []
    for n in (1, 2):
        with num_threads(n):
            z, zg = z0.copy(), z0.copy()
            h, hg, dz, dzc = (np.empty_like(z0) for _ in range(4))
            A.bias_act_forward(h, z, bias, act, SLOPE)
            A.bias_act_forward(hg, zg, bias, act, SLOPE, grad=zg)
            A.act_backward(dz, dh, z, act, SLOPE)
            A.act_backward_cached(dzc, dh, zg)
            results.append((h, z, hg, zg, dz, dzc))
    for a, b, name in zip(*results, ("h", "z", "h (grad)", "grad", "dz", "dz cached")):
        np.testing.assert_array_equal(a, b, err_msg=name)


def _run_on_every_pool_thread(fn, k=9):
    """``fn()`` once on the calling thread and on each of k - 1 pool threads: every slot of
    the split waits at a barrier, so no thread can run two of them (and a pool of more than
    k - 1 workers is not made by any test here)."""
    barrier = threading.Barrier(k)

    def slot(i0, i1, s):
        barrier.wait(timeout=30)
        fn()

    with num_threads(k):
        assert parallel.split(slot, k, parallel.MIN_ELEMENTS_PER_THREAD, 0) == k


@pytest.mark.parametrize("act", ["gelu", "relu", "silu", "mish"])
def test_split_passes_allocate_no_arrays(act):
    # Check that passes split over 2 threads allocate no arrays once every pool thread has
    # run one activation call (scratch is per thread, allocated whole on a thread's first
    # call): the traced peak of every step (the pool's futures and closures, a few KiB) is
    # the same when every dimension of the arrays doubles.
    zw = np.ones((1, 8), np.float32)
    _run_on_every_pool_thread(lambda: A.bias_act_forward(np.empty_like(zw), zw.copy(), None, act))
    peaks = []
    for k in (1, 2):
        shape = (_split_shape(np.float32)[0] * k, 777 * k)
        z = np.ones(shape, np.float32)
        bias = np.zeros(shape[1], np.float32)
        h, dz = np.empty_like(z), np.empty_like(z)

        def step():
            A.bias_act_forward(h, z, bias, act, SLOPE)
            A.act_backward(dz, h, z, act, SLOPE)
            A.bias_act_forward(h, z, bias, act, SLOPE, grad=z)
            A.act_backward_cached(dz, h, z)

        with num_threads(2):
            for _ in range(3):  # warm-up: the scratch views of every block shape
                step()
            worst = 0
            tracemalloc.start()
            try:
                for _ in range(8):
                    tracemalloc.reset_peak()
                    base = tracemalloc.get_traced_memory()[0]
                    step()
                    worst = max(worst, tracemalloc.get_traced_memory()[1] - base)
            finally:
                tracemalloc.stop()
            peaks.append(worst)
    assert peaks[0] < 16 * 1024, peaks
    assert abs(peaks[1] - peaks[0]) < 1024, peaks


# ----------------------------------------------------------------------------- fused bias gradient
@every_dtype_and_act
@pytest.mark.parametrize("in_place", [False, True])
def test_backward_with_bias_grad_matches_reference(dtype, act, in_place):
    # Check that act_backward(..., db=) writes dz = dh * act'(z) and adds dz.sum(0) into db,
    # with dz separate or dh itself, over shapes from one element to rows past several
    # 32-row sum blocks and widths that are not multiples of 16.
    for rng, shape, z in _zs(19, dtype):
        dh = rng.standard_normal(shape).astype(dtype)
        db0 = rng.standard_normal(shape[1]).astype(dtype)
        dzr = _ref_backward(dh, z, act)
        dbr = db0.astype(np.float64) + dzr.astype(np.float64).sum(0)
        db = db0.copy()
        dz = dh.copy() if in_place else np.empty_like(z)
        out = A.act_backward(dz, dz if in_place else dh, z, act, SLOPE, db=db)
        assert out is dz
        np.testing.assert_allclose(dz, dzr, **TOL[dtype], err_msg=f"dz {shape}")
        np.testing.assert_allclose(db, dbr, rtol=TOL[dtype]["rtol"] * 10,
                                   atol=TOL[dtype]["atol"] * shape[0] * 10, err_msg=f"db {shape}")


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("alias", ["none", "dh", "grad"])
def test_cached_backward_with_bias_grad_matches_reference(dtype, alias):
    # Check that act_backward_cached(..., db=) writes dz = dh * grad and adds its column sums
    # into db, with dz separate, dh itself or grad itself.
    rng = np.random.default_rng(20)
    for shape in _shapes(dtype):
        g = rng.standard_normal(shape).astype(dtype)
        dh = rng.standard_normal(shape).astype(dtype)
        db0 = rng.standard_normal(shape[1]).astype(dtype)
        want = dh.astype(np.float64) * g
        dz = {"none": np.empty_like(dh), "dh": dh, "grad": g}[alias]
        db = db0.copy()
        assert A.act_backward_cached(dz, dh, g, db=db) is dz
        np.testing.assert_allclose(dz, want.astype(dtype), **TOL[dtype])
        np.testing.assert_allclose(db, db0 + want.sum(0), rtol=TOL[dtype]["rtol"] * 10,
                                   atol=TOL[dtype]["atol"] * shape[0] * 10)


@pytest.mark.parametrize("dtype", DTYPES)
def test_bias_grad_sum_is_accurate_over_many_rows(dtype):
    # Check that the fused column sum keeps float32 accuracy over 100k rows (block sums in
    # float32, their total in float64), not the ~N ulps of a running float32 sum.
    rng = np.random.default_rng(21)
    dh = (1.0 + rng.random((100_000, 3))).astype(dtype)
    db = np.zeros(3, dtype)
    A.act_backward_cached(np.empty_like(dh), dh, np.ones_like(dh), db=db)
    exact = dh.astype(np.float64).sum(0)
    err = np.abs(db - exact).max() / exact.max()
    assert err < (2e-7 if dtype == np.float32 else 1e-13), err


@pytest.mark.parametrize("dtype", DTYPES)
def test_bias_grad_bit_identical_across_thread_counts(dtype, monkeypatch):
    # Check that dz and the fused db are the same bits at 1 and 2 threads (columns split over
    # threads, each column summed over all rows in order), for both backward passes.
    monkeypatch.setattr(A, "COLS_SPLIT_MIN", parallel.SPLIT_MIN)  # split at this size
    rng = np.random.default_rng(22)
    shape = _split_shape(dtype)
    z = _z(rng, shape, dtype)
    dh = rng.standard_normal(shape).astype(dtype)
    runs = []
    for n in (1, 2):
        with num_threads(n):
            db1, db2 = np.zeros(shape[1], dtype), np.zeros(shape[1], dtype)
            dz1 = A.act_backward(np.empty_like(z), dh, z, "gelu", db=db1)
            dz2 = A.act_backward_cached(dh.copy(), dh, z, db=db2)
            runs.append((dz1, db1, dz2, db2))
    for a, b in zip(*runs):
        np.testing.assert_array_equal(a, b)


def test_bias_grad_split_over_columns(monkeypatch):
    # Check that at 2 threads a backward with db from COLS_SPLIT_MIN elements is split (over
    # column slices of 16), and below it runs on one thread where the passes without db split.
    seen = _split_spy(monkeypatch)
    z = np.zeros(_split_shape(np.float32), np.float32)
    db = np.zeros(z.shape[1], np.float32)
    assert z.size < A.COLS_SPLIT_MIN
    with num_threads(2):
        A.act_backward(np.empty_like(z), z, z, "relu", db=db)
        A.act_backward_cached(np.empty_like(z), z, z, db=db)
        assert seen == []
        A.act_backward(np.empty_like(z), z, z, "relu")
        assert seen == [2]
        seen.clear()
        monkeypatch.setattr(A, "COLS_SPLIT_MIN", z.size)
        A.act_backward(np.empty_like(z), z, z, "relu", db=db)
        A.act_backward_cached(np.empty_like(z), z, z, db=db)
    assert seen == [2, 2]


# ----------------------------------------------------------------------------- NaN and infinities
_SPECIAL = [np.nan, np.inf, -np.inf, 0.0, -0.0, 1e-40, -1e-40, 1e30, -1e30, 3.0, -3.0]


@every_dtype_and_act
def test_nan_propagates_as_in_the_reference(dtype, act):
    # Check that NaN inputs give NaN exactly where the reference gives NaN (act and act'),
    # and that at infinities, huge and denormal inputs the kernels agree with the reference
    # wherever it is not NaN (at +inf mish' is its limit 1 where the reference's formula
    # makes inf * 0).
    z = np.array([_SPECIAL], dtype)
    with np.errstate(all="ignore"):
        z64 = z.astype(np.float64)
        hr = R.activation(z64, act, SLOPE).astype(dtype)
        gr = R.activation_grad(z64, act, SLOPE).astype(dtype)
        h, g = np.empty_like(z), np.empty_like(z)
        A.bias_act_forward(h, z.copy(), None, act, SLOPE, grad=g)
        dz = A.act_backward(np.empty_like(z), np.ones_like(z), z, act, SLOPE)
    nan_in = np.isnan(z)
    for got, want, name in ((h, hr, "h"), (g, gr, "grad"), (dz, gr, "dz")):
        np.testing.assert_array_equal(np.isnan(got)[nan_in], np.isnan(want)[nan_in], err_msg=name)
        ok = ~np.isnan(want)
        np.testing.assert_allclose(got[ok], want[ok], rtol=TOL[dtype]["rtol"], atol=1e-30,
                                   err_msg=name)


@every_dtype_and_act
def test_backward_dz_is_z(dtype, act):
    # Check that dz may be z itself (the loop then reads each element before writing it).
    rng = np.random.default_rng(23)
    z = _z(rng, (40, 37), dtype)
    dh = rng.standard_normal(z.shape).astype(dtype)
    want = _ref_backward(dh, z, act)
    assert A.act_backward(z, dh, z, act, SLOPE) is z
    np.testing.assert_allclose(z, want, **TOL[dtype])


def test_read_only_output_rejected():
    # Check that outputs (and z when a bias is added in place) must be writeable.
    z = np.zeros((4, 3), np.float32)
    ro = z.copy()
    ro.flags.writeable = False
    with pytest.raises(ValueError, match=r"^h\b"):
        A.bias_act_forward(ro, z)
    with pytest.raises(ValueError, match=r"^z\b"):
        A.bias_act_forward(np.empty_like(z), ro, np.zeros(3, np.float32))
    with pytest.raises(ValueError, match=r"^db\b"):
        A.act_backward(np.empty_like(z), z, z, db=np.zeros(3, np.float32)[::1].copy()[:2])
    with pytest.raises(ValueError, match=r"^dz\b"):
        A.act_backward_cached(ro, z, z)


def test_read_only_inputs_accepted():
    # Check that a read-only z (no bias) and read-only dh are read, not refused.
    rng = np.random.default_rng(24)
    z = rng.standard_normal((6, 5)).astype(np.float32)
    z.flags.writeable = False
    h = A.bias_act_forward(np.empty_like(z), z, None, "gelu")
    np.testing.assert_allclose(h, R.activation(z, "gelu"), **TOL[np.float32])
    dz = A.act_backward(np.empty_like(z), z, z, "gelu")
    np.testing.assert_allclose(dz, z * R.activation_grad(z, "gelu"), **TOL[np.float32])

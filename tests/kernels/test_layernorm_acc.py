"""kernels.layernorm's backward with ``accumulate=True``: dx += the LayerNorm input gradient in
the same pass (llm.c's ``dinp +=``), against reference.py, finite differences and the bits of
the plain backward followed by ``ops.add``."""
import numpy as np
import pytest
from gradcheck import assert_close, numeric_grad

from kernels import ops, reference
from kernels import layernorm as ln
from kernels.layernorm import layernorm_backward, layernorm_forward

DTYPES = [np.float32, np.float64]


def _problem(seed, n, d, dtype):
    rng = np.random.default_rng(seed)
    x = (rng.standard_normal((n, d)) * 2.0 + 0.5).astype(dtype)
    gamma = rng.standard_normal(d).astype(dtype)
    beta = rng.standard_normal(d).astype(dtype)
    dout = rng.standard_normal((n, d)).astype(dtype)
    acc = rng.standard_normal((n, d)).astype(dtype)
    mean, rstd = np.empty(n, dtype), np.empty(n, dtype)
    layernorm_forward(np.empty((n, d), dtype), mean, rstd, x, gamma, beta)
    return x, gamma, dout, acc, mean, rstd


def _plain_then_add(x, gamma, dout, acc, mean, rstd):
    n, d = x.shape
    dx, dg, db = np.empty((n, d), x.dtype), np.zeros(d, x.dtype), np.zeros(d, x.dtype)
    layernorm_backward(dx, dg, db, dout, x, mean, rstd, gamma)
    return ops.add(dx, acc, dx), dg, db


# (3, 5) runs as one block; (300, 200) in blocks of partial sums (split at two threads).
SHAPES = [(3, 5), (300, 200)]


@pytest.mark.parametrize("shape", SHAPES)
def test_accumulate_matches_the_reference_float64(shape):
    # Check that dx (holding acc) += LayerNorm'(dout) and the parameter gradients equal the
    # NumPy reference from the same acc (float64).
    x, gamma, dout, acc, mean, rstd = _problem(1, *shape, np.float64)
    n, d = shape
    dx, dg, db = acc.copy(), np.zeros(d), np.zeros(d)
    res = layernorm_backward(dx, dg, db, dout, x, mean, rstd, gamma, True)
    dx_r, dg_r, db_r = acc.copy(), np.zeros(d), np.zeros(d)
    reference.layernorm_backward(dx_r, dg_r, db_r, dout, x, mean, rstd, gamma, True)
    assert res is dx
    assert_close(dx, dx_r, "dx", rtol=1e-12, atol=1e-12)
    assert_close(dg, dg_r, "dgamma", rtol=1e-12, atol=1e-12)
    assert_close(db, db_r, "dbeta", rtol=1e-12, atol=1e-12)


def test_accumulate_matches_finite_differences():
    # Check dx against central differences of L = sum(out * R) + sum(x * acc): the residual
    # stream's gradient acc is what a path around the LayerNorm adds to dx.
    n, d = 4, 6
    x, gamma, R, acc, mean, rstd = _problem(2, n, d, np.float64)

    def loss():
        out = np.empty((n, d))
        layernorm_forward(out, np.empty(n), np.empty(n), x, gamma, np.zeros(d))
        return float(np.sum(out * R) + np.sum(x * acc))

    dx = acc.copy()
    layernorm_backward(dx, np.zeros(d), np.zeros(d), R, x, mean, rstd, gamma, True)
    assert_close(dx, numeric_grad(loss, x), "dx", rtol=1e-6, atol=1e-8)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("shape", SHAPES)
@pytest.mark.parametrize("dx_is_dout", [False, True], ids=["separate", "dx-is-dout"])
def test_accumulate_gives_the_bits_of_the_plain_backward_then_add(dx_is_dout, shape, dtype):
    # Check that the fused pass writes exactly the bits of the backward followed by
    # ops.add(dx, acc, dx), also when dx is dout itself (dx = dout + LayerNorm'(dout)).
    x, gamma, dout, acc, mean, rstd = _problem(3, *shape, dtype)
    if dx_is_dout:
        acc = dout
    want, dg_w, db_w = _plain_then_add(x, gamma, dout, acc, mean, rstd)
    dx = acc.copy()
    d = shape[1]
    dg, db = np.zeros(d, dtype), np.zeros(d, dtype)
    res = layernorm_backward(dx, dg, db, dx if dx_is_dout else dout, x, mean, rstd, gamma, True)
    assert res is dx
    np.testing.assert_array_equal(dx, want)
    np.testing.assert_array_equal(dg, dg_w)
    np.testing.assert_array_equal(db, db_w)


def test_accumulate_two_threads_give_the_bits_of_one(monkeypatch):
    # Check that split over two threads the accumulated dx has the one-thread bits.
    from kernels import num_threads, parallel
    monkeypatch.setattr(parallel, "SPLIT_WORK", 64 * 1024)
    x, gamma, dout, acc, mean, rstd = _problem(4, 1025, 261, np.float32)
    with num_threads(2):
        assert parallel.threads_for(1025, 261, passes=ln.BWD_COST) == 2
    out = []
    for k in (1, 2):
        dx = acc.copy()
        with num_threads(k):
            layernorm_backward(dx, np.zeros(261, np.float32), np.zeros(261, np.float32), dout,
                               x, mean, rstd, gamma, True)
        out.append(dx)
    np.testing.assert_array_equal(out[1], out[0])


def test_accumulate_on_the_rescue_path_of_huge_rows():
    # Check that rows of huge scale (float32 rstd below the fast path's range, so the
    # float64 rescue runs) add into dx too, with the bits of the rescue followed by ops.add.
    rng = np.random.default_rng(5)
    n, d = 3, 8
    x = (rng.standard_normal((n, d)) * 1e25).astype(np.float32)
    gamma = rng.standard_normal(d).astype(np.float32)
    dout = rng.standard_normal((n, d)).astype(np.float32)
    acc = rng.standard_normal((n, d)).astype(np.float32)
    mean, rstd = np.empty(n, np.float32), np.empty(n, np.float32)
    with np.errstate(over="ignore", invalid="ignore"):
        layernorm_forward(np.empty((n, d), np.float32), mean, rstd, x, gamma, np.zeros(d, np.float32))
    assert rstd.min() < ln._TINY_RSTD[np.dtype(np.float32)]
    want, _, _ = _plain_then_add(x, gamma, dout, acc, mean, rstd)
    dx = acc.copy()
    layernorm_backward(dx, np.zeros(d, np.float32), np.zeros(d, np.float32), dout, x, mean,
                       rstd, gamma, True)
    assert np.isfinite(dx).all()
    np.testing.assert_array_equal(dx, want)


def test_accumulate_must_be_a_bool_and_a_rejected_call_writes_nothing():
    # Check that a non-bool accumulate (an array passed where the flag goes, as an old
    # acc= call would) raises naming it before any output is written.
    n, d = 4, 3
    x, gamma, dout, acc, mean, rstd = _problem(6, n, d, np.float64)
    dx, dg, db = np.full((n, d), 7.0), np.full(d, 7.0), np.full(d, 7.0)
    with pytest.raises(TypeError, match="accumulate"):
        layernorm_backward(dx, dg, db, dout, x, mean, rstd, gamma, acc)
    for a in (dx, dg, db):
        np.testing.assert_array_equal(a, 7.0)

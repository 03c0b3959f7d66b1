"""Embedding: rows gathered for integer ids of any shape and dtype, the scatter-add backward
(repeated ids accumulate) against np.add.at and finite differences, the kernels against
kernels.reference, bad ids rejected with nothing changed, and a steady step's allocations."""
import numpy as np
import pytest
from gradcheck import numeric_grad
from test_step_alloc import _check_two_sizes

from engine import CrossEntropyLoss, Embedding, LayerNorm, Linear, Sequential
from kernels import embedding, reference


@pytest.mark.parametrize("shape", [(7,), (3, 5), (2, 3, 4)])
@pytest.mark.parametrize("idtype", [np.int8, np.uint16, np.int32, np.int64])
def test_forward_gathers_rows(shape, idtype):
    # Check y[...] = W[ids[...]] with y of shape ids.shape + (dim,), for any integer dtype.
    rng = np.random.default_rng(0)
    e = Embedding(11, 4, dtype=np.float64, rng=0)
    ids = rng.integers(0, 11, shape).astype(idtype)
    y = e(ids)
    assert y.shape == (*shape, 4)
    np.testing.assert_array_equal(y, e.W.data[ids.astype(np.int64)])


def test_backward_accumulates_repeated_ids():
    # Check W.grad += scatter of dy's rows (np.add.at as the oracle, ids repeating), that it
    # accumulates over calls until zero_grad, and that backward returns None.
    rng = np.random.default_rng(1)
    e = Embedding(6, 3, dtype=np.float64, rng=0)
    ids = np.array([[0, 5, 0, 2], [2, 2, 5, 0]])
    dy = rng.standard_normal((2, 4, 3))
    expect = np.zeros((6, 3))
    np.add.at(expect, ids, dy)
    e(ids)
    assert e.backward(dy) is None
    np.testing.assert_allclose(e.W.grad, expect, rtol=1e-15)
    assert not e.W.grad[[1, 3, 4]].any()
    e(ids)
    e.backward(dy)
    np.testing.assert_allclose(e.W.grad, 2 * expect, rtol=1e-15)


def test_gradient_matches_finite_differences():
    # Check dW against central finite differences of L = sum(forward(ids) * R) (float64).
    rng = np.random.default_rng(2)
    e = Embedding(5, 3, dtype=np.float64, rng=0)
    ids = rng.integers(0, 5, (4, 6))
    r = rng.standard_normal((4, 6, 3))
    e(ids)
    e.backward(r)
    num = numeric_grad(lambda: float(np.sum(e(ids) * r)), e.W.data)
    np.testing.assert_allclose(e.W.grad, num, rtol=1e-7, atol=1e-9)


def test_the_ids_are_copied():
    # Check that changing the caller's ids array after forward does not change the rows the
    # backward adds into.
    e = Embedding(4, 2, dtype=np.float64, rng=0)
    ids = np.array([1, 3])
    e(ids)
    ids[:] = 0
    e.backward(np.ones((2, 2)))
    np.testing.assert_array_equal(e.W.grad, [[0, 0], [1, 1], [0, 0], [1, 1]])


def test_residual_is_added():
    # Check forward(ids, residual=r) = W[ids] + r.
    rng = np.random.default_rng(3)
    e = Embedding(4, 3, dtype=np.float64, rng=0)
    ids, r = np.array([[0, 3]]), rng.standard_normal((1, 2, 3))
    np.testing.assert_allclose(e(ids, residual=r), e.W.data[ids] + r, rtol=1e-15)


# ----------------------------------------------------------------------------- bad input
@pytest.mark.parametrize("ids,exc,msg", [
    (np.array([[0, 3], [10, 11]]), ValueError, r"got 10 at index \(1, 0\)"),
    (np.array([2, -1, 12]), ValueError, r"got -1 at index \(1,\)"),
    (np.array([1.0, 2.0]), TypeError, "integer array.*float64"),
    (np.array([True, False]), TypeError, "bool"),
    ([1, 2], TypeError, "ndarray"),
    (np.int64(3), TypeError, "ndarray"),
])
def test_bad_ids_are_rejected_and_change_nothing(ids, exc, msg):
    # Check that out-of-range ids (naming the first bad one and where it is), float and bool
    # ids and non-arrays raise, and that the previous forward's backward is then exactly as
    # it would have been.
    rng = np.random.default_rng(4)
    e = Embedding(10, 3, dtype=np.float64, rng=0)
    ids0, dy = np.array([[1, 2], [3, 1]]), rng.standard_normal((2, 2, 3))
    e(ids0)
    w = e.W.data.copy()
    with pytest.raises(exc, match=msg):
        e(ids)
    e.backward(dy)
    expect = np.zeros((10, 3))
    np.add.at(expect, ids0, dy)
    np.testing.assert_array_equal(e.W.grad, expect)
    np.testing.assert_array_equal(e.W.data, w)


def test_backward_rules():
    # Check that backward needs a forward (one backward per forward), rejects dx_acc (ids have
    # no gradient) and a dy of the wrong shape.
    e = Embedding(4, 2, dtype=np.float64, rng=0)
    with pytest.raises(RuntimeError, match="forward"):
        e.backward(np.ones((1, 2)))
    e(np.array([1]))
    with pytest.raises(ValueError, match="dx_acc"):
        e.backward(np.ones((1, 2)), dx_acc=np.zeros(1))
    with pytest.raises(ValueError, match="dy"):
        e.backward(np.ones((2, 2)))
    e.backward(np.ones((1, 2)))
    with pytest.raises(RuntimeError, match="forward"):
        e.backward(np.ones((1, 2)))


# ----------------------------------------------------------------------------- kernels
@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("v,n,d", [(3, 1, 1), (103, 2048, 16), (5000, 300, 7)])
def test_kernels_match_reference(dtype, v, n, d):
    # Check the gather and the scatter-add against fancy indexing and np.add.at.
    rng = np.random.default_rng(5)
    w = rng.standard_normal((v, d)).astype(dtype)
    ids = rng.integers(0, v, n).astype(np.int64)
    dout = rng.standard_normal((n, d)).astype(dtype)
    np.testing.assert_array_equal(embedding.embedding_forward(np.empty((n, d), dtype), ids, w),
                                  reference.embedding_forward(np.empty((n, d), dtype), ids, w))
    g0 = rng.standard_normal((v, d)).astype(dtype)
    fast = embedding.embedding_backward(g0.copy(), ids, dout)
    slow = reference.embedding_backward(g0.copy(), ids, dout)
    np.testing.assert_allclose(fast, slow, rtol=1e-6 if dtype == np.float32 else 1e-14,
                               atol=1e-6 if dtype == np.float32 else 1e-14)


def test_checked_kernels_reject_out_of_range_ids():
    # Check that the checked backward refuses an id the table does not have (the compiled
    # core would write outside the gradient).
    with pytest.raises(ValueError, match="got 4 at index 1"):
        embedding.embedding_backward(np.zeros((4, 2)), np.array([0, 4]), np.ones((2, 2)))
    with pytest.raises(ValueError, match="int64"):
        embedding.embedding_forward(np.empty((2, 2)), np.array([0, 1], np.int32), np.ones((4, 2)))


# ----------------------------------------------------------------------------- allocation
def _make(rng, k):
    m = Sequential(Embedding(50 * k, 32 * k, rng=0), LayerNorm(32 * k),
                   Linear(32 * k, 50 * k, rng=1))
    ids = rng.integers(0, 50 * k, (4, 16 * k))
    return m, ids, rng.integers(0, 50 * k, (4, 16 * k)), CrossEntropyLoss()


def test_steady_step_allocates_no_array():
    # Check that a steady training step through an Embedding allocates no array over 1 KiB
    # (tracemalloc at two sizes, as tests/nn/test_step_alloc.py).
    _check_two_sizes("Embedding", _make, threads=1)

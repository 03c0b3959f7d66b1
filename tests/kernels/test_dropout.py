"""Inverted dropout kernels: keep rate, scaling, reproducibility, equality with the
reference's mask, backward, p = 0, in-place use and argument checks."""
from __future__ import annotations

import tracemalloc

import numpy as np
import pytest

from kernels import dropout as D
from kernels import num_threads, parallel
from kernels import reference as R

DTYPES = [np.float32, np.float64]


def _multi_block_shape(d, dtype):
    """(N, d) holding three dropout blocks and a partial one."""
    per_block = 65536  # elements: three of them and a partial one
    return ((3 * per_block) // d + 7, d)


def _x(shape, dtype, seed=0):
    return np.random.default_rng(seed).standard_normal(shape).astype(dtype)


def _run(x, p, seed):
    out, mask = np.empty_like(x), np.empty_like(x)
    D.dropout_forward(out, mask, x, p, np.random.default_rng(seed))
    return out, mask


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("p", [0.1, 0.5, 0.9])
def test_keep_rate_and_scale(dtype, p):
    # Check that about 1 - p of the elements are kept (5 sigma), that the mask holds only 0 and
    # dtype(1/(1-p)), and that out is x scaled where kept and 0 elsewhere.
    x = _x((400, 500), dtype)
    out, mask = _run(x, p, seed=1)
    kept = mask != 0
    rate = kept.mean()
    sigma = np.sqrt(p * (1 - p) / x.size)
    assert abs(rate - (1 - p)) < 5 * sigma, rate
    scale = np.asarray(1.0 / (1.0 - p), dtype)
    np.testing.assert_array_equal(mask[kept], scale)
    np.testing.assert_array_equal(out[kept], x[kept] * scale)
    np.testing.assert_array_equal(out[~kept], 0)


@pytest.mark.parametrize("dtype", DTYPES)
def test_same_seed_same_mask(dtype):
    # Check that the same seed gives the same mask and a different seed a different one.
    x = _x((64, 300), dtype)
    _, m1 = _run(x, 0.3, seed=5)
    _, m2 = _run(x, 0.3, seed=5)
    _, m3 = _run(x, 0.3, seed=6)
    np.testing.assert_array_equal(m1, m2)
    assert not np.array_equal(m1, m3)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("p", [0.2, 0.5, 0.75])
def test_equals_reference(dtype, p):
    # Check that mask, out and the generator's state afterwards equal the reference's for the
    # same seed, over shapes from one element to several blocks plus a partial one, 3-D too.
    for shape in [(1, 1), (8, 800), _multi_block_shape(777, dtype), (2, 3, 41)]:
        x = _x(shape, dtype, seed=2)
        g_ref, g = np.random.default_rng(11), np.random.default_rng(11)
        out_r, mask_r = np.empty_like(x), np.empty_like(x)
        R.dropout_forward(out_r, mask_r, x, p, g_ref)
        out, mask = np.empty_like(x), np.empty_like(x)
        assert D.dropout_forward(out, mask, x, p, g) is out
        np.testing.assert_array_equal(mask, mask_r, err_msg=f"mask {shape}")
        np.testing.assert_array_equal(out, out_r, err_msg=f"out {shape}")
        assert g.random() == g_ref.random()  # same number of draws


def test_mask_boundary_u_equal_p_is_kept():
    # Check the boundary u >= p: with p equal to the first uniform draw, that element is kept
    # (and one a hair above it is dropped).
    u0 = float(np.random.default_rng(3).random(1, dtype=np.float64)[0])
    x = np.ones((1, 1))
    _, mask = _run(x, u0, seed=3)
    assert mask[0, 0] == 1.0 / (1.0 - u0)
    _, mask = _run(x, np.nextafter(u0, 1.0), seed=3)
    assert mask[0, 0] == 0.0


@pytest.mark.parametrize("dtype", DTYPES)
def test_backward_applies_mask(dtype):
    # Check that dx = dout * mask with the forward's mask, written into dx, also in place.
    x = _x(_multi_block_shape(100, dtype), dtype)
    _, mask = _run(x, 0.4, seed=4)
    dout = _x(x.shape, dtype, seed=9)
    expected = np.empty_like(x)
    R.dropout_backward(expected, dout, mask)
    dx = np.empty_like(x)
    assert D.dropout_backward(dx, dout, mask) is dx
    np.testing.assert_array_equal(dx, expected)
    res = D.dropout_backward(dout, dout, mask)
    assert np.shares_memory(res, dout)
    np.testing.assert_array_equal(dout, expected)


@pytest.mark.parametrize("dtype", DTYPES)
def test_p_zero_is_identity(dtype):
    # Check that p = 0 gives out = x (a copy into out), a mask of ones, and draws nothing.
    x = _x((30, 20), dtype)
    out, mask = np.empty_like(x), np.empty_like(x)
    g = np.random.default_rng(7)
    D.dropout_forward(out, mask, x, 0.0, g)
    np.testing.assert_array_equal(out, x)
    assert not np.shares_memory(out, x)
    np.testing.assert_array_equal(mask, 1.0)
    assert g.random() == np.random.default_rng(7).random()
    x0 = x.copy()
    assert D.dropout_forward(x, mask, x, 0, g) is x  # out is x: nothing to do
    np.testing.assert_array_equal(x, x0)


@pytest.mark.parametrize("dtype", DTYPES)
def test_forward_in_place_out_is_x(dtype):
    # Check that out may be x itself and gives the reference's result.
    x = _x(_multi_block_shape(300, dtype), dtype)
    out_r, mask_r = np.empty_like(x), np.empty_like(x)
    R.dropout_forward(out_r, mask_r, x, 0.3, np.random.default_rng(8))
    mask = np.empty_like(x)
    res = D.dropout_forward(x, mask, x, 0.3, np.random.default_rng(8))
    assert np.shares_memory(res, x)
    np.testing.assert_array_equal(x, out_r)
    np.testing.assert_array_equal(mask, mask_r)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("threads,limit", [(1, 4096), (2, 8192)])
def test_no_allocation_after_warm_up(dtype, threads, limit):
    # Check that forward and backward allocate no arrays once warmed up (the draws go
    # straight into mask, one compiled pass finishes it): the traced peak stays at the few
    # Python objects a call makes (a bool mask alone would be 1 MB). The pool first gets three
    # workers, as after any 4-thread use, so a split's second slice may run on a
    # different pool thread each call.
    x = _x((1000, 1000), dtype)
    out, mask = np.empty_like(x), np.empty_like(x)
    g = np.random.default_rng(0)
    parallel.split(lambda i, j, slot: None, 4, k=4)  # a pool of 3 workers
    with num_threads(threads):
        D.dropout_forward(out, mask, x, 0.5, g)
        tracemalloc.start()
        try:
            for _ in range(4):
                D.dropout_forward(out, mask, x, 0.5, g)
                D.dropout_backward(out, x, mask)
            peak = tracemalloc.get_traced_memory()[1]
        finally:
            tracemalloc.stop()
    assert peak < limit, peak


def _split_shape(dtype):
    """A (rows, 999) shape that kernels.parallel splits over two threads."""
    n = parallel.SPLIT_WORK // D.COST + 3 * 4099
    shape = (n // 999 + 1, 999)
    with num_threads(2):
        assert parallel.threads_for(shape[0] * shape[1], passes=D.COST) == 2
    return shape


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("in_place", [False, True])
def test_split_forward_is_bit_identical_to_one_thread(dtype, in_place):
    # Check that on two threads mask, out and the generator's state afterwards equal those
    # of one thread and of the reference, also with out being x; and the backward too.
    x = _x(_split_shape(dtype), dtype, seed=4)
    results = []
    for threads in (1, 2):
        g = np.random.default_rng(21)
        xx = x.copy()
        out, mask = (xx if in_place else np.empty_like(x)), np.empty_like(x)
        with num_threads(threads):
            assert D.dropout_forward(out, mask, xx, 0.3, g) is out
            dx = D.dropout_backward(np.empty_like(x), x, mask)
        results.append((out, mask, g.random(), dx))
    g_ref = np.random.default_rng(21)
    out_r, mask_r = np.empty_like(x), np.empty_like(x)
    R.dropout_forward(out_r, mask_r, x, 0.3, g_ref)
    next_ref = g_ref.random()
    for out, mask, after, dx in results:
        np.testing.assert_array_equal(mask, mask_r)
        np.testing.assert_array_equal(out, out_r)
        np.testing.assert_array_equal(dx, x * mask_r)
        assert after == next_ref  # same number of draws


def test_unchecked_cores_match_checked():
    # Check that the exported unchecked cores compute what the checked functions compute.
    x = _x((50, 60), np.float32)
    out1, mask1 = _run(x, 0.25, seed=12)
    out2, mask2 = np.empty_like(x), np.empty_like(x)
    D.dropout_forward_unchecked(out2, mask2, x, 0.25, np.random.default_rng(12))
    np.testing.assert_array_equal(mask1, mask2)
    np.testing.assert_array_equal(out1, out2)
    np.testing.assert_array_equal(D.dropout_backward_unchecked(np.empty_like(x), x, mask1),
                                  D.dropout_backward(np.empty_like(x), x, mask1))


@pytest.mark.parametrize("p", [-0.1, 1.0, 1.5, float("nan")])
def test_bad_p_raises(p):
    # Check that p outside [0, 1) raises ValueError naming p.
    x = np.ones((3, 4), np.float32)
    with pytest.raises(ValueError, match=r"^p\b"):
        D.dropout_forward(np.empty_like(x), np.empty_like(x), x, p, np.random.default_rng(0))


@pytest.mark.parametrize("call, exc, name", [
    (lambda o, m, x, g: D.dropout_forward(o, m, x, "0.5", g), TypeError, "p"),
    (lambda o, m, x, g: D.dropout_forward(o, m, x, 0.5, 3), TypeError, "rng"),
    (lambda o, m, x, g: D.dropout_forward(o, m, x, 0.5, np.random.RandomState(0)), TypeError, "rng"),
    (lambda o, m, x, g: D.dropout_forward(o, m, x.astype(np.int32), 0.5, g), TypeError, "x"),
    (lambda o, m, x, g: D.dropout_forward(o, m.astype(np.float64), x, 0.5, g), TypeError, "mask"),
    (lambda o, m, x, g: D.dropout_forward(o[:2], m, x, 0.5, g), ValueError, "out"),
    (lambda o, m, x, g: D.dropout_forward(o, m, np.ones((3, 8), np.float32)[:, ::2], 0.5, g),
     ValueError, "x"),
    (lambda o, m, x, g: D.dropout_forward(o, x, x, 0.5, g), ValueError, "mask"),
    (lambda o, m, x, g: D.dropout_backward(o, x, m.astype(np.float64)), TypeError, "mask"),
    (lambda o, m, x, g: D.dropout_backward(o[:, :2], x, m), ValueError, "dx"),
    (lambda o, m, x, g: D.dropout_backward(o, [[1.0]], m), TypeError, "dout"),
])
def test_bad_inputs_raise_naming_the_argument(call, exc, name):
    # Check that each bad argument raises TypeError/ValueError whose message names it.
    x = np.ones((3, 4), np.float32)
    with pytest.raises(exc, match=rf"^{name}\b"):
        call(np.empty_like(x), np.empty_like(x), x, np.random.default_rng(0))


def test_partial_overlap_rejected():
    # Check that out overlapping x without being it raises, naming out.
    big = np.ones((5, 4), np.float32)
    with pytest.raises(ValueError, match=r"^out\b"):
        D.dropout_forward(big[1:], np.empty((4, 4), np.float32), big[:-1], 0.5,
                          np.random.default_rng(0))

"""kernels.rows: row fills (bias, residual, residual + bias) and adds, against
kernels.reference, inline and split over threads."""
import numpy as np
import pytest

from kernels import num_threads, parallel, rows
from kernels import reference as R

DTYPES = [np.float32, np.float64]
D = 384
SMALL_N = 5
LARGE_N = (2 * parallel.MIN_ELEMENTS_PER_THREAD) // D + 37  # split over 2 threads
CASES = [(SMALL_N, 1), (LARGE_N, 1), (LARGE_N, 2)]
MODES = ["bias", "res", "res+bias"]


def _data(n, dtype, seed=0):
    rng = np.random.default_rng(seed)
    return (rng.standard_normal((n, D)).astype(dtype), rng.standard_normal(D).astype(dtype),
            rng.standard_normal((n, D)).astype(dtype))


def _args(mode, b, res):
    return (b if mode != "res" else None), (res if mode != "bias" else None)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("n,threads", CASES)
@pytest.mark.parametrize("mode", MODES)
def test_fill_rows_matches_reference(dtype, n, threads, mode):
    # Check y = b in every row, y = res, and y = res + b, exactly (one rounding, as NumPy),
    # with y returned and the inputs unchanged.
    _, b, res = _data(n, dtype)
    bb, rr = _args(mode, b, res)
    res0 = res.copy()
    y = np.full((n, D), np.nan, dtype)
    with num_threads(threads):
        if n == LARGE_N:
            assert parallel.chunks(n, D) == threads
        out = rows.fill_rows(y, bb, rr)
    assert out is y
    np.testing.assert_array_equal(y, R.fill_rows(np.empty_like(y), bb, rr))
    np.testing.assert_array_equal(res, res0)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("n,threads", CASES)
def test_fill_rows_in_place_on_the_residual(dtype, n, threads):
    # Check that y = res + b is right when y is res itself (the residual stream in place).
    _, b, res = _data(n, dtype, seed=1)
    expected = R.fill_rows(np.empty_like(res), b, res)
    with num_threads(threads):
        rows.fill_rows(res, b, res)
    np.testing.assert_array_equal(res, expected)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("n,threads", CASES)
@pytest.mark.parametrize("target", ["new", "a", "b"])
def test_add_matches_reference_in_place(dtype, n, threads, target):
    # Check out = a + b into a fresh array, into a itself and into b itself.
    a, _, b = _data(n, dtype, seed=2)
    expected = R.add(np.empty_like(a), a, b)
    out = {"new": np.empty_like(a), "a": a, "b": b}[target]
    with num_threads(threads):
        res = rows.add(out, a, b)
    assert res is out
    np.testing.assert_array_equal(out, expected)


@pytest.mark.parametrize("shape", [(LARGE_N * D,), (4, LARGE_N, D // 4)])
def test_add_other_ranks(shape):
    # Check that 1-D and 3-D arrays (not split by rows) are added right too.
    rng = np.random.default_rng(3)
    a, b = rng.standard_normal(shape), rng.standard_normal(shape)
    out = np.empty(shape)
    with num_threads(2):
        rows.add(out, a, b)
    np.testing.assert_array_equal(out, R.add(np.empty(shape), a, b))


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("mode", MODES)
def test_results_do_not_depend_on_the_thread_count(dtype, mode):
    # Check that inline and split runs give the same bits.
    _, b, res = _data(LARGE_N, dtype, seed=4)
    bb, rr = _args(mode, b, res)
    out = []
    for threads in (1, 2):
        y = np.empty((LARGE_N, D), dtype)
        with num_threads(threads):
            rows.fill_rows(y, bb, rr)
            rows.add(y, y, res)
        out.append(y)
    np.testing.assert_array_equal(out[0], out[1])

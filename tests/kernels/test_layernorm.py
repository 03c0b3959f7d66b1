"""kernels.layernorm: blocked LayerNorm forward/backward against reference.py and central
finite differences."""
import tracemalloc

import numpy as np
import pytest
from gradcheck import assert_close, numeric_grad

from kernels import layernorm as ln
from kernels import reference
from kernels.layernorm import layernorm_backward, layernorm_forward

DTYPES = [np.float32, np.float64]
TOL = {np.float32: dict(rtol=1e-5, atol=1e-5), np.float64: dict(rtol=1e-12, atol=1e-12)}


_BLOCK_BYTES = 256 * 1024  # shape sizes only: many rows, and a row wider than a core's L2


def _rows_per_block(d, dtype):
    return max(1, _BLOCK_BYTES // (d * np.dtype(dtype).itemsize))


def _shapes(dtype):
    # Small shapes, one row, one feature, and shapes spanning several row blocks with a
    # remainder (including a row wider than a whole block).
    big_d = _BLOCK_BYTES // np.dtype(dtype).itemsize + 5
    return [(1, 1), (3, 5), (17, 64), (2 * _rows_per_block(48, dtype) + 3, 48),
            (2 * _rows_per_block(48, dtype) - 1, 48),
            (2 * _rows_per_block(520, dtype) + 7, 520), (3, big_d)]


def _problem(rng, n, d, dtype):
    x = (rng.standard_normal((n, d)) * 2.0 + 0.5).astype(dtype)
    gamma = rng.standard_normal(d).astype(dtype)
    beta = rng.standard_normal(d).astype(dtype)
    dout = rng.standard_normal((n, d)).astype(dtype)
    return x, gamma, beta, dout


def _problems(seed, dtype):
    """``_problem`` for each of ``_shapes(dtype)``, with its n, d and the rng (seeded once)
    for what the caller draws next."""
    rng = np.random.default_rng(seed)
    for n, d in _shapes(dtype):
        yield rng, n, d, _problem(rng, n, d, dtype)


def _blocks_problem(seed, d, extra, dtype):
    """n = two row blocks of width ``d`` plus ``extra`` rows, d, and ``_problem`` of that."""
    n = 2 * _rows_per_block(d, dtype) + extra
    return (n, d, *_problem(np.random.default_rng(seed), n, d, dtype))


def _forward(mod, x, gamma, beta, eps=1e-5):
    n, d = x.shape
    out = np.full((n, d), np.nan, x.dtype)
    mean = np.full(n, np.nan, x.dtype)
    rstd = np.full(n, np.nan, x.dtype)
    res = mod.layernorm_forward(out, mean, rstd, x, gamma, beta, eps)
    return res, out, mean, rstd


@pytest.mark.parametrize("dtype", DTYPES)
def test_forward_matches_reference(dtype):
    # Check that out, mean and rstd equal the reference over shapes spanning several blocks.
    for _, n, d, (x, gamma, beta, _) in _problems(1, dtype):
        res, out, mean, rstd = _forward(ln, x, gamma, beta)
        _, out_r, mean_r, rstd_r = _forward(reference, x, gamma, beta)
        assert res is out
        assert_close(mean, mean_r, f"mean {n}x{d}", **TOL[dtype])
        assert_close(rstd, rstd_r, f"rstd {n}x{d}", **TOL[dtype])
        assert_close(out, out_r, f"out {n}x{d}", **TOL[dtype])


@pytest.mark.parametrize("blocks", [False, True], ids=["as-sized", "in-blocks"])
@pytest.mark.parametrize("dtype", DTYPES)
def test_backward_matches_reference_and_accumulates(dtype, blocks, monkeypatch):
    # Check that dx equals the reference and dgamma/dbeta are added to (not overwrite) what
    # they held, both as the shapes come (mostly one block) and with every shape's rows in
    # blocks of partial sums (ragged last blocks included).
    from kernels import parallel
    if blocks:
        monkeypatch.setattr(parallel, "SPLIT_WORK", 64)
    for rng, n, d, (x, gamma, beta, dout) in _problems(2, dtype):
        if blocks and n > 1:
            assert ln._block_rows(n, d) < n
        _, _, mean, rstd = _forward(reference, x, gamma, beta)
        g0 = rng.standard_normal(d).astype(dtype)
        b0 = rng.standard_normal(d).astype(dtype)
        dx, dg, db = np.full((n, d), np.nan, dtype), g0.copy(), b0.copy()
        res = layernorm_backward(dx, dg, db, dout, x, mean, rstd, gamma)
        dx_r, dg_r, db_r = np.empty((n, d), dtype), np.zeros(d, dtype), np.zeros(d, dtype)
        reference.layernorm_backward(dx_r, dg_r, db_r, dout, x, mean, rstd, gamma)
        assert res is dx
        # dx is a difference of terms of size rstd * |dout * gamma|; float32 rounding is
        # relative to those terms, not to dx (which is exactly 0 when d == 1).
        scale = float(np.max(np.abs(rstd[:, None] * dout * gamma)))
        assert_close(dx, dx_r, f"dx {n}x{d}", rtol=TOL[dtype]["rtol"],
                     atol=TOL[dtype]["atol"] * max(scale, 1.0))
        # Column sums over up to ~2700 rows: float32 error grows with the row count.
        tol = TOL[dtype] if dtype == np.float64 else dict(rtol=1e-4, atol=1e-4)
        assert_close(dg, g0 + dg_r, f"dgamma {n}x{d}", **tol)
        assert_close(db, b0 + db_r, f"dbeta {n}x{d}", **tol)


def test_backward_matches_finite_differences():
    # Check dx, dgamma and dbeta against central differences of L = sum(out * R) (float64).
    rng = np.random.default_rng(3)
    n, d = 5, 7
    x, gamma, beta, R = _problem(rng, n, d, np.float64)

    def loss():
        out = np.empty((n, d))
        layernorm_forward(out, np.empty(n), np.empty(n), x, gamma, beta)
        return float(np.sum(out * R))

    _, _, mean, rstd = _forward(ln, x, gamma, beta)
    dx, dg, db = np.empty((n, d)), np.zeros(d), np.zeros(d)
    layernorm_backward(dx, dg, db, R, x, mean, rstd, gamma)
    assert_close(dx, numeric_grad(loss, x), "dx", rtol=1e-6, atol=1e-8)
    assert_close(dg, numeric_grad(loss, gamma), "dgamma", rtol=1e-6, atol=1e-8)
    assert_close(db, numeric_grad(loss, beta), "dbeta", rtol=1e-6, atol=1e-8)


@pytest.mark.parametrize("dtype", DTYPES)
def test_writes_in_place(dtype):
    # Check that every output is written into the caller's arrays.
    n, d, x, gamma, beta, dout = _blocks_problem(4, 64, 1, dtype)
    res, out, mean, rstd = _forward(ln, x, gamma, beta)
    assert np.shares_memory(res, out)
    assert not np.isnan(mean).any() and not np.isnan(rstd).any()
    dx, dg, db = np.full((n, d), np.nan, dtype), np.zeros(d, dtype), np.zeros(d, dtype)
    res = layernorm_backward(dx, dg, db, dout, x, mean, rstd, gamma)
    assert np.shares_memory(res, dx)
    assert not np.isnan(dx).any()
    assert np.any(dg != 0) and np.any(db != 0)


@pytest.mark.parametrize("dtype", DTYPES)
def test_backward_dx_may_be_dout(dtype):
    # Check that passing the same array as dx and dout gives the same result as separate ones.
    n, d, x, gamma, beta, dout = _blocks_problem(5, 40, 3, dtype)
    _, _, mean, rstd = _forward(ln, x, gamma, beta)
    dx, dg, db = np.empty((n, d), dtype), np.zeros(d, dtype), np.zeros(d, dtype)
    layernorm_backward(dx, dg, db, dout, x, mean, rstd, gamma)
    buf, dg2, db2 = dout.copy(), np.zeros(d, dtype), np.zeros(d, dtype)
    res = layernorm_backward(buf, dg2, db2, buf, x, mean, rstd, gamma)
    assert res is buf
    np.testing.assert_array_equal(buf, dx)
    np.testing.assert_array_equal(dg2, dg)
    np.testing.assert_array_equal(db2, db)


@pytest.mark.parametrize("dtype", DTYPES)
def test_forward_out_may_be_x(dtype):
    # Check that normalizing x in place gives the same result as into a separate array.
    n, d, x, gamma, beta, _ = _blocks_problem(6, 40, 3, dtype)
    _, out, mean, rstd = _forward(ln, x, gamma, beta)
    y = x.copy()
    mean2, rstd2 = np.empty(n, dtype), np.empty(n, dtype)
    layernorm_forward(y, mean2, rstd2, y, gamma, beta)
    np.testing.assert_array_equal(y, out)
    np.testing.assert_array_equal(rstd2, rstd)


def test_two_pass_variance_float32_large_offset():
    # Check that rows with a large common offset keep an accurate variance in float32 (a
    # one-pass E[x^2] - mean^2 loses every digit here).
    rng = np.random.default_rng(7)
    x64 = 1e4 + rng.standard_normal((16, 256))
    x = x64.astype(np.float32)
    gamma, beta = np.ones(256, np.float32), np.zeros(256, np.float32)
    _, out, mean, rstd = _forward(ln, x, gamma, beta)
    xd = x.astype(np.float64)
    exact = 1.0 / np.sqrt(xd.var(axis=1) + 1e-5)
    assert_close(rstd, exact, "rstd", rtol=1e-3, atol=0)


def test_eps_is_used():
    # Check that eps enters as 1/sqrt(var + eps): a constant row gives rstd = 1/sqrt(eps).
    x = np.full((2, 8), 3.0)
    _, out, mean, rstd = _forward(ln, x, np.ones(8), np.full(8, 0.25), eps=0.04)
    assert_close(rstd, [5.0, 5.0], "rstd", rtol=1e-14, atol=0)
    assert_close(out, np.full((2, 8), 0.25), "out", rtol=0, atol=1e-15)


def test_empty_batch():
    # Check that N == 0 is a no-op and leaves dgamma/dbeta untouched.
    x = np.empty((0, 4))
    out = np.empty((0, 4))
    layernorm_forward(out, np.empty(0), np.empty(0), x, np.ones(4), np.zeros(4))
    dg, db = np.ones(4), np.ones(4)
    layernorm_backward(np.empty((0, 4)), dg, db, np.empty((0, 4)), x, np.empty(0),
                       np.empty(0), np.ones(4))
    np.testing.assert_array_equal(dg, 1.0)
    np.testing.assert_array_equal(db, 1.0)


def _fwd_bwd(x, gamma, beta, dout, bufs=None):
    """Forward then backward into ``bufs`` (out, mean, rstd, dx, dgamma, dbeta), new ones
    (dgamma, dbeta zeroed) when None; returns them."""
    if bufs is None:
        n, d = x.shape
        bufs = (np.empty_like(x), np.empty(n, x.dtype), np.empty(n, x.dtype),
                np.empty_like(x), np.zeros(d, x.dtype), np.zeros(d, x.dtype))
    out, mean, rstd, dx, dg, db = bufs
    layernorm_forward(out, mean, rstd, x, gamma, beta)
    layernorm_backward(dx, dg, db, dout, x, mean, rstd, gamma)
    return bufs


def test_no_whole_array_temporaries():
    # Check that after a warm-up call neither pass allocates a batch-sized or block-sized
    # temporary (numpy reports its buffers, including the 32 KiB buffer of a broadcasting
    # ufunc, to tracemalloc; what remains is a few KiB of short-lived view objects).
    rng = np.random.default_rng(8)
    n, d = 4096, 256  # an (N,) float32 temporary is 16 KiB, a row block 256 KiB
    x, gamma, beta, dout = _problem(rng, n, d, np.float32)
    bufs = _fwd_bwd(x, gamma, beta, dout)
    tracemalloc.start()
    try:
        base = tracemalloc.get_traced_memory()[0]
        _fwd_bwd(x, gamma, beta, dout, bufs)
        peak = tracemalloc.get_traced_memory()[1] - base
    finally:
        tracemalloc.stop()
    assert peak < 12 * 1024, f"peak {peak} bytes"


def test_one_thread_results_are_bit_reproducible():
    # Check that at one thread two runs give the same bits (docs/guarantees.md promises it).
    from kernels import num_threads
    rng = np.random.default_rng(10)
    x, gamma, beta, dout = _problem(rng, 3 * _rows_per_block(512, np.float32) + 7, 512,
                                    np.float32)
    with num_threads(1):
        a = _fwd_bwd(x, gamma, beta, dout)
        b = _fwd_bwd(x, gamma, beta, dout)
    for name, u, v in zip(("out", "mean", "rstd", "dx", "dgamma", "dbeta"), a, b):
        np.testing.assert_array_equal(v, u, err_msg=name)


def test_two_threads_give_the_bits_of_one(monkeypatch):
    # Check that split over two threads (rows for out, mean, rstd and dx; columns for
    # dgamma and dbeta) the results are the one-thread bits, at a width that is not a
    # multiple of the vector width.
    from kernels import num_threads, parallel
    monkeypatch.setattr(parallel, "SPLIT_WORK", 64 * 1024)
    rng = np.random.default_rng(11)
    x, gamma, beta, dout = _problem(rng, 2049, 517, np.float32)
    with num_threads(2):
        assert parallel.threads_for(2049, 517, passes=ln.FWD_COST) == 2
        assert parallel.threads_for(2049, 517, passes=ln.BWD_COST) == 2
    with num_threads(1):
        a = _fwd_bwd(x, gamma, beta, dout)
    with num_threads(2):
        b = _fwd_bwd(x, gamma, beta, dout)
    for name, u, v in zip(("out", "mean", "rstd", "dx", "dgamma", "dbeta"), a, b):
        np.testing.assert_array_equal(v, u, err_msg=name)


def test_rejected_input_leaves_outputs_untouched():
    # Check that a call rejected for a bad argument writes nothing.
    n, d = 6, 5
    x, gamma, beta = np.ones((n, d)), np.ones(d), np.zeros(d)
    out, mean, rstd = np.full((n, d), 7.0), np.full(n, 7.0), np.full(n, 7.0)
    with pytest.raises(ValueError, match="beta"):
        layernorm_forward(out, mean, rstd, x, gamma, np.zeros(d + 1))
    dx, dg, db = np.full((n, d), 7.0), np.full(d, 7.0), np.full(d, 7.0)
    with pytest.raises(TypeError, match="dout"):
        layernorm_backward(dx, dg, db, np.ones((n, d), np.float32), x, mean, rstd, gamma)
    for a in (out, mean, rstd, dx, dg, db):
        np.testing.assert_array_equal(a, 7.0)


def _args(dtype=np.float64, n=4, d=3):
    return dict(out=np.empty((n, d), dtype), mean=np.empty(n, dtype), rstd=np.empty(n, dtype),
                x=np.ones((n, d), dtype), gamma=np.ones(d, dtype), beta=np.zeros(d, dtype))


@pytest.mark.parametrize("name,bad,exc", [
    ("x", np.ones((4, 3), np.float16), TypeError),
    ("x", np.ones(3), ValueError),
    ("x", np.ones((3, 4)).T, ValueError),
    ("x", np.ones((4, 0)), ValueError),
    ("out", np.empty((4, 3), np.float32), TypeError),
    ("out", np.empty((4, 4)), ValueError),
    ("mean", np.empty(3), ValueError),
    ("rstd", np.empty(4, np.float32), TypeError),
    ("gamma", np.ones(4), ValueError),
    ("beta", [0.0, 0.0, 0.0], TypeError),
])
def test_forward_rejects_bad_input_naming_it(name, bad, exc):
    # Check that a bad argument raises TypeError/ValueError whose message names it.
    args = _args()
    if name == "x" and bad.ndim == 2 and bad.shape[1] == 0:
        args = {k: v for k, v in _args(d=0).items()}
    args[name] = bad
    with pytest.raises(exc, match=name):
        layernorm_forward(**args)


@pytest.mark.parametrize("name,bad,exc", [
    ("dx", np.empty((4, 3), np.float32), TypeError),
    ("dgamma", np.zeros(4), ValueError),
    ("dbeta", np.zeros((3, 1)), ValueError),
    ("dout", np.ones((5, 3)), ValueError),
    ("gamma", np.ones(3, np.float32), TypeError),
])
def test_backward_rejects_bad_input_naming_it(name, bad, exc):
    # Check that a bad backward argument raises TypeError/ValueError whose message names it.
    n, d = 4, 3
    args = dict(dx=np.empty((n, d)), dgamma=np.zeros(d), dbeta=np.zeros(d), dout=np.ones((n, d)),
                x=np.ones((n, d)), mean=np.ones(n), rstd=np.ones(n), gamma=np.ones(d))
    args[name] = bad
    with pytest.raises(exc, match=name):
        layernorm_backward(**args)

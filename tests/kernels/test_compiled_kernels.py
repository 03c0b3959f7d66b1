"""The compiled elementwise kernels against kernels.reference in both dtypes at shapes with
remainders (an empty batch, one row, widths that are not a multiple of the vector width),
and split over two threads giving the one-thread bits: the gradient norm and scale, the
row fills and adds, the spatial gating unit's gate, the embedding's scatter-add and gMLP's
gate. (AdamW, SGD, LayerNorm, softmax, losses and dropout have their own test files.)"""
import numpy as np
import pytest

from kernels import embedding, gating, num_threads, optim, parallel, reference, rows, token_mix

DTYPES = [np.float32, np.float64]
TOL = {np.float32: dict(rtol=2e-6, atol=1e-7), np.float64: dict(rtol=1e-14, atol=1e-15)}


@pytest.fixture
def split_small(monkeypatch):
    # Split from small sizes on: what is tested is the split, not where its threshold lies.
    monkeypatch.setattr(parallel, "SPLIT_WORK", 4096)


def _both_thread_counts(fn):
    """fn() at one thread and at two (split), as two results."""
    out = []
    for t in (1, 2):
        with num_threads(t):
            out.append(fn())
    return out


# ----------------------------------------------------------------------------- norm, scale
@pytest.mark.parametrize("dtype", DTYPES)
def test_sum_of_squares_is_float64_exact_order_free_of_threads(dtype, split_small):
    # Check the sum of squares over several runs (one empty, one short, one spanning many
    # blocks with a remainder) against float64 NumPy, and the same bits on two threads.
    rng = np.random.default_rng(0)
    flats = [rng.standard_normal(n).astype(dtype) for n in
             (0, 7, 5 * optim.NORM_BLOCK + 13, 3)]
    want = sum(float(np.dot(g.astype(np.float64), g.astype(np.float64))) for g in flats)
    one, two = _both_thread_counts(lambda: optim.sum_of_squares(flats))
    assert one == two
    assert one == pytest.approx(want, rel=1e-13)
    assert optim.sum_of_squares([]) == 0.0


def test_sum_of_squares_overflows_to_inf_and_keeps_nan():
    # Check that float32 squares past float32's range are summed in float64 (no inf), and
    # that a NaN reaches the result.
    big = np.full(10, 1e30, np.float32)
    assert optim.sum_of_squares([big]) == pytest.approx(10 * 1e60, rel=1e-6)
    big[3] = np.nan
    assert np.isnan(optim.sum_of_squares([big]))


@pytest.mark.parametrize("dtype", DTYPES)
def test_scale_rounds_coef_to_the_dtype_like_numpy(dtype, split_small):
    rng = np.random.default_rng(1)
    flats = [rng.standard_normal(n).astype(dtype) for n in (0, 1, 3 * 4099)]
    want = [g.copy() for g in flats]
    for g in want:
        g *= 0.3
    for t in (1, 2):
        got = [g.copy() for g in flats]
        with num_threads(t):
            optim.scale_(got, 0.3)
        for a, b in zip(got, want):
            np.testing.assert_array_equal(a, b)


# ----------------------------------------------------------------------------- rows
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("shape", [(0, 5), (1, 1), (3, 17), (1031, 33)])
def test_fill_rows_and_add_match_reference(dtype, shape, split_small):
    rng = np.random.default_rng(2)
    n, d = shape
    res, b, other = (rng.standard_normal(s).astype(dtype) for s in (shape, d, shape))
    for t in (1, 2):
        with num_threads(t):
            for args in ((b, None), (None, res), (b, res)):
                y, yr = np.full(shape, 7, dtype), np.full(shape, 7, dtype)
                rows.fill_rows(y, *args)
                reference.fill_rows(yr, *args)
                np.testing.assert_array_equal(y, yr)
            y = res.copy()
            rows.fill_rows(y, b, y)  # in place: y is res
            np.testing.assert_array_equal(y, res + b)
            out = np.empty(shape, dtype)
            rows.add(out, res, other)
            np.testing.assert_array_equal(out, res + other)


# ----------------------------------------------------------------------------- SGU gate
def _sum_tol(start, ds_tm):
    """Rounding bound of start + dS summed over batch and channels, in any order: per time,
    a few units of the dtype's epsilon times the sum of the magnitudes."""
    eps = np.finfo(ds_tm.dtype).eps
    return 4 * eps * (np.abs(start) + np.abs(ds_tm).sum(axis=(1, 2))) + np.finfo(ds_tm.dtype).tiny


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("btc", [(0, 3, 5), (1, 1, 1), (2, 3, 17), (5, 67, 40), (19, 3, 9)])
def test_sgu_gate_matches_reference_with_strided_u(dtype, btc, split_small):
    # Check the gate forward and backward against the NumPy reference at 1 and 2 threads:
    # a, dS (over S's own buffer) and dU bit for bit; db (row sums, then batch order) close.
    rng = np.random.default_rng(3)
    b, t, c = btc
    z = rng.standard_normal((b, t, 2 * c)).astype(dtype)
    u = z[:, :, :c]                                   # strided, as in the block
    s_tm = rng.standard_normal((t, b, c)).astype(dtype)
    bias = rng.standard_normal(t).astype(dtype)
    da = rng.standard_normal((b, t, c)).astype(dtype)
    db0 = rng.standard_normal(t).astype(dtype)
    ref_a = reference.sgu_gate_forward(np.empty((b, t, c), dtype), s_tm, bias, u)
    ref_ds, ref_du, ref_db = s_tm.copy(), np.empty((b, t, c), dtype), db0.copy()
    reference.sgu_gate_backward(ref_du, ref_ds, ref_db, None, da, bias, u)
    for threads in (1, 2):
        with num_threads(threads):
            a = np.empty((b, t, c), dtype)
            token_mix.sgu_gate_forward(a, s_tm, bias, u)
            np.testing.assert_array_equal(a, ref_a)
            zz, ds, db = z.copy(), s_tm.copy(), db0.copy()
            # du written over u's own strided view, as the block does
            res = token_mix.sgu_gate_backward(zz[:, :, :c], ds, db, np.empty((b, t, c), dtype),
                                              da, bias, zz[:, :, :c])
            assert res is ds
            np.testing.assert_array_equal(ds, ref_ds)
            np.testing.assert_array_equal(zz[:, :, :c], ref_du)
            np.testing.assert_array_equal(zz[:, :, c:], z[:, :, c:])  # the other half untouched
            assert np.all(np.abs(db - ref_db) <= _sum_tol(db0, ref_ds)), (db, ref_db)
            if threads == 1:
                db_one = db
            else:
                np.testing.assert_array_equal(db, db_one)     # the split changes no bit


@pytest.mark.parametrize("dtype", DTYPES)
def test_sgu_gate_other_layouts_match_reference(dtype):
    # Check u and du whose rows are not evenly spaced (a (B, T) view of a time-major array):
    # read and written right, through contiguous buffers.
    rng = np.random.default_rng(6)
    b, t, c = 3, 5, 7
    u = np.swapaxes(rng.standard_normal((t, b, c)).astype(dtype), 0, 1)
    s_tm = rng.standard_normal((t, b, c)).astype(dtype)
    bias = rng.standard_normal(t).astype(dtype)
    da = rng.standard_normal((b, t, c)).astype(dtype)
    a, ra = np.empty((b, t, c), dtype), np.empty((b, t, c), dtype)
    token_mix.sgu_gate_forward(a, s_tm, bias, u)
    reference.sgu_gate_forward(ra, s_tm, bias, u)
    np.testing.assert_array_equal(a, ra)
    du = np.swapaxes(np.empty((t, b, c), dtype), 0, 1)
    rdu = np.empty((b, t, c), dtype)
    ds, rds = s_tm.copy(), s_tm.copy()
    db, rdb = np.zeros(t, dtype), np.zeros(t, dtype)
    token_mix.sgu_gate_backward(du, ds, db, np.empty((b, t, c), dtype), da, bias, u)
    reference.sgu_gate_backward(rdu, rds, rdb, None, da, bias, u)
    np.testing.assert_array_equal(du, rdu)
    np.testing.assert_array_equal(ds, rds)
    assert np.all(np.abs(db - rdb) <= _sum_tol(np.zeros(t, dtype), rds)), (db, rdb)


# ----------------------------------------------------------------------------- embedding
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("nvd", [(0, 4, 3), (1, 1, 1), (500, 7, 19), (3000, 50, 64)])
def test_embedding_backward_matches_add_at_on_any_thread_count(dtype, nvd, split_small):
    # Check the scatter-add with repeated ids against np.add.at (the reference), the same
    # bits on two threads (split over columns).
    rng = np.random.default_rng(4)
    n, v, d = nvd
    ids = rng.integers(0, v, n).astype(np.int64)
    dout = rng.standard_normal((n, d)).astype(dtype)
    start = rng.standard_normal((v, d)).astype(dtype)
    want = reference.embedding_backward(start.copy(), ids, dout)
    one, two = _both_thread_counts(lambda: embedding.embedding_backward(start.copy(), ids, dout))
    np.testing.assert_array_equal(one, two)
    np.testing.assert_allclose(one, want, **TOL[dtype])


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("nvd", [(0, 4, 3), (1, 1, 1), (500, 7, 19), (3000, 50, 64)])
def test_embedding_lookup_with_residual_is_one_exact_pass(dtype, nvd, split_small):
    # Check out = weight[ids] + residual against the reference to the bit (one rounding, as
    # the lookup then an add), on one and two threads, and with residual being out itself.
    rng = np.random.default_rng(5)
    n, v, d = nvd
    ids = rng.integers(0, v, n).astype(np.int64)
    w = rng.standard_normal((v, d)).astype(dtype)
    res = rng.standard_normal((n, d)).astype(dtype)
    want = reference.embedding_forward(np.empty((n, d), dtype), ids, w, res)
    one, two = _both_thread_counts(
        lambda: embedding.embedding_forward(np.full((n, d), np.nan, dtype), ids, w, res))
    np.testing.assert_array_equal(one, want)
    np.testing.assert_array_equal(two, want)
    inplace = res.copy()
    assert embedding.embedding_forward(inplace, ids, w, inplace) is inplace
    np.testing.assert_array_equal(inplace, want)


def test_embedding_lookup_rejects_a_bad_residual_naming_it():
    # Check that a residual of the wrong shape or dtype, or one overlapping out other than
    # being out itself, raises naming it and writes nothing.
    ids, w = np.array([0, 2, 1], np.int64), np.ones((3, 2))
    buf = np.zeros((4, 2))
    for bad, exc in ((np.zeros((3, 3)), ValueError), (np.zeros((3, 2), np.float32), TypeError),
                     (buf[1:], ValueError)):
        out = buf[:3]
        with pytest.raises(exc, match="residual"):
            embedding.embedding_forward(out, ids, w, bad)
        np.testing.assert_array_equal(buf, 0.0)


# ----------------------------------------------------------------------------- gMLP gate
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("n", [0, 1, 17, 4099 * 3])
def test_gate_matches_reference_and_split(dtype, n, split_small):
    rng = np.random.default_rng(5)
    g0 = (3 * rng.standard_normal(n)).astype(dtype)
    p0, da = rng.standard_normal(n).astype(dtype), rng.standard_normal(n).astype(dtype)
    ra, rg, rp = np.empty(n, dtype), g0.copy(), p0.copy()
    reference.gate_forward(ra, rg, rp)
    reference.gate_backward(rg, rp, da.copy())
    got = []
    for t in (1, 2):
        a, g, p = np.empty(n, dtype), g0.copy(), p0.copy()
        with num_threads(t):
            gating.gate_forward(a, g, p)
            fwd = (a.copy(), g.copy())
            gating.gate_backward(g, p, da.copy())
        got.append((fwd, g, p))
        np.testing.assert_allclose(fwd[0], ra, **TOL[dtype])
        np.testing.assert_allclose(g, rg, **TOL[dtype])
        np.testing.assert_allclose(p, rp, **TOL[dtype])
    for x, y in zip((*got[0][0], *got[0][1:]), (*got[1][0], *got[1][1:])):
        np.testing.assert_array_equal(x, y)


# ----------------------------------------------------------------------------- empty batches
@pytest.mark.parametrize("dtype", DTYPES)
def test_empty_batches_write_nothing_and_return(dtype):
    # Check that every compiled row kernel accepts N = 0 (an empty batch): nothing written,
    # the losses nan like the mean of nothing, the parameter gradients untouched.
    import math

    from kernels import dropout, layernorm, losses, softmax
    e = np.empty((0, 5), dtype)
    for fwd, bwd in ((softmax.softmax_forward, softmax.softmax_backward),
                     (softmax.log_softmax_forward, softmax.log_softmax_backward)):
        assert fwd(np.empty((0, 5), dtype), e).shape == (0, 5)
        assert bwd(np.empty((0, 5), dtype), e, np.empty((0, 5), dtype)).shape == (0, 5)
    assert math.isnan(losses.softmax_cross_entropy_forward(np.empty((0, 5), dtype), e,
                                                           np.empty(0, np.int64)))
    assert math.isnan(losses.mse_forward_backward(np.empty((0, 5), dtype), e, e))
    g, b = np.full(5, 3, dtype), np.full(5, 4, dtype)
    layernorm.layernorm_forward(np.empty((0, 5), dtype), np.empty(0, dtype), np.empty(0, dtype),
                                e, g, b)
    layernorm.layernorm_backward(np.empty((0, 5), dtype), g, b, e, e, np.empty(0, dtype),
                                 np.empty(0, dtype), g)
    assert np.all(g == 3) and np.all(b == 4)
    rng = np.random.default_rng(0)
    state = rng.bit_generator.state
    dropout.dropout_forward(np.empty((0, 5), dtype), np.empty((0, 5), dtype), e, 0.5, rng)
    assert rng.bit_generator.state == state  # nothing drawn
    p = np.empty(0, dtype)
    optim.adamw_update(p, p.copy(), p.copy(), p.copy(), 1, 1e-3)
    rows.fill_rows(np.empty((0, 5), dtype), b)
    embedding.embedding_backward(np.ones((3, 5), dtype), np.empty(0, np.int64), e)

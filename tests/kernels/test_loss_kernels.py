"""kernels.losses: softmax + cross-entropy and MSE against reference.py, central finite
differences and independent math."""
import math
import tracemalloc
import warnings

import numpy as np
import pytest
from gradcheck import assert_close, numeric_grad
from probes import count_splits

from kernels import losses, reference
from kernels import num_threads, parallel
from kernels.losses import (mse_backward, mse_forward, mse_forward_backward,
                            softmax_cross_entropy_backward, softmax_cross_entropy_forward)

DTYPES = [np.float32, np.float64]
TOL = {np.float32: dict(rtol=1e-5, atol=1e-6), np.float64: dict(rtol=1e-12, atol=1e-14)}
LOSS_RTOL = {np.float32: 1e-5, np.float64: 1e-12}


_BLOCK_BYTES = 256 * 1024  # shape sizes only: many rows, and a row wider than a core's L2


def _rows_per_block(c, dtype):
    return max(1, _BLOCK_BYTES // (c * np.dtype(dtype).itemsize))


def _ce_shapes(dtype):
    # Tiny, one class, and several row blocks with a remainder (also a row wider than a block).
    wide = _BLOCK_BYTES // np.dtype(dtype).itemsize + 3
    return [(1, 1), (4, 3), (2 * _rows_per_block(10, dtype) + 5, 10),
            (2 * _rows_per_block(300, dtype) + 7, 300), (2, wide)]


def _prob_targets(rng, n, c, dtype):
    y = rng.random((n, c))
    return (y / y.sum(axis=1, keepdims=True)).astype(dtype)


def _ce(mod, logits, target):
    probs = np.full(logits.shape, np.nan, logits.dtype)
    loss = mod.softmax_cross_entropy_forward(probs, logits, target)
    dl = np.full(logits.shape, np.nan, logits.dtype)
    res = mod.softmax_cross_entropy_backward(dl, probs, target)
    return loss, probs, dl, res


# ----------------------------------------------------------------------------- softmax + CE
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("kind", ["labels", "probs"])
def test_ce_matches_reference(dtype, kind):
    # Check that loss, probs and dlogits equal the reference over shapes spanning blocks.
    rng = np.random.default_rng(10)
    for n, c in _ce_shapes(dtype):
        logits = (3.0 * rng.standard_normal((n, c))).astype(dtype)
        target = rng.integers(0, c, n) if kind == "labels" else _prob_targets(rng, n, c, dtype)
        loss, probs, dl, res = _ce(losses, logits, target)
        loss_r, probs_r, dl_r, _ = _ce(reference, logits, target)
        assert isinstance(loss, float)
        assert res is dl
        assert loss == pytest.approx(loss_r, rel=LOSS_RTOL[dtype]), (n, c)
        assert_close(probs, probs_r, f"probs {n}x{c}", **TOL[dtype])
        assert_close(dl, dl_r, f"dlogits {n}x{c}", rtol=TOL[dtype]["rtol"],
                     atol=TOL[dtype]["atol"] / n)


@pytest.mark.parametrize("dtype", DTYPES)
def test_ce_unnormalized_targets_match_reference(dtype):
    # Check that targets whose rows do not sum to 1 follow the definition -sum(y log p)
    # (each row's weight counts), as the reference does.
    rng = np.random.default_rng(16)
    n, c = 2 * _rows_per_block(12, dtype) + 5, 12
    logits = (2.0 * rng.standard_normal((n, c))).astype(dtype)
    target = (rng.random((n, c)) * rng.random((n, 1)) * 3.0).astype(dtype)
    loss, probs, dl, _ = _ce(losses, logits, target)
    loss_r, _, dl_r, _ = _ce(reference, logits, target)
    assert loss == pytest.approx(loss_r, rel=LOSS_RTOL[dtype])
    assert_close(dl, dl_r, "dlogits", rtol=TOL[dtype]["rtol"], atol=TOL[dtype]["atol"] / n)


@pytest.mark.parametrize("kind", ["labels", "probs"])
def test_ce_backward_matches_finite_differences(kind):
    # Check dlogits against central differences of the forward loss (float64).
    rng = np.random.default_rng(11)
    n, c = 4, 5
    logits = rng.standard_normal((n, c))
    target = rng.integers(0, c, n) if kind == "labels" else _prob_targets(rng, n, c, np.float64)
    probs = np.empty((n, c))

    def loss():
        return softmax_cross_entropy_forward(np.empty((n, c)), logits, target)

    softmax_cross_entropy_forward(probs, logits, target)
    dl = softmax_cross_entropy_backward(np.empty((n, c)), probs, target)
    assert_close(dl, numeric_grad(loss, logits), "dlogits", rtol=1e-6, atol=1e-9)


@pytest.mark.parametrize("dtype", [np.uint8, np.int16, np.int32, np.int64, np.uint64])
def test_ce_accepts_any_integer_label_dtype(dtype):
    # Check that labels of every integer dtype give the same loss and gradient as int64.
    rng = np.random.default_rng(12)
    logits = rng.standard_normal((6, 4))
    labels = rng.integers(0, 4, 6)
    loss, probs, dl, _ = _ce(losses, logits, labels)
    loss2, probs2, dl2, _ = _ce(losses, logits, labels.astype(dtype))
    assert loss2 == loss
    np.testing.assert_array_equal(dl2, dl)
    # every other label of a longer array: a strided view, read right too
    wide = np.repeat(labels, 2).astype(dtype)
    wide[1::2] = 3 - wide[1::2]
    loss3, _, dl3, _ = _ce(losses, logits, wide[::2])
    assert loss3 == loss
    np.testing.assert_array_equal(dl3, dl)


@pytest.mark.parametrize("c", [7, losses.WIDE_ROWS + 3])
@pytest.mark.parametrize("dtype", DTYPES)
def test_ce_one_hot_probabilities_agree_with_labels(dtype, c):
    # Check that one-hot probability targets give the loss and gradient of integer labels,
    # the probabilities bit for bit, below and above the width where the kernels change.
    rng = np.random.default_rng(13)
    n = 2 * _rows_per_block(c, dtype) + 1
    logits = (2.0 * rng.standard_normal((n, c))).astype(dtype)
    labels = rng.integers(0, c, n)
    onehot = np.zeros((n, c), dtype)
    onehot[np.arange(n), labels] = 1.0
    loss_l, probs_l, dl_l, _ = _ce(losses, logits, labels)
    loss_p, probs_p, dl_p, _ = _ce(losses, logits, onehot)
    assert loss_p == pytest.approx(loss_l, rel=LOSS_RTOL[dtype])
    np.testing.assert_array_equal(probs_p, probs_l)
    assert_close(dl_p, dl_l, "dlogits", rtol=TOL[dtype]["rtol"], atol=TOL[dtype]["atol"] / n)


def _lse(row):
    m = max(row)
    return m + math.log(math.fsum(math.exp(v - m) for v in row))


@pytest.mark.parametrize("dtype", DTYPES)
def test_ce_stable_at_large_logits(dtype):
    # Check that logits of +-1000 give finite, correct values with every numpy floating-point
    # error raised and every warning an error (the expected loss is log-sum-exp in math).
    rows = [[1000.0, -1000.0, 0.0], [-1000.0, -1000.0, -1000.0], [1000.0, 1000.0, 999.0]]
    labels = np.array([1, 2, 2])
    logits = np.array(rows, dtype)
    expected = sum(_lse(r) - r[t] for r, t in zip(rows, labels)) / 3
    onehot = np.eye(3, dtype=dtype)[labels]
    with warnings.catch_warnings(), np.errstate(all="raise"):
        warnings.simplefilter("error")
        for target in (labels, onehot):
            loss, probs, dl, _ = _ce(losses, logits, target)
            assert math.isfinite(loss) and np.isfinite(probs).all() and np.isfinite(dl).all()
            assert loss == pytest.approx(expected, rel=1e-6)
            expected_p = [[math.exp(v - _lse(r)) for v in r] for r in rows]
            assert_close(probs, expected_p, "probs", rtol=1e-6, atol=1e-30)


def test_ce_seed_004_worked_example():
    # Check the seed 004 example: logits z2 = [1.05, 1.22], label 0 -> softmax
    # 0.457602 / 0.542398 and loss 0.781755 (computed here with math.exp, and to 6 places).
    e0, e1 = math.exp(1.05), math.exp(1.22)
    p0, p1 = e0 / (e0 + e1), e1 / (e0 + e1)
    for dtype in DTYPES:
        logits = np.array([[1.05, 1.22]], dtype)
        loss, probs, dl, _ = _ce(losses, logits, np.array([0]))
        tol = 1e-6 if dtype == np.float32 else 1e-14
        assert_close(probs, [[p0, p1]], f"probs {dtype}", rtol=tol, atol=0)
        assert loss == pytest.approx(-math.log(p0), rel=tol)
        assert_close(dl, [[p0 - 1.0, p1]], f"dlogits {dtype}", rtol=tol, atol=tol)
        assert_close(probs, [[0.457602, 0.542398]], "printed probs", rtol=0, atol=5e-7)
        assert round(loss, 6) == 0.781755


@pytest.mark.parametrize("kind", ["labels", "probs"])
def test_ce_in_place_and_aliasing(kind):
    # Check that probs/dlogits are written in place, that probs may be logits (in-place
    # softmax) and dlogits may be probs, with the results of separate arrays.
    rng = np.random.default_rng(14)
    n, c = 2 * _rows_per_block(30, np.float64) + 3, 30
    logits = 4.0 * rng.standard_normal((n, c))
    target = rng.integers(0, c, n) if kind == "labels" else _prob_targets(rng, n, c, np.float64)
    loss, probs, dl, _ = _ce(losses, logits, target)
    buf = logits.copy()
    loss2 = softmax_cross_entropy_forward(buf, buf, target)
    assert loss2 == loss
    np.testing.assert_array_equal(buf, probs)
    res = softmax_cross_entropy_backward(buf, buf, target)
    assert np.shares_memory(res, buf)
    np.testing.assert_array_equal(buf, dl)


def _traced_peak(*calls):
    """Peak bytes traced above the starting level while running ``calls`` (after a warm-up)."""
    for call in calls:
        call()
    tracemalloc.start()
    try:
        base = tracemalloc.get_traced_memory()[0]
        for call in calls:
            call()
        return tracemalloc.get_traced_memory()[1] - base
    finally:
        tracemalloc.stop()


def test_ce_no_whole_array_temporaries():
    # Check that, after a warm-up, forward + backward allocate no batch-sized or block-sized
    # temporary (an (N,) float32 array is 16 KiB here, a broadcasting ufunc's buffer 32 KiB;
    # what remains is a few KiB of short-lived view objects).
    rng = np.random.default_rng(15)
    n, c = 4096, 64
    logits = rng.standard_normal((n, c)).astype(np.float32)
    probs, dl = np.empty_like(logits), np.empty_like(logits)
    for target in (rng.integers(0, c, n), _prob_targets(rng, n, c, np.float32)):
        peak = _traced_peak(lambda: softmax_cross_entropy_forward(probs, logits, target),
                            lambda: softmax_cross_entropy_backward(dl, probs, target))
        assert peak < 12 * 1024, f"peak {peak} bytes (target ndim {target.ndim})"


@pytest.mark.parametrize("label", [-1, 3, 100])
def test_ce_rejects_out_of_range_labels(label):
    # Check that a label outside [0, C) raises ValueError naming target (forward and backward).
    logits = np.zeros((3, 3))
    target = np.array([0, label, 1])
    with pytest.raises(ValueError, match="target"):
        softmax_cross_entropy_forward(np.empty((3, 3)), logits, target)
    with pytest.raises(ValueError, match="target"):
        softmax_cross_entropy_backward(np.empty((3, 3)), np.full((3, 3), 1 / 3), target)


@pytest.mark.parametrize("name,bad,exc", [
    ("target", np.array([0.0, 1.0, 2.0]), TypeError),
    ("target", np.array([True, False, True]), TypeError),
    ("target", np.array([0, 1]), ValueError),
    ("target", np.full((3, 3), 1 / 3, np.float32), TypeError),
    ("target", np.full((3, 4), 0.25), ValueError),
    ("target", np.zeros((3, 3, 1)), ValueError),
    ("target", [0, 1, 2], TypeError),
    ("logits", np.zeros((3, 3), np.float16), TypeError),
    ("logits", np.zeros((3, 6))[:, ::2], ValueError),
    ("logits", np.zeros((3, 0)), ValueError),
    ("probs", np.empty((3, 3), np.float32), TypeError),
    ("probs", np.empty((3, 2)), ValueError),
])
def test_ce_forward_rejects_bad_input_naming_it(name, bad, exc):
    # Check that each bad forward argument raises TypeError/ValueError whose message names it.
    args = dict(probs=np.empty((3, 3)), logits=np.zeros((3, 3)), target=np.array([0, 1, 2]))
    args[name] = bad
    with pytest.raises(exc, match=name):
        softmax_cross_entropy_forward(**args)


@pytest.mark.parametrize("name,bad,exc", [
    ("dlogits", np.empty((3, 3), np.float32), TypeError),
    ("dlogits", np.empty((2, 3)), ValueError),
    ("probs", np.full((3, 6), 1 / 3)[:, ::2], ValueError),
    ("probs", np.empty((3, 0)), ValueError),
    ("target", np.array([0, 1]), ValueError),
])
def test_ce_backward_rejects_bad_input_naming_it(name, bad, exc):
    # Check that each bad backward argument raises TypeError/ValueError whose message names it.
    args = dict(dlogits=np.empty((3, 3)), probs=np.full((3, 3), 1 / 3), target=np.array([0, 1, 2]))
    args[name] = bad
    with pytest.raises(exc, match=name):
        softmax_cross_entropy_backward(**args)


# ----------------------------------------------------------------------------- MSE
def _mse_arrays(rng, shape, dtype, order="C"):
    pred = np.asarray(rng.standard_normal(shape), dtype=dtype, order=order)
    target = np.asarray(rng.standard_normal(shape), dtype=dtype, order=order)
    return pred, target


def _mse_shapes(dtype):
    big = 2 * losses.BLOCK + 11  # several partial sums and a ragged one
    return [(), (1,), (7,), (3, 4, 5), (33, 17), (big,)]


@pytest.mark.parametrize("dtype", DTYPES)
def test_mse_matches_reference(dtype):
    # Check forward and backward against the reference for many shapes, including 0-d and
    # arrays spanning several blocks with a remainder.
    rng = np.random.default_rng(20)
    for shape in _mse_shapes(dtype):
        pred, target = _mse_arrays(rng, shape, dtype)
        loss = mse_forward(pred, target)
        assert isinstance(loss, float)
        assert loss == pytest.approx(reference.mse_forward(pred, target), rel=LOSS_RTOL[dtype])
        dp = np.full(shape, np.nan, dtype)
        res = mse_backward(dp, pred, target)
        assert res is dp and np.shares_memory(res, dp)
        dp_r = np.empty(shape, dtype)
        reference.mse_backward(dp_r, pred, target)
        assert_close(dp, dp_r, f"dpred {shape}", rtol=TOL[dtype]["rtol"], atol=0)


def test_mse_is_torch_mean_of_squares():
    # Check the definition against an independent exact sum: mean over all elements.
    pred = np.array([[1.0, 2.0, 3.0], [4.0, 5.0, 6.5]])
    target = np.array([[1.5, 2.0, 1.0], [4.0, 7.0, 6.0]])
    expected = math.fsum((p - t) ** 2 for p, t in zip(pred.ravel(), target.ravel())) / 6
    assert mse_forward(pred, target) == expected  # every step exact up to the final / 6
    dp = mse_backward(np.empty((2, 3)), pred, target)
    np.testing.assert_allclose(dp, 2.0 * (pred - target) / 6, rtol=1e-15, atol=0)


def test_mse_backward_matches_finite_differences():
    # Check dpred against central differences of the forward loss (float64).
    rng = np.random.default_rng(21)
    pred, target = _mse_arrays(rng, (3, 4), np.float64)
    dp = mse_backward(np.empty((3, 4)), pred, target)
    assert_close(dp, numeric_grad(lambda: mse_forward(pred, target), pred), "dpred",
                 rtol=1e-6, atol=1e-9)


@pytest.mark.parametrize("dtype", DTYPES)
def test_mse_fortran_order_and_dpred_may_be_pred(dtype):
    # Check that Fortran-ordered arrays work without copies and that dpred may be pred.
    rng = np.random.default_rng(22)
    pred, target = _mse_arrays(rng, (40, 30), dtype, order="F")
    loss_r = reference.mse_forward(pred, target)
    dp_r = np.empty_like(pred)
    reference.mse_backward(dp_r, pred, target)
    assert mse_forward(pred, target) == pytest.approx(loss_r, rel=LOSS_RTOL[dtype])
    res = mse_backward(pred, pred, target)
    assert res is pred
    assert_close(pred, dp_r, "dpred", rtol=TOL[dtype]["rtol"], atol=0)


def test_mse_no_whole_array_temporaries():
    # Check that forward + backward allocate no block-sized temporary after a warm-up.
    rng = np.random.default_rng(23)
    pred, target = _mse_arrays(rng, (512, 512), np.float32)
    dp = np.empty_like(pred)
    peak = _traced_peak(lambda: mse_forward(pred, target), lambda: mse_backward(dp, pred, target),
                        lambda: mse_forward_backward(dp, pred, target))
    assert peak < 12 * 1024, f"peak {peak} bytes"


@pytest.mark.parametrize("dtype", DTYPES)
def test_mse_forward_backward_is_forward_and_backward(dtype):
    # Check that the fused call returns exactly mse_forward's loss and writes exactly
    # mse_backward's gradient (and so matches the reference), for every shape and order.
    rng = np.random.default_rng(24)
    for shape in _mse_shapes(dtype):
        for order in ("C", "F"):
            pred, target = _mse_arrays(rng, shape, dtype, order)
            dp = np.full(shape, np.nan, dtype, order=order)
            loss = mse_forward_backward(dp, pred, target)
            assert isinstance(loss, float)
            assert loss == mse_forward(pred, target)
            dp_sep = mse_backward(np.empty_like(dp), pred, target)
            np.testing.assert_array_equal(dp, dp_sep)
            assert loss == pytest.approx(reference.mse_forward(pred, target), rel=LOSS_RTOL[dtype])
            dp_r = np.empty(shape, dtype)
            reference.mse_backward(dp_r, pred, target)
            assert_close(dp, dp_r, f"dpred {shape} {order}", rtol=TOL[dtype]["rtol"], atol=0)


@pytest.mark.parametrize("dtype", DTYPES)
def test_mse_forward_backward_in_place(dtype):
    # Check that the gradient is written into the caller's array, which may be pred itself
    # (the loss is taken from each block before it is overwritten).
    rng = np.random.default_rng(25)
    pred, target = _mse_arrays(rng, (300, 700), dtype)  # several blocks and a remainder
    loss_r = mse_forward(pred, target)
    dp_r = mse_backward(np.empty_like(pred), pred, target)
    dp = np.full_like(pred, np.nan)
    assert mse_forward_backward(dp, pred, target) == loss_r
    np.testing.assert_array_equal(dp, dp_r)
    buf = pred.copy()
    assert mse_forward_backward(buf, buf, target) == loss_r
    np.testing.assert_array_equal(buf, dp_r)


def test_mse_backward_of_an_empty_pair_writes_nothing():
    # Check that an empty pair returns the empty dpred itself (no division by the zero size).
    dp = np.empty((0, 3))
    assert mse_backward(dp, np.empty((0, 3)), np.empty((0, 3))) is dp


def test_mse_empty_forward_backward_is_nan():
    # Check that an empty pair gives nan, like the mean of nothing, and writes nothing.
    assert math.isnan(mse_forward_backward(np.empty((0, 3)), np.empty((0, 3)), np.empty((0, 3))))


def _split_sizes(dtype):
    # Element counts around the split threshold, with a partial last block.
    lo = -(-parallel.SPLIT_WORK // losses.MSE_COST)  # the least n with n * cost >= SPLIT_WORK
    return [lo - 1, lo, lo + losses.BLOCK // 2 + 3]


@pytest.mark.parametrize("dtype", DTYPES)
def test_mse_split_over_threads_gives_one_thread_results(dtype, monkeypatch):
    # Check that with two threads (arrays from the split threshold up are split over a
    # thread pool) the loss and gradients are bit-identical to one thread's, for sizes
    # around the threshold, and that the split does happen at and above it.
    monkeypatch.setattr(parallel, "SPLIT_WORK", 1 << 20)
    calls = count_splits(monkeypatch)  # the thread count of each split over > 1 thread
    rng = np.random.default_rng(26)
    for n in _split_sizes(dtype):
        pred, target = _mse_arrays(rng, (n,), dtype)
        res = {}
        for t in (1, 2):
            calls.clear()
            with num_threads(t):
                dp = np.empty_like(pred)
                res[t] = (mse_forward(pred, target), mse_forward_backward(dp, pred, target), dp,
                          mse_backward(np.empty_like(pred), pred, target))
            split = n * losses.MSE_COST >= parallel.SPLIT_WORK and t == 2
            assert calls == ([2, 2, 2] if split else []), (n, t, calls)
        assert res[2][0] == res[1][0] and res[2][1] == res[1][1]
        np.testing.assert_array_equal(res[2][2], res[1][2])
        np.testing.assert_array_equal(res[2][3], res[1][3])
        assert res[1][0] == pytest.approx(reference.mse_forward(pred, target), rel=LOSS_RTOL[dtype])


def test_mse_split_no_block_temporaries():
    # Check that a split call allocates no block-sized temporary after a warm-up (a block is
    # 256 KiB; the pool's futures and closures are a few KiB).
    rng = np.random.default_rng(27)
    pred, target = _mse_arrays(rng, (parallel.SPLIT_MIN + 1000,), np.float32)
    dp = np.empty_like(pred)
    with num_threads(2):
        peak = _traced_peak(lambda: mse_forward(pred, target),
                            lambda: mse_forward_backward(dp, pred, target),
                            lambda: mse_backward(dp, pred, target))
    assert peak < 24 * 1024, f"peak {peak} bytes"


@pytest.mark.parametrize("name,bad,exc", [
    ("pred", np.zeros((2, 3), np.int64), TypeError),
    ("pred", np.zeros((2, 6))[:, ::2], ValueError),
    ("target", np.zeros((3, 2)), ValueError),
    ("target", np.zeros((2, 3), np.float32), TypeError),
    ("target", np.zeros((2, 3), order="F"), ValueError),
    ("target", [[0.0] * 3] * 2, TypeError),
])
def test_mse_rejects_bad_input_naming_it(name, bad, exc):
    # Check that each bad argument raises TypeError/ValueError whose message names it.
    args = dict(pred=np.zeros((2, 3)), target=np.zeros((2, 3)))
    args[name] = bad
    with pytest.raises(exc, match=name):
        mse_forward(**args)
    with pytest.raises(exc, match=name):
        mse_backward(np.empty((2, 3)) if name != "pred" else np.empty(bad.shape), **args)


@pytest.mark.parametrize("bad,exc", [(np.empty((2, 3), np.float32), TypeError),
                                     (np.empty((3, 2)), ValueError)])
def test_mse_backward_rejects_bad_dpred(bad, exc):
    # Check that a bad dpred raises TypeError/ValueError naming dpred, for the backward and
    # the fused call.
    with pytest.raises(exc, match="dpred"):
        mse_backward(bad, np.zeros((2, 3)), np.zeros((2, 3)))
    with pytest.raises(exc, match="dpred"):
        mse_forward_backward(bad, np.zeros((2, 3)), np.zeros((2, 3)))


@pytest.mark.parametrize("name,bad,exc", [
    ("pred", np.zeros((2, 3), np.int64), TypeError),
    ("target", np.zeros((3, 2)), ValueError),
    ("target", np.zeros((2, 3), np.float32), TypeError),
    ("target", np.zeros((2, 3), order="F"), ValueError),
])
def test_mse_forward_backward_rejects_bad_input_writing_nothing(name, bad, exc):
    # Check that the fused call names a bad argument and leaves dpred untouched.
    args = dict(pred=np.ones((2, 3)), target=np.zeros((2, 3)))
    args[name] = bad
    dp = np.full((2, 3), 7.0)
    with pytest.raises(exc, match=name):
        mse_forward_backward(dp, **args)
    np.testing.assert_array_equal(dp, 7.0)

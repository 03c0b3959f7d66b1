"""Losses: softmax + cross-entropy (integer labels or probability targets) and MSE, with the
mean reduction of PyTorch's CrossEntropyLoss and MSELoss. Each has a forward returning the
mean loss as a Python float and a fused backward; MSE also ``mse_forward_backward``, loss
and gradient in one pass (what engine.MSELoss uses). Work runs in blocks of ~256 KiB with
``probs`` (or per-thread scratch from kernels.memory) as the workspace; softmax's row max,
row sums and per-row shifts go through numpy reductions and BLAS gemv/gemm. Large MSE calls
are split over blasnet's threads."""
from __future__ import annotations

import math

import numpy as np

from . import parallel as _par
from .gemm import check_array, check_contiguous, check_like, routines
from .memory import bundle, constant, ones, scratch
from .optim import flat_view

__all__ = ["softmax_cross_entropy_forward", "softmax_cross_entropy_backward",
           "mse_forward", "mse_backward",
           "softmax_cross_entropy_forward_unchecked", "softmax_cross_entropy_backward_unchecked",
           "mse_forward_unchecked", "mse_backward_unchecked",
           "mse_forward_backward", "mse_forward_backward_unchecked"]

_BLOCK_BYTES = 256 * 1024  # per block of rows (softmax) or of flat elements (MSE)
# Softmax + cross-entropy is not split over blasnet's threads (its gemv/gemm calls hold the
# GIL); MSE is (see the MSE section).


def _rows_buffers(dtype, c):
    """(rows, W, mx, ssum, z, idx, offs, ones_c, ones_r): this thread's softmax scratch
    (kernels.memory) for ``c`` classes and the constants its BLAS calls read."""
    return bundle(("losses.rows", dtype, c, _BLOCK_BYTES), _make_rows_buffers, dtype, c)


def _make_rows_buffers(dtype, c):
    rows = max(1, _BLOCK_BYTES // (c * dtype.itemsize))
    return (rows,
            scratch("losses.w", (rows, c), dtype).T,  # (C, rows) y * shifted, 1/sum rows
            scratch("losses.mx", rows, dtype),        # row max, then 1 / row sum
            scratch("losses.ssum", rows, dtype),      # row sums of exp, then lse
            scratch("losses.z", rows, dtype),         # target logit or sum(y * s)
            scratch("losses.idx", rows, np.intp),     # flat indices of the labels
            constant(("losses.offsets", rows, c),     # flat offset of each row
                     lambda: np.arange(rows, dtype=np.intp) * c),
            ones(c, dtype)[:, None],                  # (C, 1) row sums, row shifts
            ones(rows, dtype))                        # (rows,) sums of (rows,) vectors


# ----------------------------------------------------------------------------- softmax + CE
# No call below broadcasts (numpy's broadcasting ufuncs allocate an iterator buffer per call
# and run several times slower than plain passes): per-row shifts and scales are K=1 gemms,
# row sums gemvs, label gathers np.take/np.put on flat indices. Blocks are walked as
# Fortran (C, rows) views of the C-contiguous (rows, C) blocks.


def _label_indices(idx, offs, labels, start):
    """idx = flat indices of (row, label) for rows start.. of a C-contiguous (N, C) array."""
    np.add(offs, labels, out=idx, casting="unsafe")  # uint64 labels go through float64
    idx += start


def softmax_cross_entropy_forward_unchecked(probs, logits, target):
    """``softmax_cross_entropy_forward`` without checks (hot path). Labels must already be in
    range (out-of-range labels are clipped, not reported). ``probs`` may be ``logits``."""
    n, c = logits.shape
    if n == 0:
        return math.nan
    dt = logits.dtype
    rows, W, mx, ssum, z, idx, offs, ones_c, ones_r = _rows_buffers(dt, c)
    gemm, gemv = routines(dt)
    ones_cv, mxrow = ones_c[:, 0], mx[None, :]
    lT, pT = logits.T, probs.T  # (C, N) Fortran views
    labels = target.ndim == 1
    if labels:
        lflat = logits.reshape(-1)
    else:
        yT = target.T
    total = 0.0
    # exp underflows to 0 for logits far below the row max: that is the right answer, so
    # a caller's np.seterr(under="raise") must not turn it into an error.
    with np.errstate(under="ignore"):
        for i in range(0, n, rows):
            j = min(i + rows, n)
            if j - i < rows:
                r = j - i
                W, mx, ssum, z, idx, offs, ones_r = (W[:, :r], mx[:r], ssum[:r], z[:r],
                                                     idx[:r], offs[:r], ones_r[:r])
                mxrow = mxrow[:, :r]
            lb, pb = lT[:, i:j], pT[:, i:j]
            np.maximum.reduce(lb, axis=0, out=mx)
            if labels:
                # Gather the target logits before probs (maybe logits) is overwritten:
                # -log softmax[t] = log(sum exp(l - max)) + max - l[t].
                _label_indices(idx, offs, target[i:j], i * c)
                np.take(lflat, idx, out=z, mode="clip")
                np.subtract(z, mx, out=z)
                total -= float(np.dot(z, ones_r))
            np.copyto(pb, lb)
            gemm(-1.0, ones_c, mxrow, 1.0, pb, 0, 0, 1)        # shifted = logits - max
            if not labels:
                # -sum_j y (shifted - lse) = lse * sum_j y - sum_j y shifted
                yb = yT[:, i:j]
                np.multiply(yb, pb, out=W)
                gemv(1.0, W, ones_cv, 0.0, z, 0, 1, 0, 1, 1, 1)  # z = sum_j y * shifted
                total -= float(np.dot(z, ones_r))
            np.exp(pb, out=pb)
            gemv(1.0, pb, ones_cv, 0.0, ssum, 0, 1, 0, 1, 1, 1)  # ssum = row sums of exp
            np.divide(1.0, ssum, out=mx)
            gemm(1.0, ones_c, mxrow, 0.0, W, 0, 0, 1)          # W[:, i] = 1 / ssum[i]
            np.multiply(pb, W, out=pb)                          # probs = exp / ssum
            np.log(ssum, out=ssum)                              # log-sum-exp of shifted
            if labels:
                total += float(np.dot(ssum, ones_r))
            else:
                gemv(1.0, yb, ones_cv, 0.0, z, 0, 1, 0, 1, 1, 1)  # z = sum_j y
                total += float(np.dot(ssum, z))
    return total / n


def softmax_cross_entropy_backward_unchecked(dlogits, probs, target):
    """``softmax_cross_entropy_backward`` without checks (hot path). ``dlogits`` may be
    ``probs``; labels must be in range (they are clipped, not reported)."""
    n, c = probs.shape
    if n == 0:
        return dlogits
    rows, _, _, _, z, idx, offs, _, _ = _rows_buffers(probs.dtype, c)
    labels = target.ndim == 1
    if labels:
        pflat, dflat = probs.reshape(-1), dlogits.reshape(-1)
    with np.errstate(under="ignore"):  # tiny probabilities / N may underflow to 0
        for i in range(0, n, rows):
            j = min(i + rows, n)
            if j - i < rows:
                r = j - i
                z, idx, offs = z[:r], idx[:r], offs[:r]
            db = dlogits[i:j]
            if labels:
                # (p - 1) / N at the labels, p / N elsewhere; read p before dlogits (maybe
                # probs) is written.
                _label_indices(idx, offs, target[i:j], i * c)
                np.take(pflat, idx, out=z, mode="clip")
                z -= 1.0
                z /= n
                np.divide(probs[i:j], n, out=db)
                np.put(dflat, idx, z, mode="clip")
            else:
                np.subtract(probs[i:j], target[i:j], out=db)
                np.divide(db, n, out=db)
    return dlogits


def _check_target(target, logits):
    n, c = logits.shape
    if not isinstance(target, np.ndarray):
        raise TypeError(f"target: expected a numpy.ndarray, got {type(target).__name__}")
    if target.ndim == 1:
        if not np.issubdtype(target.dtype, np.integer):
            raise TypeError(f"target: expected integer labels of shape ({n},) or {logits.dtype}"
                            f" probabilities of shape ({n}, {c}), got dtype {target.dtype}")
        if target.shape != (n,):
            raise ValueError(f"target: expected labels of shape ({n},), got {target.shape}")
        if n:
            lo, hi = int(target.min()), int(target.max())
            if lo < 0 or hi >= c:
                bad = lo if lo < 0 else hi
                raise ValueError(f"target: labels must be in [0, {c}) for {c} classes, got {bad}")
    elif target.ndim == 2:
        check_array("target", target, ndim=2, dtype=logits.dtype, shape=(n, c))
    else:
        raise ValueError(f"target: expected labels of shape ({n},) or probabilities of shape "
                         f"({n}, {c}), got shape {target.shape}")


def _check_classes(in_name, x, out_name, out, target):
    """``x`` (N, C) with C >= 1, ``out`` like it, ``target`` labels or probabilities for it."""
    check_array(in_name, x, ndim=2)
    if x.shape[1] == 0:
        raise ValueError(f"{in_name}: expected at least one class, got shape {x.shape}")
    check_array(out_name, out, ndim=2, dtype=x.dtype, shape=x.shape)
    _check_target(target, x)


def softmax_cross_entropy_forward(probs, logits, target):
    """probs = softmax(logits) row-wise; returns the mean over rows of
    -sum_j y_j log softmax(logits)_j as a Python float.

    ``logits``/``probs`` are (N, C) C-contiguous float32/float64 (``probs`` may be
    ``logits``). ``target`` is (N,) integer labels in [0, C) (any integer dtype) or (N, C)
    probabilities of the logits' dtype. Stable for any finite logits (the row max is
    subtracted before exp). N == 0 gives nan, like the mean of nothing."""
    _check_classes("logits", logits, "probs", probs, target)
    return softmax_cross_entropy_forward_unchecked(probs, logits, target)


def softmax_cross_entropy_backward(dlogits, probs, target):
    """dlogits = (probs - y) / N, with y the one-hot labels or the probability targets and
    ``probs`` the softmax written by the forward. ``dlogits`` may be ``probs``."""
    _check_classes("probs", probs, "dlogits", dlogits, target)
    return softmax_cross_entropy_backward_unchecked(dlogits, probs, target)


# ----------------------------------------------------------------------------- MSE
# One pass over pred and target per block: d = pred - target into dpred (or scratch), its
# sum of squares while the block is in L2, then d * (2 / n) in place. The sum of squares is
# np.vecdot over the block viewed as (_DOT_ROWS, cols): numpy's BLAS dot row by row, rows
# short enough that OpenBLAS never threads them (it threads a dot above 10000 elements,
# waking numpy's own OpenBLAS pool, not the one the GEMMs use), and more than 500 of them,
# so numpy releases the GIL (it keeps it for a gufunc with fewer outer iterations): a split
# call's other thread runs meanwhile; as fast as one np.dot over the block (docs/
# performance.md, "Losses"). Per-block sums are kept and added with math.fsum (exactly
# rounded, so in any order): the loss does not depend on the thread count.
_DOT_ROWS = 512
_DOT_ONE_MAX = 8192


def _sumsq(d, v, cols):
    """sum(d * d) of a 1-D block as a Python float, through row-wise dots (see above); one
    np.dot for short blocks (OpenBLAS does not thread those; fewer calls)."""
    m = d.size
    if m <= _DOT_ONE_MAX:
        return float(np.dot(d, d))
    q = m - m % cols
    total = 0.0
    if q:
        r = q // cols
        vb = v[:r]
        d2 = d[:q].reshape(r, cols)
        np.vecdot(d2, d2, out=vb)
        total = float(np.add.reduce(vb))
    if q < m:
        tail = d[q:]
        total += float(np.vecdot(tail, tail))
    return total


def _mse_block(dp, p, t, scale, part, b, i, j, slot):
    d = slot[0][:j - i] if dp is None else dp[i:j]
    np.subtract(p[i:j], t[i:j], d)
    part[b] = _sumsq(d, slot[1], max(1, slot[0].size // _DOT_ROWS))
    if dp is not None:
        np.multiply(d, scale, d)


def _grad_scale(n, dtype):
    """2 / n as a 0-d array of ``dtype``: a multiply is cheaper than a divide, and a 0-d
    operand is not converted on every call."""
    return np.array(2.0 / n, dtype)


def _mse_slots(dtype, k, blk):
    """Per slot: a (blk,) difference block and a (_DOT_ROWS,) row-sum vector."""
    return [(scratch(("losses.mse_d", s), blk, dtype),
             scratch(("losses.mse_rows", s), _DOT_ROWS, dtype)) for s in range(k)]


def _mse_run(dp, p, t):
    """sum((p - t)^2) over flat views, as a Python float; with ``dp``, also
    dp = (p - t) * (2 / n) (dp may be p). Large arrays are split over blasnet's threads,
    which take blocks from a shared counter (kernels.parallel.split_blocks)."""
    n = p.size
    blk = _BLOCK_BYTES // p.dtype.itemsize
    if n <= _DOT_ONE_MAX and dp is not None:  # small: no scratch, no loop (call overhead)
        np.subtract(p, t, dp)
        total = float(np.dot(dp, dp))
        np.multiply(dp, 2.0 / n, dp)
        return total
    nb = -(-n // blk)
    scale = _grad_scale(n, p.dtype)
    k = _par.threads_for(n)
    part = scratch("losses.mse_part", nb, np.float64)  # per-block sums, any order
    slots = bundle(("losses.mse", p.dtype, k, blk), _mse_slots, p.dtype, k, blk)

    def worker(blocks, s):
        slot = slots[s]
        for b in blocks:
            i = b * blk
            _mse_block(dp, p, t, scale, part, b, i, min(i + blk, n), slot)
    _par.split_blocks(worker, nb, k)
    return part[0] if nb == 1 else math.fsum(part)


def mse_forward_unchecked(pred, target):
    """``mse_forward`` without checks (hot path): same shape, dtype and memory order."""
    p, t = flat_view(pred), flat_view(target)
    n = p.size
    if n == 0:
        return math.nan
    return float(_mse_run(None, p, t)) / n


def mse_backward_unchecked(dpred, pred, target):
    """``mse_backward`` without checks (hot path). ``dpred`` may be ``pred``."""
    dp, p, t = flat_view(dpred), flat_view(pred), flat_view(target)
    n = p.size
    if n == 0:  # nothing to write (the loss of nothing is nan, its gradient empty)
        return dpred
    blk = _BLOCK_BYTES // p.dtype.itemsize
    scale = _grad_scale(n, p.dtype)
    if n <= blk:  # one block: no slicing, no split (small arrays are bound by call overhead)
        np.subtract(p, t, dp)
        np.multiply(dp, scale, dp)
        return dpred

    def run(i0, i1, _):
        ds, ps, ts = dp[i0:i1], p[i0:i1], t[i0:i1]  # this thread's range: slices stop at it
        for i in range(0, i1 - i0, blk):
            db = ds[i:i + blk]
            np.subtract(ps[i:i + blk], ts[i:i + blk], db)
            np.multiply(db, scale, db)
    _par.split(run, n)
    return dpred


def mse_forward_backward_unchecked(dpred, pred, target):
    """``mse_forward_backward`` without checks (hot path). ``dpred`` may be ``pred``."""
    dp, p, t = flat_view(dpred), flat_view(pred), flat_view(target)
    n = p.size
    if n == 0:
        return math.nan
    return float(_mse_run(dp, p, t)) / n


def mse_forward(pred, target):
    """mean((pred - target)**2) over all elements, as ``torch.nn.MSELoss()``; a Python float.

    ``pred`` and ``target`` have any one shape, one float dtype and one memory order (C or
    Fortran). An empty array gives nan."""
    check_contiguous("pred", pred)
    check_like("target", target, "pred", pred)
    return mse_forward_unchecked(pred, target)


def mse_backward(dpred, pred, target):
    """dpred = 2 * (pred - target) / pred.size. ``dpred`` may be ``pred``."""
    check_contiguous("pred", pred)
    check_like("target", target, "pred", pred)
    check_like("dpred", dpred, "pred", pred, written=True)
    return mse_backward_unchecked(dpred, pred, target)


def mse_forward_backward(dpred, pred, target):
    """``mse_forward(pred, target)`` and ``mse_backward(dpred, pred, target)`` in one pass
    over pred and target: writes dpred = 2 * (pred - target) / pred.size (the same bits as
    ``mse_backward``) and returns the loss (the same value as ``mse_forward``). ``dpred``
    may be ``pred``: the loss is computed from each block before it is overwritten."""
    check_contiguous("pred", pred)
    check_like("target", target, "pred", pred)
    check_like("dpred", dpred, "pred", pred, written=True)
    return mse_forward_backward_unchecked(dpred, pred, target)

"""Losses: softmax + cross-entropy (integer labels or probability targets) and MSE, with the
mean reduction of PyTorch's CrossEntropyLoss and MSELoss. Each has a forward returning the
mean loss as a Python float and a fused backward; MSE also ``mse_forward_backward``, loss
and gradient in one pass (what engine.MSELoss uses).

Each is compiled (kernels.jit): cross-entropy per row (softmax written into ``probs``, the
row's loss into a per-row vector), MSE per block of ``BLOCK`` elements (the block's sum of
squares into a per-block vector); rows or blocks are split over blasnet's threads, and the
loss is the sum of those vectors in order, so it does not depend on the thread count.
"""
from __future__ import annotations

import math

import numpy as np

from . import fastmath, lanes
from .softmax import WIDE_ROWS, softmax_row, softmax_row16
from . import parallel as _par
from .gemm import check_array, check_contiguous, check_like
from .jit import jit
from .memory import scratch
from .optim import flat_view

__all__ = ["softmax_cross_entropy_forward", "softmax_cross_entropy_backward",
           "mse_forward", "mse_backward",
           "softmax_cross_entropy_forward_unchecked", "softmax_cross_entropy_backward_unchecked",
           "mse_forward_unchecked", "mse_backward_unchecked",
           "mse_forward_backward", "mse_forward_backward_unchecked"]

# Relative cost per element for kernels.parallel.threads_for (a copy is 1), from where two
# threads overtook one (docs/performance.md, "Split thresholds"): the cross-entropy forward
# (exp and two row reductions) is compute-bound, its backward a stream.
CE_FWD_COST = 10
CE_BWD_COST = 1
MSE_COST = 3
BLOCK = 4096  # MSE: elements per partial sum (fixed: the loss's order of additions)


# ----------------------------------------------------------------------------- softmax + CE
# Rows of at least WIDE_ROWS classes take the 16-lane kernels (kernels.softmax).


@jit(slp=True)
def _ce_labels_fwd(losses, probs, logits, labels, i0, i1):
    c = logits.shape[1]
    for r in range(i0, i1):
        t = min(max(np.int64(labels[r]), 0), c - 1)  # unchecked: out of range is clipped
        lt = logits[r, t]                      # before probs (maybe logits) is written
        m, lse = softmax_row(probs[r], logits[r])
        losses[r] = lse - (lt - m)             # -log softmax[t]
    return 0


@jit(slp=True)
def _ce_labels_fwd_wide(losses, probs, logits, labels, acc, i0, i1):
    # _ce_labels_fwd for rows of WIDE_ROWS classes or more
    c = logits.shape[1]
    for r in range(i0, i1):
        t = min(max(np.int64(labels[r]), 0), c - 1)
        lt = logits[r, t]
        m, lse = softmax_row16(probs[r], logits[r], acc)
        losses[r] = lse - (lt - m)
    return 0


@jit(slp=True)
def _ce_probs_fwd(losses, probs, logits, target, i0, i1):
    for r in range(i0, i1):
        lr, yr = logits[r], target[r]
        # -sum_j y (l - max - lse) = lse sum_j y - sum_j y (l - max)
        m = lanes.row_max(lr)
        ys = lanes.row_wsum_centred(yr, lr, m)
        m, lse = softmax_row(probs[r], lr)
        losses[r] = lse * lanes.row_sum(yr) - ys
    return 0


@jit(slp=True)
def _ce_probs_fwd_wide(losses, probs, logits, target, acc, i0, i1):
    # _ce_probs_fwd for rows of WIDE_ROWS classes or more (the probabilities' bits are then
    # those of _ce_labels_fwd_wide, as they are below)
    for r in range(i0, i1):
        lr, yr = logits[r], target[r]
        m = lanes.row_max(lr)
        ys = lanes.wsum16_centred(yr, lr, m, acc)
        m, lse = softmax_row16(probs[r], lr, acc)
        losses[r] = lse * lanes.sum16(yr, acc) - ys
    return 0


@jit
def _ce_labels_bwd(dlogits, probs, labels, n, i0, i1):
    c = probs.shape[1]
    nn = fastmath.const(n, probs)
    for r in range(i0, i1):
        t = min(max(np.int64(labels[r]), 0), c - 1)
        pt = probs[r, t]                       # before dlogits (maybe probs) is written
        pr, dr = probs[r], dlogits[r]
        for j in range(c):
            dr[j] = pr[j] / nn
        dr[t] = (pt - fastmath.const(1, pt)) / nn
    return 0


@jit
def _ce_probs_bwd(dlogits, probs, target, n, i0, i1):
    nn = fastmath.const(n, probs)
    for r in range(i0, i1):
        pr, yr, dr = probs[r], target[r], dlogits[r]
        for j in range(pr.shape[0]):
            dr[j] = (pr[j] - yr[j]) / nn
    return 0


def _rows(kernel, n, c, args, cost, lanes16=None):
    """``kernel(*args, i0, i1)`` over rows, split over blasnet's threads when large; with
    ``lanes16`` (a dtype) ``kernel(*args, acc, i0, i1)``, ``acc`` the slot's 16-lane scratch
    (kernels.lanes)."""
    k = _par.threads_for(n, c, passes=cost)
    accs = [()] * k if lanes16 is None else lanes.stored_lanes(k, lanes16)
    if k == 1:
        kernel(*args, *accs[0], 0, n)
    else:
        _par.split(lambda i0, i1, s: kernel(*args, *accs[s], i0, i1), n, c, k=k)


def _labels(target):
    """Labels as a C-contiguous int64 array: ``target`` itself, or its copy in a scratch
    buffer, so that each kernel is compiled once per float dtype, not once per integer
    type a caller's labels happen to have (each compile costs ~1 s)."""
    if target.dtype == np.int64 and target.flags.c_contiguous:
        return target
    buf = scratch("losses.labels", target.shape[0], np.int64)
    np.copyto(buf, target, casting="unsafe")
    return buf


def softmax_cross_entropy_forward_unchecked(probs, logits, target):
    """``softmax_cross_entropy_forward`` without checks (hot path). Labels must already be in
    range (out-of-range labels are clipped, not reported). ``probs`` may be ``logits``."""
    n, c = logits.shape
    if n == 0:
        return math.nan
    losses = scratch("losses.ce_rows", n, np.float64)  # (n,) each row's loss
    if target.ndim == 1:
        args = (losses, probs, logits, _labels(target))
        if c >= WIDE_ROWS:
            _rows(_ce_labels_fwd_wide, n, c, args, CE_FWD_COST, logits.dtype)
        else:
            _rows(_ce_labels_fwd, n, c, args, CE_FWD_COST)
    else:
        args = (losses, probs, logits, target)
        if c >= WIDE_ROWS:
            _rows(_ce_probs_fwd_wide, n, c, args, CE_FWD_COST, logits.dtype)
        else:
            _rows(_ce_probs_fwd, n, c, args, CE_FWD_COST)
    return float(lanes.sum_in_order(losses)) / n


def softmax_cross_entropy_backward_unchecked(dlogits, probs, target):
    """``softmax_cross_entropy_backward`` without checks (hot path). ``dlogits`` may be
    ``probs``; labels must be in range (they are clipped, not reported)."""
    n, c = probs.shape
    if n == 0:
        return dlogits
    if target.ndim == 1:
        _rows(_ce_labels_bwd, n, c, (dlogits, probs, _labels(target), n), CE_BWD_COST)
    else:
        _rows(_ce_probs_bwd, n, c, (dlogits, probs, target, n), CE_BWD_COST)
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
@jit(slp=True)
def _mse_sums(part, p, t, b0, b1):
    """part[b] = sum((p - t)^2) over block b, for blocks b0..b1."""
    n = p.shape[0]
    for b in range(b0, b1):
        i, j = b * BLOCK, min((b + 1) * BLOCK, n)
        part[b] = np.float64(lanes.row_sqdist(p[i:j], t[i:j]))
    return 0


@jit(slp=True)
def _mse_fwd_bwd(part, dp, p, t, scale, b0, b1):
    """``_mse_sums`` and dp = (p - t) * scale (dp may be p: each block is read first)."""
    n = p.shape[0]
    for b in range(b0, b1):
        i, j = b * BLOCK, min((b + 1) * BLOCK, n)
        part[b] = np.float64(lanes.row_sqdist(p[i:j], t[i:j]))
        db, pb, tb = dp[i:j], p[i:j], t[i:j]
        for q in range(j - i):
            db[q] = (pb[q] - tb[q]) * scale
    return 0


@jit
def _mse_bwd(dp, p, t, scale, i0, i1):
    dp, p, t = dp[i0:i1], p[i0:i1], t[i0:i1]
    for i in range(i1 - i0):
        dp[i] = (p[i] - t[i]) * scale
    return 0


def _blocks(kernel, n, args):
    """``kernel(part, *args, b0, b1)`` over the BLOCK-element blocks of n elements, split over
    blasnet's threads when large; returns the sum of the partial sums, in block order."""
    nb = -(-n // BLOCK)
    part = scratch("losses.mse_part", nb, np.float64)   # (nb,) per-block sums
    k = _par.threads_for(n, passes=MSE_COST)
    if k == 1:
        kernel(part, *args, 0, nb)
    else:
        _par.split(lambda b0, b1, _: kernel(part, *args, b0, b1), nb, BLOCK, k=min(k, nb))
    return lanes.sum_in_order(part)


def _grad_scale(n, dtype):
    """2 / n in ``dtype`` (a multiply is cheaper than a divide)."""
    return np.dtype(dtype).type(2.0 / n)


def mse_forward_unchecked(pred, target):
    """``mse_forward`` without checks (hot path): same shape, dtype and memory order."""
    p, t = flat_view(pred), flat_view(target)
    n = p.size
    if n == 0:
        return math.nan
    return float(_blocks(_mse_sums, n, (p, t))) / n


def mse_backward_unchecked(dpred, pred, target):
    """``mse_backward`` without checks (hot path). ``dpred`` may be ``pred``."""
    dp, p, t = flat_view(dpred), flat_view(pred), flat_view(target)
    n = p.size
    if n == 0:  # nothing to write (the loss of nothing is nan, its gradient empty)
        return dpred
    scale = _grad_scale(n, p.dtype)
    k = _par.threads_for(n, passes=MSE_COST)
    if k == 1:
        _mse_bwd(dp, p, t, scale, 0, n)
    else:
        _par.split(lambda i0, i1, _: _mse_bwd(dp, p, t, scale, i0, i1), n, k=k)
    return dpred


def mse_forward_backward_unchecked(dpred, pred, target):
    """``mse_forward_backward`` without checks (hot path). ``dpred`` may be ``pred``."""
    dp, p, t = flat_view(dpred), flat_view(pred), flat_view(target)
    n = p.size
    if n == 0:
        return math.nan
    return float(_blocks(_mse_fwd_bwd, n, (dp, p, t, _grad_scale(n, p.dtype)))) / n


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

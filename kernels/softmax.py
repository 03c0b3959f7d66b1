"""Row-wise softmax and log-softmax over the last axis, forward and backward.

Each is one compiled kernel over rows (kernels.jit): a row's max and sums through
kernels.lanes, exp through kernels.fastmath (vectorised in float32). Rows are split over
blasnet's threads when large; every row is computed alone, so the result does not depend on
the split.
"""
from __future__ import annotations

import math

import numpy as np

from . import fastmath, lanes
from . import parallel as _par
from .gemm import check_array
from .jit import jit
from .memory import scratch

__all__ = ["softmax_forward", "softmax_backward", "log_softmax_forward",
           "log_softmax_backward", "softmax_forward_unchecked", "softmax_backward_unchecked",
           "log_softmax_forward_unchecked", "log_softmax_backward_unchecked", "softmax_row",
           "softmax_row16", "WIDE_ROWS"]

# Relative cost per element for kernels.parallel.threads_for (a copy is 1), from where two
# threads overtook one (docs/performance.md, "Split thresholds"): the forwards (exp or log
# and row reductions) are compute-bound, the backwards one row reduction and a stream.
FWD_COST = 8
BWD_COST = 5
LOG_BWD_COST = 4


# Rows of at least this many classes take the kernels whose row sums run in 16 stored lanes
# (kernels.lanes), shorter rows the eight-lane ones: cross-entropy at 65 classes ran
# 0.84 ns per logit in 16 lanes against 0.60 in eight, from 128 on 0.28-0.36 against 0.37-0.47
# (float32, 1 thread, Zen 5). The choice is the shape's alone.
WIDE_ROWS = 128


@jit(inline="always")
def _exp_row(er, lr):
    """er = exp(lr - max(lr)) (er may be lr; exp stays <= 1); returns the max. The max stays
    in eight lanes whatever the width: it is exact in any order, and a 16-lane max cost ~2.5 s
    more to compile per kernel for 12 % of the pass."""
    m = lanes.row_max(lr)
    for j in range(lr.shape[0]):
        er[j] = fastmath.exp(lr[j] - m)
    return m


@jit(inline="always")
def softmax_row(pr, lr):
    """pr = softmax(lr) (pr may be lr); returns (max, log sum exp(lr - max))."""
    m = _exp_row(pr, lr)
    return m, _normalise(pr, lanes.row_sum(pr))


@jit(inline="always")
def softmax_row16(pr, lr, acc):
    """softmax_row with the row's sum in 16 stored lanes (kernels.lanes; ``acc`` the
    scratch row they are stored to)."""
    m = _exp_row(pr, lr)
    return m, _normalise(pr, lanes.sum16(pr, acc))


@jit(inline="always")
def _normalise(pr, s):
    inv = fastmath.const(1, s) / s
    for j in range(pr.shape[0]):
        pr[j] *= inv
    return math.log(s)


@jit(slp=True)
def _softmax_fwd(y, x, i0, i1):
    for r in range(i0, i1):
        softmax_row(y[r], x[r])               # x - max: exp stays <= 1
    return 0


@jit(slp=True)
def _softmax_fwd_wide(y, x, acc, i0, i1):
    # _softmax_fwd for rows of WIDE_ROWS or more (acc: the lanes' scratch)
    for r in range(i0, i1):
        softmax_row16(y[r], x[r], acc)
    return 0


@jit(slp=True)
def _softmax_bwd(dx, dy, y, i0, i1):
    for r in range(i0, i1):
        yr, dyr, dxr = y[r], dy[r], dx[r]
        s = lanes.row_dot(dyr, yr)            # sum_k dy_k y_k
        for j in range(yr.shape[0]):
            dxr[j] = yr[j] * (dyr[j] - s)
    return 0


@jit(inline="always")
def _log_row(yr, xr, m, lse):
    for j in range(xr.shape[0]):
        yr[j] = (xr[j] - m) - lse


@jit(slp=True)
def _log_softmax_fwd(y, x, tmp, i0, i1):
    # tmp: a (C,) row of scratch for exp(x - max), so that the exp loop vectorises (y may
    # be x, which must be read again after)
    for r in range(i0, i1):
        xr = x[r]
        m = _exp_row(tmp, xr)
        _log_row(y[r], xr, m, math.log(lanes.row_sum(tmp)))   # log sum exp(x - max) >= 0
    return 0


@jit(slp=True)
def _log_softmax_fwd_wide(y, x, tmp, acc, i0, i1):
    # _log_softmax_fwd for rows of WIDE_ROWS or more (acc: the lanes' scratch)
    for r in range(i0, i1):
        xr = x[r]
        m = _exp_row(tmp, xr)
        _log_row(y[r], xr, m, math.log(lanes.sum16(tmp, acc)))
    return 0


@jit
def _log_softmax_bwd(dx, dy, y, i0, i1):
    for r in range(i0, i1):
        yr, dyr, dxr = y[r], dy[r], dx[r]
        s = lanes.row_sum(dyr)                # sum_k dy_k
        for j in range(yr.shape[0]):
            dxr[j] = dyr[j] - fastmath.exp(yr[j]) * s
    return 0


def _run(kernel, out, a, b, cost, wide=None):
    """``kernel(out, a, b, i0, i1)`` over the rows of the (N, C) ``out``, split when large
    (``kernel(out, a, i0, i1)`` when ``b`` is None); rows of ``WIDE_ROWS`` or more take
    ``wide`` when given, with the slot's 16-lane scratch after the inputs."""
    n, c = out.shape
    if not (n and c):
        return out
    k = _par.threads_for(n, c, passes=cost)
    ins = (a,) if b is None else (a, b)
    if wide is not None and c >= WIDE_ROWS:
        kernel, extra = wide, lanes.stored_lanes(k, out.dtype)
    else:
        extra = [()] * k
    if k == 1:
        kernel(out, *ins, *extra[0], 0, n)
    else:
        _par.split(lambda i0, i1, s: kernel(out, *ins, *extra[s], i0, i1), n, c, k=k)
    return out


# ----------------------------------------------------------------------------- unchecked cores
def softmax_forward_unchecked(y, x):
    """``y = softmax(x)`` over the last axis of C-contiguous (N, C) arrays of one float dtype
    (``y`` may be ``x``; no checks)."""
    return _run(_softmax_fwd, y, x, None, FWD_COST, wide=_softmax_fwd_wide)


def softmax_backward_unchecked(dx, dy, y):
    """``dx = y * (dy - sum(dy * y))`` row-wise, ``y`` the forward's output (``dx`` may be
    ``dy``; no checks)."""
    return _run(_softmax_bwd, dx, dy, y, BWD_COST)


def log_softmax_forward_unchecked(y, x):
    """``y = x - max(x) - log(sum(exp(x - max(x))))`` row-wise (``y`` may be ``x``; no checks)."""
    n, c = y.shape
    if not (n and c):
        return y
    k = _par.threads_for(n, c, passes=FWD_COST)
    tmps = [(scratch(("softmax.exp_row", s), c, x.dtype),) for s in range(k)]  # (C,) per slot
    kernel = _log_softmax_fwd
    if c >= WIDE_ROWS:
        kernel = _log_softmax_fwd_wide
        tmps = [t + a for t, a in zip(tmps, lanes.stored_lanes(k, x.dtype))]
    if k == 1:
        kernel(y, x, *tmps[0], 0, n)
    else:
        _par.split(lambda i0, i1, s: kernel(y, x, *tmps[s], i0, i1), n, c, k=k)
    return y


def log_softmax_backward_unchecked(dx, dy, y):
    """``dx = dy - exp(y) * sum(dy)`` row-wise, ``y`` the forward's output (``dx`` may be
    ``dy``; no checks)."""
    return _run(_log_softmax_bwd, dx, dy, y, LOG_BWD_COST)


# ----------------------------------------------------------------------------- checked API
def _check(out_name, out, in_names, ins):
    first = ins[0]
    check_array(in_names[0], first, ndim=2)
    for name, a in zip(in_names[1:], ins[1:]):
        check_array(name, a, dtype=first.dtype, shape=first.shape)
    check_array(out_name, out, dtype=first.dtype, shape=first.shape)
    for name, a in zip(in_names, ins):
        if np.may_share_memory(out, a) and not (out.__array_interface__["data"][0]
                                                == a.__array_interface__["data"][0]):
            raise ValueError(f"{out_name}: must be {name} itself or not overlap it")


def softmax_forward(y, x):
    """``y = softmax(x)`` over the last axis: ``exp(x - max) / sum(exp(x - max))`` per row of
    a C-contiguous (N, C) float32/float64 ``x``; ``y`` like ``x`` (may be ``x``). Returns y."""
    _check("y", y, ("x",), (x,))
    return softmax_forward_unchecked(y, x)


def softmax_backward(dx, dy, y):
    """The input gradient of softmax: ``dx = y * (dy - sum(dy * y))`` per row, with ``y`` the
    forward's output. Arrays like ``y``; ``dx`` may be ``dy``. Returns dx."""
    _check("dx", dx, ("y", "dy"), (y, dy))
    if np.may_share_memory(dx, y):
        raise ValueError("dx: must not overlap y (y is read after dx is written)")
    return softmax_backward_unchecked(dx, dy, y)


def log_softmax_forward(y, x):
    """``y = log_softmax(x)`` over the last axis, ``x - max - log(sum(exp(x - max)))`` per row
    (no log of a rounded-to-zero probability). ``y`` like ``x`` (may be ``x``). Returns y."""
    _check("y", y, ("x",), (x,))
    return log_softmax_forward_unchecked(y, x)


def log_softmax_backward(dx, dy, y):
    """The input gradient of log-softmax: ``dx = dy - exp(y) * sum(dy)`` per row, with ``y``
    the forward's output. Arrays like ``y``; ``dx`` may be ``dy``. Returns dx."""
    _check("dx", dx, ("y", "dy"), (y, dy))
    if np.may_share_memory(dx, y):
        raise ValueError("dx: must not overlap y (y is read after dx is written)")
    return log_softmax_backward_unchecked(dx, dy, y)

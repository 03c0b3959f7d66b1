"""Row-wise softmax and log-softmax over the last axis, forward and backward.

Each pass walks (N, C) row blocks of ~128 KiB, so a block's chain stays in L2. A per-row
value (the row max, the row sum) is spread over the block by copying it into a tile
(``np.copyto(tile, v[:, None])``): a broadcasting ufunc would make NumPy allocate an iterator
buffer on every call, a broadcast copy does not. Large arrays are split over blasnet's threads.
"""
from __future__ import annotations

import numpy as np

from . import parallel as _par
from .gemm import check_array
from .memory import scratch

__all__ = ["softmax_forward", "softmax_backward", "log_softmax_forward",
           "log_softmax_backward", "softmax_forward_unchecked", "softmax_backward_unchecked",
           "log_softmax_forward_unchecked", "log_softmax_backward_unchecked"]

_BLOCK_BYTES = 128 * 1024
_SPLIT_BLOCK_BYTES = 512 * 1024


def _rows(c, itemsize, split):
    return max(1, (_SPLIT_BLOCK_BYTES if split else _BLOCK_BYTES) // (c * itemsize))


def _run(block_fn, *arrays):
    """``block_fn(i, j, vec, tile, tmp, *arrays)`` over row blocks of the (N, C) rows of the
    last array (the one the pass reads: x forward, y backward), none when N or C is 0; split
    over threads when large; scratch (``vec`` (rows,), ``tile`` and ``tmp`` (rows, C)) is
    per thread. Returns the first array (the output)."""
    src = arrays[-1]
    n, c = src.shape
    if not (n and c):
        return arrays[0]
    dtype = src.dtype

    def run(i0, i1, slot, split=False):
        rows = _rows(c, dtype.itemsize, split)
        vec = scratch("softmax.vec", rows, dtype)          # (rows,) row max / row sum
        tile = scratch("softmax.tile", (rows, c), dtype)   # (rows, C) a row value spread out
        tmp = scratch("softmax.tmp", (rows, c), dtype)     # (rows, C) exp or products
        for i in range(i0, i1, rows):
            j = min(i + rows, i1)
            r = j - i
            block_fn(i, j, vec[:r], tile[:r], tmp[:r], *arrays)

    if n * c < _par.SPLIT_MIN:
        run(0, n, 0)
    else:
        _par.split(lambda i0, i1, slot: run(i0, i1, slot, True), n, c)
    return arrays[0]


def _spread(tile, v):
    np.copyto(tile, v[:, None])  # broadcast copy: no iterator buffer (see the module doc)


# ----------------------------------------------------------------------------- softmax
def _softmax_fwd(i, j, vec, tile, tmp, y, x):
    xb, yb = x[i:j], y[i:j]
    np.maximum.reduce(xb, axis=1, out=vec)
    _spread(tile, vec)
    np.subtract(xb, tile, out=yb)      # x - max: exp stays <= 1
    np.exp(yb, out=yb)
    np.add.reduce(yb, axis=1, out=vec)
    np.divide(1.0, vec, out=vec)
    _spread(tile, vec)
    np.multiply(yb, tile, out=yb)


def _softmax_bwd(i, j, vec, tile, tmp, dx, dy, y):
    dyb, yb, dxb = dy[i:j], y[i:j], dx[i:j]
    np.multiply(dyb, yb, out=tmp)
    np.add.reduce(tmp, axis=1, out=vec)  # sum_k dy_k y_k
    _spread(tile, vec)
    np.subtract(dyb, tile, out=dxb)
    np.multiply(dxb, yb, out=dxb)        # y * (dy - sum dy y)


def _log_softmax_fwd(i, j, vec, tile, tmp, y, x):
    xb, yb = x[i:j], y[i:j]
    np.maximum.reduce(xb, axis=1, out=vec)
    _spread(tile, vec)
    np.subtract(xb, tile, out=yb)      # shifted = x - max
    np.exp(yb, out=tmp)
    np.add.reduce(tmp, axis=1, out=vec)
    np.log(vec, out=vec)               # log sum exp(shifted) >= 0: no cancellation in y
    _spread(tile, vec)
    np.subtract(yb, tile, out=yb)


def _log_softmax_bwd(i, j, vec, tile, tmp, dx, dy, y):
    dyb, yb, dxb = dy[i:j], y[i:j], dx[i:j]
    np.add.reduce(dyb, axis=1, out=vec)  # sum_k dy_k
    np.exp(yb, out=tmp)                  # softmax
    _spread(tile, vec)
    np.multiply(tmp, tile, out=tmp)
    np.subtract(dyb, tmp, out=dxb)       # dy - softmax * sum dy


# ----------------------------------------------------------------------------- unchecked cores
def softmax_forward_unchecked(y, x):
    """``y = softmax(x)`` over the last axis of C-contiguous (N, C) arrays of one float dtype
    (``y`` may be ``x``; no checks)."""
    return _run(_softmax_fwd, y, x)


def softmax_backward_unchecked(dx, dy, y):
    """``dx = y * (dy - sum(dy * y))`` row-wise, ``y`` the forward's output (``dx`` may be
    ``dy``; no checks)."""
    return _run(_softmax_bwd, dx, dy, y)


def log_softmax_forward_unchecked(y, x):
    """``y = x - max(x) - log(sum(exp(x - max(x))))`` row-wise (``y`` may be ``x``; no checks)."""
    return _run(_log_softmax_fwd, y, x)


def log_softmax_backward_unchecked(dx, dy, y):
    """``dx = dy - exp(y) * sum(dy)`` row-wise, ``y`` the forward's output (``dx`` may be
    ``dy``; no checks)."""
    return _run(_log_softmax_bwd, dx, dy, y)


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

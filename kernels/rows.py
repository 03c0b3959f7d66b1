"""Row fills and adds the blocks need around their GEMMs: ``fill_rows`` (y = b, or y = res + b,
before a GEMM that accumulates with beta=1) and ``add``, split over blasnet's threads when large.

A broadcasting ufunc (``y += b``) makes NumPy allocate iterator buffers on every call, so a
bias is added by copying it into the rows, or through a tile of it with plain adds.
"""
from __future__ import annotations

import numpy as np

from . import parallel as _par
from .memory import scratch

__all__ = ["fill_rows", "add"]

_SPLIT_BLOCK_BYTES = 512 * 1024  # rows of the bias tile: long ufunc calls (kernels.parallel)
_SPLIT_MIN = _par.SPLIT_MIN       # elements: smaller passes run inline, in one call


def fill_rows(y, b=None, res=None):
    """``y[i] = b`` (``b`` of shape (d,)), ``y = res`` or ``y[i] = res[i] + b`` for a C-contiguous
    (n, d) ``y`` and ``res`` (no checks; ``b`` and ``res`` not both None). ``y`` may be ``res``."""
    n, d = y.shape
    if res is None:
        if n * d < _SPLIT_MIN:
            np.copyto(y, b)
        else:
            _par.split(lambda i, j, _: np.copyto(y[i:j], b), n, d)
        return y
    if b is None:
        np.copyto(y, res)
        return y
    if n * d < _SPLIT_MIN:
        if np.may_share_memory(y, res):  # y is res: filling y with b first would lose res
            np.add(y, b, out=y)
        else:
            np.copyto(y, b)
            np.add(y, res, out=y)
        return y
    rows = max(1, min(n, _SPLIT_BLOCK_BYTES // (d * y.itemsize)))
    tile = scratch("rows.tile", (rows, d), y.dtype)  # shared read-only by the threads
    np.copyto(tile, b)

    def run(i0, i1, _):
        for i in range(i0, i1, rows):
            j = min(i + rows, i1)
            np.add(res[i:j], tile[:j - i], out=y[i:j])
    _par.split(run, n, d)
    return y


def add(out, a, b):
    """``out = a + b`` for C-contiguous arrays of one shape (out may be a or b; no checks)."""
    if out.ndim != 2 or out.size < _SPLIT_MIN:
        np.add(a, b, out=out)
        return out
    _par.split(lambda i, j, _: np.add(a[i:j], b[i:j], out=out[i:j]), *out.shape)
    return out

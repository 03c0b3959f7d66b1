"""Row fills and adds the blocks need around their GEMMs: ``fill_rows`` (y = b, or y = res + b,
before a GEMM that accumulates with beta=1) and ``add`` (residual adds), each one compiled pass
(kernels.jit), split over blasnet's threads when large.
"""
from __future__ import annotations

from . import parallel as _par
from .jit import jit

__all__ = ["fill_rows", "add"]

# Relative cost per element for kernels.parallel.threads_for (a copy is 1).
COST = 1


@jit
def _fill_bias(y, b, i0, i1):
    for r in range(i0, i1):
        yr = y[r]
        for j in range(b.shape[0]):
            yr[j] = b[j]
    return 0


@jit
def _fill_res_bias(y, res, b, i0, i1):
    for r in range(i0, i1):
        yr, rr = y[r], res[r]
        for j in range(b.shape[0]):           # y may be res: element j is read first
            yr[j] = rr[j] + b[j]
    return 0


@jit
def _add(out, a, b, i0, i1):
    out, a, b = out[i0:i1], a[i0:i1], b[i0:i1]
    # In place, a loop that stores through out and loads through a (the same memory) would
    # fail LLVM's overlap check and run unvectorised: name one array only.
    if out.ctypes.data == a.ctypes.data:
        for i in range(i1 - i0):
            a[i] += b[i]
    elif out.ctypes.data == b.ctypes.data:
        for i in range(i1 - i0):
            b[i] += a[i]
    else:
        for i in range(i1 - i0):
            out[i] = a[i] + b[i]
    return 0


@jit
def _add_plain(out, a, b, i0, i1):
    # For a read-only a or b: _add's in-place branches store through them and cannot be
    # compiled for a read-only array. Elementwise, one loop is right even when out is a or b.
    out, a, b = out[i0:i1], a[i0:i1], b[i0:i1]
    for i in range(i1 - i0):
        out[i] = a[i] + b[i]
    return 0


def _rows(kernel, n, d, args):
    k = _par.threads_for(n, d, passes=COST)
    if k == 1:
        kernel(*args, 0, n)
    else:
        _par.split(lambda i0, i1, _: kernel(*args, i0, i1), n, d, k=k)


def fill_rows(y, b=None, res=None):
    """``y[i] = b`` (``b`` of shape (d,)), ``y = res`` or ``y[i] = res[i] + b`` for a C-contiguous
    (n, d) ``y`` and ``res`` (no checks; ``b`` and ``res`` not both None). ``y`` may be ``res``."""
    n, d = y.shape
    if not (n and d):
        return y
    if res is None:
        _rows(_fill_bias, n, d, (y, b))
    elif b is None:
        if not (y is res or y.__array_interface__["data"][0]
                == res.__array_interface__["data"][0]):
            _rows(_copy_rows, n, d, (y, res))
    else:
        _rows(_fill_res_bias, n, d, (y, res, b))
    return y


@jit
def _copy_rows(y, res, i0, i1):
    """y = res (rows i0..i1)."""
    for r in range(i0, i1):
        yr, rr = y[r], res[r]
        for j in range(yr.shape[0]):
            yr[j] = rr[j]
    return 0


def add(out, a, b):
    """``out = a + b`` for C-contiguous arrays of one shape (out may be a or b; a and b may be
    read-only; no checks)."""
    n = out.size
    if n:
        o, x, y = out.reshape(-1), a.reshape(-1), b.reshape(-1)
        kernel = _add if x.flags.writeable and y.flags.writeable else _add_plain
        k = _par.threads_for(n, passes=COST)
        if k == 1:
            kernel(o, x, y, 0, n)
        else:
            _par.split(lambda i0, i1, _: kernel(o, x, y, i0, i1), n, k=k)
    return out

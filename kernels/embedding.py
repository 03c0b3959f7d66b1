"""Embedding lookup (rows of a table gathered by integer ids) and its backward (rows of the
output gradient added into the table's gradient, repeated ids accumulating).

The lookup with a residual (a language model's token rows plus its position rows, nanoGPT's
``tok_emb + pos_emb``) is one compiled pass that gathers and adds, split over rows.

The backward is a scatter-add, one compiled pass (kernels.jit): for each id in order, one
row add ``dW[ids[i]] += dY[i]``, nothing allocated, repeats accumulated in order of i. Large
calls are split over blasnet's threads by columns (every thread walks all ids over its own
columns), so repeats never race and the sums do not depend on the thread count.
"""
from __future__ import annotations

import numpy as np

from . import parallel as _par
from .gemm import check_array
from .jit import jit

__all__ = ["embedding_forward", "embedding_backward", "embedding_forward_unchecked",
           "embedding_backward_unchecked"]

# Relative cost per element for kernels.parallel.threads_for (a copy is 1).
COST = 1


@jit
def _gather_add(out, ids, weight, residual, i0, i1):
    for i in range(i0, i1):
        o, w, r = out[i], weight[ids[i]], residual[i]
        for j in range(o.shape[0]):
            o[j] = w[j] + r[j]
    return 0


def embedding_forward_unchecked(out, ids, weight, residual=None):
    """``out[i] = weight[ids[i]]`` (``+ residual[i]``): ``out`` C-contiguous (N, d), ``ids``
    (N,) int64 in range, ``weight`` C-contiguous (V, d), ``residual`` None or C-contiguous
    (N, d) (may be ``out``). No checks (mode="clip" lets take write into ``out`` without a
    temporary)."""
    if residual is None:
        np.take(weight, ids, axis=0, out=out, mode="clip")
        return out
    n, d = out.shape
    k = _par.threads_for(n, d, passes=COST)
    if k == 1:
        _gather_add(out, ids, weight, residual, 0, n)
    else:
        _par.split(lambda i0, i1, _: _gather_add(out, ids, weight, residual, i0, i1), n, d, k=k)
    return out


@jit
def _scatter_add(dweight, ids, dout, j0, j1):
    for i in range(ids.shape[0]):
        dst, src = dweight[ids[i], j0:j1], dout[i, j0:j1]
        for j in range(j1 - j0):
            dst[j] += src[j]
    return 0


def embedding_backward_unchecked(dweight, ids, dout):
    """``dweight[ids[i]] += dout[i]`` for every i (repeats accumulate, in order of i):
    ``dweight`` C-contiguous (V, d), ``ids`` (N,) int64 in [0, V) (NOT checked: an id out of
    range writes outside ``dweight``), ``dout`` C-contiguous (N, d) of dweight's dtype."""
    n, d = dout.shape
    if n == 0 or d == 0:
        return dweight
    k = min(_par.threads_for(n, d, passes=COST), d)
    if k == 1:
        _scatter_add(dweight, ids, dout, 0, d)
    else:
        _par.split(lambda j0, j1, _: _scatter_add(dweight, ids, dout, j0, j1), d, n, k=k)
    return dweight


def _check_ids(ids, v):
    if not isinstance(ids, np.ndarray):
        raise TypeError(f"ids: expected a numpy.ndarray, got {type(ids).__name__}")
    if ids.dtype != np.int64 or ids.ndim != 1 or not ids.flags.c_contiguous:
        raise ValueError(f"ids: expected a C-contiguous 1-D int64 array, got {ids.dtype} "
                         f"shape {ids.shape}")
    if ids.size and (int(ids.min()) < 0 or int(ids.max()) >= v):
        bad = int(np.flatnonzero((ids < 0) | (ids >= v))[0])
        raise ValueError(f"ids: expected values in [0, {v}), got {int(ids[bad])} at index {bad}")


def _check(table_name, table, ids, rows_name, rows):
    """A C-contiguous (V, d) float ``table``, (N,) int64 ``ids`` in [0, V) and C-contiguous
    (N, d) ``rows`` of the table's dtype, not overlapping it; raises naming the argument."""
    check_array(table_name, table, ndim=2)
    _check_ids(ids, table.shape[0])
    check_array(rows_name, rows, dtype=table.dtype, shape=(ids.shape[0], table.shape[1]))
    if np.may_share_memory(rows, table):
        raise ValueError(f"{rows_name}: must not overlap {table_name}")


def embedding_forward(out, ids, weight, residual=None):
    """``out[i] = weight[ids[i]]`` for a C-contiguous (V, d) float ``weight``, (N,) int64
    ``ids`` in [0, V) and a C-contiguous (N, d) ``out``; with ``residual`` (N, d) of the same
    dtype, ``out[i] = weight[ids[i]] + residual[i]`` in the same pass (the bits of the lookup
    followed by an add; ``residual`` may be ``out``). Returns out."""
    _check("weight", weight, ids, "out", out)
    if residual is not None:
        _check("weight", weight, ids, "residual", residual)
        if np.may_share_memory(residual, out) and \
                residual.ctypes.data != out.ctypes.data:  # rows read after others wrote them
            raise ValueError("residual: expected out itself or an array not overlapping it")
    return embedding_forward_unchecked(out, ids, weight, residual)


def embedding_backward(dweight, ids, dout):
    """``dweight[ids[i]] += dout[i]`` for every i (ids may repeat; repeats accumulate).
    ``dweight`` C-contiguous (V, d) float, ``ids`` (N,) int64 in [0, V), ``dout`` C-contiguous
    (N, d). Returns dweight."""
    _check("dweight", dweight, ids, "dout", dout)
    return embedding_backward_unchecked(dweight, ids, dout)

"""Row-major GEMM on top of scipy's Fortran BLAS wrappers, writing into the caller's array.

A C-contiguous (m, k) array is, through ``.T``, a Fortran-contiguous (k, m) array, so the
row-major product ``C = op(A) @ op(B)`` is computed as the column-major ``C.T = op(B).T @ op(A).T``
with no copy. ``gemm`` checks its arguments; ``gemm_unchecked`` is the hot path for callers
(the engine) that own their buffers and have checked them once.
"""
from __future__ import annotations

import numpy as np
from scipy.linalg import blas as _blas

from . import overlap as _overlap
from . import threads as _threads
from .checks import check_array_like
from .memory import ones as _ones

__all__ = ["gemm", "gemm_unchecked", "gemv_colsum", "check_array", "check_contiguous",
           "check_like", "routines"]

# The package's one table of scipy BLAS routines; every kernel gets its routines from here.
_GEMM = {np.dtype(np.float32): _blas.sgemm, np.dtype(np.float64): _blas.dgemm}
_GEMV = {np.dtype(np.float32): _blas.sgemv, np.dtype(np.float64): _blas.dgemv}
# The pairs ``routines`` hands out, fixed at import: the model GEMMs (``gemm``) are what a
# GEMM floor counts, so a kernel's own BLAS calls (LayerNorm's rank-1 updates) stay out of
# anything that wraps ``_GEMM`` (kernels.instrument records them as the kernel they serve).
_ROUTINES = {dt: (_GEMM[dt], _GEMV[dt]) for dt in _GEMM}


def _environment_ok() -> bool:
    try:
        _threads.check_environment()
    except ValueError:
        return False
    return True


# False under an invalid BLASNET_NUM_THREADS (fixed at import): then every GEMM raises its
# ValueError instead of running at a thread count nobody chose.
_ENV_OK = _environment_ok()


def routines(dtype):
    """``(gemm, gemv)``: scipy's Fortran BLAS routines for ``dtype`` (float32 or float64), for
    kernels that call them on Fortran views directly (layernorm, losses)."""
    if not _ENV_OK:
        _threads.check_environment()
    return _ROUTINES[dtype]


def check_array(name: str, x, ndim: int | None = None, dtype=None, shape=None) -> None:
    """Raise TypeError/ValueError naming ``name`` unless ``x`` is a C-contiguous float array
    of the given ndim, dtype and shape (``None`` entries of ``shape`` match anything)."""
    if not isinstance(x, np.ndarray):
        raise TypeError(f"{name}: expected a numpy.ndarray, got {type(x).__name__}")
    if dtype is None:
        if x.dtype not in _GEMM:
            raise TypeError(f"{name}: expected dtype float32 or float64, got {x.dtype}")
    elif x.dtype != dtype:
        raise TypeError(f"{name}: expected dtype {np.dtype(dtype)}, got {x.dtype}")
    if ndim is not None and x.ndim != ndim:
        raise ValueError(f"{name}: expected a {ndim}-D array, got {x.ndim}-D with shape {x.shape}")
    if shape is not None:
        if len(shape) != x.ndim or any(s is not None and s != t for s, t in zip(shape, x.shape)):
            want = "(" + ", ".join("*" if s is None else str(s) for s in shape) + ")"
            raise ValueError(f"{name}: expected shape {want}, got {x.shape}")
    if not x.flags.c_contiguous:
        raise ValueError(f"{name}: expected a C-contiguous array (shape {x.shape}, strides {x.strides})")


def check_contiguous(name: str, x, written: bool = False) -> None:
    """Raise TypeError/ValueError naming ``name`` unless ``x`` is a C- or Fortran-contiguous
    float32/float64 ndarray (of any shape), writeable if ``written``."""
    if not isinstance(x, np.ndarray):
        raise TypeError(f"{name}: expected a numpy.ndarray, got {type(x).__name__}")
    if x.dtype not in _GEMM:
        raise TypeError(f"{name}: expected dtype float32 or float64, got {x.dtype}")
    if not (x.flags.c_contiguous or x.flags.f_contiguous):
        raise ValueError(f"{name}: expected a C- or Fortran-contiguous array, got strides "
                         f"{x.strides} for shape {x.shape}")
    if written and not x.flags.writeable:
        raise ValueError(f"{name}: expected a writeable array")


def check_like(name: str, x, ref_name: str, ref, written: bool = False) -> None:
    """Raise TypeError/ValueError naming ``name`` unless ``x`` is an ndarray with the dtype,
    shape and memory order (C or Fortran) of ``ref``, writeable if ``written``."""
    check_array_like(name, x, ref, like_name=ref_name)
    if not (x.flags.c_contiguous if ref.flags.c_contiguous else x.flags.f_contiguous):
        order = "C" if ref.flags.c_contiguous else "Fortran"
        raise ValueError(f"{name}: expected a {order}-contiguous array like {ref_name}, got "
                         f"strides {x.strides} for shape {x.shape}")
    if written and not x.flags.writeable:
        raise ValueError(f"{name}: expected a writeable array (the call writes it)")


# A GEMM with at most this many rows (or columns, or inner dimension) runs on one OpenBLAS
# thread. A 2-thread GEMM leaves the weights it read shared with, and the gradients it wrote
# owned by, the other core; the optimizer's stores to those lines then cost ~4-12 ns each,
# per weight a constant, while what the second thread saves per weight grows with the rows:
# below ~16 rows it saves less (docs/performance.md, "Small steps at 2 threads").
ONE_THREAD_DIM = 16
_BLAS_CALLS = _threads.SCIPY_OPENBLAS_CALLS


def gemm_unchecked(out, a, b, trans_a=False, trans_b=False, alpha=1.0, beta=0.0,
                   defer=False):
    """``gemm`` without argument checks or empty-dimension handling (hot path). A GEMM whose
    M, N or K is at most ``ONE_THREAD_DIM`` runs on one OpenBLAS thread (the count is set
    back after the call); the result does not depend on it. ``defer=True`` (a weight
    gradient) inside a ``kernels.overlap.session`` queues it on the lane thread instead:
    ``out`` is then written later (kernels.overlap says when it is safe to touch).

    The caller guarantees C-contiguous 2-D arrays of one dtype, compatible shapes and
    M, N, K > 0; otherwise scipy copies silently or raises."""
    if not _ENV_OK:
        _threads.check_environment()
    if _overlap.deferring():
        if defer:
            _overlap.submit(out, a, b, trans_a, trans_b, alpha, beta)
            return out
        return _overlap.gemm_now(out, a, b, trans_a, trans_b, alpha, beta)
    m, n = out.shape
    if _BLAS_CALLS is not None and min(m, n, a.shape[0] if trans_a else a.shape[1]) <= ONE_THREAD_DIM:
        get, put = _BLAS_CALLS
        threads = get()
        if threads > 1:
            put(1)
            try:
                _GEMM[out.dtype](alpha, b.T, a.T, beta, out.T, trans_b, trans_a, 1)
            finally:
                put(threads)
            return out
    _GEMM[out.dtype](alpha, b.T, a.T, beta, out.T, trans_b, trans_a, 1)
    return out


def gemm(out, a, b, trans_a=False, trans_b=False, alpha=1.0, beta=0.0):
    """``out = alpha * op(a) @ op(b) + beta * out`` in place; returns ``out`` itself.

    ``op(x)`` is ``x.T`` when the matching ``trans_*`` flag is set. All three arrays must be
    2-D, C-contiguous and of one dtype, float32 (sgemm) or float64 (dgemm). Empty
    dimensions give the mathematically right result (``K == 0``: ``out = beta * out``).
    """
    _threads.check_environment()
    check_array("out", out, ndim=2)
    check_array("a", a, ndim=2, dtype=out.dtype)
    check_array("b", b, ndim=2, dtype=out.dtype)
    m, k = (a.shape[1], a.shape[0]) if trans_a else a.shape
    kb, n = (b.shape[1], b.shape[0]) if trans_b else b.shape
    if k != kb:
        raise ValueError(
            f"a, b: inner dimensions differ: op(a) is {(m, k)} (a {a.shape}, trans_a={bool(trans_a)}), "
            f"op(b) is {(kb, n)} (b {b.shape}, trans_b={bool(trans_b)})")
    if out.shape != (m, n):
        raise ValueError(f"out: expected shape {(m, n)} for op(a) @ op(b), got {out.shape}")
    if m == 0 or n == 0:
        return out
    if k == 0:
        if beta == 0.0:
            out.fill(0.0)
        else:
            out *= beta
        return out
    if np.shares_memory(out, a) or np.shares_memory(out, b):
        raise ValueError("out: must not overlap a or b (BLAS would read what it overwrites)")
    res = _GEMM[out.dtype](alpha, b.T, a.T, beta, out.T, bool(trans_b), bool(trans_a), 1)
    if res.base is not out and not np.shares_memory(res, out):  # pragma: no cover - guard
        raise RuntimeError("gemm: BLAS wrapper did not write in place")
    return out


def gemv_colsum(out, x, beta=1.0):
    """``out = x.sum(axis=0) + beta * out`` for a C-contiguous (N, d) ``x`` via gemv with a
    ones vector (faster than ``np.sum(axis=0)``: docs/performance.md). No checks."""
    n = x.shape[0]
    if x.shape[1] == 0:  # scipy's gemv wrapper errors on an empty output
        return out
    if n == 0:
        if beta == 0.0:
            out.fill(0.0)
        return out
    # x.T is Fortran (d, N); y = x.T @ ones.
    _GEMV[x.dtype](1.0, x.T, _ones(n, x.dtype), beta, out, 0, 1, 0, 1, 0, 1)
    return out

"""LayerNorm (Ba et al. 2016) over the last axis of an (N, d) array: forward caching mean and
rstd, backward writing dx and accumulating dgamma/dbeta, as llm.c's layernorm kernels.

Rows run in blocks small enough that the chain of passes stays in L2, on per-thread scratch
(kernels.memory). No call broadcasts: NumPy's broadcasting ufuncs allocate an iterator buffer
per call and run several times slower than plain passes, so row sums are gemvs, per-row
shifts rank-1 gemm updates (K=1, beta=1; not sger, which OpenBLAS threads from a few
thousand elements on), and per-row or per-row-and-column scales
(rstd_i * gamma_j) one K=1 gemm into scratch followed by a plain multiply; the variance is
np.vecdot of the centred rows. The kernels run on the calling thread: every split over
blasnet's threads measured slower, because the BLAS wrappers hold the GIL and a NumPy-only
chain hands the GIL over between its many short calls (figures: docs/performance.md,
"LayerNorm").
"""
from __future__ import annotations

import math

import numpy as np

from .gemm import check_array, routines
from .memory import bundle, ones, scratch

__all__ = ["layernorm_forward", "layernorm_backward",
           "layernorm_forward_unchecked", "layernorm_backward_unchecked"]

_BLOCK_BYTES = 256 * 1024  # per scratch buffer: the block's passes stay in L2


def _buffers(dtype, d):
    """(rows, A, B, r1, r2, ones_d, ones_r, gemm, gemv): this thread's scratch
    (kernels.memory), kept transposed, (d, rows) in Fortran order: the layout BLAS wants;
    the constants and BLAS routines (kernels.gemm) the passes call."""
    return bundle(("layernorm", dtype, d, _BLOCK_BYTES), _make_buffers, dtype, d)


def _make_buffers(dtype, d):
    rows = max(1, _BLOCK_BYTES // (d * dtype.itemsize))
    return (rows,
            scratch("layernorm.a", (rows, d), dtype).T,  # (d, rows) scale (fwd); x - mean (bwd)
            scratch("layernorm.b", (rows, d), dtype).T,  # (d, rows) dout * (x - mean), scales
            scratch("layernorm.r1", rows, dtype),        # (rows,) per-row sums
            scratch("layernorm.r2", rows, dtype),        # (rows,) per-row sums
            ones(d, dtype)[:, None],                     # (d, 1) row sums and row shifts
            ones(rows, dtype)[None, :],                  # (1, rows) column sums, beta
            *routines(dtype))


# Both passes walk transposed views: a C-contiguous (n, d) array is a Fortran (d, n) one
# whose column block [:, i:j] is the row block i:j, Fortran-contiguous, ready for BLAS and
# for numpy's elementwise loops (same layout everywhere). Scratch is sliced only for the
# last, partial block: each view is ~100 bytes of Python object, and few stay alive.


def layernorm_forward_unchecked(out, mean, rstd, x, gamma, beta, eps=1e-5):
    """``layernorm_forward`` without argument checks (hot path): C-contiguous arrays of one
    dtype and matching shapes, d > 0. ``out`` may be ``x``."""
    n, d = x.shape
    if n == 0:
        return out
    rows, S, _, _, var, ones_d, ones_r, gemm, gemv = _buffers(x.dtype, d)
    d_eps, sqrt_d, inv_d = d * eps, math.sqrt(d), 1.0 / d
    xT, oT = x.T, out.T                         # (d, n) Fortran views
    mrow, srow = mean[None, :], rstd[None, :]   # (1, n) views
    gcol, bcol, ones_v = gamma[:, None], beta[:, None], ones_d[:, 0]
    for i in range(0, n, rows):
        j = min(i + rows, n)
        if j - i < rows:
            r = j - i
            S, var, ones_r = S[:, :r], var[:r], ones_r[:, :r]
        xb, ob, mb = xT[:, i:j], oT[:, i:j], mean[i:j]
        gemv(inv_d, xb, ones_v, 0.0, mb, 0, 1, 0, 1, 1, 1)       # mean = x @ ones / d
        np.copyto(ob, xb)
        gemm(-1.0, ones_d, mrow[:, i:j], 1.0, ob, 0, 0, 1)      # out = x - mean
        # Two-pass variance from the centred rows, d * var = t @ t row by row: np.vecdot
        # reads the block once (t * t into scratch and a gemv would take two passes).
        # rstd = sqrt(d) / sqrt(d var + d eps): three calls, not four.
        tb = out[i:j]
        np.vecdot(tb, tb, out=var)
        np.add(var, d_eps, var)
        np.sqrt(var, var)
        np.divide(sqrt_d, var, rstd[i:j])
        gemm(1.0, gcol, srow[:, i:j], 0.0, S, 0, 0, 1)          # S[j, i] = gamma[j] * rstd[i]
        np.multiply(ob, S, out=ob)
        gemm(1.0, bcol, ones_r, 1.0, ob, 0, 0, 1)               # out += beta
    return out


def layernorm_backward_unchecked(dx, dgamma, dbeta, dout, x, mean, rstd, gamma):
    """``layernorm_backward`` without argument checks (hot path). ``dx`` may be ``dout``
    (or ``x``)."""
    n, d = x.shape
    if n == 0:
        return dx
    rows, t, P, c1, c2, ones_d, ones_r, gemm, gemv = _buffers(x.dtype, d)
    inv_d = 1.0 / d
    xT, gT, dT = x.T, dout.T, dx.T              # (d, n) Fortran views
    mrow, srow = mean[None, :], rstd[None, :]   # (1, n) views
    c1row, c2row = c1[None, :], c2[None, :]     # (1, rows) views
    gcol, ones_v = gamma[:, None], ones_r[0]
    # With t = x - mean, xhat = rstd * t and g = dout * gamma:
    #   dgamma += sum_i rstd_i * (dout * t)_i      dbeta += sum_i dout_i
    #   c1 = mean_j(g) = (dout @ gamma) / d        c2' = ((dout * t) @ gamma) / d
    #   dx = rstd * (g - c1 - xhat * mean(g * xhat)) = dout * S - t * (rstd^3 c2') - rstd c1
    # with S[i, j] = rstd_i * gamma_j.
    for i in range(0, n, rows):
        j = min(i + rows, n)
        if j - i < rows:
            r = j - i
            t, P, c1, c2, ones_v = t[:, :r], P[:, :r], c1[:r], c2[:r], ones_v[:r]
            c1row, c2row = c1row[:, :r], c2row[:, :r]
        gb, db, sb = gT[:, i:j], dT[:, i:j], rstd[i:j]
        np.copyto(t, xT[:, i:j])
        gemm(-1.0, ones_d, mrow[:, i:j], 1.0, t, 0, 0, 1)      # t = x - mean
        np.multiply(gb, t, out=P)                              # P = dout * t
        # Parameter gradients and row sums read dout before dx (maybe dout) is written.
        gemv(1.0, P, sb, 1.0, dgamma, 0, 1, 0, 1, 0, 1)        # dgamma += P.T @ rstd
        gemv(1.0, gb, ones_v, 1.0, dbeta, 0, 1, 0, 1, 0, 1)    # dbeta += column sums
        gemv(inv_d, gb, gamma, 0.0, c1, 0, 1, 0, 1, 1, 1)      # c1 = dout @ gamma / d
        gemv(inv_d, P, gamma, 0.0, c2, 0, 1, 0, 1, 1, 1)       # c2' = P @ gamma / d
        c1 *= sb
        c2 *= sb
        c2 *= sb
        c2 *= sb
        gemm(1.0, gcol, srow[:, i:j], 0.0, P, 0, 0, 1)         # P = S
        np.multiply(gb, P, out=db)
        gemm(1.0, ones_d, c2row, 0.0, P, 0, 0, 1)              # P[:, i] = rstd^3 c2'
        np.multiply(t, P, out=t)
        np.subtract(db, t, out=db)
        gemm(-1.0, ones_d, c1row, 1.0, db, 0, 0, 1)            # dx -= rstd * c1
    return dx


def _check_rows(x_name, x, mean, rstd, gamma):
    check_array(x_name, x, ndim=2)
    n, d = x.shape
    dt = x.dtype
    if d == 0:
        raise ValueError(f"{x_name}: expected at least one feature in the last dimension, "
                         f"got shape {x.shape}")
    check_array("mean", mean, ndim=1, dtype=dt, shape=(n,))
    check_array("rstd", rstd, ndim=1, dtype=dt, shape=(n,))
    check_array("gamma", gamma, ndim=1, dtype=dt, shape=(d,))


def layernorm_forward(out, mean, rstd, x, gamma, beta, eps=1e-5):
    """out = (x - mean) * rstd * gamma + beta over the last axis of ``x`` (N, d).

    Writes ``mean`` (N,) and ``rstd`` = 1 / sqrt(var + eps) (N,) for the backward pass; var
    is the biased variance (divide by d), computed in two passes (mean first). Arrays are
    C-contiguous float32 or float64 of one dtype; ``gamma``/``beta`` are (d,). ``out`` may
    be ``x``. Returns ``out``."""
    _check_rows("x", x, mean, rstd, gamma)
    check_array("beta", beta, ndim=1, dtype=x.dtype, shape=(x.shape[1],))
    check_array("out", out, ndim=2, dtype=x.dtype, shape=x.shape)
    eps = float(eps)
    if not eps >= 0.0:
        raise ValueError(f"eps: expected a number >= 0, got {eps}")
    return layernorm_forward_unchecked(out, mean, rstd, x, gamma, beta, eps)


def layernorm_backward(dx, dgamma, dbeta, dout, x, mean, rstd, gamma):
    """dx = rstd * (g - mean(g) - xhat * mean(g * xhat)) with g = dout * gamma and
    xhat = (x - mean) * rstd (means over the last axis); dgamma += sum over rows of
    dout * xhat and dbeta += sum over rows of dout (accumulated, not overwritten).

    ``mean``/``rstd`` are those written by ``layernorm_forward``. ``dx`` may be the same
    array as ``dout`` (each row block reads dout before writing dx). Returns ``dx``."""
    _check_rows("x", x, mean, rstd, gamma)
    n, d = x.shape
    check_array("dout", dout, ndim=2, dtype=x.dtype, shape=(n, d))
    check_array("dx", dx, ndim=2, dtype=x.dtype, shape=(n, d))
    check_array("dgamma", dgamma, ndim=1, dtype=x.dtype, shape=(d,))
    check_array("dbeta", dbeta, ndim=1, dtype=x.dtype, shape=(d,))
    return layernorm_backward_unchecked(dx, dgamma, dbeta, dout, x, mean, rstd, gamma)

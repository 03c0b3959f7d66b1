"""LayerNorm (Ba et al. 2016) over the last axis of an (N, d) array: forward caching mean and
rstd, backward writing dx (or adding into it: a residual stream's gradient) and accumulating
dgamma/dbeta, as llm.c's layernorm kernels.

Each is compiled (kernels.jit): the forward reads a row for its mean, again for its centred
sum of squares (two-pass variance) and once more to write the output; the backward reads
each row of x and dout once, writing dx and adding the row into its block's partial sums of
dgamma and dbeta (blocks of up to 64 rows, fixed by the shape), which are then added in block
order. Row sums go through kernels.lanes (fixed lanes: the bits do not depend on the vector
width). Rows, or blocks of rows, are split over blasnet's threads, so every result is the
same whatever the thread count. Rows whose sums overflow (|x| beyond ~1e19 in float32) take a
float64 rescue path, rescaled (forward) or in xhat form (backward).
"""
from __future__ import annotations

import math

import numpy as np

from . import fastmath, lanes
from . import parallel as _par
from .gemm import check_array
from .jit import jit
from .memory import scratch

__all__ = ["layernorm_forward", "layernorm_backward",
           "layernorm_forward_unchecked", "layernorm_backward_unchecked"]

# Relative cost per element for kernels.parallel.threads_for (a copy is 1), from where two
# threads overtook one (docs/performance.md, "Split thresholds"): the row sums run one
# element per cycle, so these are compute-bound, the backward with two of them twice as much.
FWD_COST = 6
BWD_COST = 8


@jit(inline="always")
def _out_row(orow, xr, mu, rs, gamma, beta):
    for j in range(xr.shape[0]):              # out may be x: element j is read first
        orow[j] = (xr[j] - mu) * rs * gamma[j] + beta[j]


@jit(slp=True)
def _fwd_rows(out, mean, rstd, x, gamma, beta, eps, i0, i1):
    d = x.shape[1]
    dd, one = fastmath.const(d, x), fastmath.const(1, x)
    for r in range(i0, i1):
        xr = x[r]
        mu = lanes.row_sum(xr) / dd
        rs = one / math.sqrt(lanes.row_sumsq_centred(xr, mu) / dd + eps)
        mean[r] = mu
        rstd[r] = rs
        _out_row(out[r], xr, mu, rs, gamma, beta)
    return 0


@jit(slp=True)
def _fwd_rows_wide(out, mean, rstd, x, gamma, beta, eps, acc, i0, i1):
    # _fwd_rows with the row sums in 16 stored lanes (acc: their scratch, kernels.lanes)
    d = x.shape[1]
    dd, one = fastmath.const(d, x), fastmath.const(1, x)
    for r in range(i0, i1):
        xr = x[r]
        mu = lanes.sum16(xr, acc) / dd
        rs = one / math.sqrt(lanes.sumsq16_centred(xr, mu, acc) / dd + eps)
        mean[r] = mu
        rstd[r] = rs
        _out_row(out[r], xr, mu, rs, gamma, beta)
    return 0


@jit(inline="always")
def _bwd_row(pg, pb, dr, gr, xr, mu, rs, c1, c2, gamma, add):
    # dx may be dout or x: element j is read before it is written. With add, the term is
    # rounded, then added (an slp kernel does not contract): the bits of the plain backward
    # followed by ops.add.
    if add:
        for j in range(xr.shape[0]):
            g = gr[j]
            xh = (xr[j] - mu) * rs
            pg[j] += g * xh
            pb[j] += g
            dr[j] += rs * (g * gamma[j] - c1 - xh * c2)
    else:
        for j in range(xr.shape[0]):
            g = gr[j]
            xh = (xr[j] - mu) * rs
            pg[j] += g * xh
            pb[j] += g
            dr[j] = rs * (g * gamma[j] - c1 - xh * c2)


@jit(inline="always")
def _zero_block(part_g, part_b, b, fresh):
    if fresh:
        zero = fastmath.const(0, part_g)
        for j in range(part_g.shape[1]):
            part_g[b, j] = zero
            part_b[b, j] = zero


@jit(slp=True)
def _bwd_blocks(part_g, part_b, dx, dout, x, mean, rstd, gamma, add, rows, fresh, b0, b1):
    # dx = rstd (g - mean(g) - xhat mean(g xhat)), g = dout gamma, xhat = (x - mean) rstd
    # (dx += that when add); part_g[b], part_b[b] (zeroed first if fresh) += dout xhat and
    # dout over the rows of block b, in row order
    n, d = x.shape
    dd = fastmath.const(d, x)
    for b in range(b0, b1):
        _zero_block(part_g, part_b, b, fresh)
        for r in range(b * rows, min(n, (b + 1) * rows)):
            xr, gr, mu, rs = x[r], dout[r], mean[r], rstd[r]
            c1 = lanes.row_dot(gr, gamma) / dd
            c2 = lanes.row_dot_centred(gr, gamma, xr, mu) * rs / dd
            _bwd_row(part_g[b], part_b[b], dx[r], gr, xr, mu, rs, c1, c2, gamma, add)
    return 0


@jit(slp=True)
def _bwd_blocks_wide(part_g, part_b, dx, dout, x, mean, rstd, gamma, add, rows, fresh, acc,
                     b0, b1):
    # _bwd_blocks with the row sums in 16 stored lanes (acc: their scratch)
    n, d = x.shape
    dd = fastmath.const(d, x)
    for b in range(b0, b1):
        _zero_block(part_g, part_b, b, fresh)
        for r in range(b * rows, min(n, (b + 1) * rows)):
            xr, gr, mu, rs = x[r], dout[r], mean[r], rstd[r]
            c1 = lanes.dot16(gr, gamma, acc) / dd
            c2 = lanes.dot16_centred(gr, gamma, xr, mu, acc) * rs / dd
            _bwd_row(part_g[b], part_b[b], dx[r], gr, xr, mu, rs, c1, c2, gamma, add)
    return 0


@jit
def _add_blocks(dgamma, dbeta, part_g, part_b):
    # dgamma += the block sums in block order (and dbeta): the order is fixed by the shape
    for b in range(part_g.shape[0]):
        pg, pb = part_g[b], part_b[b]
        for j in range(dgamma.shape[0]):
            dgamma[j] += pg[j]
            dbeta[j] += pb[j]
    return 0


def _block_rows(n, d):
    """Rows per partial sum of dgamma/dbeta: a function of the shape alone (so the order of
    additions, and the bits, do not depend on the thread count). All n rows when the pass
    is too small ever to be split (the rows then add straight into dgamma and dbeta: no
    partial sums to add, which small steps would pay for); else 64 or fewer, so that a
    wide array of few rows still makes several blocks to split."""
    if n * d * BWD_COST < _par.SPLIT_WORK:
        return n
    return min(64, max(1, n // 8))


# Rows of at least this many features take the kernels whose row sums run in 16 stored lanes
# (kernels.lanes), shorter rows the eight-lane ones: at 768 x 128 the forward took 19
# against 30 us and the backward 31 against 42, at d 32 level, at d 8 three times longer
# (float32, 1 thread, Zen 5). The choice is the shape's alone.
WIDE_ROWS = 32


def _kernel(narrow, wide, k, x):
    """The kernel for ``x``'s row width, and per slot the extra arguments it takes: for the
    wide one a 16-element lane scratch (taken on the calling thread), for the other none."""
    if x.shape[1] < WIDE_ROWS:
        return narrow, [()] * k
    return wide, lanes.stored_lanes(k, x.dtype)


def layernorm_forward_unchecked(out, mean, rstd, x, gamma, beta, eps=1e-5):
    """``layernorm_forward`` without argument checks (hot path): C-contiguous arrays of one
    dtype and matching shapes, d > 0. ``out`` may be ``x``."""
    n, d = x.shape
    if n == 0:
        return out
    e = x.dtype.type(eps)
    k = _par.threads_for(n, d, passes=FWD_COST)
    kernel, accs = _kernel(_fwd_rows, _fwd_rows_wide, k, x)
    if k == 1:
        kernel(out, mean, rstd, x, gamma, beta, e, *accs[0], 0, n)
    else:
        _par.split(lambda i0, i1, s: kernel(out, mean, rstd, x, gamma, beta, e, *accs[s], i0,
                                            i1), n, d, k=k)
    # A row whose sum, centring or sum of squares overflowed (|x| beyond ~1e19 in float32)
    # has rstd = 0 (or NaN): the smallest rstd finds it (argmin: the cheapest reduction
    # call, and it stops at a NaN), and such rows are redone scaled.
    if not rstd[rstd.argmin()] > 0.0:
        _rescaled_rows(out, mean, rstd, x, gamma, beta, eps)
    return out


def _rescaled_rows(out, mean, rstd, x, gamma, beta, eps):
    """Redo the rows of ``layernorm_forward`` whose rstd is 0 or NaN, in float64 on the rows
    divided by their largest |x| (LayerNorm is invariant to that scale but for eps, which is
    carried as eps / scale^2), so every finite input row gets its normalised output. Rows
    holding NaN or inf are left as computed (NaN)."""
    bad = np.flatnonzero(~(rstd > 0.0))
    xb = x[bad].astype(np.float64)                     # (k, d) the rows, scaled in place
    scale = np.max(np.abs(xb), axis=1)                 # (k,) largest |x| of each row
    ok = np.isfinite(scale) & (scale > 0.0)
    bad, xb, scale = bad[ok], xb[ok], scale[ok]
    if not bad.size:
        return
    xb /= scale[:, None]
    m = xb.mean(axis=1)                                # (k,) mean of the scaled rows
    xb -= m[:, None]
    r = 1.0 / np.sqrt((xb * xb).mean(axis=1) + eps / scale / scale)  # (k,) scaled rstd
    out[bad] = xb * r[:, None] * gamma + beta
    mean[bad] = m * scale
    rstd[bad] = r / scale


def layernorm_backward_unchecked(dx, dgamma, dbeta, dout, x, mean, rstd, gamma,
                                 accumulate=False):
    """``layernorm_backward`` without argument checks (hot path). ``dx`` may be ``dout``
    (or ``x``)."""
    n, d = x.shape
    if n == 0:
        return dx
    if rstd[rstd.argmin()] < _TINY_RSTD[x.dtype]:  # a row of huge |x| (or NaN): see below
        return _backward_huge(dx, dgamma, dbeta, dout, x, mean, rstd, gamma, accumulate)
    add = bool(accumulate)
    rows = _block_rows(n, d)
    if rows == n:   # never split: the one block's sums go straight into dgamma and dbeta
        kernel, accs = _kernel(_bwd_blocks, _bwd_blocks_wide, 1, x)
        kernel(dgamma[None], dbeta[None], dx, dout, x, mean, rstd, gamma, add, n, False,
               *accs[0], 0, 1)   # [None]: a view whatever the strides (a reshape could copy)
        return dx
    nb = -(-n // rows)
    part_g = scratch("layernorm.part_g", (nb, d), x.dtype)    # (nb, d) block sums
    part_b = scratch("layernorm.part_b", (nb, d), x.dtype)
    k = min(_par.threads_for(n, d, passes=BWD_COST), nb)
    kernel, accs = _kernel(_bwd_blocks, _bwd_blocks_wide, k, x)
    if k == 1:
        kernel(part_g, part_b, dx, dout, x, mean, rstd, gamma, add, rows, True, *accs[0], 0, nb)
    else:
        _par.split(lambda b0, b1, s: kernel(part_g, part_b, dx, dout, x, mean, rstd, gamma,
                                            add, rows, True, *accs[s], b0, b1),
                   nb, rows * d, k=k)
    _add_blocks(dgamma, dbeta, part_g, part_b)
    return dx


# Below this rstd (rows whose std exceeds ~1e18 in float32) the fast backward's rstd^3 c2
# underflows and dout * (x - mean) may overflow.
_TINY_RSTD = {np.dtype(np.float32): 2.0 ** -60, np.dtype(np.float64): 2.0 ** -500}


def _backward_huge(dx, dgamma, dbeta, dout, x, mean, rstd, gamma, accumulate=False):
    """``layernorm_backward`` for rows of any finite scale: float64, and xhat = x rstd -
    mean rstd (each term of order |x| rstd, never the overflowing x - mean) so no
    intermediate leaves the dtype's range; dx = rstd (g - mean(g) - xhat mean(g xhat)) (added
    into dx in its dtype after rounding when ``accumulate``, as the fast path)."""
    r = rstd.astype(np.float64)[:, None]                             # (n, 1)
    xhat = x.astype(np.float64) * r                                  # (n, d)
    xhat -= mean.astype(np.float64)[:, None] * r
    g = dout.astype(np.float64) * gamma                              # (n, d)
    dgamma += (dout.astype(np.float64) * xhat).sum(axis=0).astype(dgamma.dtype)
    dbeta += dout.astype(np.float64).sum(axis=0).astype(dbeta.dtype)
    g -= g.mean(axis=1, keepdims=True) + xhat * (g * xhat).mean(axis=1, keepdims=True)
    g *= r
    if accumulate:
        dx += g.astype(dx.dtype)
    else:
        dx[...] = g
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
    is the biased variance (divide by d), computed in two passes (mean first). Any finite
    row is normalised right: rows whose sums overflow the dtype (|x| beyond ~1e19 in
    float32) are redone divided by their largest |x| (NumPy may still warn of the overflow
    it met on the way). Arrays are
    C-contiguous float32 or float64 of one dtype; ``gamma``/``beta`` are (d,). ``out`` may
    be ``x``. Returns ``out``."""
    _check_rows("x", x, mean, rstd, gamma)
    check_array("beta", beta, ndim=1, dtype=x.dtype, shape=(x.shape[1],))
    check_array("out", out, ndim=2, dtype=x.dtype, shape=x.shape)
    eps = float(eps)
    if not eps >= 0.0:
        raise ValueError(f"eps: expected a number >= 0, got {eps}")
    return layernorm_forward_unchecked(out, mean, rstd, x, gamma, beta, eps)


def layernorm_backward(dx, dgamma, dbeta, dout, x, mean, rstd, gamma, accumulate=False):
    """dx = rstd * (g - mean(g) - xhat * mean(g * xhat)) with g = dout * gamma and
    xhat = (x - mean) * rstd (means over the last axis); dgamma += sum over rows of
    dout * xhat and dbeta += sum over rows of dout (accumulated, not overwritten).

    ``accumulate=True`` adds into dx instead, in the same pass (llm.c's ``dinp +=``: a
    residual stream's gradient held in dx), with the bits of the plain call followed by
    ``ops.add``. ``mean``/``rstd`` are those written by ``layernorm_forward``. ``dx`` may be
    the same array as ``dout`` (each row block reads dout before writing dx). Returns ``dx``."""
    _check_rows("x", x, mean, rstd, gamma)
    n, d = x.shape
    check_array("dout", dout, ndim=2, dtype=x.dtype, shape=(n, d))
    check_array("dx", dx, ndim=2, dtype=x.dtype, shape=(n, d))
    check_array("dgamma", dgamma, ndim=1, dtype=x.dtype, shape=(d,))
    check_array("dbeta", dbeta, ndim=1, dtype=x.dtype, shape=(d,))
    if not isinstance(accumulate, (bool, np.bool_)):
        raise TypeError(f"accumulate: expected a bool, got {type(accumulate).__name__}")
    return layernorm_backward_unchecked(dx, dgamma, dbeta, dout, x, mean, rstd, gamma,
                                        accumulate)

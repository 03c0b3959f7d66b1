"""Compiled scaled dot-product attention (Vaswani et al. 2017) over all (batch, head) pairs in
one call each way, causal (GPT, Radford et al. 2018) or full.

The per-head products of multi-head attention at GPT-sized heads (d_head 32-64, T 64-256) are
tiny: as BLAS GEMMs they cost more in call overhead than in arithmetic, and a causal mask
wastes half of each. Here one kernel walks every (batch, head) pair, reads q, k and v straight
from the (B, T, 3 d_model) output of the fused QKV projection (the head split folded in),
computes only the j <= i half of a causal score matrix, and writes O straight into the
(B, T, d_model) rows the output projection reads (the head merge folded in). Backward writes
d[q | k | v] in the (B, T, 3 d_model) rows of the QKV weight-gradient GEMM. The probabilities
P (B h, T, T) are kept for backward, as the BLAS path does; only their causal half is read.

Each pair is computed by one thread in a fixed loop order (pairs are split over the engine's
pool, kernels.parallel), so results are bit-identical at any thread count. The innermost
loops run over contiguous memory without a reduction (k and v transposed per pair into
scratch), which LLVM vectorises; the softmax's row reductions use kernels.lanes.
"""
from __future__ import annotations

import numpy as np

from . import fastmath, lanes
from . import parallel as _par
from .gemm import check_array
from .jit import jit
from .memory import scratch

__all__ = ["sdpa_forward", "sdpa_backward", "sdpa_forward_unchecked",
           "sdpa_backward_unchecked"]


@jit(inline="always")
def _transpose_head(out, x, b, col, dh, nt):
    # out[c, j] = x[b, j, col + c]: a head's (T, dh) column block as a contiguous (dh, T) copy
    for j in range(nt):
        xr = x[b, j]
        for c in range(dh):
            out[c, j] = xr[col + c]


# Rows per block of the backward's dk, dv sweep: eight rows of dS share each dk_j, dv_j update.
ROWS = 8
# Score columns are computed in multiples of this (the vector width of float32 on AVX-512):
# a causal row's j < i + 1 is rarely a multiple of it, and LLVM's remainder loop is scalar.
LANES = 16

# Every vectorised loop below writes one array and reads at most eight others: LLVM proves
# independence by a runtime check per written/read pair, and gives up (scalar code) beyond
# eight. So each loop has one output, and eight terms are summed per store (in a fixed
# order) to share its load and store.


@jit(inline="always")
def _dot_row(sr, a, kt, dh, n):
    # sr[j] = sum_c a[c] kt[c, j] for j < n: c outer eight at a time, the j loop a stream
    zero = fastmath.const(0, sr)
    for j in range(n):
        sr[j] = zero
    m = dh - dh % 8
    for c in range(0, m, 8):
        a0, a1, a2, a3 = a[c], a[c + 1], a[c + 2], a[c + 3]
        a4, a5, a6, a7 = a[c + 4], a[c + 5], a[c + 6], a[c + 7]
        k0, k1, k2, k3 = kt[c], kt[c + 1], kt[c + 2], kt[c + 3]
        k4, k5, k6, k7 = kt[c + 4], kt[c + 5], kt[c + 6], kt[c + 7]
        for j in range(n):
            sr[j] += (((a0 * k0[j] + a1 * k1[j]) + (a2 * k2[j] + a3 * k3[j]))
                      + ((a4 * k4[j] + a5 * k5[j]) + (a6 * k6[j] + a7 * k7[j])))
    for c in range(m, dh):
        ac, kc = a[c], kt[c]
        for j in range(n):
            sr[j] += ac * kc[j]


@jit(inline="always")
def _mix_row(out, w, x, col, dh, n):
    # out[c] = sum_{j < n} w[j] x[j, col + c]: eight j at a time into the one output row
    zero = fastmath.const(0, out)
    for c in range(dh):
        out[c] = zero
    m = n - n % 8
    for j in range(0, m, 8):
        w0, w1, w2, w3 = w[j], w[j + 1], w[j + 2], w[j + 3]
        w4, w5, w6, w7 = w[j + 4], w[j + 5], w[j + 6], w[j + 7]
        x0, x1 = x[j, col:col + dh], x[j + 1, col:col + dh]
        x2, x3 = x[j + 2, col:col + dh], x[j + 3, col:col + dh]
        x4, x5 = x[j + 4, col:col + dh], x[j + 5, col:col + dh]
        x6, x7 = x[j + 6, col:col + dh], x[j + 7, col:col + dh]
        for c in range(dh):
            out[c] += (((w0 * x0[c] + w1 * x1[c]) + (w2 * x2[c] + w3 * x3[c]))
                       + ((w4 * x4[c] + w5 * x5[c]) + (w6 * x6[c] + w7 * x7[c])))
    for j in range(m, n):
        wj, xr = w[j], x[j, col:col + dh]
        for c in range(dh):
            out[c] += wj * xr[c]


@jit(inline="always")
def _softmax_row(sr, n, sc):
    # sr[:n] = softmax(sr[:n] * sc) in place (sr[n:] is not read)
    for j in range(n):
        sr[j] *= sc
    m = lanes.row_max(sr[:n])
    for j in range(n):                    # s - max: exp stays <= 1
        sr[j] = fastmath.exp(sr[j] - m)
    inv = fastmath.const(1, sr) / lanes.row_sum(sr[:n])
    for j in range(n):
        sr[j] *= inv


@jit(inline="always")
def _padded(n, nt):
    # n rounded up to whole LANES, at most nt: the score columns a row computes
    return min(nt, (n + LANES - 1) // LANES * LANES)


@jit
def _sdpa_fwd(out, p, kt, qkv, n_heads, scale, causal, i0, i1):
    # out (B, T, d) rows; p (B h, T, T); kt (dh, T) scratch; qkv (B, T, 3d); pairs i0..i1.
    # Head slices are taken before the element loops: an index qo + c would keep numba's
    # negative-index fix-up in the loop, which stops LLVM's vectoriser.
    nt, d = qkv.shape[1], out.shape[2]
    dh = d // n_heads
    sc = fastmath.const(scale, p)
    for pair in range(i0, i1):
        b, h = pair // n_heads, pair % n_heads
        qo, ko, vo = h * dh, d + h * dh, 2 * d + h * dh
        x, pp = qkv[b], p[pair]
        _transpose_head(kt, qkv, b, ko, dh, nt)
        for i in range(nt):
            n = i + 1 if causal else nt
            _dot_row(pp[i], x[i, qo:qo + dh], kt, dh, _padded(n, nt))   # S row (padded)
            _softmax_row(pp[i], n, sc)
            _mix_row(out[b, i, qo:qo + dh], pp[i], x, vo, dh, n)       # O row = P_i v
    return 0


@jit(inline="always")
def _kv_grads(dx, ds, p, x, g, i0, r, offs, dh, jfull, causal, nt):
    # dk_j += sum_i dS_ij q_i and dv_j += sum_i P_ij dO_i over the rows i = i0 + y, y < r
    # (x the (T, 3d) qkv rows, g the (T, d) dO rows, dx the (T, 3d) gradient rows):
    # j < jfull for eight rows in one sweep, the rest (the causal diagonal block, or the
    # rows of a short block) row by row
    qo, ko, vo = offs
    j0 = 0
    if r == 8:
        j0 = jfull
        q0, q1 = x[i0, qo:qo + dh], x[i0 + 1, qo:qo + dh]
        q2, q3 = x[i0 + 2, qo:qo + dh], x[i0 + 3, qo:qo + dh]
        q4, q5 = x[i0 + 4, qo:qo + dh], x[i0 + 5, qo:qo + dh]
        q6, q7 = x[i0 + 6, qo:qo + dh], x[i0 + 7, qo:qo + dh]
        g0, g1 = g[i0, qo:qo + dh], g[i0 + 1, qo:qo + dh]
        g2, g3 = g[i0 + 2, qo:qo + dh], g[i0 + 3, qo:qo + dh]
        g4, g5 = g[i0 + 4, qo:qo + dh], g[i0 + 5, qo:qo + dh]
        g6, g7 = g[i0 + 6, qo:qo + dh], g[i0 + 7, qo:qo + dh]
        for j in range(jfull):
            s0, s1, s2, s3 = ds[0, j], ds[1, j], ds[2, j], ds[3, j]
            s4, s5, s6, s7 = ds[4, j], ds[5, j], ds[6, j], ds[7, j]
            dk = dx[j, ko:ko + dh]
            for c in range(dh):
                dk[c] += (((s0 * q0[c] + s1 * q1[c]) + (s2 * q2[c] + s3 * q3[c]))
                          + ((s4 * q4[c] + s5 * q5[c]) + (s6 * q6[c] + s7 * q7[c])))
            a0, a1, a2, a3 = p[i0, j], p[i0 + 1, j], p[i0 + 2, j], p[i0 + 3, j]
            a4, a5, a6, a7 = p[i0 + 4, j], p[i0 + 5, j], p[i0 + 6, j], p[i0 + 7, j]
            dv = dx[j, vo:vo + dh]
            for c in range(dh):
                dv[c] += (((a0 * g0[c] + a1 * g1[c]) + (a2 * g2[c] + a3 * g3[c]))
                          + ((a4 * g4[c] + a5 * g5[c]) + (a6 * g6[c] + a7 * g7[c])))
    for y in range(r):
        i = i0 + y
        qr, gr = x[i, qo:qo + dh], g[i, qo:qo + dh]
        for j in range(j0, i + 1 if causal else nt):
            sj, pj = ds[y, j], p[i, j]
            dk = dx[j, ko:ko + dh]
            for c in range(dh):
                dk[c] += sj * qr[c]
            dv = dx[j, vo:vo + dh]
            for c in range(dh):
                dv[c] += pj * gr[c]


@jit
def _sdpa_bwd(dqkv, vt, ds, do, p, qkv, n_heads, scale, causal, i0, i1):
    # dqkv (B, T, 3d) rows; vt (dh, T), ds (ROWS, T) scratch; do (B, T, d); p (B h, T, T)
    nt, d = qkv.shape[1], do.shape[2]
    dh = d // n_heads
    sc = fastmath.const(scale, p)
    zero = fastmath.const(0, p)
    for pair in range(i0, i1):
        b, h = pair // n_heads, pair % n_heads
        qo, ko, vo = h * dh, d + h * dh, 2 * d + h * dh
        x, g, pp, dx = qkv[b], do[b], p[pair], dqkv[b]
        _transpose_head(vt, qkv, b, vo, dh, nt)
        for j in range(nt):                   # dk, dv accumulate over the rows i >= j
            dk, dv = dx[j, ko:ko + dh], dx[j, vo:vo + dh]
            for c in range(dh):
                dk[c] = zero
                dv[c] = zero
        for r0 in range(0, nt, ROWS):
            r = min(ROWS, nt - r0)
            for y in range(r):
                i = r0 + y
                n = i + 1 if causal else nt
                dsr, pr = ds[y], pp[i]
                _dot_row(dsr, g[i, qo:qo + dh], vt, dh, _padded(n, nt))  # dP_i = dO_i v^T
                rs = lanes.row_dot(dsr[:n], pr[:n])             # sum_j dP_ij P_ij
                for j in range(n):                              # dS = P (dP - rs) * scale
                    dsr[j] = pr[j] * (dsr[j] - rs) * sc
                _mix_row(dx[i, qo:qo + dh], dsr, x, ko, dh, n)  # dq_i = sum_j dS_ij k_j
            _kv_grads(dx, ds, pp, x, g, r0, r, (qo, ko, vo), dh, r0 + 1 if causal else nt,
                      causal, nt)
    return 0


# Relative cost per score element for kernels.parallel.threads_for (a streaming copy is 1):
# each (i, j) of a pair costs d_head multiply-adds forward and three times that backward.
FWD_COST = 2
BWD_COST = 6


def _threads(n_pairs, t, dh, causal, cost):
    """Threads for ``n_pairs`` (batch, head) pairs of ``t`` positions (kernels.parallel)."""
    per_pair = (t * (t + 1) // 2 if causal else t * t) * dh
    return _par.threads_for(n_pairs, per_pair, passes=cost), per_pair


def sdpa_forward_unchecked(out, p, qkv, n_heads, scale, causal):
    """``out[b, i, h*dh:(h+1)*dh] = softmax(q k^T * scale (+ causal mask))[i] @ v`` for every
    batch b and head h, with q, k, v the head's column blocks of ``qkv`` (B, T, 3 d); ``p``
    (B*h, T, T) receives the probabilities (only j <= i defined when causal). C-contiguous arrays of
    one float dtype; no checks. Returns ``out``."""
    nb, nt, d = out.shape
    if nb == 0 or nt == 0:
        return out
    dh, n_pairs = d // n_heads, nb * n_heads
    k, per_pair = _threads(n_pairs, nt, dh, causal, FWD_COST)
    kts = [scratch(("sdpa.kt", s), (dh, nt), qkv.dtype) for s in range(k)]  # (dh, T) per slot
    if k == 1:
        _sdpa_fwd(out, p, kts[0], qkv, n_heads, scale, causal, 0, n_pairs)
    else:
        _par.split(lambda i0, i1, s: _sdpa_fwd(out, p, kts[s], qkv, n_heads, scale, causal,
                                               i0, i1), n_pairs, per_pair, k=k)
    return out


def sdpa_backward_unchecked(dqkv, do, p, qkv, n_heads, scale, causal):
    """The gradient of ``sdpa_forward`` into ``dqkv`` (B, T, 3 d) (overwritten), from ``do``
    (B, T, d) = dL/d out, the forward's ``p`` and ``qkv``: per (batch, head)
    dS = P (dP - rowsum(dP P)) with dP = dO v^T, dq = dS k scale, dk = dS^T q scale,
    dv = P^T dO. ``dqkv`` must not overlap the inputs; no checks. Returns ``dqkv``."""
    nb, nt, d = do.shape
    if nb == 0 or nt == 0:
        return dqkv
    dh, n_pairs = d // n_heads, nb * n_heads
    k, per_pair = _threads(n_pairs, nt, dh, causal, BWD_COST)
    vts = [scratch(("sdpa.vt", s), (dh, nt), qkv.dtype) for s in range(k)]  # (dh, T) per slot
    dss = [scratch(("sdpa.ds", s), (ROWS, nt), qkv.dtype) for s in range(k)]  # per slot
    if k == 1:
        _sdpa_bwd(dqkv, vts[0], dss[0], do, p, qkv, n_heads, scale, causal, 0, n_pairs)
    else:
        _par.split(lambda i0, i1, s: _sdpa_bwd(dqkv, vts[s], dss[s], do, p, qkv, n_heads,
                                               scale, causal, i0, i1), n_pairs, per_pair, k=k)
    return dqkv


# ----------------------------------------------------------------------------- checked API
def _check(rows_name, rows, p, qkv, n_heads):
    """Shapes, dtypes and layout shared by the forward and the backward."""
    check_array("qkv", qkv, ndim=3)
    check_array(rows_name, rows, ndim=3, dtype=qkv.dtype)
    b, t, d3 = qkv.shape
    if not isinstance(n_heads, (int, np.integer)) or isinstance(n_heads, bool) or n_heads < 1:
        raise ValueError(f"n_heads: expected a positive int, got {n_heads!r}")
    if d3 % (3 * n_heads):
        raise ValueError(f"qkv: expected a last axis 3 * d_model with d_model a multiple of "
                         f"n_heads = {n_heads}, got shape {qkv.shape}")
    if rows.shape != (b, t, d3 // 3):
        raise ValueError(f"{rows_name}: expected shape {(b, t, d3 // 3)} for qkv of shape "
                         f"{qkv.shape}, got {rows.shape}")
    check_array("p", p, dtype=qkv.dtype, shape=(b * n_heads, t, t))


def sdpa_forward(out, p, qkv, n_heads, scale, causal=True):
    """Multi-head scaled dot-product attention from the fused projection ``qkv`` (B, T,
    3 d_model), q, k, v each d_model columns and head h their columns h*dh:(h+1)*dh: per
    (batch, head) ``P = softmax(q k^T * scale + M)`` into ``p`` (B*n_heads, T, T) (M = -inf
    above the diagonal when ``causal``; that half of p is left undefined and never read) and
    ``O = P v`` into
    the head's columns of ``out`` (B, T, d_model). C-contiguous arrays of one float dtype;
    ``out`` and ``p`` must not overlap each other or ``qkv``. Returns ``out``."""
    _check("out", out, p, qkv, n_heads)
    for name, a in (("out", out), ("p", p)):
        if np.may_share_memory(a, qkv):
            raise ValueError(f"{name}: must not overlap qkv")
    if np.may_share_memory(out, p):
        raise ValueError("out: must not overlap p")
    return sdpa_forward_unchecked(out, p, qkv, int(n_heads), float(scale), bool(causal))


def sdpa_backward(dqkv, do, p, qkv, n_heads, scale, causal=True):
    """The gradient of ``sdpa_forward``: ``dqkv`` (B, T, 3 d_model), overwritten with
    d[q | k | v] in qkv's layout, from ``do`` (B, T, d_model) = dL/d out and the forward's
    ``p`` and ``qkv``. ``dqkv`` must not overlap the inputs. Returns ``dqkv``."""
    _check("do", do, p, qkv, n_heads)
    check_array("dqkv", dqkv, dtype=qkv.dtype, shape=qkv.shape)
    for name, a in (("do", do), ("p", p), ("qkv", qkv)):
        if np.may_share_memory(dqkv, a):
            raise ValueError(f"dqkv: must not overlap {name}")
    return sdpa_backward_unchecked(dqkv, do, p, qkv, int(n_heads), float(scale), bool(causal))

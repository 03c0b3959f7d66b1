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


# Rows per block: four rows of scores share each load of k (v) and of the output rows.
ROWS = 4
# Score columns are computed in multiples of this (the vector width of float32 on AVX-512):
# a causal row's j < i + 1 is rarely a multiple of it, and LLVM's remainder loop is scalar.
LANES = 16


@jit(inline="always")
def _dot_rows(s, s0, a, a0, col, r, kt, dh, n):
    # s[s0 + y, j] = sum_c a[a0 + y, col + c] kt[c, j] for y < r, j < n (c outer: the j loop
    # streams contiguous kt and s rows; four rows share each kt load)
    zero = fastmath.const(0, s)
    for y in range(r):
        sr = s[s0 + y]
        for j in range(n):
            sr[j] = zero
    if r == 4:
        t0, t1, t2, t3 = s[s0], s[s0 + 1], s[s0 + 2], s[s0 + 3]
        for c in range(dh):
            q0, q1 = a[a0, col + c], a[a0 + 1, col + c]
            q2, q3 = a[a0 + 2, col + c], a[a0 + 3, col + c]
            kc = kt[c]
            for j in range(n):
                kj = kc[j]
                t0[j] += q0 * kj
                t1[j] += q1 * kj
                t2[j] += q2 * kj
                t3[j] += q3 * kj
    else:
        for y in range(r):
            sr = s[s0 + y]
            for c in range(dh):
                qc = a[a0 + y, col + c]
                kc = kt[c]
                for j in range(n):
                    sr[j] += qc * kc[j]


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
def _pv_rows(o, p, i0, r, x, qo, vo, dh, jfull, causal, nt):
    # o[i, qo:qo + dh] = sum_j p[i, j] v_j (v_j = x[j, vo:vo + dh]) for rows i = i0 + y, y < r:
    # j < jfull for all rows in one sweep (four rows share each v_j load), the causal rest
    # row by row. Head slices are taken first: an index qo + c would keep numba's
    # negative-index fix-up in the loop, which stops LLVM's vectoriser.
    zero = fastmath.const(0, o)
    for y in range(r):
        orow = o[i0 + y, qo:qo + dh]
        for c in range(dh):
            orow[c] = zero
    j0 = 0
    if r == 4:
        j0 = jfull
        o0, o1 = o[i0, qo:qo + dh], o[i0 + 1, qo:qo + dh]
        o2, o3 = o[i0 + 2, qo:qo + dh], o[i0 + 3, qo:qo + dh]
        p0, p1, p2, p3 = p[i0], p[i0 + 1], p[i0 + 2], p[i0 + 3]
        for j in range(jfull):
            vr = x[j, vo:vo + dh]
            a0, a1, a2, a3 = p0[j], p1[j], p2[j], p3[j]
            for c in range(dh):
                vc = vr[c]
                o0[c] += a0 * vc
                o1[c] += a1 * vc
                o2[c] += a2 * vc
                o3[c] += a3 * vc
    for y in range(r):
        orow, prow = o[i0 + y, qo:qo + dh], p[i0 + y]
        n = i0 + y + 1 if causal else nt
        for j in range(j0, n):
            pj = prow[j]
            vr = x[j, vo:vo + dh]
            for c in range(dh):
                orow[c] += pj * vr[c]


@jit
def _sdpa_fwd(out, p, kt, qkv, n_heads, scale, causal, i0, i1):
    # out (B, T, d) rows; p (B h, T, T); kt (dh, T) scratch; qkv (B, T, 3d); pairs i0..i1
    nt, d = qkv.shape[1], out.shape[2]
    dh = d // n_heads
    sc = fastmath.const(scale, p)
    for pair in range(i0, i1):
        b, h = pair // n_heads, pair % n_heads
        qo, ko, vo = h * dh, d + h * dh, 2 * d + h * dh
        x, pp, o = qkv[b], p[pair], out[b]
        _transpose_head(kt, qkv, b, ko, dh, nt)
        for r0 in range(0, nt, ROWS):
            r = min(ROWS, nt - r0)
            need = r0 + r if causal else nt              # score columns the block reads
            _dot_rows(pp, r0, x, r0, qo, r, kt, dh, min(nt, -(-need // LANES) * LANES))
            for y in range(r):
                _softmax_row(pp[r0 + y], r0 + y + 1 if causal else nt, sc)
            _pv_rows(o, pp, r0, r, x, qo, vo, dh, r0 + 1 if causal else nt, causal, nt)
    return 0


@jit(inline="always")
def _grads_rows(dx, ds, p, x, g, i0, r, h, dh, jfull, causal, nt):
    # for rows i = i0 + y, y < r, and their j: dq_i = sum_j dS_ij k_j, dk_j += dS_ij q_i,
    # dv_j += P_ij dO_i (g the (T, d) dO rows, x the (T, 3d) qkv rows, dx its gradient); j <
    # jfull for all rows in one sweep, the causal rest row by row
    d = g.shape[1]
    qo, ko, vo = h * dh, d + h * dh, 2 * d + h * dh
    zero = fastmath.const(0, ds)
    for y in range(r):
        dq = dx[i0 + y, qo:qo + dh]
        for c in range(dh):
            dq[c] = zero
    j0 = 0
    if r == 4:
        j0 = jfull
        q0, q1 = x[i0, qo:qo + dh], x[i0 + 1, qo:qo + dh]
        q2, q3 = x[i0 + 2, qo:qo + dh], x[i0 + 3, qo:qo + dh]
        g0, g1 = g[i0, qo:qo + dh], g[i0 + 1, qo:qo + dh]
        g2, g3 = g[i0 + 2, qo:qo + dh], g[i0 + 3, qo:qo + dh]
        e0, e1 = dx[i0, qo:qo + dh], dx[i0 + 1, qo:qo + dh]
        e2, e3 = dx[i0 + 2, qo:qo + dh], dx[i0 + 3, qo:qo + dh]
        for j in range(jfull):
            kr, dk, dv = x[j, ko:ko + dh], dx[j, ko:ko + dh], dx[j, vo:vo + dh]
            s0, s1, s2, s3 = ds[0, j], ds[1, j], ds[2, j], ds[3, j]
            a0, a1, a2, a3 = p[i0, j], p[i0 + 1, j], p[i0 + 2, j], p[i0 + 3, j]
            for c in range(dh):
                kc = kr[c]
                e0[c] += s0 * kc
                e1[c] += s1 * kc
                e2[c] += s2 * kc
                e3[c] += s3 * kc
                dk[c] += (s0 * q0[c] + s1 * q1[c]) + (s2 * q2[c] + s3 * q3[c])
                dv[c] += (a0 * g0[c] + a1 * g1[c]) + (a2 * g2[c] + a3 * g3[c])
    for y in range(r):
        i = i0 + y
        n = i + 1 if causal else nt
        qr, gr, dq = x[i, qo:qo + dh], g[i, qo:qo + dh], dx[i, qo:qo + dh]
        for j in range(j0, n):
            sj, pj = ds[y, j], p[i, j]
            kr, dk, dv = x[j, ko:ko + dh], dx[j, ko:ko + dh], dx[j, vo:vo + dh]
            for c in range(dh):
                dq[c] += sj * kr[c]
                dk[c] += sj * qr[c]
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
            need = r0 + r if causal else nt
            _dot_rows(ds, 0, g, r0, qo, r, vt, dh, min(nt, -(-need // LANES) * LANES))  # dP
            for y in range(r):
                n = r0 + y + 1 if causal else nt
                dsr, pr = ds[y], pp[r0 + y]
                rs = lanes.row_dot(dsr[:n], pr[:n])     # sum_j dP_ij P_ij
                for j in range(n):                      # dS = P (dP - rs), times the scale
                    dsr[j] = pr[j] * (dsr[j] - rs) * sc
            _grads_rows(dx, ds, pp, x, g, r0, r, h, dh, r0 + 1 if causal else nt, causal, nt)
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

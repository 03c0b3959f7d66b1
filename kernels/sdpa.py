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
A causal block of four rows sums its P v and dS k rows up to its last row's keys, the
shorter rows over zero weights (tiles.mix4): a row's output then takes 0 * v of up to three
later keys, which leaves it as it is unless that v is inf or NaN (then it is NaN, as the
later rows' outputs are).

Each pair is computed by one thread in a fixed loop order, so results are bit-identical at
any thread count: the engine's pool threads (kernels.parallel.slots) claim chunks of pairs
(kernels.atomic), so the calling thread starts at once and a pool thread that wakes late
takes what is left instead of holding up the call. The products are
GEMM-style register tiles (kernels.tiles): four rows of sixteen lanes accumulate over the
inner index in registers, packed into vectors by LLVM's SLP vectoriser (the kernels compile
with ``jit(slp=True)``, so without FMA contraction); per pair the head's k (transposed, v
backward) is first copied into per-thread scratch padded to whole tiles, and so are its v
rows (and backward dO, q, k) when d_head is not whole tiles or T is long (COPY_P_FROM; else
the tiles read them where they are), so every tile reads contiguous, in-bounds memory. The
softmax's row reductions use kernels.lanes.

Inside a training step these arrays come from DRAM (the step's buffers outgrow the L3), and
a head's columns are two cache lines in every row of a 3 d_model-wide row: read and written
that way, per head, each line waits on memory. So each pass first copies a sequence's rows
(qkv, and dO backward) into per-thread scratch in one sequential sweep, which the hardware
prefetcher follows, works on the copy, and writes the sequence's output rows (O, d[qkv]) back
in one sweep at the end; a slot that holds only some of a sequence's heads writes back their
columns alone.
"""
from __future__ import annotations

import numpy as np

from . import atomic, fastmath, lanes, tiles
from . import parallel as _par
from .gemm import check_array
from .jit import jit
from .memory import scratch

__all__ = ["sdpa_forward", "sdpa_backward", "sdpa_forward_unchecked",
           "sdpa_backward_unchecked"]


@jit(inline="always")
def _head_cols(out, x, col, dh, nt):
    # out[c, j] = x[j, col + c]: a head's (T, dh) column block as a (dh, T) copy, zero past T.
    # Eight rows at a time, each read along its columns and written as 8 adjacent floats of
    # every out row: a whole column of out per c would touch dh lines T * 4 bytes apart,
    # which share few L1 sets at T = 256 (conflict misses); a loop over a variable count of
    # rows per c ran 10% slower at T = 64 (Zen 5)
    zero = fastmath.const(0, out)
    e = col + dh
    for j0 in range(0, nt - 7, 8):
        xa, xb, xc, xd = x[j0, col:e], x[j0 + 1, col:e], x[j0 + 2, col:e], x[j0 + 3, col:e]
        xe, xf, xg, xh = x[j0 + 4, col:e], x[j0 + 5, col:e], x[j0 + 6, col:e], x[j0 + 7, col:e]
        for c in range(dh):
            r = out[c, j0:j0 + 8]
            r[0], r[1], r[2], r[3] = xa[c], xb[c], xc[c], xd[c]
            r[4], r[5], r[6], r[7] = xe[c], xf[c], xg[c], xh[c]
    for j in range(nt - nt % 8, nt):
        for c in range(dh):
            out[c, j] = x[j, col + c]
    for c in range(dh):
        r = out[c]
        for j in range(nt, out.shape[1]):
            r[j] = zero


@jit(inline="always")
def _head_rows(out, x, col, dh, nt):
    # out[j, c] = x[j, col + c]: a head's (T, dh) column block as rows, zero past dh
    zero = fastmath.const(0, out)
    for j in range(nt):
        r, xr = out[j], x[j, col:col + dh]
        for c in range(dh):
            r[c] = xr[c]
        for c in range(dh, out.shape[1]):
            r[c] = zero


@jit(inline="always")
def _put(out, src, n):
    # out[:n] = src[:n]
    for c in range(n):
        out[c] = src[c]


@jit(inline="always")
def _stage(x, src, bias, biased):
    # x = src (a sequence's (T, 3 d) qkv rows), plus bias on every row when biased: the
    # projection's bias added here, not in a pass of its own before a beta = 1 GEMM
    if biased:
        for i in range(x.shape[0]):
            xr, sr = x[i], src[i]
            for c in range(x.shape[1]):
                xr[c] = sr[c] + bias[c]
    else:
        _put(x.reshape(-1), src.reshape(-1), x.size)


@jit(inline="always")
def _rows_out(out, src, c0, c1, d, nt):
    # columns o + c0..o + c1 of a sequence's rows for each of out's blocks of d columns (O:
    # one, d[q | k | v]: three), written in one sweep
    for i in range(nt):
        for o in range(0, out.shape[1], d):
            _put(out[i, o + c0:o + c1], src[i, o + c0:o + c1], c1 - c0)


@jit(inline="always")
def _zeros_past(r, n):
    # r[n:n + 3] = 0 (within r): tiles.mix4 sums a causal block's rows up to its last row's
    # count, up to three keys past the first's
    zero = fastmath.const(0, r)
    for j in range(n, min(n + 3, r.shape[0])):
        r[j] = zero


@jit(inline="always")
def _softmax_row(pr, sr, n, sc):
    # pr[:n] = softmax(sr[:n] * sc) and zeros to n + 3, sr[:n] overwritten with the exp
    # terms; three passes
    # (max(s) sc is max(s sc): scaling by sc > 0 is monotone)
    sub = lanes.row_max(sr[:n]) * sc      # s - max: exp stays <= 1
    # exp over whole tiles (the scores past n, which tiles.dot4 also wrote, are dropped): a loop of n
    # ran a short row's exps in the vector loop's scalar remainder (forward -5% at T 64)
    for j in range(tiles.round_up(n)):
        sr[j] = fastmath.exp(sr[j] * sc - sub)
    inv = fastmath.const(1, sr) / lanes.row_sum(sr[:n])
    for j in range(n):
        pr[j] = sr[j] * inv
    _zeros_past(pr, n)


@jit(inline="always")
def _dscore_row(dsr, pr, n, sc):
    # dS = P (dP - sum_j dP_j P_j) * scale over j < n, in place of dP, and zeros to n + 3
    rs = lanes.row_dot(dsr[:n], pr[:n])
    for j in range(n):
        dsr[j] = pr[j] * (dsr[j] - rs) * sc
    _zeros_past(dsr, n)                   # over dP of later keys


# The backward walks columns of dS and P (dk = dS^T q, dv = P^T dO). Rows of T floats are
# T / 16 cache lines apart; at T = 128, 256, ... a column's lines fall into so few L1 sets
# that they evict each other before the next column reuses them. So dS rows are one tile
# longer than T (a stride that visits every set), and from T = COPY_P_FROM P is copied into
# rows of that stride first (below it a column fits in the sets it visits). The same holds
# for a head's rows inside a sequence's rows (d_model or 3 d_model floats apart): from T =
# COPY_P_FROM the products that walk all T of them (P v, dS k, P^T dO, dS^T q) read them
# copied into rows of d_head (T 256: forward 10 %, backward 6 % faster; at T 64 the copies
# cost 4-7 %), and the rows of K^T and V^T (d_head rows of T) are padded as dS's are.
COPY_P_FROM = 128


@jit(inline="always")
def _stride(nt):
    # the row stride of the backward's dS (and copied P): whole tiles plus one
    return tiles.round_up(nt) + 16


@jit(inline="always")
def _kv_stride(nt):
    # the row stride of K^T (forward) and V^T (backward): _stride's from COPY_P_FROM on
    return _stride(nt) if nt >= COPY_P_FROM else tiles.round_up(nt)


def work_size(nt, dh, backward, n_heads):
    """Scratch elements per thread of ``_sdpa_fwd`` / ``_sdpa_bwd`` for T = ``nt`` and
    ``n_heads`` heads of ``dh`` (a whole sequence's rows are staged)."""
    tp, wp = -(-nt // 16) * 16, -(-dh // 16) * 16
    if backward:  # V^T, dO / q / k rows, dS and P rows, four output rows, a sequence's qkv,
        # dO and d[qkv] rows
        return (dh * (tp + 16) + 3 * nt * wp + 2 * nt * (tp + 16) + 4 * wp
                + nt * 7 * dh * n_heads)
    # K^T, v rows, four score rows, four output rows, a sequence's qkv and output rows
    return dh * (tp + 16) + nt * wp + 4 * tp + 4 * wp + nt * 4 * dh * n_heads


@jit(inline="always")
def _block(i, nt, causal):
    # rows i..i+3 (past T: T - 1) and their counts of keys (causal: j <= row)
    ib, ig, ih = min(i + 1, nt - 1), min(i + 2, nt - 1), min(i + 3, nt - 1)
    if causal:
        return ib, ig, ih, i + 1, ib + 1, ig + 1, ih + 1
    return ib, ig, ih, nt, nt, nt, nt


@jit(slp=True)
def _sdpa_fwd(out, p, work, qkv, bias, biased, n_heads, scale, causal, i0, i1):
    # out (B, T, d) rows; p (B h, T, T); work (work_size,) scratch; qkv (B, T, 3d) (+ bias
    # (3d,) when biased); pairs i0..i1. Rows go four at a time (_block).
    nt, d = qkv.shape[1], out.shape[2]
    dh = d // n_heads
    tp, wp = tiles.round_up(nt), tiles.round_up(dh)
    ks = _kv_stride(nt)
    kt = work[:dh * ks].reshape(dh, ks)                      # K^T, zero past T
    o = dh * ks
    vp = work[o:o + nt * wp].reshape(nt, wp)                 # v rows, zero past dh
    o += nt * wp
    sr = work[o:o + 4 * tp].reshape(4, tp)                   # four score rows
    orow = work[o + 4 * tp:o + 4 * tp + 4 * wp].reshape(4, wp)  # four output rows
    o += 4 * tp + 4 * wp
    x = work[o:o + nt * 3 * d].reshape(nt, 3 * d)           # the sequence's qkv rows
    ob = work[o + nt * 3 * d:o + nt * 4 * d].reshape(nt, d)  # and its output rows
    sc = fastmath.const(scale, p)
    last, first = -1, 0
    for pair in range(i0, i1):
        b, h = pair // n_heads, pair % n_heads
        qo, ko, vo = h * dh, d + h * dh, 2 * d + h * dh
        if b != last:  # one sequential read of the sequence (a stream the prefetcher follows)
            if last >= 0:
                _rows_out(out[last], ob, first * dh, d, d, nt)
            _stage(x, qkv[b], bias, biased)
            last, first = b, h
        pp = p[pair]
        _head_cols(kt, x, ko, dh, nt)
        vx, vof = x, vo           # v rows read in place when whole tiles and T is short,
        if wp != dh or nt >= COPY_P_FROM:                  # else copied (COPY_P_FROM)
            _head_rows(vp, x, vo, dh, nt)
            vx, vof = vp, 0
        for i in range(0, nt, 4):
            ib, ig, ih, _, _, _, nh = _block(i, nt, causal)
            tiles.dot4(sr[0], sr[1], sr[2], sr[3], x[i, qo:qo + dh], x[ib, qo:qo + dh],
                  x[ig, qo:qo + dh], x[ih, qo:qo + dh], kt, dh, tiles.round_up(nh))  # S rows
            # a loop over the block's rows, not four calls written out: each inlined copy
            # cost ~1 s of numba's compile, for ~1-2 % of this kernel's speed
            for r in range(4):                                  # P rows
                ra = min(i + r, nt - 1)
                _softmax_row(pp[ra], sr[r], ra + 1 if causal else nt, sc)
            tiles.mix4(orow, pp[i], pp[ib], pp[ig], pp[ih], vx, vof, nh, wp)  # O rows = P v
            _put4(ob, orow, i, ib, ig, ih, qo, dh)
    if last >= 0:  # the heads done of the last sequence (another slot may do the rest)
        _rows_out(out[last], ob, first * dh, ((i1 - 1) % n_heads + 1) * dh, d, nt)
    return 0


@jit(inline="always")
def _put4(dx, orow, ja, jb, jg, jh, col, dh):
    # the four output rows into their rows' columns col..col+dh of dx
    _put(dx[ja, col:col + dh], orow[0], dh)
    _put(dx[jb, col:col + dh], orow[1], dh)
    _put(dx[jg, col:col + dh], orow[2], dh)
    _put(dx[jh, col:col + dh], orow[3], dh)


@jit(slp=True)
def _dq_rows(dx, ds, orow, gp, gof, kp, kof, pp, vt, qo, dh, sc, nt, causal):
    # dP = dO v^T, dS from dP and P (each row once: a block past T repeats row T - 1),
    # dq_i = sum_j dS_ij k_j. This and _col_rows are kernels of their own, called once a
    # pair: inlined, they made numba's own passes (inlining, SSA) take 2x as long on _sdpa_bwd
    wp = tiles.round_up(dh)
    for i in range(0, nt, 4):
        ib, ig, ih, _, _, _, nh = _block(i, nt, causal)
        tiles.dot4(ds[i], ds[ib], ds[ig], ds[ih], gp[i, gof:gof + dh], gp[ib, gof:gof + dh],
              gp[ig, gof:gof + dh], gp[ih, gof:gof + dh], vt, dh, tiles.round_up(nh))
        for r in range(i, min(i + 4, nt)):                   # loops, as in _sdpa_fwd
            _dscore_row(ds[r], pp[r], r + 1 if causal else nt, sc)
        tiles.mix4(orow, ds[i], ds[ib], ds[ig], ds[ih], kp, kof, nh, wp)
        _put4(dx, orow, i, ib, ig, ih, qo, dh)
    return 0


@jit(slp=True)
def _col_rows(dx, orow, w, x, off, col, dh, nt, causal):
    # dx[j, col:col + dh] = sum_i w[i, j] x[i, off:off + dh] (causal: i >= j), four j at a time:
    # dv and dk of _sdpa_bwd, one kernel for both (compiled once, called once a pair each)
    for j in range(0, nt, 4):
        jb, jg, jh = _block(j, nt, causal)[:3]
        tiles.colmix4(orow, w, x, off, j, jb, jg, jh, causal, nt, tiles.round_up(dh))
        _put4(dx, orow, j, jb, jg, jh, col, dh)
    return 0


@jit(slp=True)
def _sdpa_bwd(dqkv, work, do, p, qkv, bias, biased, n_heads, scale, causal, i0, i1):
    # dqkv (B, T, 3d) rows; work (work_size,) scratch; do (B, T, d); p (B h, T, T); qkv
    # (+ bias) as in _sdpa_fwd
    nt, d = qkv.shape[1], do.shape[2]
    dh = d // n_heads
    tp, wp = tiles.round_up(nt), tiles.round_up(dh)
    ks = _kv_stride(nt)
    vt = work[:dh * ks].reshape(dh, ks)                      # V^T, zero past T
    o = dh * ks
    gp = work[o:o + nt * wp].reshape(nt, wp)                 # dO, q, k rows, zero past dh
    qp = work[o + nt * wp:o + 2 * nt * wp].reshape(nt, wp)
    kp = work[o + 2 * nt * wp:o + 3 * nt * wp].reshape(nt, wp)
    o += 3 * nt * wp
    ts = _stride(nt)
    ds = work[o:o + nt * ts].reshape(nt, ts)                 # dP, then dS (lower half)
    pc = work[o + nt * ts:o + 2 * nt * ts].reshape(nt, ts)   # P copied, from T = COPY_P_FROM
    orow = work[o + 2 * nt * ts:o + 2 * nt * ts + 4 * wp].reshape(4, wp)
    o += 2 * nt * ts + 4 * wp
    x = work[o:o + nt * 3 * d].reshape(nt, 3 * d)           # the sequence's qkv, dO and
    g = work[o + nt * 3 * d:o + nt * 4 * d].reshape(nt, d)  # d[qkv] rows
    dx = work[o + nt * 4 * d:o + nt * 7 * d].reshape(nt, 3 * d)
    sc = fastmath.const(scale, p)
    last, first = -1, 0
    for pair in range(i0, i1):
        b, h = pair // n_heads, pair % n_heads
        qo, ko, vo = h * dh, d + h * dh, 2 * d + h * dh
        if b != last:  # sequential reads and writes of whole sequences, as in _sdpa_fwd
            if last >= 0:
                _rows_out(dqkv[last], dx, first * dh, d, d, nt)
            _stage(x, qkv[b], bias, biased)
            _put(g.reshape(-1), do[b].reshape(-1), nt * d)
            last, first = b, h
        pp = p[pair]
        _head_cols(vt, x, vo, dh, nt)
        gx, gof, qx, qof, kx, kof = g, qo, x, qo, x, ko  # rows read in place, as in the
        if wp != dh or nt >= COPY_P_FROM:                  # forward, else copied
            _head_rows(gp, g, qo, dh, nt)
            _head_rows(qp, x, qo, dh, nt)
            _head_rows(kp, x, ko, dh, nt)
            gx, gof, qx, qof, kx, kof = gp, 0, qp, 0, kp, 0
        pw = pp
        if nt >= COPY_P_FROM:
            for i in range(nt):
                _put(pc[i], pp[i], i + 1 if causal else nt)
            pw = pc
        _col_rows(dx, orow, pw, gx, gof, vo, dh, nt, causal)   # dv_j = sum_i P_ij dO_i
        _dq_rows(dx, ds, orow, gx, gof, kx, kof, pp, vt, qo, dh, sc, nt, causal)
        _col_rows(dx, orow, ds, qx, qof, ko, dh, nt, causal)   # dk_j = sum_i dS_ij q_i
    if last >= 0:
        _rows_out(dqkv[last], dx, first * dh, ((i1 - 1) % n_heads + 1) * dh, d, nt)
    return 0


@jit(slp=True)
def _sdpa_fwd_claims(out, p, work, qkv, bias, biased, n_heads, scale, causal, counter, chunk,
                     n_pairs):
    # _sdpa_fwd over pairs chunk at a time, each chunk claimed from counter (shared by slots)
    while True:
        i0 = atomic.fetch_add(counter, 1) * chunk
        if i0 >= n_pairs:
            return 0
        _sdpa_fwd(out, p, work, qkv, bias, biased, n_heads, scale, causal, i0,
                  min(i0 + chunk, n_pairs))


@jit(slp=True)
def _sdpa_bwd_claims(dqkv, work, do, p, qkv, bias, biased, n_heads, scale, causal, counter,
                     chunk, n_pairs):
    # _sdpa_bwd over claimed chunks, as _sdpa_fwd_claims
    while True:
        i0 = atomic.fetch_add(counter, 1) * chunk
        if i0 >= n_pairs:
            return 0
        _sdpa_bwd(dqkv, work, do, p, qkv, bias, biased, n_heads, scale, causal, i0,
                  min(i0 + chunk, n_pairs))


def _chunk(n_pairs, n_heads, k):
    """Pairs per claim (kernels.atomic): whole sequences when there are four or more per
    slot (a sequence's rows are staged once), else a quarter of a slot's share."""
    if n_pairs >= 4 * k * n_heads:
        return n_heads
    return max(1, -(-n_pairs // (4 * k)))


def _claims(k, n_pairs, n_heads):
    """A zeroed claim counter (the calling thread's scratch) and the pairs per claim."""
    counter = scratch("sdpa.claims", 1, np.int64)
    counter[0] = 0
    return counter, _chunk(n_pairs, n_heads, k)


# Cost per score element x d_head for kernels.parallel.threads_for, calibrated rather than
# counted: each slot first copies its heads' operands, so a split of either pass loses below
# ~6 (batch, head) pairs of T 64, d_head 32 and pays from ~12 (docs/performance-log.md).
FWD_COST = 1
BWD_COST = 1


def _threads(n_pairs, t, dh, causal, cost):
    """Threads for ``n_pairs`` (batch, head) pairs of ``t`` positions (kernels.parallel)."""
    per_pair = (t * (t + 1) // 2 if causal else t * t) * dh
    return _par.threads_for(n_pairs, per_pair, passes=cost)


def _bias_arg(bias, qkv):
    """(bias, biased) as the kernels take them: without a bias, a one-element stand-in of
    qkv's dtype (one compiled signature either way)."""
    if bias is None:
        return scratch("sdpa.nobias", 1, qkv.dtype), False
    return bias, True


def sdpa_forward_unchecked(out, p, qkv, n_heads, scale, causal, bias=None):
    """``out[b, i, h*dh:(h+1)*dh] = softmax(q k^T * scale (+ causal mask))[i] @ v`` for every
    batch b and head h, with q, k, v the head's column blocks of ``qkv`` (B, T, 3 d) plus
    ``bias`` (3 d,) when given; ``p`` (B*h, T, T) receives the probabilities (only j <= i
    defined when causal). C-contiguous arrays of one float dtype; no checks. Returns
    ``out``."""
    nb, nt, d = out.shape
    if nb == 0 or nt == 0:
        return out
    dh, n_pairs = d // n_heads, nb * n_heads
    bias, biased = _bias_arg(bias, qkv)
    k = _threads(n_pairs, nt, dh, causal, FWD_COST)
    size = work_size(nt, dh, False, n_heads)
    works = [scratch(("sdpa.work", s), size, qkv.dtype) for s in range(k)]  # per slot
    if k == 1:
        _sdpa_fwd(out, p, works[0], qkv, bias, biased, n_heads, scale, causal, 0, n_pairs)
    else:  # slots claim chunks of pairs: a late pool thread takes what is left
        counter, chunk = _claims(k, n_pairs, n_heads)
        _par.slots(lambda s: _sdpa_fwd_claims(out, p, works[s], qkv, bias, biased, n_heads,
                                               scale, causal, counter, chunk, n_pairs), k)
    return out


def sdpa_backward_unchecked(dqkv, do, p, qkv, n_heads, scale, causal, bias=None):
    """The gradient of ``sdpa_forward`` into ``dqkv`` (B, T, 3 d) (overwritten), from ``do``
    (B, T, d) = dL/d out, the forward's ``p``, ``qkv`` and ``bias``: per (batch, head)
    dS = P (dP - rowsum(dP P)) with dP = dO v^T, dq = dS k scale, dk = dS^T q scale,
    dv = P^T dO. ``dqkv`` may be ``qkv`` (each slot copies a sequence before it computes and
    writes back only its own heads' columns after) but no other input; no checks. Returns
    ``dqkv``."""
    nb, nt, d = do.shape
    if nb == 0 or nt == 0:
        return dqkv
    dh, n_pairs = d // n_heads, nb * n_heads
    bias, biased = _bias_arg(bias, qkv)
    k = _threads(n_pairs, nt, dh, causal, BWD_COST)
    size = work_size(nt, dh, True, n_heads)
    works = [scratch(("sdpa.work", s), size, qkv.dtype) for s in range(k)]  # per slot
    if k == 1:
        _sdpa_bwd(dqkv, works[0], do, p, qkv, bias, biased, n_heads, scale, causal, 0, n_pairs)
    else:
        counter, chunk = _claims(k, n_pairs, n_heads)
        _par.slots(lambda s: _sdpa_bwd_claims(dqkv, works[s], do, p, qkv, bias, biased,
                                               n_heads, scale, causal, counter, chunk,
                                               n_pairs), k)
    return dqkv


# ----------------------------------------------------------------------------- checked API
def _check(rows_name, rows, p, qkv, n_heads, bias, outputs):
    """Shapes, dtypes and layout shared by the forward and the backward; ``bias`` None or a
    (3 d_model,) row of qkv's dtype that none of ``outputs`` ((name, array) pairs) overlaps."""
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
    if bias is not None:
        check_array("bias", bias, dtype=qkv.dtype, shape=(d3,))
        for name, a in outputs:
            if np.may_share_memory(a, bias):
                raise ValueError(f"{name}: must not overlap bias")


def sdpa_forward(out, p, qkv, n_heads, scale, causal=True, bias=None):
    """Multi-head scaled dot-product attention from the fused projection ``qkv`` (B, T,
    3 d_model), q, k, v each d_model columns and head h their columns h*dh:(h+1)*dh: per
    (batch, head) ``P = softmax(q k^T * scale + M)`` into ``p`` (B*n_heads, T, T) (M = -inf
    above the diagonal when ``causal``; that half of p is left undefined and never read) and
    ``O = P v`` into the head's columns of ``out`` (B, T, d_model); q, k, v those of ``qkv +
    bias`` with a ``bias`` (3 d_model,) (the projection's, added as the kernel reads each
    sequence; ``qkv`` is not written). C-contiguous arrays of one float dtype; ``out`` and
    ``p`` must not overlap each other, ``qkv`` or ``bias``. Returns ``out``."""
    _check("out", out, p, qkv, n_heads, bias, (("out", out), ("p", p)))
    for name, a in (("out", out), ("p", p)):
        if np.may_share_memory(a, qkv):
            raise ValueError(f"{name}: must not overlap qkv")
    if np.may_share_memory(out, p):
        raise ValueError("out: must not overlap p")
    return sdpa_forward_unchecked(out, p, qkv, int(n_heads), float(scale), bool(causal),
                                  bias)


def sdpa_backward(dqkv, do, p, qkv, n_heads, scale, causal=True, bias=None):
    """The gradient of ``sdpa_forward``: ``dqkv`` (B, T, 3 d_model), overwritten with
    d[q | k | v] in qkv's layout, from ``do`` (B, T, d_model) = dL/d out and the forward's
    ``p``, ``qkv`` and ``bias``. ``dqkv`` may be ``qkv`` itself (overwritten in place; the
    kernel works on a copy of each sequence) but must not overlap the inputs otherwise.
    Returns ``dqkv``."""
    _check("do", do, p, qkv, n_heads, bias, (("dqkv", dqkv),))
    check_array("dqkv", dqkv, dtype=qkv.dtype, shape=qkv.shape)
    same = dqkv.__array_interface__["data"][0] == qkv.__array_interface__["data"][0]
    for name, a in (("do", do), ("p", p), ("qkv", qkv)):
        if np.may_share_memory(dqkv, a) and not (a is qkv and same):
            raise ValueError(f"dqkv: must not overlap {name}" + (
                " (it may be qkv itself)" if a is qkv else ""))
    return sdpa_backward_unchecked(dqkv, do, p, qkv, int(n_heads), float(scale), bool(causal),
                                   bias)

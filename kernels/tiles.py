"""Sixteen-lane register tiles for compiled kernels built like a GEMM micro-kernel
(kernels.sdpa): a tile is a tuple of 16 values that a loop carries as 16 scalars.

LLVM's loop vectoriser only vectorises an innermost loop, and without reassociation not a
reduction; a tile turns the reduction loop inside out: each of 16 independent outputs
accumulates over the loop in its own scalar (a fixed order per output, so the bits cannot
depend on the vector width), and the SLP vectoriser (``kernels.jit.jit(slp=True)``) packs the
16 scalars into vector registers: one load, one broadcast, one multiply and one add per 16
multiply-adds, no store inside the loop. The loop must carry the 16 scalars by name
(``a0, ..., a15 = axpy((a0, ..., a15), w, k)``): a loop-carried tuple stays an aggregate that
SLP does not pack. Rows are passed as 16-element slices: constant indices into a slice carry
no negative-index fix-up, which would stop the loads from being combined. Inline helpers:
call them from ``@jit(slp=True)`` kernels.
"""
from __future__ import annotations

from . import fastmath
from .jit import jit

__all__ = ["WIDTH", "zeros", "load", "axpy", "store", "round_up", "dot4", "mix4", "colmix4"]

WIDTH = 16  # lanes of a tile: one AVX-512 register of float32, two of float64


@jit(inline="always")
def round_up(n):
    """n rounded up to whole tiles."""
    return (n + 15) // 16 * 16


@jit(inline="always")
def zeros(like):
    """A tile of zeros of ``like``'s dtype."""
    z = fastmath.const(0, like)
    return (z, z, z, z, z, z, z, z, z, z, z, z, z, z, z, z)


@jit(inline="always")
def load(r):
    """The 16 values of the slice ``r``."""
    return (r[0], r[1], r[2], r[3], r[4], r[5], r[6], r[7],
            r[8], r[9], r[10], r[11], r[12], r[13], r[14], r[15])


@jit(inline="always")
def axpy(a, w, k):
    """a + w * k lane by lane (``w`` a scalar, ``a``, ``k`` tiles)."""
    return (a[0] + w * k[0], a[1] + w * k[1], a[2] + w * k[2], a[3] + w * k[3],
            a[4] + w * k[4], a[5] + w * k[5], a[6] + w * k[6], a[7] + w * k[7],
            a[8] + w * k[8], a[9] + w * k[9], a[10] + w * k[10], a[11] + w * k[11],
            a[12] + w * k[12], a[13] + w * k[13], a[14] + w * k[14], a[15] + w * k[15])


@jit(inline="always")
def store(out, a):
    """out[0:16] = a (``out`` a slice of at least 16 elements)."""
    out[0], out[1], out[2], out[3] = a[0], a[1], a[2], a[3]
    out[4], out[5], out[6], out[7] = a[4], a[5], a[6], a[7]
    out[8], out[9], out[10], out[11] = a[8], a[9], a[10], a[11]
    out[12], out[13], out[14], out[15] = a[12], a[13], a[14], a[15]


# The products of attention (kernels.sdpa), built from the tiles above, every lane summed
# over its inner index in increasing order. Rows go in blocks of four (a block past T
# repeats row T - 1: same inputs, same bits), all four at once: four sums in flight cover
# the adds' latency (the row mixes in two pairs ran 1-13 % slower; Zen 5, float32).

@jit(inline="always")
def dot4(sa, sb, sg, sh, qa, qb, qg, qh, kt, dh, n):
    # s_r[j] = sum_c q_r[c] kt[c, j] for the four rows r and the tiles covering j < n
    for j0 in range(0, n, 16):
        a0, a1, a2, a3, a4, a5, a6, a7, a8, a9, a10, a11, a12, a13, a14, a15 = zeros(sa)
        b0, b1, b2, b3, b4, b5, b6, b7, b8, b9, b10, b11, b12, b13, b14, b15 = zeros(sa)
        g0, g1, g2, g3, g4, g5, g6, g7, g8, g9, g10, g11, g12, g13, g14, g15 = zeros(sa)
        h0, h1, h2, h3, h4, h5, h6, h7, h8, h9, h10, h11, h12, h13, h14, h15 = zeros(sa)
        for c in range(dh):
            k = load(kt[c, j0:j0 + 16])
            a0, a1, a2, a3, a4, a5, a6, a7, a8, a9, a10, a11, a12, a13, a14, a15 = axpy(
                (a0, a1, a2, a3, a4, a5, a6, a7, a8, a9, a10, a11, a12, a13, a14, a15), qa[c], k)
            b0, b1, b2, b3, b4, b5, b6, b7, b8, b9, b10, b11, b12, b13, b14, b15 = axpy(
                (b0, b1, b2, b3, b4, b5, b6, b7, b8, b9, b10, b11, b12, b13, b14, b15), qb[c], k)
            g0, g1, g2, g3, g4, g5, g6, g7, g8, g9, g10, g11, g12, g13, g14, g15 = axpy(
                (g0, g1, g2, g3, g4, g5, g6, g7, g8, g9, g10, g11, g12, g13, g14, g15), qg[c], k)
            h0, h1, h2, h3, h4, h5, h6, h7, h8, h9, h10, h11, h12, h13, h14, h15 = axpy(
                (h0, h1, h2, h3, h4, h5, h6, h7, h8, h9, h10, h11, h12, h13, h14, h15), qh[c], k)
        store(sa[j0:j0 + 16],
                    (a0, a1, a2, a3, a4, a5, a6, a7, a8, a9, a10, a11, a12, a13, a14, a15))
        store(sb[j0:j0 + 16],
                    (b0, b1, b2, b3, b4, b5, b6, b7, b8, b9, b10, b11, b12, b13, b14, b15))
        store(sg[j0:j0 + 16],
                    (g0, g1, g2, g3, g4, g5, g6, g7, g8, g9, g10, g11, g12, g13, g14, g15))
        store(sh[j0:j0 + 16],
                    (h0, h1, h2, h3, h4, h5, h6, h7, h8, h9, h10, h11, h12, h13, h14, h15))


@jit(inline="always")
def mix4(o4, pa, pb, pg, ph, x, off, n, width):
    # o4[r] = sum_{j < n} p_r[j] x[j] over columns off..off+width for the four rows r (O =
    # P v, dq = dS k). A causal block's shorter rows are summed up to the longest's n too:
    # the caller writes zeros past each row's own count, and 0 x[j] leaves a sum as it was
    # (for finite x; a sum of exactly -0 becomes +0)
    for c0 in range(0, width, 16):
        e = off + c0
        a0, a1, a2, a3, a4, a5, a6, a7, a8, a9, a10, a11, a12, a13, a14, a15 = zeros(o4)
        b0, b1, b2, b3, b4, b5, b6, b7, b8, b9, b10, b11, b12, b13, b14, b15 = zeros(o4)
        g0, g1, g2, g3, g4, g5, g6, g7, g8, g9, g10, g11, g12, g13, g14, g15 = zeros(o4)
        h0, h1, h2, h3, h4, h5, h6, h7, h8, h9, h10, h11, h12, h13, h14, h15 = zeros(o4)
        for j in range(n):
            k = load(x[j, e:e + 16])
            a0, a1, a2, a3, a4, a5, a6, a7, a8, a9, a10, a11, a12, a13, a14, a15 = axpy(
                (a0, a1, a2, a3, a4, a5, a6, a7, a8, a9, a10, a11, a12, a13, a14, a15), pa[j], k)
            b0, b1, b2, b3, b4, b5, b6, b7, b8, b9, b10, b11, b12, b13, b14, b15 = axpy(
                (b0, b1, b2, b3, b4, b5, b6, b7, b8, b9, b10, b11, b12, b13, b14, b15), pb[j], k)
            g0, g1, g2, g3, g4, g5, g6, g7, g8, g9, g10, g11, g12, g13, g14, g15 = axpy(
                (g0, g1, g2, g3, g4, g5, g6, g7, g8, g9, g10, g11, g12, g13, g14, g15), pg[j], k)
            h0, h1, h2, h3, h4, h5, h6, h7, h8, h9, h10, h11, h12, h13, h14, h15 = axpy(
                (h0, h1, h2, h3, h4, h5, h6, h7, h8, h9, h10, h11, h12, h13, h14, h15), ph[j], k)
        store(o4[0][c0:c0 + 16],
              (a0, a1, a2, a3, a4, a5, a6, a7, a8, a9, a10, a11, a12, a13, a14, a15))
        store(o4[1][c0:c0 + 16],
              (b0, b1, b2, b3, b4, b5, b6, b7, b8, b9, b10, b11, b12, b13, b14, b15))
        store(o4[2][c0:c0 + 16],
              (g0, g1, g2, g3, g4, g5, g6, g7, g8, g9, g10, g11, g12, g13, g14, g15))
        store(o4[3][c0:c0 + 16],
              (h0, h1, h2, h3, h4, h5, h6, h7, h8, h9, h10, h11, h12, h13, h14, h15))


@jit(inline="always")
def colmix4(o4, w, x, off, ja, jb, jg, jh, causal, nt, width):
    # o4[r] = sum_i w[i, j_r] x[i, off:off + width] over i < nt, or i >= j_r when causal (ja
    # <= jb <= jg <= jh): the transposed product (dv = P^T dO, dk = dS^T q)
    la, lb, lg, lh = (ja, jb, jg, jh) if causal else (0, 0, 0, 0)
    for c0 in range(0, width, 16):
        a0, a1, a2, a3, a4, a5, a6, a7, a8, a9, a10, a11, a12, a13, a14, a15 = zeros(o4)
        b0, b1, b2, b3, b4, b5, b6, b7, b8, b9, b10, b11, b12, b13, b14, b15 = zeros(o4)
        g0, g1, g2, g3, g4, g5, g6, g7, g8, g9, g10, g11, g12, g13, g14, g15 = zeros(o4)
        h0, h1, h2, h3, h4, h5, h6, h7, h8, h9, h10, h11, h12, h13, h14, h15 = zeros(o4)
        for i in range(la, lb):
            k, wa = load(x[i, off + c0:off + c0 + 16]), w[i, ja]
            a0, a1, a2, a3, a4, a5, a6, a7, a8, a9, a10, a11, a12, a13, a14, a15 = axpy(
                (a0, a1, a2, a3, a4, a5, a6, a7, a8, a9, a10, a11, a12, a13, a14, a15), wa, k)
        for i in range(lb, lg):
            k, wa, wb = load(x[i, off + c0:off + c0 + 16]), w[i, ja], w[i, jb]
            a0, a1, a2, a3, a4, a5, a6, a7, a8, a9, a10, a11, a12, a13, a14, a15 = axpy(
                (a0, a1, a2, a3, a4, a5, a6, a7, a8, a9, a10, a11, a12, a13, a14, a15), wa, k)
            b0, b1, b2, b3, b4, b5, b6, b7, b8, b9, b10, b11, b12, b13, b14, b15 = axpy(
                (b0, b1, b2, b3, b4, b5, b6, b7, b8, b9, b10, b11, b12, b13, b14, b15), wb, k)
        for i in range(lg, lh):
            k = load(x[i, off + c0:off + c0 + 16])
            wa, wb, wg = w[i, ja], w[i, jb], w[i, jg]
            a0, a1, a2, a3, a4, a5, a6, a7, a8, a9, a10, a11, a12, a13, a14, a15 = axpy(
                (a0, a1, a2, a3, a4, a5, a6, a7, a8, a9, a10, a11, a12, a13, a14, a15), wa, k)
            b0, b1, b2, b3, b4, b5, b6, b7, b8, b9, b10, b11, b12, b13, b14, b15 = axpy(
                (b0, b1, b2, b3, b4, b5, b6, b7, b8, b9, b10, b11, b12, b13, b14, b15), wb, k)
            g0, g1, g2, g3, g4, g5, g6, g7, g8, g9, g10, g11, g12, g13, g14, g15 = axpy(
                (g0, g1, g2, g3, g4, g5, g6, g7, g8, g9, g10, g11, g12, g13, g14, g15), wg, k)
        for i in range(lh, nt):
            k = load(x[i, off + c0:off + c0 + 16])
            wa, wb, wg, wh = w[i, ja], w[i, jb], w[i, jg], w[i, jh]
            a0, a1, a2, a3, a4, a5, a6, a7, a8, a9, a10, a11, a12, a13, a14, a15 = axpy(
                (a0, a1, a2, a3, a4, a5, a6, a7, a8, a9, a10, a11, a12, a13, a14, a15), wa, k)
            b0, b1, b2, b3, b4, b5, b6, b7, b8, b9, b10, b11, b12, b13, b14, b15 = axpy(
                (b0, b1, b2, b3, b4, b5, b6, b7, b8, b9, b10, b11, b12, b13, b14, b15), wb, k)
            g0, g1, g2, g3, g4, g5, g6, g7, g8, g9, g10, g11, g12, g13, g14, g15 = axpy(
                (g0, g1, g2, g3, g4, g5, g6, g7, g8, g9, g10, g11, g12, g13, g14, g15), wg, k)
            h0, h1, h2, h3, h4, h5, h6, h7, h8, h9, h10, h11, h12, h13, h14, h15 = axpy(
                (h0, h1, h2, h3, h4, h5, h6, h7, h8, h9, h10, h11, h12, h13, h14, h15), wh, k)
        store(o4[0][c0:c0 + 16],
                    (a0, a1, a2, a3, a4, a5, a6, a7, a8, a9, a10, a11, a12, a13, a14, a15))
        store(o4[1][c0:c0 + 16],
                    (b0, b1, b2, b3, b4, b5, b6, b7, b8, b9, b10, b11, b12, b13, b14, b15))
        store(o4[2][c0:c0 + 16],
                    (g0, g1, g2, g3, g4, g5, g6, g7, g8, g9, g10, g11, g12, g13, g14, g15))
        store(o4[3][c0:c0 + 16],
                    (h0, h1, h2, h3, h4, h5, h6, h7, h8, h9, h10, h11, h12, h13, h14, h15))

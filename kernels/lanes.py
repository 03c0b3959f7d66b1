"""Row reductions for the compiled kernels: sums, dot products and maxima over a 1-D row in
eight fixed lanes (element i goes to lane i % 8, the lanes are added in one fixed tree).

Without reassociation (kernels.jit never allows it) LLVM keeps a plain ``s += x[i]`` loop
sequential, one add latency per element; eight independent accumulators vectorise and keep
the order, and so the result, independent of the vector width and of how rows are split
over threads. Inline helpers: call them from ``@jit`` kernels.
"""
from __future__ import annotations

from . import fastmath, tiles
from .jit import jit
from .memory import scratch

__all__ = ["row_sum", "row_dot", "row_dot_centred", "row_sumsq_centred", "row_max",
           "row_wsum_centred", "row_sqdist", "sum_in_order", "sum16", "dot16",
           "sumsq16_centred", "dot16_centred", "wsum16_centred", "stored_lanes"]


@jit(inline="always")
def _tree(s0, s1, s2, s3, s4, s5, s6, s7):
    return ((s0 + s1) + (s2 + s3)) + ((s4 + s5) + (s6 + s7))


@jit(inline="always")
def row_sum(x):
    """sum(x) of a 1-D row."""
    n = x.shape[0]
    s0 = s1 = s2 = s3 = s4 = s5 = s6 = s7 = fastmath.const(0, x)
    m = n - n % 8
    for i in range(0, m, 8):
        s0 += x[i]
        s1 += x[i + 1]
        s2 += x[i + 2]
        s3 += x[i + 3]
        s4 += x[i + 4]
        s5 += x[i + 5]
        s6 += x[i + 6]
        s7 += x[i + 7]
    for i in range(m, n):
        s0 += x[i]
    return _tree(s0, s1, s2, s3, s4, s5, s6, s7)


@jit(inline="always")
def row_dot(x, y):
    """sum(x * y) of two 1-D rows of one length."""
    n = x.shape[0]
    s0 = s1 = s2 = s3 = s4 = s5 = s6 = s7 = fastmath.const(0, x)
    m = n - n % 8
    for i in range(0, m, 8):
        s0 += x[i] * y[i]
        s1 += x[i + 1] * y[i + 1]
        s2 += x[i + 2] * y[i + 2]
        s3 += x[i + 3] * y[i + 3]
        s4 += x[i + 4] * y[i + 4]
        s5 += x[i + 5] * y[i + 5]
        s6 += x[i + 6] * y[i + 6]
        s7 += x[i + 7] * y[i + 7]
    for i in range(m, n):
        s0 += x[i] * y[i]
    return _tree(s0, s1, s2, s3, s4, s5, s6, s7)


@jit(inline="always")
def row_sumsq_centred(x, c):
    """sum((x - c)**2) of a 1-D row."""
    n = x.shape[0]
    s0 = s1 = s2 = s3 = s4 = s5 = s6 = s7 = fastmath.const(0, x)
    m = n - n % 8
    for i in range(0, m, 8):
        t0, t1, t2, t3 = x[i] - c, x[i + 1] - c, x[i + 2] - c, x[i + 3] - c
        t4, t5, t6, t7 = x[i + 4] - c, x[i + 5] - c, x[i + 6] - c, x[i + 7] - c
        s0 += t0 * t0
        s1 += t1 * t1
        s2 += t2 * t2
        s3 += t3 * t3
        s4 += t4 * t4
        s5 += t5 * t5
        s6 += t6 * t6
        s7 += t7 * t7
    for i in range(m, n):
        t = x[i] - c
        s0 += t * t
    return _tree(s0, s1, s2, s3, s4, s5, s6, s7)


@jit(inline="always")
def _max(a, b):
    return b if b > a else a


@jit(inline="always")
def row_max(x):
    """max(x) of a non-empty 1-D row (a NaN may be skipped: callers propagate NaN through
    their own arithmetic)."""
    n = x.shape[0]
    s0 = s1 = s2 = s3 = s4 = s5 = s6 = s7 = x[0]
    m = n - n % 8
    for i in range(0, m, 8):
        s0 = _max(s0, x[i])
        s1 = _max(s1, x[i + 1])
        s2 = _max(s2, x[i + 2])
        s3 = _max(s3, x[i + 3])
        s4 = _max(s4, x[i + 4])
        s5 = _max(s5, x[i + 5])
        s6 = _max(s6, x[i + 6])
        s7 = _max(s7, x[i + 7])
    for i in range(m, n):
        s0 = _max(s0, x[i])
    return _max(_max(_max(s0, s1), _max(s2, s3)), _max(_max(s4, s5), _max(s6, s7)))


@jit(inline="always")
def row_dot_centred(a, b, x, c):
    """sum(a * b * (x - c)) of three 1-D rows of one length."""
    n = x.shape[0]
    s0 = s1 = s2 = s3 = s4 = s5 = s6 = s7 = fastmath.const(0, x)
    m = n - n % 8
    for i in range(0, m, 8):
        s0 += a[i] * b[i] * (x[i] - c)
        s1 += a[i + 1] * b[i + 1] * (x[i + 1] - c)
        s2 += a[i + 2] * b[i + 2] * (x[i + 2] - c)
        s3 += a[i + 3] * b[i + 3] * (x[i + 3] - c)
        s4 += a[i + 4] * b[i + 4] * (x[i + 4] - c)
        s5 += a[i + 5] * b[i + 5] * (x[i + 5] - c)
        s6 += a[i + 6] * b[i + 6] * (x[i + 6] - c)
        s7 += a[i + 7] * b[i + 7] * (x[i + 7] - c)
    for i in range(m, n):
        s0 += a[i] * b[i] * (x[i] - c)
    return _tree(s0, s1, s2, s3, s4, s5, s6, s7)


@jit(inline="always")
def row_wsum_centred(w, x, c):
    """sum(w * (x - c)) of two 1-D rows of one length."""
    n = x.shape[0]
    s0 = s1 = s2 = s3 = s4 = s5 = s6 = s7 = fastmath.const(0, x)
    m = n - n % 8
    for i in range(0, m, 8):
        s0 += w[i] * (x[i] - c)
        s1 += w[i + 1] * (x[i + 1] - c)
        s2 += w[i + 2] * (x[i + 2] - c)
        s3 += w[i + 3] * (x[i + 3] - c)
        s4 += w[i + 4] * (x[i + 4] - c)
        s5 += w[i + 5] * (x[i + 5] - c)
        s6 += w[i + 6] * (x[i + 6] - c)
        s7 += w[i + 7] * (x[i + 7] - c)
    for i in range(m, n):
        s0 += w[i] * (x[i] - c)
    return _tree(s0, s1, s2, s3, s4, s5, s6, s7)


@jit(inline="always")
def row_sqdist(x, y):
    """sum((x - y)**2) of two 1-D rows of one length."""
    n = x.shape[0]
    s0 = s1 = s2 = s3 = s4 = s5 = s6 = s7 = fastmath.const(0, x)
    m = n - n % 8
    for i in range(0, m, 8):
        t0, t1, t2, t3 = x[i] - y[i], x[i + 1] - y[i + 1], x[i + 2] - y[i + 2], x[i + 3] - y[i + 3]
        t4, t5 = x[i + 4] - y[i + 4], x[i + 5] - y[i + 5]
        t6, t7 = x[i + 6] - y[i + 6], x[i + 7] - y[i + 7]
        s0 += t0 * t0
        s1 += t1 * t1
        s2 += t2 * t2
        s3 += t3 * t3
        s4 += t4 * t4
        s5 += t5 * t5
        s6 += t6 * t6
        s7 += t7 * t7
    for i in range(m, n):
        t = x[i] - y[i]
        s0 += t * t
    return _tree(s0, s1, s2, s3, s4, s5, s6, s7)


# ----------------------------------------------------------------------------- 16 lanes, stored
# LLVM's SLP vectoriser packs the eight lanes above starting from their final tree, two or
# four lanes at a time with shuffles (row_sumsq_centred ran at a third of row_sum's speed;
# Zen 5, rows of 128). Here a row's 16 lanes (element i in lane i % 16, a whole tile per
# step, kernels.tiles) end in one store to a 16-element scratch row ``acc``: SLP packs from
# that store, so the loop runs on one 16-lane register. The tail (n % 16 elements) is added
# to lanes 0.. in ``acc``, and the lanes are added in one fixed tree: lane l and lane l + 8,
# then halves again. Call from ``@jit(slp=True)`` kernels.

def stored_lanes(k, dtype):
    """For each of ``k`` slots of a split pass, the 16-element scratch row its 16-lane sums
    store to, as a 1-tuple to splat into the kernel's arguments (taken on the calling
    thread, kernels.memory.scratch; one per slot, since slots run at once)."""
    return [(scratch(("lanes.acc", s), 16, dtype),) for s in range(k)]


@jit(inline="always")
def _tree16(acc):
    s0, s1, s2, s3 = acc[0] + acc[8], acc[1] + acc[9], acc[2] + acc[10], acc[3] + acc[11]
    s4, s5, s6, s7 = acc[4] + acc[12], acc[5] + acc[13], acc[6] + acc[14], acc[7] + acc[15]
    return ((s0 + s4) + (s2 + s6)) + ((s1 + s5) + (s3 + s7))


@jit(inline="always")
def _add(a, t):
    return (a[0] + t[0], a[1] + t[1], a[2] + t[2], a[3] + t[3],
            a[4] + t[4], a[5] + t[5], a[6] + t[6], a[7] + t[7],
            a[8] + t[8], a[9] + t[9], a[10] + t[10], a[11] + t[11],
            a[12] + t[12], a[13] + t[13], a[14] + t[14], a[15] + t[15])


@jit(inline="always")
def _mul(k, y):
    return (k[0] * y[0], k[1] * y[1], k[2] * y[2], k[3] * y[3],
            k[4] * y[4], k[5] * y[5], k[6] * y[6], k[7] * y[7],
            k[8] * y[8], k[9] * y[9], k[10] * y[10], k[11] * y[11],
            k[12] * y[12], k[13] * y[13], k[14] * y[14], k[15] * y[15])


@jit(inline="always")
def _sq_centred(k, c):
    return ((k[0] - c) * (k[0] - c), (k[1] - c) * (k[1] - c),
            (k[2] - c) * (k[2] - c), (k[3] - c) * (k[3] - c),
            (k[4] - c) * (k[4] - c), (k[5] - c) * (k[5] - c),
            (k[6] - c) * (k[6] - c), (k[7] - c) * (k[7] - c),
            (k[8] - c) * (k[8] - c), (k[9] - c) * (k[9] - c),
            (k[10] - c) * (k[10] - c), (k[11] - c) * (k[11] - c),
            (k[12] - c) * (k[12] - c), (k[13] - c) * (k[13] - c),
            (k[14] - c) * (k[14] - c), (k[15] - c) * (k[15] - c))


@jit(inline="always")
def _mul_centred(ka, kb, kx, c):
    return (ka[0] * kb[0] * (kx[0] - c), ka[1] * kb[1] * (kx[1] - c),
            ka[2] * kb[2] * (kx[2] - c), ka[3] * kb[3] * (kx[3] - c),
            ka[4] * kb[4] * (kx[4] - c), ka[5] * kb[5] * (kx[5] - c),
            ka[6] * kb[6] * (kx[6] - c), ka[7] * kb[7] * (kx[7] - c),
            ka[8] * kb[8] * (kx[8] - c), ka[9] * kb[9] * (kx[9] - c),
            ka[10] * kb[10] * (kx[10] - c), ka[11] * kb[11] * (kx[11] - c),
            ka[12] * kb[12] * (kx[12] - c), ka[13] * kb[13] * (kx[13] - c),
            ka[14] * kb[14] * (kx[14] - c), ka[15] * kb[15] * (kx[15] - c))


@jit(inline="always")
def _wmul_centred(w, kx, c):
    return (w[0] * (kx[0] - c), w[1] * (kx[1] - c), w[2] * (kx[2] - c), w[3] * (kx[3] - c),
            w[4] * (kx[4] - c), w[5] * (kx[5] - c), w[6] * (kx[6] - c), w[7] * (kx[7] - c),
            w[8] * (kx[8] - c), w[9] * (kx[9] - c), w[10] * (kx[10] - c), w[11] * (kx[11] - c),
            w[12] * (kx[12] - c), w[13] * (kx[13] - c), w[14] * (kx[14] - c), w[15] * (kx[15] - c))


@jit(inline="always")
def sum16(x, acc):
    """sum(x) of a 1-D row in 16 stored lanes (``acc``: a 16-element scratch row)."""
    n = x.shape[0]
    m = n - n % 16
    a0, a1, a2, a3, a4, a5, a6, a7, a8, a9, a10, a11, a12, a13, a14, a15 = tiles.zeros(x)
    for i in range(0, m, 16):
        a0, a1, a2, a3, a4, a5, a6, a7, a8, a9, a10, a11, a12, a13, a14, a15 = _add(
            (a0, a1, a2, a3, a4, a5, a6, a7, a8, a9, a10, a11, a12, a13, a14, a15),
            tiles.load(x[i:i + 16]))
    tiles.store(acc, (a0, a1, a2, a3, a4, a5, a6, a7,
                      a8, a9, a10, a11, a12, a13, a14, a15))
    for i in range(m, n):
        acc[i - m] += x[i]
    return _tree16(acc)


@jit(inline="always")
def dot16(x, y, acc):
    """sum(x * y) of two 1-D rows of one length in 16 stored lanes."""
    n = x.shape[0]
    m = n - n % 16
    a0, a1, a2, a3, a4, a5, a6, a7, a8, a9, a10, a11, a12, a13, a14, a15 = tiles.zeros(x)
    for i in range(0, m, 16):
        a0, a1, a2, a3, a4, a5, a6, a7, a8, a9, a10, a11, a12, a13, a14, a15 = _add(
            (a0, a1, a2, a3, a4, a5, a6, a7, a8, a9, a10, a11, a12, a13, a14, a15),
            _mul(tiles.load(x[i:i + 16]), tiles.load(y[i:i + 16])))
    tiles.store(acc, (a0, a1, a2, a3, a4, a5, a6, a7,
                      a8, a9, a10, a11, a12, a13, a14, a15))
    for i in range(m, n):
        acc[i - m] += x[i] * y[i]
    return _tree16(acc)


@jit(inline="always")
def sumsq16_centred(x, c, acc):
    """sum((x - c)**2) of a 1-D row in 16 stored lanes."""
    n = x.shape[0]
    m = n - n % 16
    a0, a1, a2, a3, a4, a5, a6, a7, a8, a9, a10, a11, a12, a13, a14, a15 = tiles.zeros(x)
    for i in range(0, m, 16):
        a0, a1, a2, a3, a4, a5, a6, a7, a8, a9, a10, a11, a12, a13, a14, a15 = _add(
            (a0, a1, a2, a3, a4, a5, a6, a7, a8, a9, a10, a11, a12, a13, a14, a15),
            _sq_centred(tiles.load(x[i:i + 16]), c))
    tiles.store(acc, (a0, a1, a2, a3, a4, a5, a6, a7,
                      a8, a9, a10, a11, a12, a13, a14, a15))
    for i in range(m, n):
        acc[i - m] += (x[i] - c) * (x[i] - c)
    return _tree16(acc)


@jit(inline="always")
def dot16_centred(u, w, x, c, acc):
    """sum(u * w * (x - c)) of three 1-D rows of one length in 16 stored lanes."""
    n = x.shape[0]
    m = n - n % 16
    a0, a1, a2, a3, a4, a5, a6, a7, a8, a9, a10, a11, a12, a13, a14, a15 = tiles.zeros(x)
    for i in range(0, m, 16):
        a0, a1, a2, a3, a4, a5, a6, a7, a8, a9, a10, a11, a12, a13, a14, a15 = _add(
            (a0, a1, a2, a3, a4, a5, a6, a7, a8, a9, a10, a11, a12, a13, a14, a15),
            _mul_centred(tiles.load(u[i:i + 16]), tiles.load(w[i:i + 16]),
                         tiles.load(x[i:i + 16]), c))
    tiles.store(acc, (a0, a1, a2, a3, a4, a5, a6, a7,
                      a8, a9, a10, a11, a12, a13, a14, a15))
    for i in range(m, n):
        acc[i - m] += u[i] * w[i] * (x[i] - c)
    return _tree16(acc)


@jit(inline="always")
def wsum16_centred(w, x, c, acc):
    """sum(w * (x - c)) of two 1-D rows of one length in 16 stored lanes."""
    n = x.shape[0]
    m = n - n % 16
    a0, a1, a2, a3, a4, a5, a6, a7, a8, a9, a10, a11, a12, a13, a14, a15 = tiles.zeros(x)
    for i in range(0, m, 16):
        a0, a1, a2, a3, a4, a5, a6, a7, a8, a9, a10, a11, a12, a13, a14, a15 = _add(
            (a0, a1, a2, a3, a4, a5, a6, a7, a8, a9, a10, a11, a12, a13, a14, a15),
            _wmul_centred(tiles.load(w[i:i + 16]), tiles.load(x[i:i + 16]), c))
    tiles.store(acc, (a0, a1, a2, a3, a4, a5, a6, a7,
                      a8, a9, a10, a11, a12, a13, a14, a15))
    for i in range(m, n):
        acc[i - m] += w[i] * (x[i] - c)
    return _tree16(acc)


@jit
def sum_in_order(x):
    """sum(x) of a 1-D float64 array, strictly left to right (partial sums whose order must
    not depend on the thread count)."""
    s = 0.0
    for i in range(x.shape[0]):
        s += x[i]
    return s

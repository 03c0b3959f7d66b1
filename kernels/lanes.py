"""Row reductions for the compiled kernels: sums, dot products and maxima over a 1-D row in
eight fixed lanes (element i goes to lane i % 8, the lanes are added in one fixed tree).

Without reassociation (kernels.jit never allows it) LLVM keeps a plain ``s += x[i]`` loop
sequential, one add latency per element; eight independent accumulators vectorise and keep
the order, and so the result, independent of the vector width and of how rows are split
over threads. Inline helpers: call them from ``@jit`` kernels.
"""
from __future__ import annotations

from . import fastmath
from .jit import jit

__all__ = ["row_sum", "row_dot", "row_dot_centred", "row_sumsq_centred", "row_max",
           "row_wsum_centred", "row_sqdist", "sum_in_order"]


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


@jit
def sum_in_order(x):
    """sum(x) of a 1-D float64 array, strictly left to right (partial sums whose order must
    not depend on the thread count)."""
    s = 0.0
    for i in range(x.shape[0]):
        s += x[i]
    return s

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

__all__ = ["WIDTH", "zeros", "load", "axpy", "store", "round_up"]

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

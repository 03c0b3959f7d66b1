"""Inverted dropout: keep each element with probability 1 - p and scale it by 1/(1 - p).

The uniform draws go straight into the caller's ``mask`` block by block and are turned into
{0, 1/(1-p)} in place, so nothing the size of ``x`` is allocated. Same Generator state, same
mask as ``reference.dropout_forward`` (one rng.random stream in C order). With several
blasnet threads, large arrays are pipelined: the caller draws block after block (one
Generator, in order) while pool threads finish the blocks already drawn.
"""
from __future__ import annotations

import queue

import numpy as np

from . import parallel as _par
from .gemm import check_array
from .memory import bundle, scratch

__all__ = ["dropout_forward", "dropout_backward",
           "dropout_forward_unchecked", "dropout_backward_unchecked"]

# Inline blocks: the draw, the compare/scale and x * mask touch each block while it is in L2
# (the generator dominates the time, not the block size: docs/performance.md, "Dropout").
_BLOCK_BYTES = 256 * 1024
# Pipelined blocks: long draws on the caller (GIL released) against the pool threads' four
# short passes per block.
_PIPE_BLOCK_BYTES = 1024 * 1024

def _same(a, b):
    return a is b or a.__array_interface__["data"][0] == b.__array_interface__["data"][0]


def _finish_block(of, mf, xf, i, j, p, scale, keep):
    """mask[i:j] = (u >= p) * scale from the draws u already in it; out[i:j] = x * mask."""
    mb, kb = mf[i:j], keep[:j - i]
    # u >= p in x's dtype (p is a Python float, like the reference's comparison). The bool
    # goes through copyto (0.0 / 1.0): a float out= on the comparison would make numpy
    # allocate a cast buffer. Then mask is exactly 0 or dtype(1/(1-p)).
    np.greater_equal(mb, p, kb)
    np.copyto(mb, kb)
    np.multiply(mb, scale, mb)
    np.multiply(xf[i:j], mb, of[i:j])


def _keeps(k, blk):
    """A (blk,) bool block per slot of a k-thread pipelined pass, taken on the caller."""
    return [scratch(("dropout.keep", s), blk, np.bool_) for s in range(k)]


def _forward_pipelined(of, mf, xf, p, scale, rng):
    """The caller draws every block in order into the mask (the Generator is not
    thread-safe, and one stream keeps the reference's mask) and queues it; pool threads
    finish queued blocks; once all are drawn the caller finishes what is still queued. A
    pool thread that starts late (it must wake up first, or its core is busy) just
    finishes fewer blocks."""
    dt = mf.dtype
    n = mf.size
    blk = _PIPE_BLOCK_BYTES // dt.itemsize
    drawn = queue.SimpleQueue()  # start index of each drawn block, then one end mark (None)
    put = drawn.put
    k = _par.threads_for(n)
    keeps = bundle(("dropout.keeps", k, blk), _keeps, k, blk)

    def finish(keep):
        while True:
            i = drawn.get()  # waits with the GIL released
            if i is None:
                put(None)    # pass the end mark on to the next finisher
                return
            _finish_block(of, mf, xf, i, min(i + blk, n), p, scale, keep)

    def run(_i0, _i1, slot):
        if slot:
            finish(keeps[slot])
            return
        random = rng.random
        try:
            for i in range(0, n, blk):
                random(out=mf[i:i + blk], dtype=dt)
                put(i)
        finally:
            put(None)  # also on error: the pool threads finish what is queued and stop
        finish(keeps[0])
    _par.split(run, n, k=k)


def dropout_forward_unchecked(out, mask, x, p, rng):
    """``dropout_forward`` without argument checks (hot path): the caller guarantees
    C-contiguous ``out``, ``mask``, ``x`` of one shape and float dtype, ``mask`` not
    overlapping the others, a Python float ``0 <= p < 1`` and a ``numpy.random.Generator``."""
    if p == 0.0:  # identity; the generator is not advanced (the reference would draw)
        if not _same(out, x):
            np.copyto(out, x)
        mask.fill(1.0)
        return out
    dt = x.dtype
    scale = 1.0 / (1.0 - p)
    n = x.size
    step = max(1, _BLOCK_BYTES // dt.itemsize)
    ge, mul, copyto, random = np.greater_equal, np.multiply, np.copyto, rng.random
    if n <= step:  # one block: no flattening or slicing (small arrays are call-bound)
        keep = scratch("dropout.keep", x.shape, np.bool_)
        random(out=mask, dtype=dt)
        ge(mask, p, out=keep)
        copyto(mask, keep)
        mul(mask, scale, out=mask)
        mul(x, mask, out=out)
        return out
    xf, mf, of = x.reshape(-1), mask.reshape(-1), out.reshape(-1)  # views (C-contiguous)
    if _par.threads_for(n) > 1:
        _forward_pipelined(of, mf, xf, p, scale, rng)
        return out
    keep = scratch("dropout.keep", step, np.bool_)
    for i in range(0, n, step):
        # Block draws continue one stream: the concatenation equals rng.random(x.shape, dtype).
        random(out=mf[i:i + step], dtype=dt)       # u ~ U[0, 1)
        _finish_block(of, mf, xf, i, min(i + step, n), p, scale, keep)
    return out


def dropout_backward_unchecked(dx, dout, mask):
    """``dx = dout * mask`` (one streaming pass; no checks)."""
    return np.multiply(dout, mask, out=dx)


def _check_alias(out_name, out, in_name, x):
    if np.may_share_memory(out, x) and not (out.shape == x.shape and _same(out, x)):
        raise ValueError(f"{out_name}: must be {in_name} itself or not overlap it")


def dropout_forward(out, mask, x, p, rng):
    """Inverted dropout: ``mask = (u >= p) / (1 - p)`` with ``u ~ rng.random`` (values 0 or
    1/(1-p), kept with probability 1 - p), ``out = x * mask``; returns ``out``.

    ``out``, ``mask`` and ``x`` are C-contiguous float32/float64 arrays of one shape and
    dtype; ``out`` may be ``x`` itself. ``p`` must be in [0, 1). For the same Generator state
    the mask equals ``reference.dropout_forward``'s. ``p == 0`` copies x (unless out is x),
    fills mask with 1 and does not draw from ``rng``.
    """
    check_array("x", x)
    check_array("out", out, dtype=x.dtype, shape=x.shape)
    check_array("mask", mask, dtype=x.dtype, shape=x.shape)
    if isinstance(p, bool) or not isinstance(p, (int, float, np.integer, np.floating)):
        raise TypeError(f"p: expected a real number in [0, 1), got {type(p).__name__}")
    p = float(p)
    if not 0.0 <= p < 1.0:
        raise ValueError(f"p: expected 0 <= p < 1, got {p}")
    if not isinstance(rng, np.random.Generator):
        raise TypeError(f"rng: expected a numpy.random.Generator, got {type(rng).__name__}")
    if np.may_share_memory(mask, x) or np.may_share_memory(mask, out):
        raise ValueError("mask: must not overlap x or out (it is written before x is read)")
    _check_alias("out", out, "x", x)
    return dropout_forward_unchecked(out, mask, x, p, rng)


def dropout_backward(dx, dout, mask):
    """``dx = dout * mask`` with the forward's mask; returns ``dx``, which may be ``dout``."""
    check_array("dout", dout)
    check_array("dx", dx, dtype=dout.dtype, shape=dout.shape)
    check_array("mask", mask, dtype=dout.dtype, shape=dout.shape)
    _check_alias("dx", dx, "dout", dout)
    _check_alias("dx", dx, "mask", mask)
    return np.multiply(dout, mask, out=dx)

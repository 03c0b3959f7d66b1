"""Inverted dropout: keep each element with probability 1 - p and scale it by 1/(1 - p).

The uniform draws go straight into the caller's ``mask`` (one ``rng.random`` call, C order:
the stream, and so the mask, of ``reference.dropout_forward``); one compiled pass then turns
them into {0, 1/(1-p)} and writes ``out = x * mask``, split over blasnet's threads when
large. Nothing the size of ``x`` is allocated. The generator's draw is most of the time: a
Generator is not thread-safe, and drawing in pieces on several would change the stream.
"""
from __future__ import annotations

import numpy as np

from . import parallel as _par
from .gemm import check_array
from .jit import jit

__all__ = ["dropout_forward", "dropout_backward",
           "dropout_forward_unchecked", "dropout_backward_unchecked"]

# Relative cost per element for kernels.parallel.threads_for (a copy is 1).
COST = 1


def _same(a, b):
    return a is b or a.__array_interface__["data"][0] == b.__array_interface__["data"][0]


@jit
def _apply(out, mask, x, p, scale, i0, i1):
    """mask = scale where the draw u in mask is >= p, else 0; out = x * mask (out may be x)."""
    out, mask, x = out[i0:i1], mask[i0:i1], x[i0:i1]
    zero = scale - scale
    if out.ctypes.data == x.ctypes.data:  # one name for in-place memory: vectorises
        for i in range(i1 - i0):
            m = scale if mask[i] >= p else zero
            mask[i] = m
            x[i] *= m
    else:
        for i in range(i1 - i0):
            m = scale if mask[i] >= p else zero
            mask[i] = m
            out[i] = x[i] * m
    return 0


@jit
def _mul(out, a, b, i0, i1):
    out, a, b = out[i0:i1], a[i0:i1], b[i0:i1]
    if out.ctypes.data == a.ctypes.data:  # one name for in-place memory: vectorises
        for i in range(i1 - i0):
            a[i] *= b[i]
    else:
        for i in range(i1 - i0):
            out[i] = a[i] * b[i]
    return 0


def _flat_run(kernel, n, args):
    """``kernel(*args, i0, i1)`` over n flat elements, split over threads when large."""
    k = _par.threads_for(n, passes=COST)
    if k == 1:
        kernel(*args, 0, n)
    else:
        _par.split(lambda i0, i1, _: kernel(*args, i0, i1), n, k=k)


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
    rng.random(out=mask, dtype=dt)                 # u ~ U[0, 1), the reference's stream
    # u >= p and the scale in x's dtype, as the reference's comparison and product round.
    t = dt.type
    _flat_run(_apply, x.size, (out.reshape(-1), mask.reshape(-1), x.reshape(-1), t(p),
                               t(1.0 / (1.0 - p))))
    return out


def dropout_backward_unchecked(dx, dout, mask):
    """``dx = dout * mask`` (one pass; no checks)."""
    _flat_run(_mul, dx.size, (dx.reshape(-1), dout.reshape(-1), mask.reshape(-1)))
    return dx


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
    return dropout_backward_unchecked(dx, dout, mask)

"""The gMLP gating pair (Liu et al. 2021, "Pay Attention to MLPs"): A = sigmoid(Zg) * P and
its backward, on flat arrays, in L2-sized blocks, split over blasnet's threads when large.

The inputs arrive halved (the GEMM that makes them runs with alpha=0.5): with
sigmoid(z) = (1 + tanh(z/2)) / 2, A = (1 + tanh(Zg/2)) * (P/2) is three passes, and the
backward's factors of 2 go to the alphas of the GEMMs that read its results.
"""
from __future__ import annotations

import numpy as np

from . import parallel as _par

__all__ = ["gate_forward", "gate_backward"]

# Bytes per operand block: the ~4 operands of a block stay in L2 while the chain runs.
_BLOCK_BYTES = 128 * 1024
# Split blocks are larger: each ufunc call takes the GIL back (kernels.parallel).
_SPLIT_BLOCK_BYTES = 512 * 1024
# (1, 2) as 0-d arrays per dtype: a Python float operand is converted on every ufunc call.
_CONST = {np.dtype(t): (np.array(1.0, t), np.array(2.0, t)) for t in (np.float32, np.float64)}


def _fwd_blocks(a, g, p, blk):
    one = _CONST[g.dtype][0]
    for i in range(0, g.shape[0], blk):
        j = i + blk
        gb = g[i:j]
        np.tanh(gb, gb)      # SIMD tanh; no overflow for any |z| (unlike exp)
        np.add(gb, one, gb)
        np.multiply(gb, p[i:j], a[i:j])


def _bwd_blocks(g, p, da, blk):
    two = _CONST[g.dtype][1]
    for i in range(0, g.shape[0], blk):
        j = i + blk
        gb, pb, db = g[i:j], p[i:j], da[i:j]
        np.multiply(db, gb, db)  # 2 dP = dA S
        np.multiply(pb, db, pb)  # (P/2) dA S
        np.subtract(two, gb, gb)
        np.multiply(gb, pb, gb)  # 2 dZg
        np.copyto(pb, db)        # 2 dP


# Ufunc passes per element, tanh counted as the three it costs (kernels.parallel.threads_for).
_PASSES = 5


def _run(fn, arrays):
    n = arrays[0].shape[0]
    k = _par.threads_for(n, passes=_PASSES)
    if k == 1:
        fn(*arrays, _BLOCK_BYTES // arrays[0].itemsize)
        return
    blk = _SPLIT_BLOCK_BYTES // arrays[0].itemsize
    _par.split(lambda i, j, _: fn(*[x[i:j] for x in arrays], blk), n, k=k)


def gate_forward(a, g, p):
    """``(g, p) = (Zg/2, P/2)`` -> ``g = S = 1 + tanh(Zg/2) = 2 sigmoid(Zg)`` in place and
    ``a = S * P/2 = sigmoid(Zg) * P``. Flat 1-D arrays of one size and dtype (no checks)."""
    _run(_fwd_blocks, (a, g, p))
    return a


def gate_backward(g, p, da):
    """In place ``(g, p, da) = (S, P/2, dA)`` -> ``(2 dZg, 2 dP, dead)`` with
    ``dP = dA * sigmoid(Zg)`` and ``dZg = dA * P * sigmoid'(Zg)``: the GEMMs that read the
    results take alpha = 0.5. Flat 1-D arrays of one size and dtype, no scratch (no checks)."""
    _run(_bwd_blocks, (g, p, da))
    return g

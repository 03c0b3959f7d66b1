"""The gMLP gating pair (Liu et al. 2021, "Pay Attention to MLPs"): A = sigmoid(Zg) * P and
its backward, on flat arrays, one compiled pass each (kernels.jit), split over blasnet's
threads when large.

The inputs arrive halved (the GEMM that makes them runs with alpha=0.5): the forward turns
g = Zg/2 into S = 2 sigmoid(Zg) in place and writes A = S * (P/2); the backward's factors of
2 go to the alphas of the GEMMs that read its results. float32 uses the vectorised sigmoid of
kernels.fastmath.
"""
from __future__ import annotations

from . import fastmath
from . import parallel as _par
from .jit import jit

__all__ = ["gate_forward", "gate_backward"]

# Relative cost per element for kernels.parallel.threads_for (a copy is 1), from where two
# threads overtook one (docs/performance.md, "Split thresholds"): the forward's sigmoid is
# compute-bound, the backward a stream.
FWD_COST = 4
BWD_COST = 2


@jit
def _fwd(a, g, p, i0, i1):
    a, g, p = a[i0:i1], g[i0:i1], p[i0:i1]  # indices from 0: vectorises
    for i in range(i1 - i0):
        s = fastmath.sigmoid(g[i] + g[i])
        s = s + s                           # S = 2 sigmoid(Zg), exact doubling
        g[i] = s
        a[i] = s * p[i]                     # sigmoid(Zg) P
    return 0


@jit
def _bwd(g, p, da, i0, i1):
    g, p, da = g[i0:i1], p[i0:i1], da[i0:i1]
    for i in range(i1 - i0):
        s = g[i]
        ds = da[i] * s                      # 2 dP = dA S
        g[i] = (fastmath.const(2, s) - s) * (p[i] * ds)        # 2 dZg = dA (P/2) S (2 - S)
        p[i] = ds
    return 0


def _run(kernel, a, b, c, cost):
    n = a.shape[0]
    k = _par.threads_for(n, passes=cost)
    if k == 1:
        kernel(a, b, c, 0, n)
    else:
        _par.split(lambda i0, i1, _: kernel(a, b, c, i0, i1), n, k=k)


def gate_forward(a, g, p):
    """``(g, p) = (Zg/2, P/2)`` -> ``g = S = 2 sigmoid(Zg)`` in place and
    ``a = S * P/2 = sigmoid(Zg) * P``. Contiguous 1-D arrays of one size and dtype (no
    checks)."""
    _run(_fwd, a, g, p, FWD_COST)
    return a


def gate_backward(g, p, da):
    """In place ``(g, p, da) = (S, P/2, dA)`` -> ``(2 dZg, 2 dP, dA)`` with
    ``dP = dA * sigmoid(Zg)`` and ``dZg = dA * P * sigmoid'(Zg)``: the GEMMs that read the
    results take alpha = 0.5. Contiguous 1-D arrays of one size and dtype (no checks)."""
    _run(_bwd, g, p, da, BWD_COST)
    return g

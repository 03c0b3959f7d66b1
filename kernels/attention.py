"""Layout and masking passes of multi-head scaled dot-product attention (Vaswani et al. 2017).

The per-head products ``S = q k^T`` and ``O = P v`` go to BLAS one (batch, head) at a time,
and scipy's wrappers copy any operand that is not contiguous (a head's q is a column slice
of the QKV projection). So the projection's (B, T, 3, h, d_head) output is moved once into
head-major (3, B, h, T, d_head) buffers (``heads_split``), where every head is a contiguous
(T, d_head) matrix, and the heads' outputs are moved back to (B, T, h, d_head) rows for the
output projection (``heads_merge``). ``causal_fill`` writes a value (``-inf`` before the
softmax) above the diagonal of each (T, T) score matrix.
"""
from __future__ import annotations

import numpy as np

from .gemm import check_array
from .jit import jit

__all__ = ["heads_split", "heads_merge", "causal_fill", "heads_split_unchecked",
           "heads_merge_unchecked", "causal_fill_unchecked"]


@jit
def _split(out, x):
    # x (B, T, M, H, D) -> out (M, B, H, T, D); the inner D loop is contiguous on both sides.
    nb, nt, nm, nh, nd = x.shape
    for b in range(nb):
        for t in range(nt):
            for m in range(nm):
                for h in range(nh):
                    for j in range(nd):
                        out[m, b, h, t, j] = x[b, t, m, h, j]


@jit
def _merge(out, x):
    # x (M, B, H, T, D) -> out (B, T, M, H, D)
    nm, nb, nh, nt, nd = x.shape
    for b in range(nb):
        for t in range(nt):
            for m in range(nm):
                for h in range(nh):
                    for j in range(nd):
                        out[b, t, m, h, j] = x[m, b, h, t, j]


@jit
def _causal_fill(s, value):
    # s (P, T, T): entries (i, j > i) of every matrix; row i keeps its first i + 1 entries.
    npl, nt = s.shape[0], s.shape[1]
    for p in range(npl):
        for i in range(nt - 1):
            for j in range(i + 1, nt):
                s[p, i, j] = value


# ----------------------------------------------------------------------------- unchecked cores
def heads_split_unchecked(out, x, n_heads):
    """``out[m, b, h, t, :] = x[b, t, m*d + h*dh : ...]``: C-contiguous ``x`` (B, T, M*d) with
    d = n_heads * dh into C-contiguous ``out`` (M, B, n_heads, T, dh) (no checks)."""
    m, b, h, t, dh = out.shape
    _split(out, x.reshape(b, t, m, h, dh))
    return out


def heads_merge_unchecked(out, x):
    """The inverse of ``heads_split``: C-contiguous ``x`` (M, B, H, T, dh) into C-contiguous
    ``out`` (B, T, M*H*dh) (no checks)."""
    m, b, h, t, dh = x.shape
    _merge(out.reshape(b, t, m, h, dh), x)
    return out


def causal_fill_unchecked(s, value):
    """``s[p, i, j] = value`` for every j > i of a C-contiguous (P, T, T) ``s`` (no checks)."""
    if s.shape[0] and s.shape[1] > 1:
        _causal_fill(s, s.dtype.type(value))
    return s


# ----------------------------------------------------------------------------- checked API
def _heads_shapes(name_out, out, name_x, x, n):
    check_array(name_out, out, ndim=5)
    check_array(name_x, x, ndim=3, dtype=out.dtype)
    m, b, h, t, dh = out.shape
    if x.shape != (b, t, m * h * dh):
        raise ValueError(f"{name_x}: expected shape {(b, t, m * h * dh)} for {name_out} of "
                         f"shape {out.shape}, got {x.shape}")
    if np.may_share_memory(out, x):
        raise ValueError(f"{name_out}: must not overlap {name_x}")


def heads_split(out, x, n_heads):
    """Move the per-head column blocks of ``x`` (B, T, M*d), d = n_heads * dh (M = 3 for a
    fused [q | k | v] projection), into head-major ``out`` (M, B, n_heads, T, dh), where
    each (T, dh) head is contiguous. Returns ``out``."""
    if not isinstance(out, np.ndarray) or out.ndim != 5 or out.shape[2] != n_heads:
        raise ValueError(f"out: expected a 5-D array (M, B, {n_heads}, T, dh), got "
                         f"{getattr(out, 'shape', type(out).__name__)}")
    _heads_shapes("out", out, "x", x, n_heads)
    return heads_split_unchecked(out, x, n_heads)


def heads_merge(out, x):
    """Move head-major ``x`` (M, B, H, T, dh) back to rows ``out`` (B, T, M*H*dh). Returns
    ``out``."""
    _heads_shapes("x", x, "out", out, x.shape[2] if getattr(x, "ndim", 0) == 5 else 0)
    return heads_merge_unchecked(out, x)


def causal_fill(s, value=-np.inf):
    """Set every entry above the diagonal of each (T, T) matrix of ``s`` (P, T, T) to
    ``value``: the positions a causal query may not attend to. Returns ``s``."""
    check_array("s", s, ndim=3)
    if s.shape[1] != s.shape[2]:
        raise ValueError(f"s: expected square (P, T, T) matrices, got shape {s.shape}")
    return causal_fill_unchecked(s, value)

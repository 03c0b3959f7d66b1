"""Gated linear units (Shazeer 2020, "GLU Variants Improve Transformer") on transposed
activations, and the per-feature helpers of a transposed layout.

A gated FFN computes its gate and up projections in one GEMM into ``[G; U]`` of shape
(2 d_ff, N), features by rows: each half is then one contiguous (d_ff, N) array, so the
gating is one compiled pass over flat elements. ``glu_forward`` computes ``H = act(G) * U`` and leaves in G and U
what the backward multiplies by (``act'(G) * U`` and ``act(G)``), so ``glu_backward`` is two
multiplies. In this layout a bias is per row: ``fill_by_row`` writes it before the GEMM
accumulates, ``rowsum`` adds its gradient (one gemv).
"""
from __future__ import annotations

import numpy as np
from scipy.linalg import blas as _blas

from .activations import ACTIVATIONS, kernels_for
from .gemm import check_array
from .jit import jit
from .memory import ones as _ones
from .parallel import split as _split
from .parallel import threads_for as _threads_for

__all__ = ["glu_forward", "glu_backward", "fill_by_row", "rowsum", "glu_forward_unchecked",
           "glu_backward_unchecked", "fill_by_row_unchecked", "rowsum_unchecked"]

_GEMV = {np.dtype(np.float32): _blas.sgemv, np.dtype(np.float64): _blas.dgemv}


@jit
def _glu_backward(g, u, dh, i0, i1, slope):
    """g *= dh and u *= dh, flat elements [i0, i1)."""
    # sliced first: indices from 0 vectorise (an index from i0 may be negative to LLVM)
    gf, uf, df = g.reshape(-1)[i0:i1], u.reshape(-1)[i0:i1], dh.reshape(-1)[i0:i1]
    for k in range(i1 - i0):
        w = df[k]
        gf[k] = gf[k] * w
        uf[k] = uf[k] * w


def _flat(kern, size, slope, *arrays):
    """``kern(*arrays, i0, i1, slope)`` over flat elements [0, size), split over blasnet's
    threads when large (every element is computed alike: the split does not change results)."""
    k = _threads_for(size)
    if k <= 1:
        kern(*arrays, 0, size, slope)
    else:
        _split(lambda i0, i1, s: kern(*arrays, i0, i1, slope), size, k=k)


# ----------------------------------------------------------------------------- unchecked cores
def glu_forward_unchecked(h, g, u, act="silu", negative_slope=0.01):
    """``h = act(g) * u``; then ``g = act'(g) * u`` and ``u = act(g)`` in place (the factors of
    the backward), in one pass. C-contiguous arrays of one shape and dtype, ``h`` distinct from
    both; no checks."""
    if g.size:
        _flat(kernels_for(act, g.dtype).glu, g.size, negative_slope, h, g, u)
    return h


def glu_backward_unchecked(g, u, dh):
    """In place: ``g *= dh`` and ``u *= dh``, turning the factors left by ``glu_forward`` into
    ``dG = dh * act'(G) * U`` and ``dU = dh * act(G)``, in one pass. C-contiguous, one shape;
    no checks."""
    if g.size:
        _flat(_glu_backward, g.size, 0.0, g, u, dh)
    return g


def fill_by_row(out, v):
    """``out[i, :] = v[i]`` for a C-contiguous (M, N) ``out`` and ``v`` of shape (M,) (checked)."""
    check_array("out", out, ndim=2)
    check_array("v", v, dtype=out.dtype, shape=(out.shape[0],))
    if np.may_share_memory(out, v):
        raise ValueError("v: must not overlap out")
    return fill_by_row_unchecked(out, v)


def fill_by_row_unchecked(out, v):
    """``fill_by_row`` without checks (a broadcast copy: no iterator buffer)."""
    np.copyto(out, v[:, None])
    return out


def rowsum_unchecked(out, x, beta=1.0):
    """``out = x.sum(axis=1) + beta * out`` for a C-contiguous (M, N) ``x`` through gemv with a
    ones vector (no checks)."""
    m, n = x.shape
    if m == 0:
        return out
    if n == 0:
        if beta == 0.0:
            out.fill(0.0)
        elif beta != 1.0:
            np.multiply(out, beta, out=out)
        return out
    # x.T is Fortran (N, M); trans=1 gives (x.T).T @ ones = x @ ones.
    _GEMV[x.dtype](1.0, x.T, _ones(n, x.dtype), beta, out, 0, 1, 0, 1, 1, 1)
    return out


# ----------------------------------------------------------------------------- checked API
def _same_shape(names, arrays):
    check_array(names[0], arrays[0])
    for name, a in zip(names[1:], arrays[1:]):
        check_array(name, a, dtype=arrays[0].dtype, shape=arrays[0].shape)
    for i in range(len(arrays)):
        for j in range(i + 1, len(arrays)):
            if np.may_share_memory(arrays[i], arrays[j]):
                raise ValueError(f"{names[i]}, {names[j]}: must not overlap")


def glu_forward(h, g, u, act="silu", negative_slope=0.01):
    """The GLU forward on pre-activations ``g`` (gate) and ``u`` (up), C-contiguous arrays of
    one shape and float dtype: ``h = act(g) * u``; ``g`` becomes ``act'(g) * u`` and ``u``
    becomes ``act(g)``, what ``glu_backward`` needs. ``act`` is any registered activation
    (silu: SwiGLU, gelu: GEGLU, relu: ReGLU, sigmoid: GLU, identity: bilinear). Returns h."""
    _same_shape(("g", "u", "h"), (g, u, h))
    if not isinstance(act, str) or act not in ACTIVATIONS:
        raise ValueError(f"act: expected one of {ACTIVATIONS}, got {act!r}")
    return glu_forward_unchecked(h, g, u, act, float(negative_slope))


def glu_backward(g, u, dh):
    """The GLU backward in place over the factors ``glu_forward`` left in ``g`` and ``u``:
    ``g = dh * act'(G) * U`` (the gate's gradient), ``u = dh * act(G)`` (the up
    projection's). Returns g."""
    _same_shape(("g", "u", "dh"), (g, u, dh))
    return glu_backward_unchecked(g, u, dh)


def rowsum(out, x, beta=1.0):
    """``out = x.sum(axis=1) + beta * out`` for a C-contiguous (M, N) ``x`` and (M,) ``out``
    (the gradient of a per-row bias accumulates with beta=1). Returns out."""
    check_array("x", x, ndim=2)
    check_array("out", out, dtype=x.dtype, shape=(x.shape[0],))
    if np.may_share_memory(out, x):
        raise ValueError("out: must not overlap x")
    return rowsum_unchecked(out, x, float(beta))

"""Layout and gating passes of the gMLP spatial gating unit (Liu et al. 2021, "Pay Attention
to MLPs"), whose token mixing ``S_b = W V'_b + b`` is one GEMM over all B sequences when V'
is kept time-major: as (T, B * c), ``S = W V'`` is a plain (T, T) x (T, B c) product.

Blocks hold activations batch-major, (B, T, c). ``swap01`` moves between the two orders;
``sgu_gate_forward`` / ``sgu_gate_backward`` compute ``A = U * S`` and its gradients where U
is the first half of the block's (B, T, 2c) activations and S arrives time-major. Every
layout change is an ``np.copyto`` from a strided view: NumPy copies those without a buffer,
whereas a ufunc with a strided operand allocates one per call (and runs several times
slower). The gating passes are compiled (kernels.jit): one pass over the (B, T) rows reads
S time-major (the GEMM's output, its bias added on the fly) and U strided and writes A; the
backward reads S where it lies and overwrites it with dS, adding it into per-block sums
for the bias gradient. Rows are split over blasnet's threads when large (every row alone,
and the bias gradient summed in blocks of batch elements fixed by the shape: results do not
depend on the split). ``causal_weight`` / ``causal_grad_add`` apply the lower-triangular
mask of a causal unit to W and to its gradient.
"""
from __future__ import annotations

import numpy as np

from . import fastmath, lanes
from . import parallel as _par
from .gemm import check_array
from .jit import jit
from .memory import scratch

__all__ = ["swap01", "sgu_gate_forward", "sgu_gate_backward", "causal_weight",
           "causal_grad_add", "swap01_unchecked", "sgu_gate_forward_unchecked",
           "sgu_gate_backward_unchecked", "causal_weight_unchecked",
           "causal_grad_add_unchecked"]


# ----------------------------------------------------------------------------- unchecked cores
def swap01_unchecked(out, x):
    """``out[i, j] = x[j, i]`` for a (P, Q, c) ``out`` and a (Q, P, c) ``x``, both of any
    strides (no checks)."""
    np.copyto(out, x.transpose(1, 0, 2))
    return out


# Relative cost per element for kernels.parallel.threads_for (a copy is 1). Inside a step
# these passes read the rows the forward wrote long before, from memory, and two threads
# beat one from 256 Ki elements (docs/performance.md, "Split thresholds"), though on data
# already in cache they do not.
COST = 8


@jit
def _gate_fwd(a, s_tm, bias, u, r0, r1):
    # a: (B*T, c); s_tm: (T, B, c) S before its bias; bias: (T,); u: (B*T, >= c) rows with
    # contiguous columns
    t_len, c = s_tm.shape[0], a.shape[1]
    for r in range(r0, r1):
        b, t = r // t_len, r % t_len
        ar, st, ur, bt = a[r], s_tm[t, b], u[r], bias[t]
        for j in range(c):
            ar[j] = ur[j] * (st[j] + bt)
    return 0


@jit(inline="always")
def _gate_bwd_row(dur, dsr, pt, dar, ur, bt):
    # one row: dS = da * u over S (+ its bias), into the block sum; dU = da * S. ``dur`` may
    # be ``ur`` itself (the caller passes the same name then: one name vectorises)
    for j in range(dar.shape[0]):
        g, sj = dar[j], dsr[j] + bt
        ds = g * ur[j]
        dsr[j] = ds
        pt[j] += ds
        dur[j] = g * sj


@jit
def _gate_bwd(du, s_tm, part, da, bias, u, per, k0, k1):
    # s_tm: (T, B, c) S before its bias in, dS out; du, u: (B*T, >= c) rows with contiguous
    # columns (du may be u); da: (B*T, c). Batch elements in blocks of ``per``, blocks k0..k1:
    # part[k, t] = dS[t, b] summed over the b of block k, in order (elementwise: vectorises)
    t_len, b_len, c = s_tm.shape
    same = du.ctypes.data == u.ctypes.data    # one name for in-place memory: vectorises
    zero = fastmath.const(0, da)
    for k in range(k0, k1):
        pk = part[k]
        for t in range(t_len):
            pt = pk[t]
            for j in range(c):
                pt[j] = zero
        for b in range(k * per, min(b_len, (k + 1) * per)):
            for t in range(t_len):
                r = b * t_len + t
                dsr, dar, ur, bt, pt = s_tm[t, b], da[r], u[r], bias[t], pk[t]
                if same:
                    _gate_bwd_row(ur, dsr, pt, dar, ur, bt)
                else:
                    _gate_bwd_row(du[r], dsr, pt, dar, ur, bt)
    return 0


@jit(slp=True)
def _bias_from_blocks(dbias, part):
    # dbias[t] += the sums of part[k, t] over the channels, added over the blocks in order
    for t in range(dbias.shape[0]):
        acc = fastmath.const(0, dbias)
        for k in range(part.shape[0]):
            acc += lanes.row_sum(part[k, t])
        dbias[t] += acc
    return 0


def _rows_view(x):
    """A (B, T, c) array whose rows are contiguous and evenly spaced (a column slice of a
    C-contiguous (B, T, w) array, as the block's U half) as a C-contiguous (B*T, S) view
    over the same memory, S the row stride in elements (the kernels read its first c
    columns only); None for other layouts."""
    b, t, c = x.shape
    isz = x.itemsize
    s0, s1, s2 = x.strides
    if (c > 1 and s2 != isz) or s1 % isz or (b > 1 and s0 != t * s1) or s1 < c * isz:
        return None
    return np.lib.stride_tricks.as_strided(x, (b * t, s1 // isz), (s1, isz))


def _rows(kernel, b, t, c, args):
    n = b * t
    if n == 0 or c == 0:
        return
    k = _par.threads_for(n, c, passes=COST)
    if k == 1:
        kernel(*args, 0, n)
    else:
        _par.split(lambda r0, r1, _: kernel(*args, r0, r1), n, c, k=k)


def sgu_gate_forward_unchecked(a, s_tm, bias, u):
    """``a = u * (swap01(s_tm) + bias)``: ``a`` C-contiguous (B, T, c), ``s_tm`` C-contiguous
    (T, B, c) holding S = W V' without its bias, ``bias`` (T,) added to every row of time t,
    ``u`` (B, T, c) of any strides (fastest with rows of contiguous columns, as a column half
    of a C-contiguous array: other layouts are read through a copy). No checks."""
    b, t, c = a.shape
    if b * t and c:
        u2 = _rows_view(u)
        if u2 is None:  # another layout (not the block's): a contiguous copy to read
            u2 = np.ascontiguousarray(u).reshape(b * t, c)
        _rows(_gate_fwd, b, t, c, (a.reshape(b * t, c), s_tm, bias, u2))
    return a


def sgu_gate_backward_unchecked(du, s_tm, dbias, tmp, da, bias, u):
    """The gradients of ``A = U * S``, S = swap01(s_tm) + bias, for ``da`` = dL/dA: ``s_tm``
    (T, B, c) holds S without its bias on entry and dS = swap01(da * u) on return; ``du``
    (B, T, c) = da * S; ``dbias`` (T,) += dS summed over the batch and the channels (over
    blocks of about B/8 batch elements first, elementwise, then each block's channels).
    ``tmp`` (B, T, c) is scratch, used only for a ``du`` whose rows are not evenly spaced
    contiguous columns; ``da`` C-contiguous; ``du`` may be the very view ``u`` was (it is
    read first). No checks."""
    b, t, c = da.shape
    if b * t and c:
        u2, du2 = _rows_view(u), _rows_view(du)
        if u2 is None:  # other layouts (not the block's): through contiguous buffers
            u2 = np.ascontiguousarray(u).reshape(b * t, c)
        out = du2 if du2 is not None else tmp.reshape(b * t, c)
        # the bias gradient's partial sums: blocks of batch elements fixed by B alone (about
        # eight), so the order of additions does not depend on the thread count
        per = max(1, b // 8)
        nk = -(-b // per)
        part = scratch("token_mix.block_sums", (nk, t, c), da.dtype)   # (blocks, T, c)
        args = (out, s_tm, part, da.reshape(b * t, c), bias, u2, per)
        k = min(_par.threads_for(b * t, c, passes=COST), nk)
        if k == 1:
            _gate_bwd(*args, 0, nk)
        else:
            _par.split(lambda k0, k1, _: _gate_bwd(*args, k0, k1), nk, per * t * c, k=k)
        if du2 is None:
            np.copyto(du, tmp)
        _bias_from_blocks(dbias, part)
    return s_tm


def causal_weight_unchecked(out, w, mask):
    """``out = w * mask`` for a C-contiguous (T, T) ``out`` and ``mask`` (lower-triangular
    ones) and a (T, T) ``w`` of any strides (no checks)."""
    np.copyto(out, w)
    np.multiply(out, mask, out=out)
    return out


def causal_grad_add_unchecked(dw, g, mask):
    """``g *= mask``, then ``dw += g`` (no checks): the masked entries of W never receive a
    gradient."""
    np.multiply(g, mask, out=g)
    np.add(dw, g, out=dw)
    return dw


# ----------------------------------------------------------------------------- checked API
def _check3(name, a, dtype=None, shape=None, contiguous=True):
    if not isinstance(a, np.ndarray):
        raise TypeError(f"{name}: expected a numpy.ndarray, got {type(a).__name__}")
    if contiguous:
        check_array(name, a, ndim=3, dtype=dtype, shape=shape)
        return
    if dtype is not None and a.dtype != dtype:
        raise TypeError(f"{name}: expected dtype {np.dtype(dtype)}, got {a.dtype}")
    if a.ndim != 3 or (shape is not None and a.shape != tuple(shape)):
        raise ValueError(f"{name}: expected shape {shape}, got {a.shape}")


def _disjoint(pairs):
    for (na, a), (nb, b) in pairs:
        if np.may_share_memory(a, b):
            raise ValueError(f"{na}: must not overlap {nb}")


def swap01(out, x):
    """Swap the two leading axes: ``out[i, j, :] = x[j, i, :]`` for a (Q, P, c) ``x`` into a
    (P, Q, c) ``out``; either may be strided (e.g. a column half of a larger array).
    Returns out."""
    _check3("x", x, contiguous=False)
    q, p, c = x.shape
    _check3("out", out, x.dtype, (p, q, c), contiguous=False)
    _disjoint([(("out", out), ("x", x))])
    return swap01_unchecked(out, x)


def _check_bias(name, bias, t, dtype):
    check_array(name, bias, ndim=1, dtype=dtype, shape=(t,))


def sgu_gate_forward(a, s_tm, bias, u):
    """The gating of the spatial gating unit: ``a = u * S`` with S = W V' + bias given as
    ``s_tm`` (T, B, c), time-major and without its bias, and ``bias`` (T,). ``u`` (B, T, c)
    may be strided. Returns a."""
    _check3("s_tm", s_tm)
    t, b, c = s_tm.shape
    dt = s_tm.dtype
    _check3("a", a, dt, (b, t, c))
    _check_bias("bias", bias, t, dt)
    _check3("u", u, dt, (b, t, c), contiguous=False)
    _disjoint([(("a", a), ("s_tm", s_tm)), (("a", a), ("u", u)), (("a", a), ("bias", bias))])
    return sgu_gate_forward_unchecked(a, s_tm, bias, u)


def sgu_gate_backward(du, s_tm, dbias, tmp, da, bias, u):
    """The backward of ``A = U * S``, S = swap01(s_tm) + bias: ``s_tm`` (T, B, c) holds S
    without its bias on entry and dS = (da * u) time-major on return; ``du`` (B, T, c, may
    be strided, may be u's view itself) = da * S; ``dbias`` (T,) += dS summed over batch and
    channels; ``tmp`` (B, T, c) is scratch. Returns s_tm (now dS)."""
    _check3("da", da)
    b, t, c = da.shape
    dt = da.dtype
    _check3("tmp", tmp, dt, (b, t, c))
    _check3("s_tm", s_tm, dt, (t, b, c))
    _check_bias("bias", bias, t, dt)
    _check_bias("dbias", dbias, t, dt)
    for name, arr in (("du", du), ("u", u)):
        _check3(name, arr, dt, (b, t, c), contiguous=False)
    arrays = [("du", du), ("s_tm", s_tm), ("tmp", tmp), ("da", da), ("dbias", dbias)]
    _disjoint([(arrays[i], arrays[j]) for i in range(5) for j in range(i + 1, 5)]
              + [(("s_tm", s_tm), ("u", u)), (("tmp", tmp), ("u", u)),
                 (("dbias", dbias), ("u", u)), (("dbias", dbias), ("bias", bias)),
                 (("s_tm", s_tm), ("bias", bias)), (("du", du), ("bias", bias))])
    return sgu_gate_backward_unchecked(du, s_tm, dbias, tmp, da, bias, u)


def causal_weight(out, w, mask):
    """``out = w * mask``: the token-mixing weight with its masked entries zeroed. ``out`` and
    ``mask`` C-contiguous (T, T); ``w`` (T, T) may be a strided corner of a larger W. Returns
    out."""
    check_array("out", out, ndim=2)
    check_array("mask", mask, dtype=out.dtype, shape=out.shape)
    if not isinstance(w, np.ndarray) or w.dtype != out.dtype or w.shape != out.shape:
        raise ValueError(f"w: expected a {out.dtype} array of shape {out.shape}, got "
                         f"{getattr(w, 'dtype', type(w).__name__)} {getattr(w, 'shape', '')}")
    _disjoint([(("out", out), ("w", w)), (("out", out), ("mask", mask))])
    return causal_weight_unchecked(out, w, mask)


def causal_grad_add(dw, g, mask):
    """``dw += g * mask`` (``g`` is multiplied in place): a masked weight's gradient. ``g`` and
    ``mask`` C-contiguous (T, T); ``dw`` (T, T) of any strides. Returns dw."""
    check_array("g", g, ndim=2)
    check_array("mask", mask, dtype=g.dtype, shape=g.shape)
    if not isinstance(dw, np.ndarray) or dw.dtype != g.dtype or dw.shape != g.shape:
        raise ValueError(f"dw: expected a {g.dtype} array of shape {g.shape}")
    _disjoint([(("dw", dw), ("g", g)), (("g", g), ("mask", mask))])
    return causal_grad_add_unchecked(dw, g, mask)

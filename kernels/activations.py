"""Fused bias + activation passes and their backward, cache-blocked.

``bias_act_forward`` adds the bias row to ``z`` in place and writes ``h = act(z)``;
``act_backward`` writes ``dz = dh * act'(z)``; ``bias_grad`` accumulates ``db += dz.sum(0)``
through gemv. Elementwise chains run over row blocks of ~128 KiB with ``out=`` ufunc calls
into per-thread scratch buffers allocated once, so no temporary the size of the input exists.
"""
from __future__ import annotations

import math
import threading

import numpy as np
from scipy.special import ndtr as _ndtr

from .gemm import check_array, gemv_colsum
from .reference import ACTIVATIONS

__all__ = [
    "ACTIVATIONS", "bias_act_forward", "act_backward", "bias_grad",
    "bias_act_forward_unchecked", "act_backward_unchecked", "bias_grad_unchecked",
]

# Bytes per scratch buffer and per row block of each operand. The scratch (three chain
# buffers, a bool mask, the tiled bias) plus the block's inputs and outputs (~7 x 128 KiB)
# stay in L2; smaller blocks pay more Python overhead per element (each ufunc call costs
# ~0.5-1 us), larger ones spill to L3/RAM.
_BLOCK_BYTES = 128 * 1024

# Ufuncs bound once (attribute lookups add up on small arrays). Outputs are passed
# positionally (ufunc(a, b, out)): the hot loops below make tens of calls per block.
_add, _sub, _mul, _div = np.add, np.subtract, np.multiply, np.divide
_abs, _exp, _tanh, _max, _min = np.absolute, np.exp, np.tanh, np.maximum, np.minimum
_gt, _ge, _copyto = np.greater, np.greater_equal, np.copyto
# Comparisons write into a bool scratch and np.copyto casts that to 0.0/1.0: a float out=
# on a comparison (or a bool operand in arithmetic) makes numpy allocate a cast buffer, and
# so does a broadcast ufunc, hence the bias is tiled into a block-sized scratch once per call.

_INV_SQRT_2PI = 1.0 / math.sqrt(2.0 * math.pi)
_K = math.sqrt(2.0 / math.pi)           # gelu_tanh: u = _K * (z + 0.044715 z^3)
_KC = _K * 0.044715
# exp(-z) is clamped at these arguments so 1 + exp(-z) stays finite (no overflow warning);
# the sigmoid there is below the smallest normal number either way.
_EXP_CLAMP = {np.dtype(np.float32): 88.0, np.dtype(np.float64): 708.0}

# float32 GELU: Phi(-s) = e(s) * T(t) with s = |z|, e(s) = exp(-s^2/2), t = 1/(1 + 0.29 s)
# (computed as _TA / (_TA + s)) and T a degree-8 polynomial: a minimax fit (linear program)
# of the relative error of 0.5*erfcx(s/sqrt(2)) on s in [0, 13.5], max 8.2e-8. In float32
# the whole chain is within 1.5e-6 relative of the exact GELU for |z| < 5 and 1e-5 to the
# underflow, the float32 rounding of z^2 inside exp dominating (tests check it against
# scipy's ndtr); scipy's erf/ndtr ufuncs compute in double at ~10 ns/element, the chain's
# SIMD float32 ufuncs at ~3 ns. float64 uses ndtr (exact to double rounding).
_TA = 1.0 / 0.29
_T_COEF = (  # T(t) = sum c_k t^k, k = 0..8
    2.5300251198439814e-05, 1.1512407663171274e-01, 1.2118253255304251e-01,
    7.6250101140942647e-02, 1.8556778190929579e-01, -1.4922667315449864e-01,
    3.0306264185675508e-01, -1.9079452100796884e-01, 3.8808738515441275e-02)
_T_HORNER = _T_COEF[-2::-1]  # c_7 .. c_0, after starting from c_8 * t


# ----------------------------------------------------------------------------- scratch
_tls = threading.local()  # per-thread scratch: the kernels are safe to call from threads


def _scratch(dtype, rows, d):
    """Scratch for (rows, d) blocks: ``(a, b, c, m, tb)``, three float arrays for the chains,
    a bool array for masks and a float array for the tiled bias. They are views of
    per-thread flat buffers allocated once (grown only for rows wider than a block)."""
    cache = getattr(_tls, "views", None)
    if cache is None:
        cache = _tls.views = {}
        _tls.flat = {}
    key = (dtype.char, rows, d)
    views = cache.get(key)
    if views is None:
        n = rows * d
        flat = _tls.flat.get(dtype.char)
        if flat is None or flat[0].size < n:
            size = max(n, _BLOCK_BYTES // dtype.itemsize)
            flat = _tls.flat[dtype.char] = (np.empty(size, dtype), np.empty(size, dtype),
                                            np.empty(size, dtype), np.empty(size, np.bool_),
                                            np.empty(size, dtype))
            cache.clear()  # drop views of the old buffers
        if len(cache) > 64:  # many distinct small shapes: keep the dict bounded
            cache.clear()
        views = cache[key] = tuple(f[:n].reshape(rows, d) for f in flat)  # 5 x (rows, d)
    return views


def _block_rows(d, itemsize):
    return max(1, _BLOCK_BYTES // (d * itemsize))


def _t_poly(c, t):
    """c = T(t) by Horner (16 passes over the block)."""
    _mul(t, _T_COEF[8], c)
    _add(c, _T_COEF[7], c)
    for ck in _T_HORNER[1:]:
        _mul(c, t, c)
        _add(c, ck, c)


# ----------------------------------------------------------------------------- forward blocks
# Each takes (h, z, scratch, slope) for one row block, reads z only before its last call,
# and writes h only in its last call, so h may be z itself.
def _fwd_identity(h, z, sc, slope):
    _copyto(h, z)


def _fwd_noop(h, z, sc, slope):
    pass


def _fwd_relu(h, z, sc, slope):
    _max(z, 0.0, out=h)


def _fwd_leaky(h, z, sc, slope):
    a = sc[0]
    _mul(z, slope, a)
    # For slope <= 1, max(z, slope*z) is z where z > 0 and slope*z elsewhere; for slope > 1
    # the minimum is (NaN propagates as in the reference's where).
    (_max if slope <= 1.0 else _min)(z, a, out=h)


def _fwd_gelu32(h, z, sc, slope):
    # h = z*Phi(z) = relu(z) - |z| * Phi(-|z|): no select, and the left tail keeps its
    # relative accuracy (no 1 + erf cancellation). 26 passes.
    a, b, c = sc[0], sc[1], sc[2]
    _abs(z, a)                       # s = |z|
    _add(a, _TA, b)
    _div(_TA, b, b)                  # t = 1 / (1 + 0.29 s)
    _t_poly(c, b)                    # T(t)
    _mul(z, z, b)
    _mul(b, -0.5, b)
    _exp(b, b)                       # exp(-z^2/2), underflows to 0 for |z| > ~14 (float32)
    _mul(c, b, c)                    # Phi(-|z|)
    _mul(c, a, c)
    _max(z, 0.0, out=a)
    _sub(a, c, h)


def _fwd_gelu64(h, z, sc, slope):
    a = sc[0]
    _ndtr(z, a)                      # Phi(z), ~10 ns/element: the cost of this pass
    _mul(z, a, h)


def _fwd_gelu_tanh(h, z, sc, slope):
    # Same formula as the reference: 0.5 z (1 + tanh(K (z + 0.044715 z^3))). 8 passes.
    a = sc[0]
    _mul(z, z, a)
    _mul(a, _KC, a)
    _add(a, _K, a)
    _mul(a, z, a)                    # u = z (K + KC z^2)
    _tanh(a, a)
    _add(a, 1.0, a)
    _mul(a, z, a)
    _mul(a, 0.5, h)


def _neg_exp_clamped(a, z):
    """a = exp(min(-z, clamp)): finite for every finite z."""
    _mul(z, -1.0, a)
    _min(a, _EXP_CLAMP[a.dtype], out=a)
    _exp(a, a)


def _fwd_silu(h, z, sc, slope):
    a = sc[0]
    _neg_exp_clamped(a, z)
    _add(a, 1.0, a)
    _div(z, a, h)                    # z / (1 + exp(-z)); 5 passes, ~3x faster than scipy's expit


def _fwd_sigmoid(h, z, sc, slope):
    a = sc[0]
    _neg_exp_clamped(a, z)
    _add(a, 1.0, a)
    _div(1.0, a, h)


def _fwd_tanh(h, z, sc, slope):
    _tanh(z, h)


_FWD32 = {"identity": _fwd_identity, "relu": _fwd_relu, "leaky_relu": _fwd_leaky,
          "gelu": _fwd_gelu32, "gelu_tanh": _fwd_gelu_tanh, "silu": _fwd_silu,
          "sigmoid": _fwd_sigmoid, "tanh": _fwd_tanh}
_FWD64 = dict(_FWD32, gelu=_fwd_gelu64)
_FWD = {np.dtype(np.float32): _FWD32, np.dtype(np.float64): _FWD64}


# ----------------------------------------------------------------------------- backward blocks
# Each takes (dz, dh, z, h, scratch, slope) for one row block, computes act'(z) into scratch
# and writes dz = dh * act'(z) in its last call, so dz may be dh (or z, or h) itself.
def _bwd_identity(dz, dh, z, h, sc, slope):
    np.copyto(dz, dh)


def _bwd_relu(dz, dh, z, h, sc, slope):
    a, m = sc[0], sc[3]
    _gt(z, 0.0, m)                   # z > 0 (False for NaN, as the reference)
    _copyto(a, m)                    # 1.0 / 0.0
    _mul(dh, a, dz)


def _bwd_leaky(dz, dh, z, h, sc, slope):
    a, m = sc[0], sc[3]
    _gt(z, 0.0, m)
    _copyto(a, m)                    # 1.0 where z > 0, else 0.0
    if 0.0 <= slope <= 1.0:
        _max(a, slope, out=a)        # max(m, slope): exactly 1 or slope
    else:
        b = sc[1]
        _sub(1.0, a, b)
        _mul(b, slope, b)
        _add(a, b, a)                # m + (1 - m) slope: exactly 1 or slope
    _mul(dh, a, dz)


def _bwd_gelu32(dz, dh, z, h, sc, slope):
    # act' = Phi(z) + z phi(z). With w = Phi(-|z|) - |z| phi(z) = e(s) (T(t) - s/sqrt(2 pi)),
    # act' = w for z < 0 and 1 - w for z >= 0, taken as w + m (1 - 2w) with m = (z >= 0) so
    # the negative side is exact (no 0.5 + ... cancellation). 32 passes.
    a, b, c = sc[0], sc[1], sc[2]
    _abs(z, a)                       # s = |z|
    _add(a, _TA, b)
    _div(_TA, b, b)                  # t
    _t_poly(c, b)                    # T(t)
    _mul(a, _INV_SQRT_2PI, a)
    _sub(c, a, c)
    _mul(z, z, b)
    _mul(b, -0.5, b)
    _exp(b, b)
    _mul(c, b, c)                    # w
    _ge(z, 0.0, sc[3])
    _copyto(a, sc[3])                # m
    _mul(c, -2.0, b)
    _add(b, 1.0, b)
    _mul(b, a, b)
    _add(c, b, c)
    _mul(dh, c, dz)


def _bwd_gelu64(dz, dh, z, h, sc, slope):
    a, b = sc[0], sc[1]
    _ndtr(z, a)                      # Phi(z): the expensive pass
    _mul(z, -0.5, b)
    _mul(b, z, b)
    _exp(b, b)
    _mul(b, z, b)
    _mul(b, _INV_SQRT_2PI, b)        # z phi(z)
    _add(a, b, a)
    _mul(dh, a, dz)


def _bwd_gelu_tanh(dz, dh, z, h, sc, slope):
    # act' = 0.5 (1 + T) + 0.5 z (1 - T^2) u' = (1 + T) (0.5 + (z u'/2) (1 - T)),
    # T = tanh(u), u' = K (1 + 3*0.044715 z^2). 14 passes.
    a, b, c = sc[0], sc[1], sc[2]
    _mul(z, z, a)
    _mul(a, _KC, b)
    _add(b, _K, b)
    _mul(b, z, b)
    _tanh(b, b)                      # T
    _mul(a, 1.5 * _KC, a)
    _add(a, 0.5 * _K, a)
    _mul(a, z, a)                    # z u' / 2
    _sub(1.0, b, c)
    _mul(a, c, a)
    _add(a, 0.5, a)
    _add(b, 1.0, c)
    _mul(a, c, a)
    _mul(dh, a, dz)


def _bwd_silu(dz, dh, z, h, sc, slope):
    # act' = s (1 + z (1 - s)) with s = 1/(1+E), E = exp(-z), and 1 - s = E s computed without
    # cancellation. h is not used: z - h would cancel where 1 - s is small. 10 passes.
    a, b = sc[0], sc[1]
    _neg_exp_clamped(a, z)           # E
    _add(a, 1.0, b)
    _div(1.0, b, b)                  # s
    _mul(a, b, a)                    # 1 - s
    _mul(a, z, a)
    _add(a, 1.0, a)
    _mul(a, b, a)
    _mul(dh, a, dz)


def _bwd_sigmoid(dz, dh, z, h, sc, slope):
    a = sc[0]
    if h is not None:                # s (1 - s) from the forward output: 3 passes
        _sub(1.0, h, a)
        _mul(a, h, a)
    else:                            # E s * s with E = exp(-z): 8 passes
        b = sc[1]
        _neg_exp_clamped(a, z)
        _add(a, 1.0, b)
        _div(1.0, b, b)
        _mul(a, b, a)
        _mul(a, b, a)
    _mul(dh, a, dz)


def _bwd_tanh(dz, dh, z, h, sc, slope):
    a = sc[0]
    if h is not None:
        _mul(h, h, a)
    else:
        _tanh(z, a)
        _mul(a, a, a)
    _sub(1.0, a, a)
    _mul(dh, a, dz)


_BWD32 = {"identity": _bwd_identity, "relu": _bwd_relu, "leaky_relu": _bwd_leaky,
          "gelu": _bwd_gelu32, "gelu_tanh": _bwd_gelu_tanh, "silu": _bwd_silu,
          "sigmoid": _bwd_sigmoid, "tanh": _bwd_tanh}
_BWD64 = dict(_BWD32, gelu=_bwd_gelu64)
_BWD = {np.dtype(np.float32): _BWD32, np.dtype(np.float64): _BWD64}


def _same(a, b):
    """True when a and b are the same memory (same start; shapes and dtypes already match)."""
    return a is b or a.__array_interface__["data"][0] == b.__array_interface__["data"][0]


# ----------------------------------------------------------------------------- unchecked cores
def bias_act_forward_unchecked(h, z, bias=None, act="relu", negative_slope=0.01):
    """``bias_act_forward`` without argument checks (hot path): the caller guarantees 2-D
    C-contiguous ``h``, ``z`` of one shape and dtype (float32/float64), ``bias`` of shape
    (d,) or None, a known ``act`` and a Python float ``negative_slope``."""
    n, d = z.shape
    if n == 0 or d == 0:
        return h
    fn = _FWD[z.dtype][act]
    if fn is _fwd_identity and _same(h, z):
        if bias is None:
            return h
        fn = _fwd_noop               # only z += bias
    rows = _block_rows(d, z.itemsize)
    if n <= rows:  # one block: no loop machinery (small arrays are bound by call overhead)
        sc = _scratch(z.dtype, n, d)
        if bias is not None:
            tb = sc[4]
            _copyto(tb, bias)        # (n, d) tiled bias: a plain add, not a broadcast one
            _add(z, tb, z)
        fn(h, z, sc, negative_slope)
        return h
    sc = _scratch(z.dtype, rows, d)
    tb = sc[4]
    if bias is not None:
        _copyto(tb, bias)            # (rows, d) tiled once, reused by every block
    for i in range(0, n, rows):
        j = i + rows
        if j > n:  # remainder block: (cached) views of the same scratch, fewer rows
            sc = _scratch(z.dtype, n - i, d)
            tb = sc[4]
        zb = z[i:j]
        if bias is not None:
            _add(zb, tb, zb)
        fn(h[i:j], zb, sc, negative_slope)
    return h


def act_backward_unchecked(dz, dh, z, act="relu", negative_slope=0.01, h=None):
    """``act_backward`` without argument checks (hot path); same guarantees as
    ``bias_act_forward_unchecked`` for ``dz``, ``dh``, ``z`` and ``h`` (or None)."""
    n, d = z.shape
    if n == 0 or d == 0:
        return dz
    fn = _BWD[z.dtype][act]
    if fn is _bwd_identity:
        if not _same(dz, dh):
            np.copyto(dz, dh)
        return dz
    rows = _block_rows(d, z.itemsize)
    if n <= rows:
        fn(dz, dh, z, h, _scratch(z.dtype, n, d), negative_slope)
        return dz
    sc = _scratch(z.dtype, rows, d)
    for i in range(0, n, rows):
        j = i + rows
        if j > n:
            sc = _scratch(z.dtype, n - i, d)
        fn(dz[i:j], dh[i:j], z[i:j], None if h is None else h[i:j], sc, negative_slope)
    return dz


def bias_grad_unchecked(db, dz):
    """``db += dz.sum(0)`` via gemv with a ones vector (no checks)."""
    if dz.shape[1] == 0:  # scipy's gemv rejects an empty y
        return db
    return gemv_colsum(db, dz, 1.0)


# ----------------------------------------------------------------------------- checked API
def _check_act(act):
    if not isinstance(act, str) or act not in _FWD32:
        raise ValueError(f"act: expected one of {ACTIVATIONS}, got {act!r}")


def _check_slope(negative_slope):
    if isinstance(negative_slope, bool) or not isinstance(negative_slope, (int, float, np.floating, np.integer)):
        raise TypeError(f"negative_slope: expected a real number, got {type(negative_slope).__name__}")
    slope = float(negative_slope)
    if not math.isfinite(slope):
        raise ValueError(f"negative_slope: expected a finite number, got {slope}")
    return slope


def _check_alias(out_name, out, in_name, x):
    """An output may be an input itself, but must not partly overlap it."""
    if np.may_share_memory(out, x) and not (out.shape == x.shape and _same(out, x)):
        raise ValueError(f"{out_name}: must be {in_name} itself or not overlap it")


def bias_act_forward(h, z, bias=None, act="relu", negative_slope=0.01):
    """``z += bias`` (in place, when ``bias`` is given), then ``h = act(z)``; returns ``h``.

    ``z`` and ``h`` are C-contiguous (N, d) float32/float64 arrays of one dtype, ``bias`` is
    (d,) or None. ``h`` may be ``z`` itself: then z is overwritten by act(z) (fine when the
    backward gets ``h`` instead of needing ``z``, e.g. for sigmoid/tanh). ``act`` is one of
    ``ACTIVATIONS``; ``negative_slope`` is leaky_relu's slope. float32 ``gelu`` evaluates
    the normal CDF through a polynomial erfc (within 1.5e-6 relative of the exact GELU for
    |z| < 5, 1e-5 out to the underflow: a few float32 ulps); float64 ``gelu`` uses scipy's
    ndtr. sigmoid/silu clamp exp's argument, so act(z) for z < -88 (float32) / -708 (float64)
    is a tiny positive (sigmoid) or negative (silu) number instead of an underflowed 0.
    """
    check_array("z", z, ndim=2)
    check_array("h", h, dtype=z.dtype, shape=z.shape)
    if bias is not None:
        check_array("bias", bias, dtype=z.dtype, shape=(z.shape[1],))
        if np.may_share_memory(bias, z) or np.may_share_memory(bias, h):
            raise ValueError("bias: must not overlap z or h (z += bias would change it)")
    _check_act(act)
    slope = _check_slope(negative_slope)
    _check_alias("h", h, "z", z)
    return bias_act_forward_unchecked(h, z, bias, act, slope)


def act_backward(dz, dh, z, act="relu", negative_slope=0.01, h=None):
    """``dz = dh * act'(z)``; returns ``dz``. ``dz`` may be ``dh`` itself (in place).

    ``h``, the forward output act(z), is optional; sigmoid and tanh use it when given
    (s(1-s), 1-h^2: cheaper than recomputing act(z)). Arrays as in ``bias_act_forward``.
    """
    check_array("z", z, ndim=2)
    check_array("dh", dh, dtype=z.dtype, shape=z.shape)
    check_array("dz", dz, dtype=z.dtype, shape=z.shape)
    if h is not None:
        check_array("h", h, dtype=z.dtype, shape=z.shape)
        _check_alias("dz", dz, "h", h)
    _check_act(act)
    slope = _check_slope(negative_slope)
    _check_alias("dz", dz, "dh", dh)
    _check_alias("dz", dz, "z", z)
    return act_backward_unchecked(dz, dh, z, act, slope, h)


def bias_grad(db, dz):
    """``db += dz.sum(axis=0)`` (accumulates, like every parameter gradient); returns ``db``.
    ``dz`` is a C-contiguous (N, d) array, ``db`` a (d,) array of the same dtype."""
    check_array("dz", dz, ndim=2)
    check_array("db", db, dtype=dz.dtype, shape=(dz.shape[1],))
    if np.may_share_memory(db, dz):
        raise ValueError("db: must not overlap dz")
    return bias_grad_unchecked(db, dz)

"""Fused bias + activation passes and their backward, cache-blocked and split over threads.

``bias_act_forward`` adds the bias row to ``z`` in place and writes ``h = act(z)`` and, on
request, ``grad = act'(z)`` (computed in the same pass, may overwrite z), so that the backward
is ``act_backward_cached``: one multiply ``dz = dh * grad``; ``act_backward`` recomputes
``act'(z)`` instead. ``bias_grad`` accumulates ``db += dz.sum(0)`` through gemv. Chains run
over row blocks of ~128 KiB with ``out=`` ufunc calls into scratch allocated once (no
temporary the size of the input); large arrays are split over the blasnet thread count.
"""
from __future__ import annotations

import math
import threading

import numpy as np
from scipy.special import ndtr as _ndtr

from .gemm import check_array, gemv_colsum
from .memory import aligned_empty as _aligned_empty
from .parallel import MIN_ELEMENTS_PER_THREAD
from .parallel import chunks as _chunks
from .parallel import parallel_for as _parallel_for
from .reference import ACTIVATIONS

__all__ = [
    "ACTIVATIONS", "bias_act_forward", "act_backward", "act_backward_cached", "bias_grad",
    "bias_act_forward_unchecked", "act_backward_unchecked", "act_backward_cached_unchecked",
    "bias_grad_unchecked",
]

# Bytes per scratch buffer and per row block of each operand. The scratch (three chain
# buffers, a bool mask, the tiled bias) plus the block's inputs and outputs (~7 x 128 KiB)
# stay in L2; smaller blocks pay more Python overhead per element (each ufunc call costs
# ~0.5-1 us), larger ones spill to L3/RAM.
_BLOCK_BYTES = 128 * 1024
# Blocks of a pass split over threads (see the row runners), and the smallest array split.
_SPLIT_BLOCK_BYTES = 512 * 1024
_SPLIT_MIN_ELEMENTS = 2 * MIN_ELEMENTS_PER_THREAD

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

# The float32 GELU chains take their constants as 0-d float32 arrays: a Python float operand
# costs each ufunc call ~0.2 us more (NumPy converts it per call, holding the GIL), a 0-d
# array of the operand's dtype gives the same bits.
def _f32(v):
    return np.array(v, np.float32)


_TA32, _ZERO32, _ONE32, _MHALF32, _M2_32 = _f32(_TA), _f32(0.0), _f32(1.0), _f32(-0.5), _f32(-2.0)
_INV_SQRT_2PI32, _M2_INV_SQRT_2PI32 = _f32(_INV_SQRT_2PI), _f32(-2.0 * _INV_SQRT_2PI)
_T8_32 = _f32(_T_COEF[8])
_T_HORNER32 = tuple(_f32(ck) for ck in _T_HORNER)
_SIGN32 = np.array(0x80000000, np.uint32)  # float32 sign bit


# ----------------------------------------------------------------------------- scratch
# Scratch belongs to the calling thread (the kernels are safe to call from threads): a list
# of stores, one per slice of a split pass. Slice i of a split pass uses its caller's store
# i whichever pool thread runs it, so the scratch allocated in warm-up is the scratch used
# later (per-pool-thread scratch would grow with every idle worker that picks up a slice).
_tls = threading.local()


class _Store:
    __slots__ = ("views", "flat")

    def __init__(self):
        self.views = {}  # (dtype char, rows, d) -> the views _scratch returns
        self.flat = {}   # dtype char -> 5 flat buffers


def _stores(k=1):
    """The calling thread's scratch stores, at least ``k`` of them."""
    st = getattr(_tls, "stores", None)
    if st is None:
        st = _tls.stores = [_Store()]
    while len(st) < k:
        st.append(_Store())
    return st


_aligned = _aligned_empty  # (size,) scratch on a 64-byte boundary (kernels.memory: why)


_UINT = {4: np.uint32, 8: np.uint64}


def _scratch(dtype, rows, d, store=None):
    """Scratch for (rows, d) blocks: ``(a, b, c, m, tb, cu)``, three float arrays for the
    chains, a bool array for masks, a float array for the tiled bias, and c viewed as
    unsigned ints (sign-bit arithmetic). They are views of flat buffers of ``store``
    (default: the calling thread's first) allocated once, grown only for larger blocks."""
    if store is None:
        st = getattr(_tls, "stores", None)
        store = (st or _stores())[0]
    cache = store.views
    key = (dtype.char, rows, d)
    views = cache.get(key)
    if views is None:
        n = rows * d
        flat = store.flat.get(dtype.char)
        if flat is None or flat[0].size < n:
            size = max(n, _BLOCK_BYTES // dtype.itemsize)
            flat = store.flat[dtype.char] = (_aligned(size, dtype), _aligned(size, dtype),
                                             _aligned(size, dtype), _aligned(size, np.bool_),
                                             _aligned(size, dtype))
            cache.clear()  # drop views of the old buffers
        if len(cache) > 64:  # many distinct small shapes: keep the dict bounded
            cache.clear()
        v = tuple(f[:n].reshape(rows, d) for f in flat)  # 5 x (rows, d)
        views = cache[key] = v + (v[2].view(_UINT[dtype.itemsize]),)  # and c's bits
    return views


def _block_rows(d, itemsize):
    return max(1, _BLOCK_BYTES // (d * itemsize))


def _split_rows(d, itemsize):
    return max(1, _SPLIT_BLOCK_BYTES // (d * itemsize))


def _t_poly(c, t):
    """c = T(t) by Horner (16 passes over the block), float32."""
    _mul(t, _T8_32, c)
    _add(c, _T_HORNER32[0], c)
    for ck in _T_HORNER32[1:]:
        _mul(c, t, c)
        _add(c, ck, c)


# ----------------------------------------------------------------------------- forward blocks
# Each takes (h, z, g, scratch, slope) for one row block (g is None: forward only), reads z
# only before its last call, and writes h only in its last call, so h may be z itself.
def _fwd_identity(h, z, g, sc, slope):
    _copyto(h, z)


def _fwd_noop(h, z, g, sc, slope):
    pass


def _fwd_relu(h, z, g, sc, slope):
    _max(z, 0.0, out=h)


def _fwd_leaky(h, z, g, sc, slope):
    a = sc[0]
    _mul(z, slope, a)
    # For slope <= 1, max(z, slope*z) is z where z > 0 and slope*z elsewhere; for slope > 1
    # the minimum is (NaN propagates as in the reference's where).
    (_max if slope <= 1.0 else _min)(z, a, out=h)


def _fwd_gelu32(h, z, g, sc, slope):
    # h = z*Phi(z) = relu(z) - |z| * Phi(-|z|): no select, and the left tail keeps its
    # relative accuracy (no 1 + erf cancellation). 26 passes.
    a, b, c = sc[0], sc[1], sc[2]
    _abs(z, a)                       # s = |z|
    _add(a, _TA32, b)
    _div(_TA32, b, b)                # t = 1 / (1 + 0.29 s)
    _t_poly(c, b)                    # T(t)
    _mul(z, z, b)
    _mul(b, _MHALF32, b)
    _exp(b, b)                       # exp(-z^2/2), underflows to 0 for |z| > ~14 (float32)
    _mul(c, b, c)                    # Phi(-|z|)
    _mul(c, a, c)
    _max(z, _ZERO32, out=a)
    _sub(a, c, h)


def _fwd_gelu64(h, z, g, sc, slope):
    a = sc[0]
    _ndtr(z, a)                      # Phi(z), ~10 ns/element: the cost of this pass
    _mul(z, a, h)


def _fwd_gelu_tanh(h, z, g, sc, slope):
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


def _fwd_silu(h, z, g, sc, slope):
    a = sc[0]
    _neg_exp_clamped(a, z)
    _add(a, 1.0, a)
    _div(z, a, h)                    # z / (1 + exp(-z)); 5 passes, ~3x faster than scipy's expit


def _fwd_sigmoid(h, z, g, sc, slope):
    a = sc[0]
    _neg_exp_clamped(a, z)
    _add(a, 1.0, a)
    _div(1.0, a, h)


def _fwd_tanh(h, z, g, sc, slope):
    _tanh(z, h)


_FWD32 = {"identity": _fwd_identity, "relu": _fwd_relu, "leaky_relu": _fwd_leaky,
          "gelu": _fwd_gelu32, "gelu_tanh": _fwd_gelu_tanh, "silu": _fwd_silu,
          "sigmoid": _fwd_sigmoid, "tanh": _fwd_tanh}
_FWD64 = dict(_FWD32, gelu=_fwd_gelu64)
_FWD = {np.dtype(np.float32): _FWD32, np.dtype(np.float64): _FWD64}


# ----------------------------------------------------------------------------- forward + derivative
# Each takes (h, z, g, scratch, slope) for one row block and writes h = act(z) and
# g = act'(z), the derivative cached for a backward of one multiply (act_backward_cached).
# They read z before writing h or g, and write g last, so g may be z itself (or h may be z).
_and, _xor, _less = np.bitwise_and, np.bitwise_xor, np.less


def _fwdg_relu(h, z, g, sc, slope):
    m = sc[3]
    _gt(z, 0.0, m)                   # z > 0 (False for NaN, as the reference)
    _max(z, 0.0, out=h)
    _copyto(g, m)


def _fwdg_leaky(h, z, g, sc, slope):
    m = sc[3]
    _gt(z, 0.0, m)
    _fwd_leaky(h, z, None, sc, slope)
    _copyto(g, m)                    # 1.0 where z > 0, else 0.0
    if 0.0 <= slope <= 1.0:
        _max(g, slope, out=g)        # exactly 1 or slope
    else:
        b = sc[1]
        _sub(1.0, g, b)
        _mul(b, slope, b)
        _add(g, b, g)


def _gelu32_grad(h, z, g, a, b, c, cu, m):
    # With s = |z|, P = Phi(-s) = e(s) T(t) as in _fwd_gelu32 and Phi(z) = 1 - P (z >= 0) or
    # P (z < 0): h = z Phi(z) and act' = Phi(z) + z phi(z), phi(z) = e / sqrt(2 pi). The
    # select is sign-bit arithmetic, Phi(z) = H(z) - copysign(P, z), exact on the negative
    # side (no 0.5 + ... cancellation); z's sign bit decides both terms, so -0.0 counts as
    # negative in both. A masked ufunc (where=) would cost ~5 ns/element on a random mask.
    # 33 passes (the forward alone takes 26, recomputing act' in backward 32). ``a`` is
    # scratch, or h itself when h is not z (one buffer less to keep in cache).
    _abs(z, a)                       # s
    _add(a, _TA32, b)
    _div(_TA32, b, b)                # t
    _t_poly(c, b)                    # T(t)
    _mul(z, _MHALF32, a)             # -z/2
    _mul(a, z, b)
    _exp(b, b)                       # e = exp(-z^2/2)
    _mul(c, b, c)                    # P
    _mul(a, b, b)                    # -z e / 2
    _mul(b, _M2_INV_SQRT_2PI32, b)   # z phi(z)
    au, zu = a.view(np.uint32), z.view(np.uint32)
    _and(zu, _SIGN32, au)            # z's sign bit
    _xor(cu, au, cu)                 # copysign(P, z) (P >= 0)
    _less(zu, _SIGN32, m)            # sign bit clear: H(z) = 1
    _copyto(a, m)
    _sub(a, c, c)                    # Phi(z)
    _mul(z, c, h)                    # h: z read for the last time
    _add(c, b, g)


def _fwdg_gelu32(h, z, g, sc, slope):
    _gelu32_grad(h, z, g, sc[0], sc[1], sc[2], sc[5], sc[3])


def _fwdg_gelu32_hs(h, z, g, sc, slope):  # h is not z: h serves as the first scratch
    _gelu32_grad(h, z, g, h, sc[1], sc[2], sc[5], sc[3])


def _gelu64_parts(z, a, b):
    """a = Phi(z), b = z phi(z) (float64: ndtr, exact to double rounding)."""
    _ndtr(z, a)                      # Phi(z): the expensive pass
    _mul(z, -0.5, b)
    _mul(b, z, b)
    _exp(b, b)
    _mul(b, z, b)
    _mul(b, _INV_SQRT_2PI, b)        # z phi(z)


def _fwdg_gelu64(h, z, g, sc, slope):
    a, b = sc[0], sc[1]
    _gelu64_parts(z, a, b)
    _mul(z, a, h)
    _add(a, b, g)


def _fwdg_gelu_tanh(h, z, g, sc, slope):
    # h = 0.5 z (1 + T), act' = (1 + T) (0.5 + (z u'/2) (1 - T)) as in _bwd_gelu_tanh.
    # 16 passes (8 + 14 separately).
    a, b, c = sc[0], sc[1], sc[2]
    _mul(z, z, a)
    _mul(a, _KC, b)
    _add(b, _K, b)
    _mul(b, z, b)
    _tanh(b, b)                      # T
    _add(b, 1.0, c)                  # 1 + T
    _sub(1.0, b, b)                  # 1 - T
    _mul(a, 1.5 * _KC, a)
    _add(a, 0.5 * _K, a)
    _mul(a, z, a)                    # z u' / 2
    _mul(a, b, a)
    _add(a, 0.5, a)
    _mul(c, z, b)
    _mul(b, 0.5, h)                  # h: z is dead from here
    _mul(a, c, g)


def _fwdg_silu(h, z, g, sc, slope):
    # h = z s, act' = s (1 + z E s) with E = exp(-z), s = 1/(1+E). 10 passes (5 + 10).
    a, b = sc[0], sc[1]
    _neg_exp_clamped(a, z)           # E
    _add(a, 1.0, b)
    _div(1.0, b, b)                  # s
    _mul(a, b, a)                    # 1 - s
    _mul(a, z, a)
    _mul(z, b, h)                    # h: z is dead from here
    _add(a, 1.0, a)
    _mul(a, b, g)


def _fwdg_sigmoid(h, z, g, sc, slope):
    a = sc[0]
    _neg_exp_clamped(a, z)           # E; z is dead from here
    _add(a, 1.0, h)
    _div(1.0, h, h)                  # s
    _mul(a, h, a)                    # E s = 1 - s
    _mul(a, h, g)


def _fwdg_tanh(h, z, g, sc, slope):
    a = sc[0]
    _tanh(z, h)                      # z is dead from here
    _mul(h, h, a)
    _sub(1.0, a, g)


_FWDG32 = {"relu": _fwdg_relu, "leaky_relu": _fwdg_leaky, "gelu": _fwdg_gelu32,
           "gelu_tanh": _fwdg_gelu_tanh, "silu": _fwdg_silu, "sigmoid": _fwdg_sigmoid,
           "tanh": _fwdg_tanh}  # identity: a copy and a fill, done whole-array
_FWDG64 = dict(_FWDG32, gelu=_fwdg_gelu64)
# Variants that use h as scratch, for row loops where h is known not to be z.
_H_SCRATCH = {_fwdg_gelu32: _fwdg_gelu32_hs}
_FWDG = {np.dtype(np.float32): _FWDG32, np.dtype(np.float64): _FWDG64}


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
    _add(a, _TA32, b)
    _div(_TA32, b, b)                # t
    _t_poly(c, b)                    # T(t)
    _mul(a, _INV_SQRT_2PI32, a)
    _sub(c, a, c)
    _mul(z, z, b)
    _mul(b, _MHALF32, b)
    _exp(b, b)
    _mul(c, b, c)                    # w
    _ge(z, _ZERO32, sc[3])
    _copyto(a, sc[3])                # m
    _mul(c, _M2_32, b)
    _add(b, _ONE32, b)
    _mul(b, a, b)
    _add(c, b, c)
    _mul(dh, c, dz)


def _bwd_gelu64(dz, dh, z, h, sc, slope):
    a, b = sc[0], sc[1]
    _gelu64_parts(z, a, b)
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


# ----------------------------------------------------------------------------- row runners
# A pass over rows [i0, i1) in blocks of ``rows`` rows, on scratch ``store`` (default: the
# calling thread's). Large arrays are split into one such slice per thread
# (kernels.parallel): NumPy releases the GIL inside each ufunc loop, but every call takes it
# back, and a thread that finds it held sleeps until woken (tens of us here). So split
# passes use blocks of _SPLIT_BLOCK_BYTES, 4x fewer calls per element: two threads each
# running the GELU chain on their own L2-resident block took 2.7x the time of one with
# 128 KiB blocks, 1.3x with 512 KiB; on 2048x2048, 1 thread 16-18 ms, 2 threads 10-11 ms.
def _fwd_rows(h, z, bias, g, fn, slope, i0, i1, rows, store=None):
    d = z.shape[1]
    dt = z.dtype
    sc = _scratch(dt, min(rows, i1 - i0), d, store)
    tb = sc[4]
    if bias is not None:
        _copyto(tb, bias)            # tiled once per slice, reused by every block
    for i in range(i0, i1, rows):
        j = i + rows
        if j > i1:  # remainder block: (cached) views of the same scratch, fewer rows
            j = i1
            sc = _scratch(dt, j - i, d, store)
            tb = sc[4]
        zb = z[i:j]
        if bias is not None:
            _add(zb, tb, zb)
        fn(h[i:j], zb, None if g is None else g[i:j], sc, slope)


def _bwd_rows(dz, dh, z, h, fn, slope, i0, i1, rows, store=None):
    d = z.shape[1]
    dt = z.dtype
    sc = _scratch(dt, min(rows, i1 - i0), d, store)
    for i in range(i0, i1, rows):
        j = i + rows
        if j > i1:
            j = i1
            sc = _scratch(dt, j - i, d, store)
        fn(dz[i:j], dh[i:j], z[i:j], None if h is None else h[i:j], sc, slope)


def _split(n, d):
    """Threads to split an (n, d) pass over (1: run inline, no pool call)."""
    if n * d < _SPLIT_MIN_ELEMENTS:
        return 1
    return _chunks(n, d)


def _slice_store(stores, i, n, k):
    """The store of the slice starting at row i: parallel_for's slice s starts at n*s//k, and
    ceil(i*k/n) recovers s (k <= n)."""
    return stores[-(-i * k // n)]


def _run_rows(runner, n, d, itemsize, *args):
    """``runner(*args, i0, i1, rows, store)`` over rows [0, n) of an (n, d) pass: one slice per
    thread (blocks of _SPLIT_BLOCK_BYTES, each slice on its own scratch store) when large,
    else inline in blocks of _BLOCK_BYTES on the caller's scratch."""
    k = _split(n, d)
    if k == 1:
        runner(*args, 0, n, _block_rows(d, itemsize))
        return
    rows = _split_rows(d, itemsize)
    st = _stores(k)
    _parallel_for(lambda i, j: runner(*args, i, j, rows, _slice_store(st, i, n, k)), n, k)


# ----------------------------------------------------------------------------- unchecked cores
def bias_act_forward_unchecked(h, z, bias=None, act="relu", negative_slope=0.01, grad=None):
    """``bias_act_forward`` without argument checks (hot path): the caller guarantees 2-D
    C-contiguous ``h``, ``z`` (and ``grad``, or None) of one shape and dtype (float32/float64),
    ``bias`` of shape (d,) or None, a known ``act`` and a Python float ``negative_slope``."""
    n, d = z.shape
    if n == 0 or d == 0:
        return h
    if grad is None:
        fn = _FWD[z.dtype][act]
    else:
        fn = _FWDG[z.dtype].get(act)
        if fn is None:  # identity: h = z + bias, act' = 1
            bias_act_forward_unchecked(h, z, bias, act, negative_slope)
            _copyto(grad, 1.0)
            return h
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
        fn(h, z, grad, sc, negative_slope)
        return h
    if fn in _H_SCRATCH and not _same(h, z):
        fn = _H_SCRATCH[fn]
    _run_rows(_fwd_rows, n, d, z.itemsize, h, z, bias, grad, fn, negative_slope)
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
    _run_rows(_bwd_rows, n, d, z.itemsize, dz, dh, z, h, fn, negative_slope)
    return dz


def act_backward_cached_unchecked(dz, dh, grad):
    """``act_backward_cached`` without argument checks: ``dz = dh * grad`` for C-contiguous
    arrays of one shape and dtype (``dz`` may be ``dh`` or ``grad``). One pass, no scratch."""
    n, d = dh.shape
    k = _split(n, d)
    if k > 1:
        _parallel_for(lambda i, j: _mul(dh[i:j], grad[i:j], dz[i:j]), n, k)
    else:
        _mul(dh, grad, dz)
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


def bias_act_forward(h, z, bias=None, act="relu", negative_slope=0.01, grad=None):
    """``z += bias`` (in place, when ``bias`` is given), then ``h = act(z)`` and, when ``grad``
    is given, ``grad = act'(z)``; returns ``h``.

    ``z`` and ``h`` are C-contiguous (N, d) float32/float64 arrays of one dtype, ``bias`` is
    (d,) or None. ``h`` may be ``z`` itself: then z is overwritten by act(z) (fine when the
    backward gets ``h`` instead of needing ``z``, e.g. for sigmoid/tanh). ``grad`` (an array
    like ``z``, or None) receives the derivative for ``act_backward_cached``, computed in the
    same pass from what act(z) needs anyway; it may be ``z`` itself (z is not needed once its
    derivative is cached) but not ``h``. ``act`` is one of ``ACTIVATIONS``;
    ``negative_slope`` is leaky_relu's slope. float32 ``gelu`` evaluates
    the normal CDF through a polynomial erfc (within 1.5e-6 relative of the exact GELU for
    |z| < 5, 1e-5 out to the underflow: a few float32 ulps); float64 ``gelu`` uses scipy's
    ndtr. sigmoid/silu clamp exp's argument, so act(z) for z < -88 (float32) / -708 (float64)
    is a tiny positive (sigmoid) or negative (silu) number instead of an underflowed 0.
    Large arrays are split over the blasnet thread count (kernels.parallel); the result does
    not depend on the split.
    """
    check_array("z", z, ndim=2)
    check_array("h", h, dtype=z.dtype, shape=z.shape)
    if grad is not None:
        check_array("grad", grad, dtype=z.dtype, shape=z.shape)
    if bias is not None:
        check_array("bias", bias, dtype=z.dtype, shape=(z.shape[1],))
        if (np.may_share_memory(bias, z) or np.may_share_memory(bias, h)
                or grad is not None and np.may_share_memory(bias, grad)):
            raise ValueError("bias: must not overlap z, h or grad (z += bias would change it)")
    _check_act(act)
    slope = _check_slope(negative_slope)
    _check_alias("h", h, "z", z)
    if grad is not None:
        _check_alias("grad", grad, "z", z)
        if np.may_share_memory(grad, h):
            raise ValueError("grad: must not overlap h")
    return bias_act_forward_unchecked(h, z, bias, act, slope, grad)


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


def act_backward_cached(dz, dh, grad):
    """``dz = dh * grad``, with ``grad = act'(z)`` cached by ``bias_act_forward(..., grad=)``;
    returns ``dz``. ``dz`` may be ``dh`` or ``grad`` itself. Arrays as in ``act_backward``."""
    check_array("grad", grad, ndim=2)
    check_array("dh", dh, dtype=grad.dtype, shape=grad.shape)
    check_array("dz", dz, dtype=grad.dtype, shape=grad.shape)
    _check_alias("dz", dz, "dh", dh)
    _check_alias("dz", dz, "grad", grad)
    if grad.size == 0:
        return dz
    return act_backward_cached_unchecked(dz, dh, grad)


def bias_grad(db, dz):
    """``db += dz.sum(axis=0)`` (accumulates, like every parameter gradient); returns ``db``.
    ``dz`` is a C-contiguous (N, d) array, ``db`` a (d,) array of the same dtype."""
    check_array("dz", dz, ndim=2)
    check_array("db", db, dtype=dz.dtype, shape=(dz.shape[1],))
    if np.may_share_memory(db, dz):
        raise ValueError("db: must not overlap dz")
    return bias_grad_unchecked(db, dz)

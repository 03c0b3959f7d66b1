"""Fused bias + activation passes and their backward, cache-blocked and split over threads.

``bias_act_forward`` adds the bias row to ``z`` in place and writes ``h = act(z)`` and, on
request, ``grad = act'(z)`` (computed in the same pass, may overwrite z), so that the backward
is ``act_backward_cached``: one multiply ``dz = dh * grad``; ``act_backward`` recomputes
``act'(z)`` instead. ``bias_grad`` accumulates ``db += dz.sum(0)`` through gemv. Chains run
over row blocks of ~128 KiB with ``out=`` ufunc calls into per-thread scratch from
``kernels.memory`` (no temporary the size of the input); large arrays are split over the
blasnet thread count (``kernels.parallel.split``).

Every activation is one entry of ``REGISTRY`` (name -> ``Activation``): its kernels per dtype,
its naive twin in ``kernels.reference`` and whether its backward can read the sign of z from
act(z). Adding an activation is its kernels below, its reference pair and one entry.
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from types import MappingProxyType
from typing import Callable, Mapping

import numpy as np
from scipy.special import ndtr as _ndtr

from . import reference as R
from .gemm import check_array, gemv_colsum
from .memory import ALIGN
from .memory import scratch as _mem_scratch
from .parallel import SPLIT_MIN
from .parallel import split as _split
from .parallel import threads_for as _threads_for

__all__ = [
    "Activation", "REGISTRY", "ACTIVATIONS",
    "bias_act_forward", "act_backward", "act_backward_cached", "bias_grad",
    "bias_act_forward_unchecked", "act_backward_unchecked", "act_backward_cached_unchecked",
    "bias_grad_unchecked",
]

# Bytes per scratch buffer and per row block of each operand: the scratch (four chain
# buffers, a bool mask, the tiled bias) plus the block's inputs and outputs stay in L2;
# smaller blocks pay more Python overhead per element, larger ones spill out of L2.
_BLOCK_BYTES = 128 * 1024
# Row blocks of a pass split over threads: each ufunc call takes the GIL back, so split
# passes make 4x fewer calls per element (docs/performance.md).
_SPLIT_BLOCK_BYTES = 512 * 1024

F32, F64 = np.dtype(np.float32), np.dtype(np.float64)
DTYPES = (F32, F64)

# Ufuncs bound once (attribute lookups add up on small arrays). Outputs are passed
# positionally (ufunc(a, b, out)): the hot loops below make tens of calls per block.
_add, _sub, _mul, _div = np.add, np.subtract, np.multiply, np.divide
_abs, _exp, _tanh, _max, _min = np.absolute, np.exp, np.tanh, np.maximum, np.minimum
_gt, _ge, _copyto = np.greater, np.greater_equal, np.copyto
_and, _xor, _less = np.bitwise_and, np.bitwise_xor, np.less
# Comparisons write into a bool scratch and np.copyto casts that to 0.0/1.0: a float out=
# on a comparison (or a bool operand in arithmetic) makes numpy allocate a cast buffer, and
# so does a broadcast ufunc, hence the bias is tiled into a block-sized scratch once per slice.

_INV_SQRT_2PI = 1.0 / math.sqrt(2.0 * math.pi)
_K = math.sqrt(2.0 / math.pi)           # gelu_tanh: u = _K * (z + 0.044715 z^3)
_KC = _K * 0.044715
# exp(-z) is clamped at these arguments so 1 + exp(-z) stays finite (no overflow warning);
# the sigmoid there is below the smallest normal number either way.
_EXP_CLAMP = {F32: 88.0, F64: 708.0}

# float32 GELU: Phi(-s) = e(s) * T(t) with s = |z|, e(s) = exp(-s^2/2), t = 1/(1 + 0.29 s)
# (computed as _TA / (_TA + s)) and T a degree-8 polynomial: a minimax fit (linear program)
# of the relative error of 0.5*erfcx(s/sqrt(2)) on s in [0, 13.5], max 8.2e-8. In float32
# the whole chain is within 1.5e-6 relative of the exact GELU for |z| < 5 and 1e-5 to the
# underflow, the float32 rounding of z^2 inside exp dominating (tests check it against
# scipy's ndtr). scipy's erf/ndtr ufuncs compute in double, so float32 uses this chain of
# SIMD float32 ufuncs instead; float64 uses ndtr (exact to double rounding).
_TA = 1.0 / 0.29
_T_COEF = (  # T(t) = sum c_k t^k, k = 0..8
    2.5300251198439814e-05, 1.1512407663171274e-01, 1.2118253255304251e-01,
    7.6250101140942647e-02, 1.8556778190929579e-01, -1.4922667315449864e-01,
    3.0306264185675508e-01, -1.9079452100796884e-01, 3.8808738515441275e-02)
_T_HORNER = _T_COEF[-2::-1]  # c_7 .. c_0, after starting from c_8 * t


# The float32 GELU chains take their constants as 0-d float32 arrays: NumPy converts a Python
# float operand on every ufunc call (holding the GIL); a 0-d array of the operand's dtype
# gives the same bits without that.
def _f32(v):
    return np.array(v, np.float32)


_TA32, _ZERO32, _ONE32, _MHALF32, _M2_32 = _f32(_TA), _f32(0.0), _f32(1.0), _f32(-0.5), _f32(-2.0)
_INV_SQRT_2PI32, _M2_INV_SQRT_2PI32 = _f32(_INV_SQRT_2PI), _f32(-2.0 * _INV_SQRT_2PI)
_T8_32 = _f32(_T_COEF[8])
_T_HORNER32 = tuple(_f32(ck) for ck in _T_HORNER)
_SIGN32 = np.array(0x80000000, np.uint32)  # float32 sign bit


# ----------------------------------------------------------------------------- scratch
_UINT = {4: np.uint32, 8: np.uint64}


# Carved views by (id of the thread's scratch buffer, rows, d), for passes on the calling
# thread: carving seven views costs more than a small pass itself, and the buffer
# (kernels.memory) is the same on every call. Each entry holds its buffer, so an id is not
# reused while its entry exists. Split slices carve afresh: they are large, and whichever
# pool thread runs one then allocates the same few views every time.
_VIEWS = {}
_SLAB = {4: _SPLIT_BLOCK_BYTES // 4, 8: _SPLIT_BLOCK_BYTES // 8}  # elements per slab


def _scratch(dtype, rows, d, memo=True):
    """Scratch for one (rows, d) block: ``(a, b, c, d, m, tb, cu)``: four float arrays for the
    chains, a bool array for masks, a float array for the tiled bias, and c viewed as
    unsigned ints (sign-bit arithmetic). All are views of the calling thread's
    ``kernels.memory.scratch("activations")``, six slabs each starting on a cache line. A
    slab holds at least one split block, so a thread allocates its scratch once, on its first
    call, whatever block shapes it sees later."""
    n = rows * d
    isz = dtype.itemsize
    slab = _SLAB[isz] if n * isz <= _SPLIT_BLOCK_BYTES else -(-n * isz // ALIGN) * ALIGN // isz
    raw = _mem_scratch("activations", 6 * slab, dtype)  # (6 * slab,): 6 slabs
    owner = raw.base
    if memo:
        hit = _VIEWS.get((id(owner), rows, d))
        if hit is not None and hit[0] is owner:
            return hit[1]
    raw = raw.reshape(6, slab)
    a, b, c, dd, tb = raw[:5, :n].reshape(5, rows, d)  # a view: splits the contiguous axis
    m = raw[5].view(np.bool_)[:n].reshape(rows, d)
    views = (a, b, c, dd, m, tb, c.view(_UINT[isz]))
    if not memo:
        return views
    if len(_VIEWS) >= 256:  # many shapes or threads: start over rather than grow
        _VIEWS.clear()
    _VIEWS[(id(owner), rows, d)] = (owner, views)
    return views


def _block_rows(d, itemsize):
    return max(1, _BLOCK_BYTES // (d * itemsize))


def _split_rows(d, itemsize):
    return max(1, _SPLIT_BLOCK_BYTES // (d * itemsize))


def _same(a, b):
    """True when a and b are the same memory (same start; shapes and dtypes already match)."""
    return a is b or a.__array_interface__["data"][0] == b.__array_interface__["data"][0]


# ----------------------------------------------------------------------------- kernel contract
# Per row block, with ``sc`` from _scratch and ``slope`` leaky_relu's negative slope:
#   forward       fn(h, z, sc, slope, h_free)      h = act(z)
#   forward_grad  fn(h, z, g, sc, slope, h_free)   h = act(z), g = act'(z)
#   backward      fn(dz, dh, z, h, sc, slope)      dz = dh * act'(z); h = act(z) or None
# Forward kernels read z before writing h or g and write g last, so h or g may be z itself
# (not both). ``h_free`` is True when h is known not to be z: h may then serve as scratch
# until it is written (False: unknown). Backward kernels write dz in their last call, so dz
# may be dh, z or h itself.

# ----------------------------------------------------------------------------- identity
def _fwd_identity(h, z, sc, slope, h_free):
    if h_free or not _same(h, z):
        _copyto(h, z)


def _fwdg_identity(h, z, g, sc, slope, h_free):
    _fwd_identity(h, z, sc, slope, h_free)
    g.fill(1.0)


def _bwd_identity(dz, dh, z, h, sc, slope):
    if not _same(dz, dh):
        _copyto(dz, dh)


# ----------------------------------------------------------------------------- relu
def _fwd_relu(h, z, sc, slope, h_free):
    _max(z, 0.0, out=h)


def _fwdg_relu(h, z, g, sc, slope, h_free):
    m = sc[4]
    _gt(z, 0.0, m)                   # z > 0 (False for NaN, as the reference)
    _max(z, 0.0, out=h)
    _copyto(g, m)


def _bwd_relu(dz, dh, z, h, sc, slope):
    a, m = sc[0], sc[4]
    _gt(z, 0.0, m)                   # z > 0 (False for NaN, as the reference)
    _copyto(a, m)                    # 1.0 / 0.0
    _mul(dh, a, dz)


# ----------------------------------------------------------------------------- leaky_relu
def _fwd_leaky(h, z, sc, slope, h_free):
    a = sc[0]
    _mul(z, slope, a)
    # For slope <= 1, max(z, slope*z) is z where z > 0 and slope*z elsewhere; for slope > 1
    # the minimum is (NaN propagates as in the reference's where).
    (_max if slope <= 1.0 else _min)(z, a, out=h)


def _leaky_grad_from_mask(g, sc, slope):
    """g (holding 1.0 where z > 0, else 0.0) -> exactly 1 or slope."""
    if 0.0 <= slope <= 1.0:
        _max(g, slope, out=g)        # max(m, slope)
    else:
        b = sc[1]
        _sub(1.0, g, b)
        _mul(b, slope, b)
        _add(g, b, g)                # m + (1 - m) slope


def _fwdg_leaky(h, z, g, sc, slope, h_free):
    m = sc[4]
    _gt(z, 0.0, m)
    _fwd_leaky(h, z, sc, slope, h_free)
    _copyto(g, m)
    _leaky_grad_from_mask(g, sc, slope)


def _bwd_leaky(dz, dh, z, h, sc, slope):
    a, m = sc[0], sc[4]
    _gt(z, 0.0, m)
    _copyto(a, m)
    _leaky_grad_from_mask(a, sc, slope)
    _mul(dh, a, dz)


# ----------------------------------------------------------------------------- gelu
def _t_poly(c, t):
    """c = T(t) by Horner (16 passes over the block), float32."""
    _mul(t, _T8_32, c)
    _add(c, _T_HORNER32[0], c)
    for ck in _T_HORNER32[1:]:
        _mul(c, t, c)
        _add(c, ck, c)


def _fwd_gelu32(h, z, sc, slope, h_free):
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


def _fwd_gelu64(h, z, sc, slope, h_free):
    a = sc[0]
    _ndtr(z, a)                      # Phi(z): the expensive pass
    _mul(z, a, h)


def _gelu32_grad(h, z, g, a, b, c, cu, m):
    # With s = |z|, P = Phi(-s) = e(s) T(t) as in _fwd_gelu32 and Phi(z) = 1 - P (z >= 0) or
    # P (z < 0): h = z Phi(z) and act' = Phi(z) + z phi(z), phi(z) = e / sqrt(2 pi). The
    # select is sign-bit arithmetic, Phi(z) = H(z) - copysign(P, z), exact on the negative
    # side (no 0.5 + ... cancellation); z's sign bit decides both terms, so -0.0 counts as
    # negative in both. Sign bits are cheaper than a masked ufunc (where=) on a random mask.
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


def _fwdg_gelu32(h, z, g, sc, slope, h_free):
    _gelu32_grad(h, z, g, h if h_free else sc[0], sc[1], sc[2], sc[6], sc[4])


def _gelu64_parts(z, a, b):
    """a = Phi(z), b = z phi(z) (float64: ndtr, exact to double rounding)."""
    _ndtr(z, a)                      # Phi(z): the expensive pass
    _mul(z, -0.5, b)
    _mul(b, z, b)
    _exp(b, b)
    _mul(b, z, b)
    _mul(b, _INV_SQRT_2PI, b)        # z phi(z)


def _fwdg_gelu64(h, z, g, sc, slope, h_free):
    a, b = sc[0], sc[1]
    _gelu64_parts(z, a, b)
    _mul(z, a, h)
    _add(a, b, g)


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
    _ge(z, _ZERO32, sc[4])
    _copyto(a, sc[4])                # m
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


# ----------------------------------------------------------------------------- gelu_tanh
def _fwd_gelu_tanh(h, z, sc, slope, h_free):
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


def _gelu_tanh_parts(z, a, b):
    """a = z u'/2 and b = T = tanh(u), u = K (z + 0.044715 z^3), u' = K (1 + 3*0.044715 z^2):
    the factors both the derivative passes need (8 passes)."""
    _mul(z, z, a)
    _mul(a, _KC, b)
    _add(b, _K, b)
    _mul(b, z, b)
    _tanh(b, b)                      # T
    _mul(a, 1.5 * _KC, a)
    _add(a, 0.5 * _K, a)
    _mul(a, z, a)                    # z u' / 2


def _fwdg_gelu_tanh(h, z, g, sc, slope, h_free):
    # h = 0.5 z (1 + T), act' = (1 + T) (0.5 + (z u'/2) (1 - T)) as in _bwd_gelu_tanh.
    # 16 passes (8 + 14 separately).
    a, b, c = sc[0], sc[1], sc[2]
    _gelu_tanh_parts(z, a, b)
    _add(b, 1.0, c)                  # 1 + T
    _sub(1.0, b, b)                  # 1 - T
    _mul(a, b, a)
    _add(a, 0.5, a)
    _mul(c, z, b)
    _mul(b, 0.5, h)                  # h: z is dead from here
    _mul(a, c, g)


def _bwd_gelu_tanh(dz, dh, z, h, sc, slope):
    # act' = 0.5 (1 + T) + 0.5 z (1 - T^2) u' = (1 + T) (0.5 + (z u'/2) (1 - T)),
    # T = tanh(u), u' = K (1 + 3*0.044715 z^2). 14 passes.
    a, b, c = sc[0], sc[1], sc[2]
    _gelu_tanh_parts(z, a, b)
    _sub(1.0, b, c)
    _mul(a, c, a)
    _add(a, 0.5, a)
    _add(b, 1.0, c)
    _mul(a, c, a)
    _mul(dh, a, dz)


# ----------------------------------------------------------------------------- silu, sigmoid
def _neg_exp_clamped(a, z):
    """a = exp(min(-z, clamp)): finite for every finite z."""
    _mul(z, -1.0, a)
    _min(a, _EXP_CLAMP[a.dtype], out=a)
    _exp(a, a)


def _silu_exp(a, c, z):
    """c = max(z, -clamp) and a = exp(-c), finite for every z. c stands in for z in the
    chain: below -clamp silu and act' are tiny either way, and z itself would scale them up
    again (z / (1 + exp(clamp)) is -1.8 at z = -3e38 in float32)."""
    _max(z, -_EXP_CLAMP[z.dtype], out=c)
    _mul(c, -1.0, a)
    _exp(a, a)


def _fwd_silu(h, z, sc, slope, h_free):
    a, c = sc[0], sc[2]
    _silu_exp(a, c, z)               # z is dead from here
    _add(a, 1.0, a)
    _div(c, a, h)                    # z / (1 + exp(-z)); 5 passes, cheaper than scipy's expit


def _fwdg_silu(h, z, g, sc, slope, h_free):
    # h = z s, act' = s (1 + z E s) with E = exp(-z), s = 1/(1+E). 10 passes (5 + 10).
    a, b, c = sc[0], sc[1], sc[2]
    _silu_exp(a, c, z)               # E; z is dead from here
    _add(a, 1.0, b)
    _div(1.0, b, b)                  # s
    _mul(a, b, a)                    # 1 - s
    _mul(a, c, a)
    _mul(c, b, h)
    _add(a, 1.0, a)
    _mul(a, b, g)


def _bwd_silu(dz, dh, z, h, sc, slope):
    # act' = s (1 + z (1 - s)) with s = 1/(1+E), E = exp(-z), and 1 - s = E s computed without
    # cancellation. h is not used: z - h would cancel where 1 - s is small. 10 passes.
    a, b, c = sc[0], sc[1], sc[2]
    _silu_exp(a, c, z)               # E
    _add(a, 1.0, b)
    _div(1.0, b, b)                  # s
    _mul(a, b, a)                    # 1 - s
    _mul(a, c, a)
    _add(a, 1.0, a)
    _mul(a, b, a)
    _mul(dh, a, dz)


def _fwd_sigmoid(h, z, sc, slope, h_free):
    a = sc[0]
    _neg_exp_clamped(a, z)
    _add(a, 1.0, a)
    _div(1.0, a, h)


def _fwdg_sigmoid(h, z, g, sc, slope, h_free):
    a = sc[0]
    _neg_exp_clamped(a, z)           # E; z is dead from here
    _add(a, 1.0, h)
    _div(1.0, h, h)                  # s
    _mul(a, h, a)                    # E s = 1 - s
    _mul(a, h, g)


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


# ----------------------------------------------------------------------------- tanh
def _fwd_tanh(h, z, sc, slope, h_free):
    _tanh(z, h)


def _fwdg_tanh(h, z, g, sc, slope, h_free):
    a = sc[0]
    _tanh(z, h)                      # z is dead from here
    _mul(h, h, a)
    _sub(1.0, a, g)


def _bwd_tanh(dz, dh, z, h, sc, slope):
    a = sc[0]
    if h is not None:
        _mul(h, h, a)
    else:
        _tanh(z, a)
        _mul(a, a, a)
    _sub(1.0, a, a)
    _mul(dh, a, dz)


# ----------------------------------------------------------------------------- relu2
# Squared ReLU, max(z, 0)^2, act' = 2 max(z, 0) (So et al. 2021, "Primer").
def _fwd_relu2(h, z, sc, slope, h_free):
    a = sc[0]
    _max(z, 0.0, out=a)
    _mul(a, a, h)


def _fwdg_relu2(h, z, g, sc, slope, h_free):
    a = sc[0]
    _max(z, 0.0, out=a)              # z is dead from here
    _mul(a, a, h)
    _add(a, a, g)


def _bwd_relu2(dz, dh, z, h, sc, slope):
    a = sc[0]
    _max(z, 0.0, out=a)
    _add(a, a, a)
    _mul(dh, a, dz)


# ----------------------------------------------------------------------------- mish
# Mish, z tanh(softplus(z)) (Misra 2019). With e = exp(z): tanh(softplus(z)) = t = n / q,
# n = e (e + 2), q = n + 2, and act' = t + z sigmoid(z) (1 - t^2) = t + 4 z e (1 + e) / q^2
# (1 - t^2 = 4 (1 + e)^2 / q^2, no cancellation). z is clamped to [lo, hi] for exp and the
# act' term, and from below for h: above hi, t and act' round to 1 and h = z; below lo,
# h and act' are tiny numbers near lo * exp(lo) instead of underflowing (exp(lo) is normal),
# so no pass overflows or underflows.
_MISH_CLAMP = {F32: (-87.0, 20.0), F64: (-708.0, 40.0)}


def _fwd_mish(h, z, sc, slope, h_free):
    # 8 passes.
    a, b, c = sc[0], sc[1], sc[2]
    lo, hi = _MISH_CLAMP[z.dtype]
    _max(z, lo, out=a)               # z clamped below; z is dead from here
    _min(a, hi, out=b)
    _exp(b, b)                       # e
    _add(b, 2.0, c)
    _mul(c, b, c)                    # n
    _add(c, 2.0, b)                  # q
    _div(c, b, c)                    # t
    _mul(a, c, h)


def _mish_grad(a, b, c, d, z):
    """b = 4 z e (1 + e) / q^2 and d = t from z clamped to [lo, hi] in ``a`` (clamped below
    only, for h) and in b. 12 passes."""
    lo, hi = _MISH_CLAMP[z.dtype]
    _max(z, lo, out=a)               # z is dead from here
    _min(a, hi, out=b)
    _exp(b, c)                       # e
    _add(c, 2.0, d)
    _mul(d, c, d)                    # n
    _mul(b, c, b)
    _add(c, 1.0, c)
    _mul(b, c, b)                    # z e (1 + e)
    _add(d, 2.0, c)                  # q
    _div(d, c, d)                    # t
    _mul(c, c, c)
    _div(b, c, b)
    _mul(b, 4.0, b)                  # z sigmoid(z) (1 - t^2)


def _fwdg_mish(h, z, g, sc, slope, h_free):
    # 15 passes.
    a, b, c, d = sc[0], sc[1], sc[2], sc[3]
    _mish_grad(a, b, c, d, z)
    _mul(a, d, h)
    _add(d, b, g)


def _bwd_mish(dz, dh, z, h, sc, slope):
    # 15 passes.
    a, b, c, d = sc[0], sc[1], sc[2], sc[3]
    _mish_grad(a, b, c, d, z)
    _add(d, b, a)
    _mul(dh, a, dz)


# ----------------------------------------------------------------------------- registry
_KERNEL_FIELDS = ("forward", "forward_grad", "backward")


@dataclass(frozen=True)
class Activation:
    """One activation: its block kernels per dtype (see the kernel contract above), its naive
    twin ``reference`` / ``reference_grad`` (``(z, negative_slope) -> new array``, in
    kernels.reference) and ``sign_from_output``: act'(z) can be recomputed from act(z) itself
    (act' depends only on the sign of z, and act(z) > 0 exactly where z > 0), so a module may
    overwrite z with act(z) and run the backward on that buffer. For leaky_relu this holds for
    negative_slope >= 0. Construction checks every field for float32 and float64: an
    incomplete entry raises ValueError (TypeError for a wrong type) at import."""

    name: str
    forward: Mapping
    forward_grad: Mapping
    backward: Mapping
    reference: Callable
    reference_grad: Callable
    sign_from_output: bool
    # Ufunc passes per element of the costliest kernel (forward_grad or backward): large
    # chains split over threads at smaller sizes (kernels.parallel.threads_for).
    passes: int = 3

    def __post_init__(self):
        if not isinstance(self.name, str) or not self.name.isidentifier():
            raise ValueError(f"name: expected an identifier string, got {self.name!r}")
        for field in _KERNEL_FIELDS:
            kernels = getattr(self, field)
            if not isinstance(kernels, Mapping):
                raise TypeError(f"activation {self.name!r}: {field}: expected a mapping "
                                f"dtype -> kernel, got {type(kernels).__name__}")
            per_dtype = {}
            for key, fn in kernels.items():
                try:
                    dt = np.dtype(key)
                except TypeError:
                    raise ValueError(f"activation {self.name!r}: {field}: {key!r} is not a "
                                     f"dtype") from None
                if dt not in DTYPES:
                    raise ValueError(f"activation {self.name!r}: {field}: expected kernels for "
                                     f"float32 and float64 only, got {dt}")
                if not callable(fn):
                    raise TypeError(f"activation {self.name!r}: {field}[{dt}]: expected a "
                                    f"callable, got {fn!r}")
                per_dtype[dt] = fn
            missing = [str(dt) for dt in DTYPES if dt not in per_dtype]
            if missing:
                raise ValueError(f"activation {self.name!r}: {field}: no kernel for "
                                 f"{', '.join(missing)}")
            object.__setattr__(self, field, MappingProxyType(per_dtype))
        for field in ("reference", "reference_grad"):
            if not callable(getattr(self, field)):
                raise TypeError(f"activation {self.name!r}: {field}: expected a callable, got "
                                f"{getattr(self, field)!r}")
        if isinstance(self.passes, bool) or not isinstance(self.passes, int):
            raise TypeError(f"activation {self.name!r}: passes: expected an int, got "
                            f"{self.passes!r}")
        if self.passes < 1:
            raise ValueError(f"activation {self.name!r}: passes: expected an int >= 1, got "
                             f"{self.passes}")
        if not isinstance(self.sign_from_output, bool):
            raise TypeError(f"activation {self.name!r}: sign_from_output: expected a bool, got "
                            f"{self.sign_from_output!r}")


def _both(fn):
    """The same kernel for float32 and float64."""
    return {F32: fn, F64: fn}


def _entry(name, forward, forward_grad, backward, sign_from_output, passes):
    """An entry whose kernels serve float32 and float64 alike, with the reference pair
    ``kernels.reference.<name>`` / ``<name>_grad`` (missing: AttributeError at import)."""
    return Activation(name, _both(forward), _both(forward_grad), _both(backward),
                      getattr(R, name), getattr(R, name + "_grad"),
                      sign_from_output=sign_from_output, passes=passes)


def _registry(*entries):
    reg = {}
    for e in entries:
        if not isinstance(e, Activation):
            raise TypeError(f"expected an Activation, got {type(e).__name__}")
        if e.name in reg:
            raise ValueError(f"activation {e.name!r} is registered twice")
        reg[e.name] = e
    return MappingProxyType(reg)


REGISTRY = _registry(
    _entry("identity", _fwd_identity, _fwdg_identity, _bwd_identity, sign_from_output=True,
           passes=1),
    _entry("relu", _fwd_relu, _fwdg_relu, _bwd_relu, sign_from_output=True, passes=3),
    _entry("leaky_relu", _fwd_leaky, _fwdg_leaky, _bwd_leaky, sign_from_output=True, passes=5),
    Activation("gelu", {F32: _fwd_gelu32, F64: _fwd_gelu64},
               {F32: _fwdg_gelu32, F64: _fwdg_gelu64}, {F32: _bwd_gelu32, F64: _bwd_gelu64},
               R.gelu, R.gelu_grad, sign_from_output=False, passes=32),
    _entry("gelu_tanh", _fwd_gelu_tanh, _fwdg_gelu_tanh, _bwd_gelu_tanh, sign_from_output=False,
           passes=15),
    _entry("silu", _fwd_silu, _fwdg_silu, _bwd_silu, sign_from_output=False, passes=10),
    _entry("sigmoid", _fwd_sigmoid, _fwdg_sigmoid, _bwd_sigmoid, sign_from_output=False,
           passes=8),
    _entry("tanh", _fwd_tanh, _fwdg_tanh, _bwd_tanh, sign_from_output=False, passes=4),
    _entry("relu2", _fwd_relu2, _fwdg_relu2, _bwd_relu2, sign_from_output=False, passes=3),
    _entry("mish", _fwd_mish, _fwdg_mish, _bwd_mish, sign_from_output=False, passes=15),
)
ACTIVATIONS = tuple(REGISTRY)


# ----------------------------------------------------------------------------- row runners
# A pass over rows [i0, i1) in blocks of ``rows`` rows on the calling thread's scratch. Large
# arrays are split into one such slice per thread (kernels.parallel.split); a split slice
# uses blocks of _SPLIT_BLOCK_BYTES, an inline pass blocks of _BLOCK_BYTES.
def _fwd_rows(h, z, bias, g, fn, slope, h_free, i0, i1, rows, memo):
    d = z.shape[1]
    dt = z.dtype
    sc = _scratch(dt, min(rows, i1 - i0), d, memo)
    tb = sc[5]
    if bias is not None:
        _copyto(tb, bias)            # tiled once per slice, reused by every block
    for i in range(i0, i1, rows):
        j = i + rows
        if j > i1:  # remainder block: views of the same scratch, fewer rows
            j = i1
            sc = tb = None           # one set of views alive at a time
            sc = _scratch(dt, j - i, d, memo)
            tb = sc[5]
        zb = z[i:j]
        if bias is not None:
            _add(zb, tb, zb)
        if g is None:
            fn(h[i:j], zb, sc, slope, h_free)
        else:
            fn(h[i:j], zb, g[i:j], sc, slope, h_free)


def _bwd_rows(dz, dh, z, h, fn, slope, i0, i1, rows, memo):
    d = z.shape[1]
    dt = z.dtype
    sc = _scratch(dt, min(rows, i1 - i0), d, memo)
    for i in range(i0, i1, rows):
        j = i + rows
        if j > i1:
            j = i1
            sc = None
            sc = _scratch(dt, j - i, d, memo)
        fn(dz[i:j], dh[i:j], z[i:j], None if h is None else h[i:j], sc, slope)


def _run_rows(runner, n, d, itemsize, passes, *args):
    """``runner(*args, i0, i1, rows, memo)`` over rows [0, n) of an (n, d) pass of ``passes``
    ufunc passes per element, split over threads when its work is large (the result does
    not depend on the split: every element is computed alike)."""
    block = _block_rows(d, itemsize)
    k = _threads_for(n, d, passes=passes)
    if k == 1:  # no closure, no pool call
        runner(*args, 0, n, block, True)
        return
    split_block = _split_rows(d, itemsize)

    def run(i0, i1, slot):
        runner(*args, i0, i1, split_block, False)

    _split(run, n, d, k=k)


# ----------------------------------------------------------------------------- unchecked cores
def bias_act_forward_unchecked(h, z, bias=None, act="relu", negative_slope=0.01, grad=None):
    """``bias_act_forward`` without argument checks (hot path): the caller guarantees 2-D
    C-contiguous ``h``, ``z`` (and ``grad``, or None) of one shape and dtype (float32/float64),
    ``bias`` of shape (d,) or None, a registered ``act`` and a Python float ``negative_slope``."""
    n, d = z.shape
    if n == 0 or d == 0:
        return h
    entry = REGISTRY[act]
    rows = _block_rows(d, z.itemsize)
    if n <= rows:  # one block: no loop machinery (small arrays are bound by call overhead)
        sc = _scratch(z.dtype, n, d)
        if bias is not None:
            tb = sc[5]
            _copyto(tb, bias)        # (n, d) tiled bias: a plain add, not a broadcast one
            _add(z, tb, z)
        if grad is None:
            entry.forward[z.dtype](h, z, sc, negative_slope, False)
        else:
            entry.forward_grad[z.dtype](h, z, grad, sc, negative_slope, False)
        return h
    fn = (entry.forward if grad is None else entry.forward_grad)[z.dtype]
    _run_rows(_fwd_rows, n, d, z.itemsize, entry.passes, h, z, bias, grad, fn, negative_slope,
              not _same(h, z))
    return h


def act_backward_unchecked(dz, dh, z, act="relu", negative_slope=0.01, h=None):
    """``act_backward`` without argument checks (hot path); same guarantees as
    ``bias_act_forward_unchecked`` for ``dz``, ``dh``, ``z`` and ``h`` (or None)."""
    n, d = z.shape
    if n == 0 or d == 0:
        return dz
    entry = REGISTRY[act]
    fn = entry.backward[z.dtype]
    rows = _block_rows(d, z.itemsize)
    if n <= rows:
        fn(dz, dh, z, h, _scratch(z.dtype, n, d), negative_slope)
        return dz
    _run_rows(_bwd_rows, n, d, z.itemsize, entry.passes, dz, dh, z, h, fn, negative_slope)
    return dz


def act_backward_cached_unchecked(dz, dh, grad):
    """``act_backward_cached`` without argument checks: ``dz = dh * grad`` for C-contiguous
    arrays of one shape and dtype (``dz`` may be ``dh`` or ``grad``). One pass, no scratch."""
    n, d = dh.shape
    if n * d < SPLIT_MIN:
        _mul(dh, grad, dz)
    else:
        _split(lambda i, j, slot: _mul(dh[i:j], grad[i:j], dz[i:j]), n, d)
    return dz


def bias_grad_unchecked(db, dz):
    """``db += dz.sum(0)`` via gemv with a ones vector (no checks)."""
    if dz.shape[1] == 0:  # scipy's gemv rejects an empty y
        return db
    return gemv_colsum(db, dz, 1.0)


# ----------------------------------------------------------------------------- checked API
def _check_act(act):
    if not isinstance(act, str) or act not in REGISTRY:
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
    backward gets ``h`` instead of needing ``z``, e.g. for sigmoid/tanh, or when the entry's
    ``sign_from_output`` is set). ``grad`` (an array like ``z``, or None) receives the
    derivative for ``act_backward_cached``, computed in the same pass from what act(z) needs
    anyway; it may be ``z`` itself (z is not needed once its derivative is cached) but not
    ``h``. ``act`` is one of ``ACTIVATIONS``; ``negative_slope`` is leaky_relu's slope.
    float32 ``gelu`` evaluates the normal CDF through a polynomial erfc (within 1.5e-6
    relative of the exact GELU for |z| < 5, 1e-5 out to the underflow: a few float32 ulps);
    float64 ``gelu`` uses scipy's ndtr. sigmoid, silu and mish clamp exp's argument, so
    below z = -88 (float32) / -708 (float64) they give the tiny positive (sigmoid) or negative
    (silu, mish) number of the clamping point instead of an underflowed 0.
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

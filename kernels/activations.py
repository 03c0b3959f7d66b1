"""Fused bias + activation passes and their backward: one compiled loop per element.

``bias_act_forward`` adds the bias row to ``z`` in place and writes ``h = act(z)`` and, on
request, ``grad = act'(z)`` in the same pass (grad may overwrite z), so that the backward is
``act_backward_cached``: ``dz = dh * grad``; ``act_backward`` recomputes ``act'(z)`` instead.
Both backward passes can add the bias gradient ``db += dz.sum(0)`` on the way (``db=``),
summed in float64 in row order per column, so the result does not depend on the thread
count; ``bias_grad`` is the same sum through BLAS gemv for a gradient computed elsewhere.

The loops are generated from each activation's scalar pair (kernels.activation_pairs, the
registry; kernels/_activation_kernels.py, the generated kernels) and compiled by numba on
first use per kernel and dtype, then loaded from its disk cache. They release the GIL and run
on row slices (column slices for the bias-gradient sum) through kernels.parallel.
"""
from __future__ import annotations

import math
import threading

import numpy as np

from .activation_pairs import ACTIVATIONS, REGISTRY, Activation
from .gemm import check_array, gemv_colsum
from .jit import jit
from .memory import scratch as _scratch
from .parallel import split as _split
from .parallel import threads_for as _threads_for

__all__ = [
    "Activation", "REGISTRY", "ACTIVATIONS", "kernels_for",
    "bias_act_forward", "act_backward", "act_backward_cached", "bias_grad",
    "bias_act_forward_unchecked", "act_backward_unchecked", "act_backward_cached_unchecked",
    "bias_grad_unchecked",
]

F32, F64 = np.dtype(np.float32), np.dtype(np.float64)
DTYPES = (F32, F64)
_COLS = 16  # column slices of the bias-gradient passes start on multiples of 16 elements
# Elements from which the bias-gradient passes split their columns over threads: each thread
# then walks every row, and on two cores it lost at every size measured up to 4 Mi elements
# (docs/performance.md, "Split thresholds").
COLS_SPLIT_MIN = 8 * 1024 * 1024

# ----------------------------------------------------------------------------- generated kernels
_table: dict = {}
_table_lock = threading.Lock()


def _load():
    # Imported on first use: `import kernels` (and the generator itself) must work while the
    # generated module is missing or stale; a test checks that it is current.
    from . import _activation_kernels as gen
    missing = [n for n in REGISTRY if (n, F32) not in gen.KERNELS or (n, F64) not in gen.KERNELS]
    if missing:
        raise RuntimeError(f"kernels/_activation_kernels.py has no kernels for {missing}: "
                           f"run python -m kernels.gen_activations")
    return dict(gen.KERNELS)


def kernels_for(act: str, dtype):
    """The generated kernels (a ``Kernels`` named tuple: fwd, fwd_ip, fwd_gz, bwd, bwd_ip,
    bwd_db, bwd_ip_db, glu) of activation ``act`` for ``dtype`` (float32 or float64)."""
    try:
        return _table[(act, dtype)]
    except KeyError:
        pass
    if not _table:
        with _table_lock:
            if not _table:
                _table.update(_load())
    try:
        return _table[(act, dtype)]
    except KeyError:
        raise ValueError(f"no kernels for activation {act!r} and dtype {np.dtype(dtype)}") from None


# ----------------------------------------------------------------------------- shared kernels
# The passes that do not depend on the activation: the cached backward (a multiply, with or
# without the bias-gradient sum), and the bias add the rare forward combinations run first.
@jit
def _mul(dz, dh, g, i0, i1, slope):
    """dz = dh * g, rows [i0, i1)."""
    d = g.shape[1]
    lo, hi = i0 * d, i1 * d
    dzf, dhf, gf = dz.reshape(-1)[lo:hi], dh.reshape(-1)[lo:hi], g.reshape(-1)[lo:hi]
    for k in range(gf.size):  # from 0: numba's negative-index fix-up would stop the vectoriser
        dzf[k] = dhf[k] * gf[k]


@jit
def _mul_ip(dh, g, i0, i1, slope):
    """dh *= g, rows [i0, i1)."""
    d = g.shape[1]
    dhf, gf = dh.reshape(-1)[i0 * d:i1 * d], g.reshape(-1)[i0 * d:i1 * d]
    for k in range(gf.size):
        dhf[k] = dhf[k] * gf[k]


# Rows per block of the column sums, summed in the dtype, then the block sums in float64 (as
# the generated kernels do): a float64 accumulator in the loop would halve its vector width.
_SUM_ROWS = 32


# The column-sum loops index flat views with unsigned offsets: numba adds a negative-index
# fix-up to signed indices it cannot prove non-negative, and that stops the vectoriser.
@jit
def _mul_db(dz, dh, g, db, acc, part, j0, j1, slope):
    """dz = dh * g and db += dz.sum(0) over columns [j0, j1), in row order per column."""
    n, d = g.shape
    m = j1 - j0
    dzf, dhf, gf = dz.reshape(-1), dh.reshape(-1), g.reshape(-1)
    accs, parts = acc[j0:j1], part[j0:j1]
    for j in range(m):
        accs[j] = 0.0
        parts[j] = 0.0
    for r0 in range(0, n, _SUM_ROWS):
        for i in range(r0, min(r0 + _SUM_ROWS, n)):
            base = np.uint64(i * d + j0)
            for j in range(m):
                k = base + np.uint64(j)
                v = dhf[k] * gf[k]
                dzf[k] = v
                parts[j] += v
        for j in range(m):
            accs[j] += parts[j]
            parts[j] = 0.0
    dbs = db[j0:j1]
    for j in range(m):
        dbs[j] += accs[j]


@jit
def _mul_ip_db(dh, g, db, acc, part, j0, j1, slope):
    """dh *= g and db += dh.sum(0) over columns [j0, j1), in row order per column."""
    n, d = g.shape
    m = j1 - j0
    dhf, gf = dh.reshape(-1), g.reshape(-1)
    accs, parts = acc[j0:j1], part[j0:j1]
    for j in range(m):
        accs[j] = 0.0
        parts[j] = 0.0
    for r0 in range(0, n, _SUM_ROWS):
        for i in range(r0, min(r0 + _SUM_ROWS, n)):
            base = np.uint64(i * d + j0)
            for j in range(m):
                k = base + np.uint64(j)
                v = dhf[k] * gf[k]
                dhf[k] = v
                parts[j] += v
        for j in range(m):
            accs[j] += parts[j]
            parts[j] = 0.0
    dbs = db[j0:j1]
    for j in range(m):
        dbs[j] += accs[j]


@jit
def _copy_bias(dst, z, b, i0, i1, slope):
    """z += b and dst = z in every row of [i0, i1)."""
    d = z.shape[1]
    for i in range(i0, i1):
        zi, di = z[i], dst[i]
        for j in range(d):
            v = zi[j] + b[j]
            zi[j] = v
            di[j] = v


# ----------------------------------------------------------------------------- runners
def _rows(kern, n, d, slope, *arrays):
    """``kern(*arrays, i0, i1, slope)`` over rows [0, n), split over threads when large (the
    result does not depend on the split: every element is computed alike)."""
    k = _threads_for(n, d)
    if k <= 1:
        kern(*arrays, 0, n, slope)
    else:
        _split(lambda i0, i1, s: kern(*arrays, i0, i1, slope), n, d, k=k)


def _cols(kern, n, d, slope, *arrays):
    """``kern(*arrays, j0, j1, slope)`` over columns [0, d) in slices starting on multiples of
    _COLS, split over threads when large: each column is summed over all its rows in order
    by one thread, whatever the thread count."""
    groups = -(-d // _COLS)
    k = min(_threads_for(n, d, COLS_SPLIT_MIN), groups)
    if k <= 1:
        kern(*arrays, 0, d, slope)
    else:
        _split(lambda g0, g1, s: kern(*arrays, g0 * _COLS, min(g1 * _COLS, d), slope),
               groups, n * _COLS, k=k)


_neg_zero: dict = {}  # dtype -> a row of -0.0, grown on demand, never written
_neg_zero_views: dict = {}


def _no_bias(d, dtype):
    """A (d,) row of -0.0: z + (-0.0) is z for every z (-0.0 included), so the kernels that
    add a bias take this one when there is none."""
    v = _neg_zero_views.get((d, dtype))
    if v is None:
        buf = _neg_zero.get(dtype)
        if buf is None or buf.size < d:
            buf = _neg_zero[dtype] = np.full(max(d, 1024), -0.0, dtype)
        if len(_neg_zero_views) >= 256:
            _neg_zero_views.clear()
        v = _neg_zero_views[(d, dtype)] = buf[:d]  # an old buffer stays valid in its views
    return v


def _same(a, b):
    """On the hot path: True when output a is input b itself. Callers pass an output that is
    the input or does not overlap it (the checked API refuses partial overlaps), so a bounds
    check is enough (cheaper than reading the data pointers)."""
    return a is b or np.may_share_memory(a, b)


def _same_start(a, b):
    """True when a and b start at the same address (shapes and dtypes already match)."""
    return a is b or a.__array_interface__["data"][0] == b.__array_interface__["data"][0]


def _sums(d, dtype):
    """Scratch of the column sums: (d,) float64 totals and (d,) block sums in ``dtype``."""
    return _scratch("activations.colsum", d, F64), _scratch("activations.colpart", d, dtype)


# ----------------------------------------------------------------------------- unchecked cores
def _copy_in(dst, z, bias, n, d):
    """dst = z (+ bias, added into z too): the first pass of the combinations without a
    kernel of their own."""
    if bias is None:
        np.copyto(dst, z)
    else:
        _rows(_copy_bias, n, d, 0.0, dst, z, bias)


def bias_act_forward_unchecked(h, z, bias=None, act="relu", negative_slope=0.01, grad=None):
    """``bias_act_forward`` without argument checks (hot path): the caller guarantees 2-D
    C-contiguous ``h``, ``z`` (and ``grad``, or None) of one shape and dtype (float32/float64),
    ``bias`` of shape (d,) or None, a registered ``act`` and a Python float ``negative_slope``.
    One pass when h is z (no grad) or grad is z; otherwise z (+ bias) is first copied into
    the output the act is then computed over in place."""
    n, d = z.shape
    if n == 0 or d == 0:
        return h
    kern = kernels_for(act, z.dtype)
    s = negative_slope
    if grad is None:
        if _same(h, z):
            _rows(kern.fwd_ip, n, d, s, z, _no_bias(d, z.dtype) if bias is None else bias)
        else:
            _copy_in(h, z, bias, n, d)
            _rows(kern.fwd_ip, n, d, s, h, _no_bias(d, z.dtype))
    elif _same(grad, z):
        _rows(kern.fwd_gz, n, d, s, h, z, _no_bias(d, z.dtype) if bias is None else bias)
    else:  # grad separate: z (+ bias) into grad, then act into h and act' over grad
        _copy_in(grad, z, bias, n, d)
        _rows(kern.fwd_gz, n, d, s, h, grad, _no_bias(d, z.dtype))
    return h


def act_backward_unchecked(dz, dh, z, act="relu", negative_slope=0.01, h=None, db=None):
    """``act_backward`` without argument checks (hot path); same guarantees as
    ``bias_act_forward_unchecked`` for ``dz``, ``dh``, ``z``, and ``db`` (d,) or None. One
    pass when dz is dh; otherwise dh is first copied into dz (or, when dz is z, into
    scratch)."""
    n, d = z.shape
    if n == 0 or d == 0:
        return dz
    kern = kernels_for(act, z.dtype)
    out = dz
    if not _same(dz, dh):
        if _same(dz, z):  # z is still needed: work in scratch, then copy over z
            out = _scratch("activations.dz", (n, d), z.dtype)
        np.copyto(out, dh)
    if db is None:
        _rows(kern.bwd_ip, n, d, negative_slope, out, z)
    else:
        _cols(kern.bwd_ip_db, n, d, negative_slope, out, z, db, *_sums(d, z.dtype))
    if out is not dz:
        np.copyto(dz, out)
    return dz


def act_backward_cached_unchecked(dz, dh, grad, db=None):
    """``act_backward_cached`` without argument checks: ``dz = dh * grad`` (and ``db +=
    dz.sum(0)``) for C-contiguous arrays of one shape and dtype (``dz`` may be ``dh`` or
    ``grad``). One pass."""
    n, d = dh.shape
    if n == 0 or d == 0:
        return dz
    if _same(dz, grad):  # dz = grad * dh: the same product
        dh, grad = grad, dh
    if db is None:
        if _same(dz, dh):
            _rows(_mul_ip, n, d, 0.0, dh, grad)
        else:
            _rows(_mul, n, d, 0.0, dz, dh, grad)
    elif _same(dz, dh):
        _cols(_mul_ip_db, n, d, 0.0, dh, grad, db, *_sums(d, dh.dtype))
    else:
        _cols(_mul_db, n, d, 0.0, dz, dh, grad, db, *_sums(d, dh.dtype))
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
    if isinstance(negative_slope, bool) or not isinstance(
            negative_slope, (int, float, np.floating, np.integer)):
        raise TypeError(f"negative_slope: expected a real number, got "
                        f"{type(negative_slope).__name__}")
    slope = float(negative_slope)
    if not math.isfinite(slope):
        raise ValueError(f"negative_slope: expected a finite number, got {slope}")
    return slope


def _check_alias(out_name, out, in_name, x):
    """An output may be an input itself, but must not partly overlap it."""
    if np.may_share_memory(out, x) and not (out.shape == x.shape and _same_start(out, x)):
        raise ValueError(f"{out_name}: must be {in_name} itself or not overlap it")


def _check_writeable(name, x):
    if not x.flags.writeable:
        raise ValueError(f"{name}: expected a writeable array (it is written in place)")


def _check_db(db, d, dtype, *others):
    check_array("db", db, dtype=dtype, shape=(d,))
    _check_writeable("db", db)
    if any(np.may_share_memory(db, x) for x in others):
        raise ValueError("db: must not overlap the other arrays")


def bias_act_forward(h, z, bias=None, act="relu", negative_slope=0.01, grad=None):
    """``z += bias`` (in place, when ``bias`` is given), then ``h = act(z)`` and, when ``grad``
    is given, ``grad = act'(z)``; returns ``h``.

    ``z`` and ``h`` are C-contiguous (N, d) float32/float64 arrays of one dtype, ``bias`` is
    (d,) or None. ``h`` may be ``z`` itself: then z is overwritten by act(z) (fine when the
    entry's ``sign_from_output`` is set: the backward can run on act(z)). ``grad`` (an array
    like ``z``, or None) receives the derivative for ``act_backward_cached``, computed in the
    same pass; it may be ``z`` itself (z is not needed once its derivative is cached) but not
    ``h``. ``act`` is one of ``ACTIVATIONS``; ``negative_slope`` is leaky_relu's slope.
    float32 kernels evaluate exp, tanh and the normal CDF by polynomial and rational
    approximations within a few float32 ulps (kernels.fmath); float64 ones call libm.
    Large arrays are split over the blasnet thread count (kernels.parallel); the result does
    not depend on the split.
    """
    check_array("z", z, ndim=2)
    check_array("h", h, dtype=z.dtype, shape=z.shape)
    _check_writeable("h", h)
    if grad is not None:
        check_array("grad", grad, dtype=z.dtype, shape=z.shape)
        _check_writeable("grad", grad)
    if bias is not None:
        check_array("bias", bias, dtype=z.dtype, shape=(z.shape[1],))
        if (np.may_share_memory(bias, z) or np.may_share_memory(bias, h)
                or grad is not None and np.may_share_memory(bias, grad)):
            raise ValueError("bias: must not overlap z, h or grad (z += bias would change it)")
        _check_writeable("z", z)
    _check_act(act)
    slope = _check_slope(negative_slope)
    _check_alias("h", h, "z", z)
    if grad is not None:
        _check_alias("grad", grad, "z", z)
        if np.may_share_memory(grad, h):
            raise ValueError("grad: must not overlap h")
    return bias_act_forward_unchecked(h, z, bias, act, slope, grad)


def act_backward(dz, dh, z, act="relu", negative_slope=0.01, h=None, db=None):
    """``dz = dh * act'(z)``, and ``db += dz.sum(axis=0)`` when ``db`` (d,) is given (summed
    in float64, in row order: the same bits whatever the thread count); returns ``dz``.
    ``dz`` may be ``dh`` or ``z`` itself (in place).

    ``h``, the forward output act(z), is accepted for symmetry and not needed (act' is
    recomputed from z). Arrays as in ``bias_act_forward``.
    """
    check_array("z", z, ndim=2)
    check_array("dh", dh, dtype=z.dtype, shape=z.shape)
    check_array("dz", dz, dtype=z.dtype, shape=z.shape)
    _check_writeable("dz", dz)
    if h is not None:
        check_array("h", h, dtype=z.dtype, shape=z.shape)
        _check_alias("dz", dz, "h", h)
    _check_act(act)
    slope = _check_slope(negative_slope)
    _check_alias("dz", dz, "dh", dh)
    _check_alias("dz", dz, "z", z)
    if db is not None:
        _check_db(db, z.shape[1], z.dtype, dz, dh, z)
    return act_backward_unchecked(dz, dh, z, act, slope, h, db)


def act_backward_cached(dz, dh, grad, db=None):
    """``dz = dh * grad``, with ``grad = act'(z)`` cached by ``bias_act_forward(..., grad=)``,
    and ``db += dz.sum(axis=0)`` when ``db`` is given (as in ``act_backward``); returns
    ``dz``. ``dz`` may be ``dh`` or ``grad`` itself. Arrays as in ``act_backward``."""
    check_array("grad", grad, ndim=2)
    check_array("dh", dh, dtype=grad.dtype, shape=grad.shape)
    check_array("dz", dz, dtype=grad.dtype, shape=grad.shape)
    _check_writeable("dz", dz)
    _check_alias("dz", dz, "dh", dh)
    _check_alias("dz", dz, "grad", grad)
    if db is not None:
        _check_db(db, grad.shape[1], grad.dtype, dz, dh, grad)
    return act_backward_cached_unchecked(dz, dh, grad, db)


def bias_grad(db, dz):
    """``db += dz.sum(axis=0)`` (accumulates, like every parameter gradient); returns ``db``.
    ``dz`` is a C-contiguous (N, d) array, ``db`` a (d,) array of the same dtype."""
    check_array("dz", dz, ndim=2)
    check_array("db", db, dtype=dz.dtype, shape=(dz.shape[1],))
    if np.may_share_memory(db, dz):
        raise ValueError("db: must not overlap dz")
    return bias_grad_unchecked(db, dz)

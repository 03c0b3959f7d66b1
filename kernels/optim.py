"""In-place optimizer updates: AdamW and SGD with PyTorch's semantics.

Parameters and their state are walked as flat views (C- or Fortran-contiguous, never
copied) in blocks of ~256 KiB through small per-thread scratch buffers, so no temporary the
size of a parameter is ever made (the reference's whole-array AdamW makes 12). Large
parameters (kernels.parallel.chunks decides) are split over blasnet's threads; every
element goes through the same correctly rounded ufuncs whatever the split, so results do
not depend on it."""
from __future__ import annotations

import itertools
import math
import numbers
import threading

import numpy as np

from . import parallel as _par

__all__ = ["adamw_update", "sgd_update", "adamw_update_unchecked", "sgd_update_unchecked",
           "flat_view"]

_FLOATS = (np.dtype(np.float32), np.dtype(np.float64))
# Block size in bytes per array: 64 Ki float32 / 32 Ki float64 elements. Measured on AdamW
# (2.1M float32): 8 Ki elements 11.1 ms, 16 Ki 9.6, 32 Ki 7.1, 64 Ki 6.4 (reference 20 ms).
# BLAS axpy would save a pass but OpenBLAS threads it above 10000 elements, which on a
# loaded machine cost ~10x (measured again: 36 ms instead of 5), and its fused multiply-add
# would round differently from the ufunc chain, so results would depend on the thread count.
_BLOCK_BYTES = 256 * 1024
# Large updates are split over blasnet's threads. AdamW over the large FFN's 2.1M float32
# parameters, 2 threads, medians in ms:
#                        alone, back to back    right after a forward+backward
#     inline                     5.4                       5.8
#     split                      3.6                       4.1
# That needs OpenBLAS's workers asleep between GEMMs (kernels.threads sets
# OPENBLAS_THREAD_TIMEOUT=4): with OpenBLAS's default they spin on the second core for
# ~0.1 s after each GEMM, and there the split lost (6.4 vs 5.4 ms after a forward+backward).
# It also loses when the process has idled (~7 vs 5.4 ms after 0.2 s asleep: the pool
# thread wakes slowly). A thread waiting for the GIL sleeps, and waking one took 10-50 us
# here (tail to ms), so split ufunc calls must be long: 64 Ki-element blocks gave 1.3x,
# 128 Ki 1.5x (back to back).
_SPLIT = True
_PAR_BLOCK_BYTES = 512 * 1024

_tls = threading.local()  # per-thread scratch: pool threads run the same kernel at once


def _scratch(dtype, nbytes):
    """Two flat scratch buffers of ``nbytes`` for this thread and dtype (allocated once)."""
    try:
        return _tls.bufs[dtype, nbytes]
    except AttributeError:
        _tls.bufs = {}
    except KeyError:
        pass
    n = nbytes // dtype.itemsize
    s = _tls.bufs[dtype, nbytes] = (np.empty(n, dtype), np.empty(n, dtype))  # 2 x (block,)
    return s


def _slot_scratch(dtype, k):
    """Scratch pairs of ``_PAR_BLOCK_BYTES`` for the ``k`` slices of a split update made by
    this thread: slot s serves whichever thread runs slice s, so which pool thread that is
    does not matter. Allocated once per calling thread."""
    slots = getattr(_tls, "slots", None)
    if slots is None:
        slots = _tls.slots = {}
    s = slots.get(dtype)
    if s is None or len(s) < k:
        n = _PAR_BLOCK_BYTES // dtype.itemsize
        s = slots[dtype] = [(np.empty(n, dtype), np.empty(n, dtype)) for _ in range(k)]
    return s


def _serial(n):
    """True when an update over ``n`` elements runs inline on the calling thread."""
    return not _SPLIT or n < _par.MIN_ELEMENTS_PER_THREAD or _par.chunks(n, 1) == 1


def _split(chain, arrays, consts):
    """``chain(*blocks_of_arrays, scratch_a, scratch_b, *consts)`` over ~512 KiB blocks,
    run by blasnet's threads, which take blocks from a shared counter until none is left:
    a thread that starts late (the pool thread must wake up first, or its core is busy)
    takes fewer blocks, and the caller never waits for more than the block another thread
    is finishing. Block boundaries do not change any result: every element goes through
    the same ufuncs."""
    n, dtype = arrays[0].size, arrays[0].dtype
    k = _par.chunks(n, 1)
    blk = _PAR_BLOCK_BYTES // dtype.itemsize
    nblk = -(-n // blk)
    counter = itertools.count()  # next() is atomic under the GIL
    slots = _slot_scratch(dtype, k)

    def worker(s, _):
        ta, tb = slots[s]
        for b in counter:
            if b >= nblk:
                return
            i = b * blk
            j = min(i + blk, n)
            chain(*[a[i:j] for a in arrays], ta[:j - i], tb[:j - i], *consts)
    _par.parallel_for(worker, k, k)


def flat_view(a):
    """The elements of a C- or Fortran-contiguous array as a 1-D view in memory order (no
    copy; 0-d arrays give a (1,) view). The caller guarantees contiguity."""
    return a.reshape(-1) if a.flags.c_contiguous else a.T.reshape(-1)


def _adamw_chain(pb, gb, mb, vb, tb, _, decay, beta1, a1, beta2, a2, eps_hat, step_size):
    """One AdamW block: 13 passes (12 without decay), each a plain ufunc on blocks that stay
    in L2, so DRAM sees each array once. Binary ufuncs cannot do it in fewer: m needs two
    scalings and an add, v a square, two scalings and an add, the update a sqrt, +eps, a
    divide, a scaling and a subtract."""
    if decay != 1.0:
        pb *= decay                            # decoupled weight decay, first
    mb *= beta1                                # m = b1 m + (1 - b1) g
    np.multiply(gb, a1, tb)
    mb += tb
    vb *= beta2                                # v = b2 v + (1 - b2) g g
    np.multiply(gb, a2, tb)
    tb *= gb
    vb += tb
    np.sqrt(vb, tb)                            # p -= step_size * m / (sqrt(v) + eps_hat)
    tb += eps_hat
    np.divide(mb, tb, tb)
    tb *= step_size
    pb -= tb


def adamw_update_unchecked(param, grad, exp_avg, exp_avg_sq, step, lr, beta1=0.9,
                           beta2=0.999, eps=1e-8, weight_decay=1e-2):
    """``adamw_update`` without argument checks (hot path): four distinct arrays of one
    shape, dtype and memory order (all C- or all Fortran-contiguous)."""
    p, g, m, v = flat_view(param), flat_view(grad), flat_view(exp_avg), flat_view(exp_avg_sq)
    n = p.size
    bc1 = 1.0 - beta1 ** step
    sbc2 = math.sqrt(1.0 - beta2 ** step)
    # lr/bc1 * m / (sqrt(v)/sbc2 + eps) == (lr/bc1 * sbc2) * m / (sqrt(v) + eps*sbc2):
    # one multiply fewer per element, and no division by lr (which may be 0).
    consts = (1.0 - lr * weight_decay, beta1, 1.0 - beta1, beta2, 1.0 - beta2, eps * sbc2,
              lr / bc1 * sbc2)
    if not _serial(n):
        _split(_adamw_chain, (p, g, m, v), consts)
        return param
    t = _scratch(p.dtype, _BLOCK_BYTES)[0]
    blk = t.size
    if n <= blk:  # one block: no slicing (small parameters are bound by call overhead)
        _adamw_chain(p, g, m, v, t[:n], None, *consts)
        return param
    for i in range(0, n, blk):
        j = min(i + blk, n)
        _adamw_chain(p[i:j], g[i:j], m[i:j], v[i:j], t[:j - i], None, *consts)
    return param


def _sgd_chain(pb, gb, bb, t1, t2, lr, momentum, weight_decay, a, nesterov, first_step):
    """One SGD block; ``bb`` is None without momentum."""
    if weight_decay != 0.0:                    # d = grad + wd * param (grad left intact)
        d = t1
        np.multiply(pb, weight_decay, d)
        d += gb
    else:
        d = gb
    u = t2                                     # the update, times lr
    if bb is None:
        np.multiply(d, lr, u)
    else:
        if first_step:
            np.copyto(bb, d)
        else:                                  # buf = momentum buf + (1 - dampening) d
            bb *= momentum
            if a == 1.0:
                bb += d
            else:
                np.multiply(d, a, u)
                bb += u
        if nesterov:                           # d + momentum buf
            np.multiply(bb, momentum, u)
            u += d
            u *= lr
        else:
            np.multiply(bb, lr, u)
    pb -= u


def _sgd_chain_no_buf(pb, gb, t1, t2, *consts):
    _sgd_chain(pb, gb, None, t1, t2, *consts)


def sgd_update_unchecked(param, grad, momentum_buf, lr, momentum=0.0, weight_decay=0.0,
                         dampening=0.0, nesterov=False, first_step=False):
    """``sgd_update`` without argument checks (hot path); ``grad`` is only read."""
    p, g = flat_view(param), flat_view(grad)
    n = p.size
    consts = (lr, momentum, weight_decay, 1.0 - dampening, nesterov, first_step)
    buf = flat_view(momentum_buf) if momentum != 0.0 else None
    if not _serial(n):
        if buf is None:
            _split(_sgd_chain_no_buf, (p, g), consts)
        else:
            _split(_sgd_chain, (p, g, buf), consts)
        return param
    t1, t2 = _scratch(p.dtype, _BLOCK_BYTES)
    blk = t1.size
    if n <= blk:  # one block: no slicing
        _sgd_chain(p, g, buf, t1[:n], t2[:n], *consts)
        return param
    for i in range(0, n, blk):
        j = min(i + blk, n)
        _sgd_chain(p[i:j], g[i:j], None if buf is None else buf[i:j], t1[:j - i], t2[:j - i],
                   *consts)
    return param


# ----------------------------------------------------------------------------- checks
def _check_param(param):
    if not isinstance(param, np.ndarray):
        raise TypeError(f"param: expected a numpy.ndarray, got {type(param).__name__}")
    if param.dtype not in _FLOATS:
        raise TypeError(f"param: expected dtype float32 or float64, got {param.dtype}")
    if not (param.flags.c_contiguous or param.flags.f_contiguous):
        raise ValueError(f"param: expected a C- or Fortran-contiguous array, got shape "
                         f"{param.shape} with strides {param.strides}")
    if not param.flags.writeable:
        raise ValueError("param: expected a writeable array")


def _check_like(name, a, param):
    """``a`` must match ``param``: ndarray, dtype, shape and memory order."""
    if not isinstance(a, np.ndarray):
        raise TypeError(f"{name}: expected a numpy.ndarray, got {type(a).__name__}")
    if a.dtype != param.dtype:
        raise TypeError(f"{name}: expected dtype {param.dtype} (that of param), got {a.dtype}")
    if a.shape != param.shape:
        raise ValueError(f"{name}: expected shape {param.shape} (that of param), got {a.shape}")
    if param.flags.c_contiguous:
        if not a.flags.c_contiguous:
            raise ValueError(f"{name}: expected a C-contiguous array like param, got strides "
                             f"{a.strides} for shape {a.shape}")
    elif not a.flags.f_contiguous:
        raise ValueError(f"{name}: expected a Fortran-contiguous array like param, got "
                         f"strides {a.strides} for shape {a.shape}")


def _check_number(name, x, lo, hi=None, hi_open=True):
    if isinstance(x, bool) or not isinstance(x, numbers.Real):
        raise TypeError(f"{name}: expected a real number, got {type(x).__name__}")
    x = float(x)
    ok = x >= lo and (hi is None or (x < hi if hi_open else x <= hi))
    if not ok:
        rng = f"[{lo}, {hi})" if hi is not None and hi_open else (
            f"[{lo}, {hi}]" if hi is not None else f">= {lo}")
        raise ValueError(f"{name}: expected a value in {rng}, got {x}")
    return x


def adamw_update(param, grad, exp_avg, exp_avg_sq, step, lr, beta1=0.9, beta2=0.999,
                 eps=1e-8, weight_decay=1e-2):
    """One AdamW step in place, as PyTorch's ``torch.optim.AdamW`` (``step`` counts from 1):

        param *= 1 - lr * weight_decay
        exp_avg = beta1 * exp_avg + (1 - beta1) * grad
        exp_avg_sq = beta2 * exp_avg_sq + (1 - beta2) * grad**2
        param -= lr / (1 - beta1**step) * exp_avg / (sqrt(exp_avg_sq / (1 - beta2**step)) + eps)

    The four arrays have one shape, float dtype and memory order (all C- or all
    Fortran-contiguous; any ndim including 0-d) and must not overlap; ``grad`` is only read.
    Returns ``param``."""
    _check_param(param)
    _check_like("grad", grad, param)
    _check_like("exp_avg", exp_avg, param)
    _check_like("exp_avg_sq", exp_avg_sq, param)
    if isinstance(step, bool) or not isinstance(step, numbers.Integral):
        raise TypeError(f"step: expected an int >= 1, got {type(step).__name__}")
    if step < 1:
        raise ValueError(f"step: expected an int >= 1 (the first update is step 1), got {step}")
    lr = _check_number("lr", lr, 0.0)
    beta1 = _check_number("beta1", beta1, 0.0, 1.0)
    beta2 = _check_number("beta2", beta2, 0.0, 1.0)
    eps = _check_number("eps", eps, 0.0)
    weight_decay = _check_number("weight_decay", weight_decay, 0.0)
    return adamw_update_unchecked(param, grad, exp_avg, exp_avg_sq, int(step), lr, beta1,
                                  beta2, eps, weight_decay)


def sgd_update(param, grad, momentum_buf, lr, momentum=0.0, weight_decay=0.0,
               dampening=0.0, nesterov=False, first_step=False):
    """One SGD step in place, as PyTorch's ``torch.optim.SGD``:

        d = grad + weight_decay * param
        if momentum != 0:
            momentum_buf = d if first_step else momentum * momentum_buf + (1 - dampening) * d
            d = d + momentum * momentum_buf if nesterov else momentum_buf
        param -= lr * d

    ``momentum_buf`` may be None when ``momentum == 0``; otherwise it matches ``param``
    (shape, dtype, memory order) and is updated in place. ``grad`` is only read. Nesterov
    needs momentum > 0 and dampening == 0 (as in PyTorch). Returns ``param``."""
    _check_param(param)
    _check_like("grad", grad, param)
    lr = _check_number("lr", lr, 0.0)
    momentum = _check_number("momentum", momentum, 0.0)
    weight_decay = _check_number("weight_decay", weight_decay, 0.0)
    dampening = _check_number("dampening", dampening, 0.0, 1.0, hi_open=False)
    if momentum != 0.0:
        if momentum_buf is None:
            raise ValueError(f"momentum_buf: expected an array like param (shape {param.shape},"
                             f" dtype {param.dtype}) when momentum={momentum}, got None")
        _check_like("momentum_buf", momentum_buf, param)
    if nesterov and (momentum == 0.0 or dampening != 0.0):
        raise ValueError(f"nesterov: requires momentum > 0 and dampening == 0, got "
                         f"momentum={momentum}, dampening={dampening}")
    return sgd_update_unchecked(param, grad, momentum_buf, lr, momentum, weight_decay,
                                dampening, bool(nesterov), bool(first_step))

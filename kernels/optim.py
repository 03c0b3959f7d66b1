"""In-place optimizer updates: AdamW (Loshchilov & Hutter 2019) and SGD with the semantics of
PyTorch's ``torch.optim.AdamW`` and ``torch.optim.SGD``.

Parameters and their state are walked as flat views (C- or Fortran-contiguous, never
copied) in blocks that stay in L2, through small per-thread scratch buffers, so no temporary
the size of a parameter is ever made (the reference's whole-array AdamW makes 12).
``adamw_update_many`` updates a list of parameters (or flat segments of a parameter arena,
as llm.c's ``params_memory``) as one concatenated range: one parallel region over
blasnet's threads for all of them. The update is bound by memory traffic, so it can also
zero the gradient in the same pass (``zero_grad``). Every element goes through the same
correctly rounded ufuncs whatever the split, so results do not depend on it. Block sizes and
pass order were chosen by measurement: docs/performance.md, "AdamW and SGD"."""
from __future__ import annotations

import math
import numbers

import numpy as np

from . import parallel as _par
from .gemm import check_contiguous, check_like
from .memory import ALIGN as _ALIGN
from .memory import bundle, scratch

__all__ = ["adamw_update", "sgd_update", "adamw_update_unchecked", "sgd_update_unchecked",
           "adamw_update_many", "adamw_update_many_unchecked", "adamw_consts", "flat_view"]

# No BLAS axpy: OpenBLAS threads it on its own, and its fused multiply-add would round
# differently from the ufunc chain, making results depend on the thread count.
_BLOCK_BYTES = 256 * 1024          # per array, one thread: the block's passes stay in L2
# Split over threads, each ufunc call takes the GIL back (kernels.parallel): longer blocks,
# still within a core's L2 for the 3 arrays of the AdamW chain.
_PAR_BLOCK_BYTES = 640 * 1024
_SGD_PAR_BLOCK_BYTES = 512 * 1024  # SGD keeps up to 5 arrays in use per block
# Ufunc passes per element (kernels.parallel.threads_for splits by work).
_ADAMW_PASSES = 13
_SGD_PASSES = 5


def flat_view(a):
    """The elements of a C- or Fortran-contiguous array as a 1-D view in memory order (no
    copy; 0-d arrays give a (1,) view). The caller guarantees contiguity."""
    return a.reshape(-1) if a.flags.c_contiguous else a.T.reshape(-1)


def _head(a):
    """How many elements of the flat array ``a`` come before its first 64-byte boundary
    (0 if its address is not a multiple of its itemsize). Blocks start there, so that
    block and scratch are both cache-line aligned: NumPy's buffers start 16 bytes past a
    boundary, and in-place passes over such blocks run slower (kernels.memory)."""
    addr = a.__array_interface__["data"][0]
    size = a.itemsize
    return 0 if addr % size else (-addr % _ALIGN) // size


def _slot_scratch(dtype, k, blk):
    """Two (blk,) scratch blocks per slot of a k-thread pass, taken on the calling thread."""
    return [(scratch(("optim.a", s), blk, dtype), scratch(("optim.b", s), blk, dtype))
            for s in range(k)]


def _run(chain, items, total, block_bytes=_PAR_BLOCK_BYTES, zero_grad=False,
         passes=_ADAMW_PASSES):
    """``chain(*blocks_of_arrays, scratch_a, scratch_b, *consts)`` over every
    ``(arrays, consts)`` item: one pass over the items' concatenated elements (``total`` in
    all), split over blasnet's threads in ``block_bytes`` blocks when large, else inline in
    ``_BLOCK_BYTES`` blocks. With ``zero_grad`` each block of the second array (the
    gradient) is set to 0 after the chain, while it is still in cache. Each item's first
    block ends on its first array's 64-byte boundary (``_head``), its last one is shorter;
    block boundaries do not change any result. The threads take blocks from a shared
    counter (kernels.parallel.split_blocks). Bookkeeping is per item, not per block."""
    k = _par.threads_for(total, passes=passes)
    if k == 1:
        block_bytes = _BLOCK_BYTES
    plan, nblocks, scratch_of = [], 0, {}
    for arrays, consts in items:
        a0 = arrays[0]
        dt, n = a0.dtype, a0.size
        blk = block_bytes // dt.itemsize
        sc = scratch_of.get(dt)
        if sc is None:  # [(scratch_a, scratch_b) per slot]
            sc = scratch_of[dt] = bundle(("optim", dt, k, blk), _slot_scratch, dt, k, blk)
        h = _head(a0) if n > blk else 0
        first = nblocks + (h > 0)  # the item's first block after its head
        nblocks = first + -(-(n - h) // blk)
        plan.append((nblocks, first, h, blk, n, arrays, consts, sc))

    def worker(blocks, s):
        q = 0  # the item of this thread's last block (a thread's blocks come in order)
        end, first, h, blk, n, arrays, consts, sc = plan[0]
        for b in blocks:
            while b >= end:
                q += 1
                end, first, h, blk, n, arrays, consts, sc = plan[q]
            if b < first:  # the head
                i, j = 0, h
            else:
                i = h + (b - first) * blk
                j = min(i + blk, n)
            ta, tb = sc[s]
            # The whole item is not sliced (small ones are bound by call overhead).
            views = arrays if j - i == n else [a[i:j] for a in arrays]
            chain(*views, ta[:j - i], tb[:j - i], *consts)
            if zero_grad:
                views[1].fill(0)
    _par.split_blocks(worker, nblocks, k)


# ----------------------------------------------------------------------------- AdamW
def _adamw_chain(pb, gb, mb, vb, tb, _, decay, b1_a1, a1, beta2, a2, eps_hat, step_size):
    """One AdamW block in 13 passes (12 without decay), each a plain ufunc on blocks that
    stay in L2, so L3 or DRAM sees each array once. Binary ufuncs cannot do it in fewer: v
    needs a square, two scalings and an add, m two scalings and an add, the update a sqrt,
    +eps, a divide and a scaling, p its decay and a subtract.

    Order: v and the denominator (g, v, scratch), then m in place without scratch (m, g),
    then the update (m, scratch) and p. Between two uses of a block at most two other
    arrays are touched, except for g, which is only read until the end (clean lines:
    nothing to write back if evicted); in the textbook order (m, v, update) the written m
    waits while g, v and the scratch pass. So blocks can be larger in the same L2, and
    fewer, longer ufunc calls wait less for the GIL when split over threads. m is updated
    in place as ((m * (b1/a1)) + g) * a1 with a1 = 1 - b1: three roundings like
    b1 m + a1 g, and b1/a1 is finite (b1 < 1)."""
    np.multiply(gb, a2, tb)                    # v = b2 v + (1 - b2) g g
    tb *= gb
    vb *= beta2
    vb += tb
    np.sqrt(vb, tb)                            # den = sqrt(v) + eps_hat
    tb += eps_hat
    mb *= b1_a1                                # m = (m b1/(1 - b1) + g) (1 - b1)
    mb += gb
    mb *= a1
    np.divide(mb, tb, tb)                      # u = step_size * m / den
    tb *= step_size
    if decay is not None:                      # p = decay p - u
        pb *= decay
    pb -= tb


def adamw_consts(dtype, step, lr, beta1=0.9, beta2=0.999, eps=1e-8, weight_decay=1e-2):
    """The constants of one AdamW step for parameters of ``dtype``, in the form
    ``adamw_update_many_unchecked`` takes: 0-d arrays of ``dtype`` (a Python float operand
    is converted on every ufunc call, and rounded to the array's dtype all the same), the
    decay None when it is exactly 1. The bias corrections are folded in:
    lr/bc1 * m / (sqrt(v)/sbc2 + eps) == (lr/bc1 * sbc2) * m / (sqrt(v) + eps*sbc2), one
    multiply fewer per element, and no division by lr (which may be 0)."""
    bc1 = 1.0 - beta1 ** step
    sbc2 = math.sqrt(1.0 - beta2 ** step)
    decay = np.array(1.0 - lr * weight_decay, dtype)
    a1 = 1.0 - beta1  # > 0: beta1 < 1
    return ((None if decay == 1 else decay),) + tuple(
        np.array(x, dtype) for x in (beta1 / a1, a1, beta2, 1.0 - beta2, eps * sbc2,
                                     lr / bc1 * sbc2))


def adamw_update_many_unchecked(updates, zero_grad=False):
    """``adamw_update_many`` without argument checks (hot path). ``updates`` is a sequence
    of ``((param, grad, exp_avg, exp_avg_sq), consts)``: four distinct flat views
    (``flat_view``) of one size and dtype, and ``adamw_consts`` of that dtype (each
    parameter may have its own, e.g. one per parameter group). With ``zero_grad`` every
    grad is set to 0 in the same pass (the block is in cache: one pass over the gradient
    fewer than a separate fill)."""
    _run(_adamw_chain, updates, sum(u[0][0].size for u in updates), zero_grad=zero_grad)


def adamw_update_unchecked(param, grad, exp_avg, exp_avg_sq, step, lr, beta1=0.9,
                           beta2=0.999, eps=1e-8, weight_decay=1e-2, zero_grad=False):
    """``adamw_update`` without argument checks (hot path): four distinct arrays of one
    shape, dtype and memory order (all C- or all Fortran-contiguous)."""
    p = flat_view(param)
    item = ((p, flat_view(grad), flat_view(exp_avg), flat_view(exp_avg_sq)),
            adamw_consts(p.dtype, step, lr, beta1, beta2, eps, weight_decay))
    _run(_adamw_chain, (item,), p.size, zero_grad=zero_grad)
    return param


# ----------------------------------------------------------------------------- SGD
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
                         dampening=0.0, nesterov=False, first_step=False, zero_grad=False):
    """``sgd_update`` without argument checks (hot path); ``grad`` is only read, unless
    ``zero_grad`` sets it to 0 in the same pass."""
    p, g = flat_view(param), flat_view(grad)
    consts = (lr, momentum, weight_decay, 1.0 - dampening, nesterov, first_step)
    if momentum != 0.0:
        _run(_sgd_chain, (((p, g, flat_view(momentum_buf)), consts),), p.size,
             _SGD_PAR_BLOCK_BYTES, zero_grad, _SGD_PASSES)
    else:
        _run(_sgd_chain_no_buf, (((p, g), consts),), p.size, _SGD_PAR_BLOCK_BYTES, zero_grad,
             _SGD_PASSES)
    return param


# ----------------------------------------------------------------------------- checks
def _check_flag(name, x):
    if not isinstance(x, (bool, np.bool_)):
        raise TypeError(f"{name}: expected True or False, got {x!r} ({type(x).__name__})")
    return bool(x)


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
                 eps=1e-8, weight_decay=1e-2, zero_grad=False):
    """One AdamW step in place, as PyTorch's ``torch.optim.AdamW`` (``step`` counts from 1):

        param *= 1 - lr * weight_decay
        exp_avg = beta1 * exp_avg + (1 - beta1) * grad
        exp_avg_sq = beta2 * exp_avg_sq + (1 - beta2) * grad**2
        param -= lr / (1 - beta1**step) * exp_avg / (sqrt(exp_avg_sq / (1 - beta2**step)) + eps)

    The four arrays have one shape, float dtype and memory order (all C- or all
    Fortran-contiguous; any ndim including 0-d) and must not overlap; ``grad`` is only read,
    unless ``zero_grad`` sets it to 0 in the same pass (what a separate ``grad.fill(0)``
    would do, without reading it from memory again). Returns ``param``."""
    check_contiguous("param", param, written=True)
    zero_grad = _check_flag("zero_grad", zero_grad)
    check_like("grad", grad, "param", param, written=zero_grad)
    check_like("exp_avg", exp_avg, "param", param, written=True)
    check_like("exp_avg_sq", exp_avg_sq, "param", param, written=True)
    return adamw_update_unchecked(param, grad, exp_avg, exp_avg_sq,
                                  *_check_adamw_options(step, lr, beta1, beta2, eps,
                                                        weight_decay), zero_grad)


def _check_adamw_options(step, lr, beta1, beta2, eps, weight_decay):
    """``(step, lr, beta1, beta2, eps, weight_decay)`` checked, as int and floats."""
    if isinstance(step, bool) or not isinstance(step, numbers.Integral):
        raise TypeError(f"step: expected an int >= 1, got {type(step).__name__}")
    if step < 1:
        raise ValueError(f"step: expected an int >= 1 (the first update is step 1), got {step}")
    return (int(step), _check_number("lr", lr, 0.0), _check_number("beta1", beta1, 0.0, 1.0),
            _check_number("beta2", beta2, 0.0, 1.0), _check_number("eps", eps, 0.0),
            _check_number("weight_decay", weight_decay, 0.0))


def adamw_update_many(params, grads, exp_avgs, exp_avg_sqs, step, lr, beta1=0.9,
                      beta2=0.999, eps=1e-8, weight_decay=1e-2, zero_grad=False):
    """``adamw_update`` of every ``(params[i], grads[i], exp_avgs[i], exp_avg_sqs[i])`` with
    one set of options, as one pass over their concatenated elements: large totals are split
    over blasnet's threads in one parallel region (not one per parameter), and small
    parameters ride along. Same bits as ``adamw_update`` on each in turn. The four sequences
    have one length; each quadruple is as ``adamw_update`` wants it; no array may appear
    twice or overlap another. ``zero_grad`` as in ``adamw_update``. Returns ``params``."""
    seqs = {"params": params, "grads": grads, "exp_avgs": exp_avgs, "exp_avg_sqs": exp_avg_sqs}
    for name, seq in seqs.items():
        if isinstance(seq, np.ndarray) or not isinstance(seq, (list, tuple)):
            raise TypeError(f"{name}: expected a list or tuple of arrays, got "
                            f"{type(seq).__name__}")
    if not len(params) == len(grads) == len(exp_avgs) == len(exp_avg_sqs):
        raise ValueError("params, grads, exp_avgs, exp_avg_sqs: expected sequences of one "
                         f"length, got {[len(s) for s in seqs.values()]}")
    zero_grad = _check_flag("zero_grad", zero_grad)
    for i, p in enumerate(params):
        check_contiguous(f"params[{i}]", p, written=True)
        for name in ("grads", "exp_avgs", "exp_avg_sqs"):
            check_like(f"{name}[{i}]", seqs[name][i], f"params[{i}]", p,
                       written=name != "grads" or zero_grad)
    opts = _check_adamw_options(step, lr, beta1, beta2, eps, weight_decay)
    consts = {}
    updates = []
    for p, g, m, v in zip(params, grads, exp_avgs, exp_avg_sqs):
        c = consts.get(p.dtype)
        if c is None:
            c = consts[p.dtype] = adamw_consts(p.dtype, *opts)
        updates.append(((flat_view(p), flat_view(g), flat_view(m), flat_view(v)), c))
    adamw_update_many_unchecked(updates, zero_grad)
    return params


def sgd_update(param, grad, momentum_buf, lr, momentum=0.0, weight_decay=0.0,
               dampening=0.0, nesterov=False, first_step=False, zero_grad=False):
    """One SGD step in place, as PyTorch's ``torch.optim.SGD``:

        d = grad + weight_decay * param
        if momentum != 0:
            momentum_buf = d if first_step else momentum * momentum_buf + (1 - dampening) * d
            d = d + momentum * momentum_buf if nesterov else momentum_buf
        param -= lr * d

    ``momentum_buf`` may be None when ``momentum == 0``; otherwise it matches ``param``
    (shape, dtype, memory order) and is updated in place. ``grad`` is only read, unless
    ``zero_grad`` sets it to 0 in the same pass. Nesterov needs momentum > 0 and
    dampening == 0 (as in PyTorch). Returns ``param``."""
    check_contiguous("param", param, written=True)
    zero_grad = _check_flag("zero_grad", zero_grad)
    check_like("grad", grad, "param", param, written=zero_grad)
    lr = _check_number("lr", lr, 0.0)
    momentum = _check_number("momentum", momentum, 0.0)
    weight_decay = _check_number("weight_decay", weight_decay, 0.0)
    dampening = _check_number("dampening", dampening, 0.0, 1.0, hi_open=False)
    if momentum != 0.0:
        if momentum_buf is None:
            raise ValueError(f"momentum_buf: expected an array like param (shape {param.shape},"
                             f" dtype {param.dtype}) when momentum={momentum}, got None")
        check_like("momentum_buf", momentum_buf, "param", param, written=True)
    if nesterov and (momentum == 0.0 or dampening != 0.0):
        raise ValueError(f"nesterov: requires momentum > 0 and dampening == 0, got "
                         f"momentum={momentum}, dampening={dampening}")
    return sgd_update_unchecked(param, grad, momentum_buf, lr, momentum, weight_decay,
                                dampening, bool(nesterov), bool(first_step), zero_grad)

"""In-place optimizer updates: AdamW (Loshchilov & Hutter 2019) and SGD with the semantics of
PyTorch's ``torch.optim.AdamW`` and ``torch.optim.SGD``.

Each update is one compiled pass (kernels.jit) that reads every element of the parameter and
its state once and writes it once, the gradient zeroed in the same pass on request
(``zero_grad``): the update is bound by memory traffic, and the gradient is then in cache.
Parameters and their state are walked as flat views (C- or Fortran-contiguous, never copied).
``adamw_update_many`` updates a list of parameters (or flat runs of a parameter arena, as
llm.c's ``params_memory``) as one concatenated range: one parallel region over blasnet's
threads for all of them, each thread a contiguous slice. Every element's result depends on
that element alone, so it does not depend on the split.
"""
from __future__ import annotations

import math

import numpy as np

from . import parallel as _par
from .checks import check_bool, check_int, check_real
from .gemm import check_contiguous, check_like
from .jit import jit
from .lanes import sum_in_order
from .memory import scratch

__all__ = ["adamw_update", "sgd_update", "adamw_update_unchecked", "sgd_update_unchecked",
           "adamw_update_many", "adamw_update_many_unchecked", "adamw_consts", "flat_view",
           "sum_of_squares", "scale_"]

# Relative cost per element for kernels.parallel.threads_for (a copy is 1): 7 arrays moved.
ADAMW_COST = 3
SGD_COST = 2
NORM_COST = 1
NORM_BLOCK = 8192  # elements per partial sum of squares (fixed: the order of additions)


def flat_view(a):
    """The elements of a C- or Fortran-contiguous array as a 1-D view in memory order (no
    copy; 0-d arrays give a (1,) view). The caller guarantees contiguity."""
    return a.reshape(-1) if a.flags.c_contiguous else a.T.reshape(-1)


# ----------------------------------------------------------------------------- AdamW
@jit(inline="always")
def _adamw_at(p, g, m, v, i, decay, b1, a1, b2, a2, eps_hat, step_size):
    """Element i of one AdamW step (constants from ``adamw_consts``)."""
    gi = g[i]
    mi = b1 * m[i] + a1 * gi                     # m = b1 m + (1 - b1) g
    vi = b2 * v[i] + a2 * (gi * gi)              # v = b2 v + (1 - b2) g^2
    m[i] = mi
    v[i] = vi
    # p = (1 - lr wd) p - lr/bc1 m / (sqrt(v)/sbc2 + eps), the bias corrections folded in
    p[i] = decay * p[i] - step_size * mi / (math.sqrt(vi) + eps_hat)


@jit
def _adamw_range(p, g, m, v, i0, i1, decay, b1, a1, b2, a2, eps_hat, step_size):
    p, g, m, v = p[i0:i1], g[i0:i1], m[i0:i1], v[i0:i1]  # indices from 0: vectorises
    for i in range(i1 - i0):
        _adamw_at(p, g, m, v, i, decay, b1, a1, b2, a2, eps_hat, step_size)
    return 0


@jit
def _adamw_range_zero(p, g, m, v, i0, i1, decay, b1, a1, b2, a2, eps_hat, step_size):
    """``_adamw_range`` and g = 0 (a kernel of its own: a read-only g is legal without)."""
    p, g, m, v = p[i0:i1], g[i0:i1], m[i0:i1], v[i0:i1]
    for i in range(i1 - i0):
        _adamw_at(p, g, m, v, i, decay, b1, a1, b2, a2, eps_hat, step_size)
        g[i] = 0
    return 0


def adamw_consts(dtype, step, lr, beta1=0.9, beta2=0.999, eps=1e-8, weight_decay=1e-2):
    """The constants of one AdamW step for parameters of ``dtype``, in the form
    ``adamw_update_many_unchecked`` takes (scalars of ``dtype``). The bias corrections are
    folded in: lr/bc1 * m / (sqrt(v)/sbc2 + eps) == (lr/bc1 * sbc2) * m / (sqrt(v) +
    eps*sbc2), one multiply fewer per element, and no division by lr (which may be 0)."""
    bc1 = 1.0 - beta1 ** step
    sbc2 = math.sqrt(1.0 - beta2 ** step)
    t = np.dtype(dtype).type
    return tuple(t(x) for x in (1.0 - lr * weight_decay, beta1, 1.0 - beta1, beta2,
                                1.0 - beta2, eps * sbc2, lr / bc1 * sbc2))


def _run_items(kernel, items, cost):
    """``kernel(*arrays, i0, i1, *consts)`` over every ``(arrays, consts)`` item as
    one range of their concatenated elements, split over blasnet's threads in contiguous
    slices when large (kernels.parallel)."""
    total = 0
    for arrays, _ in items:
        total += arrays[0].shape[0]
    k = _par.threads_for(total, passes=cost)
    if k == 1:
        for arrays, consts in items:
            kernel(*arrays, 0, arrays[0].shape[0], *consts)
        return

    def run(lo, hi, _):
        off = 0
        for arrays, consts in items:
            n = arrays[0].shape[0]
            i0, i1 = max(lo - off, 0), min(hi - off, n)
            if i0 < i1:
                kernel(*arrays, i0, i1, *consts)
            off += n
    _par.split(run, total, k=k)


def adamw_update_many_unchecked(updates, zero_grad=False):
    """``adamw_update_many`` without argument checks (hot path). ``updates`` is a sequence
    of ``((param, grad, exp_avg, exp_avg_sq), consts)``: four distinct flat views
    (``flat_view``) of one size and dtype, and ``adamw_consts`` of that dtype (each
    parameter may have its own, e.g. one per parameter group). With ``zero_grad`` every
    grad is set to 0 in the same pass."""
    _run_items(_adamw_range_zero if zero_grad else _adamw_range, updates, ADAMW_COST)


def adamw_update_unchecked(param, grad, exp_avg, exp_avg_sq, step, lr, beta1=0.9,
                           beta2=0.999, eps=1e-8, weight_decay=1e-2, zero_grad=False):
    """``adamw_update`` without argument checks (hot path): four distinct arrays of one
    shape, dtype and memory order (all C- or all Fortran-contiguous)."""
    p = flat_view(param)
    item = ((p, flat_view(grad), flat_view(exp_avg), flat_view(exp_avg_sq)),
            adamw_consts(p.dtype, step, lr, beta1, beta2, eps, weight_decay))
    _run_items(_adamw_range_zero if zero_grad else _adamw_range, (item,), ADAMW_COST)
    return param


# ----------------------------------------------------------------------------- SGD
@jit(inline="always")
def _sgd_at(p, g, buf, i, lr, momentum, weight_decay, a, nesterov, first_step):
    """Element i of one SGD step; ``buf`` is None without momentum."""
    d = g[i]
    if weight_decay != 0:                        # d = grad + wd * param
        d = d + weight_decay * p[i]
    if buf is not None:
        if first_step:
            b = d
        else:                                    # buf = momentum buf + (1 - dampening) d
            b = momentum * buf[i] + a * d
        buf[i] = b
        d = d + momentum * b if nesterov else b
    p[i] = p[i] - lr * d


@jit
def _sgd_range(p, g, buf, i0, i1, lr, momentum, weight_decay, a, nesterov, first_step):
    p, g = p[i0:i1], g[i0:i1]  # indices from 0: vectorises
    if buf is None:
        for i in range(i1 - i0):
            _sgd_at(p, g, None, i, lr, momentum, weight_decay, a, nesterov, first_step)
    else:
        b = buf[i0:i1]
        for i in range(i1 - i0):
            _sgd_at(p, g, b, i, lr, momentum, weight_decay, a, nesterov, first_step)
    return 0


@jit
def _sgd_range_zero(p, g, buf, i0, i1, lr, momentum, weight_decay, a, nesterov, first_step):
    """``_sgd_range`` and g = 0 in the same loop (a kernel of its own: a read-only g is legal
    without)."""
    p, g = p[i0:i1], g[i0:i1]
    if buf is None:
        for i in range(i1 - i0):
            _sgd_at(p, g, None, i, lr, momentum, weight_decay, a, nesterov, first_step)
            g[i] = 0
    else:
        b = buf[i0:i1]
        for i in range(i1 - i0):
            _sgd_at(p, g, b, i, lr, momentum, weight_decay, a, nesterov, first_step)
            g[i] = 0
    return 0


def sgd_update_unchecked(param, grad, momentum_buf, lr, momentum=0.0, weight_decay=0.0,
                         dampening=0.0, nesterov=False, first_step=False, zero_grad=False):
    """``sgd_update`` without argument checks (hot path); ``grad`` is only read, unless
    ``zero_grad`` sets it to 0 in the same pass."""
    p, g = flat_view(param), flat_view(grad)
    t = p.dtype.type
    consts = (t(lr), t(momentum), t(weight_decay), t(1.0 - dampening), bool(nesterov),
              bool(first_step))
    buf = flat_view(momentum_buf) if momentum != 0.0 else None
    _run_items(_sgd_range_zero if zero_grad else _sgd_range, (((p, g, buf), consts),),
               SGD_COST)
    return param


# ----------------------------------------------------------------------------- norm, scale
@jit(slp=True)
def _sumsq_blocks(part, first, g, b0, b1):
    """part[first + b] = sum(g^2) over block b of g, for blocks b0..b1, in float64 in eight
    fixed lanes (the order does not depend on the vector width or the split)."""
    n = g.shape[0]
    for b in range(b0, b1):
        x = g[b * NORM_BLOCK:min((b + 1) * NORM_BLOCK, n)]
        m = x.shape[0] - x.shape[0] % 8
        s0 = s1 = s2 = s3 = s4 = s5 = s6 = s7 = 0.0
        for i in range(0, m, 8):
            v0, v1, v2, v3 = np.float64(x[i]), np.float64(x[i + 1]), np.float64(x[i + 2]), \
                np.float64(x[i + 3])
            v4, v5, v6, v7 = np.float64(x[i + 4]), np.float64(x[i + 5]), \
                np.float64(x[i + 6]), np.float64(x[i + 7])
            s0 += v0 * v0
            s1 += v1 * v1
            s2 += v2 * v2
            s3 += v3 * v3
            s4 += v4 * v4
            s5 += v5 * v5
            s6 += v6 * v6
            s7 += v7 * v7
        for i in range(m, x.shape[0]):
            v = np.float64(x[i])
            s0 += v * v
        part[first + b] = ((s0 + s1) + (s2 + s3)) + ((s4 + s5) + (s6 + s7))
    return 0


@jit
def _scale_range(g, c, i0, i1):
    g = g[i0:i1]
    for i in range(i1 - i0):
        g[i] *= c
    return 0


def _blocks_of(n):
    return -(-n // NORM_BLOCK)


def sum_of_squares(flats) -> float:
    """sum(g**2) over every element of the 1-D contiguous float arrays ``flats`` (e.g. the
    runs of a gradient arena), in float64, as a Python float. Partial sums over fixed blocks
    of each array, added in order: the same bits whatever the thread count. No checks."""
    total = 0
    for g in flats:
        total += g.shape[0]
    nb = 0
    for g in flats:
        nb += _blocks_of(g.shape[0])
    if nb == 0:
        return 0.0
    part = scratch("optim.norm_part", nb, np.float64)  # (nb,) per-block sums
    k = _par.threads_for(total, passes=NORM_COST)
    if k == 1:
        first = 0
        for g in flats:
            m = _blocks_of(g.shape[0])
            _sumsq_blocks(part, first, g, 0, m)
            first += m
    else:
        def run(lo, hi, _):
            first = 0
            for g in flats:
                m = _blocks_of(g.shape[0])
                b0, b1 = max(lo - first, 0), min(hi - first, m)
                if b0 < b1:
                    _sumsq_blocks(part, first, g, b0, b1)
                first += m
        _par.split(run, nb, NORM_BLOCK, k=min(k, nb))
    return float(sum_in_order(part))


def scale_(flats, coef) -> None:
    """``g *= coef`` for each 1-D contiguous float array of ``flats`` (``coef`` rounded to its
    dtype first, as NumPy's ``g *= coef`` does), split over threads when large. No checks."""
    for g in flats:
        n = g.shape[0]
        c = g.dtype.type(coef)
        k = _par.threads_for(n, passes=NORM_COST)
        if k == 1:
            _scale_range(g, c, 0, n)
        else:
            _par.split(lambda i0, i1, _, g=g, c=c: _scale_range(g, c, i0, i1), n, k=k)


# ------------------------------------------------------------------ checks (kernels/checks.py)
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
    zero_grad = check_bool("zero_grad", zero_grad)
    check_like("grad", grad, "param", param, written=zero_grad)
    check_like("exp_avg", exp_avg, "param", param, written=True)
    check_like("exp_avg_sq", exp_avg_sq, "param", param, written=True)
    return adamw_update_unchecked(param, grad, exp_avg, exp_avg_sq,
                                  *_check_adamw_options(step, lr, beta1, beta2, eps,
                                                        weight_decay), zero_grad)


def _check_adamw_options(step, lr, beta1, beta2, eps, weight_decay):
    """``(step, lr, beta1, beta2, eps, weight_decay)`` checked, as int and floats."""
    return (check_int("step", step, 1, what="an int >= 1 (the first update is step 1)"),
            check_real("lr", lr, 0.0), check_real("beta1", beta1, 0.0, 1.0, high_open=True),
            check_real("beta2", beta2, 0.0, 1.0, high_open=True), check_real("eps", eps, 0.0),
            check_real("weight_decay", weight_decay, 0.0))


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
    zero_grad = check_bool("zero_grad", zero_grad)
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
    zero_grad = check_bool("zero_grad", zero_grad)
    check_like("grad", grad, "param", param, written=zero_grad)
    lr = check_real("lr", lr, 0.0)
    momentum = check_real("momentum", momentum, 0.0)
    weight_decay = check_real("weight_decay", weight_decay, 0.0)
    dampening = check_real("dampening", dampening, 0.0, 1.0)
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

"""GEMM floors: the GEMM calls of one block's forward + backward, with nothing else.

``replay_fn`` is the floor the bench times: it records the BLAS calls one forward + backward
of the block makes (routine, alpha, operands, beta, output, transpose flags) and replays
exactly those calls on the block's own buffers, so the floor shares the block's operand
layouts and its cache behaviour (the weights read by forward and backward are one array).
``gemm_list`` is the expected list (forward 1x, backward 2x) for the FLOP count, and
``floor_fn`` runs such a list on buffers of its own (the reference for comparisons that
cannot reach the block's buffers, e.g. bench/vs_torch.py). ``record_gemms`` checks what the
block really calls.
"""
from __future__ import annotations

import contextlib
import sys

import numpy as np

from kernels.gemm import gemm_unchecked

_gemm_mod = sys.modules["kernels.gemm"]  # the module (kernels.gemm the attribute is the function)


def _linear_gemms(n, d_in, d_out, dx=True):
    """(M, N, K, trans_a, trans_b, beta) of y = x W, dW += x^T dy, dx = dy W^T, in the
    row-major terms of gemm(): out (M, N) = op(a) (M, K) @ op(b) (K, N)."""
    fwd = [(n, d_out, d_in, False, False, 0.0)]            # y  (n, d_out) = x @ W
    bwd = [(d_in, d_out, n, True, False, 1.0)]             # dW (d_in, d_out) += x^T @ dy
    if dx:
        bwd.append((n, d_in, d_out, False, True, 0.0))     # dx (n, d_in) = dy @ W^T
    return fwd, bwd


def gemm_list(block: str, shape) -> list:
    """The GEMMs of one forward + backward of ``block`` at ``shape``, forward first, as
    (M, N, K, trans_a, trans_b, beta) tuples."""
    n = shape.rows
    if block.startswith("FFN"):  # FFN and the sublayer (LayerNorm has no GEMM): 2 + 4
        d, f = shape.d_model, shape.d_ff
        f1, b1 = _linear_gemms(n, d, f)
        f2, b2 = _linear_gemms(n, f, d)
        return f1 + f2 + b2 + b1
    if block == "GMLP":  # 3 + 6: W_gate and W_proj share one (d, 2f) GEMM
        d, f = shape.d_model, shape.d_ff
        # The gate/proj weight is stored transposed, (2f, d): forward Z @ Wt^T, its gradient
        # dWt (2f, d) += dGP^T Z, the input gradient dZ = dGP @ Wt.
        fwd = [(n, d, d, False, False, 0.0),          # Z_pre (n, d) = X @ W_in
               (n, 2 * f, d, False, True, 0.0),       # GP (n, 2f) = Z @ Wt^T
               (n, d, f, False, False, 0.0)]          # Y (n, d) = A @ W_out
        bwd = [(f, d, n, True, False, 1.0),           # dW_out (f, d) += A^T dY
               (n, f, d, False, True, 0.0),           # dA (n, f) = dY W_out^T
               (2 * f, d, n, True, False, 1.0),       # dWt (2f, d) += dGP^T Z
               (n, d, 2 * f, False, False, 0.0),      # dZ (n, d) = dGP @ Wt
               (d, d, n, True, False, 1.0),           # dW_in (d, d) += X^T dZ_pre
               (n, d, d, False, True, 0.0)]           # dX (n, d) = dZ_pre W_in^T
        return fwd + bwd
    if block == "MLP":  # 3 + 6: every layer, the first included, returns its input gradient
        sizes = shape.sizes
        fwd, bwd = [], []
        for d_in, d_out in zip(sizes[:-1], sizes[1:]):
            f, b = _linear_gemms(n, d_in, d_out)
            fwd += f
            bwd = b + bwd
        return fwd + bwd
    raise ValueError(f"block: no GEMM list for {block!r}")


def gemm_flops(gemms) -> int:
    """2 M N K summed over the GEMMs."""
    return sum(2 * m * n * k for m, n, k, *_ in gemms)


def floor_fn(gemms, dtype=np.float32, seed: int = 0):
    """A callable running ``gemms`` on buffers allocated here (small random values, so the
    beta=1 accumulations stay finite over thousands of calls)."""
    rng = np.random.default_rng(seed)
    calls = []
    for m, n, k, ta, tb, beta in gemms:
        a = (0.01 * rng.standard_normal((k, m) if ta else (m, k))).astype(dtype)
        b = (0.01 * rng.standard_normal((n, k) if tb else (k, n))).astype(dtype)
        out = np.zeros((m, n), dtype)
        calls.append((out, a, b, ta, tb, 1.0, beta))
    calls = tuple(calls)
    g = gemm_unchecked

    def run():
        for c in calls:
            g(*c)
    return run


def replay_fn(fn):
    """A callable replaying the BLAS GEMM calls that one ``fn()`` makes (``fn`` is run once
    here), with the same routines, arguments and arrays: the block's own buffers. Replayed
    outputs are the block's work buffers (rewritten by its next call) and its gradients
    (beta=1 calls accumulate, as the block's own do)."""
    calls = []
    table = _gemm_mod._GEMM
    saved = dict(table)

    def wrap(f):
        def rec(*args):
            calls.append((f, args))
            return f(*args)
        return rec

    try:
        for key, f in saved.items():
            table[key] = wrap(f)
        fn()
    finally:
        table.update(saved)
    if not calls:
        raise RuntimeError("replay_fn: the function made no GEMM call through kernels.gemm")
    calls = tuple(calls)

    def run():
        for f, args in calls:
            f(*args)
    run.calls = calls  # ((routine, args), ...) as passed to scipy
    return run


@contextlib.contextmanager
def record_gemms():
    """Record the (M, N, K) of every GEMM that goes through ``kernels.gemm`` (``gemm`` and
    ``gemm_unchecked`` both look the BLAS routine up in ``kernels.gemm._GEMM`` per call).
    A block that calls scipy's BLAS by another route is not seen (the list stays short)."""
    calls = []
    table = _gemm_mod._GEMM
    saved = dict(table)

    def wrap(f):
        def rec(alpha, a, b, beta, c, trans_a=0, trans_b=0, overwrite_c=0):
            # Fortran view: c (n_f, m_f) = op(a) op(b); row-major out is c.T.
            k = a.shape[0] if trans_a else a.shape[1]
            calls.append((c.shape[1], c.shape[0], k))
            return f(alpha, a, b, beta, c, trans_a, trans_b, overwrite_c)
        return rec

    try:
        for key, f in saved.items():
            table[key] = wrap(f)
        yield calls
    finally:
        table.update(saved)


def mnk(gemms) -> list:
    return [(m, n, k) for m, n, k, *_ in gemms]


def same_gemms(seen, gemms) -> bool:
    """Whether the recorded (M, N, K) are the floor's GEMMs, up to transposing an output
    (C^T = B^T A^T is the same product: a block may keep a buffer transposed)."""
    def canon(ts):
        return sorted((min(m, n), max(m, n), k) for m, n, k in ts)
    return canon(seen) == canon(mnk(gemms))

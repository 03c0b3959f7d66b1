"""GEMM floors: the GEMM calls of one block's forward + backward, with nothing else.

``replay_fn`` is the floor the bench times: it records the ``kernels.ops.gemm`` calls one
forward + backward of the block makes (``kernels.instrument.record``) and replays exactly
those calls, same arguments, on the block's own buffers, so the floor shares the block's
operand layouts and its cache behaviour (the weights read by forward and backward are one
array). ``gemm_list`` is the registry's list of those GEMMs (forward 1x, backward 2x) for the
FLOP count, and ``floor_fn`` runs such a list on buffers of its own (the reference for
comparisons that cannot reach the block's buffers, e.g. bench/vs_torch.py). ``record_gemms``
checks what the block really calls.
"""
from __future__ import annotations

import contextlib
import importlib
import time

import numpy as np

from kernels import ops
from kernels.instrument import record, replay

from bench import cases

_gemm = importlib.import_module("kernels.gemm")  # the module (kernels.gemm is also a function)


def gemm_list(block: str, shape) -> list:
    """The GEMMs of one forward + backward of ``block`` at ``shape``, forward first, as
    (M, N, K, trans_a, trans_b, beta) tuples (engine.models.registry's list for the block)."""
    return cases.gemm_list(block, shape)


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
    g = ops.gemm  # outside any record block: the real kernel

    def run():
        for c in calls:
            g(*c)
    return run


def replay_fn(fn):
    """A callable replaying the ``kernels.ops.gemm`` calls that one ``fn()`` makes (``fn`` is
    run once here, recorded), with the same arguments and arrays: the block's own buffers.
    Replayed outputs are the block's work buffers (rewritten by its next call) and its
    gradients (beta=1 calls accumulate, as the block's own do). ``run.calls`` holds the
    argument tuples as passed (``gemm_args`` fills in the defaults).

    Replayed back to back, the calls compound: a backward GEMM may write a buffer that a
    forward GEMM reads (the elementwise passes between them are not replayed), so values can
    grow every replay until they overflow, or shrink into denormals (slow arithmetic). The
    block's own call rewrites those buffers, so a floor alternating with the block stays
    put; a floor timed alone calls ``run.restore()`` (untimed) first, which copies back every
    output as the recorded call left it.

    The floor is the GEMMs at their fastest: when a call is small enough for the engine's
    one-thread rule (``kernels.gemm.ONE_THREAD_DIM``), the replay runs with the rule or
    without it, whichever of the two took less time here (``run.one_thread_dim`` says which),
    so a rule that trades GEMM time for the update's cannot make the floor slower."""
    return fastest_threads(replay(fn, "gemm"))


def fastest_threads(run, rounds: int = 15):
    """``run`` (a ``replay``) wrapped to set ``kernels.gemm.ONE_THREAD_DIM`` to the value,
    the rule's or 0 (no call forced onto one thread), under which it ran faster: the best of
    ``rounds`` alternating timings each, every one after ``run.restore()``."""
    rule = _gemm.ONE_THREAD_DIM
    if rule <= 0 or all(min(gemm_mnk(args)) > rule for args in run.calls):
        best = rule  # no call is affected
    else:
        times = {rule: [], 0: []}
        for i in range(2 * rounds):
            value = (rule, 0)[i % 2]
            run.restore()
            _gemm.ONE_THREAD_DIM = value
            try:
                t0 = time.perf_counter()
                run()
                times[value].append(time.perf_counter() - t0)
            finally:
                _gemm.ONE_THREAD_DIM = rule
        run.restore()
        best = min(times, key=lambda v: min(times[v]))  # the fastest each way can run

    def floor():
        _gemm.ONE_THREAD_DIM = best
        try:
            run()
        finally:
            _gemm.ONE_THREAD_DIM = rule
    floor.calls, floor.restore, floor.one_thread_dim = run.calls, run.restore, best
    return floor


# gemm's defaults after (out, a, b): a recorded call holds only the arguments passed.
GEMM_DEFAULTS = (False, False, 1.0, 0.0, False)  # trans_a, trans_b, alpha, beta, defer


def gemm_args(args) -> tuple:
    """A recorded gemm call's arguments with the defaults filled in: (out, a, b, trans_a,
    trans_b, alpha, beta, defer)."""
    return (*args, *GEMM_DEFAULTS[len(args) - 3:])


def gemm_mnk(args) -> tuple:
    """(M, N, K) of one recorded gemm call ``(out, a, b[, trans_a, ...])``."""
    out, a, _, trans_a = gemm_args(args)[:4]
    return out.shape[0], out.shape[1], a.shape[0] if trans_a else a.shape[1]


@contextlib.contextmanager
def record_gemms():
    """Record the (M, N, K) of every ``kernels.ops.gemm`` call made inside the block; the
    yielded list is filled when the block ends."""
    seen: list = []
    with record(["gemm"]) as rec:
        yield seen
    seen.extend(gemm_mnk(c.args) for c in rec.of("gemm"))


def mnk(gemms) -> list:
    return [(m, n, k) for m, n, k, *_ in gemms]


def same_gemms(seen, gemms) -> bool:
    """Whether the recorded (M, N, K) are the floor's GEMMs, up to transposing an output
    (C^T = B^T A^T is the same product: a block may keep a buffer transposed)."""
    def canon(ts):
        return sorted((min(m, n), max(m, n), k) for m, n, k in ts)
    return canon(seen) == canon(mnk(gemms))

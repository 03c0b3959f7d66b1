"""Weight-gradient GEMMs on a second core while the backward goes on (2+ threads).

In a backward pass each layer's weight gradient (dW += x^T dy) depends on nothing the
layers below need: only the input gradient (dx = dy W^T) and the elementwise passes are on
the critical path. At two threads the engine otherwise runs each GEMM on both cores and
most elementwise passes (LayerNorm, GELU) on one: below a few hundred microseconds of work
a split of such a pass loses (kernels.parallel). Inside ``session()`` instead, GEMMs
called with ``defer=True`` (kernels.gemm) go in order to one lane thread that runs them on
the other core as one-thread GEMMs, while the calling thread goes on with the rest, its own
GEMMs on one thread too, and its fixed splits inline (a pool thread would share the lane's
core; attention's claimed pairs still go to the pool). Which thread runs a GEMM never
depends on timing, so a run gives the same bits every time; OpenBLAS may round a GEMM
differently at one thread than at two on some kernels, so they may differ in the last bits
from the backward without a session (docs/guarantees.md: across thread counts GEMMs may).

The lane calls BLAS through ctypes, which releases the GIL for the call (scipy's wrappers
hold it): scipy's own OpenBLAS, by the Fortran routine ``scipy.linalg.cython_blas`` exports.

A deferred GEMM reads its operands later: nothing may write them, or the output, before it
has run. ``wait_for(array)`` waits for every pending GEMM that reads or writes memory of
``array`` (call it before writing such an array), ``fence()`` for all of them; leaving the
session fences. So only a caller that knows who writes what opens a session (the GPT's
backward, engine.models.gpt); a module defers only inside one (``deferring()``).
"""
from __future__ import annotations

import contextlib
import ctypes
import os
import queue
import threading
import time

import numpy as np

from . import parallel as _parallel
from . import threads as _threads
from .jit import disabled
from .memory import scratch

__all__ = ["session", "deferring", "submit", "wait_for", "fence", "rows", "available",
           "lane_thread_ids", "ENABLED"]

# Off: every deferred GEMM runs at once (the switch for comparisons; engine tests use it).
ENABLED = [True]


def _fortran_gemms():
    """{dtype: ctypes function} for sgemm / dgemm of scipy's OpenBLAS, or None."""
    try:
        from scipy.linalg import cython_blas
        api = ctypes.pythonapi
        api.PyCapsule_GetName.restype = ctypes.c_char_p
        api.PyCapsule_GetName.argtypes = [ctypes.py_object]
        api.PyCapsule_GetPointer.restype = ctypes.c_void_p
        api.PyCapsule_GetPointer.argtypes = [ctypes.py_object, ctypes.c_char_p]
        proto = ctypes.CFUNCTYPE(None, *[ctypes.c_void_p] * 13)  # releases the GIL
        out = {}
        for dt, name in ((np.float32, "sgemm"), (np.float64, "dgemm")):
            cap = cython_blas.__pyx_capi__[name]
            out[np.dtype(dt)] = proto(api.PyCapsule_GetPointer(cap, api.PyCapsule_GetName(cap)))
        return out
    except (ImportError, KeyError, AttributeError, ValueError):  # pragma: no cover - other builds
        return None


_GEMMS = _fortran_gemms()


def available() -> bool:
    """Whether a session can defer: the Fortran GEMMs were found, the kernels are compiled
    (``NUMBA_DISABLE_JIT`` runs them holding the GIL), and OpenBLAS's thread count can be set."""
    return (_GEMMS is not None and not disabled()
            and _threads.SCIPY_OPENBLAS_CALLS is not None)


def _span(x):
    start = x.__array_interface__["data"][0]
    return start, start + x.nbytes


class _Caller:
    """Fortran GEMM calls through ctypes from one thread, with that thread's argument cells
    (m, n, k, lda, ldb, ldc; the two flags; alpha and beta)."""

    def __init__(self):
        self.ints = np.zeros(6, np.int32)
        self.flags = np.zeros(2, np.uint8)
        self.scalars = {dt: np.zeros(2, dt) for dt in (np.dtype(np.float32),
                                                       np.dtype(np.float64))}
        self.ip = [self.ints.ctypes.data + 4 * i for i in range(6)]
        self.fp = [self.flags.ctypes.data, self.flags.ctypes.data + 1]
        self.sp = {dt: (v, v.ctypes.data) for dt, v in self.scalars.items()}

    def __call__(self, out, a, b, ta, tb, alpha, beta, pa=None, pb=None, pout=None):
        # row-major out = op(a) op(b) is column-major out^T = op(b)^T op(a)^T; pa, pb, pout:
        # the arrays' addresses where the caller has them
        ints, flags, ip, fp = self.ints, self.flags, self.ip, self.fp
        m, n = out.shape
        ints[0], ints[1] = n, m
        ints[2] = a.shape[0] if ta else a.shape[1]
        ints[3], ints[4], ints[5] = b.shape[1], a.shape[1], n
        flags[0] = 84 if tb else 78  # "T" / "N"
        flags[1] = 84 if ta else 78
        s, sp = self.sp[out.dtype]
        s[0], s[1] = alpha, beta
        if pout is None:
            pa, pb, pout = a.ctypes.data, b.ctypes.data, out.ctypes.data
        _GEMMS[out.dtype](fp[0], fp[1], ip[0], ip[1], ip[2], sp, pb, ip[3], pa, ip[4],
                          sp + s.itemsize, pout, ip[5])
        return out


class _Lane:
    """One thread running GEMMs in the order they were submitted. Ticket t (the t-th GEMM
    submitted) lives in slot t % SLOTS of preallocated lists until it has run, so a queued
    GEMM allocates nothing that outlives the call (a steady step's memory stays flat)."""

    SLOTS = 64

    def __init__(self):
        n = self.SLOTS
        self.tasks = queue.SimpleQueue()   # slot numbers (small ints: no allocation)
        # per slot: out, a, b, trans_a, trans_b, alpha, beta, and the first and past-the-end
        # bytes of out, a and b (an array: ints written into a list would be new objects)
        self.args = [[None] * n for _ in range(7)]
        self.spans = np.zeros((n, 6), np.int64)
        self.submitted = 0
        self.done = 0
        self.error: BaseException | None = None
        self.main = _Caller()          # the session's thread's GEMMs, the GIL released too
        self.thread = threading.Thread(target=self._loop, name="blasnet-lane", daemon=True)
        self.thread.start()

    def _loop(self):
        call, args, spans = _Caller(), self.args, self.spans
        while True:
            slot = self.tasks.get()
            try:
                call(*(x[slot] for x in args), int(spans[slot, 2]), int(spans[slot, 4]),
                     int(spans[slot, 0]))
            except BaseException as e:  # handed to the next wait
                self.error = self.error or e
            for x in args[:3]:  # the arrays are the caller's: hold none once run
                x[slot] = None
            self.done += 1

    def submit(self, out, a, b, ta, tb, alpha, beta) -> None:
        if self.submitted - self.done >= self.SLOTS:  # every slot holds a queued GEMM
            self.wait(self.submitted - self.SLOTS + 1)
        self.submitted += 1
        slot = self.submitted % self.SLOTS
        sp = self.spans[slot]
        sp[0], sp[1] = _span(out)
        sp[2], sp[3] = _span(a)
        sp[4], sp[5] = _span(b)
        for x, v in zip(self.args, (out, a, b, ta, tb, alpha, beta)):
            x[slot] = v
        self.tasks.put(slot)

    def wait(self, ticket: int) -> None:
        # Polled: waits are few and short (the lane keeps pace), and a condition variable
        # allocates on every notify; sleep(0) hands the GIL to the lane between polls.
        while self.done < ticket:
            time.sleep(0)
        if self.error is not None:
            e, self.error = self.error, None
            raise e

    def wait_for(self, x) -> None:
        lo, hi = _span(x)
        for ticket in range(self.submitted, self.done, -1):  # the latest first
            s = self.spans[ticket % self.SLOTS]
            if (s[0] < hi and lo < s[1]) or (s[2] < hi and lo < s[3]) or (s[4] < hi and lo < s[5]):
                self.wait(ticket)
                return


_lane: list = [None]      # created on the first session
_active = [False]
_owner = [None]           # the thread that opened the session: only its GEMMs are deferred


def _reset_after_fork():
    _lane[0], _active[0], _owner[0] = None, False, None  # the child has no lane thread


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_reset_after_fork)


def lane_thread_ids() -> set:
    """The OS thread id of the lane thread, once started (bench's interference probe leaves
    it out, as kernels.parallel.pool_thread_ids)."""
    return set() if _lane[0] is None else {_lane[0].thread.native_id}


def deferring() -> bool:
    """True inside a session, on the thread that opened it: GEMMs called with
    ``defer=True`` go to the lane."""
    return _active[0] and _owner[0] == threading.get_ident()


def submit(out, a, b, trans_a, trans_b, alpha, beta) -> None:
    """Queue ``out = alpha op(a) op(b) + beta out`` on the lane (inside a session only; the
    caller has checked the arrays, as for kernels.gemm.gemm_unchecked)."""
    _lane[0].submit(out, a, b, trans_a, trans_b, alpha, beta)


def rows(key: str, like):
    """A buffer of ``like``'s shape and dtype, one per ``key`` for every module (the calling
    thread's scratch), for a gradient that would otherwise overwrite what a queued GEMM still
    reads; returned once no queued GEMM reads it any more (another module's, from earlier in
    the backward), so it can be written at once."""
    buf = scratch(("overlap", key), like.shape, like.dtype)
    wait_for(buf)
    return buf


def gemm_now(out, a, b, trans_a, trans_b, alpha, beta):
    """``out = alpha op(a) op(b) + beta out`` on the calling thread (the session's) with the
    GIL released for the call, so that the lane can start its next GEMM meanwhile (scipy's
    wrapper holds the GIL). One OpenBLAS thread, as the lane's: a count that followed the
    lane's timing could change the bits from run to run. Returns ``out``."""
    return _lane[0].main(out, a, b, trans_a, trans_b, alpha, beta)


def wait_for(x) -> None:
    """Return once no queued GEMM reads or writes memory of the array ``x`` (no-op outside a
    session)."""
    if deferring():
        _lane[0].wait_for(x)


def fence() -> None:
    """Return once every queued GEMM has run (no-op outside a session); re-raises the first
    error one raised."""
    if deferring():
        lane = _lane[0]
        lane.wait(lane.submitted)


@contextlib.contextmanager
def session():
    """Defer weight-gradient GEMMs to the lane for the block, at 2+ threads (the engine's
    setting) when ``available()`` and ``ENABLED``. Meanwhile OpenBLAS runs on one thread
    (the calling thread's GEMMs and the lane's; the elementwise passes keep their split). Fences
    and restores OpenBLAS's thread count on exit, even on an error. Nested, or where it does
    not apply, it does nothing."""
    if (_active[0] or not ENABLED[0] or _threads.elementwise_threads() < 2
            or not available()):
        yield
        return
    get, put = _threads.SCIPY_OPENBLAS_CALLS
    blas = get()
    if _lane[0] is None:
        _lane[0] = _Lane()
    put(1)
    _owner[0] = threading.get_ident()
    _active[0] = _parallel.STATIC_INLINE[0] = True
    try:
        yield
    finally:
        lane = _lane[0]
        try:
            lane.wait(lane.submitted)
        finally:
            _active[0] = _parallel.STATIC_INLINE[0] = False
            _owner[0] = None
            put(blas)

"""Row-parallel execution of elementwise kernels on blasnet's thread setting.

The compiled kernels (kernels.jit) release the GIL for the whole of their slice, so row or
flat slices of a large array run on several Python threads at once (the scipy gemm wrapper
holds the GIL, so GEMMs are left to OpenBLAS's own threads). What a split costs is the
hand-off to the pool (waking a worker and waiting for it): a slice must be worth several of
those (``SPLIT_WORK``; docs/performance.md, "Compiled kernels"). A pool thread polls for a
while after each slot (``SPIN_POLLS``), so within a training step a hand-off costs a few
microseconds rather than a sleeping thread's wake-up. The thread count is the one
set by ``BLASNET_NUM_THREADS`` / ``set_num_threads`` / ``num_threads`` (kernels.threads), so
one setting governs GEMMs and elementwise passes.
"""
from __future__ import annotations

import ctypes
import os
import threading

import numpy as np

from . import atomic
from . import threads as _threads
from .jit import disabled, jit

__all__ = ["split", "slots", "threads_for", "chunks", "handoffs", "pool_thread_ids",
           "MIN_ELEMENTS_PER_THREAD", "SPLIT_MIN"]

# Elements per thread below which ``chunks`` does not split (kernels that give no cost).
MIN_ELEMENTS_PER_THREAD = 256 * 1024

# A pool thread that has run a slot polls for the next one this many times (about 1 ms),
# yielding its core every 64 polls to whatever else runs there (OpenBLAS's threads), before
# it sleeps on its lock: a sleeping thread takes 30-70 us to wake on a KVM guest, twice a
# split (start and finish), a polling one ~2 us (docs/performance.md, "Compiled kernels").
SPIN_POLLS = 100_000


@jit(cache=False)  # calls libc through ctypes: an address that is not the same next process
def _spin(cell, last, polls):
    # cell[0] once it differs from last, or after polls polls (atomic reads)
    for i in range(polls):
        v = atomic.fetch_add(cell, 0)
        if v != last:
            return v
        if i & 63 == 63:
            _sched_yield()
    return atomic.fetch_add(cell, 0)


@jit
def _post(cell, value):
    # cell[0] = value, atomically (the only writer of cell is the calling thread)
    atomic.fetch_add(cell, value - atomic.fetch_add(cell, 0))
    return value


class _Worker:
    """One pool thread, handed one slot at a time. With compiled kernels it polls a counter
    (``go``) for its next slot, without the GIL, and signals the end through another
    (``done``) that the caller polls: a split then costs ~3 us instead of 40-115. After
    ``SPIN_POLLS`` polls it sleeps on a lock until the next hand-off. Without compiled
    kernels (``NUMBA_DISABLE_JIT``) it sleeps on locks only."""

    def __init__(self, name: str):
        self.go = np.zeros(1, np.int64)     # the latest hand-off's number
        self.done = np.zeros(1, np.int64)   # the latest finished hand-off's number
        self.wake = threading.Lock()
        self.wake.acquire()
        self.sleeping = False
        self.finished = threading.Lock()    # (without compiled kernels)
        self.finished.acquire()
        self.fn = None
        self.slot = 0
        self.seq = 0
        self.error: BaseException | None = None
        self.thread = threading.Thread(target=self._loop, name=name, daemon=True)
        self.thread.start()

    def _next(self, last: int) -> int:
        seq = _spin(self.go, last, SPIN_POLLS) if _POLL else last
        while seq == last:
            self.sleeping = True
            seq = int(self.go[0])
            if seq == last:
                self.wake.acquire()
                seq = int(self.go[0])
            self.sleeping = False
        return seq

    def _loop(self):
        last = 0
        while True:
            last = self._next(last)
            try:
                self.fn(self.slot)
            except BaseException as e:  # handed back to the caller of _fork
                self.error = e
            self.fn = None
            if _POLL:
                _post(self.done, last)
            else:
                self.done[0] = last
                self.finished.release()

    def start(self, fn, slot: int) -> None:
        self.fn, self.slot, self.error = fn, slot, None
        self.seq += 1
        if _POLL:
            _post(self.go, self.seq)
        else:
            self.go[0] = self.seq
        if self.sleeping and self.wake.locked():
            self.wake.release()

    def join(self) -> None:
        if _POLL:
            while _spin(self.done, self.seq - 1, SPIN_POLLS) != self.seq:
                if self.sleeping and self.wake.locked():  # asleep with a slot waiting: wake
                    self.wake.release()                   # it (it checks go once awake)
        else:
            self.finished.acquire()


def _libc_sched_yield():
    try:
        f = ctypes.CDLL(None).sched_yield
    except (OSError, AttributeError):  # pragma: no cover - no libc symbol here
        return None
    f.restype, f.argtypes = ctypes.c_int, []
    return f


_sched_yield = _libc_sched_yield()
# Poll with compiled kernels (a poll in Python would hold the GIL); sleep on locks otherwise.
_POLL = not disabled() and _sched_yield is not None

_workers: list = []
# Held while a split runs: a split from another thread (or nested in a slot) runs its slots
# inline instead of waiting for the pool.
_busy = threading.Lock()


def _reset_after_fork():
    global _workers, _busy
    _workers, _busy = [], threading.Lock()  # the child has none of the parent's threads
    STATIC_INLINE[0] = False


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_reset_after_fork)


def pool_thread_ids() -> set:
    """The OS thread ids of the pool threads started so far: they poll between slots, so a
    profiler that reads how long threads waited for a CPU should leave them out (bench)."""
    return {w.thread.native_id for w in _workers}


def chunks(n: int, elements_per_row: int) -> int:
    """How many threads to split ``n`` rows of ``elements_per_row`` over (1 = run inline)."""
    t = _threads.elementwise_threads()
    if t <= 1 or n < 2:
        return 1
    by_size = (n * elements_per_row) // MIN_ELEMENTS_PER_THREAD
    return max(1, min(t, by_size, n))


SPLIT_MIN = 2 * MIN_ELEMENTS_PER_THREAD  # elements: smaller passes always run inline

# For kernels that state their cost per element (``passes``: relative to a compiled streaming
# copy, 1; AdamW is 3): below this much work (elements x cost) a split loses to the pool
# hand-off; above it each thread gets at least half of it. A copy-element is ~0.1-0.3 ns, so
# each thread gets >= ~100 us: several hand-offs even on a busy machine (docs/performance.md,
# "Compiled kernels").
SPLIT_WORK = 2 * 1024 * 1024


def threads_for(n: int, row_len: int = 1, min_elements: int = SPLIT_MIN,
                passes: int | None = None) -> int:
    """The thread count ``split`` uses for ``n`` rows of ``row_len`` elements. Without
    ``passes``: ``chunks`` when ``n * row_len >= min_elements``, else 1. With ``passes`` (the
    kernel's relative cost per element: a compiled streaming copy is 1, AdamW's update 3):
    split when the work ``n * row_len * passes`` reaches ``SPLIT_WORK``, at least
    ``SPLIT_WORK / 2`` of it per thread."""
    if passes is None:
        return chunks(n, row_len) if n * row_len >= min_elements else 1
    work = n * row_len * passes
    t = _threads.elementwise_threads()
    if t <= 1 or n < 2 or work < SPLIT_WORK:
        return 1
    return max(1, min(t, work // (SPLIT_WORK // 2), n))


# Set while another thread has the other cores (kernels.overlap's lane): a pool thread would
# start its fixed share only when that thread lets it, and the caller would wait for it, so
# ``split`` runs every slice inline (the bits do not depend on the split); ``slots``, whose
# threads claim their work, still hands off.
STATIC_INLINE = [False]

_handoffs = [0]  # pool hand-offs so far; bumped under _busy, so no lock of its own


def handoffs() -> int:
    """How many times a split has handed work to the pool since the process started (a
    split that runs all its slices on the calling thread does not count): a profile counts
    the hand-offs of one step as the difference around it."""
    return _handoffs[0]


def _fork(fn, k: int) -> None:
    """``fn(slot)`` for slot in range(k): slot 0 on the calling thread, the others on pool
    threads (one each); waits for all and re-raises the first error. If the pool is in use
    (another thread's split, or a split inside a slot) every slot runs here, in order."""
    if k <= 1:
        fn(0)
        return
    if not _busy.acquire(blocking=False):
        for s in range(k):
            fn(s)
        return
    try:
        _handoffs[0] += 1
        while len(_workers) < k - 1:
            _workers.append(_Worker(f"blasnet-{len(_workers) + 1}"))
        team = _workers[:k - 1]
        for s, w in enumerate(team, 1):
            w.start(fn, s)
        error = None
        try:
            fn(0)
        except BaseException as e:  # still wait for the workers: they write the caller's arrays
            error = e
        for w in team:
            w.join()
            error = error or w.error
            w.error = None
    finally:
        _busy.release()
    if error is not None:
        raise error


def split(fn, n: int, row_len: int = 1, min_elements: int = SPLIT_MIN, k: int | None = None) -> int:
    """The one splitter of elementwise kernels: ``fn(i0, i1, slot)`` over ``k`` contiguous
    slices of ``range(n)`` (rows of ``row_len`` elements, or flat elements with 1), ``k`` from
    ``threads_for`` unless given (1: inline, slot 0). Slot 0 runs on the calling thread.
    Returns ``k``. ``fn`` must only touch its own rows. Scratch a pool thread uses is taken
    on the calling thread first, one per slot (``kernels.memory.scratch((key, slot), ...)``,
    with ``k`` from ``threads_for``), so a warm pass allocates nothing whichever pool thread
    runs a slot."""
    if k is None:
        k = threads_for(n, row_len, min_elements)
    if k <= 1 or STATIC_INLINE[0]:
        fn(0, n, 0)
        return 1
    _fork(lambda s: fn(n * s // k, n * (s + 1) // k, s), k)
    return k


def slots(fn, k: int) -> int:
    """``fn(slot)`` for slot in range(``k``), all at once (slot 0 on the calling thread), for
    kernels that divide their work among themselves by claiming pieces of it
    (``kernels.atomic.fetch_add``); waits for all and re-raises the first error. Returns
    ``k``."""
    _fork(fn, k)
    return k

"""Row-parallel execution of elementwise kernels on blasnet's thread setting.

The compiled kernels (kernels.jit) release the GIL for the whole of their slice, so row or
flat slices of a large array run on several Python threads at once (the scipy gemm wrapper
holds the GIL, so GEMMs are left to OpenBLAS's own threads). What a split costs is the
hand-off to the pool (waking a worker and waiting for it): a slice must be worth several of
those (``SPLIT_WORK``; docs/performance.md, "Compiled kernels"). The thread count is the one
set by ``BLASNET_NUM_THREADS`` / ``set_num_threads`` / ``num_threads`` (kernels.threads), so
one setting governs GEMMs and elementwise passes.
"""
from __future__ import annotations

import os
import threading

from . import threads as _threads

__all__ = ["split", "slots", "threads_for", "chunks", "handoffs",
           "MIN_ELEMENTS_PER_THREAD", "SPLIT_MIN"]

# Elements per thread below which ``chunks`` does not split (kernels that give no cost).
MIN_ELEMENTS_PER_THREAD = 256 * 1024

class _Worker:
    """One pool thread, handed one slot at a time through two locks: a lock hand-off wakes
    it sooner than a ThreadPoolExecutor's queue and future (docs/performance.md)."""

    def __init__(self, name: str):
        self.go = threading.Lock()
        self.go.acquire()
        self.done = threading.Lock()
        self.done.acquire()
        self.fn = None
        self.slot = 0
        self.error: BaseException | None = None
        threading.Thread(target=self._loop, name=name, daemon=True).start()

    def _loop(self):
        while True:
            self.go.acquire()
            try:
                self.fn(self.slot)
            except BaseException as e:  # handed back to the caller of _fork
                self.error = e
            self.fn = None
            self.done.release()


_workers: list = []
# Held while a split runs: a split from another thread (or nested in a slot) runs its slots
# inline instead of waiting for the pool.
_busy = threading.Lock()


def _reset_after_fork():
    global _workers, _busy
    _workers, _busy = [], threading.Lock()  # the child has none of the parent's threads


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_reset_after_fork)


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
            w.fn, w.slot, w.error = fn, s, None
            w.go.release()
        error = None
        try:
            fn(0)
        except BaseException as e:  # still wait for the workers: they write the caller's arrays
            error = e
        for w in team:
            w.done.acquire()
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
    if k <= 1:
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

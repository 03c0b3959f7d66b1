"""Row-parallel execution of elementwise kernels on blasnet's thread setting.

NumPy ufuncs release the GIL while they loop, so row chunks of a large array can run on
several Python threads at once (the scipy gemm wrapper holds the GIL, so GEMMs are left to
OpenBLAS's own threads). Each ufunc call still needs the GIL to start, so a chunk must be
large (``MIN_ELEMENTS_PER_THREAD`` elements per thread, blocks of ~512 KiB) or the threads
just queue on it (docs/performance.md, "Row-parallel elementwise passes").
The thread count is the one set by ``BLASNET_NUM_THREADS`` / ``set_num_threads`` /
``num_threads`` (kernels.threads), so one setting governs GEMMs and elementwise passes.
"""
from __future__ import annotations

import itertools
import threading
from concurrent.futures import ThreadPoolExecutor

from . import threads as _threads

__all__ = ["split", "split_blocks", "threads_for", "chunks",
           "MIN_ELEMENTS_PER_THREAD", "SPLIT_MIN"]

# Below this many elements per thread the GIL hand-offs cost more than the second core gives.
MIN_ELEMENTS_PER_THREAD = 256 * 1024

_pool: ThreadPoolExecutor | None = None
_pool_size = 0
_pool_lock = threading.Lock()


def _executor(workers: int) -> ThreadPoolExecutor:
    global _pool, _pool_size
    if _pool is None or _pool_size < workers:
        with _pool_lock:
            if _pool is None or _pool_size < workers:
                old = _pool
                _pool = ThreadPoolExecutor(max_workers=workers, thread_name_prefix="blasnet")
                _pool_size = workers
                if old is not None:
                    old.shutdown(wait=False)
    return _pool


def chunks(n: int, elements_per_row: int) -> int:
    """How many threads to split ``n`` rows of ``elements_per_row`` over (1 = run inline)."""
    t = _threads.elementwise_threads()
    if t <= 1 or n < 2:
        return 1
    by_size = (n * elements_per_row) // MIN_ELEMENTS_PER_THREAD
    return max(1, min(t, by_size, n))


SPLIT_MIN = 2 * MIN_ELEMENTS_PER_THREAD  # elements: smaller passes always run inline


def threads_for(n: int, row_len: int = 1, min_elements: int = SPLIT_MIN) -> int:
    """The thread count ``split`` uses for ``n`` rows of ``row_len`` elements: ``chunks`` when
    ``n * row_len >= min_elements``, else 1. For kernels that size their blocks (or pick a
    loop) by it before splitting."""
    return chunks(n, row_len) if n * row_len >= min_elements else 1


def _fork(fn, k: int) -> None:
    """``fn(slot)`` for slot in range(k): slot 0 on the calling thread, the others on pool
    threads; waits for all and re-raises the first error."""
    if k <= 1:
        fn(0)
        return
    pool = _executor(k - 1)
    futures = [pool.submit(fn, s) for s in range(1, k)]
    error = None
    try:
        fn(0)
    except BaseException as e:  # still wait for the workers: they write the caller's arrays
        error = e
    for f in futures:
        try:
            f.result()
        except BaseException as e:
            error = error or e
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


def _taken(counter, nblocks):
    for b in counter:
        if b >= nblocks:
            return
        yield b


def split_blocks(fn, nblocks: int, k: int) -> None:
    """Dynamic split: ``fn(blocks, slot)`` on ``k`` threads (slot 0 the caller), where
    ``blocks`` yields block indices in increasing order, each of ``range(nblocks)`` to exactly
    one thread, from one shared counter. A thread that starts late (a pool thread must wake
    up first, or its core is busy) takes fewer blocks, so the caller never waits for more
    than the block another thread is finishing. ``k`` comes from ``threads_for``."""
    if k <= 1:
        fn(range(nblocks), 0)
        return
    counter = itertools.count()  # next() is atomic under the GIL
    _fork(lambda s: fn(_taken(counter, nblocks), s), k)

"""kernels.atomic.fetch_add, the claim counter of kernels that share a pass between threads:
each value is handed out exactly once when threads claim at the same time, compiled and in
its Python form (NUMBA_DISABLE_JIT)."""
import threading

import numba
import numpy as np

from kernels import atomic


@numba.njit(nogil=True)
def _claim_all(counter, owner, slot, n):
    # claim items one at a time until none is left; owner[i] counts who took item i
    while True:
        i = atomic.fetch_add(counter, 1)
        if i >= n:
            return
        owner[i] += slot


def _race(claim, n, n_threads=4):
    counter, owner = np.zeros(1, np.int64), np.zeros(n, np.int64)
    go = threading.Barrier(n_threads)

    def run(slot):
        go.wait()
        claim(counter, owner, slot, n)
    threads = [threading.Thread(target=run, args=(1 << (8 * s),)) for s in range(n_threads)]
    for th in threads:
        th.start()
    for th in threads:
        th.join()
    return counter, owner


def test_fetch_add_returns_the_value_before():
    @numba.njit
    def two_adds(c):
        return atomic.fetch_add(c, 5), atomic.fetch_add(c, np.int32(-2))
    c = np.array([7], np.int64)
    assert two_adds(c) == (7, 12) and c[0] == 10


def test_compiled_claims_hand_out_every_item_once():
    # Four threads claim 200,000 items at once (the GIL released): a lost update would hand
    # an item to two threads (two slot bits set) or to none.
    n = 200_000
    counter, owner = _race(_claim_all, n)
    singles = {1 << (8 * s) for s in range(4)}
    assert set(np.unique(owner)) <= singles
    assert counter[0] == n + 4  # one miss per thread


def test_python_claims_hand_out_every_item_once():
    def claim(counter, owner, slot, n):
        while (i := atomic._fetch_add_python(counter, 1)) < n:
            owner[i] += slot
    counter, owner = _race(claim, 20_000)
    assert set(np.unique(owner)) <= {1 << (8 * s) for s in range(4)} and counter[0] == 20_004

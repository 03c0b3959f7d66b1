"""kernels.parallel: row-parallel runner following blasnet's thread setting."""
import threading

import numpy as np
import pytest

from kernels import num_threads, parallel, threads


@pytest.mark.parametrize("n,k", [(10, 1), (10, 2), (7, 3), (2, 2), (1000, 4)])
def test_parallel_for_covers_every_row_once(n, k):
    # Check that the k slices tile range(n) exactly, with no gap and no overlap.
    hits = np.zeros(n, np.int64)
    lock = threading.Lock()

    def fn(i, j):
        with lock:
            hits[i:j] += 1

    parallel.parallel_for(fn, n, k)
    np.testing.assert_array_equal(hits, np.ones(n, np.int64))


def test_parallel_for_runs_slices_on_other_threads():
    # Check that with k = 2 one slice runs on the caller and the other on a pool thread.
    names = []
    parallel.parallel_for(lambda i, j: names.append(threading.current_thread().name), 10, 2)
    assert threading.current_thread().name in names
    assert any(name.startswith("blasnet") for name in names)


def test_parallel_for_reraises_worker_errors_after_all_finish():
    # Check that an error in a worker slice reaches the caller, after the other slices ran.
    done = []

    def fn(i, j):
        if i > 0:
            raise ZeroDivisionError("worker")
        done.append((i, j))

    with pytest.raises(ZeroDivisionError, match="worker"):
        parallel.parallel_for(fn, 10, 2)
    assert done == [(0, 5)]


def test_chunks_follow_the_thread_setting():
    # Check that large arrays split over the blasnet thread count and small ones stay inline.
    big = parallel.MIN_ELEMENTS_PER_THREAD * 4
    with num_threads(1):
        assert threads.elementwise_threads() == 1
        assert parallel.chunks(big, 1) == 1
    with num_threads(2):
        assert threads.elementwise_threads() == 2
        assert parallel.chunks(big, 1) == 2
        assert parallel.chunks(1000, 8) == 1
        assert parallel.chunks(1, big) == 1


def test_num_threads_restores_elementwise_setting():
    # Check that the context manager restores the elementwise thread count too.
    before = threads.elementwise_threads()
    try:
        threads.set_num_threads(2)
        with num_threads(1):
            assert threads.elementwise_threads() == 1
        assert threads.elementwise_threads() == 2
    finally:
        threads.set_num_threads(before)

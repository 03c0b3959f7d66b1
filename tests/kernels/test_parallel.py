"""kernels.parallel: row-parallel runner following blasnet's thread setting."""
import threading

import numpy as np
import pytest

from kernels import num_threads, parallel, threads


@pytest.mark.parametrize("n,k", [(10, 1), (10, 2), (7, 3), (2, 2), (1000, 4)])
def test_split_covers_every_row_once(n, k):
    # Check that the k slices tile range(n) exactly, with no gap and no overlap, and each
    # gets its own slot number.
    hits = np.zeros(n, np.int64)
    slots = []
    lock = threading.Lock()

    def fn(i, j, slot):
        with lock:
            hits[i:j] += 1
            slots.append(slot)

    assert parallel.split(fn, n, k=k) == k
    np.testing.assert_array_equal(hits, np.ones(n, np.int64))
    assert sorted(slots) == list(range(k))


def test_split_runs_slices_on_other_threads():
    # Check that with k = 2 one slice runs on the caller and the other on a pool thread.
    names = []
    parallel.split(lambda i, j, s: names.append(threading.current_thread().name), 10, k=2)
    assert threading.current_thread().name in names
    assert any(name.startswith("blasnet") for name in names)


def test_split_reraises_worker_errors_after_all_finish():
    # Check that an error in a worker slice reaches the caller, after the other slices ran.
    done = []

    def fn(i, j, slot):
        if i > 0:
            raise ZeroDivisionError("worker")
        done.append((i, j))

    with pytest.raises(ZeroDivisionError, match="worker"):
        parallel.split(fn, 10, k=2)
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


def _recording_fn():
    calls, lock = [], threading.Lock()

    def fn(i, j, slot):
        with lock:
            calls.append((i, j, slot, threading.current_thread().name))
    return calls, fn


@pytest.mark.parametrize("n,row_len", [(parallel.SPLIT_MIN + 1, 1), (2048, 512), (1001, 999)])
def test_split_tiles_the_range_over_the_thread_setting(n, row_len):
    # Check that split at 2 threads calls fn on 2 contiguous slices tiling range(n), slot 0 on
    # the calling thread and slot 1 on a pool thread, and returns 2.
    calls, fn = _recording_fn()
    with num_threads(2):
        assert parallel.split(fn, n, row_len) == 2
    calls.sort(key=lambda c: c[2])
    assert [c[2] for c in calls] == [0, 1]
    assert calls[0][0] == 0 and calls[0][1] == calls[1][0] and calls[1][1] == n
    assert calls[0][3] == threading.current_thread().name
    assert calls[1][3].startswith("blasnet")


def test_split_runs_inline_below_the_minimum_or_on_one_thread():
    # Check that small passes, and any pass at 1 thread, run as one call on the caller.
    for threads_, n, min_elements in ((2, 1000, parallel.SPLIT_MIN), (1, 10**7, 1),
                                      (2, 100, 101)):
        calls, fn = _recording_fn()
        with num_threads(threads_):
            assert parallel.split(fn, n, 1, min_elements) == 1
        assert calls == [(0, n, 0, threading.current_thread().name)]


def test_split_takes_a_given_thread_count():
    # Check that k given by the caller overrides the thread setting (3 slices on 1 thread).
    calls, fn = _recording_fn()
    with num_threads(1):
        assert parallel.split(fn, 10, k=3) == 3
    assert sorted(c[:3] for c in calls) == [(0, 3, 0), (3, 6, 1), (6, 10, 2)]


def test_threads_for_is_the_count_split_uses():
    # Check threads_for against chunks above the minimum and 1 below it.
    with num_threads(2):
        assert parallel.threads_for(parallel.SPLIT_MIN) == parallel.chunks(parallel.SPLIT_MIN, 1) == 2
        assert parallel.threads_for(parallel.SPLIT_MIN - 1) == 1
        assert parallel.threads_for(100, 10**6, min_elements=10**9) == 1


def test_threads_for_splits_by_work_when_passes_are_given():
    # Check that with passes the split follows elements x passes against SPLIT_WORK, and
    # that one thread never splits.
    w = parallel.SPLIT_WORK
    with num_threads(2):
        assert parallel.threads_for(w // 32 - 1, passes=32) == 1
        assert parallel.threads_for(w // 32, passes=32) == 2
        assert parallel.threads_for(w // 32, passes=3) == 1
        assert parallel.threads_for(w // 64, 2, passes=32) == 2  # rows x row length
    with num_threads(1):
        assert parallel.threads_for(10 * w, passes=32) == 1


def test_concurrent_splits_from_two_threads_each_cover_their_rows():
    # Check that two threads splitting at once both get every row done exactly once (one of
    # them may find the pool busy and run its slots itself).
    n = 4000
    hits = [np.zeros(n, np.int64), np.zeros(n, np.int64)]
    barrier = threading.Barrier(2)
    errors = []

    def caller(which):
        try:
            barrier.wait(timeout=10)
            for _ in range(50):
                parallel.split(lambda i, j, s: hits[which].__setitem__(
                    slice(i, j), hits[which][i:j] + 1), n, k=2)
        except BaseException as e:  # reported below
            errors.append(e)

    threads_ = [threading.Thread(target=caller, args=(w,)) for w in (0, 1)]
    for t in threads_:
        t.start()
    for t in threads_:
        t.join(timeout=30)
    assert not errors
    for h in hits:
        np.testing.assert_array_equal(h, np.full(n, 50))


def test_handoffs_count_the_splits_that_used_the_pool():
    # Check that a 2-way split counts one hand-off, a 1-way split and a split nested inside
    # a slot (run in order on the caller) none.
    before = parallel.handoffs()
    parallel.split(lambda i, j, s: None, 10, k=2)
    assert parallel.handoffs() == before + 1
    parallel.split(lambda i, j, s: None, 10, k=1)
    assert parallel.handoffs() == before + 1

    def nested(i, j, s):
        if s == 0:
            parallel.split(lambda a, b, t: None, 10, k=2)  # the pool is busy: runs here
    parallel.split(nested, 10, k=2)
    assert parallel.handoffs() == before + 2


def _covered(n, k):
    hits = np.zeros(n, np.int64)
    lock = threading.Lock()

    def fn(i, j, slot):
        with lock:
            hits[i:j] += 1
    parallel.split(fn, n, k=k)
    return np.array_equal(hits, np.ones(n, np.int64))


def test_a_pool_thread_that_went_to_sleep_wakes_for_the_next_split(monkeypatch):
    # Check that a pool thread that stopped polling (after SPIN_POLLS) and sleeps on its lock
    # is woken by the next hand-off, every time.
    if not parallel._POLL:
        pytest.skip("the pool polls only with compiled kernels")
    monkeypatch.setattr(parallel, "SPIN_POLLS", 1)
    for _ in range(5):
        assert _covered(50, 3)
        workers = parallel._workers[:2]
        for _ in range(2000):  # up to 2 s for both to give up polling
            if all(w.sleeping for w in workers):
                break
            threading.Event().wait(0.001)
        assert all(w.sleeping for w in workers)
    assert _covered(50, 3)


def test_splits_without_polling_hand_off_through_locks(monkeypatch):
    # Check the pool's other hand-off (NUMBA_DISABLE_JIT's: the threads sleep on locks), on
    # threads that were polling before.
    polls = parallel._POLL
    assert _covered(40, 3)
    monkeypatch.setattr(parallel, "_POLL", False)
    for _ in range(20):
        assert _covered(40, 3)
    monkeypatch.setattr(parallel, "_POLL", polls)
    assert _covered(40, 3)

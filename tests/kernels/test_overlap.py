"""kernels.overlap: weight-gradient GEMMs queued on a lane thread inside a session (2+
threads), the waits that keep their operands safe, and a session that always puts the
thread counts back."""
import numpy as np
import pytest

import kernels
from kernels import gemm_unchecked, overlap
from kernels.threads import get_num_threads

pytestmark = pytest.mark.skipif(not overlap.available(),
                                reason="no Fortran GEMM to call without the GIL")


def _operands(rng, m, n, k, ta, tb, dtype):
    a = rng.standard_normal((k, m) if ta else (m, k)).astype(dtype)
    b = rng.standard_normal((n, k) if tb else (k, n)).astype(dtype)
    c = rng.standard_normal((m, n)).astype(dtype)
    return a, b, c


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("ta, tb", [(False, False), (True, False), (False, True), (True, True)])
def test_a_queued_gemm_equals_one_run_at_once(dtype, ta, tb):
    # Check that a deferred GEMM (any transposes, beta 1) gives the bits of the same GEMM run
    # at once in the session (both one OpenBLAS thread), and the product NumPy computes.
    rng = np.random.default_rng(0)
    a, b, c = _operands(rng, 37, 53, 29, ta, tb, dtype)
    later, now = c.copy(), c.copy()
    with kernels.num_threads(2), overlap.session():
        assert overlap.deferring()
        gemm_unchecked(later, a, b, ta, tb, 0.5, 1.0, True)
        gemm_unchecked(now, a, b, ta, tb, 0.5, 1.0)
        overlap.fence()
    np.testing.assert_array_equal(later, now)
    want = 0.5 * ((a.T if ta else a) @ (b.T if tb else b)) + c
    np.testing.assert_allclose(later, want, rtol=1e-4 if dtype == np.float32 else 1e-12,
                               atol=1e-4 if dtype == np.float32 else 1e-12)


def test_wait_for_returns_after_the_gemm_writing_the_array():
    # Check that wait_for(out) waits for the queued GEMM that writes out (a large one, so
    # that a wait that returned at once would find it unwritten), and that a GEMM's operands
    # count too.
    rng = np.random.default_rng(1)
    a, b, _ = _operands(rng, 600, 600, 600, False, False, np.float64)
    out = np.full((600, 600), np.nan)
    with kernels.num_threads(2), overlap.session():
        gemm_unchecked(out, a, b, False, False, 1.0, 0.0, True)
        overlap.wait_for(out[100:101])      # part of it is enough
        np.testing.assert_allclose(out, a @ b, rtol=1e-12, atol=1e-9)
        out2 = np.full_like(out, np.nan)
        gemm_unchecked(out2, a, b, False, False, 1.0, 0.0, True)
        overlap.wait_for(b)                 # an operand: out2 is done once b is free
        assert not np.isnan(out2).any()


def test_session_defers_nothing_at_one_thread_or_when_disabled():
    # Check that a session at one thread, nested, or switched off leaves every GEMM to run
    # at once.
    with kernels.num_threads(1), overlap.session():
        assert not overlap.deferring()
    overlap.ENABLED[0] = False
    try:
        with kernels.num_threads(2), overlap.session():
            assert not overlap.deferring()
    finally:
        overlap.ENABLED[0] = True
    with kernels.num_threads(2), overlap.session():
        with overlap.session():
            assert overlap.deferring()
        assert overlap.deferring()          # the inner one did not end the outer
    assert not overlap.deferring()


def test_an_error_in_a_session_restores_the_thread_count():
    # Check that a session left by an exception waits for the lane, puts OpenBLAS's thread
    # count back and stops deferring.
    rng = np.random.default_rng(2)
    a, b, _ = _operands(rng, 300, 300, 300, False, False, np.float64)
    out = np.zeros((300, 300))
    with kernels.num_threads(2):
        with pytest.raises(RuntimeError, match="inside"):
            with overlap.session():
                assert get_num_threads() == 1
                gemm_unchecked(out, a, b, False, False, 1.0, 0.0, True)
                raise RuntimeError("inside")
        assert get_num_threads() == 2
        assert not overlap.deferring()
        np.testing.assert_allclose(out, a @ b, rtol=1e-12, atol=1e-9)  # it ran


def test_an_error_on_the_lane_is_raised_at_the_next_wait():
    # Check that a GEMM that fails on the lane (a dtype with no Fortran GEMM) raises at the
    # fence, and that the lane runs the next session's GEMMs.
    bad = np.zeros((4, 4), np.float16)
    with kernels.num_threads(2):
        with pytest.raises(KeyError):
            with overlap.session():
                overlap.submit(bad, bad, bad, False, False, 1.0, 0.0)
        rng = np.random.default_rng(3)
        a, b, c = _operands(rng, 20, 30, 40, False, False, np.float32)
        with overlap.session():
            gemm_unchecked(c, a, b, False, False, 1.0, 0.0, True)
        np.testing.assert_allclose(c, a @ b, rtol=1e-5, atol=1e-5)


def test_fixed_splits_run_inline_during_a_session():
    # Check that inside a session a fixed split (kernels.parallel.split) runs every slice on
    # the calling thread (a pool thread would wait for the lane's core), the rows all covered,
    # and hands off to the pool again after it.
    import threading

    from kernels import parallel

    def names():
        seen = []
        parallel.split(lambda i, j, s: seen.append((threading.current_thread().name, i, j)),
                       10, k=2)
        return seen
    with kernels.num_threads(2):
        with overlap.session():
            inside = names()
        after = names()
    me = threading.current_thread().name
    assert inside == [(me, 0, 10)]
    assert sorted((i, j) for _, i, j in after) == [(0, 5), (5, 10)]
    assert any(n != me for n, _, _ in after)


def test_only_the_thread_that_opened_the_session_defers():
    # Check that another thread's GEMMs inside a session run at once (its writes and waits
    # know nothing of the lane), and the session's own thread defers.
    import threading
    seen = []
    with kernels.num_threads(2), overlap.session():
        t = threading.Thread(target=lambda: seen.append(overlap.deferring()))
        t.start()
        t.join()
        assert overlap.deferring()
    assert seen == [False]


def test_a_forked_child_gets_a_lane_of_its_own():
    # Check that a child forked after the lane started (which has no lane thread) runs a
    # session's queued GEMMs on a new one instead of waiting forever.
    import os
    import signal
    import time
    rng = np.random.default_rng(4)
    a, b, _ = _operands(rng, 64, 48, 32, False, False, np.float64)
    with kernels.num_threads(2), overlap.session():
        gemm_unchecked(np.empty((64, 48)), a, b, False, False, 1.0, 0.0, True)
    pid = os.fork()
    if pid == 0:  # the child: exit status 0 when the queued GEMM ran right
        ok = False
        try:
            out = np.zeros((64, 48))
            with kernels.num_threads(2), overlap.session():
                gemm_unchecked(out, a, b, False, False, 1.0, 0.0, True)
            ok = np.allclose(out, a @ b, rtol=1e-12, atol=1e-12)
        finally:
            os._exit(0 if ok else 1)
    deadline = time.time() + 30
    while time.time() < deadline:
        done, status = os.waitpid(pid, os.WNOHANG)
        if done:
            break
        time.sleep(0.01)
    else:
        os.kill(pid, signal.SIGKILL)
        os.waitpid(pid, 0)
        pytest.fail("the child's session never finished (no lane thread after fork)")
    assert os.WIFEXITED(status) and os.WEXITSTATUS(status) == 0

"""The GEMM floor runs at its fastest: with the engine's one-thread rule for small GEMMs or
without it, whichever was faster (bench/floors.py). Timing is faked: the choice is tested,
not the machine."""
import importlib

import numpy as np
import pytest

from bench import floors
from kernels import ops

kgemm = importlib.import_module("kernels.gemm")


def _fake_run(calls, cost):
    """A replay-like callable whose duration (on the fake clock) is ``cost[rule value]``."""
    clock = {"t": 0.0}
    seen = []

    def run():
        seen.append(kgemm.ONE_THREAD_DIM)
        clock["t"] += cost[kgemm.ONE_THREAD_DIM]
    run.calls, run.restore = calls, (lambda: None)
    return run, clock, seen


@pytest.mark.parametrize("faster", ["rule", "no rule"])
def test_the_floor_takes_the_faster_of_the_rule_and_no_rule(monkeypatch, faster):
    rule = kgemm.ONE_THREAD_DIM
    small = [(np.zeros((8, 20), np.float32), np.zeros((8, 30), np.float32),
              np.zeros((30, 20), np.float32))]
    cost = {rule: 1.0, 0: 2.0} if faster == "rule" else {rule: 2.0, 0: 1.0}
    run, clock, seen = _fake_run(small, cost)
    monkeypatch.setattr(floors.time, "perf_counter", lambda: clock["t"])
    floor = floors.fastest_threads(run, rounds=3)
    assert set(seen) == {rule, 0}                       # both were tried
    want = rule if faster == "rule" else 0
    assert floor.one_thread_dim == want
    seen.clear()
    floor()
    assert seen == [want] and kgemm.ONE_THREAD_DIM == rule  # set for the call, then restored


def test_a_floor_with_no_small_gemm_is_not_timed_twice(monkeypatch):
    rule = kgemm.ONE_THREAD_DIM
    big = [(np.zeros((64, 64), np.float32), np.zeros((64, 64), np.float32),
            np.zeros((64, 64), np.float32))]
    run, clock, seen = _fake_run(big, {rule: 1.0, 0: 1.0})
    floor = floors.fastest_threads(run)
    assert seen == [] and floor.one_thread_dim == rule


def test_a_real_replay_keeps_its_results():
    # The replayed floor computes the same GEMM, whichever choice it made.
    rng = np.random.default_rng(0)
    a = rng.standard_normal((8, 200)).astype(np.float32)
    b = rng.standard_normal((200, 64)).astype(np.float32)
    out = np.empty((8, 64), np.float32)
    floor = floors.replay_fn(lambda: ops.gemm(out, a, b))
    out[:] = 0
    floor()
    np.testing.assert_allclose(out, a @ b, rtol=1e-5, atol=1e-5)
    assert kgemm.ONE_THREAD_DIM == 16 and floor.one_thread_dim in (16, 0)

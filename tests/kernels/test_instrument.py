"""kernels.instrument.record: records (and times) the calls made through kernels.ops."""
import threading
import time

import numpy as np
import pytest

from kernels import instrument, ops


def _originals():
    return {n: getattr(ops, n) for n in ops.NAMES}


def _operands(seed=0):
    rng = np.random.default_rng(seed)
    return rng.standard_normal((6, 4)), rng.standard_normal((4, 5)), rng.standard_normal((6, 5))


def test_records_names_and_args_in_call_order():
    # Check that calls are listed in the order made, with the very argument objects passed.
    a, b, c = _operands()
    out, s = np.empty((6, 5)), np.empty((6, 5))
    with instrument.record() as rec:
        ops.gemm(out, a, b, False, False, 1.0, 0.0)
        ops.add(s, out, c)
        ops.gemm(out, a, b, False, False, 2.0, 1.0)
    assert rec.names() == ["gemm", "add", "gemm"]
    assert all(x is y for x, y in zip(rec.calls[1].args, (s, out, c)))
    assert rec.calls[2].args[5:] == (2.0, 1.0, False)  # defer left at its default
    assert rec.counts() == {"gemm": 2, "add": 1}
    assert [c.name for c in rec.of("gemm")] == ["gemm", "gemm"]


def test_records_only_the_names_asked_for():
    # Check that with names=("gemm",) other kernels run but are not recorded.
    a, b, c = _operands()
    out, s = np.empty((6, 5)), np.empty((6, 5))
    with instrument.record(names=("gemm",)) as rec:
        ops.gemm(out, a, b, False, False, 1.0, 0.0)
        ops.add(s, out, c)
    assert rec.names() == ["gemm"]
    np.testing.assert_allclose(s, a @ b + c)


def test_recorded_gemm_args_replay_the_call():
    # Check that ops.gemm(*call.args) after the block recomputes exactly what the call wrote,
    # also when the call passed keywords or left options at their defaults.
    a, b, c = _operands(1)
    out1, out2 = c.copy(), np.empty((6, 5))
    with instrument.record() as rec:
        ops.gemm(out1, a, b, alpha=0.5, beta=1.0)
        ops.gemm(out2, a, b)
    first, second = rec.of("gemm")
    assert len(first.args) == len(second.args) == 8
    assert first.args[3:] == (False, False, 0.5, 1.0, False)
    expected1, expected2 = out1.copy(), out2.copy()
    out1[...] = c
    out2.fill(np.nan)
    for call in rec.of("gemm"):
        ops.gemm(*call.args)
    np.testing.assert_array_equal(out1, expected1)
    np.testing.assert_array_equal(out2, expected2)
    np.testing.assert_allclose(expected1, 0.5 * (a @ b) + c, rtol=1e-12)


def test_untimed_calls_have_zero_seconds():
    # Check that without timed=True no time is attributed.
    a, b, _ = _operands()
    with instrument.record() as rec:
        ops.gemm(np.empty((6, 5)), a, b, False, False, 1.0, 0.0)
    assert rec.seconds() == {"gemm": 0.0}


def test_timed_seconds_are_exclusive_and_within_the_block(monkeypatch):
    # Check that a recorded call made inside another recorded call is not counted twice:
    # the exclusive times are >= 0 and sum to no more than the block's wall time, although
    # the inner call (a sleep) takes most of the outer's time.
    def inner(out, a, b):
        time.sleep(0.02)
        return out

    def outer(y, b=None, res=None):
        ops.add(y, y, y)  # looked up at call time: the recorder
        return y

    monkeypatch.setattr(ops, "add", inner)
    monkeypatch.setattr(ops, "fill_rows", outer)
    y = np.zeros((2, 2))
    t0 = time.perf_counter()
    with instrument.record(timed=True) as rec:
        ops.fill_rows(y)
        ops.add(y, y, y)
    wall = time.perf_counter() - t0
    assert rec.names() == ["add", "fill_rows", "add"]  # inner finishes first
    assert all(c.seconds >= 0.0 for c in rec.calls)
    assert sum(c.seconds for c in rec.calls) <= wall
    totals = rec.seconds()
    assert totals["add"] + totals["fill_rows"] == pytest.approx(sum(c.seconds for c in rec.calls))


def test_entries_are_restored_after_the_block():
    # Check that every ops entry is the original function again after a normal exit.
    before = _originals()
    with instrument.record():
        assert all(getattr(ops, n) is not before[n] for n in ops.NAMES)
    assert _originals() == before


def test_entries_are_restored_after_an_exception():
    # Check that an exception inside the block propagates and leaves the entries restored,
    # and that recording works again afterwards.
    before = _originals()
    with pytest.raises(KeyError, match="inside"):
        with instrument.record():
            raise KeyError("inside")
    assert _originals() == before
    with instrument.record() as rec:
        ops.add(np.empty(3), np.ones(3), np.ones(3))
    assert rec.names() == ["add"]


def test_nested_record_raises_and_changes_nothing():
    # Check that a nested record raises RuntimeError, the outer one keeps recording and the
    # entries are restored at the end.
    before = _originals()
    with instrument.record() as rec:
        with pytest.raises(RuntimeError, match="already recording"):
            with instrument.record():
                pass
        ops.add(np.empty(3), np.ones(3), np.ones(3))
    assert rec.names() == ["add"]
    assert _originals() == before


def test_calls_from_other_threads_pass_through_unrecorded():
    # Check that a call made by another thread inside the block runs but is not recorded.
    out = np.zeros(3)
    with instrument.record() as rec:
        t = threading.Thread(target=ops.add, args=(out, np.ones(3), np.ones(3)))
        t.start()
        t.join()
    assert rec.calls == []
    np.testing.assert_array_equal(out, 2.0)


@pytest.mark.parametrize("names", [("gemm", "no_such_kernel"), "no_such_kernel"])
def test_unknown_names_raise_value_error_and_change_nothing(names):
    # Check that an unknown name is reported (naming it) before anything is replaced.
    before = _originals()
    with pytest.raises(ValueError, match="no_such_kernel"):
        with instrument.record(names=names):
            pass
    assert _originals() == before
    with instrument.record("gemm") as rec:  # not left in the recording state
        pass
    assert rec.calls == []


def test_replay_repeats_the_recorded_calls_and_restore_puts_outputs_back():
    # Check that replay runs the recorded gemm calls again on the same arrays (an
    # accumulating call adds its product once more per replay), that restore() puts back
    # what the recorded calls left, and that a function without such calls is refused.
    from kernels.instrument import replay
    rng = np.random.default_rng(3)
    a = rng.standard_normal((4, 3))
    b = rng.standard_normal((3, 5))
    acc = np.zeros((4, 5))
    run = replay(lambda: ops.gemm(acc, a, b, False, False, 1.0, 1.0))
    np.testing.assert_allclose(acc, a @ b, rtol=1e-12)
    assert len(run.calls) == 1
    run()
    np.testing.assert_allclose(acc, 2 * (a @ b), rtol=1e-12)
    run.restore()
    np.testing.assert_allclose(acc, a @ b, rtol=1e-12)
    with pytest.raises(RuntimeError, match="no call"):
        replay(lambda: None)

"""Ctrl-C: an optimizer step is applied whole or not at all, and fit stops cleanly with the
History so far. A SIGINT is raised at every point of the call in turn (at each event of a
profile hook: every Python and C function call and return), so no window is missed."""
import functools
import gc
import signal
import sys
import threading

import numpy as np
import pytest

import kernels
from engine import MLP, SGD, AdamW, CrossEntropyLoss, Module, NonFiniteLossError, fit
from engine.optim import defer_keyboard_interrupt
from engine.training.history import TrainingInterrupted


@pytest.fixture(autouse=True)
def one_thread():
    with kernels.num_threads(1):
        yield


@pytest.fixture(autouse=True)
def sigint_raises():
    # A shell without job control starts a background job (`make test &`) with SIGINT ignored,
    # which Python then keeps: these tests need its KeyboardInterrupt handler
    old = signal.signal(signal.SIGINT, signal.default_int_handler)
    yield
    signal.signal(signal.SIGINT, old)


def _interrupt_at(k, fn):
    """Run ``fn()`` with a SIGINT raised at its k-th profile event (none if it has fewer).
    Returns ``(the KeyboardInterrupt raised or None, the number of events seen)``."""
    state = {"n": 0, "done": False}

    def hook(frame, event, arg):
        if state["done"]:
            return
        state["n"] += 1
        if state["n"] == k:
            signal.raise_signal(signal.SIGINT)

    # No cyclic collection during fn: a SIGINT raised inside a finalizer (a Workspace's
    # __del__ run by the collector in the middle of fn) is swallowed by Python. (A full
    # gc.collect() before each run would do the same at ~50 ms each once numba is loaded.)
    was_enabled = gc.isenabled()
    gc.disable()
    sys.setprofile(hook)
    try:
        try:
            fn()
        finally:
            state["done"] = True
            sys.setprofile(None)
            if was_enabled:
                gc.enable()
    except KeyboardInterrupt as e:
        return e, state["n"]
    return None, state["n"]


# ----------------------------------------------------------------------------- optimizer.step
def _model_with_grads(make_opt):
    m = MLP([3, 5, 2], dtype=np.float64, rng=0)
    opt = make_opt(m.parameters())
    for i, p in enumerate(m.parameters()):
        p.grad[...] = np.linspace(-1.0, 1.0, p.size).reshape(p.shape) + i
    return m, opt


def _state(m, opt):
    sd = opt.state_dict()
    return ([p.data.copy() for p in m.parameters()], [p.grad.copy() for p in m.parameters()],
            {i: {k: v.copy() for k, v in st.items()} for i, st in sd["state"].items()},
            sd["steps"])


def _same(a, b) -> bool:
    return (all(np.array_equal(x, y) for x, y in zip(a[0], b[0]))
            and all(np.array_equal(x, y) for x, y in zip(a[1], b[1]))
            and a[2].keys() == b[2].keys()
            and all(a[2][i].keys() == b[2][i].keys() and
                    all(np.array_equal(a[2][i][k], b[2][i][k]) for k in a[2][i]) for i in a[2])
            and a[3] == b[3])


OPTIMIZERS = {
    "adamw": (lambda ps: AdamW(ps, lr=0.1), {}),
    "adamw zero_grad": (lambda ps: AdamW(ps, lr=0.1), {"zero_grad": True}),
    "sgd momentum": (lambda ps: SGD(ps, lr=0.1, momentum=0.9, weight_decay=0.01), {}),
}


@pytest.mark.parametrize("name", list(OPTIMIZERS))
def test_ctrl_c_anywhere_in_a_step_applies_it_whole_or_not_at_all(name):
    # Check that for a SIGINT at every event of step(): KeyboardInterrupt is raised (never
    # lost), and parameters, gradients, moments and the step count are all either as before
    # the step or as after an uninterrupted one (never part of the elements updated).
    make, kwargs = OPTIMIZERS[name]
    m, opt = _model_with_grads(make)
    before = _state(m, opt)
    opt.step(**kwargs)
    after = _state(m, opt)
    # Every k until k passes the events of its own run: a step that (re)allocates scratch
    # has more events than one that reuses it, so no one run's count holds for the others.
    k = 0
    while True:
        k += 1
        m, opt = _model_with_grads(make)
        raised, events = _interrupt_at(k, lambda: opt.step(**kwargs))
        if events < k:  # no SIGINT was raised: past the end of the step
            break
        assert raised is not None, f"the SIGINT at event {k} of {events} was lost"
        now = _state(m, opt)
        assert _same(now, before) or _same(now, after), f"mixed state after a SIGINT at event {k}"
    assert k > 20


def test_a_sigint_during_a_step_reaches_the_callers_own_handler_once():
    # Check that a handler installed by the caller is back in place after a step, and that
    # a SIGINT arriving during the step reaches it once, after the update.
    calls = []
    m, opt = _model_with_grads(OPTIMIZERS["adamw"][0])
    w0 = m.parameters()[0].data.copy()

    def handler(signum, frame):
        calls.append(np.array_equal(m.parameters()[0].data, w0))

    old = signal.signal(signal.SIGINT, handler)
    try:
        _, fresh = _model_with_grads(OPTIMIZERS["adamw"][0])
        _, events = _interrupt_at(0, fresh.step)
        _interrupt_at(events // 2, opt.step)
        assert signal.getsignal(signal.SIGINT) is handler
    finally:
        signal.signal(signal.SIGINT, old)
    assert calls == [False]  # called once, when the parameters had been updated
    assert opt.steps == 1


def test_deferring_does_nothing_off_the_main_thread():
    # Check that a step on another thread (where Python cannot set signal handlers) runs
    # normally and leaves the main thread's SIGINT handler alone.
    m, opt = _model_with_grads(OPTIMIZERS["adamw"][0])
    handler = signal.getsignal(signal.SIGINT)
    errors = []

    def run():
        try:
            with defer_keyboard_interrupt():
                opt.step()
        except BaseException as e:  # noqa: BLE001 - any error is a failure of the test
            errors.append(e)

    t = threading.Thread(target=run)
    t.start()
    t.join(30)
    assert errors == [] and opt.steps == 1
    assert signal.getsignal(signal.SIGINT) is handler


def test_counting_block_counts_sigints_and_steps_run_unheld_inside_it():
    # Check that inside count_keyboard_interrupts a SIGINT (also one during an optimizer
    # step) raises nothing and is counted once, and that the caller's handler is back after.
    from engine.optim.interrupt import count_keyboard_interrupts
    m, opt = _model_with_grads(OPTIMIZERS["adamw"][0])
    handler = signal.getsignal(signal.SIGINT)
    with count_keyboard_interrupts() as got:
        signal.raise_signal(signal.SIGINT)
        _, events = _interrupt_at(0, _model_with_grads(OPTIMIZERS["adamw"][0])[1].step)
        raised, _ = _interrupt_at(events // 2, opt.step)
        assert raised is None and got.count == 2
    assert signal.getsignal(signal.SIGINT) is handler and opt.steps == 1


# ----------------------------------------------------------------------------- fit
def _fit_setup():
    rng = np.random.default_rng(0)
    X = rng.standard_normal((12, 3))
    y = (np.arange(12) % 2).astype(np.int64)
    m = MLP([3, 4, 2], dtype=np.float64, rng=0)
    return m, AdamW(m.parameters(), lr=0.05), X, y


def _run_fit(m, opt, X, y, epochs):
    """A fit call with nothing of the caller's around it (its first profile event is fit's
    own call, its last fit's return)."""
    return functools.partial(fit, m, CrossEntropyLoss(), opt, X, y, epochs=epochs, validation=(X, y),
                             progress=False)


def test_ctrl_c_anywhere_in_fit_stops_cleanly_with_the_history_so_far():
    # Check, for a SIGINT at events spread over a 3-epoch full-batch fit (one step per
    # epoch), that fit raises TrainingInterrupted (a KeyboardInterrupt) whose History holds
    # whole epochs only, and that the model and optimizer equal an uninterrupted fit of as
    # many steps as the History counts, with zero gradients and the model in training mode.
    # Only at fit's first and last few events (entering the frame before its first line,
    # returning) is a plain KeyboardInterrupt possible, with nothing or everything done.
    refs = []
    for steps in range(4):
        m, opt, X, y = _fit_setup()
        _run_fit(m, opt, X, y, steps)()
        refs.append(([p.data.copy() for p in m.parameters()], opt.state_dict()))
    m, opt, X, y = _fit_setup()
    _, events = _interrupt_at(0, _run_fit(m, opt, X, y, 3))
    assert events > 100
    ks = sorted(set(range(1, events + 1, max(1, events // 150))) | {1, 2, events - 1, events})
    for k in ks:
        m, opt, X, y = _fit_setup()
        raised, _ = _interrupt_at(k, _run_fit(m, opt, X, y, 3))
        assert isinstance(raised, KeyboardInterrupt), f"event {k}: {raised!r}"
        if isinstance(raised, TrainingInterrupted):
            h = raised.history
            n = h.steps
            assert len(h) in (n, n - 1)  # the step of an unrecorded epoch may be complete
            assert len(h.loss) == len(h.val_loss) == len(h.accuracy) == len(h.lr) == len(h)
            assert f"optimizer step {n}" in str(raised) or "before it started" in str(raised)
        else:
            assert k <= 5 or k > events - 10, f"event {k}: a plain KeyboardInterrupt in fit"
            n = 0 if k <= 5 else 3
        assert opt.steps == n and m.training
        params, sd = refs[n]
        for a, p in zip(params, m.parameters()):
            np.testing.assert_array_equal(a, p.data, err_msg=f"event {k}")
            assert not p.grad.any(), f"event {k}: gradients left after the interrupt"
        for i, st in sd["state"].items():
            for key, v in st.items():
                np.testing.assert_array_equal(v, opt.state_dict()["state"][i][key])


class _NaNAtThirdForward(Module):
    """Wraps a model; its third forward sees a NaN (as an overflow inside a model would)."""

    def __init__(self, inner):
        super().__init__(np.float64)
        self.inner, self.calls = inner, 0

    def forward(self, x):
        self.calls += 1
        if self.calls == 3:
            x = x.copy()
            x[0, 0] = np.nan
        return self.inner.forward(x)

    def backward(self, dy):
        return self.inner.backward(dy)


def test_non_finite_loss_error_carries_the_history_so_far():
    # Check that a NaN loss in epoch 3 (full batch: one forward per epoch) leaves the two
    # completed epochs on the error's History.
    m, opt, X, y = _fit_setup()
    with pytest.raises(NonFiniteLossError) as err:
        fit(_NaNAtThirdForward(m), CrossEntropyLoss(), opt, X, y, epochs=10, progress=False)
    assert err.value.epoch == 3 and opt.steps == 2
    h = err.value.history
    assert len(h) == 2 and h.steps == 2 and len(h.accuracy) == 2

"""One model is used by one thread at a time: a concurrent call raises, separate models
in separate threads work."""
import threading

import numpy as np
import pytest

from engine import FFN, MLP, Module


class _Slow(Module):
    """An identity layer whose forward waits for an event (to overlap two calls)."""

    def __init__(self):
        super().__init__(np.float64)
        self.inside = threading.Event()
        self.go = threading.Event()

    def _forward(self, x2, res2):
        self.inside.set()
        self.go.wait(10)
        return x2

    def _backward(self, dy2, acc2):
        return dy2


def test_concurrent_forward_on_one_module_raises():
    # Check that a forward from a second thread while the first is inside the module raises
    # RuntimeError naming the module, and the first call completes normally.
    m = _Slow()
    x = np.ones((2, 3))
    out = {}
    t = threading.Thread(target=lambda: out.setdefault("y", m.forward(x)))
    t.start()
    assert m.inside.wait(10)
    try:
        with pytest.raises(RuntimeError, match="_Slow.forward: this module is in use"):
            m.forward(x)
        with pytest.raises(RuntimeError, match="in use by another thread"):
            m.backward(x)
    finally:
        m.go.set()
        t.join(10)
    assert out["y"] is x
    np.testing.assert_array_equal(m.backward(np.ones((2, 3))), np.ones((2, 3)))


def test_separate_models_in_separate_threads_agree_with_serial_runs():
    # Check that two models (same seed) trained forward/backward in two threads at once give
    # the same gradients as one of them run alone.
    x = np.random.default_rng(0).standard_normal((64, 16))
    dy = np.random.default_rng(1).standard_normal((64, 16))
    models = [FFN(16, 32, "gelu", dtype=np.float64, rng=3) for _ in range(3)]

    def work(m):
        for _ in range(20):
            m.forward(x)
            m.backward(dy)
    threads = [threading.Thread(target=work, args=(m,)) for m in models[:2]]
    for t in threads:
        t.start()
    for t in threads:
        t.join(30)
    work(models[2])
    for a, b in zip(models[0].parameters(), models[2].parameters()):
        np.testing.assert_allclose(a.grad, b.grad, rtol=1e-12)
    for a, b in zip(models[1].parameters(), models[2].parameters()):
        np.testing.assert_allclose(a.grad, b.grad, rtol=1e-12)


def test_guard_is_reentrant_for_the_same_thread():
    # Check that a composite calling its children, and a subclass calling super().forward,
    # is not mistaken for concurrent use.
    m = MLP([4, 5, 3], dtype=np.float64, rng=0)

    class Twice(type(m)):
        def forward(self, x, *, residual=None):
            return super().forward(x, residual=residual)
    t = Twice([4, 5, 3], dtype=np.float64, rng=0)
    x = np.ones((2, 4))
    np.testing.assert_array_equal(t(x), m(x))

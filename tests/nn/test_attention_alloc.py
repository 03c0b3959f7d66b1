"""Zero allocation for attention: after three warm-up steps, a training step (forward, loss,
backward, AdamW, zero_grad) of MultiHeadAttention, a TransformerBlock and a GPT allocates no
NumPy array larger than 1 KiB (tracemalloc, measured as test_step_alloc does: the rise of the
traced peak at two sizes, every dimension doubled, whose difference exposes any array that
grows with the problem)."""
import gc
import tracemalloc

import numpy as np
import pytest

LIMIT = 1024            # bytes: the two sizes' rises may differ by this much
PY_OBJECTS = 12 * 1024  # views, bound methods, per-head tuples: the same at both sizes


def _mha(k):
    from engine.nn.attention import MultiHeadAttention
    from engine.nn.losses import MSELoss
    rng = np.random.default_rng(0)
    m = MultiHeadAttention(32 * k, 4, rng=0)
    x = rng.standard_normal((2 * k, 16 * k, 32 * k)).astype(np.float32)
    return m, x, rng.standard_normal(x.shape).astype(np.float32), MSELoss()


def _block(dropout):
    def make(k):
        from engine.nn.losses import MSELoss
        from engine.nn.transformer import TransformerBlock
        rng = np.random.default_rng(0)
        m = TransformerBlock(32 * k, 4, 64 * k, dropout=dropout, rng=0)
        x = rng.standard_normal((2 * k, 16 * k, 32 * k)).astype(np.float32)
        return m, x, rng.standard_normal(x.shape).astype(np.float32), MSELoss()
    return make


def _gpt(k):
    from engine.models.gpt import GPT
    from engine.nn.losses import CrossEntropyLoss
    rng = np.random.default_rng(0)
    m = GPT(40 * k, 16 * k, 2, 4, 32 * k, rng=0)
    ids = rng.integers(0, 40 * k, (2 * k, 16 * k))
    return m, ids, rng.integers(0, 40 * k, (2 * k, 16 * k)), CrossEntropyLoss()


MAKERS = {"MultiHeadAttention": _mha, "TransformerBlock": _block(0.0),
          "TransformerBlock-dropout": _block(0.1), "GPT-tied": _gpt}


def _rise(make, k, threads=1):
    from engine.optim import AdamW
    from kernels import num_threads
    with num_threads(threads):
        m, x, target, loss = make(k)
        opt = AdamW(m.parameters(), lr=1e-3)

        def step():
            loss.forward(m.forward(x), target)
            m.backward(loss.backward())
            opt.step()
            m.zero_grad()
        for _ in range(3):
            step()
        gc.collect()
        tracemalloc.start()
        try:
            start = tracemalloc.get_traced_memory()[0]
            tracemalloc.reset_peak()
            step()
            return tracemalloc.get_traced_memory()[1] - start
        finally:
            tracemalloc.stop()


@pytest.mark.parametrize("name", list(MAKERS))
def test_steady_step_allocates_nothing(name):
    # Check that a steady step allocates no array: the rise is the same at both sizes (up to
    # 1 KiB) and small (Python objects only).
    r1, r2 = _rise(MAKERS[name], 1), _rise(MAKERS[name], 2)
    assert r2 - r1 <= LIMIT, f"{name}: rises {r1} and {r2} bytes: arrays allocated in a step"
    assert r1 <= PY_OBJECTS, f"{name}: a step raised traced memory by {r1} bytes"


def test_steady_gpt_step_at_two_threads_allocates_nothing():
    # Check the same at 2 threads, where the backward queues its weight-gradient GEMMs on a
    # lane thread (kernels.overlap) and two gradients go to buffers of the lane's. The two
    # threads' transient objects (ctypes calls) overlap or not as their timing falls, by up
    # to ~1 KB: the least of three steps at each size.
    r1 = min(_rise(_gpt, 1, 2) for _ in range(3))
    r2 = min(_rise(_gpt, 2, 2) for _ in range(3))
    assert r2 - r1 <= LIMIT, f"rises {r1} and {r2} bytes: arrays allocated in a step"
    assert r1 <= PY_OBJECTS + 4 * 1024, f"a step raised traced memory by {r1} bytes"

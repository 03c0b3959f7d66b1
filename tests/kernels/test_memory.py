"""kernels.memory (aligned_empty, per-thread scratch, shared read-only ones and constants)
and the engine's 64-byte-aligned work buffers."""
import threading

import numpy as np
import pytest

from kernels import memory

from engine.nn.blocks import FFN
from engine.nn.containers import MLP
from engine.nn.module import Workspace
from kernels.memory import ALIGN, aligned_empty


@pytest.mark.parametrize("dtype", [np.float32, np.float64, np.bool_, np.uint32])
@pytest.mark.parametrize("shape", [0, 1, 7, (3, 5), (2, 3, 4), (1000,)])
def test_aligned_empty_has_the_shape_dtype_and_alignment(shape, dtype):
    # Check that the buffer has the asked shape and dtype, is C-contiguous and starts on 64 bytes.
    a = aligned_empty(shape, dtype)
    assert a.shape == ((shape,) if isinstance(shape, int) else shape)
    assert a.dtype == np.dtype(dtype)
    assert a.flags.c_contiguous
    if a.size:  # a zero-size array has no data to align (NumPy keeps the base's pointer)
        assert a.ctypes.data % ALIGN == 0


def test_aligned_empty_buffers_are_distinct_and_writable():
    # Check that two buffers never overlap and can be written in full.
    a, b = aligned_empty((64, 33), np.float32), aligned_empty((64, 33), np.float32)
    a.fill(1.0)
    b.fill(2.0)
    assert not np.shares_memory(a, b)
    assert (a == 1.0).all() and (b == 2.0).all()


@pytest.mark.parametrize("dtype", [np.float32, np.float64, np.bool_, np.intp])
@pytest.mark.parametrize("shape", [1, 7, (3, 5), [2, 3], (1000,)])
def test_scratch_has_the_shape_dtype_and_alignment(shape, dtype):
    # Check that scratch views are C-contiguous, of the asked shape and dtype, on 64 bytes.
    a = memory.scratch("test.shape", shape, dtype)
    assert a.shape == ((shape,) if isinstance(shape, int) else tuple(shape))
    assert a.dtype == np.dtype(dtype) and a.flags.c_contiguous
    assert a.ctypes.data % ALIGN == 0


def test_scratch_reuses_its_memory_and_grows():
    # Check that a repeated request gives the same memory, a larger one a larger buffer that
    # later smaller requests reuse, and that a grown key forgets views of its old buffer.
    a = memory.scratch("test.grow", (4, 5), np.float32)
    assert memory.scratch("test.grow", (4, 5), np.float32) is a
    assert memory.scratch("test.grow", 7, np.float32).ctypes.data == a.ctypes.data
    big = memory.scratch("test.grow", 10_000, np.float32)
    small = memory.scratch("test.grow", (4, 5), np.float32)
    assert np.shares_memory(small, big) and not np.shares_memory(small, a)


def test_scratch_keys_and_dtypes_are_separate_buffers():
    # Check that two keys (also per-slot tuple keys) and two dtypes of one key never overlap.
    bufs = [memory.scratch("test.k1", 100, np.float32), memory.scratch("test.k2", 100, np.float32),
            memory.scratch(("test.k1", 1), 100, np.float32),
            memory.scratch("test.k1", 100, np.float64)]
    for i in range(len(bufs)):
        for j in range(i):
            assert not np.shares_memory(bufs[i], bufs[j]), (i, j)


def test_scratch_is_per_thread():
    # Check that another thread gets its own buffer for the same key.
    mine = memory.scratch("test.thread", 64, np.float32)
    theirs = []
    t = threading.Thread(target=lambda: theirs.append(memory.scratch("test.thread", 64,
                                                                     np.float32)))
    t.start()
    t.join()
    assert not np.shares_memory(mine, theirs[0])


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_ones_are_read_only_ones_that_survive_growth(dtype):
    # Check that ones() holds n ones of the dtype, cannot be written, and that a view taken
    # before the shared buffer grows still holds ones.
    a = memory.ones(5, dtype)
    assert a.shape == (5,) and a.dtype == np.dtype(dtype) and (a == 1).all()
    with pytest.raises(ValueError):
        a[0] = 2.0
    b = memory.ones(100_003, dtype)
    assert b.size == 100_003 and (b == 1).all() and (a == 1).all()
    assert memory.ones(0, dtype).size == 0


def test_constant_is_built_once_and_read_only():
    # Check that make() runs once per key and that the array cannot be written.
    made = []

    def make():
        made.append(1)
        return np.arange(4)
    a = memory.constant(("test.constant", 4), make)
    assert memory.constant(("test.constant", 4), make) is a
    assert made == [1]
    np.testing.assert_array_equal(a, [0, 1, 2, 3])
    with pytest.raises(ValueError):
        a[0] = 9


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_workspace_buffers_start_on_a_cache_line(dtype):
    # Check that Workspace hands out 64-byte-aligned buffers, also after growing.
    ws = Workspace(dtype)
    for n in (3, 5, 100):
        buf = ws.get("h", n, 7)
        assert buf.shape == (n, 7) and buf.ctypes.data % ALIGN == 0
    assert ws.get("v", 9).ctypes.data % ALIGN == 0


def test_block_and_layer_outputs_are_aligned():
    # Check that the outputs of a block and of an MLP (work buffers) start on a cache line.
    rng = np.random.default_rng(0)
    ffn = FFN(8, 16, "gelu", rng=0)
    x = rng.standard_normal((5, 8)).astype(np.float32)
    y = ffn.forward(x)
    dx = ffn.backward(np.ones_like(y))
    mlp = MLP([8, 6, 3], ["relu", None], rng=0)
    out = mlp.forward(x)
    assert all(a.ctypes.data % ALIGN == 0 for a in (y, dx, out))


# ----------------------------------------------------------------------------- kernels on two threads
def _layernorm_case(rng, monkeypatch):
    from kernels import layernorm as ln
    d = 264
    n = 3 * ((4 << 20) // (d * 4)) + 5

    def problem():
        return (rng.standard_normal((n, d)).astype(np.float32),
                rng.standard_normal(d).astype(np.float32), rng.standard_normal(d).astype(np.float32),
                rng.standard_normal((n, d)).astype(np.float32))

    def run(x, gamma, beta, dout):
        out, mean, rstd = np.empty_like(x), np.empty(n, np.float32), np.empty(n, np.float32)
        dx, dg, db = np.empty_like(x), np.zeros(d, np.float32), np.zeros(d, np.float32)
        ln.layernorm_forward(out, mean, rstd, x, gamma, beta)
        ln.layernorm_backward(dx, dg, db, dout, x, mean, rstd, gamma)
        return dict(out=out, mean=mean, rstd=rstd, dx=dx, dgamma=dg, dbeta=db)
    return problem, run


def _losses_case(rng, monkeypatch):
    from kernels import losses
    c = 136
    n = 3 * ((4 << 20) // (c * 4)) + 5

    def problem():
        y = rng.random((n, c))
        return ((3 * rng.standard_normal((n, c))).astype(np.float32), rng.integers(0, c, size=n),
                (y / y.sum(axis=1, keepdims=True)).astype(np.float32))

    def run(logits, labels, y):
        p1, p2, d1, d2 = (np.empty_like(logits) for _ in range(4))
        l1 = losses.softmax_cross_entropy_forward(p1, logits, labels)
        losses.softmax_cross_entropy_backward(d1, p1, labels)
        l2 = losses.softmax_cross_entropy_forward(p2, logits, y)
        losses.softmax_cross_entropy_backward(d2, p2, y)
        # Loss values are sums of numpy dots, which numpy's OpenBLAS may thread differently
        # when two threads call it at once: compared to float32 rounding, the arrays exactly.
        return {"loss (labels)": l1, "loss (probabilities)": l2,
                "mse": losses.mse_forward(logits, y), "probs (labels)": p1,
                "probs (probabilities)": p2, "dlogits (labels)": d1,
                "dlogits (probabilities)": d2}
    return problem, run


def _optim_dropout_case(rng, monkeypatch):
    from kernels import dropout_forward, optim
    n = 3 * (1 << 20) + 11

    def problem():
        return tuple(rng.random(n).astype(np.float32) for _ in range(5))

    def run(p, g, m, v, x):
        p, m, v = p.copy(), m.copy(), v.copy()
        optim.adamw_update(p, g, m, v, 3, 1e-2, zero_grad=False)
        buf = m.copy()
        optim.sgd_update(p, g, buf, 0.1, momentum=0.9, weight_decay=0.01)
        out, mask = np.empty_like(x), np.empty_like(x)
        dropout_forward(out, mask, x, 0.3, np.random.default_rng(5))
        return dict(param=p, exp_avg=m, exp_avg_sq=v, momentum_buf=buf, out=out, mask=mask)
    return problem, run


@pytest.mark.parametrize("case", [_layernorm_case, _losses_case, _optim_dropout_case],
                         ids=["layernorm", "losses", "optim+dropout"])
def test_kernels_called_from_two_threads_at_once_get_one_thread_results(case, monkeypatch):
    # Check that two threads running a kernel at the same time, each on its own arrays
    # (shapes alike, so shared scratch would collide), get exactly what each gets alone:
    # kernels.memory.scratch is per thread. Elementwise splitting is off (1 thread) so each
    # caller runs its kernels inline on its own scratch.
    from kernels import num_threads
    problem, run = case(np.random.default_rng(60), monkeypatch)
    problems = [problem(), problem()]
    together = [None, None]
    barrier = threading.Barrier(2)

    def worker(i):
        barrier.wait()
        for _ in range(4):
            together[i] = run(*problems[i])
    with num_threads(1):
        alone = [run(*pr) for pr in problems]
        threads = [threading.Thread(target=worker, args=(i,)) for i in range(2)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
    for a, b in zip(alone, together):
        for name in a:
            if isinstance(a[name], float):
                assert b[name] == pytest.approx(a[name], rel=1e-5), name
            else:
                np.testing.assert_array_equal(b[name], a[name], err_msg=name)


def test_bundle_is_built_once_per_thread_and_rebuilt_after_a_growth():
    # Check that bundle() reuses what make() built, that another thread builds its own, and
    # that a growing scratch buffer of this thread makes it build again (with the new view).
    made = []

    def make(n):
        made.append(threading.current_thread().name)
        return (memory.scratch("test.bundle", n, np.float32),)
    first = memory.bundle(("test.bundle", 8), make, 8)
    assert memory.bundle(("test.bundle", 8), make, 8) is first
    assert len(made) == 1
    t = threading.Thread(target=lambda: memory.bundle(("test.bundle", 8), make, 8))
    t.start()
    t.join()
    assert len(made) == 2
    memory.scratch("test.bundle", 1 << 20, np.float32)  # grows the buffer first's view is in
    again = memory.bundle(("test.bundle", 8), make, 8)
    assert len(made) == 3 and again is not first
    assert np.shares_memory(again[0], memory.scratch("test.bundle", 1 << 20, np.float32))

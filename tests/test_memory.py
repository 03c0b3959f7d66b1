"""kernels.memory (aligned_empty, per-thread scratch, shared read-only ones and constants)
and the engine's 64-byte-aligned work buffers."""
import threading

import numpy as np
import pytest

from kernels import memory

from engine.blocks import FFN
from engine.layers import MLP
from engine.module import Workspace
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

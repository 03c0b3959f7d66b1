"""kernels.memory.aligned_empty and the engine's 64-byte-aligned work buffers."""
import numpy as np
import pytest

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

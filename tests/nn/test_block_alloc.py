"""engine.nn.blocks: after three warm-up steps (forward + backward + zero_grad), forward + backward
allocate no array larger than 1 KiB (tracemalloc sees NumPy's data allocations and its ufunc
iterator buffers).

tracemalloc's peak is reset before the step; its rise above the level at the start bounds
every allocation of the step, transient ones included. Python objects (views, bound methods)
raise it too, so each block is measured at two sizes, every dimension doubled: the Python
objects are the same, every array grows, and the difference of the two rises exposes any
array of more than 1 KiB (a feature vector of 300 float32 is 1.2 KiB and doubles).
"""
import tracemalloc

import numpy as np
import pytest

from engine import FFN, GMLP, AddNorm, Dropout, FFNSublayer, LayerNorm
from kernels import num_threads

LIMIT = 1024          # bytes: no array larger than this may be allocated by a step
PY_OBJECTS = 8 * 1024  # bound on the short-lived Python objects of one step
N, D, F = 16, 300, 400  # base sizes, times k in {1, 2}

BLOCKS = {  # name -> (factory(dtype, k), d_in(k), d_out(k), takes_sub)
    "ffn_relu": (lambda dt, k: FFN(D * k, F * k, "relu", dtype=dt, rng=0), D, D, False),
    "ffn_gelu_nobias": (lambda dt, k: FFN(D * k, F * k, "gelu", bias=False, dtype=dt, rng=0),
                        D, D, False),
    "ffn_silu_dropout": (lambda dt, k: FFN(D * k, F * k, "silu", dropout=0.2, dtype=dt, rng=0),
                         D, D, False),
    "gmlp": (lambda dt, k: GMLP(D * k, 320 * k, F * k, 260 * k, dtype=dt, rng=0), D, 260, False),
    "layernorm": (lambda dt, k: LayerNorm(D * k, dtype=dt), D, D, False),
    "dropout": (lambda dt, k: Dropout(0.3, dtype=dt, rng=0), D, D, False),
    "addnorm": (lambda dt, k: AddNorm(D * k, dtype=dt), D, D, True),
    "addnorm_dropout": (lambda dt, k: AddNorm(D * k, dropout=0.1, dtype=dt, rng=0), D, D, True),
    "sub_post": (lambda dt, k: FFNSublayer(D * k, F * k, "gelu", dtype=dt, rng=0), D, D, False),
    "sub_pre": (lambda dt, k: FFNSublayer(D * k, F * k, "relu", norm="pre", dtype=dt, rng=0),
                D, D, False),
    "sub_post_dropout": (lambda dt, k: FFNSublayer(D * k, F * k, dropout=0.1, dtype=dt, rng=0),
                         D, D, False),
    "sub_pre_dropout": (lambda dt, k: FFNSublayer(D * k, F * k, "gelu", dropout=0.1, norm="pre",
                                                  dtype=dt, rng=0), D, D, False),
}


@pytest.fixture(autouse=True)
def _one_thread():
    # Allocation does not depend on threads; one BLAS thread keeps these tiny GEMMs from
    # waiting on a busy second core. The previous limit is restored on exit.
    with num_threads(1):
        yield


def _peak_rise(m, inputs, dy, steps=2):
    """Largest rise of tracemalloc's peak above the starting level during forward + backward,
    over `steps` steps after three warm-up steps (zero_grad runs between steps, outside the
    measured window: it touches no array but walks the parameter tree)."""
    for _ in range(3):  # warm-up: buffers, kernel scratch, ones vectors
        m.forward(*inputs)
        m.backward(dy)
        m.zero_grad()
    worst = 0
    tracemalloc.start()
    try:
        for _ in range(steps):
            base = tracemalloc.get_traced_memory()[0]
            tracemalloc.reset_peak()
            m.forward(*inputs)
            m.backward(dy)
            worst = max(worst, tracemalloc.get_traced_memory()[1] - base)
            m.zero_grad()
        return worst
    finally:
        tracemalloc.stop()


def _rises(make, d_in, d_out, takes_sub, dtype, lead):
    """Peak rises of one block at sizes k = 1 and k = 2 (rows and features doubled)."""
    rng = np.random.default_rng(0)
    out = []
    for k in (1, 2):
        shape = (lead[0] * k, *lead[1:])
        x = rng.standard_normal((*shape, d_in * k)).astype(dtype)
        dy = rng.standard_normal((*shape, d_out * k)).astype(dtype)
        out.append(_peak_rise(make(dtype, k), (x, x.copy()) if takes_sub else (x,), dy))
    return out


@pytest.mark.parametrize("lead", [(N,), (2, N // 2)], ids=["2d", "3d"])
@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("name", list(BLOCKS))
def test_steady_step_allocates_no_array(name, dtype, lead):
    # Check that after warm-up forward + backward allocate nothing that grows with the sizes
    # (any array of a batch, hidden or feature size, NumPy iterator buffers included).
    r1, r2 = _rises(*BLOCKS[name], dtype, lead)
    assert r2 - r1 < LIMIT, f"{name}: doubling every size raised the step's peak {r1} -> {r2} bytes"
    assert r1 < PY_OBJECTS, f"{name}: a step raised the traced peak by {r1} bytes"


def test_batch_change_then_steady_is_allocation_free():
    # Check that after a large batch, a smaller batch (row slices of the same buffers) also
    # allocates nothing that depends on the sizes.
    rises = []
    for k in (1, 2):
        m = FFNSublayer(D * k, F * k, "gelu", dtype=np.float32, rng=0)
        big = np.random.default_rng(1).standard_normal((4 * N * k, D * k)).astype(np.float32)
        for _ in range(3):
            m(big)
            m.backward(big)
        small = big[:N * k].copy()
        rises.append(_peak_rise(m, (small,), small))
    assert rises[1] - rises[0] < LIMIT and rises[0] < PY_OBJECTS, rises


def test_detects_an_allocating_step():
    # Check that the measurement can fail: a block making one (N, D) temporary is caught.
    class Allocating(LayerNorm):
        def forward(self, x):
            return super().forward(x) + 0.0  # a new (N, D) array

    r1, r2 = _rises(lambda dt, k: Allocating(D * k, dtype=dt), D, D, False, np.float32, (N,))
    assert r2 - r1 >= 3 * N * D * 4  # 4x the elements at k = 2

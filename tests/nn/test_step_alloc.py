"""Zero allocation: after three warm-up steps, a training step allocates no NumPy array
larger than 1 KiB, for every block (tracemalloc; not a timing).

A step is forward, loss, backward, AdamW step, zero_grad. tracemalloc's peak is reset just
before the step; its rise above the memory traced at the start bounds every allocation of the
step, transient ones included (a temporary freed before the step ends still raised the peak).
Python objects count too, so each block is measured at two sizes (every dimension doubled):
the objects are the same, every array grows, and the difference of the rises exposes any
array of more than 1 KiB. Both sizes must take the same code paths, so the blocks run on
one thread, and again on two threads at sizes where every elementwise pass is split. A ufunc that casts (a comparison written into a float array, a
float times a bool array) allocates a buffer of up to 8192 elements per call; that is a hot
path allocation too, and is caught. When a step fails, the message gives the rise per phase.
"""
from __future__ import annotations

import gc
import tracemalloc

import numpy as np
import pytest

LIMIT = 1024  # bytes: no NumPy array larger than this may be allocated by a step
# Python objects a step creates and drops (bound methods, views, the list that
# Module.parameters() builds, floats) raise the traced peak by a few KiB; they are the same at
# both sizes. Anything growing with the problem is caught by the two-size difference instead.
PY_OBJECTS = 8 * 1024
# The GPT's step calls some 30 modules (embeddings, two blocks of six children, the head):
# ~10 KiB of such objects, the same at both sizes (its arrays are held by the two-size rule).
PY_OBJECTS_OF = {"GPT": 16 * 1024}


def _mse():
    from engine.nn.losses import MSELoss
    return MSELoss()


def _ce():
    from engine.nn.losses import CrossEntropyLoss
    return CrossEntropyLoss()


def _data(rng, n, d_in, d_out, labels=False):
    """(n // 16, 16, d_in) inputs (3-D: the (B, T, d) path) and a matching target."""
    lead = (n,) if labels else (n // 16, 16)
    x = rng.standard_normal((*lead, d_in)).astype(np.float32)
    if labels:
        t = rng.integers(0, d_out, size=n)
    else:
        t = rng.standard_normal((*lead, d_out)).astype(np.float32)
    return x, t


# Each maker builds (module, x, target, loss) at size factor k: every dimension, the row
# count included, is k times the base one. Base: 64 rows, d 32, d_ff 96: a (64, 32) float32
# array is 8 KiB.
def _ffn(act, dropout=0.0, n=64, d=32, f=96):
    def make(rng, k):
        from engine.nn.blocks import FFN
        m = FFN(d * k, f * k, activation=act, dropout=dropout, rng=0)
        return m, *_data(rng, n * k, d * k, d * k), _mse()
    return make


def _gmlp(rng, k):
    from engine.nn.channel_gated_mlp import GMLP
    return GMLP(32 * k, 48 * k, 64 * k, 24 * k, rng=0), *_data(rng, 64 * k, 32 * k, 24 * k), _mse()


def _sublayer(norm, dropout=0.0, n=64, d=32, f=96):
    def make(rng, k):
        from engine.nn.blocks import FFNSublayer
        m = FFNSublayer(d * k, f * k, activation="gelu", dropout=dropout, norm=norm, rng=0)
        return m, *_data(rng, n * k, d * k, d * k), _mse()
    return make


def _mlp(rng, k):
    from engine.nn.containers import MLP
    m = MLP([784 * k, 256 * k, 128 * k, 10 * k], ["relu", "relu", None], rng=0)
    return m, *_data(rng, 64 * k, 784 * k, 10 * k, labels=True), _ce()


def _sequential(rng, k):
    from engine.nn.layers import GELU, Linear
    from engine.nn.containers import Sequential
    m = Sequential(Linear(32 * k, 96 * k, rng=0), GELU(), Linear(96 * k, 32 * k, rng=1))
    return m, *_data(rng, 64 * k, 32 * k, 32 * k), _mse()


def _gpt(rng, k):
    # nanoGPT's layout at a small size: token ids in, next-token cross-entropy; the compiled
    # causal attention heads, the tied head.
    from engine.models.gpt import GPT
    vocab, t, b, d = 16 * k, 16 * k, 4 * k, 32 * k
    m = GPT(vocab, t, 2, 2, d, rng=0)
    ids = rng.integers(0, vocab, (b, t))
    return m, ids, rng.integers(0, vocab, (b, t)), _ce()


BLOCKS = {
    "FFN-relu": _ffn("relu"),
    "FFN-gelu": _ffn("gelu"),
    "FFN-gelu_tanh-dropout": _ffn("gelu_tanh", 0.1),
    "GMLP": _gmlp,
    "FFNSublayer-post": _sublayer("post"),
    "FFNSublayer-pre-dropout": _sublayer("pre", 0.1),
    "MLP-784-256-128-10": _mlp,
    "Sequential-Linear-GELU-Linear": _sequential,
    "GPT": _gpt,
}

# The elementwise kernels split arrays of >= 512 Ki elements over two threads
# (kernels.parallel), which adds the pool's Python objects (futures, closures) to a step.
# These sizes put every weight, activation and LayerNorm input over that line at both sizes,
# so both sizes take the same paths: 1024 rows, d 512, d_ff 1024.
# The pool's objects (futures, closures, per-thread state) vary by up to ~0.7 KiB from run
# to run and add ~4 KiB: looser bounds there. At these sizes the smallest array that grows
# with the problem, a per-row (1024,) float32 vector, still adds 4 KiB to the difference.
PARALLEL_LIMIT, PARALLEL_PY_OBJECTS = 2 * 1024, 16 * 1024
PARALLEL_BLOCKS = {
    "FFN-gelu": _ffn("gelu", n=1024, d=512, f=1024),
    "FFNSublayer-post": _sublayer("post", n=1024, d=512, f=1024),
}


def _phases(module, x, target, loss, opt):
    """The training step as five callables (the output and its gradient pass between them)."""
    box = {}

    def forward():
        box["y"] = module.forward(x)

    def loss_forward():
        loss.forward(box["y"], target)

    def backward():
        module.backward(loss.backward())

    return [("forward", forward), ("loss", loss_forward), ("backward", backward),
            ("adamw", opt.step), ("zero_grad", module.zero_grad)]


def _rise(fns) -> int:
    """Peak traced memory during ``fns`` above the traced memory before them (bytes)."""
    gc.collect()
    start = tracemalloc.get_traced_memory()[0]
    tracemalloc.reset_peak()
    for f in fns:
        f()
    return tracemalloc.get_traced_memory()[1] - start


def _step_rise(make, k, threads, per_phase=False):
    """(rise of a steady step, {phase: rise} or None) at size factor ``k`` and ``threads``
    threads; the rise of each phase alone only with ``per_phase``."""
    from kernels import num_threads
    with num_threads(threads):
        return _step_rise_here(make, k, per_phase)


def _step_rise_here(make, k, per_phase=False):
    from engine.optim import AdamW
    module, x, target, loss = make(np.random.default_rng(0), k)
    opt = AdamW(module.parameters(), lr=1e-3)
    phases = _phases(module, x, target, loss, opt)
    step = [f for _, f in phases]
    for _ in range(3):  # warm-up: buffers and moments are allocated here
        for f in step:
            f()
    tracemalloc.start()
    try:
        rise = _rise(step)
        phase_rises = {name: _rise([f]) for name, f in phases} if per_phase else None
    finally:
        tracemalloc.stop()
    return rise, phase_rises


def _check_two_sizes(name, make, threads, limit=LIMIT, py_objects=PY_OBJECTS):
    # Python objects are the same at both sizes, so the difference of the two rises is what
    # arrays growing with the problem cost: each temporary of the base size adds at least its
    # own bytes to it. The base rise itself bounds anything of fixed size.
    rise1, _ = _step_rise(make, 1, threads)
    rise2, _ = _step_rise(make, 2, threads)
    detail = ""
    if rise2 - rise1 > limit or rise1 > py_objects:
        # Only for the message (five more steps per size): where a failing step allocates.
        phases1 = _step_rise(make, 1, threads, per_phase=True)[1]
        phases2 = _step_rise(make, 2, threads, per_phase=True)[1]
        detail = f"per phase at base size: {phases1}; at double size: {phases2}"
    assert rise2 - rise1 <= limit, (
        f"{name}: doubling every dimension raised a step's traced peak by {rise2 - rise1} "
        f"more bytes (limit {limit}): arrays (or ufunc casting buffers) are allocated in the "
        f"step; {detail}")
    assert rise1 <= py_objects, (
        f"{name}: a step raised traced memory by {rise1} bytes (allowance for Python objects "
        f"{py_objects}); {detail}")


@pytest.mark.parametrize("name", list(BLOCKS))
def test_training_step_allocates_no_array_over_1kib(name):
    # Check that a steady training step (after three warm-ups, one thread) allocates nothing
    # over 1 KiB.
    _check_two_sizes(name, BLOCKS[name], threads=1,
                     py_objects=PY_OBJECTS_OF.get(name, PY_OBJECTS))


@pytest.mark.slow
@pytest.mark.parametrize("name", list(PARALLEL_BLOCKS))
def test_training_step_allocates_no_array_over_1kib_with_split_passes(name):
    # Check that with two threads, where elementwise passes are split over a thread pool, a
    # steady training step still allocates nothing over 1 KiB.
    _check_two_sizes(name, PARALLEL_BLOCKS[name], 2, PARALLEL_LIMIT, PARALLEL_PY_OBJECTS)


def test_the_check_sees_a_transient_temporary():
    # Check that the measurement catches an array allocated and freed within the step.
    tracemalloc.start()
    try:
        x = np.ones((64, 32), np.float32)
        quiet = _rise([lambda: np.multiply(x, 2.0, out=x)])
        loud = _rise([lambda: (x * 2.0).sum()])  # an 8 KiB temporary, freed at once
    finally:
        tracemalloc.stop()
    assert quiet <= LIMIT
    assert loud >= x.nbytes

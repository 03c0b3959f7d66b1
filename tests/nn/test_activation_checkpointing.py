"""Sequential(checkpoint=True) (Chen et al. 2016): outputs and gradients bit-identical to
checkpoint=False at one thread (dropout included, over several steps), pooled work buffers,
fused options, training through fit with save/load, bad arguments, and a steady step's
allocations."""
import numpy as np
import pytest
from gradcheck import check_module_grads
from test_step_alloc import _check_two_sizes

from engine import (GELU, AdamW, CrossEntropyLoss, Embedding, FFNSublayer, GatedFFN,
                    GMLPBlock, LayerNorm, Linear, MSELoss, Sequential, fit, load, save)
from kernels import num_threads


def _sublayers(ck, dropout=0.1, n=4, d=16, f=40):
    rng = np.random.default_rng(0)
    return Sequential(*[FFNSublayer(d, f, "gelu", dropout=dropout, norm="pre", rng=rng)
                        for _ in range(n)], checkpoint=ck)


def _gated(ck):
    rng = np.random.default_rng(1)
    return Sequential(Linear(16, 24, rng=rng), GatedFFN(24, 30, "silu", dropout=0.2, rng=rng),
                      GatedFFN(24, 18, "gelu", bias=True, rng=rng), GELU(),
                      Linear(24, 16, rng=rng), checkpoint=ck)


def _lm(ck):
    rng = np.random.default_rng(2)
    return Sequential(Embedding(13, 16, rng=rng),
                      *[GMLPBlock(16, 24, 8, causal=True, rng=rng) for _ in range(3)],
                      LayerNorm(16), Linear(16, 13, rng=rng), checkpoint=ck)


def _steps(model, x, dy, steps=3):
    out = []
    for _ in range(steps):
        y = model(x).copy()
        dx = model.backward(dy)
        out.append((y, None if dx is None else dx.copy(), model.flat_grads().copy()))
    return out


@pytest.mark.parametrize("build,x_shape,y_shape", [
    (_sublayers, (3, 8, 16), (3, 8, 16)),
    (_gated, (20, 16), (20, 16)),
    (_lm, (4, 8), (4, 8, 13)),
], ids=["FFNSublayer-pre-dropout", "GatedFFN-dropout", "GMLPBlock-LM"])
def test_checkpointing_is_bit_identical(build, x_shape, y_shape):
    # Check that outputs, input gradients and every parameter gradient equal those without
    # checkpointing bit for bit at one thread, over three steps (dropout masks are redrawn
    # identically on the rerun, and the generators continue identically afterwards).
    rng = np.random.default_rng(3)
    x = (rng.integers(0, 13, x_shape) if build is _lm else
         rng.standard_normal(x_shape).astype(np.float32))
    dy = rng.standard_normal(y_shape).astype(np.float32)
    with num_threads(1):
        plain = _steps(build(False), x, dy)
        ckpt = _steps(build(True), x, dy)
    for step, (a, b) in enumerate(zip(plain, ckpt)):
        for what, u, v in zip(("y", "dx", "grads"), a, b):
            if u is None:
                assert v is None
            else:
                assert np.array_equal(u, v), f"step {step}: {what} differs"


def test_checkpointed_stack_gradcheck():
    # Check a checkpointed float64 stack (GatedFFN, GMLPBlock, LayerNorm, Linear) against
    # central finite differences: input and every parameter.
    rng = np.random.default_rng(8)
    r = np.random.default_rng(0)
    m = Sequential(GatedFFN(5, 6, "gelu", bias=True, dtype=np.float64, rng=r),
                   GMLPBlock(5, 6, 4, causal=True, dtype=np.float64, rng=r),
                   LayerNorm(5, dtype=np.float64), Linear(5, 3, dtype=np.float64, rng=r),
                   checkpoint=True)
    for _, p in m.named_parameters():
        p.data[...] = 0.5 * rng.standard_normal(p.shape)
    check_module_grads(m, rng.standard_normal((2, 4, 5)), rng)


def test_fused_options_match():
    # Check residual (into the last child) and dx_acc (from the first) with checkpointing.
    rng = np.random.default_rng(4)
    x, r, dy = (rng.standard_normal((2, 5, 16)).astype(np.float32) for _ in range(3))
    results = []
    with num_threads(1):
        for ck in (False, True):
            m = _sublayers(ck, dropout=0.0, n=3)
            acc = np.ones_like(x)
            y = m(x, residual=r).copy()
            m.backward(dy, dx_acc=acc)
            results.append((y, acc, m.flat_grads().copy()))
    for u, v in zip(*results):
        assert np.array_equal(u, v)


def _pooled_bytes(model):
    pools = {id(w): w for _, m in model.named_modules() for w in m._workspaces()}
    return sum(w.nbytes() for w in pools.values())


def test_children_share_one_set_of_work_buffers():
    # Check that a checkpointed stack of 6 equal blocks holds one block's work buffers plus
    # five input copies, where the plain stack holds six blocks' buffers.
    x = np.random.default_rng(5).standard_normal((64, 16)).astype(np.float32)
    plain, ckpt = _sublayers(False, 0.0, n=6), _sublayers(True, 0.0, n=6)
    for m in (plain, ckpt):
        m(x)
        m.backward(x)
    one_block = _pooled_bytes(plain[0])
    assert _pooled_bytes(plain) == 6 * one_block
    assert _pooled_bytes(ckpt) <= one_block + 5 * x.nbytes + 5 * 64  # + alignment slack


def test_heterogeneous_children_keep_apart_buffers():
    # Check that children of different widths at the same position (two Linear layers) get
    # separate pooled buffers: gradients equal the plain stack's and repeat step after step.
    rng = np.random.default_rng(6)
    x, dy = rng.standard_normal((7, 8)), rng.standard_normal((7, 4))

    def build(ck):
        r = np.random.default_rng(0)
        return Sequential(Linear(8, 16, dtype=np.float64, rng=r), GELU(dtype=np.float64),
                          Linear(16, 4, dtype=np.float64, rng=r), checkpoint=ck)
    with num_threads(1):
        a, b = _steps(build(False), x, dy, 2), _steps(build(True), x, dy, 2)
    for u, v in zip(a[-1], b[-1]):
        assert np.array_equal(u, v)


def test_fit_save_load_a_checkpointed_stack(tmp_path):
    # Check that a checkpointed LM stack trains through fit (its loss falls) and saves and
    # loads like any model (the reloaded copy predicts the same logits).
    rng = np.random.default_rng(7)
    ids = rng.integers(0, 13, (32, 8))
    X, Y = ids, np.roll(ids, -1, axis=1)
    model = _lm(True)
    opt = AdamW(model.parameters(), lr=1e-2)
    h = fit(model, CrossEntropyLoss(), opt, X, Y, epochs=4, batch_size=8, rng=0,
            progress=False)
    assert h.loss[-1] < h.loss[0]
    save(tmp_path / "lm.npz", model, opt)
    fresh = _lm(True)
    load(tmp_path / "lm.npz", fresh)
    model.eval()
    fresh.eval()
    np.testing.assert_array_equal(fresh(X[:4]), model(X[:4]))


def test_checkpoint_argument_must_be_a_bool():
    # Check that checkpoint="yes" is a TypeError naming the argument.
    with pytest.raises(TypeError, match="checkpoint"):
        Sequential(Linear(2, 2), checkpoint="yes")


def test_repr_says_checkpoint():
    # Check that the stack's repr shows checkpoint=True.
    assert "checkpoint=True" in repr(_sublayers(True, n=2))


def _make(rng, k):
    m = _sublayers(True, 0.1, n=3, d=32 * k, f=64 * k)
    x = rng.standard_normal((4, 16 * k, 32 * k)).astype(np.float32)
    t = rng.standard_normal((4, 16 * k, 32 * k)).astype(np.float32)
    return m, x, t, MSELoss()


def test_steady_step_allocates_no_array():
    # Check that a steady training step of a checkpointed stack (inputs kept, children rerun)
    # allocates no array over 1 KiB (tracemalloc at two sizes, as tests/nn/test_step_alloc.py).
    # The Python-object allowance is doubled: the stack snapshots its dropout generators'
    # states (a small dict per child and step), the same at both sizes.
    _check_two_sizes("Sequential-checkpoint", _make, threads=1, py_objects=16 * 1024)

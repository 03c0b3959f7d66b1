"""LayerNorm's fused ``backward(dy, dx_acc=a)`` (the input gradient added into ``a`` inside the
backward's one pass) and the pre-norm TransformerBlock that uses it for its residual path."""
import numpy as np
import pytest

from engine.nn.blocks import LayerNorm
from engine.nn.transformer import TransformerBlock
from kernels import instrument

F32 = np.float32


def _norm(d=6, bias=True, seed=0, dtype=F32):
    m = LayerNorm(d, bias=bias, dtype=dtype)
    rng = np.random.default_rng(seed)
    m.gamma.data = (1.0 + 0.3 * rng.standard_normal(d)).astype(dtype)
    if bias:
        m.beta.data = (0.3 * rng.standard_normal(d)).astype(dtype)
    return m


def _draw(rng, shape, dtype=F32):
    return rng.standard_normal(shape).astype(dtype)


def _plain(m, x, dy):
    """(dx, gamma.grad, beta.grad) of a plain backward from zeroed gradients, copied."""
    m.zero_grad()
    m(x)
    dx = m.backward(dy).copy()
    return dx, m.gamma.grad.copy(), None if m.beta is None else m.beta.grad.copy()


@pytest.mark.parametrize("bias", [True, False])
@pytest.mark.parametrize("shape", [(5, 6), (2, 3, 6), (300, 6)])
def test_dx_acc_is_acc_plus_the_plain_input_gradient(shape, bias):
    # Check that backward(dy, dx_acc=acc) returns acc itself holding acc + backward(dy), to
    # the bit, and adds the same parameter gradients.
    rng = np.random.default_rng(1)
    m = _norm(bias=bias)
    x, dy, acc = _draw(rng, shape), _draw(rng, shape), _draw(rng, shape)
    want, dg, db = _plain(m, x, dy)
    want = acc + want
    m.zero_grad()
    m(x)
    res = m.backward(dy, dx_acc=acc)
    assert res is acc
    np.testing.assert_array_equal(acc, want)
    np.testing.assert_array_equal(m.gamma.grad, dg)
    if bias:
        np.testing.assert_array_equal(m.beta.grad, db)


def test_dx_acc_runs_inside_the_layernorm_pass():
    # Check that the fused backward is one layernorm_backward call given acc, and no add.
    rng = np.random.default_rng(2)
    m = _norm()
    x, dy, acc = _draw(rng, (4, 6)), _draw(rng, (4, 6)), _draw(rng, (4, 6))
    m(x)
    with instrument.record() as rec:
        m.backward(dy, dx_acc=acc)
    assert rec.names() == ["layernorm_backward"]
    assert rec.calls[0].args[-1] is True and rec.calls[0].args[0] is acc


@pytest.mark.parametrize("overlap", ["acc-is-x", "acc-rows-of-x", "acc-is-dy", "acc-rows-of-dy"])
def test_dx_acc_sharing_memory_with_x_or_dy_is_still_exact(overlap):
    # Check that a dx_acc that is (or overlaps, one row apart) the forward's input or dy gets
    # acc + the plain input gradient: the pass that would read what it writes is not taken.
    rng = np.random.default_rng(3)
    m = _norm()
    big = _draw(rng, (6, 6))
    x, dy = big[:5], _draw(rng, (5, 6))
    if overlap.endswith("dy"):
        x, big = _draw(rng, (5, 6)), np.concatenate([dy, _draw(rng, (1, 6))])
        dy = big[:5]
    acc = big[:5] if overlap.startswith("acc-is") else big[1:]
    want, _, _ = _plain(m, x.copy(), dy.copy())
    want = acc + want
    m(x)
    res = m.backward(dy, dx_acc=acc)
    assert res is acc
    np.testing.assert_array_equal(acc, want)


@pytest.mark.parametrize("bad,exc", [
    (np.zeros((4, 7), F32), ValueError),          # wrong shape
    (np.zeros((4, 6), np.float64), TypeError),    # wrong dtype
    (np.zeros((6, 4), F32).T, ValueError),        # not C-contiguous
    ("own-output", ValueError),                   # the module's own output buffer
])
def test_bad_dx_acc_raises_naming_it_and_changes_nothing(bad, exc):
    # Check that a bad dx_acc raises naming it, leaves the gradients and dx_acc as they were,
    # and leaves the forward waiting for its backward (a good call then works).
    rng = np.random.default_rng(4)
    m = _norm()
    x, dy = _draw(rng, (4, 6)), _draw(rng, (4, 6))
    want, dg, _ = _plain(m, x, dy)
    m.zero_grad()
    y = m(x)
    acc = y if isinstance(bad, str) else bad
    before = acc.copy()
    grads = m.flat_grads().copy()
    with pytest.raises(exc, match="dx_acc"):
        m.backward(dy, dx_acc=acc)
    np.testing.assert_array_equal(acc, before)
    np.testing.assert_array_equal(m.flat_grads(), grads)
    np.testing.assert_array_equal(m.backward(dy), want)
    np.testing.assert_array_equal(m.gamma.grad, dg)


def test_pre_norm_block_adds_the_residual_gradient_in_ln_1():
    # Check that a pre-norm block's backward runs one add (dy onto ln_2's gradient; dy is
    # the caller's) and ln_1's backward adds into that buffer itself, which is returned.
    m = TransformerBlock(8, 2, 12, dtype=F32, rng=0)
    rng = np.random.default_rng(5)
    x, dy = _draw(rng, (2, 4, 8)), _draw(rng, (2, 4, 8))
    m(x)
    with instrument.record(["add", "layernorm_backward"]) as rec:
        dx = m.backward(dy)
    assert rec.names() == ["layernorm_backward", "add", "layernorm_backward"]
    ln_2_dx, ln_1 = rec.calls[0].args[0], rec.calls[2]
    assert ln_1.args[-1] is True and np.shares_memory(ln_1.args[0], ln_2_dx)
    assert np.shares_memory(dx, ln_2_dx)


def test_pre_norm_block_leaves_dy_untouched():
    # Check that the fused residual path writes only the block's own buffers: a read-only
    # dy is accepted and a writable one is unchanged.
    m = TransformerBlock(8, 2, 12, dtype=F32, rng=0)
    rng = np.random.default_rng(6)
    x, dy = _draw(rng, (2, 4, 8)), _draw(rng, (2, 4, 8))
    dy0 = dy.copy()
    m(x)
    first = m.backward(dy).copy()
    np.testing.assert_array_equal(dy, dy0)
    dy.flags.writeable = False
    m(x)
    np.testing.assert_array_equal(m.backward(dy), first)

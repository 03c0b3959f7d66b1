"""engine.nn.blocks with dropout on: the Dropout module's mask, and backward of FFN, AddNorm and
FFNSublayer consistent with the mask their forward drew (finite differences with the random
stream replayed), eval mode and p == 0 as identity."""
import numpy as np
import pytest
from gradcheck import assert_close, numeric_grad

from engine import FFN, AddNorm, Dropout, FFNSublayer

F64 = np.float64


def _randomize(m, rng):
    for name, p in m.named_parameters():
        p.data[...] = (1.0 if name.endswith("gamma") else 0.0) + 0.5 * rng.standard_normal(p.shape)


# ----------------------------------------------------------------------------- Dropout module
@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_dropout_mask_values_and_backward(dtype):
    # Check that train-mode output is x * mask with mask in {0, 1/(1-p)}, about p of it zero,
    # and that backward is dy * the same mask (manual computation from forward's output).
    p = 0.3
    rng = np.random.default_rng(0)
    m = Dropout(p, dtype=dtype, rng=1)
    x = (rng.random((200, 50)) + 0.5).astype(dtype)  # nonzero, so mask = y / x
    y = m(x).copy()
    mask = y.astype(F64) / x
    kept = mask != 0
    np.testing.assert_allclose(mask[kept], 1 / (1 - p), rtol=1e-6)
    frac = 1 - kept.mean()
    assert abs(frac - p) < 4 * np.sqrt(p * (1 - p) / x.size)
    dy = rng.standard_normal(x.shape).astype(dtype)
    np.testing.assert_allclose(m.backward(dy), dy * mask, rtol=1e-6, atol=1e-7)


def test_dropout_keeps_mean():
    # Check that inverted dropout keeps the mean of a constant input (statistical tolerance).
    p = 0.4
    y = Dropout(p, dtype=F64, rng=2)(np.ones((100, 1000)))
    assert abs(y.mean() - 1.0) < 5 * np.sqrt(p / (1 - p) / y.size)


def test_dropout_same_seed_same_mask_and_fresh_mask_each_call():
    # Check that one seed gives one mask sequence, and that each forward draws a new mask.
    x = np.ones((30, 40))
    a, b = Dropout(0.5, dtype=F64, rng=3), Dropout(0.5, dtype=F64, rng=3)
    ya1, yb1 = a(x).copy(), b(x).copy()
    np.testing.assert_array_equal(ya1, yb1)
    assert not np.array_equal(ya1, a(x))
    assert not np.array_equal(ya1, Dropout(0.5, dtype=F64, rng=4)(x))


@pytest.mark.parametrize("p,train", [(0.5, False), (0.0, True)])
def test_dropout_identity_in_eval_or_p0(p, train):
    # Check that eval mode (or p == 0) passes x and dy through unchanged, without copies.
    m = Dropout(p, dtype=F64, rng=0).train(train)
    x, dy = np.arange(12.0).reshape(3, 4), np.ones((3, 4))
    assert m(x) is x
    assert m.backward(dy) is dy


def test_dropout_3d_shape():
    # Check that a (B, T, d) input keeps its shape through forward and backward.
    m = Dropout(0.2, dtype=np.float32, rng=0)
    x = np.ones((2, 3, 5), np.float32)
    assert m(x).shape == (2, 3, 5)
    assert m.backward(x).shape == (2, 3, 5)


# ----------------------------------------------------------------------------- blocks
def _replay_grad_check(m, x, gen, rng, extra_inputs=()):
    """Finite differences of L = sum(forward(x, *extra) * R) with the dropout stream replayed
    before every forward (so every evaluation sees the same masks) against backward."""
    state = gen.bit_generator.state

    def fwd():
        gen.bit_generator.state = state
        return m.forward(x, *extra_inputs)

    R = rng.standard_normal(fwd().shape)

    def loss():
        return float(np.sum(fwd() * R))

    m.zero_grad()
    y = np.array(fwd(), copy=True)
    grads = m.backward(R.copy())
    grads = tuple(np.array(g, copy=True) for g in (grads if isinstance(grads, tuple) else (grads,)))
    analytic = {n: p.grad.copy() for n, p in m.named_parameters()}
    for name, inp, g in zip(("x", "sub"), (x, *extra_inputs), grads):
        assert_close(g, numeric_grad(loss, inp), name, 1e-5, 1e-7)
    for name, p in m.named_parameters():
        assert_close(analytic[name], numeric_grad(loss, p.data), name, 1e-5, 1e-7)
    return y


def _eval_output(m, x, *extra):
    m.eval()
    try:
        return np.array(m.forward(x, *extra), copy=True)
    finally:
        m.train()


@pytest.mark.parametrize("act", ["relu", "gelu", "leaky_relu", "tanh"])
def test_ffn_dropout_backward_uses_forward_mask(act):
    # Check that FFN with dropout backpropagates through the mask its forward drew.
    rng = np.random.default_rng(5)
    gen = np.random.default_rng(6)
    m = FFN(5, 12, act, dropout=0.4, dtype=F64, rng=gen)
    _randomize(m, rng)
    x = rng.standard_normal((6, 5))
    y = _replay_grad_check(m, x, gen, rng)
    assert not np.allclose(y, _eval_output(m, x))  # dropout really was applied


def test_addnorm_dropout_backward_uses_forward_mask():
    # Check AddNorm's dx, dsub, dgamma, dbeta with dropout on against replayed finite differences.
    rng = np.random.default_rng(7)
    gen = np.random.default_rng(8)
    m = AddNorm(6, dropout=0.5, dtype=F64, rng=gen)
    _randomize(m, rng)
    x, sub = rng.standard_normal((5, 6)), rng.standard_normal((5, 6))
    y = _replay_grad_check(m, x, gen, rng, extra_inputs=(sub,))
    assert not np.allclose(y, _eval_output(m, x, sub))


@pytest.mark.parametrize("norm", ["post", "pre"])
def test_ffn_sublayer_dropout_backward_uses_forward_masks(norm):
    # Check FFNSublayer with dropout (inside the FFN and on its output) against replayed
    # finite differences, in both norm modes.
    rng = np.random.default_rng(9)
    gen = np.random.default_rng(10)
    m = FFNSublayer(6, 10, "gelu", dropout=0.3, norm=norm, dtype=F64, rng=gen)
    _randomize(m, rng)
    x = rng.standard_normal((2, 3, 6))
    y = _replay_grad_check(m, x, gen, rng)
    assert not np.allclose(y, _eval_output(m, x))


@pytest.mark.parametrize("make", [
    lambda p: FFN(6, 10, "relu", dropout=p, dtype=F64, rng=0),
    lambda p: FFNSublayer(6, 10, "gelu", dropout=p, norm="post", dtype=F64, rng=0),
    lambda p: FFNSublayer(6, 10, "gelu", dropout=p, norm="pre", dtype=F64, rng=0),
])
def test_eval_mode_equals_no_dropout(make):
    # Check that in eval mode a block with dropout computes exactly the p = 0 block (forward and
    # backward), and that train() turns dropout back on.
    rng = np.random.default_rng(11)
    a, b = make(0.5).eval(), make(0.0)
    _randomize(b, rng)
    a.load_state_dict(b.state_dict())
    x, dy = rng.standard_normal((4, 6)), rng.standard_normal((4, 6))
    np.testing.assert_array_equal(a(x), b(x))
    np.testing.assert_array_equal(a.backward(dy), b.backward(dy))
    for (n, pa), (_, pb) in zip(a.named_parameters(), b.named_parameters()):
        np.testing.assert_array_equal(pa.grad, pb.grad, err_msg=n)
    assert not np.array_equal(a.train()(x), b(x))


def test_addnorm_eval_mode_equals_no_dropout():
    # Check that AddNorm in eval mode is LayerNorm(x + sub) with no dropout.
    rng = np.random.default_rng(12)
    a, b = AddNorm(6, dropout=0.5, dtype=F64, rng=0).eval(), AddNorm(6, dtype=F64)
    x, sub = rng.standard_normal((4, 6)), rng.standard_normal((4, 6))
    np.testing.assert_array_equal(a(x, sub), b(x, sub))
    for ga, gb in zip(a.backward(np.ones((4, 6))), b.backward(np.ones((4, 6)))):
        np.testing.assert_array_equal(ga, gb)


def test_ffn_dropout_same_seed_same_result():
    # Check that two FFNs with dropout built from one seed give identical training outputs.
    x = np.random.default_rng(13).standard_normal((5, 6))
    a = FFN(6, 10, dropout=0.5, dtype=F64, rng=42)
    b = FFN(6, 10, dropout=0.5, dtype=F64, rng=42)
    for _ in range(2):
        np.testing.assert_array_equal(a(x), b(x))

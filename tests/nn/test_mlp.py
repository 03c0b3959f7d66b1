"""engine.MLP: seed 004's worked example, finite-difference gradients, equivalence with the
unfused Sequential of Linear + activation modules, batch changes, bad input."""

import numpy as np
import pytest
from gradcheck import check_module_grads

from engine import (GELU, MLP, CrossEntropyLoss, Identity, LeakyReLU, Linear, ReLU, Sequential,
                    Sigmoid, SiLU, Tanh)

ACT_MODULE = {
    "relu": lambda dt, s: ReLU(dtype=dt), "leaky_relu": lambda dt, s: LeakyReLU(s, dtype=dt),
    "gelu": lambda dt, s: GELU(dtype=dt), "gelu_tanh": lambda dt, s: GELU("tanh", dtype=dt),
    "silu": lambda dt, s: SiLU(dtype=dt), "sigmoid": lambda dt, s: Sigmoid(dtype=dt),
    "tanh": lambda dt, s: Tanh(dtype=dt), "identity": lambda dt, s: Identity(dtype=dt),
}

CONFIGS = [
    ([4, 7, 3], ["relu", None]),
    ([4, 6, 5, 3], ["gelu", "tanh", None]),
    ([3, 5, 5, 2], ["silu", "leaky_relu", "sigmoid"]),
    ([5, 4, 4, 4, 2], ["gelu_tanh", "identity", "relu", "tanh"]),
    ([3, 2], [None]),
]


def _randomise_biases(m, rng):
    # Biases start at zero; give them values so a wrong bias path cannot hide.
    for _, p in m.named_parameters():
        if p.data.ndim == 1:
            p.data[...] = 0.5 * rng.standard_normal(p.data.shape)


def _unfused(m: MLP, dtype) -> Sequential:
    """The same network as separate Linear + activation modules, with m's weights."""
    mods = []
    for i, (lin, act) in enumerate(zip(m, m.activations)):
        twin = Linear(lin.d_in, lin.d_out, bias=lin.b is not None, dtype=dtype)
        twin.load_state_dict(lin.state_dict())
        mods.append(twin)
        if act is not None:
            mods.append(ACT_MODULE[act](dtype, m.negative_slope))
    return Sequential(*mods)


# ----------------------------------------------------------------------------- seed 004
SEED_W1 = np.array([[0.1, 0.3], [0.2, 0.4]])  # seed layout (n_out, n_in)
SEED_W2 = np.array([[0.5, 0.7], [0.6, 0.8]])


def _seed_mlp():
    m = MLP([2, 2, 2], ["relu", None], dtype=np.float64, rng=0)
    # Our W is (d_in, d_out): the transpose of the seed's (n_out, n_in).
    m.load_state_dict({"0.W": SEED_W1.T.copy(), "0.b": np.zeros(2),
                       "1.W": SEED_W2.T.copy(), "1.b": np.zeros(2)})
    return m


def test_seed004_forward_softmax_and_loss():
    # Check seed 004's forward numbers: z1 = [0.7, 1.0], z2 = [1.05, 1.22], softmax
    # 0.457602 / 0.542398 and loss 0.781755 (the exact values, see DESIGN errata).
    m, ce = _seed_mlp(), CrossEntropyLoss()
    logits = m(np.array([[1.0, 2.0]]))
    np.testing.assert_allclose(logits, [[1.05, 1.22]], rtol=1e-12)
    np.testing.assert_allclose(m[0](np.array([[1.0, 2.0]])), [[0.7, 1.0]], rtol=1e-12)
    loss = ce(logits, np.array([0]))
    np.testing.assert_allclose(ce.probs, [[0.457602, 0.542398]], atol=5e-7)
    assert loss == pytest.approx(0.781755, abs=5e-7)


def test_seed004_gradients_and_sgd_step():
    # Check the seed's dW2, db2, dW1, db1 (seed values, transposed into our layout, to its
    # 4 printed digits) and W1 after one plain SGD step with lr 0.1.
    m, ce = _seed_mlp(), CrossEntropyLoss()
    ce(m(np.array([[1.0, 2.0]])), np.array([0]))
    m.zero_grad()
    m.backward(ce.backward())
    dW2_seed = np.array([[-0.3796, -0.5423], [0.3796, 0.5423]])
    dW1_seed = np.array([[0.0542, 0.1085], [0.0542, 0.1085]])
    np.testing.assert_allclose(m[1].W.grad, dW2_seed.T, atol=1e-4)
    np.testing.assert_allclose(m[1].b.grad, [-0.5423, 0.5423], atol=1e-4)
    np.testing.assert_allclose(m[0].W.grad, dW1_seed.T, atol=1e-4)
    np.testing.assert_allclose(m[0].b.grad, [0.0542, 0.0542], atol=1e-4)
    # The exact values by hand: delta2 = p - y, dW2 = a1^T delta2, da1 = delta2 W2.
    p0 = 1.0 / (1.0 + np.exp(1.22 - 1.05))
    delta2 = np.array([p0 - 1.0, 1.0 - p0])
    np.testing.assert_allclose(m[1].W.grad, np.outer([0.7, 1.0], delta2), rtol=1e-12)
    da1 = SEED_W2.T @ delta2  # seed layout: da1 = delta2 @ W2
    np.testing.assert_allclose(m[0].W.grad, np.outer([1.0, 2.0], da1), rtol=1e-12)
    for p in m.parameters():
        p.data -= 0.1 * p.grad
    W1_new_seed = np.array([[0.0946, 0.2892], [0.1946, 0.3892]])
    np.testing.assert_allclose(m[0].W.data, W1_new_seed.T, atol=1e-4)


# ----------------------------------------------------------------------------- gradients
@pytest.mark.parametrize("sizes,acts", CONFIGS, ids=["-".join(map(str, a)) for _, a in CONFIGS])
def test_mlp_gradcheck(sizes, acts):
    # Check the MLP's input and parameter gradients against finite differences (float64).
    rng = np.random.default_rng(30)
    m = MLP(sizes, acts, negative_slope=0.1, dtype=np.float64, rng=1)
    _randomise_biases(m, rng)
    check_module_grads(m, rng.standard_normal((6, sizes[0])), rng)


def test_mlp_gradcheck_no_bias_3d():
    # Check gradients of a bias-free MLP on a (B, T, d) input.
    rng = np.random.default_rng(31)
    m = MLP([3, 5, 2], ["gelu", None], bias=False, dtype=np.float64, rng=2)
    assert [n for n, _ in m.named_parameters()] == ["0.W", "1.W"]
    check_module_grads(m, rng.standard_normal((2, 3, 3)), rng)


@pytest.mark.parametrize("sizes,acts", CONFIGS, ids=["-".join(map(str, a)) for _, a in CONFIGS])
def test_mlp_equals_unfused_sequential(sizes, acts):
    # Check that the fused MLP computes what separate Linear + activation modules compute:
    # output, input gradient and every parameter gradient.
    rng = np.random.default_rng(32)
    m = MLP(sizes, acts, negative_slope=0.1, dtype=np.float64, rng=3)
    _randomise_biases(m, rng)
    s = _unfused(m, np.float64)
    x, dy = rng.standard_normal((9, sizes[0])), rng.standard_normal((9, sizes[-1]))
    np.testing.assert_allclose(m(x), s(x), rtol=1e-12, atol=1e-14)
    np.testing.assert_allclose(m.backward(dy), s.backward(dy), rtol=1e-12, atol=1e-14)
    lin_grads = [p.grad for m_ in s if isinstance(m_, Linear) for p in m_.parameters()]
    for (name, p), g in zip(m.named_parameters(), lin_grads):
        np.testing.assert_allclose(p.grad, g, rtol=1e-12, atol=1e-14, err_msg=name)


def test_mlp_forward_by_hand_with_leaky_slope():
    # Check a one-layer leaky_relu MLP against z = x W + b, where(z > 0, z, slope z) written
    # out by hand, so that negative_slope really reaches the kernel.
    rng = np.random.default_rng(38)
    m = MLP([3, 4], ["leaky_relu"], negative_slope=0.2, dtype=np.float64, rng=0)
    _randomise_biases(m, rng)
    x = rng.standard_normal((8, 3))
    z = x @ m[0].W.data + m[0].b.data
    assert (z < 0).any()
    np.testing.assert_allclose(m(x), np.where(z > 0, z, 0.2 * z), rtol=1e-12, atol=1e-15)
    dy = rng.standard_normal((8, 4))
    np.testing.assert_allclose(m.backward(dy), (dy * np.where(z > 0, 1.0, 0.2)) @ m[0].W.data.T,
                               rtol=1e-12, atol=1e-15)


# ----------------------------------------------------------------------------- construction
def test_mlp_default_activations_and_names():
    # Check the default (relu hidden, linear output), parameter names and shapes, repr.
    m = MLP([784, 256, 128, 10], rng=0)
    assert m.activations == ["relu", "relu", None]
    names = [(n, p.shape) for n, p in m.named_parameters()]
    assert names == [("0.W", (784, 256)), ("0.b", (256,)), ("1.W", (256, 128)), ("1.b", (128,)),
                     ("2.W", (128, 10)), ("2.b", (10,))]
    assert len(m) == 3 and m[2].d_out == 10
    r = repr(m)
    assert "784" in r and "'relu'" in r and f"{m.num_parameters():,}" in r


def test_mlp_wrong_number_of_activations():
    # Check that a wrong activation count is a ValueError naming both counts.
    with pytest.raises(ValueError, match=r"expected 3 .*got 2"):
        MLP([784, 256, 128, 10], ["relu", "relu"])


@pytest.mark.parametrize("kwargs,exc,msg", [
    (dict(sizes=[4, 3], activations=["softplus"]), ValueError, "activations\\[0\\]"),
    (dict(sizes=[4]), ValueError, "at least 2"),
    (dict(sizes=[4, 0, 2]), ValueError, "sizes\\[1\\]"),
    (dict(sizes=[4, 2], init="uniform"), ValueError, "init"),
    (dict(sizes=[4, 2], dtype=np.float16), TypeError, "dtype"),
])
def test_mlp_constructor_errors(kwargs, exc, msg):
    # Check that bad constructor arguments raise naming the argument.
    with pytest.raises(exc, match=msg):
        MLP(**kwargs)


def test_mlp_same_seed_same_weights():
    # Check that the same seed gives the same weights and a different seed different ones.
    a, b, c = MLP([6, 5, 2], rng=4), MLP([6, 5, 2], rng=4), MLP([6, 5, 2], rng=5)
    for (n, p), (_, q), (_, r) in zip(a.named_parameters(), b.named_parameters(), c.named_parameters()):
        np.testing.assert_array_equal(p.data, q.data)
        if n.endswith("W"):
            assert not np.array_equal(p.data, r.data)


# ----------------------------------------------------------------------------- shapes, dtypes
def test_mlp_3d_input():
    # Check (B, T, d) in -> (B, T, d_out) out, equal to the flattened call, same for dx.
    rng = np.random.default_rng(33)
    m = MLP([5, 7, 3], ["tanh", None], dtype=np.float64, rng=0)
    x, dy = rng.standard_normal((2, 4, 5)), rng.standard_normal((2, 4, 3))
    y, dx = m(x).copy(), m.backward(dy).copy()
    assert y.shape == (2, 4, 3) and dx.shape == (2, 4, 5)
    np.testing.assert_allclose(m(x.reshape(8, 5)), y.reshape(8, 3), rtol=1e-14)
    np.testing.assert_allclose(m.backward(dy.reshape(8, 3)), dx.reshape(8, 5), rtol=1e-14)


def test_mlp_batch_size_changes_match_fresh_modules():
    # Check large, small, large batches (and 3-D ones) against a fresh MLP for each call.
    rng = np.random.default_rng(34)

    def make():
        return MLP([6, 8, 8, 3], ["gelu", "relu", None], dtype=np.float64, rng=9)

    m = make()
    for shape in ((32, 6), (4, 6), (32, 6), (3, 5, 6), (1, 6)):
        x, dy = rng.standard_normal(shape), rng.standard_normal(shape[:-1] + (3,))
        fresh = make()
        m.zero_grad()
        np.testing.assert_array_equal(m(x), fresh(x))
        np.testing.assert_array_equal(m.backward(dy), fresh.backward(dy))
        for (n, p), (_, q) in zip(m.named_parameters(), fresh.named_parameters()):
            np.testing.assert_array_equal(p.grad, q.grad, err_msg=n)


def test_mlp_float32_agrees_with_float64():
    # Check float32 against float64 (same seed, so weights equal up to rounding).
    rng = np.random.default_rng(35)
    m32 = MLP([16, 32, 24, 8], ["gelu", "silu", None], rng=6)
    m64 = MLP([16, 32, 24, 8], ["gelu", "silu", None], dtype=np.float64, rng=6)
    m64.load_state_dict({n: v.astype(np.float64) for n, v in m32.state_dict().items()})
    x, dy = rng.standard_normal((10, 16)), rng.standard_normal((10, 8))
    tol = dict(rtol=1e-4, atol=1e-5)
    np.testing.assert_allclose(m32(x.astype(np.float32)), m64(x), **tol)
    np.testing.assert_allclose(m32.backward(dy.astype(np.float32)), m64.backward(dy), **tol)
    for (n, p), (_, q) in zip(m32.named_parameters(), m64.named_parameters()):
        np.testing.assert_allclose(p.grad, q.grad, err_msg=n, **tol)


def test_mlp_reuses_buffers():
    # Check that repeated calls return views of the same work buffers.
    m = MLP([4, 5, 3], rng=0)
    x, dy = np.ones((6, 4), np.float32), np.ones((6, 3), np.float32)
    y1, dx1 = m(x), m.backward(dy)
    y2, dx2 = m(x[:2]), m.backward(dy[:2])
    assert np.shares_memory(y1, y2) and np.shares_memory(dx1, dx2)


@pytest.mark.parametrize("acts", [["relu", "sigmoid"], ["tanh", None]])
def test_mlp_does_not_write_its_inputs(acts):
    # Check that forward leaves x and backward leaves dy untouched (the backward works in
    # place only on its own buffers).
    rng = np.random.default_rng(39)
    m = MLP([4, 6, 3], acts, rng=0)
    x = rng.standard_normal((5, 4)).astype(np.float32)
    dy = rng.standard_normal((5, 3)).astype(np.float32)
    x0, dy0 = x.copy(), dy.copy()
    m(x)
    m.backward(dy)
    np.testing.assert_array_equal(x, x0)
    np.testing.assert_array_equal(dy, dy0)


# ----------------------------------------------------------------------------- bad input
@pytest.mark.parametrize("x,exc", [
    (np.ones((3, 5), np.float32), ValueError),  # wrong last dim
    (np.ones((3, 4), np.float64), TypeError),  # wrong dtype
    (np.ones(4, np.float32), ValueError),  # 1-D
])
def test_mlp_bad_input_leaves_module_unchanged(x, exc):
    # Check that a bad input raises and the previous forward's cache still drives backward.
    rng = np.random.default_rng(36)
    m, ref = MLP([4, 5, 3], rng=0), MLP([4, 5, 3], rng=0)
    good = rng.standard_normal((2, 4)).astype(np.float32)
    dy = rng.standard_normal((2, 3)).astype(np.float32)
    m(good)
    ref(good)
    with pytest.raises(exc, match="x"):
        m(x)
    np.testing.assert_array_equal(m.backward(dy), ref.backward(dy))
    for p, q in zip(m.parameters(), ref.parameters()):
        np.testing.assert_array_equal(p.data, q.data)
        np.testing.assert_array_equal(p.grad, q.grad)


def test_mlp_backward_errors():
    # Check backward before forward (RuntimeError naming MLP) and a misshapen dy (ValueError,
    # gradients untouched).
    m = MLP([4, 5, 3], rng=0)
    with pytest.raises(RuntimeError, match="MLP"):
        m.backward(np.ones((2, 3), np.float32))
    m(np.ones((2, 4), np.float32))
    with pytest.raises(ValueError, match="dy"):
        m.backward(np.ones((2, 4), np.float32))
    assert all(not p.grad.any() for p in m.parameters())


def test_mlp_state_dict_round_trip_and_strictness():
    # Check a round trip between two MLPs and that a wrong shape is refused, changing nothing.
    a, b = MLP([4, 5, 3], rng=0), MLP([4, 5, 3], rng=1)
    b.load_state_dict(a.state_dict())
    x = np.ones((2, 4), np.float32)
    np.testing.assert_array_equal(a(x), b(x))
    c = MLP([4, 5, 3], rng=2)
    before = c.state_dict()
    sd = a.state_dict()
    sd["1.W"] = np.zeros((3, 5), np.float32)
    with pytest.raises(ValueError, match="1.W"):
        c.load_state_dict(sd)
    for n, v in before.items():
        np.testing.assert_array_equal(c.state_dict()[n], v)


# ----------------------------------------------------------------------------- training
def test_mlp_learns_xor():
    # Check that plain SGD on softmax cross-entropy solves XOR (a linear model cannot).
    x = np.array([[0, 0], [0, 1], [1, 0], [1, 1]], np.float64)
    labels = np.array([0, 1, 1, 0])
    m, ce = MLP([2, 8, 2], ["tanh", None], dtype=np.float64, rng=0), CrossEntropyLoss()
    for _ in range(2000):
        m.zero_grad()
        ce(m(x), labels)
        m.backward(ce.backward())
        for p in m.parameters():
            p.data -= 0.5 * p.grad
    assert (m(x).argmax(1) == labels).all()
    assert ce(m(x), labels) < 0.05




@pytest.mark.parametrize("slopes", [-0.5, [0.2, -1.5, 0.0]], ids=["negative", "per-layer"])
def test_mlp_gradcheck_leaky_slopes(slopes):
    # Check gradients with a negative leaky slope (act(z) no longer has z's sign, so the
    # layer must not read the derivative off its output) and with one slope per layer.
    rng = np.random.default_rng(32)
    m = MLP([4, 6, 5, 3], ["leaky_relu", "leaky_relu", "leaky_relu"], negative_slope=slopes,
            dtype=np.float64, rng=3)
    _randomise_biases(m, rng)
    check_module_grads(m, rng.standard_normal((7, 4)), rng)

"""engine.nn.layers: Linear, the activation modules and Sequential (gradients by finite
differences, buffers, batch-size changes, bad input, state dicts)."""
import tracemalloc

import numpy as np
import pytest
from gradcheck import check_module_grads

from engine import (GELU, MLP, Identity, LeakyReLU, Linear, ReLU, Sequential, Sigmoid, SiLU,
                    Tanh)
from kernels import reference

INITS = ["he", "xavier", "normal", "zeros"]
TOL32 = dict(rtol=2e-5, atol=2e-6)

# (factory, reference activation name, negative_slope)
ACTS = {
    "relu": (lambda dt: ReLU(dtype=dt), "relu", 0.01),
    "leaky_relu": (lambda dt: LeakyReLU(0.2, dtype=dt), "leaky_relu", 0.2),
    "gelu": (lambda dt: GELU(dtype=dt), "gelu", 0.01),
    "gelu_tanh": (lambda dt: GELU("tanh", dtype=dt), "gelu_tanh", 0.01),
    "silu": (lambda dt: SiLU(dtype=dt), "silu", 0.01),
    "sigmoid": (lambda dt: Sigmoid(dtype=dt), "sigmoid", 0.01),
    "tanh": (lambda dt: Tanh(dtype=dt), "tanh", 0.01),
    "identity": (lambda dt: Identity(dtype=dt), "identity", 0.01),
}


def _away_from_kinks(rng, shape, margin=0.1):
    # relu/leaky_relu are not differentiable at 0: keep finite differences off the kink.
    x = rng.standard_normal(shape)
    return np.where(np.abs(x) < margin, np.sign(x + 1e-300) * margin + x, x)


# ----------------------------------------------------------------------------- Linear
@pytest.mark.parametrize("init", INITS)
@pytest.mark.parametrize("bias", [True, False])
def test_linear_gradcheck(init, bias):
    # Check that dx, dW and db equal central finite differences (float64), for every init.
    rng = np.random.default_rng(0)
    lin = Linear(5, 4, bias=bias, init=init, dtype=np.float64, rng=1)
    if bias:  # a nonzero bias, so a bias bug cannot hide behind zeros
        lin.b.data[...] = rng.standard_normal(4)
    if init == "zeros":  # zero weights would make dx identically zero: give it something
        assert not lin.W.data.any()
        lin.W.data[...] = rng.standard_normal((5, 4))
    assert [n for n, _ in lin.named_parameters()] == (["W", "b"] if bias else ["W"])
    check_module_grads(lin, rng.standard_normal((7, 5)), rng)


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_linear_forward_matches_matmul(dtype):
    # Check that forward is x @ W + b (float64 matmul as the oracle) and keeps the dtype.
    rng = np.random.default_rng(1)
    lin = Linear(6, 3, dtype=dtype, rng=2)
    lin.b.data[...] = rng.standard_normal(3)
    x = rng.standard_normal((9, 6)).astype(dtype)
    y = lin(x)
    assert y.dtype == dtype and y.shape == (9, 3)
    expected = x.astype(np.float64) @ lin.W.data.astype(np.float64) + lin.b.data
    tol = TOL32 if dtype == np.float32 else dict(rtol=1e-12, atol=1e-12)
    np.testing.assert_allclose(y, expected, **tol)


def test_linear_backward_accumulates_grads():
    # Check that parameter gradients add up over two forward+backward passes until zero_grad.
    rng = np.random.default_rng(2)
    lin = Linear(4, 3, dtype=np.float64, rng=0)
    x, dy = rng.standard_normal((5, 4)), rng.standard_normal((5, 3))
    lin(x)
    lin.backward(dy)
    g1 = (lin.W.grad.copy(), lin.b.grad.copy())
    lin(x)
    lin.backward(dy)
    np.testing.assert_allclose(lin.W.grad, 2 * g1[0], rtol=1e-14)
    np.testing.assert_allclose(lin.b.grad, 2 * g1[1], rtol=1e-14)
    np.testing.assert_allclose(g1[0], x.T @ dy, rtol=1e-12)
    np.testing.assert_allclose(g1[1], dy.sum(0), rtol=1e-12)
    lin.zero_grad()
    assert not lin.W.grad.any() and not lin.b.grad.any()


def test_linear_reuses_buffers():
    # Check that a second forward/backward of the same or a smaller batch writes into the
    # same memory (no new buffers), and that the input is cached, not copied.
    rng = np.random.default_rng(3)
    lin = Linear(4, 3, rng=0)
    x = rng.standard_normal((8, 4)).astype(np.float32)
    y1 = lin(x)
    dx1 = lin.backward(np.ones((8, 3), np.float32))
    y2 = lin(x[:5])
    assert np.shares_memory(lin._saved.x, x)  # the input cached by reference until backward
    dx2 = lin.backward(np.ones((5, 3), np.float32))
    assert np.shares_memory(y1, y2) and np.shares_memory(dx1, dx2)


def test_linear_init_choices():
    # Check that an unknown init is a ValueError listing the choices, and bias starts at 0.
    with pytest.raises(ValueError, match="he.*xavier.*normal.*zeros"):
        Linear(3, 2, init="kaiming")
    assert not Linear(3, 2, init="xavier", rng=0).b.data.any()
    assert Linear(3, 2, bias=False).b is None


@pytest.mark.parametrize("bad,exc", [(0, ValueError), (-1, ValueError), (2.5, TypeError),
                                     (True, TypeError), ("3", TypeError)])
def test_linear_bad_sizes(bad, exc):
    # Check that a size below 1 is a ValueError and a non-int one (bool, float, str) a
    # TypeError, each naming the argument (as NumPy and PyTorch treat sizes).
    with pytest.raises(exc, match="^d_in: expected a positive int"):
        Linear(bad, 3)
    with pytest.raises(exc, match="^d_out: expected a positive int"):
        Linear(3, bad)


def test_linear_same_seed_same_weights():
    # Check that the same int seed (or equal Generators) gives the same weights; others differ.
    a, b = Linear(8, 5, rng=7), Linear(8, 5, rng=np.random.default_rng(7))
    np.testing.assert_array_equal(a.W.data, b.W.data)
    assert not np.array_equal(a.W.data, Linear(8, 5, rng=8).W.data)


def test_linear_float32_is_rounded_float64_weights():
    # Check that one seed gives the same weights in float32 and float64 (up to rounding).
    w32, w64 = Linear(6, 4, rng=3).W.data, Linear(6, 4, dtype=np.float64, rng=3).W.data
    np.testing.assert_array_equal(w32, w64.astype(np.float32))


def test_linear_3d_input_keeps_leading_shape():
    # Check that (B, T, d) in gives (B, T, d_out) out, equal to the flattened (B*T, d) call,
    # and that backward returns (B, T, d_in) with the same parameter gradients.
    rng = np.random.default_rng(4)
    lin = Linear(5, 3, dtype=np.float64, rng=0)
    lin.b.data[...] = rng.standard_normal(3)
    x, dy = rng.standard_normal((2, 4, 5)), rng.standard_normal((2, 4, 3))
    y = lin(x).copy()
    dx = lin.backward(dy).copy()
    gW = lin.W.grad.copy()
    assert y.shape == (2, 4, 3) and dx.shape == (2, 4, 5)
    lin.zero_grad()
    np.testing.assert_allclose(lin(x.reshape(8, 5)), y.reshape(8, 3), rtol=1e-14)
    np.testing.assert_allclose(lin.backward(dy.reshape(8, 3)), dx.reshape(8, 5), rtol=1e-14)
    np.testing.assert_allclose(lin.W.grad, gW, rtol=1e-14)


def test_linear_3d_gradcheck():
    # Check the gradients of a (B, T, d) input against finite differences.
    rng = np.random.default_rng(5)
    lin = Linear(3, 2, dtype=np.float64, rng=0)
    lin.b.data[...] = rng.standard_normal(2)
    check_module_grads(lin, rng.standard_normal((2, 3, 3)), rng)


def test_linear_batch_size_changes_match_fresh_modules():
    # Check that large, small, large batches give the same outputs and gradients as a fresh
    # module for each call (stale buffer rows must not leak into results).
    rng = np.random.default_rng(6)
    lin = Linear(6, 4, dtype=np.float64, rng=1)
    for n in (16, 3, 16, 1, 9):
        x, dy = rng.standard_normal((n, 6)), rng.standard_normal((n, 4))
        fresh = Linear(6, 4, dtype=np.float64, rng=1)
        lin.zero_grad()
        np.testing.assert_array_equal(lin(x), fresh(x))
        np.testing.assert_array_equal(lin.backward(dy), fresh.backward(dy))
        np.testing.assert_array_equal(lin.W.grad, fresh.W.grad)
        np.testing.assert_array_equal(lin.b.grad, fresh.b.grad)


def test_linear_float32_agrees_with_float64():
    # Check that the float32 module matches the float64 one to float32 tolerance.
    rng = np.random.default_rng(7)
    l32, l64 = Linear(20, 10, rng=0), Linear(20, 10, dtype=np.float64, rng=0)
    l64.W.data[...] = l32.W.data
    x, dy = rng.standard_normal((12, 20)), rng.standard_normal((12, 10))
    np.testing.assert_allclose(l32(x.astype(np.float32)), l64(x), rtol=1e-4, atol=1e-5)
    np.testing.assert_allclose(l32.backward(dy.astype(np.float32)), l64.backward(dy), rtol=1e-4, atol=1e-5)
    np.testing.assert_allclose(l32.W.grad, l64.W.grad, rtol=1e-4, atol=1e-5)
    np.testing.assert_allclose(l32.b.grad, l64.b.grad, rtol=1e-4, atol=1e-5)


def test_linear_backward_before_forward():
    # Check that backward before any forward is a RuntimeError naming the module.
    with pytest.raises(RuntimeError, match="Linear"):
        Linear(3, 2).backward(np.zeros((1, 2), np.float32))


BAD_X = [
    ("last dim", lambda: np.zeros((4, 6), np.float32), ValueError, "last dimension 5"),
    ("dtype", lambda: np.zeros((4, 5), np.float64), TypeError, "float32"),
    ("1-D", lambda: np.zeros(5, np.float32), ValueError, "shape"),
    ("4-D", lambda: np.zeros((1, 2, 3, 5), np.float32), ValueError, "shape"),
    ("list", lambda: [[0.0] * 5], TypeError, "ndarray"),
    ("non-contiguous", lambda: np.zeros((4, 10), np.float32)[:, ::2], ValueError, "contiguous"),
]


@pytest.mark.parametrize("what,make,exc,msg", BAD_X, ids=[b[0] for b in BAD_X])
def test_linear_bad_input_leaves_module_unchanged(what, make, exc, msg):
    # Check that a bad forward input raises a clear error and changes nothing: parameters,
    # gradients and the cached input of the previous good forward.
    rng = np.random.default_rng(8)
    lin, ref = Linear(5, 3, rng=0), Linear(5, 3, rng=0)
    x, dy = rng.standard_normal((4, 5)).astype(np.float32), np.ones((4, 3), np.float32)
    lin(x)
    ref(x)
    with pytest.raises(exc, match=msg):
        lin(make())
    np.testing.assert_array_equal(lin.W.data, ref.W.data)
    np.testing.assert_array_equal(lin.backward(dy), ref.backward(dy))
    np.testing.assert_array_equal(lin.W.grad, ref.W.grad)


@pytest.mark.parametrize("dy,exc", [
    (np.ones((4, 2), np.float32), ValueError),  # wrong last dim
    (np.ones((3, 3), np.float32), ValueError),  # wrong batch
    (np.ones((4, 3), np.float64), TypeError),  # wrong dtype
    (np.ones((1, 4, 3), np.float32), ValueError),  # wrong leading shape
])
def test_linear_bad_dy_leaves_grads_unchanged(dy, exc):
    # Check that a dy not shaped like the forward output is rejected before any gradient moves.
    lin = Linear(5, 3, rng=0)
    lin(np.ones((4, 5), np.float32))
    with pytest.raises(exc, match="dy"):
        lin.backward(dy)
    assert not lin.W.grad.any() and not lin.b.grad.any()


def test_linear_rejects_its_own_output_as_input():
    # Check that feeding a square Linear its own output buffer is refused (BLAS would read
    # what it overwrites) instead of returning garbage.
    lin = Linear(4, 4, rng=0)
    y = lin(np.ones((3, 4), np.float32))
    with pytest.raises(ValueError, match="overlaps"):
        lin(y)


def test_linear_empty_batch():
    # Check that a zero-row batch gives zero-row outputs and leaves gradients at zero.
    lin = Linear(4, 3, rng=0)
    assert lin(np.zeros((0, 4), np.float32)).shape == (0, 3)
    assert lin.backward(np.zeros((0, 3), np.float32)).shape == (0, 4)
    assert not lin.W.grad.any()


def test_linear_state_dict_round_trip():
    # Check that state_dict copies (not views) and load_state_dict restores the weights.
    a, b = Linear(4, 3, rng=0), Linear(4, 3, rng=1)
    sd = a.state_dict()
    assert list(sd) == ["W", "b"] and not np.shares_memory(sd["W"], a.W.data)
    b.load_state_dict(sd)
    np.testing.assert_array_equal(b.W.data, a.W.data)
    x = np.ones((2, 4), np.float32)
    np.testing.assert_array_equal(a(x), b(x))


@pytest.mark.parametrize("change,exc", [
    (lambda sd: sd.update(W=np.zeros((3, 4), np.float32)), ValueError),  # transposed shape
    (lambda sd: sd.update(b=np.zeros(3, np.float64)), TypeError),  # wrong dtype
    (lambda sd: sd.pop("b"), KeyError),  # missing
    (lambda sd: sd.update(extra=np.zeros(1, np.float32)), KeyError),  # unexpected
])
def test_linear_load_state_dict_strict(change, exc):
    # Check that a bad state dict raises and leaves every parameter unchanged (even the good ones).
    lin = Linear(4, 3, rng=0)
    before = lin.state_dict()
    sd = {"W": np.full((4, 3), 9.0, np.float32), "b": np.full(3, 9.0, np.float32)}
    change(sd)
    with pytest.raises(exc):
        lin.load_state_dict(sd)
    for n, v in before.items():
        np.testing.assert_array_equal(lin.state_dict()[n], v)


def test_linear_repr_shows_sizes():
    # Check that repr names the sizes and the bias flag.
    r = repr(Linear(784, 256, bias=False))
    assert "784" in r and "256" in r and "bias=False" in r


# ----------------------------------------------------------------------------- activations
@pytest.mark.parametrize("name", list(ACTS))
def test_activation_gradcheck(name):
    # Check that each activation module's backward equals finite differences (float64).
    rng = np.random.default_rng(10)
    make, _, _ = ACTS[name]
    check_module_grads(make(np.float64), _away_from_kinks(rng, (6, 5)), rng)


@pytest.mark.parametrize("name", list(ACTS))
@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_activation_forward_matches_reference(name, dtype):
    # Check that forward equals kernels.reference.activation and keeps shape and dtype.
    rng = np.random.default_rng(11)
    make, act, slope = ACTS[name]
    x = (3 * rng.standard_normal((7, 9))).astype(dtype)
    y = make(dtype)(x)
    assert y.shape == x.shape and y.dtype == dtype
    tol = TOL32 if dtype == np.float32 else dict(rtol=1e-12, atol=1e-14)
    np.testing.assert_allclose(y, reference.activation(x, act, slope), **tol)


@pytest.mark.parametrize("name", list(ACTS))
def test_activation_3d_and_any_width(name):
    # Check that activations take (B, T, d) inputs of any d and give back the same shapes,
    # equal to the 2-D computation.
    rng = np.random.default_rng(12)
    make, _, _ = ACTS[name]
    m = make(np.float64)
    for d in (3, 8):
        x, dy = rng.standard_normal((2, 5, d)), rng.standard_normal((2, 5, d))
        y, dx = m(x).copy(), m.backward(dy).copy()
        assert y.shape == x.shape and dx.shape == x.shape
        np.testing.assert_allclose(m(x.reshape(10, d)), y.reshape(10, d), rtol=1e-14)
        np.testing.assert_allclose(m.backward(dy.reshape(10, d)), dx.reshape(10, d), rtol=1e-14)


@pytest.mark.parametrize("name", list(ACTS))
def test_activation_float32_agrees_with_float64(name):
    # Check float32 forward and backward against float64 to float32 tolerance.
    rng = np.random.default_rng(13)
    make, _, _ = ACTS[name]
    x, dy = _away_from_kinks(rng, (16, 12)), rng.standard_normal((16, 12))
    m32, m64 = make(np.float32), make(np.float64)
    np.testing.assert_allclose(m32(x.astype(np.float32)), m64(x), rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(m32.backward(dy.astype(np.float32)), m64.backward(dy), rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("name", list(ACTS))
def test_activation_batch_size_changes(name):
    # Check that large, small, large batches give the same numbers as a fresh module.
    rng = np.random.default_rng(14)
    make, _, _ = ACTS[name]
    m = make(np.float64)
    for n in (20, 3, 20):
        x, dy = rng.standard_normal((n, 4)), rng.standard_normal((n, 4))
        fresh = make(np.float64)
        np.testing.assert_array_equal(m(x), fresh(x))
        np.testing.assert_array_equal(m.backward(dy), fresh.backward(dy))


@pytest.mark.parametrize("name", list(ACTS))
def test_activation_bad_input(name):
    # Check wrong dtype, 1-D input, backward before forward and a misshapen dy: each a clear
    # error, and the cached forward input survives a rejected call.
    make, _, _ = ACTS[name]
    m = make(np.float32)
    with pytest.raises(RuntimeError, match=type(m).__name__):
        m.backward(np.ones((2, 3), np.float32))
    with pytest.raises(TypeError, match="float32"):
        m(np.ones((2, 3), np.float64))
    with pytest.raises(ValueError, match="shape"):
        m(np.ones(3, np.float32))
    with pytest.raises(RuntimeError):  # still nothing cached after the rejected calls
        m.backward(np.ones((2, 3), np.float32))
    x = np.linspace(-2, 2, 6, dtype=np.float32).reshape(2, 3)
    m(x)
    expected = make(np.float32)
    expected(x)
    with pytest.raises(ValueError, match="dy"):
        m.backward(np.ones((3, 2), np.float32))
    with pytest.raises(TypeError):
        m(np.ones((2, 3), np.int64))
    dy = np.ones((2, 3), np.float32)
    np.testing.assert_array_equal(m.backward(dy), expected.backward(dy))


@pytest.mark.parametrize("name", list(ACTS))
def test_activation_does_not_write_its_inputs(name):
    # Check that forward leaves x and backward leaves dy untouched.
    rng = np.random.default_rng(15)
    m = ACTS[name][0](np.float32)
    x, dy = rng.standard_normal((5, 4)).astype(np.float32), rng.standard_normal((5, 4)).astype(np.float32)
    x0, dy0 = x.copy(), dy.copy()
    m(x)
    m.backward(dy)
    np.testing.assert_array_equal(x, x0)
    np.testing.assert_array_equal(dy, dy0)


def test_identity_passes_arrays_through():
    # Check that Identity returns its input and dy themselves (no copy, no buffer).
    m = Identity()
    x, dy = np.ones((2, 3), np.float32), np.ones((2, 3), np.float32)
    assert m(x) is x and m.backward(dy) is dy


def test_activation_constructor_errors_and_repr():
    # Check GELU's approximate choices and that reprs show the options.
    with pytest.raises(ValueError, match="approximate"):
        GELU("fast")
    assert "tanh" in repr(GELU("tanh")) and "0.2" in repr(LeakyReLU(0.2))
    with pytest.raises(TypeError, match="dtype"):
        ReLU(dtype=np.int32)


# ----------------------------------------------------------------------------- Sequential
def _seq(dtype=np.float64, rng=0):
    return Sequential(Linear(5, 8, dtype=dtype, rng=rng), GELU(dtype=dtype),
                      Linear(8, 6, init="xavier", dtype=dtype, rng=rng + 1), Tanh(dtype=dtype),
                      Linear(6, 3, dtype=dtype, rng=rng + 2), LeakyReLU(0.1, dtype=dtype))


def test_sequential_gradcheck():
    # Check Sequential's input and parameter gradients against finite differences.
    rng = np.random.default_rng(20)
    s = _seq()
    for _, p in s.named_parameters():
        if p.data.ndim == 1:
            p.data[...] = rng.standard_normal(p.data.shape)
    check_module_grads(s, rng.standard_normal((4, 5)), rng)


def test_sequential_equals_manual_chain():
    # Check that Sequential's forward/backward is the manual chain of its children.
    rng = np.random.default_rng(21)
    s, parts = _seq(), list(_seq())
    x, dy = rng.standard_normal((5, 5)), rng.standard_normal((5, 3))
    h = x
    for m in parts:
        h = m(h)
    np.testing.assert_array_equal(s(x), h)
    g = dy
    for m in reversed(parts):
        g = m.backward(g)
    np.testing.assert_array_equal(s.backward(dy), g)


def test_sequential_container_protocol():
    # Check names "0.W", "2.W", ..., len, indexing (int, negative, slice) and iteration.
    s = _seq()
    assert [n for n, _ in s.named_parameters()] == ["0.W", "0.b", "2.W", "2.b", "4.W", "4.b"]
    assert len(s) == 6 and isinstance(s[1], GELU) and isinstance(s[-1], LeakyReLU)
    assert [type(m).__name__ for m in s] == ["Linear", "GELU", "Linear", "Tanh", "Linear", "LeakyReLU"]
    sub = s[:2]
    assert isinstance(sub, Sequential) and len(sub) == 2 and sub[0] is s[0]
    assert s.num_parameters() == 5 * 8 + 8 + 8 * 6 + 6 + 6 * 3 + 3
    assert "Linear(d_in=5, d_out=8" in repr(s)
    with pytest.raises(TypeError, match="modules"):
        Sequential(Linear(2, 2), "relu")


def test_sequential_backward_before_forward():
    # Check that Sequential.backward before forward is a RuntimeError naming Sequential.
    with pytest.raises(RuntimeError, match="Sequential"):
        _seq().backward(np.zeros((1, 3)))


def test_sequential_3d_and_batch_changes():
    # Check (B, T, d) inputs and large/small/large batches against fresh Sequentials.
    rng = np.random.default_rng(22)
    s = _seq()
    for shape in ((16, 5), (2, 3, 5), (16, 5), (1, 5)):
        x = rng.standard_normal(shape)
        dy = rng.standard_normal(shape[:-1] + (3,))
        fresh = _seq()
        y = s(x)
        assert y.shape == shape[:-1] + (3,)
        np.testing.assert_array_equal(y, fresh(x))
        s.zero_grad()
        np.testing.assert_array_equal(s.backward(dy), fresh.backward(dy))
        for (_, p), (_, q) in zip(s.named_parameters(), fresh.named_parameters()):
            np.testing.assert_array_equal(p.grad, q.grad)


def test_sequential_state_dict_round_trip_and_strictness():
    # Check a state-dict round trip between two Sequentials, and that a wrong shape changes
    # nothing.
    a, b = _seq(rng=0), _seq(rng=5)
    b.load_state_dict(a.state_dict())
    x = np.ones((2, 5))
    np.testing.assert_array_equal(a(x), b(x))
    sd = a.state_dict()
    sd["0.W"] = np.zeros((8, 5))
    sd["4.b"] = np.full(3, 7.0)
    before = b.state_dict()
    with pytest.raises(ValueError, match="0.W"):
        b.load_state_dict(sd)
    for n, v in before.items():
        np.testing.assert_array_equal(b.state_dict()[n], v)


def test_linear_chain_training_step_allocates_nothing():
    # Check that after warm-up a forward/backward/zero_grad loop of Linear layers (gemm only)
    # allocates no array: every array here is >= 16 KiB, and the traced peak (views and other
    # small Python objects) stays under 4 KiB.
    rng = np.random.default_rng(23)
    s = Sequential(Linear(64, 64, rng=0), Linear(64, 32, rng=1))
    x = rng.standard_normal((128, 64)).astype(np.float32)
    dy = rng.standard_normal((128, 32)).astype(np.float32)
    for _ in range(2):
        s(x)
        s.backward(dy)
    tracemalloc.start()
    try:
        for _ in range(5):
            s.zero_grad()
            s(x)
            s.backward(dy)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert peak < 4096, peak


def _one_backward_cases():
    return [
        ("Linear", lambda: Linear(4, 3, dtype=np.float64, rng=0)),
        ("ReLU", lambda: ReLU(dtype=np.float64)),
        ("GELU", lambda: GELU(dtype=np.float64)),
        ("Identity", lambda: Identity(dtype=np.float64)),
        ("Sequential", lambda: Sequential(Linear(4, 3, dtype=np.float64, rng=0),
                                          Tanh(dtype=np.float64))),
        ("MLP", lambda: MLP([4, 5, 3], ["relu", None], dtype=np.float64, rng=0)),
    ]


@pytest.mark.parametrize("name,make", _one_backward_cases())
def test_each_forward_allows_one_backward(name, make):
    # Check that a second backward after one forward raises RuntimeError (the rule of the
    # blocks, and PyTorch's default) and that the gradients of the first are left unchanged;
    # a new forward allows a backward again.
    rng = np.random.default_rng(3)
    m = make()
    x = rng.standard_normal((6, 4))
    y = m.forward(x)
    dy = rng.standard_normal(y.shape)
    m.backward(dy)
    grads = [p.grad.copy() for p in m.parameters()]
    with pytest.raises(RuntimeError, match=f"^{type(m).__name__}.backward: .*one backward"):
        m.backward(dy)
    for g, p in zip(grads, m.parameters()):
        np.testing.assert_array_equal(p.grad, g)
    m.forward(x)
    m.backward(dy)

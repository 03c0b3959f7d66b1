"""Softmax and LogSoftmax: the row-wise kernels against kernels.reference, the layers by
finite differences, as Linear/MLP activations (fused equals unfused), MLP's per-layer
activation options, bad input, and a steady step's allocations."""
import numpy as np
import pytest
from gradcheck import check_module_grads
from test_step_alloc import _check_two_sizes

from engine import (GELU, MLP, Identity, LeakyReLU, Linear, LogSoftmax, MSELoss, ReLU,
                    Sequential, Softmax)
from kernels import reference, softmax

KERNELS = {
    "softmax": (softmax.softmax_forward, softmax.softmax_backward,
                reference.softmax_forward, reference.softmax_backward),
    "log_softmax": (softmax.log_softmax_forward, softmax.log_softmax_backward,
                    reference.log_softmax_forward, reference.log_softmax_backward),
}
# float32 atol: the backward's dy - sum(dy y) cancels, and its row sum (O(1) here) is summed
# in another order than the reference's: a few ulps of 1.
TOL = {np.float32: dict(rtol=2e-6, atol=1e-6), np.float64: dict(rtol=1e-13, atol=1e-15)}


# ----------------------------------------------------------------------------- kernels
@pytest.mark.parametrize("kind", list(KERNELS))
@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("shape", [(1, 1), (7, 5), (300, 37), (4100, 130)])
def test_kernels_match_reference(kind, dtype, shape):
    # Check forward and backward against the naive NumPy twins, from one row to arrays large
    # enough to be split over threads (4100 x 130 > 2 x 256 Ki elements).
    fwd, bwd, rfwd, rbwd = KERNELS[kind]
    rng = np.random.default_rng(0)
    x = (4 * rng.standard_normal(shape)).astype(dtype)
    dy = rng.standard_normal(shape).astype(dtype)
    y, yr = np.empty_like(x), np.empty_like(x)
    fwd(y, x)
    rfwd(yr, x)
    np.testing.assert_allclose(y, yr, **TOL[dtype])
    dx, dxr = np.empty_like(x), np.empty_like(x)
    bwd(dx, dy, y)
    rbwd(dxr, dy, y)
    # The row sum in dy - sum(...) is rounded in another order than the reference's: allow
    # a few ulps of the sum of |dy| over the row.
    row = np.abs(dy).astype(np.float64).sum(axis=1, keepdims=True)
    bound = TOL[dtype]["rtol"] * np.abs(dxr) + TOL[dtype]["atol"] + 4 * np.finfo(dtype).eps * row
    assert np.all(np.abs(dx.astype(np.float64) - dxr) <= bound)


@pytest.mark.parametrize("kind", list(KERNELS))
@pytest.mark.parametrize("width", [9, softmax.WIDE_ROWS + 5])
def test_kernels_run_in_place(kind, width):
    # Check that y may be x and dx may be dy, with the same results as separate arrays,
    # for rows of the eight-lane and of the 16-lane kernels.
    fwd, bwd, _, _ = KERNELS[kind]
    rng = np.random.default_rng(1)
    x, dy = rng.standard_normal((50, width)), rng.standard_normal((50, width))
    y = fwd(np.empty_like(x), x)
    dx = bwd(np.empty_like(x), dy, y)
    x2, dy2 = x.copy(), dy.copy()
    assert fwd(x2, x2) is x2 and bwd(dy2, dy2, y) is dy2
    np.testing.assert_array_equal(x2, y)
    np.testing.assert_array_equal(dy2, dx)


@pytest.mark.parametrize("kind", list(KERNELS))
def test_two_threads_give_the_bits_of_one(kind):
    # Check that rows split over two threads, each slot with its own lane scratch, come out
    # as on one thread (4100 x 130: wide rows, split at 2).
    from kernels import num_threads, parallel
    fwd, bwd, _, _ = KERNELS[kind]
    rng = np.random.default_rng(3)
    x, dy = (4 * rng.standard_normal((4100, 130))).astype(np.float32), rng.standard_normal(
        (4100, 130)).astype(np.float32)
    with num_threads(1):
        one = fwd(np.empty_like(x), x)
        done = bwd(np.empty_like(x), dy, one)
    before = parallel.handoffs()
    with num_threads(2):
        two = fwd(np.empty_like(x), x)
        dtwo = bwd(np.empty_like(x), dy, two)
    assert parallel.handoffs() > before
    np.testing.assert_array_equal(one, two)
    np.testing.assert_array_equal(done, dtwo)


def test_softmax_of_extreme_logits_is_finite_and_normalised():
    # Check that huge logits do not overflow (the row max is subtracted) and -inf gets 0.
    x = np.array([[1e4, 1e4 - 1.0, -np.inf], [-1e4, 0.0, 1e4]], np.float32)
    y = softmax.softmax_forward(np.empty_like(x), x)
    ly = softmax.log_softmax_forward(np.empty_like(x), x)
    e = np.exp(-1.0)
    np.testing.assert_allclose(y[0], [1 / (1 + e), e / (1 + e), 0.0], rtol=1e-6)
    np.testing.assert_allclose(y[1], [0.0, 0.0, 1.0])
    assert ly[0, 2] == -np.inf and np.isfinite(ly[1]).all()
    np.testing.assert_allclose(ly[0, :2], np.log(y[0, :2]), rtol=1e-6)


@pytest.mark.parametrize("call,exc,msg", [
    (lambda: softmax.softmax_forward(np.empty((3, 4)), np.ones((3, 5))), ValueError, "y"),
    (lambda: softmax.softmax_forward(np.empty((3, 4), np.float32), np.ones((3, 4))), TypeError,
     "y"),
    (lambda: softmax.softmax_forward(np.empty(4), np.ones(4)), ValueError, "x"),
    (lambda: softmax.softmax_backward(np.empty((2, 3)), np.ones((2, 3)),
                                      np.asfortranarray(np.ones((2, 3)))), ValueError, "y"),
])
def test_checked_kernels_reject_bad_arrays(call, exc, msg):
    # Check that the checked kernels name the bad argument.
    with pytest.raises(exc, match=msg):
        call()


def test_checked_backward_rejects_dx_overlapping_y():
    # Check that dx may not be y (y is read after dx is written).
    y = np.full((2, 3), 1 / 3)
    with pytest.raises(ValueError, match="dx"):
        softmax.softmax_backward(y, np.ones((2, 3)), y)


# ----------------------------------------------------------------------------- layers
@pytest.mark.parametrize("layer", [Softmax, LogSoftmax])
@pytest.mark.parametrize("shape", [(6, 4), (2, 3, 5)])
def test_layer_gradcheck(layer, shape):
    # Check the input gradient against central finite differences (float64, 2-D and 3-D).
    rng = np.random.default_rng(2)
    check_module_grads(layer(dtype=np.float64), rng.standard_normal(shape), rng)


def test_softmax_layer_forward_is_the_formula():
    # Check y = exp(x) / sum(exp(x)) per row, and LogSoftmax = log of it.
    rng = np.random.default_rng(3)
    x = rng.standard_normal((4, 7))
    e = np.exp(x)
    np.testing.assert_allclose(Softmax(dtype=np.float64)(x), e / e.sum(1, keepdims=True),
                               rtol=1e-14)
    np.testing.assert_allclose(LogSoftmax(dtype=np.float64)(x),
                               np.log(e / e.sum(1, keepdims=True)), rtol=1e-13, atol=1e-14)


@pytest.mark.parametrize("act,layer", [("softmax", Softmax), ("log_softmax", LogSoftmax)])
def test_linear_rowwise_activation_equals_linear_then_layer(act, layer):
    # Check that Linear(activation="softmax") equals Linear followed by the Softmax layer, in
    # forward, input gradient and weight gradients.
    rng = np.random.default_rng(4)
    fused = Linear(5, 4, activation=act, dtype=np.float64, rng=0)
    plain = Linear(5, 4, dtype=np.float64, rng=0)
    fused.b.data[...] = plain.b.data[...] = rng.standard_normal(4)
    twin = Sequential(plain, layer(dtype=np.float64))
    x, dy = rng.standard_normal((3, 2, 5)), rng.standard_normal((3, 2, 4))
    np.testing.assert_allclose(fused(x), twin(x), rtol=1e-14)
    np.testing.assert_allclose(fused.backward(dy), twin.backward(dy), rtol=1e-12, atol=1e-15)
    np.testing.assert_allclose(fused.W.grad, plain.W.grad, rtol=1e-12)
    np.testing.assert_allclose(fused.b.grad, plain.b.grad, rtol=1e-12, atol=1e-15)


@pytest.mark.parametrize("last", ["softmax", "log_softmax", Softmax(), LogSoftmax()])
def test_mlp_with_rowwise_last_layer_gradcheck(last):
    # Check an MLP ending in a row-wise activation (by name or as a layer) against finite
    # differences, and that softmax rows sum to one.
    rng = np.random.default_rng(5)
    m = MLP([4, 6, 3], ["tanh", last], dtype=np.float64, rng=0)
    check_module_grads(m, rng.standard_normal((5, 4)), rng)
    y = m(rng.standard_normal((5, 4)))
    total = np.exp(y).sum(1) if m.activations[-1] == "log_softmax" else y.sum(1)
    np.testing.assert_allclose(total, 1.0, rtol=1e-13)


def test_mlp_rowwise_activation_on_a_hidden_layer():
    # Check that a softmax may sit on any layer, not only the last (the gradients still match
    # finite differences).
    rng = np.random.default_rng(6)
    m = MLP([4, 5, 5, 2], ["softmax", "relu", None], dtype=np.float64, rng=1)
    check_module_grads(m, rng.standard_normal((3, 4)), rng)


def test_mlp_per_layer_activation_modules():
    # Check that activation modules give their own options per layer (two leaky slopes,
    # GELU's tanh form) and build the same network as the unfused layer list.
    rng = np.random.default_rng(7)
    acts = [LeakyReLU(0.3), LeakyReLU(0.05), GELU("tanh"), Identity(), ReLU()]
    m = MLP([3, 6, 6, 6, 6, 2], acts, dtype=np.float64, rng=0)
    assert m.activations == ["leaky_relu", "leaky_relu", "gelu_tanh", None, "relu"]
    assert [lin.negative_slope for lin in m][:2] == [0.3, 0.05]
    mods = []
    for lin, a in zip(m, acts):
        twin = Linear(lin.d_in, lin.d_out, dtype=np.float64)
        twin.load_state_dict(lin.state_dict())
        mods.append(twin)
        mods.append(type(a)(*([a.negative_slope] if isinstance(a, LeakyReLU) else
                              ["tanh"] if isinstance(a, GELU) else []), dtype=np.float64))
    unfused = Sequential(*mods)
    x = rng.standard_normal((9, 3))
    np.testing.assert_allclose(m(x), unfused(x), rtol=1e-13, atol=1e-15)
    check_module_grads(m, rng.standard_normal((4, 3)) + 0.05, rng)


@pytest.mark.parametrize("entry,exc,msg", [
    ("softplus", ValueError, r"activations\[1\]"),
    (object(), TypeError, r"activations\[1\]"),
    (np.tanh, TypeError, r"activations\[1\]"),
])
def test_mlp_rejects_unknown_activation_entries(entry, exc, msg):
    # Check that an unknown name or a non-activation object is rejected, naming the entry.
    with pytest.raises(exc, match=msg):
        MLP([3, 4, 2], ["relu", entry])


def test_linear_rejects_unknown_activation():
    # Check that Linear names the activation argument and lists both kinds of names.
    with pytest.raises(ValueError, match="activation.*softmax"):
        Linear(3, 2, activation="softmin")


# ----------------------------------------------------------------------------- allocation
def _mlp_softmax(rng, k):
    m = MLP([32 * k, 64 * k, 16 * k], ["gelu", "softmax"], rng=0)
    x = rng.standard_normal((4, 16 * k, 32 * k)).astype(np.float32)
    t = rng.standard_normal((4, 16 * k, 16 * k)).astype(np.float32)
    return m, x, t, MSELoss()


def _layers(rng, k):
    m = Sequential(Linear(32 * k, 48 * k, rng=0), LogSoftmax(), Linear(48 * k, 24 * k, rng=1),
                   Softmax())
    x = rng.standard_normal((64 * k, 32 * k)).astype(np.float32)
    t = rng.standard_normal((64 * k, 24 * k)).astype(np.float32)
    return m, x, t, MSELoss()


@pytest.mark.parametrize("make", [_mlp_softmax, _layers], ids=["MLP-softmax", "layers"])
def test_steady_step_allocates_no_array(make):
    # Check that a steady training step with row-wise activations allocates no array over
    # 1 KiB (tracemalloc at two sizes, as tests/nn/test_step_alloc.py).
    _check_two_sizes(make.__name__, make, threads=1)

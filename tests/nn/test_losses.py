"""engine.nn.losses: MSELoss and CrossEntropyLoss against independent math and finite
differences; (B, T, C) logits, buffers, bad input."""
import numpy as np
import pytest
from gradcheck import numeric_grad

from engine import CrossEntropyLoss, MSELoss


def _ce_by_hand(logits, target):
    """Mean cross-entropy from first principles, float64 (log-sum-exp with a max shift)."""
    z = logits.astype(np.float64).reshape(-1, logits.shape[-1])
    m = z.max(1, keepdims=True)
    logp = z - m - np.log(np.exp(z - m).sum(1, keepdims=True))
    if np.issubdtype(target.dtype, np.integer):
        t = target.reshape(-1)
        return -logp[np.arange(len(t)), t].mean()
    return -(target.reshape(z.shape) * logp).sum(1).mean()


def _loss_fd_check(loss, pred, target):
    """backward() of ``loss`` against central finite differences of forward (float64)."""
    loss(pred, target)
    d = loss.backward().copy()
    assert d.shape == pred.shape
    num = numeric_grad(lambda: loss(pred, target), pred)
    np.testing.assert_allclose(d, num, rtol=1e-6, atol=1e-9)


# ----------------------------------------------------------------------------- MSE
@pytest.mark.parametrize("shape", [(7, 3), (2, 4, 3), (5,)])
def test_mse_forward_is_mean_squared_error(shape):
    # Check the value mean((pred - target)^2) over all elements, for 1-, 2- and 3-D shapes.
    rng = np.random.default_rng(40)
    p, t = rng.standard_normal(shape), rng.standard_normal(shape)
    assert MSELoss()(p, t) == pytest.approx(np.mean((p - t) ** 2), rel=1e-12)


@pytest.mark.parametrize("shape", [(6, 4), (2, 3, 2), (5,)])
def test_mse_backward_finite_differences(shape):
    # Check dpred against finite differences of the loss.
    rng = np.random.default_rng(41)
    _loss_fd_check(MSELoss(), rng.standard_normal(shape), rng.standard_normal(shape))


def test_mse_float32():
    # Check float32 value and gradient against float64 to float32 tolerance.
    rng = np.random.default_rng(42)
    p, t = rng.standard_normal((30, 5)), rng.standard_normal((30, 5))
    l32, l64 = MSELoss(), MSELoss()
    assert l32(p.astype(np.float32), t.astype(np.float32)) == pytest.approx(l64(p, t), rel=1e-5)
    d32 = l32.backward()
    assert d32.dtype == np.float32
    np.testing.assert_allclose(d32, l64.backward(), rtol=1e-5, atol=1e-7)


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("shape", [(64, 9), (3, 5, 7)])
def test_mse_backward_is_the_gradient_of_the_last_forward(dtype, shape):
    # Check that backward (whose gradient forward computes in the same pass) returns
    # 2 (pred - target) / size of the last forward, in pred's shape and dtype.
    rng = np.random.default_rng(43)
    loss = MSELoss()
    for _ in range(2):  # the second forward must replace the first one's gradient
        p = rng.standard_normal(shape).astype(dtype)
        t = rng.standard_normal(shape).astype(dtype)
        loss(p, t)
    d = loss.backward()
    assert d.shape == shape and d.dtype == dtype
    ref = (2.0 * (p.astype(np.float64) - t) / p.size)
    np.testing.assert_allclose(d, ref, rtol=1e-6 if dtype == np.float32 else 1e-14, atol=0)


def test_mse_second_backward_raises():
    # Check that a loss follows the rule of every module: one backward per forward (a
    # second one raises RuntimeError; the next forward allows one again).
    rng = np.random.default_rng(44)
    p, t = rng.standard_normal((10, 4)), rng.standard_normal((10, 4))
    loss = MSELoss()
    loss(p, t)
    d1 = loss.backward().copy()
    with pytest.raises(RuntimeError, match="one backward"):
        loss.backward()
    loss(p, t)
    np.testing.assert_array_equal(loss.backward(), d1)


def test_mse_rejected_forward_keeps_previous_gradient():
    # Check that a forward rejected for a bad target leaves the previous forward's backward
    # intact.
    rng = np.random.default_rng(45)
    p, t = rng.standard_normal((6, 3)), rng.standard_normal((6, 3))
    loss = MSELoss()
    loss(p, t)
    with pytest.raises(ValueError):
        loss(p, np.ones((3, 6)))
    np.testing.assert_allclose(loss.backward(), 2.0 * (p - t) / p.size, rtol=1e-14, atol=0)


@pytest.mark.parametrize("pred,target,exc,msg", [
    (np.ones((3, 2)), np.ones((2, 3)), ValueError, "target.*shape"),
    (np.ones((3, 2)), np.ones((3, 2), np.float32), TypeError, "target.*float64"),
    (np.ones((3, 2), np.int64), np.ones((3, 2), np.int64), TypeError, "pred"),
    ([[1.0]], np.ones((1, 1)), TypeError, "pred.*ndarray"),
    (np.ones((0, 2)), np.ones((0, 2)), ValueError, "pred"),
    (np.ones((4, 4))[:, ::2], np.ones((4, 2)), ValueError, "contiguous"),
])
def test_mse_bad_input(pred, target, exc, msg):
    # Check that mismatched or wrong inputs raise clear errors naming the argument.
    with pytest.raises(exc, match=msg):
        MSELoss()(pred, target)


def test_mse_dtype_pinned():
    # Check that MSELoss(dtype=float32) refuses float64 predictions.
    with pytest.raises(TypeError, match="float32"):
        MSELoss(dtype=np.float32)(np.ones((2, 2)), np.ones((2, 2)))


# ----------------------------------------------------------------------------- cross-entropy
@pytest.mark.parametrize("dtype", [np.float64, np.float32])
def test_ce_labels_forward(dtype):
    # Check the loss with integer labels against log-sum-exp by hand, and probs = softmax.
    rng = np.random.default_rng(43)
    z = (3 * rng.standard_normal((9, 5))).astype(dtype)
    y = rng.integers(0, 5, 9)
    ce = CrossEntropyLoss()
    tol = 1e-12 if dtype == np.float64 else 1e-5
    assert ce(z, y) == pytest.approx(_ce_by_hand(z, y), rel=tol)
    e = np.exp(z.astype(np.float64) - z.max(1, keepdims=True))
    np.testing.assert_allclose(ce.probs, e / e.sum(1, keepdims=True), rtol=tol * 10, atol=tol)


def test_ce_large_logits_are_stable():
    # Check that huge logits give a finite loss (the max shift) equal to the shifted problem.
    z = np.array([[1000.0, 1001.0, 999.0]])
    ce = CrossEntropyLoss()
    assert ce(z, np.array([1])) == pytest.approx(ce(z - 1000.0, np.array([1])), rel=1e-12)


@pytest.mark.parametrize("kind", ["labels", "probs"])
def test_ce_backward_finite_differences(kind):
    # Check dlogits against finite differences, for labels and for probability targets.
    rng = np.random.default_rng(44)
    z = rng.standard_normal((6, 4))
    if kind == "labels":
        t = rng.integers(0, 4, 6)
    else:
        t = rng.random((6, 4))
        t /= t.sum(1, keepdims=True)
    _loss_fd_check(CrossEntropyLoss(), z, t)


def test_ce_probability_targets_match_one_hot_labels():
    # Check that one-hot probability targets give the labels' loss and gradient.
    rng = np.random.default_rng(45)
    z, y = rng.standard_normal((7, 3)), rng.integers(0, 3, 7)
    onehot = np.eye(3)[y]
    a, b = CrossEntropyLoss(), CrossEntropyLoss()
    assert a(z, y) == pytest.approx(b(z, onehot), rel=1e-12)
    np.testing.assert_allclose(a.backward(), b.backward(), rtol=1e-12, atol=1e-15)


def test_ce_soft_targets_value():
    # Check the value with soft targets against -sum(t * log softmax) by hand.
    rng = np.random.default_rng(46)
    z, t = rng.standard_normal((5, 4)), rng.dirichlet(np.ones(4), 5)
    assert CrossEntropyLoss()(z, t) == pytest.approx(_ce_by_hand(z, t), rel=1e-12)


@pytest.mark.parametrize("kind", ["labels", "probs"])
def test_ce_3d_logits(kind):
    # Check (B, T, C) logits with (B, T) labels (or (B, T, C) probs): the mean over all
    # positions, equal to the flattened call, with a (B, T, C) gradient checked by FD.
    rng = np.random.default_rng(47)
    z = rng.standard_normal((2, 3, 4))
    t = rng.integers(0, 4, (2, 3)) if kind == "labels" else rng.dirichlet(np.ones(4), (2, 3))
    ce, flat = CrossEntropyLoss(), CrossEntropyLoss()
    loss = ce(z, t)
    assert loss == pytest.approx(_ce_by_hand(z, t), rel=1e-12)
    assert loss == pytest.approx(flat(z.reshape(6, 4), t.reshape(6, *t.shape[2:])), rel=1e-14)
    d = ce.backward()
    assert d.shape == (2, 3, 4)
    np.testing.assert_allclose(d.reshape(6, 4), flat.backward(), rtol=1e-14)
    _loss_fd_check(CrossEntropyLoss(), z, t)


def test_ce_reuses_buffers_and_handles_batch_changes():
    # Check that backward reuses its buffer and that large/small/large batches give the same
    # numbers as a fresh loss.
    rng = np.random.default_rng(48)
    ce = CrossEntropyLoss()
    prev = None
    for n in (16, 3, 16):
        z, y = rng.standard_normal((n, 5)), rng.integers(0, 5, n)
        fresh = CrossEntropyLoss()
        assert ce(z, y) == fresh(z, y)
        d = ce.backward()
        np.testing.assert_array_equal(d, fresh.backward())
        if prev is not None:
            assert np.shares_memory(d, prev)
        prev = d


def test_ce_float32_agrees_with_float64():
    # Check float32 loss and gradient against float64 to float32 tolerance.
    rng = np.random.default_rng(49)
    z, y = 2 * rng.standard_normal((40, 10)), rng.integers(0, 10, 40)
    a, b = CrossEntropyLoss(), CrossEntropyLoss()
    assert a(z.astype(np.float32), y) == pytest.approx(b(z, y), rel=1e-5)
    np.testing.assert_allclose(a.backward(), b.backward(), rtol=1e-4, atol=1e-7)


@pytest.mark.parametrize("loss", [MSELoss, CrossEntropyLoss])
def test_backward_before_forward(loss):
    # Check that backward before forward is a RuntimeError naming the loss.
    with pytest.raises(RuntimeError, match=loss.__name__):
        loss().backward()


@pytest.mark.parametrize("pred,target,exc,msg", [
    (np.ones((3, 4)), np.array([0, 1]), ValueError, r"target.*\(3,\)"),  # label count
    (np.ones((3, 4)), np.array([0, 1, 4]), ValueError, r"\[0, 4\)"),  # label out of range
    (np.ones((3, 4)), np.array([0, -1, 2]), ValueError, r"\[0, 4\)"),  # negative label
    (np.ones((3, 4)), np.ones((3, 3)), ValueError, "target.*shape"),  # probs shape
    (np.ones((3, 4)), np.ones((3, 4), np.float32), TypeError, "target.*float64"),  # probs dtype
    (np.ones((3, 4)), np.array([True, False, True]), TypeError, "target"),  # bool labels
    (np.ones(4), np.array([0]), ValueError, "pred"),  # 1-D logits
    (np.ones((3, 4), np.int64), np.array([0, 1, 2]), TypeError, "pred"),  # int logits
    (np.ones((2, 3, 4)), np.array([0, 1]), ValueError, r"\(2, 3\)"),  # 3-D with (N,) labels
    (np.ones((3, 4)), [0, 1, 2], TypeError, "target"),  # list target
])
def test_ce_bad_input(pred, target, exc, msg):
    # Check that mismatched or wrong inputs raise clear errors naming the argument.
    with pytest.raises(exc, match=msg):
        CrossEntropyLoss()(pred, target)


def test_ce_bad_input_keeps_previous_state():
    # Check that a rejected forward leaves the previous forward's backward intact.
    rng = np.random.default_rng(50)
    z, y = rng.standard_normal((4, 3)), rng.integers(0, 3, 4)
    ce, ref = CrossEntropyLoss(), CrossEntropyLoss()
    ce(z, y)
    ref(z, y)
    with pytest.raises(ValueError):
        ce(z, np.array([0, 1, 2, 3]))
    np.testing.assert_array_equal(ce.backward(), ref.backward())

"""The module protocol over every module kind (tests/support/modules_zoo.py), float64, (N, d) and
(B, T, d) inputs: arrays that alias a module's own work buffers are rejected with a
ValueError and change nothing (checked against a twin built from the same seed that never
saw the bad call); one backward per forward; ``forward(x, residual=r)`` and
``backward(dy, dx_acc=a)``, the fused options of the protocol, against the plain calls."""
import numpy as np
import pytest

from modules_zoo import (ADDNORM, CASES, LOSSES, SHAPES, SINGLE, SINGLE_OWNING, SQUARE,
                         array, assert_equal_outputs, assert_same_state, copy_out, lead,
                         pair, step_both)

TOL = dict(rtol=1e-13, atol=1e-13)


def _rejected(call):
    """Run ``call``; it must raise ValueError saying the array overlaps and to pass a copy."""
    with pytest.raises(ValueError, match="overlaps") as err:
        call()
    assert "copy" in str(err.value), str(err.value)


def _rejected_changing_nothing(m, twin, call, *bufs):
    """``call`` is rejected (``_rejected``) and leaves the arrays ``bufs``, m's parameters and
    its grads as they were (the twin's)."""
    before = [b.copy() for b in bufs]
    _rejected(call)
    for b, b0 in zip(bufs, before):
        np.testing.assert_array_equal(b, b0)
    assert_same_state(m, twin)


def _setup(name, seed, warm_shape=None):
    """The case, an rng from ``seed`` for the inputs, the module and its twin (same weights).
    With ``warm_shape``, both have run one forward + backward of the same inputs (so every
    work buffer exists) and m's input-gradient buffer from it (not a copy) comes last."""
    case, rng = CASES[name], np.random.default_rng(seed)
    m, twin = pair(name)
    dx = None
    if warm_shape is not None:
        x, dy = _draw(rng, warm_shape, case.d_in, case.d_out)
        _forward_both(m, twin, x)
        dx = m.backward(dy)
        twin.backward(dy)
    return case, rng, m, twin, dx


def _pending(name, seed, shape, other=None):
    """``_setup(name, seed, shape)`` (warmed up), then a fresh x and the same forward of it
    pending on both. Returns the case, m, twin, m's output y, the warm-up's input-gradient
    buffer and, with ``other`` ("d_in" or "d_out"), an array that wide drawn after x."""
    case, rng, m, twin, dx0 = _setup(name, seed, shape)
    x, *more = _draw(rng, shape, case.d_in, *([getattr(case, other)] if other else []))
    y = _forward_both(m, twin, x)
    return case, m, twin, y, dx0, (more[0] if more else None)


def _draw(rng, shape, *widths):
    """Fresh float64 arrays of leading shape ``lead(shape)``, one per last dimension."""
    return [array(rng, lead(shape), w) for w in widths]


def _forward_both(m, twin, *args):
    """The same forward on both modules; returns m's output (its buffer)."""
    y = m.forward(*args)
    twin.forward(*args)
    return y


def _same_backward(m, twin, dy, what="dx"):
    """The pending forward still differentiates as the twin's: same output and state."""
    assert_equal_outputs(copy_out(m.backward(dy)), copy_out(twin.backward(dy)), what)
    assert_same_state(m, twin)


def _same_grads(m, twin):
    """m's parameter grads are the twin's (to rounding)."""
    for (n, p), (_, q) in zip(m.named_parameters(), twin.named_parameters()):
        np.testing.assert_allclose(p.grad, q.grad, **TOL, err_msg=n)


# ----------------------------------------------------------------------------- forward x
@pytest.mark.parametrize("part, seed", [("all", 1), ("rows_from_1", 3)])
@pytest.mark.parametrize("shape", SHAPES)
@pytest.mark.parametrize("name", SQUARE)
def test_forward_rejects_own_output_as_input(name, shape, part, seed):
    # Check that y = m(x); m(y) raises, and so does m(y[1:]) (a smaller batch aliasing the
    # rows the next forward writes); y, parameters and grads stay as they were, and the next
    # forward/backward gives the twin's results.
    case, m, twin, y, _, _ = _pending(name, seed, shape)
    bad = y if part == "all" else y[1:]
    _rejected_changing_nothing(m, twin, lambda: m.forward(bad), y)
    step_both(m, twin, case, seed + 1, shape)


@pytest.mark.parametrize("shape", SHAPES)
@pytest.mark.parametrize("name", SINGLE_OWNING)
def test_forward_rejects_own_input_gradient_as_input(name, shape):
    # Check that the module's own input-gradient buffer (what backward returned) is
    # rejected as the next input, and nothing changes.
    case, rng, m, twin, dx = _setup(name, 5, shape)
    _rejected_changing_nothing(m, twin, lambda: m.forward(dx), dx)
    step_both(m, twin, case, 6, shape)


@pytest.mark.parametrize("name", SQUARE)
def test_rejected_forward_keeps_the_pending_forward(name):
    # Check that a rejected forward does not replace or drop the cache of the forward
    # before it: the backward that follows equals the twin's.
    case, rng, m, twin, _ = _setup(name, 7)
    x, dy = _draw(rng, "2d", case.d_in, case.d_out)
    y = _forward_both(m, twin, x)
    _rejected(lambda: m.forward(y))
    _same_backward(m, twin, dy)


# ----------------------------------------------------------------------------- residual
@pytest.mark.parametrize("shape", SHAPES)
@pytest.mark.parametrize("name", SINGLE_OWNING)
def test_forward_rejects_own_output_as_residual(name, shape):
    # Check that forward(x, residual=<the module's own output>) raises and changes nothing.
    case, m, twin, y, _, x2 = _pending(name, 8, shape, "d_in")
    _rejected_changing_nothing(m, twin, lambda: m.forward(x2, residual=y), y)
    step_both(m, twin, case, 9, shape)


@pytest.mark.parametrize("name", [n for n in SINGLE_OWNING if CASES[n].d_in == CASES[n].d_out])
def test_forward_rejects_own_input_gradient_as_residual(name):
    # Check that the module's input-gradient buffer (a child's, for composites) is rejected
    # as residual before anything runs: no child's cache or dropout draw changes.
    case, rng, m, twin, dx = _setup(name, 37, "2d")
    x, = _draw(rng, "2d", case.d_in)
    _rejected_changing_nothing(m, twin, lambda: m.forward(x, residual=dx), dx)
    step_both(m, twin, case, 38, "2d")


def _composites():
    """Composites whose first child maps (N, 6) -> (N, 6), with that child."""
    from engine import MLP, FFNSublayer, Linear, ReLU, Sequential
    f64 = np.float64
    return {
        "mlp": (lambda: MLP([6, 6, 6], ["tanh", None], dtype=f64, rng=0), lambda m: m[0]),
        "sequential": (lambda: Sequential(Linear(6, 6, dtype=f64, rng=0), ReLU(dtype=f64),
                                          Linear(6, 6, dtype=f64, rng=1)), lambda m: m[0]),
        "sublayer_pre": (lambda: FFNSublayer(6, 10, norm="pre", dtype=f64, rng=0),
                         lambda m: m.norm),
        "sublayer_post": (lambda: FFNSublayer(6, 10, norm="post", dtype=f64, rng=0),
                          lambda m: m.ffn),
    }


@pytest.mark.parametrize("name", ["mlp", "sequential", "sublayer_pre", "sublayer_post"])
def test_forward_rejects_a_childs_output_as_residual(name):
    # Check that a residual aliasing the output buffer of an earlier child is rejected: that
    # child rewrites it during the forward, before the residual is added.
    make, child = _composites()[name]
    m = make()
    rng = np.random.default_rng(39)
    x1, x2 = rng.standard_normal((5, 6)), rng.standard_normal((5, 6))
    h = child(m).forward(x1)  # a view of the child's output buffer
    h_copy = h.copy()
    try:
        got = np.array(m.forward(x2, residual=h), copy=True)
    except ValueError as err:
        assert "overlaps" in str(err), str(err)
        return
    pytest.fail("not rejected; forward(x2) + residual would be "
                f"{np.abs(got - (np.array(make().forward(x2)) + h_copy)).max():.3g} off")


@pytest.mark.parametrize("shape", SHAPES)
@pytest.mark.parametrize("name", SINGLE)
def test_residual_equals_forward_plus_residual(name, shape):
    # Check that forward(x, residual=r) == forward(x) + r, and that r is not written.
    case, rng, m, twin, _ = _setup(name, 10)
    x, r = _draw(rng, shape, case.d_in, case.d_out)
    r_before = r.copy()
    got = np.array(m.forward(x, residual=r), copy=True)
    want = np.array(twin.forward(x), copy=True) + r_before
    assert got.shape == want.shape
    np.testing.assert_allclose(got, want, **TOL)
    np.testing.assert_array_equal(r, r_before)


@pytest.mark.parametrize("shape", SHAPES)
@pytest.mark.parametrize("name", SINGLE)
def test_backward_after_residual_forward_is_the_plain_gradient(name, shape):
    # Check that the residual does not enter the module's gradients: backward after
    # forward(x, residual=r) gives the plain call's dx and parameter grads.
    case, rng, m, twin, _ = _setup(name, 11)
    x, r, dy = _draw(rng, shape, case.d_in, case.d_out, case.d_out)
    m.forward(x, residual=r)
    twin.forward(x)
    got, want = copy_out(m.backward(dy)), copy_out(twin.backward(dy))
    np.testing.assert_allclose(got, want, **TOL)
    _same_grads(m, twin)


# ----------------------------------------------------------------------------- backward dy
@pytest.mark.parametrize("shape", SHAPES)
@pytest.mark.parametrize("name", SINGLE_OWNING)
def test_backward_rejects_own_output_as_dy(name, shape):
    # Check that m.backward(y) with y = m(x) raises, changes nothing and does not use up
    # the forward: a correct backward afterwards equals the twin's.
    case, m, twin, y, _, dy = _pending(name, 12, shape, "d_out")
    _rejected_changing_nothing(m, twin, lambda: m.backward(y), y)
    _same_backward(m, twin, dy)
    step_both(m, twin, case, 13, shape)


# ----------------------------------------------------------------------------- dx_acc
@pytest.mark.parametrize("source", ["dx", "y"])
@pytest.mark.parametrize("shape", SHAPES)
@pytest.mark.parametrize("name", SINGLE_OWNING)
def test_backward_rejects_work_buffer_as_dx_acc(name, shape, source):
    # Check that dx_acc = a work buffer (the previous backward's dx, or the forward output
    # when it has x's shape) raises, changes nothing and leaves the forward to differentiate.
    case, m, twin, y, dx0, dy = _pending(name, 14, shape, "d_out")
    acc = dx0 if source == "dx" else y
    if acc.shape != dx0.shape:  # dx0 has x's shape
        pytest.skip("output shape differs from x's")
    _rejected_changing_nothing(m, twin, lambda: m.backward(dy, dx_acc=acc), acc, y)
    _same_backward(m, twin, dy)
    step_both(m, twin, case, 15, shape)


@pytest.mark.parametrize("shape", SHAPES)
@pytest.mark.parametrize("name", SINGLE)
def test_dx_acc_adds_the_input_gradient(name, shape):
    # Check that backward(dy, dx_acc=a) returns a itself holding a_before + dx, with the
    # parameter grads of the plain call.
    case, rng, m, twin, _ = _setup(name, 16)
    x, dy, a = _draw(rng, shape, case.d_in, case.d_out, case.d_in)
    a_before = a.copy()
    _forward_both(m, twin, x)
    got = m.backward(dy, dx_acc=a)
    assert got is a
    dx = np.array(twin.backward(dy), copy=True)
    np.testing.assert_allclose(a, a_before + dx, **TOL)
    _same_grads(m, twin)


@pytest.mark.parametrize("name", SINGLE)
def test_dx_acc_after_residual_forward(name):
    # Check the two fused options together (what a pre-norm residual stack does): forward
    # with a residual, then backward accumulating into the caller's buffer.
    case, rng, m, twin, _ = _setup(name, 17)
    x, r, dy, a = _draw(rng, "3d", case.d_in, case.d_out, case.d_out, case.d_in)
    a_before = a.copy()
    y = np.array(m.forward(x, residual=r), copy=True)
    np.testing.assert_allclose(y, np.array(twin.forward(x)) + r, **TOL)
    assert m.backward(dy, dx_acc=a) is a
    np.testing.assert_allclose(a, a_before + twin.backward(dy), **TOL)


@pytest.mark.parametrize("name", SINGLE)
def test_residual_may_be_the_input_itself(name):
    # Check that forward(x, residual=x) (both the caller's arrays) gives f(x) + x.
    case, rng, m, twin, _ = _setup(name, 30)
    if case.d_in != case.d_out:
        pytest.skip("residual must have the output's shape")
    x, = _draw(rng, "2d", case.d_in)
    x_before = x.copy()
    got = np.array(m.forward(x, residual=x), copy=True)
    np.testing.assert_allclose(got, np.array(twin.forward(x_before)) + x_before, **TOL)
    np.testing.assert_array_equal(x, x_before)


@pytest.mark.parametrize("name", SINGLE)
def test_dx_acc_that_is_dy_is_rejected_or_correct(name):
    # Check that backward(dy, dx_acc=dy) (the caller's one array as both) either raises
    # ValueError and changes nothing, or gives dy_before + dx and the plain parameter grads;
    # never a gradient computed from a half-overwritten dy.
    case, rng, m, twin, _ = _setup(name, 31)
    if case.d_in != case.d_out:
        pytest.skip("dx_acc must have the input's shape")
    x, dy = _draw(rng, "2d", case.d_in, case.d_out)
    dy_before = dy.copy()
    _forward_both(m, twin, x)
    dx = np.array(twin.backward(dy_before.copy()), copy=True)
    try:
        got = m.backward(dy, dx_acc=dy)
    except ValueError:
        np.testing.assert_array_equal(dy, dy_before)
        for n, p in m.named_parameters():
            assert not np.any(p.grad), n
        return
    assert got is dy
    np.testing.assert_allclose(dy, dy_before + dx, **TOL)
    _same_grads(m, twin)


def _bad_option(x_like, kind):
    if kind == "shape":
        return np.zeros((x_like.shape[0] + 1, *x_like.shape[1:]))
    if kind == "dtype":
        return np.zeros(x_like.shape, np.float32)
    if kind == "f_order":
        return np.asfortranarray(np.zeros(x_like.shape))
    return x_like.tolist()


OPTION_ERRORS = {"shape": ValueError, "dtype": TypeError, "f_order": ValueError,
                 "list": TypeError}


@pytest.mark.parametrize("kind", [k for k in OPTION_ERRORS if k != "f_order"])
@pytest.mark.parametrize("name", SINGLE)
def test_bad_residual_raises_and_changes_nothing(name, kind):
    # Check that a residual of the wrong shape, dtype, order or type raises (naming
    # "residual") and the module's state and next step are the twin's.
    case, rng, m, twin, _ = _setup(name, 32)
    x, = _draw(rng, "2d", case.d_in)
    bad = _bad_option(np.zeros((*lead("2d"), case.d_out)), kind)
    with pytest.raises(OPTION_ERRORS[kind], match="residual"):
        m.forward(x, residual=bad)
    assert_same_state(m, twin)
    step_both(m, twin, case, 33, "2d")


@pytest.mark.parametrize("name", SINGLE)
def test_f_order_residual_is_rejected_or_correct(name):
    # Check that a Fortran-ordered residual (the contract asks only for y's shape and dtype)
    # either raises ValueError naming it and changes nothing, or gives f(x) + r.
    case, rng, m, twin, _ = _setup(name, 35)
    x, r = _draw(rng, "2d", case.d_in, case.d_out)
    r = np.asfortranarray(r)
    try:
        got = np.array(m.forward(x, residual=r), copy=True)
    except ValueError as err:
        assert "residual" in str(err), str(err)
        assert_same_state(m, twin)
        step_both(m, twin, case, 36, "2d")
        return
    np.testing.assert_allclose(got, np.array(twin.forward(x)) + r, **TOL)


@pytest.mark.parametrize("kind", OPTION_ERRORS)
@pytest.mark.parametrize("name", SINGLE)
def test_bad_dx_acc_raises_and_changes_nothing(name, kind):
    # Check that a dx_acc of the wrong shape, dtype, order or type raises (naming
    # "dx_acc"), leaves the grads alone and does not use up the forward.
    case, rng, m, twin, _ = _setup(name, 34)
    x, dy = _draw(rng, "2d", case.d_in, case.d_out)
    bad = _bad_option(np.zeros_like(x), kind)
    _forward_both(m, twin, x)
    with pytest.raises(OPTION_ERRORS[kind], match="dx_acc"):
        m.backward(dy, dx_acc=bad)
    assert_same_state(m, twin)
    _same_backward(m, twin, dy)


# ----------------------------------------------------------------------------- one backward
@pytest.mark.parametrize("name", SINGLE + ADDNORM)
def test_second_backward_raises(name):
    # Check that a forward allows one backward: the second raises RuntimeError and leaves
    # the gradients of the first.
    case, rng, m, twin, _ = _setup(name, 18)
    x, dy = _draw(rng, "2d", case.d_in, case.d_out)
    args = (x, *_draw(rng, "2d", case.d_in)) if case.kind == "addnorm" else (x,)
    for mod in (m, twin):
        mod.forward(*args)
        mod.backward(dy)
    with pytest.raises(RuntimeError):
        m.backward(dy)
    assert_same_state(m, twin)


@pytest.mark.parametrize("name", SINGLE + ADDNORM + LOSSES)
def test_backward_before_forward_raises(name):
    # Check that backward on a fresh module raises RuntimeError.
    case = CASES[name]
    m = case.build(0)
    dy = np.ones((*lead("2d"), case.d_out))
    with pytest.raises(RuntimeError):
        m.backward() if case.kind == "loss" else m.backward(dy)


@pytest.mark.parametrize("name", LOSSES)
def test_loss_second_backward_raises(name):
    # Check that a loss follows the same rule: one backward per forward.
    m = CASES[name].build(0)
    pred, target = _loss_inputs(name, np.random.default_rng(19), "2d")
    m.forward(pred, target)
    m.backward()
    with pytest.raises(RuntimeError):
        m.backward()


# ----------------------------------------------------------------------------- AddNorm
def _addnorm_setup(name, shape, seed):
    """AddNorm and its twin after one forward + backward, then a pending forward of fresh
    (x, sub) on both; returns the case, m, twin, its output y and its (dx, dsub) buffers."""
    case, rng, m, twin, _ = _setup(name, seed)
    x, sub, dy = _draw(rng, shape, case.d_in, case.d_in, case.d_in)
    _forward_both(m, twin, x, sub)
    dxs = [mod.backward(dy) for mod in (m, twin)]
    x, sub = _draw(rng, shape, case.d_in, case.d_in)
    y = _forward_both(m, twin, x, sub)
    return case, m, twin, x, sub, y, dxs[0]


@pytest.mark.parametrize("which", ["x=y", "sub=y", "x=dx", "sub=dsub", "x=y[1:]"])
@pytest.mark.parametrize("shape", SHAPES)
@pytest.mark.parametrize("name", ADDNORM)
def test_addnorm_forward_rejects_own_buffers(name, shape, which):
    # Check that AddNorm rejects its own output or input-gradient buffers as x or sub, and
    # nothing changes (the pending forward still gives the twin's backward).
    case, m, twin, x, sub, y, (dx0, dsub0) = _addnorm_setup(name, shape, 20)
    dy = np.random.default_rng(21).standard_normal((*lead(shape), case.d_out))
    if which == "x=y[1:]":
        args = (y[1:], sub[1:].copy())
    else:
        bad = {"y": y, "dx": dx0, "dsub": dsub0}[which.split("=")[1]]
        args = (bad, sub) if which.startswith("x") else (x, bad)
    _rejected_changing_nothing(m, twin, lambda: m.forward(*args), y, dx0, dsub0)
    _same_backward(m, twin, dy, "dx, dsub")
    step_both(m, twin, case, 22, shape)


@pytest.mark.parametrize("which", ["y", "dx", "dsub"])
@pytest.mark.parametrize("shape", SHAPES)
@pytest.mark.parametrize("name", ADDNORM)
def test_addnorm_backward_rejects_own_buffers_as_dy(name, shape, which):
    # Check that AddNorm.backward rejects its own output or gradient buffers as dy, changes
    # nothing and leaves the forward to differentiate.
    case, m, twin, x, sub, y, (dx0, dsub0) = _addnorm_setup(name, shape, 23)
    dy = np.random.default_rng(24).standard_normal(y.shape)
    bad = {"y": y, "dx": dx0, "dsub": dsub0}[which]
    _rejected_changing_nothing(m, twin, lambda: m.backward(bad), y, dx0, dsub0)
    _same_backward(m, twin, dy, "dx, dsub")
    step_both(m, twin, case, 25, shape)


# ----------------------------------------------------------------------------- losses
def _loss_inputs(name, rng, shape, d=6):
    ld = lead(shape)
    pred = rng.standard_normal((*ld, d))
    if name == "cross_entropy":
        return pred, rng.integers(0, d, size=ld)
    return pred, rng.standard_normal((*ld, d))


@pytest.mark.parametrize("which", ["pred", "target", "probs"])
@pytest.mark.parametrize("shape", SHAPES)
@pytest.mark.parametrize("name", LOSSES)
def test_loss_own_gradient_buffer_as_input_is_rejected_or_correct(name, shape, which):
    # Check that a loss fed its own gradient buffer (what backward returned) or softmax as
    # pred, or its gradient buffer as (probability) target, either raises ValueError "overlaps" and keeps that buffer, or
    # returns the loss and gradient of a copy of it; never something else.
    rng = np.random.default_rng(26)
    m, twin = pair(name)
    pred, target = _loss_inputs(name, rng, shape)
    for mod in (m, twin):
        mod.forward(pred, target)
    g = m.backward()
    twin.backward()
    if which == "probs":  # CrossEntropyLoss's cached softmax, a work buffer too
        if name != "cross_entropy":
            pytest.skip("only CrossEntropyLoss exposes its softmax")
        g = m.probs
    if which in ("pred", "probs"):
        args, safe = (g, target), (g.copy(), target)
    else:
        probs = np.full(pred.shape, 1.0 / pred.shape[-1])
        g[...] = probs  # a valid probability target (or regression target) in the buffer
        args, safe = (pred, g), (pred, probs)
    g_before = g.copy()
    want_loss = twin.forward(*safe)
    want_grad = np.array(twin.backward(), copy=True)
    try:
        got_loss = m.forward(*args)
    except ValueError as err:
        assert "overlaps" in str(err), str(err)
        np.testing.assert_array_equal(g, g_before)
        return
    assert got_loss == pytest.approx(want_loss, rel=1e-13, abs=1e-15)
    np.testing.assert_allclose(m.backward(), want_grad, rtol=1e-13, atol=1e-15)

"""Optimizers against direct NumPy transcriptions of PyTorch's documented algorithms, their
state dicts, hyperparameter validation, and clip_grad_norm; AdamW.step's single kernel call
(one parallel region) against per-parameter kernel calls."""
import math

import numpy as np
import pytest
from probes import count_splits

import kernels
from engine import GMLP, SGD, AdamW, Linear, Parameter, clip_grad_norm
from kernels import optim as kopt
from kernels import parallel


def _params(rng, dtype=np.float64):
    """Three parameters of different shapes; the last one F-contiguous (as gMLP's W_gate)."""
    a = Parameter(rng.standard_normal((4, 3)).astype(dtype), "a")
    b = Parameter(rng.standard_normal(5).astype(dtype), "b")
    c = Parameter(np.asfortranarray(rng.standard_normal((3, 6))).astype(dtype, order="F"), "c")
    assert c.data.flags.f_contiguous and not c.data.flags.c_contiguous
    return [a, b, c]


def _grad(theta, t, k):
    """A gradient that depends on the parameter (so trajectories diverge on any bug) and on the
    step: g = theta^3 - 0.5 theta + sin(t + k + index)."""
    idx = np.arange(theta.size).reshape(theta.shape)
    return theta ** 3 - 0.5 * theta + np.sin(t + k + idx)


def _adamw_reference(thetas, groups, steps):
    """PyTorch's documented AdamW (torch.optim.AdamW, amsgrad=False, maximize=False):
        theta_t = theta_{t-1} - lr * lambda * theta_{t-1}
        m_t = b1 m_{t-1} + (1 - b1) g_t;   v_t = b2 v_{t-1} + (1 - b2) g_t^2
        m_hat = m_t / (1 - b1^t);          v_hat = v_t / (1 - b2^t)
        theta_t = theta_t - lr * m_hat / (sqrt(v_hat) + eps)
    ``groups[k]`` = (lr, b1, b2, eps, wd) for parameter k."""
    thetas = [t.copy() for t in thetas]
    m = [np.zeros_like(t) for t in thetas]
    v = [np.zeros_like(t) for t in thetas]
    for t in range(1, steps + 1):
        for k, theta in enumerate(thetas):
            lr, b1, b2, eps, wd = groups[k]
            g = _grad(theta, t, k)
            theta -= lr * wd * theta
            m[k] = b1 * m[k] + (1 - b1) * g
            v[k] = b2 * v[k] + (1 - b2) * g * g
            m_hat = m[k] / (1 - b1 ** t)
            v_hat = v[k] / (1 - b2 ** t)
            theta -= lr * m_hat / (np.sqrt(v_hat) + eps)
    return thetas, m, v


def _run(opt, params, steps):
    for t in range(1, steps + 1):
        for k, p in enumerate(params):
            p.grad[...] = _grad(p.data, t, k)
        opt.step()
        opt.zero_grad()


def test_adamw_matches_pytorch_algorithm_with_param_groups():
    # Check that AdamW with two parameter groups (weight decay on one, none on the other,
    # different lr and betas) follows PyTorch's documented algorithm for 10 float64 steps.
    rng = np.random.default_rng(0)
    ps = _params(rng)
    start = [p.data.copy() for p in ps]
    opt = AdamW([{"params": [ps[0], ps[2]], "weight_decay": 0.1},
                 {"params": [ps[1]], "weight_decay": 0.0, "lr": 3e-2, "betas": (0.8, 0.99)}],
                lr=1e-2, eps=1e-6)
    _run(opt, ps, 10)
    groups = [(1e-2, 0.9, 0.999, 1e-6, 0.1), (3e-2, 0.8, 0.99, 1e-6, 0.0),
              (1e-2, 0.9, 0.999, 1e-6, 0.1)]
    want, m, v = _adamw_reference(start, groups, 10)
    for k, p in enumerate(ps):
        np.testing.assert_allclose(p.data, want[k], rtol=1e-12, atol=1e-14, err_msg=p.name)
    # state indices count through the groups in order: a, c, b
    for idx, k in enumerate([0, 2, 1]):
        np.testing.assert_allclose(opt.state[idx]["exp_avg"], m[k], rtol=1e-12, atol=1e-14)
        np.testing.assert_allclose(opt.state[idx]["exp_avg_sq"], v[k], rtol=1e-12, atol=1e-14)
    assert opt.steps == 10


def test_adamw_defaults_are_pytorchs():
    # Check that the defaults are lr 1e-3, betas (0.9, 0.999), eps 1e-8, weight_decay 1e-2.
    opt = AdamW([Parameter(np.zeros(3))])
    g = opt.param_groups[0]
    assert (g["lr"], g["betas"], g["eps"], g["weight_decay"]) == (1e-3, (0.9, 0.999), 1e-8, 1e-2)


def test_adamw_updates_in_place_and_keeps_layout():
    # Check that step() writes into the parameter arrays themselves and that the moments of an
    # F-contiguous parameter are F-contiguous too (no hidden copies).
    ps = _params(np.random.default_rng(1), np.float32)
    arrays = [p.data for p in ps]
    opt = AdamW(ps)
    for p in ps:
        p.grad[...] = 1.0
    opt.step()
    for p, a in zip(ps, arrays):
        assert p.data is a
        assert np.all(p.data != 0)
    assert opt.state[2]["exp_avg"].flags.f_contiguous
    assert opt.state[2]["exp_avg_sq"].flags.f_contiguous


def test_adamw_on_gmlp_views_updates_the_combined_weight():
    # Check that updating gMLP's W_gate/W_proj (F-contiguous views of one weight) changes the
    # combined array the block's GEMM reads, exactly as an update of a C-ordered copy would.
    m = GMLP(4, 5, 6, 3, dtype=np.float64, rng=0)
    rng = np.random.default_rng(2)
    for p in m.parameters():
        p.grad[...] = rng.standard_normal(p.shape)
    copies = [Parameter(np.ascontiguousarray(p.data), grad=np.ascontiguousarray(p.grad))
              for p in m.parameters()]
    AdamW(m.parameters(), lr=0.1).step()
    AdamW(copies, lr=0.1).step()
    for p, c in zip(m.parameters(), copies):
        np.testing.assert_array_equal(p.data, c.data)
    np.testing.assert_array_equal(m.Wgp_T[:6].T, m.W_gate.data)

@pytest.fixture(autouse=True)
def _split_work_3mi(monkeypatch):
    # The split tests here run at the sizes of a 3 Mi element-pass threshold (what they test
    # is the split, not where the threshold lies; tests/kernels/test_parallel.py checks that).
    monkeypatch.setattr(parallel, "SPLIT_WORK", 3 * 1024 * 1024)



def _large_params(rng, dtype):
    """Parameters large enough for AdamW.step to split over two threads: a big C-order one,
    a big F-order one (as gMLP's W_gate), and small ones; random gradients."""
    n = parallel.SPLIT_WORK // kopt.ADAMW_COST // 2 + 1000
    ps = [Parameter(rng.standard_normal((n // 256 + 3, 256)).astype(dtype), "W1"),
          Parameter(rng.standard_normal(7).astype(dtype), "b1"),
          Parameter(np.asfortranarray(rng.standard_normal((96, n // 96 + 5)).astype(dtype)), "W2"),
          Parameter(rng.standard_normal(()).astype(dtype), "s")]
    with kernels.num_threads(2):
        assert parallel.threads_for(sum(p.size for p in ps), passes=kopt.ADAMW_COST) == 2
    return ps


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_adamw_step_is_one_region_with_the_bits_of_per_parameter_updates(monkeypatch, dtype):
    # Check that at two threads AdamW.step over two groups (different lr, betas, decay) makes
    # one parallel region per step and gives the same bits as kernels.adamw_update called on
    # each parameter with its group's options on one thread.
    regions = count_splits(monkeypatch)  # thread count of each split over > 1 thread
    rng = np.random.default_rng(11)
    ps = _large_params(rng, dtype)
    copies = [Parameter(p.data.copy(order="K"), p.name) for p in ps]
    groups = [dict(lr=1e-2, betas=(0.9, 0.999), eps=1e-8, weight_decay=0.1),
              dict(lr=3e-2, betas=(0.8, 0.99), eps=1e-6, weight_decay=0.0)]
    opt = AdamW([dict(params=[ps[0], ps[1]], **groups[0]), dict(params=[ps[2], ps[3]], **groups[1])])
    state = [(np.zeros_like(p.data), np.zeros_like(p.data)) for p in copies]
    for t in range(1, 4):
        for p, c in zip(ps, copies):
            p.grad[...] = c.grad[...] = rng.standard_normal(p.shape)
        with kernels.num_threads(2):
            opt.step()
        with kernels.num_threads(1):
            for k, (c, (m, v)) in enumerate(zip(copies, state)):
                g = groups[k // 2]
                kopt.adamw_update(c.data, c.grad, m, v, t, g["lr"], *g["betas"], g["eps"],
                                  g["weight_decay"])
    assert regions == [2] * 3
    for k, (p, c, (m, v)) in enumerate(zip(ps, copies, state)):
        np.testing.assert_array_equal(p.data, c.data, err_msg=p.name)
        np.testing.assert_array_equal(opt.state[k]["exp_avg"], m, err_msg=p.name)
        np.testing.assert_array_equal(opt.state[k]["exp_avg_sq"], v, err_msg=p.name)


def test_adamw_step_follows_assigned_arrays():
    # Check that assigning a parameter's data or grad between steps copies the values into
    # the arrays the optimizer updates: the next step reads and writes them, and the
    # assigned source array is left alone.
    rng = np.random.default_rng(12)
    ps = _params(rng)
    start = [p.data.copy() for p in ps]
    opt = AdamW(ps, lr=1e-2)
    _run(opt, ps, 2)
    source = np.asfortranarray(ps[0].data)  # same values, another layout
    ps[0].data = source
    ps[1].grad = np.zeros_like(ps[1].grad)
    before_source = source.copy()
    for k, p in enumerate(ps):  # the third step's gradients
        p.grad[...] = _grad(p.data, 3, k)
    opt.step()
    np.testing.assert_array_equal(source, before_source)  # the source array is left alone
    want, _, _ = _adamw_reference(start, [(1e-2, 0.9, 0.999, 1e-8, 1e-2)] * 3, 3)
    for k, p in enumerate(ps):
        np.testing.assert_allclose(p.data, want[k], rtol=1e-12, atol=1e-14, err_msg=p.name)


def _sgd_reference(thetas, lr, momentum, dampening, wd, nesterov, steps):
    """PyTorch's documented SGD:
        g = g + wd * theta (if wd != 0)
        b = g on step 1, else b = momentum * b + (1 - dampening) * g   (if momentum != 0)
        g = g + momentum * b if nesterov else b
        theta = theta - lr * g"""
    thetas = [t.copy() for t in thetas]
    bufs = [None] * len(thetas)
    for t in range(1, steps + 1):
        for k, theta in enumerate(thetas):
            g = _grad(theta, t, k)
            if wd != 0:
                g = g + wd * theta
            if momentum != 0:
                bufs[k] = g.copy() if t == 1 else momentum * bufs[k] + (1 - dampening) * g
                g = g + momentum * bufs[k] if nesterov else bufs[k]
            theta -= lr * g
    return thetas


@pytest.mark.parametrize("momentum,dampening,wd,nesterov", [
    (0.9, 0.0, 0.0, False), (0.9, 0.1, 0.05, False), (0.8, 0.0, 0.05, True), (0.0, 0.0, 0.1, False)])
def test_sgd_matches_pytorch_algorithm(momentum, dampening, wd, nesterov):
    # Check that SGD (momentum, dampening, weight decay, Nesterov) follows PyTorch's documented
    # algorithm for 10 float64 steps.
    ps = _params(np.random.default_rng(3))
    start = [p.data.copy() for p in ps]
    opt = SGD(ps, lr=0.05, momentum=momentum, weight_decay=wd, dampening=dampening,
              nesterov=nesterov)
    _run(opt, ps, 10)
    want = _sgd_reference(start, 0.05, momentum, dampening, wd, nesterov, 10)
    for k, p in enumerate(ps):
        np.testing.assert_allclose(p.data, want[k], rtol=1e-12, atol=1e-14, err_msg=p.name)


def test_lr_change_between_steps_takes_effect():
    # Check that writing param_groups[0]["lr"] (a schedule) changes the next update.
    p = Parameter(np.array([1.0, 2.0]))
    opt = SGD([p], lr=0.1)
    p.grad[...] = 1.0
    opt.step()
    opt.param_groups[0]["lr"] = 0.5
    opt.step()
    np.testing.assert_allclose(p.data, [1.0 - 0.1 - 0.5, 2.0 - 0.1 - 0.5], rtol=1e-15)


def test_zero_grad_clears_every_gradient():
    # Check that zero_grad() zeroes the gradients of all groups' parameters.
    ps = _params(np.random.default_rng(4))
    for p in ps:
        p.grad[...] = 3.0
    AdamW([{"params": ps[:1]}, {"params": ps[1:]}]).zero_grad()
    assert all(not p.grad.any() for p in ps)


# ----------------------------------------------------------------------------- state dicts
@pytest.mark.parametrize("make", [
    lambda ps: AdamW([{"params": ps[:2]}, {"params": ps[2:], "weight_decay": 0.0}], lr=1e-2),
    lambda ps: SGD(ps, lr=0.05, momentum=0.9, nesterov=True)])
def test_state_dict_round_trip_continues_identically(make):
    # Check that 4 steps, state_dict, load into a fresh optimizer over copies of the parameters,
    # then 5 more steps equals 9 uninterrupted steps, bit for bit.
    ps = _params(np.random.default_rng(5))
    start = [p.data.copy() for p in ps]
    ref = make(ps)
    _run(ref, ps, 9)

    qs = [Parameter(s.copy(order="K"), p.name) for s, p in zip(start, ps)]
    first = make(qs)
    _run(first, qs, 4)
    sd = first.state_dict()
    rs = [Parameter(q.data.copy(order="K"), q.name) for q in qs]
    second = make(rs)
    second.load_state_dict(sd)
    assert second.steps == 4
    for t in range(5, 10):
        for k, p in enumerate(rs):
            p.grad[...] = _grad(p.data, t, k)
        second.step()
        second.zero_grad()
    for p, r in zip(ps, rs):
        np.testing.assert_array_equal(r.data, p.data)


def test_state_dict_returns_copies():
    # Check that state_dict() holds copies: stepping afterwards does not change it.
    p = Parameter(np.ones(3))
    opt = AdamW([p])
    p.grad[...] = 1.0
    opt.step()
    sd = opt.state_dict()
    saved = sd["state"][0]["exp_avg"].copy()
    opt.step()
    np.testing.assert_array_equal(sd["state"][0]["exp_avg"], saved)


def _bad_state(kind):
    rng = np.random.default_rng(6)
    ps = _params(rng)
    src = AdamW(ps, lr=1e-2)
    for p in ps:
        p.grad[...] = 1.0
    src.step()
    sd = src.state_dict()
    if kind == "type":
        sd = SGD(ps, lr=0.1).state_dict()
    elif kind == "shape":
        sd["state"][1]["exp_avg"] = np.zeros(7)
    elif kind == "dtype":
        sd["state"][0]["exp_avg_sq"] = sd["state"][0]["exp_avg_sq"].astype(np.float32)
    elif kind == "missing_buffer":
        del sd["state"][2]["exp_avg_sq"]
    elif kind == "extra_buffer":
        sd["state"][2]["momentum_buffer"] = np.zeros((3, 6))
    elif kind == "groups":
        sd["param_groups"].append(dict(sd["param_groups"][0], params=[3]))
    elif kind == "bad_option":
        sd["param_groups"][0]["lr"] = -1.0
    elif kind == "missing_option":
        del sd["param_groups"][0]["eps"]
    elif kind == "bad_index":
        sd["state"][7] = sd["state"][0]
    elif kind == "steps":
        sd["steps"] = -3
    return sd


@pytest.mark.parametrize("kind", ["type", "shape", "dtype", "missing_buffer", "extra_buffer",
                                  "groups", "bad_option", "missing_option", "bad_index", "steps"])
def test_load_state_dict_rejects_mismatch_and_changes_nothing(kind):
    # Check that each kind of bad state dict raises a clear error and leaves the optimizer's
    # options, buffers and step count as they were.
    ps = _params(np.random.default_rng(7))
    opt = AdamW(ps, lr=5e-3)
    for p in ps:
        p.grad[...] = 0.5
    opt.step()
    before = opt.state_dict()
    with pytest.raises((ValueError, TypeError, KeyError)) as err:
        opt.load_state_dict(_bad_state(kind))
    assert "load_state_dict" in str(err.value)
    after = opt.state_dict()
    assert after["steps"] == before["steps"] == 1
    assert after["param_groups"] == before["param_groups"]
    for i in before["state"]:
        for k in before["state"][i]:
            np.testing.assert_array_equal(after["state"][i][k], before["state"][i][k])


def test_sgd_state_without_momentum_buffer_restarts_momentum():
    # Check that loading a state saved before the first step (no momentum buffers yet) makes
    # the next step a first step again (buffer = gradient), as in PyTorch.
    p = Parameter(np.zeros(2))
    opt = SGD([p], lr=1.0, momentum=0.5)
    fresh = opt.state_dict()
    p.grad[...] = 1.0
    opt.step()                       # p = -1, buf = 1
    opt.load_state_dict(fresh)
    assert opt.steps == 0 and "momentum_buffer" not in opt.state[0]
    opt.step()                       # buf = g = 1 again (not 0.5 * 1 + 1)
    np.testing.assert_array_equal(p.data, [-2.0, -2.0])


# ----------------------------------------------------------------------------- validation
@pytest.mark.parametrize("kwargs,match", [
    (dict(lr=-1e-3), "lr"), (dict(lr=float("nan")), "lr"), (dict(lr=float("inf")), "lr"),
    (dict(betas=(1.0, 0.999)), r"betas\[0\]"), (dict(betas=(0.9, -0.1)), r"betas\[1\]"),
    (dict(betas=(0.9,)), "betas"), (dict(eps=-1e-8), "eps"), (dict(weight_decay=-0.1), "weight_decay"),
    (dict(lr="0.1"), "lr")])
def test_adamw_rejects_bad_hyperparameters(kwargs, match):
    # Check that each invalid AdamW option raises an error naming it.
    with pytest.raises((ValueError, TypeError), match=match):
        AdamW([Parameter(np.zeros(2))], **kwargs)


@pytest.mark.parametrize("kwargs,match", [
    (dict(lr=-0.1), "lr"), (dict(lr=0.1, momentum=-0.9), "momentum"),
    (dict(lr=0.1, weight_decay=-1.0), "weight_decay"), (dict(lr=0.1, nesterov=True), "nesterov"),
    (dict(lr=0.1, momentum=0.9, dampening=0.1, nesterov=True), "nesterov")])
def test_sgd_rejects_bad_hyperparameters(kwargs, match):
    # Check that each invalid SGD option raises an error naming it.
    with pytest.raises(ValueError, match=match):
        SGD([Parameter(np.zeros(2))], **kwargs)


def test_bad_params_arguments():
    # Check the errors for an empty list, a module, a bare Parameter, a non-Parameter, a
    # parameter in two groups and an unknown group option.
    p, q = Parameter(np.zeros(2)), Parameter(np.zeros(3))
    with pytest.raises(ValueError, match="empty"):
        AdamW([])
    with pytest.raises(TypeError, match="parameters()"):
        AdamW(Linear(2, 3))
    with pytest.raises(TypeError, match="single Parameter"):
        AdamW(p)
    with pytest.raises(TypeError, match=r"params\[1\]"):
        AdamW([p, np.zeros(3)])
    with pytest.raises(ValueError, match="more than once"):
        AdamW([{"params": [p]}, {"params": [q, p]}])
    with pytest.raises(ValueError, match="weight_decy"):
        AdamW([{"params": [p], "weight_decy": 0.0}])
    with pytest.raises(ValueError, match="invalid|param group 1|lr"):
        AdamW([{"params": [p]}, {"params": [q], "lr": -1.0}])


def test_empty_group_is_allowed():
    # Check that an empty no-decay group (a model without biases) is accepted.
    p = Parameter(np.ones(2))
    opt = AdamW([{"params": [p]}, {"params": [], "weight_decay": 0.0}])
    p.grad[...] = 1.0
    opt.step()
    assert opt.steps == 1 and np.all(p.data < 1.0)


# ----------------------------------------------------------------------------- clipping
def test_clip_grad_norm_scales_to_max_norm():
    # Check that the returned norm is the global L2 norm before clipping (computed here over
    # the concatenated gradients) and that the clipped gradients have norm max_norm.
    ps = _params(np.random.default_rng(8))
    for p in ps:
        p.grad[...] = np.random.default_rng(9).standard_normal(p.shape) * 3
    grads = [p.grad.copy() for p in ps]
    want = np.sqrt(sum((g ** 2).sum() for g in grads))
    total = clip_grad_norm(ps, 1.0)
    assert math.isclose(total, want, rel_tol=1e-12)
    after = np.sqrt(sum((p.grad ** 2).sum() for p in ps))
    assert math.isclose(after, 1.0, rel_tol=1e-5)
    coef = 1.0 / (want + 1e-6)
    for p, g in zip(ps, grads):
        np.testing.assert_allclose(p.grad, g * coef, rtol=1e-12)


def test_clip_grad_norm_leaves_small_gradients():
    # Check that gradients whose norm is below max_norm are unchanged and stay the same arrays.
    p = Parameter(np.zeros((2, 2)))
    p.grad[...] = 0.1
    g = p.grad
    assert math.isclose(clip_grad_norm([p], 1.0), 0.2, rel_tol=1e-12)
    assert p.grad is g
    np.testing.assert_array_equal(p.grad, 0.1)


def test_clip_grad_norm_non_finite():
    # Check that a NaN gradient gives a NaN norm (gradients untouched) or, on request, an error.
    p = Parameter(np.zeros(3))
    p.grad[1] = np.nan
    assert math.isnan(clip_grad_norm([p], 1.0))
    with pytest.raises(FloatingPointError):
        clip_grad_norm([p], 1.0, error_if_nonfinite=True)
    with pytest.raises(ValueError, match="max_norm"):
        clip_grad_norm([p], 0.0)


def test_grad_in_other_memory_order_is_copied_into_the_parameters_layout():
    # Check that a C-ordered grad given to an F-ordered parameter is copied into the
    # parameter's own layout (the update walks data and grad as flat views in memory
    # order), so the step equals the one of a C-ordered twin.
    rng = np.random.default_rng(4)
    w, g = rng.standard_normal((3, 4)), rng.standard_normal((3, 4))
    p = Parameter(np.asfortranarray(w), "w", grad=np.ascontiguousarray(g))
    twin = Parameter(w.copy(), "w", grad=g.copy())
    assert p.grad.flags.f_contiguous and not p.grad.flags.c_contiguous
    AdamW([p], lr=0.1).step()
    AdamW([twin], lr=0.1).step()
    np.testing.assert_array_equal(p.data, twin.data)


@pytest.mark.parametrize("make", [lambda ps: AdamW(ps, lr=1e-2),
                                  lambda ps: SGD(ps, lr=0.1, momentum=0.9, weight_decay=0.01)],
                         ids=["adamw", "sgd"])
def test_step_zero_grad_equals_step_then_zero_grad(make):
    # Check that step(zero_grad=True) gives the bits of step() followed by zero_grad() over
    # three steps of a model (its whole arena in one run), and leaves every gradient zero.
    from engine import FFN
    x = np.random.default_rng(5).standard_normal((6, 4))
    models = [FFN(4, 8, "gelu", dtype=np.float64, rng=1) for _ in range(2)]
    opts = [make(m.parameters()) for m in models]
    for _ in range(3):
        for m in models:
            m.backward(m.forward(x).copy())
        opts[0].step(zero_grad=True)
        opts[1].step()
        models[1].zero_grad()
        assert not models[0].flat_grads().any()
    np.testing.assert_array_equal(models[0].flat_params(), models[1].flat_params())

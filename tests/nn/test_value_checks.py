"""Values that would make NaN or nonsense are refused, naming the argument: eps = 0, a NaN or
infinite leaky slope, options changed between optimizer steps (checked again at step(),
which then changes nothing), dtype=None, negative seeds, a module instance used twice in a
Sequential, gradients of the wrong type or size, R^2 of a constant column."""
import warnings

import numpy as np
import pytest

from engine import (FFN, MLP, SGD, AddNorm, AdamW, FFNSublayer, LayerNorm, LeakyReLU, Linear,
                    Sequential)
from engine.training.metrics import r2_score


# ----------------------------------------------------------------------------- eps
def test_layernorm_eps_zero_would_give_nan_and_is_refused():
    # Check the reason first: a constant row has variance 0, so (x - mean) / sqrt(0 + 0) is
    # 0/0 = NaN (written out here); then that every norm refuses eps=0, naming eps.
    with np.errstate(invalid="ignore", divide="ignore"):
        assert np.isnan((np.float32(2.0) - 2.0) / np.sqrt(np.float32(0.0)))
    for make in (lambda: LayerNorm(4, eps=0.0), lambda: AddNorm(4, eps=0),
                 lambda: FFNSublayer(4, 8, eps=0.0), lambda: LayerNorm(4, eps=-1e-5)):
        with pytest.raises(ValueError, match="eps"):
            make()


def test_adamw_eps_zero_is_refused():
    # Check that AdamW(eps=0) (a zero gradient then gives 0/0 = NaN) is a ValueError naming
    # eps, in the defaults and in a parameter group.
    m = Linear(2, 2)
    with pytest.raises(ValueError, match="eps"):
        AdamW(m.parameters(), eps=0.0)
    with pytest.raises(ValueError, match="param group 1: eps"):
        AdamW([{"params": [m.W]}, {"params": [m.b], "eps": 0}])


# ----------------------------------------------------------------------------- slopes
@pytest.mark.parametrize("slope, kind", [(float("nan"), ValueError), (float("inf"), ValueError),
                                         (-float("inf"), ValueError), ("x", TypeError),
                                         (None, TypeError)])
def test_leaky_slope_must_be_a_finite_number(slope, kind):
    # Check that LeakyReLU, Linear and MLP refuse a NaN, infinite or non-number slope with
    # an error naming negative_slope.
    with pytest.raises(kind, match="negative_slope"):
        LeakyReLU(slope)
    with pytest.raises(kind, match="negative_slope"):
        Linear(2, 3, activation="leaky_relu", negative_slope=slope)
    with pytest.raises(kind, match="negative_slope"):
        MLP([2, 3, 1], ["leaky_relu", None], negative_slope=slope)


# ----------------------------------------------------------------------------- options at step
def _stepped(make):
    m = MLP([3, 4, 2], dtype=np.float64, rng=0)
    opt = make(m.parameters())
    for p in m.parameters():
        p.grad[...] = 0.25
    opt.step()
    return m, opt


CHANGES = [
    ("AdamW lr NaN", lambda ps: AdamW(ps), "lr", float("nan"), ValueError),
    ("AdamW lr str", lambda ps: AdamW(ps), "lr", "0.1", TypeError),
    ("AdamW lr negative", lambda ps: AdamW(ps), "lr", -0.1, ValueError),
    ("AdamW betas 1", lambda ps: AdamW(ps), "betas", (1.0, 0.999), ValueError),
    ("AdamW eps 0", lambda ps: AdamW(ps), "eps", 0.0, ValueError),
    ("AdamW weight_decay inf", lambda ps: AdamW(ps), "weight_decay", float("inf"), ValueError),
    ("SGD lr NaN", lambda ps: SGD(ps, lr=0.1, momentum=0.9), "lr", float("nan"), ValueError),
    ("SGD momentum str", lambda ps: SGD(ps, lr=0.1, momentum=0.9), "momentum", "x", TypeError),
    ("SGD nesterov int", lambda ps: SGD(ps, lr=0.1, momentum=0.9), "nesterov", 1, TypeError),
]


@pytest.mark.parametrize("label, make, key, value, kind", CHANGES, ids=[c[0] for c in CHANGES])
def test_options_changed_between_steps_are_checked_at_step(label, make, key, value, kind):
    # Check that an option set in param_groups between two steps (as a schedule or a user
    # would) to a value that makes NaN or nonsense is an error naming it at step(), and that
    # the rejected step changes nothing: parameters, optimizer state, step count.
    m, opt = _stepped(make)
    params = [p.data.copy() for p in m.parameters()]
    sd = opt.state_dict()
    opt.param_groups[0][key] = value
    with pytest.raises(kind, match=key):
        opt.step()
    for a, p in zip(params, m.parameters()):
        np.testing.assert_array_equal(a, p.data)
    after = opt.state_dict()
    assert after["steps"] == sd["steps"] == 1
    for i, st in sd["state"].items():
        for k, v in st.items():
            np.testing.assert_array_equal(v, after["state"][i][k])


def test_a_valid_option_changed_between_steps_is_used():
    # Check the other side: a new lr written between steps takes effect (AdamW's first step
    # moves each element by lr, since m/sqrt(v) = g/|g| = 1; the test's gradients are 0.25).
    m = Linear(2, 2, dtype=np.float64, rng=0)
    opt = AdamW(m.parameters(), lr=0.1, weight_decay=0.0)
    opt.param_groups[0]["lr"] = np.float64(0.01)
    w0 = m.W.data.copy()
    m.W.grad[...] = 0.25
    opt.step()
    np.testing.assert_allclose(w0 - m.W.data, 0.01, rtol=1e-6)


# ----------------------------------------------------------------------------- dtype, rng
@pytest.mark.parametrize("make", [lambda: Linear(2, 3, dtype=None), lambda: LayerNorm(4, dtype=None),
                                  lambda: FFN(4, 8, dtype=None), lambda: MLP([2, 3], dtype=None)],
                         ids=["Linear", "LayerNorm", "FFN", "MLP"])
def test_dtype_none_is_refused_instead_of_building_float64(make):
    # Check that dtype=None (which numpy reads as float64) is a TypeError naming dtype.
    with pytest.raises(TypeError, match="dtype"):
        make()


@pytest.mark.parametrize("rng, kind", [(-1, ValueError), ("seed", TypeError), (1.5, TypeError)])
def test_a_bad_seed_names_rng(rng, kind):
    # Check that a negative or non-integer seed is an error whose message names rng.
    with pytest.raises(kind, match="rng"):
        Linear(2, 3, rng=rng)
    with pytest.raises(kind, match="rng"):
        MLP([2, 3, 1], rng=rng)


# ----------------------------------------------------------------------------- Sequential
def test_sequential_refuses_one_instance_twice_at_construction():
    # Check that the same layer twice (directly, or once inside a nested Sequential) is a
    # ValueError when the Sequential is built, not a late "no forward pass" in backward.
    a, b = Linear(2, 2, rng=0), Linear(2, 2, rng=1)
    with pytest.raises(ValueError, match=r"modules\[1\]: the same Linear instance"):
        Sequential(a, a)
    with pytest.raises(ValueError, match=r"modules\[1\]: its child 0 is the same Linear"):
        Sequential(a, Sequential(a, b))
    assert len(Sequential(a, b)) == 2  # two instances are fine


# ----------------------------------------------------------------------------- gradients
@pytest.mark.parametrize("value, kind, match", [
    ([[0.0] * 3] * 2, TypeError, "W.grad: expected a numpy.ndarray"),
    (np.zeros((2, 1)), ValueError, r"W.grad: expected shape \(2, 3\)"),
    (np.zeros(3), ValueError, r"W.grad: expected shape \(2, 3\)"),
    (np.zeros((2, 3), np.float32), TypeError, "W.grad: expected dtype float64"),
])
def test_gradient_assignment_checks_type_shape_and_dtype(value, kind, match):
    # Check that a list, an array with too few elements (which would broadcast), or another
    # dtype assigned to p.grad is an error naming the parameter; the gradient is unchanged.
    m = Linear(2, 3, dtype=np.float64, rng=0)
    m.W.grad[...] = 1.5
    with pytest.raises(kind, match=match):
        m.W.grad = value
    assert np.all(m.W.grad == 1.5)


# ----------------------------------------------------------------------------- metrics
def test_r2_of_a_constant_column_is_nan_not_minus_infinity():
    # Check that R^2 = 1 - SS_res/SS_tot is reported as NaN (undefined) where the true
    # values are all equal (SS_tot = 0), without a division warning, and computed elsewhere.
    y = np.array([[1.0, 0.0], [1.0, 2.0], [1.0, 4.0]])
    p = np.array([[1.5, 0.0], [0.5, 2.0], [1.0, 3.0]])
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        r2 = r2_score(y, p)
    assert np.isnan(r2[0])
    assert r2[1] == pytest.approx(1.0 - 1.0 / 8.0)  # SS_res 1, SS_tot 8

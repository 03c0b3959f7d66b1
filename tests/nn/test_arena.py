"""The flat parameter arena over every module with parameters (tests/support/modules_zoo.py):
flat_params()/flat_grads() are aligned 1-D views packing the parameters in
named_parameters order; assigning p.data / p.grad copies into the arena (any layout) or
raises and changes nothing; AdamW and SGD update exactly the arena, as the formulas of
Loshchilov & Hutter 2019 and PyTorch's SGD say; zero_grad clears the whole grad arena."""
import numpy as np
import pytest

from engine import FFN, SGD, AdamW, LayerNorm, Linear, Sequential
from modules_zoo import (CASES, MODULES, array, assert_same_state, copy_out, lead, randomize,
                         with_params)

F64 = np.float64
PARAM_MODULES = with_params(MODULES)
LR, WD, B1, B2, EPS, MOM = 1e-2, 0.1, 0.9, 0.999, 1e-8, 0.9

OPTIMIZERS = {
    "adamw": lambda ps: AdamW(ps, lr=LR, betas=(B1, B2), eps=EPS, weight_decay=WD),
    "sgd": lambda ps: SGD(ps, lr=LR, momentum=MOM, weight_decay=WD),
}


def _expected_first_step(opt, p, g):
    """The first step's new parameters from the published update rules (elementwise)."""
    if opt == "adamw":  # decoupled decay, bias-corrected moments: m_hat = g, v_hat = g^2
        m_hat = ((1 - B1) * g) / (1 - B1)
        v_hat = ((1 - B2) * g * g) / (1 - B2)
        return p * (1 - LR * WD) - LR * m_hat / (np.sqrt(v_hat) + EPS)
    # PyTorch SGD: L2 decay added to the gradient; the first momentum buffer is that gradient
    return p - LR * (g + WD * p)


def _rule(opt, p, grads):
    """The parameters after one step per gradient in ``grads``, from the update rules."""
    mom, v, buf = np.zeros_like(p), np.zeros_like(p), None
    for t, g in enumerate(grads, start=1):
        if opt == "adamw":
            p = p * (1 - LR * WD)
            mom = B1 * mom + (1 - B1) * g
            v = B2 * v + (1 - B2) * g * g
            p = p - LR * (mom / (1 - B1 ** t)) / (np.sqrt(v / (1 - B2 ** t)) + EPS)
        else:
            d = g + WD * p
            buf = d if buf is None else MOM * buf + d
            p = p - LR * buf
    return p


def _fb(m, name, seed, shape="2d"):
    """forward + backward with inputs drawn from ``seed``; copies of y and dx."""
    case, rng = CASES[name], np.random.default_rng(seed)
    ld = lead(shape)
    x, dy = array(rng, ld, case.d_in), array(rng, ld, case.d_out)
    y = copy_out(m.forward(x, array(rng, ld, case.d_in)) if case.kind == "addnorm"
                 else m.forward(x))
    return y, copy_out(m.backward(dy))


def _built(name, opt):
    """The module of case ``name`` (seed 0) and optimizer ``opt`` over its parameters."""
    m = CASES[name].build(0)
    return m, OPTIMIZERS[opt](m.parameters())


def _steps(m, o, name, seeds):
    """zero_grad, forward + backward with inputs from the seed, step: once per seed. Yields
    after each step the flat gradients of the steps so far (copies, one list)."""
    grads = []
    for seed in seeds:
        o.zero_grad()
        _fb(m, name, seed)
        grads.append(m.flat_grads().copy())
        o.step()
        yield grads


def _sizes(m):
    return sum(p.size for p in m.parameters())


# ----------------------------------------------------------------------------- layout
@pytest.mark.parametrize("which", ["flat_params", "flat_grads"])
@pytest.mark.parametrize("name", PARAM_MODULES)
def test_flat_vector_is_aligned_1d_contiguous(name, which):
    # Check that the root module's flat vector is 1-D, C-contiguous, float64, starts on a
    # 64-byte boundary and holds exactly the parameters' elements.
    m = CASES[name].build(0)
    f = getattr(m, which)()
    assert isinstance(f, np.ndarray) and f.ndim == 1 and f.flags.c_contiguous
    assert f.dtype == F64
    assert f.ctypes.data % 64 == 0, f"{which} starts at {f.ctypes.data % 64} bytes past 64"
    assert f.size == _sizes(m)


@pytest.mark.parametrize("name", PARAM_MODULES)
def test_parameters_are_packed_in_order(name):
    # Check that each p.data / p.grad is the next run of the flat vector in
    # named_parameters order: same bytes, same values in memory order.
    m = CASES[name].build(0)
    _fb(m, name, 1)  # non-zero grads, so the value check means something
    fp, fg = m.flat_params(), m.flat_grads()
    off = 0
    for n, p in m.named_parameters():
        for arr, flat, what in ((p.data, fp, "data"), (p.grad, fg, "grad")):
            assert np.shares_memory(arr, flat), f"{n}.{what} is not a view of the arena"
            assert arr.flags.c_contiguous or arr.flags.f_contiguous, f"{n}.{what}"
            lo = arr.ctypes.data  # first byte of a C- or F-contiguous array
            hi = lo + arr.nbytes
            base = flat.ctypes.data
            assert (lo - base, hi - base) == (off * 8, (off + p.size) * 8), f"{n}.{what}"
            np.testing.assert_array_equal(flat[off:off + p.size], arr.ravel(order="K"),
                                          err_msg=f"{n}.{what}")
        off += p.size
    assert off == fp.size == fg.size


@pytest.mark.parametrize("name", PARAM_MODULES)
def test_flat_vectors_are_views_not_copies(name):
    # Check that writing the flat vectors writes the parameters and grads (no copies), and
    # that a second call returns the same memory.
    m = CASES[name].build(0)
    fp, fg = m.flat_params(), m.flat_grads()
    fp[:] = np.arange(fp.size)
    fg[:] = -np.arange(fg.size)
    off = 0
    for n, p in m.named_parameters():
        np.testing.assert_array_equal(p.data.ravel(order="K"), np.arange(off, off + p.size))
        np.testing.assert_array_equal(p.grad.ravel(order="K"), -np.arange(off, off + p.size))
        off += p.size
    assert m.flat_params().ctypes.data == fp.ctypes.data
    assert m.flat_grads().ctypes.data == fg.ctypes.data


def test_mixed_dtypes_have_no_flat_vector():
    # Check that flat_params/flat_grads raise RuntimeError when the parameters are of two
    # dtypes (no single flat vector can hold them).
    m = Sequential(Linear(3, 4, dtype=np.float32, rng=0), Linear(4, 2, dtype=F64, rng=1))
    with pytest.raises(RuntimeError):
        m.flat_params()
    with pytest.raises(RuntimeError):
        m.flat_grads()


# ----------------------------------------------------------------------------- reassignment
def _f_order(v):
    return v.T.copy().T if v.ndim == 2 else v.copy()


def _strided(v):
    big = np.zeros((2 * v.shape[0], *v.shape[1:]))
    big[::2] = v
    return big[::2]


def _negative(v):
    return v[::-1].copy()[::-1]


LAYOUTS = {"f_order": _f_order, "strided": _strided, "negative_stride": _negative}


@pytest.mark.parametrize("layout", LAYOUTS)
@pytest.mark.parametrize("opt", OPTIMIZERS)
@pytest.mark.parametrize("name", PARAM_MODULES)
def test_data_assignment_copies_and_is_optimized(name, opt, layout):
    # Check that p.data = <any layout> after the optimizer exists copies the values into the
    # arena: the model computes with them and the optimizer updates them, exactly as a twin
    # that held those values from the start; the source array stays independent.
    m, o = _built(name, opt)
    rng = np.random.default_rng(2)
    new = {n: rng.standard_normal(p.shape) for n, p in m.named_parameters()}
    for n, p in m.named_parameters():
        src = LAYOUTS[layout](new[n])
        p.data = src
        assert np.shares_memory(p.data, m.flat_params()), n
        assert not np.shares_memory(p.data, src), n
        src[...] = 7.0  # the caller reuses its array: the parameter must not follow
        np.testing.assert_array_equal(p.data, new[n], err_msg=n)
    twin = CASES[name].build(0)
    for n, p in twin.named_parameters():
        p.data[...] = new[n]
    ot = OPTIMIZERS[opt](twin.parameters())
    for seed in (3, 4):
        ys = [_fb(mod, name, seed) for mod in (m, twin)]
        np.testing.assert_array_equal(ys[0][0], ys[1][0], err_msg="forward")
        o.step()
        ot.step()
        o.zero_grad()
        ot.zero_grad()
        assert_same_state(m, twin)


@pytest.mark.parametrize("layout", LAYOUTS)
@pytest.mark.parametrize("opt", OPTIMIZERS)
@pytest.mark.parametrize("name", PARAM_MODULES)
def test_grad_assignment_copies_and_is_optimized(name, opt, layout):
    # Check that p.grad = <any layout> copies into the grad arena and the optimizer steps
    # with exactly those gradients (as a twin whose grads were written in place).
    m, o = _built(name, opt)
    twin, ot = _built(name, opt)
    rng = np.random.default_rng(5)
    for (n, p), (_, q) in zip(m.named_parameters(), twin.named_parameters()):
        g = rng.standard_normal(p.shape)
        src = LAYOUTS[layout](g)
        p.grad = src
        q.grad[...] = g
        assert np.shares_memory(p.grad, m.flat_grads()), n
        src[...] = 7.0
        np.testing.assert_array_equal(p.grad, g, err_msg=n)
    o.step()
    ot.step()
    assert_same_state(m, twin)


def _bad_values(p, kind):
    if kind == "shape":
        return np.zeros(tuple(s + 1 for s in p.shape))
    if kind == "transposed" and p.data.ndim == 2 and p.shape[0] != p.shape[1]:
        return np.zeros(p.shape[::-1])
    if kind == "dtype":
        return np.zeros(p.shape, np.float32)
    if kind == "list":
        return np.zeros(p.shape).tolist()
    return None


BAD = {"shape": ValueError, "transposed": ValueError, "dtype": TypeError, "list": TypeError}


@pytest.mark.parametrize("attr", ["data", "grad"])
@pytest.mark.parametrize("kind", BAD)
@pytest.mark.parametrize("name", PARAM_MODULES)
def test_bad_assignment_raises_and_changes_nothing(name, kind, attr):
    # Check that assigning a wrong shape (ValueError), dtype or a list (TypeError) raises,
    # leaves the arena bytes and the parameter's memory as they were, and the next step
    # equals that of a twin that never saw the bad assignments.
    m, twin = CASES[name].build(0), CASES[name].build(0)
    o, ot = AdamW(m.parameters()), AdamW(twin.parameters())
    _fb(m, name, 6)
    _fb(twin, name, 6)
    fp0, fg0 = m.flat_params().copy(), m.flat_grads().copy()
    tried = 0
    for n, p in m.named_parameters():
        bad = _bad_values(p, kind)
        if bad is None:
            continue
        tried += 1
        with pytest.raises(BAD[kind]) as err:
            setattr(p, attr, bad)
        assert attr in str(err.value) or n.split(".")[-1] in str(err.value), str(err.value)
        assert np.shares_memory(getattr(p, attr), m.flat_params() if attr == "data"
                                else m.flat_grads()), n
    if not tried:
        pytest.skip("no parameter of this module has a non-square 2-D shape")
    np.testing.assert_array_equal(m.flat_params(), fp0)
    np.testing.assert_array_equal(m.flat_grads(), fg0)
    o.step()
    ot.step()
    assert_same_state(m, twin)


# ----------------------------------------------------------------------------- optimizer step
@pytest.mark.parametrize("opt", OPTIMIZERS)
@pytest.mark.parametrize("name", PARAM_MODULES)
def test_step_changes_exactly_the_parameter_arena(name, opt):
    # Check that a step writes the flat parameters (to the published update of each
    # element) and nothing else reachable: grads, the module's outputs and the inputs stay.
    case, rng = CASES[name], np.random.default_rng(7)
    m, o = _built(name, opt)
    ld = lead("2d")
    x, dy = array(rng, ld, case.d_in), array(rng, ld, case.d_out)
    sub = array(rng, ld, case.d_in)
    y = m.forward(x, sub) if case.kind == "addnorm" else m.forward(x)
    dx = m.backward(dy)
    outs = list(dx) if isinstance(dx, tuple) else [dx]
    keep = [x, dy, sub, y, *outs]
    keep0 = [a.copy() for a in keep]
    fp0, fg0 = m.flat_params().copy(), m.flat_grads().copy()
    before = {n: p.data.copy() for n, p in m.named_parameters()}
    o.step()
    np.testing.assert_array_equal(m.flat_grads(), fg0, err_msg="grads written by step")
    for a, a0 in zip(keep, keep0):
        np.testing.assert_array_equal(a, a0, err_msg="a buffer outside the arena changed")
    np.testing.assert_allclose(m.flat_params(), _expected_first_step(opt, fp0, fg0),
                               rtol=1e-12, atol=1e-15)
    for n, p in m.named_parameters():
        if np.any(p.grad != 0):
            assert not np.array_equal(p.data, before[n]), f"{n} has a gradient but did not move"


@pytest.mark.parametrize("opt", OPTIMIZERS)
@pytest.mark.parametrize("name", PARAM_MODULES)
def test_two_steps_follow_the_update_rule(name, opt):
    # Check the second step too (moments and momentum carried over), elementwise over the
    # flat vectors, against the rules written out here.
    m, o = _built(name, opt)
    p0 = m.flat_params().copy()
    for t, grads in enumerate(_steps(m, o, name, (8, 9)), start=1):
        np.testing.assert_allclose(m.flat_params(), _rule(opt, p0, grads), rtol=1e-11,
                                   atol=1e-14, err_msg=f"step {t}")


@pytest.mark.parametrize("via", ["module", "optimizer"])
@pytest.mark.parametrize("name", PARAM_MODULES)
def test_zero_grad_clears_the_whole_grad_arena(name, via):
    # Check that module.zero_grad() / optimizer.zero_grad() zero every element of the flat
    # gradient vector, and leave the parameters alone.
    m = CASES[name].build(0)
    o = AdamW(m.parameters())
    _fb(m, name, 10)
    fg = m.flat_grads()
    assert np.any(fg != 0)
    fp0 = m.flat_params().copy()
    (m if via == "module" else o).zero_grad()
    assert not np.any(m.flat_grads())
    assert not np.any(fg)
    for n, p in m.named_parameters():
        assert not np.any(p.grad), n
    np.testing.assert_array_equal(m.flat_params(), fp0)


# ----------------------------------------------------------------------------- nesting
def _children(rng):
    a = Linear(6, 8, dtype=F64, rng=rng)
    b = FFN(8, 12, "relu", dtype=F64, rng=rng)
    c = LayerNorm(8, dtype=F64)
    for mod in (a, b, c):
        randomize(mod, rng)
    return a, b, c


def _naive(params, x):
    """Linear -> FFN(relu) -> LayerNorm written out (Ba et al. 2016 for the norm)."""
    h = x @ params["0.W"] + params["0.b"]
    z = np.maximum(h @ params["1.W_in"] + params["1.b1"], 0.0)
    f = z @ params["1.W_out"] + params["1.b2"]
    mu = f.mean(-1, keepdims=True)
    var = ((f - mu) ** 2).mean(-1, keepdims=True)
    return (f - mu) / np.sqrt(var + 1e-5) * params["2.gamma"] + params["2.beta"]


@pytest.mark.parametrize("scope", ["all_children", "one_child"])
@pytest.mark.parametrize("opt", OPTIMIZERS)
def test_optimizer_made_before_the_model_is_nested(opt, scope):
    # Check that an optimizer built over children's parameters, before the children are
    # placed into a Sequential, either keeps updating exactly what the Sequential computes
    # with, or refuses to step with a clear error and changes nothing; never a silent
    # update of memory the model no longer reads.
    rng = np.random.default_rng(11)
    a, b, c = _children(rng)
    owned = (a.parameters() + b.parameters() + c.parameters()) if scope == "all_children" \
        else b.parameters()
    o = OPTIMIZERS[opt](owned)
    model = Sequential(a, b, c)
    mp = model.named_parameters()
    assert all(any(p is q for _, q in mp) for p in owned)
    x, dy = rng.standard_normal((5, 6)), rng.standard_normal((5, 8))
    y = np.array(model.forward(x), copy=True)
    before = {n: p.data.copy() for n, p in mp}
    np.testing.assert_allclose(y, _naive(before, x), rtol=1e-12, atol=1e-12)
    model.backward(dy)
    grads = {n: p.grad.copy() for n, p in mp}
    try:
        o.step()
    except (RuntimeError, ValueError) as err:
        assert str(err), "the refusal must say why"
        for n, p in mp:
            np.testing.assert_array_equal(p.data, before[n], err_msg=n)
        return
    owned_ids = {id(p) for p in owned}
    want = {n: (_expected_first_step(opt, before[n], grads[n]) if id(p) in owned_ids
                else before[n]) for n, p in mp}
    for n, p in mp:
        np.testing.assert_allclose(p.data, want[n], rtol=1e-12, atol=1e-15, err_msg=n)
        assert np.shares_memory(p.data, model.flat_params()), n
    y2 = model.forward(x)
    np.testing.assert_allclose(y2, _naive(want, x), rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize("opt", OPTIMIZERS)
def test_optimizer_state_follows_parameters_nested_between_steps(opt):
    # Check that moments / momentum buffers stay with their parameters when the module is
    # placed into a Sequential (its parameters move to the new arena) between two steps.
    rng = np.random.default_rng(12)
    b = FFN(8, 12, "relu", dtype=F64, rng=rng)
    randomize(b, rng)
    o = OPTIMIZERS[opt](b.parameters())
    p0 = b.flat_params().copy()
    b.forward(rng.standard_normal((5, 8)))
    b.backward(rng.standard_normal((5, 8)))
    g1 = b.flat_grads().copy()
    o.step()
    o.zero_grad()
    model = Sequential(Linear(6, 8, dtype=F64, rng=rng), b, Linear(8, 6, dtype=F64, rng=rng))
    model.forward(rng.standard_normal((5, 6)))
    model.backward(rng.standard_normal((5, 6)))
    g2 = b.flat_grads().copy()
    try:
        o.step()
    except (RuntimeError, ValueError) as err:
        assert str(err)
        return
    np.testing.assert_allclose(b.flat_params(), _rule(opt, p0, [g1, g2]), rtol=1e-11,
                               atol=1e-14)
    assert np.shares_memory(b.flat_params(), model.flat_params())


@pytest.mark.parametrize("order", ["reversed", "two_groups"])
@pytest.mark.parametrize("opt", OPTIMIZERS)
@pytest.mark.parametrize("name", ["gmlp", "sequential", "sublayer_post"])
def test_optimizer_in_another_order_than_the_arena(name, opt, order):
    # Check that parameters handed to the optimizer in another order than the arena's
    # (reversed, or split over two groups) are updated exactly as the rules say.
    m = CASES[name].build(0)
    params = m.parameters()
    if order == "reversed":
        o = OPTIMIZERS[opt](params[::-1])
    else:
        o = OPTIMIZERS[opt]([{"params": params[1::2]}, {"params": params[0::2]}])
    fp0 = m.flat_params().copy()
    grads = list(_steps(m, o, name, (13, 14)))[-1]
    np.testing.assert_allclose(m.flat_params(), _rule(opt, fp0, grads), rtol=1e-11, atol=1e-14)

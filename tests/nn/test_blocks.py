"""engine.nn.blocks: FFN, GMLP, LayerNorm, AddNorm, FFNSublayer (dropout off) against finite
differences and naive float64 NumPy; batch-size changes, (B, T, d) inputs, float32 vs float64,
state dicts and seeding. Dropout: test_block_dropout.py; bad input: test_block_errors.py."""
import numpy as np
import pytest
from gradcheck import assert_close, check_module_grads, numeric_grad

from engine import FFN, GMLP, AddNorm, FFNSublayer, LayerNorm
from kernels import reference
from kernels.activations import ACTIVATIONS

F64 = np.float64

# name -> factory(dtype, rng); small shapes so finite differences stay fast.
BLOCKS = {
    "ffn_relu": lambda dt, rng: FFN(6, 10, "relu", dtype=dt, rng=rng),
    "ffn_gelu": lambda dt, rng: FFN(6, 10, "gelu", dtype=dt, rng=rng),
    "ffn_tanh_nobias": lambda dt, rng: FFN(6, 10, "tanh", bias=False, dtype=dt, rng=rng),
    "gmlp": lambda dt, rng: GMLP(6, 5, 7, 4, dtype=dt, rng=rng),
    "layernorm": lambda dt, rng: LayerNorm(6, dtype=dt),
    "sub_post": lambda dt, rng: FFNSublayer(6, 10, "gelu", norm="post", dtype=dt, rng=rng),
    "sub_pre": lambda dt, rng: FFNSublayer(6, 10, "relu", norm="pre", dtype=dt, rng=rng),
}
D_IN = {"gmlp": 6}
D_OUT = {"gmlp": 4}


def _randomize(m, rng, scale=0.5):
    # Nonzero biases/beta and non-unit gamma, so a bug in their use cannot hide.
    for name, p in m.named_parameters():
        if name.endswith("gamma"):
            p.data[...] = 1.0 + 0.3 * rng.standard_normal(p.shape)
        else:
            p.data[...] = scale * rng.standard_normal(p.shape)


def _step(m, x, dy):
    """forward + backward; copies of y, dx and every parameter gradient (then zero_grad)."""
    m.zero_grad()
    y = np.array(m.forward(x), copy=True)
    dx = np.array(m.backward(dy), copy=True)
    grads = {n: p.grad.copy() for n, p in m.named_parameters()}
    return y, dx, grads


# ----------------------------------------------------------------------------- naive oracles
def _ln(s, gamma, beta, eps=1e-5):
    mu = s.mean(-1, keepdims=True)
    var = ((s - mu) ** 2).mean(-1, keepdims=True)
    return (s - mu) / np.sqrt(var + eps) * gamma + beta


def _ffn(m, x):
    sd = m.state_dict()
    z = x @ sd["W_in"] + sd.get("b1", 0.0)
    return reference.activation(z, m.activation) @ sd["W_out"] + sd.get("b2", 0.0)


# ----------------------------------------------------------------------------- gradients
@pytest.mark.parametrize("act", ACTIVATIONS)
@pytest.mark.parametrize("bias", [True, False])
def test_ffn_gradcheck_every_activation(act, bias):
    # Check that FFN's dx, dW_in, db1, dW_out, db2 equal central finite differences (float64).
    rng = np.random.default_rng(0)
    m = FFN(5, 8, act, bias=bias, dtype=F64, rng=1)
    _randomize(m, rng)
    assert [n for n, _ in m.named_parameters()] == (
        ["W_in", "b1", "W_out", "b2"] if bias else ["W_in", "W_out"])
    check_module_grads(m, rng.standard_normal((7, 5)), rng)


@pytest.mark.parametrize("name", ["gmlp", "layernorm", "sub_post", "sub_pre", "ffn_gelu"])
def test_block_gradcheck_3d_input(name):
    # Check that every parameter gradient and dx equal finite differences, for a (B, T, d) input.
    rng = np.random.default_rng(1)
    m = BLOCKS[name](F64, 2)
    _randomize(m, rng)
    check_module_grads(m, rng.standard_normal((2, 3, D_IN.get(name, 6))), rng)


@pytest.mark.parametrize("act", ["relu", "gelu", "silu"])
@pytest.mark.parametrize("norm", ["post", "pre"])
def test_ffn_sublayer_gradcheck(act, norm):
    # Check FFNSublayer gradients (all six parameters and dx) in both norm modes.
    rng = np.random.default_rng(2)
    m = FFNSublayer(6, 9, act, norm=norm, dtype=F64, rng=3)
    _randomize(m, rng)
    check_module_grads(m, rng.standard_normal((8, 6)), rng)


def _addnorm_loss_grads(m, x, sub, R):
    """Finite-difference gradients of L = sum(AddNorm(x, sub) * R) for x, sub, gamma, beta."""
    def loss():
        return float(np.sum(m.forward(x, sub) * R))
    return {"x": numeric_grad(loss, x), "sub": numeric_grad(loss, sub),
            "gamma": numeric_grad(loss, m.gamma.data), "beta": numeric_grad(loss, m.beta.data)}


@pytest.mark.parametrize("shape", [(7, 6), (2, 3, 6)])
def test_addnorm_gradcheck_dx_dsub(shape):
    # Check that AddNorm.backward's (dx, dsub) and dgamma/dbeta equal finite differences.
    rng = np.random.default_rng(3)
    m = AddNorm(6, dtype=F64)
    _randomize(m, rng)
    x, sub, R = (rng.standard_normal(shape) for _ in range(3))
    num = _addnorm_loss_grads(m, x, sub, R)
    m.zero_grad()
    m.forward(x, sub)
    dx, dsub = m.backward(R.copy())
    assert dx.shape == shape and dsub.shape == shape
    assert not np.shares_memory(dx, dsub)
    assert_close(dx, num["x"], "dx", 1e-5, 1e-7)
    assert_close(dsub, num["sub"], "dsub", 1e-5, 1e-7)
    assert_close(m.gamma.grad, num["gamma"], "gamma", 1e-5, 1e-7)
    assert_close(m.beta.grad, num["beta"], "beta", 1e-5, 1e-7)


# ----------------------------------------------------------------------------- forward values
@pytest.mark.parametrize("act", ACTIVATIONS)
def test_ffn_forward_matches_naive(act):
    # Check that FFN computes act(x W_in + b1) W_out + b2 (naive float64 oracle).
    rng = np.random.default_rng(4)
    m = FFN(7, 11, act, dtype=F64, rng=5)
    _randomize(m, rng)
    x = rng.standard_normal((9, 7))
    np.testing.assert_allclose(m(x), _ffn(m, x), rtol=1e-12, atol=1e-12)


def test_addnorm_forward_is_layernorm_of_sum_with_per_feature_affine():
    # Check that AddNorm(x, sub) = LayerNorm(x + sub) with gamma/beta of shape (d_model,).
    rng = np.random.default_rng(6)
    m = AddNorm(6, dtype=F64)
    assert m.gamma.shape == (6,) and m.beta.shape == (6,)
    assert (m.gamma.data == 1).all() and (m.beta.data == 0).all()
    _randomize(m, rng)
    x, sub = rng.standard_normal((5, 6)), rng.standard_normal((5, 6))
    expected = _ln(x + sub, m.gamma.data, m.beta.data)
    np.testing.assert_allclose(m(x, sub), expected, rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize("norm", ["post", "pre"])
def test_ffn_sublayer_forward_matches_naive(norm):
    # Check post = LayerNorm(x + FFN(x)) and pre = x + FFN(LayerNorm(x)), and the parameter names.
    rng = np.random.default_rng(7)
    m = FFNSublayer(6, 10, "gelu", norm=norm, dtype=F64, rng=8)
    assert [n for n, _ in m.named_parameters()] == [
        "ffn.W_in", "ffn.b1", "ffn.W_out", "ffn.b2", "norm.gamma", "norm.beta"]
    _randomize(m, rng)
    x = rng.standard_normal((2, 4, 6))
    g, b = m.norm.gamma.data, m.norm.beta.data
    if norm == "post":
        expected = _ln(x + _ffn(m.ffn, x), g, b)
    else:
        expected = x + _ffn(m.ffn, _ln(x, g, b))
    np.testing.assert_allclose(m(x), expected, rtol=1e-12, atol=1e-12)


# ----------------------------------------------------------------------------- GMLP
def test_gmlp_grads_match_seed_readme_formulas():
    # Check forward and every gradient against seed 002's README, written with separate
    # W_gate / W_proj matrices (the module stores them as halves of one weight).
    rng = np.random.default_rng(9)
    m = GMLP(6, 5, 7, 4, dtype=F64, rng=10)
    _randomize(m, rng)
    X, dY = rng.standard_normal((8, 6)), rng.standard_normal((8, 4))
    W_in, Wg, Wp, W_out = (m.state_dict()[k] for k in ("W_in", "W_gate", "W_proj", "W_out"))
    U = X @ W_in
    Z = reference.activation(U, "gelu")
    G = 1.0 / (1.0 + np.exp(-(Z @ Wg)))
    P = Z @ Wp
    A = G * P
    Y = A @ W_out
    dA = dY @ W_out.T
    dG, dP = dA * P, dA * G
    dZg = dG * G * (1 - G)
    dZ = dZg @ Wg.T + dP @ Wp.T
    dU = dZ * reference.activation_grad(U, "gelu")
    m.zero_grad()
    np.testing.assert_allclose(m(X), Y, rtol=1e-12, atol=1e-12)
    dX = m.backward(dY)
    tol = dict(rtol=1e-10, atol=1e-12)
    np.testing.assert_allclose(m.W_out.grad, A.T @ dY, **tol)
    np.testing.assert_allclose(m.W_gate.grad, Z.T @ dZg, **tol)
    np.testing.assert_allclose(m.W_proj.grad, Z.T @ dP, **tol)
    np.testing.assert_allclose(m.W_in.grad, X.T @ dU, **tol)
    np.testing.assert_allclose(dX, dU @ W_in.T, **tol)


def test_gmlp_gate_and_proj_are_views_of_one_weight():
    # Check that W_gate / W_proj (data and grad) are disjoint F-contiguous views of the combined
    # weight and grad, in the documented parameter order.
    m = GMLP(6, 5, 7, 4, rng=0)
    assert [n for n, _ in m.named_parameters()] == ["W_in", "W_gate", "W_proj", "W_out"]
    assert m.Wgp_T.shape == (14, 5) and m.Wgp_T.flags.c_contiguous
    for p in (m.W_gate, m.W_proj):
        assert p.shape == (5, 7) and p.data.flags.f_contiguous
        assert np.shares_memory(p.data, m.Wgp_T)
        assert np.shares_memory(p.grad, m.dWgp_T)
    assert not np.shares_memory(m.W_gate.data, m.W_proj.data)
    np.testing.assert_array_equal(m.Wgp_T, np.concatenate([m.W_gate.data.T, m.W_proj.data.T]))
    m(np.ones((3, 6), np.float32))
    m.backward(np.ones((3, 4), np.float32))
    assert m.dWgp_T.any()
    m.zero_grad()
    assert not m.dWgp_T.any()


def test_gmlp_state_dict_round_trip_keeps_views():
    # Check that load_state_dict writes through the W_gate/W_proj views into the combined weight.
    rng = np.random.default_rng(11)
    a, b = GMLP(6, 5, 7, 4, dtype=F64, rng=1), GMLP(6, 5, 7, 4, dtype=F64, rng=2)
    x = rng.standard_normal((3, 6))
    b.load_state_dict(a.state_dict())
    assert np.shares_memory(b.W_gate.data, b.Wgp_T) and np.shares_memory(b.W_proj.data, b.Wgp_T)
    np.testing.assert_array_equal(b.Wgp_T, a.Wgp_T)
    np.testing.assert_array_equal(b(x), a(x))


def test_gmlp_init_scales():
    # Check the documented init: He (2/d_in) for W_in, Xavier (2/(fan_in+fan_out)) elsewhere.
    m = GMLP(400, 300, 500, 200, dtype=F64, rng=0)
    for p, var in ((m.W_in, 2 / 400), (m.W_gate, 2 / 800), (m.W_proj, 2 / 800),
                   (m.W_out, 2 / 700)):
        assert abs(p.data.var() / var - 1) < 0.05, p.name


# ----------------------------------------------------------------------------- buffers, shapes
@pytest.mark.parametrize("name", list(BLOCKS))
def test_batch_size_changes_match_fresh_modules(name):
    # Check that large, small, large batches through one module give what fresh modules give
    # (work buffers are row slices; stale rows must not leak into results or gradients).
    rng = np.random.default_rng(12)
    m = BLOCKS[name](F64, 3)
    for n in (9, 2, 9, 1):
        x = rng.standard_normal((n, D_IN.get(name, 6)))
        dy = rng.standard_normal((n, D_OUT.get(name, 6)))
        got = _step(m, x, dy)
        want = _step(BLOCKS[name](F64, 3), x, dy)
        for a, b in zip(got[:2], want[:2]):
            np.testing.assert_allclose(a, b, rtol=1e-12, atol=1e-12)
        for k in want[2]:
            np.testing.assert_allclose(got[2][k], want[2][k], rtol=1e-12, atol=1e-12, err_msg=k)


@pytest.mark.parametrize("name", list(BLOCKS))
def test_3d_input_keeps_leading_shape(name):
    # Check that a (B, T, d) input gives a (B, T, d_out) output and (B, T, d) dx equal to the
    # (B*T, d) computation.
    rng = np.random.default_rng(13)
    d, do = D_IN.get(name, 6), D_OUT.get(name, 6)
    x, dy = rng.standard_normal((2, 5, d)), rng.standard_normal((2, 5, do))
    y3, dx3, g3 = _step(BLOCKS[name](F64, 4), x, dy)
    y2, dx2, g2 = _step(BLOCKS[name](F64, 4), x.reshape(10, d), dy.reshape(10, do))
    assert y3.shape == (2, 5, do) and dx3.shape == (2, 5, d)
    np.testing.assert_allclose(y3.reshape(10, do), y2, rtol=1e-13, atol=1e-13)
    np.testing.assert_allclose(dx3.reshape(10, d), dx2, rtol=1e-13, atol=1e-13)
    for k in g2:
        np.testing.assert_allclose(g3[k], g2[k], rtol=1e-13, atol=1e-13, err_msg=k)


def test_addnorm_batch_size_changes_and_3d():
    # Check AddNorm over large, small, large batches and a (B, T, d) input against fresh modules.
    rng = np.random.default_rng(14)
    m = AddNorm(6, dtype=F64)
    for shape in ((9, 6), (2, 6), (3, 3, 6)):
        x, sub, dy = (rng.standard_normal(shape) for _ in range(3))
        fresh = AddNorm(6, dtype=F64)
        for mod in (m, fresh):
            mod.zero_grad()
        y, (dx, dsub) = m(x, sub).copy(), (a.copy() for a in m.backward(dy))
        assert y.shape == shape and dx.shape == shape and dsub.shape == shape
        np.testing.assert_allclose(y, fresh(x, sub), rtol=1e-13, atol=1e-13)
        fdx, fdsub = fresh.backward(dy)
        np.testing.assert_allclose(dx, fdx, rtol=1e-13, atol=1e-13)
        np.testing.assert_allclose(dsub, fdsub, rtol=1e-13, atol=1e-13)
        np.testing.assert_allclose(m.gamma.grad, fresh.gamma.grad, rtol=1e-13, atol=1e-13)


@pytest.mark.parametrize("name", list(BLOCKS))
def test_outputs_are_views_of_work_buffers(name):
    # Check that forward/backward write into the module's own buffers: a second call with the
    # same batch size returns arrays over the same memory (nothing reallocated).
    rng = np.random.default_rng(15)
    m = BLOCKS[name](np.float32, 0)
    x = rng.standard_normal((4, D_IN.get(name, 6))).astype(np.float32)
    dy = rng.standard_normal((4, D_OUT.get(name, 6))).astype(np.float32)
    y1, dx1 = m(x), m.backward(dy)
    y2, dx2 = m(x), m.backward(dy)
    assert np.shares_memory(y1, y2) and np.shares_memory(dx1, dx2)
    assert not np.shares_memory(y1, x) and not np.shares_memory(dx1, dy)


@pytest.mark.parametrize("name", list(BLOCKS))
def test_float32_agrees_with_float64(name):
    # Check that a float32 module (same seed, so the same rounded weights) agrees with float64
    # to float32 tolerance, forward and backward.
    rng = np.random.default_rng(16)
    m32, m64 = BLOCKS[name](np.float32, 5), BLOCKS[name](F64, 5)
    _randomize(m64, rng)
    m32.load_state_dict({k: v.astype(np.float32) for k, v in m64.state_dict().items()})
    m64.load_state_dict({k: v.astype(F64) for k, v in m32.state_dict().items()})
    x = rng.standard_normal((6, D_IN.get(name, 6)))
    dy = rng.standard_normal((6, D_OUT.get(name, 6)))
    y32, dx32, g32 = _step(m32, x.astype(np.float32), dy.astype(np.float32))
    y64, dx64, g64 = _step(m64, x, dy)
    assert y32.dtype == np.float32 and dx32.dtype == np.float32
    tol = dict(rtol=2e-4, atol=2e-5)
    np.testing.assert_allclose(y32, y64, **tol)
    np.testing.assert_allclose(dx32, dx64, **tol)
    for k in g64:
        assert g32[k].dtype == np.float32
        np.testing.assert_allclose(g32[k], g64[k], err_msg=k, **tol)


def test_empty_batch():
    # Check that a batch of zero rows gives empty outputs and leaves gradients at zero.
    for name, make in BLOCKS.items():
        m = make(F64, 0)
        y = m(np.empty((0, D_IN.get(name, 6))))
        assert y.shape == (0, D_OUT.get(name, 6)), name
        assert m.backward(np.empty((0, D_OUT.get(name, 6)))).shape == (0, D_IN.get(name, 6))
        assert all(not p.grad.any() for p in m.parameters()), name


# ----------------------------------------------------------------------------- state, seeds
@pytest.mark.parametrize("name", list(BLOCKS))
def test_state_dict_round_trip(name):
    # Check that a module loaded from another's state dict computes the same outputs, and that
    # the state dict holds copies.
    rng = np.random.default_rng(17)
    a, b = BLOCKS[name](F64, 1), BLOCKS[name](F64, 2)
    _randomize(a, rng)
    sd = a.state_dict()
    b.load_state_dict(sd)
    x = rng.standard_normal((3, D_IN.get(name, 6)))
    np.testing.assert_array_equal(b(x), a(x))
    for k in sd:
        sd[k] += 1.0
    np.testing.assert_array_equal(b(x), a(x))


@pytest.mark.parametrize("name", ["ffn_relu", "gmlp", "sub_post", "sub_pre"])
def test_same_seed_same_weights(name):
    # Check that one seed gives the same weights, another seed different ones, and that
    # float32 weights are the float64 ones rounded.
    sa, sb = BLOCKS[name](F64, 7).state_dict(), BLOCKS[name](F64, 7).state_dict()
    sc, s32 = BLOCKS[name](F64, 8).state_dict(), BLOCKS[name](np.float32, 7).state_dict()
    for k in sa:
        np.testing.assert_array_equal(sa[k], sb[k])
        np.testing.assert_array_equal(s32[k], sa[k].astype(np.float32))
    assert any(not np.array_equal(sa[k], sc[k]) for k in sa)


@pytest.mark.parametrize("init,var", [("he", 2 / 400), ("xavier", 2 / 700), ("normal", 0.02**2)])
def test_ffn_init(init, var):
    # Check FFN weight init variances (W_in fan-in 400, fan-out 300) and zero biases.
    m = FFN(400, 300, init=init, dtype=F64, rng=0)
    assert abs(m.W_in.data.var() / var - 1) < 0.05
    assert not m.b1.data.any() and not m.b2.data.any()
    assert not FFN(4, 3, init="zeros").W_in.data.any()


def test_repr_shows_sizes():
    # Check that repr names the children and parameter shapes.
    r = repr(FFNSublayer(8, 32, "gelu", norm="pre"))
    assert "(ffn): FFN" in r and "W_in=(8, 32)" in r and "(norm): LayerNorm" in r
    assert "parameters" in r


# ----------------------------------------------------------------------------- threads, buffers
def test_gmlp_gating_does_not_depend_on_thread_split():
    # Check that the gating passes give bit-identical results inline (1 thread) and split over
    # 2 threads, on arrays large enough to be split, and match the formulas: forward
    # A = (1 + tanh(g)) * p; backward from (S, P/2, dA): 2 dZg = dA S (P/2) (2 - S), 2 dP = dA S.
    from kernels import num_threads, ops
    rows, n = 2048, 300  # (f, n) transposed layout: 614400 elements, above the split size
    rng = np.random.default_rng(3)
    g0 = rng.standard_normal(rows * n).astype(np.float32)
    p0 = rng.standard_normal(rows * n).astype(np.float32)
    da0 = rng.standard_normal(rows * n).astype(np.float32)
    out = []
    for threads in (1, 2):
        with num_threads(threads):
            a, g, p = np.empty_like(g0), g0.copy(), p0.copy()
            ops.gate_forward(a, g, p)
            fwd = (a.copy(), g.copy())
            da = da0.copy()
            ops.gate_backward(g, p, da)
            out.append(fwd + (g, p))
    for x1, x2 in zip(*out):
        np.testing.assert_array_equal(x1, x2)
    s = 1.0 + np.tanh(g0.astype(F64))
    np.testing.assert_allclose(out[0][0], s * p0, rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(out[0][2], da0 * s * p0 * (2.0 - s), rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(out[0][3], da0 * s, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("name", ["ffn_gelu", "ffn_relu", "gmlp", "sub_post"])
def test_work_buffers_start_on_a_cache_line(name):
    # Check that every work buffer of a block starts on a 64-byte boundary (misaligned outs
    # slow array-array ufuncs down ~2x), for an odd batch size.
    m = BLOCKS[name](np.float32, 0)
    x = np.ones((7, D_IN.get(name, 6)), np.float32)
    m.backward(np.ones_like(m.forward(x)))
    for _, mod in m.named_modules():
        for buf in mod._ws.buffers():
            assert buf.ctypes.data % 64 == 0, name


@pytest.mark.parametrize("threads", [1, 2])
def test_ffn_sublayer_post_large_batch_matches_naive(threads):
    # Check LayerNorm(x + FFN(x)) when x + b2 spans several row tiles (and, at 2 threads,
    # slices over threads), including a remainder tile: 2100 rows of width 512.
    from kernels import num_threads
    rng = np.random.default_rng(9)
    d = 512
    n = 2100  # 512 KiB row tiles of 128 float64 rows: 16 full tiles and a remainder
    with num_threads(threads):
        m = FFNSublayer(d, 16, "gelu", norm="post", dtype=F64, rng=8)
        _randomize(m, rng)
        x = rng.standard_normal((n, d))
        expected = _ln(x + _ffn(m.ffn, x), m.norm.gamma.data, m.norm.beta.data)
        np.testing.assert_allclose(m(x), expected, rtol=1e-10, atol=1e-10)


@pytest.mark.parametrize("threads", [1, 2])
def test_ffn_large_batch_matches_naive(threads):
    # Check FFN(x) when the b2 fill of y is large enough to be split over threads.
    from kernels import num_threads
    from kernels.parallel import SPLIT_MIN
    rng = np.random.default_rng(10)
    d = 512
    n = SPLIT_MIN // d + 37
    with num_threads(threads):
        m = FFN(d, 16, "gelu", dtype=F64, rng=8)
        _randomize(m, rng)
        x = rng.standard_normal((n, d))
        np.testing.assert_allclose(m(x), _ffn(m, x), rtol=1e-10, atol=1e-10)

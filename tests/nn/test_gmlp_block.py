"""GMLPBlock and its SpatialGatingUnit (Liu et al. 2021): the formulas against a float64
NumPy oracle, finite-difference gradients causal and not, the causal mask (no output sees the
future; the upper triangle gets no gradient), token mixing as one GEMM over the batch, the
token-mixing kernels against kernels.reference, bad input, and a steady step's allocations."""
import numpy as np
import pytest
from gradcheck import check_module_grads
from test_step_alloc import _check_two_sizes

from engine import GMLPBlock, MSELoss, SpatialGatingUnit
from kernels import instrument, reference, token_mix


def _randomise(m, rng, scale=0.5):
    for _, p in m.named_parameters():
        p.data[...] = scale * rng.standard_normal(p.shape)


def _ln(x, gamma, beta, eps):
    mu = x.mean(-1, keepdims=True)
    var = ((x - mu) ** 2).mean(-1, keepdims=True)
    return (x - mu) / np.sqrt(var + eps) * gamma + beta


def _oracle(m, x):
    """The block by its formulas, float64, one einsum for the token mixing."""
    p = {n: q.data.astype(np.float64) for n, q in m.named_parameters()}
    t, h = x.shape[1], m.d_ffn // 2
    z = reference.activation(_ln(x, p["norm.gamma"], p["norm.beta"], 1e-5) @ p["W_in"]
                             + p["b_in"], "gelu")
    u, v = z[..., :h], z[..., h:]
    vn = _ln(v, p["sgu.norm.gamma"], p["sgu.norm.beta"], 1e-5)
    w = p["sgu.W"][:t, :t]
    if m.causal:
        w = np.tril(w)
    s = np.einsum("ts,bsc->btc", w, vn) + p["sgu.b"][:t, None]
    return x + (u * s) @ p["W_out"] + p["b_out"]


# ----------------------------------------------------------------------------- formula, grads
@pytest.mark.parametrize("causal,t", [(False, 6), (True, 6), (True, 4)])
def test_forward_is_the_gmlp_formula(causal, t):
    # Check y = x + (U * (W LN_s(V) + b)) W_out + b_out with Z = GELU(LN(x) W_in + b_in),
    # against a float64 oracle (causal: lower-triangular W; T < seq_len: W[:T, :T], b[:T]).
    rng = np.random.default_rng(0)
    m = GMLPBlock(5, 8, 6, causal=causal, dtype=np.float64, rng=0)
    _randomise(m, rng)
    x = rng.standard_normal((3, t, 5))
    np.testing.assert_allclose(m(x), _oracle(m, x), rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize("causal,b,t", [(False, 2, 4), (True, 2, 4), (True, 3, 2), (False, 1, 4)])
def test_gradcheck(causal, b, t):
    # Check dx and every parameter's gradient (both LayerNorms, W_in, b_in, sgu.W, sgu.b,
    # W_out, b_out) against central finite differences in float64.
    rng = np.random.default_rng(1)
    m = GMLPBlock(5, 6, 4, causal=causal, dtype=np.float64, rng=0)
    _randomise(m, rng)
    check_module_grads(m, rng.standard_normal((b, t, 5)), rng)


@pytest.mark.parametrize("causal", [False, True])
def test_spatial_gating_unit_gradcheck(causal):
    # Check the spatial gating unit on its own: input [U | V] of width d_ffn, output d_ffn/2.
    rng = np.random.default_rng(2)
    sgu = SpatialGatingUnit(6, 5, causal=causal, dtype=np.float64, rng=0)
    _randomise(sgu, rng)
    check_module_grads(sgu, rng.standard_normal((2, 5, 6)), rng)


def test_float32_matches_float64():
    # Check that float32 follows float64 to float32 precision.
    rng = np.random.default_rng(3)
    m64 = GMLPBlock(16, 32, 12, causal=True, dtype=np.float64, rng=0)
    _randomise(m64, rng, 0.3)
    m32 = GMLPBlock(16, 32, 12, causal=True, rng=0)
    m32.load_state_dict({k: v.astype(np.float32) for k, v in m64.state_dict().items()})
    x = rng.standard_normal((3, 12, 16))
    np.testing.assert_allclose(m32(x.astype(np.float32)), m64(x), rtol=1e-4, atol=1e-4)


def test_parameter_names_shapes_and_init():
    # Check the names and shapes of the issue, and the paper's init: sgu.W near zero
    # (|W| <= 1e-3 / seq_len), sgu.b = 1, LayerNorms at (1, 0).
    m = GMLPBlock(8, 10, 7)
    shapes = dict((n, p.shape) for n, p in m.named_parameters())
    assert shapes == {"norm.gamma": (8,), "norm.beta": (8,), "W_in": (8, 10), "b_in": (10,),
                      "sgu.norm.gamma": (5,), "sgu.norm.beta": (5,), "sgu.W": (7, 7),
                      "sgu.b": (7,), "W_out": (5, 8), "b_out": (8,)}
    w = m.sgu.W.data
    assert np.abs(w).max() <= 1e-3 / 7 and np.abs(w).max() > 0
    np.testing.assert_array_equal(m.sgu.b.data, 1.0)
    np.testing.assert_array_equal(m.sgu.norm.gamma.data, 1.0)


# ----------------------------------------------------------------------------- causality
def test_causal_outputs_do_not_see_the_future():
    # Check that changing the tokens after position t leaves outputs 0..t unchanged, and that
    # the non-causal block does mix them in.
    rng = np.random.default_rng(4)
    x = rng.standard_normal((2, 6, 5))
    x2 = x.copy()
    x2[:, 4:] += rng.standard_normal((2, 2, 5))
    for causal in (True, False):
        m = GMLPBlock(5, 8, 6, causal=causal, dtype=np.float64, rng=0)
        _randomise(m, rng)
        y, y2 = m(x).copy(), m(x2).copy()
        same = np.array_equal(y[:, :4], y2[:, :4])
        assert same == causal


def test_causal_upper_triangle_is_inert():
    # Check that W's upper triangle changes no output and receives exactly zero gradient,
    # while the lower triangle does receive one.
    rng = np.random.default_rng(5)
    m = GMLPBlock(5, 8, 6, causal=True, dtype=np.float64, rng=0)
    _randomise(m, rng)
    x, dy = rng.standard_normal((2, 6, 5)), rng.standard_normal((2, 6, 5))
    y = m(x).copy()
    m.sgu.W.data += np.triu(rng.standard_normal((6, 6)), 1)
    np.testing.assert_array_equal(m(x), y)
    m.backward(dy)
    g = m.sgu.W.grad
    assert not np.triu(g, 1).any() and g[np.tril_indices(6)].all()


def test_causal_prefix_equals_the_full_run():
    # Check that a causal block on the first T < seq_len tokens gives the first T outputs of
    # the full-length run, and the gradients of b beyond T stay zero.
    rng = np.random.default_rng(6)
    m = GMLPBlock(5, 8, 6, causal=True, dtype=np.float64, rng=0)
    _randomise(m, rng)
    x = rng.standard_normal((2, 6, 5))
    full = m(x).copy()
    np.testing.assert_allclose(m(x[:, :3].copy()), full[:, :3], rtol=1e-13, atol=1e-14)
    m.backward(np.ones((2, 3, 5)))
    assert not m.sgu.b.grad[3:].any() and not m.sgu.W.grad[3:].any()


# ----------------------------------------------------------------------------- one GEMM
@pytest.mark.parametrize("b", [1, 5])
def test_token_mixing_is_one_gemm_over_the_batch(b):
    # Check that the block runs the same GEMMs whatever the batch (3 forward, 6 backward),
    # the token mixing being one (T, T) x (T, B * d_ffn/2) product: no loop per sequence.
    rng = np.random.default_rng(7)
    m = GMLPBlock(6, 10, 4, dtype=np.float64, rng=0)
    x = rng.standard_normal((b, 4, 6))
    with instrument.record(["gemm"]) as fwd:
        m(x)
    with instrument.record(["gemm"]) as bwd:
        m.backward(x)
    assert len(fwd.calls) == 3 and len(bwd.calls) == 6
    mix = fwd.calls[1].args
    assert mix[0].shape == (4, b * 5) and mix[1].shape == (4, 4)
    assert np.shares_memory(mix[1], m.sgu.W.data)


# ----------------------------------------------------------------------------- bad input
@pytest.mark.parametrize("kwargs,exc,msg", [
    (dict(d_ffn=7), ValueError, "d_ffn: expected an even"),
    (dict(seq_len=0), ValueError, "seq_len"),
    (dict(causal=1), TypeError, "causal"),
    (dict(eps=-1.0), ValueError, "eps"),
])
def test_constructor_rejects_bad_arguments(kwargs, exc, msg):
    # Check that an odd d_ffn and other bad arguments raise naming them.
    args = dict(d_model=4, d_ffn=6, seq_len=5)
    args.update(kwargs)
    with pytest.raises(exc, match=msg):
        GMLPBlock(**args)


@pytest.mark.parametrize("causal,x,exc,msg", [
    (False, np.ones((2, 4, 5)), ValueError, "T == seq_len = 6"),
    (True, np.ones((2, 7, 5)), ValueError, "T <= seq_len = 6"),
    (False, np.ones((12, 5)), ValueError, r"\(B, T, 5\)"),
    (False, np.ones((2, 6, 4)), ValueError, "last dimension 5"),
    (False, np.ones((2, 6, 5), np.float32), TypeError, "float64"),
    (False, [[1.0]], TypeError, "ndarray"),
])
def test_rejected_input_changes_nothing(causal, x, exc, msg):
    # Check that a wrong T, a 2-D input, a wrong width or dtype raise, and that the previous
    # forward's backward then gives exactly the gradients it would have given.
    rng = np.random.default_rng(8)
    m = GMLPBlock(5, 8, 6, causal=causal, dtype=np.float64, rng=0)
    ref = GMLPBlock(5, 8, 6, causal=causal, dtype=np.float64, rng=0)
    x0, dy = rng.standard_normal((2, 6, 5)), rng.standard_normal((2, 6, 5))
    m(x0)
    with pytest.raises(exc, match=msg):
        m(x)
    dx = m.backward(dy).copy()
    ref(x0)
    np.testing.assert_array_equal(dx, ref.backward(dy))
    np.testing.assert_array_equal(m.flat_grads(), ref.flat_grads())


# ----------------------------------------------------------------------------- protocol
@pytest.mark.parametrize("causal", [False, True])
def test_residual_and_dx_acc(causal):
    # Check forward(x, residual=r) = block(x) + r and backward(dy, dx_acc=a) adds dx into a.
    rng = np.random.default_rng(10)
    m = GMLPBlock(5, 8, 6, causal=causal, dtype=np.float64, rng=0)
    _randomise(m, rng)
    x, r, dy = (rng.standard_normal((2, 6, 5)) for _ in range(3))
    y = m(x).copy()
    dx = m.backward(dy).copy()
    np.testing.assert_allclose(m(x, residual=r), y + r, rtol=1e-14, atol=1e-15)
    acc = rng.standard_normal((2, 6, 5))
    expect = acc + dx
    assert m.backward(dy, dx_acc=acc) is acc
    np.testing.assert_allclose(acc, expect, rtol=1e-13, atol=1e-15)


def test_overlap_and_one_backward_per_forward():
    # Check that the block's own output as its input (or as dy) is rejected as overlapping,
    # and that a second backward without a new forward is a RuntimeError.
    rng = np.random.default_rng(11)
    m = GMLPBlock(5, 8, 6, dtype=np.float64, rng=0)
    y = m(rng.standard_normal((2, 6, 5)))
    with pytest.raises(ValueError, match="overlaps"):
        m(y)
    with pytest.raises(ValueError, match="overlaps"):
        m.backward(y)
    m.backward(np.ones((2, 6, 5)))
    with pytest.raises(RuntimeError, match="forward"):
        m.backward(np.ones((2, 6, 5)))


# ----------------------------------------------------------------------------- kernels
def test_token_mix_kernels_match_reference():
    # Check swap01, the gating pair and the causal mask kernels against the naive twins, on
    # strided column halves as the unit uses them.
    rng = np.random.default_rng(9)
    b, t, c = 3, 5, 4
    z = rng.standard_normal((b, t, 2 * c))
    u = z[:, :, :c]
    s_tm, da = rng.standard_normal((t, b, c)), rng.standard_normal((b, t, c))
    bias = rng.standard_normal(t)
    w = rng.standard_normal((t + 2, t + 2))[:t, :t]  # a strided corner, as W[:T, :T]
    mask = np.tri(t)
    out = {}
    for name, mod in (("fast", token_mix), ("ref", reference)):
        sw = mod.swap01(np.empty((t, b, c)), z[:, :, c:])
        a = mod.sgu_gate_forward(np.empty((b, t, c)), s_tm, bias, u)
        dz = np.zeros((b, t, 2 * c))
        ds_tm, db = s_tm.copy(), np.ones(t)
        mod.sgu_gate_backward(dz[:, :, :c], ds_tm, db, np.empty((b, t, c)), da, bias, u)
        wm = mod.causal_weight(np.empty((t, t)), w, mask)
        dw = np.ones((t, t))
        mod.causal_grad_add(dw, w.copy(), mask)
        out[name] = (sw, a, dz, ds_tm, db, wm, dw)
    for f, r in zip(out["fast"], out["ref"]):
        np.testing.assert_allclose(f, r, rtol=1e-14)
    np.testing.assert_array_equal(out["fast"][3][:, :, c:], 0.0)  # only dU's half written


def test_token_mix_checked_kernels_reject_bad_shapes():
    # Check that the checked kernels name the mismatched argument.
    with pytest.raises(ValueError, match="out"):
        token_mix.swap01(np.empty((3, 2, 4)), np.ones((3, 2, 4)))
    with pytest.raises(ValueError, match="bias"):
        token_mix.sgu_gate_forward(np.empty((2, 3, 4)), np.ones((3, 2, 4)), np.ones(2),
                                   np.ones((2, 3, 4)))
    with pytest.raises(ValueError, match="dbias"):
        token_mix.sgu_gate_backward(np.empty((2, 3, 4)), np.ones((3, 2, 4)), np.zeros(4),
                                    np.empty((2, 3, 4)), np.ones((2, 3, 4)), np.ones(3),
                                    np.ones((2, 3, 4)))


# ----------------------------------------------------------------------------- allocation
def _make(causal):
    def make(rng, k):
        m = GMLPBlock(32 * k, 64 * k, 16 * k, causal=causal, rng=0)
        x = rng.standard_normal((4, 16 * k, 32 * k)).astype(np.float32)
        t = rng.standard_normal((4, 16 * k, 32 * k)).astype(np.float32)
        return m, x, t, MSELoss()
    return make


@pytest.mark.parametrize("causal", [False, True])
def test_steady_step_allocates_no_array(causal):
    # Check that a steady training step allocates no array over 1 KiB (tracemalloc at two
    # sizes, as tests/nn/test_step_alloc.py).
    _check_two_sizes(f"GMLPBlock-causal={causal}", _make(causal), threads=1)

"""MultiHeadAttention: forward against a textbook float64 attention, exact gradients (finite
differences), causality, the fused options, BLAS on contiguous operands, and errors that
change nothing."""
import numpy as np
import pytest
from scipy.linalg import blas

from engine.nn.attention import MultiHeadAttention
from gradcheck import assert_close, check_module_grads, numeric_grad
from kernels import attention as KA
from kernels import instrument
from kernels import reference as R

F64 = np.float64


PATHS = ["kernel", "blas"]  # the compiled heads (kernels.sdpa) and the per-head GEMMs


def _mha(d=12, h=3, causal=True, dtype=F64, seed=0, path="auto", **kw):
    m = MultiHeadAttention(d, h, causal=causal, dtype=dtype, rng=seed, **kw)
    m.path = path
    rng = np.random.default_rng(seed + 100)
    for p in m.parameters():  # non-zero biases, scores of order 1
        p.data = (0.5 * rng.standard_normal(p.shape)).astype(dtype)
    return m


def _ref(m, x):
    b_qkv = np.zeros(3 * m.d_model) if m.b_qkv is None else m.b_qkv.data
    b_o = np.zeros(m.d_model) if m.b_o is None else m.b_o.data
    return R.attention(x.astype(F64), m.W_qkv.data.astype(F64), b_qkv, m.W_o.data.astype(F64),
                       b_o, m.n_heads, m.causal)


@pytest.mark.parametrize("path", PATHS)
@pytest.mark.parametrize("causal", [True, False])
def test_forward_matches_the_textbook_attention(causal, path):
    # Check that the output equals softmax(q k^T / sqrt(dh) + mask) v W_o + b_o per head.
    m = _mha(causal=causal, path=path)
    x = np.random.default_rng(1).standard_normal((3, 7, 12))
    assert_close(m(x), _ref(m, x), "y", rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize("path", PATHS)
def test_float32_forward_is_close_to_float64(path):
    # Check the float32 path (sgemm, float32 kernels) against the float64 reference.
    m = _mha(16, 4, dtype=np.float32, path=path)
    x = np.random.default_rng(2).standard_normal((2, 9, 16)).astype(np.float32)
    assert_close(m(x), _ref(m, x), "y", rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize("path", PATHS)
@pytest.mark.parametrize("causal", [True, False])
@pytest.mark.parametrize("bias", [True, False])
def test_gradients_match_finite_differences(causal, bias, path):
    # Check dx and every parameter gradient against float64 central differences.
    m = _mha(causal=causal, bias=bias, path=path)
    x = np.random.default_rng(3).standard_normal((2, 5, 12))
    check_module_grads(m, x, np.random.default_rng(4))


def test_gradients_with_attention_dropout_match_finite_differences():
    # Check the backward through a fixed dropout mask (the generator rewound before each
    # forward, so every evaluation draws the same mask).
    gen = np.random.default_rng(5)
    m = _mha(dropout=0.3, seed=1)
    m._rng = gen
    start = gen.bit_generator.state
    x = np.random.default_rng(6).standard_normal((2, 4, 12))
    R_ = np.random.default_rng(7).standard_normal((2, 4, 12))

    def loss():
        gen.bit_generator.state = start
        return float(np.sum(m.forward(x) * R_))

    gen.bit_generator.state = start
    m.zero_grad()
    y = m.forward(x).copy()
    dx = m.backward(R_.copy()).copy()
    grads = {n: p.grad.copy() for n, p in m.named_parameters()}
    m.eval()
    assert not np.allclose(m.forward(x), y)  # the mask did drop something
    m.train()
    assert_close(dx, numeric_grad(loss, x), "dx", 1e-5, 1e-7)
    for n, p in m.named_parameters():
        assert_close(grads[n], numeric_grad(loss, p.data), n, 1e-5, 1e-7)


def _outputs_as_the_future_changes(causal, path):
    """For t = 0..6: (t, outputs for x, outputs for x with noise added at positions > t)."""
    m = _mha(causal=causal, path=path)
    rng = np.random.default_rng(8)
    x = rng.standard_normal((2, 8, 12))
    y = m(x).copy()
    for t in range(7):
        x2 = x.copy()
        x2[:, t + 1:] += rng.standard_normal(x2[:, t + 1:].shape)
        yield t, y, m(x2)


@pytest.mark.parametrize("path", PATHS)
def test_perturbing_the_future_changes_no_past_output(path):
    # Check causality forward: outputs at positions <= t are bit-identical when inputs at
    # positions > t change.
    for t, y, y2 in _outputs_as_the_future_changes(True, path):
        np.testing.assert_array_equal(y2[:, :t + 1], y[:, :t + 1])
        assert not np.allclose(y2[:, t + 1:], y[:, t + 1:])


@pytest.mark.parametrize("path", PATHS)
def test_full_attention_does_see_the_future(path):
    # Check that the causality test above can fail: without the mask position 0 changes
    # whichever later inputs change.
    for t, y, y2 in _outputs_as_the_future_changes(False, path):
        assert not np.allclose(y2[:, 0], y[:, 0]), t


@pytest.mark.parametrize("path", PATHS)
def test_no_gradient_flows_backwards_in_time(path):
    # Check causality backward: the gradient of the output at position t reaches inputs at
    # positions <= t only (exact zeros after t), and does reach position 0.
    m = _mha(causal=True, path=path)
    rng = np.random.default_rng(10)
    x = rng.standard_normal((2, 8, 12))
    for t in (0, 3, 6):
        m(x)
        dy = np.zeros_like(x)
        dy[:, t] = rng.standard_normal((2, 12))
        dx = m.backward(dy)
        assert np.all(dx[:, t + 1:] == 0.0)
        assert np.all(np.abs(dx[:, 0]).sum(-1) > 0)


@pytest.mark.parametrize("path", PATHS)
def test_residual_and_dx_acc_are_fused_options(path):
    # Check forward(x, residual=r) = forward(x) + r and backward(dy, dx_acc=a) = a + dx.
    m = _mha(path=path)
    rng = np.random.default_rng(11)
    x, r, dy, a = (rng.standard_normal((2, 5, 12)) for _ in range(4))
    y = m(x).copy()
    dx = m.backward(dy).copy()
    m.zero_grad()
    assert_close(m(x, residual=r), y + r, "y + r", 1e-13, 1e-13)
    acc = a.copy()
    out = m.backward(dy, dx_acc=acc)
    assert out is acc
    assert_close(acc, a + dx, "dx_acc", 1e-13, 1e-13)


@pytest.mark.parametrize("path", PATHS)
def test_every_gemm_runs_in_place_on_contiguous_operands(path):
    # Check that each GEMM of a step gets 2-D C-contiguous operands of the module's dtype, so
    # that scipy's wrapper copies nothing and writes its result into the buffer itself; and
    # that the per-head products are B * n_heads GEMMs each (2 forward, 4 backward) on the
    # BLAS path, none on the compiled one.
    m = _mha(16, 4, dtype=np.float32, path=path)
    x = np.random.default_rng(12).standard_normal((3, 6, 16)).astype(np.float32)
    with instrument.record() as rec:
        m(x)
        m.backward(np.ones((3, 6, 16), np.float32))
    calls = rec.of("gemm")
    assert len(calls) == 2 + 4 + (6 * 3 * 4 if path == "blas" else 0)
    for c in calls:
        out, a, b, ta, tb, alpha, beta, _ = c.args  # and defer
        for arr in (out, a, b):
            assert arr.ndim == 2 and arr.flags.c_contiguous and arr.dtype == np.float32
        res = blas.sgemm(alpha, b.T, a.T, beta, out.T, tb, ta, 1)
        assert np.shares_memory(res, out)  # in place: no silent copy of out


def test_head_buffers_are_contiguous_heads_of_the_projection():
    # Check kernels.attention's split against the reference layout, and that each head of
    # the head-major buffer is one contiguous (T, dh) block.
    rng = np.random.default_rng(13)
    x = rng.standard_normal((2, 5, 3 * 12))
    out = np.empty((3, 2, 4, 5, 3))
    KA.heads_split(out, x, 4)
    np.testing.assert_array_equal(out, R.heads_split(np.empty_like(out), x, 4))
    assert out[1, 1, 2].flags.c_contiguous
    back = np.empty_like(x)
    KA.heads_merge(back, out)
    np.testing.assert_array_equal(back, x)
    s = rng.standard_normal((3, 4, 4))
    np.testing.assert_array_equal(KA.causal_fill(s.copy(), -np.inf),
                                  R.causal_fill(s.copy(), -np.inf))


def test_one_backward_per_forward():
    # Check that a second backward without a forward raises.
    m = _mha()
    x = np.random.default_rng(14).standard_normal((1, 3, 12))
    m(x)
    m.backward(np.ones_like(x))
    with pytest.raises(RuntimeError, match="forward"):
        m.backward(np.ones_like(x))


def test_d_model_not_divisible_by_n_heads_is_refused():
    # Check the constructor's error names d_model and n_heads.
    with pytest.raises(ValueError, match="d_model.*multiple of n_heads = 5"):
        MultiHeadAttention(12, 5)


@pytest.mark.parametrize("bad, err, match", [
    (np.ones((4, 12)), ValueError, r"\(B, T, 12\)"),
    (np.ones((1, 4, 11)), ValueError, "last dimension 12"),
    (np.ones((1, 4, 12), np.float32), TypeError, "float64"),
    ([[1.0]], TypeError, "ndarray"),
])
def test_bad_input_raises_and_changes_nothing(bad, err, match):
    # Check that a rejected call leaves the previous forward intact: its backward gives the
    # same gradients as if the bad call never happened.
    m = _mha()
    x = np.random.default_rng(15).standard_normal((2, 4, 12))
    dy = np.random.default_rng(16).standard_normal((2, 4, 12))
    m(x)
    ref_dx = m.backward(dy).copy()
    ref = m.flat_grads().copy()
    m.zero_grad()
    params = m.flat_params().copy()
    m(x)
    with pytest.raises(err, match=match):
        m(bad)
    np.testing.assert_array_equal(m.backward(dy), ref_dx)
    np.testing.assert_array_equal(m.flat_grads(), ref)
    np.testing.assert_array_equal(m.flat_params(), params)


def test_scores_above_the_bound_are_refused_before_anything_runs():
    # Check the stated memory bound: k * B * h * T^2 * itemsize bytes, refused above
    # max_scores_bytes with the size in the message, and accepted at the bound.
    m = _mha(12, 3, max_scores_bytes=2 * 2 * 3 * 8 * 8 * 8)  # exactly B=2, T=8, float64
    assert m.scores_nbytes(2, 8) == 2 * 2 * 3 * 64 * 8
    m(np.zeros((2, 8, 12)))
    with pytest.raises(ValueError, match="max_scores_bytes"):
        m(np.zeros((2, 9, 12)))
    with pytest.raises(ValueError, match="max_scores_bytes"):
        m(np.zeros((3, 8, 12)))
    with_dropout = _mha(12, 3, dropout=0.1)
    assert with_dropout.scores_nbytes(2, 8) == 2 * m.scores_nbytes(2, 8)


@pytest.mark.parametrize("path", PATHS)
def test_compiled_and_blas_paths_agree(path):
    # Check the two paths against each other in float64: outputs and every gradient (each
    # also checked against the reference above; this ties them at one larger shape, T = 21
    # and d_head = 8, where neither is a multiple of the kernel's row blocks).
    rng = np.random.default_rng(30)
    x = rng.standard_normal((2, 21, 16))
    dy = rng.standard_normal((2, 21, 16))
    out = {}
    for p in PATHS:
        m = _mha(16, 2, path=p, seed=3)
        y = m(x).copy()
        dx = m.backward(dy).copy()
        out[p] = [y, dx] + [q.grad.copy() for q in m.parameters()]
    for a, b in zip(out[path], out["blas" if path == "kernel" else "kernel"]):
        assert_close(a, b, "path", 1e-12, 1e-12)


def test_path_is_checked_and_dropout_runs_blas():
    # Check that path accepts its three values only, and that attention dropout in training
    # runs the per-head GEMMs whatever path says (the compiled kernels have no dropout).
    m = _mha(dropout=0.2, path="kernel")
    with pytest.raises(ValueError, match="path"):
        m.path = "fast"
    assert m.path == "kernel"
    assert not m.uses_kernel(8)
    m.eval()
    assert m.uses_kernel(8)


@pytest.mark.parametrize("path", PATHS)
def test_empty_sequences_give_empty_outputs(path):
    # Check that T = 0 (and B = 0) run: an empty output and input gradient, gradients unchanged.
    m = _mha(path=path)
    for shape in ((2, 0, 12), (0, 3, 12)):
        m.zero_grad()
        y = m(np.zeros(shape))
        assert y.shape == shape
        assert m.backward(np.zeros(shape)).shape == shape
        assert all(not p.grad.any() for p in m.parameters())


@pytest.mark.parametrize("norm", ["pre", "post"])
def test_transformer_block_on_empty_sequences(norm):
    # Check that a TransformerBlock runs T = 0 like B = 0: empty output and input gradient.
    from engine.nn.transformer import TransformerBlock
    m = TransformerBlock(12, 3, 20, norm=norm, dtype=F64, rng=0)
    y = m(np.zeros((2, 0, 12)))
    assert y.shape == (2, 0, 12)
    assert m.backward(np.zeros((2, 0, 12))).shape == (2, 0, 12)


@pytest.mark.parametrize("causal, t, per_head", [(True, 130, False), (False, 130, True),
                                                 (False, 9, False)])
def test_auto_path_follows_kernel_wins_and_gemm_list_matches(causal, t, per_head):
    # Check that "auto" takes the per-head GEMMs exactly where kernel_wins says BLAS is faster
    # (full attention at long T), and that gemm_list lists the GEMMs that then run.
    from engine.nn.attention import kernel_wins
    m = _mha(8, 2, causal=causal, dtype=np.float32)
    assert kernel_wins(t, 4, causal) is not per_head
    x = np.random.default_rng(14).standard_normal((1, t, 8)).astype(np.float32)
    with instrument.record() as rec:
        m(x)
        m.backward(np.ones_like(x))
    seen = [c.args for c in rec.of("gemm")]
    assert len(seen) == 6 + (6 * 2 if per_head else 0)
    assert len(m.gemm_list((1, t))) == len(seen)


@pytest.mark.parametrize("path, fills", [("kernel", 1), ("blas", 2)])
def test_compiled_heads_take_the_qkv_bias_without_a_fill(path, fills):
    # Check that on the compiled path the QKV bias goes to the attention kernels (no fill of
    # the (N, 3 d) rows before a beta = 1 GEMM; only the output's b_o fill is left), while
    # the per-head path still fills; both give the textbook output.
    m = _mha(path=path)
    x = np.random.default_rng(1).standard_normal((2, 5, 12))
    with instrument.record() as rec:
        y = m.forward(x)
    assert rec.counts()["fill_rows"] == fills
    qkv_gemm = rec.of("gemm")[0].args
    assert qkv_gemm[6] == (0.0 if path == "kernel" else 1.0)  # beta of [q | k | v] = x W_qkv
    np.testing.assert_allclose(y, _ref(m, x), rtol=1e-12, atol=1e-12)

"""GatedFFN (Shazeer 2020): the formula against a float64 NumPy oracle, finite-difference
gradients for every registered activation, the one GEMM for gate and up, dropout, the fused
residual / dx_acc options, the GLU kernels against kernels.reference, bad input, and a steady
step's allocations."""
import numpy as np
import pytest
from gradcheck import check_module_grads
from test_step_alloc import _check_two_sizes

from engine import GatedFFN, MSELoss
from kernels import glu, instrument, reference
from kernels.activations import ACTIVATIONS


def _randomise(m, rng, scale=0.5):
    # Biases start at zero and weights small: give every parameter values of its own.
    for _, p in m.named_parameters():
        p.data[...] = scale * rng.standard_normal(p.shape)


def _oracle(m, x):
    """y by the formula, in float64 from the module's parameters (reference activation)."""
    p = {n: q.data.astype(np.float64) for n, q in m.named_parameters()}
    x = x.astype(np.float64)
    g = x @ p["W_gate"] + p.get("b_gate", 0.0)
    u = x @ p["W_up"] + p.get("b_up", 0.0)
    h = reference.activation(g, m.activation, m.negative_slope) * u
    return h @ p["W_down"] + p.get("b_down", 0.0)


# ----------------------------------------------------------------------------- formula, grads
@pytest.mark.parametrize("act", ["silu", "gelu", "relu", "sigmoid", "identity"])
@pytest.mark.parametrize("bias", [False, True])
def test_forward_is_the_glu_formula(act, bias):
    # Check y = (act(x W_gate + b_gate) * (x W_up + b_up)) W_down + b_down (SwiGLU, GEGLU,
    # ReGLU, GLU, bilinear) in float64, for (B, T, d) input.
    rng = np.random.default_rng(0)
    m = GatedFFN(6, 10, act, bias=bias, dtype=np.float64, rng=0)
    _randomise(m, rng)
    x = rng.standard_normal((2, 3, 6))
    y = m(x)
    assert y.shape == (2, 3, 6)
    np.testing.assert_allclose(y, _oracle(m, x), rtol=1e-12, atol=1e-13)


def test_float32_matches_float64():
    # Check that float32 follows the float64 result to float32 precision.
    rng = np.random.default_rng(1)
    m64 = GatedFFN(16, 40, "silu", bias=True, dtype=np.float64, rng=0)
    _randomise(m64, rng, 0.3)
    m32 = GatedFFN(16, 40, "silu", bias=True, dtype=np.float32, rng=0)
    m32.load_state_dict({k: v.astype(np.float32) for k, v in m64.state_dict().items()})
    x = rng.standard_normal((33, 16))
    np.testing.assert_allclose(m32(x.astype(np.float32)), m64(x), rtol=2e-4, atol=2e-5)


@pytest.mark.parametrize("act", ACTIVATIONS)
@pytest.mark.parametrize("bias", [False, True])
def test_gradcheck_every_activation(act, bias):
    # Check dx and every parameter's gradient against central finite differences (float64),
    # for every activation of the registry.
    rng = np.random.default_rng(2)
    m = GatedFFN(5, 7, act, bias=bias, dtype=np.float64, rng=0, negative_slope=0.2)
    _randomise(m, rng)
    x = rng.standard_normal((2, 3, 5))
    x = np.where(np.abs(x) < 0.05, 0.1, x)  # relu-like kinks are at z = 0, not at x = 0
    check_module_grads(m, x, rng)


def test_parameter_names_and_shapes():
    # Check the PyTorch-shaped names: W_gate, W_up (d_model, d_ff), W_down (d_ff, d_model), and
    # the biases only with bias=True.
    assert [(n, p.shape) for n, p in GatedFFN(4, 9).named_parameters()] == [
        ("W_gate", (4, 9)), ("W_up", (4, 9)), ("W_down", (9, 4))]
    assert [(n, p.shape) for n, p in GatedFFN(4, 9, bias=True).named_parameters()] == [
        ("W_gate", (4, 9)), ("W_up", (4, 9)), ("b_gate", (9,)), ("b_up", (9,)),
        ("W_down", (9, 4)), ("b_down", (4,))]


# ----------------------------------------------------------------------------- one GEMM
def test_gate_and_up_are_one_gemm_each_way():
    # Check 2 forward and 4 backward GEMMs (as an FFN), the first writing both projections:
    # a (2 d_ff, N) output from the (2 d_ff, d_model) weight [W_gate^T; W_up^T].
    rng = np.random.default_rng(3)
    m = GatedFFN(8, 12, bias=True, dtype=np.float64, rng=0)
    x, dy = rng.standard_normal((5, 8)), rng.standard_normal((5, 8))
    with instrument.record(["gemm"]) as fwd:
        m(x)
    with instrument.record(["gemm"]) as bwd:
        m.backward(dy)
    assert len(fwd.calls) == 2 and len(bwd.calls) == 4
    out, a = fwd.calls[0].args[0], fwd.calls[0].args[1]
    assert out.shape == (24, 5) and a.shape == (24, 8)
    np.testing.assert_array_equal(a, np.concatenate([m.W_gate.data.T, m.W_up.data.T]))
    assert np.shares_memory(a, m.W_gate.data) and np.shares_memory(a, m.W_up.data)


def test_assigned_weights_reach_the_fused_gemm():
    # Check that assigning W_up.data (a copy into the arena) changes what the GEMM computes.
    rng = np.random.default_rng(4)
    m = GatedFFN(4, 6, dtype=np.float64, rng=0)
    x = rng.standard_normal((3, 4))
    m.W_up.data = rng.standard_normal((4, 6))
    np.testing.assert_allclose(m(x), _oracle(m, x), rtol=1e-12)


# ----------------------------------------------------------------------------- dropout
def test_dropout_masks_the_gated_units():
    # Check training-mode dropout: y = (H * mask) W_down with the inverted-dropout mask the
    # generator draws (after the weights), and dx/dW_down from the same mask; eval mode: none.
    rng = np.random.default_rng(5)
    gen = np.random.default_rng(42)
    m = GatedFFN(6, 8, "gelu", dropout=0.5, dtype=np.float64, rng=gen)
    state = gen.bit_generator.state
    x, dy = rng.standard_normal((7, 6)), rng.standard_normal((7, 6))
    y = m(x).copy()
    twin = np.random.default_rng(0)
    twin.bit_generator.state = state
    mask_t = np.empty((8, 7))
    reference.dropout_forward(np.empty((8, 7)), mask_t, np.ones((8, 7)), 0.5, twin)
    p = {n: q.data for n, q in m.named_parameters()}
    g, u = x @ p["W_gate"], x @ p["W_up"]
    h = reference.activation(g, "gelu") * u * mask_t.T
    np.testing.assert_allclose(y, h @ p["W_down"], rtol=1e-12)
    m.backward(dy)
    np.testing.assert_allclose(m.W_down.grad, h.T @ dy, rtol=1e-12)
    m.eval()
    np.testing.assert_allclose(m(x), _oracle(m, x), rtol=1e-12)


# ----------------------------------------------------------------------------- fused options
def test_residual_and_dx_acc():
    # Check forward(x, residual=r) = f(x) + r and backward(dy, dx_acc=a) adds dx into a.
    rng = np.random.default_rng(6)
    m = GatedFFN(5, 6, bias=True, dtype=np.float64, rng=0)
    _randomise(m, rng)
    x, r, dy = (rng.standard_normal((4, 5)) for _ in range(3))
    y = m(x).copy()
    dx = m.backward(dy).copy()
    np.testing.assert_allclose(m(x, residual=r), y + r, rtol=1e-14, atol=1e-15)
    acc = rng.standard_normal((4, 5))
    expect = acc + dx
    assert m.backward(dy, dx_acc=acc) is acc
    np.testing.assert_allclose(acc, expect, rtol=1e-13)


# ----------------------------------------------------------------------------- bad input
@pytest.mark.parametrize("kwargs,exc,msg", [
    (dict(activation="swish"), ValueError, "activation"),
    (dict(dropout=1.0), ValueError, "dropout"),
    (dict(bias=1), TypeError, "bias"),
    (dict(init="uniform"), ValueError, "init"),
    (dict(d_ff=0), ValueError, "d_ff"),
    (dict(dtype=np.int32), TypeError, "dtype"),
])
def test_constructor_rejects_bad_arguments(kwargs, exc, msg):
    # Check that a bad argument raises naming it.
    args = dict(d_model=4, d_ff=6)
    args.update(kwargs)
    with pytest.raises(exc, match=msg):
        GatedFFN(**args)


@pytest.mark.parametrize("x,exc,msg", [
    (np.ones((3, 5)), ValueError, "last dimension 4"),
    (np.ones((3, 4), np.float32), TypeError, "float64"),
    (np.ones((3, 4, 1, 1)), ValueError, "shape"),
    (np.asfortranarray(np.ones((3, 4))), ValueError, "C-contiguous"),
])
def test_rejected_input_changes_nothing(x, exc, msg):
    # Check that a bad x raises and leaves the previous forward's backward and the gradients
    # exactly as they were.
    rng = np.random.default_rng(7)
    m = GatedFFN(4, 6, dtype=np.float64, rng=0)
    x0, dy = rng.standard_normal((3, 4)), rng.standard_normal((3, 4))
    m(x0)
    params = m.flat_params().copy()
    with pytest.raises(exc, match=msg):
        m(x)
    m.backward(dy)
    ref = GatedFFN(4, 6, dtype=np.float64, rng=0)
    ref(x0)
    ref.backward(dy)
    np.testing.assert_array_equal(m.flat_grads(), ref.flat_grads())
    np.testing.assert_array_equal(m.flat_params(), params)


# ----------------------------------------------------------------------------- kernels
@pytest.mark.parametrize("act", ACTIVATIONS)
@pytest.mark.parametrize("dtype", [np.float64, np.float32])
def test_glu_kernels_match_reference(act, dtype):
    # Check glu_forward (h and the two factors it leaves) and glu_backward against the naive
    # twins (run in float64 on the same values), at one element, widths that are not
    # multiples of 16, an empty batch, and arrays split over threads (> 2 x 256 Ki elements).
    rng = np.random.default_rng(8)
    for shape in [(1, 1), (1, 17), (3, 5), (0, 5), (40, 3000), (300, 2000)]:
        g, u, dh = ((2 * rng.standard_normal(shape)).astype(dtype) for _ in range(3))
        gg, uu, h = g.copy(), u.copy(), np.empty_like(g)
        glu.glu_forward(h, gg, uu, act)
        fwd = (h.copy(), gg.copy(), uu.copy())
        glu.glu_backward(gg, uu, dh)
        g64, u64, h64 = g.astype(np.float64), u.astype(np.float64), np.empty(shape)
        reference.glu_forward(h64, g64, u64, act)
        ref = (h64.copy(), g64.copy(), u64.copy())
        reference.glu_backward(g64, u64, dh.astype(np.float64))
        # (float64 atol: the reference's 1 + tanh cancels in gelu_tanh's left tail, ~1e-14 x |u|)
        tol = dict(rtol=1e-12, atol=1e-13) if dtype == np.float64 else dict(rtol=2e-5, atol=2e-6)
        for a, b, name in zip(fwd + (gg, uu), ref + (g64, u64), ("h", "g", "u", "dG", "dU")):
            np.testing.assert_allclose(a, b.astype(dtype), **tol, err_msg=f"{name} {shape}")


@pytest.mark.parametrize("dtype", [np.float64, np.float32])
def test_glu_kernels_bit_identical_across_thread_counts(dtype):
    # Check that the GLU passes give the same bits at 1 and 2 threads (split flat) and that
    # a NaN in the gate reaches h and both factors.
    from kernels import num_threads
    rng = np.random.default_rng(9)
    g, u, dh = (rng.standard_normal((300, 2000)).astype(dtype) for _ in range(3))
    g[7, 11] = np.nan
    runs = []
    for n in (1, 2):
        with num_threads(n):
            gg, uu, h = g.copy(), u.copy(), np.empty_like(g)
            glu.glu_forward(h, gg, uu, "gelu")
            glu.glu_backward(gg, uu, dh)
            runs.append((h, gg, uu))
    for a, b in zip(*runs):
        np.testing.assert_array_equal(a, b)
    assert all(np.isnan(x[7, 11]) for x in runs[0])


def test_fill_by_row_and_rowsum_match_reference():
    # Check the per-row bias fill and the per-row sums (accumulating with beta) of the
    # transposed layout against the naive twins.
    rng = np.random.default_rng(9)
    x, v = rng.standard_normal((7, 11)), rng.standard_normal(7)
    np.testing.assert_array_equal(glu.fill_by_row(np.empty((7, 11)), v),
                                  reference.fill_by_row(np.empty((7, 11)), v))
    out, ref = rng.standard_normal(7), None
    ref = reference.rowsum(out.copy(), x, 0.5)
    np.testing.assert_allclose(glu.rowsum(out, x, 0.5), ref, rtol=1e-13)


def test_glu_kernel_rejects_overlapping_and_mismatched_arrays():
    # Check that the checked GLU kernel names the bad argument.
    g = np.ones((2, 3))
    with pytest.raises(ValueError, match="overlap"):
        glu.glu_forward(np.empty((2, 3)), g, g)
    with pytest.raises(ValueError, match="u"):
        glu.glu_forward(np.empty((2, 3)), g, np.ones((3, 2)))
    with pytest.raises(ValueError, match="act"):
        glu.glu_forward(np.empty((2, 3)), g, np.ones((2, 3)), "swish")


# ----------------------------------------------------------------------------- allocation
def _make(act, bias, dropout):
    def make(rng, k):
        m = GatedFFN(32 * k, 96 * k, act, bias=bias, dropout=dropout, rng=0)
        x = rng.standard_normal((4, 16 * k, 32 * k)).astype(np.float32)
        t = rng.standard_normal((4, 16 * k, 32 * k)).astype(np.float32)
        return m, x, t, MSELoss()
    return make


@pytest.mark.parametrize("act,bias,dropout", [("silu", False, 0.0), ("gelu", True, 0.1)])
def test_steady_step_allocates_no_array(act, bias, dropout):
    # Check that a steady training step allocates no array over 1 KiB (tracemalloc at two
    # sizes, as tests/nn/test_step_alloc.py).
    _check_two_sizes(f"GatedFFN-{act}", _make(act, bias, dropout), threads=1)


@pytest.mark.slow
def test_steady_step_allocates_no_array_with_split_passes():
    # Check that with two threads, where the GLU passes over [G; U] (2048 x 1024 elements at
    # the base size) are split over the thread pool, a steady step still allocates nothing
    # over the limits of tests/nn/test_step_alloc.py's split-pass check.
    from test_step_alloc import PARALLEL_LIMIT, PARALLEL_PY_OBJECTS

    def make(rng, k):
        m = GatedFFN(512 * k, 1024 * k, "silu", rng=0)
        x = rng.standard_normal((1024 * k, 512 * k)).astype(np.float32)
        return m, x, rng.standard_normal(x.shape).astype(np.float32), MSELoss()
    _check_two_sizes("GatedFFN-split", make, 2, PARALLEL_LIMIT, PARALLEL_PY_OBJECTS)

"""Kernels compiled with LLVM's SLP vectoriser (``kernels.jit.jit(slp=True)``): the switch
reaches the compile, it packs fixed-lane sums into vector instructions, and every such kernel
gives exactly the bits of the same code compiled without it (SLP must not reorder a sum)."""
import re

import numba
import numpy as np
import pytest
from numba.core import config as numba_config

from kernels import jit as J
from kernels import lanes, layernorm, losses, optim, sdpa, softmax, token_mix

WIDTHS = [1, 7, 8, 9, 17, 130]


def _plain(kernel):
    """The same Python function compiled with the kernel's options and SLP off (not
    cached)."""
    fastmath = set(kernel.targetoptions["fastmath"])
    return numba.jit(**dict(J.OPTIONS, fastmath=fastmath, cache=False))(kernel.py_func)


def _rows(rng, n, d, dtype):
    x = (rng.standard_normal((n, d)) * 3.0 + 0.5).astype(dtype)
    if n > 2 and d > 1:       # a NaN row and an inf row: propagated alike by both compiles
        x[1, d // 2] = np.nan
        x[2, 0] = np.inf
    return x


def _layernorm_fwd(rng, d, dtype):
    n = 6
    x = _rows(rng, n, d, dtype)
    return (np.empty_like(x), np.empty(n, dtype), np.empty(n, dtype), x,
            rng.standard_normal(d).astype(dtype), rng.standard_normal(d).astype(dtype),
            dtype(1e-5), 0, n)


def _layernorm_bwd(rng, d, dtype):
    n = 6
    x = _rows(rng, n, d, dtype)
    with np.errstate(invalid="ignore"):     # the inf row's statistics are NaN, as intended
        mean = x.mean(axis=1).astype(dtype)
        rstd = (1.0 / (x.std(axis=1) + 0.1)).astype(dtype)
    rows = 4                                  # two blocks, the second ragged
    dx = rng.standard_normal((n, d)).astype(dtype)
    return (np.empty((2, d), dtype), np.empty((2, d), dtype), dx,
            _rows(rng, n, d, dtype), x, mean, rstd, rng.standard_normal(d).astype(dtype),
            d % 2 == 1, rows, True, 0, 2)   # odd widths add into dx, even overwrite it


def _softmax_fwd(rng, d, dtype):
    x = _rows(rng, 6, d, dtype)
    return np.empty_like(x), x, 0, 6


def _log_softmax_fwd(rng, d, dtype):
    x = _rows(rng, 6, d, dtype)
    return np.empty_like(x), x, np.empty(d, dtype), 0, 6


def _softmax_bwd(rng, d, dtype):
    n = 6
    y = rng.random((n, d)).astype(dtype)
    y /= y.sum(axis=1, keepdims=True)
    return np.empty_like(y), _rows(rng, n, d, dtype), y, 0, n


def _mse_sums(rng, d, dtype):
    n = 2 * losses.BLOCK + 8 * d + 3          # two whole blocks and a ragged one
    nb = -(-n // losses.BLOCK)
    p, t = rng.standard_normal(n).astype(dtype), rng.standard_normal(n).astype(dtype)
    return np.zeros(nb), p, t, 0, nb


def _mse_fwd_bwd(rng, d, dtype):
    part, p, t, b0, b1 = _mse_sums(rng, d, dtype)
    return part, np.empty_like(p), p, t, dtype(0.25), b0, b1


def _sumsq_blocks(rng, d, dtype):
    n = optim.NORM_BLOCK + 8 * d + 5
    nb = -(-n // optim.NORM_BLOCK)
    g = (rng.standard_normal(n) * 1e3).astype(dtype)
    return np.zeros(nb + 1), 1, g, 0, nb


def _bias_from_blocks(rng, d, dtype):
    return np.zeros(3, dtype), _rows(rng, 4 * 3, d, dtype).reshape(4, 3, d)


def _wide(case):
    # the case's kernel in its 16-lane form: a lane scratch before the row range
    def make(rng, d, dtype):
        *args, i0, i1 = case(rng, d, dtype)
        return (*args, np.empty(16, dtype), i0, i1)
    return make


def _ce_labels(rng, d, dtype):
    n = 6
    return (np.empty(n), np.empty((n, d), dtype), _rows(rng, n, d, dtype),
            rng.integers(0, d, n).astype(np.int64), 0, n)


def _ce_probs(rng, d, dtype):
    n = 6
    return (np.empty(n), np.empty((n, d), dtype), _rows(rng, n, d, dtype),
            rng.random((n, d)).astype(dtype), 0, n)


def _sdpa_fwd(rng, d, dtype):
    # T = d positions, 2 sequences x 2 heads of 20 features (not whole 16-lane tiles);
    # causal at even T, full at odd; a bias added to qkv where T is a multiple of 3
    b, h, dh, t = 2, 2, 20, d
    qkv = rng.standard_normal((b, t, 3 * h * dh)).astype(dtype)
    bias = rng.standard_normal(3 * h * dh).astype(dtype)
    return (np.empty((b, t, h * dh), dtype), np.zeros((b * h, t, t), dtype),
            np.zeros(sdpa.work_size(t, dh, False, h), dtype), qkv, bias, d % 3 == 0, h, 0.25,
            d % 2 == 0, 0, b * h)


def _sdpa_bwd(rng, d, dtype):
    out, p, _, qkv, bias, biased, h, scale, causal, i0, i1 = _sdpa_fwd(rng, d, dtype)
    sdpa.sdpa_forward(out, p, qkv, h, scale, causal, bias if biased else None)
    t, dh = qkv.shape[1], out.shape[2] // h
    return (np.empty_like(qkv), np.zeros(sdpa.work_size(t, dh, True, h), dtype),
            rng.standard_normal(out.shape).astype(dtype), p, qkv, bias, biased, h, scale,
            causal, i0, i1)


def _col_rows(rng, d, dtype):
    # dx[j, col:col + dh] = sum_i w[i, j] x[i, off:off + dh] for T = d positions, dh = 20 (x
    # padded to whole tiles past off), into columns 40.. of dx; causal at even T
    t, dh, off = d, 20, 3
    wp = -(-dh // 16) * 16
    return (np.zeros((t, 3 * 40), dtype), np.zeros((4, wp), dtype),
            rng.standard_normal((t, t + 5)).astype(dtype),
            rng.standard_normal((t, off + wp)).astype(dtype), off, 40, dh, t, d % 2 == 0)


def _dq_rows(rng, d, dtype):
    # dS from dP = dO v^T and P, then dq = dS k, for T = d positions and dh = 20, into
    # columns 20.. of dx; causal at even T
    t, dh = d, 20
    tp, wp = -(-t // 16) * 16, -(-dh // 16) * 16
    p = rng.random((t, t)).astype(dtype)
    p /= p.sum(axis=1, keepdims=True)
    vt = np.zeros((dh, tp), dtype)
    vt[:, :t] = rng.standard_normal((dh, t))
    return (np.zeros((t, 3 * 40), dtype), np.zeros((t, tp + 16), dtype),
            np.zeros((4, wp), dtype), rng.standard_normal((t, wp)).astype(dtype), 0,
            rng.standard_normal((t, wp)).astype(dtype), 0, p, vt, 20, dh, dtype(0.25), t,
            d % 2 == 0)


def _claimed(case):
    # the claim loop over all of the case's pairs, one pair per claim
    def make(rng, d, dtype):
        *args, i0, i1 = case(rng, d, dtype)
        return (*args, np.zeros(1, np.int64), 1, i1)
    return make


CASES = {
    layernorm._fwd_rows: _layernorm_fwd,
    layernorm._bwd_blocks: _layernorm_bwd,
    layernorm._fwd_rows_wide: _wide(_layernorm_fwd),
    layernorm._bwd_blocks_wide: _wide(_layernorm_bwd),
    softmax._softmax_fwd: _softmax_fwd,
    softmax._softmax_fwd_wide: _wide(_softmax_fwd),
    softmax._softmax_bwd: _softmax_bwd,
    softmax._log_softmax_fwd: _log_softmax_fwd,
    softmax._log_softmax_fwd_wide: _wide(_log_softmax_fwd),
    losses._mse_sums: _mse_sums,
    losses._ce_labels_fwd: _ce_labels,
    losses._ce_labels_fwd_wide: _wide(_ce_labels),
    losses._ce_probs_fwd: _ce_probs,
    losses._ce_probs_fwd_wide: _wide(_ce_probs),
    losses._mse_fwd_bwd: _mse_fwd_bwd,
    optim._sumsq_blocks: _sumsq_blocks,
    token_mix._bias_from_blocks: _bias_from_blocks,
    sdpa._sdpa_fwd: _sdpa_fwd,
    sdpa._sdpa_bwd: _sdpa_bwd,
    sdpa._col_rows: _col_rows,
    sdpa._dq_rows: _dq_rows,
    sdpa._sdpa_fwd_claims: _claimed(_sdpa_fwd),
    sdpa._sdpa_bwd_claims: _claimed(_sdpa_bwd),
}


def _name(kernel):
    return f"{kernel.py_func.__module__}.{kernel.py_func.__name__}"


def test_every_slp_kernel_has_a_bit_for_bit_case_here():
    # Check that a kernel given slp=True cannot escape the comparison below.
    assert sorted(map(_name, J.SLP_KERNELS)) == sorted(map(_name, CASES))


# Every kernel in float32 (the dtype the speed is for), and one in float64 too: without
# contraction no packing can change a bit in either dtype, and each case costs a compile.
PAIRS = [(k, np.float32) for k in CASES] + [(layernorm._bwd_blocks, np.float64)]


@pytest.mark.parametrize("kernel,dtype", PAIRS,
                         ids=[f"{_name(k)}-{np.dtype(d).name}" for k, d in PAIRS])
def test_slp_kernel_gives_the_bits_of_the_scalar_compile(kernel, dtype):
    # Check that packing the lanes into vectors changes no bit of any output, at widths
    # around the eight lanes, with NaN and inf in the rows.
    plain = _plain(kernel)
    for d in WIDTHS:
        args = CASES[kernel](np.random.default_rng(d), d, dtype)
        mine = [a.copy() if isinstance(a, np.ndarray) else a for a in args]
        ref = [a.copy() if isinstance(a, np.ndarray) else a for a in args]
        kernel(*mine)
        plain(*ref)
        for i, (a, b) in enumerate(zip(mine, ref)):
            if isinstance(a, np.ndarray):
                assert a.tobytes() == b.tobytes(), f"width {d}: argument {i} differs"


def _row_dots(out, x, y):
    for r in range(x.shape[0]):
        out[r] = lanes.row_dot(x[r], y[r])
    return 0


def _vector_fadds(dispatcher):
    ir = dispatcher.inspect_llvm(dispatcher.signatures[0])
    return len(re.findall(r"= fadd [^\n]*<\d+ x float>", ir))


def test_slp_switch_reaches_the_compile_and_is_put_back():
    # Check that jit(slp=True) vectorises the eight lane sums (the plain compile keeps them
    # scalar), and that numba's global setting is as it was afterwards.
    before = numba_config.SLP_VECTORIZE
    x = np.random.default_rng(0).standard_normal((4, 64)).astype(np.float32)
    out = np.empty(4, np.float32)
    with_slp = J.jit(_row_dots, slp=True, cache=False)
    try:
        without = _plain(with_slp)
        with_slp(out, x, x)
        expect = out.copy()
        without(out, x, x)
        assert out.tobytes() == expect.tobytes()
        assert _vector_fadds(with_slp) > 0 and _vector_fadds(without) == 0
        assert numba_config.SLP_VECTORIZE == before
    finally:
        J.SLP_KERNELS.remove(with_slp)


def test_slp_must_be_a_bool():
    # Check that a misspelt option is refused, not taken as true.
    with pytest.raises(TypeError, match="slp must be a bool, got str"):
        J.jit(slp="yes")

"""kernels.lanes' 16-lane stored reductions (sum16, dot16, sumsq16_centred, dot16_centred,
wsum16_centred) bit for bit against their documented order, emulated in NumPy:
element i in lane i % 16 (the tail of n % 16 elements in lanes 0..), each term rounded as
written, then lane l + lane l + 8 and halves again."""
import numba
import numpy as np
import pytest

from kernels import lanes

LENGTHS = [1, 7, 15, 16, 17, 33, 128, 130]


# Without contraction every term rounds as written (as in the slp kernels that use these;
# test_slp checks that packing changes no bit), and outside kernels.jit.SLP_KERNELS.
@numba.njit(fastmath=False, error_model="numpy")
def _all_five(out, acc, u, w, x, c):
    out[0] = lanes.sum16(x, acc)
    out[1] = lanes.dot16(x, w, acc)
    out[2] = lanes.sumsq16_centred(x, c, acc)
    out[3] = lanes.dot16_centred(u, w, x, c, acc)
    out[4] = lanes.wsum16_centred(w, x, c, acc)
    return 0


def _emulate(terms):
    """The documented order over per-element terms (already rounded in their dtype)."""
    n = terms.shape[0]
    acc = np.zeros(16, terms.dtype)
    m = n - n % 16
    for i in range(m):
        acc[i % 16] += terms[i]
    for i in range(m, n):
        acc[i - m] += terms[i]
    s = acc[:8] + acc[8:]
    return ((s[0] + s[4]) + (s[2] + s[6])) + ((s[1] + s[5]) + (s[3] + s[7]))


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("n", LENGTHS)
def test_stored_lanes_sum_in_their_documented_order(n, dtype):
    rng = np.random.default_rng(n)
    u, w, x = ((rng.standard_normal(n) * 10.0 ** rng.integers(-3, 4, n)).astype(dtype)
               for _ in range(3))
    c = dtype(0.3)
    out = np.empty(5, dtype)
    _all_five(out, np.full(16, np.nan, dtype), u, w, x, c)   # acc's contents are not read
    d = x - c
    want = [_emulate(x), _emulate(x * w), _emulate(d * d), _emulate(u * w * d),
            _emulate(w * d)]
    assert out.tobytes() == np.array(want, dtype).tobytes()


def test_nan_and_inf_reach_the_sums():
    x = np.ones(40)
    x[33] = np.nan   # in the tail
    out = np.empty(5)
    _all_five(out, np.zeros(16), x, x, x, 0.0)
    assert np.isnan(out).all()
    x[33] = np.inf
    _all_five(out, np.zeros(16), x, x, x, 0.0)
    assert np.isposinf(out).all()

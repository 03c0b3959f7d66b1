"""LayerNorm on rows of any finite scale: where the row sums, the centring or the sum of
squares overflow the dtype (|x| beyond ~1e19 in float32), the output, the input gradient and
dgamma are still LayerNorm's (Ba et al. 2016), for LayerNorm, AddNorm and FFNSublayer."""
import warnings

import numpy as np
import pytest

from engine import AddNorm, FFNSublayer, LayerNorm

EPS = 1e-5


def _rows(dtype, scales):
    """One row per scale: uniform in [-3, 3] times the scale; plus a row half +big, half
    -big (its centring is fine) and one of +big and a single -big (x - mean overflows)."""
    rng = np.random.default_rng(0)
    big = np.finfo(dtype).max / 1.25
    rows = [rng.uniform(-3.0, 3.0, 8) * s for s in scales]
    rows.append(np.array([big] * 4 + [-big] * 4))
    rows.append(np.array([big] * 7 + [-big]))
    return np.array(rows).astype(dtype)


def _reference(x, dy, gamma):
    """LayerNorm's output (gamma = 1, beta = 0), dx and dgamma in float64 on the rows divided
    by their largest |x| (the normalised row does not depend on that scale; eps is carried
    as eps / scale^2): no intermediate leaves float64's range."""
    x, dy, gamma = (a.astype(np.float64) for a in (x, dy, gamma))
    s = np.abs(x).max(axis=1, keepdims=True)
    t = x / s
    t -= t.mean(axis=1, keepdims=True)
    r = 1.0 / np.sqrt((t * t).mean(axis=1, keepdims=True) + EPS / s / s)
    xhat = t * r
    g = dy * gamma
    dx = (r / s) * (g - g.mean(axis=1, keepdims=True)
                    - xhat * (g * xhat).mean(axis=1, keepdims=True))
    return xhat, dx, (dy * xhat).sum(axis=0)


def _quiet(fn, *args):
    with warnings.catch_warnings():  # NumPy may warn of the overflow the kernel recovers from
        warnings.simplefilter("ignore", RuntimeWarning)
        return fn(*args)


SCALES = {np.float32: [1.0, 1e10, 1e19, 1e25, 1e30, 1e37],
          np.float64: [1.0, 1e100, 1e160, 1e200, 1e300]}


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_layernorm_forward_and_backward_at_every_scale(dtype):
    # Check that for rows from 1 to near the dtype's largest value the output is the
    # normalised row (not beta, as an overflowed variance gave: rstd = 0), and dx and
    # dgamma match the float64 reference (relative to the largest value of each).
    x = _rows(dtype, SCALES[dtype])
    rng = np.random.default_rng(1)
    dy = rng.standard_normal(x.shape).astype(dtype)
    ln = LayerNorm(8, dtype=dtype)
    y = _quiet(ln.forward, x).copy()
    dx = _quiet(ln.backward, dy).copy()
    want_y, want_dx, want_dg = _reference(x, dy, ln.gamma.data)
    tol = 2e-6 if dtype == np.float32 else 1e-12
    np.testing.assert_allclose(y, want_y, rtol=0, atol=tol * 4)
    for got, want in zip(dx, want_dx):  # each row's gradient relative to its own size
        np.testing.assert_allclose(got, want, rtol=0, atol=tol * 4 * np.abs(want).max())
    np.testing.assert_allclose(ln.gamma.grad, want_dg, rtol=0, atol=tol * 4 * np.abs(want_dg).max())
    np.testing.assert_array_equal(ln.beta.grad, dy.astype(np.float64).sum(axis=0).astype(dtype))


def test_addnorm_and_the_sublayer_normalise_huge_rows():
    # Check the blocks that run the same kernel: AddNorm(x, 0) on float32 rows up to 1e37,
    # and a post-norm FFNSublayer whose FFN outputs exactly 0 (zero output weights) on rows
    # up to 1e34 (its first GEMM must not overflow), both give LayerNorm(x).
    x = _rows(np.float32, [1e19, 1e30, 1e37])
    want, _, _ = _reference(x, np.zeros_like(x), np.ones(8, np.float32))
    an = AddNorm(8)
    np.testing.assert_allclose(_quiet(an.forward, x, np.zeros_like(x)), want, rtol=0, atol=1e-5)
    sub = FFNSublayer(8, 16, norm="post", rng=0)
    sub.ffn.W_out.data = np.zeros_like(sub.ffn.W_out.data)
    np.testing.assert_allclose(_quiet(sub.forward, x[:3] / 1e3), want[:3], rtol=0, atol=1e-5)

"""kernels.gating: the gMLP gating pair (Liu et al. 2021) against kernels.reference, in the
halved-input convention (inputs Zg/2 and P/2; outputs 2 dZg and 2 dP)."""
import numpy as np
import pytest

from kernels import gating, num_threads, parallel
from kernels import reference as R

DTYPES = [np.float32, np.float64]
TOL = {np.float32: dict(rtol=2e-5, atol=2e-6), np.float64: dict(rtol=1e-12, atol=1e-14)}
SMALL = 1001
LARGE = 2 * parallel.MIN_ELEMENTS_PER_THREAD + 4097  # split over 2 threads, odd tail


@pytest.fixture(autouse=True)
def _split_work_1mi(monkeypatch):
    # The split tests here run at a 1 Mi copy-element threshold, so that LARGE splits in both
    # directions (what they test is the split, not where the threshold lies;
    # tests/kernels/test_parallel.py checks that).
    monkeypatch.setattr(parallel, "SPLIT_WORK", 1024 * 1024)



def _inputs(n, dtype, seed=0):
    rng = np.random.default_rng(seed)
    g = (2.0 * rng.standard_normal(n)).astype(dtype)   # Zg/2
    p = rng.standard_normal(n).astype(dtype)           # P/2
    da = rng.standard_normal(n).astype(dtype)
    return g, p, da


def _forward(g, p):
    a, gg = np.empty_like(g), g.copy()
    res = gating.gate_forward(a, gg, p)
    return res, a, gg


def test_reference_backward_is_the_gradient_of_the_reference_forward():
    # Check the oracle's convention by float64 central differences: with L = sum(dA * A),
    # the outputs 2 dZg and 2 dP are dL/d(Zg/2) and dL/d(P/2).
    g, p, da = _inputs(7, np.float64, seed=1)

    def loss(g_, p_):
        a = np.empty(7)
        R.gate_forward(a, g_.copy(), p_.copy())
        return float(np.dot(da, a))

    dg, dp = g.copy(), p.copy()
    R.gate_forward(np.empty(7), dg, p.copy())  # dg = S
    R.gate_backward(dg, dp, da.copy())
    h = 1e-6
    for i in range(7):
        e = np.zeros(7)
        e[i] = h
        assert (loss(g + e, p) - loss(g - e, p)) / (2 * h) == pytest.approx(dg[i], rel=1e-7, abs=1e-9)
        assert (loss(g, p + e) - loss(g, p - e)) / (2 * h) == pytest.approx(dp[i], rel=1e-7, abs=1e-9)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("n,threads", [(SMALL, 1), (LARGE, 1), (LARGE, 2)])
def test_forward_matches_reference_in_place(dtype, n, threads):
    # Check that forward writes a = sigmoid(Zg) * P, overwrites g with S = 2 sigmoid(Zg),
    # leaves p unchanged and returns a itself.
    g, p, _ = _inputs(n, dtype)
    p0 = p.copy()
    with num_threads(threads):
        if n == LARGE:  # the split path when threads == 2
            assert parallel.threads_for(n, passes=gating.FWD_COST) == threads
        res, a, s = _forward(g, p)
    a_ref, s_ref = np.empty_like(g), g.copy()
    R.gate_forward(a_ref, s_ref, p.copy())
    assert res is a
    np.testing.assert_allclose(a, a_ref, **TOL[dtype])
    np.testing.assert_allclose(s, s_ref, **TOL[dtype])
    np.testing.assert_array_equal(p, p0)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("n,threads", [(SMALL, 1), (LARGE, 1), (LARGE, 2)])
def test_backward_matches_reference_in_place(dtype, n, threads):
    # Check that backward overwrites (g, p) = (S, P/2) with (2 dZg, 2 dP) and returns g.
    g, p, da = _inputs(n, dtype, seed=2)
    s = (1.0 + np.tanh(g.astype(np.float64))).astype(dtype)  # S as the forward leaves it
    g_ref, p_ref = s.copy(), p.copy()
    R.gate_backward(g_ref, p_ref, da.copy())
    gb, pb = s.copy(), p.copy()
    with num_threads(threads):
        if n == LARGE:  # the split path when threads == 2
            assert parallel.threads_for(n, passes=gating.BWD_COST) == threads
        res = gating.gate_backward(gb, pb, da.copy())
    assert res is gb
    np.testing.assert_allclose(gb, g_ref, **TOL[dtype])
    np.testing.assert_allclose(pb, p_ref, **TOL[dtype])


@pytest.mark.parametrize("dtype", DTYPES)
def test_results_do_not_depend_on_the_thread_count(dtype):
    # Check that forward and backward give the same bits inline and split over 2 threads.
    g, p, da = _inputs(LARGE, dtype, seed=3)
    out = []
    for threads in (1, 2):
        with num_threads(threads):
            _, a, s = _forward(g, p)
            gb, pb = s.copy(), p.copy()
            gating.gate_backward(gb, pb, da.copy())
        out.append((a, s, gb, pb))
    for x1, x2 in zip(*out):
        np.testing.assert_array_equal(x1, x2)


@pytest.mark.parametrize("dtype", DTYPES)
def test_extreme_gate_logits_stay_finite(dtype):
    # Check that |Zg| far beyond exp's range gives S in [0, 2] and finite outputs.
    g = np.array([-1e4, -50.0, 0.0, 50.0, 1e4], dtype)
    p = np.ones(5, dtype)
    _, a, s = _forward(g, p)
    assert np.isfinite(a).all() and ((s >= 0) & (s <= 2)).all()
    np.testing.assert_allclose(s, [0.0, 0.0, 1.0, 2.0, 2.0], atol=1e-6)

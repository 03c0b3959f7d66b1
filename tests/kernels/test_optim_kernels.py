"""kernels.optim: in-place AdamW and SGD against reference.py and a scalar transcription of
PyTorch's documented AdamW; C- and Fortran-contiguous parameters; no full-size temporaries;
adamw_update_many (one pass, one parallel region) gives the bits of per-parameter updates
whatever the thread count and block split."""
import math
import tracemalloc

import numpy as np
import pytest
from gradcheck import assert_close

from kernels import num_threads, optim, parallel, reference
from kernels.memory import ALIGN
from kernels.optim import adamw_update, adamw_update_many, flat_view, sgd_update

DTYPES = [np.float32, np.float64]
TOL = {np.float32: dict(rtol=1e-5, atol=1e-6), np.float64: dict(rtol=1e-12, atol=1e-14)}

@pytest.fixture(autouse=True)
def _split_work_3mi(monkeypatch):
    # The split tests here run at the sizes of a 3 Mi element-pass threshold (what they test
    # is the split, not where the threshold lies; tests/kernels/test_parallel.py checks that).
    monkeypatch.setattr(parallel, "SPLIT_WORK", 3 * 1024 * 1024)



def _shapes(dtype):
    # 0-d, 1-d, 2-d, 3-d, and a flat length spanning several blocks with a remainder.
    big = 2 * 65536 + 123  # a vector-width remainder
    return [(), (1,), (7,), (33, 17), (3, 4, 5), (big,)]


def _state(rng, shape, dtype, order="C"):
    p = np.asarray(rng.standard_normal(shape), dtype=dtype, order=order)
    return p, np.zeros_like(p), np.zeros_like(p)  # zeros_like keeps the memory order


# ----------------------------------------------------------------------------- AdamW
@pytest.mark.parametrize("dtype", DTYPES)
def test_adamw_ten_steps_match_reference(dtype):
    # Check 10 steps (fresh gradients each step, weight decay on) against the reference.
    rng = np.random.default_rng(30)
    for shape in _shapes(dtype):
        p, m, v = _state(rng, shape, dtype)
        p_r, m_r, v_r = p.copy(), m.copy(), v.copy()
        for step in range(1, 11):
            g = rng.standard_normal(shape).astype(dtype)
            g_copy = g.copy()
            res = adamw_update(p, g, m, v, step, 1e-2, 0.9, 0.999, 1e-8, 0.1)
            reference.adamw_update(p_r, g, m_r, v_r, step, 1e-2, 0.9, 0.999, 1e-8, 0.1)
            assert res is p
            np.testing.assert_array_equal(g, g_copy)  # grad is only read
        assert_close(p, p_r, f"param {shape}", **TOL[dtype])
        assert_close(m, m_r, f"exp_avg {shape}", **TOL[dtype])
        assert_close(v, v_r, f"exp_avg_sq {shape}", **TOL[dtype])


def _torch_adamw_scalar(theta, grads, lr, beta1, beta2, eps, wd):
    """PyTorch's documented AdamW algorithm, element by element in Python floats."""
    theta = list(theta)
    m = [0.0] * len(theta)
    v = [0.0] * len(theta)
    for t, g in enumerate(grads, start=1):
        for i in range(len(theta)):
            theta[i] = theta[i] - lr * wd * theta[i]
            m[i] = beta1 * m[i] + (1 - beta1) * g[i]
            v[i] = beta2 * v[i] + (1 - beta2) * g[i] ** 2
            m_hat = m[i] / (1 - beta1 ** t)
            v_hat = v[i] / (1 - beta2 ** t)
            theta[i] = theta[i] - lr * m_hat / (math.sqrt(v_hat) + eps)
    return theta


def test_adamw_matches_pytorch_algorithm_transcription():
    # Check 10 steps against a scalar loop over PyTorch's documented AdamW (float64), with
    # weight decay and non-default betas/eps so each hyper-parameter matters.
    rng = np.random.default_rng(31)
    shape = (4, 5)
    p, m, v = _state(rng, shape, np.float64)
    grads = [rng.standard_normal(shape) for _ in range(10)]
    expected = _torch_adamw_scalar(p.ravel(), [g.ravel() for g in grads],
                                   lr=3e-2, beta1=0.8, beta2=0.99, eps=1e-3, wd=0.05)
    for step, g in enumerate(grads, start=1):
        adamw_update(p, g, m, v, step, 3e-2, beta1=0.8, beta2=0.99, eps=1e-3, weight_decay=0.05)
    assert_close(p.ravel(), expected, "param", rtol=1e-12, atol=1e-14)


def test_adamw_first_step_size_is_lr():
    # Check the bias correction by hand: at step 1 with eps=0 and no decay every element
    # moves by exactly lr against the sign of its gradient.
    p = np.array([1.0, -2.0, 0.5])
    g = np.array([0.3, -4.0, 1e-3])
    adamw_update(p, g, np.zeros(3), np.zeros(3), 1, 0.1, eps=0.0, weight_decay=0.0)
    assert_close(p, [0.9, -1.9, 0.4], "param", rtol=1e-15, atol=1e-15)


@pytest.mark.parametrize("dtype", DTYPES)
def test_adamw_fortran_contiguous_views_updated_in_place(dtype):
    # Check that F-contiguous halves of one buffer (as the gMLP's W_gate / W_proj) are updated
    # in place, match the reference, and leave the other half untouched.
    rng = np.random.default_rng(32)
    d_in, d_ffn = 24, 40
    big = rng.standard_normal((2 * d_ffn, d_in)).astype(dtype)  # C-contiguous
    big_before = big.copy()
    W = big.T[:, :d_ffn]  # (d_in, d_ffn) Fortran-contiguous view
    assert W.flags.f_contiguous and not W.flags.c_contiguous
    g_big = rng.standard_normal((2 * d_ffn, d_in)).astype(dtype)
    g = g_big.T[:, :d_ffn]
    m = np.zeros((d_ffn, d_in), dtype).T
    v = np.zeros((d_ffn, d_in), dtype).T
    W_r, m_r, v_r = W.copy(order="F"), m.copy(order="F"), v.copy(order="F")
    for step in range(1, 4):
        res = adamw_update(W, g, m, v, step, 1e-2)
        reference.adamw_update(W_r, g, m_r, v_r, step, 1e-2)
    assert res is W and np.shares_memory(res, big)
    assert_close(W, W_r, "W", **TOL[dtype])
    assert_close(m, m_r, "exp_avg", **TOL[dtype])
    np.testing.assert_array_equal(big[d_ffn:], big_before[d_ffn:])
    assert not np.array_equal(big[:d_ffn], big_before[:d_ffn])


@pytest.mark.parametrize("make", [
    lambda: np.zeros(()), lambda: np.zeros(5), lambda: np.zeros((3, 4)),
    lambda: np.zeros((3, 4), order="F"), lambda: np.zeros((6, 4)).T[:, :3],
    lambda: np.zeros((1, 5)), lambda: np.zeros((2, 3, 4), order="F"),
])
def test_flat_view_never_copies(make):
    # Check that the flat view of a C- or F-contiguous array (any ndim) shares its memory
    # and walks it in memory order.
    a = make()
    f = flat_view(a)
    assert f.ndim == 1 and f.size == max(a.size, 1)
    assert np.shares_memory(f, a)
    f[...] = np.arange(f.size)
    order = "C" if a.flags.c_contiguous else "F"
    np.testing.assert_array_equal(a.ravel(order=order), np.arange(f.size))


@pytest.mark.parametrize("dtype", DTYPES)
def test_adamw_and_sgd_make_no_parameter_sized_temporaries(dtype):
    # Check that, after a warm-up call, an update allocates no parameter- or block-sized
    # temporary (numpy reports its buffers to tracemalloc; the reference makes full copies).
    rng = np.random.default_rng(33)
    p, m, v = _state(rng, (1 << 19,), dtype)
    g = rng.standard_normal(p.shape).astype(dtype)
    calls = [lambda s: adamw_update(p, g, m, v, s, 1e-3),
             lambda s: sgd_update(p, g, m, 0.1, 0.9, 1e-4, 0.1, False, s == 1),
             lambda s: sgd_update(p, g, m, 0.1, 0.9, 1e-4, 0.0, True, False),
             lambda s: sgd_update(p, g, None, 0.1, 0.0, 1e-4)]
    for call in calls:
        call(1)
        tracemalloc.start()
        try:
            base = tracemalloc.get_traced_memory()[0]
            call(2)
            peak = tracemalloc.get_traced_memory()[1] - base
        finally:
            tracemalloc.stop()
        # A block-sized temporary would be 256 KiB; what remains is view objects.
        assert peak < 12 * 1024, f"peak {peak} bytes for a {p.nbytes}-byte parameter"


@pytest.fixture
def split_on(monkeypatch):
    """List the thread count of each parallel region (kernels.parallel.split call over more
    than one thread) the updates make."""
    calls = []
    real = parallel.split

    def counting(fn, n, row_len=1, min_elements=parallel.SPLIT_MIN, k=None):
        got = real(fn, n, row_len, min_elements, k)
        if got > 1:
            calls.append(got)
        return got
    monkeypatch.setattr(parallel, "split", counting)
    return calls


def _split_size():
    """A length that kernels.parallel splits over two threads for AdamW and SGD (SGD is
    the cheaper per element), with a ragged tail."""
    n = parallel.SPLIT_WORK // optim.SGD_COST + 4099
    with num_threads(2):
        assert parallel.threads_for(n, passes=optim.SGD_COST) == 2
        assert parallel.threads_for(n, passes=optim.ADAMW_COST) == 2
    return n


def _run_threads(nthreads, update, arrays, steps):
    arrays = [a.copy(order="A") for a in arrays]
    with num_threads(nthreads):
        for step in range(1, steps + 1):
            update(step, *arrays)
    return arrays


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("order", ["C", "F"])
def test_adamw_split_over_threads_is_bit_identical(split_on, dtype, order):
    # Check that AdamW on a parameter split over two threads gives the same bits (param and
    # both moments) as on one thread, and matches the reference.
    rng = np.random.default_rng(34)
    shape = (_split_size() // 7, 7)
    p = np.asarray(rng.standard_normal(shape), dtype, order=order)
    g = np.asarray(rng.standard_normal(shape), dtype, order=order)
    m = np.asarray(0.1 * rng.standard_normal(shape), dtype, order=order)
    v = np.asarray(rng.random(shape), dtype, order=order)

    def update(step, p, m, v):
        adamw_update(p, g, m, v, step, 1e-2, 0.9, 0.999, 1e-8, 0.1)
    one = _run_threads(1, update, (p, m, v), 3)
    assert split_on == []
    two = _run_threads(2, update, (p, m, v), 3)
    assert split_on == [2] * 3  # the two-thread run did take the split
    for name, a, b in zip(("param", "exp_avg", "exp_avg_sq"), one, two):
        np.testing.assert_array_equal(b, a, err_msg=name)
    p_r, m_r, v_r = p.copy(order="A"), m.copy(order="A"), v.copy(order="A")
    for step in (1, 2, 3):
        reference.adamw_update(p_r, g, m_r, v_r, step, 1e-2, 0.9, 0.999, 1e-8, 0.1)
    for name, a, b in zip(("param", "exp_avg", "exp_avg_sq"), two, (p_r, m_r, v_r)):
        assert_close(a, b, name, **TOL[dtype])


@pytest.mark.parametrize("opts", [dict(momentum=0.0, weight_decay=0.01),
                                  dict(momentum=0.9, weight_decay=0.01, nesterov=True),
                                  dict(momentum=0.9, dampening=0.1)])
def test_sgd_split_over_threads_is_bit_identical(split_on, opts):
    # Check that SGD split over two threads gives the same bits as on one thread (param and
    # momentum buffer), and matches the reference.
    rng = np.random.default_rng(35)
    n = _split_size()
    p = rng.standard_normal(n).astype(np.float32)
    g = rng.standard_normal(n).astype(np.float32)
    buf = np.zeros(n, np.float32)

    def update(step, p, buf):
        sgd_update(p, g, buf if opts["momentum"] else None, 0.05, first_step=step == 1, **opts)
    one = _run_threads(1, update, (p, buf), 3)
    two = _run_threads(2, update, (p, buf), 3)
    assert len(split_on) == 3
    np.testing.assert_array_equal(two[0], one[0], err_msg="param")
    np.testing.assert_array_equal(two[1], one[1], err_msg="momentum_buf")
    p_r, buf_r = p.copy(), buf.copy()
    for step in (1, 2, 3):
        reference.sgd_update(p_r, g, buf_r if opts["momentum"] else None, 0.05,
                             first_step=step == 1, **opts)
    assert_close(two[0], p_r, "param", **TOL[np.float32])


def test_adamw_split_over_threads_allocates_nothing_after_warm_up(split_on):
    # Check that split updates (pool threads included: tracemalloc sees every thread) make
    # no block- or parameter-sized allocation after one warm-up call. The pool first gets
    # three workers, as after any 4-thread use, so a slice may run on a different pool
    # thread each call.
    rng = np.random.default_rng(36)
    n = _split_size()
    p, m, v = _state(rng, (n,), np.float32)
    g = rng.standard_normal(n).astype(np.float32)
    parallel.split(lambda i, j, slot: None, 4, k=4)  # a pool of 3 workers
    split_on.clear()
    with num_threads(2):
        adamw_update(p, g, m, v, 1, 1e-3)
        tracemalloc.start()
        try:
            base = tracemalloc.get_traced_memory()[0]
            for step in range(2, 6):
                adamw_update(p, g, m, v, step, 1e-3)
            peak = tracemalloc.get_traced_memory()[1] - base
        finally:
            tracemalloc.stop()
    assert split_on == [2] * 5
    assert peak < 16 * 1024, f"peak {peak} bytes for a {p.nbytes}-byte parameter"


# ----------------------------------------------------------------------------- many, blocks
def _many_state(rng, dtype, n_big):
    """Parameters and moments as an optimizer holds them: a big C-order one starting one
    element past NumPy's usual address (so its first block is a short head), a big
    F-order view (as gMLP's W_gate), a small one and a 0-d one; random moments."""
    raw = rng.standard_normal(n_big + 1).astype(dtype)
    shapes = [None, (64, n_big // 64 + 5), (3,), ()]
    out = []
    for k, shape in enumerate(shapes):
        if k == 0:
            p = raw[1:]
            arrs = [p] + [np.asarray(x, dtype)[1:] for x in (
                rng.standard_normal(n_big + 1), 0.1 * rng.standard_normal(n_big + 1),
                rng.random(n_big + 1))]
        else:
            order = "F" if k == 1 else "C"
            arrs = [np.asarray(x, dtype, order=order) for x in (
                rng.standard_normal(shape), rng.standard_normal(shape),
                0.1 * rng.standard_normal(shape), rng.random(shape))]
        out.append(arrs)  # param, grad, exp_avg, exp_avg_sq
    assert out[1][0].flags.f_contiguous and not out[1][0].flags.c_contiguous
    return out


def _copy_state(state):
    return [[a.copy(order="K") for a in arrs] for arrs in state]


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("nthreads", [1, 2])
def test_adamw_update_many_matches_per_parameter_updates_bit_for_bit(split_on, dtype, nthreads):
    # Check that adamw_update_many over four parameters (big C- and F-order, small, 0-d) gives
    # the same bits as adamw_update on each in turn on one thread, at one thread (inline) and
    # at two (one parallel region per step, small parameters riding along), and matches the
    # reference.
    rng = np.random.default_rng(37)
    state = _many_state(rng, dtype, _split_size())
    many, single, ref = _copy_state(state), _copy_state(state), _copy_state(state)
    with num_threads(nthreads):
        for step in (1, 2, 3):
            adamw_update_many(*[[arrs[i] for arrs in many] for i in range(4)], step, 1e-2,
                              0.8, 0.99, 1e-6, 0.1)
    assert split_on == ([2] * 3 if nthreads == 2 else [])
    with num_threads(1):
        for step in (1, 2, 3):
            for arrs in single:
                adamw_update(*arrs, step, 1e-2, 0.8, 0.99, 1e-6, 0.1)
            for arrs in ref:
                reference.adamw_update(*arrs, step, 1e-2, 0.8, 0.99, 1e-6, 0.1)
    for k, (a, b, r) in enumerate(zip(many, single, ref)):
        for name, x, y, z in zip(("param", "grad", "exp_avg", "exp_avg_sq"), a, b, r):
            np.testing.assert_array_equal(x, y, err_msg=f"{name} of parameter {k}")
            assert_close(x, z, f"{name} of parameter {k}", **TOL[dtype])


def test_adamw_update_many_split_allocates_nothing_after_warm_up(split_on):
    # Check that a split adamw_update_many (pool threads included) makes no block- or
    # parameter-sized allocation after one warm-up call, and takes one region per call.
    rng = np.random.default_rng(39)
    state = _many_state(rng, np.float32, _split_size())
    seqs = [[arrs[i] for arrs in state] for i in range(4)]
    parallel.split(lambda i, j, slot: None, 4, k=4)  # a pool of 3 workers
    split_on.clear()
    with num_threads(2):
        adamw_update_many(*seqs, 1, 1e-3)
        tracemalloc.start()
        try:
            base = tracemalloc.get_traced_memory()[0]
            for step in range(2, 6):
                adamw_update_many(*seqs, step, 1e-3)
            peak = tracemalloc.get_traced_memory()[1] - base
        finally:
            tracemalloc.stop()
    assert split_on == [2] * 5
    assert peak < 16 * 1024, f"peak {peak} bytes"


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("beta1", [0.0, 0.5, 0.999, 0.99999])
@pytest.mark.parametrize("scale", [1e-6, 1.0, 1e4])
def test_adamw_extreme_beta1_and_gradient_scales_match_reference(dtype, beta1, scale):
    # Check the in-place first-moment update ((m b1/(1-b1) + g)(1-b1)) against the
    # reference's b1 m + (1-b1) g for beta1 from 0 to 1 - 1e-5 and gradients from 1e-6 to
    # 1e4, over 20 steps (the moments build up).
    rng = np.random.default_rng(42)
    p, m, v = _state(rng, (257,), dtype)
    p_r, m_r, v_r = p.copy(), m.copy(), v.copy()
    for step in range(1, 21):
        g = (scale * rng.standard_normal(257)).astype(dtype)
        adamw_update(p, g, m, v, step, 1e-2, beta1, 0.999, 1e-8, 0.01)
        reference.adamw_update(p_r, g, m_r, v_r, step, 1e-2, beta1, 0.999, 1e-8, 0.01)
    tol = dict(rtol=2e-5, atol=1e-6 * scale) if dtype == np.float32 else dict(
        rtol=1e-11, atol=1e-14 * scale)
    assert_close(m, m_r, "exp_avg", **tol)
    assert_close(p, p_r, "param", **TOL[dtype])


@pytest.mark.parametrize("name,mutate,exc", [
    ("params", lambda a: np.zeros(3), TypeError),
    ("grads", lambda a: a[:1], ValueError),
    ("grads[1]", lambda a: [a[0], a[1].astype(np.float32)], TypeError),
    ("exp_avgs[0]", lambda a: [np.zeros(4), a[1]], ValueError),
    ("exp_avg_sqs[1]", lambda a: [a[0], np.asfortranarray(np.zeros((2, 3)))], ValueError),
    ("params[1]", lambda a: [a[0], np.zeros((2, 6))[:, ::2]], ValueError),
])
def test_adamw_update_many_rejects_bad_input_naming_it(name, mutate, exc):
    # Check that a bad sequence or element raises TypeError/ValueError naming it (with its
    # index), and that nothing is updated when it does.
    seqs = {k: [np.ones(3), np.ones((2, 3))] for k in ("params", "grads", "exp_avgs",
                                                        "exp_avg_sqs")}
    key = name.split("[")[0]
    seqs[key] = mutate(seqs[key])
    before = [p.copy() for p in seqs["params"]] if key != "params" else None
    with pytest.raises(exc, match=name.replace("[", r"\[").replace("]", r"\]")):
        adamw_update_many(*seqs.values(), 1, 0.1)
    if before is not None:
        for p, b in zip(seqs["params"], before):
            np.testing.assert_array_equal(p, b)


def test_adamw_update_many_rejects_bad_options_naming_them():
    # Check that step and hyper-parameters are checked as in adamw_update.
    seqs = [[np.ones(3)] for _ in range(4)]
    with pytest.raises(ValueError, match="step"):
        adamw_update_many(*seqs, 0, 0.1)
    with pytest.raises(ValueError, match="beta2"):
        adamw_update_many(*seqs, 1, 0.1, beta2=1.0)


# ----------------------------------------------------------------------------- SGD
SGD_CASES = [
    dict(momentum=0.0, weight_decay=0.0),
    dict(momentum=0.0, weight_decay=0.01),
    dict(momentum=0.9, weight_decay=0.0),
    dict(momentum=0.9, weight_decay=0.01, dampening=0.1),
    dict(momentum=0.9, weight_decay=0.01, nesterov=True),
    dict(momentum=0.5, weight_decay=0.0, nesterov=True),
]


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("opts", SGD_CASES, ids=lambda o: "-".join(f"{k}={v}" for k, v in o.items()))
def test_sgd_five_steps_match_reference(dtype, opts):
    # Check 5 steps (first_step on the first) against the reference, for every option mix,
    # and that grad is never modified.
    rng = np.random.default_rng(40)
    for shape in _shapes(dtype):
        p, buf, _ = _state(rng, shape, dtype)
        buf_arg = buf if opts["momentum"] else None
        p_r, buf_r = p.copy(), buf.copy()
        for step in range(1, 6):
            g = rng.standard_normal(shape).astype(dtype)
            g_copy = g.copy()
            res = sgd_update(p, g, buf_arg, 0.05, first_step=step == 1, **opts)
            reference.sgd_update(p_r, g, buf_r if opts["momentum"] else None, 0.05,
                                 first_step=step == 1, **opts)
            assert res is p
            np.testing.assert_array_equal(g, g_copy)
        assert_close(p, p_r, f"param {shape}", **TOL[dtype])
        if opts["momentum"]:
            assert_close(buf, buf_r, f"momentum_buf {shape}", **TOL[dtype])


def test_sgd_first_step_copies_gradient_into_buffer():
    # Check PyTorch's first momentum step by hand: buf = grad + wd * param (no dampening),
    # param -= lr * buf.
    p = np.array([1.0, 2.0])
    g = np.array([0.5, -1.0])
    buf = np.full(2, 123.0)
    sgd_update(p, g, buf, 0.1, momentum=0.9, weight_decay=0.5, dampening=0.3, first_step=True)
    assert_close(buf, [1.0, 0.0], "momentum_buf", rtol=1e-15, atol=1e-15)
    assert_close(p, [0.9, 2.0], "param", rtol=1e-15, atol=1e-15)


def test_sgd_fortran_contiguous_in_place():
    # Check that an F-contiguous parameter with momentum is updated in place like the reference.
    rng = np.random.default_rng(41)
    p = np.asfortranarray(rng.standard_normal((9, 13)))
    g = np.asfortranarray(rng.standard_normal((9, 13)))
    buf = np.zeros_like(p)
    p_r, buf_r = p.copy(order="F"), buf.copy(order="F")
    for step in (1, 2, 3):
        res = sgd_update(p, g, buf, 0.1, 0.9, 0.01, 0.0, True, step == 1)
        reference.sgd_update(p_r, g, buf_r, 0.1, 0.9, 0.01, 0.0, True, step == 1)
    assert res is p and np.shares_memory(res, p)
    assert_close(p, p_r, "param", **TOL[np.float64])


# ----------------------------------------------------------------------------- bad input
def _adamw_args():
    return dict(param=np.zeros((3, 4)), grad=np.zeros((3, 4)), exp_avg=np.zeros((3, 4)),
                exp_avg_sq=np.zeros((3, 4)), step=1, lr=1e-3)


@pytest.mark.parametrize("name,bad,exc", [
    ("param", np.zeros((3, 4), np.float16), TypeError),
    ("param", np.zeros((3, 8))[:, ::2], ValueError),
    ("param", [[0.0] * 4] * 3, TypeError),
    ("grad", np.zeros((3, 4), np.float32), TypeError),
    ("grad", np.zeros((4, 3)), ValueError),
    ("grad", np.zeros((3, 4), order="F"), ValueError),
    ("exp_avg", np.zeros(12), ValueError),
    ("exp_avg_sq", None, TypeError),
    ("step", 0, ValueError),
    ("step", 1.0, TypeError),
    ("lr", -1e-3, ValueError),
    ("lr", "0.1", TypeError),
    ("beta1", 1.0, ValueError),
    ("beta2", -0.1, ValueError),
    ("eps", -1e-8, ValueError),
    ("weight_decay", -0.1, ValueError),
])
def test_adamw_rejects_bad_input_naming_it(name, bad, exc):
    # Check that each bad argument raises TypeError/ValueError whose message names it.
    args = _adamw_args()
    args[name] = bad
    with pytest.raises(exc, match=name):
        adamw_update(**args)


def test_adamw_rejects_read_only_param():
    # Check that a read-only parameter is rejected before anything is written.
    args = _adamw_args()
    args["param"].flags.writeable = False
    with pytest.raises(ValueError, match="param"):
        adamw_update(**args)


@pytest.mark.parametrize("name,bad,exc,extra", [
    ("grad", np.zeros(5, np.float32), TypeError, {}),
    ("grad", np.zeros(4), ValueError, {}),
    ("momentum_buf", None, ValueError, dict(momentum=0.9)),
    ("momentum_buf", np.zeros(4), ValueError, dict(momentum=0.9)),
    ("momentum", -0.5, ValueError, {}),
    ("dampening", 1.5, ValueError, {}),
    ("nesterov", True, ValueError, dict(momentum=0.0)),
    ("nesterov", True, ValueError, dict(momentum=0.9, dampening=0.1)),
    ("lr", None, TypeError, {}),
])
def test_sgd_rejects_bad_input_naming_it(name, bad, exc, extra):
    # Check that each bad argument raises TypeError/ValueError whose message names it.
    args = dict(param=np.zeros(5), grad=np.zeros(5), momentum_buf=np.zeros(5), lr=0.1)
    args.update(extra)
    args[name] = bad
    with pytest.raises(exc, match=name):
        sgd_update(**args)


# ----------------------------------------------------------------------------- zero_grad
def _arena(rng, dtype, n):
    """Flat parameter, gradient and moment segments as the engine's arena passes them: one
    aligned run of n elements each (kernels.memory), random values, v >= 0."""
    from kernels.memory import aligned_empty
    arrs = [aligned_empty(n, dtype) for _ in range(4)]
    arrs[0][...] = rng.standard_normal(n)
    arrs[1][...] = rng.standard_normal(n)
    arrs[2][...] = 0.1 * rng.standard_normal(n)
    arrs[3][...] = rng.random(n)
    return arrs


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("nthreads", [1, 2])
def test_adamw_zero_grad_is_the_update_then_a_fill(dtype, nthreads):
    # Check that adamw_update_many_unchecked(..., zero_grad=True) over arena segments (a large
    # one, split at 2 threads, and a small one) leaves param and moments bit-identical to the
    # update without the option followed by grad.fill(0), and every gradient exactly 0.
    rng = np.random.default_rng(50)
    segs = [_arena(rng, dtype, _split_size()), _arena(rng, dtype, 37)]
    plain = [[a.copy() for a in s] for s in segs]
    consts = optim.adamw_consts(np.dtype(dtype), 3, 1e-2, 0.9, 0.999, 1e-8, 0.1)
    with num_threads(nthreads):
        optim.adamw_update_many_unchecked([(tuple(s), consts) for s in segs], zero_grad=True)
        optim.adamw_update_many_unchecked([(tuple(s), consts) for s in plain])
    for k, (s, q) in enumerate(zip(segs, plain)):
        q[1].fill(0)
        for name, a, b in zip(("param", "grad", "exp_avg", "exp_avg_sq"), s, q):
            np.testing.assert_array_equal(a, b, err_msg=f"{name} of segment {k}")
        assert not s[1].any()


@pytest.mark.parametrize("dtype", DTYPES)
def test_adamw_zero_grad_matches_reference(dtype):
    # Check the checked functions with zero_grad (C order, F order, 0-d; single and many)
    # against the reference doing the same, over 3 steps with fresh gradients.
    rng = np.random.default_rng(51)
    for shape, order in (((33, 17), "C"), ((33, 17), "F"), ((), "C")):
        p, m, v = _state(rng, shape, dtype, order)
        p2, m2, v2 = p.copy(order="A"), m.copy(order="A"), v.copy(order="A")
        p_r, m_r, v_r = p.copy(order="A"), m.copy(order="A"), v.copy(order="A")
        for step in (1, 2, 3):
            g = np.asarray(rng.standard_normal(shape), dtype, order=order)
            g2, g_r = g.copy(order="A"), g.copy(order="A")
            assert adamw_update(p, g, m, v, step, 1e-2, zero_grad=True) is p
            adamw_update_many([p2], [g2], [m2], [v2], step, 1e-2, zero_grad=True)
            reference.adamw_update(p_r, g_r, m_r, v_r, step, 1e-2, zero_grad=True)
            for gg in (g, g2, g_r):
                np.testing.assert_array_equal(gg, np.zeros_like(gg))
        for x, y in ((p, p2), (m, m2), (v, v2)):
            np.testing.assert_array_equal(x, y)
        assert_close(p, p_r, f"param {shape} {order}", **TOL[dtype])
        assert_close(m, m_r, f"exp_avg {shape} {order}", **TOL[dtype])


@pytest.mark.parametrize("nthreads", [1, 2])
@pytest.mark.parametrize("opts", SGD_CASES, ids=lambda o: "-".join(f"{k}={v}" for k, v in o.items()))
def test_sgd_zero_grad_is_the_update_then_a_fill(nthreads, opts):
    # Check that sgd_update(..., zero_grad=True) gives the bits of the update without it
    # followed by grad.fill(0), leaves grad exactly 0, and matches the reference.
    rng = np.random.default_rng(52)
    p, g, buf, _ = _arena(rng, np.float32, _split_size())
    p2, g2, buf2 = p.copy(), g.copy(), buf.copy()
    p_r, g_r, buf_r = p.copy(), g.copy(), buf.copy()
    mom = opts["momentum"] != 0.0
    with num_threads(nthreads):
        sgd_update(p, g, buf if mom else None, 0.05, zero_grad=True, **opts)
        sgd_update(p2, g2, buf2 if mom else None, 0.05, **opts)
    reference.sgd_update(p_r, g_r, buf_r if mom else None, 0.05, zero_grad=True, **opts)
    g2.fill(0)
    np.testing.assert_array_equal(p, p2)
    np.testing.assert_array_equal(g, g2)
    np.testing.assert_array_equal(buf, buf2)
    assert not g.any() and not g_r.any()
    assert_close(p, p_r, "param", **TOL[np.float32])


@pytest.mark.parametrize("call", ["adamw", "many", "sgd"])
def test_zero_grad_must_be_a_bool(call):
    # Check that zero_grad=1 (or any non-bool) raises TypeError naming it and writes nothing.
    p, g, m, v = np.ones(4), np.ones(4), np.zeros(4), np.zeros(4)
    with pytest.raises(TypeError, match="zero_grad"):
        if call == "adamw":
            adamw_update(p, g, m, v, 1, 0.1, zero_grad=1)
        elif call == "many":
            adamw_update_many([p], [g], [m], [v], 1, 0.1, zero_grad="yes")
        else:
            sgd_update(p, g, None, 0.1, zero_grad=None)
    for a, val in ((p, 1.0), (g, 1.0), (m, 0.0), (v, 0.0)):
        np.testing.assert_array_equal(a, val)


@pytest.mark.parametrize("call", ["adamw", "many", "sgd"])
def test_zero_grad_needs_a_writeable_grad(call):
    # Check that a read-only grad is fine without zero_grad (only read) and rejected with it,
    # naming grad, before anything is written.
    p, g, m, v = np.ones(4), np.ones(4), np.zeros(4), np.zeros(4)
    g.flags.writeable = False
    run = {"adamw": lambda z: adamw_update(p, g, m, v, 1, 0.1, zero_grad=z),
           "many": lambda z: adamw_update_many([p], [g], [m], [v], 1, 0.1, zero_grad=z),
           "sgd": lambda z: sgd_update(p, g, None, 0.1, zero_grad=z)}[call]
    with pytest.raises(ValueError, match="grad"):
        run(True)
    np.testing.assert_array_equal(p, 1.0)
    run(False)
    assert (p != 1.0).all()


@pytest.mark.parametrize("name", ["exp_avg", "exp_avg_sq"])
def test_adamw_rejects_read_only_moments_before_writing(name):
    # Check that a read-only moment is rejected naming it, with the parameter unchanged
    # (the update writes the moments, so it would otherwise fail half-way).
    args = _adamw_args()
    args["param"][...] = 1.0
    args[name].flags.writeable = False
    with pytest.raises(ValueError, match=name):
        adamw_update(**args)
    np.testing.assert_array_equal(args["param"], 1.0)

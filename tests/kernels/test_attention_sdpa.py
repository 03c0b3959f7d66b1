"""kernels.sdpa, the compiled multi-head attention over all (batch, head) pairs: forward and
backward against the NumPy reference (kernels.reference) in float64 and float32, the shapes
where row blocks and vector widths have tails, causal skipping, thread-count independence,
NaN propagation and argument errors."""
import threading

import numpy as np
import pytest

from kernels import num_threads, parallel
from kernels import reference as R
from kernels import sdpa

F64 = np.float64
NOBIAS = np.zeros(1)  # the kernels' stand-in bias argument when there is none
# float32 against the float64 reference, for unit-scale inputs: the exp approximation
# (kernels.fmath, ~1e-7 relative) and float32 sums over at most T * d_head terms.
F32_ATOL = 2e-5

# (B, T, d_model, n_heads): T = 1, T not a multiple of the 4-row blocks (one, two and three
# rows over) or the 16-lane score columns, B * h = 1, d_head = 1, GPT-sized heads, and T
# past sdpa.COPY_P_FROM with whole-tile heads (the heads' rows and P read from copies).
SHAPES = [(1, 1, 4, 2), (2, 7, 12, 3), (1, 37, 8, 1), (3, 5, 3, 3), (2, 64, 64, 2),
          (1, 19, 16, 1), (2, 6, 8, 2), (1, 130, 64, 2)]


def _inputs(shape, dtype, seed=0):
    b, t, d, h = shape
    rng = np.random.default_rng(seed)
    qkv = rng.standard_normal((b, t, 3 * d)).astype(dtype)
    do = rng.standard_normal((b, t, d)).astype(dtype)
    return qkv, do


def _run(shape, dtype, causal, qkv, do):
    """(out, p, dqkv) from the kernels, with scale 1/sqrt(d_head)."""
    b, t, d, h = shape
    scale = 1.0 / np.sqrt(d // h)
    out = np.empty((b, t, d), dtype)
    p = np.zeros((b * h, t, t), dtype)
    dqkv = np.empty_like(qkv)
    sdpa.sdpa_forward(out, p, qkv, h, scale, causal)
    sdpa.sdpa_backward(dqkv, do, p, qkv, h, scale, causal)
    return out, p, dqkv


def _reference(shape, causal, qkv, do):
    b, t, d, h = shape
    scale = 1.0 / np.sqrt(d // h)
    qkv, do = qkv.astype(F64), do.astype(F64)
    out, p = np.empty((b, t, d)), np.empty((b * h, t, t))
    R.sdpa_forward(out, p, qkv, h, scale, causal)
    dqkv = R.sdpa_backward(np.empty_like(qkv), do, p, qkv, h, scale, causal)
    return out, p, dqkv


def _lower(p, causal):
    """p with its causal upper half (undefined after the kernel) set to 0."""
    t = p.shape[-1]
    return np.where(np.tril(np.ones((t, t), bool)), p, 0.0) if causal else p


@pytest.mark.parametrize("causal", [True, False])
@pytest.mark.parametrize("shape", SHAPES)
def test_float64_matches_the_reference(shape, causal):
    # Check O, P and d[q | k | v] against the NumPy reference to float64 rounding.
    qkv, do = _inputs(shape, F64)
    out, p, dqkv = _run(shape, F64, causal, qkv, do)
    ro, rp, rd = _reference(shape, causal, qkv, do)
    np.testing.assert_allclose(out, ro, rtol=1e-12, atol=1e-12)
    np.testing.assert_allclose(_lower(p, causal), rp, rtol=1e-12, atol=1e-13)
    np.testing.assert_allclose(dqkv, rd, rtol=1e-11, atol=1e-12)


@pytest.mark.parametrize("causal", [True, False])
@pytest.mark.parametrize("shape", SHAPES)
def test_float32_is_within_its_bound_of_float64(shape, causal):
    # Check the float32 kernels (vectorised exp) against the float64 reference on the same
    # (float32) inputs, within F32_ATOL.
    qkv, do = _inputs(shape, np.float32)
    out, p, dqkv = _run(shape, np.float32, causal, qkv, do)
    ro, rp, rd = _reference(shape, causal, qkv, do)
    for got, want in ((out, ro), (_lower(p, causal), rp), (dqkv, rd)):
        np.testing.assert_allclose(got, want, rtol=0, atol=F32_ATOL)


def test_causal_backward_reads_no_probability_above_the_diagonal():
    # Check that the causal backward skips the masked half of p: NaN written there after the
    # forward changes no bit of the gradient.
    shape = (2, 9, 12, 3)
    qkv, do = _inputs(shape, F64)
    _, p, dqkv = _run(shape, F64, True, qkv, do)
    p[:, np.triu(np.ones((9, 9), bool), 1)] = np.nan
    again = np.empty_like(dqkv)
    sdpa.sdpa_backward(again, do, p, qkv, 3, 1.0 / np.sqrt(4), True)
    np.testing.assert_array_equal(again, dqkv)


def test_backward_overwrites_dqkv():
    # Check that dqkv's previous contents do not leak into the gradient (it is not added to).
    shape = (2, 6, 8, 2)
    qkv, do = _inputs(shape, F64)
    _, p, dqkv = _run(shape, F64, True, qkv, do)
    again = np.full_like(qkv, 3.0)
    sdpa.sdpa_backward(again, do, p, qkv, 2, 0.5, True)
    np.testing.assert_array_equal(again, dqkv)


@pytest.mark.parametrize("dtype", [np.float32, F64])
def test_results_do_not_depend_on_the_thread_count(dtype):
    # Check bit-identical outputs and gradients at 1 and 2 threads, with the pairs really
    # split at 2 (the pool was handed work), since each pair runs on one thread in one order.
    shape = (8, 64, 128, 4)
    qkv, do = _inputs(shape, dtype, seed=5)
    with num_threads(1):
        one = _run(shape, dtype, True, qkv, do)
    before = parallel.handoffs()
    with num_threads(2):
        two = _run(shape, dtype, True, qkv, do)
        split = parallel.threads_for(8 * 4, 64 * 64 * 32, passes=sdpa.FWD_COST) == 2
    assert split and parallel.handoffs() > before
    np.testing.assert_array_equal(one[0], two[0])
    np.testing.assert_array_equal(_lower(one[1], True), _lower(two[1], True))
    np.testing.assert_array_equal(one[2], two[2])


@pytest.mark.parametrize("cut", [1, 4, 5, 7, 8])
def test_pairs_cut_inside_a_sequence_come_out_as_in_one_slot(cut):
    # Check that two slots whose pair ranges split a sequence's heads (3 heads: cuts inside
    # sequence 0, 1 and 2) write exactly their own heads' columns, back and forth: each slot
    # stages whole sequences but must write back only the heads it computed.
    b, t, d, h = shape = (3, 9, 12, 3)
    qkv, do = _inputs(shape, F64, seed=3)
    one_out, one_p, one_dqkv = _run(shape, F64, True, qkv, do)
    out, p = np.full((b, t, d), np.nan), np.zeros((b * h, t, t))
    dqkv = np.full_like(qkv, np.nan)
    fwd, bwd = sdpa.work_size(t, d // h, False, h), sdpa.work_size(t, d // h, True, h)
    scale = 1.0 / np.sqrt(d // h)
    for i0, i1 in ((0, cut), (cut, b * h)):
        sdpa._sdpa_fwd(out, p, np.zeros(fwd), qkv, NOBIAS, False, h, scale, True, i0, i1)
    for i0, i1 in ((cut, b * h), (0, cut)):
        sdpa._sdpa_bwd(dqkv, np.zeros(bwd), do, p, qkv, NOBIAS, False, h, scale, True, i0,
                       i1)
    np.testing.assert_array_equal(out, one_out)
    np.testing.assert_array_equal(dqkv, one_dqkv)


def test_few_pairs_split_inside_sequences_match_one_thread():
    # Check 1 against 2 threads where there are too few sequences to claim whole ones (2
    # sequences of 4 heads: one pair per claim), so the slots stage and write back parts of
    # sequences; T 256 makes the 8 pairs worth a second thread.
    shape = (2, 256, 64, 4)
    qkv, do = _inputs(shape, np.float32, seed=9)
    with num_threads(1):
        one = _run(shape, np.float32, True, qkv, do)
    before = parallel.handoffs()
    with num_threads(2):
        two = _run(shape, np.float32, True, qkv, do)
    assert parallel.handoffs() > before and sdpa._chunk(8, 4, 2) == 1
    np.testing.assert_array_equal(one[0], two[0])
    np.testing.assert_array_equal(one[2], two[2])


@pytest.mark.parametrize("chunk", [1, 2, 3, 7])
def test_claiming_slots_compute_every_pair_once(chunk):
    # Check the claim loops of both passes driven by two threads that share one counter,
    # the second started only after the first is well under way (a pool thread that wakes
    # late): together they give exactly the one-slot results, whatever the chunk (3 heads:
    # chunks 2 and 7 cut sequences).
    b, t, d, h = shape = (4, 9, 12, 3)
    qkv, do = _inputs(shape, F64, seed=4)
    one_out, _, one_dqkv = _run(shape, F64, True, qkv, do)
    out, p, dqkv = np.full((b, t, d), np.nan), np.zeros((b * h, t, t)), np.full_like(qkv, np.nan)
    scale, n = 1.0 / np.sqrt(d // h), b * h
    for backward in (False, True):
        counter = np.zeros(1, np.int64)
        size = sdpa.work_size(t, d // h, backward, h)
        if backward:
            fn = lambda: sdpa._sdpa_bwd_claims(dqkv, np.zeros(size), do, p, qkv, NOBIAS,
                                               False, h, scale, True, counter, chunk, n)
        else:
            fn = lambda: sdpa._sdpa_fwd_claims(out, p, np.zeros(size), qkv, NOBIAS, False,
                                               h, scale, True, counter, chunk, n)
        late = threading.Thread(target=fn)
        fn()
        late.start()
        late.join()
        assert counter[0] == -(-n // chunk) + 2  # every chunk once, then one miss per slot
    np.testing.assert_array_equal(out, one_out)
    np.testing.assert_array_equal(dqkv, one_dqkv)


def test_nan_reaches_only_the_positions_that_attend_to_it():
    # Check NaN propagation under the causal mask: a NaN value at position 4 makes the
    # outputs at positions >= 4 NaN (for its head only), while earlier positions, which
    # never read it, stay finite.
    shape = (1, 8, 8, 2)
    qkv, do = _inputs(shape, F64)
    qkv[0, 4, 2 * 8 + 1] = np.nan  # v of head 0, position 4
    out = np.empty((1, 8, 8))
    sdpa.sdpa_forward(out, np.zeros((2, 8, 8)), qkv, 2, 0.5, True)
    assert np.all(np.isfinite(out[0, :4]))
    assert np.all(np.isnan(out[0, 4:, 1]))
    assert np.all(np.isfinite(out[0, :, 4:]))  # head 1 never reads head 0's columns


def test_nan_score_gives_a_nan_row():
    # Check that a NaN query makes its whole probability row NaN (not skipped by the max).
    shape = (1, 5, 4, 1)
    qkv, _ = _inputs(shape, F64)
    qkv[0, 3, 0] = np.nan
    p = np.zeros((1, 5, 5))
    sdpa.sdpa_forward(np.empty((1, 5, 4)), p, qkv, 1, 0.5, False)
    assert np.all(np.isnan(p[0, 3]))
    assert np.all(np.isfinite(p[0, [0, 1, 2, 4]]))


def test_empty_batch_or_sequence_writes_nothing():
    # Check that B = 0 or T = 0 returns at once.
    for b, t in ((0, 4), (2, 0)):
        out = np.empty((b, t, 4))
        assert sdpa.sdpa_forward(out, np.empty((2 * b, t, t)), np.empty((b, t, 12)), 2,
                                 0.5) is out


@pytest.mark.parametrize("call, match", [
    (lambda: sdpa.sdpa_forward(np.empty((2, 5, 8)), np.empty((4, 5, 5)), np.empty((2, 5, 23)),
                               2, 0.5), "qkv"),
    (lambda: sdpa.sdpa_forward(np.empty((2, 5, 6)), np.empty((4, 5, 5)), np.empty((2, 5, 24)),
                               2, 0.5), "out"),
    (lambda: sdpa.sdpa_forward(np.empty((2, 5, 8)), np.empty((2, 5, 5)), np.empty((2, 5, 24)),
                               2, 0.5), "p"),
    (lambda: sdpa.sdpa_forward(np.empty((2, 5, 8), np.float32), np.empty((4, 5, 5)),
                               np.empty((2, 5, 24)), 2, 0.5), "out"),
    (lambda: sdpa.sdpa_forward(np.empty((2, 5, 8)), np.empty((4, 5, 5)), np.empty((2, 5, 24)),
                               0, 0.5), "n_heads"),
    (lambda: sdpa.sdpa_backward(np.empty((2, 5, 23)), np.empty((2, 5, 8)), np.empty((4, 5, 5)),
                                np.empty((2, 5, 24)), 2, 0.5), "dqkv"),
])
def test_bad_arguments_raise_naming_them(call, match):
    # Check shape, dtype and head-count errors name the argument.
    with pytest.raises((ValueError, TypeError), match=match):
        call()


def test_overlapping_output_is_refused():
    # Check that dqkv overlapping qkv other than as the same array (a shifted view) is
    # refused, and overlapping do too, with nothing written.
    qkv, do = _inputs((1, 4, 4, 2), F64)
    p = np.zeros((2, 4, 4))
    sdpa.sdpa_forward(np.empty((1, 4, 4)), p, qkv, 2, 0.5)
    big = np.zeros((1, 5, 12))
    big[:, :4] = qkv
    before = big.copy()
    with pytest.raises(ValueError, match="dqkv: must not overlap qkv"):
        sdpa.sdpa_backward(big[:, 1:], do, p, big[:, :4], 2, 0.5)
    np.testing.assert_array_equal(big, before)
    buf = np.zeros(qkv.size)
    with pytest.raises(ValueError, match="dqkv: must not overlap do"):
        sdpa.sdpa_backward(buf.reshape(qkv.shape), buf[:do.size].reshape(do.shape), p, qkv,
                           2, 0.5)
    assert not buf.any()


@pytest.mark.parametrize("dtype", [np.float32, F64])
def test_backward_in_place_over_qkv_matches_a_separate_output(dtype, monkeypatch):
    # Check that dqkv = qkv itself gives the bits of a separate dqkv, on one thread and on
    # two with the pairs split (15 pairs of 3 heads over 2 slots: sequence 2 cut between
    # them, its heads read by one slot while the other writes back its own).
    shape = (5, 16, 24, 3)
    b, t, d, h = shape
    scale = 1.0 / np.sqrt(d // h)
    qkv, do = _inputs(shape, dtype, seed=7)
    want = _run(shape, dtype, True, qkv, do)[2]
    p = np.zeros((b * h, t, t), dtype)
    monkeypatch.setattr(parallel, "SPLIT_WORK", 2)  # split however small
    for threads in (1, 2):
        with num_threads(threads):
            got = qkv.copy()
            sdpa.sdpa_forward(np.empty((b, t, d), dtype), p, got, h, scale)
            before = parallel.handoffs()
            assert sdpa.sdpa_backward(got, do, p, got, h, scale) is got
            assert (parallel.handoffs() > before) == (threads == 2)
        np.testing.assert_array_equal(got, want)


@pytest.mark.parametrize("dtype", [np.float32, F64])
@pytest.mark.parametrize("causal", [True, False])
@pytest.mark.parametrize("shape", [(2, 7, 12, 3), (1, 130, 64, 2), (5, 16, 24, 3)])
def test_bias_gives_the_bits_of_qkv_plus_bias(shape, causal, dtype, monkeypatch):
    # Check that the projection's bias added as the kernels read each sequence gives the
    # bits of the kernels on qkv + bias (forward out and P, backward d[q | k | v], also in
    # place over qkv), on one thread and on two with the pairs split, and that the forward
    # leaves qkv as it was.
    b, t, d, h = shape
    scale = 1.0 / np.sqrt(d // h)
    qkv, do = _inputs(shape, dtype, seed=3)
    bias = np.random.default_rng(4).standard_normal(3 * d).astype(dtype)
    want_out, want_p, want_dqkv = _run(shape, dtype, causal, qkv + bias, do)
    monkeypatch.setattr(parallel, "SPLIT_WORK", 2)  # split however small
    for threads in (1, 2):
        with num_threads(threads):
            got, before = qkv.copy(), qkv.copy()
            out, p = np.empty((b, t, d), dtype), np.zeros((b * h, t, t), dtype)
            sdpa.sdpa_forward(out, p, got, h, scale, causal, bias)
            np.testing.assert_array_equal(got, before)
            dqkv = sdpa.sdpa_backward(np.empty_like(qkv), do, p, got, h, scale, causal, bias)
            sdpa.sdpa_backward(got, do, p, got, h, scale, causal, bias)
        np.testing.assert_array_equal(out, want_out)
        np.testing.assert_array_equal(_lower(p, causal), _lower(want_p, causal))
        np.testing.assert_array_equal(dqkv, want_dqkv)
        np.testing.assert_array_equal(got, want_dqkv)


def test_bias_matches_the_reference():
    # Check the biased kernels against the float64 reference given the same bias.
    shape = (2, 9, 12, 3)
    b, t, d, h = shape
    scale = 1.0 / np.sqrt(d // h)
    qkv, do = _inputs(shape, F64, seed=5)
    bias = np.random.default_rng(6).standard_normal(3 * d)
    out, p = np.empty((b, t, d)), np.zeros((b * h, t, t))
    sdpa.sdpa_forward(out, p, qkv, h, scale, True, bias)
    dqkv = sdpa.sdpa_backward(np.empty_like(qkv), do, p, qkv, h, scale, True, bias)
    r_out, r_p = np.empty((b, t, d)), np.empty((b * h, t, t))
    R.sdpa_forward(r_out, r_p, qkv, h, scale, True, bias)
    r_dqkv = R.sdpa_backward(np.empty_like(qkv), do, r_p, qkv, h, scale, True, bias)
    np.testing.assert_allclose(out, r_out, rtol=1e-12, atol=1e-12)
    np.testing.assert_allclose(dqkv, r_dqkv, rtol=1e-11, atol=1e-11)
    assert np.abs(out - R.sdpa_forward(np.empty_like(out), r_p, qkv, h, scale)).max() > 1e-3


@pytest.mark.parametrize("bias, match", [
    (np.zeros(23), r"bias: .*shape"), (np.zeros(24, np.float32), "bias"),
    (np.zeros((2, 12)), "bias"), ("b", "bias")])
def test_bad_bias_raises_naming_it_and_writes_nothing(bias, match):
    # Check a bias of the wrong shape, dtype or kind is refused before anything is written.
    qkv, do = _inputs((2, 5, 8, 2), F64)
    out, p = np.zeros((2, 5, 8)), np.zeros((4, 5, 5))
    with pytest.raises((ValueError, TypeError), match=match):
        sdpa.sdpa_forward(out, p, qkv, 2, 0.5, True, bias)
    with pytest.raises((ValueError, TypeError), match=match):
        sdpa.sdpa_backward(np.zeros_like(qkv), do, p, qkv, 2, 0.5, True, bias)
    assert not out.any() and not p.any()


def test_bias_overlapping_an_output_is_refused():
    # Check that a bias inside out or dqkv is refused, with nothing written.
    qkv, do = _inputs((1, 4, 4, 2), F64)
    p = np.zeros((2, 4, 4))
    out = np.zeros((1, 4, 4))
    with pytest.raises(ValueError, match="out: must not overlap bias"):
        sdpa.sdpa_forward(out, p, qkv, 2, 0.5, True, out.reshape(-1)[:12])
    assert not out.any() and not p.any()
    dqkv = np.zeros_like(qkv)
    with pytest.raises(ValueError, match="dqkv: must not overlap bias"):
        sdpa.sdpa_backward(dqkv, do, p, qkv, 2, 0.5, True, dqkv[0, 1])
    assert not dqkv.any()

"""GPT: exact gradients with tied weights, the tied gradient as the sum of both uses,
nanoGPT's initialisation, causality, checkpointing, errors that change nothing, and that it
learns."""
import math

import numpy as np
import pytest

from engine.models.gpt import GPT
from gradcheck import assert_close, numeric_grad

F64 = np.float64


def _gpt(seed=0, jitter=0.1, **kw):
    opts = dict(vocab_size=7, block_size=6, n_layer=2, n_head=2, d_model=8, d_ff=12,
                dtype=F64, rng=seed)
    opts.update(kw)
    m = GPT(**opts)
    rng = np.random.default_rng(seed + 1)
    for p in m.parameters():  # biases and LayerNorm parameters away from 0 and 1
        p.data = p.data + jitter * rng.standard_normal(p.shape)
    return m


def _grads(m, ids, dlogits):
    m.zero_grad()
    m.forward(ids)
    assert m.backward(dlogits.copy()) is None
    return {n: p.grad.copy() for n, p in m.named_parameters()}


@pytest.mark.parametrize("tie", [True, False])
def test_gradients_match_finite_differences(tie):
    # Check every parameter gradient of a 2-layer GPT (float64 central differences of
    # L = sum(logits * R)); with tie_weights the embedding's gradient holds both uses.
    m = _gpt(tie_weights=tie)
    rng = np.random.default_rng(2)
    ids = rng.integers(0, 7, (2, 5))
    R = rng.standard_normal((2, 5, 7))
    grads = _grads(m, ids, R)

    def loss():
        return float(np.sum(m.forward(ids) * R))
    for n, p in m.named_parameters():
        assert_close(grads[n], numeric_grad(loss, p.data), n, 1e-5, 1e-7)


def test_tied_gradient_is_the_sum_of_embedding_and_head_gradients():
    # Check that tying adds both uses into one gradient: an untied GPT whose head holds the
    # embedding's transpose computes the same logits, and its two gradients sum (head
    # transposed) to the tied model's embedding gradient.
    tied = _gpt(tie_weights=True)
    free = _gpt(tie_weights=False)
    sd = {n: p.data for n, p in tied.named_parameters()}
    for n, p in free.named_parameters():
        p.data = sd["wte.W"].T.copy() if n == "lm_head.W" else sd[n]
    rng = np.random.default_rng(3)
    ids = rng.integers(0, 7, (3, 6))
    assert_close(free.forward(ids), tied.forward(ids), "logits", 1e-13, 1e-13)
    R = rng.standard_normal((3, 6, 7))
    gt, gf = _grads(tied, ids, R), _grads(free, ids, R)
    assert_close(gt["wte.W"], gf["wte.W"] + gf["lm_head.W"].T, "wte.W", 1e-12, 1e-12)
    assert "lm_head.W" not in gt
    assert tied.num_parameters() == free.num_parameters() - 7 * 8


def test_nanogpt_initialisation():
    # Check std 0.02 for weights and embeddings, 0.02 / sqrt(2 n_layer) for the residual
    # projections, zero biases and unit LayerNorm gains.
    m = GPT(300, 64, 4, 4, 128, rng=0)
    proj = 0.02 / math.sqrt(2 * 4)
    for n, p in m.named_parameters():
        d = p.data
        if n.endswith(("attn.W_o", "mlp.W_out")):
            assert abs(d.std() / proj - 1) < 0.05, n
        elif d.ndim == 2:
            assert abs(d.std() / 0.02 - 1) < 0.05, n
        elif n.endswith("gamma"):
            assert np.all(d == 1.0), n
        else:
            assert np.all(d == 0.0), n


def test_future_tokens_change_no_past_logit_and_get_no_gradient():
    # Check causality end to end: logits at positions <= t ignore later tokens, and a loss on
    # position t puts no gradient into the position embeddings after t.
    m = _gpt()
    rng = np.random.default_rng(4)
    ids = rng.integers(0, 7, (2, 6))
    y = m.forward(ids).copy()
    for t in range(5):
        ids2 = ids.copy()
        ids2[:, t + 1:] = (ids2[:, t + 1:] + 1) % 7
        np.testing.assert_array_equal(m.forward(ids2)[:, :t + 1], y[:, :t + 1])
        dl = np.zeros((2, 6, 7))
        dl[:, t] = rng.standard_normal((2, 7))
        g = _grads(m, ids, dl)
        assert np.all(g["wpe.W"][t + 1:] == 0.0)
        assert np.all(np.abs(g["wpe.W"][:t + 1]).sum(1) > 0)


def test_checkpointed_gpt_equals_the_plain_one():
    # Check checkpoint=True (blocks recomputed in backward) against the plain model.
    a, b = _gpt(), _gpt(checkpoint=True)
    b.load_state_dict(a.state_dict())
    rng = np.random.default_rng(5)
    ids = rng.integers(0, 7, (2, 6))
    R = rng.standard_normal((2, 6, 7))
    assert_close(b.forward(ids), a.forward(ids), "logits", 1e-12, 1e-12)
    ga, gb = _grads(a, ids, R), _grads(b, ids, R)
    for n in ga:
        assert_close(gb[n], ga[n], n, 1e-12, 1e-12)


def _lane_run(enabled, dropout, hooks, ffn):
    """Gradients of one float64 GPT backward at 2 threads with the lane on or off, the
    GEMMs it queued, and each block's gradients as a hook on the blocks saw them."""
    import kernels
    from kernels import overlap
    m = _gpt(dropout=dropout, n_layer=3, ffn=ffn)
    rng = np.random.default_rng(7)
    ids, R = rng.integers(0, 7, (3, 6)), rng.standard_normal((3, 6, 7))
    seen = []
    if hooks:
        m.h.add_backward_hook(lambda child: seen.append(
            [p.grad.copy() for p in child.parameters()]))
    overlap.ENABLED[0] = enabled
    try:
        with kernels.num_threads(2):
            before = overlap._lane[0].submitted if overlap._lane[0] else 0
            grads = _grads(m, ids, R)
            queued = (overlap._lane[0].submitted if overlap._lane[0] else 0) - before
    finally:
        overlap.ENABLED[0] = True
    return grads, queued, seen


@pytest.mark.parametrize("dropout, hooks, ffn", [(0.0, False, "gelu"), (0.0, True, "gelu"),
                                                 (0.2, True, "gelu"), (0.0, False, "swiglu")])
def test_weight_gradients_on_the_lane_equal_the_plain_backward(dropout, hooks, ffn):
    # Check that at 2 threads the backward queues every layer's four weight-gradient GEMMs,
    # FFN or gated, and the tied head's on the lane (kernels.overlap; none with attention
    # dropout, whose per-head GEMMs run better on both threads), and that the gradients, and
    # those a hook on the blocks sees, equal a backward without it (a GEMM reading an
    # operand that was already overwritten would be off by O(1)).
    from kernels import overlap
    if not overlap.available():
        pytest.skip("no Fortran GEMM to call without the GIL")
    ga, queued, seen_a = _lane_run(True, dropout, hooks, ffn)
    gb, none, seen_b = _lane_run(False, dropout, hooks, ffn)
    assert (queued, none) == (0 if dropout else 4 * 3 + 1, 0)
    for n in ga:
        assert_close(ga[n], gb[n], n, 1e-12, 1e-12)
    assert len(seen_a) == len(seen_b) == (3 if hooks else 0)
    for block_a, block_b in zip(seen_a, seen_b):
        for a, b in zip(block_a, block_b):
            assert_close(a, b, "hook", 1e-12, 1e-12)


@pytest.mark.parametrize("bad, err, match", [
    (np.zeros((2, 7), np.int64), ValueError, "block_size = 6"),
    (np.full((2, 3), 7), ValueError, r"ids in \[0, 7\), got 7 at index \(0, 0\)"),
    (np.array([[0, -1]]), ValueError, r"got -1 at index \(0, 1\)"),
    (np.zeros((2, 3)), TypeError, "integer"),
    (np.zeros(3, np.int64), ValueError, r"\(B, T\)"),
])
def test_bad_ids_raise_and_change_nothing(bad, err, match):
    # Check that a rejected call leaves the previous forward's backward intact.
    m = _gpt()
    ids = np.random.default_rng(6).integers(0, 7, (2, 5))
    R = np.random.default_rng(7).standard_normal((2, 5, 7))
    ref = _grads(m, ids, R)
    m.zero_grad()
    m.forward(ids)
    with pytest.raises(err, match=match):
        m.forward(bad)
    m.backward(R.copy())
    for n, p in m.named_parameters():
        np.testing.assert_array_equal(p.grad, ref[n], err_msg=n)


def test_d_model_not_divisible_by_n_head():
    # Check the error names d_model and n_heads.
    with pytest.raises(ValueError, match="d_model.*n_heads = 3"):
        GPT(7, 6, 1, 3, 8)


def test_shorter_prompts_and_eval_mode():
    # Check that any T <= block_size works and gives the first T positions of a longer call.
    m = _gpt(dropout=0.2)
    m.eval()
    ids = np.random.default_rng(8).integers(0, 7, (1, 6))
    full = m.forward(ids).copy()
    for t in range(1, 7):
        assert_close(m.forward(ids[:, :t]), full[:, :t], f"T={t}", 1e-13, 1e-13)


def test_it_learns_a_sequence():
    # Check that AdamW steps drive the loss of a fixed batch of sequences down (it can
    # memorise them: a next-token task with a deterministic answer).
    from engine.nn.losses import CrossEntropyLoss
    from engine.optim import AdamW
    m = GPT(11, 16, 2, 2, 32, dtype=np.float32, rng=0)
    seq = np.arange(17) % 11
    x, y = np.stack([seq[:16]] * 4), np.stack([seq[1:]] * 4)
    loss, opt = CrossEntropyLoss(), AdamW(m.parameters(), lr=3e-3)
    first = None
    for _ in range(60):
        val = loss.forward(m.forward(x), y)
        first = val if first is None else first
        m.backward(loss.backward())
        opt.step()
        m.zero_grad()
    assert first > 2.0 and val < 0.1 * first


def test_check_input_describes_what_forward_takes():
    # Check the protocol's check_input: the logits' shape for good ids, the forward's own
    # error for bad ones (fit checks a whole data set with it before the first step).
    m = _gpt()
    assert m.check_input(np.zeros((3, 6), np.int64)) == (3, 6, 7)
    with pytest.raises(ValueError, match="block_size = 6"):
        m.check_input(np.zeros((1, 7), np.int64))
    with pytest.raises(ValueError, match="X: expected ids in"):
        m.check_input(np.full((1, 2), 9), "X")
    from engine.nn.attention import MultiHeadAttention
    a = MultiHeadAttention(8, 2, dtype=F64)
    assert a.check_input(np.zeros((2, 3, 8))) == (2, 3, 8)
    with pytest.raises(ValueError, match=r"\(B, T, 8\)"):
        a.check_input(np.zeros((3, 8)))


def test_data_set_check_leaves_score_memory_to_the_batch():
    # Check that a data set whose sequences' attention scores together exceed the per-call
    # bound passes the data-set check (it is run in batches), while a forward of all of it
    # at once is refused before anything runs.
    from engine.training.checks import check_x
    g = GPT(5, 64, 1, 1, 8, rng=0)
    per_seq = g.h[0].attn.scores_nbytes(1, 64)
    b = g.h[0].attn.max_scores_bytes // per_seq + 1
    ids = np.zeros((b, 64), np.int64)
    assert check_x(g, ids, "X", True) == (b, 64, 5)
    with pytest.raises(ValueError, match="max_scores_bytes"):
        g.forward(ids)
    assert g.forward(ids[:2]).shape == (2, 64, 5)

"""GPT's residual stream in fused passes: the token rows plus the position rows gathered and
added in one pass (no separate add), and each pre-norm block's ln_1 adding its input gradient
into the residual gradient inside its backward pass."""
import numpy as np

from engine.models.gpt import GPT
from kernels import instrument

F32 = np.float32


def _gpt(n_layer=2):
    return GPT(vocab_size=11, block_size=8, n_layer=n_layer, n_head=2, d_model=16, dtype=F32,
               rng=0)


def test_embeddings_are_one_gather_and_one_gather_add():
    # Check that a forward runs the two lookups (the second adding the first) and no add,
    # and that the blocks get exactly wte[ids] + wpe[t] (one float32 rounding).
    m = _gpt()
    ids = np.random.default_rng(1).integers(0, 11, (3, 7))
    with instrument.record(["embedding_forward", "add", "layernorm_forward"]) as rec:
        m(ids)
    names = rec.names()
    assert names.count("embedding_forward") == 2 and "add" not in names
    first, second = rec.of("embedding_forward")
    assert first.args[3] is None and np.shares_memory(second.args[3], first.args[0])
    x = rec.of("layernorm_forward")[0].args[3]          # ln_1 of the first block reads it
    want = m.wte.W.data[ids] + m.wpe.W.data[np.arange(7)]
    np.testing.assert_array_equal(x.reshape(3, 7, 16), want)


def test_backward_adds_once_per_block():
    # Check that a backward runs one add per block (dy onto ln_2's gradient) and that every
    # other residual sum rides in a LayerNorm backward (ln_1 accumulating).
    m = _gpt(n_layer=3)
    rng = np.random.default_rng(2)
    ids = rng.integers(0, 11, (2, 8))
    m(ids)
    with instrument.record(["add", "layernorm_backward"]) as rec:
        m.backward(rng.standard_normal((2, 8, 11)).astype(F32))
    names = rec.names()
    assert names.count("add") == 3
    lns = rec.of("layernorm_backward")
    assert len(lns) == 7                                 # ln_f, then ln_2, ln_1 per block
    assert [c.args[-1] for c in lns] == [False] + [False, True] * 3

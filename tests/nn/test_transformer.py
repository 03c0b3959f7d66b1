"""TransformerBlock: exact gradients, the composition it states, checkpointed stacks, a steady
step that allocates nothing, and errors that change nothing."""
import numpy as np
import pytest

from engine.nn.blocks import FFN, LayerNorm
from engine.nn.gated import GatedFFN
from engine.nn.containers import Sequential
from engine.nn.transformer import TransformerBlock
from gradcheck import assert_close, check_module_grads

F64 = np.float64


def _block(norm="pre", ffn="gelu", seed=0, dtype=F64, d=8, h=2, f=12, **kw):
    m = TransformerBlock(d, h, f, ffn=ffn, norm=norm, dtype=dtype, rng=seed, **kw)
    rng = np.random.default_rng(seed + 50)
    for p in m.parameters():  # LayerNorm gains away from 1, biases away from 0
        p.data = (p.data + 0.2 * rng.standard_normal(p.shape)).astype(dtype)
    return m


@pytest.mark.parametrize("norm", ["pre", "post"])
@pytest.mark.parametrize("ffn", ["gelu", "swiglu"])
def test_gradients_match_finite_differences(norm, ffn):
    # Check dx and every parameter gradient of the block (float64 central differences).
    m = _block(norm, ffn)
    x = np.random.default_rng(1).standard_normal((2, 4, 8))
    check_module_grads(m, x, np.random.default_rng(2))


@pytest.mark.parametrize("norm", ["pre", "post"])
def test_forward_is_the_stated_composition(norm):
    # Check y against the children called one by one: pre x + attn(ln_1(x)), then
    # h + mlp(ln_2(h)); post ln_1(x + attn(x)), then ln_2(h + mlp(h)).
    m = _block(norm)
    x = np.random.default_rng(3).standard_normal((2, 5, 8))
    y = m(x).copy()
    if norm == "pre":
        h = x + m.attn(m.ln_1(x).copy())
        want = h + m.mlp(m.ln_2(h).copy())
    else:
        h = m.ln_1(x + m.attn(x)).copy()
        want = m.ln_2(h + m.mlp(h))
    assert_close(y, want, "y", 1e-12, 1e-12)


def test_ffn_choice():
    # Check that an activation name gives an FFN and "swiglu" a GatedFFN with silu.
    assert isinstance(TransformerBlock(8, 2, 12, ffn="relu").mlp, FFN)
    g = TransformerBlock(8, 2, 12, ffn="swiglu").mlp
    assert isinstance(g, GatedFFN) and g.activation == "silu"
    with pytest.raises(ValueError, match="ffn"):
        TransformerBlock(8, 2, 12, ffn="nope")


def test_causal_block_sees_no_future():
    # Check that outputs at positions <= t do not change when later inputs do.
    m = _block()
    rng = np.random.default_rng(4)
    x = rng.standard_normal((2, 6, 8))
    y = m(x).copy()
    x[:, 3:] += 1.0
    np.testing.assert_array_equal(m(x)[:, :3], y[:, :3])


def test_checkpointed_stack_equals_the_plain_stack():
    # Check that Sequential(checkpoint=True) over TransformerBlocks (with dropout, which the
    # rerun must redraw identically) gives the plain stack's output and gradients, and holds
    # less in work buffers.
    def stack(ck):
        return Sequential(*[_block(seed=i, dropout=0.1) for i in range(3)], checkpoint=ck)
    plain, ck = stack(False), stack(True)
    x = np.random.default_rng(5).standard_normal((2, 6, 8))
    dy = np.random.default_rng(6).standard_normal((2, 6, 8))
    y1 = plain(x).copy()
    dx1 = plain.backward(dy).copy()
    y2 = ck(x).copy()
    dx2 = ck.backward(dy).copy()
    assert_close(y2, y1, "y", 1e-12, 1e-12)
    assert_close(dx2, dx1, "dx", 1e-12, 1e-12)
    assert_close(ck.flat_grads(), plain.flat_grads(), "grads", 1e-12, 1e-12)
    assert ck.workspace_nbytes() < plain.workspace_nbytes()


def test_bad_input_raises_and_changes_nothing():
    # Check that a wrong shape is refused before any child runs: the previous forward's
    # backward still gives its gradients.
    m = _block()
    x = np.random.default_rng(7).standard_normal((2, 4, 8))
    dy = np.ones_like(x)
    m(x)
    ref = m.backward(dy).copy()
    m(x)
    for bad in (np.ones((8, 8)), np.ones((1, 4, 7)), np.ones((1, 4, 8), np.float32)):
        with pytest.raises((ValueError, TypeError)):
            m(bad)
    np.testing.assert_array_equal(m.backward(dy), ref)


def test_bad_arguments():
    # Check the constructor's errors name the argument.
    with pytest.raises(ValueError, match="norm"):
        TransformerBlock(8, 2, 12, norm="sandwich")
    with pytest.raises(ValueError, match="d_model"):
        TransformerBlock(10, 3, 12)
    with pytest.raises(ValueError, match="dropout"):
        TransformerBlock(8, 2, 12, dropout=1.0)


def test_children_are_public_modules():
    # Check the parameter names (nanoGPT's Block children) and that LayerNorms are children.
    m = TransformerBlock(8, 2, 12)
    assert isinstance(m.ln_1, LayerNorm) and isinstance(m.ln_2, LayerNorm)
    assert [n for n, _ in m.named_parameters()] == [
        "ln_1.gamma", "ln_1.beta", "attn.W_qkv", "attn.b_qkv", "attn.W_o", "attn.b_o",
        "ln_2.gamma", "ln_2.beta", "mlp.W_in", "mlp.b1", "mlp.W_out", "mlp.b2"]

"""LayerNorm(bias=False) (nanoGPT's ``LayerNorm(ndim, bias=False)``): no beta anywhere, exact
gradients, and the bias-free TransformerBlock and GPT built from it."""
import numpy as np
import pytest

from engine.models.gpt import GPT
from engine.nn.blocks import LayerNorm
from engine.nn.transformer import TransformerBlock
from gradcheck import check_module_grads

F64 = np.float64


def test_no_beta_in_parameters_state_dict_or_config():
    # Check that a bias-free LayerNorm has gamma as its only parameter and says so in its
    # configuration (so a checkpoint rebuilds it bias-free).
    ln = LayerNorm(6, bias=False)
    assert [n for n, _ in ln.named_parameters()] == ["gamma"]
    assert list(ln.state_dict()) == ["gamma"]
    assert ln.beta is None
    assert ln.get_config()["bias"] is False
    assert LayerNorm(**ln.get_config()).beta is None


def test_forward_is_the_normalised_input_times_gamma():
    # Check y = (x - mean) / sqrt(var + eps) * gamma computed with numpy, no beta added.
    rng = np.random.default_rng(0)
    ln = LayerNorm(5, eps=1e-3, dtype=F64, bias=False)
    ln.gamma.data = rng.standard_normal(5)
    x = rng.standard_normal((4, 5)) * 3 + 1
    xhat = (x - x.mean(1, keepdims=True)) / np.sqrt(x.var(1, keepdims=True) + 1e-3)
    np.testing.assert_allclose(ln(x), xhat * ln.gamma.data, rtol=1e-12, atol=1e-13)


def test_gradients_match_finite_differences():
    # Check dx and dgamma in float64 against central differences (twice: a stale dbeta
    # scratch must not leak into anything).
    rng = np.random.default_rng(1)
    ln = LayerNorm(7, dtype=F64, bias=False)
    ln.gamma.data = 1 + 0.3 * rng.standard_normal(7)
    x = rng.standard_normal((2, 3, 7))
    check_module_grads(ln, x, np.random.default_rng(2))
    check_module_grads(ln, x, np.random.default_rng(3))


def test_bias_argument_must_be_a_bool():
    # Check that bias=0 (a size typed in the wrong slot?) is a TypeError naming bias.
    with pytest.raises(TypeError, match="bias"):
        LayerNorm(4, bias=0)


def test_transformer_block_norm_bias_false_gradients():
    # Check a block with bias-free Linears and LayerNorms: no bias parameter at all, and exact
    # gradients for every parameter and the input.
    rng = np.random.default_rng(3)
    m = TransformerBlock(8, 2, 12, bias=False, norm_bias=False, dtype=F64, rng=0)
    for p in m.parameters():
        p.data = p.data + 0.2 * rng.standard_normal(p.shape)
    names = [n for n, _ in m.named_parameters()]
    assert names == ["ln_1.gamma", "attn.W_qkv", "attn.W_o", "ln_2.gamma", "mlp.W_in",
                     "mlp.W_out"]
    check_module_grads(m, rng.standard_normal((2, 4, 8)), np.random.default_rng(4))
    assert TransformerBlock(**m.get_config()).ln_2.beta is None


def test_gpt_bias_false_has_no_bias_and_matches_bias_true_with_zero_biases():
    # Check that GPT(bias=False) gives the logits of GPT(bias=True) whose biases (Linears'
    # and LayerNorms' beta) are zero and other weights equal.
    a = GPT(11, 8, 2, 2, 8, bias=False, dtype=F64, rng=0)
    b = GPT(11, 8, 2, 2, 8, bias=True, dtype=F64, rng=1)
    assert not any(n.endswith(("beta", "b_qkv", "b_o", "b1", "b2")) for n, _ in
                   a.named_parameters())
    own = dict(a.named_parameters())
    for n, p in b.named_parameters():
        p.data = own[n].data if n in own else np.zeros(p.shape)
    ids = np.random.default_rng(2).integers(0, 11, (2, 6))
    np.testing.assert_allclose(a(ids), b(ids), rtol=1e-13, atol=1e-14)

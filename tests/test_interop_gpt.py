"""Attention and GPT weights to and from PyTorch: MultiHeadAttention as
torch.nn.MultiheadAttention(batch_first=True), GPT as nanoGPT's module tree (written here in
torch: the reference). Logits and gradients compared in float64. The names alone are checked
without torch; the comparisons are skipped where torch is not installed."""
import math

import numpy as np
import pytest

from engine.interop import load_torch_state_dict, to_torch_state_dict, torch_names
from engine.models.gpt import GPT
from engine.nn.attention import MultiHeadAttention
from engine.nn.transformer import TransformerBlock

F64 = np.float64


def test_gpt_names_are_nanogpts():
    # Check the key set against nanoGPT's state_dict names for 2 layers, tied and untied.
    g = GPT(11, 8, 2, 2, 8, rng=0)
    keys = [k for k, _, _ in torch_names(g)]
    per_block = ["ln_1.weight", "ln_1.bias", "attn.c_attn.weight", "attn.c_attn.bias",
                 "attn.c_proj.weight", "attn.c_proj.bias", "ln_2.weight", "ln_2.bias",
                 "mlp.c_fc.weight", "mlp.c_fc.bias", "mlp.c_proj.weight", "mlp.c_proj.bias"]
    want = (["transformer.wte.weight", "transformer.wpe.weight"]
            + [f"transformer.h.{i}.{k}" for i in range(2) for k in per_block]
            + ["transformer.ln_f.weight", "transformer.ln_f.bias", "lm_head.weight"])
    assert keys == want
    sd = to_torch_state_dict(g)
    np.testing.assert_array_equal(sd["lm_head.weight"], sd["transformer.wte.weight"])
    untied = GPT(11, 8, 2, 2, 8, tie_weights=False, rng=0)
    assert [k for k, _, _ in torch_names(untied)] == want
    assert to_torch_state_dict(untied)["lm_head.weight"].shape == (11, 8)


def test_tied_keys_that_differ_are_refused_and_change_nothing():
    # Check that a state whose lm_head.weight differs from wte.weight cannot load into a
    # tied GPT, and the model keeps its parameters.
    g = GPT(11, 8, 1, 2, 8, dtype=F64, rng=0)
    before = g.flat_params().copy()
    sd = to_torch_state_dict(GPT(11, 8, 1, 2, 8, dtype=F64, rng=1))
    sd["lm_head.weight"] = sd["lm_head.weight"] + 1.0
    with pytest.raises(ValueError, match="tied"):
        load_torch_state_dict(g, sd)
    np.testing.assert_array_equal(g.flat_params(), before)


def test_attention_names_are_torchs():
    # Check nn.MultiheadAttention's parameter names (without biases: no bias keys).
    assert [k for k, _, _ in torch_names(MultiHeadAttention(8, 2))] == [
        "in_proj_weight", "in_proj_bias", "out_proj.weight", "out_proj.bias"]
    assert [k for k, _, _ in torch_names(MultiHeadAttention(8, 2, bias=False))] == [
        "in_proj_weight", "out_proj.weight"]


# ----------------------------------------------------------------------------- with torch
def _nanogpt(torch, vocab, block_size, n_layer, n_head, d, tie):
    """nanoGPT's GPT module tree (Karpathy), written here as the reference."""
    nn, F = torch.nn, torch.nn.functional

    class CausalSelfAttention(nn.Module):
        def __init__(self):
            super().__init__()
            self.c_attn = nn.Linear(d, 3 * d)
            self.c_proj = nn.Linear(d, d)

        def forward(self, x):
            b, t, c = x.shape
            q, k, v = self.c_attn(x).split(d, dim=2)
            q, k, v = (a.view(b, t, n_head, c // n_head).transpose(1, 2) for a in (q, k, v))
            att = (q @ k.transpose(-2, -1)) / math.sqrt(c // n_head)
            mask = torch.tril(torch.ones(t, t, dtype=torch.bool))
            att = F.softmax(att.masked_fill(~mask, float("-inf")), dim=-1)
            return self.c_proj((att @ v).transpose(1, 2).contiguous().view(b, t, c))

    class MLP(nn.Module):
        def __init__(self):
            super().__init__()
            self.c_fc, self.gelu, self.c_proj = nn.Linear(d, 4 * d), nn.GELU(), nn.Linear(4 * d, d)

        def forward(self, x):
            return self.c_proj(self.gelu(self.c_fc(x)))

    class Block(nn.Module):
        def __init__(self):
            super().__init__()
            self.ln_1, self.attn = nn.LayerNorm(d), CausalSelfAttention()
            self.ln_2, self.mlp = nn.LayerNorm(d), MLP()

        def forward(self, x):
            x = x + self.attn(self.ln_1(x))
            return x + self.mlp(self.ln_2(x))

    class Model(nn.Module):
        def __init__(self):
            super().__init__()
            self.transformer = nn.ModuleDict(dict(
                wte=nn.Embedding(vocab, d), wpe=nn.Embedding(block_size, d),
                h=nn.ModuleList([Block() for _ in range(n_layer)]), ln_f=nn.LayerNorm(d)))
            self.lm_head = nn.Linear(d, vocab, bias=False)
            if tie:
                self.transformer.wte.weight = self.lm_head.weight

        def forward(self, idx):
            t = idx.shape[1]
            tr = self.transformer
            x = tr.wte(idx) + tr.wpe(torch.arange(t))
            for blk in tr.h:
                x = blk(x)
            return self.lm_head(tr.ln_f(x))

    return Model().double()


@pytest.mark.parametrize("tie", [True, False])
def test_gpt_matches_nanogpt_logits_and_gradients(tie):
    # Check that our weights loaded into nanoGPT (strict) give the same logits and the same
    # gradients of sum(logits * R), the tied embedding's included, and that nanoGPT's own
    # weights load back into a fresh GPT with the same logits.
    torch = pytest.importorskip("torch")
    g = GPT(13, 8, 2, 2, 16, dtype=F64, tie_weights=tie, rng=0)
    ref = _nanogpt(torch, 13, 8, 2, 2, 16, tie)
    ref.load_state_dict({k: torch.from_numpy(v) for k, v in to_torch_state_dict(g).items()},
                        strict=True)
    rng = np.random.default_rng(1)
    ids = rng.integers(0, 13, (3, 7))
    R = rng.standard_normal((3, 7, 13))
    logits = g.forward(ids).copy()
    g.zero_grad()
    g.backward(R.copy())
    out = ref(torch.from_numpy(ids))
    np.testing.assert_allclose(out.detach().numpy(), logits, rtol=1e-10, atol=1e-12)
    (out * torch.from_numpy(R)).sum().backward()
    params = dict(g.named_parameters())
    tparams = dict(ref.named_parameters(remove_duplicate=False))
    for tkey, bname, transposed in torch_names(g):
        tg = tparams[tkey].grad.numpy()
        np.testing.assert_allclose(tg.T if transposed else tg, params[bname].grad, rtol=1e-9,
                                   atol=1e-11, err_msg=tkey)
    fresh = GPT(13, 8, 2, 2, 16, dtype=F64, tie_weights=tie, rng=5)
    load_torch_state_dict(fresh, ref.state_dict())
    np.testing.assert_allclose(fresh.forward(ids), logits, rtol=1e-12, atol=1e-13)


@pytest.mark.parametrize("causal", [True, False])
def test_attention_matches_torch_multiheadattention(causal):
    # Check forward and gradients against nn.MultiheadAttention(batch_first=True) holding
    # our weights (a boolean mask above the diagonal when causal).
    torch = pytest.importorskip("torch")
    m = MultiHeadAttention(12, 3, causal=causal, dtype=F64, rng=0)
    rng = np.random.default_rng(2)
    for p in m.parameters():
        p.data = 0.5 * rng.standard_normal(p.shape)
    ref = torch.nn.MultiheadAttention(12, 3, batch_first=True, dtype=torch.float64)
    ref.load_state_dict({k: torch.from_numpy(v) for k, v in to_torch_state_dict(m).items()},
                        strict=True)
    x = rng.standard_normal((2, 6, 12))
    R = rng.standard_normal((2, 6, 12))
    y = m(x).copy()
    dx = m.backward(R.copy()).copy()
    xt = torch.from_numpy(x).requires_grad_()
    mask = torch.triu(torch.ones(6, 6, dtype=torch.bool), 1) if causal else None
    out = ref(xt, xt, xt, attn_mask=mask, need_weights=False)[0]
    np.testing.assert_allclose(out.detach().numpy(), y, rtol=1e-10, atol=1e-12)
    (out * torch.from_numpy(R)).sum().backward()
    np.testing.assert_allclose(xt.grad.numpy(), dx, rtol=1e-9, atol=1e-11)
    tp = dict(ref.named_parameters())
    params = dict(m.named_parameters())
    for tkey, bname, transposed in torch_names(m):
        tg = tp[tkey].grad.numpy()
        np.testing.assert_allclose(tg.T if transposed else tg, params[bname].grad, rtol=1e-9,
                                   atol=1e-11, err_msg=tkey)


def test_block_round_trip():
    # Check that a TransformerBlock's state dict loads back into a fresh block unchanged.
    a = TransformerBlock(8, 2, 12, dtype=F64, rng=0)
    b = TransformerBlock(8, 2, 12, dtype=F64, rng=1)
    load_torch_state_dict(b, to_torch_state_dict(a))
    np.testing.assert_array_equal(b.flat_params(), a.flat_params())

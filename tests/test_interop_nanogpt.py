"""nanoGPT's state dicts without torch: hand-built dicts of numpy arrays under nanoGPT's
names and shapes (model.py's GPT, with and without biases, tied or not, with the causal-mask
buffers of its non-flash attention and the ``_orig_mod.`` prefix of a compiled model) load
into a GPT that computes nanoGPT's forward, and export back to exactly nanoGPT's keys."""
import math

import numpy as np
import pytest

from engine.interop import load_torch_state_dict, to_torch_state_dict
from engine.models.gpt import GPT

V, BS, L, H, D = 13, 8, 2, 2, 16


def _nanogpt_state(bias: bool, masks: bool = False, seed: int = 0) -> dict:
    """nanoGPT's GPT(GPTConfig(vocab_size=V, block_size=BS, n_layer=L, n_head=H, n_embd=D,
    bias=bias)).state_dict() names and shapes (nn.Linear weights (out, in)), random values;
    lm_head.weight is wte's (nanoGPT ties them)."""
    rng = np.random.default_rng(seed)
    r = lambda *s: 0.3 * rng.standard_normal(s)  # noqa: E731
    sd = {"transformer.wte.weight": r(V, D), "transformer.wpe.weight": r(BS, D)}
    for i in range(L):
        p = f"transformer.h.{i}."
        sd[p + "ln_1.weight"] = 1 + r(D)
        if bias:
            sd[p + "ln_1.bias"] = r(D)
        if masks:
            sd[p + "attn.bias"] = np.tril(np.ones((BS, BS)))[None, None]
        for name, shape in (("attn.c_attn", (3 * D, D)), ("attn.c_proj", (D, D)),
                            ("ln_2", None), ("mlp.c_fc", (4 * D, D)), ("mlp.c_proj", (D, 4 * D))):
            if shape is None:
                sd[p + "ln_2.weight"] = 1 + r(D)
                if bias:
                    sd[p + "ln_2.bias"] = r(D)
                continue
            sd[p + name + ".weight"] = r(*shape)
            if bias:
                sd[p + name + ".bias"] = r(shape[0])
    sd["transformer.ln_f.weight"] = 1 + r(D)
    if bias:
        sd["transformer.ln_f.bias"] = r(D)
    sd["lm_head.weight"] = sd["transformer.wte.weight"]
    return sd


def _ln(x, sd, name):
    y = (x - x.mean(-1, keepdims=True)) / np.sqrt(x.var(-1, keepdims=True) + 1e-5)
    return y * sd[name + ".weight"] + sd.get(name + ".bias", 0.0)


def _lin(x, sd, name):
    return x @ sd[name + ".weight"].T + sd.get(name + ".bias", 0.0)


def _nanogpt_logits(sd, ids):
    """nanoGPT's GPT.forward written in numpy from its state dict (GELU exact, as nn.GELU)."""
    from scipy.special import erf
    t = ids.shape[1]
    x = sd["transformer.wte.weight"][ids] + sd["transformer.wpe.weight"][:t]
    hs = D // H
    for i in range(L):
        p = f"transformer.h.{i}."
        q, k, v = np.split(_lin(_ln(x, sd, p + "ln_1"), sd, p + "attn.c_attn"), 3, axis=-1)
        q, k, v = (a.reshape(*a.shape[:2], H, hs).transpose(0, 2, 1, 3) for a in (q, k, v))
        att = q @ k.transpose(0, 1, 3, 2) / math.sqrt(hs)
        att = np.where(np.tri(t, dtype=bool), att, -np.inf)
        att = np.exp(att - att.max(-1, keepdims=True))
        y = (att / att.sum(-1, keepdims=True)) @ v
        x = x + _lin(y.transpose(0, 2, 1, 3).reshape(x.shape), sd, p + "attn.c_proj")
        z = _lin(_ln(x, sd, p + "ln_2"), sd, p + "mlp.c_fc")
        x = x + _lin(0.5 * z * (1 + erf(z / math.sqrt(2))), sd, p + "mlp.c_proj")
    return _ln(x, sd, "transformer.ln_f") @ sd["lm_head.weight"].T


@pytest.mark.parametrize("bias", [True, False])
def test_nanogpt_state_loads_and_gives_nanogpts_logits(bias):
    # Check that nanoGPT's weights (bias=True and bias=False configs) load into GPT(bias=...)
    # and the logits equal nanoGPT's forward computed in numpy from the same dict.
    sd = _nanogpt_state(bias)
    g = GPT(V, BS, L, H, D, bias=bias, dtype=np.float64, rng=5)
    load_torch_state_dict(g, sd)
    ids = np.random.default_rng(1).integers(0, V, (2, 7))
    np.testing.assert_allclose(g(ids), _nanogpt_logits(sd, ids), rtol=1e-10, atol=1e-12)


@pytest.mark.parametrize("bias", [True, False])
def test_export_has_exactly_nanogpts_keys_and_values(bias):
    # Check that a loaded state exports back with nanoGPT's key set (what its strict=True
    # load needs) and the same arrays, shapes included.
    sd = _nanogpt_state(bias)
    g = GPT(V, BS, L, H, D, bias=bias, dtype=np.float64, rng=5)
    load_torch_state_dict(g, sd)
    out = to_torch_state_dict(g)
    assert set(out) == set(sd)
    for k, v in sd.items():
        np.testing.assert_array_equal(out[k], v, err_msg=k)


def test_bias_mismatch_is_refused_naming_the_keys():
    # Check that a bias=True state does not load into a bias-free GPT (unexpected bias keys
    # named) and changes nothing.
    g = GPT(V, BS, L, H, D, bias=False, dtype=np.float64, rng=5)
    before = g.flat_params().copy()
    with pytest.raises(KeyError, match="ln_f.bias"):
        load_torch_state_dict(g, _nanogpt_state(True))
    np.testing.assert_array_equal(g.flat_params(), before)


def test_untied_head_loads_its_own_weight():
    # Check that an untied GPT takes lm_head.weight apart from wte and exports both.
    sd = _nanogpt_state(False)
    sd["lm_head.weight"] = np.random.default_rng(9).standard_normal((V, D))
    g = GPT(V, BS, L, H, D, bias=False, tie_weights=False, dtype=np.float64, rng=5)
    load_torch_state_dict(g, sd)
    np.testing.assert_array_equal(g.lm_head.W.data, sd["lm_head.weight"].T)
    np.testing.assert_array_equal(to_torch_state_dict(g)["lm_head.weight"], sd["lm_head.weight"])


@pytest.mark.parametrize("bias", [True, False])
def test_causal_mask_buffers_are_checked_and_skipped(bias):
    # Check that the attn.bias masks of nanoGPT without flash attention load (they are no
    # parameter), and that causal_masks=True writes them back: the non-flash key set.
    sd = _nanogpt_state(bias, masks=True)
    g = GPT(V, BS, L, H, D, bias=bias, dtype=np.float64, rng=5)
    load_torch_state_dict(g, sd)
    ids = np.random.default_rng(1).integers(0, V, (1, 8))
    np.testing.assert_allclose(g(ids), _nanogpt_logits(sd, ids), rtol=1e-10, atol=1e-12)
    out = to_torch_state_dict(g, causal_masks=True)
    assert set(out) == set(sd)
    np.testing.assert_array_equal(out["transformer.h.1.attn.bias"], sd["transformer.h.1.attn.bias"])


def test_a_mask_that_is_not_causal_is_refused():
    # Check that an attn.bias buffer of all ones (a model attending ahead) is a ValueError
    # naming the key, and nothing changes.
    sd = _nanogpt_state(False, masks=True)
    sd["transformer.h.0.attn.bias"] = np.ones((1, 1, BS, BS))
    g = GPT(V, BS, L, H, D, bias=False, dtype=np.float64, rng=5)
    before = g.flat_params().copy()
    with pytest.raises(ValueError, match=r"transformer\.h\.0\.attn\.bias"):
        load_torch_state_dict(g, sd)
    np.testing.assert_array_equal(g.flat_params(), before)


def test_compiled_models_prefix_is_removed():
    # Check that keys saved from a torch.compile'd nanoGPT ("_orig_mod." + name) load.
    sd = _nanogpt_state(True)
    g = GPT(V, BS, L, H, D, dtype=np.float64, rng=5)
    load_torch_state_dict(g, {"_orig_mod." + k: v for k, v in sd.items()})
    np.testing.assert_array_equal(g.wpe.W.data, sd["transformer.wpe.weight"])


def test_causal_masks_option_is_for_a_gpt_only():
    # Check that causal_masks=True on a model without nanoGPT's blocks is a ValueError.
    from engine.nn.layers import Linear
    with pytest.raises(ValueError, match="causal_masks"):
        to_torch_state_dict(Linear(2, 3), causal_masks=True)


@pytest.mark.parametrize("bias", [True, False])
def test_gpt_from_nanogpt_checkpoint_entries(bias):
    # Check that a ckpt.pt's model_args and model entries (here numpy, float64) give a GPT
    # of that shape computing nanoGPT's logits, dropout and bias taken from the args.
    from engine.interop import gpt_from_nanogpt
    sd = _nanogpt_state(bias, masks=True)
    args = dict(n_layer=L, n_head=H, n_embd=D, block_size=BS, bias=bias, vocab_size=V,
                dropout=0.1)
    g = gpt_from_nanogpt(args, {"_orig_mod." + k: v for k, v in sd.items()})
    assert (g.n_layer, g.d_model, g.block_size, g.bias, g.p) == (L, D, BS, bias, 0.1)
    ids = np.random.default_rng(1).integers(0, V, (2, 5))
    np.testing.assert_allclose(g.eval()(ids), _nanogpt_logits(sd, ids), rtol=1e-10, atol=1e-12)


def test_gpt_from_nanogpt_names_missing_config_fields():
    # Check that model_args without nanoGPT's fields is a ValueError listing them.
    from engine.interop import gpt_from_nanogpt
    with pytest.raises(ValueError, match=r"\['bias', 'dropout'\]"):
        gpt_from_nanogpt(dict(n_layer=L, n_head=H, n_embd=D, block_size=BS, vocab_size=V),
                         _nanogpt_state(True))

"""A GPT saved with ``engine.save`` is rebuilt by ``load_model`` from the file alone, with its
tokenizer; a stored configuration is untrusted and checked (types, ranges, then the shapes
it implies against the stored arrays) before anything is allocated."""
import json

import numpy as np
import pytest

import engine
from engine.models import lm
from engine.models.gpt import GPT
from engine.models.gpt_config import gpt_parameter_shapes
from engine.models.tokenizer import ByteTokenizer, Vocabulary, tokenizer_meta
from engine.training.checkpoint import CheckpointError

CHARS = "abcdefghij "


def _gpt(**kw):
    args = dict(d_ff=12, rng=0)
    args.update(kw)
    return GPT(len(CHARS), 8, 2, 2, 8, **args)


def _edit_header(src, dst, **changes):
    """A copy of checkpoint ``src`` whose stored GPT config has ``changes`` (None deletes)."""
    with np.load(src) as z:
        arrays = {k: z[k] for k in z.files}
    header = json.loads(str(arrays["__header__"][()]))
    cfg = header["model_config"]["config"]
    for k, v in changes.items():
        if v is None:
            cfg.pop(k)
        else:
            cfg[k] = v
    arrays["__header__"] = np.array(json.dumps(header))
    np.savez(dst, **arrays)
    return dst


@pytest.mark.parametrize("kw", [dict(), dict(bias=False, tie_weights=False, dtype=np.float64),
                                dict(ffn="swiglu", eps=1e-6, dropout=0.1, checkpoint=True)])
def test_load_model_rebuilds_the_gpt_from_the_file_alone(tmp_path, kw):
    # Check that the rebuilt GPT has the saved configuration and weights and gives the same
    # logits (eval mode: dropout off in both).
    g = _gpt(**kw)
    engine.save(tmp_path / "g.npz", g)
    r = engine.load_model(tmp_path / "g.npz")
    assert isinstance(r.model, GPT) and r.model.get_config() == g.get_config()
    np.testing.assert_array_equal(r.model.flat_params(), g.flat_params())
    ids = np.arange(16).reshape(2, 8) % len(CHARS)
    np.testing.assert_array_equal(r.model.eval()(ids), g.eval()(ids))


def test_safetensors_under_pytorch_names_rebuilds_too(tmp_path):
    # Check the .safetensors form (nanoGPT's key names, tied head under two keys).
    g = _gpt(bias=False)
    engine.save(tmp_path / "g.safetensors", g)
    r = engine.load_model(tmp_path / "g.safetensors")
    np.testing.assert_array_equal(r.model.flat_params(), g.flat_params())


@pytest.mark.parametrize("kw", [dict(), dict(bias=False), dict(tie_weights=False),
                                dict(ffn="swiglu", bias=False, tie_weights=False),
                                dict(ffn="geglu")])
def test_parameter_shapes_from_the_config_are_the_models(kw):
    # Check the shapes computed from a configuration (before building) against a built GPT.
    g = _gpt(**kw)
    assert gpt_parameter_shapes(g.get_config()) == {n: p.shape for n, p in
                                                   g.named_parameters()}


def test_tokenizer_entry_is_rebuilt(tmp_path):
    # Check LoadedModel.tokenizer from the metadata's tokenizer entry (a byte tokenizer).
    g = GPT(256, 4, 1, 1, 4, rng=0)
    engine.save(tmp_path / "g.npz", g, tokenizer=tokenizer_meta(ByteTokenizer()))
    assert engine.load_model(tmp_path / "g.npz").tokenizer == ByteTokenizer()


def test_legacy_vocab_entry_is_a_char_vocabulary(tmp_path):
    # Check a gMLP LM checkpoint as the LM CLI wrote it (vocab = the characters) gets a
    # Vocabulary with those characters, and one without any gets None.
    m = lm.build_model(len(CHARS), seq_len=8, d_model=8, d_ffn=8, blocks=1, rng=0)
    engine.save(tmp_path / "lm.npz", m, vocab=Vocabulary(CHARS).chars)
    tok = engine.load_model(tmp_path / "lm.npz").tokenizer
    assert isinstance(tok, Vocabulary) and tok.chars == Vocabulary(CHARS).chars
    engine.save(tmp_path / "bare.npz", m)
    assert engine.load_model(tmp_path / "bare.npz").tokenizer is None


def test_tokenizer_entry_wins_over_vocab(tmp_path):
    # Check that with both entries the tokenizer entry is the one used.
    g = _gpt()
    engine.save(tmp_path / "g.npz", g, tokenizer=tokenizer_meta(Vocabulary(CHARS)),
                vocab="xy")
    assert engine.load_model(tmp_path / "g.npz").tokenizer.chars == Vocabulary(CHARS).chars


@pytest.mark.parametrize("model", ["gpt", "gmlp"])
def test_tokenizer_of_another_size_is_a_checkpoint_error(tmp_path, model):
    # Check that a stored tokenizer whose size is not the model's vocabulary is refused
    # naming both sizes.
    m = _gpt() if model == "gpt" else lm.build_model(len(CHARS), 8, 8, 8, 1, rng=0)
    engine.save(tmp_path / "m.npz", m, tokenizer=tokenizer_meta(Vocabulary("abc")))
    with pytest.raises(CheckpointError, match=r"3 tokens, the model's vocabulary has 11"):
        engine.load_model(tmp_path / "m.npz")


def test_corrupt_tokenizer_entry_is_a_checkpoint_error(tmp_path):
    # Check that an unsorted character list is refused (ids would map to other characters).
    engine.save(tmp_path / "g.npz", _gpt(), tokenizer={"kind": "char", "chars": "ba"})
    with pytest.raises(CheckpointError, match="tokenizer.*sorted"):
        engine.load_model(tmp_path / "g.npz")


@pytest.mark.parametrize("change, match", [
    (dict(d_model=10**9), r"wte\.W the shape \(11, 1000000000\)"),
    (dict(vocab_size=10**12), r"wte\.W the shape"),
    (dict(n_layer=10**9), r"implies \d+ parameter arrays, the file holds"),
    (dict(d_ff=7), r"h\.0\.mlp\.W_in the shape \(8, 7\)"),
    (dict(bias=False), r"parameter arrays"),
    (dict(d_model="8"), r"d_model: expected a positive int"),
    (dict(bias=1), r"bias: expected True or False"),
    (dict(dtype="float16"), r"dtype: expected one of"),
    (dict(eps=0.0), r"eps: expected a finite number > 0"),
    (dict(dropout=1.0), r"dropout"),
    (dict(ffn="os.system"), r"ffn"),
    (dict(n_head=3), r"multiple of n_head"),
    (dict(block_size=None), r"missing fields \['block_size'\]"),
    (dict(extra=1), r"unknown fields \['extra'\]"),
], ids=lambda v: str(v)[:30])
def test_an_edited_config_is_a_checkpoint_error_before_allocation(tmp_path, change, match):
    # Check that a header edited to another (or a huge) architecture is a CheckpointError
    # naming what is wrong, never a MemoryError or a model of the wrong shape.
    src = tmp_path / "g.npz"
    engine.save(src, _gpt())
    bad = _edit_header(src, tmp_path / "bad.npz", **change)
    with pytest.raises(CheckpointError, match=match):
        engine.load_model(bad)

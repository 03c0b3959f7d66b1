"""Sampling (engine/models/sampling.py): ``GPT.generate`` as nanoGPT's (context cropped to
block_size, temperature, top-k), ``engine.generate`` for the GPT and the gMLP LM, and the
argument checks that refuse before anything runs."""
import warnings

import numpy as np
import pytest

import engine
from engine.models import lm
from engine.models.gpt import GPT
from engine.models.sampling import next_ids
from engine.models.tokenizer import ByteTokenizer, Vocabulary

V = Vocabulary("abcdefgh ")


def _gpt(block_size=6, **kw):
    return GPT(len(V), block_size, 1, 2, 8, rng=0, dtype=np.float64, **kw)


def _greedy_reference(g, ids, n):
    """Greedy decoding written out: argmax of the last position over the last block_size."""
    out = ids.copy()
    for _ in range(n):
        logits = g.forward(np.ascontiguousarray(out[:, -g.block_size:]))[:, -1]
        out = np.concatenate([out, logits.argmax(1)[:, None]], axis=1)
    return out


def test_generate_keeps_the_prompt_and_appends_max_new_tokens():
    # Check the shape (B, T + n), the prompt unchanged in front, every id in the vocabulary.
    ids = np.array([[1, 2, 3], [4, 5, 6]])
    out = _gpt().generate(ids, 7, rng=0)
    assert out.shape == (2, 10) and out.dtype == np.int64
    np.testing.assert_array_equal(out[:, :3], ids)
    assert out.min() >= 0 and out.max() < len(V)


def test_top_k_1_is_greedy_and_crops_the_context_to_block_size():
    # Check that top_k=1 picks the argmax each step, with a prompt longer than block_size
    # (the context cropped to the last block_size ids, as nanoGPT).
    g = _gpt()
    ids = np.random.default_rng(1).integers(0, len(V), (2, 9))
    np.testing.assert_array_equal(g.generate(ids, 8, top_k=1, rng=0),
                                  _greedy_reference(g, ids, 8))


def test_tiny_temperature_is_argmax_without_warnings():
    # Check that temperature 5e-324 (the smallest float) samples the argmax and raises no
    # NaN-probability error or numpy warning.
    g = _gpt()
    ids = np.array([[0, 1, 2]])
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        out = g.generate(ids, 6, temperature=5e-324, rng=3)
    np.testing.assert_array_equal(out, _greedy_reference(g, ids, 6))


def test_first_token_frequencies_follow_the_tempered_softmax():
    # Check that 20000 first draws follow softmax(logits / 2) of the model's last position
    # (fixed seed; tolerance 5 standard errors).
    g = _gpt()
    ids = np.array([[3, 1]])
    z = g.forward(ids)[0, -1] / 2.0
    p = np.exp(z - z.max())
    p /= p.sum()
    draws = g.generate(np.repeat(ids, 20000, axis=0), 1, temperature=2.0, rng=7)[:, -1]
    freq = np.bincount(draws, minlength=len(V)) / 20000
    np.testing.assert_allclose(freq, p, atol=5 * np.sqrt(p.max() / 20000))


def test_top_k_keeps_only_the_k_largest_with_their_renormalised_weights():
    # Check next_ids: with top_k=2 of logits [0, 1, 2, 3] only ids 2 and 3 are drawn, in
    # proportion e^2 : e^3.
    logits = np.tile([0.0, 1.0, 2.0, 3.0], (20000, 1))
    draws = next_ids(logits, 1.0, 2, np.random.default_rng(0))
    assert set(np.unique(draws)) == {2, 3}
    want = np.exp(3) / (np.exp(2) + np.exp(3))
    assert abs((draws == 3).mean() - want) < 5 * np.sqrt(want * (1 - want) / 20000)


def test_top_k_above_the_vocabulary_keeps_every_token():
    # Check top_k > vocab_size behaves as no top-k (clamped, as nanoGPT's min(top_k, V)).
    g = _gpt()
    ids = np.array([[1, 2]])
    np.testing.assert_array_equal(g.generate(ids, 5, top_k=100, rng=4), g.generate(ids, 5, rng=4))


@pytest.mark.parametrize("training", [True, False])
def test_generate_runs_in_eval_mode_and_restores_the_mode(training):
    # Check that dropout is off while sampling (two runs with one seed agree) and the mode
    # the model had is back afterwards.
    g = _gpt(dropout=0.5)
    g.train(training)
    a = g.generate(np.array([[1, 2]]), 5, rng=2)
    assert g.training is training
    np.testing.assert_array_equal(a, g.generate(np.array([[1, 2]]), 5, rng=2))


@pytest.mark.parametrize("kw, kind, match", [
    (dict(temperature=0.0), ValueError, "temperature"),
    (dict(temperature=-1.0), ValueError, "temperature"),
    (dict(temperature=float("nan")), ValueError, "temperature"),
    (dict(temperature=float("inf")), ValueError, "temperature"),
    (dict(top_k=0), ValueError, "top_k"),
    (dict(top_k=2.0), TypeError, "top_k"),
    (dict(max_new_tokens=-1), ValueError, "max_new_tokens"),
    (dict(ids=np.array([[1, 99]])), ValueError, "ids"),
    (dict(ids=np.zeros((1, 0), np.int64)), ValueError, "ids"),
    (dict(ids=np.array([[0.0]])), TypeError, "ids"),
])
def test_bad_arguments_are_refused_and_change_nothing(kw, kind, match):
    # Check each bad argument names itself and leaves parameters and mode as they were.
    g = _gpt()
    g.train()
    before = g.flat_params().copy()
    args = dict(ids=np.array([[1, 2]]), max_new_tokens=3)
    args.update(kw)
    with pytest.raises(kind, match=match):
        g.generate(args.pop("ids"), args.pop("max_new_tokens"), **args)
    assert g.training
    np.testing.assert_array_equal(g.flat_params(), before)


def test_nan_logits_name_the_model_and_restore_the_mode():
    # Check that a model with a NaN weight is a ValueError naming the model's logits (not
    # numpy's "probabilities contain NaN"), and the training mode comes back.
    g = _gpt()
    g.ln_f.gamma.data[0] = np.nan
    with pytest.raises(ValueError, match="model: its logits are not finite"):
        g.generate(np.array([[1]]), 2, rng=0)
    assert g.training


# ----------------------------------------------------------------------------- engine.generate
def _gmlp():
    return lm.build_model(len(V), seq_len=6, d_model=8, d_ffn=8, blocks=1, rng=0)


@pytest.mark.parametrize("make", [_gpt, _gmlp], ids=["gpt", "gmlp"])
def test_engine_generate_returns_num_samples_texts(make):
    # Check num_samples texts, each the prompt and max_new_tokens characters, the same for
    # one seed and not all equal across the samples.
    m = make()
    texts = engine.generate(m, V, "abc", 12, num_samples=4, seed=5, temperature=2.0)
    assert len(texts) == 4 and all(t.startswith("abc") and len(t) == 15 for t in texts)
    assert all(set(t) <= set(V.chars) for t in texts) and len(set(texts)) > 1
    assert texts == engine.generate(m, V, "abc", 12, num_samples=4, seed=5, temperature=2.0)


def test_lm_sample_is_engine_generate_with_one_sample():
    # Check that lm.sample and engine.generate draw the same text (one loop for both).
    m = _gmlp()
    a = lm.sample(m, V, "ab", 10, 6, 0.7, np.random.default_rng(3))
    assert a == engine.generate(m, V, "ab", 10, temperature=0.7, seed=3)[0]


def test_byte_tokenizer_generates_text():
    # Check a byte-level GPT: a non-ASCII prompt encodes, 5 new bytes follow it.
    g = GPT(256, 8, 1, 1, 4, rng=0)
    (text,) = engine.generate(g, ByteTokenizer(), "é", 5, seed=0)
    assert text.startswith("é")


@pytest.mark.parametrize("kw, kind, match", [
    (dict(seed=-1), ValueError, "seed"),
    (dict(seed=1.5), TypeError, "seed"),
    (dict(prompt=""), ValueError, "prompt"),
    (dict(prompt="abz!"), ValueError, r"prompt: characters not in the vocabulary: '!z'"),
    (dict(num_samples=0), ValueError, "num_samples"),
    (dict(temperature=5e-324 * 0), ValueError, "temperature"),
    (dict(tokenizer=Vocabulary("abc")), ValueError, "tokenizer: 3 tokens, the model predicts 9"),
    (dict(tokenizer="abc"), TypeError, "tokenizer"),
])
def test_engine_generate_names_each_bad_argument(kw, kind, match):
    # Check each bad argument of engine.generate is refused naming it.
    args = dict(tokenizer=V, prompt="ab")
    args.update(kw)
    with pytest.raises(kind, match=match):
        engine.generate(_gpt(), args.pop("tokenizer"), args.pop("prompt"), 3, **args)


def test_lm_sample_takes_a_byte_tokenizer():
    # Check lm.sample with a ByteTokenizer on a 256-id gMLP LM: the prompt continued, the
    # text engine.generate draws for the same seed.
    m = lm.build_model(256, seq_len=4, d_model=4, d_ffn=4, blocks=1, rng=0)
    text = lm.sample(m, ByteTokenizer(), "ab", 6, 4, 1.0, np.random.default_rng(0))
    assert text.startswith("ab")
    assert text == engine.generate(m, ByteTokenizer(), "ab", 6, seed=0)[0]

"""engine.lm (engine/training/lm.py over engine/models/lm.py), the character language model:
corpus, vocabulary, split, windows, the unigram baseline and bits per character against
formulas written here, a tiny model whose loss falls in a few steps, sampling, and the command
line (`train --model gmlp-lm --task text`)."""
import math

import numpy as np
import pytest
from probes import check_text_run

from engine.training import lm
from engine.cli import main

TINY = dict(seq_len=16, d_model=16, d_ffn=32, blocks=2, batch_size=16, epochs=3, lr=1e-2,
            warmup=5, sample_length=25, block=512)


def test_corpus_is_pythons_own_help_text():
    # Check that the corpus is pydoc_data.topics' texts in sorted topic order (shipped with
    # CPython: nothing to download) and has enough text to train on.
    from pydoc_data.topics import topics
    text = lm.corpus()
    first = sorted(topics)[0]
    assert text.startswith(topics[first]) and len(text) > 100_000
    assert len(text) == sum(len(v) for v in topics.values()) + len(topics) - 1


def test_vocabulary_round_trip_and_unknown_characters():
    # Check sorted distinct characters as ids, encode/decode round trip, and that a character
    # outside the vocabulary is a ValueError naming it.
    v = lm.Vocabulary("hello world")
    assert v.chars == " dehlorw" and len(v) == 8
    ids = v.encode("world hello")
    assert ids.dtype == np.int64 and list(ids[:2]) == [7, 5]
    assert v.decode(ids) == "world hello"
    with pytest.raises(ValueError, match="'xz'"):
        v.encode("zoo x")


def test_split_holds_out_every_tenth_block():
    # Check that blocks 9, 19, ... (of 4096 ids) are held out, the rest kept in order.
    ids = np.arange(100_000)  # blocks 0..24, the last one partial
    train, held = lm.split(ids, 0.1)
    expect_held = np.concatenate([np.arange(9 * 4096, 10 * 4096),
                                  np.arange(19 * 4096, 20 * 4096)])
    np.testing.assert_array_equal(held, expect_held)
    np.testing.assert_array_equal(np.sort(np.concatenate([train, held])), ids)
    assert np.all(np.diff(train) > 0)


def test_windows_are_the_next_characters():
    # Check non-overlapping windows X and their targets Y = X shifted by one character.
    ids = np.arange(20)
    X, Y = lm.windows(ids, 6)
    np.testing.assert_array_equal(X, [[0, 1, 2, 3, 4, 5], [6, 7, 8, 9, 10, 11],
                                      [12, 13, 14, 15, 16, 17]])
    np.testing.assert_array_equal(Y, X + 1)


def test_unigram_baseline_is_the_smoothed_frequency_cross_entropy():
    # Check the baseline against the formula: -mean log2((count + 1) / (n + V)).
    train, held = np.array([0, 0, 0, 1]), np.array([0, 1, 2])
    p = np.array([4, 2, 1]) / 7
    expect = -(math.log2(p[0]) + math.log2(p[1]) + math.log2(p[2])) / 3
    assert lm.unigram_bits(train, held, 3) == pytest.approx(expect, rel=1e-12)


def test_uniform_logits_cost_log2_vocabulary_bits():
    # Check bits_per_char: a model whose output layer is zero predicts uniformly, which costs
    # exactly log2(V) bits per character.
    m = lm.build_model(7, seq_len=8, d_model=8, d_ffn=8, blocks=1, dtype=np.float64, rng=0)
    head = m[len(m) - 1]
    head.W.data[...] = 0.0
    X = np.random.default_rng(0).integers(0, 7, (5, 8))
    assert lm.bits_per_char(m, X, np.roll(X, 1)) == pytest.approx(math.log2(7), rel=1e-12)


def test_tiny_model_learns_and_samples():
    # Check that a tiny model's training loss falls over a few epochs on 12k characters of the
    # corpus, that the sample is the prompt plus sample_length characters of the vocabulary,
    # and that the same seed gives the same sample.
    text = lm.corpus()[:12_000]
    cfg = lm.LMConfig(**TINY)
    r = lm.train(cfg, progress=False, text=text)
    assert r.history.loss[-1] < r.history.loss[0] - 0.5
    assert r.held_bits < math.log2(len(r.vocab))
    assert r.sample.startswith(cfg.prompt) and len(r.sample) == len(cfg.prompt) + 25
    assert set(r.sample) <= set(r.vocab.chars)
    again = lm.sample(r.model, r.vocab, cfg.prompt, 25, cfg.seq_len, cfg.temperature,
                      np.random.default_rng(cfg.seed))
    assert again == r.sample


def test_sample_rejects_bad_prompts():
    # Check that an empty prompt or one with unknown characters is a ValueError.
    v = lm.Vocabulary("abc ")
    m = lm.build_model(len(v), seq_len=4, d_model=4, d_ffn=4, blocks=1, rng=0)
    with pytest.raises(ValueError, match="prompt"):
        lm.sample(m, v, "", 3, 4)
    with pytest.raises(ValueError, match="'z'"):
        lm.sample(m, v, "abz", 3, 4)


def test_cli_options_given_equal_to_the_generic_defaults_still_count(monkeypatch):
    # Check that an option on the command line is used even when its value equals the
    # generic CLI's default (--epochs 1000, --warmup 0): the language model re-reads argv.
    class Stop(Exception):
        pass

    def capture(config, **_):  # stands in for lm.setup: keep the config, train nothing
        seen["config"] = config
        raise Stop

    seen = {}
    monkeypatch.setattr(lm, "setup", capture)
    with pytest.raises(Stop):
        main(["train", "--model", "gmlp-lm", "--epochs", "1000", "--warmup", "0",
              "--lr", "0.001"])
    c = seen["config"]
    assert (c.epochs, c.warmup, c.lr, c.d_ffn) == (1000, 0, 0.001, lm.LMConfig().d_ffn)


def test_cli_runs_the_language_model(capsys):
    # Check `train --model gmlp-lm --task text` end to end with no training epochs: it
    # prints the corpus, the held-out bits per character next to the unigram baseline and a
    # sample, and reloads its checkpoint to the same held-out loss.
    code = main(["train", "--model", "gmlp-lm", "--task", "text", "--d-hidden", "8",
                 "--d-ff", "8", "--epochs", "0", "--prompt", "for ", "--sample-length", "12"])
    out = capsys.readouterr().out
    check_text_run(code, out)
    assert "bits/char" in out


@pytest.mark.parametrize("argv,msg", [
    (["--task", "text", "--model", "mlp"], "gmlp-lm"),
    (["--model", "gmlp-lm", "--hidden", "3,4"], "unrecognized arguments: --hidden"),
    (["--model", "gmlp-lm", "--d-ff", "7", "--epochs", "0"], "--d-ff: expected an even"),
    (["--model", "gmlp-lm", "--prompt", "\u20ac", "--epochs", "0", "--d-hidden", "4",
      "--d-ff", "4"], "not in the vocabulary"),
    (["--model", "mlp", "--sample-length", "5"], "only with the language models"),
])
def test_cli_rejects_what_the_language_model_cannot_do(argv, msg, capsys):
    # Check exit status 2 and a message for another model on the text task, an option the
    # language model does not read, an odd d_ffn, a prompt character the corpus does not
    # have, and a sampling option given to another model.
    assert main(["train", *argv]) == 2
    assert msg in capsys.readouterr().err

"""`train --model gpt|gmlp-lm --text FILE`: your own text, the tokenizers, nanoGPT's options by
name, a --config recipe, the checkpoint's tokenizer entry, and the usage errors (exit 2,
nothing written)."""
import json

import numpy as np
import pytest
from probes import capture_config

from engine.cli import main
from engine.training import gpt_lm, lm
from engine.models.tokenizer import tokenizer_from_meta
from engine.training import checkpoint

TINY = ["--n-embd", "8", "--d-ff", "16", "--n-layer", "1", "--n-head", "2", "--block-size", "8",
        "--batch-size", "4", "--sample-length", "5", "--prompt", "ab", "--warmup-iters", "0"]
TEXT = "".join(f"ab{i % 7} cab{i % 5}; " for i in range(400))  # 4,000+ characters


@pytest.fixture
def text_file(tmp_path):
    p = tmp_path / "input.txt"
    p.write_text(TEXT, encoding="utf-8")
    return p


def _run(capsys, *argv):
    code = main(["train", *argv])
    out = capsys.readouterr()
    return code, out.out, out.err


def test_gpt_trains_on_a_text_file_and_the_banner_states_the_split(capsys, text_file, tmp_path):
    # Check --text FILE --max-iters: the banner names the file, its size, the split, the
    # tokenizer and the vocabulary, and the run reloads its checkpoint to the same loss.
    code, out, err = _run(capsys, "--model", "gpt", "--text", str(text_file), *TINY,
                          "--max-iters", "4", "--eval-iters", "2")
    assert code == 0, err
    assert f"text      {text_file}: {len(TEXT):,} bytes, {len(TEXT):,} characters" in out
    n_vocab = len(set(TEXT))
    assert f"char tokenizer, vocabulary {n_vocab}" in out
    assert "held-out characters (every 10th block of" in out
    assert "4 steps of 4 random windows of 8" in out and "(identical)" in out


def test_the_checkpoint_stores_the_tokenizer_and_config(capsys, text_file, tmp_path):
    # Check the saved metadata: tokenizer_meta's entry (rebuilt to the text's characters),
    # the older vocab key, and the config with the run's settings.
    ck = tmp_path / "m.npz"
    code, _, err = _run(capsys, "--model", "gpt", "--text", str(text_file), *TINY,
                        "--epochs", "1", "--save", str(ck))
    assert code == 0, err
    meta = checkpoint.read_header(ck)["metadata"]
    tok = tokenizer_from_meta(meta["tokenizer"])
    assert tok.chars == "".join(sorted(set(TEXT))) == meta["vocab"]
    assert meta["config"]["seq_len"] == 8 and meta["config"]["tokenizer"] == "char"


def test_byte_tokenizer_trains_on_a_binary_file(capsys, tmp_path):
    # Check --tokenizer byte reads a file that is not UTF-8, with 256 ids, and the checkpoint
    # says so (no vocab key).
    p = tmp_path / "data.bin"
    p.write_bytes(bytes(np.random.default_rng(0).integers(0, 256, 3000, dtype=np.uint8)))
    ck = tmp_path / "b.npz"
    code, out, err = _run(capsys, "--model", "gmlp-lm", "--text", str(p), "--tokenizer", "byte",
                          "--n-embd", "8", "--d-ff", "8", "--n-layer", "1", "--block-size", "8",
                          "--batch-size", "8", "--epochs", "1", "--warmup", "0",
                          "--sample-length", "3", "--prompt", "a", "--save", str(ck))
    assert code == 0, err
    assert "byte tokenizer, vocabulary 256" in out and "bits/byte" in out
    meta = checkpoint.read_header(ck)["metadata"]
    assert meta["tokenizer"] == {"kind": "byte"} and "vocab" not in meta


@pytest.mark.parametrize("make,msg", [
    (lambda d: d / "missing.txt", "No such file"),
    (lambda d: d, "is a directory"),
    (lambda d: (d / "e.txt").write_text("") and None or d / "e.txt", "the file is empty"),
    (lambda d: (d / "b.bin").write_bytes(b"abc\xff" * 50) and None or d / "b.bin",
     "--tokenizer byte"),
    (lambda d: (d / "s.txt").write_text("abcab" * 6) and None or d / "s.txt",
     "held-out split, fewer than one window of block_size + 1"),
])
def test_bad_text_files_are_one_line_errors_and_write_nothing(capsys, tmp_path, make, msg):
    # Check a missing file, a directory, an empty file, a binary file with the char tokenizer
    # and a text too short for the split: exit 2, one line `error: --text ...`, no checkpoint.
    path = make(tmp_path)
    ck = tmp_path / "never.npz"
    code, out, err = _run(capsys, "--model", "gpt", "--text", str(path), *TINY,
                          "--save", str(ck))
    assert code == 2 and out == ""
    assert err.startswith("error: ") and msg in err and len(err.strip().splitlines()) == 1
    assert str(path) in err or "text:" in err
    assert not ck.exists()


def test_nanogpt_options_reach_the_gpt_config(monkeypatch):
    # Check every nanoGPT-named option lands in GPTConfig under its field.
    c = capture_config(monkeypatch, gpt_lm, [
        "--model", "gpt", "--n_layer", "3", "--n-head", "2", "--n-embd", "32",
        "--block_size", "16", "--batch_size", "12", "--dropout", "0.1", "--no-bias",
        "--max-iters", "100", "--lr", "1e-3", "--min-lr", "1e-4", "--warmup-iters", "10",
        "--lr-decay-iters", "90", "--weight_decay", "0.2", "--beta1", "0.8",
        "--beta2", "0.95", "--grad-clip", "1.0", "--eval-interval", "20",
        "--eval-iters", "5", "--log-interval", "7", "--seed", "3", "--tokenizer", "byte"])
    assert (c.n_layer, c.n_head, c.d_model, c.seq_len, c.batch_size, c.dropout, c.bias) == \
        (3, 2, 32, 16, 12, 0.1, False)
    assert (c.max_iters, c.lr, c.min_lr, c.warmup, c.lr_decay_iters, c.weight_decay) == \
        (100, 1e-3, 1e-4, 10, 90, 0.2)
    assert (c.beta1, c.beta2, c.grad_clip, c.eval_interval, c.eval_iters, c.log_interval,
            c.seed, c.tokenizer) == (0.8, 0.95, 1.0, 20, 5, 7, 3, "byte")


@pytest.mark.parametrize("suffix", [".toml", ".json"])
def test_a_recipe_file_sets_options_and_the_command_line_wins(monkeypatch, tmp_path, suffix):
    # Check a TOML or JSON recipe (keys with _ or -) sets the config, and an option on the
    # command line (here an older spelling of n_layer) overrides the file's.
    recipe = {"n_layer": 4, "n-head": 2, "n_embd": 16, "bias": False, "lr": 0.001,
              "max_iters": 50, "dropout": 0.0}
    p = tmp_path / f"r{suffix}"
    if suffix == ".json":
        p.write_text(json.dumps(recipe))
    else:
        p.write_text("\n".join(f"{k} = {json.dumps(v)}" for k, v in recipe.items()))
    c = capture_config(monkeypatch, gpt_lm, ["--model", "gpt", "--config", str(p),
                                              "--layers", "2"])
    assert (c.n_layer, c.n_head, c.d_model, c.bias, c.lr, c.max_iters) == \
        (2, 2, 16, False, 0.001, 50)


@pytest.mark.parametrize("body,msg", [
    ("n_layers = 4", "unknown key 'n_layers'"),
    ("model = 'gpt'", "unknown key 'model'"),
    ("n_layer = 'four'", "n_layer in r.toml: expected a positive integer"),
    ("bias = 1", "bias in r.toml: expected true or false"),
    ("n_layer = [", "not valid TOML"),
])
def test_bad_recipes_are_usage_errors_naming_the_key_and_file(capsys, tmp_path, body, msg):
    p = tmp_path / "r.toml"
    p.write_text(body)
    code, _, err = _run(capsys, "--model", "gpt", "--config", str(p))
    assert code == 2 and msg in err


def test_a_key_the_model_does_not_read_is_an_error(capsys, tmp_path):
    # Check n_head in a gmlp-lm recipe is refused, naming the key and file.
    p = tmp_path / "r.toml"
    p.write_text("n_head = 4")
    code, _, err = _run(capsys, "--model", "gmlp-lm", "--config", str(p))
    assert code == 2 and "n_head (r.toml)" in err and "not read by --model gmlp-lm" in err


@pytest.mark.parametrize("argv,msg", [
    (["--model", "gpt", "--layers", "2", "--n-layer", "3"], "both set n_layer"),
    (["--model", "gpt", "--max-iters", "10", "--epochs", "2"], "not both"),
    (["--model", "gpt", "--eval-interval", "10"], "only with --max-iters"),
    (["--model", "gmlp-lm", "--n-head", "2"], "not read by --model gmlp-lm"),
    (["--model", "gmlp-lm", "--dropout", "0.1"], "not read by --model gmlp-lm"),
    (["--model", "mlp", "--text", "x.txt"], "only with the language models"),
    (["--model", "mlp", "--max-iters", "3"], "only with the language models"),
    (["--model", "gpt", *TINY, "--max-iters", "5", "--warmup-iters", "5"],
     "--warmup-iters 5: the run has 5 optimizer step(s)"),
    (["--model", "gpt", *TINY, "--max-iters", "9", "--warmup-iters", "4",
      "--lr-decay-iters", "4"], "--lr-decay-iters: expected more than warmup_iters"),
    (["--model", "gpt", "--min-lr", "0.1"], "--min-lr: expected at most lr"),
])
def test_option_errors_exit_2(capsys, argv, msg):
    # Check spellings of one setting given twice, epochs with iterations, an iteration-only
    # option without --max-iters, options a model does not read, a warmup that does not fit
    # (refused, never shortened) and a schedule that cannot run: exit 2 with the reason.
    code, _, err = _run(capsys, *argv)
    assert code == 2 and msg in err, err


def test_gpt_warmup_longer_than_the_run_is_refused_in_python():
    # Check gpt_lm.setup no longer shortens a warmup that does not fit: it raises.
    c = gpt_lm.GPTConfig(seq_len=8, d_model=8, d_ff=8, n_layer=1, n_head=2, batch_size=4,
                         max_iters=5, warmup=5, sample_length=0, prompt="ab")
    with pytest.raises(ValueError, match="warmup 5"):
        gpt_lm.setup(c, text=TEXT)


def test_python_api_trains_a_byte_level_gpt_on_a_str():
    # Check gpt_lm.train(GPTConfig(tokenizer="byte", max_iters=...), text=...) runs, with
    # one History row per eval_interval and bits per byte under log2(256) = 8 bits.
    c = gpt_lm.GPTConfig(seq_len=8, d_model=8, d_ff=16, n_layer=1, n_head=2, batch_size=4,
                         tokenizer="byte", max_iters=6, eval_interval=3, eval_iters=2,
                         warmup=0, sample_length=4, prompt="ab")
    r = gpt_lm.train(c, progress=False, text=TEXT)
    assert len(r.vocab) == 256 and r.history.steps == 6 and len(r.history.val_loss) == 2
    assert r.held_bits < 8.5 and r.sample.startswith("ab")


def test_same_seed_same_weights_through_the_cli(capsys, text_file, tmp_path):
    # Check two iteration-based runs with one seed save identical parameters.
    saved = []
    for k in range(2):
        ck = tmp_path / f"{k}.npz"
        code, _, err = _run(capsys, "--model", "gpt", "--text", str(text_file), *TINY,
                            "--max-iters", "5", "--eval-iters", "1", "--save", str(ck),
                            "--threads", "1")
        assert code == 0, err
        saved.append(np.load(ck))
    params = [k for k in saved[0].files if k.startswith("param")]
    assert params and all(np.array_equal(saved[0][k], saved[1][k]) for k in params)


def test_lm_python_api_max_iters_uses_random_windows():
    # Check lm.setup with max_iters builds a RandomWindows sampler over the training ids (no
    # epoch windows) and a fixed held-out estimate of eval_iters x batch_size windows.
    c = lm.LMConfig(seq_len=8, d_model=8, d_ffn=8, blocks=1, batch_size=4, max_iters=3,
                    eval_iters=2, warmup=0, sample_length=0, prompt="ab")
    s = lm.setup(c, text=TEXT)
    assert s.X is None and s.sampler.block_size == 8 and s.sampler.batch_size == 4
    assert s.Xh.shape == (8, 8) and s.steps == 3

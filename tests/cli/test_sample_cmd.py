"""``blasnet sample``: a GPT or gMLP language model checkpoint rebuilt from the file alone
and sampled as nanoGPT's sample.py (--num-samples, --max-new-tokens, --temperature, --top-k,
--seed); every bad flag or file a one-line error with exit status 2."""
import numpy as np
import pytest

import engine
from engine.cli import main
from engine.models import lm
from engine.models.gpt import GPT
from engine.models.tokenizer import ByteTokenizer, Vocabulary, tokenizer_meta

VOCAB = Vocabulary("abcdefgh ")
SEP = "---------------"


@pytest.fixture(scope="module")
def ckpts(tmp_path_factory):
    d = tmp_path_factory.mktemp("sample")
    gpt = GPT(len(VOCAB), 6, 1, 2, 8, rng=0)
    engine.save(d / "gpt.npz", gpt, tokenizer=tokenizer_meta(VOCAB))
    gmlp = lm.build_model(len(VOCAB), seq_len=6, d_model=8, d_ffn=8, blocks=1, rng=0)
    engine.save(d / "gmlp.npz", gmlp, vocab=VOCAB.chars, config={"temperature": 0.5})
    engine.save(d / "byte.npz", GPT(256, 6, 1, 1, 4, rng=0),
                tokenizer=tokenizer_meta(ByteTokenizer()))
    engine.save(d / "linear.npz", engine.Linear(2, 3, rng=0))
    return d


def _sample(capsys, *args):
    capsys.readouterr()
    try:
        code = main(["sample", *map(str, args)])
    except SystemExit as e:  # argparse's own usage errors
        code = e.code
    out, err = capsys.readouterr()
    return code, out, err


@pytest.mark.parametrize("name", ["gpt.npz", "gmlp.npz"])
def test_samples_are_engine_generates_with_the_flags(ckpts, capsys, name):
    # Check that 3 samples print separated by nanoGPT's dashes and are exactly
    # engine.generate's texts for the same prompt, length, temperature, top-k and seed.
    code, out, _ = _sample(capsys, ckpts / name, "--prompt", "ab", "--num-samples", 3,
                           "--max-new-tokens", 9, "--temperature", 1.5, "--top-k", 4,
                           "--seed", 7)
    assert code == 0
    r = engine.load_model(ckpts / name)
    texts = engine.generate(r.model, r.tokenizer, "ab", 9, num_samples=3, temperature=1.5,
                            top_k=4, seed=7)
    assert out == f"\n{SEP}\n".join(texts) + "\n"
    assert all(len(t) == 11 for t in texts)


def test_length_is_an_alias_of_max_new_tokens(ckpts, capsys):
    # Check that the older --length gives the output of --max-new-tokens.
    a = _sample(capsys, ckpts / "gpt.npz", "--prompt", "a", "--length", 8)
    b = _sample(capsys, ckpts / "gpt.npz", "--prompt", "a", "--max-new-tokens", 8)
    assert a[0] == 0 and a == b and len(a[1]) == 9 + 1  # the text and print's newline


def test_default_temperature_is_the_saved_one(ckpts, capsys):
    # Check that without --temperature the one saved in the metadata's config (0.5) is used.
    code, out, _ = _sample(capsys, ckpts / "gmlp.npz", "--prompt", "a", "--length", 12)
    r = engine.load_model(ckpts / "gmlp.npz")
    assert code == 0
    assert out[:-1] == engine.generate(r.model, r.tokenizer, "a", 12, temperature=0.5,
                                               seed=0)[0]


def test_byte_level_gpt_takes_any_prompt(ckpts, capsys):
    # Check a GPT saved with a byte tokenizer samples from a non-ASCII prompt.
    code, out, _ = _sample(capsys, ckpts / "byte.npz", "--prompt", "été", "--length", 4)
    assert code == 0 and out.startswith("été")


@pytest.mark.parametrize("args, message", [
    (["--top-k", "0"], "error: --top-k: expected an integer >= 1, got 0"),
    (["--temperature", "0"], "error: --temperature: expected a finite number > 0"),
    (["--temperature", "-1"], "error: --temperature: expected a finite number > 0"),
    (["--temperature", "nan"], "error: --temperature: expected a finite number > 0"),
    (["--seed", "-1"], "error: --seed: expected an integer >= 0, got -1"),
    (["--num-samples", "0"], "error: --num-samples: expected an integer >= 1"),
    (["--max-new-tokens", "-1"], "error: --max-new-tokens: expected an integer >= 0"),
    (["--prompt", "abz!"], "error: --prompt: characters not in the vocabulary: '!z'"),
    (["--prompt", ""], "error: --prompt: expected a non-empty str"),
], ids=lambda v: " ".join(v) if isinstance(v, list) else "")
def test_bad_flags_are_one_line_errors_naming_the_flag(ckpts, capsys, args, message):
    # Check exit status 2 and one stderr line that names the flag, nothing on stdout.
    code, out, err = _sample(capsys, ckpts / "gpt.npz", *args)
    assert code == 2 and out == ""
    assert err.startswith(message) and err.count("\n") == 1


@pytest.mark.parametrize("name, message", [
    ("linear.npz", "not a language model checkpoint"),
    ("missing.npz", "missing.npz: No such file or directory"),
])
def test_a_file_that_is_not_an_lm_checkpoint_is_named(ckpts, capsys, name, message):
    # Check a checkpoint without a tokenizer, and a missing file: exit 2, the file named.
    code, out, err = _sample(capsys, ckpts / name)
    assert code == 2 and out == "" and err.count("\n") == 1
    assert message in err and name in err


def test_a_tokenizer_that_does_not_fit_the_model_is_an_error(tmp_path, capsys):
    # Check that a checkpoint whose tokenizer has another size than the model's vocabulary
    # is refused naming the file, not sampled with the wrong characters.
    engine.save(tmp_path / "odd.npz", GPT(5, 4, 1, 1, 4, rng=0),
                tokenizer=tokenizer_meta(VOCAB))
    code, _, err = _sample(capsys, tmp_path / "odd.npz")
    assert code == 2 and "odd.npz" in err and "9 tokens, the model's vocabulary has 5" in err


def test_a_gpt_trained_by_the_cli_samples(tmp_path, capsys):
    # Check train --model gpt --save (its vocab metadata) then sample: the GPT is rebuilt from
    # the file alone and continues the prompt with characters of the corpus.
    ckpt = tmp_path / "gpt.npz"
    assert main(["train", "--model", "gpt", "--task", "text", "--layers", "1", "--heads", "1",
                 "--d-hidden", "8", "--d-ff", "8", "--seq-len", "8", "--epochs", "0",
                 "--save", str(ckpt), "--sample-length", "1"]) == 0
    code, out, _ = _sample(capsys, ckpt, "--prompt", "def ", "--max-new-tokens", 20, "--top-k", 5)
    r = engine.load_model(ckpt)
    assert code == 0 and isinstance(r.model, GPT)
    text = out[:-1]  # print's newline (a sample may end in a newline of its own)
    assert text.startswith("def ") and len(text) == 24 and set(text) <= set(r.tokenizer.chars)

"""The language models' command line turns every user error into one line ``error: ...``
with exit status 2 (never a traceback): bad options found by the setup, a block_size whose
memory cannot fit, and a ValueError/TypeError raised inside ``fit``."""
import pytest

from engine.cli import main
from engine.training import lm

TINY = ["--n-embd", "8", "--n-layer", "1", "--batch-size", "4", "--sample-length", "3",
        "--warmup-iters", "0", "--max-iters", "2", "--eval-iters", "1"]


def _run(capsys, *argv):
    code = main(["train", "--task", "text", *argv])
    out = capsys.readouterr()
    return code, out.out, out.err


def _one_line(err: str) -> str:
    lines = err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: "), err
    return lines[0]


@pytest.mark.parametrize("model", ["gpt", "gmlp-lm"])
def test_empty_prompt_is_a_one_line_error_naming_the_flag(capsys, model):
    # Check that --prompt '' is refused before training: exit 2, one line naming --prompt.
    code, out, err = _run(capsys, "--model", model, *TINY, "--prompt", "")
    assert code == 2 and _one_line(err).startswith("error: --prompt: ") and "got ''" in err


@pytest.mark.parametrize("model", ["gpt", "gmlp-lm"])
@pytest.mark.parametrize("flag", ["--block-size", "--seq-len"])
def test_a_block_size_too_long_for_memory_is_a_one_line_error(capsys, model, flag):
    # Check that --block-size 30000 (attention scores of B x T^2 for the GPT, spatial weights
    # of T^2 per block for the gMLP) is refused up front, naming the flag as given.
    code, out, err = _run(capsys, "--model", model, *TINY, flag, "30000")
    line = _one_line(err)
    assert code == 2 and line.startswith(f"error: {flag}: ") and "bytes" in line


def test_recipe_field_errors_name_the_recipe_key(capsys, tmp_path):
    # Check that a bad value set by a --config recipe is named by its key and file.
    r = tmp_path / "r.toml"
    r.write_text('prompt = ""\n')
    code, out, err = _run(capsys, "--model", "gpt", *TINY, "--config", str(r))
    assert code == 2 and _one_line(err).startswith("error: prompt (r.toml): ")


@pytest.mark.parametrize("exc", [ValueError, TypeError])
def test_an_error_raised_by_fit_is_one_line_exit_2(capsys, monkeypatch, exc):
    # Check that a ValueError/TypeError from inside the training run reaches the user as one
    # line with exit status 2, not as a traceback.
    def broken(*a, **k):
        raise exc("sampler: expected something else")
    monkeypatch.setattr(lm, "fit", broken)
    code, out, err = _run(capsys, "--model", "gpt", *TINY)
    assert code == 2 and _one_line(err) == "error: sampler: expected something else"

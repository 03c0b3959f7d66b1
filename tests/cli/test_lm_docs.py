"""Every command docs/lm.md shows runs as written, at tiny model sizes (the sizes, the run's
length and the thread count are appended: the command line wins over a recipe), and its
nanoGPT-recipe file and Python examples run too."""
import dataclasses
import pathlib
import re
import shlex
import subprocess
import sys

import numpy as np
import pytest

from engine.cli import main
from engine.training import gpt_lm, lm

ROOT = pathlib.Path(__file__).resolve().parents[2]
DOC = ROOT / "docs" / "lm.md"
SIZES = {"gpt": ["--n-layer", "1", "--n-head", "2", "--n-embd", "8", "--d-ff", "16"],
         "gmlp-lm": ["--n-layer", "1", "--n-embd", "8", "--d-ff", "8"]}
ITERATIONS = ["--max-iters", "3", "--eval-iters", "1", "--eval-interval", "3",
              "--warmup-iters", "0", "--lr-decay-iters", "3", "--batch-size", "8"]
EPOCHS = ["--epochs", "1", "--warmup-iters", "0", "--batch-size", "256"]


def _blocks() -> list:
    """``[(language, [lines])]`` of the doc's fenced blocks."""
    out, lang, lines = [], None, []
    for line in DOC.read_text().splitlines():
        if line.startswith("```"):
            if lang is None:
                lang, lines = line[3:].strip(), []
            else:
                out.append((lang, lines))
                lang = None
        elif lang is not None:
            lines.append(line)
    return out


COMMAND = re.compile(r"(blasnet (train|sample)|python -m engine|python -c|mpiexec) ")


def _commands() -> list:
    """The command lines of the doc's shell blocks (```sh, or plain ``` ones, whose other
    lines are program output)."""
    return [ln for lang, lines in _blocks() if lang in ("sh", "") for ln in lines
            if COMMAND.match(ln)]


def test_every_command_is_in_a_shell_block():
    # Check no command hides in a Python or TOML block, which this test does not run as one.
    stray = [ln for lang, lines in _blocks() if lang not in ("sh", "") for ln in lines
             if COMMAND.match(ln)]
    assert not stray
    assert any("--text input.txt" in c for c in _commands())


def _tiny(argv: list) -> list:
    model = argv[argv.index("--model") + 1]
    mode = ITERATIONS if "--config" in argv or "--max-iters" in argv else EPOCHS
    return [*argv, *SIZES[model], "--block-size", "16", *mode, "--sample-length", "5",
            "--threads", "1"]


def _write_recipes(where: pathlib.Path) -> list:
    names = []
    for lang, lines in _blocks():
        if lang == "toml":
            name = re.match(r"# (\S+\.toml):", lines[0]).group(1)
            (where / name).write_text("\n".join(lines) + "\n")
            names.append(name)
    return names


def test_the_docs_commands_run(tmp_path, monkeypatch, capsys):
    # Check each shell command of docs/lm.md in one directory: first the one that writes the
    # corpus to input.txt (the doc's "to try the commands here"; then cut to 60,000
    # characters, to keep the test short), then in order the GPT and gmlp-lm runs on it and on
    # the built-in corpus (cut to the same 60,000 characters), and the nanoGPT recipe file.
    monkeypatch.chdir(tmp_path)
    head = lm.corpus()[:60_000]
    assert _write_recipes(tmp_path) == ["nanogpt-cpu.toml"]
    ran = 0
    for line in sorted(_commands(), key=lambda ln: not ln.startswith("python -c")):
        argv = shlex.split(line, comments=True)
        if argv[0] == "mpiexec":  # tests/models/test_gpt_lm.py runs the GPT under mpiexec
            continue
        if argv[:2] == ["python", "-c"]:
            assert argv[3] == ">"
            with open(argv[4], "w") as f:
                subprocess.run([sys.executable, "-c", argv[2]], stdout=f, check=True,
                               cwd=tmp_path, env={"PYTHONPATH": str(ROOT), "PATH": "/usr/bin"})
            text = (tmp_path / argv[4]).read_text()
            assert text == lm.corpus()
            (tmp_path / argv[4]).write_text(head)
            monkeypatch.setattr(lm, "corpus", lambda: head)
            continue
        rest = argv[3:] if argv[:3] == ["python", "-m", "engine"] else argv[1:]
        assert argv[0] in ("blasnet", "python"), line
        if rest[0] == "sample" and not (tmp_path / rest[1]).exists():  # a checkpoint to read
            assert main(_tiny(["train", "--model", "gmlp-lm", "--task", "text", "--save",
                               rest[1]])) == 0
        code = main(rest if rest[0] == "sample" else _tiny(rest))
        out = capsys.readouterr()
        assert code == 0, (line, out.err)
        ran += 1
    assert ran >= 4


def test_the_recipe_file_is_nanogpts_cpu_recipe(tmp_path):
    # Check the doc's recipe holds nanoGPT's CPU values (its README's command line on top of
    # config/train_shakespeare_char.py), as the doc says.
    import tomllib
    _write_recipes(tmp_path)
    r = tomllib.loads((tmp_path / "nanogpt-cpu.toml").read_text())
    assert r == {"n_layer": 4, "n_head": 4, "n_embd": 128, "block_size": 64, "batch_size": 12,
                 "dropout": 0.0, "bias": False, "max_iters": 2000, "lr_decay_iters": 2000,
                 "lr": 1e-3, "min_lr": 1e-4, "warmup_iters": 100, "weight_decay": 0.1,
                 "beta2": 0.99, "grad_clip": 1.0, "eval_interval": 250, "eval_iters": 20,
                 "log_interval": 100}


def _python_blocks() -> list:
    """The Python examples of the doc's first part (the later ones train at full size)."""
    blocks = ["\n".join(lines) for lang, lines in _blocks() if lang == "python"]
    return [b for b in blocks if "gpt_lm" in b or "RandomWindows" in b]


def test_the_python_gpt_example_runs(tmp_path, monkeypatch):
    # Check the GPTConfig example (its fields, train(path=)) at tiny sizes: train is wrapped
    # to shrink the config the example builds.
    monkeypatch.chdir(tmp_path)
    (tmp_path / "input.txt").write_text(lm.corpus()[:30_000])
    train, ran = gpt_lm.train, []

    def tiny(c, **kw):
        ran.append(c)
        c = dataclasses.replace(c, n_layer=1, n_head=2, d_model=8, d_ff=16, seq_len=16,
                                max_iters=4, lr_decay_iters=4, warmup=0, eval_interval=2,
                                eval_iters=1, sample_length=5)
        return train(c, progress=False, **kw)
    monkeypatch.setattr(gpt_lm, "train", tiny)
    example = next(b for b in _python_blocks() if "gpt_lm.train" in b)
    exec(compile(example, "docs/lm.md", "exec"), {})
    assert ran and ran[0].max_iters == 2000 and ran[0].bias is False


def test_the_python_fit_example_runs(capsys):
    # Check the fit(sampler=...) example with a tiny model and data in its namespace.
    from engine import Embedding, Linear, Sequential
    rng = np.random.default_rng(0)
    ids = rng.integers(0, 7, 2000)
    model = Sequential(Embedding(7, 8, rng=rng), Linear(8, 7, rng=rng))
    Xh, Yh = lm.windows(ids[:300], 64)
    example = next(b for b in _python_blocks() if "RandomWindows" in b)
    ns = {"model": model, "train_ids": ids, "Xh": Xh, "Yh": Yh}
    exec(compile(example, "docs/lm.md", "exec"), ns)
    assert "step 2000/2000" in capsys.readouterr().out

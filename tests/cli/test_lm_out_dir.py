"""`train --model gpt --max-iters N --out-dir DIR` (nanoGPT's out_dir): DIR/ckpt.npz holds the
model of the best held-out estimate so far, DIR/last.npz the latest; both resume the run and
load for sampling."""
import re

import numpy as np
import pytest

import engine
from engine.cli import main
from engine.training import checkpoint
from support.lm_runs import OPTIONS, TEXT, params

RUN = ["train", *OPTIONS, "--sample-length", "5", "--threads", "1", "--text", "in.txt"]


@pytest.fixture
def run(tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "in.txt").write_text(TEXT)
    assert main([*RUN, "--out-dir", "out", "--save", "end.npz"]) == 0
    out = capsys.readouterr().out
    return tmp_path, [float(v) for v in re.findall(r"val_loss (\d+\.\d+)", out)]


def test_ckpt_is_the_estimate_with_the_lowest_logged_validation_loss(run):
    # Check that out/ckpt.npz is the model of the lowest logged held-out loss (not the last
    # one here), and out/last.npz that of the final estimate.
    tmp, logged = run
    assert len(logged) == 6 and int(np.argmin(logged)) not in (5,)
    best = checkpoint.read_header(tmp / "out" / "ckpt.npz")["metadata"]
    assert best["epoch"] == int(np.argmin(logged)) + 1
    assert round(best["val_loss"], 5) == pytest.approx(min(logged), abs=1e-5)
    last = checkpoint.read_header(tmp / "out" / "last.npz")["metadata"]
    assert last["epoch"] == 6 and last["steps"] == 30
    a, b = params(tmp / "out" / "ckpt.npz"), params(tmp / "out" / "last.npz")
    assert any(not np.array_equal(a[k], b[k]) for k in a)
    end = params(tmp / "end.npz")
    assert all(np.array_equal(end[k], b[k]) for k in b)


def test_ckpt_loads_with_its_tokenizer_and_samples(run, capsys):
    # Check that load_model rebuilds the GPT and its tokenizer from out/ckpt.npz, and that
    # `blasnet sample` continues a prompt from it.
    tmp, _ = run
    r = engine.load_model(tmp / "out" / "ckpt.npz")
    assert type(r.model).__name__ == "GPT" and r.tokenizer.chars == "".join(sorted(set(TEXT)))
    assert main(["sample", str(tmp / "out" / "ckpt.npz"), "--prompt", "ab",
                 "--max-new-tokens", "6", "--seed", "1"]) == 0
    assert capsys.readouterr().out.startswith("ab")


def test_resume_from_ckpt_continues_to_the_uninterrupted_run(run, monkeypatch, capsys):
    # Check that --resume out/ckpt.npz continues the run from its estimate and ends with the
    # parameters of the uninterrupted run, bit for bit (one thread).
    tmp, logged = run
    assert main([*RUN, "--resume", "out/ckpt.npz", "--save", "again.npz"]) == 0
    out = capsys.readouterr().out
    k = int(np.argmin(logged)) + 1
    assert f"step {5 * k + 5}/30" in out and f"step {5 * k}/30" not in out
    a, b = params(tmp / "again.npz"), params(tmp / "end.npz")
    assert all(np.array_equal(a[k], b[k]) for k in a)


def test_out_dir_that_is_a_file_is_a_usage_error(tmp_path, monkeypatch, capsys):
    # Check that an --out-dir that cannot be made is one line naming it, exit 2.
    monkeypatch.chdir(tmp_path)
    (tmp_path / "in.txt").write_text(TEXT)
    (tmp_path / "f").write_text("x")
    assert main([*RUN, "--out-dir", "f"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: --out-dir f: ") and len(err.strip().splitlines()) == 1

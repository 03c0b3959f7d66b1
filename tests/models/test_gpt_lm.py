"""The GPT character language model and its command line (`train --model gpt --task text`):
the report, sampling, the checkpoint round trip, usage errors, and under mpiexec -n 2 the
same parameters as one process (float64)."""
import importlib.util
import os
import shutil
import subprocess
import sys

import numpy as np
import pytest
from probes import capture_config, check_text_run

from engine.cli import main
from engine.training import gpt_lm, lm

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
SMALL = ["--d-hidden", "16", "--d-ff", "32", "--layers", "1", "--heads", "2"]


def test_cli_runs_the_gpt(capsys):
    # Check `train --model gpt --task text` with no training epochs: the report has the
    # corpus, held-out bits/char next to the unigram baseline, a sample from the prompt, and
    # a checkpoint that reloads to the same held-out loss.
    code = main(["train", "--model", "gpt", "--task", "text", *SMALL, "--epochs", "0",
                 "--prompt", "for ", "--sample-length", "12"])
    out = capsys.readouterr().out
    check_text_run(code, out)
    assert "1 layers, 2 heads, d_model 16" in out


def test_options_reach_the_config(monkeypatch):
    # Check that every GPT option on the command line lands in GPTConfig.
    c = capture_config(monkeypatch, gpt_lm, [
        "--model", "gpt", "--task", "text", "--layers", "3", "--heads", "8", "--seq-len", "32",
        "--d-hidden", "64", "--d-ff", "96", "--epochs", "1000", "--warmup", "0", "--lr", "0.001"])
    assert (c.n_layer, c.n_head, c.seq_len, c.d_model, c.d_ff, c.epochs, c.warmup, c.lr) == \
        (3, 8, 32, 64, 96, 1000, 0, 0.001)


@pytest.mark.parametrize("argv,msg", [
    (["--model", "gpt", "--d-hidden", "16", "--heads", "3", "--epochs", "0"],
     "multiple of n_heads = 3"),
    (["--model", "gpt", "--hidden", "3,4"], "unrecognized arguments: --hidden"),
    (["--model", "mlp", "--layers", "2"], "only with the language models"),
    (["--model", "gpt", "--prompt", "\u20ac", "--epochs", "0", *SMALL], "not in the vocabulary"),
])
def test_usage_errors(argv, msg, capsys):
    # Check exit status 2 and a message naming the problem.
    assert main(["train", *argv]) == 2
    assert msg in capsys.readouterr().err


@pytest.mark.slow
def test_a_few_hundred_steps_beat_the_unigram_baseline():
    # Check that a small GPT trained briefly (200 steps) on a slice of the corpus gets well
    # below the unigram baseline on held-out text (it uses context).
    c = gpt_lm.GPTConfig(seq_len=32, d_model=32, d_ff=64, n_layer=1, n_head=2, batch_size=16,
                         epochs=3, lr=3e-3, warmup=10, sample_length=0, block=512)
    r = gpt_lm.train(c, progress=False, text=lm.corpus()[:40_000])
    assert r.held_bits < r.unigram_bits - 0.25


MPIEXEC = (shutil.which("mpiexec", path=os.path.dirname(sys.executable))
           or shutil.which("mpiexec"))
HAVE_MPI = importlib.util.find_spec("mpi4py") is not None and MPIEXEC is not None


@pytest.mark.slow
@pytest.mark.skipif(not HAVE_MPI, reason="the optional extra 'mpi' is not installed")
def test_two_mpi_ranks_train_the_same_gpt_as_one_process(tmp_path):
    # Check that `mpiexec -n 2 ... train --model gpt` (data parallel over the global batch)
    # ends with the parameters one process reaches, in float64.
    args = ["-m", "engine", "train", "--model", "gpt", "--task", "text", "--dtype", "float64",
            "--d-hidden", "8", "--d-ff", "16", "--layers", "1", "--heads", "2", "--seq-len",
            "64", "--batch-size", "512", "--epochs", "1", "--warmup", "2",
            "--sample-length", "0", "--threads", "1"]
    env = dict(os.environ, PYTHONPATH=ROOT)
    env.pop("BLASNET_NUM_THREADS", None)
    one, two = tmp_path / "one.npz", tmp_path / "two.npz"
    for cmd, path in (([sys.executable], one), ([MPIEXEC, "-n", "2", sys.executable], two)):
        proc = subprocess.run([*cmd, *args, "--save", str(path)], cwd=ROOT, env=env,
                              capture_output=True, text=True, timeout=300)
        assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
    assert "2 MPI ranks" in proc.stdout
    a, b = np.load(one), np.load(two)
    params = [k for k in a.files if k.startswith("param")]
    assert params and sorted(params) == sorted(k for k in b.files if k.startswith("param"))
    for k in params:
        np.testing.assert_allclose(b[k], a[k], rtol=1e-9, atol=1e-12, err_msg=k)

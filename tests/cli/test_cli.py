"""``python -m engine``: train (a few epochs), info and --help, each in a subprocess."""
import os
import re
import subprocess
import sys

import numpy as np
import pytest

import engine
from engine import GMLP, AdamW, load

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def _run(*args, threads="1", check=True):
    env = dict(os.environ, BLASNET_NUM_THREADS=threads)
    proc = subprocess.run([sys.executable, "-m", "engine", *args], cwd=ROOT, env=env,
                          capture_output=True, text=True, timeout=120)
    if check:
        assert proc.returncode == 0, proc.stderr
    return proc


def test_train_regression_prints_figures_and_saves_a_checkpoint(tmp_path):
    # Check that a short gMLP run prints the loss lines, R^2 and MAE for the 4 outputs, the
    # time and samples/s, and a reloaded loss equal to the trained one; and that --save
    # writes a checkpoint that loads into a GMLP of the same sizes with its optimizer.
    path = tmp_path / "run.npz"
    out = _run("train", "--epochs", "20", "--samples", "128", "--d-hidden", "16", "--d-ff",
               "32", "--lr", "3e-3", "--seed", "4", "--save", str(path)).stdout
    assert "gmlp 16 -> 16 -> 32 -> 4" in out
    assert len(re.findall(r"^epoch +\d+/20 +loss ", out, re.M)) == 10
    rows = re.findall(r"^y(\d) .* (-?\d+\.\d+) +(\d+\.\d+) +(-?\d+\.\d+)$", out, re.M)
    assert [r[0] for r in rows] == ["0", "1", "2", "3"]
    assert "samples/s" in out
    final = re.search(r"final loss (\S+)", out).group(1)
    reloaded = re.search(r"reloaded into a fresh model: loss (\S+) \(identical", out)
    assert reloaded is not None and reloaded.group(1) == final
    m = GMLP(16, 16, 32, 4, rng=0)
    opt = AdamW(m.parameters())
    meta = load(path, m, opt)
    assert meta["task"] == "regression" and meta["epochs"] == 20 and meta["seed"] == 4
    assert opt.steps == 20 and opt.param_groups[0]["lr"] == 3e-3


def test_train_xor_with_mlp_and_sgd_reports_accuracy():
    # Check the classification path: an MLP on XOR with SGD prints the accuracy.
    out = _run("train", "--task", "xor", "--model", "mlp", "--hidden", "8", "--epochs", "300",
               "--optimizer", "sgd", "--lr", "0.5", "--momentum", "0.9", "--dtype",
               "float64").stdout
    assert "SGD(lr=0.5, momentum=0.9" in out
    assert re.search(r"accuracy +1\.0000 on the training set", out)


@pytest.mark.parametrize("model", ["ffn", "sublayer"])
def test_train_other_models(model):
    # Check that the ffn and sublayer models train on the spiral task for a few epochs.
    out = _run("train", "--model", model, "--task", "spiral", "--samples", "64", "--epochs",
               "3", "--d-hidden", "8", "--d-ff", "16", "--batch-size", "16").stdout
    assert f"{model} 2 -> 8 -> [{model} d_ff 16] -> 2" in out
    assert "accuracy" in out and "batches of 16" in out


def test_train_bad_hyperparameter_is_a_clear_error():
    # Check that a negative learning rate stops with an error naming lr (no traceback).
    proc = _run("train", "--epochs", "1", "--lr", "-1", check=False)
    assert proc.returncode != 0
    assert "lr" in proc.stderr and "Traceback" not in proc.stderr


def test_info_prints_versions_libraries_and_threads():
    # Check that info prints numpy/scipy versions, each BLAS library with its thread count
    # (1 here, from BLASNET_NUM_THREADS), and the environment variables.
    out = _run("info").stdout
    assert f"numpy          {np.__version__}" in out
    assert re.search(r"^scipy +\d", out, re.M) and re.search(r"^threadpoolctl +\d", out, re.M)
    libs = re.findall(r"^  blas .* threads (\d+) ", out, re.M)
    assert libs and all(n == "1" for n in libs)
    assert "BLASNET_NUM_THREADS=1" in out and "OPENBLAS_NUM_THREADS=" in out


def test_help_documents_every_option():
    # Check that --help names both commands and train --help documents each promised option.
    top = _run("--help").stdout
    assert "train" in top and "info" in top
    text = _run("train", "--help").stdout
    for opt in ("--model", "--d-hidden", "--d-ff", "--hidden", "--activation", "--task",
                "--samples", "--epochs", "--batch-size", "--optimizer", "--lr",
                "--weight-decay", "--momentum", "--dtype", "--threads", "--seed", "--save"):
        assert re.search(rf"^\s+{opt}\b.*\S", text, re.M), opt
    for choice in ("gmlp", "ffn", "sublayer", "mlp", "regression", "spiral", "xor"):
        assert choice in text
    assert "default: 1000" in text  # epochs default shown


def test_main_in_process_matches_module():
    # Check that engine.cli.main is what `python -m engine` runs (argparse errors exit 2).
    from engine.cli import main
    with pytest.raises(SystemExit) as err:
        main(["train", "--model", "transformer"])
    assert err.value.code == 2
    assert engine.cli.build_parser().parse_args(["train"]).epochs == 1000

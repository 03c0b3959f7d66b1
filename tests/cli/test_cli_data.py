"""``python -m engine train`` with your own data (--data), schedules, early stopping, history,
plot and output-path checks; run in-process through engine.cli.main (same code as the
module; test_cli.py and test_packaging.py run the real command)."""
import csv
import math
import re

import numpy as np
import pytest

import kernels
from engine import MLP, data, load
from engine.cli import main


@pytest.fixture(autouse=True)
def one_thread():
    with kernels.num_threads(1):
        yield


@pytest.fixture
def blobs_csv(tmp_path):
    """Three Gaussian blobs in 2-D with an unused third column on another scale; labels 0..2."""
    rng = np.random.default_rng(0)
    centres = np.array([[0.0, 0.0], [3.0, 0.0], [0.0, 3.0]])
    y = np.arange(150) % 3
    X = centres[y] + 0.5 * rng.standard_normal((150, 2))
    p = tmp_path / "blobs.csv"
    with open(p, "w", newline="") as f:
        w = csv.writer(f)
        w.writerow(["u", "v", "noise", "kind"])
        for (a, b), k in zip(X, y):
            w.writerow([f"{a:.6f}", f"{b:.6f}", f"{1000 * rng.standard_normal():.3f}", int(k)])
    return p


def _run(capsys, *argv):
    code = main(["train", *map(str, argv)])
    out, err = capsys.readouterr()
    return code, out, err


def _history(path):
    with open(path, newline="") as f:
        rows = list(csv.DictReader(f))
    return {k: [float(r[k]) for r in rows] for k in rows[0]}


# ----------------------------------------------------------------------------- own data
def test_csv_classification_end_to_end(blobs_csv, tmp_path, capsys):
    # Check a CSV run: the task is inferred from the integer column, 20% go to validation,
    # the inputs are standardised, the history, plot and checkpoint are written, and the
    # checkpoint holds the columns, the class count and the standardizer.
    pytest.importorskip("matplotlib")
    code, out, err = _run(capsys, "--data", blobs_csv, "--y-cols", "kind", "--x-cols", "u", "v",
                          "--model", "mlp", "--hidden", "16", "--epochs", "40", "--batch-size",
                          "32", "--lr", "0.01", "--standardize", "--history",
                          tmp_path / "h.csv", "--plot", tmp_path / "h.png", "--save",
                          tmp_path / "m.npz")
    assert code == 0, err
    assert "inferred: integer targets are class labels; 3 classes" in out
    assert "120 for training, 30 for validation" in out
    acc = [float(a) for a in
           re.search(r"accuracy +(\S+) on the training set, (\S+) on the "
                                   r"validation set", out).groups()]
    assert min(acc) > 0.9
    h = _history(tmp_path / "h.csv")
    assert h["epoch"] == list(range(1, 41)) and len(h["val_loss"]) == 40
    assert (tmp_path / "h.png").stat().st_size > 1000
    m = MLP([2, 16, 3], ["relu", None])
    meta = load(tmp_path / "m.npz", m)
    assert meta["x_cols"] == ["u", "v"] and meta["y_cols"] == ["kind"] and meta["classes"] == 3
    s = data.Standardizer.from_state_dict(meta["standardizer"])
    X, _ = data.load(blobs_csv, x=["u", "v"], y="kind")
    (Xt, _), _ = data.train_val_split(X, np.zeros(len(X)), 0.2, rng=0)
    np.testing.assert_allclose(s.mean, Xt.astype(np.float64).mean(axis=0), rtol=1e-12)


def test_npz_regression_saves_safetensors(tmp_path, capsys):
    # Check an .npz run given --task regression on integer-valued targets (not labels), with
    # no validation split, saved as .safetensors (parameters only) that reloads.
    pytest.importorskip("safetensors")
    rng = np.random.default_rng(1)
    X = rng.uniform(-1, 1, (64, 3))
    np.savez(tmp_path / "d.npz", inputs=X, counts=np.round(5 * X[:, 0] + 5).astype(np.int64))
    code, out, err = _run(capsys, "--data", tmp_path / "d.npz", "--x-cols", "inputs",
                          "--y-cols", "counts", "--task", "regression", "--val-fraction", "0",
                          "--model", "mlp", "--hidden", "8", "--epochs", "5", "--save",
                          tmp_path / "m.safetensors")
    assert code == 0, err
    assert "(regression, given; 1 output(s))" in out and "validation" not in out
    assert "reloaded into a fresh model" in out and "identical" in out
    load(tmp_path / "m.safetensors", MLP([3, 8, 1], ["relu", None]))


# ----------------------------------------------------------------------------- checked first
@pytest.mark.parametrize("extra, match", [
    (["--y-cols", "kinds"], r"--data: y: .*no column\(s\) \['kinds'\]"),
    ([], "--y-cols: name the target"),
    (["--y-cols", "kind", "--save", "{tmp}/missing/m.npz"], "--save: the directory"),
    (["--y-cols", "kind", "--save", "{tmp}/m.pt"], "--save: expected a file name ending"),
    (["--y-cols", "kind", "--history", "{tmp}/h.txt"], "--history: expected"),
    (["--y-cols", "kind", "--plot", "{tmp}/" + "p" * 252 + ".png"], "--plot: the file name"),
    (["--y-cols", "kind", "--val-fraction", "0", "--early-stopping", "3"], "--early-stopping"),
    (["--y-cols", "kind", "--task", "spiral"], "--task spiral: with --data"),
    (["--y-cols", "u", "--task", "classification"], "integer class labels"),
    (["--y-cols", "kind", "--schedule", "cosine", "--warmup", "1000"], "--warmup 1000"),
])
def test_bad_options_fail_before_the_first_step(blobs_csv, tmp_path, capsys, extra, match):
    # Check each bad file, column or output path: exit status 2, one "error:" line naming the
    # flag, no epoch printed and no file written.
    argv = [a.replace("{tmp}", str(tmp_path)) for a in extra]
    code, out, err = _run(capsys, "--data", blobs_csv, "--epochs", "2", *argv)
    assert code == 2
    assert err.startswith("error: ") and err.count("\n") == 1
    assert re.search(match, err), err
    assert "epoch" not in out
    assert sorted(p.name for p in tmp_path.iterdir()) == ["blobs.csv"]


def test_bad_value_in_the_csv_names_line_and_column(tmp_path, capsys):
    # Check that a non-numeric cell stops the run before training, naming line and column.
    p = tmp_path / "d.csv"
    p.write_text("a,b,y\n1,2,0\n3,four,1\n")
    code, out, err = _run(capsys, "--data", p, "--y-cols", "y")
    assert code == 2 and "line 3, column 2 ('b')" in err and "epoch" not in out


# ----------------------------------------------------------------------------- schedules
def _lr_column(capsys, tmp_path, *argv):
    """The per-epoch lr of a full-batch sine run (one step per epoch: epoch k runs step k-1)."""
    code, out, err = _run(capsys, "--task", "sine", "--samples", "32", "--model", "mlp",
                          "--hidden", "4", "--lr", "0.01", "--history", tmp_path / "h.csv",
                          *argv)
    assert code == 0, err
    return np.array(_history(tmp_path / "h.csv")["lr"]), out


def test_cli_warmup_then_cosine(tmp_path, capsys):
    # Check --schedule cosine --warmup 4 over 12 steps: 0.01 (k+1)/5 for k < 4, then
    # 0.01 (1 + cos(pi (k-4)/8)) / 2.
    lr, out = _lr_column(capsys, tmp_path, "--epochs", "12", "--schedule", "cosine", "--warmup", "4")
    want = [0.01 * (k + 1) / 5 if k < 4 else 0.01 * (1 + math.cos(math.pi * (k - 4) / 8)) / 2
            for k in range(12)]
    np.testing.assert_allclose(lr, want, rtol=1e-12)
    assert "warmup 4 steps, then cosine to 0 over 8 steps" in out


def test_cli_linear_and_step_schedules(tmp_path, capsys):
    # Check --schedule linear (0.01 (1 - k/10)) and --schedule step (0.01 * 0.5^floor(k/3)).
    lr, _ = _lr_column(capsys, tmp_path, "--epochs", "10", "--schedule", "linear")
    np.testing.assert_allclose(lr, [0.01 * (1 - k / 10) for k in range(10)], rtol=1e-12)
    lr, _ = _lr_column(capsys, tmp_path, "--epochs", "10", "--schedule", "step", "--step-size",
                       "3", "--gamma", "0.5")
    np.testing.assert_allclose(lr, [0.01 * 0.5 ** (k // 3) for k in range(10)], rtol=1e-12)


def test_cli_early_stopping_and_clipping(tmp_path, capsys):
    # Check --early-stopping on a synthetic task with a validation split: a too-large lr makes
    # the validation loss stop improving, the run stops before its 200 epochs, and the report
    # names the best epoch; the history has one row per epoch run.
    code, out, err = _run(capsys, "--task", "sine", "--samples", "64", "--model", "mlp",
                          "--hidden", "32,32", "--epochs", "200", "--lr", "0.3",
                          "--val-fraction", "0.25", "--early-stopping", "2",
                          "--clip-grad-norm", "1.0", "--history", tmp_path / "h.csv")
    assert code == 0, err
    m = re.search(r"early stop after epoch (\d+): best val_loss \S+ at epoch (\d+)", out)
    assert m, out
    stopped, best = int(m.group(1)), int(m.group(2))
    assert stopped < 200 and stopped == best + 2
    assert len(_history(tmp_path / "h.csv")["epoch"]) == stopped
    assert "grad norm clipped at 1" in out


def test_plot_without_matplotlib_fails_before_training(tmp_path, capsys, monkeypatch):
    # Check that --plot without matplotlib is a one-line error naming the extra, exit 2,
    # before any epoch.
    import sys
    for name in [m for m in sys.modules if m == "matplotlib" or m.startswith("matplotlib.")]:
        monkeypatch.delitem(sys.modules, name)
    monkeypatch.setitem(sys.modules, "matplotlib", None)
    code, out, err = _run(capsys, "--task", "xor", "--model", "mlp", "--epochs", "3", "--plot",
                          tmp_path / "p.png")
    assert code == 2 and "blasnet[plot]" in err and "epoch" not in out


def test_help_documents_the_new_options(capsys):
    # Check that train --help describes each option this file exercises.
    with pytest.raises(SystemExit):
        main(["train", "--help"])
    text = capsys.readouterr().out
    for opt in ("--data", "--x-cols", "--y-cols", "--val-fraction", "--standardize",
                "--schedule", "--warmup", "--step-size", "--gamma", "--clip-grad-norm",
                "--early-stopping", "--history", "--plot", "--save"):
        assert re.search(rf"^\s+{opt}\b.*\S", text, re.M), opt
    for choice in ("constant", "cosine", "linear", "step", "classification"):
        assert choice in text

"""The tabular ``train`` command's flags: a size or block flag the chosen ``--model`` does not
read is refused (exit 2 naming flag and model), ``--threads`` above the usable cores warns in
one line, and ``--resume`` refuses data other than the run's (a moved file is fine)."""
import shutil

import numpy as np
import pytest

import kernels
from engine.cli import app
from engine.cli.app import main

QUICK = ["train", "--task", "sine", "--samples", "32", "--epochs", "1", "--quiet"]

UNREAD = [("mlp", ["--d-hidden", "8"]), ("mlp", ["--d-ff", "8"]), ("mlp", ["--norm", "pre"]),
          ("gmlp", ["--hidden", "8"]), ("gmlp", ["--activation", "gelu"]),
          ("gmlp", ["--norm", "pre"]), ("ffn", ["--hidden", "8"]), ("ffn", ["--norm", "pre"]),
          ("sublayer", ["--hidden", "8", "8"])]


@pytest.mark.parametrize("model, flag", UNREAD)
def test_a_flag_the_model_does_not_read_is_refused(capsys, model, flag):
    # Check exit 2 and one line naming the flag and the model, before any training.
    capsys.readouterr()
    assert main(QUICK + ["--model", model] + flag) == 2
    err = capsys.readouterr().err
    assert err.startswith(f"error: {flag[0]}: --model {model} does not read it")
    assert err.count("\n") == 1


READ = [("mlp", ["--hidden", "4", "--activation", "tanh"]),
        ("gmlp", ["--d-hidden", "4", "--d-ff", "8"]),
        ("ffn", ["--d-hidden", "4", "--d-ff", "8", "--activation", "gelu"]),
        ("sublayer", ["--d-hidden", "4", "--d-ff", "8", "--norm", "pre"])]


@pytest.mark.parametrize("model, flags", READ)
def test_the_flags_a_model_reads_are_accepted(model, flags):
    # Check that the rule refuses only what the model ignores.
    assert main(QUICK + ["--model", model] + flags) == 0


def test_more_threads_than_cores_is_a_one_line_warning(capsys, monkeypatch):
    # Check the warning (cores counted as 2 here), and that the run still goes ahead.
    monkeypatch.setattr(app, "usable_cores", lambda: 2)
    before = kernels.get_num_threads()
    try:
        capsys.readouterr()
        assert main(QUICK + ["--model", "mlp", "--hidden", "4", "--threads", "3"]) == 0
        err = capsys.readouterr().err
        assert err.startswith("warning: --threads 3 is more than the 2 core(s)")
        assert err.count("\n") == 1
    finally:
        kernels.set_num_threads(before)


def _csv(path, seed):
    rng = np.random.default_rng(seed)
    X = rng.standard_normal((40, 2))
    with open(path, "w") as f:
        f.write("a,b,y\n")
        for row in X:
            f.write(f"{float(row[0])!r},{float(row[1])!r},{float(row.sum())!r}\n")


@pytest.fixture
def run_on_a(tmp_path):
    _csv(tmp_path / "a.csv", 0)
    _csv(tmp_path / "b.csv", 1)
    ck = tmp_path / "r.npz"
    assert main(["train", "--data", str(tmp_path / "a.csv"), "--y-cols", "y", "--model",
                 "mlp", "--hidden", "4", "--epochs", "2", "--save", str(ck), "--quiet"]) == 0
    return tmp_path, ck


def test_resume_on_other_data_is_refused_naming_data(run_on_a, capsys):
    # Check that a file with other samples is exit 2 naming --data (nothing trained).
    d, ck = run_on_a
    capsys.readouterr()
    assert main(["train", "--resume", str(ck), "--data", str(d / "b.csv"), "--epochs", "3",
                 "--quiet"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: --data: ") and "other samples" in err
    assert err.count("\n") == 1


def test_resume_on_the_same_data_moved_continues(run_on_a):
    # Check that the rule lets a moved copy of the run's file through.
    d, ck = run_on_a
    shutil.move(d / "a.csv", d / "moved.csv")
    assert main(["train", "--resume", str(ck), "--data", str(d / "moved.csv"), "--epochs",
                 "3", "--quiet"]) == 0


def test_resume_of_a_synthetic_run_with_data_is_refused(tmp_path, capsys):
    # Check that --data cannot replace the synthetic task a run trained on.
    _csv(tmp_path / "a.csv", 0)
    ck = tmp_path / "s.npz"
    assert main(QUICK + ["--model", "mlp", "--hidden", "4", "--save", str(ck)]) == 0
    capsys.readouterr()
    assert main(["train", "--resume", str(ck), "--data", str(tmp_path / "a.csv"), "--epochs",
                 "2", "--quiet"]) == 2
    assert capsys.readouterr().err.startswith("error: --data: the checkpoint's run trained")


def test_resume_of_a_regression_saved_with_unscaled_targets_is_refused(run_on_a, tmp_path,
                                                                       capsys):
    # Check that a checkpoint without the target scaling (an older train's) is not resumed
    # on standardised targets.
    import json
    d, ck = run_on_a
    with np.load(ck) as z:
        arrays = {k: z[k] for k in z.files}
    h = json.loads(str(arrays["__header__"][()]))
    del h["metadata"]["target_standardizer"]
    arrays["__header__"] = np.array(json.dumps(h))
    np.savez(tmp_path / "old.npz", **arrays)
    capsys.readouterr()
    assert main(["train", "--resume", str(tmp_path / "old.npz"), "--epochs", "3",
                 "--quiet"]) == 2
    assert "unscaled targets" in capsys.readouterr().err

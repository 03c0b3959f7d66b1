"""``train --resume`` and preemption: SIGTERM or Ctrl-C during ``train`` (real signals, in a
subprocess) writes a resumable checkpoint and the history so far, exits 143 or 130 and
prints the command that resumes the run; that command finishes it with the weights of an
uninterrupted run (one thread). Options given again with another value are usage errors."""
import os
import shlex
import signal
import subprocess
import sys

import numpy as np
import pytest

import engine
from engine.cli.app import main

RUN = ["train", "--task", "sine", "--model", "mlp", "--hidden", "16", "--samples", "256",
       "--batch-size", "32", "--threads", "1"]


def _start(cwd, *extra):
    return subprocess.Popen([sys.executable, "-m", "engine", *RUN, *extra], cwd=cwd,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def _interrupt_after_progress(proc, sig) -> tuple:
    """Send ``sig`` once the run printed a progress line; ``(exit status, stdout, stderr)``."""
    seen = []
    for line in proc.stdout:
        seen.append(line)
        if line.startswith("epoch "):
            break
    proc.send_signal(sig)
    out, err = proc.communicate(timeout=120)
    return proc.returncode, "".join(seen) + out, err


def _weights(path) -> list:
    return [p.data for p in engine.load_model(path).model.parameters()]


def _losses(path) -> list:
    rows = open(path).read().splitlines()
    col = rows[0].split(",").index("loss")
    return [r.split(",")[col] for r in rows[1:]]


@pytest.mark.slow
def test_sigterm_writes_a_checkpoint_that_resumes_to_an_uninterrupted_runs_weights(tmp_path):
    # Check SIGTERM mid-run: exit 143, <save>.interrupted.npz and --history written, the
    # printed command resumes it (possibly mid-epoch) to final weights and a history equal
    # to an uninterrupted run's, bit for bit.
    epochs = ["--epochs", "1500", "--log-every", "10"]
    proc = _start(tmp_path, *epochs, "--save", "m.npz", "--history", "m.csv")
    code, out, err = _interrupt_after_progress(proc, signal.SIGTERM)
    assert code == 143, err
    assert "Traceback" not in err and "exception's .history" not in err
    assert (tmp_path / "m.interrupted.npz").exists() and not (tmp_path / "m.npz").exists()
    done = len(_losses(tmp_path / "m.csv"))
    assert 0 < done < 1500  # the signal fell during training
    command = err.split("resume with:\n")[1].strip()
    r = subprocess.run(shlex.split(command), cwd=tmp_path, capture_output=True, text=True,
                       timeout=300)
    assert r.returncode == 0, r.stderr
    ref = subprocess.run([sys.executable, "-m", "engine", *RUN, *epochs, "--save", "ref.npz",
                          "--history", "ref.csv", "--quiet"], cwd=tmp_path, timeout=300)
    assert ref.returncode == 0
    for a, b in zip(_weights(tmp_path / "m.npz"), _weights(tmp_path / "ref.npz")):
        np.testing.assert_array_equal(a, b)
    assert _losses(tmp_path / "m.csv") == _losses(tmp_path / "ref.csv")


@pytest.mark.slow
def test_ctrl_c_without_save_writes_a_checkpoint_in_the_current_directory(tmp_path):
    # Check SIGINT: exit 130, a checkpoint at the printed path holding the run's options and
    # training state, and --history (JSON) with the completed epochs.
    proc = _start(tmp_path, "--epochs", "5000", "--log-every", "10", "--history", "h.json")
    code, out, err = _interrupt_after_progress(proc, signal.SIGINT)
    assert code == 130, err
    path = tmp_path / "blasnet-mlp-sine.interrupted.npz"
    assert f"checkpoint {path.name}" in err and "--resume" in err
    header = engine.training.checkpoint.read_header(path)
    assert header["metadata"]["cli"]["hidden"] == [16] and header["training"] is not None
    assert header["metadata"]["interrupted"] == "SIGINT"
    import json
    assert json.loads((tmp_path / "h.json").read_text())["epochs"] >= 1


def _train(capsys, *argv):
    code = main(list(argv))
    captured = capsys.readouterr()
    return code, captured.out, captured.err


@pytest.fixture
def finished(tmp_path, capsys):
    """A 3-epoch run saved to run.npz."""
    code, _, err = _train(capsys, *RUN, "--epochs", "3", "--save", str(tmp_path / "run.npz"),
                          "--quiet")
    assert code == 0, err
    return tmp_path / "run.npz"


@pytest.mark.parametrize("flag, value", [("--model", "gmlp"), ("--hidden", "8"),
                                         ("--lr", "0.01"), ("--seed", "3")])
def test_resume_with_a_conflicting_option_is_a_usage_error_naming_it(finished, capsys, flag,
                                                                      value):
    # Check the checkpoint's run wins: an option given again with another value exits 2
    # with a message naming the flag, before anything is trained.
    code, out, err = _train(capsys, "train", "--resume", str(finished), flag, value,
                            "--epochs", "6")
    assert code == 2 and f"error: {flag}:" in err and "Traceback" not in err
    assert out == ""


def test_resume_continues_a_finished_run_to_a_new_total(finished, tmp_path, capsys):
    # Check that 3 epochs, then --resume to 6 (constant rate: the total may grow), equal a
    # 6-epoch run: same weights, and a history of the 6 epochs.
    code, out, err = _train(capsys, "train", "--resume", str(finished), "--epochs", "6",
                            "--save", str(tmp_path / "more.npz"), "--history",
                            str(tmp_path / "more.csv"))
    assert code == 0, err
    assert "epoch 6/6" in out and "resume" in out
    code, _, err = _train(capsys, *RUN, "--epochs", "6", "--save", str(tmp_path / "six.npz"),
                          "--history", str(tmp_path / "six.csv"), "--quiet")
    assert code == 0, err
    for a, b in zip(_weights(tmp_path / "more.npz"), _weights(tmp_path / "six.npz")):
        np.testing.assert_array_equal(a, b)
    assert _losses(tmp_path / "more.csv") == _losses(tmp_path / "six.csv")


def test_resume_refuses_what_it_cannot_continue(finished, tmp_path, capsys):
    # Check exit 2 with a message for: a checkpoint without a run in it, a total that is
    # already reached, and a changed --epochs under a schedule planned for the run's length.
    m = engine.MLP([1, 16, 1], rng=0)
    engine.save(tmp_path / "plain.npz", m)
    code, _, err = _train(capsys, "train", "--resume", str(tmp_path / "plain.npz"))
    assert code == 2 and "not a resumable checkpoint" in err
    code, _, err = _train(capsys, "train", "--resume", str(finished), "--epochs", "3")
    assert code == 2 and "epochs=3" in err and "completed 3" in err
    code, _, err = _train(capsys, *RUN, "--epochs", "3", "--schedule", "cosine", "--save",
                          str(tmp_path / "cos.npz"), "--quiet")
    assert code == 0, err
    code, _, err = _train(capsys, "train", "--resume", str(tmp_path / "cos.npz"),
                          "--epochs", "5")
    assert code == 2 and "--epochs:" in err and "planned for its 3 epochs" in err
    assert not os.path.exists(tmp_path / "cos.interrupted.npz")

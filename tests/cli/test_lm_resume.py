"""A language model run stopped by Ctrl-C writes a resumable checkpoint (exit 130) and prints
the command that resumes it; `train ... --resume CKPT` finishes the run with the weights of
an uninterrupted one, bit for bit (one thread)."""
import numpy as np
import pytest

from engine.cli import main
from engine.training import checkpoint
from engine.training.samplers import RandomWindows

TEXT = "".join(f"ab{i % 7} cab{i % 5}; " for i in range(400))
RUN = ["train", "--model", "gpt", "--n-embd", "8", "--d-ff", "16", "--n-layer", "1",
       "--n-head", "2", "--block-size", "8", "--sample-length", "5", "--prompt", "ab",
       "--batch-size", "4", "--max-iters", "12", "--eval-interval", "5", "--eval-iters", "2",
       "--warmup-iters", "2", "--dropout", "0.1", "--threads", "1"]


def _params(path) -> dict:
    z = np.load(path)
    return {k: z[k] for k in z.files if k.startswith("param")}


def _stop_at_draw(monkeypatch, k: int) -> None:
    """Ctrl-C arrives as the k-th training batch is drawn (the step before it is whole)."""
    draw, calls = RandomWindows.sample, []

    def sample(self):
        if self.batch_size == 4:
            calls.append(1)
            if len(calls) == k:
                raise KeyboardInterrupt
        return draw(self)
    monkeypatch.setattr(RandomWindows, "sample", sample)


def _count_draws(monkeypatch) -> list:
    draw, calls = RandomWindows.sample, []

    def sample(self):
        if self.batch_size == 4:
            calls.append(1)
        return draw(self)
    monkeypatch.setattr(RandomWindows, "sample", sample)
    return calls


def test_ctrl_c_then_resume_equals_the_uninterrupted_run(tmp_path, monkeypatch, capsys):
    # Check Ctrl-C at step 8 of 12 (inside the second period, dropout on): exit 130, a
    # checkpoint next to --save, a printed resume command; that command (run here through
    # main) ends with the parameters and held-out loss of an uninterrupted run.
    monkeypatch.chdir(tmp_path)
    (tmp_path / "in.txt").write_text(TEXT)
    run = [*RUN, "--text", "in.txt"]
    assert main([*run, "--save", "ref.npz"]) == 0
    ref_out = capsys.readouterr().out
    with monkeypatch.context() as m:
        _stop_at_draw(m, 8)
        assert main([*run, "--save", "m.npz"]) == 130
    err = capsys.readouterr().err
    assert "training interrupted (SIGINT)" in err and "resume with:" in err
    assert (tmp_path / "m.interrupted.npz").exists() and not (tmp_path / "m.npz").exists()
    assert checkpoint.read_header(tmp_path / "m.interrupted.npz")["training"] is not None
    with monkeypatch.context() as m:
        drawn = _count_draws(m)
        assert main([*run, "--save", "m.npz", "--resume", "m.interrupted.npz"]) == 0
    assert len(drawn) == 12 - 7  # it continued after step 7: it did not start over
    out = capsys.readouterr().out
    a, b = _params(tmp_path / "m.npz"), _params(tmp_path / "ref.npz")
    assert a.keys() == b.keys() and all(np.array_equal(a[k], b[k]) for k in a)
    held = [ln for ln in out.splitlines() if ln.startswith("held-out")]
    assert held and held == [ln for ln in ref_out.splitlines() if ln.startswith("held-out")]


def test_resume_with_other_settings_is_refused(tmp_path, monkeypatch, capsys):
    # Check --resume with a setting changed (here --lr) exits 2 naming the setting.
    monkeypatch.chdir(tmp_path)
    (tmp_path / "in.txt").write_text(TEXT)
    run = [*RUN, "--text", "in.txt"]
    with monkeypatch.context() as m:
        _stop_at_draw(m, 3)
        assert main([*run, "--save", "m.npz"]) == 130
    capsys.readouterr()
    assert main([*run, "--lr", "0.01", "--resume", "m.interrupted.npz"]) == 2
    err = capsys.readouterr().err
    assert "--resume: the checkpoint's run has other settings: lr 0.002 (given 0.01)" in err


def test_resume_from_a_file_that_is_no_checkpoint_is_a_usage_error(tmp_path, capsys):
    (tmp_path / "in.txt").write_text(TEXT)
    (tmp_path / "x.npz").write_bytes(b"nope")
    assert main([*RUN, "--text", str(tmp_path / "in.txt"),
                 "--resume", str(tmp_path / "x.npz")]) == 2
    assert capsys.readouterr().err.startswith("error: --resume: ")


@pytest.mark.slow
def test_sigterm_in_an_epoch_run_then_resume_equals_the_uninterrupted_run(tmp_path):
    # Check a real SIGTERM during an epoch-based run (shuffled windows): exit 143, and the
    # printed command (run as printed) ends with an uninterrupted run's parameters.
    import os
    import shlex
    import signal
    import subprocess
    import sys
    root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    env = dict(os.environ, PYTHONPATH=root)
    (tmp_path / "in.txt").write_text(TEXT * 3)
    base = RUN[:RUN.index("--batch-size")]
    run = [sys.executable, "-m", "engine", *base, "--epochs", "30", "--warmup", "3",
           "--batch-size", "32", "--dropout", "0.1", "--text", "in.txt", "--threads", "1"]
    proc = subprocess.Popen([*run, "--save", "m.npz"], cwd=tmp_path, env=env, text=True,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    for line in proc.stdout:
        if line.startswith("epoch "):
            break
    proc.send_signal(signal.SIGTERM)
    out, err = proc.communicate(timeout=300)
    assert proc.returncode == 143, err
    command = err.split("resume with:\n")[1].strip()
    r = subprocess.run(shlex.split(command), cwd=tmp_path, env=env, capture_output=True,
                       text=True, timeout=300)
    assert r.returncode == 0, r.stderr
    ref = subprocess.run([*run, "--save", "ref.npz"], cwd=tmp_path, env=env,
                         capture_output=True, text=True, timeout=300)
    assert ref.returncode == 0, ref.stderr
    a, b = _params(tmp_path / "m.npz"), _params(tmp_path / "ref.npz")
    assert all(np.array_equal(a[k], b[k]) for k in a)


def test_an_interrupted_iteration_run_says_steps_not_epochs(tmp_path, monkeypatch, capsys):
    # Check that Ctrl-C in a --max-iters run reports the step reached and the held-out
    # estimates done (its periods are no epochs).
    monkeypatch.chdir(tmp_path)
    (tmp_path / "in.txt").write_text(TEXT)
    with monkeypatch.context() as m:
        _stop_at_draw(m, 8)
        assert main([*RUN, "--text", "in.txt", "--save", "m.npz"]) == 130
    err = capsys.readouterr().err
    assert "interrupted (SIGINT) after step 7/12; 1 held-out estimate(s) complete" in err
    assert "epoch" not in err.split("resume with:")[0]

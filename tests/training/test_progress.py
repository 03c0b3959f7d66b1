"""fit's progress: on a terminal one line redrawn (``\\r``) within each epoch with the steps
done, the running loss and an ETA, at most ~10 times a second; off a terminal one plain line
per epoch and no per-step work; ``--quiet`` prints none of it."""
import io
import re
import sys

import numpy as np
import pytest

import kernels
from engine import SGD, Linear, MSELoss, fit
from engine.cli import main
from engine.training import progress as progress_module


@pytest.fixture(autouse=True)
def one_thread():
    with kernels.num_threads(1):
        yield


class FakeTTY(io.StringIO):
    def isatty(self):
        return True


class FakeClock:
    """A clock that moves ``tick`` seconds at every reading, and counts its readings."""

    def __init__(self, tick):
        self.t, self.tick, self.reads = 1000.0, tick, 0

    def __call__(self):
        self.reads += 1
        self.t += self.tick
        return self.t


def _fit(monkeypatch, stream, clock, *, n=40, batch_size=2, epochs=2, progress=True):
    monkeypatch.setattr(sys, "stdout", stream)
    monkeypatch.setattr(progress_module, "_clock", clock)
    g = np.random.default_rng(0)
    X, Y = g.standard_normal((n, 3)), g.standard_normal((n, 2))
    lin = Linear(3, 2, dtype=np.float64, rng=0)
    return fit(lin, MSELoss(), SGD(lin.parameters(), lr=0.05), X, Y, epochs=epochs,
               batch_size=batch_size, shuffle=False, progress=progress)


_STEP = re.compile(r"epoch +(\d+)/\d+ +step +(\d+)/(\d+) +loss ([^ ]+) +ETA (\d+:\d\d)")


def _step_draws(out: str) -> list:
    """(epoch, step, steps, loss text, ETA text) of each step redraw in ``out``."""
    return [_STEP.search(chunk).groups() for chunk in out.split("\r") if _STEP.search(chunk)]


def test_a_terminal_gets_one_line_redrawn_with_steps_loss_and_eta(monkeypatch):
    # Check that with a slow clock (every step drawn) each step's redraw shows step i/20, the
    # running loss and an ETA: the last step's running loss is the epoch's loss and its ETA
    # 0:00; only the run's end writes a newline.
    tty = FakeTTY()
    h = _fit(monkeypatch, tty, FakeClock(tick=1.0))
    out = tty.getvalue()
    draws = _step_draws(out)
    assert [(int(e), int(i)) for e, i, *_ in draws] == [(e, i) for e in (1, 2)
                                                        for i in range(1, 21)]
    assert all(s == "20" for _, _, s, _, _ in draws)
    for epoch in (1, 2):
        last = draws[20 * epoch - 1]
        assert last[3] == f"{h.loss[epoch - 1]:.6g}" and last[4] == "0:00"
        assert draws[20 * (epoch - 1)][4] != "0:00"  # time is left after the first step
    assert out.count("\n") == 1 and out.endswith("\n")


def test_the_terminal_line_is_redrawn_at_most_ten_times_a_second(monkeypatch):
    # Check the throttle: 80 steps over 0.8 s of clock give at most ~9 redraws, not 80.
    tty = FakeTTY()
    clock = FakeClock(tick=0.01)
    _fit(monkeypatch, tty, clock)
    draws = _step_draws(tty.getvalue())
    assert 1 <= len(draws) <= (clock.t - 1000.0) / 0.1 + 1


def test_int_progress_on_a_terminal_keeps_its_epoch_lines_and_adds_the_step_line(monkeypatch):
    # Check that progress=k on a terminal prints its permanent line every k epochs (each
    # ending in a newline) with the step line redrawn in between.
    tty = FakeTTY()
    _fit(monkeypatch, tty, FakeClock(tick=1.0), epochs=4, progress=2)
    out = tty.getvalue()
    lines = [ln.split("\r")[-1] for ln in out.split("\n")[:-1]]
    assert [ln.split()[1] for ln in lines] == ["2/4", "4/4"]
    assert "samples/s" in lines[0] and len(_step_draws(out)) == 80


def test_off_a_terminal_exactly_one_line_per_epoch_and_no_step_work(monkeypatch):
    # Check that a stream that is not a terminal gets one plain line per epoch, no carriage
    # return, no step line, and that the clock is not read more with more steps per epoch
    # (nothing runs per step).
    reads = []
    for batch_size in (20, 1):  # 2 or 40 steps per epoch
        plain, clock = io.StringIO(), FakeClock(tick=1.0)
        _fit(monkeypatch, plain, clock, epochs=3, batch_size=batch_size)
        out = plain.getvalue()
        assert "\r" not in out and "step" not in out
        assert [ln.split()[1] for ln in out.splitlines()] == ["1/3", "2/3", "3/3"]
        reads.append(clock.reads)
    assert reads[0] == reads[1]


def test_progress_false_is_silent_on_a_terminal(monkeypatch):
    tty = FakeTTY()
    _fit(monkeypatch, tty, FakeClock(tick=1.0), progress=False)
    assert tty.getvalue() == ""


def test_cli_quiet_prints_no_step_line_on_a_terminal(monkeypatch, tmp_path):
    # Check that --quiet reaches the per-step line too: nothing at all on a terminal.
    tty = FakeTTY()
    monkeypatch.setattr(sys, "stdout", tty)
    monkeypatch.setattr(progress_module, "_clock", FakeClock(tick=1.0))
    assert main(["train", "--samples", "64", "--epochs", "2", "--batch-size", "8",
                 "--quiet"]) == 0
    assert tty.getvalue() == ""
    assert main(["train", "--samples", "64", "--epochs", "2", "--batch-size", "8"]) == 0
    draws = _step_draws(tty.getvalue())  # without it, the step line is there
    assert draws and len(draws) == 2 * int(draws[0][2])


def test_a_run_resumed_mid_epoch_times_its_eta_from_the_steps_it_ran(monkeypatch):
    # Check that the ETA of an epoch entered at step 6 of 10 (a resumed run) divides the
    # elapsed time by the 4 steps this process ran, not by 9.
    tty = FakeTTY()
    monkeypatch.setattr(sys, "stdout", tty)
    clock = FakeClock(tick=0.0)
    monkeypatch.setattr(progress_module, "_clock", clock)
    bar = progress_module.Progress(True, 1, rows=100, batch_size=10)
    for i in range(6, 10):  # steps 6..9, 10 s each
        clock.t += 10.0
        bar.step(1, i, 1.0 * 10 * i)
    *_, loss, eta = _step_draws(tty.getvalue())[-1]
    assert (loss, eta) == ("1", "0:10")  # 40 s for 4 steps: 10 s for the one left

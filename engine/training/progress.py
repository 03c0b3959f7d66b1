"""fit's progress: on a terminal one line redrawn within each epoch (steps done, running loss,
ETA); epoch lines on a terminal or off it; nothing per step off a terminal, except the
``log_every`` lines asked for. An iteration-based run's lines count steps, not epochs."""
from __future__ import annotations

import sys
import time

from .._checks import check_int

__all__ = ["Progress"]

_clock = time.perf_counter  # one name to read the time by (tests give it a fake clock)
_REDRAW_S = 0.1  # a terminal line is redrawn at most ~10 times a second


def _fmt_time(s: float) -> str:
    s = int(round(s))
    return f"{s // 3600}:{s // 60 % 60:02d}:{s % 60:02d}" if s >= 3600 else f"{s // 60}:{s % 60:02d}"


class Progress:
    """``True``: one updating line on a terminal, else a plain line every ~10% of the epochs;
    an int k: a plain line every k epochs (and the last); ``False``: nothing. Writes to stdout.

    On a terminal (``True`` or k), ``step`` redraws the line within the epoch: steps done of
    ``steps``, the running mean loss and the epoch's ETA. ``per_step`` is False off a
    terminal, so the loop calls nothing per step there."""

    def __init__(self, progress, epochs: int, rows: int = 1, batch_size: int = 1,
                 steps: int | None = None):
        if isinstance(progress, bool) or progress is None:
            every = max(1, epochs // 10) if progress else 0
        else:
            every = check_int("progress", progress, 1)
        self.file = sys.stdout
        isatty = getattr(self.file, "isatty", None)
        terminal = bool(progress) and bool(isatty and isatty())
        self.tty = terminal and progress is True  # the epoch line itself is redrawn
        self.every, self.epochs = every, epochs
        self.rows, self.batch_size = rows, batch_size
        self.steps = -(-rows // batch_size)
        self.per_step = terminal and self.steps > 1
        self.width, self.step_width = len(str(epochs)), len(str(self.steps))
        self._last = -float("inf")  # when the line was last drawn
        self._epoch_t0 = _clock() if self.per_step else 0.0
        self._skipped = None  # steps of this epoch before the first one this process ran
        self._open = False
        self.enabled = bool(progress)
        # An iteration-based run (steps): its "epochs" are periods of self.steps steps.
        self.run_steps = steps

    def _where(self, epoch: int, i: int | None = None) -> str:
        """``epoch 3/10`` (and ``step 4/8`` within it), or an iteration-based run's ``step
        k/N``."""
        if self.run_steps is None:
            head = f"epoch {epoch:>{self.width}}/{self.epochs}"
            return head if i is None else f"{head}  step {i:>{self.step_width}}/{self.steps}"
        k = min((epoch - 1) * self.steps + (self.steps if i is None else i), self.run_steps)
        return f"step {k:>{len(str(self.run_steps))}}/{self.run_steps}"

    def log(self, step: int, loss: float, lr, seconds: float) -> None:
        """The line of optimizer step ``step`` (every ``log_every`` steps): the mean training
        loss since the last one, the learning rate and the time per step."""
        if not self.enabled:
            return
        self.close()
        rate = "" if lr is None else f"  lr {lr:.4g}"
        self.file.write(f"iter {step}: loss {loss:.4f}{rate}  {seconds * 1000:.1f} ms/step\n")
        self.file.flush()

    def step(self, epoch: int, i: int, loss_sum: float, seen: int | None = None) -> None:
        """After step ``i`` of ``epoch``: redraw the line (throttled); ``loss_sum`` is the sum
        of the epoch's batch losses weighted by their rows, ``seen`` those rows (default:
        ``i`` batches)."""
        if self._skipped is None:  # a run resumed mid-epoch starts past step 1
            self._skipped = i - 1
        now = _clock()
        if now - self._last < _REDRAW_S:
            return
        self._last = now
        if seen is None:
            seen = min(i * self.batch_size, self.rows)  # rows of the epoch's first i batches
        eta = (now - self._epoch_t0) / (i - self._skipped) * (self.steps - i)
        self._draw(f"{self._where(epoch, i)}  loss {loss_sum / max(seen, 1):.6g}  "
                   f"ETA {_fmt_time(eta)}")

    def _draw(self, line: str) -> None:
        self.file.write("\r" + line + "\x1b[K")
        self.file.flush()
        self._open = True

    def update(self, epoch: int, h, elapsed: float, last: bool = False) -> None:
        """``last``: the run ends after this epoch (a callback stopped it): print it."""
        if self.per_step:
            self._epoch_t0, self._skipped = _clock(), None  # the next epoch starts now
        if not self.every and not self.tty:
            return
        stopped = last and epoch < self.epochs
        last = last or epoch == self.epochs
        if self.tty:
            now = _clock()
            if not last and now - self._last < _REDRAW_S:
                return
            self._last = now
        elif epoch % self.every and not last:
            return
        line = self._epoch_line(epoch, h, elapsed, last, stopped)
        if self.tty:
            self._draw(line)
            if last:
                self.close()
        elif self._open:  # a line every k epochs on a terminal: it replaces the step line
            self._draw(line)
            self.close()
        else:
            self.file.write(line + "\n")
            self.file.flush()

    def _epoch_line(self, epoch: int, h, elapsed: float, last: bool, stopped: bool) -> str:
        parts = [self._where(epoch), f"loss {h.loss[-1]:.6g}"]
        if h.accuracy:
            parts.append(f"acc {h.accuracy[-1]:.4f}")
        if h.val_loss:
            parts.append(f"val_loss {h.val_loss[-1]:.6g}")
        if h.val_accuracy:
            parts.append(f"val_acc {h.val_accuracy[-1]:.4f}")
        rate = h.samples / elapsed if elapsed > 0 else float("inf")
        parts.append(f"{rate:,.0f} samples/s")
        if not last:
            parts.append(f"ETA {_fmt_time(elapsed / epoch * (self.epochs - epoch))}")
        elif stopped:
            parts.append("stopped by a callback")
        return "  ".join(parts)

    def close(self) -> None:
        if self._open:
            self.file.write("\n")
            self.file.flush()
            self._open = False

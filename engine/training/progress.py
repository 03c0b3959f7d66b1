"""fit's progress: on a terminal one line redrawn within each epoch (steps done, running loss,
ETA); epoch lines on a terminal or off it; nothing per step off a terminal."""
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

    def __init__(self, progress, epochs: int, rows: int = 1, batch_size: int = 1):
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

    def step(self, epoch: int, i: int, loss_sum: float) -> None:
        """After step ``i`` of ``epoch``: redraw the line (throttled); ``loss_sum`` is the sum
        of the epoch's batch losses weighted by their rows."""
        if self._skipped is None:  # a run resumed mid-epoch starts past step 1
            self._skipped = i - 1
        now = _clock()
        if now - self._last < _REDRAW_S:
            return
        self._last = now
        seen = min(i * self.batch_size, self.rows)  # rows of the epoch's first i batches
        eta = (now - self._epoch_t0) / (i - self._skipped) * (self.steps - i)
        self._draw(f"epoch {epoch:>{self.width}}/{self.epochs}  step "
                   f"{i:>{self.step_width}}/{self.steps}  loss {loss_sum / seen:.6g}  "
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
        parts = [f"epoch {epoch:>{self.width}}/{self.epochs}", f"loss {h.loss[-1]:.6g}"]
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

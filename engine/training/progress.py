"""fit's progress line: one updating line on a terminal, else a plain line every few epochs."""
from __future__ import annotations

import sys
import time

from .._checks import check_int

__all__ = ["Progress"]


def _fmt_time(s: float) -> str:
    s = int(round(s))
    return f"{s // 3600}:{s // 60 % 60:02d}:{s % 60:02d}" if s >= 3600 else f"{s // 60}:{s % 60:02d}"


class Progress:
    """``True``: one updating line on a terminal, else a plain line every ~10% of the epochs;
    an int k: a plain line every k epochs (and the last); ``False``: nothing. Writes to stdout."""

    def __init__(self, progress, epochs: int):
        if isinstance(progress, bool) or progress is None:
            every = max(1, epochs // 10) if progress else 0
        else:
            every = check_int("progress", progress, 1)
        self.file = sys.stdout
        isatty = getattr(self.file, "isatty", None)
        self.tty = progress is True and bool(isatty and isatty())
        self.every, self.epochs = every, epochs
        self.width = len(str(epochs))
        self._last = 0.0
        self._open = False

    def update(self, epoch: int, h, elapsed: float, last: bool = False) -> None:
        """``last``: the run ends after this epoch (a callback stopped it): print it."""
        if not self.every and not self.tty:
            return
        stopped = last and epoch < self.epochs
        last = last or epoch == self.epochs
        now = time.perf_counter()
        if self.tty:
            if not last and now - self._last < 0.1:  # redraw at most ~10 times a second
                return
        elif epoch % self.every and not last:
            return
        self._last = now
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
        line = "  ".join(parts)
        if self.tty:
            self.file.write("\r" + line + "\x1b[K")
            self._open = True
            if last:
                self.close()
        else:
            self.file.write(line + "\n")
        self.file.flush()

    def close(self) -> None:
        if self._open:
            self.file.write("\n")
            self.file.flush()
            self._open = False

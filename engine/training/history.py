"""What a ``fit`` run reports: the per-epoch ``History`` (saved as CSV or JSON, plotted as a
PNG) and the two ways a run ends early, ``NonFiniteLossError`` and ``TrainingInterrupted``."""
from __future__ import annotations

import csv
import json
import math
import os
from dataclasses import dataclass, field

import numpy as np

__all__ = ["History", "NonFiniteLossError", "TrainingInterrupted"]


class NonFiniteLossError(FloatingPointError):
    """The loss became NaN or infinite; ``epoch`` and ``step`` (both from 1) say where, and
    ``history`` holds the epochs completed before it (set by ``fit``)."""

    def __init__(self, message: str, epoch: int, step: int, loss: float):
        super().__init__(message)
        self.epoch, self.step, self.loss = epoch, step, loss
        self.history = None


class TrainingInterrupted(KeyboardInterrupt):
    """Ctrl-C stopped ``fit``. The model and the optimizer hold the state after the last
    complete optimizer step (``history.steps`` of them; gradients zeroed); ``history`` holds
    the completed epochs; ``epoch`` and ``step`` (from 1) say where it stopped.
    ``save(path, **metadata)`` writes a checkpoint (``.npz``) of the run as it stopped, which
    ``fit(..., resume_from=path)`` continues exactly; call it before training the model
    further."""

    def __init__(self, message: str, history, epoch: int, step: int, run=None):
        super().__init__(message)
        self.history, self.epoch, self.step = history, epoch, step
        self._run = run

    @property
    def resumable(self) -> bool:
        """Whether the run had started (else there is nothing to save)."""
        return self._run is not None

    def save(self, path, **metadata) -> None:
        """Write the interrupted run's checkpoint to ``path``; RuntimeError if it had not
        started."""
        if self._run is None:
            raise RuntimeError("the run was interrupted before it started: there is nothing "
                               "to save")
        self._run.save(path, **metadata)


@dataclass
class History:
    """Per-epoch figures of a ``fit`` run (index i is epoch i + 1; for an iteration-based
    run, ``fit(..., sampler=, steps=, eval_every=k)``, the period of steps ik+1..(i+1)k).

    ``loss``: mean training loss over the epoch's samples, each batch's loss measured before
    its update; ``accuracy``: the same batches' accuracy (classification only, else empty);
    ``val_loss`` / ``val_accuracy``: on the validation set after the epoch, in eval mode;
    ``lr``: the first parameter group's learning rate at the epoch's first step.
    """
    loss: list = field(default_factory=list)
    accuracy: list = field(default_factory=list)
    val_loss: list = field(default_factory=list)
    val_accuracy: list = field(default_factory=list)
    steps: int = 0                 # optimizer steps taken
    samples: int = 0               # training samples processed
    epoch_time: list = field(default_factory=list, compare=False)  # wall seconds per epoch
    lr: list = field(default_factory=list)

    _COLUMNS = ("loss", "accuracy", "val_loss", "val_accuracy", "lr", "epoch_time")

    def __len__(self) -> int:
        return len(self.loss)

    @property
    def history(self) -> dict:
        """``{"loss": [...], "val_loss": [...], ...}``: the per-epoch lists that hold one value
        per epoch, as Keras's ``History.history`` (no "epoch" key, no timings)."""
        cols = self.columns()
        return {k: v for k, v in cols.items() if k not in ("epoch", "epoch_time")}

    def columns(self) -> dict:
        """``{"epoch": [1, 2, ...], "loss": [...], ...}``: the per-epoch lists that hold one
        value per epoch (an empty list, e.g. accuracy in a regression, is left out)."""
        n = len(self.loss)
        out = {"epoch": list(range(1, n + 1))}
        for k in self._COLUMNS:
            v = getattr(self, k)
            if len(v) == n and n:
                out[k] = [float(x) for x in v]
        return out

    def to_csv(self, path) -> None:
        """Write one row per epoch (``epoch,loss,...``; full float precision) to ``path``."""
        cols = self.columns()
        with open(_path(path), "w", newline="") as f:
            w = csv.writer(f)
            w.writerow(list(cols))
            for row in zip(*cols.values()):
                w.writerow([repr(x) if isinstance(x, float) else x for x in row])

    def to_json(self, path) -> None:
        """Write ``{"epochs", "steps", "samples", "seconds", <per-epoch lists>}`` to ``path``
        (non-finite numbers as null)."""
        def clean(v):
            return v if math.isfinite(v) else None
        doc = {"epochs": len(self), "steps": self.steps, "samples": self.samples,
               "seconds": self.seconds}
        doc.update({k: [clean(x) for x in v] if k != "epoch" else v
                    for k, v in self.columns().items()})
        with open(_path(path), "w") as f:
            json.dump(doc, f, indent=1)
            f.write("\n")

    def plot(self, path, title: str | None = None):
        """Save a plot (6.4x4 inches; 640x400 pixels as PNG) of the training loss (and
        validation loss) per epoch to ``path``, in the format its suffix names (``.png``,
        ``.pdf``, ``.svg``, ...; another suffix is a ValueError before anything is drawn), and
        return the matplotlib ``Figure``; the y axis is logarithmic when the plotted losses
        are positive and span more than a decade. Needs matplotlib (the optional extra
        ``plot``: ``pip install 'blasnet[plot]'``)."""
        if not self.loss:
            raise ValueError("History.plot: the history is empty (no epoch to plot)")
        Figure, FigureCanvasAgg, MaxNLocator = _matplotlib()
        fmt = _plot_format(path, FigureCanvasAgg)
        epochs = np.arange(1, len(self.loss) + 1)
        fig = Figure(figsize=(6.4, 4.0), dpi=100)
        FigureCanvasAgg(fig)  # render without pyplot: no GUI backend, no global state
        ax = fig.add_subplot()
        ax.plot(epochs, self.loss, label="loss", color="tab:blue")
        values = list(self.loss)
        if len(self.val_loss) == len(self.loss):
            ax.plot(epochs, self.val_loss, label="val_loss", color="tab:orange")
            values += list(self.val_loss)
        finite = [v for v in values if math.isfinite(v)]
        if finite and min(finite) > 0 and max(finite) / min(finite) > 10.0:
            ax.set_yscale("log")
        ax.xaxis.set_major_locator(MaxNLocator(integer=True))
        ax.set_xlabel("epoch")
        ax.set_ylabel("loss")
        ax.set_title(title or f"{len(self.loss)} epochs, {self.steps} steps")
        ax.grid(True, which="both", alpha=0.3)
        ax.legend()
        fig.tight_layout()
        fig.savefig(os.fspath(path), format=fmt)
        return fig

    @property
    def seconds(self) -> float:
        return float(sum(self.epoch_time))

    @property
    def samples_per_second(self) -> float:
        s = self.seconds
        return self.samples / s if s > 0 else float("nan")


# Formats matplotlib writes by itself (pgf needs LaTeX; raw/rgba have no header).
_PLOT_FORMATS = ("png", "pdf", "svg", "svgz", "eps", "ps", "jpg", "jpeg", "tif", "tiff",
                 "webp")


def _path(path) -> str:
    try:
        return os.fspath(path)
    except TypeError:
        raise TypeError(f"path: expected a str or os.PathLike, got {type(path).__name__}") from None


def _plot_format(path, canvas) -> str:
    """The format ``path``'s suffix names, if matplotlib writes it; else ValueError."""
    ext = os.path.splitext(_path(path))[1][1:].lower()
    known = [f for f in _PLOT_FORMATS if f in canvas.get_supported_filetypes()]
    if ext not in known:
        raise ValueError(f"path: expected a file name ending in one of "
                         f"{', '.join('.' + f for f in known)}, got {os.fspath(path)!r}")
    return ext


def _matplotlib():
    """matplotlib's Figure and Agg canvas, or ImportError naming the extra to install."""
    try:
        from matplotlib.backends.backend_agg import FigureCanvasAgg
        from matplotlib.figure import Figure
        from matplotlib.ticker import MaxNLocator
    except ImportError:
        raise ImportError("History.plot needs matplotlib: pip install 'blasnet[plot]'") from None
    return Figure, FigureCanvasAgg, MaxNLocator

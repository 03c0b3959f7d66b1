"""The training loop: ``fit`` (mini-batches, shuffling, validation, progress, a stop on a
non-finite loss, learning-rate schedules, gradient clipping, callbacks), ``evaluate``,
``predict``, the per-epoch ``History`` (saved as CSV or JSON, plotted as a PNG), and the
regression metrics ``r2_score`` / ``mean_absolute_error``.

Mini-batches are gathered into one preallocated buffer (``np.take(..., out=)``), so a steady
epoch allocates no batch-sized arrays; the model's own work buffers do the rest.
"""
from __future__ import annotations

import contextlib
import csv
import json
import math
import numbers
import os
import sys
import time
from dataclasses import dataclass, field

import numpy as np

from ..nn.losses import CrossEntropyLoss, MSELoss
from ..nn.module import Module, describes_input, make_rng
from ..optim.optimizers import Optimizer, check_optimizer_of, defer_keyboard_interrupt
from ..optim.optimizers import clip_grad_norm as _clip_grad_norm

__all__ = ["fit", "evaluate", "predict", "History", "NonFiniteLossError", "TrainingInterrupted",
           "r2_score", "mean_absolute_error"]


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
    the completed epochs; ``epoch`` and ``step`` (from 1) say where it stopped."""

    def __init__(self, message: str, history, epoch: int, step: int):
        super().__init__(message)
        self.history, self.epoch, self.step = history, epoch, step


@dataclass
class History:
    """Per-epoch figures of a ``fit`` run (index i is epoch i + 1).

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


# ----------------------------------------------------------------------------- checks
# fit, evaluate and predict check every argument and the whole data set before they change
# anything (parameters, gradients, optimizer state, the model's mode): a rejected call
# changes nothing. Arrays must be C-contiguous in every mode (nothing is copied silently).
def _check_xy(X, Y, what: str = ""):
    for name, a in ((what + "X", X), (what + "Y", Y)):
        if not isinstance(a, np.ndarray):
            raise TypeError(f"{name}: expected a numpy.ndarray, got {type(a).__name__}")
        if a.ndim == 0:
            raise ValueError(f"{name}: expected an array with a sample axis, got a scalar")
    if X.shape[0] != Y.shape[0]:
        raise ValueError(f"{what}Y: expected {X.shape[0]} samples ({what}X has {X.shape[0]}), "
                         f"got {Y.shape[0]} (shape {Y.shape})")
    if X.shape[0] == 0:
        raise ValueError(f"{what}X: expected at least one sample, got shape {X.shape}")


def _check_int(name: str, v, low: int) -> int:
    if isinstance(v, bool) or not isinstance(v, numbers.Integral) or v < low:
        raise ValueError(f"{name}: expected an integer >= {low}, got {v!r}")
    return int(v)


def _batch_size(batch_size, n: int) -> int:
    if batch_size is None:
        return n
    return min(_check_int("batch_size", batch_size, 1), n)


def _check_model(model) -> None:
    if not isinstance(model, Module):
        raise TypeError(f"model: expected an engine Module (a layer, block or model), got "
                        f"{type(model).__name__}")


def _instance(what: str, v) -> None:
    """A class where an object is expected (``loss=MSELoss``) passes duck-typing checks (its
    methods are attributes) and fails mid-run: TypeError naming ``what`` first."""
    if isinstance(v, type):
        raise TypeError(f"{what}: expected an instance, got the class {v.__name__} (write "
                        f"{v.__name__}(...))")


def _check_loss(loss) -> None:
    _instance("loss", loss)
    if not (callable(getattr(loss, "forward", None)) and callable(getattr(loss, "backward", None))):
        raise TypeError(f"loss: expected a loss with forward(pred, target) and backward() "
                        f"(MSELoss, CrossEntropyLoss), got {type(loss).__name__}")


def _check_c(name: str, a) -> None:
    if not a.flags.c_contiguous:
        raise ValueError(f"{name}: expected a C-contiguous array, got strides {a.strides} for "
                         f"shape {a.shape} (use np.ascontiguousarray; fit, evaluate and "
                         f"predict copy nothing)")


def _check_finite(name: str, a) -> None:
    # min and max propagate NaN: two passes over the data, no temporary arrays.
    if a.size and not (math.isfinite(np.min(a)) and math.isfinite(np.max(a))):
        at = tuple(int(i) for i in np.argwhere(~np.isfinite(a))[0])
        raise ValueError(f"{name}: expected finite values, got {a[at]} at index {at}")


def _check_x(model, X, name: str, finite: bool):
    """Check ``X`` for ``model`` through the module protocol (``check_input``); return the
    model's output shape for it (None: the model does not describe its input)."""
    _check_c(name, X)
    out = model.check_input(X, name) if describes_input(model) else None
    if finite and np.issubdtype(X.dtype, np.floating):
        _check_finite(name, X)
    return out


def _check_target(model, loss, X, Y, out, name: str, finite: bool) -> None:
    """Check ``Y`` for ``loss`` on ``model``'s outputs for ``X`` (of shape ``out``, or None)."""
    _check_c(name, Y)
    known = out is not None
    lead, width = (out[:-1], out[-1]) if known else (X.shape[:-1], None)
    if isinstance(loss, CrossEntropyLoss) and np.issubdtype(Y.dtype, np.integer):
        if known and Y.shape != lead:
            raise ValueError(f"{name}: expected integer labels of shape {lead} (the model's "
                             f"output for X without its class axis), got {Y.shape}")
        lo, hi = (int(np.min(Y)), int(np.max(Y))) if Y.size else (0, -1)
        if lo < 0 or (known and hi >= width):
            classes = f"[0, {width})" if known else "[0, classes)"
            raise ValueError(f"{name}: expected labels in {classes} (the model has "
                             f"{width if known else 'its'} outputs), got values in [{lo}, {hi}]")
        return
    if isinstance(loss, (CrossEntropyLoss, MSELoss)):
        if not np.issubdtype(Y.dtype, np.floating):
            what = "integer labels or probabilities" if isinstance(loss, CrossEntropyLoss) \
                else "targets"
            raise TypeError(f"{name}: expected {what} of a float dtype, got dtype {Y.dtype}")
        if known:
            if Y.dtype != model.dtype:
                raise TypeError(f"{name}: expected dtype {model.dtype} (the model's), got "
                                f"{Y.dtype} (convert with .astype(np.{model.dtype}))")
            if Y.shape != (*lead, width):
                raise ValueError(f"{name}: expected shape {(*lead, width)} (the model's "
                                 f"output for X), got {Y.shape}")
        if finite:
            _check_finite(name, Y)


def _check_data(model, loss, X, Y, what: str = "", finite: bool = True) -> None:
    _check_xy(X, Y, what)
    out = _check_x(model, X, what + "X", finite)
    _check_target(model, loss, X, Y, out, what + "Y", finite)


@contextlib.contextmanager
def _exclusive(model, what: str):
    """Hold the model's lock for a whole fit/evaluate/predict: a concurrent call from
    another thread raises before it switches the mode under a running loop."""
    lock = model._lock
    if not lock.acquire(False):
        raise RuntimeError(f"{what}: the model is in use by another thread; a model is used by "
                           f"one thread at a time (build one model per thread)")
    try:
        yield
    finally:
        lock.release()


# ----------------------------------------------------------------------------- accuracy
class _Hits:
    """Counts correct argmax predictions into reused buffers (no per-batch allocation)."""

    def __init__(self):
        self._pred = self._true = self._eq = None

    def count(self, pred: np.ndarray, target: np.ndarray) -> int:
        logits = pred.reshape(-1, pred.shape[-1])
        rows = logits.shape[0]
        if self._pred is None or self._pred.shape[0] < rows:
            self._pred = np.empty(rows, np.intp)  # (rows,) predicted class
            self._true = np.empty(rows, np.intp)  # (rows,) target class (probability targets)
            self._eq = np.empty(rows, bool)       # (rows,) hit mask
        p, eq = self._pred[:rows], self._eq[:rows]
        np.argmax(logits, axis=1, out=p)
        if np.issubdtype(target.dtype, np.integer):
            t = target.reshape(rows)
        else:
            t = self._true[:rows]
            np.argmax(target.reshape(rows, -1), axis=1, out=t)
        np.equal(p, t, out=eq)
        return int(np.count_nonzero(eq))


def _rows_of(pred: np.ndarray) -> int:
    """Positions scored by cross-entropy in ``pred`` (N for (N, C), B*T for (B, T, C))."""
    return pred.size // pred.shape[-1]


# ----------------------------------------------------------------------------- progress
def _fmt_time(s: float) -> str:
    s = int(round(s))
    return f"{s // 3600}:{s // 60 % 60:02d}:{s % 60:02d}" if s >= 3600 else f"{s // 60}:{s % 60:02d}"


class _Progress:
    """``True``: one updating line on a terminal, else a plain line every ~10% of the epochs;
    an int k: a plain line every k epochs (and the last); ``False``: nothing. Writes to stdout."""

    def __init__(self, progress, epochs: int):
        if isinstance(progress, bool) or progress is None:
            every = max(1, epochs // 10) if progress else 0
        else:
            every = _check_int("progress", progress, 1)
        self.file = sys.stdout
        isatty = getattr(self.file, "isatty", None)
        self.tty = progress is True and bool(isatty and isatty())
        self.every, self.epochs = every, epochs
        self.width = len(str(epochs))
        self._last = 0.0
        self._open = False

    def update(self, epoch: int, h: History, elapsed: float, last: bool = False) -> None:
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


# ----------------------------------------------------------------------------- loops
def evaluate(model, loss, X, Y, batch_size=None):
    """``(mean loss, accuracy or None)`` of ``model`` on ``(X, Y)`` in eval mode (the model's
    mode is restored afterwards). Accuracy is given for ``CrossEntropyLoss``. Every argument
    is checked before the model is touched (NaN inputs are allowed: they give a NaN loss)."""
    _check_model(model)
    _check_loss(loss)
    _check_data(model, loss, X, Y, finite=False)
    bs = _batch_size(batch_size, X.shape[0])
    with _exclusive(model, "evaluate"):
        return _evaluate(model, loss, X, Y, bs)


def _evaluate(model, loss, X, Y, bs):
    n = X.shape[0]
    was_training = model.training
    classify = isinstance(loss, CrossEntropyLoss)
    hits, total, hit, rows = _Hits(), 0.0, 0, 0
    try:
        model.eval()
        for s in range(0, n, bs):  # row slices of C-contiguous arrays: views, no copies
            xb, yb = X[s:s + bs], Y[s:s + bs]
            pred = model.forward(xb)
            total += loss.forward(pred, yb) * xb.shape[0]
            if classify:
                hit += hits.count(pred, yb)
                rows += _rows_of(pred)
    finally:
        model.train(was_training)
    return total / n, (hit / rows if classify else None)


def predict(model, X, batch_size=None) -> np.ndarray:
    """The model's outputs for ``X`` in eval mode, as a new array (the model's mode is
    restored afterwards). ``batch_size`` bounds the work buffers (``None``: all at once)."""
    _check_model(model)
    if not isinstance(X, np.ndarray):
        raise TypeError(f"X: expected a numpy.ndarray, got {type(X).__name__}")
    if X.ndim == 0 or X.shape[0] == 0:
        raise ValueError(f"X: expected at least one sample, got shape {X.shape}")
    _check_x(model, X, "X", finite=False)
    n = X.shape[0]
    bs = _batch_size(batch_size, n)
    with _exclusive(model, "predict"):
        was_training = model.training
        out = None
        try:
            model.eval()
            for s in range(0, n, bs):
                y = model.forward(X[s:s + bs])  # a view of the model's work buffer
                if out is None:
                    out = np.empty((n,) + y.shape[1:], y.dtype)  # (N, ...) the result
                out[s:s + y.shape[0]] = y
        finally:
            model.train(was_training)
    return out


def fit(model, loss, optimizer, X, Y, epochs: int, batch_size=None, shuffle: bool = True,
        rng=0, validation=None, progress=True, callbacks=(), scheduler=None,
        scheduler_interval: str = "epoch", clip_grad_norm=None, comm=None) -> History:
    """Train ``model`` on ``(X, Y)`` for ``epochs`` passes; return the ``History``.

    Each step: forward, ``loss.forward``, a finiteness check, ``loss.backward``,
    ``model.backward``, ``optimizer.step()``, ``model.zero_grad()``.

    - ``batch_size``: rows per step (``None``: the full batch); the last batch keeps the
      remainder (17 samples in batches of 5: 5, 5, 5, 2).
    - ``shuffle``: a new order each epoch from ``rng`` (an int seed or a Generator). The full
      batch is never shuffled (the gradient does not depend on the order).
    - ``validation``: ``(X_val, Y_val)`` evaluated after each epoch in eval mode.
    - ``progress``: see ``_Progress`` (True: auto, False: silent, int k: a line every k epochs).
    - ``callbacks``: objects with ``on_epoch_end(epoch, history)`` returning True to stop
      (``engine.callbacks``: ``EarlyStopping``, ``ModelCheckpoint``, the protocol).
    - ``scheduler``: an ``engine.lr_scheduler`` scheduler of ``optimizer``, stepped after
      every optimizer step (``scheduler_interval="step"``) or after every epoch (``"epoch"``,
      before the callbacks, so a checkpoint saved by one resumes at the next epoch's rate).
    - ``clip_grad_norm``: a max norm: the gradients are scaled to at most this global L2 norm
      before each update (``engine.clip_grad_norm``).
    - ``comm``: an MPI communicator: data-parallel training over its ranks, ``batch_size``
      being the global batch (``engine.distributed``; every rank gets the same History,
      rank 0 prints).

    Every argument and the whole data set (dtypes, shapes, C-contiguity, finite values,
    labels in range) are checked before anything changes: a rejected call leaves the
    parameters, gradients, optimizer and the model's mode as they were.

    A NaN/inf loss raises ``NonFiniteLossError`` naming the epoch and step before that
    step's update, so the model keeps the parameters of the last good step (the History so
    far is on the exception). Ctrl-C raises ``TrainingInterrupted`` (a KeyboardInterrupt):
    an optimizer step is applied whole or not at all, the gradients are zeroed, and the
    History so far is on the exception. The model is left in training mode.
    """
    run = _Run()  # how far the run got: what a Ctrl-C reports
    try:
        if comm is None:
            setup = _check_fit(model, loss, optimizer, X, Y, epochs, batch_size, shuffle, rng,
                               validation, progress, callbacks, scheduler, scheduler_interval,
                               clip_grad_norm)
        else:  # every rank learns whether any rank rejected its arguments (none waits alone)
            from ..distributed import _agree, _comm
            _comm(comm)  # a TypeError naming comm, before it is used to agree on anything
            error = setup = None
            try:
                setup = _check_fit(model, loss, optimizer, X, Y, epochs, batch_size, shuffle,
                                   rng, validation, progress, callbacks, scheduler,
                                   scheduler_interval, clip_grad_norm)
            except (TypeError, ValueError) as e:
                error = e
            _agree(comm, error)
            if error is not None:
                raise error
        epochs, bs, val_bs, gen, bar, callbacks = setup
        run.epochs = epochs
        with _exclusive(model, "fit"):
            return _fit(run, model, loss, optimizer, X, Y, epochs, bs, shuffle, gen, validation,
                        val_bs, bar, callbacks, scheduler, scheduler_interval, clip_grad_norm,
                        comm)
    except KeyboardInterrupt:
        raise run.interrupted(model) from None


class _Run:
    """Where a ``fit`` run is, for the report of a Ctrl-C: its History, epoch and step, and
    whether training started (the model was switched to training mode and its gradients
    zeroed)."""

    def __init__(self):
        self.h, self.epochs, self.steps_per_epoch = History(), 0, 0
        self.epoch = self.step = 0
        self.started = False

    def interrupted(self, model) -> TrainingInterrupted:
        h = self.h
        if self.started:
            with defer_keyboard_interrupt():
                model.zero_grad()  # a half-accumulated gradient belongs to no step
                model.train()      # as fit leaves it (also if a validation pass was cut)
            where = (f"at epoch {self.epoch}/{self.epochs}, step "
                     f"{self.step}/{self.steps_per_epoch}" if self.epoch else
                     "before the first step")
            text = (f"training interrupted (Ctrl-C) {where}: the model and the optimizer hold "
                    f"the state after optimizer step {h.steps}, the last complete one "
                    f"(gradients zeroed, training mode); the exception's .history holds the "
                    f"{len(h)} completed epoch(s)")
        else:
            text = "training interrupted (Ctrl-C) before it started: nothing was changed"
        return TrainingInterrupted(text, h, self.epoch, self.step)


def _check_fit(model, loss, optimizer, X, Y, epochs, batch_size, shuffle, rng, validation,
               progress, callbacks, scheduler, scheduler_interval, clip_grad_norm):
    """Every check of ``fit``'s arguments; changes nothing."""
    _check_model(model)
    _check_loss(loss)
    _instance("optimizer", optimizer)
    for name in ("step", "zero_grad"):
        if not callable(getattr(optimizer, name, None)):
            raise TypeError(f"optimizer: expected an optimizer with step() and zero_grad(), "
                            f"got {type(optimizer).__name__}")
    if isinstance(optimizer, Optimizer):
        check_optimizer_of(optimizer, model)
    _check_data(model, loss, X, Y)
    epochs = _check_int("epochs", epochs, 0)
    bs = _batch_size(batch_size, X.shape[0])
    if not isinstance(shuffle, (bool, np.bool_)):
        raise TypeError(f"shuffle: expected a bool, got {shuffle!r}")
    if validation is not None:
        if not isinstance(validation, (tuple, list)) or len(validation) != 2:
            raise TypeError("validation: expected a pair (X_val, Y_val)")
        _check_data(model, loss, *validation, what="validation ")
        val_bs = _batch_size(batch_size, validation[0].shape[0])
    else:
        val_bs = None
    classify = isinstance(loss, CrossEntropyLoss)
    callbacks = _check_callbacks(callbacks, classify, validation is not None)
    _check_scheduler(scheduler, scheduler_interval, optimizer)
    if clip_grad_norm is not None:
        if (isinstance(clip_grad_norm, bool) or not isinstance(clip_grad_norm, numbers.Real)
                or not clip_grad_norm > 0):
            raise ValueError(f"clip_grad_norm: expected a max norm > 0 (or None), got "
                             f"{clip_grad_norm!r}")
    gen = make_rng(rng)
    bar = _Progress(progress, epochs)
    return epochs, bs, val_bs, gen, bar, callbacks


def _fit(run, model, loss, optimizer, X, Y, epochs, bs, shuffle, gen, validation, val_bs,
         bar, callbacks, scheduler, scheduler_interval, clip_grad_norm, comm) -> History:
    n = X.shape[0]
    classify = isinstance(loss, CrossEntropyLoss)
    per_step = scheduler is not None and scheduler_interval == "step"
    per_epoch = scheduler is not None and scheduler_interval == "epoch"
    if clip_grad_norm is not None:
        clip_params = model.parameters()
    dp = None
    h = run.h
    steps_per_epoch = run.steps_per_epoch = -(-n // bs)
    try:
        if comm is not None:  # data parallel: checks the ranks agree, broadcasts parameters
            from ..distributed import fit_setup
            dp = fit_setup(comm, model, optimizer, X, Y, epochs=epochs, batch_size=bs,
                           shuffle=shuffle, rng=gen)
            if dp.rank != 0:
                bar = _Progress(False, epochs)
        full = bs == n
        gather = shuffle and not full
        if gather:
            identity = np.arange(n)                               # (N,) 0..N-1
            order = np.empty_like(identity)                       # (N,) this epoch's order
            xbuf = np.empty((bs,) + X.shape[1:], X.dtype)         # (bs, ...) gathered batch
            ybuf = np.empty((bs,) + Y.shape[1:], Y.dtype)         # (bs, ...) its targets
        for cb in callbacks:  # first: a callback that rejects its setup leaves the model as it was
            begin = getattr(cb, "on_train_begin", None)
            if begin is not None:
                begin(model, optimizer, scheduler)
        hits = _Hits()
        groups = getattr(optimizer, "param_groups", None)
        # The optimizer zeroes the gradients inside its update pass, while they are in cache,
        # when it updates exactly the model's parameters; otherwise model.zero_grad() after it.
        fused_zero = groups is not None and _same_parameters(optimizer, model)
        run.started = True
        model.train()
        model.zero_grad()
        t_start = time.perf_counter()
        for epoch in range(1, epochs + 1):
            run.epoch = epoch
            t0 = time.perf_counter()
            lr0 = float(groups[0]["lr"]) if groups else None
            if gather:
                # Shuffle a fresh 0..N-1 each epoch, so the order depends only on the
                # Generator's state (a run resumed with that state continues identically).
                np.copyto(order, identity)
                gen.shuffle(order)
            total, hit, rows = 0.0, 0, 0
            for step in range(1, steps_per_epoch + 1):
                run.step = step
                s, e = (step - 1) * bs, min(step * bs, n)
                if dp is not None:  # this rank's rows of the global batch
                    s, e = dp.share(s, e)
                if gather:
                    idx = order[s:e]
                    m = idx.shape[0]
                    # mode="clip" lets take write straight into out (mode="raise" buffers).
                    xb = np.take(X, idx, axis=0, out=xbuf[:m], mode="clip")
                    yb = np.take(Y, idx, axis=0, out=ybuf[:m], mode="clip")
                elif full and dp is None:
                    xb, yb = X, Y
                else:
                    xb, yb = X[s:e], Y[s:e]
                m = xb.shape[0]
                pred = model.forward(xb)
                value = loss.forward(pred, yb)
                if dp is not None:  # the global batch's mean loss and rows, on every rank
                    value, m = dp.batch_loss(value, m)
                if not math.isfinite(value):
                    raise NonFiniteLossError(
                        f"non-finite loss ({value}) at epoch {epoch}/{epochs}, step "
                        f"{step}/{steps_per_epoch} (optimizer step {h.steps + 1}); the model "
                        f"keeps the parameters of the last good step. A lower learning rate, "
                        f"gradient clipping or float64 may help.", epoch, step, value)
                if classify:
                    hit += hits.count(pred, yb)
                    rows += _rows_of(pred)
                model.backward(loss.backward())
                if dp is not None:  # the gradient of the global batch, on every rank
                    dp.reduce_gradients(None if m % dp.size == 0 else xb.shape[0] / m)
                if clip_grad_norm is not None:
                    if dp is not None:  # the global gradient's norm (ZeRO-1: of its slices)
                        dp.clip_grad_norm(clip_grad_norm)
                    else:
                        _clip_grad_norm(clip_params, clip_grad_norm)
                with defer_keyboard_interrupt():  # the update and its bookkeeping: all or none
                    if fused_zero:
                        optimizer.step(zero_grad=True)
                    else:
                        optimizer.step()
                        model.zero_grad()
                    if per_step:
                        scheduler.step()
                    total += value * m
                    h.steps += 1
                    h.samples += m
            if classify and dp is not None:
                hit, rows = dp.allsum(hit, rows)
            vl = va = None
            if validation is not None:
                vl, va = _evaluate(model, loss, validation[0], validation[1], val_bs)
            with defer_keyboard_interrupt():  # the epoch's History row: whole or absent
                if groups:
                    h.lr.append(lr0)
                h.loss.append(total / n)
                if classify:
                    h.accuracy.append(hit / rows)
                if vl is not None:
                    h.val_loss.append(vl)
                    if va is not None:
                        h.val_accuracy.append(va)
                h.epoch_time.append(time.perf_counter() - t0)
                if per_epoch:
                    scheduler.step()
            stop = False
            for cb in callbacks:  # every callback sees every epoch, as in Keras
                stop = bool(cb.on_epoch_end(epoch, h)) or stop
            bar.update(epoch, h, time.perf_counter() - t_start, last=stop)
            if stop:
                break
        if dp is not None:
            dp.finish()
        for cb in callbacks:
            end = getattr(cb, "on_train_end", None)
            if end is not None:
                end(model, optimizer, scheduler)
    except Exception as exc:  # (a KeyboardInterrupt goes to fit, which reports it from run)
        if isinstance(exc, NonFiniteLossError):
            exc.history = h
        if dp is not None:  # meet the other ranks in their next collective step
            dp.fail(exc)
        raise
    finally:
        bar.close()
    return h


def _same_parameters(optimizer, model) -> bool:
    """Whether ``optimizer`` (an engine optimizer) updates exactly ``model``'s parameters."""
    from ..optim.optimizers import Optimizer
    if not isinstance(optimizer, Optimizer):
        return False
    own = {id(p) for g in optimizer.param_groups for p in g["params"]}
    return own == {id(p) for p in model.parameters()}


def _check_callbacks(callbacks, classify: bool, validation: bool) -> list:
    """``callbacks`` as a list, each with an ``on_epoch_end`` and a ``monitor`` (if any)
    that the run records; else TypeError/ValueError naming the callback."""
    if callbacks is None:
        return []
    if not isinstance(callbacks, (list, tuple)):
        raise TypeError(f"callbacks: expected a list of callbacks, got {type(callbacks).__name__}")
    recorded = ["loss"] + (["accuracy"] if classify else [])
    if validation:
        recorded += ["val_loss"] + (["val_accuracy"] if classify else [])
    for i, cb in enumerate(callbacks):
        _instance(f"callbacks[{i}]", cb)
        if not callable(getattr(cb, "on_epoch_end", None)):
            raise TypeError(f"callbacks[{i}]: expected an object with on_epoch_end(epoch, "
                            f"history), got {type(cb).__name__}")
        for monitor in (getattr(cb, "monitor", None), *getattr(cb, "figures", ())):
            _check_monitor(i, cb, monitor, recorded, validation)
    return list(callbacks)


def _check_monitor(i: int, cb, monitor, recorded: list, validation: bool) -> None:
    """A figure callback ``i`` reads (its monitor, or one of its ``figures``) must be one the
    run records."""
    if monitor is not None and monitor not in recorded:
        hint = (" (pass validation=(X_val, Y_val))" if str(monitor).startswith("val_")
                and not validation else "")
        raise ValueError(f"callbacks[{i}]: {type(cb).__name__} reads {monitor!r}, which this "
                         f"run does not record; it records {recorded}{hint}")


def _check_scheduler(scheduler, interval, optimizer) -> None:
    if interval not in ("step", "epoch"):
        raise ValueError(f"scheduler_interval: expected 'step' or 'epoch', got {interval!r}")
    if scheduler is None:
        return
    _instance("scheduler", scheduler)
    if not callable(getattr(scheduler, "step", None)):
        raise TypeError(f"scheduler: expected a learning-rate scheduler with step(), got "
                        f"{type(scheduler).__name__}")
    owner = getattr(scheduler, "optimizer", optimizer)
    if owner is not optimizer:
        raise ValueError("scheduler: it drives another optimizer than the one passed to fit")


# ----------------------------------------------------------------------------- metrics
def r2_score(y_true, y_pred) -> np.ndarray:
    """Coefficient of determination per output column: 1 - SS_res / SS_tot (float64, (d,));
    NaN for a column whose true values are all equal (SS_tot = 0: R^2 is undefined)."""
    t = np.asarray(y_true, np.float64).reshape(len(y_true), -1)
    p = np.asarray(y_pred, np.float64).reshape(len(y_pred), -1)
    if t.shape != p.shape:
        raise ValueError(f"y_pred: expected shape {t.shape} (y_true's), got {p.shape}")
    ss_res = ((t - p) ** 2).sum(axis=0)
    ss_tot = ((t - t.mean(axis=0)) ** 2).sum(axis=0)
    with np.errstate(divide="ignore", invalid="ignore"):
        r2 = 1.0 - ss_res / ss_tot
    r2[ss_tot == 0.0] = np.nan
    return r2


def mean_absolute_error(y_true, y_pred) -> np.ndarray:
    """Mean absolute error per output column (float64, (d,))."""
    t = np.asarray(y_true, np.float64).reshape(len(y_true), -1)
    p = np.asarray(y_pred, np.float64).reshape(len(y_pred), -1)
    if t.shape != p.shape:
        raise ValueError(f"y_pred: expected shape {t.shape} (y_true's), got {p.shape}")
    return np.abs(t - p).mean(axis=0)

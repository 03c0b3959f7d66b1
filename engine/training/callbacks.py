"""Callbacks for ``fit``: ``EarlyStopping`` and ``ModelCheckpoint`` (Keras's names), and the
``Callback`` base class that documents the protocol.

A callback is any object with ``on_epoch_end(epoch, history) -> bool``: ``fit`` calls it after
every epoch (``epoch`` counts from 1; ``history`` is the run's ``History`` so far) and stops
after that epoch if any callback returns True. Optional hooks: ``on_train_begin(model,
optimizer, scheduler)`` before the first step and ``on_train_end(model, optimizer,
scheduler)`` after the last epoch (also after an early stop, not after an exception). A
callback may also have ``set_run(run)``, called before ``on_train_begin`` with the run's
state (``run.save_after_epoch(path, **metadata)`` writes a checkpoint that
``fit(..., resume_from=path)`` continues), and ``state_dict()`` / ``load_state_dict(state)``
(JSON values and arrays): its state is saved in such a checkpoint and given back, after
``on_train_begin``, to the callback of the same type (and rank among that type) of the
resumed run. A callback with a ``monitor`` attribute must name a figure the run records ("loss",
"accuracy", "val_loss", "val_accuracy"), and so must each name in its ``figures`` (a tuple
of the figures it reads, e.g. those a ModelCheckpoint path names); ``fit`` checks that
before the first step.

    class StopAtLoss:                      # stop once the training loss is below a target
        def __init__(self, target):
            self.target = target
        def on_epoch_end(self, epoch, history):
            return history.loss[-1] < self.target
"""
from __future__ import annotations

import math
import os
import re
import string

import numpy as np

from .._checks import check_bool, check_int, check_real
from . import checkpoint as _checkpoint

__all__ = ["Callback", "EarlyStopping", "ModelCheckpoint", "MONITORS", "check_output_path"]

MONITORS = ("loss", "accuracy", "val_loss", "val_accuracy")


def _mode(monitor: str, mode: str) -> str:
    if not isinstance(monitor, str) or monitor not in MONITORS:
        raise ValueError(f"monitor: expected one of {MONITORS}, got {monitor!r}")
    if mode not in ("auto", "min", "max"):
        raise ValueError(f"mode: expected 'auto', 'min' or 'max', got {mode!r}")
    if mode == "auto":  # Keras's rule: accuracies grow, losses shrink
        return "max" if "acc" in monitor else "min"
    return mode


def _latest(history, monitor: str, who: str) -> float:
    values = getattr(history, monitor, None)
    if not values:
        raise ValueError(f"{who}: monitor {monitor!r}: the history records no such figure "
                         f"(val_* figures need fit(..., validation=(X_val, Y_val)), accuracies "
                         f"a CrossEntropyLoss)")
    return float(values[-1])


def check_output_path(path, what: str = "path", suffixes=None) -> str:
    """``path`` as a str if a file can be written there, else ValueError naming ``what``: the
    directory exists and is writable, ``path`` is not a directory, the file name fits the file
    system, an existing file is not read-only (by its mode bits, also for root), and the
    suffix is one of ``suffixes`` (if given). As ``checkpoint.save`` would, a file with its
    short temporary name is created next to it and removed."""
    try:
        p = os.fspath(path)
    except TypeError:
        raise TypeError(f"{what}: expected a path, got {type(path).__name__}") from None
    if not isinstance(p, str) or not p:
        raise ValueError(f"{what}: expected a non-empty path, got {path!r}")
    if suffixes and not p.lower().endswith(tuple(suffixes)):
        raise ValueError(f"{what}: expected a file name ending in {' or '.join(suffixes)}, got {p!r}")
    full = os.path.abspath(p)
    directory, name = os.path.split(full)
    if not name or p.endswith(("/", os.sep)):
        raise ValueError(f"{what}: {p!r} names a directory, not a file")
    if not os.path.isdir(directory):
        raise ValueError(f"{what}: the directory {directory!r} does not exist")
    if os.path.isdir(full):
        raise ValueError(f"{what}: {p!r} is a directory, not a file")
    try:
        name_max = os.pathconf(directory, "PC_NAME_MAX")
    except (OSError, ValueError, AttributeError):
        name_max = 255
    if len(name.encode()) > name_max:
        raise ValueError(f"{what}: the file name is {len(name.encode())} bytes long; at most "
                         f"{name_max} fit here")
    # What save checks and does (read-only files refused, a probe with its temporary name).
    _checkpoint.check_target(p, what)
    return p


def _template_fields(path: str) -> tuple:
    """The figures (of ``MONITORS``) the path template ``path`` names; ValueError for a
    field that is neither one of them nor ``epoch``, or a template that does not parse."""
    try:
        names = [f for _, f, _, _ in string.Formatter().parse(path) if f is not None]
    except ValueError as e:
        raise ValueError(f"path: cannot parse the template {path!r} ({e})") from None
    fields = []
    for f in names:
        base = re.split(r"[.\[]", f, maxsplit=1)[0]
        if base == "epoch":
            continue
        if base not in MONITORS:
            raise ValueError(f"path: the template {path!r} names {{{f}}}; it may use {{epoch}} "
                             f"and {list(MONITORS)}")
        if base not in fields:
            fields.append(base)
    return tuple(fields)


class Callback:
    """The protocol ``fit`` calls (subclassing is optional: any object with
    ``on_epoch_end`` works). Return True from ``on_epoch_end`` to stop training."""

    def on_train_begin(self, model, optimizer, scheduler) -> None:
        """Called once before the first step."""

    def on_epoch_end(self, epoch: int, history) -> bool:
        """Called after each epoch (from 1) with the ``History`` so far; True stops training."""
        return False

    def on_train_end(self, model, optimizer, scheduler) -> None:
        """Called once after the last epoch (or the epoch a callback stopped at)."""


class EarlyStopping(Callback):
    """Stop after ``patience`` epochs in a row without improvement of ``monitor`` (Keras's
    semantics: patience 0 and 1 both stop at the first epoch that does not improve).

    An epoch improves on the best so far if its value is lower by more than ``min_delta``
    ("min" mode; higher by more than ``min_delta`` in "max" mode; "auto" picks "max" for
    accuracies, "min" for losses). With ``restore_best_weights`` the model gets back the
    parameters of the best epoch when training ends (stopped early or not); the optimizer's
    state stays that of the last step. After ``fit``: ``stopped_epoch`` (0 if it did not
    stop), ``best``, ``best_epoch``.
    """

    def __init__(self, monitor: str = "val_loss", patience: int = 0, min_delta: float = 0.0,
                 restore_best_weights: bool = False, mode: str = "auto"):
        self._mode = _mode(monitor, mode)
        check_int("patience", patience, 0)
        check_real("min_delta", min_delta, 0.0)
        check_bool("restore_best_weights", restore_best_weights)
        self.monitor, self.mode = monitor, mode
        self.patience, self.min_delta = int(patience), float(min_delta)
        self.restore_best_weights = restore_best_weights
        self._reset()

    def _reset(self) -> None:
        self.best = math.inf if self._mode == "min" else -math.inf
        self.best_epoch = 0
        self.stopped_epoch = 0
        self.wait = 0
        self._model = None
        self._best_state = None

    def _improved(self, value: float) -> bool:
        if self._mode == "min":
            return value < self.best - self.min_delta
        return value > self.best + self.min_delta

    def on_train_begin(self, model, optimizer, scheduler) -> None:
        self._reset()
        self._model = model

    def on_epoch_end(self, epoch: int, history) -> bool:
        value = _latest(history, self.monitor, "EarlyStopping")
        if self._improved(value):
            self.best, self.best_epoch, self.wait = value, epoch, 0
            if self.restore_best_weights and self._model is not None:
                self._best_state = self._model.state_dict()  # copies
            return False
        self.wait += 1
        if self.wait >= self.patience:  # Keras: patience 0 and 1 both stop at the first miss
            self.stopped_epoch = epoch
            return True
        return False

    def state_dict(self) -> dict:
        """What a resumed run needs to continue counting: the best value and epoch, the
        epochs waited, and (``restore_best_weights``) the best epoch's parameters."""
        return {"monitor": self.monitor, "best": self.best, "best_epoch": self.best_epoch,
                "wait": self.wait, "stopped_epoch": self.stopped_epoch,
                "best_weights": None if self._best_state is None else dict(self._best_state)}

    def validate_state_dict(self, state) -> None:
        """ValueError unless ``state`` is one of this callback's (same monitor)."""
        if not isinstance(state, dict) or state.get("monitor") != self.monitor:
            raise ValueError(f"expected the state of an EarlyStopping on {self.monitor!r}, got "
                             f"one on {state.get('monitor') if isinstance(state, dict) else state!r}")
        for k in ("best", "best_epoch", "wait", "stopped_epoch"):
            if not isinstance(state.get(k), (int, float)):
                raise ValueError(f"{k}: expected a number, got {state.get(k)!r}")

    def load_state_dict(self, state) -> None:
        """Continue from a saved ``state_dict()`` (after ``on_train_begin``)."""
        self.best, self.best_epoch = float(state["best"]), int(state["best_epoch"])
        self.wait, self.stopped_epoch = int(state["wait"]), int(state["stopped_epoch"])
        weights = state.get("best_weights")
        if self.restore_best_weights and weights is not None:
            self._best_state = {k: np.array(v, copy=True) for k, v in weights.items()}

    def on_train_end(self, model, optimizer, scheduler) -> None:
        if self.restore_best_weights and self._best_state is not None:
            model.load_state_dict(self._best_state)
        self._best_state = None
        self._model = None

    def __repr__(self) -> str:
        return (f"EarlyStopping(monitor={self.monitor!r}, patience={self.patience}, "
                f"min_delta={self.min_delta}, restore_best_weights={self.restore_best_weights})")


class ModelCheckpoint(Callback):
    """Save the model (and the optimizer and scheduler, in an ``.npz`` file) to ``path`` after
    an epoch: only when ``monitor`` improved on the best so far (``save_best_only``, Keras's
    default here) or after every epoch. ``path`` may hold ``{epoch}`` and the figures
    (``"ckpt-{epoch:03d}-{val_loss:.4f}.npz"``). A ``.safetensors`` path stores the parameters
    only. The metadata holds ``epoch`` and the epoch's figures. The path is checked before
    the first step; ``saved`` lists the files written. Inside ``fit``, an ``.npz`` file is
    written once every callback has seen the epoch and holds the run's training state:
    ``fit(..., resume_from=path)`` continues it exactly."""

    def __init__(self, path, monitor: str = "val_loss", save_best_only: bool = True,
                 mode: str = "auto", metadata: dict | None = None):
        self._mode = _mode(monitor, mode)
        try:
            self.path = os.fspath(path)
        except TypeError:
            raise TypeError(f"path: expected a path, got {type(path).__name__}") from None
        check_bool("save_best_only", save_best_only)
        self.figures = _template_fields(self.path)
        self.monitor, self.mode, self.save_best_only = monitor, mode, save_best_only
        self.best = math.inf if self._mode == "min" else -math.inf
        self.saved: list = []
        self.metadata = dict(metadata or {})  # written into every checkpoint, beside the figures
        self._model = self._optimizer = self._scheduler = self._run = None

    def _figures(self, history) -> dict:
        return {k: float(getattr(history, k)[-1]) for k in MONITORS if getattr(history, k)}

    def _format(self, epoch: int, figures: dict) -> str:
        try:
            return self.path.format(epoch=epoch, **figures)
        except (KeyError, IndexError, ValueError, TypeError, AttributeError) as e:
            raise ValueError(f"path: cannot fill in {self.path!r} ({type(e).__name__}: {e}); "
                             f"it may use {{epoch}} and {sorted(figures)}") from None

    def set_run(self, run) -> None:
        """Inside ``fit``: checkpoints are written through the run, resumable."""
        self._run = run

    def state_dict(self) -> dict:
        return {"monitor": self.monitor, "best": self.best, "saved": list(self.saved)}

    def validate_state_dict(self, state) -> None:
        if not isinstance(state, dict) or state.get("monitor") != self.monitor \
                or not isinstance(state.get("best"), (int, float)):
            raise ValueError(f"expected the state of a ModelCheckpoint on {self.monitor!r}")

    def load_state_dict(self, state) -> None:
        self.best = float(state["best"])
        self.saved = [str(p) for p in state.get("saved") or []]

    def on_train_begin(self, model, optimizer, scheduler) -> None:
        # Check the directory (and a formatted name) now, not after the first epoch's work.
        sample = {k: 0.0 for k in MONITORS}
        check_output_path(self._format(1, sample), "ModelCheckpoint path",
                          (".npz", ".safetensors"))
        self._model, self._optimizer, self._scheduler = model, optimizer, scheduler
        self.best = math.inf if self._mode == "min" else -math.inf

    def on_epoch_end(self, epoch: int, history) -> bool:
        value = _latest(history, self.monitor, "ModelCheckpoint")
        better = value < self.best if self._mode == "min" else value > self.best
        if better:
            self.best = value
        if better or not self.save_best_only:
            figures = self._figures(history)
            path = self._format(epoch, figures)
            meta = {**self.metadata, "epoch": epoch, "steps": history.steps, **figures}
            if self._run is not None:  # written once every callback has seen the epoch
                self._run.save_after_epoch(path, **meta)
            elif path.lower().endswith(".safetensors"):
                _checkpoint.save(path, self._model, **meta)
            else:
                _checkpoint.save(path, self._model, self._optimizer, scheduler=self._scheduler,
                                 **meta)
            self.saved.append(path)
        return False

    def on_train_end(self, model, optimizer, scheduler) -> None:
        self._model = self._optimizer = self._scheduler = self._run = None

    def __repr__(self) -> str:
        return (f"ModelCheckpoint({self.path!r}, monitor={self.monitor!r}, "
                f"save_best_only={self.save_best_only})")

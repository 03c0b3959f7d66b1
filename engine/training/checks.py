"""Checks of fit, evaluate and predict: the model, the loss, the data set (dtypes, shapes,
C-contiguity, finite values, labels in range), callbacks and a scheduler."""
from __future__ import annotations

import math

import numpy as np

from .._checks import check_int
from ..nn.losses import CrossEntropyLoss, MSELoss
from ..nn.module import Module, describes_input

__all__ = ["check_xy", "batch_size_for", "check_model", "check_instance", "check_loss", "check_x", "check_data",
           "check_callbacks", "check_scheduler"]


# fit, evaluate and predict check every argument and the whole data set before they change
# anything (parameters, gradients, optimizer state, the model's mode): a rejected call
# changes nothing. Arrays must be C-contiguous in every mode (nothing is copied silently).
def check_xy(X, Y, what: str = ""):
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


def batch_size_for(batch_size, n: int) -> int:
    if batch_size is None:
        return n
    return min(check_int("batch_size", batch_size, 1), n)


def check_model(model) -> None:
    if not isinstance(model, Module):
        raise TypeError(f"model: expected an engine Module (a layer, block or model), got "
                        f"{type(model).__name__}")


def check_instance(what: str, v) -> None:
    """A class where an object is expected (``loss=MSELoss``) passes duck-typing checks (its
    methods are attributes) and fails mid-run: TypeError naming ``what`` first."""
    if isinstance(v, type):
        raise TypeError(f"{what}: expected an instance, got the class {v.__name__} (write "
                        f"{v.__name__}(...))")


def check_loss(loss) -> None:
    check_instance("loss", loss)
    if not (callable(getattr(loss, "forward", None)) and callable(getattr(loss, "backward", None))):
        raise TypeError(f"loss: expected a loss with forward(pred, target) and backward() "
                        f"(MSELoss, CrossEntropyLoss), got {type(loss).__name__}")


def _check_c(name: str, a) -> None:
    if not a.flags.c_contiguous:
        raise ValueError(f"{name}: expected a C-contiguous array, got strides {a.strides} for "
                         f"shape {a.shape} (use np.ascontiguousarray)")


def _check_finite(name: str, a) -> None:
    # min and max propagate NaN: two passes over the data, no temporary arrays.
    if a.size and not (math.isfinite(np.min(a)) and math.isfinite(np.max(a))):
        at = tuple(int(i) for i in np.argwhere(~np.isfinite(a))[0])
        raise ValueError(f"{name}: expected finite values, got {a[at]} at index {at}")


def check_x(model, X, name: str, finite: bool):
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


def check_data(model, loss, X, Y, what: str = "", finite: bool = True) -> None:
    check_xy(X, Y, what)
    out = check_x(model, X, what + "X", finite)
    _check_target(model, loss, X, Y, out, what + "Y", finite)


def check_callbacks(callbacks, classify: bool, validation: bool) -> list:
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
        check_instance(f"callbacks[{i}]", cb)
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


def check_scheduler(scheduler, interval, optimizer) -> None:
    if interval not in ("step", "epoch"):
        raise ValueError(f"scheduler_interval: expected 'step' or 'epoch', got {interval!r}")
    if scheduler is None:
        return
    check_instance("scheduler", scheduler)
    if not callable(getattr(scheduler, "step", None)):
        raise TypeError(f"scheduler: expected a learning-rate scheduler with step(), got "
                        f"{type(scheduler).__name__}")
    owner = getattr(scheduler, "optimizer", optimizer)
    if owner is not optimizer:
        raise ValueError("scheduler: it drives another optimizer than the one passed to fit")

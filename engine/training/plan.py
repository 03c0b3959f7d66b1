"""The options of one ``fit`` run, checked once into a frozen ``FitPlan`` that the loop reads.

Adding an option to ``fit`` means a field here, its check in ``plan_fit``, and the one place
of the loop that uses it.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from .._checks import check_bool, check_int, check_real
from ..nn.losses import CrossEntropyLoss
from ..nn.module import make_rng
from ..optim.optimizers import Optimizer, check_optimizer_of
from .resume import prepare_resume
from .checks import (batch_size_for, check_callbacks, check_data, check_instance, check_loss,
                     check_model, check_scheduler)

__all__ = ["FitPlan", "plan_fit"]


@dataclass(frozen=True, kw_only=True)
class FitPlan:
    """Every option of a ``fit`` run, checked (see ``fit`` for their meaning)."""
    epochs: int
    batch_size: int                  # rows per step; the whole data set for a full batch
    shuffle: bool
    rng: np.random.Generator         # the shuffling Generator
    validation: tuple | None         # (X_val, Y_val)
    val_batch_size: int | None
    progress: bool | int | None
    callbacks: tuple
    scheduler: object
    scheduler_interval: str          # "step" or "epoch"
    clip_grad_norm: float | None     # max global L2 norm of the gradient
    classify: bool                   # a CrossEntropyLoss: accuracies are recorded
    resume: object = None            # a checked ResumePoint (resume_from), or None

    def scheduler_steps_every(self, interval: str) -> bool:
        """Whether the scheduler is stepped after every ``interval`` ("step" or "epoch")."""
        return self.scheduler is not None and self.scheduler_interval == interval


def _check_optimizer(optimizer, model) -> None:
    check_instance("optimizer", optimizer)
    for name in ("step", "zero_grad"):
        if not callable(getattr(optimizer, name, None)):
            raise TypeError(f"optimizer: expected an optimizer with step() and zero_grad(), "
                            f"got {type(optimizer).__name__}")
    if isinstance(optimizer, Optimizer):
        check_optimizer_of(optimizer, model)


def plan_fit(model, loss, optimizer, X, Y, *, epochs, batch_size=None, shuffle=True, rng=0,
             validation=None, progress=True, callbacks=(), scheduler=None,
             scheduler_interval="epoch", clip_grad_norm=None, resume_from=None) -> FitPlan:
    """Every check of ``fit``'s arguments and the whole data set; changes nothing."""
    check_model(model)
    check_loss(loss)
    _check_optimizer(optimizer, model)
    check_data(model, loss, X, Y)
    epochs = check_int("epochs", epochs, 0)
    bs = batch_size_for(batch_size, X.shape[0])
    shuffle = check_bool("shuffle", shuffle)
    val_bs = None
    if validation is not None:
        if not isinstance(validation, (tuple, list)) or len(validation) != 2:
            raise TypeError("validation: expected a pair (X_val, Y_val)")
        check_data(model, loss, *validation, what="validation ")
        val_bs = batch_size_for(batch_size, validation[0].shape[0])
    classify = isinstance(loss, CrossEntropyLoss)
    callbacks = check_callbacks(callbacks, classify, validation is not None)
    check_scheduler(scheduler, scheduler_interval, optimizer)
    if clip_grad_norm is not None:  # +inf measures the norm without clipping
        clip_grad_norm = check_real("clip_grad_norm", clip_grad_norm, 0.0, low_open=True,
                                    finite=False)
    gen = make_rng(rng)
    if not (isinstance(progress, bool) or progress is None):
        check_int("progress", progress, 1)
    resume = None
    if resume_from is not None:  # last: every other option is checked
        resume = prepare_resume(resume_from, model, optimizer, {
            "epochs": epochs, "scheduler": scheduler, "rng": gen, "callbacks": callbacks,
            "samples": X.shape[0], "batch_size": bs, "shuffled": shuffle and bs != X.shape[0]})
    return FitPlan(epochs=epochs, batch_size=bs, shuffle=shuffle, rng=gen,
                   validation=None if validation is None else tuple(validation),
                   val_batch_size=val_bs, progress=progress, callbacks=tuple(callbacks),
                   scheduler=scheduler, scheduler_interval=scheduler_interval,
                   clip_grad_norm=clip_grad_norm, classify=classify, resume=resume)

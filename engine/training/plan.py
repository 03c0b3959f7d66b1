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
    """Every option of a ``fit`` run, checked; what each means is below. An
    iteration-based run (``sampler``) has ``steps`` optimizer steps in ``epochs`` periods of
    ``eval_every`` steps: each period ends as an epoch does (validation, a History row,
    the callbacks, a progress line).

    - ``batch_size``: rows per step (``None``: the full batch); the last batch keeps the
      remainder (17 samples in batches of 5: 5, 5, 5, 2).
    - ``shuffle`` (True): a new order each epoch from ``rng`` (0: an int seed or a
      Generator). The full batch is never shuffled (the gradient does not depend on the order).
    - ``validation``: ``(X_val, Y_val)`` evaluated after each epoch in eval mode.
    - ``progress`` (True): a line every ~10% of the epochs, or every k epochs for an int k,
      False: none; on a terminal, one line redrawn within each epoch (steps, loss, ETA).
    - ``log_every``: also a line every N optimizer steps with the mean training loss of
      those steps, the learning rate and the time per step (nanoGPT's ``log_interval``).
    - ``sampler``, ``steps``, ``eval_every``: an iteration-based run instead of ``(X, Y)``
      and ``epochs``: ``steps`` batches from ``sampler`` (``sample()``, or ``next()`` of an
      iterator; ``engine.training.samplers.RandomWindows``), each period of ``eval_every``
      steps (default: a tenth of the run) ending as an epoch; ``batch_size`` is then the
      validation's (default: the sampler's ``batch_size``) and the sampler's ``rng``, if it
      has one, is the run's Generator (saved by a checkpoint of the run).
    - ``callbacks``: objects with ``on_epoch_end(epoch, history)`` returning True to stop
      (``engine.training.callbacks``: ``EarlyStopping``, ``ModelCheckpoint``, the protocol).
    - ``scheduler``: an ``engine.optim.lr_scheduler`` scheduler of ``optimizer``, stepped after
      every optimizer step (``scheduler_interval="step"``) or after every epoch (``"epoch"``,
      the default, before the callbacks, so a checkpoint saved by one resumes at the next
      epoch's rate).
    - ``clip_grad_norm``: a max norm: the gradients are scaled to at most this global L2 norm
      before each update (``engine.clip_grad_norm``).
    - ``resume_from``: a checkpoint of a ``fit`` run (``ModelCheckpoint`` to an ``.npz``
      file, or ``TrainingInterrupted.save``): the run continues where it stopped, even
      mid-epoch (model, optimizer, scheduler, the shuffle and dropout Generators, History,
      callbacks' states), epoch numbers continuing; the returned History holds the whole
      run. With the same data and options, k epochs then a resume to ``epochs`` equal
      ``epochs`` uninterrupted bit for bit (one thread). A checkpoint of another
      architecture, optimizer, scheduler or Generators is a ValueError. With ``comm``
      every rank reads the checkpoint (one written by K ranks, whose rank 0 writes it, or
      by one process), and a run's checkpoints are written by rank 0.
    - ``comm``: an MPI communicator: data-parallel training over its ranks, ``batch_size``
      being the global batch (``engine.distributed``; every rank gets the same History,
      rank 0 prints).
    """
    epochs: int                      # epochs, or periods of eval_every steps
    batch_size: int | None           # rows per step (sampler: the validation's, or None)
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
    log_every: int | None = None     # a line of the training loss every N optimizer steps
    sampler: object = None           # the batch source of an iteration-based run
    steps: int | None = None         # its optimizer steps
    eval_every: int | None = None    # its steps per period

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


def _check_sampler(model, loss, sampler, steps, eval_every, batch_size):
    """``(steps, eval_every, validation batch size)`` of an iteration-based run: ``sampler``
    has ``sample()`` or is an iterator of ``(X, Y)``; its ``example()`` batch, if it has one,
    is checked as data (without drawing)."""
    if not callable(getattr(sampler, "sample", None)) \
            and not callable(getattr(sampler, "__next__", None)):
        raise TypeError(f"sampler: expected an object with sample() -> (X, Y) or an iterator "
                        f"of (X, Y) batches, got {type(sampler).__name__}")
    if callable(getattr(sampler, "example", None)):
        check_data(model, loss, *sampler.example(), what="sampler's ")
    steps = check_int("steps", steps, 0)
    eval_every = (max(1, steps // 10) if eval_every is None
                  else check_int("eval_every", eval_every, 1))
    if batch_size is None:
        batch_size = getattr(sampler, "batch_size", None)
    return steps, eval_every, batch_size


def _check_mode(X, Y, epochs, steps, sampler, eval_every) -> None:
    """One kind of run: ``(X, Y)`` and ``epochs``, or ``sampler`` and ``steps``."""
    if sampler is None:
        if X is None or Y is None:
            raise TypeError("X, Y: expected the training data (or sampler=... with steps=...)")
        if epochs is None:
            raise TypeError("epochs: expected the run's number of epochs (or sampler=... with "
                            "steps=... for an iteration-based run)")
        for name, v in (("steps", steps), ("eval_every", eval_every)):
            if v is not None:
                raise ValueError(f"{name}: only with sampler=... (an iteration-based run); "
                                 f"with (X, Y) the run is epochs={epochs}")
        return
    if X is not None or Y is not None:
        raise ValueError("X, Y: an iteration-based run (sampler=...) draws its batches from "
                         "the sampler; pass no X, Y")
    if epochs is not None:
        raise ValueError("epochs: an iteration-based run (sampler=...) is steps=N long; pass "
                         "no epochs")
    if steps is None:
        raise TypeError("steps: expected the run's number of optimizer steps with sampler=...")


def plan_fit(model, loss, optimizer, X=None, Y=None, *, epochs=None, batch_size=None,
             shuffle=True, rng=0, validation=None, progress=True, callbacks=(),
             scheduler=None, scheduler_interval="epoch", clip_grad_norm=None,
             resume_from=None, sampler=None, steps=None, eval_every=None,
             log_every=None) -> FitPlan:
    """Every check of ``fit``'s arguments and the whole data set; changes nothing."""
    check_model(model)
    check_loss(loss)
    _check_optimizer(optimizer, model)
    _check_mode(X, Y, epochs, steps, sampler, eval_every)
    if sampler is None:
        check_data(model, loss, X, Y)
        epochs = check_int("epochs", epochs, 0)
        bs = batch_size_for(batch_size, X.shape[0])
        shuffle = check_bool("shuffle", shuffle)
    else:
        steps, eval_every, bs = _check_sampler(model, loss, sampler, steps, eval_every,
                                               batch_size)
        epochs, shuffle = -(-steps // eval_every), False
        if isinstance(getattr(sampler, "rng", None), np.random.Generator):
            rng = sampler.rng  # its state is the run's: saved and restored with it
    val_bs = None
    if validation is not None:
        if not isinstance(validation, (tuple, list)) or len(validation) != 2:
            raise TypeError("validation: expected a pair (X_val, Y_val)")
        check_data(model, loss, *validation, what="validation ")
        val_bs = batch_size_for(bs, validation[0].shape[0])
    if log_every is not None:
        log_every = check_int("log_every", log_every, 1)
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
        if sampler is not None and not isinstance(getattr(sampler, "rng", None),
                                                  np.random.Generator):
            raise ValueError("resume_from: the sampler has no Generator (rng) to continue "
                             "from; an iteration-based run resumes with one (RandomWindows)")
        per_epoch = X.shape[0] if sampler is None else eval_every * (bs or 1)
        resume = prepare_resume(resume_from, model, optimizer, {
            "epochs": epochs, "scheduler": scheduler, "rng": gen, "callbacks": callbacks,
            "samples": per_epoch, "batch_size": bs or 1,
            "shuffled": shuffle and bs != per_epoch})
    return FitPlan(epochs=epochs, batch_size=bs, shuffle=shuffle, rng=gen,
                   validation=None if validation is None else tuple(validation),
                   val_batch_size=val_bs, progress=progress, callbacks=tuple(callbacks),
                   scheduler=scheduler, scheduler_interval=scheduler_interval,
                   clip_grad_norm=clip_grad_norm, classify=classify, resume=resume,
                   log_every=log_every, sampler=sampler, steps=steps, eval_every=eval_every)

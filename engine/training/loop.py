"""The training loop: ``fit`` (mini-batches, shuffling, validation, progress, a stop on a
non-finite loss, learning-rate schedules, gradient clipping, callbacks), ``evaluate`` and
``predict``.

``fit`` checks its options once into a ``FitPlan`` (engine/training/plan.py), then runs
epochs of steps: ``_Batches`` gives each step's rows, ``_Step`` trains on them, ``_end_epoch``
records the epoch and asks the callbacks whether to stop. The processes that train together
are one object with the data-parallel interface (``SingleProcess`` for one process).

Mini-batches are gathered into one preallocated buffer (``np.take(..., out=)``), so a steady
epoch allocates no batch-sized arrays; the model's own work buffers do the rest.
"""
from __future__ import annotations

import contextlib
import math
import time

import numpy as np

from ..data.entry import as_eval_arrays, as_fit_arrays, as_inputs
from ..nn.calls import takes_input_grad
from ..nn.losses import CrossEntropyLoss
from ..optim.interrupt import count_keyboard_interrupts
from ..optim.optimizers import defer_keyboard_interrupt
from .checks import batch_size_for, check_data, check_loss, check_model, check_x
from .history import History, NonFiniteLossError, TrainingInterrupted
from .metrics import Hits, mean_absolute_error, r2_score, scored_rows
from .parallel import SingleProcess, processes
from .plan import FitPlan, plan_fit
from .progress import Progress
from .resume import RunState

__all__ = ["fit", "evaluate", "predict", "History", "NonFiniteLossError", "TrainingInterrupted",
           "r2_score", "mean_absolute_error", "FitPlan", "plan_fit"]


def evaluate(model, loss, X, Y, batch_size=None):
    """``(mean loss, accuracy or None)`` of ``model`` on ``(X, Y)`` in eval mode (the model's
    mode is restored afterwards). Accuracy is given for ``CrossEntropyLoss``. ``X`` and ``Y``
    may be any real-valued array-like, converted once as ``fit`` converts them. Every argument
    is checked before the model is touched (NaN inputs are allowed: they give a NaN loss)."""
    X, Y = as_eval_arrays(model, loss, X, Y)  # array-likes: one converted copy, see fit
    check_model(model)
    check_loss(loss)
    check_data(model, loss, X, Y, finite=False)
    bs = batch_size_for(batch_size, X.shape[0])
    with model.exclusive("evaluate"):
        return _evaluate(model, loss, X, Y, bs)


def _evaluate(model, loss, X, Y, bs):
    n = X.shape[0]
    was_training = model.training
    classify = isinstance(loss, CrossEntropyLoss)
    hits, total, hit, rows = Hits(), 0.0, 0, 0
    try:
        model.eval()
        for s in range(0, n, bs):  # row slices of C-contiguous arrays: views, no copies
            xb, yb = X[s:s + bs], Y[s:s + bs]
            pred = model.forward(xb)
            total += loss.forward(pred, yb) * xb.shape[0]
            if classify:
                hit += hits.count(pred, yb)
                rows += scored_rows(pred)
    finally:
        model.train(was_training)
    return total / n, (hit / rows if classify else None)


def predict(model, X, batch_size=None) -> np.ndarray:
    """The model's outputs for ``X`` in eval mode, as a new array (the model's mode is
    restored afterwards). ``X`` may be any real-valued array-like, converted once as ``fit``
    converts it. ``batch_size`` bounds the work buffers (``None``: all at once)."""
    X = as_inputs(model, X)  # array-likes: one converted copy, see fit
    check_model(model)
    if not isinstance(X, np.ndarray):
        raise TypeError(f"X: expected a numpy.ndarray, got {type(X).__name__}")
    if X.ndim == 0 or X.shape[0] == 0:
        raise ValueError(f"X: expected at least one sample, got shape {X.shape}")
    check_x(model, X, "X", finite=False)
    n = X.shape[0]
    bs = batch_size_for(batch_size, n)
    with model.exclusive("predict"):
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


def fit(model, loss, optimizer, X=None, Y=None, *, epochs=None, comm=None,
        **options) -> History:
    """Train ``model`` on ``(X, Y)`` until epoch ``epochs``, or for ``steps`` optimizer steps
    on the batches of a ``sampler``; return the ``History``.

    ``epochs`` is the run's total (Keras's): a run resumed after k epochs trains epochs
    k+1..``epochs``. Each step: forward, ``loss.forward``, a finiteness check, ``loss.backward``,
    ``model.backward(dy, input_grad=False)``, ``optimizer.step()``, ``model.zero_grad()``.

    Iteration-based (nanoGPT's loop): ``fit(model, loss, opt, sampler=RandomWindows(ids,
    block_size, batch_size, rng), steps=N, eval_every=k, validation=(Xv, Yv))`` draws each
    step's batch from ``sampler.sample()`` (or ``next(sampler)``); every ``eval_every``
    steps (default: a tenth of the run) ends as an epoch does: validation, a History row,
    the callbacks, a progress line. Same sampler seed, same batches, same weights. With
    ``comm`` every rank draws the same global batch (the same sampler seed on every rank)
    and trains on its share.

    The options (keyword only: ``batch_size``, ``shuffle``, ``rng``, ``validation``,
    ``progress``, ``log_every``, ``callbacks``, ``scheduler``, ``scheduler_interval``,
    ``clip_grad_norm``, ``resume_from``, ``sampler``, ``steps``, ``eval_every``) are
    described on ``FitPlan``, which they are checked into; ``comm``, an MPI communicator,
    trains data parallel over its ranks, ``batch_size`` being the global batch
    (``engine.distributed``; every rank gets the same History, rank 0 prints).

    ``X``, ``Y`` and the validation pair may be any real-valued array-like (float64 for a
    float32 model, ``X[:, :4]``, a list, a ``(N,)`` target), converted once on entry: one copy
    of the data set unless already C-contiguous of the model's dtype (``engine.data.entry``).
    Every argument and the whole data set are checked before anything changes: a rejected
    call leaves the parameters, gradients, optimizer and the model's mode as they were.

    A NaN/inf loss raises ``NonFiniteLossError`` naming the epoch and step before that
    step's update, so the model keeps the parameters of the last good step (the History so
    far is on the exception). Ctrl-C raises ``TrainingInterrupted`` (a KeyboardInterrupt) at
    the end of the step (or epoch start or end) it arrived in: the update is applied whole,
    the gradients are zeroed, the History so far is on the exception, and its
    ``save(path)`` writes a checkpoint that ``resume_from`` continues. The model is left in
    training mode.
    """
    run = RunState(History())  # how far the run got: what a Ctrl-C reports and saves
    # Over MPI a Ctrl-C is only counted; the ranks agree at every step whether to stop.
    signals = None if comm is None else count_keyboard_interrupts()
    try:
        with signals or contextlib.nullcontext():
            ranks = processes(comm)
            X, Y, options = ranks.checked(lambda: _entry(model, loss, X, Y, options))
            plan = ranks.checked(lambda: plan_fit(model, loss, optimizer, X, Y,
                                                  epochs=epochs, **options))
            run.epochs = plan.epochs
            with model.exclusive("fit"):
                return _train(run, ranks, model, loss, optimizer, X, Y, plan,
                              signals=signals)
    except KeyboardInterrupt:
        raise _interrupted(run, model) from None


def _entry(model, loss, X, Y, options) -> tuple:
    """The training set and validation pair converted (``engine.data.entry``); an
    iteration-based run's batches come from its sampler as they are."""
    if options.get("sampler") is None:
        return as_fit_arrays(model, loss, X, Y, options)
    val = options.get("validation")
    if isinstance(val, (tuple, list)) and len(val) == 2:
        options = {**options, "validation": as_eval_arrays(model, loss, *val, "validation ")}
    return X, Y, options


def _interrupted(run: RunState, model) -> TrainingInterrupted:
    """The TrainingInterrupted of a Ctrl-C: where the run stopped and what it holds."""
    h = run.h
    if run.started:
        with defer_keyboard_interrupt():
            model.zero_grad()  # a half-accumulated gradient belongs to no step
            model.train()      # as fit leaves it (also if a validation pass was cut)
        if not run.epoch:
            where = "before the first step"
        elif run.plan.sampler is not None:  # an iteration-based run: its periods are no epochs
            where = f"after step {h.steps}/{run.plan.steps}"
        else:
            where = f"at epoch {run.epoch}/{run.epochs}, step {run.step}/{run.steps_per_epoch}"
        text = (f"training interrupted (Ctrl-C) {where}: the model and the optimizer hold "
                f"the state after optimizer step {h.steps}, the last complete one "
                f"(gradients zeroed, training mode); the exception's .history holds the "
                f"{len(h)} completed epoch(s), and its .save(path) writes a checkpoint that "
                f"fit(..., resume_from=path) continues")
    else:
        text = "training interrupted (Ctrl-C) before it started: nothing was changed"
    return TrainingInterrupted(text, h, run.epoch, run.step, run if run.started else None)


def _train(run, ranks, model, loss, optimizer, X, Y, plan: FitPlan, *,
           signals=None) -> History:
    """The epochs of a checked run, with its callbacks' begin and end. Each part of an epoch
    (its start, each step, its end) runs whole with Ctrl-C held to its end, so an interrupt
    always leaves the run at a point a checkpoint can continue from (over MPI, ``signals``
    counts this rank's Ctrl-Cs and every rank stops at the same such point)."""
    h = run.h
    dp, bar = SingleProcess(), Progress(False, plan.epochs)  # until the ranks have met
    try:
        dp = ranks.start(model, optimizer, X, Y, plan)  # data parallel: the ranks agree
        batches = (_Batches(X, Y, plan, dp) if plan.sampler is None
                   else _Sampled(plan, model, loss, dp))
        bar = Progress(plan.progress if dp.rank == 0 else False, plan.epochs,
                       batches.n, batches.bs or 1, steps=plan.steps)
        run.steps_per_epoch = batches.steps
        step = _Step(model, loss, optimizer, plan, dp, h)
        step.stop = _AgreedStop(signals, dp)  # (the ranks' Ctrl-Cs: stop together)
        run.attach(model, optimizer, plan, batches, step, dp)
        _begin_callbacks(run, plan, model, optimizer)
        with defer_keyboard_interrupt():  # a resumed run is put in place whole
            if plan.resume is not None:
                plan.resume.apply(run)
                step.rows_seen = run.step * (batches.bs or 1) if run.in_epoch else 0
            run.started = True
            model.train()
            model.zero_grad()
        t_start = time.perf_counter() - h.seconds  # a resumed run's rate and ETA: whole run
        for epoch in range(len(h) + 1, plan.epochs + 1):  # a resumed run: from its next epoch
            if _epoch(run, step, batches, bar, epoch, t_start):
                break
        dp.finish()
        for cb in plan.callbacks:
            end = getattr(cb, "on_train_end", None)
            if end is not None:
                end(model, optimizer, plan.scheduler)
    except Exception as exc:  # (a KeyboardInterrupt goes to fit, which reports it from run)
        if isinstance(exc, NonFiniteLossError):
            exc.history = h
        dp.fail(exc)  # meet the other ranks in their next collective step
        raise
    finally:
        bar.close()
    return h


def _epoch(run, step, batches, bar, epoch: int, t_start: float) -> bool:
    """Epoch ``epoch`` (an iteration-based run: its period of steps) from where ``run`` is;
    whether a callback asked to stop."""
    h, log_every = run.h, step.plan.log_every
    run.epoch = epoch
    with defer_keyboard_interrupt():
        if not run.in_epoch:  # (a run resumed mid-epoch has its order and sums)
            step.begin_epoch()
            batches.shuffle()
            run.in_epoch, run.step = True, 0
    steps = batches.steps_in(epoch)
    for i in range(run.step + 1, steps + 1):
        with defer_keyboard_interrupt():
            step(*batches.batch(i), epoch, i, steps)
            run.step = i
        step.stop.after_step()
        if log_every and h.steps % log_every == 0:
            bar.log(h.steps, *step.take_log())
        if bar.per_step:  # a terminal: the line within the epoch (nothing off one)
            bar.step(epoch, i, step.total, step.rows_seen)
    with defer_keyboard_interrupt():
        stop = step.end_epoch(epoch)
        run.end_epoch()  # the checkpoints callbacks asked for, with their states
        bar.update(epoch, h, time.perf_counter() - t_start, last=stop)
    step.stop.at_epoch_end()
    return stop


class _AgreedStop:
    """Over MPI, whether any rank got a Ctrl-C, agreed so every rank stops after the same
    step with the same parameters: each step's rank count rides in the step's loss
    agreement (``batch_loss``: no extra collective), and once more at each epoch's end (a
    Ctrl-C during validation). On one process (``signals`` None) the step's loss is
    ``dp.batch_loss``'s and Ctrl-C is raised where the loop held it."""

    __slots__ = ("signals", "dp", "pending")

    def __init__(self, signals, dp):
        self.signals, self.dp, self.pending = signals, dp, False

    def batch_loss(self, value: float, rows: int) -> tuple:
        """``dp.batch_loss(value, rows)``, over MPI with the ranks' Ctrl-C count summed in
        the same agreement (``DataParallel.batch_loss``'s arithmetic)."""
        if self.signals is None:
            return self.dp.batch_loss(value, rows)
        total, n, got = self.dp.allsum(value * rows, rows, float(self.signals.count))
        self.pending = got > 0
        return total / n, int(n)

    def after_step(self) -> None:
        if self.pending:
            raise KeyboardInterrupt

    def at_epoch_end(self) -> None:
        if self.signals is not None and self.dp.allsum(float(self.signals.count))[0] > 0:
            raise KeyboardInterrupt


def _begin_callbacks(run, plan, model, optimizer) -> None:
    """Give each callback the run (``set_run``) and call its ``on_train_begin`` (first: one
    that rejects its setup leaves the model as it was)."""
    for cb in plan.callbacks:
        set_run = getattr(cb, "set_run", None)
        if set_run is not None:
            set_run(run)
        begin = getattr(cb, "on_train_begin", None)
        if begin is not None:
            begin(model, optimizer, plan.scheduler)


class _Batches:
    """The rows of each step of an epoch: views of ``(X, Y)`` in order, or, shuffled, the
    epoch's order gathered into two preallocated buffers; with several processes, this
    process's share of each global batch."""

    def __init__(self, X, Y, plan: FitPlan, dp):
        n, bs = X.shape[0], plan.batch_size
        self.X, self.Y, self.n, self.bs, self.dp, self.rng = X, Y, n, bs, dp, plan.rng
        self.steps = -(-n // bs)
        self.gather = plan.shuffle and bs != n
        if self.gather:
            self.identity = np.arange(n)                           # (N,) 0..N-1
            self.order = np.empty_like(self.identity)              # (N,) this epoch's order
            self.xbuf = np.empty((bs,) + X.shape[1:], X.dtype)     # (bs, ...) gathered batch
            self.ybuf = np.empty((bs,) + Y.shape[1:], Y.dtype)     # (bs, ...) its targets

    def steps_in(self, epoch: int) -> int:
        return self.steps

    def shuffle(self) -> None:
        # Shuffle a fresh 0..N-1 each epoch, so the order depends only on the Generator's
        # state (a run resumed with that state continues identically).
        if self.gather:
            np.copyto(self.order, self.identity)
            self.rng.shuffle(self.order)

    def batch(self, step: int) -> tuple:
        s, e = self.dp.share((step - 1) * self.bs, min(step * self.bs, self.n))
        if self.gather:
            idx = self.order[s:e]
            m = idx.shape[0]
            # mode="clip" lets take write straight into out (mode="raise" buffers).
            return (np.take(self.X, idx, axis=0, out=self.xbuf[:m], mode="clip"),
                    np.take(self.Y, idx, axis=0, out=self.ybuf[:m], mode="clip"))
        if s == 0 and e == self.n:  # the full batch on one process: the arrays themselves
            return self.X, self.Y
        return self.X[s:e], self.Y[s:e]


class _Sampled:
    """The batches of an iteration-based run: each step's drawn from the sampler (checked as
    data unless the sampler vouched for them with ``example()``); its epochs are periods of
    ``eval_every`` steps, the last one shorter if ``eval_every`` does not divide ``steps``."""
    gather = False

    def __init__(self, plan: FitPlan, model, loss, dp):
        sampler = plan.sampler
        self.dp = dp  # every rank draws the same global batch and trains on its share
        self.plan, self.total, self.steps = plan, plan.steps, plan.eval_every
        self.bs = getattr(sampler, "batch_size", None)
        self.n = self.steps * (self.bs or 1)  # rows per period (for the progress line)
        draw = getattr(sampler, "sample", None)
        self.draw = draw if callable(draw) else sampler.__next__
        self.check = not callable(getattr(sampler, "example", None))
        self.model, self.loss = model, loss
        self.drawn = 0  # batches drawn by this call of fit

    def steps_in(self, epoch: int) -> int:
        return min(self.steps, self.total - (epoch - 1) * self.steps)

    def shuffle(self) -> None:
        pass

    def batch(self, step: int) -> tuple:
        try:
            xb, yb = self.draw()
        except StopIteration:
            raise ValueError(f"sampler: the iterator ended after {self.drawn} batch(es); the "
                             f"run needs {self.total} steps") from None
        self.drawn += 1
        if self.check:
            check_data(self.model, self.loss, xb, yb, what="sampler's ")
        lo, hi = self.dp.share(0, xb.shape[0])
        return (xb, yb) if hi - lo == xb.shape[0] else (xb[lo:hi], yb[lo:hi])


class _Step:
    """One training step on a batch (a call), and the start and end of an epoch: its running
    loss and hits, its History row, its callbacks."""

    def __init__(self, model, loss, optimizer, plan: FitPlan, dp, history: History):
        self.model, self.loss, self.optimizer, self.plan = model, loss, optimizer, plan
        self.dp, self.h, self.hits = dp, history, Hits()
        self.groups = getattr(optimizer, "param_groups", None)
        # The optimizer zeroes the gradients inside its update pass, while they are in cache,
        # when it updates exactly the model's parameters; otherwise model.zero_grad() after it.
        self.fused_zero = self.groups is not None and _same_parameters(optimizer, model)
        # The batch is data: its gradient is never read, so the first layer's input-gradient
        # GEMM is left out where the model's backward takes input_grad (as every blasnet one).
        self.backward_options = {"input_grad": False} if takes_input_grad(model) else {}
        self.per_step = plan.scheduler_steps_every("step")
        self.begin_epoch()
        self._log = [0.0, 0, time.perf_counter()]  # loss sum, rows, clock since the last line
        self.lr = None  # the first group's rate at the last update
        self.stop = _AgreedStop(None, dp)

    def begin_epoch(self) -> None:
        """Start an epoch's clock, rate (the first parameter group's, None: no groups) and
        running figures."""
        self.t0 = time.perf_counter()
        self.lr0 = float(self.groups[0]["lr"]) if self.groups else None
        self.total, self.hit, self.rows, self.rows_seen = 0.0, 0, 0, 0

    def take_log(self) -> tuple:
        """``(mean loss, learning rate, seconds per step)`` since the last call (the log
        line every ``log_every`` steps), and start the next interval."""
        total, rows, t0 = self._log
        now = time.perf_counter()
        self._log = [0.0, 0, now]
        return total / max(rows, 1), self.lr, (now - t0) / self.plan.log_every

    def __call__(self, xb, yb, epoch: int, step: int, steps: int) -> None:
        model, dp, h = self.model, self.dp, self.h
        rows = xb.shape[0]  # 0: this rank's share of a batch smaller than the ranks is empty
        pred = model.forward(xb) if rows else None
        # the global batch's mean loss and rows, on every process
        value, m = self.stop.batch_loss(self.loss.forward(pred, yb) if rows else 0.0, rows)
        if not math.isfinite(value):
            raise NonFiniteLossError(
                f"non-finite loss ({value}) at epoch {epoch}/{self.plan.epochs}, step "
                f"{step}/{steps} (optimizer step {h.steps + 1}); the model "
                f"keeps the parameters of the last good step. A lower learning rate, "
                f"gradient clipping or float64 may help.", epoch, step, value)
        if self.plan.classify and rows:
            self.hit += self.hits.count(pred, yb)
            self.rows += scored_rows(pred)
        weight = None if m % dp.size == 0 else rows / m  # this process's share of the batch
        dp.begin_backward(weight)  # (gradient buckets: reductions start during the backward)
        if rows:  # (without rows the gradient stays zero: the rank adds nothing to the sum)
            model.backward(self.loss.backward(), **self.backward_options)
        # the gradient of the global batch, on every process
        dp.reduce_gradients(weight)
        if self.plan.clip_grad_norm is not None:  # the global gradient's norm
            dp.clip_grad_norm(self.plan.clip_grad_norm)
        # (the loop holds Ctrl-C to the end of the step: the update and its bookkeeping
        # are applied whole)
        if self.groups:  # the rate of this update, for the log line
            self.lr = self.groups[0]["lr"]
        if self.fused_zero:
            self.optimizer.step(zero_grad=True)
        else:
            self.optimizer.step()
            model.zero_grad()
        if self.per_step:
            self.plan.scheduler.step()
        self.total += value * m
        self.rows_seen += m
        self._log[0] += value * m
        self._log[1] += m
        h.steps += 1
        h.samples += m

    def end_epoch(self, epoch: int) -> bool:
        """Record the epoch (validation, the History row, a per-epoch scheduler step) and ask
        every callback; return whether one asked to stop."""
        plan, h = self.plan, self.h
        hit, rows = self.hit, self.rows
        if plan.classify:  # every process's hits
            hit, rows = self.dp.allsum(hit, rows)
        vl = va = None
        if plan.validation is not None:
            vl, va = _evaluate(self.model, self.loss, *plan.validation, plan.val_batch_size)
        # the epoch's History row (whole or absent: the loop holds Ctrl-C)
        if self.lr0 is not None:
            h.lr.append(self.lr0)
        h.loss.append(self.total / max(self.rows_seen, 1))
        if plan.classify:
            h.accuracy.append(hit / rows)
        if vl is not None:
            h.val_loss.append(vl)
            if va is not None:
                h.val_accuracy.append(va)
        h.epoch_time.append(time.perf_counter() - self.t0)
        if plan.scheduler_steps_every("epoch"):
            plan.scheduler.step()
        stop = False
        for cb in plan.callbacks:  # every callback sees every epoch, as in Keras
            stop = bool(cb.on_epoch_end(epoch, h)) or stop
        return stop


def _same_parameters(optimizer, model) -> bool:
    """Whether ``optimizer`` (an engine optimizer) updates exactly ``model``'s parameters."""
    from ..optim.optimizers import Optimizer
    if not isinstance(optimizer, Optimizer):
        return False
    own = {id(p) for g in optimizer.param_groups for p in g["params"]}
    return own == {id(p) for p in model.parameters()}

"""A ``fit`` run's resumable state, and continuing a run from a checkpoint of it.

``RunState`` follows a run (its History, the epoch and step it is at, that epoch's running
sums and order) and writes a checkpoint of it (``.npz``): the model, optimizer and scheduler
as ``save`` does, plus the state of every random Generator the run draws from (the shuffle's
and each dropout's, saved once per distinct Generator), the epoch's order and running sums
when it stops mid-epoch, the History and each callback's ``state_dict()``.

``prepare_resume`` reads such a checkpoint and checks it against a new run (the same
architecture, optimizer, scheduler, Generators and callbacks, ``epochs`` still ahead) before
anything changes; ``ResumePoint.apply`` then puts the run where the checkpoint left it, so
that a run continued from it equals the uninterrupted run bit for bit (on one thread).
"""
from __future__ import annotations

import os
import time

import numpy as np

from . import checkpoint

__all__ = ["RunState", "ResumePoint", "prepare_resume", "STATE_VERSION"]

STATE_VERSION = 1
_SHUFFLE = "(shuffle)"  # the layout's name for fit's shuffling Generator
_HISTORY_LISTS = ("loss", "accuracy", "val_loss", "val_accuracy", "lr", "epoch_time")


# ----------------------------------------------------------------------------- encoding
def _encode(value, arrays: dict):
    """``value`` as JSON, each array in it moved to ``arrays`` and named by a reference."""
    if isinstance(value, np.ndarray):
        key = str(len(arrays))
        arrays[key] = value
        return {"__array__": key}
    if isinstance(value, dict):
        return {str(k): _encode(v, arrays) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_encode(v, arrays) for v in value]
    if isinstance(value, np.generic):
        return value.item()
    return value


def _decode(value, arrays: dict, path: str):
    if isinstance(value, dict):
        if set(value) == {"__array__"}:
            key = checkpoint.TRAIN + str(value["__array__"])
            if key not in arrays:
                raise checkpoint.CheckpointError(f"{path}: corrupt training state (no array "
                                                 f"{key!r})")
            return arrays[key]
        return {k: _decode(v, arrays, path) for k, v in value.items()}
    if isinstance(value, list):
        return [_decode(v, arrays, path) for v in value]
    return value


def generator_layout(model, shuffle_rng) -> tuple:
    """``({name: index}, [Generator])``: the distinct Generators of a run (the shuffle's
    first, then the model's in module order) and which one each name draws from."""
    layout, distinct, index = {}, [], {}
    for name, g in [(_SHUFFLE, shuffle_rng)] + list(model.named_generators()):
        i = index.setdefault(id(g), len(distinct))
        if i == len(distinct):
            distinct.append(g)
        layout[name or "(model)"] = i
    return layout, distinct


# ----------------------------------------------------------------------------- the state
class RunState:
    """Where a ``fit`` run is. ``epoch``/``step``: the epoch in progress and the steps of it
    completed (for messages); ``in_epoch``: an epoch has begun (its order drawn) and not
    ended. ``save(path, **metadata)`` writes a checkpoint that ``fit(..., resume_from=path)``
    continues; ``save_after_epoch`` does so once every callback has seen the epoch."""

    def __init__(self, history):
        self.h = history
        self.epochs = self.steps_per_epoch = 0
        self.epoch = self.step = 0
        self.started = self.in_epoch = False
        self.model = self.optimizer = self.plan = self.batches = self.sums = None
        self.processes = None
        self._pending = []

    def attach(self, model, optimizer, plan, batches, sums, processes=None) -> None:
        """The run's parts, once checked and built: ``sums`` holds the epoch's running
        figures (``total``, ``hit``, ``rows``, ``lr0``, ``t0``); ``processes``: the
        data-parallel object that writes its checkpoints (rank 0 only over MPI)."""
        self.model, self.optimizer, self.plan = model, optimizer, plan
        self.batches, self.sums, self.processes = batches, sums, processes

    def state(self) -> tuple:
        """``(JSON object, {name: array})``: the run's resumable state now."""
        plan, b, h, arrays = self.plan, self.batches, self.h, {}
        layout, gens = generator_layout(self.model, plan.rng)
        doc = {"version": STATE_VERSION, "epochs_done": len(h), "in_epoch": self.in_epoch,
               "step": self.step if self.in_epoch else 0, "samples": b.n,
               "batch_size": b.bs, "shuffled": bool(b.gather),
               "generators": {"layout": layout,
                              "states": [_encode(g.bit_generator.state, arrays) for g in gens]},
               "history": {**{k: [float(x) for x in getattr(h, k)] for k in _HISTORY_LISTS},
                           "steps": h.steps, "samples": h.samples},
               "callbacks": _callback_states(plan.callbacks, arrays)}
        if self.in_epoch:
            s = self.sums
            doc["epoch_sums"] = {"total": s.total, "hit": int(s.hit), "rows": int(s.rows),
                                 "lr0": s.lr0, "seconds": time.perf_counter() - s.t0}
            if b.gather:
                doc["order"] = _encode(b.order.copy(), arrays)
        return doc, arrays

    def save(self, path, **metadata) -> None:
        """Write a checkpoint of the run now (an ``.npz`` path: resumable; ``.safetensors``:
        the parameters only)."""
        if self.model is None:
            raise RuntimeError("the run had not started: there is nothing to save")
        if os.fspath(path).lower().endswith(checkpoint.SAFETENSORS):
            parts = (None, None, metadata, None)  # the parameters only
        else:
            parts = (self.optimizer, self.plan.scheduler, metadata, self.state())
        if self.processes is not None:  # over MPI: collective, rank 0 writes
            self.processes.write_checkpoint(path, self.model, *parts)
            return
        checkpoint.write(path, self.model, *parts)

    def save_after_epoch(self, path, **metadata) -> None:
        """``save`` once the epoch has ended for every callback (so the checkpoint holds every
        callback's state after this epoch)."""
        self._pending.append((path, metadata))

    def end_epoch(self) -> None:
        """The epoch has ended for every callback: write the checkpoints asked for."""
        self.in_epoch, self.step = False, 0
        pending, self._pending = self._pending, []
        for path, metadata in pending:
            self.save(path, **metadata)


def _callback_states(callbacks, arrays: dict) -> list:
    """Each callback's ``state_dict()`` (those that have one), with its type and its rank
    among the run's callbacks of that type."""
    out, seen = [], {}
    for cb in callbacks:
        name = type(cb).__name__
        seen[name] = seen.get(name, -1) + 1
        get = getattr(cb, "state_dict", None)
        if callable(get):
            out.append({"type": name, "index": seen[name], "state": _encode(get(), arrays)})
    return out


# ----------------------------------------------------------------------------- resuming
class ResumePoint:
    """A checkpoint of a run, checked against a new one; ``apply(run)`` puts the run there."""

    def __init__(self, path, prepared, doc, callback_states, generator_states):
        self.path, self.prepared, self.doc = path, prepared, doc
        self.callback_states, self.generator_states = callback_states, generator_states

    @property
    def epochs_done(self) -> int:
        return self.doc["epochs_done"]

    def apply(self, run: RunState) -> None:
        """Load the model, optimizer and scheduler, the Generators' states, the History, the
        callbacks' states and a begun epoch's order and sums (nothing here can fail: every
        check ran in ``prepare_resume``)."""
        self.prepared.apply()
        _, gens = generator_layout(run.model, run.plan.rng)
        for g, st in zip(gens, self.generator_states):
            g.bit_generator.state = st
        saved = self.doc["history"]
        for k in _HISTORY_LISTS:
            getattr(run.h, k)[:] = saved[k]
        run.h.steps, run.h.samples = saved["steps"], saved["samples"]
        for cb, st in self.callback_states:
            cb.load_state_dict(st)
        if self.doc["in_epoch"]:
            sums, s = run.sums, self.doc["epoch_sums"]
            sums.total, sums.hit, sums.rows, sums.lr0 = s["total"], s["hit"], s["rows"], s["lr0"]
            sums.t0 = time.perf_counter() - s["seconds"]
            if run.batches.gather:
                np.copyto(run.batches.order, self.doc["order"])
            run.in_epoch, run.step = True, self.doc["step"]


def _fail(path: str, why: str):
    return ValueError(f"resume_from: {path}: {why}")


def prepare_resume(path, model, optimizer, plan_options: dict) -> ResumePoint:
    """Read the checkpoint at ``path`` and check it against the run about to start
    (``plan_options``: epochs, scheduler, rng, callbacks, samples, batch_size, shuffled);
    ValueError naming what differs, before anything changes."""
    from ..models.config import ConfigError, to_config
    from ..optim.optimizers import Optimizer
    try:
        path = os.fspath(path)
    except TypeError:
        raise TypeError(f"resume_from: expected a checkpoint's path (str or os.PathLike), got "
                        f"{type(path).__name__}") from None
    if not isinstance(optimizer, Optimizer):
        raise TypeError(f"resume_from: needs an engine optimizer (AdamW, SGD), got "
                        f"{type(optimizer).__name__}")
    header = checkpoint.read_header(path)
    if header.get("training") is None:
        raise _fail(path, "the checkpoint holds no training state (written by save(), or a "
                          ".safetensors file); a checkpoint of a fit run (ModelCheckpoint to "
                          "an .npz file, or an interrupted run's) does")
    try:
        own = to_config(model)
    except ConfigError:
        own = None
    if own is not None and header.get("model_config") not in (None, own):
        raise _fail(path, f"the checkpoint is of another architecture: "
                          f"{_describe(header['model_config'])}, the model is {_describe(own)}")
    scheduler = plan_options["scheduler"]
    if (header.get("scheduler") is None) != (scheduler is None):
        has = "has a scheduler" if scheduler is None else "has none"
        raise _fail(path, f"the checkpoint's run {has}; pass the same scheduler as that run")
    try:
        prepared = checkpoint.prepare_load(path, model, optimizer, scheduler)
    except checkpoint.CheckpointError as e:
        raise _fail(path, str(e).removeprefix(f"{path}: ")) from None
    doc = prepared.header["training"]
    _check_state(path, doc, plan_options)
    arrays = prepared.arrays
    gens = _checked_generators(path, doc, model, plan_options["rng"], arrays)
    cbs = _checked_callbacks(path, doc, plan_options["callbacks"], arrays)
    if doc["in_epoch"] and plan_options["shuffled"]:
        doc["order"] = _checked_order(path, _decode(doc.get("order"), arrays, path),
                                      plan_options["samples"])
    return ResumePoint(path, prepared, doc, cbs, gens)


def _describe(node) -> str:
    if isinstance(node, dict):
        return f"{node.get('type')} {node.get('config')}"
    return repr(node)


def _check_state(path: str, doc, opts: dict) -> None:
    """The training state's fields, and the run's options a begun epoch needs unchanged."""
    keys = ("version", "epochs_done", "in_epoch", "step", "samples", "batch_size",
            "shuffled", "generators", "history", "callbacks")
    if not isinstance(doc, dict) or any(k not in doc for k in keys) \
            or doc["version"] != STATE_VERSION:
        raise checkpoint.CheckpointError(f"{path}: corrupt or unknown training state")
    ints = {k: doc[k] for k in ("epochs_done", "step", "samples", "batch_size")}
    if any(type(v) is not int or v < 0 for v in ints.values()) \
            or type(doc["in_epoch"]) is not bool or type(doc["shuffled"]) is not bool:
        raise checkpoint.CheckpointError(f"{path}: corrupt training state ({ints}, in_epoch "
                                         f"{doc['in_epoch']!r}, shuffled {doc['shuffled']!r})")
    done, epochs = doc["epochs_done"], opts["epochs"]
    hist = doc["history"]
    if not isinstance(hist, dict) or any(not isinstance(hist.get(k), list) or
                                         len(hist[k]) not in (0, done) for k in _HISTORY_LISTS) \
            or len(hist["loss"]) != done or len(hist["epoch_time"]) != done \
            or any(type(hist.get(k)) is not int for k in ("steps", "samples")):
        raise checkpoint.CheckpointError(f"{path}: corrupt training state (its History does "
                                         f"not hold {done} epochs)")
    for k in _HISTORY_LISTS:  # numbers (NaN and inf included: a diverged epoch's loss)
        bad = [v for v in hist[k] if type(v) not in (int, float)]
        if bad:
            raise checkpoint.CheckpointError(f"{path}: corrupt training state (its History's "
                                             f"{k} holds {_short(bad[0])}, not a number)")
    if epochs <= done:
        raise _fail(path, f"epochs={epochs} is the run's total number of epochs and the "
                          f"checkpoint has completed {done}; pass epochs > {done}")
    if doc["in_epoch"]:
        for key in ("samples", "batch_size", "shuffled"):
            if doc[key] != opts[key]:
                raise _fail(path, f"the checkpoint stopped inside epoch {done + 1} of a run "
                                  f"with {key}={doc[key]}, this run has {key}={opts[key]}; "
                                  f"resume a run stopped mid-epoch with the same data and "
                                  f"batch size")
        sums = doc.get("epoch_sums")
        steps = -(-opts["samples"] // opts["batch_size"])
        if not isinstance(sums, dict) or doc["step"] > steps or any(
                not isinstance(sums.get(k), (int, float)) or isinstance(sums.get(k), bool)
                for k in ("total", "hit", "rows", "seconds")):
            raise checkpoint.CheckpointError(f"{path}: corrupt training state (the epoch's "
                                             f"step {doc['step']} of {steps}, sums {sums})")


def _short(v) -> str:
    """``repr(v)`` cut to 40 characters (a file's value in a message)."""
    text = repr(v)
    return text if len(text) <= 40 else text[:37] + "..."


def _checked_generators(path: str, doc, model, rng, arrays) -> list:
    layout, gens = generator_layout(model, rng)
    saved = doc["generators"]
    if not isinstance(saved, dict) or saved.get("layout") != layout:
        raise _fail(path, f"the run's random Generators differ from the checkpoint's (the "
                          f"model's dropout modules and the shuffle draw from {layout}, the "
                          f"checkpoint's from {saved.get('layout') if isinstance(saved, dict) else saved})")
    states = [_decode(s, arrays, path) for s in saved.get("states") or []]
    if len(states) != len(gens):
        raise checkpoint.CheckpointError(f"{path}: corrupt training state (generators)")
    for g, st in zip(gens, states):
        kind = type(g.bit_generator).__name__
        if not isinstance(st, dict) or st.get("bit_generator") != kind:
            raise _fail(path, f"a Generator of the run is a {kind}, the checkpoint's a "
                              f"{st.get('bit_generator') if isinstance(st, dict) else st}")
        try:  # on a scratch bit generator: the run's own change only in apply
            type(g.bit_generator)().state = st
        except (TypeError, ValueError, KeyError) as e:
            raise checkpoint.CheckpointError(f"{path}: corrupt training state (a {kind} "
                                             f"state: {e})") from None
    return states


def _checked_callbacks(path: str, doc, callbacks, arrays) -> list:
    """``[(callback, state)]``: each saved callback state for the run's callback of the same
    type and rank among that type (one without a saved state starts afresh)."""
    saved = {(s.get("type"), s.get("index")): s.get("state") for s in doc["callbacks"]
             if isinstance(s, dict)}
    out, seen = [], {}
    for cb in callbacks:
        name = type(cb).__name__
        seen[name] = seen.get(name, -1) + 1
        st = saved.get((name, seen[name]))
        if st is None or not callable(getattr(cb, "load_state_dict", None)):
            continue
        st = _decode(st, arrays, path)
        check = getattr(cb, "validate_state_dict", None)
        if check is not None:
            try:
                check(st)
            except (TypeError, ValueError, KeyError) as e:
                raise _fail(path, f"{name}'s saved state does not fit it: {e}") from None
        out.append((cb, st))
    return out


def _checked_order(path: str, order, n: int) -> np.ndarray:
    if not isinstance(order, np.ndarray) or order.shape != (n,) or order.dtype.kind not in "iu" \
            or not np.array_equal(np.sort(order), np.arange(n)):
        raise checkpoint.CheckpointError(f"{path}: corrupt training state (the epoch's order is "
                                         f"not a permutation of the {n} samples)")
    return order

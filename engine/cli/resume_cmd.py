"""``train --resume CHECKPOINT`` and preemption: a run stopped by Ctrl-C (SIGINT) or SIGTERM
writes a checkpoint that ``--resume`` continues exactly, with the history so far, and exits
130 or 143, printing the command that resumes it. Under ``mpiexec`` (which forwards both
signals to every rank) the ranks agree to stop after the same step (``fit`` counts the
signal, engine/optim/interrupt.py) and rank 0 writes the checkpoint, as at a run's end.

A checkpoint written by ``train`` holds the options of its run (``metadata["cli"]``): with
``--resume`` they are the run's options unless given again, and one given again with another
value is a usage error naming the flag (the checkpoint's model wins); ``--data`` given again
names where the data file is now, and must hold the run's samples (their CRC-32 is saved).
``--epochs`` stays the
run's total; it may change only under a constant learning rate (a schedule is planned for
the run's length).
"""
from __future__ import annotations

import argparse
import math
import os
import shlex
import signal
import sys
import tempfile
import threading
from contextlib import contextmanager

from ..training import checkpoint
from .inputs import UsageError

__all__ = ["CLI_KEYS", "saved_options", "apply_resume", "check_resumed_data",
           "check_resumed_sizes", "preemption", "interrupted_path", "agreed_signal",
           "save_interrupted"]

# The options that make a run: its model, data and training (not outputs, threads, logging).
CLI_KEYS = ("model", "d_hidden", "d_ff", "hidden", "activation", "norm", "dtype", "task",
            "samples", "data", "delimiter", "x_cols", "y_cols", "val_fraction", "standardize",
            "batch_size", "optimizer", "lr", "weight_decay", "momentum", "schedule", "warmup",
            "step_size", "gamma", "clip_grad_norm", "early_stopping", "seed", "epochs")


# Given again, these win over the checkpoint's: where the data file is now.
_MAY_CHANGE = ("data", "delimiter")


def saved_options(args) -> dict:
    """The run's options, as a checkpoint's metadata stores them."""
    return {k: getattr(args, k) for k in CLI_KEYS}


def _given(args, key: str) -> bool:
    """Whether the option was on the command line (the parser's record, engine/cli/parser.py)."""
    return key in args.given


def apply_resume(args) -> dict:
    """Take the run's options from ``args.resume``'s checkpoint (UsageError for a file that
    is not a ``train`` checkpoint, or an option given again with another value); returns the
    checkpoint's header."""
    try:
        header = checkpoint.read_header(args.resume)
    except (checkpoint.CheckpointError, OSError) as e:
        raise UsageError(f"--resume: {e}") from None
    saved = (header.get("metadata") or {}).get("cli")
    if not isinstance(saved, dict) or header.get("training") is None:
        raise UsageError(f"--resume: {args.resume} is not a resumable checkpoint of "
                         f"'train' (an interrupted run's, or the --save .npz of a run)")
    actions = _train_actions()
    for key in CLI_KEYS:
        if key not in saved:
            continue
        value = saved[key]
        if not _parses(actions[key], value):
            flag = "--" + key.replace("_", "-")
            raise UsageError(f"--resume: {args.resume}: its run's {flag} is {_short(value)}, "
                             f"not a value {flag} takes (a damaged or edited checkpoint)")
        if _given(args, key) and key == "data" and value is None:
            raise UsageError(f"--data: the checkpoint's run trained on the synthetic task "
                             f"{saved.get('task')}; --resume continues it on that task "
                             f"(leave --data out)")
        if _given(args, key) and key in _MAY_CHANGE:
            continue  # the file may have moved (check_resumed_data checks its samples)
        if _given(args, key) and getattr(args, key) != value and key != "epochs":
            flag = "--" + key.replace("_", "-")
            raise UsageError(f"{flag}: the checkpoint's run has {flag} {_show(value)}, "
                             f"given {_show(getattr(args, key))}; --resume continues that "
                             f"run (leave {flag} out)")
        if key != "epochs" or not _given(args, key):
            setattr(args, key, value)
    if args.epochs != saved.get("epochs") and (args.schedule != "constant" or args.warmup):
        raise UsageError(f"--epochs: the run's learning-rate schedule ({args.schedule}, "
                         f"warmup {args.warmup}) is planned for its {saved.get('epochs')} "
                         f"epochs; resume it with --epochs {saved.get('epochs')}")
    return header


def _train_actions() -> dict:
    """The ``train`` command's options by dest (its parser's own, so a saved value is held to
    the rules a typed one is)."""
    from .parser import build_parser
    for a in build_parser()._actions:
        if isinstance(a, argparse._SubParsersAction):
            return {x.dest: x for x in a.choices["train"]._actions}
    raise RuntimeError("the parser has no train command")  # pragma: no cover


def _parses(action, value) -> bool:
    """Whether ``value`` (read from a checkpoint) is one the option ``action`` produces."""
    if value is None:
        return action.default is None
    if action.nargs == 0:  # store_true
        return type(value) is bool
    if action.nargs in ("+", "*"):
        return isinstance(value, list) and bool(value) and all(_item(action, v) for v in value)
    return _item(action, value)


def _item(action, v) -> bool:
    if not isinstance(v, (str, int, float)) or isinstance(v, bool):
        return False
    try:
        got = (action.type or str)(str(v))
    except (ValueError, TypeError, argparse.ArgumentTypeError):
        return False
    if isinstance(got, list):  # --hidden's comma-separated form
        got = got[0] if len(got) == 1 else None
    if action.choices is not None and got not in action.choices:
        return False
    return type(got) is type(v) and got == v


def _short(v) -> str:
    text = repr(v)
    return text if len(text) <= 40 else text[:37] + "..."


def check_resumed_data(args, header: dict, d) -> None:
    """UsageError unless the data ``d`` read for a resumed run is the run's own (its CRC-32
    as the checkpoint recorded it): the file may have moved, not changed; the input and
    target scalings and a cosine schedule's length were planned on it. A regression saved
    before targets were standardised cannot continue on standardised targets."""
    meta = header.get("metadata") or {}
    if d.target_standardizer is not None and "target_standardizer" not in meta:
        raise UsageError(f"--resume: {args.resume} was trained on unscaled targets (written "
                         f"before train standardised a regression's targets); start a new "
                         f"run")
    saved, crc = meta.get("data_crc32"), d.data_crc32
    if saved is not None and saved != crc:
        raise UsageError(f"--data: {args.data} holds other samples than the run's data "
                         f"(CRC-32 {crc} where the checkpoint recorded {saved}); --resume "
                         f"continues a run on its own data (the same file, moved or not)")


def check_resumed_sizes(args, header: dict, d_in: int, d_out: int) -> None:
    """UsageError unless the weights the run's sizes imply fit in the parameters its
    checkpoint holds (before the model is built from those sizes): each pair of widths
    below is the shape of a distinct weight of the model ``train`` builds."""
    from .parser import block_models
    block = block_models()[args.model]
    if "sizes" in block.dims:
        chain = [d_in, *args.hidden, d_out]
        pairs = list(zip(chain, chain[1:]))
    else:
        dh, dff = args.d_hidden, args.d_ff
        pairs = [(d_in, dh), (dh, dff), (dh, d_out) if block.keeps_width else (dff, d_out)]
    implied = sum(a * b for a, b in pairs)
    stored = sum(math.prod(shape) for shape, _ in header["params"].values())
    if implied > stored:
        raise UsageError(f"--resume: {args.resume}: its run's sizes imply at least {implied} "
                         f"weights, the checkpoint holds {stored} parameter values (a damaged "
                         f"or edited checkpoint)")


def _show(v) -> str:
    return " ".join(map(str, v)) if isinstance(v, list) else str(v)


@contextmanager
def preemption():
    """SIGTERM is handled as Ctrl-C (so both stop ``fit`` at the end of a step, with its
    deferral), and Ctrl-C raises KeyboardInterrupt even if the shell started us ignoring
    it. Yields a dict whose ``"signal"`` names the last signal received."""
    got = {"signal": "SIGINT"}
    if threading.current_thread() is not threading.main_thread():
        yield got  # (signal handlers can only be set on the main thread)
        return

    def on_term(signum, frame):
        got["signal"] = "SIGTERM"
        signal.raise_signal(signal.SIGINT)  # through whatever handles SIGINT now

    old_int = signal.signal(signal.SIGINT, signal.default_int_handler)
    old_term = signal.signal(signal.SIGTERM, on_term)
    try:
        yield got
    finally:
        signal.signal(signal.SIGTERM, old_term)
        signal.signal(signal.SIGINT, old_int)


def interrupted_path(args, task_name: str) -> str:
    """Next to --save (``m.npz`` -> ``m.interrupted.npz``), else in the current directory."""
    if args.save:
        return os.path.splitext(args.save)[0] + ".interrupted.npz"
    return f"blasnet-{args.model}-{task_name}.interrupted.npz"


def _resume_command(args, path: str, comm=None) -> str:
    argv = list(getattr(args, "argv", []))
    out, skip = [], False
    for t in argv:
        if skip:
            skip = False
        elif t == "--resume":
            skip = True
        elif not t.startswith("--resume="):
            out.append(t)
    prog = (["blasnet"] if os.path.basename((sys.argv or [""])[0]) == "blasnet"
            else [sys.executable, "-m", "engine"])
    if comm is not None:  # on as many ranks (one process resumes it too)
        prog = ["mpiexec", "-n", str(comm.Get_size())] + prog
    return shlex.join(prog + out + ["--resume", path])


def agreed_signal(comm, name: str) -> str:
    """The signal that stopped a run: ``name`` (this process's last) on one process; over
    MPI (collective, every rank stopped together) SIGTERM if any rank received one, else
    SIGINT, so every rank reports and exits alike."""
    if comm is None:
        return name
    return "SIGTERM" if comm.allreduce(int(name == "SIGTERM")) else "SIGINT"


def save_interrupted(err, args, stop, meta: dict, max_iters: int = 0, comm=None) -> int:
    """Write the interrupted run's checkpoint and ``--history``; print where, and the
    command that resumes it, to ``err``; return the exit status (130 SIGINT, 143 SIGTERM).
    ``max_iters``: an iteration-based run of that many steps, whose "epochs" are periods
    between held-out estimates (said as steps and estimates). ``comm``: the ranks of a
    data-parallel run, stopped after the same step (collective: rank 0 writes and prints)."""
    e, sig = stop
    code = 143 if sig == "SIGTERM" else 130
    if comm is not None and comm.Get_rank() != 0:
        err = open(os.devnull, "w")  # noqa: SIM115  (rank 0 reports)
    if not e.epoch:
        where = "before the first step"
    elif max_iters:
        where = f"after step {e.history.steps}/{max_iters}"
    else:
        where = f"at epoch {e.epoch}, step {e.step}"
    done = "held-out estimate(s)" if max_iters else "epoch(s)"
    print(f"\ntraining interrupted ({sig}) {where}; {len(e.history)} {done} complete",
          file=err)
    if not e.resumable:
        print("nothing was trained, so nothing was saved", file=err)
        return code
    path = _save(e, interrupted_path(args, meta.get("task", "run")), sig, meta, comm)
    if path is None:
        return code
    print(f"checkpoint {path} (resumable: model, optimizer, schedule, random state, "
          f"history)", file=err)
    if args.history and (comm is None or comm.Get_rank() == 0):
        if args.history.lower().endswith(".json"):
            e.history.to_json(args.history)
        else:
            e.history.to_csv(args.history)
        print(f"history    {args.history} ({len(e.history)} epochs so far)", file=err)
    print(f"resume with:\n  {_resume_command(args, path, comm)}", file=err)
    return code


def _save(e, path: str, sig: str, meta: dict, comm):
    """``e.save(path)`` (over MPI collective: rank 0 writes); to a temporary file if
    ``path``'s directory is unwritable. The path written (rank 0's), or None after printing
    why nothing could be."""
    for attempt in range(2):
        error = None
        try:
            e.save(path, interrupted=sig, **meta)
            return path
        except Exception as exc:  # over MPI rank 0's error is raised on every rank
            error = exc
        unwritable = isinstance(error, OSError)
        if comm is not None:  # the other ranks hold a RankError: rank 0's error says
            unwritable = comm.bcast(unwritable, root=0)
        if not unwritable:
            raise error
        if attempt == 0:  # an unwritable directory: the temporary one instead
            if comm is None or comm.Get_rank() == 0:
                fd, path = tempfile.mkstemp(prefix="blasnet-interrupted-", suffix=".npz")
                os.close(fd)
            if comm is not None:
                path = comm.bcast(path, root=0)
    if comm is None or comm.Get_rank() == 0:
        print(f"error: could not save the checkpoint ({error})", file=sys.stderr)
    return None

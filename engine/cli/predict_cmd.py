"""``blasnet predict CHECKPOINT --data FILE``: the saved model's predictions for new inputs,
as CSV: class ids and probabilities for a classifier, the named outputs for a regression.
The model is rebuilt from the checkpoint alone; its saved input standardisation is applied
and its saved target standardisation undone (``LoadedModel.predict``, the same numbers
Python gets)."""
from __future__ import annotations

import csv
import io
import sys

import numpy as np

from .inputs import add_data_options
from .safe_text import safe

__all__ = ["add_parser", "run"]


def add_parser(sub) -> None:
    p = sub.add_parser("predict", help="predict with a saved model on a CSV or .npz file",
                       description="Rebuild the model saved in CHECKPOINT (by train --save or "
                                   "engine.save), apply its saved input standardisation, and "
                                   "write one CSV row of predictions per sample: 'class' and "
                                   "one probability per class for a classifier, one column per "
                                   "output for a regression (in the target's units).")
    p.add_argument("checkpoint", metavar="CHECKPOINT")
    add_data_options(p, "the inputs: a .csv with a header row (the training columns are picked "
                        "by name; other columns are ignored) or an .npz (array x)",
                     "input columns (default: the ones the model was trained on, as saved in "
                     "the checkpoint; else all columns)", required=True)
    p.add_argument("--out", default=None, metavar="PATH",
                   help="write the predictions here (default: standard output)")
    p.add_argument("--task", choices=("classification", "regression"), default=None,
                   help="how to read the outputs (default: as saved by train; else "
                        "regression); it must agree with the task the model was trained for")
    p.add_argument("--batch-size", type=int, default=1024, metavar="N",
                   help="rows per forward pass")
    p.set_defaults(run=run)


def _saved_task(meta):
    """The task the model was trained for, as ``train`` saved it; None when unknown."""
    from ..data import TASKS
    if meta.get("kind") in ("classification", "regression"):
        return meta["kind"]
    task = meta.get("task")
    if task in ("classification", "regression"):
        return task
    return TASKS[task][0] if isinstance(task, str) and task in TASKS else None


def _task(args, meta) -> str:
    saved = _saved_task(meta)
    if args.task and saved and args.task != saved:
        raise ValueError(f"--task {args.task}: the model was trained for {saved}; its "
                         f"outputs are not {args.task} outputs (leave --task out)")
    return args.task or saved or "regression"


def _table(out, task: str, meta) -> tuple:
    """``(header, rows)`` of the predictions ``out`` (N, k)."""
    if task == "classification":
        z = out - out.max(axis=1, keepdims=True)
        p = np.exp(z)
        p /= p.sum(axis=1, keepdims=True)
        header = ["class"] + [f"p{k}" for k in range(p.shape[1])]
        return header, ([int(c)] + [repr(float(v)) for v in row]
                        for c, row in zip(p.argmax(1), p))
    names = meta.get("y_cols")
    if not (isinstance(names, list) and len(names) == out.shape[1]
            and all(isinstance(n, str) for n in names)):
        names = [f"y{k}" for k in range(out.shape[1])]
    return [safe(n) for n in names], ([repr(float(v)) for v in row] for row in out)


def _check_out(path) -> None:
    """ValueError naming ``--out`` unless it can be written: ``save``'s own checks (the
    directory exists and takes a file, not a directory, not read-only even for root)."""
    from ..training.callbacks import check_output_path
    check_output_path(path, "--out")


def run(args) -> int:
    from ..data import load_inputs
    from ..training import checkpoint
    from ..training.atomic_file import atomic_write, writable_target
    from ..training.load_model import load_model
    if args.out is not None:
        try:
            _check_out(args.out)
        except (ValueError, TypeError) as e:
            print(f"error: {safe(e)}", file=sys.stderr)
            return 1
    try:
        if args.batch_size < 1:
            raise ValueError(f"--batch-size: expected a positive integer, got {args.batch_size}")
        r = load_model(args.checkpoint, optimizer=False, scheduler=False)
        meta = r.metadata if isinstance(r.metadata, dict) else {}
        task = _task(args, meta)
        x_cols = args.x_cols or meta.get("x_cols")
        X = load_inputs(args.data, x_cols if args.data.lower().endswith(".csv") else
                        args.x_cols, dtype=r.model.dtype, delimiter=args.delimiter)
        out = r.predict(X, args.batch_size)
    except (checkpoint.CheckpointError, ValueError, TypeError, OSError) as e:
        print(f"error: {safe(e)}", file=sys.stderr)
        return 2
    out = out.reshape(out.shape[0], -1).astype(np.float64)
    header, rows = _table(out, task, meta)
    text = io.StringIO()
    w = csv.writer(text, lineterminator="\n")
    w.writerow(header)
    w.writerows(rows)
    if not args.out:
        sys.stdout.write(text.getvalue())
        return 0
    try:
        atomic_write(writable_target(args.out), lambda f: f.write(text.getvalue().encode()))
    except OSError as e:
        print(f"error: --out: {safe(e.strerror or e)} ({safe(args.out)})", file=sys.stderr)
        return 1
    print(f"predictions {safe(args.out)}: {out.shape[0]} rows ({', '.join(header[:4])}"
          f"{', ...' if len(header) > 4 else ''})", file=sys.stderr)
    return 0

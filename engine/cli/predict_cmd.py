"""``blasnet predict CHECKPOINT --data FILE``: the saved model's predictions for new inputs,
as CSV: class ids and probabilities for a classifier, the named outputs for a regression.
The model is rebuilt from the checkpoint alone and the saved Standardizer applied."""
from __future__ import annotations

import csv
import sys

import numpy as np

from .parser import add_delimiter_option

__all__ = ["add_parser", "run"]


def add_parser(sub) -> None:
    p = sub.add_parser("predict", help="predict with a saved model on a CSV or .npz file",
                       description="Rebuild the model saved in CHECKPOINT (by train --save or "
                                   "engine.save), apply its saved input standardisation, and "
                                   "write one CSV row of predictions per sample: 'class' and "
                                   "one probability per class for a classifier, one column per "
                                   "output for a regression.")
    p.add_argument("checkpoint", metavar="CHECKPOINT")
    p.add_argument("--data", required=True, metavar="FILE",
                   help="the inputs: a .csv with a header row (the training columns are "
                        "picked by name; other columns are ignored) or an .npz (array x)")
    add_delimiter_option(p)
    p.add_argument("--x-cols", nargs="+", default=None, metavar="NAME",
                   help="input columns (default: the ones the model was trained on, as saved "
                        "in the checkpoint; else all columns)")
    p.add_argument("--out", default=None, metavar="PATH",
                   help="write the predictions here (default: standard output)")
    p.add_argument("--task", choices=("classification", "regression"), default=None,
                   help="how to read the outputs (default: as saved by train; else regression)")
    p.add_argument("--batch-size", type=int, default=1024, metavar="N",
                   help="rows per forward pass")
    p.set_defaults(run=run)


def _task(args, meta) -> str:
    if args.task:
        return args.task
    if meta.get("kind") == "classification" or meta.get("task") in ("spiral", "xor",
                                                                    "classification"):
        return "classification"
    return "regression"


def run(args) -> int:
    from ..data import load_inputs
    from ..training import checkpoint
    from ..training.load_model import load_model
    from ..training.loop import predict
    try:
        r = load_model(args.checkpoint, optimizer=False, scheduler=False)
        meta = r.metadata if isinstance(r.metadata, dict) else {}
        x_cols = args.x_cols or meta.get("x_cols")
        X = load_inputs(args.data, x_cols if args.data.lower().endswith(".csv") else
                        args.x_cols, dtype=r.model.dtype, delimiter=args.delimiter)
        if r.standardizer is not None:
            X = r.standardizer.transform(X)
        if args.batch_size < 1:
            raise ValueError(f"--batch-size: expected a positive integer, got {args.batch_size}")
        out = predict(r.model, X, args.batch_size)
    except (checkpoint.CheckpointError, ValueError, TypeError, OSError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    out = out.reshape(out.shape[0], -1).astype(np.float64)
    if _task(args, meta) == "classification":
        z = out - out.max(axis=1, keepdims=True)
        p = np.exp(z)
        p /= p.sum(axis=1, keepdims=True)
        header = ["class"] + [f"p{k}" for k in range(p.shape[1])]
        rows = ([int(c)] + [repr(float(v)) for v in row] for c, row in zip(p.argmax(1), p))
    else:
        names = meta.get("y_cols")
        if not (isinstance(names, list) and len(names) == out.shape[1]):
            names = [f"y{k}" for k in range(out.shape[1])]
        header = list(names)
        rows = ([repr(float(v)) for v in row] for row in out)
    f = open(args.out, "w", newline="") if args.out else sys.stdout
    try:
        w = csv.writer(f, lineterminator="\n")
        w.writerow(header)
        w.writerows(rows)
    finally:
        if args.out:
            f.close()
    if args.out:
        print(f"predictions {args.out}: {out.shape[0]} rows ({', '.join(header[:4])}"
              f"{', ...' if len(header) > 4 else ''})", file=sys.stderr)
    return 0

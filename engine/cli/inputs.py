"""The ``train`` command's inputs: checks of the parsed options that need no data, and the
data set (a synthetic task or the user's file), split and standardised; the ``--delimiter``
option of the CSV files ``train`` and ``predict`` read."""
from __future__ import annotations

import os
import zlib
from dataclasses import dataclass

import numpy as np

from .. import data as _data
from ..data import make_task
from ..training.callbacks import check_output_path
from .task_rule import refusal, small_label_set

__all__ = ["UsageError", "check_args", "val_fraction", "TrainData", "load_data", "MAX_CLASSES",
           "add_data_options"]

MAX_CLASSES = 1 << 20  # labels of --data: one output unit (and a weight column) per class


def add_data_options(group, data_help: str, x_cols_help: str, required: bool = False) -> None:
    """``--data FILE``, ``--delimiter CHAR`` and ``--x-cols NAME ...``: the data file ``train``
    and ``predict`` read, with each command's own help for the file and its input columns."""
    group.add_argument("--data", required=required, default=None, metavar="FILE",
                       help=data_help)
    group.add_argument("--delimiter", default=None, metavar="CHAR",
                       type=lambda t: "\t" if t in ("\\t", "tab") else t,
                       help="field separator of the CSV (default: the one of , ; tab | found "
                            "most often in its header line)")
    group.add_argument("--x-cols", nargs="+", default=None, metavar="NAME", help=x_cols_help)


class UsageError(Exception):
    """A bad option, file or column, found before the first step (exit status 2)."""


def check_args(args) -> None:
    """Everything that can be checked before any data is read: flag combinations, output
    paths (directory exists and is writable, name length, suffix), optional packages."""
    for flag, path, suffixes in (("--save", args.save, (".npz", ".safetensors")),
                                 ("--history", args.history, (".csv", ".json")),
                                 ("--plot", args.plot, (".png",))):
        if path is not None:
            try:
                check_output_path(path, flag, suffixes)
            except ValueError as e:
                raise UsageError(str(e)) from None
    if args.plot is not None:
        try:
            import matplotlib  # noqa: F401
        except ImportError:
            raise UsageError("--plot needs matplotlib: pip install 'blasnet[plot]'") from None
    if args.save is not None and args.save.lower().endswith(".safetensors"):
        try:
            import safetensors  # noqa: F401
        except ImportError:
            raise UsageError("--save to .safetensors needs the safetensors package: "
                              "pip install 'blasnet[interop]'") from None
    if args.data is None:
        for flag, v in (("--x-cols", args.x_cols), ("--y-cols", args.y_cols)):
            if v is not None:
                raise UsageError(f"{flag}: only with --data FILE")
        if args.task == "classification":
            raise UsageError("--task classification: only with --data FILE (the synthetic "
                              "classification tasks are spiral and xor)")
    elif args.task not in (None, "regression", "classification"):
        raise UsageError(f"--task {args.task}: with --data, the task is regression or "
                          f"classification")
    if args.early_stopping is not None and val_fraction(args) == 0.0:
        raise UsageError("--early-stopping: it watches the validation loss; give "
                          "--val-fraction > 0")
    if args.step_size is not None and args.schedule != "step":
        raise UsageError("--step-size: only with --schedule step")
    if args.momentum != 0.0 and args.optimizer != "sgd":
        raise UsageError(f"--momentum: only with --optimizer sgd ({args.optimizer} would "
                          f"ignore it; AdamW's betas are fixed at (0.9, 0.999))")
    if args.shard_optimizer and args.optimizer != "adamw":
        raise UsageError("--shard-optimizer: ZeRO-1 shards AdamW's moments (use --optimizer "
                          "adamw)")


def val_fraction(args) -> float:
    if args.val_fraction is not None:
        return args.val_fraction
    return 0.2 if args.data is not None else 0.0


def _own_data(args, dt):
    """``(X, Y, kind, x_names, y_names, note)`` from ``--data``; UsageError on any problem."""
    path = args.data
    if os.path.isdir(path):
        raise UsageError(f"--data: {path!r} is a directory; give a .csv or .npz file")
    if not os.path.isfile(path):
        raise UsageError(f"--data: no such file: {path!r}")
    is_csv = path.lower().endswith(".csv")
    try:
        X, Y = _data.load(path, x=args.x_cols, y=args.y_cols, dtype=dt,
                          delimiter=args.delimiter)
    except (ValueError, TypeError, OSError) as e:
        msg = str(e)
        if msg.startswith("y: name the target"):
            msg = "--y-cols: name the target column(s) of a CSV file"
        raise UsageError(f"--data: {msg}") from None
    if X.ndim != 2:
        raise UsageError(f"--data: the inputs must be a 2-D array (samples, features), got "
                          f"shape {X.shape}")
    if is_csv:
        header = _data.csv_columns(path, args.delimiter)  # as load read them
        y_names = list(args.y_cols)
        x_names = list(args.x_cols) if args.x_cols else [h for h in header if h not in y_names]
    else:
        x_names = [f"x{j}" for j in range(X.shape[1])]
        y_names = None  # named below from the target's width
    inferred = _data.infer_task(Y)
    if inferred == "classification" and args.task is None and not small_label_set(Y):
        raise UsageError(refusal(Y, repr(y_names[0]) if y_names else
                                 f"array {(args.y_cols or ['y'])[0]!r}"))
    kind = args.task or inferred
    note = "given" if args.task else ("inferred: integer targets are class labels"
                                      if kind == "classification" else
                                      "inferred: non-integer or several target columns")
    if kind == "regression" and Y.ndim == 1:
        Y = np.ascontiguousarray(Y.reshape(-1, 1), dtype=dt)
    elif kind == "classification":
        if inferred != "classification":
            flat = Y.reshape(-1) if Y.ndim == 2 and Y.shape[1] == 1 else None
            if flat is None or not np.all(flat == np.round(flat)):
                raise UsageError("--task classification: the target must be one column of "
                                  "integer class labels")
            Y = flat.astype(np.int64)
        if Y.min() < 0:
            raise UsageError(f"--data: class labels must be integers >= 0 (0 .. classes-1), "
                              f"got {int(Y.min())}; use --task regression for a numeric target")
        if Y.max() >= MAX_CLASSES:  # one output per class: 10^12 labels would build 10^12
            raise UsageError(f"--data: class labels must be 0 .. classes-1 with at most "
                             f"{MAX_CLASSES} classes, got a label {int(Y.max())}; use --task "
                             f"regression for a numeric target")
    if y_names is None:
        y_names = (["y"] if kind == "classification" or Y.shape[1] == 1
                   else [f"y{j}" for j in range(Y.shape[1])])
    return X, Y, kind, x_names, y_names, note


@dataclass(kw_only=True)
class TrainData:
    """The data of a ``train`` run: training arrays, validation pair (or None), and what the
    report says about them."""
    X: np.ndarray
    Y: np.ndarray
    val: tuple | None
    kind: str                # "regression" or "classification"
    task_name: str           # the synthetic task, or the kind for --data
    own: bool                # from --data
    n_all: int               # samples before the split
    vf: float                # validation fraction
    standardizer: object
    target_standardizer: object  # --data regression: Y standardised (the report un-scales)
    data_crc32: int | None   # --data: CRC-32 of the samples as read (a resumed run's check)
    x_names: list | None
    y_names: list | None
    note: str | None         # how the kind was decided (--data)

    @property
    def classify(self) -> bool:
        return self.kind == "classification"

    @property
    def d_in(self) -> int:
        return self.X.shape[1]

    @property
    def d_out(self) -> int:
        if not self.classify:
            return self.Y.shape[1]
        return int(max(self.Y.max(), self.val[1].max() if self.val is not None else 0)) + 1


def load_data(args, dt) -> TrainData:
    """The task's or the file's samples, split (--val-fraction) and standardised."""
    own = args.data is not None
    x_names = y_names = note = None
    crc = None
    if own:
        X, Y, kind, x_names, y_names, note = _own_data(args, dt)
        task_name = kind
        crc = zlib.crc32(np.ascontiguousarray(Y).data, zlib.crc32(np.ascontiguousarray(X).data))
    else:
        task_name = args.task or "regression"
        X, Y, kind = make_task(task_name, args.samples, dtype=dt, rng=args.seed)
    n_all = X.shape[0]
    vf = val_fraction(args)
    val = None
    if vf > 0:
        try:
            (X, Y), val = _data.train_val_split(X, Y, vf, rng=args.seed)
        except ValueError as e:
            raise UsageError(f"--val-fraction: {e}") from None
    standardizer = None
    if args.standardize:
        standardizer = _data.Standardizer().fit(X)
        X = standardizer.transform(X)
        if val is not None:
            val = (standardizer.transform(val[0]), val[1])
    targets = None
    if own and kind == "regression":
        # Targets such as prices (~1e5) are learnt as standardised values: at the default
        # rate an output bias could not walk to their mean within the run.
        targets = _data.Standardizer().fit(Y)
        Y = targets.transform(Y)
        if val is not None:
            val = (val[0], targets.transform(val[1]))
    return TrainData(X=X, Y=Y, val=val, kind=kind, task_name=task_name, own=own, n_all=n_all,
                     vf=vf, standardizer=standardizer, target_standardizer=targets,
                     data_crc32=crc,
                     x_names=x_names, y_names=y_names, note=note)

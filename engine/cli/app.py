"""``python -m engine`` (or ``blasnet``): ``train`` a model on a synthetic task or on your own
data (``--data FILE``), or print ``info`` on the versions, BLAS libraries and thread counts.

The default ``train`` (what ``make run`` runs) is a gated-MLP regression experiment: gMLP 16 -> 128 ->
512 -> 4 on 1024 samples of the regression task, full batch, AdamW lr 1e-3, 1000 epochs.
Every output path (``--save``, ``--history``, ``--plot``) and the data are checked before
the first step.
"""
from __future__ import annotations

import argparse
import os
import platform
import statistics
import sys
import tempfile
import time

import numpy as np

import kernels

from .. import __version__
from ..training import checkpoint
from .. import data as _data
from ..optim import lr_scheduler as _lrs
from ..models import registry
from ..training.callbacks import EarlyStopping, check_output_path
from ..data import REGRESSION_OUTPUTS, TASKS, make_task
from ..nn.layers import Linear, Sequential
from ..nn.losses import CrossEntropyLoss, MSELoss
from ..optim.optimizers import SGD, AdamW
from ..training.loop import NonFiniteLossError, evaluate, fit, mean_absolute_error, predict, r2_score
from ..training.loop import TrainingInterrupted
from .task_rule import refusal, small_label_set

MODELS = ("gmlp", "ffn", "sublayer", "mlp")  # each a block of engine.registry (_BLOCK_OF)
MODELS += ("gmlp-lm",)  # the character language model of engine/lm.py (--task text)
SCHEDULES = ("constant", "cosine", "linear", "step")
HELD_OUT = 4096  # fresh samples drawn (with another seed) to measure generalisation
MAX_CLASSES = 1 << 20  # labels of --data: one output unit (and a weight column) per class


def _version() -> str:
    return __version__


def _prog() -> str:
    return "blasnet" if os.path.basename((sys.argv or [""])[0]) == "blasnet" else "python -m engine"


# ----------------------------------------------------------------------------- parser
def _int_at_least(low: int, what: str):
    """An argparse type: an int >= ``low``, else an error saying ``expected <what>``."""
    def parse(text: str) -> int:
        try:
            v = int(text)
        except ValueError:
            v = low - 1
        if v < low:
            raise argparse.ArgumentTypeError(f"expected {what}, got {text!r}")
        return v
    return parse


_positive = _int_at_least(1, "a positive integer")
_nonnegative_int = _int_at_least(0, "an integer >= 0")


def _float_in(low: float, high: float | None, what: str, low_open: bool = False,
              high_open: bool = False):
    """An argparse type: a finite float in the range, else an error saying ``expected <what>``."""
    def parse(text: str) -> float:
        try:
            v = float(text)
        except ValueError:
            v = float("nan")
        ok = (v == v and abs(v) != float("inf") and (v > low if low_open else v >= low)
              and (high is None or (v < high if high_open else v <= high)))
        if not ok:
            raise argparse.ArgumentTypeError(f"expected {what}, got {text!r}")
        return v
    return parse


def _sizes(text: str) -> list:
    try:
        sizes = [int(s) for s in text.split(",") if s.strip()]
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected comma-separated integers, got {text!r}") from None
    if not sizes or min(sizes) < 1:
        raise argparse.ArgumentTypeError(f"expected positive comma-separated integers, got {text!r}")
    return sizes


class _SizesAction(argparse.Action):
    """``--hidden 64 64``, the space-separated form every list flag takes; ``64,64`` (the
    older spelling) is read too. The values land as one flat list."""

    def __call__(self, parser, namespace, values, option_string=None):
        setattr(namespace, self.dest, [n for v in values for n in v])


class _HelpFormatter(argparse.HelpFormatter):
    """Appends "(default: ...)" unless the help text already explains its default."""

    def _get_help_string(self, action):
        text = action.help or ""
        if ("default" not in text and action.default not in (None, argparse.SUPPRESS)
                and action.option_strings):
            d = action.default
            text += f" (default: {','.join(map(str, d)) if isinstance(d, list) else d})"
        return text


def build_parser() -> argparse.ArgumentParser:
    prog = _prog()
    parser = argparse.ArgumentParser(
        prog=prog,
        description="blasnet: train feed-forward transformer blocks on the CPU through BLAS.",
        epilog=f"Run '{prog} train --help' for the training options. Threads: "
               "--threads, or BLASNET_NUM_THREADS=N in the environment.")
    parser.add_argument("--version", action="version", version=f"blasnet {__version__}")
    sub = parser.add_subparsers(dest="command",
                                metavar="{train,info,inspect,predict,sample}")
    sub.required = True
    d = _HelpFormatter
    t = sub.add_parser(
        "train", formatter_class=d, help="train a model on a synthetic task or your own data",
        description="Train a model on a synthetic task or on your own data (--data), report "
                    "its fit, save a checkpoint and check that it reloads. The defaults are "
                    "a gated-MLP regression experiment: a gMLP 16 -> 128 -> 512 -> 4 on 1024 "
                    "regression samples, full batch, AdamW lr 1e-3, 1000 epochs. The data and every "
                    "output path are checked before the first step.")
    g = t.add_argument_group("model")
    g.add_argument("--model", choices=MODELS, default="gmlp",
                   help="gmlp: GMLP(d_in, d_hidden, d_ff, d_out); ffn: Linear(d_in, d_hidden) -> "
                        "FFN(d_hidden, d_ff) -> Linear(d_hidden, d_out); sublayer: the same with "
                        "an FFNSublayer (residual + LayerNorm) in the middle; mlp: MLP with the "
                        "--hidden sizes; gmlp-lm: the attention-free character language model "
                        "(--task text; docs/lm.md)")
    g.add_argument("--d-hidden", type=_positive, default=128, metavar="N",
                   help="gMLP d_hidden (width after W_in); d_model of the ffn/sublayer models")
    g.add_argument("--d-ff", type=_positive, default=512, metavar="N",
                   help="gMLP d_ffn (width of the gate and projection); d_ff of ffn/sublayer")
    g.add_argument("--hidden", type=_sizes, nargs="+", action=_SizesAction, default=[64, 32],
                   metavar="N", help="hidden layer sizes of the mlp model, e.g. --hidden 64 32 "
                                     "(default: 64 32)")
    g.add_argument("--activation", default="relu", choices=kernels.ACTIVATIONS,
                   help="activation of the ffn, sublayer and mlp models (gMLP uses GELU and "
                        "a sigmoid gate)")
    g.add_argument("--norm", choices=("post", "pre"), default="post",
                   help="LayerNorm placement of the sublayer model")
    g = t.add_argument_group("data")
    g.add_argument("--task", choices=sorted(TASKS) + ["classification", "text"], default=None,
                   help="synthetic tasks: regression (the default): X uniform in [-3, 3]^16, 4 "
                        "smooth nonlinear targets (MSE); spiral: two-spiral classification in "
                        "2-D (cross-entropy); xor: the 4 XOR points (cross-entropy); sine: y = "
                        "sin(x) on [-pi, pi] (MSE). With --data: regression or classification "
                        "(default: inferred, an integer target column is class labels). text: "
                        "next-character prediction on Python's own help texts (gmlp-lm)")
    g.add_argument("--samples", type=_int_at_least(2, "an integer >= 2 (R^2 and accuracy need "
                                                    "two samples or more)"),
                   default=None, metavar="N",
                   help="training samples (default: 1024 regression, 1000 spiral, 256 sine; "
                        "xor always has 4)")
    g.add_argument("--data", default=None, metavar="FILE",
                   help="train on your own data: a .csv file (header row, numbers only) or a "
                        ".npz file (arrays x and y)")
    g.add_argument("--delimiter", default=None, metavar="CHAR",
                   type=lambda t: "\t" if t in ("\\t", "tab") else t,
                   help="field separator of the CSV (default: the one of , ; tab | found most "
                        "often in its header line)")
    g.add_argument("--x-cols", nargs="+", default=None, metavar="NAME",
                   help="input columns of the CSV (default: all but --y-cols), or the input "
                        "array of the .npz (default: x)")
    g.add_argument("--y-cols", nargs="+", default=None, metavar="NAME",
                   help="target column(s) of the CSV (required for a CSV), or the target array "
                        "of the .npz (default: y)")
    g.add_argument("--val-fraction", type=_float_in(0.0, 1.0, "a number in [0, 1)",
                                                     high_open=True),
                   default=None, metavar="F",
                   help="fraction of the samples held out for validation, drawn with --seed "
                        "(default: 0.2 with --data, 0 for the synthetic tasks, which report "
                        "on fresh held-out samples)")
    g.add_argument("--standardize", action="store_true",
                   help="standardise the inputs per feature with the training split's mean "
                        "and standard deviation (saved in the checkpoint's metadata)")
    g = t.add_argument_group("training")
    g.add_argument("--epochs", type=_nonnegative_int, default=1000, metavar="N",
                   help="passes over the training set")
    g.add_argument("--batch-size", type=_nonnegative_int, default=0, metavar="N",
                   help="rows per step; 0 = full batch")
    g.add_argument("--optimizer", choices=("adamw", "sgd"), default="adamw",
                   help="AdamW (PyTorch semantics) or SGD with optional momentum")
    g.add_argument("--lr", type=float, default=1e-3, help="learning rate")
    g.add_argument("--weight-decay", type=float, default=None, metavar="WD",
                   help="weight decay (default: 0.01 for AdamW, decoupled; 0 for SGD, L2)")
    g.add_argument("--momentum", type=float, default=0.0, help="SGD momentum")
    g.add_argument("--shard-optimizer", action="store_true",
                   help="under mpiexec: shard AdamW's state over the ranks (ZeRO stage 1)")
    g.add_argument("--schedule", choices=SCHEDULES, default="constant",
                   help="learning-rate schedule over the optimizer steps after the warmup: "
                        "constant; cosine (CosineAnnealingLR down to 0); linear (LinearLR down "
                        "to 0); step (StepLR: times --gamma every --step-size steps)")
    g.add_argument("--warmup", type=_nonnegative_int, default=0, metavar="STEPS",
                   help="linear warmup over the first STEPS optimizer steps (LinearLR), then "
                        "the --schedule (SequentialLR)")
    g.add_argument("--step-size", type=_positive, default=None, metavar="STEPS",
                   help="--schedule step: optimizer steps between decays (default: a third "
                        "of the steps after the warmup)")
    g.add_argument("--gamma", type=_float_in(0.0, 1.0, "a number in (0, 1]", low_open=True),
                   default=0.1, help="--schedule step: the decay factor")
    g.add_argument("--clip-grad-norm", type=_float_in(0.0, None, "a number > 0", low_open=True),
                   default=None, metavar="MAX",
                   help="scale the gradients to a global L2 norm of at most MAX before each "
                        "step")
    g.add_argument("--early-stopping", type=_nonnegative_int, default=None, metavar="PATIENCE",
                   help="stop when the validation loss has not improved for PATIENCE epochs "
                        "and restore the best epoch's weights (needs a validation split)")
    g.add_argument("--dtype", choices=("float32", "float64"), default="float32",
                   help="dtype of data, parameters and buffers")
    g.add_argument("--threads", type=_positive, default=None, metavar="N",
                   help="BLAS threads (default: BLASNET_NUM_THREADS, else the libraries' own)")
    g.add_argument("--seed", type=_nonnegative_int, default=0,
                   help="seed of the data, the initialisation and the shuffling")
    g.add_argument("--log-every", type=_positive, default=None, metavar="N",
                   help="print the loss every N epochs (default: epochs / 10)")
    g = t.add_argument_group("output")
    g.add_argument("--save", default=None, metavar="PATH",
                   help="write the checkpoint here: .npz (parameters, optimizer and schedule "
                        "state) or .safetensors (parameters only) (default: an .npz in a "
                        "temporary directory, removed at exit)")
    g.add_argument("--history", default=None, metavar="PATH",
                   help="write the per-epoch history here (.csv or .json)")
    loud = g.add_mutually_exclusive_group()
    loud.add_argument("--quiet", action="store_true",
                      help="print nothing but errors and warnings (the exit status says how "
                           "it went)")
    loud.add_argument("--verbose", action="store_true",
                      help="also time one training step against its own GEMMs, replayed on a "
                           "copy of the model (~0.2 s), in the time line")
    g.add_argument("--plot", default=None, metavar="PATH",
                   help="save a PNG of the loss (and validation loss) per epoch here (needs "
                        "matplotlib: pip install 'blasnet[plot]')")
    g = t.add_argument_group(
        "language model (--model gmlp-lm --task text)",
        "Also read: --d-hidden (d_model), --d-ff (d_ffn), --epochs, --batch-size, --lr, "
        "--weight-decay, --warmup, --seed, --dtype, --threads, --save, --log-every; each "
        "keeps the language model's own default (engine.lm.LMConfig) unless given.")
    g.add_argument("--prompt", default=None, metavar="TEXT",
                   help="text the generated sample starts from (default: 'The ')")
    g.add_argument("--sample-length", type=_nonnegative_int, default=None, metavar="N",
                   help="characters to generate after the prompt (default: 300)")
    sub.add_parser("info", help="print versions, BLAS libraries and thread counts",
                   description="Print the versions of Python, numpy, scipy, threadpoolctl and "
                               "blasnet, the BLAS/OpenMP libraries loaded with their thread "
                               "counts, and the thread-related environment variables.")
    from . import inspect_cmd, predict_cmd, sample_cmd  # a saved model's uses
    for command in (inspect_cmd, predict_cmd, sample_cmd):
        command.add_parser(sub)
    return parser


# ----------------------------------------------------------------------------- train
# CLI model name -> block registry entry (engine.registry): how each is built.
_BLOCK_OF = {"gmlp": "GMLP", "ffn": "FFN", "sublayer": "FFNSublayer", "mlp": "MLP"}


def build_model(args, d_in: int, d_out: int, seed: int):
    """The model named by ``args.model`` for a task with ``d_in`` inputs and ``d_out`` outputs:
    the registry's block, between Linear maps from and to the task's widths where the block
    keeps its width (FFN, FFNSublayer)."""
    dt, rng = np.dtype(args.dtype), np.random.default_rng(seed)
    block = registry.get(_BLOCK_OF[args.model])
    if args.model == "gmlp":
        dims = {"d_in": d_in, "d_model": args.d_hidden, "d_ff": args.d_ff, "d_out": d_out}
        return block.build(dims, dtype=dt, rng=rng)
    if args.model == "mlp":
        return block.build({"sizes": (d_in, *args.hidden, d_out)}, dtype=dt, rng=rng,
                           activation=args.activation)
    d = args.d_hidden
    options = {"activation": args.activation}
    if args.model == "sublayer":
        options["norm"] = args.norm
    first = Linear(d_in, d, dtype=dt, rng=rng)
    middle = block.build({"d_model": d, "d_ff": args.d_ff}, dtype=dt, rng=rng, **options)
    return Sequential(first, middle, Linear(d, d_out, init="xavier", dtype=dt, rng=rng))


def _describe(args, model, d_in: int, d_out: int) -> str:
    if args.model == "gmlp":
        shape = f"{d_in} -> {args.d_hidden} -> {args.d_ff} -> {d_out}"
    elif args.model == "mlp":
        shape = " -> ".join(str(s) for s in [d_in, *args.hidden, d_out])
    else:
        shape = f"{d_in} -> {args.d_hidden} -> [{args.model} d_ff {args.d_ff}] -> {d_out}"
    return f"{args.model} {shape} ({type(model).__name__}, {model.num_parameters():,} parameters)"


def _optimizer(args, model, comm=None):
    if args.optimizer == "adamw":
        wd = 1e-2 if args.weight_decay is None else args.weight_decay
        if args.shard_optimizer and comm is not None:
            from ..distributed import ShardedAdamW
            return ShardedAdamW(model.parameters(), comm, lr=args.lr, weight_decay=wd)
        return AdamW(model.parameters(), lr=args.lr, weight_decay=wd)
    wd = 0.0 if args.weight_decay is None else args.weight_decay
    return SGD(model.parameters(), lr=args.lr, momentum=args.momentum, weight_decay=wd)


def _opt_text(opt) -> str:
    g = opt.param_groups[0]
    return f"{type(opt).__name__}(" + ", ".join(f"{k}={g[k]}" for k in opt.defaults) + ")"


class _UsageError(Exception):
    """A bad option, file or column, found before the first step (exit status 2)."""


def _check_args(args) -> None:
    """Everything that can be checked before any data is read: flag combinations, output
    paths (directory exists and is writable, name length, suffix), optional packages."""
    for flag, path, suffixes in (("--save", args.save, (".npz", ".safetensors")),
                                 ("--history", args.history, (".csv", ".json")),
                                 ("--plot", args.plot, (".png",))):
        if path is not None:
            try:
                check_output_path(path, flag, suffixes)
            except ValueError as e:
                raise _UsageError(str(e)) from None
    if args.plot is not None:
        try:
            import matplotlib  # noqa: F401
        except ImportError:
            raise _UsageError("--plot needs matplotlib: pip install 'blasnet[plot]'") from None
    if args.save is not None and args.save.lower().endswith(".safetensors"):
        try:
            import safetensors  # noqa: F401
        except ImportError:
            raise _UsageError("--save to .safetensors needs the safetensors package: "
                              "pip install 'blasnet[interop]'") from None
    if args.data is None:
        for flag, v in (("--x-cols", args.x_cols), ("--y-cols", args.y_cols)):
            if v is not None:
                raise _UsageError(f"{flag}: only with --data FILE")
        if args.task == "classification":
            raise _UsageError("--task classification: only with --data FILE (the synthetic "
                              "classification tasks are spiral and xor)")
    elif args.task not in (None, "regression", "classification"):
        raise _UsageError(f"--task {args.task}: with --data, the task is regression or "
                          f"classification")
    if args.early_stopping is not None and _val_fraction(args) == 0.0:
        raise _UsageError("--early-stopping: it watches the validation loss; give "
                          "--val-fraction > 0")
    if args.step_size is not None and args.schedule != "step":
        raise _UsageError("--step-size: only with --schedule step")
    if args.momentum != 0.0 and args.optimizer != "sgd":
        raise _UsageError(f"--momentum: only with --optimizer sgd ({args.optimizer} would "
                          f"ignore it; AdamW's betas are fixed at (0.9, 0.999))")
    if args.shard_optimizer and args.optimizer != "adamw":
        raise _UsageError("--shard-optimizer: ZeRO-1 shards AdamW's moments (use --optimizer "
                          "adamw)")


def _val_fraction(args) -> float:
    if args.val_fraction is not None:
        return args.val_fraction
    return 0.2 if args.data is not None else 0.0


def _own_data(args, dt):
    """``(X, Y, kind, x_names, y_names, note)`` from ``--data``; _UsageError on any problem."""
    path = args.data
    if not os.path.isfile(path):
        raise _UsageError(f"--data: no such file: {path!r}")
    is_csv = path.lower().endswith(".csv")
    try:
        X, Y = _data.load(path, x=args.x_cols, y=args.y_cols, dtype=dt,
                          delimiter=args.delimiter)
    except (ValueError, TypeError, OSError) as e:
        msg = str(e)
        if msg.startswith("y: name the target"):
            msg = "--y-cols: name the target column(s) of a CSV file"
        raise _UsageError(f"--data: {msg}") from None
    if X.ndim != 2:
        raise _UsageError(f"--data: the inputs must be a 2-D array (samples, features), got "
                          f"shape {X.shape}")
    if is_csv:
        import csv
        with open(path, newline="", encoding="utf-8-sig") as f:  # as load read it
            header = [h.strip() for h in next(csv.reader(f))]
        y_names = list(args.y_cols)
        x_names = list(args.x_cols) if args.x_cols else [h for h in header if h not in y_names]
    else:
        x_names = [f"x{j}" for j in range(X.shape[1])]
        y_names = None  # named below from the target's width
    inferred = _data.infer_task(Y)
    if inferred == "classification" and args.task is None and not small_label_set(Y):
        raise _UsageError(refusal(Y, repr(y_names[0]) if y_names else
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
                raise _UsageError("--task classification: the target must be one column of "
                                  "integer class labels")
            Y = flat.astype(np.int64)
        if Y.min() < 0:
            raise _UsageError(f"--data: class labels must be integers >= 0 (0 .. classes-1), "
                              f"got {int(Y.min())}; use --task regression for a numeric target")
        if Y.max() >= MAX_CLASSES:  # one output per class: 10^12 labels would build 10^12
            raise _UsageError(f"--data: class labels must be 0 .. classes-1 with at most "
                              f"{MAX_CLASSES} classes, got a label {int(Y.max())}; use --task "
                              f"regression for a numeric target")
    if y_names is None:
        y_names = (["y"] if kind == "classification" or Y.shape[1] == 1
                   else [f"y{j}" for j in range(Y.shape[1])])
    return X, Y, kind, x_names, y_names, note


def _scheduler(args, opt, total: int):
    """``(scheduler or None, description)`` for --schedule and --warmup over ``total`` steps."""
    try:
        w = _lrs.check_warmup(args.warmup, total, "--warmup")
    except ValueError as e:
        raise _UsageError(str(e)) from None
    rest = total - w
    if args.schedule == "constant":
        main, text = None, "constant lr"
    elif args.schedule == "cosine":
        main, text = _lrs.CosineAnnealingLR(opt, T_max=rest), f"cosine to 0 over {rest} steps"
    elif args.schedule == "linear":
        main = _lrs.LinearLR(opt, start_factor=1.0, end_factor=0.0, total_iters=rest)
        text = f"linear to 0 over {rest} steps"
    else:
        size = args.step_size or max(1, rest // 3)
        main = _lrs.StepLR(opt, step_size=size, gamma=args.gamma)
        text = f"x{args.gamma:g} every {size} steps"
    if w == 0:
        return main, text
    # Warmup rates base*(k+1)/(w+1) for k = 0..w-1: never 0, reaching base at step w.
    warm = _lrs.LinearLR(opt, start_factor=1.0 / (w + 1), end_factor=1.0, total_iters=w)
    text = f"warmup {w} steps, then {text}"
    if main is None:
        return warm, text
    return _lrs.SequentialLR(opt, [warm, main], milestones=[w]), text


def _report_regression(out, names, r2, mae, extra, extra_name) -> None:
    width = max(len(s) for s in names)
    head = f"{'output':<7} {'target':<{width}}  {'R^2':>8}  {'MAE':>8}"
    print(head + (f"  {extra_name:>12}" if extra is not None else ""), file=out)
    for j in range(r2.shape[0]):
        line = f"y{j:<6} {names[j]:<{width}}  {r2[j]:8.5f}  {mae[j]:8.5f}"
        if extra is not None:
            line += f"  {extra[j]:12.4f}"
        print(line, file=out)


# The GEMM time of one step (the "time" line): replays of its recorded GEMM calls, at least
# GEMM_REPS[0], then until GEMM_BUDGET_S seconds of replays or GEMM_REPS[1] of them.
GEMM_REPS = (3, 30)
GEMM_BUDGET_S = 0.15


def step_gemm_time(args, model, d_in: int, d_out: int, loss, xb, yb) -> tuple:
    """``(median seconds, number)`` of the GEMMs of one training step of ``model`` on the batch
    ``xb``, ``yb``: a copy of the model (built again from ``args``, the trained parameters
    loaded) runs one forward, loss and backward inside ``kernels.instrument.record("gemm")``;
    its recorded GEMM calls are replayed on the copy's own buffers, each replay after putting
    back what the recorded calls left in their outputs (so replays cannot compound into
    overflow or denormals). The trained model, its loss and optimizer are not touched."""
    from kernels.instrument import replay
    twin = build_model(args, d_in, d_out, args.seed)
    twin.load_state_dict(model.state_dict())
    twin_loss = type(loss)()

    def step():
        twin_loss.forward(twin.forward(xb), yb)
        twin.backward(twin_loss.backward())
    try:
        run = replay(step, "gemm")
    except RuntimeError:  # no GEMM in the model
        return None, 0
    clock = time.perf_counter
    times: list = []
    while len(times) < GEMM_REPS[1] and (len(times) < GEMM_REPS[0]
                                         or sum(times) < GEMM_BUDGET_S):
        run.restore()
        t0 = clock()
        run()
        times.append(clock() - t0)
    return statistics.median(times), len(run.calls)


def train(args) -> int:
    try:
        return _train(args)
    except _UsageError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    except checkpoint.SaveError as e:  # the run is done; where its model went is the message
        print(f"error: {e}", file=sys.stderr)
        return 1


def _train(args) -> int:
    t_all = time.perf_counter()
    _check_args(args)
    if args.model == "gmlp-lm" or args.task == "text":  # the character LM: engine/lm.py
        from ..models import lm
        return lm.run_cli(args)
    if args.prompt is not None or args.sample_length is not None:
        raise _UsageError("--prompt, --sample-length: only with --model gmlp-lm --task text")
    from .. import distributed
    comm = distributed.world()  # K > 1 ranks under mpiexec: data parallel, else None
    rank = 0 if comm is None else comm.Get_rank()
    if args.threads is not None:
        kernels.set_num_threads(args.threads)
    elif comm is not None and kernels.ENV_VAR not in os.environ:
        local = int(os.environ.get("MPI_LOCALNRANKS", "1"))  # ranks on this machine (hydra)
        kernels.set_num_threads(max(1, (os.cpu_count() or 1) // local))
    dt = np.dtype(args.dtype)
    own = args.data is not None
    if own:
        X, Y, kind, x_names, y_names, note = _own_data(args, dt)
        task_name = kind
    else:
        task_name = args.task or "regression"
        X, Y, kind = make_task(task_name, args.samples, dtype=dt, rng=args.seed)
    classify = kind == "classification"
    n_all = X.shape[0]
    vf = _val_fraction(args)
    val = None
    if vf > 0:
        try:
            (X, Y), val = _data.train_val_split(X, Y, vf, rng=args.seed)
        except ValueError as e:
            raise _UsageError(f"--val-fraction: {e}") from None
    standardizer = None
    if args.standardize:
        standardizer = _data.Standardizer().fit(X)
        X = standardizer.transform(X)
        if val is not None:
            val = (standardizer.transform(val[0]), val[1])
    n, d_in = X.shape
    d_out = int(max(Y.max(), val[1].max() if val is not None else 0)) + 1 if classify else Y.shape[1]
    model = build_model(args, d_in, d_out, args.seed)
    loss = CrossEntropyLoss() if classify else MSELoss()
    try:
        opt = _optimizer(args, model, comm)
    except (ValueError, TypeError) as e:  # bad hyperparameters: the optimizer's message says which
        if rank == 0:
            print(f"error: {e}", file=sys.stderr)
        return 2
    bs = None if args.batch_size == 0 or args.batch_size >= n else args.batch_size
    total_steps = args.epochs * -(-n // (bs or n))
    opt_text = _opt_text(opt)  # before the schedule sets its first rate
    sched, sched_text = _scheduler(args, opt, max(total_steps, 1))
    callbacks = []
    if args.early_stopping is not None:
        stopper = EarlyStopping("val_loss", patience=args.early_stopping,
                                restore_best_weights=True)
        callbacks.append(stopper)

    out = sys.stdout if rank == 0 and not args.quiet else open(os.devnull, "w")  # rank 0 prints
    threads = f"{kernels.get_num_threads()} BLAS thread(s)"
    if comm is not None:
        shard = ", AdamW sharded (ZeRO-1)" if args.shard_optimizer else ""
        threads = f"{comm.Get_size()} ranks x {kernels.get_num_threads()} threads{shard}"
    print(f"blasnet {_version()} | numpy {np.__version__} | {args.dtype} | {threads}", file=out)
    print(f"model     {_describe(args, model, d_in, d_out)}", file=out)
    if own:
        target = (f"{d_out} classes" if classify else f"{Y.shape[1]} output(s)")
        print(f"data      {args.data}: {n_all} samples, {d_in} inputs -> "
              f"{', '.join(y_names)} ({kind}, {note}; {target})", file=out)
    else:
        task = {"regression": f"X uniform in [-3, 3]^{d_in} -> {d_out} smooth targets",
                "spiral": "two interleaved spirals, 2 classes", "xor": "the XOR truth table",
                "sine": "y = sin(x), x uniform in [-pi, pi]"}[task_name]
        print(f"task      {task_name}: {n} samples, {task}", file=out)
    if val is not None or standardizer is not None:
        parts = []
        if val is not None:
            parts.append(f"{n} for training, {val[0].shape[0]} for validation "
                         f"(val fraction {vf:g}, seed {args.seed})")
        if standardizer is not None:
            parts.append("inputs standardised with the training split's mean and std")
        print(f"split     {'; '.join(parts)}", file=out)
    extras = [sched_text]
    if args.clip_grad_norm is not None:
        extras.append(f"grad norm clipped at {args.clip_grad_norm:g}")
    if args.early_stopping is not None:
        extras.append(f"early stopping (patience {args.early_stopping})")
    print(f"training  {opt_text}, {'full batch' if bs is None else f'batches of {bs}'}, "
          f"{args.epochs} epochs, seed {args.seed}, {', '.join(extras)}", file=out)
    out.flush()

    every = args.log_every or max(1, args.epochs // 10)
    t0 = time.perf_counter()
    try:
        h = fit(model, loss, opt, X, Y, args.epochs, batch_size=bs, rng=args.seed,
                progress=False if args.quiet else every, validation=val, callbacks=callbacks, scheduler=sched,
                scheduler_interval="step", clip_grad_norm=args.clip_grad_norm, comm=comm)
    except (NonFiniteLossError, distributed.RankError) as e:  # raised on every rank
        if rank == 0:
            print(f"error: {e}", file=sys.stderr)
        return 1
    except TrainingInterrupted as e:  # Ctrl-C: say where it stopped, no traceback
        print(f"\n{e}", file=sys.stderr)
        return 130
    t_fit = time.perf_counter() - t0
    gemm_s = n_gemms = None
    if comm is None and h.steps > 0 and args.verbose:  # the step's own GEMMs, one process
        rows = bs or n
        gemm_s, n_gemms = step_gemm_time(args, model, d_in, d_out, loss, X[:rows], Y[:rows])
    if args.early_stopping is not None:
        if 0 < stopper.stopped_epoch < args.epochs:
            print(f"early stop after epoch {stopper.stopped_epoch}: best val_loss "
                  f"{stopper.best:.6g} at epoch {stopper.best_epoch} (its weights restored)",
                  file=out)
        else:
            print(f"no early stop; best val_loss {stopper.best:.6g} at epoch "
                  f"{stopper.best_epoch} (its weights restored)", file=out)

    final, acc = evaluate(model, loss, X, Y, bs)
    print(f"final loss {final:.6g} (eval mode, all {n} training samples)", file=out)
    if val is not None:
        vloss, vacc = evaluate(model, loss, *val, bs)
        line = f"val loss  {vloss:.6g} ({val[0].shape[0]} validation samples)"
        print(line, file=out)
    held = None
    if not own and task_name != "xor":
        Xh, Yh, _ = make_task(task_name, HELD_OUT, dtype=dt, rng=args.seed + 1)
        if standardizer is not None:
            Xh = standardizer.transform(Xh)
        held = (Xh, Yh)
    if classify:
        line = f"accuracy  {acc:.4f} on the training set"
        if val is not None:
            line += f", {vacc:.4f} on the validation set"
        if held is not None:
            _, hacc = evaluate(model, loss, *held, bs)
            line += f", {hacc:.4f} on {HELD_OUT} held-out samples"
        print(line, file=out)
    else:
        pred = predict(model, X, bs)
        r2, mae = r2_score(Y, pred), mean_absolute_error(Y, pred)
        if own:
            extra = r2_score(val[1], predict(model, val[0], bs)) if val is not None else None
            _report_regression(out, y_names, r2, mae, extra, "val R^2")
        else:
            hr2 = r2_score(held[1], predict(model, held[0], bs))
            names = REGRESSION_OUTPUTS if task_name == "regression" else ("sin(x)",)
            _report_regression(out, names, r2, mae, hr2, "held-out R^2")
            print(f"(held-out: {HELD_OUT} fresh samples drawn with seed {args.seed + 1})",
                  file=out)
    rate = h.samples / t_fit if t_fit > 0 else float("inf")
    line = f"time      {t_fit:.2f} s for {len(h)} epochs, {h.steps} steps ({rate:,.0f} samples/s)"
    if gemm_s:
        step_s = t_fit / h.steps
        line += (f"; step {1e3 * step_s:.2f} ms = {step_s / gemm_s:.2f}x its {n_gemms} GEMMs "
                 f"({1e3 * gemm_s:.2f} ms)")
    print(line, file=out)
    if args.history and rank == 0:  # one writer per file
        if args.history.lower().endswith(".json"):
            h.to_json(args.history)
        else:
            h.to_csv(args.history)
        print(f"history   {args.history} ({len(h)} epochs)", file=out)
    if args.plot and rank == 0:
        h.plot(args.plot, title=f"{args.model} on {os.path.basename(args.data) if own else task_name}")
        print(f"plot      {args.plot}", file=out)

    # Checkpoint: save, reload into a freshly initialised model (other seed), compare.
    tmpdir = None
    if args.save:
        path = args.save
    else:
        tmpdir = tempfile.TemporaryDirectory(prefix="blasnet-")
        path = os.path.join(tmpdir.name, f"{args.model}-{task_name}.npz")
    meta = dict(task=task_name, model=args.model, epochs=len(h), seed=args.seed, loss=final)
    if own:
        meta.update(data=args.data, x_cols=x_names, y_cols=y_names, kind=kind)
        if classify:
            meta["classes"] = d_out
    if standardizer is not None:
        meta["standardizer"] = standardizer.state_dict()
    try:
        tensors = path.lower().endswith(".safetensors")
        if comm is not None:  # rank 0 writes; it alone checks the reload (others may see no file)
            distributed.save(path, model, None if tensors else opt, comm=comm,
                             scheduler=None if tensors else sched, ranks=comm.Get_size(), **meta)
            if rank:
                return 0
        elif tensors:
            checkpoint.save_or_rescue(path, model, **meta)
        else:
            checkpoint.save_or_rescue(path, model, opt, scheduler=sched, **meta)
        fresh = build_model(args, d_in, d_out, args.seed + 1)
        checkpoint.load(path, fresh)
        reloaded, _ = evaluate(fresh, loss, X, Y, bs)
        same = "identical to" if reloaded == final else f"differs by {reloaded - final:.3g} from"
        size = os.path.getsize(path)
        where = path if args.save else f"{path} (temporary)"
        print(f"checkpoint {where}, {size / 1024:,.0f} KiB", file=out)
        print(f"reloaded into a fresh model: loss {reloaded:.6g} ({same} the trained model)",
              file=out)
    finally:
        if tmpdir is not None:
            tmpdir.cleanup()
    print(f"wall time {time.perf_counter() - t_all:.2f} s", file=out)
    return 0


# ----------------------------------------------------------------------------- info
def info(args) -> int:
    import scipy
    import threadpoolctl
    out = sys.stdout
    print(f"blasnet        {_version()}", file=out)
    print(f"python         {platform.python_version()} ({sys.executable})", file=out)
    print(f"numpy          {np.__version__}", file=out)
    print(f"scipy          {scipy.__version__}", file=out)
    print(f"threadpoolctl  {threadpoolctl.__version__}", file=out)
    print(f"platform       {platform.platform()}, {os.cpu_count()} CPUs", file=out)
    print(f"engine GEMMs   scipy.linalg.blas, {kernels.get_num_threads()} thread(s)", file=out)
    print("libraries (threadpoolctl):", file=out)
    for lib in kernels.blas_info():
        print(f"  {lib.get('user_api', '?'):<7} {lib.get('internal_api', '?'):<9} "
              f"{lib.get('version') or '?':<14} threads {lib.get('num_threads', '?'):<3} "
              f"shipped with {lib.get('owner', '?'):<6} {lib.get('filepath', '')}", file=out)
    print("environment:", file=out)
    for var in (kernels.ENV_VAR, "OPENBLAS_NUM_THREADS", "OMP_NUM_THREADS"):
        print(f"  {var}={os.environ.get(var, '(unset)')}", file=out)
    return 0


def main(argv=None) -> int:
    try:
        args = build_parser().parse_args(argv)
        args.argv = list(sys.argv[1:] if argv is None else argv)  # re-read by engine/lm.py
        if hasattr(args, "run"):
            code = args.run(args)
        else:
            code = info(args) if args.command == "info" else train(args)
        sys.stdout.flush()  # here, so a closed pipe surfaces inside the try
        return code
    except BrokenPipeError:
        # The reader went away (`... | head -1`): stop quietly, with the status of a process
        # killed by SIGPIPE. Point stdout at /dev/null so the exit-time flush cannot fail.
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        return 141

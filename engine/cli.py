"""``python -m engine``: ``train`` a model on a synthetic task, or print ``info`` on the
versions, BLAS libraries and thread counts.

The default ``train`` is seed 002's experiment (what ``make run`` runs): gMLP 16 -> 128 ->
512 -> 4 on 1024 samples of the regression task, full batch, AdamW lr 1e-3, 1000 epochs.
"""
from __future__ import annotations

import argparse
import os
import platform
import sys
import tempfile
import time

import numpy as np

import kernels

from . import checkpoint
from .blocks import FFN, GMLP, FFNSublayer
from .data import REGRESSION_OUTPUTS, TASKS, make_task
from .layers import MLP, Linear, Sequential
from .losses import CrossEntropyLoss, MSELoss
from .optim import SGD, AdamW
from .train import NonFiniteLossError, evaluate, fit, mean_absolute_error, predict, r2_score

MODELS = ("gmlp", "ffn", "sublayer", "mlp")
HELD_OUT = 4096  # fresh samples drawn (with another seed) to measure generalisation


def _version() -> str:
    try:
        from importlib.metadata import version
        return version("blasnet")
    except Exception:  # not installed as a distribution (e.g. run from a source tree)
        return "unknown"


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


def _sizes(text: str) -> list:
    try:
        sizes = [int(s) for s in text.split(",") if s.strip()]
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected comma-separated integers, got {text!r}") from None
    if not sizes or min(sizes) < 1:
        raise argparse.ArgumentTypeError(f"expected positive comma-separated integers, got {text!r}")
    return sizes


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
    parser = argparse.ArgumentParser(
        prog="python -m engine",
        description="blasnet: train feed-forward transformer blocks on the CPU through BLAS.",
        epilog="Run 'python -m engine train --help' for the training options. Threads: "
               "--threads, or BLASNET_NUM_THREADS=N in the environment.")
    sub = parser.add_subparsers(dest="command", metavar="{train,info}")
    sub.required = True
    d = _HelpFormatter
    t = sub.add_parser(
        "train", formatter_class=d, help="train a model on a synthetic task",
        description="Train a model on a synthetic task, report its fit, save a checkpoint and "
                    "check that it reloads. The defaults are seed 002's experiment: a gMLP "
                    "16 -> 128 -> 512 -> 4 on 1024 regression samples, full batch, AdamW lr "
                    "1e-3, 1000 epochs.")
    g = t.add_argument_group("model")
    g.add_argument("--model", choices=MODELS, default="gmlp",
                   help="gmlp: GMLP(d_in, d_hidden, d_ff, d_out); ffn: Linear(d_in, d_hidden) -> "
                        "FFN(d_hidden, d_ff) -> Linear(d_hidden, d_out); sublayer: the same with "
                        "an FFNSublayer (residual + LayerNorm) in the middle; mlp: MLP with the "
                        "--hidden sizes")
    g.add_argument("--d-hidden", type=_positive, default=128, metavar="N",
                   help="gMLP d_hidden (width after W_in); d_model of the ffn/sublayer models")
    g.add_argument("--d-ff", type=_positive, default=512, metavar="N",
                   help="gMLP d_ffn (width of the gate and projection); d_ff of ffn/sublayer")
    g.add_argument("--hidden", type=_sizes, default="64,32", metavar="N,N,...",
                   help="hidden layer sizes of the mlp model")
    g.add_argument("--activation", default="relu", choices=kernels.ACTIVATIONS,
                   help="activation of the ffn, sublayer and mlp models (gMLP uses GELU and "
                        "a sigmoid gate)")
    g.add_argument("--norm", choices=("post", "pre"), default="post",
                   help="LayerNorm placement of the sublayer model")
    g = t.add_argument_group("data")
    g.add_argument("--task", choices=sorted(TASKS), default="regression",
                   help="regression: X uniform in [-3, 3]^16, 4 smooth nonlinear targets (MSE); "
                        "spiral: two-spiral classification in 2-D (cross-entropy); xor: the 4 "
                        "XOR points (cross-entropy); sine: y = sin(x) on [-pi, pi] (MSE)")
    g.add_argument("--samples", type=_positive, default=None, metavar="N",
                   help="training samples (default: 1024 regression, 1000 spiral, 256 sine; "
                        "xor always has 4)")
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
    g.add_argument("--dtype", choices=("float32", "float64"), default="float32",
                   help="dtype of data, parameters and buffers")
    g.add_argument("--threads", type=_positive, default=None, metavar="N",
                   help="BLAS threads (default: BLASNET_NUM_THREADS, else the libraries' own)")
    g.add_argument("--seed", type=int, default=0,
                   help="seed of the data, the initialisation and the shuffling")
    g.add_argument("--log-every", type=_positive, default=None, metavar="N",
                   help="print the loss every N epochs (default: epochs / 10)")
    g.add_argument("--save", default=None, metavar="PATH",
                   help="write the checkpoint (.npz) here (default: a temporary directory, "
                        "removed at exit)")
    sub.add_parser("info", help="print versions, BLAS libraries and thread counts",
                   description="Print the versions of Python, numpy, scipy, threadpoolctl and "
                               "blasnet, the BLAS/OpenMP libraries loaded with their thread "
                               "counts, and the thread-related environment variables.")
    return parser


# ----------------------------------------------------------------------------- train
def build_model(args, d_in: int, d_out: int, seed: int):
    """The model named by ``args.model`` for a task with ``d_in`` inputs and ``d_out`` outputs."""
    dt, rng = np.dtype(args.dtype), np.random.default_rng(seed)
    if args.model == "gmlp":
        return GMLP(d_in, args.d_hidden, args.d_ff, d_out, dtype=dt, rng=rng)
    if args.model == "mlp":
        acts = [args.activation] * len(args.hidden) + [None]
        return MLP([d_in, *args.hidden, d_out], acts, dtype=dt, rng=rng)
    d = args.d_hidden
    if args.model == "ffn":
        middle = FFN(d, args.d_ff, args.activation, dtype=dt, rng=rng)
    else:
        middle = FFNSublayer(d, args.d_ff, args.activation, norm=args.norm, dtype=dt, rng=rng)
    return Sequential(Linear(d_in, d, dtype=dt, rng=rng), middle,
                      Linear(d, d_out, init="xavier", dtype=dt, rng=rng))


def _describe(args, model, d_in: int, d_out: int) -> str:
    if args.model == "gmlp":
        shape = f"{d_in} -> {args.d_hidden} -> {args.d_ff} -> {d_out}"
    elif args.model == "mlp":
        shape = " -> ".join(str(s) for s in [d_in, *args.hidden, d_out])
    else:
        shape = f"{d_in} -> {args.d_hidden} -> [{args.model} d_ff {args.d_ff}] -> {d_out}"
    return f"{args.model} {shape} ({type(model).__name__}, {model.num_parameters():,} parameters)"


def _optimizer(args, model):
    if args.optimizer == "adamw":
        wd = 1e-2 if args.weight_decay is None else args.weight_decay
        return AdamW(model.parameters(), lr=args.lr, weight_decay=wd)
    wd = 0.0 if args.weight_decay is None else args.weight_decay
    return SGD(model.parameters(), lr=args.lr, momentum=args.momentum, weight_decay=wd)


def _opt_text(opt) -> str:
    g = opt.param_groups[0]
    return f"{type(opt).__name__}(" + ", ".join(f"{k}={g[k]}" for k in opt.defaults) + ")"


def train(args) -> int:
    t_all = time.perf_counter()
    if args.threads is not None:
        kernels.set_num_threads(args.threads)
    dt = np.dtype(args.dtype)
    X, Y, kind = make_task(args.task, args.samples, dtype=dt, rng=args.seed)
    classify = kind == "classification"
    n, d_in = X.shape
    d_out = int(Y.max()) + 1 if classify else Y.shape[1]
    model = build_model(args, d_in, d_out, args.seed)
    loss = CrossEntropyLoss() if classify else MSELoss()
    try:
        opt = _optimizer(args, model)
    except (ValueError, TypeError) as e:  # bad hyperparameters: the optimizer's message says which
        print(f"error: {e}", file=sys.stderr)
        return 2
    bs = None if args.batch_size == 0 or args.batch_size >= n else args.batch_size

    out = sys.stdout
    print(f"blasnet {_version()} | numpy {np.__version__} | {args.dtype} | "
          f"{kernels.get_num_threads()} BLAS thread(s)", file=out)
    print(f"model     {_describe(args, model, d_in, d_out)}", file=out)
    task = {"regression": f"X uniform in [-3, 3]^{d_in} -> {d_out} smooth targets",
            "spiral": "two interleaved spirals, 2 classes", "xor": "the XOR truth table",
            "sine": "y = sin(x), x uniform in [-pi, pi]"}[args.task]
    print(f"task      {args.task}: {n} samples, {task}", file=out)
    print(f"training  {_opt_text(opt)}, {'full batch' if bs is None else f'batches of {bs}'}, "
          f"{args.epochs} epochs, seed {args.seed}", file=out)
    out.flush()

    every = args.log_every or max(1, args.epochs // 10)
    t0 = time.perf_counter()
    try:
        h = fit(model, loss, opt, X, Y, args.epochs, batch_size=bs, rng=args.seed,
                progress=every)
    except NonFiniteLossError as e:
        print(f"error: {e}", file=sys.stderr)
        return 1
    t_fit = time.perf_counter() - t0

    final, acc = evaluate(model, loss, X, Y, bs)
    print(f"final loss {final:.6g} (eval mode, all {n} training samples)", file=out)
    held = None
    if args.task != "xor":
        Xh, Yh, _ = make_task(args.task, HELD_OUT, dtype=dt, rng=args.seed + 1)
        held = (Xh, Yh)
    if classify:
        line = f"accuracy  {acc:.4f} on the training set"
        if held is not None:
            _, hacc = evaluate(model, loss, *held, bs)
            line += f", {hacc:.4f} on {HELD_OUT} held-out samples"
        print(line, file=out)
    else:
        pred = predict(model, X, bs)
        r2, mae = r2_score(Y, pred), mean_absolute_error(Y, pred)
        hr2 = r2_score(held[1], predict(model, held[0], bs))
        names = REGRESSION_OUTPUTS if args.task == "regression" else ("sin(x)",)
        width = max(len(s) for s in names)
        print(f"{'output':<7} {'target':<{width}}  {'R^2':>8}  {'MAE':>8}  "
              f"{'held-out R^2':>12}", file=out)
        for j in range(r2.shape[0]):
            print(f"y{j:<6} {names[j]:<{width}}  {r2[j]:8.5f}  {mae[j]:8.5f}  {hr2[j]:12.4f}",
                  file=out)
        print(f"(held-out: {HELD_OUT} fresh samples drawn with seed {args.seed + 1})", file=out)
    rate = h.samples / t_fit if t_fit > 0 else float("inf")
    print(f"time      {t_fit:.2f} s for {args.epochs} epochs, {h.steps} steps "
          f"({rate:,.0f} samples/s)", file=out)

    # Checkpoint: save, reload into a freshly initialised model (other seed), compare.
    tmpdir = None
    if args.save:
        path = args.save
    else:
        tmpdir = tempfile.TemporaryDirectory(prefix="blasnet-")
        path = os.path.join(tmpdir.name, f"{args.model}-{args.task}.npz")
    try:
        checkpoint.save(path, model, opt, task=args.task, model=args.model, epochs=args.epochs,
                        seed=args.seed, loss=final)
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
    args = build_parser().parse_args(argv)
    if args.command == "info":
        return info(args)
    return train(args)

"""The ``blasnet`` command line's parser: the ``train`` and ``info`` commands and their
options. Number options use the engine's own checks (engine/_checks.py)."""
from __future__ import annotations

import argparse
import os
import sys

import kernels

from .. import __version__
from .._checks import argparse_int, argparse_real
from ..data import TASKS
from ..models import registry
from . import inspect_cmd, predict_cmd, sample_cmd
from .inputs import add_data_options

__all__ = ["build_parser", "CommandParser", "MODELS", "SCHEDULES", "block_models",
           "train_actions"]

# The character language models, after the registry's blocks (--task text): engine/models/lm.py's
# and the GPT of engine/models/gpt_lm.py.
LM_MODELS = {"gmlp-lm": "the attention-free character language model (--task text; "
                        "docs/lm.md)",
             "gpt": "a GPT character language model (--task text; docs/lm.md)"}
SCHEDULES = ("constant", "cosine", "linear", "step")


def block_models() -> dict:
    """``--model`` name -> registry entry, for every block the registry offers to the CLI
    (its ``cli`` declaration), in registry order."""
    return {b.cli[0]: b for b in registry.BLOCKS.values() if b.cli}


def __getattr__(name):
    if name == "MODELS":  # read when asked: a block registered later is offered too
        return (*block_models(), *LM_MODELS)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def _prog() -> str:
    return "blasnet" if os.path.basename((sys.argv or [""])[0]) == "blasnet" else "python -m engine"


# ----------------------------------------------------------------------------- parser
_int_at_least = argparse_int
_positive = argparse_int(1, "a positive integer")
_nonnegative_int = argparse_int(0, "an integer >= 0")
_float_in = argparse_real


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


class _Unset:
    """The placeholder of an option not on the command line while the parser runs."""

    def __repr__(self) -> str:
        return "<not given>"


_UNSET = _Unset()


class CommandParser(argparse.ArgumentParser):
    """The parser of each command (``train``, ``info``, ...). Besides the values it records ``args.given``: each
    option on the command line (its dest) with its flag. A model with defaults of its own
    (the language models, engine/cli/lm.py) takes exactly the options given from it, even
    one given equal to the generic default, from this one parse of the command line."""

    def parse_known_args(self, args=None, namespace=None):
        namespace = argparse.Namespace() if namespace is None else namespace
        flags = {a.dest: a.option_strings[0] for a in self._actions
                 if a.option_strings and a.dest is not argparse.SUPPRESS
                 and a.default is not argparse.SUPPRESS}
        for dest in flags:  # argparse fills only the dests still missing with defaults
            if not hasattr(namespace, dest):
                setattr(namespace, dest, _UNSET)
        namespace, extras = super().parse_known_args(args, namespace)
        given = {}
        for a in self._actions:
            if a.dest not in flags:
                continue
            if getattr(namespace, a.dest) is _UNSET:
                setattr(namespace, a.dest, a.default)
            else:
                given[a.dest] = flags[a.dest]
        namespace.given = given
        return namespace, extras


class _SizesAction(argparse.Action):
    """``--hidden 64 64``, the space-separated form every list flag takes; ``64,64`` (the
    older spelling) is read too. The values land as one flat list."""

    def __call__(self, parser, namespace, values, option_string=None):
        setattr(namespace, self.dest, [n for v in values for n in v])


def build_parser() -> argparse.ArgumentParser:
    prog = _prog()
    parser = argparse.ArgumentParser(
        prog=prog,
        description="blasnet: train feed-forward transformer blocks on the CPU through BLAS.",
        epilog=f"Run '{prog} train --help' for the training options. Threads: "
               "--threads, or BLASNET_NUM_THREADS=N in the environment.")
    parser.add_argument("--version", action="version", version=f"blasnet {__version__}")
    sub = parser.add_subparsers(dest="command", parser_class=CommandParser,
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
    _model_options(t)
    _data_options(t)
    _training_options(t)
    _output_options(t)
    _lm_options(t)
    sub.add_parser("info", help="print versions, BLAS libraries, kernels and thread counts",
                   description="Print the versions of Python, numpy, scipy, threadpoolctl, "
                               "numba and blasnet, the BLAS/OpenMP libraries loaded with the "
                               "kernel each runs and its thread count, the CPU's best SIMD "
                               "level, and the related environment variables. When "
                               "OPENBLAS_CORETYPE holds OpenBLAS below what the CPU supports, "
                               "one line says so with both kernels' sgemm rate, measured on "
                               "the spot. Changes nothing.")
    for command in (inspect_cmd, predict_cmd, sample_cmd):  # a saved model's uses
        command.add_parser(sub)
    return parser


def _model_options(t) -> None:
    """The model and its sizes."""
    g = t.add_argument_group("model")
    helps = {name: b.cli[1] for name, b in block_models().items()} | LM_MODELS
    g.add_argument("--model", choices=tuple(helps), default="gmlp",
                   help="; ".join(f"{name}: {text}" for name, text in helps.items()))
    g.add_argument("--d-hidden", type=_positive, default=128, metavar="N",
                   help="gMLP d_hidden (width after W_in); d_model of the ffn/sublayer models; "
                        "for gmlp-lm and gpt, d_model (= --n-embd)")
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


def _data_options(t) -> None:
    """The task or the user's data, and the split."""
    g = t.add_argument_group("data")
    g.add_argument("--task", choices=sorted(TASKS) + ["classification", "text"], default=None,
                   help="synthetic tasks: regression (the default): X uniform in [-3, 3]^16, 4 "
                        "smooth nonlinear targets (MSE); spiral: two-spiral classification in "
                        "2-D (cross-entropy); xor: the 4 XOR points (cross-entropy); sine: y = "
                        "sin(x) on [-pi, pi] (MSE). With --data: regression or classification "
                        "(default: inferred; classification only for a small label set, "
                        "engine/cli/task_rule.py). text: "
                        "next-token prediction (gmlp-lm, gpt) on --text FILE or Python's own "
                        "help texts")
    g.add_argument("--samples", type=_int_at_least(2, "an integer >= 2 (R^2 and accuracy need "
                                                    "two samples or more)"),
                   default=None, metavar="N",
                   help="training samples (default: 1024 regression, 1000 spiral, 256 sine; "
                        "xor always has 4)")
    add_data_options(g, "train on your own data: a .csv file (header row, numbers only) or a "
                        ".npz file (arrays x and y)",
                     "input columns of the CSV (default: all but --y-cols), or the input array "
                     "of the .npz (default: x)")
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


def _training_options(t) -> None:
    """Optimizer, schedule, stopping, dtype, threads, seed, logging."""
    g = t.add_argument_group("training")
    g.add_argument("--epochs", type=_nonnegative_int, default=1000, metavar="N",
                   help="passes over the training set")
    g.add_argument("--batch-size", "--batch_size", type=_nonnegative_int, default=0, metavar="N",
                   help="rows per step; 0 = full batch")
    g.add_argument("--optimizer", choices=("adamw", "sgd"), default="adamw",
                   help="AdamW (PyTorch semantics) or SGD with optional momentum")
    g.add_argument("--lr", "--learning-rate", "--learning_rate", type=float, default=1e-3,
                   help="learning rate")
    g.add_argument("--weight-decay", "--weight_decay", type=float, default=None, metavar="WD",
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


def _output_options(t) -> None:
    """Checkpoint, history and plot paths."""
    g = t.add_argument_group("output")
    g.add_argument("--save", default=None, metavar="PATH",
                   help="write the checkpoint here: .npz (parameters, optimizer and schedule "
                        "state) or .safetensors (parameters only) (default: an .npz in a "
                        "temporary directory, removed at exit)")
    g.add_argument("--resume", default=None, metavar="CHECKPOINT",
                   help="continue the run saved in CHECKPOINT (an interrupted run's, or a "
                        "--save .npz of a finished one): its model, data and training options "
                        "are used unless given again (a different --model, --hidden, ... is "
                        "an error); --epochs is the run's total")
    g.add_argument("--out-dir", "--out_dir", default=None, metavar="DIR",
                   help="gpt, gmlp-lm (nanoGPT's out_dir): write DIR/ckpt.npz at each held-out "
                        "estimate that improves on the best so far, and DIR/last.npz at every "
                        "estimate (the final one at the end); both resumable (--resume "
                        "DIR/ckpt.npz) and loadable (blasnet sample)")
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


def _lm_options(t) -> None:
    """The language models' own options: the text, and nanoGPT's training knobs by its names
    (each also spelled with underscores, as nanoGPT's command line)."""
    g = t.add_argument_group(
        "language models (--model gmlp-lm | gpt; docs/lm.md)",
        "Also read: --batch-size, --lr, --weight-decay, --epochs, --seed, --dtype, --threads, "
        "--save, --log-every; each keeps the language model's own default "
        "(engine.models.lm.LMConfig, engine.models.gpt_lm.GPTConfig) unless given. Older "
        "spellings: --layers = --n-layer, --heads = --n-head, --seq-len = --block-size, "
        "--d-hidden = --n-embd (d_model, the residual width), --d-ff = the FFN's width "
        "(gmlp-lm: d_ffn), --warmup = --warmup-iters.")

    def add(name, **kw):  # --n-layer and --n_layer
        flags = dict.fromkeys((f"--{name}", f"--{name.replace('-', '_')}"))
        g.add_argument(*flags, **kw)
    add("text", default=None, metavar="FILE",
        help="train on this UTF-8 text file (any size) instead of the built-in corpus "
             "(Python's help texts)")
    add("tokenizer", choices=("char", "byte"), default=None,
        help="char: the text's distinct characters (default); byte: its UTF-8 bytes, 256 ids, "
             "any file")
    add("config", default=None, metavar="FILE",
        help="a recipe: a TOML or JSON file of these options by name (n_layer = 4); options "
             "on the command line override it")
    add("prompt", default=None, metavar="TEXT",
        help="text the generated sample starts from (default: 'The ')")
    add("sample-length", type=_nonnegative_int, default=None, metavar="N",
        help="tokens to generate after the prompt (default: 300)")
    for name, what in (("n-layer", "TransformerBlocks (gmlp-lm: GMLPBlocks) (default: 4)"),
                       ("n-head", "gpt: attention heads, dividing --n-embd (default: 4)"),
                       ("n-embd", "width of the embeddings and residual stream (default: 128)"),
                       ("block-size", "tokens per window, the context (default: 64)")):
        add(name, type=_positive, default=None, metavar="N", help=what)
    g.add_argument("--layers", type=_positive, default=None, metavar="N", help="= --n-layer")
    g.add_argument("--heads", type=_positive, default=None, metavar="N", help="= --n-head")
    g.add_argument("--seq-len", type=_positive, default=None, metavar="N", help="= --block-size")
    add("dropout", type=_float_in(0.0, 1.0, "a number in [0, 1)", high_open=True), default=None,
        metavar="P", help="gpt: dropout rate (default: 0)")
    add("bias", action=argparse.BooleanOptionalAction, default=None,
        help="gpt: biases in the Linear layers and LayerNorms (default: on)")
    add("max-iters", type=_nonnegative_int, default=None, metavar="N",
        help="train N steps on random windows (nanoGPT's get_batch) instead of --epochs "
             "over non-overlapping ones")
    add("warmup-iters", type=_nonnegative_int, default=None, metavar="N",
        help="steps of linear warmup (default: gpt 50, gmlp-lm 100)")
    add("lr-decay-iters", type=_positive, default=None, metavar="N",
        help="the step the cosine decay reaches --min-lr (default: the last step)")
    add("min-lr", type=_float_in(0.0, None, "a number >= 0"), default=None, metavar="LR",
        help="learning rate at the end of the cosine (default: 0)")
    for name, default in (("beta1", "0.9"), ("beta2", "gpt 0.99, gmlp-lm 0.999")):
        add(name, type=_float_in(0.0, 1.0, "a number in [0, 1)", high_open=True), default=None,
            metavar="B", help=f"AdamW's {name} (default: {default})")
    add("grad-clip", type=_float_in(0.0, None, "a number >= 0"), default=None, metavar="MAX",
        help="clip the gradient to this global L2 norm; 0: no clipping (default: 0)")
    add("eval-interval", type=_positive, default=None, metavar="N",
        help="--max-iters runs: steps between held-out estimates (default: a tenth)")
    add("eval-iters", type=_positive, default=None, metavar="N",
        help="--max-iters runs: batches of held-out windows per estimate (default: 20)")
    add("log-interval", type=_nonnegative_int, default=None, metavar="N",
        help="print the training loss every N steps; 0: never (default: 0)")


def train_actions() -> dict:
    """The ``train`` command's options by dest: what a ``--config`` recipe may set."""
    for a in build_parser()._actions:
        if isinstance(a, argparse._SubParsersAction):
            return {x.dest: x for x in a.choices["train"]._actions if x.option_strings}
    raise RuntimeError("the parser has no train command")  # pragma: no cover

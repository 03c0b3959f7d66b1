"""``train --model gmlp-lm --task text``: the character language model's command line
(its options, the report, the checkpoint round trip); the model itself is engine/models/lm.py."""
from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time
from dataclasses import asdict

import numpy as np

import kernels

from .. import __version__
from .._checks import argparse_int, argparse_real, check_dtype
from ..models import lm
from ..training import checkpoint

__all__ = ["cli_parser", "config_from_options", "run_cli"]


def cli_parser() -> argparse.ArgumentParser:
    """The options of ``train --model gmlp-lm --task text``, each defaulting to ``LMConfig``'s
    value: the language model re-reads the command line with it, so an option counts as given
    exactly when it is on the command line, and one it does not read is an error."""
    c = lm.LMConfig()
    p = argparse.ArgumentParser(prog="python -m engine train --model gmlp-lm --task text",
                                allow_abbrev=False)
    p.add_argument("--model", choices=("gmlp-lm", "gmlp"), default="gmlp-lm")
    p.add_argument("--task", choices=("text",), default="text")
    p.add_argument("--d-hidden", dest="d_model", type=argparse_int(1, "a positive integer"),
                   default=c.d_model)
    p.add_argument("--d-ff", dest="d_ffn", type=argparse_int(2, "an integer >= 2"),
                   default=c.d_ffn)
    p.add_argument("--epochs", type=argparse_int(0, "an integer >= 0"), default=c.epochs)
    p.add_argument("--batch-size", type=argparse_int(1, "a positive integer"),
                   default=c.batch_size)
    p.add_argument("--lr", type=argparse_real(0.0, None, "a number >= 0"), default=c.lr)
    p.add_argument("--weight-decay", type=argparse_real(0.0, None, "a number >= 0"),
                   default=c.weight_decay)
    p.add_argument("--warmup", type=argparse_int(0, "an integer >= 0"), default=c.warmup)
    p.add_argument("--seed", type=argparse_int(0, "an integer >= 0"), default=c.seed)
    p.add_argument("--dtype", choices=("float32", "float64"), default=c.dtype)
    p.add_argument("--threads", type=argparse_int(1, "a positive integer"), default=None)
    p.add_argument("--save", default=None)
    p.add_argument("--log-every", type=argparse_int(1, "a positive integer"), default=1)
    p.add_argument("--quiet", action="store_true")
    p.add_argument("--verbose", action="store_true")  # accepted: the LM prints no GEMM line
    p.add_argument("--prompt", default=c.prompt)
    p.add_argument("--sample-length", type=argparse_int(0, "an integer >= 0"),
                   default=c.sample_length)
    return p


def config_from_options(o) -> "lm.LMConfig":
    """``LMConfig`` of the options ``cli_parser`` read."""
    c = lm.LMConfig()
    for name in ("d_model", "d_ffn", "epochs", "batch_size", "lr", "weight_decay", "warmup",
                 "seed", "dtype", "prompt", "sample_length"):
        setattr(c, name, getattr(o, name))
    return c


def run_cli(args, out=None) -> int:
    """``python -m engine train --model gmlp-lm --task text``: train, report, save and
    reload the checkpoint. ``args`` is the engine CLI's namespace; the options are re-read
    from its ``argv`` (the command line) by ``cli_parser``. Returns the exit status."""
    out = out or sys.stdout
    if args.model not in ("gmlp", "gmlp-lm") or args.task not in (None, "text"):
        print(f"error: --model {args.model} --task {args.task}: the text task trains the "
              f"gmlp-lm model (--model gmlp-lm --task text)", file=sys.stderr)
        return 2
    argv = list(getattr(args, "argv", None) or [])
    argv = argv[argv.index("train") + 1:] if "train" in argv else []
    try:
        o = cli_parser().parse_args(argv)
    except SystemExit as e:  # argparse has printed the usage and the error
        return 2 if e.code else 0
    c = config_from_options(o)
    if o.quiet:
        out = open(os.devnull, "w")  # noqa: SIM115  (closed with the process)
    if o.threads is not None:
        kernels.set_num_threads(o.threads)
    t_all = time.perf_counter()
    print(f"blasnet {__version__} | numpy {np.__version__} | {c.dtype} | "
          f"{kernels.get_num_threads()} BLAS thread(s)", file=out)
    try:
        s = lm.setup(c)
    except (ValueError, TypeError) as e:  # e.g. a prompt with characters the corpus does not have
        print(f"error: {e}", file=sys.stderr)
        return 2
    _banner(out, c, s)
    r = lm.train(progress=False if o.quiet else o.log_every, prepared=s)
    lm.print_result(out, c, r)
    if not _round_trip(out, o, c, s, r):
        return 1
    print(f"wall time {time.perf_counter() - t_all:.1f} s", file=out)
    return 0


def _banner(out, c, s) -> None:
    v = len(s.vocab)
    print(f"corpus    {lm.corpus_description(s.text)}", file=out)
    print(f"split     {len(s.train_ids):,} training / {len(s.held_ids):,} held-out characters "
          f"(every {round(1 / c.held_out)}th block of {c.block}), vocabulary {v}", file=out)
    print(f"model     gmlp-lm: Embedding({v}, {c.d_model}) -> {c.blocks} x GMLPBlock("
          f"{c.d_model}, d_ffn {c.d_ffn}, seq_len {c.seq_len}, causal) -> LayerNorm -> "
          f"Linear({c.d_model}, {v}); {s.model.num_parameters():,} parameters", file=out)
    print(f"training  AdamW(lr={c.lr}, weight_decay={c.weight_decay}), {c.warmup} warmup "
          f"steps then cosine; {c.epochs} epochs x {s.steps // max(c.epochs, 1)} steps of "
          f"{c.batch_size} windows of {c.seq_len}; seed {c.seed}", file=out)
    out.flush()


def _round_trip(out, o, c, s, r) -> bool:
    """Save the checkpoint, reload it into a fresh model, compare the held-out loss; False
    when the save failed (the message says where the trained model went)."""
    tmpdir = None
    if o.save:
        path = o.save
    else:
        tmpdir = tempfile.TemporaryDirectory(prefix="blasnet-")
        path = os.path.join(tmpdir.name, "gmlp-lm.npz")
    try:
        meta = dict(model="gmlp-lm", vocab=s.vocab.chars, held_bits=r.held_bits,
                    config=asdict(c))
        try:
            if path.lower().endswith(".safetensors"):
                checkpoint.save_or_rescue(path, s.model, **meta)
            else:
                checkpoint.save_or_rescue(path, s.model, s.optimizer, **meta)
        except checkpoint.SaveError as e:  # the trained model is in e.rescued
            print(f"error: {e}", file=sys.stderr)
            return False
        fresh = lm.build_model(len(s.vocab), c.seq_len, c.d_model, c.d_ffn, c.blocks,
                               check_dtype(c.dtype), c.seed + 1)
        checkpoint.load(path, fresh)
        again = lm.bits_per_char(fresh, s.Xh, s.Yh, c.batch_size)
        same = ("identical" if again == r.held_bits else f"differs by {again - r.held_bits:.3g}")
        where = path if o.save else f"{path} (temporary)"
        print(f"checkpoint {where}, {os.path.getsize(path) / 1024:,.0f} KiB; reloaded: "
              f"held-out {again:.3f} bits/char ({same})", file=out)
    finally:
        if tmpdir is not None:
            tmpdir.cleanup()
    return True

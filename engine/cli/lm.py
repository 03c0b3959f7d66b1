"""``train --model gmlp-lm|gpt --task text``: the two character language models' command line
(the options each reads, the banner, the report, the checkpoint round trip); the models are
engine/models/lm.py and engine/models/gpt_lm.py.

The ``train`` parser reads the command line once. A language model's config starts from its
own defaults (``LMConfig``, ``GPTConfig``) and takes exactly the options on the command line
(``args.given``), so the generic defaults (``--epochs 1000``, ...) never reach it and an
option it does not read is an error.
"""
from __future__ import annotations

import io
import os
import sys
import tempfile
import time
from dataclasses import asdict, dataclass

import numpy as np

from .. import __version__, distributed
from .._checks import check_dtype, check_int, check_real
from ..models import gpt_lm, lm
from ..training import checkpoint
from .inputs import UsageError

__all__ = ["LanguageModelCLI", "GMLP_LM", "GPT", "config_of", "run_cli"]

# Options of the run itself (not of the config) that both models read; --log-every defaults
# to every epoch for them.
RUN_OPTIONS = ("model", "task", "threads", "save", "log_every", "shard_optimizer")
LOG_EVERY = 1

# Parsed option -> (config field, least value; None: not a number) for what both models read.
COMMON = {"epochs": ("epochs", 0), "batch_size": ("batch_size", 1), "lr": ("lr", 0.0),
          "weight_decay": ("weight_decay", 0.0), "warmup": ("warmup", 0),
          "seed": ("seed", 0), "dtype": ("dtype", None), "prompt": ("prompt", None),
          "sample_length": ("sample_length", 0), "d_hidden": ("d_model", 1)}


@dataclass(frozen=True, kw_only=True)
class LanguageModelCLI:
    """One language model as the command line runs it."""
    name: str           # its --model
    models: tuple       # the --model values that run it
    module: object      # its setup and train (looked up at call time)
    config: type        # its config dataclass: the defaults
    options: dict       # parsed option -> (config field, least value), beyond COMMON
    rebuild: object     # (vocab size, config, seed) -> a fresh model
    describe: object    # (config, setup) -> the banner's model line
    extra: tuple = ()   # run options beyond RUN_OPTIONS it accepts
    mpi: bool = False   # trains data parallel under mpiexec


def _gmlp_lm_model(vocab_size: int, c, seed: int):
    return lm.build_model(vocab_size, c.seq_len, c.d_model, c.d_ffn, c.blocks,
                          check_dtype(c.dtype), seed)


def _gmlp_lm_line(c, s) -> str:
    v = len(s.vocab)
    return (f"gmlp-lm: Embedding({v}, {c.d_model}) -> {c.blocks} x GMLPBlock({c.d_model}, "
            f"d_ffn {c.d_ffn}, seq_len {c.seq_len}, causal) -> LayerNorm -> Linear("
            f"{c.d_model}, {v}); {s.model.num_parameters():,} parameters")


def _gpt_line(c, s) -> str:
    return (f"gpt: {c.n_layer} layers, {c.n_head} heads, d_model {c.d_model}, d_ff {c.d_ff}, "
            f"block_size {c.seq_len}, tied head; {s.model.num_parameters():,} parameters")


GMLP_LM = LanguageModelCLI(name="gmlp-lm", models=("gmlp-lm", "gmlp"), module=lm,
                           config=lm.LMConfig, options={"d_ff": ("d_ffn", 2)},
                           rebuild=_gmlp_lm_model, describe=_gmlp_lm_line,
                           extra=("quiet", "verbose"), mpi=True)
GPT = LanguageModelCLI(name="gpt", models=("gpt",), module=gpt_lm, config=gpt_lm.GPTConfig,
                       options={"d_ff": ("d_ff", 1), "layers": ("n_layer", 1),
                                "heads": ("n_head", 1), "seq_len": ("seq_len", 1)},
                       rebuild=lambda vocab_size, c, seed: gpt_lm.build_model(vocab_size, c, seed),
                       describe=_gpt_line, mpi=True)


def config_of(args, spec: LanguageModelCLI):
    """``spec``'s config: its defaults, with each option given on the command line
    (``args.given``); UsageError for an option it does not read or a number below its
    least value."""
    fields = {**COMMON, **spec.options}
    c = spec.config()
    for dest, flag in args.given.items():
        if dest in RUN_OPTIONS or dest in spec.extra:
            continue
        if dest not in fields:
            raise UsageError(f"unrecognized arguments: {flag} (not read by --model "
                             f"{spec.name} --task text)")
        field, low = fields[dest]
        v = getattr(args, dest)
        try:
            if isinstance(low, float):
                v = check_real(flag, v, low)
            elif low is not None:
                v = check_int(flag, v, low)
        except (TypeError, ValueError) as e:
            raise UsageError(str(e)) from None
        setattr(c, field, v)
    return c


def run_cli(args, out=None) -> int:
    """``python -m engine train --model gmlp-lm|gpt --task text``: train, report, save and
    reload the checkpoint. Under ``mpiexec -n K`` the GPT's ranks each train their share of
    every global batch and rank 0 reports. Returns the exit status."""
    spec = GPT if args.model == "gpt" else GMLP_LM
    if args.model not in spec.models or args.task not in (None, "text"):
        raise UsageError(f"--model {args.model} --task {args.task}: the text task trains the "
                         f"{spec.name} model (--model {spec.name} --task text)")
    c = config_of(args, spec)
    log_every = args.log_every if "log_every" in args.given else LOG_EVERY
    quiet = getattr(args, "quiet", False) and "quiet" in spec.extra
    comm = distributed.world() if spec.mpi else None
    rank = 0 if comm is None else comm.Get_rank()
    out = out or sys.stdout
    if quiet:
        out = open(os.devnull, "w")  # noqa: SIM115  (closed with the process)
    elif rank != 0:
        out = io.StringIO()  # rank 0 reports
    threads = distributed.set_threads(comm, args.threads)  # under MPI: each rank's share
    t_all = time.perf_counter()
    print(f"blasnet {__version__} | numpy {np.__version__} | {c.dtype} | {threads}", file=out)
    try:
        s = spec.module.setup(c)
    except (ValueError, TypeError) as e:  # e.g. a prompt the corpus cannot encode
        print(f"error: {e}", file=sys.stderr)
        return 2
    _banner(out, spec, c, s)
    progress = False if quiet or rank != 0 else log_every
    with distributed.zero1(s, comm if args.shard_optimizer else None):  # --shard-optimizer
        r = lm.run_training(s, progress, comm)
    lm.print_result(out, c, r)
    if rank == 0 and not _round_trip(out, args.save, spec, s, r):
        return 1
    print(f"wall time {time.perf_counter() - t_all:.1f} s", file=out)
    out.flush()
    return 0


def _banner(out, spec, c, s) -> None:
    print(f"corpus    {lm.corpus_description(s.text)}", file=out)
    print(f"split     {len(s.train_ids):,} training / {len(s.held_ids):,} held-out characters "
          f"(every {round(1 / c.held_out)}th block of {c.block}), vocabulary {len(s.vocab)}",
          file=out)
    print(f"model     {spec.describe(c, s)}", file=out)
    print(f"training  AdamW(lr={c.lr}, weight_decay={c.weight_decay}), {c.warmup} warmup "
          f"steps then cosine; {c.epochs} epochs x {s.steps // max(c.epochs, 1)} steps of "
          f"{c.batch_size} windows of {c.seq_len}; seed {c.seed}", file=out)
    out.flush()


def _round_trip(out, save, spec, s, r) -> bool:
    """Save the checkpoint (``save``, else a temporary file), reload it into a fresh model,
    compare the held-out loss; False when the save failed (the message says where the
    trained model went)."""
    c, tmpdir = s.config, None
    if save:
        path = save
    else:
        tmpdir = tempfile.TemporaryDirectory(prefix="blasnet-")
        path = os.path.join(tmpdir.name, f"{spec.name}.npz")
    try:
        meta = dict(model=spec.name, vocab=s.vocab.chars, held_bits=r.held_bits,
                    config=asdict(c))
        tensors_only = path.lower().endswith(".safetensors")
        try:
            checkpoint.save_or_rescue(path, s.model, None if tensors_only else s.optimizer,
                                      **meta)
        except checkpoint.SaveError as e:  # the trained model is in e.rescued
            print(f"error: {e}", file=sys.stderr)
            return False
        fresh = spec.rebuild(len(s.vocab), c, c.seed + 1)
        checkpoint.load(path, fresh)
        again = lm.bits_per_char(fresh, s.Xh, s.Yh, c.batch_size)
        same = "identical" if again == r.held_bits else f"differs by {again - r.held_bits:.3g}"
        where = path if save else f"{path} (temporary)"
        print(f"checkpoint {where}, {os.path.getsize(path) / 1024:,.0f} KiB; reloaded: "
              f"held-out {again:.3f} bits/char ({same})", file=out)
    finally:
        if tmpdir is not None:
            tmpdir.cleanup()
    return True

"""``train --model gmlp-lm|gpt``: the two language models' command line (the options each
reads, the banner, the report, the checkpoint round trip); the models are engine/models/lm.py
and engine/models/gpt_lm.py.

The ``train`` parser reads the command line once. A language model's config starts from its
own defaults (``LMConfig``, ``GPTConfig``), takes a ``--config`` recipe's options, then
exactly the options on the command line (``args.given``), so the generic defaults
(``--epochs 1000``, ...) never reach it and an option it does not read is an error. The
options carry nanoGPT's names (``--n-layer``, ``--block-size``, ``--max-iters``, ...); the
older spellings (``--layers``, ``--seq-len``, ``--d-hidden``, ``--warmup``) set the same
fields.
"""
from __future__ import annotations

import io
import json
import os
import sys
import tempfile
import time
from dataclasses import asdict, dataclass

import numpy as np

from .. import __version__, distributed
from .._checks import check_dtype, check_int, check_real
from ..training import gpt_lm, lm
from ..models.lm_config import eval_interval, schedule_text
from ..models.tokenizer import Vocabulary, tokenizer_meta
from ..training import checkpoint
from ..training.callbacks import ModelCheckpoint
from ..training.history import NonFiniteLossError, TrainingInterrupted
from . import resume_cmd
from .inputs import UsageError

__all__ = ["LanguageModelCLI", "GMLP_LM", "GPT", "config_of", "run_cli", "recipe_line",
           "LM_ONLY", "checkpoint_metadata"]

# Options of the run itself (not of the config) that both models read; --log-every defaults
# to every epoch for them.
RUN_OPTIONS = ("model", "task", "threads", "save", "log_every", "text", "config", "resume",
               "shard_optimizer", "out_dir")
LOG_EVERY = 1

# Parsed option -> (config field, least value; None: not a number[, bound it stays below])
# for what both models read. Two options of one field are spellings of it (nanoGPT's first).
COMMON = {"n_embd": ("d_model", 1), "d_hidden": ("d_model", 1),
          "block_size": ("seq_len", 1), "seq_len": ("seq_len", 1),
          "batch_size": ("batch_size", 1), "tokenizer": ("tokenizer", None),
          "max_iters": ("max_iters", 0), "epochs": ("epochs", 0),
          "lr": ("lr", 0.0), "min_lr": ("min_lr", 0.0),
          "warmup_iters": ("warmup", 0), "warmup": ("warmup", 0),
          "lr_decay_iters": ("lr_decay_iters", 1), "weight_decay": ("weight_decay", 0.0),
          "beta1": ("beta1", 0.0, 1.0), "beta2": ("beta2", 0.0, 1.0),
          "grad_clip": ("grad_clip", 0.0), "eval_interval": ("eval_interval", 1),
          "eval_iters": ("eval_iters", 1), "log_interval": ("log_interval", 0),
          "seed": ("seed", 0), "dtype": ("dtype", None), "prompt": ("prompt", None),
          "sample_length": ("sample_length", 0)}
# Read only by an iteration-based run (--max-iters N > 0).
ITERATION_ONLY = ("eval_interval", "eval_iters")


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
            f"block_size {c.seq_len}, vocabulary {len(s.vocab)}, bias {c.bias}, dropout "
            f"{c.dropout}, tied head; {s.model.num_parameters():,} parameters")


GMLP_LM = LanguageModelCLI(name="gmlp-lm", models=("gmlp-lm", "gmlp"), module=lm,
                           config=lm.LMConfig,
                           options={"n_layer": ("blocks", 1), "layers": ("blocks", 1),
                                    "d_ff": ("d_ffn", 2)},
                           rebuild=_gmlp_lm_model, describe=_gmlp_lm_line,
                           extra=("quiet", "verbose"), mpi=True)
GPT = LanguageModelCLI(name="gpt", models=("gpt",), module=gpt_lm, config=gpt_lm.GPTConfig,
                       options={"n_layer": ("n_layer", 1), "layers": ("n_layer", 1),
                                "n_head": ("n_head", 1), "heads": ("n_head", 1),
                                "d_ff": ("d_ff", 1), "dropout": ("dropout", 0.0, 1.0),
                                "bias": ("bias", None)},
                       rebuild=lambda vocab_size, c, seed: gpt_lm.build_model(vocab_size, c, seed),
                       describe=_gpt_line, mpi=True)

# The options only the language models read: an error with any other model.
LM_ONLY = tuple(sorted((set(COMMON) | set(GPT.options) | set(GMLP_LM.options)
                        | {"text", "config", "out_dir"})
                       - {"d_hidden", "d_ff", "batch_size", "lr", "weight_decay", "epochs",
                          "warmup", "seed", "dtype"}))


def _number(flag: str, v, bounds: tuple):
    low, high = bounds[0], (bounds[1] if len(bounds) > 1 else None)
    try:
        if isinstance(low, float):
            return check_real(flag, v, low, float("inf") if high is None else high,
                              high_open=high is not None)
        return v if low is None else check_int(flag, v, low)
    except (TypeError, ValueError) as e:
        raise UsageError(str(e)) from None


def _chosen(given: dict, fields: dict) -> dict:
    """``{field: (dest, flag)}`` of the options given: one per field (a command-line option
    over a recipe's; UsageError for two spellings of one field on the same level)."""
    chosen = {}
    for dest, flag in given.items():
        field = fields[dest][0]
        if field in chosen:
            other = chosen[field][1]
            from_file = flag.endswith(")"), other.endswith(")")
            if from_file[0] == from_file[1]:
                raise UsageError(f"{other} and {flag} both set {field}: give one")
            if from_file[0]:
                continue  # the command line's wins over the recipe's
        chosen[field] = (dest, flag)
    return chosen


def config_of(args, spec: LanguageModelCLI):
    """``spec``'s config: its defaults, with each option given on the command line or in the
    recipe (``args.given``); UsageError for an option it does not read, a number out of its
    range, or options of the iteration-based run without ``--max-iters``."""
    fields = {**COMMON, **spec.options}
    c = spec.config()
    given = {}
    for dest, flag in args.given.items():
        if dest in RUN_OPTIONS or dest in spec.extra:
            continue
        if dest not in fields:
            raise UsageError(f"unrecognized arguments: {flag} (not read by --model "
                             f"{spec.name})")
        given[dest] = flag
    chosen = _chosen(given, fields)
    for field, (dest, flag) in chosen.items():
        setattr(c, field, _number(flag, getattr(args, dest), fields[dest][1:]))
    if c.max_iters:
        if "epochs" in chosen:
            raise UsageError(f"{chosen['max_iters'][1]} and {chosen['epochs'][1]}: train by "
                             f"iterations or by epochs, not both")
    else:
        for dest in ITERATION_ONLY:
            if dest in given:
                raise UsageError(f"{given[dest]}: only with --max-iters N (an iteration-based "
                                 f"run)")
    return c


# The banner's recipe line, in nanoGPT's order (its train.py's config section).
RECIPE_ORDER = ("n_layer", "n_head", "n_embd", "d_ff", "block_size", "batch_size", "dropout",
                "bias", "tokenizer", "max_iters", "epochs", "lr", "min_lr", "warmup_iters",
                "lr_decay_iters", "weight_decay", "beta1", "beta2", "grad_clip",
                "eval_interval", "eval_iters", "log_interval", "seed", "dtype")


def recipe_line(c, spec: LanguageModelCLI, s) -> str:
    """Every training setting of the run by its option name (nanoGPT's spelling) as
    ``name=value`` (JSON values), the defaults resolved."""
    fields = {**COMMON, **spec.options}
    resolved = {"lr_decay_iters": c.lr_decay_iters if c.lr_decay_iters is not None
                else max(s.steps, c.warmup + 1)}
    if c.max_iters:
        resolved["eval_interval"] = eval_interval(c)
    skip = ("epochs",) if c.max_iters else ITERATION_ONLY + ("max_iters",)
    return " ".join(f"{dest}={json.dumps(resolved.get(dest, getattr(c, fields[dest][0])))}"
                    for dest in RECIPE_ORDER if dest in fields and dest not in skip)


def _prepare(args, spec):
    """``(config, setup)`` of the command line, or UsageError (exit status 2, nothing
    written): a recipe or option the model does not take, an unreadable or unfit text."""
    if args.config is not None:
        from .parser import train_actions
        from .recipe import apply_recipe
        apply_recipe(args, train_actions())
    c = config_of(args, spec)
    if args.resume is not None:
        _check_resume(args.resume, c)
    try:
        return c, spec.module.setup(c, path=args.text)
    except OSError as e:
        raise UsageError(f"--text {args.text}: {e.strerror or e}") from None
    except (ValueError, TypeError) as e:  # a prompt the text cannot encode, a warmup, ...
        msg = str(e)
        if args.text is not None and msg.startswith(os.fspath(args.text) + ":"):
            msg = "--text " + msg
        elif args.text is not None and msg.startswith("text: "):
            msg = f"--text {args.text}: {msg.removeprefix('text: ')}"
        elif msg.startswith("warmup "):  # GPTConfig.warmup is nanoGPT's warmup_iters
            msg = "--warmup-iters " + msg.removeprefix("warmup ")
        raise UsageError(flag_message(msg, args, spec)) from None


def flag_message(msg: str, args, spec) -> str:
    """``msg`` with a leading config field (``config.seq_len: ...``, ``seq_len: ...``) named
    by the option that set it (as given: ``--block-size``, ``block_size (recipe.toml)``), or
    by nanoGPT's option name when it was left at its default."""
    head, sep, rest = msg.partition(": ")
    field = head.removeprefix("config.")
    if not sep or not field.isidentifier():
        return msg
    dests = [d for d, f in {**COMMON, **spec.options}.items() if f[0] == field]
    if not dests:
        return msg
    given = [args.given[d] for d in dests if d in args.given]
    return f"{given[0] if given else '--' + dests[0].replace('_', '-')}: {rest}"


def run_cli(args, out=None) -> int:
    """``python -m engine train --model gmlp-lm|gpt [--text FILE]``: train, report, save and
    reload the checkpoint. Under ``mpiexec -n K`` the GPT's ranks each train their share of
    every global batch and rank 0 reports. Returns the exit status: a user error (a usage
    error, a ValueError/TypeError of the setup or of ``fit``) is one line ``error: ...`` on
    stderr (rank 0's only under MPI) and exit status 2; a diverged run's, 1."""
    spec = GPT if args.model == "gpt" else GMLP_LM
    if args.model not in spec.models or args.task not in (None, "text"):
        raise UsageError(f"--model {args.model} --task {args.task}: the text task trains the "
                         f"{spec.name} model (--model {spec.name} --task text)")
    comm = distributed.world() if spec.mpi else None
    try:
        return _run(args, out, spec, comm)
    except (UsageError, ValueError, TypeError, NonFiniteLossError, distributed.RankError) as e:
        if comm is None or comm.Get_rank() == 0:
            print(f"error: {flag_message(str(e), args, spec)}", file=sys.stderr)
        diverged = isinstance(e, NonFiniteLossError) or (
            isinstance(e, distributed.RankError) and e.error.startswith("NonFiniteLossError"))
        return 1 if diverged else 2


def _run(args, out, spec, comm) -> int:
    log_every = args.log_every if "log_every" in args.given else LOG_EVERY
    quiet = getattr(args, "quiet", False) and "quiet" in spec.extra
    rank = 0 if comm is None else comm.Get_rank()
    threads = distributed.set_threads(comm, args.threads)  # under MPI: each rank's share
    t_all = time.perf_counter()
    c, s = _prepare(args, spec)
    out = out or sys.stdout
    if quiet:
        out = open(os.devnull, "w")  # noqa: SIM115  (closed with the process)
    elif rank != 0:
        out = io.StringIO()  # rank 0 reports
    shards = comm.Get_size() if comm is not None and args.shard_optimizer else 0
    if shards:  # as the tabular models' banner says it
        threads += ", AdamW sharded (ZeRO-1)"
    print(f"blasnet {__version__} | numpy {np.__version__} | {c.dtype} | {threads}", file=out)
    _banner(out, spec, c, s, shards)
    if args.resume is not None:
        print(f"resume    {args.resume}", file=out)
    if args.out_dir is not None:
        print(f"out_dir   {os.path.join(args.out_dir, BEST)} at each held-out estimate that "
              f"improves on the best, {LAST} at every estimate", file=out)
    progress = False if quiet or rank != 0 else log_every
    r = _fit(args, spec, s, progress, comm)
    if isinstance(r, int):  # stopped by a signal: the resumable checkpoint is written
        return r
    lm.print_result(out, c, r)
    if args.out_dir is not None and r.history.val_loss:
        best = int(np.argmin(r.history.val_loss))
        print(f"best      {os.path.join(args.out_dir, BEST)}: held-out "
              f"{r.history.val_loss[best]:.4f} nats, estimate {best + 1} of "
              f"{len(r.history.val_loss)}", file=out)
    if rank == 0 and not _round_trip(out, args.save, spec, s, r):
        return 1
    print(f"wall time {time.perf_counter() - t_all:.1f} s", file=out)
    out.flush()
    return 0


def _fit(args, spec, s, progress, comm):
    """The run's ``LMResult``; or, stopped by Ctrl-C or SIGTERM, the exit status (130, 143)
    once a checkpoint that ``--resume`` continues is written (under mpiexec every rank stops
    after the same step and rank 0 writes it, a sharded AdamW's state gathered first)."""
    callbacks = out_dir_callbacks(args, spec, s)
    try:
        with resume_cmd.preemption() as got:
            if comm is None:
                return lm.run_training(s, progress, resume_from=args.resume,
                                       callbacks=callbacks)
            with distributed.zero1(s, comm if args.shard_optimizer else None):  # ZeRO-1
                return lm.run_training(s, progress, comm, args.resume, callbacks)
    except TrainingInterrupted as e:  # (the run's optimizer, sharded or not, is e's)
        sig = resume_cmd.agreed_signal(comm, got["signal"])
        return resume_cmd.save_interrupted(sys.stderr, args, (e, sig),
                                           checkpoint_metadata(spec, s), s.config.max_iters,
                                           comm)
    except ValueError as e:  # a checkpoint of another run (checked before any change)
        if not str(e).startswith("resume_from: "):
            raise
        raise UsageError(f"--resume: {str(e).removeprefix('resume_from: ')}") from None


BEST, LAST = "ckpt.npz", "last.npz"  # in --out-dir: nanoGPT's ckpt.pt, and the latest


def out_dir_callbacks(args, spec, s) -> list:
    """``--out-dir DIR``: ``ModelCheckpoint``s writing ``DIR/ckpt.npz`` when the held-out
    loss improves (nanoGPT's ``always_save_checkpoint = False``) and ``DIR/last.npz`` at
    every estimate; each a resumable checkpoint with the run's metadata. The directory is
    made here (an I/O error is a usage error naming it)."""
    if args.out_dir is None:
        return []
    try:
        os.makedirs(args.out_dir, exist_ok=True)
    except OSError as e:
        raise UsageError(f"--out-dir {args.out_dir}: {e.strerror or e}") from None
    meta = checkpoint_metadata(spec, s)
    return [ModelCheckpoint(os.path.join(args.out_dir, BEST), metadata=meta),
            ModelCheckpoint(os.path.join(args.out_dir, LAST), save_best_only=False,
                            metadata=meta)]


def _check_resume(path, c) -> None:
    """UsageError unless ``path`` is a resumable checkpoint of a language-model run with the
    config ``c`` (the same command line: its options, recipe and text)."""
    try:
        header = checkpoint.read_header(path)
    except (checkpoint.CheckpointError, OSError) as e:
        raise UsageError(f"--resume: {e}") from None
    saved = (header.get("metadata") or {}).get("config")
    if header.get("training") is None or not isinstance(saved, dict):
        raise UsageError(f"--resume: {path} is not the checkpoint of an interrupted "
                         f"language-model run")
    own = json.loads(json.dumps(asdict(c)))
    differ = sorted(k for k in set(own) | set(saved) if own.get(k) != saved.get(k))
    if differ:
        raise UsageError("--resume: the checkpoint's run has other settings: "
                         + ", ".join(f"{k} {saved.get(k)!r} (given {own.get(k)!r})"
                                     for k in differ)
                         + "; resume with the run's own command line")


def _banner(out, spec, c, s, shards: int = 0) -> None:
    unit = "byte" if c.tokenizer == "byte" else "character"
    print(f"text      {s.source}", file=out)
    print(f"split     {len(s.train_ids):,} training / {len(s.held_ids):,} held-out {unit}s "
          f"(every {round(1 / c.held_out)}th block of {s.split_block}); {c.tokenizer} "
          f"tokenizer, vocabulary {len(s.vocab)}", file=out)
    print(f"model     {spec.describe(c, s)}", file=out)
    clip = f"grad_clip {c.grad_clip:g}" if c.grad_clip else "no gradient clipping"
    if c.max_iters:
        run = (f"{c.max_iters} steps of {c.batch_size} random windows of {c.seq_len}; held-out "
               f"estimate every {eval_interval(c)} steps on {c.eval_iters} x {c.batch_size} "
               f"windows (drawn once)")
    else:
        run = (f"{c.epochs} epochs x {s.steps // max(c.epochs, 1)} steps of {c.batch_size} "
               f"windows of {c.seq_len}")
    opt = f"ZeRO-1: AdamW sharded over {shards} ranks" if shards else "AdamW"
    print(f"training  {opt}(lr={c.lr:g}, betas=({c.beta1:g}, {c.beta2:g}), weight_decay="
          f"{c.weight_decay:g} on matrices), {clip}; {schedule_text(c, s.steps)}; {run}; "
          f"seed {c.seed}", file=out)
    print(f"recipe    {recipe_line(c, spec, s)}", file=out)
    out.flush()


def checkpoint_metadata(spec, s, r=None) -> dict:
    """What a language model's checkpoint records: the model, its tokenizer
    (``tokenizer_meta``; ``vocab``, the characters, too for a char-level one, as older
    checkpoints), the text, the whole config and (after training, ``r``) the held-out
    loss."""
    meta = dict(model=spec.name, task="text", tokenizer=tokenizer_meta(s.vocab),
                text=s.source, config=asdict(s.config))
    if r is not None:
        meta["held_bits"] = r.held_bits
    if isinstance(s.vocab, Vocabulary):
        meta["vocab"] = s.vocab.chars
    return meta


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
        tensors_only = path.lower().endswith(".safetensors")
        try:
            checkpoint.save_or_rescue(path, s.model, None if tensors_only else s.optimizer,
                                      **checkpoint_metadata(spec, s, r))
        except checkpoint.SaveError as e:  # the trained model is in e.rescued
            print(f"error: {e}", file=sys.stderr)
            return False
        fresh = spec.rebuild(len(s.vocab), c, c.seed + 1)
        checkpoint.load(path, fresh)
        again = lm.bits_per_char(fresh, s.Xh, s.Yh, c.batch_size)
        same = "identical" if again == r.held_bits else f"differs by {again - r.held_bits:.3g}"
        where = path if save else f"{path} (temporary)"
        print(f"checkpoint {where}, {os.path.getsize(path) / 1024:,.0f} KiB; reloaded: "
              f"held-out {again:.3f} bits/token ({same})", file=out)
    finally:
        if tmpdir is not None:
            tmpdir.cleanup()
    return True

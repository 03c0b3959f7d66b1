"""The GPT character language model: ``GPT`` trained on the gMLP language model's corpus
(``engine.models.lm``: Python's own help texts, the same held-out split and unigram
baseline), so the two compare directly. ``python -m engine train --model gpt --task text``
runs ``run_cli`` with the defaults of ``GPTConfig``; under ``mpiexec -n K`` the ranks train
data-parallel on the same global batches (float64: equal to one process up to rounding).
"""
from __future__ import annotations

import argparse
import io
import os
import sys
import tempfile
import time
from dataclasses import asdict, dataclass

import numpy as np

from .._checks import argparse_int, argparse_real, check_dtype
from ..nn.losses import CrossEntropyLoss
from ..optim import lr_scheduler as lrs
from ..optim.optimizers import AdamW
from ..training.loop import fit
from . import lm
from .gpt import GPT

__all__ = ["GPTConfig", "build_model", "setup", "train", "run_cli", "cli_parser"]


@dataclass
class GPTConfig:
    """Settings of ``train``. The defaults are sized for about a minute of training on two
    idle cores (docs/lm.md has measured runs)."""
    seq_len: int = 64          # block_size: characters per window, and the sampling context
    d_model: int = 128         # width of the embeddings and the residual stream
    d_ff: int = 512            # the FFN's hidden width (4 d_model, as GPT-2)
    n_layer: int = 4           # TransformerBlocks
    n_head: int = 4            # attention heads (d_model / n_head features each)
    dropout: float = 0.0
    batch_size: int = 32       # windows per step (the global batch under mpiexec)
    epochs: int = 2            # passes over the training windows
    lr: float = 2e-3           # AdamW peak learning rate
    weight_decay: float = 0.1  # on the matrices and embeddings only, as nanoGPT
    warmup: int = 50           # steps of linear warmup, then cosine decay to 0
    held_out: float = 0.1      # the gMLP LM's split (every 10th block of 4096 characters)
    block: int = 4096
    seed: int = 0              # initialisation, shuffling and sampling
    dtype: str = "float32"
    prompt: str = "The "
    sample_length: int = 300
    temperature: float = 0.8


def build_model(vocab_size: int, c: GPTConfig, rng=None) -> GPT:
    return GPT(vocab_size, c.seq_len, c.n_layer, c.n_head, c.d_model, d_ff=c.d_ff,
               dropout=c.dropout, dtype=check_dtype(c.dtype), rng=rng)


def _schedule(opt, total: int, warmup: int):
    warmup = min(warmup, max(total - 1, 0))
    cosine = lrs.CosineAnnealingLR(opt, T_max=max(total - warmup, 1))
    if warmup == 0:
        return cosine
    warm = lrs.LinearLR(opt, start_factor=1.0 / (warmup + 1), end_factor=1.0,
                        total_iters=warmup)
    return lrs.SequentialLR(opt, [warm, cosine], milestones=[warmup])


def setup(config: GPTConfig | None = None, text: str | None = None) -> lm.LMSetup:
    """The data (lm's corpus, split and windows), the GPT, AdamW and its schedule."""
    c = config or GPTConfig()
    text = lm.corpus() if text is None else text
    vocab = lm.Vocabulary(text)
    vocab.encode(c.prompt)  # a prompt the model cannot read fails before training
    train_ids, held_ids = lm.split(vocab.encode(text), c.held_out, c.block)
    X, Y = lm.windows(train_ids, c.seq_len)
    Xh, Yh = lm.windows(held_ids, c.seq_len)
    model = build_model(len(vocab), c, np.random.default_rng(c.seed))
    decay = [p for p in model.parameters() if p.data.ndim == 2]
    other = [p for p in model.parameters() if p.data.ndim != 2]
    opt = AdamW([{"params": decay}, {"params": other, "weight_decay": 0.0}], lr=c.lr,
                betas=(0.9, 0.99), weight_decay=c.weight_decay)
    steps = c.epochs * -(-X.shape[0] // c.batch_size)
    return lm.LMSetup(c, text, vocab, train_ids, held_ids, X, Y, Xh, Yh, model, opt,
                      _schedule(opt, steps, c.warmup), steps)


def train(config: GPTConfig | None = None, progress=True, text: str | None = None,
          prepared: lm.LMSetup | None = None, comm=None) -> lm.LMResult:
    """Train the GPT of ``config`` (or ``prepared``, from ``setup``); ``comm``: an MPI
    communicator for data-parallel training. Held-out bits/char, the unigram baseline and
    a sample from ``config.prompt``, as ``lm.train``."""
    s = prepared or setup(config, text)
    c = s.config
    t0 = time.perf_counter()
    history = fit(s.model, CrossEntropyLoss(), s.optimizer, s.X, s.Y, epochs=c.epochs,
                  batch_size=c.batch_size, rng=c.seed, validation=(s.Xh, s.Yh),
                  progress=progress, scheduler=s.scheduler, scheduler_interval="step",
                  comm=comm)
    seconds = time.perf_counter() - t0
    held = (history.val_loss[-1] / lm.LN2 if history.val_loss else
            lm.bits_per_char(s.model, s.Xh, s.Yh, c.batch_size))
    text_out = lm.sample(s.model, s.vocab, c.prompt, c.sample_length, c.seq_len,
                         c.temperature, np.random.default_rng(c.seed))
    return lm.LMResult(s, history, held, lm.unigram_bits(s.train_ids, s.held_ids, len(s.vocab)),
                       text_out, seconds)


# ----------------------------------------------------------------------------- CLI
def _number(kind, low, what):
    return argparse_int(low, what) if kind is int else argparse_real(low, None, what)


def cli_parser() -> argparse.ArgumentParser:
    """The options of ``train --model gpt --task text``, each defaulting to ``GPTConfig``'s
    value (re-read from the command line, as the gMLP LM does)."""
    c, n = GPTConfig(), _number
    p = argparse.ArgumentParser(prog="python -m engine train --model gpt --task text",
                                allow_abbrev=False)
    p.add_argument("--model", choices=("gpt",), default="gpt")
    p.add_argument("--task", choices=("text",), default="text")
    p.add_argument("--d-hidden", dest="d_model", type=n(int, 1, "a positive integer"),
                   default=c.d_model)
    p.add_argument("--d-ff", dest="d_ff", type=n(int, 1, "a positive integer"), default=c.d_ff)
    p.add_argument("--layers", dest="n_layer", type=n(int, 1, "a positive integer"),
                   default=c.n_layer)
    p.add_argument("--heads", dest="n_head", type=n(int, 1, "a positive integer"),
                   default=c.n_head)
    p.add_argument("--seq-len", type=n(int, 1, "a positive integer"), default=c.seq_len)
    for flag, kind, low, what in (("--epochs", int, 0, "an integer >= 0"),
                                  ("--batch-size", int, 1, "a positive integer"),
                                  ("--lr", float, 0.0, "a number >= 0"),
                                  ("--weight-decay", float, 0.0, "a number >= 0"),
                                  ("--warmup", int, 0, "an integer >= 0"),
                                  ("--seed", int, 0, "an integer >= 0")):
        dest = flag[2:].replace("-", "_")
        p.add_argument(flag, type=n(kind, low, what), default=getattr(c, dest))
    p.add_argument("--dtype", choices=("float32", "float64"), default=c.dtype)
    p.add_argument("--threads", type=n(int, 1, "a positive integer"), default=None)
    p.add_argument("--save", default=None)
    p.add_argument("--log-every", type=n(int, 1, "a positive integer"), default=1)
    p.add_argument("--prompt", default=c.prompt)
    p.add_argument("--sample-length", type=n(int, 0, "an integer >= 0"),
                   default=c.sample_length)
    return p


def _config(o) -> GPTConfig:
    c = GPTConfig()
    for name in ("d_model", "d_ff", "n_layer", "n_head", "seq_len", "epochs", "batch_size", "lr",
                 "weight_decay", "warmup", "seed", "dtype", "prompt", "sample_length"):
        setattr(c, name, getattr(o, name))
    return c


def run_cli(args, out=None) -> int:
    """``python -m engine train --model gpt --task text``: train, report, save and reload.
    Under ``mpiexec -n K`` every rank trains its share of each global batch; rank 0 reports."""
    import kernels

    from .. import __version__, distributed
    from ..training import checkpoint
    out = out or sys.stdout
    argv = list(getattr(args, "argv", None) or [])
    argv = argv[argv.index("train") + 1:] if "train" in argv else []
    try:
        o = cli_parser().parse_args(argv)
    except SystemExit as e:  # argparse has printed the usage and the error
        return 2 if e.code else 0
    c = _config(o)
    comm = distributed.world()
    rank = 0 if comm is None else comm.Get_rank()
    if rank != 0:
        out = io.StringIO()  # rank 0 reports
    if o.threads is not None:
        kernels.set_num_threads(o.threads)
    t_all = time.perf_counter()
    try:
        s = setup(c)
    except ValueError as e:  # a prompt the corpus cannot encode, heads that do not divide
        print(f"error: {e}", file=sys.stderr)
        return 2
    v = len(s.vocab)
    ranks = "" if comm is None else f" x {comm.Get_size()} MPI ranks"
    print(f"blasnet {__version__} | numpy {np.__version__} | {c.dtype} | "
          f"{kernels.get_num_threads()} BLAS thread(s){ranks}", file=out)
    print(f"corpus    {lm.corpus_description(s.text)}", file=out)
    print(f"split     {len(s.train_ids):,} training / {len(s.held_ids):,} held-out characters "
          f"(every {round(1 / c.held_out)}th block of {c.block}), vocabulary {v}", file=out)
    print(f"model     gpt: {c.n_layer} layers, {c.n_head} heads, d_model {c.d_model}, d_ff "
          f"{c.d_ff}, block_size {c.seq_len}, tied head; {s.model.num_parameters():,} "
          f"parameters", file=out)
    print(f"training  AdamW(lr={c.lr}, weight_decay={c.weight_decay}), {c.warmup} warmup "
          f"steps then cosine; {c.epochs} epochs x {s.steps // max(c.epochs, 1)} steps of "
          f"{c.batch_size} windows of {c.seq_len}; seed {c.seed}", file=out)
    out.flush()
    r = train(progress=o.log_every if rank == 0 else False, prepared=s, comm=comm)
    lm.print_result(out, c, r)
    if rank == 0:
        _save_and_reload(o, c, s, r, out, checkpoint)
    print(f"wall time {time.perf_counter() - t_all:.1f} s", file=out)
    out.flush()
    return 0


def _save_and_reload(o, c, s, r, out, checkpoint) -> None:
    """Save the checkpoint (``--save`` or a temporary file), load it into a fresh GPT and
    check that it reproduces the held-out loss."""
    tmpdir = None
    if o.save:
        path = o.save
    else:
        tmpdir = tempfile.TemporaryDirectory(prefix="blasnet-")
        path = os.path.join(tmpdir.name, "gpt.npz")
    try:
        meta = dict(model="gpt", vocab=s.vocab.chars, held_bits=r.held_bits, config=asdict(c))
        if path.lower().endswith(".safetensors"):
            checkpoint.save(path, s.model, **meta)
        else:
            checkpoint.save(path, s.model, s.optimizer, **meta)
        fresh = build_model(len(s.vocab), c, c.seed + 1)
        checkpoint.load(path, fresh)
        again = lm.bits_per_char(fresh, s.Xh, s.Yh, c.batch_size)
        same = "identical" if again == r.held_bits else f"differs by {again - r.held_bits:.3g}"
        where = path if o.save else f"{path} (temporary)"
        print(f"checkpoint {where}, {os.path.getsize(path) / 1024:,.0f} KiB; reloaded: "
              f"held-out {again:.3f} bits/char ({same})", file=out)
    finally:
        if tmpdir is not None:
            tmpdir.cleanup()

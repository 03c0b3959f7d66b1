"""Training the character language model of engine/models/lm.py (``engine.lm``): ``setup``
reads the text (the built-in corpus, ``text=`` or ``path=``), splits it, makes the windows or
nanoGPT's random-window sampler, the model, AdamW and the schedule; ``train`` and
``run_training`` run ``fit`` with ``CrossEntropyLoss`` and report held-out bits per token
next to the unigram baseline and a sample. ``python -m engine train --model gmlp-lm --task
text`` runs ``train`` with the defaults of ``LMConfig``.

The model side (corpus, split, windows, ``build_model``, ``sample``, the tokenizers and
configs) is re-exported from engine/models/lm.py, so ``engine.lm`` is the whole of it. Any
text trains the same way: ``train(config, text=...)``, ``train(config, path=FILE)`` (read in
chunks, engine/models/text_data.py), by characters or, with ``tokenizer="byte"``, by UTF-8
bytes; by epochs over non-overlapping windows, or for ``max_iters`` steps on random windows as
nanoGPT (engine/models/lm_config.py).
"""
from __future__ import annotations

import math
import time
from dataclasses import dataclass

import numpy as np

from .._checks import check_dtype, check_int
from ..nn.losses import CrossEntropyLoss
from ..nn.module import Module
from ..optim.lr_scheduler import WarmupCosineLR
from ..optim.optimizers import AdamW
from ..models import text_data
from ..models.lm import (LMConfig, TextConfig, Vocabulary, build_model, check_config,
                         check_vocab_fits, corpus, corpus_description, sample, split,
                         unigram_bits, windows)
from ..models.lm_config import eval_interval, schedule, total_steps
from ..models.tokenizer import ByteTokenizer
from .loop import evaluate, fit
from .samplers import RandomWindows

__all__ = ["TextConfig", "LMConfig", "LMSetup", "LMResult", "Vocabulary", "corpus", "split",
           "windows", "unigram_bits", "build_model", "bits_per_char", "sample", "setup", "train",
           "check_config", "print_result", "warmup_cosine", "corpus_data",
           "adamw_decaying_matrices", "run_training", "prepare"]

LN2 = math.log(2.0)


# ----------------------------------------------------------------------------- training
@dataclass(kw_only=True)
class LMSetup:
    """Everything ``train`` runs on, made by ``setup``: the text's ids and tokenizer, the split
    and its windows (or, for an iteration-based run, the random-window sampler and a fixed
    held-out estimate set), the model, AdamW and the per-step learning-rate schedule."""
    config: TextConfig
    vocab: object           # the tokenizer: a Vocabulary (char) or ByteTokenizer (byte)
    source: str             # what the text is (a file and its size, the built-in corpus)
    split_block: int        # tokens per block of the held-out split
    train_ids: np.ndarray
    held_ids: np.ndarray
    X: np.ndarray | None    # (N, seq_len) training windows (epoch-based runs)
    Y: np.ndarray | None    # (N, seq_len) their next tokens
    Xh: np.ndarray          # held-out windows: all of them, or the estimate's set
    Yh: np.ndarray
    model: Module
    optimizer: AdamW
    scheduler: object
    steps: int
    sampler: object = None  # RandomWindows over train_ids (iteration-based runs)
    text: str | None = None  # the str trained on (None for a file)

    @property
    def tokenizer(self):
        return self.vocab


@dataclass
class LMResult:
    """What ``train`` measured: held-out bits per token next to the unigram baseline, the
    sample, the history and the training time; ``setup`` holds the model and data."""
    setup: LMSetup
    history: object
    held_bits: float
    unigram_bits: float
    sample: str
    seconds: float

    @property
    def model(self):
        return self.setup.model

    @property
    def vocab(self):
        return self.setup.vocab


def bits_per_char(model, X, Y, batch_size: int = 64) -> float:
    """Mean cross-entropy of the next character over every position of ``(X, Y)``, in bits."""
    loss, _ = evaluate(model, CrossEntropyLoss(), X, Y, check_int("batch_size", batch_size, 1))
    return loss / LN2


def warmup_cosine(opt, total: int, warmup: int):
    """``warmup`` steps of linear warmup, then a cosine down to 0 at step ``total``: nanoGPT's
    schedule with min_lr 0 and lr_decay_iters = ``total``."""
    return WarmupCosineLR(opt, warmup, max(total, warmup + 1))


def _split_block(n: int, c) -> int:
    """The split's block: ``c.block``, or for a text too short for ``1 / held_out`` of them,
    the length that makes exactly that many (the banner says which)."""
    k = round(1.0 / c.held_out)
    return max(1, min(c.block, n // k))


def corpus_data(c, text: str | None = None, path=None) -> dict:
    """``vocab``, ``source``, ``split_block``, ``train_ids``, ``held_ids``, ``X``, ``Y``, ``Xh``,
    ``Yh``, ``sampler``, ``text`` by name (the fields ``LMSetup`` holds before the model) of
    config ``c`` for the file at ``path``, else ``text`` (default: ``corpus()``). ValueError
    for a text too short to hold a window of ``seq_len + 1`` tokens on both sides of the
    split, or a prompt the tokenizer cannot read."""
    if path is not None:
        src = text_data.file_ids(path, c.tokenizer)
    else:
        own = corpus() if text is None else text
        src = text_data.text_ids(own, c.tokenizer)
        if text is None:
            src = text_data.TextIds(src.ids, src.tokenizer, corpus_description(own))
    tok, ids, unit = src.tokenizer, src.ids, _unit(src.tokenizer)
    try:  # a prompt the model cannot read fails before training
        tok.encode(c.prompt)
    except ValueError as e:
        missing = str(e).rpartition(": ")[2]
        raise ValueError(f"prompt {c.prompt!r}: characters not in the vocabulary of the text: "
                         f"{missing} (--prompt: start the sample with characters the text "
                         f"has)") from None
    block = _split_block(len(ids), c)
    train_ids, held_ids = split(ids, c.held_out, block)
    for name, part in (("training", train_ids), ("held-out", held_ids)):
        if len(part) < c.seq_len + 1:
            raise ValueError(f"text: {len(ids):,} {unit}s leave {len(part):,} for the "
                             f"{name} split, fewer than one window of block_size + 1 = "
                             f"{c.seq_len + 1} (a longer text or a smaller block_size)")
    data = dict(vocab=tok, source=src.source, split_block=block, train_ids=train_ids,
                held_ids=held_ids, X=None, Y=None, sampler=None, text=text)
    if c.max_iters:  # nanoGPT: random windows; a fixed set of them for the estimate
        data["sampler"] = RandomWindows(train_ids, c.seq_len, c.batch_size,
                                        np.random.default_rng([c.seed, 1]))
        est = RandomWindows(held_ids, c.seq_len, c.eval_iters * c.batch_size,
                            np.random.default_rng([c.seed, 2]))
        data["Xh"], data["Yh"] = (a.copy() for a in est.sample())
    else:
        data["X"], data["Y"] = windows(train_ids, c.seq_len)
        data["Xh"], data["Yh"] = windows(held_ids, c.seq_len)
    return data


def _unit(tok) -> str:
    return "byte" if isinstance(tok, ByteTokenizer) else "character"


def adamw_decaying_matrices(model, c, betas=None) -> AdamW:
    """AdamW with config ``c``'s ``lr``, betas (``c.beta1``, ``c.beta2`` unless ``betas``) and
    decoupled ``weight_decay`` on the matrices (and embeddings) only, not on biases and
    LayerNorm gains."""
    decay = [p for p in model.parameters() if p.data.ndim == 2]
    other = [p for p in model.parameters() if p.data.ndim != 2]
    betas = (c.beta1, c.beta2) if betas is None else betas
    return AdamW([{"params": decay}, {"params": other, "weight_decay": 0.0}], lr=c.lr,
                 betas=betas, weight_decay=c.weight_decay)


def prepare(c, build, text: str | None = None, path=None) -> LMSetup:
    """The ``LMSetup`` of a checked config ``c`` whose model is ``build(vocab_size, rng)``,
    for ``text`` or the file at ``path``: both language models' ``setup``."""
    data = corpus_data(c, text, path)
    model = build(len(data["vocab"]), np.random.default_rng(c.seed))
    opt = adamw_decaying_matrices(model, c)
    steps = total_steps(c, 0 if data["X"] is None else data["X"].shape[0])
    return LMSetup(config=c, **data, model=model, optimizer=opt,
                   scheduler=schedule(opt, c, steps), steps=steps)


def setup(config: LMConfig | None = None, text: str | None = None, path=None) -> LMSetup:
    """The data, model and optimizer of ``config`` for the file at ``path``, else ``text``
    (default: ``corpus()``)."""
    c = check_config(LMConfig() if config is None else config)
    dt = check_dtype(c.dtype)
    return prepare(c, lambda v, rng: build_model(v, c.seq_len, c.d_model, c.d_ffn, c.blocks,
                                                 dt, rng), text, path)


def train(config: LMConfig | None = None, progress=True, text: str | None = None,
          prepared: LMSetup | None = None, path=None, resume_from=None) -> LMResult:
    """Train the gMLP LM of ``config`` on ``text`` or the file at ``path`` (or on ``prepared``,
    from ``setup``) with AdamW and nanoGPT's schedule per step; report held-out bits per
    token, the unigram baseline and a sample from ``config.prompt``."""
    s = prepared or setup(config, text, path)
    c = check_config(s.config)  # again: a prepared setup's config may have been edited
    s.vocab.encode(c.prompt)
    check_vocab_fits(s.model, s.vocab)
    return run_training(s, progress, resume_from=resume_from)


def run_training(s: LMSetup, progress=True, comm=None, resume_from=None,
                 callbacks=()) -> LMResult:
    """``fit`` of a prepared language model: epochs over its windows, or ``max_iters`` steps
    on random windows with a held-out estimate every ``eval_interval`` (``comm``: an MPI
    communicator, data parallel: every rank draws the global batch, trains on its share);
    then held-out bits per token, the
    unigram baseline and a sample from the prompt. ``resume_from``: a checkpoint of the
    same run stopped early (``TrainingInterrupted.save``), continued exactly; ``callbacks``:
    ``fit``'s (``ModelCheckpoint``: the best held-out model)."""
    c = s.config
    options = dict(validation=(s.Xh, s.Yh), progress=progress, scheduler=s.scheduler,
                   scheduler_interval="step", clip_grad_norm=c.grad_clip or None,
                   log_every=c.log_interval or None, resume_from=resume_from,
                   callbacks=list(callbacks))
    t0 = time.perf_counter()
    if c.max_iters:
        history = fit(s.model, CrossEntropyLoss(), s.optimizer, sampler=s.sampler,
                      steps=c.max_iters, eval_every=eval_interval(c),
                      batch_size=c.batch_size, comm=comm, **options)
    else:
        history = fit(s.model, CrossEntropyLoss(), s.optimizer, s.X, s.Y, epochs=c.epochs,
                      batch_size=c.batch_size, rng=c.seed, comm=comm, **options)
    seconds = time.perf_counter() - t0
    # The last validation is the held-out loss (evaluate, batches of batch_size).
    held = (history.val_loss[-1] / LN2 if history.val_loss else
            bits_per_char(s.model, s.Xh, s.Yh, c.batch_size))
    text_out = sample(s.model, s.vocab, c.prompt, c.sample_length, c.seq_len, c.temperature,
                      np.random.default_rng(c.seed))
    return LMResult(s, history, held, unigram_bits(s.train_ids, s.held_ids, len(s.vocab)),
                    text_out, seconds)


def print_result(out, config, result) -> None:
    """The end-of-run lines both language models print: time and tokens/s, held-out
    bits/token against the unigram baseline, and the sample (``config`` needs ``seq_len``,
    ``prompt``, ``sample_length`` and ``temperature``)."""
    unit = "byte" if isinstance(result.vocab, ByteTokenizer) else "char"
    tokens = result.history.samples * config.seq_len
    rate = tokens / result.seconds if result.seconds > 0 else 0
    print(f"time      {result.seconds:.1f} s for {result.history.steps} steps "
          f"({rate:,.0f} {'bytes' if unit == 'byte' else 'characters'}/s)", file=out)
    gain = result.unigram_bits - result.held_bits
    versus = (f"{gain:.2f} bits/{unit} below it, {100 * gain / result.unigram_bits:.0f}% fewer "
              f"bits" if gain > 0 else f"{-gain:.2f} bits/{unit} above it")
    print(f"held-out  {result.held_bits:.3f} bits/{unit} ({result.held_bits * LN2:.4f} nats); "
          f"unigram baseline {result.unigram_bits:.3f} bits/{unit} ({versus})", file=out)
    print(f"sample    (prompt {config.prompt!r}, {config.sample_length} tokens, "
          f"temperature {config.temperature}):", file=out)
    print(result.sample, file=out)


"""An attention-free character-level language model: ``Embedding`` -> N causal ``GMLPBlock``
(Liu et al. 2021, "Pay Attention to MLPs") -> ``LayerNorm`` -> ``Linear`` to the vocabulary,
trained with ``fit`` and ``CrossEntropyLoss`` to predict each next character.

The corpus ships with Python itself, so nothing is downloaded: the help texts of
``pydoc_data.topics`` (the language reference's topics that ``help("for")`` prints), joined in
sorted topic order. A held-out split (every tenth block of 4096 characters) measures the
loss in bits per character next to a unigram baseline (each character's training frequency,
add-one smoothed), and ``sample`` generates text from a prompt. ``python -m engine train
--model gmlp-lm --task text`` runs ``train`` with the defaults of ``LMConfig``.

Any other text trains the same way: ``train(config, text=...)``, ``train(config, path=FILE)``
(``--text FILE``: read in chunks, engine/models/text_data.py), by characters or, with
``tokenizer="byte"``, by UTF-8 bytes; by epochs over non-overlapping windows, or for
``max_iters`` steps on random windows as nanoGPT (engine/models/lm_config.py).
"""
from __future__ import annotations

import math
import platform
import time
from dataclasses import dataclass

import numpy as np

from ..nn.blocks import LayerNorm
from ..nn.embedding import Embedding
from ..nn.gmlp_block import GMLPBlock
from ..nn.containers import Sequential
from ..nn.layers import Linear
from ..nn.losses import CrossEntropyLoss
from ..nn.module import Module, check_dtype, check_positive_int, make_rng
from ..optim.lr_scheduler import WarmupCosineLR
from ..optim.optimizers import AdamW
from ..training.loop import evaluate, fit
from ..training.samplers import RandomWindows
from .lm_config import (LMConfig, TextConfig, check_text_config, eval_interval, schedule,
                        total_steps)
from . import text_data
from .tokenizer import ByteTokenizer, Vocabulary

__all__ = ["TextConfig", "LMConfig", "LMSetup", "LMResult", "Vocabulary", "corpus", "split", "windows",
           "unigram_bits", "build_model", "bits_per_char", "sample", "setup", "train",
           "check_config", "print_result", "warmup_cosine", "corpus_data",
           "adamw_decaying_matrices", "run_training", "prepare"]

LN2 = math.log(2.0)
MAX_SPATIAL_BYTES = 4 << 30  # the gMLP's spatial weights' training state (4 GiB)


# ----------------------------------------------------------------------------- checks
def _count(name: str, v, low: int = 1) -> int:
    """``v`` as an int >= ``low``: TypeError naming ``name`` for a non-integer (bool and
    float included), ValueError below ``low``."""
    if isinstance(v, bool) or not isinstance(v, (int, np.integer)):
        raise TypeError(f"{name}: expected an integer >= {low}, got {v!r} ({type(v).__name__})")
    if v < low:
        raise ValueError(f"{name}: expected an integer >= {low}, got {v}")
    return int(v)


def _ids(name: str, ids, vocab_size: int | None = None) -> np.ndarray:
    """``ids`` as a 1-D integer array (in [0, vocab_size) when given), else a named error."""
    if not isinstance(ids, np.ndarray):
        raise TypeError(f"{name}: expected a 1-D numpy array of integer ids, got "
                        f"{type(ids).__name__}")
    if ids.dtype == np.bool_ or not np.issubdtype(ids.dtype, np.integer):
        raise TypeError(f"{name}: expected integer ids, got dtype {ids.dtype}")
    if ids.ndim != 1:
        raise ValueError(f"{name}: expected a 1-D array of ids, got shape {ids.shape}")
    if ids.size and (ids.min() < 0 or (vocab_size is not None and ids.max() >= vocab_size)):
        bad = int(np.argmax((ids < 0) | (ids >= (vocab_size or np.iinfo(np.int64).max))))
        limit = f"[0, {vocab_size})" if vocab_size is not None else ">= 0"
        raise ValueError(f"{name}: expected ids in {limit}, got {int(ids[bad])} at index {bad}")
    return ids


def _temperature(v) -> float:
    if isinstance(v, bool) or not isinstance(v, (int, float, np.integer, np.floating)):
        raise TypeError(f"temperature: expected a number > 0, got {v!r} ({type(v).__name__})")
    if not (math.isfinite(v) and v > 0):
        raise ValueError(f"temperature: expected a finite number > 0, got {v!r}")
    return float(v)


def _prompt(v) -> str:
    if not isinstance(v, str):
        raise TypeError(f"prompt: expected a non-empty str, got {type(v).__name__}")
    if not v:
        raise ValueError("prompt: expected a non-empty str (sampling starts from it), got ''")
    return v


# ----------------------------------------------------------------------------- data
def corpus() -> str:
    """The text of ``pydoc_data.topics`` (shipped with CPython): every topic's help text, in
    sorted topic order, separated by newlines. Its size depends on the Python version."""
    from pydoc_data.topics import topics
    return "\n".join(topics[k] for k in sorted(topics))


def corpus_description(text: str) -> str:
    from pydoc_data.topics import topics
    return (f"pydoc_data.topics of Python {platform.python_version()}: {len(topics)} help "
            f"topics, {len(text):,} characters")


def split(ids: np.ndarray, held_out: float = 0.1, block: int = 4096):
    """``(train, held)``: every ``round(1 / held_out)``-th block of ``block`` ids (the last of
    each group) is held out; the rest, in order, is for training. Blocks keep the held-out text
    contiguous, so no training window overlaps it, while it still samples the whole corpus."""
    ids = _ids("ids", ids)
    if isinstance(held_out, bool) or not isinstance(held_out, (int, float, np.floating)):
        raise TypeError(f"held_out: expected a fraction in (0, 0.5), got {held_out!r}")
    if not 0.0 < held_out < 0.5:
        raise ValueError(f"held_out: expected a fraction in (0, 0.5), got {held_out!r}")
    block = _count("block", block)
    k = round(1.0 / held_out)
    nb = -(-len(ids) // block)
    held_blocks = [b for b in range(nb) if b % k == k - 1]
    mask = np.zeros(len(ids), bool)
    for b in held_blocks:
        mask[b * block:(b + 1) * block] = True
    if not mask.any():  # fewer than k blocks: a split that holds nothing out measures nothing
        raise ValueError(f"block: {len(ids)} ids make {nb} block(s) of {block}; holding out every "
                         f"{k}th needs at least {k} (use a smaller block)")
    return ids[~mask], ids[mask]


def windows(ids: np.ndarray, seq_len: int, stride: int | None = None):
    """``(X, Y)`` of shape (N, seq_len): windows of ``ids`` starting every ``stride`` (default
    ``seq_len``: no overlap) and the same windows shifted by one (the next characters)."""
    ids = _ids("ids", ids)
    seq_len = _count("seq_len", seq_len)
    stride = seq_len if stride is None else _count("stride", stride)
    n = (len(ids) - 1 - seq_len) // stride + 1
    if n < 1:
        raise ValueError(f"ids: {len(ids)} characters make no window of seq_len + 1 = "
                         f"{seq_len + 1} (a text too short for its split?)")
    starts = np.arange(n) * stride
    idx = starts[:, None] + np.arange(seq_len)  # (N, seq_len)
    return np.ascontiguousarray(ids[idx]), np.ascontiguousarray(ids[idx + 1])


def unigram_bits(train_ids: np.ndarray, eval_ids: np.ndarray, vocab_size: int) -> float:
    """Bits per character of ``eval_ids`` under the training split's character frequencies
    (add-one smoothed, so an unseen character costs finite bits): the baseline a model that
    ignores context can reach."""
    vocab_size = _count("vocab_size", vocab_size)
    train_ids = _ids("train_ids", train_ids, vocab_size)
    eval_ids = _ids("eval_ids", eval_ids, vocab_size)
    if eval_ids.size == 0:
        raise ValueError("eval_ids: expected at least one id to score, got none")
    counts = np.bincount(train_ids, minlength=vocab_size).astype(np.float64) + 1.0
    logp = np.log2(counts / counts.sum())
    return float(-logp[eval_ids].mean())


# ----------------------------------------------------------------------------- model
def build_model(vocab_size: int, seq_len: int = 64, d_model: int = 128, d_ffn: int = 256,
                blocks: int = 4, dtype=np.float32, rng=None) -> Sequential:
    """``Embedding(V, d_model)`` -> ``blocks`` x ``GMLPBlock(d_model, d_ffn, seq_len,
    causal=True)`` -> ``LayerNorm(d_model)`` -> ``Linear(d_model, V)``: logits (B, T, V) for ids
    (B, T), each position seeing only itself and earlier ones."""
    rng = make_rng(rng)
    blocks = check_positive_int("blocks", blocks)
    return Sequential(Embedding(vocab_size, d_model, dtype=dtype, rng=rng),
                      *[GMLPBlock(d_model, d_ffn, seq_len, causal=True, dtype=dtype, rng=rng)
                        for _ in range(blocks)],
                      LayerNorm(d_model, dtype=dtype),
                      Linear(d_model, vocab_size, init="xavier", dtype=dtype, rng=rng))


def bits_per_char(model, X, Y, batch_size: int = 64) -> float:
    """Mean cross-entropy of the next character over every position of ``(X, Y)``, in bits."""
    loss, _ = evaluate(model, CrossEntropyLoss(), X, Y, _count("batch_size", batch_size))
    return loss / LN2


def sample(model, vocab, prompt: str, length: int, seq_len: int,
           temperature: float = 0.8, rng=None) -> str:
    """``prompt`` followed by ``length`` tokens drawn one at a time from the model's
    next-token distribution (softmax of logits / ``temperature``), each conditioned on the
    last ``seq_len`` tokens (a causal model takes any shorter prefix as it is); ``vocab`` a
    character ``Vocabulary`` or a ``ByteTokenizer``. The loop of ``engine.generate``
    (engine/models/sampling.py)."""
    from .sampling import autoregress, encode_prompt
    from .tokenizer import ByteTokenizer
    if not isinstance(vocab, (Vocabulary, ByteTokenizer)):
        raise TypeError(f"vocab: expected a Vocabulary or ByteTokenizer, got "
                        f"{type(vocab).__name__}")
    prompt = _prompt(prompt)
    temperature = _temperature(temperature)
    length = _count("length", length, 0)
    seq_len = _count("seq_len", seq_len)
    _check_vocab_fits(model, vocab, seq_len)
    ids = encode_prompt(vocab, prompt)
    out = autoregress(model, ids[None], length, seq_len, temperature, None, make_rng(rng))
    return vocab.decode(out[0])


def _check_vocab_fits(model, vocab: Vocabulary, seq_len: int = 1) -> None:
    """The model reads ids up to len(vocab) - 1 in windows of ``seq_len`` and predicts
    len(vocab) characters (asked through the module protocol), else ValueError: a sample
    from another text's vocabulary would print the wrong characters."""
    if not isinstance(model, Module):
        raise TypeError(f"model: expected an engine Module, got {type(model).__name__}")
    try:
        out = model.check_input(np.array([[len(vocab) - 1]], np.int64), "ids")
    except (TypeError, ValueError) as e:
        raise ValueError(f"vocab: {len(vocab)} characters do not fit the model ({e})") from None
    try:
        model.check_input(np.zeros((1, seq_len), np.int64), "ids")
    except (TypeError, ValueError) as e:
        raise ValueError(f"seq_len: the model does not take windows of {seq_len} ({e})") from None
    if out[-1] != len(vocab):
        raise ValueError(f"vocab: {len(vocab)} characters, the model predicts {out[-1]} (a "
                         f"vocabulary of another text?)")


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


def warmup_cosine(opt, total: int, warmup: int):
    """``warmup`` steps of linear warmup, then a cosine down to 0 at step ``total``: nanoGPT's
    schedule with min_lr 0 and lr_decay_iters = ``total``."""
    return WarmupCosineLR(opt, warmup, max(total, warmup + 1))


def check_config(c) -> LMConfig:
    """``c`` if every field of the ``LMConfig`` is usable, else TypeError/ValueError naming
    the field: all of it before any training (a prompt, temperature or sample length that
    sampling would reject is found now, not after the run)."""
    if not isinstance(c, LMConfig):
        raise TypeError(f"config: expected an LMConfig, got {type(c).__name__}")
    for name in ("d_ffn", "blocks"):
        _count(f"config.{name}", getattr(c, name))
    check_text_config(c)
    # Each block's spatial gating weight is (seq_len, seq_len): with its gradient and two
    # AdamW moments, 4 of them per block. A seq_len that would not fit is refused up front.
    need = 4 * c.blocks * c.seq_len ** 2 * np.dtype(check_dtype(c.dtype)).itemsize
    if need > MAX_SPATIAL_BYTES:
        raise ValueError(f"config.seq_len: {c.seq_len} makes {c.blocks} spatial weights of "
                         f"seq_len x seq_len that need {need:,} bytes with their gradients "
                         f"and AdamW moments, above {MAX_SPATIAL_BYTES:,}; use a shorter "
                         f"seq_len (block_size)")
    return c


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
    _check_vocab_fits(s.model, s.vocab)
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

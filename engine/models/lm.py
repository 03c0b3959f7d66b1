"""An attention-free character-level language model: ``Embedding`` -> N causal ``GMLPBlock``
(Liu et al. 2021, "Pay Attention to MLPs") -> ``LayerNorm`` -> ``Linear`` to the vocabulary,
predicting each next character; its corpus, split, windows, unigram baseline and ``sample``.
Training it (``setup``, ``train``: ``fit`` and ``CrossEntropyLoss``) lives one layer up, in
engine/training/lm.py (``engine.lm``).

The corpus ships with Python itself, so nothing is downloaded: the help texts of
``pydoc_data.topics`` (the language reference's topics that ``help("for")`` prints), joined in
sorted topic order. A held-out split (every tenth block of 4096 characters) measures the
loss in bits per character next to a unigram baseline (each character's training frequency,
add-one smoothed), and ``sample`` generates text from a prompt.
"""
from __future__ import annotations

import math
import platform

import numpy as np

from ..nn.blocks import LayerNorm
from ..nn.embedding import Embedding
from ..nn.gmlp_block import GMLPBlock
from ..nn.containers import Sequential
from ..nn.layers import Linear
from .._checks import check_dtype, check_int, check_positive_int
from ..nn.module import Module, make_rng
from .lm_config import LMConfig, TextConfig, check_text_config
from .sampling import autoregress, encode_prompt
from .tokenizer import ByteTokenizer, Vocabulary

__all__ = ["TextConfig", "LMConfig", "Vocabulary", "corpus", "corpus_description", "split",
           "windows", "unigram_bits", "build_model", "sample", "check_config",
           "check_vocab_fits"]

MAX_SPATIAL_BYTES = 4 << 30  # the gMLP's spatial weights' training state (4 GiB)


# ----------------------------------------------------------------------------- checks
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
    block = check_int("block", block, 1)
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
    seq_len = check_int("seq_len", seq_len, 1)
    stride = seq_len if stride is None else check_int("stride", stride, 1)
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
    vocab_size = check_int("vocab_size", vocab_size, 1)
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


def sample(model, vocab, prompt: str, length: int, seq_len: int,
           temperature: float = 0.8, rng=None) -> str:
    """``prompt`` followed by ``length`` tokens drawn one at a time from the model's
    next-token distribution (softmax of logits / ``temperature``), each conditioned on the
    last ``seq_len`` tokens (a causal model takes any shorter prefix as it is); ``vocab`` a
    character ``Vocabulary`` or a ``ByteTokenizer``. The loop of ``engine.generate``
    (engine/models/sampling.py)."""
    if not isinstance(vocab, (Vocabulary, ByteTokenizer)):
        raise TypeError(f"vocab: expected a Vocabulary or ByteTokenizer, got "
                        f"{type(vocab).__name__}")
    prompt = _prompt(prompt)
    temperature = _temperature(temperature)
    length = check_int("length", length, 0)
    seq_len = check_int("seq_len", seq_len, 1)
    check_vocab_fits(model, vocab, seq_len)
    ids = encode_prompt(vocab, prompt)
    out = autoregress(model, ids[None], length, seq_len, temperature, None, make_rng(rng))
    return vocab.decode(out[0])


def check_vocab_fits(model, vocab: Vocabulary, seq_len: int = 1) -> None:
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


def check_config(c) -> LMConfig:
    """``c`` if every field of the ``LMConfig`` is usable, else TypeError/ValueError naming
    the field: all of it before any training (a prompt, temperature or sample length that
    sampling would reject is found now, not after the run)."""
    if not isinstance(c, LMConfig):
        raise TypeError(f"config: expected an LMConfig, got {type(c).__name__}")
    for name in ("d_ffn", "blocks"):
        check_int(f"config.{name}", getattr(c, name), 1)
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



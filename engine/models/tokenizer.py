"""Tokenizers of the language models: text <-> integer ids, and the plain dict a checkpoint
stores so that a saved model reads and writes text as it was trained to.

- ``Vocabulary`` (character level, as Karpathy's char-rnn and nanoGPT's shakespeare_char):
  the distinct characters of the training text, sorted; a character outside it is an error.
- ``ByteTokenizer`` (byte level, as GPT-2's base alphabet): the 256 byte values of UTF-8,
  so any text encodes and nothing is unknown.

``tokenizer_meta(tok)`` is the checkpoint's ``tokenizer`` entry; ``tokenizer_from_meta``
rebuilds it and raises ValueError/TypeError naming what is wrong with a stored entry.
"""
from __future__ import annotations

import numpy as np

__all__ = ["Vocabulary", "ByteTokenizer", "tokenizer_meta", "tokenizer_from_meta", "KINDS"]

# Checkpoint ``tokenizer`` entries: {"kind": "char", "chars": "..."} or {"kind": "byte"}.
KINDS = ("char", "byte")


def _check_ids(ids, n: int) -> list:
    """``ids`` (a sequence or array of integers, each in [0, n)) as a list of ints;
    TypeError/ValueError naming the first that is not."""
    if isinstance(ids, (str, bytes)) or not hasattr(ids, "__iter__"):
        raise TypeError(f"ids: expected a sequence of integer ids, got {type(ids).__name__}")
    out = []
    for k, i in enumerate(ids):
        if isinstance(i, (bool, np.bool_)) or not isinstance(i, (int, np.integer)):
            raise TypeError(f"ids[{k}]: expected an integer id, got {i!r} ({type(i).__name__})")
        if not 0 <= i < n:
            raise ValueError(f"ids[{k}]: expected an id in [0, {n}), got {i}")
        out.append(int(i))
    return out


def _check_text(text) -> str:
    if not isinstance(text, str):
        raise TypeError(f"text: expected a str, got {type(text).__name__}")
    return text


class Vocabulary:
    """The distinct characters of a text, sorted, each with its id (its index)."""

    kind = "char"

    def __init__(self, chars):
        if not isinstance(chars, str):
            raise TypeError(f"chars: expected a str (a text), got {type(chars).__name__}")
        chars = "".join(sorted(set(chars)))
        if not chars:
            raise ValueError("chars: expected at least one character")
        self.chars = chars
        self._index = {c: i for i, c in enumerate(chars)}

    def __len__(self) -> int:
        return len(self.chars)

    def __repr__(self) -> str:
        return f"Vocabulary({len(self)} characters)"

    def encode(self, text: str) -> np.ndarray:
        """The ids of ``text`` as an int64 array; ValueError naming characters not in the
        vocabulary."""
        _check_text(text)
        missing = sorted(set(text) - set(self._index))
        if missing:
            raise ValueError(f"text: characters not in the vocabulary: {''.join(missing)!r}")
        index = self._index
        return np.fromiter((index[c] for c in text), np.int64, len(text))

    def decode(self, ids) -> str:
        """The text of integer ``ids`` (a sequence or array), each in [0, len(self));
        TypeError/ValueError naming the first that is not (no wrap-around, no truncation)."""
        chars = self.chars
        return "".join(chars[i] for i in _check_ids(ids, len(chars)))


class ByteTokenizer:
    """UTF-8 bytes as ids 0-255: every text encodes; ``decode`` replaces a byte sequence that
    is not valid UTF-8 (a sample cut inside a character) with U+FFFD, as ``bytes.decode(...,
    errors="replace")``."""

    kind = "byte"

    def __len__(self) -> int:
        return 256

    def __repr__(self) -> str:
        return "ByteTokenizer()"

    def __eq__(self, other) -> bool:
        return isinstance(other, ByteTokenizer)

    __hash__ = object.__hash__

    def encode(self, text: str) -> np.ndarray:
        """The UTF-8 bytes of ``text`` as an int64 array of ids in [0, 256)."""
        return np.frombuffer(_check_text(text).encode("utf-8"), np.uint8).astype(np.int64)

    def decode(self, ids) -> str:
        """The text of byte ids (each in [0, 256)); invalid UTF-8 becomes U+FFFD."""
        return bytes(_check_ids(ids, 256)).decode("utf-8", errors="replace")


def tokenizer_meta(tok) -> dict:
    """The checkpoint entry of a ``Vocabulary`` or ``ByteTokenizer``."""
    if isinstance(tok, Vocabulary):
        return {"kind": "char", "chars": tok.chars}
    if isinstance(tok, ByteTokenizer):
        return {"kind": "byte"}
    raise TypeError(f"tokenizer: expected a Vocabulary or ByteTokenizer, got "
                    f"{type(tok).__name__}")


def tokenizer_from_meta(meta):
    """The tokenizer a checkpoint entry describes; TypeError/ValueError naming what is wrong
    (a stored entry is untrusted input)."""
    if not isinstance(meta, dict):
        raise TypeError(f"tokenizer: expected a dict with a 'kind' in {KINDS}, got "
                        f"{type(meta).__name__}")
    kind = meta.get("kind")
    if kind == "byte":
        return ByteTokenizer()
    if kind == "char":
        chars = meta.get("chars")
        if not isinstance(chars, str) or not chars:
            raise ValueError("tokenizer: a 'char' tokenizer needs a non-empty str 'chars'")
        if "".join(sorted(set(chars))) != chars:
            raise ValueError("tokenizer: 'chars' must be distinct characters in sorted order")
        return Vocabulary(chars)
    raise ValueError(f"tokenizer: expected 'kind' in {KINDS}, got {kind!r}")

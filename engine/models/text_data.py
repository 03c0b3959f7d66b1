"""The text a language model trains on, as token ids: a UTF-8 file of any size or a str, read
through a character-level ``Vocabulary`` or the byte-level ``ByteTokenizer``
(engine/models/tokenizer.py).

A file is read in chunks (through an incremental UTF-8 decoder, twice for characters: once for
the vocabulary, once for the ids), so the text is never held whole as a str: the one copy is
the id array, in the narrowest unsigned dtype that holds the vocabulary (uint8 for bytes and
for up to 256 characters). Errors name the file and say what to do.
"""
from __future__ import annotations

import codecs
import os
from dataclasses import dataclass

import numpy as np

from .tokenizer import ByteTokenizer, Vocabulary

__all__ = ["TextIds", "TOKENIZERS", "check_tokenizer", "encode", "text_ids", "file_ids",
           "id_dtype"]

TOKENIZERS = ("char", "byte")
CHUNK = 1 << 24  # bytes read (and characters encoded) at a time: 16 MiB


@dataclass(frozen=True)
class TextIds:
    """A text's token ids and where they came from."""
    ids: np.ndarray   # (N,) token ids, uint8/uint16/uint32
    tokenizer: object  # the Vocabulary or ByteTokenizer that made them
    source: str       # what the text is, for a report: a file name and size, or a str's size


def check_tokenizer(name) -> str:
    """``name`` if it is "char" or "byte", else TypeError/ValueError naming ``tokenizer``."""
    if not isinstance(name, str):
        raise TypeError(f"tokenizer: expected one of {TOKENIZERS}, got {type(name).__name__}")
    if name not in TOKENIZERS:
        raise ValueError(f"tokenizer: expected one of {TOKENIZERS}, got {name!r}")
    return name


def id_dtype(vocab_size: int) -> np.dtype:
    """The narrowest unsigned integer dtype holding ids below ``vocab_size``."""
    for dt in (np.uint8, np.uint16):
        if vocab_size <= np.iinfo(dt).max + 1:
            return np.dtype(dt)
    return np.dtype(np.uint32)


def _code_points(text: str) -> np.ndarray:
    # UTF-32 is one uint32 per character: the code points without a Python loop.
    return np.frombuffer(text.encode("utf-32-le", "surrogatepass"), np.uint32)


def encode(tok, text: str, out: np.ndarray | None = None) -> np.ndarray:
    """The ids of ``text`` (into ``out`` when given), in ``id_dtype(len(tok))``: the same ids as
    ``tok.encode(text)``, computed in one vectorised pass; ValueError naming characters outside
    a ``Vocabulary``."""
    if isinstance(tok, ByteTokenizer):
        ids = np.frombuffer(text.encode("utf-8", "surrogatepass"), np.uint8)
    else:
        table = _code_points(tok.chars)  # sorted, as the Vocabulary's characters
        cps = _code_points(text)
        ids = np.minimum(np.searchsorted(table, cps), len(table) - 1)
        if not np.array_equal(table[ids], cps):
            tok.encode(text)  # raises, naming the characters
        ids = ids.astype(id_dtype(len(tok)))
    if out is None:
        return ids
    out[:] = ids
    return out


def _tokenizer_of(kind: str, chars: str | set):
    return ByteTokenizer() if kind == "byte" else Vocabulary("".join(chars))


def text_ids(text: str, tokenizer: str = "char") -> TextIds:
    """The ids of the str ``text``; ValueError for an empty text."""
    if not isinstance(text, str):
        raise TypeError(f"text: expected a str, got {type(text).__name__}")
    if not text:
        raise ValueError("text: expected a non-empty str, got ''")
    tok = _tokenizer_of(check_tokenizer(tokenizer), text)
    return TextIds(encode(tok, text), tok, f"a str of {len(text):,} characters")


def _chunks(path: str, f):
    """The file's text in decoded chunks; ValueError at the first byte that is not UTF-8."""
    decoder = codecs.getincrementaldecoder("utf-8")("strict")
    offset = 0
    while True:
        raw = f.read(CHUNK)
        try:
            text = decoder.decode(raw, final=not raw)
        except UnicodeDecodeError as e:
            raise ValueError(f"{path}: not UTF-8 text (byte {offset + e.start:,} is "
                             f"{raw[e.start:e.start + 1]!r}); --tokenizer byte reads any "
                             f"file") from None
        offset += len(raw)
        yield text
        if not raw:
            return


def _check_file(path) -> tuple:
    """``(path as str, size in bytes)`` of a readable, non-empty regular file, else
    ValueError/OSError naming it."""
    path = os.fspath(path)
    if os.path.isdir(path):
        raise ValueError(f"{path}: is a directory, expected a text file")
    size = os.path.getsize(path)  # FileNotFoundError for a missing file
    if size == 0:
        raise ValueError(f"{path}: the file is empty")
    return path, size


def file_ids(path, tokenizer: str = "char") -> TextIds:
    """The ids of the UTF-8 text file at ``path`` (``tokenizer="byte"``: of any file), read in
    chunks; ValueError for a directory, an empty file or bytes that are not UTF-8 (char),
    OSError for a file that cannot be read."""
    kind = check_tokenizer(tokenizer)
    path, size = _check_file(path)
    source = f"{path}: {size:,} bytes"
    if kind == "byte":
        return TextIds(np.fromfile(path, np.uint8), ByteTokenizer(), source)
    chars, n = set(), 0
    with open(path, "rb") as f:
        for text in _chunks(path, f):
            chars.update(text)
            n += len(text)
    tok = _tokenizer_of(kind, chars)
    ids = np.empty(n, id_dtype(len(tok)))  # (N,) the one copy of the text
    k = 0
    with open(path, "rb") as f:
        for text in _chunks(path, f):
            encode(tok, text, ids[k:k + len(text)])
            k += len(text)
    if k != n:  # the file changed between the two reads
        raise ValueError(f"{path}: the file changed while it was read")
    return TextIds(ids, tok, f"{source}, {n:,} characters")

"""Text read from a file, made safe to print: a checkpoint's or a CSV's names and values may
hold ESC, BEL, bidirectional overrides or line separators, which a terminal would obey."""
from __future__ import annotations

__all__ = ["safe"]


def safe(text) -> str:
    """``str(text)`` with every character that is not printable (controls such as ESC and
    BEL, bidirectional overrides, line separators, tabs) written as a Python escape: what a
    file holds is shown, never obeyed."""
    text = str(text)
    if text.isprintable():
        return text
    return "".join(c if c.isprintable() else _escape(c) for c in text)


def _escape(c: str) -> str:
    n = ord(c)
    return f"\\x{n:02x}" if n < 0x100 else f"\\u{n:04x}" if n < 0x10000 else f"\\U{n:08x}"

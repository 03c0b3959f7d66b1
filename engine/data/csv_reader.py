"""CSV reading for ``load``: NumPy's parser for a plain table of numbers, and a careful
reader, one value at a time, that names the line and column of any problem."""
from __future__ import annotations

import csv
import io
import math
import os
import re
import warnings

import numpy as np

__all__ = ["read_csv", "csv_columns", "csv_text"]

_INT = re.compile(r"[+-]?\d+")
_INT64 = np.iinfo(np.int64)


def csv_text(path: str) -> str:
    """The file's text: UTF-8, with or without a byte-order mark (Excel's "CSV UTF-8");
    other bytes are a ValueError naming the line and byte, not a bare UnicodeDecodeError."""
    with open(path, "rb") as f:
        raw = f.read()
    try:
        return raw.decode("utf-8-sig")
    except UnicodeDecodeError as e:
        line = raw.count(b"\n", 0, e.start) + 1
        col = e.start - (raw.rfind(b"\n", 0, e.start) + 1) + 1
        raise ValueError(f"{path}: line {line}, byte {col}: not UTF-8 text (byte "
                         f"0x{raw[e.start]:02x}); save the file as UTF-8 CSV") from None


def _records(path: str, reader):
    """The reader's records; a malformed one (a field over the csv module's limit, a NUL
    byte) is a ValueError naming the file and line."""
    while True:
        try:
            rec = next(reader)
        except StopIteration:
            return
        except csv.Error as e:
            raise ValueError(f"{path}: line {reader.line_num}: {e}") from None
        yield rec


_DELIMITERS = (",", ";", "\t", "|")


def csv_columns(path, delimiter=None) -> list:
    """The column names of the CSV at ``path`` (its header row, stripped), split as ``load``
    splits them."""
    text = csv_text(os.fspath(path))
    with io.StringIO(text, newline="") as f:
        return [h.strip() for h in next(csv.reader(f, delimiter=_delimiter(text, delimiter)), [])]


def _delimiter(text: str, delimiter) -> str:
    """``delimiter`` checked, or the one of ``_DELIMITERS`` the header line holds most often."""
    if delimiter is not None:
        if not isinstance(delimiter, str) or len(delimiter) != 1 or delimiter in "\r\n\"":
            raise ValueError(f"delimiter: expected one character (not a quote or a line end), "
                             f"got {delimiter!r}")
        return delimiter
    first = text[:text.find("\n")] if "\n" in text else text
    counts = [first.count(d) for d in _DELIMITERS]
    return _DELIMITERS[counts.index(max(counts))] if max(counts) else ","


def read_csv(path, xs, ys, dt, delimiter=None):
    """``(X, Y)`` of the CSV at ``path``: the ``xs`` columns (None: all but the targets) as
    ``dt``, the ``ys`` columns as ``dt`` or, one integer column, int64 labels."""
    if ys is None:
        raise ValueError("y: name the target column(s) of a CSV file")
    text = csv_text(path)
    delim = _delimiter(text, delimiter)
    fast = _load_csv_fast(text, xs, ys, dt, delim)
    if fast is not None:
        return fast
    # The careful reader: every value parsed on its own, so each error names its line and
    # column. It also takes what the fast reader leaves to it (quotes, text columns).
    with io.StringIO(text, newline="") as f:
        reader = csv.reader(f, delimiter=delim)
        records = _records(path, reader)
        header, xs = _header(path, next(records, None), xs, ys)
        cols = [header.index(c) for c in xs + ys]
        label_col = len(xs) if len(ys) == 1 else -1  # one target column: maybe labels
        rows, lines, is_int, labels = _rows(path, reader, records, header, cols, label_col)
    if not rows:
        raise ValueError(f"{path}: no data rows after the header")
    data = np.array(rows, dtype=np.float64)  # (N, len(x) + len(y))
    nx = len(xs)
    X = _cast_csv(path, header, cols, lines, data, 0, nx, dt)
    if len(ys) == 1 and is_int[nx]:  # labels: the exact integers, not their float64 values
        c = cols[nx]
        return X, np.array([_label(path, line, c, header[c], text) for line, text in labels],
                           dtype=np.int64)
    return X, _cast_csv(path, header, cols, lines, data, nx, len(cols), dt)


def _header(path, header, xs, ys) -> tuple:
    """The stripped ``header`` record and the input columns (``xs``, None: all but ``ys``),
    checked: present, unique, not targets, at least one."""
    if header is None or not any(h.strip() for h in header):
        raise ValueError(f"{path}: line 1: expected a header row of column names")
    header = [h.strip() for h in header]
    dup = sorted({h for h in header if header.count(h) > 1})
    if dup:
        raise ValueError(f"{path}: line 1: duplicate column names {dup}")
    for what, names in (("y", ys), ("x", xs)):
        missing = [c for c in names or () if c not in header]
        if missing:
            raise ValueError(f"{what}: {path} has no column(s) {missing}; its columns are "
                             f"{header}")
    if xs is None:
        unnamed = [i + 1 for i, h in enumerate(header) if not h and h not in ys]
        if unnamed:  # e.g. the index pandas' DataFrame.to_csv writes first, 0 .. N-1
            raise ValueError(f"x: {path}: column {unnamed[0]} has no name in the header (the "
                             f"index pandas writes unless to_csv(index=False)?); an unnamed "
                             f"column is not taken as an input: write the file without it, or "
                             f"name the input columns (x=..., --x-cols)")
        xs = [h for h in header if h not in ys]
    both = sorted(set(xs) & set(ys))
    if both:
        raise ValueError(f"x: the column(s) {both} are also targets (y)")
    if not xs:
        raise ValueError(f"x: {path} has no input column left besides the targets {ys}")
    return header, xs


# How spreadsheets and pandas write a missing value (compared lower-case, stripped).
_MISSING = ("", "na", "n/a", "nan", "null", "none", "?", "-", "#n/a")


def _rows(path, reader, records, header, cols, label_col) -> tuple:
    """``(rows, lines, is_int, labels)``: the values of columns ``cols`` of every record, the
    file line of each, whether each column reads as integers, and the (line, text) of the
    ``label_col``-th column while it does."""
    rows, lines, labels, is_int = [], [], [], [True] * len(cols)
    for rec in records:
        if not rec or (len(rec) == 1 and not rec[0].strip()):
            continue  # blank line
        line = reader.line_num
        if len(rec) != len(header):
            raise ValueError(f"{path}: line {line}: expected {len(header)} values (one per "
                             f"column of the header), got {len(rec)}")
        row = []
        for k, c in enumerate(cols):
            text = rec[c].strip()
            try:
                v = float(text)
            except ValueError:
                v = math.nan
            if not math.isfinite(v):
                where = f"{path}: line {line}, column {c + 1} ({header[c]!r})"
                if text.lower() in _MISSING:
                    raise ValueError(f"{where}: a missing value ({rec[c]!r}); missing values "
                                     f"are not supported: drop or fill that row first")
                raise ValueError(f"{where}: expected a finite number, got {rec[c]!r}")
            if is_int[k] and not _INT.fullmatch(text):
                is_int[k] = False
            if k == label_col and is_int[k]:
                labels.append((line, text))
            row.append(v)
        rows.append(row)
        lines.append(line)
    return rows, lines, is_int, labels


def _load_csv_fast(text: str, xs, ys, dt, delim: str):
    """``(X, Y)`` read by NumPy's parser (``np.loadtxt``, ~6x faster than a value at a time),
    or None whenever the file is anything but a plain table of finite numbers (quotes,
    ragged or blank-looking rows, text, NaN, a value ``dt`` cannot hold, a bad column name):
    the careful reader then reads it again and names the line and column of the problem."""
    if '"' in text or "\0" in text or "\r" in text.replace("\r\n", "\n"):
        return None
    end = text.find("\n")
    if end < 0:
        return None
    header = [h.strip() for h in text[:end].split(delim)]
    if len(set(header)) != len(header) or not all(header):
        return None
    if any(c not in header for c in list(xs or ()) + list(ys)):
        return None
    xs = xs if xs is not None else [h for h in header if h not in ys]
    if not xs or set(xs) & set(ys):
        return None
    try:
        with warnings.catch_warnings():  # "input contained no data": the careful reader says it
            warnings.simplefilter("ignore")
            data = np.loadtxt(io.StringIO(text), delimiter=delim, dtype=np.float64,
                              comments=None, skiprows=1, ndmin=2)  # (N, columns)
    except ValueError:
        return None
    if data.shape[0] == 0 or data.shape[1] != len(header) or not np.all(np.isfinite(data)):
        return None
    idx = [header.index(c) for c in xs]
    with np.errstate(over="ignore"):
        X = np.ascontiguousarray(data[:, idx], dtype=dt)
        Yf = np.ascontiguousarray(data[:, [header.index(c) for c in ys]], dtype=dt)
    if not (np.all(np.isfinite(X)) and np.all(np.isfinite(Yf))):
        return None
    yv = data[:, header.index(ys[0])] if len(ys) == 1 else None
    if yv is not None and np.array_equal(yv, np.trunc(yv)):  # may be labels: read their text
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            texts = np.loadtxt(io.StringIO(text), delimiter=delim, dtype=str, comments=None,
                               skiprows=1, usecols=[header.index(ys[0])], ndmin=1)
        texts = [t.strip() for t in texts.tolist()]
        if all(_INT.fullmatch(t) for t in texts):  # integer labels, exactly as written
            labels = [int(t) for t in texts]
            if min(labels) < _INT64.min or max(labels) > _INT64.max:
                return None
            return X, np.array(labels, dtype=np.int64)
    return X, Yf


def _cast_csv(path, header, cols, lines, data, start: int, stop: int, dt) -> np.ndarray:
    """Columns ``start:stop`` of the parsed ``data`` as ``dt``; a value it cannot hold is a
    ValueError naming its line and column."""
    with np.errstate(over="ignore"):
        out = np.ascontiguousarray(data[:, start:stop], dtype=dt)
    if out.size and not (np.isfinite(out.min()) and np.isfinite(out.max())):
        r, k = np.unravel_index(int(np.argmax(~np.isfinite(out))), out.shape)
        c = cols[start + k]
        raise ValueError(f"{path}: line {lines[r]}, column {c + 1} ({header[c]!r}): the value "
                         f"{float(data[r, start + k])!r} overflows {dt} (use dtype=float64)")
    return out


def _label(path, line: int, c: int, name: str, text: str) -> int:
    """The integer ``text`` of a target column, if int64 holds it; else ValueError naming the
    place (a label must round-trip exactly, never wrap or round)."""
    v = int(text)
    if not _INT64.min <= v <= _INT64.max:
        raise ValueError(f"{path}: line {line}, column {c + 1} ({name!r}): the integer label "
                         f"{text} does not fit int64 ([{_INT64.min}, {_INT64.max}])")
    return v

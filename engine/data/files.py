"""Data: your own (``load`` of ``.npz`` and ``.csv`` files, ``train_val_split``, the
``Standardizer``) and the synthetic tasks for examples, tests and ``python -m engine train``.

Every function returns ``(X, Y)`` as C-contiguous arrays of the requested float dtype;
classification targets are int64 labels. Same ``rng`` seed, same data.
"""
from __future__ import annotations

import csv
import io
import math
import numbers
import os
import re
import warnings
import zipfile

import numpy as np

from .._checks import check_int, check_real
from ..nn.module import check_dtype, make_rng

__all__ = ["load", "load_inputs", "csv_columns", "train_val_split", "Standardizer", "infer_task",
           "regression", "regression_targets", "spiral", "xor", "sine", "TASKS", "make_task"]

REGRESSION_OUTPUTS = ("sin(0.3(x0+x1+x2))", "tanh(0.25(x0-x3+x4-x5+x6))",
                      "0.1(x7+x8)^2-0.6", "0.1*x9*x10+0.2*x11")


def _check_n(n, minimum: int = 1) -> int:
    return check_int("n", n, minimum)


def regression_targets(X: np.ndarray) -> np.ndarray:
    """The four fixed smooth targets of the regression task, for inputs ``X`` (N, >=12), in
    float64 (N, 4). Inputs 12..15 of the 16 are distractors that no target depends on.

        y0 = sin(0.3 (x0 + x1 + x2))              a smooth wave along a diagonal
        y1 = tanh(0.25 (x0 - x3 + x4 - x5 + x6))   a saturating ridge (shares x0 with y0)
        y2 = 0.1 (x7 + x8)^2 - 0.6                 a quadratic valley, about zero-mean
        y3 = 0.1 x9 x10 + 0.2 x11                  a pairwise interaction plus a linear term
    """
    x = np.asarray(X, dtype=np.float64)
    if x.ndim != 2 or x.shape[1] < 12:
        raise ValueError(f"X: expected shape (N, d) with d >= 12, got {x.shape}")
    Y = np.empty((x.shape[0], 4))  # (N, 4)
    Y[:, 0] = np.sin(0.3 * (x[:, 0] + x[:, 1] + x[:, 2]))
    Y[:, 1] = np.tanh(0.25 * (x[:, 0] - x[:, 3] + x[:, 4] - x[:, 5] + x[:, 6]))
    Y[:, 2] = 0.1 * (x[:, 7] + x[:, 8]) ** 2 - 0.6
    Y[:, 3] = 0.1 * x[:, 9] * x[:, 10] + 0.2 * x[:, 11]
    return Y


def regression(n: int = 1024, d_in: int = 16, dtype=np.float32, rng=0):
    """The default regression task: ``X`` uniform in [-3, 3]^d_in (N, d_in), ``Y`` (N, 4) the fixed
    smooth nonlinear functions of ``regression_targets`` (each with a standard deviation of
    about 0.45 to 0.7 over the input box)."""
    dt = check_dtype(dtype)
    n = _check_n(n)
    check_int("d_in", d_in, 12, what="an integer >= 12 (the targets use inputs 0..11)")
    X = make_rng(rng).uniform(-3.0, 3.0, size=(n, int(d_in)))  # float64, then cast once
    return X.astype(dt), regression_targets(X).astype(dt)


def spiral(n: int = 1000, turns: float = 2.0, noise: float = 0.05, dtype=np.float32, rng=0):
    """Two interleaved spirals in the plane: ``X`` (n, 2) in about [-1, 1]^2, labels ``y`` (n,)
    int64 in {0, 1} (n // 2 per class, interleaved). Class 1 is class 0 rotated by pi; each
    spiral winds ``turns`` times around the origin, with Gaussian ``noise`` (std) added."""
    dt = check_dtype(dtype)
    n = _check_n(n, 2)
    g = make_rng(rng)
    y = np.arange(n, dtype=np.int64) % 2
    # Radius grows with the angle; sqrt spreads the points evenly along the arm's length.
    t = np.sqrt(g.uniform(0.0, 1.0, n)) * turns * 2.0 * np.pi
    r = t / (turns * 2.0 * np.pi)
    angle = t + np.pi * y
    X = np.stack([r * np.cos(angle), r * np.sin(angle)], axis=1)
    X += noise * g.standard_normal(X.shape)
    return X.astype(dt), y


def xor(dtype=np.float32):
    """The four XOR points: ``X`` (4, 2) in {0, 1}^2 and labels ``y`` = [0, 1, 1, 0] (int64)."""
    dt = check_dtype(dtype)
    X = np.array([[0, 0], [0, 1], [1, 0], [1, 1]], dtype=dt)
    return X, np.array([0, 1, 1, 0], dtype=np.int64)


def sine(n: int = 256, dtype=np.float32, rng=0):
    """``X`` (n, 1) uniform in [-pi, pi] and ``Y = sin(X)`` (n, 1)."""
    dt = check_dtype(dtype)
    X = make_rng(rng).uniform(-np.pi, np.pi, size=(_check_n(n), 1))
    return X.astype(dt), np.sin(X).astype(dt)


# name -> (kind, default number of samples)
TASKS = {"regression": ("regression", 1024), "spiral": ("classification", 1000),
         "xor": ("classification", 4), "sine": ("regression", 256)}


def make_task(name: str, n: int | None = None, dtype=np.float32, rng=0):
    """``(X, Y, kind)`` for a task of ``TASKS`` (``n`` is ignored for xor)."""
    if name not in TASKS:
        raise ValueError(f"task: expected one of {sorted(TASKS)}, got {name!r}")
    kind, default_n = TASKS[name]
    n = default_n if n is None else n
    if name == "regression":
        X, Y = regression(n, dtype=dtype, rng=rng)
    elif name == "spiral":
        X, Y = spiral(n, dtype=dtype, rng=rng)
    elif name == "xor":
        X, Y = xor(dtype)
    else:
        X, Y = sine(n, dtype=dtype, rng=rng)
    return X, Y, kind


# ----------------------------------------------------------------------------- your own data
_INT = re.compile(r"[+-]?\d+")


def _names(what: str, v) -> list | None:
    if v is None:
        return None
    if isinstance(v, str):
        return [v]
    if isinstance(v, (list, tuple)) and v and all(isinstance(c, str) for c in v):
        dup = sorted({c for c in v if v.count(c) > 1})
        if dup:  # the same column twice would silently train on a duplicated feature/target
            raise ValueError(f"{what}: the column(s) {dup} are named more than once")
        return list(v)
    raise TypeError(f"{what}: expected a column name or a non-empty list of names, got {v!r}")


def load(path, x=None, y=None, dtype=np.float32, delimiter=None):
    """Your own data as ``(X, Y)``: ``X`` (N, d) of ``dtype``; ``Y`` (N,) int64 labels when the
    target is one integer column (a classification), else (N, k) of ``dtype``.

    - ``.npz``: the arrays named ``x`` and ``y`` (default "x" and "y"). ``X`` has a sample
      axis first ((N, d), or (N,) for one feature); integer targets of shape (N,) are labels.
    - ``.csv``: UTF-8 text (a byte-order mark, as Excel's "CSV UTF-8" writes, is fine): a
      header row, then one sample per line, numbers only. ``y`` names the target
      column(s) (required); ``x`` the input columns (default: all the others). A target
      column whose values are all integers ("0", "2", "-1") is read as labels. The fields
      are separated by ``delimiter``; None picks, of ",", ";", tab and "|", the one found most
      often in the header line ("," if none is).

    Every problem with the file is a ValueError naming it and, for a CSV, the line (and
    column) of the first bad value: a damaged .npz (truncated, encrypted, a CRC mismatch, a
    member that is not .npy data, a declared shape larger than the bytes stored), text that
    is not UTF-8, a malformed CSV record, no samples, no features or no target columns; a
    missing column or array lists the ones the file has.
    """
    dt = check_dtype(dtype)
    try:
        path = os.fspath(path)
    except TypeError:
        raise TypeError(f"path: expected a str or os.PathLike, got {type(path).__name__}") from None
    if not isinstance(path, str):
        path = os.fsdecode(path)
    xs, ys = _names("x", x), _names("y", y)
    low = path.lower()
    if low.endswith(".npz"):
        return _load_npz(path, xs, ys, dt)
    if low.endswith(".csv"):
        return _load_csv(path, xs, ys, dt, delimiter)
    raise ValueError(f"path: expected a .npz or .csv file, got {path!r}")


def load_inputs(path, x=None, dtype=np.float32, delimiter=None) -> np.ndarray:
    """The inputs alone of a file ``load`` reads, for prediction: the ``x`` columns of a CSV
    (default: all) or the ``x`` array of an .npz (default "x"), as ``(N, d)`` of ``dtype``,
    with ``load``'s checks and messages; no target is needed."""
    dt = check_dtype(dtype)
    try:
        path = os.fspath(path)
    except TypeError:
        raise TypeError(f"path: expected a str or os.PathLike, got {type(path).__name__}") from None
    xs = _names("x", x)
    low = path.lower()
    if low.endswith(".csv"):
        return _load_csv(path, xs, [], dt, delimiter)[0]
    if not low.endswith(".npz"):
        raise ValueError(f"path: expected a .npz or .csv file, got {path!r}")
    if xs is not None and len(xs) != 1:
        raise ValueError(f"x: an .npz file holds one array per name; got {xs}")
    xname = xs[0] if xs else "x"
    (X,) = _read_npz(path, {"x": xname})
    if not (np.issubdtype(X.dtype, np.number) or X.dtype == np.bool_) or np.iscomplexobj(X):
        raise ValueError(f"{path}: array {xname!r}: expected real numbers, got dtype {X.dtype}")
    if X.ndim == 0 or X.shape[0] == 0:
        raise ValueError(f"{path}: array {xname!r} holds no samples (shape {X.shape})")
    if np.issubdtype(X.dtype, np.inexact) and not np.all(np.isfinite(X)):
        bad = tuple(int(i) for i in np.argwhere(~np.isfinite(X))[0])
        raise ValueError(f"{path}: array {xname!r}: non-finite value {X[bad]} at index {bad}")
    return _cast(path, f"array {xname!r}", X.reshape(-1, 1) if X.ndim == 1 else X, dt)


def _load_npz(path, xs, ys, dt):
    for what, names in (("x", xs), ("y", ys)):
        if names is not None and len(names) != 1:
            raise ValueError(f"{what}: an .npz file holds one array per name; got {names}")
    xname = xs[0] if xs else "x"
    yname = ys[0] if ys else "y"
    X, Y = _read_npz(path, {"x": xname, "y": yname})
    for name, a in ((xname, X), (yname, Y)):
        if not (np.issubdtype(a.dtype, np.number) or a.dtype == np.bool_):
            raise ValueError(f"{path}: array {name!r}: expected numbers, got dtype {a.dtype}")
        if a.ndim == 0:
            raise ValueError(f"{path}: array {name!r}: expected a sample axis, got a scalar")
        if np.issubdtype(a.dtype, np.inexact) and not np.all(np.isfinite(a)):
            bad = tuple(int(i) for i in np.argwhere(~np.isfinite(a))[0])
            raise ValueError(f"{path}: array {name!r}: non-finite value {a[bad]} at index {bad}")
    if X.shape[0] != Y.shape[0]:
        raise ValueError(f"{path}: {xname!r} has {X.shape[0]} samples, {yname!r} has {Y.shape[0]}")
    if X.shape[0] == 0:
        raise ValueError(f"{path}: array {xname!r} holds no samples (shape {X.shape})")
    for name, a, what in ((xname, X, "features"), (yname, Y, "target columns")):
        if a.ndim > 1 and 0 in a.shape[1:]:
            raise ValueError(f"{path}: array {name!r} has no {what} (shape {a.shape})")
    if np.iscomplexobj(X) or np.iscomplexobj(Y):
        raise ValueError(f"{path}: complex arrays are not supported")
    X = _cast(path, f"array {xname!r}", X.reshape(-1, 1) if X.ndim == 1 else X, dt)
    if Y.ndim == 1 and np.issubdtype(Y.dtype, np.integer):
        if Y.size and Y.dtype.kind == "u" and Y.max() > _INT64.max:  # labels never wrap
            at = int(np.argmax(Y > _INT64.max))
            raise ValueError(f"{path}: array {yname!r}: the label {int(Y[at])} at index {at} "
                             f"does not fit int64")
        return X, np.ascontiguousarray(Y, dtype=np.int64)
    Y = _cast(path, f"array {yname!r}", Y.reshape(-1, 1) if Y.ndim == 1 else Y, dt)
    return X, Y


def _cast(path: str, what: str, a: np.ndarray, dt) -> np.ndarray:
    """``a`` as a C-contiguous ``dt`` array; a finite value that ``dt`` cannot hold (1e300
    in float32) is a ValueError naming where, not an inf."""
    with np.errstate(over="ignore"):
        out = np.ascontiguousarray(a, dtype=dt)
    if out.size and not (np.isfinite(out.min()) and np.isfinite(out.max())):
        at = np.unravel_index(int(np.argmax(~np.isfinite(out))), out.shape)
        raise ValueError(f"{path}: {what}: the value {a[at].item()!r} at index "
                         f"{tuple(int(i) for i in at)} overflows {dt} (use dtype=float64)")
    return out


# Largest uncompressed/compressed ratio deflate can reach: a member declaring more lies.
_DEFLATE_MAX_RATIO = 1032


def _read_npz(path: str, names: dict) -> tuple:
    """The arrays ``names`` ({"x": member name, "y": member name}) of the .npz at ``path``.
    Everything a damaged or hostile file can do is a ValueError naming the file: not a zip,
    truncated, encrypted, an unknown compression, a member that is not .npy data, a header
    declaring more bytes than stored (checked before allocating), a CRC-32 mismatch."""
    try:
        with open(path, "rb") as f:
            size = os.fstat(f.fileno()).st_size
            with zipfile.ZipFile(f) as z:
                members = {i.filename: i for i in z.infolist()}
                files = sorted(n[:-4] for n in members if n.endswith(".npy"))
                out = []
                for what, name in names.items():
                    info = members.get(name + ".npy")
                    if info is None:
                        raise ValueError(f"{what}: {path} has no array {name!r}; it has {files}")
                    out.append(_read_member(path, z, info, size))
                return tuple(out)
    except ValueError:
        raise
    except Exception as e:  # zipfile, zlib and numpy raise a dozen types on damaged input
        raise ValueError(f"{path}: not a readable .npz file ({type(e).__name__}: {e})") from None


def _read_member(path: str, z, info, size: int) -> np.ndarray:
    name = info.filename[:-4]
    if info.flag_bits & 0x1:
        raise ValueError(f"{path}: array {name!r} is encrypted")
    if info.compress_type not in (zipfile.ZIP_STORED, zipfile.ZIP_DEFLATED):
        raise ValueError(f"{path}: array {name!r}: unknown compression {info.compress_type}")
    ratio = 1 if info.compress_type == zipfile.ZIP_STORED else _DEFLATE_MAX_RATIO
    if (info.header_offset + info.compress_size > size
            or info.file_size > ratio * info.compress_size + 64):
        raise ValueError(f"{path}: array {name!r} is truncated or corrupt (it declares "
                         f"{info.file_size} bytes in {info.compress_size}; the file has {size})")
    with z.open(info) as m:
        try:
            version = np.lib.format.read_magic(m)
            read = {(1, 0): np.lib.format.read_array_header_1_0,
                    (2, 0): np.lib.format.read_array_header_2_0}.get(version)
            if read is None:
                raise ValueError(f".npy version {version}")
            shape, fortran, dtype = read(m)
        except Exception as e:
            raise ValueError(f"{path}: array {name!r} is not .npy data ({e})") from None
        if dtype.hasobject:
            raise ValueError(f"{path}: array {name!r}: arrays must be numeric, got dtype "
                             f"{dtype}")
        nbytes = math.prod(shape) * dtype.itemsize
        if nbytes != info.file_size - m.tell():
            raise ValueError(f"{path}: array {name!r} declares shape {shape} of {dtype} "
                             f"({nbytes} bytes) and holds {info.file_size - m.tell()}")
        a = np.empty(math.prod(shape), dtype)  # read straight into the array: one copy
        view, got = memoryview(a).cast("B"), 0
        while got < nbytes:
            n = m.readinto(view[got:])
            if not n:
                raise ValueError(f"{path}: array {name!r} is truncated")
            got += n
        if m.read(1):  # reading to the end checks the CRC-32
            raise ValueError(f"{path}: array {name!r} holds more bytes than it declares")
    return a.reshape(shape[::-1]).T if fortran else a.reshape(shape)


def _csv_text(path: str) -> str:
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
    text = _csv_text(os.fspath(path))
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


def _load_csv(path, xs, ys, dt, delimiter=None):
    if ys is None:
        raise ValueError("y: name the target column(s) of a CSV file")
    text = _csv_text(path)
    delim = _delimiter(text, delimiter)
    fast = _load_csv_fast(text, xs, ys, dt, delim)
    if fast is not None:
        return fast
    # The careful reader: every value parsed on its own, so each error names its line and
    # column. It also takes what the fast reader leaves to it (quotes, text columns).
    with io.StringIO(text, newline="") as f:
        reader = csv.reader(f, delimiter=delim)
        records = _records(path, reader)
        header = next(records, None)
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
            xs = [h for h in header if h not in ys]
        both = sorted(set(xs) & set(ys))
        if both:
            raise ValueError(f"x: the column(s) {both} are also targets (y)")
        if not xs:
            raise ValueError(f"x: {path} has no input column left besides the targets {ys}")
        cols = [header.index(c) for c in xs + ys]
        rows, is_int = [], [True] * len(cols)
        label_col = len(xs) if len(ys) == 1 else -1  # one target column: maybe labels
        labels = []  # (line, text) of the target column while it reads as integers
        lines = []   # the file line of each row
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
                    raise ValueError(f"{path}: line {line}, column {c + 1} ({header[c]!r}): "
                                     f"expected a finite number, got {rec[c]!r}")
                if is_int[k] and not _INT.fullmatch(text):
                    is_int[k] = False
                if k == label_col and is_int[k]:
                    labels.append((line, text))
                row.append(v)
            rows.append(row)
            lines.append(line)
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


_INT64 = np.iinfo(np.int64)


def _label(path, line: int, c: int, name: str, text: str) -> int:
    """The integer ``text`` of a target column, if int64 holds it; else ValueError naming the
    place (a label must round-trip exactly, never wrap or round)."""
    v = int(text)
    if not _INT64.min <= v <= _INT64.max:
        raise ValueError(f"{path}: line {line}, column {c + 1} ({name!r}): the integer label "
                         f"{text} does not fit int64 ([{_INT64.min}, {_INT64.max}])")
    return v


def infer_task(Y) -> str:
    """"classification" for integer labels (N,), else "regression"."""
    if not isinstance(Y, np.ndarray):
        raise TypeError(f"Y: expected a numpy.ndarray, got {type(Y).__name__}")
    return "classification" if Y.ndim == 1 and np.issubdtype(Y.dtype, np.integer) else "regression"


def train_val_split(X, Y, val_fraction: float, rng=0):
    """Shuffle the samples with ``rng`` and split them: ``(X_train, Y_train), (X_val, Y_val)``
    with ``round(N * val_fraction)`` validation samples (at least one in each part), as new
    C-contiguous arrays. The pair is what ``fit(..., validation=)`` takes."""
    for name, a in (("X", X), ("Y", Y)):
        if not isinstance(a, np.ndarray) or a.ndim == 0:
            raise TypeError(f"{name}: expected a numpy.ndarray with a sample axis, got "
                            f"{type(a).__name__}")
    n = X.shape[0]
    if Y.shape[0] != n:
        raise ValueError(f"Y: expected {n} samples (X has {n}), got {Y.shape[0]}")
    check_real("val_fraction", val_fraction, 0.0, 1.0, low_open=True, high_open=True)
    n_val = int(round(n * float(val_fraction)))
    if n_val < 1 or n_val > n - 1:
        raise ValueError(f"val_fraction: {val_fraction} of {n} samples leaves "
                         f"{n_val} for validation and {n - n_val} for training; each needs at "
                         f"least one")
    order = make_rng(rng).permutation(n)
    val, train = order[:n_val], order[n_val:]
    return (np.take(X, train, axis=0), np.take(Y, train, axis=0)), \
           (np.take(X, val, axis=0), np.take(Y, val, axis=0))


def _numbers(name: str, v) -> np.ndarray:
    """``v``, a list (or tuple or 1-D array) of real numbers, as float64; else TypeError
    naming ``name`` (a string, nested lists or bools are not a saved mean or scale)."""
    if isinstance(v, np.ndarray) and v.ndim == 1 and v.dtype.kind in "fiu":
        return v.astype(np.float64)
    if not isinstance(v, (list, tuple)) or not all(
            isinstance(x, numbers.Real) and not isinstance(x, (bool, np.bool_)) for x in v):
        raise TypeError(f"{name}: expected a list of numbers, got {v!r:.60}")
    return np.array(v, np.float64)


# A standard deviation below this fraction of the column's largest magnitude is rounding
# noise of the mean (float64 gives ~1e-17 * |x| for a constant column), not a spread.
_CONSTANT_RTOL = 1e-12


def _constant_columns(rows: np.ndarray, std: np.ndarray) -> np.ndarray:
    """Mask of the columns of ``rows`` (N, d) whose ``std`` is zero or rounding noise."""
    magnitude = np.max(np.abs(rows), axis=0)
    return std <= _CONSTANT_RTOL * magnitude


class Standardizer:
    """Per-feature standardisation ``(x - mean) / scale`` (the last axis), fit on the training
    set and applied unchanged to validation and new data. ``scale`` is the standard deviation
    (1 for a constant feature: one whose standard deviation is below 1e-12 of its largest
    magnitude, the rounding noise of a float64 mean). ``state_dict()`` is JSON-serialisable,
    so it can ride in a checkpoint's metadata: ``save(path, model,
    standardizer=s.state_dict())``, then
    ``Standardizer.from_state_dict(load(path, model)["standardizer"])``."""

    def __init__(self):
        self.mean = None   # (d,) float64
        self.scale = None  # (d,) float64

    def fit(self, X) -> "Standardizer":
        if not isinstance(X, np.ndarray) or X.ndim < 2 or X.shape[0] == 0 or X.shape[-1] == 0:
            raise ValueError(f"X: expected an array (N, d) with N, d >= 1, got "
                             f"{getattr(X, 'shape', type(X).__name__)}")
        rows = np.asarray(X, np.float64).reshape(-1, X.shape[-1])
        with np.errstate(over="ignore", invalid="ignore"):
            mean = rows.mean(axis=0)
            std = rows.std(axis=0)
        if not np.all(np.isfinite(rows)):
            raise ValueError("X: holds non-finite values")
        if not (np.all(np.isfinite(mean)) and np.all(np.isfinite(std))):
            raise ValueError("X: its mean or standard deviation overflows float64 (values "
                             "near 1e308); rescale the data first")
        std[_constant_columns(rows, std)] = 1.0  # a constant feature maps to 0, not to NaN
        self.mean, self.scale = mean, std
        return self

    def _check(self, X, name: str):
        if self.mean is None:
            raise RuntimeError("Standardizer: call fit(X_train) first")
        if not isinstance(X, np.ndarray):
            raise TypeError(f"{name}: expected a numpy.ndarray, got {type(X).__name__}")
        if X.dtype not in (np.float32, np.float64):
            raise TypeError(f"{name}: expected float32 or float64, got {X.dtype}")
        if X.ndim < 2 or X.shape[-1] != self.mean.shape[0]:
            raise ValueError(f"{name}: expected {self.mean.shape[0]} features in the last axis "
                             f"(as fitted), got shape {X.shape}")

    def transform(self, X) -> np.ndarray:
        """A new array ``(X - mean) / scale`` of ``X``'s dtype."""
        self._check(X, "X")
        return np.ascontiguousarray((X - self.mean) / self.scale, dtype=X.dtype)

    def inverse_transform(self, Z) -> np.ndarray:
        """A new array ``Z * scale + mean`` of ``Z``'s dtype."""
        self._check(Z, "Z")
        return np.ascontiguousarray(Z * self.scale + self.mean, dtype=Z.dtype)

    def fit_transform(self, X) -> np.ndarray:
        return self.fit(X).transform(X)

    def state_dict(self) -> dict:
        if self.mean is None:
            raise RuntimeError("Standardizer: call fit(X_train) first")
        return {"mean": self.mean.tolist(), "scale": self.scale.tolist()}

    @classmethod
    def from_state_dict(cls, state) -> "Standardizer":
        if not isinstance(state, dict) or set(state) != {"mean", "scale"}:
            raise ValueError(f"state: expected a dict with 'mean' and 'scale', got {state!r:.80}")
        mean, scale = (_numbers(f"state[{k!r}]", state[k]) for k in ("mean", "scale"))
        if mean.ndim != 1 or mean.shape != scale.shape or mean.size == 0:
            raise ValueError(f"state: 'mean' and 'scale' must be lists of one length, got "
                             f"{mean.shape} and {scale.shape}")
        if not (np.all(np.isfinite(mean)) and np.all(np.isfinite(scale)) and np.all(scale > 0)):
            raise ValueError("state: 'mean' must be finite and 'scale' finite and > 0")
        s = cls()
        s.mean, s.scale = mean, scale
        return s

    def __repr__(self) -> str:
        d = "not fitted" if self.mean is None else f"{self.mean.shape[0]} features"
        return f"Standardizer({d})"

"""Your own data: ``load`` of ``.npz`` and ``.csv`` files as ``(X, Y)`` and ``load_inputs``
for prediction. Arrays come back C-contiguous of the requested float dtype; an integer
target column is int64 labels. Every problem with a file is a ValueError naming it."""
from __future__ import annotations

import math
import os
import zipfile

import numpy as np

from ..nn.module import check_dtype
from .csv_reader import read_csv
from .entry import cast_real

__all__ = ["load", "load_inputs"]

_INT64 = np.iinfo(np.int64)


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
    _not_a_directory(path)
    xs, ys = _names("x", x), _names("y", y)
    low = path.lower()
    if low.endswith(".npz"):
        return _load_npz(path, xs, ys, dt)
    if low.endswith(".csv"):
        return read_csv(path, xs, ys, dt, delimiter)
    raise ValueError(f"path: expected a .npz or .csv file, got {path!r}")


def _not_a_directory(path) -> None:
    if os.path.isdir(path):
        raise ValueError(f"path: {path!r} is a directory, not a data file (.csv or .npz)")


def load_inputs(path, x=None, dtype=np.float32, delimiter=None) -> np.ndarray:
    """The inputs alone of a file ``load`` reads, for prediction: the ``x`` columns of a CSV
    (default: all) or the ``x`` array of an .npz (default "x"), as ``(N, d)`` of ``dtype``,
    with ``load``'s checks and messages; no target is needed."""
    dt = check_dtype(dtype)
    try:
        path = os.fspath(path)
    except TypeError:
        raise TypeError(f"path: expected a str or os.PathLike, got {type(path).__name__}") from None
    _not_a_directory(path)
    xs = _names("x", x)
    low = path.lower()
    if low.endswith(".csv"):
        return read_csv(path, xs, [], dt, delimiter)[0]
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
    return cast_real(f"{path}: array {xname!r}", X.reshape(-1, 1) if X.ndim == 1 else X, dt,
                     "use dtype=float64")


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
    X = cast_real(f"{path}: array {xname!r}", X.reshape(-1, 1) if X.ndim == 1 else X, dt,
                  "use dtype=float64")
    if Y.ndim == 1 and np.issubdtype(Y.dtype, np.integer):
        if Y.size and Y.dtype.kind == "u" and Y.max() > _INT64.max:  # labels never wrap
            at = int(np.argmax(Y > _INT64.max))
            raise ValueError(f"{path}: array {yname!r}: the label {int(Y[at])} at index {at} "
                             f"does not fit int64")
        return X, np.ascontiguousarray(Y, dtype=np.int64)
    Y = cast_real(f"{path}: array {yname!r}", Y.reshape(-1, 1) if Y.ndim == 1 else Y, dt,
                  "use dtype=float64")
    return X, Y


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

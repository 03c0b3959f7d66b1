"""Reading a checkpoint's ``.npz`` archive defensively: every member is checked (names,
compression, declared sizes against the bytes stored, CRC-32) before its data is read."""
from __future__ import annotations

import math
import zipfile

import numpy as np

from .checkpoint_format import HEADER, OPTIM, PARAM, TRAIN, CheckpointError

__all__ = ["read_npz"]


# Largest uncompressed/compressed ratio deflate can reach (RFC 1951 blocks): a member that
# declares more is lying about its size.
_DEFLATE_MAX_RATIO = 1032


def read_npz(path: str, f, size: int) -> dict:
    """Every member of the .npz archive open as ``f`` (``size`` bytes) as an array. Checks,
    before reading a member's data: no duplicate or foreign names, no encryption, a known
    compression, stored sizes inside the file, a declared shape and dtype whose size is
    exactly the bytes the member holds; then the member's CRC-32."""
    with zipfile.ZipFile(f) as z:
        infos = z.infolist()
        seen = set()
        for info in infos:
            name = info.filename
            if name in seen:  # numpy would silently keep the last of the two
                raise CheckpointError(f"{path}: corrupt checkpoint (member {name!r} appears "
                                      f"twice)")
            seen.add(name)
            if not name.endswith(".npy") or not (name.startswith((PARAM, OPTIM, TRAIN))
                                                 or name == HEADER + ".npy"):
                raise CheckpointError(f"{path}: not a blasnet checkpoint (unexpected member "
                                      f"{name!r})")
            if info.flag_bits & 0x1:
                raise CheckpointError(f"{path}: corrupt checkpoint (member {name!r} is marked "
                                      f"encrypted)")
            if info.compress_type not in (zipfile.ZIP_STORED, zipfile.ZIP_DEFLATED):
                raise CheckpointError(f"{path}: corrupt checkpoint (member {name!r}: unknown "
                                      f"compression method {info.compress_type})")
            ratio = 1 if info.compress_type == zipfile.ZIP_STORED else _DEFLATE_MAX_RATIO
            if (info.header_offset + info.compress_size > size
                    or info.file_size > ratio * info.compress_size + 64):
                raise CheckpointError(f"{path}: truncated or corrupt checkpoint (member "
                                      f"{name!r} declares {info.file_size} bytes in "
                                      f"{info.compress_size}; the file has {size})")
        arrays = {}
        for info in infos:
            with z.open(info) as m:
                arrays[info.filename[:-4]] = _read_npy(path, info, m)
    return arrays


def _read_npy(path: str, info, m) -> np.ndarray:
    """The array in the .npy member ``m``: its header's shape and dtype must account for
    exactly the member's bytes (so nothing larger than the file is allocated)."""
    name = info.filename
    version = np.lib.format.read_magic(m)
    if version == (1, 0):
        shape, fortran, dtype = np.lib.format.read_array_header_1_0(m)
    elif version == (2, 0):
        shape, fortran, dtype = np.lib.format.read_array_header_2_0(m)
    else:
        raise CheckpointError(f"{path}: corrupt checkpoint (member {name!r}: .npy version "
                              f"{version})")
    if dtype.hasobject or not isinstance(shape, tuple) or \
            not all(isinstance(d, int) and d >= 0 for d in shape):
        raise CheckpointError(f"{path}: corrupt checkpoint (member {name!r}: shape {shape}, "
                              f"dtype {dtype})")
    nbytes = math.prod(shape) * dtype.itemsize
    if nbytes != info.file_size - m.tell():
        raise CheckpointError(f"{path}: corrupt checkpoint (member {name!r} declares shape "
                              f"{shape} of {dtype}, {nbytes} bytes, and holds "
                              f"{info.file_size - m.tell()})")
    data = m.read(nbytes)
    if len(data) != nbytes or m.read(1):  # reading to the end checks the CRC-32
        raise CheckpointError(f"{path}: truncated checkpoint (member {name!r})")
    a = np.frombuffer(data, dtype)
    return a.reshape(shape[::-1]).T if fortran else a.reshape(shape)

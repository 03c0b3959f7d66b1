"""What every checkpoint file shares: the format's name and version, the names of its
entries, its error type, and the helpers both file layouts (.npz and .safetensors) use."""
from __future__ import annotations

import json
import zlib

import numpy as np

__all__ = ["FORMAT", "FORMAT_VERSION", "HEADER", "PARAM", "OPTIM", "TRAIN", "SAFETENSORS",
           "CheckpointError", "json_field", "crc32", "safetensors_numpy"]

FORMAT = "blasnet-checkpoint"
FORMAT_VERSION = 1
HEADER = "__header__"     # 0-d unicode array holding the JSON header
PARAM = "param/"          # param/<dotted name>
OPTIM = "optim/"          # optim/<parameter index>/<buffer name>
TRAIN = "train/"          # train/<i>: the arrays of a run's resumable state (fit)
SAFETENSORS = ".safetensors"


class CheckpointError(ValueError):
    """The file is not a readable blasnet checkpoint, or does not fit the model/optimizer."""


def json_field(path: str, what: str, text, kind):
    """``text`` parsed as JSON, which must give a ``kind``; else CheckpointError."""
    try:
        value = json.loads(text)
    except (ValueError, TypeError) as e:
        raise CheckpointError(f"{path}: corrupt checkpoint {what} ({e})") from None
    if not isinstance(value, kind):
        raise CheckpointError(f"{path}: corrupt checkpoint {what} (expected a JSON "
                              f"{'object' if kind is dict else kind.__name__}, got "
                              f"{type(value).__name__})")
    return value


def crc32(a: np.ndarray) -> int:
    """CRC-32 of an array's bytes in C order."""
    return zlib.crc32(memoryview(np.ascontiguousarray(a)).cast("B"))


def safetensors_numpy():
    try:
        import safetensors.numpy as st
    except ImportError:
        raise ImportError("reading and writing .safetensors files needs the safetensors "
                          "package: pip install 'blasnet[interop]'") from None
    return st

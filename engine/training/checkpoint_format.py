"""What every checkpoint file shares: the format's name and version, the names of its
entries, its error type, and the helpers both file layouts (.npz and .safetensors) use."""
from __future__ import annotations

import json
import zlib

import numpy as np

__all__ = ["FORMAT", "FORMAT_VERSION", "HEADER", "PARAM", "OPTIM", "TRAIN", "SAFETENSORS",
           "CheckpointError", "json_field", "json_depth", "MAX_JSON_DEPTH", "crc32",
           "safetensors_numpy"]

FORMAT = "blasnet-checkpoint"
FORMAT_VERSION = 1
HEADER = "__header__"     # 0-d unicode array holding the JSON header
PARAM = "param/"          # param/<dotted name>
OPTIM = "optim/"          # optim/<parameter index>/<buffer name>
TRAIN = "train/"          # train/<i>: the arrays of a run's resumable state (fit)
SAFETENSORS = ".safetensors"

# Deepest nesting of lists and objects a checkpoint's JSON may hold: a header written by
# blasnet nests a few levels per module; thousands would only exhaust the stack of whatever
# walks it next (the configuration's rebuild, inspect's printing).
MAX_JSON_DEPTH = 100


class CheckpointError(ValueError):
    """The file is not a readable blasnet checkpoint, or does not fit the model/optimizer."""


def json_field(path: str, what: str, text, kind):
    """``text`` parsed as JSON, which must give a ``kind``; else CheckpointError."""
    try:
        value = json.loads(text)
    except (ValueError, TypeError) as e:
        raise CheckpointError(f"{path}: corrupt checkpoint {what} ({e})") from None
    except RecursionError:  # past the parser's own limit: deeper still
        deep = True
    else:
        deep = json_depth(value) > MAX_JSON_DEPTH
    if deep:
        raise CheckpointError(f"{path}: corrupt checkpoint {what} (nested deeper than "
                              f"{MAX_JSON_DEPTH} levels)")
    if not isinstance(value, kind):
        raise CheckpointError(f"{path}: corrupt checkpoint {what} (expected a JSON "
                              f"{'object' if kind is dict else kind.__name__}, got "
                              f"{type(value).__name__})")
    return value


def json_depth(value) -> int:
    """How deeply lists and dicts nest in ``value`` (0 for a scalar), without recursion."""
    deepest, stack = 0, [(value, 0)]
    while stack:
        v, d = stack.pop()
        if isinstance(v, (list, dict)):
            deepest = max(deepest, d + 1)
            stack.extend((x, d + 1) for x in (v.values() if isinstance(v, dict) else v))
    return deepest


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

"""The ``.safetensors`` layout of a checkpoint (the ``safetensors`` package's format,
optional extra ``interop``): the parameters and the metadata, with blasnet's CRC-32 of each
tensor and of the whole header, so every byte is covered. A file from another tool has no
checksums and is read as it is."""
from __future__ import annotations

import json
import zlib

import numpy as np

from .atomic_file import atomic_write
from .checkpoint_format import (FORMAT, FORMAT_VERSION, PARAM, CheckpointError, crc32,
                                json_field, safetensors_numpy)

__all__ = ["write_safetensors", "read_safetensors", "is_safetensors", "torch_layout",
           "from_torch_layout"]


def torch_layout(model):
    """The model's parameters under PyTorch's names and layouts (``engine.interop``), or
    None when a module of it has no PyTorch reference module."""
    from ..interop import to_torch_state_dict
    try:
        return dict(to_torch_state_dict(model))
    except TypeError:  # a module without a PyTorch mapping (GMLP, a user's module)
        return None


def write_safetensors(path: str, model, meta_json: str, config: dict) -> None:
    """The parameters under PyTorch's names and layouts when every module of the model has a
    PyTorch reference module (so ``torch.nn.Module.load_state_dict(safetensors.torch.
    load_file(path))`` works), else under blasnet's."""
    st = safetensors_numpy()
    tensors = torch_layout(model)
    layout = "pytorch" if tensors is not None else "blasnet"
    if tensors is None:
        tensors = {name: np.ascontiguousarray(p.data) for name, p in model.named_parameters()}
    # safetensors metadata is str -> str: the user's metadata goes in as one JSON string;
    # the format has no checksum of its own, so each tensor's CRC-32 goes in beside it, and
    # the CRC-32 of the length prefix and the whole header (metadata and tensor offsets
    # included) in a fixed-width field filled in after serialising.
    header = {"format": FORMAT, "version": str(FORMAT_VERSION), "model": type(model).__name__,
              "metadata": meta_json, "layout": layout,
              "crc32": json.dumps({k: crc32(v) for k, v in tensors.items()}),
              **{k: json.dumps(v) for k, v in config.items()},
              _HEADER_CRC: _CRC_PLACEHOLDER}
    data = bytearray(st.save(tensors, metadata=header))
    end = 8 + int.from_bytes(data[:8], "little")
    at = _header_crc_span(bytes(data[:end]), _CRC_PLACEHOLDER)
    data[at:at + 8] = f"{zlib.crc32(data[:end]):08x}".encode()
    atomic_write(path, lambda f: f.write(data))


# The key of the header checksum; it names blasnet, so a blasnet file holds "blasnet" twice
# (here and in the format) and no single flipped bit makes it look like a foreign file.
_HEADER_CRC = "blasnet_header_crc32"


_CRC_PLACEHOLDER = "00000000"


# The metadata keys of files written before the header checksum (read as they were).
_LEGACY_KEYS = {"format", "version", "model", "metadata", "crc32"}


_MARKS = (FORMAT.encode(), _HEADER_CRC.encode())  # either one says "written by blasnet"


def _header_crc_span(raw: bytes, value: str) -> int:
    """Offset in ``raw`` (length prefix + header) of the 8 characters of the header checksum
    field holding ``value``; -1 unless it appears exactly once."""
    field = f'"{_HEADER_CRC}":"{value}"'.encode()
    at = raw.find(field)
    if at < 0 or raw.find(field, at + 1) >= 0:
        return -1
    return at + len(field) - 9


def _check_header_crc(path: str, raw: bytes, value) -> None:
    """The CRC-32 of ``raw`` (length prefix + header) with the checksum field reset to its
    placeholder must be ``value``; else CheckpointError."""
    at = -1
    if isinstance(value, str) and len(value) == 8:
        at = _header_crc_span(raw, value)
    if at < 0:
        raise CheckpointError(f"{path}: corrupt safetensors file (its header checksum field "
                              f"is damaged)")
    crc = zlib.crc32(raw[:at] + _CRC_PLACEHOLDER.encode() + raw[at + 8:])
    if f"{crc:08x}" != value:
        raise CheckpointError(f"{path}: corrupt safetensors file (its header, with the "
                              f"metadata, fails its CRC-32 check)")


# ----------------------------------------------------------------------------- load
def is_safetensors(head: bytes, size: int) -> bool:
    # The format: a little-endian u64 header length, then the JSON header ("{...").
    if len(head) < 9 or head[8:9] != b"{":
        return False
    n = int.from_bytes(head[:8], "little")
    return 2 <= n <= size - 8


def read_safetensors(path: str):
    """A safetensors file as ``(header, arrays)`` in the shape ``_read`` gives for .npz.

    A file blasnet wrote (its header names blasnet anywhere) must pass every check: the
    header checksum, then each tensor's; one written before the header checksum must have
    exactly that older layout. A file from another tool (no blasnet metadata) has no
    checksums: it only needs to parse and fit the model."""
    safetensors_numpy()  # the install hint if the package is missing
    from safetensors import safe_open
    with open(path, "rb") as f:
        prefix = f.read(8)
        raw = prefix + f.read(int.from_bytes(prefix, "little"))  # _read checked it fits
    try:
        # The package checks every tensor's offsets against the file before reading it.
        with safe_open(path, framework="numpy") as f:
            meta = f.metadata() or {}
            arrays = {PARAM + k: f.get_tensor(k) for k in f.keys()}
    except Exception as e:  # the package's own error types differ between versions
        raise CheckpointError(f"{path}: truncated or corrupt safetensors file "
                              f"({type(e).__name__}: {e})") from None
    header = {"model": meta.get("model", "a safetensors file"), "optimizer": None,
              "metadata": {}, "safetensors": True}
    if not any(m in raw for m in _MARKS) and "format" not in meta:
        return header, arrays  # another tool's file: nothing to check it against
    if _HEADER_CRC in meta:
        _check_header_crc(path, raw, meta[_HEADER_CRC])
    elif not set(meta) <= _LEGACY_KEYS or "format" not in meta:
        raise CheckpointError(f"{path}: corrupt safetensors file (blasnet metadata without "
                              f"its header checksum; keys {sorted(meta)})")
    if meta["format"] != FORMAT:
        raise CheckpointError(f"{path}: not a blasnet checkpoint (header format "
                              f"{meta['format']!r})")
    version = meta.get("version", "")
    if not (version.isascii() and version.isdigit()) or not 1 <= int(version) <= FORMAT_VERSION:
        raise CheckpointError(f"{path}: checkpoint format version {version!r}; this "
                              f"blasnet reads versions 1 to {FORMAT_VERSION}")
    header["metadata"] = json_field(path, "metadata", meta.get("metadata", "{}"), dict)
    for key in ("model_config", "model_config_error"):
        if key in meta:
            header[key] = json_field(path, key, meta[key], dict if key == "model_config" else str)
    if "crc32" in meta or _HEADER_CRC in meta:
        crcs = json_field(path, "crc32", meta.get("crc32"), dict)
        names = {k[len(PARAM):] for k in arrays}
        if set(crcs) != names:
            raise CheckpointError(f"{path}: corrupt safetensors file (its checksums name "
                                  f"{sorted(crcs)}, its tensors {sorted(names)})")
        for name in sorted(names):
            if crcs[name] != crc32(arrays[PARAM + name]):
                raise CheckpointError(f"{path}: corrupt safetensors file (tensor {name} "
                                      f"fails its CRC-32 check)")
    return header, arrays


def from_torch_layout(path: str, model, params: dict) -> dict:
    """``params`` (stored name -> array) under blasnet's names and layouts when they are
    exactly the model's PyTorch names (a file in PyTorch's layout), else ``params`` as they
    are. A tied weight stored under two names must hold the same values in both."""
    from ..interop import torch_names
    if set(params) == {n for n, _ in model.named_parameters()}:
        return params
    try:
        names = torch_names(model)
    except TypeError:
        return params
    if set(params) != {t for t, _, _ in names}:
        return params
    out, source = {}, {}
    for tkey, bname, transposed in names:
        v = params[tkey]
        a = np.ascontiguousarray(v.T) if transposed and v.ndim == 2 else v
        if bname in out and not (out[bname].shape == a.shape and np.array_equal(out[bname], a)):
            raise CheckpointError(f"{path}: {tkey} and {source[bname]} are one tied weight "
                                  f"({bname}) of {type(model).__name__} but differ in the file")
        out[bname], source[bname] = a, tkey
    return out

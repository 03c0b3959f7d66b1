"""Checkpoints: a model's parameters, an optimizer's state and step count, a learning-rate
scheduler's state, and user metadata in one ``.npz`` file; or the parameters and metadata
alone in a ``.safetensors`` file (the ``safetensors`` package's format, optional extra
``interop``), which other frameworks read.

The write is atomic (a temporary file in the same directory, fsync, then ``os.replace``), and
loading checks everything before it changes anything: on any error the model, the optimizer
and the scheduler are left as they were. A damaged file (flipped bits, a truncation, a
header declaring more data than the file holds) is a ``CheckpointError``, found before any
large allocation: every array's declared size is checked against the bytes stored for it,
and its CRC-32 (the zip member's for ``.npz``, one per tensor in the metadata of the
``.safetensors`` files blasnet writes) against its contents. A ``.safetensors`` file blasnet
writes also carries the CRC-32 of its length prefix and whole header (the metadata
included), so every byte is covered; a file written by another tool has no checksums and
is read as it is.
"""
from __future__ import annotations

import json
import math
import os
import tempfile
import zipfile
import zlib

import numpy as np

from .atomic_file import atomic_write, check_target, file_path, fspath, writable_target

__all__ = ["save", "load", "read_header", "check_target", "save_or_rescue", "SaveError",
           "CheckpointError", "FORMAT_VERSION"]

FORMAT = "blasnet-checkpoint"
FORMAT_VERSION = 1
_HEADER = "__header__"     # 0-d unicode array holding the JSON header
_PARAM = "param/"          # param/<dotted name>
_OPTIM = "optim/"          # optim/<parameter index>/<buffer name>
SAFETENSORS = ".safetensors"


class CheckpointError(ValueError):
    """The file is not a readable blasnet checkpoint, or does not fit the model/optimizer."""


def _safetensors_numpy():
    try:
        import safetensors.numpy as st
    except ImportError:
        raise ImportError("reading and writing .safetensors files needs the safetensors "
                          "package: pip install 'blasnet[interop]'") from None
    return st


# ----------------------------------------------------------------------------- save
def save(path, model, /, optimizer=None, scheduler=None, **metadata) -> None:
    """Write ``model``'s parameters and constructor configuration (and ``optimizer``'s and
    ``scheduler``'s state, if given) to ``path``: the arguments of ``load``, in its order.

    ``metadata`` (JSON-serialisable keyword arguments, e.g. ``epoch=10``; ``optimizer`` and
    ``scheduler`` are the reserved names) is stored and returned by ``load``. The
    configuration (``model.get_config()``, recursively) lets ``engine.load_model`` rebuild
    the model alone; a model that cannot describe itself is saved without it, and the
    reason is kept for ``load_model`` to report. A path ending in ``.safetensors``
    gets a safetensors file with the parameters (blasnet's names and layouts) and the
    metadata in its header; only ``.npz`` holds optimizer and scheduler state. The file
    appears under ``path`` only once it is complete; a failure part-way leaves any previous
    file there untouched.
    """
    path = file_path(path)
    _check_model(model)
    if optimizer is not None:
        _check_optimizer(optimizer, model, saving=True)
    try:
        meta_json = json.dumps(metadata, allow_nan=True)
    except (TypeError, ValueError) as e:
        raise TypeError(f"metadata: every value must be JSON-serialisable ({e})") from None
    sched = None
    if scheduler is not None:
        if not callable(getattr(scheduler, "state_dict", None)):
            raise TypeError(f"scheduler: expected a learning-rate scheduler, got "
                            f"{type(scheduler).__name__}")
        sched = scheduler.state_dict()
    target = writable_target(path)  # the format follows the name given, not a link's target
    if path.lower().endswith(SAFETENSORS):
        if optimizer is not None or scheduler is not None:
            raise ValueError(f"{path}: a .safetensors checkpoint holds parameters only; save the "
                             f"optimizer and scheduler state to an .npz file")
        _save_safetensors(target, model, meta_json, _config_fields(model))
        return
    arrays = {}
    params = {}
    for name, p in model.named_parameters():
        arrays[_PARAM + name] = p.data
        params[name] = [list(p.data.shape), str(p.data.dtype)]
    optim = None
    if optimizer is not None:
        sd = optimizer.state_dict()
        for idx, st in sd["state"].items():
            for key, value in st.items():
                arrays[f"{_OPTIM}{idx}/{key}"] = value
        optim = {k: v for k, v in sd.items() if k != "state"}
    header = {"format": FORMAT, "version": FORMAT_VERSION, "model": type(model).__name__,
              "params": params, "optimizer": optim, "metadata": json.loads(meta_json),
              **_config_fields(model)}
    if optimizer is not None and optim is not None:
        order = _optimizer_order(optimizer, model)
        if order is not None:
            header["optimizer_params"] = order
    if sched is not None:
        header["scheduler"] = sched
    arrays[_HEADER] = np.array(json.dumps(header))
    atomic_write(target, lambda f: np.savez(f, **arrays))


class SaveError(OSError):
    """``save_or_rescue`` could not write the file asked for; ``rescued`` is where the model
    went instead (None if that failed too)."""

    def __init__(self, message: str, rescued):
        super().__init__(message)
        self.rescued = rescued


def save_or_rescue(path, model, /, optimizer=None, scheduler=None, **metadata) -> None:
    """``save``; if writing fails (a full disk, a directory made read-only during the run),
    save the same checkpoint to a new file in the temporary directory instead and raise
    ``SaveError`` naming both: a run's end never loses the trained model."""
    try:
        save(path, model, optimizer, scheduler, **metadata)
        return
    except OSError as e:
        reason = e.strerror or str(e)
    suffix = SAFETENSORS if fspath(path).lower().endswith(SAFETENSORS) else ".npz"
    rescued = None
    try:
        fd, rescued = tempfile.mkstemp(prefix="blasnet-rescued-", suffix=suffix)
        os.close(fd)
        save(rescued, model, optimizer, scheduler, **metadata)
        where = f"the model was saved to {rescued} instead"
    except OSError as e2:
        where = f"saving it to {rescued} failed too ({e2.strerror or e2})"
        rescued = None
    raise SaveError(f"{fspath(path)}: could not save the checkpoint ({reason}); {where}",
                    rescued)


def _config_fields(model) -> dict:
    """``{"model_config": node}``, or ``{"model_config_error": why}`` for a model that
    cannot describe itself (saving it still works; rebuilding it alone does not)."""
    from ..models.config import ConfigError, to_config
    try:
        return {"model_config": to_config(model)}
    except ConfigError as e:
        return {"model_config_error": str(e)}


def _optimizer_order(optimizer, model):
    """The names of ``model``'s parameters in the optimizer's state order (its groups'
    order), which ``load_model`` needs to rebuild the groups; None when unknown."""
    names = {id(p): n for n, p in model.named_parameters()}
    groups = getattr(optimizer, "param_groups", None)
    if groups is None:
        return None
    order = [names.get(id(p)) for g in groups for p in g["params"]]
    return None if None in order else order


def _save_safetensors(path: str, model, meta_json: str, config: dict) -> None:
    st = _safetensors_numpy()
    tensors = {name: np.ascontiguousarray(p.data) for name, p in model.named_parameters()}
    # safetensors metadata is str -> str: the user's metadata goes in as one JSON string;
    # the format has no checksum of its own, so each tensor's CRC-32 goes in beside it, and
    # the CRC-32 of the length prefix and the whole header (metadata and tensor offsets
    # included) in a fixed-width field filled in after serialising.
    header = {"format": FORMAT, "version": str(FORMAT_VERSION), "model": type(model).__name__,
              "metadata": meta_json,
              "crc32": json.dumps({k: _crc32(v) for k, v in tensors.items()}),
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


def _crc32(a: np.ndarray) -> int:
    """CRC-32 of an array's bytes in C order."""
    return zlib.crc32(memoryview(np.ascontiguousarray(a)).cast("B"))


# ----------------------------------------------------------------------------- checks
def _check_model(model) -> None:
    from ..nn.module import Module
    if not isinstance(model, Module):
        raise TypeError(f"model: expected an engine Module (a layer, block or model), got "
                        f"{type(model).__name__}")


def _check_optimizer(optimizer, model, saving: bool) -> None:
    """``optimizer`` must be an engine optimizer, and when saving, one of ``model``'s
    parameters (``save`` also takes any object with ``state_dict()``, e.g. a state gathered
    beforehand)."""
    from ..optim.optimizers import Optimizer, check_optimizer_of
    if isinstance(optimizer, Optimizer):
        if saving:
            check_optimizer_of(optimizer, model)
    elif not saving or not callable(getattr(optimizer, "state_dict", None)):
        raise TypeError(f"optimizer: expected an engine optimizer (AdamW, SGD), got "
                        f"{type(optimizer).__name__}")


# ----------------------------------------------------------------------------- load
def _is_safetensors(head: bytes, size: int) -> bool:
    # The format: a little-endian u64 header length, then the JSON header ("{...").
    if len(head) < 9 or head[8:9] != b"{":
        return False
    n = int.from_bytes(head[:8], "little")
    return 2 <= n <= size - 8


def _read_safetensors(path: str):
    """A safetensors file as ``(header, arrays)`` in the shape ``_read`` gives for .npz.

    A file blasnet wrote (its header names blasnet anywhere) must pass every check: the
    header checksum, then each tensor's; one written before the header checksum must have
    exactly that older layout. A file from another tool (no blasnet metadata) has no
    checksums: it only needs to parse and fit the model."""
    _safetensors_numpy()  # the install hint if the package is missing
    from safetensors import safe_open
    with open(path, "rb") as f:
        prefix = f.read(8)
        raw = prefix + f.read(int.from_bytes(prefix, "little"))  # _read checked it fits
    try:
        # The package checks every tensor's offsets against the file before reading it.
        with safe_open(path, framework="numpy") as f:
            meta = f.metadata() or {}
            arrays = {_PARAM + k: f.get_tensor(k) for k in f.keys()}
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
    header["metadata"] = _json_field(path, "metadata", meta.get("metadata", "{}"), dict)
    for key in ("model_config", "model_config_error"):
        if key in meta:
            header[key] = _json_field(path, key, meta[key], dict if key == "model_config" else str)
    if "crc32" in meta or _HEADER_CRC in meta:
        crcs = _json_field(path, "crc32", meta.get("crc32"), dict)
        names = {k[len(_PARAM):] for k in arrays}
        if set(crcs) != names:
            raise CheckpointError(f"{path}: corrupt safetensors file (its checksums name "
                                  f"{sorted(crcs)}, its tensors {sorted(names)})")
        for name in sorted(names):
            if crcs[name] != _crc32(arrays[_PARAM + name]):
                raise CheckpointError(f"{path}: corrupt safetensors file (tensor {name} "
                                      f"fails its CRC-32 check)")
    return header, arrays


def _json_field(path: str, what: str, text, kind):
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


# Largest uncompressed/compressed ratio deflate can reach (RFC 1951 blocks): a member that
# declares more is lying about its size.
_DEFLATE_MAX_RATIO = 1032


def _read_npz(path: str, f, size: int) -> dict:
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
            if not name.endswith(".npy") or not (name.startswith((_PARAM, _OPTIM))
                                                 or name == _HEADER + ".npy"):
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


def _read(path: str):
    """All arrays of the checkpoint at ``path`` and its header, read eagerly."""
    try:
        f = open(path, "rb")
    except IsADirectoryError:
        raise CheckpointError(f"{path}: is a directory, not a checkpoint file") from None
    with f:
        magic = f.read(9)
        size = os.fstat(f.fileno()).st_size
        if magic[:4] != b"PK\x03\x04" and _is_safetensors(magic, size):
            kind = SAFETENSORS
        elif magic[:4] != b"PK\x03\x04":
            raise CheckpointError(f"{path}: not a blasnet checkpoint (not an .npz archive"
                                  + (")" if path.lower().endswith(".npz") else
                                     " nor a safetensors file)"))
        else:
            kind = ".npz"
            f.seek(0)
            try:
                arrays = _read_npz(path, f, size)
            except CheckpointError:
                raise
            except Exception as e:  # zipfile and numpy raise a dozen types on damaged input
                raise CheckpointError(f"{path}: truncated or corrupt checkpoint "
                                      f"({type(e).__name__}: {e})") from None
    if kind == SAFETENSORS:
        return _read_safetensors(path)
    if _HEADER not in arrays:
        raise CheckpointError(f"{path}: not a blasnet checkpoint (no {_HEADER} entry)")
    h = arrays.pop(_HEADER)
    if h.shape != () or h.dtype.kind != "U":
        raise CheckpointError(f"{path}: corrupt checkpoint header (a {h.dtype} array of "
                              f"shape {h.shape})")
    header = _json_field(path, "header", str(h[()]), dict)
    if header.get("format") != FORMAT:
        raise CheckpointError(f"{path}: not a blasnet checkpoint (header format "
                              f"{header.get('format')!r})")
    version = header.get("version")
    if type(version) is not int or not 1 <= version <= FORMAT_VERSION:  # bool is no version
        raise CheckpointError(f"{path}: checkpoint format version {version!r}; this blasnet reads "
                              f"versions 1 to {FORMAT_VERSION}")
    _check_header(path, header, arrays)
    return header, arrays


def _check_header(path: str, header: dict, arrays: dict) -> None:
    """The header's fields have their types, and its parameter list matches the arrays."""
    for key, kinds in (("metadata", (dict,)), ("optimizer", (dict, type(None))),
                       ("scheduler", (dict, type(None))), ("params", (dict,)),
                       ("model_config", (dict,)), ("model_config_error", (str,)),
                       ("optimizer_params", (list,))):
        if key in header and not isinstance(header[key], kinds):
            raise CheckpointError(f"{path}: corrupt checkpoint header ({key!r} is a "
                                  f"{type(header[key]).__name__})")
    header.setdefault("metadata", {})
    declared = header.get("params")
    if declared is None:
        return
    stored = {k[len(_PARAM):]: v for k, v in arrays.items() if k.startswith(_PARAM)}
    if set(declared) != set(stored):
        raise CheckpointError(f"{path}: corrupt checkpoint (the header lists parameters "
                              f"{sorted(declared)}, the file holds {sorted(stored)})")
    for name, v in stored.items():
        if declared[name] != [list(v.shape), str(v.dtype)]:
            raise CheckpointError(f"{path}: corrupt checkpoint (parameter {name}: the header "
                                  f"says {declared[name]}, the array is {list(v.shape)} "
                                  f"{v.dtype})")


def read_header(path) -> dict:
    """What the checkpoint at ``path`` holds, checked as ``load`` checks it, without a model:
    ``model`` (the class name), ``model_config`` (or ``model_config_error``), ``params``
    (``{name: (shape, dtype)}``), ``optimizer`` and ``scheduler`` (their saved options, or
    None), ``optimizer_params``, ``metadata`` and ``format`` (".npz" or ".safetensors")."""
    path = fspath(path)
    header, arrays = _read(path)
    out = {k: header.get(k) for k in ("model", "model_config", "model_config_error",
                                      "optimizer", "scheduler", "optimizer_params")}
    out["metadata"] = header.get("metadata", {})
    out["params"] = {k[len(_PARAM):]: (tuple(v.shape), str(v.dtype))
                     for k, v in arrays.items() if k.startswith(_PARAM)}
    out["format"] = SAFETENSORS if header.get("safetensors") else ".npz"
    return out


def _saved_part(path, header, what: str):
    """The header's ``what`` ("optimizer" or "scheduler") state, or CheckpointError saying why
    the file has none."""
    part = header.get(what)
    if part is None:
        why = ("a safetensors file holds parameters only" if header.get("safetensors")
               else f"it was saved without {'an' if what[0] in 'aeiou' else 'a'} {what}")
        raise CheckpointError(f"{path}: the checkpoint holds no {what} state ({why})")
    return part


def load(path, model, optimizer=None, scheduler=None) -> dict:
    """Load the checkpoint at ``path`` into ``model`` (and ``optimizer`` and ``scheduler``);
    return its metadata.

    Strict: the parameter names, shapes and dtypes must match the model's, and the optimizer
    and scheduler states must fit ``optimizer`` (same type and parameter groups) and
    ``scheduler`` (same type and hyperparameters). Any mismatch, a truncated file or a file
    that is not a checkpoint raises ``CheckpointError`` (a ValueError) and changes nothing.
    ``.npz`` and ``.safetensors`` files are told apart by their content; a safetensors file
    holds parameters only (with blasnet's names: for PyTorch's, see
    ``engine.load_torch_state_dict``).
    """
    path = fspath(path)
    _check_model(model)
    if optimizer is not None:
        _check_optimizer(optimizer, model, saving=False)
    if scheduler is not None and getattr(scheduler, "validate_state_dict", None) is None:
        raise TypeError(f"scheduler: expected a scheduler of engine.lr_scheduler, got "
                        f"{type(scheduler).__name__}")
    header, arrays = _read(path)
    params = _checked_parameters(path, header, arrays, model)
    checked = None if optimizer is None else _checked_optimizer(path, header, arrays, optimizer)
    sched_checked = None
    if scheduler is not None:
        sd = _saved_part(path, header, "scheduler")
        check = scheduler.validate_state_dict
        try:
            sched_checked = check(sd)
        except Exception as e:
            msg = e.args[0] if isinstance(e, KeyError) and e.args else e
            raise CheckpointError(f"{path}: the scheduler state does not fit "
                                  f"{type(scheduler).__name__}: {msg}") from None

    model.load_state_dict(params)  # checked above: cannot fail any more
    if checked is not None:
        optimizer.apply_state(checked)
    if sched_checked is not None:
        scheduler.apply_state(sched_checked)  # after the optimizer: it writes the groups' lr
    return header.get("metadata", {})


def _checked_parameters(path: str, header: dict, arrays: dict, model) -> dict:
    """The saved parameters by name, after checking all names, shapes and dtypes against
    the model (nothing is copied here)."""
    params = {k[len(_PARAM):]: v for k, v in arrays.items() if k.startswith(_PARAM)}
    named = model.named_parameters()
    own = [n for n, _ in named]
    missing = [n for n in own if n not in params]
    unexpected = [n for n in params if n not in set(own)]
    if missing or unexpected:
        raise CheckpointError(f"{path}: the checkpoint does not fit {type(model).__name__} "
                              f"(saved from {header.get('model')}): missing parameters {missing}, "
                              f"unexpected parameters {unexpected}")
    for n, p in named:
        v = params[n]
        if v.shape != p.data.shape:
            raise CheckpointError(f"{path}: parameter {n}: the model has shape {p.data.shape}, "
                                  f"the checkpoint {v.shape}")
        if v.dtype != p.data.dtype:
            raise CheckpointError(f"{path}: parameter {n}: the model has dtype {p.data.dtype}, "
                                  f"the checkpoint {v.dtype} (no silent casts)")
    return params


def _checked_optimizer(path: str, header: dict, arrays: dict, optimizer):
    """The optimizer state rebuilt from the file and checked by the optimizer itself (what
    its ``apply_state`` takes)."""
    optim = _saved_part(path, header, "optimizer")
    state: dict = {}
    for k, v in arrays.items():
        if k.startswith(_OPTIM):
            idx, _, key = k[len(_OPTIM):].partition("/")
            if not (idx.isascii() and idx.isdigit() and str(int(idx)) == idx) or not key:
                raise CheckpointError(f"{path}: corrupt optimizer entry {k!r}")
            state.setdefault(int(idx), {})[key] = v
    try:
        return optimizer.validate_state_dict({**optim, "state": state})
    except Exception as e:  # whatever an edited header holds, it is the file's fault
        msg = e.args[0] if isinstance(e, KeyError) and e.args else e
        raise CheckpointError(f"{path}: the optimizer state does not fit "
                              f"{type(optimizer).__name__}: {msg}") from None

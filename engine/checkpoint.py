"""Checkpoints: a model's parameters, an optimizer's state and step count, a learning-rate
scheduler's state, and user metadata in one ``.npz`` file; or the parameters and metadata
alone in a ``.safetensors`` file (the ``safetensors`` package's format, optional extra
``interop``), which other frameworks read.

The write is atomic (a temporary file in the same directory, fsync, then ``os.replace``), and
loading checks everything before it changes anything: on any error the model, the optimizer
and the scheduler are left as they were.
"""
from __future__ import annotations

import json
import os
import tempfile
import zipfile

import numpy as np

__all__ = ["save", "load", "CheckpointError", "FORMAT_VERSION"]

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
def save(path, model, optimizer=None, /, *, scheduler=None, **metadata) -> None:
    """Write ``model``'s parameters (and ``optimizer``'s and ``scheduler``'s state, if given)
    to ``path``.

    ``metadata`` (JSON-serialisable keyword arguments, e.g. ``epoch=10``; ``scheduler`` is the
    one reserved name) is stored and returned by ``load``. A path ending in ``.safetensors``
    gets a safetensors file with the parameters (blasnet's names and layouts) and the
    metadata in its header; only ``.npz`` holds optimizer and scheduler state. The file
    appears under ``path`` only once it is complete; a failure part-way leaves any previous
    file there untouched.
    """
    path = os.fspath(path)
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
    if path.lower().endswith(SAFETENSORS):
        if optimizer is not None or scheduler is not None:
            raise ValueError(f"{path}: a .safetensors checkpoint holds parameters only; save the "
                             f"optimizer and scheduler state to an .npz file")
        _save_safetensors(path, model, meta_json)
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
              "params": params, "optimizer": optim, "metadata": json.loads(meta_json)}
    if sched is not None:
        header["scheduler"] = sched
    arrays[_HEADER] = np.array(json.dumps(header))
    _atomic_write(path, lambda f: np.savez(f, **arrays))


def _save_safetensors(path: str, model, meta_json: str) -> None:
    st = _safetensors_numpy()
    tensors = {name: np.ascontiguousarray(p.data) for name, p in model.named_parameters()}
    # safetensors metadata is str -> str: the user's metadata goes in as one JSON string.
    header = {"format": FORMAT, "version": str(FORMAT_VERSION), "model": type(model).__name__,
              "metadata": meta_json}
    data = st.save(tensors, metadata=header)
    _atomic_write(path, lambda f: f.write(data))


def _atomic_write(path: str, write) -> None:
    """Call ``write(file)`` on a temporary file next to ``path``, then rename it to ``path``."""
    directory = os.path.dirname(os.path.abspath(path))
    fd, tmp = tempfile.mkstemp(dir=directory, prefix="." + os.path.basename(path) + ".",
                               suffix=".tmp")
    try:
        with os.fdopen(fd, "wb") as f:
            write(f)
            f.flush()
            os.fsync(f.fileno())
        try:  # keep the mode of the file being replaced; mkstemp creates 0600
            os.chmod(tmp, os.stat(path).st_mode & 0o7777 if os.path.exists(path) else 0o644)
        except OSError:
            pass
        os.replace(tmp, path)
    except BaseException:
        try:
            os.unlink(tmp)
        except OSError:
            pass
        raise
    _fsync_dir(directory)


def _fsync_dir(directory: str) -> None:
    """Make the rename durable (POSIX); harmless to skip where directories cannot be opened."""
    try:
        dfd = os.open(directory, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(dfd)
    except OSError:
        pass
    finally:
        os.close(dfd)


# ----------------------------------------------------------------------------- load
def _is_safetensors(head: bytes, size: int) -> bool:
    # The format: a little-endian u64 header length, then the JSON header ("{...").
    if len(head) < 9 or head[8:9] != b"{":
        return False
    n = int.from_bytes(head[:8], "little")
    return 2 <= n <= size - 8


def _read_safetensors(path: str):
    """A safetensors file as ``(header, arrays)`` in the shape ``_read`` gives for .npz."""
    _safetensors_numpy()  # the install hint if the package is missing
    from safetensors import safe_open
    try:
        with safe_open(path, framework="numpy") as f:
            meta = f.metadata() or {}
            arrays = {_PARAM + k: f.get_tensor(k) for k in f.keys()}
    except Exception as e:  # the package's own error types differ between versions
        raise CheckpointError(f"{path}: truncated or corrupt safetensors file "
                              f"({type(e).__name__}: {e})") from None
    header = {"model": meta.get("model", "a safetensors file"), "optimizer": None,
              "metadata": {}, "safetensors": True}
    if "format" in meta:  # written by blasnet: check it; other files need only fit the model
        if meta["format"] != FORMAT:
            raise CheckpointError(f"{path}: not a blasnet checkpoint (header format "
                                  f"{meta['format']!r})")
        version = meta.get("version", "")
        if not version.isdigit() or not 1 <= int(version) <= FORMAT_VERSION:
            raise CheckpointError(f"{path}: checkpoint format version {version!r}; this "
                                  f"blasnet reads versions 1 to {FORMAT_VERSION}")
        try:
            header["metadata"] = json.loads(meta.get("metadata", "{}"))
        except ValueError as e:
            raise CheckpointError(f"{path}: corrupt checkpoint metadata ({e})") from None
    return header, arrays


def _read(path: str):
    """All arrays of the checkpoint at ``path`` and its header, read eagerly."""
    try:
        with open(path, "rb") as f:
            magic = f.read(9)
            size = os.fstat(f.fileno()).st_size
    except IsADirectoryError:
        raise CheckpointError(f"{path}: is a directory, not a checkpoint file") from None
    if magic[:4] != b"PK\x03\x04" and _is_safetensors(magic, size):
        return _read_safetensors(path)
    if magic[:4] != b"PK\x03\x04":
        raise CheckpointError(f"{path}: not a blasnet checkpoint (not an .npz archive"
                              + (")" if path.lower().endswith(".npz") else
                                 " nor a safetensors file)"))
    try:
        with np.load(path, allow_pickle=False) as z:
            arrays = {k: z[k] for k in z.files}
    except (zipfile.BadZipFile, EOFError, OSError, ValueError, KeyError) as e:
        raise CheckpointError(f"{path}: truncated or corrupt checkpoint ({type(e).__name__}: {e})") from None
    if _HEADER not in arrays:
        raise CheckpointError(f"{path}: not a blasnet checkpoint (no {_HEADER} entry)")
    try:
        header = json.loads(str(arrays.pop(_HEADER)[()]))
    except (ValueError, TypeError) as e:
        raise CheckpointError(f"{path}: corrupt checkpoint header ({e})") from None
    if not isinstance(header, dict) or header.get("format") != FORMAT:
        raise CheckpointError(f"{path}: not a blasnet checkpoint (header format "
                              f"{header.get('format') if isinstance(header, dict) else header!r})")
    version = header.get("version")
    if not isinstance(version, int) or version > FORMAT_VERSION or version < 1:
        raise CheckpointError(f"{path}: checkpoint format version {version!r}; this blasnet reads "
                              f"versions 1 to {FORMAT_VERSION}")
    return header, arrays


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
    path = os.fspath(path)
    header, arrays = _read(path)

    # Model parameters: check all names, shapes and dtypes before copying anything.
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

    # Optimizer state: rebuild the state dict and let the optimizer check it.
    checked = None
    if optimizer is not None:
        optim = header.get("optimizer")
        if optim is None:
            why = ("a safetensors file holds parameters only" if header.get("safetensors")
                   else "it was saved without an optimizer")
            raise CheckpointError(f"{path}: the checkpoint holds no optimizer state ({why})")
        state: dict = {}
        for k, v in arrays.items():
            if k.startswith(_OPTIM):
                idx, _, key = k[len(_OPTIM):].partition("/")
                if not idx.isdigit() or not key:
                    raise CheckpointError(f"{path}: corrupt optimizer entry {k!r}")
                state.setdefault(int(idx), {})[key] = v
        try:
            checked = optimizer._check_state_dict({**optim, "state": state})
        except (KeyError, ValueError, TypeError) as e:
            msg = e.args[0] if isinstance(e, KeyError) and e.args else e
            raise CheckpointError(f"{path}: the optimizer state does not fit "
                                  f"{type(optimizer).__name__}: {msg}") from None

    sched_checked = None
    if scheduler is not None:
        sd = header.get("scheduler")
        if sd is None:
            why = ("a safetensors file holds parameters only" if header.get("safetensors")
                   else "it was saved without a scheduler")
            raise CheckpointError(f"{path}: the checkpoint holds no scheduler state ({why})")
        check = getattr(scheduler, "_check_state_dict", None)
        if check is None:
            raise TypeError(f"scheduler: expected a scheduler of engine.lr_scheduler, got "
                            f"{type(scheduler).__name__}")
        try:
            sched_checked = check(sd)
        except (KeyError, ValueError, TypeError) as e:
            msg = e.args[0] if isinstance(e, KeyError) and e.args else e
            raise CheckpointError(f"{path}: the scheduler state does not fit "
                                  f"{type(scheduler).__name__}: {msg}") from None

    model.load_state_dict(params)  # checked above: cannot fail any more
    if checked is not None:
        optimizer._apply_state(checked)
    if sched_checked is not None:
        scheduler._apply(sched_checked)  # after the optimizer: it writes the groups' lr
    return header.get("metadata", {})

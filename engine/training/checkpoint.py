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
import os
import tempfile

import numpy as np

from .atomic_file import atomic_write, check_target, file_path, fspath, writable_target
from .checkpoint_format import (FORMAT, FORMAT_VERSION, HEADER, OPTIM, PARAM, SAFETENSORS,
                                MAX_JSON_DEPTH, TRAIN, CheckpointError, json_depth,
                                json_field)
from .npz_file import read_npz
from .safetensors_file import (from_torch_layout, is_safetensors, read_safetensors,
                               write_safetensors)

__all__ = ["save", "write", "load", "prepare_load", "PreparedLoad", "read_header", "check_target", "save_or_rescue", "SaveError",
           "CheckpointError", "FORMAT_VERSION"]

# ----------------------------------------------------------------------------- save
def save(path, model, /, optimizer=None, scheduler=None, **metadata) -> None:
    """Write ``model``'s parameters and constructor configuration (and ``optimizer``'s and
    ``scheduler``'s state, if given) to ``path``: the arguments of ``load``, in its order.

    ``metadata`` (JSON-serialisable keyword arguments, e.g. ``epoch=10``; ``optimizer`` and
    ``scheduler`` are the reserved names) is stored and returned by ``load``. The
    configuration (``model.get_config()``, recursively) lets ``engine.load_model`` rebuild
    the model alone; a model that cannot describe itself is saved without it, and the
    reason is kept for ``load_model`` to report. A path ending in ``.safetensors``
    gets a safetensors file with the parameters and the metadata in its header: under
    PyTorch's names and layouts when every module has a PyTorch reference module
    (``engine.interop``: ``torch_module.load_state_dict(safetensors.torch.load_file(path))``
    works), else blasnet's; only ``.npz`` holds optimizer and scheduler state. The file
    appears under ``path`` only once it is complete; a failure part-way leaves any previous
    file there untouched.
    """
    write(path, model, optimizer, scheduler, metadata)


def write(path, model, optimizer=None, scheduler=None, metadata=None, training=None) -> None:
    """``save`` with the metadata as a dict, and ``training``: a run's resumable state as
    ``(JSON object, {name: array})`` (what ``fit`` continues from; ``.npz`` only)."""
    path = file_path(path)
    _check_model(model)
    if optimizer is not None:
        _check_optimizer(optimizer, model, saving=True)
    try:
        meta_json = json.dumps(metadata or {}, allow_nan=True)
    except (TypeError, ValueError) as e:
        raise TypeError(f"metadata: every value must be JSON-serialisable ({e})") from None
    except RecursionError:
        meta_json = None
    if meta_json is None or json_depth(json.loads(meta_json)) >= MAX_JSON_DEPTH:
        raise ValueError(f"metadata: nested deeper than {MAX_JSON_DEPTH - 1} levels (a "
                         f"checkpoint's header may nest {MAX_JSON_DEPTH})")
    if scheduler is not None and not callable(getattr(scheduler, "state_dict", None)):
        raise TypeError(f"scheduler: expected a learning-rate scheduler, got "
                        f"{type(scheduler).__name__}")
    target = writable_target(path)  # the format follows the name given, not a link's target
    if path.lower().endswith(SAFETENSORS):
        if optimizer is not None or scheduler is not None or training is not None:
            raise ValueError(f"{path}: a .safetensors checkpoint holds parameters only; save the "
                             f"optimizer, scheduler and training state to an .npz file")
        write_safetensors(target, model, meta_json, _config_fields(model))
        return
    arrays, header = _npz_contents(model, optimizer, json.loads(meta_json))
    if scheduler is not None:
        header["scheduler"] = scheduler.state_dict()
    if training is not None:
        state, extra = training
        header["training"] = state
        arrays.update({TRAIN + k: v for k, v in extra.items()})
    arrays[HEADER] = np.array(json.dumps(header))
    atomic_write(target, lambda f: np.savez(f, **arrays))


def _npz_contents(model, optimizer, metadata: dict) -> tuple:
    """The arrays (parameters, optimizer state) and header of an ``.npz`` checkpoint."""
    arrays, params = {}, {}
    for name, p in model.named_parameters():
        arrays[PARAM + name] = p.data
        params[name] = [list(p.data.shape), str(p.data.dtype)]
    optim = None
    if optimizer is not None:
        sd = optimizer.state_dict()
        for idx, st in sd["state"].items():
            for key, value in st.items():
                arrays[f"{OPTIM}{idx}/{key}"] = value
        optim = {k: v for k, v in sd.items() if k != "state"}
    header = {"format": FORMAT, "version": FORMAT_VERSION, "model": type(model).__name__,
              "params": params, "optimizer": optim, "metadata": metadata,
              **_config_fields(model)}
    if optim is not None:
        order = _optimizer_order(optimizer, model)
        if order is not None:
            header["optimizer_params"] = order
    return arrays, header


class SaveError(OSError):
    """``save_or_rescue`` could not write the file asked for; ``rescued`` is where the model
    went instead (None if that failed too)."""

    def __init__(self, message: str, rescued):
        super().__init__(message)
        self.rescued = rescued


def save_or_rescue(path, model, /, optimizer=None, scheduler=None, *, training_state=None,
                   **metadata) -> None:
    """``save`` (with a run's resumable ``training_state``, see ``write``); if writing fails
    (a full disk, a directory made read-only during the run), save the same checkpoint to a
    new file in the temporary directory instead and raise ``SaveError`` naming both: a run's
    end never loses the trained model."""
    try:
        write(path, model, optimizer, scheduler, metadata, training_state)
        return
    except OSError as e:
        reason = e.strerror or str(e)
    suffix = SAFETENSORS if fspath(path).lower().endswith(SAFETENSORS) else ".npz"
    rescued = None
    try:
        fd, rescued = tempfile.mkstemp(prefix="blasnet-rescued-", suffix=suffix)
        os.close(fd)
        write(rescued, model, optimizer, scheduler, metadata, training_state)
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


def _read(path: str):
    """All arrays of the checkpoint at ``path`` and its header, read eagerly."""
    try:
        f = open(path, "rb")
    except IsADirectoryError:
        raise CheckpointError(f"{path}: is a directory, not a checkpoint file") from None
    with f:
        magic = f.read(9)
        size = os.fstat(f.fileno()).st_size
        if magic[:4] != b"PK\x03\x04" and is_safetensors(magic, size):
            kind = SAFETENSORS
        elif magic[:4] != b"PK\x03\x04":
            raise CheckpointError(f"{path}: not a blasnet checkpoint (not an .npz archive"
                                  + (")" if path.lower().endswith(".npz") else
                                     " nor a safetensors file)"))
        else:
            kind = ".npz"
            f.seek(0)
            try:
                arrays = read_npz(path, f, size)
            except CheckpointError:
                raise
            except Exception as e:  # zipfile and numpy raise a dozen types on damaged input
                raise CheckpointError(f"{path}: truncated or corrupt checkpoint "
                                      f"({type(e).__name__}: {e})") from None
    if kind == SAFETENSORS:
        return read_safetensors(path)
    if HEADER not in arrays:
        raise CheckpointError(f"{path}: not a blasnet checkpoint (no {HEADER} entry)")
    h = arrays.pop(HEADER)
    if h.shape != () or h.dtype.kind != "U":
        raise CheckpointError(f"{path}: corrupt checkpoint header (a {h.dtype} array of "
                              f"shape {h.shape})")
    header = json_field(path, "header", str(h[()]), dict)
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
                       ("optimizer_params", (list,)), ("training", (dict,))):
        if key in header and not isinstance(header[key], kinds):
            raise CheckpointError(f"{path}: corrupt checkpoint header ({key!r} is a "
                                  f"{type(header[key]).__name__})")
    header.setdefault("metadata", {})
    declared = header.get("params")
    if declared is None:
        return
    stored = {k[len(PARAM):]: v for k, v in arrays.items() if k.startswith(PARAM)}
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
                                      "optimizer", "scheduler", "optimizer_params", "training")}
    out["metadata"] = header.get("metadata", {})
    out["params"] = {k[len(PARAM):]: (tuple(v.shape), str(v.dtype))
                     for k, v in arrays.items() if k.startswith(PARAM)}
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
    holds parameters only, under blasnet's names or PyTorch's (``engine.interop``; a file
    written by PyTorch for the model's reference module loads too).
    """
    return prepare_load(path, model, optimizer, scheduler).apply()


class PreparedLoad:
    """A checkpoint read and checked against a model (and optimizer and scheduler), not yet
    applied: ``header`` and ``arrays`` as read; ``apply()`` loads it (it cannot fail any
    more) and returns the metadata."""

    def __init__(self, header, arrays, apply):
        self.header, self.arrays, self._apply = header, arrays, apply

    def apply(self) -> dict:
        self._apply()
        return self.header.get("metadata", {})


def prepare_load(path, model, optimizer=None, scheduler=None) -> PreparedLoad:
    """Every check of ``load``, changing nothing: a ``PreparedLoad`` to apply later."""
    path = fspath(path)
    _check_model(model)
    if optimizer is not None:
        _check_optimizer(optimizer, model, saving=False)
    if scheduler is not None and getattr(scheduler, "validate_state_dict", None) is None:
        raise TypeError(f"scheduler: expected a scheduler of engine.optim.lr_scheduler, got "
                        f"{type(scheduler).__name__}")
    header, arrays = _read(path)
    params = _checked_parameters(path, header, arrays, model)
    checked = None if optimizer is None else _checked_optimizer(path, header, arrays, optimizer)
    sched_checked = None
    if scheduler is not None:
        sd = _saved_part(path, header, "scheduler")
        try:
            sched_checked = scheduler.validate_state_dict(sd)
        except Exception as e:
            msg = e.args[0] if isinstance(e, KeyError) and e.args else e
            raise CheckpointError(f"{path}: the scheduler state does not fit "
                                  f"{type(scheduler).__name__}: {msg}") from None

    def apply():
        model.load_state_dict(params)  # checked above: cannot fail any more
        if checked is not None:
            optimizer.apply_state(checked)
        if sched_checked is not None:
            scheduler.apply_state(sched_checked)  # after the optimizer: it sets the groups' lr
    return PreparedLoad(header, arrays, apply)


def _checked_parameters(path: str, header: dict, arrays: dict, model) -> dict:
    """The saved parameters by name, after checking all names, shapes and dtypes against
    the model (nothing is copied here)."""
    params = {k[len(PARAM):]: v for k, v in arrays.items() if k.startswith(PARAM)}
    if header.get("safetensors"):  # PyTorch's names and layouts, or blasnet's
        params = from_torch_layout(path, model, params)
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
        if k.startswith(OPTIM):
            idx, _, key = k[len(OPTIM):].partition("/")
            if not (idx.isascii() and idx.isdigit() and str(int(idx)) == idx) or not key:
                raise CheckpointError(f"{path}: corrupt optimizer entry {k!r}")
            state.setdefault(int(idx), {})[key] = v
    try:
        return optimizer.validate_state_dict({**optim, "state": state})
    except Exception as e:  # whatever an edited header holds, it is the file's fault
        msg = e.args[0] if isinstance(e, KeyError) and e.args else e
        raise CheckpointError(f"{path}: the optimizer state does not fit "
                              f"{type(optimizer).__name__}: {msg}") from None

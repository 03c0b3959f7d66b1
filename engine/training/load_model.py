"""``load_model``: a checkpoint back into a working model without naming its architecture
(Keras's ``load_model``, Hugging Face's ``from_pretrained``): the model is rebuilt from the
configuration ``save`` stored, its weights loaded, and the optimizer, learning-rate
scheduler and input ``Standardizer`` rebuilt too when the file holds them.
"""
from __future__ import annotations

import os
from dataclasses import dataclass, field

import numpy as np

from . import checkpoint
from .config_bounds import check_config_fits

__all__ = ["load_model", "LoadedModel"]


@dataclass
class LoadedModel:
    """What ``load_model`` rebuilt: ``model`` always; ``optimizer``, ``scheduler``,
    ``standardizer`` (the inputs') and ``target_standardizer`` (a regression's targets,
    which the model learnt standardised) when the checkpoint holds them (else None);
    ``metadata`` as ``load`` returns it; ``config``, the model's stored configuration;
    ``tokenizer``, a language model's (from the metadata's ``tokenizer`` entry, else its
    legacy ``vocab`` characters; None when it has neither)."""
    model: object
    optimizer: object = None
    scheduler: object = None
    standardizer: object = None
    metadata: dict = field(default_factory=dict)
    config: dict = field(default_factory=dict)
    tokenizer: object = None
    target_standardizer: object = None

    def predict(self, X, batch_size=None):
        """The model's outputs for raw inputs ``X``, as ``blasnet predict`` computes them:
        the stored input standardisation applied first, the stored target standardisation
        undone after (so a regression's outputs are in the target's units; a classifier's
        are its logits). ``engine.predict(self.model, X)`` applies neither."""
        from ..data.entry import as_inputs
        from ..training.loop import predict
        if self.standardizer is not None:
            X = self.standardizer.transform(as_inputs(self.model, X))
        out = predict(self.model, X, batch_size)
        if self.target_standardizer is not None:
            out = self.target_standardizer.inverse_transform(out.reshape(out.shape[0], -1))
        return out


def _optimizer_types() -> dict:
    from ..optim.optimizers import SGD, AdamW
    # A ShardedAdamW saves the gathered state of the equivalent AdamW (type "AdamW").
    return {"AdamW": AdamW, "SGD": SGD}


def _scheduler_types() -> dict:
    from ..optim import lr_scheduler as lrs
    return {name: getattr(lrs, name) for name in ("StepLR", "LinearLR", "CosineAnnealingLR",
                                                  "SequentialLR", "LambdaLR", "WarmupCosineLR")}


def _build_optimizer(path, header, model, base_lrs):
    saved = header["optimizer"]
    kind = saved.get("type")
    cls = _optimizer_types().get(kind)
    if cls is None:
        raise checkpoint.CheckpointError(f"{path}: the optimizer type {kind!r} cannot be "
                                         f"rebuilt (known: {sorted(_optimizer_types())})")
    named = dict(model.named_parameters())
    order = header.get("optimizer_params") or list(named)  # saved without: the model's order
    unknown = [n for n in order if n not in named]
    if unknown:
        raise checkpoint.CheckpointError(f"{path}: the optimizer's parameters {unknown} are "
                                         f"not the model's")
    groups = []
    for gi, g in enumerate(saved.get("param_groups") or []):
        try:
            params = [named[order[i]] for i in g["params"]]
        except (KeyError, IndexError, TypeError):
            raise checkpoint.CheckpointError(f"{path}: corrupt optimizer group {gi}") from None
        options = {k: v for k, v in g.items() if k != "params"}
        if base_lrs is not None and gi < len(base_lrs):
            options["lr"] = base_lrs[gi]  # the schedule's start; load sets the current rate
        groups.append({"params": params, **options})
    if not groups:
        raise checkpoint.CheckpointError(f"{path}: the optimizer state has no parameter group")
    try:
        return cls(groups, lr=groups[0]["lr"])  # every group carries all its options
    except (TypeError, ValueError) as e:
        raise checkpoint.CheckpointError(f"{path}: the optimizer cannot be rebuilt: {e}") from None


def _build_scheduler(path, saved, optimizer):
    kind = saved.get("type")
    types = _scheduler_types()
    if kind == "LambdaLR":
        raise checkpoint.CheckpointError(
            f"{path}: a LambdaLR's function is not saved, so it cannot be rebuilt; call "
            f"load_model(path, scheduler=False) and build it again, then "
            f"engine.load(path, model, optimizer, scheduler)")
    cls = types.get(kind)
    if cls is None:
        raise checkpoint.CheckpointError(f"{path}: the scheduler type {kind!r} cannot be "
                                         f"rebuilt (known: {sorted(types)})")
    options = dict(saved.get("options") or {})
    try:
        if kind == "SequentialLR":
            children = [_build_scheduler(path, c, optimizer) for c in saved.get("children", [])]
            return cls(optimizer, children, options.get("milestones"))
        return cls(optimizer, **options)
    except (TypeError, ValueError) as e:
        raise checkpoint.CheckpointError(f"{path}: the {kind} cannot be rebuilt: {e}") from None


def _check_custom_objects(custom_objects) -> None:
    """TypeError naming ``custom_objects`` unless it is None or ``{name: Module subclass}``."""
    from collections.abc import Mapping
    from ..nn.module import Module
    if custom_objects is None:
        return
    if not isinstance(custom_objects, Mapping):
        raise TypeError(f"custom_objects: expected a dict {{'Name': ModuleClass}}, got "
                        f"{type(custom_objects).__name__} {custom_objects!r:.60}")
    for k, v in custom_objects.items():
        if not isinstance(k, str):
            raise TypeError(f"custom_objects: expected class names (str) as keys, got {k!r}")
        if not (isinstance(v, type) and issubclass(v, Module)):
            raise TypeError(f"custom_objects[{k!r}]: expected a Module subclass, got {v!r:.60}")


def load_model(path, *, custom_objects=None, optimizer: bool = True,
               scheduler: bool = True) -> LoadedModel:
    """Rebuild the model saved at ``path`` from its stored configuration and load its
    weights; rebuild the optimizer and scheduler too when the file holds their state (unless
    ``optimizer`` / ``scheduler`` is False), and the ``Standardizer`` saved in the metadata
    under ``standardizer``. Returns a ``LoadedModel``.

    Engine modules are found by name; a user's module class (one whose ``get_config``
    describes it) is passed in ``custom_objects={"Name": Class}``: no class is imported
    from a name read in a file. A checkpoint of a model that could not describe itself
    raises ``CheckpointError`` naming the missing piece; every check runs before anything
    is returned, through ``engine.load``'s own."""
    from ..models.config import ConfigError, from_config
    from ..data import Standardizer
    _check_custom_objects(custom_objects)
    header = checkpoint.read_header(path)  # a TypeError for a path that is not one
    path = os.fspath(path)
    node = header.get("model_config")
    if node is None:
        why = header.get("model_config_error") or "it was written before checkpoints held one"
        raise checkpoint.CheckpointError(f"{path}: the checkpoint holds no model configuration "
                                         f"({why}); build the model yourself and call "
                                         f"engine.load(path, model)")
    # Sizes bounded by what the file holds, before anything is allocated for them (a GPT's
    # config is checked shape by shape against the file in _build_lm).
    if not _is_gpt(node):
        check_config_fits(path, node, (shape for shape, _ in header["params"].values()))
    try:
        model = _build_lm(node, header) if _is_gpt(node) else from_config(node, custom_objects)
    except (ConfigError, TypeError, ValueError) as e:
        raise checkpoint.CheckpointError(f"{path}: {e}") from None
    sched_state = header.get("scheduler") if scheduler else None
    opt = sched = None
    if optimizer and header.get("optimizer") is not None:
        base = sched_state.get("base_lrs") if isinstance(sched_state, dict) else None
        opt = _build_optimizer(path, header, model, base)
        if sched_state is not None:
            sched = _build_scheduler(path, sched_state, opt)
    metadata = checkpoint.load(path, model, opt, sched)
    found = {}
    for key in ("standardizer", "target_standardizer"):
        if isinstance(metadata, dict) and key in metadata:
            try:
                found[key] = Standardizer.from_state_dict(metadata[key])
            except (ValueError, TypeError) as e:  # a field of strings is a TypeError there
                raise checkpoint.CheckpointError(f"{path}: metadata {key!r}: {e}") from None
    return LoadedModel(model, opt, sched, found.get("standardizer"), metadata, node,
                       target_standardizer=found.get("target_standardizer"),
                       tokenizer=_lm_tokenizer(path, metadata, model))


# ----------------------------------------------------------------------------- language models
_GPT_TYPES = ("GPT", "engine.models.gpt.GPT")  # the stored name: bare or dotted


def _is_gpt(node) -> bool:
    return isinstance(node, dict) and node.get("type") in _GPT_TYPES


def _build_lm(node, header):
    """A GPT from its stored configuration, checked against the file's parameter shapes
    before anything is allocated (engine/models/gpt_config.py)."""
    from ..models.gpt_config import build_gpt
    shapes = {name: shape for name, (shape, _) in header["params"].items()}
    return build_gpt(node.get("config"), shapes)


def _lm_tokenizer(path, metadata, model):
    """The tokenizer in ``metadata`` (its ``tokenizer`` entry, else the legacy ``vocab``
    characters of the gMLP LM's checkpoints) checked against the model's vocabulary size;
    None when there is none."""
    from ..models.tokenizer import tokenizer_from_meta
    if not isinstance(metadata, dict):
        return None
    if "tokenizer" in metadata:
        entry, where = metadata["tokenizer"], "tokenizer"
    elif "vocab" in metadata:
        entry, where = {"kind": "char", "chars": metadata["vocab"]}, "vocab"
    else:
        return None
    try:
        tok = tokenizer_from_meta(entry)
    except (TypeError, ValueError) as e:
        raise checkpoint.CheckpointError(f"{path}: metadata {where!r}: {e}") from None
    size = getattr(model, "vocab_size", None)
    if size is None:  # the gMLP LM: the size its output predicts for ids (asked, not read)
        from ..models.sampling import context_length
        try:
            window = np.zeros((1, context_length(model)), np.int64)
            size = model.check_input(window, "ids")[-1]
        except (TypeError, ValueError):
            raise checkpoint.CheckpointError(f"{path}: metadata {where!r} holds a tokenizer, "
                                             f"but the model does not read token ids") from None
    if size != len(tok):
        raise checkpoint.CheckpointError(f"{path}: metadata {where!r}: a tokenizer of "
                                         f"{len(tok)} tokens, the model's vocabulary has {size}")
    return tok

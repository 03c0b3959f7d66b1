"""``Module.get_config`` read off the constructor: every argument of ``__init__`` but ``rng``
is the attribute of the same name (Keras's ``get_config`` without writing one per class).

A class whose constructor argument is held under another name says where, in its
``config_attrs`` (argument -> attribute, dotted into a child: ``{"eps": "norm.eps"}``).
"""
from __future__ import annotations

import inspect

import numpy as np

__all__ = ["init_arguments"]


def _missing(cls, arg: str, attr: str) -> NotImplementedError:
    return NotImplementedError(
        f"{cls.__name__}.get_config(): __init__ takes {arg!r} but the module has no attribute "
        f"{attr!r} to read it back from; store each constructor argument under its name "
        f"(self.{arg} = {arg}), name the attribute in {cls.__name__}.config_attrs, or define "
        f"{cls.__name__}.get_config()")


def _read(module, arg: str, path: str):
    """The value at the dotted ``path``; the first step must be the module's own attribute
    (a plain class attribute such as ``Module.in_features = None`` describes no argument)."""
    cls = type(module)
    head, *rest = path.split(".")
    if head not in vars(module) and not isinstance(inspect.getattr_static(cls, head, None),
                                                   property):
        raise _missing(cls, arg, path)
    value = getattr(module, head)
    for part in rest:
        if not hasattr(value, part):
            raise _missing(cls, arg, path)
        value = getattr(value, part)
    return value


def _plain(value):
    if isinstance(value, np.dtype):
        return value.name
    if isinstance(value, (list, tuple)):
        return list(value)  # a copy: the caller may change it
    return value


def init_arguments(module) -> dict:
    """``{argument: value}`` for every argument of ``type(module).__init__`` except ``rng``,
    in the signature's order: dtypes by name, sequences as new lists, child modules as they
    are. NotImplementedError naming the argument when one cannot be read back."""
    cls = type(module)
    aliases = getattr(cls, "config_attrs", None) or {}
    out = {}
    for name, p in list(inspect.signature(cls.__init__).parameters.items())[1:]:
        if name == "rng":
            continue  # a Generator is state, not configuration: a checkpoint holds weights
        if p.kind is p.VAR_KEYWORD:
            raise NotImplementedError(
                f"{cls.__name__}.get_config(): __init__ takes **{name}, which no attribute "
                f"describes; define {cls.__name__}.get_config()")
        out[name] = _plain(_read(module, name, aliases.get(name, name)))
    return out

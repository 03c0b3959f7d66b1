"""A module's constructor configuration as JSON and back (Keras's ``get_config`` /
``from_config``): what a checkpoint stores beside the weights so that ``engine.load_model``
rebuilds the model without being told its architecture. A node is ``{"type": name,
"config": {keyword: value}}``; child modules inside a config are nodes themselves.
"""
from __future__ import annotations

import inspect
import math

import numpy as np

from ..nn.module import Module
from ..nn.rows import defined_by

__all__ = ["ConfigError", "to_config", "from_config", "module_types", "count_parameters"]


class ConfigError(TypeError):
    """A module cannot describe itself (no ``get_config``, a value JSON cannot hold), or a
    stored configuration names a class that cannot be rebuilt."""


def module_types() -> dict:
    """``{name: class}`` of the engine's public modules, the classes a checkpoint may name
    without the caller's help."""
    from .. import nn
    return {name: obj for name, obj in vars(nn).items()
            if isinstance(obj, type) and issubclass(obj, Module) and not name.startswith("_")
            and obj is not Module}


def _type_name(cls) -> str:
    """The class's name as stored: the bare name for the engine's own modules, the dotted
    ``module.qualname`` for any other."""
    if module_types().get(cls.__name__) is cls:
        return cls.__name__
    return f"{cls.__module__}.{cls.__qualname__}"


def _init_parameters(cls) -> dict:
    params = dict(inspect.signature(cls.__init__).parameters)
    params.pop("self", None)
    return params


def to_config(module) -> dict:
    """The node describing ``module`` and, recursively, the child modules its constructor
    takes. ConfigError (naming the class and the missing piece) when ``get_config`` cannot
    read an argument back, when a class defines its own ``__init__`` below a hand-written
    ``get_config``, when ``get_config`` names an argument ``__init__`` does not take, or
    when a value is not JSON (numbers, strings, bools, None, lists, dicts)."""
    if not isinstance(module, Module):
        raise TypeError(f"model: expected an engine Module, got {type(module).__name__}")
    cls = type(module)
    name = cls.__name__
    own = defined_by(cls, "get_config")  # Module's reads the class's own __init__
    if own is not Module and not issubclass(own, defined_by(cls, "__init__")):
        raise ConfigError(f"{name} defines __init__ but not get_config(): define "
                          f"{name}.get_config() returning the keyword arguments of its "
                          f"__init__, so a checkpoint can rebuild it")
    try:
        config = module.get_config()
    except NotImplementedError as e:
        raise ConfigError(str(e)) from None
    if not isinstance(config, dict) or not all(isinstance(k, str) for k in config):
        raise ConfigError(f"{name}.get_config(): expected a dict with str keys, got "
                          f"{type(config).__name__}")
    params = _init_parameters(cls)
    takes_any = any(p.kind is p.VAR_KEYWORD for p in params.values())
    unknown = [k for k in config if k not in params and not takes_any]
    if unknown:
        raise ConfigError(f"{name}.get_config(): {unknown} are not arguments of "
                          f"{name}.__init__ (it takes {[k for k in params]})")
    return {"type": _type_name(cls),
            "config": {k: _value(f"{name}.get_config()[{k!r}]", v) for k, v in config.items()}}


def _value(where: str, v):
    """``v`` as a JSON value (child modules as nodes), else ConfigError naming ``where``."""
    if isinstance(v, Module):
        return to_config(v)
    if v is None or isinstance(v, (bool, str)):
        return v
    if isinstance(v, (int, np.integer)):
        return int(v)
    if isinstance(v, (float, np.floating)):
        if not math.isfinite(v):
            raise ConfigError(f"{where}: {v} has no JSON form")
        return float(v)
    if isinstance(v, np.dtype) or (isinstance(v, type) and issubclass(v, np.generic)):
        return np.dtype(v).name
    if isinstance(v, (list, tuple)):
        return [_value(f"{where}[{i}]", x) for i, x in enumerate(v)]
    if isinstance(v, dict) and all(isinstance(k, str) for k in v):
        return {k: _value(f"{where}[{k!r}]", x) for k, x in v.items()}
    raise ConfigError(f"{where}: a {type(v).__name__} has no JSON form; return numbers, "
                      f"strings, bools, None, lists, dicts or modules")


def _is_node(v) -> bool:
    return isinstance(v, dict) and set(v) == {"type", "config"} and isinstance(v["type"], str)


def from_config(node, custom_objects=None) -> Module:
    """The module ``node`` describes, freshly initialised (the caller loads its weights).
    An engine class is found by name; any other class must be in ``custom_objects`` (keyed
    by its bare or dotted name), as no class is imported from a name read in a file."""
    if not _is_node(node) or not isinstance(node["config"], dict):
        raise ConfigError(f"model config: expected {{'type': name, 'config': {{...}}}}, got "
                          f"{node!r:.80}")
    custom = dict(custom_objects or {})
    name = node["type"]
    short = name.rpartition(".")[2]
    cls = custom.get(name) or custom.get(short)
    if cls is None and "." not in name:
        cls = module_types().get(name)
    if cls is None:
        raise ConfigError(f"model config: the class {name!r} is not an engine module; pass it "
                          f"as load_model(path, custom_objects={{{short!r}: {short}}})")
    if not (isinstance(cls, type) and issubclass(cls, Module)):
        raise ConfigError(f"custom_objects[{short!r}]: expected a Module subclass, got {cls!r}")
    kwargs = {k: _rebuild(v, custom) for k, v in node["config"].items()}
    params = _init_parameters(cls)
    args = []
    for k, p in params.items():  # a stack's children are positional (*modules)
        if p.kind is p.VAR_POSITIONAL and k in kwargs:
            args = list(kwargs.pop(k))
    try:
        return cls(*args, **kwargs)
    except (TypeError, ValueError) as e:
        raise ConfigError(f"model config: {short}(**{node['config']!r:.200}) failed: "
                          f"{e}") from None


def _rebuild(v, custom):
    if _is_node(v):
        return from_config(v, custom)
    if isinstance(v, list):
        return [_rebuild(x, custom) for x in v]
    if isinstance(v, dict):
        return {k: _rebuild(x, custom) for k, x in v.items()}
    return v


def count_parameters(shapes) -> int:
    """The number of values in parameters of the given shapes."""
    return sum(math.prod(s) for s in shapes)

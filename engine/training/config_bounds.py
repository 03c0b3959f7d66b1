"""A stored model configuration checked against the arrays its file holds, before anything
is built from it: a header edited to ``d_model = 10**9`` must be refused, not allocated.

The number of parameter values an engine module's configuration implies is computed from
the configuration alone (a dry shape pass, no allocation); the sum over the whole tree may
not exceed the number of values stored (load's own checks then match every shape). A class without an entry here (a user's module from
``custom_objects``) cannot be counted: its integer settings are bounded by the values
stored instead. The number of modules is bounded too (a config of 300,000 ``Identity``
nodes would take seconds to build for a file that holds nothing).
"""
from __future__ import annotations

import math

from .checkpoint_format import CheckpointError

__all__ = ["check_config_fits", "implied_parameters", "max_modules", "PARAMETER_COUNTS"]


def max_modules(n_arrays: int) -> int:
    """Modules a configuration may hold for a file of ``n_arrays`` parameter arrays: every
    parameter-holding module stores at least one array, and a model interleaves a few
    parameter-free ones (activations, Dropout, Identity) with them."""
    return 256 + 8 * n_arrays


def _size(v):
    """``v`` if it is a positive int (not a bool), else None (the constructor refuses it)."""
    return v if type(v) is int and v > 0 else None


def _sizes(config, *keys):
    out = [_size(config.get(k)) for k in keys]
    return None if None in out else out


def _linear(c):
    s = _sizes(c, "d_in", "d_out")
    return None if s is None else s[0] * s[1] + (s[1] if c.get("bias", True) else 0)


def _mlp(c):
    sizes = c.get("sizes")
    if not isinstance(sizes, list) or not sizes or any(_size(s) is None for s in sizes):
        return None
    bias = c.get("bias", True)
    return sum(a * b + (b if bias else 0) for a, b in zip(sizes, sizes[1:]))


def _norm(key):
    # gamma, and beta unless bias=False (LayerNorm's option; AddNorm always has both)
    return lambda c: None if _size(c.get(key)) is None else (
        2 if c.get("bias", True) else 1) * c[key]


def _ffn(c, bias_default=True, norm=0):
    s = _sizes(c, "d_model", "d_ff")
    if s is None:
        return None
    d, f = s
    return 2 * d * f + ((f + d) if c.get("bias", bias_default) else 0) + norm * d


def _gated_ffn(c, bias_default=False):
    s = _sizes(c, "d_model", "d_ff")
    if s is None:
        return None
    d, f = s
    return 3 * d * f + ((2 * f + d) if c.get("bias", bias_default) else 0)


def _gmlp(c):
    s = _sizes(c, "d_in", "d_hidden", "d_ffn", "d_out")
    return None if s is None else s[0] * s[1] + 2 * s[1] * s[2] + s[2] * s[3]


def _gating_unit(c):
    s = _sizes(c, "d_ffn", "seq_len")
    return None if s is None else s[1] * s[1] + s[1] + 2 * (s[0] // 2)


def _gmlp_block(c):
    s = _sizes(c, "d_model", "d_ffn", "seq_len")
    if s is None:
        return None
    d, f, _ = s
    sgu = _gating_unit({"d_ffn": f, "seq_len": s[2]})
    return 2 * d + d * f + f + sgu + (f // 2) * d + d


def _attention(c):
    d = _size(c.get("d_model"))
    return None if d is None else 4 * d * d + (4 * d if c.get("bias", True) else 0)


def _transformer_block(c):
    from ..nn.transformer import GATED_FFNS
    d = _size(c.get("d_model"))
    bias = c.get("bias", True)
    attn = _attention({"d_model": d, "bias": bias})
    mlp_config = {"d_model": d, "d_ff": c.get("d_ff"), "bias": bias}
    mlp = (_gated_ffn if c.get("ffn", "gelu") in GATED_FFNS else _ffn)(mlp_config)
    norms = (4 if c.get("norm_bias", True) else 2) * d if d else 0  # ln_1, ln_2
    return None if attn is None or mlp is None else norms + attn + mlp


def _embedding(c):
    s = _sizes(c, "num_embeddings", "dim")
    return None if s is None else s[0] * s[1]


def _none(c):
    return 0


# Engine module name -> the number of parameter values its configuration implies (its own,
# not its child nodes'); None when a size is not a positive int (the constructor refuses
# it before allocating). tests/training/test_config_bounds.py checks every entry against
# a built module and that every engine module has one.
PARAMETER_COUNTS = {
    "Linear": _linear, "MLP": _mlp, "LayerNorm": _norm("d"), "AddNorm": _norm("d_model"),
    "FFN": _ffn, "FFNSublayer": lambda c: _ffn({**c, "bias": True}, norm=2),
    "GatedFFN": _gated_ffn, "GMLP": _gmlp, "ChannelGatedMLP": _gmlp,
    "SpatialGatingUnit": _gating_unit, "GMLPBlock": _gmlp_block,
    "SpatialGMLPBlock": _gmlp_block, "MultiHeadAttention": _attention,
    "TransformerBlock": _transformer_block, "Embedding": _embedding,
    **{name: _none for name in ("Sequential", "Identity", "Dropout", "Activation", "ReLU",
                                "LeakyReLU", "GELU", "SiLU", "Sigmoid", "Tanh", "Softmax",
                                "LogSoftmax", "MSELoss", "CrossEntropyLoss")},
}


def _is_node(v) -> bool:
    return isinstance(v, dict) and set(v) == {"type", "config"} and isinstance(v["type"], str)


def _walk(node):
    """Every node of the tree under ``node`` and, per node, the plain (non-node) values of
    its config; iterative (a deep tree cannot exhaust the stack)."""
    stack = [node]
    while stack:
        v = stack.pop()
        if _is_node(v):
            plain = []
            stack.extend(_children(v["config"], plain))
            yield v, plain
        elif isinstance(v, (list, dict)):
            stack.extend(v.values() if isinstance(v, dict) else v)


def _children(config, plain: list) -> list:
    """The node values under ``config``; its other values are appended to ``plain``."""
    out, stack = [], [config]
    while stack:
        v = stack.pop()
        if _is_node(v):
            out.append(v)
        elif isinstance(v, dict):
            stack.extend(v.values())
        elif isinstance(v, list):
            stack.extend(v)
        else:
            plain.append(v)
    return out


def implied_parameters(node, limit_modules: int = None):
    """``(known, unknown)``: the parameter values the engine modules of ``node`` imply, and
    the plain values of the nodes that cannot be counted (a class without an entry, a size
    that is not a positive int). CheckpointError-free: the caller words the refusal."""
    known, unknown, count = 0, [], 0
    for n, plain in _walk(node):
        count += 1
        if limit_modules is not None and count > limit_modules:
            return None, count
        fn = PARAMETER_COUNTS.get(n["type"])
        c = fn(n["config"]) if fn is not None and isinstance(n["config"], dict) else None
        if c is None:
            unknown.extend(plain)
        else:
            known += c
    return known, unknown


def check_config_fits(path: str, node, shapes) -> None:
    """CheckpointError (naming ``path``) unless the configuration ``node`` fits the stored
    parameter ``shapes`` (an iterable of shape tuples): at most ``max_modules`` modules, no
    more parameter values implied than stored, and every integer setting of a module that
    cannot be counted no larger than the values stored (or 2**20, for a small file)."""
    shapes = list(shapes)
    stored = sum(math.prod(s) for s in shapes)
    cap = max_modules(len(shapes))
    known, unknown = implied_parameters(node, cap)
    if known is None:
        raise CheckpointError(f"{path}: the model configuration holds more than {cap} modules "
                              f"for {len(shapes)} stored parameter arrays")
    if known > stored:  # (fewer is left to load's shape checks: a tied weight stored twice)
        raise CheckpointError(f"{path}: the model configuration implies {known} parameter "
                              f"values, the file holds {stored}")
    bound = max(stored, 1 << 20)
    big = [v for v in unknown if type(v) is int and abs(v) > bound]
    if big:
        raise CheckpointError(f"{path}: the model configuration holds the integer {big[0]}, "
                              f"larger than the {stored} parameter values the file holds")

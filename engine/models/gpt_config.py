"""A GPT's stored configuration (``GPT.get_config``) checked as untrusted input before
anything is built: the type and range of every field, then the parameters it implies
against the arrays the file holds (their count, then each shape), all with Python integer
arithmetic. So an edited header cannot make ``load_model`` allocate a model the file does
not hold: ``d_model=10**9`` is a ValueError here, never a MemoryError.
"""
from __future__ import annotations

import math

from .._checks import check_bool, check_choice, check_positive_int, check_real
from ..nn.layers import check_activation
from ..nn.transformer import GATED_FFNS

__all__ = ["check_gpt_config", "gpt_parameter_shapes", "check_against_arrays", "build_gpt"]

_SIZES = ("vocab_size", "block_size", "n_layer", "n_head", "d_model", "d_ff")
_FLAGS = ("bias", "tie_weights", "checkpoint")
_FIELDS = _SIZES + _FLAGS + ("ffn", "dropout", "eps", "dtype")


def check_gpt_config(config) -> dict:
    """``config`` (a dict of GPT's keyword arguments, as ``GPT.get_config`` returns) with every
    field checked: TypeError/ValueError naming the first bad one. Every field must be
    present (a stored configuration is complete) and none other."""
    if not isinstance(config, dict):
        raise TypeError(f"GPT config: expected a dict, got {type(config).__name__}")
    missing = [k for k in _FIELDS if k not in config]
    unknown = [k for k in config if k not in _FIELDS]
    if missing or unknown:
        raise ValueError(f"GPT config: missing fields {missing}, unknown fields {unknown}")
    c = dict(config)
    for k in _SIZES:
        c[k] = check_positive_int(f"GPT config {k}", config[k])
    for k in _FLAGS:
        c[k] = check_bool(f"GPT config {k}", config[k])
    if c["d_model"] % c["n_head"]:
        raise ValueError(f"GPT config: d_model = {c['d_model']} is not a multiple of n_head = "
                         f"{c['n_head']}")
    if config["ffn"] not in GATED_FFNS:
        check_activation("GPT config ffn", config["ffn"])
    c["dropout"] = check_real("GPT config dropout", config["dropout"], 0.0, 1.0, high_open=True)
    c["eps"] = check_real("GPT config eps", config["eps"], 0.0, low_open=True)
    check_choice("GPT config dtype", config["dtype"], ("float32", "float64"))
    return c


def _arrays_per_layer(c) -> int:
    ffn = 3 if c["ffn"] in GATED_FFNS else 2   # W_gate, W_up, W_down or W_in, W_out
    return 4 + ffn + (4 + ffn if c["bias"] else 0)  # ln gains, W_qkv, W_o (+ their biases)


def _array_count(c) -> int:
    return 2 + c["n_layer"] * _arrays_per_layer(c) + (2 if c["bias"] else 1) \
        + (0 if c["tie_weights"] else 1)


def gpt_parameter_shapes(c) -> dict:
    """``{parameter name: shape}`` of ``GPT(**c)`` for a checked configuration ``c``, in
    Python integers (nothing allocated beyond the dict)."""
    v, d, f = c["vocab_size"], c["d_model"], c["d_ff"]
    bias = c["bias"]
    out = {"wte.W": (v, d), "wpe.W": (c["block_size"], d)}
    if c["ffn"] in GATED_FFNS:
        mlp = [("W_gate", (d, f)), ("W_up", (d, f)), ("b_gate", (f,)), ("b_up", (f,)),
               ("W_down", (f, d)), ("b_down", (d,))]
    else:
        mlp = [("W_in", (d, f)), ("b1", (f,)), ("W_out", (f, d)), ("b2", (d,))]
    layer = ([("ln_1.gamma", (d,)), ("ln_1.beta", (d,)), ("attn.W_qkv", (d, 3 * d)),
              ("attn.b_qkv", (3 * d,)), ("attn.W_o", (d, d)), ("attn.b_o", (d,)),
              ("ln_2.gamma", (d,)), ("ln_2.beta", (d,))]
             + [("mlp." + n, s) for n, s in mlp])
    layer = [(n, s) for n, s in layer if bias or len(s) == 2 or n.endswith("gamma")]
    for i in range(c["n_layer"]):
        out.update((f"h.{i}.{n}", s) for n, s in layer)
    out["ln_f.gamma"] = (d,)
    if bias:
        out["ln_f.beta"] = (d,)
    if not c["tie_weights"]:
        out["lm_head.W"] = (d, v)
    return out


def check_against_arrays(c, stored: dict) -> None:
    """ValueError unless the checked configuration ``c`` implies the parameters ``stored``
    (``{name: shape}`` of the file's arrays): the same count first (so a huge n_layer is
    refused before its names are listed), then every shape by name. A file under PyTorch's
    names (a .safetensors, tied weights under two keys) is compared by array sizes."""
    n = _array_count(c)
    torch_tied = c["tie_weights"] and len(stored) == n + 1
    if len(stored) != n and not torch_tied:
        raise ValueError(f"GPT config: it implies {n} parameter arrays, the file holds "
                         f"{len(stored)}")
    want = gpt_parameter_shapes(c)
    if set(want) == set(stored):
        for name, shape in want.items():
            if tuple(stored[name]) != shape:
                raise ValueError(f"GPT config: it gives {name} the shape {shape}, the file's "
                                 f"array is {tuple(stored[name])}")
        return
    sizes = [math.prod(s) for s in want.values()]
    if torch_tied:
        sizes.append(c["vocab_size"] * c["d_model"])  # lm_head.weight beside wte.weight
    if sorted(sizes) != sorted(math.prod(s) for s in stored.values()):
        raise ValueError("GPT config: the sizes of the parameters it implies are not those of "
                         "the file's arrays")


def build_gpt(config, stored: dict):
    """A fresh ``GPT`` of a stored ``config`` once it is checked and fits the ``stored``
    parameter shapes (``{name: shape}``); TypeError/ValueError before any allocation."""
    from .gpt import GPT
    c = check_gpt_config(config)
    check_against_arrays(c, stored)
    return GPT(**c)

"""Weights to and from PyTorch: ``to_torch_state_dict`` and ``load_torch_state_dict``.

Each blasnet block has a reference PyTorch module; the state dict uses that module's names
and layouts (``nn.Linear.weight`` is (out, in), blasnet's ``W`` is (in, out): transposed):

    blasnet                      PyTorch reference module                  keys
    Linear(d_in, d_out)          nn.Linear(d_in, d_out)                    weight, bias
    FFN(d, f, act)               nn.Sequential(nn.Linear(d, f), act,       0.weight, 0.bias,
                                               nn.Linear(f, d))            2.weight, 2.bias
    MLP(sizes, activations)      nn.Sequential of nn.Linear and the        0.weight, 0.bias,
                                 activation layers in order (None: no      2.weight, ...
                                 layer; "identity": nn.Identity())
    LayerNorm(d), AddNorm(d)     nn.LayerNorm(d)                           weight, bias
    FFNSublayer(d, f, act)       its children: ffn = the FFN's module,     ffn.0.weight, ...,
                                 norm = nn.LayerNorm(d)                    norm.weight, norm.bias
    GatedFFN(d, f, act)          LLaMA's MLP: gate_proj, up_proj =         gate_proj.weight,
                                 nn.Linear(d, f), down_proj =              up_proj.weight,
                                 nn.Linear(f, d); forward                  down_proj.weight
                                 down_proj(act(gate_proj(x)) * up_proj(x)) (.bias with bias=True)
    Sequential(m0, m1, ...)      nn.Sequential of the children's modules   <i>.<child's keys>

Activations, ``Dropout`` and ``Identity`` have no parameters (PyTorch's ``nn.GELU()``,
``nn.GELU(approximate="tanh")``, ``nn.ReLU()``, ``nn.SiLU()``, ... in the same slots). The
reference modules hold no dropout layers (an FFN's ``dropout`` acts in training only): an
``nn.Dropout`` added to a PyTorch ``nn.Sequential`` shifts the indices of the layers after
it. A module with parameters that is not in the table (``GMLP``, or your own) is a
TypeError.
The arrays are NumPy; ``torch.from_numpy`` or ``safetensors.numpy.save_file`` take them as
they are, and ``load_torch_state_dict`` also takes a torch module's ``state_dict()``.
"""
from __future__ import annotations

from collections import OrderedDict

import numpy as np

from .nn.blocks import FFN, AddNorm, FFNSublayer, LayerNorm
from .nn.gated import GatedFFN
from .nn.layers import MLP, Linear, Sequential
from .nn.module import Module

__all__ = ["to_torch_state_dict", "load_torch_state_dict", "torch_names"]

SUPPORTED = ("Linear", "FFN", "MLP", "LayerNorm", "AddNorm", "FFNSublayer", "GatedFFN",
             "Sequential")


def _linear(prefix: str, w: str, b: str | None):
    out = [(prefix + "weight", w, True)]
    if b is not None:
        out.append((prefix + "bias", b, False))
    return out


def _map(module: Module, tprefix: str, bprefix: str) -> list:
    """``(torch key, blasnet parameter name, transposed)`` for every parameter of ``module``."""
    own = {n for n, _ in module.named_parameters()}
    if isinstance(module, Linear):
        out = _linear(tprefix, bprefix + "W", bprefix + "b" if "b" in own else None)
    elif isinstance(module, FFN):
        out = (_linear(tprefix + "0.", bprefix + "W_in", bprefix + "b1" if "b1" in own else None)
               + _linear(tprefix + "2.", bprefix + "W_out", bprefix + "b2" if "b2" in own else None))
    elif isinstance(module, GatedFFN):
        out = []
        for proj, w, b in (("gate_proj", "W_gate", "b_gate"), ("up_proj", "W_up", "b_up"),
                           ("down_proj", "W_down", "b_down")):
            out += _linear(f"{tprefix}{proj}.", bprefix + w, bprefix + b if b in own else None)
    elif isinstance(module, (LayerNorm, AddNorm)):
        out = [(tprefix + "weight", bprefix + "gamma", False),
               (tprefix + "bias", bprefix + "beta", False)]
    elif isinstance(module, MLP):
        out, slot = [], 0
        for i, act in enumerate(module.reference_activations):
            out += _linear(f"{tprefix}{slot}.", f"{bprefix}{i}.W",
                           f"{bprefix}{i}.b" if f"{i}.b" in own else None)
            slot += 1 if act is None else 2  # Linear, then its activation layer (if any)
    elif isinstance(module, FFNSublayer):
        out = (_map(module.ffn, tprefix + "ffn.", bprefix + "ffn.")
               + _map(module.norm, tprefix + "norm.", bprefix + "norm."))
    elif isinstance(module, Sequential):
        out = []
        for i, child in enumerate(module):
            out += _map(child, f"{tprefix}{i}.", f"{bprefix}{i}.")
    elif not own:
        out = []  # activations, Dropout: nothing to map
    else:
        raise TypeError(f"no PyTorch reference module for {type(module).__name__} (it has "
                        f"parameters {sorted(own)}); supported: {', '.join(SUPPORTED)}")
    # Every parameter of the module must be mapped exactly once (catches renamed parameters).
    mapped = sorted(b[len(bprefix):] for _, b, _ in out)
    if mapped != sorted(own):
        raise TypeError(f"{type(module).__name__}: its parameters {sorted(own)} do not match the "
                        f"PyTorch mapping, which covers {mapped}")
    return out


def torch_names(model: Module) -> list:
    """``(torch key, blasnet name, transposed)`` for each parameter, in blasnet's order."""
    if not isinstance(model, Module):
        raise TypeError(f"model: expected an engine Module, got {type(model).__name__}")
    return _map(model, "", "")


def to_torch_state_dict(model: Module) -> "OrderedDict[str, np.ndarray]":
    """The model's parameters under PyTorch's names, in PyTorch's layouts (C-contiguous
    copies; Linear weights transposed to (out, in)). ``torch_module.load_state_dict(
    {k: torch.from_numpy(v) for k, v in sd.items()}, strict=True)`` accepts it."""
    params = dict(model.named_parameters()) if isinstance(model, Module) else None
    out = OrderedDict()
    for tkey, bname, transposed in torch_names(model):
        a = params[bname].data
        out[tkey] = np.array(a.T if transposed else a, order="C", copy=True)
    return out


def _as_numpy(key: str, v):
    if isinstance(v, np.ndarray):
        return v
    if hasattr(v, "detach") and hasattr(v, "numpy"):  # a torch.Tensor (torch is not imported)
        return v.detach().cpu().numpy()
    raise TypeError(f"state[{key!r}]: expected a numpy.ndarray or a torch.Tensor, got "
                    f"{type(v).__name__}")


def load_torch_state_dict(model: Module, state) -> None:
    """Copy a state dict with PyTorch's names and layouts (numpy arrays or torch tensors) into
    ``model``. Strict: every key of the reference module present and no other, each shape
    PyTorch's and each dtype the model's (no silent casts); if any check fails nothing is
    changed."""
    if not hasattr(state, "keys"):
        raise TypeError(f"state: expected a mapping of name -> array, got {type(state).__name__}")
    names = torch_names(model)
    want = [t for t, _, _ in names]
    missing = [k for k in want if k not in state]
    unexpected = [k for k in state.keys() if k not in set(want)]
    if missing or unexpected:
        raise KeyError(f"load_torch_state_dict: the state does not fit {type(model).__name__}: "
                       f"missing keys {missing}, unexpected keys {unexpected}")
    params = dict(model.named_parameters())
    converted = OrderedDict()
    for tkey, bname, transposed in names:
        v = _as_numpy(tkey, state[tkey])
        p = params[bname].data
        shape = p.shape[::-1] if transposed else p.shape
        if v.shape != shape:
            raise ValueError(f"load_torch_state_dict: {tkey}: expected shape {tuple(shape)} "
                             f"(PyTorch's layout of {bname} {p.shape}), got {tuple(v.shape)}")
        if v.dtype != p.dtype:
            raise TypeError(f"load_torch_state_dict: {tkey}: expected dtype {p.dtype}, got "
                            f"{v.dtype} (no silent casts)")
        converted[bname] = np.ascontiguousarray(v.T if transposed else v)
    model.load_state_dict(converted)

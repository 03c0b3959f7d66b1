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
    MultiHeadAttention(d, h)     nn.MultiheadAttention(d, h,               in_proj_weight,
                                 batch_first=True)                         in_proj_bias,
                                                                           out_proj.weight, .bias
    TransformerBlock(d, h, f)    nanoGPT's Block: ln_1, attn.c_attn,       ln_1.weight, ...,
                                 attn.c_proj, ln_2, mlp.c_fc, mlp.c_proj   mlp.c_proj.bias
                                 (a GatedFFN mlp: LLaMA's names under mlp.)
    GPT                          nanoGPT's GPT: transformer.wte, .wpe,     transformer.h.<i>.*,
                                 .h.<i> (Blocks), .ln_f, lm_head           lm_head.weight
                                 (tied: lm_head.weight is wte's weight; both keys are written,
                                 and on load both must be present and equal; bias=False: no
                                 .bias keys, as nanoGPT's GPTConfig(bias=False))

Activations, ``Dropout`` and ``Identity`` have no parameters (PyTorch's ``nn.GELU()``,
``nn.GELU(approximate="tanh")``, ``nn.ReLU()``, ``nn.SiLU()``, ... in the same slots). The
reference modules hold no dropout layers (an FFN's ``dropout`` acts in training only): an
``nn.Dropout`` added to a PyTorch ``nn.Sequential`` shifts the indices of the layers after
it. A module with parameters and no reference module (``GMLP``) is a TypeError.

Each class states its row of this table as ``torch_layout`` (class data, or a property when
it depends on the instance): ``(torch key, parameter, transposed)`` rows, a row skipped when
its parameter is None (an optional bias), and ``(torch prefix, child)`` rows that take the
child's own layout under the prefix; a new block adds its own and needs no edit here.
nanoGPT's own state dicts load as they are: its causal-mask buffers ``transformer.h.<i>.attn.
bias`` (registered only without flash attention, PyTorch < 2.0) are checked to be causal
masks and skipped, and the ``_orig_mod.`` prefix of a ``torch.compile``d model's keys (what
its train.py saves with compile=True) is removed. ``to_torch_state_dict(gpt,
causal_masks=True)`` writes those buffers for such a module. ``gpt_from_nanogpt(
model_args, state)`` builds the GPT a nanoGPT ``ckpt.pt`` describes and loads it.
The arrays are NumPy; ``torch.from_numpy`` or ``safetensors.numpy.save_file`` take them as
they are, and ``load_torch_state_dict`` also takes a torch module's ``state_dict()``.
"""
from __future__ import annotations

from collections import OrderedDict

import numpy as np

from .nn.module import Module

__all__ = ["to_torch_state_dict", "load_torch_state_dict", "torch_names", "supported",
           "gpt_from_nanogpt"]


def supported() -> tuple:
    """The names of the module classes with a PyTorch reference (a ``torch_layout``)."""
    seen, todo = set(), [Module]
    while todo:
        subs = [c for c in todo.pop().__subclasses__() if c not in seen]
        seen.update(subs)
        todo += subs
    return tuple(sorted({c.__name__ for c in seen if getattr(c, "torch_layout", None) is not None
                         and not c.__name__.startswith("_")}))


def _child(module: Module, name: str) -> Module:
    for path, m in module.named_modules():
        if path == name:
            return m
    raise TypeError(f"{type(module).__name__}.torch_layout names a child {name!r} it does not "
                    f"have")


def _map(module: Module, tprefix: str, bprefix: str) -> list:
    """``(torch key, blasnet parameter name, transposed)`` for every parameter of ``module``."""
    own = {n for n, _ in module.named_parameters()}
    layout = getattr(module, "torch_layout", None)
    if layout is None:
        if own:
            raise TypeError(f"no PyTorch reference module for {type(module).__name__} (it has "
                            f"parameters {sorted(own)}); supported: {', '.join(supported())}")
        return []  # activations, Dropout: nothing to map
    out = []
    for row in layout:
        if len(row) == 2:  # (torch prefix, child): the child's own layout under the prefix
            prefix, child = row
            out += _map(_child(module, child), tprefix + prefix, f"{bprefix}{child}.")
        elif row[1] in own:  # (torch key, parameter, transposed); absent: an optional bias
            out.append((tprefix + row[0], bprefix + row[1], row[2]))
    # Every parameter of the module must be mapped exactly once (catches renamed parameters).
    mapped = sorted({b[len(bprefix):] for _, b, _ in out})  # a tied weight has two keys
    if mapped != sorted(own):
        raise TypeError(f"{type(module).__name__}: its parameters {sorted(own)} do not match the "
                        f"PyTorch mapping, which covers {mapped}")
    return out


def torch_names(model: Module) -> list:
    """``(torch key, blasnet name, transposed)`` for each parameter, in blasnet's order."""
    if not isinstance(model, Module):
        raise TypeError(f"model: expected an engine Module, got {type(model).__name__}")
    return _map(model, "", "")


def to_torch_state_dict(model: Module, *, causal_masks: bool = False
                        ) -> "OrderedDict[str, np.ndarray]":
    """The model's parameters under PyTorch's names, in PyTorch's layouts (C-contiguous
    copies; Linear weights transposed to (out, in)). ``torch_module.load_state_dict(
    {k: torch.from_numpy(v) for k, v in sd.items()}, strict=True)`` accepts it.

    ``causal_masks=True`` (a GPT only) adds nanoGPT's ``transformer.h.<i>.attn.bias``
    buffers, lower-triangular ones of shape (1, 1, block_size, block_size), which its
    attention registers when flash attention is off (PyTorch < 2.0): that module's
    ``strict=True`` load needs them; with flash attention it has none."""
    params = dict(model.named_parameters()) if isinstance(model, Module) else None
    names = torch_names(model)
    if causal_masks is not False:
        _check_masks_option(model, causal_masks)
    out = OrderedDict()
    for tkey, bname, transposed in names:
        if causal_masks and tkey.endswith(_C_ATTN):
            n = model.block_size
            out[tkey[:-len(_C_ATTN)] + _MASK] = np.tril(np.ones((n, n), model.dtype))[None, None]
        a = params[bname].data
        out[tkey] = np.array(a.T if transposed else a, order="C", copy=True)
    return out


# nanoGPT's CausalSelfAttention: the c_attn weight, and the causal-mask buffer beside it.
_C_ATTN, _MASK = "attn.c_attn.weight", "attn.bias"
_COMPILED = "_orig_mod."  # key prefix of a torch.compile'd module's state dict


def _check_masks_option(model, causal_masks) -> None:
    from .models.gpt import GPT
    if not isinstance(causal_masks, (bool, np.bool_)):
        raise TypeError(f"causal_masks: expected True or False, got {causal_masks!r}")
    if causal_masks and not isinstance(model, GPT):
        raise ValueError(f"causal_masks: nanoGPT's mask buffers belong to a GPT, got a "
                         f"{type(model).__name__}")


def _nanogpt_buffers(state, want: list) -> dict:
    """``state`` without nanoGPT's non-parameter entries: its ``_orig_mod.`` prefix removed
    when every key has it, and each causal-mask buffer ``<block>.attn.bias`` (beside an
    expected ``<block>.attn.c_attn.weight``) checked to be lower-triangular ones and
    dropped (a mask of any other shape or value is a model this GPT is not)."""
    keys = list(state.keys())
    if keys and all(isinstance(k, str) and k.startswith(_COMPILED) for k in keys):
        state = {k[len(_COMPILED):]: state[k] for k in keys}
    wanted = set(want)
    out = {}
    for k in state.keys():
        if (isinstance(k, str) and k.endswith(_MASK) and k not in wanted
                and k[:-len(_MASK)] + _C_ATTN in wanted):
            m = _as_numpy(k, state[k])
            n = m.shape[-1] if m.ndim == 4 else -1
            if (m.shape != (1, 1, n, n)
                    or not np.array_equal(m[0, 0] != 0, np.tri(n, dtype=bool))):
                raise ValueError(f"load_torch_state_dict: {k}: expected nanoGPT's causal mask "
                                 f"(lower-triangular ones of shape (1, 1, T, T)), got an "
                                 f"array of shape {tuple(m.shape)} that is not one")
            continue
        out[k] = state[k]
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
    changed. nanoGPT's causal-mask buffers and ``_orig_mod.`` prefix are read as the module
    docstring says."""
    if not hasattr(state, "keys"):
        raise TypeError(f"state: expected a mapping of name -> array, got {type(state).__name__}")
    names = torch_names(model)
    want = [t for t, _, _ in names]
    state = _nanogpt_buffers(state, want)
    missing = [k for k in want if k not in state]
    unexpected = [k for k in state.keys() if k not in set(want)]
    if missing or unexpected:
        raise KeyError(f"load_torch_state_dict: the state does not fit {type(model).__name__}: "
                       f"missing keys {missing}, unexpected keys {unexpected}")
    params = dict(model.named_parameters())
    converted, source = OrderedDict(), {}
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
        a = np.ascontiguousarray(v.T if transposed else v)
        if bname in converted and not np.array_equal(converted[bname], a):
            raise ValueError(f"load_torch_state_dict: {tkey} and {source[bname]} are one tied "
                             f"weight ({bname}) in {type(model).__name__} but differ in the "
                             f"state")
        converted[bname], source[bname] = a, tkey
    model.load_state_dict(converted)


# nanoGPT's GPTConfig fields, as its train.py stores them in a checkpoint's "model_args".
_NANOGPT_ARGS = ("n_layer", "n_head", "n_embd", "block_size", "bias", "vocab_size", "dropout")


def gpt_from_nanogpt(model_args, state):
    """A ``GPT`` holding a nanoGPT model: ``model_args`` its ``GPTConfig`` fields (the
    ``"model_args"`` of a ``ckpt.pt`` its train.py wrote), ``state`` its state dict (the
    ``"model"`` entry; torch tensors or numpy arrays, float32 or float64). The head is tied
    to the token embedding, as nanoGPT's always is; every check of ``load_torch_state_dict``
    applies."""
    from .models.gpt import GPT
    if not isinstance(model_args, dict):
        raise TypeError(f"model_args: expected nanoGPT's dict of GPTConfig fields, got "
                        f"{type(model_args).__name__}")
    missing = [k for k in _NANOGPT_ARGS if k not in model_args]
    if missing:
        raise ValueError(f"model_args: missing nanoGPT's GPTConfig fields {missing}")
    if not hasattr(state, "keys"):
        raise TypeError(f"state: expected a mapping of name -> array, got {type(state).__name__}")
    key = next((k for k in state.keys() if str(k).endswith("transformer.wte.weight")), None)
    if key is None:
        raise KeyError("state: no transformer.wte.weight: not a nanoGPT state dict")
    a = model_args
    g = GPT(a["vocab_size"], a["block_size"], a["n_layer"], a["n_head"], a["n_embd"],
            bias=a["bias"], dropout=a["dropout"], dtype=_as_numpy(key, state[key]).dtype)
    load_torch_state_dict(g, state)
    return g

"""Basic layers: ``Linear``, the activation modules, ``Sequential`` and the fused ``MLP``.

Each module checks its input once at the boundary, caches a reference (no copy) to what
backward needs, and writes into work buffers that grow to the largest batch seen; the
numerics are ``kernels.gemm`` and ``kernels.activations`` calls.
"""
from __future__ import annotations

import numpy as np

from kernels import activations as _kact
from kernels.activations import ACTIVATIONS
from kernels.gemm import gemm_unchecked as _gemm
from kernels.gemm import gemv_colsum as _colsum

from .module import (INITS, Module, Parameter, Workspace, as_rows, check_dtype,
                     check_positive_int, init_weight, make_rng)

__all__ = ["INITS", "Linear", "ReLU", "LeakyReLU", "GELU", "SiLU", "Sigmoid", "Tanh", "Identity",
           "Sequential", "MLP"]

# The kernels' hot-path cores (``<name>_unchecked``): no argument checks, the layers check
# at their boundary.
_bias_act = _kact.bias_act_forward_unchecked
_act_bwd = _kact.act_backward_unchecked
_act_cached = _kact.act_backward_cached_unchecked
# relu-like activations read their derivative off z in backward (one cheap pass); every other
# activation caches act'(z) over z in the forward pass (where it costs a few passes of the
# ones act(z) needs anyway), so backward is one multiply.
_FROM_Z = ("relu", "leaky_relu")



# ----------------------------------------------------------------------------- helpers
def _rows_any(x, dtype, name: str = "x"):
    """``as_rows`` for modules that accept any feature size d: ``(N, d)`` or ``(B, T, d)``."""
    if isinstance(x, np.ndarray) and x.ndim in (2, 3):
        return as_rows(x, x.shape[-1], dtype, name)
    if not isinstance(x, np.ndarray):
        raise TypeError(f"{name}: expected a numpy.ndarray, got {type(x).__name__}")
    if x.dtype != dtype:
        raise TypeError(f"{name}: expected dtype {np.dtype(dtype)}, got {x.dtype}")
    raise ValueError(f"{name}: expected shape (N, d) or (B, T, d), got {x.shape}")


def _rows_like(dy, shape: tuple, dtype, name: str = "dy"):
    """Check a backward input against the forward output's shape; view it as rows."""
    if not isinstance(dy, np.ndarray):
        raise TypeError(f"{name}: expected a numpy.ndarray, got {type(dy).__name__}")
    if dy.dtype != dtype:
        raise TypeError(f"{name}: expected dtype {np.dtype(dtype)}, got {dy.dtype}")
    if dy.shape != shape:
        raise ValueError(f"{name}: expected shape {shape} (the forward output's), got {dy.shape}")
    if not dy.flags.c_contiguous:
        raise ValueError(f"{name}: expected a C-contiguous array, got strides {dy.strides} "
                         f"for shape {dy.shape} (use np.ascontiguousarray)")
    return dy.reshape(-1, shape[-1]) if dy.ndim == 3 else dy


def _not_before_forward(module) -> RuntimeError:
    # The rule of every engine module (blocks included), as PyTorch's default: a forward
    # allows one backward; its cache is released by that backward.
    return RuntimeError(f"{type(module).__name__}.backward: no forward pass to differentiate "
                        f"(call forward before backward; each forward allows one backward)")


def _no_overlap(module, x2, buf) -> None:
    # BLAS would read what it overwrites; this happens when a module is fed its own output.
    if np.may_share_memory(x2, buf):
        raise ValueError(f"x: overlaps the output buffer of this {type(module).__name__} "
                         f"(feed it a copy of its own output)")


# ----------------------------------------------------------------------------- Linear
class Linear(Module):
    """``y = x @ W + b`` with ``W`` of shape (d_in, d_out) and ``b`` (d_out,) starting at zero.

    ``init``: "he" N(0, 2/d_in), "xavier" N(0, 2/(d_in+d_out)), "normal" N(0, 0.02^2),
    "zeros". The bias is fused into the GEMM: the output rows are filled with ``b`` and
    gemm runs with beta=1 (measured no slower than gemm alone, faster than a second pass).
    """

    def __init__(self, d_in: int, d_out: int, bias: bool = True, init: str = "he",
                 dtype=np.float32, rng=None):
        super().__init__()
        self.d_in = check_positive_int("d_in", d_in)
        self.d_out = check_positive_int("d_out", d_out)
        if init not in INITS:
            raise ValueError(f"init: expected one of {INITS}, got {init!r}")
        self.dtype = check_dtype(dtype)
        self.init = init
        self.W = Parameter(init_weight(self.d_in, self.d_out, init, self.dtype, make_rng(rng)))
        self.b = Parameter(np.zeros(self.d_out, self.dtype)) if bias else None
        self._ws = Workspace(self.dtype)
        self._x = None  # (N, d_in) reference to the last input, for backward
        self._lead = None  # leading shape of the last input

    def forward(self, x):
        x2, lead = as_rows(x, self.d_in, self.dtype, "x")
        n = x2.shape[0]
        y = self._ws.get("y", n, self.d_out)  # (N, d_out)
        if n:
            _no_overlap(self, x2, y)
            if self.b is not None:
                np.copyto(y, self.b.data)  # y = b, then y += x @ W inside gemm
                _gemm(y, x2, self.W.data, False, False, 1.0, 1.0)
            else:
                _gemm(y, x2, self.W.data, False, False, 1.0, 0.0)
        self._x = x2
        self._lead = lead
        return y if x.ndim == 2 else y.reshape(*lead, self.d_out)

    def backward(self, dy):
        x2 = self._x
        if x2 is None:
            raise _not_before_forward(self)
        lead = self._lead
        dy2 = _rows_like(dy, (*lead, self.d_out), self.dtype)
        n = x2.shape[0]
        dx = self._ws.get("dx", n, self.d_in)  # (N, d_in)
        if n:
            _gemm(self.W.grad, x2, dy2, True, False, 1.0, 1.0)  # dW += x^T dy
            if self.b is not None:
                _colsum(self.b.grad, dy2, 1.0)  # db += dy.sum(0) via gemv
            _gemm(dx, dy2, self.W.data, False, True, 1.0, 0.0)  # dx = dy W^T
        self._x = None
        return dx if len(lead) == 1 else dx.reshape(*lead, self.d_in)

    def extra_repr(self) -> str:
        return f"d_in={self.d_in}, d_out={self.d_out}, bias={self.b is not None}"


# ----------------------------------------------------------------------------- activations
class _Activation(Module):
    """Element-wise ``h = act(z)`` over inputs of any feature size (kernels.activations)."""

    _act = "identity"

    def __init__(self, dtype=np.float32):
        super().__init__()
        self.dtype = check_dtype(dtype)
        self.negative_slope = 0.01  # only read by leaky_relu
        self._ws = Workspace(self.dtype)
        self._z = None  # (N, d) reference to the last input
        self._h = None  # (N, d) the last output (a work buffer), passed to the backward kernel
        self._shape = None  # shape of the last input

    def forward(self, x):
        z, _ = _rows_any(x, self.dtype, "x")
        h = self._ws.get("h", *z.shape)  # (N, d)
        if z.size:
            _no_overlap(self, z, h)
            _bias_act(h, z, None, self._act, self.negative_slope)
        self._z = z
        self._h = h
        self._shape = x.shape
        return h if x.ndim == 2 else h.reshape(x.shape)

    def backward(self, dy):
        z = self._z
        if z is None:
            raise _not_before_forward(self)
        dh = _rows_like(dy, self._shape, self.dtype)
        dz = self._ws.get("dz", *z.shape)  # (N, d)
        if z.size:
            _act_bwd(dz, dh, z, self._act, self.negative_slope, self._h)
        self._z = None
        return dz if dy.ndim == 2 else dz.reshape(self._shape)


class ReLU(_Activation):
    """``max(z, 0)``."""
    _act = "relu"


class LeakyReLU(_Activation):
    """``z if z > 0 else negative_slope * z``."""
    _act = "leaky_relu"

    def __init__(self, negative_slope: float = 0.01, dtype=np.float32):
        super().__init__(dtype)
        self.negative_slope = float(negative_slope)

    def extra_repr(self) -> str:
        return f"negative_slope={self.negative_slope}"


class GELU(_Activation):
    """``z * Phi(z)`` (``approximate="none"``, erf) or its tanh approximation (``"tanh"``)."""

    def __init__(self, approximate: str = "none", dtype=np.float32):
        super().__init__(dtype)
        if approximate not in ("none", "tanh"):
            raise ValueError(f"approximate: expected 'none' or 'tanh', got {approximate!r}")
        self.approximate = approximate
        self._act = "gelu" if approximate == "none" else "gelu_tanh"

    def extra_repr(self) -> str:
        return f"approximate={self.approximate!r}"


class SiLU(_Activation):
    """``z * sigmoid(z)``."""
    _act = "silu"


class Sigmoid(_Activation):
    """``1 / (1 + exp(-z))``."""
    _act = "sigmoid"


class Tanh(_Activation):
    """``tanh(z)``."""
    _act = "tanh"


class Identity(_Activation):
    """Returns its input itself (no copy) and ``dy`` itself as the input gradient."""

    def forward(self, x):
        z, _ = _rows_any(x, self.dtype, "x")
        self._z = z
        self._shape = x.shape
        return x

    def backward(self, dy):
        if self._z is None:
            raise _not_before_forward(self)
        _rows_like(dy, self._shape, self.dtype)
        self._z = None
        return dy


# ----------------------------------------------------------------------------- Sequential
class Sequential(Module):
    """Chains modules: forward in order, backward in reverse. Children are named "0", "1",
    ... so parameters read "0.W", "0.b", "2.W", ...; supports len, indexing and iteration.
    A module instance may appear only once: its cache holds one forward at a time."""

    def __init__(self, *modules):
        super().__init__()
        for i, m in enumerate(modules):
            if not isinstance(m, Module):
                raise TypeError(f"modules[{i}]: expected a Module, got {type(m).__name__}")
            setattr(self, str(i), m)
        self._seq = tuple(modules)
        self._rev = tuple(reversed(modules))
        self._ready = False  # set by the first forward

    def forward(self, x):
        for m in self._seq:
            x = m.forward(x)
        self._ready = True
        return x

    def backward(self, dy):
        if not self._ready:
            raise _not_before_forward(self)
        for m in self._rev:
            dy = m.backward(dy)
        self._ready = False
        return dy

    def __len__(self) -> int:
        return len(self._seq)

    def __getitem__(self, i):
        if isinstance(i, slice):
            return Sequential(*self._seq[i])
        return self._seq[i]

    def __iter__(self):
        return iter(self._seq)


# ----------------------------------------------------------------------------- MLP
class MLP(Module):
    """Seed 004's multilayer perceptron: ``len(sizes) - 1`` Linear layers, each followed by its
    activation (``None`` = linear output). Default: relu on hidden layers, linear output.

    Parameters are the Linear children's, named "0.W", "0.b", "1.W", ... (index = layer).
    The forward pass does not call the children: per layer it fills z's rows with b, runs
    one GEMM with beta=1 (the bias rides in it) and one blocked ``h = act(z)`` pass. The bias
    is not added in the activation pass because NumPy (2.4) allocates a 32 KiB ufunc buffer
    for every broadcasting ``z += b``; the fill is allocation-free and measured as fast.
    """

    def __init__(self, sizes, activations=None, init: str = "he", bias: bool = True,
                 negative_slope: float = 0.01, dtype=np.float32, rng=None):
        super().__init__()
        try:
            sizes = [check_positive_int(f"sizes[{i}]", s) for i, s in enumerate(sizes)]
        except TypeError:
            raise TypeError(f"sizes: expected a sequence of ints, got {sizes!r}") from None
        if len(sizes) < 2:
            raise ValueError(f"sizes: expected at least 2 sizes (input, output), got {sizes}")
        n_layers = len(sizes) - 1
        if activations is None:
            activations = ["relu"] * (n_layers - 1) + [None]
        activations = list(activations)
        if len(activations) != n_layers:
            raise ValueError(f"activations: expected {n_layers} entries (one per layer, "
                             f"len(sizes) - 1), got {len(activations)}: {activations}")
        for i, a in enumerate(activations):
            if a is not None and a not in ACTIVATIONS:
                raise ValueError(f"activations[{i}]: expected None or one of {ACTIVATIONS}, got {a!r}")
        self.sizes = sizes
        self.activations = activations
        self.negative_slope = float(negative_slope)
        self.dtype = check_dtype(dtype)
        rng = make_rng(rng)
        linears = []
        for i in range(n_layers):
            lin = Linear(sizes[i], sizes[i + 1], bias, init, self.dtype, rng)
            setattr(self, str(i), lin)
            linears.append(lin)
        self._linears = tuple(linears)
        # "identity" needs no kernel pass: treat it as a linear layer.
        self._acts = tuple(None if a in (None, "identity") else a for a in activations)
        self._ws = Workspace(self.dtype)
        self._keys = tuple((f"z{i}", f"h{i}", f"dz{i}", f"dh{i}") for i in range(n_layers))
        # Per layer: True when forward caches act'(z) over z (see _FROM_Z).
        self._cache = tuple(a is not None and a not in _FROM_Z for a in self._acts)
        # Per-layer caches for backward (references into the workspace or the input).
        self._ins = [None] * n_layers  # input of layer i, (N, sizes[i])
        self._zs = [None] * n_layers  # pre-activation of layer i or its act', (N, sizes[i+1])
        self._outs = [None] * n_layers  # output of layer i, (N, sizes[i+1])
        self._lead = None

    def forward(self, x):
        x2, lead = as_rows(x, self.sizes[0], self.dtype, "x")
        n = x2.shape[0]
        ws, slope = self._ws, self.negative_slope
        ins, zs, outs = self._ins, self._zs, self._outs
        h = x2
        for i, lin in enumerate(self._linears):
            kz, kh = self._keys[i][0], self._keys[i][1]
            act = self._acts[i]
            b = lin.b.data if lin.b is not None else None
            z = ws.get(kz, n, lin.d_out)  # (N, d_out) pre-activation, cached
            out = z if act is None else ws.get(kh, n, lin.d_out)  # (N, d_out) activation
            if n:
                if i == 0:
                    _no_overlap(self, x2, z)
                if b is not None:
                    np.copyto(z, b)  # z = b, then z += h @ W inside gemm
                    _gemm(z, h, lin.W.data, False, False, 1.0, 1.0)
                else:
                    _gemm(z, h, lin.W.data, False, False, 1.0, 0.0)
                if act is not None:  # out = act(z) (and z = act'(z)), one blocked pass
                    _bias_act(out, z, None, act, slope, z if self._cache[i] else None)
            ins[i], zs[i], outs[i] = h, z, out
            h = out
        self._lead = lead
        return h if x.ndim == 2 else h.reshape(*lead, self.sizes[-1])

    def backward(self, dy):
        lead = self._lead
        if lead is None:
            raise _not_before_forward(self)
        dh = _rows_like(dy, (*lead, self.sizes[-1]), self.dtype)
        n = dh.shape[0]
        ws, slope = self._ws, self.negative_slope
        top = len(self._linears) - 1
        for i in range(top, -1, -1):
            lin = self._linears[i]
            kdz, kdh = self._keys[i][2], self._keys[i][3]
            act = self._acts[i]
            dx = ws.get(kdh, n, lin.d_in)  # (N, d_in) gradient w.r.t. the layer input
            if n:
                if act is None:
                    dz = dh
                else:
                    # dh is our own buffer below the top layer: overwrite it in place; the
                    # caller's dy (top layer) is never written.
                    dz = dh if i < top else ws.get(kdz, n, lin.d_out)  # (N, d_out)
                    if self._cache[i]:
                        _act_cached(dz, dh, self._zs[i])  # zs[i] holds act'(z)
                    else:
                        _act_bwd(dz, dh, self._zs[i], act, slope, self._outs[i])
                _gemm(lin.W.grad, self._ins[i], dz, True, False, 1.0, 1.0)  # dW += h^T dz
                if lin.b is not None:
                    _colsum(lin.b.grad, dz, 1.0)  # db += dz.sum(0)
                _gemm(dx, dz, lin.W.data, False, True, 1.0, 0.0)  # dh_prev = dz W^T
            dh = dx
        self._lead = None
        return dh if len(lead) == 1 else dh.reshape(*lead, self.sizes[0])

    def __len__(self) -> int:
        return len(self._linears)

    def __getitem__(self, i) -> Linear:
        return self._linears[i]

    def extra_repr(self) -> str:
        return f"sizes={self.sizes}, activations={self.activations}"

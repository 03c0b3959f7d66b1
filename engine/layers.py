"""Basic layers: ``Linear`` (with an optional fused activation), the activation modules,
``Sequential`` and ``MLP`` (a ``Sequential`` of ``Linear`` layers).

Each follows the module protocol of ``engine.module``: the base class checks arguments and
overlaps; ``_forward``/``_backward`` run ``kernels.ops`` on work buffers that grow to the
largest batch seen.
"""
from __future__ import annotations

import numpy as np

from kernels import ops
from kernels.activations import ACTIVATIONS, REGISTRY

from .module import (INITS, Module, Parameter, _rows_of, check_float, check_positive_int,
                     init_weight, make_rng)

__all__ = ["INITS", "Linear", "Activation", "ReLU", "LeakyReLU", "GELU", "SiLU", "Sigmoid",
           "Tanh", "Identity", "Sequential", "MLP", "check_activation", "sign_from_output"]


def check_activation(name: str, activation) -> str:
    """``activation`` if it names a registered activation, else ValueError naming ``name``."""
    if not isinstance(activation, str) or activation not in ACTIVATIONS:
        raise ValueError(f"{name}: expected one of {ACTIVATIONS}, got {activation!r}")
    return activation


def sign_from_output(activation: str, negative_slope: float = 0.01) -> bool:
    """Whether backward can read the sign of z from act(z), so the activation may run in
    place on its pre-activation buffer (the registry's flag; a leaky_relu with a negative
    slope flips the sign)."""
    if activation == "leaky_relu" and negative_slope < 0:
        return False
    return REGISTRY[activation].sign_from_output


def _check_slope(negative_slope) -> float:
    return check_float("negative_slope", negative_slope)


# ----------------------------------------------------------------------------- Linear
class Linear(Module):
    """``y = act(x @ W + b)`` with ``W`` of shape (d_in, d_out), ``b`` (d_out,) starting at zero
    and ``activation`` None (linear) or any registered activation, fused into one pass.

    ``init``: "he" N(0, 2/d_in), "xavier" N(0, 2/(d_in+d_out)), "normal" N(0, 0.02^2),
    "zeros". The bias rides in the GEMM: the output rows are filled with ``b`` (plus the
    residual, when given) and gemm accumulates with beta=1.
    """

    fuses_dx_acc = True

    def __init__(self, d_in: int, d_out: int, bias: bool = True, init: str = "he",
                 dtype=np.float32, rng=None, activation=None, negative_slope: float = 0.01):
        super().__init__(dtype)
        self.d_in = check_positive_int("d_in", d_in)
        self.d_out = check_positive_int("d_out", d_out)
        if init not in INITS:
            raise ValueError(f"init: expected one of {INITS}, got {init!r}")
        if activation == "identity":
            activation = None
        if activation is not None:
            check_activation("activation", activation)
        self.activation = activation
        self.negative_slope = _check_slope(negative_slope)
        self.init = init
        self.in_features = self.d_in
        self.fuses_residual = activation is None
        # relu-like: act runs in place over z; others cache act'(z) over z.
        self._inplace = (activation is not None
                         and sign_from_output(activation, self.negative_slope))
        self.W = Parameter(init_weight(self.d_in, self.d_out, init, self.dtype, make_rng(rng)))
        self.b = Parameter(np.zeros(self.d_out, self.dtype)) if bias else None
        self._c.x = None  # (N, d_in) the last input, by reference
        self._c.z = None  # (N, d_out) act(z) (in place) or act'(z), for backward

    def out_features(self, d_in: int) -> int:
        return self.d_out

    def _forward(self, x2, res2):
        n = x2.shape[0]
        ws, act = self._ws, self.activation
        z = ws.get("z", n, self.d_out)  # (N, d_out) x W + b (+ residual)
        y = z if act is None or self._inplace else ws.get("h", n, self.d_out)  # (N, d_out)
        if n:
            b = self.b
            if b is None and res2 is None:
                ops.gemm(z, x2, self.W.data, False, False, 1.0, 0.0)
            else:
                ops.fill_rows(z, None if b is None else b.data, res2)
                ops.gemm(z, x2, self.W.data, False, False, 1.0, 1.0)
            if act is not None:
                ops.bias_act(y, z, None, act, self.negative_slope,
                             None if self._inplace else z)
        self._c.x, self._c.z = x2, z
        return y

    def _backward(self, dy2, acc2):
        n, ws, act = dy2.shape[0], self._ws, self.activation
        if act is None:
            dz = dy2
        else:
            dz = ws.get("dz", n, self.d_out)  # (N, d_out)
            if n:
                if self._inplace:
                    ops.act_backward(dz, dy2, self._c.z, act, self.negative_slope, self._c.z)
                else:
                    ops.act_backward_cached(dz, dy2, self._c.z)
        dx = acc2 if acc2 is not None else ws.get("dx", n, self.d_in)  # (N, d_in)
        if n:
            ops.gemm(self.W.grad, self._c.x, dz, True, False, 1.0, 1.0)  # dW += x^T dz
            if self.b is not None:
                ops.colsum(self.b.grad, dz, 1.0)                        # db += dz.sum(0)
            ops.gemm(dx, dz, self.W.data, False, True, 1.0, 0.0 if acc2 is None else 1.0)
        self._c.x = None
        return dx

    def extra_repr(self) -> str:
        act = "" if self.activation is None else f", activation={self.activation!r}"
        return f"d_in={self.d_in}, d_out={self.d_out}, bias={self.b is not None}{act}"


# ----------------------------------------------------------------------------- activations
class Activation(Module):
    """Element-wise ``h = act(z)`` over inputs of any feature size, for any registered
    activation name (kernels.activations); ``negative_slope`` is read by leaky_relu."""

    def __init__(self, activation: str = "relu", negative_slope: float = 0.01,
                 dtype=np.float32):
        super().__init__(dtype)
        self.activation = check_activation("activation", activation)
        self.negative_slope = _check_slope(negative_slope)
        self._c.z = None  # (N, d) the last input, by reference
        self._c.h = None  # (N, d) the last output (a work buffer)

    def _forward(self, z2, res2):
        h = self._ws.get("h", *z2.shape)  # (N, d)
        if z2.size:
            ops.bias_act(h, z2, None, self.activation, self.negative_slope, None)
        self._c.z, self._c.h = z2, h
        return h

    def _backward(self, dh2, acc2):
        dz = self._ws.get("dz", *dh2.shape)  # (N, d)
        if dh2.size:
            ops.act_backward(dz, dh2, self._c.z, self.activation, self.negative_slope, self._c.h)
        self._c.z = None
        return dz

    def extra_repr(self) -> str:
        slope = f", negative_slope={self.negative_slope}" if self.activation == "leaky_relu" else ""
        return f"{self.activation!r}{slope}"


class ReLU(Activation):
    """``max(z, 0)``."""

    def __init__(self, dtype=np.float32):
        super().__init__("relu", dtype=dtype)


class LeakyReLU(Activation):
    """``z if z > 0 else negative_slope * z``."""

    def __init__(self, negative_slope: float = 0.01, dtype=np.float32):
        super().__init__("leaky_relu", negative_slope, dtype)


class GELU(Activation):
    """``z * Phi(z)`` (``approximate="none"``, erf) or its tanh approximation (``"tanh"``)."""

    def __init__(self, approximate: str = "none", dtype=np.float32):
        if approximate not in ("none", "tanh"):
            raise ValueError(f"approximate: expected 'none' or 'tanh', got {approximate!r}")
        super().__init__("gelu" if approximate == "none" else "gelu_tanh", dtype=dtype)
        self.approximate = approximate


class SiLU(Activation):
    """``z * sigmoid(z)``."""

    def __init__(self, dtype=np.float32):
        super().__init__("silu", dtype=dtype)


class Sigmoid(Activation):
    """``1 / (1 + exp(-z))``."""

    def __init__(self, dtype=np.float32):
        super().__init__("sigmoid", dtype=dtype)


class Tanh(Activation):
    """``tanh(z)``."""

    def __init__(self, dtype=np.float32):
        super().__init__("tanh", dtype=dtype)


class Identity(Module):
    """Returns its input itself (no copy) and ``dy`` itself as the input gradient."""

    def _forward(self, x2, res2):
        return x2

    def _backward(self, dy2, acc2):
        return dy2


# ----------------------------------------------------------------------------- Sequential
class Sequential(Module):
    """Chains modules: forward in order, backward in reverse. Children are named "0", "1",
    ... so parameters read "0.W", "0.b", "2.W", ...; supports len, indexing and iteration.
    A module instance may appear only once (its cache holds one forward at a time).
    ``residual`` goes to the last child, ``dx_acc`` to the first."""

    def __init__(self, *modules):
        dtypes = {m.dtype for m in modules if isinstance(m, Module)}
        super().__init__(dtypes.pop() if len(dtypes) == 1 else np.float32)
        seen = {}
        for i, m in enumerate(modules):
            if not isinstance(m, Module):
                raise TypeError(f"modules[{i}]: expected a Module, got {type(m).__name__}")
            if id(m) in seen:
                raise ValueError(f"modules[{i}]: the same {type(m).__name__} instance is already "
                                 f"modules[{seen[id(m)]}]; a module caches one forward at a "
                                 f"time, so build a second instance")
            seen[id(m)] = i
        for i, m in enumerate(modules):  # the same instance inside two children, too
            for name, sub in list(m.named_modules())[1:]:
                if id(sub) in seen:
                    raise ValueError(f"modules[{i}]: its child {name} is the same "
                                     f"{type(sub).__name__} instance as modules[{seen[id(sub)]}]"
                                     f"; a module caches one forward at a time, so build a "
                                     f"second instance")
                seen[id(sub)] = i
        for i, m in enumerate(modules):
            setattr(self, str(i), m)
        self._seq = tuple(modules)
        self._rev = tuple(reversed(modules))

    def out_features(self, d_in: int) -> int:
        for m in self._seq:
            d_in = m.out_features(d_in)
        return d_in

    def forward(self, x, *, residual=None):
        """Each child's forward in order (``residual`` fused into the last one)."""
        s, seq = self._s, self._seq
        if residual is not None:
            # Checked here, before any child runs: a rejected call changes nothing.
            if not seq:
                raise ValueError("residual: an empty Sequential has no layer to add it in")
            if isinstance(x, np.ndarray) and x.ndim:
                _rows_of(residual, (*x.shape[:-1], self.out_features(x.shape[-1])),
                         self.dtype, "residual")
            if isinstance(residual, np.ndarray):
                self._no_overlap("residual", residual)
        if not seq:
            s.ready = True
            return x
        if isinstance(x, np.ndarray):
            self._no_overlap("x", x)
        # The first child checks x before it changes anything: a rejected x changes nothing.
        y = seq[0].forward(x, residual=residual if len(seq) == 1 else None)
        s.ready = False
        for m in seq[1:-1]:
            y = m.forward(y)
        if len(seq) > 1:
            y = seq[-1].forward(y, residual=residual)
        s.lead, s.in_dim, s.ready = x.shape[:-1], x.shape[-1], True
        return y

    def backward(self, dy, *, dx_acc=None):
        """Each child's backward in reverse order (``dx_acc`` fused into the first one)."""
        s = self._s
        if not s.ready:
            raise self._no_forward()
        if isinstance(dy, np.ndarray):
            self._no_overlap("dy", dy)
        if dx_acc is not None:
            if not self._seq:
                raise ValueError("dx_acc: an empty Sequential has no layer to add it in")
            _rows_of(dx_acc, (*s.lead, s.in_dim), self.dtype, "dx_acc")
            self._no_overlap("dx_acc", dx_acc)
        if self._seq:
            for m in self._rev[:-1]:
                dy = m.backward(dy)
            dy = self._seq[0].backward(dy, dx_acc=dx_acc)
        s.ready = False
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
class MLP(Sequential):
    """Multilayer perceptron: ``len(sizes) - 1`` ``Linear`` layers, each with its fused
    activation (``None`` = linear output). Default: relu on hidden layers, linear output.
    Parameters are named "0.W", "0.b", "1.W", ... (index = layer). ``negative_slope`` is
    one float for every leaky_relu layer, or a list with one entry per layer."""

    def __init__(self, sizes, activations=None, init: str = "he", bias: bool = True,
                 negative_slope=0.01, dtype=np.float32, rng=None):
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
            if a is not None:
                check_activation(f"activations[{i}]", a)
        if isinstance(negative_slope, (list, tuple)):
            if len(negative_slope) != n_layers:
                raise ValueError(f"negative_slope: expected {n_layers} entries (one per layer), "
                                 f"got {len(negative_slope)}")
            slopes = [check_float(f"negative_slope[{i}]", s) for i, s in enumerate(negative_slope)]
        else:
            slopes = [_check_slope(negative_slope)] * n_layers
        if init not in INITS:
            raise ValueError(f"init: expected one of {INITS}, got {init!r}")
        rng = make_rng(rng)
        super().__init__(*[Linear(sizes[i], sizes[i + 1], bias, init, dtype, rng,
                                  activations[i], slopes[i]) for i in range(n_layers)])
        self.sizes = sizes
        self.activations = activations
        self.negative_slope = negative_slope

    def __getitem__(self, i):
        return self._seq[i]

    def extra_repr(self) -> str:
        return f"sizes={self.sizes}, activations={self.activations}"

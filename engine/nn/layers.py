"""Basic layers: ``Linear`` (with an optional fused activation), the activation modules,
the row-wise ``Softmax`` / ``LogSoftmax``, ``Sequential`` (optionally with gradient
checkpointing) and ``MLP`` (a ``Sequential`` of ``Linear`` layers).

Each follows the module protocol of ``engine.nn.module``: the base class checks arguments and
overlaps; ``_forward``/``_backward`` run ``kernels.ops`` on work buffers that grow to the
largest batch seen.
"""
from __future__ import annotations

import numpy as np

from kernels import ops
from kernels.activations import ACTIVATIONS, REGISTRY

from .module import (INITS, SKIP_DX, Module, Parameter, check_float, check_init,
                     check_positive_int, init_weight, make_rng)

__all__ = ["INITS", "Linear", "Activation", "ReLU", "LeakyReLU", "GELU", "SiLU", "Sigmoid",
           "Tanh", "Identity", "Softmax", "LogSoftmax", "check_activation",
           "sign_from_output", "ROWWISE_ACTIVATIONS"]

# Activations over a whole row (the last axis) rather than per element: not entries of the
# element-wise registry (kernels.activations), but accepted by Linear and MLP as their
# activation and available as the layers Softmax / LogSoftmax.
ROWWISE_ACTIVATIONS = ("softmax", "log_softmax")


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
    and ``activation`` None (linear), any registered activation (fused into one pass), or a
    row-wise one, "softmax" / "log_softmax" (over the d_out outputs of each row).

    ``init``: "he" N(0, 2/d_in), "xavier" N(0, 2/(d_in+d_out)), "normal" N(0, 0.02^2),
    "zeros". The bias rides in the GEMM: the output rows are filled with ``b`` (plus the
    residual, when given) and gemm accumulates with beta=1.
    """

    fuses_dx_acc = True
    skips_input_grad = True
    torch_layout = (("weight", "W", True), ("bias", "b", False))  # nn.Linear(d_in, d_out)

    def __init__(self, d_in: int, d_out: int, *, bias: bool = True, init: str = "he",
                 dtype=np.float32, rng=None, activation=None, negative_slope: float = 0.01):
        super().__init__(dtype)
        self.d_in = check_positive_int("d_in", d_in)
        self.d_out = check_positive_int("d_out", d_out)
        check_init(init)
        if activation == "identity":
            activation = None
        self._rowwise = activation in ROWWISE_ACTIVATIONS
        if activation is not None and not self._rowwise:
            if not isinstance(activation, str) or activation not in ACTIVATIONS:
                raise ValueError(f"activation: expected None, one of {ACTIVATIONS} or one of "
                                 f"{ROWWISE_ACTIVATIONS}, got {activation!r}")
        self.activation = activation
        self.negative_slope = _check_slope(negative_slope)
        self.init = init
        self.bias = bool(bias)
        self.in_features = self.d_in
        self.fuses_residual = activation is None
        # relu-like: act runs in place over z; others cache act'(z) over z; row-wise ones
        # keep their output (their backward reads it).
        self._inplace = (activation is not None and not self._rowwise
                         and sign_from_output(activation, self.negative_slope))
        self.W = Parameter(init_weight(self.d_in, self.d_out, init, self.dtype, make_rng(rng)))
        self.b = Parameter(np.zeros(self.d_out, self.dtype)) if bias else None
        self._saved.x = None  # (N, d_in) the last input, by reference
        self._saved.z = None  # (N, d_out) act(z) (in place, or row-wise) or act'(z), for backward

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
            if self._rowwise:
                _rowwise_forward(act, y, z)
            elif act is not None:
                ops.bias_act(y, z, None, act, self.negative_slope,
                             None if self._inplace else z)
        self._saved.x, self._saved.z = x2, (y if self._rowwise else z)
        return y

    def _backward(self, dy2, acc2):
        n, ws, act = dy2.shape[0], self._ws, self.activation
        if act is None:
            dz = dy2
        else:
            dz = ws.get("dz", n, self.d_out)  # (N, d_out)
            if n:
                db = None if self.b is None else self.b.grad  # db += dz.sum(0) in the same pass
                if self._rowwise:
                    _rowwise_backward(act, dz, dy2, self._saved.z)
                elif self._inplace:
                    ops.act_backward(dz, dy2, self._saved.z, act, self.negative_slope,
                                     self._saved.z, db)
                else:
                    ops.act_backward_cached(dz, dy2, self._saved.z, db)
        dx = acc2 if acc2 is not None else ws.get("dx", n, self.d_in)  # (N, d_in)
        if n:
            ops.gemm(self.W.grad, self._saved.x, dz, True, False, 1.0, 1.0)  # dW += x^T dz
            if self.b is not None and (act is None or self._rowwise):
                ops.colsum(self.b.grad, dz, 1.0)                        # db += dz.sum(0)
            if dx is not SKIP_DX:
                ops.gemm(dx, dz, self.W.data, False, True, 1.0, 0.0 if acc2 is None else 1.0)
        self._saved.x = None
        return dx

    def extra_repr(self) -> str:
        act = "" if self.activation is None else f", activation={self.activation!r}"
        return f"d_in={self.d_in}, d_out={self.d_out}, bias={self.b is not None}{act}"


# ----------------------------------------------------------------------------- activations
class Activation(Module):
    """Element-wise ``h = act(z)`` over inputs of any feature size, for any registered
    activation name (kernels.activations); ``negative_slope`` is read by leaky_relu."""

    def __init__(self, activation: str = "relu", *, dtype=np.float32,
                 negative_slope: float = 0.01):
        super().__init__(dtype)
        self.activation = check_activation("activation", activation)
        self.negative_slope = _check_slope(negative_slope)
        self._saved.z = None  # (N, d) the last input, by reference
        self._saved.h = None  # (N, d) the last output (a work buffer)

    def _forward(self, z2, res2):
        h = self._ws.get("h", *z2.shape)  # (N, d)
        if z2.size:
            ops.bias_act(h, z2, None, self.activation, self.negative_slope, None)
        self._saved.z, self._saved.h = z2, h
        return h

    def _backward(self, dh2, acc2):
        dz = self._ws.get("dz", *dh2.shape)  # (N, d)
        if dh2.size:
            ops.act_backward(dz, dh2, self._saved.z, self.activation, self.negative_slope,
                             self._saved.h)
        self._saved.z = None
        return dz

    def extra_repr(self) -> str:
        slope = f", negative_slope={self.negative_slope}" if self.activation == "leaky_relu" else ""
        return f"{self.activation!r}{slope}"


class _NamedActivation(Activation):
    """An activation whose only option is its dtype; a subclass names it in ``kind``."""

    kind = ""

    def __init__(self, *, dtype=np.float32):
        super().__init__(self.kind, dtype=dtype)


class ReLU(_NamedActivation):
    """``max(z, 0)``."""

    kind = "relu"


class LeakyReLU(Activation):
    """``z if z > 0 else negative_slope * z``."""

    def __init__(self, negative_slope: float = 0.01, *, dtype=np.float32):
        super().__init__("leaky_relu", dtype=dtype, negative_slope=negative_slope)


class GELU(Activation):
    """``z * Phi(z)`` (``approximate="none"``, erf) or its tanh approximation (``"tanh"``)."""

    def __init__(self, approximate: str = "none", *, dtype=np.float32):
        if approximate not in ("none", "tanh"):
            raise ValueError(f"approximate: expected 'none' or 'tanh', got {approximate!r}")
        super().__init__("gelu" if approximate == "none" else "gelu_tanh", dtype=dtype)
        self.approximate = approximate


class SiLU(_NamedActivation):
    """``z * sigmoid(z)``."""

    kind = "silu"


class Sigmoid(_NamedActivation):
    """``1 / (1 + exp(-z))``."""

    kind = "sigmoid"


class Tanh(_NamedActivation):
    """``tanh(z)``."""

    kind = "tanh"


class Identity(Module):
    """Returns its input itself (no copy) and ``dy`` itself as the input gradient."""

    def __init__(self, *, dtype=np.float32):
        super().__init__(dtype)

    def _forward(self, x2, res2):
        return x2

    def _backward(self, dy2, acc2):
        return dy2


# ----------------------------------------------------------------------------- row-wise
def _rowwise_forward(act, y, x):
    if act == "softmax":
        ops.softmax_forward(y, x)
    else:
        ops.log_softmax_forward(y, x)


def _rowwise_backward(act, dx, dy, y):
    if act == "softmax":
        ops.softmax_backward(dx, dy, y)
    else:
        ops.log_softmax_backward(dx, dy, y)


class RowwiseActivation(Module):
    """A row-wise activation over the last axis of inputs of any feature size."""

    activation = None  # "softmax" or "log_softmax"

    def __init__(self, *, dtype=np.float32):
        super().__init__(dtype)
        self._saved.y = None  # (N, C) the last output, read by backward

    def _forward(self, x2, res2):
        y = self._ws.get("y", *x2.shape)  # (N, C)
        _rowwise_forward(self.activation, y, x2)
        self._saved.y = y
        return y

    def _backward(self, dy2, acc2):
        dx = self._ws.get("dx", *dy2.shape)  # (N, C)
        _rowwise_backward(self.activation, dx, dy2, self._saved.y)
        self._saved.y = None
        return dx


class Softmax(RowwiseActivation):
    """``softmax(x) = exp(x) / sum(exp(x))`` over the last axis (PyTorch's ``Softmax(dim=-1)``);
    backward ``dx = y * (dy - sum(dy * y))``."""

    activation = "softmax"


class LogSoftmax(RowwiseActivation):
    """``log_softmax(x) = x - log(sum(exp(x)))`` over the last axis (PyTorch's
    ``LogSoftmax(dim=-1)``); backward ``dx = dy - softmax(x) * sum(dy)``."""

    activation = "log_softmax"

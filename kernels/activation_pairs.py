"""Every element-wise activation as one scalar pair, act(z) and act'(z), and the registry.

A pair is plain Python over one number ``z`` (and leaky_relu's ``slope``): arithmetic,
comparisons, conditional expressions, ``abs``, module constants, and ``exp``, ``tanh``,
``ndtr`` (kernels.fmath). kernels.gen_activations turns each pair into float32 and float64
scalar functions and generates every fused kernel from them (kernels/_activation_kernels.py):
float32 constants stay float32 and the transcendentals become vectorising approximations.
NaN propagates as in the pair's Python: a comparison with NaN is False, so write selects
with the NaN case in mind (``0.0 if z <= 0.0 else z`` keeps NaN; ``z if z > 0.0 else 0.0``
would not). Do not use ``**`` (a libm pow), ``min``/``max`` (not IEEE on NaN).

Adding an activation: its pair here, its reference pair in kernels.reference (plain NumPy,
written independently), one ``Activation`` entry in ``REGISTRY``; then
``python -m kernels.gen_activations``.
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from types import MappingProxyType
from typing import Callable

from . import reference as R
from .fmath import exp, ndtr, tanh

__all__ = ["Activation", "REGISTRY", "ACTIVATIONS"]

_INV_SQRT_2PI = 1.0 / math.sqrt(2.0 * math.pi)
_GT_K = math.sqrt(2.0 / math.pi)   # gelu_tanh: u = _GT_K z + _GT_KC z^3
_GT_KC = _GT_K * 0.044715
_GT_ZMAX = 30.0
_MISH_HI = 20.0                    # tanh(softplus(z)) and mish' round to 1 above (float64 too)
_MISH_LO = -1000.0                 # exp(z) is 0 below (float64 too)


# ----------------------------------------------------------------------------- pairs
def identity(z, slope):
    return z


def identity_d(z, slope):
    return 1.0


def relu(z, slope):
    return 0.0 if z <= 0.0 else z          # relu(NaN) = NaN, as np.maximum


def relu_d(z, slope):
    return 1.0 if z > 0.0 else 0.0


def leaky_relu(z, slope):
    return z if z > 0.0 else slope * z


def leaky_relu_d(z, slope):
    return 1.0 if z > 0.0 else slope


def gelu(z, slope):
    """z Phi(z) (Hendrycks & Gimpel 2016)."""
    return z * ndtr(z)


def gelu_d(z, slope):
    return ndtr(z) + z * exp(-0.5 * z * z) * _INV_SQRT_2PI


# With e = exp(-|x|) and r = 1 / (1 + e): sigmoid(x) = r (x >= 0) or e r (x < 0), and
# sigmoid(x) (1 - sigmoid(x)) = e r^2 on both sides: no exp overflow, no 1 - s cancellation.
def gelu_tanh(z, slope):
    """0.5 z (1 + tanh(u)), u = sqrt(2/pi) (z + 0.044715 z^3), computed as z sigmoid(2u):
    the same function without the 1 + tanh cancellation in the left tail."""
    u2 = 2.0 * (_GT_K * z + _GT_KC * z * z * z)
    e = exp(-abs(u2))
    r = 1.0 / (1.0 + e)
    return z * (r if u2 >= 0.0 else e * r)


def gelu_tanh_d(z, slope):
    u2 = 2.0 * (_GT_K * z + _GT_KC * z * z * z)
    e = exp(-abs(u2))
    r = 1.0 / (1.0 + e)
    s = r if u2 >= 0.0 else e * r
    # z u' with z clamped to [-30, 30]: beyond, e is exactly 0 (also in float64), and the
    # unclamped z^3 would overflow float32 into inf * 0.
    zc = _GT_ZMAX if z > _GT_ZMAX else (-_GT_ZMAX if z < -_GT_ZMAX else z)
    return s + zc * (e * r * r) * (2.0 * _GT_K + 6.0 * _GT_KC * zc * zc)


def silu(z, slope):
    """z sigmoid(z)."""
    e = exp(-abs(z))
    r = 1.0 / (1.0 + e)
    return z * (r if z >= 0.0 else e * r)


def silu_d(z, slope):
    e = exp(-abs(z))
    r = 1.0 / (1.0 + e)
    s = r if z >= 0.0 else e * r
    return s * (1.0 + z * (e * r if z >= 0.0 else r))  # s (1 + z (1 - s))


def sigmoid(z, slope):
    e = exp(-abs(z))
    r = 1.0 / (1.0 + e)
    return r if z >= 0.0 else e * r


def sigmoid_d(z, slope):
    e = exp(-abs(z))
    r = 1.0 / (1.0 + e)
    return e * r * r


def tanh_(z, slope):
    return tanh(z)


def tanh_d(z, slope):
    e = exp(-2.0 * abs(z))
    q = 1.0 + e
    return 4.0 * e / (q * q)               # 1 - tanh^2 without the cancellation near |z| = 1


def relu2(z, slope):
    """Squared ReLU (So et al. 2021, "Primer")."""
    r = 0.0 if z <= 0.0 else z
    return r * r


def relu2_d(z, slope):
    r = 0.0 if z <= 0.0 else z
    return 2.0 * r


# Mish, z tanh(softplus(z)) (Misra 2019). With e = exp(z): tanh(softplus(z)) = n / q,
# n = e (e + 2), q = n + 2, and mish' = n/q + z sigmoid(z) (1 - (n/q)^2) = n/q + 4 z e (1 + e) / q^2.
# z is clamped above at _MISH_HI for exp (no overflow) and in the second term, which is
# below the rounding of 1 there; and below at _MISH_LO, where e, and so both terms, are
# exactly 0 in either dtype: mish(-inf) and mish'(-inf) are then their limit 0, not inf * 0.
def mish(z, slope):
    zc = _MISH_HI if z > _MISH_HI else z
    e = exp(zc)
    n = e * (e + 2.0)
    zl = _MISH_LO if z < _MISH_LO else z
    return zl * (n / (n + 2.0))


def mish_d(z, slope):
    zc = _MISH_HI if z > _MISH_HI else (_MISH_LO if z < _MISH_LO else z)
    e = exp(zc)
    n = e * (e + 2.0)
    q = n + 2.0
    return n / q + 4.0 * zc * e * (1.0 + e) / (q * q)


# ----------------------------------------------------------------------------- registry
@dataclass(frozen=True)
class Activation:
    """One activation: its scalar pair ``forward`` / ``derivative`` (``(z, slope) -> number``,
    above: the fused kernels are generated from it), its naive twin ``reference`` /
    ``reference_grad`` (``(z, negative_slope) -> new array``, in kernels.reference) and
    ``sign_from_output``: act'(z) can be recomputed from act(z) itself (act' depends only on
    the sign of z, and act(z) > 0 exactly where z > 0), so a module may overwrite z with
    act(z) and run the backward on that buffer (for leaky_relu: negative_slope >= 0).
    Construction checks every field: a wrong one raises TypeError/ValueError at import."""

    name: str
    forward: Callable
    derivative: Callable
    reference: Callable
    reference_grad: Callable
    sign_from_output: bool

    def __post_init__(self):
        if not isinstance(self.name, str) or not self.name.isidentifier():
            raise ValueError(f"name: expected an identifier string, got {self.name!r}")
        for field in ("forward", "derivative", "reference", "reference_grad"):
            if not callable(getattr(self, field)):
                raise TypeError(f"activation {self.name!r}: {field}: expected a callable, got "
                                f"{getattr(self, field)!r}")
        if not isinstance(self.sign_from_output, bool):
            raise TypeError(f"activation {self.name!r}: sign_from_output: expected a bool, got "
                            f"{self.sign_from_output!r}")


def _registry(*entries):
    reg = {}
    for e in entries:
        if not isinstance(e, Activation):
            raise TypeError(f"expected an Activation, got {type(e).__name__}")
        if e.name in reg:
            raise ValueError(f"activation {e.name!r} is registered twice")
        reg[e.name] = e
    return MappingProxyType(reg)


REGISTRY = _registry(
    Activation("identity", identity, identity_d, R.identity, R.identity_grad, True),
    Activation("relu", relu, relu_d, R.relu, R.relu_grad, True),
    Activation("leaky_relu", leaky_relu, leaky_relu_d, R.leaky_relu, R.leaky_relu_grad, True),
    Activation("gelu", gelu, gelu_d, R.gelu, R.gelu_grad, False),
    Activation("gelu_tanh", gelu_tanh, gelu_tanh_d, R.gelu_tanh, R.gelu_tanh_grad, False),
    Activation("silu", silu, silu_d, R.silu, R.silu_grad, False),
    Activation("sigmoid", sigmoid, sigmoid_d, R.sigmoid, R.sigmoid_grad, False),
    Activation("tanh", tanh_, tanh_d, R.tanh, R.tanh_grad, False),
    Activation("relu2", relu2, relu2_d, R.relu2, R.relu2_grad, False),
    Activation("mish", mish, mish_d, R.mish, R.mish_grad, False),
)
ACTIVATIONS = tuple(REGISTRY)

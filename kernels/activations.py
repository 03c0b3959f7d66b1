"""Fused bias + activation passes and their backward (STUB: delegates to reference; to be
replaced by cache-blocked versions)."""
from . import reference as _ref
from .reference import ACTIVATIONS

__all__ = ["ACTIVATIONS", "bias_act_forward", "act_backward", "bias_grad"]


def bias_act_forward(h, z, bias=None, act="relu", negative_slope=0.01):
    return _ref.bias_act_forward(h, z, bias, act, negative_slope)


def act_backward(dz, dh, z, act="relu", negative_slope=0.01, h=None):
    return _ref.act_backward(dz, dh, z, act, negative_slope, h)


def bias_grad(db, dz):
    return _ref.bias_grad(db, dz)

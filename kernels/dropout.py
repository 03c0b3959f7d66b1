"""Inverted dropout (STUB: delegates to reference)."""
from . import reference as _ref

__all__ = ["dropout_forward", "dropout_backward"]


def dropout_forward(out, mask, x, p, rng):
    return _ref.dropout_forward(out, mask, x, p, rng)


def dropout_backward(dx, dout, mask):
    return _ref.dropout_backward(dx, dout, mask)

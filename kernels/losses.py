"""Losses (STUB: delegates to reference)."""
from . import reference as _ref

__all__ = ["softmax_cross_entropy_forward", "softmax_cross_entropy_backward",
           "mse_forward", "mse_backward"]


def softmax_cross_entropy_forward(probs, logits, target):
    return _ref.softmax_cross_entropy_forward(probs, logits, target)


def softmax_cross_entropy_backward(dlogits, probs, target):
    return _ref.softmax_cross_entropy_backward(dlogits, probs, target)


def mse_forward(pred, target):
    return _ref.mse_forward(pred, target)


def mse_backward(dpred, pred, target):
    return _ref.mse_backward(dpred, pred, target)

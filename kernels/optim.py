"""Optimizer updates (STUB: delegates to reference)."""
from . import reference as _ref

__all__ = ["adamw_update", "sgd_update"]


def adamw_update(param, grad, exp_avg, exp_avg_sq, step, lr, beta1=0.9, beta2=0.999,
                 eps=1e-8, weight_decay=1e-2):
    return _ref.adamw_update(param, grad, exp_avg, exp_avg_sq, step, lr, beta1, beta2, eps,
                             weight_decay)


def sgd_update(param, grad, momentum_buf, lr, momentum=0.0, weight_decay=0.0,
               dampening=0.0, nesterov=False, first_step=False):
    return _ref.sgd_update(param, grad, momentum_buf, lr, momentum, weight_decay, dampening,
                           nesterov, first_step)

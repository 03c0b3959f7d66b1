"""``CallState``: what a module remembers between its forward and backward calls (the
module protocol's bookkeeping, engine/nn/module.py); ``backward``'s ``input_grad`` option."""
from __future__ import annotations

from .._checks import check_bool

__all__ = ["CallState", "SKIP_DX", "check_input_grad"]


class CallState:
    """What a module remembers between calls (a plain object: ``Module.__setattr__`` is slow)."""

    __slots__ = ("lead", "out_shape", "in_dim", "ready", "ws_ids", "ws_gen", "range",
                 "range_gen")

    def __init__(self):
        self.lead = None       # leading shape of the last forward's input
        self.out_shape = None  # shape of its output
        self.in_dim = None     # last dimension of its input
        self.ready = False     # a forward is waiting for its backward
        self.ws_ids = None     # ids of the workspaces of this module and its children
        self.ws_gen = -1
        self.range = None      # (arena, lo, hi) of this module's parameters
        self.range_gen = -1


class _SkipDx:
    """The ``acc2`` a ``_backward`` gets when nobody reads the input gradient
    (``backward(dy, input_grad=False)``) and its class sets ``skips_input_grad``."""

    def __repr__(self):
        return "SKIP_DX"


SKIP_DX = _SkipDx()


def check_input_grad(input_grad, dx_acc=None) -> bool:
    """``backward``'s ``input_grad`` as a bool, checked not to be False beside a ``dx_acc``
    (which asks for the input gradient)."""
    if input_grad is not True:
        input_grad = check_bool("input_grad", input_grad)
        if not input_grad and dx_acc is not None:
            raise ValueError("dx_acc: input_grad=False computes no input gradient to add "
                             "into dx_acc; pass one or the other")
    return input_grad

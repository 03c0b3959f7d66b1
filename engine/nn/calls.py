"""``CallState``: what a module remembers between its forward and backward calls (the
module protocol's bookkeeping, engine/nn/module.py); ``backward``'s ``input_grad`` option."""
from __future__ import annotations

import inspect

from .._checks import check_bool

__all__ = ["CallState", "SKIP_DX", "check_input_grad", "takes_input_grad"]


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


_TAKES: dict = {}  # class -> whether its backward takes input_grad


def takes_input_grad(module) -> bool:
    """Whether ``module.backward`` accepts ``input_grad`` (a user's module may override
    ``backward`` with the older signature); read once per class."""
    cls = type(module)
    found = _TAKES.get(cls)
    if found is None:
        try:
            params = inspect.signature(cls.backward).parameters
            found = "input_grad" in params or any(p.kind is p.VAR_KEYWORD
                                                  for p in params.values())
        except (TypeError, ValueError, AttributeError):
            found = False
        _TAKES[cls] = found
    return found

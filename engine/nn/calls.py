"""``CallState``: what a module remembers between its forward and backward calls (the
module protocol's bookkeeping, engine/nn/module.py)."""
from __future__ import annotations

__all__ = ["CallState"]


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

"""Losses: ``MSELoss`` and ``CrossEntropyLoss`` (softmax + cross-entropy on logits).

``forward(pred, target)`` returns the mean loss as a float and caches references (no
copies) to its inputs; ``backward()`` returns d(loss)/d(pred) in a reused work buffer.
Numerics are ``kernels.losses``; ``MSELoss.forward`` writes the gradient in the same pass
as the loss (``mse_forward_backward``), so its first ``backward()`` costs nothing.
"""
from __future__ import annotations

import numpy as np

from kernels import ops

from .module import Module, Workspace, check_dtype

__all__ = ["MSELoss", "CrossEntropyLoss"]



def _check_float(name: str, x, dtype) -> None:
    if not isinstance(x, np.ndarray):
        raise TypeError(f"{name}: expected a numpy.ndarray, got {type(x).__name__}")
    if dtype is None:
        if x.dtype not in (np.float32, np.float64):
            raise TypeError(f"{name}: expected dtype float32 or float64, got {x.dtype}")
    elif x.dtype != dtype:
        raise TypeError(f"{name}: expected dtype {dtype}, got {x.dtype}")
    if not x.flags.c_contiguous:
        raise ValueError(f"{name}: expected a C-contiguous array, got strides {x.strides} "
                         f"for shape {x.shape} (use np.ascontiguousarray)")


class _Loss(Module):
    """Shared bookkeeping: dtype policy, per-dtype workspaces, backward-before-forward."""

    def __init__(self, *, dtype=None):
        super().__init__()
        # None: follow pred (float32 or float64); otherwise pred must have this dtype.
        self._set_plain("dtype", None if dtype is None else check_dtype(dtype))
        self._wss = {}  # dtype -> Workspace
        self._saved = None  # (N, C) what backward reads: pred (MSE) or the softmax (CE)
        self._target = None  # the last target, viewed as rows (or (N,) labels)
        self._shape = None  # shape of the last pred

    def _ws_for(self, dt) -> Workspace:
        ws = self._wss.get(dt)
        if ws is None:
            ws = self._wss[dt] = Workspace(dt)
        return ws

    def _workspaces(self) -> list:
        return list(self._wss.values())

    def __call__(self, pred, target) -> float:
        return self.forward(pred, target)

    def _need_forward(self, what: str = "backward"):
        if self._saved is None:
            raise RuntimeError(f"{type(self).__name__}.{what}: called before forward")
        if what == "backward":
            if not self._calls.ready:  # the rule of every module: one backward per forward
                raise self._no_forward()
            self._calls.ready = False

    def extra_repr(self) -> str:
        return "" if self.dtype is None else f"dtype={self.dtype}"


class MSELoss(_Loss):
    """``mean((pred - target)**2)`` over all elements (PyTorch's ``MSELoss``); ``target`` has
    pred's shape and dtype. ``dtype=None`` accepts float32 or float64 predictions.

    ``forward`` also writes the gradient into the work buffer ``backward`` returns: one
    pass over pred and target instead of two."""

    def forward(self, pred, target) -> float:
        """The mean squared error of ``pred`` against ``target`` (a float); also writes the
        gradient ``backward`` returns."""
        _check_float("pred", pred, self.dtype)
        if pred.ndim == 0 or pred.size == 0:
            raise ValueError(f"pred: expected a non-empty array of at least 1 dimension, "
                             f"got shape {pred.shape}")
        _check_float("target", target, pred.dtype)
        if target.shape != pred.shape:
            raise ValueError(f"target: expected shape {pred.shape} (pred's), got {target.shape}")
        cols = pred.shape[-1] if pred.ndim >= 2 else 1
        self._no_overlap("pred", pred)
        self._no_overlap("target", target)
        p2 = pred.reshape(-1, cols)  # views: both are C-contiguous
        t2 = target.reshape(-1, cols)
        d = self._ws_for(p2.dtype).get("dpred", *p2.shape)  # (N, C) reused, see backward
        loss = ops.mse_forward_backward(d, p2, t2)
        self._saved, self._target, self._shape = p2, t2, pred.shape
        self._calls.ready = True
        return float(loss)

    def backward(self):
        """d(loss)/d(pred), written by forward (a work buffer)."""
        self._need_forward()
        p2 = self._saved
        return self._ws_for(p2.dtype).get("dpred", *p2.shape).reshape(self._shape)


class CrossEntropyLoss(_Loss):
    """Softmax + cross-entropy of logits ``(N, C)`` or ``(B, T, C)``, mean over rows (positions).

    ``target``: integer labels of shape ``(N,)`` / ``(B, T)`` with values in ``[0, C)``, or
    probabilities of the logits' shape and dtype. ``probs`` holds the last softmax.
    """

    def forward(self, pred, target) -> float:
        """The mean cross-entropy of softmax(``pred``) against ``target`` (labels or
        probabilities), a float; the softmax is kept for ``backward`` and ``probs``."""
        _check_float("pred", pred, self.dtype)
        if pred.ndim not in (2, 3) or pred.shape[-1] == 0:
            raise ValueError(f"pred: expected logits of shape (N, C) or (B, T, C), got {pred.shape}")
        c = pred.shape[-1]
        logits = pred.reshape(-1, c)
        n = logits.shape[0]
        if n == 0:
            raise ValueError(f"pred: expected at least one row, got shape {pred.shape}")
        if not isinstance(target, np.ndarray):
            raise TypeError(f"target: expected a numpy.ndarray, got {type(target).__name__}")
        if np.issubdtype(target.dtype, np.integer):
            if target.shape != pred.shape[:-1]:
                raise ValueError(f"target: integer labels must have shape {pred.shape[:-1]} "
                                 f"(pred's without the class axis), got {target.shape}")
            if not target.flags.c_contiguous:
                raise ValueError(f"target: expected a C-contiguous array, got strides {target.strides}")
            t = target.reshape(n)
            lo, hi = int(t.min()), int(t.max())
            if lo < 0 or hi >= c:
                raise ValueError(f"target: labels must lie in [0, {c}), got values in [{lo}, {hi}]")
        elif np.issubdtype(target.dtype, np.floating):
            _check_float("target", target, pred.dtype)
            if target.shape != pred.shape:
                raise ValueError(f"target: probability targets must have pred's shape {pred.shape}, "
                                 f"got {target.shape}")
            t = target.reshape(n, c)
        else:
            raise TypeError(f"target: expected integer labels or {pred.dtype} probabilities, "
                            f"got dtype {target.dtype}")
        self._no_overlap("pred", pred)
        self._no_overlap("target", target)
        probs = self._ws_for(logits.dtype).get("probs", n, c)  # (N, C) softmax, cached for backward
        loss = ops.cross_entropy_forward(probs, logits, t)
        self._saved, self._target, self._shape = probs, t, pred.shape
        self._calls.ready = True
        return float(loss)

    @property
    def probs(self):
        """The softmax of the last forward's logits, shaped like them (a work buffer)."""
        self._need_forward("probs")
        return self._saved.reshape(self._shape)

    def backward(self):
        """d(loss)/d(logits) = (softmax - target) / rows (a work buffer)."""
        self._need_forward()
        probs = self._saved
        d = self._ws_for(probs.dtype).get("dlogits", *probs.shape)  # (N, C) reused
        ops.cross_entropy_backward(d, probs, self._target)
        return d.reshape(self._shape)

"""Batch sources for ``fit(..., sampler=..., steps=N)``: iteration-based training, where each
step draws its own batch instead of walking through the epochs of a fixed data set.

``RandomWindows`` is nanoGPT's ``get_batch`` (Karpathy, train.py): every step takes
``batch_size`` windows of ``block_size`` tokens at uniformly random offsets of a long id
array, with the same windows shifted by one token as the targets. Any object with
``sample() -> (X, Y)`` (and, to be resumable, its Generator as ``rng``) is a sampler too.
"""
from __future__ import annotations

import numpy as np

from .._checks import check_int
from ..nn.module import make_rng

__all__ = ["RandomWindows"]


class RandomWindows:
    """``sample()`` returns ``(X, Y)``, both (batch_size, block_size) int64: windows of ``ids``
    starting at ``batch_size`` offsets drawn uniformly from ``[0, len(ids) - block_size)`` by
    ``rng`` (an int seed or a Generator), and the next token of every position. The two
    arrays are buffers of the sampler, overwritten by the next call."""

    def __init__(self, ids, block_size: int, batch_size: int, rng=0):
        if not isinstance(ids, np.ndarray) or ids.ndim != 1 or ids.dtype == np.bool_ \
                or not np.issubdtype(ids.dtype, np.integer):
            what = (f"shape {ids.shape}, dtype {ids.dtype}" if isinstance(ids, np.ndarray)
                    else type(ids).__name__)
            raise TypeError(f"ids: expected a 1-D numpy array of integer token ids, got {what}")
        self.block_size = check_int("block_size", block_size, 1)
        self.batch_size = check_int("batch_size", batch_size, 1)
        if ids.shape[0] < self.block_size + 1:
            raise ValueError(f"ids: {ids.shape[0]} tokens make no window of block_size + 1 = "
                             f"{self.block_size + 1}")
        if ids.size and ids.min() < 0:
            raise ValueError(f"ids: expected ids >= 0, got {int(ids.min())}")
        self.ids, self.rng = ids, make_rng(rng)
        self.offsets = ids.shape[0] - self.block_size  # start offsets to draw from
        self._arange = np.arange(self.block_size)                          # (T,)
        self._index = np.empty((self.batch_size, self.block_size), np.int64)  # (B, T) positions
        self._x = np.empty((self.batch_size, self.block_size), np.int64)      # (B, T) windows
        self._y = np.empty_like(self._x)                                   # (B, T) targets
        self._raw = np.empty(self._x.shape, ids.dtype)  # (B, T) gathered in the ids' dtype

    def __repr__(self) -> str:
        return (f"RandomWindows({self.ids.shape[0]:,} tokens, block_size={self.block_size}, "
                f"batch_size={self.batch_size})")

    def _gather(self, starts) -> tuple:
        # (take writes into out only in its own dtype, and with mode="clip")
        np.add(starts[:, None], self._arange, out=self._index)
        np.copyto(self._x, np.take(self.ids, self._index, out=self._raw, mode="clip"))
        self._index += 1
        np.copyto(self._y, np.take(self.ids, self._index, out=self._raw, mode="clip"))
        return self._x, self._y

    def sample(self) -> tuple:
        """The next batch: ``(X, Y)`` at fresh random offsets (advances ``rng``)."""
        return self._gather(self.rng.integers(0, self.offsets, self.batch_size))

    def example(self) -> tuple:
        """A batch that ``fit`` checks before training, without drawing: windows that hold
        the largest id (and the first window), as copies."""
        top = min(int(np.argmax(self.ids)), self.offsets - 1)
        starts = np.resize(np.array([top, 0]), self.batch_size)
        x, y = self._gather(starts)
        return x.copy(), y.copy()

"""``Embedding``: a table of ``num_embeddings`` vectors looked up by integer ids, the first
layer of a language model. Forward gathers rows, backward scatter-adds the output gradient
into the table's gradient (kernels.embedding: a compiled sparse product, no Python loop and
no ``np.add.at``). Ids are integers, so there is no input gradient."""
from __future__ import annotations

import numpy as np

from kernels import ops

from .module import (Module, Parameter, Workspace, check_input_grad, check_positive_int,
                     make_rng, rows_of)

__all__ = ["Embedding", "check_integer_ids", "check_id_range"]


def check_integer_ids(ids, name: str = "ids", sequences: bool = False) -> None:
    """TypeError unless ``ids`` is a numpy array of integers; ValueError for a scalar, or
    (``sequences``) for a shape other than (B, T)."""
    if not isinstance(ids, np.ndarray):
        raise TypeError(f"{name}: expected a numpy.ndarray of integer ids"
                        f"{' (B, T)' if sequences else ''}, got {type(ids).__name__}")
    if ids.dtype == np.bool_ or not np.issubdtype(ids.dtype, np.integer):
        raise TypeError(f"{name}: expected an integer array (token ids), got dtype {ids.dtype}"
                        f" (convert with .astype(np.int64) if the values are whole numbers)")
    if sequences and ids.ndim != 2:
        raise ValueError(f"{name}: expected shape (B, T), got {ids.shape}")
    if ids.ndim == 0:
        raise ValueError(f"{name}: expected an array of at least 1 dimension, got a scalar")


def check_id_range(ids, vocab_size: int, name: str = "ids") -> None:
    """ValueError naming the first id of ``ids`` outside [0, vocab_size), and its index."""
    if ids.size:
        lo, hi = ids.min(), ids.max()
        if lo < 0 or hi >= vocab_size:
            bad = (ids < 0) | (ids >= vocab_size)
            where = np.unravel_index(int(np.argmax(bad)), ids.shape)
            raise ValueError(f"{name}: expected ids in [0, {vocab_size}), got "
                             f"{int(ids[where])} at index {tuple(int(i) for i in where)}")


class Embedding(Module):
    """``y[..., :] = W[ids[...]]`` for integer ``ids`` of any shape: y has shape
    ``ids.shape + (dim,)``. Parameter ``W`` (num_embeddings, dim), initialised N(0, 1) as
    PyTorch's ``nn.Embedding``. ``backward(dy)`` adds ``dy``'s rows into ``W.grad`` (repeated
    ids accumulate) and returns None: integer ids have no gradient.

    An id outside ``[0, num_embeddings)``, a non-integer ``ids`` array (floats, bools) or a
    non-array raises, naming the first bad id and where it is; nothing changes."""

    def __init__(self, num_embeddings: int, dim: int, *, dtype=np.float32, rng=None):
        super().__init__(dtype)
        self.num_embeddings = check_positive_int("num_embeddings", num_embeddings)
        self.dim = check_positive_int("dim", dim)
        w = make_rng(rng).standard_normal((self.num_embeddings, self.dim))  # float64 draw
        self.W = Parameter(w.astype(self.dtype))
        self._iws = Workspace(np.int64)  # ids kept for backward (the caller may reuse its array)
        self._saved.ids = None  # (N,) int64 the last ids

    def out_features(self, d_in: int) -> int:
        return self.dim

    def _workspaces(self) -> list:
        return [self._ws, self._iws]

    def extra_repr(self) -> str:
        return f"num_embeddings={self.num_embeddings}, dim={self.dim}, dtype={self.dtype}"

    def check_input(self, x, name: str = "ids") -> tuple:
        """``ids.shape + (dim,)`` for integer ``ids`` in range, else the forward's error."""
        self._check_ids(x, name)
        return (*x.shape, self.dim)

    def _check_ids(self, ids, name: str = "ids"):
        check_integer_ids(ids, name)
        check_id_range(ids, self.num_embeddings, name)

    def forward(self, ids, *, residual=None):
        """The rows of ``W`` for ``ids`` (+ ``residual``, an array of the output's shape)."""
        self._check_ids(ids)
        out_shape = (*ids.shape, self.dim)
        n = ids.size
        res2 = None
        if residual is not None:
            rows_of(residual, out_shape, self.dtype, "residual")
            self._no_overlap("residual", residual)
            res2 = residual.reshape(n, self.dim)
        s = self._calls
        s.ready = False
        idx = self._iws.get("ids", n)               # (N,) int64 ids, read again by backward
        np.copyto(idx.reshape(ids.shape), ids, casting="unsafe")  # in range: nothing is lost
        y = self._ws.get("y", n, self.dim)          # (N, dim) output
        if n:  # with a residual: gathered and added in one pass
            ops.embedding_forward(y, idx, self.W.data, res2)
        self._saved.ids = idx
        s.out_shape, s.ready = out_shape, True
        return y.reshape(out_shape)

    def backward(self, dy, *, dx_acc=None, input_grad=True):
        """Adds ``dy``'s rows into ``W.grad`` at the last forward's ids; returns None (ids
        have no gradient, whatever ``input_grad`` says)."""
        s = self._calls
        check_input_grad(input_grad)
        if not s.ready:
            raise self._no_forward()
        if dx_acc is not None:
            raise ValueError("dx_acc: an Embedding has no input gradient (its input is integer "
                             "ids); pass dx_acc=None")
        dy2 = self._dy_rows(dy, s.out_shape).reshape(-1, self.dim)
        if dy2.shape[0]:
            ops.embedding_backward(self.W.grad, self._saved.ids, dy2)
        s.ready = False
        return None

"""The parameter arena: ``Parameter`` (a named view of one model's flat parameter and
gradient vectors), ``Arena`` (those vectors), ``runs`` (maximal back-to-back stretches of
parameters, what optimizers update in one pass), ``adjacent_views`` (two weights read as one
matrix) and ``Workspace`` (a module's named work buffers); and the layout version that
caches of arena ranges compare against."""
from __future__ import annotations

import operator
import weakref

import numpy as np

from kernels.memory import aligned_empty

from .._checks import check_array_like, check_dtype

__all__ = ["Arena", "Parameter", "Workspace", "adjacent_views", "arena_layout_version",
           "bump_arena_layout", "buffer_owner", "runs", "shaped_like", "LAYOUT_VERSION",
           "BUFFER_OWNERS"]


# ----------------------------------------------------------------------------- arena
# The arena layout's version: bumped whenever parameters move to another arena (or work
# buffers are reassigned), so a cache of arena ranges built at one version is stale at another.
LAYOUT_VERSION = [0]


def arena_layout_version() -> int:
    """The current arena layout's version: caches of arena ranges (optimizer runs, a
    module's range) compare the version they were built at with this one."""
    return LAYOUT_VERSION[0]


def bump_arena_layout() -> None:
    """Mark every cache of arena ranges stale (parameters or work buffers moved)."""
    LAYOUT_VERSION[0] += 1


class Arena:
    """One model's parameters and gradients as two flat, 64-byte-aligned vectors of one
    dtype; each ``Parameter`` is a view of its range of both, in its own memory order."""

    __slots__ = ("data", "grad", "params")

    def __init__(self, params: list):
        dtype = params[0].dtype
        total = sum(p.size for p in params)
        self.data = aligned_empty(total, dtype)   # (total,) every parameter, back to back
        self.grad = aligned_empty(total, dtype)   # (total,) their gradients
        self.params = tuple(params)
        off = 0
        for p in params:
            n = p.size
            d, g = self.data[off:off + n], self.grad[off:off + n]
            np.copyto(shaped_like(d, p), p._data)
            np.copyto(shaped_like(g, p), p._grad)
            p._data, p._grad = shaped_like(d, p), shaped_like(g, p)
            p._arena, p._offset = self, off
            off += n
        LAYOUT_VERSION[0] += 1

    @property
    def dtype(self):
        return self.data.dtype


def adjacent_views(params, what: str) -> tuple:
    """``(data, grad)``: flat views of the arena range that ``params`` fill back to back, in
    this order (a fused GEMM reads them as one matrix, its gradient as one matrix, with no
    copy); RuntimeError "<what> must be adjacent in the arena" if they are not."""
    arena, lo = params[0]._arena, params[0]._offset
    end = lo
    for p in params:
        if p._arena is not arena or p._offset != end:
            raise RuntimeError(f"{what} must be adjacent in the arena")
        end += p.size
    return arena.data[lo:end], arena.grad[lo:end]


def shaped_like(flat, p):
    """``flat`` shaped as ``p``, in ``p``'s memory order (a Fortran-ordered parameter is a
    transposed view, as a weight kept transposed for its GEMM)."""
    if p._forder:
        return flat.reshape(p.shape[::-1]).T
    return flat.reshape(p.shape)


def _order(a) -> bool:
    """True for an F-ordered (not C-ordered) array."""
    return a.ndim > 1 and a.flags.f_contiguous and not a.flags.c_contiguous


def _view_property(what: str) -> property:
    """``p.data`` / ``p.grad``: reading returns the arena view (a C-level getter: it is read
    on every kernel call); assigning copies into it after ``_check_like``."""
    slot = "_" + what

    def assign(p, value):
        _check_like(what, value, p)
        np.copyto(getattr(p, slot), value)
    return property(operator.attrgetter(slot), assign,
                    doc=f"The parameter's {what}: a view into its arena; assignment copies.")


class Parameter:
    """A trainable array ``data`` with its accumulated gradient ``grad`` (same shape, dtype and
    memory order; starts at zero), both views into an ``Arena``.

    Assigning ``p.data = a`` or ``p.grad = a`` copies ``a`` into the arena after checking
    its shape and dtype (any memory layout is accepted, nothing is cast): the arrays the
    model computes with and the optimizer updates never change."""

    __slots__ = ("_data", "_grad", "name", "_arena", "_offset", "_forder", "shape")

    def __init__(self, data: np.ndarray, name: str = "", grad: np.ndarray | None = None):
        if not isinstance(data, np.ndarray):
            raise TypeError(f"data: expected a numpy.ndarray, got {type(data).__name__}")
        check_dtype(data.dtype)
        self.name = name
        self.shape = data.shape
        self._forder = _order(data)
        self._data = data
        if grad is None:
            grad = np.zeros(data.shape, data.dtype)
        else:
            _check_like("grad", grad, self)
        self._grad = grad
        Arena([self])

    data = _view_property("data")
    grad = _view_property("grad")

    @property
    def dtype(self):
        return self._data.dtype

    @property
    def size(self) -> int:
        return self._data.size

    @property
    def arena(self) -> Arena:
        return self._arena

    def zero_grad(self) -> None:
        self._grad.fill(0.0)

    def __repr__(self) -> str:
        return f"Parameter({self.name!r}, shape={self.shape}, dtype={self.dtype})"


def _check_like(what: str, value, p: Parameter) -> None:
    name = f"{p.name}.{what}" if p.name else what
    check_array_like(name, value, p._data, " (no silent cast: convert with .astype)")


def runs(params) -> list:
    """Maximal runs of ``params`` (in order) that are consecutive in one arena: a list of
    ``(arena, lo, hi, first, stop)`` with ``params[first:stop]`` at ``arena.data[lo:hi]``."""
    out = []
    for i, p in enumerate(params):
        a, off = p._arena, p._offset
        if out and out[-1][0] is a and out[-1][2] == off:
            r = out[-1]
            out[-1] = (a, r[1], off + p.size, r[3], i + 1)
        else:
            out.append((a, off, off + p.size, i, i + 1))
    return out


# ----------------------------------------------------------------------------- workspace
# id(raw allocation) -> weak refs (raw, Workspace): which module's buffer an array views.
BUFFER_OWNERS: dict = {}


def buffer_owner(base):
    """The Workspace whose work buffer is the raw allocation ``base`` (None: no work buffer,
    or the Workspace is gone)."""
    hit = BUFFER_OWNERS.get(id(base))
    if hit is not None and hit[0]() is base:
        return hit[1]()
    return None


class Workspace:
    """Named work buffers that grow to the largest row count seen and are handed out as row
    slices, so a steady loop allocates nothing. Buffers start on a 64-byte boundary
    (``kernels.memory``)."""

    def __init__(self, dtype):
        self.dtype = np.dtype(dtype)
        self._bufs: dict = {}

    def get(self, key: str, n: int, *cols: int) -> np.ndarray:
        """A C-contiguous ``(n, *cols)`` view of buffer ``key`` (contents undefined)."""
        buf = self._bufs.get(key)
        if buf is None or buf.shape[0] < n or buf.shape[1:] != cols:
            if buf is not None:
                BUFFER_OWNERS.pop(id(buf.base), None)
            buf = self._bufs[key] = aligned_empty((max(n, 1), *cols), self.dtype)
            BUFFER_OWNERS[id(buf.base)] = (weakref.ref(buf.base), weakref.ref(self))
            bump_arena_layout()
        return buf[:n]

    def buffers(self) -> list:
        return list(self._bufs.values())

    def nbytes(self) -> int:
        return sum(b.nbytes for b in self._bufs.values())

    def __del__(self):
        for buf in getattr(self, "_bufs", {}).values():  # {} if __init__ was cut short
            BUFFER_OWNERS.pop(id(buf.base), None)

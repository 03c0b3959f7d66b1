"""The Module API: ``Parameter``, ``Module`` and the work-buffer ``Workspace``.

A module holds its parameters (data + accumulated grad), caches what backward needs, and
allocates work buffers once for the largest batch it has seen; smaller batches use row
slices (contiguous, since buffers are C-ordered). Numerics live in ``kernels``.
"""
from __future__ import annotations

import math
from collections import OrderedDict

import numpy as np

from kernels.memory import aligned_empty

__all__ = ["Parameter", "Module", "Workspace", "make_rng", "check_dtype", "check_positive_int",
           "as_rows", "INITS", "init_weight"]

_FLOAT_DTYPES = (np.dtype(np.float32), np.dtype(np.float64))


def check_dtype(dtype) -> np.dtype:
    """Return ``dtype`` as a numpy dtype, float32 or float64, else raise TypeError."""
    try:
        dt = np.dtype(dtype)
    except TypeError:
        raise TypeError(f"dtype: expected float32 or float64, got {dtype!r}") from None
    if dt not in _FLOAT_DTYPES:
        raise TypeError(f"dtype: expected float32 or float64, got {dt}")
    return dt


def check_positive_int(name: str, v) -> int:
    """``v`` as an int >= 1: TypeError naming ``name`` for a non-int (bool and float included,
    as NumPy and PyTorch do for sizes), ValueError for one below 1."""
    if isinstance(v, bool) or not isinstance(v, (int, np.integer)):
        raise TypeError(f"{name}: expected a positive int, got {v!r} ({type(v).__name__})")
    if v < 1:
        raise ValueError(f"{name}: expected a positive int, got {v}")
    return int(v)


def make_rng(rng) -> np.random.Generator:
    """``rng`` as a Generator: an int seed (or None) makes a fresh one; a Generator is used as is."""
    if isinstance(rng, np.random.Generator):
        return rng
    if rng is None or (isinstance(rng, (int, np.integer)) and not isinstance(rng, bool)):
        return np.random.default_rng(rng)
    raise TypeError(f"rng: expected an int seed or a numpy.random.Generator, got {type(rng).__name__}")


INITS = ("he", "xavier", "normal", "zeros")


def init_weight(d_in: int, d_out: int, init: str, dtype, rng) -> np.ndarray:
    """A (d_in, d_out) weight: he N(0, 2/d_in), xavier N(0, 2/(d_in+d_out)), normal
    N(0, 0.02^2) or zeros. Drawn in float64 and rounded to ``dtype``, so float32 and float64
    modules built from one seed hold the same weights (up to rounding)."""
    if init == "zeros":
        return np.zeros((d_in, d_out), dtype)
    if init == "he":
        std = math.sqrt(2.0 / d_in)
    elif init == "xavier":
        std = math.sqrt(2.0 / (d_in + d_out))
    elif init == "normal":
        std = 0.02
    else:
        raise ValueError(f"init: expected one of {INITS}, got {init!r}")
    w = rng.standard_normal((d_in, d_out))  # (d_in, d_out) float64
    w *= std
    return w.astype(dtype)


def as_rows(x, d: int, dtype, name: str = "x"):
    """Check a module input and view it as rows: returns ``(x2d, lead_shape)``.

    ``x`` must be a C-contiguous ndarray of ``dtype``, of shape ``(N, d)`` or ``(B, T, d)``;
    the 2-D view ``(N or B*T, d)`` costs no copy. Raises TypeError/ValueError naming ``name``.
    """
    if not isinstance(x, np.ndarray):
        raise TypeError(f"{name}: expected a numpy.ndarray, got {type(x).__name__}")
    if x.dtype != dtype:
        raise TypeError(f"{name}: expected dtype {np.dtype(dtype)}, got {x.dtype} "
                        f"(convert with x.astype(np.{np.dtype(dtype)}))")
    if x.ndim not in (2, 3):
        raise ValueError(f"{name}: expected shape (N, {d}) or (B, T, {d}), got {x.shape}")
    if x.shape[-1] != d:
        raise ValueError(f"{name}: expected last dimension {d}, got shape {x.shape}")
    if not x.flags.c_contiguous:
        raise ValueError(f"{name}: expected a C-contiguous array, got strides {x.strides} "
                         f"for shape {x.shape} (use np.ascontiguousarray)")
    if x.ndim == 3:
        return x.reshape(-1, d), x.shape[:-1]
    return x, x.shape[:-1]


class Parameter:
    """A trainable array ``data`` with its accumulated gradient ``grad`` (same shape, dtype
    and memory order; starts at zero)."""

    __slots__ = ("data", "grad", "name")

    def __init__(self, data: np.ndarray, name: str = "", grad: np.ndarray | None = None):
        if not isinstance(data, np.ndarray):
            raise TypeError(f"data: expected a numpy.ndarray, got {type(data).__name__}")
        check_dtype(data.dtype)
        if not (data.flags.c_contiguous or data.flags.f_contiguous):
            raise ValueError(f"data: expected a contiguous array, got strides {data.strides}")
        self.data = data
        if grad is None:
            grad = np.zeros_like(data)  # keeps data's memory order
        elif grad.shape != data.shape or grad.dtype != data.dtype:
            raise ValueError(f"grad: expected shape {data.shape} and dtype {data.dtype}, "
                             f"got {grad.shape} {grad.dtype}")
        self.grad = grad
        self.name = name

    @property
    def shape(self):
        return self.data.shape

    @property
    def dtype(self):
        return self.data.dtype

    @property
    def size(self) -> int:
        return self.data.size

    def zero_grad(self) -> None:
        self.grad.fill(0.0)

    def __repr__(self) -> str:
        return f"Parameter({self.name!r}, shape={self.data.shape}, dtype={self.data.dtype})"


class Workspace:
    """Named work buffers that grow to the largest row count seen and are handed out as row
    slices, so a steady loop allocates nothing. Buffers start on a 64-byte boundary
    (``kernels.memory``: misaligned ufunc outputs ran up to 2x slower)."""

    def __init__(self, dtype):
        self.dtype = np.dtype(dtype)
        self._bufs: dict = {}

    def get(self, key: str, n: int, *cols: int) -> np.ndarray:
        """A C-contiguous ``(n, *cols)`` view of buffer ``key`` (contents undefined)."""
        buf = self._bufs.get(key)
        if buf is None or buf.shape[0] < n or buf.shape[1:] != cols:
            buf = self._bufs[key] = aligned_empty((n, *cols), self.dtype)
        return buf[:n]

    def nbytes(self) -> int:
        return sum(b.nbytes for b in self._bufs.values())


class Module:
    """Base class of every layer and block.

    Subclasses set ``Parameter`` and ``Module`` attributes (registered in assignment order,
    which fixes the order of ``named_parameters``) and implement ``forward``/``backward``.
    Outputs of ``forward``/``backward`` are views of the module's work buffers: they stay
    valid until the next call of the same method; copy them to keep them.
    """

    def __init__(self):
        object.__setattr__(self, "_params", OrderedDict())
        object.__setattr__(self, "_modules", OrderedDict())
        object.__setattr__(self, "training", True)

    def __setattr__(self, name, value):
        params = self.__dict__.get("_params")
        if params is None:
            raise AttributeError("Module.__init__() must be called before assigning attributes")
        if isinstance(value, Parameter):
            if not value.name:
                value.name = name
            params[name] = value
            self._modules.pop(name, None)
        elif isinstance(value, Module):
            self._modules[name] = value
            params.pop(name, None)
        object.__setattr__(self, name, value)

    # -- computation --------------------------------------------------------------------
    def forward(self, x):
        raise NotImplementedError(f"{type(self).__name__}.forward")

    def backward(self, dy):
        raise NotImplementedError(f"{type(self).__name__}.backward")

    def __call__(self, *args, **kwargs):
        return self.forward(*args, **kwargs)

    # -- parameters -----------------------------------------------------------------------
    def named_parameters(self, prefix: str = ""):
        """``(dotted_name, Parameter)`` pairs: own parameters first, then each child's, in
        registration order. A parameter shared by two children is listed once."""
        out, seen = [], set()
        self._collect(prefix, out, seen)
        return out

    def _collect(self, prefix, out, seen):
        for name, p in self._params.items():
            if id(p) not in seen:
                seen.add(id(p))
                out.append((prefix + name, p))
        for name, m in self._modules.items():
            m._collect(prefix + name + ".", out, seen)

    def parameters(self):
        return [p for _, p in self.named_parameters()]

    def named_modules(self, prefix: str = ""):
        """``(dotted_name, Module)`` pairs, this module first (named ``prefix``)."""
        yield prefix, self
        for name, m in self._modules.items():
            yield from m.named_modules(f"{prefix}.{name}" if prefix else name)

    def children(self):
        return list(self._modules.values())

    def num_parameters(self) -> int:
        return sum(p.size for p in self.parameters())

    def zero_grad(self) -> None:
        for p in self.parameters():
            p.grad.fill(0.0)

    # -- modes ------------------------------------------------------------------------------
    def train(self, mode: bool = True):
        object.__setattr__(self, "training", bool(mode))
        for m in self._modules.values():
            m.train(mode)
        return self

    def eval(self):
        return self.train(False)

    # -- state --------------------------------------------------------------------------------
    def state_dict(self) -> "OrderedDict[str, np.ndarray]":
        """Parameter name -> a copy of its data (C-ordered)."""
        return OrderedDict((n, np.array(p.data, order="C", copy=True))
                           for n, p in self.named_parameters())

    def load_state_dict(self, state) -> None:
        """Copy ``state`` into the parameters. Strict: the names must match exactly and every
        shape and dtype must agree; if any check fails nothing is changed."""
        if not hasattr(state, "keys"):
            raise TypeError(f"state: expected a mapping of name -> array, got {type(state).__name__}")
        named = self.named_parameters()
        own = {n for n, _ in named}
        missing = [n for n, _ in named if n not in state]
        unexpected = [k for k in state.keys() if k not in own]
        if missing or unexpected:
            raise KeyError(f"load_state_dict: missing keys {missing}, unexpected keys {unexpected}")
        for n, p in named:
            v = state[n]
            if not isinstance(v, np.ndarray):
                raise TypeError(f"load_state_dict: {n}: expected a numpy.ndarray, got {type(v).__name__}")
            if v.shape != p.data.shape:
                raise ValueError(f"load_state_dict: {n}: expected shape {p.data.shape}, got {v.shape}")
            if v.dtype != p.data.dtype:
                raise TypeError(f"load_state_dict: {n}: expected dtype {p.data.dtype}, got {v.dtype}")
        for n, p in named:
            p.data[...] = state[n]

    # -- display --------------------------------------------------------------------------------
    def extra_repr(self) -> str:
        return ""

    def __repr__(self) -> str:
        own = ", ".join(f"{n}={tuple(p.shape)}" for n, p in self._params.items())
        head = type(self).__name__ + "(" + ", ".join(s for s in (self.extra_repr(), own) if s)
        if not self._modules:
            return head + ")"
        lines = [head]
        for name, m in self._modules.items():
            child = repr(m).replace("\n", "\n  ")
            lines.append(f"  ({name}): {child}")
        return "\n".join(lines) + "\n)" + f"  # {self.num_parameters():,} parameters"

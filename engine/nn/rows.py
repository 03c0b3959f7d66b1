"""Helpers of the modules: random generators and weight initialisation, and the views of
(N, d) / (B, T, d) inputs as 2-D rows that every module's ``_forward`` works on."""
from __future__ import annotations

import math

import numpy as np

__all__ = ["make_rng", "INITS", "check_init", "init_weight", "check_array", "check_sequences",
           "as_rows", "rows_of", "flat3", "shaped", "defined_by", "describes_input", "input_spec"]


def make_rng(rng) -> np.random.Generator:
    """``rng`` as a Generator: an int seed (or None) makes a fresh one; a Generator is used as is."""
    if isinstance(rng, np.random.Generator):
        return rng
    if rng is None or (isinstance(rng, (int, np.integer)) and not isinstance(rng, bool)):
        if rng is not None and rng < 0:
            raise ValueError(f"rng: expected a non-negative int seed, got {rng}")
        return np.random.default_rng(rng)
    raise TypeError(f"rng: expected an int seed or a numpy.random.Generator, got {type(rng).__name__}")


INITS = ("he", "xavier", "normal", "zeros")


def check_init(init) -> str:
    """``init`` if it names a weight initialisation (one of ``INITS``), else ValueError."""
    if init not in INITS:
        raise ValueError(f"init: expected one of {INITS}, got {init!r}")
    return init


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


def check_array(name: str, x, dtype) -> None:
    if not isinstance(x, np.ndarray):
        raise TypeError(f"{name}: expected a numpy.ndarray, got {type(x).__name__}")
    if x.dtype != dtype:
        raise TypeError(f"{name}: expected dtype {np.dtype(dtype)}, got {x.dtype} "
                        f"(convert with .astype(np.{np.dtype(dtype)}))")


def check_sequences(x, d: int, why: str, name: str = "x") -> tuple:
    """``(B, T)`` of ``x``, a numpy array of shape (B, T, ...); TypeError for another type,
    ValueError for another number of dimensions, saying ``why`` sequences are needed (the
    feature count ``d`` is checked where the rows are taken)."""
    if not isinstance(x, np.ndarray):
        raise TypeError(f"{name}: expected a numpy.ndarray of shape (B, T, {d}), got "
                        f"{type(x).__name__}")
    if x.ndim != 3:
        raise ValueError(f"{name}: expected shape (B, T, {d}) ({why}), got {x.shape}")
    return x.shape[0], x.shape[1]


def as_rows(x, d, dtype, name: str = "x"):
    """Check a module input and view it as rows: returns ``(x2d, lead_shape)``.

    ``x`` must be a C-contiguous ndarray of ``dtype``, of shape ``(N, d)`` or ``(B, T, d)``
    (``d=None``: any feature size); the 2-D view costs no copy. Raises TypeError/ValueError
    naming ``name``."""
    check_array(name, x, dtype)
    if x.ndim not in (2, 3):
        want = "(N, d) or (B, T, d)" if d is None else f"(N, {d}) or (B, T, {d})"
        raise ValueError(f"{name}: expected shape {want}, got {x.shape}")
    if d is not None and x.shape[-1] != d:
        raise ValueError(f"{name}: expected last dimension {d}, got shape {x.shape}")
    if not x.flags.c_contiguous:
        raise ValueError(f"{name}: expected a C-contiguous array, got strides {x.strides} "
                         f"for shape {x.shape} (use np.ascontiguousarray)")
    if x.ndim == 3:
        return flat3(x), x.shape[:-1]
    return x, x.shape[:-1]


def rows_of(a, shape, dtype, name):
    """Check ``a`` against an expected full ``shape``; return its 2-D row view (no copy)."""
    if (not isinstance(a, np.ndarray) or a.shape != shape or a.dtype != dtype
            or not a.flags.c_contiguous):
        check_array(name, a, dtype)
        if a.shape != shape:
            raise ValueError(f"{name}: expected shape {shape}, got {a.shape}")
        raise ValueError(f"{name}: expected a C-contiguous array, got strides {a.strides} "
                         f"for shape {a.shape} (use np.ascontiguousarray)")
    return flat3(a) if a.ndim == 3 else a


def flat3(a):
    """(B, T, d) as (B*T, d) without a copy; explicit sizes, since reshape(-1, 0) of an
    empty feature axis is ambiguous to NumPy."""
    b, t, d = a.shape
    return a.reshape(b * t, d)


def shaped(a2, lead):
    """A 2-D row buffer back in the caller's leading shape."""
    return a2 if len(lead) == 1 else a2.reshape(*lead, a2.shape[-1])


def defined_by(cls, name: str):
    """The class in ``cls``'s method resolution order whose own namespace defines ``name``."""
    # A loop, not next(generator): a generator left unfinished is closed when collected, and
    # a Ctrl-C arriving in that close is swallowed ("Exception ignored") instead of raised.
    for c in cls.__mro__:
        if name in c.__dict__:
            return c
    raise AttributeError(f"{cls.__name__}.{name}")


def describes_input(model) -> bool:
    """Whether ``check_input`` of every module in ``model`` describes what its ``forward``
    takes: true unless a class overrides ``forward`` below the class that defines its
    ``check_input`` (a user's subclass with its own forward and no check_input of its own)."""
    for _, m in model.named_modules():  # a loop: see defined_by
        if not issubclass(defined_by(type(m), "check_input"), defined_by(type(m), "forward")):
            return False
    return True


def input_spec(shape: tuple, dtype) -> np.ndarray:
    """A read-only array of ``shape`` and ``dtype`` backed by one element: what a composite
    passes to its next child's ``check_input`` (the values are never read)."""
    return np.broadcast_to(np.zeros((), dtype), shape)

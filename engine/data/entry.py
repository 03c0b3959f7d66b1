"""Data entry of ``fit``, ``evaluate`` and ``predict``: any real-valued array-like (NumPy's
default float64 for a float32 model, a column slice ``X[:, :4]``, a list, an object with
``__array__`` such as a pandas DataFrame, a ``(N,)`` regression target) becomes, once on entry,
the C-contiguous array of the model's dtype the training loop takes. An array already in that
form is used as is; otherwise one copy of the data set is made, and every step reads views
of it. The modules themselves stay strict: ``Module.forward`` converts nothing.

What cannot be made real numbers (complex, text, objects, ragged lists, a value the dtype
cannot hold) is a TypeError/ValueError naming the argument; NaN passes through unchanged, for
``fit``'s own check (it refuses non-finite data) and ``evaluate``/``predict`` (NaN in, NaN out).
"""
from __future__ import annotations

import numpy as np

from ..nn.losses import CrossEntropyLoss, MSELoss
from ..nn.module import Module, describes_input, input_spec

__all__ = ["as_fit_arrays", "as_eval_arrays", "as_inputs", "as_targets", "cast_real"]

_REAL_KINDS = "biuf"  # bool, signed and unsigned integers, floats


def _as_array(name: str, a) -> np.ndarray:
    """``a`` as an ndarray (an ndarray itself, no copy); TypeError/ValueError naming ``name``
    for what is not a rectangular array of real numbers."""
    if not isinstance(a, np.ndarray):
        if not (isinstance(a, (list, tuple, memoryview)) or hasattr(a, "__array__")
                or hasattr(a, "__array_interface__")):
            raise TypeError(f"{name}: expected an array-like of real numbers (a numpy array, "
                            f"a list, an object with __array__), got {type(a).__name__}")
        try:
            a = np.asarray(a)
        except (ValueError, TypeError) as e:  # ragged nesting: NumPy says which dimension
            raise ValueError(f"{name}: not a rectangular array of numbers ({e})") from None
    if a.dtype.kind not in _REAL_KINDS:
        raise TypeError(f"{name}: expected real numbers, got dtype {a.dtype}")
    return a


def cast_real(name: str, a: np.ndarray, dt, hint: str = "use a float64 model") -> np.ndarray:
    """``a`` as a C-contiguous ``dt`` array (``a`` itself when it is one); a finite value that
    ``dt`` cannot hold (1e300 in float32) is a ValueError naming ``name`` and the index, not
    an inf (NaN and inf already in ``a`` pass through)."""
    if a.dtype == dt and a.flags.c_contiguous:
        return a
    with np.errstate(over="ignore"):
        out = np.ascontiguousarray(a, dtype=dt)
    if out.size and a.dtype.kind == "f" and dt.itemsize < a.dtype.itemsize:
        lo, hi = out.min(), out.max()
        if not (np.isfinite(lo) and np.isfinite(hi)):  # NaN or inf: find one that was finite
            bad = np.isinf(out) & np.isfinite(a)
            if bad.any():
                at = np.unravel_index(int(np.argmax(bad)), a.shape)
                raise ValueError(f"{name}: the value {a[at].item()!r} at index "
                                 f"{tuple(int(i) for i in at)} overflows {dt} ({hint})")
    return out


def _takes_integers(model, a: np.ndarray) -> bool:
    """Whether ``model`` reads integer ``a`` as integers (token ids for an Embedding), asked
    through its ``check_input`` on a one-element stand-in of ``a``'s shape and dtype."""
    try:
        model.check_input(input_spec(a.shape, a.dtype), "X")
    except TypeError:  # a float model: integers are values to convert
        return False
    except ValueError:  # the dtype passed; a shape error is for the full check to report
        return True
    return True


def as_inputs(model, X, name: str = "X") -> np.ndarray:
    """``X`` as the model takes it: integer ids stay integers for a model that reads ids;
    other real numbers become the model's dtype; C-contiguous. A model that does not describe
    its input (a ``forward`` of its own without ``check_input``) gets ``X`` C-contiguous in the
    dtype given; a non-Module ``model`` is left to the caller's checks."""
    a = _as_array(name, X)
    if not isinstance(model, Module):
        return a
    if not describes_input(model):  # it does not say what it takes: keep the dtype given
        return np.ascontiguousarray(a)
    if a.dtype.kind in "iu" and _takes_integers(model, a):
        return np.ascontiguousarray(a)
    return cast_real(name, a, model.dtype)


def _output_shape(model, X: np.ndarray):
    """The model's output shape for ``X``, or None when ``X`` does not fit it."""
    try:
        return tuple(model.check_input(input_spec(X.shape, X.dtype), "X"))
    except (TypeError, ValueError):  # the full check reports it
        return None


def _labels(name: str, a: np.ndarray) -> np.ndarray:
    """Class ids ``a`` as int64 (whole-number floats and bools included); a fractional or
    non-finite float is a ValueError naming where."""
    if a.dtype.kind in "iu":
        return np.ascontiguousarray(a)
    if a.dtype.kind == "f":
        with np.errstate(invalid="ignore"):
            bad = ~(np.isfinite(a) & (np.trunc(a) == a))
        if bad.any():
            at = np.unravel_index(int(np.argmax(bad)), a.shape)
            raise ValueError(f"{name}: expected whole-number class ids for CrossEntropyLoss, "
                             f"got {a[at].item()!r} at index {tuple(int(i) for i in at)}")
    return np.ascontiguousarray(a, dtype=np.int64)


def as_targets(model, loss, X: np.ndarray, Y, name: str = "Y") -> np.ndarray:
    """``Y`` as ``loss`` takes it for ``model``'s outputs on ``X`` (an array already
    converted): for ``CrossEntropyLoss``, class ids shaped as the outputs without their class
    axis (or with a class axis of 1: a column of ids, ``df[["label"]]``) become int64 labels
    and anything else probabilities of the model's dtype; for ``MSELoss``, values of the
    model's dtype, a ``(N,)`` target becoming ``(N, 1)`` for a model of one output column.
    Another loss, or a model that does not describe its input (no ``check_input`` of its
    own), gets an array, C-contiguous, of ``Y``'s dtype."""
    a = _as_array(name, Y)
    if not (isinstance(model, Module) and describes_input(model)
            and isinstance(loss, (CrossEntropyLoss, MSELoss))):
        return np.ascontiguousarray(a)
    out = _output_shape(model, X)
    lead = out[:-1] if out is not None else X.shape[:-1]
    if isinstance(loss, CrossEntropyLoss):
        if a.shape == (*lead, 1) and (out is None or out[-1] > 1):  # a column of ids
            a = a.reshape(lead)
        if a.dtype.kind in "iu" or a.shape == lead:  # integers are always labels
            return _labels(name, a)
        return cast_real(name, a, model.dtype)
    if out is not None and out[-1] == 1 and a.shape == lead:  # (N,) for one output column
        a = a.reshape(*lead, 1)
    return cast_real(name, a, model.dtype)


def as_eval_arrays(model, loss, X, Y, what: str = "") -> tuple:
    """``(X, Y)`` converted for ``evaluate`` (and each of ``fit``'s data sets)."""
    X = as_inputs(model, X, what + "X")
    return X, as_targets(model, loss, X, Y, what + "Y")


def as_fit_arrays(model, loss, X, Y, options: dict) -> tuple:
    """``(X, Y, options)`` for ``fit``: the training set and ``options["validation"]`` (when
    it is a pair) converted; ``options`` is a new dict, the caller's is not changed."""
    X, Y = as_eval_arrays(model, loss, X, Y)
    val = options.get("validation")
    if isinstance(val, (tuple, list)) and len(val) == 2:
        options = {**options, "validation": as_eval_arrays(model, loss, *val, "validation ")}
    return X, Y, options

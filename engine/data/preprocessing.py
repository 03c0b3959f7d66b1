"""Preparing arrays for training: ``infer_task``, ``train_val_split`` and the
``Standardizer``."""
from __future__ import annotations

import numbers

import numpy as np

from kernels.warn import warn

from .._checks import check_real
from ..nn.module import make_rng

__all__ = ["infer_task", "train_val_split", "Standardizer"]


def infer_task(Y) -> str:
    """"classification" for integer labels (N,), else "regression"."""
    if not isinstance(Y, np.ndarray):
        raise TypeError(f"Y: expected a numpy.ndarray, got {type(Y).__name__}")
    return "classification" if Y.ndim == 1 and np.issubdtype(Y.dtype, np.integer) else "regression"


def train_val_split(X, Y, val_fraction: float, rng=0):
    """Shuffle the samples with ``rng`` and split them: ``(X_train, Y_train), (X_val, Y_val)``
    with ``round(N * val_fraction)`` validation samples (at least one in each part), as new
    C-contiguous arrays. The pair is what ``fit(..., validation=)`` takes."""
    for name, a in (("X", X), ("Y", Y)):
        if not isinstance(a, np.ndarray) or a.ndim == 0:
            raise TypeError(f"{name}: expected a numpy.ndarray with a sample axis, got "
                            f"{type(a).__name__}")
    n = X.shape[0]
    if Y.shape[0] != n:
        raise ValueError(f"Y: expected {n} samples (X has {n}), got {Y.shape[0]}")
    check_real("val_fraction", val_fraction, 0.0, 1.0, low_open=True, high_open=True)
    n_val = int(round(n * float(val_fraction)))
    if n_val < 1 or n_val > n - 1:
        raise ValueError(f"val_fraction: {val_fraction} of {n} samples leaves "
                         f"{n_val} for validation and {n - n_val} for training; each needs at "
                         f"least one")
    order = make_rng(rng).permutation(n)
    val, train = order[:n_val], order[n_val:]
    return (np.take(X, train, axis=0), np.take(Y, train, axis=0)), \
           (np.take(X, val, axis=0), np.take(Y, val, axis=0))


def _numbers(name: str, v) -> np.ndarray:
    """``v``, a list (or tuple or 1-D array) of real numbers, as float64; else TypeError
    naming ``name`` (a string, nested lists or bools are not a saved mean or scale)."""
    if isinstance(v, np.ndarray) and v.ndim == 1 and v.dtype.kind in "fiu":
        return v.astype(np.float64)
    if not isinstance(v, (list, tuple)) or not all(
            isinstance(x, numbers.Real) and not isinstance(x, (bool, np.bool_)) for x in v):
        raise TypeError(f"{name}: expected a list of numbers, got {v!r:.60}")
    return np.array(v, np.float64)


# A standard deviation below this fraction of the column's largest magnitude is rounding
# noise of the mean (float64 gives ~1e-17 * |x| for a constant column), not a spread.
_CONSTANT_RTOL = 1e-12


def _constant_columns(rows: np.ndarray, std: np.ndarray) -> np.ndarray:
    """Mask of the columns of ``rows`` (N, d) whose ``std`` is zero or rounding noise."""
    magnitude = np.max(np.abs(rows), axis=0)
    return std <= _CONSTANT_RTOL * magnitude


def _cast_back(name: str, a: np.ndarray, result: np.ndarray) -> np.ndarray:
    """``result`` (float64) as a C-contiguous array of ``a``'s dtype; a finite value that
    dtype cannot hold becomes inf with a warning naming ``name`` at the caller's line."""
    with np.errstate(over="ignore"):
        out = np.ascontiguousarray(result, dtype=a.dtype)
    if out.size and not (np.isfinite(out.min()) and np.isfinite(out.max())):
        bad = np.isinf(out) & np.isfinite(result)
        if bad.any():
            at = tuple(int(i) for i in np.unravel_index(int(np.argmax(bad)), out.shape))
            warn(f"{name}: the standardised value {result[at].item()!r} at index {at} overflows "
                 f"{a.dtype} (inf); use float64 data", RuntimeWarning)
    return out


class Standardizer:
    """Per-feature standardisation ``(x - mean) / scale`` (the last axis), fit on the training
    set and applied unchanged to validation and new data. ``scale`` is the standard deviation
    (1 for a constant feature: one whose standard deviation is below 1e-12 of its largest
    magnitude, the rounding noise of a float64 mean). ``state_dict()`` is JSON-serialisable,
    so it can ride in a checkpoint's metadata: ``save(path, model,
    standardizer=s.state_dict())``, then
    ``Standardizer.from_state_dict(load(path, model)["standardizer"])``."""

    def __init__(self):
        self.mean = None   # (d,) float64
        self.scale = None  # (d,) float64

    def fit(self, X) -> "Standardizer":
        if not isinstance(X, np.ndarray) or X.ndim < 2 or X.shape[0] == 0 or X.shape[-1] == 0:
            raise ValueError(f"X: expected an array (N, d) with N, d >= 1, got "
                             f"{getattr(X, 'shape', type(X).__name__)}")
        rows = np.asarray(X, np.float64).reshape(-1, X.shape[-1])
        with np.errstate(over="ignore", invalid="ignore"):
            mean = rows.mean(axis=0)
            std = rows.std(axis=0)
        if not np.all(np.isfinite(rows)):
            raise ValueError("X: holds non-finite values")
        if not (np.all(np.isfinite(mean)) and np.all(np.isfinite(std))):
            raise ValueError("X: its mean or standard deviation overflows float64 (values "
                             "near 1e308); rescale the data first")
        std[_constant_columns(rows, std)] = 1.0  # a constant feature maps to 0, not to NaN
        self.mean, self.scale = mean, std
        return self

    def _check(self, X, name: str):
        if self.mean is None:
            raise RuntimeError("Standardizer: call fit(X_train) first")
        if not isinstance(X, np.ndarray):
            raise TypeError(f"{name}: expected a numpy.ndarray, got {type(X).__name__}")
        if X.dtype not in (np.float32, np.float64):
            raise TypeError(f"{name}: expected float32 or float64, got {X.dtype}")
        if X.ndim < 2 or X.shape[-1] != self.mean.shape[0]:
            raise ValueError(f"{name}: expected {self.mean.shape[0]} features in the last axis "
                             f"(as fitted), got shape {X.shape}")

    def transform(self, X) -> np.ndarray:
        """A new array ``(X - mean) / scale`` of ``X``'s dtype (a RuntimeWarning at the
        caller's line if a value overflows it)."""
        self._check(X, "X")
        return _cast_back("X", X, (X - self.mean) / self.scale)

    def inverse_transform(self, Z) -> np.ndarray:
        """A new array ``Z * scale + mean`` of ``Z``'s dtype (a RuntimeWarning at the
        caller's line if a value overflows it)."""
        self._check(Z, "Z")
        return _cast_back("Z", Z, Z * self.scale + self.mean)

    def fit_transform(self, X) -> np.ndarray:
        return self.fit(X).transform(X)

    def state_dict(self) -> dict:
        if self.mean is None:
            raise RuntimeError("Standardizer: call fit(X_train) first")
        return {"mean": self.mean.tolist(), "scale": self.scale.tolist()}

    @classmethod
    def from_state_dict(cls, state) -> "Standardizer":
        if not isinstance(state, dict) or set(state) != {"mean", "scale"}:
            raise ValueError(f"state: expected a dict with 'mean' and 'scale', got {state!r:.80}")
        mean, scale = (_numbers(f"state[{k!r}]", state[k]) for k in ("mean", "scale"))
        if mean.ndim != 1 or mean.shape != scale.shape or mean.size == 0:
            raise ValueError(f"state: 'mean' and 'scale' must be lists of one length, got "
                             f"{mean.shape} and {scale.shape}")
        if not (np.all(np.isfinite(mean)) and np.all(np.isfinite(scale)) and np.all(scale > 0)):
            raise ValueError("state: 'mean' must be finite and 'scale' finite and > 0")
        s = cls()
        s.mean, s.scale = mean, scale
        return s

    def __repr__(self) -> str:
        d = "not fitted" if self.mean is None else f"{self.mean.shape[0]} features"
        return f"Standardizer({d})"

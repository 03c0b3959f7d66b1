"""Regression metrics per output column, and the classification hit counter of ``fit``."""
from __future__ import annotations

import numpy as np

__all__ = ["r2_score", "mean_absolute_error", "Hits", "scored_rows"]


class Hits:
    """Counts correct argmax predictions into reused buffers (no per-batch allocation)."""

    def __init__(self):
        self._pred = self._true = self._eq = None

    def count(self, pred: np.ndarray, target: np.ndarray) -> int:
        logits = pred.reshape(-1, pred.shape[-1])
        rows = logits.shape[0]
        if self._pred is None or self._pred.shape[0] < rows:
            self._pred = np.empty(rows, np.intp)  # (rows,) predicted class
            self._true = np.empty(rows, np.intp)  # (rows,) target class (probability targets)
            self._eq = np.empty(rows, bool)       # (rows,) hit mask
        p, eq = self._pred[:rows], self._eq[:rows]
        np.argmax(logits, axis=1, out=p)
        if np.issubdtype(target.dtype, np.integer):
            t = target.reshape(rows)
        else:
            t = self._true[:rows]
            np.argmax(target.reshape(rows, -1), axis=1, out=t)
        np.equal(p, t, out=eq)
        return int(np.count_nonzero(eq))


def scored_rows(pred: np.ndarray) -> int:
    """Positions scored by cross-entropy in ``pred`` (N for (N, C), B*T for (B, T, C))."""
    return pred.size // pred.shape[-1]


def r2_score(y_true, y_pred) -> np.ndarray:
    """Coefficient of determination per output column: 1 - SS_res / SS_tot (float64, (d,));
    NaN for a column whose true values are all equal (SS_tot = 0: R^2 is undefined)."""
    t = np.asarray(y_true, np.float64).reshape(len(y_true), -1)
    p = np.asarray(y_pred, np.float64).reshape(len(y_pred), -1)
    if t.shape != p.shape:
        raise ValueError(f"y_pred: expected shape {t.shape} (y_true's), got {p.shape}")
    ss_res = ((t - p) ** 2).sum(axis=0)
    ss_tot = ((t - t.mean(axis=0)) ** 2).sum(axis=0)
    with np.errstate(divide="ignore", invalid="ignore"):
        r2 = 1.0 - ss_res / ss_tot
    r2[ss_tot == 0.0] = np.nan
    return r2


def mean_absolute_error(y_true, y_pred) -> np.ndarray:
    """Mean absolute error per output column (float64, (d,))."""
    t = np.asarray(y_true, np.float64).reshape(len(y_true), -1)
    p = np.asarray(y_pred, np.float64).reshape(len(y_pred), -1)
    if t.shape != p.shape:
        raise ValueError(f"y_pred: expected shape {t.shape} (y_true's), got {p.shape}")
    return np.abs(t - p).mean(axis=0)

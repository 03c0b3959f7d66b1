"""The synthetic tasks for examples, tests and ``python -m engine train``: a smooth
regression, two spirals, XOR and a sine. Same ``rng`` seed, same data; ``X`` of the requested
float dtype, classification targets int64 labels."""
from __future__ import annotations

import numpy as np

from .._checks import check_int
from ..nn.module import check_dtype, make_rng

__all__ = ["REGRESSION_OUTPUTS", "regression", "regression_targets", "spiral", "xor", "sine",
           "TASKS", "make_task"]

REGRESSION_OUTPUTS = ("sin(0.3(x0+x1+x2))", "tanh(0.25(x0-x3+x4-x5+x6))",
                      "0.1(x7+x8)^2-0.6", "0.1*x9*x10+0.2*x11")


def _check_n(n, minimum: int = 1) -> int:
    return check_int("n", n, minimum)


def regression_targets(X: np.ndarray) -> np.ndarray:
    """The four fixed smooth targets of the regression task, for inputs ``X`` (N, >=12), in
    float64 (N, 4). Inputs 12..15 of the 16 are distractors that no target depends on.

        y0 = sin(0.3 (x0 + x1 + x2))              a smooth wave along a diagonal
        y1 = tanh(0.25 (x0 - x3 + x4 - x5 + x6))   a saturating ridge (shares x0 with y0)
        y2 = 0.1 (x7 + x8)^2 - 0.6                 a quadratic valley, about zero-mean
        y3 = 0.1 x9 x10 + 0.2 x11                  a pairwise interaction plus a linear term
    """
    x = np.asarray(X, dtype=np.float64)
    if x.ndim != 2 or x.shape[1] < 12:
        raise ValueError(f"X: expected shape (N, d) with d >= 12, got {x.shape}")
    Y = np.empty((x.shape[0], 4))  # (N, 4)
    Y[:, 0] = np.sin(0.3 * (x[:, 0] + x[:, 1] + x[:, 2]))
    Y[:, 1] = np.tanh(0.25 * (x[:, 0] - x[:, 3] + x[:, 4] - x[:, 5] + x[:, 6]))
    Y[:, 2] = 0.1 * (x[:, 7] + x[:, 8]) ** 2 - 0.6
    Y[:, 3] = 0.1 * x[:, 9] * x[:, 10] + 0.2 * x[:, 11]
    return Y


def regression(n: int = 1024, d_in: int = 16, dtype=np.float32, rng=0):
    """The default regression task: ``X`` uniform in [-3, 3]^d_in (N, d_in), ``Y`` (N, 4) the fixed
    smooth nonlinear functions of ``regression_targets`` (each with a standard deviation of
    about 0.45 to 0.7 over the input box)."""
    dt = check_dtype(dtype)
    n = _check_n(n)
    check_int("d_in", d_in, 12, what="an integer >= 12 (the targets use inputs 0..11)")
    X = make_rng(rng).uniform(-3.0, 3.0, size=(n, int(d_in)))  # float64, then cast once
    return X.astype(dt), regression_targets(X).astype(dt)


def spiral(n: int = 1000, turns: float = 2.0, noise: float = 0.05, dtype=np.float32, rng=0):
    """Two interleaved spirals in the plane: ``X`` (n, 2) in about [-1, 1]^2, labels ``y`` (n,)
    int64 in {0, 1} (n // 2 per class, interleaved). Class 1 is class 0 rotated by pi; each
    spiral winds ``turns`` times around the origin, with Gaussian ``noise`` (std) added."""
    dt = check_dtype(dtype)
    n = _check_n(n, 2)
    g = make_rng(rng)
    y = np.arange(n, dtype=np.int64) % 2
    # Radius grows with the angle; sqrt spreads the points evenly along the arm's length.
    t = np.sqrt(g.uniform(0.0, 1.0, n)) * turns * 2.0 * np.pi
    r = t / (turns * 2.0 * np.pi)
    angle = t + np.pi * y
    X = np.stack([r * np.cos(angle), r * np.sin(angle)], axis=1)
    X += noise * g.standard_normal(X.shape)
    return X.astype(dt), y


def xor(dtype=np.float32):
    """The four XOR points: ``X`` (4, 2) in {0, 1}^2 and labels ``y`` = [0, 1, 1, 0] (int64)."""
    dt = check_dtype(dtype)
    X = np.array([[0, 0], [0, 1], [1, 0], [1, 1]], dtype=dt)
    return X, np.array([0, 1, 1, 0], dtype=np.int64)


def sine(n: int = 256, dtype=np.float32, rng=0):
    """``X`` (n, 1) uniform in [-pi, pi] and ``Y = sin(X)`` (n, 1)."""
    dt = check_dtype(dtype)
    X = make_rng(rng).uniform(-np.pi, np.pi, size=(_check_n(n), 1))
    return X.astype(dt), np.sin(X).astype(dt)


# name -> (kind, default number of samples)
TASKS = {"regression": ("regression", 1024), "spiral": ("classification", 1000),
         "xor": ("classification", 4), "sine": ("regression", 256)}


def make_task(name: str, n: int | None = None, dtype=np.float32, rng=0):
    """``(X, Y, kind)`` for a task of ``TASKS`` (``n`` is ignored for xor)."""
    if name not in TASKS:
        raise ValueError(f"task: expected one of {sorted(TASKS)}, got {name!r}")
    kind, default_n = TASKS[name]
    n = default_n if n is None else n
    if name == "regression":
        X, Y = regression(n, dtype=dtype, rng=rng)
    elif name == "spiral":
        X, Y = spiral(n, dtype=dtype, rng=rng)
    elif name == "xor":
        X, Y = xor(dtype)
    else:
        X, Y = sine(n, dtype=dtype, rng=rng)
    return X, Y, kind

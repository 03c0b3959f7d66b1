"""When the command line takes a target for class labels without being told: only for a
small label set. An integer column alone says nothing (prices, counts and years are
integers too): a house-price file must not become a model with half a million classes.

The rule: one integer target column whose values are 0 .. K-1 (some may be absent) with
K <= ``MAX_INFERRED_CLASSES`` and at least two samples per class on average (K <= N / 2).
Anything else that is integer is refused with the two ways to say what was meant.
"""
from __future__ import annotations

import numpy as np

__all__ = ["MAX_INFERRED_CLASSES", "small_label_set", "refusal"]

MAX_INFERRED_CLASSES = 100


def small_label_set(Y: np.ndarray) -> bool:
    """Whether integer labels ``Y`` (N,) form a small label set (the module's rule)."""
    if Y.size == 0:
        return False
    k = int(Y.max()) + 1
    return int(Y.min()) >= 0 and k <= MAX_INFERRED_CLASSES and k <= max(2, Y.size // 2)


def refusal(Y: np.ndarray, name: str) -> str:
    """The usage error for integer labels that are not a small label set."""
    lo, hi = int(Y.min()), int(Y.max())
    classes = f"{hi + 1} classes" if lo >= 0 else "negative class labels"
    return (f"--data: the target {name} holds integers from {lo} to {hi} ({Y.size} samples); "
            f"class labels are inferred only for a small label set (0 .. K-1 with K <= "
            f"{MAX_INFERRED_CLASSES} and at least 2 samples per class), and these would make "
            f"{classes}. Say --task regression for a numeric target, or --task "
            f"classification for class labels")

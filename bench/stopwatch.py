"""Wall-clock samples of a call for the stand-alone bench scripts (``bench/distributed.py``,
``bench/embedding_backward.py``), which report medians outside pytest-benchmark: no
interference filter (``bench/timing.py`` has that) and nothing imported but the standard
library (``bench/timing.py`` imports kernels, which applies the thread count on import)."""
from __future__ import annotations

import time


def sample(fn, reps: int, warm: int = 1) -> list:
    """``warm`` untimed calls of ``fn()``, then the seconds each of ``reps`` timed calls took."""
    for _ in range(warm):
        fn()
    times = []
    for _ in range(reps):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return times

"""How every benchmark is timed: quick mode, the round count, the pytest-benchmark call.

``BLASNET_BENCH_QUICK=1`` (set by ``run.py --quick``) shortens every benchmark. The thread
count comes from ``BLASNET_NUM_THREADS``, which the driver sets before Python starts.
"""
from __future__ import annotations

import os
import statistics
import time

import kernels

QUICK = os.environ.get("BLASNET_BENCH_QUICK", "") not in ("", "0")
# Seconds of timed rounds per benchmark, and the bounds on the round count.
TARGET_S = 0.15 if QUICK else 1.0
MIN_ROUNDS, MAX_ROUNDS = (3, 40) if QUICK else (7, 400)
# At least this many alternating pairs: a burst of other work on a shared machine spoils a
# few consecutive pairs, and the median must outvote them.
MIN_PAIRS = 3 if QUICK else 15


def rounds_for(seconds_per_call: float) -> int:
    return int(min(MAX_ROUNDS, max(MIN_ROUNDS, TARGET_S / max(seconds_per_call, 1e-7))))


def paired_ratio(fn, ref, seconds_per_pair: float) -> float:
    """Median over alternating pairs of time(fn) / time(ref). A shared machine drifts over
    seconds; two calls back to back see the same conditions, so this ratio is steadier than
    one of two medians taken at different times."""
    clock = time.perf_counter
    ratios = []
    for i in range(max(MIN_PAIRS, rounds_for(seconds_per_pair))):
        if i % 2:
            t0 = clock(); ref(); t1 = clock(); fn(); t2 = clock()  # noqa: E702
            ratios.append((t2 - t1) / (t1 - t0))
        else:
            t0 = clock(); fn(); t1 = clock(); ref(); t2 = clock()  # noqa: E702
            ratios.append((t1 - t0) / (t2 - t1))
    return statistics.median(ratios)


def on_one_thread(fn):
    """``fn`` run with every BLAS pool limited to one thread (the limit is restored after
    each call; switching costs ~10 us)."""
    def run():
        with kernels.num_threads(1):
            fn()
    return run


def run_benchmark(benchmark, fn, floor=None, scaling=False, **info):
    """Time ``fn`` with pytest-benchmark: untimed calls (the first allocates work buffers,
    the second sizes the round count; quick mode makes only the first and no warm-up
    rounds), then ``rounds_for`` rounds of one call each, medians taken by the driver.
    ``info`` (block, shape, kind, flops, ...) goes into the JSON's ``extra_info`` with the
    thread count. With ``floor``, the median ratio of alternating fn/floor pairs is stored
    too (``paired_ratio``); with ``scaling`` (and more than one thread), the median ratio of
    alternating one-thread/this-many-threads pairs (``paired_scaling``): the thread scaling
    measured side by side in one process."""
    t0 = time.perf_counter()
    fn()  # the first call allocates the work buffers
    per_call = time.perf_counter() - t0
    if not QUICK:  # a steady call sizes the round count (quick: the first one's bound will do)
        t0 = time.perf_counter()
        fn()
        per_call = time.perf_counter() - t0
    rounds = rounds_for(per_call)
    benchmark.extra_info.update(info, threads=kernels.get_num_threads(), quick=QUICK)
    warmup = 0 if QUICK else (1 if per_call > 0.02 else 3)
    benchmark.pedantic(fn, rounds=rounds, iterations=1, warmup_rounds=warmup)
    if floor is not None:
        floor()
        benchmark.extra_info["paired_ratio"] = paired_ratio(fn, floor, 2 * per_call)
    threads = benchmark.extra_info["threads"]
    if scaling and threads > 1:
        benchmark.extra_info["paired_scaling"] = paired_ratio(
            on_one_thread(fn), fn, (1 + threads) * per_call)

"""How every benchmark is timed: quick mode, warm-up, round counts, the pytest-benchmark call,
and the interference filter that drops samples during which another process took a core.

``BLASNET_BENCH_QUICK=1`` (set by ``run.py --quick``) shortens every benchmark. The thread
count comes from ``BLASNET_NUM_THREADS``, which the driver sets before Python starts.
"""
from __future__ import annotations

import os
import statistics
import time
from typing import NamedTuple

import kernels
import kernels.ops  # noqa: F401  (settle runs the engine's GEMM entry)
from kernels import overlap
from kernels import parallel as kparallel

QUICK = os.environ.get("BLASNET_BENCH_QUICK", "") not in ("", "0")
# Seconds of timed rounds per benchmark, and the bounds on the round count.
TARGET_S = 0.15 if QUICK else 1.0
MIN_ROUNDS, MAX_ROUNDS = (3, 40) if QUICK else (7, 400)
# At least this many alternating pairs (undisturbed ones: see CpuProbe). Even undisturbed,
# large-shape pairs spread by a few percent, and a median of 3 can land 5% off.
MIN_PAIRS = 5 if QUICK else 15
# Untimed calls before a benchmark's rounds: at least WARM_CALLS and WARM_S seconds. A
# freshly built case is slow for its first ~10 calls at the seed shapes (buffers faulted in,
# OpenBLAS's workers and blasnet's pool threads woken: 0.85, 0.40, 0.30 ... 0.25 ms).
# Warm-up goes on until a call is clean (CpuProbe), for at most WARM_MAX_S: the round count
# is sized from that call, not from one slowed down by another process.
WARM_S = 0.03 if QUICK else 0.2
WARM_CALLS = 1 if QUICK else 2
WARM_MAX_S = 0.5 if QUICK else 1.0
# At process start, wait (at most this long) for 0.1 s in which no other process disturbs a
# loop of small GEMMs on every thread: a process that starts during someone else's burst
# would otherwise time its first benchmarks inside it.
SETTLE_MAX_S = 2.0 if QUICK else 5.0
# A median needs this many clean samples; with fewer it falls back to all of them (flagged).
MIN_CLEAN = 3
# Thread scaling pairs of calls shorter than this run each timed call after an untimed one
# at the same thread count (timing.paired_scaling); above it the switch's cost is noise.
SCALING_LEAD_IN_BELOW_S = 0.05
# Seconds per process that may go to samples replacing disturbed ones (extra pairs, extra
# rounds): a machine that stays busy cannot stretch the bench past its time limit.
EXTRA_S = 8.0 if QUICK else 40.0
_extra = {"left": EXTRA_S}


def extra_left() -> float:
    """Seconds left for replacement samples in this process."""
    return _extra["left"]


def spend_extra(seconds: float) -> None:
    _extra["left"] -= seconds


def wait_for_quiet() -> None:
    """After a run of disturbed samples: settle() (at most SETTLE_MAX_S), charged to the
    replacement budget. With both cores taken by other processes, a 2-thread call that is
    mostly GEMMs can take ~200x longer (seed000's floor: 0.25 -> 56 ms per call, measured
    with two spinning processes): no sample is worth taking until they stop."""
    if extra_left() > 0:
        spend_extra(settle(min(SETTLE_MAX_S, extra_left())))


def all_disturbed(reasons, n=3) -> bool:
    """The last ``n`` samples were all disturbed."""
    return len(reasons) >= n and all(r is not None for r in reasons[-n:])


def rounds_for(seconds_per_call: float) -> int:
    return int(min(MAX_ROUNDS, max(MIN_ROUNDS, TARGET_S / max(seconds_per_call, 1e-7))))


# ----------------------------------------------------------------------------- interference
# On this 2-core machine another process that takes a core stalls a 2-thread GEMM: OpenBLAS's
# threads wait for each other, and a 0.25 ms call can take 5-60 ms. Such samples are dropped.
# Signals, read before and after each sample (a few us, outside the timed region):
#  - wait: the time this process's threads were runnable but not running, summed over them
#    (/proc/self/task/*/schedstat, ns). A disturbed sample shows ms of it; our own threads
#    cost 0.2-1% of a step's wall time (a pool thread next to a spinning OpenBLAS worker).
#    blasnet's pool and lane threads are left out: they poll between tasks, so they are
#    runnable, and wait, whenever another of our threads has their core.
#  - steal: time the hypervisor ran something else on our virtual CPUs (/proc/stat).
#  - others: the machine's busy CPU time (/proc/stat: user+nice+system+irq+softirq+steal)
#    minus this process's CPU time. /proc/stat counts in 10 ms ticks (and other threads' CPU
#    time is only updated at kernel ticks), so this one only speaks for long samples: the
#    margin is two ticks per CPU plus 5% of the machine's capacity.
WAIT_MIN_NS = 50_000
WAIT_FRACTION = 0.02
OTHERS_FRACTION = 0.05
NCPU = os.cpu_count() or 1
TICK_NS = 1e9 / os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 1e7


class Sample(NamedTuple):
    wall: int      # ns, perf_counter
    own: int       # ns, CPU time of this process (all threads)
    busy: float    # ns, busy time of the machine (/proc/stat), tick resolution
    steal: float   # ns, steal time of the machine (/proc/stat)
    waits: dict    # thread id -> ns this thread was runnable but waited for a CPU


class CpuProbe:
    """Reads the interference signals above; ``available`` is False where /proc lacks them
    (every sample then counts as clean). ``refresh()`` re-lists this process's threads:
    call it after warm-up calls, which start the thread pools."""

    def __init__(self):
        try:
            self._stat = os.open("/proc/stat", os.O_RDONLY)
        except OSError:
            self._stat = None
        self._tasks: dict = {}
        self.refresh()
        self.available = self._stat is not None and bool(self._tasks)

    def refresh(self) -> None:
        for fd in self._tasks.values():
            os.close(fd)
        self._tasks = {}
        try:
            tids = os.listdir("/proc/self/task")
        except OSError:
            return
        # blasnet's pool and lane threads poll (yielding) between their tasks: their waits
        # for a CPU are their own doing, not another process's
        ours = {str(t) for t in kparallel.pool_thread_ids() | overlap.lane_thread_ids()}
        for tid in tids:
            if tid in ours:
                continue
            try:
                self._tasks[tid] = os.open(f"/proc/self/task/{tid}/schedstat", os.O_RDONLY)
            except OSError:
                pass

    def sample(self) -> Sample:
        wall, own = time.perf_counter_ns(), time.process_time_ns()
        busy = steal = 0.0
        if self._stat is not None:
            # "cpu  user nice system idle iowait irq softirq steal ..." in clock ticks
            v = os.pread(self._stat, 160, 0).split(b"\n", 1)[0].split()
            t = [int(x) for x in v[1:9]]
            busy = (t[0] + t[1] + t[2] + t[5] + t[6] + t[7]) * TICK_NS
            steal = t[7] * TICK_NS
        waits = {}
        for tid, fd in list(self._tasks.items()):
            try:  # "run_ns wait_ns timeslices"
                waits[tid] = int(os.pread(fd, 64, 0).split()[1])
            except (OSError, IndexError, ValueError):  # the thread ended
                os.close(fd)
                del self._tasks[tid]
        return Sample(wall, own, busy, steal, waits)

    def disturbed(self, a: Sample, b: Sample) -> str | None:
        """Why the interval from ``a`` to ``b`` is not clean ("wait", "steal", "others"),
        or None when it is."""
        if not self.available:
            return None
        wall = b.wall - a.wall
        wait = sum(w - a.waits[t] for t, w in b.waits.items() if t in a.waits)
        if wait > WAIT_MIN_NS + WAIT_FRACTION * wall:
            return "wait"
        if b.steal > a.steal:
            return "steal"
        others = (b.busy - a.busy) - (b.own - a.own)
        if others > NCPU * (2 * TICK_NS + OTHERS_FRACTION * wall):
            return "others"
        return None


_probe: CpuProbe | None = None


def probe() -> CpuProbe:
    global _probe
    if _probe is None:
        _probe = CpuProbe()
    return _probe


class Clean(NamedTuple):
    """A median over the clean samples (or over all of them, ``fallback``, when fewer than
    MIN_CLEAN were clean); ``kept``/``total`` samples; ``why``: dropped samples by reason;
    ``values``/``reasons``: every sample and why it was dropped (None: kept)."""
    value: float
    kept: int
    total: int
    fallback: bool
    why: dict
    values: list
    reasons: list

    def info(self, prefix: str, samples: bool = True) -> dict:
        """The extra_info entries of this measurement, keys starting with ``prefix``;
        ``samples``: with every sample and why it was dropped ("" = kept)."""
        out = {prefix: self.value, prefix + "_kept": [self.kept, self.total],
               prefix + "_fallback": self.fallback, prefix + "_dropped": dict(self.why)}
        if samples:
            out[prefix + "_samples"] = [float(f"{v:.5g}") for v in self.values]
            out[prefix + "_disturbed"] = [r or "" for r in self.reasons]
        return out


def clean_median(values, reasons) -> Clean:
    """Median of ``values`` whose reason (same order) is None; all of them as a flagged
    fallback when fewer than MIN_CLEAN are clean."""
    kept = [v for v, r in zip(values, reasons) if r is None]
    why: dict = {}
    for r in reasons:
        if r is not None:
            why[r] = why.get(r, 0) + 1
    fallback = len(kept) < min(MIN_CLEAN, len(values))
    return Clean(statistics.median(values if fallback else kept), len(kept), len(values),
                 fallback, why, list(values), list(reasons))


# ----------------------------------------------------------------------------- measurements
def paired_ratio(fn, ref, seconds_per_pair: float, setup=None, before=(None, None)) -> Clean:
    """Median over alternating pairs of time(fn) / time(ref), over the pairs no other process
    disturbed. A shared machine drifts over seconds; two calls back to back see the same
    conditions, so this ratio is steadier than one of two medians taken at different times.
    Disturbed pairs are replaced by more pairs, up to twice the planned count plus 3, while
    the process's EXTRA_S budget lasts. ``setup`` runs, untimed, before every call of
    either; ``before`` = (hook of fn, hook of ref) runs, untimed, after it (e.g. switching
    the thread count: ``paired_scaling``)."""
    clock = time.perf_counter
    p = probe()
    p.refresh()
    want = max(MIN_PAIRS, rounds_for(seconds_per_pair))
    ratios, reasons = [], []

    def timed(f, hook):
        if setup is not None:
            setup()
        if hook is not None:
            hook()
        t0 = clock()
        f()
        return clock() - t0
    while len(ratios) < 2 * want + 3:
        i = len(ratios)
        s0 = p.sample()
        if i % 2:
            t_ref = timed(ref, before[1])
            t_fn = timed(fn, before[0])
        else:
            t_fn = timed(fn, before[0])
            t_ref = timed(ref, before[1])
        ratios.append(t_fn / t_ref)
        reasons.append(p.disturbed(s0, p.sample()))
        if i >= want:  # a replacement pair
            spend_extra(t_fn + t_ref)
        if reasons.count(None) >= want or (i + 1 >= want and extra_left() <= 0):
            break
        if all_disturbed(reasons):
            wait_for_quiet()
    return clean_median(ratios, reasons)


def warm_up(fn, setup=None) -> float:
    """Untimed calls: at least WARM_CALLS, for WARM_S seconds, until one is clean (at most
    WARM_MAX_S); returns the last call's time (``setup()`` runs before each, not timed)."""
    clock, p = time.perf_counter, probe()
    start = clock()
    calls = 0
    while True:
        if setup is not None:
            setup()
        s0 = p.sample()
        t0 = clock()
        fn()
        t1 = clock()
        calls += 1
        clean = p.disturbed(s0, p.sample()) is None
        if calls == 1:
            p.refresh()  # the first call may have started pool threads
        if calls >= WARM_CALLS and t1 - start >= WARM_S and (clean or t1 - start >= WARM_MAX_S):
            return t1 - t0


def settle(max_s: float = SETTLE_MAX_S) -> float:
    """Wake the BLAS threads and wait for a quiet machine: 256^3 float32 GEMMs on the
    process's threads until 0.1 s pass undisturbed, or ``max_s``. Returns the seconds waited
    (``max_s`` or more: the machine stayed busy)."""
    import numpy as np
    a = np.ones((256, 256), np.float32)
    c = np.empty_like(a)
    gemm = kernels.ops.gemm
    clock, p = time.perf_counter, probe()
    gemm(c, a, a)
    p.refresh()
    start = clock()
    quiet = p.sample()
    while True:
        for _ in range(10):
            gemm(c, a, a)
        s = p.sample()
        if p.disturbed(quiet, s) is not None:
            quiet = s
        elif s.wall - quiet.wall >= 100_000_000:
            return clock() - start
        if clock() - start >= max_s:
            return clock() - start


def timed_rounds(fn, rounds: int, setup=None) -> tuple:
    """``rounds`` timed calls outside pytest-benchmark, each after an untimed ``setup()``:
    (times, reasons)."""
    clock, p = time.perf_counter, probe()
    times, reasons = [], []
    for _ in range(rounds):
        if setup is not None:
            setup()
        s0 = p.sample()
        t0 = clock()
        fn()
        times.append(clock() - t0)
        reasons.append(p.disturbed(s0, p.sample()))
    return times, reasons


def paired_rounds(fn, ref, pairs: int) -> tuple:
    """``pairs`` alternating calls of ``fn`` and ``ref``, the order flipping every pair (as
    ``paired_ratio``, without replacing disturbed pairs): (times of fn, times of ref,
    reasons), one entry per pair."""
    clock, p = time.perf_counter, probe()
    p.refresh()
    t_fn, t_ref, reasons = [], [], []
    for i in range(pairs):
        s0 = p.sample()
        for f, out in ((ref, t_ref), (fn, t_fn)) if i % 2 else ((fn, t_fn), (ref, t_ref)):
            t0 = clock()
            f()
            out.append(clock() - t0)
        reasons.append(p.disturbed(s0, p.sample()))
    return t_fn, t_ref, reasons


def paired_scaling(fn, threads: int, seconds_per_pair: float, setup=None,
                   lead_in: bool = True) -> Clean:
    """Median over alternating pairs of time(``fn`` at one thread) / time(``fn`` at
    ``threads``), as ``paired_ratio``: the thread count (BLAS pools and blasnet's
    elementwise passes) is switched before each timed call, outside the timed interval, and
    left at ``threads``. With ``lead_in``, ``fn`` also runs once untimed after each switch
    (then ``setup`` again), so the timed call runs as in a steady loop at that count: the
    first GEMM after a switch waits for OpenBLAS's worker (+40 µs at seed000)."""
    def at(n):
        def switch():
            kernels.set_num_threads(n)
            if lead_in:
                fn()
                if setup is not None:
                    setup()
        return switch
    try:
        return paired_ratio(fn, fn, seconds_per_pair, setup, before=(at(1), at(threads)))
    finally:
        kernels.set_num_threads(threads)


def on_one_thread(fn):
    """``fn`` run with every BLAS pool limited to one thread (the limit is restored after
    each call; switching costs ~10 us)."""
    def run():
        with kernels.num_threads(1):
            fn()
    return run


def run_benchmark(benchmark, fn, floor=None, scaling=False, setup=None, **info):
    """Time ``fn`` with pytest-benchmark after ``warm_up`` (whose last call sizes the round
    count), ``rounds_for`` rounds of one call each, every round checked for interference
    (CpuProbe, sampled in the round's untimed setup and teardown). The median over the clean
    rounds goes into ``extra_info`` as ``median_clean`` (with ``median_clean_kept`` = [kept,
    total]); when fewer than half the rounds are clean, up to as many rounds again are timed
    outside pytest-benchmark to find clean ones. ``setup`` (e.g. evicting the caches, or
    restoring a replayed floor's buffers) runs, untimed, before every timed call of ``fn``
    (the scaling pairs' included). ``info`` (block, shape, kind, flops, ...)
    goes into ``extra_info`` with the thread count. With ``floor``, the median ratio of
    alternating fn/floor pairs is stored too (``paired_ratio``, clean pairs only); with
    ``scaling`` (and more than one thread), the ratio of alternating one-thread/this-many-
    threads pairs (``paired_scaling``): the thread scaling measured side by side in one
    process."""
    if setup is not None and floor is not None:
        raise ValueError("setup: not supported together with floor (paired block/floor calls)")
    per_call = warm_up(fn, setup)  # its first call allocates the work buffers
    if floor is not None:  # back to back: restored first when it can be (floors.replay_fn)
        warm_up(floor, getattr(floor, "restore", None))
    rounds = rounds_for(per_call)
    p = probe()
    p.refresh()
    marks = []
    benchmark.extra_info.update(info, threads=kernels.get_num_threads(), quick=QUICK)

    def before():
        if setup is not None:
            setup()
        marks.append(p.sample())
    benchmark.pedantic(fn, rounds=rounds, iterations=1, warmup_rounds=0, setup=before,
                       teardown=lambda: marks.append(p.sample()))
    if getattr(benchmark, "stats", None) is None:  # --benchmark-disable: nothing was timed
        return
    times = list(benchmark.stats.stats.data)
    reasons = [p.disturbed(a, b) for a, b in zip(marks[0::2], marks[1::2])]
    need = max(MIN_CLEAN, rounds // 2)
    budget = rounds
    while reasons.count(None) < need and budget > 0 and extra_left() > 0:
        if all_disturbed(reasons):
            wait_for_quiet()
        n = min(budget, need - reasons.count(None))
        t, r = timed_rounds(fn, n, setup)
        spend_extra(sum(t))
        times += t
        reasons += r
        budget -= n
    benchmark.extra_info.update(clean_median(times, reasons).info("median_clean", False))
    if floor is not None:
        benchmark.extra_info.update(paired_ratio(fn, floor, 2 * per_call).info("paired_ratio"))
    threads = benchmark.extra_info["threads"]
    if scaling and threads > 1:
        warm_up(on_one_thread(fn), setup)
        lead_in = per_call < SCALING_LEAD_IN_BELOW_S
        benchmark.extra_info.update(paired_scaling(
            fn, threads, (1 + threads) * (1 + lead_in) * per_call, setup,
            lead_in).info("paired_scaling"))

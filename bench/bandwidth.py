"""The machine's memory bandwidth, measured in the bench's own run, and what AdamW moves.

``triad_fn`` is a STREAM-style triad (McCalpin's STREAM), a = b + s*c over three float32
arrays each at least 4x the last-level cache, split over blasnet's threads like the
elementwise kernels (``kernels.parallel.split``), compiled as they are (kernels.jit): one
pass, b and c read and a written, as the optimizer's compiled update is.

Bytes counted: 4 arrays per triad, STREAM's 3 plus the write-allocate read of a. NumPy's
stores are ordinary cached stores, so the CPU reads each line of a before it overwrites
it. ``update_fn`` (a += s*c: a and c read, a written, and no write-allocate, since a was just
read) is timed next to it as the check: if the triad really moves 4 arrays, both report the
same GB/s; if the machine skipped the write-allocate, the triad's GB/s would come out 4/3 of
the update's. ``python -m bench.bandwidth`` prints both.

AdamW moves 7 arrays per parameter (Loshchilov & Hutter 2019; PyTorch's update): p, g, m, v
read and p, m, v written; each written array was read first, so it has no write-allocate.
``evict_fn`` reads a buffer twice the last-level cache: run before a timed AdamW step, it
leaves the optimizer state in memory, as it is after a forward and backward.
"""
from __future__ import annotations

import glob
import os

import numpy as np

from kernels import memory, parallel
from kernels.jit import jit

# Row names of the kernel table (bench/test_bench_kernels.py) that bench/analysis.py reads.
TRIAD_ROW = "memory triad a=b+s*c"
UPDATE_ROW = "memory update a+=s*c"
ADAMW_ROW = "AdamW.step (engine)"
ADAMW_COLD_ROW = "AdamW.step, cold cache"

TRIAD_ARRAYS = 4         # b, c read; a read (write-allocate) and written
UPDATE_ARRAYS = 3        # a, c read; a written
ADAMW_ARRAYS = 7         # p, g, m, v read; p, m, v written
TRIAD_BLOCK = 128 * 1024  # elements per call of the compiled loop (each thread's slice in blocks)
FALLBACK_LLC = 32 << 20  # bytes, when the OS does not say


def llc_bytes() -> int:
    """Size of the last-level cache (the highest-level cache sysfs lists for CPU 0)."""
    best = (0, 0)
    for d in glob.glob("/sys/devices/system/cpu/cpu0/cache/index*"):
        try:
            with open(os.path.join(d, "level")) as f:
                level = int(f.read())
            with open(os.path.join(d, "size")) as f:
                text = f.read().strip()
        except (OSError, ValueError):
            continue
        scale = {"K": 1 << 10, "M": 1 << 20, "G": 1 << 30}.get(text[-1:], 1)
        try:
            size = int(text.rstrip("KMG")) * scale
        except ValueError:
            continue
        best = max(best, (level, size))
    if best[1]:
        return best[1]
    size = os.sysconf("SC_LEVEL3_CACHE_SIZE") if hasattr(os, "sysconf") else 0
    return size if size and size > 0 else FALLBACK_LLC


def triad_elements(dtype=np.float32) -> int:
    """Elements per triad array: 4x the last-level cache, at least 64 MiB."""
    return max(4 * llc_bytes(), 64 << 20) // np.dtype(dtype).itemsize


def _arrays(n, dtype):
    a, b, c = (memory.aligned_empty(n, dtype) for _ in range(3))
    b.fill(1.0)  # every page touched before timing
    c.fill(2.0)
    a.fill(0.0)
    return a, b, c


@jit
def _triad(a, b, c, s, i0, i1):
    a, b, c = a[i0:i1], b[i0:i1], c[i0:i1]
    for i in range(i1 - i0):
        a[i] = b[i] + s * c[i]
    return 0


def _blocked(n, body):
    """A callable running ``body(i, j)`` over blocks of ``range(n)``, split over blasnet's
    threads."""
    blk = TRIAD_BLOCK

    def part(i0, i1, slot):
        for i in range(i0, i1, blk):
            body(i, min(i + blk, i1))

    def run():
        parallel.split(part, n, 1, 0)  # min_elements=0: always over every thread
    return run


def triad_fn(n: int | None = None, dtype=np.float32, scalar: float = 3.0):
    """A callable running a = b + s*c over ``n`` elements (default ``triad_elements``);
    ``run.bytes`` = the bytes one call moves (TRIAD_ARRAYS arrays), ``run.arrays`` =
    (a, b, c)."""
    dtype = np.dtype(dtype)
    n = triad_elements(dtype) if n is None else int(n)
    a, b, c = _arrays(n, dtype)
    s = dtype.type(scalar)
    run = _blocked(n, lambda i, j: _triad(a, b, c, s, i, j))
    run.bytes = TRIAD_ARRAYS * n * dtype.itemsize
    run.arrays = (a, b, c)
    return run


def update_fn(n: int | None = None, dtype=np.float32, scalar: float = 3.0):
    """A callable running a += s*c (the write-allocate check); ``run.bytes`` = UPDATE_ARRAYS
    arrays, ``run.arrays`` = (a, c). ``s`` alternates sign so that a stays bounded."""
    dtype = np.dtype(dtype)
    n = triad_elements(dtype) if n is None else int(n)
    a, _, c = _arrays(n, dtype)
    s = [dtype.type(scalar)]
    inner = _blocked(n, lambda i, j: _triad(a, a, c, s[0], i, j))

    def run():
        inner()
        s[0] = -s[0]
    run.bytes = UPDATE_ARRAYS * n * dtype.itemsize
    run.arrays = (a, c)
    return run


def evict_fn():
    """A callable that reads 2x the last-level cache (a sum), pushing out what was cached."""
    buf = np.ones(2 * llc_bytes() // 4, np.float32)

    def run():
        buf.sum()
    return run


def adamw_bytes(n_params: int, itemsize: int = 4) -> int:
    """Bytes one AdamW step moves over ``n_params`` parameters."""
    return ADAMW_ARRAYS * itemsize * n_params


def main(argv=None) -> int:
    """Time the triad and the update (medians of alternating calls) and print GB/s."""
    import argparse
    import statistics
    import time
    ap = argparse.ArgumentParser(description="memory bandwidth: triad and a += s*c")
    ap.add_argument("--reps", type=int, default=15)
    args = ap.parse_args(argv)
    fns = {"triad a = b + s*c": triad_fn(), "update a += s*c": update_fn()}
    times: dict = {k: [] for k in fns}
    for _ in range(args.reps):
        for k, f in fns.items():
            t0 = time.perf_counter()
            f()
            times[k].append(time.perf_counter() - t0)
    for k, f in fns.items():
        t = statistics.median(times[k])
        print(f"{k:20s} {1e3 * t:8.2f} ms  {f.bytes / t / 1e9:6.1f} GB/s "
              f"({f.bytes // (f.arrays[0].nbytes)} arrays of {f.arrays[0].nbytes >> 20} MiB)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

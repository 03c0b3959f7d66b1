"""Compile the kernels ahead of first use, in several processes at once.

numba compiles a kernel lazily, on its first call with new argument types, and keeps it on
disk (kernels.jit). A process that needs many kernels for the first time (the test suite on a
fresh clone, a cold ``make run``) compiles them one after another on one core. This fills
the same disk cache beforehand, the work split over ``--jobs`` processes (numba's cache is
safe to write from several processes), so that the later process only loads:

    python -m kernels.precompile [--jobs 2] [--list FILE]

The kernels and argument types come from a list, ``precompile.txt`` beside this file, one
``module<TAB>function<TAB>argument types<TAB>seconds`` per line (the seconds, as measured
when the list was recorded, balance the processes). ``make test`` runs it beside the tests:
the test process compiles what it reaches first itself, and then finds the rest compiled. The list is recorded from a test run
(tests/support/record_kernels.py). It is only a speed-up: an entry whose kernel no longer
exists or whose types no longer fit is skipped and counted; a kernel missing from it is
compiled on first use, as without this step.
"""
from __future__ import annotations

import argparse
import importlib
import subprocess
import sys
import time
from pathlib import Path

from .threads import usable_cores

__all__ = ["LIST", "read_list", "parse_types", "compile_entries", "partition", "main"]

LIST = Path(__file__).with_name("precompile.txt")


def read_list(path=LIST) -> list:
    """``[(module, function, types, seconds)]`` from a list file (``#`` lines are comments)."""
    entries = []
    for line in Path(path).read_text().splitlines():
        if not line.strip() or line.startswith("#"):
            continue
        module, func, types, seconds = line.split("\t")
        entries.append((module, func, types, float(seconds)))
    return entries


def parse_types(text: str) -> tuple:
    """The argument types written as numba prints a signature, e.g.
    ``(Array(float32, 2, 'C', False, aligned=True), int64)``, as a tuple of numba types."""
    from numba.core import types
    names = {k: v for k, v in vars(types).items() if not k.startswith("_")}
    names.update(bool=types.boolean, none=types.none)
    value = eval(text, {"__builtins__": {}}, names)  # noqa: S307 (our own list's type names)
    value = value if isinstance(value, tuple) else (value,)
    if not all(isinstance(t, types.Type) for t in value):
        raise ValueError(f"not numba types: {text}")
    return value


def compile_entries(entries) -> dict:
    """Compile (or load from the disk cache) each entry; counts of each outcome."""
    from numba.core.dispatcher import Dispatcher
    counts = dict(compiled=0, cached=0, stale=0)
    for module, func, text, _ in entries:
        try:
            disp = getattr(importlib.import_module(module), func)
            if not isinstance(disp, Dispatcher):
                raise TypeError(f"{module}.{func} is not a compiled kernel")
            sig = parse_types(text)
            hits = sum(disp.stats.cache_hits.values())
            disp.compile(sig)
        except Exception:  # renamed or changed kernel: it compiles on first use instead
            counts["stale"] += 1
            continue
        counts["cached" if sum(disp.stats.cache_hits.values()) > hits else "compiled"] += 1
    return counts


def partition(entries, jobs: int) -> list:
    """``jobs`` lists of entries with about equal recorded seconds (longest kernel first,
    each to the least loaded list), each in its list's original order. All versions of one
    kernel go to the same list: numba keeps one index file per kernel, and two processes
    adding versions to it at once could each drop the other's."""
    groups: dict = {}
    for i, e in enumerate(entries):
        groups.setdefault((e[0], e[1]), []).append(i)
    order = sorted(groups.values(), key=lambda g: -sum(entries[i][3] for i in g))
    loads, parts = [0.0] * jobs, [[] for _ in range(jobs)]
    for g in order:
        j = loads.index(min(loads))
        loads[j] += sum(entries[i][3] for i in g)
        parts[j].extend(g)
    return [[entries[i] for i in sorted(p)] for p in parts]


def main(argv=None) -> int:
    p = argparse.ArgumentParser(prog="python -m kernels.precompile", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--jobs", type=int, default=usable_cores(),
                   help="processes compiling at once (default: the CPUs this process may use)")
    p.add_argument("--list", default=str(LIST), help="the list of kernels and argument types")
    p.add_argument("--part", type=str, default=None, help=argparse.SUPPRESS)  # "i/n": a worker
    args = p.parse_args(argv)
    if args.jobs < 1:
        p.error(f"--jobs: expected at least 1, got {args.jobs}")
    entries = read_list(args.list)
    if args.part is not None:
        i, n = (int(v) for v in args.part.split("/"))
        counts = compile_entries(partition(entries, n)[i])
        print(" ".join(f"{k}={v}" for k, v in counts.items()))
        return 0
    from . import jit
    if jit.disabled():
        print("precompile: NUMBA_DISABLE_JIT is set, nothing to compile")
        return 0
    t0 = time.perf_counter()
    jobs = max(1, min(args.jobs, len(entries)))
    procs = [subprocess.Popen([sys.executable, "-m", "kernels.precompile", "--list", args.list,
                               "--part", f"{i}/{jobs}"], stdout=subprocess.PIPE, text=True)
             for i in range(jobs)]
    totals = dict(compiled=0, cached=0, stale=0)
    failed = 0
    for proc in procs:
        out, _ = proc.communicate()
        if proc.returncode != 0:
            failed += 1
            continue
        for item in out.split():
            k, v = item.split("=")
            totals[k] += int(v)
    print(f"precompile: {len(entries)} kernel versions in {jobs} processes, "
          f"{time.perf_counter() - t0:.1f} s: {totals['compiled']} compiled, "
          f"{totals['cached']} already cached, {totals['stale']} stale entries skipped"
          + (f", {failed} processes failed" if failed else ""))
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())

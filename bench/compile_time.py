"""What the compiled kernels cost on first use: cold (empty compile cache) and warm.

numba compiles each kernel lazily, on its first call with new argument types, and keeps the
result on disk (kernels.jit: ``cache=True``). By default that cache sits beside the source
(``__pycache__``); ``NUMBA_CACHE_DIR`` moves it, and then numba neither reads nor writes the
in-tree one. So ``python bench/compile_time.py [--quick]`` points NUMBA_CACHE_DIR at a fresh
temporary directory (the user's caches are not touched) and runs, in fresh processes:

- **cold**: the empty directory: every kernel a step needs is compiled;
- **warm**: a second process on the same directory: every kernel is loaded from it.

Each process (one BLAS thread: the compile cost does not depend on it) times ``import
engine``, then the first training step (``cases.step_fn``: forward, loss, backward, AdamW) of
each bench block in float32 and then float64, in that order (a kernel shared by two blocks is
compiled in the first one's step), and the median of the next few (the steady step). The first
step minus the steady one is its first-use cost. The processes also count, over every numba
dispatcher in kernels/ and engine/, the compiled specialisations and the cache hits/misses
(what tells cold from warm, whatever the times), and the seconds numba spent compiling, per
kernel (its "numba:compile" events). Then ``make run`` (``python -m engine
train``, the thread setting as given) as a whole process, cold and warm, on its own fresh
cache directory. Python's own
bytecode caches are as they are in both (a fresh clone also compiles its .py files once).

Writes bench/results/compile_time.json and prints a table. ``--quick``: tiny shapes, and
``make run`` with 20 epochs instead of its 1000.
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "bench" / "results"
DTYPES = ("float32", "float64")
MAKE_RUN = ("-m", "engine", "train")
QUICK_EPOCHS = 20
# Steps after the first whose median is the steady step time.
STEADY_STEPS = 5
# Threads of the step processes: the compile cost does not depend on them, and one thread is
# the steadiest on a shared machine. make run keeps the thread setting it is given.
STEP_THREADS = 1


# ----------------------------------------------------------------------------- child
def numba_counts(packages=("kernels", "engine")) -> dict:
    """Over every numba dispatcher held by a loaded module of ``packages``: how many, their
    compiled specialisations, and the disk-cache hits and misses of this process."""
    counts = dict(dispatchers=0, signatures=0, cache_hits=0, cache_misses=0)
    if "numba" not in sys.modules:
        return counts
    from numba.core.dispatcher import Dispatcher
    seen = set()
    for name, mod in list(sys.modules.items()):
        if not (name.split(".")[0] in packages and mod is not None):
            continue
        for obj in list(vars(mod).values()):
            if isinstance(obj, Dispatcher) and id(obj) not in seen:
                seen.add(id(obj))
                counts["dispatchers"] += 1
                counts["signatures"] += len(obj.signatures)
                counts["cache_hits"] += sum(obj.stats.cache_hits.values())
                counts["cache_misses"] += sum(obj.stats.cache_misses.values())
    return counts


def compile_recorder():
    """A listener of numba's "numba:compile" events (one per compiled specialisation; a
    kernel's compile encloses those of the helpers it calls), registered; or None without
    numba. ``.report()``: the seconds spent compiling (outermost events), how many functions
    were compiled (numba's own overloads that a kernel needs included) and the slowest, each
    with its inclusive seconds. Loading from the disk cache raises no such event."""
    if "numba" not in sys.modules:
        return None
    from numba.core import event

    class Recorder(event.Listener):
        def __init__(self):
            self.open, self.total, self.by_kernel = [], 0.0, {}

        def on_start(self, ev):
            self.open.append(time.perf_counter())

        def on_end(self, ev):
            seconds = time.perf_counter() - self.open.pop()
            if not self.open:
                self.total += seconds
            disp = ev.data.get("dispatcher") if isinstance(ev.data, dict) else None
            py = getattr(disp, "py_func", None)
            name = f"{py.__module__}.{py.__qualname__}" if py else str(disp)
            self.by_kernel[name] = self.by_kernel.get(name, 0.0) + seconds

        def report(self, top: int = 10) -> dict:
            slowest = sorted(self.by_kernel.items(), key=lambda kv: -kv[1])[:top]
            return dict(compile_s=self.total, functions_compiled=len(self.by_kernel),
                        slowest=[[k, v] for k, v in slowest])

    recorder = Recorder()
    event.register("numba:compile", recorder)
    return recorder


def _shape(block: str, quick: bool):
    """The block's first bench shape (``cases.CASES``), or a tiny one with the same sizes."""
    from bench import cases
    first = cases.SHAPES[next(s for b, s in cases.CASES if b == block)]
    if not quick:
        return first
    if "sizes" in first.dims:
        return cases.Shape("tiny", (4,), sizes=(8, 6, 4))
    return cases.Shape("tiny", (4,), d_model=8, d_ff=16)


def child(blocks, dtypes, quick: bool) -> dict:
    """This process: ``import engine``, then the first two steps of each block and dtype."""
    clock = time.perf_counter
    t0 = clock()
    import engine  # noqa: F401  (timed: the engine, kernels, numpy, scipy, numba)
    import_s = clock() - t0
    # After the import (so that it is timed alone): a kernel compiled at import is in import_s.
    recorder = compile_recorder()
    import numpy as np

    from bench import cases
    steps = []
    for dtype in dtypes:
        for block in blocks:
            shape = _shape(block, quick)
            t1 = clock()
            case = cases.build_case(block, shape, dtype=np.dtype(dtype))
            build_s = clock() - t1
            times = []
            for _ in range(1 + STEADY_STEPS):
                t1 = clock()
                case["step"]()
                times.append(clock() - t1)
            steps.append(dict(block=block, dtype=dtype, shape=shape.name, build_s=build_s,
                              first_s=times[0], steady_s=statistics.median(times[1:])))
    total = import_s + sum(s["build_s"] + s["first_s"] for s in steps)
    counts = numba_counts()
    counts.update(recorder.report() if recorder else dict(compile_s=0.0, functions_compiled=0,
                                                           slowest=[]))
    return dict(import_s=import_s, steps=steps, total_s=total, numba=counts,
                jit_disabled=os.environ.get("NUMBA_DISABLE_JIT") not in (None, "", "0"))


# ----------------------------------------------------------------------------- parent
def _env(cache_dir: str, threads: int | None = None) -> dict:
    """This environment with numba's cache moved to ``cache_dir``, the repository importable,
    and ``threads`` BLAS threads if given (the OpenBLAS variables kept as given)."""
    env = dict(os.environ, NUMBA_CACHE_DIR=cache_dir)
    if threads is not None:
        env["BLASNET_NUM_THREADS"] = str(threads)
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(ROOT), env.get("PYTHONPATH")]))
    return env


def run_process(cmd, cache_dir: str, threads: int | None = None,
                timeout_s: float = 1800.0) -> tuple:
    """``(seconds, CompletedProcess)``: the whole process's wall time, from start to exit."""
    t0 = time.perf_counter()
    proc = subprocess.run(cmd, cwd=ROOT, env=_env(cache_dir, threads), capture_output=True,
                          text=True, timeout=timeout_s)
    return time.perf_counter() - t0, proc


def measure_steps(blocks, dtypes, quick: bool, cache_dir: str) -> dict:
    """The cold process on ``cache_dir`` (expected empty), then the warm one on the same."""
    cmd = [sys.executable, str(Path(__file__).resolve()), "--child", "--blocks", *blocks,
           "--dtypes", *dtypes] + ["--quick"] * quick
    out = {}
    for mode in ("cold", "warm"):
        wall, proc = run_process(cmd, cache_dir, STEP_THREADS)
        if proc.returncode != 0:
            raise RuntimeError(f"compile_time: the {mode} process failed (exit "
                               f"{proc.returncode}):\n{proc.stderr[-3000:]}")
        out[mode] = dict(json.loads(proc.stdout), process_s=wall)
    return out


def measure_make_run(epochs: int | None, cache_dir: str) -> dict:
    """``make run``'s command as a whole process, cold then warm on ``cache_dir``."""
    cmd = [sys.executable, *MAKE_RUN] + (["--epochs", str(epochs)] if epochs else [])
    out = dict(command=" ".join(["python", *cmd[1:]]), epochs=epochs or 1000)
    for mode in ("cold", "warm"):
        wall, proc = run_process(cmd, cache_dir)
        if proc.returncode != 0:
            raise RuntimeError(f"compile_time: make run ({mode}) failed (exit "
                               f"{proc.returncode}):\n{proc.stderr[-3000:]}")
        out[f"{mode}_s"] = wall
    return out


def measure(blocks, dtypes, quick: bool, make_run: bool = True, epochs: int | None = None,
            echo=print) -> dict:
    """Everything, each part on a fresh temporary cache directory (removed afterwards)."""
    with tempfile.TemporaryDirectory(prefix="blasnet-numba-") as tmp:
        steps_dir, run_dir = os.path.join(tmp, "steps"), os.path.join(tmp, "run")
        t0 = time.perf_counter()
        from kernels import blas_kernel
        data = dict(quick=quick, blocks=list(blocks), dtypes=list(dtypes),
                    date=time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
                    blas=blas_kernel.facts(measure=False),
                    steps=measure_steps(blocks, dtypes, quick, steps_dir))
        echo(f"  [compile time] cold and warm steps after {time.perf_counter() - t0:.0f} s")
        if make_run:
            t0 = time.perf_counter()
            data["make_run"] = measure_make_run(epochs, run_dir)
            echo(f"  [compile time] make run cold and warm after "
                 f"{time.perf_counter() - t0:.0f} s")
    return data


def format_table(data: dict) -> str:
    cold, warm = data["steps"]["cold"], data["steps"]["warm"]
    lines = ["JIT COST: first use of the compiled kernels; cold = empty numba cache "
             "(NUMBA_CACHE_DIR a fresh directory),",
             "warm = a second process on that cache. first = the first training step, "
             f"steady = the median of the next {STEADY_STEPS}",
             f"(warm process); first - steady = its first-use cost. Blocks in order, float32 "
             f"then float64, in one process each, {STEP_THREADS} BLAS thread.",
             f"{'':<40}{'cold first':>12}{'warm first':>12}{'steady':>10}{'cold - steady':>15}"
             f"{'warm - steady':>15}"]

    def ms(s):
        return f"{1e3 * s:,.1f} ms"
    lines.append(f"{'import engine':<40}{ms(cold['import_s']):>12}{ms(warm['import_s']):>12}")
    for c, w in zip(cold["steps"], warm["steps"]):
        label = f"{c['block']} {c['dtype']} ({c['shape']})"
        steady = w["steady_s"]
        lines.append(f"{label:<40}{ms(c['first_s']):>12}{ms(w['first_s']):>12}"
                     f"{ms(steady):>10}{ms(c['first_s'] - steady):>15}"
                     f"{ms(w['first_s'] - steady):>15}")
    lines.append(f"{'total: import + builds + first steps':<40}{ms(cold['total_s']):>12}"
                 f"{ms(warm['total_s']):>12}")
    lines.append(f"{'whole process (start to exit)':<40}{cold['process_s']:>10.2f} s"
                 f"{warm['process_s']:>10.2f} s")
    for mode, d in (("cold", cold), ("warm", warm)):
        n = d["numba"]
        lines.append(f"numba, {mode}: {n['dispatchers']} kernels, {n['signatures']} compiled "
                     f"specialisations, cache hits {n['cache_hits']}, misses "
                     f"{n['cache_misses']}; {n.get('compile_s', 0.0):.2f} s compiling"
                     + (" (NUMBA_DISABLE_JIT set)" if d.get("jit_disabled") else ""))
    slowest = cold["numba"].get("slowest") or []
    if slowest:
        lines.append("slowest compiles, cold (s, a kernel's own helpers included): " + ", ".join(
            f"{name.rsplit('.', 1)[-1]} {sec:.2f}" for name, sec in slowest[:6]))
    if "make_run" in data:
        r = data["make_run"]
        lines.append(f"make run ({r['command']}), whole process: cold {r['cold_s']:.2f} s, "
                     f"warm {r['warm_s']:.2f} s")
    return "\n".join(lines)


def main(argv=None) -> int:
    # bench.cases (and so numpy) is imported only after the child has timed `import engine`.
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true",
                    help=f"tiny shapes; make run with {QUICK_EPOCHS} epochs")
    ap.add_argument("--blocks", nargs="+", default=None, metavar="BLOCK",
                    help="bench blocks (bench/cases.py), in order (default: all)")
    ap.add_argument("--dtypes", nargs="+", default=list(DTYPES), choices=DTYPES)
    ap.add_argument("--no-make-run", action="store_true", help="skip the make run processes")
    ap.add_argument("--epochs", type=int, default=None,
                    help=f"make run's epochs (default: its own 1000, {QUICK_EPOCHS} with "
                         f"--quick)")
    ap.add_argument("--out", type=Path, default=RESULTS / "compile_time.json")
    ap.add_argument("--report-only", action="store_true",
                    help="run nothing; print the table from --out")
    ap.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.epochs is not None and args.epochs < 1:
        ap.error(f"--epochs: expected a positive integer, got {args.epochs}")
    if args.child:
        result = child(args.blocks, args.dtypes, args.quick)
        from bench import cases
        cases.write_json(result)
        return 0
    from bench import cases
    for block in args.blocks or ():
        if block not in cases.BLOCKS:
            ap.error(f"--blocks: expected names from {cases.BLOCKS}, got {block!r}")
    args.blocks = args.blocks or list(cases.BLOCKS)
    if args.report_only:
        print(format_table(json.loads(args.out.read_text())))
        return 0
    print(f"blasnet compile time{' (quick)' if args.quick else ''}: {len(args.blocks)} blocks x "
          f"{len(args.dtypes)} dtypes, cold and warm", flush=True)
    epochs = args.epochs or (QUICK_EPOCHS if args.quick else None)
    data = measure(args.blocks, args.dtypes, args.quick, not args.no_make_run, epochs,
                   echo=lambda s: print(s, flush=True))
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(data, indent=1))
    print()
    print(format_table(data))
    return 0


if __name__ == "__main__":
    # Run as a script, bench/ itself is sys.path[0]; the package is imported as "bench" instead.
    sys.path[:] = [p for p in sys.path if Path(p or ".").resolve() != ROOT / "bench"]
    if str(ROOT) not in sys.path:
        sys.path.insert(0, str(ROOT))
    sys.exit(main())

"""`make bench`: run the benchmarks at 1 and 2 BLAS threads and print one table.

Each thread count runs pytest-benchmark over bench/ in a fresh process (BLASNET_NUM_THREADS is
read at import, so it is set in the child's environment), writing
bench/results/threads<N>.json; then one process profiles the full step of each transformer
block at the large shape and the highest thread count (bench/step_profile.py, profile.json),
one process per thread count profiles the small shapes (profile_small<N>.json), and one
measures memory with tracemalloc (bench/results/memory.json). The report puts every step next
to its GEMM floor, the naive reference, its 1- and 2-thread times and the targets, and says
where the time of each missed target goes. Times and ratios are medians over the samples no
other process disturbed (bench/timing.py). The kernel table includes the machine's memory
bandwidth (a triad, bench/bandwidth.py) and AdamW.step's effective bandwidth as a fraction of
it, measured in the same process. ``--report-only`` re-prints it from the saved JSON.
"""
from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:  # run as a script: make the "bench" package importable
    sys.path.insert(0, str(ROOT))

from bench import cases  # noqa: E402
from bench.analysis import (block_rows, kernel_rows, load_benchmarks, noise_summary,  # noqa: E402
                            scaling_rows, thread_rows)
from bench.report import format_report, machine_line  # noqa: E402
from bench.targets import target_checks  # noqa: E402
from kernels import blas_kernel  # noqa: E402

RESULTS = ROOT / "bench" / "results"
_SUMMARY = re.compile(r"\d+ (passed|failed|error|skipped)")
BENCH_FILES = ("bench/test_bench_blocks.py", "bench/test_bench_kernels.py")


# ----------------------------------------------------------------------------- running
def run_pytest(threads: int, quick: bool, out_json: Path, select: str | None = None,
               files=BENCH_FILES, echo=print) -> int:
    """One pytest-benchmark process at ``threads`` threads; progress lines are echoed,
    pytest-benchmark's own long table is not (the JSON has it all)."""
    cmd = [sys.executable, "-m", "pytest", *files, "-q", "-p", "no:cacheprovider",
           "--rootdir", str(ROOT), f"--benchmark-json={out_json}", "--benchmark-columns=median"]
    if select:
        cmd += ["-k", select]
    out_json.unlink(missing_ok=True)  # never report a previous run's numbers as this one's
    t0 = time.perf_counter()
    proc = subprocess.Popen(cmd, cwd=ROOT, env=cases.child_env(threads, quick),
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    lines = []
    for line in proc.stdout:
        lines.append(line)
        s = line.strip()
        if s.endswith("%]") or _SUMMARY.search(s):  # progress dots and the final count
            echo(f"  [threads={threads}] {s}")
    rc = proc.wait()
    echo(f"  [threads={threads}] pytest exit {rc} after {time.perf_counter() - t0:.0f} s")
    if rc != 0:
        echo("".join(lines[-60:]))
    return rc


def run_profile(out_json: Path, threads: int, quick: bool, echo=print, options=(),
                label="profile") -> int:
    """The step profile (bench/step_profile.py) in its own process at ``threads`` threads;
    ``options``: its command-line options (default: the large shape)."""
    out_json.unlink(missing_ok=True)
    cmd = [sys.executable, "-m", "bench.step_profile", "--out", str(out_json), *options]
    proc = cases.run_child(cmd, threads, quick, f"{label}, threads={threads}", echo)
    if proc.returncode != 0:
        echo(proc.stdout[-3000:] + proc.stderr[-3000:])
    return proc.returncode


def run_memory(out_json: Path, which=None, echo=print) -> int:
    """The tracemalloc pass (bench/memory.py) in its own process."""
    out_json.unlink(missing_ok=True)
    cmd = [sys.executable, "-m", "bench.memory", "--out", str(out_json)]
    for block, shape in which or ():
        cmd += ["--case", f"{block}:{shape}"]
    proc = cases.run_child(cmd, 1, False, "memory", echo)
    if proc.returncode != 0:
        echo(proc.stdout[-3000:] + proc.stderr[-3000:])
    return proc.returncode



def _load(path: Path) -> list:
    return json.loads(path.read_text()) if path.exists() else []


def report(result_dir: Path, threads=(1, 2)) -> tuple:
    """Load what the runs wrote and return (text, data)."""
    bench = load_benchmarks([result_dir / f"threads{t}.json" for t in threads])
    rows, krows = block_rows(bench), kernel_rows(bench)
    scaling = scaling_rows(rows)
    ratios = thread_rows(rows)
    memory = _load(result_dir / "memory.json")
    profile = _load(result_dir / "profile.json")
    small = [p for t in threads for p in _load(result_dir / f"profile_small{t}.json")]
    checks = target_checks(rows, krows, scaling, memory, ratios)
    noise = noise_summary(bench)
    m_path = result_dir / "machine.json"
    machine = json.loads(m_path.read_text()) if m_path.exists() else None
    data = dict(machine=machine, blocks=rows, kernels=krows, scaling=scaling,
                thread_ratios=ratios, memory=memory, profile=profile, profile_small=small,
                noise=noise, targets=checks)
    text = format_report(data)
    if machine:
        text = machine_line(machine) + "\n\n" + text
    return text, data



# ----------------------------------------------------------------------------- main
def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description="Run blasnet's benchmarks and print the table.")
    ap.add_argument("--quick", action="store_true",
                    help="fewer rounds; the large shape only at more than one thread (its "
                         "scaling measured in-process) and without the naive reference")
    ap.add_argument("--threads", default="1,2", help="comma-separated thread counts (1,2)")
    ap.add_argument("-k", dest="select", default=None, help="pytest -k selection of benchmarks")
    ap.add_argument("--no-memory", action="store_true", help="skip the tracemalloc pass")
    ap.add_argument("--no-profile", action="store_true",
                    help="skip the step profiles, large and small shapes (also skipped "
                         "with -k)")
    ap.add_argument("--results", default=str(RESULTS), help="directory for the JSON files")
    ap.add_argument("--report-only", action="store_true",
                    help="do not run anything; print the report from the saved JSON")
    args = ap.parse_args(argv)
    threads = tuple(int(t) for t in args.threads.split(","))
    result_dir = Path(args.results)
    result_dir.mkdir(parents=True, exist_ok=True)
    rc = 0
    t0 = time.perf_counter()
    if not args.report_only:
        print(f"blasnet bench{' (quick)' if args.quick else ''}: threads {threads}, "
              f"results in {result_dir}", flush=True)
        # The kernel every child runs: they inherit this environment (a pin included).
        blas = blas_kernel.facts(measure=True)
        print("\n".join(blas_kernel.header_lines(blas)), flush=True)
        loads = [os.getloadavg()[0]]
        for t in threads:
            rc |= run_pytest(t, args.quick, result_dir / f"threads{t}.json", args.select)
            loads.append(os.getloadavg()[0])
        (result_dir / "machine.json").write_text(json.dumps(dict(
            cpus=os.cpu_count(), load_1min=loads, quick=args.quick, threads=threads,
            blas=blas)))
        prof = result_dir / "profile.json"
        small = [(t, result_dir / f"profile_small{t}.json") for t in threads]
        if args.no_profile or args.select:
            prof.unlink(missing_ok=True)
            for _, path in small:
                path.unlink(missing_ok=True)
        else:
            rc |= run_profile(prof, max(threads), args.quick)
            for t, path in small:  # one process per thread count, as the benchmarks
                rc |= run_profile(path, t, args.quick, options=["--small"],
                                  label="small-shape profile")
        mem = result_dir / "memory.json"
        if args.no_memory:
            if mem.exists():
                mem.unlink()
        else:
            rc |= run_memory(mem)
    text, data = report(result_dir, threads)
    (result_dir / "summary.json").write_text(json.dumps(data, indent=1))
    print()
    print(text)
    if not args.report_only:
        print(f"\nbench finished in {time.perf_counter() - t0:.0f} s")
    return rc


if __name__ == "__main__":
    sys.exit(main())

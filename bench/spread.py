"""Run-to-run spread of the small training steps: the same step timed in fresh processes.

A small step's time can differ more from one process to the next (where its buffers land,
how the BLAS threads and the thread pool come up) than within one process, where the rest of
the bench times it. ``python bench/spread.py [--quick] [--runs N] [--threads 1 2]`` launches
RUNS fresh processes per thread count (``BLASNET_NUM_THREADS``), interleaved 1, 2, 1, 2, ...
so that a drift of the machine reaches both. Each process builds the cases of
``cases.SMALL_CASES`` one after the other, warms each up (``timing.warm_up``) and times its
full training step (``cases.step_fn``, the step of ``engine.fit``): the median over the
undisturbed steps (``timing.CpuProbe``) of STEPS steps or STEP_S seconds of them, whichever
is less, each step paired with its GEMM floor (the baseline measured in the same run). The
report gives, per case and thread count, the min / median / max of the per-process medians
and the spread (max - min) / median, against SPREAD_MAX, beside the spreads of the floor and
of step / floor. The JSON (every process's medians) goes to bench/results/spread.json;
``--report-only`` re-prints it.
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
# Run as a script, bench/ itself is sys.path[0]; the package is imported as "bench" instead.
sys.path[:] = [p for p in sys.path if Path(p or ".").resolve() != ROOT / "bench"]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from bench import cases  # noqa: E402

RESULTS = ROOT / "bench" / "results"
SPREAD_MAX = 0.15  # (max - min) / median of the per-process medians
# (processes per thread count, step/floor pairs per case at most, seconds of steps per case
# at most, pairs per case at least): full and quick.
SETTINGS = {False: (5, 200, 0.3, 10), True: (3, 50, 0.1, 5)}


# ----------------------------------------------------------------------------- child
def measure(block: str, shape: str, steps: int, seconds: float, min_steps: int) -> dict:
    """One case in this process: ``n`` alternating pairs of its training step and of its
    GEMM floor (the GEMMs of one forward + backward replayed on the block's own buffers,
    ``floors.replay_fn``), n = ``seconds`` / (time of the last warm-up step), between
    ``min_steps`` and ``steps``; the medians over the undisturbed pairs of the step, of the
    floor and of step / floor. The floor is the machine's own spread for the same GEMMs in
    the same process: a process that runs slow runs both slow, and the ratio cancels it."""
    from bench import floors, timing
    c = cases.build_case(block, shape)
    step = c["step"]
    floor = floors.replay_fn(c["fwd_bwd"])
    per_call = timing.warm_up(step)
    timing.warm_up(floor, floor.restore)  # back to back: restored first (floors.replay_fn)
    n = max(min_steps, min(steps, int(seconds / max(per_call, 1e-7))))
    t_step, t_floor, reasons = timing.paired_rounds(step, floor, n)
    m = timing.clean_median(t_step, reasons)
    return dict(block=block, shape=shape, median=m.value, kept=[m.kept, m.total],
                fallback=m.fallback, dropped=dict(m.why),
                floor=timing.clean_median(t_floor, reasons).value,
                ratio=timing.clean_median([a / b for a, b in zip(t_step, t_floor)],
                                          reasons).value)


def child(quick: bool, which) -> dict:
    """Every case of ``which`` in this process, at the thread count it was started with."""
    import kernels
    from bench import timing
    _, steps, seconds, min_steps = SETTINGS[quick]
    waited = timing.settle()
    rows = [measure(b, s, steps, seconds, min_steps) for b, s in which]
    return dict(threads=kernels.get_num_threads(), pid=os.getpid(), settle_s=waited, cases=rows)


# ----------------------------------------------------------------------------- parent
def run_child(threads: int, quick: bool, which, echo=print) -> dict:
    cmd = [sys.executable, str(Path(__file__).resolve()), "--child"] + ["--quick"] * quick
    for b, s in which:
        cmd += ["--case", f"{b}:{s}"]
    proc = cases.run_child(cmd, threads, quick, f"spread, threads={threads}", echo)
    if proc.returncode != 0:
        raise RuntimeError(f"spread: the child at {threads} threads failed (exit "
                           f"{proc.returncode}):\n{proc.stdout[-2000:]}{proc.stderr[-3000:]}")
    return json.loads(proc.stdout)


def run_all(runs: int, threads, quick: bool, which, echo=print) -> list:
    """``runs`` children per thread count, the thread counts interleaved; their results."""
    out = []
    for _ in range(runs):
        for t in threads:
            out.append(run_child(t, quick, which, echo))
    return out


def _stats(values) -> dict:
    """min / median / max of ``values`` and spread = (max - min) / median (None if median 0)."""
    mid = statistics.median(values)
    return dict(min=min(values), median=mid, max=max(values),
                spread=(max(values) - min(values)) / mid if mid > 0 else None)


def summarize(results: list) -> list:
    """Per case (in cases.CASES order) and thread count: the per-process medians of the step
    (seconds), their min / median / max, spread = (max - min) / median, whether any of them
    is a fallback median (too few undisturbed steps), and the same statistics (``floor``,
    ``ratio``: dicts with ``medians`` too) of the GEMM floor and of step / floor timed in the
    same pairs (None for results without them)."""
    groups: dict = {}
    for r in results:
        for c in r["cases"]:
            g = groups.setdefault((c["block"], c["shape"], r["threads"]), [])
            g.append(c)
    order = {c: i for i, c in enumerate(cases.CASES)}
    rows = []
    for (block, shape, thr), cs in sorted(groups.items(), key=lambda kv: (
            order.get(kv[0][:2], len(order)), kv[0][2])):
        meds = [c["median"] for c in cs]
        row = dict(block=block, shape=shape, threads=thr, medians=meds, **_stats(meds),
                   noisy=any(c["fallback"] for c in cs))
        for key in ("floor", "ratio"):
            vals = [c.get(key) for c in cs]
            row[key] = (None if None in vals else dict(medians=vals, **_stats(vals)))
        rows.append(row)
    return rows


def _pct(x) -> str:
    return "-" if x is None else f"{100 * x:.1f}%"


def format_report(rows: list, runs: int, quick: bool) -> str:
    _, steps, seconds, _ = SETTINGS[quick]
    lines = [f"RUN-TO-RUN SPREAD of the full training step (bench/spread.py"
             f"{' --quick' if quick else ''}): {runs} fresh processes\nper thread count, each "
             f"timing every small case once: the median over the undisturbed\nof up to {steps} "
             f"pairs (or {seconds:g} s) of a step and its GEMM floor, called alternately.\n"
             f"min / median / max = of the per-process step medians (ms); spread = (max - min) "
             f"/ median,\ntarget <= {100 * SPREAD_MAX:.0f}%. floor = the same spread of the "
             f"step's own GEMMs replayed (the baseline:\nwhat the machine spreads on that "
             f"work in the same processes); step/floor = the spread of\nthe per-process "
             f"ratio, which a whole process running slow cancels. Shapes as in BLOCKS\n"
             f"(bench/run.py)."]
    hdr = ["block", "shape", "thr", "min ms", "median ms", "max ms", "spread", "",
           "floor", "step/floor", "each process's median (ms), in run order"]
    body = []
    for r in rows:
        met = r["spread"] is not None and r["spread"] <= SPREAD_MAX
        floor, ratio = r.get("floor"), r.get("ratio")
        body.append([r["block"], r["shape"], r["threads"], f"{1e3 * r['min']:.3f}",
                     f"{1e3 * r['median']:.3f}", f"{1e3 * r['max']:.3f}",
                     _pct(r["spread"]) + ("*" if r["noisy"] and r["spread"] is not None
                                          else ""),
                     "met" if met else "MISSED",
                     _pct(floor and floor["spread"]), _pct(ratio and ratio["spread"]),
                     " ".join(f"{1e3 * m:.3f}" for m in r["medians"])])
    from bench.report import table  # the bench's one table layout
    lines.append(table(hdr, body, left=2))
    ok = sum(1 for r in rows if r["spread"] is not None and r["spread"] <= SPREAD_MAX)
    lines.append(f"{ok}/{len(rows)} within {100 * SPREAD_MAX:.0f}%.")
    paired = [r for r in rows if r.get("floor") and r["spread"] is not None
              and r["floor"]["spread"] is not None]
    if paired:
        within = sum(1 for r in paired if r["spread"] <= max(SPREAD_MAX, r["floor"]["spread"]))
        lines.append(f"{within}/{len(paired)} within {100 * SPREAD_MAX:.0f}% or within the "
                     f"spread of their own GEMM floor.")
    if any(r["noisy"] for r in rows):
        lines.append("* = some process had fewer than 3 undisturbed steps: its median is over "
                     "all of them.")
    return "\n".join(lines)


def parse_cases(items) -> list:
    """``--case BLOCK:SHAPE`` options as (block, shape) pairs from cases.CASES, or all of
    cases.SMALL_CASES; ValueError naming the bad item."""
    if not items:
        return list(cases.SMALL_CASES)
    out = []
    for item in items:
        block, _, shape = item.partition(":")
        if (block, shape) not in cases.CASES:
            raise ValueError(f"--case: expected BLOCK:SHAPE of a bench case, got {item!r}; "
                             f"cases: {', '.join(f'{b}:{s}' for b, s in cases.CASES)}")
        out.append((block, shape))
    return out


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true",
                    help=f"{SETTINGS[True][0]} processes per thread count, shorter timings")
    ap.add_argument("--runs", type=int, default=None,
                    help=f"processes per thread count (default {SETTINGS[False][0]}, quick "
                         f"{SETTINGS[True][0]})")
    ap.add_argument("--threads", type=int, nargs="+", default=[1, 2])
    ap.add_argument("--case", action="append", default=None, metavar="BLOCK:SHAPE",
                    help="only this case, repeatable (default: every case but the large shape)")
    ap.add_argument("--out", type=Path, default=RESULTS / "spread.json",
                    help="JSON of every process's medians and the summary")
    ap.add_argument("--report-only", action="store_true",
                    help="run nothing; print the report from --out")
    ap.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    try:
        which = parse_cases(args.case)
    except ValueError as e:
        ap.error(str(e))
    if args.runs is not None and args.runs < 1:
        ap.error(f"--runs: expected a positive integer, got {args.runs}")
    if args.child:
        cases.write_json(child(args.quick, which))
        return 0
    if args.report_only:
        data = json.loads(args.out.read_text())
        print(format_report(data["summary"], data["runs"], data["quick"]))
        return 0
    runs = args.runs or SETTINGS[args.quick][0]
    t0 = time.perf_counter()
    print(f"blasnet spread{' (quick)' if args.quick else ''}: {runs} processes x threads "
          f"{tuple(args.threads)}, {len(which)} cases each", flush=True)
    from kernels import blas_kernel
    blas = blas_kernel.facts(measure=False)  # the children inherit this environment
    print("\n".join(blas_kernel.header_lines(blas)), flush=True)
    results = run_all(runs, args.threads, args.quick, which,
                      echo=lambda s: print(s, flush=True))
    rows = summarize(results)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(dict(runs=runs, quick=args.quick, threads=args.threads,
                                        blas=blas, processes=results, summary=rows), indent=1))
    print()
    print(format_report(rows, runs, args.quick))
    print(f"\nspread finished in {time.perf_counter() - t0:.0f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())

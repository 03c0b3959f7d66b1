"""The running BLAS kernel against the one OpenBLAS picks by itself, at the bench's GEMM shapes.

``python -m bench.blas_kernels`` times sgemm here (with the environment as given, a pin
included) and in a child process with OPENBLAS_CORETYPE and OPENBLAS_L2_SIZE unset, in
alternating bursts (kernels.blas_kernel.compare), at this process's thread count
(BLASNET_NUM_THREADS), and prints median µs per call and GF/s for both, and each side's
fastest call (the one no other process slowed down on a shared machine). Without a pin both
sides run the same kernel (a check of the machine's noise).
"""
from __future__ import annotations

import argparse
import json
import statistics
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:  # run as a script: make the "bench" package importable
    sys.path.insert(0, str(ROOT))

import kernels  # noqa: E402
from kernels import blas_kernel  # noqa: E402

# (m, k, n): the seed shapes' first GEMMs (8 and 40 rows), a backward one, the large shape's.
SHAPES = ((8, 200, 800), (40, 512, 2048), (512, 40, 2048), (2048, 2048, 512))


def _shape(text: str) -> tuple:
    try:
        m, k, n = (int(v) for v in text.lower().split("x"))
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected MxKxN, got {text!r}") from None
    if min(m, k, n) < 1:
        raise argparse.ArgumentTypeError(f"expected positive sizes, got {text!r}")
    return m, k, n


def rows(run: dict) -> list:
    """One dict per shape: median µs and GF/s on each side, and native / here speed."""
    out = []
    for (m, k, n), got in run["times"].items():
        here, native = statistics.median(got["here"]), statistics.median(got["native"])
        flop = 2.0 * m * k * n
        out.append(dict(shape=[m, k, n], here_us=1e6 * here, native_us=1e6 * native,
                        here_gfs=flop / here / 1e9, native_gfs=flop / native / 1e9,
                        speedup=here / native, calls=[len(got["here"]), len(got["native"])],
                        here_best_us=1e6 * min(got["here"]),
                        native_best_us=1e6 * min(got["native"])))
    return out


def format_table(report, run, table) -> str:
    here = next((lib.architecture for lib in report.libraries if lib.owner == "scipy"), None)
    native = run["native_architecture"]
    what = "CPU time of the calling thread" if run.get("clock") == "thread" else "wall time"
    lines = [f"sgemm, {run['threads']} thread(s), {what}, median per call over alternating "
             f"bursts; "
             f"here = {here} ({', '.join(f'{k}={v}' for k, v in report.env.items()) or 'no pin'}"
             f"), native = {native} (OPENBLAS_CORETYPE, OPENBLAS_L2_SIZE unset)",
             f"{'m x k x n':<18} {'here µs':>10} {'native µs':>10} {'here GF/s':>10} "
             f"{'native GF/s':>12} {'time here/native':>17} {'best µs here':>13} "
             f"{'native':>8}"]
    for r in table:
        lines.append(f"{'x'.join(map(str, r['shape'])):<18} {r['here_us']:>10,.0f} "
                     f"{r['native_us']:>10,.0f} {r['here_gfs']:>10.0f} {r['native_gfs']:>12.0f} "
                     f"{r['speedup']:>17.2f} {r['here_best_us']:>13,.0f} "
                     f"{r['native_best_us']:>8,.0f}")
    return "\n".join(lines)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("shapes", nargs="*", type=_shape, default=list(SHAPES), metavar="MxKxN")
    ap.add_argument("--rounds", type=int, default=7, help="alternating bursts per shape")
    ap.add_argument("--budget", type=float, default=0.3, help="seconds per burst")
    ap.add_argument("--cpu-time", action="store_true",
                    help="time each call by this thread's CPU time (needs BLASNET_NUM_THREADS=1): "
                         "on a busy machine the time other processes held the core is left out")
    ap.add_argument("--out", type=Path, default=None, help="write the table as JSON here")
    args = ap.parse_args(argv)
    report = blas_kernel.current()
    clock = "thread" if args.cpu_time else "wall"
    if args.cpu_time and kernels.get_num_threads() != 1:
        ap.error(f"--cpu-time: needs BLASNET_NUM_THREADS=1, got {kernels.get_num_threads()} "
                 f"threads")
    run = blas_kernel.compare(args.shapes, args.rounds, args.budget, clock=clock)
    run["clock"] = clock
    table = rows(run)
    print(format_table(report, run, table))
    if args.out:
        args.out.write_text(json.dumps(dict(report=report.to_dict(), threads=run["threads"],
                                            clock=clock,
                                            native_architecture=run["native_architecture"],
                                            rows=table), indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())

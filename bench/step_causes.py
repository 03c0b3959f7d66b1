"""Why a small step's optimizer update is slower inside the step than alone: the update timed
after the step's own GEMMs (replayed through kernels.instrument.replay, with the one-thread
rule off) at 1 and at 2 OpenBLAS threads.

For one case (default FFN-gelu at seed000) it times, interleaved, medians of wall and calling-
thread CPU time, µs:

- ``opt after floor @N``: ``AdamW.step(zero_grad=True)`` right after the case's GEMMs replayed
  on N OpenBLAS threads (N = 1, 2), and after the 2-thread replay plus a 5 ms sleep (OpenBLAS's
  workers then sleep: their spin is not what is measured);
- ``fresh after floor @2``: the same update on arrays of the same size that no GEMM touched;
- ``write <state> after floor @N``: one in-place multiply by 1 over the parameters, the
  gradients, or the first moments (touched only by the update): which arrays got slow;
- ``opt alone``: the update right after itself;
- ``pool dispatches per step`` (kernels.parallel hand-offs in one step).

A 2-thread GEMM leaves its operands in the other core's cache (the gradients it wrote, the
weights it read); the update then pays to pull or invalidate those lines. See
docs/performance.md, "Small steps at 2 threads: the cache lines the GEMMs leave on the other
core". ``python -m bench.step_causes [--block B] [--shape S] [--reps N]``; run it with
``BLASNET_NUM_THREADS=2`` on the native BLAS kernel.
"""
from __future__ import annotations

import argparse
import importlib
import statistics
import time

import numpy as np
from threadpoolctl import ThreadpoolController

from kernels import optim as kopt
from kernels.instrument import replay
from kernels import parallel as kpar
from kernels import threads as kthreads

from bench import cases

kgemm = importlib.import_module("kernels.gemm")  # the module (kernels.gemm is also a function)


def measure(block: str = "FFN-gelu", shape: str = "seed000", reps: int = 150) -> dict:
    """{label: (median wall µs, median thread-CPU µs)} and the pool dispatches per step."""
    case = cases.build_case(block, shape)
    step, opt, module = case["step"], case["opt"], case["module"]
    for _ in range(100):
        step()
    # The block's GEMM calls replayed as they are, not at floors' fastest thread rule: the
    # point is the thread count they ran on, set below with the rule off.
    floor = replay(case["fwd_bwd"], "gemm")
    threads = kthreads.get_num_threads()
    blas = ThreadpoolController()  # set OpenBLAS's threads alone, the pool's stay
    update = lambda: opt.step(zero_grad=True)  # noqa: E731  (the call fit makes)

    n = sum(p.size for p in module.parameters())
    rng = np.random.default_rng(0)
    fresh_arrays = [rng.standard_normal(n).astype(np.float32) for _ in range(4)]
    np.abs(fresh_arrays[3], out=fresh_arrays[3])
    fresh_item = [(tuple(fresh_arrays), kopt.adamw_consts(np.float32, 10, cases.LR))]
    one = np.float32(1)

    def rewrite(arrays):
        def run():
            for a in arrays:
                np.multiply(a, one, out=a)
        return run

    params = [p.data for p in module.parameters()]
    grads = [p.grad for p in module.parameters()]
    moments = [st["exp_avg"] for st in opt.state if "exp_avg" in st]
    tests = [("opt", update, (1, 2)),
             ("opt, 5 ms sleep", update, (2,)),
             ("fresh", lambda: kopt.adamw_update_many_unchecked(fresh_item, True), (2,)),
             ("write params", rewrite(params), (1, 2)),
             ("write grads", rewrite(grads), (1, 2)),
             ("write exp_avg", rewrite(moments), (1, 2))]
    clock, cpu = time.perf_counter, time.thread_time
    out: dict = {}

    def timed(label, fn):
        t0, c0 = clock(), cpu()
        fn()
        c1, t1 = cpu(), clock()
        w, c = out.setdefault(label, ([], []))
        w.append(t1 - t0)
        c.append(c1 - c0)

    rule, kgemm.ONE_THREAD_DIM = kgemm.ONE_THREAD_DIM, 0  # "@2" must mean two threads
    try:
        for _ in range(reps):
            for name, fn, counts in tests:
                for k in counts:
                    blas.limit(limits=k, user_api="blas")  # OpenBLAS only
                    floor()
                    if "sleep" in name:
                        time.sleep(0.005)
                    timed(f"{name} after floor @{k}", fn)
            update()
            timed("opt alone", update)
    finally:
        kgemm.ONE_THREAD_DIM = rule
        kthreads.set_num_threads(threads)
    result = {k: (1e6 * statistics.median(w), 1e6 * statistics.median(c))
              for k, (w, c) in out.items()}

    before = kpar.handoffs()
    for _ in range(10):
        step()
    return dict(times=result, dispatches=(kpar.handoffs() - before) / 10, params=n)


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--block", default="FFN-gelu")
    ap.add_argument("--shape", default="seed000")
    ap.add_argument("--reps", type=int, default=150)
    a = ap.parse_args(argv)
    r = measure(a.block, a.shape, a.reps)
    print(f"{a.block} {a.shape}: {r['params']:,} parameters, "
          f"{r['dispatches']:g} pool dispatches per step")
    print(f"{'what':34s} {'wall us':>9s} {'cpu us':>9s}")
    for k, (w, c) in sorted(r["times"].items()):
        print(f"{k:34s} {w:9.1f} {c:9.1f}")


if __name__ == "__main__":
    main()

"""Data parallel over MPI on this machine (loopback): what a collective costs, and whether two
ranks of one thread train the large FFN as fast as one process of two threads.

1. Allreduce (in place, float32 sum) on 2 ranks, 1 KiB to 64 MiB: median time per size, and
   the latency alpha and bandwidth beta of t = alpha + bytes / beta, fitted by least squares
   on relative errors (so the small sizes set alpha and the large ones beta).
2. The large FFN step (2048 x 512 x 2048, GELU, float32, MSE, AdamW) on one global batch of
   2048 rows: one process with 2 BLAS threads against 2 ranks with 1 thread and 1024 rows
   each (plain data parallel, and ZeRO-1), with the ratio of throughputs and the fraction of
   a step spent in communication (the gradient reduction, and for ZeRO-1 the parameter
   gather, including the wait for the other rank).
3. Overlap probe: a non-blocking Iallreduce of the gradient vector started before a
   backward-sized GEMM and waited for after it, against the two one after the other; it
   tells whether MPI moves the data while the rank computes.
4. The scaling model (docs/distributed.md): projected efficiency on K = 2, 8, 64 machines on
   a 25 Gb/s network for the large FFN and a 12-block stack, plain and ZeRO-1.
5. The recipe GPT (GPTConfig's sizes: 4 layers, d_model 128, 4 heads, d_ff 512, 64-character
   windows, batches of 32; a 65-character vocabulary, nanoGPT's Shakespeare) trained by
   ``fit`` in float32 with AdamW: characters/s of 2 ranks x 1 thread against 1 process x 2
   threads on the same global batches, the ratio, and the scaling model on 8-64 machines.
6. Gradient buckets (``--only buckets``): fit's seconds per step on 2 ranks x 1 thread for
   the recipe GPT and a tabular MLP, the gradients reduced once after the backward ("off"),
   in buckets launched during it with MPI_Test calls between layers ("on"), and without
   those calls ("no test"); alternated over rounds in one job, medians, ratios to "off".

``python bench/distributed.py [--quick] [--only gpt|buckets] [--out PATH]`` prints tables, writes
JSON (default bench/results/distributed.json). It launches its own workers (``mpiexec -n 2``); it needs the
optional extra ``mpi``. Numbers are only meaningful on an otherwise idle machine.
"""
from __future__ import annotations

import argparse
import json
import math
import os
import shutil
import statistics
import subprocess
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
if ROOT not in sys.path:
    sys.path.insert(0, ROOT)

from bench.stopwatch import sample  # noqa: E402

SIZES = [1 << k for k in range(10, 27, 2)]  # bytes: 1 KiB, 4 KiB, ... 64 MiB
BLOCK, SHAPE = "FFN-gelu", "large"
NET_BYTES_PER_S = 25e9 / 8      # a 25 Gb/s network
NET_LATENCY_S = 20e-6           # assumed per message on that network (TCP-class)
MACHINES = (2, 8, 64)
STACK = 12
# The recipe GPT: GPTConfig's defaults with nanoGPT's Shakespeare vocabulary (65 characters).
GPT = dict(vocab=65, seq_len=64, n_layer=4, n_head=4, d_model=128, d_ff=512, batch=32)
GPT_MACHINES = (8, 16, 32, 64)
# Part 6: a tabular MLP (sizes, global batch) and the bucket settings compared ("on": the default).
MLP_CASE = dict(sizes=[256, 1024, 1024, 1024, 10], batch=512)
BUCKET_MODES = {"off": (0, True), "on": (1 << 19, True), "no test": (1 << 19, False)}


# ----------------------------------------------------------------------------- workers
def _case(rows):
    """The large FFN case of make bench, with ``rows`` rows of its input."""
    from bench import cases
    c = cases.build_case(BLOCK, SHAPE)
    return c["module"], c["x"][:rows], c["target"][:rows], c["loss"], c["opt"]


def _median_step(step, steps, warm=3):
    times = sample(step, steps, warm)
    return statistics.median(times), min(times)


def worker_single(args) -> dict:
    """One process (its BLAS threads from BLASNET_NUM_THREADS), the whole global batch."""
    import kernels
    from bench import cases
    model, x, target, loss, opt = _case(2048)
    med, best = _median_step(cases.step_fn(model, x, target, loss, opt), args.steps)
    return {"threads": kernels.get_num_threads(), "rows": 2048, "median_s": med, "min_s": best}


def worker_mpi(args) -> dict:
    import numpy as np

    from engine import distributed as D
    MPI = D.mpi()
    comm = MPI.COMM_WORLD
    rank, k = comm.Get_rank(), comm.Get_size()
    out = {"ranks": k}

    # 1. Allreduce against message size.
    rows = []
    for nbytes in SIZES:
        buf = np.ones(nbytes // 4, np.float32)
        reps = max(3, min(200, int(2e7 // nbytes))) if not args.quick else 3
        times = []
        for _ in range(reps + 1):
            comm.Barrier()
            t = time.perf_counter()
            comm.Allreduce(MPI.IN_PLACE, buf)
            times.append(time.perf_counter() - t)
        times = times[1:]  # the first call of a size sets up buffers
        rows.append({"bytes": nbytes, "median_s": statistics.median(times), "min_s": min(times)})
    out["allreduce"] = rows

    # 2. The large FFN step, each rank on its share of the global batch.
    for mode in ("plain", "zero1"):
        model, x, target, loss, opt = _case(2048)
        zero = mode == "zero1"
        if zero:
            opt = D.ShardedAdamW(model.parameters(), comm, lr=opt.param_groups[0]["lr"])
        dp = D.DataParallel(model, opt, comm)
        lo, hi = dp.share(0, 2048)
        xb, tb = x[lo:hi], target[lo:hi]
        comm_s = [0.0]

        def step():
            loss.forward(model.forward(xb), tb)
            model.backward(loss.backward())
            t0 = time.perf_counter()
            dp.reduce_gradients()
            t1 = time.perf_counter()
            if zero:  # the update of this rank's slice is compute; the gather is not
                opt.update_shard()
                t2 = time.perf_counter()
                opt.gather_parameters()
                comm_s[0] += (t1 - t0) + (time.perf_counter() - t2)
            else:
                opt.step()
                comm_s[0] += t1 - t0
            model.zero_grad()

        comm.Barrier()
        _median_step(step, 3)  # warm-up (its communication time is discarded)
        comm_s[0] = 0.0
        comm.Barrier()
        med, best = _median_step(step, args.steps, warm=0)
        out[mode] = {"rows_per_rank": hi - lo, "median_s": med, "min_s": best,
                     "comm_s": comm_s[0] / args.steps,
                     "optimizer_state_bytes": (opt.state_nbytes() if zero else
                                               2 * model.flat_params().nbytes)}

    # 3. Overlap probe: Iallreduce + a GEMM, against GEMM then Allreduce.
    from kernels import ops
    g = model.flat_grads()
    a = np.ones((1024, 2048), np.float32)
    b = np.ones((2048, 512), np.float32)
    c = np.empty((1024, 512), np.float32)

    def gemm():
        ops.gemm(c, a, b, False, False, 1.0, 0.0)

    def seq():
        gemm()
        comm.Allreduce(MPI.IN_PLACE, g)

    def ovl():
        req = comm.Iallreduce(MPI.IN_PLACE, g)
        gemm()
        req.Wait()

    res = {}
    for name, fn in (("gemm", gemm), ("sequential", seq), ("overlapped", ovl)):
        comm.Barrier()
        res[name] = _median_step(fn, 5 if args.quick else 15)[0]
    out["overlap"] = res
    return out if rank == 0 else None


def _gpt_fit(steps, comm=None):
    """``(run, model, opt)``: ``run(n)`` fits the recipe GPT (float32, AdamW) on the first
    ``n`` of ``steps`` global batches of random characters."""
    import numpy as np

    from engine import AdamW, CrossEntropyLoss, fit
    from engine.models.gpt import GPT as Model
    g = GPT
    model = Model(g["vocab"], g["seq_len"], g["n_layer"], g["n_head"], g["d_model"],
                  d_ff=g["d_ff"], dtype=np.float32, rng=0)
    opt, loss = AdamW(model.parameters(), lr=1e-3), CrossEntropyLoss()
    ids = np.random.default_rng(0).integers(0, g["vocab"], (steps * g["batch"], g["seq_len"] + 1))
    X, Y = np.ascontiguousarray(ids[:, :-1]), np.ascontiguousarray(ids[:, 1:])  # (N, T) each

    def run(n):
        fit(model, loss, opt, X[:n], Y[:n], epochs=1, batch_size=g["batch"], progress=False,
            comm=comm)
    return run, model, opt


def _mlp_fit(steps, comm=None):
    """``run(n)`` fits the tabular MLP (float32, AdamW, cross-entropy) on ``n`` rows."""
    import numpy as np

    from engine import MLP, AdamW, CrossEntropyLoss, fit
    sizes, batch = MLP_CASE["sizes"], MLP_CASE["batch"]
    model = MLP(sizes, rng=0)
    opt, loss = AdamW(model.parameters(), lr=1e-3), CrossEntropyLoss()
    rng = np.random.default_rng(0)
    X = rng.standard_normal((steps * batch, sizes[0])).astype(np.float32)
    y = rng.integers(0, sizes[-1], steps * batch)

    def run(n):
        fit(model, loss, opt, X[:n], y[:n], epochs=1, batch_size=batch, progress=False, comm=comm)
    return run, model, opt


def worker_gpt(args, comm=None) -> dict:
    """Characters/s of ``fit`` on the recipe GPT over ``args.steps`` global batches (after a
    2-step warm-up fit), on one process or the ranks of ``comm``; on one process also the
    AdamW step alone (the scaling model's optimizer time)."""
    import kernels
    run, model, opt = _gpt_fit(args.steps, comm)
    batch, n = GPT["batch"], args.steps * GPT["batch"]
    run(2 * batch)  # warm-up: first calls, buffers, the ranks' thread setting
    if comm is not None:
        comm.Barrier()
    t = time.perf_counter()
    run(n)
    dt = time.perf_counter() - t
    out = {"threads": kernels.get_num_threads(), "ranks": 1 if comm is None else comm.Get_size(),
           "steps": args.steps, "step_s": dt / args.steps, "chars_per_s": n * GPT["seq_len"] / dt,
           "param_bytes": model.flat_params().nbytes, "params": model.num_parameters()}
    if comm is None:
        out["optimizer_s"] = _median_step(opt.step, 10)[0]
    return out if comm is None or comm.Get_rank() == 0 else None


def worker_buckets(args, comm) -> dict:
    """Part 6: per model, seconds per step of ``fit`` in each of ``BUCKET_MODES``, the modes
    alternated (order reversed every round) over rounds; per mode the median and the runs."""
    from engine import distributed as D
    out, rounds = {}, 3 if args.quick else 7
    for name, build, steps in (("gpt", _gpt_fit, args.steps), ("tabular", _mlp_fit, args.steps)):
        run, model, _ = build(steps, comm)
        n = steps * (GPT["batch"] if name == "gpt" else MLP_CASE["batch"])
        run(n // steps * 2)  # warm-up
        times = {m: [] for m in BUCKET_MODES}
        for r in range(rounds):
            for m in (list(BUCKET_MODES) if r % 2 == 0 else list(BUCKET_MODES)[::-1]):
                elements, poll = BUCKET_MODES[m]
                D.set_gradient_buckets(elements, poll=poll)
                comm.Barrier()
                t = time.perf_counter()
                run(n)
                times[m].append((time.perf_counter() - t) / steps)
        D.set_gradient_buckets()  # the default again
        out[name] = {"params": model.num_parameters(), "steps": steps,
                     "median_s": {m: statistics.median(v) for m, v in times.items()},
                     "runs_s": times}
    return out if comm.Get_rank() == 0 else None


# ----------------------------------------------------------------------------- the model
def fit_alpha_beta(rows) -> tuple:
    """``(alpha seconds, beta bytes/s)`` of t = alpha + n / beta, least squares on t's
    relative error (each row weighted by 1/t)."""
    import numpy as np
    n = np.array([r["bytes"] for r in rows], float)
    t = np.array([r["median_s"] for r in rows], float)
    a = np.stack([1.0 / t, n / t], axis=1)  # (alpha, 1/beta) . (1/t, n/t) = 1
    (alpha, inv_beta), *_ = np.linalg.lstsq(a, np.ones_like(t), rcond=None)
    return float(alpha), float(1.0 / inv_beta) if inv_beta > 0 else math.inf


def ring_allreduce_s(nbytes, k, alpha=NET_LATENCY_S, beta=NET_BYTES_PER_S) -> float:
    """Ring allreduce (= reduce-scatter + allgather): 2 (K-1) messages of n/K bytes each."""
    return 2 * (k - 1) * alpha + 2 * (k - 1) / k * nbytes / beta


def project(label, c, o, n, machines=MACHINES) -> list:
    """One model's rows of the scaling model: compute ``c`` and optimizer ``o`` seconds per
    step on one machine, ``n`` gradient bytes. Weak scaling (every machine keeps its rows):
    E(K) = T(1) / T(K) with T(K) = compute + optimizer(K) + allreduce(K), no overlap; ZeRO-1
    moves the same bytes (reduce-scatter + allgather) and runs 1/K of the optimizer. Strong
    scaling (one global batch, compute / K, optimistically linear): E(K) = T(1) / (K T(K))."""
    out = []
    for k in machines:
        comm = ring_allreduce_s(n, k)
        row = {"model": label, "K": k, "allreduce_s": comm}
        for mode, opt in (("plain", o), ("zero1", o / k)):
            row[f"weak_{mode}"] = (c + o) / (c + opt + comm)
            row[f"strong_{mode}"] = (c + o) / (k * (c / k + opt + comm))
        out.append(row)
    return out


def projections(compute_s, optimizer_s, param_bytes) -> list:
    """The large FFN (every machine keeps the large shape's 2048 rows) and a 12-block stack
    (everything 12x: the ratios do not change, only the latency term's weight does)."""
    return (project("large FFN", compute_s, optimizer_s, param_bytes) +
            project(f"{STACK}-block stack", compute_s * STACK, optimizer_s * STACK,
                    param_bytes * STACK))


# ----------------------------------------------------------------------------- driver
def _run(cmd, env_threads, quick):
    env = dict(os.environ, BLASNET_NUM_THREADS=str(env_threads), PYTHONPATH=ROOT)
    if quick:
        env["BLASNET_BENCH_QUICK"] = "1"
    proc = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=900)
    if proc.returncode != 0:
        raise SystemExit(f"{' '.join(cmd)} failed ({proc.returncode}):\n{proc.stderr[-4000:]}")
    return json.loads(proc.stdout.strip().splitlines()[-1])


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--quick", action="store_true", help="fewer repetitions")
    ap.add_argument("--only", choices=("gpt", "buckets"),
                    help="only the recipe GPT's case, or only the gradient buckets' (part 6)")
    ap.add_argument("--out", default=os.path.join(HERE, "results", "distributed.json"))
    ap.add_argument("--worker", choices=("single", "mpi", "gpt-single", "gpt-mpi", "buckets"),
                    help=argparse.SUPPRESS)
    ap.add_argument("--steps", type=int, default=None, help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    args.steps = args.steps or (5 if args.quick else 20)
    if args.worker:
        res = _worker(args)
        if res is not None:
            print(json.dumps(res), flush=True)
        return 0

    try:
        import mpi4py  # noqa: F401
    except ImportError:
        print("bench/distributed.py: skipped, the optional extra 'mpi' is not installed "
              "(pip install 'blasnet[mpi]')")
        return 0
    mpiexec = shutil.which("mpiexec", path=os.path.dirname(sys.executable)) or "mpiexec"
    me = [sys.executable, os.path.abspath(__file__)] + (["--quick"] if args.quick else [])
    res = {"date": time.strftime("%Y-%m-%d %H:%M"), "quick": args.quick}
    if args.only == "buckets":
        res["buckets"] = _run([mpiexec, "-n", "2"] + me + ["--steps", str(args.steps), "--worker",
                                                         "buckets"], 1, args.quick)
        print(report_buckets(res["buckets"]))
        return _write(res, args.out)
    if args.only is None:
        res.update(_ffn_cases(me + ["--steps", str(args.steps)], mpiexec, args.quick))
    # the GPT's steps are shorter: more of them (3x)
    res["gpt"] = _gpt_case(me + ["--steps", str(3 * args.steps)], mpiexec, args.quick)
    print(report(res))
    return _write(res, args.out)


def _write(res, out) -> int:
    os.makedirs(os.path.dirname(os.path.abspath(out)), exist_ok=True)
    with open(out, "w") as f:
        json.dump(res, f, indent=1)
        f.write("\n")
    print(f"wrote {out}")
    return 0


def _worker(args):
    if args.worker == "single":
        return worker_single(args)
    if args.worker == "mpi":
        return worker_mpi(args)
    if args.worker == "gpt-single":
        return worker_gpt(args)
    from engine import distributed as D
    if args.worker == "buckets":
        return worker_buckets(args, D.mpi().COMM_WORLD)
    return worker_gpt(args, D.mpi().COMM_WORLD)


def _ffn_cases(me, mpiexec, quick) -> dict:
    """Parts 1-4: the Allreduce sizes, the large FFN step, the overlap probe, the model."""
    single = [_run(me + ["--worker", "single"], 2, quick)]
    mp = _run([mpiexec, "-n", "2"] + me + ["--worker", "mpi"], 1, quick)
    single.append(_run(me + ["--worker", "single"], 2, quick))
    one = min(single, key=lambda r: r["median_s"])

    alpha, beta = fit_alpha_beta(mp["allreduce"])
    from bench import cases
    model = cases.build_module(BLOCK, cases.SHAPES[SHAPE])
    param_bytes = model.flat_params().nbytes
    res = {"allreduce": mp["allreduce"], "alpha_s": alpha, "beta_bytes_per_s": beta,
           "one_process": one, "one_process_runs": single, "plain": mp["plain"],
           "zero1": mp["zero1"], "overlap": mp["overlap"], "param_bytes": param_bytes}
    for mode in ("plain", "zero1"):
        r = mp[mode]
        r["throughput_ratio"] = one["median_s"] / r["median_s"]
        r["comm_fraction"] = r["comm_s"] / r["median_s"]
    # The model's inputs: compute = 2-thread forward+backward at 2048 rows (the one-process
    # step minus its optimizer), optimizer = AdamW over the parameters (both measured here).
    opt_s = _optimizer_seconds()
    res["projection_inputs"] = {"compute_s": one["median_s"] - opt_s, "optimizer_s": opt_s,
                                "net_bytes_per_s": NET_BYTES_PER_S, "net_latency_s": NET_LATENCY_S}
    res["projections"] = projections(one["median_s"] - opt_s, opt_s, param_bytes)
    return res


def _gpt_case(me, mpiexec, quick) -> dict:
    """Part 5: the recipe GPT, 1 process x 2 threads (before and after the ranks: the faster
    run counts) against 2 ranks x 1 thread; the scaling model from the one-process step."""
    single = [_run(me + ["--worker", "gpt-single"], 2, quick)]
    mp = _run([mpiexec, "-n", "2"] + me + ["--worker", "gpt-mpi"], 1, quick)
    single.append(_run(me + ["--worker", "gpt-single"], 2, quick))
    one = max(single, key=lambda r: r["chars_per_s"])
    o = one["optimizer_s"]
    return {"config": GPT, "one_process": one, "one_process_runs": single, "two_ranks": mp,
            "ratio": mp["chars_per_s"] / one["chars_per_s"],
            "projections": project("recipe GPT", one["step_s"] - o, o, one["param_bytes"],
                                   GPT_MACHINES)}


def _optimizer_seconds() -> float:
    """Median time of AdamW.step over the large FFN's parameters, in this process."""
    from bench import cases
    model = cases.build_module(BLOCK, cases.SHAPES[SHAPE])
    opt = cases.make_optimizer(model)
    return _median_step(opt.step, 10)[0]


def _size(n) -> str:
    return f"{n >> 20} MiB" if n >= 1 << 20 else f"{n >> 10} KiB"


def report(res) -> str:
    """The tables of a run (the FFN parts when measured, then the GPT)."""
    lines = report_ffn(res) if "allreduce" in res else []
    g = res["gpt"]
    one, two, c = g["one_process"], g["two_ranks"], g["config"]
    lines += ["" if lines else None,
              f"RECIPE GPT ({c['n_layer']} layers, d_model {c['d_model']}, {c['n_head']} heads, "
              f"vocab {c['vocab']}, {one['params']:,} parameters; float32, AdamW, fit), global "
              f"batch {c['batch']} x {c['seq_len']} characters",
              f"  1 process x {one['threads']} threads  {one['chars_per_s']:10,.0f} chars/s  "
              f"({one['step_s'] * 1e3:.1f} ms a step, AdamW {one['optimizer_s'] * 1e3:.2f} ms)",
              f"  {two['ranks']} ranks x {two['threads']} thread    {two['chars_per_s']:10,.0f} "
              f"chars/s  ratio {g['ratio']:.2f}",
              f"  scaling model ({_size(one['param_bytes'])} of gradients; strong scaling "
              f"needs K <= {c['batch']} windows):",
              f"  {'K':>5} {'allreduce':>10} {'weak plain':>10} {'weak ZeRO':>9} "
              f"{'strong plain':>12} {'strong ZeRO':>11}"]
    for r in g["projections"]:
        strong = (f"{r['strong_plain']:12.3f} {r['strong_zero1']:11.3f}" if r["K"] <= c["batch"]
                  else f"{'-':>12} {'-':>11}")
        lines.append(f"  {r['K']:5d} {r['allreduce_s'] * 1e3:7.2f} ms {r['weak_plain']:10.3f} "
                     f"{r['weak_zero1']:9.3f} {strong}")
    return "\n".join(line for line in lines if line is not None)


def report_buckets(b) -> str:
    """Part 6's table: seconds per step and the ratio to "off" per model and mode."""
    lines = [f"GRADIENT BUCKETS (2 ranks x 1 thread, fit, float32; buckets of "
             f"{BUCKET_MODES['on'][0]:,} elements; medians of alternated runs)",
             f"  {'model':8} {'params':>10} " + " ".join(f"{m:>16}" for m in BUCKET_MODES)]
    for name, r in b.items():
        off = r["median_s"]["off"]
        cells = [f"{t * 1e3:7.1f} ms {off / t:5.3f}" for t in r["median_s"].values()]
        lines.append(f"  {name:8} {r['params']:10,} " + " ".join(f"{c:>16}" for c in cells))
    lines.append("  (each cell: seconds per step, and the speed relative to off)")
    return "\n".join(lines)


def report_ffn(res) -> list:
    lines = ["ALLREDUCE on 2 ranks (loopback, float32 sum, in place)",
             f"  {'size':>8}  {'median':>10}  {'min':>10}  {'GB/s (median)':>13}"]
    for r in res["allreduce"]:
        lines.append(f"  {_size(r['bytes']):>8}  {r['median_s'] * 1e6:8.1f} us  "
                     f"{r['min_s'] * 1e6:8.1f} us  {r['bytes'] / r['median_s'] / 1e9:13.2f}")
    lines.append(f"  fit t = alpha + n / beta: alpha = {res['alpha_s'] * 1e6:.1f} us, "
                 f"beta = {res['beta_bytes_per_s'] / 1e9:.2f} GB/s")
    one = res["one_process"]
    lines += ["", f"LARGE FFN STEP ({BLOCK}, 2048 x 512 x 2048, float32, AdamW), global batch 2048",
              f"  {'':28} {'median':>9} {'samples/s':>10} {'ratio':>6} {'comm':>6}",
              f"  {'1 process x %d threads' % one['threads']:28} {one['median_s'] * 1e3:7.1f} ms "
              f"{2048 / one['median_s']:10,.0f} {1.0:6.2f} {'':>6}"]
    for mode, label in (("plain", "2 ranks x 1 thread"), ("zero1", "2 ranks x 1 thread, ZeRO-1")):
        r = res[mode]
        lines.append(f"  {label:28} {r['median_s'] * 1e3:7.1f} ms {2048 / r['median_s']:10,.0f} "
                     f"{r['throughput_ratio']:6.2f} {r['comm_fraction'] * 100:5.1f}%")
    lines.append("  (ratio: throughput against one process, target >= 0.9; comm: share of the "
                 "step in the gradient reduction and the ZeRO-1 parameter gather)")
    o = res["overlap"]
    lines += ["", "OVERLAP PROBE (gradient Iallreduce during a 1024x2048x512 GEMM)",
              f"  GEMM {o['gemm'] * 1e3:.2f} ms, GEMM then Allreduce {o['sequential'] * 1e3:.2f} ms,"
              f" Iallreduce + GEMM + Wait {o['overlapped'] * 1e3:.2f} ms"]
    p = res["projection_inputs"]
    lines += ["", f"SCALING MODEL, 25 Gb/s, {p['net_latency_s'] * 1e6:.0f} us per message, ring "
                  f"allreduce; compute {p['compute_s'] * 1e3:.1f} ms + AdamW "
                  f"{p['optimizer_s'] * 1e3:.1f} ms per machine per step",
              f"  {'model':18} {'K':>3} {'allreduce':>10} {'weak plain':>10} {'weak ZeRO':>9} "
              f"{'strong plain':>12} {'strong ZeRO':>11}"]
    for r in res["projections"]:
        lines.append(f"  {r['model']:18} {r['K']:3d} {r['allreduce_s'] * 1e3:7.2f} ms "
                     f"{r['weak_plain']:10.3f} {r['weak_zero1']:9.3f} {r['strong_plain']:12.3f} "
                     f"{r['strong_zero1']:11.3f}")
    return lines


if __name__ == "__main__":
    sys.exit(main())

"""Nanoseconds per element of the elementwise kernels, called through ``kernels.ops`` on
fixed-size float32 inputs, at the thread count of ``BLASNET_NUM_THREADS``.

Each case is one ``kernels.ops`` call (or the engine's ``clip_grad_norm``) on arrays built
once; the time is the median over many calls (warm caches), divided by the elements the call
reads per row x rows (``elements``). ``python -m bench.kernel_costs [--json PATH]``; the
figures of the NumPy chains these kernels replaced were measured with it and are kept in
``bench/baselines.py`` (and docs/performance.md, "Compiled kernels").
"""
from __future__ import annotations

import argparse
import json
import statistics
import sys
import time

import numpy as np

import kernels
from bench.arrays import layernorm_buffers, rand
from kernels import ops

F32 = np.float32
ADAMW_N = 321_000   # parameters: the small-model AdamW figure of the performance notes
ROWS, COLS = 1024, 512  # activations: make run's d_ff (row-wise kernels at 2048 x 512)




def _adamw(n):
    from kernels.optim import adamw_consts
    rng = np.random.default_rng(0)
    p, g = rand(rng, n, 0.02), rand(rng, n, 1e-3)
    m, v = np.zeros(n, F32), np.zeros(n, F32)
    items = [((p, g, m, v), adamw_consts(p.dtype, 10, 1e-4, 0.9, 0.999, 1e-8, 1e-2))]
    return (lambda: ops.adamw(items, False)), n


def _sgd(n):
    rng = np.random.default_rng(0)
    p, g, b = rand(rng, n, 0.02), rand(rng, n, 1e-3), np.zeros(n, F32)
    return (lambda: ops.sgd(p, g, b, 1e-4, 0.9, 1e-4, 0.0, True, False, False)), n


def _clip(n):
    from engine.nn.layers import Linear
    from engine.optim import clip_grad_norm
    d = int(n ** 0.5)
    lin = Linear(d, n // d, dtype=F32)
    rng = np.random.default_rng(0)
    for p in lin.parameters():
        p.grad[...] = rand(rng, p.shape, 1e-3)
    params = list(lin.parameters())
    return (lambda: clip_grad_norm(params, 1e9)), sum(p.size for p in params)


def _layernorm(direction, n=2048, d=COLS):
    b = layernorm_buffers(n, d)
    ops.layernorm_forward(b.out, b.mean, b.rstd, b.x, b.gamma, b.beta, 1e-5)
    if direction == "fwd":
        return (lambda: ops.layernorm_forward(b.out, b.mean, b.rstd, b.x, b.gamma, b.beta,
                                              1e-5)), n * d
    return (lambda: ops.layernorm_backward(b.dx, b.dgamma, b.dbeta, b.dout, b.x, b.mean, b.rstd,
                                           b.gamma)), n * d


def _gate(direction, n=ROWS * COLS):
    rng = np.random.default_rng(0)
    g0, p0, da0 = rand(rng, n), rand(rng, n), rand(rng, n)
    a, g, p, da = np.empty(n, F32), g0.copy(), p0.copy(), da0.copy()
    if direction == "fwd":
        def run():  # g is overwritten: restore the input (a copy, counted in the time)
            np.copyto(g, g0)
            ops.gate_forward(a, g, p)
        return run, n

    def run_b():
        np.copyto(g, g0)
        np.copyto(p, p0)
        np.copyto(da, da0)
        ops.gate_backward(g, p, da)
    return run_b, n


def _softmax(which, n=ROWS, c=COLS):
    rng = np.random.default_rng(0)
    x, dy = rand(rng, (n, c)), rand(rng, (n, c))
    y, dx = np.empty((n, c), F32), np.empty((n, c), F32)
    fwd = getattr(ops, which + "_forward")
    bwd = getattr(ops, which + "_backward")
    fwd(y, x)
    return (lambda: fwd(y, x)), (lambda: bwd(dx, dy, y)), n * c


def _cross_entropy(direction, n=ROWS, c=COLS):
    rng = np.random.default_rng(0)
    logits = rand(rng, (n, c))
    labels = rng.integers(0, c, n)
    probs, dl = np.empty((n, c), F32), np.empty((n, c), F32)
    ops.cross_entropy_forward(probs, logits, labels)
    if direction == "fwd":
        return (lambda: ops.cross_entropy_forward(probs, logits, labels)), n * c
    return (lambda: ops.cross_entropy_backward(dl, probs, labels)), n * c


def _mse(n=ROWS * COLS):
    rng = np.random.default_rng(0)
    p, t, d = rand(rng, n), rand(rng, n), np.empty(n, F32)
    return (lambda: ops.mse_forward_backward(d, p, t)), n


def _dropout(direction, n=ROWS * COLS):
    rng = np.random.default_rng(0)
    x = rand(rng, (ROWS, COLS))
    out, mask = np.empty((ROWS, COLS), F32), np.empty((ROWS, COLS), F32)
    gen = np.random.default_rng(1)
    if direction == "fwd":
        return (lambda: ops.dropout_forward(out, mask, x, 0.1, gen)), n
    ops.dropout_forward(out, mask, x, 0.1, gen)
    return (lambda: ops.dropout_backward(out, x, mask)), n


def _fill_rows(n=ROWS, d=COLS):
    rng = np.random.default_rng(0)
    y, res, b = np.empty((n, d), F32), rand(rng, (n, d)), rand(rng, d)
    return (lambda: ops.fill_rows(y, b, res)), n * d


def _add(n=ROWS, d=COLS):
    rng = np.random.default_rng(0)
    out, a, b = np.empty((n, d), F32), rand(rng, (n, d)), rand(rng, (n, d))
    return (lambda: ops.add(out, a, b)), n * d


def _sgu(direction, b=8, t=128, c=COLS // 2):
    rng = np.random.default_rng(0)
    u_full = rand(rng, (b, t, 2 * c))
    u = u_full[:, :, :c]
    s_tm, bias, a = rand(rng, (t, b, c)), rand(rng, (t,)), np.empty((b, t, c), F32)
    da, tmp, db = rand(rng, (b, t, c)), np.empty((b, t, c), F32), np.zeros(t, F32)
    du = np.empty((b, t, c), F32)
    ops.sgu_gate_forward(a, s_tm, bias, u)
    if direction == "fwd":
        return (lambda: ops.sgu_gate_forward(a, s_tm, bias, u)), b * t * c
    # each call turns s_tm into dS and reads it as the next call's S: the same work
    return (lambda: ops.sgu_gate_backward(du, s_tm, db, tmp, da, bias, u)), b * t * c


def _embedding(n=4096, v=256, d=128):
    rng = np.random.default_rng(0)
    ids = rng.integers(0, v, n)
    dw, dout = np.zeros((v, d), F32), rand(rng, (n, d), 1e-3)
    return (lambda: ops.embedding_backward(dw, ids, dout)), n * d


# Case name -> factory returning (fn, elements per call).
CASES = {
    "adamw 321k": lambda: _adamw(ADAMW_N),
    "adamw 2.1M": lambda: _adamw(2_099_712),
    "sgd nesterov 321k": lambda: _sgd(ADAMW_N),
    "clip_grad_norm 321k": lambda: _clip(ADAMW_N),
    "layernorm fwd 2048x512": lambda: _layernorm("fwd"),
    "layernorm bwd 2048x512": lambda: _layernorm("bwd"),
    "gate fwd 1024x512": lambda: _gate("fwd"),
    "gate bwd 1024x512": lambda: _gate("bwd"),
    "softmax fwd 1024x512": lambda: _softmax("softmax")[::2],
    "softmax bwd 1024x512": lambda: _softmax("softmax")[1:],
    "log_softmax fwd 1024x512": lambda: _softmax("log_softmax")[::2],
    "log_softmax bwd 1024x512": lambda: _softmax("log_softmax")[1:],
    "cross_entropy fwd 1024x512": lambda: _cross_entropy("fwd"),
    "cross_entropy bwd 1024x512": lambda: _cross_entropy("bwd"),
    "mse fwd+bwd 1024x512": _mse,
    "dropout fwd 1024x512": lambda: _dropout("fwd"),
    "dropout bwd 1024x512": lambda: _dropout("bwd"),
    "fill_rows res+b 1024x512": _fill_rows,
    "add 1024x512": _add,
    "sgu_gate fwd 8x128x256": lambda: _sgu("fwd"),
    "sgu_gate bwd 8x128x256": lambda: _sgu("bwd"),
    "embedding bwd 4096x128": _embedding,
}


def measure(fn, seconds=0.3, min_calls=20) -> float:
    """Median seconds per call over ~``seconds`` of calls (after two warm-up calls)."""
    fn()
    fn()
    t0 = time.perf_counter()
    fn()
    one = max(time.perf_counter() - t0, 1e-7)
    calls = max(min_calls, int(seconds / one))
    times = []
    clock = time.perf_counter
    for _ in range(calls):
        t0 = clock()
        fn()
        times.append(clock() - t0)
    return statistics.median(times)


def split_ratio(fn, seconds=0.4) -> float:
    """Median of (time on one thread) / (time split over blasnet's threads) over paired calls
    of ``fn``, the split forced off and on through ``kernels.parallel.SPLIT_WORK`` (above 1:
    the split is faster). What ``SPLIT_WORK`` is chosen from."""
    from kernels import parallel
    saved = parallel.SPLIT_WORK

    def at(work):
        def call():
            parallel.SPLIT_WORK = work
            try:
                fn()
            finally:
                parallel.SPLIT_WORK = saved
        return call
    one, split = at(1 << 60), at(2)
    one()
    split()
    t0 = time.perf_counter()
    one()
    pairs = max(15, min(400, int(seconds / max(time.perf_counter() - t0, 1e-6))))
    ratios = []
    clock = time.perf_counter
    for _ in range(pairs):
        t0 = clock()
        one()
        t1 = clock()
        split()
        ratios.append((t1 - t0) / (clock() - t1))
    return statistics.median(ratios)


def run(names=None, seconds=0.3) -> dict:
    """{case: {"ns_per_element", "us_per_call", "elements", "threads"}}."""
    out = {}
    for name, make in CASES.items():
        if names and not any(s in name for s in names):
            continue
        fn, n = make()
        t = measure(fn, seconds)
        out[name] = {"ns_per_element": 1e9 * t / n, "us_per_call": 1e6 * t, "elements": n,
                     "threads": kernels.get_num_threads()}
    return out


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--json", help="also write the figures here")
    ap.add_argument("-k", action="append", help="only cases whose name contains this")
    ap.add_argument("--seconds", type=float, default=0.3)
    ap.add_argument("--split", action="store_true",
                    help="print time on one thread / time split, paired, per case instead")
    args = ap.parse_args(argv)
    if args.split:
        for name, make in CASES.items():
            if not args.k or any(s in name for s in args.k):
                fn, _ = make()
                print(f"{name:28s} 1 thr / split x{split_ratio(fn, args.seconds):.2f}",
                      flush=True)
        return 0
    res = run(args.k, args.seconds)
    for name, r in res.items():
        print(f"{name:28s} {r['us_per_call']:10.1f} us  {r['ns_per_element']:7.3f} ns/el  "
              f"({r['threads']} thr)")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(res, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())

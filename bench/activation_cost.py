"""ns per element of the engine's activation passes, and the first-call (compile) time of the
activation kernels: ``python -m bench.activation_cost [--compile]``.

Per element (float32, 1 thread, medians of 7 x 100 calls): the forward as the engine runs it
(bias + act in place over z for relu-like activations, act into h with act' cached over z
otherwise), the backward (act' recomputed in place for relu-like ones, the cached multiply
otherwise) alone and with the bias gradient (fused ``db=`` where the kernels take it, else
the separate gemv column sum), and the recomputing backward ``act_backward(dz, dh, z)``.
Each timed call follows a copy that restores its inputs; the copy alone is timed beside it
and subtracted. ``--compile``: each kernel's first call, in a fresh process; run it twice
with one empty ``NUMBA_CACHE_DIR`` for the cold (compile) and warm (disk cache) times.
"""
from __future__ import annotations

import argparse
import inspect
import time

import numpy as np

from kernels import num_threads, ops
from kernels.activations import REGISTRY

ACTS = ("relu", "gelu", "gelu_tanh", "silu")
SHAPES = ((1024, 128), (64, 2048))


def _median_ns(f, reps=100):
    ts = []
    for _ in range(reps):
        t = time.perf_counter_ns()
        f()
        ts.append(time.perf_counter_ns() - t)
    return float(np.median(ts))


def per_element(acts=ACTS, shapes=SHAPES):
    # the fused column sum exists where act_backward takes db
    fused_db = "db" in inspect.signature(ops.act_backward).parameters
    rng = np.random.default_rng(0)
    rows = []
    with num_threads(1):
        for n, d in shapes:
            z0 = (3 * rng.standard_normal((n, d))).astype(np.float32)
            b = rng.standard_normal(d).astype(np.float32)
            dh0 = rng.standard_normal((n, d)).astype(np.float32)
            db = np.zeros(d, np.float32)
            for act in acts:
                inplace = REGISTRY[act].sign_from_output
                z, dh, dz = z0.copy(), dh0.copy(), np.empty_like(z0)
                h = z if inplace else np.empty_like(z)
                g0 = z0.copy()  # what the forward leaves in z: act(z) or act'(z)
                ops.bias_act(g0 if inplace else np.empty_like(z), g0, b, act, 0.01,
                             None if inplace else g0)

                def fwd():
                    np.copyto(z, z0)
                    ops.bias_act(h, z, b, act, 0.01, None if inplace else z)

                def restore():
                    np.copyto(dh, dh0)
                    np.copyto(z, g0)

                def bwd(with_db=False):
                    restore()
                    fused = db if with_db and fused_db else None
                    if inplace:
                        ops.act_backward(dh, dh, z, act, 0.01, z, *([fused] if fused_db else []))
                    else:
                        ops.act_backward_cached(dh, dh, z, *([fused] if fused_db else []))
                    if with_db and not fused_db:
                        ops.colsum(db, dh, 1.0)

                fs = dict(fwd=fwd, copy_z=lambda: np.copyto(z, z0), bwd=bwd,
                          bwd_db=lambda: bwd(True), restore=restore,
                          recompute=lambda: ops.act_backward(dz, dh0, z0, act, 0.01, None))
                for f in fs.values():
                    f()
                t = {k: np.median([_median_ns(f) for _ in range(7)]) for k, f in fs.items()}
                ne = n * d
                rows.append((act, f"{n}x{d}", (t["fwd"] - t["copy_z"]) / ne,
                             (t["bwd"] - t["restore"]) / ne, (t["bwd_db"] - t["restore"]) / ne,
                             t["recompute"] / ne))
    return rows


def first_calls(acts=ACTS):
    """Seconds of the first call of each engine-path kernel (float32, 64 x 128)."""
    from kernels import activations as A
    from kernels import glu
    z0 = np.ones((64, 128), np.float32)
    b = np.zeros(128, np.float32)
    out = []

    def timed(label, fn):
        t = time.perf_counter()
        fn()
        out.append((label, time.perf_counter() - t))

    for act in acts:
        timed(f"{act} forward in place", lambda: A.bias_act_forward(z := z0.copy(), z, b, act))
        timed(f"{act} forward, act' over z",
              lambda: A.bias_act_forward(np.empty_like(z0), z := z0.copy(), b, act, grad=z))
        timed(f"{act} backward in place + db",
              lambda: A.act_backward(d := z0.copy(), d, z0, act, db=b.copy()))
        timed(f"{act} GLU forward", lambda: glu.glu_forward(np.empty_like(z0), z0.copy(),
                                                             z0.copy(), act))
    timed("cached backward + db (any act)",
          lambda: A.act_backward_cached(d := z0.copy(), d, z0, db=b.copy()))
    return out


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--compile", action="store_true", help="first-call times instead")
    args = ap.parse_args(argv)
    if args.compile:
        t0 = time.perf_counter()
        rows = first_calls()
        for label, s in rows:
            print(f"{label:36s} {s * 1e3:8.1f} ms")
        print(f"{'all of the above':36s} {(time.perf_counter() - t0) * 1e3:8.1f} ms")
        return
    print(f"{'act':10s} {'shape':9s} {'fwd':>7s} {'bwd':>7s} {'bwd+db':>7s} {'recompute':>9s}"
          "  (ns/element)")
    for act, shape, f, b, bd, r in per_element():
        print(f"{act:10s} {shape:9s} {f:7.3f} {b:7.3f} {bd:7.3f} {r:9.3f}")


if __name__ == "__main__":
    main()

"""Where a training step's time goes: one step of a block split into the kernels it calls,
loss, optimizer, zero_grad and the Python around them, next to its GEMM floor.

The instrumented step runs inside ``kernels.instrument.record(timed=True)``, which times
every ``kernels.ops`` call the engine makes (exclusive: a recorded call inside another is
not counted twice; calling thread only). The forward and backward are split into one part
per ops name they call (``gemm``, ``bias_act``, ``layernorm_forward``, ...) and "other":
their wall time minus those kernels (Python, inline NumPy). Loss forward/backward, the
optimizer step and zero_grad are timed as whole calls. Steps alternate with the
uninstrumented step and the floor; medians over the steps no other process disturbed
(bench.timing.CpuProbe). ``python -m bench.step_profile [--out PATH]``.
"""
from __future__ import annotations

import argparse
import statistics
import sys
import time

import kernels
from kernels import ops
from kernels.instrument import record

from bench import cases, floors, timing

GEMM = "gemm"  # the part the floor stands for; first row of the table
OTHER = "other (Python, inline NumPy)"
# Whole calls of the step after the backward; forward and backward are split into the
# kernels they call plus OTHER.
WHOLE = ("loss fwd", "loss bwd", "optimizer step", "zero_grad")
# The phases whose recorded kernels become parts.
SPLIT = ("forward", "backward")

REPS = 3 if timing.QUICK else 11


def order_parts(names) -> list:
    """Kernel part names in ``kernels.ops.NAMES`` order (gemm first), unknown ones last."""
    rank = {n: i for i, n in enumerate((GEMM,) + tuple(n for n in ops.NAMES if n != GEMM))}
    return sorted(set(names), key=lambda n: (rank.get(n, len(rank)), n))


def instrumented_step(case: dict):
    """cases.step_fn's step inside ``record(timed=True)``: returns (wall seconds of the step,
    {phase: seconds} for the whole calls, {ops name: seconds} and {ops name: calls} of the
    kernels that forward and backward called)."""
    module, x, target = case["module"], case["x"], case["target"]
    fwd, bwd, zero = module.forward, module.backward, module.zero_grad
    lfwd, lbwd, ostep = case["loss"].forward, case["loss"].backward, case["opt"].step
    clock = time.perf_counter

    def run():
        phase, kernel_s, kernel_n = {}, {}, {}
        with record(timed=True) as rec:
            def timed(name, f, *args):
                n0 = len(rec.calls)
                t0 = clock()
                res = f(*args)
                phase[name] = clock() - t0
                if name in SPLIT:
                    for c in rec.calls[n0:]:
                        kernel_s[c.name] = kernel_s.get(c.name, 0.0) + c.seconds
                        kernel_n[c.name] = kernel_n.get(c.name, 0) + 1
                return res

            t_start = clock()
            y = timed("forward", fwd, x)
            timed("loss fwd", lfwd, y, target)
            g = timed("loss bwd", lbwd)
            timed("backward", bwd, g)
            timed("optimizer step", ostep)
            timed("zero_grad", zero)
            wall = clock() - t_start
        return wall, phase, kernel_s, kernel_n
    return run


def _median(values):
    return statistics.median(values) if values else None


def profile_case(block: str, shape_name="large", reps: int = REPS, dtype=None) -> dict:
    """Profile of one case: medians (seconds) of the floor, the plain step, the instrumented
    step and each part, over ``reps`` undisturbed rounds (more rounds are run, up to
    2 reps + 3, to replace disturbed ones; all rounds, flagged, when too few are clean).
    ``parts``: one entry per ops name the forward and backward called, OTHER, and WHOLE;
    ``calls``: how many times forward + backward called each ops name."""
    import numpy as np
    case = cases.build_case(block, shape_name, dtype or np.float32)
    floor = floors.replay_fn(case["fwd_bwd"])  # the block's GEMM calls on its own buffers
    plain = case["step"]
    instr = instrumented_step(case)

    timing.warm_up(plain)
    timing.warm_up(floor, floor.restore)  # back to back: restored (floors.replay_fn)
    for _ in range(2):
        instr()
    p = timing.probe()
    p.refresh()
    clock = time.perf_counter
    rounds, reasons = [], []
    while len(rounds) < 2 * reps + 3 and reasons.count(None) < reps and (
            len(rounds) < reps or timing.extra_left() > 0):
        if timing.all_disturbed(reasons, 2):
            timing.wait_for_quiet()
        t_round = clock()
        s0 = p.sample()
        r = {}
        # Rotate the order so that none of the three always follows the same one.
        for what in ("floor", "plain", "instr")[len(rounds) % 3:] + \
                ("floor", "plain", "instr")[:len(rounds) % 3]:
            if what == "instr":
                r["instr"], phase, kernel_s, kernel_n = instr()
            else:
                t0 = clock()
                (floor if what == "floor" else plain)()
                r[what] = clock() - t0
        reasons.append(p.disturbed(s0, p.sample()))
        parts = dict(kernel_s)
        # Forward's and backward's own time, outside every recorded kernel.
        parts[OTHER] = sum(phase[k] for k in SPLIT) - sum(kernel_s.values())
        parts.update({k: phase[k] for k in WHOLE})
        r["parts"], r["calls"] = parts, kernel_n
        r["fwd_bwd"] = sum(phase[k] for k in SPLIT)
        if len(rounds) >= reps:  # a replacement round
            timing.spend_extra(clock() - t_round)
        rounds.append(r)
    clean = [r for r, why in zip(rounds, reasons) if why is None]
    fallback = len(clean) < min(timing.MIN_CLEAN, len(rounds))
    use = rounds if fallback else clean
    kernels_seen = order_parts(k for r in rounds for k in r["calls"])
    parts = {label: _median([r["parts"].get(label, 0.0) for r in use])
             for label in kernels_seen + [OTHER] + list(WHOLE)}
    calls = {k: use[0]["calls"].get(k, 0) for k in kernels_seen}
    why: dict = {}
    for w in reasons:
        if w is not None:
            why[w] = why.get(w, 0) + 1
    return dict(block=block, shape=getattr(shape_name, "name", shape_name),
                threads=kernels.get_num_threads(),
                floor=_median([r["floor"] for r in use]),
                step=_median([r["plain"] for r in use]),
                step_instrumented=_median([r["instr"] for r in use]),
                fwd_bwd=_median([r["fwd_bwd"] for r in use]), parts=parts, calls=calls,
                kept=[len(clean), len(rounds)], fallback=fallback, dropped=why)


def profile_all(blocks=cases.TRANSFORMER_BLOCKS, shape_name: str = "large",
                reps: int = REPS) -> list:
    return [profile_case(b, shape_name, reps) for b in blocks]


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", help="write the JSON here instead of stdout")
    ap.add_argument("--block", action="append", default=None,
                    help="block name, repeatable (default: the transformer blocks)")
    ap.add_argument("--shape", default="large", help="shape name (default: large)")
    ap.add_argument("--reps", type=int, default=REPS, help="clean rounds per block")
    args = ap.parse_args(argv)
    timing.settle()
    res = profile_all(tuple(args.block or cases.TRANSFORMER_BLOCKS), args.shape, args.reps)
    cases.write_json(res, args.out)
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""Where a training step's time goes: one step of a block split into GEMMs, elementwise
kernels, loss, optimizer, zero_grad and the Python around them, next to its GEMM floor.

The engine calls its kernels through module-level aliases (engine.blocks ``_gemm``,
``_bias_act``, ...; engine.layers has its own). For the instrumented step those aliases are
replaced, in this process only, by timers; each part's time is exclusive (a timed call inside
another is not counted twice) and what the forward and backward spend outside every timed
kernel is "other". Loss forward/backward, the optimizer step and zero_grad are timed as whole
calls. Steps alternate with the uninstrumented step and the floor; medians over the steps no
other process disturbed (bench.timing.CpuProbe). An alias the engine no longer has shows as
"n/a" (its time then lands in "other"). ``python -m bench.step_profile [--out PATH]``.
"""
from __future__ import annotations

import argparse
import contextlib
import importlib
import statistics
import sys
import threading
import time

from bench import cases, floors, timing

# part label -> the aliases timed under it, as (module, attribute).
KERNEL_PARTS = [
    ("GEMMs", [("engine.blocks", "_gemm"), ("engine.layers", "_gemm")]),
    ("act fwd (bias+act)", [("engine.blocks", "_bias_act"), ("engine.layers", "_bias_act")]),
    ("act bwd", [("engine.blocks", "_act_bwd"), ("engine.blocks", "_act_cached"),
                 ("engine.layers", "_act_bwd"), ("engine.layers", "_act_cached")]),
    ("gMLP gating fwd+bwd", [("engine.blocks", "_split_flat")]),
    ("bias/residual fill of y", [("engine.blocks", "_rows_split")]),
    ("layernorm fwd", [("engine.blocks", "_ln_fwd")]),
    ("layernorm bwd", [("engine.blocks", "_ln_bwd")]),
    ("bias column sums", [("engine.blocks", "_colsum"), ("engine.layers", "_colsum")]),
    ("dropout", [("engine.blocks", "_drop_fwd"), ("engine.blocks", "_drop_bwd")]),
]
OTHER = "other (Python, inline NumPy)"
# Whole calls of the step after the backward; forward and backward are split into the
# kernel parts plus OTHER.
WHOLE = ("loss fwd", "loss bwd", "optimizer step", "zero_grad")


def fwd_bwd_parts() -> list:
    """Labels of the parts of forward + backward: the kernel parts, then OTHER."""
    return [label for label, _ in KERNEL_PARTS] + [OTHER]

REPS = 3 if timing.QUICK else 11


class Profiler:
    """Exclusive timers: ``acc[label]`` is the time spent in calls labelled ``label`` minus
    the time of timed calls inside them. Only the thread that built it is timed (pool
    threads call straight through)."""

    def __init__(self):
        self.acc: dict = {}
        self.calls: dict = {}
        self._stack: list = []
        self._main = threading.get_ident()

    def reset(self):
        self.acc, self.calls = {}, {}

    def call(self, label, fn, *args, **kwargs):
        frame = [0.0]  # time of the timed calls inside this one
        self._stack.append(frame)
        t0 = time.perf_counter()
        try:
            return fn(*args, **kwargs)
        finally:
            dt = time.perf_counter() - t0
            self._stack.pop()
            self.acc[label] = self.acc.get(label, 0.0) + dt - frame[0]
            self.calls[label] = self.calls.get(label, 0) + 1
            if self._stack:
                self._stack[-1][0] += dt

    def wrap(self, label, fn):
        main, call = self._main, self.call

        def timed(*args, **kwargs):
            if threading.get_ident() != main:  # pool threads call straight through
                return fn(*args, **kwargs)
            return call(label, fn, *args, **kwargs)
        timed.__wrapped__ = fn
        return timed

    @contextlib.contextmanager
    def installed(self):
        """Replace the engine's kernel aliases (KERNEL_PARTS) by timers; restore them on
        exit."""
        saved = []
        try:
            for label, aliases in KERNEL_PARTS:
                for modname, attr in aliases:
                    mod = importlib.import_module(modname)
                    fn = getattr(mod, attr, None)
                    if callable(fn):
                        saved.append((mod, attr, fn))
                        setattr(mod, attr, self.wrap(label, fn))
            yield
        finally:
            for mod, attr, fn in reversed(saved):
                setattr(mod, attr, fn)


def available_parts() -> set:
    """Labels of the kernel parts with at least one alias present in the engine."""
    out = set()
    for label, aliases in KERNEL_PARTS:
        for modname, attr in aliases:
            if callable(getattr(importlib.import_module(modname), attr, None)):
                out.add(label)
    return out


def instrumented_step(prof: Profiler, case: dict):
    """cases.step_fn's step with each phase timed as a whole call."""
    module, x, target = case["module"], case["x"], case["target"]
    fwd, bwd, zero = module.forward, module.backward, module.zero_grad
    lfwd, lbwd, ostep = case["loss"].forward, case["loss"].backward, case["opt"].step
    call = prof.call

    def run():
        y = call("forward", fwd, x)
        call("loss fwd", lfwd, y, target)
        g = call("loss bwd", lbwd)
        call("backward", bwd, g)
        call("optimizer step", ostep)
        call("zero_grad", zero)
    return run


def _median(values):
    return statistics.median(values) if values else None


def profile_case(block: str, shape_name: str = "large", reps: int = REPS,
                 dtype=None) -> dict:
    """Profile of one case: medians (seconds) of the floor, the plain step, the instrumented
    step and each part, over ``reps`` undisturbed rounds (more rounds are run, up to
    2 reps + 3, to replace disturbed ones; all rounds, flagged, when too few are clean)."""
    import numpy as np
    case = cases.build_case(block, shape_name, dtype or np.float32)
    floor = floors.replay_fn(case["fwd_bwd"])  # the block's GEMM calls on its own buffers
    plain = case["step"]
    prof = Profiler()
    instr = instrumented_step(prof, case)
    have = available_parts()

    def instr_step():
        with prof.installed():
            t0 = time.perf_counter()
            instr()
            return time.perf_counter() - t0

    timing.warm_up(plain)
    timing.warm_up(floor)
    for _ in range(2):
        instr_step()
    p = timing.probe()
    p.refresh()
    clock = time.perf_counter
    rounds, reasons = [], []
    while len(rounds) < 2 * reps + 3 and reasons.count(None) < reps and (
            len(rounds) < reps or timing.extra_left() > 0):
        if timing.all_disturbed(reasons, 2):
            timing.wait_for_quiet()
        t_round = clock()
        prof.reset()
        s0 = p.sample()
        r = {}
        # Rotate the order so that none of the three always follows the same one.
        for what in ("floor", "plain", "instr")[len(rounds) % 3:] + \
                ("floor", "plain", "instr")[:len(rounds) % 3]:
            if what == "instr":
                r["instr"] = instr_step()
            else:
                t0 = clock()
                (floor if what == "floor" else plain)()
                r[what] = clock() - t0
        reasons.append(p.disturbed(s0, p.sample()))
        acc = dict(prof.acc)
        # Forward and backward's own time (outside every timed kernel) and the step
        # function's few calls between phases are "other".
        acc[OTHER] = acc.pop("forward", 0.0) + acc.pop("backward", 0.0) + \
            r["instr"] - sum(prof.acc.values())
        r["parts"] = acc
        r["calls"] = dict(prof.calls)
        if len(rounds) >= reps:  # a replacement round
            timing.spend_extra(clock() - t_round)
        rounds.append(r)
    clean = [r for r, why in zip(rounds, reasons) if why is None]
    fallback = len(clean) < min(timing.MIN_CLEAN, len(rounds))
    use = rounds if fallback else clean
    parts = {}  # label -> median seconds, None = n/a (the engine has no such alias any more)
    for label in fwd_bwd_parts() + list(WHOLE):
        if label == OTHER or label in WHOLE or label in have:
            parts[label] = _median([r["parts"].get(label, 0.0) for r in use])
        else:
            parts[label] = None
    calls = {label: use[0]["calls"].get(label, 0) for label, _ in KERNEL_PARTS}
    fwd_bwd = _median([sum(r["parts"].get(k, 0.0) for k in fwd_bwd_parts()) for r in use])
    why: dict = {}
    for w in reasons:
        if w is not None:
            why[w] = why.get(w, 0) + 1
    import kernels
    return dict(block=block, shape=shape_name, threads=kernels.get_num_threads(),
                floor=_median([r["floor"] for r in use]),
                step=_median([r["plain"] for r in use]),
                step_instrumented=_median([r["instr"] for r in use]),
                fwd_bwd=fwd_bwd, parts=parts, calls=calls,
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

"""Where a training step's time goes: one step of a block split into the kernels it calls,
the loss, the optimizer step (gradients zeroed in its pass) and the Python around them, next
to its GEMM floor.

The instrumented step is ``cases.step_fn``'s (``engine.fit``'s) inside
``kernels.instrument.record(timed=True)``, which times every ``kernels.ops`` call the engine
makes (exclusive: a recorded call inside another is not counted twice; calling thread only).
The forward and backward are split into one part per ops name they call (``gemm``,
``bias_act``, ``layernorm_forward``, ...) and "other": their wall time minus those kernels
(Python, inline NumPy, and the recorder's own cost per call). Loss forward, loss backward and
the optimizer step are timed as whole calls. Each part has its calls per step; the
``kernels.ops`` calls of the whole step are counted per phase. Steps alternate with the
uninstrumented step and the floor; medians over the steps no other process disturbed
(bench.timing.CpuProbe), at least ``REPS`` of them and more for fast steps (``ROUND_S``).

``python -m bench.step_profile [--shape NAME ...] [--small] [--block NAME ...] [--out PATH]``;
the thread count comes from ``BLASNET_NUM_THREADS``. ``--small`` profiles the small shapes
(``SMALL_SHAPES``), each with the blocks ``cases.CASES`` benches there.
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
OPTIMIZER = "optimizer step (+zero_grad)"
# Whole calls of the step after the forward; forward and backward are split into the
# kernels they call plus OTHER.
WHOLE = ("loss fwd", "loss bwd", OPTIMIZER)
# The phases whose recorded kernels become parts.
SPLIT = ("forward", "backward")
# The step's calls in the order it makes them.
PHASES = ("forward", "loss fwd", "loss bwd", "backward", OPTIMIZER)
# The shapes of ``--small``: those where a step is bound by per-call costs, not its GEMMs.
SMALL_SHAPES = ("seed000", "seed001", "batch64", "run")

# Clean rounds per case: at least REPS, more where a round is short, up to ROUND_S seconds
# of rounds (a part of a few microseconds needs many steps for a steady median), at most
# MAX_REPS.
REPS = 3 if timing.QUICK else 11
ROUND_S = 0.05 if timing.QUICK else 0.3
MAX_REPS = 30 if timing.QUICK else 200


def elements_of(name: str, args) -> int:
    """The elements a ``kernels.ops`` call ``name(*args)`` processes: the parameters of an
    optimizer call, the rows of the output gradient of an embedding backward, else the
    largest array it is given (the one it streams over)."""
    import numpy as np
    if name == "adamw":
        return sum(item[0][0].size for item in args[0])
    if name == "embedding_backward":
        return args[2].size
    return max((a.size for a in args if isinstance(a, np.ndarray)), default=0)


# kernels.ops name -> (index of the activation, index of db) in the call's full arguments
_VARIANT_ARGS = {"bias_act": (3, None), "act_backward": (3, 6), "act_backward_cached": (None, 3),
                 "glu_forward": (3, None)}


def variant(name: str, args) -> str:
    """The per-element row a ``kernels.ops`` call ``name(*args)`` belongs to: its name, with
    the activation of the activation kernels and "+db" where the bias gradient is summed in
    the same pass ("bias_act gelu", "act_backward relu +db", "act_backward_cached +db"): the
    NumPy chains they replaced cost per activation (bench/baselines.py)."""
    act, db = _VARIANT_ARGS.get(name, (None, None))
    if act is not None:
        name = f"{name} {args[act]}"
    if db is not None and args[db] is not None:
        name += " +db"
    return name


def order_parts(names) -> list:
    """Kernel part names in ``kernels.ops.NAMES`` order (gemm first), unknown ones last; a
    variant ("bias_act gelu") after its kernel's place."""
    rank = {n: i for i, n in enumerate((GEMM,) + tuple(n for n in ops.NAMES if n != GEMM))}
    return sorted(set(names), key=lambda n: (rank.get(n.split(" ")[0], len(rank)), n))


def instrumented_step(case: dict):
    """cases.step_fn's step inside ``record(timed=True)``: returns (wall seconds of the step,
    {phase: seconds} for each call of PHASES, {ops name: seconds} and {ops name: calls} of the
    kernels that forward and backward called, {phase: kernels.ops calls made inside it},
    {variant of the ops name: (seconds, elements)} over every call of the whole step)."""
    module, x, target = case["module"], case["x"], case["target"]
    fwd, bwd = module.forward, module.backward
    lfwd, lbwd, ostep = case["loss"].forward, case["loss"].backward, case["opt"].step
    clock = time.perf_counter

    def run():
        phase, kernel_s, kernel_n, ops_n = {}, {}, {}, {}
        with record(timed=True) as rec:
            def timed(name, f, *args, **kwargs):
                n0 = len(rec.calls)
                t0 = clock()
                res = f(*args, **kwargs)
                phase[name] = clock() - t0
                ops_n[name] = len(rec.calls) - n0
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
            timed(OPTIMIZER, ostep, zero_grad=True)  # as cases.step_fn and fit
            wall = clock() - t_start
        per_element = {}
        for c in rec.calls:
            if c.name != GEMM:
                key = variant(c.name, c.args)
                s, n = per_element.get(key, (0.0, 0))
                per_element[key] = (s + c.seconds, n + elements_of(c.name, c.args))
        return wall, phase, kernel_s, kernel_n, ops_n, per_element
    return run


def _median(values):
    return statistics.median(values) if values else None


def _reps_for(round_s: float) -> int:
    return max(REPS, min(MAX_REPS, int(ROUND_S / max(round_s, 1e-7))))


def profile_case(block: str, shape_name="large", reps: int | None = None, dtype=None) -> dict:
    """Profile of one case: medians (seconds) of the floor, the plain step, the instrumented
    step and each part, over ``reps`` undisturbed rounds (default: sized from a warm-up
    round, see ROUND_S; more rounds are run, up to 2 reps + 3, to replace disturbed ones; all
    rounds, flagged, when too few are clean). ``parts``: one entry per ops name the forward
    and backward called, OTHER, and WHOLE; ``calls``: calls per step of each part (forward +
    backward's calls of each ops name; 1 for each whole call); ``ops_calls``: kernels.ops
    calls per step made inside each phase of PHASES, ``ops_calls_total`` their sum."""
    import numpy as np
    case = cases.build_case(block, shape_name, dtype or np.float32)
    floor = floors.replay_fn(case["fwd_bwd"])  # the block's GEMM calls on its own buffers
    plain = case["step"]
    instr = instrumented_step(case)

    t_plain = timing.warm_up(plain)
    t_floor = timing.warm_up(floor, floor.restore)  # back to back: restored (floors.replay_fn)
    for _ in range(2):
        t_instr = instr()[0]
    elements = {k: n for k, (_, n) in instr()[5].items()}
    if reps is None:
        reps = _reps_for(t_plain + t_floor + t_instr)
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
                r["instr"], phase, kernel_s, kernel_n, ops_n, per_el = instr()
            else:
                t0 = clock()
                (floor if what == "floor" else plain)()
                r[what] = clock() - t0
        reasons.append(p.disturbed(s0, p.sample()))
        parts = dict(kernel_s)
        # Forward's and backward's own time, outside every recorded kernel.
        parts[OTHER] = sum(phase[k] for k in SPLIT) - sum(kernel_s.values())
        parts.update({k: phase[k] for k in WHOLE})
        r["parts"], r["calls"], r["ops_calls"] = parts, kernel_n, ops_n
        r["kernel_s"] = {k: t for k, (t, _) in per_el.items()}
        r["fwd_bwd"] = sum(phase[k] for k in SPLIT)
        # The step's time outside every part: never negative (the parts are disjoint pieces
        # of the step), whatever the machine does to one round.
        r["gap"] = r["instr"] - sum(parts.values())
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
    calls.update({k: 1 for k in WHOLE})
    ops_calls = {k: use[0]["ops_calls"].get(k, 0) for k in PHASES}
    # ns per element of each elementwise kernel over the whole step (loss and optimizer too)
    ns_per_element = {k: 1e9 * _median([r["kernel_s"].get(k, 0.0) for r in use]) / n
                      for k, n in elements.items() if n}
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
                ops_calls=ops_calls, ops_calls_total=sum(ops_calls.values()),
                elements=elements, ns_per_element=ns_per_element,
                kept=[len(clean), len(rounds)], fallback=fallback, dropped=why,
                gaps=[min(r["gap"] for r in rounds), max(r["gap"] for r in rounds)])


def blocks_at(shape_name: str) -> tuple:
    """The blocks ``cases.CASES`` benches at ``shape_name``, in its order."""
    return tuple(b for b, s in cases.CASES if s == shape_name)


def selected(shapes, blocks=None) -> list:
    """(block, shape) pairs to profile: for each shape the blocks benched there (only those
    in ``blocks`` when given); ValueError when nothing matches."""
    for s in shapes:
        if s not in cases.SHAPES:
            raise ValueError(f"shape: expected one of {tuple(cases.SHAPES)}, got {s!r}")
    for b in blocks or ():
        cases.bench_block(b)  # ValueError for an unknown block
    out = [(b, s) for s in shapes for b in blocks_at(s) if not blocks or b in blocks]
    if not out:
        raise ValueError(f"no bench case has block {list(blocks or [])} at shape {list(shapes)}; "
                         f"cases: {cases.CASES}")
    return out


def profile_all(blocks=None, shape_name: str = "large", reps: int | None = None) -> list:
    """Every block of ``blocks`` (default: cases.TRANSFORMER_BLOCKS) at ``shape_name``."""
    blocks = cases.TRANSFORMER_BLOCKS if blocks is None else blocks
    return [profile_case(b, shape_name, reps) for b in blocks]


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", help="write the JSON here instead of stdout")
    ap.add_argument("--shape", action="append", default=None,
                    help=f"shape name, repeatable (default: large); one of {tuple(cases.SHAPES)}")
    ap.add_argument("--small", action="store_true",
                    help=f"add the small shapes {SMALL_SHAPES}")
    ap.add_argument("--block", action="append", default=None,
                    help="block name, repeatable (default: every block benched at the shape)")
    ap.add_argument("--reps", type=int, default=None,
                    help=f"clean rounds per case (default: {REPS} to {MAX_REPS}, sized to "
                         f"~{ROUND_S:g} s of rounds)")
    args = ap.parse_args(argv)
    shapes = list(args.shape or ([] if args.small else ["large"]))
    if args.small:
        shapes += [s for s in SMALL_SHAPES if s not in shapes]
    try:
        which = selected(shapes, args.block)
    except ValueError as e:
        ap.error(str(e))
    timing.settle()
    res = [profile_case(b, s, args.reps) for b, s in which]
    cases.write_json(res, args.out)
    return 0


if __name__ == "__main__":
    sys.exit(main())

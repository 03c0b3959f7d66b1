"""Peak traced memory of a training step next to what the block keeps (tracemalloc).

For each case: the input and target are made first (not counted; nor are lazy imports and
the kernels' shared caches, set up by one untraced step of a throw-away copy), then tracing
starts and the module, loss and AdamW are built and trained for four steps. "state" is parameters +
gradients + the two AdamW moments (4x the parameter bytes); "buffers" is everything else
still allocated after the steps (cached activations, work buffers); their sum is what a
training loop keeps. "peak" is the highest traced memory over construction and the steps;
"step alloc" is how far a steady (fourth) step rises above what was allocated before it.
Run as a script it prints JSON: ``python -m bench.memory [--out PATH]``.
"""
from __future__ import annotations

import argparse
import gc
import sys
import tracemalloc

from bench import cases


def _step_untraced(block, shape, x, target):
    module = cases.build_module(block, shape)
    cases.step_fn(module, x, target, cases.make_loss(block), cases.make_optimizer(module))()


def measure(block: str, shape_name: str, steps: int = 4) -> dict:
    shape = cases.SHAPES[shape_name]
    x, target, _ = cases.make_data(block, shape)
    # One untraced step of a throw-away copy first: lazy imports and the kernels' shared
    # caches (scratch blocks, ones vectors) are not this module's memory.
    _step_untraced(block, shape, x, target)
    gc.collect()
    tracemalloc.start()
    try:
        base = tracemalloc.get_traced_memory()[0]
        module = cases.build_module(block, shape)
        loss = cases.make_loss(block)
        opt = cases.make_optimizer(module)
        step = cases.step_fn(module, x, target, loss, opt)
        for _ in range(steps - 1):
            step()
        gc.collect()
        before, peak_all = tracemalloc.get_traced_memory()
        tracemalloc.reset_peak()
        step()
        after, peak_step = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    state = 4 * sum(p.data.nbytes for p in module.parameters())
    held = after - base
    return dict(block=block, shape=shape_name, params=module.num_parameters(), state=state,
                buffers=held - state, sum=held, peak=max(peak_all, peak_step) - base,
                step_alloc=peak_step - before)


def measure_all(which=None) -> list:
    out = []
    for block, shape in cases.CASES:
        if which is None or (block, shape) in which:
            out.append(measure(block, shape))
    return out


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", help="write the JSON here instead of stdout")
    ap.add_argument("--case", action="append", default=None,
                    help="BLOCK:SHAPE, repeatable (default: every case)")
    args = ap.parse_args(argv)
    which = None if args.case is None else {tuple(c.split(":", 1)) for c in args.case}
    cases.write_json(measure_all(which), args.out)
    return 0


if __name__ == "__main__":
    sys.exit(main())

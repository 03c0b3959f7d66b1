"""Gradient checkpointing (Chen et al. 2016): peak activation memory and step time of a stack
of FFNSublayer(pre) blocks, ``Sequential(*blocks, checkpoint=False)`` against ``True``.

Activation memory is what a forward + backward allocates beyond the model: the module, its
parameters and gradients, the input and the output gradient are made before tracing starts,
so the traced peak of the first step (where every work buffer and checkpoint is allocated)
is the activations, input copies and transient arrays, nothing else. Time: the following
steps (no allocation left) alternate between the two stacks; the ratio is the median of the
pairs' ratios.
Targets: peak with checkpointing <= 1/6 of without, time <= 1.4x.

Run as a script it prints JSON: ``python -m bench.checkpoint_memory [--quick] [--out PATH]``;
``measure()`` returns the same dict for the bench report's memory table.
"""
from __future__ import annotations

import argparse
import gc
import json
import statistics
import sys
import time
import tracemalloc
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:  # run as a script: make engine importable
    sys.path.insert(0, str(ROOT))

import numpy as np  # noqa: E402

MEMORY_RATIO_MAX = 1 / 6   # peak activation memory, checkpointed / plain
TIME_RATIO_MAX = 1.4       # step time, checkpointed / plain


def _stack(blocks, d, f, checkpoint, dtype):
    from engine import FFNSublayer, Sequential
    rng = np.random.default_rng(0)
    return Sequential(*[FFNSublayer(d, f, norm="pre", dtype=dtype, rng=rng)
                        for _ in range(blocks)], checkpoint=checkpoint)


def _first_step(blocks, n, d, f, checkpoint, dtype):
    """The stack, its step, and the traced peak of its first step (bytes above the model)."""
    model = _stack(blocks, d, f, checkpoint, dtype)
    rng = np.random.default_rng(1)
    x = rng.standard_normal((n, d)).astype(dtype)
    dy = rng.standard_normal((n, d)).astype(dtype)

    def step():
        model.forward(x)
        model.backward(dy)
        model.zero_grad()

    gc.collect()
    tracemalloc.start()
    try:
        base = tracemalloc.get_traced_memory()[0]
        tracemalloc.reset_peak()
        step()  # first step: every work buffer and checkpoint is allocated here
        peak = tracemalloc.get_traced_memory()[1] - base
    finally:
        tracemalloc.stop()
    held = model.workspace_nbytes()  # shared pools counted once
    return model, step, dict(peak_bytes=peak, held_bytes=held, params=model.num_parameters())


def measure(blocks: int = 12, n: int = 2048, d: int = 512, f: int = 2048,
            dtype=np.float32, steps: int = 5) -> dict:
    """Both stacks at (n, d, f): peak activation bytes, held work-buffer bytes, median step
    seconds, and the two ratios next to their targets. The steps alternate between the two
    stacks and the time ratio is the median of the pairs' ratios, so a disturbance from
    another process hits both sides alike."""
    _, plain_step, plain = _first_step(blocks, n, d, f, False, dtype)
    _, ckpt_step, ckpt = _first_step(blocks, n, d, f, True, dtype)
    tp, tc = [], []
    for _ in range(steps):
        t0 = time.perf_counter()
        plain_step()
        t1 = time.perf_counter()
        ckpt_step()
        t2 = time.perf_counter()
        tp.append(t1 - t0)
        tc.append(t2 - t1)
    plain["step_seconds"] = statistics.median(tp)
    ckpt["step_seconds"] = statistics.median(tc)
    mem = ckpt["peak_bytes"] / plain["peak_bytes"]
    tim = statistics.median(c / p for p, c in zip(tp, tc))
    return dict(case=f"{blocks} x FFNSublayer(pre) at ({n}, {d}, {f}) {np.dtype(dtype).name}",
                plain=plain, checkpoint=ckpt, memory_ratio=mem, time_ratio=tim,
                memory_ratio_max=MEMORY_RATIO_MAX, time_ratio_max=TIME_RATIO_MAX,
                memory_ok=mem <= MEMORY_RATIO_MAX, time_ok=tim <= TIME_RATIO_MAX)


def format_rows(r: dict) -> list:
    """Table lines for the bench report's memory table."""
    mib = 1024 * 1024
    p, c = r["plain"], r["checkpoint"]
    return [
        f"checkpointing: {r['case']}",
        f"  {'':14s} {'peak MiB':>9s} {'held MiB':>9s} {'step s':>8s}",
        f"  {'plain':14s} {p['peak_bytes'] / mib:9.1f} {p['held_bytes'] / mib:9.1f} "
        f"{p['step_seconds']:8.3f}",
        f"  {'checkpoint':14s} {c['peak_bytes'] / mib:9.1f} {c['held_bytes'] / mib:9.1f} "
        f"{c['step_seconds']:8.3f}",
        f"  memory {r['memory_ratio']:.3f} (target <= {r['memory_ratio_max']:.3f}: "
        f"{'ok' if r['memory_ok'] else 'MISSED'}), time {r['time_ratio']:.2f}x (target <= "
        f"{r['time_ratio_max']}x: {'ok' if r['time_ok'] else 'MISSED'})",
    ]


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="3 blocks at (512, 128, 512)")
    ap.add_argument("--out", default=None, help="write the JSON here too")
    a = ap.parse_args(argv)
    r = measure(3, 512, 128, 512, steps=3) if a.quick else measure()
    text = json.dumps(r, indent=2)
    print(text)
    print("\n".join(format_rows(r)), file=sys.stderr)
    if a.out:
        Path(a.out).write_text(text + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())

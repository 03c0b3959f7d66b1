"""Block benchmarks: forward+backward and the full training step of each case, its GEMM
floor, and the naive reference, all in one process so the ratios compare like with like.

Benchmarks of one case run next to each other (floor, fwd+bwd, step, naive); the floor is
the block's own GEMM calls replayed on its own buffers (``floors.replay_fn``), the naive
step is the block's twin from the registry (``engine.models.naive``); fwd+bwd and
step also record their ratio to the floor over alternating pairs of calls (``paired_ratio``),
which is what the table reports; the step and the floor also record their one-thread /
N-thread time ratio the same way (``timing.paired_scaling``), at every shape. Quick mode
skips the large shape on one thread and the naive reference at the large shape. ``run.py``
turns the JSON into the table.
"""
from __future__ import annotations

import pytest

from bench import cases, floors
from bench.timing import QUICK, run_benchmark

KINDS = ("floor", "fwd_bwd", "step", "naive_fwd_bwd", "naive_step")

PARAMS = [pytest.param(b, s, k, id=f"{b}|{s}|{k}") for b, s in cases.CASES for k in KINDS]


@pytest.fixture(scope="module")
def built():
    """Cases are built once per module and reused across their kinds."""
    store = {}

    def get(block, shape):
        key = (block, shape)
        if key not in store:
            store.clear()  # one case alive at a time keeps memory flat
            store[key] = cases.build_case(block, shape)
        return store[key]
    return get


@pytest.mark.parametrize("block,shape,kind", PARAMS)
def test_block(benchmark, built, threads, block, shape, kind):
    sh = cases.SHAPES[shape]
    if QUICK and shape == "large" and (threads == 1 or kind.startswith("naive")):
        pytest.skip("quick mode: the large shape runs at more than one thread, without the "
                    "naive reference (its scaling is measured in-process)")
    gemms = floors.gemm_list(block, sh)
    info = dict(block=block, shape=shape, kind=kind, flops=floors.gemm_flops(gemms),
                n_gemms=len(gemms), rows=sh.rows)
    floor = setup = None
    c = built(block, shape)
    if kind in ("floor", "fwd_bwd", "step") and "floor" not in c:
        c["floor"] = floors.replay_fn(c["fwd_bwd"])  # the block's own GEMMs, own buffers
    if kind == "floor":
        fn = c["floor"]
        setup = fn.restore  # timed alone, back to back: restored first (floors.replay_fn)
    else:
        if kind == "fwd_bwd":
            fn = c["fwd_bwd"]
            with floors.record_gemms() as seen:
                fn()
            info["block_gemms"] = [list(t) for t in seen]
            info["floor_gemms"] = [list(t) for t in floors.mnk(gemms)]
            floor = c["floor"]
        elif kind == "step":
            fn = c["step"]
            floor = c["floor"]
            c["module"].zero_grad()  # what fwd_bwd accumulated is not the step's to apply
        else:
            twin = cases.naive_twin(block, c["module"])
            x, target, dy = c["x"], c["target"], c["dy"]
            if kind == "naive_fwd_bwd":
                def fn():
                    twin.forward_backward(x, dy)
            else:
                def fn():
                    twin.step(x, target)
    scaling = kind in ("floor", "step")  # one-thread / N-thread pairs in this process
    run_benchmark(benchmark, fn, floor, scaling, setup, **info)

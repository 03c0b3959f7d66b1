"""Block benchmarks: forward+backward and the full training step of each case, its GEMM
floor, and the naive reference, all in one process so the ratios compare like with like.

Benchmarks of one case run next to each other (floor, fwd+bwd, step, naive); fwd+bwd and
step also record their ratio to the floor over alternating pairs of calls (``paired_ratio``),
which is what the table reports. ``run.py`` turns the JSON into the table.
"""
from __future__ import annotations

import pytest

from bench import cases, floors, naive
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
    if QUICK and threads == 1 and shape == "large" and kind.startswith("naive"):
        pytest.skip("quick mode: no naive reference at the large shape on one thread")
    gemms = floors.gemm_list(block, sh)
    info = dict(block=block, shape=shape, kind=kind, flops=floors.gemm_flops(gemms),
                n_gemms=len(gemms), rows=sh.rows)
    floor = None
    if kind == "floor":
        fn = floors.floor_fn(gemms)
    else:
        c = built(block, shape)
        if kind == "fwd_bwd":
            fn = c["fwd_bwd"]
            with floors.record_gemms() as seen:
                fn()
            info["block_gemms"] = [list(t) for t in seen]
            info["floor_gemms"] = [list(t) for t in floors.mnk(gemms)]
            floor = floors.floor_fn(gemms)
        elif kind == "step":
            fn = c["step"]
            floor = floors.floor_fn(gemms)
        else:
            twin = naive.from_module(block, c["module"], cases.LR)
            x, target, dy = c["x"], c["target"], c["dy"]
            if kind == "naive_fwd_bwd":
                def fn():
                    twin.forward_backward(x, dy)
            else:
                def fn():
                    twin.step(x, target)
    run_benchmark(benchmark, fn, floor, **info)

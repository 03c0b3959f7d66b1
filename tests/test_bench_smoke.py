"""The bench harness cannot silently rot: the report math on fake results, a tiny real run of
the driver, the floors against the GEMMs the blocks really make, the naive reference
against the engine step, and the memory pass. No timing assertions."""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from bench import cases, floors, memory, naive, run  # noqa: E402

# A small shape with every dimension distinct, so a transposed GEMM cannot pass for another.
TINY = cases.Shape("tiny", (3, 5), 12, 20)
TINY_MLP = cases.Shape("tinymlp", (7,), sizes=(11, 9, 6, 4))
TINY_CASES = [(b, TINY) for b in cases.TRANSFORMER_BLOCKS] + [("MLP", TINY_MLP)]


def _bench(extra, median):
    return {"extra_info": extra, "stats": {"median": median, "rounds": 5}}


def _write_fake(tmp_path):
    """Two thread counts of one block case plus a kernel pair, and a memory record."""
    flops = 6e9
    for thr, scale in ((1, 2.0), (2, 1.0)):
        b = []
        for kind, ms in (("floor", 10.0), ("fwd_bwd", 11.0), ("step", 12.0),
                         ("naive_fwd_bwd", 33.0), ("naive_step", 48.0)):
            extra = dict(block="FFN-relu", shape="large", kind=kind, flops=flops, n_gemms=6,
                         rows=2048, threads=thr)
            if kind == "fwd_bwd":
                extra["block_gemms"] = extra["floor_gemms"] = [[2, 3, 4]]
            if kind == "step" and thr == 1:
                extra["paired_ratio"] = 1.25  # preferred over the ratio of medians
            if kind == "step" and thr == 2:
                extra["paired_scaling"] = 1.6  # preferred over the ratio of medians
            b.append(_bench(extra, scale * ms / 1e3))
        b.append(_bench(dict(kernel="adamw_update", size="2.1M", impl="fast", threads=thr), 0.002))
        b.append(_bench(dict(kernel="adamw_update", size="2.1M", impl="ref", threads=thr), 0.006))
        (tmp_path / f"threads{thr}.json").write_text(json.dumps({"benchmarks": b}))
    mib = 1 << 20
    mem = [dict(block="FFN-relu", shape="large", params=100, state=4 * mib, buffers=4 * mib,
                sum=8 * mib, peak=12 * mib, step_alloc=0)]
    (tmp_path / "memory.json").write_text(json.dumps(mem))


def test_report_math_on_fake_results(tmp_path):
    # Check that ratios, speed-ups, GF/s, scaling and target verdicts follow from the medians.
    _write_fake(tmp_path)
    text, data = run.report(tmp_path)
    two = next(r for r in data["blocks"] if r["threads"] == 2)
    assert two["floor_ms"] == pytest.approx(10.0)
    assert two["fwd_bwd_ratio"] == pytest.approx(1.1)
    assert two["step_ratio"] == pytest.approx(1.2)
    assert two["fwd_bwd_x_naive"] == pytest.approx(3.0)
    assert two["step_x_naive"] == pytest.approx(4.0)
    assert two["step_gfs"] == pytest.approx(6e9 / 1e9 / 0.012)
    assert two["gemm_check"] == "ok"
    one = next(r for r in data["blocks"] if r["threads"] == 1)
    assert one["step_ratio"] == pytest.approx(1.25)
    assert one["step_ratio_medians"] == pytest.approx(1.2)
    (s,) = data["scaling"]
    assert s["step_scaling_medians"] == pytest.approx(2.0)
    assert s["step_scaling"] == pytest.approx(1.6)
    verdicts = {t["target"]: t["met"] for t in data["targets"]}
    assert verdicts["fwd+bwd/floor FFN-relu large (2 thr)"] is False   # 1.10 > 1.08
    assert verdicts["step/floor FFN-relu large (2 thr)"] is False       # 1.20 > 1.15
    assert verdicts["adamw_update 2.1M params, x naive (2 thr)"] is False  # 3.0 < 4
    assert verdicts["step scaling 1->2 thr FFN-relu large"] is False     # 1.6 < 1.7
    assert verdicts["peak/sum memory FFN-relu large"] is False            # 1.5 > 1.25
    for needle in ("FFN-relu", "large", "1.10", "1.20", "1.60", "2.00", "3.00x", "MISSED", "met"):
        assert needle in text


def test_report_survives_missing_pieces(tmp_path):
    # Check that a run with only a floor and no memory still prints, with '-' for the gaps.
    b = [_bench(dict(block="GMLP", shape="seed000", kind="floor", flops=1e6, n_gemms=9,
                     rows=8, threads=1), 1e-4)]
    (tmp_path / "threads1.json").write_text(json.dumps({"benchmarks": b}))
    text, data = run.report(tmp_path, threads=(1,))
    assert "GMLP" in text and " - " in text
    assert data["scaling"] == [] and data["targets"] == []


@pytest.mark.slow
def test_driver_tiny_real_run(tmp_path):
    # Check that bench/run.py runs pytest-benchmark end to end and prints the block row.
    env = {k: v for k, v in os.environ.items() if k != "BLASNET_NUM_THREADS"}
    r = subprocess.run(
        [sys.executable, str(ROOT / "bench" / "run.py"), "--quick", "--threads", "1",
         "-k", "FFN-relu and seed000", "--no-memory", "--results", str(tmp_path)],
        cwd=ROOT, env=env, capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    saved = json.loads((tmp_path / "threads1.json").read_text())
    kinds = {b["extra_info"]["kind"] for b in saved["benchmarks"]}
    assert kinds == {"floor", "fwd_bwd", "step", "naive_fwd_bwd", "naive_step"}
    row = next(line for line in r.stdout.splitlines() if line.startswith("FFN-relu"))
    assert "seed000" in row and " - " not in row


@pytest.mark.parametrize("block,shape", TINY_CASES, ids=[b for b, _ in TINY_CASES])
def test_floor_lists_the_gemms_the_block_makes(block, shape):
    # Check that the floor's GEMMs are, as (M, N, K) up to a transposed output, exactly those
    # of the block's forward + backward.
    module = cases.build_module(block, shape)
    x, _, dy = cases.make_data(block, shape)
    with floors.record_gemms() as seen:
        module.forward(x)
        module.backward(dy)
    gemms = floors.gemm_list(block, shape)
    assert floors.same_gemms(seen, gemms), (sorted(seen), sorted(floors.mnk(gemms)))
    assert not floors.same_gemms(seen[1:], gemms)  # one GEMM short is noticed


@pytest.mark.parametrize("block,shape", TINY_CASES, ids=[b for b, _ in TINY_CASES])
def test_naive_step_equals_engine_step(block, shape):
    # Check that the naive baseline does the same training step as the engine (float64).
    f64 = np.float64
    module = cases.build_module(block, shape, dtype=f64)
    twin = naive.from_module(block, module, cases.LR)
    x, target, _ = cases.make_data(block, shape, dtype=f64)
    loss, opt = cases.make_loss(block), cases.make_optimizer(module)
    step = cases.step_fn(module, x, target, loss, opt)
    for _ in range(3):
        step()
        twin.step(x, target)
    ours = {name: p.data for name, p in module.named_parameters()}
    for name in ours:
        key = name
        if block == "MLP":  # engine "0.W" / "0.b" -> naive "W0" / "b0"
            i, kind = name.split(".")
            key = f"{kind}{i}"
        np.testing.assert_allclose(twin.params[key], ours[name], rtol=1e-9, atol=1e-12,
                                   err_msg=f"{block} {name}")


def test_memory_pass_on_a_tiny_case(monkeypatch):
    # Check that the memory record adds up: state = 4x params, sum = state + buffers <= peak.
    monkeypatch.setitem(cases.SHAPES, "tiny", TINY)
    m = memory.measure("FFN-gelu", "tiny")
    n_params = 12 * 20 + 20 + 20 * 12 + 12
    assert m["params"] == n_params
    assert m["state"] == 4 * 4 * n_params
    assert m["sum"] == m["state"] + m["buffers"]
    assert m["buffers"] > 0 and m["peak"] >= m["sum"]

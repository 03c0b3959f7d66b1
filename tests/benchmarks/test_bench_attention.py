"""bench/attention.py cannot silently rot: a tiny real run writes a ratio for every case, and
its floors replay exactly the GEMMs the attention module makes. No timing assertions."""
from __future__ import annotations

import json
import math
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from bench import attention, floors  # noqa: E402


@pytest.mark.slow
def test_tiny_run_reports_every_case(tmp_path):
    # Check that the driver runs end to end (quick mode, as make bench QUICK=1) and reports a
    # finite ratio per case (two MHA shapes in the real run, one here, the GPT step, and
    # nanoGPT's CPU recipe at 1 and 2 threads, the second also without the lane thread of
    # kernels.overlap against with it).
    out = tmp_path / "attention.json"
    env = dict(os.environ, BLASNET_BENCH_QUICK="1")
    r = subprocess.run([sys.executable, str(ROOT / "bench" / "attention.py"), "--tiny",
                        "--threads", "1", "--out", str(out)], cwd=ROOT, env=env,
                       capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    rows = json.loads(out.read_text())["rows"]
    assert [r["case"].split()[0] for r in rows] == ["MHA", "GPT", "nanoGPT-cpu",
                                                    "nanoGPT-cpu"]
    assert all(math.isfinite(r["ratio"]) and r["ratio"] > 0 for r in rows)
    assert [r["without_lane_over_lane"] is None for r in rows[2:]] == [True, False]
    lane = rows[3]["without_lane_over_lane"]
    assert math.isfinite(lane) and lane > 0
    assert all(r["target"] == 1.15 for r in rows)  # every case against the same target
    assert all(math.isfinite(r["attention_bound"]) and r["attention_bound"] > 1 for r in rows)
    assert math.isfinite(rows[-1]["ratio_blas_heads"])


@pytest.mark.slow
def test_tiny_paths_table_reports_both_paths(tmp_path):
    # Check that --paths times both attention paths and writes a finite ratio per case.
    out = tmp_path / "paths.json"
    env = dict(os.environ, BLASNET_BENCH_QUICK="1")
    r = subprocess.run([sys.executable, str(ROOT / "bench" / "attention.py"), "--tiny",
                        "--paths", "--threads", "1", "--out", str(out)], cwd=ROOT, env=env,
                       capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    rows = json.loads(out.read_text())["rows"]
    assert len(rows) == len(attention.TINY_PATH_CASES)
    assert all(math.isfinite(x["kernel_over_blas"]) and x["kernel_over_blas"] > 0 for x in rows)


@pytest.mark.parametrize("path, per_head", [("blas", 6 * 2 * 3), ("kernel", 0)])
def test_mha_floor_is_the_modules_own_gemms(path, per_head):
    # Check that the floor replays as many GEMMs as the module makes: the two projections'
    # six, plus six per (sequence, head) on the per-head BLAS path only.
    fn, floor, flops = attention.mha_case((2, 8, 12, 3), path=path)
    with floors.record_gemms() as seen:
        fn()
    assert len(floor.calls) == len(seen) == 6 + per_head
    assert flops > 0


def test_nanogpt_case_is_the_recipe_without_bias_and_counts_its_blas_calls():
    # Check the nanoGPT case's model (no biases, tied head) and that its compiled step makes
    # 6 fewer BLAS calls per (sequence, head, layer) than the per-head path.
    s = attention.TINY_NANOGPT
    step, floor, model, _, _ = attention.gpt_case(s, path="kernel")
    old, _, _, _, _ = attention.gpt_case(s, path="blas")
    assert all(blk.attn.b_qkv is None and blk.attn.b_o is None for blk in model.h)
    assert model.tie_weights
    fewer = 6 * s["batch"] * s["n_head"] * s["n_layer"]
    assert attention.blas_calls(old) - attention.blas_calls(step) == fewer
    with floors.record_gemms() as seen:
        step()
    assert len(seen) == len(floor.calls)


@pytest.mark.parametrize("causal", [True, False])
def test_attention_flops_are_what_the_per_head_path_runs_as_gemms(causal):
    # Check attention_flops against the GEMMs the per-head BLAS path adds to the compiled
    # path's (the projections): six T x T x d_head products per (sequence, head), full; a
    # causal mask keeps T (T + 1) / 2 of each T x T.
    shape = (2, 8, 12, 3)
    b, t, d, h = shape
    flops = {}
    for path in ("blas", "kernel"):
        fn, _, _ = attention.mha_case(shape, path=path, causal=causal)
        with floors.record_gemms() as seen:
            fn()
        flops[path] = floors.gemm_flops(seen)
    per_head = flops["blas"] - flops["kernel"]
    assert attention.attention_flops(b, t, d, h, causal=False) == per_head
    assert attention.attention_flops(b, t, d, h) * 2 * t == per_head * (t + 1)
    assert attention.attention_flops(b, t, d, h, n_layer=3) == 3 * attention.attention_flops(
        b, t, d, h)


@pytest.mark.parametrize("shape", [(2, 8, 12, 3), (1, 5, 16, 2)])
def test_attention_bound_of_mha_is_one_plus_t_plus_one_over_four_d(shape):
    # Check the bound against its closed form for MultiHeadAttention, derived by hand: the
    # causal products take 6 B d T (T + 1) FLOPs, the four projections' GEMMs (forward and
    # backward) 24 B T d^2, so the bound is 1 + (T + 1) / (4 d). The floor's FLOPs are
    # counted from its recorded calls and agree with the registry's GEMM list.
    b, t, d, h = shape
    fn, floor, flops = attention.mha_case(shape, path="kernel")
    assert attention.floor_flops(floor) == flops
    bound = attention.attention_bound(floor, attention.attention_flops(*shape))
    assert bound == pytest.approx(1 + (t + 1) / (4 * d), rel=1e-12)

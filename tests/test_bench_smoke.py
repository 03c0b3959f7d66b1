"""The bench harness cannot silently rot: the report math on fake results, a tiny real run of
the driver, the floors against the GEMMs the blocks really make, the naive reference
against the engine step, the memory pass, the interference filter (its decision rule on
made-up samples, its signal on a real disturbance) and the step profile. No timing
assertions."""
from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from bench import cases, floors, memory, naive, run, step_profile, timing  # noqa: E402

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
        b.append(_bench(dict(kernel="adamw_update_many", size="2.1M", impl="fast", threads=thr), 0.002))
        b.append(_bench(dict(kernel="adamw_update_many", size="2.1M", impl="ref", threads=thr), 0.006))
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
    assert verdicts["adamw_update_many 2.1M params, x naive (2 thr)"] is False  # 3.0 < 4
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
    for b in saved["benchmarks"]:
        e = b["extra_info"]
        kept, total = e["median_clean_kept"]
        assert 0 <= kept <= total and total >= b["stats"]["rounds"]
        assert e["median_clean"] > 0
        if e["kind"] in ("fwd_bwd", "step"):
            kept, total = e["paired_ratio_kept"]
            assert total == len(e["paired_ratio_samples"]) == len(e["paired_ratio_disturbed"])
            assert kept == e["paired_ratio_disturbed"].count("")
    assert not (tmp_path / "profile.json").exists()  # -k skips the profile
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
def test_replayed_floor_is_the_blocks_own_gemms_on_its_own_buffers(block, shape):
    # Check that replay_fn holds exactly the block's GEMM calls (the expected (M, N, K) list),
    # reading the block's own weights and accumulating into its own weight gradients, and
    # that running it writes there again (buffer contents differ from the block's by then:
    # the block's backward reuses forward buffers in place, so only the calls are the same).
    module = cases.build_module(block, shape, np.float64)
    x, _, dy = cases.make_data(block, shape, np.float64)
    fwd_bwd = cases.fwd_bwd_fn(module, x, dy)
    with floors.record_gemms() as seen:
        floor = floors.replay_fn(fwd_bwd)
    gemms = floors.gemm_list(block, shape)
    assert len(floor.calls) == len(seen) == len(gemms)
    assert floors.same_gemms(seen, gemms)
    # scipy's argument order: (alpha, a, b, beta, c, trans_a, trans_b, overwrite_c)
    operands = [arr for _, args in floor.calls for arr in (args[1], args[2])]
    outputs = [(args[4], args[3]) for _, args in floor.calls]
    for p in module.parameters():
        if p.data.ndim == 2:
            assert any(np.shares_memory(p.data, a) for a in operands), p.name
            assert any(np.shares_memory(p.grad, c) and beta == 1.0 for c, beta in outputs), p.name
    module.zero_grad()
    fwd_bwd()
    once = {p.name: p.grad.copy() for p in module.parameters() if p.data.ndim == 2}
    floor()
    for p in module.parameters():
        if p.name in once:
            assert np.isfinite(p.grad).all() and not np.array_equal(p.grad, once[p.name]), p.name


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


# ----------------------------------------------------------------------------- interference
def _sample(wall_ms, own_ms=0.0, busy_ms=0.0, steal_ms=0.0, wait_ms=0.0):
    ms = 1_000_000
    return timing.Sample(int(wall_ms * ms), int(own_ms * ms), busy_ms * ms, steal_ms * ms,
                         {"1": int(wait_ms * ms), "2": 0})


def _probe_on():
    p = timing.CpuProbe()
    p.available = True  # the rule itself, whatever /proc offers here
    return p


def test_disturbed_rule_on_made_up_samples():
    # Check that a sample is dropped for run-queue wait above 50 us + 2% of its wall time,
    # for any steal, and for machine busy time beyond our CPU time above the tick margin.
    p = _probe_on()
    a = _sample(0)
    assert p.disturbed(a, _sample(100, own_ms=190, busy_ms=190, wait_ms=1.9)) is None
    assert p.disturbed(a, _sample(100, own_ms=190, busy_ms=190, wait_ms=2.1)) == "wait"
    assert p.disturbed(a, _sample(1, wait_ms=0.04)) is None
    assert p.disturbed(a, _sample(1, wait_ms=0.08)) == "wait"
    assert p.disturbed(a, _sample(100, own_ms=100, busy_ms=100, steal_ms=10)) == "steal"
    margin = timing.NCPU * (2 * timing._TICK_NS + timing.OTHERS_FRACTION * 100e6) / 1e6
    assert p.disturbed(a, _sample(100, own_ms=100, busy_ms=100 + margin - 1)) is None
    assert p.disturbed(a, _sample(100, own_ms=100, busy_ms=100 + margin + 1)) == "others"


def test_disturbed_ignores_threads_seen_once():
    # Check that a thread present in only one of the two samples adds no wait.
    p = _probe_on()
    a = timing.Sample(0, 0, 0.0, 0.0, {"1": 0})
    b = timing.Sample(10**8, 0, 0.0, 0.0, {"1": 0, "9": 10**9})
    assert p.disturbed(a, b) is None
    p.available = False
    assert p.disturbed(a, _sample(100, wait_ms=50)) is None


def test_clean_median_drops_disturbed_and_falls_back():
    # Check that the median is over the undisturbed samples, and over all (flagged) when
    # fewer than MIN_CLEAN are undisturbed.
    c = timing.clean_median([1.0, 2.0, 3.0, 50.0, 60.0], [None, None, None, "wait", "steal"])
    assert (c.value, c.kept, c.total, c.fallback) == (2.0, 3, 5, False)
    assert c.why == {"wait": 1, "steal": 1}
    c = timing.clean_median([1.0, 50.0, 60.0], [None, "wait", "wait"])
    assert (c.value, c.kept, c.fallback) == (50.0, 1, True)
    info = c.info("x")
    assert info["x_kept"] == [1, 3] and info["x_fallback"] is True
    assert info["x_disturbed"] == ["", "wait", "wait"]


@pytest.mark.skipif(not timing.CpuProbe().available, reason="no /proc schedstat here")
def test_probe_sees_a_real_disturbance():
    # Check that the wait signal is read from the right field: with one spinning process per
    # CPU next to our own spinning thread, our thread waits for a core and the sample is
    # dropped (a quiet machine is not required: more load only adds wait); and that settle()
    # does not mistake that machine for a quiet one (it waits its full time).
    hogs = [subprocess.Popen([sys.executable, "-c", "while True: pass"])
            for _ in range(timing.NCPU)]
    try:
        time.sleep(0.1)
        p = timing.CpuProbe()
        a = p.sample()
        t0 = time.perf_counter()
        while time.perf_counter() - t0 < 0.3:
            pass
        b = p.sample()
        waited = timing.settle(0.3)
    finally:
        for h in hogs:
            h.kill()
            h.wait()
    wait = sum(b.waits[t] - a.waits[t] for t in b.waits if t in a.waits)
    assert wait > 0.02 * (b.wall - a.wall)
    assert p.disturbed(a, b) is not None
    assert waited >= 0.3


# ----------------------------------------------------------------------------- profile
def test_profiler_time_is_exclusive(monkeypatch):
    # Check that a timed call inside another is counted once: the outer label gets its own
    # time only (fake clock: outer 0..10, inner 1..3).
    ticks = iter([0.0, 1.0, 3.0, 10.0])
    monkeypatch.setattr(step_profile.time, "perf_counter", lambda: next(ticks))
    prof = step_profile.Profiler()
    inner = prof.wrap("inner", lambda: None)
    prof.call("outer", inner)
    assert prof.acc == {"outer": 8.0, "inner": 2.0}
    assert prof.calls == {"outer": 1, "inner": 1}


def test_profile_of_a_tiny_sublayer_step(monkeypatch):
    # Check that the profile counts the block's real kernel calls (the floor's 6 GEMMs, one
    # layernorm each way), that the parts add up to the instrumented step, and that every
    # alias is the engine's own again afterwards.
    import engine.blocks as blocks
    before = {a: getattr(blocks, a) for _, al in step_profile.KERNEL_PARTS for m, a in al
              if m == "engine.blocks" and hasattr(blocks, a)}
    monkeypatch.setitem(cases.SHAPES, "tiny", TINY)
    r = step_profile.profile_case("FFNSublayer-post-gelu", "tiny", reps=2)
    assert r["calls"]["GEMMs"] == len(floors.gemm_list("FFNSublayer-post-gelu", TINY))
    assert r["calls"]["layernorm fwd"] == 1 and r["calls"]["layernorm bwd"] == 1
    assert r["calls"]["gMLP gating fwd+bwd"] == 0
    assert all(v is not None and v >= 0 for v in r["parts"].values())
    assert r["kept"][1] >= 2 and r["floor"] > 0 and r["step"] > 0
    assert sum(r["parts"].values()) == pytest.approx(r["step_instrumented"], rel=0.2)
    assert {a: getattr(blocks, a) for a in before} == before


def test_profile_says_na_for_a_missing_alias(monkeypatch):
    # Check that an alias the engine no longer has is reported as n/a, not a crash.
    monkeypatch.setitem(cases.SHAPES, "tiny", TINY)
    monkeypatch.setattr(step_profile, "KERNEL_PARTS",
                        step_profile.KERNEL_PARTS + [("fused thing", [("engine.blocks", "_nope")])])
    r = step_profile.profile_case("FFN-relu", "tiny", reps=1)
    assert r["parts"]["fused thing"] is None
    assert r["parts"]["GEMMs"] is not None
    text = run.format_profile([r])
    assert "fused thing" in text and "n/a" in text


def _fake_profile(block, floor, parts):
    full = {label: 0.0 for label in step_profile.fwd_bwd_parts()}
    full.update({label: 0.001 for label in step_profile.WHOLE})
    full.update(parts)
    fb = sum(v for k, v in full.items() if k not in step_profile.WHOLE)
    return dict(block=block, shape="large", threads=2, floor=floor, step=fb + 0.004,
                step_instrumented=fb + 0.004, fwd_bwd=fb, parts=full,
                calls={label: 1 for label, _ in step_profile.KERNEL_PARTS}, kept=[5, 6],
                fallback=False, dropped={"wait": 1})


def test_report_profile_and_misses(tmp_path):
    # Check that the report prints the PROFILE table and, for a missed target, the excess
    # in ms and the largest non-GEMM part; a fallback median is starred with its note.
    _write_fake(tmp_path)
    prof = [_fake_profile("FFN-relu", 0.010, {"GEMMs": 0.010, "act fwd (bias+act)": 0.0015})]
    (tmp_path / "profile.json").write_text(json.dumps(prof))
    text, data = run.report(tmp_path)
    assert "PROFILE" in text and "act fwd (bias+act)" in text and " 15.0%" in text
    assert "WHERE THE TIME GOES" in text
    miss = text[text.index("WHERE THE TIME GOES"):]
    # fwd+bwd 1.10 vs 1.08 on a 10 ms floor: 0.2 ms over; act fwd is the largest extra part
    assert "fwd+bwd/floor FFN-relu large (2 thr)" in miss and "0.2 ms" in miss
    assert "act fwd (bias+act) 1.5" in miss
    assert data["profile"] == prof
    assert "*" not in text.split("TARGETS")[1].split("WHERE")[0]
    raw = json.loads((tmp_path / "threads2.json").read_text())
    for b in raw["benchmarks"]:
        if b["extra_info"].get("kind") == "step":
            b["extra_info"].update(paired_ratio=1.3, paired_ratio_kept=[1, 9],
                                   paired_ratio_fallback=True)
    (tmp_path / "threads2.json").write_text(json.dumps(raw))
    text, data = run.report(tmp_path)
    assert "1.30*" in text and run.NOISY_NOTE in text
    assert "1/9" in text
    assert any("paired_ratio" in f for f in data["noise"]["fallbacks"])

"""The bench harness cannot silently rot: the report math on fake results, a tiny real run of
the driver, the floors against the GEMMs the blocks really make, the naive reference
against the engine step, the memory pass, the bandwidth kernels, the interference filter
(its decision rule on made-up samples, its signal on a real disturbance) and the step
profile. No timing assertions."""
from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

from types import SimpleNamespace

import numpy as np
import pytest

from kernels import ops
from kernels.instrument import record

ROOT = Path(__file__).resolve().parents[2]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from bench import bandwidth, cases, floors, memory, report, run, step_profile, timing  # noqa: E402

# A small shape with every dimension distinct, so a transposed GEMM cannot pass for another.
TINY = cases.Shape("tiny", (3, 5), d_model=12, d_ff=20)
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
        # triad 4e9 bytes in 0.1 s = 40 GB/s; AdamW 28e6 bytes in 1 ms = 28 GB/s = 0.7 of it
        b.append(_bench(dict(kernel=bandwidth.TRIAD_ROW, size="3 x 128 MiB", impl="fast",
                             threads=thr, bytes=4e9), 0.1))
        b.append(_bench(dict(kernel=bandwidth.ADAMW_COLD_ROW, size="2.1M", impl="fast",
                             threads=thr, bytes=28e6), 0.001))
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
    floor = floors.replay_fn(fwd_bwd)
    gemms = floors.gemm_list(block, shape)
    assert len(floor.calls) == len(gemms)
    assert floors.same_gemms([floors.gemm_mnk(args) for args in floor.calls], gemms)
    # kernels.ops.gemm's argument order: (out, a, b, trans_a, trans_b, alpha, beta)
    full = [floors.gemm_args(args) for args in floor.calls]
    operands = [arr for args in full for arr in (args[1], args[2])]
    outputs = [(args[0], args[6]) for args in full]
    for name, p in module.named_parameters():
        if p.data.ndim == 2:
            assert any(np.shares_memory(p.data, a) for a in operands), name
            assert any(np.shares_memory(p.grad, c) and beta == 1.0 for c, beta in outputs), name
    module.zero_grad()
    fwd_bwd()
    once = {n: p.grad.copy() for n, p in module.named_parameters() if p.data.ndim == 2}
    floor()
    for name, p in module.named_parameters():
        if name in once:
            assert np.isfinite(p.grad).all() and not np.array_equal(p.grad, once[name]), name


@pytest.mark.parametrize("block,shape", TINY_CASES, ids=[b for b, _ in TINY_CASES])
def test_replayed_floor_restore_puts_back_every_output(block, shape):
    # Check that restore() copies back every array the replay writes, as the recorded call
    # left it, so that a floor timed alone, restored before each call, never runs on values
    # that replays compounded (GMLP's dZ buffer feeds a forward GEMM, the sublayer's ds is
    # read and accumulated into); after many restored calls all stays finite.
    module = cases.build_module(block, shape)
    x, _, dy = cases.make_data(block, shape)
    floor = floors.replay_fn(cases.fwd_bwd_fn(module, x, dy))
    outs = {id(args[0]): args[0] for args in floor.calls}
    recorded = {k: out.copy() for k, out in outs.items()}
    for _ in range(3):
        floor()
    floor.restore()
    for k, out in outs.items():
        np.testing.assert_array_equal(out, recorded[k])
    with np.errstate(over="ignore", invalid="ignore"):
        for _ in range(300):
            floor.restore()
            floor()
    assert all(np.isfinite(out).all() for out in outs.values())


def test_paired_ratio_runs_setup_before_each_call():
    # Check that paired_ratio's setup runs right before every call of either side.
    log = []
    timing.paired_ratio(lambda: log.append("fn"), lambda: log.append("ref"), 1e-3,
                        setup=lambda: log.append("setup"))
    calls = [i for i, x in enumerate(log) if x != "setup"]
    assert len(calls) >= 2 * timing.MIN_PAIRS
    assert all(log[i - 1] == "setup" for i in calls)


def test_paired_scaling_switches_threads_between_calls_and_restores_them():
    # Check that paired_scaling calls fn alternately at one thread and at ``threads`` (the
    # order flipping every pair; the BLAS pools and the elementwise setting both switched),
    # each timed call after an untimed one at the same count (lead-in) or right after the
    # switch (no lead-in), and that the count is ``threads`` after.
    import kernels
    from kernels import threads as kthreads
    before = kernels.get_num_threads()
    for lead_in, per_pair in ((True, 4), (False, 2)):
        seen = []

        def fn():
            seen.append((kernels.get_num_threads(), kthreads.elementwise_threads()))
        try:
            kernels.set_num_threads(2)
            m = timing.paired_scaling(fn, 2, 1e-3, lead_in=lead_in)
            assert kernels.get_num_threads() == 2 and kthreads.elementwise_threads() == 2
        finally:
            kernels.set_num_threads(before)
        assert m.total >= timing.MIN_PAIRS and len(seen) == per_pair * m.total
        one, two = [(1, 1)] * (per_pair // 2), [(2, 2)] * (per_pair // 2)
        pairs = [seen[i:i + per_pair] for i in range(0, len(seen), per_pair)]
        assert pairs[0] == one + two and pairs[1] == two + one, lead_in
        assert all(p in (one + two, two + one) for p in pairs)


def test_replayed_floor_calls_the_kernel_not_a_recorder():
    # Check that the replay runs the real kernels.ops.gemm: a recording around it sees no
    # call (a replay bound to the recorder of its own recording would append to a finished
    # Recording, and time the recorder's overhead as floor).
    module = cases.build_module("FFN-relu", TINY, np.float64)
    x, _, dy = cases.make_data("FFN-relu", TINY, np.float64)
    floor = floors.replay_fn(cases.fwd_bwd_fn(module, x, dy))
    with record(["gemm"]) as rec:
        floor()
    assert rec.calls == []


def test_record_gemms_sees_each_gemm_once():
    # Check that record_gemms lists the (M, N, K) of the ops.gemm calls made inside it, in
    # order, whether the call passes every argument or relies on the defaults.
    a, b = np.ones((4, 3)), np.ones((4, 5))
    out, out2 = np.empty((3, 5)), np.empty((4, 4))
    with floors.record_gemms() as seen:
        ops.gemm(out, a, b, True, False, 1.0, 0.0)
        ops.gemm(out, a, b, True, False, 1.0, 1.0)
        ops.gemm(out2, a, a, False, True)
    assert seen == [(3, 5, 4), (3, 5, 4), (4, 4, 3)]
    np.testing.assert_array_equal(out, 8.0)


@pytest.mark.parametrize("block,shape", TINY_CASES, ids=[b for b, _ in TINY_CASES])
def test_naive_step_equals_engine_step(block, shape):
    # Check that the naive baseline does the same training step as the engine (float64).
    f64 = np.float64
    module = cases.build_module(block, shape, dtype=f64)
    twin = cases.naive_twin(block, module)
    x, target, _ = cases.make_data(block, shape, dtype=f64)
    loss, opt = cases.make_loss(block), cases.make_optimizer(module)
    step = cases.step_fn(module, x, target, loss, opt)
    for _ in range(3):
        step()
        twin.step(x, target)
    ours = {name: p.data for name, p in module.named_parameters()}
    assert set(ours) == set(twin.params)
    for name in ours:
        np.testing.assert_allclose(twin.params[name], ours[name], rtol=1e-9, atol=1e-12,
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
    margin = timing.NCPU * (2 * timing.TICK_NS + timing.OTHERS_FRACTION * 100e6) / 1e6
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


@pytest.mark.skipif(not timing.CpuProbe().available, reason="no /proc schedstat here")
def test_probe_leaves_out_the_polling_pool_and_lane_threads():
    # Check that the wait signal does not read blasnet's pool threads and lane thread (they
    # poll between tasks: runnable, and waiting, whenever our other threads hold their
    # cores), and does read the calling thread.
    import threading

    import kernels
    from kernels import gemm_unchecked, overlap, parallel
    parallel.split(lambda i, j, s: None, 8, k=2)
    if overlap.available():
        a = np.ones((4, 4))
        with kernels.num_threads(2), overlap.session():
            gemm_unchecked(np.empty((4, 4)), a, a, False, False, 1.0, 0.0, True)
    ours = parallel.pool_thread_ids() | overlap.lane_thread_ids()
    assert ours
    p = timing.CpuProbe()
    read = {int(t) for t in p._tasks}
    assert not (ours & read)
    assert threading.get_native_id() in read


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


# ----------------------------------------------------------------------------- bandwidth
def test_triad_and_update_compute_what_they_say():
    # Check that the triad writes a = b + 3c and the update a += 3c then a -= 3c (the sign
    # alternates so that timed calls keep a bounded), on every element of an odd-sized array
    # split over the blocks, and that their byte counts are 4 and 3 arrays.
    n = 3 * bandwidth.TRIAD_BLOCK + 7
    tri = bandwidth.triad_fn(n, np.float64)
    a, b, c = tri.arrays
    rng = np.random.default_rng(0)
    b[:], c[:] = rng.standard_normal(n), rng.standard_normal(n)
    tri()
    # one rounding (a fused multiply-add) where NumPy rounds twice: an ulp of the operands
    np.testing.assert_allclose(a, b + 3.0 * c, rtol=1e-15, atol=1e-15)
    assert tri.bytes == 4 * n * 8
    upd = bandwidth.update_fn(n, np.float32)
    a, c = upd.arrays
    c[:] = rng.standard_normal(n)
    upd()
    np.testing.assert_allclose(a, 3.0 * c, rtol=1e-6)
    upd()
    np.testing.assert_allclose(a, 0.0, atol=1e-5)
    assert upd.bytes == 3 * n * 4


def test_triad_arrays_are_larger_than_the_last_level_cache():
    # Check that the default triad array is at least 4x the last-level cache the OS reports
    # (else the triad would time the cache, not memory), and AdamW's byte count is 7 arrays.
    llc = bandwidth.llc_bytes()
    assert llc > 0
    assert bandwidth.triad_elements(np.float32) * 4 >= 4 * llc
    assert bandwidth.adamw_bytes(2_099_712) == 7 * 4 * 2_099_712


class _FakeBenchmark:
    """pytest-benchmark's pedantic() as run_benchmark uses it: setup, the call, teardown."""

    def __init__(self):
        self.extra_info, self.stats = {}, None

    def pedantic(self, fn, rounds, iterations, warmup_rounds, setup, teardown):
        data = []
        for _ in range(rounds):
            setup()
            t0 = time.perf_counter()
            fn()
            data.append(time.perf_counter() - t0)
            teardown()
        self.stats = SimpleNamespace(stats=SimpleNamespace(data=data))


def test_run_benchmark_runs_setup_before_every_timed_call():
    # Check that with setup= every call of fn (warm-up and timed rounds) comes right after a
    # setup call, and that extra info (bytes) reaches extra_info.
    log = []
    bench = _FakeBenchmark()
    timing.run_benchmark(bench, lambda: log.append("fn"), setup=lambda: log.append("setup"),
                         kernel="k", bytes=123)
    assert log.count("fn") >= timing.MIN_ROUNDS
    assert all(log[i - 1] == "setup" for i, x in enumerate(log) if x == "fn")
    assert bench.extra_info["bytes"] == 123 and bench.extra_info["median_clean"] > 0


def test_report_bandwidth_rows_and_target(tmp_path):
    # Check that GB/s = bytes / median, that AdamW's is reported as a fraction of the triad's
    # at the same thread count, and that the fraction is a target (0.7 < 0.8: missed) whose
    # miss says how fast AdamW would have to be.
    _write_fake(tmp_path)
    text, data = run.report(tmp_path)
    k = {(r["kernel"], r["threads"]): r for r in data["kernels"]}
    assert k[(bandwidth.TRIAD_ROW, 2)]["gbs"] == pytest.approx(40.0)
    cold = k[(bandwidth.ADAMW_COLD_ROW, 2)]
    assert cold["gbs"] == pytest.approx(28.0) and cold["of_triad"] == pytest.approx(0.7)
    assert k[("adamw_update_many", 2)]["gbs"] is None
    (t,) = [t for t in data["targets"] if t["kind"] == "adamw_bw"]
    assert t["measured"] == pytest.approx(0.7) and t["limit"] == 0.8 and t["met"] is False
    assert "GB/s" in text and "of triad" in text
    miss = text[text.index("WHERE THE TIME GOES"):]
    assert "<= 0.88 ms" in miss  # 28e6 bytes at 0.8 x 40 GB/s


# ----------------------------------------------------------------------------- profile
class _FakeModule:
    """forward: one gemm; backward: one colsum; the loss and optimizer call kernels too (they
    are whole calls, not parts)."""

    def __init__(self):
        self.a, self.out = np.ones((2, 2)), np.empty((2, 2))

    def forward(self, x):
        return ops.gemm(self.out, self.a, self.a, False, False, 1.0, 0.0)

    def backward(self, dy):
        return ops.colsum(np.zeros(2), dy, 1.0)

    def zero_grad(self):
        pass


def test_instrumented_step_parts_are_forward_and_backward_kernels():
    # Check that the instrumented step counts, as parts, the kernels forward and backward
    # call (one gemm, one colsum) and not those of the loss or optimizer (whole calls); that
    # the optimizer is called as fit calls it, step(zero_grad=True), with no separate
    # zero_grad part; and that the kernels.ops calls are counted per phase (loss forward 1,
    # optimizer 2, loss backward none).
    m = _FakeModule()
    out = np.empty((2, 2))
    loss = SimpleNamespace(forward=lambda y, t: ops.gemm(out, m.a, m.a, False, False, 1.0, 0.0),
                           backward=lambda: np.ones((2, 2)))
    seen = []

    def step(zero_grad=False):
        seen.append(zero_grad)
        ops.gemm(out, m.a, m.a, False, False, 1.0, 0.0)
        ops.colsum(np.zeros(2), out, 1.0)
    case = dict(module=m, x=np.ones((2, 2)), target=None, loss=loss,
                opt=SimpleNamespace(step=step))
    wall, phase, kernel_s, kernel_n, ops_n, per_el = step_profile.instrumented_step(case)()
    assert kernel_n == {"gemm": 1, "colsum": 1}
    # Elements per step of every non-GEMM kernel of the whole step (optimizer's included):
    # colsum twice (backward, optimizer), each over the (2, 2) output.
    assert {k: n for k, (_, n) in per_el.items()} == {"colsum": 8}
    assert set(phase) == {"forward", "backward", "loss fwd", "loss bwd",
                          "optimizer step (+zero_grad)"}
    assert seen == [True]
    assert ops_n == {"forward": 1, "backward": 1, "loss fwd": 1, "loss bwd": 0,
                     "optimizer step (+zero_grad)": 2}
    assert sum(phase.values()) <= wall


def test_profile_of_a_tiny_sublayer_step(monkeypatch):
    # Check that the profile counts the block's real kernel calls (the floor's 6 GEMMs, one
    # layernorm each way, no gating), that the parts add up to the instrumented step, and
    # that every kernels.ops entry is the real kernel again afterwards.
    before = {n: getattr(ops, n) for n in ops.NAMES}
    monkeypatch.setitem(cases.SHAPES, "tiny", TINY)
    r = step_profile.profile_case("FFNSublayer-post-gelu", "tiny", reps=2)
    assert r["calls"]["gemm"] == len(floors.gemm_list("FFNSublayer-post-gelu", TINY))
    assert r["calls"]["layernorm_forward"] == 1 and r["calls"]["layernorm_backward"] == 1
    assert "gate_forward" not in r["calls"]
    assert list(r["parts"])[0] == "gemm"
    assert "zero_grad" not in r["parts"] and r["calls"]["optimizer step (+zero_grad)"] == 1
    assert all(v is not None and v >= 0 for v in r["parts"].values())
    assert r["kept"][1] >= 2 and r["floor"] > 0 and r["step"] > 0
    # The parts are disjoint pieces of each instrumented step (timed per round, so a
    # disturbed round cannot fail it, unlike a comparison of medians).
    assert r["gaps"][0] >= 0.0
    assert set(step_profile.WHOLE) <= set(r["parts"]) and step_profile.OTHER in r["parts"]
    assert {n: getattr(ops, n) for n in ops.NAMES} == before


def _fake_profile(block, floor, parts, calls=None):
    full = {label: 0.001 for label in step_profile.WHOLE}
    full.update(parts)
    full.setdefault(step_profile.OTHER, 0.0)
    fb = sum(v for k, v in full.items() if k not in step_profile.WHOLE)
    return dict(block=block, shape="large", threads=2, floor=floor, step=fb + 0.004,
                step_instrumented=fb + 0.004, fwd_bwd=fb, parts=full,
                calls=calls or {k: 1 for k in parts if k != step_profile.OTHER},
                kept=[5, 6], fallback=False, dropped={"wait": 1})


def test_profile_table_has_one_row_per_kernel_called():
    # Check that the PROFILE table has a row per kernel any block called, gemm first with
    # its call counts, and '-' where a block does not call that kernel.
    prof = [_fake_profile("FFN-relu", 0.010, {"gemm": 0.010, "bias_act": 0.001},
                          {"gemm": 6, "bias_act": 1}),
            _fake_profile("GMLP", 0.020, {"gemm": 0.020, "gate_forward": 0.002},
                          {"gemm": 9, "gate_forward": 1})]
    text = report.format_profile(prof)
    rows = {line.split("  ")[0]: line for line in text.splitlines()}
    assert "gemm (calls: 6/9)" in rows
    assert list(rows).index("gemm (calls: 6/9)") < list(rows).index("bias_act")
    assert rows["bias_act"].split()[-1] == "-" and rows["gate_forward"].split()[1] == "-"
    assert "10.0%" in rows["gate_forward"]  # 2 ms of a 20 ms floor


def test_report_profile_and_misses(tmp_path):
    # Check that the report prints the PROFILE table and, for a missed target, the excess
    # in ms and the largest non-GEMM part; a fallback median is starred with its note.
    _write_fake(tmp_path)
    prof = [_fake_profile("FFN-relu", 0.010, {"gemm": 0.010, "bias_act": 0.0015})]
    (tmp_path / "profile.json").write_text(json.dumps(prof))
    text, data = run.report(tmp_path)
    assert "PROFILE" in text and "bias_act" in text and " 15.0%" in text
    assert "WHERE THE TIME GOES" in text
    miss = text[text.index("WHERE THE TIME GOES"):]
    # fwd+bwd 1.10 vs 1.08 on a 10 ms floor: 0.2 ms over; bias_act is the largest extra part
    assert "fwd+bwd/floor FFN-relu large (2 thr)" in miss and "0.2 ms" in miss
    assert "bias_act 1.5" in miss
    assert data["profile"] == prof
    assert "*" not in text.split("TARGETS")[1].split("WHERE")[0]
    raw = json.loads((tmp_path / "threads2.json").read_text())
    for b in raw["benchmarks"]:
        if b["extra_info"].get("kind") == "step":
            b["extra_info"].update(paired_ratio=1.3, paired_ratio_kept=[1, 9],
                                   paired_ratio_fallback=True)
    (tmp_path / "threads2.json").write_text(json.dumps(raw))
    text, data = run.report(tmp_path)
    assert "1.30*" in text and report.NOISY_NOTE in text
    assert "1/9" in text
    assert any("paired_ratio" in f for f in data["noise"]["fallbacks"])

"""bench/run.py's report at the small shapes, on made-up results: the step targets, the
1 -> 2 threads check of every case, the small-shape profile tables, and where a missed
small-shape target's time goes; and that `make bench` runs the small-shape profiles.
No timings."""
from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from bench import cases, report, run, step_profile, targets  # noqa: E402

OPT = step_profile.OPTIMIZER


def _bench(extra, median):
    return {"extra_info": extra, "stats": {"median": median, "rounds": 5}}


def _write(tmp_path, steps, floor_ms=1.0, paired=None):
    """threads<N>.json with a floor and a step row per (block, shape, threads) in ``steps``
    (step ms); ``paired``: {(block, shape): step/floor paired ratio} at 2 threads."""
    by_thr: dict = {}
    for (block, shape, thr), ms in steps.items():
        for kind, t in (("floor", floor_ms), ("step", ms)):
            extra = dict(block=block, shape=shape, kind=kind, flops=1e6, n_gemms=6, rows=8,
                         threads=thr)
            if kind == "step" and paired and thr == 2 and (block, shape) in paired:
                extra["paired_ratio"] = paired[(block, shape)]
            by_thr.setdefault(thr, []).append(_bench(extra, t / 1e3))
    for thr, b in by_thr.items():
        (tmp_path / f"threads{thr}.json").write_text(json.dumps({"benchmarks": b}))


def _targets(data):
    return {t["target"]: t for t in data["targets"]}


def test_small_shape_step_targets_have_the_issues_limits(tmp_path):
    # Check the step/floor limits at 2 threads: 1.5 at seed001 and 2.0 at seed000 for every
    # transformer block (GatedFFN-silu as FFN-gelu), 1.5 for the MLP at batch64 and 1.15 for
    # make run's gMLP; verdicts follow from the paired ratios.
    paired = {("FFN-relu", "seed000"): 1.9, ("FFN-relu", "seed001"): 1.6,
              ("GatedFFN-silu", "seed000"): 2.1, ("GatedFFN-silu", "seed001"): 1.4,
              ("MLP", "batch64"): 1.45, ("GMLP", "run"): 1.2}
    steps = {(b, s, t): 1.0 for (b, s) in paired for t in (1, 2)}
    _write(tmp_path, steps, paired=paired)
    _, data = run.report(tmp_path)
    t = _targets(data)
    want = {("FFN-relu", "seed000"): (2.0, True), ("FFN-relu", "seed001"): (1.5, False),
            ("GatedFFN-silu", "seed000"): (2.0, False), ("GatedFFN-silu", "seed001"): (1.5, True),
            ("MLP", "batch64"): (1.5, True), ("GMLP", "run"): (1.15, False)}
    for (block, shape), (limit, met) in want.items():
        c = t[f"step/floor {block} {shape} (2 thr)"]
        assert (c["limit"], c["op"], c["met"]) == (limit, "<=", met), (block, shape)
        assert c["measured"] == pytest.approx(paired[(block, shape)])
    for block in ("FFN-gelu", "GMLP", "FFNSublayer-post-gelu", "GatedFFN-silu"):
        assert targets.STEP_SMALL_LIMIT[block] == {"seed000": 2.0, "seed001": 1.5}


def test_every_case_checks_that_two_threads_are_not_slower(tmp_path):
    # Check that each case gets time @1 / time @2, checked against >= 1: the paired
    # scaling of its 2-thread process where it has one, at any shape (MLP batch64: 1.05
    # paired wins over 0.8 / 1.0 from the medians, which stays beside it), else the two runs'
    # medians (0.5 / 0.55 for FFN-gelu seed000 is a miss); cases lacking a thread count and
    # pairs get no ratio.
    steps = {("FFN-gelu", "seed000", 1): 0.5, ("FFN-gelu", "seed000", 2): 0.55,
             ("GMLP", "run", 1): 8.0, ("GMLP", "run", 2): 5.0,
             ("MLP", "batch64", 1): 0.8, ("MLP", "batch64", 2): 1.0,
             ("GMLP", "seed001", 2): 1.0,
             ("FFN-relu", "large", 1): 240.0, ("FFN-relu", "large", 2): 120.0}
    _write(tmp_path, steps)
    raw = json.loads((tmp_path / "threads2.json").read_text())
    scaled = {("FFN-relu", "large"): 1.8, ("MLP", "batch64"): 1.05}
    for b in raw["benchmarks"]:
        e = b["extra_info"]
        if e["kind"] == "step" and (e["block"], e["shape"]) in scaled:
            e.update(paired_scaling=scaled[e["block"], e["shape"]], paired_scaling_kept=[9, 10])
    (tmp_path / "threads2.json").write_text(json.dumps(raw))
    text, data = run.report(tmp_path)
    ratios = {(r["block"], r["shape"]): r for r in data["thread_ratios"]}
    assert set(ratios) == {("FFN-gelu", "seed000"), ("GMLP", "run"), ("MLP", "batch64"),
                           ("FFN-relu", "large")}
    assert ratios[("FFN-gelu", "seed000")]["ratio"] == pytest.approx(0.5 / 0.55)
    assert ratios[("FFN-gelu", "seed000")]["source"] == "medians"
    assert ratios[("GMLP", "run")]["ratio"] == pytest.approx(1.6)
    assert ratios[("FFN-relu", "large")]["ratio"] == pytest.approx(1.8)
    assert ratios[("FFN-relu", "large")]["source"] == "paired"
    mlp = ratios[("MLP", "batch64")]
    assert (mlp["ratio"], mlp["source"], mlp["pairs"]) == (pytest.approx(1.05), "paired", [9, 10])
    assert mlp["ratio_medians"] == pytest.approx(0.8)
    t = _targets(data)
    miss = t["step 1->2 thr, time @1 / @2 FFN-gelu seed000"]
    assert miss["met"] is False and miss["op"] == ">=" and miss["limit"] == 1.0
    assert t["step 1->2 thr, time @1 / @2 GMLP run"]["met"] is True
    assert t["step 1->2 thr, time @1 / @2 MLP batch64"]["met"] is True
    assert "1 -> 2 THREADS" in text
    rows = {s.split()[0]: s.split() for s in text.split("1 -> 2 THREADS")[1].splitlines()
            if s.startswith(("FFN-gelu", "MLP"))}
    assert rows["FFN-gelu"][4:] == ["0.91", "medians", "0.91"]
    assert rows["MLP"][4:] == ["1.05", "paired", "0.80"]


def _profile(block, shape, threads, floor, parts, calls, ops_total=20):
    full = dict(parts)
    fb = sum(v for k, v in full.items() if k not in step_profile.WHOLE)
    step = sum(full.values())
    return dict(block=block, shape=shape, threads=threads, floor=floor, step=0.9 * step,
                step_instrumented=step, fwd_bwd=fb, parts=full, calls=calls,
                ops_calls={}, ops_calls_total=ops_total, kept=[30, 31], fallback=False,
                dropped={})


def _small_profiles():
    us = 1e-6
    parts = {"gemm": 300 * us, "bias_act": 30 * us, step_profile.OTHER: 20 * us,
             "loss fwd": 15 * us, "loss bwd": 5 * us, OPT: 130 * us}
    calls = {"gemm": 6, "bias_act": 1, "loss fwd": 1, "loss bwd": 1, OPT: 1}
    gm = dict(parts, gate_forward=50 * us)
    gm_calls = dict(calls, gemm=9, gate_forward=1)
    return [_profile("FFN-gelu", "seed000", 1, 290 * us, parts, calls, 13),
            _profile("GMLP", "seed000", 1, 290 * us, gm, gm_calls, 15),
            _profile("FFN-gelu", "seed000", 2, 200 * us, dict(parts, gemm=400 * us), calls, 13),
            _profile("GMLP", "run", 2, 4000 * us, dict(gm, gemm=4100 * us), gm_calls, 15)]


def test_small_profile_tables_give_calls_per_call_per_step_and_share():
    # Check one table per (shape, threads), one column group per block, and per part: calls
    # per step, µs per call (= µs per step / calls), µs per step and % of the instrumented
    # step; the total kernels.ops calls per step; '-' where a block lacks a kernel.
    text = report.format_small_profiles(_small_profiles())
    heads = [s for s in text.splitlines() if s.endswith(":") and "thread" in s]
    assert [h.split(" =")[0] for h in heads] == ["seed000", "seed000", "run"]
    assert "1 thread:" in heads[0] and "2 threads:" in heads[1]
    first = text.split(heads[0])[1].split(heads[1])[0]
    assert "FFN-gelu" in first.splitlines()[1] and "GMLP" in first.splitlines()[1]
    gemm = next(s for s in first.splitlines() if s.startswith("gemm")).split()
    # FFN-gelu: 6 calls, 300 us -> 50.0 us/call, share 300/500 = 60%; GMLP: 9 calls, 550 us
    assert gemm[1:5] == ["6", "50.0", "300.0", "60"]
    assert gemm[5:9] == ["9", "33.3", "300.0", "55"]
    gate = next(s for s in first.splitlines() if s.startswith("gate_forward")).split()
    assert gate[1:5] == ["-", "-", "-", "-"] and gate[5:9] == ["1", "50.0", "50.0", "9"]
    opt = next(s for s in first.splitlines() if s.startswith(OPT)).split()
    assert opt[-4:] == ["1", "130.0", "130.0", "24"]
    ops = next(s for s in first.splitlines() if s.startswith("kernels.ops calls")).split()
    assert ops[-2:] == ["13", "15"]
    assert "zero_grad\n" not in text and "\nzero_grad " not in text


def test_missed_small_target_shows_its_profile(tmp_path):
    # Check that a missed small-shape step target says where the time goes from the profile
    # of that block, shape and thread count, in µs; and a missed 1 -> 2 threads check names
    # the parts that take longer at 2 threads.
    steps = {("FFN-gelu", "seed000", 1): 0.5, ("FFN-gelu", "seed000", 2): 0.6}
    _write(tmp_path, steps, floor_ms=0.2, paired={("FFN-gelu", "seed000"): 3.0})
    prof = _small_profiles()
    for t in (1, 2):
        (tmp_path / f"profile_small{t}.json").write_text(
            json.dumps([p for p in prof if p["threads"] == t]))
    text, data = run.report(tmp_path)
    assert "PROFILE of the full step at the small shapes" in text
    miss = text[text.index("WHERE THE TIME GOES"):].replace("\n  ", " ")
    step_line = next(s for s in miss.splitlines()
                     if s.startswith("- step/floor FFN-gelu seed000"))
    # 3.0 vs 2.0 on a 200 us floor: 200 us over; beyond the floor, the optimizer's 130 us
    # is the largest part; the block's GEMMs take 400 - 200 = 200 us more than the floor
    assert "= 200 µs" in step_line and "optimizer step (+zero_grad) 130" in step_line
    assert "+200 µs vs the floor" in step_line
    thr_line = next(s for s in miss.splitlines() if s.startswith("- step 1->2 thr"))
    assert "gemm +100 µs" in thr_line  # 400 us at 2 threads vs 300 at 1
    assert len(data["profile_small"]) == 4


def test_bench_driver_runs_a_small_shape_profile_per_thread_count(tmp_path, monkeypatch):
    # Check that bench/run.py (what `make bench` runs) starts the large-shape profile at the
    # most threads and one small-shape profile process per thread count, and that -k skips
    # them and removes stale small-shape profiles.
    seen = []
    monkeypatch.setattr(run, "run_pytest", lambda *a, **k: 0)
    monkeypatch.setattr(run, "run_memory", lambda *a, **k: 0)

    def fake_profile(out_json, threads, quick, echo=print, options=(), label="profile"):
        seen.append((Path(out_json).name, threads, list(options)))
        return 0
    monkeypatch.setattr(run, "run_profile", fake_profile)
    assert run.main(["--threads", "1,2", "--results", str(tmp_path)]) == 0
    assert seen == [("profile.json", 2, []), ("profile_small1.json", 1, ["--small"]),
                    ("profile_small2.json", 2, ["--small"])]
    (tmp_path / "profile_small1.json").write_text("[]")
    seen.clear()
    assert run.main(["--threads", "1,2", "--results", str(tmp_path), "-k", "GMLP"]) == 0
    assert seen == [] and not (tmp_path / "profile_small1.json").exists()


def test_step_profile_small_selection_is_the_small_cases():
    # Check that --small profiles seed000 and seed001 for the transformer blocks, the MLP at
    # batch64 and the gMLP at make run's shape, and that an unknown shape or a block with no
    # case at the shape is an error naming it.
    got = step_profile.selected(step_profile.SMALL_SHAPES)
    want = [(b, s) for s in ("seed000", "seed001") for b in cases.TRANSFORMER_BLOCKS]
    want += [("MLP", "batch64"), ("GMLP", "run")]
    assert got == want
    with pytest.raises(ValueError, match="huge"):
        step_profile.selected(["huge"])
    with pytest.raises(ValueError, match="MLP"):
        step_profile.selected(["seed000"], ["MLP"])


def test_small_profile_counts_every_kernel_call_of_the_step(monkeypatch):
    # Check that the profile's kernels.ops calls per step are those one plain step makes
    # (recorded here around cases.step_fn's step), split over the phases, and that each
    # part's calls per step match: the forward + backward kernels, 1 per whole call.
    import numpy as np
    from kernels.instrument import record
    tiny = cases.Shape("tiny", (6,), d_model=12, d_ff=20)
    monkeypatch.setitem(cases.SHAPES, "tiny", tiny)
    p = step_profile.profile_case("GMLP", "tiny", reps=2)
    c = cases.build_case("GMLP", tiny, np.float32)
    c["step"]()
    with record() as rec:
        c["step"]()
    assert p["ops_calls_total"] == len(rec.calls) == sum(p["ops_calls"].values())
    assert p["ops_calls"][OPT] == len(rec.of("adamw")) == 1
    assert p["calls"]["gemm"] == len(rec.of("gemm")) == 9
    assert all(p["calls"][k] == 1 for k in step_profile.WHOLE)


def test_cost_table_gives_ns_per_element_beside_the_numpy_chain():
    # Check that WHERE THE TIME GOES per element lists each kernel's median ns per element
    # over the profiled cases per thread count, with the NumPy chain's baseline beside it
    # (bench/baselines.py), and nothing when no profile has per-element figures.
    from bench import baselines
    profs = [dict(block="A", shape="s", threads=1, ns_per_element={"adamw": 0.2, "add": 0.1},
                  elements={"adamw": 1000, "add": 64}),
             dict(block="B", shape="s", threads=1, ns_per_element={"adamw": 0.4},
                  elements={"adamw": 3000})]
    text = report.format_costs(profs)
    row = next(line for line in text.splitlines() if line.startswith("adamw"))
    assert "0.300 [0.200-0.400]" in row
    assert f"{baselines.ns_per_element('adamw', 1):.3f}" in row
    assert "1,000-3,000" in row
    assert report.format_costs([dict(block="A", shape="s", threads=1)]) == ""


def test_cost_table_gives_each_activation_its_own_row_and_chain():
    # Check that the activation kernels' rows carry the activation (and "+db"), sorted after
    # their kernel's place, each beside its own activation's chain at 1 thread and none at 2
    # (the chains were measured at 1 thread only).
    from bench import baselines
    ns = {"bias_act gelu": 0.6, "bias_act relu": 0.1, "act_backward_cached +db": 0.2,
          "adamw": 0.3}
    profs = [dict(block="A", shape="s", threads=t, ns_per_element=ns,
                  elements=dict.fromkeys(ns, 640)) for t in (1, 2)]
    lines = report.format_costs(profs).splitlines()
    rows = {k: ln for ln in lines for k in ns if ln.startswith(k + "  ")}  # in line order
    assert list(rows) == ["bias_act gelu", "bias_act relu", "act_backward_cached +db", "adamw"]
    for key in ("bias_act gelu", "bias_act relu", "act_backward_cached +db"):
        chain = baselines.ACTIVATION_NS_1THREAD[key]
        cells = rows[key].split()
        assert f"{chain:.3f}" in cells and cells.count("-") == 1, rows[key]
    assert baselines.ACTIVATION_NS_1THREAD["bias_act gelu"] != \
        baselines.ACTIVATION_NS_1THREAD["bias_act relu"]
    assert baselines.ns_per_element("bias_act gelu", 2) is None


@pytest.mark.parametrize("block, want", [
    ("FFN-relu", {"bias_act relu", "act_backward relu +db"}),
    ("FFN-gelu", {"bias_act gelu", "act_backward_cached +db"}),
    ("GatedFFN-silu", {"glu_forward silu"})])
def test_profile_keys_activation_kernels_by_activation_and_bias_gradient(block, want):
    # Check on a real step that the per-element rows name the activation each call ran and
    # whether it summed the bias gradient, and that every such row of these blocks but the
    # GLU's has a NumPy chain to stand beside.
    import numpy as np
    from bench import baselines
    tiny = cases.Shape("tiny", (6,), d_model=12, d_ff=20)
    c = cases.build_case(block, tiny, np.float32)
    rows = set(step_profile.instrumented_step(c)()[5])
    assert want <= rows
    assert not rows & {"bias_act", "act_backward", "act_backward_cached", "glu_forward"}
    for key in want - {"glu_forward silu"}:
        assert baselines.ns_per_element(key, 1) is not None, key

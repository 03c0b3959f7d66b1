"""bench/spread.py, the run-to-run spread of the small steps: its summary math on made-up
process results, its case selection, one tiny real run, and `make bench` running it. No
timing assertions."""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from bench import cases, spread  # noqa: E402


def _process(threads, medians_ms, fallback=False, floors_ms=None):
    """A child's result; with ``floors_ms`` ({case: floor ms}) each case has its GEMM floor
    and step / floor (as a real child writes them), without it neither (older results)."""
    def case(b, s, ms):
        c = dict(block=b, shape=s, median=ms / 1e3, kept=[9, 10], fallback=fallback, dropped={})
        if floors_ms is not None:
            c.update(floor=floors_ms[b, s] / 1e3, ratio=ms / floors_ms[b, s])
        return c
    return dict(threads=threads, pid=1, settle_s=0.1,
                cases=[case(b, s, ms) for (b, s), ms in medians_ms.items()])


def test_summary_is_min_median_max_and_spread_of_the_process_medians():
    # Check that per case and thread count the summary holds every process's median, their
    # min / median / max and (max - min) / median, in cases.CASES order, threads ascending.
    a, b = ("GMLP", "run"), ("FFN-relu", "seed000")
    results = [_process(2, {a: 5.0, b: 0.30}), _process(1, {a: 8.0, b: 0.50}),
               _process(2, {a: 6.0, b: 0.31}), _process(1, {a: 8.4, b: 0.52}),
               _process(2, {a: 5.5, b: 0.29})]
    rows = spread.summarize(results)
    assert [(r["block"], r["shape"], r["threads"]) for r in rows] == [
        ("FFN-relu", "seed000", 1), ("FFN-relu", "seed000", 2), ("GMLP", "run", 1),
        ("GMLP", "run", 2)]
    g2 = rows[3]
    assert g2["medians"] == pytest.approx([5e-3, 6e-3, 5.5e-3])
    assert (g2["min"], g2["median"], g2["max"]) == pytest.approx((5e-3, 5.5e-3, 6e-3))
    assert g2["spread"] == pytest.approx(1.0 / 5.5)
    assert rows[0]["spread"] == pytest.approx(0.02 / 0.51)
    assert not any(r["noisy"] for r in rows)
    assert g2["floor"] is None and g2["ratio"] is None  # results without a floor


def test_summary_and_report_give_the_floor_and_ratio_spreads():
    # Check the spreads of the GEMM floor and of step / floor timed in the same processes: a
    # process slow on both (the second: step 6.0, floor 4.8) widens the step's and the
    # floor's spread but not the ratio's, and the report's second count takes a step spread
    # within its floor's.
    a = ("GMLP", "run")
    results = [_process(2, {a: 5.0}, floors_ms={a: 4.0}),
               _process(2, {a: 6.0}, floors_ms={a: 4.8}),
               _process(2, {a: 5.1}, floors_ms={a: 4.0})]
    (row,) = spread.summarize(results)
    assert row["spread"] == pytest.approx(1.0 / 5.1)
    assert row["floor"]["medians"] == pytest.approx([4e-3, 4.8e-3, 4e-3])
    assert row["floor"]["spread"] == pytest.approx(0.8 / 4.0)
    assert row["ratio"]["medians"] == pytest.approx([1.25, 1.25, 1.275])
    assert row["ratio"]["spread"] == pytest.approx(0.025 / 1.25)
    text = spread.format_report([row], 3, False)
    (line,) = [s for s in text.splitlines() if s.startswith("GMLP")]
    assert line.split()[6:11] == ["19.6%", "MISSED", "20.0%", "2.0%", "5.000"]
    assert "0/1 within 15%." in text
    assert "1/1 within 15% or within the spread of their own GEMM floor." in text


def test_report_marks_spreads_over_the_target():
    # Check the verdict against the 15% target (1/5.5 = 18.2% missed, 0.02/0.30 = 6.7%
    # met), the count of cases within it, and a star on a spread that used a fallback median.
    a, b = ("GMLP", "run"), ("FFN-relu", "seed000")
    results = [_process(2, {a: 5.0, b: 0.30}), _process(2, {a: 6.0, b: 0.31}, fallback=True),
               _process(2, {a: 5.5, b: 0.29})]
    text = spread.format_report(spread.summarize(results), 3, False)
    lines = {s.split()[0]: s for s in text.splitlines() if s.startswith(("GMLP", "FFN-relu"))}
    assert "18.2%*" in lines["GMLP"] and "MISSED" in lines["GMLP"]
    assert "6.7%*" in lines["FFN-relu"] and " met" in lines["FFN-relu"]
    assert "1/2 within 15%." in text
    assert "5.000 6.000 5.500" in lines["GMLP"]  # each process's median, in run order


def test_default_cases_are_every_case_but_the_large_shape():
    # Check that the spread covers every bench case but the large shape (make run's gMLP
    # included), and that --case must name a bench case.
    got = spread.parse_cases(None)
    assert got == [c for c in cases.CASES if c[1] != "large"]
    assert ("GMLP", "run") in got and ("MLP", "batch64") in got
    assert spread.parse_cases(["GMLP:run"]) == [("GMLP", "run")]
    with pytest.raises(ValueError, match="GMLP:large2"):
        spread.parse_cases(["GMLP:large2"])


def test_tiny_real_run_writes_every_process(tmp_path):
    # Check that a real (quick) run launches one fresh process per run and thread count, each
    # at the thread count asked for, and writes their medians and the summary.
    out = tmp_path / "spread.json"
    env = {k: v for k, v in os.environ.items() if k != "BLASNET_NUM_THREADS"}
    r = subprocess.run([sys.executable, str(ROOT / "bench" / "spread.py"), "--quick", "--runs",
                        "2", "--threads", "1", "--case", "FFN-relu:seed000", "--out", str(out)],
                       cwd=ROOT, env=env, capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-2000:]
    data = json.loads(out.read_text())
    procs = data["processes"]
    assert [p["threads"] for p in procs] == [1, 1] and procs[0]["pid"] != procs[1]["pid"]
    assert all(len(p["cases"]) == 1 and p["cases"][0]["median"] > 0 for p in procs)
    for p in procs:  # the floor timed in the same pairs (no assertion on times)
        c = p["cases"][0]
        assert c["floor"] > 0 and c["ratio"] > 0
    (row,) = data["summary"]
    assert (row["block"], row["shape"], row["threads"]) == ("FFN-relu", "seed000", 1)
    assert row["floor"] is not None and row["ratio"] is not None
    assert "RUN-TO-RUN SPREAD" in r.stdout and "FFN-relu" in r.stdout


def test_make_bench_runs_the_spread():
    # Check that `make bench` runs bench/spread.py after bench/run.py, with --quick under
    # QUICK=1 (make -n: commands printed, not run).
    for quick, flag in (([], ""), (["QUICK=1"], " --quick")):
        r = subprocess.run(["make", "-n", "bench", *quick], cwd=ROOT, capture_output=True,
                           text=True, timeout=60)
        if r.returncode != 0:
            pytest.skip(f"make -n failed here: {r.stderr[-300:]}")
        lines = [s.strip() for s in r.stdout.splitlines()]
        runs = [i for i, s in enumerate(lines) if "bench/run.py" in s]
        spreads = [i for i, s in enumerate(lines) if "bench/spread.py" in s]
        assert len(spreads) == 1 and runs and spreads[0] > runs[0]
        assert lines[spreads[0]].endswith("bench/spread.py" + flag)

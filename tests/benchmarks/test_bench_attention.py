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
    # finite ratio per case (two MHA shapes in the real run, one here, and the GPT step).
    out = tmp_path / "attention.json"
    env = dict(os.environ, BLASNET_BENCH_QUICK="1")
    r = subprocess.run([sys.executable, str(ROOT / "bench" / "attention.py"), "--tiny",
                        "--threads", "1", "--out", str(out)], cwd=ROOT, env=env,
                       capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    rows = json.loads(out.read_text())["rows"]
    assert [r["case"].split()[0] for r in rows] == ["MHA", "GPT"]
    assert all(math.isfinite(r["ratio"]) and r["ratio"] > 0 for r in rows)


def test_mha_floor_is_the_modules_own_gemms():
    # Check that the floor replays as many GEMMs as the registry lists for the module.
    fn, floor, flops = attention.mha_case((2, 8, 12, 3))
    with floors.record_gemms() as seen:
        fn()
    assert len(floor.calls) == len(seen) == 6 + 6 * 2 * 3
    assert flops > 0

"""`make bench` says which BLAS kernel produced its numbers: the header, machine.json and
summary.json carry kernels.blas_kernel's facts, and the bench keeps the OpenBLAS variables it is
given. Fake facts and stubbed runs: no timings, nothing depends on this machine's kernel."""
from __future__ import annotations

import json
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from bench import cases, run  # noqa: E402
from kernels import blas_kernel as bk  # noqa: E402

PINNED_LIB = {"user_api": "blas", "internal_api": "openblas", "version": "0.3.30",
              "architecture": "Haswell", "num_threads": 2, "owner": "scipy",
              "filepath": "/x/scipy.libs/libscipy_openblas.so"}
AVX512 = {"AVX2": True, "FMA3": True, "AVX": True, "AVX512_SKX": True}
PIN = {"OPENBLAS_CORETYPE": "Haswell", "OPENBLAS_L2_SIZE": "512"}


def _fake_facts(measure=True, report=None):
    report = bk.assess([PINNED_LIB], AVX512, PIN)
    cost = bk.PinCost((1024, 512, 1024), 2, 200.0, 380.0, "SkylakeX", 3)
    out = report.to_dict()
    out["message"] = bk.pin_message(report, cost)
    out["pin_cost"] = {"pinned_gfs": 200.0, "native_gfs": 380.0}
    out.update(numba="0.0-test", jit_disabled=False, NUMBA_DISABLE_JIT=None)
    return out


def test_child_env_keeps_the_openblas_kernel_variables(monkeypatch):
    # Check that bench children inherit OPENBLAS_CORETYPE and OPENBLAS_L2_SIZE as given (the
    # bench measures the kernel its caller chose) while their thread count is the bench's own.
    monkeypatch.setenv("OPENBLAS_CORETYPE", "Haswell")
    monkeypatch.setenv("OPENBLAS_L2_SIZE", "512")
    monkeypatch.setenv("OPENBLAS_NUM_THREADS", "7")
    env = cases.child_env(2, quick=False)
    assert env["OPENBLAS_CORETYPE"] == "Haswell" and env["OPENBLAS_L2_SIZE"] == "512"
    assert "OPENBLAS_NUM_THREADS" not in env and env["BLASNET_NUM_THREADS"] == "2"


def test_bench_header_and_json_record_the_kernel(tmp_path, monkeypatch, capsys):
    # Check that bench/run.py prints the kernel line and the pin line before the runs, stores
    # the facts in machine.json and summary.json, and --report-only prints them again.
    monkeypatch.setattr(run, "run_pytest", lambda *a, **k: 0)
    monkeypatch.setattr(run, "run_memory", lambda *a, **k: 0)
    monkeypatch.setattr(run, "run_profile", lambda *a, **k: 0)
    monkeypatch.setattr(bk, "facts", _fake_facts)
    assert run.main(["--threads", "1,2", "--results", str(tmp_path)]) == 0
    out = capsys.readouterr().out
    head = out.split("\n\n")[0]  # the header, before the report
    assert "BLAS kernel: scipy openblas 0.3.30 runs Haswell (AVX2) on 2 threads" in head
    assert "verdict pinned_below_native" in head
    assert "note: OpenBLAS runs Haswell (AVX2) kernels, pinned by OPENBLAS_CORETYPE" in head
    machine = json.loads((tmp_path / "machine.json").read_text())
    assert machine["blas"]["verdict"] == "pinned_below_native"
    assert machine["blas"]["pin_cost"]["native_gfs"] == 380.0
    summary = json.loads((tmp_path / "summary.json").read_text())
    assert summary["machine"]["blas"]["env"] == PIN
    assert run.main(["--report-only", "--results", str(tmp_path)]) == 0
    again = capsys.readouterr().out
    assert "verdict pinned_below_native" in again and "380 GF/s SkylakeX" in again

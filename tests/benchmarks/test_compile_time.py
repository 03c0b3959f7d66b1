"""bench/compile_time.py: the JIT cost report. Its premise (a fresh NUMBA_CACHE_DIR makes a
cold compile even when the in-tree cache is filled, and a second process on it loads from it),
its dispatcher counts, and a --quick run's JSON. No timing assertions."""
from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]

PROBE = textwrap.dedent("""
    import json, sys
    sys.path.insert(0, {pkg!r})
    sys.path.insert(0, {root!r})
    import probe_kernels
    import numpy as np
    from bench import compile_time
    recorder = compile_time.compile_recorder()
    probe_kernels.add_one(np.ones(3, np.float32))
    counts = compile_time.numba_counts(packages=("probe_kernels",))
    print(json.dumps(dict(counts, **recorder.report())))
""")


def _probe(tmp_path, cache_dir):
    pkg = tmp_path / "pkg"
    pkg.mkdir(exist_ok=True)
    (pkg / "probe_kernels.py").write_text(
        "from kernels.jit import jit\n\n@jit\ndef add_one(x):\n    return x + 1\n")
    env = {k: v for k, v in os.environ.items() if k not in ("NUMBA_CACHE_DIR",
                                                            "NUMBA_DISABLE_JIT")}
    if cache_dir is not None:
        env["NUMBA_CACHE_DIR"] = str(cache_dir)
    code = PROBE.format(pkg=str(pkg), root=str(ROOT))
    r = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True,
                       timeout=300)
    assert r.returncode == 0, r.stderr
    return json.loads(r.stdout.strip().splitlines()[-1])


@pytest.mark.slow
def test_fresh_cache_dir_compiles_cold_then_loads_warm(tmp_path):
    # Check the premise of the cold/warm runs: with the in-tree cache filled (no
    # NUMBA_CACHE_DIR), a process on an empty NUMBA_CACHE_DIR still compiles (a miss, no hit,
    # one compile event), and a second one on the same directory loads the kernel (a hit, no
    # miss, no compile); and that the counts see the probe module's dispatcher with its one
    # specialisation.
    first = _probe(tmp_path, None)
    assert first["dispatchers"] == 1 and first["signatures"] == 1
    assert any(p.suffix == ".nbi" for p in (tmp_path / "pkg").rglob("*"))  # in-tree cache
    assert _probe(tmp_path, None)["cache_hits"] == 1  # which the next process uses
    cache = tmp_path / "fresh"
    cold = _probe(tmp_path, cache)
    assert (cold["cache_hits"], cold["cache_misses"]) == (0, 1)
    # numba's compile events name the kernel, first (its time includes numba's own helpers
    # that it compiles, listed after it)
    assert cold["functions_compiled"] >= 1 and cold["slowest"][0][0] == "probe_kernels.add_one"
    assert cold["compile_s"] > 0
    warm = _probe(tmp_path, cache)
    assert (warm["cache_hits"], warm["cache_misses"]) == (1, 0)
    assert warm["functions_compiled"] == 0 and warm["compile_s"] == 0


@pytest.mark.slow
def test_quick_run_writes_the_json_and_the_table(tmp_path):
    # Check a --quick run on two blocks in float32 (two with few kernels to compile cold) and
    # make run with 2 epochs: the JSON has
    # both modes with non-negative times for import, each block's first and second step and
    # the total, the make run wall times, and the table names every row.
    out = tmp_path / "compile_time.json"
    r = subprocess.run([sys.executable, "bench/compile_time.py", "--quick", "--blocks",
                        "FFN-relu", "MLP", "--dtypes", "float32", "--epochs", "2", "--out",
                        str(out)], cwd=ROOT, capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, r.stderr
    data = json.loads(out.read_text())
    assert data["quick"] is True and data["blocks"] == ["FFN-relu", "MLP"]
    assert data["blas"]["libraries"] and "numba" in data["blas"]  # which kernels ran
    for mode in ("cold", "warm"):
        d = data["steps"][mode]
        assert d["import_s"] >= 0 and d["process_s"] >= d["total_s"] >= d["import_s"]
        assert [(s["block"], s["dtype"]) for s in d["steps"]] == [("FFN-relu", "float32"),
                                                                 ("MLP", "float32")]
        assert all(s["first_s"] >= 0 and s["steady_s"] >= 0 for s in d["steps"])
        assert set(d["numba"]) >= {"dispatchers", "signatures", "cache_hits", "cache_misses",
                                   "compile_s", "functions_compiled", "slowest"}
        assert d["numba"]["compile_s"] >= 0
    # Whatever the engine compiles, the warm process compiles none of it again.
    warm = data["steps"]["warm"]["numba"]
    assert warm["cache_misses"] == 0 and warm["functions_compiled"] == 0
    run = data["make_run"]
    assert run["epochs"] == 2 and run["cold_s"] > 0 and run["warm_s"] > 0
    for label in ("import engine", "FFN-relu float32 (tiny)", "MLP float32 (tiny)", "make run"):
        assert label in r.stdout
    again = subprocess.run([sys.executable, "bench/compile_time.py", "--report-only", "--out",
                            str(out)], cwd=ROOT, capture_output=True, text=True, timeout=60)
    assert again.returncode == 0 and "FFN-relu float32 (tiny)" in again.stdout


def test_unknown_block_is_refused(capsys):
    # Check that a block name the bench does not have is an error naming --blocks, before
    # anything runs.
    from bench import compile_time
    with pytest.raises(SystemExit) as exit_:
        compile_time.main(["--blocks", "Nope"])
    err = capsys.readouterr().err
    assert exit_.value.code == 2 and "--blocks" in err and "Nope" in err

"""kernels.precompile: the list it reads, the split over processes, and that a precompiled
kernel is what a later process loads from the disk cache instead of compiling it."""
from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import numpy as np
import pytest

from kernels import precompile

ROOT = Path(__file__).resolve().parents[2]


def test_every_line_of_the_committed_list_parses_to_numba_types():
    # Check the list that make test precompiles from: four tab-separated fields, a kernels
    # module, non-negative seconds, and argument types that read back as numba types.
    entries = precompile.read_list()
    assert len(entries) > 50
    for module, func, text, seconds in entries:
        assert module.startswith("kernels.") and func and seconds >= 0
        assert len(precompile.parse_types(text)) >= 1


def test_types_as_numba_prints_them_read_back_equal():
    # Check the round trip from a compiled kernel's signature text to its types: readonly
    # and layout flags, none, bool and scalar types included.
    from numba.core import types
    sig = (types.Array(types.float32, 2, "C", readonly=True), types.Array(types.int64, 1, "A"),
           types.none, types.boolean, types.float64, types.int64)
    assert precompile.parse_types(str(sig)) == sig
    assert precompile.parse_types(str((types.float32,))) == (types.float32,)
    with pytest.raises(ValueError):
        precompile.parse_types("(1, 2)")


def test_partition_keeps_every_entry_once_and_balances_the_seconds():
    # Check that the split over processes loses and repeats nothing, keeps the list's order
    # within a part, puts the longest compiles on different processes and each kernel's
    # versions on one.
    entries = [("m", f"k{i}", "(int64,)", s) for i, s in enumerate([5, 1, 1, 4, 1, 1, 1])]
    parts = precompile.partition(entries, 2)
    assert sorted(e for p in parts for e in p) == sorted(entries)
    assert all(p == sorted(p, key=entries.index) for p in parts)
    assert sorted(sum(e[3] for e in p) for p in parts) == [7, 7]
    assert [len(p) for p in precompile.partition(entries, 1)] == [len(entries)]
    # versions of one kernel stay together (one cache index file per kernel)
    two = [("m", "a", "(int64,)", 3), ("m", "b", "(int64,)", 2), ("m", "a", "(float64,)", 3)]
    assert [[e[1] for e in p] for p in precompile.partition(two, 2)] == [["a", "a"], ["b"]]


PROBE = textwrap.dedent("""
    import json, sys
    sys.path.insert(0, {pkg!r})
    import numpy as np
    import probe_kernels
    r = probe_kernels.add_one(np.ones(3, np.float32))
    st = probe_kernels.add_one.stats
    print(json.dumps(dict(hits=sum(st.cache_hits.values()), misses=sum(st.cache_misses.values()),
                          value=r.tolist())))
""")


def test_a_precompiled_kernel_is_loaded_not_compiled_by_the_next_process(tmp_path):
    # Check, on an empty cache directory, that precompiling a list (one live entry, one
    # renamed kernel, one stale signature) compiles the live one and skips the others, that
    # a second precompile finds it cached, and that a process then calling the kernel with
    # those argument types loads it from the cache (a hit, no miss) and computes it.
    pkg = tmp_path / "pkg"
    pkg.mkdir()
    (pkg / "probe_kernels.py").write_text(
        "from kernels.jit import jit\n\n@jit\ndef add_one(x):\n    return x + 1\n")
    listing = tmp_path / "list.txt"
    listing.write_text("# comment\n"
                       "probe_kernels\tadd_one\t(Array(float32, 1, 'C', False, aligned=True),)\t0.5\n"
                       "probe_kernels\tgone\t(int64,)\t0.1\n"
                       "probe_kernels\tadd_one\t(Nonsense(1),)\t0.1\n")
    env = {k: v for k, v in os.environ.items() if k != "NUMBA_DISABLE_JIT"}
    env.update(NUMBA_CACHE_DIR=str(tmp_path / "cache"),
               PYTHONPATH=os.pathsep.join([str(pkg), str(ROOT), env.get("PYTHONPATH", "")]))
    cmd = [sys.executable, "-m", "kernels.precompile", "--jobs", "2", "--list", str(listing)]
    first = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=300)
    assert first.returncode == 0, first.stderr
    assert "1 compiled, 0 already cached, 2 stale entries skipped" in first.stdout
    again = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=300)
    assert "0 compiled, 1 already cached, 2 stale entries skipped" in again.stdout
    r = subprocess.run([sys.executable, "-c", PROBE.format(pkg=str(pkg))], env=env,
                       capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr
    assert json.loads(r.stdout.strip().splitlines()[-1]) == dict(hits=1, misses=0,
                                                                 value=[2.0, 2.0, 2.0])


def test_bad_jobs_is_refused():
    # Check that --jobs 0 is a usage error naming the option, not a silent no-op.
    r = subprocess.run([sys.executable, "-m", "kernels.precompile", "--jobs", "0"], cwd=ROOT,
                       capture_output=True, text=True, timeout=120)
    assert r.returncode == 2 and "--jobs" in r.stderr

"""kernels.blas_kernel: reading threadpoolctl's report, NumPy's CPU features and the environment
into a verdict, with fake inputs only (no test depends on this machine's kernel); the GEMM rate
and the pinned/native measurement return positive rates (no timing assertions)."""
import subprocess
import sys
from pathlib import Path

import pytest

from kernels import blas_kernel as bk

# What NumPy reports on an AVX-512 (Skylake-X / Zen 4+) machine, an AVX2-only one and an ARM one.
AVX512 = {"SSE": True, "SSE2": True, "SSE3": True, "SSSE3": True, "SSE41": True,
          "SSE42": True, "AVX": True, "F16C": True, "FMA3": True, "AVX2": True,
          "AVX512F": True, "AVX512CD": True, "AVX512VL": True, "AVX512BW": True,
          "AVX512DQ": True, "AVX512_SKX": True, "AVX512_ICL": True}
AVX2 = {k: (v if not k.startswith("AVX512") else False) for k, v in AVX512.items()}
ARM = {"NEON": True, "NEON_FP16": True, "ASIMD": True, "ASIMDHP": True, "SVE": False}


def lib(arch, owner="scipy", api="openblas", version="0.3.30", threads=2):
    """One threadpoolctl entry as kernels.threads.blas_info returns it."""
    return {"user_api": "blas", "internal_api": api, "prefix": "libscipy_openblas",
            "filepath": f"/site-packages/{owner}.libs/libscipy_openblas.so", "version": version,
            "threading_layer": "pthreads", "architecture": arch, "num_threads": threads,
            "owner": owner}


OPENMP = {"user_api": "openmp", "internal_api": "openmp", "prefix": "libgomp",
          "filepath": "/usr/lib/libgomp.so.1", "version": None, "num_threads": 2}
PIN = {"OPENBLAS_CORETYPE": "Haswell", "OPENBLAS_L2_SIZE": "512", "HOME": "/root"}


def test_parse_keeps_blas_entries_with_their_fields():
    # Check that OpenMP entries are skipped and each BLAS entry keeps owner, version, kernel,
    # threads and the kernel's SIMD level.
    libs = bk.parse_libraries([lib("Haswell", "numpy", version="0.3.31", threads=1), OPENMP,
                               lib("SkylakeX")])
    assert [(x.owner, x.version, x.architecture, x.num_threads, x.level) for x in libs] == [
        ("numpy", "0.3.31", "Haswell", 1, "AVX2"), ("scipy", "0.3.30", "SkylakeX", 2, "AVX512")]


def test_parse_tolerates_missing_fields():
    # Check that an MKL entry (no architecture) and an entry without owner parse, level None.
    entry = {"user_api": "blas", "internal_api": "mkl", "version": "2024.1", "num_threads": 4,
             "filepath": "/lib/libmkl_rt.so"}
    (x,) = bk.parse_libraries([entry])
    assert (x.owner, x.internal_api, x.architecture, x.level) == ("?", "mkl", None, None)


@pytest.mark.parametrize("name, level", [("Haswell", "AVX2"), ("haswell", "AVX2"),
                                         ("Zen", "AVX2"), ("SkylakeX", "AVX512"),
                                         ("Cooperlake", "AVX512"), ("SapphireRapids", "AVX512"),
                                         ("Sandybridge", "AVX"), ("Nehalem", "SSE4.2"),
                                         ("Prescott", "SSE3"), ("neoversen1", None),
                                         (None, None), ("", None)])
def test_kernel_level_of_openblas_core_names(name, level):
    # Check the SIMD level read from OpenBLAS's core names (case-insensitive; others None).
    assert bk.kernel_level(name) == level


def test_cpu_level_from_numpy_features():
    # Check the best level: AVX-512 needs the whole SkylakeX set, AVX2 needs FMA3 too, an ARM
    # table or an empty one has no x86 level.
    assert bk.cpu_level(AVX512) == "AVX512"
    assert bk.cpu_level(AVX2) == "AVX2"
    only_f = dict(AVX2, AVX512F=True, AVX512CD=True)  # Knights Landing: F and CD, no BW/VL/DQ
    assert bk.cpu_level(only_f) == "AVX2"
    split = {k: v for k, v in AVX512.items() if k != "AVX512_SKX"}  # an older NumPy's table
    assert bk.cpu_level(split) == "AVX512"
    assert bk.cpu_level(dict(AVX2, FMA3=False)) == "AVX"
    assert bk.cpu_level(ARM) is None and bk.cpu_level({}) is None


def test_verdict_pinned_below_native():
    # Check that Haswell kernels on an AVX-512 CPU with OPENBLAS_CORETYPE set are "pinned below
    # native", and that the environment keeps only the OpenBLAS variables.
    r = bk.assess([lib("Haswell", "numpy"), lib("Haswell")], AVX512, PIN)
    assert r.verdict == "pinned_below_native" and r.pinned_below_native
    assert (r.cpu, r.cpu_class) == ("AVX512", "SkylakeX")
    assert r.env == {"OPENBLAS_CORETYPE": "Haswell", "OPENBLAS_L2_SIZE": "512"}
    assert [x.owner for x in r.below] == ["numpy", "scipy"]


def test_verdict_native():
    # Check that the CPU's own level is "native", with or without a variable that names it.
    assert bk.assess([lib("SkylakeX", "numpy"), lib("SkylakeX")], AVX512, {}).verdict == "native"
    pinned_same = bk.assess([lib("SkylakeX")], AVX512, {"OPENBLAS_CORETYPE": "SkylakeX"})
    assert pinned_same.verdict == "native" and not pinned_same.pinned_below_native
    assert bk.assess([lib("Zen")], AVX2, {}).verdict == "native"
    # The Haswell kernel is the best an AVX2-only CPU gets: a Haswell pin there is no loss.
    assert bk.assess([lib("Haswell")], AVX2, PIN).verdict == "native"


def test_verdict_unknown_cpu_or_kernel():
    # Check "unknown" when the CPU has no x86 level, when no OpenBLAS is loaded, and when an
    # OpenBLAS names a kernel this module does not rank; never "pinned" then.
    assert bk.assess([lib("NEOVERSEN1")], ARM, {"OPENBLAS_CORETYPE": "ARMV8"}).verdict == "unknown"
    mkl = dict(lib(None), internal_api="mkl")
    assert bk.assess([mkl], AVX512, PIN).verdict == "unknown"
    assert bk.assess([], AVX512, PIN).verdict == "unknown"
    assert bk.assess([lib("FutureLake")], AVX512, PIN).verdict == "unknown"


def test_verdict_below_cpu_without_a_pin():
    # Check that a kernel below the CPU with no OPENBLAS_CORETYPE is "below_cpu", not a pin:
    # OPENBLAS_L2_SIZE alone does not choose the kernel.
    r = bk.assess([lib("Haswell")], AVX512, {"OPENBLAS_L2_SIZE": "512"})
    assert r.verdict == "below_cpu" and not r.pinned_below_native
    assert "no variable pins it" in bk.pin_message(r)


def test_message_names_variables_and_both_rates():
    # Check the one line: the running kernel, the variables, the CPU's class, both measured
    # rates with the native kernel's name, and the command that unsets them.
    r = bk.assess([lib("Haswell", "numpy"), lib("Haswell")], AVX512, PIN)
    cost = bk.PinCost(shape=(1024, 512, 1024), threads=2, pinned_gfs=200.0, native_gfs=400.0,
                      native_architecture="SkylakeX", rounds=3)
    text = bk.pin_message(r, cost)
    assert "\n" not in text
    for part in ("Haswell (AVX2)", "OPENBLAS_CORETYPE=Haswell", "OPENBLAS_L2_SIZE=512",
                 "AVX512 (SkylakeX-class)", "200 GF/s pinned", "400 GF/s SkylakeX",
                 "2.00x", "env -u OPENBLAS_CORETYPE -u OPENBLAS_L2_SIZE"):
        assert part in text, (part, text)
    assert "GF/s" not in bk.pin_message(r)  # not measured: no rates
    assert "may mislead" not in text  # no load given: not flagged
    busy = bk.PinCost((1024, 512, 1024), 2, 200.0, 400.0, "SkylakeX", 3, load=3.5, cpus=2)
    assert busy.busy and "load 3.5 on 2 CPUs" in bk.pin_message(r, busy)
    quiet = bk.PinCost((1024, 512, 1024), 2, 200.0, 400.0, "SkylakeX", 3, load=0.3, cpus=2)
    assert not quiet.busy and "load" not in bk.pin_message(r, quiet)
    assert bk.pin_message(bk.assess([lib("SkylakeX")], AVX512, {})) is None


def test_report_to_dict_is_json_ready():
    # Check that the report serialises with the verdict flag (what the bench JSON stores).
    import json
    d = json.loads(json.dumps(bk.assess([lib("Haswell")], AVX512, PIN).to_dict()))
    assert d["verdict"] == "pinned_below_native" and d["pinned_below_native"] is True
    assert d["libraries"][0]["architecture"] == "Haswell"


def test_current_reads_this_process():
    # Check that current() lists the loaded BLAS libraries (scipy's among them) and a verdict
    # from the known set; which verdict depends on the machine and is not asserted.
    r = bk.current()
    assert any(x.owner == "scipy" for x in r.libraries)
    assert r.verdict in ("native", "pinned_below_native", "below_cpu", "unknown")


def test_gemm_rate_is_positive():
    # Check that the rate of a small sgemm is a positive finite number (no timing limits).
    rate = bk.gemm_rate((64, 32, 48), budget_s=0.01, min_calls=2)
    assert 0 < rate < float("inf")


def test_pin_cost_measures_both_kernels():
    # Check that the measurement runs the child process and returns positive rates for both
    # sides, at this process's thread count, whatever kernel each side runs.
    cost = bk.pin_cost((64, 32, 48), rounds=2, budget_s=0.01)
    assert cost.pinned_gfs > 0 and cost.native_gfs > 0 and cost.rounds == 2
    assert cost.native_architecture  # the child's threadpoolctl named its kernel
    assert cost.threads >= 1


def testnative_env_drops_only_the_openblas_variables():
    # Check that the child's environment loses the two OpenBLAS variables and keeps the rest.
    env = bk.native_env(dict(PIN, BLASNET_NUM_THREADS="2"))
    assert env == {"HOME": "/root", "BLASNET_NUM_THREADS": "2"}


def test_module_runs_as_a_script():
    # Check that `python -m kernels.blas_kernel` prints the facts as JSON and changes nothing.
    import json
    out = subprocess.run([sys.executable, "-m", "kernels.blas_kernel"], capture_output=True,
                         text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    d = json.loads(out.stdout)
    assert d["libraries"] and "numba" in d and "verdict" in d


def test_cli_info_prints_libraries_kernels_and_numba():
    # Check that `python -m engine info` runs and prints each BLAS library with its kernel and
    # threads, the CPU's SIMD line with a verdict, numba's version and the OpenBLAS variables.
    import re
    out = subprocess.run([sys.executable, "-m", "engine", "info"], capture_output=True,
                         text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    text = out.stdout
    libs = re.findall(r"^  blas +openblas +\S+ +kernel (\S+).* threads (\d+) +shipped with "
                      r"(numpy|scipy)", text, re.M)
    assert {owner for _, _, owner in libs} >= {"scipy"}, text
    assert re.search(r"^CPU SIMD .*verdict: (native|pinned_below_native|below_cpu|unknown)$",
                     text, re.M), text
    assert re.search(r"^numba +\d+\.\d+", text, re.M), text
    assert "OPENBLAS_CORETYPE=" in text and "NUMBA_DISABLE_JIT=" in text


def test_cli_info_prints_the_pin_line(monkeypatch, capsys):
    # Check that info prints the one pin line, with both measured rates, when the report says
    # pinned below native (a fake report and a fake measurement: not this machine's).
    from engine.cli import main
    report = bk.assess([lib("Haswell")], AVX512, PIN)
    cost = bk.PinCost((1024, 512, 1024), 2, 210.0, 420.0, "SkylakeX", 3)
    monkeypatch.setattr(bk, "current", lambda: report)
    monkeypatch.setattr(bk, "pin_cost", lambda: cost)
    assert main(["info"]) == 0
    notes = [line for line in capsys.readouterr().out.splitlines() if line.startswith("note:")]
    assert len(notes) == 1 and notes[0] == "note: " + bk.pin_message(report, cost)
    assert "210 GF/s pinned vs 420 GF/s SkylakeX" in notes[0]


def test_bench_kernel_table_runs_on_a_tiny_shape(tmp_path):
    # Check that `python -m bench.blas_kernels` prints a row per shape and writes its JSON
    # with positive times on both sides (whatever kernels they run).
    import json
    out = subprocess.run([sys.executable, "-m", "bench.blas_kernels", "16x8x24", "8x8x8",
                          "--rounds", "1", "--budget", "0.005", "--out", str(tmp_path / "k.json")],
                         capture_output=True, text=True, timeout=120,
                         cwd=str(Path(__file__).resolve().parents[2]))
    assert out.returncode == 0, out.stderr
    assert "16x8x24" in out.stdout and "8x8x8" in out.stdout
    rows = json.loads((tmp_path / "k.json").read_text())["rows"]
    assert [r["shape"] for r in rows] == [[16, 8, 24], [8, 8, 8]]
    assert all(r["here_us"] > 0 and r["native_us"] > 0 for r in rows)


def test_facts_keep_the_verdict_when_the_measurement_fails(monkeypatch):
    # Check that a failing native-kernel child leaves the facts whole: the verdict and the
    # pin line without rates, and the error recorded instead of raised.
    report = bk.assess([lib("Haswell")], AVX512, PIN)

    def broken(*a, **k):
        raise RuntimeError("the native-kernel child process failed: boom")
    monkeypatch.setattr(bk, "pin_cost", broken)
    d = bk.facts(measure=True, report=report)
    assert d["verdict"] == "pinned_below_native" and d["pin_cost"] is None
    assert "boom" in d["pin_cost_error"] and "GF/s" not in d["message"]
    notes = bk.header_lines(d)[1:]
    assert len(notes) == 2 and "boom" in notes[1]


def test_thread_clock_needs_one_blas_thread():
    # Check that CPU-time timing is refused at more than one BLAS thread (the other threads'
    # work would be missing) and gives positive times at one; an unknown clock is refused.
    import kernels
    with kernels.num_threads(2):
        if kernels.get_num_threads() == 2:
            with pytest.raises(ValueError, match="1 BLAS thread"):
                bk.gemm_times((16, 16, 16), 0.001, 2, clock="thread")
    with kernels.num_threads(1):
        times = bk.gemm_times((16, 16, 16), 0.001, 2, clock="thread")
    assert len(times) >= 2 and all(t >= 0 for t in times)
    with pytest.raises(ValueError, match="clock"):
        bk.gemm_times((16, 16, 16), 0.001, 2, clock="cpu")

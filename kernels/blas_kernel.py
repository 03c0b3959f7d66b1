"""Which BLAS kernel runs, what the CPU could run, and whether the environment holds it back.

OpenBLAS picks its kernels (its "core type": Haswell, SkylakeX, ...) for the CPU when it loads;
``OPENBLAS_CORETYPE`` overrides that choice and ``OPENBLAS_L2_SIZE`` its cache-size guess.
``assess`` turns threadpoolctl's report, NumPy's CPU-feature table and the environment into a
``KernelReport`` (pure: tests give it fakes); ``current`` reads this process's. ``pin_cost``
times a small sgemm on the running kernel and, in a child process with those variables unset
(OpenBLAS reads them only at load), on the kernel OpenBLAS picks by itself. Nothing here
changes the running kernel or the environment.
"""
from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

import numpy as np

__all__ = ["LEVELS", "PIN_VARS", "NOTED_VARS", "BlasLibrary", "KernelReport", "PinCost",
           "kernel_level", "cpu_level", "cpu_features", "parse_libraries", "assess", "current",
           "gemm_times", "gemm_rate", "native_env", "compare", "pin_cost", "pin_message",
           "jit_facts", "facts", "header_lines"]

# SIMD levels, lowest first; a kernel or a CPU is ranked by its index here.
LEVELS = ("SSE", "SSE2", "SSE3", "SSSE3", "SSE4.1", "SSE4.2", "AVX", "AVX2", "AVX512")
# The OpenBLAS core type that stands for each level in messages ("SkylakeX-class").
LEVEL_CLASS = {"SSE": "Katmai", "SSE2": "Northwood", "SSE3": "Prescott", "SSSE3": "Core2",
               "SSE4.1": "Penryn", "SSE4.2": "Nehalem", "AVX": "Sandybridge", "AVX2": "Haswell",
               "AVX512": "SkylakeX"}
# OpenBLAS's x86-64 core names (DYNAMIC_ARCH) -> the SIMD level of the CPUs they were written
# for, so that "kernel below CPU" means "kernels for an older CPU class than this one".
_CORE_LEVEL = {
    "katmai": "SSE", "coppermine": "SSE", "athlon": "SSE",
    "northwood": "SSE2", "banias": "SSE2", "opteron": "SSE2",
    "prescott": "SSE3", "opteron_sse3": "SSE3", "barcelona": "SSE3", "nano": "SSE3",
    "core2": "SSSE3", "atom": "SSSE3", "bobcat": "SSSE3",
    "penryn": "SSE4.1", "dunnington": "SSE4.1",
    "nehalem": "SSE4.2",
    "sandybridge": "AVX", "bulldozer": "AVX", "piledriver": "AVX", "steamroller": "AVX",
    "excavator": "AVX2", "haswell": "AVX2", "zen": "AVX2",
    "skylakex": "AVX512", "cooperlake": "AVX512", "sapphirerapids": "AVX512",
}
# NumPy feature names that establish each level (all of them must be present).
_CPU_LEVEL = (("AVX512", ("AVX512_SKX",)),  # F, CD, VL, BW, DQ: what SkylakeX kernels need
              ("AVX512", ("AVX512F", "AVX512CD", "AVX512VL", "AVX512BW", "AVX512DQ")),
              ("AVX2", ("AVX2", "FMA3")), ("AVX", ("AVX",)), ("SSE4.2", ("SSE42",)),
              ("SSE4.1", ("SSE41",)), ("SSSE3", ("SSSE3",)), ("SSE3", ("SSE3",)),
              ("SSE2", ("SSE2",)), ("SSE", ("SSE",)))
# The variable that pins OpenBLAS's kernels, and the one that changes its blocking beside it.
PIN_VARS = ("OPENBLAS_CORETYPE",)
NOTED_VARS = ("OPENBLAS_L2_SIZE",)

# The GEMM ``pin_cost`` times (m x k x n): ~1 GFLOP, a few ms per call, large enough that the
# kernel and not the call overhead sets its rate.
RATE_SHAPE = (1024, 512, 1024)


def kernel_level(architecture) -> str | None:
    """The SIMD level of an OpenBLAS core name (any case), or None if it is not an x86-64
    core OpenBLAS names (ARM, POWER, BLIS's or an unknown name)."""
    if not architecture:
        return None
    return _CORE_LEVEL.get(str(architecture).strip().lower())


def cpu_level(features) -> str | None:
    """The best SIMD level in a NumPy CPU-feature table (``{"AVX2": True, ...}``), or None when
    the table has no x86 feature (another architecture, or an empty table)."""
    have = {name for name, on in (features or {}).items() if on}
    for level, needed in _CPU_LEVEL:
        if all(name in have for name in needed):
            return level
    return None


def cpu_features() -> dict:
    """This CPU's features as NumPy detected them at import (what ``np.show_runtime`` shows)."""
    try:
        from numpy._core._multiarray_umath import __cpu_features__ as found
    except ImportError:  # NumPy 1.x
        from numpy.core._multiarray_umath import __cpu_features__ as found
    return dict(found)


def _rank(level) -> int:
    return LEVELS.index(level)


@dataclass(frozen=True)
class BlasLibrary:
    """One BLAS library threadpoolctl found: which package ships it (``owner``), its
    implementation (``internal_api``: openblas, mkl, blis, ...), version, the kernel it runs
    (``architecture``: OpenBLAS's core type, None where the library does not say), its
    threads, path, and that kernel's SIMD level (None if unknown)."""
    owner: str
    internal_api: str
    version: str | None
    architecture: str | None
    num_threads: int | None
    filepath: str
    level: str | None


def parse_libraries(info) -> tuple:
    """The BLAS entries of threadpoolctl's ``info()`` list (OpenMP entries skipped) as
    ``BlasLibrary`` records; ``owner`` is read from the entry (kernels.threads.blas_info adds
    it), "?" where absent."""
    out = []
    for entry in info or ():
        if entry.get("user_api") != "blas":
            continue
        arch = entry.get("architecture") or None
        out.append(BlasLibrary(owner=entry.get("owner") or "?",
                               internal_api=entry.get("internal_api") or "?",
                               version=entry.get("version") or None, architecture=arch,
                               num_threads=entry.get("num_threads"),
                               filepath=entry.get("filepath") or "", level=kernel_level(arch)))
    return tuple(out)


@dataclass(frozen=True)
class KernelReport:
    """What runs and what could: the BLAS libraries, the CPU's best SIMD level (``cpu``) and
    the kernel class that matches it (``cpu_class``), the OpenBLAS variables set (``env``),
    and a verdict:

    - ``"native"``: every OpenBLAS runs kernels of the CPU's level;
    - ``"pinned_below_native"``: an OpenBLAS runs kernels below it and OPENBLAS_CORETYPE is set;
    - ``"below_cpu"``: below it with no pin (a build that does not know this CPU);
    - ``"unknown"``: the CPU's level or no OpenBLAS kernel could be read."""
    libraries: tuple
    cpu: str | None
    cpu_class: str | None
    env: dict = field(default_factory=dict)
    verdict: str = "unknown"

    @property
    def pinned_below_native(self) -> bool:
        return self.verdict == "pinned_below_native"

    @property
    def below(self) -> tuple:
        """The OpenBLAS libraries whose kernel is below the CPU's level."""
        return _below(self.libraries, self.cpu)

    def to_dict(self) -> dict:
        d = asdict(self)
        d["libraries"] = [asdict(lib) for lib in self.libraries]
        d["pinned_below_native"] = self.pinned_below_native
        return d


def _below(libraries, cpu) -> tuple:
    if cpu is None:
        return ()
    return tuple(lib for lib in libraries if lib.internal_api == "openblas"
                 and lib.level is not None and _rank(lib.level) < _rank(cpu))


def assess(info, features, environ) -> KernelReport:
    """The report for threadpoolctl's ``info`` list, a NumPy CPU-feature table and an
    environment mapping (pure: reads nothing else)."""
    libraries = parse_libraries(info)
    cpu = cpu_level(features)
    env = {v: environ[v] for v in PIN_VARS + NOTED_VARS if str(environ.get(v, "")).strip()}
    openblas = [lib for lib in libraries if lib.internal_api == "openblas"]
    if _below(libraries, cpu):
        verdict = ("pinned_below_native" if any(v in env for v in PIN_VARS) else "below_cpu")
    elif cpu is None or not openblas or any(lib.level is None for lib in openblas):
        verdict = "unknown"
    else:
        verdict = "native"
    return KernelReport(libraries, cpu, LEVEL_CLASS.get(cpu), env, verdict)


def current() -> KernelReport:
    """The report for this process: its loaded libraries, its CPU, its environment."""
    from . import threads
    return assess(threads.blas_info(), cpu_features(), os.environ)


# ----------------------------------------------------------------------------- the cost
CLOCKS = {"wall": time.perf_counter, "thread": time.thread_time}


def gemm_times(shape=RATE_SHAPE, budget_s: float = 0.25, min_calls: int = 5,
               clock: str = "wall") -> list:
    """Seconds per call of ``sgemm`` on an ``(m x k) @ (k x n)`` float32 product with this
    process's BLAS and thread setting, repeated for ``budget_s`` seconds (at least
    ``min_calls``), after one untimed call (which wakes the BLAS threads). ``clock="thread"``
    counts this thread's CPU time only (time other processes held the core left out): one BLAS
    thread only, since the work of OpenBLAS's other threads would not be counted."""
    from scipy.linalg.blas import sgemm

    from . import threads
    if clock not in CLOCKS:
        raise ValueError(f"clock: expected one of {sorted(CLOCKS)}, got {clock!r}")
    if clock == "thread" and threads.get_num_threads() != 1:
        raise ValueError(f"clock='thread' needs 1 BLAS thread (the others' work is not "
                         f"counted), got {threads.get_num_threads()}")
    tick = CLOCKS[clock]
    m, k, n = shape
    rng = np.random.default_rng(0)
    a = rng.standard_normal((m, k), dtype=np.float32)
    b = rng.standard_normal((k, n), dtype=np.float32)
    c = np.zeros((m, n), np.float32)
    # c^T = b^T a^T in Fortran order: the C-ordered product without a copy.
    sgemm(1.0, b.T, a.T, 0.0, c.T, overwrite_c=1)
    times = []
    end = time.perf_counter() + budget_s
    while len(times) < min_calls or time.perf_counter() < end:
        t0 = tick()
        sgemm(1.0, b.T, a.T, 0.0, c.T, overwrite_c=1)
        times.append(tick() - t0)
    return times


def gemm_rate(shape=RATE_SHAPE, budget_s: float = 0.25, min_calls: int = 5) -> float:
    """GF/s of the fastest call of ``gemm_times``: on a shared machine the fastest call is the
    one no other process slowed down, which is what tells two kernels apart."""
    m, k, n = shape
    return 2.0 * m * k * n / min(gemm_times(shape, budget_s, min_calls)) / 1e9


def native_env(environ) -> dict:
    """``environ`` without the variables that pin OpenBLAS (what the native side runs with)."""
    return {k: v for k, v in environ.items() if k not in PIN_VARS + NOTED_VARS}


def compare(shapes, rounds: int = 3, budget_s: float = 0.25, timeout_s: float = 300.0,
            clock: str = "wall") -> dict:
    """Time sgemm at each of ``shapes`` here (the running kernel) and in one child process
    started with OPENBLAS_CORETYPE and OPENBLAS_L2_SIZE removed from its environment (the kernel
    OpenBLAS picks by itself), in ``rounds`` alternating bursts per shape (so a machine that
    slows down weighs on both sides alike), at this process's BLAS thread count, on ``clock``
    (``gemm_times``). Returns
    ``{"threads", "native_architecture", "times": {shape: {"here": [...], "native": [...]}}}``
    (seconds per call). Raises RuntimeError if the child fails."""
    from . import threads
    n = threads.get_num_threads()
    cmd = [sys.executable, "-m", "kernels.blas_kernel", "--serve", str(n)]
    env = native_env(os.environ)
    # The child imports this package from where this process found it (installed or not).
    here = str(Path(__file__).resolve().parents[1])
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [here, env.get("PYTHONPATH")]))
    child = subprocess.Popen(cmd, env=env, stdin=subprocess.PIPE,
                             stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)

    def reply():
        line = child.stdout.readline()
        if not line:
            child.kill()
            raise RuntimeError(f"the native-kernel child process failed: "
                               f"{child.stderr.read()[-2000:]}")
        return json.loads(line)
    try:
        arch = reply().get("architecture")
        times = {tuple(s): {"here": [], "native": []} for s in shapes}
        for _ in range(rounds):
            for shape, got in times.items():
                got["here"] += gemm_times(shape, budget_s, clock=clock)
                child.stdin.write(json.dumps({"shape": list(shape), "budget_s": budget_s,
                                              "clock": clock}) + "\n")
                child.stdin.flush()
                got["native"] += reply()["times"]
        child.stdin.close()
        child.wait(timeout=timeout_s)
    finally:
        if child.poll() is None:
            child.kill()
            child.wait()
    return {"threads": n, "native_architecture": arch, "times": times}


@dataclass(frozen=True)
class PinCost:
    """The measured cost of a pin: sgemm ``shape`` at ``threads`` threads, GF/s (fastest call)
    on the running (pinned) kernel and on the kernel OpenBLAS picks with the variables unset
    (``native_architecture``, as the child process's threadpoolctl reported it), over
    ``rounds`` alternating bursts of the two."""
    shape: tuple
    threads: int
    pinned_gfs: float
    native_gfs: float
    native_architecture: str | None
    rounds: int
    load: float | None = None  # the 1-minute load average before the measurement
    cpus: int | None = None

    @property
    def busy(self) -> bool:
        """Other processes were using more than half the CPUs: the rates may mislead."""
        return self.load is not None and self.load > 0.5 * (self.cpus or 1)

    @property
    def speedup(self) -> float:
        return self.native_gfs / self.pinned_gfs


def pin_cost(shape=RATE_SHAPE, rounds: int = 3, budget_s: float = 0.1) -> PinCost:
    """``compare`` at one shape, as GF/s of each side's fastest call."""
    load = os.getloadavg()[0] if hasattr(os, "getloadavg") else None
    run = compare([shape], rounds, budget_s)
    got = run["times"][tuple(shape)]
    flop = 2.0 * shape[0] * shape[1] * shape[2]
    return PinCost(tuple(shape), run["threads"], flop / min(got["here"]) / 1e9,
                   flop / min(got["native"]) / 1e9, run["native_architecture"], rounds,
                   load, os.cpu_count())


def _serve(threads_n: int) -> int:
    """The child side of ``compare``: say which kernel loaded, then time one burst per
    request line on stdin, at ``threads_n`` threads."""
    from . import threads
    threads.set_num_threads(threads_n)
    libs = parse_libraries(threads.blas_info())
    scipy_lib = next((lib for lib in libs if lib.owner == "scipy"), libs[0] if libs else None)
    print(json.dumps({"architecture": scipy_lib and scipy_lib.architecture}), flush=True)
    for line in sys.stdin:
        req = json.loads(line)
        times = gemm_times(tuple(req["shape"]), req["budget_s"], clock=req["clock"])
        print(json.dumps({"times": times}), flush=True)
    return 0


# ----------------------------------------------------------------------------- text
def _kernel_text(lib: BlasLibrary) -> str:
    return f"{lib.architecture} ({lib.level})" if lib.level else f"{lib.architecture}"


def pin_message(report: KernelReport, cost: PinCost | None = None) -> str | None:
    """One line when OpenBLAS runs below the CPU's level (None otherwise): the kernel, the
    variable that pins it, what the CPU supports and, given ``cost``, both GEMM rates."""
    below = report.below
    if not below:
        return None
    lib = next((b for b in below if b.owner == "scipy"), below[0])
    cpu = f"this CPU has {report.cpu} ({report.cpu_class}-class)"
    if not report.pinned_below_native:
        version = f" {lib.version}" if lib.version else ""
        return (f"OpenBLAS{version} runs {_kernel_text(lib)} kernels though {cpu} and no "
                f"variable pins it: this build does not know the CPU")
    pins = [f"{v}={report.env[v]}" for v in PIN_VARS if v in report.env]
    noted = [f"{v}={report.env[v]}" for v in NOTED_VARS if v in report.env]
    text = (f"OpenBLAS runs {_kernel_text(lib)} kernels, pinned by {', '.join(pins)}"
            + (f" (with {', '.join(noted)})" if noted else "") + f", though {cpu}")
    if cost is not None:
        m, k, n = cost.shape
        native = cost.native_architecture or "native"
        text += (f": sgemm {m}x{k}x{n} at {cost.threads} thread{'s' if cost.threads != 1 else ''}"
                 f" {cost.pinned_gfs:.0f} GF/s pinned vs {cost.native_gfs:.0f} GF/s {native} "
                 f"unpinned ({cost.speedup:.2f}x)")
        if cost.busy:
            text += (f" (load {cost.load:.1f} on {cost.cpus} CPUs: other processes shared the "
                     f"cores, the rates may mislead)")
    unset = " ".join(f"-u {v}" for v in PIN_VARS + NOTED_VARS if v in report.env)
    return text + f"; to run natively: env {unset} <command>"


def jit_facts() -> dict:
    """numba's version and whether NUMBA_DISABLE_JIT makes every kernel run as Python."""
    import numba

    from . import jit
    return {"numba": numba.__version__, "jit_disabled": jit.disabled(),
            "NUMBA_DISABLE_JIT": os.environ.get("NUMBA_DISABLE_JIT")}


def facts(measure: bool = True, report: KernelReport | None = None) -> dict:
    """Everything above as one JSON-ready dict (what the bench records): the report, its
    one-line message, and with ``measure`` the pin's measured cost when there is a pin (or,
    if the measurement failed, why: ``pin_cost_error``; the facts stand without it)."""
    report = report or current()
    cost = error = None
    if measure and report.pinned_below_native:
        try:
            cost = pin_cost()
        except (RuntimeError, OSError, subprocess.SubprocessError) as e:
            error = str(e)
    out = report.to_dict()
    out["message"] = pin_message(report, cost)
    out["pin_cost"] = None if cost is None else {**asdict(cost), "speedup": cost.speedup,
                                                 "busy": cost.busy}
    out["pin_cost_error"] = error
    out.update(jit_facts())
    return out


def header_lines(facts_dict: dict) -> list:
    """``facts()``'s dict (or the same read back from JSON) as the lines a benchmark report
    starts with: each BLAS library's kernel and threads, the CPU's level and the verdict,
    numba, and the pin line when there is one."""
    libs = ", ".join(
        f"{lib['owner']} {lib['internal_api']} {lib['version'] or '?'} runs "
        f"{lib['architecture'] or '?'}" + (f" ({lib['level']})" if lib.get("level") else "")
        + f" on {lib['num_threads']} threads" for lib in facts_dict.get("libraries", ()))
    cpu = facts_dict.get("cpu")
    cpu_text = f"{cpu} ({facts_dict.get('cpu_class')}-class)" if cpu else "unknown"
    jit = "JIT disabled (NUMBA_DISABLE_JIT)" if facts_dict.get("jit_disabled") else "JIT on"
    lines = [f"BLAS kernel: {libs or 'no BLAS library found'}; CPU best SIMD {cpu_text}; "
             f"verdict {facts_dict.get('verdict')}; numba {facts_dict.get('numba')}, {jit}"]
    if facts_dict.get("message"):
        lines.append(f"note: {facts_dict['message']}")
    if facts_dict.get("pin_cost_error"):
        lines.append(f"note: the native kernel's rate could not be measured: "
                     f"{facts_dict['pin_cost_error']}")
    return lines


if __name__ == "__main__":
    if len(sys.argv) == 3 and sys.argv[1] == "--serve":
        sys.exit(_serve(int(sys.argv[2])))
    print(json.dumps(facts(), indent=1))

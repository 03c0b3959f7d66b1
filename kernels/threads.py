"""Thread control for the BLAS libraries that numpy and scipy load (each ships its own OpenBLAS).

``BLASNET_NUM_THREADS`` is read once, at import, and applied through one reused
``threadpoolctl.ThreadpoolController`` (a fresh ``threadpool_limits`` would rescan the loaded
libraries on every call). An invalid value does not stop the import: it is recorded, and the
first use of the thread setting (get/set_num_threads, the elementwise pool, a GEMM) and
``check_environment()`` (called first by the command line) raise the ValueError naming it, so
nothing runs at a thread count nobody chose. ``OPENBLAS_NUM_THREADS``/``OMP_NUM_THREADS`` are read by OpenBLAS
itself when it loads, before any of this runs.

After each parallel call OpenBLAS's worker threads spin for 2^OPENBLAS_THREAD_TIMEOUT cycles
(default 2^28) before they sleep: between the GEMMs of a step they would keep the other
cores busy while blasnet's elementwise passes run there. Too short a timeout makes every
small GEMM wake its workers. So this module, imported first by ``kernels``, sets
``OPENBLAS_THREAD_TIMEOUT=18`` (2^18 cycles: longer than the gaps between small GEMMs, short
against large elementwise passes; figures in docs/performance.md, "OpenBLAS threads")
unless it is set already; it only acts if scipy's OpenBLAS is not loaded yet.
"""
from __future__ import annotations

import contextlib
import os

os.environ.setdefault("OPENBLAS_THREAD_TIMEOUT", "18")

import scipy.linalg.blas  # noqa: E402,F401  (load scipy's OpenBLAS so the controller sees it)
from threadpoolctl import ThreadpoolController  # noqa: E402

from .checks import check_int  # noqa: E402
from .warn import warn  # noqa: E402

__all__ = ["ENV_VAR", "MAX_THREADS", "check_environment", "set_num_threads", "get_num_threads", "num_threads",
           "blas_info", "elementwise_threads", "usable_cores", "explicit_threads"]

ENV_VAR = "BLASNET_NUM_THREADS"
# Above this a count is a typo, not a setting (and past 2**31 the C call itself overflows).
MAX_THREADS = 1024

_controller = ThreadpoolController()

# The message of an invalid BLASNET_NUM_THREADS read at import (None: valid or unset).
_env_error = None


def check_environment() -> None:
    """Raise the ValueError naming ``BLASNET_NUM_THREADS`` if the value read at import is not
    a positive integer; return None otherwise. Every use of the thread setting calls it."""
    if _env_error is not None:
        raise ValueError(_env_error)


def _check_count(n, what: str, high: int | None = MAX_THREADS) -> int:
    """Return ``n`` (an int, or its text: an environment variable) as an int in [1, high], or
    raise naming ``what``."""
    if isinstance(n, str):
        try:
            n = int(n.strip())
        except ValueError:
            raise ValueError(f"{what}: expected a positive integer, got {n!r}") from None
    return check_int(what, n, 1, high, what="a positive integer" +
                     ("" if high is None else f" <= {high}"))


def usable_cores() -> int:
    """The cores this process may run on (its CPU affinity where the OS reports it)."""
    try:
        return max(1, len(os.sched_getaffinity(0)))
    except (AttributeError, OSError):
        return max(1, os.cpu_count() or 1)


def _owner(path: str) -> str:
    # Both wheels name their library libscipy_openblas*; the folder tells them apart.
    return "scipy" if "scipy.libs" in path else "numpy" if "numpy.libs" in path else "other"


def _blas_libs():
    return [lib for lib in _controller.lib_controllers if lib.user_api == "blas"]


# Threads for blasnet's own row-parallel elementwise passes (kernels.parallel); follows
# every change made through this module. Set from the BLAS pools' count below.
_elementwise = 1


def elementwise_threads() -> int:
    """Threads the elementwise kernels split large arrays over (the blasnet setting)."""
    if _env_error is not None:
        check_environment()
    return _elementwise


def _apply(n: int) -> None:
    global _elementwise
    _controller.limit(limits=n)
    _elementwise = n


# ``(count, what set it)`` once a count was chosen on purpose (BLASNET_NUM_THREADS at import,
# or set_num_threads since), else None: the libraries' own count is in use.
_explicit = None


def explicit_threads():
    """``(count, source)``: the thread count last chosen on purpose and what chose it
    (``"BLASNET_NUM_THREADS"`` at import, ``"kernels.set_num_threads"`` since), or None when
    the libraries' own count is in use (engine.distributed then picks one per MPI rank)."""
    check_environment()
    return _explicit


def set_num_threads(n: int) -> None:
    """Limit every loaded BLAS (and OpenMP) thread pool, and blasnet's own elementwise
    passes, to ``n`` threads."""
    global _explicit
    check_environment()
    n = _check_count(n, "n")
    _apply(n)
    _explicit = (n, "kernels.set_num_threads")


def _scipy_openblas_calls():
    """(get, set): the C functions reading and setting the thread count of scipy's OpenBLAS
    (ctypes, ~0.2 us a call), or None where they are not found (another BLAS)."""
    for lib in _blas_libs():
        if _owner(lib.filepath) == "scipy" and lib.internal_api == "openblas":
            for prefix in ("scipy_openblas", "openblas"):
                get = getattr(lib.dynlib, f"{prefix}_get_num_threads", None)
                put = getattr(lib.dynlib, f"{prefix}_set_num_threads", None)
                if get is not None and put is not None:
                    return get, put
    return None


SCIPY_OPENBLAS_CALLS = _scipy_openblas_calls()


def get_num_threads() -> int:
    """Threads of the BLAS that the engine's GEMMs run on (scipy's OpenBLAS)."""
    check_environment()
    libs = _blas_libs()
    for lib in libs:
        if _owner(lib.filepath) == "scipy":
            return lib.num_threads
    return libs[0].num_threads if libs else 1


@contextlib.contextmanager
def num_threads(n: int):
    """Context manager: run the block with ``n`` BLAS threads, then restore every pool's
    previous limit (even if the block raises)."""
    global _elementwise
    check_environment()
    n = _check_count(n, "n")
    previous = _elementwise
    limiter = _controller.limit(limits=n)
    _elementwise = n
    try:
        yield
    finally:
        limiter.restore_original_limits()
        _elementwise = previous


def blas_info() -> list[dict]:
    """One dict per loaded BLAS/OpenMP library: ``user_api``, ``internal_api``, ``version``,
    ``num_threads``, ``filepath`` and which package ships it (``owner``)."""
    check_environment()
    out = []
    for info in _controller.info():
        out.append({**info, "owner": _owner(info.get("filepath", ""))})
    return out


_env = os.environ.get(ENV_VAR)
try:
    _n = _check_count(_env, ENV_VAR, high=None) if _env and _env.strip() else None
except ValueError as e:  # raised at the first use instead (check_environment)
    _env_error, _n = str(e), None
if _n is not None:
    if _n > usable_cores():
        # More threads than cores only makes them wait on each other: use the cores.
        warn(f"{ENV_VAR}={_env.strip()} exceeds the {usable_cores()} usable cores; "
             f"using {usable_cores()}", RuntimeWarning)  # at the user's import line
        _n = usable_cores()
    set_num_threads(_n)
    _explicit = (_n, ENV_VAR)
elif _env_error is None:
    # OpenBLAS's own count (OPENBLAS_NUM_THREADS / OMP_NUM_THREADS / the cores)
    _elementwise = max(1, get_num_threads())

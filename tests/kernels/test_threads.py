"""kernels.threads: BLASNET_NUM_THREADS, set/get, the context manager, blas_info."""
import json
import os
import subprocess
import sys

import pytest

from kernels import threads

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def _run(env_value, code):
    env = {k: v for k, v in os.environ.items()
           if k not in ("OPENBLAS_NUM_THREADS", "OMP_NUM_THREADS", threads.ENV_VAR)}
    if env_value is not None:
        env[threads.ENV_VAR] = env_value
    return subprocess.run([sys.executable, "-c", code], cwd=ROOT, env=env,
                          capture_output=True, text=True, timeout=120)


def test_env_var_one_is_honoured_in_a_fresh_process():
    # Check that BLASNET_NUM_THREADS=1 set before import limits every BLAS library to one thread.
    r = _run("1", "import json, kernels; print(json.dumps(kernels.blas_info()))")
    assert r.returncode == 0, r.stderr
    info = json.loads(r.stdout)
    blas = [lib for lib in info if lib["user_api"] == "blas"]
    assert blas, info
    assert all(lib["num_threads"] == 1 for lib in blas), info
    assert any(lib["owner"] == "scipy" for lib in blas), info


# Each use of the thread setting, run in a fresh process under a bad BLASNET_NUM_THREADS.
_USES = {
    "check_environment": "kernels.threads.check_environment()",
    "get_num_threads": "kernels.get_num_threads()",
    "set_num_threads": "kernels.set_num_threads(1)",
    "elementwise pool": "kernels.threads.elementwise_threads()",
    "gemm": "a = np.ones((3, 3), np.float32); kernels.gemm(np.empty_like(a), a, a)",
    "gemm_unchecked": "a = np.ones((3, 3), np.float32); "
                      "kernels.gemm_unchecked(np.empty_like(a), a, a)",
}


@pytest.mark.parametrize("bad", ["0", "-2", "abc", "1.5"])
def test_env_var_bad_values_are_rejected_naming_the_variable(bad):
    # Check that a bad BLASNET_NUM_THREADS lets `import kernels` through but every use of
    # the thread setting then raises a ValueError naming the variable and its value.
    lines = ["import numpy as np, kernels", "failed = []"]
    for name, call in _USES.items():
        lines += ["try:", f"    {call}", f"    failed.append({name!r})",
                  "except ValueError as e:", f"    assert {bad!r} in str(e), str(e)",
                  "    assert str(e).startswith('BLASNET_NUM_THREADS: expected'), str(e)"]
    lines.append("print(failed)")
    r = _run(bad, "\n".join(lines))
    assert r.returncode == 0, r.stderr
    assert r.stdout.strip() == "[]"  # no use ran at a thread count nobody chose


def test_check_environment_passes_a_good_value():
    # Check that check_environment() returns None when BLASNET_NUM_THREADS is a valid count.
    r = _run("1", "import kernels; print(kernels.threads.check_environment())")
    assert r.returncode == 0 and r.stdout.strip() == "None", r.stderr


def test_set_and_get_num_threads():
    # Check that set_num_threads changes what get_num_threads and blas_info report.
    before = threads.get_num_threads()
    try:
        threads.set_num_threads(1)
        assert threads.get_num_threads() == 1
        assert all(l["num_threads"] == 1 for l in threads.blas_info() if l["user_api"] == "blas")
    finally:
        threads.set_num_threads(before)
    assert threads.get_num_threads() == before


def test_context_manager_restores_previous_limit():
    # Check that num_threads(n) applies n inside the block and restores the old limit after.
    before = threads.get_num_threads()
    try:
        threads.set_num_threads(2)
        with threads.num_threads(1):
            assert threads.get_num_threads() == 1
        assert threads.get_num_threads() == 2
    finally:
        threads.set_num_threads(before)


def test_context_manager_restores_on_exception():
    # Check that the previous limit comes back even when the block raises.
    before = threads.get_num_threads()
    try:
        threads.set_num_threads(2)
        with pytest.raises(RuntimeError):
            with threads.num_threads(1):
                raise RuntimeError("boom")
        assert threads.get_num_threads() == 2
    finally:
        threads.set_num_threads(before)


@pytest.mark.parametrize("bad", [0, -2, "abc", 1.5, True, None])
def test_set_num_threads_rejects_bad_values(bad):
    # Check that non-positive or non-integer counts raise, naming the argument.
    before = threads.get_num_threads()
    with pytest.raises((ValueError, TypeError), match=r"^n: expected a positive integer"):
        threads.set_num_threads(bad)
    with pytest.raises((ValueError, TypeError), match=r"^n: expected a positive integer"):
        with threads.num_threads(bad):
            pass
    assert threads.get_num_threads() == before


def test_blas_info_lists_scipy_and_numpy_openblas():
    # Check that blas_info names the library, its owner package and its thread count.
    info = threads.blas_info()
    owners = {lib["owner"] for lib in info if lib["user_api"] == "blas"}
    assert "scipy" in owners
    for lib in info:
        assert isinstance(lib["num_threads"], int) and lib["num_threads"] >= 1
        assert "filepath" in lib and "internal_api" in lib


def _run_timeout(value, code):
    env = {k: v for k, v in os.environ.items() if k != "OPENBLAS_THREAD_TIMEOUT"}
    if value is not None:
        env["OPENBLAS_THREAD_TIMEOUT"] = value
    return subprocess.run([sys.executable, "-c", code], cwd=ROOT, env=env,
                          capture_output=True, text=True, timeout=120)


_TIMEOUT_PROBE = ("import os, sys; assert 'scipy.linalg' not in sys.modules; import kernels; "
                  "print(os.environ['OPENBLAS_THREAD_TIMEOUT'])")


def test_importing_kernels_sets_the_openblas_thread_timeout_before_scipy_loads():
    # Check that a fresh process gets OPENBLAS_THREAD_TIMEOUT=18 from `import kernels`, which is
    # what scipy's OpenBLAS reads when kernels loads it (it was not loaded before).
    r = _run_timeout(None, _TIMEOUT_PROBE)
    assert r.returncode == 0, r.stderr
    assert r.stdout.strip() == "18"


def test_a_user_openblas_thread_timeout_is_kept():
    # Check that a value the user set is not overwritten.
    r = _run_timeout("7", _TIMEOUT_PROBE)
    assert r.returncode == 0, r.stderr
    assert r.stdout.strip() == "7"

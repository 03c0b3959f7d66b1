"""kernels.jit: the compile options every kernel shares, the disk cache and its read-only
fallback, and NUMBA_DISABLE_JIT."""
import os
import shutil
import stat
import subprocess
import sys
import textwrap

import numpy as np
import pytest

from kernels import jit as J

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def test_options_keep_nan_semantics_and_release_the_gil():
    # Check that no flag lets LLVM assume away NaN/inf or reorder reductions.
    assert not J.FASTMATH & {"nnan", "ninf", "reassoc", "fast"}
    assert J.OPTIONS["nogil"] and J.OPTIONS["cache"] and J.OPTIONS["error_model"] == "numpy"


@pytest.mark.parametrize("key", ["fastmath", "error_model", "nogil", "parallel"])
def test_fixed_options_cannot_be_overridden(key):
    # Check that a kernel cannot opt out of the shared settings.
    with pytest.raises(ValueError, match=key):
        J.jit(**{key: True})


def test_a_kernel_propagates_nan_and_inf():
    # Check that the flag set keeps IEEE semantics in a compiled max and a division.
    @J.jit
    def relu_div(out, x, d):
        for i in range(x.size):
            out[i] = max(x[i], 0.0) / d

    x = np.array([np.nan, -1.0, 2.0, np.inf], np.float32)
    out = np.empty_like(x)
    relu_div(out, x, np.float32(0.0))
    assert np.isnan(out[0]) and np.isnan(out[1]) and out[2] == np.inf and out[3] == np.inf


def _kernel_source():
    return textwrap.dedent("""
        import numpy as np
        from kernels.jit import jit

        @jit
        def scale(out, x, a):
            for i in range(x.size):
                out[i] = a * x[i]

        def run():
            x = np.arange(5, dtype=np.float32)
            out = np.empty_like(x)
            scale(out, x, np.float32(3.0))
            return out
        """)


def _run(code, env_extra, cwd):
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([cwd, ROOT]), **env_extra)
    return subprocess.run([sys.executable, "-c", code], cwd=cwd, env=env,
                          capture_output=True, text=True, timeout=300)


def test_read_only_install_caches_in_the_user_cache_dir(tmp_path):
    # Check that a kernel in a read-only package compiles, runs and is cached in the
    # per-user directory instead of beside its source.
    if os.geteuid() == 0:
        pytest.skip("root writes through read-only permissions; covered by the non-root run")
    pkg = tmp_path / "ro" / "rokern"
    pkg.mkdir(parents=True)
    (pkg / "__init__.py").write_text(_kernel_source())
    os.chmod(pkg, stat.S_IRUSR | stat.S_IXUSR)
    user_cache = tmp_path / "usercache"
    try:
        code = "import rokern; print(rokern.run().tolist())"
        r = _run(code, {"NUMBA_CACHE_DIR": str(user_cache)}, str(tmp_path / "ro"))
        assert r.returncode == 0, r.stderr
        assert r.stdout.strip() == "[0.0, 3.0, 6.0, 9.0, 12.0]"
        assert any(p.suffix == ".nbi" for p in user_cache.rglob("*")), "no index in the user cache"
    finally:
        os.chmod(pkg, stat.S_IRWXU)


def test_read_only_install_as_an_unprivileged_user(tmp_path):
    # Check the same fallback where root cannot skip permission checks: run as 'nobody'.
    if os.geteuid() != 0 or shutil.which("setpriv") is None:
        pytest.skip("needs root to switch user")
    import pwd
    try:
        nobody = pwd.getpwnam("nobody")
    except KeyError:
        pytest.skip("no 'nobody' user")
    import pathlib
    import tempfile
    # pytest's tmp_path sits under a root-only folder; 'nobody' must reach this one.
    top = pathlib.Path(tempfile.mkdtemp(prefix="blasnet-ro-"))
    base = top / "ro"
    pkg = base / "rokern"
    pkg.mkdir(parents=True)
    (pkg / "__init__.py").write_text(_kernel_source())
    home = top / "home"
    home.mkdir()
    os.chown(home, nobody.pw_uid, nobody.pw_gid)
    for d in (top, base, pkg):
        os.chmod(d, 0o755)
    os.chmod(pkg / "__init__.py", 0o644)
    # Numba's user-wide cache is under $HOME/.cache/numba unless NUMBA_CACHE_DIR is set.
    env = {k: v for k, v in os.environ.items() if k != "NUMBA_CACHE_DIR"}
    env.update(HOME=str(home), PYTHONPATH=os.pathsep.join([str(base), ROOT]),
               XDG_CACHE_HOME=str(home / ".cache"), PYTHONDONTWRITEBYTECODE="1")
    code = "import rokern; print(rokern.run().tolist())"
    # The project tree and the venv must be readable by 'nobody' for this to run at all.
    try:
        r = subprocess.run(["setpriv", f"--reuid={nobody.pw_uid}", f"--regid={nobody.pw_gid}",
                            "--clear-groups", sys.executable, "-c", code], cwd=str(base),
                           env=env, capture_output=True, text=True, timeout=300)
        if r.returncode != 0 and "Permission denied" in r.stderr and "rokern" not in r.stderr:
            pytest.skip(f"the interpreter is not readable by 'nobody': {r.stderr[-200:]}")
        assert r.returncode == 0, r.stderr
        assert r.stdout.strip() == "[0.0, 3.0, 6.0, 9.0, 12.0]"
        assert not list(pkg.rglob("*.nbi")), "wrote into the read-only package"
        assert any(p.suffix == ".nbi" for p in home.rglob("*")), "no index in the user cache"
    finally:
        shutil.rmtree(top, ignore_errors=True)


def test_disable_jit_runs_the_same_kernel_as_python(tmp_path):
    # Check that NUMBA_DISABLE_JIT=1 runs the kernels as Python with the same results.
    (tmp_path / "pykern").mkdir()
    (tmp_path / "pykern" / "__init__.py").write_text(_kernel_source())
    code = textwrap.dedent("""
        import pykern, kernels.jit as J
        print(J.disabled(), type(pykern.scale).__name__, pykern.run().tolist())
        """)
    r = _run(code, {"NUMBA_DISABLE_JIT": "1"}, str(tmp_path))
    assert r.returncode == 0, r.stderr
    assert r.stdout.split(" ", 2) == ["True", "function", "[0.0, 3.0, 6.0, 9.0, 12.0]\n"]


def _write_helper_and_kernel(pkg, offset):
    pkg.mkdir(exist_ok=True)
    (pkg / "__init__.py").write_text("")
    (pkg / "helper.py").write_text(textwrap.dedent(f"""
        from kernels.jit import jit

        @jit(inline="always")
        def shift(x):
            return x + {offset}
        """))
    (pkg / "kern.py").write_text(textwrap.dedent("""
        from kernels.jit import jit
        from .helper import shift

        @jit
        def apply(x):
            return shift(x)
        """))


def test_cache_recompiles_a_kernel_after_an_edit_to_a_helper_in_another_file(tmp_path):
    # Check that the disk cache does not serve machine code built from an old version of
    # an inlined helper (numba alone keys on the kernel's own file), and still serves a
    # kernel whose sources did not change.
    pkg = tmp_path / "stalepkg"
    _write_helper_and_kernel(pkg, 1.0)
    code = ("from stalepkg.kern import apply; s = apply.stats; "
            "print(apply(1.0), sum(s.cache_hits.values()), sum(s.cache_misses.values()))")
    env = {"NUMBA_CACHE_DIR": str(tmp_path / "cache")}
    runs = []
    for offset in (None, None, 2.0):
        if offset is not None:
            (pkg / "helper.py").write_text((pkg / "helper.py").read_text().replace("1.0", "2.0"))
        r = _run(code, env, str(tmp_path))
        assert r.returncode == 0, r.stderr
        runs.append(r.stdout.split())
    assert runs[0] == ["2.0", "0", "1"]      # compiled and saved
    assert runs[1] == ["2.0", "1", "0"]      # loaded: an unchanged tree keeps its cache
    assert runs[2] == ["3.0", "0", "1"]      # the helper changed: compiled again
    data = [p.name for p in (tmp_path / "cache").rglob("*.nbc")]
    assert len(data) == 1, f"the stale entry was kept beside the new one: {data}"


def test_source_fingerprint_follows_every_python_file_of_a_folder(tmp_path):
    # Check that the fingerprint changes with a file's content, a new file and a rename,
    # and ignores files that are not Python sources.
    def fresh():
        J._fingerprints.pop(str(tmp_path), None)
        return J.source_fingerprint(str(tmp_path))

    (tmp_path / "a.py").write_text("x = 1\n")
    first = fresh()
    assert fresh() == first
    (tmp_path / "notes.txt").write_text("not a source")
    assert fresh() == first
    (tmp_path / "a.py").write_text("x = 2\n")
    second = fresh()
    assert second != first
    (tmp_path / "b.py").write_text("")
    third = fresh()
    assert third != second
    (tmp_path / "b.py").rename(tmp_path / "c.py")
    assert fresh() != third
    J._fingerprints.pop(str(tmp_path / "missing"), None)
    assert J.source_fingerprint(str(tmp_path / "missing")) == ""  # unreadable: no key part


def test_every_kernel_cache_is_keyed_on_the_kernels_sources():
    # Check that the blasnet kernels' cache stamps carry the fingerprint of kernels/ (what
    # the kernels inline from kernels.fmath and kernels.lanes lives there).
    from kernels import layernorm, optim
    here = J.source_fingerprint(os.path.join(ROOT, "kernels"))
    for kernel in (optim._adamw_range, layernorm._fwd_rows):
        stamp = kernel._cache._cache_file._source_stamp
        assert here in stamp[1], f"{kernel.py_func.__name__}: stamp {stamp!r}"

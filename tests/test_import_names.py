"""The generic top-level name ``kernels``: a package of that name shadowing blasnet's (first
on sys.path, or its files installed over ours) is an ImportError naming the file and the
fix, raised by ``import engine`` in a fresh interpreter."""
import os
import subprocess
import sys

import pytest

import engine

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(engine.__file__)))


def _import_engine(pythonpath, code="import engine"):
    # cwd: a directory without engine/ or kernels/ (-c puts the cwd first on sys.path)
    env = dict(os.environ, PYTHONPATH=str(pythonpath))
    return subprocess.run([sys.executable, "-c", code], env=env, capture_output=True,
                          text=True, timeout=120, cwd=os.path.dirname(str(pythonpath)))


@pytest.mark.slow
def test_a_kernels_package_first_on_the_path_is_named(tmp_path):
    # Check that a foreign 'kernels' earlier on sys.path stops `import engine` with an
    # ImportError naming its file, the Hugging Face clash and the fix
    fake = tmp_path / "kernels"
    fake.mkdir()
    (fake / "__init__.py").write_text('__version__ = "0.4.0"  # not blasnet\'s\n')
    r = _import_engine(tmp_path)
    assert r.returncode != 0
    last = r.stderr.strip().splitlines()[-1]
    assert last.startswith("ImportError: blasnet: 'kernels' is imported from")
    assert str(fake / "__init__.py") in last and "Hugging Face" in last
    assert "pip uninstall kernels" in last


@pytest.mark.slow
def test_foreign_files_in_kernels_own_place_are_named(tmp_path):
    # Check that a 'kernels' in blasnet's own place (beside engine) that is not blasnet's
    # (another distribution's files written over it) is refused too
    os.symlink(os.path.join(ROOT, "engine"), tmp_path / "engine")
    fake = tmp_path / "kernels"
    fake.mkdir()
    (fake / "__init__.py").write_text("from .layers import *  # not blasnet's\n")
    (fake / "layers.py").write_text("x = 1\n")
    r = _import_engine(tmp_path)
    last = r.stderr.strip().splitlines()[-1]
    assert r.returncode != 0
    assert last.startswith(f"ImportError: blasnet: 'kernels' at {fake / '__init__.py'} is not "
                           f"blasnet's (it has no set_num_threads")


@pytest.mark.slow
def test_blasnets_own_kernels_imports_cleanly(tmp_path):
    # Check that the check passes for the real layout (no false alarm), from another cwd
    r = _import_engine(ROOT, "import engine, kernels; print(kernels.__file__)")
    assert r.returncode == 0, r.stderr
    assert r.stdout.strip() == os.path.join(ROOT, "kernels", "__init__.py")


def test_a_missing_dependency_is_named_not_blamed_on_shadowing():
    # Check that blasnet's own kernels failing to import numba (not installed) gives an
    # ImportError that names numba and does not blame a shadowing 'kernels' package.
    block = ("import sys, importlib.abc\n"
             "class NoNumba(importlib.abc.MetaPathFinder):\n"
             "    def find_spec(self, name, path, target=None):\n"
             "        if name == 'numba' or name.startswith('numba.'):\n"
             "            raise ModuleNotFoundError(\"No module named 'numba'\", name='numba')\n"
             "for m in [m for m in sys.modules if m == 'numba' or m.startswith('numba.')]:\n"
             "    del sys.modules[m]\n"
             "sys.meta_path.insert(0, NoNumba())\n"
             "import engine\n")
    env = dict(os.environ, PYTHONPATH=ROOT)
    r = subprocess.run([sys.executable, "-c", block], env=env, capture_output=True, text=True,
                       timeout=120, cwd=ROOT)
    assert r.returncode != 0
    last = r.stderr.strip().splitlines()[-1]
    assert last.startswith("ImportError: blasnet: a required package is not installed: 'numba'")
    assert "shadows" not in last and "Hugging Face" not in last

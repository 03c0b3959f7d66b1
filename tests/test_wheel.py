"""The built wheel: it holds every engine and kernels sub-package, and installed into a fresh
virtual environment (no network: the wheel alone, its dependencies reused from this
environment through a .pth line) it imports, answers ``blasnet --version`` and trains an
epoch."""
import os
import site
import subprocess
import sys
import sysconfig
import zipfile
from pathlib import Path

import pytest

import engine

ROOT = Path(__file__).resolve().parents[1]


def _packages_in_tree() -> set:
    return {str(p.parent.relative_to(ROOT)).replace(os.sep, "/")
            for top in ("engine", "kernels") for p in (ROOT / top).rglob("__init__.py")
            if "__pycache__" not in p.parts}


@pytest.fixture(scope="module")
def wheel(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("wheel")
    # pip's configured index gives the build backend (setuptools) to the isolated build.
    p = subprocess.run([sys.executable, "-m", "pip", "wheel", "--no-deps", "-q", "-w", str(out),
                        str(ROOT)], capture_output=True, text=True, timeout=300)
    if p.returncode != 0:
        pytest.skip(f"cannot build a wheel here (no build backend available): {p.stderr[-300:]}")
    (whl,) = out.glob("blasnet-*.whl")
    return whl


@pytest.mark.slow
def test_wheel_holds_every_sub_package(wheel):
    # Check each package directory of the source tree is in the wheel (found, not listed).
    with zipfile.ZipFile(wheel) as z:
        inside = {n.rsplit("/", 1)[0] for n in z.namelist() if n.endswith("/__init__.py")}
    assert _packages_in_tree() <= inside, sorted(_packages_in_tree() - inside)
    assert {"engine/nn", "engine/optim", "engine/training", "engine/models",
            "engine/cli"} <= inside


@pytest.mark.slow
def test_wheel_installs_imports_and_trains(wheel, tmp_path):
    # Check a fresh venv with only the wheel installed (dependencies borrowed from this
    # environment) imports engine from the wheel, runs `blasnet --version` and a 1-epoch train.
    venv = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True,
                   timeout=120)
    py = venv / "bin" / "python"
    purelib = subprocess.run([str(py), "-c", "import sysconfig; print(sysconfig.get_paths()"
                              "['purelib'])"], capture_output=True, text=True,
                             check=True).stdout.strip()
    # A path line in a .pth file adds the directory without running that directory's own .pth
    # files, so this environment's editable install of blasnet stays out.
    deps = site.getsitepackages() + [sysconfig.get_paths()["purelib"]]
    Path(purelib, "deps.pth").write_text("\n".join(dict.fromkeys(deps)) + "\n")
    p = subprocess.run([sys.executable, "-m", "pip", "--python", str(py), "install", "-q",
                        "--no-deps", "--no-index", str(wheel)], capture_output=True, text=True,
                       timeout=300)
    assert p.returncode == 0, p.stderr
    env = dict(os.environ, BLASNET_NUM_THREADS="1")
    env.pop("PYTHONPATH", None)
    where = subprocess.run([str(py), "-c", "import engine, engine.nn, engine.training; "
                            "print(engine.__file__)"], capture_output=True, text=True, env=env,
                           cwd=tmp_path, timeout=120)
    assert where.returncode == 0, where.stderr
    assert Path(where.stdout.strip()).is_relative_to(venv), where.stdout
    script = venv / "bin" / "blasnet"
    v = subprocess.run([str(script), "--version"], capture_output=True, text=True, env=env,
                       cwd=tmp_path, timeout=120)
    assert v.returncode == 0 and v.stdout.strip() == f"blasnet {engine.__version__}", v.stderr
    t = subprocess.run([str(script), "train", "--epochs", "1"], capture_output=True, text=True,
                       env=env, cwd=tmp_path, timeout=300)
    assert t.returncode == 0, t.stderr[-2000:]
    assert "epoch" in t.stdout.lower(), t.stdout[-2000:]

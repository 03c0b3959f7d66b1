"""Packaging: the version's single source, --version, the blasnet console script, metadata,
py.typed, and the command line's behaviour on a closed pipe and a bad BLASNET_NUM_THREADS."""
import importlib.metadata as md
import importlib.resources
import os
import re
import subprocess
import sys
from pathlib import Path

import engine

ROOT = Path(__file__).resolve().parents[1]


def _pyproject_version() -> str:
    text = (ROOT / "pyproject.toml").read_text()
    return re.search(r'^version = "([^"]+)"', text, re.M).group(1)


def _env(**extra):
    env = dict(os.environ, BLASNET_NUM_THREADS="1")
    env.update(extra)
    return env


def test_version_comes_from_the_installed_metadata():
    # Check engine.__version__ == the installed distribution's version == pyproject's.
    assert engine.__version__ == md.version("blasnet") == _pyproject_version()


def test_python_m_engine_version():
    # Check `python -m engine --version` prints "blasnet <version>" and exits 0.
    p = subprocess.run([sys.executable, "-m", "engine", "--version"], capture_output=True,
                       text=True, env=_env(), cwd=ROOT, timeout=60)
    assert p.returncode == 0 and p.stdout.strip() == f"blasnet {engine.__version__}"


def test_console_script_is_the_same_command():
    # Check the installed `blasnet` script (next to this Python) answers --version and
    # train --help like `python -m engine`.
    script = Path(sys.executable).parent / "blasnet"
    assert script.exists(), "the blasnet console script is not installed"
    p = subprocess.run([str(script), "--version"], capture_output=True, text=True, env=_env(),
                       timeout=60)
    assert p.returncode == 0 and p.stdout.strip() == f"blasnet {engine.__version__}"
    h = subprocess.run([str(script), "train", "--help"], capture_output=True, text=True,
                       env=_env(), timeout=60)
    assert h.returncode == 0 and h.stdout.startswith("usage: blasnet train")


def test_metadata_has_license_authors_and_classifiers():
    # Check the distribution's metadata carries a license, authors, classifiers and the
    # optional extras plot and interop.
    meta = md.metadata("blasnet")
    assert meta.get("License-Expression") or meta.get("License")
    assert meta.get("Author") or meta.get("Author-email")
    classifiers = meta.get_all("Classifier")
    assert "Typing :: Typed" in classifiers
    assert any(c.startswith("Programming Language :: Python :: 3") for c in classifiers)
    assert {"plot", "interop", "test"} <= set(meta.get_all("Provides-Extra"))


def test_packages_are_marked_typed():
    # Check PEP 561's py.typed marker ships in both packages.
    for pkg in ("engine", "kernels"):
        assert importlib.resources.files(pkg).joinpath("py.typed").is_file(), pkg


def test_info_into_a_closed_pipe_exits_quietly():
    # Check `python -m engine info | head -1`'s situation deterministically: the reader has
    # gone before anything is written. No traceback, nothing on stderr.
    p = subprocess.Popen([sys.executable, "-m", "engine", "info"], stdout=subprocess.PIPE,
                         stderr=subprocess.PIPE, env=_env(), cwd=ROOT)
    p.stdout.close()
    err = p.stderr.read().decode()
    p.stderr.close()
    code = p.wait(timeout=60)
    assert err == "" and code == 141


def test_info_piped_to_head_prints_one_line_without_error():
    # Check the shell pipeline of docs/threads-and-kernels.md: one line out, stderr empty.
    p = subprocess.run(f"'{sys.executable}' -m engine info | head -1", shell=True,
                       capture_output=True, text=True, env=_env(), cwd=ROOT, timeout=60)
    assert p.stdout.startswith("blasnet") and p.stdout.count("\n") == 1
    assert p.stderr == ""


def test_bad_thread_variable_is_one_line_and_exit_2():
    # Check BLASNET_NUM_THREADS=abc: one line on stderr naming the variable, exit status 2.
    p = subprocess.run([sys.executable, "-m", "engine", "info"], capture_output=True,
                       text=True, env=_env(BLASNET_NUM_THREADS="abc"), cwd=ROOT, timeout=60)
    assert p.returncode == 2 and p.stdout == ""
    lines = p.stderr.strip().splitlines()
    assert len(lines) == 1 and "BLASNET_NUM_THREADS" in lines[0] and "'abc'" in lines[0]


def test_license_text_ships_with_the_distribution():
    # Check that the MIT text is in the installed distribution's files, naming the holders.
    dist = md.distribution("blasnet")
    assert dist.metadata.get("License-File") == "LICENSE"
    names = [f for f in (dist.files or []) if f.name == "LICENSE"]
    assert names, "no LICENSE among the distribution's files"
    text = names[0].locate().read_text()
    assert text.startswith("MIT License") and "the blasnet developers" in text


def test_makefile_installs_the_build_backend_pyproject_asks_for():
    # Check that the install without build isolation puts in the venv exactly the
    # build-system requirements of pyproject.toml (a newer requirement there would otherwise
    # go unmet on a fresh machine).
    text = (ROOT / "pyproject.toml").read_text()
    requires = re.search(r"^\[build-system\]\nrequires = \[([^\]]*)\]", text, re.M).group(1)
    wanted = [r.strip().strip('"') for r in requires.split(",") if r.strip()]
    makefile = (ROOT / "Makefile").read_text()
    for req in wanted:
        assert f"pip install --quiet '{req}'" in makefile, req
    assert makefile.count("--no-build-isolation") == 2

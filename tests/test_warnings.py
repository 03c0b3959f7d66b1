"""Warnings point at the user's line: the first frame outside engine/, kernels/ and the import
machinery, whatever the depth of the call inside them."""
import json
import os
import pathlib
import re
import subprocess
import sys
import warnings

import numpy as np
import pytest

from engine.data import Standardizer
from kernels.warn import warn

ROOT = pathlib.Path(__file__).resolve().parents[1]


def test_the_thread_count_warning_points_at_the_users_import_line(tmp_path):
    # Check that BLASNET_NUM_THREADS above the usable cores warns at the user's
    # `import engine` line (it used to point at kernels/__init__.py).
    script = tmp_path / "user_script.py"
    script.write_text(
        "import json, warnings\n"
        "with warnings.catch_warnings(record=True) as w:\n"
        "    warnings.simplefilter('always')\n"
        "    import engine\n"
        "print(json.dumps([[x.filename, x.lineno, x.category.__name__, str(x.message)] "
        "for x in w]))\n")
    env = {**os.environ, "BLASNET_NUM_THREADS": "9999"}
    r = subprocess.run([sys.executable, str(script)], env=env, capture_output=True, text=True,
                       cwd=tmp_path, timeout=120)
    assert r.returncode == 0, r.stderr
    got = json.loads(r.stdout)
    assert len(got) == 1, got
    filename, lineno, category, message = got[0]
    assert (filename, lineno, category) == (str(script), 4, "RuntimeWarning")
    assert "BLASNET_NUM_THREADS=9999 exceeds" in message


def test_standardizer_overflow_warns_at_the_callers_line():
    # Check that a standardised value float32 cannot hold warns (naming X) at this file's
    # line, not at a line inside engine/ (NumPy's own cast warning did).
    s = Standardizer().fit(np.array([[0.0], [1e-30]]))
    with warnings.catch_warnings(record=True) as w:
        warnings.simplefilter("always")
        line = sys._getframe().f_lineno + 1  # the next line
        out = s.transform(np.array([[1.0], [3e38]], np.float32))
    assert np.isinf(out[1, 0])
    assert [(x.filename, x.lineno, x.category) for x in w] == [(__file__, line, RuntimeWarning)]
    assert "X" in str(w[0].message) and "float32" in str(w[0].message)


def test_the_helper_skips_every_engine_and_kernels_frame():
    # Check that warn() called from this file reports this file and line, and that its
    # category and message pass through.
    with pytest.warns(UserWarning, match="hello") as w:
        line = sys._getframe().f_lineno + 1  # the next line
        warn("hello")
    assert (w[0].filename, w[0].lineno) == (__file__, line)


def test_a_warning_filter_by_module_still_applies():
    # Check that the warning is attributed to the caller's module, so a filter naming it
    # (as `-W ignore::UserWarning:mymodule` would) catches it.
    with warnings.catch_warnings(record=True) as w:
        warnings.simplefilter("always")
        warnings.filterwarnings("ignore", category=UserWarning, module=re.escape(__name__))
        warn("filtered")
    assert w == []


def test_no_direct_warnings_warn_in_engine_or_kernels():
    # Check that every warning of engine/ and kernels/ goes through kernels.warn.warn (hand-
    # counted stacklevels break when a call moves one frame deeper).
    direct = []
    for p in sorted([*(ROOT / "engine").rglob("*.py"), *(ROOT / "kernels").rglob("*.py")]):
        if p == ROOT / "kernels" / "warn.py":
            continue
        for i, text in enumerate(p.read_text().splitlines(), 1):
            if re.search(r"\bwarnings\.warn\(|\bwarn_explicit\(", text):
                direct.append(f"{p.relative_to(ROOT)}:{i}")
    assert direct == []



def test_the_thread_count_warning_under_python_c():
    # Check that a warning attributed to `python -c`'s code (no source file) is printed, not
    # turned into an error by a source lookup.
    env = {**os.environ, "BLASNET_NUM_THREADS": "9999"}
    r = subprocess.run([sys.executable, "-c", "import kernels"], env=env, capture_output=True,
                       text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    assert r.stderr.startswith("<string>:1: RuntimeWarning: BLASNET_NUM_THREADS=9999"), r.stderr

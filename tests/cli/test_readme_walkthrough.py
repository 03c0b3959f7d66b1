"""The README's command-line walkthrough (train -> inspect -> predict on a CSV), run as
written: every fenced block marked ``<!-- walkthrough -->``, in a shell that activated the
.venv first, as the README says to."""
import os
import re
import subprocess
import sys

import numpy as np
import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
VENV = os.path.dirname(os.path.dirname(sys.executable))


def _commands() -> list:
    with open(os.path.join(ROOT, "README.md")) as f:
        text = f.read()
    blocks = re.findall(r"<!-- walkthrough[^>]*-->\n```\n(.*?)```\n<!-- /walkthrough -->", text,
                        re.S)
    cmds = []
    for block in blocks:
        for line in block.replace("\\\n", " ").splitlines():
            line = line.split("  #")[0].strip()
            if line:
                cmds.append(line)
    return cmds


def test_readme_says_to_activate_the_venv():
    # Check that the README shows the activation before its commands
    with open(os.path.join(ROOT, "README.md")) as f:
        text = f.read()
    assert ". .venv/bin/activate" in text
    assert text.index(". .venv/bin/activate") < text.index("\nblasnet train ")


@pytest.mark.slow
@pytest.mark.skipif(not os.path.exists(os.path.join(VENV, "bin", "activate")),
                    reason="tests run outside a virtual environment")
def test_readme_walkthrough_runs_as_written(tmp_path):
    # Check that train, inspect and predict run as printed and write what they promise
    cmds = _commands()
    assert [c.split()[:2] for c in cmds] == [["blasnet", "train"], ["blasnet", "inspect"],
                                             ["blasnet", "predict"]]
    from engine import data
    X, y = data.spiral(600, rng=0)  # the README's CSV, written as its Python example does
    with open(tmp_path / "spiral.csv", "w") as f:
        f.write("x0,x1,label\n")
        f.writelines(f"{a},{b},{c}\n" for (a, b), c in zip(X, y))
    env = {k: v for k, v in os.environ.items() if k not in ("VIRTUAL_ENV", "PYTHONPATH")}
    env["PATH"] = "/usr/bin:/bin"  # no python of the .venv unless activated
    for cmd in cmds:
        r = subprocess.run(["bash", "-c", f". {VENV}/bin/activate && {cmd}"], cwd=tmp_path,
                           env=env, capture_output=True, text=True, timeout=600)
        assert r.returncode == 0, f"{cmd}\n{r.stdout}\n{r.stderr}"
    for name in ("spiral.npz", "history.csv", "loss.png", "preds.csv"):
        assert (tmp_path / name).stat().st_size > 0
    rows = (tmp_path / "preds.csv").read_text().splitlines()
    assert rows[0] == "class,p0,p1" and len(rows) == 601
    classes = np.array([int(r.split(",")[0]) for r in rows[1:]])
    assert np.mean(classes == y) > 0.9  # the trained spiral classifier, not noise

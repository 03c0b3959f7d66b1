"""The command-line walkthrough of docs/cli.md (train -> inspect -> predict -> resume on a
CSV), run as written: every fenced block marked ``<!-- walkthrough -->``, in a shell that
activated the .venv first, as the README and the guide say to. The resume step continues
the train command interrupted by a real SIGINT at a fixed optimizer step."""
import os
import re
import subprocess
import sys

import numpy as np
import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
GUIDE = os.path.join(ROOT, "docs", "cli.md")
VENV = os.path.dirname(os.path.dirname(sys.executable))


def _commands() -> list:
    with open(GUIDE) as f:
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


@pytest.mark.parametrize("doc", ["README.md", os.path.join("docs", "cli.md")])
def test_the_doc_says_to_activate_the_venv(doc):
    # Check that the doc shows the activation before its first train command
    with open(os.path.join(ROOT, doc)) as f:
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
                                             ["blasnet", "predict"], ["blasnet", "train"]]
    assert "--resume spiral.interrupted.npz" in cmds[3]
    from engine import data
    X, y = data.spiral(600, rng=0)  # the guide's CSV, written as its command does
    with open(tmp_path / "spiral.csv", "w") as f:
        f.write("x0,x1,label\n")
        f.writelines(f"{a},{b},{c}\n" for (a, b), c in zip(X, y))
    env = {k: v for k, v in os.environ.items() if k not in ("VIRTUAL_ENV", "PYTHONPATH")}
    env["PATH"] = "/usr/bin:/bin"  # no python of the .venv unless activated
    env["BLASNET_NUM_THREADS"] = "1"  # the resumed run must equal the uninterrupted one

    def run(cmd, extra_env=None):
        return subprocess.run(["bash", "-c", f". {VENV}/bin/activate && {cmd}"], cwd=tmp_path,
                              env={**env, **(extra_env or {})}, capture_output=True,
                              text=True, timeout=600)
    for cmd in cmds[:3]:
        r = run(cmd)
        assert r.returncode == 0, f"{cmd}\n{r.stdout}\n{r.stderr}"
    _check_resume_step(tmp_path, cmds, run)
    for name in ("spiral.npz", "history.csv", "loss.png", "preds.csv"):
        assert (tmp_path / name).stat().st_size > 0
    rows = (tmp_path / "preds.csv").read_text().splitlines()
    assert rows[0] == "class,p0,p1" and len(rows) == 601
    classes = np.array([int(r.split(",")[0]) for r in rows[1:]])
    assert np.mean(classes == y) > 0.9  # the trained spiral classifier, not noise


# Loaded at the start of the interrupted train command (a sitecustomize on its PYTHONPATH):
# a real SIGINT raised during the optimizer's 200th step, as a Ctrl-C would arrive.
_SIGINT_AT_STEP = """
import signal
from engine.optim import optimizers

_step, _calls = optimizers.AdamW.step, [0]

def step(self, *args, **kwargs):
    _calls[0] += 1
    if _calls[0] == 200:
        signal.raise_signal(signal.SIGINT)
    return _step(self, *args, **kwargs)

optimizers.AdamW.step = step
"""


def _check_resume_step(tmp_path, cmds, run):
    """Interrupt the guide's train command (SIGINT at step 200), run the guide's resume
    command, and check it finishes the run with the uninterrupted run's weights."""
    import engine
    os.replace(tmp_path / "spiral.npz", tmp_path / "uninterrupted.npz")
    hook = tmp_path / "hook"
    hook.mkdir()
    (hook / "sitecustomize.py").write_text(_SIGINT_AT_STEP)
    r = run(cmds[0], {"PYTHONPATH": str(hook)})
    assert r.returncode == 130, f"{r.stdout}\n{r.stderr}"
    assert "spiral.interrupted.npz" in r.stderr and not (tmp_path / "spiral.npz").exists()
    r = run(cmds[3])
    assert r.returncode == 0, f"{cmds[3]}\n{r.stdout}\n{r.stderr}"
    done = engine.load_model(tmp_path / "spiral.npz").model.parameters()
    ref = engine.load_model(tmp_path / "uninterrupted.npz").model.parameters()
    for a, b in zip(done, ref):
        np.testing.assert_array_equal(a.data, b.data)

"""Command line and environment: option combinations that would be ignored or give nonsense
are usage errors naming the option (exit status 2, no traceback), and BLASNET_NUM_THREADS
above the cores is clamped with a warning instead of accepted or crashing."""
import os
import subprocess
import sys

import pytest

from engine import cli
from kernels import threads

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


@pytest.mark.parametrize("args, names", [
    (["--optimizer", "adamw", "--momentum", "0.9"], "--momentum: only with --optimizer sgd"),
    (["--samples", "1"], "--samples: expected an integer >= 2"),
    (["--task", "spiral", "--samples", "1"], "--samples: expected an integer >= 2"),
    (["--seed", "-1"], "--seed: expected an integer >= 0"),
], ids=["momentum with adamw", "one sample", "spiral with one sample", "negative seed"])
def test_options_that_would_be_ignored_or_meaningless_are_usage_errors(capsys, args, names):
    # Check that each is a one-line error naming the option with exit status 2 before any
    # training (no traceback, no "R^2 = -inf" report).
    try:
        code = cli.main(["train", "--epochs", "1", *args])
    except SystemExit as e:  # argparse's own usage errors
        code = e.code
    out, err = capsys.readouterr()
    assert code == 2
    assert names in err and "Traceback" not in err
    assert "R^2" not in out and "epoch" not in out


def _import_kernels(value):
    env = {k: v for k, v in os.environ.items()
           if k not in ("OPENBLAS_NUM_THREADS", "OMP_NUM_THREADS")}
    env[threads.ENV_VAR] = value
    code = "import kernels; print(kernels.get_num_threads(), kernels.threads.elementwise_threads())"
    return subprocess.run([sys.executable, "-c", code], cwd=ROOT, env=env, capture_output=True,
                          text=True, timeout=120)


@pytest.mark.parametrize("value", ["1000", str(10 ** 30)])
def test_thread_count_above_the_cores_is_clamped_with_a_warning(value):
    # Check that BLASNET_NUM_THREADS above the usable cores (1000, and 10**30, which used to
    # overflow a C int) imports fine with a RuntimeWarning naming the variable, and every
    # pool (BLAS and blasnet's own passes) uses the number of usable cores.
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
    r = _import_kernels(value)
    assert r.returncode == 0, r.stderr
    assert "RuntimeWarning" in r.stderr and threads.ENV_VAR in r.stderr
    assert r.stdout.split() == [str(cores), str(cores)]


def test_set_num_threads_refuses_an_absurd_count():
    # Check that set_num_threads(10**30) is a ValueError naming n (not a ctypes overflow),
    # and the limit is unchanged.
    before = threads.get_num_threads()
    with pytest.raises(ValueError, match=r"n: expected a positive integer <= \d+"):
        threads.set_num_threads(10 ** 30)
    assert threads.get_num_threads() == before

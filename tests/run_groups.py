"""Run the whole test suite as its two groups at once, one pytest process per core.

    python tests/run_groups.py [pytest options]

``make test`` runs this. The groups (tests/conftest.py, ``--group``) are the tests that mostly
start other Python processes and all the others; together they are every test of ``pytest
tests``. A pytest process runs its tests one after another on one core, so on a machine with
two or more CPUs the second group runs beside the first, its report printed after the first's.
With one CPU this is plain ``pytest tests``. The exit status is the first nonzero one of the
two runs (0 when both pass); a group left without tests by a selection (``-k``, ``-m``) does not
count, unless neither group has any.
"""
from __future__ import annotations

import subprocess
import sys
import tempfile
from pathlib import Path

from conftest import GROUPS  # this file's folder is sys.path[0]; the foreground group first
from kernels.threads import usable_cores as _cpus

ROOT = Path(__file__).resolve().parents[1]
NO_TESTS = 5  # pytest's exit status when nothing was collected (pytest.ExitCode)


def main(argv: list) -> int:
    pytest = [sys.executable, "-m", "pytest", "tests", *argv]
    if _cpus() < 2:
        return subprocess.call(pytest, cwd=ROOT)
    with tempfile.TemporaryFile("w+") as log:
        other = subprocess.Popen([*pytest, "--group", GROUPS[1]], stdout=log,
                                 stderr=subprocess.STDOUT, cwd=ROOT)
        try:
            first = subprocess.call([*pytest, "--group", GROUPS[0]], cwd=ROOT)
            second = other.wait()
        finally:
            if other.poll() is None:  # interrupted: do not leave the other group running
                other.kill()
                other.wait()
        log.seek(0)
        print(f"\n---- the tests of --group {GROUPS[1]}, run beside the others ----", flush=True)
        sys.stdout.write(log.read())
    # A selection (-k, -m) may leave one group without tests: that is not a failure.
    ran = [s for s in (first, second) if s != NO_TESTS] or [NO_TESTS]
    return next((s for s in ran if s), 0)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))

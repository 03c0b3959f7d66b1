"""Ctrl-C and SIGTERM under ``mpiexec -n 2`` (real signals, sent to mpiexec, which forwards
them to every rank, or to one rank alone): every rank stops after the same step, rank 0
writes one resumable checkpoint and prints one message, the job exits 130 or 143; the
printed ``mpiexec -n 2`` command (and one process) resumes it to an uninterrupted two-rank
run's parameters, bit for bit on two ranks (float64)."""
import os
import signal
import subprocess
import sys

import numpy as np
import pytest

import kernels
from engine import cli
from engine.training import checkpoint
from support.lm_runs import OPTIONS, TEXT, params
from test_distributed import MPIEXEC, ROOT, TIMEOUT, launch, needs_mpi

TABULAR = ["--task", "sine", "--model", "mlp", "--hidden", "16", "--samples", "256",
           "--batch-size", "32", "--dtype", "float64", "--epochs", "40"]


def _with(options: list, **values) -> list:
    """``options`` with the values of some flags replaced (``max_iters=200``)."""
    out = list(options)
    for dest, v in values.items():
        out[out.index("--" + dest.replace("_", "-")) + 1] = str(v)
    return out


# The shared tiny GPT, 200 steps (a progress line every 5: a signal sent after the first one
# lands long before the end), at lr 0.01 (at 0.3 one process and two ranks, whose sums
# differ in order, drift apart over 200 steps).
GPT = [*_with(OPTIONS, max_iters=200, lr=0.01), "--sample-length", "3", "--dtype", "float64",
       "--text", "in.txt"]


def _train(*argv):
    return [sys.executable, "-m", "engine", "train", *argv]


def _env() -> dict:
    return dict(os.environ, PYTHONPATH=ROOT, BLASNET_NUM_THREADS="1")


def _run2(cwd, argv) -> None:
    """``mpiexec -n 2`` ``argv`` (a python command) in ``cwd``, one BLAS thread per rank;
    AssertionError with its stderr unless it exits 0."""
    r = subprocess.run([MPIEXEC, "-n", "2", *argv], cwd=cwd, env=_env(), capture_output=True,
                       text=True, timeout=TIMEOUT)
    assert r.returncode == 0, r.stderr


def _rank_pid(root: int, rank: int) -> int:
    """The pid of MPI rank ``rank`` among the descendants of the mpiexec ``root`` (the one
    whose environment has hydra's ``PMI_RANK=rank``)."""
    children = {}
    for d in filter(str.isdigit, os.listdir("/proc")):
        try:
            with open(f"/proc/{d}/stat") as f:
                ppid = int(f.read().rsplit(")", 1)[1].split()[1])
        except (OSError, ValueError, IndexError):
            continue
        children.setdefault(ppid, []).append(int(d))
    stack = [root]
    while stack:
        for pid in children.get(stack.pop(), []):
            try:
                with open(f"/proc/{pid}/environ", "rb") as f:
                    env = f.read().split(b"\0")
            except OSError:
                env = []
            if f"PMI_RANK={rank}".encode() in env:
                return pid
            stack.append(pid)
    raise AssertionError(f"no rank {rank} under mpiexec {root}")


def _interrupt(cwd, argv, sig, rank=None):
    """``mpiexec -n 2`` ``argv``, sent ``sig`` once rank 0 printed a progress line (to
    mpiexec, or with ``rank`` to that rank alone); ``(exit status, stdout, stderr)``."""
    proc = subprocess.Popen([MPIEXEC, "-n", "2", *argv], cwd=cwd, env=_env(), text=True,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    try:
        seen = []
        for line in proc.stdout:
            seen.append(line)
            if line.startswith(("epoch ", "step ")):
                break
        os.kill(proc.pid if rank is None else _rank_pid(proc.pid, rank), sig)
        out, err = proc.communicate(timeout=TIMEOUT)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    return proc.returncode, "".join(seen) + out, err


def _resume_command(err: str) -> list:
    """The printed resume command, as an argv for ``launch`` (after ``mpiexec -n 2``)."""
    line = err.split("resume with:\n")[1].strip().split()
    assert line[:3] == ["mpiexec", "-n", "2"], line
    return line[4:]  # (after the interpreter: launch starts this one)


def _same(a, b) -> bool:
    a, b = params(a), params(b)
    return bool(a) and a.keys() == b.keys() and all(np.array_equal(a[k], b[k]) for k in a)


def _rel_err(a, b) -> float:
    a, b = params(a), params(b)
    return max(float(np.max(np.abs(a[k] - b[k])) / np.max(np.abs(b[k]))) for k in b)


def _stopped_inside(path, total: int) -> None:
    """The checkpoint is an interrupted run's, stopped after some but not all steps."""
    training = checkpoint.read_header(path)["training"]
    assert training is not None and 0 < training["history"]["steps"] < total


@pytest.fixture(scope="module")
def tabular_ref(tmp_path_factory):
    """The uninterrupted two-rank tabular run's checkpoint."""
    tmp = tmp_path_factory.mktemp("tab")
    launch(2, *_train(*TABULAR, "--save", str(tmp / "ref.npz"), "--quiet")[1:])
    return tmp / "ref.npz"


@needs_mpi
def test_ctrl_c_to_mpiexec_writes_one_checkpoint_that_resumes_bit_for_bit(tmp_path,
                                                                          tabular_ref):
    # Check that SIGINT to mpiexec (a Ctrl-C: forwarded to both ranks) in a tabular run
    # exits 130 with one message (rank 0's) and m.interrupted.npz written mid-run; that the
    # printed mpiexec -n 2 command ends with the uninterrupted run's parameters bit for bit,
    # and one process resuming the same file within float64 rounding of them.
    code, out, err = _interrupt(tmp_path, _train(*TABULAR, "--log-every", "1", "--save",
                                                 "m.npz"), signal.SIGINT)
    assert code == 130, err
    assert err.count("training interrupted (SIGINT)") == 1 and "Traceback" not in err
    _stopped_inside(tmp_path / "m.interrupted.npz", 40 * 8)
    assert not (tmp_path / "m.npz").exists()
    _run2(tmp_path, [sys.executable, *_resume_command(err)])
    assert _same(tmp_path / "m.npz", tabular_ref)
    with kernels.num_threads(1):
        assert cli.main(["train", *TABULAR, "--quiet", "--resume",
                         str(tmp_path / "m.interrupted.npz"),
                         "--save", str(tmp_path / "one.npz")]) == 0
    assert _rel_err(tmp_path / "one.npz", tabular_ref) < 1e-12


@needs_mpi
def test_sigterm_to_one_rank_stops_both_after_the_same_step(tmp_path, tabular_ref):
    # Check that SIGTERM to rank 1 alone (rank 0 gets no signal) stops both ranks together
    # (no hang), exit 143, rank 0 reports SIGTERM once and writes the checkpoint, which
    # resumes on two ranks to the uninterrupted run's parameters bit for bit.
    code, out, err = _interrupt(tmp_path, _train(*TABULAR, "--log-every", "1", "--save",
                                                 "m.npz"), signal.SIGTERM, rank=1)
    assert code == 143, err
    assert err.count("training interrupted (SIGTERM)") == 1, err
    _stopped_inside(tmp_path / "m.interrupted.npz", 40 * 8)
    launch(2, *_train(*TABULAR, "--quiet", "--resume", str(tmp_path / "m.interrupted.npz"),
                      "--save", str(tmp_path / "m.npz"))[1:])
    assert _same(tmp_path / "m.npz", tabular_ref)


@pytest.fixture(scope="module")
def gpt_dir(tmp_path_factory):
    """A directory with the text and the uninterrupted two-rank ZeRO-1 GPT run's ref.npz."""
    tmp = tmp_path_factory.mktemp("gpt")
    (tmp / "in.txt").write_text(TEXT)
    _run2(tmp, _train(*GPT, "--shard-optimizer", "--save", "ref.npz"))
    return tmp


@needs_mpi
@pytest.mark.parametrize("sig, rank, code", [(signal.SIGTERM, None, 143),
                                             (signal.SIGINT, 1, 130)],
                         ids=["sigterm-to-mpiexec", "sigint-to-rank-1"])
def test_gpt_zero1_interrupted_resumes_on_two_ranks_and_one_process(gpt_dir, sig, rank,
                                                                    code):
    # Check that the GPT with ZeRO-1 (AdamW sharded over the ranks, gathered for the file)
    # stopped by a signal to mpiexec or to one rank writes one checkpoint and message (exit
    # 143 / 130); that resumed on two ranks it ends with the uninterrupted run's parameters
    # bit for bit, and on one process within float64 rounding.
    name = signal.Signals(sig).name
    argv = _train(*GPT, "--shard-optimizer", "--save", f"{name}.npz")
    got, out, err = _interrupt(gpt_dir, argv, sig, rank)
    assert got == code, err
    assert err.count(f"training interrupted ({name}) after step ") == 1, err
    ckpt = gpt_dir / f"{name}.interrupted.npz"
    _stopped_inside(ckpt, 200)
    _run2(gpt_dir, [sys.executable, *_resume_command(err)])
    assert _same(gpt_dir / f"{name}.npz", gpt_dir / "ref.npz")
    cwd = os.getcwd()
    try:
        os.chdir(gpt_dir)
        with kernels.num_threads(1):
            assert cli.main(["train", *GPT, "--resume", str(ckpt), "--save", "one.npz"]) == 0
    finally:
        os.chdir(cwd)
    assert _rel_err(gpt_dir / "one.npz", gpt_dir / "ref.npz") < 1e-8

"""The language models under ``mpiexec -n 2``: resumable checkpoints written by rank 0
(``--out-dir``, ``ModelCheckpoint``), resumed on two ranks (bit for bit) or on one process
(to float64 rounding), iteration-based runs (every rank draws the global batch of one
``RandomWindows``, each trains on its share), and user errors as one line from rank 0."""
import json
import os

import numpy as np
import pytest

import kernels
from engine import cli
from engine.training import gpt_lm, lm
from engine.training.callbacks import ModelCheckpoint
from support.lm_runs import OPTIONS, TEXT, params
from test_distributed import launch, needs_mpi

HERE = os.path.dirname(os.path.abspath(__file__))
RUN = ["-m", "engine", "train", *OPTIONS, "--sample-length", "3", "--dtype", "float64"]


def _rel_err(a_path, b_path) -> float:
    a, b = params(a_path), params(b_path)
    assert a and a.keys() == b.keys()
    return max(float(np.max(np.abs(a[k] - b[k])) / np.max(np.abs(b[k]))) for k in a)


def _one(tmp, *argv) -> int:
    with kernels.num_threads(1):
        return cli.main([*RUN[2:], *argv])


@pytest.fixture(scope="module")
def two_rank_run(tmp_path_factory):
    """A two-rank iteration-based run with --out-dir, in its own directory."""
    tmp = tmp_path_factory.mktemp("lm2")
    (tmp / "in.txt").write_text(TEXT)
    launch(2, *RUN, "--text", str(tmp / "in.txt"), "--out-dir", str(tmp / "out"),
           "--save", str(tmp / "ref.npz"))
    return tmp


@needs_mpi
def test_iteration_run_on_two_ranks_equals_one_process(two_rank_run):
    # Check that --max-iters under mpiexec -n 2 (each rank a share of the same random
    # windows) ends with one process's parameters, to float64 rounding.
    tmp = two_rank_run
    assert _one(tmp, "--text", str(tmp / "in.txt"), "--save", str(tmp / "one.npz")) == 0
    assert _rel_err(tmp / "one.npz", tmp / "ref.npz") < 1e-8


@needs_mpi
def test_two_rank_checkpoint_resumes_on_two_ranks_bit_for_bit(two_rank_run):
    # Check that out/ckpt.npz, written by rank 0 inside the run, resumed on two ranks ends
    # with the uninterrupted run's parameters bit for bit.
    tmp = two_rank_run
    proc = launch(2, *RUN, "--text", str(tmp / "in.txt"), "--resume", str(tmp / "out/ckpt.npz"),
                  "--save", str(tmp / "k2.npz"))
    assert "step 15/30" in proc.stdout and "step 10/30" not in proc.stdout
    assert _rel_err(tmp / "k2.npz", tmp / "ref.npz") == 0.0


@needs_mpi
def test_two_rank_checkpoint_resumes_on_one_process(two_rank_run):
    # Check that the same checkpoint resumed on one process ends with the two-rank run's
    # parameters to float64 rounding (the gradient sums only differ in order).
    tmp = two_rank_run
    assert _one(tmp, "--text", str(tmp / "in.txt"), "--resume", str(tmp / "out/ckpt.npz"),
                "--save", str(tmp / "k1.npz")) == 0
    assert 0.0 < _rel_err(tmp / "k1.npz", tmp / "ref.npz") < 1e-8


@needs_mpi
def test_one_process_checkpoint_resumes_on_two_ranks(tmp_path):
    # Check that a one-process run's out/ckpt.npz resumed under mpiexec -n 2 ends with the
    # one-process run's parameters to float64 rounding.
    (tmp_path / "in.txt").write_text(TEXT)
    txt = str(tmp_path / "in.txt")
    assert _one(tmp_path, "--text", txt, "--out-dir", str(tmp_path / "out"),
                "--save", str(tmp_path / "one.npz")) == 0
    launch(2, *RUN, "--text", txt, "--resume", str(tmp_path / "out/ckpt.npz"),
           "--save", str(tmp_path / "k2.npz"))
    assert _rel_err(tmp_path / "k2.npz", tmp_path / "one.npz") < 1e-8


@needs_mpi
@pytest.mark.parametrize("mode", ["plain", "zero1"])
def test_epoch_run_resumes_on_two_ranks_bit_for_bit_and_on_one_process(tmp_path, mode):
    # Check that an epoch-based two-rank run (AdamW, or ZeRO-1 sharded) resumed on two ranks
    # from its first epoch's checkpoint ends bit for bit where the uninterrupted run ended,
    # and resumed on one process to float64 rounding.
    (tmp_path / "again").mkdir()
    proc = launch(2, os.path.join(HERE, "mpi", "lm_resume.py"), str(tmp_path), mode)
    assert json.loads(proc.stdout.strip().splitlines()[-1]) == {"bit_identical": True,
                                                                "ranks": 2}
    from mpi.lm_resume import CONFIG
    s = gpt_lm.setup(gpt_lm.GPTConfig(**CONFIG), TEXT)
    cb = ModelCheckpoint(str(tmp_path / "one-ep{epoch}.npz"), save_best_only=False)
    with kernels.num_threads(1):
        lm.run_training(s, False, resume_from=str(tmp_path / "ep1.npz"), callbacks=[cb])
    ref = np.load(tmp_path / "ref.npy")
    got = s.model.flat_params()
    assert np.max(np.abs(got - ref)) <= 1e-10 * np.max(np.abs(ref))


@needs_mpi
def test_user_error_under_mpiexec_is_one_line_from_rank_0(tmp_path):
    # Check that a usage error under mpiexec -n 2 is printed once (rank 0), one line, exit 2.
    proc = launch(2, *RUN, "--prompt", "", check=False)
    lines = [ln for ln in proc.stderr.splitlines() if ln.strip()]
    assert proc.returncode == 2 and lines == ["error: --prompt: expected a non-empty str, "
                                              "got ''"], proc.stderr


@needs_mpi
def test_shard_optimizer_banner_says_zero1(tmp_path):
    # Check that the LM banner under --shard-optimizer names ZeRO-1, as the tabular one does.
    (tmp_path / "in.txt").write_text(TEXT)
    proc = launch(2, *RUN, "--text", str(tmp_path / "in.txt"), "--max-iters", "5",
                  "--shard-optimizer")
    first, training = proc.stdout.splitlines()[0], proc.stdout.split("training  ")[1]
    assert first.endswith(", AdamW sharded (ZeRO-1)")
    assert training.startswith("ZeRO-1: AdamW sharded over 2 ranks(lr=0.3")

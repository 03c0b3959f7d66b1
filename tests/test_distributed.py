"""engine.distributed: data parallel over MPI and ZeRO-1, against one process.

The MPI checks run in workers (tests/mpi/) that this module launches with ``mpiexec -n K``
(K = 2 and 3, oversubscribed on small machines, one BLAS thread per rank) under a timeout;
each launch batches many checks and prints one JSON line, which the tests below read. The
oracle is the engine's own single-process training of a second copy of each model.
They are skipped only when the optional extra ``mpi`` (mpi4py, mpich) is not installed.
"""
import importlib.util
import json
import os
import shutil
import subprocess
import sys

import numpy as np
import pytest

import kernels
from engine import cli
from kernels.threads import usable_cores
from engine import distributed as D

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
MPIEXEC = (shutil.which("mpiexec", path=os.path.dirname(sys.executable))
           or shutil.which("mpiexec"))
HAVE_MPI = importlib.util.find_spec("mpi4py") is not None and MPIEXEC is not None
needs_mpi = pytest.mark.skipif(
    not HAVE_MPI, reason="the optional extra 'mpi' is not installed (mpi4py and mpiexec from "
                         "the mpich wheel): pip install 'blasnet[mpi]'")
TIMEOUT = 120  # seconds per launch: a hang fails the test instead of stalling the suite


def launch(k, *args, check=True, threads=1, cores=None):
    """``mpiexec -n k python *args`` from the project root, ``threads`` BLAS threads per
    rank (None: BLASNET_NUM_THREADS unset), on the first ``cores`` of this process's cores
    (None: all of them)."""
    env = dict(os.environ, PYTHONPATH=ROOT)
    env.pop("BLASNET_NUM_THREADS", None)
    if threads is not None:
        env["BLASNET_NUM_THREADS"] = str(threads)
    pin = None
    if cores is not None:
        mine = sorted(os.sched_getaffinity(0))[:cores]
        pin = lambda: os.sched_setaffinity(0, mine)  # noqa: E731  (inherited by the ranks)
    proc = subprocess.run([MPIEXEC, "-n", str(k), sys.executable, *args], cwd=ROOT, env=env,
                          capture_output=True, text=True, timeout=TIMEOUT, preexec_fn=pin)
    if check and proc.returncode != 0:
        raise AssertionError(f"mpiexec -n {k} {' '.join(args)} exited {proc.returncode}:\n"
                             f"{proc.stdout[-3000:]}\n{proc.stderr[-3000:]}")
    return proc


def json_line(proc):
    return json.loads(proc.stdout.strip().splitlines()[-1])


@pytest.fixture(scope="module", params=[2, 3], ids=["K2", "K3"])
def equiv(request):
    return json_line(launch(request.param, os.path.join(HERE, "mpi", "equivalence.py")))


@pytest.fixture(scope="module")
def faults():
    return json_line(launch(2, os.path.join(HERE, "mpi", "faults.py")))


# ----------------------------------------------------------------------------- equivalence
@needs_mpi
@pytest.mark.parametrize("mode", ["plain", "zero1"])
def test_data_parallel_equals_one_process_float64(equiv, mode):
    # Check that K ranks on a global batch (some batches not divisible by K) give, after 5
    # AdamW steps, the parameters of one process on that batch, to 1e-12 relative: plain
    # data parallel, and ZeRO-1 (ShardedAdamW, with parameter groups).
    for kind in ("FFN", "GMLP", "FFNSublayer", "MLP"):
        assert equiv["steps"][f"{kind} {mode}"]["rel_err"] <= 1e-12, kind


@needs_mpi
def test_float32_equals_one_process_to_1e5(equiv):
    # Check that float32 data parallel (plain and ZeRO-1) agrees with one process to 1e-5.
    assert equiv["steps"]["FFN float32 plain"]["rel_err"] <= 1e-5
    assert equiv["steps"]["FFN float32 zero1"]["rel_err"] <= 1e-5


@needs_mpi
def test_parameters_bit_identical_across_ranks(equiv):
    # Check that after every step every rank holds the same bits, plain and ZeRO-1.
    assert all(case["identical"] for case in equiv["steps"].values())
    assert equiv["fit plain"]["identical"] and equiv["fit zero1"]["identical"]


@needs_mpi
@pytest.mark.parametrize("mode", ["plain", "zero1"])
def test_fit_with_comm_equals_fit(equiv, mode):
    # Check that fit(comm=...) (shuffled batches of 11 over 53 samples, classification,
    # validation, a cosine schedule, clipping at norm 0.5) gives fit's parameters, losses,
    # accuracies and counts.
    r = equiv[f"fit {mode}"]
    assert r["rel_err"] <= 1e-12
    assert r["history_rel_err"] <= 1e-12
    assert r["accuracy_equal"] and r["val_accuracy_equal"]
    assert r["steps"] == [15, 15] and r["samples"] == [159, 159]


@needs_mpi
@pytest.mark.parametrize("mode", ["plain", "zero1"])
@pytest.mark.parametrize("case, steps, samples", [("tiny", 12, 39), ("pairs", 12, 21)])
def test_fit_with_batches_smaller_than_the_ranks_equals_fit(equiv, mode, case, steps, samples):
    # Check that fit(comm=...) equals fit when ranks have no rows in some steps: 13 samples
    # in batches of 4 (a last batch of 1) and 7 samples in batches of 2 (at K = 3 one rank
    # is empty in every step): parameters, losses, accuracies and counts.
    r = equiv[f"fit {case} {mode}"]
    assert r["rel_err"] <= 1e-10 and r["history_rel_err"] <= 1e-10 and r["identical"]
    assert r["accuracy_equal"] and r["val_accuracy_equal"]
    assert r["steps"] == [steps, steps] and r["samples"] == [samples, samples]


@needs_mpi
@pytest.mark.parametrize("mode", ["plain", "zero1"])
@pytest.mark.parametrize("model", ["gpt", "gmlp-lm"])
def test_language_model_with_a_last_batch_of_one_equals_one_process(equiv, model, mode):
    # Check that a language model (GPT, gMLP; float64, a last batch of one window) trained by
    # the ranks (plain, and ZeRO-1 through distributed.zero1 with its schedule) ends with one
    # process's parameters and losses.
    r = equiv[f"{model} {mode}"]
    assert r["last_batch"] == 1 and r["steps"][0] == r["steps"][1]
    assert r["rel_err"] <= 1e-10 and r["history_rel_err"] <= 1e-10


@needs_mpi
def test_fit_on_one_rank_is_fit(equiv):
    # Check that fit on a communicator of one rank gives plain fit's parameter bits.
    r = equiv["fit one rank"]
    assert r["params_equal"] and r["history_rel_err"] <= 1e-15


@needs_mpi
def test_sharded_optimizer_memory_is_one_kth(equiv):
    # Check that the optimizer memory a rank allocates (tracemalloc: construction and first
    # step) is about 1/K of AdamW's: two moments of a 1/K slice instead of the whole arena.
    k = equiv["K"]
    for r in equiv["memory"]:
        assert r["plain"] >= 2 * r["params_bytes"]
        assert r["sharded"] <= r["plain"] / k * 1.05 + 4096
        assert abs(r["state_nbytes"] - 2 * r["params_bytes"] / k) <= 2 * 64 * k


@needs_mpi
def test_sharded_checkpoint_is_an_adamw_checkpoint(equiv):
    # Check that a ShardedAdamW checkpoint (written by rank 0) loads into a plain AdamW with
    # the same moments and step count, and back into a ShardedAdamW on every rank.
    c = equiv["checkpoints"]
    assert c["state_nonzero"] and c["plain_load"] and c["sharded_reload"]


@needs_mpi
def test_dropout_streams_differ_per_rank(equiv):
    # Check that rank_rng gives each rank its own reproducible dropout stream.
    assert equiv["dropout"] == {"masks_differ": True, "reproducible": True}


# ----------------------------------------------------------------------------- faults
@needs_mpi
@pytest.mark.parametrize("fault, says", [
    ("different_models", ("W_in", "rank 1")),  # a parameter's shape differs on rank 1
    ("different_data", ("X (shape",)),         # rank 1 drew its data with another seed
])
def test_ranks_that_disagree_are_rejected(faults, fault, says):
    # Check that a model or data the ranks do not share raises ValueError on every rank,
    # saying what differs.
    for kind, msg in faults[fault]:
        assert kind == "ValueError" and all(s in msg for s in says), (kind, msg)


@needs_mpi
def test_bad_data_on_one_rank_stops_every_rank(faults):
    # Check that a label only rank 1 has stops rank 1 with its ValueError (fit's check of the
    # data) and rank 0 with a RankError carrying that message.
    (k0, m0), (k1, m1) = faults["bad_label"]
    assert k1 == "ValueError" and "labels in [0, 3)" in m1
    assert k0 == "RankError" and "rank 1 of 2" in m0 and m1 in m0


@needs_mpi
def test_nonfinite_loss_stops_every_rank(faults):
    # Check that a NaN arising in rank 1's forward makes the global loss NaN:
    # NonFiniteLossError on every rank, at the same step.
    (k0, m0), (k1, m1) = faults["nan_input"]
    assert k0 == k1 == "NonFiniteLossError" and m0 == m1 and "step 1/1" in m0


@needs_mpi
@pytest.mark.parametrize("fault, failing, kind, says", [
    ("backward_raises", 1, "RuntimeError", "deliberate failure"),  # rank 0 waits to reduce
    ("failed_save", 0, "NotADirectoryError", "rank 0 of 2"),       # writing the checkpoint
])
def test_one_failing_rank_stops_every_rank(faults, fault, failing, kind, says):
    # Check that a rank raising while the other waits for it (rank 1 in backward, rank 0
    # saving a checkpoint) stops both: the failing rank with its own error, the other with
    # a RankError that says so.
    (k_fail, _), (k_other, m_other) = (faults[fault][failing], faults[fault][1 - failing])
    assert k_fail == kind and k_other == "RankError" and says in m_other


@needs_mpi
def test_no_rank_is_left_in_a_collective(faults):
    # Check that after all those failures the ranks still meet in the same collective.
    assert faults["alive"] is True


@needs_mpi
def test_uncaught_exception_aborts_the_job():
    # Check that an exception nobody catches on rank 1, while rank 0 waits in a collective,
    # ends the job (non-zero, with rank 1's message) instead of hanging until the timeout.
    proc = launch(2, os.path.join(HERE, "mpi", "abort.py"), check=False)
    said = f"exit {proc.returncode}\nstdout: {proc.stdout[-2000:]}\nstderr: {proc.stderr[-2000:]}"
    assert proc.returncode != 0, said
    assert "deliberate uncaught error on rank 1" in proc.stderr, said
    assert "rank 0 passed the collective" not in proc.stdout, said


# ----------------------------------------------------------------------------- the CLI
CLI = ["--model", "ffn", "--task", "regression", "--dtype", "float64", "--epochs", "3",
       "--batch-size", "64"]


@pytest.fixture(scope="module")
def one_process(tmp_path_factory):
    """The checkpoint of the same command in this process (one BLAS thread)."""
    path = str(tmp_path_factory.mktemp("cli") / "one.npz")
    with kernels.num_threads(1):
        assert cli.main(["train", *CLI, "--save", path]) == 0
    return path


def _assert_same_parameters(a_path, b_path, rtol):
    a, b = np.load(a_path), np.load(b_path)
    names = [k for k in b.files if k.startswith("param/")]
    assert names and sorted(names) == sorted(k for k in a.files if k.startswith("param/"))
    for k in names:
        err = np.max(np.abs(a[k] - b[k])) / np.max(np.abs(b[k]))
        assert err <= rtol, (k, err)


@needs_mpi
def test_cli_two_ranks_equal_one_process(tmp_path, one_process):
    # Check that `mpiexec -n 2 python -m engine train ...` writes the parameters of the same
    # command run as one process, to 1e-10 relative; that rank 0 alone prints; and that the
    # header says "2 ranks x 1 threads".
    path = str(tmp_path / "two.npz")
    proc = launch(2, "-m", "engine", "train", *CLI, "--save", path)
    _assert_same_parameters(path, one_process, 1e-10)
    assert proc.stdout.count("final loss") == 1
    assert "2 ranks x 1 threads" in proc.stdout.splitlines()[0]


@needs_mpi
def test_cli_usage_error_is_one_line_from_rank_0():
    # Check that a tabular usage error under mpiexec -n 2 (an option the model does not read)
    # is printed once, by rank 0, as one line, with exit status 2 and no traceback.
    proc = launch(2, "-m", "engine", "train", *CLI, "--prompt", "x", check=False)
    lines = [ln for ln in proc.stderr.splitlines() if ln.strip()]
    assert proc.returncode == 2, proc.stderr
    assert len(lines) == 1 and lines[0].startswith("error: --prompt"), proc.stderr


@needs_mpi
def test_cli_shard_optimizer_equals_one_process(tmp_path, one_process):
    # Check that --shard-optimizer (ZeRO-1) writes one process's parameters too, and that
    # without BLASNET_NUM_THREADS each rank takes cores / ranks threads.
    path = str(tmp_path / "zero.npz")
    proc = launch(2, "-m", "engine", "train", *CLI, "--shard-optimizer", "--save", path,
                  threads=None, cores=2)
    _assert_same_parameters(path, one_process, 1e-10)
    header = proc.stdout.splitlines()[0]
    assert "2 ranks x 1 threads" in header and "ZeRO-1" in header
    assert "1 BLAS thread per rank (2 cores / 2 ranks on this host)" in proc.stdout


# ----------------------------------------------------------------------------- the LM CLI
def _lm_args(model):
    """A tiny float64 run of ``model`` over the corpus whose last batch holds one window."""
    from engine.training import lm
    n = lm.corpus_data(lm.LMConfig(seq_len=64))["X"].shape[0]  # both models' 64-char windows
    bs = next(b for b in range(700, n) if n % b == 1)
    extra = ["--layers", "1", "--heads", "2", "--seq-len", "64"] if model == "gpt" else []
    return ["--model", model, "--task", "text", "--epochs", "1", "--d-hidden", "16", "--d-ff",
            "32", "--batch-size", str(bs), "--warmup", "2", "--dtype", "float64",
            "--sample-length", "0", *extra]


def _assert_same_moments(a_path, b_path, rtol):
    a, b = np.load(a_path), np.load(b_path)
    names = [k for k in b.files if k.startswith("optim/") and "exp_avg" in k]
    assert names and sorted(names) == sorted(k for k in a.files if k.startswith("optim/")
                                             and "exp_avg" in k)
    for k in names:
        assert np.max(np.abs(a[k] - b[k])) <= rtol * np.max(np.abs(b[k])), k


@needs_mpi
def test_lm_cli_shard_optimizer_with_a_last_batch_of_one_equals_one_process(tmp_path):
    # Check that `mpiexec -n 2 ... --model gpt --shard-optimizer` with a last batch of one
    # window (one rank has no rows) writes one process's parameters and AdamW moments
    # (gathered from the shards) to 1e-10, and rank 0 alone reports. (The gMLP LM's CLI runs
    # the same lines; its training is checked above, through the API, on a short text.)
    model = "gpt"
    one, two = str(tmp_path / "one.npz"), str(tmp_path / "two.npz")
    with kernels.num_threads(1):
        assert cli.main(["train", *_lm_args(model), "--save", one]) == 0
    proc = launch(2, "-m", "engine", "train", *_lm_args(model), "--shard-optimizer",
                  "--save", two)
    _assert_same_parameters(two, one, 1e-10)
    _assert_same_moments(two, one, 1e-10)
    assert proc.stdout.count("wall time") == 1 and "2 MPI ranks x 1 BLAS thread" in proc.stdout


# ----------------------------------------------------------------------------- threads
two_cores = pytest.mark.skipif(
    not hasattr(os, "sched_getaffinity") or len(os.sched_getaffinity(0)) < 2,
    reason="needs two cores to pin the ranks to")


@needs_mpi
@two_cores
def test_ranks_share_the_cores_by_default():
    # Check that 2 ranks on 2 cores, no count set, run 1 BLAS thread each, say why, warn
    # nothing, and keep a count the user sets later (a second set_threads is a no-op).
    r = json_line(launch(2, os.path.join(HERE, "mpi", "threads.py"), threads=None, cores=2))
    assert r["threads"] == [1, 1]
    said = "2 MPI ranks x 1 BLAS thread per rank (2 cores / 2 ranks on this host)"
    assert r["text"] == [said, said]
    assert r["warnings"] == ["", ""] and r["kept"] == [True, True]


@needs_mpi
@two_cores
def test_explicit_threads_that_oversubscribe_warn_on_rank_0():
    # Check that BLASNET_NUM_THREADS=2 on 2 ranks of 2 cores is kept (2 threads each) and
    # rank 0 alone writes one warning line naming the setting.
    r = json_line(launch(2, os.path.join(HERE, "mpi", "threads.py"), threads=2, cores=2))
    assert r["threads"] == [2, 2]
    assert "set by BLASNET_NUM_THREADS" in r["text"][0]
    w0, w1 = r["warnings"]
    assert w1 == "" and w0.count("\n") == 1 and w0.startswith("warning: ")
    assert "BLASNET_NUM_THREADS" in w0 and "exceed its 2 cores" in w0


@pytest.mark.parametrize("cores, ranks, want", [(2, 2, 1), (8, 3, 2), (64, 8, 8), (1, 4, 1),
                                                (3, 1, 3)])
def test_threads_per_rank_default_is_cores_over_ranks(cores, ranks, want):
    # Check that without a count set each rank takes floor(cores / ranks on the host) threads
    # (at least 1), says so, and warns of nothing.
    n, reason, warning = D.threads_per_rank(cores, ranks)
    assert n == want and warning is None
    assert f"({cores} cores / {ranks} ranks on this host)" in reason
    assert reason.startswith(f"{want} BLAS thread{'s' if want > 1 else ''} per rank")


def test_threads_per_rank_explicit_count_is_kept():
    # Check that a count set on purpose wins over the share, naming what set it, with no
    # warning while threads x ranks fit the cores.
    assert D.threads_per_rank(8, 2, 3, "--threads") == (
        3, "3 BLAS threads per rank (set by --threads)", None)


def test_threads_per_rank_warns_when_explicit_count_oversubscribes():
    # Check that an explicit count whose threads x ranks exceed the cores is kept, with a
    # one-line warning naming the setting and the count that would fit.
    n, _, warning = D.threads_per_rank(4, 2, 4, "BLASNET_NUM_THREADS")
    assert n == 4 and "\n" not in warning
    assert "BLASNET_NUM_THREADS" in warning and "exceed its 4 cores" in warning
    assert "2 per rank would fit" in warning


@pytest.mark.parametrize("args, kind", [((0, 2), ValueError), ((2, 0), ValueError),
                                        ((2, 2, 0), ValueError), ((2.0, 2), TypeError)])
def test_threads_per_rank_rejects_bad_counts(args, kind):
    # Check that a count below 1 or not an integer is refused, naming the argument.
    with pytest.raises(kind, match=r"cores|ranks_on_host|explicit"):
        D.threads_per_rank(*args)


def test_set_threads_on_one_process_sets_the_count():
    # Check that without a communicator set_threads is kernels.set_num_threads (when given)
    # and says the count.
    before = kernels.get_num_threads()
    try:
        assert D.set_threads(None, 1) == "1 BLAS thread(s)"
        assert kernels.get_num_threads() == 1
    finally:
        kernels.set_num_threads(before)


# ----------------------------------------------------------------------------- without MPI
def test_world_is_none_without_a_launcher(monkeypatch):
    # Check that a process not started by mpiexec is no MPI world (the CLI trains as before).
    for var in ("PMI_SIZE", "OMPI_COMM_WORLD_SIZE", "PMIX_RANK"):
        monkeypatch.delenv(var, raising=False)
    assert D.launched_size() == 1
    assert D.world() is None


def test_launched_size_reads_the_launcher(monkeypatch):
    # Check that the job size comes from MPICH's or Open MPI's environment.
    monkeypatch.delenv("PMI_SIZE", raising=False)
    monkeypatch.setenv("OMPI_COMM_WORLD_SIZE", "4")
    assert D.launched_size() == 4
    monkeypatch.setenv("PMI_SIZE", "3")
    assert D.launched_size() == 3


def test_missing_extra_says_how_to_install(monkeypatch):
    # Check that without mpi4py the API raises ImportError naming the extra to install.
    monkeypatch.setattr(D.runtime, "_MPI", None)  # the module that caches it
    monkeypatch.setitem(sys.modules, "mpi4py", None)
    with pytest.raises(ImportError, match=r"blasnet\[mpi\]"):
        D.mpi()


# ----------------------------------------------------------------------------- bench
@needs_mpi
def test_bench_gpt_case_runs(tmp_path):
    # Check that bench/distributed.py's GPT case (1 process x 2 threads against 2 ranks x 1
    # thread, the scaling model) runs and writes consistent figures (no timing asserted).
    out = tmp_path / "d.json"
    env = dict(os.environ, PYTHONPATH=ROOT)
    proc = subprocess.run([sys.executable, os.path.join(ROOT, "bench", "distributed.py"),
                           "--only", "gpt", "--quick", "--steps", "1", "--out", str(out)],
                          cwd=ROOT, env=env, capture_output=True, text=True, timeout=TIMEOUT)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
    g = json.loads(out.read_text())["gpt"]
    one, two = g["one_process"], g["two_ranks"]
    two_threads = min(2, usable_cores())  # BLASNET_NUM_THREADS=2, capped at the cores
    assert (one["ranks"], one["threads"], two["ranks"], two["threads"]) == (1, two_threads, 2, 1)
    assert one["chars_per_s"] > 0 and two["chars_per_s"] > 0
    assert g["ratio"] == pytest.approx(two["chars_per_s"] / one["chars_per_s"])
    assert [r["K"] for r in g["projections"]] == [8, 16, 32, 64]
    # ZeRO-1 runs 1/K of the optimizer: its weak-scaling figure passes 1 when the optimizer
    # time it saves, o (1 - 1/K), exceeds the all-reduce's (a measured AdamW step on a busy
    # host can); the plain one cannot.
    assert all(0 < r["weak_plain"] <= min(r["weak_zero1"], 1) for r in g["projections"])
    assert "RECIPE GPT" in proc.stdout

"""MPI itself for engine.distributed: loading mpi4py, the launcher's environment, the
communicator argument, the BLAS threads of each rank, per-rank random streams, and the
agreement step every collective begins with (a rank that raised takes part with its error,
so no rank waits forever)."""
from __future__ import annotations

import os
import sys
import time

import numpy as np

from .._checks import check_int

__all__ = ["INSTALL", "RankError", "mpi", "launched_size", "world", "communicator", "rank_rng",
           "threads_per_rank", "set_threads", "AGREE_LEN", "agree", "agree_equal", "mark_all_ranks", "raised_on_every_rank"]

INSTALL = "pip install 'blasnet[mpi]' (mpi4py and the mpich wheel, which brings mpiexec)"

# The launchers' environment: MPICH's hydra (and Slurm's PMI-2) set PMI_SIZE, Open MPI
# sets OMPI_COMM_WORLD_SIZE; PMIx launchers set PMIX_RANK but no size.
_SIZE_VARS = ("PMI_SIZE", "OMPI_COMM_WORLD_SIZE")
AGREE_LEN = 4  # float64 slots of every agreement: [failed ranks, payload x 3]

_MPI = None


class RankError(RuntimeError):
    """Another rank raised: every rank stops with its message. ``rank`` is the first rank
    that failed, ``error`` its ``"Type: message"``."""

    def __init__(self, message: str, rank: int, error: str):
        super().__init__(message)
        self.rank, self.error = rank, error
        self._all_ranks = True


# ----------------------------------------------------------------------------- MPI itself
def mpi():
    """The ``mpi4py.MPI`` module (MPI is initialised on first use), or ImportError saying
    how to install it. When the job has more than one rank, an exception that escapes to
    the top level of a rank then aborts the whole job (as ``python -m mpi4py`` does): the
    other ranks would otherwise wait in their next collective forever."""
    global _MPI
    if _MPI is None:
        try:
            import mpi4py
        except ImportError:
            raise ImportError(f"engine.distributed needs mpi4py and an MPI library: "
                              f"{INSTALL}") from None
        if "mpi4py.MPI" not in sys.modules:
            mpi4py.rc.thread_level = "funneled"  # only the main thread calls MPI
        try:
            from mpi4py import MPI
        except ImportError as e:  # mpi4py without a loadable MPI library
            raise ImportError(f"mpi4py could not load an MPI library ({e}): {INSTALL}") from None
        _MPI = MPI
        if MPI.COMM_WORLD.Get_size() > 1:
            _install_excepthook(MPI)
    return _MPI


def _install_excepthook(MPI) -> None:
    previous = sys.excepthook

    def hook(tp, value, tb):
        previous(tp, value, tb)
        if raised_on_every_rank(value):
            return  # every rank raised it together: a normal exit, no abort needed
        world = MPI.COMM_WORLD
        sys.stderr.write(f"rank {world.Get_rank()} of {world.Get_size()}: uncaught "
                         f"{tp.__name__}; aborting the MPI job\n")
        sys.stdout.flush()
        sys.stderr.flush()
        time.sleep(0.2)  # MPI_Abort ends the job at once: let the launcher forward the text
        world.Abort(1)

    sys.excepthook = hook


def launched_size() -> int | None:
    """How many processes the MPI launcher (``mpiexec``, ``srun``) started, read from its
    environment without loading MPI: 1 when this process was not started by a launcher,
    None when the launcher does not say (PMIx)."""
    for var in _SIZE_VARS:
        v = os.environ.get(var)
        if v and v.isdigit():
            return int(v)
    return None if "PMIX_RANK" in os.environ else 1


def world(warn=sys.stderr):
    """``MPI.COMM_WORLD`` when this process is one of K > 1 ranks started by an MPI
    launcher, else None (MPI is not even loaded). Started by a launcher without mpi4py
    installed: None, and a line saying so is written to ``warn`` (unless None)."""
    n = launched_size()
    if n == 1:
        return None
    try:
        MPI = mpi()
    except ImportError as e:
        if warn is not None:
            warn.write(f"warning: started by an MPI launcher ({n or 'several'} processes) but "
                       f"{e}; every process trains alone\n")
        return None
    comm = MPI.COMM_WORLD
    return comm if comm.Get_size() > 1 else None


def communicator(comm):
    if comm is None:
        return mpi().COMM_WORLD
    if not isinstance(comm, mpi().Comm):
        raise TypeError(f"comm: expected an MPI communicator (mpi4py.MPI.Comm), got "
                        f"{type(comm).__name__}")
    return comm


# ----------------------------------------------------------------------------- threads
def threads_per_rank(cores: int, ranks_on_host: int, explicit=None, source: str = "--threads"):
    """``(threads, reason, warning)`` for one of ``ranks_on_host`` ranks sharing ``cores``:
    ``explicit`` (a count set by ``source``) if given, else ``max(1, cores // ranks_on_host)``
    (each rank its share of the cores: K ranks of every core would run K threads per core,
    about 7x slower for a small GPT on 2 cores). ``warning`` is a line when an explicit count
    makes the threads of the host's ranks exceed its cores, else None."""
    cores, ranks_on_host = check_int("cores", cores, 1), check_int("ranks_on_host", ranks_on_host, 1)
    if explicit is None:
        n = max(1, cores // ranks_on_host)
        reason = f"{cores} cores / {ranks_on_host} ranks on this host"
    else:
        n, reason = check_int("explicit", explicit, 1), f"set by {source}"
    per = f"{n} BLAS thread{'s' if n > 1 else ''} per rank"
    fits, warning = max(1, cores // ranks_on_host), None
    if explicit is not None and n > fits:
        warning = (f"warning: {per} x {ranks_on_host} ranks on this host exceed its {cores} "
                   f"cores ({reason}): the threads wait on each other; {fits} per rank "
                   f"would fit")
    elif explicit is not None and n * ranks_on_host > cores:
        warning = (f"warning: {ranks_on_host} ranks on this host exceed its {cores} cores "
                   f"({per}, {reason}): the ranks wait on each other")
    return n, f"{per} ({reason})", warning


_RANK_THREADS = {}  # the choice of set_threads, made once per process: "threads", "reason"


def set_threads(comm, threads=None, source: str = "--threads", warn=sys.stderr) -> str:
    """Set this process's BLAS threads for a run on ``comm`` and return the banner's text.

    One process (``comm`` None or of one rank): ``threads`` if given. K > 1 ranks
    (collective: every rank calls it): ``threads_per_rank`` of the cores this process may
    use and the ranks on its host (counted by MPI, ``COMM_TYPE_SHARED``), where the count
    set on purpose is ``threads`` (from ``source``), else ``BLASNET_NUM_THREADS`` or
    ``kernels.set_num_threads``. Made once per process: later calls (``DataParallel``, after
    the CLI) keep it. Rank 0 writes the oversubscription warning to ``warn``."""
    from kernels import threads as kt
    if threads is not None:
        threads = check_int("threads", threads, 1)
    size = 1 if comm is None else comm.Get_size()
    if size == 1:
        if threads is not None:
            kt.set_num_threads(threads)
        return f"{kt.get_num_threads()} BLAS thread(s)"
    if not _RANK_THREADS:
        shared = comm.Split_type(mpi().COMM_TYPE_SHARED)
        on_host = shared.Get_size()
        shared.Free()
        chosen = kt.explicit_threads() if threads is None else (threads, source)
        n, reason, warning = threads_per_rank(kt.usable_cores(), on_host,
                                              *(chosen or (None,)))
        kt.set_num_threads(n)
        _RANK_THREADS.update(threads=n, reason=reason)
        if warning is not None and warn is not None and comm.Get_rank() == 0:
            warn.write(warning + "\n")
    return f"{size} MPI ranks x {_RANK_THREADS['reason']}"


def rank_rng(seed: int, comm=None, out=None) -> np.random.Generator:
    """A Generator for this rank's own stream, derived from ``seed`` and the rank
    (``SeedSequence(seed, spawn_key=(rank,))``): dropout masks drawn from it differ across
    ranks and are reproducible. With ``out`` (the Generator a model was built with) that
    Generator is switched to the stream in place, so the model's dropout layers draw from
    it; ``out`` is returned."""
    check_int("seed", seed, 0)
    rank = communicator(comm).Get_rank()
    seq = np.random.SeedSequence(int(seed), spawn_key=(rank,))
    if out is None:
        return np.random.Generator(np.random.PCG64(seq))
    if not isinstance(out, np.random.Generator):
        raise TypeError(f"out: expected a numpy.random.Generator, got {type(out).__name__}")
    out.bit_generator.state = type(out.bit_generator)(seq).state
    return out


# ----------------------------------------------------------------------------- agreement
def mark_all_ranks(error: BaseException) -> BaseException:
    """Mark ``error`` as raised on every rank together (returned): a rank that catches it
    need not tell the others, and the top-level hook does not abort the job for it."""
    error._all_ranks = True
    return error


def raised_on_every_rank(error: BaseException) -> bool:
    """Whether ``error`` was marked by ``mark_all_ranks`` (or is a ``RankError``)."""
    return getattr(error, "_all_ranks", False)


def _describe(e: BaseException) -> str:
    return f"{type(e).__name__}: {e}"


def agree(comm, error: BaseException | None = None, payload=(), out=None) -> np.ndarray:
    """One collective step of every rank: sums ``payload`` (up to 3 numbers) over the ranks
    and returns the sums. If any rank passes an ``error``, every rank learns each failing
    rank's message; the failing ranks return (their caller re-raises its own error, marked
    as raised on every rank) and the others raise ``RankError`` naming the first of them."""
    buf = np.zeros(AGREE_LEN) if out is None else out  # (4,) float64 [failed, payload]
    buf[0] = 1.0 if error is not None else 0.0
    buf[1:] = 0.0
    buf[1:1 + len(payload)] = payload
    comm.Allreduce(mpi().IN_PLACE, buf)
    if buf[0] == 0.0:
        return buf[1:]
    messages = comm.allgather(None if error is None else _describe(error))
    if error is not None:
        mark_all_ranks(error)
        return buf[1:]
    rank = next(r for r, m in enumerate(messages) if m is not None)
    failed = sum(m is not None for m in messages)
    more = f" ({failed} ranks failed)" if failed > 1 else ""
    raise RankError(f"rank {rank} of {len(messages)} raised {messages[rank]}{more}",
                    rank, messages[rank])


def agree_equal(comm, what: str, value) -> None:
    """Raise ValueError on every rank when ``value`` (a list of ``(key, item)`` pairs) is
    not the same on every rank, naming the first key where a rank differs from rank 0."""
    values = comm.allgather(value)
    for r, v in enumerate(values[1:], 1):
        if v == values[0]:
            continue
        for (k0, a), (k1, b) in zip(values[0], v):
            if k0 != k1 or a != b:
                e = ValueError(f"ranks disagree on {what}: rank {r} has {k1} = {b!r}, rank 0 "
                               f"has {k0} = {a!r}")
                break
        else:
            e = ValueError(f"ranks disagree on {what}: rank {r} has {len(v)} entries, rank 0 "
                           f"has {len(values[0])}")
        raise mark_all_ranks(e)


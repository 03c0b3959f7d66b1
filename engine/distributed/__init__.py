"""Data-parallel training over MPI (mpi4py with MPICH: the optional extra ``mpi``).

Every rank holds the whole model. ``DataParallel`` broadcasts rank 0's parameters at the
start, and after each backward sums the ranks' flat gradient vectors in place with one
``Allreduce``; every rank then runs the same optimizer step, so the parameters stay the same
bits everywhere. ``ShardedAdamW`` is ZeRO stage 1 (Rajbhandari et al. 2020): a
``Reduce_scatter`` of the gradient vector, AdamW on this rank's 1/K slice of the arena (the
moments of that slice only), an ``Allgatherv`` of the parameters. ``fit(..., comm=...)``
shards each global batch over the ranks (``DataParallel.share``).

Faults never hang: every collective step begins with a small agreement ``Allreduce`` in which
a rank that raised takes part with its error flag, so every rank stops with that rank's
message; an exception that escapes to the top level of a rank aborts the job.
"""
from __future__ import annotations

import os
import sys
import time
import zlib

import numpy as np

from kernels import ops
from kernels.memory import aligned_empty
from kernels.optim import adamw_consts

from .._checks import check_int
from ..nn.arena import LAYOUT_VERSION
from ..nn.module import Module, check_float, make_rng, runs
from ..optim.optimizers import (AdamW, Optimizer, check_optimizer_of, clip_grad_norm,
                               defer_keyboard_interrupt)

__all__ = ["DataParallel", "ShardedAdamW", "RankError", "mpi", "world", "launched_size",
           "rank_rng", "save", "load", "INSTALL"]

INSTALL = "pip install 'blasnet[mpi]' (mpi4py and the mpich wheel, which brings mpiexec)"

# The launchers' environment: MPICH's hydra (and Slurm's PMI-2) set PMI_SIZE, Open MPI
# sets OMPI_COMM_WORLD_SIZE; PMIx launchers set PMIX_RANK but no size.
_SIZE_VARS = ("PMI_SIZE", "OMPI_COMM_WORLD_SIZE")
_AGREE_LEN = 4  # float64 slots of every agreement: [failed ranks, payload x 3]

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
        if getattr(value, "_all_ranks", False):
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


def _comm(comm):
    if comm is None:
        return mpi().COMM_WORLD
    if not isinstance(comm, mpi().Comm):
        raise TypeError(f"comm: expected an MPI communicator (mpi4py.MPI.Comm), got "
                        f"{type(comm).__name__}")
    return comm


def rank_rng(seed: int, comm=None, out=None) -> np.random.Generator:
    """A Generator for this rank's own stream, derived from ``seed`` and the rank
    (``SeedSequence(seed, spawn_key=(rank,))``): dropout masks drawn from it differ across
    ranks and are reproducible. With ``out`` (the Generator a model was built with) that
    Generator is switched to the stream in place, so the model's dropout layers draw from
    it; ``out`` is returned."""
    check_int("seed", seed, 0)
    rank = _comm(comm).Get_rank()
    seq = np.random.SeedSequence(int(seed), spawn_key=(rank,))
    if out is None:
        return np.random.Generator(np.random.PCG64(seq))
    if not isinstance(out, np.random.Generator):
        raise TypeError(f"out: expected a numpy.random.Generator, got {type(out).__name__}")
    out.bit_generator.state = type(out.bit_generator)(seq).state
    return out


# ----------------------------------------------------------------------------- agreement
def _describe(e: BaseException) -> str:
    return f"{type(e).__name__}: {e}"


def _agree(comm, error: BaseException | None = None, payload=(), out=None) -> np.ndarray:
    """One collective step of every rank: sums ``payload`` (up to 3 numbers) over the ranks
    and returns the sums. If any rank passes an ``error``, every rank learns each failing
    rank's message; the failing ranks return (their caller re-raises its own error, marked
    as raised on every rank) and the others raise ``RankError`` naming the first of them."""
    buf = np.zeros(_AGREE_LEN) if out is None else out  # (4,) float64 [failed, payload]
    buf[0] = 1.0 if error is not None else 0.0
    buf[1:] = 0.0
    buf[1:1 + len(payload)] = payload
    comm.Allreduce(mpi().IN_PLACE, buf)
    if buf[0] == 0.0:
        return buf[1:]
    messages = comm.allgather(None if error is None else _describe(error))
    if error is not None:
        error._all_ranks = True
        return buf[1:]
    rank = next(r for r, m in enumerate(messages) if m is not None)
    failed = sum(m is not None for m in messages)
    more = f" ({failed} ranks failed)" if failed > 1 else ""
    raise RankError(f"rank {rank} of {len(messages)} raised {messages[rank]}{more}",
                    rank, messages[rank])


def _agree_equal(comm, what: str, value) -> None:
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
        e._all_ranks = True
        raise e


# ----------------------------------------------------------------------------- DataParallel
class DataParallel:
    """``model`` and ``optimizer`` trained on ``comm`` (default ``MPI.COMM_WORLD``).

    At construction (collective): checks that every rank has the same model (parameter
    names, shapes, dtypes) and optimizer (type, step count, options), raising ValueError on
    every rank otherwise, then broadcasts rank 0's parameters. Each step, after backward:
    ``step(weight)`` = ``reduce_gradients(weight)``, ``optimizer.step()``,
    ``model.zero_grad()``. ``share(start, stop)`` gives this rank's rows of a global batch.

    ``optimizer`` may be a ``ShardedAdamW`` on the same communicator (ZeRO stage 1): the
    reduction is then its ``Reduce_scatter``.
    """

    def __init__(self, model, optimizer, comm=None):
        comm = _comm(comm)
        self.comm, self.rank, self.size = comm, comm.Get_rank(), comm.Get_size()
        self._buf = np.zeros(_AGREE_LEN)  # (4,) the agreement vector
        error, sig = None, None
        try:
            if not isinstance(model, Module):
                raise TypeError(f"model: expected an engine Module, got {type(model).__name__}")
            for name in ("step", "zero_grad", "param_groups"):
                if not hasattr(optimizer, name):
                    raise TypeError(f"optimizer: expected an engine optimizer, got "
                                    f"{type(optimizer).__name__}")
            if isinstance(optimizer, Optimizer):  # one that steps other parameters: refused
                check_optimizer_of(optimizer, model)
            flat = model.flat_params()  # RuntimeError for parameters of mixed dtypes
            if isinstance(optimizer, ShardedAdamW):
                if optimizer.flat_range() != _flat_range(model):
                    raise ValueError("optimizer: a ShardedAdamW must hold every parameter of "
                                     "the model (the shards split the model's flat vector)")
                if optimizer.comm.Get_size() != self.size:
                    raise ValueError(f"optimizer: its communicator has {optimizer.comm.Get_size()}"
                                     f" ranks, comm has {self.size}")
            sig = _signature(model, optimizer)
        except Exception as e:
            error = e
        _agree(comm, error, out=self._buf)
        if error is not None:
            raise error
        _agree_equal(comm, "the model or optimizer", sig)
        self.model, self.optimizer = model, optimizer
        self.sharded = isinstance(optimizer, ShardedAdamW)
        if self.size > 1:
            comm.Bcast(flat, root=0)

    # -- the batch ------------------------------------------------------------------------
    def share(self, start: int, stop: int) -> tuple:
        """This rank's rows ``(lo, hi)`` of the global batch ``[start, stop)``: contiguous
        slices in rank order whose sizes differ by at most one (the first ranks get the
        extra rows)."""
        q, rem = divmod(stop - start, self.size)
        lo = start + self.rank * q + min(self.rank, rem)
        return lo, lo + q + (self.rank < rem)

    # -- collective steps -------------------------------------------------------------------
    def reduce_gradients(self, weight=None) -> None:
        """Replace the local gradients by the average over the ranks: ``weight=None`` for
        equal shares (sum, then divide by K), else this rank's share of the global batch
        (``rows / global rows``: the weighted sum equals one process on the whole batch).
        With a ``ShardedAdamW`` only this rank's shard is reduced (its ``step`` uses it)."""
        _agree(self.comm, out=self._buf)
        if self.sharded:
            self.optimizer.reduce_gradients(weight)
            return
        g = self.model.flat_grads()
        if weight is not None:
            g *= weight
        if self.size > 1:
            self.comm.Allreduce(mpi().IN_PLACE, g)
        if weight is None and self.size > 1:
            g *= 1.0 / self.size

    def clip_grad_norm(self, max_norm: float) -> float:
        """``engine.clip_grad_norm`` of the averaged gradient (call after
        ``reduce_gradients``): the same norm and scaling on every rank; with a
        ``ShardedAdamW`` the norm is summed from the ranks' reduced slices."""
        if self.sharded:
            return self.optimizer.clip_grad_norm(max_norm)
        return clip_grad_norm(self.model.parameters(), max_norm)

    def step(self, weight=None) -> None:
        """``reduce_gradients(weight)``, ``optimizer.step()``, ``model.zero_grad()``."""
        if weight is not None:  # before the collective: every rank refuses the same call
            weight = check_float("weight", weight, 0.0, low_open=True)
        self.reduce_gradients(weight)
        self.optimizer.step()
        self.model.zero_grad()

    def allsum(self, *values) -> tuple:
        """The sums of up to three numbers over the ranks (an agreement step)."""
        if len(values) > _AGREE_LEN - 1:
            raise ValueError(f"values: at most {_AGREE_LEN - 1} numbers, got {len(values)}")
        sums = _agree(self.comm, payload=values, out=self._buf)
        return tuple(float(s) for s in sums[:len(values)])

    def batch_loss(self, value: float, rows: int) -> tuple:
        """``(global mean loss, global rows)`` from this rank's mean ``value`` over its
        ``rows`` (an agreement step: the same numbers on every rank)."""
        total, n = self.allsum(value * rows, rows)
        return total / n, int(n)

    def fail(self, error: BaseException) -> None:
        """Called by a rank that raised ``error`` between collective steps: takes part in
        the other ranks' next agreement, so they stop with its message instead of waiting.
        Returns (the caller re-raises ``error``) unless ``error`` was raised on every rank
        already."""
        if getattr(error, "_all_ranks", False):
            return
        _agree(self.comm, error, out=self._buf)

    def finish(self) -> None:
        """The last agreement of a run: a rank that fails after every other collective
        step still finds the others here."""
        _agree(self.comm, out=self._buf)


def _flat_range(model):
    """``(id(arena), lo, hi)`` of a module's flat parameter vector."""
    r = runs(model.parameters())
    return (id(r[0][0]), r[0][1], r[-1][2]) if len(r) == 1 else None


def _signature(model, optimizer) -> list:
    """What must be the same on every rank, as ``(key, value)`` pairs."""
    sig = [("model", type(model).__name__)]
    names = {id(p): n for n, p in model.named_parameters()}
    for n, p in model.named_parameters():
        sig.append((f"parameter {n}", (tuple(p.shape), str(p.dtype))))
    sig.append(("optimizer", type(optimizer).__name__))
    sig.append(("optimizer steps", int(getattr(optimizer, "steps", 0))))
    for gi, g in enumerate(optimizer.param_groups):
        opts = {k: (tuple(v) if isinstance(v, list) else v) for k, v in g.items() if k != "params"}
        sig.append((f"optimizer group {gi}",
                    (tuple(names.get(id(p), "?") for p in g["params"]), sorted(opts.items()))))
    return sig


# ----------------------------------------------------------------------------- ZeRO-1
class ShardedAdamW(AdamW):
    """AdamW sharded over ``comm``'s ranks, ZeRO stage 1 (Rajbhandari et al. 2020): the
    flat gradient vector is summed with one ``Reduce_scatter``, each rank updates its 1/K
    slice of the parameter arena and keeps the moments of that slice only, and one
    ``Allgatherv`` gives every rank the updated parameters. Same arguments as ``AdamW``
    (parameter groups included), same results.

    ``params`` must cover one contiguous range of one arena (a model's ``parameters()``).
    ``step()`` and ``state_dict()`` are collective: every rank calls them. After a step the
    local gradient vector holds intermediate sums: ``zero_grad()`` before the next backward
    (``fit`` and ``DataParallel.step`` do). ``state_dict()`` gathers the full moments and is
    an ``AdamW`` state dict, so checkpoints move freely between sharded and plain runs.
    """

    _state_keys = ()  # AdamW's full-size moments are not allocated: this rank's slice only
    _optional_keys = ("exp_avg", "exp_avg_sq")

    def __init__(self, params, comm=None, lr: float = 1e-3, betas=(0.9, 0.999),
                 eps: float = 1e-8, weight_decay: float = 1e-2):
        super().__init__(params, lr=lr, betas=betas, eps=eps, weight_decay=weight_decay)
        comm = _comm(comm)
        self.comm, self.rank, self.size = comm, comm.Get_rank(), comm.Get_size()
        self._find_range()
        n, k = self._n, self.size
        # Shards start on 64-byte boundaries of the arena: the kernel's blocks stay aligned.
        align = max(1, 64 // self._dtype.itemsize)
        per = -(-n // k)
        per = -(-per // align) * align
        bounds = [min(r * per, n) for r in range(k + 1)]
        self._counts = [bounds[r + 1] - bounds[r] for r in range(k)]
        self._displs = bounds[:k]
        self._s0, self._s1 = bounds[self.rank], bounds[self.rank + 1]
        c = self._s1 - self._s0
        self._m = aligned_empty(c, self._dtype)  # (shard,) exp_avg of this rank's slice
        self._v = aligned_empty(c, self._dtype)  # (shard,) exp_avg_sq of this rank's slice
        self._m.fill(0.0)
        self._v.fill(0.0)
        self._reduced = False
        self._pieces, self._pieces_gen = None, -1

    def _find_range(self) -> None:
        ranges = []
        for p in self._all_params():
            a, lo, hi, _, _ = runs([p])[0]
            ranges.append((lo, hi, a))
        arenas = {id(a) for _, _, a in ranges}
        ranges.sort(key=lambda t: t[0])
        gaps = any(ranges[i][1] != ranges[i + 1][0] for i in range(len(ranges) - 1))
        if len(arenas) != 1 or gaps:
            raise ValueError("params: a ShardedAdamW needs parameters that fill one contiguous "
                             "range of one arena (pass model.parameters(), grouped as you like)")
        self._arena = ranges[0][2]
        self._lo, self._n = ranges[0][0], ranges[-1][1] - ranges[0][0]
        self._dtype = self._arena.dtype
        self._range_gen = LAYOUT_VERSION[0]

    def flat_range(self):
        """``(id(arena), lo, hi)``: the flat parameter range this optimizer shards."""
        if self._range_gen != LAYOUT_VERSION[0]:
            self._find_range()
        return (id(self._arena), self._lo, self._lo + self._n)

    def shard(self) -> tuple:
        """``(start, stop)``: this rank's slice of the flat parameter vector."""
        return self._s0, self._s1

    def state_nbytes(self) -> int:
        """Bytes of optimizer state held by this rank (the moments of its slice)."""
        return self._m.nbytes + self._v.nbytes

    def _flats(self):
        lo, hi = self.flat_range()[1:]
        return self._arena.data[lo:hi], self._arena.grad[lo:hi]

    def _shard_plan(self) -> list:
        """Per group: ``(data, grad, m, v)`` views of each run of its parameters inside this
        rank's shard; the reduced gradient of arena element ``lo + s0 + i`` is ``grad[i]``."""
        if self._pieces_gen == LAYOUT_VERSION[0]:
            return self._pieces
        self.flat_range()
        a, base, s0, s1 = self._arena, self._lo, self._s0, self._s1
        plan = []
        for g in self.param_groups:
            pieces = []
            for _, lo, hi, _, _ in runs(g["params"]):
                x0, x1 = max(lo - base, s0), min(hi - base, s1)
                if x0 < x1:
                    i0, i1 = x0 - s0, x1 - s0
                    pieces.append((a.data[base + x0:base + x1], a.grad[base + i0:base + i1],
                                   self._m[i0:i1], self._v[i0:i1]))
            plan.append(pieces)
        self._pieces, self._pieces_gen = plan, LAYOUT_VERSION[0]
        return plan

    def reduce_gradients(self, weight=None) -> None:
        """Sum the ranks' gradient vectors with one ``Reduce_scatter`` (in place: this rank's
        shard of the sum lands at the start of its gradient vector), weighted as in
        ``DataParallel.reduce_gradients``."""
        _, g = self._flats()
        if weight is not None:
            g *= weight
        if self.size > 1:
            self.comm.Reduce_scatter(mpi().IN_PLACE, g, self._counts, op=mpi().SUM)
        if weight is None and self.size > 1:
            g[:self._s1 - self._s0] *= 1.0 / self.size
        self._reduced = True

    def clip_grad_norm(self, max_norm: float) -> float:
        """Scale the reduced gradient so that the global gradient's L2 norm is at most
        ``max_norm``; return the norm before clipping (collective; as ``engine.clip_grad_norm``
        on the whole averaged gradient: each rank sums its slice's squares in double)."""
        if isinstance(max_norm, bool) or not isinstance(max_norm, (int, float, np.integer,
                                                                    np.floating)):
            raise TypeError(f"max_norm: expected a real number, got {max_norm!r}")
        if not float(max_norm) > 0.0:
            raise ValueError(f"max_norm: expected a number > 0, got {max_norm!r}")
        if not self._reduced:
            self.reduce_gradients()
        g = self._flats()[1][:self._s1 - self._s0]  # this rank's slice of the reduced sum
        (total_sq,) = _agree(self.comm, payload=(float(np.dot(g, g)),))[:1]
        total = float(np.sqrt(total_sq))
        if np.isfinite(total):
            coef = float(max_norm) / (total + 1e-6)
            if coef < 1.0:
                g *= coef
        return total

    def step(self, zero_grad: bool = False) -> None:
        """Reduce the gradients (unless ``reduce_gradients`` did), ``update_shard()``,
        ``gather_parameters()`` (collective). ``zero_grad=True`` then zeroes the local
        gradient vector. Options are checked first (every rank holds the same ones); a Ctrl-C
        during the step is delivered after it, as for ``AdamW``."""
        with defer_keyboard_interrupt():
            self._check_groups()
            if not self._reduced:
                self.reduce_gradients()
            self.update_shard()
            self.gather_parameters()
            if zero_grad:
                self._flats()[1].fill(0.0)

    def update_shard(self) -> None:
        """AdamW on this rank's slice of the parameters from its reduced gradient (one
        kernel call over the slice's runs, one per parameter group); counts the step. The
        other ranks' slices are stale until ``gather_parameters()``."""
        t = self.steps + 1
        items = []
        for g, pieces in zip(self.param_groups, self._shard_plan()):
            if pieces:
                lr, (b1, b2), eps, wd = g["lr"], g["betas"], g["eps"], g["weight_decay"]
                c = adamw_consts(self._dtype, t, lr, b1, b2, eps, wd)
                items.extend((piece, c) for piece in pieces)
        if items:
            ops.adamw(items)
        self._reduced = False
        self.steps = t

    def gather_parameters(self) -> None:
        """Every rank's updated slice to every rank: one in-place ``Allgatherv``."""
        if self.size > 1:
            data = self._flats()[0]
            self.comm.Allgatherv(mpi().IN_PLACE, [data, (self._counts, self._displs)])

    # -- checkpoints: the full AdamW state, gathered ----------------------------------------
    def _param_spans(self):
        """Per parameter (optimizer order): ``(param, lo, hi, order)`` in flat-vector
        coordinates and its memory order."""
        out = []
        for p in self._all_params():
            _, lo, hi, _, _ = runs([p])[0]
            d = p.data
            order = "F" if d.ndim > 1 and d.flags.f_contiguous and not d.flags.c_contiguous else "C"
            out.append((p, lo - self._lo, hi - self._lo, order))
        return out

    def state_dict(self) -> dict:
        """The state of the equivalent ``AdamW`` (collective: every rank gathers the
        moments of every slice and gets the same dict)."""
        self.flat_range()
        full = {}
        for key, mine in (("exp_avg", self._m), ("exp_avg_sq", self._v)):
            f = np.empty(self._n, self._dtype)  # (n,) every rank's slice, in flat order
            if self.size > 1:
                self.comm.Allgatherv(mine, [f, (self._counts, self._displs)])
            else:
                f[:] = mine
            full[key] = f
        state = {}
        for i, (p, lo, hi, order) in enumerate(self._param_spans()):
            state[i] = {k: f[lo:hi].reshape(p.shape, order=order).copy() for k, f in full.items()}
        sd = super().state_dict()  # options and groups; its state is empty here
        sd["type"], sd["state"] = "AdamW", state
        return sd

    def validate_state_dict(self, sd):
        if isinstance(sd, dict) and sd.get("type") == "AdamW":
            sd = dict(sd, type=type(self).__name__)  # AdamW checkpoints load as they are
        return super().validate_state_dict(sd)

    def apply_state(self, checked) -> None:
        steps, options, state = checked
        for group, opts in zip(self.param_groups, options):
            group.update(opts)
        self.flat_range()
        s0, s1 = self._s0, self._s1
        for (p, lo, hi, order), st in zip(self._param_spans(), state):
            x0, x1 = max(lo, s0), min(hi, s1)
            if x0 >= x1:
                continue
            for key, mine in (("exp_avg", self._m), ("exp_avg_sq", self._v)):
                v = st.get(key)
                if v is None:
                    mine[x0 - s0:x1 - s0] = 0.0
                else:
                    mine[x0 - s0:x1 - s0] = np.ravel(v, order=order)[x0 - lo:x1 - lo]
        self.steps = steps


# ----------------------------------------------------------------------------- fit
def fit_setup(comm, model, optimizer, X, Y, *, epochs, batch_size, shuffle, rng):
    """The ``DataParallel`` of ``fit(..., comm=comm)`` after checking (collectively) that
    every rank trains on the same data with the same settings and shuffling Generator, and
    that every global batch has at least one row per rank."""
    dp = DataParallel(model, optimizer, comm)
    gen = make_rng(rng)
    sig = [("X (shape, dtype, CRC-32 of the values)", (X.shape, str(X.dtype), _crc(X))),
           ("Y (shape, dtype, CRC-32 of the values)", (Y.shape, str(Y.dtype), _crc(Y))),
           ("epochs", epochs), ("batch_size", batch_size), ("shuffle", bool(shuffle)),
           ("the shuffling Generator's state", zlib.crc32(repr(gen.bit_generator.state).encode()))]
    _agree_equal(dp.comm, "the training run", sig)
    n, k = X.shape[0], dp.size
    last = n % batch_size or batch_size
    if min(batch_size, last) < k:
        e = ValueError(f"batch_size: every global batch needs at least one sample per rank "
                       f"({k} ranks); batches of {batch_size} over {n} samples leave a batch "
                       f"of {min(batch_size, last)}")
        e._all_ranks = True
        raise e
    return dp


def _crc(a) -> int:
    """A checksum of an array's values (its bytes in C order)."""
    return zlib.crc32(memoryview(np.ascontiguousarray(a)).cast("B"))


# ----------------------------------------------------------------------------- checkpoints
class _SavedState:
    """An optimizer's state dict, gathered beforehand, for ``checkpoint.save``."""

    def __init__(self, sd):
        self._sd = sd

    def state_dict(self):
        return self._sd


def save(path, model, /, optimizer=None, scheduler=None, *, comm=None, **metadata) -> None:
    """``engine.save`` for a data-parallel run (collective: every rank calls it, and a
    ``ShardedAdamW`` gathers its state first): rank 0 writes the file (atomically); an error
    on rank 0 is raised on every rank."""
    from ..training import checkpoint
    comm = _comm(comm)
    _agree(comm)
    sd = optimizer.state_dict() if optimizer is not None else None  # collective if sharded
    error = None
    if comm.Get_rank() == 0:
        try:
            checkpoint.save(path, model, None if sd is None else _SavedState(sd),
                            scheduler=scheduler, **metadata)
        except Exception as e:
            error = e
    _agree(comm, error)
    if error is not None:
        raise error


def load(path, model, optimizer=None, scheduler=None, *, comm=None) -> dict:
    """``engine.load`` on every rank (collective: each reads ``path``); an error on any
    rank is raised on every rank (a rank whose own load failed changed nothing)."""
    from ..training import checkpoint
    comm = _comm(comm)
    _agree(comm)
    error, meta = None, None
    try:
        meta = checkpoint.load(path, model, optimizer, scheduler)
    except Exception as e:
        error = e
    _agree(comm, error)
    if error is not None:
        raise error
    return meta


class FitRanks:
    """The ranks of ``comm`` as ``fit`` sees them (the interface of
    ``engine.training.parallel.SingleProcess``): the argument checks run on every rank and
    every rank learns whether any rejected its arguments (none waits alone); ``start`` is
    ``fit_setup``."""

    def __init__(self, comm):
        _comm(comm)  # a TypeError naming comm, before it is used to agree on anything
        self.comm = comm

    def checked(self, check):
        error = result = None
        try:
            result = check()
        except (TypeError, ValueError) as e:
            error = e
        _agree(self.comm, error)
        if error is not None:
            raise error
        return result

    def start(self, model, optimizer, X, Y, plan) -> DataParallel:
        return fit_setup(self.comm, model, optimizer, X, Y, epochs=plan.epochs,
                         batch_size=plan.batch_size, shuffle=plan.shuffle, rng=plan.rng)

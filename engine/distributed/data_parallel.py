"""``DataParallel``: a model and its optimizer trained on the ranks of a communicator (one
in-place ``Allreduce`` of the flat gradient vector per step), and what ``fit(..., comm=...)``
checks and builds on every rank (``fit_setup``, ``FitRanks``)."""
from __future__ import annotations

import zlib

import numpy as np

from ..nn.module import Module, check_float, make_rng, runs
from ..optim.optimizers import Optimizer, check_optimizer_of, clip_grad_norm
from .runtime import (AGREE_LEN, agree, agree_equal, communicator, mpi, raised_on_every_rank,
                      set_threads)
from .buckets import GradientBuckets, gradient_buckets
from .sharded import ShardedAdamW

__all__ = ["DataParallel", "fit_setup", "FitRanks"]


# ----------------------------------------------------------------------------- DataParallel
class DataParallel:
    """``model`` and ``optimizer`` trained on ``comm`` (default ``MPI.COMM_WORLD``).

    At construction (collective): checks that every rank has the same model (parameter
    names, shapes, dtypes) and optimizer (type, step count, options), raising ValueError on
    every rank otherwise, sets each rank's BLAS threads (``set_threads``: its share of the
    host's cores unless a count was set on purpose), then broadcasts rank 0's parameters.
    Each step, after backward: ``step(weight)`` = ``reduce_gradients(weight)``,
    ``optimizer.step()``, ``model.zero_grad()``. ``share(start, stop)`` gives this rank's rows of a global batch
    (none when it has fewer rows than ranks: that rank's gradient is zero and it still takes
    part in the reduction, with weight 0).

    ``optimizer`` may be a ``ShardedAdamW`` on the same communicator (ZeRO stage 1): the
    reduction is then its ``Reduce_scatter``.

    ``buckets`` (default: ``set_gradient_buckets``'s setting, 2^19): > 0 reduces
    the gradients in buckets of at least that many elements, each launched during the
    backward as soon as it is complete, when ``begin_backward(weight)`` was called before
    the backward (``fit`` does); the same bits as one reduction after the backward at two
    ranks. ``bucket_reducer``: the ``GradientBuckets`` (None without).
    """

    def __init__(self, model, optimizer, comm=None, *, buckets=None):
        comm = communicator(comm)
        self.comm, self.rank, self.size = comm, comm.Get_rank(), comm.Get_size()
        self._buf = np.zeros(AGREE_LEN)  # (4,) the agreement vector
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
            elements, poll = gradient_buckets()
            if buckets is not None:
                if isinstance(buckets, bool) or not isinstance(buckets, (int, np.integer)) \
                        or buckets < 0:
                    raise ValueError(f"buckets: expected an int >= 0 (elements per bucket; 0: "
                                     f"one reduction after the backward), got {buckets!r}")
                elements = int(buckets)
            sig = _signature(model, optimizer) + [("gradient buckets", (elements, poll))]
        except Exception as e:
            error = e
        agree(comm, error, out=self._buf)
        if error is not None:
            raise error
        agree_equal(comm, "the model or optimizer", sig)
        self.model, self.optimizer = model, optimizer
        self.sharded = isinstance(optimizer, ShardedAdamW)
        self.bucket_reducer = None
        if self.size > 1:
            set_threads(comm)  # once per process: keeps what the CLI or the user chose
            comm.Bcast(flat, root=0)
            if elements:
                shards = optimizer.shards() if self.sharded else None
                self.bucket_reducer = GradientBuckets(model, comm, elements, poll, shards)

    # -- the batch ------------------------------------------------------------------------
    def share(self, start: int, stop: int) -> tuple:
        """This rank's rows ``(lo, hi)`` of the global batch ``[start, stop)``: contiguous
        slices in rank order whose sizes differ by at most one (the first ranks get the
        extra rows; with fewer rows than ranks the last ranks get none, ``lo == hi``)."""
        q, rem = divmod(stop - start, self.size)
        lo = start + self.rank * q + min(self.rank, rem)
        return lo, lo + q + (self.rank < rem)

    # -- collective steps -------------------------------------------------------------------
    def begin_backward(self, weight=None) -> None:
        """Before the backward of a step whose ``reduce_gradients(weight)`` follows (the same
        ``weight``): with gradient buckets, each bucket's reduction starts as soon as the
        backward has finished it. Without buckets nothing happens."""
        if self.bucket_reducer is not None:
            self.bucket_reducer.begin(weight)

    def reduce_gradients(self, weight=None) -> None:
        """Replace the local gradients by the average over the ranks: ``weight=None`` for
        equal shares (sum, then divide by K), else this rank's share of the global batch
        (``rows / global rows``: the weighted sum equals one process on the whole batch; 0 for
        a rank without rows, which still takes part).
        With a ``ShardedAdamW`` only this rank's shard is reduced (its ``step`` uses it)."""
        agree(self.comm, out=self._buf)
        if self.bucket_reducer is not None and self.bucket_reducer.armed:
            self.bucket_reducer.finish(weight)
            if self.sharded:  # each slice's sum is at its own place of its owner's vector
                self.optimizer.take_reduced(weight)
            elif weight is None:
                self.model.flat_grads()[:] *= 1.0 / self.size
            return
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
            weight = check_float("weight", weight, 0.0)
        self.reduce_gradients(weight)
        self.optimizer.step()
        self.model.zero_grad()

    def allsum(self, *values) -> tuple:
        """The sums of up to three numbers over the ranks (an agreement step)."""
        if len(values) > AGREE_LEN - 1:
            raise ValueError(f"values: at most {AGREE_LEN - 1} numbers, got {len(values)}")
        sums = agree(self.comm, payload=values, out=self._buf)
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
        self.close()
        if raised_on_every_rank(error):
            return
        agree(self.comm, error, out=self._buf)

    def write_checkpoint(self, path, model, optimizer, scheduler, metadata, training) -> None:
        """A run's checkpoint, collective: a sharded optimizer's state is gathered on every
        rank, rank 0 writes the file (the model, schedule, Generators and History are the
        same on every rank), and an error on rank 0 is raised on every rank."""
        from .checkpoints import write
        write(path, model, optimizer, scheduler, metadata, training, comm=self.comm)

    def finish(self) -> None:
        """The last agreement of a run: a rank that fails after every other collective
        step still finds the others here; removes the gradient buckets' hooks."""
        agree(self.comm, out=self._buf)
        self.close()

    def close(self) -> None:
        """Remove the gradient buckets' hooks from the model (a later backward outside this
        run reduces nothing) and free their communicator."""
        if self.bucket_reducer is not None:
            self.bucket_reducer.close()
            self.bucket_reducer = None


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


# ----------------------------------------------------------------------------- fit
def fit_setup(comm, model, optimizer, X, Y, *, epochs, batch_size, shuffle, rng):
    """The ``DataParallel`` of ``fit(..., comm=comm)`` after checking (collectively) that
    every rank trains on the same data with the same settings and shuffling Generator. Any
    batch size works: a rank whose share of a batch is empty adds a zero gradient."""
    dp = DataParallel(model, optimizer, comm)
    gen = make_rng(rng)
    sig = [("X (shape, dtype, CRC-32 of the values)", _data_signature(X)),
           ("Y (shape, dtype, CRC-32 of the values)", _data_signature(Y)),
           ("epochs", epochs), ("batch_size", batch_size), ("shuffle", bool(shuffle)),
           ("the shuffling Generator's state", zlib.crc32(repr(gen.bit_generator.state).encode()))]
    agree_equal(dp.comm, "the training run", sig)
    return dp


def _data_signature(a):
    """An array's shape, dtype and checksum; None for an iteration-based run (its sampler's
    Generator is the run's, compared as the shuffling Generator)."""
    return None if a is None else (a.shape, str(a.dtype), _crc(a))


def _crc(a) -> int:
    """A checksum of an array's values (its bytes in C order)."""
    return zlib.crc32(memoryview(np.ascontiguousarray(a)).cast("B"))


class FitRanks:
    """The ranks of ``comm`` as ``fit`` sees them (the interface of
    ``engine.training.parallel.SingleProcess``): the argument checks run on every rank and
    every rank learns whether any rejected its arguments (none waits alone); ``start`` is
    ``fit_setup``."""

    def __init__(self, comm):
        communicator(comm)  # a TypeError naming comm, before it is used to agree on anything
        self.comm = comm

    def checked(self, check):
        error = result = None
        try:
            result = check()
        except (TypeError, ValueError) as e:
            error = e
        agree(self.comm, error)
        if error is not None:
            raise error
        return result

    def start(self, model, optimizer, X, Y, plan) -> DataParallel:
        return fit_setup(self.comm, model, optimizer, X, Y, epochs=plan.epochs,
                         batch_size=plan.batch_size, shuffle=plan.shuffle, rng=plan.rng)

"""The data-parallel interface of the training loop, and its one-process implementation.

``fit`` talks to the processes that train together through one object: ``checked`` runs
the argument checks (on every rank, agreeing on failures), ``start`` returns the run's
data-parallel object. With one process every collective step is the identity
(``SingleProcess``); over MPI it is ``engine.distributed.DataParallel``. The loop has no
branch on which one it holds. Training sits below the distributed layer and does not import
it: ``engine.distributed`` registers its ranks here when it is imported (``register_ranks``;
``import engine`` imports it, without loading MPI).
"""
from __future__ import annotations

from ..optim.optimizers import clip_grad_norm

__all__ = ["SingleProcess", "processes", "register_ranks"]


class SingleProcess:
    """The data-parallel interface on one process: this process holds every row and every
    gradient, so each collective step returns its input."""
    rank, size = 0, 1

    def __init__(self):
        self._params = ()

    # -- before the run ---------------------------------------------------------------------
    def checked(self, check):
        """``check()``'s result (on one process nobody else needs to learn of a failure)."""
        return check()

    def start(self, model, optimizer, X, Y, plan) -> "SingleProcess":
        self._params = model.parameters()
        return self

    # -- the run ------------------------------------------------------------------------------
    def share(self, start: int, stop: int) -> tuple:
        return start, stop

    def batch_loss(self, value: float, rows: int) -> tuple:
        return value, rows

    def begin_backward(self, weight=None) -> None:
        pass

    def reduce_gradients(self, weight=None) -> None:
        pass

    def clip_grad_norm(self, max_norm: float) -> float:
        return clip_grad_norm(self._params, max_norm)

    def allsum(self, *values) -> tuple:
        return values

    def write_checkpoint(self, path, model, optimizer, scheduler, metadata, training) -> None:
        """``checkpoint.write`` (over MPI: collective, rank 0 writes)."""
        from . import checkpoint
        checkpoint.write(path, model, optimizer, scheduler, metadata, training)

    def fail(self, error: BaseException) -> None:
        pass

    def finish(self) -> None:
        pass


_RANKS = []  # [factory]: comm -> the ranks of a fit run over it (engine.distributed's)


def register_ranks(factory) -> None:
    """Let ``fit(..., comm=c)`` train over the ranks ``factory(c)`` returns (an object with
    ``checked`` and ``start``, as ``SingleProcess``); ``engine.distributed`` registers its
    ``FitRanks`` when imported."""
    if not callable(factory):
        raise TypeError(f"factory: expected a callable, got {type(factory).__name__}")
    _RANKS[:] = [factory]


def processes(comm):
    """The processes of a ``fit`` run: this one alone (``comm=None``), or the ranks of an MPI
    communicator (through the factory ``engine.distributed`` registered)."""
    if comm is None:
        return SingleProcess()
    if not _RANKS:
        raise TypeError(f"comm: expected an MPI communicator (mpi4py.MPI.Comm) with "
                        f"engine.distributed imported, got {type(comm).__name__}")
    return _RANKS[0](comm)

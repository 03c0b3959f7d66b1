"""The data-parallel interface of the training loop, and its one-process implementation.

``fit`` talks to the processes that train together through one object: ``checked`` runs
the argument checks (on every rank, agreeing on failures), ``start`` returns the run's
data-parallel object. With one process every collective step is the identity
(``SingleProcess``); over MPI it is ``engine.distributed.DataParallel``. The loop has no
branch on which one it holds.
"""
from __future__ import annotations

from ..optim.optimizers import clip_grad_norm

__all__ = ["SingleProcess", "processes"]


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


def processes(comm):
    """The processes of a ``fit`` run: this one alone (``comm=None``), or the ranks of an MPI
    communicator (``engine.distributed``)."""
    if comm is None:
        return SingleProcess()
    from ..distributed import FitRanks
    return FitRanks(comm)

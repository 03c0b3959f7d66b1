"""``save`` and ``load`` of a data-parallel run: collective, so an error on one rank is raised
on every rank."""
from __future__ import annotations

from .runtime import agree, communicator

__all__ = ["save", "load", "write"]


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
    write(path, model, optimizer, scheduler, metadata, comm=comm)


def write(path, model, optimizer=None, scheduler=None, metadata=None, training=None, *,
          comm=None) -> None:
    """``checkpoint.write`` for a data-parallel run (collective; ``training``: a ``fit`` run's
    resumable state, the same on every rank): rank 0 writes; its error is raised on every
    rank."""
    from ..training import checkpoint
    comm = communicator(comm)
    agree(comm)
    sd = optimizer.state_dict() if optimizer is not None else None  # collective if sharded
    error = None
    if comm.Get_rank() == 0:
        try:
            checkpoint.write(path, model, None if sd is None else _SavedState(sd), scheduler,
                             metadata, training)
        except Exception as e:
            error = e
    agree(comm, error)
    if error is not None:
        raise error


def load(path, model, optimizer=None, scheduler=None, *, comm=None) -> dict:
    """``engine.load`` on every rank (collective: each reads ``path``); an error on any
    rank is raised on every rank (a rank whose own load failed changed nothing)."""
    from ..training import checkpoint
    comm = communicator(comm)
    agree(comm)
    error, meta = None, None
    try:
        meta = checkpoint.load(path, model, optimizer, scheduler)
    except Exception as e:
        error = e
    agree(comm, error)
    if error is not None:
        raise error
    return meta


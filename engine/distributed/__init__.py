"""Data-parallel training over MPI (mpi4py with MPICH: the optional extra ``mpi``).

Every rank holds the whole model. ``DataParallel`` broadcasts rank 0's parameters at the
start, and after each backward sums the ranks' flat gradient vectors in place with one
``Allreduce``; every rank then runs the same optimizer step, so the parameters stay the same
bits everywhere. ``ShardedAdamW`` is ZeRO stage 1 (Rajbhandari et al. 2020): a
``Reduce_scatter`` of the gradient vector, AdamW on this rank's 1/K slice of the arena (the
moments of that slice only), an ``Allgatherv`` of the parameters. ``set_gradient_buckets``
reduces the gradients in buckets instead, each launched during the backward as soon as it is
complete (PyTorch DDP's gradient buckets). ``fit(..., comm=...)`` shards each global batch
over the ranks (``DataParallel.share``; a batch smaller than the
ranks leaves some without rows, which add a zero gradient). Each rank runs its share of the
host's cores in BLAS threads unless a count was set on purpose (``set_threads``).

Faults never hang: every collective step begins with a small agreement ``Allreduce`` in which
a rank that raised takes part with its error flag, so every rank stops with that rank's
message; an exception that escapes to the top level of a rank aborts the job.
"""
from .runtime import (INSTALL, RankError, launched_size, mpi, rank_rng, set_threads,
                      threads_per_rank, world)
from .sharded import ShardedAdamW, sharded_like, zero1
from .buckets import gradient_buckets, set_gradient_buckets
from .data_parallel import DataParallel, FitRanks, fit_setup
from .checkpoints import load, save
from ..training.parallel import register_ranks

register_ranks(FitRanks)  # fit(..., comm=...) trains over these (training cannot import us)

__all__ = ["DataParallel", "ShardedAdamW", "sharded_like", "zero1", "RankError", "mpi", "world", "launched_size",
           "rank_rng", "set_threads", "threads_per_rank", "save", "load", "INSTALL",
           "set_gradient_buckets", "gradient_buckets"]

"""MPI worker (run by tests/test_distributed.py under ``mpiexec -n 2``): one rank fails, in
turn, in each way the data-parallel API must survive; every rank records what it raised.
Rank 0 prints one JSON line: per case, ``[[type, message], ...]`` by rank, and whether the
communicator still works at the end (no rank is left inside a collective).

Cases: ranks with different models; ranks with different data; a label out of range in
rank 1's copy of the data only (rejected by rank 1's checks before any step); a NaN arising
in rank 1's forward (a non-finite global loss); rank 1's backward
raising in the middle of fit; rank 0 failing to
save a checkpoint.
"""
import json
import os
import sys

import numpy as np

from engine import FFN, MLP, AdamW, CrossEntropyLoss, Module, MSELoss, fit
from engine import distributed as D

comm = D.mpi().COMM_WORLD
RANK = comm.Get_rank()


def attempt(fn):
    try:
        fn()
    except Exception as e:
        return [type(e).__name__, str(e)]
    return None


class Faulty(Module):
    """Wraps a module; its backward raises on rank 1 at the given call."""

    def __init__(self, inner, at):
        super().__init__(np.float64)
        self.inner, self.at, self.calls = inner, at, 0

    def forward(self, x):
        return self.inner.forward(x)

    def backward(self, dy):
        self.calls += 1
        if RANK == 1 and self.calls == self.at:
            raise RuntimeError("deliberate failure in backward on rank 1")
        return self.inner.backward(dy)


class NaNOnRank1(Module):
    """Wraps a module; on rank 1 its forward turns the batch's last row into NaN (fit rejects
    NaN data before training, so the NaN has to arise inside the model)."""

    def __init__(self, inner):
        super().__init__(np.float64)
        self.inner = inner

    def forward(self, x):
        if RANK == 1:
            x = x.copy()
            x[-1, 0] = np.nan
        return self.inner.forward(x)

    def backward(self, dy):
        return self.inner.backward(dy)


def different_models():
    model = FFN(4, 8 + RANK, dtype=np.float64, rng=0)
    D.DataParallel(model, AdamW(model.parameters()), comm)


def different_data():
    X = np.random.default_rng(RANK).standard_normal((16, 4))
    model = FFN(4, 8, dtype=np.float64, rng=0)
    fit(model, MSELoss(), AdamW(model.parameters()), X, X, epochs=1, batch_size=8,
        progress=False, comm=comm)


def classify_data():
    X = np.random.default_rng(0).standard_normal((16, 4))
    y = np.arange(16) % 3
    return X, y, MLP([4, 6, 3], ["relu", None], dtype=np.float64, rng=0)


def bad_label():
    X, y, model = classify_data()
    if RANK == 1:
        y[-1] = 7  # only rank 1's data: its checks fail, rank 0's pass
    fit(model, CrossEntropyLoss(), AdamW(model.parameters()), X, y, epochs=2,
        batch_size=16, shuffle=False, progress=False, comm=comm)


def nan_input():
    X, y, inner = classify_data()
    model = NaNOnRank1(inner)
    fit(model, CrossEntropyLoss(), AdamW(model.parameters()), X, y, epochs=2,
        batch_size=16, shuffle=False, progress=False, comm=comm)


def backward_raises():
    X, y, inner = classify_data()
    model = Faulty(inner, at=3)
    fit(model, CrossEntropyLoss(), AdamW(model.parameters()), X, y, epochs=3,
        batch_size=8, progress=False, comm=comm)


def failed_save():
    model = FFN(4, 8, dtype=np.float64, rng=0)
    D.save(os.path.join(os.devnull, "no", "such", "dir.npz"), model, AdamW(model.parameters()),
           comm=comm)


def main():
    res = {}
    for case in (different_models, different_data, bad_label, nan_input, backward_raises,
                 failed_save):
        res[case.__name__] = comm.allgather(attempt(case))
    res["alive"] = comm.allreduce(1) == comm.Get_size()
    if RANK == 0:
        print(json.dumps(res), flush=True)


if __name__ == "__main__":
    sys.exit(main())

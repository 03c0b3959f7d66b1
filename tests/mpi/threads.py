"""MPI worker (run by tests/test_distributed.py under ``mpiexec -n K``): the BLAS threads
``engine.distributed.set_threads`` gives each rank, what it says, and that a second call
keeps the first choice. Rank 0 prints one JSON line."""
import io
import json
import sys

import kernels
from engine import distributed as D


def main():
    comm = D.mpi().COMM_WORLD
    warn = io.StringIO()
    text = D.set_threads(comm, warn=warn)
    first = kernels.get_num_threads()
    mine = 1 if first > 1 else 2
    kernels.set_num_threads(mine)  # a count chosen after the run started: kept
    again = D.set_threads(comm)
    kept = again == text and kernels.get_num_threads() == mine
    res = {"threads": comm.gather(first), "text": comm.gather(text),
           "warnings": comm.gather(warn.getvalue()), "kept": comm.gather(kept)}
    if comm.Get_rank() == 0:
        print(json.dumps(res), flush=True)


if __name__ == "__main__":
    sys.exit(main())

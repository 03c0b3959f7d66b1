"""MPI worker (run by tests/test_distributed.py under ``mpiexec -n 2``): rank 1 raises an
exception that nothing catches while rank 0 waits in a collective (DataParallel's start).
The job must end, non-zero, with rank 1's message, instead of leaving rank 0 waiting."""
import numpy as np

from engine import FFN, AdamW
from engine import distributed as D

comm = D.mpi().COMM_WORLD  # loading MPI in a job of K > 1 ranks installs the abort hook
model = FFN(4, 8, dtype=np.float64, rng=0)
if comm.Get_rank() == 1:
    raise ValueError("deliberate uncaught error on rank 1")
D.DataParallel(model, AdamW(model.parameters()), comm)
print("rank 0 passed the collective", flush=True)

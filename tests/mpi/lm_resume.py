"""Worker of tests/test_distributed_lm.py, run as ``mpiexec -n K python tests/mpi/lm_resume.py
DIR MODE``: a data-parallel, epoch-based float64 GPT run (``MODE`` "plain" or "zero1": AdamW
sharded over the ranks) with a checkpoint after every epoch (written by rank 0), then the
same run resumed on the same ranks from its first epoch's checkpoint. Rank 0 saves the
uninterrupted run's flat parameters to DIR/ref.npy and prints one JSON line: whether the
resumed run ended with them bit for bit."""
import json
import os
import sys

import numpy as np

from engine import distributed
from engine.training import gpt_lm, lm
from engine.training.callbacks import ModelCheckpoint

TEXT = "".join(f"ab{i % 7} cab{i % 5}; " for i in range(400))
CONFIG = dict(d_model=8, d_ff=16, n_layer=1, n_head=2, seq_len=8, batch_size=5, epochs=3,
              warmup=0, lr=0.01, dtype="float64", sample_length=0, prompt="ab")


def run(comm, out_dir, sharded, resume=None):
    """The run's flat parameters at its end; a checkpoint per epoch in ``out_dir``."""
    s = gpt_lm.setup(gpt_lm.GPTConfig(**CONFIG), TEXT)
    cb = ModelCheckpoint(os.path.join(out_dir, "ep{epoch}.npz"), save_best_only=False)
    with distributed.zero1(s, comm if sharded else None):
        lm.run_training(s, False, comm, resume, [cb])
    return s.model.flat_params().copy()


def main():
    out, mode = sys.argv[1], sys.argv[2]
    comm = distributed.world()
    ref = run(comm, out, mode == "zero1")
    again = run(comm, os.path.join(out, "again"), mode == "zero1",
                resume=os.path.join(out, "ep1.npz"))
    if comm.Get_rank() == 0:
        np.save(os.path.join(out, "ref.npy"), ref)
        print(json.dumps({"bit_identical": bool(np.array_equal(ref, again)),
                          "ranks": comm.Get_size()}))


if __name__ == "__main__":
    main()

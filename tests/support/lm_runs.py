"""The tiny GPT run the --out-dir and MPI resume tests share: its text, options and a reader
of a checkpoint's parameters."""
import numpy as np

TEXT = "".join(f"ab{i % 7} cab{i % 5}; " for i in range(400))
# lr 0.3 on this text: the held-out loss is lowest at the second of six estimates, so
# out/ckpt.npz is a point inside the run.
OPTIONS = ["--model", "gpt", "--n-embd", "8", "--d-ff", "16", "--n-layer", "1", "--n-head",
           "2", "--block-size", "8", "--batch-size", "4", "--max-iters", "30",
           "--eval-interval", "5", "--eval-iters", "2", "--warmup-iters", "0", "--lr", "0.3",
           "--prompt", "ab"]


def params(path) -> dict:
    """The parameter arrays of a checkpoint, by their stored names."""
    z = np.load(path)
    return {k: z[k] for k in z.files if k.startswith("param")}

"""The alternatives for an embedding's backward (``dW[ids[i]] += dY[i]``, ids repeating),
timed side by side: what kernels.embedding chose and why.

- ``np.add.at``: NumPy's unbuffered indexed add.
- sort + ``np.add.reduceat``: argsort the ids, gather dY's rows in that order, sum each run
  of equal ids, add the sums into their rows.
- one-hot GEMM: ``dW += onehot(ids)^T dY`` through BLAS (cost grows with V * N * d).
- ``scipy.sparse`` product: build the (V, N) one-hot CSR matrix and multiply (allocates it and
  the (V, d) result every call).
- the engine's compiled scatter-add (kernels.embedding): one row add per id, in place.

Run: ``python -m bench.embedding_backward`` (one BLAS thread; medians of 7, in microseconds).
"""
from __future__ import annotations

import statistics
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:  # run as a script: make kernels importable
    sys.path.insert(0, str(ROOT))

import numpy as np  # noqa: E402

from bench.stopwatch import sample  # noqa: E402

SIZES = ((103, 2048, 128), (1000, 8192, 256), (50_000, 2048, 512))  # (V, N, d)


def _median_us(fn, reps=7):
    return 1e6 * statistics.median(sample(fn, reps))


def alternatives(v, n, d, rng):
    import scipy.sparse as sp
    from scipy.linalg.blas import sgemm

    from kernels import embedding
    ids = rng.integers(0, v, n).astype(np.int64)
    dy = rng.standard_normal((n, d)).astype(np.float32)
    g = np.zeros((v, d), np.float32)

    def add_at():
        np.add.at(g, ids, dy)

    def sort_reduceat():
        order = np.argsort(ids, kind="stable")
        s = ids[order]
        starts = np.flatnonzero(np.r_[True, s[1:] != s[:-1]])
        g[s[starts]] += np.add.reduceat(dy[order], starts, axis=0)

    def sparse_product():
        m = sp.csr_matrix((np.ones(n, np.float32), (ids, np.arange(n))), shape=(v, n))
        g[...] += m @ dy

    def compiled():
        embedding.embedding_backward_unchecked(g, ids, dy)

    out = {"np.add.at": add_at, "sort + reduceat": sort_reduceat,
           "scipy.sparse product": sparse_product, "compiled (engine)": compiled}
    if v * n <= 20_000_000:
        onehot = np.zeros((n, v), np.float32)
        flat, offs = onehot.reshape(-1), np.arange(n) * v

        def onehot_gemm():
            onehot.fill(0.0)
            np.put(flat, offs + ids, 1.0)
            sgemm(1.0, dy.T, onehot.T, 1.0, g.T, 0, 1, 1)  # g (V, d) += onehot^T dy
        out["one-hot GEMM"] = onehot_gemm
    return out


def main() -> int:
    from kernels import num_threads
    rng = np.random.default_rng(0)
    rows = []
    with num_threads(1):
        for v, n, d in SIZES:
            for name, fn in alternatives(v, n, d, rng).items():
                rows.append((f"V={v}, N={n}, d={d}", name, _median_us(fn)))
    print(f"{'size':28s} {'method':22s} {'us':>10s}")
    for size, name, us in rows:
        print(f"{size:28s} {name:22s} {us:10.0f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())

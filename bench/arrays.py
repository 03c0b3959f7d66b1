"""Random float32 inputs and kernel buffers that several benchmarks build alike."""
from __future__ import annotations

from types import SimpleNamespace

import numpy as np

F32 = np.float32


def rand(rng, shape, scale=1.0):
    """``scale * N(0, 1)`` samples of ``shape`` as float32."""
    return (scale * rng.standard_normal(shape)).astype(F32)


def layernorm_buffers(n: int, d: int) -> SimpleNamespace:
    """Inputs and outputs of one LayerNorm forward and backward over ``(n, d)`` float32 rows,
    in the kernels' argument names (seeded: the same numbers every run)."""
    rng = np.random.default_rng(0)
    return SimpleNamespace(
        x=rand(rng, (n, d)), dout=rand(rng, (n, d)),               # (n, d) input, output grad
        gamma=np.ones(d, F32), beta=np.zeros(d, F32),               # (d,) affine parameters
        out=np.empty((n, d), F32), dx=np.empty((n, d), F32),        # (n, d) results
        mean=np.empty(n, F32), rstd=np.empty(n, F32),               # (n,) cached for backward
        dgamma=np.zeros(d, F32), dbeta=np.zeros(d, F32))            # (d,) parameter grads

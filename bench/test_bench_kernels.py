"""Kernel benchmarks: each fast kernel next to its baseline (np.matmul for gemm, the
kernels.reference version for the rest) on the large-shape sizes of the blocks; the memory
bandwidth of this machine (a STREAM-style triad, bench/bandwidth.py) and AdamW.step's
effective bandwidth, whose ratio run.py reports."""
from __future__ import annotations

import numpy as np
import pytest

import kernels
from kernels import reference as ref
from bench import bandwidth, cases
from bench.arrays import layernorm_buffers, rand
from bench.timing import run_benchmark

F32 = np.float32




def _gemm(shape, impl, ta=False, tb=False):
    m, n, k = shape
    rng = np.random.default_rng(0)
    a = rand(rng, (k, m) if ta else (m, k))
    b = rand(rng, (n, k) if tb else (k, n))
    out = np.empty((m, n), F32)
    A, B = (a.T if ta else a), (b.T if tb else b)
    if impl == "fast":
        g = kernels.gemm_unchecked
        return lambda: g(out, a, b, ta, tb)
    if impl == "checked":
        g = kernels.gemm
        return lambda: g(out, a, b, ta, tb)
    return lambda: np.matmul(A, B, out=out)


def _act_pair(act, impl, n=2048, d=2048):
    """Forward (bias + activation) and backward of one (n, d) activation."""
    rng = np.random.default_rng(0)
    z, h, dz = rand(rng, (n, d)), np.empty((n, d), F32), np.empty((n, d), F32)
    dh, bias = rand(rng, (n, d)), np.zeros(d, F32)  # zero bias: z stays put over rounds
    mod = kernels if impl == "fast" else ref
    fwd, bwd = mod.bias_act_forward, mod.act_backward

    def run():
        fwd(h, z, bias, act)
        bwd(dz, dh, z, act, h=h)
    return run


def _bias_grad(impl, n=2048, d=2048):
    rng = np.random.default_rng(0)
    dz, db = rand(rng, (n, d)), np.zeros(d, F32)
    f = kernels.bias_grad if impl == "fast" else ref.bias_grad
    return lambda: f(db, dz)


def _layernorm(impl, n=2048, d=512):
    b = layernorm_buffers(n, d)
    mod = kernels if impl == "fast" else ref
    fwd, bwd = mod.layernorm_forward, mod.layernorm_backward

    def run():
        fwd(b.out, b.mean, b.rstd, b.x, b.gamma, b.beta, 1e-5)
        bwd(b.dx, b.dgamma, b.dbeta, b.dout, b.x, b.mean, b.rstd, b.gamma)
    return run


def _ffn_param_shapes(d=512, f=2048):
    return [(d, f), (f,), (f, d), (d,)]  # the large FFN: 2,099,712 parameters


def _adamw(impl):
    rng = np.random.default_rng(0)
    groups = []
    for s in _ffn_param_shapes():
        groups.append((rand(rng, s, 0.02), rand(rng, s, 1e-3), np.zeros(s, F32),
                       np.zeros(s, F32)))
    f = kernels.adamw_update if impl == "fast" else ref.adamw_update
    state = {"t": 0}

    def run():
        state["t"] += 1
        t = state["t"]
        for p, g, m, v in groups:
            f(p, g, m, v, t, 1e-4)
    return run


def _adamw_many():
    """kernels.adamw_update_many over the same 2.1M parameters: one call, one parallel region
    over all four parameters (what AdamW.step runs)."""
    rng = np.random.default_rng(0)
    quads = [(rand(rng, s, 0.02), rand(rng, s, 1e-3), np.zeros(s, F32), np.zeros(s, F32))
             for s in _ffn_param_shapes()]
    ps, gs, ms, vs = (list(q) for q in zip(*quads))
    state = {"t": 0}

    def run():
        state["t"] += 1
        kernels.adamw_update_many(ps, gs, ms, vs, state["t"], 1e-4)
    return run


def _adamw_step(module):
    """One engine.optim.AdamW step over ``module``'s parameters, with fixed random grads."""
    from engine.optim import AdamW
    rng = np.random.default_rng(0)
    for p in module.parameters():
        p.grad[...] = rand(rng, p.shape, 1e-3)
    step = AdamW(module.parameters(), lr=1e-4).step

    def run():
        step()
    return run


def _adamw_engine():
    """engine.optim.AdamW.step over the large FFN's 2.1M parameters (one kernel call over the
    parameter arena, plus the optimizer's bookkeeping); ``run.bytes``: what one step moves."""
    module = cases.build_module("FFN-relu", cases.SHAPES["large"])
    run = _adamw_step(module)
    run.bytes = bandwidth.adamw_bytes(module.num_parameters(), np.dtype(F32).itemsize)
    return run


def _adamw_engine_321k():
    """engine.optim.AdamW.step over a Linear(512, 627): 321,651 parameters, the size the
    compiled update is held to 5x the NumPy chain at (bench/baselines.py); ``run.params``
    gives the report its ns per parameter."""
    from engine.nn.layers import Linear
    module = Linear(512, 627, rng=0)
    run = _adamw_step(module)
    run.params = sum(p.size for p in module.parameters())
    return run


def _adamw_engine_cold():
    """_adamw_engine's step with the caches evicted before each timed call (setup): the
    optimizer state comes from memory, as after a forward and backward."""
    run = _adamw_engine()
    run.setup = bandwidth.evict_fn()
    return run


ADAMW_321K_ROW = "AdamW.step 321k (engine)"
_MEM_ARRAY = f"{bandwidth.triad_elements(F32) * np.dtype(F32).itemsize >> 20} MiB"

LARGE, SMALL = (2048, 2048, 512), (8, 800, 200)
# name, size label, implementation, factory
KERNELS = [
    ("gemm NN", "2048x512 @ 512x2048", "fast", lambda: _gemm(LARGE, "fast")),
    ("gemm NN", "2048x512 @ 512x2048", "ref", lambda: _gemm(LARGE, "ref")),
    ("gemm TN", "(2048x512)^T @ 2048x2048", "fast", lambda: _gemm((512, 2048, 2048), "fast", True)),
    ("gemm TN", "(2048x512)^T @ 2048x2048", "ref", lambda: _gemm((512, 2048, 2048), "ref", True)),
    ("gemm NN small", "8x200 @ 200x800", "fast", lambda: _gemm(SMALL, "fast")),
    ("gemm NN small", "8x200 @ 200x800", "checked", lambda: _gemm(SMALL, "checked")),
    ("gemm NN small", "8x200 @ 200x800", "ref", lambda: _gemm(SMALL, "ref")),
    ("gelu fwd+bwd", "2048x2048", "fast", lambda: _act_pair("gelu", "fast")),
    ("gelu fwd+bwd", "2048x2048", "ref", lambda: _act_pair("gelu", "ref")),
    ("relu fwd+bwd", "2048x2048", "fast", lambda: _act_pair("relu", "fast")),
    ("relu fwd+bwd", "2048x2048", "ref", lambda: _act_pair("relu", "ref")),
    ("bias_grad", "2048x2048", "fast", lambda: _bias_grad("fast")),
    ("bias_grad", "2048x2048", "ref", lambda: _bias_grad("ref")),
    ("layernorm fwd+bwd", "2048x512", "fast", lambda: _layernorm("fast")),
    ("layernorm fwd+bwd", "2048x512", "ref", lambda: _layernorm("ref")),
    ("adamw_update", "2.1M params (large FFN)", "fast", lambda: _adamw("fast")),
    ("adamw_update", "2.1M params (large FFN)", "ref", lambda: _adamw("ref")),
    ("adamw_update_many", "2.1M params (large FFN)", "fast", _adamw_many),
    ("adamw_update_many", "2.1M params (large FFN)", "ref", lambda: _adamw("ref")),
    (bandwidth.ADAMW_ROW, "2.1M params (large FFN)", "fast", _adamw_engine),
    (bandwidth.ADAMW_ROW, "2.1M params (large FFN)", "ref", lambda: _adamw("ref")),
    (ADAMW_321K_ROW, "321,651 params (Linear 512x627)", "fast", _adamw_engine_321k),
    (bandwidth.TRIAD_ROW, f"3 x {_MEM_ARRAY} f32", "fast", bandwidth.triad_fn),
    (bandwidth.UPDATE_ROW, f"2 x {_MEM_ARRAY} f32", "fast", bandwidth.update_fn),
    (bandwidth.ADAMW_COLD_ROW, "2.1M params (large FFN)", "fast", _adamw_engine_cold),
]


@pytest.mark.parametrize("name,size,impl,factory",
                         [pytest.param(*k, id=f"{k[0]}|{k[2]}") for k in KERNELS])
def test_kernel(benchmark, name, size, impl, factory):
    fn = factory()
    info = dict(kernel=name, size=size, impl=impl)
    if getattr(fn, "bytes", None) is not None:  # a bandwidth row: GB/s = bytes / median
        info["bytes"] = fn.bytes
    if getattr(fn, "params", None) is not None:  # ns per parameter in the report
        info["params"] = fn.params
    run_benchmark(benchmark, fn, setup=getattr(fn, "setup", None), **info)

"""Finite-difference helpers shared by the tests (float64, central differences)."""
from __future__ import annotations

import numpy as np


def numeric_grad(f, x: np.ndarray, eps: float = 1e-6) -> np.ndarray:
    """Central-difference gradient of the scalar ``f()`` with respect to ``x`` (perturbed in
    place and restored)."""
    g = np.zeros_like(x, dtype=np.float64)  # same memory order as x
    # Flat views (no copies) of x and g in memory order; x may be C- or F-contiguous.
    flat = x.reshape(-1) if x.flags.c_contiguous else x.T.reshape(-1)
    gflat = g.reshape(-1) if x.flags.c_contiguous else g.T.reshape(-1)
    for i in range(flat.size):
        old = flat[i]
        flat[i] = old + eps
        fp = f()
        flat[i] = old - eps
        fm = f()
        flat[i] = old
        gflat[i] = (fp - fm) / (2 * eps)
    return g


def assert_close(actual, expected, name: str, rtol: float = 1e-6, atol: float = 1e-8) -> None:
    """assert_allclose with the array's name in the message."""
    np.testing.assert_allclose(actual, expected, rtol=rtol, atol=atol, err_msg=name)


def check_module_grads(module, x: np.ndarray, rng, rtol: float = 1e-5, atol: float = 1e-7,
                       eps: float = 1e-6) -> None:
    """Check ``module.backward`` against finite differences of L = sum(forward(x) * R) for a
    fixed random R: the input gradient and every parameter's gradient (float64 modules)."""
    y = module.forward(x)
    R = rng.standard_normal(y.shape)

    def loss():
        return float(np.sum(module.forward(x) * R))

    module.zero_grad()
    module.forward(x)
    dx = np.array(module.backward(R.copy()), copy=True)
    analytic = {name: p.grad.copy() for name, p in module.named_parameters()}
    assert_close(dx, numeric_grad(loss, x, eps), "dx", rtol, atol)
    for name, p in module.named_parameters():
        assert_close(analytic[name], numeric_grad(loss, p.data, eps), name, rtol, atol)

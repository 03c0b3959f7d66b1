"""The naive reference step of every benched block: whole-array NumPy and kernels.reference.

Each class holds its own copy of a block's parameters (taken from the engine module, so both
start from the same numbers) and computes the step the way the formulas read: every
intermediate a new array, ``np.matmul`` for the products, separate gate and projection
products in the gMLP, the reference activation, LayerNorm, loss and AdamW kernels. It is the
baseline of the "speed-up over naive" columns, not an oracle for tests.
"""
from __future__ import annotations

import numpy as np

from kernels import reference as ref


class NaiveModel:
    """Parameters, accumulated gradients, AdamW moments; subclasses write forward/backward
    returning ``(y, cache)`` and ``(dx, {name: dW})``."""

    def __init__(self, params: dict, lr: float, weight_decay: float = 1e-2):
        self.params = {k: np.array(v, order="C", copy=True) for k, v in params.items()}
        self.grads = {k: np.zeros_like(v) for k, v in self.params.items()}
        self.m = {k: np.zeros_like(v) for k, v in self.params.items()}
        self.v = {k: np.zeros_like(v) for k, v in self.params.items()}
        self.lr, self.wd, self.t = lr, weight_decay, 0

    def forward(self, x):  # pragma: no cover - abstract
        raise NotImplementedError

    def backward(self, cache, dy):  # pragma: no cover - abstract
        raise NotImplementedError

    def forward_backward(self, x, dy):
        lead = x.shape[:-1]
        y, cache = self.forward(x.reshape(-1, x.shape[-1]))
        dx, grads = self.backward(cache, dy.reshape(-1, dy.shape[-1]))
        for k, g in grads.items():
            self.grads[k] += g
        return y.reshape(*lead, -1), dx.reshape(*lead, -1)

    def loss(self, y, target):
        """MSE (mean over all elements) and its gradient."""
        dy = np.empty_like(y)
        return ref.mse_forward(y, target), ref.mse_backward(dy, y, target)

    def step(self, x, target):
        """forward, loss, backward, AdamW, zero_grad; returns the loss."""
        x2 = x.reshape(-1, x.shape[-1])
        y, cache = self.forward(x2)
        t2 = target.reshape(y.shape[0], -1) if target.ndim > 1 else target
        loss, dy = self.loss(y, t2)
        _, grads = self.backward(cache, dy)
        for k, g in grads.items():
            self.grads[k] += g
        self.t += 1
        for k, p in self.params.items():
            ref.adamw_update(p, self.grads[k], self.m[k], self.v[k], self.t, self.lr,
                             weight_decay=self.wd)
        for g in self.grads.values():
            g[...] = 0.0
        return loss


def _act(z, act):
    return ref.activation(z, act)


class NaiveFFN(NaiveModel):
    """y = act(x W_in + b1) W_out + b2."""

    def __init__(self, params, lr, activation="relu", prefix=""):
        super().__init__(params, lr)
        self.act, self.pre = activation, prefix

    def ffn_forward(self, x):
        p, q = self.params, self.pre
        z = x @ p[q + "W_in"] + p[q + "b1"]
        h = _act(z, self.act)
        return h @ p[q + "W_out"] + p[q + "b2"], (x, z, h)

    def ffn_backward(self, cache, dy):
        x, z, h = cache
        p, q = self.params, self.pre
        grads = {q + "W_out": h.T @ dy, q + "b2": dy.sum(axis=0)}
        dz = (dy @ p[q + "W_out"].T) * ref.activation_grad(z, self.act)
        grads[q + "W_in"] = x.T @ dz
        grads[q + "b1"] = dz.sum(axis=0)
        return dz @ p[q + "W_in"].T, grads

    forward, backward = ffn_forward, ffn_backward


class NaiveFFNSublayer(NaiveFFN):
    """Post-norm: y = LayerNorm(x + FFN(x))."""

    def __init__(self, params, lr, activation="gelu", eps=1e-5):
        super().__init__(params, lr, activation, prefix="ffn.")
        self.eps = eps

    def forward(self, x):
        f, fcache = self.ffn_forward(x)
        s = x + f
        n = s.shape[0]
        y, mean, rstd = np.empty_like(s), np.empty(n, s.dtype), np.empty(n, s.dtype)
        ref.layernorm_forward(y, mean, rstd, s, self.params["norm.gamma"],
                              self.params["norm.beta"], self.eps)
        return y, (fcache, s, mean, rstd)

    def backward(self, cache, dy):
        fcache, s, mean, rstd = cache
        ds = np.empty_like(s)
        dgamma = np.zeros_like(self.params["norm.gamma"])
        dbeta = np.zeros_like(self.params["norm.beta"])
        ref.layernorm_backward(ds, dgamma, dbeta, dy, s, mean, rstd, self.params["norm.gamma"])
        dx_ffn, grads = self.ffn_backward(fcache, ds)
        grads["norm.gamma"], grads["norm.beta"] = dgamma, dbeta
        return ds + dx_ffn, grads


class NaiveGMLP(NaiveModel):
    """Seed 002: Z = GELU(X W_in), G = sigmoid(Z W_gate), P = Z W_proj, A = G*P, Y = A W_out;
    the gate and projection are separate (d_hidden, d_ffn) matrices and separate products."""

    def __init__(self, params, lr, activation="gelu"):
        super().__init__(params, lr)
        self.act = activation

    def forward(self, x):
        p = self.params
        zp = x @ p["W_in"]
        z = _act(zp, self.act)
        gp = z @ p["W_gate"]
        g = _act(gp, "sigmoid")
        pr = z @ p["W_proj"]
        a = g * pr
        return a @ p["W_out"], (x, zp, z, gp, g, pr, a)

    def backward(self, cache, dy):
        x, zp, z, gp, g, pr, a = cache
        p = self.params
        grads = {"W_out": a.T @ dy}
        da = dy @ p["W_out"].T
        dgp = da * pr * ref.activation_grad(gp, "sigmoid")
        dpr = da * g
        grads["W_gate"] = z.T @ dgp
        grads["W_proj"] = z.T @ dpr
        dz = dgp @ p["W_gate"].T + dpr @ p["W_proj"].T
        dzp = dz * ref.activation_grad(zp, self.act)
        grads["W_in"] = x.T @ dzp
        return dzp @ p["W_in"].T, grads


class NaiveMLP(NaiveModel):
    """Linear layers ``W{i}`` (d_in, d_out), ``b{i}``; activations between them; softmax +
    cross-entropy loss on integer labels."""

    def __init__(self, params, lr, activations):
        super().__init__(params, lr)
        self.acts = list(activations)

    def forward(self, x):
        cache = []
        h = x
        for i, act in enumerate(self.acts):
            z = h @ self.params[f"W{i}"] + self.params[f"b{i}"]
            cache.append((h, z))
            h = z if act is None else _act(z, act)
        return h, cache

    def backward(self, cache, dy):
        grads = {}
        for i in reversed(range(len(self.acts))):
            h, z = cache[i]
            if self.acts[i] is not None:
                dy = dy * ref.activation_grad(z, self.acts[i])
            grads[f"W{i}"] = h.T @ dy
            grads[f"b{i}"] = dy.sum(axis=0)
            dy = dy @ self.params[f"W{i}"].T
        return dy, grads

    def loss(self, logits, labels):
        probs, dlogits = np.empty_like(logits), np.empty_like(logits)
        loss = ref.softmax_cross_entropy_forward(probs, logits, labels)
        return loss, ref.softmax_cross_entropy_backward(dlogits, probs, labels)


# ----------------------------------------------------------------------------- from the engine
def from_module(block: str, module, lr: float) -> NaiveModel:
    """The naive twin of an engine module built by ``cases.build_module``."""
    named = {n: p.data for n, p in module.named_parameters()}
    if block.startswith("FFNSublayer"):
        return NaiveFFNSublayer(named, lr, "gelu")
    if block.startswith("FFN"):
        return NaiveFFN(named, lr, block.split("-")[1])
    if block == "GMLP":
        # The engine's W_gate / W_proj are (d_hidden, d_ffn) views of one stored weight.
        return NaiveGMLP({k: named[k] for k in ("W_in", "W_gate", "W_proj", "W_out")}, lr)
    if block == "MLP":
        ws = [v for v in named.values() if v.ndim == 2]
        bs = [v for v in named.values() if v.ndim == 1]
        params = {}
        for i, (w, b) in enumerate(zip(ws, bs)):
            params[f"W{i}"], params[f"b{i}"] = w, b
        acts = ["relu"] * (len(ws) - 1) + [None]
        return NaiveMLP(params, lr, acts)
    raise ValueError(f"block: no naive twin for {block!r}")

"""Naive twins of the blocks: each block's forward, backward and training step written the way
the formulas read, in whole-array NumPy on ``kernels.reference`` (every intermediate a new
array, ``np.matmul`` for the products, separate gate and projection products in the gMLP).

A twin copies a module's parameters (same names, same numbers) and then lives on its own:
``forward(x)`` caches what ``backward(dy)`` needs, ``backward`` returns the input gradient
and adds the parameter gradients into ``grads``, ``step(x, target)`` runs forward, loss,
backward, AdamW (PyTorch semantics) and zero_grad. It is the oracle of the registry's twin
tests (micrograd's build-it-twice) and the baseline of bench's "x naive" columns.
"""
from __future__ import annotations

import numpy as np

from kernels import reference as ref

__all__ = ["NaiveBlock", "NaiveFFN", "NaiveFFNSublayer", "NaiveGMLP", "NaiveMLP", "LOSSES"]
__all__ += ["NaiveGatedFFN", "NaiveGMLPBlock"]


def _mse(pred, target):
    """MSE (mean over all elements) and its gradient."""
    return ref.mse_forward(pred, target), ref.mse_backward(np.empty_like(pred), pred, target)


def _cross_entropy(logits, target):
    """Softmax cross-entropy (mean over rows; integer labels or probabilities) and its
    gradient."""
    probs = np.empty_like(logits)
    loss = ref.softmax_cross_entropy_forward(probs, logits, target)
    return loss, ref.softmax_cross_entropy_backward(np.empty_like(logits), probs, target)


# loss name -> fn(pred2, target) -> (loss, dpred2); pred2 is (N, d)
LOSSES = {"mse": _mse, "cross_entropy": _cross_entropy}


def check_no_dropout(dropout) -> None:
    """ValueError for a dropout probability other than 0: a twin cannot draw the engine's mask."""
    if dropout:
        raise ValueError(f"dropout: the naive twin has no dropout (it cannot draw the "
                         f"engine's mask); expected 0.0, got {dropout!r}")


def sequence_shape(x) -> tuple:
    """``(B, T)`` of ``x``, which must hold (B, T, d) sequences."""
    if x.ndim != 3:
        raise ValueError(f"x: expected (B, T, d) sequences, got shape {x.shape}")
    return x.shape[:2]


class NaiveBlock:
    """Parameters (copies, by the engine's names), accumulated gradients and AdamW moments.
    Subclasses write ``forward_rows(x2) -> (y2, cache)`` and ``backward_rows(cache, dy2) ->
    (dx2, {name: grad})`` on 2-D rows."""

    def __init__(self, params: dict, *, lr: float = 1e-3, weight_decay: float = 1e-2,
                 loss: str = "mse"):
        if loss not in LOSSES:
            raise ValueError(f"loss: expected one of {tuple(LOSSES)}, got {loss!r}")
        self.params = {k: np.array(v, order="C", copy=True) for k, v in params.items()}
        self.grads = {k: np.zeros_like(v) for k, v in self.params.items()}
        self.m = {k: np.zeros_like(v) for k, v in self.params.items()}
        self.v = {k: np.zeros_like(v) for k, v in self.params.items()}
        self.lr, self.wd, self.t = lr, weight_decay, 0
        self.loss_fn = LOSSES[loss]
        self._cache = None

    def layer_norm(self, x, name):
        """LayerNorm of the rows ``x`` with parameters ``<name>.gamma``, ``<name>.beta`` and
        ``self.eps``: ``(y, cache)``."""
        n = x.shape[0]
        y, mean, rstd = np.empty_like(x), np.empty(n, x.dtype), np.empty(n, x.dtype)
        ref.layernorm_forward(y, mean, rstd, x, self.params[name + ".gamma"],
                              self.params[name + ".beta"], self.eps)
        return y, (x, mean, rstd)

    def layer_norm_backward(self, cache, dy, name, grads):
        """dx of ``layer_norm``; the gradients of ``<name>.gamma``/``.beta`` go into ``grads``."""
        x, mean, rstd = cache
        dx = np.empty_like(x)
        dg = np.zeros_like(self.params[name + ".gamma"])
        db = np.zeros_like(self.params[name + ".beta"])
        ref.layernorm_backward(dx, dg, db, dy, x, mean, rstd, self.params[name + ".gamma"])
        grads[name + ".gamma"], grads[name + ".beta"] = dg, db
        return dx

    def forward_rows(self, x2):  # pragma: no cover - abstract
        raise NotImplementedError

    def backward_rows(self, cache, dy2):  # pragma: no cover - abstract
        raise NotImplementedError

    def forward(self, x):
        """y for ``x`` of shape (..., d_in), as a new array of shape (..., d_out)."""
        y2, self._cache = self.forward_rows(x.reshape(-1, x.shape[-1]))
        self._lead = x.shape[:-1]
        return y2.reshape(*self._lead, y2.shape[-1])

    def backward(self, dy):
        """dx for the last forward; parameter gradients are added into ``grads``."""
        if self._cache is None:
            raise RuntimeError("backward: no forward to differentiate (one backward per forward)")
        dx2, grads = self.backward_rows(self._cache, dy.reshape(-1, dy.shape[-1]))
        self._cache = None
        for k, g in grads.items():
            self.grads[k] += g
        return dx2.reshape(*self._lead, dx2.shape[-1])

    def forward_backward(self, x, dy):
        """One forward and backward; returns (y, dx)."""
        y = self.forward(x)
        return y, self.backward(dy)

    def step(self, x, target):
        """forward, loss, backward, AdamW, zero_grad; returns the loss."""
        y = self.forward(x)
        y2 = y.reshape(-1, y.shape[-1])
        t2 = target.reshape(y2.shape[0], -1) if target.ndim > 1 else target
        loss, dy2 = self.loss_fn(y2, t2)
        self.backward(dy2.reshape(y.shape))
        self.t += 1
        for k, p in self.params.items():
            ref.adamw_update(p, self.grads[k], self.m[k], self.v[k], self.t, self.lr,
                             weight_decay=self.wd)
        for g in self.grads.values():
            g[...] = 0.0
        return loss


class NaiveFFN(NaiveBlock):
    """y = act(x W_in + b1) W_out + b2 (Vaswani et al. 2017's position-wise FFN); parameter
    names under ``prefix`` (``"ffn."`` inside the sublayer); no biases when the module has
    none."""

    def __init__(self, params, *, activation="relu", dropout=0.0, prefix="", **kw):
        super().__init__(params, **kw)
        check_no_dropout(dropout)
        self.act, self.pre = activation, prefix

    def _ffn_forward(self, x):
        p, q = self.params, self.pre
        z = x @ p[q + "W_in"]
        if q + "b1" in p:
            z = z + p[q + "b1"]
        h = ref.activation(z, self.act)
        y = h @ p[q + "W_out"]
        if q + "b2" in p:
            y = y + p[q + "b2"]
        return y, (x, z, h)

    def _ffn_backward(self, cache, dy):
        x, z, h = cache
        p, q = self.params, self.pre
        grads = {q + "W_out": h.T @ dy}
        dz = (dy @ p[q + "W_out"].T) * ref.activation_grad(z, self.act)
        grads[q + "W_in"] = x.T @ dz
        if q + "b2" in p:
            grads[q + "b2"] = dy.sum(axis=0)
        if q + "b1" in p:
            grads[q + "b1"] = dz.sum(axis=0)
        return dz @ p[q + "W_in"].T, grads

    forward_rows, backward_rows = _ffn_forward, _ffn_backward


class NaiveFFNSublayer(NaiveFFN):
    """``norm="post"``: y = LayerNorm(x + FFN(x)); ``norm="pre"``: y = x + FFN(LayerNorm(x))
    (LayerNorm: Ba et al. 2016, per-feature ``norm.gamma``/``norm.beta``)."""

    def __init__(self, params, *, activation="relu", dropout=0.0, norm="post", eps=1e-5, **kw):
        super().__init__(params, activation=activation, dropout=dropout, prefix="ffn.", **kw)
        if norm not in ("post", "pre"):
            raise ValueError(f"norm: expected 'post' or 'pre', got {norm!r}")
        self.norm, self.eps = norm, eps

    def forward_rows(self, x):
        if self.norm == "post":
            f, fcache = self._ffn_forward(x)
            y, lcache = self.layer_norm(x + f, "norm")
        else:
            xn, lcache = self.layer_norm(x, "norm")
            f, fcache = self._ffn_forward(xn)
            y = x + f
        return y, (fcache, lcache)

    def backward_rows(self, cache, dy):
        fcache, lcache = cache
        if self.norm == "post":
            grads: dict = {}
            ds = self.layer_norm_backward(lcache, dy, "norm", grads)
            dx_ffn, fgrads = self._ffn_backward(fcache, ds)
            grads.update(fgrads)
            return ds + dx_ffn, grads
        dxn, grads = self._ffn_backward(fcache, dy)
        return dy + self.layer_norm_backward(lcache, dxn, "norm", grads), grads


class NaiveGMLP(NaiveBlock):
    """Gated MLP (channel gating after Liu et al. 2021, "Pay Attention to MLPs"):
    Z = GELU(X W_in), G = sigmoid(Z W_gate), P = Z W_proj, A = G * P, Y = A W_out, with the
    gate and projection as separate (d_hidden, d_ffn) matrices and separate products."""

    def __init__(self, params, *, activation="gelu", **kw):
        super().__init__(params, **kw)
        self.act = activation

    def forward_rows(self, x):
        p = self.params
        zp = x @ p["W_in"]
        z = ref.activation(zp, self.act)
        gp = z @ p["W_gate"]
        g = ref.activation(gp, "sigmoid")
        pr = z @ p["W_proj"]
        a = g * pr
        return a @ p["W_out"], (x, zp, z, gp, g, pr, a)

    def backward_rows(self, cache, dy):
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


class NaiveMLP(NaiveBlock):
    """Linear layers ``{i}.W`` (d_in, d_out) and ``{i}.b``, ``activation`` between them and
    none after the last (logits)."""

    def __init__(self, params, *, activation="relu", **kw):
        super().__init__(params, **kw)
        n = sum(1 for k in self.params if k.endswith(".W"))
        if any(f"{i}.W" not in self.params for i in range(n)):
            raise ValueError(f"params: expected layers '0.W' ... '{n - 1}.W', got "
                             f"{sorted(self.params)}")
        self.acts = [activation] * (n - 1) + [None]

    def forward_rows(self, x):
        cache = []
        h = x
        for i, act in enumerate(self.acts):
            z = h @ self.params[f"{i}.W"]
            if f"{i}.b" in self.params:
                z = z + self.params[f"{i}.b"]
            cache.append((h, z))
            h = z if act is None else ref.activation(z, act)
        return h, cache

    def backward_rows(self, cache, dy):
        grads = {}
        for i in reversed(range(len(self.acts))):
            h, z = cache[i]
            if self.acts[i] is not None:
                dy = dy * ref.activation_grad(z, self.acts[i])
            grads[f"{i}.W"] = h.T @ dy
            if f"{i}.b" in self.params:
                grads[f"{i}.b"] = dy.sum(axis=0)
            dy = dy @ self.params[f"{i}.W"].T
        return dy, grads


# ----------------------------------------------------------------------------- gated FFN
class NaiveGatedFFN(NaiveBlock):
    """y = (act(x W_gate + b_gate) * (x W_up + b_up)) W_down + b_down (Shazeer 2020, "GLU
    Variants Improve Transformer"), with the gate and up projections as separate products;
    no biases when the module has none."""

    def __init__(self, params, *, activation="silu", bias=False, dropout=0.0, **kw):
        super().__init__(params, **kw)
        check_no_dropout(dropout)
        self.act = activation

    def _bias(self, name):
        return self.params.get(name, 0.0)

    def forward_rows(self, x):
        p = self.params
        g = x @ p["W_gate"] + self._bias("b_gate")
        u = x @ p["W_up"] + self._bias("b_up")
        a = ref.activation(g, self.act)
        h = a * u
        return h @ p["W_down"] + self._bias("b_down"), (x, g, u, a, h)

    def backward_rows(self, cache, dy):
        x, g, u, a, h = cache
        p = self.params
        grads = {"W_down": h.T @ dy}
        dh = dy @ p["W_down"].T
        dg = dh * u * ref.activation_grad(g, self.act)
        du = dh * a
        grads["W_gate"], grads["W_up"] = x.T @ dg, x.T @ du
        if "b_down" in p:
            grads["b_down"], grads["b_gate"], grads["b_up"] = (dy.sum(axis=0), dg.sum(axis=0),
                                                               du.sum(axis=0))
        return dg @ p["W_gate"].T + du @ p["W_up"].T, grads


# ----------------------------------------------------------------------------- gMLP block
class NaiveGMLPBlock(NaiveBlock):
    """The gMLP block of Liu et al. 2021 on (B, T, d) input: Z = GELU(LN(x) W_in + b_in),
    [U | V] = Z, S = W LN_s(V) + b per sequence (np.matmul over the batch; causal: W's upper
    triangle zeroed), y = x + (U * S) W_out + b_out."""

    def __init__(self, params, *, causal=False, eps=1e-5, **kw):
        super().__init__(params, **kw)
        self.causal, self.eps = causal, eps
        self.half = self.params["W_out"].shape[0]

    def forward(self, x):
        self._bt = sequence_shape(x)
        return super().forward(x)

    def _w(self, t):
        w = self.params["sgu.W"][:t, :t]
        return np.tril(w) if self.causal else w

    def forward_rows(self, x):
        p, (b, t), h = self.params, self._bt, self.half
        xn, c1 = self.layer_norm(x, "norm")
        zp = xn @ p["W_in"] + p["b_in"]
        z = ref.activation(zp, "gelu")
        u, v = z[:, :h], z[:, h:]
        vn, c2 = self.layer_norm(v, "sgu.norm")
        s = (self._w(t) @ vn.reshape(b, t, h) + p["sgu.b"][:t, None]).reshape(b * t, h)
        a = u * s
        return x + a @ p["W_out"] + p["b_out"], (c1, xn, zp, u, c2, vn, s, a)

    def backward_rows(self, cache, dy):
        c1, xn, zp, u, c2, vn, s, a = cache
        p, (b, t), h = self.params, self._bt, self.half
        grads = {"W_out": a.T @ dy, "b_out": dy.sum(axis=0)}
        da = dy @ p["W_out"].T
        du, ds = da * s, (da * u).reshape(b, t, h)
        gb = np.zeros_like(p["sgu.b"])
        gb[:t] = ds.sum(axis=(0, 2))
        gw = np.zeros_like(p["sgu.W"])
        gw[:t, :t] = np.einsum("btc,bsc->ts", ds, vn.reshape(b, t, h))
        if self.causal:
            gw = np.tril(gw)
        grads["sgu.W"], grads["sgu.b"] = gw, gb
        dvn = (self._w(t).T @ ds).reshape(b * t, h)
        dv = self.layer_norm_backward(c2, dvn, "sgu.norm", grads)
        dzp = np.concatenate([du, dv], axis=1) * ref.activation_grad(zp, "gelu")
        grads["W_in"], grads["b_in"] = xn.T @ dzp, dzp.sum(axis=0)
        return dy + self.layer_norm_backward(c1, dzp @ p["W_in"].T, "norm", grads), grads

"""Naive twins of the attention blocks (see ``engine.models.naive``): multi-head attention and
the transformer block written as the formulas read, whole-array NumPy with every head of
every sequence at once through ``np.matmul`` over (B, h, T, d_head) arrays."""
from __future__ import annotations

import numpy as np

from kernels import reference as ref

from .naive import NaiveBlock, check_no_dropout, sequence_shape

__all__ = ["NaiveMultiHeadAttention", "NaiveTransformerBlock"]


class _Attention:
    """softmax(q k^T / sqrt(dh) + mask) v W_o + b_o with parameters under ``prefix``."""

    def __init__(self, params, n_heads, causal, prefix=""):
        self.p, self.h, self.causal, self.pre = params, n_heads, causal, prefix

    def _get(self, name):
        return self.p.get(self.pre + name)

    def forward(self, x, bt):
        (b, t), h = bt, self.h
        d = x.shape[1]
        dh = d // h
        qkv = x @ self._get("W_qkv")
        if self._get("b_qkv") is not None:
            qkv = qkv + self._get("b_qkv")
        q, k, v = (qkv[:, i * d:(i + 1) * d].reshape(b, t, h, dh).transpose(0, 2, 1, 3)
                   for i in range(3))
        s = q @ k.transpose(0, 1, 3, 2) / np.sqrt(dh)
        if self.causal:
            s = np.where(np.tril(np.ones((t, t), bool)), s, -np.inf)
        e = np.exp(s - s.max(axis=-1, keepdims=True))
        pr = e / e.sum(axis=-1, keepdims=True)
        o = (pr @ v).transpose(0, 2, 1, 3).reshape(b * t, d)
        y = o @ self._get("W_o")
        if self._get("b_o") is not None:
            y = y + self._get("b_o")
        return y, (x, q, k, v, pr, o)

    def backward(self, cache, dy, bt):
        x, q, k, v, pr, o = cache
        (b, t), h = bt, self.h
        d = x.shape[1]
        dh = d // h
        pre = self.pre
        grads = {pre + "W_o": o.T @ dy}
        if self._get("b_o") is not None:
            grads[pre + "b_o"] = dy.sum(axis=0)
        do = (dy @ self._get("W_o").T).reshape(b, t, h, dh).transpose(0, 2, 1, 3)
        dv = pr.transpose(0, 1, 3, 2) @ do
        dp = do @ v.transpose(0, 1, 3, 2)
        ds = pr * (dp - (dp * pr).sum(axis=-1, keepdims=True)) / np.sqrt(dh)
        dq, dk = ds @ k, ds.transpose(0, 1, 3, 2) @ q
        dqkv = np.concatenate([a.transpose(0, 2, 1, 3).reshape(b * t, d) for a in (dq, dk, dv)],
                              axis=1)
        grads[pre + "W_qkv"] = x.T @ dqkv
        if self._get("b_qkv") is not None:
            grads[pre + "b_qkv"] = dqkv.sum(axis=0)
        return dqkv @ self._get("W_qkv").T, grads


class NaiveMultiHeadAttention(NaiveBlock):
    """Multi-head self-attention (Vaswani et al. 2017) on (B, T, d) input."""

    def __init__(self, params, *, n_heads, causal=True, dropout=0.0, bias=True, **kw):
        super().__init__(params, **kw)
        check_no_dropout(dropout)
        self.attn = _Attention(self.params, n_heads, causal)

    def forward(self, x):
        self._bt = sequence_shape(x)
        return super().forward(x)

    def forward_rows(self, x):
        return self.attn.forward(x, self._bt)

    def backward_rows(self, cache, dy):
        return self.attn.backward(cache, dy, self._bt)


class NaiveTransformerBlock(NaiveBlock):
    """Pre-norm h = x + attn(ln_1(x)), y = h + mlp(ln_2(h)); post-norm h = ln_1(x + attn(x)),
    y = ln_2(h + mlp(h)); mlp an FFN act(x W_in + b1) W_out + b2."""

    def __init__(self, params, *, n_heads, ffn="gelu", norm="pre", causal=True, dropout=0.0,
                 eps=1e-5, **kw):
        super().__init__(params, **kw)
        check_no_dropout(dropout)
        self.attn = _Attention(self.params, n_heads, causal, "attn.")
        self.act, self.norm, self.eps = ffn, norm, eps

    def forward(self, x):
        self._bt = sequence_shape(x)
        return super().forward(x)

    def _mlp(self, x):
        p = self.params
        z = x @ p["mlp.W_in"] + p["mlp.b1"]
        hid = ref.activation(z, self.act)
        return hid @ p["mlp.W_out"] + p["mlp.b2"], (x, z, hid)

    def _mlp_backward(self, cache, dy, grads):
        x, z, hid = cache
        p = self.params
        grads["mlp.W_out"], grads["mlp.b2"] = hid.T @ dy, dy.sum(axis=0)
        dz = (dy @ p["mlp.W_out"].T) * ref.activation_grad(z, self.act)
        grads["mlp.W_in"], grads["mlp.b1"] = x.T @ dz, dz.sum(axis=0)
        return dz @ p["mlp.W_in"].T

    def forward_rows(self, x):
        bt = self._bt
        if self.norm == "pre":
            xn, l1 = self.layer_norm(x, "ln_1")
            a, ac = self.attn.forward(xn, bt)
            hh = x + a
            hn, l2 = self.layer_norm(hh, "ln_2")
            m, mc = self._mlp(hn)
            return hh + m, (l1, ac, l2, mc)
        a, ac = self.attn.forward(x, bt)
        hh, l1 = self.layer_norm(x + a, "ln_1")
        m, mc = self._mlp(hh)
        y, l2 = self.layer_norm(hh + m, "ln_2")
        return y, (l1, ac, l2, mc)

    def backward_rows(self, cache, dy):
        l1, ac, l2, mc = cache
        bt, grads = self._bt, {}
        if self.norm == "pre":
            dh = dy + self.layer_norm_backward(l2, self._mlp_backward(mc, dy, grads), "ln_2", grads)
            dxn, ag = self.attn.backward(ac, dh, bt)
            grads.update(ag)
            return dh + self.layer_norm_backward(l1, dxn, "ln_1", grads), grads
        ds2 = self.layer_norm_backward(l2, dy, "ln_2", grads)
        dh = ds2 + self._mlp_backward(mc, ds2, grads)
        ds1 = self.layer_norm_backward(l1, dh, "ln_1", grads)
        dx, ag = self.attn.backward(ac, ds1, bt)
        grads.update(ag)
        return ds1 + dx, grads

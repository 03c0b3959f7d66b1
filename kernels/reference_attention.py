"""Naive NumPy versions of the attention kernels (kernels/attention.py, kernels/sdpa.py):
the oracle for their tests, re-exported by ``kernels.reference``. Written as the formulas
read, per (batch, head), with the whole T x T score matrix."""
from __future__ import annotations

import numpy as np


def heads_split(out, x, n_heads):
    """out[m, b, h, t, :] = x[b, t, m*d + h*dh : m*d + (h+1)*dh], d = n_heads * dh."""
    m, b, h, t, dh = out.shape
    out[...] = x.reshape(b, t, m, h, dh).transpose(2, 0, 3, 1, 4)
    return out


def heads_merge(out, x):
    """The inverse of heads_split: x (M, B, H, T, dh) back to rows out (B, T, M*H*dh)."""
    out[...] = x.transpose(1, 3, 0, 2, 4).reshape(out.shape)
    return out


def causal_fill(s, value=-np.inf):
    """s[p, i, j] = value for every j > i."""
    t = s.shape[-1]
    s[:, np.triu(np.ones((t, t), bool), 1)] = value
    return s


def attention(x, w_qkv, b_qkv, w_o, b_o, n_heads, causal=True):
    """Multi-head self-attention in float64, the textbook way: y (B, T, d) for x (B, T, d)."""
    bsz, t, d = x.shape
    dh = d // n_heads
    qkv = x.reshape(-1, d) @ w_qkv + b_qkv
    q, k, v = (qkv[:, i * d:(i + 1) * d].reshape(bsz, t, n_heads, dh).transpose(0, 2, 1, 3)
               for i in range(3))
    s = q @ k.transpose(0, 1, 3, 2) / np.sqrt(dh)
    if causal:
        s = np.where(np.tril(np.ones((t, t), bool)), s, -np.inf)
    s = s - s.max(axis=-1, keepdims=True)
    p = np.exp(s)
    p /= p.sum(axis=-1, keepdims=True)
    o = (p @ v).transpose(0, 2, 1, 3).reshape(-1, d)
    return (o @ w_o + b_o).reshape(bsz, t, d)


def _sdpa_heads(qkv, n_heads):
    bsz, t, d3 = qkv.shape
    d = d3 // 3
    return [qkv[..., i * d:(i + 1) * d].reshape(bsz, t, n_heads, d // n_heads)
            .transpose(0, 2, 1, 3) for i in range(3)]  # q, k, v (B, H, T, dh)


def sdpa_forward(out, p, qkv, n_heads, scale, causal=True, bias=None):
    """kernels.sdpa's forward: per (batch, head) P = softmax(q k^T scale + mask) into p
    (B*H, T, T) (0 above the diagonal when causal), O = P v into the rows out (B, T, d); q,
    k, v from qkv + bias when a bias is given."""
    bsz, t, d = out.shape
    q, k, v = _sdpa_heads(qkv if bias is None else qkv + bias, n_heads)
    s = q @ k.transpose(0, 1, 3, 2) * scale
    if causal:
        s = np.where(np.tril(np.ones((t, t), bool)), s, -np.inf)
    e = np.exp(s - s.max(axis=-1, keepdims=True))
    pr = e / e.sum(axis=-1, keepdims=True)
    p[...] = pr.reshape(p.shape)
    out[...] = (pr @ v).transpose(0, 2, 1, 3).reshape(bsz, t, d)
    return out


def sdpa_backward(dqkv, do, p, qkv, n_heads, scale, causal=True, bias=None):
    """kernels.sdpa's backward: d[q | k | v] rows (B, T, 3d) of sdpa_forward for dO rows do
    (B, T, d), the forward's probabilities p (B*H, T, T), qkv and bias."""
    bsz, t, d = do.shape
    q, k, v = _sdpa_heads(qkv if bias is None else qkv + bias, n_heads)
    pr = p.reshape(bsz, n_heads, t, t)
    if causal:  # the kernel leaves the masked half unwritten: those probabilities are 0
        pr = np.where(np.tril(np.ones((t, t), bool)), pr, 0.0)
    g = do.reshape(bsz, t, n_heads, d // n_heads).transpose(0, 2, 1, 3)
    dp = g @ v.transpose(0, 1, 3, 2)
    ds = pr * (dp - (dp * pr).sum(axis=-1, keepdims=True))
    grads = (ds @ k * scale, ds.transpose(0, 1, 3, 2) @ q * scale, pr.transpose(0, 1, 3, 2) @ g)
    for i, gr in enumerate(grads):
        dqkv[..., i * d:(i + 1) * d] = gr.transpose(0, 2, 1, 3).reshape(bsz, t, d)
    return dqkv

"""Naive NumPy versions of every kernel: the oracle for tests and the baseline for benchmarks.

Each function has the same signature as the fast kernel of the same name (outputs first,
then inputs, then options) but is written as plain whole-array NumPy, the way the formulas
read, with no blocking, no fusion and no BLAS tricks. Speed is not a goal here; clarity is.
"""
from __future__ import annotations

import math

import numpy as np
from scipy.special import erf as _erf
from scipy.special import expit as _expit

_SQRT_2_OVER_PI = math.sqrt(2.0 / math.pi)
_GELU_C = 0.044715


# ----------------------------------------------------------------------------- gemm
def gemm(out, a, b, trans_a=False, trans_b=False, alpha=1.0, beta=0.0):
    """out = alpha * op(a) @ op(b) + beta * out, with np.matmul."""
    A = a.T if trans_a else a
    B = b.T if trans_b else b
    out[...] = alpha * (A @ B) + (beta * out if beta != 0.0 else 0.0)
    return out


# ----------------------------------------------------------------------------- activations
# One pair per activation: act(z) and act'(z) as new arrays, ``(z, negative_slope)`` (the
# slope is read by leaky_relu only), written from the formulas independently of the scalar
# pairs the fast kernels are generated from (kernels.activation_pairs, whose registry points
# here). ``activation`` / ``activation_grad`` find a pair by its name in this module.
def _sigmoid(z):
    # 1/(1+exp(-z)) written to avoid overflow for large |z|.
    e = np.exp(-np.abs(z))
    return np.where(z >= 0, 1.0 / (1.0 + e), e / (1.0 + e)).astype(z.dtype)


def identity(z, negative_slope=0.01):
    return z.copy()


def identity_grad(z, negative_slope=0.01):
    return np.ones_like(z)


def relu(z, negative_slope=0.01):
    return np.maximum(z, 0).astype(z.dtype)


def relu_grad(z, negative_slope=0.01):
    return (z > 0).astype(z.dtype)


def leaky_relu(z, negative_slope=0.01):
    return np.where(z > 0, z, negative_slope * z).astype(z.dtype)


def leaky_relu_grad(z, negative_slope=0.01):
    return np.where(z > 0, 1.0, negative_slope).astype(z.dtype)


def gelu(z, negative_slope=0.01):
    """z Phi(z) (Hendrycks & Gimpel 2016), Phi through erf."""
    return (0.5 * z * (1.0 + _erf(z / math.sqrt(2.0)))).astype(z.dtype)


def gelu_grad(z, negative_slope=0.01):
    cdf = 0.5 * (1.0 + _erf(z / math.sqrt(2.0)))
    pdf = np.exp(-0.5 * z * z) / math.sqrt(2.0 * math.pi)
    return (cdf + z * pdf).astype(z.dtype)


def gelu_tanh(z, negative_slope=0.01):
    """GELU's tanh approximation, 0.5 z (1 + tanh(sqrt(2/pi) (z + 0.044715 z^3)))."""
    return (0.5 * z * (1.0 + np.tanh(_SQRT_2_OVER_PI * (z + _GELU_C * z**3)))).astype(z.dtype)


def gelu_tanh_grad(z, negative_slope=0.01):
    u = _SQRT_2_OVER_PI * (z + _GELU_C * z**3)
    t = np.tanh(u)
    du = _SQRT_2_OVER_PI * (1.0 + 3.0 * _GELU_C * z * z)
    return (0.5 * (1.0 + t) + 0.5 * z * (1.0 - t * t) * du).astype(z.dtype)


def silu(z, negative_slope=0.01):
    """z sigmoid(z)."""
    return (z * _sigmoid(z)).astype(z.dtype)


def silu_grad(z, negative_slope=0.01):
    s = _sigmoid(z)
    return (s * (1.0 + z * (1.0 - s))).astype(z.dtype)


def sigmoid(z, negative_slope=0.01):
    return _sigmoid(z)


def sigmoid_grad(z, negative_slope=0.01):
    s = _sigmoid(z)
    return s * (1.0 - s)


def tanh(z, negative_slope=0.01):
    return np.tanh(z)


def tanh_grad(z, negative_slope=0.01):
    t = np.tanh(z)
    return 1.0 - t * t


def relu2(z, negative_slope=0.01):
    """Squared ReLU, max(z, 0)^2 (So et al. 2021, "Primer")."""
    return (np.maximum(z, 0) ** 2).astype(z.dtype)


def relu2_grad(z, negative_slope=0.01):
    return (2.0 * np.maximum(z, 0)).astype(z.dtype)


def mish(z, negative_slope=0.01):
    """Mish, z tanh(softplus(z)) (Misra 2019); softplus(z) = log(1 + exp(z)) via logaddexp."""
    return (z * np.tanh(np.logaddexp(0.0, z))).astype(z.dtype)


def mish_grad(z, negative_slope=0.01):
    """tanh(softplus(z)) + z sigmoid(z) (1 - tanh(softplus(z))^2): softplus' is the sigmoid."""
    t = np.tanh(np.logaddexp(0.0, z))
    return (t + z * _sigmoid(z) * (1.0 - t * t)).astype(z.dtype)


def _pair(act):
    """The reference pair ``act`` / ``act_grad`` defined above (no fast kernel involved)."""
    if isinstance(act, str) and act.isidentifier() and not act.startswith("_"):
        fn, grad = globals().get(act), globals().get(act + "_grad")
        if callable(fn) and callable(grad):
            return fn, grad
    raise ValueError(f"act: expected the name of an activation with a reference pair here "
                     f"(e.g. 'relu', 'gelu'), got {act!r}")


def activation(z, act="relu", negative_slope=0.01):
    """act(z) as a new array, for any name in kernels.activations.ACTIVATIONS."""
    return _pair(act)[0](z, negative_slope)


def activation_grad(z, act="relu", negative_slope=0.01):
    """act'(z) as a new array."""
    return _pair(act)[1](z, negative_slope)


def bias_act_forward(h, z, bias=None, act="relu", negative_slope=0.01, grad=None):
    """z += bias (in place, if bias is given); h = act(z); grad = act'(z) if grad is given
    (both are computed before either is written, so h or grad may be z itself)."""
    if bias is not None:
        z += bias
    hv = activation(z, act, negative_slope)
    gv = None if grad is None else activation_grad(z, act, negative_slope)
    h[...] = hv
    if grad is not None:
        grad[...] = gv
    return h


def act_backward(dz, dh, z, act="relu", negative_slope=0.01, h=None):
    """dz = dh * act'(z)."""
    dz[...] = dh * activation_grad(z, act, negative_slope)
    return dz


def act_backward_cached(dz, dh, grad):
    """dz = dh * grad, with grad = act'(z) from bias_act_forward."""
    dz[...] = dh * grad
    return dz


def bias_grad(db, dz):
    """db += dz.sum(axis=0)."""
    db += dz.sum(axis=0)
    return db


# ----------------------------------------------------------------------------- layernorm
def layernorm_forward(out, mean, rstd, x, gamma, beta, eps=1e-5):
    """out = (x - mean) * rstd * gamma + beta over the last axis; caches mean and rstd."""
    mu = x.mean(axis=1)
    var = ((x - mu[:, None]) ** 2).mean(axis=1)
    mean[...] = mu
    rstd[...] = 1.0 / np.sqrt(var + eps)
    out[...] = (x - mean[:, None]) * rstd[:, None] * gamma + beta
    return out


def layernorm_backward(dx, dgamma, dbeta, dout, x, mean, rstd, gamma, accumulate=False):
    """dx = rstd * (g - mean(g) - xhat * mean(g * xhat)) with g = dout * gamma (dx += that
    when ``accumulate``); dgamma += sum(dout * xhat), dbeta += sum(dout)."""
    xhat = (x - mean[:, None]) * rstd[:, None]
    g = dout * gamma
    dgamma += (dout * xhat).sum(axis=0)
    dbeta += dout.sum(axis=0)
    d = rstd[:, None] * (g - g.mean(axis=1, keepdims=True)
                         - xhat * (g * xhat).mean(axis=1, keepdims=True))
    dx[...] = dx + d if accumulate else d
    return dx


# ----------------------------------------------------------------------------- dropout
def dropout_forward(out, mask, x, p, rng):
    """Inverted dropout: mask = (u >= p) / (1 - p) with u ~ U[0, 1) from rng; out = x * mask."""
    u = rng.random(x.shape, dtype=x.dtype)
    mask[...] = (u >= p) / (1.0 - p)
    out[...] = x * mask
    return out


def dropout_backward(dx, dout, mask):
    """dx = dout * mask (the mask of the forward pass)."""
    dx[...] = dout * mask
    return dx


# ----------------------------------------------------------------------------- gMLP gating
def gate_forward(a, g, p):
    """Spatial gating of gMLP (Liu et al. 2021), halved-input convention of kernels.gating:
    in (g, p) = (Zg/2, P/2); out a = sigmoid(Zg) * P and g = S = 2 * sigmoid(Zg)."""
    zg, pp = 2.0 * g, 2.0 * p
    s = _expit(zg)
    a[...] = s * pp
    g[...] = 2.0 * s
    return a


def gate_backward(g, p, da):
    """Backward of ``gate_forward``: in (g, p, da) = (S, P/2, dA); out g = 2 dZg and
    p = 2 dP with dP = dA * sigmoid(Zg), dZg = dA * P * sigmoid(Zg) * (1 - sigmoid(Zg)).
    ``da`` is left as it was (the fast kernel leaves it undefined)."""
    s, pp = g / 2.0, 2.0 * p
    dzg = da * pp * s * (1.0 - s)
    dp = da * s
    g[...] = 2.0 * dzg
    p[...] = 2.0 * dp
    return g


# ----------------------------------------------------------------------------- row fills
def fill_rows(y, b=None, res=None):
    """y = b in every row, y = res, or y = res + b (b of shape (d,), y and res (n, d))."""
    if res is None:
        y[...] = b
    elif b is None:
        y[...] = res
    else:
        y[...] = res + b
    return y


def add(out, a, b):
    """out = a + b."""
    out[...] = a + b
    return out


# ----------------------------------------------------------------------------- losses
def softmax(logits):
    """Row-wise softmax as a new array."""
    e = np.exp(logits - logits.max(axis=1, keepdims=True))
    return e / e.sum(axis=1, keepdims=True)


def _target_probs(target, n_classes, dtype):
    if target.ndim == 1:
        y = np.zeros((target.shape[0], n_classes), dtype)
        y[np.arange(target.shape[0]), target] = 1.0
        return y
    return target.astype(dtype)


def softmax_cross_entropy_forward(probs, logits, target):
    """probs = softmax(logits); returns mean over rows of -sum(y * log softmax(logits)).
    ``target`` is (N,) integer labels or (N, C) probabilities."""
    shifted = logits - logits.max(axis=1, keepdims=True)
    logsum = np.log(np.exp(shifted).sum(axis=1, keepdims=True))
    logp = shifted - logsum
    probs[...] = np.exp(logp)
    y = _target_probs(target, logits.shape[1], logits.dtype)
    return float(-(y * logp).sum() / logits.shape[0])


def softmax_cross_entropy_backward(dlogits, probs, target):
    """dlogits = (probs - y) / N."""
    y = _target_probs(target, probs.shape[1], probs.dtype)
    dlogits[...] = (probs - y) / probs.shape[0]
    return dlogits


def mse_forward(pred, target):
    """mean((pred - target)**2) over all elements, as torch.nn.MSELoss."""
    return float(((pred - target) ** 2).mean())


def mse_backward(dpred, pred, target):
    """dpred = 2 * (pred - target) / pred.size."""
    dpred[...] = 2.0 * (pred - target) / pred.size
    return dpred


# ----------------------------------------------------------------------------- optimizers
def adamw_update(param, grad, exp_avg, exp_avg_sq, step, lr, beta1=0.9, beta2=0.999,
                 eps=1e-8, weight_decay=1e-2, zero_grad=False):
    """One AdamW step (PyTorch semantics); ``step`` counts from 1 for the first update.

    param *= 1 - lr * wd; m = b1 m + (1-b1) g; v = b2 v + (1-b2) g^2;
    param -= lr / (1 - b1^t) * m / (sqrt(v / (1 - b2^t)) + eps); then grad = 0 if zero_grad."""
    param *= 1.0 - lr * weight_decay
    exp_avg[...] = beta1 * exp_avg + (1.0 - beta1) * grad
    exp_avg_sq[...] = beta2 * exp_avg_sq + (1.0 - beta2) * grad * grad
    bc1 = 1.0 - beta1**step
    bc2 = 1.0 - beta2**step
    param -= lr / bc1 * exp_avg / (np.sqrt(exp_avg_sq / bc2) + eps)
    if zero_grad:
        grad[...] = 0.0
    return param


def sgd_update(param, grad, momentum_buf, lr, momentum=0.0, weight_decay=0.0,
               dampening=0.0, nesterov=False, first_step=False, zero_grad=False):
    """One SGD step (PyTorch semantics): g = grad + wd * param; buf = g on the first step,
    else momentum * buf + (1 - dampening) * g; param -= lr * (g + momentum * buf if nesterov
    else buf). With momentum == 0, param -= lr * g and ``momentum_buf`` may be None. Then
    grad = 0 if zero_grad."""
    g = grad + weight_decay * param
    if momentum != 0.0:
        if first_step:
            momentum_buf[...] = g
        else:
            momentum_buf[...] = momentum * momentum_buf + (1.0 - dampening) * g
        g = g + momentum * momentum_buf if nesterov else momentum_buf
    param -= lr * g
    if zero_grad:
        grad[...] = 0.0
    return param


# ----------------------------------------------------------------------------- softmax layers
def softmax_forward(y, x):
    """y = exp(x) / sum(exp(x)) over the last axis (shifted by the row max)."""
    y[...] = softmax(x)
    return y


def softmax_backward(dx, dy, y):
    """dx = J^T dy with J = diag(y) - y y^T per row: y * (dy - sum(dy * y))."""
    dx[...] = y * (dy - (dy * y).sum(axis=1, keepdims=True))
    return dx


def log_softmax_forward(y, x):
    """y = x - log(sum(exp(x))) over the last axis (shifted by the row max)."""
    shifted = x - x.max(axis=1, keepdims=True)
    y[...] = shifted - np.log(np.exp(shifted).sum(axis=1, keepdims=True))
    return y


def log_softmax_backward(dx, dy, y):
    """dx = dy - softmax(x) * sum(dy), with softmax(x) = exp(y)."""
    dx[...] = dy - np.exp(y) * dy.sum(axis=1, keepdims=True)
    return dx


# ----------------------------------------------------------------------------- gated FFN
def glu_forward(h, g, u, act="silu", negative_slope=0.01):
    """h = act(g) * u; then g = act'(g) * u and u = act(g) (what the backward multiplies by)."""
    a = activation(g, act, negative_slope)
    da = activation_grad(g, act, negative_slope)
    h[...] = a * u
    g[...] = da * u
    u[...] = a
    return h


def glu_backward(g, u, dh):
    """g = dh * act'(G) * U and u = dh * act(G), from the factors glu_forward left."""
    g[...] = g * dh
    u[...] = u * dh
    return g


def fill_by_row(out, v):
    """out[i, :] = v[i]."""
    out[...] = v[:, None]
    return out


def rowsum(out, x, beta=1.0):
    """out = x.sum(axis=1) + beta * out."""
    out[...] = x.sum(axis=1) + (beta * out if beta != 0.0 else 0.0)
    return out


# ----------------------------------------------------------------------------- token mixing
def swap01(out, x):
    """out[i, j] = x[j, i] (the two leading axes swapped)."""
    out[...] = np.swapaxes(x, 0, 1)
    return out


def sgu_gate_forward(a, s_tm, bias, u):
    """a = u * (s_tm with (T, B) swapped to (B, T) + bias[t])."""
    a[...] = u * (np.swapaxes(s_tm, 0, 1) + bias[None, :, None])
    return a


def sgu_gate_backward(du, s_tm, dbias, tmp, da, bias, u):
    """For a = u * s, s = swap01(s_tm) + bias: du = da * s; s_tm = ds = da * u time-major;
    dbias += ds summed over batch and channels."""
    s = np.swapaxes(s_tm, 0, 1) + bias[None, :, None]
    ds = da * u
    du[...] = da * s
    s_tm[...] = np.swapaxes(ds, 0, 1)
    dbias += ds.sum(axis=(0, 2))
    return s_tm


def causal_weight(out, w, mask):
    """out = w * mask."""
    out[...] = w * mask
    return out


def causal_grad_add(dw, g, mask):
    """g *= mask; dw += g."""
    g[...] = g * mask
    dw[...] = dw + g
    return dw


# ----------------------------------------------------------------------------- embedding
def embedding_forward(out, ids, weight, residual=None):
    """out[i] = weight[ids[i]] (+ residual[i]) by fancy indexing."""
    out[...] = weight[ids] if residual is None else weight[ids] + residual
    return out


def embedding_backward(dweight, ids, dout):
    """dweight[ids[i]] += dout[i], repeats accumulating (np.add.at)."""
    np.add.at(dweight, ids, dout)
    return dweight


# ----------------------------------------------------------------------------- attention
# In their own file (kernels/reference_attention.py), one namespace here.
from .reference_attention import (attention, causal_fill, heads_merge,  # noqa: E402,F401
                                  heads_split, sdpa_backward, sdpa_forward)

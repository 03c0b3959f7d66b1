"""The gMLP block of Liu et al. 2021, "Pay Attention to MLPs": channel projections around a
spatial gating unit that mixes the tokens of each sequence, which lets a stack of MLP blocks
model sequences without attention. ``GMLPBlock`` is the residual block, ``SpatialGatingUnit``
its token-mixing child.

Token mixing multiplies every sequence by the same (T, T) weight. Kept time-major, V' is one
(T, B * c) matrix and ``S = W V'`` is one GEMM over the whole batch (kernels.token_mix moves
between batch-major and time-major with copies; all arithmetic runs on contiguous arrays).
"""
from __future__ import annotations

from types import SimpleNamespace

import numpy as np

from kernels import ops

from .._checks import check_bool
from .blocks import LayerNorm
from .module import (Module, Parameter, check_float, check_positive_int, check_sequences,
                     init_weight, make_rng)
from .registry import register_block

__all__ = ["GMLPBlock", "SpatialGMLPBlock", "SpatialGatingUnit"]


_check_bool = check_bool


def _check_sequences(x, seq_len: int, causal: bool, d: int, what: str, name: str = "x"):
    """(B, T) of a (B, T, d) input ``x``, else ValueError/TypeError (before anything changes)."""
    b, t = check_sequences(x, d, f"sequences: {what} mixes the T tokens of each", name)
    if causal:
        if not 1 <= t <= seq_len:
            raise ValueError(f"{name}: expected 1 <= T <= seq_len = {seq_len} tokens (a causal "
                             f"{what} takes any prefix length), got T = {t} in shape {x.shape}")
    elif t != seq_len:
        raise ValueError(f"{name}: expected T == seq_len = {seq_len} tokens (a non-causal {what} "
                         f"mixes exactly seq_len; causal=True allows shorter), got T = {t} in "
                         f"shape {x.shape}")
    return b, t


class _TokenMixing(Module):
    """What both modules here share: input (B, T, in_features) whose T tokens they mix, T ==
    seq_len (or T <= seq_len when ``causal``), checked before anything runs."""

    _what = ""          # the module in error messages
    _repr_fields = ()   # attributes extra_repr shows, in order
    config_attrs = {"eps": "norm.eps"}  # held by the LayerNorm child

    def _set_sequences(self, seq_len, causal):
        self.seq_len = check_positive_int("seq_len", seq_len)
        self.causal = _check_bool("causal", causal)
        c = self._saved
        c.bt = None       # (B, T) of the last forward
        c.pending = None  # (B, T) of the call being checked (committed by _forward)

    def extra_repr(self):
        return ", ".join(f"{k}={getattr(self, k)}" for k in self._repr_fields)

    def check_input(self, x, name: str = "x") -> tuple:
        _check_sequences(x, self.seq_len, self.causal, self.in_features, self._what, name)
        return super().check_input(x, name)

    def forward(self, x, *, residual=None):
        """The module on ``x`` of shape (B, T, in_features) (``+ residual`` when given); the
        class says what it computes and returns."""
        self._saved.pending = _check_sequences(x, self.seq_len, self.causal, self.in_features,
                                           self._what)
        return super().forward(x, residual=residual)


class SpatialGatingUnit(_TokenMixing):
    """``s(Z) = U * (W LN(V) + b)`` on (B, T, d_ffn) input Z = [U | V] (U the first d_ffn/2
    channels, V the rest), mixing tokens: ``S[b, t, c] = sum_s W[t, s] LN(V)[b, s, c] + b[t]``.
    Output (B, T, d_ffn/2). Parameters ``W`` (seq_len, seq_len) uniform in +-1e-3/seq_len and
    ``b`` (seq_len,) = 1, so that s(Z) ~ U at the start (Liu et al. 2021), and the LayerNorm
    ``norm`` over V's channels. With ``causal`` only W[t, s], s <= t, is used: the mask is
    applied in forward and backward, so the upper triangle affects no output and gets no
    gradient, and any T <= seq_len is accepted (W[:T, :T], b[:T]); otherwise T == seq_len.
    """

    _what = "spatial gating unit"
    _repr_fields = ("d_ffn", "seq_len", "causal", "dtype")

    def __init__(self, d_ffn: int, seq_len: int, *, dtype=np.float32, rng=None,
                 causal: bool = False, eps: float = 1e-5):
        super().__init__(dtype)
        self.d_ffn = self.in_features = check_positive_int("d_ffn", d_ffn)
        if d_ffn % 2:
            raise ValueError(f"d_ffn: expected an even number (split into halves U and V), "
                             f"got {d_ffn}")
        self.half = d_ffn // 2
        self._set_sequences(seq_len, causal)
        rng = make_rng(rng)
        t = self.seq_len
        init_eps = 1e-3 / t
        self.W = Parameter(rng.uniform(-init_eps, init_eps, (t, t)).astype(self.dtype))
        self.b = Parameter(np.ones(t, self.dtype))
        self.norm = LayerNorm(self.half, dtype=dtype, eps=eps)
        c = self._saved
        c.mask = None     # (T, T) lower-triangular ones (not a work buffer: it outlives a call)
        c.z3 = None       # (B, T, d_ffn) the last input, by reference
        c.vp = None       # (T, B * half) LN(V) time-major (the child's output)
        c.wm = None       # (T, T) the weight the forward used (W or masked W)

    def out_features(self, d_in: int) -> int:
        return self.half

    def _make_views(self, key):
        b, t = key
        n, h, ws = b * t, self.half, self._ws
        v = SimpleNamespace(
            vtm=ws.get("vtm", n, h),            # (T*B, h) V time-major
            stm=ws.get("stm", t, b * h),        # (T, B*h) W V' (S without b); dS in backward
            a=ws.get("a", n, h),                # (n, h) output U * S
            tmp=ws.get("tmp", n, h),            # (n, h) backward scratch
            dvp=ws.get("dvp", t, b * h),        # (T, B*h) dV' time-major
            dz=ws.get("dz", n, 2 * h))          # (n, 2h) input gradient [dU | dV]
        v.vtm3, v.stm3 = v.vtm.reshape(t, b, h), v.stm.reshape(t, b, h)
        v.a3 = v.a.reshape(b, t, h)
        v.tmp3 = v.tmp.reshape(b, t, h)
        v.dz3 = v.dz.reshape(b, t, 2 * h)
        v.du3, v.dv3 = v.dz3[:, :, :h], v.dz3[:, :, h:]
        if self.causal:
            v.wm = ws.get("wm", t, t)           # (T, T) masked W
            v.gw = ws.get("gw", t, t)           # (T, T) W's gradient before the mask
        return v

    def _weight(self, v, t):
        """The (T, T) weight of this call: W itself, or its masked corner (causal)."""
        if not self.causal:
            return self.W.data
        if self._saved.mask is None or self._saved.mask.shape[0] != t:
            self._saved.mask = np.tri(t, dtype=self.dtype)  # only when T changes
        ops.causal_weight(v.wm, self.W.data[:t, :t], self._saved.mask)
        return v.wm

    def _forward(self, z2, res2):
        b, t = self._saved.bt = self._saved.pending  # the base class has checked the rest of z
        h = self.half
        v = self._views((b, t))
        z3 = z2.reshape(b, t, 2 * h)
        self._saved.z3 = z3
        if b == 0:
            return v.a
        ops.swap01(v.vtm3, z3[:, :, h:])                 # V time-major
        vp = self.norm(v.vtm).reshape(t, b * h)         # LN over channels, rows in any order
        w = self._saved.wm = self._weight(v, t)
        ops.gemm(v.stm, w, vp, False, False, 1.0, 0.0)  # all B sequences in one GEMM
        ops.sgu_gate_forward(v.a3, v.stm3, self.b.data[:t], z3[:, :, :h])  # U * (W V' + b)
        self._saved.vp = vp
        return v.a

    def _backward(self, da2, acc2):
        b, t = self._saved.bt
        h = self.half
        v = self._views((b, t))
        if b == 0:
            return v.dz
        ops.sgu_gate_backward(v.du3, v.stm3, self.b.grad[:t], v.tmp3, da2.reshape(b, t, h),
                              self.b.data[:t], self._saved.z3[:, :, :h])  # dU; dS over S; db
        if self.causal:
            ops.gemm(v.gw, v.stm, self._saved.vp, False, True, 1.0, 0.0)
            ops.causal_grad_add(self.W.grad[:t, :t], v.gw, self._saved.mask)
        else:
            ops.gemm(self.W.grad, v.stm, self._saved.vp, False, True, 1.0, 1.0)  # dW += dS V'^T
        ops.gemm(v.dvp, self._saved.wm, v.stm, True, False, 1.0, 0.0)            # dV' = W^T dS
        dv = self.norm.backward(v.dvp.reshape(t * b, h))
        ops.swap01(v.dv3, dv.reshape(t, b, h))           # dV back batch-major
        self._saved.z3 = self._saved.vp = None
        return v.dz


@register_block(
    doc="gMLP block (Liu et al. 2021) on (B, seq_len, d_model): y = x + s(Z) W_out + b_out, "
        "Z = GELU(LN(x) W_in + b_in), s the spatial gating unit mixing the tokens",
    twin="engine.models.naive:NaiveGMLPBlock", dims=("d_model", "d_ff", "seq_len"),
    example={"d_model": 12, "d_ff": 20, "seq_len": 5}, options={"causal": False},
    variants=({"causal": False}, {"causal": True}),
    build=lambda dims, *, dtype, rng, causal: GMLPBlock(
        dims["d_model"], dims["d_ff"], dims["seq_len"], causal=causal, dtype=dtype, rng=rng))
class GMLPBlock(_TokenMixing):
    """One gMLP block (Liu et al. 2021) on (B, T, d_model) input, T == seq_len (or T <=
    seq_len when ``causal``)::

        Z = GELU(LN(x) W_in + b_in)           (B, T, d_ffn)
        y = x + s(Z) W_out + b_out            s: the SpatialGatingUnit ``sgu``

    Parameters: ``norm.gamma``, ``norm.beta`` (d_model,), ``W_in`` (d_model, d_ffn), ``b_in``,
    ``sgu.norm.gamma``, ``sgu.norm.beta`` (d_ffn/2,), ``sgu.W`` (seq_len, seq_len), ``sgu.b``
    (seq_len,), ``W_out`` (d_ffn/2, d_model), ``b_out``. ``W_in`` starts He (GELU follows),
    ``W_out`` Xavier, biases zero, ``sgu`` as the paper (W near zero, b = 1). ``d_ffn`` must be
    even. ``eps`` is both LayerNorms'. Output ``x + gMLP(x)``, (B, T, d_model).
    """

    _what = "gMLP block"
    _repr_fields = ("d_model", "d_ffn", "seq_len", "causal", "dtype")

    def __init__(self, d_model: int, d_ffn: int, seq_len: int, *, dtype=np.float32, rng=None,
                 causal: bool = False, eps: float = 1e-5):
        super().__init__(dtype)
        self.d_model = self.in_features = check_positive_int("d_model", d_model)
        self.d_ffn = check_positive_int("d_ffn", d_ffn)
        if d_ffn % 2:
            raise ValueError(f"d_ffn: expected an even number (Z splits into halves U and V), "
                             f"got {d_ffn}")
        self._set_sequences(seq_len, causal)
        check_float("eps", eps, 0.0)
        rng = make_rng(rng)
        dt, h = self.dtype, d_ffn // 2
        self.norm = LayerNorm(d_model, dtype=dtype, eps=eps)
        self.W_in = Parameter(init_weight(d_model, d_ffn, "he", dt, rng))
        self.b_in = Parameter(np.zeros(d_ffn, dt))
        self.sgu = SpatialGatingUnit(d_ffn, seq_len, dtype=dtype, rng=rng, causal=causal,
                                     eps=eps)
        self.W_out = Parameter(init_weight(h, d_model, "xavier", dt, rng))
        self.b_out = Parameter(np.zeros(d_model, dt))
        c = self._saved
        c.xn = None       # (n, d_model) LN(x) (the child's output)
        c.a = None        # (n, d_ffn/2) s(Z) (the child's output)

    def _make_views(self, n):
        ws, d, f = self._ws, self.d_model, self.d_ffn
        return SimpleNamespace(
            zpre=ws.get("zpre", n, f),       # (n, d_ffn) LN(x) W_in + b_in, then GELU' of it
            z=ws.get("z", n, f),             # (n, d_ffn) Z = GELU(...)
            y=ws.get("y", n, d),             # (n, d_model) output
            da=ws.get("da", n, f // 2),      # (n, d_ffn/2) d s(Z)
            dxn=ws.get("dxn", n, d))         # (n, d_model) d LN(x)

    def _forward(self, x2, res2):
        n = x2.shape[0]
        b, t = self._saved.bt = self._saved.pending  # the base class has checked the rest of x
        v = self._views(n)
        xn = self.norm(x2)
        if n:
            ops.gemm(v.zpre, xn, self.W_in.data, False, False, 1.0, 0.0)
            ops.bias_act(v.z, v.zpre, self.b_in.data, "gelu", 0.01, v.zpre)  # GELU' over zpre
        a2 = self.sgu(v.z.reshape(b, t, self.d_ffn)).reshape(n, self.d_ffn // 2)
        if n:
            ops.fill_rows(v.y, self.b_out.data, x2)                    # y = x + b_out, then
            ops.gemm(v.y, a2, self.W_out.data, False, False, 1.0, 1.0)  # += s(Z) W_out
        self._saved.xn, self._saved.a = xn, a2
        return v.y

    def gemm_list(self, lead) -> list:
        """3 forward, 6 backward on (B, T, d_model): W_in (one GEMM for both halves U and V),
        the token mixing (one (T, T) x (T, B d_ffn/2) GEMM over the whole batch) and W_out.
        Causal, dW is a fresh product that the mask then adds into the gradient."""
        b, t = lead
        n, d, f, h = b * t, self.d_model, self.d_ffn, self.d_ffn // 2
        fwd = [(n, f, d, False, False, 0.0),              # LN(x) W_in (n, d_ffn)
               (t, b * h, t, False, False, 0.0),          # S = W V' time-major (T, B h)
               (n, d, h, False, False, 0.0)]              # y = x + (U * S) W_out
        bwd = [(h, d, n, True, False, 1.0),               # dW_out += A^T dy
               (n, h, d, False, True, 0.0),               # dA = dy W_out^T
               (t, t, b * h, False, True, 0.0 if self.causal else 1.0),  # dW (+)= dS V'^T
               (t, b * h, t, True, False, 0.0),           # dV' = W^T dS
               (d, f, n, True, False, 1.0),               # dW_in += LN(x)^T dZ
               (n, d, f, False, True, 0.0)]               # d LN(x) = dZ W_in^T
        return fwd + bwd

    def _backward(self, dy2, acc2):
        n = dy2.shape[0]
        v = self._views(n)
        b, t = self._saved.bt
        if n:
            ops.colsum(self.b_out.grad, dy2, 1.0)
            ops.gemm(self.W_out.grad, self._saved.a, dy2, True, False, 1.0, 1.0)  # += A^T dy
            ops.gemm(v.da, dy2, self.W_out.data, False, True, 1.0, 0.0)       # dA = dy W_out^T
        dz = self.sgu.backward(v.da.reshape(b, t, self.d_ffn // 2))
        dz2 = dz.reshape(n, self.d_ffn)
        if n:
            ops.act_backward_cached(dz2, dz2, v.zpre, self.b_in.grad)  # GELU; db_in += sum
            ops.gemm(self.W_in.grad, self._saved.xn, dz2, True, False, 1.0, 1.0)  # += LN(x)^T dZ
            ops.gemm(v.dxn, dz2, self.W_in.data, False, True, 1.0, 0.0)       # dZ W_in^T
        dx = self.norm.backward(v.dxn)
        ops.add(dx, dx, dy2)                                                 # the residual path
        self._saved.xn = self._saved.a = None
        return dx


# The name that says what GMLPBlock does: Liu et al.'s gMLP block, whose spatial gating unit
# mixes tokens, unlike ChannelGatedMLP (GMLP), which gates channels within each token.
SpatialGMLPBlock = GMLPBlock

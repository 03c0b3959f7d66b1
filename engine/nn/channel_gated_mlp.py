"""``GMLP`` (also ``ChannelGatedMLP``): a per-token gated MLP after Liu et al. 2021, "Pay
Attention to MLPs" (the channel gating without the token mixing of their gMLP block,
engine/nn/gmlp_block.py). ``W_gate`` and ``W_proj`` are one GEMM each way (kernels.gating).
"""
from __future__ import annotations

from types import SimpleNamespace

import numpy as np

from kernels import ops

from .module import SKIP_DX, Module, Parameter, check_positive_int, init_weight, make_rng
from .registry import register_block

__all__ = ["GMLP", "ChannelGatedMLP"]


def _widths(dims) -> tuple:
    """(d_in, d_hidden, d_ffn, d_out) from the registry's sizes (d_in, d_out: d_model unless
    given)."""
    d = dims["d_model"]
    return dims.get("d_in", d), d, dims["d_ff"], dims.get("d_out", d)


@register_block(
    doc="gated MLP, Y = (sigmoid(Z W_gate) * Z W_proj) W_out with Z = GELU(X W_in) "
        "(Liu et al. 2021, channel gating)",
    twin="engine.models.naive:NaiveGMLP", dims=("d_model", "d_ff"),
    example={"d_in": 7, "d_model": 12, "d_ff": 20, "d_out": 5},
    build=lambda dims, *, dtype, rng: GMLP(*_widths(dims), dtype=dtype, rng=rng),
    d_in=lambda dims: _widths(dims)[0], d_out=lambda dims: _widths(dims)[3],
    cli=("gmlp", "GMLP(d_in, d_hidden, d_ff, d_out)"))
class GMLP(Module):
    """Gated MLP applied per token (the channel gating of Liu et al. 2021, "Pay Attention to
    MLPs", without token mixing): Z = GELU(X W_in), G = sigmoid(Z W_gate), P = Z W_proj,
    A = G * P, Y = A W_out; no biases.

    ``W_gate`` and ``W_proj`` (d_hidden, d_ffn) are kept transposed and back to back in the
    arena, so together they are one C-contiguous (2*d_ffn, d_hidden) weight: one GEMM
    computes both products, and the gating runs on the transposed products [Zg; P]^T
    (2*d_ffn, N), whose halves are flat. That GEMM computes half the products (alpha=0.5):
    with sigmoid(z) = (1 + tanh(z/2)) / 2, the gating is three passes (kernels.gating).
    Init: He for ``W_in`` (GELU follows it), Xavier for ``W_gate``, ``W_proj`` and ``W_out``.
    """

    fuses_residual = True
    fuses_dx_acc = True
    acc_alias_safe = True  # dy is read only by the first two backward GEMMs
    skips_input_grad = True

    def __init__(self, d_in: int, d_hidden: int, d_ffn: int, d_out: int, *, dtype=np.float32,
                 rng=None):
        super().__init__(dtype)
        self.d_in = self.in_features = check_positive_int("d_in", d_in)
        self.d_hidden = check_positive_int("d_hidden", d_hidden)
        self.d_ffn = check_positive_int("d_ffn", d_ffn)
        self.d_out = check_positive_int("d_out", d_out)
        rng = make_rng(rng)
        dt, dh = self.dtype, self.d_hidden
        self.W_in = Parameter(init_weight(self.d_in, dh, "he", dt, rng))
        # F-ordered: stored as their transposes, back to back (see _params_moved).
        self.W_gate = Parameter(np.asfortranarray(init_weight(dh, self.d_ffn, "xavier", dt, rng)))
        self.W_proj = Parameter(np.asfortranarray(init_weight(dh, self.d_ffn, "xavier", dt, rng)))
        self.W_out = Parameter(init_weight(self.d_ffn, self.d_out, "xavier", dt, rng))
        self._saved.x = None

    def _params_moved(self):
        # (2f, d_hidden) rows [W_gate^T; W_proj^T] and their gradient: views, no copy.
        self._set_adjacent(("Wgp_T", "dWgp_T"), (self.W_gate, self.W_proj),
                           "GMLP: W_gate and W_proj", (2 * self.d_ffn, self.d_hidden))

    def out_features(self, d_in: int) -> int:
        return self.d_out

    def extra_repr(self):
        return (f"d_in={self.d_in}, d_hidden={self.d_hidden}, d_ffn={self.d_ffn}, "
                f"d_out={self.d_out}, dtype={self.dtype}")

    def _make_views(self, n):
        ws, dh, f = self._ws, self.d_hidden, self.d_ffn
        # Transposed buffers are flat so that (rows, n) views stay contiguous for any n.
        gpt = ws.get("gpt", 2 * f * n)  # (2f*n,) [Zg; P]^T/2 -> [2G; P/2]^T -> 2 [dZg; dP]^T
        at = ws.get("at", f * n)        # (f*n,) A^T; dA^T in backward
        return SimpleNamespace(
            u=ws.get("u", n, dh),             # (n, d_hidden) X W_in, then GELU'(X W_in)
            z=ws.get("z", n, dh),             # (n, d_hidden) Z; dZ, dU in backward
            gpt=gpt.reshape(2 * f, n),        # (2f, n)
            g=gpt[:f * n], p=gpt[f * n:],     # (f*n,) flat halves
            at=at, atm=at.reshape(f, n),      # flat and (f, n) views
            y=ws.get("y", n, self.d_out),     # (n, d_out) output
            dx=ws.get("dx", n, self.d_in))    # (n, d_in) input gradient

    def _forward(self, x2, res2):
        n = x2.shape[0]
        v = self._views(n)
        self._saved.x = x2
        if n:
            ops.gemm(v.u, x2, self.W_in.data, False, False, 1.0, 0.0)
            ops.bias_act(v.z, v.u, None, "gelu", 0.01, v.u)                 # GELU' cached over u
            ops.gemm(v.gpt, self.Wgp_T, v.z, False, True, 0.5, 0.0)      # (2f, n) = Wgp_T Z^T / 2
            ops.gate_forward(v.at, v.g, v.p)
            if res2 is None:
                ops.gemm(v.y, v.atm, self.W_out.data, True, False, 1.0, 0.0)  # Y = A W_out
            else:
                ops.fill_rows(v.y, None, res2)
                ops.gemm(v.y, v.atm, self.W_out.data, True, False, 1.0, 1.0)
        return v.y

    def gemm_list(self, lead) -> list:
        """3 forward, 6 backward: W_gate and W_proj multiply the same Z, so they share one
        (d_hidden, 2 d_ffn) GEMM each way (gradient and input gradient)."""
        n, d_in, d_out = int(np.prod(lead)), self.d_in, self.d_out
        dh, f = self.d_hidden, self.d_ffn
        fwd = [(n, dh, d_in, False, False, 0.0),          # U (n, dh) = X W_in
               (n, 2 * f, dh, False, False, 0.0),         # [G | P] (n, 2f) = Z [W_gate | W_proj]
               (n, d_out, f, False, False, 0.0)]          # Y (n, d_out) = A W_out
        bwd = [(f, d_out, n, True, False, 1.0),           # dW_out += A^T dY
               (n, f, d_out, False, True, 0.0),           # dA = dY W_out^T
               (dh, 2 * f, n, True, False, 1.0),          # d[W_gate | W_proj] += Z^T d[G | P]
               (n, dh, 2 * f, False, True, 0.0),          # dZ = d[G | P] [W_gate | W_proj]^T
               (d_in, dh, n, True, False, 1.0),           # dW_in += X^T dU
               (n, d_in, dh, False, True, 0.0)]           # dX = dU W_in^T
        return fwd + bwd

    def _backward(self, dy2, acc2):
        n, v, dx = self._start_backward(dy2, acc2)
        if n:
            at, z = v.atm, v.z
            ops.gemm(self.W_out.grad, at, dy2, False, False, 1.0, 1.0)  # A^T dY
            ops.gemm(at, self.W_out.data, dy2, False, True, 1.0, 0.0)   # dA^T = W_out dY^T
            ops.gate_backward(v.g, v.p, v.at)                           # 2 dGP^T over GP^T
            ops.gemm(self.dWgp_T, v.gpt, z, False, False, 0.5, 1.0)    # both halves, one GEMM
            ops.gemm(z, v.gpt, self.Wgp_T, True, False, 0.5, 0.0)      # dZ = dGP Wgp_T over Z
            ops.act_backward_cached(z, z, v.u)                          # dU in place
            ops.gemm(self.W_in.grad, self._saved.x, z, True, False, 1.0, 1.0)
            if dx is not SKIP_DX:
                ops.gemm(dx, z, self.W_in.data, False, True, 1.0, 0.0 if acc2 is None else 1.0)
        self._saved.x = None
        return dx


# The name that says what GMLP does: gating across the channels of each token (no mixing
# across tokens), unlike SpatialGMLPBlock (Liu et al.'s block, which gates across tokens).
ChannelGatedMLP = GMLP

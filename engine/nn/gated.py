"""``GatedFFN``: the gated feed-forward block of Shazeer 2020, "GLU Variants Improve
Transformer" (SwiGLU in LLaMA, GEGLU, ReGLU, GLU, bilinear), on the module protocol.

``W_gate`` and ``W_up`` multiply the same input, so they are one GEMM: both are kept
transposed and back to back in the arena, one C-contiguous (2 d_ff, d_model) weight, and the
GEMM writes ``[G; U]`` features-by-rows, (2 d_ff, N), whose halves are contiguous for the
gating pass (kernels.glu). GMLP (engine/nn/channel_gated_mlp.py) keeps its gate and
projection the same way.
"""
from __future__ import annotations

from types import SimpleNamespace

import numpy as np

from kernels import ops, overlap

from .._checks import check_bool
from .layers import check_activation
from .module import (SKIP_DX, Module, Parameter, check_float, check_init, check_positive_int,
                     init_weight, make_rng)
from .registry import register_block

__all__ = ["GatedFFN"]


@register_block(
    doc="gated feed-forward (Shazeer 2020), y = (act(x W_gate + b_gate) * (x W_up + b_up)) "
        "W_down + b_down: SwiGLU with silu, GEGLU with gelu",
    twin="engine.models.naive:NaiveGatedFFN", dims=("d_model", "d_ff"),
    example={"d_model": 12, "d_ff": 20},
    options={"activation": "silu", "bias": False, "dropout": 0.0},
    variants=({"activation": "silu"}, {"activation": "gelu", "bias": True}),
    bench={"GatedFFN-silu": {"activation": "silu"}})  # SwiGLU at the FFN shapes
class GatedFFN(Module):
    """``y = (act(x W_gate + b_gate) * (x W_up + b_up)) W_down + b_down``.

    ``activation`` is any registered activation: "silu" = SwiGLU (the default, as LLaMA),
    "gelu" = GEGLU, "relu" = ReGLU, "sigmoid" = GLU, "identity" = bilinear.
    Parameters: ``W_gate``, ``W_up`` (d_model, d_ff), ``b_gate``, ``b_up`` (d_ff,) when
    ``bias``, ``W_down`` (d_ff, d_model), ``b_down`` (d_model,) when ``bias``; biases start at
    zero. ``dropout`` applies to the gated hidden units (before ``W_down``), as in FFN.
    ``init``: "he", "xavier", "normal" or "zeros" for the three weights (``init_weight``).
    Inputs (N, d_model) or (B, T, d_model), float32 or float64.
    """

    fuses_residual = True
    fuses_dx_acc = True
    acc_alias_safe = True  # dy is read only by the first two backward GEMMs
    skips_input_grad = True
    # PyTorch: LLaMA's MLP, down_proj(act(gate_proj(x)) * up_proj(x)) (nn.Linear each).
    torch_layout = (("gate_proj.weight", "W_gate", True), ("gate_proj.bias", "b_gate", False),
                    ("up_proj.weight", "W_up", True), ("up_proj.bias", "b_up", False),
                    ("down_proj.weight", "W_down", True), ("down_proj.bias", "b_down", False))
    config_attrs = {"dropout": "p"}

    def __init__(self, d_model: int, d_ff: int, activation: str = "silu", *,
                 dropout: float = 0.0, bias: bool = False, init: str = "xavier",
                 dtype=np.float32, rng=None, negative_slope: float = 0.01):
        super().__init__(dtype)
        self.d_model = self.in_features = check_positive_int("d_model", d_model)
        self.d_ff = check_positive_int("d_ff", d_ff)
        self.activation = check_activation("activation", activation)
        self.negative_slope = check_float("negative_slope", negative_slope)
        self.p = check_float("dropout", dropout, 0.0, 1.0, high_open=True)
        check_bool("bias", bias)
        self.init = check_init(init)
        rng = make_rng(rng)
        self._rng = rng
        dt, d, f = self.dtype, self.d_model, self.d_ff
        # F-ordered: stored as their transposes, back to back (see _params_moved).
        self.W_gate = Parameter(np.asfortranarray(init_weight(d, f, init, dt, rng)))
        self.W_up = Parameter(np.asfortranarray(init_weight(d, f, init, dt, rng)))
        # Adjacent too: [b_gate; b_up] is the per-row bias of [G; U]^T.
        self.b_gate = Parameter(np.zeros(f, dt)) if bias else None
        self.b_up = Parameter(np.zeros(f, dt)) if bias else None
        self.W_down = Parameter(init_weight(f, d, init, dt, rng))
        self.b_down = Parameter(np.zeros(d, dt)) if bias else None
        self.bias = bias
        self._saved.x = None
        self._saved.dropped = False

    def _params_moved(self):
        # (2f, d) rows [W_gate^T; W_up^T] and their gradient: views, no copy.
        self._set_adjacent(("Wgu_T", "dWgu_T"), (self.W_gate, self.W_up),
                           "GatedFFN: W_gate and W_up", (2 * self.d_ff, self.d_model))
        if self.bias:
            self._set_adjacent(("b_gu", "db_gu"), (self.b_gate, self.b_up),
                               "GatedFFN: b_gate and b_up")

    def extra_repr(self):
        return (f"d_model={self.d_model}, d_ff={self.d_ff}, activation={self.activation!r}, "
                f"dropout={self.p}, bias={self.bias}, dtype={self.dtype}")

    def _make_views(self, n):
        ws, d, f = self._ws, self.d_model, self.d_ff
        # Transposed buffers are flat so that (rows, n) views stay contiguous for any n.
        zt = ws.get("zt", 2 * f * n)  # (2f*n,) [G; U]^T, then the backward's factors, then dZ^T
        ht = ws.get("ht", f * n)      # (f*n,) H^T = act(G) * U, then dH^T
        v = SimpleNamespace(
            zt=zt.reshape(2 * f, n),                                      # (2f, n)
            g=zt[:f * n].reshape(f, n), u=zt[f * n:].reshape(f, n),       # (f, n) halves
            ht=ht.reshape(f, n),                                          # (f, n)
            y=ws.get("y", n, d),                                          # (n, d) output
            dx=ws.get("dx", n, d))                                        # (n, d) input grad
        if self.p > 0.0:
            v.mask = ws.get("mask", f * n).reshape(f, n)  # (f, n) dropout mask for backward
        return v

    def _forward(self, x2, res2):
        n, v, dropped = self._start_forward(x2, self.p)
        if n == 0:
            return v.y
        if self.bias:  # [G; U]^T = b + Wgu_T x^T: the bias rides in the GEMM
            ops.fill_by_row(v.zt, self.b_gu)
            ops.gemm(v.zt, self.Wgu_T, x2, False, True, 1.0, 1.0)
        else:
            ops.gemm(v.zt, self.Wgu_T, x2, False, True, 1.0, 0.0)
        ops.glu_forward(v.ht, v.g, v.u, self.activation, self.negative_slope)
        if dropped:
            ops.dropout_forward(v.ht, v.mask, v.ht, self.p, self._rng)
        b = self.b_down
        if b is None and res2 is None:
            ops.gemm(v.y, v.ht, self.W_down.data, True, False, 1.0, 0.0)  # y = H W_down
        else:
            ops.fill_rows(v.y, None if b is None else b.data, res2)
            ops.gemm(v.y, v.ht, self.W_down.data, True, False, 1.0, 1.0)
        return v.y

    def gemm_list(self, lead) -> list:
        """2 forward, 4 backward, as the FFN: W_gate and W_up multiply the same x, so they are
        one (2 d_ff, d_model) GEMM each way, computed transposed ([G; U]^T, features by rows)."""
        n, d, f = int(np.prod(lead)), self.d_model, self.d_ff
        fwd = [(2 * f, n, d, False, True, 0.0),           # [G; U]^T = [W_gate | W_up]^T x^T
               (n, d, f, True, False, 0.0)]               # y (n, d) = H W_down
        bwd = [(f, d, n, False, False, 1.0),              # dW_down += H^T dy
               (f, n, d, False, True, 0.0),               # dH^T (f, n) = W_down dy^T
               (2 * f, d, n, False, False, 1.0),          # d[W_gate | W_up]^T += [dG; dU]^T x
               (n, d, 2 * f, True, False, 0.0)]           # dx = [dG | dU] [W_gate | W_up]^T
        return fwd + bwd

    def _backward(self, dy2, acc2):
        n, v, dx = self._start_backward(dy2, acc2)
        if n == 0:
            return dx
        lane = overlap.deferring()  # the weight gradients later, on the lane
        dht = v.ht
        if lane:  # H^T is read by the queued dW_down: dH^T goes to a buffer of the lane's
            dht = overlap.rows("gated.dht", v.ht)
        if self.b_down is not None:
            ops.colsum(self.b_down.grad, dy2, 1.0)
        ops.gemm(self.W_down.grad, v.ht, dy2, False, False, 1.0, 1.0, lane)  # += H^T dy
        ops.gemm(dht, self.W_down.data, dy2, False, True, 1.0, 0.0)    # dH^T = W_down dy^T
        if self._saved.dropped:
            ops.dropout_backward(dht, dht, v.mask)
        ops.glu_backward(v.g, v.u, dht)                                # [dG; dU]^T in place
        if self.bias:
            ops.rowsum(self.db_gu, v.zt, 1.0)
        ops.gemm(self.dWgu_T, v.zt, self._saved.x, False, False, 1.0, 1.0, lane)  # both halves
        if dx is not SKIP_DX:
            if lane:
                overlap.wait_for(dx)
            ops.gemm(dx, v.zt, self.Wgu_T, True, False, 1.0, 0.0 if acc2 is None else 1.0)
        self._saved.x = None
        return dx

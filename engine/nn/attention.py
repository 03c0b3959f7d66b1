"""``MultiHeadAttention``: multi-head scaled dot-product self-attention (Vaswani et al. 2017),
causal (GPT, Radford et al. 2018) or full, on the module protocol.

The projections are BLAS GEMMs over all rows: one (N, d) x (d, 3d) for q, k and v together
and the output projection, into which the residual is fused. Between them, the heads run
either as one compiled kernel call over all (batch, head) pairs each way (kernels.sdpa:
reads q, k, v from the projection's rows, computes only the causal half, writes O rows), or,
with attention dropout or where ``kernel_wins`` says BLAS is faster, as per (batch, head)
GEMMs ``S = q k^T``, ``O = P v`` on head-major copies (kernels.attention). The probabilities
are materialised: memory O(B h T^2).
"""
from __future__ import annotations

import math
from types import SimpleNamespace

import numpy as np

from kernels import ops, overlap

from .._checks import check_bool, check_choice, check_positive_int, check_real
from .module import Module, Parameter, check_init, check_sequences, init_weight, make_rng
from .registry import register_block

__all__ = ["MultiHeadAttention", "MAX_SCORES_BYTES", "kernel_wins"]

# Default bound on the score buffers of one call (see MultiHeadAttention).
MAX_SCORES_BYTES = 1 << 30
PATHS = ("auto", "kernel", "blas")  # values of MultiHeadAttention.path
FULL_KERNEL_BELOW_T = 64  # full (non-causal) attention runs the compiled heads below this T


def kernel_wins(seq_len: int, d_head: int, causal: bool = True) -> bool:
    """Whether the compiled attention (kernels.sdpa) is the faster path for sequences of
    ``seq_len``, heads of ``d_head`` features and a causal mask or none, by the table in
    docs/performance.md ("Compiled attention"). Causal: the kernels compute half the scores
    and make no per-head calls, faster at every measured shape (T 64-1024, d_head 32-64,
    1 thread, register-tiled kernels: 0.51-0.90x the GEMMs' time). Full attention: the same
    arithmetic as the GEMMs, which are faster per flop from T = 64 (kernels 1.03-1.10x at
    T 64, 1.06-1.84x from T 256; 0.94-1.04x at T 32), so the kernels only below T = 64."""
    return causal or seq_len < FULL_KERNEL_BELOW_T


@register_block(
    doc="multi-head self-attention (Vaswani et al. 2017) on (B, seq_len, d_model), causal or "
        "full: per head softmax(q k^T / sqrt(d_head)) v, then W_o",
    twin="engine.models.naive_attention:NaiveMultiHeadAttention", dims=("d_model", "seq_len"),
    example={"d_model": 12, "seq_len": 5},
    options={"n_heads": 4, "causal": True, "dropout": 0.0, "bias": True},
    variants=({"n_heads": 3, "causal": True}, {"n_heads": 2, "causal": False, "bias": False}))
class MultiHeadAttention(Module):
    """Self-attention over the T positions of each sequence of ``x`` (B, T, d_model)::

        [q | k | v] = x W_qkv + b_qkv                         (B, T, 3 d_model)
        head j:  P_j = softmax(q_j k_j^T / sqrt(d_head) + M)  (T, T) per sequence
                 O_j = dropout(P_j) v_j                       (T, d_head)
        y = [O_1 | ... | O_h] W_o + b_o                       (B, T, d_model)

    with ``d_head = d_model / n_heads``, q_j the columns ``j*d_head:(j+1)*d_head`` of the q
    third (the same layout as PyTorch's ``in_proj_weight`` and nanoGPT's ``c_attn``, both
    W_qkv^T), and M = -inf above the diagonal when ``causal`` (position t attends to
    positions <= t), 0 otherwise. ``dropout`` drops attention weights in training.
    Parameters ``W_qkv`` (d_model, 3 d_model), ``b_qkv`` (3 d_model,), ``W_o`` (d_model,
    d_model), ``b_o`` (d_model,); no biases with ``bias=False``; weights by ``init``
    (``init_weight``), biases zero.

    The heads run as compiled kernels over all (batch, head) pairs (kernels.sdpa) or as
    per-head BLAS GEMMs, per ``path`` ("auto": ``kernel_wins`` by sequence length and head
    size; attention dropout in training always takes the GEMMs).

    Memory: the probabilities are kept whole for backward; the per-head GEMMs also keep
    their gradient (and with dropout the dropped weights and the mask): ``k * B * n_heads *
    T^2`` elements with k = 2 (4 with dropout) at most. A call whose score buffers could
    exceed ``max_scores_bytes`` (default 1 GiB) by that bound raises ValueError before
    anything changes: use smaller batches or shorter sequences.
    """

    fuses_residual = True
    fuses_dx_acc = True
    acc_alias_safe = True  # dy is read only by the first two backward GEMMs
    # PyTorch: nn.MultiheadAttention(d_model, n_heads, batch_first=True).
    torch_layout = (("in_proj_weight", "W_qkv", True), ("in_proj_bias", "b_qkv", False),
                    ("out_proj.weight", "W_o", True), ("out_proj.bias", "b_o", False))
    config_attrs = {"dropout": "p"}

    def __init__(self, d_model: int, n_heads: int, *, dropout: float = 0.0, bias: bool = True,
                 init: str = "xavier", dtype=np.float32, rng=None, causal: bool = True,
                 max_scores_bytes: int = MAX_SCORES_BYTES):
        super().__init__(dtype)
        self.d_model = self.in_features = check_positive_int("d_model", d_model)
        self.n_heads = check_positive_int("n_heads", n_heads)
        if d_model % n_heads:
            raise ValueError(f"d_model: expected a multiple of n_heads = {n_heads} (each head "
                             f"takes d_model / n_heads features), got d_model = {d_model}")
        self.d_head = d_model // n_heads
        self.causal = check_bool("causal", causal)
        self.p = check_real("dropout", dropout, 0.0, 1.0, high_open=True)
        self.bias = check_bool("bias", bias)
        self.init = check_init(init)
        self.max_scores_bytes = check_positive_int("max_scores_bytes", max_scores_bytes)
        self.scale = 1.0 / math.sqrt(self.d_head)
        rng = make_rng(rng)
        self._rng = rng
        dt, d = self.dtype, self.d_model
        self.W_qkv = Parameter(init_weight(d, 3 * d, init, dt, rng))
        self.b_qkv = Parameter(np.zeros(3 * d, dt)) if bias else None
        self.W_o = Parameter(init_weight(d, d, init, dt, rng))
        self.b_o = Parameter(np.zeros(d, dt)) if bias else None
        c = self._saved
        c.pending = None  # (B, T) of the call being checked (committed by _forward)
        c.bt = None       # (B, T) of the last forward
        c.x = None        # (N, d_model) the last input, by reference
        c.dropped = False
        c.fused = False   # the last forward ran the compiled kernels (kernels.sdpa)
        self._set_plain("_path", "auto")

    def extra_repr(self):
        return (f"d_model={self.d_model}, n_heads={self.n_heads}, causal={self.causal}, "
                f"dropout={self.p}, bias={self.bias}, dtype={self.dtype}")

    def scores_nbytes(self, batch: int, seq_len: int) -> int:
        """Bytes of the score buffers a (batch, seq_len) call needs."""
        k = 4 if self.p > 0.0 else 2
        return k * batch * self.n_heads * seq_len * seq_len * self.dtype.itemsize

    def check_sequences(self, x, name: str = "x"):
        """``(B, T)`` of an input ``x`` of shape (B, T, d_model) whose scores fit in
        ``max_scores_bytes``; TypeError/ValueError otherwise (composites call it before any
        child runs, so a rejected call changes nothing)."""
        b, t = check_sequences(x, self.d_model, "attention mixes the T positions of each "
                               "sequence", name)
        return self.check_scores(b, t, name)

    def check_input(self, x, name: str = "x") -> tuple:
        """x's shape for a valid (B, T, d_model) input, else the error ``forward`` raises."""
        self.check_sequences(x, name)
        return super().check_input(x, name)

    def check_scores(self, batch: int, seq_len: int, name: str = "x"):
        """``(batch, seq_len)`` if their score buffers fit in ``max_scores_bytes``, else
        ValueError."""
        need = self.scores_nbytes(batch, seq_len)
        if need > self.max_scores_bytes:
            raise ValueError(f"{name}: B = {batch} sequences of T = {seq_len} need {need:,} bytes of "
                             f"attention scores (O(B * n_heads * T^2)), above max_scores_bytes "
                             f"= {self.max_scores_bytes:,}; use a smaller batch or shorter "
                             f"sequences")
        return batch, seq_len

    def forward(self, x, *, residual=None):
        """``attention(x)`` (``+ residual``) for ``x`` of shape (B, T, d_model)."""
        self._saved.pending = self.check_sequences(x)
        return super().forward(x, residual=residual)

    @property
    def path(self) -> str:
        """How the heads run: "auto" (default: ``kernel_wins`` decides per sequence length),
        "kernel" (the compiled kernels.sdpa) or "blas" (per-head GEMMs). Attention dropout in
        training always runs "blas" (the kernels have no dropout). Set between steps."""
        return self._path

    @path.setter
    def path(self, value: str) -> None:
        self._set_plain("_path", check_choice("path", value, PATHS))

    def uses_kernel(self, seq_len: int) -> bool:
        """True when a forward on sequences of ``seq_len`` runs the compiled attention
        (kernels.sdpa) rather than the per-head BLAS GEMMs (see ``path``)."""
        if (self.training and self.p > 0.0) or self._path == "blas":
            return False
        return self._path == "kernel" or kernel_wins(seq_len, self.d_head, self.causal)

    def _make_views(self, key):
        b, t, fused = key
        ws, d, h, dh = self._ws, self.d_model, self.n_heads, self.d_head
        n, bh = b * t, b * h
        s = ws.get("s", bh * t, t)    # (bh*T, T) scores, then P = softmax (kept for backward)
        v = SimpleNamespace(
            qkv=ws.get("qkv", n, 3 * d),  # (N, 3d) x W_qkv (+ b_qkv unless fused); d[q|k|v]
            o=ws.get("o", n, d),          # (N, d) heads merged; dO rows in backward
            y=ws.get("y", n, d),          # (N, d) output
            dx=ws.get("dx", n, d),        # (N, d) input gradient
            s=s, s3=s.reshape(bh, t, t))
        v.dqkv = v.qkv  # d[q | k | v] over [q | k | v] in backward (the kernel copies first)
        if fused:  # the kernels read and write rows: no head-major copies, no dS buffer
            v.qkv3, v.o3 = v.qkv.reshape(b, t, 3 * d), v.o.reshape(b, t, d)
            v.dqkv3 = v.qkv3
            return v
        v.heads = ws.get("heads", 3 * bh * t * dh).reshape(3, b, h, t, dh)  # q, k, v head-major
        v.dheads = ws.get("dheads", 3 * bh * t * dh).reshape(3, b, h, t, dh)  # dq, dk, dv
        v.oh = ws.get("oh", bh * t * dh).reshape(1, b, h, t, dh)  # heads' outputs; dO
        v.ds = ws.get("ds", bh * t, t)  # (bh*T, T) dP, then dS in place
        pd = s
        if self.p > 0.0:
            pd = v.pd = ws.get("pd", bh * t, t)      # (bh*T, T) dropout(P)
            v.mask = ws.get("mask", bh * t, t)       # (bh*T, T) dropout mask for backward
        q, k, vv = (v.heads[i].reshape(bh, t, dh) for i in range(3))
        dq, dk, dv = (v.dheads[i].reshape(bh, t, dh) for i in range(3))
        o3 = v.oh.reshape(bh, t, dh)
        s3, ds3, pd3 = v.s3, v.ds.reshape(bh, t, t), pd.reshape(bh, t, t)
        # One tuple of contiguous 2-D operands per (batch, head): indexing costs ~0.2 us each.
        v.per_head = [(q[i], k[i], vv[i], s3[i], pd3[i], o3[i], ds3[i], dq[i], dk[i], dv[i])
                      for i in range(bh)]
        return v

    def _forward(self, x2, res2):
        b, t = self._saved.bt = self._saved.pending  # the base class has checked the rest of x
        c = self._saved
        c.fused = fused = self.uses_kernel(t)
        v = self._views((b, t, fused))
        c.x = x2
        c.dropped = self.training and self.p > 0.0
        if b == 0 or t == 0:
            return v.y
        gemm = ops.gemm
        b_qkv = None if self.b_qkv is None else self.b_qkv.data
        if b_qkv is None or fused:  # the kernels add b_qkv as they read each sequence
            gemm(v.qkv, x2, self.W_qkv.data, False, False, 1.0, 0.0)
        else:  # [q | k | v] = b_qkv, then += x W_qkv inside the GEMM
            ops.fill_rows(v.qkv, b_qkv, None)
            gemm(v.qkv, x2, self.W_qkv.data, False, False, 1.0, 1.0)
        if fused:  # O rows = softmax(q k^T / sqrt(d_head) + M) v, all heads in one call
            ops.sdpa_forward(v.o3, v.s3, v.qkv3, self.n_heads, self.scale, self.causal, b_qkv)
        else:
            self._heads_forward(v, c.dropped)
        if self.b_o is None and res2 is None:
            gemm(v.y, v.o, self.W_o.data, False, False, 1.0, 0.0)
        else:  # y = b_o (+ residual), then += O W_o inside the GEMM
            ops.fill_rows(v.y, None if self.b_o is None else self.b_o.data, res2)
            gemm(v.y, v.o, self.W_o.data, False, False, 1.0, 1.0)
        return v.y

    def _heads_forward(self, v, dropped):
        """O rows from the [q | k | v] rows by per-(sequence, head) BLAS GEMMs."""
        gemm, scale = ops.gemm, self.scale
        ops.heads_split(v.heads, v.qkv, self.n_heads)
        for q, k, _, s, _, _, _, _, _, _ in v.per_head:
            gemm(s, q, k, False, True, scale, 0.0)            # S = q k^T / sqrt(d_head)
        if self.causal:
            ops.causal_fill(v.s3, -np.inf)                     # exp(-inf) = 0: no future
        ops.softmax_forward(v.s, v.s)                          # P, in place
        if dropped:
            ops.dropout_forward(v.pd, v.mask, v.s, self.p, self._rng)
        for _, _, vh, s, pd, o, _, _, _, _ in v.per_head:
            gemm(o, pd if dropped else s, vh, False, False, 1.0, 0.0)  # O = dropout(P) v
        ops.heads_merge(v.o, v.oh)

    def gemm_list(self, lead) -> list:
        """The [q | k | v] and output projections over all B T rows (2 forward, 4 backward);
        on the per-head BLAS path (``uses_kernel`` false) also per (sequence, head)
        S = q k^T, O = P v forward, dP = dO v^T, dv = P^T dO, dq = dS k, dk = dS^T q backward
        (the compiled kernels run no GEMM)."""
        b, t = lead
        n, d, dh, bh = b * t, self.d_model, self.d_head, b * self.n_heads
        if self.uses_kernel(t):
            bh = 0
        fwd = ([(n, 3 * d, d, False, False, 0.0)]                      # [q | k | v] = x W_qkv
               + [(t, t, dh, False, True, 0.0), (t, dh, t, False, False, 0.0)] * bh
               + [(n, d, d, False, False, 0.0)])                       # y = O W_o
        bwd = ([(d, d, n, True, False, 1.0),                           # dW_o += O^T dy
                (n, d, d, False, True, 0.0)]                           # dO = dy W_o^T
               + [(t, t, dh, False, True, 0.0), (t, dh, t, True, False, 0.0)] * bh
               + [(t, dh, t, False, False, 0.0), (t, dh, t, True, False, 0.0)] * bh
               + [(d, 3 * d, n, True, False, 1.0),                     # dW_qkv += x^T d[q|k|v]
                  (n, d, 3 * d, False, True, 0.0)])                    # dx = d[q|k|v] W_qkv^T
        return fwd + bwd

    def _backward(self, dy2, acc2):
        b, t = self._saved.bt
        fused = self._saved.fused
        v = self._views((b, t, fused))
        dx = v.dx if acc2 is None else acc2
        if b == 0 or t == 0:  # no rows: an empty gradient
            return dx
        gemm = ops.gemm
        lane = fused and overlap.deferring()  # the weight gradients later, on the lane
        do = v.o
        if lane:  # O is read by the queued dW_o: dO goes to a buffer of the lane's
            do = overlap.rows("attention.do", v.o)
        if self.b_o is not None:
            ops.colsum(self.b_o.grad, dy2, 1.0)                 # db_o += dy.sum(0)
        gemm(self.W_o.grad, v.o, dy2, True, False, 1.0, 1.0, lane)  # dW_o += O^T dy
        gemm(do, dy2, self.W_o.data, False, True, 1.0, 0.0)     # dO = dy W_o^T (over O)
        if fused:  # d[q | k | v] rows, all heads in one call
            ops.sdpa_backward(v.dqkv3, do.reshape(v.o3.shape), v.s3, v.qkv3, self.n_heads,
                              self.scale, self.causal,
                              None if self.b_qkv is None else self.b_qkv.data)
        else:
            self._heads_backward(v)
        if self.b_qkv is not None:
            ops.colsum(self.b_qkv.grad, v.dqkv, 1.0)
        gemm(self.W_qkv.grad, self._saved.x, v.dqkv, True, False, 1.0, 1.0,  # dW_qkv +=
             lane)                                                            # x^T dqkv
        if lane:
            overlap.wait_for(dx)
        gemm(dx, v.dqkv, self.W_qkv.data, False, True, 1.0, 0.0 if acc2 is None else 1.0)
        self._saved.x = None
        return dx

    def _heads_backward(self, v):
        """d[q | k | v] rows (into v.qkv) from the dO rows by per-(sequence, head) GEMMs."""
        gemm, scale, dropped = ops.gemm, self.scale, self._saved.dropped
        ops.heads_split(v.oh, v.o, self.n_heads)
        for q, k, vh, s, pd, do, ds, dq, dk, dv in v.per_head:
            gemm(ds, do, vh, False, True, 1.0, 0.0)             # dP = dO v^T
            gemm(dv, pd if dropped else s, do, True, False, 1.0, 0.0)  # dv = dropout(P)^T dO
        if dropped:
            ops.dropout_backward(v.ds, v.ds, v.mask)
        ops.softmax_backward(v.ds, v.ds, v.s)                   # dS = P (dP - sum dP P)
        for q, k, _, _, _, _, ds, dq, dk, _ in v.per_head:
            gemm(dq, ds, k, False, False, scale, 0.0)           # dq = dS k / sqrt(d_head)
            gemm(dk, ds, q, True, False, scale, 0.0)            # dk = dS^T q / sqrt(d_head)
        ops.heads_merge(v.qkv, v.dheads)                        # d[q | k | v] as rows

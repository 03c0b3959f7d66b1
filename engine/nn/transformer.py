"""``TransformerBlock``: multi-head self-attention and a feed-forward block, each inside a
residual connection with a LayerNorm (Vaswani et al. 2017; pre-norm as GPT-2, Radford et al.
2019). A composite: it calls its children's public ``forward``/``backward`` only, with the
protocol's fused residual."""
from __future__ import annotations

import numpy as np

from kernels import ops, overlap

from .attention import MultiHeadAttention
from .blocks import FFN, Dropout, LayerNorm
from .gated import GatedFFN
from .._checks import check_choice, check_positive_int, check_real
from .module import Module, check_init, make_rng
from .registry import register_block

__all__ = ["TransformerBlock", "GATED_FFNS"]

# ``ffn`` names that select GatedFFN (Shazeer 2020) and its gate activation.
GATED_FFNS = {"swiglu": "silu", "geglu": "gelu", "reglu": "relu"}


@register_block(
    doc="transformer block: h = x + attn(ln_1(x)), y = h + ffn(ln_2(h)) (pre-norm, GPT-2) or "
        "the post-norm order (Vaswani et al. 2017)",
    twin="engine.models.naive_attention:NaiveTransformerBlock",
    dims=("d_model", "d_ff", "seq_len"), example={"d_model": 12, "d_ff": 20, "seq_len": 5},
    options={"n_heads": 4, "ffn": "gelu", "norm": "pre", "causal": True, "dropout": 0.0},
    variants=({"n_heads": 3, "norm": "pre"}, {"n_heads": 2, "norm": "post", "ffn": "relu"}))
class TransformerBlock(Module):
    """One transformer block on (B, T, d_model) inputs; ``norm="pre"`` (GPT-2, nanoGPT's
    ``Block``)::

        h = x + drop(attn(ln_1(x)))
        y = h + drop(mlp(ln_2(h)))

    ``norm="post"`` (Vaswani et al. 2017): ``h = ln_1(x + drop(attn(x)))``, ``y = ln_2(h +
    drop(mlp(h)))``. Children ``ln_1``, ``attn`` (MultiHeadAttention, ``causal``, attention
    dropout ``dropout``), ``ln_2``, ``mlp``: ``FFN(d_model, d_ff, ffn)`` for a registered
    activation name ("gelu", "relu", ...), or ``GatedFFN`` for "swiglu", "geglu", "reglu";
    ``drop_1``/``drop_2`` drop the residual branches (both ``dropout``). ``norm_bias=False``
    leaves the LayerNorms without beta (nanoGPT's ``bias=False`` is ``bias=False,
    norm_bias=False``).
    """

    # The attention's options and the LayerNorms' are held by those children.
    config_attrs = {"n_heads": "attn.n_heads", "dropout": "p", "bias": "attn.bias",
                    "init": "attn.init", "causal": "attn.causal", "eps": "ln_1.eps",
                    "norm_bias": "ln_1.bias"}

    def __init__(self, d_model: int, n_heads: int, d_ff: int, ffn: str = "gelu", *,
                 dropout: float = 0.0, bias: bool = True, init: str = "xavier",
                 dtype=np.float32, rng=None, norm: str = "pre", causal: bool = True,
                 eps: float = 1e-5, norm_bias: bool = True):
        super().__init__(dtype)
        check_choice("norm", norm, ("pre", "post"))
        self.d_model = self.in_features = check_positive_int("d_model", d_model)
        self.d_ff = check_positive_int("d_ff", d_ff)
        p = check_real("dropout", dropout, 0.0, 1.0, high_open=True)
        check_init(init)
        rng = make_rng(rng)
        self.norm, self.ffn, self.p = norm, ffn, p
        self.ln_1 = LayerNorm(d_model, bias=norm_bias, dtype=dtype, eps=eps)
        self.attn = MultiHeadAttention(d_model, n_heads, dropout=p, bias=bias, init=init,
                                       dtype=dtype, rng=rng, causal=causal)
        self.ln_2 = LayerNorm(d_model, bias=norm_bias, dtype=dtype, eps=eps)
        if ffn in GATED_FFNS:
            self.mlp = GatedFFN(d_model, d_ff, GATED_FFNS[ffn], bias=bias, init=init, dtype=dtype,
                                rng=rng)
        else:
            try:
                self.mlp = FFN(d_model, d_ff, ffn, bias=bias, init=init, dtype=dtype, rng=rng)
            except ValueError as e:
                raise ValueError(f"ffn: expected an activation name for FFN or one of "
                                 f"{tuple(GATED_FFNS)} for GatedFFN, got {ffn!r} ({e})") from None
        self.drop_1 = Dropout(p, dtype=dtype, rng=rng)
        self.drop_2 = Dropout(p, dtype=dtype, rng=rng)
        self._saved.pending = self._saved.bt = None  # (B, T): call being checked / last
        self._saved.dropped = False

    def extra_repr(self):
        return (f"d_model={self.d_model}, d_ff={self.d_ff}, ffn={self.ffn!r}, "
                f"norm={self.norm!r}, dropout={self.p}, dtype={self.dtype}")

    @property
    def torch_layout(self) -> list:
        """nanoGPT's ``Block`` names: ln_1, attn.c_attn, attn.c_proj, ln_2, and the FFN as
        mlp.c_fc / mlp.c_proj (a GatedFFN keeps LLaMA's names under mlp.)."""
        rows = [("ln_1.", "ln_1"),
                ("attn.c_attn.weight", "attn.W_qkv", True),
                ("attn.c_attn.bias", "attn.b_qkv", False),
                ("attn.c_proj.weight", "attn.W_o", True), ("attn.c_proj.bias", "attn.b_o", False),
                ("ln_2.", "ln_2")]
        if isinstance(self.mlp, GatedFFN):
            return rows + [("mlp.", "mlp")]
        return rows + [("mlp.c_fc.weight", "mlp.W_in", True), ("mlp.c_fc.bias", "mlp.b1", False),
                       ("mlp.c_proj.weight", "mlp.W_out", True),
                       ("mlp.c_proj.bias", "mlp.b2", False)]

    def check_input(self, x, name: str = "x") -> tuple:
        """x's shape for a valid (B, T, d_model) input, else the error ``forward`` raises."""
        return self.attn.check_input(x, name)

    def forward(self, x, *, residual=None):
        """The block on ``x`` of shape (B, T, d_model) (``+ residual`` when given)."""
        self._saved.pending = self.attn.check_sequences(x)
        return super().forward(x, residual=residual)

    def _forward(self, x2, res2):
        b, t = self._saved.bt = self._saved.pending
        x = x2.reshape(b, t, self.d_model)
        self._saved.dropped = dropped = self.training and self.p > 0.0
        attn, mlp, ln_1, ln_2 = self.attn, self.mlp, self.ln_1, self.ln_2
        if self.norm == "pre":
            h = self.drop_1(attn(ln_1(x)), residual=x) if dropped else attn(ln_1(x), residual=x)
            y = self.drop_2(mlp(ln_2(h)), residual=h) if dropped else mlp(ln_2(h), residual=h)
        else:
            h = ln_1(self.drop_1(attn(x), residual=x) if dropped else attn(x, residual=x))
            y = ln_2(self.drop_2(mlp(h), residual=h) if dropped else mlp(h, residual=h))
        return y.reshape(b * t, self.d_model)

    def gemm_list(self, lead) -> list:
        """The attention's GEMMs, then the feed-forward block's (LayerNorms add none)."""
        return self.attn.gemm_list(lead) + self.mlp.gemm_list(lead)

    def _backward(self, dy2, acc2):
        b, t = self._saved.bt
        dy = dy2.reshape(b, t, self.d_model)
        dropped = self._saved.dropped
        attn, mlp, ln_1, ln_2 = self.attn, self.mlp, self.ln_1, self.ln_2
        if self.norm == "pre":
            dh = ln_2.backward(mlp.backward(self.drop_2.backward(dy) if dropped else dy))
            overlap.wait_for(dh)          # (weight gradients queued on the lane may read it)
            ops.add(dh, dh, dy)           # the residual path (dy is the caller's: not written)
            da = attn.backward(self.drop_1.backward(dh) if dropped else dh)
            overlap.wait_for(dh)
            dx = ln_1.backward(da, dx_acc=dh)                    # dh + ln_1'(x)^T da, one pass
        else:
            ds = ln_2.backward(dy)                               # dh = ds + mlp'(h)^T ds
            dh = mlp.backward(self.drop_2.backward(ds) if dropped else ds, dx_acc=ds)
            ds = ln_1.backward(dh)
            dx = attn.backward(self.drop_1.backward(ds) if dropped else ds, dx_acc=ds)
        return dx.reshape(b * t, self.d_model)

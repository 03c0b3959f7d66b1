"""The block registry: one entry per block kind, read by bench, the CLI and the tests.

An entry holds what everything outside the block needs to know about it: how to build it
from sizes (``build``), its naive twin in ``engine.naive`` (``twin``), and the GEMMs of one
forward + backward (``gemms``: the floor bench times it against). Adding a block is its
file plus one ``register`` call here; ``tests/test_registry.py`` walks every entry (complete,
twin agrees with the module in float64, GEMM list = the GEMMs the module runs).

Sizes are a dict ``dims`` whose keys each entry names (``Block.dims``): ``d_model``/``d_ff``
for the transformer blocks (GMLP also reads optional ``d_in``/``d_out``), ``sizes`` for the
MLP. A GEMM is ``(M, N, K, trans_a, trans_b, beta)`` in the row-major terms of
``kernels.ops.gemm``: out (M, N) = op(a) (M, K) @ op(b) (K, N) + beta out, where beta is
what the product means (1.0: accumulates into a gradient; 0.0: a fresh product, even when the
module pre-fills the output with a bias and adds into it).
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable

import numpy as np

from . import naive

__all__ = ["Block", "BLOCKS", "register", "get", "names"]


@dataclass(frozen=True)
class Block:
    """One block kind. ``build(dims, dtype=, rng=, **options)`` -> the engine module;
    ``naive`` -> the twin class (``naive(params, lr=, weight_decay=, loss=, **options)``);
    ``gemm_list(rows, dims, **options)`` -> the GEMMs of one forward + backward;
    ``d_in(dims)`` / ``d_out(dims)`` -> feature widths of input and output.
    ``dims``: the size keys ``build`` requires; ``options``: the keyword options and their
    defaults (what ``build`` and the twin both accept); ``example``: small sizes with every
    width distinct (tests: a transposed GEMM cannot pass for another) and ``variants``:
    option sets the tests cover."""

    name: str
    doc: str
    build_fn: Callable
    naive: type
    gemm_fn: Callable
    d_in: Callable
    d_out: Callable
    dims: tuple
    options: dict = field(default_factory=dict)
    example: dict = field(default_factory=dict)
    variants: tuple = ({},)

    def _options(self, options) -> dict:
        unknown = sorted(set(options) - set(self.options))
        if unknown:
            raise TypeError(f"{self.name}: unknown options {unknown}; expected some of "
                            f"{sorted(self.options)}")
        return {**self.options, **options}

    def _check_dims(self, dims) -> None:
        missing = [k for k in self.dims if k not in dims]
        if missing:
            raise ValueError(f"dims: {self.name} needs sizes {list(self.dims)}, missing "
                             f"{missing} in {dict(dims)}")

    def build(self, dims, *, dtype=np.float32, rng=None, **options):
        """The engine module of this kind at sizes ``dims``."""
        self._check_dims(dims)
        return self.build_fn(dims, dtype=dtype, rng=rng, **self._options(options))

    def twin(self, module, *, lr: float = 1e-3, weight_decay: float = 1e-2, loss: str = "mse",
             **options):
        """The naive twin of ``module`` (built by ``build`` with the same ``options``): its
        parameters copied by name, AdamW(lr, weight_decay) and ``loss`` for ``step``."""
        params = {n: p.data for n, p in module.named_parameters()}
        return self.naive(params, lr=lr, weight_decay=weight_decay, loss=loss,
                          **self._options(options))

    def gemms(self, rows: int, dims, **options) -> list:
        """The GEMMs of one forward + backward over ``rows`` rows, forward first."""
        self._check_dims(dims)
        return self.gemm_fn(int(rows), dims, **self._options(options))


BLOCKS: dict = {}


def register(block: Block) -> Block:
    if block.name in BLOCKS:
        raise ValueError(f"register: a block named {block.name!r} is already registered")
    BLOCKS[block.name] = block
    return block


def get(name: str) -> Block:
    try:
        return BLOCKS[name]
    except KeyError:
        raise ValueError(f"block: expected one of {names()}, got {name!r}") from None


def names() -> tuple:
    return tuple(BLOCKS)


# ----------------------------------------------------------------------------- GEMM lists
def linear_gemms(n: int, d_in: int, d_out: int, dx: bool = True):
    """(forward, backward) GEMMs of y = x W: y (n, d_out) = x @ W; dW (d_in, d_out) += x^T dy;
    dx (n, d_in) = dy W^T (when the input gradient is computed)."""
    fwd = [(n, d_out, d_in, False, False, 0.0)]
    bwd = [(d_in, d_out, n, True, False, 1.0)]
    if dx:
        bwd.append((n, d_in, d_out, False, True, 0.0))
    return fwd, bwd


def _ffn_gemms(n, dims, **_):
    """2 forward, 4 backward (dW_out, dh, dW_in, dx); LayerNorm adds none."""
    d, f = dims["d_model"], dims["d_ff"]
    f1, b1 = linear_gemms(n, d, f)
    f2, b2 = linear_gemms(n, f, d)
    return f1 + f2 + b2 + b1


def _gmlp_widths(dims):
    d = dims["d_model"]
    return dims.get("d_in", d), d, dims["d_ff"], dims.get("d_out", d)


def _gmlp_gemms(n, dims, **_):
    """3 forward, 6 backward: W_gate and W_proj multiply the same Z, so they share one
    (d_hidden, 2 d_ffn) GEMM each way (gradient and input gradient)."""
    d_in, dh, f, d_out = _gmlp_widths(dims)
    fwd = [(n, dh, d_in, False, False, 0.0),          # U (n, dh) = X W_in
           (n, 2 * f, dh, False, False, 0.0),         # [G | P] pre (n, 2f) = Z [W_gate | W_proj]
           (n, d_out, f, False, False, 0.0)]          # Y (n, d_out) = A W_out
    bwd = [(f, d_out, n, True, False, 1.0),           # dW_out += A^T dY
           (n, f, d_out, False, True, 0.0),           # dA = dY W_out^T
           (dh, 2 * f, n, True, False, 1.0),          # d[W_gate | W_proj] += Z^T d[G | P]
           (n, dh, 2 * f, False, True, 0.0),          # dZ = d[G | P] [W_gate | W_proj]^T
           (d_in, dh, n, True, False, 1.0),           # dW_in += X^T dU
           (n, d_in, dh, False, True, 0.0)]           # dX = dU W_in^T
    return fwd + bwd


def _mlp_gemms(n, dims, **_):
    """3 per layer (every layer, the first included, returns its input gradient)."""
    sizes = dims["sizes"]
    fwd, bwd = [], []
    for d_in, d_out in zip(sizes[:-1], sizes[1:]):
        f, b = linear_gemms(n, d_in, d_out)
        fwd += f
        bwd = b + bwd
    return fwd + bwd


# ----------------------------------------------------------------------------- factories
def _build_ffn(dims, *, dtype, rng, activation, dropout):
    from ..nn.blocks import FFN
    return FFN(dims["d_model"], dims["d_ff"], activation=activation, dropout=dropout,
               dtype=dtype, rng=rng)


def _build_gmlp(dims, *, dtype, rng):
    from ..nn.blocks import GMLP
    return GMLP(*_gmlp_widths(dims), dtype=dtype, rng=rng)


def _build_sublayer(dims, *, dtype, rng, activation, dropout, norm):
    from ..nn.blocks import FFNSublayer
    return FFNSublayer(dims["d_model"], dims["d_ff"], activation=activation, dropout=dropout,
                       norm=norm, dtype=dtype, rng=rng)


def _build_mlp(dims, *, dtype, rng, activation):
    from ..nn.layers import MLP
    sizes = list(dims["sizes"])
    return MLP(sizes, [activation] * (len(sizes) - 2) + [None], dtype=dtype, rng=rng)


def _d_model(dims):
    return dims["d_model"]


_EXAMPLE = {"d_model": 12, "d_ff": 20, "seq_len": 5}  # every width distinct


def _d_model_wide(name, doc, build_fn, twin, gemm_fn, options, variants,
                  dims=("d_model", "d_ff")) -> Block:
    """A block whose input and output are ``d_model`` wide, sized by ``dims`` (an example of
    each from _EXAMPLE): the transformer blocks."""
    return Block(name=name, doc=doc, build_fn=build_fn, naive=twin, gemm_fn=gemm_fn,
                 d_in=_d_model, d_out=_d_model, dims=dims, options=options,
                 example={k: _EXAMPLE[k] for k in dims}, variants=variants)


register(_d_model_wide(
    "FFN", "position-wise feed-forward, y = act(x W_in + b1) W_out + b2 (Vaswani et al. 2017)",
    _build_ffn, naive.NaiveFFN, _ffn_gemms, {"activation": "relu", "dropout": 0.0},
    ({"activation": "relu"}, {"activation": "gelu"})))

register(Block(
    name="GMLP",
    doc="gated MLP, Y = (sigmoid(Z W_gate) * Z W_proj) W_out with Z = GELU(X W_in) "
        "(Liu et al. 2021, channel gating)",
    build_fn=_build_gmlp, naive=naive.NaiveGMLP, gemm_fn=_gmlp_gemms,
    d_in=lambda dims: _gmlp_widths(dims)[0], d_out=lambda dims: _gmlp_widths(dims)[3],
    dims=("d_model", "d_ff"),
    example={"d_in": 7, "d_model": 12, "d_ff": 20, "d_out": 5}))

register(_d_model_wide(
    "FFNSublayer", "the FFN with its residual and LayerNorm: post-norm LayerNorm(x + FFN(x)) "
    "or pre-norm x + FFN(LayerNorm(x))",
    _build_sublayer, naive.NaiveFFNSublayer, _ffn_gemms,
    {"activation": "relu", "dropout": 0.0, "norm": "post"},
    ({"activation": "gelu", "norm": "post"}, {"activation": "gelu", "norm": "pre"})))

register(Block(
    name="MLP",
    doc="multilayer perceptron: Linear layers with ``activation`` between them, linear output",
    build_fn=_build_mlp, naive=naive.NaiveMLP, gemm_fn=_mlp_gemms,
    d_in=lambda dims: dims["sizes"][0], d_out=lambda dims: dims["sizes"][-1],
    dims=("sizes",), options={"activation": "relu"},
    example={"sizes": (11, 9, 6, 4)},
    variants=({"activation": "relu"}, {"activation": "tanh"})))


# ----------------------------------------------------------------------------- GatedFFN, GMLPBlock
def _gated_gemms(n, dims, **_):
    """2 forward, 4 backward, as the FFN: W_gate and W_up multiply the same x, so they are one
    (2 d_ff, d_model) GEMM each way, computed transposed ([G; U]^T, features by rows)."""
    d, f = dims["d_model"], dims["d_ff"]
    fwd = [(2 * f, n, d, False, True, 0.0),           # [G; U]^T (2f, n) = [W_gate | W_up]^T x^T
           (n, d, f, True, False, 0.0)]               # y (n, d) = H W_down
    bwd = [(f, d, n, False, False, 1.0),              # dW_down += H^T dy
           (f, n, d, False, True, 0.0),               # dH^T (f, n) = W_down dy^T
           (2 * f, d, n, False, False, 1.0),          # d[W_gate | W_up]^T += [dG; dU]^T x
           (n, d, 2 * f, True, False, 0.0)]           # dx = [dG | dU] [W_gate | W_up]^T
    return fwd + bwd


def _build_gated(dims, *, dtype, rng, activation, bias, dropout):
    from ..nn.gated import GatedFFN
    return GatedFFN(dims["d_model"], dims["d_ff"], activation=activation, bias=bias,
                    dropout=dropout, dtype=dtype, rng=rng)


def _gmlp_block_gemms(n, dims, causal=False, **_):
    """3 forward, 6 backward: W_in (one GEMM for both halves U and V), the token mixing (one
    (T, T) x (T, B d_ff/2) GEMM over the whole batch) and W_out; ``n`` = B * seq_len rows.
    Causal, dW is a fresh product that the mask then adds into the gradient."""
    d, f, t = dims["d_model"], dims["d_ff"], dims["seq_len"]
    h, b = f // 2, n // t
    fwd = [(n, f, d, False, False, 0.0),              # LN(x) W_in (n, d_ff)
           (t, b * h, t, False, False, 0.0),          # S = W V' time-major (T, B h)
           (n, d, h, False, False, 0.0)]              # y = x + (U * S) W_out
    bwd = [(h, d, n, True, False, 1.0),               # dW_out += A^T dy
           (n, h, d, False, True, 0.0),               # dA = dy W_out^T
           (t, t, b * h, False, True, 0.0 if causal else 1.0),  # dW (+)= dS V'^T
           (t, b * h, t, True, False, 0.0),           # dV' = W^T dS
           (d, f, n, True, False, 1.0),               # dW_in += LN(x)^T dZ
           (n, d, f, False, True, 0.0)]               # d LN(x) = dZ W_in^T
    return fwd + bwd


def _build_gmlp_block(dims, *, dtype, rng, causal):
    from ..nn.gmlp_block import GMLPBlock
    return GMLPBlock(dims["d_model"], dims["d_ff"], dims["seq_len"], causal=causal, dtype=dtype,
                     rng=rng)


register(_d_model_wide(
    "GatedFFN", "gated feed-forward (Shazeer 2020), y = (act(x W_gate + b_gate) * (x W_up + "
    "b_up)) W_down + b_down: SwiGLU with silu, GEGLU with gelu",
    _build_gated, naive.NaiveGatedFFN, _gated_gemms,
    {"activation": "silu", "bias": False, "dropout": 0.0},
    ({"activation": "silu"}, {"activation": "gelu", "bias": True})))

register(_d_model_wide(
    "GMLPBlock", "gMLP block (Liu et al. 2021) on (B, seq_len, d_model): y = x + s(Z) W_out + "
    "b_out, Z = GELU(LN(x) W_in + b_in), s the spatial gating unit mixing the tokens",
    _build_gmlp_block, naive.NaiveGMLPBlock, _gmlp_block_gemms, {"causal": False},
    ({"causal": False}, {"causal": True}), dims=("d_model", "d_ff", "seq_len")))


# ----------------------------------------------------------------------------- attention
def _attention_gemms(n, dims, n_heads=4, **_):
    """2 + 2 B h forward, 4 + 4 B h backward: the [q | k | v] and output projections over all
    n = B * seq_len rows, and per (sequence, head) S = q k^T, O = P v; backward dP = dO v^T,
    dv = P^T dO, dq = dS k, dk = dS^T q."""
    d, t = dims["d_model"], dims["seq_len"]
    dh, bh = d // n_heads, (n // t) * n_heads
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


def _transformer_gemms(n, dims, n_heads=4, **_):
    """The attention's GEMMs, then the FFN's (LayerNorms add none)."""
    return _attention_gemms(n, dims, n_heads) + _ffn_gemms(n, dims)


def _build_attention(dims, *, dtype, rng, n_heads, causal, dropout, bias):
    from ..nn.attention import MultiHeadAttention
    return MultiHeadAttention(dims["d_model"], n_heads, causal=causal, dropout=dropout,
                              bias=bias, dtype=dtype, rng=rng)


def _build_transformer(dims, *, dtype, rng, n_heads, ffn, norm, causal, dropout):
    from ..nn.transformer import TransformerBlock
    return TransformerBlock(dims["d_model"], n_heads, dims["d_ff"], ffn=ffn, norm=norm,
                            causal=causal, dropout=dropout, dtype=dtype, rng=rng)


def _naive(name):
    from . import naive_attention
    return getattr(naive_attention, name)


register(_d_model_wide(
    "MultiHeadAttention", "multi-head self-attention (Vaswani et al. 2017) on (B, seq_len, "
    "d_model), causal or full: per head softmax(q k^T / sqrt(d_head)) v, then W_o",
    _build_attention, _naive("NaiveMultiHeadAttention"), _attention_gemms,
    {"n_heads": 4, "causal": True, "dropout": 0.0, "bias": True},
    ({"n_heads": 3, "causal": True}, {"n_heads": 2, "causal": False, "bias": False}),
    dims=("d_model", "seq_len")))

register(_d_model_wide(
    "TransformerBlock", "transformer block: h = x + attn(ln_1(x)), y = h + ffn(ln_2(h)) "
    "(pre-norm, GPT-2) or the post-norm order (Vaswani et al. 2017)",
    _build_transformer, _naive("NaiveTransformerBlock"), _transformer_gemms,
    {"n_heads": 4, "ffn": "gelu", "norm": "pre", "causal": True, "dropout": 0.0},
    ({"n_heads": 3, "norm": "pre"}, {"n_heads": 2, "norm": "post", "ffn": "relu"}),
    dims=("d_model", "d_ff", "seq_len")))

"""``GPT``: a decoder-only transformer language model (Radford et al. 2018, 2019), laid out as
Karpathy's nanoGPT: token and learned position embeddings, a stack of pre-norm causal
``TransformerBlock``s, a final LayerNorm and a language-model head, optionally tied to the
token embedding (Press & Wolf 2017). Input: integer token ids (B, T), T <= block_size;
output: next-token logits (B, T, vocab_size)."""
from __future__ import annotations

import contextlib
import math

import numpy as np

from kernels import ops, overlap

from ..nn.blocks import Dropout, LayerNorm
from ..nn.embedding import Embedding, check_id_range, check_integer_ids
from ..nn.containers import BackwardHooks, Sequential
from ..nn.layers import Linear
from .._checks import check_bool, check_positive_int, check_real
from ..nn.module import Module, check_input_grad, make_rng
from ..nn.transformer import TransformerBlock

__all__ = ["GPT"]

# The residual projections of a block (scaled at init, GPT-2 / nanoGPT's c_proj).
_RESIDUAL_PROJECTIONS = ("attn.W_o", "mlp.W_out", "mlp.W_down")


class GPT(BackwardHooks, Module):
    """``logits = head(ln_f(blocks(wte[ids] + wpe[0:T])))`` for token ids (B, T).

    Children: ``wte`` Embedding(vocab_size, d_model), ``wpe`` Embedding(block_size,
    d_model), ``drop`` (embedding dropout), ``h`` a Sequential of ``n_layer``
    ``TransformerBlock(d_model, n_head, d_ff, ffn, dropout=dropout, norm="pre", causal=True)``
    (``checkpoint=True`` recomputes each block in backward instead of storing it),
    ``ln_f`` LayerNorm, and with ``tie_weights=False`` ``lm_head`` Linear(d_model,
    vocab_size, bias=False). With ``tie_weights=True`` the head is the token embedding
    itself, logits = h wte.W^T, and both uses add into the one gradient ``wte.W.grad``.
    ``d_ff`` defaults to 4 d_model. ``bias=False`` (nanoGPT's) drops every bias: the
    Linears' and the LayerNorms' (ln_1, ln_2, ln_f). Initialisation as nanoGPT: every weight
    and embedding N(0, 0.02^2), the residual projections (``attn.W_o``, the FFN's output
    weight) N(0, (0.02 / sqrt(2 n_layer))^2), biases 0, LayerNorms 1 and 0.

    ``backward(dlogits)`` adds every parameter gradient and returns None (ids have no
    gradient). Ids outside [0, vocab_size), T > block_size, or a non-integer ids array
    raise before anything changes.
    """

    # get_config reads d_ff resolved (4 d_model for d_ff=None), as stored configs hold it.
    config_attrs = {"dropout": "p", "checkpoint": "h.checkpoint", "eps": "ln_f.eps"}

    def __init__(self, vocab_size: int, block_size: int, n_layer: int, n_head: int,
                 d_model: int, *, dropout: float = 0.0, bias: bool = True, dtype=np.float32,
                 rng=None, d_ff: int | None = None, ffn: str = "gelu", tie_weights: bool = True,
                 checkpoint: bool = False, eps: float = 1e-5):
        super().__init__(dtype)
        self.vocab_size = check_positive_int("vocab_size", vocab_size)
        self.block_size = check_positive_int("block_size", block_size)
        self.n_layer = check_positive_int("n_layer", n_layer)
        self.n_head = check_positive_int("n_head", n_head)
        self.d_model = check_positive_int("d_model", d_model)
        self.d_ff = 4 * d_model if d_ff is None else check_positive_int("d_ff", d_ff)
        p = check_real("dropout", dropout, 0.0, 1.0, high_open=True)
        tie_weights = check_bool("tie_weights", tie_weights)
        bias = check_bool("bias", bias)
        checkpoint = check_bool("checkpoint", checkpoint)
        rng = make_rng(rng)
        self.tie_weights, self.p, self.ffn, self.bias = tie_weights, p, ffn, bias
        dt = self.dtype
        self.wte = Embedding(vocab_size, d_model, dtype=dt, rng=rng)
        self.wpe = Embedding(block_size, d_model, dtype=dt, rng=rng)
        self.drop = Dropout(p, dtype=dt, rng=rng)
        self.h = Sequential(*[TransformerBlock(d_model, n_head, self.d_ff, ffn, dropout=p,
                                               bias=bias, init="normal", dtype=dt, rng=rng,
                                               norm="pre", causal=True, eps=eps,
                                               norm_bias=bias)
                              for _ in range(self.n_layer)], checkpoint=checkpoint)
        self.ln_f = LayerNorm(d_model, bias=bias, dtype=dt, eps=eps)
        if not tie_weights:
            self.lm_head = Linear(d_model, vocab_size, bias=False, init="normal", dtype=dt,
                                  rng=rng)
        self._positions = np.arange(self.block_size)  # (block_size,) wpe's ids
        self._saved.bt = None
        self._saved.dropped = False
        self._saved.hf = None  # (N, d_model) ln_f's output, by reference (tied head's backward)
        self._init_weights(rng)

    def _init_weights(self, rng) -> None:
        std = 0.02
        proj = std / math.sqrt(2 * self.n_layer)
        for name, prm in self.named_parameters():
            if prm.data.ndim != 2:
                continue  # biases stay 0, LayerNorm gains 1
            s = proj if name.endswith(_RESIDUAL_PROJECTIONS) else std
            prm.data = (rng.standard_normal(prm.shape) * s).astype(self.dtype)

    def generate(self, ids, max_new_tokens: int, temperature: float = 1.0, top_k=None,
                 rng=None) -> np.ndarray:
        """nanoGPT's ``generate``: ``max_new_tokens`` times, crop the context to the last
        ``block_size`` ids, take the last position's logits / ``temperature``, keep the
        ``top_k`` largest (clamped to vocab_size, as nanoGPT) when given, and draw the next
        id from their softmax. ``ids`` (B, T) integer ids; returns a new int64 array (B, T +
        max_new_tokens). Runs in eval mode (no dropout) and restores the mode after; ``rng``
        a Generator or seed. A bad argument raises before anything changes."""
        from .sampling import autoregress, check_sampling
        check_integer_ids(ids, "ids", sequences=True)
        check_id_range(ids, self.vocab_size, "ids")
        if 0 in ids.shape:
            raise ValueError(f"ids: expected at least one sequence of at least one id, got "
                             f"shape {ids.shape}")
        n, temperature, top_k = check_sampling(max_new_tokens, temperature, top_k)
        return autoregress(self, ids, n, self.block_size, temperature, top_k, make_rng(rng))

    def extra_repr(self):
        return (f"vocab_size={self.vocab_size}, block_size={self.block_size}, n_layer="
                f"{self.n_layer}, n_head={self.n_head}, d_model={self.d_model}, d_ff={self.d_ff}"
                f", ffn={self.ffn!r}, dropout={self.p}, tie_weights={self.tie_weights}, "
                f"dtype={self.dtype}" + ("" if self.bias else ", bias=False"))

    @property
    def torch_layout(self) -> list:
        """nanoGPT's ``GPT`` names: transformer.wte, .wpe, .h.<i> (nanoGPT's Blocks), .ln_f and
        lm_head; tied, lm_head.weight is wte's weight itself (both keys, one parameter)."""
        t = "transformer."
        return [(t + "wte.weight", "wte.W", False), (t + "wpe.weight", "wpe.W", False),
                (t + "h.", "h"), (t + "ln_f.", "ln_f"),
                ("lm_head.weight", "wte.W" if self.tie_weights else "lm_head.W",
                 not self.tie_weights)]

    def out_features(self, d_in: int) -> int:
        return self.vocab_size

    def check_input(self, x, name: str = "ids") -> tuple:
        """(B, T, vocab_size) for token ids (B, T), else the error ``forward`` raises. The
        attention scores' memory is not checked here: a data set of B sequences is run in
        batches, and ``forward`` checks the batch it gets."""
        b, t = self._check_ids(x, name, scores=False)
        return (b, t, self.vocab_size)

    def _check_ids(self, ids, name: str = "ids", scores: bool = True):
        check_integer_ids(ids, name, sequences=True)
        b, t = ids.shape
        if not 1 <= t <= self.block_size:
            raise ValueError(f"{name}: expected 1 <= T <= block_size = {self.block_size} positions, "
                             f"got T = {t} in shape {ids.shape}")
        check_id_range(ids, self.vocab_size, name)
        if scores:
            self.h[0].attn.check_scores(b, t, name)
        return b, t

    def forward(self, ids, *, residual=None):
        """Logits (B, T, vocab_size) for token ids (B, T); a view of a work buffer."""
        if residual is not None:
            raise ValueError("residual: a GPT's output is logits; it takes no residual")
        b, t = self._check_ids(ids)
        s = self._calls
        s.ready = False
        n, d, v = b * t, self.d_model, self.vocab_size
        x = self.wpe(np.broadcast_to(self._positions[:t], (b, t)), residual=self.wte(ids))
        self._saved.dropped = self.p > 0.0 and self.training
        if self._saved.dropped:
            x = self.drop(x)
        hf = self.ln_f(self.h(x)).reshape(n, d)
        if self.tie_weights:
            logits = self._ws.get("logits", n, v)  # (N, vocab_size)
            if n:
                ops.gemm(logits, hf, self.wte.W.data, False, True, 1.0, 0.0)  # h wte.W^T
            self._saved.hf = hf
        else:
            logits = self.lm_head(hf)
        self._saved.bt = (b, t)
        s.out_shape, s.ready = (b, t, v), True
        return logits.reshape(b, t, v)

    def backward(self, dy, *, dx_acc=None, input_grad=True):
        """Adds every parameter's gradient for dlogits ``dy`` (B, T, vocab_size); None (token
        ids have no gradient, whatever ``input_grad`` says). Backward hooks
        (``add_backward_hook``) get an untied ``lm_head``, then ``ln_f``, once theirs are done."""
        s = self._calls
        check_input_grad(input_grad)
        if not s.ready:
            raise self._no_forward()
        if dx_acc is not None:
            raise ValueError("dx_acc: a GPT has no input gradient (its input is token ids)")
        dy2 = self._dy_rows(dy, s.out_shape)
        # At 2+ threads the weight gradients run on a second core beside the rest
        # (kernels.overlap). Not for a checkpointed stack (it reruns forwards into shared
        # buffers that queued GEMMs might still read), nor with attention's per-head GEMMs
        # (dropout): one-thread GEMMs there cost more than the lane saves (1.15x the step).
        t = self._saved.bt[1]
        lane = not self.h.checkpoint and all(blk.attn.uses_kernel(t) for blk in self.h)
        with overlap.session() if lane else contextlib.nullcontext():
            self._backward_rows(dy2)
        s.ready = False
        return None

    def _backward_rows(self, dy2):
        b, t = self._saved.bt
        n, d = b * t, self.d_model
        if self.tie_weights:
            dhf = self._ws.get("dhf", n, d)  # (N, d_model)
            if n:
                w = self.wte.W
                ops.gemm(w.grad, dy2, self._saved.hf, True, False, 1.0, 1.0,  # dW += dy^T h
                         overlap.deferring())
                ops.gemm(dhf, dy2, w.data, False, False, 1.0, 0.0)        # dh = dy W
            self._saved.hf = None
        else:
            dhf = self.lm_head.backward(dy2)
        dh = self.ln_f.backward(dhf.reshape(b, t, d))
        if self.backward_hooks:
            overlap.fence()
        for hook in self.backward_hooks:  # the head's and ln_f's gradients are complete
            if not self.tie_weights:      # (a tied head's are wte's: complete at the end)
                hook(self.lm_head)
            hook(self.ln_f)
        dx = self.h.backward(dh)
        if self._saved.dropped:
            dx = self.drop.backward(dx)
        self.wpe.backward(dx)
        overlap.wait_for(self.wte.W.grad)
        self.wte.backward(dx)  # adds into wte.W.grad after the tied head's GEMM

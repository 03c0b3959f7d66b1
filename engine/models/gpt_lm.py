"""The GPT language model's config and model: ``GPTConfig`` (the settings of a run) and
``build_model`` (the ``GPT`` it describes). Training it on the gMLP language model's corpus
and split, or on any text, lives one layer up, in engine/training/gpt_lm.py.

``GPTConfig``'s fields carry nanoGPT's names in brackets: ``seq_len`` is nanoGPT's
``block_size``, ``d_model`` its ``n_embd``; the command line takes both spellings.
"""
from __future__ import annotations

from dataclasses import dataclass

from .._checks import check_dtype
from .gpt import GPT
from .lm_config import TextConfig

__all__ = ["GPTConfig", "build_model"]


@dataclass(kw_only=True)
class GPTConfig(TextConfig):
    """Settings of ``train``. The defaults are sized for about a minute of training on two
    idle cores (docs/lm.md has measured runs)."""
    seq_len: int = 64          # [block_size] tokens per window, and the sampling context
    d_model: int = 128         # [n_embd] width of the embeddings and the residual stream
    d_ff: int = 512            # the FFN's hidden width (4 d_model, as GPT-2)
    n_layer: int = 4           # [n_layer] TransformerBlocks
    n_head: int = 4            # [n_head] attention heads (d_model / n_head features each)
    dropout: float = 0.0       # [dropout]
    bias: bool = True          # [bias] biases in the Linear layers (and LayerNorms)
    batch_size: int = 32       # [batch_size] windows per step (the global batch under mpiexec)
    epochs: int = 2            # passes over the training windows (when max_iters is 0)
    lr: float = 2e-3           # [learning_rate] AdamW peak learning rate
    weight_decay: float = 0.1  # [weight_decay] on the matrices and embeddings only, as nanoGPT
    warmup: int = 50           # [warmup_iters] steps of linear warmup, then cosine decay
    beta2: float = 0.99        # [beta2] nanoGPT's value for its character-level runs
    # tokenizer, held_out, block, max_iters, min_lr, lr_decay_iters, beta1, grad_clip,
    # eval_interval, eval_iters, log_interval, seed, dtype, prompt, sample_length,
    # temperature: TextConfig's, so the two models split, train and sample alike.


def build_model(vocab_size: int, c: GPTConfig, rng=None) -> GPT:
    """The ``GPT`` of config ``c`` for ``vocab_size`` tokens."""
    return GPT(vocab_size, c.seq_len, c.n_layer, c.n_head, c.d_model, d_ff=c.d_ff,
               dropout=c.dropout, bias=c.bias, dtype=check_dtype(c.dtype), rng=rng)

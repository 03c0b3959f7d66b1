"""The GPT character language model: ``GPT`` trained on the gMLP language model's corpus
(``engine.models.lm``: Python's own help texts, the same held-out split and unigram
baseline), so the two compare directly. ``python -m engine train --model gpt --task text``
(engine/cli/lm.py) trains it with the defaults of ``GPTConfig``; under ``mpiexec -n K`` the
ranks train data-parallel on the same global batches (float64: equal to one process up to
rounding).
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from .._checks import check_dtype
from . import lm
from .gpt import GPT

__all__ = ["GPTConfig", "build_model", "setup", "train"]


@dataclass(kw_only=True)
class GPTConfig(lm.TextConfig):
    """Settings of ``train``. The defaults are sized for about a minute of training on two
    idle cores (docs/lm.md has measured runs)."""
    seq_len: int = 64          # block_size: characters per window, and the sampling context
    d_model: int = 128         # width of the embeddings and the residual stream
    d_ff: int = 512            # the FFN's hidden width (4 d_model, as GPT-2)
    n_layer: int = 4           # TransformerBlocks
    n_head: int = 4            # attention heads (d_model / n_head features each)
    dropout: float = 0.0
    batch_size: int = 32       # windows per step (the global batch under mpiexec)
    epochs: int = 2            # passes over the training windows
    lr: float = 2e-3           # AdamW peak learning rate
    weight_decay: float = 0.1  # on the matrices and embeddings only, as nanoGPT
    warmup: int = 50           # steps of linear warmup, then cosine decay to 0
    # held_out, block, seed, dtype, prompt, sample_length, temperature: the gMLP LM's
    # (lm.TextConfig), so the two models split and sample alike.


def build_model(vocab_size: int, c: GPTConfig, rng=None) -> GPT:
    return GPT(vocab_size, c.seq_len, c.n_layer, c.n_head, c.d_model, d_ff=c.d_ff,
               dropout=c.dropout, dtype=check_dtype(c.dtype), rng=rng)


def setup(config: GPTConfig | None = None, text: str | None = None) -> lm.LMSetup:
    """The data (lm's corpus, split and windows), the GPT, AdamW and its schedule."""
    c = config or GPTConfig()
    data = lm.corpus_data(c, text)
    model = build_model(len(data["vocab"]), c, np.random.default_rng(c.seed))
    opt = lm.adamw_decaying_matrices(model, c, betas=(0.9, 0.99))
    steps = c.epochs * -(-data["X"].shape[0] // c.batch_size)
    warmup = min(c.warmup, max(steps - 1, 0))  # shortened to leave one step at the peak
    return lm.LMSetup(config=c, **data, model=model, optimizer=opt,
                      scheduler=lm.warmup_cosine(opt, steps, warmup), steps=steps)


def train(config: GPTConfig | None = None, progress=True, text: str | None = None,
          prepared: lm.LMSetup | None = None, comm=None) -> lm.LMResult:
    """Train the GPT of ``config`` (or ``prepared``, from ``setup``); ``comm``: an MPI
    communicator for data-parallel training. Held-out bits/char, the unigram baseline and
    a sample from ``config.prompt``, as ``lm.train``."""
    return lm.run_training(prepared or setup(config, text), progress, comm)

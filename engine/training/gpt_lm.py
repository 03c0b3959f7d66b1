"""Training the GPT language model (``GPTConfig`` and ``build_model`` of
engine/models/gpt_lm.py, re-exported here) on the gMLP language model's corpus and split
(engine/training/lm.py: Python's own help texts, the same held-out split and unigram
baseline) or on any text (``text=``, ``path=``), so the two compare directly. ``python -m
engine train --model gpt`` (engine/cli/lm.py) trains it with the defaults of ``GPTConfig``;
under ``mpiexec -n K`` the ranks train data-parallel on the same global batches (float64:
equal to one process up to rounding).
"""
from __future__ import annotations

from ..models.gpt_lm import GPTConfig, build_model
from ..models.lm_config import check_text_config
from . import lm

__all__ = ["GPTConfig", "build_model", "setup", "train"]


def setup(config: GPTConfig | None = None, text: str | None = None, path=None) -> lm.LMSetup:
    """The data (the file at ``path``, else ``text``, else lm's corpus; its split and
    windows), the GPT, AdamW and nanoGPT's schedule. A warmup longer than the run is an
    error, not shortened."""
    c = config or GPTConfig()
    if not isinstance(c, GPTConfig):
        raise TypeError(f"config: expected a GPTConfig, got {type(c).__name__}")
    check_text_config(c)
    s = lm.prepare(c, lambda v, rng: build_model(v, c, rng), text, path)
    # A step's attention scores grow as batch * T^2: a block_size too long for them is
    # refused now, not at the first forward.
    s.model.h[0].attn.check_scores(c.batch_size, c.seq_len, "seq_len")
    return s


def train(config: GPTConfig | None = None, progress=True, text: str | None = None,
          prepared: lm.LMSetup | None = None, comm=None, path=None,
          resume_from=None) -> lm.LMResult:
    """Train the GPT of ``config`` (or ``prepared``, from ``setup``) on ``text`` or the file at
    ``path``; ``comm``: an MPI communicator for data-parallel training. Held-out bits per
    token, the unigram baseline and a sample from ``config.prompt``, as ``lm.train``
    (``resume_from``: continue a run stopped early from its checkpoint)."""
    return lm.run_training(prepared or setup(config, text, path), progress, comm, resume_from)

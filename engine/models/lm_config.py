"""The settings of the two language models (``LMConfig`` of engine/models/lm.py, ``GPTConfig``
of engine/models/gpt_lm.py), their checks, and the schedule and step count they imply.

Two ways to train, as the command line's ``--epochs`` and ``--max-iters``: ``epochs`` passes
over the non-overlapping windows of the training text (``max_iters = 0``), or ``max_iters``
steps on random windows (nanoGPT's ``get_batch``), with a held-out estimate every
``eval_interval`` steps. Either way the learning rate follows nanoGPT's ``get_lr``
(``WarmupCosineLR``) per optimizer step.
"""
from __future__ import annotations

from dataclasses import dataclass

from .._checks import check_bool, check_int, check_real
from ..nn.module import check_dtype
from ..optim import lr_scheduler as lrs
from .text_data import check_tokenizer

__all__ = ["TextConfig", "LMConfig", "check_text_config", "eval_interval", "total_steps",
           "schedule", "schedule_text"]


@dataclass(kw_only=True)
class TextConfig:
    """The settings both language models share (``LMConfig``, ``GPTConfig``): the text's
    tokenizer and held-out split, the optimizer and schedule beyond the model's own rate, the
    iteration-based run, seed and dtype, and the sample drawn after training. Keyword-only,
    so they follow each model's own fields in its constructor. nanoGPT's names in brackets."""
    tokenizer: str = "char"    # "char": the text's distinct characters; "byte": UTF-8 bytes
    held_out: float = 0.1      # fraction of the text held out, in blocks of ``block`` tokens
    block: int = 4096          # (shortened to a tenth of a text too short for ten of them)
    max_iters: int = 0         # [max_iters] > 0: steps on random windows; 0: ``epochs``
    min_lr: float = 0.0        # [min_lr] the rate the cosine ends at
    lr_decay_iters: int | None = None  # [lr_decay_iters] None: the run's last step
    beta1: float = 0.9         # [beta1] AdamW's first-moment decay
    beta2: float = 0.999       # [beta2] AdamW's second-moment decay
    grad_clip: float = 0.0     # [grad_clip] max global gradient norm; 0: no clipping
    eval_interval: int | None = None  # [eval_interval] steps between held-out estimates
                               # (max_iters runs; None: a tenth of the run)
    eval_iters: int = 20       # [eval_iters] batches of held-out windows per estimate
    log_interval: int = 0      # [log_interval] a training-loss line every N steps; 0: none
    seed: int = 0              # initialisation, batches and sampling
    dtype: str = "float32"
    prompt: str = "The "
    sample_length: int = 300
    temperature: float = 0.8


@dataclass(kw_only=True)
class LMConfig(TextConfig):
    """Settings of the gMLP language model's ``train``. The defaults are sized for about a
    minute of training on two cores (docs/lm.md has a measured run)."""
    seq_len: int = 64          # [block_size] tokens per training window, the sampling context
    d_model: int = 128         # [n_embd] width of the embedding and the residual stream
    d_ffn: int = 384           # GMLPBlock's d_ffn (U and V halves of d_ffn / 2)
    blocks: int = 4            # [n_layer] GMLPBlocks
    batch_size: int = 32       # [batch_size] windows per step
    epochs: int = 4            # passes over the training windows (when max_iters is 0)
    lr: float = 3e-3           # [learning_rate] AdamW peak learning rate
    weight_decay: float = 0.01
    warmup: int = 100          # [warmup_iters] steps of linear warmup, then cosine decay


def check_text_config(c):
    """``c`` if every shared field (``TextConfig``'s, and ``seq_len``, ``d_model``,
    ``batch_size``, ``epochs``, ``lr``, ``weight_decay``, ``warmup`` that both models have) is
    usable, else TypeError/ValueError naming the field: all of it before any training."""
    if not isinstance(c, TextConfig):
        raise TypeError(f"config: expected an LMConfig or GPTConfig, got {type(c).__name__}")
    for name in ("seq_len", "d_model", "batch_size", "block", "eval_iters"):
        check_int(f"config.{name}", getattr(c, name), 1)
    for name in ("epochs", "warmup", "seed", "sample_length", "max_iters", "log_interval"):
        check_int(f"config.{name}", getattr(c, name), 0)
    for name in ("eval_interval", "lr_decay_iters"):
        if getattr(c, name) is not None:
            check_int(f"config.{name}", getattr(c, name), 1)
    for name in ("lr", "weight_decay", "min_lr", "grad_clip"):
        check_real(f"config.{name}", getattr(c, name), 0.0)
    for name in ("beta1", "beta2"):
        check_real(f"config.{name}", getattr(c, name), 0.0, 1.0, high_open=True)
    check_real("config.held_out", c.held_out, 0.0, 0.5, low_open=True, high_open=True)
    check_real("config.temperature", c.temperature, 0.0, low_open=True)
    check_tokenizer(c.tokenizer)
    check_dtype(c.dtype)
    if not isinstance(c.prompt, str) or not c.prompt:
        raise ValueError(f"config.prompt: expected a non-empty str, got {c.prompt!r}")
    if c.min_lr > c.lr:
        raise ValueError(f"config.min_lr: expected at most lr = {c.lr}, got {c.min_lr}")
    if hasattr(c, "bias"):
        check_bool("config.bias", c.bias)
    return c


def eval_interval(c) -> int:
    """Steps between held-out estimates of an iteration-based run: ``c.eval_interval``, else
    a tenth of ``c.max_iters`` (at least 1)."""
    return c.eval_interval or max(1, c.max_iters // 10)


def total_steps(c, windows: int) -> int:
    """The run's optimizer steps: ``c.max_iters``, else ``c.epochs`` passes over ``windows``
    training windows in batches of ``c.batch_size``."""
    return c.max_iters or c.epochs * -(-windows // c.batch_size)


def schedule(opt, c, steps: int):
    """nanoGPT's schedule over a run of ``steps``: ``c.warmup`` steps of linear warmup, a cosine
    from ``c.lr`` to ``c.min_lr`` at ``c.lr_decay_iters`` (None: the last step), then
    ``c.min_lr``. A warmup that leaves no step at the full rate is refused, never shortened."""
    warmup = lrs.check_warmup(c.warmup, steps)
    decay = c.lr_decay_iters if c.lr_decay_iters is not None else max(steps, warmup + 1)
    return lrs.WarmupCosineLR(opt, warmup, decay, c.min_lr)


def schedule_text(c, steps: int) -> str:
    """The banner's words for ``schedule(opt, c, steps)``."""
    decay = c.lr_decay_iters if c.lr_decay_iters is not None else max(steps, c.warmup + 1)
    return (f"{c.warmup} warmup steps, cosine from lr {c.lr:g} to min_lr {c.min_lr:g} at "
            f"step {decay}" + (f", then {c.min_lr:g}" if decay < steps else ""))

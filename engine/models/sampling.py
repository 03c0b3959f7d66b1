"""Text from a language model, one token at a time, as Karpathy's nanoGPT (``GPT.generate``,
``sample.py``): the context cropped to the model's window, the last position's logits
divided by the temperature, optionally only the ``top_k`` largest kept, and the next token
drawn from their softmax. One loop (``autoregress``) serves ``GPT.generate``,
``lm.sample`` and ``generate``, which works on the GPT and on the gMLP language model.

The softmax runs in float64 with the largest logit subtracted first, so any temperature
> 0 gives probabilities: a tiny one (down to 5e-324) samples the argmax (ties shared), a
huge one the uniform distribution over the kept tokens.
"""
from __future__ import annotations

import numpy as np

from .._checks import check_int, check_real
from ..nn.module import Module
from .tokenizer import ByteTokenizer, Vocabulary

__all__ = ["generate", "autoregress", "next_ids", "check_sampling", "context_length",
           "encode_prompt"]


def check_sampling(max_new_tokens, temperature, top_k) -> tuple:
    """``(max_new_tokens, temperature, top_k)`` checked: an int >= 0, a finite number > 0,
    None or an int >= 1 (above the vocabulary size it keeps every token, as nanoGPT's
    ``min(top_k, vocab_size)``); TypeError/ValueError naming the argument."""
    n = check_int("max_new_tokens", max_new_tokens, 0, what="an integer >= 0")
    t = check_real("temperature", temperature, 0.0, low_open=True)
    k = None if top_k is None else check_int("top_k", top_k, 1, what="None or an integer >= 1")
    return n, t, k


def check_seed(seed):
    """``seed`` as None (fresh entropy) or an int >= 0 (numpy's ``default_rng`` seeds)."""
    return None if seed is None else check_int("seed", seed, 0, what="None or an integer >= 0")


def next_ids(logits, temperature: float, top_k, rng) -> np.ndarray:
    """One token id per row of ``logits`` (B, V), drawn from softmax(logits / temperature)
    over the ``top_k`` largest (all when None; ties at the k-th value kept, as nanoGPT).
    ValueError naming the model's logits when a row holds NaN or inf."""
    z = np.array(logits, np.float64)  # (B, V) a float64 copy
    bad = ~np.isfinite(z)
    if bad.any():
        row = int(np.argmax(bad.any(axis=1)))
        raise ValueError(f"model: its logits are not finite (NaN or inf in row {row} of the "
                         f"last position): no distribution to sample from; are its weights "
                         f"finite?")
    v = z.shape[1]
    z -= z.max(axis=1, keepdims=True)  # <= 0, the largest exactly 0
    if top_k is not None and top_k < v:
        kth = np.partition(z, v - top_k, axis=1)[:, v - top_k, None]  # (B, 1) k-th largest
        z[z < kth] = -np.inf
    with np.errstate(over="ignore", under="ignore"):
        z /= temperature                # a tiny temperature: -inf below the max, 0 at it
        p = np.exp(z)                   # the max's 1 keeps every row's sum >= 1
    c = np.cumsum(p, axis=1)            # (B, V) unnormalised CDF
    u = rng.random(len(c)) * c[:, -1]   # (B,) uniform in [0, row sum)
    return np.minimum((c <= u[:, None]).sum(axis=1), v - 1)  # searchsorted(c, u, "right")


def autoregress(model, ids, max_new_tokens: int, context: int, temperature: float, top_k,
                rng) -> np.ndarray:
    """``ids`` (B, T) continued by ``max_new_tokens`` drawn ids: (B, T + max_new_tokens)
    int64. Each step reads the last ``context`` ids; the model runs in eval mode and gets
    its mode back (checked arguments: the callers check them)."""
    b, t0 = ids.shape
    out = np.empty((b, t0 + max_new_tokens), np.int64)  # (B, T + n) the growing sequences
    out[:, :t0] = ids
    was_training = model.training
    model.eval()
    try:
        for t in range(t0, t0 + max_new_tokens):
            ctx = np.ascontiguousarray(out[:, max(0, t - context):t])  # (B, <= context)
            out[:, t] = next_ids(model.forward(ctx)[:, -1], temperature, top_k, rng)
    finally:
        model.train(was_training)
    return out


def context_length(model) -> int:
    """The window a language model reads: a GPT's ``block_size``, else the ``seq_len`` of
    its gMLP blocks (the smallest); ValueError for a model with neither."""
    if isinstance(getattr(model, "block_size", None), int):
        return model.block_size
    lens = [m.seq_len for _, m in model.named_modules()
            if isinstance(getattr(m, "seq_len", None), int)]
    if not lens:
        raise ValueError(f"model: a {type(model).__name__} is not a language model this can "
                         f"sample from (no block_size, no gMLP seq_len)")
    return min(lens)


def _check_fits(model, tokenizer, context: int) -> None:
    """The model reads ids up to len(tokenizer) - 1, any prefix of 1 to ``context`` ids, and
    predicts len(tokenizer) tokens (asked through the module protocol's check_input)."""
    n = len(tokenizer)
    try:
        out = model.check_input(np.array([[n - 1]], np.int64), "ids")
        model.check_input(np.zeros((1, context), np.int64), "ids")
    except (TypeError, ValueError) as e:
        raise ValueError(f"tokenizer: {n} tokens in windows of 1 to {context} do not fit the "
                         f"model ({e})") from None
    if out[-1] != n:
        raise ValueError(f"tokenizer: {n} tokens, the model predicts {out[-1]} (the "
                         f"tokenizer of another model?)")


def encode_prompt(tokenizer, prompt) -> np.ndarray:
    """``prompt``'s ids (1-D int64), a non-empty str, else an error naming ``prompt`` (and
    the characters a character vocabulary lacks)."""
    if not isinstance(prompt, str):
        raise TypeError(f"prompt: expected a non-empty str, got {type(prompt).__name__}")
    if not prompt:
        raise ValueError("prompt: expected a non-empty str (sampling starts from it), got ''")
    try:
        return tokenizer.encode(prompt)
    except ValueError as e:
        raise ValueError(f"prompt: {str(e).partition(': ')[2]}") from None


def generate(model, tokenizer, prompt: str, max_new_tokens: int, *, num_samples: int = 1,
             temperature: float = 1.0, top_k=None, seed=None) -> list:
    """``num_samples`` texts, each ``prompt`` followed by ``max_new_tokens`` tokens drawn
    from ``model`` (a ``GPT`` or the gMLP language model, ``lm.build_model``) with
    ``tokenizer`` (a ``Vocabulary`` or ``ByteTokenizer``, e.g. ``load_model(path).tokenizer``):
    nanoGPT's sampling (see ``GPT.generate``), the samples drawn side by side as one batch.
    ``top_k`` above the vocabulary size keeps every token (nanoGPT clamps it); ``seed`` an
    int >= 0 (None: fresh entropy). Every argument is checked before the model runs."""
    if not isinstance(model, Module):
        raise TypeError(f"model: expected an engine Module, got {type(model).__name__}")
    if not isinstance(tokenizer, (Vocabulary, ByteTokenizer)):
        raise TypeError(f"tokenizer: expected a Vocabulary or ByteTokenizer, got "
                        f"{type(tokenizer).__name__}")
    n, temperature, top_k = check_sampling(max_new_tokens, temperature, top_k)
    num_samples = check_int("num_samples", num_samples, 1, what="an integer >= 1")
    rng = np.random.default_rng(check_seed(seed))
    ids = encode_prompt(tokenizer, prompt)
    context = context_length(model)
    _check_fits(model, tokenizer, context)
    out = autoregress(model, np.tile(ids, (num_samples, 1)), n, context, temperature, top_k,
                      rng)
    return [tokenizer.decode(row) for row in out]

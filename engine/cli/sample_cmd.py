"""``blasnet sample CHECKPOINT --prompt TEXT``: text drawn from a language model saved by
``train --model gmlp-lm|gpt --save`` (or ``engine.save`` of a ``GPT`` with a tokenizer
entry): the model and its tokenizer come from the checkpoint through ``engine.load_model``,
the drawing is ``engine.generate`` (nanoGPT's sample.py: --num-samples, --max-new-tokens,
--temperature, --top-k, --seed)."""
from __future__ import annotations

import sys

from .._checks import check_int, check_real

__all__ = ["add_parser", "run"]

# The flag that sets each of engine.generate's arguments (their errors name the flag).
_FLAGS = {"max_new_tokens": "--max-new-tokens", "num_samples": "--num-samples",
          "temperature": "--temperature", "top_k": "--top-k", "seed": "--seed",
          "prompt": "--prompt"}
_SEPARATOR = "---------------"  # between samples, as nanoGPT's sample.py prints


def add_parser(sub) -> None:
    p = sub.add_parser("sample", help="generate text from a saved language model",
                       description="Rebuild the language model saved in CHECKPOINT (train "
                                   "--model gmlp-lm or gpt --task text --save PATH) and "
                                   "print NUM_SAMPLES texts: PROMPT followed by MAX_NEW_TOKENS "
                                   f"drawn tokens, separated by '{_SEPARATOR}' lines.")
    p.add_argument("checkpoint", metavar="CHECKPOINT")
    p.add_argument("--prompt", default="The ", metavar="TEXT",
                   help="text the samples start from (default: 'The ')")
    p.add_argument("--max-new-tokens", "--length", dest="max_new_tokens", type=int,
                   default=300, metavar="N", help="tokens to generate per sample (default: 300)")
    p.add_argument("--num-samples", type=int, default=1, metavar="N",
                   help="samples to draw (default: 1)")
    p.add_argument("--temperature", type=float, default=None, metavar="T",
                   help="softmax temperature > 0 (default: the one saved with the model, else "
                        "0.8)")
    p.add_argument("--top-k", type=int, default=None, metavar="K",
                   help="draw from the K most likely tokens only (default: all)")
    p.add_argument("--seed", type=int, default=0, help="seed of the draws, >= 0 (default: 0)")
    p.set_defaults(run=run)


def _options(args, metadata) -> dict:
    """engine.generate's keyword arguments from the flags (the temperature saved with the
    model when --temperature is not given)."""
    config = metadata.get("config") if isinstance(metadata, dict) else None
    temperature = args.temperature
    if temperature is None:
        saved = config.get("temperature") if isinstance(config, dict) else None
        # A saved value that is no usable temperature (bool, 0, inf) falls back to the default.
        temperature = saved if type(saved) in (int, float) and 0 < saved < 1e308 else 0.8
    return dict(num_samples=args.num_samples, temperature=temperature, top_k=args.top_k,
                seed=args.seed)


def _flag_error(e) -> str:
    """An argument's error with the flag that sets it named instead."""
    name, sep, rest = str(e).partition(": ")
    return f"{_FLAGS[name]}: {rest}" if sep and name in _FLAGS else str(e)


def _check_flags(args) -> None:
    """The sampling flags' values, each error naming its flag (before the file is read)."""
    check_int("--max-new-tokens", args.max_new_tokens, 0)
    check_int("--num-samples", args.num_samples, 1)
    if args.temperature is not None:
        check_real("--temperature", args.temperature, 0.0, low_open=True)
    if args.top_k is not None:
        check_int("--top-k", args.top_k, 1)
    check_int("--seed", args.seed, 0)


def run(args) -> int:
    from ..models import sampling
    from ..training import checkpoint
    from ..training.load_model import load_model
    try:
        _check_flags(args)
    except (ValueError, TypeError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    try:  # a missing or unreadable file is a usage error too, as for inspect and predict
        r = load_model(args.checkpoint, optimizer=False, scheduler=False)
    except (checkpoint.CheckpointError, ValueError, TypeError, OSError) as e:
        why = f"{args.checkpoint}: {e.strerror}" if isinstance(e, OSError) and e.strerror else e
        print(f"error: {why}", file=sys.stderr)
        return 2
    if r.tokenizer is None:
        print(f"error: {args.checkpoint}: not a language model checkpoint (its metadata holds "
              f"no tokenizer; train one with --model gmlp-lm or gpt --task text --save "
              f"PATH)", file=sys.stderr)
        return 2
    try:
        texts = sampling.generate(r.model, r.tokenizer, args.prompt, args.max_new_tokens,
                                  **_options(args, r.metadata))
    except (ValueError, TypeError) as e:
        print(f"error: {_flag_error(e)}", file=sys.stderr)
        return 2
    print(f"\n{_SEPARATOR}\n".join(texts))
    return 0

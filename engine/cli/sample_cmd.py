"""``blasnet sample CHECKPOINT --prompt TEXT``: text drawn from a character language model
saved by ``train --model gmlp-lm --save``; its vocabulary and window length come from the
checkpoint's metadata through ``engine.load_model``."""
from __future__ import annotations

import sys

import numpy as np

__all__ = ["add_parser", "run"]


def add_parser(sub) -> None:
    p = sub.add_parser("sample", help="generate text from a saved character language model",
                       description="Rebuild the language model saved in CHECKPOINT (train "
                                   "--model gmlp-lm --task text --save PATH) and print PROMPT "
                                   "followed by LENGTH generated characters.")
    p.add_argument("checkpoint", metavar="CHECKPOINT")
    p.add_argument("--prompt", default="The ", metavar="TEXT",
                   help="text the sample starts from (default: 'The ')")
    p.add_argument("--length", type=int, default=300, metavar="N",
                   help="characters to generate (default: 300)")
    p.add_argument("--temperature", type=float, default=None, metavar="T",
                   help="softmax temperature (default: the one saved with the model)")
    p.add_argument("--seed", type=int, default=0, help="seed of the draws")
    p.set_defaults(run=run)


def run(args) -> int:
    from ..models import lm
    from ..training import checkpoint
    from ..training.load_model import load_model
    try:
        r = load_model(args.checkpoint, optimizer=False, scheduler=False)
        meta = r.metadata if isinstance(r.metadata, dict) else {}
        chars, config = meta.get("vocab"), meta.get("config")
        if not isinstance(chars, str) or not isinstance(config, dict) or "seq_len" not in config:
            raise ValueError(f"{args.checkpoint}: not a language model checkpoint (its metadata "
                             f"has no vocabulary and window length; train one with --model "
                             f"gmlp-lm --task text --save PATH)")
        temperature = config.get("temperature", 0.8) if args.temperature is None \
            else args.temperature
        text = lm.sample(r.model, lm.Vocabulary(chars), args.prompt, args.length,
                         config["seq_len"], temperature, np.random.default_rng(args.seed))
    except (checkpoint.CheckpointError, ValueError, TypeError, OSError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    print(text)
    return 0

"""``train --config FILE``: a training recipe in one file (TOML through ``tomllib``, or JSON),
its keys the ``train`` options by name with ``_`` or ``-`` (``n_layer = 4``), as nanoGPT's
config files. Options given on the command line win over the file; a key that is no option,
or a value the option would not take, is a usage error naming the key and the file."""
from __future__ import annotations

import argparse
import json
import os

from .inputs import UsageError

__all__ = ["read_recipe", "apply_recipe"]

# Options that choose what runs rather than how it trains: on the command line only.
COMMAND_LINE_ONLY = ("model", "task", "config", "resume", "threads", "save", "history", "plot",
                     "quiet", "verbose")


def read_recipe(path: str) -> dict:
    """The key -> value table of the TOML (``.toml``) or JSON (``.json``) file at ``path``;
    UsageError naming the file for one that is missing, unreadable, malformed or not a
    table."""
    suffix = os.path.splitext(path)[1].lower()
    if suffix not in (".toml", ".json"):
        raise UsageError(f"--config {path}: expected a .toml or .json file")
    try:
        with open(path, "rb") as f:
            raw = f.read()
        if suffix == ".toml":
            import tomllib
            table = tomllib.loads(raw.decode("utf-8"))
        else:
            table = json.loads(raw)
    except OSError as e:
        raise UsageError(f"--config {path}: {e.strerror or e}") from None
    except (ValueError, UnicodeDecodeError) as e:  # tomllib.TOMLDecodeError is a ValueError
        raise UsageError(f"--config {path}: not valid {suffix[1:].upper()}: {e}") from None
    if not isinstance(table, dict):
        raise UsageError(f"--config {path}: expected a table of options, got "
                         f"{type(table).__name__}")
    return table


def _value(action, key: str, v, where: str):
    """``v`` as the option of ``action`` would parse it, else UsageError."""
    bad = f"{key} in {where}: "
    if action.nargs == 0:  # a switch (--quiet, --bias/--no-bias)
        if not isinstance(v, bool):
            raise UsageError(bad + f"expected true or false, got {v!r}")
        return v
    if action.nargs not in (None, "?"):
        raise UsageError(bad + "a list option: give it on the command line")
    if isinstance(v, bool) or not isinstance(v, (str, int, float)):
        raise UsageError(bad + f"expected a {'number' if action.type else 'string'}, got {v!r}")
    if action.type is None and not isinstance(v, str):
        raise UsageError(bad + f"expected a string, got {v!r}")
    try:
        v = action.type(str(v)) if action.type is not None else v
    except (argparse.ArgumentTypeError, ValueError) as e:
        raise UsageError(bad + str(e)) from None
    if action.choices is not None and v not in action.choices:
        raise UsageError(bad + f"expected one of {', '.join(map(str, action.choices))}, "
                               f"got {v!r}")
    return v


def apply_recipe(args, actions: dict) -> None:
    """Set each option of the recipe ``args.config`` that the command line did not give
    (``args.given``), and record it there as ``"KEY (FILE)"``; ``actions``: the train
    parser's options by dest."""
    path = args.config
    where = os.path.basename(path)
    for key, v in read_recipe(path).items():
        dest = str(key).replace("-", "_")
        if dest not in actions or dest in COMMAND_LINE_ONLY:
            why = "set it on the command line" if dest in actions else "no such option"
            raise UsageError(f"unknown key {key!r} in {path} ({why})")
        if dest in args.given:  # the command line wins
            continue
        setattr(args, dest, _value(actions[dest], key, v, where))
        args.given[dest] = f"{key} ({where})"

"""``blasnet inspect CHECKPOINT``: what a checkpoint holds (the model's configuration, its
parameter count, the optimizer and schedule state, the metadata) without building anything."""
from __future__ import annotations

import json
import math
import os
import sys

from .safe_text import safe

__all__ = ["add_parser", "run"]


def add_parser(sub) -> None:
    p = sub.add_parser("inspect", help="print a checkpoint's model configuration, parameter "
                                       "count and metadata",
                       description="Print what a checkpoint (.npz or .safetensors) holds: the "
                                   "model's configuration, its parameters and their count, the "
                                   "optimizer and schedule state, and the metadata.")
    p.add_argument("checkpoint", metavar="CHECKPOINT")
    p.add_argument("--json", action="store_true", help="print it all as one JSON document")
    p.set_defaults(run=run)


def _summary(h: dict) -> dict:
    params = {k: {"shape": list(s), "dtype": d} for k, (s, d) in h["params"].items()}
    return {"format": h["format"], "model": h["model"], "model_config": h["model_config"],
            "model_config_error": h["model_config_error"],
            "parameters": sum(math.prod(v["shape"]) for v in params.values()),
            "tensors": params, "optimizer": h["optimizer"], "scheduler": h["scheduler"],
            "metadata": h["metadata"]}


def _show(v) -> str:
    """A value read from the file: a string as itself (escaped), anything else as JSON."""
    return safe(v) if isinstance(v, str) else _json(v)


def _finite(v):
    """``v`` with NaN and infinities as null (JSON has no numbers for them); the nesting is
    bounded by the reader (engine/training/checkpoint_format.py)."""
    if isinstance(v, float) and not math.isfinite(v):
        return None
    if isinstance(v, dict):
        return {k: _finite(x) for k, x in v.items()}
    if isinstance(v, list):
        return [_finite(x) for x in v]
    return v


def _json(v) -> str:
    """``v`` as one line of JSON, every non-ASCII and control character escaped."""
    return json.dumps(v, ensure_ascii=True)


def _is_node(v) -> bool:
    return isinstance(v, dict) and set(v) == {"type", "config"} and isinstance(v["config"], dict)


def _lines(node, indent: str = "") -> list:
    """``Type(key=value, ...)`` per module, its child modules on indented lines below (a
    value that is not a module node is printed as JSON)."""
    if not _is_node(node):
        return [indent + _json(node)]
    own, kids = [], []
    for k, v in node["config"].items():
        if _is_node(v):
            kids.append(v)
        elif isinstance(v, list) and v and all(_is_node(x) for x in v):
            kids.extend(v)
        else:
            own.append(f"{safe(k)}={_json(v)}")
    lines = [f"{indent}{safe(node['type'])}({', '.join(own)})"]
    for kid in kids:
        lines.extend(_lines(kid, indent + "  "))
    return lines


def run(args) -> int:
    from ..training import checkpoint
    try:
        h = checkpoint.read_header(args.checkpoint)
        size = os.path.getsize(args.checkpoint)
    except (checkpoint.CheckpointError, OSError) as e:
        print(f"error: {safe(e)}", file=sys.stderr)
        return 2
    s = _summary(h)
    out = sys.stdout
    if args.json:
        json.dump(_finite(s), out, indent=1, allow_nan=False)
        out.write("\n")
        return 0
    print(f"checkpoint {safe(args.checkpoint)} ({s['format']}, {size / 1024:,.0f} KiB)", file=out)
    print(f"model      {safe(s['model'])}, {s['parameters']:,} parameters in "
          f"{len(s['tensors'])} tensors", file=out)
    if s["model_config"] is not None:
        print("config     " + "\n           ".join(_lines(s["model_config"])), file=out)
    else:
        print(f"config     none ({safe(s['model_config_error'] or 'written before configs')})",
              file=out)
    for name, (shape, dtype) in h["params"].items():
        print(f"  {safe(name):<24} {str(tuple(shape)):<16} {dtype}", file=out)
    _states(out, s["optimizer"], s["scheduler"])
    for k, v in s["metadata"].items():
        text = _json(v)
        print(f"metadata   {safe(k)}: {text if len(text) <= 100 else text[:97] + '...'}",
              file=out)
    return 0


def _states(out, opt, sch) -> None:
    """The optimizer's and scheduler's lines; any field of the wrong shape printed as JSON."""
    if opt is not None:
        groups = opt.get("param_groups")
        if isinstance(groups, list) and groups and all(isinstance(g, dict) for g in groups):
            opts = ", ".join(f"{safe(k)}={_show(v)}" for k, v in groups[0].items()
                             if k != "params")
            text = f"{len(groups)} group(s): {opts}"
        else:
            text = f"param_groups {_json(groups)}"
        print(f"optimizer  {_show(opt.get('type'))}, step {_show(opt.get('steps'))}, {text}",
              file=out)
    if sch is not None:
        print(f"scheduler  {_show(sch.get('type'))} {_show(sch.get('options'))}, step "
              f"{_show(sch.get('last_epoch'))}, last lr {_show(sch.get('last_lr'))}", file=out)

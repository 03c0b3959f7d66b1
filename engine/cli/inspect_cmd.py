"""``blasnet inspect CHECKPOINT``: what a checkpoint holds (the model's configuration, its
parameter count, the optimizer and schedule state, the metadata) without building anything."""
from __future__ import annotations

import json
import math
import os
import sys

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


def _is_node(v) -> bool:
    return isinstance(v, dict) and set(v) == {"type", "config"}


def _lines(node, indent: str = "") -> list:
    """``Type(key=value, ...)`` per module, its child modules on indented lines below."""
    own, kids = [], []
    for k, v in node["config"].items():
        if _is_node(v):
            kids.append(v)
        elif isinstance(v, list) and v and all(_is_node(x) for x in v):
            kids.extend(v)
        else:
            own.append(f"{k}={json.dumps(v)}")
    lines = [f"{indent}{node['type']}({', '.join(own)})"]
    for kid in kids:
        lines.extend(_lines(kid, indent + "  "))
    return lines


def run(args) -> int:
    from ..training import checkpoint
    try:
        h = checkpoint.read_header(args.checkpoint)
    except (checkpoint.CheckpointError, OSError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    s = _summary(h)
    out = sys.stdout
    if args.json:
        json.dump(s, out, indent=1)
        out.write("\n")
        return 0
    size = os.path.getsize(args.checkpoint)
    print(f"checkpoint {args.checkpoint} ({s['format']}, {size / 1024:,.0f} KiB)", file=out)
    print(f"model      {s['model']}, {s['parameters']:,} parameters in {len(s['tensors'])} "
          f"tensors", file=out)
    if s["model_config"] is not None:
        print("config     " + "\n           ".join(_lines(s["model_config"])), file=out)
    else:
        print(f"config     none ({s['model_config_error'] or 'written before configs'})",
              file=out)
    for name, (shape, dtype) in h["params"].items():
        print(f"  {name:<24} {str(tuple(shape)):<16} {dtype}", file=out)
    opt = s["optimizer"]
    if opt is not None:
        groups = opt.get("param_groups") or [{}]
        opts = ", ".join(f"{k}={v}" for k, v in groups[0].items() if k != "params")
        print(f"optimizer  {opt.get('type')}, step {opt.get('steps')}, {len(groups)} group(s): "
              f"{opts}", file=out)
    sch = s["scheduler"]
    if sch is not None:
        print(f"scheduler  {sch.get('type')} {sch.get('options')}, step {sch.get('last_epoch')}, "
              f"last lr {sch.get('last_lr')}", file=out)
    for k, v in s["metadata"].items():
        text = json.dumps(v)
        print(f"metadata   {k}: {text if len(text) <= 100 else text[:97] + '...'}", file=out)
    return 0

"""What `make bench` measures: the blocks, the shapes, and how to build one case.

A case is (block, shape). Each builds the engine module, its input, a target, the loss and
an AdamW optimizer, all float32 by default, from a fixed seed, so every run times the same
numbers. Engine imports are deferred so that this module loads before the engine does.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

BLOCKS = ("FFN-relu", "FFN-gelu", "GMLP", "FFNSublayer-post-gelu", "MLP")
# The blocks whose targets are stated at the seed and large shapes.
TRANSFORMER_BLOCKS = BLOCKS[:4]


@dataclass(frozen=True)
class Shape:
    name: str
    lead: tuple         # leading shape of the input: (N,) or (B, T)
    d_model: int = 0    # FFN/GMLP/sublayer width (d_in = d_hidden = d_out for GMLP)
    d_ff: int = 0       # inner width (d_ffn for GMLP)
    sizes: tuple = ()   # MLP layer sizes

    @property
    def rows(self) -> int:
        return int(np.prod(self.lead))

    def label(self) -> str:
        lead = "x".join(str(n) for n in self.lead)
        if self.sizes:
            return f"{self.name} ({lead}, {'-'.join(map(str, self.sizes))})"
        return f"{self.name} ({lead}, {self.d_model}, {self.d_ff})"


SHAPES = {
    "seed000": Shape("seed000", (8,), 200, 800),       # seed 000: 8 tokens
    "seed001": Shape("seed001", (4, 10), 512, 2048),   # seed 001: batch 4 x 10 tokens
    "large": Shape("large", (2048,), 512, 2048),
    "batch64": Shape("batch64", (64,), sizes=(784, 256, 128, 10)),  # seed 004's MLP
}

CASES = [(b, s) for b in TRANSFORMER_BLOCKS for s in ("seed000", "seed001", "large")]
CASES.append(("MLP", "batch64"))

# Small learning rate: thousands of timed steps must not drive the weights anywhere odd.
LR = 1e-4


def build_module(block: str, shape: Shape, dtype=np.float32, seed: int = 0):
    """The engine module of ``block`` at ``shape``."""
    if block.startswith("FFNSublayer"):
        from engine.blocks import FFNSublayer
        return FFNSublayer(shape.d_model, shape.d_ff, activation="gelu", dropout=0.0,
                           norm="post", dtype=dtype, rng=seed)
    if block.startswith("FFN"):
        from engine.blocks import FFN
        return FFN(shape.d_model, shape.d_ff, activation=block.split("-")[1], dropout=0.0,
                   dtype=dtype, rng=seed)
    if block == "GMLP":
        from engine.blocks import GMLP
        d = shape.d_model
        return GMLP(d, d, shape.d_ff, d, dtype=dtype, rng=seed)
    if block == "MLP":
        from engine.layers import MLP
        acts = ["relu"] * (len(shape.sizes) - 2) + [None]
        return MLP(list(shape.sizes), acts, dtype=dtype, rng=seed)
    raise ValueError(f"block: expected one of {BLOCKS}, got {block!r}")


def out_features(block: str, shape: Shape) -> int:
    return shape.sizes[-1] if block == "MLP" else shape.d_model


def in_features(block: str, shape: Shape) -> int:
    return shape.sizes[0] if block == "MLP" else shape.d_model


def make_data(block: str, shape: Shape, dtype=np.float32, seed: int = 1):
    """``(x, target, dy)``: the input, the loss target (class labels for the MLP) and an
    output gradient for the forward+backward timing."""
    rng = np.random.default_rng(seed)
    x = rng.standard_normal((*shape.lead, in_features(block, shape))).astype(dtype)
    out_shape = (*shape.lead, out_features(block, shape))
    dy = (0.01 * rng.standard_normal(out_shape)).astype(dtype)
    if block == "MLP":
        target = rng.integers(0, out_shape[-1], size=shape.rows)
    else:
        target = rng.standard_normal(out_shape).astype(dtype)
    return x, target, dy


def make_loss(block: str):
    if block == "MLP":
        from engine.losses import CrossEntropyLoss
        return CrossEntropyLoss()
    from engine.losses import MSELoss
    return MSELoss()


def make_optimizer(module):
    from engine.optim import AdamW
    return AdamW(module.parameters(), lr=LR)


def fwd_bwd_fn(module, x, dy):
    """One forward + backward (parameter gradients accumulate; nothing else)."""
    fwd, bwd = module.forward, module.backward

    def run():
        fwd(x)
        bwd(dy)
    return run


def step_fn(module, x, target, loss, opt):
    """One full training step: forward, loss, backward, AdamW step, zero_grad."""
    fwd, bwd, zero = module.forward, module.backward, module.zero_grad
    lfwd, lbwd, ostep = loss.forward, loss.backward, opt.step

    def run():
        lfwd(fwd(x), target)
        bwd(lbwd())
        ostep()
        zero()
    return run


def build_case(block: str, shape_name: str, dtype=np.float32, seed: int = 0):
    """Everything one case needs: a dict with module, x, target, dy, loss, opt, and the
    ``fwd_bwd`` and ``step`` callables."""
    shape = SHAPES[shape_name]
    module = build_module(block, shape, dtype, seed)
    x, target, dy = make_data(block, shape, dtype, seed + 1)
    loss = make_loss(block)
    opt = make_optimizer(module)
    return dict(shape=shape, module=module, x=x, target=target, dy=dy, loss=loss, opt=opt,
                fwd_bwd=fwd_bwd_fn(module, x, dy), step=step_fn(module, x, target, loss, opt))


def write_json(obj, path=None) -> None:
    """``obj`` as indented JSON into ``path``, or onto stdout when ``path`` is None (how the
    bench's helper processes hand their results to run.py)."""
    import json
    import sys
    text = json.dumps(obj, indent=1)
    if path:
        with open(path, "w") as f:
            f.write(text)
    else:
        sys.stdout.write(text + "\n")

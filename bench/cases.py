"""What `make bench` measures: the blocks, the shapes, and how to build one case.

A case is (block, shape). Each builds the engine module, its input, a target, the loss and an
AdamW optimizer, all float32 by default, from a fixed seed, so every run times the same
numbers. Its training step is the one ``engine.fit`` runs (``step_fn``), with the
input gradient computed: a block inside a network (fit leaves it out for the model's first
layer, whose input is data: ``backward(dy, input_grad=False)``). The blocks,
their modules, naive twins and GEMM lists come from the block registry (``engine.models.registry``:
each entry's ``bench`` rows); a bench block is a registry entry plus its options and loss.
Engine imports are deferred so that this module loads before the engine does.
"""
from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np


@dataclass(frozen=True)
class BenchBlock:
    """A benched block: its registry entry (``engine.models.registry``), the options it is built
    with, and the loss its training step uses ("mse" or "cross_entropy")."""
    kind: str
    options: dict = field(default_factory=dict)
    loss: str = "mse"


class Shape:
    """A named size: ``lead``, the leading shape of the input ((N,) or (B, T)), and ``dims``,
    the sizes the registry's blocks read (``d_model``/``d_ff``, GMLP's optional ``d_in``/
    ``d_out``, or ``sizes`` for the MLP); ``note`` says where the shape comes from (legend)."""

    def __init__(self, name: str, lead: tuple, note: str = "", **dims):
        self.name, self.lead, self.dims, self.note = name, tuple(lead), dict(dims), note

    @property
    def rows(self) -> int:
        return int(np.prod(self.lead))

    # The widths vs_torch's PyTorch modules read.
    d_model = property(lambda self: self.dims.get("d_model", 0))
    d_ff = property(lambda self: self.dims.get("d_ff", 0))
    sizes = property(lambda self: tuple(self.dims.get("sizes", ())))

    def legend(self) -> str:
        """"8 rows, d_model 200, d_ff 800", and the note in parentheses when there is one."""
        lead = "x".join(str(n) for n in self.lead)
        dims = ", ".join(f"{k} {list(v) if isinstance(v, tuple) else v}"
                         for k, v in self.dims.items())
        return f"{lead} rows, {dims}" + (f" ({self.note})" if self.note else "")

    def __repr__(self) -> str:
        return f"Shape({self.name!r}, {self.lead}, {self.dims})"


SHAPES = {
    "seed000": Shape("seed000", (8,), d_model=200, d_ff=800),       # seed 000: 8 tokens
    "seed001": Shape("seed001", (4, 10), d_model=512, d_ff=2048),   # seed 001: batch 4 x 10
    "large": Shape("large", (2048,), d_model=512, d_ff=2048),
    "batch64": Shape("batch64", (64,), sizes=(784, 256, 128, 10)),  # seed 004's MLP
    # `make run`'s model (engine/cli/app.py): gMLP 16 -> 128 -> 512 -> 4, 1024 samples, full batch
    "run": Shape("run", (1024,), note="make run's model", d_in=16, d_model=128, d_ff=512,
                 d_out=4),
}

# The shapes a benched block runs at, each that has all its sizes (the transformer blocks:
# d_model/d_ff; the MLP: sizes), group by group; then make run's gMLP at its own shape.
GRID = (("seed000", "seed001", "large"), ("batch64",))
EXTRA_CASES = (("GMLP", "run"),)


def _bench_blocks() -> dict:
    """Bench name -> block, from the registry: each entry's ``bench`` rows (the report's row
    labels), for the entries that run at a shape of GRID."""
    from engine.models import registry
    out = {}
    for e in registry.BLOCKS.values():
        if any(set(e.dims) <= set(SHAPES[s].dims) for group in GRID for s in group):
            out.update({row: BenchBlock(e.name, dict(opts), e.loss)
                        for row, opts in (e.bench or {}).items()})
    return out


def _fits(block: BenchBlock, shape: str) -> bool:
    from engine.models import registry
    return set(registry.get(block.kind).dims) <= set(SHAPES[shape].dims)


def _cases() -> list:
    blocks = _bench_blocks()
    cases = [(b, s) for group in GRID for b, blk in blocks.items() for s in group
             if _fits(blk, s)]
    return cases + [c for c in EXTRA_CASES if c[0] in blocks]


def __getattr__(name):
    """The block lists, read from the registry when asked (a block registered after this
    module was imported is benched too): BENCH_BLOCKS (name -> BenchBlock), BLOCKS (the
    names), TRANSFORMER_BLOCKS (those at the seed and large shapes, whose targets are stated
    there), CASES ((block, shape) pairs) and SMALL_CASES (those bound by per-call overhead
    rather than by their GEMMs)."""
    if name == "BENCH_BLOCKS":
        return _bench_blocks()
    if name == "BLOCKS":
        return tuple(_bench_blocks())
    if name == "TRANSFORMER_BLOCKS":
        return tuple(b for b, blk in _bench_blocks().items() if _fits(blk, "large"))
    if name == "CASES":
        return _cases()
    if name == "SMALL_CASES":
        return [c for c in _cases() if c[1] != "large"]
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


# Small learning rate: thousands of timed steps must not drive the weights anywhere odd.
LR = 1e-4


def bench_block(block: str) -> BenchBlock:
    blocks = _bench_blocks()
    try:
        return blocks[block]
    except KeyError:
        raise ValueError(f"block: expected one of {tuple(blocks)}, got {block!r}") from None


def entry(block: str):
    """The registry entry of a benched block."""
    from engine.models import registry
    return registry.get(bench_block(block).kind)


def build_module(block: str, shape: Shape, dtype=np.float32, seed: int = 0):
    """The engine module of ``block`` at ``shape``."""
    return entry(block).build(shape.dims, dtype=dtype, rng=seed, **bench_block(block).options)


def naive_twin(block: str, module, lr: float = LR):
    """The naive twin (engine.models.naive) of a module built by ``build_module``: the baseline
    of the "x naive" columns."""
    b = bench_block(block)
    return entry(block).twin(module, lr=lr, loss=b.loss, **b.options)


def gemm_list(block: str, shape: Shape) -> list:
    """The GEMMs of one forward + backward of ``block`` at ``shape`` (the registry's list)."""
    return entry(block).gemms(shape.rows, shape.dims, **bench_block(block).options)


def out_features(block: str, shape: Shape) -> int:
    return entry(block).d_out(shape.dims)


def in_features(block: str, shape: Shape) -> int:
    return entry(block).d_in(shape.dims)


def make_data(block: str, shape: Shape, dtype=np.float32, seed: int = 1):
    """``(x, target, dy)``: the input, the loss target (class labels for cross-entropy) and
    an output gradient for the forward+backward timing."""
    rng = np.random.default_rng(seed)
    x = rng.standard_normal((*shape.lead, in_features(block, shape))).astype(dtype)
    out_shape = (*shape.lead, out_features(block, shape))
    dy = (0.01 * rng.standard_normal(out_shape)).astype(dtype)
    if bench_block(block).loss == "cross_entropy":
        target = rng.integers(0, out_shape[-1], size=shape.rows)
    else:
        target = rng.standard_normal(out_shape).astype(dtype)
    return x, target, dy


def make_loss(block: str):
    from engine.nn import losses
    cls = {"mse": losses.MSELoss, "cross_entropy": losses.CrossEntropyLoss}
    return cls[bench_block(block).loss]()


def make_optimizer(module):
    from engine.optim import AdamW
    return AdamW(module.parameters(), lr=LR)


def fwd_bwd_fn(module, x, dy, input_grad: bool = True):
    """One forward + backward (parameter gradients accumulate; nothing else); with
    ``input_grad=False`` the backward leaves out the input gradient (x is data)."""
    fwd, bwd = module.forward, module.backward

    def run():
        fwd(x)
        bwd(dy, input_grad=input_grad)
    return run


def step_fn(module, x, target, loss, opt, input_grad: bool = True):
    """One full training step as ``engine.fit`` runs it when the optimizer updates
    exactly the model's parameters: forward, loss forward, loss backward, backward (with the
    input gradient, which fit leaves out for its model's first layer: ``input_grad=False``
    is fit's step itself), and the AdamW step with the gradients zeroed inside its pass
    (``opt.step(zero_grad=True)``)."""
    fwd, bwd = module.forward, module.backward
    lfwd, lbwd, ostep = loss.forward, loss.backward, opt.step

    def run():
        lfwd(fwd(x), target)
        bwd(lbwd(), input_grad=input_grad)
        ostep(zero_grad=True)  # the call fit makes
    return run


def build_case(block: str, shape, dtype=np.float32, seed: int = 0, input_grad: bool = True):
    """Everything one case needs: a dict with module, x, target, dy, loss, opt, and the
    ``fwd_bwd`` and ``step`` callables (with the input gradient unless ``input_grad=False``).
    ``shape``: a name in SHAPES or a Shape."""
    shape = SHAPES[shape] if isinstance(shape, str) else shape
    module = build_module(block, shape, dtype, seed)
    x, target, dy = make_data(block, shape, dtype, seed + 1)
    loss = make_loss(block)
    opt = make_optimizer(module)
    return dict(shape=shape, module=module, x=x, target=target, dy=dy, loss=loss, opt=opt,
                fwd_bwd=fwd_bwd_fn(module, x, dy, input_grad),
                step=step_fn(module, x, target, loss, opt, input_grad))


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


def child_env(threads: int, quick: bool) -> dict:
    """The environment of a bench child process: ``threads`` set before it imports anything
    (BLASNET_NUM_THREADS is read at import, OpenBLAS's own variables removed so that it
    wins), the bench's quick mode, and the repository on its import path."""
    import os
    from pathlib import Path
    root = str(Path(__file__).resolve().parents[1])
    env = {k: v for k, v in os.environ.items()
           if k not in ("OPENBLAS_NUM_THREADS", "OMP_NUM_THREADS", "BLASNET_BENCH_QUICK")}
    env["BLASNET_NUM_THREADS"] = str(threads)
    if quick:
        env["BLASNET_BENCH_QUICK"] = "1"
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [root, env.get("PYTHONPATH")]))
    return env


def run_child(cmd, threads: int, quick: bool, label: str, echo=print):
    """Run ``cmd`` (a bench child process) in the repository with ``child_env(threads,
    quick)``, its output captured; echo one line with its exit status and duration. Returns
    the ``subprocess.CompletedProcess``."""
    import subprocess
    import time
    from pathlib import Path
    t0 = time.perf_counter()
    proc = subprocess.run(cmd, cwd=Path(__file__).resolve().parents[1],
                          env=child_env(threads, quick), capture_output=True, text=True)
    echo(f"  [{label}] exit {proc.returncode} after {time.perf_counter() - t0:.0f} s")
    return proc

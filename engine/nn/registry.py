"""The block registry's table and the ``@register_block`` declaration a block class carries.

A block declares everything the rest of the project needs about it in its own file:

- ``@register_block(...)`` on the class: its sizes (``dims``), options, an example, the
  variants the tests cover, its naive twin (a ``"module:Class"`` path, resolved on use, so
  engine/nn never imports engine/models), and whether the CLI offers it and bench times it;
- ``gemm_list(self, lead)``, next to ``_forward``: the GEMMs of one forward + backward on an
  input of leading shape ``lead`` ((N,) rows or (B, T) sequences);
- ``torch_layout``: the PyTorch reference module's state-dict names (engine/interop.py).

Registering happens when the class is defined (engine/__init__ imports every block), so the
CLI, bench, interop and the tests (tests/models/test_registry.py) pick a new block up with no
edit elsewhere; ``engine.models.registry`` is the same table under its public name.

A GEMM is ``(M, N, K, trans_a, trans_b, beta)`` in the row-major terms of
``kernels.ops.gemm``: out (M, N) = op(a) (M, K) @ op(b) (K, N) + beta out, where beta is what
the product means (1.0: accumulates into a gradient; 0.0: a fresh product, even when the
module pre-fills the output with a bias and adds into it).
"""
from __future__ import annotations

import importlib
import inspect
from dataclasses import dataclass, field
from typing import Callable

import numpy as np

__all__ = ["Block", "BLOCKS", "register", "register_block", "unregister", "get", "names",
           "linear_gemms", "model_width"]


def model_width(dims) -> int:
    """The input and output width of a block that keeps its width: ``dims["d_model"]``."""
    return dims["d_model"]


def _resolve(ref):
    """A twin class given as itself or as ``"package.module:Class"`` (imported on use)."""
    if not isinstance(ref, str):
        return ref
    module, _, name = ref.partition(":")
    return getattr(importlib.import_module(module), name)


@dataclass(frozen=True, kw_only=True)
class Block:
    """One block kind. ``build(dims, dtype=, rng=, **options)`` -> the engine module;
    ``naive`` -> the twin class (``naive(params, lr=, weight_decay=, loss=, **options)``);
    ``gemms(rows, dims, **options)`` -> the GEMMs of one forward + backward;
    ``d_in(dims)`` / ``d_out(dims)`` -> feature widths of input and output.
    ``dims``: the size keys ``build`` requires; ``options``: the keyword options and their
    defaults (what ``build`` and the twin both accept); ``example``: small sizes with every
    width distinct (tests: a transposed GEMM cannot pass for another) and ``variants``:
    option sets the tests cover. ``cli``: ``(name, help)`` when ``blasnet train --model name``
    offers it; ``bench``: bench row name -> options (timed at every bench shape that has its
    sizes); ``loss``: "mse" or "cross_entropy", what its bench step and twin train with."""

    name: str
    doc: str
    build_fn: Callable
    twin_ref: object
    gemm_fn: Callable
    d_in: Callable
    d_out: Callable
    dims: tuple
    options: dict = field(default_factory=dict)
    example: dict = field(default_factory=dict)
    variants: tuple = ({},)
    cls: type = None
    cli: tuple = None
    bench: dict = None
    loss: str = "mse"

    @property
    def naive(self) -> type:
        """The naive twin class (engine/models/naive*.py, or the block's own)."""
        return _resolve(self.twin_ref)

    @property
    def keeps_width(self) -> bool:
        """True when input and output are ``d_model`` wide (no ``d_in``/``d_out`` of its own):
        the CLI puts it between Linear maps from and to the task's widths."""
        return self.d_in is model_width and self.d_out is model_width

    def _options(self, options) -> dict:
        unknown = sorted(set(options) - set(self.options))
        if unknown:
            raise TypeError(f"{self.name}: unknown options {unknown}; expected some of "
                            f"{sorted(self.options)}")
        return {**self.options, **options}

    def _check_dims(self, dims) -> None:
        missing = [k for k in self.dims if k not in dims]
        if missing:
            raise ValueError(f"dims: {self.name} needs sizes {list(self.dims)}, missing "
                             f"{missing} in {dict(dims)}")

    def build(self, dims, *, dtype=np.float32, rng=None, **options):
        """The engine module of this kind at sizes ``dims``."""
        self._check_dims(dims)
        return self.build_fn(dims, dtype=dtype, rng=rng, **self._options(options))

    def twin(self, module, *, lr: float = 1e-3, weight_decay: float = 1e-2, loss: str = "mse",
             **options):
        """The naive twin of ``module`` (built by ``build`` with the same ``options``): its
        parameters copied by name, AdamW(lr, weight_decay) and ``loss`` for ``step``."""
        params = {n: p.data for n, p in module.named_parameters()}
        return self.naive(params, lr=lr, weight_decay=weight_decay, loss=loss,
                          **self._options(options))

    def gemms(self, rows: int, dims, **options) -> list:
        """The GEMMs of one forward + backward over ``rows`` rows, forward first (sequence
        blocks: ``rows // dims["seq_len"]`` sequences of ``seq_len``)."""
        self._check_dims(dims)
        return self.gemm_fn(int(rows), dims, **self._options(options))


BLOCKS: dict = {}


def register(block: Block) -> Block:
    if not isinstance(block, Block):
        raise TypeError(f"register: expected a Block, got {type(block).__name__}")
    if block.name in BLOCKS:
        raise ValueError(f"register: a block named {block.name!r} is already registered")
    cli = [b.cli[0] for b in BLOCKS.values() if b.cli]
    if block.cli and block.cli[0] in cli:
        raise ValueError(f"register: {block.name}: the CLI name {block.cli[0]!r} is taken")
    rows = [r for b in BLOCKS.values() for r in (b.bench or ())]
    taken = sorted(set(block.bench or ()) & set(rows))
    if taken:
        raise ValueError(f"register: {block.name}: bench rows {taken} are taken")
    BLOCKS[block.name] = block
    return block


def unregister(name: str) -> Block:
    """Remove the entry ``name`` (and return it); ValueError when there is none."""
    entry = get(name)
    del BLOCKS[name]
    return entry


def get(name: str) -> Block:
    try:
        return BLOCKS[name]
    except KeyError:
        raise ValueError(f"block: expected one of {names()}, got {name!r}") from None


def names() -> tuple:
    return tuple(BLOCKS)


# ----------------------------------------------------------------------------- declaration
def _default_build(cls):
    """``cls(**sizes, dtype=, rng=, **options)``, with the sizes of ``dims`` its constructor
    takes by name (``seq_len`` of an attention block sizes only its input)."""
    takes = set(inspect.signature(cls.__init__).parameters) - {"self"}

    def build(dims, *, dtype, rng, **options):
        return cls(**{k: v for k, v in dims.items() if k in takes}, dtype=dtype, rng=rng,
                   **options)
    return build


def _lead(rows: int, dims) -> tuple:
    t = dims.get("seq_len")
    return (rows,) if t is None else (rows // t, t)


def _gemm_fn(build):
    """The GEMM list of a module built at ``dims`` (its own ``gemm_list``, so the list is
    stated once, beside the ``ops.gemm`` calls it lists)."""
    def gemms(rows, dims, **options):
        return build(dims, dtype=np.float32, rng=0, **options).gemm_list(_lead(rows, dims))
    return gemms


def _check_declaration(cls, name, dims, options, example, variants, loss) -> None:
    where = f"register_block({name})"
    if not callable(getattr(cls, "gemm_list", None)):
        raise TypeError(f"{where}: {cls.__name__} has no gemm_list(self, lead) method (the "
                        f"GEMMs of one forward + backward)")
    if not dims or any(k not in example for k in dims):
        raise ValueError(f"{where}: expected an example with every size of dims {dims}, "
                         f"got {example}")
    bad = [v for v in variants if not set(v) <= set(options)]
    if not variants or bad:
        raise ValueError(f"{where}: variants {bad} use options not in {sorted(options)}")
    if loss not in ("mse", "cross_entropy"):
        raise ValueError(f"{where}: loss: expected 'mse' or 'cross_entropy', got {loss!r}")


def register_block(*, doc: str, twin, dims: tuple, example: dict, options=None,
                   variants: tuple = ({},), build=None, d_in=model_width, d_out=model_width,
                   cli: tuple = None, bench: dict = None, loss: str = "mse", name: str = None):
    """Class decorator: register the decorated block class (see ``Block`` for the fields).
    ``build`` defaults to the constructor called with the sizes it takes by name, ``d_in`` /
    ``d_out`` to ``d_model``, ``bench`` to one row named after the block with its defaults
    (``{}`` to leave it out), ``name`` to the class's name."""
    def declare(cls):
        n = name or cls.__name__
        opts, bench_rows = dict(options or {}), {n: {}} if bench is None else dict(bench)
        _check_declaration(cls, n, tuple(dims), opts, dict(example), tuple(variants), loss)
        make = build or _default_build(cls)
        register(Block(name=n, doc=doc, build_fn=make, twin_ref=twin, gemm_fn=_gemm_fn(make),
                       d_in=d_in, d_out=d_out, dims=tuple(dims), options=opts,
                       example=dict(example), variants=tuple(variants), cls=cls, cli=cli,
                       bench=bench_rows, loss=loss))
        return cls
    return declare


def linear_gemms(n: int, d_in: int, d_out: int, dx: bool = True):
    """(forward, backward) GEMMs of y = x W: y (n, d_out) = x @ W; dW (d_in, d_out) += x^T dy;
    dx (n, d_in) = dy W^T (when the input gradient is computed)."""
    fwd = [(n, d_out, d_in, False, False, 0.0)]
    bwd = [(d_in, d_out, n, True, False, 1.0)]
    if dx:
        bwd.append((n, d_in, d_out, False, True, 0.0))
    return fwd, bwd

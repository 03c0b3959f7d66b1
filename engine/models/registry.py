"""The block registry: one entry per block kind, read by bench, the CLI, interop's tests and
the registry tests.

Each block class declares its own entry where it is defined (``@register_block`` in
engine/nn/registry.py, its ``gemm_list`` beside its ``_forward``), and registers when its
module is imported: importing this module imports them all. Adding a block is its file plus
its export; ``tests/models/test_registry.py`` walks every entry (complete, twin agrees with
the module in float64, GEMM list = the GEMMs the module runs).

Sizes are a dict ``dims`` whose keys each entry names (``Block.dims``): ``d_model``/``d_ff``
for the transformer blocks (GMLP also reads optional ``d_in``/``d_out``), ``seq_len`` for the
blocks that mix the tokens of a sequence, ``sizes`` for the MLP.
"""
from __future__ import annotations

from .. import nn  # noqa: F401  (imports every block of engine/nn: each registers itself)
from ..nn.registry import (BLOCKS, Block, get, linear_gemms, model_width, names, register,
                           register_block, unregister)

__all__ = ["Block", "BLOCKS", "register", "register_block", "unregister", "get", "names",
           "linear_gemms", "model_width"]

"""blasnet engine: modules with parameters, gradients and work buffers; optimizers; training.

Numerics are delegated to ``kernels``; this package is bookkeeping.
"""
from .module import Module, Parameter, Workspace

# --- layers (engine/layers.py) ---
# --- blocks (engine/blocks.py) ---
# --- losses (engine/losses.py) ---
# --- optim (engine/optim.py) ---
# --- training (engine/train.py, engine/checkpoint.py) ---

"""blasnet engine: modules with parameters, gradients and work buffers; optimizers; training.

Numerics are delegated to ``kernels``; this package is bookkeeping.
"""
from .module import Module, Parameter, Workspace

# --- layers (engine/layers.py) ---
from .layers import (GELU, MLP, Identity, LeakyReLU, Linear, ReLU, Sequential, Sigmoid, SiLU,
                     Tanh)
# --- blocks (engine/blocks.py) ---
from .blocks import FFN, GMLP, AddNorm, Dropout, FFNSublayer, LayerNorm
# --- losses (engine/losses.py) ---
from .losses import CrossEntropyLoss, MSELoss
# --- optim (engine/optim.py) ---
from .optim import SGD, AdamW, Optimizer, clip_grad_norm
# --- training (engine/train.py, engine/checkpoint.py) ---
from . import data
from .checkpoint import CheckpointError, load, save
from .train import History, NonFiniteLossError, evaluate, fit, predict

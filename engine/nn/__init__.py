"""Modules: the module protocol (Parameter, arena, Workspace), layers, norms, the blocks,
embedding and losses, in the spirit of ``torch.nn``. Importing a block's file registers it
(engine/nn/registry.py)."""
from .module import Arena, Module, Parameter, Workspace
from .layers import (GELU, Activation, Identity, LeakyReLU, Linear, LogSoftmax, ReLU,
                     Sigmoid, SiLU, Softmax, Tanh)
from .containers import MLP, Sequential
from .blocks import FFN, AddNorm, Dropout, FFNSublayer, LayerNorm
from .channel_gated_mlp import GMLP, ChannelGatedMLP
from .gated import GatedFFN
from .gmlp_block import GMLPBlock, SpatialGatingUnit, SpatialGMLPBlock
from .embedding import Embedding
from .losses import CrossEntropyLoss, MSELoss
from .attention import MultiHeadAttention
from .transformer import TransformerBlock

"""blasnet engine: modules with parameters, gradients and work buffers; optimizers; training.

Numerics are delegated to ``kernels``; this package is bookkeeping.
"""
from ._names import import_kernels as _import_kernels

_import_kernels()  # before any module of engine imports it: another 'kernels' is named here

from .nn.module import Module, Parameter, Workspace

# --- modules (engine/nn/) ---
from .nn.layers import GELU, Identity, LeakyReLU, Linear, ReLU, Sigmoid, SiLU, Tanh
from .nn.containers import MLP, Sequential
from .nn.blocks import FFN, AddNorm, Dropout, FFNSublayer, LayerNorm
from .nn.channel_gated_mlp import GMLP, ChannelGatedMLP
from .nn.losses import CrossEntropyLoss, MSELoss
# --- optimizers and schedules (engine/optim/) ---
from .optim import SGD, AdamW, Optimizer, clip_grad_norm
from .optim import lr_scheduler
# --- data, training, callbacks, checkpoints (engine/data.py, engine/training/) ---
from . import data
from .training.checkpoint import CheckpointError, load, save
from .training.load_model import LoadedModel, load_model
from .training.loop import History, NonFiniteLossError, evaluate, fit, predict
from .training.callbacks import Callback, EarlyStopping, ModelCheckpoint
from . import distributed  # registers fit's MPI ranks (MPI itself loads on first use)
# --- PyTorch state dicts (engine/interop.py) ---
from .interop import load_torch_state_dict, to_torch_state_dict

# --- version: the installed distribution's metadata is the one source ---
try:
    from importlib.metadata import PackageNotFoundError as _NotFound
    from importlib.metadata import version as _dist_version
    __version__ = _dist_version("blasnet")
except _NotFound:  # a source tree that was never installed
    __version__ = "0+unknown"

# --- gated FFN, gMLP block, embedding, row-wise layers (engine/nn/), the model zoo
# (engine/models/) and the character LM as it is trained (engine/training/lm.py) ---
from .nn.layers import LogSoftmax, Softmax
from .nn.gated import GatedFFN
from .nn.gmlp_block import GMLPBlock, SpatialGatingUnit, SpatialGMLPBlock
from .nn.embedding import Embedding
from . import models
from .training import lm

# --- attention, the transformer block and the GPT (engine/nn/, engine/models/) ---
from .nn.attention import MultiHeadAttention
from .nn.transformer import TransformerBlock
from .models.gpt import GPT
from .models.sampling import generate

"""blasnet engine: modules with parameters, gradients and work buffers; optimizers; training.

Numerics are delegated to ``kernels``; this package is bookkeeping.
"""
import os as _os
import sys as _sys

from ._names import import_kernels as _import_kernels

# sys.argv[0] is "-m" while `python -m engine` imports this package, the script's path for
# the console script.
if _sys.argv[:1] == ["-m"] or _os.path.basename((_sys.argv or [""])[0]) in ("blasnet",
                                                                            "blasnet.exe"):
    # Run as `python -m engine` or `blasnet`: a bad BLASNET_NUM_THREADS (read when kernels is
    # imported) is a one-line usage error with exit status 2, not an import traceback.
    try:
        _import_kernels()
    except ValueError as _e:
        print(f"blasnet: error: {_e}", file=_sys.stderr)
        raise SystemExit(2) from None

_import_kernels()  # before any module of engine imports it: another 'kernels' is named here

from .nn.module import Module, Parameter, Workspace

# --- modules (engine/nn/) ---
from .nn.layers import (GELU, MLP, Identity, LeakyReLU, Linear, ReLU, Sequential, Sigmoid, SiLU,
                        Tanh)
from .nn.blocks import FFN, GMLP, AddNorm, ChannelGatedMLP, Dropout, FFNSublayer, LayerNorm
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
# --- PyTorch state dicts (engine/interop.py) ---
from .interop import load_torch_state_dict, to_torch_state_dict

# --- version: the installed distribution's metadata is the one source ---
try:
    from importlib.metadata import PackageNotFoundError as _NotFound
    from importlib.metadata import version as _dist_version
    __version__ = _dist_version("blasnet")
except _NotFound:  # a source tree that was never installed
    __version__ = "0+unknown"

# --- gated FFN, gMLP block, embedding, row-wise layers (engine/nn/), the model zoo and the
# character LM (engine/models/) ---
from .nn.layers import LogSoftmax, Softmax
from .nn.gated import GatedFFN
from .nn.gmlp_block import GMLPBlock, SpatialGatingUnit, SpatialGMLPBlock
from .nn.embedding import Embedding
from . import models
from .models import lm

# --- attention, the transformer block and the GPT (engine/nn/, engine/models/) ---
from .nn.attention import MultiHeadAttention
from .nn.transformer import TransformerBlock
from .models.gpt import GPT
from .models.sampling import generate

# --- module paths from before the sub-packages: the same module objects under their old names,
# so `import engine.train`, `from engine import checkpoint` and monkeypatching through an old
# path all reach the one module ---
_MOVED = {
    "module": "nn.module", "layers": "nn.layers", "blocks": "nn.blocks", "gated": "nn.gated",
    "gmlp_block": "nn.gmlp_block", "embedding": "nn.embedding", "losses": "nn.losses",
    "lr_scheduler": "optim.lr_scheduler", "train": "training.loop",
    "callbacks": "training.callbacks", "checkpoint": "training.checkpoint",
    "registry": "models.registry", "naive": "models.naive", "lm": "models.lm",
}


def _alias_moved_modules() -> None:
    import importlib
    for old, new in _MOVED.items():
        mod = importlib.import_module(f"{__name__}.{new}")
        _sys.modules[f"{__name__}.{old}"] = mod
        globals()[old] = mod


_alias_moved_modules()

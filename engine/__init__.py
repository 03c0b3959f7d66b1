"""blasnet engine: modules with parameters, gradients and work buffers; optimizers; training.

Numerics are delegated to ``kernels``; this package is bookkeeping.
"""
import os as _os
import sys as _sys

# sys.argv[0] is "-m" while `python -m engine` imports this package, the script's path for
# the console script.
if _sys.argv[:1] == ["-m"] or _os.path.basename((_sys.argv or [""])[0]) in ("blasnet",
                                                                            "blasnet.exe"):
    # Run as `python -m engine` or `blasnet`: a bad BLASNET_NUM_THREADS (read when kernels is
    # imported) is a one-line usage error with exit status 2, not an import traceback.
    try:
        import kernels as _kernels  # noqa: F401
    except ValueError as _e:
        print(f"blasnet: error: {_e}", file=_sys.stderr)
        raise SystemExit(2) from None

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
# --- schedules, callbacks, interop (engine/lr_scheduler.py, callbacks.py, interop.py) ---
from . import lr_scheduler
from .callbacks import Callback, EarlyStopping, ModelCheckpoint
from .interop import load_torch_state_dict, to_torch_state_dict

# --- version: the installed distribution's metadata is the one source ---
try:
    from importlib.metadata import PackageNotFoundError as _NotFound
    from importlib.metadata import version as _dist_version
    __version__ = _dist_version("blasnet")
except _NotFound:  # a source tree that was never installed
    __version__ = "0+unknown"

# --- gated FFN, gMLP block, embedding, row-wise layers, the character LM (engine/gated.py,
# gmlp_block.py, embedding.py, layers.py, lm.py) ---
from .layers import LogSoftmax, Softmax
from .gated import GatedFFN
from .gmlp_block import GMLPBlock, SpatialGatingUnit
from .embedding import Embedding
from . import lm

"""The training loop (fit, evaluate, predict, History), callbacks and checkpoints."""
from .loop import (History, NonFiniteLossError, TrainingInterrupted, evaluate, fit,
                   mean_absolute_error, predict, r2_score)
from .callbacks import Callback, EarlyStopping, ModelCheckpoint
from .checkpoint import CheckpointError, load, save
from .load_model import LoadedModel, load_model

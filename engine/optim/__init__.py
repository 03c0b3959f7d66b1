"""Optimizers, gradient clipping and learning-rate schedules, in the spirit of ``torch.optim``."""
from .optimizers import (SGD, AdamW, Optimizer, check_optimizer_of, clip_grad_norm,
                         defer_keyboard_interrupt)
from . import lr_scheduler

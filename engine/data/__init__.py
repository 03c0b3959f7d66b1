"""Data: your own files, the synthetic tasks, preprocessing (see engine/data/files.py)."""
from .files import *  # noqa: F401,F403
from .files import REGRESSION_OUTPUTS, __all__  # noqa: F401

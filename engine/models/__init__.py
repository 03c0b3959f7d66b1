"""The model zoo: the block registry, the blocks' naive twins and the character language model."""
from . import naive, registry

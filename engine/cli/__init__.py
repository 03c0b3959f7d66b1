"""The ``blasnet`` command line."""
from .app import build_parser, main

"""Data: your own (``load`` of ``.npz`` and ``.csv`` files, ``train_val_split``, the
``Standardizer``) and the synthetic tasks for examples, tests and ``python -m engine train``.

Every function returns ``(X, Y)`` as C-contiguous arrays of the requested float dtype;
classification targets are int64 labels. Same ``rng`` seed, same data.

files.py reads .npz files and calls csv_reader.py for CSV; synthetic.py makes the example
tasks; preprocessing.py splits and standardises.
"""
from .csv_reader import csv_columns
from .files import load, load_inputs
from .preprocessing import Standardizer, infer_task, train_val_split
from .synthetic import (REGRESSION_OUTPUTS, TASKS, make_task, regression, regression_targets,
                        sine, spiral, xor)

__all__ = ["load", "load_inputs", "csv_columns", "train_val_split", "Standardizer", "infer_task",
           "regression", "regression_targets", "spiral", "xor", "sine", "TASKS", "make_task"]

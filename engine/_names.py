"""The top-level names ``engine`` and ``kernels`` are generic: another distribution may
provide one of them (Hugging Face's ``kernels`` on PyPI does). Checked when engine is
imported: blasnet's ``kernels`` must be the one beside this package, and must be blasnet's,
else an ImportError names the file that shadows it and how to fix it."""
from __future__ import annotations

import importlib
import importlib.util
import os
import sys

_OURS = ("set_num_threads", "gemm", "reference", "bias_act_forward")  # what engine needs


def _beside() -> str:
    """Where blasnet's kernels lives: beside this package (one install, one directory)."""
    return os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "kernels")


def _providers() -> list:
    """The installed distributions that provide a top-level ``kernels``."""
    try:
        from importlib.metadata import packages_distributions
        return sorted(set(packages_distributions().get("kernels", [])))
    except Exception:  # noqa: BLE001  (a broken metadata entry must not hide the real error)
        return []


def _fix() -> str:
    others = [d for d in _providers() if d.lower() != "blasnet"]
    who = (f" (installed by the distribution{'s' if len(others) > 1 else ''} "
           f"{', '.join(others)})" if others else "")
    return (f"another package named 'kernels'{who} shadows blasnet's. "
            f"Hugging Face's 'kernels' package on PyPI has this name. Fix: use a separate "
            f"virtual environment for it, or `pip uninstall kernels` and then "
            f"`pip install --force-reinstall blasnet`; or remove its directory from "
            f"PYTHONPATH / sys.path")


def import_kernels():
    """blasnet's ``kernels`` module, imported; ImportError if the name resolves to another
    package's files."""
    expected = _beside()
    mod = sys.modules.get("kernels")
    origin = getattr(mod, "__file__", None) if mod is not None else None
    if mod is None:
        spec = importlib.util.find_spec("kernels")
        if spec is None:
            raise ImportError(f"blasnet: its 'kernels' package is missing (expected at "
                              f"{expected}); reinstall blasnet")
        origin = spec.origin
    where = os.path.dirname(os.path.abspath(origin)) if origin else None
    if where is None or os.path.normcase(where) != os.path.normcase(expected):
        raise ImportError(f"blasnet: 'kernels' is imported from {origin or 'a namespace package'}"
                          f", not from {expected}: " + _fix())
    try:
        mod = importlib.import_module("kernels")
    except ModuleNotFoundError as e:  # blasnet's own kernels, missing a dependency
        raise ImportError(f"blasnet: a required package is not installed: {e.name!r} (imported "
                          f"by {origin}); install it (`pip install {e.name}`) or reinstall "
                          f"blasnet with its dependencies") from e
    except Exception as e:  # noqa: BLE001  (blasnet's own files, failing in their own way)
        raise ImportError(f"blasnet: its 'kernels' at {origin} failed to import "
                          f"({type(e).__name__}: {e})") from e
    missing = [n for n in _OURS if not hasattr(mod, n)]
    if missing:
        raise ImportError(f"blasnet: 'kernels' at {origin} is not blasnet's (it has no "
                          f"{', '.join(missing)}): " + _fix())
    return mod

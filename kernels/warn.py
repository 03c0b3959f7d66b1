"""``warn``: a warning reported at the user's line, the first frame outside blasnet's packages
(engine/, kernels/) and the import machinery, however deep inside them it is raised. A
hand-counted ``stacklevel`` is wrong as soon as a call moves one frame deeper (Python 3.12's
``skip_file_prefixes`` does this; the engine supports 3.10 and 3.11 too)."""
from __future__ import annotations

import importlib
import os
import sys
import warnings

__all__ = ["warn"]

_HERE = os.path.dirname(os.path.abspath(__file__))
# engine/ and kernels/ are siblings in one source tree or site-packages
_SKIP = tuple(os.path.join(os.path.dirname(_HERE), name) + os.sep for name in ("engine",
                                                                            "kernels"))
_IMPORTLIB = os.path.dirname(importlib.__file__) + os.sep


def _internal(filename: str) -> bool:
    if filename.startswith("<"):  # "<frozen importlib._bootstrap>", "<stdin>", "<string>"
        return filename.startswith("<frozen importlib")
    return os.path.abspath(filename).startswith(_SKIP + (_IMPORTLIB,))


def warn(message: str, category: type = UserWarning) -> None:
    """``warnings.warn(message, category)`` attributed to the first caller outside engine/,
    kernels/ and importlib (the outermost frame if there is none), so filters by module and
    the once-per-location registry work on the user's line."""
    frame = sys._getframe(1)
    while frame.f_back is not None and _internal(frame.f_code.co_filename):
        frame = frame.f_back
    g = frame.f_globals
    # No module_globals: as warnings.warn, the source line is read from the file by name (a
    # loader's get_source fails for `python -c`'s __main__).
    warnings.warn_explicit(message, category, frame.f_code.co_filename, frame.f_lineno,
                           module=g.get("__name__", "<string>"),
                           registry=g.setdefault("__warningregistry__", {}))

"""The one way blasnet compiles an elementwise kernel: ``@jit`` (numba, nopython).

Every compiled kernel takes the same options, so that all of them vectorise, release the GIL
and keep NaN/inf semantics:

- ``nogil=True``: the engine's pool (kernels.parallel) runs row slices on several threads;
- ``error_model="numpy"``: the default "python" model puts a zero-division branch in every
  division, which stops LLVM's vectoriser;
- ``cache=True``: compiled lazily, once per kernel and argument types, on first call, and
  kept on disk beside the source (numba falls back to a per-user cache directory,
  ``$NUMBA_CACHE_DIR`` or ``~/.cache/numba``, when the install is read-only);
- ``fastmath=FASTMATH``: contraction into FMA, approximate functions and reciprocals only;
  never "nnan"/"ninf" (relu of NaN, a NaN loss, LayerNorm's rescue path rely on NaN and inf
  propagating) and never "reassoc" (a reduction's order, and so its result, must not depend
  on the vector width or on how the work is split).

``NUMBA_DISABLE_JIT=1`` in the environment runs the same kernels as plain Python (slow; for
debugging with pdb or prints). Factories that close over a function defeat numba's disk
cache (the captured function is part of the key): generate source instead.
"""
from __future__ import annotations

import numba

__all__ = ["jit", "FASTMATH", "OPTIONS", "disabled"]

FASTMATH = frozenset({"contract", "afn", "arcp"})
OPTIONS = {"nopython": True, "nogil": True, "cache": True, "error_model": "numpy",
           "fastmath": set(FASTMATH)}


def disabled() -> bool:
    """True when ``NUMBA_DISABLE_JIT`` makes every kernel run as Python."""
    return bool(numba.config.DISABLE_JIT)


def jit(fn=None, **overrides):
    """Compile ``fn`` with blasnet's options (``OPTIONS``); usable as ``@jit`` or
    ``@jit(inline="always")`` for helpers inlined into their callers. An override of
    ``fastmath``, ``error_model``, ``nogil`` or ``parallel`` is refused: those settings are
    what every kernel's correctness and threading rely on."""
    for key in ("fastmath", "error_model", "nogil", "parallel", "nopython"):
        if key in overrides:
            raise ValueError(f"jit: {key!r} is fixed for blasnet kernels (kernels.jit.OPTIONS), "
                             f"got {key}={overrides[key]!r}")
    options = dict(OPTIONS, fastmath=set(FASTMATH), **overrides)

    def wrap(f):
        return numba.jit(**options)(f)

    return wrap if fn is None else wrap(fn)

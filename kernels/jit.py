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

One option is per kernel: ``slp=True`` compiles a kernel with LLVM's SLP vectoriser, which
numba leaves off (it miscompiled other code). It is for the kernels whose hot loops are the
fixed lanes of kernels.lanes: it packs the eight independent accumulators into vector
registers, 1.5-1.8x faster row sums, without reordering any sum. Such a kernel compiles
without "contract": packing separates a lane's multiply from its add, so with contraction
some lanes would round once (FMA) and some twice, depending on the vector width; without
it every operation rounds as written and the bits cannot depend on the packing (tested
against a compile without SLP).

``NUMBA_DISABLE_JIT=1`` in the environment runs the same kernels as plain Python (slow; for
debugging with pdb or prints). Factories that close over a function defeat numba's disk
cache (the captured function is part of the key): generate source instead.

The disk cache is keyed on more than numba's own key. numba reuses a cached kernel while its
own file is unchanged (modification time and size) and its bytecode is the same, so an edit
to a helper it inlines from another file (``kernels.fmath``'s approximations, the lanes of
``kernels.lanes``) or to the options here would leave it running the old machine code. So
every kernel's cache entry also carries a hash of the sources (``source_fingerprint``) of
this package and of the kernel's own package: an edit to any of them recompiles the kernels
that could depend on it, once.
"""
from __future__ import annotations

import hashlib
import os

import numba
from numba.core import config as _numba_config
from numba.core.compiler_lock import global_compiler_lock

__all__ = ["jit", "FASTMATH", "OPTIONS", "SLP_KERNELS", "disabled", "source_fingerprint"]

FASTMATH = frozenset({"contract", "afn", "arcp"})
OPTIONS = {"nopython": True, "nogil": True, "cache": True, "error_model": "numpy",
           "fastmath": set(FASTMATH)}

SLP_KERNELS: list = []   # the dispatchers made with jit(slp=True), for their tests


def disabled() -> bool:
    """True when ``NUMBA_DISABLE_JIT`` makes every kernel run as Python."""
    return bool(numba.config.DISABLE_JIT)


def jit(fn=None, *, slp=False, **overrides):
    """Compile ``fn`` with blasnet's options (``OPTIONS``); usable as ``@jit`` or
    ``@jit(inline="always")`` for helpers inlined into their callers, ``@jit(slp=True)`` for
    a kernel compiled with LLVM's SLP vectoriser (see the module's doc). An override of
    ``fastmath``, ``error_model``, ``nogil`` or ``parallel`` is refused: those settings are
    what every kernel's correctness and threading rely on."""
    if not isinstance(slp, bool):
        raise TypeError(f"jit: slp must be a bool, got {type(slp).__name__}")
    for key in ("fastmath", "error_model", "nogil", "parallel", "nopython"):
        if key in overrides:
            raise ValueError(f"jit: {key!r} is fixed for blasnet kernels (kernels.jit.OPTIONS), "
                             f"got {key}={overrides[key]!r}")
    fastmath = FASTMATH - {"contract"} if slp else FASTMATH
    options = dict(OPTIONS, fastmath=set(fastmath), **overrides)

    def wrap(f):
        d = numba.jit(**options)(f)
        if options["cache"] and not disabled():
            _key_cache_on_sources(d)
        if slp and not disabled():
            _compile_with_slp(d)
            SLP_KERNELS.append(d)
        return d

    return wrap if fn is None else wrap(fn)


def _compile_with_slp(dispatcher):
    """Make every compile of ``dispatcher`` (not a load from the disk cache) run LLVM's SLP
    vectoriser. numba's pass builder reads the setting from its config on each compile, and
    compiles hold one global lock, so the switch is seen by this compile alone."""
    plain = dispatcher.compile

    def compile(sig):
        with global_compiler_lock:
            before = _numba_config.SLP_VECTORIZE
            _numba_config.SLP_VECTORIZE = True
            try:
                return plain(sig)
            finally:
                _numba_config.SLP_VECTORIZE = before

    dispatcher.compile = compile


_HERE = os.path.dirname(os.path.abspath(__file__))
_fingerprints: dict = {}


def source_fingerprint(folder: str) -> str:
    """sha256 of the names and contents of the ``.py`` files directly in ``folder`` (read
    once per process and folder); "" where the folder or a file cannot be read."""
    folder = os.path.abspath(folder)
    found = _fingerprints.get(folder)
    if found is None:
        h = hashlib.sha256()
        try:
            for name in sorted(os.listdir(folder)):
                if name.endswith(".py"):
                    with open(os.path.join(folder, name), "rb") as f:
                        data = f.read()
                    h.update(f"{name}\0{len(data)}\0".encode())
                    h.update(data)
            found = h.hexdigest()
        except OSError:  # a folder that cannot be listed or read: numba's own rule alone
            found = ""
        _fingerprints[folder] = found
    return found


def _key_cache_on_sources(dispatcher):
    """Add the fingerprints of this package and of the kernel's own package to the freshness
    stamp of ``dispatcher``'s cache index: numba treats an index whose stamp differs as empty,
    recompiles, and overwrites it. (Where a numba has no such index, its own rule stays.)"""
    index = getattr(getattr(dispatcher, "_cache", None), "_cache_file", None)
    if index is None or not hasattr(index, "_source_stamp"):
        return
    folders = {_HERE, os.path.dirname(os.path.abspath(dispatcher.py_func.__code__.co_filename))}
    index._source_stamp = (index._source_stamp,
                           tuple(source_fingerprint(d) for d in sorted(folders)))

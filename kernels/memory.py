"""Cache-line-aligned buffers: ``aligned_empty``, the per-thread ``scratch`` allocator of
every kernel, and the shared read-only ``ones`` and ``constant`` arrays BLAS calls read.

NumPy's own buffers start 16 bytes past a 64-byte boundary, and an array-array ufunc writing
to such an ``out`` splits its AVX-512 stores over two cache lines (up to 2x slower:
docs/performance.md, "Aligned buffers"), so every scratch and work buffer of blasnet comes
from here.
"""
from __future__ import annotations

import math
import threading

import numpy as np

__all__ = ["ALIGN", "aligned_empty", "scratch", "bundle", "ones", "constant"]

ALIGN = 64  # bytes: one cache line, one AVX-512 register


def aligned_empty(shape, dtype=np.float32) -> np.ndarray:
    """An uninitialised C-contiguous array of ``shape`` whose data starts on a 64-byte
    boundary (a view into a slightly larger allocation; a zero-size array has no data and
    keeps whatever pointer NumPy gives it)."""
    dtype = np.dtype(dtype)
    shape = (shape,) if isinstance(shape, (int, np.integer)) else tuple(shape)
    size = math.prod(shape)
    raw = np.empty(size + ALIGN // dtype.itemsize, dtype)
    start = (-raw.ctypes.data % ALIGN) // dtype.itemsize
    return raw[start:start + size].reshape(shape)


_tls = threading.local()
_VIEWS_MAX = 64  # cached views per thread before the cache is cleared (varying batch sizes)


def scratch(key, shape, dtype=np.float32) -> np.ndarray:
    """The calling thread's scratch array ``key`` as a C-contiguous ``shape`` view on a
    64-byte boundary: allocated on first use, grown (never shrunk) when a larger one is
    asked for, the same memory afterwards, so a steady loop allocates nothing. Contents
    are undefined. Keys are per kernel ("layernorm.a", ...): two live buffers need two; a
    pass split over threads takes one per slot on the calling thread, ``("optim.a", slot)``
    (kernels.parallel.split). A repeated request returns the same view object (one dict
    lookup: cheap enough for the hot path)."""
    try:
        views = _tls.views
    except AttributeError:
        views = _tls.views = {}
        _tls.bufs = {}
        _tls.bundles = {}
    try:
        view = views.get((key, shape, dtype))
    except TypeError:  # an unhashable shape (a list): normalised below
        view = None
    if view is not None:
        return view
    dt = np.dtype(dtype)
    shp = (shape,) if isinstance(shape, (int, np.integer)) else tuple(shape)
    size = math.prod(shp)
    bufs = _tls.bufs
    buf = bufs.get((key, dt.char))
    if buf is None or buf.size < size:
        buf = bufs[(key, dt.char)] = aligned_empty(size, dt)
        for k in [k for k in views if k[0] == key]:  # views of the old buffer
            del views[k]
        _tls.bundles = {}  # bundles may hold views of the old buffer
    view = buf[:size].reshape(shp)
    if len(views) >= _VIEWS_MAX:
        views.clear()
    try:
        views[(key, shape, dtype)] = view
    except TypeError:
        pass
    return view


def bundle(key, make, *args):
    """``make(*args)`` built once on the calling thread for ``key`` and returned again while
    no scratch buffer of this thread has grown since (a growth rebuilds it, so it never
    holds views of a replaced buffer). For kernels that take several scratch views and
    constants per call: one lookup instead of one per view. ``key`` must determine what
    ``make(*args)`` builds (e.g. ("layernorm", dtype, d))."""
    try:
        bundles = _tls.bundles
    except AttributeError:
        _tls.views, _tls.bufs = {}, {}
        bundles = _tls.bundles = {}
    value = bundles.get(key)
    if value is None:
        value = make(*args)
        bundles = _tls.bundles  # make() may have grown a buffer (a new dict)
        if len(bundles) >= _VIEWS_MAX:
            bundles.clear()
        bundles[key] = value
    return value


_ones: dict = {}       # dtype -> read-only ones vector shared by all threads, grown on demand
_ones_views: dict = {}  # (n, dtype) -> the view ``ones`` returns


def ones(n: int, dtype=np.float32) -> np.ndarray:
    """A read-only (n,) vector of ones of ``dtype`` (a view of one shared, 64-byte-aligned
    buffer per dtype): the right-hand side of BLAS row and column sums."""
    view = _ones_views.get((n, dtype))
    if view is not None:
        return view
    dt = np.dtype(dtype)
    buf = _ones.get(dt)
    if buf is None or buf.size < n:
        buf = aligned_empty(max(n, 1024), dt)
        buf.fill(1)
        buf.flags.writeable = False
        _ones[dt] = buf  # a racing thread may build its own: both hold only ones
    if len(_ones_views) >= _VIEWS_MAX:
        _ones_views.clear()
    view = _ones_views[(n, dtype)] = buf[:n]  # old buffers stay valid: views keep them
    return view


_constants: dict = {}


def constant(key, make) -> np.ndarray:
    """The read-only array ``make()`` built once for ``key`` (a hashable naming what it holds,
    e.g. ("losses.offsets", rows, c)) and shared by all threads afterwards."""
    arr = _constants.get(key)
    if arr is None:
        arr = make()
        arr.flags.writeable = False
        arr = _constants.setdefault(key, arr)
    return arr

"""The module protocol: ``Parameter``, the flat parameter ``Arena``, ``Workspace`` and ``Module``.

Every layer, block, stack and loss is a ``Module``. The base class owns what they share: the
input and ``dy`` checks, the rule "one backward per forward", the overlap check (an input that
shares memory with the module's own work buffers is rejected), and the fused options of the
protocol (``forward(x, residual=r)``, ``backward(dy, dx_acc=a)``). A model's parameters are
views into one contiguous 64-byte-aligned buffer and their gradients into another (llm.c's
``params_memory`` / ``grads_memory``), so optimizers, ``zero_grad`` and reductions work on two
flat vectors. Numerics live in ``kernels``.
"""
from __future__ import annotations

import contextlib
import functools
import threading
from collections import OrderedDict
from types import SimpleNamespace

import numpy as np

from kernels import ops

from .._checks import check_array_like, check_dtype, check_positive_int
from .._checks import check_real as check_float
from .arena import (BUFFER_OWNERS, LAYOUT_VERSION, Arena, Parameter, Workspace, adjacent_views,
                    arena_layout_version, bump_arena_layout, runs, shaped_like)
from .calls import SKIP_DX, CallState, check_input_grad, takes_input_grad
from .init_args import init_arguments
from .rows import (INITS, as_rows, check_array, check_init, check_sequences, describes_input, flat3,
                   init_weight, input_spec, make_rng, rows_of, shaped)

__all__ = ["SKIP_DX", "check_input_grad", "takes_input_grad", "Parameter", "Arena",
           "adjacent_views", "arena_layout_version", "mode_version", "rows_of", "shaped",
           "shaped_like", "Module", "Workspace", "make_rng", "check_dtype", "check_positive_int",
           "check_float", "as_rows", "INITS", "check_init", "init_weight", "check_sequences",
           "runs", "describes_input", "input_spec"]


_MODE_VERSION = [0]  # bumped by every train()/eval() call


def mode_version() -> int:
    """Changes whenever any module's train()/eval() is called: a cache of modes read at
    one version is current while this returns the same number."""
    return _MODE_VERSION[0]


# ----------------------------------------------------------------------------- Module
def _one_caller(fn):
    """Wrap a public ``forward``/``backward``: a module holds one forward's cache, so a call
    while another thread is inside the same module raises instead of mixing their numbers."""
    @functools.wraps(fn)
    def call(self, *args, **kwargs):
        lock = self._lock
        if not lock.acquire(False):
            raise RuntimeError(f"{type(self).__name__}.{fn.__name__}: this module is in use by "
                               f"another thread; a model is used by one thread at a time "
                               f"(build one model per thread)")
        try:
            return fn(self, *args, **kwargs)
        finally:
            lock.release()
    return call


class _ModuleMeta(type):
    def __init__(cls, name, bases, ns):
        super().__init__(name, bases, ns)
        for meth in ("forward", "backward"):
            if meth in ns:
                setattr(cls, meth, _one_caller(ns[meth]))

    def __call__(cls, *args, **kwargs):
        obj = super().__call__(*args, **kwargs)
        obj._pack()  # every parameter of the finished module into one arena per dtype
        return obj


class Module(metaclass=_ModuleMeta):
    """Base class of every layer, block, stack and loss.

    Subclasses set ``Parameter`` and ``Module`` attributes (registered in assignment order,
    which fixes the order of ``named_parameters`` and of the arena) and implement
    ``_forward(x2, residual2)`` / ``_backward(dy2, dx_acc2)`` on 2-D row views. The public
    ``forward``/``backward`` check their arguments, reject inputs that overlap the module's
    own buffers, and keep one backward per forward. Outputs are views of work buffers: valid
    until the next call of the same method; copy them to keep them.

    Class attributes a subclass may set: ``fuses_residual`` / ``fuses_dx_acc`` (its
    ``_forward``/``_backward`` honour the options themselves; otherwise the base class adds),
    ``acc_alias_safe`` (its fused ``dx_acc`` may be ``dy`` itself), ``skips_input_grad``
    (its ``_backward`` takes ``acc2 is SKIP_DX`` to mean: leave out the input gradient; the
    value it returns is then ignored), ``config_attrs`` (see ``get_config``).

    Shared with subclasses, in any file (the underscore keeps them off the public API):
    ``_ws`` (the work pool), ``_views``/``_make_views`` (buffer views per batch shape),
    ``_saved`` (what forward keeps for backward), ``_calls`` (call-order state), the checks
    ``_dy_rows``, ``_no_forward`` and ``_no_overlap``, ``_set_plain``, ``_set_adjacent`` and
    ``_params_moved``.
    """

    fuses_residual = False
    fuses_dx_acc = False
    acc_alias_safe = False
    skips_input_grad = False
    in_features = None   # last input dimension (None: any)
    config_attrs = {}    # __init__ argument -> the attribute get_config reads, if not its name

    def __init__(self, dtype=np.float32):
        # The machinery's own attributes go straight into __dict__: __setattr__ needs _params
        # to exist, and registers what these are not.
        dtype = check_dtype(dtype)
        self.__dict__.update(
            _params=OrderedDict(), _modules=OrderedDict(), training=True, dtype=dtype,
            _ws=Workspace(dtype), _calls=CallState(), _built=False,
            _view_cache=[None, None],  # (key, views) of _views
            _lock=threading.RLock(),   # see _one_caller
            # What forward keeps for backward (input rows, activations, dropout flag): a
            # plain namespace, since Module.__setattr__ is a Python call on the hot path.
            _saved=SimpleNamespace())

    def __setattr__(self, name, value):
        params = self.__dict__.get("_params")
        if params is None:
            raise AttributeError("Module.__init__() must be called before assigning attributes")
        if isinstance(value, Parameter):
            if not value.name:
                value.name = name
            params[name] = value
            self._modules.pop(name, None)
        elif isinstance(value, Module):
            self._modules[name] = value
            params.pop(name, None)
        elif name in params or name in self._modules:
            params.pop(name, None)
            self._modules.pop(name, None)
        object.__setattr__(self, name, value)  # the store itself (a property's setter runs)
        if self._built and isinstance(value, (Parameter, Module)):
            bump_arena_layout()
            self._pack()

    def _set_plain(self, name: str, value) -> None:
        """Set an attribute the module machinery keeps (mode, build state, work pool, views
        derived from parameters) without ``__setattr__``'s registration and its cost."""
        self.__dict__[name] = value

    def _set_adjacent(self, names: tuple, params, what: str, shape=None) -> None:
        """Set ``names`` (data, grad) to the arena's views of ``params`` back to back
        (``adjacent_views``), reshaped to ``shape`` when given: the one weight a fused GEMM
        reads and its gradient, no copy. Called from ``_params_moved``."""
        data, grad = adjacent_views(params, what)
        if shape is not None:
            data, grad = data.reshape(shape), grad.reshape(shape)
        self._set_plain(names[0], data)
        self._set_plain(names[1], grad)

    # -- the protocol ---------------------------------------------------------------------
    def check_input(self, x, name: str = "x") -> tuple:
        """The output shape for input ``x``, or the TypeError/ValueError ``forward`` would
        raise for it, without running anything (``fit`` checks a whole data set with it
        before the first step). This default: float rows (N, d) or (B, T, d) of the module's
        dtype with d == ``in_features``. A module whose ``forward`` takes other input says so
        by overriding this too."""
        if not isinstance(x, np.ndarray):
            raise TypeError(f"{name}: expected a numpy.ndarray, got {type(x).__name__}")
        if x.dtype != self.dtype:
            raise TypeError(f"{name}: expected dtype {self.dtype} (the model's), got {x.dtype} "
                            f"(convert with .astype(np.{self.dtype}))")
        d = self.in_features
        if x.ndim not in (2, 3) or (d is not None and x.shape[-1] != d):
            want = "(N, d) or (B, T, d)" if d is None else f"(N, {d}) or (B, T, {d})"
            raise ValueError(f"{name}: expected shape {want}, got {x.shape}")
        return (*x.shape[:-1], self.out_features(x.shape[-1]))

    def out_features(self, d_in: int) -> int:
        """The last output dimension for inputs of last dimension ``d_in``."""
        return d_in

    def forward(self, x, *, residual=None):
        """``y = f(x)`` (``+ residual`` when given, an array of y's shape and dtype) for ``x``
        of shape ``(N, d)`` or ``(B, T, d)``; returns a view of a work buffer."""
        x2, lead = as_rows(x, self.in_features, self.dtype, "x")
        self._no_overlap("x", x)
        s = self._calls
        s.ready = False
        if residual is None:
            y2 = self._forward(x2, None)
        else:
            res2 = rows_of(residual, (*lead, self.out_features(x2.shape[1])), self.dtype,
                            "residual")
            self._no_overlap("residual", residual)
            if self.fuses_residual:
                y2 = self._forward(x2, res2)
            else:
                y = self._forward(x2, None)
                y2 = self._ws.get("residual_out", *y.shape)  # (N, d_out) f(x) + residual
                ops.add(y2, y, res2)
        s.lead, s.out_shape, s.in_dim, s.ready = lead, (*lead, y2.shape[1]), x2.shape[1], True
        return x if y2 is x2 else shaped(y2, lead)

    def backward(self, dy, *, dx_acc=None, input_grad=True):
        """The input gradient for output gradient ``dy`` (the last forward's output shape);
        parameter gradients are added into ``p.grad``. With ``dx_acc`` (an array of the
        input's shape) the input gradient is added into it and ``dx_acc`` is returned.
        With ``input_grad=False`` (the input is data, as an input without ``requires_grad``
        in PyTorch) only the parameter gradients are computed, the same ones, and None is
        returned; a layer whose input gradient is a GEMM of its own leaves that GEMM out."""
        s = self._calls
        input_grad = check_input_grad(input_grad, dx_acc)
        if not s.ready:
            raise self._no_forward()
        lead = s.lead
        dy2 = self._dy_rows(dy, s.out_shape)
        if not input_grad:
            self._backward(dy2, SKIP_DX if self.skips_input_grad else None)
            s.ready = False
            return None
        if dx_acc is None:
            dx2 = self._backward(dy2, None)
        else:
            acc2 = rows_of(dx_acc, (*lead, s.in_dim), self.dtype, "dx_acc")
            self._no_overlap("dx_acc", dx_acc)
            if self.fuses_dx_acc and (self.acc_alias_safe or not np.may_share_memory(acc2, dy2)):
                dx2 = self._backward(dy2, acc2)
            else:
                d = self._backward(dy2, None)
                dx2 = ops.add(acc2, acc2, d)
        s.ready = False
        if dx_acc is not None:
            return dx_acc
        return dy if dx2 is dy2 else shaped(dx2, lead)

    def __call__(self, *args, **kwargs):
        return self.forward(*args, **kwargs)

    def _views(self, key):
        """``_make_views(key)``, redone only when ``key`` (the batch shape) changes: slicing
        the work buffers costs about a microsecond per view."""
        c = self._view_cache
        if c[0] != key:
            c[1] = self._make_views(key)
            c[0] = key
        return c[1]

    def _start_forward(self, x2, p: float = 0.0):
        """``(n, views, dropped)`` for a ``_forward`` over the rows ``x2``, kept for backward
        with whether dropout of probability ``p`` runs (training and p > 0)."""
        n = x2.shape[0]
        v = self._views(n)
        self._saved.x = x2
        self._saved.dropped = dropped = self.training and p > 0.0
        return n, v, dropped

    def _start_backward(self, dy2, acc2):
        """``(n, views, dx)`` for a ``_backward``: ``dx`` is ``acc2`` when given, else ``v.dx``."""
        v = self._views(dy2.shape[0])
        return dy2.shape[0], v, (v.dx if acc2 is None else acc2)

    def _make_views(self, key):  # pragma: no cover - abstract
        raise NotImplementedError

    def _forward(self, x2, res2):  # pragma: no cover - abstract
        raise NotImplementedError(f"{type(self).__name__}._forward")

    def _backward(self, dy2, acc2):  # pragma: no cover - abstract
        raise NotImplementedError(f"{type(self).__name__}._backward")

    # -- shared checks ------------------------------------------------------------------------
    def _no_forward(self) -> RuntimeError:
        # As PyTorch without retain_graph: a forward allows one backward.
        return RuntimeError(f"{type(self).__name__}.backward: no forward pass to differentiate "
                            f"(call forward before backward; each forward allows one backward)")

    def _dy_rows(self, dy, shape, name: str = "dy"):
        """Check ``dy`` against the last forward's output ``shape``; return it as rows."""
        if not isinstance(dy, np.ndarray) or dy.shape != shape or dy.dtype != self.dtype \
                or not dy.flags.c_contiguous:
            check_array(name, dy, self.dtype)
            if dy.shape != shape:
                raise ValueError(f"{name}: expected shape {shape} (the output of the last "
                                 f"forward), got {dy.shape}")
            raise ValueError(f"{name}: expected a C-contiguous array, got strides {dy.strides}")
        self._no_overlap(name, dy)
        return flat3(dy) if dy.ndim == 3 else dy

    def _workspace_ids(self):
        s = self._calls
        s.ws_ids = frozenset(id(w) for _, m in self.named_modules() for w in m._workspaces())
        s.ws_gen = LAYOUT_VERSION[0]
        return s.ws_ids

    def _workspaces(self) -> list:
        """The work-buffer pools of this module itself (not its children)."""
        return [self._ws]

    def use_workspace(self, ws: Workspace) -> None:
        """Take work buffers from ``ws`` from now on (e.g. one pool shared by modules whose
        forward-to-backward lifetimes never overlap, as in a checkpointed stack). The next
        forward recomputes its buffer views; no forward may be waiting for its backward."""
        if not isinstance(ws, Workspace) or ws.dtype != self.dtype:
            raise TypeError(f"ws: expected a Workspace of dtype {self.dtype}, got {ws!r}")
        self._set_plain("_ws", ws)
        self._view_cache[0] = None
        bump_arena_layout()  # overlap checks re-read which buffers belong to whom

    def _no_overlap(self, name: str, a) -> None:
        """Reject ``a`` if it shares memory with a work buffer of this module or a child:
        BLAS and the kernels would read what they overwrite, or backward would read a cache
        that a later forward rewrote."""
        base = a.base
        if base is None:  # an array owning its memory is no view of a work buffer
            return
        hit = BUFFER_OWNERS.get(id(base))  # inline (a hot path): what buffer_owner() does
        if hit is not None and hit[0]() is base:
            s = self._calls
            ids = s.ws_ids if s.ws_gen == LAYOUT_VERSION[0] else self._workspace_ids()
            if id(hit[1]()) not in ids:
                return
        elif isinstance(base, np.ndarray) and base.flags.owndata:
            return  # a view of another allocation (work buffers own theirs)
        else:  # a view of memory NumPy does not own: compare against every buffer
            if not any(np.may_share_memory(a, b) for _, m in self.named_modules()
                       for w in m._workspaces() for b in w.buffers()):
                return
        raise ValueError(f"{name}: overlaps a work buffer of this {type(self).__name__} (its "
                         f"own output or cache, reused by its next call); pass a copy "
                         f"({name}.copy())")

    # -- parameters -----------------------------------------------------------------------
    def named_parameters(self, prefix: str = ""):
        """``(dotted_name, Parameter)`` pairs: own parameters first, then each child's, in
        registration order. A parameter shared by two children is listed once."""
        out, seen = [], set()
        self._collect(prefix, out, seen)
        return out

    def _collect(self, prefix, out, seen):
        for name, p in self._params.items():
            if p is not None and id(p) not in seen:
                seen.add(id(p))
                out.append((prefix + name, p))
        for name, m in self._modules.items():
            m._collect(prefix + name + ".", out, seen)

    def parameters(self):
        return [p for _, p in self.named_parameters()]

    def named_modules(self, prefix: str = ""):
        """``(dotted_name, Module)`` pairs, this module first (named ``prefix``)."""
        yield prefix, self
        for name, m in self._modules.items():
            yield from m.named_modules(f"{prefix}.{name}" if prefix else name)

    def children(self):
        return list(self._modules.values())

    def num_parameters(self) -> int:
        return sum(p.size for p in self.parameters())

    def _pack(self) -> None:
        """Move every parameter of this module (children included) into one arena per dtype,
        in ``named_parameters`` order, then let each module re-derive views it keeps."""
        self._set_plain("_built", True)
        params = self.parameters()
        for dt in {p.dtype for p in params}:
            Arena([p for p in params if p.dtype == dt])
        for _, m in self.named_modules():
            m._params_moved()

    def _params_moved(self) -> None:
        """Called after this module's parameters moved to a new arena (override to refresh
        views derived from them)."""

    def _range(self):
        """``(arena, lo, hi)``: this module's parameters, one contiguous range of one arena
        (packed anew if they are not: e.g. after a child was given to another parent)."""
        s = self._calls
        if s.range_gen != LAYOUT_VERSION[0]:
            params = self.parameters()
            if not params:
                s.range = None
            else:
                r = runs(params)
                if len(r) != 1 or len({p.dtype for p in params}) != 1:
                    if len({p.dtype for p in params}) != 1:
                        raise RuntimeError(f"{type(self).__name__}: parameters of more than one "
                                           f"dtype have no single flat vector")
                    self._pack()
                    r = runs(params)
                s.range = r[0][:3]
            s.range_gen = LAYOUT_VERSION[0]
        return s.range

    def flat_params(self) -> np.ndarray:
        """All parameters of this module as one 1-D view (no copy) of its arena, in
        ``named_parameters`` order."""
        r = self._range()
        if r is None:
            return np.empty(0, self.dtype)
        return r[0].data[r[1]:r[2]]

    def flat_grads(self) -> np.ndarray:
        """All parameter gradients as one 1-D view of the arena (same layout as flat_params)."""
        r = self._range()
        if r is None:
            return np.empty(0, self.dtype)
        return r[0].grad[r[1]:r[2]]

    def zero_grad(self) -> None:
        """Set every parameter gradient to zero: one fill of the gradient arena."""
        r = self._range()
        if r is not None:
            r[0].grad[r[1]:r[2]].fill(0.0)

    # -- modes ------------------------------------------------------------------------------
    def train(self, mode: bool = True):
        _MODE_VERSION[0] += 1  # lets a checkpointed Sequential skip re-reading unchanged modes
        self._set_plain("training", bool(mode))
        for m in self._modules.values():
            m.train(mode)
        return self

    def eval(self):
        return self.train(False)

    @contextlib.contextmanager
    def exclusive(self, what: str):
        """Hold this module's lock for a whole run of calls (fit, evaluate, predict): a
        concurrent call from another thread raises RuntimeError naming ``what`` before it
        switches the mode under the running loop."""
        lock = self._lock
        if not lock.acquire(False):
            raise RuntimeError(f"{what}: the model is in use by another thread; a model is used "
                               f"by one thread at a time (build one model per thread)")
        try:
            yield
        finally:
            lock.release()

    # -- state --------------------------------------------------------------------------------
    def state_dict(self) -> "OrderedDict[str, np.ndarray]":
        """Parameter name -> a copy of its data (C-ordered)."""
        return OrderedDict((n, np.array(p.data, order="C", copy=True))
                           for n, p in self.named_parameters())

    def load_state_dict(self, state) -> None:
        """Copy ``state`` into the parameters. Strict: the names must match exactly and every
        shape and dtype must agree; if any check fails nothing is changed."""
        if not hasattr(state, "keys"):
            raise TypeError(f"state: expected a mapping of name -> array, got {type(state).__name__}")
        named = self.named_parameters()
        own = {n for n, _ in named}
        missing = [n for n, _ in named if n not in state]
        unexpected = [k for k in state.keys() if k not in own]
        if missing or unexpected:
            raise KeyError(f"load_state_dict: missing keys {missing}, unexpected keys {unexpected}")
        for n, p in named:
            check_array_like(f"load_state_dict: {n}", state[n], p.data)
        for n, p in named:
            p.data[...] = state[n]

    def named_generators(self):
        """``(dotted name, numpy Generator)`` of every module in this tree that draws random
        numbers while training (dropout keeps its Generator as ``_rng``), this module first.
        Modules built from one Generator share it: a checkpoint of a run saves each once."""
        return [(n, m.__dict__["_rng"]) for n, m in self.named_modules()
                if isinstance(m.__dict__.get("_rng"), np.random.Generator)]

    def workspace_nbytes(self) -> int:
        """Bytes held in work buffers (cached activations and gradients), children included;
        a pool shared by several modules counts once."""
        pools = {id(w): w for _, m in self.named_modules() for w in m._workspaces()}
        return sum(w.nbytes() for w in pools.values())

    # -- configuration ------------------------------------------------------------------------
    def get_config(self) -> dict:
        """The keyword arguments that rebuild this module with ``type(self)(**config)``: each
        argument of ``__init__`` but ``rng``, read from the attribute of its name (or the one
        ``config_attrs`` names); dtypes by name, child modules as modules. Not the weights (a
        checkpoint holds them). NotImplementedError naming an argument it cannot read back."""
        return init_arguments(self)

    # -- display --------------------------------------------------------------------------------
    def extra_repr(self) -> str:
        return ""

    def __repr__(self) -> str:
        own = ", ".join(f"{n}={tuple(p.shape)}" for n, p in self._params.items() if p is not None)
        head = type(self).__name__ + "(" + ", ".join(s for s in (self.extra_repr(), own) if s)
        if not self._modules:
            return head + ")"
        lines = [head]
        for name, m in self._modules.items():
            child = repr(m).replace("\n", "\n  ")
            lines.append(f"  ({name}): {child}")
        return "\n".join(lines) + "\n)" + f"  # {self.num_parameters():,} parameters"

"""Containers: ``Sequential`` (children in order, optional activation checkpointing) and
``MLP`` (a Sequential of Linear layers)."""
from __future__ import annotations

import numpy as np

from kernels import overlap
from kernels.activations import ACTIVATIONS

from .._checks import check_bool
from .layers import ROWWISE_ACTIVATIONS, Activation, Identity, Linear, RowwiseActivation
from .module import (Module, Workspace, arena_layout_version, check_float, check_init,
                     check_input_grad, check_positive_int, input_spec, make_rng, mode_version,
                     rows_of, takes_input_grad)
from .registry import linear_gemms, register_block

__all__ = ["Sequential", "MLP", "BackwardHooks"]


# ----------------------------------------------------------------------------- hooks
class BackwardHooks:
    """Listeners a container calls during its backward, ``hook(child)``, as soon as the
    gradients of ``child``'s parameters are complete for this backward (a data-parallel
    reducer starts that bucket's reduction then, as PyTorch DDP's gradient buckets do)."""

    backward_hooks = ()  # the listeners, in the order added (none by default)

    def add_backward_hook(self, hook) -> None:
        """Call ``hook(child)`` after each child's backward from now on."""
        if not callable(hook):
            raise TypeError(f"hook: expected a callable, got {type(hook).__name__}")
        self._set_plain("backward_hooks", (*self.backward_hooks, hook))

    def remove_backward_hook(self, hook) -> None:
        """Stop calling ``hook`` (ValueError if it was not added)."""
        hooks = list(self.backward_hooks)
        if hook not in hooks:
            raise ValueError(f"hook: {hook!r} is not a backward hook of this "
                             f"{type(self).__name__}")
        hooks.remove(hook)
        self._set_plain("backward_hooks", tuple(hooks))


# ----------------------------------------------------------------------------- Sequential
class _SharedWorkspace(Workspace):
    """Work buffers shared by the children of a checkpointed ``Sequential`` that sit at one
    position of their module trees, keyed by name and column shape, so children of different
    sizes keep separate buffers and none is reallocated back and forth."""

    def get(self, key: str, n: int, *cols: int) -> np.ndarray:
        return super().get((key, cols), n, *cols)


def _share_workspaces(children) -> None:
    """Give every module of the same type at the same path of ``children``'s trees one pool
    of work buffers. Valid because checkpointing keeps one child's forward live at a time:
    a work buffer holds a value from a module's forward to its backward, never longer."""
    pools: dict = {}
    for child in children:
        for path, m in child.named_modules():
            dt = m.__dict__.get("dtype")
            if dt not in (np.dtype(np.float32), np.dtype(np.float64)):
                continue  # e.g. a loss (per-dtype pools of its own)
            m.use_workspace(pools.setdefault((path, type(m), dt), _SharedWorkspace(dt)))


def _generators(modules) -> list:
    """The random generators the modules' trees draw from (dropout masks), each once."""
    seen = {}
    for top in modules:
        for _, m in top.named_modules():
            for v in m.__dict__.values():
                if isinstance(v, np.random.Generator):
                    seen.setdefault(id(v), v)
    return list(seen.values())


def _first_backward(first, dy, dx_acc, input_grad):
    """The first child's backward; ``input_grad=False`` goes to it where its backward takes
    the option (a user's module may not: its input gradient is then computed and dropped)."""
    if input_grad:
        return first.backward(dy, dx_acc=dx_acc)
    if takes_input_grad(first):
        return first.backward(dy, input_grad=False)
    first.backward(dy)
    return None


class Sequential(BackwardHooks, Module):
    """Chains modules: forward in order, backward in reverse. Children are named "0", "1",
    ... so parameters read "0.W", "0.b", "2.W", ...; supports len, indexing and iteration.
    A module instance may appear only once (its cache holds one forward at a time).
    ``residual`` goes to the last child, ``dx_acc`` to the first. ``add_backward_hook(fn)``:
    ``fn(child)`` after each child's backward (``BackwardHooks``).

    ``checkpoint=True`` trades compute for memory (Chen et al. 2016, "Training Deep Nets with
    Sublinear Memory Cost"): forward keeps only a copy of each child's input, and backward
    runs each child's forward again, from that copy, just before its backward (the last
    child's forward is still live and is not rerun). The children's work buffers are then
    pooled: the modules at the same position of every child's tree share one set of
    buffers, so the stack holds one child's activations plus the inputs instead of every
    child's activations. Random generators found in the children (dropout) are rewound for
    the rerun, so it draws the same masks, and restored afterwards: gradients equal those
    without checkpointing bit for bit (at one thread, where BLAS is reproducible). The
    training mode must not change between a forward and its backward. The first child's
    input is kept by reference, as every module keeps its input.
    """

    config_attrs = {"modules": "_seq"}

    def __init__(self, *modules, checkpoint: bool = False):
        dtypes = {m.dtype for m in modules if isinstance(m, Module)}
        super().__init__(dtypes.pop() if len(dtypes) == 1 else np.float32)
        seen = {}
        for i, m in enumerate(modules):
            if not isinstance(m, Module):
                raise TypeError(f"modules[{i}]: expected a Module, got {type(m).__name__}")
            if id(m) in seen:
                raise ValueError(f"modules[{i}]: the same {type(m).__name__} instance is already "
                                 f"modules[{seen[id(m)]}]; a module caches one forward at a "
                                 f"time, so build a second instance")
            seen[id(m)] = i
        for i, m in enumerate(modules):  # the same instance inside two children, too
            for name, sub in list(m.named_modules())[1:]:
                if id(sub) in seen:
                    raise ValueError(f"modules[{i}]: its child {name} is the same "
                                     f"{type(sub).__name__} instance as modules[{seen[id(sub)]}]"
                                     f"; a module caches one forward at a time, so build a "
                                     f"second instance")
                seen[id(sub)] = i
        for i, m in enumerate(modules):
            setattr(self, str(i), m)
        check_bool("checkpoint", checkpoint)
        self._seq = tuple(modules)
        self._rev = tuple(reversed(modules))
        self.checkpoint = checkpoint
        if checkpoint:
            _share_workspaces(modules)
            self._gens = _generators(modules)
            self._states = [None] * (len(modules) + 1)  # generator states before child i
            self._keys = [f"in{i}" for i in range(len(modules))]
            self._inputs = [None] * len(modules)  # each child's input: x by reference, copies
            self._moded = [m for _, m in self.named_modules()]  # whose train/eval flag counts
            self._saved.modes = None     # their flags at the last forward: the reruns repeat them
            self._saved.modes_gen = -1   # mode_version() when they were read

    def extra_repr(self) -> str:
        return "checkpoint=True" if self.checkpoint else ""

    def check_input(self, x, name: str = "x") -> tuple:
        """Each child's ``check_input`` in turn, on the shape the one before gives."""
        if not self._seq:
            return super().check_input(x, name)
        shape = self._seq[0].check_input(x, name)
        for i in range(1, len(self._seq)):
            prev, m = self._seq[i - 1], self._seq[i]
            shape = m.check_input(input_spec(shape, prev.dtype),
                                  f"{name} (as child {i}, {type(m).__name__}, gets it)")
        return shape

    def out_features(self, d_in: int) -> int:
        for m in self._seq:
            d_in = m.out_features(d_in)
        return d_in

    def forward(self, x, *, residual=None):
        """Each child's forward in order (``residual`` fused into the last one)."""
        s, seq = self._calls, self._seq
        if residual is not None:
            # Checked here, before any child runs: a rejected call changes nothing.
            if not seq:
                raise ValueError("residual: an empty Sequential has no layer to add it in")
            if isinstance(x, np.ndarray) and x.ndim:
                rows_of(residual, (*x.shape[:-1], self.out_features(x.shape[-1])),
                         self.dtype, "residual")
            if isinstance(residual, np.ndarray):
                self._no_overlap("residual", residual)
        if not seq:
            s.ready = True
            return x
        if isinstance(x, np.ndarray):
            self._no_overlap("x", x)
        if self.checkpoint:
            y = self._forward_checkpointed(x, residual)
        else:
            # The first child checks x before it changes anything: a rejected x changes nothing.
            y = seq[0].forward(x, residual=residual if len(seq) == 1 else None)
            s.ready = False
            for m in seq[1:-1]:
                y = m.forward(y)
            if len(seq) > 1:
                y = seq[-1].forward(y, residual=residual)
        s.lead, s.in_dim, s.ready = x.shape[:-1], x.shape[-1], True
        return y

    def backward(self, dy, *, dx_acc=None, input_grad=True):
        """Each child's backward in reverse order (``dx_acc`` goes to the first one). With
        ``input_grad=False`` it returns None, and the backward stops at the first child with
        parameters, which gets ``input_grad=False``: the children before it (dropout or an
        activation on the data) have no gradient to add."""
        s = self._calls
        input_grad = check_input_grad(input_grad, dx_acc)
        if not s.ready:
            raise self._no_forward()
        if isinstance(dy, np.ndarray):
            self._no_overlap("dy", dy)
        if dx_acc is not None:
            if not self._seq:
                raise ValueError("dx_acc: an empty Sequential has no layer to add it in")
            rows_of(dx_acc, (*s.lead, s.in_dim), self.dtype, "dx_acc")
            self._no_overlap("dx_acc", dx_acc)
        if self.checkpoint and self._seq:
            return self._backward_checkpointed(dy, dx_acc, input_grad)
        seq = self._seq
        stop = 0 if input_grad else self._first_with_parameters()
        hooks = self.backward_hooks
        if stop < len(seq):
            for m in self._rev[:len(seq) - 1 - stop]:
                dy = m.backward(dy)
                if hooks:
                    overlap.fence()  # the child's queued weight gradients are complete
                for hook in hooks:
                    hook(m)
            dy = _first_backward(seq[stop], dy, dx_acc, input_grad)
            if hooks:
                overlap.fence()
            for hook in hooks:
                hook(seq[stop])
        s.ready = False
        return dy if input_grad else None

    def _first_with_parameters(self) -> int:
        """The index of the first child with parameters (len: none has any), read again only
        when some module's parameters change (the arena layout's version)."""
        c, gen = self._saved, arena_layout_version()
        if getattr(c, "first_param_gen", None) != gen:
            c.first_param = next((i for i, m in enumerate(self._seq) if m.parameters()),
                                 len(self._seq))
            c.first_param_gen = gen
        return c.first_param

    # -- checkpointing ----------------------------------------------------------------------
    def _snap(self, i) -> None:
        if self._gens:
            self._states[i] = [g.bit_generator.state for g in self._gens]

    def _rewind(self, i) -> None:
        if self._gens:
            for g, st in zip(self._gens, self._states[i]):
                g.bit_generator.state = st

    def _slot(self, i, x):
        """A copy of ``x`` (child i's input) in this Sequential's own buffer ``in<i>``."""
        if not isinstance(x, np.ndarray) or x.dtype != self.dtype:
            raise TypeError(f"checkpoint: child {i - 1} ({type(self._seq[i - 1]).__name__}) "
                            f"returned {getattr(x, 'dtype', type(x).__name__)}, expected "
                            f"{self.dtype} arrays between the children")
        slot = self._ws.get(self._keys[i], *x.shape)  # child i's input, kept for its rerun
        np.copyto(slot, x)
        return slot

    def _forward_checkpointed(self, x, residual):
        s, seq = self._calls, self._seq
        last = len(seq) - 1
        inputs = self._inputs
        c, gen = self._saved, mode_version()
        if c.modes_gen != gen:  # a train()/eval() somewhere since they were read
            modes = [m.training for m in self._moded]
        else:
            modes = c.modes
        self._snap(0)
        # The first child checks x before it changes anything: a rejected x changes nothing.
        y = seq[0].forward(x, residual=residual if last == 0 else None)
        s.ready = False
        inputs[0] = x
        for i in range(1, last + 1):
            inputs[i] = xi = self._slot(i, y)
            self._snap(i)
            y = seq[i].forward(xi, residual=residual if i == last else None)
        self._snap(last + 1)
        c.modes, c.modes_gen = modes, gen
        return y

    def _backward_checkpointed(self, dy, dx_acc, input_grad):
        s, seq, inputs = self._calls, self._seq, self._inputs
        c = self._saved
        if c.modes_gen != mode_version() and [m.training for m in self._moded] != c.modes:
            # The reruns would recompute in the other mode (dropout on/off): wrong gradients.
            raise RuntimeError("Sequential(checkpoint=True).backward: the train/eval mode "
                               "changed since forward; the recomputed activations would not "
                               "be the forward's. Restore the mode of the forward, or run "
                               "forward again")
        stop = 0 if input_grad else self._first_with_parameters()
        for i in range(len(seq) - 1, stop, -1):
            d = seq[i].backward(dy)
            for hook in self.backward_hooks:
                hook(seq[i])
            # Child i's input is dead now: its buffer keeps the gradient safe from the rerun
            # below, which overwrites the pooled buffers d lives in.
            dy = inputs[i]
            np.copyto(dy, d)
            self._rewind(i - 1)
            seq[i - 1].forward(inputs[i - 1])
        dx = None
        if stop < len(seq):
            dx = _first_backward(seq[stop], dy, dx_acc, input_grad)
            for hook in self.backward_hooks:
                hook(seq[stop])
        self._rewind(len(seq))
        inputs[0] = None
        s.ready = False
        return dx

    @property
    def torch_layout(self) -> list:
        """PyTorch: nn.Sequential of the children's reference modules, keys ``<i>.<key>``."""
        return [(f"{i}.", str(i)) for i in range(len(self._seq))]

    def __len__(self) -> int:
        return len(self._seq)

    def __getitem__(self, i):
        if isinstance(i, slice):
            return Sequential(*self._seq[i])
        return self._seq[i]

    def __iter__(self):
        return iter(self._seq)


# ----------------------------------------------------------------------------- MLP
def _layer_activation(i, a, slope):
    """``(name or None, negative_slope)`` of ``activations[i]`` (see MLP)."""
    if a is None:
        return None, slope
    if isinstance(a, str):
        if a in ACTIVATIONS or a in ROWWISE_ACTIVATIONS:
            return (None if a == "identity" else a), slope
        raise ValueError(f"activations[{i}]: expected None, one of {ACTIVATIONS}, one of "
                         f"{ROWWISE_ACTIVATIONS} or an activation module, got {a!r}")
    if isinstance(a, Activation):
        return a.activation, a.negative_slope  # the module's own options
    if isinstance(a, RowwiseActivation):
        return a.activation, slope
    if isinstance(a, Identity):
        return None, slope
    raise TypeError(f"activations[{i}]: expected None, a name or an activation module (ReLU(), "
                    f"LeakyReLU(0.2), GELU('tanh'), Softmax(), ...), got {type(a).__name__}")


def _build_mlp(dims, *, dtype, rng, activation):
    sizes = list(dims["sizes"])
    return MLP(sizes, [activation] * (len(sizes) - 2) + [None], dtype=dtype, rng=rng)


@register_block(
    doc="multilayer perceptron: Linear layers with ``activation`` between them, linear output",
    twin="engine.models.naive:NaiveMLP", dims=("sizes",), example={"sizes": (11, 9, 6, 4)},
    options={"activation": "relu"}, variants=({"activation": "relu"}, {"activation": "tanh"}),
    build=_build_mlp, d_in=lambda dims: dims["sizes"][0], d_out=lambda dims: dims["sizes"][-1],
    cli=("mlp", "MLP with the --hidden sizes"), bench={"MLP": {"activation": "relu"}},
    loss="cross_entropy")
class MLP(Sequential):
    """Multilayer perceptron: ``len(sizes) - 1`` ``Linear`` layers, each with its fused
    activation (``None`` = linear output). Default: relu on hidden layers, linear output.
    Parameters are named "0.W", "0.b", "1.W", ... (index = layer).

    Each entry of ``activations`` is, per layer:
    - ``None`` (linear) or a registered element-wise name ("relu", "gelu", "silu", ...);
    - "softmax" / "log_softmax": row-wise over the layer's outputs (``ROWWISE_ACTIVATIONS``),
      typically the last layer's, run by the Linear layer right after its GEMM;
    - an activation module, whose own options are used for that layer: ``LeakyReLU(0.2)``,
      ``GELU("tanh")``, ``ReLU()``, ``Softmax()``, ``LogSoftmax()``, ``Identity()``. Only the
      module's settings are read; the MLP builds its own fused layer.
    ``negative_slope`` is one float for every layer named "leaky_relu", or a list with one
    entry per layer; a ``LeakyReLU(slope)`` module entry carries its own slope instead.
    ``activations`` (the attribute) lists the resolved names (None for "identity", which
    computes nothing); ``reference_activations`` the layers of the PyTorch reference
    ``nn.Sequential``, where "identity" is an ``nn.Identity()`` in its own slot.
    """

    config_attrs = {"negative_slope": "slopes"}  # per layer, as resolved

    def __init__(self, sizes, activations=None, *, bias: bool = True, init: str = "he",
                 dtype=np.float32, rng=None, negative_slope=0.01):
        try:
            sizes = [check_positive_int(f"sizes[{i}]", s) for i, s in enumerate(sizes)]
        except TypeError:
            raise TypeError(f"sizes: expected a sequence of ints, got {sizes!r}") from None
        if len(sizes) < 2:
            raise ValueError(f"sizes: expected at least 2 sizes (input, output), got {sizes}")
        n_layers = len(sizes) - 1
        if activations is None:
            activations = ["relu"] * (n_layers - 1) + [None]
        activations = list(activations)
        if len(activations) != n_layers:
            raise ValueError(f"activations: expected {n_layers} entries (one per layer, "
                             f"len(sizes) - 1), got {len(activations)}: {activations}")
        if isinstance(negative_slope, (list, tuple)):
            if len(negative_slope) != n_layers:
                raise ValueError(f"negative_slope: expected {n_layers} entries (one per layer), "
                                 f"got {len(negative_slope)}")
            slopes = [check_float(f"negative_slope[{i}]", s) for i, s in enumerate(negative_slope)]
        else:
            slopes = [check_float("negative_slope", negative_slope)] * n_layers
        resolved = [_layer_activation(i, a, slopes[i]) for i, a in enumerate(activations)]
        names = [r[0] for r in resolved]
        slopes = [r[1] for r in resolved]
        check_init(init)
        rng = make_rng(rng)
        super().__init__(*[Linear(sizes[i], sizes[i + 1], bias=bias, init=init, dtype=dtype,
                                  rng=rng, activation=names[i], negative_slope=slopes[i])
                           for i in range(n_layers)])
        self.sizes = sizes
        self.activations = names
        # The activation layer after each Linear in the PyTorch reference (nn.Sequential):
        # "identity" keeps its nn.Identity() slot although no kernel runs for it.
        self.reference_activations = [
            "identity" if (a == "identity" or isinstance(a, Identity)) else n
            for a, n in zip(activations, names)]
        self.negative_slope = negative_slope
        self.slopes = slopes
        self.bias, self.init = bool(bias), init

    def __getitem__(self, i):
        return self._seq[i]

    def extra_repr(self) -> str:
        return f"sizes={self.sizes}, activations={self.activations}"

    @property
    def torch_layout(self) -> list:
        """PyTorch: nn.Sequential of nn.Linear and the activation layers in order (None: no
        layer; "identity": an nn.Identity() in its own slot)."""
        rows, slot = [], 0
        for i, act in enumerate(self.reference_activations):
            rows += [(f"{slot}.weight", f"{i}.W", True), (f"{slot}.bias", f"{i}.b", False)]
            slot += 1 if act is None else 2  # Linear, then its activation layer (if any)
        return rows

    def gemm_list(self, lead) -> list:
        """3 GEMMs per layer (every layer, the first included, returns its input gradient):
        the forwards in order, then the backwards in reverse."""
        n, fwd, bwd = int(np.prod(lead)), [], []
        for layer in self._seq:
            f, b = linear_gemms(n, layer.d_in, layer.d_out)
            fwd += f
            bwd = b + bwd
        return fwd + bwd

"""Basic layers: ``Linear`` (with an optional fused activation), the activation modules,
the row-wise ``Softmax`` / ``LogSoftmax``, ``Sequential`` (optionally with gradient
checkpointing) and ``MLP`` (a ``Sequential`` of ``Linear`` layers).

Each follows the module protocol of ``engine.module``: the base class checks arguments and
overlaps; ``_forward``/``_backward`` run ``kernels.ops`` on work buffers that grow to the
largest batch seen.
"""
from __future__ import annotations

import numpy as np

from kernels import ops
from kernels.activations import ACTIVATIONS, REGISTRY

from .module import (_MODE_GEN, INITS, Module, Parameter, Workspace, _rows_of, check_float,
                     check_positive_int, init_weight, input_spec, make_rng)

__all__ = ["INITS", "Linear", "Activation", "ReLU", "LeakyReLU", "GELU", "SiLU", "Sigmoid",
           "Tanh", "Identity", "Softmax", "LogSoftmax", "Sequential", "MLP", "check_activation",
           "sign_from_output", "ROWWISE_ACTIVATIONS"]

# Activations over a whole row (the last axis) rather than per element: not entries of the
# element-wise registry (kernels.activations), but accepted by Linear and MLP as their
# activation and available as the layers Softmax / LogSoftmax.
ROWWISE_ACTIVATIONS = ("softmax", "log_softmax")


def check_activation(name: str, activation) -> str:
    """``activation`` if it names a registered activation, else ValueError naming ``name``."""
    if not isinstance(activation, str) or activation not in ACTIVATIONS:
        raise ValueError(f"{name}: expected one of {ACTIVATIONS}, got {activation!r}")
    return activation


def sign_from_output(activation: str, negative_slope: float = 0.01) -> bool:
    """Whether backward can read the sign of z from act(z), so the activation may run in
    place on its pre-activation buffer (the registry's flag; a leaky_relu with a negative
    slope flips the sign)."""
    if activation == "leaky_relu" and negative_slope < 0:
        return False
    return REGISTRY[activation].sign_from_output


def _check_slope(negative_slope) -> float:
    return check_float("negative_slope", negative_slope)


# ----------------------------------------------------------------------------- Linear
class Linear(Module):
    """``y = act(x @ W + b)`` with ``W`` of shape (d_in, d_out), ``b`` (d_out,) starting at zero
    and ``activation`` None (linear), any registered activation (fused into one pass), or a
    row-wise one, "softmax" / "log_softmax" (over the d_out outputs of each row).

    ``init``: "he" N(0, 2/d_in), "xavier" N(0, 2/(d_in+d_out)), "normal" N(0, 0.02^2),
    "zeros". The bias rides in the GEMM: the output rows are filled with ``b`` (plus the
    residual, when given) and gemm accumulates with beta=1.
    """

    fuses_dx_acc = True

    def __init__(self, d_in: int, d_out: int, bias: bool = True, init: str = "he",
                 dtype=np.float32, rng=None, activation=None, negative_slope: float = 0.01):
        super().__init__(dtype)
        self.d_in = check_positive_int("d_in", d_in)
        self.d_out = check_positive_int("d_out", d_out)
        if init not in INITS:
            raise ValueError(f"init: expected one of {INITS}, got {init!r}")
        if activation == "identity":
            activation = None
        self._rowwise = activation in ROWWISE_ACTIVATIONS
        if activation is not None and not self._rowwise:
            if not isinstance(activation, str) or activation not in ACTIVATIONS:
                raise ValueError(f"activation: expected None, one of {ACTIVATIONS} or one of "
                                 f"{ROWWISE_ACTIVATIONS}, got {activation!r}")
        self.activation = activation
        self.negative_slope = _check_slope(negative_slope)
        self.init = init
        self.in_features = self.d_in
        self.fuses_residual = activation is None
        # relu-like: act runs in place over z; others cache act'(z) over z; row-wise ones
        # keep their output (their backward reads it).
        self._inplace = (activation is not None and not self._rowwise
                         and sign_from_output(activation, self.negative_slope))
        self.W = Parameter(init_weight(self.d_in, self.d_out, init, self.dtype, make_rng(rng)))
        self.b = Parameter(np.zeros(self.d_out, self.dtype)) if bias else None
        self._c.x = None  # (N, d_in) the last input, by reference
        self._c.z = None  # (N, d_out) act(z) (in place, or row-wise) or act'(z), for backward

    def get_config(self) -> dict:
        return {"d_in": self.d_in, "d_out": self.d_out, "bias": self.b is not None,
                "init": self.init, "dtype": self.dtype.name, "activation": self.activation,
                "negative_slope": self.negative_slope}

    def out_features(self, d_in: int) -> int:
        return self.d_out

    def _forward(self, x2, res2):
        n = x2.shape[0]
        ws, act = self._ws, self.activation
        z = ws.get("z", n, self.d_out)  # (N, d_out) x W + b (+ residual)
        y = z if act is None or self._inplace else ws.get("h", n, self.d_out)  # (N, d_out)
        if n:
            b = self.b
            if b is None and res2 is None:
                ops.gemm(z, x2, self.W.data, False, False, 1.0, 0.0)
            else:
                ops.fill_rows(z, None if b is None else b.data, res2)
                ops.gemm(z, x2, self.W.data, False, False, 1.0, 1.0)
            if self._rowwise:
                _rowwise_forward(act, y, z)
            elif act is not None:
                ops.bias_act(y, z, None, act, self.negative_slope,
                             None if self._inplace else z)
        self._c.x, self._c.z = x2, (y if self._rowwise else z)
        return y

    def _backward(self, dy2, acc2):
        n, ws, act = dy2.shape[0], self._ws, self.activation
        if act is None:
            dz = dy2
        else:
            dz = ws.get("dz", n, self.d_out)  # (N, d_out)
            if n:
                if self._rowwise:
                    _rowwise_backward(act, dz, dy2, self._c.z)
                elif self._inplace:
                    ops.act_backward(dz, dy2, self._c.z, act, self.negative_slope, self._c.z)
                else:
                    ops.act_backward_cached(dz, dy2, self._c.z)
        dx = acc2 if acc2 is not None else ws.get("dx", n, self.d_in)  # (N, d_in)
        if n:
            ops.gemm(self.W.grad, self._c.x, dz, True, False, 1.0, 1.0)  # dW += x^T dz
            if self.b is not None:
                ops.colsum(self.b.grad, dz, 1.0)                        # db += dz.sum(0)
            ops.gemm(dx, dz, self.W.data, False, True, 1.0, 0.0 if acc2 is None else 1.0)
        self._c.x = None
        return dx

    def extra_repr(self) -> str:
        act = "" if self.activation is None else f", activation={self.activation!r}"
        return f"d_in={self.d_in}, d_out={self.d_out}, bias={self.b is not None}{act}"


# ----------------------------------------------------------------------------- activations
class Activation(Module):
    """Element-wise ``h = act(z)`` over inputs of any feature size, for any registered
    activation name (kernels.activations); ``negative_slope`` is read by leaky_relu."""

    def __init__(self, activation: str = "relu", negative_slope: float = 0.01,
                 dtype=np.float32):
        super().__init__(dtype)
        self.activation = check_activation("activation", activation)
        self.negative_slope = _check_slope(negative_slope)
        self._c.z = None  # (N, d) the last input, by reference
        self._c.h = None  # (N, d) the last output (a work buffer)

    def get_config(self) -> dict:
        return {"activation": self.activation, "negative_slope": self.negative_slope,
                "dtype": self.dtype.name}

    def _forward(self, z2, res2):
        h = self._ws.get("h", *z2.shape)  # (N, d)
        if z2.size:
            ops.bias_act(h, z2, None, self.activation, self.negative_slope, None)
        self._c.z, self._c.h = z2, h
        return h

    def _backward(self, dh2, acc2):
        dz = self._ws.get("dz", *dh2.shape)  # (N, d)
        if dh2.size:
            ops.act_backward(dz, dh2, self._c.z, self.activation, self.negative_slope, self._c.h)
        self._c.z = None
        return dz

    def extra_repr(self) -> str:
        slope = f", negative_slope={self.negative_slope}" if self.activation == "leaky_relu" else ""
        return f"{self.activation!r}{slope}"


class ReLU(Activation):
    """``max(z, 0)``."""

    def __init__(self, dtype=np.float32):
        super().__init__("relu", dtype=dtype)

    def get_config(self) -> dict:
        return {"dtype": self.dtype.name}


class LeakyReLU(Activation):
    """``z if z > 0 else negative_slope * z``."""

    def __init__(self, negative_slope: float = 0.01, dtype=np.float32):
        super().__init__("leaky_relu", negative_slope, dtype)

    def get_config(self) -> dict:
        return {"negative_slope": self.negative_slope, "dtype": self.dtype.name}


class GELU(Activation):
    """``z * Phi(z)`` (``approximate="none"``, erf) or its tanh approximation (``"tanh"``)."""

    def __init__(self, approximate: str = "none", dtype=np.float32):
        if approximate not in ("none", "tanh"):
            raise ValueError(f"approximate: expected 'none' or 'tanh', got {approximate!r}")
        super().__init__("gelu" if approximate == "none" else "gelu_tanh", dtype=dtype)
        self.approximate = approximate

    def get_config(self) -> dict:
        return {"approximate": self.approximate, "dtype": self.dtype.name}


class SiLU(Activation):
    """``z * sigmoid(z)``."""

    def __init__(self, dtype=np.float32):
        super().__init__("silu", dtype=dtype)

    def get_config(self) -> dict:
        return {"dtype": self.dtype.name}


class Sigmoid(Activation):
    """``1 / (1 + exp(-z))``."""

    def __init__(self, dtype=np.float32):
        super().__init__("sigmoid", dtype=dtype)

    def get_config(self) -> dict:
        return {"dtype": self.dtype.name}


class Tanh(Activation):
    """``tanh(z)``."""

    def __init__(self, dtype=np.float32):
        super().__init__("tanh", dtype=dtype)

    def get_config(self) -> dict:
        return {"dtype": self.dtype.name}


class Identity(Module):
    """Returns its input itself (no copy) and ``dy`` itself as the input gradient."""

    def get_config(self) -> dict:
        return {"dtype": self.dtype.name}

    def _forward(self, x2, res2):
        return x2

    def _backward(self, dy2, acc2):
        return dy2


# ----------------------------------------------------------------------------- row-wise
def _rowwise_forward(act, y, x):
    if act == "softmax":
        ops.softmax_forward(y, x)
    else:
        ops.log_softmax_forward(y, x)


def _rowwise_backward(act, dx, dy, y):
    if act == "softmax":
        ops.softmax_backward(dx, dy, y)
    else:
        ops.log_softmax_backward(dx, dy, y)


class _RowwiseActivation(Module):
    """A row-wise activation over the last axis of inputs of any feature size."""

    activation = None  # "softmax" or "log_softmax"

    def __init__(self, dtype=np.float32):
        super().__init__(dtype)
        self._c.y = None  # (N, C) the last output, read by backward

    def get_config(self) -> dict:
        return {"dtype": self.dtype.name}

    def _forward(self, x2, res2):
        y = self._ws.get("y", *x2.shape)  # (N, C)
        _rowwise_forward(self.activation, y, x2)
        self._c.y = y
        return y

    def _backward(self, dy2, acc2):
        dx = self._ws.get("dx", *dy2.shape)  # (N, C)
        _rowwise_backward(self.activation, dx, dy2, self._c.y)
        self._c.y = None
        return dx


class Softmax(_RowwiseActivation):
    """``softmax(x) = exp(x) / sum(exp(x))`` over the last axis (PyTorch's ``Softmax(dim=-1)``);
    backward ``dx = y * (dy - sum(dy * y))``."""

    activation = "softmax"


class LogSoftmax(_RowwiseActivation):
    """``log_softmax(x) = x - log(sum(exp(x)))`` over the last axis (PyTorch's
    ``LogSoftmax(dim=-1)``); backward ``dx = dy - softmax(x) * sum(dy)``."""

    activation = "log_softmax"


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


class Sequential(Module):
    """Chains modules: forward in order, backward in reverse. Children are named "0", "1",
    ... so parameters read "0.W", "0.b", "2.W", ...; supports len, indexing and iteration.
    A module instance may appear only once (its cache holds one forward at a time).
    ``residual`` goes to the last child, ``dx_acc`` to the first.

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
        if not isinstance(checkpoint, bool):
            raise TypeError(f"checkpoint: expected True or False, got {checkpoint!r}")
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
            self._c.modes = None     # their flags at the last forward: the reruns repeat them
            self._c.modes_gen = -1   # _MODE_GEN when they were read

    def get_config(self) -> dict:
        return {"modules": list(self._seq), "checkpoint": self.checkpoint}

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
        s, seq = self._s, self._seq
        if residual is not None:
            # Checked here, before any child runs: a rejected call changes nothing.
            if not seq:
                raise ValueError("residual: an empty Sequential has no layer to add it in")
            if isinstance(x, np.ndarray) and x.ndim:
                _rows_of(residual, (*x.shape[:-1], self.out_features(x.shape[-1])),
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

    def backward(self, dy, *, dx_acc=None):
        """Each child's backward in reverse order (``dx_acc`` fused into the first one)."""
        s = self._s
        if not s.ready:
            raise self._no_forward()
        if isinstance(dy, np.ndarray):
            self._no_overlap("dy", dy)
        if dx_acc is not None:
            if not self._seq:
                raise ValueError("dx_acc: an empty Sequential has no layer to add it in")
            _rows_of(dx_acc, (*s.lead, s.in_dim), self.dtype, "dx_acc")
            self._no_overlap("dx_acc", dx_acc)
        if self.checkpoint and self._seq:
            return self._backward_checkpointed(dy, dx_acc)
        if self._seq:
            for m in self._rev[:-1]:
                dy = m.backward(dy)
            dy = self._seq[0].backward(dy, dx_acc=dx_acc)
        s.ready = False
        return dy

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
        s, seq = self._s, self._seq
        last = len(seq) - 1
        inputs = self._inputs
        c, gen = self._c, _MODE_GEN[0]
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

    def _backward_checkpointed(self, dy, dx_acc):
        s, seq, inputs = self._s, self._seq, self._inputs
        c = self._c
        if c.modes_gen != _MODE_GEN[0] and [m.training for m in self._moded] != c.modes:
            # The reruns would recompute in the other mode (dropout on/off): wrong gradients.
            raise RuntimeError("Sequential(checkpoint=True).backward: the train/eval mode "
                               "changed since forward; the recomputed activations would not "
                               "be the forward's. Restore the mode of the forward, or run "
                               "forward again")
        for i in range(len(seq) - 1, 0, -1):
            d = seq[i].backward(dy)
            # Child i's input is dead now: its buffer keeps the gradient safe from the rerun
            # below, which overwrites the pooled buffers d lives in.
            dy = inputs[i]
            np.copyto(dy, d)
            self._rewind(i - 1)
            seq[i - 1].forward(inputs[i - 1])
        dx = seq[0].backward(dy, dx_acc=dx_acc)
        self._rewind(len(seq))
        inputs[0] = None
        s.ready = False
        return dx

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
    if isinstance(a, _RowwiseActivation):
        return a.activation, slope
    if isinstance(a, Identity):
        return None, slope
    raise TypeError(f"activations[{i}]: expected None, a name or an activation module (ReLU(), "
                    f"LeakyReLU(0.2), GELU('tanh'), Softmax(), ...), got {type(a).__name__}")


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

    def __init__(self, sizes, activations=None, init: str = "he", bias: bool = True,
                 negative_slope=0.01, dtype=np.float32, rng=None):
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
            slopes = [_check_slope(negative_slope)] * n_layers
        resolved = [_layer_activation(i, a, slopes[i]) for i, a in enumerate(activations)]
        names = [r[0] for r in resolved]
        slopes = [r[1] for r in resolved]
        if init not in INITS:
            raise ValueError(f"init: expected one of {INITS}, got {init!r}")
        rng = make_rng(rng)
        super().__init__(*[Linear(sizes[i], sizes[i + 1], bias, init, dtype, rng,
                                  names[i], slopes[i]) for i in range(n_layers)])
        self.sizes = sizes
        self.activations = names
        # The activation layer after each Linear in the PyTorch reference (nn.Sequential):
        # "identity" keeps its nn.Identity() slot although no kernel runs for it.
        self.reference_activations = [
            "identity" if (a == "identity" or isinstance(a, Identity)) else n
            for a, n in zip(activations, names)]
        self.negative_slope = negative_slope
        self.slopes = slopes

    def get_config(self) -> dict:
        return {"sizes": list(self.sizes), "activations": list(self.activations),
                "init": self[0].init, "bias": self[0].b is not None,
                "negative_slope": list(self.slopes), "dtype": self.dtype.name}

    def __getitem__(self, i):
        return self._seq[i]

    def extra_repr(self) -> str:
        return f"sizes={self.sizes}, activations={self.activations}"

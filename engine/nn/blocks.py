"""Transformer feed-forward blocks: ``Dropout``, ``LayerNorm`` (Ba et al. 2016), ``FFN``
(Vaswani et al. 2017), ``AddNorm`` and ``FFNSublayer`` (``GMLP`` lives in
engine/nn/channel_gated_mlp.py).

Leaf blocks run ``kernels.ops`` on work buffers they own (grown to the largest batch seen,
row slices otherwise), so a steady step allocates nothing; ``FFNSublayer`` is a composite
that calls its children's public ``forward``/``backward`` with the protocol's fused options.
"""
from __future__ import annotations

from types import SimpleNamespace

import numpy as np

from kernels import ops, overlap

from .._checks import check_bool
from .layers import check_activation, sign_from_output
from .module import (INITS, SKIP_DX, Module, Parameter, as_rows, check_float, check_init,
                     check_positive_int, init_weight, make_rng, rows_of, shaped)
from .registry import linear_gemms, register_block

__all__ = ["Dropout", "LayerNorm", "FFN", "AddNorm", "FFNSublayer", "INITS"]


def _check_p(name, p) -> float:
    return check_float(name, p, 0.0, 1.0, high_open=True)


def _check_eps(eps) -> float:
    # eps > 0: with eps = 0 a constant row (variance 0) normalises to 0/0 = NaN.
    return check_float("eps", eps, 0.0, low_open=True)


# ----------------------------------------------------------------------------- Dropout
class Dropout(Module):
    """Inverted dropout: in training, zero each element with probability ``p`` and scale the
    rest by 1/(1-p). Identity (returns its input itself, no copy) in eval mode or when p == 0."""

    fuses_residual = True

    def __init__(self, p: float = 0.5, *, dtype=np.float32, rng=None):
        super().__init__(dtype)
        self.p = _check_p("p", p)
        self._rng = make_rng(rng)
        self._saved.dropped = False  # whether the last forward applied a mask

    def extra_repr(self):
        return f"p={self.p}, dtype={self.dtype}"

    def _make_views(self, key):
        n, d = key
        ws = self._ws
        return SimpleNamespace(mask=ws.get("mask", n, d),  # (n, d) 0 or 1/(1-p), for backward
                               out=ws.get("out", n, d),    # (n, d)
                               dx=ws.get("dx", n, d))      # (n, d)

    def _forward(self, x2, res2):
        self._saved.dropped = dropped = self.training and self.p > 0.0
        if not dropped:
            if res2 is None:
                return x2
            out = self._views(x2.shape).out
            return ops.add(out, x2, res2)
        v = self._views(x2.shape)
        if not x2.flags.writeable:  # the dropout kernel compiles for writable inputs
            np.copyto(v.out, x2)
            x2 = v.out
        ops.dropout_forward(v.out, v.mask, x2, self.p, self._rng)
        if res2 is not None:
            ops.add(v.out, v.out, res2)
        return v.out

    def _backward(self, dy2, acc2):
        if not self._saved.dropped:
            return dy2
        v = self._views(dy2.shape)
        if not dy2.flags.writeable:  # the kernel compiles for writable inputs: in place
            np.copyto(v.dx, dy2)
            dy2 = v.dx
        ops.dropout_backward(v.dx, dy2, v.mask)
        return v.dx


# ----------------------------------------------------------------------------- LayerNorm
class LayerNorm(Module):
    """LayerNorm over the last axis (Ba et al. 2016): y = (x - mean) / sqrt(var + eps) * gamma
    + beta, with per-feature ``gamma`` (ones) and ``beta`` (zeros). ``bias=False`` has no
    ``beta`` (None; nanoGPT's ``LayerNorm(ndim, bias=False)``): y = xhat * gamma."""

    # PyTorch: nn.LayerNorm(d) (engine/interop.py); without bias, no "bias" key.
    torch_layout = (("weight", "gamma", False), ("bias", "beta", False))
    fuses_dx_acc = True  # dx_acc += LN'(dy) inside the backward's one pass over the rows

    def __init__(self, d: int, *, bias: bool = True, dtype=np.float32, eps: float = 1e-5):
        super().__init__(dtype)
        self.d = self.in_features = check_positive_int("d", d)
        self.eps = _check_eps(eps)
        self.bias = check_bool("bias", bias)
        self.gamma = Parameter(np.ones(self.d, self.dtype))
        self.beta = Parameter(np.zeros(self.d, self.dtype)) if self.bias else None
        # Without bias the kernels still take a beta: zeros that are no parameter, and a
        # dbeta they add into that is cleared and never read.
        self._zeros = None if bias else np.zeros(self.d, self.dtype)  # (d,)
        self._saved.x = None  # (n, d) the last input, by reference

    def extra_repr(self):
        nobias = "" if self.beta is not None else ", bias=False"
        return f"d={self.d}, eps={self.eps}, dtype={self.dtype}{nobias}"

    def _make_views(self, n):
        ws, d = self._ws, self.d
        return SimpleNamespace(y=ws.get("y", n, d),      # (n, d) output
                               mean=ws.get("mean", n),   # (n,) cached for backward
                               rstd=ws.get("rstd", n),   # (n,) cached for backward
                               dx=ws.get("dx", n, d))    # (n, d) input gradient

    def _forward(self, x2, res2):
        v = self._views(x2.shape[0])
        beta = self._zeros if self.beta is None else self.beta.data
        ops.layernorm_forward(v.y, v.mean, v.rstd, x2, self.gamma.data, beta, self.eps)
        self._saved.x = x2
        return v.y

    def _backward(self, dy2, acc2):
        v = self._views(dy2.shape[0])
        if self.beta is None:
            dbeta = self._ws.get("dbeta", self.d)  # (d,) discarded
            dbeta.fill(0.0)
        else:
            dbeta = self.beta.grad
        x = self._saved.x
        self._saved.x = None
        if acc2 is not None and np.may_share_memory(acc2, x):
            # The pass writes acc's rows while it reads x's: add after, as the base class.
            dx = ops.layernorm_backward(v.dx, self.gamma.grad, dbeta, dy2, x, v.mean, v.rstd,
                                        self.gamma.data)
            return ops.add(acc2, acc2, dx)
        return ops.layernorm_backward(v.dx if acc2 is None else acc2, self.gamma.grad, dbeta,
                                      dy2, x, v.mean, v.rstd, self.gamma.data, acc2 is not None)


# ----------------------------------------------------------------------------- FFN
@register_block(
    doc="position-wise feed-forward, y = act(x W_in + b1) W_out + b2 (Vaswani et al. 2017)",
    twin="engine.models.naive:NaiveFFN", dims=("d_model", "d_ff"),
    example={"d_model": 12, "d_ff": 20}, options={"activation": "relu", "dropout": 0.0},
    variants=({"activation": "relu"}, {"activation": "gelu"}),
    cli=("ffn", "Linear(d_in, d_hidden) -> FFN(d_hidden, d_ff) -> Linear(d_hidden, d_out)"),
    bench={"FFN-relu": {"activation": "relu"}, "FFN-gelu": {"activation": "gelu"}})
class FFN(Module):
    """Position-wise feed-forward (Vaswani et al. 2017): y = dropout(act(x @ W_in + b1)) @ W_out
    + b2.

    Parameters ``W_in`` (d_model, d_ff), ``b1`` (d_ff,), ``W_out`` (d_ff, d_model), ``b2``
    (d_model,); no biases when ``bias=False``. ``init`` ("he", "xavier", "normal", "zeros")
    applies to both weights (fan-in of each); biases start at zero. ``activation`` is any
    registered activation (``kernels.activations.ACTIVATIONS``; leaky_relu with slope 0.01).
    The residual option rides in the output GEMM, ``dx_acc`` in the input-gradient GEMM.
    """

    fuses_residual = True
    fuses_dx_acc = True
    acc_alias_safe = True  # dy is read only before dx_acc is written
    skips_input_grad = True
    # PyTorch: nn.Sequential(nn.Linear(d_model, d_ff), act, nn.Linear(d_ff, d_model)).
    torch_layout = (("0.weight", "W_in", True), ("0.bias", "b1", False),
                    ("2.weight", "W_out", True), ("2.bias", "b2", False))
    config_attrs = {"dropout": "p"}

    def __init__(self, d_model: int, d_ff: int, activation: str = "relu", *,
                 dropout: float = 0.0, bias: bool = True, init: str = "he", dtype=np.float32,
                 rng=None):
        super().__init__(dtype)
        self.d_model = self.in_features = check_positive_int("d_model", d_model)
        self.d_ff = check_positive_int("d_ff", d_ff)
        self.activation = check_activation("activation", activation)
        self.p = _check_p("dropout", dropout)
        self.bias = bool(bias)
        self.init = check_init(init)
        rng = make_rng(rng)
        self._rng = rng
        # relu-like: act runs in place over z; others cache act'(z) over z.
        self._inplace = sign_from_output(activation)
        dt = self.dtype
        self.W_in = Parameter(init_weight(self.d_model, self.d_ff, init, dt, rng))
        self.b1 = Parameter(np.zeros(self.d_ff, dt)) if bias else None
        self.W_out = Parameter(init_weight(self.d_ff, self.d_model, init, dt, rng))
        self.b2 = Parameter(np.zeros(self.d_model, dt)) if bias else None
        self._saved.x = None
        self._saved.dropped = False

    def extra_repr(self):
        return (f"d_model={self.d_model}, d_ff={self.d_ff}, activation={self.activation!r}, "
                f"dropout={self.p}, bias={self.b1 is not None}, dtype={self.dtype}")

    def _make_views(self, n):
        ws, d, f = self._ws, self.d_model, self.d_ff
        z = ws.get("z", n, f)  # (n, d_ff) x W_in + b1, then act(z) (in place) or act'(z)
        v = SimpleNamespace(z=z, y=ws.get("y", n, d),     # (n, d_model) output
                            dx=ws.get("dx", n, d))        # (n, d_model) input gradient
        if self._inplace:
            v.h = z
            v.dh = ws.get("dh", n, f)  # (n, d_ff) dh, then dz in place
        else:
            v.h = ws.get("h", n, f)    # (n, d_ff) act(z); dh then dz in place after dW_out
            v.dh = v.h
        if self.p > 0.0:
            v.mask = ws.get("mask", n, f)  # (n, d_ff) dropout mask for backward
        return v

    def _forward(self, x2, res2):
        n, v, dropped = self._start_forward(x2, self.p)
        if n == 0:
            return v.y
        z, h, y = v.z, v.h, v.y
        ops.gemm(z, x2, self.W_in.data, False, False, 1.0, 0.0)
        b1 = self.b1
        ops.bias_act(h, z, None if b1 is None else b1.data, self.activation, 0.01,
                     None if self._inplace else z)
        if dropped:
            # In place: sign(h * mask) still tells relu-like acts where z > 0 wherever the
            # mask is non-zero, and where it is zero the gradient is zero anyway.
            ops.dropout_forward(h, v.mask, h, self.p, self._rng)
        b2 = self.b2
        if b2 is None and res2 is None:
            ops.gemm(y, h, self.W_out.data, False, False, 1.0, 0.0)
        else:  # y = b2 (+ residual), then y += h W_out inside the GEMM
            ops.fill_rows(y, None if b2 is None else b2.data, res2)
            ops.gemm(y, h, self.W_out.data, False, False, 1.0, 1.0)
        return y

    def gemm_list(self, lead) -> list:
        """The GEMMs of one forward + backward on (*lead, d_model): 2 forward, 4 backward
        (dW_out, dh, dW_in, dx)."""
        n = int(np.prod(lead))
        f1, b1 = linear_gemms(n, self.d_model, self.d_ff)
        f2, b2 = linear_gemms(n, self.d_ff, self.d_model)
        return f1 + f2 + b2 + b1

    def _backward(self, dy2, acc2):
        n, v, dx = self._start_backward(dy2, acc2)
        if n == 0:
            return dx
        h, dh = v.h, v.dh
        lane = overlap.deferring()  # the weight gradients later, on the lane
        if lane and dh is h:  # h is read by the queued dW_out: dh goes to a lane buffer
            dh = overlap.rows("ffn.dh", dh)
        if self.b2 is not None:
            ops.colsum(self.b2.grad, dy2, 1.0)
        ops.gemm(self.W_out.grad, h, dy2, True, False, 1.0, 1.0, lane)
        ops.gemm(dh, dy2, self.W_out.data, False, True, 1.0, 0.0)  # may overwrite h
        if self._saved.dropped:
            ops.dropout_backward(dh, dh, v.mask)
        db1 = None if self.b1 is None else self.b1.grad  # db1 += dz.sum(0) in the same pass
        if self._inplace:
            ops.act_backward(dh, dh, v.z, self.activation, 0.01, v.z, db1)  # v.z is act(z)
        else:
            ops.act_backward_cached(dh, dh, v.z, db1)                       # v.z is act'(z)
        ops.gemm(self.W_in.grad, self._saved.x, dh, True, False, 1.0, 1.0, lane)
        if dx is not SKIP_DX:
            if lane:
                overlap.wait_for(dx)
            ops.gemm(dx, dh, self.W_in.data, False, True, 1.0, 0.0 if acc2 is None else 1.0)
        self._saved.x = None
        return dx


# ----------------------------------------------------------------------------- AddNorm
class AddNorm(Module):
    """Add & Norm (Vaswani et al. 2017): y = LayerNorm(x + Dropout(sub)) with per-feature
    ``gamma``/``beta``. ``forward(x, sub)``; ``backward(dy)`` returns ``(dx, dsub)``."""

    torch_layout = LayerNorm.torch_layout  # nn.LayerNorm(d_model)
    config_attrs = {"dropout": "p"}

    def __init__(self, d_model: int, *, dropout: float = 0.0, dtype=np.float32, rng=None,
                 eps: float = 1e-5):
        super().__init__(dtype)
        self.d_model = self.in_features = check_positive_int("d_model", d_model)
        self.p = _check_p("dropout", dropout)
        self.eps = _check_eps(eps)
        self._rng = make_rng(rng)
        self.gamma = Parameter(np.ones(self.d_model, self.dtype))
        self.beta = Parameter(np.zeros(self.d_model, self.dtype))
        self._saved.dropped = False

    def extra_repr(self):
        return f"d_model={self.d_model}, dropout={self.p}, eps={self.eps}, dtype={self.dtype}"

    def _make_views(self, n):
        ws, d = self._ws, self.d_model
        v = SimpleNamespace(s=ws.get("s", n, d),       # (n, d) x + dropout(sub)
                            y=ws.get("y", n, d),       # (n, d) output
                            mean=ws.get("mean", n),    # (n,) cached for backward
                            rstd=ws.get("rstd", n),    # (n,) cached for backward
                            ds=ws.get("ds", n, d),     # (n, d) dL/ds = dx
                            dsub=ws.get("dsub", n, d))  # (n, d) dL/dsub
        if self.p > 0.0:
            v.mask = ws.get("mask", n, d)  # (n, d) dropout mask for backward
        return v

    def check_input(self, x, name: str = "x") -> tuple:
        raise TypeError(f"{name}: an AddNorm takes two inputs, forward(x, sub); it cannot be "
                        f"fed one array (use FFNSublayer, or put it inside a block)")

    def forward(self, x, sub):
        """``LayerNorm(x + Dropout(sub))`` for ``x`` and ``sub`` of one shape."""
        x2, lead = as_rows(x, self.d_model, self.dtype, "x")
        if isinstance(sub, np.ndarray) and sub.shape != x.shape:
            raise ValueError(f"x, sub: expected the same shape, got x {x.shape} and sub {sub.shape}")
        sub2 = rows_of(sub, x.shape, self.dtype, "sub")
        self._no_overlap("x", x)
        self._no_overlap("sub", sub)
        s = self._calls
        s.ready = False
        v = self._views(x2.shape[0])
        self._saved.dropped = dropped = self.training and self.p > 0.0
        if dropped:
            if not sub2.flags.writeable:  # the dropout kernel compiles for writable inputs
                np.copyto(v.s, sub2)
                sub2 = v.s
            ops.dropout_forward(v.s, v.mask, sub2, self.p, self._rng)
            ops.add(v.s, v.s, x2)
        else:
            ops.add(v.s, x2, sub2)
        ops.layernorm_forward(v.y, v.mean, v.rstd, v.s, self.gamma.data, self.beta.data,
                              self.eps)
        s.lead, s.out_shape, s.ready = lead, x.shape, True
        return shaped(v.y, lead)

    def backward(self, dy):
        """``(dx, dsub)`` for output gradient ``dy``; separate arrays."""
        s = self._calls
        if not s.ready:
            raise self._no_forward()
        dy2 = self._dy_rows(dy, s.out_shape)
        v = self._views(dy2.shape[0])
        ops.layernorm_backward(v.ds, self.gamma.grad, self.beta.grad, dy2, v.s, v.mean,
                               v.rstd, self.gamma.data)
        if self._saved.dropped:
            ops.dropout_backward(v.dsub, v.ds, v.mask)
        else:
            np.copyto(v.dsub, v.ds)
        s.ready = False
        return shaped(v.ds, s.lead), shaped(v.dsub, s.lead)


# ----------------------------------------------------------------------------- FFNSublayer
@register_block(
    doc="the FFN with its residual and LayerNorm: post-norm LayerNorm(x + FFN(x)) or "
        "pre-norm x + FFN(LayerNorm(x))",
    twin="engine.models.naive:NaiveFFNSublayer", dims=("d_model", "d_ff"),
    example={"d_model": 12, "d_ff": 20},
    options={"activation": "relu", "dropout": 0.0, "norm": "post"},
    variants=({"activation": "gelu", "norm": "post"}, {"activation": "gelu", "norm": "pre"}),
    cli=("sublayer", "the same with an FFNSublayer (residual + LayerNorm) in the middle"),
    bench={"FFNSublayer-post-gelu": {"activation": "gelu", "norm": "post"}})
class FFNSublayer(Module):
    """The transformer's position-wise FFN sublayer with its residual and LayerNorm:
    ``norm="post"`` (Vaswani et al. 2017): y = LayerNorm(x + Dropout(FFN(x)));
    ``norm="pre"``: y = x + Dropout(FFN(LayerNorm(x))).
    ``dropout`` applies inside the FFN (after the activation) and to the FFN's output before
    the residual add, as in PyTorch's TransformerEncoderLayer. Children: ``ffn``, ``norm``,
    ``drop``; it calls only their public methods, with the protocol's fused options.
    """

    torch_layout = (("ffn.", "ffn"), ("norm.", "norm"))  # children under their own names
    skips_input_grad = True  # post-norm: the FFN's input GEMM; pre-norm: the residual add
    # Held by the children; the child ``norm`` takes the argument's name, so it is norm_mode.
    config_attrs = {"d_ff": "ffn.d_ff", "activation": "ffn.activation", "dropout": "p",
                    "norm": "norm_mode", "eps": "norm.eps"}

    def __init__(self, d_model: int, d_ff: int, activation: str = "relu", *,
                 dropout: float = 0.0, dtype=np.float32, rng=None, norm: str = "post",
                 eps: float = 1e-5):
        super().__init__(dtype)
        if norm not in ("post", "pre"):
            raise ValueError(f"norm: expected 'post' or 'pre', got {norm!r}")
        self.d_model = self.in_features = check_positive_int("d_model", d_model)
        p = _check_p("dropout", dropout)
        rng = make_rng(rng)
        self.norm_mode = norm
        self.p = p
        self.ffn = FFN(d_model, d_ff, activation, dropout=p, dtype=dtype, rng=rng)
        self.norm = LayerNorm(d_model, dtype=dtype, eps=eps)
        self.drop = Dropout(p, dtype=dtype, rng=rng)  # residual dropout (no parameters)
        self._saved.dropped = False

    def extra_repr(self):
        return f"norm={self.norm_mode!r}, dropout={self.p}, dtype={self.dtype}"

    def _forward(self, x2, res2):
        ffn, norm = self.ffn, self.norm
        self._saved.dropped = dropped = self.training and self.p > 0.0
        if self.norm_mode == "post":
            if dropped:
                return norm(self.drop(ffn(x2), residual=x2))
            return norm(ffn(x2, residual=x2))  # x + FFN(x) straight from the GEMM
        xn = norm(x2)
        if dropped:
            return self.drop(ffn(xn), residual=x2)
        return ffn(xn, residual=x2)

    def gemm_list(self, lead) -> list:
        """The FFN's GEMMs (the LayerNorm and the residual add run none)."""
        return self.ffn.gemm_list(lead)

    def _backward(self, dy2, acc2):
        ffn, norm = self.ffn, self.norm
        skip = acc2 is SKIP_DX
        if self.norm_mode == "post":
            ds = norm.backward(dy2)
            dsub = self.drop.backward(ds) if self._saved.dropped else ds
            if skip:
                return ffn.backward(dsub, input_grad=False)
            return ffn.backward(dsub, dx_acc=ds)  # dx = ds + FFN'(x)^T dsub, in one GEMM
        dmid = self.drop.backward(dy2) if self._saved.dropped else dy2
        # pre-norm: the norm's parameter gradients need the FFN's input gradient
        dx = norm.backward(ffn.backward(dmid), input_grad=not skip)
        return None if skip else ops.add(dx, dx, dy2)


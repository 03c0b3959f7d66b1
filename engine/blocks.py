"""Transformer feed-forward blocks built straight on the kernels: ``Dropout``, ``LayerNorm``,
``FFN``, ``GMLP``, ``AddNorm`` and ``FFNSublayer``. Each block checks its input once at the
public boundary, then runs the kernels' unchecked cores on work buffers it owns (grown to the
largest batch seen, row slices otherwise, 64-byte aligned), so a steady step allocates nothing
and costs little beyond its GEMMs; large elementwise passes are split over the blasnet thread
count. Each forward supports one backward: backward reuses forward's buffers.
"""
from __future__ import annotations

import math
from types import SimpleNamespace

import numpy as np

from kernels import activations as _act_mod
from kernels import dropout as _drop_mod
from kernels import layernorm as _ln_mod
from kernels.activations import ACTIVATIONS
from kernels.gemm import gemm_unchecked as _gemm
from kernels.gemm import gemv_colsum as _colsum
from kernels.parallel import MIN_ELEMENTS_PER_THREAD as _MIN_PER_THREAD
from kernels.parallel import chunks as _chunks
from kernels.parallel import parallel_for as _parallel_for

from .module import (INITS, Module, Parameter, Workspace, as_rows, check_dtype,
                     check_positive_int, init_weight, make_rng)

__all__ = ["Dropout", "LayerNorm", "FFN", "GMLP", "AddNorm", "FFNSublayer", "INITS"]


# The kernels' hot-path cores: no argument checks (blocks check at their boundary and own
# their buffers).
_bias_act = _act_mod.bias_act_forward_unchecked
_act_bwd = _act_mod.act_backward_unchecked
_act_cached = _act_mod.act_backward_cached_unchecked
_drop_fwd = _drop_mod.dropout_forward_unchecked
_drop_bwd = _drop_mod.dropout_backward_unchecked
_ln_fwd = _ln_mod.layernorm_forward_unchecked
_ln_bwd = _ln_mod.layernorm_backward_unchecked

# Activations whose derivative can be read off the output (sign(h) == sign(z)), so the
# activation runs in place on the pre-activation buffer and one (N, d_ff) buffer is saved.
# Every other activation caches act'(z) over z in the forward pass (computed there from
# what act(z) needs anyway), so backward is one multiply instead of recomputing act'.
_INPLACE_ACTS = ("relu", "leaky_relu", "identity")
# Bytes per operand block in the gMLP gating chain: small enough that the ~4 operands of a
# block stay in L2 while the ufunc chain runs over them. When the chain is split over threads
# (kernels.parallel), each ufunc call takes the GIL back, so the blocks are 4x larger.
_GATE_BLOCK_BYTES = 128 * 1024
_SPLIT_BLOCK_BYTES = 512 * 1024
_SPLIT_MIN = 2 * _MIN_PER_THREAD  # elements: smaller passes never go to the thread pool
# (1, 2) as 0-d arrays per dtype: a Python float operand costs a ufunc call ~0.2 us more.
_CONST = {np.dtype(t): (np.array(1.0, t), np.array(2.0, t)) for t in (np.float32, np.float64)}


# ----------------------------------------------------------------------------- helpers
def _check_p(name, p) -> float:
    if isinstance(p, bool) or not isinstance(p, (int, float, np.integer, np.floating)):
        raise TypeError(f"{name}: expected a float in [0, 1), got {p!r} ({type(p).__name__})")
    p = float(p)
    if not 0.0 <= p < 1.0:
        raise ValueError(f"{name}: expected a float in [0, 1), got {p}")
    return p


def _check_eps(eps) -> float:
    if isinstance(eps, bool) or not isinstance(eps, (int, float, np.integer, np.floating)):
        raise TypeError(f"eps: expected a float >= 0, got {eps!r} ({type(eps).__name__})")
    eps = float(eps)
    if not (eps >= 0.0 and math.isfinite(eps)):
        raise ValueError(f"eps: expected a finite float >= 0, got {eps}")
    return eps


def _check_act(activation) -> str:
    if activation not in ACTIVATIONS:
        raise ValueError(f"activation: expected one of {ACTIVATIONS}, got {activation!r}")
    return activation


class _State:
    """What a block remembers between calls: buffer views for one batch size and the forward
    cache (input rows by reference, output shape, whether dropout was applied)."""

    __slots__ = ("vkey", "v", "x", "yshape", "dropped")

    def __init__(self):
        self.vkey = None     # key (row count) of the cached buffer views
        self.v = None        # SimpleNamespace of row-slice views for vkey
        self.x = None        # 2-D input of the last forward; None = nothing to differentiate
        self.yshape = None   # output shape of the last forward
        self.dropped = False  # dropout applied by the last forward (train mode, p > 0)


class _Block(Module):
    """Shared bookkeeping: dtype, Workspace, per-batch-size buffer views, the forward cache
    and the ``dy`` check."""

    def __init__(self, dtype):
        super().__init__()
        self.dtype = check_dtype(dtype)
        self._ws = Workspace(self.dtype)
        self._s = _State()  # per-call state, a plain object (Module.__setattr__ costs ~0.5 us)

    def _views(self, key):
        # Slicing buffers costs ~1 us per view: redo it only when the batch size changes.
        s = self._s
        if key != s.vkey:
            s.v = self._make_views(key)
            s.vkey = key
        return s.v

    def _make_views(self, key):  # pragma: no cover - abstract
        raise NotImplementedError

    def _need_cache(self):
        if self._s.x is None:
            raise RuntimeError(f"{type(self).__name__}.backward: no forward pass to differentiate "
                               f"(call forward before backward; each forward allows one backward)")

    def _dy_rows(self, dy, name="dy"):
        """Check ``dy`` against the last forward's output; return it as rows (no copy)."""
        self._need_cache()
        shape = self._s.yshape
        if (not isinstance(dy, np.ndarray) or dy.shape != shape or dy.dtype != self.dtype
                or not dy.flags.c_contiguous):
            if not isinstance(dy, np.ndarray):
                raise TypeError(f"{name}: expected a numpy.ndarray, got {type(dy).__name__}")
            if dy.dtype != self.dtype:
                raise TypeError(f"{name}: expected dtype {self.dtype}, got {dy.dtype}")
            if dy.shape != shape:
                raise ValueError(f"{name}: expected shape {shape} (the output of the last "
                                 f"forward), got {dy.shape}")
            raise ValueError(f"{name}: expected a C-contiguous array, got strides {dy.strides}")
        return dy.reshape(-1, shape[-1]) if dy.ndim == 3 else dy

    def workspace_nbytes(self) -> int:
        """Bytes held in work buffers (cached activations and gradients), children included."""
        return sum(m._ws.nbytes() for _, m in self.named_modules() if isinstance(m, _Block))


def _out(a, shape):
    return a.reshape(shape) if len(shape) == 3 else a


def _tile_rows(d, itemsize):
    return max(1, _SPLIT_BLOCK_BYTES // (d * itemsize))


def _add_tiled(y, x, tile, i0, i1):
    """y[i0:i1] = x[i0:i1] + b for a (rows, d) ``tile`` of b: plain adds, no broadcasting."""
    r = tile.shape[0]
    for i in range(i0, i1, r):
        j = min(i + r, i1)
        np.add(x[i:j], tile[:j - i], out=y[i:j])


def _rows_split(fn, n_rows, row_len):
    """``fn(i, j)`` over rows [0, n_rows), split over threads when large (kernels.parallel)."""
    k = 1
    if n_rows * row_len >= _SPLIT_MIN:
        k = _chunks(n_rows, row_len)
    if k == 1:
        fn(0, n_rows)
    else:
        _parallel_for(fn, n_rows, k)


def _split_flat(fn, n_rows, row_len, arrays, blk_bytes, split_blk_bytes, itemsize):
    """``fn(*flat_slices, blk)`` over flat arrays of ``n_rows`` rows of ``row_len`` elements,
    split over threads by rows when large (kernels.parallel), inline otherwise."""
    k = 1
    if n_rows * row_len >= _SPLIT_MIN:
        k = _chunks(n_rows, row_len)
    if k == 1:
        fn(*arrays, blk_bytes // itemsize)
        return
    blk = split_blk_bytes // itemsize
    _parallel_for(lambda i, j: fn(*[a[i * row_len:j * row_len] for a in arrays], blk), n_rows, k)


# ----------------------------------------------------------------------------- Dropout
class Dropout(_Block):
    """Inverted dropout: in training, zero each element with probability ``p`` and scale the
    rest by 1/(1-p). Identity (returns its input itself, no copy) in eval mode or when p == 0."""

    def __init__(self, p: float = 0.5, dtype=np.float32, rng=None):
        super().__init__(dtype)
        self.p = _check_p("p", p)
        self._rng = make_rng(rng)

    def extra_repr(self):
        return f"p={self.p}, dtype={self.dtype}"

    def _make_views(self, key):
        n, d = key
        ws = self._ws
        return SimpleNamespace(mask=ws.get("mask", n, d),  # (n, d) 0 or 1/(1-p), for backward
                               dx=ws.get("dx", n, d))      # (n, d)

    def forward(self, x):
        d = x.shape[-1] if isinstance(x, np.ndarray) and x.ndim else 0
        x2, _ = as_rows(x, d, self.dtype)
        self._s.x, self._s.yshape = x2, x.shape
        self._s.dropped = self.training and self.p > 0.0
        if not self._s.dropped:
            return x
        v = self._views(x2.shape)
        out = self._ws.get("out", *x2.shape)  # (n, d)
        _drop_fwd(out, v.mask, x2, self.p, self._rng)
        return _out(out, x.shape)

    def backward(self, dy):
        dy2 = self._dy_rows(dy)
        self._s.x = None
        if not self._s.dropped:
            return dy
        v = self._s.v
        _drop_bwd(v.dx, dy2, v.mask)
        return _out(v.dx, dy.shape)


# ----------------------------------------------------------------------------- LayerNorm
class LayerNorm(_Block):
    """LayerNorm over the last axis: y = (x - mean) / sqrt(var + eps) * gamma + beta, with
    per-feature ``gamma`` (ones) and ``beta`` (zeros)."""

    def __init__(self, d: int, eps: float = 1e-5, dtype=np.float32):
        super().__init__(dtype)
        self.d = check_positive_int("d", d)
        self.eps = _check_eps(eps)
        self.gamma = Parameter(np.ones(self.d, self.dtype))
        self.beta = Parameter(np.zeros(self.d, self.dtype))

    def extra_repr(self):
        return f"d={self.d}, eps={self.eps}, dtype={self.dtype}"

    def _make_views(self, n):
        ws, d = self._ws, self.d
        return SimpleNamespace(y=ws.get("y", n, d),      # (n, d) output
                               mean=ws.get("mean", n),   # (n,) cached for backward
                               rstd=ws.get("rstd", n))   # (n,) cached for backward

    def _fwd(self, x2):
        v = self._views(x2.shape[0])
        _ln_fwd(v.y, v.mean, v.rstd, x2, self.gamma.data, self.beta.data, self.eps)
        self._s.x = x2
        return v.y

    def _bwd(self, dy2, dx):
        # dx may be dy2 (the kernel reads each dout block before writing it).
        v = self._s.v
        _ln_bwd(dx, self.gamma.grad, self.beta.grad, dy2, self._s.x, v.mean, v.rstd,
                self.gamma.data)
        return dx

    def forward(self, x):
        x2, _ = as_rows(x, self.d, self.dtype)
        y = self._fwd(x2)
        self._s.yshape = x.shape
        return _out(y, x.shape)

    def backward(self, dy):
        dy2 = self._dy_rows(dy)
        dx = self._bwd(dy2, self._ws.get("dx", dy2.shape[0], self.d))  # (n, d)
        self._s.x = None
        return _out(dx, dy.shape)


# ----------------------------------------------------------------------------- FFN
class FFN(_Block):
    """Position-wise feed-forward: y = dropout(act(x @ W_in + b1)) @ W_out + b2 (seeds 000/001).

    Parameters ``W_in`` (d_model, d_ff), ``b1`` (d_ff,), ``W_out`` (d_ff, d_model), ``b2``
    (d_model,); no biases when ``bias=False``. ``init`` ("he", "xavier", "normal", "zeros")
    applies to both weights (fan-in of each); biases start at zero. ``activation`` is any name
    in ``kernels.ACTIVATIONS`` (leaky_relu uses the kernels' default slope 0.01).
    """

    def __init__(self, d_model: int, d_ff: int, activation: str = "relu", dropout: float = 0.0,
                 bias: bool = True, init: str = "he", dtype=np.float32, rng=None):
        super().__init__(dtype)
        self.d_model = check_positive_int("d_model", d_model)
        self.d_ff = check_positive_int("d_ff", d_ff)
        self.activation = _check_act(activation)
        self.p = _check_p("dropout", dropout)
        if init not in INITS:
            raise ValueError(f"init: expected one of {INITS}, got {init!r}")
        self.init = init
        rng = make_rng(rng)
        self._rng = rng
        self._inplace = activation in _INPLACE_ACTS
        dt = self.dtype
        self.W_in = Parameter(init_weight(self.d_model, self.d_ff, init, dt, rng))
        self.b1 = Parameter(np.zeros(self.d_ff, dt)) if bias else None
        self.W_out = Parameter(init_weight(self.d_ff, self.d_model, init, dt, rng))
        self.b2 = Parameter(np.zeros(self.d_model, dt)) if bias else None

    def extra_repr(self):
        return (f"d_model={self.d_model}, d_ff={self.d_ff}, activation={self.activation!r}, "
                f"dropout={self.p}, bias={self.b1 is not None}, dtype={self.dtype}")

    def _make_views(self, n):
        ws, d, f = self._ws, self.d_model, self.d_ff
        z = ws.get("z", n, f)  # (n, d_ff) x W_in + b1, then act(z) (relu-like) or act'(z)
        v = SimpleNamespace(z=z, y=ws.get("y", n, d))  # (n, d_model) output
        if self._inplace:
            v.h = z
            v.dh = ws.get("dh", n, f)  # (n, d_ff) dh, then dz in place
        else:
            v.h = ws.get("h", n, f)    # (n, d_ff) act(z); dh then dz in place after dW_out
            v.dh = v.h
        if self.p > 0.0:
            v.mask = ws.get("mask", n, f)  # (n, d_ff) dropout mask for backward
        v.tile = None  # (rows, d_model) b2 tiled for y = res + b2, allocated on first use
        return v

    def _fwd(self, x2, res=None):
        """y = FFN(x2) (+ res, fused into the output GEMM) for 2-D x2; returns the y buffer."""
        n = x2.shape[0]
        v = self._views(n)
        self._s.x = x2
        self._s.dropped = dropped = self.training and self.p > 0.0
        if n == 0:
            return v.y
        z, h, y = v.z, v.h, v.y
        _gemm(z, x2, self.W_in.data)
        b1 = self.b1
        # z += b1 fused; non-relu-like acts cache act'(z) over z (grad=z) for backward.
        _bias_act(h, z, None if b1 is None else b1.data, self.activation, 0.01,
                  None if self._inplace else z)
        if dropped:
            # In place: sign(h * mask) still tells relu-like acts where z > 0 wherever the
            # mask is non-zero, and where it is zero the gradient is zero anyway.
            _drop_fwd(h, v.mask, h, self.p, self._rng)
        # b2 (and the residual) fill y before the GEMM, which accumulates (beta=1): a
        # broadcasting ufunc (y += b2) would allocate NumPy iterator buffers on every call.
        b2 = self.b2
        if b2 is None and res is None:
            _gemm(y, h, self.W_out.data)
            return y
        if b2 is None:
            np.copyto(y, res)
        elif n * self.d_model < _SPLIT_MIN:  # small: as cheap as possible
            np.copyto(y, b2.data)
            if res is not None:
                np.add(y, res, out=y)
        elif res is None:  # large: split over threads
            b2d = b2.data
            _rows_split(lambda i, j: np.copyto(y[i:j], b2d), n, self.d_model)
        else:  # large: y = res + b2 in one pass, over row blocks of a tiled b2
            tile = v.tile
            if tile is None:
                tile = v.tile = self._ws.get(
                    "tile", min(n, _tile_rows(self.d_model, self.dtype.itemsize)), self.d_model)
            np.copyto(tile, b2.data)
            _rows_split(lambda i, j: _add_tiled(y, res, tile, i, j), n, self.d_model)
        _gemm(y, h, self.W_out.data, False, False, 1.0, 1.0)
        return y

    def _bwd(self, dy2, dx_acc=None):
        """Accumulate parameter grads for output grad dy2; return dx (or dx_acc += dx)."""
        v = self._s.v
        n = dy2.shape[0]
        if dx_acc is None:
            dx = self._ws.get("dx", n, self.d_model)  # (n, d_model) input gradient
        if n == 0:
            return dx if dx_acc is None else dx_acc
        h, dh = v.h, v.dh
        if self.b2 is not None:
            _colsum(self.b2.grad, dy2)
        _gemm(self.W_out.grad, h, dy2, True, False, 1.0, 1.0)
        _gemm(dh, dy2, self.W_out.data, False, True)  # may overwrite h (not needed any more)
        if self._s.dropped:
            _drop_bwd(dh, dh, v.mask)
        if self._inplace:
            _act_bwd(dh, dh, v.z, self.activation)  # v.z is act(z), same sign as z
        else:
            _act_cached(dh, dh, v.z)                # v.z is act'(z)
        if self.b1 is not None:
            _colsum(self.b1.grad, dh)
        _gemm(self.W_in.grad, self._s.x, dh, True, False, 1.0, 1.0)
        if dx_acc is None:
            _gemm(dx, dh, self.W_in.data, False, True)
            return dx
        _gemm(dx_acc, dh, self.W_in.data, False, True, 1.0, 1.0)
        return dx_acc

    def forward(self, x):
        x2, _ = as_rows(x, self.d_model, self.dtype)
        y = self._fwd(x2)
        self._s.yshape = x.shape
        return _out(y, x.shape)

    def backward(self, dy):
        dy2 = self._dy_rows(dy)
        dx = self._bwd(dy2)
        self._s.x = None
        return _out(dx, dy.shape)


# ----------------------------------------------------------------------------- GMLP
def _gate_forward(a, g, p, blk):
    """(g, p) = (Zg/2, P/2) -> g = S = 1 + tanh(Zg/2) = 2 sigmoid(Zg) in place and
    a = S * P/2 = sigmoid(Zg) * P. Flat 1-D arrays, in blocks of ``blk`` elements: 3 passes."""
    one = _CONST[g.dtype][0]
    for i in range(0, g.shape[0], blk):
        j = i + blk
        gb = g[i:j]
        np.tanh(gb, gb)      # SIMD tanh; no overflow for any |z| (unlike exp)
        np.add(gb, one, gb)
        np.multiply(gb, p[i:j], a[i:j])


def _gate_backward(g, p, da, blk):
    """In place (g, p, da) = (S, P/2, dA) -> (2 dZg, 2 dP, dead) with dP = dA * G = dA * S/2
    and dZg = dA * P * G (1 - G) = dA * S * (P/2) * (2 - S) / 2; the GEMMs that read them take
    alpha = 0.5. Flat 1-D arrays in blocks of ``blk`` elements, no scratch: 5 passes."""
    two = _CONST[g.dtype][1]
    for i in range(0, g.shape[0], blk):
        j = i + blk
        gb, pb, db = g[i:j], p[i:j], da[i:j]
        np.multiply(db, gb, db)  # 2 dP = dA S
        np.multiply(pb, db, pb)  # (P/2) dA S
        np.subtract(two, gb, gb)
        np.multiply(gb, pb, gb)  # 2 dZg
        np.copyto(pb, db)        # 2 dP


class GMLP(_Block):
    """Gated MLP (seed 002's README): Z = GELU(X W_in), G = sigmoid(Z W_gate), P = Z W_proj,
    A = G * P, Y = A W_out; no biases.

    ``W_gate`` and ``W_proj`` (d_hidden, d_ffn) are the two halves of one combined weight kept
    transposed, ``Wgp_T`` (2*d_ffn, d_hidden) C-contiguous, so one GEMM computes both products
    and both halves are F-contiguous views (their grads are views of one combined grad too).
    The gating runs on the transposed products [Zg; P]^T = Wgp_T Z^T (2*d_ffn, N), whose halves
    are contiguous: elementwise passes over them are flat and need no NumPy iterator buffers.
    That GEMM computes half the products (alpha=0.5): with sigmoid(z) = (1 + tanh(z/2)) / 2,
    A = (1 + tanh(Zg/2)) * (P/2) takes 3 passes; backward's factors of 2 go to GEMM alphas.
    Init: He for ``W_in`` (GELU follows it), Xavier for ``W_gate``, ``W_proj`` and ``W_out``
    (linear maps into a sigmoid gate, a product and the output).
    """

    def __init__(self, d_in: int, d_hidden: int, d_ffn: int, d_out: int, dtype=np.float32,
                 rng=None):
        super().__init__(dtype)
        self.d_in = check_positive_int("d_in", d_in)
        self.d_hidden = check_positive_int("d_hidden", d_hidden)
        self.d_ffn = check_positive_int("d_ffn", d_ffn)
        self.d_out = check_positive_int("d_out", d_out)
        rng = make_rng(rng)
        dt, dh, f = self.dtype, self.d_hidden, self.d_ffn
        w_in = init_weight(self.d_in, dh, "he", dt, rng)
        wgp_t = np.empty((2 * f, dh), dt)  # (2f, d_hidden): rows [W_gate.T ; W_proj.T]
        wgp_t[:f] = init_weight(dh, f, "xavier", dt, rng).T
        wgp_t[f:] = init_weight(dh, f, "xavier", dt, rng).T
        dwgp_t = np.zeros_like(wgp_t)      # (2f, d_hidden) combined gradient
        self.Wgp_T, self.dWgp_T = wgp_t, dwgp_t
        self.W_in = Parameter(w_in)
        self.W_gate = Parameter(wgp_t[:f].T, grad=dwgp_t[:f].T)
        self.W_proj = Parameter(wgp_t[f:].T, grad=dwgp_t[f:].T)
        self.W_out = Parameter(init_weight(f, self.d_out, "xavier", dt, rng))
        self._itemsize = dt.itemsize

    def extra_repr(self):
        return (f"d_in={self.d_in}, d_hidden={self.d_hidden}, d_ffn={self.d_ffn}, "
                f"d_out={self.d_out}, dtype={self.dtype}")

    def _make_views(self, n):
        ws, dh, f = self._ws, self.d_hidden, self.d_ffn
        # Transposed buffers are flat so that (rows, n) views stay contiguous for any n.
        gpt = ws.get("gpt", 2 * f * n)  # (2f*n,) [Zg; P]^T/2 -> [2G; P/2]^T -> 2 [dZg; dP]^T
        at = ws.get("at", f * n)        # (f*n,) A^T; dA^T in backward
        return SimpleNamespace(
            u=ws.get("u", n, dh),             # (n, d_hidden) X W_in, then GELU'(X W_in)
            z=ws.get("z", n, dh),             # (n, d_hidden) Z; dZ, dU in backward
            gpt=gpt.reshape(2 * f, n),        # (2f, n)
            g=gpt[:f * n], p=gpt[f * n:],     # (f*n,) flat halves
            at=at, atm=at.reshape(f, n),      # flat and (f, n) views
            y=ws.get("y", n, self.d_out),     # (n, d_out) output
            dx=ws.get("dx", n, self.d_in))    # (n, d_in) input gradient

    def forward(self, x):
        x2, _ = as_rows(x, self.d_in, self.dtype)
        n = x2.shape[0]
        v = self._views(n)
        self._s.x, self._s.yshape = x2, x.shape[:-1] + (self.d_out,)
        if n:
            _gemm(v.u, x2, self.W_in.data)
            _bias_act(v.z, v.u, None, "gelu", 0.01, v.u)    # GELU' cached over u
            _gemm(v.gpt, self.Wgp_T, v.z, False, True, 0.5)  # (2f, n) = Wgp_T Z^T / 2
            _split_flat(_gate_forward, self.d_ffn, n, (v.at, v.g, v.p), _GATE_BLOCK_BYTES,
                        _SPLIT_BLOCK_BYTES, self._itemsize)
            _gemm(v.y, v.atm, self.W_out.data, True, False)  # Y = A W_out
        return _out(v.y, self._s.yshape)

    def backward(self, dy):
        dy2 = self._dy_rows(dy)
        v = self._s.v
        n = dy2.shape[0]
        if n:
            at, z = v.atm, v.z
            _gemm(self.W_out.grad, at, dy2, False, False, 1.0, 1.0)  # A^T dY
            _gemm(at, self.W_out.data, dy2, False, True)              # dA^T = W_out dY^T
            _split_flat(_gate_backward, self.d_ffn, n, (v.g, v.p, v.at),  # 2 dGP^T over GP^T
                        _GATE_BLOCK_BYTES, _SPLIT_BLOCK_BYTES, self._itemsize)
            _gemm(self.dWgp_T, v.gpt, z, False, False, 0.5, 1.0)     # both halves, one GEMM
            _gemm(z, v.gpt, self.Wgp_T, True, False, 0.5)            # dZ = dGP Wgp_T over Z
            _act_cached(z, z, v.u)                                   # dU in place
            _gemm(self.W_in.grad, self._s.x, z, True, False, 1.0, 1.0)
            _gemm(v.dx, z, self.W_in.data, False, True)
        self._s.x = None
        return _out(v.dx, dy.shape[:-1] + (self.d_in,))


# ----------------------------------------------------------------------------- AddNorm
class AddNorm(_Block):
    """Add & Norm (seed 003, corrected): y = LayerNorm(x + Dropout(sub)) with per-feature
    ``gamma``/``beta``; ``backward(dy)`` returns ``(dx, dsub)``."""

    def __init__(self, d_model: int, dropout: float = 0.0, eps: float = 1e-5, dtype=np.float32,
                 rng=None):
        super().__init__(dtype)
        self.d_model = check_positive_int("d_model", d_model)
        self.p = _check_p("dropout", dropout)
        self.eps = _check_eps(eps)
        self._rng = make_rng(rng)
        self.gamma = Parameter(np.ones(self.d_model, self.dtype))
        self.beta = Parameter(np.zeros(self.d_model, self.dtype))

    def extra_repr(self):
        return f"d_model={self.d_model}, dropout={self.p}, eps={self.eps}, dtype={self.dtype}"

    def _make_views(self, n):
        ws, d = self._ws, self.d_model
        v = SimpleNamespace(s=None,                     # (n, d) x + dropout(sub), on first use
                            y=ws.get("y", n, d),       # (n, d) output
                            mean=ws.get("mean", n),    # (n,) cached for backward
                            rstd=ws.get("rstd", n),    # (n,) cached for backward
                            ds=ws.get("ds", n, d))     # (n, d) dL/ds = dx
        if self.p > 0.0:
            v.mask = ws.get("mask", n, d)  # (n, d) dropout mask for backward
            v.dsub = ws.get("dsub", n, d)  # (n, d) ds * mask
        return v

    def _norm(self, s2):
        """LayerNorm of the sum s2 (cached by reference); returns the y buffer."""
        v = self._views(s2.shape[0])
        _ln_fwd(v.y, v.mean, v.rstd, s2, self.gamma.data, self.beta.data, self.eps)
        self._s.x = s2
        return v.y

    def _fwd(self, x2, sub2):
        v = self._views(x2.shape[0])
        if v.s is None:  # not allocated when FFNSublayer hands in the sum itself
            v.s = self._ws.get("s", *x2.shape)
        self._s.dropped = dropped = self.training and self.p > 0.0
        if dropped:
            _drop_fwd(v.s, v.mask, sub2, self.p, self._rng)
            np.add(v.s, x2, out=v.s)
        else:
            np.add(x2, sub2, out=v.s)
        return self._norm(v.s)

    def _bwd(self, dy2):
        """Returns (ds, dsub); dsub is ds itself when no dropout was applied."""
        v = self._s.v
        _ln_bwd(v.ds, self.gamma.grad, self.beta.grad, dy2, self._s.x, v.mean, v.rstd,
                self.gamma.data)
        if self._s.dropped:
            _drop_bwd(v.dsub, v.ds, v.mask)
            return v.ds, v.dsub
        return v.ds, v.ds

    def forward(self, x, sub):
        x2, _ = as_rows(x, self.d_model, self.dtype, "x")
        if isinstance(sub, np.ndarray) and sub.shape != x.shape:
            raise ValueError(f"x, sub: expected the same shape, got x {x.shape} and sub {sub.shape}")
        sub2, _ = as_rows(sub, self.d_model, self.dtype, "sub")
        y = self._fwd(x2, sub2)
        self._s.yshape = x.shape
        return _out(y, x.shape)

    def backward(self, dy):
        dy2 = self._dy_rows(dy)
        ds, dsub = self._bwd(dy2)
        if dsub is ds:
            # Separate arrays for the two outputs, so writing into one cannot change the other.
            dsub = self._ws.get("dsub", ds.shape[0], self.d_model)  # (n, d)
            np.copyto(dsub, ds)
        self._s.x = None
        return _out(ds, dy.shape), _out(dsub, dy.shape)


# ----------------------------------------------------------------------------- FFNSublayer
class FFNSublayer(_Block):
    """The transformer's position-wise FFN sublayer with its residual and LayerNorm:
    ``norm="post"``: y = AddNorm(x, FFN(x)) = LayerNorm(x + Dropout(FFN(x)));
    ``norm="pre"``:  y = x + Dropout(FFN(LayerNorm(x))).
    ``dropout`` applies inside the FFN (after the activation) and to the FFN's output before
    the residual add, as in PyTorch's TransformerEncoderLayer. Children: ``ffn``, ``norm``.
    """

    def __init__(self, d_model: int, d_ff: int, activation: str = "relu", dropout: float = 0.0,
                 norm: str = "post", eps: float = 1e-5, dtype=np.float32, rng=None):
        super().__init__(dtype)
        if norm not in ("post", "pre"):
            raise ValueError(f"norm: expected 'post' or 'pre', got {norm!r}")
        self.d_model = check_positive_int("d_model", d_model)
        p = _check_p("dropout", dropout)
        rng = make_rng(rng)
        self.norm_mode = norm
        self.p = p
        self.ffn = FFN(d_model, d_ff, activation, p, True, "he", dtype, rng)
        if norm == "post":
            self.norm = AddNorm(d_model, p, eps, dtype, rng)
        else:
            self.norm = LayerNorm(d_model, eps, dtype)
            self.drop = Dropout(p, dtype, rng)  # residual dropout (no parameters)

    def extra_repr(self):
        return f"norm={self.norm_mode!r}, dropout={self.p}, dtype={self.dtype}"

    def _make_views(self, n):
        return SimpleNamespace()

    def forward(self, x):
        x2, _ = as_rows(x, self.d_model, self.dtype)
        ffn, norm = self.ffn, self.norm
        if self.norm_mode == "post":
            if self.training and self.p > 0.0:
                y = norm._fwd(x2, ffn._fwd(x2))
            else:
                norm._s.dropped = False
                y = norm._norm(ffn._fwd(x2, res=x2))  # x + FFN(x) straight from the GEMM
        else:
            xn = norm._fwd(x2)
            drop = self.drop
            drop._s.dropped = dropped = self.training and self.p > 0.0
            if dropped:
                f = ffn._fwd(xn)
                dv = drop._views((f.shape[0], self.d_model))
                _drop_fwd(f, dv.mask, f, self.p, drop._rng)  # in place: FFN's y is not reused
                np.add(f, x2, out=f)
                y = f
            else:
                y = ffn._fwd(xn, res=x2)
        self._s.x, self._s.yshape = x2, x.shape
        return _out(y, x.shape)

    def backward(self, dy):
        dy2 = self._dy_rows(dy)
        ffn, norm = self.ffn, self.norm
        if self.norm_mode == "post":
            ds, dsub = norm._bwd(dy2)
            dx = ffn._bwd(dsub, dx_acc=ds)  # dx = ds + FFN'(x)^T dsub, fused into the GEMM
        else:
            drop = self.drop
            if drop._s.dropped:
                dmid = drop._s.v.dx
                _drop_bwd(dmid, dy2, drop._s.v.mask)
            else:
                dmid = dy2
            dxn = ffn._bwd(dmid)
            dx = norm._bwd(dxn, dxn)  # in place over FFN's dx buffer
            np.add(dx, dy2, out=dx)
        self._s.x = None
        return _out(dx, dy.shape)
